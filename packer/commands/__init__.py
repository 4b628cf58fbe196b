"""Click commands beyond ``build``, one module each; ``packer.cli`` registers them.

Every command wraps its body with :func:`exits`, which turns the project's exceptions into
their documented exit codes at the CLI boundary (and only there).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

from packer.errors import COMMAND_LINE, PackerError, called_from, exhausted, out_of_memory, refused_write
from packer.files import escape_undecoded
from packer.redact import RAW_TRACEBACK_ENV, forget_jobs, format_exception, redact_names, redacting

F = TypeVar("F", bound=Callable[..., Any])


#: What an interrupted command leaves that the user can build on, by command function name.
INTERRUPTED_HINTS = {"build": "; files decoded so far stay in the build cache, and the same command resumes "
                              "from them (--fresh starts over)"}


#: The exit status when the reader of stdout or stderr has gone (``packer ... | head -1``): 128 + SIGPIPE, what a
#: shell shows for a command that SIGPIPE ended (``yes | head -1``). Not 0: the command did not finish, and a
#: ``packer validate`` cut short must not pass for a clean one under ``set -o pipefail``; not 1 (click's choice),
#: which is packer's "internal error".
CLOSED_OUTPUT_EXIT = 141


class ClosedStream(io.TextIOBase):
    """Stands in for a stdout or stderr that was closed before packer started (``packer validate JOB >&-``),
    which Python leaves as ``None``: every write to ``None`` is dropped silently (click's echo, print), so the
    command's output was lost and it exited 0. A write here raises BrokenPipeError, as one to a pipe whose
    reader has gone does, and so the command ends the same way: quietly, with :data:`CLOSED_OUTPUT_EXIT`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, f"{self.name} was closed before packer started")

    def flush(self) -> None:  # nothing was written, so nothing is to flush (and Python flushes it at exit)
        return None


def stand_in_for_closed_streams() -> None:
    """Point a closed stdout or stderr (``None``: see :class:`ClosedStream`) at a :class:`ClosedStream`."""
    if sys.stdout is None:
        sys.stdout = ClosedStream("stdout")
    if sys.stderr is None:
        sys.stderr = ClosedStream("stderr")


def output_closed() -> bool:
    """Whether stdout or stderr is a pipe (or socket) whose reader has gone, which is when a write to it raises
    BrokenPipeError, or was closed before packer started (:class:`ClosedStream`). A stream without a file
    descriptor (click's test runner) is never closed this way."""
    return any(isinstance(stream, ClosedStream) or _reader_gone(stream) for stream in (sys.stdout, sys.stderr))


