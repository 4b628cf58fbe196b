"""Probe: read one raw file's header on a worker and complete its ref, or say why the file is bad.

Discovery (:mod:`packer.pipeline.discover`, on the client) lists files and attaches what the
label tables say; the probe runs inside the pixel pass's tasks and adds what only the file
knows (a DICOM file's entity and time), after the identity checks every sample must pass.
It never decodes pixels: ``packer validate --quick`` is this pass alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from packer.config import JobConfig
from packer.pipeline.labels import Refused, from_attribute
from packer.read.dicom_series import SliceGeometry
from packer.records import Issue, SampleRef


def check_identity(ref: SampleRef, *, needs_time: bool) -> Issue | None:
    """The discover-stage checks every sample must pass: a label, an entity, and a time if split by time."""
    if ref.label is None:
        return Issue.of(ref, stage="discover", reason="missing_label",
                        message=f"{ref.path}: no label; add a row for {ref.relpath!r} to the source's label table "
                                "(or, for unlabeled data, set the source's 'label: none')")
    if ref.entity is None:
        return Issue.of(ref, stage="discover", reason="missing_entity",
                        message=f"{ref.path}: no entity id; the source's entity field is empty for this file")
    if needs_time and ref.time is None:
        return Issue.of(ref, stage="discover", reason="missing_time",
                        message=f"{ref.path}: no readable time, but the job splits by time; "
                                "give an ISO date (YYYY-MM-DD) for this file")
    return None


def probe_ref(ref: SampleRef, job: JobConfig) -> SampleRef | Issue:
    """Read one file's header (never its pixels) and complete the ref, or say why it is bad.

    DICOM entity and time come from the header; images got theirs from the table. The
    header read catches unreadable, non-DICOM and pixel-less files before any decoding.
    """
    probed = _probe(ref, job, keep_pixels=False)
    return probed if isinstance(probed, Issue) else probed[0]


def probe_series(ref: SampleRef, job: JobConfig) -> tuple[SampleRef, SliceGeometry] | Issue:
    """:func:`probe_ref` of a DICOM file, plus its place in a series (UIDs, positions,
    orientation, grid) for :func:`packer.pipeline.series.assemble`. Header only."""
    probed = _probe(ref, job, keep_pixels=False, geometry=True)
    if isinstance(probed, Issue):
        return probed
    return probed[0], probed[1]


def probe_for_read(ref: SampleRef, job: JobConfig) -> tuple[SampleRef, Any] | Issue:
    """:func:`probe_ref` for the pixel pass: the same outcome, plus what the read can reuse.

    A DICOM file is parsed whole, once; the parsed dataset comes back (pass it to
    ``read_sample(dataset=...)``), so the header is not parsed a second time. ``None`` in its
    place for images, and for a DICOM file that only a header-only read could parse.
    """
    return _probe(ref, job, keep_pixels=True)


def _probe(ref: SampleRef, job: JobConfig, *, keep_pixels: bool, geometry: bool = False
           ) -> tuple[SampleRef, Any] | Issue:
    """The probed ref and, for a DICOM file, its parsed dataset (``keep_pixels``) or, with
    ``geometry``, its :class:`SliceGeometry` instead; or the file's Issue."""
    from packer.read.dicom import probe_dicom
    from packer.read.image import probe_image

    source = next(s for s in job.sources if s.name == ref.source)
    extra: Any = None
    if ref.kind == "dicom":
        header = probe_dicom(ref, entity_keyword=source.entity, time_keywords=source.time, limits=job.limits,
                             allow_burned_in=job.safety.burned_in_annotation == "allow", keep_pixels=keep_pixels,
                             label_keyword=source.target.attribute, placement=geometry)
        if isinstance(header, Issue):
            return header
        ref = replace(ref, entity=header.entity, time=header.time)
        if source.target.origin == "attribute":
            label = from_attribute(source.target, header.label_value, ref.path, job.labels)
            if isinstance(label, Refused):
                return Issue.of(ref, stage="discover", reason=label.reason, message=label.message)
            ref = replace(ref, label=label)
        extra = header.geometry if geometry else header.dataset
    else:
        image_header = probe_image(ref, limits=job.limits)
        if isinstance(image_header, Issue):
            return image_header
    problem = check_identity(ref, needs_time=job.split.by == "time")
    return problem if problem is not None else (ref, extra)
