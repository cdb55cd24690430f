"""A one-line progress display on stderr: mode, elapsed/total, requests done, ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def fmt_s(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    def __init__(self, modes: list[str], duration_s: float, drain_timeout_s: float = 300.0,
                 stream: TextIO | None = None, overhead_s: float = 30.0):
        self.modes = modes
        self.duration_s = duration_s
        self.drain_timeout_s = drain_timeout_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.overhead_s = overhead_s  # server start, warm-up and drain, until one is measured
        self.index = -1
        self.mode_started = time.monotonic()
        self.started = time.monotonic()
        self._last_line = 0.0
        self._width = 0

    def start_mode(self, index: int) -> None:
        if self.index >= 0:
            spent = time.monotonic() - self.mode_started
            self.overhead_s = max(5.0, spent - self.duration_s)
        self.index = index
        self.mode_started = time.monotonic()

    def eta(self, elapsed_in_run: float | None) -> float:
        left_here = self.overhead_s + self.duration_s
        if elapsed_in_run is not None:
            # the drain is guessed from the last mode's overhead, and ends by its timeout
            over = max(0.0, elapsed_in_run - self.duration_s)
            drain = min(max(5.0, self.overhead_s - over),
                        self.duration_s + self.drain_timeout_s - elapsed_in_run)
            left_here = max(0.0, self.duration_s - elapsed_in_run) + max(0.0, drain)
        later = len(self.modes) - self.index - 1
        return left_here + later * (self.duration_s + self.overhead_s)

    def show(self, phase: str, elapsed: float | None = None, done: int = 0, total: int = 0,
             in_flight: int = 0) -> None:
        mode = self.modes[self.index] if 0 <= self.index < len(self.modes) else "?"
        head = f"[{self.index + 1}/{len(self.modes)} {mode}] {phase}"
        if elapsed is not None:
            stage = "arrivals" if elapsed < self.duration_s else "draining"
            head += (f" {fmt_s(elapsed)}/{fmt_s(self.duration_s)} {stage} · "
                     f"{done}/{total} requests done · {in_flight} in flight")
        line = f"{head} · ETA {fmt_s(self.eta(elapsed))}"
        now = time.monotonic()
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
            self.stream.flush()
        elif now - self._last_line >= 10 or elapsed is None:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = now

    def message(self, text: str) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()
