"""The project's exception types; the CLI maps each to a documented exit code.

A defect of one sample is not an exception: it is an :class:`packer.records.Issue`.
These are defects of the run.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar


class PackerError(Exception):
    """Base class. ``exit_code`` is what ``packer`` exits with when this escapes."""

    exit_code = 1


class ConfigError(PackerError):
    """The job file or a command-line option is wrong: names the key path and the fix."""

    exit_code = 2


class BadFractionError(PackerError):
    """More bad samples than ``validate.max_bad_fraction`` allows (report still written).

    ``version_dir``: the version folder a build wrote all the same (shards, bad-sample report,
    manifest), for a caller to open; None where nothing was built (``packer validate``)."""

    exit_code = 3

    def __init__(self, message: str, *, version_dir: Path | None = None) -> None:
        super().__init__(message)
        self.version_dir = version_dir


class LeakageError(PackerError):
    """The split audit found an entity (or duplicate) in two splits."""

    exit_code = 4


class IntegrityError(PackerError):
    """A shard or manifest does not match its recorded hash, size or schema."""

    exit_code = 5


class FileSystemError(PackerError):
    """A file system refused a write packer needs: full, over quota, read-only, not permitted,
    or a file over its size limit. Names the file, the condition and the fix."""

    exit_code = 6


class ResourceError(FileSystemError):
    """The machine ran out of something the run needs, not the data's fault nor a bug: open file
    descriptors (``ulimit -n``) or memory. Exit 6, as a refused write: nothing was published, the
    build cache keeps what was decoded, and the same command resumes once the limit is raised.
    Names the file met when it ran out, what ran out and the fix."""


class ClusterLostError(PackerError):
    """The connection to the dask scheduler broke mid-run (the scheduler stopped, or the network
    between it and packer did): nothing was published, and rerunning resumes from the cache."""

    exit_code = 7


#: An option as the command line spells it and as the Python API (:mod:`packer.api`) takes it:
#: name → (flag, keyword argument, the keyword's value where the flag takes none).
_OPTIONS: dict[str, tuple[str, str, str | None]] = {
    "out": ("--out", "out", None),
    "workers": ("--workers", "workers", None),
    "scheduler": ("--scheduler", "scheduler", None),
    "cache_dir": ("--cache-dir", "cache_dir", None),
    "keep_spill": ("--keep-spill", "keep_spill", "True"),
    "fresh": ("--fresh", "resume", "False"),
    "quick": ("--quick", "quick", "True"),
    "json": ("--json", "write_json", None),
    "junit": ("--junit", "write_junit", None),
}


@dataclass(frozen=True)
class Surface:
    """Where the caller gave packer its options, so that a message names what that caller can
    change: the command line's flags (``--scheduler ADDRESS``) or the Python API's keyword
    arguments (``scheduler='ADDRESS'``); a notebook user cannot pass a flag. The messages are
    written once, with these methods where they name an option."""

    python: bool

    def name(self, option: str) -> str:
        """The option's name alone: ``--out`` or ``out``."""
        flag, keyword, _ = _OPTIONS[option]
        return keyword if self.python else flag

    def option(self, option: str, value: object = None, *, placeholder: str | None = None) -> str:
        """The option as the caller writes it: ``--scheduler tcp://h:1`` or ``scheduler='tcp://h:1'``
        (``value``), ``--cache-dir DIR`` or ``cache_dir=DIR`` (``placeholder``), ``--fresh`` or
        ``resume=False`` (an option that takes no value)."""
        flag, keyword, fixed = _OPTIONS[option]
        shown_value = str(value) if isinstance(value, Path) else value
        given = placeholder if placeholder is not None else None if value is None else repr(shown_value)
        if not self.python:
            shown = placeholder if placeholder is not None else None if value is None else str(value)
            return flag if shown is None else f"{flag} {shown}"
        if option in ("json", "junit"):  # methods of ValidationResult
            return f"ValidationResult.{keyword}({given or 'PATH'})"
        return f"{keyword}={fixed if given is None else given}"

    def omit(self, option: str) -> str:
        """How to leave the option out: ``omit --scheduler`` or ``leave scheduler None``."""
        return f"leave {self.name(option)} None" if self.python else f"omit {self.name(option)}"

    def call(self, command: str, option: str, *, placeholder: str | None = None) -> str:
        """A call with the option: ``packer build --cache-dir DIR`` or
        ``packer.build(..., cache_dir=DIR)``."""
        shown = self.option(option, placeholder=placeholder)
        return f"packer.{command}(..., {shown})" if self.python else f"packer {command} {shown}"

    def view(self, sources: Sequence[str] = (), *, python: str) -> str:
        """Some sources read alone, as the caller asks for it: the loader commands' flag
        (``packer bench-loader``, ``examples/train.py``: ``--sources ct,mr``, ``--sources NAME``
        where none is named), or ``python``, the call as the message gives it to Python callers."""
        return python if self.python else f"--sources {','.join(sources) or 'NAME'}"

    def collate(self, name: str, *, python: str) -> str:
        """A collate, as the caller chooses it: ``--collate list`` (``packer bench-loader``), or
        ``python``, the call as the message gives it to Python callers."""
        return python if self.python else f"--collate {name}"

    def storage_options(self, **pairs: str) -> str:
        """Storage options: ``--storage-option anon=true`` or ``storage_options={'anon': True}``
        (``...`` stands for a value to fill in)."""
        if not self.python:
            return " ".join(f"--storage-option {key}={value}" for key, value in pairs.items())
        shown = {"true": "True", "false": "False", "...": "..."}
        inner = ", ".join(f"{key!r}: {shown.get(value, repr(value))}" for key, value in pairs.items())
        return f"storage_options={{{inner}}}"


