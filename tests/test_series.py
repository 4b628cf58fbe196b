"""Series assembly and 2.5D neighbour stacks: slices ordered in space, bad series refused by name.

The reference for order is independent of packer: each file read with pydicom, sorted by its
Image Position projected on the normal of its Image Orientation. File names and Instance
Numbers are shuffled on purpose: neither may decide the order.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence

from packer.badsamples import read_bad_samples
from packer.config import SeriesConfig, load_job
from packer.errors import ConfigError
from packer.exclusions import read_excluded
from packer.loader import ShardDataset
from packer.read.dicom_series import SliceGeometry
from packer.read.series import assemble
from packer.records import Excluded, SampleRef
from tests.dicom_files import ct_dataset, enhanced_ct_dataset, save
from tests.test_targets import _build, _ct, _job

AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def _oblique(degrees: float) -> tuple[float, ...]:
    """Axial turned about the x axis: the normal tilts toward y."""
    a = np.radians(degrees)
    return (1.0, 0.0, 0.0, 0.0, float(np.cos(a)), float(np.sin(a)))


def _geometry(z: float | None, *, orientation: tuple[float, ...] | None = AXIAL, series: str = "S1",
              rows: int = 16, spacing: tuple[float, float] = (0.5, 0.5), image_type: tuple[str, ...] = (
                  "ORIGINAL", "PRIMARY", "AXIAL"), frames: list[float] | None = None) -> SliceGeometry:
    normal = np.cross(orientation[:3], orientation[3:]) if orientation else np.array([0, 0, 1.0])
    def at(d: float) -> tuple[float, float, float]:
        p = np.array([-4.0, -4.0, 0.0]) + d * normal
        return (float(p[0]), float(p[1]), float(p[2]))
    positions = tuple(at(d) for d in frames) if frames is not None else ((at(z) if z is not None else None),)
    return SliceGeometry(study_uid="1.2.3", series_uid=series, frame_of_reference="9", positions=positions,
                         orientation=orientation, rows=rows, columns=16, spacing=spacing, image_type=image_type)


def _ref(i: int, entity: str = "P1") -> SampleRef:
    return SampleRef(sample_id=f"id{i:03d}", source="ct", kind="dicom", path=f"/raw/{i}.dcm", relpath=f"{i}.dcm",
                     label="", entity=entity)


CFG = SeriesConfig(gap_tolerance=0.1, drop_localizers=True, min_slices=3)


def _one(files: list[tuple[SampleRef, SliceGeometry]], cfg: SeriesConfig = CFG) -> Any:
    out = assemble(files, cfg)
    return out.series[0] if out.series else {i.reason for i in out.issues}


def test_a_duplicate_position_names_the_two_files_that_share_it() -> None:
    # an export holding one slice twice (a copy in another folder) refused every file of a 300-slice
    # series with "two slices share the position 109.000 mm" and no word of which two files
    files = [(_ref(i), _geometry(2.5 * i)) for i in range(8)] + [(_ref(50), _geometry(5.0))]
    out = assemble(files, CFG)
    assert {i.reason for i in out.issues} == {"series_duplicate_position"}
    assert all("/raw/2.dcm and /raw/50.dcm" in i.message for i in out.issues)


def test_one_image_exported_twice_packs_its_series_once_and_names_the_copy() -> None:
    # the same SOP Instance at the same position in two files (a copy in another folder) refused the
    # whole series as series_duplicate_position, and orphaned the SEG or RTSTRUCT drawn on it
    files = [(_ref(i), replace(_geometry(2.5 * i), sop_uid=f"1.9.{i}")) for i in range(8)]
    copy = (_ref(50), replace(_geometry(5.0), sop_uid="1.9.2"))
    out = assemble([*files, copy], CFG)
    (series,) = out.series
    assert [r.sample_id for r in series.refs] == [f"id{i:03d}" for i in range(8)]
    (issue,) = out.issues
    assert issue.sample_id == "id050" and issue.reason == "series_duplicate_position"
    assert "the same image as /raw/2.dcm" in issue.message and "remove one of them" in issue.message
    assert assemble([copy, *reversed(files)], CFG) == out  # the first by sample id stays, whatever the order
    # another image at the same place (its own SOP Instance UID) still refuses the series
    other = (_ref(50), replace(_geometry(5.0), sop_uid="1.9.99"))
    assert {i.reason for i in assemble([*files, other], CFG).issues} == {"series_duplicate_position"}
    assert not assemble([*files, other], CFG).series


def test_two_echoes_sharing_one_sop_instance_uid_are_not_taken_for_a_copy() -> None:
    """An export that gave each position one SOP Instance UID wrote both echoes of a slice under
    it: the second echo was taken for the first exported twice, one of the two kept per position
    by file order, and the volume mixed echoes. Files whose headers tell two images apart are not
    copies: the series is refused, saying the UID is shared by different images."""
    def echo(i: int, e: int) -> tuple[SampleRef, SliceGeometry]:
        identity = (str(6 * e + i + 1), str(e), f"{10.0 * e}", "", "", "", "")
        return _ref(10 * e + i), replace(_geometry(2.5 * i), sop_uid=f"1.9.{i}", identity=identity)
    files = [echo(i, e) for e in (1, 2) for i in range(6)]
    out = assemble(files, CFG)
    assert out.series == () and {i.reason for i in out.issues} == {"series_duplicate_position"}
    assert len(out.issues) == 12 and all("one SOP Instance UID shared by different images" in i.message
                                         and "EchoNumbers 1 against 2" in i.message
                                         and "where: {EchoNumbers: 1}" in i.message for i in out.issues)
    # the same image exported twice (every header fact equal) is still a copy: one record, the series packs
    copy = (_ref(99), files[3][1])
    assert [i.sample_id for i in assemble([*files[:6], copy], CFG).issues] == ["id099"]


@given(st.permutations(range(8)), st.sampled_from([AXIAL, _oblique(20.0), _oblique(-35.0)]))
@settings(max_examples=60, deadline=None)
def test_slices_are_ordered_by_position_along_the_normal_whatever_the_file_order(order: list[int],
                                                                              orientation: tuple) -> None:
    files = [(_ref(i), _geometry(2.5 * i, orientation=orientation)) for i in order]
    series = _one(files)
    assert [series.refs[f].sample_id for f, _ in series.slices] == [f"id{i:03d}" for i in range(8)]
    assert np.allclose(series.steps, 2.5)
    assert assemble(list(reversed(files)), CFG) == assemble(files, CFG)


@pytest.mark.parametrize("bad,reason", [
    (lambda fs: fs[:3] + fs[4:], "series_gap"),                                           # a missing slice
    (lambda fs: fs + [(_ref(50), _geometry(5.0))], "series_duplicate_position"),
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(17.5, orientation=_oblique(10.0)))], "series_orientation"),
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(17.5, rows=32))], "series_geometry"),
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(17.5, spacing=(0.7, 0.7)))], "series_geometry"),
    (lambda fs: fs[:2], "series_too_short"),
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(None))], "series_no_position"),
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(17.5, orientation=None))], "series_no_position"),
])
def test_a_bad_series_is_refused_with_its_own_reason_for_every_file(bad: Any, reason: str) -> None:
    files = bad([(_ref(i), _geometry(2.5 * i)) for i in range(8)])
    out = assemble(files, CFG)
    assert out.series == () and {i.reason for i in out.issues} == {reason}
    assert sorted(i.sample_id for i in out.issues) == sorted(r.sample_id for r, _ in files)
    assert all("series " in i.message and "not packed" in i.message for i in out.issues)


@pytest.mark.parametrize(("bad", "named"), [
    (lambda fs: fs[:3] + fs[4:], ("/raw/2.dcm and /raw/4.dcm", "restore the missing file")),         # the gap's sides
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(17.5, orientation=_oblique(10.0)))], ("/raw/50.dcm has",)),
    (lambda fs: fs[:-1] + [(_ref(50), _geometry(17.5, rows=32))], ("1 file(s), e.g. /raw/50.dcm",)),
    # a slice without Pixel Spacing was shown as "16×16 at None", naming no attribute
    (lambda fs: fs[:-1] + [(_ref(50), replace(_geometry(17.5), spacing=None))],
     ("16×16 at (0.5, 0.5) (7 file(s)", "16×16 without (0028,0030) Pixel Spacing (1 file(s), e.g. /raw/50.dcm)")),
])
def test_a_refusal_names_the_files_that_cause_it(bad: Any, named: tuple[str, ...]) -> None:
    """A gap, a turned slice, a slice of another grid: the records said "between slices 2 and 3"
    (sorted indices) or only that the slices differ, and named no file a user could remove."""
    out = assemble(bad([(_ref(i), _geometry(2.5 * i)) for i in range(8)]), CFG)
    message = out.issues[0].message
    assert all(text in message for text in named), message


def test_a_one_slice_series_assembles_without_numpy_warnings() -> None:
    """min_slices: 1 and one slice: the gap check took the median of no steps, and numpy's "Mean
    of empty slice" and "invalid value" warnings reached the console."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = assemble([(_ref(0), _geometry(0.0))], replace(CFG, min_slices=1))
    assert len(out.series) == 1 and out.issues == ()


def test_a_one_slice_series_steps_by_its_headers_depth_not_an_invented_millimetre() -> None:
    """One slice has no second position: its step along the normal is the header's Spacing
    Between Slices, else its Slice Thickness; 1 mm only where neither is given, and then the
    series says it was assumed (a 5 mm slice recorded as 1 mm made its volume 5x too thin)."""
    one = assemble([(_ref(0), replace(_geometry(0.0), depth=5.0))], replace(CFG, min_slices=1)).series[0]
    assert one.step == pytest.approx((0.0, 0.0, 5.0)) and not one.depth_assumed
    assert np.linalg.norm(one.affine()[:3, 0]) == pytest.approx(5.0)
    bare = assemble([(_ref(0), _geometry(0.0))], replace(CFG, min_slices=1)).series[0]
    assert bare.step == pytest.approx((0.0, 0.0, 1.0)) and bare.depth_assumed
    several = assemble([(_ref(i), replace(_geometry(2.0 * i), depth=5.0)) for i in range(3)], CFG).series[0]
    assert several.step == pytest.approx((0.0, 0.0, 2.0)) and not several.depth_assumed  # positions win


