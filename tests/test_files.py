"""atomic_output's durable files: every byte lands, in order, and the kernel is asked to start
writing back as the file grows, so the closing fsync waits only for the tail."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packer.files as files
from packer.files import WRITEBACK_BYTES, atomic_output, start_writeback


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * WRITEBACK_BYTES // 2), min_size=1, max_size=6),
       views=st.lists(st.booleans(), min_size=6, max_size=6))
def test_a_durable_file_holds_every_byte_written_in_order(tmp_path_factory: pytest.TempPathFactory,
                                                          sizes: list[int], views: list[bool]) -> None:
    target = tmp_path_factory.mktemp("durable") / "train-000000.tar"
    pieces = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    with atomic_output(target) as fh:
        for piece, as_view in zip(pieces, views, strict=False):
            assert fh.write(memoryview(piece) if as_view else piece) == len(piece)
    assert target.read_bytes() == b"".join(pieces)


def test_writeback_starts_every_writeback_bytes_and_never_for_a_file_written_without_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    monkeypatch.setattr(files, "start_writeback", lambda fd: started.append(os.fstat(fd).st_size) or True)
    with atomic_output(tmp_path / "shard.tar") as fh:
        for _ in range(5):
            fh.write(b"x" * (WRITEBACK_BYTES // 2))
    # after the 2nd and the 4th half: all of it handed to the kernel (flushed) before the hint
    assert started == [WRITEBACK_BYTES, 2 * WRITEBACK_BYTES]
    started.clear()
    with atomic_output(tmp_path / "spill.bin", durable=False) as fh:
        fh.write(b"x" * 3 * WRITEBACK_BYTES)
    assert started == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_writeback_hint_reaches_the_kernel_on_linux(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert start_writeback(fd) is True
    finally:
        os.close(fd)
    read_end, write_end = os.pipe()
    try:
        assert start_writeback(read_end) is False  # the kernel refuses a pipe (ESPIPE): only a hint, no error
    finally:
        os.close(read_end)
        os.close(write_end)


def test_clone_file_links_read_only_and_replaces_the_target_without_writing_through_it(tmp_path: Path) -> None:
    source = tmp_path / "old" / "train-000000.tar"
    source.parent.mkdir()
    source.write_bytes(b"shard bytes" * 100)
    target = tmp_path / "new" / "train-000000.tar"
    target.parent.mkdir()
    target.write_bytes(b"an earlier attempt")  # what a killed attempt may have left
    how = files.clone_file(source, target)
    assert how in ("reflink", "hardlink")  # one file system: never a copy
    assert target.read_bytes() == source.read_bytes()
    assert os.stat(target).st_mode & 0o777 == 0o444
    if how == "hardlink":  # one inode: the earlier version's file is read-only now too
        assert os.stat(source).st_ino == os.stat(target).st_ino and os.stat(source).st_mode & 0o777 == 0o444
    assert not list(target.parent.glob("*.partial"))


def test_clone_file_copies_where_a_link_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    source.write_bytes(b"x" * 5000)

    def refuse(*_: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(files.os, "link", refuse)
    monkeypatch.setattr(files, "_reflink", lambda *_: False)
    assert files.clone_file(source, target) == "copy"
    assert target.read_bytes() == source.read_bytes() and os.stat(target).st_ino != os.stat(source).st_ino
    assert os.stat(target).st_mode & 0o777 == 0o444


def test_atomic_output_never_writes_through_a_leftover_temporary_linked_to_another_file(tmp_path: Path) -> None:
    published = tmp_path / "v1" / "train-000000.tar"
    published.parent.mkdir()
    published.write_bytes(b"version one's shard")
    staging = tmp_path / "staging" / "train-000000.tar"
    staging.parent.mkdir()
    os.link(published, staging.with_name(staging.name + files.TMP_SUFFIX))  # a link a kill left half-made
    with atomic_output(staging) as fh:
        fh.write(b"a new shard")
    assert staging.read_bytes() == b"a new shard"
    assert published.read_bytes() == b"version one's shard"


def test_two_writers_of_one_shared_file_each_publish_a_whole_file(tmp_path: Path) -> None:
    """Two `packer report` runs (or a report beside a build) write report.html at once. With one
    fixed temporary name, the second writer unlinked and reopened the first's temporary, the
    first's rename published the second's half-written file, and the second's rename failed
    (FileNotFoundError: an internal error, exit 1). Shared files get a temporary per writer."""
    target = tmp_path / "report.html"
    first, second = atomic_output(target, shared=True), atomic_output(target, shared=True)
    a = first.__enter__()
    b = second.__enter__()
    a.write(b"A" * 1000)
    b.write(b"B" * 10)
    first.__exit__(None, None, None)
    assert target.read_bytes() == b"A" * 1000  # the first writer's whole file, not the second's half
    b.write(b"B" * 990)
    second.__exit__(None, None, None)
    assert target.read_bytes() == b"B" * 1000
    assert list(tmp_path.iterdir()) == [target]

