"""The ``dicom`` source kind: Part 10 files, their entity and time from headers, series for 2.5D and volumes.

Lists every ``*.dcm`` and every file without an image, table or text suffix that carries the
DICM preamble (PS3.10 7.1); a DICOM file compressed whole (``x.dcm.gz``) and an archive
(``series.zip``) are left out as ``unsupported_format``, saying to decompress or unpack them
(:meth:`DicomKind.unsupported`). The reader is :mod:`packer.read.dicom`; series assembly, neighbour
stacks and volumes are :mod:`packer.read.series`, offered to the pixel pass as this kind's
:class:`~packer.read.kinds.Grouping` when ``transform.dicom.sample`` is not ``slice``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from packer.config import (
    DicomTransformConfig,
    JobConfig,
    LimitsConfig,
    SourceConfig,
    job_default,
    parse_modality_windows,
    parse_sampling,
    parse_size,
    parse_window,
    windows_fix,
)
from packer.errors import ConfigError
from packer.keys import frame_key
from packer.read.annotations import AnnotationRefs
from packer.read.archives import Compressed, archive, compressed, sniffed_archive
from packer.read.dicom_attrs import (
    missing_time_note,
    quiet,
    record_time,
    tag_key_problem,
    text_value,
    time_keywords_problem,
    valueless_problem,
)
from packer.read.dicom_masks import (
    AnnotatedSeries,
    annotated,
    annotated_sources,
    header_refusal,
    link,
    series_labels,
    slice_masks,
    volume_mask,
    with_mask,
)
from packer.read.dicom_objects import check_header_conditions, is_header_keyword, keyword_suggestion
from packer.read.dicom_series import HeaderFingerprint, SliceGeometry
from packer.read.kinds import (
    Grouping,
    Probed,
    RangedFile,
    SampleSpan,
    SourceKind,
    register,
    series_incomplete,
    with_channels,
)
from packer.read.series import (
    Series,
    assemble,
    is_constant_slice,
    off_grid,
    stack_neighbors,
    stack_volume,
    volume_resamples,
    volume_shrinks,
    volume_size,
)
from packer.records import Excluded, Issue, MemberIssue, Sample, SampleRef
from packer.storage import is_url
from packer.transform.channels import channel_rule, check_channels, sharing_channels, stack_fixes
from packer.transform.mask import transform_mask_dicom
from packer.where import Condition

#: Suffixes a DICOM file never has (tables, text, images), so their heads are not read.
_NEVER_DICOM = frozenset({".csv", ".txt", ".json", ".md", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp"})
#: Suffixes DICOM files are written with: such a file compressed (``x.dcm.gz``) is named as one
_DICOM_SUFFIXES = frozenset({".dcm", ".dicom", ".dic", ".ima"})
_DICM_OFFSET = 128
_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "float16": np.float16}
_GREY = ("", "MONOCHROME1", "MONOCHROME2")


def _check_identity_keywords(source: SourceConfig, index: int) -> None:
    """Refuse a DICOM source whose ``entity:`` or ``time:`` names no DICOM keyword: the headers are
    read by keyword only, so a misspelt one (``PatientId``) would make every file of the source a
    ``missing_entity`` bad sample, or leave every file without a time. An entity of an attribute
    without a value of its own (:func:`~packer.read.dicom_attrs.valueless_problem`) is refused too:
    OtherPatientIDsSequence made every entity id a dump of its items (their ids and issuers), in
    every shard record, and PixelData the repr of the pixel bytes. Raises ConfigError."""
    checks = [("time", key) for key in source.time]
    if source.entity_path is None:
        checks.insert(0, ("entity", source.entity))
    for field, key in checks:
        at = f"sources[{index}].{field} (source {source.name!r})"
        example = ("PatientID, or entity: {path: REGEX} for an id in the file's path" if field == "entity"
                   else "StudyDate, StudyTime or AcquisitionDateTime")
        tagged = tag_key_problem(key)
        if tagged is not None:
            raise ConfigError(f"{at}: {tagged}")
        if is_header_keyword(key):
            valueless = valueless_problem(key) if field == "entity" else None  # time: says a VR it reads
            if valueless is not None:
                raise ConfigError(f"{at}: {valueless}; give an attribute with a value, such as {example}")
            continue
        close = keyword_suggestion(key)
        hint = f" (did you mean the DICOM keyword {close!r}?)" if close else ""
        raise ConfigError(f"{at}: {key!r} is not a DICOM keyword of pydicom's data dictionary, so no file's header "
                          f"holds it{hint}; give a keyword such as {example}")
    dateless = time_keywords_problem(source.time)  # a keyword of another VR, or a time of day alone
    if dateless is not None:
        raise ConfigError(f"sources[{index}].time (source {source.name!r}): {dateless}")


def _entity(ref: SampleRef, source: SourceConfig, from_header: str | None) -> str | None:
    """A file's entity: its header's (``source.entity``, PatientID by default), or, where the
    source takes it from paths (``entity: {path: REGEX}``: CBIS-DDSM writes each view's folder
    name as its PatientID, ``Mass-Training_P_00001_LEFT_CC``, so a patient's four views were four
    entities), the one discovery read from the file's path."""
    return ref.entity if source.entity_path is not None else from_header


def _named_as_export_image(suffix: str) -> bool:
    """Whether a file whose lower-cased suffix is ``suffix`` is named as a PACS export or a
    DICOMDIR tree names its images: without a suffix (``IMAGES/IM0035``) or by a UID whose last
    part reads as one (``1.2.840.113619.2.55.3.1``, a suffix of digits)."""
    return not suffix or suffix[1:].isdigit()


#: A name that is a UID (``1.2.840.113619.2.55.3.1``): digits in dot-separated parts
_UID = re.compile(r"\d+(\.\d+)+")


def _compressed_detail(squeezed: Compressed) -> str:
    """The ``unsupported_format`` detail of a DICOM file compressed whole."""
    return squeezed.detail("a DICOM file", "a DICOM source reads Part 10 files (*.dcm, or files that start with the "
                                           "DICOM preamble)")


