"""Class claims and voice shares on their own (aiohttp's mocked requests)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from hearth.api.claims import VoiceShares, authenticate, claimed_rank, pinned_user
from hearth.chat.completions import CompletionError
from hearth.policy.scheduler import CHAT_RANK, VOICE_RANK, class_rank
from hearth.settings import Settings

SETTINGS = Settings(api_key="main-key-123", api_keys=[
    {"name": "kitchen", "key": "kitchen-key-1", "classes": "voice, chat"},
    {"name": "nightly", "key": "nightly-key-1", "classes": ["background", "embedding"]}])


def req(key: str | None):
    return make_mocked_request("POST", "/v1/chat/completions",
                               headers={"Authorization": f"Bearer {key}"} if key else {})


def test_keys_authenticate_and_name_their_member():
    for key, member in (("main-key-123", None), ("kitchen-key-1", "kitchen"),
                        ("nightly-key-1", "nightly")):
        r = req(key)
        assert authenticate(r, SETTINGS) and pinned_user(r) == member
    assert not authenticate(req("kitchen-key-2"), SETTINGS)
    assert not authenticate(req(None), SETTINGS)


def test_claims_outside_a_key_are_refused_and_defaults_move_into_its_classes():
    r = req("nightly-key-1")
    authenticate(r, SETTINGS)
    with pytest.raises(CompletionError) as e:
        claimed_rank(r, VOICE_RANK, explicit=True)
    assert e.value.status == 403 and e.value.code == "class_not_allowed"
    assert claimed_rank(r, CHAT_RANK, explicit=False) == class_rank("background")
    assert claimed_rank(r, class_rank("embedding"), explicit=True) == class_rank("embedding")
    k = req("kitchen-key-1")
    authenticate(k, SETTINGS)
    # below the default none is allowed: the nearest above
    assert claimed_rank(k, class_rank("embedding"), explicit=False) == CHAT_RANK
    main = req("main-key-123")
    authenticate(main, SETTINGS)
    assert claimed_rank(main, class_rank("agent"), explicit=True) == class_rank("agent")


def test_voice_past_a_members_share_runs_as_chat_and_shares_come_back():
    shares = VoiceShares(per_member=2)
    got = [shares.enter("a", VOICE_RANK) for _ in range(4)]
    assert got == [VOICE_RANK, VOICE_RANK, CHAT_RANK, CHAT_RANK]
    assert shares.enter("b", VOICE_RANK) == VOICE_RANK  # another member's share is its own
    for rank in got:
        shares.leave("a", rank)
    assert shares.enter("a", VOICE_RANK) == VOICE_RANK and shares.held["a"] == 1


def test_a_held_share_comes_back_when_the_work_fails():
    """The share a route or a job holds while it runs (VoiceShares.hold) is given back however
    the work ends: a failed voice job does not keep its member's voice."""
    shares = VoiceShares(per_member=1)
    try:
        with shares.hold("a", VOICE_RANK) as rank:
            assert rank == VOICE_RANK
            with shares.hold("a", VOICE_RANK) as second:
                assert second == CHAT_RANK  # past the share: chat
            raise RuntimeError("the worker went away")
    except RuntimeError:
        pass
    assert "a" not in shares.held
