"""NIfTI sources, checked against references packer does not share code with.

Every test plants an asymmetric phantom (:mod:`nifti_files`: a box on the patient's left, a
sphere anterior-superior, a ramp) in RAS millimetres, has nibabel write it on a grid of some
orientation, builds a real ``kind: nifti`` job in-process and reads the shards back with
``tarfile``/``numpy.load``. Each packed voxel is then taken through the geometry its record
states (``metadata.volume.affine``, or ``metadata.slice`` + ``pixel_spacing``) to LPS mm, to RAS,
to the file's voxel index by the inverse of nibabel's own ``img.affine``, and compared with
``img.get_fdata()`` through the window formula of DICOM PS3.3 (written out in
:mod:`nifti_files`). SimpleITK is the second, independent reader of the files' geometry.

What is specified here:

- geometry: axial, coronal, sagittal and oblique grids, flipped axes, sform, qform only, pixdim
  only (nibabel's fall-back), an sform that disagrees with its qform (the sform wins and the
  record says so), NIfTI-1 and -2, little- and big-endian, ``.nii`` and ``.nii.gz``;
- values: float data as stored, integer data through ``scl_slope``/``scl_inter`` (CT stored as
  HU + 1024 with ``scl_inter = -1024`` is in HU);
- display: volumes in canonical axes (D superior, H posterior, W left), axial slices with
  anterior up and the patient's right on the picture's left, coronal and sagittal superior up;
- label maps: aligned through reorientation, resampling, crop/pad and slice resizing, stored in
  another orientation, on another grid (refused, or resampled when asked);
- normalisation: percentiles and z-scores equal numpy's, and the statistics recorded are those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from nibabel.affines import apply_affine
from nifti_files import (
    ANTERIOR,
    INFERIOR,
    LEFT,
    POSTERIOR,
    RAS_TO_LPS,
    RIGHT,
    SUPERIOR,
    Form,
    Grid,
    Packed,
    build_nifti,
    exact_index,
    file_index,
    grid,
    inside_box,
    inside_sphere,
    lps_to_ras,
    nearest_labels,
    phantom_ras,
    rotation,
    to_uint8,
    trilinear,
    voxel_centres,
    window_linear,
    window_linear_exact,
    write_nifti,
)

# ------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One NIfTI file of the phantom: its grid, how its values are stored, and its header's forms.

    ``as_written``: the file places its voxels on ``grid`` (False for a pixdim-only file, which
    nibabel places by its own fall-back); ``source``: the affine packer must say it used."""

    name: str
    grid: Grid
    dtype: str = "float32"
    slope: float | None = None
    inter: float | None = None
    form: Form = Form()
    version: int = 1
    endian: str = "<"
    suffix: str = ".nii.gz"
    as_written: bool = True
    source: str = "sform"

    @property
    def filename(self) -> str:
        return self.name + self.suffix

    def stored(self) -> np.ndarray:
        """The phantom at the grid's voxel centres, as the file stores it."""
        values = phantom_ras(voxel_centres(self.grid.affine, self.grid.shape))
        if np.dtype(self.dtype).kind == "f":
            return values.astype(self.dtype)
        return np.rint((values - (self.inter or 0.0)) / (self.slope or 1.0)).astype(self.dtype)

    def write(self, folder: Path) -> Path:
        return write_nifti(folder / self.filename, self.stored(), self.grid.affine, form=self.form,
                           zooms=self.grid.spacing, slope=self.slope, inter=self.inter, version=self.version,
                           endian=self.endian)


RT, LT, ANT, POST, SUP, INF = RIGHT, LEFT, ANTERIOR, POSTERIOR, SUPERIOR, INFERIOR
AXIAL = grid("axial", RT, ANT, SUP, (3.0, 3.5, 5.0))
CASES = (
    Case("axial_ras", AXIAL),
    Case("axial_las_ct", grid("las", LT, ANT, SUP, (3.2, 3.0, 4.0)), dtype="int16", slope=1.0, inter=-1024.0,
         suffix=".nii"),
    Case("axial_lpi_bigendian", grid("lpi", LT, POST, INF, (3.0, 3.3, 4.5)), dtype="int16", slope=0.5,
         inter=-1024.0, endian=">"),
    Case("coronal_nifti2", grid("coronal", RT, SUP, POST, (3.0, 4.0, 5.0)), dtype="float64", version=2,
         suffix=".nii"),
    Case("sagittal", grid("sagittal", POST, SUP, RT, (3.0, 3.0, 5.0))),
    Case("sagittal_flipped", grid("sagittal_flipped", ANT, INF, LT, (3.5, 3.0, 4.0)), dtype="uint16", slope=0.25,
         inter=-300.0),
    Case("oblique", grid("oblique", RT, ANT, SUP, (3.0, 3.5, 5.0), turn=rotation(25, 15))),
    Case("oblique_flipped", grid("oblique_flipped", LT, ANT, INF, (3.0, 3.5, 5.0), turn=rotation(-20, 10, 8)),
         dtype="int16", slope=0.5, inter=-1024.0),
    Case("qform_only", grid("qform_only", RT, ANT, SUP, (3.0, 3.5, 5.0), turn=rotation(30, -12)),
         form=Form(0, 1), source="qform"),
    Case("pixdim_only", AXIAL, form=Form(0, 0), as_written=False, source="pixdim"),
    Case("sform_wins", grid("sform_wins", RT, ANT, SUP, (3.0, 3.5, 5.0), turn=rotation(-15, 0, 20)),
         form=Form(1, 1, qform=AXIAL.affine)),
)
BY_NAME = {case.name: case for case in CASES}
#: Cases whose sform and qform agree: SimpleITK (which prefers the qform) reads the same geometry.
#: (Not NIfTI-2: this SimpleITK finds no reader for it.)
AGREEING = tuple(c.name for c in CASES if c.form.qform is None and c.as_written and c.version == 1)
#: Cases whose file places the phantom where it was planted.
PLANTED = tuple(c.name for c in CASES if c.as_written)
WINDOWS = ["abdomen", {"center": 30, "width": 250, "function": "LINEAR_EXACT"}]