class DicomKind(SourceKind):
    name = "dicom"
    key_parts = frozenset({"frame"})
    table_key = "labels"
    table_columns = "path,label"
    identity_in_header = True
    default_entity = "PatientID"
    default_time = ("StudyDate", "StudyTime")
    attribute_labels = True
    pseudonymize_by_default = True
    always_recorded = True
    looked_for = ("*.dcm files, or other files (not images, tables or text) that start with the DICOM preamble "
                  "(DICM at byte 128)")
    head_bytes = _DICM_OFFSET + 4
    annotation_masks = True

    def lists(self, suffix: str) -> bool | None:
        if suffix == ".dcm":
            return True
        return False if suffix in _NEVER_DICOM else None

    def sniff(self, head: bytes) -> bool:
        return head[_DICM_OFFSET:_DICM_OFFSET + 4] == b"DICM"

    def unsupported(self, name: str, suffix: str) -> str | None:
        """An archive (``series.zip``, ``series.tar.gz``, ``.tgz``, ``.7z``, ``.rar``), or a DICOM
        file compressed whole named as one (``x.dcm.gz``, as some archives and TCIA mirrors ship
        them; also ``.bz2``, ``.xz``, ``.zst``; a ``.zst``, which the standard library cannot look
        into, named by a UID too: ``1.2.840.1.zst``): no DICOM reader opens either, and each was
        in no count. A ``.gz``, ``.bz2`` or ``.xz`` of another name (an export's ``IM0035.gz``) is
        one by its bytes (:meth:`unrecognised`): a rotated log, ``syslog.2.gz``, is named alike.
        Another compressed file (``labels.csv.gz``, a ``.nii.gz`` beside the images) is no DICOM
        file, and stays unlisted as a ``.csv`` does."""
        packed = archive(name)
        if packed is not None:
            return packed.detail("a DICOM source reads the files under its root")
        squeezed = compressed(name)
        if squeezed is not None and (squeezed.inner_suffix in _DICOM_SUFFIXES
                                     or not squeezed.peekable and _UID.fullmatch(squeezed.inner) is not None):
            return _compressed_detail(squeezed)
        return None

    def lists_unread(self, name: str, suffix: str) -> bool:
        """A file named as an export's image (:func:`_named_as_export_image`) whose bytes cannot
        be read is listed: a broken link ``IMAGES/IM0050`` is ``missing_file``, as
        ``IM0050.dcm`` is, not "an empty file"."""
        return _named_as_export_image(suffix)

    def unrecognised(self, name: str, suffix: str, head: bytes) -> str | None:
        """A file named as a PACS export or DICOMDIR tree names its images
        (:func:`_named_as_export_image`) that does not start as a DICOM file: told apart from the
        export's images rather than skipped unsaid (another suffix, ``.xml``, ``.log``, is some
        other file). A file compressed whole with gzip, bzip2 or xz (``IM0035.gz``), whose
        ``head`` is then what it decompresses to (:meth:`~packer.read.archives.Compressed.decoded_head`),
        is a compressed DICOM file where that starts as one (DICM at byte 128), else some other
        file (``storescp.log.1.gz``, or a stream that does not decompress)."""
        squeezed = compressed(name)
        if squeezed is not None and squeezed.peekable:
            return _compressed_detail(squeezed) if self.sniff(head) else None
        if not _named_as_export_image(suffix):
            return None
        packed = sniffed_archive(head)
        if packed is not None:  # an export's EXPORT or IM0035 that is a zip (PK..) or a gzip stream
            return packed.detail("a DICOM source reads the files under its root")
        if not head:
            what = "an empty file (0 bytes)"
        elif len(head) < self.head_bytes:
            what = f"a file of {len(head)} bytes, shorter than a DICOM file's 132-byte preamble and prefix"
        elif head[:2] in (b"\x02\x00", b"\x08\x00"):  # group 0002 (file meta) or 0008, little endian
            what = ("a file that starts like a DICOM data set without the 128-byte preamble and 'DICM' prefix "
                    "(an old ACR-NEMA or raw data set write)")
        else:
            what = (f"a file without a suffix{' (its name a UID)' if suffix else ''} that does not start with the "
                    "DICOM preamble ('DICM' at byte 128)")
        return (f"{what}: among a DICOM export's extension-less images it is most likely a failed or partial "
                "export, or not DICOM at all; export it again, or rewrite a data set without its preamble as a "
                "DICOM file (dcmconv +F in, out; pydicom: dcmread(path, force=True).save_as(out, "
                "enforce_file_format=True))")

    def parse_settings(self, raw: Mapping[str, Any], shared: Mapping[str, Any]) -> DicomTransformConfig:
        windows = tuple(parse_window(w, f"transform.dicom.windows[{i}]")
                        for i, w in enumerate(raw.get("windows", job_default("transform.dicom.windows"))))
        return DicomTransformConfig(
            windows=windows,
            fallback_window=parse_window(raw["fallback_window"], "transform.dicom.fallback_window")
            if "fallback_window" in raw else None,
            size=parse_size(raw.get("size")),
            resize=raw.get("resize", job_default("transform.dicom.resize")),
            spacing=(float(raw["spacing"][0]), float(raw["spacing"][1])) if raw.get("spacing") else None,
            output=raw.get("output", job_default("transform.dicom.output")),
            frames=raw.get("frames", job_default("transform.dicom.frames")),
            modality_windows=parse_modality_windows(raw.get("modality_windows") or {}),
            channels=raw.get("channels", shared.get("channels")),
            channels_key="transform.dicom.channels" if "channels" in raw else "transform.channels",
            **parse_sampling(raw, "dicom"),
        )

    def header_keys(self, keys: Sequence[str]) -> tuple[str, ...]:
        """The keys that are DICOM keywords of pydicom's data dictionary (``Modality``,
        ``SOPClassUID``, ``ImageType``): tested on each file's header by the probe. A key written
        as a tag (``(0008,0060)``) is one too, for :meth:`header_conditions` to refuse naming its
        keyword (as a table's column it was refused as no header attribute)."""
        return tuple(key for key in keys if is_header_keyword(key) or tag_key_problem(key) is not None)

    def header_conditions(self, conditions: tuple[Condition, ...], where: str) -> tuple[Condition, ...]:
        return check_header_conditions(conditions, where)

    def header_key_problem(self, key: str, fix: str) -> str | None:
        tagged = tag_key_problem(key)
        if tagged is not None:  # its own fix: the keyword
            return tagged
        valueless = valueless_problem(key)
        return None if valueless is None else f"{valueless}; {fix}"

    def header_key_hint(self, key: str) -> str:
        close = keyword_suggestion(key)
        return f" (did you mean the DICOM keyword {close!r}?)" if close else ""

    def config_warnings(self, job: JobConfig, sources: Sequence[SourceConfig]) -> tuple[str, ...]:
        """Windows written for ``output: float16``, which packs each grey frame's modality values
        and applies no window (unless the list holds a normalisation: then each is a channel). The
        default ``[file]`` is no choice the job made, and is not warned of."""
        cfg = job.dicom
        if cfg.output != "float16":
            return ()
        default = tuple(parse_window(w, "transform.dicom.windows")
                        for w in job_default("transform.dicom.windows"))
        lists = [("transform.dicom.windows", cfg.windows),
                 *((f"transform.dicom.modality_windows.{name}", windows) for name, windows in cfg.modality_windows)]
        said = []
        for key, windows in lists:
            if windows == default or any(w.normalises for w in windows):
                continue
            named = ", ".join(w.name for w in windows)
            said.append(f"{key} [{named}] {'are' if len(windows) > 1 else 'is'} not applied under "
                        "transform.dicom.output: float16, which packs one channel of each frame's modality values "
                        "(HU for CT) and no window; apply the windows on the GPU from those values (each sample "
                        "records its rescale and photometric interpretation), or set output: uint8 or uint16 to "
                        "pack one channel per window")
        return tuple(said)

    def check_job(self, job: JobConfig, sources: Sequence[SourceConfig]) -> None:
        cfg = job.dicom
        names = [s.name for s in sources]
        for source in sources:
            _check_identity_keywords(source, job.sources.index(source))
        every = [*cfg.windows, *(w for _, windows in cfg.modality_windows for w in windows)]
        if any(w.kind == "zscore" for w in every) and cfg.output != "float16":
            raise ConfigError(f"transform.dicom.output: a z-score is not in [0, 1] and cannot be {cfg.output}; set "
                              "output: float16 (then every window of a frame with a normalisation is a channel), "
                              "or use {percentiles: [0.5, 99.5]} to scale into [0, 1]")
        if cfg.fallback_window is not None and cfg.fallback_window.kind == "zscore":
            raise ConfigError("transform.dicom.fallback_window: a z-score cannot stand in for a file's window (it "
                              "is not in [0, 1]); give a preset, {center, width} or {percentiles: [low, high]}")
        if names and cfg.channels is not None and cfg.output != "float16" and cfg.frames != "stack":
            # a neighbour stack's channels: each of its 2k + 1 slices' windows
            stacked = 2 * cfg.neighbors + 1 if cfg.sample == "neighbors" else 1
            counts = [len(cfg.windows), *(len(windows) for _, windows in cfg.modality_windows)]
            shared = sharing_channels(job, sources, cfg.channels_key)

            def fix(windows: int, where: str) -> str:
                # only the changes that can work: 3 channels is no multiple of a 5-slice stack, and
                # transform.channels: 5 is refused for the RGB photos that share it
                if stacked == 1:
                    return windows_fix(cfg.channels or 1, where)
                return ", or ".join(stack_fixes(cfg.channels or 1, windows, stacked, every_slice=counts,
                                                slice_fix=lambda n: f"list {n} window(s){where}",
                                                sample_key="transform.dicom.sample", key=cfg.channels_key,
                                                shared=shared))

            check_channels(cfg.channels, len(cfg.windows) * stacked, where="transform.dicom.windows", sources=names,
                           fix=fix(len(cfg.windows), ""), key=cfg.channels_key)
            for modality, windows in cfg.modality_windows:
                check_channels(cfg.channels, len(windows) * stacked,
                               where=f"transform.dicom.modality_windows.{modality}",
                               sources=[f"{name} (Modality {modality})" for name in names],
                               fix=fix(len(windows), f" for {modality}"), key=cfg.channels_key)
        if cfg.by_series and not sources:
            made = "a volume" if cfg.sample == "volume" else "neighbour stacks"
            raise ConfigError(f"transform.dicom.sample: {cfg.sample} makes {made} of DICOM series, but this job has "
                              "no DICOM source (an image source packs one sample per image, or per tile); add the "
                              "DICOM source, or remove sample")
        if cfg.by_series and cfg.frames == "stack":
            raise ConfigError("transform.dicom.frames: stack makes one sample of a multi-frame file, but sample: "
                              "{neighbors: k} stacks a slice's neighbours; a multi-frame file's frames are its "
                              "series' slices, so use frames: split")
        if cfg.by_series and any(s.mask is not None and not s.mask.from_dicom for s in sources):
            raise ConfigError("transform.dicom.sample: neighbour stacks and volumes are built from series; mask "
                              "files named by a table column are packed per slice only (sample: slice). Masks "
                              "from the series' own SEG or RTSTRUCT objects (mask: {from: dicom}) follow every "
                              "sample mode")
        if cfg.frames == "stack" and any(s.mask is not None and s.mask.from_dicom for s in sources):
            raise ConfigError("transform.dicom.frames: stack makes one sample of a multi-frame file, but masks "
                              "from: dicom are painted on a series' slices; use frames: split")

    @quiet
    def probe(self, ref: SampleRef, source: SourceConfig, job: JobConfig, *, keep: bool,
              placement: bool, placed: Any = None) -> Probed | Issue | MemberIssue | Excluded:
        """The header probe (:func:`~packer.read.dicom.probe_dicom`). With ``placed`` (the file's
        :class:`~packer.read.dicom_series.HeaderFingerprint`) and ``keep``, a file the header
        pass probed and finds the same is parsed whole without its header checks again
        (:func:`~packer.read.dicom.reread_placed`); its entity, time and label attribute are read
        as the probe reads them.

        An exception nobody foresaw becomes the file's read/``unexpected_error`` (the probe's one
        boundary, as the image and NIfTI probes have): one damaged header must not end the job."""
        try:
            return self._probe(ref, source, job, keep=keep, placement=placement, placed=placed)
        except ConfigError:  # a defect of the run (a where: condition no header can meet), not of the file
            raise
        except Exception as err:  # noqa: BLE001 - the probe's one boundary: one bad header must not end the job
            return Issue.of(ref, stage="read", reason="unexpected_error",
                            message=f"{ref.path}: {type(err).__name__}: {err}")

    def _probe(self, ref: SampleRef, source: SourceConfig, job: JobConfig, *, keep: bool,
               placement: bool, placed: Any = None) -> Probed | Issue | MemberIssue | Excluded:
        from packer.read.dicom import label_value, probe_dicom, reread_placed

        if keep and isinstance(placed, HeaderFingerprint):
            changed = _changed_since(ref, placed)
            if changed:  # its place in its series (and its neighbours' stacks) came from the header read before
                return Issue.of(ref, stage="read", reason="unreadable", message=(
                    f"{ref.path}: the file changed while the build ran ({changed}): its series, and its "
                    "neighbours' stacks, were assembled from the header it had then, so it is not read now; run "
                    "the build again"))
            ds = reread_placed(ref, placed)
            if ds is not None:
                label = label_value(ref, ds, source.target.attribute)
                if isinstance(label, Issue):
                    return label
                timed = record_time(ds, tuple(source.time))
                return Probed(ref=replace(ref, entity=_entity(ref, source, text_value(ds, source.entity)), time=timed),
                              state=ds, attribute=label,
                              time_note=missing_time_note(ds, tuple(source.time)) if timed is None else None)

        header = probe_dicom(ref, entity_keyword=source.entity, time_keywords=source.time, limits=job.limits,
                             allow_burned_in=job.safety.burned_in_annotation == "allow", keep_pixels=keep,
                             label_keyword=source.target.attribute, placement=placement,
                             where=source.header_where, slices=not job.dicom.by_series,
                             annotations=source.mask is not None and source.mask.from_dicom)
        if isinstance(header, MemberIssue):  # its series, keyed as series assembly keys it
            return replace(header, group=(_entity(ref, source, header.group[0]) or "", *header.group[1:]))
        if isinstance(header, (Issue, Excluded)):
            return header
        entity = _entity(ref, source, header.entity)
        if header.annotation is not None:  # a SEG or RTSTRUCT: the mask of the series it references
            return Probed(ref=replace(ref, entity=entity, time=header.time), state=header.annotation)
        # the header-only probe keeps the header itself: what sample_keys counts frames by
        return Probed(ref=replace(ref, entity=entity, time=header.time),
                      state=header.geometry if placement else header.dataset if keep else header,
                      attribute=header.label_value, time_note=header.time_note)

    def sample_keys(self, ref: SampleRef, state: Any, job: JobConfig) -> tuple[str, ...]:
        """As :func:`~packer.read.dicom_render.render_samples` keys them, from the header's
        (0028,0008) Number of Frames: one per frame (``<id>-f0000`` ...) of a multi-frame file
        under ``frames: split``, else the file's id. Files packed as series (``sample:`` other than
        ``slice``) and SEG/RTSTRUCT objects keep the default (one per file)."""
        from packer.read.dicom import DicomHeader

        if not isinstance(state, DicomHeader) or job.dicom.by_series or job.dicom.frames == "stack" \
                or state.frames <= 1:
            return (ref.sample_id,)
        return tuple(frame_key(ref.sample_id, i, state.frames) for i in range(state.frames))

    def sample_instance(self, ref: SampleRef, state: Any, job: JobConfig) -> str:
        """The header's SOP Instance UID digest, as :func:`~packer.read.dicom_render.render_samples`
        gives each sample of the file; ``""`` where files are packed as series (a series job
        checks repeated UIDs itself) or the header has none."""
        from packer.read.dicom import DicomHeader

        return state.instance if isinstance(state, DicomHeader) and not job.dicom.by_series else ""

    @quiet
    def read(self, ref: SampleRef, job: JobConfig, state: Any = None) -> list[Sample] | Issue:
        from packer.read.dicom import read_dicom

        return read_dicom(ref, job.dicom, limits=job.limits,
                          allow_burned_in=job.safety.burned_in_annotation == "allow", dataset=state,
                          entity_keyword=next((s.entity for s in job.sources if s.name == ref.source), None))

    @quiet
    def rehearse_probe(self, ref: SampleRef, handle: RangedFile, limits: LimitsConfig) -> bool:
        from packer.read.dicom import rehearse_header_reads

        return rehearse_header_reads(handle)

    def expected_dtype(self, sample: Sample, job: JobConfig) -> np.dtype:
        """``transform.dicom.output``; colour DICOM comes out as RGB uint8 whatever the precision."""
        image = sample.image
        if job.dicom.unrounded:  # a resampled volume's slice, quantised once the volume is resampled
            return np.dtype(np.float32)
        if image.ndim == 3 and image.shape[0] != 3:
            return np.dtype(_DTYPES[job.dicom.output])
        return np.dtype(np.uint8) if image.dtype == np.uint8 else np.dtype(_DTYPES[job.dicom.output])

    def dtype_rule(self, job: JobConfig) -> str:
        return f"transform.dicom.output is {job.dicom.output}; colour DICOM is always uint8"

    def expected_size(self, job: JobConfig) -> tuple[int, ...] | None:
        return job.dicom.size

    def channels(self, job: JobConfig) -> int | None:
        return job.dicom.channels

    def colour(self, sample: Sample) -> bool:
        return str(sample.metadata.get("photometric_interpretation", "")) not in _GREY

    def channel_advice(self, sample: Sample, job: JobConfig, target: int, key: str) -> list[str]:
        """A colour file's count (3 a frame, or its luma), and ``frames:`` only where the other
        value gives ``target``: a multi-frame file's frames stacked (its channels, frame-major)
        or split (each frame's own). A single-frame file, or a series' slice, gets no frames fix."""
        colour = self.colour(sample)
        advice = [f"a colour file gives 3 channels (R, G, B) a frame, or 1 (its luma) where {key} is 1"
                  ] if colour else []
        frames = sample.metadata.get("number_of_frames")
        if job.dicom.by_series or not isinstance(frames, int) or frames < 2:
            return advice
        natural = int(sample.image.shape[0])
        if job.dicom.frames == "stack" and natural % frames == 0:
            each = natural // frames
            if channel_rule(each, target, color=colour) is not None:
                advice.append(f"frames: stack gives one channel per frame and window ({frames} frames × {each}); "
                              f"use frames: split, which makes each frame a sample of {each}")
        elif job.dicom.frames != "stack" and natural * frames == target:
            advice.append(f"use frames: stack, which makes the file's {frames} frames one sample of "
                          f"{natural * frames} channels (frame-major)")
        return advice

    def attach_masks(self, samples: list[Sample], source: SourceConfig, job: JobConfig) -> list[Sample] | Issue:
        """Mask files named by the table (the 2-D rule); masks from the source's own SEG and
        RTSTRUCT objects are painted per series instead (:meth:`DicomSeries.combine`)."""
        if source.mask is not None and source.mask.from_dicom:
            return samples
        return super().attach_masks(samples, source, job)

    def mask_grid(self, metadata: Mapping[str, Any]) -> tuple[int, int, int]:
        return int(metadata.get("number_of_frames") or 1), int(metadata["rows"]), int(metadata["columns"])

    def place_masks(self, samples: Sequence[Sample], mask: np.ndarray, source: SourceConfig,
                    job: JobConfig) -> list[np.ndarray]:
        """Each sample's mask: its frame's (``frames: stack``: every frame's, stacked) through the
        frame's pixel spacing, the spacing resample and the resize."""
        cfg = job.dicom
        pad = source.mask.pad if source.mask is not None else 0

        def one(frame: int, spacing: list[float] | None) -> np.ndarray:
            return transform_mask_dicom(mask[frame], pixel_spacing=(spacing[0], spacing[1]) if spacing else None,
                                        spacing=cfg.spacing, size=cfg.size, policy=cfg.resize, pad_value=pad)

        if cfg.frames == "stack":
            spacing = samples[0].metadata.get("pixel_spacing")
            return [np.ascontiguousarray(np.concatenate([one(f, spacing) for f in range(mask.shape[0])], axis=0))]
        return [one(int(s.metadata.get("frame", 0)), s.metadata.get("pixel_spacing")) for s in samples]

    def grouping(self, job: JobConfig) -> Grouping | None:
        """Series for neighbour stacks and volumes, and for any job with masks from its SEG and
        RTSTRUCT objects (an annotation paints a whole series, so the series is the unit of work)."""
        return DicomSeries() if job.dicom.by_series or annotated(job) else None


