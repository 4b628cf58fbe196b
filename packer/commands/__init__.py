"""Click commands beyond ``build``, one module each; ``packer.cli`` registers them.

Every command wraps its body with :func:`exits`, which turns the project's exceptions into
their documented exit codes at the CLI boundary (and only there).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from packer.errors import PackerError

F = TypeVar("F", bound=Callable[..., Any])


def exits(fn: F) -> F:
    """Map PackerError subclasses to their exit codes; anything else is a bug (exit 1)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PackerError as err:
            click.echo(f"packer: error: {err}", err=True)
            sys.exit(err.exit_code)
        except (click.exceptions.Exit, click.ClickException, KeyboardInterrupt):
            raise
        except Exception:  # noqa: BLE001 - the CLI boundary: show the bug, exit 1
            click.echo("packer: internal error (please report it with the traceback below)", err=True)
            traceback.print_exc()
            sys.exit(1)

    return wrapper  # type: ignore[return-value]