def _reader_gone(stream: Any) -> bool:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an in-memory stream, or closed: no pipe to ask
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def exit_closed_output() -> NoReturn:
    """End the command quietly, with :data:`CLOSED_OUTPUT_EXIT`, because its output's reader has gone: no message
    (there is nobody to read it) and no traceback. The closed streams are pointed at /dev/null first, so that
    Python's flush at exit does not raise BrokenPipeError again ("Exception ignored ...", exit 120): what the
    Python documentation's "Note on SIGPIPE" recommends."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, ClosedStream) and _reader_gone(stream):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    # a stream closed before packer started has no descriptor to point elsewhere: later writes are dropped
    if isinstance(sys.stdout, ClosedStream):
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - open until the process ends
    if isinstance(sys.stderr, ClosedStream):
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - open until the process ends
    sys.exit(CLOSED_OUTPUT_EXIT)


def exits(fn: F) -> F:
    """Map PackerError subclasses to their exit codes, and an OSError of a full, over-quota or
    read-only file system to :class:`~packer.errors.FileSystemError`'s; Ctrl-C exits 130 with one line; a closed
    stdout or stderr (``| head``) exits 141 quietly; anything else is a bug (exit 1), its traceback
    printed without raw paths where the command's job pseudonymizes (:mod:`packer.redact`)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        forget_jobs()  # the roots of the job this command loads, not of one an earlier command in-process loaded
        interrupted: list[int] = []  # the signals that stopped the command (bound again below)
        try:
            with _noted_interrupts() as interrupted, called_from(COMMAND_LINE):  # messages name its flags
                result = fn(*args, **kwargs)
                if interrupted:
                    raise KeyboardInterrupt  # a Ctrl-C Python dropped where it landed (see _noted_interrupts)
            return result
        except PackerError as err:  # under PHI pseudonymization without a name met in the data (packer.redact)
            click.echo(f"packer: error: {redact_names(str(err)) if redacting() else err}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            from packer.storage import cancel_remote_requests

            cancel_remote_requests()  # a request in flight on fsspec's loop would print a traceback at exit
            stopped_by = "stopped by SIGTERM" if signal.SIGTERM in interrupted else "interrupted"
            click.echo(f"\npacker: {stopped_by}{INTERRUPTED_HINTS.get(fn.__name__, '')}", err=True)
            # 128 + the signal, as shells report it: 130 for Ctrl-C, 143 for SIGTERM
            sys.exit(128 + (signal.SIGTERM if signal.SIGTERM in interrupted else signal.SIGINT))
        except (click.exceptions.Exit, click.ClickException):
            raise
        except BrokenPipeError:
            if not output_closed():
                _internal_error()  # a pipe of its own (a subprocess's, say) broke: a bug to report
            exit_closed_output()
        except OSError as err:
            # a full or read-only disk met outside packer's own writers (a library's write): not a bug
            refused = refused_write(err, err.filename or "a file") or exhausted(err, err.filename or "a file")
            if refused is None:
                _internal_error()
            click.echo(f"packer: error: {refused}", err=True)
            sys.exit(refused.exit_code)
        except MemoryError as err:  # the machine's condition, not a bug: say what to raise, exit 6
            click.echo(f"packer: error: {out_of_memory(err)}", err=True)
            sys.exit(out_of_memory(err).exit_code)
        except Exception:  # noqa: BLE001 - the CLI boundary: show the bug, exit 1
            _internal_error()

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def _noted_interrupts() -> Iterator[list[int]]:
    """Ctrl-C raises KeyboardInterrupt as usual, and is noted in the yielded list; so does SIGTERM
    (``kill PID``, a batch scheduler's preemption, ``docker stop``), which Python's default would
    let end the process at once, with no line, dask's workers and semaphores left to clean-up
    warnings: it goes to whatever handles Ctrl-C at that moment (the dask cluster holds one that
    lands while it starts or stops), so the command ends the way an interrupted one does.

    Python cannot raise an exception out of a weakref callback or a ``__del__``: a Ctrl-C that
    lands in one (dask's objects run many as they are collected) is printed as "Exception ignored
    in ...: KeyboardInterrupt" and the command goes on as if it had not come. Noted, the command
    still ends as interrupted, and it is not printed (``sys.unraisablehook``; any other unraisable
    error still is). Off the main thread nothing changes; when SIGINT is not handled from Python
    (a background job's is ignored), Ctrl-C stays as it is and SIGTERM raises KeyboardInterrupt
    itself; a SIGTERM handler someone else installed (or SIG_IGN) is left alone."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    handler = signal.getsignal(signal.SIGINT)
    sigint_handler = handler if callable(handler) else None
    sigterm_default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    print_unraisable = sys.unraisablehook

    def note(signum: int, frame: FrameType | None) -> Any:
        noted.append(signum)
        assert sigint_handler is not None
        return sigint_handler(signum, frame)

    def terminate(signum: int, frame: FrameType | None) -> Any:
        noted.append(signum)
        current = signal.getsignal(signal.SIGINT)  # the cluster's, while it starts or runs
        if callable(current) and current is not note:
            return current(signal.SIGINT, frame)
        if sigint_handler is not None:
            return sigint_handler(signal.SIGINT, frame)
        raise KeyboardInterrupt

    def unless_noted(unraisable: Any) -> None:
        if not (noted and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            print_unraisable(unraisable)

    if sigint_handler is not None:
        signal.signal(signal.SIGINT, note)
    if sigterm_default:
        signal.signal(signal.SIGTERM, terminate)
    sys.unraisablehook = unless_noted
    try:
        yield noted
    finally:
        if sigint_handler is not None:
            signal.signal(signal.SIGINT, sigint_handler)
        if sigterm_default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.unraisablehook = print_unraisable


def _internal_error() -> NoReturn:
    """Print the exception being handled as a bug to report, and exit 1. Under a job that
    pseudonymizes, its messages show no raw path (:func:`packer.redact.format_exception`)."""
    if redacting():
        click.echo("packer: internal error (please report it with the traceback below; phi.mode is pseudonymize, "
                   "so a path under a source root is shown as <source NAME>/…, any other path or file name as "
                   "<path>, a quoted value as '<value>' and a folder or file name or entity id of the data as <id>: "
                   f"set {RAW_TRACEBACK_ENV}=1 to see them, where raw paths may be shown)", err=True)
    else:
        click.echo("packer: internal error (please report it with the traceback below)", err=True)
    err = sys.exception()
    if err is not None:
        click.echo(format_exception(err), err=True, nl=False)
    sys.exit(1)


def json_document(value: Any) -> str:
    """``value`` as the JSON a ``--json`` option prints: indented, keys sorted, non-ASCII text as
    itself, and a byte of a path that is not UTF-8 as its escape (:func:`escape_undecoded`), so
    stdout is always a UTF-8 JSON document (RFC 8259 §8.1)."""
    return escape_undecoded(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def local_folder_argument(value: str, *, command: str) -> Path:
    """A command-line path argument of a command that reads local folders only, as a Path: a
    ``file://`` URL is its local path, any other URL a ConfigError (exit 2) that names the URL
    as typed (``Path("s3://b/x")`` would read ``s3:/b/x``) and the commands that read it in place."""
    from packer.errors import ConfigError
    from packer.storage import is_url, local_path

    if not is_url(value):
        return Path(value)
    path = local_path(value)
    if path is not None:
        return path
    if command == "ls":
        instead = (f"list the versions in the object store with its own tools (e.g. `aws s3 ls {value.rstrip('/')}/`), "
                   f"then `packer inspect URL/<version>/` and `packer verify URL/<version>/` read one in place")
    else:
        folder = value.rstrip("/").removesuffix("/manifest.json")  # a version's objects are under its folder
        instead = (f"`packer inspect {value}` and `packer verify {value}` read a version in an object store in place; "
                   f"or copy its objects to a local folder (e.g. `aws s3 cp --recursive {folder}/ DIR`) and pass "
                   "that folder")
    raise ConfigError(f"{value}: `packer {command}` reads local folders only; {instead}")


def refuse_registry_copy(shown: str, located: Path, consequence: str) -> None:
    """ConfigError (exit 2) where ``located`` (:func:`~packer.manifest.resolve_manifest_path` of
    the argument ``shown``) is a registry copy with none of its version's files beside it, for a
    command that checks those files (``packer verify``, ``packer diff --check``): it is no damaged
    version, so nothing is to be restored; the message names the version folder to pass instead.
    ``consequence``: what the command would do with it. A ``manifest.json`` alone is a version
    whose files are missing (an integrity failure the check names), never refused here."""
    from packer.errors import PackerError
    from packer.manifest import MANIFEST_FILE, detached_manifest_error, read_manifest

    if not located.is_file() or located.name == MANIFEST_FILE:
        return
    try:
        data = read_manifest(located, strict=False, check_hash=False).data
    except PackerError:
        return  # a damaged copy: the check names what is wrong with it
    detached = detached_manifest_error(shown, located, data, consequence, copies_only=True)
    if detached is not None:
        raise detached
