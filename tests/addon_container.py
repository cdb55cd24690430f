"""One add-on container started as the Supervisor starts it, with podman (tests/addon/: the
amd64 image, and the aarch64 image under qemu-user)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from hearth_server import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "addon" / "config.yaml").read_text())
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "scripts" / "addon" / "containers.conf")}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True,
                          check=check, timeout=timeout)


class Addon:
    """One add-on container: its /data and /config folders live on the host, as the
    Supervisor keeps them, so they outlive the container's stops and starts."""

    def __init__(self, image: str, root: Path, options: dict[str, Any] | None = None,
                 entrypoint: list[str] | None = None, env: dict[str, str] | None = None,
                 volumes: tuple[str, ...] = ()):
        self.name = f"hearth-test-{uuid.uuid4().hex[:8]}"
        self.data, self.config = root / "data", root / "config"
        self.data.mkdir(parents=True)
        self.config.mkdir(parents=True)
        (self.data / "options.json").write_text(json.dumps({**CONFIG["options"],
                                                            **(options or {})}))
        self.port = free_port()
        args = ["create", "--name", self.name, "--init",
                "--stop-timeout", str(CONFIG["timeout"]),
                "-p", f"127.0.0.1:{self.port}:8080",
                "-v", f"{self.data}:/data", "-v", f"{self.config}:/config"]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        for volume in volumes:
            args += ["-v", volume]
        if entrypoint:
            args += ["--entrypoint", json.dumps(entrypoint)]
        podman(*args, image)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        podman("start", self.name)

    def running(self) -> bool:
        return podman("inspect", "-f", "{{.State.Running}}", self.name).stdout.strip() == "true"

    def logs(self) -> str:
        out = podman("logs", self.name, check=False)
        return (out.stdout + out.stderr)[-6000:]

    def wait_healthy(self, timeout: float) -> None:
        """As the Supervisor waits: the image's own HEALTHCHECK, run until it passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.running(), f"the container exited:\n{self.logs()}"
            if podman("healthcheck", "run", self.name, check=False).returncode == 0:
                return
            time.sleep(1)
        raise AssertionError(f"not healthy after {timeout:.0f} s:\n{self.logs()}")

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Without the healthcheck (it would run natively beside the emulated server)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.running(), f"the container exited:\n{self.logs()}"
            try:
                return self.get("/health")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(2)
        raise AssertionError(f"not ready after {timeout:.0f} s:\n{self.logs()}")

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def wait_job(self, job_id: str, statuses: tuple[str, ...], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.get(f"/v1/jobs/{job_id}")
            if job["status"] in statuses:
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} still {job.get('status')}:\n{self.logs()}")

    def stop(self) -> tuple[float, int]:
        t0 = time.monotonic()
        podman("stop", self.name, timeout=CONFIG["timeout"] + 60)
        took = time.monotonic() - t0
        code = int(podman("inspect", "-f", "{{.State.ExitCode}}", self.name).stdout)
        return took, code

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)

    def stream(self, body: dict[str, Any], headers: dict[str, str] | None = None,
               timeout: float = 600) -> tuple[float | None, str]:
        """A streamed chat completion: seconds to its first content token, and its text."""
        req = urllib.request.Request(
            self.url + "/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
            method="POST", headers={"Content-Type": "application/json", **(headers or {})})
        t0, first, text = time.monotonic(), None, []
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    if piece and first is None:
                        first = time.monotonic() - t0
                    text.append(piece)
        return first, "".join(text)
