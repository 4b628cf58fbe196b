"""The project's exception types; the CLI maps each to a documented exit code.

A defect of one sample is not an exception: it is an :class:`packer.records.Issue`.
These are defects of the run.
"""

from __future__ import annotations

import errno
from pathlib import Path


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


class ClusterLostError(PackerError):
    """The connection to the dask scheduler broke mid-run (the scheduler stopped, or the network
    between it and packer did): nothing was published, and rerunning resumes from the cache."""

    exit_code = 7


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
OUTPUT_ELSEWHERE = "choose another output folder (packer build --out DIR)"


def refused_write(err: OSError, path: object, *, opening: bool = False,
                  elsewhere: str = OUTPUT_ELSEWHERE) -> FileSystemError | None:
    """The :class:`FileSystemError` for ``err`` met writing ``path``, or None when ``err`` is not a
    condition of the file system (a bug or a read error then stays what it is). ``opening``: the
    error came from creating or opening the file or its folder, where a refused permission is the
    file system's answer too. ``elsewhere``: how to put the file somewhere else, for the fix."""
    known = _STORAGE_FIXES.get(err.errno or 0) or (_OPEN_FIXES.get(err.errno or 0) if opening else None)
    if known is None:
        return None
    said, fix = known
    return FileSystemError(f"cannot write {path}: {said} ({err.strerror or err}); {fix.format(elsewhere=elsewhere)}")


def blocking_file(folder: Path) -> Path | None:
    """The nearest of ``folder`` and its parents that exists but is not a folder (what makes
    creating ``folder`` fail with FileExistsError or NotADirectoryError), or None."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
