"""Series that hold a fourth dimension: images of one place told apart by a time, a frame or an
energy, and contrasts whose slices interleave.

Every file here is a real DICOM file (written with pydicom, read back by packer's header reader,
or built into shards end to end). Two kinds of series went wrong:

- a dynamic PET's frames (Frame Reference Time, PS3.3 C.8.9.4), a CT perfusion's time points
  (Acquisition Time and Content Time only) and a dual-energy CT's two tube voltages (KVP) at the
  same positions were refused as "one file twice in the export, or two acquisitions in one
  series", naming nothing that tells the images apart and no ``where:`` that keeps one;
- two echoes (or temporal positions, or b-values) of one series whose slices interleave (echo 1
  at 0, 3, 6 mm, echo 2 at 1.5, 4.5 mm) were packed as one volume alternating the two contrasts,
  silently: they are refused as ``series_mixed``, naming the attribute, its values and the
  ``where:`` that keeps one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import CTImageStorage, MRImageStorage, PositronEmissionTomographyImageStorage

from packer.badsamples import read_bad_samples
from packer.config import SeriesConfig
from packer.loader import ShardDataset
from packer.read.dicom_series import slice_geometry
from packer.read.series import Assembled, assemble
from packer.records import SampleRef
from tests.dicom_files import image_dataset, save
from tests.test_targets import _build, _job

CFG = SeriesConfig(gap_tolerance=0.1, drop_localizers=True, min_slices=3)
AXIAL = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
CLASSES = {"PT": PositronEmissionTomographyImageStorage, "CT": CTImageStorage, "MR": MRImageStorage}


def _write(path: Path, modality: str, z: float, number: int, **attrs: Any) -> Dataset:
    """One single-frame axial image of series 1.2.826.0.4.2 at ``z`` mm, its own SOP Instance UID
    and a pixel level of its own (``number`` × 100, plus 0 or 1 in a checkerboard: no slice is
    constant): ``attrs`` more elements."""
    pixels = (100 * number + np.indices((8, 8)).sum(axis=0) % 2).astype(np.uint16)
    ds = image_dataset(pixels, modality=modality, sop_class=CLASSES[modality], PatientID="P1",
                       StudyInstanceUID="1.2.826.0.4.1", SeriesInstanceUID="1.2.826.0.4.2",
                       FrameOfReferenceUID="1.2.826.0.4.3", ImageOrientationPatient=AXIAL,
                       ImagePositionPatient=[0.0, 0.0, z], PixelSpacing=[1.0, 1.0], InstanceNumber=number, **attrs)
    save(ds, path)
    return ds


def _assembled(folder: Path) -> Assembled:
    """The series of the files under ``folder`` as the header pass reads them."""
    files = []
    for n, path in enumerate(sorted(folder.glob("*.dcm"))):
        ref = SampleRef(sample_id=f"id{n:03d}", source="s", kind="dicom", path=str(path), relpath=path.name,
                        label="", entity="P1")
        files.append((ref, slice_geometry(pydicom.dcmread(path, stop_before_pixels=True))))
    return assemble(files, CFG)


def _dynamic_pet(folder: Path) -> Path:
    """A dynamic PET series of 2 frames (Frame Reference Time 0 and 60000 ms, each 60 s long) at
    the same 5 positions 4 mm apart; each frame's Acquisition Time differs too."""
    n = 0
    for frame in range(2):
        for z in range(5):
            n += 1
            _write(folder / f"f{n:02d}.dcm", "PT", 4.0 * z, n, ImageType=["ORIGINAL", "PRIMARY"], Units="BQML",
                   SeriesType=["DYNAMIC", "IMAGE"], FrameReferenceTime=60000.0 * frame, ActualFrameDuration=60000,
                   NumberOfTimeSlices=2, AcquisitionTime=f"12{frame:02d}00", ContentTime=f"12{frame:02d}00",
                   RescaleSlope=0.5 + 0.01 * n, RescaleIntercept=0)
    return folder


