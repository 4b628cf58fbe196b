"""One scan as a DICOM series and as its dcm2niix-style NIfTI packs to the same arrays and records.

Each test writes the same CT series twice, as DICOM files (Image Position, Image Orientation,
Pixel Spacing, Rescale) and as a NIfTI file whose affine is the series' (RAS+, sform and qform
set, scl_slope/scl_inter from the Rescale), builds both with the same transform and reads the
shards back with :class:`~packer.loader.ShardDataset`: the packed voxels are equal, so the
records that describe them must say the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from packer.loader import ShardDataset
from packer.read.series import stacking_direction
from packer.transform.volume import canonical_order
from tests.helpers import write_job
from tests.test_targets import _build

S2 = 1 / np.sqrt(2)


def _scan(root: Path, name: str, *, row: list[float], col: list[float], pixel_spacing: tuple[float, float],
          step: float, slices: int, rows: int, cols: int, origin: list[float], tilt: float = 0.0,
          sform: bool = True) -> None:
    """``root/dicom/<name>/*.dcm`` and ``root/nifti/<name>.nii.gz``: the same voxels and geometry.
    Slice ``k`` sits at ``origin + k·(step·normal + tilt·col)``: ``tilt`` shears the stack along
    the column direction (a gantry tilt), the slices still ``step`` mm apart along the normal.
    ``sform=False`` leaves the NIfTI file its qform alone (sform_code 0), as FSL tools do."""
    r, c = np.asarray(row, float), np.asarray(col, float)
    normal = np.cross(r, c)
    k, i, j = np.meshgrid(np.arange(slices), np.arange(rows), np.arange(cols), indexing="ij")
    stored = ((k * 37 + i * 11 + j * 3) % 400 + 924).astype(np.int16)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    (root / "dicom" / name).mkdir(parents=True, exist_ok=True)
    for n in range(slices):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.TransferSyntaxUID = CTImageStorage, ExplicitVRLittleEndian
        meta.MediaStorageSOPInstanceUID = sop = generate_uid()
        ds = FileDataset(None, {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = CTImageStorage, sop, "CT"
        ds.PatientID = ds.PatientName = name
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.ImageType, ds.InstanceNumber = ["ORIGINAL", "PRIMARY", "AXIAL"], n + 1
        ds.ImagePositionPatient = [f"{v:.6f}" for v in np.asarray(origin, float) + n * (step * normal + tilt * c)]
        ds.ImageOrientationPatient = [f"{v:.8f}" for v in (*r, *c)]
        ds.PixelSpacing = [f"{pixel_spacing[0]}", f"{pixel_spacing[1]}"]
        ds.SliceThickness = f"{step}"
        ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = rows, cols, 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleSlope, ds.RescaleIntercept = "1", "-1024"
        ds.PixelData = stored[n].tobytes()
        ds.save_as(root / "dicom" / name / f"{n:03d}.dcm", enforce_file_format=True)
    lps = np.eye(4)
    lps[:3, 0], lps[:3, 1] = r * pixel_spacing[1], c * pixel_spacing[0]
    lps[:3, 2], lps[:3, 3] = normal * step + tilt * c, origin
    ras = np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps
    img = nib.Nifti1Image(np.ascontiguousarray(np.transpose(stored, (2, 1, 0))), ras)
    img.header.set_data_dtype(np.int16)
    img.set_sform(ras, code=1 if sform else 0)
    img.set_qform(ras, code=1)
    img.header.set_slope_inter(1.0, -1024.0)
    (root / "nifti").mkdir(parents=True, exist_ok=True)
    nib.save(img, root / "nifti" / f"{name}.nii.gz")


def _pack(root: Path, kind: str, names: list[str], sample: Any) -> dict[str, list[tuple[np.ndarray, dict[str, Any]]]]:
    """Build ``root``'s ``kind`` copy of ``names`` with ``sample``; each entity's (image, record)s."""
    source: dict[str, Any] = {"kind": kind, "name": "src", "root": str(root / kind), "label": "none"}
    if kind == "nifti":
        (root / "cases.csv").write_text("path,entity\n" + "".join(f"{n}.nii.gz,{n}\n" for n in names))
        source["table"] = str(root / "cases.csv")
    doc: dict[str, Any] = {
        "name": f"{kind}job", "sources": [source], "split": {"by": "entity", "ratios": {"train": 1.0}, "seed": 1},
        "transform": {kind: {"windows": [{"center": 100, "width": 800}], "output": "uint16", "sample": sample}},
        "pack": {"format": "webdataset"}, "output": str(root / f"out-{kind}")}
    if kind == "dicom":
        doc["phi"] = {"mode": "keep"}
    result = _build(write_job(root / f"job-{kind}", doc))
    out: dict[str, list[tuple[np.ndarray, dict[str, Any]]]] = {}
    for item in ShardDataset(result.manifest_path, "train", shuffle=False, records=True):
        record = item["record"]
        out.setdefault(record["entity_id"], []).append((item["image"].numpy(), record))
    return out


CORONAL = {"row": [1, 0, 0], "col": [0, 0, -1], "pixel_spacing": (1.2, 0.6), "step": 2.0, "slices": 7, "rows": 8,
           "cols": 13, "origin": [-30, 0, 60]}
AXIAL = {"row": [1, 0, 0], "col": [0, 1, 0], "pixel_spacing": (0.8, 0.7), "step": 2.5, "slices": 6, "rows": 10,
         "cols": 12, "origin": [-20, -30, 100]}


@pytest.mark.parametrize("sample", ["volume", {"volume": {"spacing": [1.5, 0.9, 0.8], "size": [12, 12, 12]}}],
                         ids=["stored-grid", "spacing-and-size"])
def test_volume_slices_is_the_packed_depth_from_dicom_and_nifti_alike(tmp_path: Path, sample: Any) -> None:
    """``metadata.volume.slices`` is D of the packed C×D×H×W array from either kind: a coronal
    series of 7 slices becomes 8 rows deep (its rows run superior) and an axial one of 6 slices
    12 deep at ``size``. A DICOM volume said the series' slice count (7, 6) where its NIfTI copy
    said D; the series' count is ``volume.series_slices``, a DICOM volume's only."""
    _scan(tmp_path, "coronal", **CORONAL)
    _scan(tmp_path, "axial", **AXIAL)
    packed = {kind: _pack(tmp_path, kind, ["coronal", "axial"], sample) for kind in ("dicom", "nifti")}
    for entity, series_slices in (("coronal", 7), ("axial", 6)):
        ((dicom, dicom_record),), ((nifti, nifti_record),) = packed["dicom"][entity], packed["nifti"][entity]
        # resampled, DICOM windows the slices first and NIfTI the resampled values (README): the shapes agree
        assert dicom.shape == nifti.shape
        dicom_volume, nifti_volume = dicom_record["metadata"]["volume"], nifti_record["metadata"]["volume"]
        assert dicom_volume["slices"] == nifti_volume["slices"] == dicom.shape[1], (entity, dicom_volume, nifti_volume)
        assert dicom_volume["series_slices"] == series_slices
        assert "series_slices" not in nifti_volume


def test_nifti_neighbour_offsets_are_along_the_slice_normal_as_dicoms(tmp_path: Path) -> None:
    """A gantry-tilted series (each slice 2.5 mm along the normal and 0.6 mm across it) records
    its neighbours ±2.5 mm from DICOM and from NIfTI: the step projected on the slice normal,
    not the 2.571 mm between slice centres that the NIfTI stack said."""
    _scan(tmp_path, "tilt", **{**AXIAL, "tilt": 0.6})
    sample = {"neighbors": 1, "edge": "replicate"}
    packed = {kind: _pack(tmp_path, kind, ["tilt"], sample)["tilt"] for kind in ("dicom", "nifti")}
    dicom = {r["metadata"]["neighbors"]["slice"]: (im, r["metadata"]["neighbors"]) for im, r in packed["dicom"]}
    nifti = {r["metadata"]["neighbors"]["slice"]: (im, r["metadata"]["neighbors"]) for im, r in packed["nifti"]}
    assert sorted(dicom) == sorted(nifti) == list(range(6))
    for i in dicom:
        assert np.array_equal(dicom[i][0], nifti[i][0])
        assert nifti[i][1]["offsets_mm"] == pytest.approx(dicom[i][1]["offsets_mm"], abs=1e-3)
    assert nifti[2][1]["offsets_mm"] == pytest.approx([-2.5, 0.0, 2.5], abs=1e-3)


def test_a_45_degree_oblique_series_packs_alike_from_dicom_and_its_qform_only_nifti(tmp_path: Path) -> None:
    """Rows at exactly 45° between x and y tie for the closest patient axis; the qform's float32
    quaternion moves the cosines by ~1e-7, which broke the tie the other way than DICOM's exact
    cosines did, so the two packed H and W along different directions. A near-tie is broken by
    the lower patient axis (x before y before z), the same for both."""
    _scan(tmp_path, "oblique", row=[S2, S2, 0], col=[0, 0, -1], pixel_spacing=(1.0, 1.0), step=2.0, slices=5,
          rows=9, cols=10, origin=[0, 0, 0], sform=False)
    ((dicom, dicom_record),) = _pack(tmp_path, "dicom", ["oblique"], "volume")["oblique"]
    ((nifti, nifti_record),) = _pack(tmp_path, "nifti", ["oblique"], "volume")["oblique"]
    assert dicom.shape == nifti.shape and np.array_equal(dicom, nifti)
    np.testing.assert_allclose(np.array(nifti_record["metadata"]["volume"]["affine"]),
                               np.array(dicom_record["metadata"]["volume"]["affine"]), atol=1e-3)


@pytest.mark.parametrize("nudge", [0.0, 1e-7, -1e-7, 5e-5, -5e-5])
def test_canonical_order_breaks_a_near_tie_by_the_lower_patient_axis(nudge: float) -> None:
    """Columns (D, H, W) of a stack: H along -z, W and D at 45° in the x-y plane. Within 1e-4 of
    a tie W takes x (the lower patient axis) and D y, whichever way the cosines are nudged."""
    w = np.array([S2 + nudge, S2 - nudge, 0.0])
    w /= np.linalg.norm(w)
    h = np.array([0.0, 0.0, -1.0])
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2] = 2.0 * np.cross(w, h), h, w
    assert canonical_order(affine) == (1, 0, 2)  # z: H, y: D, x: W


@pytest.mark.parametrize(("degrees", "order"), [(44.0, (1, 0, 2)), (46.0, (1, 2, 0))])
def test_canonical_order_off_a_tie_takes_the_closest_axis(degrees: float, order: tuple[int, int, int]) -> None:
    """One degree either side of 45° is no tie: W takes the patient axis it runs most along."""
    a = np.radians(degrees)
    w = np.array([np.cos(a), np.sin(a), 0.0])
    h = np.array([0.0, 0.0, -1.0])
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2] = 2.0 * np.cross(w, h), h, w
    assert canonical_order(affine) == order


@pytest.mark.parametrize("nudge", [0.0, 1e-7, -1e-7])
def test_a_45_degree_series_stacks_its_neighbours_one_way_whatever_its_rounding(nudge: float) -> None:
    """A slice normal at 45 degrees between two patient axes (one component negative) is turned
    by its dominant component: the first of those within AXIS_TIE of the largest, as the volume's
    axes break a tie, not whichever a rounding made larger, so two copies of one series stack
    their neighbours in one order."""
    s2 = float(np.sqrt(0.5))
    orientation = [s2 + nudge, s2 - nudge, 0.0, 0.0, 0.0, -1.0]  # normal = row x column: about (-s2, s2, 0)
    direction = stacking_direction(orientation)
    assert direction[0] > 0 > direction[1]  # x, the lower patient axis of the tie, made positive

