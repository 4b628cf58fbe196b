"""The ``nifti`` source kind: NIfTI-1/2 volumes as slices, 2.5D stacks or volumes, with label maps.

Most labelled volumetric data ships as NIfTI: the Medical Segmentation Decathlon, BraTS, KiTS,
AMOS, TotalSegmentator, and the sets groups convert once with dcm2niix and label in ITK-SNAP or
3D Slicer. One file is one unit of work: its header is probed (:mod:`packer.read.nifti`), its
voxels read once, put in canonical LPS axes and sampled (:mod:`packer.read.nifti_samples`).
Like an image source, entity and time come from the source's table (``path,entity,...``; a
table-less ``label: folder`` or ``label: none`` source makes each file its own entity). A table
may name, per row, further co-registered files of the case (``channel_files``: columns, one
channel each after the row's own file, as BraTS' t1/t1ce/t2/flair) and its label map
(``mask: {column}``); both must lie on the row's grid (``channel_geometry``, ``mask_geometry``),
or with ``mask: {grid: resample}`` the label map is resampled to it in patient coordinates.
A volume of another format under the root (NRRD, MetaImage, MGH, MINC, an Analyze or NIfTI-1
``.hdr``/``.img`` pair), compressed whole or not (``.mnc.gz``, FSL's ``.hdr.gz``/``.img.gz``), is
left out as ``unsupported_format``, saying how to convert it to NIfTI (:meth:`NiftiKind.unsupported`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packer.config import (
    JobConfig,
    LimitsConfig,
    MaskConfig,
    SourceConfig,
    WindowSpec,
    job_default,
    parse_sampling,
    parse_size,
    parse_window,
)
from packer.errors import ConfigError
from packer.keys import frame_key
from packer.read import at_boundary
from packer.read.archives import Compressed, compressed
from packer.read.kinds import Probed, SourceKind, register
from packer.read.nifti import (
    NiftiDefect,
    NiftiHeader,
    check_values,
    constant_volume_notes,
    fill_non_finite,
    grid_difference,
    grid_text,
    issue,
    label_map_content,
    load_header,
    read_canonical,
    same_grid,
    slice_count,
    stored_grid,
)
from packer.read.nifti_samples import (
    STORED_VALUES,
    Case,
    FlatWindow,
    MissingWindow,
    Slicing,
    UnscalableZscore,
    slice_samples,
    volume_sample,
)
from packer.records import Excluded, Issue, Sample, SampleRef
from packer.transform.channels import check_channels, sharing_channels, stack_fixes
from packer.transform.volume import Volume, canonical_order, resample_to_grid, resampled_shape

#: The name of a row's own file among a case's channels (the others are named by their columns).
IMAGE_CHANNEL = "image"
#: The windows a NIfTI job gets when it names none: a normalisation, since a NIfTI file need
#: not be CT (and its own display range, cal_min/cal_max, is often unset).
DEFAULT_WINDOWS = ({"percentiles": [0.5, 99.5]},)

#: How to convert most volume formats to NIfTI: SimpleITK (ITK reads NRRD, MetaImage, MINC and
#: Analyze and writes each file's orientation into the NIfTI header), or Convert3D or plastimatch.
_SITK = ("e.g. with SimpleITK: import SimpleITK as sitk; sitk.WriteImage(sitk.ReadImage(p), p_out) with p_out "
         "ending in .nii.gz (or c3d p -o p_out.nii.gz, or plastimatch convert --input p --output-img p_out.nii.gz)")
_NOT_READ = "which packer does not read (NIfTI sources read .nii and .nii.gz files)"
#: Volume files a NIfTI source finds but does not read, by suffix (what each is, and the fix):
#: each is left out as ``unsupported_format`` (``excluded.jsonl``), never dropped unsaid. One record
#: per file: a two-file format's data half (an Analyze ``.img``, a MetaImage ``.raw``) gets its own,
#: saying which header it belongs to, since the name alone cannot tell whether that header is there.
UNSUPPORTED_VOLUME_FORMATS = {
    ".nrrd": f"an NRRD volume (.nrrd, 3D Slicer's format), {_NOT_READ}; convert it to NIfTI, {_SITK}",
    ".nhdr": f"an NRRD header (.nhdr) with its voxels in a detached file, {_NOT_READ}; convert it to NIfTI (its "
             f"voxels come along), {_SITK}",
    ".mha": f"a MetaImage volume (.mha, ITK), {_NOT_READ}; convert it to NIfTI, {_SITK}",
    ".mhd": f"a MetaImage header (.mhd, ITK) with its voxels in a detached .raw or .zraw file, {_NOT_READ}; convert "
            f"it to NIfTI (its voxels come along), {_SITK}",
    ".raw": f"raw voxels, as the detached data file of a MetaImage .mhd or NRRD .nhdr header, {_NOT_READ}; convert "
            "the header that names it to NIfTI (see that file's record), or write one if none describes it; then "
            "move this file out of the root",
    ".zraw": f"the compressed voxels of a MetaImage .mhd header, {_NOT_READ}; convert the .mhd that names it to "
             "NIfTI (see that file's record), then move this file out of the root",
    ".mgz": f"an MGH volume (.mgz, FreeSurfer), {_NOT_READ}; convert it to NIfTI with FreeSurfer's mri_convert "
            "p.mgz p_out.nii.gz, or with nibabel: nibabel.save(nibabel.load(p), p_out) with p_out ending in .nii.gz",
    ".mgh": f"an MGH volume (.mgh, FreeSurfer), {_NOT_READ}; convert it to NIfTI with FreeSurfer's mri_convert "
            "p.mgh p_out.nii.gz, or with nibabel: nibabel.save(nibabel.load(p), p_out) with p_out ending in .nii.gz",
    ".mnc": f"a MINC volume (.mnc), {_NOT_READ}; convert it to NIfTI with mnc2nii (minc-tools), or {_SITK}",
    ".hdr": f"the header of an Analyze 7.5 or NIfTI-1 .hdr/.img pair, {_NOT_READ}; convert the pair to one .nii.gz "
            f"file through this header (the .img of the same name comes along), {_SITK}; then move both halves out "
            "of the root",
    ".img": f"the voxels of an Analyze 7.5 or NIfTI-1 .hdr/.img pair (its header is the .hdr of the same name), "
            f"{_NOT_READ}; convert the pair through its .hdr (see that file's record), then move both halves out of "
            "the root",
}
#: NIfTI files under a compression packer does not list (it reads .nii and gzip's .nii.gz).
_RECOMPRESS = {".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zip": "zip", ".z": "compress"}
#: The header intents that declare a file's voxels labels (a label map, whatever its name):
#: NIFTI_INTENT_LABEL (an index into a label table) and NIFTI_INTENT_NEURONAME (into a list of
#: brain structures); a source without a table leaves such a file out as ``label_map``
LABEL_INTENTS = {1002: "NIFTI_INTENT_LABEL", 1003: "NIFTI_INTENT_NEURONAME"}
#: The formats of two files, whose other half a compressing tool compresses too (FSL's
#: NIFTI_PAIR_GZ and ANALYZE_GZ write ``.hdr.gz`` and ``.img.gz``): both are decompressed
_PAIRED = frozenset({".hdr", ".img", ".nhdr", ".mhd"})
#: The encodings an NRRD ``.nhdr`` header gives its detached data file (``x.raw.gz``), by suffix:
#: such a file is read through its header as it is, never decompressed first
_NRRD_ENCODINGS = {".gz": "gzip", ".bz2": "bzip2"}


def _compressed_volume(squeezed: Compressed) -> str | None:
    """What a volume file of another format compressed whole (BrainWeb's ``.mnc.gz``, FSL's
    ``.hdr.gz``/``.img.gz``) is and what to do: its uncompressed name's record
    (:data:`UNSUPPORTED_VOLUME_FORMATS`) with the decompression before the conversion; None where
    that name is no volume format (``notes.txt.gz``)."""
    inner = squeezed.inner_suffix
    said = UNSUPPORTED_VOLUME_FORMATS.get(inner)
    if said is None:
        return None
    how = f"{squeezed.compressor} ({squeezed.suffix})"
    if inner == ".raw" and squeezed.suffix in _NRRD_ENCODINGS:
        return (f"raw voxels compressed with {how}, as the detached data file of an NRRD .nhdr header (encoding: "
                f"{_NRRD_ENCODINGS[squeezed.suffix]}), {_NOT_READ}; convert the header that names it to NIfTI (see "
                "that file's record; this file stays as it is, its header says how it is encoded), then move this "
                "file out of the root")
    what, _, fix = said.partition(f", {_NOT_READ}; ")
    them = "it and the other half of its pair where they lie" if inner in _PAIRED else "it where it lies"
    return (f"{what} compressed with {how}, {_NOT_READ}; decompress {them} (e.g. {squeezed.command} "
            f"*{squeezed.suffix} in its folder), then {fix}")


@dataclass(frozen=True)
class NiftiTransformConfig:
    """``transform.nifti``: how a NIfTI case becomes samples (:mod:`packer.read.nifti_samples`).

    ``windows``: one output channel per input channel and window (HU presets, ``{center,
    width}``, ``file`` = the file's ``cal_min``/``cal_max``, ``{percentiles: [low, high]}``,
    ``zscore``; ``windows: []``, :data:`~packer.read.nifti_samples.STORED_VALUES`: the values);
    ``sample``: ``slice``, ``neighbors`` (``neighbors``, ``edge``) or ``volume``
    (``volume_spacing`` (z, y, x mm), ``volume_size`` (D, H, W)); ``axis``: the slices' axis;
    ``spacing`` (row, column mm), ``size``, ``resize``: each slice's, as a DICOM frame's;
    ``output``: uint8, uint16 or float16 (z-scores need float16); ``channels_from``:
    ``last_axis`` makes a 4-D file's volumes channels (None refuses 4-D files); ``channels``:
    ``transform.channels`` for NIfTI sources; ``fill``: what replaces a NaN or infinite voxel of
    an image file (``non_finite: {fill: VALUE}``: a number or ``min``), None for ``non_finite:
    bad`` (the case is a ``non_finite`` bad sample)."""

    windows: tuple[WindowSpec, ...]
    sample: str = "slice"
    neighbors: int = 0
    edge: str = "replicate"
    volume_spacing: tuple[float, float, float] | None = None
    volume_size: tuple[int, int, int] | None = None
    axis: str = "axial"
    spacing: tuple[float, float] | None = None
    size: tuple[int, int] | None = None
    resize: str = "stretch"
    output: str = "uint8"
    channels_from: str | None = None
    channels: int | None = None
    fill: float | str | None = None
    #: the job-file key that set ``channels``, as errors name it; not part of the identity
    channels_key: str = field(default="transform.channels", compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"windows": [w.to_json() for w in self.windows], "axis": self.axis,
                               "size": list(self.size) if self.size else None, "resize": self.resize,
                               "spacing": list(self.spacing) if self.spacing else None, "output": self.output,
                               "channels_from": self.channels_from, "channels": self.channels}
        if self.sample == "neighbors":
            out["sample"] = {"neighbors": self.neighbors, "edge": self.edge}
        elif self.sample == "volume":
            out["sample"] = {"volume": {"spacing": list(self.volume_spacing) if self.volume_spacing else None,
                                        "size": list(self.volume_size) if self.volume_size else None}}
        else:
            out["sample"] = "slice"
        if self.fill is not None:  # only when set: jobs that keep the default keep their config_hash
            out["non_finite"] = {"fill": self.fill}
        return out

    def slicing(self, pad: int) -> Slicing:
        """What :mod:`packer.read.nifti_samples` needs of these settings; ``pad``: the mask's pad id."""
        return Slicing(windows=self.windows, sample=self.sample, axis=self.axis, neighbors=self.neighbors,
                       edge=self.edge, spacing=self.spacing, size=self.size, resize=self.resize, output=self.output,
                       volume_spacing=self.volume_spacing, volume_size=self.volume_size, pad=pad)