def _perfusion(folder: Path) -> Path:
    """A CT perfusion of 2 time points at the same 5 positions, one Acquisition Number, told apart
    by Acquisition Time and Content Time only."""
    n = 0
    for tp in range(2):
        for z in range(5):
            n += 1
            _write(folder / f"f{n:02d}.dcm", "CT", 5.0 * z, n, ImageType=["ORIGINAL", "PRIMARY", "AXIAL"],
                   ConvolutionKernel="B20f", AcquisitionNumber=1, AcquisitionTime=f"1200{2 * tp:02d}",
                   ContentTime=f"1200{2 * tp:02d}", RescaleSlope=1, RescaleIntercept=-1024)
    return folder


def _dual_energy(folder: Path) -> Path:
    """A dual-energy CT: 80 kV and 140 kV images at each of 5 positions, one Image Type, kernel,
    Acquisition Number and time: KVP alone tells them apart."""
    n = 0
    for kv in (80, 140):
        for z in range(5):
            n += 1
            _write(folder / f"f{n:02d}.dcm", "CT", 2.5 * z, n, ImageType=["ORIGINAL", "PRIMARY", "AXIAL"],
                   ConvolutionKernel="Qr40", AcquisitionNumber=1, AcquisitionTime="120000", KVP=kv,
                   RescaleSlope=1, RescaleIntercept=-1024)
    return folder


def _messages(out: Assembled, reason: str) -> list[str]:
    assert out.series == () and out.issues, out
    assert {i.reason for i in out.issues} == {reason}, [i.message for i in out.issues]
    return [i.message for i in out.issues]


def test_a_dynamic_pets_frames_at_one_position_are_named_by_frame_reference_time(tmp_path: Path) -> None:
    """Two frames of a dynamic PET were "one file twice in the export, or two acquisitions in one
    series": Frame Reference Time tells them apart (the Acquisition Time that differs too is not
    needed to say so), and where: {FrameReferenceTime: 0.0} keeps the first frame."""
    messages = _messages(_assembled(_dynamic_pet(tmp_path / "pet")), "series_duplicate_position")
    assert len(messages) == 10
    for message in messages:
        assert "one file twice in the export" not in message
        assert "FrameReferenceTime 0.0 against 60000.0" in message or "FrameReferenceTime 60000.0 against 0.0" \
            in message, message
        assert "where: {FrameReferenceTime: " in message
        assert "AcquisitionTime" not in message  # a time is named only where nothing else tells them apart


def test_a_ct_perfusions_time_points_are_named_by_their_times_and_the_where_keeps_one(tmp_path: Path) -> None:
    """A CT perfusion's time points differ in Acquisition Time and Content Time only: the record
    names both, suggests the where: on the time (quoted, as a time is text: 070000 would be a YAML
    octal number), and says that such a where: keeps one time point."""
    messages = _messages(_assembled(_perfusion(tmp_path / "ct")), "series_duplicate_position")
    for message in messages:
        assert "one file twice in the export" not in message
        assert "AcquisitionTime 120000 against 120002" in message or "AcquisitionTime 120002 against 120000" \
            in message, message
        assert "ContentTime 1200" in message
        assert "where: {AcquisitionTime: '1200" in message
        assert "one time point" in message


def test_a_dual_energy_cts_two_voltages_are_named_by_kvp(tmp_path: Path) -> None:
    messages = _messages(_assembled(_dual_energy(tmp_path / "de")), "series_duplicate_position")
    for message in messages:
        assert "one file twice in the export" not in message
        assert "KVP 80.0 against 140.0" in message or "KVP 140.0 against 80.0" in message, message
        assert "where: {KVP: " in message


