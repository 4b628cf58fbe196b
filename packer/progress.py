"""Progress lines for long stages: a live line on a terminal, periodic plain lines in CI logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Count work done for one stage and show samples/s, ETA and bad-so-far.

    On a TTY the line is redrawn at most 10 times a second; elsewhere one line is printed
    every ``interval`` seconds and at the end. ``quiet`` prints nothing.
    """

    def __init__(self, stage: str, total: int, *, unit: str = "files", quiet: bool = False,
                 stream: TextIO | None = None, interval: float = 10.0) -> None:
        self.stage, self.total, self.unit, self.quiet = stage, total, unit, quiet
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.1 if self.tty else interval
        self.done = self.bad = 0
        self.start = self._last = time.monotonic()

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = f"{eta:5.0f}s" if eta != float("inf") else "    ?"
        return (f"{self.stage:>8}: {self.done}/{self.total} {self.unit} "
                f"{rate:7.1f}/s  eta {eta_text}  bad {self.bad}")

    def update(self, done: int = 1, bad: int = 0) -> None:
        self.done += done
        self.bad += bad
        now = time.monotonic()
        if self.quiet or now - self._last < self.interval:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r" + self._line())
        else:
            self.stream.write(self._line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.quiet:
            return
        elapsed = time.monotonic() - self.start
        self.stream.write(("\r" if self.tty else "") + self._line() + f"  ({elapsed:.1f}s)\n")
        self.stream.flush()