class NiftiKind(SourceKind):
    name = "nifti"
    names_masks = True
    label_maps_by_content = True
    key_parts = frozenset({"frame"})
    libraries = ("nibabel",)
    source_keys = ("channel_files",)
    volume_masks = True
    file_per_task = True
    looked_for = "files named *.nii or *.nii.gz"

    def lists(self, suffix: str) -> bool | None:
        return suffix == ".nii"

    def lists_name(self, name: str, suffix: str) -> bool | None:
        return name.endswith(".nii") or name.endswith(".nii.gz")

    def unsupported(self, name: str, suffix: str) -> str | None:
        """NRRD, MetaImage, MGH, MINC and Analyze-pair files (:data:`UNSUPPORTED_VOLUME_FORMATS`),
        also compressed whole (``.mnc.gz``, ``.hdr.gz``: :func:`_compressed_volume`), and NIfTI
        files compressed other than with gzip; DICOM files are the DICOM kind's (never named here:
        they are recognised by content, not suffix)."""
        if name.endswith(f".nii{suffix}") and suffix in _RECOMPRESS:
            return (f"a NIfTI file compressed with {_RECOMPRESS[suffix]} ({suffix}), {_NOT_READ}; decompress it "
                    "and gzip it (or keep the .nii)")
        squeezed = compressed(name)
        if squeezed is not None:
            return _compressed_volume(squeezed)
        return UNSUPPORTED_VOLUME_FORMATS.get(suffix)

    def parse_settings(self, raw: Mapping[str, Any], shared: Mapping[str, Any]) -> NiftiTransformConfig:
        # windows: [] keeps the voxels' values (SUV, Bq/ml computed upstream), one channel per input channel
        windows = tuple(parse_window(w, f"transform.nifti.windows[{i}]")
                        for i, w in enumerate(raw.get("windows", DEFAULT_WINDOWS))) or (STORED_VALUES,)
        sampling = parse_sampling(raw, "nifti")
        sampling.pop("series", None)  # a NIfTI file is one grid: there is no series to check
        if sampling.get("sample") == "volume" and "axis" in raw:
            raise ConfigError("transform.nifti.axis: a volume keeps every axis; axis chooses the slices of sample: "
                              "slice or {neighbors: k}. Remove axis")
        return NiftiTransformConfig(
            windows=windows,
            axis=raw.get("axis", job_default("transform.nifti.axis")),
            spacing=(float(raw["spacing"][0]), float(raw["spacing"][1])) if raw.get("spacing") else None,
            size=parse_size(raw.get("size")),
            resize=raw.get("resize", job_default("transform.nifti.resize")),
            output=raw.get("output", job_default("transform.nifti.output")),
            channels_from=raw.get("channels_from"),
            channels=raw.get("channels", shared.get("channels")),
            channels_key="transform.nifti.channels" if "channels" in raw else "transform.channels",
            fill=_parse_non_finite(raw.get("non_finite", job_default("transform.nifti.non_finite"))),
            **sampling,
        )

    def parse_source(self, raw: Mapping[str, Any], where: str) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
        columns = tuple(raw.get("channel_files") or ())
        taken = {"path", *([raw["mask"]["column"]] if "mask" in raw else [])}
        clash = sorted(taken.intersection(columns))
        if clash:
            raise ConfigError(f"{where}.channel_files: column {clash[0]!r} already names the row's own file or its "
                              "mask; list only the columns of the case's other files")
        return (), columns

    def check_job(self, job: JobConfig, sources: Sequence[SourceConfig]) -> None:
        cfg: NiftiTransformConfig = job.settings(self.name)
        if not sources:
            return
        zscores = [w for w in cfg.windows if w.kind == "zscore"]
        if zscores and cfg.output != "float16":
            raise ConfigError(f"transform.nifti.output: a z-score is not in [0, 1] and cannot be {cfg.output}; set "
                              "output: float16 (z-scores of MR, as nnU-Net trains on them), or use {percentiles: "
                              "[0.5, 99.5]} to scale into [0, 1]")
        if STORED_VALUES in cfg.windows and cfg.output != "float16":
            raise ConfigError(f"transform.nifti.windows: [] packs the voxels' own values (stored × scl_slope + "
                              f"scl_inter: SUV, Bq/ml, HU), which are not in [0, 1] and cannot be {cfg.output}; set "
                              "output: float16, or give a window or a normalisation")
        if cfg.channels is not None and cfg.channels_from is None:
            stacked = 2 * cfg.neighbors + 1 if cfg.sample == "neighbors" else 1
            counts = [(1 + len(source.companions)) * len(cfg.windows) for source in sources]
            shared = sharing_channels(job, sources, cfg.channels_key)
            for source, per_slice in zip(sources, counts, strict=True):
                natural = per_slice * stacked
                # only the changes that can work: a count no multiple of the stack takes no channels a
                # slice, and a transform.channels the photos beside it share cannot be the stack's
                fixes = stack_fixes(cfg.channels, per_slice, stacked, every_slice=counts, key=cfg.channels_key,
                                    slice_fix=functools.partial(_slice_channels, source.name),
                                    sample_key="transform.nifti.sample", shared=shared)
                fix = (f"give {source.name!r} windows and channel_files that make {cfg.channels} channels"
                       if stacked == 1 else
                       f"the stack's {stacked} slices (sample: {{neighbors: {cfg.neighbors}}}) times {per_slice} "
                       f"channel(s) a slice make {natural}: {', or '.join(fixes)}" if fixes else "")
                check_channels(cfg.channels, natural, sources=[source.name], fix=fix, key=cfg.channels_key,
                               where="transform.nifti.windows" if stacked == 1 else "transform.nifti.sample")

    def probe(self, ref: SampleRef, source: SourceConfig, job: JobConfig, *, keep: bool,
              placement: bool, placed: Any = None) -> Probed | Issue | Excluded:
        cfg: NiftiTransformConfig = job.settings(self.name)
        try:
            img, header = load_header(ref.path, job.limits, channels_from=cfg.channels_from)
            if header.intent_code in LABEL_INTENTS and source.label_table is None:
                return _declared_label_map(ref, header.intent_code)
            if ref.maybe_label_map is not None and source.label_table is None:
                held = label_map_content(img, header)
                if held is not None:
                    return _named_label_map(ref, ref.maybe_label_map, held)
            check_resampled_size(header, cfg, job.limits)
        except NiftiDefect as defect:
            return issue(ref, defect)
        except Exception as err:  # noqa: BLE001 - the probe's one boundary: one bad header must not end the job
            return Issue.of(ref, stage="read", reason="unexpected_error",
                            message=f"{ref.path}: {type(err).__name__}: {err}")
        return Probed(ref=ref, state=(img, header) if keep else header)

    def sample_keys(self, ref: SampleRef, state: Any, job: JobConfig) -> tuple[str, ...]:
        """One per slice along the axis (the header's grid, in canonical axes; none of the edge
        slices under ``edge: skip``), or one per volume."""
        cfg: NiftiTransformConfig = job.settings(self.name)
        if cfg.sample == "volume" or not isinstance(state, NiftiHeader):
            return (ref.sample_id,)
        count = slice_count(state, cfg.axis)
        skipped = cfg.neighbors if cfg.sample == "neighbors" and cfg.edge == "skip" else 0
        return tuple(frame_key(ref.sample_id, i, count) for i in range(skipped, count - skipped))

    def header_notes(self, ref: SampleRef, state: Any, job: JobConfig) -> tuple[str, ...]:
        """The image's sform and qform disagreeing (:func:`forms_note`), as :func:`read_nifti`
        notes it (a label map's own, read with the pixels, is not known here)."""
        return (forms_note(state),) if isinstance(state, NiftiHeader) and state.qform is not None else ()

    def read(self, ref: SampleRef, job: JobConfig, state: Any = None) -> list[Sample] | Issue:
        return read_nifti(ref, job, state)

    def expected_dtype(self, sample: Sample, job: JobConfig) -> np.dtype:
        return np.dtype(job.settings(self.name).output)

    def dtype_rule(self, job: JobConfig) -> str:
        return f"transform.nifti.output is {job.settings(self.name).output}"

    def expected_size(self, job: JobConfig) -> tuple[int, ...] | None:
        cfg: NiftiTransformConfig = job.settings(self.name)
        return cfg.volume_size if cfg.sample == "volume" else cfg.size

    def sample_ndim(self, job: JobConfig) -> int:
        return 4 if job.settings(self.name).sample == "volume" else 3

    def channels(self, job: JobConfig) -> int | None:
        return job.settings(self.name).channels

    def attach_masks(self, samples: list[Sample], source: SourceConfig, job: JobConfig) -> list[Sample] | Issue:
        return samples  # the reader cut each sample's mask from the case's label map, on the sample's grid


