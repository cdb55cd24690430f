"""Who may claim which class, against the real server: member keys keep to their classes and
run as their member; a member's voice flood past its share runs as chat while another member's
voice stays voice (the answer's X-Hearth-Class header says which class a request ran in)."""

from __future__ import annotations

import json
import threading

from hearth_server import HearthServer
from test_lan_security import send

KEYS = [{"name": "kitchen", "key": "kitchen-key-1", "classes": ["voice", "chat"]},
        {"name": "nightly", "key": "nightly-key-1", "classes": "background"}]


def _chat(url: str, key: str | None = None, **extra) -> tuple[int, dict, dict]:
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, **extra}
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return send(url, "/v1/chat/completions", json.dumps(body).encode(),
                Content_Type="application/json", **auth)


def test_member_keys_keep_to_their_classes(tmp_path):
    env = {"HEARTH_API_KEY": "main-key-123", "HEARTH_API_KEYS": json.dumps(KEYS)}
    with HearthServer(data_dir=tmp_path, env=env) as srv:
        status, _, err = _chat(srv.url, "nightly-key-1", priority="voice")
        assert status == 403 and err["error"]["code"] == "class_not_allowed"
        status, _, _ = send(srv.url, "/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": "x"}]}).encode(),
            Content_Type="application/json", Authorization="Bearer nightly-key-1",
            X_Hearth_Class="chat")
        assert status == 403  # the header is a claim too
        status, headers, _ = _chat(srv.url, "nightly-key-1")
        assert status == 200 and headers["X-Hearth-Class"] == "background"  # its default
        status, headers, _ = _chat(srv.url, "kitchen-key-1", priority="voice")
        assert status == 200 and headers["X-Hearth-Class"] == "voice"
        status, headers, _ = _chat(srv.url, "main-key-123", priority="agent")
        assert status == 200 and headers["X-Hearth-Class"] == "agent"  # the main key: any
        assert _chat(srv.url)[0] == 401 and _chat(srv.url, "kitchen-key-2")[0] == 401
        job = {"request": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}}
        auth = {"Authorization": "Bearer nightly-key-1", "Content_Type": "application/json"}
        status, _, err = send(srv.url, "/v1/jobs", json.dumps({**job, "class": "voice"})
                              .encode(), **auth)
        assert status == 403 and err["error"]["code"] == "class_not_allowed"
        status, _, created = send(srv.url, "/v1/jobs", json.dumps(job).encode(), **auth)
        assert status == 202 and created["class"] == "background"


def test_a_members_voice_flood_runs_as_chat_past_its_share(server):
    """Ten voice requests at once from one member: at most its share (2) run as voice, a few
    more at most as earlier ones finish; another member's voice request stays voice."""
    classes: dict[str, list[str]] = {"flood": [], "other": []}
    lock = threading.Lock()

    def ask(user: str) -> None:
        status, headers, answer = _chat(server.url, priority="voice", user=user,
                                        max_tokens=24, ignore_eos=True)
        assert status == 200, answer
        with lock:
            classes[user].append(headers["X-Hearth-Class"])

    threads = [threading.Thread(target=ask, args=("flood",)) for _ in range(10)]
    threads.append(threading.Thread(target=ask, args=("other",)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert classes["other"] == ["voice"]
    assert len(classes["flood"]) == 10
    assert 1 <= classes["flood"].count("voice") <= 4, classes
    assert classes["flood"].count("chat") >= 6
