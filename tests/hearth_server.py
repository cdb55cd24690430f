"""Start the real Hearth server as a subprocess, the way the add-on's start script does
(``python -m hearth serve`` with settings from flags/environment), and wait until it is ready."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HearthServer:
    def __init__(self, *args: str, env: dict[str, str] | None = None, data_dir: Path | None = None,
                 port: int | None = None):
        self.port = port or free_port()
        self.args = list(args)
        self.env = dict(env or {})
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> HearthServer:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        cmd = [sys.executable, "-m", "hearth", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), *self.args]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir), "--models-dir", str(self.data_dir / "models")]
        log_dir = Path(os.environ.get("HEARTH_TEST_LOGS", "/tmp/hearth-test-logs"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{self.port}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=ROOT)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path else ""

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def post(self, path: str, body: dict | bytes, headers: dict[str, str] | None = None,
             timeout: float = 120) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        code = self.proc.returncode
        self.proc = None
        return code

    def __enter__(self) -> HearthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
