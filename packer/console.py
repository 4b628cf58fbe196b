"""The ``packer`` console script: the command line, and a Ctrl-C that lands before it is loaded.

Importing the command line (click, numpy, pyarrow, dask) takes a fraction of a second; a
Ctrl-C then would end in Python's own traceback. Here it ends as one during a command does:
one line, exit 130.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Load :mod:`packer.cli` and run it."""
    try:
        from packer.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("\npacker: interrupted\n")
        sys.exit(130)  # 128 + SIGINT, as shells report it
    cli()
