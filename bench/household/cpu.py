"""How much of the machine's CPU other processes took while one mode ran.

The load average lags by minutes, so right after a mode (or any benchmark) it still shows that
work; instead compare the machine's busy CPU time (/proc/stat) with what this process and the
children it has reaped (the Hearth server of the mode) used over the same interval."""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s() -> float | None:
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None  # not Linux: nothing to compare with
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def _own_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuWatch:
    """start() before a mode, stop() after its server has exited: stop() returns the share of
    all CPUs' time that neither this process nor its reaped children used (for a ``--url``
    target, that server's own work counts as other), or None where /proc/stat is missing."""

    def __init__(self) -> None:
        self._t0 = self._own0 = 0.0
        self._busy0: float | None = None

    def start(self) -> None:
        self._t0, self._busy0, self._own0 = time.monotonic(), _machine_busy_s(), _own_s()

    def stop(self) -> float | None:
        busy = _machine_busy_s()
        wall = (time.monotonic() - self._t0) * (os.cpu_count() or 1)
        if busy is None or self._busy0 is None or wall <= 0:
            return None
        other = (busy - self._busy0) - (_own_s() - self._own0)
        return min(1.0, max(0.0, other / wall))
