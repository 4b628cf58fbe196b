"""DICOM SEG defects a fuzzing walk found, each a real SEG by highdicom's writer damaged in one
attribute with pydicom: a SEG whose frames, segments or pixel layout do not add up is refused
with a reason and a message naming the frame, the attribute and its value, never packed as a
partial or wrong mask, and never reported in the words of a library's internals."""

from __future__ import annotations

import copy
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence

from packer.read.annotations import AnnotationError
from tests.test_seg import SPHERE, Grid, ct_series, expected_labels, paint, places, write_seg

GRID = Grid(rows=12, columns=14, spacing=(1.0, 0.8), n=6, step=2.0, origin=(-6.0, -5.0, 0.0))


def _planted() -> np.ndarray:
    """frames (in normal order) × rows × columns × 2: a 'sphere' box on slices 1-3 and a 'box'
    box on slices 2-4, apart in the plane."""
    out = np.zeros((GRID.n, GRID.rows, GRID.columns, 2), dtype=bool)
    out[1:4, 2:5, 2:6, 0] = True
    out[2:5, 7:10, 8:12, 1] = True
    return out


def _in_source_order(sources: list[Dataset], volume: np.ndarray) -> np.ndarray:
    depth = [float(ds.ImagePositionPatient[2]) - GRID.origin[2] for ds in sources]
    return volume[[int(round(d / GRID.step)) for d in depth]]


@pytest.fixture()
def series() -> list[Dataset]:
    return ct_series(GRID, seed=7)


def _seg(tmp_path: Path, sources: list[Dataset], *, kind: str = "BINARY", name: str = "seg.dcm") -> Path:
    pixels = _in_source_order(sources, _planted())
    if kind == "FRACTIONAL":
        pixels = pixels.astype(np.float32)
    return write_seg(tmp_path / name, sources, pixels, ["Ball Thing", "Cube_A"], kind=kind)


def _refusal(path: Path, sources: list[Dataset]) -> AnnotationError:
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert str(path) in err.value.message
    return err.value


def test_the_unmodified_seg_paints_its_planted_boxes(tmp_path: Path, series: list[Dataset]) -> None:
    """The SEG the tests below damage is read right when whole (so their refusals are the damage's)."""
    labels, drawn = paint(_seg(tmp_path, series), places(series))
    np.testing.assert_array_equal(labels, expected_labels(_planted()))
    assert drawn.notes == ()


def _segment_of_frame(ds: Dataset, index: int) -> Dataset:
    """Frame ``index``'s own Segment Identification item (moved out of the shared group if there)."""
    item = ds.PerFrameFunctionalGroupsSequence[index]
    if "SegmentIdentificationSequence" not in item:
        shared = ds.SharedFunctionalGroupsSequence[0]
        for frame in ds.PerFrameFunctionalGroupsSequence:
            frame.SegmentIdentificationSequence = copy.deepcopy(shared.SegmentIdentificationSequence)
        del shared.SegmentIdentificationSequence
    return item.SegmentIdentificationSequence[0]


def test_a_frame_of_a_segment_number_the_segment_sequence_does_not_declare_refuses_the_seg(
        tmp_path: Path, series: list[Dataset]) -> None:
    """PS3.3 C.8.20.2/.4: a frame's Referenced Segment Number names a Segment Sequence item. One
    that names none (a damaged number) held a segment no one can say, and dropping it would pack
    its slice with a partial mask: the SEG is refused, as an RTSTRUCT contour of an undeclared ROI is."""
    path = _seg(tmp_path, series)
    ds = pydicom.dcmread(path)
    _segment_of_frame(ds, 2).ReferencedSegmentNumber = 7
    ds.save_as(path)
    err = _refusal(path, series)
    assert err.reason == "annotation_frames"
    assert "frame 3 " in err.message
    assert "Referenced Segment Number (0062,000B) 7" in err.message
    assert "declares segments [1, 2]" in err.message