def windowed(values: np.ndarray) -> list[np.ndarray]:
    """The two channels :data:`WINDOWS` make of modality values, uint8 (as integers)."""
    return [to_uint8(window_linear(values, 50, 400)), to_uint8(window_linear_exact(values, 30, 250))]


def ties(values: np.ndarray) -> list[np.ndarray]:
    """Where 255·window(value) is within float32 round-off of a .5, so that packer's float32
    arithmetic may round it the other way: the only voxels allowed to be off by one."""
    out = []
    for y in (window_linear(values, 50, 400), window_linear_exact(values, 30, 250)):
        scaled = 255.0 * y
        out.append(np.abs(scaled - np.floor(scaled) - 0.5) < 1e-3)
    return out


def assert_windowed_equal(packed: np.ndarray, values: np.ndarray, what: str) -> None:
    """``packed`` (C×…, uint8) equals :func:`windowed` ``values`` exactly, except by one at a rounding tie."""
    for channel, (want, tie) in enumerate(zip(windowed(values), ties(values), strict=True)):
        diff = np.abs(packed[channel].astype(np.int64) - want)
        bad = (diff > 1) | ((diff == 1) & ~tie)
        assert not bad.any(), (f"{what}, channel {channel}: {int(bad.sum())} of {bad.size} voxels differ from the "
                               f"file's values through the window (largest difference {int(diff.max())})")


@dataclass
class Built:
    """The cases' files (nibabel images), and what one build packed from them."""

    folder: Path
    packed: Packed
    images: dict[str, Any] = field(default_factory=dict)

    def only(self, name: str) -> str:
        keys = self.packed.of_entity(name)
        assert len(keys) == 1, f"{name}: {len(keys)} samples"
        return keys[0]

    def data(self, name: str) -> np.ndarray:
        return np.asarray(self.images[name].get_fdata())


def build_cases(folder: Path, cases: tuple[Case, ...], nifti: dict[str, Any], **kwargs: Any) -> Built:
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    images = {case.name: nib.load(case.write(folder / "raw")) for case in cases}
    packed = build_nifti(folder, [{"path": case.filename, "entity": case.name} for case in cases], nifti, **kwargs)
    assert packed.bad == [], packed.bad
    return Built(folder, packed, images)


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Every case as one volume sample, not resampled."""
    return build_cases(tmp_path_factory.mktemp("volumes"), CASES, {"windows": WINDOWS, "sample": "volume"})


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Built]]:
    """Every case as slices along an axis (one build per axis, made when first asked for)."""
    built: dict[str, Built] = {}

    def along(axis: str) -> Built:
        if axis not in built:
            built[axis] = build_cases(tmp_path_factory.mktemp(f"slices-{axis}"), CASES,
                                      {"windows": WINDOWS, "sample": "slice", "axis": axis})
        return built[axis]

    yield along


def volume_lps(record: dict[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """LPS mm of every voxel (d, h, w) of a packed volume, by its recorded affine: (D, H, W, 3)."""
    return voxel_centres(np.asarray(record["metadata"]["volume"]["affine"]), shape)


def slice_lps(record: dict[str, Any], shape: tuple[int, int]) -> np.ndarray:
    """LPS mm of every pixel (r, c) of a packed slice by its record (DICOM's rule, PS3.3
    C.7.6.2.1.1: ``position + c·Δc·X + r·Δr·Y``, X the direction of increasing column, Y of
    increasing row, pixel spacing = [Δr, Δc]): (H, W, 3)."""
    meta = record["metadata"]
    position = np.asarray(meta["slice"]["position"])
    orientation = np.asarray(meta["slice"]["orientation"])
    row_mm, col_mm = meta["pixel_spacing"]
    rows, cols = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    return position + (cols[..., None] * col_mm) * orientation[:3] + (rows[..., None] * row_mm) * orientation[3:]


def values_at(img: Any, lps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The file's values (nibabel, scaled) at LPS points that must be its voxel centres, and their indices."""
    index = exact_index(file_index(img, lps), img.shape[:3])
    data = np.asarray(img.get_fdata())
    return data[index[..., 0], index[..., 1], index[..., 2]], index


# --------------------------------------------------------------------- voxels through geometry


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_every_packed_voxel_is_the_files_voxel_through_the_recorded_affine(volumes: Built, name: str) -> None:
    """Volume samples: each packed voxel, placed by ``metadata.volume.affine`` (LPS), is a voxel
    centre of the file (by nibabel's ``img.affine``), every file voxel is packed exactly once,
    and its value is the file's scaled value through each window."""
    key = volumes.only(name)
    image, record = volumes.packed.images[key], volumes.packed.records[key]
    img = volumes.images[name]
    assert image.dtype == np.uint8 and image.shape[0] == 2
    values, index = values_at(img, volume_lps(record, image.shape[1:]))
    assert len(np.unique(index.reshape(-1, 3), axis=0)) == index.size // 3 == int(np.prod(img.shape)), \
        "the packed volume is not a permutation of the file's voxels"
    assert_windowed_equal(image, values, name)


@pytest.mark.parametrize("name", [c.name for c in CASES])
@pytest.mark.parametrize("axis", ["axial", "coronal", "sagittal"])
def test_every_slice_pixel_is_the_files_voxel_through_the_slice_geometry(slices: Callable[[str], Built], axis: str,
                                                                         name: str) -> None:
    """Slice samples: each packed pixel, placed by ``metadata.slice`` (position of pixel (0, 0),
    orientation as DICOM's Image Orientation, pixel spacing [row, column]), is a voxel centre of
    the file; the slices together hold every file voxel once, and each value is the file's."""
    built = slices(axis)
    img = built.images[name]
    seen = []
    keys = built.packed.of_entity(name)
    for number, key in enumerate(keys):
        image, record = built.packed.images[key], built.packed.records[key]
        assert record["metadata"]["slice"]["axis"] == axis
        assert record["metadata"]["slice"]["index"] == number and record["metadata"]["slice"]["count"] == len(keys)
        values, index = values_at(img, slice_lps(record, image.shape[1:]))
        assert_windowed_equal(image, values, f"{name} {axis} slice {number}")
        seen.append(index.reshape(-1, 3))
    every = np.concatenate(seen)
    assert len(np.unique(every, axis=0)) == len(every) == int(np.prod(img.shape))


