"""Progress lines for long stages: a live line on a terminal, periodic plain lines in CI logs.

Two kinds of stage use them. The pixel pass, near-copy verification, the pack pass and
``packer verify`` always show theirs (:class:`Progress` with ``delay=None``). The client stages
that are quick on a small dataset but can run for minutes on a large one (listing, table
placement, the near-copy candidate search, the split, the audit, the index, the HTML report)
use :func:`stage_progress`: their line appears only once the stage has run
:data:`STAGE_DELAY` seconds, so a small build prints what it printed before, and a large one
never sits silent long enough to look hung.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

#: Seconds a client stage runs before its progress line appears (:func:`stage_progress`): long
#: enough that the stages of a small build stay silent, short enough that a stage of a large one
#: shows it is working before a user wonders whether it hung.
STAGE_DELAY = 4.0


class Progress:
    """Count work done for one stage and show count, rate, ETA and (``show_bad``) bad-so-far.

    On a TTY the line is redrawn at most 10 times a second; elsewhere one line is printed
    every ``interval`` seconds and at the end. ``quiet`` prints nothing. Lines go to
    ``stream`` (default ``sys.stderr``, looked up when the Progress is made; where the process
    has none, nothing is printed).

    ``delay`` None: the first line comes one ``interval`` after the start, and :meth:`close`
    always prints the closing line. A number: nothing is printed until ``delay`` seconds have
    passed; the first :meth:`update` after that prints a line at once (then one every
    ``interval``), and :meth:`close` prints the closing line only if the stage ran that long,
    so a stage that ends sooner prints nothing at all.

    ``total`` None: the total is not known (a folder walk); the line shows the count and the
    rate, without an ETA. ``clock`` (seconds, monotonic) is for tests.
    """

    def __init__(self, stage: str, total: int | None, *, unit: str = "files", quiet: bool = False,
                 stream: TextIO | None = None, interval: float = 10.0, delay: float | None = None,
                 show_bad: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.total, self.unit = stage, total, unit
        given = stream or sys.stderr
        # no stderr at all (pythonw, a service, 2>&-): nothing to print to, so nothing is printed
        self.quiet = quiet or given is None
        self.stream: TextIO = given if given is not None else io.StringIO()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.1 if self.tty else interval
        self.note_interval = interval  # a line with a note stays on a terminal too: at most one per interval
        self.delay, self.show_bad, self._clock = delay, show_bad, clock
        self.done = self.bad = 0
        self.start = clock()
        self._next = self.start + (self.interval if delay is None else delay)  # when a line may be printed
        self.shown = False  # whether a line has been printed
        self._next_note = self.start  # when a terminal may get a line with a note (:meth:`update`)

    def _line(self) -> str:
        elapsed = max(self._clock() - self.start, 1e-9)
        rate = self.done / elapsed
        if self.total is None:
            line = f"{self.stage:>8}: {self.done} {self.unit} {rate:7.1f}/s"
        else:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta_text = f"{eta:5.0f}s" if eta != float("inf") else "    ?"
            line = f"{self.stage:>8}: {self.done}/{self.total} {self.unit} {rate:7.1f}/s  eta {eta_text}"
        return line + (f"  bad {self.bad}" if self.show_bad else "")

    def update(self, done: int = 1, bad: int = 0, *, note: str = "") -> None:
        """Count ``done`` more units (``bad`` of them bad); print a line when one is due, ending
        with ``note`` (:meth:`waiting`). On a terminal a line with a note is printed whole, as
        in a log, at most once an ``interval``, and the live line goes on below it."""
        self.done += done
        self.bad += bad
        if self.quiet:
            return
        now = self._clock()
        if note and self.tty and now >= self._next_note and (self.delay is None or now >= self._next):
            self._next_note = now + self.note_interval
            self._next = now + self.interval
            self.shown = True
            self.stream.write("\r" + self._line() + f"  {note}\n")
            self.stream.flush()
            return
        if now < self._next:
            return
        self._next = now + self.interval
        self.shown = True
        if self.tty:
            self.stream.write("\r" + self._line())
        else:
            self.stream.write(self._line() + (f"  {note}" if note else "") + "\n")
        self.stream.flush()

    def waiting(self, note: str = "") -> None:
        """The stage waits for its next result: print the line when one is due, as :meth:`update`
        does, with ``note`` (what the wait is on: workers paused for memory, say). A pass whose
        results stopped coming printed nothing at all, and looked hung."""
        self.update(0, note=note)

    def close(self) -> None:
        """Print the closing line (count, rate and the stage's seconds), unless ``quiet`` or a
        ``delay`` the stage did not outlast."""
        if self.quiet:
            return
        elapsed = self._clock() - self.start
        if self.delay is not None and not self.shown and elapsed < self.delay:
            return
        self.shown = True
        self.stream.write(("\r" if self.tty else "") + self._line() + f"  ({elapsed:.1f}s)\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Close when the stage finished; when it raised, only end a live line, so that the
        error's message starts on a line of its own."""
        if kind is None:
            self.close()
        elif self.shown and self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


def stage_progress(stage: str, total: int | None, *, unit: str, quiet: bool = False) -> Progress:
    """The progress of a client stage that is usually quick: printed on stderr only once it has
    run :data:`STAGE_DELAY` seconds (read at each call), without a bad count."""
    return Progress(stage, total, unit=unit, quiet=quiet, delay=STAGE_DELAY, show_bad=False)
