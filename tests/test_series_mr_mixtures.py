"""MR series that hold several images of each position (echoes, b-values, magnitude and phase,
temporal positions, a Siemens DWI's derived trace images beside its b0): one stack cannot hold
them, and the record says what tells the images apart and the ``where:`` that keeps one of them.

Vendors export such a series one SOP Instance per image under one Series Instance UID and one
Acquisition Number; the images at a position differ only in the header attribute of their
contrast. A derived image at an original slice's own place on the series' grid is such a second
image, not a reformat or a projection to leave out.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import MRImageStorage

from packer.badsamples import read_bad_samples
from packer.config import SeriesConfig
from packer.exclusions import read_excluded
from packer.loader import ShardDataset
from packer.read.dicom_kind import _localizers_left_out
from packer.read.dicom_series import IMAGE_IDENTITY, SliceGeometry
from packer.read.series import assemble
from packer.records import Excluded, SampleRef
from tests.dicom_files import image_dataset, save
from tests.test_targets import _build, _job

AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
SAGITTAL = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)
CFG = SeriesConfig(gap_tolerance=0.1, drop_localizers=True, min_slices=3)
B0 = ("ORIGINAL", "PRIMARY", "DIFFUSION", "NONE", "ND", "NORM")
TRACE = ("DERIVED", "PRIMARY", "DIFFUSION", "TRACEW", "ND", "NORM")


def _ref(i: int) -> SampleRef:
    return SampleRef(sample_id=f"id{i:03d}", source="mr", kind="dicom", path=f"/raw/{i}.dcm", relpath=f"{i}.dcm",
                     label="", entity="P1")


def _geometry(z: float, *, number: int, image_type: tuple[str, ...] = ("ORIGINAL", "PRIMARY", "M", "ND"),
              orientation: tuple[float, ...] = AXIAL, rows: int = 16, acquisition: str = "1",
              **identity: str) -> SliceGeometry:
    """One single-frame MR image at ``z`` mm along the normal, its own SOP Instance UID, and the
    :data:`IMAGE_IDENTITY` values ``identity`` gives (Instance Number ``number``)."""
    normal = np.cross(orientation[:3], orientation[3:])
    p = np.array([-4.0, -4.0, 0.0]) + z * normal
    values = {"InstanceNumber": str(number), **identity}
    return SliceGeometry(study_uid="1.2.3", series_uid="S1", frame_of_reference="9",
                         positions=((float(p[0]), float(p[1]), float(p[2])),), orientation=orientation, rows=rows,
                         columns=16, spacing=(1.0, 1.0), image_type=image_type, acquisition=acquisition,
                         sop_uid=f"1.2.3.{number}", identity=tuple(values.get(k, "") for k in IMAGE_IDENTITY))


def _mixture(per_image: list[dict[str, Any]], slices: int = 4) -> list[tuple[SampleRef, SliceGeometry]]:
    """``slices`` positions 3 mm apart, each holding one image of every entry of ``per_image``
    (keyword arguments of :func:`_geometry`)."""
    files = []
    for n, attrs in enumerate(per_image):
        for z in range(slices):
            number = n * slices + z + 1
            files.append((_ref(number), _geometry(3.0 * z, number=number, **attrs)))
    return files


@pytest.mark.parametrize(("images", "told", "fix"), [
    ([{"EchoNumbers": "1", "EchoTime": "10"}, {"EchoNumbers": "2", "EchoTime": "20"}],
     ["EchoNumbers 1 against 2", "EchoTime 10 against 20"], "where: {EchoNumbers: 1}"),
    ([{"DiffusionBValue": "0"}, {"DiffusionBValue": "1000"}], ["DiffusionBValue 0 against 1000"],
     "where: {DiffusionBValue: 0}"),
    ([{"image_type": ("ORIGINAL", "PRIMARY", "M", "ND")}, {"image_type": ("ORIGINAL", "PRIMARY", "P", "ND")}],
     ["ImageType ORIGINAL\\PRIMARY\\M\\ND against ORIGINAL\\PRIMARY\\P\\ND"], "where: {ImageType: M}"),
    ([{"TemporalPositionIdentifier": "1"}, {"TemporalPositionIdentifier": "2"}],
     ["TemporalPositionIdentifier 1 against 2"], "where: {TemporalPositionIdentifier: 1}"),
], ids=["echoes", "b-values", "magnitude-phase", "phases"])
def test_images_of_one_position_told_apart_by_their_header_are_named_with_the_where_that_keeps_one(
        images: list[dict[str, Any]], told: list[str], fix: str) -> None:
    """Two echoes (a UID per image, one Acquisition Number) were refused saying "one file twice in
    the export, or two acquisitions in one series": neither is so, and the fix went unsaid."""
    out = assemble(_mixture(images), CFG)
    assert out.series == () and len(out.issues) == 8
    assert {i.reason for i in out.issues} == {"series_duplicate_position"}
    for issue in out.issues:
        assert "one file twice in the export, or two acquisitions" not in issue.message
        assert all(fact in issue.message for fact in told), issue.message
        assert fix in issue.message, issue.message
        assert "InstanceNumber" not in issue.message  # every two files differ in it: it tells no contrast apart


