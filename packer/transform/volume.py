"""Volumes: a stack of windowed slices → one C×D×H×W array in a canonical orientation, at a chosen
spacing and size, with the affine that maps its voxels back to patient space (pure array maths).

:func:`build_volume` runs, in this order:

1. **place**: the affine of the stack as assembled (axes: D along the sorted slice normal, H
   down the rows, W along the columns). Voxel (d, h, w) sits at ``origin + w·col_spacing·row_cos
   + h·row_spacing·col_cos + d·step`` in DICOM's patient coordinates (LPS, mm): Image Position
   (Patient) is the centre of the first voxel, Pixel Spacing is (row spacing, column spacing)
   (PS3.3 C.7.6.2.1.1; nibabel's ``dicom_orientation``).
2. **reorient** (:func:`canonical`): permute and flip the three axes so that D, H and W run
   along the patient axes closest to +z (superior), +y (posterior), +x (left): for an axial
   series in the usual orientation nothing moves. Like nibabel's ``as_closest_canonical``
   (permutes and flips only; an oblique series stays oblique, its affine says how).
3. **resample** (:func:`resample_linear`) to ``spacing`` (z, y, x mm) with separable linear
   interpolation on the windowed values (a DICOM series' slices are windowed first, unrounded in
   float32, and the volume quantised once after: :func:`build_volume`; a NIfTI volume's voxel
   values are resampled, then put through a fixed window, and a normalisation's output is
   resampled: :func:`packer.read.nifti_samples.volume_sample`), centre-aligned: the new grid spans the same extent,
   ``n' = round(n · s / s')`` voxels, so the recorded spacing is ``s · n / n'`` (within half a
   voxel of the request over the volume) and the origin moves by ``(n/n' - 1)/2`` old voxels.
4. **crop or pad** (:func:`crop_or_pad`) to ``size`` (D, H, W), centred, padding each channel
   with the value that is black in it (0 for a window, the lowest value for a z-score over all
   voxels or float16 modality values: the caller's ``fill``), never a value that reads as tissue.

A stack whose slices do not sit on the uniform grid between its first and last slice (steps
irregular within ``series.gap_tolerance``) is first resampled along D onto that grid from the
slices' true positions (``positions``: :func:`depth_resample`), so the affine places every voxel
where it is; with ``spacing``, straight onto the resampled grid, one interpolation along D.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packer.opencv import cv2
from packer.transform.dicom import quantise


@dataclass(frozen=True)
class Volume:
    """A C×D×H×W array and its 4×4 affine (voxel (d, h, w, 1) → patient LPS mm)."""

    array: np.ndarray
    affine: np.ndarray

    @property
    def spacing(self) -> tuple[float, float, float]:
        """(D, H, W) voxel spacing in mm: the lengths of the affine's first three columns."""
        d, h, w = (float(np.linalg.norm(self.affine[:3, i])) for i in range(3))
        return (d, h, w)


def stack_affine(origin: np.ndarray, orientation: np.ndarray, pixel_spacing: tuple[float, float],
                 step: np.ndarray) -> np.ndarray:
    """The affine of a stack: columns D (``step``, mm between slices along the sorted normal), H
    (column cosines × row spacing), W (row cosines × column spacing), translation ``origin``."""
    row_cos, col_cos = orientation[:3], orientation[3:6]
    affine = np.eye(4)
    affine[:3, 0] = step
    affine[:3, 1] = col_cos * pixel_spacing[0]
    affine[:3, 2] = row_cos * pixel_spacing[1]
    affine[:3, 3] = origin
    return affine


#: Two direction cosines within this of each other tie in :func:`canonical_order` (about 0.006°
#: at 45°): a qform's float32 quaternion, DS strings of 16 characters and the SVD's rounding move
#: an exact tie by ~1e-7, which broke it whichever way the noise fell, so a 45° oblique series
#: packed along other axes from its DICOM files than from its NIfTI copy.
AXIS_TIE = 1e-4