def _without_held(series: Sequence[Series], issues: Sequence[Issue], images: Sequence[tuple[SampleRef, Any]],
                  held: Sequence[MemberIssue]) -> tuple[list[Series], list[Issue]]:
    """``series`` less those a file of ``held`` belongs to (same entity, Study and Series UIDs),
    and ``issues`` (the series rule's records), where every file of such a series is
    ``series_incomplete``, naming the held files and their reasons. That holds whatever the
    series rule said of the rest: without a held middle slice the others show a gap (or, short,
    too few slices), and ``series_gap``'s advice (raise the gap tolerance) cannot help, where
    the held file is the cause. A localizer's record stays its own (it is no slice of the
    series; ``drop_localizers`` leaves it out on purpose)."""
    held = [member for member in held if member.holds]
    if not held:
        return list(series), list(issues)
    missing: dict[tuple[str, ...], dict[str, str]] = {}
    for member in sorted(held, key=lambda m: m.issue.path):  # each held file of a series, by path
        missing.setdefault(member.group, {})[member.issue.path] = member.issue.reason
    geometry = {ref.sample_id: state for ref, state in images}

    def causes_of(ref: SampleRef) -> dict[str, str] | None:
        state = geometry[ref.sample_id]
        return missing.get((ref.entity or "", state.study_uid, state.series_uid))

    kept: list[Series] = []
    refused: list[Issue] = []
    for one in series:
        causes = causes_of(one.refs[0])
        if causes is None:
            kept.append(one)
        else:
            refused.extend(series_incomplete(one.refs, causes))
    by_id = {ref.sample_id: ref for ref, _ in images}
    for issue in issues:
        ref = by_id.get(issue.sample_id)
        geometric = issue.reason.startswith("series_") and issue.reason != "series_localizer"
        causes = causes_of(ref) if ref is not None and geometric else None
        if ref is None or causes is None:
            refused.append(issue)
        else:
            refused.extend(series_incomplete([ref], causes))
    return kept, refused