@pytest.mark.parametrize(("keyword", "value", "why"), [
    ("SpacingBetweenSlices", b"2,5 ", "value 1 '2,5' is no positive number (a decimal comma"),
    ("SpacingBetweenSlices", b"NaN ", "value 1 'NaN' is no positive number"),
    ("SpacingBetweenSlices", b"-2.5", "value 1 '-2.5' is no positive number"),
    ("SliceThickness", b"5\\5 ", "it holds 2 value(s), not 1"),
], ids=["decimal-comma", "nan", "negative", "thickness-two-values"])
def test_a_one_slice_series_whose_header_depth_is_damaged_is_refused_not_given_the_next_one(
        keyword: str, value: bytes, why: str) -> None:
    """A one-slice series takes its depth from Spacing Between Slices, else Slice Thickness. A
    damaged Spacing Between Slices ("2,5", "NaN", "-2.5") was read as absent, and the 5 mm Slice
    Thickness taken in its place: a volume of the wrong depth, silently. The series is refused
    naming the element and quoting it; a series of several slices, placed by its positions, is not."""
    from pydicom.datadict import tag_for_keyword
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    from packer.read.dicom_series import slice_geometry

    ds = ct_dataset(ImagePositionPatient=[0, 0, 0], ImageOrientationPatient=list(AXIAL), SpacingBetweenSlices=2.5)
    ds.SliceThickness = 5.0
    if keyword == "SliceThickness":  # the fallback, where there is no Spacing Between Slices, no less
        del ds.SpacingBetweenSlices
    tag = Tag(tag_for_keyword(keyword) or 0)
    ds._dict[tag] = RawDataElement(tag, "DS", len(value), value, 0, False, True)
    geometry = slice_geometry(ds)
    assert geometry.depth is None
    (issue,) = assemble([(_ref(0), geometry)], replace(CFG, min_slices=1)).issues
    assert issue.reason == "series_geometry"
    name = "(0018,0088) Spacing Between Slices" if keyword == "SpacingBetweenSlices" else "(0018,0050) Slice Thickness"
    assert f"{name} '{value.decode().strip()}' is malformed: {why}" in issue.message
    several = [(_ref(i), replace(geometry, positions=((0.0, 0.0, 2.0 * i),))) for i in range(3)]
    assert len(assemble(several, CFG).series) == 1


def test_a_spacing_between_slices_of_zero_is_no_step_and_the_slice_thickness_gives_the_depth() -> None:
    """0 is well-formed DS and says no step (exporters write it for a lone 2-D slice), unlike a
    damaged or negative value: a one-slice series takes its Slice Thickness, as it always did."""
    from packer.read.dicom_series import slice_geometry

    ds = ct_dataset(ImagePositionPatient=[0, 0, 0], ImageOrientationPatient=list(AXIAL), SpacingBetweenSlices=0)
    ds.SliceThickness = 5.0
    geometry = slice_geometry(ds)
    assert geometry.depth == 5.0
    (series,) = assemble([(_ref(0), geometry)], replace(CFG, min_slices=1)).series
    assert series.step == pytest.approx((0.0, 0.0, 5.0))


@pytest.mark.parametrize(("header", "spacing", "slices", "warned"), [
    ({"SliceThickness": 5.0}, None, 1, False),
    ({"SliceThickness": 5.0, "SpacingBetweenSlices": 4.0}, None, 1, False),
    ({"SliceThickness": 5.0}, [1.0, 0.5, 0.5], 5, False),
    ({"SliceThickness": None}, None, 1, True),
], ids=["thickness", "spacing-between-slices", "resampled-to-1mm", "no-depth"])
def test_a_one_slice_volume_records_the_depth_its_header_gives(
        tmp_path: Path, header: dict[str, Any], spacing: list[float] | None, slices: int, warned: bool) -> None:
    """End to end: a one-slice series (min_slices: 1) packed as a volume has the header's depth
    in its affine and spacing, a requested z spacing resamples that depth (5 mm at 1 mm: five
    slices), and a slice without any depth says its 1 mm is assumed."""
    raw = tmp_path / "raw"
    _ct(raw, "P0/s0.dcm", "P0", seed=1, **header)
    sample: Any = {"volume": {"spacing": spacing}} if spacing else "volume"
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": sample,
                                    "series": {"min_slices": 1}}})
    result = _build(job)
    (item,) = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    (record,) = _records(result).values()
    volume = record["metadata"]["volume"]
    depth = header.get("SpacingBetweenSlices") or header["SliceThickness"] or 1.0
    assert item["image"].shape[1] == slices
    assert volume["spacing"][0] == pytest.approx(depth / slices)
    assert np.linalg.norm(np.array(volume["affine"])[:3, 0]) == pytest.approx(depth / slices)
    assert any("depth spacing of 1 mm is assumed" in w for w in record["metadata"].get("warnings", ())) is warned



@pytest.mark.parametrize(("orientation", "spacing", "axis", "mm"), [
    ([1, 0, 0, 0, 1, 0], None, 0, 1.0),
    ([0, 1, 0, 0, 0, -1], None, 2, 1.0),
    ([1, 0, 0, 0, 1, 0], [0.5, 1.0, 1.0], 0, 0.5),
], ids=["axial", "sagittal", "axial-resampled"])
def test_a_one_slice_volumes_assumed_depth_warning_names_the_affine_column_that_holds_it(
        tmp_path: Path, orientation: list[int], spacing: list[float] | None, axis: int, mm: float) -> None:
    """The warning for an assumed 1 mm depth points at where the record holds it: the affine maps
    voxel (d, h, w), so an axial slice's depth is its first column (it said the third, which is
    the Pixel Spacing), and a sagittal slice, made canonical, has its normal along w (the third)."""
    raw = tmp_path / "raw"
    _ct(raw, "P0/s0.dcm", "P0", seed=1, SliceThickness=None, ImageOrientationPatient=orientation)
    sample: Any = {"volume": {"spacing": spacing}} if spacing else "volume"
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": sample,
                                    "series": {"min_slices": 1}}})
    (record,) = _records(_build(job)).values()
    volume = record["metadata"]["volume"]
    (warning,) = [w for w in record["metadata"]["warnings"] if "depth spacing of 1 mm is assumed" in w]
    column = ("first", "second", "third")[axis]
    assert f"the affine's {column} column and volume.spacing[{axis}] say {mm:g} mm" in warning
    assert np.linalg.norm(np.array(volume["affine"])[:3, axis]) == pytest.approx(mm)
    assert volume["spacing"][axis] == pytest.approx(mm)

@pytest.mark.parametrize(("spacing", "volume_spacing", "shrinks"), [
    ((0.0005, 0.0005), (2.0, 0.25, 0.25), "Pixel Spacing [0.0005, 0.0005] mm resampled to "
                                          "sample.volume.spacing [2.0, 0.25, 0.25] mm turns its 4×16×16 voxels "
                                          "into 4×1×1: under 2 along axis h"),
    ((0.5, 0.5), (2000.0, 0.25, 0.25), "step of 2 mm along the normal (Image Position (Patient)) resampled to "
                                       "sample.volume.spacing [2000.0, 0.25, 0.25] mm turns its 4×16×16 voxels into "
                                       "1×32×32: under 2 along axis d"),
    ((0.5, 0.5), (2.0, 0.25, 0.25), None),
], ids=["pixel-spacing-in-metres", "depth", "fine"])
def test_a_volume_resampled_under_two_voxels_along_an_axis_names_the_value_and_the_grid(
        spacing: tuple[float, float], volume_spacing: tuple[float, float, float], shrinks: str | None) -> None:
    """A Pixel Spacing written in metres (0.0005 for 0.5 mm) resampled the volume to one voxel
    across, which ``size`` scaled back up as a volume of one level, packed silently. The series is
    refused (bad_geometry) naming the value and the grid it would give."""
    from packer.config import DicomTransformConfig
    from packer.read.series import volume_shrinks

    series = _one([(_ref(i), _geometry(2.0 * i, spacing=spacing)) for i in range(4)])
    said = volume_shrinks(series, DicomTransformConfig(windows=(), sample="volume", volume_spacing=volume_spacing))
    assert said is None if shrinks is None else shrinks in (said or "")


def test_a_series_without_positions_names_the_file_and_what_it_lacks() -> None:
    """A multi-frame object has its orientation but no per-frame positions: say that, not
    "no Image Position or Image Orientation"."""
    frames = replace(_geometry(0.0, frames=[0.0, 2.5, 5.0]), positions=(None, None, None))
    (issue,) = assemble([(_ref(1), frames)], CFG).issues
    assert issue.reason == "series_no_position"
    assert ("/raw/1.dcm: series " in issue.message and "3 of the 3 frames of /raw/1.dcm have no Image Position "
            "(Patient) (a multi-frame object gives one per frame" in issue.message)
    files = [(_ref(i), _geometry(2.5 * i)) for i in range(4)] + [(_ref(9), _geometry(10.0, orientation=None))]
    messages = {i.message for i in assemble(files, CFG).issues}
    assert all("/raw/9.dcm has no Image Orientation (Patient), so the slices cannot be ordered" in m for m in messages)


@pytest.mark.parametrize("orientation", [(0.0,) * 6, (1.0, 0.0, 0.0, 1.0, 0.0, 0.0), (2.0, 0.0, 0.0, 0.0, 2.0, 0.0)])
def test_a_degenerate_orientation_is_no_orientation_not_a_duplicate_position(orientation: tuple[float, ...]) -> None:
    """A broken export writes Image Orientation (Patient) as zeros (or twice the same cosine): no
    normal orders its slices. Projected on none they all land at 0 mm, which is no proof of one
    file exported twice; the record must say what is wrong."""
    files = [(_ref(i), replace(_geometry(2.5 * i), orientation=orientation)) for i in range(6)]
    out = assemble(files, CFG)
    assert out.series == () and {i.reason for i in out.issues} == {"series_no_position"}
    assert all("are not two orthogonal unit vectors" in i.message for i in out.issues)
    # one broken slice among whole ones, wherever it comes: the same reason (a broken slice that was
    # not the first file was called a reformat, series_orientation)
    for broken in (0, 3, 5):
        files = [(_ref(i), replace(_geometry(2.5 * i), orientation=orientation) if i == broken else _geometry(2.5 * i))
                 for i in range(6)]
        out = assemble(files, CFG)
        assert {i.reason for i in out.issues} == {"series_no_position"}, (broken, out.issues[0].message)
        assert all(f"/raw/{broken}.dcm has an Image Orientation (Patient)" in i.message for i in out.issues)


def test_a_localizer_is_left_out_and_reported_or_fails_the_series() -> None:
    files = [(_ref(i), _geometry(2.5 * i)) for i in range(6)]
    files.append((_ref(9), _geometry(0.0, orientation=(0.0, 1.0, 0.0, 0.0, 0.0, -1.0),
                                     image_type=("ORIGINAL", "PRIMARY", "LOCALIZER"))))
    out = assemble(files, CFG)
    (series,) = out.series
    assert len(series.slices) == 6
    assert [(i.sample_id, i.reason) for i in out.issues] == [("id009", "series_localizer")]
    strict = assemble(files, replace(CFG, drop_localizers=False))
    assert strict.series == () and {i.reason for i in strict.issues} == {"series_localizer"}


