"""Test helpers: build tiny DICOM files in tmp dirs, and find pydicom's shipped test files.

``shipped`` never downloads: pydicom's ``get_testdata_file`` fetches missing files over the
network, which tests must not do, so we look in the installed package folder only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    UID,
    CTImageStorage,
    EnhancedCTImageStorage,
    ExplicitVRLittleEndian,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from packer.config import DicomTransformConfig, WindowSpec
from packer.records import SampleRef

TEST_FILES = Path(pydicom.__file__).parent / "data" / "test_files"
PATIENT_ID = "MRN-0042-SECRET"
PATIENT_NAME = "Doe^Jane"
STUDY_DATE = "20230504"


def shipped(name: str) -> Path:
    """Path of one of pydicom's bundled test files; skip the test if this install lacks it."""
    path = TEST_FILES / name
    if not path.is_file():
        pytest.skip(f"pydicom test file {name} is not installed (not downloading it)")
    return path


def make_ref(path: Path, sample_id: str = "s1") -> SampleRef:
    return SampleRef(sample_id=sample_id, source="src", kind="dicom", path=str(path), relpath=path.name,
                     label="a", entity="e", time=None)


def file_window(selector: int | str = 0) -> WindowSpec:
    return WindowSpec(kind="file", name="file", selector=selector)


def window(center: float, width: float, function: str = "LINEAR", name: str | None = None) -> WindowSpec:
    return WindowSpec(kind="explicit", name=name or f"c{center:g}w{width:g}", center=center, width=width,
                      function=function)


def config(*windows: WindowSpec, **kwargs: Any) -> DicomTransformConfig:
    return DicomTransformConfig(windows=windows or (file_window(),), **kwargs)


def image_dataset(pixels: np.ndarray, *, photometric: str = "MONOCHROME2", modality: str = "CT",
                  sop_class: str = CTImageStorage, bits_stored: int | None = None, **attrs: Any) -> Dataset:
    """A minimal image dataset holding ``pixels`` natively (Explicit VR Little Endian).

    ``pixels``: H×W or F×H×W (grayscale/palette), H×W×3 or F×H×W×3 (RGB, interleaved); its dtype
    (u1/i1/u2/i2/u4) sets Bits Allocated and Pixel Representation. Extra keywords become elements.
    """
    pixels = np.asarray(pixels)
    color = photometric in ("RGB", "YBR_FULL")
    frames = pixels.shape[0] if pixels.ndim == (4 if color else 3) else 1
    rows, columns = pixels.shape[-3:-1] if color else pixels.shape[-2:]
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = UID(sop_class)
    instance = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = instance
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = instance
    ds.StudyInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    ds.PatientID = PATIENT_ID
    ds.PatientName = PATIENT_NAME
    ds.PatientBirthDate = "19700101"
    ds.InstitutionName = "St Elsewhere Hospital"
    ds.StudyDate = STUDY_DATE
    ds.StudyTime = "101112"
    ds.Modality = modality
    ds.Rows, ds.Columns = int(rows), int(columns)
    ds.SamplesPerPixel = 3 if color else 1
    ds.PhotometricInterpretation = photometric
    if color:
        ds.PlanarConfiguration = 0
    ds.BitsAllocated = pixels.dtype.itemsize * 8
    ds.BitsStored = bits_stored or ds.BitsAllocated
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 1 if pixels.dtype.kind == "i" else 0
    if frames > 1 or attrs.pop("force_frames", False):
        ds.NumberOfFrames = frames
    for keyword, value in attrs.items():
        setattr(ds, keyword, value)
    ds.PixelData = np.ascontiguousarray(pixels).astype(pixels.dtype.newbyteorder("<")).tobytes()
    return ds