def _over_max_voxels(stacked: tuple[int, int, int], resampled: tuple[int, int, int], job: JobConfig) -> str:
    """Which size of a series' volume is over ``limits.max_voxels``, and only the fixes that can
    bring it under: the limit holds the series as stacked as well as resampled, so where the
    stacked size is over, no spacing helps (coarser spacing was advised there, and cannot work)."""
    limit = job.limits.max_voxels
    stacked_voxels, resampled_voxels = int(np.prod(stacked)), int(np.prod(resampled))
    if stacked_voxels > limit:
        also = "" if resampled == stacked else f" (resampled, {'×'.join(map(str, resampled))} = {resampled_voxels})"
        return (f"stacks to {'×'.join(map(str, stacked))} = {stacked_voxels} voxels, over limits.max_voxels "
                f"({limit}), which holds a series as stacked, before any resampling{also}; no spacing changes "
                "the stacked size: raise the limit, or pack slices (sample: slice or {neighbors: k})")
    return (f"stacks to {'×'.join(map(str, stacked))} = {stacked_voxels} voxels, under limits.max_voxels ({limit}), "
            f"but resampled to transform.dicom.sample.volume.spacing it is {'×'.join(map(str, resampled))} = "
            f"{resampled_voxels}, over it; resample to a coarser spacing, or raise the limit")


