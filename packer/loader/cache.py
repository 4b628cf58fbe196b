"""The local shard cache: a remote shard downloaded once per machine, verified, kept, evicted least recently used.

``ShardDataset(manifest, split, cache_dir=..., cache_limit="50GB")`` (or the environment
variables ``PACKER_SHARD_CACHE`` and ``PACKER_SHARD_CACHE_LIMIT``) reads a remote dataset's
shards through :class:`ShardCache`:

- **keyed by content**: an entry is ``<sha256><suffix>``, the shard's sha256 from the manifest,
  so a replaced object is never served stale and two dataset versions share identical shards
  (a sha256 that is not 64 lowercase hex digits is refused before any path is built from it:
  :func:`entry_problem`);
- **downloaded once per machine**: the ranks and workers of one machine share the folder; a
  download holds an exclusive ``flock`` on the entry's lock file, and a reader that finds the
  lock taken polls until the entry is there, then uses it rather than fetching it again (never
  blocking on the lock: a reader holding it shared may be waiting for this one's batch);
- **never half-written**: bytes go to a ``.partial`` file, hashed as they arrive, and are
  renamed into place only when size and sha256 match the manifest (a process killed mid-way
  leaves a ``.partial`` that the next download of that shard replaces);
- **verified once**: at download; afterwards an entry whose size or modification time changed
  on disk is fetched again (``verify="shard"`` on the dataset hashes it on every read as well; the default,
  ``verify="sample"``, checks every sample read from it against ``_index.parquet``);
- **retried**: a failed or cut-short download is retried with exponential backoff
  (``retries`` times), then fails naming the URL; a missing object (FileNotFoundError) at once;
- **bounded**: after each download, and at the first read through a :class:`ShardCache` (a
  folder filled by an earlier run, with no limit or a larger one, would otherwise keep it all
  while every read is a hit), entries beyond ``limit`` bytes are deleted least recently used
  first (by access time, which every read sets where it may: see below), skipping any entry a
  reader holds (a shared ``flock`` while it reads) and the one being read;
- **shared by a group**: members of a lab group may share one folder (group-writable, umask
  002). Only an entry's owner may set its access time to a chosen value, so another member's
  read leaves it as the file system keeps it (its atime policy): least-recently-used order is
  then best effort, never whether an entry is read. Taking a shared lock to read needs no
  write access (an existing lock file is opened read-only), so a cache made read-only once
  filled serves its entries; a shard it does not hold fails naming the folder as not writable,
  and one over its limit stays over it, with a warning.

:meth:`ShardCache.prefetch` downloads the next shards of a worker's plan on a background thread
(``read_ahead`` at a time), so after warm-up the loader does not wait on the store's latency.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import storage
from packer.errors import ConfigError, IntegrityError
from packer.files import parse_byte_size

#: Environment defaults for ``ShardDataset(cache_dir=, cache_limit=)``.
CACHE_ENV = "PACKER_SHARD_CACHE"
LIMIT_ENV = "PACKER_SHARD_CACHE_LIMIT"
_CHUNK = 4 << 20
#: Seconds between tries of a cache entry's lock that another process holds.
_POLL_S = 0.02
#: What a file system says to a write this user may not make there
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)
#: A shard's sha256 as the manifest's schema has it: the only key a cache path is built from
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: A shard file's suffix as a cache entry keeps it (``.tar``, ``.parquet``)
_SUFFIX = re.compile(r"(\.[A-Za-z0-9]{1,16})?")


@dataclass
class ShardCache:
    """A cache folder (see the module docstring). ``limit``: bytes kept (None: no limit);
    ``retries``: extra attempts per download; ``read_ahead``: shards downloaded ahead."""

    folder: Path
    limit: int | None = None
    retries: int = 4
    backoff: float = 0.5
    read_ahead: int = 2
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False, compare=False)
    _pending: dict[str, Future[Path]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    #: whether this object has applied ``limit`` to the folder yet (each DataLoader worker's copy does so once)
    _bounded: bool = field(default=False, init=False, repr=False, compare=False)
    _warned_evict: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if self.limit is not None and self.limit <= 0:
            raise ConfigError(f"cache_limit must be positive, got {self.limit}")

    def __getstate__(self) -> dict[str, Any]:  # to DataLoader workers: the settings, not the threads
        return {"folder": self.folder, "limit": self.limit, "retries": self.retries, "backoff": self.backoff,
                "read_ahead": self.read_ahead}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def entry(self, sha256: str, file: str) -> Path:
        """Where the shard with this sha256 (and this file name's suffix) lives in the cache.
        ``IntegrityError`` for a sha256 that is not 64 lowercase hex digits or a suffix that is
        not a plain extension (:func:`entry_problem`), before any path is built from it."""
        problem = entry_problem(sha256, file)
        if problem is not None:
            raise IntegrityError(f"{problem}; refused by the shard cache {self.folder}, whose paths are built from it")
        return self.folder / f"{sha256}{Path(file).suffix}"

    @contextlib.contextmanager
    def reading(self, url: str, sha256: str, size: int, file: str,
                storage_options: Any = None) -> Iterator[Path]:
        """The local path of the shard, downloaded first if needed, held (a shared lock) while the
        caller reads it so eviction leaves it alone. Raises ``OSError`` naming ``url`` when the
        download keeps failing, and IntegrityError when the store's bytes are not the manifest's or
        the manifest's sha256 cannot name a cache entry (:meth:`entry`)."""
        self.entry(sha256, file)  # checks the key before any path (the lock file's too) is built from it
        path = self._pending_result(sha256) or self.fetch(url, sha256, size, file, storage_options)
        with self._open_lock(sha256, writing=False) as lock:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_SH)
            # evicted or altered between fetch and lock (another thread's or process's fetch evicts
            # what no reader holds, this entry too until the shared lock is taken): fetch again, and
            # check again under the lock, as often as it takes a cache too small to hold it
            for _ in range(_REFETCHES):
                if self._valid(path, size):
                    break
                if lock is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                path = self.fetch(url, sha256, size, file, storage_options)
                if lock is not None:
                    fcntl.flock(lock, fcntl.LOCK_SH)
            else:
                if not self._valid(path, size):
                    raise OSError(f"{url}: the shard cache {self.folder} lost the shard to eviction "
                                  f"{_REFETCHES} times before it could be read: cache_limit "
                                  f"({self.limit} bytes) is too small for the shards read at once (each worker's "
                                  "and its read-ahead's); raise cache_limit, or lower read_ahead")
            _touch(path)
            yield path

    def fetch(self, url: str, sha256: str, size: int, file: str, storage_options: Any = None) -> Path:
        """The shard's cache entry, downloaded (once per machine) if it is not there or not intact."""
        path = self.entry(sha256, file)
        if self._valid(path, size):
            if not self._bounded:  # a hit downloads nothing: nothing else would trim what an earlier run left
                self.evict(keep=(sha256,))
            return path
        with self._open_lock(sha256, writing=True, exclusive=True) as lock:
            # Never block on the lock: besides a download, a reader may hold it (shared) across a
            # pause in its own iteration, and that reader's DataLoader may be waiting for this very
            # worker's next batch (a deadlock, seen with two workers). Poll instead, and use the
            # entry as soon as another process's download has made it valid.
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self._valid(path, size):
                        return path
                    time.sleep(_POLL_S)
            if not self._valid(path, size):
                self._download(url, sha256, size, path, storage_options)
        self.evict(keep=(sha256,))
        return path

    def prefetch(self, shards: Sequence[tuple[str, str, int, str, Any]]) -> None:
        """Start downloading up to ``read_ahead`` of ``shards`` (url, sha256, size, file,
        storage options) on background threads, one each; :meth:`reading` waits for them."""
        if self.read_ahead <= 0:
            return
        with self._lock:
            if self._pool is None:  # one thread a shard ahead: a download waits on the store's latency, not the CPU
                self._pool = ThreadPoolExecutor(max_workers=self.read_ahead, thread_name_prefix="packer-read-ahead")
            for url, sha256, size, file, options in list(shards)[:self.read_ahead]:
                if entry_problem(sha256, file) is not None:
                    continue  # not fetched ahead: reading() refuses it in the foreground, where the reader sees why
                if sha256 not in self._pending and not self._valid(self.entry(sha256, file), size):
                    self._pending[sha256] = self._pool.submit(self.fetch, url, sha256, size, file, options)

    def _pending_result(self, sha256: str) -> Path | None:
        with self._lock:
            future = self._pending.pop(sha256, None)
        if future is None:
            return None
        try:
            return future.result()
        except (OSError, IntegrityError):
            return None  # fetched again in the foreground, where the error is raised to the reader

    def invalidate(self, sha256: str, file: str) -> None:
        """Drop the entry's verified stamp (a sample read from it did not match its recorded
        checksum: the copy was damaged on this disk after its download was verified), so the next
        :meth:`reading` fetches the shard again. A reader holding the entry reads on; the file
        itself is replaced by the next download (a new file renamed over it)."""
        (self.folder / f".{self.entry(sha256, file).name}.ok").unlink(missing_ok=True)

    def _lock_path(self, sha256: str) -> Path:
        return self.folder / f".{sha256}.lock"

    @contextlib.contextmanager
    def _open_lock(self, sha256: str, *, writing: bool, exclusive: bool = False) -> Iterator[Any]:
        """The entry's lock file, open for ``flock``. A shared lock (reading) asks for no write
        access to the file: an existing one is opened read-only (in a lab group's cache, another
        member's; in a cache made read-only once filled, every one), a missing one made. An
        ``exclusive`` lock (a download, an eviction) opens it for writing where it can: on NFS
        Linux emulates ``flock`` with byte-range locks, and an exclusive one on a file open
        read-only fails with EBADF; a file this user may not write is then opened read-only, as
        for a shared lock. ``writing`` (a download): the cache folder is made too, and a folder
        this user may not write raises OSError saying so (:meth:`_unwritable`). Reading only: None
        where the lock file is missing and cannot be made (a folder this user may not write, whose
        entries only its owner can evict): the entry is read without it."""
        path = self._lock_path(sha256)
        handle: Any = None
        if exclusive and path.exists():
            try:
                handle = open(path, "a+b")  # noqa: SIM115 - closed below
            except OSError as err:
                if err.errno not in (*_REFUSED, errno.ENOENT):
                    raise
        if handle is None:
            with contextlib.suppress(FileNotFoundError):
                handle = open(path, "rb")  # noqa: SIM115 - closed below
        if handle is None:
            try:
                if writing:
                    self.folder.mkdir(parents=True, exist_ok=True)
                handle = open(path, "a+b")  # noqa: SIM115 - closed below
            except OSError as err:
                if err.errno not in _REFUSED:
                    raise
                if writing:
                    raise self._unwritable(err, sha256) from err
        try:
            yield handle
        finally:
            if handle is not None:
                handle.close()

    def _unwritable(self, err: OSError, sha256: str) -> OSError:
        """The OSError for a download this user may not write into the cache folder (``err``)."""
        return OSError(err.errno, f"the shard cache folder {self.folder} cannot be written by this user "
                                  f"({err.strerror}: {err.filename}), so the shard {sha256[:16]}… it does not hold "
                                  "cannot be downloaded into it; make the folder writable (for a lab group: chmod "
                                  "g+rwx, with umask 002 for its members), or pass a cache_dir of your own")

    def _valid(self, path: Path, size: int) -> bool:
        """An entry is intact when it is there with the manifest's size and the modification time
        it had when its download was verified (recorded in its ``.ok`` stamp)."""
        try:
            stat = path.stat()
            stamp = (self.folder / f".{path.name}.ok").read_text()
        except OSError:
            return False
        return stat.st_size == size and stamp == str(stat.st_mtime_ns)

    def _download(self, url: str, sha256: str, size: int, path: Path, storage_options: Any) -> None:
        # one name per entry: the caller holds the entry's exclusive lock, so a .partial found here
        # was left by a killed download (its lock died with it) and is overwritten
        partial = self.folder / f".{path.name}.partial"
        try:  # said once, not retried: a folder this user may not write is no failing store
            partial.unlink(missing_ok=True)
            open(partial, "wb").close()
        except OSError as err:
            if err.errno not in _REFUSED:
                raise
            raise self._unwritable(err, sha256) from err
        last: BaseException | None = None
        fs: Any = None
        remote = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                fs, remote = storage.filesystem_for(url, storage_options)
                digest, got = hashlib.sha256(), 0
                # the manifest knows the size: s3fs need not ask the store for it (one request less)
                known = {"size": size} if "s3" in _protocols(fs) else {}
                with fs.open(remote, "rb", **known) as src, open(partial, "wb") as dst:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                        got += len(chunk)
                if got != size or digest.hexdigest() != sha256:
                    partial.unlink(missing_ok=True)
                    raise IntegrityError(f"{url}: the store holds {got} bytes with sha256 {digest.hexdigest()[:16]}…, "
                                         f"the manifest says {size} bytes, {sha256[:16]}…; restore the shard or "
                                         "republish the dataset")
                os.replace(partial, path)
                stamp = self.folder / f".{path.name}.ok"
                stamp.unlink(missing_ok=True)  # a new file: the old one may be another group member's
                stamp.write_text(str(path.stat().st_mtime_ns))
                return
            except FileNotFoundError as err:  # no such object: the store answered, retrying cannot help
                partial.unlink(missing_ok=True)
                if storage.missing_bucket(err):
                    raise storage.storage_error(url, err, doing="downloading a shard") from err
                raise FileNotFoundError(f"{url} not found") from err
            except storage.remote_errors() as err:
                last = err
                partial.unlink(missing_ok=True)
                stored = _stored_size(fs, remote) if fs is not None else None
                if stored is not None and stored != size:  # cut short or replaced: no retry mends it
                    raise IntegrityError(f"{url}: the store holds {stored} bytes, the manifest says {size} (truncated "
                                         "or replaced); restore the shard or republish the dataset") from err
        why = storage.describe_error(url, last) if last is not None else "no attempt made"
        raise OSError(f"{url}: download failed {self.retries + 1} times ({why}); "
                      "check the store and the network, or read the shards from a local copy") from last

    def evict(self, keep: Sequence[str] = ()) -> None:
        """Delete entries, least recently used first, until the cache holds at most ``limit``
        bytes; an entry a reader holds (shared lock) or named in ``keep`` stays."""
        self._bounded = True
        if self.limit is None:
            return
        entries, total = [], 0
        for path in self.folder.iterdir():
            if path.name.startswith("."):  # lock files, stamps, partial downloads
                continue
            with contextlib.suppress(OSError):
                stat = path.stat()
                total += stat.st_size
                if path.name.split(".", 1)[0] not in keep:
                    entries.append((stat.st_atime_ns, stat.st_size, path))
        for _, size, path in sorted(entries):
            if total <= self.limit:
                return
            sha256 = path.name.split(".", 1)[0]
            with self._open_lock(sha256, writing=False, exclusive=True) as lock:
                if lock is None:
                    self._cannot_evict(PermissionError(errno.EACCES, "Permission denied", str(self._lock_path(sha256))))
                    return
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a reader holds it
                try:
                    path.unlink(missing_ok=True)
                except PermissionError as err:  # the folder: nothing else in it can be removed either
                    self._cannot_evict(err)
                    return
                (self.folder / f".{path.name}.ok").unlink(missing_ok=True)
                total -= size

    def _cannot_evict(self, err: OSError) -> None:
        """Say once per process that the cache folder stays over its limit: this user may not remove
        entries from it (a folder made read-only once filled, or another user's)."""
        if not self._warned_evict:
            self._warned_evict = True
            warnings.warn(f"the shard cache {self.folder} holds more than its cache_limit ({self.limit} bytes), but "
                          f"this user cannot remove entries from it ({err.strerror}: {err.filename}); it stays over "
                          "the limit. Make the folder writable (for a lab group: chmod g+rwx), or raise cache_limit",
                          stacklevel=2)


