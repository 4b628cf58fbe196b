"""NIfTI test files and the references the NIfTI tests compare packer with.

The truth is planted in patient millimetres (:func:`phantom_ras`, NIfTI's RAS+ world) and
sampled on grids of every orientation (:class:`Grid`); nibabel writes the files (a writer packer
does not share code with: packer only *reads* through nibabel), with the header fields set
field by field (:func:`write_nifti`) so that a test says exactly which forms and scaling a file
carries. The references here restate what they need from the standards (the RAS → LPS flip,
DICOM's LINEAR and LINEAR_EXACT windows, uint8 quantisation, trilinear interpolation, nearest
neighbour) instead of calling packer's functions, so that a mistake in packer is not repeated
in its own check.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import yaml

#: NIfTI's world is RAS+ (x to the patient's Right, y Anterior, z Superior); DICOM's and
#: packer's is LPS+: the first two coordinates change sign (a point, or a row of an affine).
RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])

# --------------------------------------------------------------------------------- the phantom

#: The planted structures, in RAS mm. A box on the patient's LEFT (RAS x < 0), a sphere ANTERIOR
#: (y > 0) and SUPERIOR (z > 0), and a ramp that grows to the superior and anterior, so that a
#: left/right, anterior/posterior or superior/inferior flip, and a one-voxel shift, all change
#: the values.
BOX_LEFT = ((-46.0, -14.0), (-16.0, 12.0), (-12.0, 14.0))
SPHERE_CENTRE, SPHERE_RADIUS = np.array([6.0, 24.0, 16.0]), 11.0
BACKGROUND, BOX_ADD, SPHERE_ADD = -120.0, 320.0, 250.0
#: The field of view every grid covers, centred on the world origin: (x, y, z) half-widths in mm.
HALF_EXTENT = (60.0, 48.0, 36.0)


def inside_box(ras: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Whether RAS points (..., 3) lie inside :data:`BOX_LEFT` (shrunk by ``margin`` mm)."""
    return np.all([(ras[..., a] >= lo + margin) & (ras[..., a] <= hi - margin)
                   for a, (lo, hi) in enumerate(BOX_LEFT)], axis=0)


def inside_sphere(ras: np.ndarray, margin: float = 0.0) -> np.ndarray:
    return np.linalg.norm(ras - SPHERE_CENTRE, axis=-1) <= SPHERE_RADIUS - margin


def phantom_ras(ras: np.ndarray) -> np.ndarray:
    """Phantom values (HU-like, float64) at RAS points (..., 3)."""
    values = BACKGROUND + 1.5 * ras[..., 2] + 0.8 * ras[..., 1] + 0.3 * ras[..., 0]
    return values + BOX_ADD * inside_box(ras) + SPHERE_ADD * inside_sphere(ras)


# ------------------------------------------------------------------------------------- grids


def rotation(z_deg: float = 0.0, x_deg: float = 0.0, y_deg: float = 0.0) -> np.ndarray:
    """A 3×3 rotation: about z, then x, then y (degrees)."""
    a, b, c = np.radians([z_deg, x_deg, y_deg])
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    ry = np.array([[np.cos(c), 0, np.sin(c)], [0, 1, 0], [-np.sin(c), 0, np.cos(c)]])
    return ry @ rx @ rz


#: Unit directions in RAS: the patient's right, left, anterior, posterior, superior, inferior.
RIGHT, LEFT, ANTERIOR, POSTERIOR, SUPERIOR, INFERIOR = (
    np.array(v, dtype=float) for v in ([1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]))


@dataclass(frozen=True)
class Grid:
    """A voxel grid in RAS: unit direction of each file axis (i, j, k; columns), voxel sizes
    (mm) and shape; centred on the world origin (plus ``shift`` mm)."""

    name: str
    directions: np.ndarray
    spacing: tuple[float, float, float]
    shape: tuple[int, int, int]
    shift: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def affine(self) -> np.ndarray:
        """Voxel (i, j, k) → RAS mm, the grid's centre at ``shift``."""
        out = np.eye(4)
        out[:3, :3] = self.directions @ np.diag(self.spacing)
        out[:3, 3] = np.asarray(self.shift) - out[:3, :3] @ ((np.asarray(self.shape) - 1) / 2)
        return out


