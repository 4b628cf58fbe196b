"""Probe: read one raw file's header on a worker and complete its ref, or say why the file is bad.

Discovery (:mod:`packer.pipeline.discover`, on the client) lists files and attaches what the
label tables say; the probe runs inside the pixel pass's tasks and adds what only the file
knows (a DICOM file's entity and time, through its kind: :mod:`packer.read.kinds`), then runs
the identity checks every sample must pass.
It never decodes pixels: ``packer validate --quick`` is this pass alone.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from typing import Any

from packer.config import JobConfig, PathField
from packer.pipeline.labels import Refused, from_attribute
from packer.read.annotations import AnnotationRefs
from packer.read.kinds import source_kind
from packer.records import Excluded, Issue, MemberIssue, SampleRef
from packer.storage import is_url


def check_identity(ref: SampleRef, *, needs_time: bool, header: tuple[str, tuple[str, ...]] | None = None,
                   entity_path: str | None = None, time_path: PathField | None = None,
                   time_note: str | None = None) -> Issue | None:
    """The discover-stage checks every sample must pass: a label, an entity, and a time if split by time.

    ``header``: (entity keyword, time keywords) where the kind reads them from each file's header
    (DICOM), so that a record names the attributes to look at, not a table cell; ``entity_path``:
    the source's path pattern where its entity comes from the file's path instead; ``time_path``:
    the source's path field where its time comes from the file's path (its record says which part
    of the path it read: a folder, the file name, a pattern's match); ``time_note``: why the
    header gave no time, where the kind says (:attr:`~packer.read.kinds.Probed.time_note`: the
    values it could not read, and the attributes the file fills)."""
    if ref.label is None:
        return Issue.of(ref, stage="discover", reason="missing_label",
                        message=f"{ref.path}: no label; add a row for {ref.relpath!r} to the source's label table "
                                "(or, for unlabeled data, set the source's 'label: none')")
    if ref.entity is None and entity_path is not None:
        return Issue.of(ref, stage="discover", reason="missing_entity",
                        message=f"{ref.path}: no entity id; its path {ref.relpath!r} does not match the source's "
                                f"entity: {entity_path}; fix the pattern, or move the file where it matches")
    if ref.entity is None:
        field = f"header's {header[0]} (the source's entity:) is" if header else "source's entity field is"
        fix = (f"fill {header[0]} in the file, or set the source's entity: to another attribute this file fills"
               if header else
               "give this file an entity in the source's table (its entity column), or fix the row's path")
        return Issue.of(ref, stage="discover", reason="missing_entity",
                        message=f"{ref.path}: no entity id; the {field} empty for this file; {fix}")
    if needs_time and ref.time is None and time_path is not None:
        read, fix = _time_part(time_path, ref.relpath)
        return Issue.of(ref, stage="discover", reason="missing_time",
                        message=f"{ref.path}: no readable time, but the job splits by time; the part of its path "
                                f"{ref.relpath!r} that the source's time: {_spelled(time_path)} reads, {read}, is not "
                                "ISO 8601 (2024-03-05 or 2024-03-05T14:30; 2024_07_01 or 05/03/2024 are not read): "
                                f"{fix}")
    if needs_time and ref.time is None and header:
        keywords = ", ".join(header[1])
        note = time_note or (f"its header's {keywords} (the source's time:) hold no valid DICOM date (DA YYYYMMDD, "
                             "or a DT to at least the day): set the source's time: to attributes this file fills")
        return Issue.of(ref, stage="discover", reason="missing_time",
                        message=f"{ref.path}: no readable time, but the job splits by time; {note}")
    if needs_time and ref.time is None:
        return Issue.of(ref, stage="discover", reason="missing_time",
                        message=f"{ref.path}: no readable time, but the job splits by time; its time cell is "
                                "empty or not ISO 8601 (2024-03-05 or 2024-03-05T14:30; a day/month order such as "
                                "05/03/2024 is ambiguous and not read): give an ISO date for this file")
    return None


def _time_part(field: PathField, relpath: str) -> tuple[str, str]:
    """What a path field gave a file that no time reads (its folder, its file name without its
    suffixes, a pattern's match, or none), and how to give it one."""
    part = field.part(relpath)
    if field.component is None:
        read = "no match" if part is None else f"its match {part!r}"
        return read, "fix the pattern, or name the file or folder with an ISO date"
    other = "or set time: to the component or path pattern that holds one"
    if part is None:
        return f"its component {field.component}, which the path does not have", f"move the file, {other}"
    if field.reads_file_name(relpath):
        stem = field.value(relpath)
        read = f"its file name {part!r}" + (f" read without its suffixes as {stem!r}" if stem != part else "")
        return read, f"name the file with an ISO date, as 2024-03-05.png, {other}"
    return f"its folder {part!r}", f"name the folder with an ISO date, {other}"


def _spelled(field: PathField) -> str:
    """A source's path field as the job writes it: ``{component: 0}``, ``{path: '...'}``."""
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in field.to_json().items()) + "}"


def _not_a_file(ref: SampleRef) -> Issue | None:
    """``unreadable`` for a local path that is a named pipe, socket or device rather than a file
    (a FIFO named ``scan.png``): opening one to read its header would wait for a writer forever
    and hang the build. Anything ``os.stat`` fails on is left to the kind's probe to name."""
    if is_url(ref.path):
        return None
    try:
        mode = os.stat(ref.path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    what, why = (("a named pipe (FIFO)", "reading would wait for a writer") if stat.S_ISFIFO(mode) else
                 ("a socket", "it holds no file's bytes") if stat.S_ISSOCK(mode) else
                 ("a device", "reading it would stream whatever the device gives, maybe without end"))
    return Issue.of(ref, stage="read", reason="unreadable",
                    message=f"{ref.path}: is {what}, not a regular file; nothing was read from it ({why}). "
                            "Replace it with the file, or remove it")


def probe_ref(ref: SampleRef, job: JobConfig) -> SampleRef | Issue | Excluded:
    """Read one file's header (never its pixels) and complete the ref, or say why it is bad, or
    (:class:`~packer.records.Excluded`) why it is left out on purpose.

    Where the kind reads entity and time from headers (DICOM), they come from there; others got
    theirs from the table. The header read catches unreadable, foreign and pixel-less files
    before any decoding.
    """
    probed = _alone(_probe(ref, job, keep=False))
    return probed if isinstance(probed, (Issue, Excluded)) else probed[0]


@dataclass(frozen=True)
class ProbedKeys:
    """What ``validate --quick`` learns of one file from its header: the probed ``ref``, the
    ``keys`` of the samples it would make, the ``instance`` id they would carry and the
    reader's warnings its header tells (``notes``)."""

    ref: SampleRef
    keys: tuple[str, ...]
    instance: str = ""
    notes: tuple[str, ...] = ()


def probe_keys(ref: SampleRef, job: JobConfig) -> ProbedKeys | Issue | Excluded:
    """:func:`probe_ref`, plus what its header tells of the samples the file would make: their keys
    (a NIfTI file's slices; :meth:`packer.read.kinds.SourceKind.sample_keys`), the instance id they
    would carry (:meth:`~packer.read.kinds.SourceKind.sample_instance`) and the reader's warnings
    (:meth:`~packer.read.kinds.SourceKind.header_notes`)."""
    probed = _alone(_probe(ref, job, keep=False))
    if isinstance(probed, (Issue, Excluded)):
        return probed
    kind, found, state = source_kind(ref.kind), probed[0], probed[1]
    return ProbedKeys(ref=found, keys=kind.sample_keys(found, state, job),
                      instance=kind.sample_instance(found, state, job), notes=kind.header_notes(found, state, job))


def probe_placement(ref: SampleRef, job: JobConfig) -> tuple[SampleRef, Any] | Issue | MemberIssue | Excluded:
    """:func:`probe_ref`, plus what the file's kind groups it by (a DICOM file's place in a
    series: UIDs, positions, orientation, grid; :meth:`packer.read.kinds.Grouping.assemble`).
    Header only. A file its header check refuses may come as a :class:`MemberIssue`: its Issue
    with the group its header names, which is not packed without it."""
    return _probe(ref, job, keep=False, placement=True)


def probe_for_read(ref: SampleRef, job: JobConfig, placed: Any = None) -> tuple[SampleRef, Any] | Issue | Excluded:
    """:func:`probe_ref` for the pixel pass: the same outcome, plus what the read can reuse.

    A DICOM file is parsed whole, once; the parsed dataset comes back (pass it to
    ``read_sample(state=...)``), so the header is not parsed a second time. ``None`` in its
    place where the kind keeps nothing, and for a DICOM file that only a header-only read could parse.
    ``placed``: what this file's placement probe left (:meth:`packer.read.kinds.Grouping.placed`):
    a DICOM file found unchanged since is not checked twice.
    """
    return _alone(_probe(ref, job, keep=True, placed=placed))


def _alone(probed: tuple[SampleRef, Any] | Issue | MemberIssue | Excluded) -> tuple[SampleRef, Any] | Issue | Excluded:
    """A probe's outcome for a file read on its own (a :class:`MemberIssue` only where the
    placement probe asks for the group: its Issue)."""
    return probed.issue if isinstance(probed, MemberIssue) else probed


def _probe(ref: SampleRef, job: JobConfig, *, keep: bool, placement: bool = False,
           placed: Any = None) -> tuple[SampleRef, Any] | Issue | MemberIssue | Excluded:
    """The probed ref and what its kind kept (:class:`~packer.read.kinds.Probed`), or the file's
    Issue, or its Excluded record (before any identity check: a file left out needs no label)."""
    special = _not_a_file(ref)
    if special is not None:
        return special
    source = next(s for s in job.sources if s.name == ref.source)
    # ``placed`` only where there is one: a kind whose grouping leaves nothing need not take it
    extra = {"placed": placed} if placed is not None else {}
    probed = source_kind(ref.kind).probe(ref, source, job, keep=keep, placement=placement, **extra)
    if isinstance(probed, (Issue, MemberIssue, Excluded)):
        return probed
    ref = probed.ref
    if isinstance(probed.state, AnnotationRefs):  # a mask of a series, not a sample: no label, no identity
        return ref, probed.state
    grouping = source_kind(ref.kind).grouping(job) if placement else None
    if source.target.origin == "attribute":
        label = from_attribute(source.target, probed.attribute, ref.path, job.labels)
        if isinstance(label, Refused):
            refused = Issue.of(ref, stage="discover", reason=label.reason, message=label.message)
            return refused if grouping is None else grouping.member(refused, ref, probed.state)
        ref = replace(ref, label=label)
    header = (source.entity, source.time) if source_kind(ref.kind).identity_in_header else None
    path, timed = source.entity_path, source.time_path
    problem = check_identity(ref, needs_time=job.split.by == "time", header=header,
                             entity_path=_spelled(path) if path is not None and header is not None else None,
                             time_path=timed, time_note=probed.time_note)
    if problem is None:
        return ref, probed.state
    # the placement probe's: with what names the file's group (its series), where its kind can say
    return problem if grouping is None else grouping.member(problem, ref, probed.state)
