"""The benchmark's measure of CPU taken by other processes during a mode."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from household.cpu import CpuWatch

BURN = ("import time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.6:\n    pass\n")

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs /proc")


def _exited(pid: int) -> bool:
    """True once the process is a zombie: finished, its CPU time final, not yet reaped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_reaped_child_is_ours_and_an_unreaped_process_is_other():
    ours = CpuWatch()
    ours.start()
    subprocess.run([sys.executable, "-c", BURN], check=True)  # reaped: counted as ours
    share_ours = ours.stop()

    other = CpuWatch()
    other.start()
    p = subprocess.Popen([sys.executable, "-c", BURN])
    while not _exited(p.pid):
        time.sleep(0.01)
    share_other = other.stop()  # measured before the burner is reaped: someone else's work
    p.wait()

    assert share_ours is not None and share_other is not None
    assert share_other > share_ours + 0.15