@pytest.mark.parametrize("name", PLANTED)
def test_packed_volume_holds_the_planted_phantom(volumes: Built, name: str) -> None:
    """Independently of nibabel's reading: at the LPS position the record gives each packed
    voxel, the planted phantom (in RAS) has the packed value (to the file's storage precision:
    a scaled integer is within slope/2 of the truth, hence ±1 in uint8)."""
    key = volumes.only(name)
    image, record = volumes.packed.images[key], volumes.packed.records[key]
    truth = phantom_ras(lps_to_ras(volume_lps(record, image.shape[1:])))
    for channel, want in enumerate(windowed(truth)):
        diff = np.abs(image[channel].astype(np.int64) - want)
        assert diff.max() <= 1, f"{name} channel {channel}: off the planted phantom by up to {int(diff.max())}"
    # the structures are where they were planted: the box on the patient's left (LPS x > 0), the
    # sphere anterior (LPS y < 0) and superior (z > 0), as the abdomen window shows them
    ras = lps_to_ras(volume_lps(record, image.shape[1:]))
    box, sphere = inside_box(ras, margin=4.0), inside_sphere(ras, margin=4.0)
    assert box.sum() > 20 and sphere.sum() > 10
    lps = volume_lps(record, image.shape[1:])
    assert (lps[box][:, 0] > 0).all() and (lps[sphere][:, 1] < 0).all() and (lps[sphere][:, 2] > 0).all()
    around = ~inside_box(ras, margin=-4.0) & ~inside_sphere(ras, margin=-4.0)
    assert image[0][box].mean() > image[0][around].mean() + 60


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_volume_axes_run_superior_posterior_left(volumes: Built, name: str) -> None:
    """Canonical axes: D runs along the patient axis closest to superior, H to posterior, W to
    left (LPS +z, +y, +x), each with a positive component, the voxel sizes those of the file."""
    key = volumes.only(name)
    affine = np.asarray(volumes.packed.records[key]["metadata"]["volume"]["affine"])
    for axis, world in enumerate((2, 1, 0)):
        column = affine[:3, axis]
        assert int(np.argmax(np.abs(column))) == world and column[world] > 0, (name, axis, column)
    file_sizes = sorted(np.linalg.norm(volumes.images[name].affine[:3, :3], axis=0).round(4))
    assert sorted(np.linalg.norm(affine[:3, :3], axis=0).round(4)) == file_sizes


DISPLAY = {  # (X: direction of increasing column, Y: of increasing row), in LPS
    "axial": ((1, 0, 0), (0, 1, 0)),  # patient's right on the left of the picture, anterior up
    "coronal": ((1, 0, 0), (0, 0, -1)),  # patient's right on the left, superior up
    "sagittal": ((0, 1, 0), (0, 0, -1)),  # anterior on the left, superior up
}


def picture(built: Built, name: str, axis: str, at: float) -> np.ndarray:
    """Which pixels are bright (the box or the sphere through the abdomen window) in the packed
    slice of ``name`` nearest LPS coordinate ``at`` along the slice axis (x sagittal, y coronal,
    z axial)."""
    along = {"axial": 2, "coronal": 1, "sagittal": 0}[axis]
    keys = built.packed.of_entity(name)
    key = min(keys, key=lambda k: abs(built.packed.records[k]["metadata"]["slice"]["position"][along] - at))
    return built.packed.images[key][0] > 150  # box (~230) and sphere (~200) above any background (< 125)