def grid(name: str, i: np.ndarray, j: np.ndarray, k: np.ndarray, spacing: Sequence[float],
         turn: np.ndarray | None = None, shift: Sequence[float] = (0.0, 0.0, 0.0)) -> Grid:
    """A grid whose axes run along ``i``, ``j``, ``k`` (unit RAS vectors, then turned by
    ``turn``), sized to cover :data:`HALF_EXTENT`."""
    directions = np.stack([i, j, k], axis=1)
    if turn is not None:
        directions = turn @ directions
    reach = np.abs(np.stack([i, j, k], axis=1)).T @ np.asarray(HALF_EXTENT)  # each axis' half-extent
    shape = tuple(int(2 * r / s) + 1 for r, s in zip(reach, spacing, strict=True))
    return Grid(name, directions, (float(spacing[0]), float(spacing[1]), float(spacing[2])),
                (shape[0], shape[1], shape[2]), (float(shift[0]), float(shift[1]), float(shift[2])))


def voxel_centres(affine: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """RAS (or whatever world ``affine`` maps to) of every voxel centre: shape (*shape, 3)."""
    index = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), axis=-1).astype(float)
    return index @ affine[:3, :3].T + affine[:3, 3]


# ------------------------------------------------------------------------------------ writing


@dataclass(frozen=True)
class Form:
    """How a file places its voxels: which of sform/qform are set (their codes; 0 = unset)
    and their matrices (``qform`` defaults to the sform's); ``zooms``: pixdim[1:4]."""

    sform_code: int = 1
    qform_code: int = 1
    qform: np.ndarray | None = None


def write_nifti(path: Path, data: np.ndarray, affine: np.ndarray, *, form: Form = Form(),
                zooms: Sequence[float] | None = None, slope: float | None = None, inter: float | None = None,
                version: int = 1, endian: str = "<", fields: Mapping[Any, Any] | None = None,
                intent_code: int = 0) -> Path:
    """Write ``data`` (stored values, X×Y×Z[×T]) to ``path`` (``.nii`` or ``.nii.gz``) with the
    header built field by field: pixdim from ``zooms`` (default: the affine's column lengths),
    the qform and sform as ``form`` says, ``scl_slope``/``scl_inter`` as given (nibabel's writer
    resets them, so they are patched into the bytes after), ``fields``: further header fields
    set the same way (raw, unchecked: a damaged header). Checks that nibabel reads back the forms
    asked for, and returns ``path``."""
    klass = nib.Nifti2Image if version == 2 else nib.Nifti1Image
    header = klass.header_class(endianness=endian)
    header.set_data_shape(data.shape)
    header.set_data_dtype(data.dtype)
    header.set_zooms(tuple(zooms if zooms is not None else np.linalg.norm(affine[:3, :3], axis=0))
                     + tuple(1.0 for _ in data.shape[3:]))
    if form.qform_code:
        header.set_qform(form.qform if form.qform is not None else affine, code=form.qform_code)
    if zooms is not None:  # set_qform takes pixdim from the qform: put the requested one back
        header.set_zooms(tuple(zooms) + tuple(1.0 for _ in data.shape[3:]))
    header.set_sform(affine, code=form.sform_code) if form.sform_code else header.set_sform(None, code=0)
    header["intent_code"] = intent_code
    buffer = io.BytesIO()
    image = klass(data, None, header=header)
    file_map = image.make_file_map({"image": buffer, "header": buffer})
    image.to_file_map(file_map)
    raw = bytearray(buffer.getvalue())
    edits = dict(fields or {})
    if slope is not None:
        edits["scl_slope"] = slope
    if inter is not None:
        edits["scl_inter"] = inter
    patch_header(raw, edits, version=version, endian=endian)
    path.write_bytes(gzip.compress(bytes(raw), mtime=0) if path.name.endswith(".gz") else bytes(raw))
    if not fields:
        back = nib.load(path)  # nibabel moves the scaling from the image's header to its dataobj
        assert int(back.header["sform_code"]) == form.sform_code and int(back.header["qform_code"]) == form.qform_code
        if slope is not None:
            assert (back.dataobj.slope, back.dataobj.inter) == (slope, inter or 0.0)
    return path