def _declared_label_map(ref: SampleRef, intent: int) -> Excluded:
    """The ``label_map`` record of a file of a source without a table whose header declares its
    voxels labels (:data:`LABEL_INTENTS`): the name rules of discovery cannot see it
    (:func:`packer.pipeline.discover.mask_named`), its header can."""
    return Excluded.of(ref, stage="read", why="label_map",
                       detail=f"its header's intent_code is {intent} ({LABEL_INTENTS[intent]}): the file declares its "
                              "voxels labels, a label map, which the source, having no table, would pack as an image "
                              "of its own; name it in a table's mask column to pack it as its image's mask, or list "
                              "it in the source's table to pack it as an image")


def _named_label_map(ref: SampleRef, named: str, held: str) -> Excluded:
    """The ``label_map`` record of a file that only the weak name rule took for one (``named``:
    :attr:`~packer.records.SampleRef.maybe_label_map`) and whose voxels confirm it (``held``:
    :func:`label_map_content`)."""
    return Excluded.of(ref, stage="read", why="label_map",
                       detail=f"{named} beside an image of its folder, and the file holds {held}: a label map, which "
                              "the source, having no table, would pack as an image of its own; name it in a table's "
                              "mask column to pack it as its image's mask, or list it in the source's table to pack "
                              "it as an image")