def canonical_order(affine: np.ndarray) -> tuple[int, int, int]:
    """Which of the array's axes (0 = D, 1 = H, 2 = W) runs along patient z, y and x: the order
    :func:`canonical` puts them in (each axis used once), by nibabel's ``io_orientation`` rule,
    so that a volume is laid out as ``as_closest_canonical`` lays it out: by direction alone (the
    columns divided by the voxel sizes: an axis of 5 mm voxels 50° off superior no longer
    outweighs one of 0.5 mm voxels 40° off it), made orthogonal (the nearest rotation, by SVD),
    then each array axis in the file's order (W, H, D: a NIfTI's i, j, k, a DICOM stack's column,
    row and slice), the one most clearly along a patient axis first, takes the patient axis it
    runs most along of those left. Assigning superior first instead left an axis 69° off
    left-right where nibabel's assignment keeps all within 50°.

    Cosines within :data:`AXIS_TIE` of each other tie, and a tie is broken by a fixed rule (where
    nibabel takes whichever is larger by rounding): of axes equally clear, the earlier in the
    file's order (W, H, D) goes first, and of patient axes an array axis runs equally along, it
    takes the lower (x, then y, then z). So a DICOM series and its NIfTI copy (both read through
    here) pack alike at exactly 45°, and any orientation off a tie by more keeps its closest axis."""
    norms = np.linalg.norm(affine[:3, :3], axis=0)
    directions = affine[:3, :3] / np.where(norms > 0, norms, 1.0)
    u, singular, vt = np.linalg.svd(directions)
    keep = singular > singular.max() * 3 * np.finfo(np.float64).eps
    rotation = u[:, keep] @ vt[keep]
    world_of: dict[int, int] = {}
    # the axis most clearly along one patient axis first; the file's order (i, j, k) among near-equals
    waiting = [2, 1, 0]
    while waiting:
        clearness = {a: float(np.max(np.abs(rotation[:, a]))) for a in waiting}
        clearest = max(clearness.values())
        axis = next(a for a in waiting if clearness[a] >= clearest - AXIS_TIE)
        waiting.remove(axis)
        column = np.abs(rotation[:, axis])
        if np.allclose(column, 0):
            continue
        world = int(np.flatnonzero(column >= column.max() - AXIS_TIE)[0])  # the lower patient axis of a tie
        world_of[axis] = world
        rotation[world, :] = 0.0
    left = [w for w in (0, 1, 2) if w not in world_of.values()]  # a degenerate axis: the patient axis left
    for axis in (2, 1, 0):
        if axis not in world_of:
            world_of[axis] = left.pop(0)
    array_of = {world: axis for axis, world in world_of.items()}
    return (array_of[2], array_of[1], array_of[0])


def resampled_shape(shape: tuple[int, int, int], affine: np.ndarray,
                    spacing: tuple[float, float, float] | None) -> tuple[int, int, int]:
    """(D, H, W) of a ``shape`` stack with ``affine`` once canonical and resampled to ``spacing``
    (before any crop or pad): from the geometry alone, so a size limit is checked before decoding."""
    order = canonical_order(affine)
    dims = tuple(shape[a] for a in order)
    if spacing is None:
        return (dims[0], dims[1], dims[2])
    old = tuple(float(np.linalg.norm(affine[:3, a])) for a in order)
    d, h, w = (max(1, round(n * s / t)) for n, s, t in zip(dims, old, spacing, strict=True))
    return (d, h, w)


def canonical(volume: Volume) -> Volume:
    """``volume`` with D, H, W permuted and flipped to run along the patient axes closest to
    +z, +y, +x (LPS), the affine updated to match; the voxels are the same, only their order."""
    view = canonical_view(volume.array, volume.affine)
    return Volume(np.ascontiguousarray(view.array), view.affine)