class DicomSeries(Grouping):
    """DICOM files grouped into series (:mod:`packer.read.series`) for ``sample: {neighbors: k}``
    and ``sample: volume``, and in every sample mode for masks from the source's own SEG and
    RTSTRUCT objects (:mod:`packer.read.dicom_masks`: each series with its annotations, an
    :class:`~packer.read.dicom_masks.AnnotatedSeries`): each series is one unit of work."""

    def assemble(self, placed: Sequence[tuple[SampleRef, Any]], job: JobConfig, *,
                 held: Sequence[MemberIssue] = ()
                 ) -> tuple[tuple[Series | AnnotatedSeries, ...], tuple[Issue | Excluded, ...]]:
        """The series, and the files refused on the way (bad series, and with ``sample: volume``
        every file of a series over ``limits.max_voxels``, from headers) or left out (the
        localizers ``series.drop_localizers`` drops: ``not_requested``, as a slice job leaves them
        out, never bad samples). With masks from DICOM, each series comes with the annotations
        that reference it, and the annotations that reference none are refused
        (:func:`~packer.read.dicom_masks.link`). A series one of whose files the header pass
        refused (``held``: a slice over ``limits``, a damaged header) is not packed without it:
        its other files are ``series_incomplete``, as when a slice fails in the pixel pass (slices
        packed one by one, where a series only places its annotations, keep their own records)."""
        groups, records = self._assembled(placed, job, held)
        headers = {ref.sample_id: state for ref, state in placed if isinstance(state, SliceGeometry)}
        return groups, _localizers_left_out(records, job.dicom.series.drop_localizers, headers)

    def _assembled(self, placed: Sequence[tuple[SampleRef, Any]], job: JobConfig, held: Sequence[MemberIssue]
                   ) -> tuple[tuple[Series | AnnotatedSeries, ...], tuple[Issue, ...]]:
        images = [(ref, state) for ref, state in placed if not isinstance(state, AnnotationRefs)]
        notes = [(ref, state) for ref, state in placed if isinstance(state, AnnotationRefs)]
        settings = job.dicom.series
        if not job.dicom.by_series:  # slices packed one by one: a series only places its annotations
            settings = replace(settings, min_slices=1, gap_tolerance=float("inf"))
        assembled = assemble(images, settings)
        whole, refused = (_without_held(assembled.series, assembled.issues, images, held) if job.dicom.by_series
                          else (list(assembled.series), list(assembled.issues)))
        fits = []
        for series in whole:
            if job.dicom.sample == "volume" and series.pixel_spacing is None:
                refused.extend(Issue.of(ref, stage="validate", reason="series_geometry", message=(
                    f"{ref.path}: series {series.uid_key} ({len(series.refs)} files): its slices give no (0028,0030) "
                    "Pixel Spacing, so a volume's affine and spacing would have no mm in-plane; the series is not "
                    "packed (neighbour stacks need no spacing)")) for ref in series.refs)
                continue
            labels = sorted({ref.label or "" for ref in series.refs})
            if job.dicom.sample == "volume" and len(labels) > 1:  # one sample: it would keep one slice's label
                refused.extend(Issue.of(ref, stage="validate", reason="bad_target", message=(
                    f"{ref.path}: series {series.uid_key} ({len(series.refs)} files): its slices carry different "
                    f"labels ({', '.join(repr(label) for label in labels[:4])}{', ...' if len(labels) > 4 else ''}), "
                    "and a volume is one sample with one label; label every file of the series alike, or pack "
                    "slices (sample: slice or {neighbors: k}), which keep each slice's")) for ref in series.refs)
                continue
            shrinks = volume_shrinks(series, job.dicom) if job.dicom.sample == "volume" else None
            if shrinks is not None:
                refused.extend(Issue.of(ref, stage="validate", reason="bad_geometry", message=(
                    f"{ref.path}: series {series.uid_key} ({len(series.refs)} files): {shrinks}"))
                    for ref in series.refs)
                continue
            shape = (len(series.slices), series.rows, series.columns)
            resampled = volume_size(series, job.dicom)
            worst = max(int(np.prod(shape)), int(np.prod(resampled)))
            if job.dicom.sample != "volume" or worst <= job.limits.max_voxels:
                fits.append(series)
                continue
            refused.extend(Issue.of(ref, stage="read", reason="too_large", message=(
                f"{ref.path}: its series ({len(series.refs)} files) {_over_max_voxels(shape, resampled, job)}"))
                for ref in series.refs)
        masks = annotated_sources(job)
        if not masks:
            return tuple(fits), tuple(refused)
        annotated = [s for s in fits if s.refs[0].source in masks]
        plain = [s for s in fits if s.refs[0].source not in masks]
        geometry = {ref.sample_id: state for ref, state in images}
        linked, issues = link(annotated, geometry, notes, refused, masks, held=held)
        return (*plain, *linked), (*refused, *issues)

    def member(self, issue: Issue, ref: SampleRef, placed: Any) -> Issue | MemberIssue:
        """A file with no label, entity or time (its series packs without it): its Issue with its
        Series and SOP Instance UIDs, which an annotation of its series may name."""
        if not isinstance(placed, SliceGeometry):
            return issue
        names = tuple(uid for uid in (placed.series_uid, placed.sop_uid) if uid)
        return MemberIssue(issue=issue, group=(ref.entity or "", placed.study_uid, placed.series_uid), names=names,
                           holds=False) if names else issue

    def file_job(self, job: JobConfig, group: Series | AnnotatedSeries | None = None) -> JobConfig:
        if job.dicom.sample == "volume":  # slices at their own size: the volume is resampled in 3-D
            # from the slices' unrounded values, where it is resampled: rounded once, as a resampled frame is
            series = group.series if isinstance(group, AnnotatedSeries) else group
            unrounded = series is not None and volume_resamples(series, job.dicom)
            return job.with_settings("dicom", replace(job.dicom, size=None, spacing=None, unrounded=unrounded))
        if job.dicom.sample == "neighbors" and job.dicom.channels is not None:
            # a stack's channels are mapped once stacked (:meth:`combine`), not each slice's before
            return job.with_settings("dicom", replace(job.dicom, channels=None))
        return job

    def decoded(self, group: Series | AnnotatedSeries) -> Sequence[SampleRef]:
        return group.series.refs if isinstance(group, AnnotatedSeries) else group.refs

    def placed(self, group: Series | AnnotatedSeries) -> Sequence[HeaderFingerprint | None]:
        """Each image file's fingerprint from the header pass (local files only: a remote file's
        header was read from a copy of its ranges)."""
        series = group.series if isinstance(group, AnnotatedSeries) else group
        prints = series.fingerprints or (None,) * len(series.refs)
        return [None if is_url(ref.path) else fp for ref, fp in zip(series.refs, prints, strict=True)]

    def partial(self, job: JobConfig) -> bool:
        """Slices packed one by one (a series only places its annotations): a slice that cannot be
        read (a constant one, a truncated file) is its own bad sample, the others keep their masks."""
        return not job.dicom.by_series

    @quiet
    def combine(self, group: Series | AnnotatedSeries, per_file: Sequence[list[Sample]], job: JobConfig
                ) -> tuple[list[Sample], tuple[Issue | Excluded, ...]]:
        series = group.series if isinstance(group, AnnotatedSeries) else group
        read = [n for n, (i, _) in enumerate(series.slices) if per_file[i]]  # all, unless partial()
        slices = [per_file[i][frame] for i, frame in (series.slices[n] for n in read)]
        records: tuple[Issue | Excluded, ...] = ()
        labels = None
        if isinstance(group, AnnotatedSeries):
            labels, metadata, records = series_labels(group, len(series.slices), job)
            if labels is None:
                return [], records
            labels = labels[read] if len(read) < len(series.slices) else labels
        blank = _blank_series(series, slices)
        if blank:
            return [], (*records, *blank)
        if labels is not None:
            pad = annotated_sources(job)[series.refs[0].source].pad
            if job.dicom.sample == "volume":
                (volume,) = stack_volume(slices, series, job.dicom)
                irregular = off_grid(series)  # the mask along D from the true slices, as the image
                mask = volume_mask(labels, series.affine(), job.dicom, pad, None if irregular is None else irregular[0])
                return timed_by_latest_slice([with_mask(volume, mask, metadata)], slices, job), records
            slices = slice_masks(slices, labels, job.dicom, pad, metadata)
            if not job.dicom.by_series:
                return slices, records
        if job.dicom.sample == "volume":
            return timed_by_latest_slice(stack_volume(slices, series, job.dicom), slices, job), records
        stacked = timed_by_latest_slice(stack_neighbors(slices, series.steps, job.dicom.neighbors, job.dicom.edge),
                                        slices, job)
        left_out = _edge_left_out(slices, stacked, job.dicom.neighbors, series)
        shaped = with_channels(stacked, job)  # transform.channels counts a stack's channels, as a NIfTI stack's
        if isinstance(shaped, Issue):
            return [], (*records, shaped, *series_incomplete(series.refs, {shaped.path: shaped.reason},
                                                             stage="transform", but={shaped.sample_id}))
        return shaped, (*records, *left_out)

    def headers_only(self, group: Series | AnnotatedSeries, job: JobConfig) -> tuple[Issue | Excluded, ...]:
        """A series' annotations, linked from their headers (``--quick`` does not paint them), or
        the records that refuse the series where those headers already do (an annotation none of
        whose structures the map names: :func:`~packer.read.dicom_masks.header_refusal`)."""
        if not isinstance(group, AnnotatedSeries):
            return ()
        refused = header_refusal(group, annotated_sources(job)[group.series.refs[0].source])
        if refused:
            return tuple(refused)
        classes = group.sop_classes or ("",) * len(group.annotations)
        return tuple(Excluded.of(ref, stage="read", why="annotation", modality=modality, sop_class=sop_class, detail=(
            f"{modality}: linked to a series of {len(group.places)} slices from its header (validate --quick "
            "does not paint it)")) for (ref, modality), sop_class in zip(group.annotations, classes, strict=True))

    def counted(self, group: Series | AnnotatedSeries, job: JobConfig) -> list[tuple[SampleRef, str]]:
        """One sample per series for a volume, one per slice for neighbour stacks (none for a slice
        without its neighbours under ``edge: skip``) and for slices, keyed as :meth:`combine` keys them."""
        series = group.series if isinstance(group, AnnotatedSeries) else group
        if isinstance(group, AnnotatedSeries) and header_refusal(group, annotated_sources(job)[series.refs[0].source]):
            return []  # refused from its annotations' headers: :meth:`headers_only` gives its records
        if job.dicom.sample == "volume":
            return [(series.refs[0], series.refs[0].sample_id)]
        k, count = job.dicom.neighbors, len(series.slices)
        skip = job.dicom.by_series and job.dicom.edge == "skip"
        keys = _slice_keys(series)
        return [(series.refs[index], keys[i]) for i, (index, _) in enumerate(series.slices)
                if not skip or k <= i < count - k]

    def spans(self, group: Series | AnnotatedSeries, job: JobConfig) -> list[SampleSpan]:
        """A volume holds every file of its series and stands for them all (``whole``); a neighbour
        stack holds its centre's file and its ``k`` neighbours' on each side (fewer at an end, whose
        repeated end slice is a file it already holds); a slice, its own file."""
        series = group.series if isinstance(group, AnnotatedSeries) else group
        counted = self.counted(group, job)
        if job.dicom.sample == "volume":
            return [SampleSpan(key=key, files=tuple(series.refs), whole=True) for _, key in counted]
        k = job.dicom.neighbors if job.dicom.by_series else 0
        position = {key: i for i, key in enumerate(_slice_keys(series))}  # keyed as :meth:`counted` keys them
        out = []
        for ref, key in counted:
            i = position[key]
            near = [series.refs[index] for index, _ in series.slices[max(i - k, 0):i + k + 1]]
            out.append(SampleSpan(key=key, files=(ref, *dict.fromkeys(r for r in near if r is not ref))))
        return out


