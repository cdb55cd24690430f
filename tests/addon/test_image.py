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

import pytest
from addon_container import CONFIG, ENV, ROOT, podman

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


@pytest.fixture(scope="module")
def image() -> str:
    out = subprocess.run([str(ROOT / "scripts" / "addon" / "build_image"), "cpu"], env=ENV,
                         capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout.strip().splitlines()[-1]


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
    # queued, running, queued (the stop), running, done: one result (a state said again is
    # a progress event: where the job waits in the engine's queue)
    changes = [s for i, s in enumerate(finals) if not i or s != finals[i - 1]]
    assert changes == ["queued", "running", "queued", "running", "done"], finals


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
                   volumes=(f"{QEMU}:/usr/bin/qemu-x86_64-static:ro",),
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