COMMAND_LINE = Surface(python=False)
PYTHON_API = Surface(python=True)
_SURFACE: ContextVar[Surface | None] = ContextVar("packer_surface", default=None)


def surface() -> Surface:
    """The surface of the run in progress in this process: the command line unless a call of
    :mod:`packer.api` (or the command line itself) said otherwise."""
    return _SURFACE.get() or COMMAND_LINE


def surface_set() -> bool:
    """Whether a caller (the command line, or a call of :mod:`packer.api`) set the surface."""
    return _SURFACE.get() is not None


@contextlib.contextmanager
def called_from(caller: Surface, *, unless_set: bool = False) -> Iterator[None]:
    """Messages raised or printed inside name ``caller``'s options. ``unless_set``: keep the
    surface an outer caller set (the command line runs the API's functions)."""
    if unless_set and _SURFACE.get() is not None:
        yield
        return
    token = _SURFACE.set(caller)
    try:
        yield
    finally:
        _SURFACE.reset(token)



_F = TypeVar("_F", bound=Callable[..., Any])


def from_python(fn: _F) -> _F:
    """``fn``, a Python entry point (a loader's constructor, say), with its messages naming
    Python's spelling of options (``storage_options={...}``) unless a caller set the surface
    (the command line runs some of them)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with called_from(PYTHON_API, unless_set=True):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]

#: errno → (what the file system said, the fix): conditions of the machine, not of packer or of
#: the data, that stop a write. Only errnos that writing (or creating) a file raises are here, so
#: an error met while *reading* inside a writer's body is never blamed on the output. ``{elsewhere}``
#: is where else the file could go.
_STORAGE_FIXES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the file system is full", "free space there, or {elsewhere}"),
    errno.EDQUOT: ("the disk quota is used up", "free space within the quota, or {elsewhere}"),
    errno.EROFS: ("the file system is read-only", "{elsewhere}"),
    errno.EFBIG: ("the file is over the file system's size limit",
                  "lower pack.max_bytes in the job file, or {elsewhere}"),
}
#: A refused permission counts only where packer creates or opens a file or folder for writing.
_OPEN_FIXES: dict[int, tuple[str, str]] = {
    errno.EACCES: ("permission denied", "make the folder writable for this user, or {elsewhere}"),
    errno.EPERM: ("operation not permitted", "make the folder writable for this user, or {elsewhere}"),
}


def output_elsewhere() -> str:
    """The fix for an output file the file system refuses: another output folder."""
    return f"choose another output folder ({surface().call('build', 'out', placeholder='DIR')})"


def refused_write(err: OSError, path: object, *, opening: bool = False,
                  elsewhere: str | None = None) -> FileSystemError | None:
    """The :class:`FileSystemError` for ``err`` met writing ``path``, or None when ``err`` is not a
    condition of the file system (a bug or a read error then stays what it is). ``opening``: the
    error came from creating or opening the file or its folder, where a refused permission is the
    file system's answer too. ``elsewhere``: how to put the file somewhere else, for the fix
    (default: :func:`output_elsewhere`)."""
    known = _STORAGE_FIXES.get(err.errno or 0) or (_OPEN_FIXES.get(err.errno or 0) if opening else None)
    if known is None:
        return None
    said, fix = known
    if err.errno == errno.EFBIG and not _is_shard(path):  # pack.max_bytes sizes shards, no other file
        fix = "raise the file size limit (`ulimit -f`, the file system's own), or {elsewhere}"
    fixed = fix.format(elsewhere=elsewhere or output_elsewhere())
    return FileSystemError(f"cannot write {path}: {said} ({err.strerror or err}); {fixed}")


#: errno → (what ran out, the fix) for a process or machine out of a resource (:func:`exhausted`).
_RESOURCE_FIXES: dict[int, tuple[str, str]] = {
    errno.EMFILE: ("this process has as many files open as its limit allows",
                   "raise the open-file limit (`ulimit -n 4096`, or the batch system's own) and run it again"),
    errno.ENFILE: ("the system has as many files open as its limit allows",
                   "close other programs' files or raise the system's limit (fs.file-max) and run it again"),
    errno.ENOMEM: ("out of memory",
                   "raise the memory limit (`ulimit -v`, the container's or batch job's), lower --workers, "
                   "or lower limits.max_decoded_bytes in the job file, and run it again"),
}


def exhausted(err: OSError, path: object) -> ResourceError | None:
    """The :class:`ResourceError` for ``err`` met opening, reading or writing ``path`` when the
    process or the machine ran out of open files or memory (EMFILE, ENFILE, ENOMEM), or None for
    any other error. Such an error is the machine's condition, never the file's nor a bug."""
    known = _RESOURCE_FIXES.get(err.errno or 0)
    if known is None:
        return None
    said, fix = known
    return ResourceError(f"cannot open {path}: {said} ({err.strerror or err}); {fix}")


def out_of_memory(err: BaseException, path: object = None, *, needed: int | None = None) -> ResourceError:
    """The :class:`ResourceError` for a MemoryError (or a library's own failed allocation, OpenCV's
    ``Insufficient memory``) met decoding ``path`` (None: met elsewhere in the run), needing about
    ``needed`` bytes where known: the machine's condition, never the file's, so never a bad sample."""
    where = f"decoding {path}" if path is not None else "this run"
    size = f" (it needs about {needed:,} bytes for its pixels)" if needed else ""
    detail = f": {err}" if str(err) else ""
    return ResourceError(f"{where} ran out of memory{size} ({type(err).__name__}{detail}); "
                         f"{_RESOURCE_FIXES[errno.ENOMEM][1]}")


def a_type(value: object) -> str:
    """``value``'s type as a message names it, with its article: "an int", "a list", "None"
    (not "a NoneType"). Messages that refuse a value of the wrong type say "not an int", never
    "not a int"."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _is_shard(path: object) -> bool:
    """Whether ``path`` names a shard (or its temporary name): the one file ``pack.max_bytes`` sizes."""
    return re.match(r"\.?(train|valid|test)-\d+\.(tar|parquet)", str(path).rsplit("/", 1)[-1]) is not None


