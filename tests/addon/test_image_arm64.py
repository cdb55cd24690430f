"""The aarch64 add-on image, built on this x86_64 machine and run under qemu-user (``make
addon-test-arm64``; not in ``make addon-test`` or CI: a cold build takes most of an hour on
2 cores, see bench/results/addon-arm64-*/).

``scripts/addon/build_image cpu arm64`` builds it from addon/Dockerfile on an arm64 stand-in base,
its RUN steps emulated, with llama.cpp cross-compiled (scripts/addon/cross_llama_arm64) in place
of the build stage's compile. Then:

- the image is arm64 throughout: the Supervisor's labels say aarch64, its Python and llama.cpp
  are aarch64 ELF files, it carries llama.cpp's arm64 CPU variants (armv8.0 for a Raspberry Pi 4
  up to armv9.2 with SME) and no compiler;
- on an emulated Pi 3, Pi 4 (and Yellow's CM4) and Pi 5 CPU each, the variant that CPU's features
  allow comes first;
- started like an add-on with qemu emulating a Raspberry Pi 5's CPU (Cortex-A76: ARMv8.2 with
  dot product and FP16 arithmetic, no SVE; ``QEMU_CPU``, which every emulated process of the
  container reads), llama.cpp picks the armv8.2 dot-product+FP16 variant, loads SmolLM2, answers
  a chat completion and a streamed voice turn. Timings under emulation say nothing of a board's
  speed; they are printed for the record only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from addon_container import CONFIG, ENV, ROOT, podman

EM_AARCH64 = 183  # e_machine of an aarch64 ELF file
ARM_VARIANTS = {f"libggml-cpu-{v}.so" for v in (
    "armv8.0_1", "armv8.2_1", "armv8.2_2", "armv8.2_3", "armv8.6_1", "armv8.6_2", "armv9.2_1",
    "armv9.2_2")}
PI5_CPU = "cortex-a76"
# Reads each file's ELF header (e_machine: bytes 18-19), inside the image.
ELF_MACHINES = """
import glob, json, struct, sys
paths = [sys.executable] + glob.glob("/opt/venv/lib/python3*/site-packages/llama_cpp/lib/*.so")
print(json.dumps({p: struct.unpack("<H", open(p, "rb").read(20)[18:20])[0] for p in paths}))
"""

pytestmark = [
    pytest.mark.skipif(os.uname().machine != "x86_64",
                       reason="builds the aarch64 image on an x86_64 machine"),
    pytest.mark.skipif(not os.path.exists("/proc/sys/fs/binfmt_misc/qemu-aarch64"),
                       reason="no qemu-user handler for arm64 programs "
                              "(make addon-test-arm64 registers it)"),
]


@pytest.fixture(scope="module")
def image() -> str:
    t0 = time.monotonic()
    out = subprocess.run([str(ROOT / "scripts" / "addon" / "build_image"), "cpu", "arm64"],
                         env=ENV, capture_output=True, text=True, timeout=3 * 3600)
    assert out.returncode == 0, out.stderr[-4000:]
    print(f"\narm64 image: {time.monotonic() - t0:.0f} s to build (or find) it")
    return out.stdout.strip().splitlines()[-1]


def test_image_is_arm64_with_every_variant_and_no_compiler(image):
    inspect = json.loads(podman("image", "inspect", image).stdout)[0]
    assert inspect["Architecture"] == "arm64"
    labels = inspect["Config"]["Labels"]
    assert labels["io.hass.arch"] == "aarch64" and "aarch64" in CONFIG["arch"]
    assert labels["io.hass.version"] == CONFIG["version"]
    machines = json.loads(podman("run", "--rm", "--entrypoint", "/opt/venv/bin/python3", image,
                                 "-c", ELF_MACHINES, timeout=300).stdout)
    assert set(machines.values()) == {EM_AARCH64}, machines
    names = {os.path.basename(p) for p in machines}
    assert names >= ARM_VARIANTS, names
    assert {"libllama.so", "libggml.so", "libggml-base.so"} <= names, names
    compilers = podman("run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
                       "command -v gcc cc g++ cmake || true", timeout=300).stdout.split()
    assert not compilers, f"compilers in the image: {compilers}"


@pytest.mark.parametrize(("cpu", "best"), [
    ("cortex-a53", "armv8.0_1"),  # Raspberry Pi 3: ARMv8.0
    ("cortex-a72", "armv8.0_1"),  # Raspberry Pi 4, Home Assistant Yellow (CM4): ARMv8.0
    ("cortex-a76", "armv8.2_2"),  # Raspberry Pi 5: ARMv8.2 with dot product and FP16
])
def test_each_board_cpu_gets_its_variant(image, cpu, best):
    """Every variant library scores itself against the CPU's features (qemu-user reports the
    emulated CPU's); the best that this CPU runs comes first."""
    out = podman("run", "--rm", "-e", f"QEMU_CPU={cpu}", "--entrypoint", "/opt/venv/bin/python3",
                 image, "-c", "from hearth.llama.llama_backends import cpu_variants; "
                 "print(' '.join(n for n, _ in cpu_variants()))", timeout=600)
    variants = out.stdout.split()
    assert variants and variants[0] == best, (cpu, variants)


def test_answers_a_chat_and_a_voice_turn_on_an_emulated_pi5_cpu(image, addons):
    # Emulated, one decode of a full micro-batch takes minutes: smaller batches keep the
    # calibration decodes at start short, and the watchdog (a hung worker at 120 s) waits.
    addon = addons(image, options={"n_ctx": 2048, "n_parallel": 2, "n_batch": 64,
                                   "n_ubatch": 32},
                   env={"QEMU_CPU": PI5_CPU, "HEARTH_WORKER_WATCHDOG_S": "1800"})
    t0 = time.monotonic()
    addon.start()
    health = addon.wait_ready(timeout=1800)
    ready = time.monotonic() - t0
    assert health["status"] == "ready", health
    assert "CPU (libggml-cpu-armv8.2_2.so)" in health["backends"], health
    before = addon.get("/v1/queue")

    t1 = time.monotonic()
    reply = addon.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0}, timeout=900)
    chat_s = time.monotonic() - t1
    assert reply["choices"][0]["message"]["content"].strip(), reply
    assert reply["usage"]["completion_tokens"] >= 1

    t2 = time.monotonic()
    ttft, text = addon.stream({
        "messages": [{"role": "user", "content": "Turn on the kitchen light."}],
        "max_tokens": 8, "temperature": 0}, headers={"X-Hearth-Class": "voice"}, timeout=900)
    voice_s = time.monotonic() - t2
    assert ttft is not None and text.strip(), text
    after = addon.get("/v1/queue")
    assert after["classes"]["voice"]["completed"] == before["classes"]["voice"]["completed"] + 1
    print(f"\narm64 under qemu-user ({PI5_CPU}): ready {ready:.0f} s after start; chat "
          f"{reply['usage']['completion_tokens']} tokens in {chat_s:.1f} s; voice turn first "
          f"token {ttft:.1f} s, {voice_s:.1f} s in all ({text.strip()!r}); {health['backends']}")
