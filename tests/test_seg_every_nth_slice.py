"""A DICOM SEG whose frames lie on every other slice of its series: the file cannot say whether
the slices between were skipped by an annotator or lie inside 4 mm slabs (highdicom writes the
source's SliceThickness and the frames' gap as SpacingBetweenSlices either way), so under
``grid: require`` it stays ``mask_geometry``, and the message now names both readings and what
each option paints, instead of advising ``grid: resample`` alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest

from packer.read.annotations import AnnotationError
from tests.test_seg import Grid, ct_series, paint, places, write_seg

GRID = Grid(rows=12, columns=18, spacing=(1.0, 1.2), n=7, step=2.0, origin=(-10.0, -8.0, 0.0))


def _box(rows: slice, columns: slice) -> np.ndarray:
    out = np.zeros((GRID.rows, GRID.columns), dtype=bool)
    out[rows, columns] = True
    return out


def _seg_on(path: Path, every: int) -> tuple[Path, list]:
    sources = ct_series(GRID, seed=21)
    by_slice = {int(round((float(ds.ImagePositionPatient[2]) - GRID.origin[2]) / GRID.step)): ds for ds in sources}
    drawn = list(range(1, GRID.n, every))
    pixels = np.stack([_box(slice(2, 2 + k), slice(3, 9)) for k in drawn])[..., None]
    return write_seg(path, [by_slice[k] for k in drawn], pixels, ["Cube_A"]), sources


@pytest.mark.parametrize(("every", "words"), [(2, "every other slice"), (3, "every third slice")])
def test_a_seg_on_every_nth_slice_is_refused_naming_both_readings(tmp_path: Path, every: int, words: str) -> None:
    path, sources = _seg_on(tmp_path / "seg.dcm", every)
    measures = pydicom.dcmread(path).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    assert float(measures.SpacingBetweenSlices) == every * GRID.step  # the premise: highdicom writes the gap
    with pytest.raises(AnnotationError) as raised:
        paint(path, places(sources), grid="require")
    message = str(raised.value)
    assert raised.value.reason == "mask_geometry"
    for part in (words, f"{every} times the series' slice step", "never annotated", "slabs",
                 "mask.grid: resample", "a frame for every slice"):
        assert part in message, (part, message)


def test_a_seg_on_another_in_plane_grid_keeps_the_plain_grid_message(tmp_path: Path) -> None:
    """Only a SEG on the series' own in-plane grid, off only by its spacing, gets the every-n-th
    reading: one whose pixel spacing differs is another grid, as before."""
    path, sources = _seg_on(tmp_path / "seg.dcm", 2)
    ds = pydicom.dcmread(path)
    ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing = [0.5, 0.6]
    ds.save_as(path)
    with pytest.raises(AnnotationError) as raised:
        paint(path, places(sources), grid="require")
    assert raised.value.reason == "mask_geometry"
    assert "lies on another grid" in str(raised.value) and "every other" not in str(raised.value)