def _slice_channels(source: str, channels: int) -> str:
    """The fix that gives ``source``'s slices ``channels`` channels each."""
    return f"give {source!r} {channels} channel(s) a slice (windows and channel_files)"


def _parse_non_finite(raw: Any) -> float | str | None:
    """``transform.nifti.non_finite`` (the schema has checked its shape): None for ``bad``, else
    the fill rule (``min`` or a finite number)."""
    if raw == "bad":
        return None
    fill = raw["fill"]
    if fill == "min":
        return "min"
    if not np.isfinite(float(fill)):
        raise ConfigError(f"transform.nifti.non_finite.fill: {fill!r} is not a finite number, and would leave the "
                          "voxels it fills non-finite; give a number (e.g. 0, or the background's value) or min")
    return float(fill)


def check_resampled_size(header: NiftiHeader, cfg: NiftiTransformConfig, limits: LimitsConfig) -> None:
    """Raise ``too_large`` (:class:`NiftiDefect`) where resampling would make the case bigger
    than the limits allow, from its header, before a voxel is read: a volume over
    ``limits.max_voxels`` at ``sample.volume.spacing``, or a slice over ``limits.max_pixels`` at
    ``spacing`` (a 1000 mm voxel size in a header asks for a 2000× larger grid at 0.5 mm)."""
    as_dhw, stored = stored_grid(header)
    if cfg.sample == "volume" and cfg.volume_spacing is not None:
        shape = resampled_shape(stored, as_dhw, cfg.volume_spacing)
        if int(np.prod(shape)) > limits.max_voxels:
            voxels = int(np.prod(shape))
            raise NiftiDefect("too_large", f"resampled to {list(cfg.volume_spacing)} mm its "
                                           f"{'×'.join(map(str, stored))} voxels become "
                                           f"{'×'.join(map(str, shape))} = {voxels}, over limits.max_voxels "
                                           f"({limits.max_voxels}); nothing was decoded. Fix the header's voxel "
                                           "sizes, choose a coarser spacing, or raise the limit")
    if cfg.sample != "volume" and cfg.spacing is not None:
        order = canonical_order(as_dhw)
        mm = [float(np.linalg.norm(as_dhw[:3, a])) for a in order]  # D, H, W voxel sizes, canonical
        dims = [stored[a] for a in order]
        plane = {"axial": (1, 2), "coronal": (0, 2), "sagittal": (0, 1)}[cfg.axis]
        rows, cols = (max(1, round(dims[a] * mm[a] / cfg.spacing[n])) for n, a in enumerate(plane))
        if rows * cols > limits.max_pixels:
            raise NiftiDefect("too_large", f"a {cfg.axis} slice resampled to {list(cfg.spacing)} mm is {rows}×{cols} "
                                           f"= {rows * cols} pixels, over limits.max_pixels ({limits.max_pixels}); "
                                           "nothing was decoded. Fix the header's voxel sizes, or raise the limit")


