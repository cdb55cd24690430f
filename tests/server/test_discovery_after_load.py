"""The real server announces itself to the Supervisor once its model is loaded, not before."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hearth_server import HearthServer

pytestmark = pytest.mark.model


class FakeSupervisor(ThreadingHTTPServer):
    """Records each discovery message with what Hearth's /health said at that moment."""

    def __init__(self) -> None:
        self.health_url = ""
        self.seen: list[tuple[dict, int]] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: FakeSupervisor

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        try:
            with urllib.request.urlopen(self.server.health_url, timeout=5) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        self.server.seen.append((body, status))
        data = json.dumps({"result": "ok", "data": {"uuid": "u1"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_the_announcement_comes_once_the_model_is_loaded(tmp_path):
    sup = FakeSupervisor()
    threading.Thread(target=sup.serve_forever, daemon=True).start()
    srv = HearthServer(data_dir=tmp_path, env={
        "SUPERVISOR_TOKEN": "t0ken", "HEARTH_SUPERVISOR_URL": f"http://127.0.0.1:{sup.server_port}"})
    sup.health_url = srv.url + "/health"
    try:
        with srv:
            deadline = time.monotonic() + 60
            while not sup.seen and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        sup.shutdown()
    assert len(sup.seen) == 1
    body, health = sup.seen[0]
    assert body["service"] == "hearth" and body["config"]["port"] == srv.port
    assert health == 200, "announced while the model was still loading"
