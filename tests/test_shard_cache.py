"""The local shard cache for remote datasets: one download per shard per machine, verified, bounded.

Remote here is fsspec's in-memory store (``memory://``), reached through the same
``packer.storage.filesystem_for`` as s3://; every open of a remote shard is counted.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from packer import storage
from packer.errors import ConfigError, IntegrityError
from packer.loader import ShardDataset, ShardReadError
from packer.loader.cache import LIMIT_ENV, ShardCache, cache_from
from tests.test_targets import _build, _ct, _job


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Remote opens by path: every ``filesystem_for(url)`` whose file is then opened."""
    counted: Counter[str] = Counter()
    real = storage.filesystem_for

    def counting(url: str, options: Any = None) -> Any:
        fs, path = real(url, options)
        original = fs.open

        class Counted:
            def __getattr__(self, name: str) -> Any:
                return getattr(fs, name)

            def open(self, p: str, *args: Any, **kwargs: Any) -> Any:
                counted[p] += 1
                return original(p, *args, **kwargs)

        return Counted(), path

    monkeypatch.setattr(storage, "filesystem_for", counting)
    return counted


def _object(name: str, data: bytes) -> tuple[str, str, int]:
    url = f"memory://shards/{name}"
    fsspec.filesystem("memory").pipe(f"/shards/{name}", data)
    return url, hashlib.sha256(data).hexdigest(), len(data)


def test_a_shard_is_downloaded_once_and_then_read_from_disk(tmp_path: Path, opens: Counter[str]) -> None:
    url, sha, size = _object("a.tar", b"x" * 5000)
    cache = ShardCache(tmp_path / "cache")
    first = cache.fetch(url, sha, size, "a.tar")
    again = cache.fetch(url, sha, size, "a.tar")
    assert first == again == tmp_path / "cache" / f"{sha}.tar" and first.read_bytes() == b"x" * 5000
    assert opens["/shards/a.tar"] == 1
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_an_entry_altered_on_disk_is_fetched_again(tmp_path: Path, opens: Counter[str]) -> None:
    url, sha, size = _object("b.tar", b"y" * 4000)
    cache = ShardCache(tmp_path / "cache")
    path = cache.fetch(url, sha, size, "b.tar")
    path.write_bytes(b"y" * 3999 + b"z")  # same size, new bytes: its modification time tells
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert cache.fetch(url, sha, size, "b.tar").read_bytes() == b"y" * 4000
    assert opens["/shards/b.tar"] == 2


def test_an_entry_evicted_by_another_fetch_before_the_reader_holds_it_is_fetched_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread's (a read-ahead's) or process's fetch evicts what no reader holds: between a
    refetch and the reader's shared lock it took the entry again, and the reader's stat of the
    vanished file was reported as the object missing from the store, mid-epoch."""
    url, sha, size = _object("race.tar", b"r" * 3000)
    cache = ShardCache(tmp_path / "cache")
    real = ShardCache.fetch
    calls = 0

    def fetch_then_evicted(self: ShardCache, *args: Any, **kwargs: Any) -> Path:
        nonlocal calls
        calls += 1
        path = real(self, *args, **kwargs)
        if calls <= 2:  # the entry vanishes before the reader locks it, twice
            path.unlink()
        return path

    monkeypatch.setattr(ShardCache, "fetch", fetch_then_evicted)
    with cache.reading(url, sha, size, "race.tar") as path:
        assert path.read_bytes() == b"r" * 3000
    assert calls == 3
    calls = -100  # evicted every time: a cache too small for what is read at once says so
    with pytest.raises(OSError, match="lost the shard to eviction 8 times .* raise cache_limit"):
        with cache.reading(url, sha, size, "race.tar"):
            pass


def test_an_object_shorter_than_the_manifest_says_is_refused_at_once_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3fs is told the manifest's size (one request less), so a truncated object fails as a
    ranged read past its end ('requested range not satisfiable'): that was retried five times
    (15 s) and blamed on the network. The store's listed size tells it at once."""
    url, sha, size = _object("short.tar", b"s" * 4000)
    real = storage.filesystem_for
    opened = 0

    class RangePastTheEnd:
        def __init__(self, fs: Any) -> None:
            self.fs = fs

        def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
            nonlocal opened
            opened += 1
            raise OSError(22, "The requested range is not satisfiable")

        def size(self, path: str) -> int:
            return 2500

    monkeypatch.setattr(storage, "filesystem_for", lambda u, o=None: (RangePastTheEnd(real(u, o)[0]), real(u, o)[1]))
    cache = ShardCache(tmp_path / "cache", retries=4, backoff=5.0)  # a retry would take seconds
    with pytest.raises(IntegrityError, match=r"short.tar: the store holds 2500 bytes, the manifest says 4000 "
                                             r"\(truncated or replaced\)"):
        cache.fetch(url, sha, size, "short.tar")
    assert opened == 1


