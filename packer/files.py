"""General helpers every layer may use, below every stage: atomic file output, fsync, file
digests, canonical JSON, human-readable sizes, freeing a file's blocks in place, and the C
library calls those and the allocator settings need. Nothing here knows about samples or shards."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO

from packer.errors import ConfigError, blocking_file, refused_write, uncreatable

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}

#: Suffix of a file being written; renamed away when complete (:func:`atomic_output`).
TMP_SUFFIX = ".partial"
#: A temporary :func:`atomic_output` names for its writer (``shared``): ``<file>.<pid>-<hex>.partial``
_WRITER_NAMED = re.compile(r"\.(\d+)-[0-9a-f]+" + re.escape(TMP_SUFFIX) + r"\Z")


def temporary_writer(name: str) -> int | None:
    """The process id a temporary's ``name`` holds, where :func:`atomic_output` named it for its
    writer (``shared``: ``report.html.<pid>-<hex>.partial``); None for any other name."""
    match = _WRITER_NAMED.search(name)
    return int(match.group(1)) if match else None


def stale_temporary(path: Path, *, lock_held: bool) -> bool:
    """Whether the temporary file ``path`` (``*.partial``) is what a writer that is gone left
    (killed before its rename), so removing it can break no write. One named for its writer
    (:func:`temporary_writer`): when no process of that id runs on this machine; a running one
    (this process too, or one of another user's) may be writing it, so it stays. One of a fixed
    name: only where the caller holds the lock of the folder it is in (``lock_held``), as every
    writer of such a file there does (a build, in its dataset folder)."""
    pid = temporary_writer(path.name)
    if pid is None:
        return lock_held
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (an id past any there can be, too)
        return True
    except OSError:  # another user's process (PermissionError): it runs
        return False
    return False


def parent_folder(path: Path) -> Path:
    """The folder that holds ``path``, to name in a hint: ``path.parent`` where that is it
    (``out/pets/v1`` -> ``out/pets``); where ``path`` ends in ``.`` or holds ``..`` (``Path.parent``
    is lexical: ``Path('.').parent`` is ``.`` itself, ``Path('..').parent`` is ``.``) the parent of
    its resolved path, relative to the working folder when ``path`` is relative (``..`` for ``.``)."""
    if path.name not in ("", "..") and ".." not in path.parts:
        return path.parent
    parent = path.resolve().parent
    return parent if path.is_absolute() else Path(os.path.relpath(parent))


#: A lone surrogate: how Python holds a byte of a file name that is not UTF-8 (``\\udce9`` for the
#: Latin-1 0xE9, PEP 383), which no UTF-8 document can hold as itself
_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_undecoded(json_text: str) -> str:
    """``json_text`` (``json.dumps(..., ensure_ascii=False)``) with each lone surrogate written as its
    JSON escape (``\\udce9``), so the text encodes as UTF-8 while every other character stays itself:
    a Latin-1 ``caf\\xe9`` reads ``"caf\\udce9"`` (as ``packer gc --json`` and ``packer locate`` print
    it; ``os.fsencode(json.loads(...))`` gives the name's bytes back), ``café`` stays ``"café"``. A
    surrogate is only ever inside a JSON string, where the escape means the same character."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json_text)


@contextlib.contextmanager
def arrow_readable(path: str | os.PathLike[str]) -> Iterator[str | BinaryIO]:
    """``path`` as a pyarrow reader (``pq.read_table``, ``pq.ParquetFile``, ``pq.read_schema``) opens
    it: its text where that is UTF-8, so pyarrow opens (and may memory-map) the file itself; else
    the file opened here, closed on leaving. pyarrow encodes every path it is given as UTF-8 and
    so dies on the lone surrogate by which Python holds a byte that is not (a version under the
    Latin-1 folder ``r\\xe9s``: ``UnicodeEncodeError ... surrogates not allowed``)."""
    text = os.fspath(path)
    if _SURROGATE.search(text) is None:
        yield text
        return
    with open(text, "rb") as fh:
        yield fh


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the one JSON spelling packer hashes and writes. A byte of a
    path that is not UTF-8 is its escape (:func:`escape_undecoded`), so the bytes stay UTF-8 and
    ``json.loads`` gives the path back; any other text is spelled as it always was."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: rare, so the common text is not scanned for one
        return escape_undecoded(text).encode()


def human_bytes(size: float) -> str:
    """``1536`` → ``'1.5 KiB'``: binary units up to TiB, one decimal (whole bytes below 1 KiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: the loop returns at TiB")


@contextlib.contextmanager
def atomic_output(path: Path, *, durable: bool = True, elsewhere: str | None = None,
                  shared: bool = False) -> Iterator[BinaryIO]:
    """Open ``path.partial`` for writing; on success fsync and rename it to ``path``.

    ``shared``: ``path`` may be written by two processes at once (``report.html`` by two
    ``packer report`` runs, or by one beside a build; a registry copy by builds of two outputs; a
    ``--json`` report by two CI jobs): the temporary gets a name of this writer's own
    (``path.<pid>-<random>.partial``), so neither removes or renames the other's half-written
    file (one fixed name made the first rename publish the other's half and the second fail).
    Without it the name is fixed, as a shard's must be: a retried pack task reads back what its
    earlier attempt left there.

    On failure the temporary file is removed, so ``path`` is either absent or complete.
    ``durable=False`` skips both fsyncs: for files whose reader verifies them and redoes the
    work when a crash left them damaged (the spill cache), not for outputs.

    A full, read-only or over-quota file system (and, creating the file, a refused permission, or a
    place that takes no new file or folder: ``/proc``)
    raises :class:`packer.errors.FileSystemError` naming ``path`` and the fix (``elsewhere``: how
    to put the file somewhere else, for a file the user named; default: another output folder), from
    the OSError;
    a file where one of its folders must be raises :class:`packer.errors.ConfigError` naming it.

    Only a regular file (or an absent one) is replaced: a ``path`` that is something else, a FIFO
    (``-o >(gzip > r.gz)``), a device (``/dev/stdout``, ``/dev/null``) or a socket, is written
    into as it is, with no temporary and no fsync (renaming over it would replace the pipe, or as
    root the device node, with a file); so is a symbolic link that leads to one (``/dev/stdout``,
    a shell's ``/dev/fd/63``). A link to a regular file is replaced by the new file, never written
    through: the file it leads to may be shared (a DVC or git-annex cache object, keyed by its old
    bytes), and rewriting it in place would change it under every other name it has.
    """
    if _is_special(path) or _names_a_descriptor(path):  # stat follows links, /proc's pipe:[N] ones included
        yield from _written_into(path, elsewhere)
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}" if shared
                         else path.name + TMP_SUFFIX)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a new inode every time: a temporary left behind may be a hard link to a published
        # shard (:func:`clone_file` killed before its rename), which "wb" would truncate in place
        tmp.unlink(missing_ok=True)
        fh = _DurableFile(open(tmp, "wb", buffering=0)) if durable else open(tmp, "wb")  # noqa: SIM115
    except (FileExistsError, NotADirectoryError) as err:  # a file stands where a folder must be
        raise ConfigError(f"cannot write {path}: {blocking_file(path.parent) or path.parent} is a file, not a "
                          "folder; remove it, or write elsewhere") from err
    except OSError as err:  # full, read-only, not permitted; or a place that takes no new file or folder (/proc)
        refused = refused_write(err, path, opening=True, elsewhere=elsewhere) or uncreatable(err, path,
                                                                                          elsewhere=elsewhere)
        if refused is None:
            raise
        raise refused from err
    try:
        with fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and (refused := refused_write(err, path, elsewhere=elsewhere)) is not None:
            raise refused from err
        raise
    if durable:
        fsync_dir(path.parent)


def _names_a_descriptor(path: Path) -> bool:
    """Whether ``path`` is a link that names an open file descriptor (``/dev/stdout``,
    ``/dev/fd/3``, ``/proc/self/fd/1``) whatever it leads to: ``-o /dev/stdout`` with stdout
    redirected to a file must write into that file, as the shell opened it, not make a temporary
    beside the link in ``/dev`` and rename it over the link."""
    absolute = os.path.abspath(path)
    return absolute.startswith(("/dev/", "/proc/")) and path.is_symlink()


_STANDARD_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def _own_descriptor(path: Path) -> int | None:
    """The file descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/3``,
    ``/proc/self/fd/3``, ``/proc/<this pid>/fd/3``), else None."""
    absolute = os.path.abspath(path)
    if absolute in _STANDARD_STREAMS:
        return _STANDARD_STREAMS[absolute]
    parts = absolute.split("/")
    if len(parts) == 4 and parts[1] == "dev" and parts[2] == "fd" and parts[3].isdigit():
        return int(parts[3])
    if (len(parts) == 5 and parts[1] == "proc" and parts[2] in ("self", "thread-self", str(os.getpid()))
            and parts[3] == "fd" and parts[4].isdigit()):
        return int(parts[4])
    return None


def _is_special(path: Path) -> bool:
    """Whether ``path`` exists as something that is neither a regular file nor a folder (a FIFO,
    a device, a socket): :func:`atomic_output` writes into it. False where it is absent or cannot
    be looked up (creating it then says why)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _written_into(path: Path, elsewhere: str | None) -> Iterator[BinaryIO]:
    """:func:`atomic_output` for a FIFO, device or socket: opened and written as it is (a pipe's
    reader gets the bytes as they come; a device takes no fsync). A refused or full one raises
    the :class:`packer.errors.FileSystemError` a file would."""
    try:
        own = _own_descriptor(path)
        # a descriptor of this process is written through a copy of it, at its offset and with its
        # flags (>> appends; what was written before stays): opening its link anew would truncate
        fh = (os.fdopen(os.dup(own), "wb") if own is not None  # noqa: SIM115  (closed below)
              else open(path, "wb"))  # noqa: SIM115  (closed below, after the caller's writes)
    except OSError as err:
        refused = refused_write(err, path, opening=True, elsewhere=elsewhere)
        if refused is None:
            raise
        raise refused from err
    try:
        with fh:
            yield fh
    except OSError as err:
        if (refused := refused_write(err, path, elsewhere=elsewhere)) is not None:
            raise refused from err
        raise


#: A durable file asks the kernel to start writing back what it holds every this many bytes.
WRITEBACK_BYTES = 8 << 20
#: ``SYNC_FILE_RANGE_WRITE`` (linux/fs.h): start writeback of the range's dirty pages, do not wait.
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def libc_function(name: str, *argtypes: str) -> Any:
    """The C library function ``name`` of this process (``ctypes.CDLL(None)``: no ldconfig
    subprocess, as ``ctypes.util.find_library`` would run), taking the ``ctypes`` types named by
    ``argtypes`` and returning an int that sets ``errno``; None where there is none (macOS has
    no ``fallocate``, Windows no C library to load by None)."""
    import ctypes  # only where such a function is called

    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = [getattr(ctypes, t) for t in argtypes]
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int) -> bool:
    """Ask the kernel to start writing ``fd``'s dirty pages to disk now, without waiting for
    them (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``). False where that call does not
    exist or the kernel refuses it. Only a hint: the ``fsync`` that makes the file durable still
    follows; it then finds the disk busy with the early pages instead of starting them all."""
    call = libc_function("sync_file_range", "c_int", "c_int64", "c_int64", "c_uint")
    return call is not None and call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) == 0


class _DurableFile(io.BufferedWriter):
    """What :func:`atomic_output` writes a durable file through: every :data:`WRITEBACK_BYTES`
    it hands the kernel what it buffered and starts its writeback (:func:`start_writeback`), so
    the disk writes while the caller keeps producing bytes and the closing ``fsync`` waits only
    for the tail (a 64 MiB shard: its ``fsync`` no longer waits for all 64 MiB at once)."""

    def __init__(self, raw: io.RawIOBase) -> None:
        super().__init__(raw)
        self._unsynced = 0

    def write(self, data: Any) -> int:
        written = super().write(data)
        self._unsynced += written
        if self._unsynced >= WRITEBACK_BYTES:
            self._unsynced = 0
            self.flush()
            start_writeback(self.fileno())
        return written


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: ioctl(2) request that makes a file share another's blocks, copy-on-write (Linux's FICLONE:
#: btrfs, XFS with reflink, bcachefs, OCFS2; other file systems refuse it)
_FICLONE = 0x40049409
#: Mode of a published shard: read-only for everyone, so that no write reaches the file any
#: version links to (a build replaces a file by writing a new one and renaming it, never in place)
READ_ONLY = 0o444


def clone_file(source: Path, target: Path) -> str:
    """Make ``target`` hold ``source``'s bytes without copying them where the file system can:
    a reflink (a new inode sharing ``source``'s blocks, copy-on-write), else a hard link (the
    same inode), else (another device, a refused link) a copy. Returns how: ``"reflink"``,
    ``"hardlink"`` or ``"copy"``. ``target`` ends read-only (:data:`READ_ONLY`): a hard link
    makes ``source`` read-only too, since they are one file. The link is made under a temporary
    name, then renamed over ``target``, so an existing ``target`` is replaced, never written."""
    tmp = target.with_name(target.name + TMP_SUFFIX)
    tmp.unlink(missing_ok=True)
    how = "reflink" if _reflink(source, tmp) else ""
    if not how:
        try:
            os.link(source, tmp)
            how = "hardlink"
            if os.stat(tmp).st_mode & 0o777 != READ_ONLY:
                os.chmod(tmp, READ_ONLY)  # the earlier version's file too: it is the same inode
        except OSError:  # another device, a file system without links, a file owned by someone else
            tmp.unlink(missing_ok=True)
            with open(source, "rb") as src, open(tmp, "xb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            how = "copy"
    if how != "hardlink":
        os.chmod(tmp, READ_ONLY)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    return how


def _reflink(source: Path, target: Path) -> bool:
    """Create ``target`` as a reflink of ``source`` (:data:`_FICLONE`); False where the platform
    or file system cannot (``target`` is then absent)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return False
    with open(source, "rb") as src:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.ioctl(fd, _FICLONE, src.fileno())
            os.fsync(fd)
        except OSError:
            os.close(fd)
            os.unlink(target)
            return False
        os.close(fd)
    return True


def file_sha256(path: Path) -> tuple[int, str]:
    """Size and sha256 hex digest of a file (``hashlib.file_digest``: one read loop in C)."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
        return fh.tell(), digest.hexdigest()


def parse_byte_size(value: int | str, where: str = "pack.max_bytes") -> int:
    """``256MiB`` → 268435456; integers pass through. Raises ConfigError naming ``where`` on junk.

    The decimal is read exactly (``Fraction``, not float: ``float("2.01") * 1000`` is
    2009.999…, which ``int`` truncated to 2009), and a fraction of a byte left over is
    rounded half up (``"1.5B"`` → 2); a size under one byte (``"0.5B"``) is refused."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", value, flags=re.IGNORECASE)
    if not match:
        raise ConfigError(f"{where}: cannot read {value!r} as a size; write e.g. 256MiB or 1GB")
    number, unit = match.groups()
    exact = Fraction(number) * _UNITS[(unit or "B").upper()]
    if exact < 1:  # "0.1B" is no byte at all: no limit a shard or a cache can keep
        raise ConfigError(f"{where}: {value!r} is less than one byte; write a size of at least 1B, e.g. 256MiB")
    return math.floor(exact + Fraction(1, 2))


#: fallocate(2) mode: free the range's blocks and keep the file's size (Linux's
#: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
_PUNCH_HOLE = 0x02 | 0x01


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give the blocks of bytes ``offset:offset+length`` of the open file ``fd`` back to the
    file system, keeping the file's size (the range then reads as zeros). Only whole blocks
    inside the range are freed. Returns False where the platform or file system cannot
    (no fallocate, EOPNOTSUPP, ENOSYS): the caller then frees space by deleting whole files.
    Other errors (EBADF, EIO) raise OSError."""
    fallocate = libc_function("fallocate", "c_int", "c_int", "c_int64", "c_int64")
    if fallocate is None or length <= 0:
        return fallocate is not None
    if fallocate(fd, _PUNCH_HOLE, offset, length) == 0:
        return True
    import ctypes

    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(code, os.strerror(code))


def write_jsonl(path: Path, records: Iterable[dict[str, Any]], schema: str) -> Path:
    """Write ``records`` to ``path`` atomically, one JSON object per line (sorted keys, UTF-8),
    each validated against ``schemas/<schema>.schema.json`` first; raises if one breaks it."""
    import jsonschema

    from packer.schemas import load_schema

    validator = jsonschema.Draft202012Validator(load_schema(schema))
    with atomic_output(path) as fh:
        for record in records:
            validator.validate(record)
            fh.write(json.dumps(record, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped). ValueError naming the file and
    line where a line is not JSON, not a JSON object, or nests too deeply to read (a hand-edited
    or received file); OSError if it cannot be read."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except RecursionError:
                raise ValueError(f"{path.name} line {number}: JSON nested too deeply to read") from None
            except ValueError as err:
                raise ValueError(f"{path.name} line {number}: not JSON ({err})") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path.name} line {number}: a JSON {type(record).__name__}, not an object")
            records.append(record)
    return records


def folder_locks_work(folder: Path) -> bool:
    """Whether the file system of ``folder`` takes the directory locks :func:`folder_lock` uses
    (``flock``): True where a lock can be taken, or another process holds one; False where the
    file system refuses them (some network file systems), where a build runs unguarded and
    nothing can tell an interrupted build's leftovers from a running one's. Takes a shared lock
    for a moment, never waits."""
    return _shared_lock(folder) != "unsupported"


def folder_locked_now(folder: Path) -> bool:
    """Whether another process holds :func:`folder_lock` on ``folder`` at this moment (a running
    build of the dataset folder, or a gc of it). Takes a shared lock for a moment, never waits;
    False where there is no such folder or the file system takes no directory locks."""
    try:
        return _shared_lock(folder) == "busy"
    except OSError:  # no such folder (any more): nothing holds it
        return False


def _shared_lock(folder: Path) -> str:
    """Try a shared ``flock`` on ``folder`` for a moment: ``busy`` (another holds an exclusive
    one), ``free`` or ``unsupported`` (the file system takes no directory locks). Raises OSError
    where ``folder`` cannot be opened."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "busy"
    except OSError:
        return "unsupported"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return "free"
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_lock(folder: Path, busy: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``folder`` (opened read-only) for the ``with`` block; the
    lock goes with the process, ``kill -9`` included. Another process holding it: ConfigError
    ``busy`` (nothing done). Yields whether the lock is held: a file system without directory
    locks (``flock`` fails otherwise) runs the block unguarded, which is all it can do."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError as err:
            raise ConfigError(busy) from err
        except OSError:  # no directory locks here (some network file systems)
            held = False
        yield held
    finally:
        os.close(fd)