@dataclass(frozen=True)
class CanonicalPlan:
    """How :func:`canonical` reorders a D×H×W grid with a given affine: output axis ``i`` is
    input axis ``order[i]``, reversed where ``flips[i]``; ``affine`` is the output's."""

    order: tuple[int, int, int]
    flips: tuple[bool, bool, bool]
    affine: np.ndarray

    def view(self, array: np.ndarray) -> np.ndarray:
        """A C×D×H×W ``array`` (input axes) as the canonical C×D×H×W view (no copy)."""
        out = np.transpose(array, (0, *(1 + a for a in self.order)))
        flipped = tuple(1 + axis for axis, flip in enumerate(self.flips) if flip)
        return np.flip(out, axis=flipped) if flipped else out

    def stored_view(self, canonical_array: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`view`: a canonical C×D×H×W array seen in the input's axes (no
        copy), so that writing the input's values into it puts each at its canonical place."""
        flipped = tuple(1 + axis for axis, flip in enumerate(self.flips) if flip)
        unflipped = np.flip(canonical_array, axis=flipped) if flipped else canonical_array
        return np.transpose(unflipped, (0, *(1 + int(a) for a in np.argsort(self.order))))


def canonical_plan(affine: np.ndarray, shape: tuple[int, int, int]) -> CanonicalPlan:
    """The :class:`CanonicalPlan` of a D×H×W grid ``shape`` with ``affine``: permute the axes by
    :func:`canonical_order`, then flip each that runs the wrong way (the origin moves to its far end)."""
    order = canonical_order(affine)
    placed = np.eye(4)
    placed[:3, :3] = affine[:3, :3][:, order]
    placed[:3, 3] = affine[:3, 3]
    flips = []
    for axis, world in enumerate((2, 1, 0)):
        flip = bool(placed[world, axis] < 0)
        if flip:
            n = shape[order[axis]]
            placed[:3, 3] += placed[:3, axis] * (n - 1)
            placed[:3, axis] *= -1
        flips.append(flip)
    return CanonicalPlan(order, (flips[0], flips[1], flips[2]), placed)


def canonical_view(array: np.ndarray, affine: np.ndarray) -> Volume:
    """:func:`canonical` of a C×D×H×W ``array`` with ``affine``, as a view of ``array`` (no copy:
    permuted and flipped strides), so that a caller can copy it once, into the dtype it needs."""
    plan = canonical_plan(affine, (array.shape[1], array.shape[2], array.shape[3]))
    return Volume(plan.view(array), plan.affine)