def test_two_segments_of_one_segment_number_refuse_the_seg(tmp_path: Path, series: list[Dataset]) -> None:
    """PS3.3 C.8.20.4: Segment Numbers are unique. Two items of Segment Number 1 ('Ball Thing',
    then 'Cube_A') leave its frames' class unknown (the last label used to win, packing the
    sphere's voxels as the box): ``unreadable``, naming the number and both labels, as a
    duplicated ROI Number in an RTSTRUCT is."""
    path = write_seg(tmp_path / "seg.dcm", series, _in_source_order(series, _planted()[..., :1]), ["Ball Thing"])
    ds = pydicom.dcmread(path)
    again = copy.deepcopy(ds.SegmentSequence[0])
    again.SegmentLabel = "Cube_A"
    again.SegmentedPropertyTypeCodeSequence = DicomSequence([hd.sr.CodedConcept("108369006", "SCT", "Tumor")])
    ds.SegmentSequence.append(again)
    ds.save_as(path)
    err = _refusal(path, series)
    assert err.reason == "unreadable"
    assert "Segment Number (0062,0004) 1 " in err.message and "items 1 and 2" in err.message
    assert "'Ball Thing'" in err.message and "'Cube_A'" in err.message


@pytest.mark.parametrize(("kind", "bits"), [("FRACTIONAL", 1), ("FRACTIONAL", 16), ("BINARY", 16)])
def test_a_bits_allocated_its_segmentation_type_does_not_allow_refuses_the_seg(
        tmp_path: Path, series: list[Dataset], kind: str, bits: int) -> None:
    """PS3.3 C.8.20.2: BINARY is 1 bit, FRACTIONAL 8, LABELMAP 8 or 16. A FRACTIONAL SEG that says
    1 was decoded as bits (8 × too much data: an empty or scrambled mask, packed without a word)."""
    path = _seg(tmp_path, series, kind=kind)
    ds = pydicom.dcmread(path)
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits, bits, bits - 1
    ds.save_as(path)
    err = _refusal(path, series)
    assert err.reason == "annotation_frames"
    assert f"Segmentation Type (0062,0001) {kind}" in err.message
    assert f"Bits Allocated (0028,0100) {bits}" in err.message


@pytest.mark.parametrize("kind", ["BINARY", "FRACTIONAL"])
def test_pixel_data_longer_than_its_frames_with_data_past_them_refuses_the_seg(
        tmp_path: Path, series: list[Dataset], kind: str) -> None:
    """Pixel Data longer than NumberOfFrames × Rows × Columns × Bits Allocated need, the bytes past
    them not all zero (a Rows or Columns one short, a frame count one short): the frames would be
    read shifted or cut. Zeros past them are padding, read as the frames they follow (the images' rule)."""
    path = _seg(tmp_path, series, kind=kind)
    ds = pydicom.dcmread(path)
    whole = bytes(ds.PixelData)
    ds.PixelData = whole + b"\x00\x00\x00\x00"
    padded = tmp_path / "padded.dcm"
    ds.save_as(padded)
    labels, _ = paint(padded, places(series))
    np.testing.assert_array_equal(labels, expected_labels(_planted()))
    ds.PixelData = whole + b"\x00\x01\x00\x00"
    ds.save_as(path)
    err = _refusal(path, series)
    assert err.reason == "annotation_frames"
    assert f"holds {len(whole) + 4} bytes" in err.message and "not all zero" in err.message


def test_the_byte_that_pads_an_odd_length_is_not_read(tmp_path: Path, series: list[Dataset]) -> None:
    """3 frames of 12×14 bits are 63 bytes, padded to 64; highdicom leaves bits in that byte, which
    no frame reads: the SEG paints as drawn."""
    path = write_seg(tmp_path / "seg.dcm", series, _in_source_order(series, _planted()[..., :1]), ["Ball Thing"])
    ds = pydicom.dcmread(path)
    assert len(ds.PixelData) == 64 and int(ds.NumberOfFrames) * GRID.rows * GRID.columns == 63 * 8
    ds.PixelData = bytes(ds.PixelData)[:63] + b"\xff"
    ds.save_as(path)
    labels, _ = paint(path, places(series))
    np.testing.assert_array_equal(labels, _planted()[..., 0].astype(np.uint8) * SPHERE.id)