def entry_problem(sha256: object, file: object) -> str | None:
    """Why a manifest's shard entry (its ``sha256`` and ``file``) cannot name a cache entry, or
    None. The cache's paths (``<sha256><suffix>``, ``.<sha256>.lock``) are built from these
    values, so one that is not 64 lowercase hex digits (``/../../x``) or a file name whose suffix
    is not a plain extension would put files outside the cache folder. The manifest's schema says
    the same, but a manifest re-sealed by its sender is read without its schema: this check holds
    on its own."""
    if not isinstance(file, str):
        return f"manifest shard entry {file!r}: its file name is not a string; the manifest was edited or damaged"
    if not isinstance(sha256, str) or _SHA256.fullmatch(sha256) is None:
        shown = repr(sha256) if len(repr(sha256)) <= 80 else f"{repr(sha256)[:77]}..."
        return (f"manifest shard {file!r}: sha256 {shown} is not 64 lowercase hex digits (the manifest was edited "
                "or damaged after the build: get the dataset again from its source)")
    if _SUFFIX.fullmatch(Path(file).suffix) is None:
        return (f"manifest shard {file!r}: its suffix {Path(file).suffix!r} is not a plain extension such as .tar "
                "(the manifest was edited or damaged after the build: get the dataset again from its source)")
    return None