def _positions(n: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre-aligned linear resampling of ``n`` samples to ``size``: for each output sample the
    two source indices and the weight of the second (``x = (i + 0.5)·n/size − 0.5``, clamped)."""
    x = np.clip((np.arange(size) + 0.5) * (n / size) - 0.5, 0, n - 1)
    low = np.floor(x).astype(np.int64)
    return low, np.minimum(low + 1, n - 1), (x - low).astype(np.float32)


def _resample_depth(array: np.ndarray, size: int) -> np.ndarray:
    """C×D×H×W float32 → C×size×H×W along D, one output slice at a time (two source slices each)."""
    if array.shape[1] == size:
        return array
    low, high, weight = _positions(array.shape[1], size)
    out = np.empty((array.shape[0], size, *array.shape[2:]), dtype=np.float32)
    for j in range(size):
        np.multiply(array[:, low[j]], 1.0 - weight[j], out=out[:, j])
        out[:, j] += array[:, high[j]] * weight[j]
    return out


def _resample_plane(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """C×D×H×W float32 → C×D×height×width, each slice by ``cv2.resize`` INTER_LINEAR (the same
    centre-aligned, clamped linear interpolation as :func:`_positions`, on float32 values)."""
    if array.shape[2:] == (height, width):
        return array
    out = np.empty((*array.shape[:2], height, width), dtype=np.float32)
    for c in range(array.shape[0]):
        for d in range(array.shape[1]):
            out[c, d] = cv2.resize(array[c, d], (width, height), interpolation=cv2.INTER_LINEAR)
    return out


def _resample_depth_then_plane(array: np.ndarray, size: int, height: int, width: int) -> np.ndarray:
    """``_resample_plane(_resample_depth(array, size), height, width)``, the same float32
    operations in the same order (so the same bytes), one output slice at a time: each slice
    along D is made in a C×H×W scratch buffer and resized at once, so the C×size×H×W
    intermediate (most of a volume when D shrinks a little and H, W a lot) never exists."""
    low, high, weight = _positions(array.shape[1], size)
    out = np.empty((array.shape[0], size, height, width), dtype=np.float32)
    mixed = np.empty((array.shape[0], *array.shape[2:]), dtype=np.float32)
    upper = np.empty_like(mixed)
    for j in range(size):
        np.multiply(array[:, low[j]], 1.0 - weight[j], out=mixed)
        np.multiply(array[:, high[j]], weight[j], out=upper)
        mixed += upper
        for c in range(array.shape[0]):
            out[c, j] = cv2.resize(mixed[c], (width, height), interpolation=cv2.INTER_LINEAR)
    return out


def resample_linear(volume: Volume, spacing: tuple[float, float, float]) -> Volume:
    """``volume`` (float values) at about ``spacing`` (D, H, W mm): see the module docstring.
    Separable: in-plane per slice, and along D two source slices per output slice; the axis
    that grows goes last, so the work is done on the smaller array. When D shrinks and H or W
    change, each D slice is resized as soon as it is made (:func:`_resample_depth_then_plane`)."""
    array = volume.array.astype(np.float32, copy=False)
    sizes, affine = resampled_grid(volume, spacing)
    if sizes[0] > array.shape[1]:
        array = _resample_depth(_resample_plane(array, sizes[1], sizes[2]), sizes[0])
    elif sizes[0] < array.shape[1] and array.shape[2:] != (sizes[1], sizes[2]):
        array = _resample_depth_then_plane(array, sizes[0], sizes[1], sizes[2])
    else:
        array = _resample_plane(_resample_depth(array, sizes[0]), sizes[1], sizes[2])
    return Volume(np.ascontiguousarray(array), affine)


def resampled_grid(volume: Volume, spacing: tuple[float, float, float]) -> tuple[tuple[int, int, int], np.ndarray]:
    """(D', H', W') and the affine of ``volume`` resampled to about ``spacing`` (the grid of
    :func:`resample_linear`: the same extent, ``n' = round(n · s / s')``, centre-aligned)."""
    affine = volume.affine.copy()
    sizes = []
    for axis, (old, new) in enumerate(zip(volume.spacing, spacing, strict=True)):
        n = volume.array.shape[1 + axis]
        size = max(1, round(n * old / new))
        sizes.append(size)
        factor = n / size
        direction = affine[:3, axis].copy()
        affine[:3, 3] += direction * (factor - 1) / 2
        affine[:3, axis] = direction * factor
    return (sizes[0], sizes[1], sizes[2]), affine


def _nearest(n: int, size: int) -> np.ndarray:
    """Centre-aligned nearest-neighbour resampling of ``n`` samples to ``size``: the source index
    under each output sample's centre (``x = (i + 0.5)·n/size − 0.5``, rounded, clamped): the grid
    of :func:`_positions`, so a label map stays on its linearly resampled image."""
    x = (np.arange(size) + 0.5) * (n / size) - 0.5
    return np.clip(np.floor(x + 0.5), 0, n - 1).astype(np.intp)


def resample_nearest(volume: Volume, spacing: tuple[float, float, float]) -> Volume:
    """``volume`` (a C×D×H×W label map) at about ``spacing`` by nearest neighbour, on the grid
    :func:`resample_linear` gives the image (same shape, same affine); the dtype is kept."""
    (d, h, w), affine = resampled_grid(volume, spacing)
    array = volume.array
    rows, cols = _nearest(array.shape[2], h), _nearest(array.shape[3], w)
    picked = array[:, _nearest(array.shape[1], d)][:, :, rows][:, :, :, cols]
    return Volume(np.ascontiguousarray(picked), affine)


def resample_to_grid(labels: Volume, shape: tuple[int, int, int], affine: np.ndarray, fill: int = 0) -> np.ndarray:
    """``labels`` (a C×D×H×W label map with its own affine) on another grid, ``shape`` (D, H, W)
    with ``affine``, in patient coordinates: each output voxel takes the label voxel nearest its
    centre (``fill`` where it falls outside the label map). One output slice at a time, so the
    index arrays stay the size of a slice. Returns C×D×H×W of ``labels``' dtype."""
    to_labels = np.linalg.inv(labels.affine) @ affine
    src = labels.array
    out = np.full((src.shape[0], *shape), fill, dtype=src.dtype)
    hh, ww = np.meshgrid(np.arange(shape[1]), np.arange(shape[2]), indexing="ij")
    for d in range(shape[0]):
        points = np.stack([np.full(hh.shape, d, dtype=np.float64), hh, ww, np.ones(hh.shape)], axis=0).reshape(4, -1)
        index = np.floor(to_labels[:3] @ points + 0.5).astype(np.intp)
        inside = ((index >= 0) & (index < np.asarray(src.shape[1:])[:, None])).all(axis=0)
        flat = out[:, d].reshape(src.shape[0], -1)
        flat[:, inside] = src[:, index[0, inside], index[1, inside], index[2, inside]]
    return out


