"""Who may claim which class, and who a request is.

Without keys, class and member are what a request says (``priority``, ``X-Hearth-Class``,
``user``): anyone on the LAN may ask for ``voice``. With ``api_keys``, each key names a member
and the classes it may use: a request that asks for another class is refused (403), one that
asks for none runs in the key's class nearest the endpoint's default, and its member is the
key's name whatever the request says. The ``api_key`` (the one Home Assistant gets through
discovery) may use every class and name its members.

Either way a member holds at most ``voice_per_member`` voice requests at once, on every route
that runs work, jobs included (:mod:`hearth.jobs.runner`): more of its voice requests run as
chat, so one member's flood tagged ``voice`` cannot hold up another's.
"""

from __future__ import annotations

import contextlib
import hmac
from collections import Counter
from collections.abc import Iterator

from aiohttp import web

from ..chat.completions import CompletionError
from ..policy.scheduler import CHAT_RANK, RANK_NAMES, VOICE_RANK, class_rank
from ..settings import KeySpec, Settings

KEY = "hearth.key"  # the request's matched KeySpec (absent: the main key, or no key at all)


def key_required(settings: Settings) -> bool:
    return bool(settings.api_key or settings.api_keys)


def authenticate(request: web.Request, settings: Settings) -> bool:
    """Whether the request's bearer token is one of the server's keys (constant-time, every
    key compared); a member key is remembered on the request."""
    given = request.headers.get("Authorization", "")
    token = (given[7:].strip() if given[:7].lower() == "bearer " else "").encode()
    ok = bool(settings.api_key) and hmac.compare_digest(token, settings.api_key.encode())
    for spec in settings.api_keys:
        if hmac.compare_digest(token, spec.key.encode()) and not ok:
            request[KEY], ok = spec, True
    return ok


def claimed_rank(request: web.Request, rank: int, explicit: bool) -> int:
    """``rank`` if the request's key may use it. Otherwise a 403 when the request asked for
    it, or the key's class nearest below it (else nearest above) when it is the default."""
    spec: KeySpec | None = request.get(KEY)
    if spec is None or not spec.classes:
        return rank
    allowed = sorted(class_rank(c) for c in spec.classes)
    if rank in allowed:
        return rank
    if explicit:
        raise CompletionError(403, f"the key of {spec.name!r} may use the classes "
                              f"{', '.join(spec.classes)}, not {RANK_NAMES[rank]!r}",
                              "class_not_allowed", "priority")
    below = [r for r in allowed if r > rank]
    return below[0] if below else allowed[-1]


def pinned_user(request: web.Request) -> str | None:
    spec: KeySpec | None = request.get(KEY)
    return spec.name if spec is not None else None


class VoiceShares:
    """Voice requests in flight per member; past the share, a member's voice runs as chat."""

    def __init__(self, per_member: int):
        self.per_member = per_member
        self.held: Counter[str] = Counter()

    def enter(self, user: str | None, rank: int) -> int:
        if rank != VOICE_RANK:
            return rank
        who = user or ""
        if self.held[who] >= self.per_member:
            return CHAT_RANK
        self.held[who] += 1
        return rank

    @contextlib.contextmanager
    def hold(self, user: str | None, rank: int) -> Iterator[int]:
        """The class ``user``'s request of class ``rank`` runs in, its share held meanwhile."""
        rank = self.enter(user, rank)
        try:
            yield rank
        finally:
            self.leave(user, rank)

    def leave(self, user: str | None, rank: int) -> None:
        if rank == VOICE_RANK:
            who = user or ""
            self.held[who] -= 1
            if self.held[who] <= 0:
                del self.held[who]
