"""PET exports from a walker's report, packed by real builds: the message of an Enhanced PET
without its rescale, and the float16 rounding of PET modality values.

An Enhanced PET Image (PS3.3 A.56) carries Rescale Slope and Intercept in its Pixel Value
Transformation functional group (C.7.6.16.2.9), per frame or shared, not in the classic PET
Image module (C.8.9.4) at the top level; a user told of the one looks in the wrong place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import generate_uid

from packer.badsamples import read_bad_samples
from tests.dicom_files import image_dataset, save
from tests.test_targets import _build, _job

PET_STORAGE = "1.2.840.10008.5.1.4.1.1.128"
ENHANCED_PET_STORAGE = "1.2.840.10008.5.1.4.1.1.130"
LEGACY_ENHANCED_PET_STORAGE = "1.2.840.10008.5.1.4.1.1.128.1"


def _enhanced_pet_without_rescale(path: Path, sop_class: str) -> Path:
    """A 3-frame Enhanced (or Legacy Converted Enhanced) PET placed by its functional groups,
    with no Pixel Value Transformation item, shared or per frame, and no top-level rescale."""
    stored = np.random.default_rng(0).integers(0, 20000, (3, 8, 8)).astype(np.uint16)
    ds = image_dataset(stored, modality="PT", sop_class=sop_class, force_frames=True, Units="BQML",
                       ImageType=["ORIGINAL", "PRIMARY"], FrameOfReferenceUID=generate_uid(), InstanceNumber=1,
                       DecayCorrection="START", ContentDate="20240101", ContentTime="101010")
    shared = Dataset()
    orientation = Dataset()
    orientation.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    shared.PlaneOrientationSequence = DicomSequence([orientation])
    measures = Dataset()
    measures.PixelSpacing, measures.SliceThickness, measures.SpacingBetweenSlices = [3.0, 3.0], 3.0, 3.0
    shared.PixelMeasuresSequence = DicomSequence([measures])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    per_frame = []
    for f in range(stored.shape[0]):
        group, position = Dataset(), Dataset()
        position.ImagePositionPatient = [-12.0, -12.0, 3.0 * f]
        group.PlanePositionSequence = DicomSequence([position])
        per_frame.append(group)
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(per_frame)
    return save(ds, path)


def _classic_pet_without_rescale(path: Path) -> Path:
    stored = np.random.default_rng(1).integers(0, 20000, (8, 8)).astype(np.uint16)
    return save(image_dataset(stored, modality="PT", sop_class=PET_STORAGE, Units="BQML", PatientID="P2",
                              ImageType=["ORIGINAL", "PRIMARY"], ImagePositionPatient=[0.0, 0.0, 0.0],
                              ImageOrientationPatient=[1, 0, 0, 0, 1, 0], PixelSpacing=[3.0, 3.0],
                              SliceThickness=3.0, SeriesType=["WHOLE BODY", "IMAGE"], DecayCorrection="START",
                              CorrectedImage=["DECY", "ATTN"], CountsSource="EMISSION"), path)


def test_an_enhanced_pet_without_rescale_is_unreadable_naming_its_class_and_the_functional_group(
        tmp_path: Path) -> None:
    """An Enhanced PET or Legacy Converted Enhanced PET with no Rescale Slope/Intercept anywhere
    is refused as a classic PET slice without them is, but its message names its own storage
    class and the per-frame or shared Pixel Value Transformation functional group (PS3.3
    C.7.6.16.2.9) where packer looks for the pair, not the classic PET Image module (C.8.9.4)
    at the top level, which such a file never carries. The classic slice's message is as it was."""
    raw = tmp_path / "raw"
    enhanced = _enhanced_pet_without_rescale(raw / "enhanced.dcm", ENHANCED_PET_STORAGE)
    legacy = _enhanced_pet_without_rescale(raw / "legacy.dcm", LEGACY_ENHANCED_PET_STORAGE)
    classic = _classic_pet_without_rescale(raw / "classic.dcm")
    result = _build(_job(tmp_path / "job", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                         transform={"dicom": {"output": "float16"}}, validate={"max_bad_fraction": 1.0}))
    bad = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert {name: record["reason"] for name, record in bad.items()} == {
        enhanced.name: "unreadable", legacy.name: "unreadable", classic.name: "unreadable"}
    for path, class_name in ((enhanced, "Enhanced PET Image Storage"),
                             (legacy, "Legacy Converted Enhanced PET Image Storage")):
        message = bad[path.name]["message"]
        assert "(0028,1053) Rescale Slope and (0028,1052) Rescale Intercept are absent" in message
        assert f"({class_name})" in message and "(PET Image Storage)" not in message
        assert "(5200,9229) Shared Functional Groups Sequence" in message
        assert "(5200,9230) Per-Frame Functional Groups Sequence" in message
        assert "(0028,9145) Pixel Value Transformation Sequence" in message
        assert "PS3.3 C.7.6.16.2.9" in message and "C.8.9.4" not in message
        assert "export the series again" in message
    message = bad[classic.name]["message"]
    assert "(PET Image Storage)" in message and "PS3.3 C.8.9.4" in message
    assert "Pixel Value Transformation" not in message