@pytest.mark.parametrize("axis", list(DISPLAY))
def test_slices_are_shown_as_radiologists_read_them(slices: Callable[[str], Built], axis: str) -> None:
    """Whatever the file's storage order (RAS, LAS, LPI, coronal, sagittal, flipped), packed
    slices are displayed one way: orientation as :data:`DISPLAY`, and, read from the pictures
    alone, the box (patient's left) on the picture's right in axial and coronal slices, the
    sphere (anterior, superior) in the top rows of axial (anterior up), coronal and sagittal
    (superior up) slices and the left columns of sagittal ones (anterior left)."""
    built = slices(axis)
    for name in ("axial_ras", "axial_las_ct", "axial_lpi_bigendian", "coronal_nifti2", "sagittal",
                 "sagittal_flipped"):
        for key in built.packed.of_entity(name):
            orientation = np.asarray(built.packed.records[key]["metadata"]["slice"]["orientation"])
            np.testing.assert_allclose(orientation, np.concatenate(DISPLAY[axis]), atol=1e-6, err_msg=name)
        if axis == "axial":  # z = 10 mm cuts the box (RAS x < -14) and the sphere (RAS x ≈ 6, y ≈ 24)
            bright = picture(built, name, axis, 10.0)
            half = bright.shape[1] // 2
            box, sphere = bright[:, half + 3:], bright[:, : half - 1]
            assert box.sum() > 20 and sphere.sum() > 4, name
            assert np.nonzero(sphere)[0].mean() < bright.shape[0] / 2, f"{name}: the anterior sphere is not up"
        if axis == "coronal":
            bright = picture(built, name, axis, 0.0)  # through the box only
            assert bright[:, bright.shape[1] // 2:].sum() > 20 and not bright[:, : bright.shape[1] // 2].any(), name
            bright = picture(built, name, axis, -24.0)  # through the sphere (RAS y = 24)
            rows = np.nonzero(bright)[0]
            assert len(rows) > 10 and rows.mean() < bright.shape[0] / 2, f"{name}: the superior sphere is not up"
        if axis == "sagittal":
            bright = picture(built, name, axis, -6.0)  # through the sphere (RAS x = 6)
            rows, cols = np.nonzero(bright)
            assert len(rows) > 10, name
            assert rows.mean() < bright.shape[0] / 2 and cols.mean() < bright.shape[1] / 2, \
                f"{name}: the anterior-superior sphere is not at the top left"


def test_affine_source_and_disagreeing_forms_are_recorded(volumes: Built) -> None:
    """``metadata.nifti.affine_source`` names the form used (nibabel's rule: sform, else qform,
    else pixdim), and only a file whose qform disagrees with its sform gets the warning, with
    the qform and the largest difference recorded."""
    for case in CASES:
        meta = volumes.packed.records[volumes.only(case.name)]["metadata"]
        assert meta["nifti"]["affine_source"] == case.source, case.name
        np.testing.assert_allclose(np.asarray(meta["nifti"]["affine_ras"]), volumes.images[case.name].affine,
                                   atol=1e-5, err_msg=case.name)
        if case.name == "sform_wins":
            voxels = np.indices(volumes.images[case.name].shape[:3]).reshape(3, -1).T  # every voxel, by brute force
            apart = np.linalg.norm(apply_affine(case.grid.affine, voxels) - apply_affine(AXIAL.affine, voxels), axis=1)
            assert meta["nifti"]["forms_differ_mm"] == pytest.approx(apart.max(), abs=1e-3)
            np.testing.assert_allclose(np.asarray(meta["nifti"]["qform_ras"]), AXIAL.affine, atol=1e-4)
            assert any("sform" in w and "qform" in w for w in meta["warnings"])
        else:
            assert "warnings" not in meta and "qform_ras" not in meta["nifti"], case.name


def test_scaled_integer_files_record_their_scaling(volumes: Built) -> None:
    """A scaled integer file records its ``scl_slope``/``scl_inter`` (its values, checked voxel
    by voxel above, are modality values: CT stored as HU + 1024 with inter -1024 is in HU);
    an unscaled file records none."""
    for case in CASES:
        meta = volumes.packed.records[volumes.only(case.name)]["metadata"]["nifti"]
        assert (meta["scl_slope"], meta["scl_inter"]) == ((case.slope, case.inter) if case.slope else (None, None))
        assert meta["datatype"] == str(np.dtype(case.dtype).newbyteorder("=")) or case.endian == ">", case.name


def test_ct_in_hounsfield_units_is_windowed_in_hounsfield_units(tmp_path: Path) -> None:
    """CT stored as int16 HU + 1024 with ``scl_inter = -1024`` (as dcm2niix writes it): air
    (-1000 HU) is black, water (0 HU) is the abdomen window's mid-grey, bone (+1000 HU) white."""
    hu = np.full((8, 8, 4), -1000, dtype=np.int16)
    hu[2:6, 2:6] = 0
    hu[3:5, 3:5] = 1000
    (tmp_path / "raw").mkdir()
    write_nifti(tmp_path / "raw" / "ct.nii", (hu + 1024).astype(np.int16), AXIAL.affine, slope=1.0, inter=-1024.0)
    packed = build_nifti(tmp_path, [{"path": "ct.nii", "entity": "ct"}],
                         {"windows": ["abdomen"], "sample": "volume"})
    [key] = packed.of_entity("ct")
    image = packed.images[key][0]
    # abdomen: centre 50, width 400 → 0 HU is ((0 - 49.5) / 399 + 0.5) · 255 = 95.9 → 96
    assert sorted(np.unique(image).tolist()) == [0, 96, 255]


# ----------------------------------------------------------------------- SimpleITK, a second reader


@pytest.mark.parametrize("name", AGREEING)
def test_simpleitk_places_every_packed_voxel_where_packer_does(volumes: Built, name: str) -> None:
    """SimpleITK (ITK's NIfTI reader: LPS physical points, its own choice of form and its own
    scaling) finds at the LPS point packer records for each packed voxel a voxel centre of the
    file, with the value packer packed."""
    sitk = pytest.importorskip("SimpleITK")
    image = sitk.ReadImage(str(volumes.folder / "raw" / BY_NAME[name].filename))
    direction = np.asarray(image.GetDirection()).reshape(3, 3)
    to_lps = np.eye(4)
    to_lps[:3, :3] = direction @ np.diag(image.GetSpacing())
    to_lps[:3, 3] = image.GetOrigin()
    probe = (1, 2, 3)  # the matrix composes as ITK's own TransformIndexToPhysicalPoint
    np.testing.assert_allclose(to_lps @ (*probe, 1), (*image.TransformIndexToPhysicalPoint(probe), 1), atol=1e-6)
    key = volumes.only(name)
    packed, record = volumes.packed.images[key], volumes.packed.records[key]
    lps = volume_lps(record, packed.shape[1:])
    inverse = np.linalg.inv(to_lps)
    index = exact_index(lps @ inverse[:3, :3].T + inverse[:3, 3], image.GetSize())
    array = sitk.GetArrayFromImage(image)  # z, y, x: ITK index (i, j, k) is array[k, j, i]
    values = array[index[..., 2], index[..., 1], index[..., 0]].astype(np.float64)
    assert_windowed_equal(packed, values, f"{name} (SimpleITK)")


# ------------------------------------------------------------------------------ resampled volumes

RESAMPLED = ("axial_las_ct", "coronal_nifti2", "sagittal_flipped", "oblique_flipped", "qform_only")
VOLUME_SPACING, VOLUME_SIZE = (4.0, 2.5, 2.2), (16, 44, 40)


@pytest.fixture(scope="module")
def resampled(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_cases(tmp_path_factory.mktemp("resampled"), tuple(BY_NAME[n] for n in RESAMPLED),
                       {"windows": WINDOWS, "sample": {"volume": {"spacing": list(VOLUME_SPACING),
                                                                  "size": list(VOLUME_SIZE)}}})


@pytest.mark.parametrize("name", RESAMPLED)
def test_resampled_volume_is_trilinear_in_patient_space(resampled: Built, name: str) -> None:
    """``sample: {volume: {spacing, size}}``: each packed voxel, placed by the recorded affine,
    holds the trilinear interpolation of the file's values at that point (values interpolated
    before windowing; at the volume's edge the edge value), ±1; voxels outside the file
    (the zero padding) are 0. The size is the request, and each recorded spacing keeps the
    file's extent along that axis in round(extent / requested spacing) voxels."""
    key = resampled.only(name)
    image, record = resampled.packed.images[key], resampled.packed.records[key]
    assert image.shape == (2, *VOLUME_SIZE)
    img = resampled.images[name]
    affine = np.asarray(record["metadata"]["volume"]["affine"])
    index = file_index(img, volume_lps(record, image.shape[1:]))
    file_axes = np.asarray(img.affine[:3, :3])
    for axis, want in enumerate(VOLUME_SPACING):  # the same extent in round(extent / spacing) voxels
        along = int(np.argmax(np.abs(file_axes.T @ (RAS_TO_LPS[:3, :3] @ affine[:3, axis]))))
        extent = img.shape[along] * float(np.linalg.norm(file_axes[:, along]))
        got = record["metadata"]["volume"]["spacing"][axis]
        assert got == pytest.approx(extent / round(extent / want), abs=1e-5), (name, axis)
    outside = ((index < -0.5 - 1e-6) | (index > np.asarray(img.shape) - 0.5 + 1e-6)).any(axis=-1)
    values = trilinear(resampled.data(name), index)
    for channel, want in enumerate(windowed(values)):
        got = image[channel].astype(np.int64)
        assert (got[outside] == 0).all(), f"{name}: padding is not black"
        diff = np.abs(got - want)[~outside]
        assert diff.max() <= 1, f"{name} channel {channel}: off the trilinear reference by up to {diff.max()}"
    assert outside.any() and (~outside).sum() > image[0].size // 4


# ------------------------------------------------------------------------------ neighbour stacks


def test_neighbour_channels_are_the_adjacent_slices(tmp_path: Path) -> None:
    """``{neighbors: 1}`` along the sagittal axis: the channels of slice i are slices i - 1, i,
    i + 1 (the end slice repeated at the edges), each with both windows, each compared with the
    file through that slice's own geometry; ``offsets_mm`` are the signed distances along the
    stack."""
    case = BY_NAME["sagittal_flipped"]
    built = build_cases(tmp_path, (case,), {"windows": WINDOWS, "sample": {"neighbors": 1}, "axis": "sagittal"})
    keys = built.packed.of_entity(case.name)
    img = built.images[case.name]
    records = [built.packed.records[k] for k in keys]
    positions = [np.asarray(r["metadata"]["slice"]["position"]) for r in records]
    step = (positions[1] - positions[0]) / np.linalg.norm(positions[1] - positions[0])
    for i, key in enumerate(keys):
        image = built.packed.images[key]
        assert image.shape[0] == 3 * len(WINDOWS)
        chosen = [min(max(i + d, 0), len(keys) - 1) for d in (-1, 0, 1)]
        for j, neighbour in enumerate(chosen):
            meta = records[i]["metadata"]
            moved = {"metadata": {**meta, "slice": {**meta["slice"], "position": positions[neighbour].tolist()}}}
            values, _ = values_at(img, slice_lps(moved, image.shape[1:]))
            assert_windowed_equal(image[2 * j: 2 * j + 2], values, f"slice {i} channel pair {j}")
        want = [float(np.dot(positions[c] - positions[i], step)) for c in chosen]
        np.testing.assert_allclose(records[i]["metadata"]["neighbors"]["offsets_mm"], want, atol=1e-3)


# ------------------------------------------------------------------------------------ label maps

#: The label map drawn from its image: 1 where the image is bright inside the box, 2 in the
#: sphere (a threshold of the stored values, within the planted structures).
THRESHOLD = 60.0
PAD = 255


def labels_of(values: np.ndarray, ras: np.ndarray) -> np.ndarray:
    """Class ids drawn from an image's values at RAS points: a threshold, split by structure."""
    bright = values > THRESHOLD
    out = np.zeros(values.shape, dtype=np.uint8)
    out[bright & inside_box(ras, margin=-3.0)] = 1
    out[bright & inside_sphere(ras, margin=-3.0)] = 2
    return out


def reoriented(labels: np.ndarray, affine: np.ndarray, order: tuple[int, int, int], flips: tuple[bool, ...]
               ) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` with its axes permuted (new axis a is old axis ``order[a]``) and flipped, and
    the affine that keeps every voxel where it was: old index = M · new index + t."""
    out = np.transpose(labels, order)
    move = np.zeros((4, 4))
    move[3, 3] = 1.0
    for new, old in enumerate(order):
        if flips[new]:
            out = np.flip(out, axis=new)
            move[old, new] = -1.0
            move[old, 3] = labels.shape[old] - 1
        else:
            move[old, new] = 1.0
    return np.ascontiguousarray(out), affine @ move


@dataclass(frozen=True)
class MaskCase:
    """An image (a :class:`Case`) and its label map: drawn on the image's own grid, then stored
    ``order``-permuted and flipped with a matching affine, shifted by ``jitter`` mm, or drawn on
    another ``grid`` altogether."""

    name: str
    image: Case
    order: tuple[int, int, int] = (0, 1, 2)
    flips: tuple[bool, bool, bool] = (False, False, False)
    jitter: float = 0.0
    grid: Grid | None = None

    @property
    def label_grid(self) -> Grid:
        return self.grid or self.image.grid

    def write(self, folder: Path) -> tuple[Path, Path]:
        image = self.image.write(folder)
        g = self.label_grid
        ras = voxel_centres(g.affine, g.shape)
        labels = labels_of(phantom_ras(ras), ras)
        labels, affine = reoriented(labels, g.affine, self.order, self.flips)
        affine = affine.copy()
        affine[:3, 3] += self.jitter
        label_path = write_nifti(folder / f"{self.name}_seg.nii.gz", labels, affine, intent_code=1002)
        return image, label_path


OBLIQUE_IMAGE = Case("oblique_image", grid("oblique_image", LT, ANT, INF, (3.0, 3.5, 5.0), turn=rotation(-20, 10, 8)),
                     dtype="int16", slope=0.5, inter=-1024.0)
MASK_CASES = (
    MaskCase("same_grid", BY_NAME["axial_las_ct"]),
    MaskCase("stored_reoriented", OBLIQUE_IMAGE, order=(2, 0, 1), flips=(True, False, True)),
    MaskCase("float32_roundoff", BY_NAME["sagittal_flipped"], jitter=1e-5),
)
OTHER_GRID = MaskCase("other_grid", BY_NAME["coronal_nifti2"],
                      grid=grid("label_grid", RT, ANT, SUP, (2.0, 2.5, 3.0), shift=(0.7, -1.1, 0.4)))


def build_masks(folder: Path, cases: tuple[MaskCase, ...], nifti: dict[str, Any], **mask: Any) -> tuple[Built, dict]:
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    rows, images, labels = [], {}, {}
    for case in cases:
        image, label = case.write(folder / "raw")
        images[case.name], labels[case.name] = nib.load(image), nib.load(label)
        rows.append({"path": image.name, "entity": case.name, "mask": label.name})
    packed = build_nifti(folder, rows, nifti, mask={"column": "mask", "classes": [0, 1, 2, PAD], "pad": PAD, **mask})
    return Built(folder, packed, images), labels


def assert_labels_follow(mask: np.ndarray, lps: np.ndarray, label_img: Any, what: str,
                         padded: np.ndarray | None = None) -> None:
    """``mask`` (packed, at LPS points ``lps``) is the label file's nearest voxel at each point
    (either neighbour at an exact tie), :data:`PAD` where ``padded``, 0 outside the label file."""
    labels = np.asarray(label_img.dataobj).astype(np.int64)
    want, tie = nearest_labels(labels, file_index(label_img, lps))
    if padded is not None:
        want = np.where(padded, PAD, want)
        tie &= ~padded
    got = mask.astype(np.int64)
    wrong = (got != want) & ~tie
    assert not wrong.any(), f"{what}: {int(wrong.sum())} of {wrong.size} mask voxels are off their label"
    assert (want == 1).any() and (want == 2).any(), f"{what}: the reference holds no structure"


@pytest.fixture(scope="module")
def masked_volumes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, dict]:
    return build_masks(tmp_path_factory.mktemp("masked-volumes"), (*MASK_CASES, OTHER_GRID),
                       {"windows": ["abdomen"], "sample": {"volume": {"spacing": list(VOLUME_SPACING),
                                                                      "size": list(VOLUME_SIZE)}}})


@pytest.mark.parametrize("name", [c.name for c in MASK_CASES])
def test_label_map_follows_its_image_through_resampling_and_crop_or_pad(masked_volumes: tuple[Built, dict],
                                                                        name: str) -> None:
    """A label map (on the image's grid, or stored permuted and flipped with a matching affine,
    or 1e-5 mm off as float32 round-off leaves it) is accepted, and the packed mask, placed by
    the volume's affine after reorientation, resampling and crop/pad, is the label under each
    voxel's centre; padding is the mask's pad id."""
    built, labels = masked_volumes
    key = built.only(name)
    mask, record = built.packed.masks[key], built.packed.records[key]
    assert mask.shape == VOLUME_SIZE
    lps = volume_lps(record, mask.shape)
    image_index = file_index(built.images[name], lps)
    padded = ((image_index < -0.5 - 1e-6) | (image_index > np.asarray(built.images[name].shape) - 0.5 + 1e-6)
              ).any(axis=-1)
    assert padded.any()
    assert_labels_follow(mask, lps, labels[name], name, padded)


def test_label_map_on_another_grid_is_a_mask_geometry_bad_sample(masked_volumes: tuple[Built, dict]) -> None:
    """A label map whose grid is not its image's (other spacing, shifted): the case is one
    ``mask_geometry`` bad sample naming the label map, and no sample of it is packed."""
    built, _ = masked_volumes
    assert built.packed.of_entity("other_grid") == []
    [bad] = built.packed.bad_of(OTHER_GRID.image.filename)
    assert bad["reason"] == "mask_geometry" and "other_grid_seg.nii.gz" in bad["message"]
    assert len(built.packed.bad) == 1


def test_label_map_on_another_grid_is_resampled_when_asked(tmp_path: Path) -> None:
    """``mask: {grid: resample}``: the label map on another grid is resampled to its image's grid
    by nearest neighbour in patient coordinates (0 outside it): each packed mask voxel is the
    label under its centre. A label map already on the grid is unchanged."""
    built, labels = build_masks(tmp_path, (OTHER_GRID, MASK_CASES[0]), {"windows": ["abdomen"], "sample": "volume"},
                                grid="resample")
    assert built.packed.bad == []
    for name in ("other_grid", "same_grid"):
        key = built.only(name)
        mask, record = built.packed.masks[key], built.packed.records[key]
        assert_labels_follow(mask, volume_lps(record, mask.shape), labels[name], name)


SLICE_SPACING, SLICE_SIZE = (1.7, 2.3), (40, 48)


def output_to_source(n_source: int, n_resampled: int, n_out: int, policy: str, other: tuple[int, int]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis of a slice resampled from ``n_source`` to ``n_resampled`` pixels, then
    resized to ``n_out`` under ``policy`` (``fit``: scaled by the smaller of the two axes' ratios,
    ``other`` = (resampled, out) of the other axis, centred, the rest padding): for each output
    pixel its position in source pixels (centre-aligned at both steps) and whether it is padding."""
    out = np.arange(n_out, dtype=float)
    if policy == "stretch":
        scaled, start = n_out, 0
    else:
        scale = min(n_out / n_resampled, other[1] / other[0])
        scaled = max(1, round(n_resampled * scale))
        start = (n_out - scaled) // 2
    inside = (out >= start) & (out < start + scaled)
    return (out - start + 0.5) * (n_source / scaled) - 0.5, ~inside


@pytest.mark.parametrize("policy", ["stretch", "fit"])
def test_label_map_slices_follow_their_image_through_spacing_and_size(tmp_path: Path, policy: str) -> None:
    """Slices with ``spacing`` then ``size`` (``stretch``, or ``fit`` with padding): each packed
    mask pixel is the label under its centre, found through the slice's recorded geometry (of the
    slice before resampling, in source pixels) and the centre-aligned mapping of both steps;
    letterbox padding is the pad id. The image is resampled to the same grid (same shape)."""
    cases = (MASK_CASES[1], MASK_CASES[2])
    built, labels = build_masks(tmp_path, cases, {"windows": ["abdomen"], "sample": "slice", "axis": "coronal",
                                                  "spacing": list(SLICE_SPACING), "size": list(SLICE_SIZE),
                                                  "resize": policy})
    padding = 0
    for case in cases:
        keys = built.packed.of_entity(case.name)
        img = built.images[case.name]
        for key in keys:
            mask, record = built.packed.masks[key], built.packed.records[key]
            assert mask.shape == (1, *SLICE_SIZE) and built.packed.images[key].shape == (1, *SLICE_SIZE)
            meta = record["metadata"]
            # the source slice's size: the file's extent along the row and column directions
            orientation = lps_to_ras(np.asarray(meta["slice"]["orientation"]).reshape(2, 3))
            units = img.affine[:3, :3] / np.linalg.norm(img.affine[:3, :3], axis=0)
            n_col, n_row = (img.shape[int(np.argmax(np.abs(units.T @ d)))] for d in orientation)
            (row_mm, col_mm) = meta["pixel_spacing"]
            resampled = (max(1, round(n_row * row_mm / SLICE_SPACING[0])),
                         max(1, round(n_col * col_mm / SLICE_SPACING[1])))
            rows, pad_rows = output_to_source(n_row, resampled[0], SLICE_SIZE[0], policy, (resampled[1], SLICE_SIZE[1]))
            cols, pad_cols = output_to_source(n_col, resampled[1], SLICE_SIZE[1], policy, (resampled[0], SLICE_SIZE[0]))
            # the packed grid's spacing, not SLICE_SPACING: the mm between two output pixels' centres
            assert meta["output_spacing"] == pytest.approx([(rows[1] - rows[0]) * row_mm, (cols[1] - cols[0]) * col_mm],
                                                           abs=1e-6)
            position = np.asarray(meta["slice"]["position"])
            x, y = np.asarray(meta["slice"]["orientation"]).reshape(2, 3)
            lps = position + (cols[None, :, None] * col_mm) * x + (rows[:, None, None] * row_mm) * y
            padded = pad_rows[:, None] | pad_cols[None, :]
            padding += int(padded.sum())
            assert_labels_follow_slice(mask[0], lps, labels[case.name], f"{case.name} {key}", padded)
    assert (padding > 0) == (policy == "fit")


def assert_labels_follow_slice(mask: np.ndarray, lps: np.ndarray, label_img: Any, what: str,
                               padded: np.ndarray) -> None:
    """:func:`assert_labels_follow` for one slice, where a slice may hold no structure at all."""
    labels = np.asarray(label_img.dataobj).astype(np.int64)
    want, tie = nearest_labels(labels, file_index(label_img, lps))
    want = np.where(padded, PAD, want)
    tie &= ~padded
    wrong = (mask.astype(np.int64) != want) & ~tie
    assert not wrong.any(), f"{what}: {int(wrong.sum())} of {wrong.size} mask pixels are off their label"


# ------------------------------------------------------------------------------- normalisation


def mr_case(name: str, dtype: str = "float32", slope: float | None = None) -> Case:
    """An MR-like file: the phantom + 150 inside a head-shaped ellipsoid (some of it negative, as
    in a difference or phase image), exact 0 outside it (a skull-stripped background), so that
    ``nonzero`` statistics differ from ``all`` and from "positive"."""
    return Case(name, grid(name, LT, ANT, SUP, (3.0, 3.5, 5.0)), dtype=dtype, slope=slope,
                inter=0.0 if slope else None)


MR_CASES = (mr_case("mr_float"), mr_case("mr_scaled", "int16", 0.5))


def mr_values(case: Case) -> np.ndarray:
    ras = voxel_centres(case.grid.affine, case.grid.shape)
    head = ((ras / np.array([52.0, 44.0, 34.0])) ** 2).sum(axis=-1) <= 1.0
    return np.where(head, phantom_ras(ras) + 150.0, 0.0)


def write_mr(folder: Path, case: Case) -> Path:
    values = mr_values(case)
    stored = values.astype(case.dtype) if case.slope is None else np.rint(values / case.slope).astype(case.dtype)
    return write_nifti(folder / case.filename, stored, case.grid.affine, slope=case.slope, inter=case.inter)


def build_mr(folder: Path, nifti: dict[str, Any]) -> Built:
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    images = {case.name: nib.load(write_mr(folder / "raw", case)) for case in MR_CASES}
    packed = build_nifti(folder, [{"path": c.filename, "entity": c.name} for c in MR_CASES], nifti)
    assert packed.bad == []
    return Built(folder, packed, images)


def percentile_reference(values: np.ndarray, low: float, high: float, over: str) -> tuple[float, float, int]:
    region = values[values != 0] if over == "nonzero" else values.reshape(-1)
    lo, hi = np.percentile(region, [low, high])  # numpy's default: linear interpolation
    return float(lo), float(hi), int(region.size)


def zscore_reference(values: np.ndarray, over: str) -> tuple[float, float, int]:
    region = values[values != 0] if over == "nonzero" else values.reshape(-1)
    return float(region.mean()), float(region.std(ddof=0)), int(region.size)


def packed_volume_values(built: Built, name: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A packed MR volume, the file's values at its voxels, and its record."""
    key = built.only(name)
    image, record = built.packed.images[key], built.packed.records[key]
    values, _ = values_at(built.images[name], volume_lps(record, image.shape[1:]))
    return image, values, record


def float16_close(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Whether ``got`` (float16) is ``want`` rounded to float16, within one float16 step."""
    step = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) <= step + 1e-7


def test_percentiles_into_uint8_are_numpys(tmp_path: Path) -> None:
    """``{percentiles: [0.5, 99.5]}`` (over all voxels) and ``{percentiles: [2, 98], over:
    nonzero}`` into uint8: the recorded low/high are ``np.percentile`` of the file's values, and
    each voxel is round(255 · clip((x - low) / (high - low), 0, 1)) ±1 (at float rounding ties)."""
    built = build_mr(tmp_path, {"windows": [{"percentiles": [0.5, 99.5]}, {"percentiles": [2, 98], "over": "nonzero"}],
                                "sample": "volume"})
    for case in MR_CASES:
        image, values, record = packed_volume_values(built, case.name)
        data = built.data(case.name)
        for channel, (low, high, over) in enumerate(((0.5, 99.5, "all"), (2.0, 98.0, "nonzero"))):
            lo, hi, count = percentile_reference(data, low, high, over)
            stats = record["metadata"]["windows"][channel]
            assert stats["source"] == "percentiles" and stats["over"] == over and stats["count"] == count
            assert stats["percentiles"] == [low, high]
            assert stats["low"] == pytest.approx(lo, rel=1e-6, abs=1e-4)
            assert stats["high"] == pytest.approx(hi, rel=1e-6, abs=1e-4)
            want = np.rint(np.clip((values - lo) / (hi - lo), 0, 1) * 255)
            diff = np.abs(image[channel].astype(np.float64) - want)
            assert diff.max() <= 1 and (diff == 0).mean() > 0.99, (case.name, channel, diff.max())
            assert image[channel].min() == 0 and image[channel].max() == 255


def test_percentiles_and_zscores_into_float16_are_numpys(tmp_path: Path) -> None:
    """float16 output: percentiles (0.5-99.5) in [0, 1]; ``zscore`` (over the non-zero voxels,
    which stay exactly 0) and ``{zscore: {over: all}}``: (x - mean) / std with numpy's mean and
    population std (ddof=0) of the file's values; each equal to the reference within float16
    rounding, and the recorded mean, std and count are the reference's."""
    built = build_mr(tmp_path, {"windows": [{"percentiles": [0.5, 99.5]}, "zscore", {"zscore": {"over": "all"}}],
                                "output": "float16", "sample": "volume"})
    for case in MR_CASES:
        image, values, record = packed_volume_values(built, case.name)
        assert image.dtype == np.float16
        data = built.data(case.name)
        windows = record["metadata"]["windows"]
        lo, hi, _ = percentile_reference(data, 0.5, 99.5, "all")
        assert float16_close(image[0], np.clip((values - lo) / (hi - lo), 0, 1)).all()
        for channel, over in ((1, "nonzero"), (2, "all")):
            mean, std, count = zscore_reference(data, over)
            stats = windows[channel]
            assert stats["source"] == "zscore" and stats["over"] == over and stats["count"] == count
            assert stats["mean"] == pytest.approx(mean, rel=1e-6) and stats["std"] == pytest.approx(std, rel=1e-6)
            want = (values - mean) / std
            if over == "nonzero":
                want = np.where(values == 0, 0.0, want)
                assert (image[channel][values == 0] == 0).all()
            close = float16_close(image[channel], want)
            assert close.all(), (case.name, over, float(np.abs(image[channel] - want).max()))
        assert windows[1]["mean"] != pytest.approx(windows[2]["mean"], rel=1e-3)  # the background matters


def test_slices_record_the_whole_volumes_statistics(tmp_path: Path) -> None:
    """Statistics are the case's, not each slice's: every slice of a case records the same
    percentiles, equal to numpy's over the whole volume, and is scaled by them."""
    built = build_mr(tmp_path, {"windows": [{"percentiles": [1, 99]}], "sample": "slice", "axis": "sagittal"})
    for case in MR_CASES:
        data = built.data(case.name)
        lo, hi, count = percentile_reference(data, 1, 99, "all")
        for key in built.packed.of_entity(case.name):
            record = built.packed.records[key]
            stats = record["metadata"]["windows"][0]
            assert stats["count"] == count == data.size
            assert stats["low"] == pytest.approx(lo, rel=1e-6, abs=1e-4)
            assert stats["high"] == pytest.approx(hi, rel=1e-6, abs=1e-4)
            image = built.packed.images[key]
            values, _ = values_at(built.images[case.name], slice_lps(record, image.shape[1:]))
            want = np.rint(np.clip((values - lo) / (hi - lo), 0, 1) * 255)
            assert np.abs(image[0] - want).max() <= 1


@pytest.mark.parametrize("change", ["rotation", "scale", "shift"])
def test_how_far_two_forms_differ_is_measured_in_mm_over_the_grid(change: str) -> None:
    """A 2° turn of a 256-voxel grid moves its far voxels by ~9 mm, though no matrix entry moves
    by more than 0.035; a 0.1% scale moves them 0.25 mm with entries differing by 0.001."""
    from packer.read.nifti import corner_distance_mm

    shape = (256, 200, 40)
    a = np.diag([1.0, 1.0, 3.0, 1.0])
    a[:3, 3] = [-128.0, -100.0, -60.0]
    b = a.copy()
    if change == "rotation":
        t = np.deg2rad(2.0)
        b[:3, :3] = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]]) @ a[:3, :3]
    elif change == "scale":
        b[0, 0] = 1.001
    else:
        b[:3, 3] += [0.0, 0.5, 0.0]
    voxels = np.indices(shape).reshape(3, -1).T
    apart = np.linalg.norm(apply_affine(a, voxels) - apply_affine(b, voxels), axis=1).max()
    assert corner_distance_mm(a, b, shape) == pytest.approx(apart, rel=1e-9)
    assert apart > 0.2