def unmakeable_folder(err: OSError, path: object, elsewhere: str) -> FileSystemError | None:
    """The :class:`FileSystemError` for ``mkdir(parents=True)``'s FileNotFoundError on the way to
    ``path``: a file system that takes no new folder there (``/proc``, ``/sys``), or a folder removed
    meanwhile; None for any other error (:func:`refused_write` keeps ENOENT a bug elsewhere)."""
    if not isinstance(err, FileNotFoundError):
        return None
    return FileSystemError(f"cannot write {path}: a folder on its way cannot be created there "
                           f"({err.strerror or err}); {elsewhere}")


def uncreatable(err: OSError, path: Path, *, elsewhere: str | None = None) -> FileSystemError | None:
    """The :class:`FileSystemError` for the FileNotFoundError met creating the file ``path`` (its
    folders made with ``mkdir(parents=True)`` first): a file system that takes no new file or folder
    there (``/proc``, ``/sys``), or a folder removed meanwhile; None for any other error.
    ``elsewhere``: how to put the file somewhere else (default: :func:`output_elsewhere`)."""
    if not isinstance(err, FileNotFoundError):
        return None
    folder = blocking_file(path.parent) is None and path.parent.is_dir()
    what = "the file cannot be created there" if folder else "a folder on its way cannot be created there"
    return FileSystemError(f"cannot write {path}: {what} ({err.strerror or err}); "
                           f"{elsewhere or output_elsewhere()}")


def blocking_file(folder: Path) -> Path | None:
    """The nearest of ``folder`` and its parents that exists but is not a folder (what makes
    creating ``folder`` fail with FileExistsError or NotADirectoryError), or None."""
    return next((p for p in (folder, *folder.parents) if path_exists(p) and not p.is_dir()), None)


def path_exists(path: Path) -> bool:
    """Whether ``path`` exists; False for a name the file system refuses to look up (too long,
    where ``Path.exists`` raises): creating it then says so, naming the path."""
    try:
        return path.exists()
    except OSError:
        return False