def header_view(raw: bytearray, *, version: int = 1, endian: str = "<") -> np.ndarray:
    """The header at the start of ``raw`` as a writable numpy record (field names as nibabel's)."""
    klass = nib.Nifti2Header if version == 2 else nib.Nifti1Header
    dtype = klass.template_dtype.newbyteorder(endian)
    return np.ndarray((), dtype=dtype, buffer=raw)


def patch_header(raw: bytearray, edits: Mapping[Any, Any], *, version: int = 1, endian: str = "<") -> None:
    """Set header fields of an uncompressed file's bytes in place (``dim`` as a whole array, or
    ``("dim", 3)`` for one element)."""
    view = header_view(raw, version=version, endian=endian)
    for name, value in edits.items():
        if isinstance(name, tuple):
            view[name[0]][name[1]] = value
        else:
            view[name] = value


# ------------------------------------------------------------------------------- references


def window_linear(x: np.ndarray, center: float, width: float) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.2 (VOI LUT Function LINEAR) with output range [0, 1]:
    x <= c - 0.5 - (w-1)/2 → 0; x > c - 0.5 + (w-1)/2 → 1; else ((x - (c - 0.5)) / (w-1) + 0.5)."""
    x = np.asarray(x, dtype=np.float64)
    y = (x - (center - 0.5)) / (width - 1) + 0.5
    y = np.where(x <= center - 0.5 - (width - 1) / 2, 0.0, y)
    return np.where(x > center - 0.5 + (width - 1) / 2, 1.0, y)


def window_linear_exact(x: np.ndarray, center: float, width: float) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.3.2 (LINEAR_EXACT), range [0, 1]: x <= c - w/2 → 0; x > c + w/2 → 1;
    else (x - c)/w + 0.5."""
    x = np.asarray(x, dtype=np.float64)
    y = (x - center) / width + 0.5
    y = np.where(x <= center - width / 2, 0.0, y)
    return np.where(x > center + width / 2, 1.0, y)


def to_uint8(y: np.ndarray) -> np.ndarray:
    """[0, 1] → uint8: round(255·y) (the value an 8-bit display of the window shows)."""
    return np.rint(np.clip(y, 0.0, 1.0) * 255.0).astype(np.int64)


def lps_to_ras(points: np.ndarray) -> np.ndarray:
    return points * np.array([-1.0, -1.0, 1.0])


def file_index(img: Any, lps: np.ndarray) -> np.ndarray:
    """Continuous voxel index (i, j, k) in ``img`` (a nibabel image, by its own ``img.affine``)
    of LPS points (..., 3)."""
    inverse = np.linalg.inv(img.affine)
    return lps_to_ras(lps) @ inverse[:3, :3].T + inverse[:3, 3]


def exact_index(index: np.ndarray, shape: Sequence[int], tolerance: float = 1e-3) -> np.ndarray:
    """``index`` (..., 3) rounded, after checking that every entry is a whole number (a voxel
    centre) inside ``shape``."""
    rounded = np.rint(index)
    assert np.abs(index - rounded).max() <= tolerance, f"off-grid by {np.abs(index - rounded).max():.4g} voxels"
    assert (rounded >= 0).all() and (rounded < np.asarray(shape)).all(), "a packed voxel lies outside the file"
    return rounded.astype(np.intp)


