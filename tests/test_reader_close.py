"""A shard reader closed mid-shard closes quietly, even at interpreter exit.

A loop that stops early leaves a reader suspended inside its ``try``; Python closes it later
(``GeneratorExit`` at the ``yield``), at the latest while the interpreter shuts down, when the
modules an ``except`` clause names may already be gone. Evaluating ``except (OSError,
pa.ArrowException)`` then printed ``Exception ignored in: <generator object read_parquet_samples>
... AttributeError: 'NoneType' object has no attribute 'ArrowException'`` at the exit of a script
that read one sample of a Parquet build. These tests close each reader with the module global
its ``except`` clause reads set to None, as at shutdown.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from loader_fixtures import build_dataset


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """What Python reports as "Exception ignored in ..." while the test runs."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append((report.exc_type, report.exc_value)))
    yield seen


def test_a_parquet_reader_closed_while_its_module_is_torn_down_raises_nothing(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.shards.parquet as parquet

    build_dataset(tmp_path, fmt="parquet", shard_sizes=(70,))
    reader = parquet.read_parquet_samples(tmp_path / "train-000000.parquet", range(70), batch_rows=16)
    assert next(reader)[0] == 0
    monkeypatch.setattr(parquet, "pa", None)  # as the interpreter's shutdown leaves the module
    reader.close()


def test_a_streamed_tar_reader_closed_while_its_module_is_torn_down_raises_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.shards.tar as tar

    build_dataset(tmp_path, shard_sizes=(6,))
    with open(tmp_path / "train-000000.tar", "rb") as fh:
        reader = tar.stream_tar_samples(fh, 5)
        first = next(reader)
        assert not isinstance(first, str) and first[0] == 0
        monkeypatch.setattr(tar, "tarfile", None)
        reader.close()


def test_a_remote_read_abandoned_after_one_sample_reports_nothing_when_collected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unraisable: list[Any]) -> None:
    import packer.loader.readers as readers
    from packer.loader import ShardDataset

    manifest = build_dataset(tmp_path / "ds", shard_sizes=(6,))
    memory = fsspec.filesystem("memory")
    for path in manifest.parent.iterdir():
        memory.pipe(f"/abandoned/v/{path.name}", path.read_bytes())
    try:
        items = iter(ShardDataset("memory://abandoned/v/manifest.json", "train", shuffle=False))
        assert next(items)["key"]
        monkeypatch.setattr(readers, "storage", None)
        del items
        gc.collect()
    finally:
        memory.rm("/abandoned", recursive=True)
    assert unraisable == []
