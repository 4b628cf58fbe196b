"""Damaged or unusual SEG and RTSTRUCT files, read as the README says they are: a SEG on a
multi-frame CT whose Source Image references omit Referenced Frame Number (PS3.3 Table 10-3: the
reference applies to every frame), annotations cut short inside the UIDs that link them, a SEG
cut where its Pixel Data should start, and the contour numbers an RTSTRUCT's notes print."""

from __future__ import annotations

from pathlib import Path

import pytest

from packer.read.annotations import Painter
from packer.read.rtstruct import paint_rtstruct
from tests.test_rtstruct import MAP, closed, rtstruct, save, series
from tests.test_seg import Grid, ct_series, in_source_order, paint, places, truth, write_seg

SQUARE = [(4.0, 4.0), (4.0, 20.0), (20.0, 20.0), (20.0, 4.0)]


def test_an_rtstruct_note_numbers_its_contours_from_one_as_its_refusals_do(tmp_path: Path) -> None:
    """The 2nd ContourSequence item says 9 points and holds 4: its note names it contour 2, as the
    reader's refusals name it ("ContourSequence item 2"), never 1 (the first item, which is fine)."""
    slices = series()
    contours = [closed(slices[k], SQUARE) for k in (3, 4, 5)]
    ds = rtstruct([("Heart", contours)])
    ds.ROIContourSequence[0].ContourSequence[1].NumberOfContourPoints = 9
    path = save(ds, tmp_path / "rs.dcm")
    painter = Painter(shape=(len(slices), slices[0].rows, slices[0].columns), structures=MAP, path=path)
    drawn = paint_rtstruct(path, slices, MAP, painter)
    assert drawn.notes == ("ROI 'Heart': 1 contours whose NumberOfContourPoints disagrees with ContourData "
                           "(ContourData used): contours 2",)
    assert all(painter.labels[k].any() for k in (3, 4, 5))


@pytest.mark.parametrize("offset", [-20, -3, 0, 5])
def test_a_seg_cut_where_its_pixel_data_starts_is_annotation_frames_cut_short(tmp_path: Path, offset: int) -> None:
    """A copy that stopped right before (7FE0,0010), its header and per-frame items whole, is cut
    short as a cut a few bytes either side of it is (the README files a truncated SEG under
    annotation_frames); it was ``unreadable``, "the SEG has no Pixel Data; re-export it"."""
    from packer.read.annotations import AnnotationError

    grid = Grid(n=6, rows=16, columns=16)
    sources = ct_series(grid, seed=2)
    planted = truth(grid)
    whole = write_seg(tmp_path / "whole.dcm", sources, in_source_order(sources, grid, planted),
                      ["Ball Thing", "Cube_A"])
    raw = whole.read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(raw[:raw.rindex(b"\xe0\x7f\x10\x00") + offset])
    with pytest.raises(AnnotationError) as caught:
        paint(cut, places(sources))
    assert caught.value.reason == "annotation_frames"
    assert str(cut) in caught.value.message and "cut short" in caught.value.message


def test_a_seg_on_a_multiframe_ct_without_referenced_frame_numbers_is_placed_by_position(tmp_path: Path) -> None:
    """PS3.3 Table 10-3: Referenced Frame Number (0008,1160) is Type 1C, absent where the reference
    applies to all frames of a multi-frame instance. A SEG on a Legacy Converted Enhanced CT whose
    Source Image references name the CT but no frame is placed by each frame's position; it was
    read as frame 1 of the CT, and every other frame refused for contradicting it."""
    import highdicom as hd
    import numpy as np
    import pydicom
    from pydicom.uid import generate_uid

    from tests.test_seg import expected_labels

    grid = Grid(n=8)
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=ct_series(grid, seed=5), series_instance_uid=generate_uid(), series_number=2,
        sop_instance_uid=generate_uid(), instance_number=1)
    planted = truth(grid)
    depth = [float(np.dot(np.asarray(item.PlanePositionSequence[0].ImagePositionPatient) - grid.origin, grid.normal))
             for item in enhanced.PerFrameFunctionalGroupsSequence]
    path = write_seg(tmp_path / "mf.dcm", [enhanced], planted[[int(round(d / grid.step)) for d in depth]],
                     ["Ball Thing", "Cube_A"])
    ds = pydicom.dcmread(path)
    for item in ds.PerFrameFunctionalGroupsSequence:
        for source in item.DerivationImageSequence[0].SourceImageSequence:
            del source.ReferencedFrameNumber
    ds.save_as(path)
    labels, drawn = paint(path, places([enhanced]))
    np.testing.assert_array_equal(labels, expected_labels(planted))
    assert drawn.notes == ()


RT_CUTS = {  # where an RTSTRUCT copy stops: inside the value of the UID that ties it to its series
    "its Study Instance UID": ("study", 1),
    "its Referenced Frame of Reference's UID": ("frame", 0.5),
    "its referenced series' UID": ("series", 0.5),
}


@pytest.mark.parametrize("where", list(RT_CUTS))
def test_an_rtstruct_cut_inside_a_uid_that_links_it_holds_its_series_back(tmp_path: Path, where: str) -> None:
    """pydicom keeps the partial value of the element a file ends in: an RTSTRUCT cut inside its
    Study Instance UID named study "1", one cut inside its Referenced Frame of Reference UID
    another frame of reference, one cut inside its referenced Series Instance UID a series no
    source holds, and its series, tied to nothing, packed with all-zero masks under empty: keep.
    The cut is read as one (README: empty means no annotation was made, not one that could not be
    read): the RTSTRUCT is unreadable, saying it is cut short, its series mask_missing; the other
    patient's series still packs empty."""
    from packer.badsamples import read_bad_samples
    from tests.test_dicom_masks import (
        BODY,
        RTSTRUCT_ROIS,
        SLICES,
        _build,
        _items,
        _mask_job,
        _write_series,
        write_rtstruct,
    )

    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    _write_series(raw / "B" / "CT", "PB", seed=2)
    rt = write_rtstruct(raw / "A" / "RT" / "rt.dcm", a, {"External": BODY})
    data = rt.read_bytes()
    which, into = RT_CUTS[where]
    uid = {"study": a[0].StudyInstanceUID, "frame": a[0].FrameOfReferenceUID, "series": a[0].SeriesInstanceUID}[which]
    start = data.index(b"\x06\x30\x10\x00") if which == "frame" else 0  # (3006,0010): not the top-level FoR UID
    at = data.index(str(uid).encode(), start)
    rt.write_bytes(data[:at + (into if isinstance(into, int) else int(len(uid) * into))])
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, "empty": "keep"}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted([
        ("RT", "unreadable"), *[("CT", "mask_missing")] * SLICES])
    own = next(r for r in records if r["reason"] == "unreadable")
    assert "cut short" in own["message"] and "copy it again" in own["message"]
    items = _items(result)
    assert len(items) == SLICES and not any(item["mask"].numpy().any() for item in items)  # B: no annotation