LOCALIZER = ("ORIGINAL", "PRIMARY", "LOCALIZER")


def test_a_localizer_of_a_refused_series_has_its_record_and_a_scout_series_refuses_when_localizers_do() -> None:
    """A localizer in a series refused for another reason (a gap) had no record at all: the input
    counts did not add up. With drop_localizers false a series of localizers only (a scout of
    three coronal planes at distinct positions) was packed as a stack, not refused."""
    files = [(_ref(i), _geometry(z)) for i, z in enumerate([0.0, 2.5, 7.5, 10.0])]  # a gap
    files.append((_ref(9), _geometry(40.0, image_type=LOCALIZER)))
    out = assemble(files, CFG)
    assert out.series == ()
    assert sorted((i.sample_id, i.reason) for i in out.issues) == [
        *((f"id{i:03d}", "series_gap") for i in range(4)), ("id009", "series_localizer")]
    coronal = (1.0, 0.0, 0.0, 0.0, 0.0, -1.0)
    scout = [(_ref(i), _geometry(5.0 * i, orientation=coronal, image_type=LOCALIZER)) for i in range(3)]
    strict = assemble(scout, replace(CFG, drop_localizers=False))
    assert strict.series == () and [i.reason for i in strict.issues] == ["series_localizer"] * 3
    assert "every one of its files is a localizer" in strict.issues[0].message
    assert {i.reason for i in assemble(scout, CFG).issues} == {"series_localizer"}  # left out, as before


def test_a_localizer_does_not_stop_a_series_of_two_acquisitions_from_splitting() -> None:
    """Pre and post contrast at the same positions split by Acquisition Number; a localizer with
    an acquisition number of its own (or none) made a one-slice part, so the split gave up and
    the whole series was refused as series_duplicate_position."""
    zs = [0.0, 3.0, 6.0]
    files = [(_ref(i + 3 * a), replace(_geometry(z), acquisition=str(a + 1)))
             for a in range(2) for i, z in enumerate(zs)]
    for number in ("3", ""):
        with_scout = [*files, (_ref(9), replace(_geometry(50.0, image_type=LOCALIZER), acquisition=number))]
        out = assemble(with_scout, CFG)
        assert [len(s.slices) for s in out.series] == [3, 3], number
        assert [(i.sample_id, i.reason) for i in out.issues] == [("id009", "series_localizer")]


DERIVED = ("DERIVED", "SECONDARY", "AXIAL")


@pytest.mark.parametrize("orientation", [AXIAL, (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)])
def test_a_localizer_among_the_derived_slices_of_a_reformat_is_left_out_not_stacked(orientation: tuple) -> None:
    """Localizers were left out only among original slices: in a reformat (derived images only)
    an axial scout one step above was stacked into the volume as its last slice, a sagittal one
    refused the series as series_orientation, and with drop_localizers false the series was
    refused as if every one of its files were a localizer."""
    files = [(_ref(i), _geometry(2.5 * i, image_type=DERIVED)) for i in range(6)]
    files.append((_ref(9), _geometry(15.0, orientation=orientation, image_type=LOCALIZER)))
    out = assemble(files, CFG)
    (series,) = out.series
    assert [r.sample_id for r in series.refs] == [f"id{i:03d}" for i in range(6)]
    assert [(i.sample_id, i.reason) for i in out.issues] == [("id009", "series_localizer")]
    strict = assemble(files, replace(CFG, drop_localizers=False))
    assert strict.series == () and {i.reason for i in strict.issues} == {"series_localizer"}
    assert all("1 localizer or derived image(s) among its 7 files" in i.message for i in strict.issues)
    assert not any("every one of its files is a localizer" in i.message for i in strict.issues)


@pytest.mark.parametrize("lung_at", [1.25, 0.0])  # between the soft slices, or at their positions
def test_two_reconstructions_sharing_a_series_uid_are_never_stacked_together(lung_at: float) -> None:
    """A soft-tissue and a lung reconstruction exported under one Series Instance UID and one
    Acquisition Number, at interleaved positions, passed every check and packed as one volume
    whose slices alternated kernels. Such a series is refused, naming both kernels and the
    where: filter that packs one of them; two acquisitions of one kernel each still split."""
    soft = [(_ref(i), replace(_geometry(2.5 * i), kernel="B30f", acquisition="1")) for i in range(6)]
    lung = [(_ref(10 + i), replace(_geometry(2.5 * i + lung_at), kernel="B70f", acquisition="1")) for i in range(6)]
    out = assemble([*soft, *lung], CFG)
    assert out.series == () and {i.reason for i in out.issues} == {"series_kernels"} and len(out.issues) == 12
    assert all("'B30f'" in i.message and "'B70f'" in i.message and "where: {ConvolutionKernel: B30f}" in i.message
               for i in out.issues)
    runs = [*soft, *((r, replace(g, acquisition="2", positions=((-4.0, -4.0, 100.0 + 2.5 * n),)))
                     for n, (r, g) in enumerate(lung))]  # a chest run (soft) then an abdomen run (lung)
    assert [len(s.slices) for s in assemble(runs, CFG).series] == [6, 6]


def test_the_header_pass_reads_every_value_of_convolution_kernel() -> None:
    from packer.read.dicom_series import slice_geometry
    ds = ct_dataset(ConvolutionKernel=["FC13", "AIDR 3D"])
    assert slice_geometry(ds).kernel == "FC13\\AIDR 3D"
    assert slice_geometry(ct_dataset()).kernel == ""
    assert slice_geometry(ct_dataset(EchoNumbers=2, EchoTime=12.5)).identity[1:3] == ("2", "12.5")


def test_a_slice_shifted_in_its_plane_refuses_its_series_and_a_gantry_tilt_does_not() -> None:
    """Image Positions were checked only along the slice normal: a slice moved 8 mm in x packed
    into a volume in line with the others, 8 mm from where it is. A slice off the line through
    the first and last slices is series_geometry; a tilt (every slice shifted by the same step,
    a slanted line) and Pixel Spacings that differ by DS rounding alone still pack."""
    files = [(_ref(i), _geometry(2.5 * i)) for i in range(5)]
    shifted = replace(files[2][1], positions=((4.0, -4.0, 5.0),))  # 8 mm in x
    out = assemble([*files[:2], (files[2][0], shifted), *files[3:]], CFG)
    assert out.series == () and {i.reason for i in out.issues} == {"series_geometry"}
    assert "/raw/2.dcm (slice 3 along the slice normal) lies 8.000 mm off the line" in out.issues[0].message
    tilted = [(ref, replace(g, positions=((-4.0, -4.0 + 0.8 * i, 2.5 * i),))) for i, (ref, g) in enumerate(files)]
    (series,) = assemble(tilted, CFG).series
    assert series.step == pytest.approx((0.0, 0.8, 2.5))
    rounded = [(ref, replace(g, spacing=(0.68359375, 0.68359375) if i % 2 else (0.683594, 0.683594)))
               for i, (ref, g) in enumerate(files)]
    assert len(assemble(rounded, CFG).series) == 1


def test_series_are_grouped_by_entity_study_and_series_uid() -> None:
    files = [(_ref(i), _geometry(2.5 * i, series="A")) for i in range(4)]
    files += [(_ref(10 + i), _geometry(2.5 * i, series="B")) for i in range(4)]
    files += [(_ref(20 + i, entity="P2"), _geometry(2.5 * i, series="A")) for i in range(4)]
    out = assemble(files, CFG)
    assert len(out.series) == 3 and not out.issues


FEET_FIRST = (-1.0, 0.0, 0.0, 0.0, 1.0, 0.0)   # typical FFS axial: row × column points to the feet
SAGITTAL_TO_RIGHT = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)  # row × column = -x: points to the patient's right


@pytest.mark.parametrize("orientation,axis", [(AXIAL, 2), (FEET_FIRST, 2), (SAGITTAL_TO_RIGHT, 0),
                                              ((0.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0),
                                              ((1.0, 0.0, 0.0, 0.0, 0.0, -1.0), 1),    # coronal: normal +y
                                              ((-1.0, 0.0, 0.0, 0.0, 0.0, -1.0), 1)])  # coronal: normal -y
def test_a_series_runs_along_the_positive_patient_axis_whatever_its_normal_points_to(
        orientation: tuple[float, ...], axis: int) -> None:
    """Axial stacks run inferior→superior (+z in LPS), sagittal right→left (+x), whichever way
    row × column points: a feet-first scan must not reverse a 2.5D stack's channels."""
    files = [(_ref(i), _geometry(2.5 * i, orientation=orientation)) for i in range(6)]
    series = _one(files)
    position = {ref.sample_id: geometry.positions[0] for ref, geometry in files}
    coordinate = [position[series.refs[f].sample_id][axis] for f, _ in series.slices]
    assert coordinate == sorted(coordinate) and coordinate[0] < coordinate[-1]
    assert series.step[axis] == pytest.approx(2.5) and series.origin[axis] == pytest.approx(min(coordinate))
    assert np.allclose(series.steps, 2.5)


def test_a_multi_frame_object_is_a_series_of_its_own_ordered_by_its_frame_positions() -> None:
    frames = [5.0, 0.0, 7.5, 2.5]  # the creator's frame order is not the spatial order
    out = assemble([(_ref(1), _geometry(None, frames=frames))], CFG)
    (series,) = out.series
    assert series.slices == ((0, 1), (0, 3), (0, 0), (0, 2))


# -- end to end -------------------------------------------------------------------------------
def _write_series(folder: Path, *, slices: int = 6, orientation: tuple[float, ...] = AXIAL, seed: int = 0,
                  patient: str = "P1", series_uid: str | None = None, positions: list[float] | None = None,
                  overrides: dict[int, dict[str, Any]] | None = None) -> list[Path]:
    """One CT series, file names and Instance Numbers shuffled; each slice a distinct image."""
    rng = random.Random(seed)
    zs = positions if positions is not None else [3.0 * i for i in range(slices)]
    numbers = list(range(1, len(zs) + 1))
    rng.shuffle(numbers)
    names = [f"{rng.getrandbits(40):010x}.dcm" for _ in zs]
    normal = np.cross(orientation[:3], orientation[3:])
    uid = series_uid or f"1.2.826.0.1.{seed}.{abs(hash(patient)) % 1000}"
    paths = []
    for i, z in enumerate(zs):
        pixels = np.full((16, 16), 100 * i, dtype=np.int16)
        pixels[i % 16, :] = 3000  # a bright row, unique per slice
        ds = ct_dataset(pixels, center=1000.0, width=3000.0, PatientID=patient, InstanceNumber=numbers[i],
                        StudyInstanceUID=f"{uid}.0", SeriesInstanceUID=uid, ImageOrientationPatient=list(orientation),
                        ImagePositionPatient=[float(v) for v in np.array([-4.0, -4.0, 0.0]) + z * normal],
                        ImageType=["ORIGINAL", "PRIMARY", "AXIAL"])
        for keyword, value in (overrides or {}).get(i, {}).items():
            if value is None:
                delattr(ds, keyword)
            else:
                setattr(ds, keyword, value)
        paths.append(save(ds, folder / names[i]))
    return paths


def _reference_order(paths: list[Path]) -> list[Path]:
    def along(path: Path) -> float:
        ds = pydicom.dcmread(path)
        iop = np.array(ds.ImageOrientationPatient, dtype=float)
        return float(np.dot(np.cross(iop[:3], iop[3:]), np.array(ds.ImagePositionPatient, dtype=float)))
    return sorted(paths, key=along)


def _series_job(tmp: Path, raw: Path, **dicom: Any) -> Path:
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "size": [16, 16],
                                     "sample": {"neighbors": 1}, **dicom}},
                validate={"max_bad_fraction": 0.9})


