"""The demo's NIfTI tree (``demo-raw/nifti/``): abdominal CT cases with label maps, a brain MR
case of four co-registered sequences, and one broken file of each kind the NIfTI reader refuses.

Layout, as the Medical Segmentation Decathlon and nnU-Net ship volumes (``imagesTr/<case>_<channel>``,
``labelsTr/<case>``), one folder per job source:

- ``ct/imagesTr/CT00N_0000.nii.gz``: :data:`CT_CASES` abdomen phantoms, int16 Hounsfield units,
  64×64 voxels of 5.5-6.3 mm in plane and 36-44 slices of 4-5 mm, each patient with its own body
  and organs; stored in the orientations real exporters write (LAS as dcm2niix, RAS, flipped
  along z, sagittal slices, a 4° oblique): the reader makes them canonical.
  ``ct/labelsTr/CT00N.nii.gz``: their label maps (uint8, :data:`CT_CLASSES`), one stored in
  another orientation than its image. ``ct/broken/``: :data:`CT_BROKEN`. ``ct/cases.csv``:
  ``path,entity,mask``. ``ct/dataset.json``: channels and labels, nnU-Net v2 style.
- ``mr/imagesTr/BRAIN001_000{0,1,2,3}.nii.gz``: t1, t1ce, t2 and flair of one skull-stripped
  brain with a tumour (background exactly 0, arbitrary scanner units that differ per sequence),
  ``mr/labelsTr/BRAIN001.nii.gz`` (:data:`MR_CLASSES`), ``mr/cases.csv``
  (``path,entity,mask,t1ce,t2,flair``: the row's own file is t1, the other three its
  ``channel_files``), ``mr/dataset.json``.

Every file is written here (header from nibabel's ``Nifti1Header``, voxels in Fortran order
after the 352-byte single-file header, gzip with mtime 0), never by ``nib.save``, which picks
its own scaling and offset: the broken files need exact control of those bytes, and the good
ones the same bytes for the same seed. The pixels come from generators keyed by the seed and
the case (:func:`packer.demo.seeded_rng`), independent of the rest of the demo tree.

CT values are stored as HU directly (``scl_slope`` 1, ``scl_inter`` 0), not as ``HU + 1024``
with ``scl_inter = -1024``: packer's reader takes the scaling from the loaded image's header,
which nibabel resets, so a scaled file would be packed in stored values.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from packer.demo import PlantedDefect, seeded_rng

#: Label map ids of the CT cases (0 is background).
CT_CLASSES = {"liver": 1, "kidney": 2, "spleen": 3}
#: Label map ids of the MR case, as the Decathlon's brain tumour task numbers them.
MR_CLASSES = {"edema": 1, "non_enhancing_tumour": 2, "enhancing_tumour": 3}
#: The MR case's sequences, in channel order: the row's own file first, then its channel_files.
MR_SEQUENCES = ("t1", "t1ce", "t2", "flair")
#: The good CT cases: how each is stored (its voxel axes, as nibabel's axis codes, and a tilt
#: about the left-right axis in degrees), and whether its label map is stored in other axes.
CT_CASES = {
    "CT001": ("LAS", 0.0, False),
    "CT002": ("LAS", 0.0, False),
    "CT003": ("RAS", 0.0, True),
    "CT004": ("LAI", 0.0, False),
    "CT005": ("ASL", 0.0, False),
    "CT006": ("LAS", 4.0, False),
    "CT007": ("LAS", 0.0, False),
    "CT008": ("RAS", 0.0, False),
}
#: CT003's label map is stored in these axes (an exporter reoriented it): packed, not refused.
LABEL_OTHER_AXES = "RPI"
#: ``ct/broken/<name>.nii.gz``: what is wrong with it, and the reason code a build gives it
#: (None: it packs; the build records both affines and the sample carries a warning).
CT_BROKEN = {
    "truncated": ("the gzip stream cut at 55%: the header reads, the voxels end early", "truncated"),
    "vox_offset": ("vox_offset 348, inside the 352-byte NIfTI-1 header (an Analyze-era writer)", "unreadable"),
    "zero_pixdim": ("slice thickness 0 in pixdim and in the sform (a 2-D export)", "bad_geometry"),
    "nan_voxels": ("float32 with NaN outside the reconstructed field of view", "non_finite"),
    "sform_qform": ("the sform moved 10 mm and turned 3 degrees by a registration, the qform not", None),
    "rgb": ("datatype RGB24 (a screenshot of the volume)", "unsupported"),
    "complex": ("datatype complex64 (raw reconstruction output)", "unsupported"),
    "four_d": ("two contrast phases stacked along a 4th axis", "unsupported_dimensions"),
    "wrong_grid": ("a good image whose label map's header comes from another case", "mask_geometry"),
}
#: The CT display range written as cal_min/cal_max (abdomen window: a ``file`` window uses it).
CT_CAL = (-160.0, 240.0)
_NIFTI_INTENT_LABEL = 1002
_XFORM_SCANNER = 1
_HEADER_BYTES = 352  # the 348-byte NIfTI-1 header and 4 bytes of extension flags


@dataclass(frozen=True)
class NiftiDemo:
    """What :func:`write_nifti_examples` wrote under ``root`` (``demo-raw/nifti``): the good CT
    cases, the MR case, the planted defects (relative to ``root``) and the file that packs with
    a warning (``warned``)."""

    root: Path
    ct_cases: tuple[str, ...]
    mr_cases: tuple[str, ...]
    defects: tuple[PlantedDefect, ...]
    warned: tuple[str, ...]


# ---------------------------------------------------------------- files


def nifti_bytes(data: NDArray[np.generic], affine: NDArray[np.float64], *, qform: NDArray[np.float64] | None = None,
                sform_code: int = _XFORM_SCANNER, pixdim: Sequence[float] | None = None, vox_offset: int = 352,
                cal: tuple[float, float] | None = None, intent_code: int = 0) -> bytes:
    """A single-file NIfTI-1 (``.nii``) holding ``data`` (X×Y×Z or X×Y×Z×T, any dtype nibabel
    maps to a NIfTI datatype, structured RGB included) with ``affine`` (voxel → RAS mm) as its
    sform (``sform_code``; 0 leaves it unset) and ``qform`` (default: the same) as its qform,
    no scaling (slope 1, intercept 0). ``pixdim`` overrides the voxel sizes set_qform writes,
    ``vox_offset`` the offset (the voxels still follow the header at byte 352)."""
    import nibabel as nib

    header = nib.Nifti1Header(endianness="<")
    header.set_data_dtype(data.dtype)
    header.set_data_shape(data.shape)
    header.set_qform(affine if qform is None else qform, code=_XFORM_SCANNER)
    header.set_sform(affine, code=sform_code)
    header.set_xyzt_units("mm", "sec")
    header["scl_slope"], header["scl_inter"] = 1.0, 0.0
    if cal is not None:
        header["cal_min"], header["cal_max"] = cal
    header["intent_code"] = intent_code
    header["descrip"] = b"packer demo (synthetic)"
    if pixdim is not None:
        header["pixdim"][1:1 + len(pixdim)] = pixdim
    header["vox_offset"] = vox_offset
    block = header.binaryblock
    little = np.asarray(data)
    if little.dtype.fields is None:  # the same bytes on any machine (RGB24 is bytes already)
        little = little.astype(little.dtype.newbyteorder("<"), copy=False)
    return block + b"\0" * (_HEADER_BYTES - len(block)) + little.tobytes(order="F")


def _write(path: Path, raw: bytes) -> None:
    """``raw`` gzipped (no name, mtime 0: the same bytes every time) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw, compresslevel=6, mtime=0))