def trilinear(volume: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``volume`` (X×Y×Z) at continuous voxel indices (..., 3), trilinear, indices clamped to the
    volume (the value at the nearest edge beyond it)."""
    shape = np.asarray(volume.shape)
    x = np.clip(index, 0, shape - 1)
    low = np.minimum(np.floor(x).astype(np.intp), shape - 2).clip(0)
    t = x - low
    out = np.zeros(index.shape[:-1])
    for corner in np.ndindex(2, 2, 2):
        weight = np.ones(index.shape[:-1])
        at = []
        for axis, bit in enumerate(corner):
            weight = weight * (t[..., axis] if bit else 1 - t[..., axis])
            at.append(np.minimum(low[..., axis] + bit, shape[axis] - 1))
        out += weight * volume[tuple(at)]
    return out


def nearest_labels(labels: np.ndarray, index: np.ndarray, fill: int = 0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The label under each continuous voxel index (..., 3) of ``labels`` (round half up; ``fill``
    where the point lies outside the label map's voxels), and where that choice is a tie (an index
    within 1e-4 of half-way between two voxels, where either neighbour is right)."""
    shape = np.asarray(labels.shape)
    outside = ((index < -0.5 - 1e-4) | (index > shape - 0.5 + 1e-4)).any(axis=-1)
    nearest = np.clip(np.floor(index + 0.5).astype(np.intp), 0, shape - 1)
    out = labels[tuple(nearest[..., a] for a in range(3))]
    out = np.where(outside, fill, out)
    frac = index - np.floor(index)
    tie = (np.abs(frac - 0.5) < 1e-4).any(axis=-1) | (np.abs(index + 0.5) < 1e-4).any(axis=-1) \
        | (np.abs(index - (shape - 0.5)) < 1e-4).any(axis=-1)
    return out, tie


# ------------------------------------------------------------------------- building and reading


@dataclass
class Packed:
    """What a build packed: per sample key its image (C×…), mask (or None) and JSON record,
    and the bad-sample records."""

    images: dict[str, np.ndarray] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    bad: list[dict[str, Any]] = field(default_factory=list)

    def of_entity(self, entity: str) -> list[str]:
        """The keys of one entity's samples, in key order (a case's slices in slice order)."""
        return sorted(k for k, r in self.records.items() if r["entity_id"] == entity)

    def bad_of(self, relpath: str) -> list[dict[str, Any]]:
        return [b for b in self.bad if Path(b["path"]).name == relpath]


def read_packed(version: Path) -> Packed:
    """Every sample of a built version, read with the standard library's ``tarfile`` and
    ``numpy.load`` (not packer's loader), and ``bad_samples.jsonl``."""
    out = Packed()
    for shard in sorted(version.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                handle = tar.extractfile(member)
                assert handle is not None
                data = handle.read()
                if ext == "npy":
                    out.images[key] = np.load(io.BytesIO(data))
                elif ext == "mask.npy":
                    out.masks[key] = np.load(io.BytesIO(data))
                elif ext == "json":
                    out.records[key] = json.loads(data)
    bad = version / "bad_samples.jsonl"
    if bad.is_file():
        out.bad = [json.loads(line) for line in bad.read_text().splitlines() if line.strip()]
    return out


def build_nifti(folder: Path, rows: Sequence[Mapping[str, str]], nifti: Mapping[str, Any], *,
                mask: Mapping[str, Any] | None = None, channel_files: Sequence[str] | None = None,
                limits: Mapping[str, Any] | None = None) -> Packed:
    """Build a ``kind: nifti`` job over the files under ``folder/raw`` named by ``rows`` (each
    {path, entity, ...}: the table), with ``transform.nifti`` = ``nifti``, in-process (sync
    scheduler), every sample in one split; return what it packed."""
    from packer.config import load_job
    from packer.pipeline.build import BuildOptions, build

    columns = list(dict.fromkeys(c for row in rows for c in row))
    table = folder / "raw" / "cases.csv"
    table.write_text("\n".join([",".join(columns), *(",".join(row.get(c, "") for c in columns) for row in rows)])
                     + "\n")
    source: dict[str, Any] = {"kind": "nifti", "root": "raw", "table": "raw/cases.csv", "label": "none"}
    if mask is not None:
        source["mask"] = dict(mask)
    if channel_files:
        source["channel_files"] = list(channel_files)
    doc: dict[str, Any] = {
        "name": "nifti", "sources": [source],
        "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
        "transform": {"nifti": dict(nifti)}, "pack": {"format": "webdataset"}, "output": "out",
        "validate": {"max_bad_fraction": 1.0},
    }
    if limits:
        doc["limits"] = dict(limits)
    job_file = folder / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = build(load_job(job_file), BuildOptions(scheduler="sync", quiet=True, html_report=False, fresh=True,
                                                    work_dir=folder / "work"))
    return read_packed(Path(result.version_dir))