def test_neighbour_stacks_are_the_slices_in_spatial_order_around_each_slice(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    straight = _write_series(raw / "a", seed=1, patient="P1")
    tilted = _write_series(raw / "b", seed=2, patient="P2", orientation=_oblique(25.0))
    slice_build = _build(_job(tmp_path / "slices", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                              transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "size": [16, 16]}}))
    by_key = {item["key"]: item["image"].numpy() for item in ShardDataset(slice_build.manifest_path, "train",
                                                                         shuffle=False)}
    job = _series_job(tmp_path, raw)
    stacked = _build(job)
    items = {item["key"]: item["image"].numpy() for item in ShardDataset(stacked.manifest_path, "train",
                                                                        shuffle=False)}
    assert len(items) == 12 and set(items) == set(by_key)
    records = _records(stacked)
    for paths in (straight, tilted):
        order = [_key_of(job, p) for p in _reference_order(paths)]
        for i, key in enumerate(order):
            around = [order[max(0, min(len(order) - 1, j))] for j in (i - 1, i, i + 1)]  # edges replicate
            assert np.array_equal(items[key], np.concatenate([by_key[k] for k in around])), (i, key)
            assert records[key]["metadata"]["neighbors"]["offsets_mm"] == pytest.approx(
                [3.0 * (j - i) for j in (max(0, i - 1), i, min(len(order) - 1, i + 1))], abs=1e-3)


def _write_anatomy(folder: Path, orientation: tuple[float, ...], patient: str) -> None:
    """Six 16×16 axial slices, 3 mm apart, of one synthetic anatomy defined in patient space
    (stored value 1000 + 60·z + 40·x + 10·y at each pixel's LPS centre), sampled on the grid that
    ``orientation`` gives: the head-first and the feet-first scan of the same body."""
    row, col = np.asarray(orientation[:3]), np.asarray(orientation[3:])
    corner = np.array([-4.0, -4.0, 0.0])  # the grid covers x, y in [-4, 3.5] mm either way
    corner = corner + np.where(row < 0, 7.5, 0.0) + np.where(col < 0, 7.5, 0.0)
    r, c = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    for i in range(6):
        origin = corner + np.array([0.0, 0.0, 3.0 * i])
        centres = origin + c[..., None] * 0.5 * row + r[..., None] * 0.5 * col
        stored = 1000 + 60 * centres[..., 2] + 40 * centres[..., 0] + 10 * centres[..., 1]
        ds = ct_dataset(np.rint(stored).astype(np.int16), center=1000.0, width=3000.0, PatientID=patient,
                        InstanceNumber=6 - i, StudyInstanceUID=f"1.2.826.0.7.{len(patient)}",
                        SeriesInstanceUID=f"1.2.826.0.8.{len(patient)}", ImageOrientationPatient=list(orientation),
                        ImagePositionPatient=[float(v) for v in origin], ImageType=["ORIGINAL", "PRIMARY", "AXIAL"])
        save(ds, folder / f"{i:02d}.dcm")


def test_a_feet_first_series_stacks_the_same_channels_as_a_head_first_one(tmp_path: Path) -> None:
    """The same anatomy scanned head first (row × column points up) and feet first (it points
    down, columns mirrored): each 2.5D stack holds the same slices in the same order, inferior
    first; a volume is the same array at the same affine."""
    stacks: dict[str, dict[bytes, np.ndarray]] = {}
    volumes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, orientation in (("head", AXIAL), ("feet", FEET_FIRST)):
        raw = tmp_path / name / "raw"
        _write_anatomy(raw / "s", orientation, "P1")
        built = _build(_series_job(tmp_path / name, raw))
        items = list(ShardDataset(built.manifest_path, "train", shuffle=False))
        # 2.5D stacks stay in the stored in-plane order: undo the feet-first scan's mirrored rows
        images = [item["image"].numpy()[..., ::-1] if name == "feet" else item["image"].numpy() for item in items]
        stacks[name] = {np.ascontiguousarray(image[1]).tobytes(): image for image in images}  # keyed by the centre
        volume = _build(_job(tmp_path / name / "volume", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                             transform={"dicom": {"windows": [{"center": 1000, "width": 3000}],
                                                  "sample": "volume"}}))
        (item,) = list(ShardDataset(volume.manifest_path, "train", shuffle=False, records=True))
        volumes[name] = (item["image"].numpy(), np.array(item["record"]["metadata"]["volume"]["affine"]))
    assert len(stacks["head"]) == 6 and stacks["head"].keys() == stacks["feet"].keys()
    for centre, stack in stacks["head"].items():
        assert np.array_equal(stacks["feet"][centre], stack)
        means = [float(channel.mean()) for channel in stack]  # an end slice repeats (edge: replicate)
        assert means[0] <= means[1] <= means[2] and means[0] < means[2]  # inferior (lower z: darker) first
    assert np.array_equal(volumes["head"][0], volumes["feet"][0])
    assert np.allclose(volumes["head"][1], volumes["feet"][1])
    assert np.allclose(volumes["head"][1][:3, 3], [-4.0, -4.0, 0.0])  # the inferior right anterior voxel