def _localizers_left_out(records: Sequence[Issue], drop: bool, headers: Mapping[str, SliceGeometry]
                         ) -> tuple[Issue | Excluded, ...]:
    """The localizers and derived images ``series.drop_localizers`` leaves out of their series
    (and the scout series, of localizers only) as ``not_requested`` records: left out on purpose,
    as a slice job leaves localizers out, not bad samples. A default series job of a CT export,
    which nearly always holds scouts, failed its bad fraction on them. With the option off a
    localizer refuses its series: ``series_localizer`` stays a bad sample. Each record carries
    the Modality and SOP class its header (``headers``, by sample id) gives, as a slice job's
    record of the same file does, so the manifest counts it by both."""
    if not drop:
        return tuple(records)
    out: list[Issue | Excluded] = []
    for record in records:
        if record.reason != "series_localizer":
            out.append(record)
            continue
        said = record.message.removeprefix(f"{record.path}: ")
        fix = ("a scout, not a slice of the stack: to pack localizers, pack them in a job with sample: slice and "
               "where: {ImageType: LOCALIZER}") if "LOCALIZER" in said else (
            "a derived image (a reformat, a projection), not an original slice of the stack: to pack derived "
            "images, give the source where: {ImageType: DERIVED} (or a value of Image Type only they have): a volume "
            "or neighbour job then stacks them as a series of their own (a lone one under series.min_slices: 1)")
        header = headers.get(record.sample_id)
        out.append(Excluded(sample_id=record.sample_id, path=record.path, stage="validate", why="not_requested",
                            detail=f"{said}; {fix}", modality=header.modality if header else "",
                            sop_class=header.sop_class if header else ""))
    return tuple(out)


