"""What a fuzzing walk over structure sets found: a damaged Frame of Reference UID hid the series it annotates.

One flipped byte turns the VR of an RTSTRUCT's top-level (0020,0052) Frame of Reference UID from
``UI`` into ``<I``: pydicom then reads the rest of the header (its references, its ROIs) as that
element's value, a "UID" of some 1,500 bytes that is no UID. The header was taken to name that
text as its frame of reference, so linking held back no series: the structure set lay "in
another frame of reference" than every series of its study, and the series it was drawn on
packed with all-zero masks (or with the masks of a SEG beside it alone), though README says that
empty means no annotation was made, not that one could not be read. A Frame of Reference UID
that is not digits and dots is a damaged element: the annotation's references cannot be read
(``unreadable``, naming the element), and the series of its study is ``mask_missing``, as for a
structure set whose references were cut away. The same structure set written without its
preamble (``not_dicom``, salvaged from its bytes) said in its record that its series is not
packed without it, and the series packed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from packer.badsamples import read_bad_samples
from packer.read.annotations import annotation_refs
from packer.read.dicom_attrs import DamagedElement
from tests.test_dicom_masks import (
    BODY,
    RTSTRUCT_ROIS,
    SEGMENTS,
    SLICES,
    _build,
    _items,
    _mask_job,
    _write_series,
    write_rtstruct,
    write_seg,
)

#: (0020,0052) Frame of Reference UID as explicit VR little endian writes it
_FRAME_UID = b"\x20\x00\x52\x00UI"


def _damage_frame_uid(data: bytes) -> bytes:
    """``data`` with the VR of its first (0020,0052) Frame of Reference UID turned from UI into ``<I``."""
    at = data.index(_FRAME_UID)
    return data[:at + 4] + b"<" + data[at + 5:]


def _tree(raw: Path, seg: bool) -> tuple[Path, Path | None]:
    """Patient A: a CT series, its RTSTRUCT (body box) and, where ``seg``, a SEG; patient B: a series alone."""
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    _write_series(raw / "B" / "CT", "PB", seed=2)
    rt = write_rtstruct(raw / "A" / "RT" / "rt.dcm", a, {"External": BODY})
    return rt, write_seg(raw / "A" / "SEG" / "seg.dcm", a) if seg else None


def _outcome(tmp: Path, raw: Path, mask: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    result = _build(_mask_job(tmp, raw, mask))
    return read_bad_samples(result.version_dir / "bad_samples.jsonl"), _items(result)


def test_a_frame_of_reference_uid_that_is_no_uid_is_a_damaged_header_not_a_frame() -> None:
    """The header probe reads the swallowed value as a damaged element, naming it, instead of
    a frame of reference no series lies in."""
    buffer = io.BytesIO()
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = "1.2.840.10008.5.1.4.1.1.481.3", generate_uid(), "RTSTRUCT"
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = generate_uid(), generate_uid(), generate_uid()
    ds.StructureSetLabel = "test"
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    ds.save_as(buffer, enforce_file_format=True)
    whole = pydicom.dcmread(io.BytesIO(buffer.getvalue()))
    assert annotation_refs(whole).frames_of_reference == (str(ds.FrameOfReferenceUID),)
    damaged = pydicom.dcmread(io.BytesIO(_damage_frame_uid(buffer.getvalue())))
    with pytest.raises(DamagedElement, match=r"\(0020,0052\) FrameOfReferenceUID is not a UID"):
        annotation_refs(damaged)


@pytest.mark.parametrize("seg", [False, True], ids=["alone", "beside-a-seg"])
def test_a_structure_set_whose_frame_of_reference_uid_is_damaged_holds_its_series_back(
        tmp_path: Path, seg: bool) -> None:
    """The fuzzing walk's 06: the damaged structure set is ``unreadable`` naming its Frame of
    Reference UID, and its study's series is ``mask_missing`` naming it (beside a SEG that reads:
    the SEG ``series_incomplete``), not packed with all-zero or SEG-only masks; patient B, which
    no annotation may belong to, packs with all-zero masks."""
    raw = tmp_path / "raw"
    rt, seg_path = _tree(raw, seg)
    rt.write_bytes(_damage_frame_uid(rt.read_bytes()))
    records, items = _outcome(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS})
    expected = [("RT", "unreadable"), *[("CT", "mask_missing")] * SLICES]
    if seg_path is not None:
        expected.append(("SEG", "series_incomplete"))
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted(expected)
    own = next(r for r in records if r["path"] == str(rt))
    assert "(0020,0052) FrameOfReferenceUID is not a UID" in own["message"]
    assert "copy the file again" in own["message"]
    assert all(str(rt) in r["message"] for r in records if r["reason"] == "mask_missing")
    assert all(Path(r["path"]).parts[-3] == "A" for r in records)
    assert len(items) == SLICES and not any(item["mask"].numpy().any() for item in items)  # B alone, empty


def test_a_structure_set_without_its_preamble_and_with_a_damaged_frame_uid_holds_back_what_its_record_says(
        tmp_path: Path) -> None:
    """The fuzzing walk's 07: the damaged structure set written without its 128-byte preamble and
    ``DICM`` marker is ``not_dicom``; its record says that the series it annotates is not packed
    without it, and so it is: the series of its study is ``mask_missing`` naming it, as an
    undamaged structure set without its preamble holds back the series it names."""
    raw = tmp_path / "raw"
    rt, _ = _tree(raw, seg=False)
    ds = pydicom.dcmread(rt)
    ds.preamble = None
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=False)  # no preamble, no DICM
    assert buffer.getvalue()[128:132] != b"DICM"
    rt.write_bytes(_damage_frame_uid(buffer.getvalue()))
    records, items = _outcome(tmp_path, raw, RTSTRUCT_ROIS)
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted([
        ("RT", "not_dicom"), *[("CT", "mask_missing")] * SLICES])
    own = next(r for r in records if r["path"] == str(rt))
    assert "the series it annotates is not packed without it" in own["message"]
    assert all(str(rt) in r["message"] and Path(r["path"]).parts[-3] == "A"
               for r in records if r["reason"] == "mask_missing")
    assert len(items) == SLICES and not any(item["mask"].numpy().any() for item in items)  # B alone, empty


def test_a_malformed_but_undamaged_frame_of_reference_uid_still_links(tmp_path: Path) -> None:
    """A de-identifier that writes its own text for every Frame of Reference UID (hex, letters)
    leaves a malformed UID, not a damaged element: the images carry the same text, the structure
    set links to them and paints its masks, as before the damage check."""
    raw = tmp_path / "raw"
    rt, _ = _tree(raw, seg=False)
    anonymous = "ANON-FOR-" + "ab12" * 8  # printable, not digits and dots
    for path in [*sorted((raw / "A" / "CT").iterdir()), rt]:
        ds = pydicom.dcmread(path)
        ds.FrameOfReferenceUID = anonymous
        for item in ds.get("ReferencedFrameOfReferenceSequence") or ():
            item.FrameOfReferenceUID = anonymous
        for item in ds.get("StructureSetROISequence") or ():
            item.ReferencedFrameOfReferenceUID = anonymous
        ds.save_as(path, enforce_file_format=True)
    records, items = _outcome(tmp_path, raw, RTSTRUCT_ROIS)
    assert records == [], records
    assert len(items) == 2 * SLICES and sum(item["mask"].numpy().any() for item in items) > 0