def test_a_store_that_holds_other_bytes_is_refused_and_nothing_is_cached(tmp_path: Path) -> None:
    url, sha, size = _object("c.tar", b"right bytes")
    fsspec.filesystem("memory").pipe("/shards/c.tar", b"wrong bytes")
    cache = ShardCache(tmp_path / "cache", retries=0)
    with pytest.raises(IntegrityError, match="the manifest says 11 bytes"):
        cache.fetch(url, sha, size, "c.tar")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]


def test_a_failing_store_is_retried_then_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, sha, size = _object("d.tar", b"d" * 100)
    real = storage.filesystem_for
    failures = iter([True, True, False])

    def flaky(u: str, options: Any = None) -> Any:
        if next(failures, False):
            raise ConnectionError("connection reset by peer")
        return real(u, options)

    monkeypatch.setattr(storage, "filesystem_for", flaky)
    cache = ShardCache(tmp_path / "cache", retries=2, backoff=0.0)
    assert cache.fetch(url, sha, size, "d.tar").read_bytes() == b"d" * 100
    monkeypatch.setattr(storage, "filesystem_for", lambda u, o=None: (_ for _ in ()).throw(ConnectionError("down")))
    with pytest.raises(OSError, match="memory://shards/e.tar: download failed 3 times"):
        ShardCache(tmp_path / "other", retries=2, backoff=0.0).fetch("memory://shards/e.tar", "0" * 64, 1, "e.tar")