def read_nifti(ref: SampleRef, job: JobConfig, state: Any = None) -> list[Sample] | Issue:
    """Decode one NIfTI case (the row's file, its ``channel_files`` and its label map) into its
    samples (:mod:`packer.read.nifti_samples`), or the case's one Issue: every defect of
    :func:`packer.read.nifti.load_header`, ``read_canonical`` and ``check_values`` (naming the file
    it is in), ``channel_geometry`` (another file of the case on another grid),
    ``missing_window`` (a ``file`` window without ``cal_min``/``cal_max``), and the label map's
    ``mask_missing``, ``mask_unreadable``, ``mask_values``, ``mask_geometry``, ``mask_empty``.
    ``state``: the row's file as the probe loaded it (its header is not read again)."""
    return at_boundary(ref, lambda progress: _read(ref, job, state), name=ref.path)


def _source_of(ref: SampleRef, job: JobConfig) -> SourceConfig:
    return next(s for s in job.sources if s.name == ref.source)


def _read(ref: SampleRef, job: JobConfig, state: Any) -> list[Sample] | Issue:
    cfg: NiftiTransformConfig = job.settings("nifti")
    source = _source_of(ref, job)
    files: list[tuple[str, str | None]] = [(IMAGE_CHANNEL, ref.path)]
    files += [(column, source.row_file(ref.extra, column)) for column in source.companions]
    volumes: list[Volume] = []
    headers: list[NiftiHeader] = []
    names: list[str] = []
    cal: list[tuple[float, float] | None] = []
    unusable: list[str] = []
    filled: dict[str, dict[str, Any]] = {}  # per channel file, what non_finite: {fill} replaced
    notes: list[str] = []
    for name, path in files:
        if path is None:
            return Issue.of(ref, stage="read", reason="missing_file",
                            message=f"{ref.path}: its table row names no {name} file; name it, or leave the case out")
        try:
            img, header = (state if state is not None and name == IMAGE_CHANNEL
                           else load_header(path, job.limits, channels_from=cfg.channels_from))
            volume = read_canonical(img, header)
            if cfg.fill is not None and (done := fill_non_finite(volume, cfg.fill)) is not None:
                filled[name] = done.to_json()
                notes.append(done.note(name))
            check_values(volume, header, packs_values=STORED_VALUES in cfg.windows)
            notes.extend(constant_volume_notes(volume, name))
        except NiftiDefect as defect:
            if name != IMAGE_CHANNEL and not defect.opened:  # the row names it, the disk has it not
                return Issue.of(ref, stage="read", reason="missing_file",
                                message=f"{path} ({name}): {defect.message}; the table row of {ref.path} names "
                                        "it: copy the file there, or fix the row")
            return issue(ref, defect, name=path)
        if volumes and same_grid(volumes[0], volume) is not None:
            return Issue.of(ref, stage="validate", reason="channel_geometry",
                            message=f"{path} ({name}) lies on {grid_text(volume)}, but {ref.path} on "
                                    f"{grid_text(volumes[0])} ({grid_difference(volume, volumes[0])}); a case's files "
                                    "must share one grid: resample them to one (e.g. with ANTs or SimpleITK) before "
                                    "packing")
        headers.append(header)
        volumes.append(volume)
        names.extend([name] if header.channels == 1 else [f"{name}[{t}]" for t in range(header.channels)])
        cal.extend([header.cal] * header.channels)
        unusable.extend([header.cal_unusable] * header.channels)
    first = headers[0]
    values = volumes[0].array if len(volumes) == 1 else np.concatenate([v.array for v in volumes], axis=0)
    affine = volumes[0].affine
    del volumes
    read = _label_map(ref, source, source.mask, job, Volume(values, affine)) if source.mask is not None else None
    if isinstance(read, Issue):
        return read
    mask, mask_note = read if read is not None else (None, None)
    if mask_note is not None:
        notes.append(mask_note)
    case = Case(values=values, affine=affine, names=tuple(names), cal=tuple(cal), mask=mask,
                cal_unusable=tuple(unusable))
    base: dict[str, Any] = {"format": "nifti", "nifti": first.describe()}
    if len(files) > 1:
        base["channel_files"] = [name for name, _ in files]
    if filled:
        base["nifti"]["non_finite"] = filled
    if first.qform is not None:
        notes.insert(0, forms_note(first))
    if notes:
        base["warnings"] = notes
    plan = cfg.slicing(source.mask.pad if source.mask is not None else 0)
    try:
        if cfg.sample == "volume":
            return volume_sample(ref, case, plan, base)
        return slice_samples(ref, case, plan, base)
    except MissingWindow as err:
        return Issue.of(ref, stage="transform", reason="missing_window", message=f"{ref.path}: {err}")
    except FlatWindow as err:
        return Issue.of(ref, stage="validate", reason="constant_image", message=f"{ref.path}: {err}")
    except UnscalableZscore as err:
        return Issue.of(ref, stage="transform", reason="non_finite", message=f"{ref.path}: {err}")


