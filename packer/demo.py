"""Seeded demo and benchmark raw trees: CT-like DICOM files, photos, label tables, planted defects.

``write_demo_tree`` writes a small, byte-reproducible tree for tutorials and end-to-end tests;
``write_bench_tree`` writes the same layout at benchmark scale (512×512 slices, 640×480 JPEGs)
without defects; ``write_copies_tree`` writes CT patients of similar anatomy and planted copies of
some of their slices (re-encoded, resized, shifted, cropped, re-windowed) under other entities,
for the near-copy check (``packer.pipeline.nearcopy``). Nothing here reads the wall clock: every date, UID
and pixel comes from the seed, so the same seed gives byte-identical files wherever the tree is
written.

The public ``render_*`` and ``write_*`` helpers are reusable on their own (tests, benchmarks).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import shutil
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pydicom
from numpy.typing import NDArray
from pydicom.datadict import tag_for_keyword
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    UID,
    ComputedRadiographyImageStorage,
    CTImageStorage,
    ExplicitVRLittleEndian,
    RLELossless,
    generate_uid,
)

from packer.errors import ConfigError
from packer.opencv import cv2

if TYPE_CHECKING:
    from packer.demo_annotations import AnnotatedDemo
    from packer.demo_nifti import NiftiDemo

#: First line of README.txt; marks a folder this module may clear and rewrite.
MARKER = "packer demo raw tree"
CT_LABELS = ("normal", "nodule")
PHOTO_LABELS = ("circle", "square")
#: Fixed so the file meta bytes do not change with the installed pydicom version.
IMPLEMENTATION_UID = "1.2.826.0.1.3680043.8.498.1"
IMPLEMENTATION_NAME = "PACKER_DEMO"
#: Rescale intercept of every CT file: stored value 0 is -1024 HU.
CT_INTERCEPT = -1024
_FIELD_OF_VIEW_MM = 350.0
_FIRST_DAY = date(2023, 1, 1)
_DAYS = (date(2025, 1, 1) - _FIRST_DAY).days  # 2023 and 2024
_LAYOUT = {"studies": 2, "slices": 3, "photos": 4}  # the demo's proportions, reused by the bench tree


@dataclass(frozen=True)
class PlantedDefect:
    """A broken input planted on purpose; ``reason`` is the code the build must report for it."""

    relpath: str
    reason: str


@dataclass(frozen=True)
class DemoTree:
    """What was written: the root, counts of good files, and the planted defects of the demo
    job's sources (``ct/``, ``photos/``); ``nifti``: the NIfTI tree and its own planted defects
    (:mod:`packer.demo_nifti`), ``annotated``: the CT series with SEG and RTSTRUCT masks and
    theirs (:mod:`packer.demo_annotations`), where one was written."""

    root: Path
    dicom_files: int
    images: int
    defects: tuple[PlantedDefect, ...]
    nifti: NiftiDemo | None = None
    annotated: AnnotatedDemo | None = None


@dataclass(frozen=True)
class DicomUids:
    """Study, series and SOP instance UIDs for one file."""

    study: str
    series: str
    sop: str


# ---------------------------------------------------------------- seeds, UIDs, dates


def seeded_rng(seed: int, *parts: str | int) -> np.random.Generator:
    """A generator for one item, keyed by ``seed`` and ``parts`` (independent of other items)."""
    entropy = [seed & 0xFFFF_FFFF_FFFF_FFFF] + [zlib.crc32(str(part).encode()) for part in parts]
    return np.random.default_rng(entropy)


def make_uid(seed: int, *parts: str | int) -> str:
    """A DICOM UID derived only from ``seed`` and ``parts`` (pydicom root prefix, hashed suffix).

    pydicom hashes the parts joined without a separator, so parts must not run into each other:
    (``1``, ``12``) and (``11``, ``2``) give one UID. Callers give parts of fixed width or that
    end in a letter where numbers follow numbers."""
    return str(generate_uid(entropy_srcs=["packer-demo", str(seed), *map(str, parts)]))


def make_uids(seed: int, *parts: str | int, study: str | int, series: str | int = 1) -> DicomUids:
    """UIDs for one instance: the study UID depends on ``study``, the series UID on both."""
    return DicomUids(
        study=make_uid(seed, "study", *parts[:1], study),
        series=make_uid(seed, "series", *parts[:1], study, series),
        sop=make_uid(seed, "sop", *parts),
    )


def random_datetime(rng: np.random.Generator) -> datetime:
    """A datetime between 2023-01-01 and 2024-12-31, 07:00-19:00, to the second."""
    day = _FIRST_DAY + timedelta(days=int(rng.integers(_DAYS)))
    return datetime(day.year, day.month, day.day) + timedelta(seconds=int(rng.integers(7 * 3600, 19 * 3600)))


# ---------------------------------------------------------------- pixels


@lru_cache(maxsize=8)
def _grid(height: int, width: int) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Row and column coordinates in [-1, 1] (read-only, shared between calls)."""
    ys = np.linspace(-1.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, :]
    ys.setflags(write=False)
    xs.setflags(write=False)
    return ys, xs


def _ellipse(shape: tuple[int, int], cx: float, cy: float, ax: float, ay: float) -> NDArray[np.float32]:
    """Normalised ellipse radius: < 1 inside the ellipse centred (cx, cy) with semi-axes (ax, ay)."""
    ys, xs = _grid(*shape)
    return ((xs - cx) / ax) ** 2 + ((ys - cy) / ay) ** 2


def render_ct_phantom(
    rng: np.random.Generator, *, size: int = 64, z: float = 0.0, nodule: bool = False,
    anatomy: np.random.Generator | None = None,
) -> NDArray[np.float32]:
    """A chest-like CT slice in HU: float32, size×size, values in [-1024, ~760].

    Air -1000 background (at least a 10% margin in every corner), body ellipse 40, two lungs
    -800, a rib ring and a spine 700, an optional 40 HU nodule in the right lung, plus
    Gaussian noise (σ 12 HU). ``z`` in [-1, 1] moves along the chest and changes the lungs.

    ``anatomy`` (one generator per patient): the body's position and shape vary widely and
    2-4 soft-tissue or vessel blobs sit at per-patient places, so different patients'
    slices are not near duplicates of each other while one patient's slices are, as in real
    data. Without it every patient shares one anatomy up to small jitter (the demo's phantoms).
    """
    shape = (size, size)
    if anatomy is None:
        cx, cy = rng.uniform(-0.05, 0.05, size=2)
        ax, ay = 0.78 * rng.uniform(0.92, 1.0), 0.58 * rng.uniform(0.92, 1.0)
    else:
        cx, cy = anatomy.uniform(-0.08, 0.08, size=2)
        ax, ay = anatomy.uniform(0.6, 0.8), anatomy.uniform(0.4, 0.62)
    body = _ellipse(shape, cx, cy, ax, ay)
    hu = np.full(shape, -1000.0, dtype=np.float32)
    hu[body <= 1.0] = 40.0
    hu[(body > 0.80) & (body <= 0.90)] = 700.0
    lung_ay = ay * (0.62 - 0.12 * abs(z))
    for side in (-1.0, 1.0):
        hu[_ellipse(shape, cx + side * 0.36 * ax, cy - 0.05, 0.26 * ax, lung_ay) <= 1.0] = -800.0
    hu[_ellipse(shape, cx, cy + 0.62 * ay, 0.1, 0.1) <= 1.0] = 700.0
    if anatomy is not None:
        for _ in range(int(anatomy.integers(2, 5))):
            bx, by = cx + anatomy.uniform(-0.6, 0.6) * ax, cy + anatomy.uniform(-0.6, 0.6) * ay
            radius = anatomy.uniform(0.06, 0.16)
            hu[_ellipse(shape, bx, by, radius, radius * anatomy.uniform(0.6, 1.4)) <= 1.0] = anatomy.choice(
                [-950.0, 60.0, 300.0])
    if nodule:
        radius = 0.05 + 0.03 * (1.0 - abs(z))
        hu[_ellipse(shape, cx - 0.36 * ax, cy - 0.1, radius, radius) <= 1.0] = 40.0
    hu += rng.standard_normal(shape, dtype=np.float32) * 12.0
    return np.maximum(hu, -1024.0, out=hu)