def test_a_copy_whose_times_were_rewritten_is_still_one_image_exported_twice(tmp_path: Path) -> None:
    """Times tell two images apart only where their SOP Instance UIDs do too: a copy of a slice (its
    UID and position) whose Acquisition and Content Times a de-identifier rewrote is left out as a
    copy, and the series packs, as before; a copy whose Frame Reference Time differs is another frame
    under a shared UID, and the series is refused naming it."""
    n = 0
    for z in range(4):
        n += 1
        ds = _write(tmp_path / "ct" / f"f{n:02d}.dcm", "CT", 2.0 * z, n, AcquisitionTime="120000", KVP=120,
                    ContentTime="120000", RescaleSlope=1, RescaleIntercept=-1024)
    ds.AcquisitionTime, ds.ContentTime = "083000", "083000"
    save(ds, tmp_path / "ct" / "f99.dcm")
    out = _assembled(tmp_path / "ct")
    assert len(out.series) == 1 and len(out.series[0].slices) == 4
    assert [i.reason for i in out.issues] == ["series_duplicate_position"]
    assert "one file twice in the export" in out.issues[0].message
    ds.FrameReferenceTime = 60000.0
    save(ds, tmp_path / "ct" / "f99.dcm")
    messages = _messages(_assembled(tmp_path / "ct"), "series_duplicate_position")
    assert all("one SOP Instance UID shared by different images" in m and "FrameReferenceTime (none) against 60000.0"
               in m for m in messages), messages


def test_the_where_a_dynamic_and_a_perfusion_record_names_packs_one_volume_of_five_slices(tmp_path: Path) -> None:
    """End to end: the series are refused whole, and each where: the records name packs one frame
    (one time point) as a volume of its 5 slices."""
    pet, ct = _dynamic_pet(tmp_path / "pet"), _perfusion(tmp_path / "ct")
    for name, raw, where in (("pet", pet, {"FrameReferenceTime": 0.0}), ("ct", ct, {"AcquisitionTime": "120002"})):
        job = _job(tmp_path / f"all_{name}", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                   transform={"dicom": {"output": "float16", "sample": "volume"}},
                   validate={"max_bad_fraction": 1.0})
        bad = read_bad_samples(_build(job).version_dir / "bad_samples.jsonl")
        assert len(bad) == 10 and {r["reason"] for r in bad} == {"series_duplicate_position"}
        assert all(next(iter(where)) in r["message"] for r in bad)
        job = _job(tmp_path / f"one_{name}", [{"kind": "dicom", "root": str(raw), "label": "none", "where": where}],
                   transform={"dicom": {"output": "float16", "sample": "volume"}})
        (volume,) = ShardDataset(str(_build(job).manifest_path), "train", shuffle=False, records=True)
        assert tuple(volume["image"].shape) == (1, 5, 8, 8)


# --- contrasts whose slices interleave ------------------------------------------------------------

def _interleaved(folder: Path, told: str, values: tuple[Any, Any], **extra: Any) -> Path:
    """An MR series of two images (``told`` ``values[0]`` and ``values[1]``) whose slices interleave:
    the first at 0, 3, 6, 9, 12 mm, the second at 1.5, 4.5, 7.5, 10.5, 13.5 mm; one Acquisition
    Number, one Image Type."""
    n = 0
    for e, value in enumerate(values):
        for z in range(5):
            n += 1
            _write(folder / f"f{n:02d}.dcm", "MR", 1.5 * e + 3.0 * z, n, ImageType=["ORIGINAL", "PRIMARY", "M", "ND"],
                   AcquisitionNumber=1, SliceThickness=1.5, **{told: value}, **extra)
    return folder


@pytest.mark.parametrize(("told", "values", "named", "fix"), [
    ("EchoNumbers", (1, 2), "EchoNumbers 1 (5 files", "where: {EchoNumbers: 1}"),
    ("TemporalPositionIdentifier", (1, 2), "TemporalPositionIdentifier 1 (5 files",
     "where: {TemporalPositionIdentifier: 1}"),
    ("DiffusionBValue", (0.0, 1000.0), "DiffusionBValue 0.0 (5 files", "where: {DiffusionBValue: 0.0}"),
], ids=["echoes", "temporal-positions", "b-values"])
def test_interleaved_contrasts_of_one_series_are_refused_naming_the_attribute_its_values_and_the_where(
        tmp_path: Path, told: str, values: tuple[Any, Any], named: str, fix: str) -> None:
    """They were stacked as one volume of 10 slices alternating the two contrasts, with no record."""
    messages = _messages(_assembled(_interleaved(tmp_path / "mr", told, values)), "series_mixed")
    assert len(messages) == 10
    for message in messages:
        assert named in message and f"{values[1]} (5 files" in message, message
        assert fix in message, message
        assert "the series is not packed" in message