def test_the_cache_stays_under_its_limit_and_keeps_an_entry_being_read(tmp_path: Path) -> None:
    shards = [_object(f"{n}.tar", bytes([n]) * 1000) for n in range(4)]
    cache = ShardCache(tmp_path / "cache", limit=2500)
    with cache.reading(*shards[0], "0.tar"):  # held while the others arrive: never evicted
        for n in (1, 2, 3):
            cache.fetch(*shards[n], f"{n}.tar")
    kept = {p.name.split(".")[0] for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")}
    assert shards[0][1] in kept and shards[3][1] in kept and len(kept) == 2
    assert sum(p.stat().st_size for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")) <= 2500


def test_a_cache_filled_by_an_earlier_run_is_brought_under_a_new_limit_at_its_first_read(tmp_path: Path) -> None:
    """Every read of a folder an earlier run filled (no limit) is a hit, so no download evicts:
    the limit is applied at the first read, sparing the shard read and the one another reader holds."""
    shards = [_object(f"{n}.tar", bytes([n]) * 1000) for n in range(4)]
    earlier = ShardCache(tmp_path / "cache")
    for n in range(4):
        earlier.fetch(*shards[n], f"{n}.tar")
    limited = ShardCache(tmp_path / "cache", limit=1500)
    with earlier.reading(*shards[0], "0.tar"), limited.reading(*shards[2], "2.tar") as path:
        assert path.read_bytes() == bytes([2]) * 1000
        kept = {p.name.split(".")[0] for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")}
        assert kept == {shards[0][1], shards[2][1]}  # held by a reader, being read: over the limit, and kept


def test_a_bad_cache_limit_is_named_by_the_setting_it_came_from(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """No cache_limit argument: the value is the environment's, and the error names that variable."""
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match="^environment variable PACKER_SHARD_CACHE_LIMIT: cannot read 'lots'"):
        cache_from(tmp_path / "c", None, read_ahead=2)
    with pytest.raises(ConfigError, match="^cache_limit: cannot read 'heaps' as a size"):
        cache_from(tmp_path / "c", "heaps", read_ahead=2)
    cache = cache_from(tmp_path / "c", "1GB", read_ahead=2)  # the argument wins: the environment is not read
    assert cache is not None and cache.limit == 10**9
    monkeypatch.setenv(LIMIT_ENV, "0")
    with pytest.raises(ConfigError, match="^environment variable PACKER_SHARD_CACHE_LIMIT: .0. is less than one byte"):
        cache_from(tmp_path / "c", None, read_ahead=2)


def _fetch_in_child(args: tuple[str, str, str, int]) -> bool:
    folder, url, sha, size = args
    path = Path(folder) / f"{sha}.tar"
    before = path.exists()
    ShardCache(Path(folder)).fetch(url, sha, size, "f.tar")
    return not before


def test_concurrent_processes_download_a_shard_once(tmp_path: Path) -> None:
    """Readers on one machine share the folder: one downloads, the others wait and use its entry."""
    source = tmp_path / "remote" / "f.tar"
    source.parent.mkdir()
    source.write_bytes(os.urandom(3 << 20))
    url = f"file://{source}"
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    folder = tmp_path / "cache"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        fetched = pool.map(_fetch_in_child, [(str(folder), url, sha, source.stat().st_size)] * 8)
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and entries[0].read_bytes() == source.read_bytes()
    stamp = (folder / f".{entries[0].name}.ok").read_text()
    assert stamp == str(entries[0].stat().st_mtime_ns)  # written once, by the one download
    assert sum(fetched) >= 1


def test_a_remote_dataset_reads_through_the_cache_and_epoch_two_makes_no_request(tmp_path: Path,
                                                                                 opens: Counter[str]) -> None:
    built = _ct_version(tmp_path, patients=6, max_samples=2)
    _publish(built.version_dir, "/remote/v")
    local = {item["key"]: item["image"] for item in ShardDataset(built.manifest_path, "train", shuffle=False)}
    remote = ShardDataset("memory://remote/v/manifest.json", "train", shuffle=False, cache_dir=tmp_path / "c",
                          cache_limit="1GB")
    first = {item["key"]: item["image"] for item in remote}
    shard_opens = {p: n for p, n in opens.items() if p.endswith(".tar")}
    assert len(shard_opens) == 3 and set(shard_opens.values()) == {1}   # each shard downloaded once
    second = {item["key"]: item["image"] for item in remote}
    assert {p: n for p, n in opens.items() if p.endswith(".tar")} == shard_opens  # epoch 2: no request
    assert first.keys() == second.keys() == local.keys()
    assert all(bool((first[k] == local[k]).all()) for k in local)


def test_a_sample_damaged_in_the_cache_is_named_there_and_the_copy_is_fetched_again(tmp_path: Path,
                                                                                   opens: Counter[str]) -> None:
    """A byte flipped in a cache entry after its download was verified (bit rot on the local
    disk; size and modification time unchanged) was caught, but the message said to restore the
    entry from a good copy or rebuild the dataset, and the same damaged entry was served on every
    later read (a rebuild gives the same sha256, the entry's name). The message now names the
    cache's copy and the store's URL, and the copy is dropped: the next read fetches the shard
    again and delivers every sample intact."""
    import tarfile

    built = _ct_version(tmp_path, patients=4, max_samples=8)
    _publish(built.version_dir, "/remote/d")
    local = {item["key"]: item["image"] for item in ShardDataset(built.manifest_path, "train", shuffle=False)}
    remote = ShardDataset("memory://remote/d/manifest.json", "train", shuffle=False, cache_dir=tmp_path / "c")
    assert len(list(remote)) == len(local)
    (entry,) = [p for p in (tmp_path / "c").iterdir() if p.suffix == ".tar"]
    with tarfile.open(entry) as tar:
        npy = next(m for m in tar.getmembers() if m.name.endswith(".npy"))
    stat = entry.stat()
    data = bytearray(entry.read_bytes())
    data[npy.offset_data + npy.size - 1] ^= 0x01
    entry.chmod(0o644)
    entry.write_bytes(bytes(data))
    os.utime(entry, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the stamp still vouches for it
    with pytest.raises(ShardReadError, match=r"in the shard cache's copy .*\.tar of memory://remote/d/train-000000"
                                             r"\.tar .*the copy is dropped from the cache"):
        list(remote)
    before = sum(n for p, n in opens.items() if p.endswith(".tar"))
    again = {item["key"]: item["image"] for item in remote}
    assert sum(n for p, n in opens.items() if p.endswith(".tar")) == before + 1  # fetched again, once
    assert again.keys() == local.keys() and all(bool((again[k] == local[k]).all()) for k in local)


_TRICKLE_CHILD = """
import sys, time
from pathlib import Path
import fsspec
from fsspec.implementations.local import LocalFileSystem
from packer.loader.cache import LIMIT_ENV, ShardCache, cache_from

class Trickle(LocalFileSystem):  # a slow store: 256 KiB per read, 0.2 s apart
    protocol = "trickle"

    def _open(self, path, mode="rb", **kwargs):
        real = open(self._strip_protocol(path), mode)

        class Slow:
            def read(self, n=-1):
                time.sleep(0.2)
                return real.read(min(n, 256 << 10) if n and n > 0 else 256 << 10)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                real.close()

        return Slow()

fsspec.register_implementation("trickle", Trickle, clobber=True)
folder, url, sha, size = sys.argv[1:5]
ShardCache(Path(folder), retries=0).fetch(url, sha, int(size), url)
"""


def test_a_download_killed_midway_leaves_no_entry_and_the_next_one_completes(tmp_path: Path) -> None:
    """kill -9 while a shard is half downloaded: no entry, no stamp; the lock dies with the process,
    and the next download (another process) overwrites the leftover .partial and lands the entry."""
    import signal
    import subprocess
    import sys
    import time

    data = os.urandom(3 << 20)
    sha, folder = hashlib.sha256(data).hexdigest(), tmp_path / "cache"
    source = tmp_path / "remote" / "train-000000.tar"
    source.parent.mkdir()
    source.write_bytes(data)
    child = subprocess.Popen([sys.executable, "-c", _TRICKLE_CHILD, str(folder), f"trickle://{source}", sha,
                              str(len(data))])
    partial = folder / f".{sha}.tar.partial"
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size >= 512 << 10) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert partial.exists(), "the child never started writing its download"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    entry = folder / f"{sha}.tar"
    assert not entry.exists() and not (folder / f".{entry.name}.ok").exists()
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == []

    assert 0 < partial.stat().st_size < len(data)          # the half-written download, invisible as an entry
    cache = ShardCache(folder)
    with cache.reading(f"file://{source}", sha, len(data), source.name) as path:
        assert path == entry and path.read_bytes() == data
    assert not partial.exists()


def test_a_fetch_never_blocks_on_a_reader_holding_the_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that found an entry not yet valid (another's download was finishing) must not wait
    on the entry's lock: a reader may hold it, shared, across a pause in its own iteration while
    its DataLoader waits for this worker's batch (the deadlock the remote benchmark hit)."""
    import threading

    url, sha, size = _object("held.tar", os.urandom(1 << 16))
    cache = ShardCache(tmp_path / "cache")
    real_valid = ShardCache._valid
    first = {"left": 1}

    def valid_after_first(self: ShardCache, path: Path, want: int) -> bool:
        if first["left"] and threading.current_thread().name == "late":
            first["left"] -= 1
            return False  # the race: the entry was checked just before its download was stamped
        return real_valid(self, path, want)

    with cache.reading(url, sha, size, "held.tar") as held:     # a reader holds the entry (shared lock)
        monkeypatch.setattr(ShardCache, "_valid", valid_after_first)
        got: list[Path] = []
        late = threading.Thread(target=lambda: got.append(cache.fetch(url, sha, size, "held.tar")), name="late")
        late.start()
        late.join(timeout=10)
        assert not late.is_alive(), "fetch waited on a lock a reader holds"
        assert got == [held]


def test_a_damaged_remote_shard_refused_by_the_cache_is_named_as_a_whole_shard(tmp_path: Path) -> None:
    """The store holds other bytes at the manifest's size: the cache refuses the download, and
    the loader said "the sample at position 26: unreadable: through the shard cache ...", as if
    one sample were lost; the whole shard is, and the message says so."""
    built = _ct_version(tmp_path, patients=4, max_samples=8)

    def damaged(path: Path, data: bytes) -> bytes:  # the train shard: same size, other bytes
        return data[:600] + bytes([data[600] ^ 0xFF]) + data[601:] if path.name.startswith("train") else data

    memory = _publish(built.version_dir, "/damaged/v", edit=damaged)
    try:
        remote = ShardDataset("memory://damaged/v/manifest.json", "train", shuffle=False, cache_dir=tmp_path / "c")
        with pytest.raises(ShardReadError) as raised:
            list(remote)
    finally:
        memory.rm("/damaged", recursive=True)
    message = str(raised.value)
    assert "train-000000.tar: bad_shard: refused by the shard cache" in message, message
    assert "none of its samples is read" in message and "the sample at position" not in message


def _ct_version(tmp_path: Path, *, patients: int, max_samples: int) -> Any:
    """A built version of one CT slice per patient, unlabelled, tar shards of ``max_samples``."""
    raw = tmp_path / "raw"
    for i in range(patients):
        _ct(raw, f"p{i}/slice.dcm", f"P{i}", i)
    return _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                       pack={"format": "webdataset", "max_samples": max_samples}))


def _publish(version: Path, prefix: str, edit: Callable[[Path, bytes], bytes] | None = None) -> Any:
    """Every file of ``version`` copied into fsspec's memory store under ``prefix`` (``edit``
    may change a file's bytes on the way); the store."""
    memory = fsspec.filesystem("memory")
    for path in version.iterdir():
        data = path.read_bytes()
        memory.pipe(f"{prefix}/{path.name}", edit(path, data) if edit is not None else data)
    return memory
