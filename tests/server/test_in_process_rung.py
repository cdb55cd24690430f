"""Tests that run llama.cpp in their own process choose its CPU rung the way the server does
(tests/llama_in_process.py): a worker process walks down the ladder first, so on a CPU whose
best rung crashes (injected: HEARTH_WORKER_FAULT=sigill-at-canary:RUNG, as llama.cpp's AMX
kernel does on some CPUs that report AMX) only a worker dies, and the test process loads on the
next rung and lives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hearth.llama.llama_backends import cpu_rungs
from hearth.shared.protocol import FAULT_ENV

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]


def run_with_first_rung_crashing(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, FAULT_ENV: f"sigill-at-canary:{cpu_rungs()[0]}",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "addon"), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=240)


def test_with_the_best_rung_crashing_a_test_process_loads_on_the_next_and_lives():
    run = run_with_first_rung_crashing(
        "import json\nfrom llama_in_process import open_model, rung\n"
        "m = open_model()\nprint(json.dumps([rung(), m.n_vocab]))")
    assert run.returncode == 0, run.stderr[-3000:]
    chosen, n_vocab = json.loads(run.stdout.splitlines()[-1])
    assert chosen == cpu_rungs()[1] and n_vocab > 0


def test_the_same_fault_kills_a_process_that_loads_on_the_best_rung():
    run = run_with_first_rung_crashing(
        "from llama_in_process import worker_cfg\nfrom hearth.runner import boot\n"
        "boot.load(worker_cfg())")
    assert run.returncode == -signal.SIGILL, run.stderr[-3000:]