def test_two_echoes_that_interleave_are_refused_end_to_end_and_the_where_packs_one_echo(tmp_path: Path) -> None:
    """The repro: echo 1 (bright) and echo 2 (dark) interleaved; refused as series_mixed, and
    where: {EchoNumbers: 1} packs echo 1's 5 slices, every one bright."""
    raw = _interleaved(tmp_path / "mr", "EchoNumbers", (1, 2), EchoTime=5.0)
    job = _job(tmp_path / "all", [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"output": "float16", "sample": "volume"}}, validate={"max_bad_fraction": 1.0})
    result = _build(job)
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert len(bad) == 10 and {r["reason"] for r in bad} == {"series_mixed"}
    job = _job(tmp_path / "one", [{"kind": "dicom", "root": str(raw), "label": "none", "where": {"EchoNumbers": 1}}],
               transform={"dicom": {"output": "float16", "sample": "volume"}})
    (volume,) = ShardDataset(str(_build(job).manifest_path), "train", shuffle=False, records=True)
    assert tuple(volume["image"].shape) == (1, 5, 8, 8)
    levels = sorted(int(float(volume["image"][0, d].float().mean())) for d in range(5))
    assert levels == [100, 200, 300, 400, 500]  # files 1-5: echo 1's, none of echo 2's (600-1000)


def test_series_of_one_contrast_whose_other_values_vary_still_pack(tmp_path: Path) -> None:
    """The rule looks at Echo Numbers, Temporal Position Identifier and Diffusion b-value alone,
    and at values written: an Echo Numbers on some slices only, an Echo Numbers written 1 on one slice
    and 01 on another, an Echo Time that drifts, a Trigger Time per slice (a gated scan), a
    Frame Reference Time per bed position (a static whole-body PET, whose beds start at different
    times: PS3.3 C.8.9.4.1.5), and MR concatenations (every other slice another Acquisition Number)
    are each one stack."""
    cases: dict[str, list[dict[str, Any]]] = {
        "echo-on-some": [{"EchoNumbers": 1} if z % 2 else {} for z in range(6)],
        "echo-spelt-twice": [{"EchoNumbers": "1" if z % 2 else "01"} for z in range(6)],
        "echo-time-drifts": [{"EchoNumbers": 1, "EchoTime": 10.0 + 0.01 * z} for z in range(6)],
        "trigger-per-slice": [{"TriggerTime": 100.0 * z} for z in range(6)],
        "pet-beds": [{"FrameReferenceTime": 0.0 if z < 3 else 180000.0} for z in range(6)],
        "concatenations": [{"AcquisitionNumber": 1 + z % 2, "EchoNumbers": 1} for z in range(6)],
    }
    for case, per_slice in cases.items():
        folder = tmp_path / case
        for z, attrs in enumerate(per_slice):
            modality = "PT" if case == "pet-beds" else "MR"
            _write(folder / f"f{z:02d}.dcm", modality, 3.0 * z, z + 1, ImageType=["ORIGINAL", "PRIMARY"], **attrs)
        out = _assembled(folder)
        assert len(out.series) == 1 and not out.issues, (case, [i.message for i in out.issues])
        assert len(out.series[0].slices) == 6


def test_two_echoes_in_runs_of_their_own_acquisition_number_are_still_stacked_per_acquisition(tmp_path: Path) -> None:
    """A series of two acquisitions apart along the normal (0..12 mm and 100..112 mm), each its own
    echo, was split by Acquisition Number and packed as two stacks: it still is, not refused whole."""
    n = 0
    for echo, start in ((1, 0.0), (2, 100.0)):
        for z in range(5):
            n += 1
            _write(tmp_path / f"f{n:02d}.dcm", "MR", start + 3.0 * z, n, ImageType=["ORIGINAL", "PRIMARY"],
                   AcquisitionNumber=echo, EchoNumbers=echo)
    out = _assembled(tmp_path)
    assert not out.issues and [len(s.slices) for s in out.series] == [5, 5]