def save(ds: Dataset, path: Path) -> Path:
    """Write ``ds`` as a DICOM Part 10 file (preamble + DICM + file meta)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def ct_pixels(shape: tuple[int, ...] = (16, 16), seed: int = 0, low: int = 0, high: int = 3000) -> np.ndarray:
    """Stored CT-like values (int16, intercept -1024 gives about -1024..1976 HU)."""
    return np.random.default_rng(seed).integers(low, high, size=shape, dtype=np.int16)


def ct_dataset(pixels: np.ndarray | None = None, *, intercept: float = -1024.0, slope: float = 1.0,
               center: float | Sequence[float] | None = 40.0, width: float | Sequence[float] | None = 80.0,
               **attrs: Any) -> Dataset:
    """A CT slice with Rescale Slope/Intercept, Pixel Spacing 0.5 mm and (optionally) a window."""
    ds = image_dataset(ct_pixels() if pixels is None else pixels, **attrs)
    ds.RescaleSlope = slope
    ds.RescaleIntercept = intercept
    ds.RescaleType = "HU"
    if "PixelSpacing" not in ds:
        ds.PixelSpacing = [0.5, 0.5]
    ds.SliceThickness = 1.25
    ds.KVP = 120
    ds.BodyPartExamined = "HEAD"
    ds.ManufacturerModelName = "TestScanner 9000"
    if center is not None and width is not None:
        ds.WindowCenter = list(center) if isinstance(center, Sequence) else center
        ds.WindowWidth = list(width) if isinstance(width, Sequence) else width
    return ds


def lut_item(first_mapped: int, bits: int, data: Sequence[int], explanation: str = "") -> Dataset:
    """One Modality/VOI LUT Sequence item (LUT Descriptor, LUT Data as 16-bit words, LUT Explanation)."""
    item = Dataset()
    item.LUTDescriptor = [len(data), first_mapped, bits]
    item.LUTData = np.asarray(data, dtype="<u2").tobytes()  # 'US or OW': pydicom writes OW for > 1 entry
    if explanation:
        item.LUTExplanation = explanation
    return item


def enhanced_ct_dataset(frames: np.ndarray, rescales: Sequence[tuple[float, float] | None],
                        windows: Sequence[tuple[float, float] | None], *, shared_rescale: tuple[float, float],
                        shared_window: tuple[float, float] | None = None,
                        spacing: tuple[float, float] = (0.5, 0.5)) -> Dataset:
    """An Enhanced CT-like multi-frame dataset (PS3.3 C.7.6.16): per-frame Pixel Value
    Transformation / Frame VOI LUT where given (None: frame relies on the shared group)."""
    ds = image_dataset(frames, sop_class=EnhancedCTImageStorage, force_frames=True)
    shared = Dataset()
    transform = Dataset()
    transform.RescaleSlope, transform.RescaleIntercept = shared_rescale
    transform.RescaleType = "HU"
    shared.PixelValueTransformationSequence = DicomSequence([transform])
    measures = Dataset()
    measures.PixelSpacing = list(spacing)
    measures.SliceThickness = 1.0
    shared.PixelMeasuresSequence = DicomSequence([measures])
    if shared_window is not None:
        voi = Dataset()
        voi.WindowCenter, voi.WindowWidth = shared_window
        shared.FrameVOILUTSequence = DicomSequence([voi])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    per_frame = []
    for rescale, frame_window in zip(rescales, windows, strict=True):
        group = Dataset()
        if rescale is not None:
            item = Dataset()
            item.RescaleSlope, item.RescaleIntercept = rescale
            item.RescaleType = "HU"
            group.PixelValueTransformationSequence = DicomSequence([item])
        if frame_window is not None:
            voi = Dataset()
            voi.WindowCenter, voi.WindowWidth = frame_window
            group.FrameVOILUTSequence = DicomSequence([voi])
        per_frame.append(group)
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(per_frame)
    return ds


def secondary_capture_rgb(rgb: np.ndarray) -> Dataset:
    return image_dataset(rgb, photometric="RGB", modality="OT", sop_class=SecondaryCaptureImageStorage)