def _edge_left_out(slices: Sequence[Sample], stacked: Sequence[Sample], k: int, series: Series
                   ) -> tuple[Excluded, ...]:
    """Under ``edge: skip``, one ``not_requested`` record per file none of whose slices is the
    centre of a stack (an end slice without ``k`` neighbours on each side, or every slice of a
    series shorter than ``2k + 1``): such a file made no sample of its own, and every file is
    counted once, packed, bad or left out (a short series' patient vanished without a word).
    Each record carries its file's Modality and SOP class (:attr:`Series.objects`)."""
    if len(stacked) == len(slices):
        return ()
    objects = dict(zip((ref.sample_id for ref in series.refs), series.objects, strict=True)) if series.objects else {}
    centres = {sample.ref.sample_id for sample in stacked}
    out: dict[str, Excluded] = {}
    for index, sample in enumerate(slices):
        ref = sample.ref
        if ref.sample_id in centres or ref.sample_id in out:
            continue
        why = (f"its series has {len(slices)} slices, fewer than the {2 * k + 1} a stack of neighbors: {k} needs, so "
               "with edge: skip no slice of it makes a sample" if not stacked else
               f"slice {index + 1} of {len(slices)} of its series, without {k} neighbour(s) on each side: edge: skip "
               "makes no sample of it (its pixels are channels of its neighbours' stacks)")
        modality, sop_class = objects.get(ref.sample_id, ("", ""))
        out[ref.sample_id] = Excluded.of(ref, stage="transform", why="not_requested",
                                         detail=f"{why}; edge: replicate packs it, repeating the end slice",
                                         modality=modality, sop_class=sop_class)
    return tuple(out.values())