def crop_or_pad(volume: Volume, size: tuple[int, int, int], fill: float | Sequence[float] = 0) -> Volume:
    """``volume`` centre-cropped or padded to ``size`` (D, H, W); the origin follows. ``fill``:
    what the padding holds, one value, or one per channel (each channel's black: 0 for a window,
    its lowest value for a z-score over all voxels or for float16 modality values; a mask's pad id)."""
    array = volume.array
    affine = volume.affine.copy()
    fills = [fill] * array.shape[0] if not isinstance(fill, Sequence) else list(fill)
    if len(fills) != array.shape[0]:
        raise ValueError(f"{len(fills)} fill values for a volume of {array.shape[0]} channels")
    for axis, want in enumerate(size):
        n = array.shape[1 + axis]
        if n > want:
            start = (n - want) // 2
            array = np.take(array, np.arange(start, start + want), axis=1 + axis)
            affine[:3, 3] += affine[:3, axis] * start
        elif n < want:
            before = (want - n) // 2
            pads = [(0, 0)] * array.ndim
            pads[1 + axis] = (before, want - n - before)
            if len(set(fills)) == 1:
                array = np.pad(array, pads, constant_values=fills[0])
            else:  # each channel its own black
                array = np.stack([np.pad(array[c], pads[1:], constant_values=f) for c, f in enumerate(fills)])
            affine[:3, 3] -= affine[:3, axis] * before
    return Volume(np.ascontiguousarray(array), affine)


def depth_grid(affine: np.ndarray, n: int, spacing: tuple[float, float, float] | None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Where an ``n``-slice stack with ``affine`` (D along the slice normal, a uniform step) is
    sampled along D: the positions, in steps of that affine from slice 0, and the stack's affine
    on them. Without ``spacing``, the stack's own ``0 .. n-1``; with it, the grid
    :func:`resample_linear` gives the axis D becomes once canonical (``n' = round(n · s / s')``,
    centre-aligned, :func:`_positions`), so that a stack resampled here along D is resampled
    once, not twice."""
    if spacing is None:
        return np.arange(n, dtype=np.float64), affine
    old = float(np.linalg.norm(affine[:3, 0]))
    size = max(1, round(n * old / spacing[canonical_order(affine).index(0)]))
    factor = n / size
    placed = affine.copy()
    placed[:3, 3] += affine[:3, 0] * (factor - 1) / 2
    placed[:3, 0] = affine[:3, 0] * factor
    return np.clip((np.arange(size) + 0.5) * factor - 0.5, 0, n - 1), placed


def _between(positions: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of ``targets``, the two true slices around it (``positions``: increasing, in the
    same units) and the weight of the second, in [0, 1]."""
    low = np.clip(np.searchsorted(positions, targets, side="right") - 1, 0, len(positions) - 2)
    weight = np.clip((targets - positions[low]) / (positions[low + 1] - positions[low]), 0.0, 1.0)
    return low, low + 1, weight.astype(np.float32)