def _label_map(ref: SampleRef, source: SourceConfig, mask: MaskConfig, job: JobConfig,
               image: Volume) -> tuple[np.ndarray, str | None] | Issue:
    """The case's label map (``mask``, the source's) on the image's canonical grid (D×H×W, the
    mask's dtype) with the warning its header gives (its sform and qform disagree: read by the
    sform, as the image is, where a tool reading the qform would place it elsewhere), or its defect."""
    path = source.mask_file(ref.extra)
    if path is None:
        return Issue.of(ref, stage="read", reason="mask_missing",
                        message=f"{ref.path}: its table row names no label map in column {mask.column!r}")
    try:
        img, header = load_header(path, job.limits, channels_from=None)
        labels = read_canonical(img, header)
    except NiftiDefect as defect:
        reason = "mask_unreadable" if defect.opened else "mask_missing"
        said = defect.message
        if defect.reason == "unsupported_dimensions":  # the image's fix (channels_from) is no label map's
            said = (f"{said.split(';')[0]}; a label map is one 3-D volume of class ids (a one-hot map of one volume "
                    "per class: save its argmax along the 4th axis, with 0 where no class is set)")
        return Issue.of(ref, stage="transform", reason=reason,
                        message=f"{ref.path}: label map {path}: {defect.reason}: {said}")
    values = labels.array[0]
    whole = np.rint(values)
    if not np.isfinite(values).all() or np.abs(values - whole).max(initial=0.0) > 1e-3:
        finite = np.isfinite(values)
        odd = values[finite & (np.abs(values - whole) > 1e-3)]
        found = [f"{int(values.size - finite.sum())} voxel(s) are NaN or infinite"] if not finite.all() else []
        if odd.size:
            found.append(f"{odd.size} voxel(s) hold values that are not whole numbers, e.g. "
                         f"{', '.join(f'{v:g}' for v in np.unique(odd)[:3])}")
        return Issue.of(ref, stage="transform", reason="mask_values",
                        message=f"{ref.path}: label map {path}: {'; '.join(found)}; a label map holds class ids "
                                "(a label map resampled linearly, not by nearest neighbour, has such values): "
                                "export it with an integer datatype")
    low, high = (int(whole.min()), int(whole.max())) if whole.size else (0, 0)
    allowed = set(mask.classes) if mask.classes is not None else set(range(256))
    if low < 0 or high > 65535:
        stray = [low if low < 0 else high]
    else:
        present = np.flatnonzero(np.bincount(whole.astype(np.int64).reshape(-1), minlength=1))
        stray = [int(i) for i in present if int(i) not in allowed]
    if stray:
        where = f"the declared classes {list(mask.classes)}" if mask.classes is not None else "0-255 (declare ids " \
            "above 255 in mask.classes)"
        return Issue.of(ref, stage="transform", reason="mask_values",
                        message=f"{ref.path}: label map {path} holds class id(s) {stray[:8]} outside {where}")
    ids_map = Volume(whole.astype(mask.dtype)[None], labels.affine)
    if same_grid(image, ids_map) is not None:
        if mask.grid != "resample":
            cause = ("it holds another number of voxels than the image (cut short, cropped, or made on another "
                     "series)" if ids_map.array.shape[1:] != image.array.shape[1:]
                     else "the header may come from another case")
            return Issue.of(ref, stage="transform", reason="mask_geometry",
                            message=f"{ref.path}: label map {path} lies on {grid_text(ids_map)}, the image on "
                                    f"{grid_text(image)} ({grid_difference(ids_map, image)}): {cause}. Fix it, or set "
                                    "mask.grid: resample to resample it to the image (nearest neighbour, in patient "
                                    "coordinates)")
        placed = resample_to_grid(ids_map, image.array.shape[1:], image.affine, fill=0)[0]
        if not placed.any() and ids_map.array.any():  # every labelled voxel outside the image: no annotation left
            return Issue.of(ref, stage="transform", reason="mask_geometry",
                            message=f"{ref.path}: label map {path}: none of its {int(np.count_nonzero(ids_map.array))} "
                                    f"labelled voxels lies in the image's field of view once resampled to it (it lies "
                                    f"on {grid_text(ids_map)}, the image on {grid_text(image)}: "
                                    f"{grid_difference(ids_map, image)}); its header may come from another case: fix "
                                    "it, or name the right label map")
    else:
        placed = ids_map.array[0]
    if mask.empty == "bad" and not placed.any():
        return Issue.of(ref, stage="transform", reason="mask_empty",
                        message=f"{ref.path}: label map {path} is all background (0) and the source's mask.empty is "
                                "bad; fix it, or set empty: keep to pack it")
    # no file name: a sample's notes travel into its shard record, warnings and reports, where a label
    # map's name (often the patient's, as its case folder's) is no more to be seen than the image's path
    note = (f"its label map's sform and qform differ by up to {header.forms_differ_mm:.3g} mm; the sform is used"
            if header.qform is not None else None)
    return np.ascontiguousarray(placed), note


def forms_note(header: NiftiHeader) -> str:
    """The reader's warning for a file whose sform and qform disagree (its ``qform`` is kept only then)."""
    return f"sform and qform differ by up to {header.forms_differ_mm:.3g} mm; the sform is used"


register(NiftiKind())
