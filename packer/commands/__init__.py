"""Click commands beyond ``build``, one module each; ``packer.cli`` registers them.

Every command wraps its body with :func:`exits`, which turns the project's exceptions into
their documented exit codes at the CLI boundary (and only there).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, NoReturn, TypeVar

import click

from packer.errors import PackerError, refused_write

F = TypeVar("F", bound=Callable[..., Any])


#: What an interrupted command leaves that the user can build on, by command function name.
INTERRUPTED_HINTS = {"build": "; files decoded so far stay in the build cache, and the same command resumes "
                              "from them (--fresh starts over)"}


def exits(fn: F) -> F:
    """Map PackerError subclasses to their exit codes, and an OSError of a full, over-quota or
    read-only file system to :class:`~packer.errors.FileSystemError`'s; Ctrl-C exits 130 with one line; anything
    else is a bug (exit 1)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PackerError as err:
            click.echo(f"packer: error: {err}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo(f"\npacker: interrupted{INTERRUPTED_HINTS.get(fn.__name__, '')}", err=True)
            sys.exit(130)  # 128 + SIGINT, as shells report it
        except (click.exceptions.Exit, click.ClickException):
            raise
        except OSError as err:
            # a full or read-only disk met outside packer's own writers (a library's write): not a bug
            refused = refused_write(err, err.filename or "a file")
            if refused is None:
                _internal_error()
            click.echo(f"packer: error: {refused}", err=True)
            sys.exit(refused.exit_code)
        except Exception:  # noqa: BLE001 - the CLI boundary: show the bug, exit 1
            _internal_error()

    return wrapper  # type: ignore[return-value]


def _internal_error() -> NoReturn:
    """Print the exception being handled as a bug to report, and exit 1."""
    click.echo("packer: internal error (please report it with the traceback below)", err=True)
    traceback.print_exc()
    sys.exit(1)