def render_radiograph(rng: np.random.Generator, *, size: int = 64) -> NDArray[np.uint16]:
    """A CR-like MONOCHROME1 image: uint16, size×size, 12-bit stored values.

    MONOCHROME1 shows the minimum as white, so air (dark on film) is high (~3600), soft
    tissue mid (~2200) and bone low (~900), plus noise; every corner is air.
    """
    shape = (size, size)
    values = np.full(shape, 3600.0, dtype=np.float32)
    cx, cy = rng.uniform(-0.05, 0.05, size=2)
    body = _ellipse(shape, cx, cy, 0.7, 0.8)
    values[body <= 1.0] = 2200.0
    values[_ellipse(shape, 0.0, 0.0, 0.08, 0.75) <= 1.0] = 900.0
    values += rng.standard_normal(shape, dtype=np.float32) * 20.0
    return np.clip(np.rint(values), 0, 4095).astype(np.uint16)


def render_photo(rng: np.random.Generator, label: str, *, height: int = 96, width: int = 128) -> NDArray[np.uint8]:
    """A BGR uint8 height×width×3 photo: one filled ``label`` shape ("circle" or "square") on a
    noisy gradient with a few soft blobs of its own (so that no two photos are near copies)."""
    if label not in PHOTO_LABELS:
        raise ValueError(f"unknown photo label {label!r}; expected one of {PHOTO_LABELS}")
    background = rng.integers(0, 256, size=3)
    ramp = np.linspace(-30.0, 30.0, height, dtype=np.float32)[:, None, None]
    noise = rng.standard_normal((height, width, 3), dtype=np.float32) * 6.0
    canvas = np.broadcast_to(background[None, None, :] + ramp, (height, width, 3)).astype(np.float32)
    for _ in range(5):
        blob = np.zeros((height, width), dtype=np.float32)
        cv2.circle(blob, (int(rng.integers(0, width)), int(rng.integers(0, height))),
                   int(rng.integers(min(height, width) // 10, min(height, width) // 4)), 1.0, thickness=-1)
        canvas += cv2.GaussianBlur(blob, (0, 0), 4.0)[:, :, None] * rng.uniform(-60.0, 60.0, size=3)[None, None, :]
    img = np.clip(canvas + noise, 0, 255).astype(np.uint8)
    colour = tuple(int(c) for c in (background + 128 + rng.integers(-40, 41, size=3)) % 256)
    half = int(min(height, width) * rng.uniform(0.15, 0.3))
    x = int(rng.integers(half, width - half))
    y = int(rng.integers(half, height - half))
    if label == "circle":
        cv2.circle(img, (x, y), half, colour, thickness=-1, lineType=cv2.LINE_AA)
    else:
        cv2.rectangle(img, (x - half, y - half), (x + half, y + half), colour, thickness=-1)
    return img


def hu_to_stored(hu: NDArray[np.floating], *, bits_stored: int, intercept: int = CT_INTERCEPT) -> NDArray[np.int16]:
    """HU → signed stored values (slope 1): ``rint(hu - intercept)`` clipped to ``bits_stored`` bits, int16."""
    low, high = -(1 << (bits_stored - 1)), (1 << (bits_stored - 1)) - 1
    return np.clip(np.rint(hu - intercept), low, high).astype(np.int16)


# ---------------------------------------------------------------- DICOM writers


def _new_dataset(sop_class: str, uids: DicomUids, *, modality: str) -> Dataset:
    """A dataset with file meta (Explicit VR Little Endian), SOP common and series UIDs."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = UID(sop_class)
    ds.file_meta.MediaStorageSOPInstanceUID = UID(uids.sop)
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.ImplementationClassUID = UID(IMPLEMENTATION_UID)
    ds.file_meta.ImplementationVersionName = IMPLEMENTATION_NAME
    ds.preamble = b"\0" * 128
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = uids.sop
    ds.StudyInstanceUID = uids.study
    ds.SeriesInstanceUID = uids.series
    ds.Modality = modality
    ds.Manufacturer = "packer demo"
    return ds


def _set_patient_study(ds: Dataset, *, patient_id: str, study_date: str, study_time: str) -> None:
    """Patient and general study modules (no PHI: synthetic names, no birth date)."""
    ds.PatientName = f"Demo^{patient_id}"
    ds.PatientID = patient_id
    ds.PatientSex = "O"
    ds.StudyDate = ds.ContentDate = study_date
    ds.StudyTime = ds.ContentTime = study_time
    ds.StudyID = "1"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.SeriesNumber = 1


def _set_pixels(ds: Dataset, stored: NDArray[np.integer], *, bits_stored: int, photometric: str) -> None:
    """Image pixel module for a grayscale H×W or F×H×W array (int16 or uint16)."""
    if stored.ndim == 3:
        ds.NumberOfFrames = stored.shape[0]
    ds.Rows, ds.Columns = stored.shape[-2:]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = 16
    ds.BitsStored = bits_stored
    ds.HighBit = bits_stored - 1
    ds.PixelRepresentation = 1 if stored.dtype.kind == "i" else 0
    little_endian = np.ascontiguousarray(stored, dtype=stored.dtype.newbyteorder("<"))
    ds["PixelData"] = pydicom.DataElement(0x7FE00010, "OW", little_endian.tobytes())


def _apply_overrides(ds: Dataset, overrides: dict[str, Any]) -> None:
    """Set each DICOM keyword in ``overrides``; a value of ``None`` deletes the element."""
    for keyword, value in overrides.items():
        if tag_for_keyword(keyword) is None:
            raise ValueError(f"override {keyword!r} is not a DICOM keyword (e.g. WindowCenter, PatientSex)")
        if value is None:
            if keyword in ds:
                delattr(ds, keyword)
        else:
            setattr(ds, keyword, value)


def _save(ds: Dataset, path: Path, compress: str | None) -> None:
    """Optionally compress (pinned to pydicom's own encoder so bytes are reproducible), then write."""
    if compress is not None:
        ds.compress(compress, encoding_plugin="pydicom", generate_instance_uid=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def write_ct_slice(
    path: Path,
    *,
    patient_id: str,
    study_date: str,
    pixels_hu: NDArray[np.floating],
    study_time: str = "120000",
    uids: DicomUids | None = None,
    instance_number: int = 1,
    slice_location_mm: float = 0.0,
    bits_stored: int = 12,
    compress: str | None = None,
    **overrides: Any,
) -> None:
    """Write a CT Image Storage file from HU values (H×W, or F×H×W for a multi-frame file).

    Stored values are ``rint(HU + 1024)`` as signed int16 (PixelRepresentation 1, BitsStored
    ``bits_stored``, clipped to its range), RescaleIntercept -1024, RescaleSlope 1, two windows
    (mediastinum 40/400 as in the RSNA PE kernels, lung -600/1500 Radiopaedia; docs DOMAIN.md §2). Dates are DICOM DA/TM
    strings (``YYYYMMDD``/``HHMMSS``). ``uids`` default to ones hashed from the patient, date,
    time and pixels, so the same arguments give the same bytes. ``compress`` is a transfer
    syntax UID (e.g. ``pydicom.uid.RLELossless``). ``overrides`` are DICOM keywords set last
    (``None`` deletes). Raises ValueError for a keyword that is not DICOM.
    """
    stored = hu_to_stored(pixels_hu, bits_stored=bits_stored)
    if uids is None:
        digest = zlib.crc32(stored.tobytes())
        uids = make_uids(0, patient_id, study_date, study_time, digest, study=f"{study_date}{study_time}")
    spacing = round(_FIELD_OF_VIEW_MM / stored.shape[-1], 6)
    ds = _new_dataset(CTImageStorage, uids, modality="CT")
    _set_patient_study(ds, patient_id=patient_id, study_date=study_date, study_time=study_time)
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.InstanceNumber = instance_number
    ds.KVP = "120"
    ds.PixelSpacing = [spacing, spacing]
    ds.SliceThickness = "2.5"
    ds.SliceLocation = slice_location_mm
    ds.ImagePositionPatient = [-_FIELD_OF_VIEW_MM / 2, -_FIELD_OF_VIEW_MM / 2, slice_location_mm]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.RescaleIntercept = CT_INTERCEPT
    ds.RescaleSlope = 1
    ds.RescaleType = "HU"
    ds.WindowCenter = [40, -600]
    ds.WindowWidth = [400, 1500]
    ds.WindowCenterWidthExplanation = ["MEDIASTINUM", "LUNG"]
    _set_pixels(ds, stored, bits_stored=bits_stored, photometric="MONOCHROME2")
    _apply_overrides(ds, overrides)
    _save(ds, path, compress)


def write_cr_image(
    path: Path, *, patient_id: str, study_date: str, pixels: NDArray[np.uint16], uids: DicomUids,
    study_time: str = "120000", **overrides: Any,
) -> None:
    """Write a CR Image Storage file, MONOCHROME1, unsigned 12-bit stored values (uint16 H×W).

    Carries Window Center/Width 2048/4096 ("FULL") and rescale 0/1; readers must invert after
    windowing (PS3.3 C.7.6.3.1.2). ``overrides`` as in :func:`write_ct_slice`.
    """
    ds = _new_dataset(ComputedRadiographyImageStorage, uids, modality="CR")
    _set_patient_study(ds, patient_id=patient_id, study_date=study_date, study_time=study_time)
    ds.InstanceNumber = 1
    ds.BodyPartExamined = "CHEST"
    ds.ViewPosition = "PA"
    ds.ImagerPixelSpacing = ds.PixelSpacing = [0.5, 0.5]
    ds.RescaleIntercept = 0
    ds.RescaleSlope = 1
    ds.RescaleType = "US"
    ds.WindowCenter = 2048
    ds.WindowWidth = 4096
    ds.WindowCenterWidthExplanation = "FULL"
    _set_pixels(ds, pixels, bits_stored=12, photometric="MONOCHROME1")
    _apply_overrides(ds, overrides)
    _save(ds, path, None)


def truncate_file(path: Path, keep: int) -> None:
    """Cut ``path`` to its first ``keep`` bytes (a transfer that stopped midway)."""
    path.write_bytes(path.read_bytes()[:keep])


# ---------------------------------------------------------------- photos


def encode_photo(image: NDArray[np.uint8], suffix: str) -> bytes:
    """Encode a BGR image with OpenCV: ``.jpg`` (quality 90) or ``.png`` (level 3)."""
    params = [cv2.IMWRITE_JPEG_QUALITY, 90] if suffix == ".jpg" else [cv2.IMWRITE_PNG_COMPRESSION, 3]
    ok, buf = cv2.imencode(suffix, image, params)
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} image as {suffix}")
    return buf.tobytes()


def write_photo(path: Path, image: NDArray[np.uint8]) -> None:
    """Write a BGR uint8 image; the format follows the suffix (``.jpg`` or ``.png``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_photo(image, path.suffix.lower()))


def cut_jpeg(data: bytes) -> bytes:
    """The first half of a JPEG, shortened further if needed so it does not end with EOI (FF D9)."""
    cut = data[: len(data) // 2]
    while cut.endswith(b"\xff\xd9"):
        cut = cut[:-1]
    return cut


# ---------------------------------------------------------------- tree layout


@dataclass(frozen=True)
class _Row:
    """One label-table row; ``entity``/``timestamp`` are used by the photo table only."""

    path: str
    label: str
    entity: str = ""
    timestamp: str = ""


#: The folders a demo tree owns: cleared when it is written again, their files given DEMO_MTIME.
_TREE_FOLDERS = ("ct", "photos", "exports", "targets", "series", "nifti", "annotated")


#: Where an earlier demo tree's folders wait while the tree is written again (:func:`_settle`).
_PREVIOUS = ".previous-demo"


def _prepare_root(root: Path, *, keep_previous: bool = False) -> None:
    """Create ``root``; clear the folders a previous demo tree owns (``keep_previous``: move them
    to :data:`_PREVIOUS`, for :func:`_settle` to keep the files that come out the same).

    Raises ConfigError when ``root`` holds any path this module writes but no README.txt
    marking it as a demo tree, so a user's own files are never overwritten.
    """
    root.mkdir(parents=True, exist_ok=True)
    readme = root / "README.txt"
    if readme.is_file() and readme.read_text(encoding="utf-8", errors="replace").startswith(MARKER):
        previous = root / _PREVIOUS
        if previous.exists():
            shutil.rmtree(previous)  # left by a run that died before it settled
        for sub in _TREE_FOLDERS:
            if not (root / sub).is_dir():
                continue
            if keep_previous:
                previous.mkdir(exist_ok=True)
                (root / sub).rename(previous / sub)
            else:
                shutil.rmtree(root / sub)
        return
    clashes = [name for name in ("ct", "photos", "ct_labels.csv", "README.txt") if (root / name).exists()]
    if clashes:
        raise ConfigError(
            f"{root} already holds {', '.join(clashes)} and no README.txt marking it as a packer demo tree; "
            "choose an empty or new folder so none of your files are overwritten"
        )


def _ct_series(
    root: Path, seed: int, *, patients: int, studies: int, slices: int, size: int, limit: int | None = None,
    varied: bool = False,
) -> Iterator[_Row]:
    """Write CT slices ``ct/PAT0001/ST01/IM001.dcm``...; yield their label rows (path relative to ``ct/``)."""
    written = 0
    for p in range(1, patients + 1):
        patient_id = f"PAT{p:04d}"
        for s in range(1, studies + 1):
            rng = seeded_rng(seed, "ct-study", p, s)
            label = "nodule" if rng.random() < 0.4 else "normal"
            when = random_datetime(rng)
            for k in range(1, slices + 1):
                if limit is not None and written >= limit:
                    return
                z = -1.0 + 2.0 * (k - 1) / max(slices - 1, 1)
                rel = f"{patient_id}/ST{s:02d}/IM{k:03d}.dcm"
                anatomy = seeded_rng(seed, "ct-anatomy", p) if varied else None  # the same for every slice of p
                hu = render_ct_phantom(seeded_rng(seed, "ct-slice", p, s, k), size=size, z=z, nodule=label == "nodule",
                                       anatomy=anatomy)
                write_ct_slice(
                    root / "ct" / rel, patient_id=patient_id, study_date=when.strftime("%Y%m%d"),
                    study_time=when.strftime("%H%M%S"), pixels_hu=hu, uids=make_uids(seed, patient_id, s, k, study=s),
                    instance_number=k, slice_location_mm=2.5 * k, bits_stored=16 if p % 2 == 0 else 12,
                )
                written += 1
                yield _Row(rel, label)


def _photo_series(
    root: Path, seed: int, *, subjects: int, per_subject: int, height: int, width: int,
    suffixes: Sequence[str] = (".jpg", ".png"), limit: int | None = None,
) -> Iterator[_Row]:
    """Write photos ``photos/S001/01.jpg``...; labels alternate per subject from a seeded start."""
    written = 0
    for subject in range(1, subjects + 1):
        entity = f"S{subject:03d}"
        start = int(seeded_rng(seed, "photo-subject", subject).integers(2))
        for n in range(1, per_subject + 1):
            if limit is not None and written >= limit:
                return
            rng = seeded_rng(seed, "photo", subject, n)
            label = PHOTO_LABELS[(start + n) % 2]
            rel = f"{entity}/{n:02d}{suffixes[n % len(suffixes)]}"
            write_photo(root / "photos" / rel, render_photo(rng, label, height=height, width=width))
            written += 1
            yield _Row(rel, label, entity, random_datetime(rng).isoformat())


def _write_ct_extras(root: Path, seed: int, first_patient: int) -> list[_Row]:
    """MONOCHROME1 CR, 3-frame CT and RLE Lossless CT under ``ct/extra/``, one patient each.

    The CR is "normal" and the multi-frame CT "nodule", so both CT labels are always present.
    """
    names = ("cr_monochrome1.dcm", "ct_multiframe.dcm", "ct_rle.dcm")
    rows: list[_Row] = []
    for offset, name in enumerate(names):
        rng = seeded_rng(seed, "extra", name)
        patient_id = f"PAT{first_patient + offset:04d}"
        when = random_datetime(rng)
        day, time_of_day = when.strftime("%Y%m%d"), when.strftime("%H%M%S")
        uids = make_uids(seed, patient_id, 1, 1, study=1)
        path = root / "ct" / "extra" / name
        if offset == 0:
            label = "normal"
            write_cr_image(path, patient_id=patient_id, study_date=day, study_time=time_of_day, uids=uids,
                           pixels=render_radiograph(rng))
        elif offset == 1:
            label = "nodule"
            frames = np.stack([render_ct_phantom(rng, z=z, nodule=True) for z in (-0.5, 0.0, 0.5)])
            write_ct_slice(path, patient_id=patient_id, study_date=day, study_time=time_of_day, uids=uids,
                           pixels_hu=frames)
        else:
            label = CT_LABELS[int(rng.integers(2))]
            write_ct_slice(path, patient_id=patient_id, study_date=day, study_time=time_of_day, uids=uids,
                           pixels_hu=render_ct_phantom(rng, nodule=label == "nodule"), compress=RLELossless)
        rows.append(_Row(f"extra/{name}", label))
    return rows


def _write_broken_dicom(root: Path, seed: int) -> tuple[list[_Row], list[PlantedDefect]]:
    """Plant the four broken DICOM inputs under ``ct/broken/``; only truncated.dcm gets a label row."""
    broken = root / "ct" / "broken"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "zero_byte.dcm").write_bytes(b"")
    (broken / "notes.dcm").write_text("Scanner notes: series 3 repeated, see paper log.\n", encoding="utf-8")
    rng = seeded_rng(seed, "broken")
    date_str = random_datetime(rng).strftime("%Y%m%d")
    truncated = broken / "truncated.dcm"
    hu = render_ct_phantom(rng)
    write_ct_slice(truncated, patient_id="BRK0001", study_date=date_str, pixels_hu=hu,
                   uids=make_uids(seed, "BRK0001", 1, 1, study=1))
    truncate_file(truncated, truncated.stat().st_size - hu.size)  # keeps half of the 2-byte pixels
    # a CT slice exported without its image (Image Pixel module and Pixel Data gone): a real defect.
    # A report (SR) or a plan is no defect: packer leaves such objects out (not_image), never bad.
    lost: dict[str, Any] = dict.fromkeys(("PixelData", "Rows", "Columns", "BitsAllocated", "BitsStored", "HighBit",
                                          "PixelRepresentation", "SamplesPerPixel", "PhotometricInterpretation"))
    write_ct_slice(broken / "no_pixels.dcm", patient_id="BRK0002", study_date=date_str,
                   pixels_hu=render_ct_phantom(rng), uids=make_uids(seed, "BRK0002", 1, 1, study=1), **lost)
    defects = [
        PlantedDefect("ct/broken/zero_byte.dcm", "unreadable"),
        PlantedDefect("ct/broken/truncated.dcm", "truncated"),
        PlantedDefect("ct/broken/notes.dcm", "not_dicom"),
        PlantedDefect("ct/broken/no_pixels.dcm", "no_pixel_data"),
    ]
    return [_Row("broken/truncated.dcm", "normal")], defects


def _write_broken_photos(root: Path, seed: int, subjects: int) -> tuple[list[_Row], list[PlantedDefect]]:
    """Plant a half JPEG and a table row for a file that does not exist, in seeded subjects."""
    rng = seeded_rng(seed, "broken-photos")
    cut_subject, missing_subject = (f"S{int(i) + 1:03d}" for i in rng.integers(subjects, size=2))
    cut_rel, missing_rel = f"{cut_subject}/truncated.jpg", f"{missing_subject}/missing.jpg"
    data = encode_photo(render_photo(rng, "circle"), ".jpg")
    (root / "photos" / cut_rel).parent.mkdir(parents=True, exist_ok=True)
    (root / "photos" / cut_rel).write_bytes(cut_jpeg(data))
    rows = [
        _Row(cut_rel, "circle", cut_subject, random_datetime(rng).isoformat()),
        _Row(missing_rel, "square", missing_subject, random_datetime(rng).isoformat()),
    ]
    defects = [PlantedDefect(f"photos/{cut_rel}", "truncated"), PlantedDefect(f"photos/{missing_rel}", "missing_file")]
    return rows, defects


def _write_table(path: Path, rows: Sequence[_Row], columns: Sequence[str]) -> None:
    """Write a CSV sorted by path, ``\\n`` line endings, with the given columns of ``_Row``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in sorted(rows, key=lambda r: r.path):
        writer.writerow([getattr(row, column) for column in columns])
    path.write_text(buf.getvalue(), encoding="utf-8")


def _write_readme(tree: DemoTree, seed: int, kind: str, masks: Sequence[PlantedDefect] = (),
                  series: bool = False) -> None:
    """README.txt: what the tree is, how to use it, and the planted defects (``masks``: those of
    ``targets/segmentation``; ``series``: the tree has ``series/`` of :data:`SERIES`)."""
    lines = [
        MARKER,
        "",
        f"A synthetic {kind} raw tree written by packer (seed {seed}); no real patients. Same seed, same bytes.",
        f"ct/             {tree.dicom_files} good DICOM files (CT slices PAT*/ST*/IM*.dcm, extra/ kinds)",
        "ct_labels.csv   path,label (path relative to ct/)",
        f"photos/         {tree.images} good images, one folder per subject",
        "photos/labels.csv  path,label,entity,timestamp (path relative to photos/)",
        "phi.key         the demo's pseudonymization key (derived from the seed: NOT secret, demo only)",
    ]
    if masks:
        lines += [
            "targets/        examples for every target kind (workflows/targets-*.yaml build them):",
            "  folders/<class>/*.png         an ImageFolder tree (label: folder)",
            "  photos.csv                    photos/ again: findings (multi-label), brightness,contrast (numeric);",
            "                                a broken photo's cells are empty (nothing to measure), so the numeric",
            "                                job reports it as bad_target, before decoding, not by its own defect",
            "  segmentation/ + table.csv     grey images with shapes, and their masks (0 background, 1 disk, 2 square)",
        ]
    if series:
        lines += ["series/         CT series, one folder per patient, for 2.5D neighbour stacks and volumes",
                  "                (workflows/series-neighbors.yaml, series-volume.yaml); file names and Instance",
                  "                Numbers shuffled; -> the reason code a build gives the series' files (SER05: its",
                  "                localizer only):"]
        lines += [f"  {patient}         {how}" + (f" -> {reason}" if reason else "")
                  for patient, (how, reason) in SERIES.items()]
    if tree.nifti is not None:
        from packer.demo_nifti import readme_lines

        lines += readme_lines(tree.nifti)
    if tree.annotated is not None:
        from packer.demo_annotations import readme_lines as annotated_lines

        lines += annotated_lines(tree.annotated)
    defects = [*(f"  {d.relpath} -> {d.reason}" for d in tree.defects),
               *(f"  targets/segmentation/{d.relpath} -> {d.reason}" for d in masks),
               *(f"  nifti/{d.relpath} -> {d.reason}" for d in (tree.nifti.defects if tree.nifti else ())),
               *(f"  annotated/{d.relpath} -> {d.reason}" for d in (tree.annotated.defects if tree.annotated else ()))]
    lines += ["", "Planted defects (relpath -> reason code the build must report):" if defects
              else "No planted defects.", *defects]
    (tree.root / "README.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _check_counts(**counts: int) -> None:
    """Raise ValueError naming the first count below 1."""
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def write_demo_tree(
    root: Path, *, seed: int = 0, patients: int = 12, studies_per_patient: int = 2, slices_per_study: int = 3,
    photo_subjects: int = 10, photos_per_subject: int = 4,
) -> DemoTree:
    """Write the small demo raw tree under ``root`` and return what was written.

    Layout: ``ct/PAT0001/ST01/IM001.dcm`` (64×64 CT phantoms), ``ct/extra/`` (MONOCHROME1 CR,
    3-frame CT, RLE CT), ``ct/broken/`` (planted defects), ``ct_labels.csv``,
    ``photos/S001/01.jpg|.png`` (96×128), ``photos/labels.csv``, ``README.txt``; the examples of
    other jobs: ``targets/``, ``series/``, ``nifti/`` (:mod:`packer.demo_nifti`) and ``annotated/``
    (:mod:`packer.demo_annotations`). A folder that
    an earlier demo tree wrote is cleared first; ``ConfigError`` if ``ct/`` or ``photos/`` hold
    foreign files. Both CT labels and both photo labels are always present (photos needs
    ``photos_per_subject >= 2``). ValueError for a count below 1.
    """
    _check_counts(patients=patients, studies_per_patient=studies_per_patient, slices_per_study=slices_per_study,
                  photo_subjects=photo_subjects, photos_per_subject=photos_per_subject)
    root = Path(root)
    _prepare_root(root, keep_previous=True)
    ct_rows = list(_ct_series(root, seed, patients=patients, studies=studies_per_patient, slices=slices_per_study,
                              size=64, varied=True))
    ct_rows += _write_ct_extras(root, seed, first_patient=patients + 1)
    good_dicom = len(ct_rows)
    broken_ct_rows, ct_defects = _write_broken_dicom(root, seed)
    photo_rows = list(_photo_series(root, seed, subjects=photo_subjects, per_subject=photos_per_subject,
                                    height=96, width=128))
    good_images = len(photo_rows)
    broken_photo_rows, photo_defects = _write_broken_photos(root, seed, photo_subjects)
    _write_table(root / "ct_labels.csv", ct_rows + broken_ct_rows, ("path", "label"))
    _write_table(root / "photos" / "labels.csv", photo_rows + broken_photo_rows,
                 ("path", "label", "entity", "timestamp"))
    mask_defects = write_target_examples(root, seed, photo_rows, broken_photo_rows)
    write_series_examples(root, seed)
    from packer.demo_nifti import write_nifti_examples  # nibabel: only when a tree is written

    nifti = write_nifti_examples(root / "nifti", seed)
    from packer.demo_annotations import write_annotated_examples  # highdicom: only when a tree is written

    annotated = write_annotated_examples(root / "annotated", seed)
    tree = DemoTree(root, good_dicom, good_images, tuple(ct_defects + photo_defects), nifti, annotated)
    write_demo_key(root, seed)
    _write_readme(tree, seed, "demo", masks=mask_defects, series=True)
    _settle(root)
    return tree


#: Every file of a demo tree gets this modification time (2024-01-01 00:00:00 UTC): the tree is
#: a pure function of its seed, so writing it again (``make demo`` does, every time) leaves each
#: file's inode, size and mtime, and so the build cache's key, as they were (:func:`_settle`):
#: the rebuild decodes nothing.
DEMO_MTIME = 1_704_067_200


def _settle(root: Path) -> None:
    """Give the files the demo tree wrote under ``root`` :data:`DEMO_MTIME`, and where a file
    came out byte for byte as the previous tree's (moved aside by :func:`_prepare_root`), keep
    that file itself: its inode, which the build cache's key holds, stays the same."""
    previous = root / _PREVIOUS
    owned = [root / name for name in ("ct_labels.csv", "README.txt", "phi.key")]
    for sub in _TREE_FOLDERS:
        owned.extend(path for path in (root / sub).rglob("*") if path.is_file())
    for path in owned:
        if not path.is_file():
            continue
        before = previous / path.relative_to(root)
        if before.is_file() and before.stat().st_size == path.stat().st_size and \
                before.read_bytes() == path.read_bytes():
            os.replace(before, path)
        os.utime(path, (DEMO_MTIME, DEMO_MTIME))
    if previous.exists():
        shutil.rmtree(previous)


#: Segmentation example: mask class ids (0 is background).
SEGMENT_CLASSES = {"disk": 1, "square": 2}


def write_target_examples(root: Path, seed: int, photo_rows: Sequence[_Row],
                          broken_rows: Sequence[_Row] = ()) -> list[PlantedDefect]:
    """``targets/``: one example per target kind, for ``workflows/targets-*.yaml``.

    - ``folders/<circle|square>/NNN.png``: an ImageFolder tree (64×64 photos);
    - ``photos.csv``: the demo photos (``photos/``) with targets measured from their own pixels:
      ``findings`` (multi-label: the shape, ``bright`` when the mean grey is above 0.5,
      ``textured`` when its standard deviation is above 0.15) and ``brightness``/``contrast``
      (numeric: that mean and standard deviation, in [0, 1]); the planted broken photos
      (``broken_rows``) are listed with empty cells, as a real table lists files it cannot measure;
    - ``segmentation/images/NNN.png`` with ``segmentation/masks/NNN.png`` (class ids:
      :data:`SEGMENT_CLASSES`, drawn with the image's own shapes) and ``segmentation/table.csv``
      (path,mask,entity,timestamp); one mask of the wrong size and one missing mask are planted.

    Returns the planted defects (relative to ``targets/segmentation``).
    """
    base = root / "targets"
    for rel in range(24):
        label = PHOTO_LABELS[rel % 2]
        write_photo(base / "folders" / label / f"{rel:03d}.png",
                    render_photo(seeded_rng(seed, "folder-photo", rel), label, height=64, width=64))
    rows = []
    for row in sorted([*photo_rows, *broken_rows], key=lambda r: r.path):
        grey = cv2.imread(str(root / "photos" / row.path), cv2.IMREAD_GRAYSCALE) if row in photo_rows else None
        if grey is None:
            rows.append([row.path, "", "", "", row.entity, row.timestamp])
            continue
        bright, contrast = float(grey.mean()) / 255.0, float(grey.std()) / 255.0
        findings = [row.label] + (["bright"] if bright > 0.5 else []) + (["textured"] if contrast > 0.15 else [])
        rows.append([row.path, "|".join(findings), f"{bright:.4f}", f"{contrast:.4f}", row.entity, row.timestamp])
    _write_csv(base / "photos.csv", ["path", "findings", "brightness", "contrast", "entity", "timestamp"], rows)
    seg = base / "segmentation"
    seg_rows = []
    for n in range(24):
        rng = seeded_rng(seed, "segmentation", n)
        image = np.full((64, 64), int(rng.integers(20, 80)), dtype=np.uint8)
        mask = np.zeros((64, 64), dtype=np.uint8)
        for shape, cls in SEGMENT_CLASSES.items():
            half = int(rng.integers(6, 12))
            x, y = (int(v) for v in rng.integers(half, 64 - half, size=2))
            layer = np.zeros_like(mask)
            if shape == "disk":
                cv2.circle(layer, (x, y), half, 1, thickness=-1)
            else:
                cv2.rectangle(layer, (x - half, y - half), (x + half, y + half), 1, thickness=-1)
            image[layer > 0] = 120 + 60 * cls + int(rng.integers(-10, 10))
            mask[layer > 0] = cls
        noisy = np.clip(image.astype(np.int16) + rng.integers(-8, 9, size=image.shape), 0, 255).astype(np.uint8)
        write_photo(seg / "images" / f"{n:03d}.png", noisy)
        if n != 22:  # planted: 22's mask is missing
            write_photo(seg / "masks" / f"{n:03d}.png", mask if n != 23 else mask[:, :48])  # 23: wrong size
        seg_rows.append([f"images/{n:03d}.png", f"masks/{n:03d}.png", f"S{n // 2:03d}", f"2024-01-{n + 1:02d}"])
    _write_csv(seg / "table.csv", ["path", "mask", "entity", "timestamp"], seg_rows)
    return [PlantedDefect("images/022.png", "mask_missing"), PlantedDefect("images/023.png", "mask_size")]


#: The demo's series (``series/<patient>/``): how each was made, and the reason a build gives
#: its files (None: it packs). File names and Instance Numbers are shuffled in every one.
SERIES = {
    "SER01": ("8 axial slices, 3 mm apart", None),
    "SER02": ("8 axial slices, 3 mm apart", None),
    "SER03": ("8 axial slices, 3 mm apart", None),
    "SER04": ("8 slices tilted 20 degrees (oblique)", None),
    "SER05": ("8 axial slices plus a localizer (left out on purpose, not bad)", "not_requested"),
    "BAD01": ("slice 4 missing", "series_gap"),
    "BAD02": ("two slices at one position", "series_duplicate_position"),
    "BAD03": ("one slice in another orientation", "series_orientation"),
    "BAD04": ("two slices only", "series_too_short"),
    "BAD05": ("one slice without Image Position", "series_no_position"),
}


def write_series_examples(root: Path, seed: int, size: int = 48) -> None:
    """``series/<patient>/*.dcm``: the series of :data:`SERIES` (48×48 CT phantoms whose anatomy
    moves with position, so neighbouring slices differ), for ``workflows/series-neighbors.yaml``."""
    for patient, (_, broken) in SERIES.items():
        rng = seeded_rng(seed, "series", patient)
        zs = [3.0 * k for k in range(8)]
        tilt = np.radians(20.0) if patient == "SER04" else 0.0
        orientations = [[1.0, 0.0, 0.0, 0.0, float(np.cos(tilt)), float(np.sin(tilt))] for _ in zs]
        positions: list[list[float] | None] = []
        if broken == "series_gap":
            zs = zs[:4] + zs[5:]
        elif broken == "series_duplicate_position":
            zs = zs[:5] + [zs[4]] + zs[6:]
        elif broken == "series_too_short":
            zs = zs[:2]
        orientations = orientations[:len(zs)]
        if broken == "series_orientation":
            orientations[3] = [1.0, 0.0, 0.0, 0.0, 0.9659258, 0.2588190]  # 15 degrees off
        normal = np.cross(orientations[0][:3], orientations[0][3:])
        for z in zs:
            positions.append([float(v) for v in np.array([-_FIELD_OF_VIEW_MM / 2] * 2 + [0.0]) + z * normal])
        if broken == "series_no_position":
            positions[2] = None
        numbers = rng.permutation(len(zs)) + 1
        for k, z in enumerate(zs):
            anatomy = seeded_rng(seed, "series-anatomy", patient)  # the same for every slice of the patient
            hu = render_ct_phantom(seeded_rng(seed, "series-slice", patient, k), size=size, z=-1.0 + z / 12.0,
                                   nodule=False, anatomy=anatomy)
            name = f"{int(rng.integers(0, 2**32)):08x}.dcm"
            overrides: dict[str, Any] = {"ImageOrientationPatient": orientations[k],
                                         "ImagePositionPatient": positions[k]}
            write_ct_slice(root / "series" / patient / name, patient_id=patient, study_date="20240301",
                           pixels_hu=hu, uids=make_uids(seed, patient, k, study=1), instance_number=int(numbers[k]),
                           slice_location_mm=z, **overrides)
        if broken == "not_requested":  # a scout among the slices
            hu = render_ct_phantom(seeded_rng(seed, "series-scout", patient), size=size, z=0.0, nodule=False)
            write_ct_slice(root / "series" / patient / "scout.dcm", patient_id=patient, study_date="20240301",
                           pixels_hu=hu, uids=make_uids(seed, patient, 99, study=1), instance_number=99,
                           ImageType=["ORIGINAL", "PRIMARY", "LOCALIZER"],
                           ImageOrientationPatient=[0.0, 1.0, 0.0, 0.0, 0.0, -1.0],
                           ImagePositionPatient=[0.0, -_FIELD_OF_VIEW_MM / 2, 100.0])


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue(), encoding="utf-8")


def write_demo_key(root: Path, seed: int) -> Path:
    """``phi.key``: a pseudonymization key derived from the seed, so demo builds are reproducible.

    Real jobs must use a random key kept outside the repository (see README, "Patient data").
    """
    path = root / "phi.key"
    path.write_text(hashlib.sha256(f"packer demo key, not secret, seed {seed}".encode()).hexdigest() + "\n",
                    encoding="utf-8")
    return path


def write_bench_tree(
    root: Path, *, samples: int, seed: int = 0, ct_size: int = 512, photo_size: tuple[int, int] = (480, 640)
) -> DemoTree:
    """Write a benchmark tree of ``samples`` good files in the demo's layout, without defects.

    CT slices (int16, ``ct_size``×``ct_size``) and JPEGs (``photo_size`` = (height, width)) in
    the demo's proportions (75 DICOM : 40 images, rounded), 2 studies × 3 slices per patient and
    4 photos per subject; the last patient or subject may be partial. Each patient has its own
    anatomy (``render_ct_phantom(anatomy=...)``), so near duplicates stay within a patient, as in
    real data, and the entity split can meet its ratios. Label tables as in
    :func:`write_demo_tree`. Same ``ConfigError``/``ValueError`` rules.
    """
    _check_counts(samples=samples, ct_size=ct_size, photo_height=photo_size[0], photo_width=photo_size[1])
    root = Path(root)
    _prepare_root(root)
    per_patient = _LAYOUT["studies"] * _LAYOUT["slices"]
    demo_dicom, demo_images = 12 * per_patient + 3, 10 * _LAYOUT["photos"]
    n_ct = round(samples * demo_dicom / (demo_dicom + demo_images))
    n_photo = samples - n_ct
    ct_rows = list(_ct_series(root, seed, patients=-(-n_ct // per_patient), studies=_LAYOUT["studies"],
                              slices=_LAYOUT["slices"], size=ct_size, limit=n_ct, varied=True))
    photo_rows = list(_photo_series(root, seed, subjects=-(-n_photo // _LAYOUT["photos"]),
                                    per_subject=_LAYOUT["photos"], height=photo_size[0], width=photo_size[1],
                                    suffixes=(".jpg",), limit=n_photo))
    (root / "photos").mkdir(parents=True, exist_ok=True)
    _write_table(root / "ct_labels.csv", ct_rows, ("path", "label"))
    _write_table(root / "photos" / "labels.csv", photo_rows, ("path", "label", "entity", "timestamp"))
    tree = DemoTree(root, len(ct_rows), len(photo_rows), ())
    _write_readme(tree, seed, "benchmark")
    return tree


# ---------------------------------------------------------------- look-alikes and planted copies

#: How a planted copy was made from its source slice: the exported kinds are 8-bit images of
#: the slice through a display window (mediastinum unless the kind names another), written to
#: the image source ``exports/`` under a new entity; the DICOM kinds are the slice under another
#: PatientID in ``ct/`` (identical decoded pixels).
COPY_KINDS = ("png", "jpeg75", "resized", "shifted", "cropped", "lung_window", "bone_window", "dicom_copy",
              "dicom_rle")
_EXPORT_WINDOWS = {"lung_window": (-600.0, 1500.0), "bone_window": (400.0, 1800.0)}
_MEDIASTINUM = (40.0, 400.0)


@dataclass(frozen=True)
class ChestAnatomy:
    """One patient's body plan: where and how large the body, lungs, heart, aorta and spine are."""

    cx: float
    cy: float
    ax: float
    ay: float
    fat: float
    lung: float
    lung_dy: float
    heart: tuple[float, float, float, float, float]
    aorta: tuple[float, float, float]
    vessels: int

    @classmethod
    def draw(cls, rng: np.random.Generator) -> ChestAnatomy:
        """A patient: every part varies within a range typical of adult chests, so all patients
        look alike at a coarse scale and none is a copy of another."""
        return cls(cx=float(rng.uniform(-.06, .06)), cy=float(rng.uniform(-.06, .06)), ax=float(rng.uniform(.68, .84)),
                   ay=float(rng.uniform(.5, .64)), fat=float(rng.uniform(.04, .12)), lung=float(rng.uniform(.85, 1.1)),
                   lung_dy=float(rng.uniform(-.06, .04)),
                   heart=(float(rng.uniform(-.12, .02)), float(rng.uniform(-.02, .12)), float(rng.uniform(.18, .26)),
                          float(rng.uniform(.15, .22)), float(rng.uniform(-.5, .1))),
                   aorta=(float(rng.uniform(.05, .2)), float(rng.uniform(.1, .3)), float(rng.uniform(.05, .08))),
                   vessels=int(rng.integers(0, 1 << 30)))


def _rotated_ellipse(size: int, cx: float, cy: float, ax: float, ay: float, angle: float = 0.0) -> NDArray[np.float32]:
    ys, xs = _grid(size, size)
    c, s = np.cos(angle), np.sin(angle)
    x, y = xs - cx, ys - cy
    return ((x * c + y * s) / ax) ** 2 + ((-x * s + y * c) / ay) ** 2


def render_chest_slice(anatomy: ChestAnatomy, rng: np.random.Generator, *, size: int = 256, z: float = 0.0,
                       nodule: bool = False) -> NDArray[np.float32]:
    """An axial chest CT slice of ``anatomy`` in HU (float32 size×size): subcutaneous fat, soft
    tissue, a rib ring, two lungs with vessels, heart, aorta, a vertebra and its canal, an
    optional nodule, and Gaussian noise (σ 15 HU). ``z`` in [-1, 1] is the level: lungs and
    heart shrink towards the ends, and the lung vessels move."""
    a = anatomy
    hu = np.full((size, size), -1000.0, np.float32)
    hu[_ellipse((size, size), a.cx, a.cy, a.ax, a.ay) <= 1] = -100.0
    inner = _ellipse((size, size), a.cx, a.cy, a.ax - a.fat, a.ay - a.fat)
    hu[inner <= 1] = 40.0
    hu[(inner > 0.82) & (inner <= 0.9)] = 650.0
    ax, ay = a.ax - a.fat, a.ay - a.fat
    lung_ay = ay * a.lung * (0.62 - 0.14 * abs(z))
    for side in (-1.0, 1.0):
        hu[_ellipse((size, size), a.cx + side * .38 * ax, a.cy + a.lung_dy, .27 * ax * a.lung, lung_ay) <= 1] = -850.0
    # the patient's own vessel tree: branches at fixed places in the lungs that drift slowly with
    # the level, so neighbouring slices share them and other patients do not
    tree = np.random.default_rng(a.vessels)
    for _ in range(24):
        side = float(tree.choice([-1.0, 1.0]))
        u, v, du, dv = tree.uniform(-.8, .8), tree.uniform(-.85, .85), tree.uniform(-.3, .3), tree.uniform(-.3, .3)
        radius = float(tree.uniform(.012, .03))
        x = a.cx + side * .38 * ax + (u + du * z) * .27 * ax * a.lung
        y = a.cy + a.lung_dy + (v + dv * z) * lung_ay
        hu[_ellipse((size, size), x, y, radius, radius) <= 1] = float(tree.uniform(-300.0, 0.0))
    for _ in range(int(tree.integers(2, 5))):  # muscles and fat pads of the chest wall
        angle = float(tree.uniform(0, 2 * np.pi))
        x, y = a.cx + np.cos(angle) * (a.ax - a.fat / 2), a.cy + np.sin(angle) * (a.ay - a.fat / 2)
        hu[_rotated_ellipse(size, x, y, float(tree.uniform(.06, .14)), float(tree.uniform(.02, .05)),
                            angle + np.pi / 2) <= 1] = float(tree.choice([-100.0, 45.0]))
    hx, hy, hw, hh, angle = a.heart
    shrink = 1 - .3 * abs(z)
    hu[_rotated_ellipse(size, a.cx + hx, a.cy + hy, hw * shrink, hh * shrink, angle) <= 1] = 55.0
    ox, oy, radius = a.aorta
    hu[_ellipse((size, size), a.cx + ox, a.cy + oy, radius, radius) <= 1] = 180.0
    hu[_ellipse((size, size), a.cx, a.cy + .62 * ay, .1, .09) <= 1] = 600.0
    hu[_ellipse((size, size), a.cx, a.cy + .5 * ay, .035, .035) <= 1] = 20.0
    if nodule:
        hu[_ellipse((size, size), a.cx - .38 * ax, a.cy + a.lung_dy - .1, .06, .06) <= 1] = 30.0
    hu += rng.standard_normal((size, size), dtype=np.float32) * 15.0
    return np.maximum(hu, -1024.0, out=hu)


def export_slice(hu: NDArray[np.floating], kind: str) -> NDArray[np.uint8]:
    """The 8-bit grey image a user would export of a slice for copy ``kind`` (an exported kind of
    :data:`COPY_KINDS`): windowed (mediastinum, or the kind's window), then resized by 0.9,
    shifted by (3, 2) pixels (edges repeated), or cropped by 5 pixels top and left and 3 bottom
    and right, as the kind says. JPEG encoding is the writer's job."""
    from packer.transform.window import apply_window

    center, width = _EXPORT_WINDOWS.get(kind, _MEDIASTINUM)
    image = np.rint(apply_window(np.asarray(hu, dtype=np.float64), center, width) * 255).astype(np.uint8)
    height, width_px = image.shape
    if kind == "resized":
        return cv2.resize(image, (int(width_px * 0.9), int(height * 0.9)), interpolation=cv2.INTER_AREA)
    if kind == "shifted":
        matrix = np.array([[1, 0, 3], [0, 1, 2]], dtype=np.float32)
        shifted = cv2.warpAffine(image, matrix, (width_px, height), flags=cv2.INTER_NEAREST,
                                 borderMode=cv2.BORDER_REPLICATE)
        return np.asarray(shifted, dtype=np.uint8)
    if kind == "cropped":
        return np.ascontiguousarray(image[5:height - 3, 5:width_px - 3])
    return image


@dataclass(frozen=True)
class PlantedCopy:
    """A copy of slice ``source`` (relative to ``ct/``) made as ``kind``, written as ``copy``
    (relative to ``ct/`` for DICOM kinds, to ``exports/`` for exported ones) under entity ``entity``."""

    kind: str
    source: str
    copy: str
    entity: str

    @property
    def copy_source(self) -> str:
        """The job source the copy is read from: ``ct`` or ``exports``."""
        return "ct" if self.kind.startswith("dicom") else "exports"


@dataclass(frozen=True)
class CopiesOutcome:
    """How a build treated a :class:`CopiesTree`: per copy kind, how many copies share a split
    group with their source (``grouped``) and how many were linked to it directly (``linked``);
    the near links between different patients (``false_links``, a copy counting as its source's
    patient) and the groups holding more than one patient (``mixed_groups``, with the largest's
    patient count), out of ``near_links`` links and ``candidates`` verified pairs. ``precision``:
    per copy kind, (links of a copy of that kind that join it to its source's patient, all links
    of such copies); ``patients`` for links between two samples of the CT patients themselves."""

    grouped: dict[str, tuple[int, int]]
    linked: dict[str, tuple[int, int]]
    false_links: int
    near_links: int
    candidates: int
    mixed_groups: int
    largest_mixed: int
    precision: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class CopiesTree:
    """What :func:`write_copies_tree` wrote: ``patients`` × ``slices`` CT slices and the copies."""

    root: Path
    patients: int
    slices: int
    copies: tuple[PlantedCopy, ...]

    def evaluate(self, sources: Sequence[str], relpaths: Sequence[str], groups: Sequence[Sequence[int]],
                 link_i: Sequence[int], link_j: Sequence[int], candidates: int = 0) -> CopiesOutcome:
        """Score a build of this tree: ``sources``/``relpaths`` name each sample (the job's source
        names must be ``ct`` and ``exports``), ``groups`` are the split groups (sample indices),
        ``link_i``/``link_j`` the verified near links."""
        index = {(source, relpath): n for n, (source, relpath) in enumerate(zip(sources, relpaths, strict=True))}
        patient = [relpath.split("/")[0] for relpath in relpaths]
        for copy in self.copies:  # a copy belongs to its source's patient
            at = index.get((copy.copy_source, copy.copy))
            if at is not None:
                patient[at] = copy.source.split("/")[0]
        group_of = {member: g for g, members in enumerate(groups) for member in members}
        grouped: dict[str, list[bool]] = {}
        linked: dict[str, list[bool]] = {}
        pairs = {(min(a, b), max(a, b)) for a, b in zip(link_i, link_j, strict=True)}
        for copy in self.copies:
            a, b = index.get(("ct", copy.source), -1), index.get((copy.copy_source, copy.copy), -1)
            found = a >= 0 and b >= 0
            grouped.setdefault(copy.kind, []).append(found and group_of.get(a) == group_of.get(b))
            linked.setdefault(copy.kind, []).append(found and (min(a, b), max(a, b)) in pairs)
        false_links = sum(patient[a] != patient[b] for a, b in pairs)
        mixed = [len({patient[m] for m in members}) for members in groups]
        kind_of = {index[(copy.copy_source, copy.copy)]: copy.kind for copy in self.copies
                   if (copy.copy_source, copy.copy) in index}
        precision: dict[str, list[bool]] = {}
        for a, b in sorted(pairs):
            precision.setdefault(kind_of.get(a) or kind_of.get(b) or "patients", []).append(patient[a] == patient[b])
        return CopiesOutcome(grouped={k: (sum(v), len(v)) for k, v in grouped.items()},
                             linked={k: (sum(v), len(v)) for k, v in linked.items()},
                             false_links=false_links, near_links=len(pairs), candidates=candidates,
                             mixed_groups=sum(m > 1 for m in mixed), largest_mixed=max(mixed, default=0),
                             precision={k: (sum(v), len(v)) for k, v in precision.items()})


#: A planted copy's source slice: its path (relative to ``ct/``), HU pixels, label and study time.
_CopySource = tuple[str, NDArray[np.float32], str, datetime]


def _chest_patients(root: Path, seed: int, first: int, last: int, slices: int, size: int,
                    chosen_slice: dict[int, int]) -> tuple[list[_Row], dict[tuple[int, int], _CopySource]]:
    """Write the CT slices of patients ``first``..``last`` of a copies tree; their label rows, and
    the sources of the copies to plant (``chosen_slice``: patient → slice) among them."""
    rows: list[_Row] = []
    sources: dict[tuple[int, int], _CopySource] = {}
    for p in range(first, last + 1):
        anatomy = ChestAnatomy.draw(seeded_rng(seed, "chest-anatomy", p))
        rng = seeded_rng(seed, "chest-patient", p)
        label = "nodule" if rng.random() < 0.35 else "normal"
        offset = float(rng.uniform(-0.12, 0.12))
        when = random_datetime(rng)
        for k in range(1, slices + 1):
            z = float(np.clip(-0.9 + 1.8 * (k - 1) / max(slices - 1, 1) + offset, -1.0, 1.0))
            hu = render_chest_slice(anatomy, seeded_rng(seed, "chest-slice", p, k), size=size, z=z,
                                    nodule=label == "nodule")
            rel = f"PAT{p:04d}/IM{k:03d}.dcm"
            write_ct_slice(root / "ct" / rel, patient_id=f"PAT{p:04d}", study_date=when.strftime("%Y%m%d"),
                           study_time=when.strftime("%H%M%S"), pixels_hu=hu,
                           uids=make_uids(seed, f"chest-{p:06d}", f"{k:04d}", study=1), instance_number=k,
                           slice_location_mm=2.5 * k)
            rows.append(_Row(rel, label))
            if chosen_slice.get(p) == k:
                sources[(p, k)] = (rel, hu, label, when)
    return rows, sources


def write_copies_tree(root: Path, *, patients: int, copies: int = 18, seed: int = 0, slices: int = 4,
                      size: int = 256, processes: int = 1) -> CopiesTree:
    """Write CT patients of similar anatomy and ``copies`` planted copies of their slices.

    Layout: ``ct/PAT0001/IM001.dcm`` (``slices`` axial levels per patient, each patient its own
    :class:`ChestAnatomy` and levels jittered per patient; about a third have a nodule, which is
    the label), ``ct_labels.csv``; copies cycle through :data:`COPY_KINDS`, each of a seeded slice
    of a different patient: DICOM kinds as ``ct/CPY0001/IM001.dcm`` (another PatientID; RLE
    Lossless for ``dicom_rle``), exported kinds as ``exports/X0001/01.png|.jpg`` with
    ``exports/labels.csv`` (path,label,entity,timestamp). ``phi.key`` as in the demo tree. The
    same seed gives the same bytes, written by any number of ``processes`` (patients are written
    in ranges, one process a range). ValueError for a count below 1 (``copies`` may be 0).
    """
    _check_counts(patients=patients, slices=slices, size=size, processes=processes)
    if copies < 0 or copies > patients:
        raise ValueError(f"copies must be in 0..patients ({patients}), got {copies}")
    root = Path(root)
    _prepare_root(root)
    chosen = seeded_rng(seed, "copy-sources").choice(patients, size=copies, replace=False) + 1
    chosen_slice = {int(p): int(seeded_rng(seed, "copy-slice", int(p)).integers(1, slices + 1)) for p in chosen}
    ct_rows: list[_Row] = []
    sources: dict[tuple[int, int], _CopySource] = {}
    # every patient's pixels come from its own seeded generators: any number of processes writes the same bytes
    step = max(1, -(-patients // (8 * processes)))
    ranges = [(first, min(first + step - 1, patients)) for first in range(1, patients + 1, step)]
    with ProcessPoolExecutor(processes) if processes > 1 else nullcontext() as pool:
        work = [(root, seed, a, b, slices, size, chosen_slice) for a, b in ranges]
        parts = pool.map(_chest_patients, *zip(*work, strict=True)) if pool else (_chest_patients(*w) for w in work)
        for rows, found in parts:
            ct_rows.extend(rows)
            sources.update(found)
    planted: list[PlantedCopy] = []
    export_rows: list[_Row] = []
    for n, p in enumerate(chosen.tolist(), start=1):
        rel, hu, label, when = sources[(p, chosen_slice[p])]
        kind = COPY_KINDS[(n - 1) % len(COPY_KINDS)]
        if kind.startswith("dicom"):
            entity = f"CPY{n:04d}"
            copy = f"{entity}/IM001.dcm"
            write_ct_slice(root / "ct" / copy, patient_id=entity, study_date=when.strftime("%Y%m%d"),
                           study_time=when.strftime("%H%M%S"), pixels_hu=hu,
                           uids=make_uids(seed, f"chest-copy-{n:06d}", study=1),
                           compress=RLELossless if kind == "dicom_rle" else None)
            ct_rows.append(_Row(copy, label))
        else:
            entity = f"X{n:04d}"
            image = export_slice(hu, kind)
            copy = f"{entity}/01.{'jpg' if kind == 'jpeg75' else 'png'}"
            path = root / "exports" / copy
            path.parent.mkdir(parents=True, exist_ok=True)
            params = [cv2.IMWRITE_JPEG_QUALITY, 75] if kind == "jpeg75" else [cv2.IMWRITE_PNG_COMPRESSION, 6]
            ok, data = cv2.imencode(path.suffix, image, params)
            if not ok:
                raise RuntimeError(f"OpenCV could not encode {path}")
            path.write_bytes(data.tobytes())
            export_rows.append(_Row(copy, label, entity, (when + timedelta(days=30)).isoformat()))
        planted.append(PlantedCopy(kind=kind, source=rel, copy=copy, entity=entity))
    (root / "exports").mkdir(parents=True, exist_ok=True)
    _write_table(root / "ct_labels.csv", ct_rows, ("path", "label"))
    _write_table(root / "exports" / "labels.csv", export_rows, ("path", "label", "entity", "timestamp"))
    write_demo_key(root, seed)
    lines = [MARKER, "", f"A synthetic near-copy raw tree written by packer (seed {seed}); no real patients.",
             f"ct/             {patients} patients × {slices} CT slices of similar anatomy, plus DICOM copies CPY*",
             "ct_labels.csv   path,label (path relative to ct/)",
             "exports/        exported copies X*/ (path,label,entity,timestamp in exports/labels.csv)", "",
             "Planted copies (kind: source -> copy):", *(f"  {c.kind}: ct/{c.source} -> {c.copy_source}/{c.copy}"
                                                        for c in planted)]
    (root / "README.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return CopiesTree(root=root, patients=patients, slices=slices, copies=tuple(planted))
