"""A DICOM series refused from its headers is decoded by no build, and no build says it was.

Under ``sample: {neighbors: k}`` (or ``volume``) files are assembled into series from their
headers before any pixel is decoded; a series with a gap, repeated positions and the like is
refused there (``series_gap``, ...), so its pixels are never read. Every build reads every
file's header for that assembly, so such a series costs an unchanged rebuild nothing more
than a packable one whose samples the build cache holds. The builds said otherwise: the
refused series' files were counted as decoded on every build of an unchanged tree
("decoded 4 of 19 files" forever), against README's promise that an unchanged file is never
decoded again. They are now counted as what they are: files no build decoded (like a table
row without a file), neither decoded nor taken from the build cache.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.test_series import _series_job, _write_series

SLICES = 5


def _build(job: Path, cache: Path) -> BuildResult:
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False, cache_dir=cache))


def _tree(raw: Path) -> list[list[Path]]:
    """Three CT series of SLICES slices each (paths in position order), one patient each."""
    return [_write_series(raw / f"p{n}", slices=SLICES, seed=10 + n, patient=f"P{n}") for n in range(3)]


def _bad_reasons(result: BuildResult) -> list[tuple[str, str]]:
    return sorted((issue.path, issue.reason) for issue in result.issues)


def test_a_series_refused_as_series_gap_is_not_decoded_again_by_an_unchanged_rebuild(tmp_path: Path) -> None:
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    series = _tree(raw)
    job = _series_job(tmp_path, raw)
    first = _build(job, cache)
    assert first.files_decoded == 3 * SLICES and not first.issues
    gone = series[1][SLICES // 2]
    kept = gone.read_bytes()
    gone.unlink()  # a middle slice removed: the other 4 files of its series are a series_gap

    second = _build(job, cache)
    refused = sorted(str(p) for p in series[1] if p != gone)
    assert _bad_reasons(second) == [(path, "series_gap") for path in refused]
    # the refused files' pixels were never read; the two packable series came from the cache
    assert (second.files_decoded, second.files_cached, second.files_total) == (0, 2 * SLICES, 3 * SLICES - 1)
    bad = (second.version_dir / "bad_samples.jsonl").read_text()

    third = _build(job, cache)  # nothing changed since the second build
    assert (third.files_decoded, third.files_cached) == (0, 2 * SLICES)
    assert third.manifest["dataset_hash"] == second.manifest["dataset_hash"]
    assert (third.version_dir / "bad_samples.jsonl").read_text() == bad

    gone.write_bytes(kept)  # the slice back, as a new file: its series packs, decoded whole
    restored = _build(job, cache)
    assert not restored.issues
    assert (restored.files_decoded, restored.files_cached) == (SLICES, 2 * SLICES)
    fresh = _build(job, tmp_path / "fresh-cache")
    assert fresh.files_decoded == 3 * SLICES
    assert restored.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]


def test_a_fresh_build_counts_a_refused_series_as_never_decoded(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    series = _tree(raw)
    series[0][SLICES // 2].unlink()
    result = _build(_series_job(tmp_path, raw), tmp_path / "cache")
    assert {issue.reason for issue in result.issues} == {"series_gap"} and len(result.issues) == SLICES - 1
    assert (result.files_decoded, result.files_cached, result.files_total) == (2 * SLICES, 0, 3 * SLICES - 1)


def test_the_series_progress_line_counts_the_files_of_series_refused_whole(tmp_path: Path,
                                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """The `series:` line's bad count held only files refused by their own header; the series
    refused whole from their headers (here a series_gap) came after the line had closed, so
    the lines' bad counts did not add up to the summary's."""
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    series = _tree(raw)
    series[1][SLICES // 2].unlink()  # its series' other 4 files are a series_gap
    result = build(load_job(_series_job(tmp_path, raw)),
                   BuildOptions(scheduler="sync", quiet=False, html_report=False, cache_dir=cache))
    assert len(result.issues) == SLICES - 1
    line = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip().startswith("series:")][-1]
    assert re.search(rf"\bbad {SLICES - 1}\b", line), line
