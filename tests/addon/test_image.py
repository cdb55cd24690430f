"""The add-on image, built and run here the way the Supervisor builds and runs it (``make
addon-test``; podman instead of Docker, a Debian trixie stand-in instead of the Supervisor's
base image: scripts/addon/standin_base says what differs).

- the CPU image builds from addon/ with the Supervisor's build arguments, carries one llama.cpp
  CPU backend per instruction-set level and no compiler;
- started like an add-on (``/data/options.json`` from config.yaml's options, ``/config`` mapped,
  port 8080, the Supervisor's init), it passes its healthcheck, answers a chat completion, runs a
  job; ``podman stop`` gets it out inside the add-on's ``timeout`` with the running job queued
  again, and after a start the job completes exactly once;
- under an emulated CPU without AVX (qemu-user, ``-cpu Westmere``, which kills an AVX
  instruction with SIGILL: checked first) the same image loads the model and answers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hearth_server import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "addon" / "config.yaml").read_text())
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "scripts" / "addon" / "containers.conf")}
QEMU = shutil.which("qemu-x86_64-static")
# Runs a VEX-encoded instruction (vzeroall): fine on an AVX CPU, SIGILL on one without.
AVX_PROBE = """
import ctypes, mmap
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(bytes([0xC5, 0xFC, 0x77, 0xC3]))
ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
"""

pytestmark = pytest.mark.skipif(shutil.which("podman") is None,
                                reason="podman is missing (make addon-test installs it)")


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True,
                          check=check, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> str:
    out = subprocess.run([str(ROOT / "scripts" / "addon" / "build_image"), "cpu"], env=ENV,
                         capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout.strip().splitlines()[-1]


class Addon:
    """One add-on container: its /data and /config folders live on the host, as the
    Supervisor keeps them, so they outlive the container's stops and starts."""

    def __init__(self, image: str, root: Path, options: dict[str, Any] | None = None,
                 entrypoint: list[str] | None = None, env: dict[str, str] | None = None):
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
        if entrypoint:
            args += ["-v", f"{QEMU}:/usr/bin/qemu-x86_64-static:ro",
                     "--entrypoint", json.dumps(entrypoint)]
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


@pytest.fixture
def addons(tmp_path):
    made: list[Addon] = []

    def make(*args: Any, **kwargs: Any) -> Addon:
        addon = Addon(*args, tmp_path / f"addon{len(made)}", **kwargs)
        made.append(addon)
        return addon

    yield make
    for addon in made:
        addon.remove()


def test_image_carries_cpu_variants_and_no_compiler(image):
    labels = json.loads(podman("image", "inspect", image, "-f", "{{json .Labels}}").stdout)
    assert labels["io.hass.type"] == "app"
    assert labels["io.hass.version"] == CONFIG["version"]
    assert labels["io.hass.arch"] in CONFIG["arch"]
    health = podman("image", "inspect", image, "-f", "{{json .Config.Healthcheck}}").stdout
    assert "/health" in health
    out = podman("run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
                 "ls /opt/venv/lib/python3*/site-packages/llama_cpp/lib/; "
                 "command -v gcc cc g++ cmake || true").stdout.split()
    variants = {f for f in out if f.startswith("libggml-cpu-")}
    if os.uname().machine == "x86_64":
        assert {"libggml-cpu-x64.so", "libggml-cpu-sse42.so", "libggml-cpu-haswell.so",
                "libggml-cpu-skylakex.so"} <= variants, variants
    assert len(variants) >= 5, variants
    assert not [f for f in out if f.startswith("/")], f"compilers in the image: {out}"


