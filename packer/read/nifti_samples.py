"""A NIfTI case's canonical voxels → its samples: slices, 2.5D stacks or a volume, each channel windowed.

The case (:class:`Case`) is one or more co-registered files on one grid, in canonical LPS axes
(:mod:`packer.read.nifti`): ``values`` C×D×H×W float32 (C: each file's volumes, files in the
job's order) with its affine, each channel's name, and its label map where the source has one.
Every output channel is one input channel through one of the job's windows, channel-major (the
first file's windows first), as a DICOM ``frames: stack`` sample; a window is a fixed window
(:func:`packer.transform.window.apply_window`: HU presets, explicit, or the file's own
``cal_min``/``cal_max`` as ``file``) or a normalisation from the channel's own values
(:mod:`packer.transform.intensity`). Statistics are taken over the channel's whole volume as
stored (before any resampling), once per case, and each sample records them per channel
(``metadata.windows``), so a prediction can be mapped back.

Quantising is DICOM's (:func:`packer.transform.dicom.quantise`): ``uint16`` display values are
float64 (:func:`~packer.transform.dicom.display_dtype`), so its levels are the window's or the
percentile scaling's exact value rounded half to even, for a slice on its own grid, its 2.5D
stacks, a volume on its own grid and a fixed window's resampled volume (resampled on its values,
before windowing); a slice resized or resampled, and a normalisation's resampled volume, are
rendered and interpolated in float32, as ``uint8`` always is.

Sampling (``transform.nifti.sample``):

- ``slice``: one sample per slice along ``axis`` (``axial``: D; ``coronal``: H, shown with
  superior up; ``sagittal``: W, superior up, anterior left), key ``<id>-fNNNN``, each slice
  windowed, resampled to ``spacing`` and resized to ``size`` as a DICOM frame (``fit``'s border
  black: a z-score over all voxels the volume's lowest), with its place in
  patient space (``slice.position`` of pixel (0, 0), ``slice.orientation`` as DICOM's Image
  Orientation: the direction of increasing column, then of increasing row);
- ``{neighbors: k}``: each slice with its ``k`` neighbours on either side as channels
  (:func:`packer.read.series.stack_neighbors`), their offsets in mm along the slice normal, as
  a DICOM series' (:func:`normal_step`: a sheared grid's slice centres lie further apart);
- ``volume``: one C×D×H×W sample, resampled (linear) to ``spacing`` and centre-cropped or
  zero-padded to ``size``, its affine in ``metadata.volume``. A fixed window (and
  :data:`STORED_VALUES`) takes the values resampled, then windowed; a normalisation (z-score,
  percentiles) is applied to the voxels as stored, whose statistics and foreground it took, and
  its output resampled, as a slice's is (and nnU-Net's): resampled first, the voxels between a
  background of 0 and the tissue were blends of both, z-scored as tissue.

A label map follows its image exactly: sliced the same way and resampled by nearest neighbour
(:func:`packer.transform.mask.transform_mask_dicom` per slice, :func:`~packer.transform.volume.resample_nearest`
for a volume), padded with the mask's ``pad`` id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.config import WindowSpec
from packer.keys import frame_key
from packer.read.series import stack_neighbors
from packer.records import Sample, SampleRef
from packer.transform.dicom import (
    display_dtype,
    finish_image,
    keeps_geometry,
    output_content,
    output_spacing,
    quantise,
)
from packer.transform.intensity import (
    Stats,
    apply_percentiles,
    apply_zscore,
    percentile_stats,
    zscore_black,
    zscore_scale,
    zscore_stats,
)
from packer.transform.mask import transform_mask_dicom
from packer.transform.volume import (
    Volume,
    crop_or_pad,
    resample_linear,
    resample_nearest,
    resampled_grid,
)
from packer.transform.window import apply_window

#: The axes a slice may be taken along: the canonical axis it indexes (1 = D, 2 = H, 3 = W).
AXES = {"axial": 1, "coronal": 2, "sagittal": 3}


@dataclass(frozen=True)
class Slicing:
    """What the NIfTI kind's settings say about sampling (a view of its settings, so that this
    module needs no job): the mode and its parameters, the slice geometry and the output."""

    windows: tuple[WindowSpec, ...]
    sample: str
    axis: str
    neighbors: int
    edge: str
    spacing: tuple[float, float] | None
    size: tuple[int, int] | None
    resize: str
    output: str
    volume_spacing: tuple[float, float, float] | None
    volume_size: tuple[int, int, int] | None
    pad: int = 0


@dataclass(frozen=True)
class Case:
    """One case's voxels (C×D×H×W float32, canonical), affine (voxel (d, h, w) → LPS mm),
    channel names and file display ranges (``cal``, for ``file`` windows, None where unset), and
    its label map (D×H×W, the mask's dtype) or None."""

    values: np.ndarray
    affine: np.ndarray
    names: tuple[str, ...]
    cal: tuple[tuple[float, float] | None, ...]
    mask: np.ndarray | None = None
    #: Per channel, why its file's cal_min/cal_max are set but unusable ("" where unset or usable)
    cal_unusable: tuple[str, ...] = ()


class MissingWindow(Exception):
    """A ``file`` window of a channel whose file sets no ``cal_min``/``cal_max``."""


class UnscalableZscore(Exception):
    """A ``zscore`` channel whose standard deviation float32 cannot invert
    (:func:`~packer.transform.intensity.zscore_scale`): ``non_finite``, as voxels beyond float32's
    range are."""


class FlatWindow(Exception):
    """A ``file`` window under which every voxel of a channel comes out as one level
    (``constant_image``, as a DICOM file's own window that renders a frame flat)."""


#: The one channel per input channel of ``transform.nifti.windows: []``: the voxels' values as
#: read (stored × scl_slope + scl_inter: SUV, Bq/ml, HU), no window nor normalisation; float16 only.
STORED_VALUES = WindowSpec(kind="values", name="values")


def _stats(values: np.ndarray, spec: WindowSpec) -> Stats | None:
    if spec.kind == "percentiles":
        return percentile_stats(values, float(spec.low or 0.0), float(spec.high or 100.0), spec.over or "all")
    if spec.kind == "zscore":
        return zscore_stats(values, spec.over or "nonzero")
    return None


@dataclass(frozen=True)
class _Channel:
    """One output channel: input channel ``index`` through ``spec`` (with its ``stats``, or the
    centre and width a fixed window uses)."""

    index: int
    spec: WindowSpec
    stats: Stats | None
    center: float | None
    width: float | None
    function: str
    record: dict[str, Any]
    #: The channel's smallest value (:data:`STORED_VALUES`: its black); None for any other
    lowest: float | None = None

    def render(self, values: np.ndarray, dtype: type[np.floating] = np.float32) -> np.ndarray:
        """``values`` (any shape, float32) → ``dtype`` (:func:`~packer.transform.dicom.display_dtype`:
        float64 for uint16 output on the slice's own grid, else float32): [0, 1] for windows and
        percentiles; z for z-scores (float16 output only: always float32)."""
        if self.spec.kind == "percentiles" and self.stats is not None:
            return apply_percentiles(values, self.stats, dtype)
        if self.spec.kind == "zscore" and self.stats is not None:
            return apply_zscore(values, self.stats)
        if self.spec.kind == "values":
            return values.astype(np.float32, copy=False)
        return apply_window(values, float(self.center or 0.0), float(self.width or 1.0), self.function, dtype)

    @property
    def black(self) -> float:
        """The value that displays black, which ``fit``'s border takes: 0 for a window and
        percentiles; a z-score's :func:`~packer.transform.intensity.zscore_black` (over all
        voxels, the volume's lowest z-score: 0 is its mean); for :data:`STORED_VALUES` the
        channel's smallest value, as DICOM's float16 modality values are padded (never 0 Bq/ml or
        0 HU painted in as if measured)."""
        if self.lowest is not None:
            return self.lowest
        return zscore_black(self.stats) if self.spec.kind == "zscore" and self.stats is not None else 0.0


def plan_channels(case: Case, windows: Sequence[WindowSpec]) -> list[_Channel]:
    """Every output channel of ``case`` (input channels × windows), statistics taken over each
    input channel's whole volume. Raises :class:`MissingWindow` for a ``file`` window of a file
    without a display range."""
    several = len(case.names) > 1
    out = []
    for index, name in enumerate(case.names):
        for spec in windows:
            stats = _stats(case.values[index], spec)
            if stats is not None and spec.kind == "zscore":
                try:
                    zscore_scale(stats)
                except ValueError as err:
                    raise UnscalableZscore(f"channel {name!r}: {err}") from None
            center, width, function = spec.center, spec.width, spec.function
            if spec.kind == "file":
                if spec.selector not in (0, None):  # a NIfTI file has one display range, named by nothing
                    raise MissingWindow(f"channel {name!r}: the window {{file: {spec.selector!r}}} asks for a "
                                        "display range a NIfTI file cannot hold (it has one, cal_min/cal_max, "
                                        "with no index or name): write file (or {file: 0})")
                cal = case.cal[index]
                why = case.cal_unusable[index] if index < len(case.cal_unusable) else ""
                if cal is None and why:
                    raise MissingWindow(f"channel {name!r}: its file's display range is unusable for the 'file' "
                                        f"window: {why}; fix them, or give a preset, {{center, width}} or a "
                                        "normalisation")
                if cal is None:
                    raise MissingWindow(f"channel {name!r}: its file sets no display range (cal_min/cal_max) for "
                                        "the 'file' window; give a preset, {center, width} or a normalisation")
                center, width, function = (cal[0] + cal[1]) / 2, cal[1] - cal[0], "LINEAR_EXACT"
                _check_not_flat(name, case.values[index], cal)
            label = spec.name if spec.kind != "file" else "cal"
            record: dict[str, Any] = {"name": f"{name} {label}" if several else label, "source": spec.kind,
                                      "channel": name}
            lowest = None
            if spec.kind == "values":
                # non-finite voxels are filled or refused by now: the extremes are numbers
                lowest = float(case.values[index].min())
                record.update(low=lowest, high=float(case.values[index].max()))
            elif stats is not None:
                record.update(stats.to_json())
            else:
                record.update(center=center, width=width, function=function)
            out.append(_Channel(index, spec, stats, center, width, function, record, lowest))
    return out


def _check_not_flat(name: str, values: np.ndarray, cal: tuple[float, float]) -> None:
    """Raise :class:`FlatWindow` where every finite value of a channel lies at or below
    ``cal_min`` or every one at or above ``cal_max``: the file's display range renders the whole
    channel as one level (a range of 0..1 over values of hundreds), and the sample would carry
    no information."""
    low, high = float(values.min()), float(values.max())  # no copy: non-finite voxels are filled or refused by now
    if not (np.isfinite(low) and np.isfinite(high)):
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return
        low, high = float(finite.min()), float(finite.max())
    if high <= cal[0] or low >= cal[1]:
        level = "0 (black)" if high <= cal[0] else "the top level (white)"
        raise FlatWindow(f"channel {name!r}: its values {low:g}..{high:g} all come out as {level} under its file's "
                         f"display range (cal_min {cal[0]:g}, cal_max {cal[1]:g}), the 'file' window; the sample "
                         "would carry no information: fix the file's cal_min/cal_max, or give a preset, "
                         "{center, width} or a normalisation")


def _slice_view(array: np.ndarray, axis: str, index: int) -> np.ndarray:
    """Slice ``index`` along ``axis`` of a (C×)D×H×W array, rows and columns as displayed: axial
    H×W; coronal D×W and sagittal D×H with D reversed (superior up)."""
    lead = array.ndim - 3
    picked = np.take(array, index, axis=lead + AXES[axis] - 1)
    return picked if axis == "axial" else np.flip(picked, axis=lead)


def _slice_geometry(affine: np.ndarray, shape: tuple[int, int, int], axis: str, index: int
                    ) -> dict[str, Any]:
    """Where a slice lies: pixel (0, 0)'s centre in LPS mm, the directions of increasing column
    and row (DICOM's Image Orientation order), and (row, column) spacing in mm."""
    d, h, w = shape
    cols = {"axial": affine[:3, 2], "coronal": affine[:3, 2], "sagittal": affine[:3, 1]}[axis]
    rows = {"axial": affine[:3, 1], "coronal": -affine[:3, 0], "sagittal": -affine[:3, 0]}[axis]
    corner = {"axial": (index, 0, 0), "coronal": (d - 1, index, 0), "sagittal": (d - 1, 0, index)}[axis]
    origin = affine @ np.array([*corner, 1.0])
    row_mm, col_mm = float(np.linalg.norm(rows)), float(np.linalg.norm(cols))
    return {"position": [round(float(v), 6) for v in origin[:3]],
            "orientation": [round(float(v), 6) for v in (*(cols / col_mm), *(rows / row_mm))],
            "pixel_spacing": [round(row_mm, 6), round(col_mm, 6)]}


def slice_samples(ref: SampleRef, case: Case, plan: Slicing, base: dict[str, Any]) -> list[Sample]:
    """One sample per slice along ``plan.axis`` (module docstring), or neighbour stacks of them."""
    channels = plan_channels(case, plan.windows)
    blacks = [channel.black for channel in channels]  # fit's border, as a DICOM frame's
    count = case.values.shape[AXES[plan.axis]]
    shape = (case.values.shape[1], case.values.shape[2], case.values.shape[3])
    out = []
    for index in range(count):
        values = _slice_view(case.values, plan.axis, index)
        where = _slice_geometry(case.affine, shape, plan.axis, index)
        spacing = (where["pixel_spacing"][0], where["pixel_spacing"][1])
        # uint16 on the slice's own grid in float64 (exact levels); resized or resampled, float32
        dtype = display_dtype(plan.output, keeps_geometry(*values.shape[1:], pixel_spacing=spacing,
                                                          spacing=plan.spacing, size=plan.size))
        rendered = np.stack([channel.render(values[channel.index], dtype) for channel in channels], axis=-1)
        image = finish_image(rendered, pixel_spacing=spacing, spacing=plan.spacing, size=plan.size,
                             policy=plan.resize, output=plan.output, pad_value=blacks)
        metadata = {**base, "windows": [c.record for c in channels], "pixel_spacing": where.pop("pixel_spacing"),
                    "slice": {"axis": plan.axis, "index": index, "count": count, **where}}
        grid = output_spacing(*values.shape[1:], pixel_spacing=spacing, spacing=plan.spacing, size=plan.size,
                              policy=plan.resize)
        if grid is not None:
            metadata["output_spacing"] = grid
        mask = None
        if case.mask is not None:
            mask = transform_mask_dicom(np.ascontiguousarray(_slice_view(case.mask, plan.axis, index)),
                                        pixel_spacing=spacing, spacing=plan.spacing, size=plan.size,
                                        policy=plan.resize, pad_value=plan.pad)
        key = frame_key(ref.sample_id, index, count)
        # where the slice lies in its output: near-copy evidence is drawn from it, not fit's padding
        content = output_content(*values.shape[1:], pixel_spacing=spacing, spacing=plan.spacing, size=plan.size,
                                 policy=plan.resize)
        out.append(Sample(key=key, ref=ref, image=image, metadata=metadata, mask=mask, content=content))
    if plan.sample != "neighbors":
        return out
    return stack_neighbors(out, [normal_step(case.affine, plan.axis)] * (len(out) - 1), plan.neighbors, plan.edge)


def normal_step(affine: np.ndarray, axis: str) -> float:
    """The distance in mm between consecutive slices along ``axis``, measured along the slice
    normal (the cross product of the slice's column and row directions), as a DICOM series'
    steps are: a sheared (gantry-tilt) grid's slice centres lie further apart than that."""
    cols = {"axial": affine[:3, 2], "coronal": affine[:3, 2], "sagittal": affine[:3, 1]}[axis]
    rows = {"axial": affine[:3, 1], "coronal": affine[:3, 0], "sagittal": affine[:3, 0]}[axis]
    normal = np.cross(cols, rows)
    length = float(np.linalg.norm(normal))
    step = affine[:3, AXES[axis] - 1]
    if length == 0:  # a degenerate plane (refused upstream): no normal to project on
        return float(np.linalg.norm(step))
    return abs(float(np.dot(step, normal))) / length


def volume_sample(ref: SampleRef, case: Case, plan: Slicing, base: dict[str, Any]) -> list[Sample]:
    """The case as one C×D×H×W sample (module docstring), with its label map on the same grid."""
    channels = plan_channels(case, plan.windows)
    spacing = plan.volume_spacing
    shape, affine = case.values.shape[1:], case.affine
    if spacing is not None:
        shape, affine = resampled_grid(Volume(case.values, case.affine), spacing)
        if shape == case.values.shape[1:]:
            spacing = None  # the grid is kept: nothing to interpolate
    # Windowed and quantised a slice at a time: no float copy of the rendered volume. Quantising
    # before the crop or pad is the same: each channel's padding is its black (0 for a window, the
    # volume's lowest z-score over all voxels), float16 or a level. On the stored grid, uint16
    # display values are float64 (exact levels). Resampled, the order depends on the window:
    # - a fixed window (and stored values) takes the values resampled (float32), so its display
    #   values are never interpolated: uint16 in float64 still;
    # - a normalisation (z-score, percentiles) is applied to the voxels as stored, the ones its
    #   statistics (and a nonzero region's foreground mask) came from, and its output resampled in
    #   float32 (as a slice resampled to spacing is, and nnU-Net does): resampling first blended the
    #   background 0 into the tissue, and z-scored those blends as tissue (a rim far below both).
    dtype = display_dtype(plan.output)
    quantised = np.empty((len(channels), *shape), dtype=np.dtype(plan.output))
    held: tuple[int, np.ndarray] | None = None  # one input channel's resampled values, for its fixed windows
    for c, channel in enumerate(channels):
        values = case.values[channel.index]
        if spacing is not None and channel.stats is not None:
            rendered = channel.render(values, np.float32)[None]
            moved = resample_linear(Volume(rendered, case.affine), spacing).array[0]
            del rendered
            for d in range(shape[0]):
                quantised[c, d] = quantise(moved[d], plan.output)
            del moved
            continue
        if spacing is not None:
            if held is None or held[0] != channel.index:  # channel-major: each input channel resampled once
                held = None  # the last channel's values freed first
                held = (channel.index, resample_linear(Volume(values[None], case.affine), spacing).array[0])
            values = held[1]
        for d in range(shape[0]):
            quantised[c, d] = quantise(channel.render(values[d], dtype), plan.output)
    del held
    finished = Volume(quantised, affine)
    del quantised
    if plan.volume_size is not None:
        finished = crop_or_pad(finished, plan.volume_size, [channel.black for channel in channels])
    image = np.ascontiguousarray(finished.array)
    metadata = {**base, "windows": [c.record for c in channels], "volume": {
        "slices": int(image.shape[1]), "affine": [[round(float(v), 6) for v in row] for row in finished.affine],
        "spacing": [round(v, 6) for v in finished.spacing], "layout": "CDHW", "frame": "LPS"}}
    mask = None
    if case.mask is not None:
        labels = Volume(case.mask[None], case.affine)
        if plan.volume_spacing is not None:
            labels = resample_nearest(labels, plan.volume_spacing)
        if plan.volume_size is not None:
            labels = crop_or_pad(labels, plan.volume_size, fill=plan.pad)
        mask = np.ascontiguousarray(labels.array[0])
    return [Sample(key=ref.sample_id, ref=ref, image=image, metadata=metadata, mask=mask)]