def _records(result: Any) -> dict[str, dict[str, Any]]:
    import webdataset as wds

    urls = sorted(str(p) for p in result.version_dir.glob("*-*.tar"))
    return {s["__key__"]: s["json"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()}


def _key_of(job: Path, path: Path) -> str:
    """The sample id packer gives ``path`` (keyed by the job's pseudonymization key)."""
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import make_sample_id

    relpath = path.relative_to(path.parents[1]).as_posix()
    return make_sample_id("raw", relpath, pseudonymizer_for(load_job(job).phi))


def test_skip_makes_no_sample_of_an_edge_slice_and_says_so_for_each_file(tmp_path: Path) -> None:
    """edge: skip packs no sample of an end slice, nor of any slice of a series shorter than
    2k + 1: those files vanished without a record, and a short series' patient with them. Each
    is now left out on purpose (not_requested), so every file is counted once."""
    raw = tmp_path / "raw"
    five = _write_series(raw / "a", seed=1, slices=5)
    four = _write_series(raw / "b", seed=2, slices=4, patient="P2")
    result = _build(_series_job(tmp_path, raw, sample={"neighbors": 2, "edge": "skip"}))
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    assert len(items) == 1 and items[0]["image"].shape[0] == 5
    left_out = {Path(r["path"]): r for r in map(json.loads, (result.version_dir / "excluded.jsonl").read_text()
                                                 .splitlines())}
    assert len(left_out) == 8 and set(four) < set(left_out) < set(five) | set(four)  # all but the centre
    assert {r["why"] for r in left_out.values()} == {"not_requested"}
    assert all("edge: replicate packs it" in r["detail"] for r in left_out.values())
    assert sum("fewer than the 5 a stack of neighbors: 2 needs" in r["detail"] for r in left_out.values()) == 4
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["files"] == 9 and manifest["inputs"]["excluded"] == {"not_requested": 8}


def test_every_broken_series_is_reported_by_reason_and_the_good_ones_pack(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write_series(raw / "good", seed=1, patient="G")
    gap = _write_series(raw / "gap", seed=2, patient="A", positions=[0.0, 3.0, 6.0, 12.0, 15.0, 18.0])
    dup = _write_series(raw / "dup", seed=3, patient="B", positions=[0.0, 3.0, 6.0, 6.0, 9.0, 12.0])
    mixed = _write_series(raw / "mixed", seed=4, patient="C",
                          overrides={2: {"ImageOrientationPatient": list(_oblique(15.0))}})
    nopos = _write_series(raw / "nopos", seed=5, patient="D", overrides={1: {"ImagePositionPatient": None}})
    short = _write_series(raw / "short", seed=6, patient="E", slices=2)
    scout = _write_series(raw / "scout", seed=7, patient="F",
                          overrides={0: {"ImageType": ["ORIGINAL", "PRIMARY", "LOCALIZER"],
                                         "ImagePositionPatient": [0.0, 0.0, 40.0]}})
    result = _build(_series_job(tmp_path, raw))
    reasons: dict[str, set[str]] = {}
    for record in read_bad_samples(result.version_dir / "bad_samples.jsonl"):
        reasons.setdefault(Path(record["path"]).parent.name, set()).add(record["reason"])
    assert reasons == {"gap": {"series_gap"}, "dup": {"series_duplicate_position"},
                       "mixed": {"series_orientation"}, "nopos": {"series_no_position"},
                       "short": {"series_too_short"}}
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sum(Path(r["path"]).parent.name == "gap" for r in bad) == len(gap)  # every file, by name
    assert len(dup) + len(mixed) + len(nopos) + len(short) == sum(
        Path(r["path"]).parent.name in ("dup", "mixed", "nopos", "short", "scout") for r in bad)
    # the localizer among the scout series' slices is left out on purpose, as a slice job leaves
    # localizers out: not a bad sample (a CT export's scouts failed a default job's bad fraction)
    (left_out,) = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert (Path(left_out["path"]), left_out["why"]) == (scout[0], "not_requested")
    assert "series.drop_localizers" in left_out["detail"] and "where: {ImageType: LOCALIZER}" in left_out["detail"]
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["samples"] == 6 + len(scout) - 1
    assert manifest["inputs"]["excluded"] == {"not_requested": 1}


def test_a_series_of_two_acquisitions_at_different_positions_packs_each_as_a_stack(tmp_path: Path) -> None:
    """One Series Instance UID, two acquisitions (Acquisition Number 1: z 0-9 mm, 2: z 200-209 mm,
    a chest then an abdomen run, or a pre- and a post-contrast run): the 191 mm step between them is
    no missing slice. Each acquisition is ordered and checked as a stack of its own, its neighbours
    never taken from the other; nothing is bad."""
    raw = tmp_path / "raw"
    zs = [0.0, 3.0, 6.0, 9.0, 200.0, 203.0, 206.0, 209.0]
    paths = _write_series(raw / "two", seed=11, patient="P1", positions=zs,
                          overrides={i: {"AcquisitionNumber": 1 if z < 100 else 2} for i, z in enumerate(zs)})
    job = _series_job(tmp_path, raw)
    result = _build(job)
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    records = _records(result)
    assert len(records) == 8
    order = _reference_order(paths)
    for run in (order[:4], order[4:]):  # each acquisition in spatial order
        keys = [_key_of(job, p) for p in run]
        for i, key in enumerate(keys):
            neighbors = records[key]["metadata"]["neighbors"]
            assert neighbors["slices"] == 4 and neighbors["slice"] == i, neighbors
            assert neighbors["offsets_mm"] == pytest.approx(
                [3.0 * (j - i) for j in (max(0, i - 1), i, min(3, i + 1))], abs=1e-3)
    volumes = _build(_job(tmp_path / "volume", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                          transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": "volume"}}))
    stacked = list(ShardDataset(volumes.manifest_path, "train", shuffle=False))
    assert sorted(item["image"].shape[1] for item in stacked) == [4, 4]


def test_acquisitions_split_a_series_only_where_each_is_a_stack_of_its_own() -> None:
    """A scanner that numbers every slice its own acquisition (sequential CT) says nothing about
    a gap: the series is still refused as series_gap, not as eight one-slice series."""
    zs = [0.0, 3.0, 6.0, 12.0, 15.0, 18.0]
    files = [(_ref(i), replace(_geometry(z), acquisition=str(i + 1))) for i, z in enumerate(zs)]
    assert _one(files) == {"series_gap"}
    two = [(_ref(i), replace(_geometry(z), acquisition="1" if z < 10 else "2")) for i, z in enumerate(zs)]
    out = assemble(two, CFG)
    assert not out.issues and [len(s.slices) for s in out.series] == [3, 3]
    assert len({s.uid_key for s in out.series}) == 2


def test_a_refused_acquisition_is_named_as_one_not_as_its_whole_series() -> None:
    """Two echoes stacked per Acquisition Number, the second missing a slice: the first packs,
    the second is series_gap; its records said "series … (5 files): …; the series is not packed",
    though the series holds 11 files and 6 of them pack. They now name the acquisition, its share
    of the series' files, and that the other acquisitions are judged on their own."""
    first = [(_ref(i), replace(_geometry(3.0 * i), acquisition="1")) for i in range(6)]
    second = [(_ref(10 + i), replace(_geometry(z), acquisition="2")) for i, z in enumerate([0, 3, 6, 12, 15])]
    out = assemble([*first, *second], CFG)
    assert [len(s.slices) for s in out.series] == [6]
    assert {(i.sample_id, i.reason) for i in out.issues} == {(f"id{10 + i:03d}", "series_gap") for i in range(5)}
    message = out.issues[0].message
    assert "acquisition 2 of series " in message and "(5 of its 11 files)" in message, message
    assert message.endswith("this acquisition is not packed (the series' other acquisitions are stacked, and "
                            "judged, on their own)"), message


def test_interleaved_acquisitions_are_one_scan_and_a_gap_refuses_all_of_it() -> None:
    """MR concatenations: slices at 0-18 mm, 2 mm apart, Acquisition Number alternating 1/2 slice
    by slice, the slice at 4 mm missing. The series failed as series_gap, was split per
    acquisition, and acquisition 2 (2, 6, ..., 18 mm: complete) packed as a five-slice stack at
    4 mm, every other slice of the scan. Acquisitions whose positions interleave are one scan:
    every file is series_gap; without the gap the series packs whole, as before."""
    zs = [2.0 * i for i in range(10)]
    files = [(_ref(i), replace(_geometry(z), acquisition=str(1 + i % 2))) for i, z in enumerate(zs)]
    gapped = assemble([f for f, z in zip(files, zs, strict=True) if z != 4.0], CFG)
    assert gapped.series == ()
    assert [i.reason for i in gapped.issues] == ["series_gap"] * 9
    assert "acquisition" not in gapped.issues[0].message.split(": ")[1], gapped.issues[0].message
    assert [len(s.slices) for s in assemble(files, CFG).series] == [10]


def test_acquisitions_at_one_position_each_keep_their_series_whole() -> None:
    """Two echoes at each of five positions, each position numbered its own acquisition (both
    echoes share it): the split counted frames, not positions, so it made five two-slice
    "acquisitions" at one place each and refused every file as series_too_short, whose message
    invites lowering min_slices. One position per acquisition is the per-slice numbering: the
    series is judged whole, and its echoes share positions."""
    files = [(_ref(2 * i + echo), replace(_geometry(2.0 * i), acquisition=str(i + 1)))
             for i in range(5) for echo in range(2)]
    out = assemble(files, CFG)
    assert out.series == ()
    assert [i.reason for i in out.issues] == ["series_duplicate_position"] * 10
    assert all("acquisition" not in i.message.split(": ")[1] for i in out.issues), out.issues[0].message


def write_enhanced_ct(path: Path, frames: np.ndarray, z: list[float]) -> Path:
    """An Enhanced CT (PS3.3 C.7.6.16) whose frame i sits at ``z[i]`` mm (axial, shared orientation,
    per-frame Plane Position): the creator's frame order need not be the spatial one."""
    ds = enhanced_ct_dataset(frames, [None] * len(z), [None] * len(z), shared_rescale=(1.0, -1024.0))
    plane = Dataset()
    plane.ImageOrientationPatient = list(AXIAL)
    ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence = DicomSequence([plane])
    for group, at in zip(ds.PerFrameFunctionalGroupsSequence, z, strict=True):
        position = Dataset()
        position.ImagePositionPatient = [0.0, 0.0, at]
        group.PlanePositionSequence = DicomSequence([position])
    ds.PatientID = "E1"
    return save(ds, path)


def test_an_enhanced_multi_frame_ct_is_stacked_by_its_frame_positions(tmp_path: Path) -> None:
    # a checkerboard on each frame: a series of constant slices only is refused (constant_image)
    board = (np.indices((16, 16)).sum(axis=0) % 2).astype(np.int16)
    frames = np.stack([np.full((16, 16), 200 * i, dtype=np.int16) + board for i in range(4)])
    order = [2.0, 0.0, 3.0, 1.0]  # frame i sits at 2.5 * order[i] mm
    write_enhanced_ct(tmp_path / "raw" / "enhanced.dcm", frames, [2.5 * at for at in order])
    result = _build(_series_job(tmp_path, tmp_path / "raw"))
    items = sorted(ShardDataset(result.manifest_path, "train", shuffle=False), key=lambda item: item["key"])
    assert [item["key"][-5:] for item in items] == ["f0000", "f0001", "f0002", "f0003"]
    centre = {item["key"][-1]: [int(item["image"][c].float().mean()) for c in range(3)] for item in items}
    value = {f: int(np.mean(items[f]["image"][1].numpy())) for f in range(4)}
    by_position = sorted(range(4), key=lambda f: order[f])   # frames 1, 3, 0, 2 along the normal
    for n, frame in enumerate(by_position):
        below = by_position[max(0, n - 1)]
        above = by_position[min(3, n + 1)]
        assert centre[str(frame)] == [value[below], value[frame], value[above]]



def test_two_frames_of_one_enhanced_object_at_one_place_name_their_temporal_positions(tmp_path: Path) -> None:
    """A multi-phase Enhanced MR (two Temporal Position Index values at each place) was refused as
    series_duplicate_position "one file twice in the export, or two acquisitions in one series":
    neither can be so of two frames of one object. The record names what tells the frames apart
    and the job that packs them (a slice job with frames: split)."""
    from packer.read.dicom_series import slice_geometry
    frames = np.stack([np.full((16, 16), 100 * t + 10 * z, dtype=np.int16) for z in range(3) for t in (1, 2)])
    path = write_enhanced_ct(tmp_path / "e.dcm", frames, [2.5 * z for z in range(3) for _ in (1, 2)])
    ds = pydicom.dcmread(path)
    for n, group in enumerate(ds.PerFrameFunctionalGroupsSequence):
        content = Dataset()
        content.StackID, content.TemporalPositionIndex = "1", n % 2 + 1
        group.FrameContentSequence = DicomSequence([content])
    ds.save_as(path)
    geometry = slice_geometry(pydicom.dcmread(path, stop_before_pixels=True))
    assert [t for _, t, *_ in geometry.frame_identity] == ["1", "2"] * 3
    out = assemble([(_ref(1), geometry)], CFG)
    assert [i.reason for i in out.issues] == ["series_duplicate_position"]
    message = out.issues[0].message
    assert "one file twice" not in message and "two acquisitions" not in message
    assert "TemporalPositionIndex 1 against 2" in message and "frames: split" in message


def test_an_enhanced_object_whose_frames_turn_is_refused_for_its_orientation(tmp_path: Path) -> None:
    """A three-plane scout saved as one Enhanced object: its frames' Plane Orientation differs
    per frame, so frame 0's orientation is not the series' and no order along one normal exists."""
    frames = np.stack([np.full((16, 16), 200 * i, dtype=np.int16) for i in range(4)])
    path = write_enhanced_ct(tmp_path / "raw" / "scout.dcm", frames, [0.0, 2.5, 5.0, 7.5])
    ds = pydicom.dcmread(path)
    for group in ds.PerFrameFunctionalGroupsSequence[2:]:
        plane = Dataset()
        plane.ImageOrientationPatient = [0.0, 1.0, 0.0, 0.0, 0.0, -1.0]  # sagittal
        group.PlaneOrientationSequence = DicomSequence([plane])
    save(ds, path)
    _only_refused_beside_a_good_series(tmp_path, "scout.dcm", "series_orientation")


def _only_refused_beside_a_good_series(tmp_path: Path, name: str, reason: str) -> None:
    """Build ``tmp_path/raw`` with a good 6-slice series beside it: the good series packs alone, and
    the file ``name`` is the one bad record, with ``reason``."""
    _write_series(tmp_path / "raw" / "good", seed=1, patient="G")
    result = _build(_series_job(tmp_path, tmp_path / "raw"))
    assert len(list(ShardDataset(result.manifest_path, "train", shuffle=False))) == 6  # the good series only
    assert [(Path(r["path"]).name, r["reason"]) for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")
            ] == [(name, reason)]


def test_an_enhanced_object_with_a_frame_of_another_pixel_spacing_is_refused_for_its_geometry(
        tmp_path: Path) -> None:
    """Frame 3's own Pixel Measures say 1.0 mm where the shared group says 0.5: the series' check read
    frame 0's spacing only, and the stack and the volume mixed slices of two scales."""
    frames = np.stack([np.full((16, 16), 200 * i, dtype=np.int16) for i in range(4)])
    path = write_enhanced_ct(tmp_path / "raw" / "scaled.dcm", frames, [0.0, 2.5, 5.0, 7.5])
    ds = pydicom.dcmread(path)
    measures = Dataset()
    measures.PixelSpacing = [0.5, 0.5]
    measures.SliceThickness = 2.5
    ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence = DicomSequence([measures])
    own = Dataset()
    own.PixelSpacing = [1.0, 1.0]
    own.SliceThickness = 2.5
    ds.PerFrameFunctionalGroupsSequence[3].PixelMeasuresSequence = DicomSequence([own])
    save(ds, path)
    _only_refused_beside_a_good_series(tmp_path, "scaled.dcm", "series_geometry")


def test_a_series_record_names_an_enhanced_objects_frames_as_their_keys_count_them(tmp_path: Path) -> None:
    """Frames at z = 0, 2, 2, 4: stored frames 1 and 2 (keys -f0001, -f0002) share a position; the
    record said "frame 2 and frame 3", and -f0003 is the innocent z = 4 frame. A frame turned
    against the others is named with its frame, not as the file twice."""
    frames = np.stack([np.full((16, 16), 200 * i, dtype=np.int16) for i in range(4)])
    write_enhanced_ct(tmp_path / "raw" / "twice.dcm", frames, [0.0, 2.0, 2.0, 4.0])
    path = write_enhanced_ct(tmp_path / "raw" / "turned.dcm", frames, [10.0, 12.0, 14.0, 16.0])
    ds = pydicom.dcmread(path)
    ds.PatientID, ds.SeriesInstanceUID = "E2", pydicom.uid.generate_uid()
    plane = Dataset()
    plane.ImageOrientationPatient = [0.0, 1.0, 0.0, 0.0, 0.0, -1.0]
    ds.PerFrameFunctionalGroupsSequence[2].PlaneOrientationSequence = DicomSequence([plane])
    save(ds, path)
    _write_series(tmp_path / "raw" / "good", seed=1, patient="G")
    result = _build(_series_job(tmp_path, tmp_path / "raw"))
    records = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    twice = tmp_path / "raw" / "twice.dcm"
    assert records["twice.dcm"]["reason"] == "series_duplicate_position"
    assert f"({twice} frame 1 and {twice} frame 2:" in records["twice.dcm"]["message"]
    assert records["turned.dcm"]["reason"] == "series_orientation"
    assert f"{path} frame 2 has [0.0, 1.0, 0.0, 0.0, 0.0, -1.0], {path} frame 0 " in records["turned.dcm"]["message"]


AIR = np.zeros((16, 16), dtype=np.int16)  # stored 0 everywhere: -1024 HU, an all-air slice


def _air_edge_series(raw: Path) -> tuple[list[Path], Path]:
    """A 6-slice series whose lowest slice (z = 0) is all air, and that slice's path."""
    paths = _write_series(raw / "a", seed=1, overrides={0: {"PixelData": AIR.tobytes()}})
    return paths, paths[0]  # in the order of z: slice 0 is the lowest


def _volume_series_job(tmp: Path, raw: Path) -> Path:
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": "volume"}},
                validate={"max_bad_fraction": 0.9})


@pytest.mark.parametrize("sample", [{"neighbors": 1}, {"neighbors": 1, "edge": "skip"}, "volume"],
                         ids=["neighbors", "neighbors-skip", "volume"])
def test_a_constant_edge_slice_is_packed_as_its_series_context_and_counted(tmp_path: Path, sample: Any) -> None:
    """An all-air slice at the edge of a scan is context in a stack or a volume: the series packs
    whole (no series_incomplete), the manifest counts the slice, and its sample's record says why."""
    raw = tmp_path / "raw"
    paths, air = _air_edge_series(raw)
    job = _volume_series_job(tmp_path, raw) if sample == "volume" else _series_job(tmp_path, raw, sample=sample)
    result = _build(job)
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["constant_slices"] == 1
    items = {item["key"]: item for item in ShardDataset(result.manifest_path, "train", shuffle=False, records=True)}
    if sample == "volume":
        (item,) = items.values()
        volume = item["image"].numpy()  # C×D×H×W
        assert volume.shape[1] == len(paths)
        # window 1000 ± 1500: -1024 HU is 0; every other slice has a bright row
        empty = [d for d in range(volume.shape[1]) if not volume[:, d].any()]
        assert len(empty) == 1
        assert item["record"]["metadata"]["volume"]["constant_slices"] == 1
        assert "warnings" not in item["record"]["metadata"]  # the slice's note is its file's, not the volume's
        return
    key = _key_of(job, air)
    expected = len(paths) - (2 if sample.get("edge") == "skip" else 0)
    assert len(items) == expected
    if sample.get("edge") == "skip":  # the air slice is only a neighbour: the first stack's channel 0
        assert key not in items
        first = next(i for i in items.values() if i["record"]["metadata"]["neighbors"]["slice"] == 1)
        assert not first["image"][0].numpy().any() and first["image"][1].numpy().any()
        return
    image = items[key]["image"].numpy()  # edge replicate: channels are slices 0, 0, 1
    assert not image[0].any() and not image[1].any() and image[2].any()
    (warning,) = items[key]["record"]["metadata"]["warnings"]
    assert warning.startswith("constant slice: every pixel has the same stored value")


def test_a_constant_slice_is_still_a_bad_sample_in_slice_mode(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    paths, air = _air_edge_series(raw)
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "size": [16, 16]}},
               validate={"max_bad_fraction": 0.9})
    result = _build(job)
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert [(Path(r["path"]), r["reason"]) for r in bad] == [(air, "constant_image")]
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["samples"] == len(paths) - 1 and "constant_slices" not in manifest["inputs"]


def test_a_series_of_constant_slices_only_is_refused_as_constant(tmp_path: Path) -> None:
    """Context needs something to be the context of: a series whose every slice is blank is
    constant_image for each of its files, as one blank file is in slice mode."""
    raw = tmp_path / "raw"
    paths = _write_series(raw / "a", seed=1, slices=4, overrides={i: {"PixelData": AIR.tobytes()} for i in range(4)})
    _write_series(raw / "b", seed=2, patient="P2")
    result = _build(_series_job(tmp_path, raw))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]), r["reason"]) for r in bad) == sorted((p, "constant_image") for p in paths)
    assert json.loads(result.manifest_path.read_text())["inputs"]["samples"] == 6


