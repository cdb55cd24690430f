"""Faults a worker injects into itself, for the tests of what a crash costs. Only the
``HEARTH_WORKER_FAULT`` environment variable turns them on (comma-separated):

- ``sigill-at-canary:RUNG``: the canary decode on that CPU rung dies with SIGILL, as
  llama.cpp's AMX kernel does on CPUs that report AMX they cannot run;
- ``segv-on-grammar:MARKER``: sampling for a request whose grammar holds MARKER (a property
  name in its JSON schema) dies with SIGSEGV, as llama.cpp's grammar code did on schemas with
  huge repetition counts: a request that kills its worker every time.
"""

from __future__ import annotations

import os
import signal

from ..shared.protocol import FAULT_ENV


def _faults() -> dict[str, str]:
    out = {}
    for item in os.environ.get(FAULT_ENV, "").split(","):
        kind, _, arg = item.strip().partition(":")
        if kind:
            out[kind] = arg
    return out


FAULTS = _faults()


def _die(sig: signal.Signals) -> None:
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


def at_canary(rung: str) -> None:
    if FAULTS.get("sigill-at-canary") == rung:
        _die(signal.SIGILL)


def poisoned(grammar: str | None) -> bool:
    marker = FAULTS.get("segv-on-grammar")
    return bool(marker and grammar and marker in grammar)


def on_poisoned_sample() -> None:
    _die(signal.SIGSEGV)