def _stored_size(fs: Any, remote: str) -> int | None:
    """The object's size as the store lists it, or None where it cannot say (the download's
    error then stands): asked only after a failed download, whose cause may be a short object
    (a ranged read past its end: 'requested range not satisfiable')."""
    try:
        return int(fs.size(remote))
    except (ValueError, TypeError):
        return None
    except storage.remote_errors():
        return None


def _touch(path: Path) -> None:
    """Mark the entry ``path`` recently used: its access time is set to now, its modification
    time (the entry's verified stamp) kept. Setting a chosen time needs ownership of the file, so
    in a cache a lab group shares (umask 002) only the member who downloaded an entry can: for the
    others it stays as it was, and least-recently-used eviction then goes by what the file system
    itself records of their reads (its atime policy, often ``relatime``). Best effort: the order
    of eviction, never whether an entry is read or intact, depends on it."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except PermissionError:  # EPERM/EACCES: another user's entry; the read goes on
        return


#: How often :meth:`ShardCache.reading` fetches a shard that another fetch's eviction took away
#: before the reader could hold it, before it says the cache is too small
_REFETCHES = 8


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def cache_from(cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None,
               read_ahead: int) -> ShardCache | None:
    """The cache a dataset reads remote shards through: ``cache_dir`` or ``$PACKER_SHARD_CACHE``
    (None: no cache), ``cache_limit`` or ``$PACKER_SHARD_CACHE_LIMIT`` (bytes, or "50GB")."""
    folder = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or None
    if folder is None:
        return None
    # an error names the setting the value came from: the argument, else the environment variable
    limit: int | str | None = cache_limit
    where = "cache_limit"
    if limit is None:
        limit, where = os.environ.get(LIMIT_ENV) or None, f"environment variable {LIMIT_ENV}"
    if isinstance(limit, str):
        limit = parse_byte_size(limit, where=where)
    if limit is not None and limit <= 0:
        raise ConfigError(f"{where} must be a positive size, got {limit}; write e.g. 50GB, or leave it unset for "
                          "no limit")
    return ShardCache(Path(folder), limit=limit, read_ahead=read_ahead)
