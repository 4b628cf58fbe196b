"""Read NIfTI-1/2 files (``.nii``, ``.nii.gz``) with nibabel: a header probe, then the voxels in canonical LPS axes.

The probe (:func:`probe_nifti`) reads the header only and refuses what cannot become samples
before a voxel is inflated: a file nibabel cannot read as NIfTI (``unreadable``), a data type
that is not a real number (RGB, complex: ``unsupported``), a 4th axis the job does not turn into
channels, or a 5th (``unsupported_dimensions``), a size over the job's limits (``too_large``:
dims × datatype against ``limits``, so a ``.nii.gz`` whose header promises 4 GB is never
inflated), voxel data that cannot be where the header says (``vox_offset`` inside the header, or
past the end of an uncompressed file, or more than a ``.nii.gz`` of its size can inflate to:
``truncated``), an uncompressed file holding data past its voxels (bytes after vox_offset + dim ×
datatype that are not zero: a dim or datatype damaged smaller, ``bad_shape``; a ``.nii.gz``'s
stream is judged so as its voxels are read), and a geometry that places no voxel
(``bad_geometry``: a zero, negative or non-finite voxel size where the affine comes from
``pixdim``, a singular or non-finite affine).

**Which affine** (recorded as ``nifti.affine_source``): the sform when ``sform_code`` is set,
else the qform when ``qform_code`` is set, else ``pixdim`` alone (nibabel's ``get_best_affine``
rule; ITK instead prefers the qform unless the sform is a scanner-anatomical rigid transform).
When both are set and differ by more than :data:`AFFINE_TOLERANCE` mm anywhere (SPM edits only
the sform), the sample records both (``nifti.qform``, ``nifti.forms_differ_mm``) and the build
warns: the sform is used.

**World axes.** NIfTI's world is RAS+ (x grows to the patient's Right, y Anterior, z Superior);
packer's volumes are in DICOM's LPS+, so the affine's first two rows change sign
(``LPS = diag(-1, -1, 1) · RAS``). The voxels are then permuted and flipped (never resampled)
so that D, H, W run along the patient axes closest to +z (superior), +y (posterior) and +x
(left), exactly as a DICOM series' volume (:func:`packer.transform.volume.canonical`):
an axial slice ``D = d`` is then shown as a radiologist reads an axial CT (anterior up, the
patient's right on the left of the picture).

**Values.** The stored values times ``scl_slope`` plus ``scl_inter`` when the slope is set (non-zero
and finite; 0 or NaN means "no scaling", an infinite slope is a damaged header: ``unreadable``),
computed in float64 and rounded once to float32, as nibabel's ``get_fdata(dtype=np.float32)``
gives them (:func:`_store`): CT stored as int16 with ``scl_inter = -1024`` is
then in Hounsfield units and the HU window presets apply unchanged. NaN or infinite voxels make
the file ``non_finite`` (unless the job fills them: :func:`fill_non_finite`), a volume of one value
``constant_image``, and so does a scaling under which differing stored values all round to one
float16 value (a scl_slope of 1e-30) where the job packs the values themselves (``windows: []``).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.config import LimitsConfig
from packer.read.limits import file_size_problem, limit_problem
from packer.read.opening import open_failure
from packer.records import Issue, SampleRef
from packer.transform.volume import Volume, canonical_order, canonical_plan, canonical_view

#: Largest difference (mm, any entry of the 3×4 part) between two affines that still place the
#: same grid: float32 round-off of a 500 mm offset is about 3e-5 mm, dcm2niix writes both forms
#: equal, and a real disagreement is a rotation or a shift of a voxel or more.
AFFINE_TOLERANCE = 1e-3
#: Largest voxel edge (mm) and farthest first-voxel centre from the origin (mm) an affine may
#: give: a scanner's voxels are well under a metre and its field within metres of its origin,
#: while a damaged header's exponent bits give 1e24 mm. Beyond either, the file is bad_geometry.
MAX_VOXEL_MM = 1e5
MAX_ORIGIN_MM = 1e7
#: RAS+ → LPS+ (points, and the rows of an affine).
RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
#: DEFLATE's largest compression ratio: a 258-byte match coded in 2 bits (the zlib manual's
#: 1032:1), so a gzip file of n bytes inflates to at most 1032·n bytes.
MAX_DEFLATE_RATIO = 1032
#: The suffixes a NIfTI source lists (``.nii.gz`` is seen as ``.gz`` plus the name's ``.nii``).
SUFFIXES = (".nii", ".nii.gz")


class NiftiDefect(Exception):
    """A defect of the file: its reason code, stage and message (without the file's name)."""

    def __init__(self, reason: str, message: str, stage: str = "read", *, opened: bool = True) -> None:
        super().__init__(message)
        self.reason, self.message, self.stage = reason, message, stage
        #: False where the file could not be opened at all (it is not there, or not readable)
        self.opened = opened


@dataclass(frozen=True)
class NiftiHeader:
    """What the header of one file says, checked. ``shape``: (X, Y, Z) as stored (a 2-D file has
    Z = 1); ``channels``: the length of its 4th axis (1 for a 3-D file); ``affine``: voxel
    (i, j, k) → RAS mm by the rule above; ``affine_source``: ``sform``, ``qform`` or ``pixdim``;
    ``qform`` and ``forms_differ_mm``: the other form where both are set and differ; ``slope``
    and ``inter``: the scaling (None: none); ``cal``: ``cal_min``/``cal_max`` where set."""

    shape: tuple[int, int, int]
    channels: int
    dtype: str
    affine: np.ndarray
    affine_source: str
    slope: float | None
    inter: float | None
    cal: tuple[float, float] | None
    intent_code: int
    version: int
    qform: np.ndarray | None = None
    forms_differ_mm: float | None = None
    #: Why ``cal_min``/``cal_max`` are set but unusable ("" where unset or usable): reversed, empty
    #: or not finite, so that a ``file`` window's record does not say the file sets none
    cal_unusable: str = ""

    def describe(self) -> dict[str, Any]:
        """The header facts a sample records (``metadata.nifti``)."""
        out: dict[str, Any] = {
            "version": self.version, "shape": list(self.shape), "datatype": self.dtype,
            "affine_source": self.affine_source,
            "affine_ras": [[round(float(v), 6) for v in row] for row in self.affine],
            "scl_slope": self.slope, "scl_inter": self.inter,
        }
        if self.channels > 1:
            out["channels"] = self.channels
        if self.cal is not None:
            out["cal"] = list(self.cal)
        if self.intent_code:
            out["intent_code"] = self.intent_code
        if self.qform is not None:
            out["qform_ras"] = [[round(float(v), 6) for v in row] for row in self.qform]
            out["forms_differ_mm"] = round(float(self.forms_differ_mm or 0.0), 6)
        return out


def issue(ref: SampleRef, defect: NiftiDefect, name: str | None = None) -> Issue:
    """The bad-sample record of ``defect`` in the file ``name`` (default: ``ref``'s)."""
    return Issue.of(ref, stage=defect.stage, reason=defect.reason, message=f"{name or ref.path}: {defect.message}")


@contextlib.contextmanager
def _nibabel_silent() -> Iterator[None]:
    """nibabel's header-repair log ('sform_code 65 not valid; setting to 0') muted. Not nibabel's
    ``LoggingOutputSuppressor``: it removes the handlers from the list it iterates and restores
    none, and a logger left without handlers prints through logging's last-resort handler."""
    from nibabel.imageglobals import logger

    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def _nibabel_load(path: str) -> Any:
    """``nibabel.load(path)``; for a file whose suffix mixes cases (``Case.Nii.Gz``), which
    nibabel renames from its suffix's case (``Case.nii.Gz``, not there), the NIfTI-1 or NIfTI-2
    image read through a file map naming the file itself (the header size tells which)."""
    import nibabel as nib

    try:
        return nib.load(path)
    except FileNotFoundError:
        if not os.path.exists(path):
            raise
        first: Exception | None = None
        for klass in (nib.Nifti1Image, nib.Nifti2Image):
            try:
                return klass.from_file_map(klass.make_file_map({"image": path, "header": path}))
            except Exception as err:  # noqa: BLE001 - the other version's header, or the file's defect: raised below
                first = first or err
        assert first is not None
        raise first from None


def load_header(path: str, limits: LimitsConfig, *, channels_from: str | None) -> tuple[Any, NiftiHeader]:
    """The nibabel image of ``path`` (lazy: no voxel read) and its checked :class:`NiftiHeader`.
    Raises :class:`NiftiDefect` (module docstring); ``channels_from``: ``last_axis`` lets a 4th
    axis be channels, None refuses it."""
    import nibabel as nib
    from nibabel.filebasedimages import ImageFileError
    from nibabel.spatialimages import HeaderDataError

    try:
        size = os.stat(path).st_size
    except OSError as err:
        raise NiftiDefect(*open_failure(path, err), opened=False) from err
    if size == 0:
        raise NiftiDefect("unreadable", "the file is empty (0 bytes); replace it or remove it")
    too_big = file_size_problem(size, limits)
    if too_big is not None:
        raise NiftiDefect("too_large", too_big)
    try:
        # nibabel repairs some header fields as it loads (a zero pixdim, a low vox_offset), warning
        # or logging (to stderr, without the file's name); the checks below refuse them instead
        with warnings.catch_warnings(), _nibabel_silent():
            warnings.simplefilter("ignore")
            img = _nibabel_load(path)
    except ImageFileError as err:
        cut = _cut_in_header(path)
        if cut is not None:
            raise NiftiDefect("truncated", cut) from err
        misnamed = _misnamed(path)
        if misnamed is not None:
            raise NiftiDefect("unreadable", misnamed) from err
        raise NiftiDefect("unreadable", "not a NIfTI-1 or NIfTI-2 file, or its header is cut short or compressed "
                                        f"wrongly (nibabel: {err}); export it again as .nii or .nii.gz") from err
    except EOFError as err:  # the stream ends: a cut
        raise NiftiDefect("truncated", f"the gzip stream ends inside the header ({type(err).__name__}: {err}); "
                                       "copy the file again") from err
    except (zlib.error, gzip.BadGzipFile) as err:  # damaged, whatever its length, as further into the stream
        raise _gzip_damaged(err) from err
    except (OSError, HeaderDataError, ValueError, TypeError, KeyError, OverflowError) as err:
        # OverflowError: nibabel's int(vox_offset) of an infinite vox_offset
        raise NiftiDefect("unreadable", f"the header cannot be read ({type(err).__name__}: {err}; a dim[0] outside "
                                        "1-7 also makes nibabel read the header in the wrong byte order); the header "
                                        "is corrupt, copy the file again or export it again") from err
    if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
        raise NiftiDefect("unsupported", f"nibabel reads it as {type(img).__name__}; packer reads NIfTI-1 and "
                                         "NIfTI-2 (.nii, .nii.gz): convert it")
    return img, _check_header(img, path, size, limits, channels_from)


def _cut_in_header(path: str) -> str | None:
    """Why a gzip file nibabel could not tell the type of is cut short: its stream ends before
    a NIfTI header's bytes (348, NIfTI-2 540) have inflated (nibabel then finds no header to
    name the type by); None for a file that is no gzip stream or inflates a whole header. Raises
    NiftiDefect ``decode_failed`` where the stream is damaged before then (:func:`_gzip_damaged`)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return None
        with gzip.open(path) as stream:
            head = stream.read(540)
    except EOFError as err:
        return f"the gzip stream ends inside the header ({type(err).__name__}: {err}); copy the file again"
    except (zlib.error, gzip.BadGzipFile) as err:
        raise _gzip_damaged(err) from err
    except OSError:
        return None
    if len(head) < 348:
        return (f"the gzip stream holds {len(head)} bytes, fewer than a NIfTI header's 348: the file was cut short; "
                "copy the file again")
    return None


def _gzip_damaged(err: zlib.error | gzip.BadGzipFile) -> NiftiDefect:
    """The defect of a gzip stream that zlib or the gzip module refuses (an invalid deflate code, a
    CRC-32 or length that does not match, a bad member header): damage, not a cut (a stream that
    ends raises EOFError), wherever in the stream it is."""
    said = f"zlib: {err}" if isinstance(err, zlib.error) else f"{type(err).__name__}: {err}"
    return NiftiDefect("decode_failed", f"the gzip stream is damaged ({said}); copy the file again")


def _misnamed(path: str) -> str | None:
    """Why nibabel, which picks its decompressor from the suffix, cannot read ``path`` when the
    suffix lies about its bytes: an uncompressed NIfTI named ``.nii.gz`` (a download inflated
    on the way, by a server's ``Content-Encoding: gzip``) or gzip data named ``.nii``; else None."""
    try:
        with open(path, "rb") as fh:
            start = fh.read(4)
    except OSError:
        return None
    name = os.path.basename(path)
    named_gz = name.lower().endswith(".gz")
    if named_gz and start[:2] != b"\x1f\x8b" and len(start) == 4:
        for version, size in ((1, 348), (2, 540)):
            if size in (int.from_bytes(start, "little"), int.from_bytes(start, "big")):
                return (f"an uncompressed NIfTI-{version} file named .nii.gz (a download inflated on the way, or "
                        f"gunzip's output under the old name): nibabel reads a .gz name as gzip; rename it "
                        f"{name[:-3]}")
    if not named_gz and start[:2] == b"\x1f\x8b":
        return (f"gzip-compressed data named .nii: nibabel reads a .nii name uncompressed; rename it {name}.gz "
                "(or gunzip it)")
    return None


def _check_header(img: Any, path: str, size: int, limits: LimitsConfig, channels_from: str | None) -> NiftiHeader:
    header = img.header
    version = 2 if type(img).__name__ == "Nifti2Image" else 1
    raw_shape = tuple(int(d) for d in header.get_data_shape())
    if len(raw_shape) < 2 or any(d < 1 for d in raw_shape):
        raise NiftiDefect("bad_shape", f"dim {list(raw_shape)}: every size must be at least 1, in 2 to 4 dimensions; "
                                       "fix the header's dim field or export the file again", stage="validate")
    extra = raw_shape[3:]
    if any(d > 1 for d in extra[1:]):
        raise NiftiDefect("unsupported_dimensions", f"dim {list(raw_shape)}: a 5-D or higher file (vectors, "
                                                    "tensors) is not an image packer can sample", stage="validate")
    channels = extra[0] if extra else 1
    if channels > 1 and channels_from != "last_axis":
        raise NiftiDefect("unsupported_dimensions", f"dim {list(raw_shape)}: a 4-D file ({channels} volumes along "
                                                    "its 4th axis: time, or stacked sequences); set "
                                                    "transform.nifti.channels_from: last_axis to make them channels, "
                                                    "or split the file", stage="validate")
    shape = (raw_shape[0], raw_shape[1], raw_shape[2] if len(raw_shape) > 2 else 1)
    dtype = header.get_data_dtype()
    if dtype.fields is not None or dtype.kind not in "iuf":
        what = "RGB" if dtype.fields is not None else "complex" if dtype.kind == "c" else str(dtype)
        raise NiftiDefect("unsupported", f"datatype {int(header['datatype'])} ({what}) is not a real number per "
                                         "voxel; packer reads integer and float NIfTI (convert colour to one "
                                         "channel per file, complex to magnitude)", stage="validate")
    voxels = shape[0] * shape[1] * shape[2]
    decoded = voxels * channels * (dtype.itemsize + 4)
    too_big = limit_problem(
        limits, size_text=f"dim[1] {shape[0]} × dim[2] {shape[1]}", pixels=shape[0] * shape[1], decoded=decoded,
        decoded_text=f"{voxels * channels} voxels × ({dtype.itemsize} bytes stored + 4 bytes as float32)",
        frames=shape[2] * channels, frames_text="dim[3] slices × dim[4] volumes")
    if too_big is None and voxels > limits.max_voxels:
        too_big = (f"{'×'.join(map(str, shape))} = {voxels} voxels per channel, over limits.max_voxels "
                   f"({limits.max_voxels}); raise the limit if the file is genuine")
    if too_big is not None:
        # limit_problem's text already says so, with the limit to raise; the max_voxels text does not
        raise NiftiDefect("too_large", too_big if "nothing was decoded" in too_big else f"{too_big}; nothing was "
                                                                                        "decoded")
    _check_offset(int(img.dataobj.offset), path, size, version, voxels * channels * dtype.itemsize)
    stored = _stored_header(path, header)
    affine, source, qform, differ = _choose_affine(header, len(raw_shape),
                                                   np.asarray(stored["pixdim"][1:4], dtype=np.float64))
    stored_slope = float(stored["scl_slope"])
    if np.isinf(stored_slope):  # nibabel takes it for "no scaling", as it does 0 and NaN (its own mark for that)
        raise NiftiDefect("unreadable", f"scl_slope is {stored_slope:g} (scl_inter {float(stored['scl_inter']):g}): "
                                        "no voxel value can be scaled by it, and reading the file unscaled would "
                                        "pack every voxel at a wrong value; the header is corrupt, fix scl_slope "
                                        "(0 or NaN: no scaling) or export the file again")
    slope, inter = _scaling(img)
    cal_min, cal_max = float(header["cal_min"]), float(header["cal_max"])
    cal = (cal_min, cal_max) if np.isfinite([cal_min, cal_max]).all() and cal_max > cal_min else None
    unusable = "" if cal is not None or (cal_min == 0 and cal_max == 0) else (
        f"cal_min {cal_min:g} and cal_max {cal_max:g} are set but make no range (cal_max must be above cal_min, "
        "both finite)")
    return NiftiHeader(shape=shape, channels=channels, dtype=str(dtype), affine=affine, affine_source=source,
                       slope=slope, inter=inter,
                       cal=cal, intent_code=int(header["intent_code"]), version=version, qform=qform,
                       forms_differ_mm=differ, cal_unusable=unusable)


def _scaling(img: Any) -> tuple[float | None, float | None]:
    """(scl_slope, scl_inter) as the file sets them, or (None, None) where it sets no scaling.

    Not ``img.header.get_slope_inter()``: loading an image, nibabel moves the scaling out of the
    image's header into its data proxy and resets the header's fields to NaN (``AnalyzeImage``
    "consumes" them, as it does ``vox_offset``), so that header always says "no scaling". The
    proxy keeps the file's values, already reduced to (1, 0) where the slope is 0 or not
    finite (nibabel's ``get_slope_inter``: 0 means "no scaling")."""
    slope, inter = float(img.dataobj.slope), float(img.dataobj.inter)
    return (None, None) if (slope, inter) == (1.0, 0.0) else (slope, inter)


def _check_offset(offset: int, path: str, size: int, version: int, nbytes: int) -> None:
    """A single-file NIfTI's voxels start at ``vox_offset`` (``offset``: as the file says it;
    nibabel reads from byte 0 when it says 0), after the header (352 bytes for NIfTI-1, 544 for
    NIfTI-2, extensions included); in an uncompressed file they must end by its end. A
    ``.nii.gz``'s length is only known once inflated, but it cannot exceed
    :data:`MAX_DEFLATE_RATIO` times the file's: a header that promises more (a few KB claiming
    a gigabyte, within the limits) is refused here, before nibabel allocates the promised array
    and inflates the whole stream into it only to find it short; a shorter stream is found
    cut short by the read."""
    least = 352 if version == 1 else 544
    if offset < least:
        raise NiftiDefect("unreadable", f"vox_offset {offset} points inside the header (the voxels of a single-file "
                                        f"NIfTI-{version} start at byte {least} or later); the header is damaged")
    if not _gzipped(path):
        if offset + nbytes > size:
            raise NiftiDefect("truncated", f"the voxels should fill bytes {offset} to {offset + nbytes} (vox_offset + "
                                           f"dim × datatype), but the file has {size} bytes: it was cut short, or "
                                           "vox_offset is wrong; copy it again")
        if offset + nbytes < size and _data_after(path, offset + nbytes):
            raise NiftiDefect("bad_shape", _excess_message(offset, nbytes, size - offset, "the file"), stage="validate")
    elif offset + nbytes > MAX_DEFLATE_RATIO * size:
        raise NiftiDefect("truncated", f"the voxels should fill bytes {offset} to {offset + nbytes} once inflated "
                                       f"(vox_offset + dim × datatype), but a gzip file of {size} bytes inflates to "
                                       f"at most {MAX_DEFLATE_RATIO * size} (DEFLATE's largest ratio, "
                                       f"{MAX_DEFLATE_RATIO}:1): it was cut short, or its dim or datatype are wrong; "
                                       "nothing was inflated")


def _data_after(path: str, start: int) -> bool:
    """True where a byte of the uncompressed file ``path`` from ``start`` on is not zero (read a
    :data:`_CHUNK` at a time, stopping at the first such byte)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        while chunk := fh.read(_CHUNK):
            if np.frombuffer(chunk, dtype=np.uint8).any():
                return True
    return False


def _excess_message(offset: int, nbytes: int, held: int, where: str) -> str:
    """Why a file whose voxels, as its header describes them, end before its data does (the bytes
    past them not zero) is ``bad_shape``: ``held``, the bytes ``where`` (the file, the inflated
    stream) holds from ``offset`` (vox_offset) on; ``nbytes``, the header's dim × datatype."""
    return (f"the header's dim × datatype account for {nbytes} bytes of voxels, but {where} holds {held} bytes from "
            f"vox_offset {offset} on, and the {held - nbytes} bytes past the last voxel are not zero padding: the "
            "header does not describe the stored voxels (a dim one short reflows them into a sheared volume, an "
            "int16 datatype relabelled int8 reads half of them as other numbers), so they would pack wrong; the "
            "header's dim or datatype is damaged: check them against the image, or export the file again")


def _gzipped(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _stored_header(path: str, header: Any) -> Any:
    """The header as the file stores it, its ``pixdim`` and ``scl_slope`` read from here.

    Not the loaded header's: loading it, nibabel *repairs* the voxel sizes (``check_fix``: a
    voxel size of 0 becomes 1, a negative one its absolute value, said only in a log message), so
    a file whose header gives no usable voxel size would be placed on an invented 1 mm grid; and
    it resets the scaling to NaN (:func:`_scaling`), an infinite slope included. The header block
    is read again, unrepaired (``check=False``): 348 bytes (540 for NIfTI-2), inflated from the
    start of a ``.nii.gz`` only."""
    try:
        with (gzip.open(path, "rb") if _gzipped(path) else open(path, "rb")) as fh:
            block = fh.read(header.sizeof_hdr)
        return type(header)(block, check=False)
    except (OSError, EOFError, zlib.error, ValueError) as err:
        raise NiftiDefect("unreadable", f"the header cannot be read again ({type(err).__name__}: {err}); "
                                        "copy the file again") from err


def corner_distance_mm(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> float:
    """How far apart (mm) the affines ``a`` and ``b`` place a voxel centre of a grid of ``shape``,
    at most: the distance between two affine maps is largest at a corner of the grid (its norm
    is convex), so the eight corners' centres decide. An element-wise difference of the matrices
    under-reported a rotation of 2° as 0.35 where the far voxels lay 45 mm apart."""
    extent = [max(int(n), 1) - 1 for n in tuple(shape[:3]) + (1,) * (3 - len(shape[:3]))]
    corners = np.array([[i, j, k, 1.0] for i in (0, extent[0]) for j in (0, extent[1]) for k in (0, extent[2])])
    moved = corners @ (np.asarray(a, dtype=np.float64)[:3] - np.asarray(b, dtype=np.float64)[:3]).T
    return float(np.linalg.norm(moved, axis=1).max())


#: Millimetres per spatial unit code of a header's xyzt_units (its low 3 bits: 1 metre, 2 mm,
#: 3 micrometre; 0 unknown, and codes no unit has, read as mm as nibabel and viewers read them)
_UNIT_MM = {1: 1000.0, 2: 1.0, 3: 1e-3}


def _choose_affine(header: Any, ndim: int, stored_pixdim: np.ndarray
                   ) -> tuple[np.ndarray, str, np.ndarray | None, float | None]:
    """(affine, its source, the qform where it differs from the chosen sform, by how much), in
    mm whatever spatial unit the header's xyzt_units declares (metres and micrometres are
    scaled: a file in metres with pixdim 0.002 has 2 mm voxels, not 0.002 mm ones);
    ``stored_pixdim``: the voxel sizes as the file stores them (:func:`_stored_header`)."""
    from nibabel.spatialimages import HeaderDataError

    pixdim = stored_pixdim[:max(2, min(ndim, 3))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nibabel repairs a zero pixdim with a warning: refused below instead
        sform, scode = header.get_sform(coded=True)
        try:
            qform, qcode = header.get_qform(coded=True)
        except (ValueError, HeaderDataError):  # a quaternion that is no rotation (b² + c² + d² > 1):
            qform, qcode = None, 0  # nibabel could load the file only by its sform, which is used below too
    if scode and scode > 0:
        affine, source = np.asarray(sform, dtype=np.float64), "sform"
    else:
        if not (np.isfinite(pixdim).all() and (pixdim > 0).all()):
            raise NiftiDefect("bad_geometry", f"pixdim[1:4] is {[float(v) for v in pixdim]}: voxel sizes must be "
                                              "positive (and no sform is set to place the voxels instead)",
                              stage="validate")
        if qcode and qcode > 0:
            affine, source = np.asarray(qform, dtype=np.float64), "qform"
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                affine, source = np.asarray(header.get_base_affine(), dtype=np.float64), "pixdim"
    # the spatial unit the file declares (xyzt_units): packer's geometry is in mm, as ITK's is
    to_mm = _UNIT_MM.get(int(header["xyzt_units"]) & 0x07, 1.0)  # the spatial bits (nibabel's names raise on 4-7)
    if to_mm != 1.0:
        affine = affine.copy()
        affine[:3, :] *= to_mm
        if qform is not None:
            qform = np.asarray(qform, dtype=np.float64).copy()
            qform[:3, :] *= to_mm
    # singular by the directions' volume against the voxel sizes' (a scale-free test: a 5e-5 mm
    # electron-microscopy voxel is no zero voxel, though its determinant is 1.25e-13)
    columns = np.linalg.norm(affine[:3, :3], axis=0) if np.isfinite(affine).all() else np.zeros(3)
    if (not np.isfinite(affine).all() or not (columns > 0).all()
            or abs(np.linalg.det(affine[:3, :3])) <= 1e-9 * float(np.prod(columns))):
        shown = [[float(f"{v:.4g}") for v in row] for row in affine[:3]]
        raise NiftiDefect("bad_geometry", f"the {source} affine {shown} is singular or not finite: it places no "
                                          "voxel (a zero voxel size or a collapsed direction); fix the header",
                          stage="validate")
    voxel = np.linalg.norm(affine[:3, :3], axis=0)
    if float(voxel.max()) > MAX_VOXEL_MM or float(np.abs(affine[:3, 3]).max()) > MAX_ORIGIN_MM:
        sizes = [float(f"{v:.4g}") for v in voxel]
        first = [float(f"{v:.4g}") for v in affine[:3, 3]]
        raise NiftiDefect("bad_geometry", f"the {source} affine gives voxel sizes {sizes} mm and puts the first voxel "
                                          f"at {first} mm: no scanner places voxels so (a voxel over {MAX_VOXEL_MM:g} "
                                          f"mm, or one farther than {MAX_ORIGIN_MM:g} mm from the origin); the header "
                                          "is damaged: fix it", stage="validate")
    if source == "sform" and qcode and qcode > 0 and qform is not None and np.isfinite(qform).all():
        differ = corner_distance_mm(np.asarray(qform, dtype=np.float64), affine, header.get_data_shape()[:3])
        if differ > AFFINE_TOLERANCE:
            return affine, source, np.asarray(qform, dtype=np.float64), differ
    return affine, source, None, None


def read_voxels(img: Any, header: NiftiHeader) -> np.ndarray:
    """The stored values of ``img`` as an (X, Y, Z, T) array (T = 1 for a 3-D file), not yet
    scaled. Raises :class:`NiftiDefect`: ``truncated`` (the gzip stream or the file ends early),
    ``decode_failed`` (a damaged gzip stream, one whose CRC-32 or length does not match, or a
    read nibabel refuses)."""
    with _reading_voxels():
        path = img.get_filename()
        if path is not None and _gzipped(path):
            data = _inflate(path, int(img.dataobj.offset), int(np.prod(img.shape)) * img.get_data_dtype().itemsize)
            raw = np.frombuffer(data, dtype=img.get_data_dtype()).reshape(img.shape, order="F")
        else:
            raw = np.asanyarray(img.dataobj.get_unscaled())
    return raw.reshape(*header.shape, header.channels)


@contextlib.contextmanager
def _reading_voxels() -> Iterator[None]:
    """What a read of the voxels raises, as the file's :class:`NiftiDefect`: ``truncated`` (the
    gzip stream or the file ends early), ``decode_failed`` (a damaged stream, or a read nibabel
    refuses)."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile) as err:
        raise NiftiDefect("truncated", f"the gzip stream is cut short ({type(err).__name__}: {err}); "
                                       "copy the file again") from err
    except zlib.error as err:
        raise NiftiDefect("decode_failed", f"the gzip stream is damaged (zlib: {err}); copy the file again") from err
    except OSError as err:
        raise NiftiDefect("truncated", f"the voxels are cut short ({err}); copy the file again") from err
    except (ValueError, TypeError) as err:
        raise NiftiDefect("decode_failed", f"the voxels cannot be read ({type(err).__name__}: {err})") from err


#: Compressed bytes read, and most bytes inflated, at a time (:func:`_inflate`).
_CHUNK = 1 << 20


def _inflate(path: str, offset: int, nbytes: int) -> bytearray:
    """Bytes ``offset`` to ``offset + nbytes`` of a gzip file's inflated stream (its voxels), in
    one buffer (:func:`_inflated_voxels`)."""
    out = bytearray(nbytes)
    at = 0
    for piece in _inflated_voxels(path, offset, nbytes):
        out[at:at + len(piece)] = piece
        at += len(piece)
    return out


def _inflated_voxels(path: str, offset: int, nbytes: int) -> Iterator[memoryview]:
    """Bytes ``offset`` to ``offset + nbytes`` of a gzip file's inflated stream (its voxels), in
    order, a piece at a time (at most :data:`_CHUNK` bytes), the stream inflated to its end so
    that zlib checks each member's CRC-32 and length.

    Not nibabel's read: it inflates only up to the last voxel and never reaches the gzip
    trailer, so a flipped bit inside the deflate stream that zlib can still decode gave wrong
    voxels without a word. Several members (bgzip, concatenated files) are one stream; bytes
    after the last member that do not start another (junk appended) are ignored, as gunzip
    does. Raises EOFError (the stream ends before the last voxel, or inside a member),
    zlib.error (a damaged stream, or a CRC-32 or length that does not match its data), and
    NiftiDefect ``truncated`` (a whole stream that holds fewer bytes than the voxels) or
    ``bad_shape`` (one that holds more, the bytes past the last voxel not all zero: a dim or
    datatype damaged smaller, :func:`_excess_message`), possibly after the last piece: a caller
    consumes the whole iterator before trusting what it gave."""
    end, position, excess = offset + nbytes, 0, False
    with open(path, "rb") as fh:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)  # | 16: the gzip wrapper, trailer checked
        pending = fh.read(_CHUNK)
        while True:
            piece = inflater.decompress(pending, _CHUNK)
            low, high = max(position, offset), min(position + len(piece), end)
            if low < high:
                yield memoryview(piece)[low - position:high - position]
            if position + len(piece) > end and not excess:  # bytes past the last voxel: zero padding, or data
                excess = bool(np.frombuffer(piece, dtype=np.uint8)[max(0, end - position):].any())
            position += len(piece)
            if inflater.eof:  # a member ended, its CRC-32 and length checked: another, or the end
                pending = inflater.unused_data
                if len(pending) < 2:
                    pending += fh.read(_CHUNK)
                if pending[:2] != b"\x1f\x8b":
                    break  # the end of the file, or junk after the last member
                inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
            elif inflater.unconsumed_tail:
                pending = inflater.unconsumed_tail
            else:
                pending = fh.read(_CHUNK)
                if not pending and not piece:
                    break  # no input left, and none held back
    if not inflater.eof and position >= end:  # every voxel is there, the check of them is not
        raise EOFError(f"the gzip stream ends after its last voxel ({position} bytes inflated) but before its "
                       "trailer, so its CRC-32 and length cannot check the voxels")
    if not inflater.eof:
        raise EOFError(f"the gzip stream ends inside a member, after {position} bytes inflated, before the last "
                       f"voxel (byte {end})")
    if position < end:  # the stream is whole (its CRC-32 and length checked): what it holds is short
        raise NiftiDefect("truncated", f"the gzip stream is whole (its CRC-32 and length check out) but inflates to "
                                       f"{position} bytes, and the header's dim × datatype put the last voxel at byte "
                                       f"{end}: the file was written short, or its dim or datatype are wrong; export "
                                       "it again (copying it again cannot help)")
    if excess:  # the stream is whole and holds more than the voxels, not all zeros
        raise NiftiDefect("bad_shape", _excess_message(offset, nbytes, position - offset, "the inflated stream"),
                          stage="validate")


#: The most distinct values a weakly named label map holds, as :func:`label_map_content` counts
#: them: TotalSegmentator's 117 classes and FreeSurfer's aseg stay under it. Not more: an MR
#: volume's values are in arbitrary units, and a magnitude LGE or cine peaking at a few hundred
#: holds fewer than 1000 distinct ones (a cap of 1000 left such images out); a finer parcellation
#: (aparc.a2009s, Schaefer's 400) so named is packed, unless a table's mask column or a strong
#: name rule says what it is
LABEL_MAP_MAX_VALUES = 128


def label_map_content(img: Any, header: NiftiHeader) -> str | None:
    """What makes the file's voxels a label map (``one volume of uint8 voxels, unscaled, of 3
    distinct values (...)``), or None where they are an image's: a label map is one volume
    (more is a series: a cine, DWI, fMRI), of whole-number voxels without scaling (integers, or
    floats holding whole numbers only: fslmaths, MONAI's SaveImage and a nibabel user's float
    array write label maps as float32), of at most :data:`LABEL_MAP_MAX_VALUES` distinct values
    and at most one per 8 voxels (a small image's every voxel may differ: a label's region is more
    than a voxel).
    The header decides first; only a single unscaled volume is read, and only until its values
    pass the limit (or, for floats, one is not a whole number), so an image's read stops within its
    first slices (a label map is read whole, once). Raises :class:`NiftiDefect` as
    :func:`read_voxels` does where the voxels cannot be read."""
    dtype = img.get_data_dtype()
    if header.channels > 1 or dtype.kind not in "iuf" or header.slope is not None:
        return None
    limit = min(LABEL_MAP_MAX_VALUES, int(np.prod(img.shape)) // 8)
    count = _distinct_values(img, dtype, limit)
    if count is None:
        return None
    return (f"one volume of {dtype.name} voxels, unscaled, of {count} distinct values (a label map has at most "
            f"{LABEL_MAP_MAX_VALUES}, and at most one per 8 voxels)")


def _distinct_values(img: Any, dtype: np.dtype, limit: int) -> int | None:
    """How many distinct values the voxels of ``img`` hold, or None once they pass ``limit``, or
    (floats) once one is not a whole finite number (the read stops there)."""
    nbytes = int(np.prod(img.shape)) * dtype.itemsize
    offset = int(img.dataobj.offset)
    path = img.get_filename()
    seen = np.empty(0, dtype=dtype)
    carry = b""
    with _reading_voxels():
        pieces = _inflated_voxels(path, offset, nbytes) if _gzipped(path) else _stored_voxels(path, offset, nbytes)
        for piece in pieces:
            data = carry + bytes(piece)
            whole = len(data) - len(data) % dtype.itemsize
            carry = data[whole:]
            values = np.frombuffer(data[:whole], dtype=dtype)
            if dtype.kind == "f" and not bool(np.all(np.isfinite(values) & (values == np.floor(values)))):
                return None
            seen = np.union1d(seen, values)
            if len(seen) > limit:
                return None
    return len(seen)


def _stored_voxels(path: str, offset: int, nbytes: int) -> Iterator[bytes]:
    """Bytes ``offset`` to ``offset + nbytes`` of an uncompressed file, a :data:`_CHUNK` at a
    time; raises OSError where the file ends before them."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        left = nbytes
        while left:
            chunk = fh.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"the file ends {left} bytes before its last voxel")
            left -= len(chunk)
            yield chunk


def read_canonical(img: Any, header: NiftiHeader, *, dtype: Any = np.float32) -> Volume:
    """:func:`canonical_values` of :func:`read_voxels`, the same values and affine, without the
    stored volume ever existing whole: a ``.nii.gz``'s voxels are inflated a few slices at a
    time straight into their canonical places in the ``dtype`` volume (the stored int16 CT of
    a 512×512×200 file was 100 MiB alive beside its 200 MiB float32 copy). An uncompressed file
    is mapped by nibabel, so its stored values cost no copy anyway. Raises :class:`NiftiDefect`
    as :func:`read_voxels` does."""
    path = img.get_filename()
    if path is None or not _gzipped(path):
        return canonical_values(read_voxels(img, header), header, dtype=dtype)
    stored = img.get_data_dtype()
    x, y, z = header.shape
    affine, grid = stored_grid(header)  # the stored volume in C order is (T, K, J, I) = (C, D, H, W)
    plan = canonical_plan(affine, grid)
    canonical_shape = tuple((z, y, x)[a] for a in plan.order)
    out = np.empty((header.channels, *canonical_shape), dtype=dtype)
    stored_order = plan.stored_view(out)  # out, seen as (T, K, J, I): a slice written here lands in place
    slice_bytes = x * y * stored.itemsize
    slices = max(1, _CHUNK // max(1, slice_bytes))
    buffer = bytearray(slices * slice_bytes)
    filled, done = 0, 0
    with _reading_voxels():
        for piece in _inflated_voxels(path, int(img.dataobj.offset), slice_bytes * z * header.channels):
            while len(piece):
                take = min(len(piece), len(buffer) - filled)
                buffer[filled:filled + take] = piece[:take]
                piece, filled = piece[take:], filled + take
                if filled == len(buffer) or done * slice_bytes + filled == slice_bytes * z * header.channels:
                    count = filled // slice_bytes
                    chunk = np.frombuffer(buffer, dtype=stored, count=count * x * y).reshape(count, y, x)
                    _check_range(chunk, out.dtype)
                    for n in range(count):
                        t, k = divmod(done + n, z)
                        _store(stored_order[t, k], chunk[n], header)
                    del chunk
                    done, filled = done + count, 0
    return Volume(out, plan.affine)


def _store(dest: np.ndarray, stored: np.ndarray, header: NiftiHeader) -> None:
    """``stored`` (stored values: a slice, or a whole volume where the header sets no scaling)
    into ``dest`` (its place in the canonical volume). Where the header sets a slope and ``dest``
    holds floats: ``stored`` × ``scl_slope`` + ``scl_inter`` computed in float64 and rounded once
    to ``dest``'s dtype, as nibabel's ``get_fdata(dtype=np.float32)`` computes them (its
    ``apply_read_scaling``: the header's float32 fields as float64, the stored values upcast to
    float64, each step skipped where it is the identity, then one cast), so a voxel is the
    float32 value nearest the scaled value, never one rounded twice (int16 CT under a slope of
    0.1 was 1-2 ulp off in a third of its voxels that way, a HU off once packed as float16).
    The float64 temporary is ``stored``'s size: callers pass a slice at a time, so the peak stays
    the stored values and the float32 volume (``limits.max_decoded_bytes``' estimate). A label
    map's integers (``dest`` an integer dtype) stay as stored."""
    if dest.dtype.kind != "f" or header.slope is None:
        np.copyto(dest, stored, casting="unsafe")
        return
    scaled = stored.astype(np.float64)  # a copy: the steps below are in place
    with np.errstate(over="ignore"):  # beyond float32: infinite, the non_finite check's, as nibabel's
        if header.slope != 1.0:
            scaled *= header.slope
        if header.inter:
            scaled += header.inter
        np.copyto(dest, scaled, casting="unsafe")


def canonical_values(raw: np.ndarray, header: NiftiHeader, *, dtype: Any = np.float32) -> Volume:
    """``raw`` (X, Y, Z, T stored values) as a C×D×H×W volume in canonical LPS axes (module
    docstring), copied once into ``dtype`` (float32: scaled by ``scl_slope``/``scl_inter`` a
    slice at a time on the way, :func:`_store`; an integer dtype, for label maps: unscaled), with
    its affine (voxel (d, h, w) → LPS mm)."""
    view = canonical_view(raw.transpose(3, 2, 1, 0), stored_grid(header)[0])  # (T, K, J, I) = (C, D, H, W)
    out = np.empty(view.array.shape, dtype=dtype)
    _check_range(view.array, out.dtype)
    if out.dtype.kind == "f" and header.slope is not None:
        for c, d in np.ndindex(*out.shape[:2]):  # a slice at a time: no float64 copy of the volume
            _store(out[c, d], view.array[c, d], header)
    else:
        _store(out, view.array, header)
    return Volume(out, view.affine)


def _check_range(stored: np.ndarray, into: np.dtype) -> None:
    """Raise :class:`NiftiDefect` (``non_finite``) where float64 voxels are finite but beyond what
    ``into`` (float32) holds: the cast made them infinite, so a 1e300 voxel was reported as "1
    infinite voxel", and under ``non_finite: {fill: ...}`` replaced as if it were one."""
    if stored.dtype.kind != "f" or np.dtype(into).kind != "f" or stored.dtype.itemsize <= np.dtype(into).itemsize:
        return
    top = float(np.finfo(into).max)
    with np.errstate(invalid="ignore"):
        beyond = np.abs(stored) > top
    if beyond.any():
        worst = float(stored[beyond].flat[np.argmax(np.abs(stored[beyond]))])
        raise NiftiDefect("non_finite", f"{int(beyond.sum())} voxel(s) hold finite values beyond float32's range "
                                        f"(|v| > {top:.3g}; {worst:g} among them), which packer holds voxels in; "
                                        "rescale the volume (or clip it) when exporting it")


@dataclass(frozen=True)
class FilledVoxels:
    """What :func:`fill_non_finite` replaced in one file: NaN and infinite voxel counts, and the
    value each channel's were replaced with (``fill``: a number, or ``min``: the channel's
    smallest finite voxel)."""

    nan: int
    inf: int
    rule: float | str
    values: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"nan": self.nan, "inf": self.inf, "fill": self.rule, "values": list(self.values)}

    def note(self, name: str) -> str:
        """The sample's warning (one line, naming the case's file by its channel name, never by
        its path: build logs are shared, and ``packer locate`` names the file)."""
        filled = ", ".join(f"{v:g}" for v in dict.fromkeys(self.values))
        rule = "its channel's smallest finite voxel, " if self.rule == "min" else ""
        return (f"{NON_FINITE_FILLED}: {self.nan} NaN and {self.inf} infinite voxel(s) of the {name!r} file replaced "
                f"with {rule}{filled} (transform.nifti.non_finite)")


#: How a :meth:`FilledVoxels.note` starts: the build counts the files whose samples carry one
#: (the manifest's ``inputs.non_finite_filled``).
NON_FINITE_FILLED = "non-finite voxels filled"


def is_filled_note(warning: str) -> bool:
    """True for a :meth:`FilledVoxels.note`."""
    return warning.startswith(NON_FINITE_FILLED + ":")


def fill_non_finite(volume: Volume, rule: float | str) -> FilledVoxels | None:
    """Replace ``volume``'s NaN and infinite voxels in place, per channel, with ``rule`` (a
    number, or ``min``: the channel's smallest finite voxel), before anything reads its values
    (statistics, resampling, windows); None where every voxel is finite (nothing changed).
    Raises :class:`NiftiDefect` (``non_finite``) for a channel without one finite voxel, which
    ``min`` has nothing to take from and any number would make constant."""
    values = volume.array
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if np.isfinite(low) and np.isfinite(high):
        return None
    nan = inf = 0
    used: list[float] = []
    for index, channel in enumerate(values):  # (D, H, W) views: filled in place
        bad = ~np.isfinite(channel)
        count = int(bad.sum())
        if not count:
            continue
        if count == channel.size:
            raise NiftiDefect("non_finite", f"every one of its {count} voxels (channel {index}) is NaN or infinite: "
                                            "there is no value to keep; export the volume again", stage="validate")
        nans = int(np.isnan(channel).sum())
        nan, inf = nan + nans, inf + count - nans
        value = float(channel[~bad].min()) if rule == "min" else float(rule)
        channel[bad] = value
        used.append(value)
    return FilledVoxels(nan=nan, inf=inf, rule=rule, values=tuple(used))


def check_values(volume: Volume, header: NiftiHeader | None = None, *, packs_values: bool = False) -> None:
    """Raise :class:`NiftiDefect` for NaN or infinite voxels (``non_finite``) or a volume of one
    value (``constant_image``): neither can be windowed or normalised into a usable sample.
    ``header`` (the file's) and ``packs_values`` (the job packs the values themselves as float16,
    ``windows: []``): where both hold and the header sets a scaling, a volume whose values differ
    but all round to one float16 value is ``constant_image`` too (:func:`_scaled_flat`). A window
    or a normalisation works on the float32 values and is not judged by it."""
    values = volume.array
    if not values.size:
        return
    low, high = float(values.min()), float(values.max())  # a NaN makes both NaN; ±inf is an end
    if not (np.isfinite(low) and np.isfinite(high)):  # counted only then: no voxel-sized mask for a good file
        finite = np.isfinite(values)
        nan = int(np.isnan(values).sum())
        raise NiftiDefect("non_finite", f"{nan} NaN and {values.size - int(finite.sum()) - nan} infinite voxel(s) "
                                        "(a resampled or masked output?); replace them with a real value (0, or the "
                                        "background) and export again, or set transform.nifti.non_finite: {fill: min} "
                                        "(or {fill: 0}) to have packer replace them", stage="validate")
    if low == high:
        raise NiftiDefect("constant_image", f"every voxel is {float(values.flat[0]):g} (after scl_slope/scl_inter); "
                                            "the volume carries no information; fix the scaling fields if they are "
                                            "wrong, or remove the file", stage="validate")
    if packs_values and header is not None and header.slope is not None:
        _scaled_flat(low, high, header)


def _scaled_flat(low: float, high: float, header: NiftiHeader) -> None:
    """Raise ``constant_image`` where the scaled values' extremes ``low`` < ``high`` (float32)
    round to one float16 value, as ``windows: []`` packs them (the caller asks only then): a
    scl_slope so far out (1e-30 with scl_inter 0: values 1e-27 apart) that every stored value
    lands on one value as packed, 0.0. The scaling is linear, so the extremes decide for every
    voxel. A real small slope (1e-6 for an ADC in mm²/s: values down to 6e-8 stay apart in
    float16) packs; so does a file whose scaled values pass float16's range (the packed
    ``float16`` sample's own check judges that)."""
    ends = np.asarray([low, high], dtype=np.float16)
    if not np.isfinite(ends).all() or ends[0] != ends[1]:
        return
    raise NiftiDefect("constant_image", f"scl_slope {header.slope:g} and scl_inter {header.inter or 0.0:g} take its "
                                        f"stored values to {low:g}..{high:g}, which all round to one value, "
                                        f"{float(ends[0]):g}, in float16 (as windows: [] packs them): every voxel "
                                        "would pack as one value and the volume would carry no information; fix "
                                        "scl_slope and scl_inter if the header's scaling is damaged, or pack the "
                                        "file under a window or a normalisation, or export it again",
                      stage="validate")



def constant_volume_notes(volume: Volume, name: str) -> list[str]:
    """A sample warning for each volume of a 4-D file (``name``: its channel, as the case names
    it) whose every voxel is one value, the file as a whole varying (:func:`check_values`): a
    sequence exported blank, or a dynamic series' frame before the injection. It still packs (a
    fixed window needs no variation, and a time series may hold such a frame), but it carries
    no information and a z-score of it is zeros, so it is said. None for a 3-D file."""
    values = volume.array
    if values.shape[0] < 2 or not values.size:
        return []
    flat = values.reshape(values.shape[0], -1)
    low, high = flat.min(axis=1), flat.max(axis=1)
    return [f"constant channel: volume {t} of {values.shape[0]} along the last axis of {name} ('{name}[{t}]') "
            f"is every voxel {float(low[t]):g}; it carries no information (a sequence exported blank?) and packs "
            "as such" for t in np.flatnonzero(low == high)]

def same_grid(a: Volume, b: Volume) -> float | None:
    """None when two canonical volumes lie on one grid (same D×H×W, affines within
    :data:`AFFINE_TOLERANCE` mm), else how far apart their affines are (mm; inf for other shapes)."""
    if a.array.shape[1:] != b.array.shape[1:]:
        return float("inf")
    differ = corner_distance_mm(a.affine, b.affine, a.array.shape[1:])
    return None if differ <= AFFINE_TOLERANCE else differ


def grid_text(volume: Volume) -> str:
    """A grid as a message names it: D×H×W and the affine's 3×4 part, rounded."""
    return f"{'×'.join(map(str, volume.array.shape[1:]))} with affine {np.round(volume.affine[:3], 3).tolist()}"


def grid_difference(first: Volume, second: Volume) -> str:
    """What tells two grids apart that :func:`same_grid` found different, as a message says it:
    the voxel counts where they differ (``slices 15 against 16``) and whether the affines agree,
    or how far apart the affines are (mm) when the counts agree."""
    gap = corner_distance_mm(first.affine, second.affine, first.array.shape[1:])
    shapes = first.array.shape[1:], second.array.shape[1:]
    if shapes[0] == shapes[1]:
        return f"same voxel counts, affines up to {gap:.4g} mm apart"
    counts = [f"{axis} {a} against {b}" for axis, a, b in zip(("slices", "rows", "columns"), *shapes, strict=True)
              if a != b]
    return (f"other voxel counts: {', '.join(counts)}; "
            + ("the same affine" if gap <= AFFINE_TOLERANCE else f"affines up to {gap:.4g} mm apart"))



def slice_count(header: NiftiHeader, axis: str) -> int:
    """How many slices the file has along ``axis`` (``axial``, ``coronal``, ``sagittal``) once
    in canonical axes (:func:`canonical_values`), from its header alone."""
    affine, stored = stored_grid(header)
    order = canonical_order(affine)  # the stored axis that becomes D, H, W
    return stored[order[{"axial": 0, "coronal": 1, "sagittal": 2}[axis]]]


def stored_grid(header: NiftiHeader) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The file's voxels as :func:`canonical_values` starts from them: the 4×4 affine of the
    stored array's axes in C order, (K, J, I), to LPS mm, and their sizes (Z, Y, X)."""
    lps = RAS_TO_LPS @ header.affine
    affine = np.eye(4)
    affine[:, :3] = lps[:, [2, 1, 0]]
    affine[:, 3] = lps[:, 3]
    return affine, (header.shape[2], header.shape[1], header.shape[0])
