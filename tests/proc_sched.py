"""How Linux schedules a process's threads, read from /proc (the tests' side: what a worker
set for itself is checked from outside)."""

from __future__ import annotations

from pathlib import Path

SCHED_OTHER = 0


def thread_sched(pid: int, tid: int) -> tuple[str, int, int] | None:
    """(state, nice, policy) of one thread; None once it is gone. The fields after the
    command's closing parenthesis start with field 3 (state); nice is field 19, policy 41."""
    try:
        raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[16]), int(fields[38])


def threads_sched(pid: int) -> dict[int, tuple[str, int, int]]:
    """Every thread of ``pid`` by thread id (empty once the process is gone)."""
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return {}
    found = {tid: thread_sched(pid, tid) for tid in tids}
    return {tid: s for tid, s in found.items() if s is not None}