def test_serves_stops_in_time_and_finishes_the_job_once(image, addons):
    addon = addons(image)
    addon.start()
    addon.wait_healthy(timeout=600)
    health = addon.get("/health")
    assert health["status"] == "ready"
    assert any(b.startswith("CPU (libggml-cpu-") for b in health["backends"]), health

    reply = addon.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0})
    assert reply["choices"][0]["message"]["content"].strip()
    assert (addon.config / "models").is_dir()  # run.sh's models folder, in the mapped /config

    job = addon.post("/v1/jobs", {"request": {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 1500, "ignore_eos": True, "temperature": 0}})
    addon.wait_job(job["id"], ("running",), timeout=120)
    took, code = addon.stop()
    print(f"stop with a running job: {took:.1f} s, exit code {code}")
    assert took < CONFIG["timeout"], f"stop took {took:.1f} s (the add-on's timeout)"
    assert code == 0, f"exit code {code} (137 would be the KILL after the timeout):\n" \
                      f"{addon.logs()}"
    with sqlite3.connect(addon.data / "jobs.sqlite3") as db:
        status, attempts = db.execute("SELECT status, attempts FROM jobs WHERE id=?",
                                      (job["id"],)).fetchone()
    assert (status, attempts) == ("queued", 1), "the running job was not queued again"

    addon.start()
    addon.wait_healthy(timeout=600)
    done = addon.wait_job(job["id"], ("done", "failed", "cancelled"), timeout=600)
    assert done["status"] == "done", done
    assert done["result"]["usage"]["completion_tokens"] == 1500
    took, code = addon.stop()
    assert code == 0
    with sqlite3.connect(addon.data / "jobs.sqlite3") as db:
        attempts = db.execute("SELECT attempts FROM jobs WHERE id=?", (job["id"],)).fetchone()
        finals = [json.loads(p)["job"]["status"] for (p,) in db.execute(
            "SELECT payload FROM events WHERE job_id=? ORDER BY seq", (job["id"],))]
    assert attempts == (2,)
    # queued, running, queued (the stop), running, done: one result
    assert finals == ["queued", "running", "queued", "running", "done"], finals


@pytest.mark.skipif(os.uname().machine != "x86_64" or QEMU is None,
                    reason="needs an x86_64 host and qemu-user-static")
def test_runs_on_a_cpu_without_avx(image, addons):
    """The image's own Python under qemu-user emulating a Westmere (SSE4.2, no AVX): llama.cpp
    picks the SSE4.2 variant, loads the model and answers. The probe shows that this emulated
    CPU really refuses AVX, so a portable AVX2 build would have died here."""
    qemu = ["/usr/bin/qemu-x86_64-static", "-cpu", "Westmere"]
    # --init: qemu re-raises the signal on itself, which PID 1 would ignore
    probe = podman("run", "--rm", "--init", "-v", f"{QEMU}:/usr/bin/qemu-x86_64-static:ro",
                   "--entrypoint", qemu[0], image, *qemu[1:], "/usr/bin/python3", "-c",
                   AVX_PROBE, check=False)
    assert probe.returncode == 128 + signal.SIGILL, (probe.returncode, probe.stderr[-500:])
    native = podman("run", "--rm", "--entrypoint", "/usr/bin/python3", image, "-c", AVX_PROBE,
                    check=False)
    if native.returncode != 0:
        pytest.skip("this host has no AVX itself: nothing to tell apart")

    site = podman("run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
                  "echo /opt/venv/lib/python3*/site-packages").stdout.strip()
    # qemu-user emulates one process (an exec would run natively): the model's worker, the
    # only process that runs llama.cpp; the server runs natively.
    addon = addons(image, options={"n_ctx": 1024, "n_parallel": 1, "n_threads": 2},
                   env={"PYTHONPATH": f"/opt/hearth:{site}",
                        "HEARTH_WORKER_WRAPPER": " ".join(qemu)},
                   entrypoint=["/usr/bin/python3", "-m", "hearth", "serve",
                               "--host", "0.0.0.0", "--port", "8080",
                               "--options-file", "/data/options.json",
                               "--data-dir", "/data", "--models-dir", "/config/models"])
    addon.start()
    t0 = time.monotonic()
    health = addon.wait_ready(timeout=900)
    print(f"emulated Westmere: ready after {time.monotonic() - t0:.0f} s, {health['backends']}")
    assert health["status"] == "ready", health
    assert "CPU (libggml-cpu-sse42.so)" in health["backends"], health
    reply = addon.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
        "temperature": 0}, timeout=600)
    assert reply["usage"]["completion_tokens"] >= 1
