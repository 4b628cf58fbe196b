"""The ``packer`` console script: the command line, in Python's UTF-8 mode, and a Ctrl-C that
lands before it is loaded.

Importing the command line (click, numpy, pyarrow, dask) takes a fraction of a second; a
Ctrl-C then would end in Python's own traceback, and a SIGTERM (a CI job or batch scheduler
cancelled right after launch) would kill the process by the signal with nothing said. Here
each ends as one during a command does: one line, exit 130 or 143. The SIGTERM handler lives
only while the command line loads (and only where SIGTERM had Python's default: one a parent
ignored, or a handler of a program calling ``main()``, is left alone); the command's own,
installed by :mod:`packer.commands`, takes over from there.

Python decodes file names, and encodes what it prints, by the locale: under a Latin-1 one
(``de_DE.ISO-8859-1``) ``café.png`` was listed as ``cafÃ©.png`` (its row a missing file, or its
key, record and split changed without a word), and a class name Latin-1 cannot spell crashed
the build's summary. Job files and tables are UTF-8 whatever the locale, so the command runs in
UTF-8 mode (PEP 540) where the locale's encoding is another: it starts itself again with
``-X utf8`` before anything is read, and its dask workers inherit the mode.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def main() -> None:
    """Load :mod:`packer.cli` and run it (in UTF-8 mode: see the module docstring)."""
    if (not sys.flags.utf8_mode and sys.getfilesystemencoding().replace("-", "").lower() != "utf8"
            and os.path.isfile(sys.argv[0])):  # the script itself (not `python -c` calling main())
        os.environ["PYTHONUTF8"] = "1"  # for every process it starts (dask's workers, subprocesses)
        os.execv(sys.executable, [sys.executable, "-X", "utf8", sys.argv[0], *sys.argv[1:]])
    stopped_by: list[int] = []

    def terminate(signum: int, frame: FrameType | None) -> None:
        stopped_by.append(signum)
        raise KeyboardInterrupt  # out of the import under way, handled below as a Ctrl-C is

    sigterm_default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if sigterm_default:
        signal.signal(signal.SIGTERM, terminate)
    try:
        from packer.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("\npacker: stopped by SIGTERM\n" if stopped_by else "\npacker: interrupted\n")
        sys.exit(128 + (signal.SIGTERM if stopped_by else signal.SIGINT))  # 143 or 130, as shells report them
    finally:
        if sigterm_default:  # the command's handler (packer.commands) takes SIGTERM only from the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _print_undecodable_names()
    cli()


def _print_undecodable_names() -> None:
    """Under a strict UTF-8 stdout (``en_US.UTF-8``: Python prints strictly there, while C.UTF-8 and
    UTF-8 mode escape), a file name that is not UTF-8 (a Latin-1 ``r\\xe9s``, held as the surrogate
    ``\\udce9``) crashed a command's text output with a UnicodeEncodeError (exit 1, "internal error"):
    it is printed as its own bytes instead, as ``ls`` prints it. stderr already backslash-escapes."""
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors="surrogateescape")