def reorient(data: NDArray[np.generic], affine: NDArray[np.float64], axes: str
             ) -> tuple[NDArray[np.generic], NDArray[np.float64]]:
    """``data`` and ``affine`` stored along ``axes`` (nibabel axis codes, e.g. ``"RPI"``): the
    same voxels in the same places, only the storage order changed (no resampling)."""
    from nibabel.orientations import apply_orientation, axcodes2ornt, inv_ornt_aff, io_orientation, ornt_transform

    change = ornt_transform(io_orientation(affine), axcodes2ornt(tuple(axes)))
    moved = np.ascontiguousarray(apply_orientation(data, change))
    return moved, affine @ inv_ornt_aff(change, data.shape[:3])


def grid_affine(axes: str, spacing: tuple[float, float, float], shape: tuple[int, int, int],
                tilt_degrees: float = 0.0) -> NDArray[np.float64]:
    """The affine (voxel → RAS mm) of a grid whose voxel axes run along ``axes`` (one code per
    axis: L/R, A/P, S/I), ``spacing`` (x, y, z mm, patient axes), ``shape`` in voxel order,
    centred on the patient origin, turned ``tilt_degrees`` about the left-right axis."""
    unit = {"R": (0, 1.0), "L": (0, -1.0), "A": (1, 1.0), "P": (1, -1.0), "S": (2, 1.0), "I": (2, -1.0)}
    columns = np.zeros((3, 3))
    for axis, code in enumerate(axes):
        world, sign = unit[code]
        columns[world, axis] = sign * spacing[world]
    angle = np.radians(tilt_degrees)
    turn = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(angle), -np.sin(angle)], [0.0, np.sin(angle), np.cos(angle)]])
    affine = np.eye(4)
    affine[:3, :3] = turn @ columns
    affine[:3, 3] = -affine[:3, :3] @ ((np.array(shape, dtype=np.float64) - 1) / 2)
    return np.round(affine, 6)