def test_two_images_of_one_position_that_nothing_tells_apart_are_still_called_a_copy_or_an_acquisition() -> None:
    """Where the headers differ in nothing but the Instance Number (a file exported twice under two
    UIDs), the record says what it said: the cause is not in the header."""
    files = [(_ref(z + 1), _geometry(3.0 * z, number=z + 1)) for z in range(4)]
    files.append((_ref(9), _geometry(3.0, number=9)))
    out = assemble(files, CFG)
    assert {i.reason for i in out.issues} == {"series_duplicate_position"}
    assert all("one file twice in the export, or two acquisitions in one series" in i.message for i in out.issues)
    assert not any("where:" in i.message for i in out.issues)


def _mr(folder: Path, name: str, z: float, number: int,
        image_type: tuple[str, ...] = ("ORIGINAL", "PRIMARY", "M", "ND"), **attrs: Any) -> Dataset:
    """A single-frame MR image of series 1.2.826.0.1.2 at ``z`` mm (axial), its own SOP Instance
    UID, Acquisition Number 1, written to ``folder/name``; ``attrs``: more elements."""
    pixels = np.random.default_rng(number).integers(0, 1000, (16, 16)).astype(np.uint16)
    ds = image_dataset(pixels, modality="MR", sop_class=MRImageStorage, PatientID="P1",
                       StudyInstanceUID="1.2.826.0.1.1", SeriesInstanceUID="1.2.826.0.1.2",
                       ImageType=list(image_type), ImageOrientationPatient=list(AXIAL),
                       ImagePositionPatient=[0.0, 0.0, z], PixelSpacing=[1.0, 1.0], SliceThickness=3.0,
                       InstanceNumber=number, AcquisitionNumber=1, **attrs)
    save(ds, folder / name)
    return ds


def _volume_job(tmp: Path, raw: Path, where: dict[str, Any] | None = None) -> Path:
    source: dict[str, Any] = {"kind": "dicom", "root": str(raw), "label": "none", **({"where": where} if where else {})}
    return _job(tmp, [source], transform={"dicom": {"output": "float16", "sample": "volume"}},
                validate={"max_bad_fraction": 1.0})


def _packed(job: Path) -> list[dict[str, Any]]:
    return list(ShardDataset(_build(job).manifest_path, "train", shuffle=False, records=True))


def _sums(raw: Path, prefix: str) -> list[float]:
    """Each file ``raw/<prefix>*.dcm``'s pixel sum, sorted: the slices a volume of them holds, in any order or flip."""
    return sorted(float(pydicom.dcmread(p).pixel_array.sum()) for p in raw.glob(f"{prefix}*.dcm"))


def _slices(volume: dict[str, Any]) -> list[float]:
    return sorted(float(volume["image"][0, d].double().sum()) for d in range(volume["image"].shape[1]))


def test_a_two_echo_export_is_refused_naming_echo_numbers_and_packs_one_echo_by_the_where_it_names(
        tmp_path: Path) -> None:
    """A two-echo series written one file per image (Echo Numbers 1 and 2 at each of 5 positions):
    each record names the echoes and where: {EchoNumbers: 1}, which packs the first echo's volume."""
    raw = tmp_path / "raw"
    for echo in (1, 2):
        for z in range(5):
            _mr(raw, f"echo{echo}_{z}.dcm", 3.0 * z, 5 * echo + z, EchoNumbers=echo, EchoTime=10.0 * echo)
    result = _build(_volume_job(tmp_path / "all", raw))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert len(bad) == 10 and {r["reason"] for r in bad} == {"series_duplicate_position"}
    assert all("EchoNumbers 1 against 2" in r["message"] and "where: {EchoNumbers: 1}" in r["message"] for r in bad)
    (volume,) = _packed(_volume_job(tmp_path / "one", raw, {"EchoNumbers": 1}))
    assert tuple(volume["image"].shape) == (1, 5, 16, 16) and _slices(volume) == _sums(raw, "echo1_")


def test_a_derived_trace_stack_at_the_b0_slices_positions_is_a_second_image_of_each_not_a_reformat() -> None:
    """Siemens writes a DWI's b0 images ORIGINAL and its b1000 trace images DERIVED ... TRACEW, in
    one series at the same positions: the trace images were left out as reformats and the b0
    stack packed alone, with no bad sample. They are refused together, naming ImageType."""
    out = assemble(_mixture([{"image_type": B0}, {"image_type": TRACE}]), CFG)
    assert out.series == () and len(out.issues) == 8
    assert {i.reason for i in out.issues} == {"series_duplicate_position"}
    for issue in out.issues:
        assert "ImageType ORIGINAL\\PRIMARY\\DIFFUSION\\NONE\\ND\\NORM against DERIVED" in issue.message
        assert "where: {ImageType: ORIGINAL}" in issue.message and "{ImageType: TRACEW}" in issue.message
    # the same without drop_localizers: the same reason, not series_localizer
    strict = assemble(_mixture([{"image_type": B0}, {"image_type": TRACE}]), replace(CFG, drop_localizers=False))
    assert {i.reason for i in strict.issues} == {"series_duplicate_position"}


