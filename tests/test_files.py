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
