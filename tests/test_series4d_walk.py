"""Series that hold a fourth dimension: images of one place told apart by a time, a frame or an
energy.

Every file here is a real DICOM file (written with pydicom, read back by packer's header reader,
or built into shards end to end). Such series went wrong:

- a dynamic PET's frames (Frame Reference Time, PS3.3 C.8.9.4), a CT perfusion's time points
  (Acquisition Time and Content Time only) and a dual-energy CT's two tube voltages (KVP) at the
  same positions were refused as "one file twice in the export, or two acquisitions in one
  series", naming nothing that tells the images apart and no ``where:`` that keeps one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydicom
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