@pytest.mark.parametrize("case", ["lone", "other-plane", "between", "other-grid", "thick-slabs", "thin-recon"])
def test_derived_images_off_the_originals_places_are_still_left_out(case: str) -> None:
    """A lone derived image (a MIP) at a slice's position, derived images in another plane, derived
    images between the original slices, or on another grid (a reformat) are not second images of
    the original slices: left out, and the originals pack."""
    files = [(_ref(z + 1), _geometry(3.0 * z, number=z + 1)) for z in range(4 if case != "thick-slabs" else 12)]
    mpr = ("DERIVED", "SECONDARY", "MPR")
    derived = {"lone": [_geometry(3.0, number=20, image_type=mpr)],
               "other-plane": [_geometry(3.0 * z, number=20 + z, image_type=mpr, orientation=SAGITTAL)
                               for z in range(4)],
               "between": [_geometry(3.0 * z + 1.5, number=20 + z, image_type=mpr) for z in range(3)],
               "other-grid": [_geometry(3.0 * z, number=20 + z, image_type=mpr, rows=32) for z in range(4)],
               # thick same-plane slabs on the originals' grid, centred on every fifth slice: a few of
               # the positions, not a second image of each (they refused the whole series)
               "thick-slabs": [_geometry(3.0 * z, number=20 + z, image_type=mpr) for z in (2, 7)],
               # a thin same-plane reformat 1 mm apart over 3 mm slices: every third image meets a slice,
               # each slice is met, but most of the reformat lies between them (it refused the series)
               "thin-recon": [_geometry(float(z), number=20 + z, image_type=mpr) for z in range(10)]}[case]
    files += [(_ref(20 + n), g) for n, g in enumerate(derived)]
    out = assemble(files, CFG)
    (series,) = out.series
    originals = 4 if case != "thick-slabs" else 12
    assert [r.sample_id for r in series.refs] == [f"id{z + 1:03d}" for z in range(originals)]
    assert {i.reason for i in out.issues} == {"series_localizer"} and len(out.issues) == len(derived)


def test_a_derived_image_left_out_is_told_a_volume_job_takes_it_by_image_type() -> None:
    """The record of a derived image left out sent the user to sample: slice, though a volume job
    with where: {ImageType: ...} stacks derived images as a series of their own."""
    files = [(_ref(z + 1), _geometry(3.0 * z, number=z + 1)) for z in range(4)]
    files.append((_ref(9), _geometry(1.0, number=9, image_type=("DERIVED", "SECONDARY", "MIP"))))
    (left,) = _localizers_left_out(assemble(files, CFG).issues, drop=True,
                                   headers={ref.sample_id: geometry for ref, geometry in files})
    assert isinstance(left, Excluded) and left.why == "not_requested"
    assert "where: {ImageType: DERIVED}" in left.detail and "sample: slice" not in left.detail


def _dwi(folder: Path) -> None:
    """A Siemens DWI trace series as exported: 5 b0 images (ORIGINAL) and 5 b1000 trace images
    (DERIVED ... TRACEW) at the same positions, one Series Instance UID and Acquisition Number,
    each image its own SOP Instance; the b-value only in the Siemens private header."""
    for n, (image_type, b) in enumerate(((B0, 0), (TRACE, 1000))):
        for z in range(5):
            ds = _mr(folder, f"b{b}_{z}.dcm", 3.0 * z, 5 * n + z + 1, image_type)
            ds.private_block(0x0019, "SIEMENS MR HEADER", create=True).add_new(0x0C, "IS", b)  # B_value
            save(ds, folder / f"b{b}_{z}.dcm")


def test_a_siemens_dwi_trace_series_is_refused_as_a_whole_and_packs_by_image_type(tmp_path: Path) -> None:
    """Packed with sample: volume, the series made a b0-only volume and left the 5 trace images
    out as reformats telling the user to use sample: slice. Each file is now a bad sample naming
    ImageType; where: {ImageType: TRACEW} packs the trace stack as a volume, ORIGINAL the b0 stack."""
    raw = tmp_path / "raw"
    _dwi(raw)
    result = _build(_volume_job(tmp_path / "all", raw))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert len(bad) == 10 and {r["reason"] for r in bad} == {"series_duplicate_position"}
    assert all("ImageType" in r["message"] and "{ImageType: TRACEW}" in r["message"] for r in bad)
    assert not (result.version_dir / "excluded.jsonl").exists() or not read_excluded(
        result.version_dir / "excluded.jsonl")
    for wanted, name in (("TRACEW", "b1000"), ("ORIGINAL", "b0")):
        (volume,) = _packed(_volume_job(tmp_path / wanted, raw, {"ImageType": wanted}))
        assert tuple(volume["image"].shape) == (1, 5, 16, 16) and _slices(volume) == _sums(raw, f"{name}_")