def _world(affine: NDArray[np.float64], shape: tuple[int, int, int]) -> NDArray[np.float32]:
    """RAS mm of every voxel centre: X×Y×Z×3, float32 (the phantoms need no more)."""
    index = np.stack(np.meshgrid(*(np.arange(n, dtype=np.float32) for n in shape), indexing="ij"), axis=-1)
    return (index @ affine[:3, :3].T.astype(np.float32) + affine[:3, 3].astype(np.float32)).astype(np.float32)


def _write_table(path: Path, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _write_dataset_json(path: Path, name: str, channels: Sequence[str], classes: dict[str, int],
                        cases: int) -> None:
    doc = {"name": name, "description": "packer demo: synthetic, no real patients",
           "channel_names": {str(i): c for i, c in enumerate(channels)},
           "labels": {"background": 0, **classes}, "numTraining": cases, "file_ending": ".nii.gz"}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- an abdomen


@dataclass(frozen=True)
class Abdomen:
    """One patient's abdomen in RAS mm (x to the patient's right, y anterior, z superior): the
    body's half-widths (``ax``, ``ay``) and fat, the level the scan is centred on (``z0``), each
    organ as (x, y, z, half-size x, y, z) inside the muscle wall, and the seed of the bowel loops."""

    cx: float
    cy: float
    ax: float
    ay: float
    fat: float
    z0: float
    liver: tuple[float, ...]
    spleen: tuple[float, ...]
    kidney: tuple[float, ...]
    bowel: int

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Abdomen:
        """A patient: each part varies over a range typical of adults, so no two patients'
        slices look alike while one patient's neighbouring slices do."""
        ax, ay, fat = float(rng.uniform(120, 160)), float(rng.uniform(90, 120)), float(rng.uniform(8, 26))
        ix, iy = ax - fat, ay - fat  # inside the subcutaneous fat

        def organ(x: float, y: float, z: float, size: tuple[float, float, float]) -> tuple[float, ...]:
            return (x + float(rng.uniform(-10, 10)), y + float(rng.uniform(-8, 8)), z + float(rng.uniform(-15, 15)),
                    *(s * float(rng.uniform(0.8, 1.2)) for s in size))

        return cls(cx=float(rng.uniform(-15, 15)), cy=float(rng.uniform(-10, 10)), ax=ax, ay=ay, fat=fat,
                   z0=float(rng.uniform(-20, 20)),
                   liver=organ(0.4 * ix, 0.05 * iy, 40.0, (0.45 * ix, 0.6 * iy, 75.0)),
                   spleen=organ(-0.55 * ix, -0.35 * iy, 45.0, (0.17 * ix, 0.28 * iy, 45.0)),
                   kidney=organ(0.45 * ix, -iy + 40, -35.0, (24.0, 20.0, 45.0)),
                   bowel=int(rng.integers(0, 1 << 30)))

    def render(self, world: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
        """HU (float32, before noise) and the label map (uint8, :data:`CT_CLASSES`) at ``world``
        (…×3 RAS mm). Air -1000, the table under the patient 300, subcutaneous fat -100, the
        muscle wall 50, abdominal fat -80 with bowel loops (30, some with gas -950), liver 60,
        spleen 45, kidneys 150 (contrast) around sinus fat -40, the aorta 200, the inferior vena
        cava 120, a vertebra 250 in a cortex of 700, discs 80, the spinal canal 20."""
        x, y, z = world[..., 0] - self.cx, world[..., 1] - self.cy, world[..., 2] - self.z0
        ix, iy = self.ax - self.fat, self.ay - self.fat
        widen = 1.0 + 0.0015 * np.clip(z, -100, 100)  # the body widens towards the chest
        hu = np.full(x.shape, -1000.0, dtype=np.float32)
        labels = np.zeros(x.shape, dtype=np.uint8)
        hu[(y > -self.ay - 30) & (y < -self.ay - 22) & (np.abs(x) < 1.3 * self.ax)] = 300.0
        hu[(x / (self.ax * widen)) ** 2 + (y / self.ay) ** 2 <= 1] = -100.0
        hu[(x / (ix * widen)) ** 2 + (y / iy) ** 2 <= 1] = 50.0
        inside = (x / (ix * widen - 12)) ** 2 + (y / (iy - 12)) ** 2 <= 1
        hu[inside] = -80.0
        loops = np.random.default_rng(self.bowel)
        for _ in range(int(loops.integers(5, 9))):
            bx, by = float(loops.uniform(-0.5, 0.5)) * ix, float(loops.uniform(0.0, 0.6)) * iy
            bz, radius = float(loops.uniform(-80, 60)), float(loops.uniform(14, 26))
            off = (x - bx) ** 2 + (y - by) ** 2 + ((z - bz) / 1.6) ** 2
            hu[inside & (off <= radius ** 2)] = 30.0
            if loops.random() < 0.5:
                gas = (x - bx) ** 2 + (y - by - radius / 3) ** 2 + ((z - bz) / 1.6) ** 2 <= (radius / 2.2) ** 2
                hu[inside & gas] = -950.0

        def ellipsoid(part: Sequence[float], dx: float = 0.0, dz: float = 0.0) -> NDArray[np.bool_]:
            return inside & ((((x - part[0] - dx) / part[3]) ** 2 + ((y - part[1]) / part[4]) ** 2
                              + ((z - part[2] - dz) / part[5]) ** 2) <= 1)

        liver = ellipsoid(self.liver) & (x - self.liver[0] > -0.6 * self.liver[3] + 0.3 * (y - self.liver[1]))
        hu[liver], labels[liver] = 60.0, CT_CLASSES["liver"]
        spleen = ellipsoid(self.spleen)
        hu[spleen], labels[spleen] = 45.0, CT_CLASSES["spleen"]
        for dx, dz in ((0.0, -12.0), (-2 * self.kidney[0], 0.0)):  # the right kidney (+x) sits lower
            kidney = ellipsoid(self.kidney, dx, dz)
            hu[kidney], labels[kidney] = 150.0, CT_CLASSES["kidney"]
            centre = self.kidney[0] + dx - np.sign(self.kidney[0] + dx) * 0.4 * self.kidney[3]
            sinus = ((x - centre) / 8) ** 2 + ((y - self.kidney[1]) / 7) ** 2 + ((z - self.kidney[2] - dz) / 20) ** 2
            hu[kidney & (sinus <= 1)] = -40.0  # renal sinus fat: kidney in the label map all the same
        spine_y = -iy + 30
        for vx, vy, radius, value in ((-15.0, spine_y + 34, 11.0, 200.0), (22.0, spine_y + 32, 12.0, 120.0)):
            vessel = (x - vx) ** 2 + (y - vy) ** 2 <= radius ** 2
            hu[vessel & (labels == 0)] = value
        vertebra = (x ** 2 + (y - spine_y) ** 2) / 22 ** 2
        disc = np.abs(((z + 340.0) % 34.0) - 17.0) > 13.0
        hu[vertebra <= 1] = np.where(disc, 80.0, 700.0)[vertebra <= 1]
        hu[(vertebra <= 0.7) & ~disc] = 250.0
        hu[x ** 2 + (y - spine_y + 30) ** 2 <= 8 ** 2] = 20.0
        labels[vertebra <= 1] = 0
        return hu, labels


def _ct_grid(rng: np.random.Generator, axes: str, tilt: float, matrix: int = 64
             ) -> tuple[tuple[int, int, int], NDArray[np.float64]]:
    """A CT case's voxel grid, stored along ``axes``: ``matrix``² in plane over 350-400 mm
    (5.5-6.3 mm pixels at 64) and 160-220 mm along z (36-44 slices of 4 or 5 mm at 64)."""
    scale = 64 / matrix
    pixel, thickness = round(float(rng.uniform(5.5, 6.3)) * scale, 2), float(rng.choice([4.0, 5.0])) * scale
    slices = round(int(rng.integers(36, 45)) / scale)
    extent = {0: matrix, 1: matrix, 2: slices}  # along patient x, y, z
    world_of = {"R": 0, "L": 0, "A": 1, "P": 1, "S": 2, "I": 2}
    shape = (extent[world_of[axes[0]]], extent[world_of[axes[1]]], extent[world_of[axes[2]]])
    return shape, grid_affine(axes, (pixel, pixel, thickness), shape, tilt)


def render_ct_case(seed: int, name: str, axes: str, tilt: float = 0.0, matrix: int = 64
                   ) -> tuple[NDArray[np.int16], NDArray[np.uint8], NDArray[np.float64]]:
    """One CT case of patient ``name`` (:func:`_ct_grid`): int16 HU (noise σ 6 HU; -1024 outside
    the reconstruction circle, as scanners pad), its label map and its affine (voxel → RAS mm)."""
    rng = seeded_rng(seed, "nifti-ct", name)
    anatomy = Abdomen.draw(seeded_rng(seed, "nifti-ct-anatomy", name))
    shape, affine = _ct_grid(rng, axes, tilt, matrix)
    world = _world(affine, shape)
    hu, labels = anatomy.render(world)
    hu += rng.standard_normal(hu.shape, dtype=np.float32) * 6.0
    radius = matrix / 2 * float(np.linalg.norm(affine[:3, :3], axis=0).min())
    hu[world[..., 0] ** 2 + world[..., 1] ** 2 > radius ** 2] = -1024.0
    return np.clip(np.rint(hu), -1024, 3071).astype(np.int16), labels, affine


# ---------------------------------------------------------------- a brain


#: Each tissue's signal per sequence (t1, t1ce, t2, flair), in the units of an imagined scanner;
#: a tissue's code in :func:`render_mr_case` is its place here plus one (0: outside the brain).
_MR_SIGNAL = {
    "gm": (650, 650, 900, 700), "wm": (900, 900, 600, 500), "csf": (250, 250, 2000, 120),
    "edema": (550, 560, 1600, 1250), "enhancing": (600, 1500, 1100, 900), "necrosis": (300, 320, 1800, 400),
}
_TISSUE = {name: code for code, name in enumerate(_MR_SIGNAL, start=1)}
#: Each sequence's own gain: MR units differ between sequences (a fixed window means nothing).
_MR_GAIN = (1.0, 1.3, 0.8, 2.1)


def render_mr_case(seed: int, name: str) -> tuple[list[NDArray[np.int16]], NDArray[np.uint8], NDArray[np.float64]]:
    """A skull-stripped brain with a tumour: the four sequences of :data:`MR_SEQUENCES` (int16,
    48×48×30 voxels of 4.5×4.5×4 mm, stored LAS, background exactly 0), its label map
    (:data:`MR_CLASSES`) and their one affine. Every axial slice holds brain."""
    rng = seeded_rng(seed, "nifti-mr", name)
    shape = (48, 48, 30)
    affine = grid_affine("LAS", (4.5, 4.5, 4.0), shape)
    world = _world(affine, shape)
    x, y, z = world[..., 0], world[..., 1] + 8.0, world[..., 2]
    brain = (x / 70) ** 2 + (y / 86) ** 2 + (np.maximum(z, -30) / 64) ** 2 + (np.minimum(z + 30, 0) / 40) ** 2
    tissue = np.zeros(shape, dtype=np.uint8)
    tissue[brain <= 1] = _TISSUE["gm"]
    tissue[brain <= 0.72] = _TISSUE["wm"]
    for side in (-1.0, 1.0):  # the lateral ventricles
        tissue[((x - side * 9) / 7) ** 2 + ((y + 5) / 26) ** 2 + ((z - 8) / 16) ** 2 <= 1] = _TISSUE["csf"]
    tx, ty, tz = float(rng.choice([-1.0, 1.0])) * float(rng.uniform(30, 40)), float(rng.uniform(-20, 20)), \
        float(rng.uniform(0, 20))
    distance = np.sqrt(((x - tx) / 1.1) ** 2 + (y - ty) ** 2 + ((z - tz) / 0.9) ** 2)
    labels = np.zeros(shape, dtype=np.uint8)
    for limit, kind, label in ((30.0, "edema", "edema"), (17.0, "enhancing", "enhancing_tumour"),
                               (11.0, "necrosis", "non_enhancing_tumour")):
        inside = (distance <= limit) & (brain <= 1)
        tissue[inside] = _TISSUE[kind]
        labels[inside] = MR_CLASSES[label]
    bias = 1.0 + 0.15 * x / 90 + 0.1 * z / 60  # the receive coil's smooth shading
    sequences = []
    for channel, gain in enumerate(_MR_GAIN):
        signal = np.array([0.0, *(values[channel] for values in _MR_SIGNAL.values())], dtype=np.float32)[tissue]
        noise = rng.standard_normal((2, *shape), dtype=np.float32) * 25.0
        magnitude = np.hypot(signal * bias + noise[0], noise[1]) * gain  # Rician, as magnitude images are
        magnitude[brain > 1] = 0.0
        sequences.append(np.rint(magnitude).astype(np.int16))
    return sequences, labels, affine


# ---------------------------------------------------------------- the tree


def _write_ct(root: Path, seed: int) -> list[list[str]]:
    rows = []
    for name, (axes, tilt, moved) in CT_CASES.items():
        hu, labels, affine = render_ct_case(seed, name, axes, tilt)
        _write(root / "imagesTr" / f"{name}_0000.nii.gz", nifti_bytes(hu, affine, cal=CT_CAL))
        stored, label_affine = reorient(labels, affine, LABEL_OTHER_AXES) if moved else (labels, affine)
        _write(root / "labelsTr" / f"{name}.nii.gz",
               nifti_bytes(stored, label_affine, intent_code=_NIFTI_INTENT_LABEL))
        rows.append([f"imagesTr/{name}_0000.nii.gz", name, f"labelsTr/{name}.nii.gz"])
    return rows


def _registration() -> NDArray[np.float64]:
    """What a registration did to ``sform_qform.nii.gz``'s sform (not its qform): 3 degrees about
    the superior axis and 10 mm in plane."""
    angle = np.radians(3.0)
    move = np.eye(4)
    move[:3, :3] = [[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0], [0.0, 0.0, 1.0]]
    move[:3, 3] = [6.0, -8.0, 0.0]
    return move


def _broken() -> dict[str, Callable[[NDArray[np.int16], NDArray[np.float64]], bytes]]:
    """How each of :data:`CT_BROKEN` is made from a case (its HU and affine)."""

    def truncated(hu: NDArray[np.int16], affine: NDArray[np.float64]) -> bytes:
        whole = gzip.compress(nifti_bytes(hu, affine), compresslevel=6, mtime=0)
        return whole[:len(whole) * 55 // 100]

    def zero_pixdim(hu: NDArray[np.int16], affine: NDArray[np.float64]) -> bytes:
        flat = affine.copy()
        flat[:3, 2] = 0.0
        spacing = np.linalg.norm(affine[:3, :3], axis=0)
        return nifti_bytes(hu, flat, qform=affine, pixdim=[float(spacing[0]), float(spacing[1]), 0.0])

    def nan_voxels(hu: NDArray[np.int16], affine: NDArray[np.float64]) -> bytes:
        values = hu.astype(np.float32)
        values[hu == -1024] = np.nan
        return nifti_bytes(values, affine)

    def sform_qform(hu: NDArray[np.int16], affine: NDArray[np.float64]) -> bytes:
        return nifti_bytes(hu, np.round(_registration() @ affine, 6), qform=affine)

    def rgb(hu: NDArray[np.int16], affine: NDArray[np.float64]) -> bytes:
        grey = np.clip((hu.astype(np.float32) + 160) / 400 * 255, 0, 255).astype(np.uint8)
        colour = np.empty(hu.shape, dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
        colour["R"], colour["G"], colour["B"] = grey, grey, grey
        return nifti_bytes(colour, affine)

    def four_d(hu: NDArray[np.int16], affine: NDArray[np.float64]) -> bytes:
        venous = np.where((hu > 0) & (hu < 300), hu + 40, hu).astype(np.int16)
        return nifti_bytes(np.stack([hu, venous], axis=-1), affine)

    return {
        "truncated": truncated,
        "vox_offset": lambda hu, affine: nifti_bytes(hu, affine, vox_offset=348),
        "zero_pixdim": zero_pixdim,
        "nan_voxels": nan_voxels,
        "sform_qform": sform_qform,
        "rgb": rgb,
        "complex": lambda hu, affine: nifti_bytes(hu.astype(np.complex64), affine),
        "four_d": four_d,
        "wrong_grid": lambda hu, affine: nifti_bytes(hu, affine, cal=CT_CAL),
    }


def _write_ct_broken(root: Path, seed: int) -> tuple[list[list[str]], list[PlantedDefect], list[str]]:
    """``broken/<name>.nii.gz`` and ``broken/<name>_label.nii.gz`` for each of :data:`CT_BROKEN`,
    each its own patient; the table rows, the defects and the file that packs."""
    rows: list[list[str]] = []
    defects: list[PlantedDefect] = []
    warned: list[str] = []
    makers = _broken()
    for n, (name, (_, reason)) in enumerate(CT_BROKEN.items(), start=1):
        patient = f"BRK{n:02d}"
        # small (32², 12 mm pixels): they are refused before any sample is made; the one that packs is full size
        hu, labels, affine = render_ct_case(seed, patient, "LAS", matrix=64 if name == "sform_qform" else 32)
        raw = makers[name](hu, affine)
        path = root / "broken" / f"{name}.nii.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == "truncated":
            path.write_bytes(raw)  # already gzipped, then cut
        else:
            _write(path, raw)
        label_affine = affine
        if name == "sform_qform":  # the label map was drawn in the registered space: the sform's grid
            label_affine = np.round(_registration() @ affine, 6)
        elif name == "wrong_grid":  # its header copied from another case: another grid
            label_affine = render_ct_case(seed, "BRK99", "LAS", matrix=32)[2]
        _write(root / "broken" / f"{name}_label.nii.gz",
               nifti_bytes(labels, label_affine, intent_code=_NIFTI_INTENT_LABEL))
        rows.append([f"broken/{name}.nii.gz", patient, f"broken/{name}_label.nii.gz"])
        if reason is None:
            warned.append(f"ct/broken/{name}.nii.gz")
        else:
            defects.append(PlantedDefect(f"ct/broken/{name}.nii.gz", reason))
    return rows, defects, warned


def _write_mr(root: Path, seed: int) -> list[list[str]]:
    rows = []
    for name in ("BRAIN001",):
        sequences, labels, affine = render_mr_case(seed, name)
        files = []
        for channel, values in enumerate(sequences):
            rel = f"imagesTr/{name}_{channel:04d}.nii.gz"
            _write(root / rel, nifti_bytes(values, affine))
            files.append(rel)
        _write(root / "labelsTr" / f"{name}.nii.gz", nifti_bytes(labels, affine, intent_code=_NIFTI_INTENT_LABEL))
        rows.append([files[0], name, f"labelsTr/{name}.nii.gz", *files[1:]])
    return rows


def write_nifti_examples(root: Path, seed: int) -> NiftiDemo:
    """Write ``root`` (``demo-raw/nifti``) as the module docstring lays it out and return what
    was written; the same seed gives the same bytes. The caller clears an earlier tree."""
    root = Path(root)
    ct, mr = root / "ct", root / "mr"
    ct_rows = _write_ct(ct, seed)
    broken_rows, defects, warned = _write_ct_broken(ct, seed)
    _write_table(ct / "cases.csv", ["path", "entity", "mask"], ct_rows + broken_rows)
    _write_dataset_json(ct / "dataset.json", "packer demo abdomen CT", ["CT"], CT_CLASSES, len(ct_rows))
    mr_rows = _write_mr(mr, seed)
    _write_table(mr / "cases.csv", ["path", "entity", "mask", *MR_SEQUENCES[1:]], mr_rows)
    _write_dataset_json(mr / "dataset.json", "packer demo brain MR", MR_SEQUENCES, MR_CLASSES, len(mr_rows))
    return NiftiDemo(root=root, ct_cases=tuple(CT_CASES), mr_cases=tuple(row[1] for row in mr_rows),
                     defects=tuple(defects), warned=tuple(warned))


def readme_lines(tree: NiftiDemo) -> list[str]:
    """The demo README.txt's section on ``nifti/``: the layout, the cases, and each broken file
    with what is wrong with it (its reason code is in the README's list of planted defects)."""
    stored = [f"{name} {how}{f' tilted {tilt:g} degrees' if tilt else ''}" for name, (how, tilt, _) in CT_CASES.items()]
    other = [name for name, (_, _, moved) in CT_CASES.items() if moved]
    named = ", ".join
    return [
        "nifti/          NIfTI volumes in the Medical Segmentation Decathlon / nnU-Net layout",
        "                (workflows/nifti-slices.yaml, nifti-volume.yaml, nifti-mr.yaml):",
        f"  ct/imagesTr/<case>_0000.nii.gz   {len(tree.ct_cases)} abdomen CT cases, one patient each: int16 HU",
        "                   (no scaling), 64x64 voxels of 5.5-6.3 mm, 36-44 slices of 4-5 mm, stored in the",
        f"                   axes exporters write: {named(stored[:4])},",
        f"                   {named(stored[4:])}",
        "  ct/labelsTr/<case>.nii.gz        their label maps: "
        + named(f"{v} {k}" for k, v in {"background": 0, **CT_CLASSES}.items()),
        f"                   ({named(other)}'s stored {LABEL_OTHER_AXES}, not in its image's axes: reoriented, "
        "not refused)",
        "  ct/cases.csv     path,entity,mask (paths relative to ct/); ct/dataset.json names channels and labels",
        "  ct/broken/       one broken file of each kind, each its own patient with its label map",
        "                   <name>_label.nii.gz:",
        *(f"    {name + '.nii.gz':<22}{what}" + ("" if reason else "\n    " + " " * 22 + "(not bad: it packs, "
                                                  "with the sform, and the sample records both forms)")
          for name, (what, reason) in CT_BROKEN.items()),
        f"  mr/imagesTr/<case>_000N.nii.gz   {len(tree.mr_cases)} skull-stripped brain MR case "
        f"({named(tree.mr_cases)}), 48x48x30 voxels:",
        "                   " + named(f"_{n:04d} {s}" for n, s in enumerate(MR_SEQUENCES)) + ", on one grid",
        "  mr/labelsTr/<case>.nii.gz        " + named(f"{v} {k}" for k, v in {"background": 0, **MR_CLASSES}.items()),
        f"  mr/cases.csv     path,entity,mask,{','.join(MR_SEQUENCES[1:])} (the row's own file is "
        f"{MR_SEQUENCES[0]}; channel_files: {named(MR_SEQUENCES[1:])})",
    ]