def depth_resample(array: np.ndarray, positions: np.ndarray, targets: np.ndarray, *, nearest: bool = False
                   ) -> np.ndarray:
    """A C×D×H×W stack whose slices lie at ``positions`` along D (increasing; two at least) at
    ``targets`` instead: each output slice linearly between the two true slices around it, in
    float32 (``nearest``: the nearer of them, a tie the upper, in ``array``'s dtype, for a label
    map, which then stays on its image)."""
    low, high, weight = _between(positions, targets)
    if nearest:
        return np.ascontiguousarray(array[:, np.where(weight >= 0.5, high, low)])
    out = np.empty((array.shape[0], len(targets), *array.shape[2:]), dtype=np.float32)
    for j in range(len(targets)):
        np.multiply(array[:, low[j]], np.float32(1.0) - weight[j], out=out[:, j], dtype=np.float32)
        out[:, j] += array[:, high[j]].astype(np.float32) * weight[j]
    return out


def held_depth(spacing: tuple[float, float, float], volume: Volume, axis: int) -> tuple[float, float, float]:
    """``spacing`` with output axis ``axis`` at ``volume``'s own spacing: :func:`resample_linear`
    (and :func:`resample_nearest`) then leave that axis as it is (``n' = round(n · s / s) = n``)."""
    held = list(spacing)
    held[axis] = volume.spacing[axis]
    return (held[0], held[1], held[2])


def requantise(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Resampled float values back in ``dtype``: an integer dtype rounds half to even within its
    range (uint8 0-255, uint16 0-65535), a float dtype is a plain cast."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.rint(np.clip(values, info.min, info.max)).astype(dtype)
    return values.astype(dtype)


def build_volume(slices: np.ndarray, affine: np.ndarray, *, spacing: tuple[float, float, float] | None,
                 size: tuple[int, int, int] | None, positions: np.ndarray | None = None,
                 fill: float | Sequence[float] = 0, output: str | None = None) -> Volume:
    """C×D×H×W windowed slices and their stack affine → the finished volume: canonical,
    resampled, cropped or padded with ``fill`` (module docstring, steps 2-4). ``positions``: where
    the slices truly lie along D, in steps of ``affine`` from the first (0 .. D-1), where they are
    off that uniform grid: the stack is then resampled along D from them (:func:`depth_resample`)
    onto the grid, or straight onto ``spacing``'s, and the affine holds.

    ``output`` None: the slices are as rendered (uint8, uint16 or float16), and the volume keeps
    their dtype (a resample's float32 values are rounded back to it: :func:`requantise`).
    ``output`` set: the slices are the unrounded float32 values they would be quantised from
    (display values in [0, 1]; float16's modality values), as a volume that is resampled gets
    them, and the volume is quantised to ``output`` once, after the resample
    (:func:`packer.transform.dicom.quantise`, as a resampled frame is): resampling levels that
    were rounded already and rounding again put one voxel in six a level off
    ``round(255 · interp(window(values)))``. Unresampled, the same levels as the slices' own."""

    def finished(array: np.ndarray) -> np.ndarray:
        return quantise(array, output) if output is not None else requantise(array, slices.dtype)

    if positions is None:
        volume = canonical(Volume(slices, affine))
        if spacing is not None:
            volume = resample_linear(volume, spacing)
        if spacing is not None or output is not None:
            volume = Volume(finished(volume.array), volume.affine)
    else:
        targets, placed = depth_grid(affine, slices.shape[1], spacing)
        volume = canonical(Volume(depth_resample(slices, positions, targets), placed))
        if spacing is not None:  # D is on its grid already: the other two axes only
            volume = resample_linear(volume, held_depth(spacing, volume, canonical_order(affine).index(0)))
        volume = Volume(finished(volume.array), volume.affine)
    if size is not None:
        volume = crop_or_pad(volume, size, fill)
    return volume
