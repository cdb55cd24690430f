"""The worker loads llama.cpp the way every probe and test does (hearth.runner.boot): the real
worker and a plain process running the bootstrap load the same native libraries in the same
order, with the same signal dispositions; the worker holds nothing of the server stack when its
model loads; the tests' own process loads llama.cpp's libraries in the worker's order.
Snapshots: hearth.runner.snapshot, through HEARTH_BOOT_DUMP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from llama_in_process import rung, worker_cfg

from hearth.fleet.process import WorkerProcess
from hearth.llama.llama_backends import _lib_dir
from hearth.runner import snapshot

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
SERVER_STACK = ("asyncio", "aiohttp", "pydantic", "ssl", "_ssl", "hearth.engine",
                "hearth.fleet.runtime", "hearth.fleet", "hearth.api", "hearth.server")


def snaps(folder: Path) -> dict[str, dict]:
    found = {p.stem.split("-", 1)[1]: json.loads(p.read_text()) for p in folder.glob("*.json")}
    assert set(found) == {"loading", "loaded"}, found.keys()
    return found


def llama_libraries(libs: list[str]) -> list[str]:
    return [p for p in libs if Path(p).parent == _lib_dir().resolve()]


def native_libraries(libs: list[str]) -> list[str]:
    """Every library but Python's own extension modules (which follow what a process imports:
    the worker's channels need a few more): llama.cpp's, the C and C++ runtimes, OpenMP, a GPU
    driver's, OpenSSL's."""
    return [p for p in libs if sysconfig.get_config_var("EXT_SUFFIX") not in Path(p).name
            and Path(p).parent != Path(sysconfig.get_config_var("DESTSHARED")).resolve()]


@pytest.fixture(scope="module")
def worker_and_plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("boot")
    env = {**os.environ, snapshot.DUMP_ENV: str(out / "worker")}
    old = os.environ.copy()
    os.environ.update(env)  # the worker takes the server's environment
    try:
        w = WorkerProcess(worker_cfg(), 60.0)
        w.wait_ready(120.0)
        w.stop()
    finally:
        os.environ.clear()
        os.environ.update(old)
    plain = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "device" / "plain_load.py"),
         json.dumps(worker_cfg())], capture_output=True, text=True, timeout=120,
        env={**os.environ, snapshot.DUMP_ENV: str(out / "plain"),
             "PYTHONPATH": str(ROOT / "addon")})
    assert plain.returncode == 0, plain.stderr[-2000:]
    return snaps(out / "worker"), snaps(out / "plain")


@pytest.mark.parametrize("point", ["loading", "loaded"])
def test_the_worker_and_a_plain_process_load_the_same_libraries_in_order(worker_and_plain,
                                                                           point):
    worker, plain = (s[point]["libraries"] for s in worker_and_plain)
    assert llama_libraries(worker) == llama_libraries(plain)
    assert len(llama_libraries(worker)) >= 2  # libllama and ggml's, found where they live
    # Every other native library too, in the same order (OpenSSL's among them, were it there)
    assert native_libraries(worker) == native_libraries(plain)


@pytest.mark.parametrize("point", ["loading", "loaded"])
def test_the_worker_and_a_plain_process_have_the_same_signal_dispositions(worker_and_plain,
                                                                          point):
    worker, plain = (s[point]["signals"] for s in worker_and_plain)
    assert worker == plain
    # Set up before the load: a crash in it is reported, a Ctrl-C is the server's.
    assert worker["SIGSEGV"].startswith("caught") and worker["SIGUSR1"].startswith("caught")
    assert worker["SIGINT"] == worker["SIGTERM"] == "ignored/SIG_IGN"


def test_the_worker_holds_nothing_of_the_server_stack_when_its_model_loads(worker_and_plain):
    for point in ("loading", "loaded"):  # the model load, then the canary
        modules = set(worker_and_plain[0][point]["modules"])
        assert not modules & set(SERVER_STACK)
        assert "llama_cpp" in modules and "hearth.runner.serve" not in modules


def test_the_test_process_loads_llama_cpp_s_libraries_in_the_worker_s_order(worker_and_plain):
    rung()  # the tests' in-process load (tests/llama_in_process.py)
    worker = worker_and_plain[0]["loaded"]["libraries"]
    assert llama_libraries(snapshot.loaded_libraries()) == llama_libraries(worker)