def timed_by_latest_slice(stacked: list[Sample], slices: Sequence[Sample], job: JobConfig) -> list[Sample]:
    """``stacked`` (a series' neighbour stacks or its volume, made of ``slices``), each timed by
    its latest slice where a time split leaves out what falls past its entity's cutoff
    (``entity_policy: drop_straddlers``): a stack's pixels hold its neighbours', so one whose
    neighbour falls in a later split is left out with that neighbour, and never packs it into the
    earlier split. Elsewhere (``first_seen`` keeps every record in its group's split) a sample
    keeps its centre's (a volume: its first slice's) time. The split itself times every such
    sample by its latest slice from the header pass, under either policy and in ``validate
    --quick`` (:meth:`DicomSeries.spans`, :class:`packer.pipeline.split.HeldFiles`): this only
    makes the packed record's time say what the split compared."""
    if job.split.by != "time" or job.split.entity_policy != "drop_straddlers":
        return stacked
    out = []
    for sample in stacked:
        about = sample.metadata.get("neighbors")
        members = (slices[max(int(about["slice"]) - int(about["k"]), 0):int(about["slice"]) + int(about["k"]) + 1]
                   if isinstance(about, dict) else slices)
        times = [s.ref.time for s in members if s.ref.time is not None]
        latest = max(times) if times else None  # ISO text: it orders as the split compares it
        out.append(replace(sample, ref=replace(sample.ref, time=latest))
                   if latest is not None and sample.ref.time is not None and latest > sample.ref.time else sample)
    return out


def _slice_keys(series: Series) -> list[str]:
    """Each slice's sample key, as the reader keys it (:func:`packer.read.dicom_render.render_samples`):
    a one-frame file's own id, a frame's key padded to its file's frames (the last of them in the
    series: a file's slices are its frames)."""
    frames = Counter(index for index, _ in series.slices)
    last: dict[int, int] = {}
    for index, frame in series.slices:
        last[index] = max(last.get(index, 0), frame)
    return [series.refs[index].sample_id if frames[index] == 1
            else frame_key(series.refs[index].sample_id, frame, last[index] + 1)
            for index, frame in series.slices]


def _blank_series(series: Series, slices: Sequence[Sample]) -> tuple[Issue, ...]:
    """``constant_image`` for every file of a series whose every slice is constant (each packed
    alone as context, :func:`packer.read.dicom_render.render_samples`): context of nothing."""
    if not slices or not all(is_constant_slice(s) for s in slices):
        return ()
    return tuple(Issue.of(ref, stage="validate", reason="constant_image", message=(
        f"{ref.path}: every one of the {len(slices)} slices of its series has a single value; the series carries "
        "no information, remove it")) for ref in series.refs)


register(DicomKind())


def _changed_since(ref: SampleRef, placed: HeaderFingerprint) -> str:
    """How the file at ``ref`` differs from what the header pass stat'ed (its size or its mtime),
    or ``""`` where it does not (or is gone: the probe says that as it says it for any file)."""
    try:
        info = os.stat(ref.path)
    except OSError:
        return ""
    if info.st_size != placed.size:
        return f"{placed.size:,} bytes at the header pass, {info.st_size:,} now"
    if info.st_mtime_ns != placed.mtime_ns:
        return "modified after the header pass"
    return ""
