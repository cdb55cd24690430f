"""Who may claim which class, against the real server: member keys keep to their classes and
run as their member; a member's voice flood past its share runs as chat while another member's
voice stays voice (the answer's X-Hearth-Class header says which class a request ran in); the
same share holds for jobs, so a member's flood of voice jobs does not hold up another's chat."""

from __future__ import annotations

import json
import threading
import time

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


def _running(server) -> tuple[dict[str, int], int]:
    _, q = server.get("/v1/queue")
    return q["running"], q["iterations"]


def test_a_members_voice_jobs_keep_to_its_share_and_do_not_hold_up_anothers_chat(server):
    """A member's flood of long voice jobs fills every slot the job runner may take (as many
    as n_parallel): at most its share (2) run as voice, the rest as chat, so another member's
    short chat takes a slot by fairness at once and is answered in a few iterations, while
    none of the flood's jobs (which need 96 each) has finished. Were the jobs all voice, the
    chat would wait for a slot until the first of them finished."""
    flood = {"messages": [{"role": "user", "content": "Tell me a long story."}],
             "max_tokens": 96, "ignore_eos": True, "temperature": 0, "user": "flood"}
    ids = []
    for _ in range(12):
        status, job = server.post("/v1/jobs", {"request": flood, "class": "voice"})
        assert status == 202, job
        ids.append(job["id"])
    try:
        deadline = time.monotonic() + 120
        running, _ = _running(server)
        while sum(running.values()) < 8 and time.monotonic() < deadline:  # n_parallel: 8
            time.sleep(0.05)
            running, _ = _running(server)
        assert sum(running.values()) >= 8, running
        assert running["voice"] <= 2, running  # the share, not every slot
        _, before = _running(server)
        status, headers, answer = _chat(server.url, user="light", max_tokens=4,
                                        ignore_eos=True)
        _, after = _running(server)
        assert status == 200 and headers["X-Hearth-Class"] == "chat", answer
        _, done = server.get("/v1/jobs?status=done&limit=1000")
        finished = [j for j in done["data"] if j["id"] in ids]
        # The chat's own iterations are about 5 (its prompt, 4 tokens); the flood's 96 each.
        assert after - before <= 40, (before, after)
        assert not finished, [j["id"] for j in finished]
    finally:
        for job_id in ids:  # other tests share this server
            send(server.url, f"/v1/jobs/{job_id}", method="DELETE")
