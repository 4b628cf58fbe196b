"""PET exports from a walker's report, packed by real builds: the message of an Enhanced PET
without its rescale, and the float16 rounding of PET modality values.

An Enhanced PET Image (PS3.3 A.56) carries Rescale Slope and Intercept in its Pixel Value
Transformation functional group (C.7.6.16.2.9), per frame or shared, not in the classic PET
Image module (C.8.9.4) at the top level; a user told of the one looks in the wrong place.

``output: float16`` packs a PET slice's modality values, stored × slope + intercept: each the
nearest float16 to that value, rounded once. Rounded to float32 first, a value just above a
float16 tie (2049.0001, between 2048 and 2050) became the tie (2049.0) and then went to even
(2048), one float16 step off.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import generate_uid

from packer.badsamples import read_bad_samples
from packer.loader import ShardDataset
from tests.dicom_files import image_dataset, save
from tests.test_targets import _build, _job

PET_STORAGE = "1.2.840.10008.5.1.4.1.1.128"
ENHANCED_PET_STORAGE = "1.2.840.10008.5.1.4.1.1.130"
LEGACY_ENHANCED_PET_STORAGE = "1.2.840.10008.5.1.4.1.1.128.1"


def _enhanced_pet(path: Path, sop_class: str, stored: np.ndarray | None = None,
                  rescale: tuple[str, str] | None = None) -> Path:
    """A 3-frame Enhanced (or Legacy Converted Enhanced) PET placed by its functional groups,
    every frame with Rescale Slope and Intercept ``rescale`` in its own Pixel Value
    Transformation item; ``rescale`` None: no such item, shared or per frame, nor a top-level
    rescale. ``stored``: the frames' stored values (3×H×W uint16), random where None."""
    if stored is None:
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
        if rescale is not None:
            item = Dataset()
            item.RescaleSlope, item.RescaleIntercept = rescale
            item.RescaleType = "BQML"
            group.PixelValueTransformationSequence = DicomSequence([item])
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
    enhanced = _enhanced_pet(raw / "enhanced.dcm", ENHANCED_PET_STORAGE)
    legacy = _enhanced_pet(raw / "legacy.dcm", LEGACY_ENHANCED_PET_STORAGE)
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



#: A legal DS (10 characters) that float64 holds to 1e-16 but float32 does not: 2049 × it is
#: 2049.00010245, between the float16 values 2048 and 2050 and nearer 2050; in float32 it is 2049.0
SLOPE = "1.00000005"
INTERCEPT = "0"


def _stored() -> np.ndarray:
    """8×8 stored values: 2049 but for a first row of other values (not a constant slice)."""
    stored = np.full((8, 8), 2049, np.uint16)
    stored[0, :] = np.arange(8) * 100 + 1000
    return stored


def _nearest_float16(stored: np.ndarray) -> np.ndarray:
    """Each exact stored × SLOPE + INTERCEPT (a fraction) rounded once to float16."""
    exact = [Fraction(int(v)) * Fraction(SLOPE) + Fraction(INTERCEPT) for v in stored.reshape(-1)]
    return np.array([float(v) for v in exact], dtype=np.float64).astype(np.float16).reshape(stored.shape)


def _packed(result: Any) -> list[np.ndarray]:
    return [item["image"].numpy() for item in ShardDataset(result.manifest_path, "train", shuffle=False,
                                                           records=True)]


@pytest.mark.parametrize("sample", ["slice", "volume", {"neighbors": 1}], ids=["slice", "volume", "neighbors"])
def test_float16_packs_each_pet_modality_value_rounded_once_to_the_nearest_float16(
        tmp_path: Path, sample: Any) -> None:
    """A PET series of three slices, Rescale Slope 1.00000005: every packed value (a slice, the
    volume on its slices' own grid, a neighbour stack) is the nearest float16 to stored × slope +
    intercept, so stored 2049 packs as 2050, not as 2048 (float32's 2049.0 rounded to even)."""
    stored = _stored()
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    for i in range(3):
        save(image_dataset(stored, modality="PT", sop_class=PET_STORAGE, Units="BQML", PatientID="P1",
                           StudyInstanceUID=study, SeriesInstanceUID=series, FrameOfReferenceUID=frame,
                           InstanceNumber=i + 1, ImageType=["ORIGINAL", "PRIMARY"],
                           ImagePositionPatient=[-12.0, -12.0, 3.0 * i], ImageOrientationPatient=[1, 0, 0, 0, 1, 0],
                           PixelSpacing=[3.0, 3.0], SliceThickness=3.0, SeriesType=["WHOLE BODY", "IMAGE"],
                           DecayCorrection="START", CorrectedImage=["DECY", "ATTN"], CountsSource="EMISSION",
                           RescaleSlope=SLOPE, RescaleIntercept=INTERCEPT), tmp_path / "raw" / f"IM{i}.dcm")
    result = _build(_job(tmp_path / "job", [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         transform={"dicom": {"output": "float16", "sample": sample}}))
    images = _packed(result)
    assert len(images) == (1 if sample == "volume" else 3)
    want = _nearest_float16(stored)
    assert float(want[4, 4]) == 2050.0
    for image in images:
        assert image.dtype == np.float16
        planes = image.reshape(-1, 8, 8)  # C×H×W, or 1×D×H×W: every plane is one slice's values
        assert all(np.array_equal(plane, want) for plane in planes), planes[0]


def test_float16_packs_a_stack_of_enhanced_pet_frames_rounded_once(tmp_path: Path) -> None:
    """frames: stack of an Enhanced PET whose frames carry Rescale Slope 1.00000005 in their Pixel
    Value Transformation items: each channel is its frame's values rounded once to float16."""
    stored = np.stack([_stored()] * 3)
    _enhanced_pet(tmp_path / "raw" / "enhanced.dcm", ENHANCED_PET_STORAGE, stored, (SLOPE, INTERCEPT))
    result = _build(_job(tmp_path / "job", [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         transform={"dicom": {"output": "float16", "frames": "stack"}}))
    [image] = _packed(result)
    assert image.dtype == np.float16 and image.shape == (3, 8, 8)
    assert np.array_equal(image, np.stack([_nearest_float16(_stored())] * 3)), image[0]
