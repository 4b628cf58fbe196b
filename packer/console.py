"""The ``packer`` console script: the command line, in Python's UTF-8 mode, and a Ctrl-C that
lands before it is loaded.

Importing the command line (click, numpy, pyarrow, dask) takes a fraction of a second; a
Ctrl-C then would end in Python's own traceback. Here it ends as one during a command does:
one line, exit 130.

Python decodes file names, and encodes what it prints, by the locale: under a Latin-1 one
(``de_DE.ISO-8859-1``) ``café.png`` was listed as ``cafÃ©.png`` (its row a missing file, or its
key, record and split changed without a word), and a class name Latin-1 cannot spell crashed
the build's summary. Job files and tables are UTF-8 whatever the locale, so the command runs in
UTF-8 mode (PEP 540) where the locale's encoding is another: it starts itself again with
``-X utf8`` before anything is read, and its dask workers inherit the mode.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Load :mod:`packer.cli` and run it (in UTF-8 mode: see the module docstring)."""
    if (not sys.flags.utf8_mode and sys.getfilesystemencoding().replace("-", "").lower() != "utf8"
            and os.path.isfile(sys.argv[0])):  # the script itself (not `python -c` calling main())
        os.environ["PYTHONUTF8"] = "1"  # for every process it starts (dask's workers, subprocesses)
        os.execv(sys.executable, [sys.executable, "-X", "utf8", sys.argv[0], *sys.argv[1:]])
    try:
        from packer.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("\npacker: interrupted\n")
        sys.exit(130)  # 128 + SIGINT, as shells report it
    cli()