def test_the_constant_slices_counted_are_those_of_packed_series_only(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A series refused as constant_image packs none of its slices: its files were counted in
    inputs.constant_slices and in the reader-warning line ("4 file(s) packed with a reader's
    warning"), whose example and locate hint named a file of the refused series."""
    raw = tmp_path / "raw"
    _air_edge_series(raw)  # one constant slice, packed as context
    _write_series(raw / "b", seed=2, slices=4, patient="P2", overrides={i: {"PixelData": AIR.tobytes()}
                                                                        for i in range(4)})
    result = _build(_series_job(tmp_path, raw))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["constant_slices"] == 1
    assert "1 file(s) packed with a reader's warning" in capsys.readouterr().err


def test_neighbours_need_split_frames_and_no_channel_mapping(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    with pytest.raises(ConfigError, match="frames: split"):
        load_job(_series_job(tmp_path, raw, frames="stack"))
    with pytest.raises(ConfigError, match="series are assembled only for sample"):
        load_job(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                      transform={"dicom": {"series": {"min_slices": 4}}}))


def test_series_bytes_do_not_depend_on_worker_count_or_listing_order(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for n in range(3):
        _write_series(raw / f"s{n}", seed=10 + n, patient=f"P{n}")
    first = _build(_series_job(tmp_path / "one", raw))
    second = _build(_series_job(tmp_path / "two", raw))
    assert first.manifest["dataset_hash"] == second.manifest["dataset_hash"]
    assert list(itertools.islice(ShardDataset(first.manifest_path, "train"), 1))


def test_the_demo_series_workflow_packs_the_good_series_and_names_each_broken_one(demo_raw: Any,
                                                                                 tmp_path: Path) -> None:
    """`make demo` writes demo-raw/series; workflows/series-neighbors.yaml builds it as the README says."""
    import shutil

    from packer.demo import SERIES
    from tests.demo_version import REPO

    (tmp_path / "workflows").mkdir()
    shutil.copy(REPO / "workflows" / "series-neighbors.yaml", tmp_path / "workflows")
    (tmp_path / "demo-raw").symlink_to(demo_raw.root)
    result = _build(tmp_path / "workflows" / "series-neighbors.yaml")
    found: dict[str, set[str]] = {}
    for record in read_bad_samples(result.version_dir / "bad_samples.jsonl"):
        found.setdefault(Path(record["path"]).parent.name, set()).add(record["reason"])
    assert found == {patient: {reason} for patient, (_, reason) in SERIES.items()
                     if reason not in (None, "not_requested")}
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["excluded"] == {"not_requested": 1}  # SER05's scout: left out, not bad
    packed = sum(1 for _, reason in SERIES.values() if reason in (None, "not_requested"))
    assert manifest["inputs"]["samples"] == 8 * packed
    assert manifest["sample_schema"]["shape"] == [9, 48, 48]
    for split in ("train", "valid", "test"):
        assert manifest["splits"][split]["samples"] > 0


@pytest.mark.parametrize("sample", [{"neighbors": 1}, {"neighbors": 2, "edge": "skip"}, "volume"])
def test_validate_quick_assembles_and_checks_series_from_headers_as_the_full_pass_does(tmp_path: Path,
                                                                                      sample: Any) -> None:
    """The series checks are header checks: ``validate --quick`` runs them, and counts the
    samples the build would make (keys, entities, split, bad files by reason), none decoded."""
    from packer.pipeline.datacheck import validate_job

    raw = tmp_path / "raw"
    for n in range(3):
        _write_series(raw / f"good{n}", seed=20 + n, patient=f"G{n}", slices=5)
    _write_series(raw / "gap", seed=2, patient="A", positions=[0.0, 3.0, 6.0, 12.0, 15.0])
    _write_series(raw / "short", seed=6, patient="E", slices=2)
    board = (np.indices((16, 16)).sum(axis=0) % 2).astype(np.int16)  # no constant slice: the full pass refuses
    frames = np.stack([np.full((16, 16), 200 * i, dtype=np.int16) + board for i in range(4)])  # a series of those
    write_enhanced_ct(raw / "enhanced" / "enhanced.dcm", frames, [0.0, 2.5, 5.0, 7.5])
    job = load_job(_series_job(tmp_path, raw, sample=sample) if sample != "volume" else _job(
        tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}], validate={"max_bad_fraction": 0.9},
        transform={"dicom": {"windows": [{"center": 1000, "width": 3000}],
                             "sample": {"volume": {"spacing": [3, 1, 1], "size": [6, 16, 16]}}}}))
    # three splits; duplicate grouping off, as quick mode has it (it needs pixels), so that the splits compare
    job = replace(job, split=replace(job.split, ratios=(("train", 0.5), ("valid", 0.25), ("test", 0.25)),
                                     duplicates="report", near_enabled=False, near_auto=False))
    full, quick = (validate_job(job, quick=q, scheduler="sync", quiet=True).prepared for q in (False, True))

    def seen(prepared: Any) -> tuple[Any, ...]:
        keys = sorted(prepared.samples.column("key"))
        return (keys, {k: prepared.assignment.split[k] for k in keys},
                sorted((Path(i.path).parent.name, i.reason) for i in prepared.issues))

    assert seen(quick) == seen(full)
    assert {i.reason for i in quick.issues} == {"series_gap", "series_too_short"}
    # volumes: one a series (3 good + the enhanced one); k=1: every slice (3 × 5 + 4 frames); k=2, skip:
    # the 5-slice series' middle slice only, none of the 4 frames
    expected = {"volume": 4, str({"neighbors": 1}): 19, str({"neighbors": 2, "edge": "skip"}): 3}[str(sample)]
    assert len(quick.samples) == expected


def test_of_two_copies_of_one_image_the_smaller_is_left_out_and_the_larger_packed() -> None:
    # a copy cut short (a failed transfer) that sorts first was packed in the whole file's place, and
    # the message told the user to "remove one of them": removing the whole one kept the broken file
    from packer.read.dicom_series import HeaderFingerprint

    def sized(g: SliceGeometry, size: int) -> SliceGeometry:
        return replace(g, fingerprint=HeaderFingerprint(size=size, mtime_ns=0, elements=50))

    files = [(_ref(i), sized(replace(_geometry(2.5 * i), sop_uid=f"1.9.{i}"), 530_000)) for i in range(1, 8)]
    cut = (_ref(0), sized(replace(_geometry(5.0), sop_uid="1.9.2"), 200_000))  # id000: first by sample id
    out = assemble([cut, *files], CFG)
    (series,) = out.series
    assert "id000" not in [r.sample_id for r in series.refs] and "id002" in [r.sample_id for r in series.refs]
    (issue,) = out.issues
    assert issue.sample_id == "id000" and issue.reason == "series_duplicate_position"
    assert issue.message.endswith("not this copy (the series' own records say whether it packed); this copy is "
                                  "200,000 bytes against 530,000, and its header does not say whether its Pixel "
                                  "Data is whole (a compressed syntax, or a file cut short); the larger is kept: "
                                  "remove this one")
    assert assemble([*reversed(files), cut], CFG) == out  # whatever the order


def test_of_two_copies_of_one_image_the_one_that_reads_is_packed_though_a_damaged_copy_is_larger(
        tmp_path: Path) -> None:
    """A fresh-user trial put next to an intact slice a damaged copy of it, its Pixel Data element
    written twice (17,528 bytes against 9,324): the larger copy was kept, and the intact file's
    record said it was "most likely cut short". The copy whose Pixel Data checks out (one element,
    Rows × Columns × Bits Allocated / 8 bytes, ending with the file) is packed; the damaged one's
    record says what is wrong with it."""
    raw = tmp_path / "raw"
    paths = _write_series(raw / "a", seed=3, patient="P1")
    intact = paths[2]
    data = intact.read_bytes()
    pixels = pydicom.dcmread(intact).get_item(0x7FE00010)
    element = data[pixels.value_tell - 12:]  # tag, VR, reserved, length, value (explicit VR little endian)
    damaged = raw / "0-copy" / intact.name  # sorts before the intact file
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(data + element)
    result = _build(_series_job(tmp_path, raw))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert [(r["path"], r["reason"]) for r in bad] == [(str(damaged), "series_duplicate_position")]
    assert bad[0]["message"].endswith(
        f"takes {intact}, not this copy (the series' own records say whether it packed); {intact} ({len(data):,} "
        "bytes) is its header and one whole "
        f"Pixel Data, this copy ({len(data) + len(element):,} bytes) is not: {len(element):,} bytes follow its "
        "Pixel Data (7FE0,0010) (a second Pixel Data element or other bytes after the image): the file is "
        "damaged; remove this one")
    assert json.loads(result.manifest_path.read_text())["inputs"]["samples"] == 6
    # cut short, the copy is still the one left out, and its record says so
    damaged.write_bytes(data[:-100])
    result = _build(_series_job(tmp_path / "cut", raw))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["path"] == str(damaged)
    assert record["message"].endswith("is not: its Pixel Data runs 100 bytes past the end of the file: it is cut "
                                      "short; remove this one")


@pytest.mark.parametrize("orientations", [
    [(1.0, 0.0, 0.0, 0.0, 1.0, 0.0)] * 3,                                        # three parallel scouts
    [(0.0, 1.0, 0.0, 0.0, 0.0, -1.0), (1.0, 0.0, 0.0, 0.0, 0.0, -1.0)],           # a two-plane scout series
])
def test_a_series_of_localizers_only_is_left_out_as_localizers(orientations: list[tuple[float, ...]]) -> None:
    """A scout series holds nothing but localizers (pydicom's own test export has one: a sagittal
    and a coronal scout, Image Type ORIGINAL/PRIMARY/LOCALIZER, in one series). Localizers were
    left out only from among original slices, so a series of them was checked as a stack: three
    parallel scouts packed as 2.5D neighbours, two planes refused as series_orientation, sending
    the user to look for a broken orientation. Each is a localizer, left out as in any series."""
    scout = ("ORIGINAL", "PRIMARY", "LOCALIZER")
    files = [(_ref(i), _geometry(2.5 * i, orientation=o, image_type=scout)) for i, o in enumerate(orientations)]
    out = assemble(files, replace(CFG, min_slices=1))
    assert out.series == ()
    assert sorted((i.sample_id, i.reason) for i in out.issues) == [(r.sample_id, "series_localizer") for r, _ in files]
    assert all("localizer" in i.message and "drop_localizers" in i.message for i in out.issues)
    derived = [(r, replace(g, image_type=("DERIVED", "SECONDARY", "MPR"))) for r, g in files]
    if len(set(orientations)) == 1:  # a series of derived images only (a reformat) is still a stack
        assert len(assemble(derived, replace(CFG, min_slices=1)).series) == 1


def test_a_copys_record_does_not_say_its_series_is_packed_when_the_series_is_refused() -> None:
    """pydicom's test files hold MR_small.dcm in eight encodings, one image (one SOP Instance UID
    and position) exported eight times. Each copy's record said "series ... is packed with
    MR_small_padded.dcm", and that series, one slice, was refused as series_too_short: nothing was
    packed, and the record sent the user looking for samples that do not exist."""
    files = [(_ref(i), replace(_geometry(0.0), sop_uid="1.2.3.4")) for i in range(3)]
    out = assemble(files, CFG)  # min_slices 3: one image is too short a series
    assert out.series == ()
    reasons = sorted((i.sample_id, i.reason) for i in out.issues)
    assert reasons == [("id000", "series_too_short"), ("id001", "series_duplicate_position"),
                       ("id002", "series_duplicate_position")]
    for issue in out.issues:
        if issue.reason == "series_duplicate_position":
            assert "takes /raw/0.dcm" not in issue.message, issue.message
            assert "/raw/0.dcm" in issue.message and "series_too_short" in issue.message, issue.message
    packed = assemble([(_ref(i), replace(_geometry(2.5 * i), sop_uid=f"u{i}")) for i in range(4)]
                      + [(_ref(9), replace(_geometry(0.0), sop_uid="u0"))], CFG)
    (copy,) = packed.issues
    assert copy.reason == "series_duplicate_position" and "takes /raw/0.dcm, not this copy" in copy.message
    # assembled, not yet read: the kept slice may still be refused, so the record does not promise it packed
    assert "is packed" not in copy.message


@pytest.mark.parametrize("sample", [{"neighbors": 1}, {"volume": {"size": [6, 16, 16]}}], ids=["stacks", "volume"])
@pytest.mark.parametrize(("defect", "reason"), [({"Rows": 60000, "Columns": 60000}, "too_large"),
                                                ({"BurnedInAnnotation": "YES"}, "burned_in_annotation")])
@pytest.mark.parametrize(("slices", "held"), [(6, 5), (6, 2), (3, 1)], ids=["top", "middle", "middle-of-short"])
def test_a_series_whose_slice_the_header_check_refuses_is_not_packed_without_it(
        tmp_path: Path, sample: Any, defect: dict[str, Any], reason: str, slices: int, held: int) -> None:
    """A slice refused from its header alone (over limits, burned-in text) was left out of its
    series before assembly, so the series packed one slice short (a volume padded a zero slice
    in its place) with no word; a slice refused while its pixels are read made the series
    series_incomplete. Both now do, wherever the slice lies: a held middle slice made the others
    series_gap (or, in a short series, series_too_short), whose advice cannot help."""
    raw = tmp_path / "raw"
    _write_series(raw / "good", seed=1, patient="G")
    cut = _write_series(raw / "cut", slices=slices, seed=2, patient="A", overrides={held: defect})
    dicom = {"windows": [{"center": 1000, "width": 3000}], "sample": sample}
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                         transform={"dicom": dicom if "volume" in sample else {**dicom, "size": [16, 16]}},
                         validate={"max_bad_fraction": 0.9}))
    records = {Path(r["path"]): r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert set(records) == set(cut)
    top = _reference_order(cut)[held]  # slice i lies at z = 3i
    assert records[top]["reason"] == reason
    for path in cut:
        if path != top:
            assert records[path]["reason"] == "series_incomplete", records[path]
            assert f"another file of its series, {top}, is bad ({reason})" in records[path]["message"]
    packed = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    assert len(packed) == (1 if "volume" in sample else 6)  # the good series' alone


@pytest.mark.parametrize("sample", [{"neighbors": 1}, "volume"])
def test_each_slice_of_a_series_that_fails_its_pixel_read_gets_its_own_record(tmp_path: Path, sample: Any) -> None:
    """Two slices of a series whose modality values overflow float16 (a x40 Rescale Slope): the
    first was non_finite and the second series_incomplete "another file of its series ... is
    bad", hiding that it was broken too (a user who fixed the first met the second next build).
    Each bad slice now has its own record, and the series' other slices name both."""
    raw = tmp_path / "raw"
    paths = _write_series(raw / "a", seed=1, patient="P1", overrides={2: {"RescaleSlope": 40}, 4: {"RescaleSlope": 40}})
    order = _reference_order(paths)
    broken = {order[2], order[4]}
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                         transform={"dicom": {"output": "float16", "sample": sample,
                                              **({} if sample == "volume" else {"size": [16, 16]})}},
                         validate={"max_bad_fraction": 1.0}))
    records = {Path(r["path"]): r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert set(records) == set(paths)
    for path in paths:
        if path in broken:
            assert records[path]["reason"] == "non_finite", records[path]
        else:
            assert records[path]["reason"] == "series_incomplete"
            assert "2 other files of its series are bad: " in records[path]["message"]
            assert all(f"{b} (non_finite)" in records[path]["message"] for b in broken), records[path]["message"]


def test_transform_channels_counts_a_neighbour_stack_s_channels(tmp_path: Path) -> None:
    """``transform.channels`` fixes every sample's channel count: it was applied to each slice
    before the stack, so ``channels: 3`` with one window and one neighbour each side repeated
    every slice's window 3 times and packed 9 channels, and the job-file check counted the windows
    alone. A stack of 3 slices of one window is 3 channels now (each slice's, in order), and a
    count no stack can make is a config error naming the stack."""
    raw = tmp_path / "raw"
    _write_series(raw / "a", seed=1, patient="P1")
    plain = _build(_series_job(tmp_path / "plain", raw))
    three = _build(_series_job(tmp_path / "three", raw, channels=3))
    expected = {item["key"]: item["image"].numpy() for item in ShardDataset(plain.manifest_path, "train",
                                                                            shuffle=False)}
    packed = {item["key"]: item["image"].numpy() for item in ShardDataset(three.manifest_path, "train",
                                                                         shuffle=False)}
    assert set(packed) == set(expected) and len(packed) == 6
    for key, image in packed.items():
        assert image.shape == (3, 16, 16) and np.array_equal(image, expected[key])
    with pytest.raises(ConfigError, match=r"transform.dicom.windows: gives 9 channel\(s\).*times the stack's 3 "
                                          r"slices, make 3 channels"):
        load_job(_series_job(tmp_path / "nine", raw, channels=3, windows=["lung", "mediastinum", "bone_body"]))


def test_a_derived_image_left_out_of_its_series_is_told_how_to_pack_derived_images() -> None:
    """A DERIVED image left out of a series was told to pack localizers (where: {ImageType:
    LOCALIZER}), which selects no derived file."""
    files = [(_ref(i), _geometry(2.5 * i)) for i in range(5)]
    files.append((_ref(9), _geometry(1.0, image_type=("DERIVED", "SECONDARY", "MIP"))))
    from packer.read.dicom_kind import _localizers_left_out

    (left,) = _localizers_left_out(assemble(files, CFG).issues, drop=True,
                                   headers={ref.sample_id: geometry for ref, geometry in files})
    assert isinstance(left, Excluded) and left.why == "not_requested"
    assert "where: {ImageType: DERIVED}" in left.detail and "LOCALIZER}" not in left.detail


def test_of_two_whole_copies_of_one_image_neither_is_called_cut_short(tmp_path: Path) -> None:
    """One image exported twice, Explicit and Implicit VR Little Endian (a few bytes smaller: no VRs),
    both whole: the smaller's record said 'most likely cut short'. And a copy ending with a Data Set
    Trailing Padding element (PS3.10 7.2; pydicom's CT_small.dcm has one) was 'damaged', so a
    smaller lossy copy could be packed in the lossless one's place."""
    raw = tmp_path / "raw"
    paths = _write_series(raw / "a", seed=4, patient="P1")
    implicit = raw / "0-implicit" / paths[2].name  # sorts first
    implicit.parent.mkdir(parents=True)
    ds = pydicom.dcmread(paths[2])
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ImplicitVRLittleEndian
    ds.save_as(implicit, implicit_vr=True, little_endian=True, enforce_file_format=True)
    assert implicit.stat().st_size < paths[2].stat().st_size
    result = _build(_series_job(tmp_path, raw))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["path"] == str(implicit) and "cut short" not in record["message"]
    assert "both copies are whole" in record["message"]
    # the explicit copy with trailing padding: still whole, and (larger) still the one kept
    padded = ds.copy()
    padded.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    padded.add_new(0xFFFCFFFC, "OB", b"\0" * 64)
    padded.save_as(paths[2], implicit_vr=False, little_endian=True, enforce_file_format=True)
    result = _build(_series_job(tmp_path / "padded", raw))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["path"] == str(implicit) and "damaged" not in record["message"], record["message"]
    assert "both copies are whole" in record["message"]


def test_a_slice_replaced_between_the_header_and_pixel_passes_is_not_stacked_with_its_old_series(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Series are assembled from the header pass; a slice overwritten before the pixel pass (with
    another patient's slice) was probed again and packed as that patient's, while its old
    series' stacks took its new pixels: a cross-split leak with no record. A file that changed
    since its placement is now a bad sample saying so, and its series is refused with it."""
    import shutil

    import packer.pipeline.pixels as pixels

    raw = tmp_path / "raw"
    first = _write_series(raw / "a", slices=4, seed=1, patient="P1")
    other = _write_series(raw / "b", slices=4, seed=2, patient="P2")
    victim, intruder = sorted(first)[0], sorted(other)[0]
    assemble_groups = pixels._assemble_groups

    def then_overwritten(*args: Any, **kwargs: Any) -> Any:
        placed = assemble_groups(*args, **kwargs)
        shutil.copyfile(intruder, victim)  # after the header pass placed it, before its pixels are read
        return placed

    monkeypatch.setattr(pixels, "_assemble_groups", then_overwritten)
    result = _build(_series_job(tmp_path, raw))
    bad = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert bad[victim.name]["reason"] == "unreadable", bad
    assert "the file changed while the build ran (" in bad[victim.name]["message"]  # its size, or its mtime
    assert {bad[p.name]["reason"] for p in first if p != victim} == {"series_incomplete"}
    entities = {item["record"]["entity_id"] for split in ("train", "valid", "test")
                for item in ShardDataset(result.manifest_path, split, shuffle=False, records=True)}
    assert len(entities) == 1  # P2's series alone, never P1's stacks holding P2's pixels


@pytest.mark.parametrize("sample", [{"neighbors": 1}, "volume"])
def test_a_time_split_dropping_straddlers_packs_no_later_slice_in_an_earlier_split(tmp_path: Path,
                                                                                     sample: Any) -> None:
    """A scan that runs past midnight into the valid cutoff's day, under ``drop_straddlers``: a
    neighbour stack or a volume is timed by its latest slice, so none of the slices acquired
    after the cutoff is packed in train, not even as the neighbour of an earlier slice (a
    walkthrough found slice 2's pixels in slice 1's train stack); a volume holding one is left
    out whole. Slice 1, itself before the cutoff, still packs as slice 0's neighbour; its own
    stack reaches slice 2 and is left out, its record saying why. The entity's other, earlier
    series packs whole in train."""
    raw = tmp_path / "raw"
    times = ["20231231235950", "20231231235955", "20240101000001", "20240101000004", "20240101000007"]
    late = _write_series(raw / "a", slices=5, seed=3, patient="P1",
                         overrides={i: {"AcquisitionDateTime": t} for i, t in enumerate(times)})
    _write_series(raw / "b", slices=5, seed=4, patient="P1", series_uid="1.2.826.0.1.99.2",
                  overrides={i: {"AcquisitionDateTime": f"2023060110000{i}"} for i in range(5)})
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none", "time": ["AcquisitionDateTime"]}],
               split={"by": "time", "cutoffs": {"valid": "2024-01-01", "test": "2024-07-01"},
                      "entity_policy": "drop_straddlers"},
               transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": sample,
                                    **({"size": [16, 16]} if sample != "volume" else {})}})
    result = _build(job)
    splits = result.manifest["splits"]
    excluded = {r["sample_id"]: r for r in read_excluded(result.version_dir / "excluded.jsonl")}
    if sample == "volume":  # the late scan, timed by its latest slice, falls in valid: its entity is in train
        assert splits["train"]["samples"] == 1 and splits["valid"]["samples"] == 0
        assert sorted(r["path"] for r in excluded.values()) == sorted(str(p) for p in late)  # one record a file
        assert all("2024-01-01T00:00:07 (the latest of its volume's slices: the volume, every file" in r["detail"]
                   for r in excluded.values())
        return
    rows_of = {_key_of(job, path): i for i, path in enumerate(_reference_order(late))}  # slice → its bright row
    for item in ShardDataset(result.manifest_path, "train", shuffle=False):
        image = item["image"].numpy().astype(np.float64)
        if item["key"] in rows_of:
            bright = {int(np.argmax(image[c].mean(axis=1))) for c in range(image.shape[0])}
            assert bright <= {0, 1}, (rows_of[item["key"]], bright)  # slices 2-4 come after the cutoff
    left = {rows_of[k] for k, r in excluded.items() if r["why"] == "straddles_cutoff"}
    assert left == {1, 2, 3, 4}
    one = next(r for k, r in excluded.items() if rows_of[k] == 1)
    assert "2024-01-01T00:00:01" in one["detail"] and "latest of the slices its sample stacks" in one["detail"]


def test_stations_that_overlap_by_a_few_slices_still_split_into_their_own_stacks() -> None:
    """A whole-body scan's stations overlap by a few slices at other positions (station 1 at
    0-38 mm, station 2 at 33-71 mm, 2 mm steps): the interleave rule refused such a series whole
    once it failed as one stack, where each station is a stack of its own, as before that rule."""
    one = [2.0 * i for i in range(20)]
    two = [33.0 + 2.0 * i for i in range(20)]
    files = ([(_ref(i), replace(_geometry(z), acquisition="1")) for i, z in enumerate(one)]
             + [(_ref(100 + i), replace(_geometry(z), acquisition="2")) for i, z in enumerate(two)])
    out = assemble(files, CFG)
    assert [len(s.slices) for s in out.series] == [20, 20], [i.message for i in out.issues[:2]]