@pytest.mark.parametrize(("where", "keyword", "value"), [
    ("frame", "ImagePositionPatient", ["-6", "-5", "NaN"]),
    ("frame", "ImagePositionPatient", ["-6", "inf", "0"]),
    ("shared", "ImageOrientationPatient", ["1", "0", "0", "0", "NaN", "0"]),
])
def test_a_non_finite_plane_value_is_annotation_frames_naming_the_frame(
        tmp_path: Path, series: list[Dataset], where: str, keyword: str, value: list[str]) -> None:
    """A NaN in a frame's Image Position (Patient) made highdicom's frame table fail
    ("IntegrityError: NOT NULL constraint failed: FrameLUT...") before packer's own plane check:
    the record named sqlite, not the frame. The plane values are checked first."""
    path = _seg(tmp_path, series)
    ds = pydicom.dcmread(path)
    group = "PlanePositionSequence" if keyword == "ImagePositionPatient" else "PlaneOrientationSequence"
    holder = ds.PerFrameFunctionalGroupsSequence[0] if where == "frame" else ds.SharedFunctionalGroupsSequence[0]
    holder[group].value[0][keyword].value = value
    ds.save_as(path)
    err = _refusal(path, series)
    assert err.reason == "annotation_frames", err.message
    assert "frame 1 " in err.message and keyword in err.message
    assert "IntegrityError" not in err.message and "FrameLUT" not in err.message


def test_a_plane_value_that_is_no_number_is_annotation_frames_naming_the_frame(
        tmp_path: Path, series: list[Dataset]) -> None:
    """A decimal comma in a frame's Image Position (Patient) (written into the file's bytes, as
    pydicom refuses to set it) is no number: ``annotation_frames`` quoting it, not ``unreadable``."""
    path = _seg(tmp_path, series)
    ds = pydicom.dcmread(path)
    ds.PerFrameFunctionalGroupsSequence[1].PlanePositionSequence[0].ImagePositionPatient = [-6, -5, -6.54321]
    ds.save_as(path)
    raw = path.read_bytes()
    assert raw.count(b"-6.54321") == 1
    path.write_bytes(raw.replace(b"-6.54321", b"-6,54321"))
    err = _refusal(path, series)
    assert err.reason == "annotation_frames", err.message
    assert "frame 2 " in err.message and "ImagePositionPatient" in err.message and "-6,54321" in err.message


def test_number_of_frames_zero_is_quoted_as_zero(tmp_path: Path, series: list[Dataset]) -> None:
    path = _seg(tmp_path, series)
    ds = pydicom.dcmread(path)
    items = len(ds.PerFrameFunctionalGroupsSequence)
    ds.NumberOfFrames = 0
    ds.save_as(path)
    err = _refusal(path, series)
    assert err.reason == "annotation_frames"
    assert f"NumberOfFrames (0028,0008) is 0 but the Per-Frame Functional Groups Sequence (5200,9230) has {items}" \
        in err.message


def test_a_binary_seg_of_a_byte_a_pixel_paints_and_bit_packed_frames_that_say_8_bits_are_short(
        tmp_path: Path) -> None:
    """pydicom's own set_pixel_data(..., bits_stored=1) writes a BINARY SEG's frames a byte a pixel
    (Bits Allocated 8, Bits Stored 1), which packed right and was refused for a while as a bit depth
    BINARY does not allow; its Pixel Data's length says bytes. Bit-packed frames that claim 8 bits
    are an eighth of that length, and refused as short."""
    g = Grid(rows=12, columns=14, spacing=(1.0, 0.8), n=6, step=2.0, origin=(-6.0, -5.0, 0.0))
    src = ct_series(g, seed=7)
    truth = np.zeros((g.n, g.rows, g.columns, 2), dtype=bool)
    truth[1:4, 2:5, 2:6, 0] = True
    truth[2:5, 7:10, 8:12, 1] = True
    depth = [int(round((float(ds.ImagePositionPatient[2]) - g.origin[2]) / g.step)) for ds in src]
    path = write_seg(tmp_path / "seg.dcm", src, truth[depth], ["Ball Thing", "Cube_A"])
    ds = pydicom.dcmread(path)
    n = int(ds.NumberOfFrames)
    frames = np.unpackbits(np.frombuffer(ds.PixelData, np.uint8), bitorder="little")[: n * g.rows * g.columns]
    packed = bytes(ds.PixelData)
    ds.set_pixel_data(frames.reshape(n, g.rows, g.columns).astype(np.uint8), "MONOCHROME2", 1)
    assert (ds.BitsAllocated, ds.BitsStored) == (8, 1)
    ds.save_as(path)
    labels, _ = paint(path, places(src))
    assert (labels == expected_labels(truth)).all()
    ds.PixelData = packed  # the bit-packed frames again, under Bits Allocated 8
    ds.save_as(path)
    err = _refusal(path, src)
    assert err.reason == "annotation_frames" and "Pixel Data (7FE0,0010) holds" in err.message, err.message

