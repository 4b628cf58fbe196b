"""Masks from a DICOM source's own SEG and RTSTRUCT objects: linked to their series, painted, and given to each sample.

Used when a DICOM source says ``mask: {from: dicom, ...}``. The series is then the unit of work
in every sample mode (:meth:`packer.read.dicom_kind.DicomKind.grouping`), because an annotation
paints a whole series:

1. **Link** (client, from headers only, before any pixel is decoded; :func:`link`). Each
   annotation object (:class:`~packer.read.annotations.AnnotationRefs`) goes to the series it
   references: by Referenced Series Instance UID, else by the SOP instances it references, else
   by its Frame of Reference when exactly one series of the source lies in it. One that
   references no series of the source, or only a series that was refused, is an
   ``annotation_orphan`` bad sample. A series that no annotation references follows
   ``mask.empty``: all-zero masks (``keep``) or ``mask_missing`` for each of its files (``bad``),
   unless an annotation whose header cannot say what it was drawn on (an orphan naming no series
   and no instance, or no Study Instance UID; one whose references cannot be decoded, an
   ``unreadable`` record) may be its own (of its study, its entity, or the annotation's own folder or
   the one above it): then each of its files is ``mask_missing``, whatever ``empty`` says
   (:func:`_lost_for`); where every series it may belong to is annotated already, it may be a
   second annotation of any of them (a SEG beside an RTSTRUCT), and they are held back alike.
   A file that does not parse but whose bytes show an annotation
   (:mod:`packer.read.annotation_salvage`) keeps its record and holds back the series its
   salvaged header names, or is lost as above; one whose bytes say nothing names in its record
   the series it may annotate (:func:`possible_annotations_warning`).
2. **Paint** (worker; :func:`paint_series`). Every annotation of the series paints one label
   map on the series' slices at their native grid (:class:`~packer.read.annotations.Painter`:
   SEG through :mod:`packer.read.seg`, RTSTRUCT through :mod:`packer.read.rtstruct`). An
   annotation's defect (:class:`~packer.read.annotations.AnnotationError`) is its bad-sample
   record, and every file of the series gets the same reason: its mask cannot be right without
   that annotation, so no slice of it is packed with a partial mask.
3. **Place** (:func:`slice_masks`, :func:`volume_mask`). Each slice's label map follows the
   slice's own geometry exactly as a mask file does (pixel spacing resample, resize, fit
   padding; nearest neighbour), a neighbour stack keeps its centre slice's, and a volume's is
   stacked, made canonical, resampled by nearest neighbour and cropped or padded with the image.

A used annotation is an Excluded record (``why: annotation``): counted, never a sample, never bad.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from packer.config import DicomTransformConfig, JobConfig, MaskConfig
from packer.exclusions import EXCLUDED_FILE, UNMAPPED_SAID
from packer.read.annotations import (
    AnnotationError,
    AnnotationRefs,
    Declared,
    Drawn,
    Painter,
    SlicePlace,
    uid_digest,
    unmapped_error,
)
from packer.read.dicom_series import SliceGeometry
from packer.read.series import Series
from packer.records import Excluded, Issue, MemberIssue, Sample, SampleRef
from packer.transform.mask import transform_mask_dicom
from packer.transform.volume import (
    Volume,
    canonical,
    canonical_order,
    crop_or_pad,
    depth_grid,
    depth_resample,
    held_depth,
    resample_nearest,
)

#: How a refused series' records name it (:func:`packer.read.series.assemble`: a digest of entity,
#: study and series, which an annotation's UID digest cannot be matched to)
_SERIES_NAME = re.compile(r"\bseries ([0-9a-f]{16})\b")


def annotated_sources(job: JobConfig) -> dict[str, MaskConfig]:
    """The DICOM sources of ``job`` whose masks come from their SEG and RTSTRUCT objects, by name."""
    return {s.name: s.mask for s in job.sources if s.mask is not None and s.mask.from_dicom}


def annotated(job: JobConfig) -> bool:
    """Whether some DICOM source of ``job`` reads its masks from its SEG and RTSTRUCT objects."""
    return bool(annotated_sources(job))


@dataclass(frozen=True)
class AnnotatedSeries:
    """A series with the annotation objects that paint its masks: ``series`` (its image files and
    slice order), ``places`` (each slice on its native grid, in that order), ``annotations``
    (each object's ref and modality; none: the series gets all-zero masks). ``refs``: every
    file of the unit of work, the images then the annotations (the cache key covers both)."""

    series: Series
    places: tuple[SlicePlace, ...]
    annotations: tuple[tuple[SampleRef, str], ...] = ()
    refs: tuple[SampleRef, ...] = field(default=())
    #: the series' Frame of Reference UID ("" where its files name none)
    frame_of_reference: str = ""
    #: the SOP Instance UIDs of the series' other stacks (its other acquisitions, where it is
    #: stacked per Acquisition Number): an annotation of the whole series paints their slices
    #: there, and its frames that reference only those are not this stack's
    elsewhere: frozenset[str] = frozenset()
    #: each annotation's declared structures as its header gave them (None: not read), in the
    #: order of ``annotations``; what ``validate --quick`` checks (:func:`header_refusal`)
    declared: tuple[Declared | None, ...] = ()
    #: each annotation's SOP class as its header names it (:attr:`AnnotationRefs.sop_class`), in
    #: the order of ``annotations``; what ``validate --quick`` lists it with
    sop_classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.refs:
            object.__setattr__(self, "refs", (*self.series.refs, *(ref for ref, _ in self.annotations)))


@dataclass
class _Found:
    """What linking knows of one assembled series: its UIDs and instances, from its files' headers."""

    series: Series
    series_uid: str
    frame_of_reference: str
    places: tuple[SlicePlace, ...] | None
    annotations: list[tuple[SampleRef, str]] = field(default_factory=list)
    #: each annotation's declared structures, by sample id
    declared: dict[str, Declared | None] = field(default_factory=dict)
    #: each annotation's SOP class as its header names it, by sample id
    sop_classes: dict[str, str] = field(default_factory=dict)
    #: damaged annotations whose salvaged header names this series (each has its own record)
    damaged: list[tuple[SampleRef, AnnotationRefs]] = field(default_factory=list)


def _places(series: Series, geometry: Mapping[str, SliceGeometry]) -> tuple[SlicePlace, ...] | None:
    """Each slice of ``series`` on its grid, in series order; None when the series has no pixel
    spacing (an annotation in millimetres cannot be placed on it)."""
    if series.pixel_spacing is None:
        return None
    out = []
    for index, frame in series.slices:
        ref = series.refs[index]
        g = geometry[ref.sample_id]
        position = g.positions[frame]
        if position is None or g.orientation is None or g.spacing is None:
            return None
        out.append(SlicePlace(sop_uid=g.sop_uid, frame=frame, position=position, orientation=g.orientation,
                              spacing=g.spacing, rows=g.rows, columns=g.columns))
    return tuple(out)


def _orphan(ref: SampleRef, refs: AnnotationRefs, why: str,
            fix: str = "Put the series it was drawn on under the source's root (or remove the annotation)") -> Issue:
    return Issue.of(ref, stage="validate", reason="annotation_orphan", message=(
        f"{ref.path}: a {refs.modality} that {why}; it paints no mask. {fix}"))


def _lost_for(f: _Found, geometry: Mapping[str, SliceGeometry],
              lost: Sequence[tuple[SampleRef, AnnotationRefs]]) -> list[tuple[SampleRef, AnnotationRefs, str]]:
    """The annotations of ``lost`` (whose headers name no series and no instance: cut short, or
    damaged, or naming only a frame of reference that several series share) that may be the
    unannotated series ``f``'s, each with what ties them: of its source, in ``f``'s frame of
    reference where the annotation names any, and of its study where the annotation's header
    still names one, else of its entity where it names one, else lying in the annotation's own
    folder (``P1/seg.dcm`` beside ``P1/ct1.dcm``) or the folder above it (``P1/SEG/seg.dcm``
    beside ``P1/CT/...``; never the source's root)."""
    first = f.series.refs[0]
    study = geometry[first.sample_id].study_uid
    out = []
    for ref, refs in lost:
        if ref.source != first.source:
            continue
        if refs.frames_of_reference and f.frame_of_reference not in (*refs.frames_of_reference, ""):
            continue  # it lies in another frame of reference: drawn on some other series, never this one
        if refs.study_uid:
            tie = "its study" if refs.study_uid == study else ""
        elif ref.entity is not None:
            tie = f"its entity {ref.entity}" if ref.entity == first.entity else ""
        else:  # its own folder (an export of one folder a patient), else the one above (P1/SEG/ beside P1/CT/)
            parts = ref.relpath.split("/")
            folders = [folder for folder in ("/".join(parts[:-1]), "/".join(parts[:-2])) if folder]
            above = next((folder for folder in folders if first.relpath.startswith(folder + "/")), "")
            tie = f"the folder {above}/ of its files" if above else ""
        if tie:
            out.append((ref, refs, tie))
    return out


def link(series: Sequence[Series], geometry: Mapping[str, SliceGeometry],
         annotations: Sequence[tuple[SampleRef, AnnotationRefs]], refused: Sequence[Issue],
         masks: Mapping[str, MaskConfig], *, held: Sequence[MemberIssue] = ()
         ) -> tuple[list[AnnotatedSeries], list[Issue]]:
    """Each assembled series with the annotations that reference it (see the module docstring,
    step 1), and the records of annotations that reference none, of series without annotation
    under ``empty: bad``, and of series whose slices cannot be placed. ``geometry``: each image
    file's header facts by sample id; ``refused``: the files series assembly refused (an
    annotation of such a series is an orphan that says so); ``masks``: the annotated sources'
    mask settings, by source name; ``held``: the files the header pass refused (before
    assembly: no label, entity or time, a header check), by the UIDs their headers name
    (:attr:`~packer.records.MemberIssue.names`): an annotation of a series none of whose files
    were placed gets their reason as it gets an assembly refusal's."""
    found: list[_Found] = []
    # each series by (source, Series Instance UID), by (source, SOP Instance UID) of its files and by
    # (source, Frame of Reference UID): one lookup an annotation, however many series the source holds
    by_series: dict[tuple[str, str], list[_Found]] = {}
    by_instance: dict[tuple[str, str], list[_Found]] = {}
    by_frame: dict[tuple[str, str], list[_Found]] = {}
    for s in series:
        first = geometry[s.refs[0].sample_id]
        f = _Found(series=s, series_uid=first.series_uid, frame_of_reference=first.frame_of_reference,
                   places=_places(s, geometry))
        found.append(f)
        source = s.refs[0].source
        by_series.setdefault((source, f.series_uid), []).append(f)
        for uid in dict.fromkeys(geometry[r.sample_id].sop_uid for r in s.refs):
            by_instance.setdefault((source, uid), []).append(f)
        if f.frame_of_reference:
            by_frame.setdefault((source, f.frame_of_reference), []).append(f)
    # the files series assembly refused, by the Series and SOP Instance UIDs an annotation may name:
    # an annotation of a refused series says which refusal, and a file of it (the series' records
    # name it by another digest, of entity, study and series, that the user cannot match to this one)
    refused_by: dict[str, Issue] = {}  # UIDs are unique across sources: no source in the key
    for issue in refused:
        g = geometry.get(issue.sample_id)
        if g is not None:
            refused_by.setdefault(g.series_uid, issue)
            refused_by.setdefault(g.sop_uid, issue)
    for member in held:  # refused before assembly: by the UIDs their headers named
        for uid in member.names:
            refused_by.setdefault(uid, member.issue)
    issues: list[Issue] = []
    lost: list[tuple[SampleRef, AnnotationRefs]] = []  # annotations whose header names nothing it was drawn on
    shared: set[str] = set()  # of them, whole ones naming only a frame of reference several series share
    maybe: list[tuple[SampleRef, AnnotationRefs]] = []  # files that did not parse and may be annotations
    for ref, refs in annotations:
        if refs.damaged and not refs.modality:  # nothing says what it is: its record names what it may annotate
            maybe.append((ref, refs))
            continue
        if refs.damaged:  # its references cannot be read: its own record, and its series may be any of the source's
            issues.append(Issue.of(ref, stage="read", reason=refs.damaged_reason,
                                   message=f"{ref.relpath or ref.path}: {refs.damaged}"))
            named = [f for uid in refs.series_uids for f in by_series.get((ref.source, uid), [])] or [
                f for uid in refs.instance_uids for f in by_instance.get((ref.source, uid), [])]
            for f in {id(f): f for f in named}.values():  # what its salvaged header still names
                f.damaged.append((ref, refs))
            if not named:
                lost.append((ref, refs))
            continue
        chosen = [f for uid in refs.series_uids for f in by_series.get((ref.source, uid), [])]
        if not chosen and refs.instance_uids:
            chosen = [f for uid in refs.instance_uids for f in by_instance.get((ref.source, uid), [])]
        if not chosen and not refs.series_uids and not refs.instance_uids:
            chosen = list({id(f): f for uid in refs.frames_of_reference
                           for f in by_frame.get((ref.source, uid), [])}.values())
        # One UID under several entities (an export copied into two patient folders, the entity
        # from the path): the annotation belongs to its own entity's series, never to all of them
        # (each would carry every copy's annotations, and every refusal would be recorded once
        # per link for every file).
        chosen = list({id(f): f for f in chosen}.values())
        entities = {f.series.refs[0].entity for f in chosen}
        if len(entities) > 1:
            own = [f for f in chosen if f.series.refs[0].entity == ref.entity]
            if not own:
                issues.append(_orphan(ref, refs, f"references a series that {len(chosen)} series of other entities "
                                                 "than its own hold (one UID under several entities: an export "
                                                 "copied into several patient folders?), so which one it was "
                                                 "drawn on is unknown",
                                      "Keep the annotation in the folder of the series it was drawn on, with its "
                                      "entity, or remove the copies"))
                continue
            chosen = own
        if not refs.series_uids and not refs.instance_uids:
            if len(chosen) > 1:
                issues.append(_orphan(ref, refs, f"names no series or instance, and {len(chosen)} series of the "
                                                 "source share its Frame of Reference, so which one it was drawn "
                                                 "on is unknown",
                                      "Re-export it with its Referenced Series Sequence (or its frames' Source "
                                      "Image references), or give each series its own source root"))
                # one of them was annotated: none may pack as all background (mask_missing, as for
                # any annotation whose header cannot say what it was drawn on)
                lost.append((ref, refs))
                shared.add(ref.sample_id)
                continue
        if not chosen:
            what = (f"references series {', '.join(uid_digest(u) for u in refs.series_uids)} (UID digests)"
                    if refs.series_uids else f"references {len(refs.instance_uids)} instance(s)"
                    if refs.instance_uids else "names no series, no instance and no frame of reference shared by "
                                               "a series")
            gone = " that are not among the source's packed series" if refs.series_uids or refs.instance_uids else ""
            hit = next((refused_by[uid] for uid in (*refs.series_uids, *refs.instance_uids) if uid in refused_by), None)
            if hit is not None:  # its series is there but refused: the series' own reason, not an orphan's
                printed = _SERIES_NAME.search(hit.message)  # the digest the series' own records print
                as_named = f", named series {printed.group(1)} in their records" if printed else ""
                issues.append(replace(_orphan(ref, refs, f"{what}: its series is refused ({hit.reason}{as_named}, "
                                                         f"e.g. {hit.path})",
                                              "Fix that series (its files' records say why); the annotation is read "
                                              "once the series packs"), reason=hit.reason))
                continue
            if (refused or held) and gone:
                gone += " (files of the source that were refused may be the ones: see their records)"
            if not refs.series_uids and not refs.instance_uids or not refs.study_uid:
                # its references are lost, or its Study Instance UID (Type 1): a header cut short or damaged
                lost.append((ref, refs))
                issues.append(_orphan(ref, refs, what, "Its header may be cut short or damaged: re-export it, or put "
                                                       "the series it was drawn on under the source's root"))
                continue
            issues.append(_orphan(ref, refs, f"{what}{gone}"))
            continue
        for f in {id(f): f for f in chosen}.values():
            f.annotations.append((ref, refs.modality))
            f.declared[ref.sample_id] = refs.declared
            f.sop_classes[ref.sample_id] = refs.sop_class
    out: list[AnnotatedSeries] = []
    instances = {id(f): frozenset(geometry[r.sample_id].sop_uid for r in f.series.refs) for f in found}
    # a lost annotation goes to the unannotated series it may belong to; where every one is
    # annotated already, it may be a second annotation of any of them (a SEG beside an RTSTRUCT)
    fallback = [(ref, refs) for ref, refs in lost
                if not any(not f.annotations and _lost_for(f, geometry, [(ref, refs)]) for f in found)]
    for f in found:
        cfg = masks[f.series.refs[0].source]
        if f.annotations and f.places is None:
            issues.extend(Issue.of(r, stage="validate", reason="mask_geometry", message=(
                f"{r.path}: its series is annotated ({len(f.annotations)} object(s)) but has no pixel spacing or "
                "slice positions, so annotations in patient millimetres cannot be placed on it"))
                for r in (*f.series.refs, *(a for a, _ in f.annotations)))
            continue
        if f.damaged:
            names = "; ".join(f"{a.path} ({n.modality}, {n.damaged_reason})" for a, n in f.damaged)
            issues.extend(_not_packed(
                f, f"its series ({len(f.series.refs)} files) is annotated by {len(f.damaged)} SEG or RTSTRUCT "
                f"object(s) that cannot be read (see their records): {names}. Its masks would lack their structures, "
                "so it is not packed. Re-export the annotation, or remove it to pack the series without it",
                f"another annotation of its series cannot be read ({names}); the series is not packed"))
            continue
        suspect = _lost_for(f, geometry, fallback if f.annotations else lost)
        # why each cannot say: a whole header naming only a shared frame of reference, or one cut short or damaged
        names = "; ".join(f"{a.path} ({n.modality}, in {tie}; "
                          + ("it names only a frame of reference several series share" if a.sample_id in shared
                             else "its header is cut short or damaged") + ")" for a, n, tie in suspect)
        if suspect and f.annotations:
            issues.extend(_not_packed(
                f, f"{len(suspect)} annotation(s) whose header cannot say what it was drawn on (see their records) "
                f"may be another annotation of its series ({len(f.series.refs)} files; "
                f"every series it may belong to is annotated already): {names}. Its masks would lack their "
                "structures, so it is not packed. Re-export the annotation, or remove it to pack the series with its "
                "other annotations",
                f"an annotation that cannot be read may be another of its series' ({names}); the series is not packed"))
            continue
        if suspect:
            issues.extend(_not_packed(
                f, f"no SEG or RTSTRUCT of the source references its series ({len(f.series.refs)} files), "
                f"and {len(suspect)} annotation(s) whose header cannot say what it was drawn on (see their records) "
                f"may be its own: {names}. Its all-zero masks could be that annotation's structures missing, not an "
                "empty series, so it is not packed. Re-export the annotation naming its series, or remove it to "
                "pack the series with all-zero masks (mask.empty: keep)"))
            continue
        if not f.annotations and cfg.empty == "bad":
            issues.extend(_not_packed(
                f, f"no SEG or RTSTRUCT of the source references its series ({len(f.series.refs)} files) "
                "and mask.empty is bad; add its annotation, or set empty: keep to pack it with all-zero masks"))
            continue
        places = f.places if f.places is not None else ()
        siblings = [g for g in by_series.get((f.series.refs[0].source, f.series_uid), []) if g is not f]
        ordered = tuple(sorted(f.annotations, key=lambda a: a[0].sample_id))
        out.append(AnnotatedSeries(series=f.series, places=places, annotations=ordered,
                                   declared=tuple(f.declared.get(r.sample_id) for r, _ in ordered),
                                   sop_classes=tuple(f.sop_classes.get(r.sample_id, "") for r, _ in ordered),
                                   frame_of_reference=f.frame_of_reference,
                                   elsewhere=frozenset().union(*(instances[id(g)] for g in siblings))
                                   - instances[id(f)]))
    issues.extend(_possible(ref, refs, found, geometry) for ref, refs in maybe)
    return out, issues


def _not_packed(f: _Found, series_why: str, annotations_why: str | None = None) -> list[Issue]:
    """The records of an annotated series that is not packed: ``mask_missing`` for each of its
    files, saying ``series_why``, and, where given, ``series_incomplete`` for each of its
    annotations, saying ``annotations_why`` (each message after the file's path)."""
    out = [Issue.of(r, stage="validate", reason="mask_missing", message=f"{r.path}: {series_why}")
           for r in f.series.refs]
    if annotations_why is not None:
        out.extend(Issue.of(r, stage="validate", reason="series_incomplete", message=f"{r.path}: {annotations_why}")
                   for r, _ in f.annotations)
    return out


#: What the record of a file that did not parse says where the file may be an annotation (the
#: build's warning counts the records saying it: :func:`possible_annotations_warning`)
POSSIBLE_ANNOTATION = "with masks from DICOM, it may be a SEG or RTSTRUCT"


def _possible(ref: SampleRef, refs: AnnotationRefs, found: Sequence[_Found],
              geometry: Mapping[str, SliceGeometry]) -> Issue:
    """The record of a file of an annotated source that does not parse and whose bytes do not say
    what it is: its own reason and message, and the series it may annotate (of its entity, else
    in its own folder or the one above), whose masks lack its structures if it is one."""
    candidates = [(ref, refs)]
    near = [f for f in found if _lost_for(f, geometry, candidates)]
    shown = "; ".join(f"{'/'.join(f.series.refs[0].relpath.split('/')[:-1]) or '.'}/ ({len(f.series.refs)} files, "
                      f"{len(f.annotations)} annotation(s))" for f in near[:5])
    more = f"; and {len(near) - 5} more" if len(near) > 5 else ""
    where = (f"series that may be its own: {shown}{more}" if near else
             "no series lies in its entity or in its own folder or the one above")
    return Issue.of(ref, stage="read", reason=refs.damaged_reason, message=(
        f"{ref.relpath or ref.path}: {refs.damaged}. Its bytes do not say what it is: {POSSIBLE_ANNOTATION}, "
        f"whose structures would then be missing from the masks of its series ({where}); re-copy the file, or "
        "remove it if it is not an annotation"))


#: How an annotation's record (``excluded.jsonl``) counts its notes, before the first three
_NOTES_SAID = "; {count} note(s): "
_NOTES_COUNT = re.compile(re.escape(_NOTES_SAID).replace(re.escape("{count}"), r"(\d+)"))


def note_count(record: Excluded) -> int:
    """How many notes an annotation object's record carries (:func:`paint_series`); 0 for any other record."""
    found = _NOTES_COUNT.search(record.detail) if record.why == "annotation" else None
    return int(found.group(1)) if found is not None else 0


def annotation_notes_warning(excluded: Sequence[Excluded], listed_in: str = EXCLUDED_FILE) -> str | None:
    """One line for the annotation objects painted with notes (contours skipped or distrusted,
    segments without frames: :func:`paint_series`' records), or None: how many objects and
    notes, never their structure names (one may be a person's); ``excluded.jsonl`` holds the
    notes themselves. Until now they were in that file alone, and the build said nothing.
    ``listed_in``: where the records are (``excluded.jsonl``; packer validate's report's records)."""
    counts = [int(found.group(1)) for e in excluded if e.why == "annotation"
              if (found := _NOTES_COUNT.search(e.detail)) is not None]
    if not counts:
        return None
    return (f"{len(counts)} annotation object(s) were painted with {sum(counts)} note(s) between them (contours "
            "skipped as degenerate or not closed, self-intersecting ones filled by the even-odd rule, references "
            "that disagree with positions, segments without frames, ...): their masks hold what could be painted; "
            f"each object's row in {listed_in} gives its notes")


def possible_annotations_warning(issues: Sequence[Issue]) -> str | None:
    """One line for the files of sources with masks from DICOM that did not parse and may be
    annotations (:func:`_possible`'s records), or None: how many, and the first one's id."""
    said = [i for i in issues if POSSIBLE_ANNOTATION in i.message]
    if not said:
        return None
    return (f"{len(said)} file(s) of sources with masks from DICOM could not be read, and nothing in them says "
            f"whether they are SEG or RTSTRUCT objects (e.g. {said[0].sample_id}): if one is, the series beside it "
            "packs without its structures (all-zero masks where no other annotation references it); their records "
            "in the bad-sample report name the series each may annotate")


@dataclass(frozen=True)
class Painted:
    """A series' label map (D×H×W on its slices, in series order, on their native grid), and what
    each annotation gave: the Excluded record of each used object (``why: annotation``)."""

    labels: np.ndarray
    used: tuple[Excluded, ...]
    metadata: dict[str, Any]
    #: whether every annotation was drawn on the series' other stacks alone (:attr:`Drawn.elsewhere`)
    elsewhere: bool = False


def _no_map(ref: SampleRef, modality: str) -> AnnotationError:
    """The ``annotation_unmapped`` error of an annotation of a kind the source's mask has no map for."""
    if modality == "SEG":
        return AnnotationError("annotation_unmapped", f"{ref.path}: a SEG, but the source's mask names no "
                                                      "segments; add mask.segments (segment label → class id)")
    return AnnotationError("annotation_unmapped", f"{ref.path}: an RTSTRUCT, but the source's mask names no "
                                                  "rois; add mask.rois (ROI name → class id, with aliases)")


def _read_annotation(ref: SampleRef, modality: str, group: AnnotatedSeries, cfg: MaskConfig,
                     painter: Painter) -> Drawn:
    """Paint one annotation object (each reader parses its own file, so highdicom need not copy
    a parsed one): its unmapped structure names, notes and SOP class. Raises AnnotationError."""
    if modality == "SEG":
        from packer.read.seg import paint_seg

        if cfg.segments is None:
            raise _no_map(ref, modality)
        return paint_seg(ref.path, group.places, cfg.segments, painter, threshold=cfg.threshold, grid=cfg.grid,
                         elsewhere=group.elsewhere, frame_of_reference=group.frame_of_reference)
    else:
        from packer.read.rtstruct import paint_rtstruct

        if cfg.rois is None:
            raise _no_map(ref, modality)
        return paint_rtstruct(ref.path, group.places, cfg.rois, painter, frame_of_reference=group.frame_of_reference,
                              elsewhere=group.elsewhere)


def paint_series(group: AnnotatedSeries, cfg: MaskConfig, keep_names: bool) -> Painted | list[Issue]:
    """The label map of ``group``'s slices from all its annotations under its source's mask
    settings ``cfg`` (module docstring, step 2), or the records that refuse the series: the
    failing annotation's, the same reason for each image file, and ``series_incomplete`` for its
    other annotations. ``keep_names``: the metadata may name the source structures (``phi:
    keep``; else only mapped class names)."""
    first = group.places[0] if group.places else None
    shape = (len(group.places), first.rows if first else 0, first.columns if first else 0)
    painter = Painter(shape=shape, structures=cfg.structures(), overlap=cfg.overlap, dtype=cfg.dtype)
    used: list[Excluded] = []
    unmapped = 0
    notes: list[str] = []
    elsewhere = bool(group.annotations)
    for ref, modality in group.annotations:
        painter.path = ref.path
        try:
            drawn = _read_annotation(ref, modality, group, cfg, painter)
        except AnnotationError as err:
            return _refused(group, ref, err)
        except Exception as err:  # noqa: BLE001 - the annotation readers' boundary, as packer.read.at_boundary is
            # the image readers': a reader bug is the series' unexpected_error record, never a crashed job
            return _refused(group, ref, AnnotationError("unexpected_error", f"{ref.path}: {type(err).__name__}: {err}"))
        names, noted = drawn.unmapped, drawn.notes
        elsewhere = elsewhere and drawn.elsewhere
        unmapped += len(names)
        notes.extend(noted)
        detail = (f"{modality}: the mask of a series of {len(group.places)} slices ({len(group.series.refs)} "
                  f"files){UNMAPPED_SAID.format(count=len(names)) if names else ''}"
                  f"{_NOTES_SAID.format(count=len(noted)) + '; '.join(noted[:3]) if noted else ''}")
        used.append(Excluded.of(ref, stage="transform", why="annotation", detail=detail, modality=modality,
                                sop_class=drawn.sop_class))
    by_id = {s.id: s.name for s in cfg.structures().structures}
    classes = {by_id[i]: sorted(names) if keep_names else None for i, names in sorted(painter.painted.items())}
    metadata: dict[str, Any] = {"objects": [m for _, m in group.annotations],
                                "classes": sorted(name for name in classes),
                                "unmapped_structures": unmapped}
    if keep_names:
        metadata["structures"] = {name: names for name, names in sorted(classes.items())}
    if notes:
        metadata["notes"] = len(notes)
    return Painted(labels=painter.labels, used=tuple(used), metadata=metadata, elsewhere=elsewhere)


def header_refusal(group: AnnotatedSeries, cfg: MaskConfig) -> list[Issue]:
    """``validate --quick``, which paints nothing: the records that refuse ``group`` from its
    annotations' headers alone, as painting would refuse it (:func:`paint_series`): an annotation
    none of whose declared structures the source's map ``cfg`` names, or of a kind the map has no
    names for, is ``annotation_unmapped`` (with the closest names), its series' files are refused
    with it, and its other annotations are ``series_incomplete``. [] where the headers do not
    refuse it (an annotation whose header was not read whole is left to the build)."""
    for (ref, modality), declared in zip(group.annotations, group.declared, strict=False):
        structures = cfg.segments if modality == "SEG" else cfg.rois
        if structures is None:
            return _refused(group, ref, _no_map(ref, modality), stage="validate")
        if declared is not None and not declared.maps(structures):
            what = ("segments", "segments") if modality == "SEG" else ("ROIs", "rois")
            return _refused(group, ref, unmapped_error(ref.path, *what, declared.names, structures), stage="validate")
    return []


def _refused(group: AnnotatedSeries, failed: SampleRef, err: AnnotationError, stage: str = "transform") -> list[Issue]:
    out = [Issue.of(failed, stage=stage, reason=err.reason, message=err.message)]
    out += [Issue.of(r, stage=stage, reason=err.reason, message=(
        f"{r.path}: the mask of its series comes from {failed.path}, which is refused ({err.reason}); no slice of "
        "the series is packed with a partial mask. Fix that annotation (its own record says how)"))
        for r in group.series.refs]
    out += [Issue.of(r, stage=stage, reason="series_incomplete", message=(
        f"{r.path}: another annotation of its series, {failed.path}, is refused ({err.reason}); the series is not "
        "packed")) for r, _ in group.annotations if r.sample_id != failed.sample_id]
    return out


def slice_masks(slices: Sequence[Sample], labels: np.ndarray, cfg: DicomTransformConfig, pad: int,
                metadata: dict[str, Any]) -> list[Sample]:
    """Each slice (series order, as read: windowed, resampled, resized) with its label map through
    the slice's own geometry (:func:`~packer.transform.mask.transform_mask_dicom`), and the
    annotation facts in its metadata."""
    out = []
    for index, sample in enumerate(slices):
        spacing = sample.metadata.get("pixel_spacing")
        mask = transform_mask_dicom(labels[index], pixel_spacing=(spacing[0], spacing[1]) if spacing else None,
                                    spacing=cfg.spacing, size=cfg.size, policy=cfg.resize, pad_value=pad)
        out.append(with_mask(sample, mask, metadata))
    return out


def with_mask(sample: Sample, mask: np.ndarray, metadata: dict[str, Any]) -> Sample:
    """``sample`` with ``mask`` and the annotation facts (``metadata["annotations"]``)."""
    return replace(sample, mask=mask, metadata={**sample.metadata, "annotations": metadata})


def volume_mask(labels: np.ndarray, affine: np.ndarray, cfg: DicomTransformConfig, pad: int,
                positions: np.ndarray | None = None) -> np.ndarray:
    """The D×H×W mask of a series' volume: its slices' label maps stacked (series order) with the
    stack's ``affine``, made canonical, resampled by nearest neighbour and cropped or padded
    (``pad``) exactly as :func:`packer.transform.volume.build_volume` treats the image; with
    ``positions`` (slices off the uniform grid, :func:`packer.read.series.off_grid`), each voxel
    along D from the true slice nearest it, so the mask stays on its resampled image."""
    if positions is None:
        volume = canonical(Volume(labels[None], affine))
        if cfg.volume_spacing is not None:
            volume = resample_nearest(volume, cfg.volume_spacing)
    else:
        targets, placed = depth_grid(affine, labels.shape[0], cfg.volume_spacing)
        volume = canonical(Volume(depth_resample(labels[None], positions, targets, nearest=True), placed))
        if cfg.volume_spacing is not None:  # D is on its grid already: the other two axes only
            volume = resample_nearest(volume, held_depth(cfg.volume_spacing, volume, canonical_order(affine).index(0)))
    if cfg.volume_size is not None:
        volume = crop_or_pad(volume, cfg.volume_size, fill=pad)
    return np.ascontiguousarray(volume.array[0])


def series_labels(group: AnnotatedSeries, slices: int, job: JobConfig
                  ) -> tuple[np.ndarray | None, dict[str, Any], tuple[Issue | Excluded, ...]]:
    """The label map of ``group`` (``slices`` × rows × columns, series order, native grid), the
    annotation facts for its samples' metadata, and the annotations' records (Excluded
    ``annotation`` each); or None and the records refusing the series."""
    cfg = annotated_sources(job)[group.series.refs[0].source]
    elsewhere = False
    if group.annotations:
        painted = paint_series(group, cfg, keep_names=job.phi.mode == "keep")
        if isinstance(painted, list):
            return None, {}, tuple(painted)
        labels, used, metadata, elsewhere = painted.labels, painted.used, painted.metadata, painted.elsewhere
    else:
        rows, columns = (group.places[0].rows, group.places[0].columns) if group.places else (
            group.series.rows, group.series.columns)
        labels = np.zeros((slices, rows, columns), dtype=cfg.dtype)
        used, metadata = (), {"objects": [], "classes": [], "unmapped_structures": 0}
    if cfg.empty == "bad" and not labels.any() and elsewhere:
        # the map is right: the annotations were drawn on the series' other acquisitions, none on this one
        names = ", ".join(a.path for a, _ in group.annotations)
        return None, {}, (*used, *(Issue.of(r, stage="transform", reason="mask_missing", message=(
            f"{r.path}: no SEG or RTSTRUCT references this acquisition's images (its series is stacked per "
            f"acquisition, and its annotations, {names}, were drawn on its other acquisitions alone) and "
            "mask.empty is bad; add this acquisition's annotation, or set empty: keep to pack it with all-zero "
            "masks"))
            for r in group.series.refs))
    if cfg.empty == "bad" and not labels.any():
        return None, {}, (*used, *(Issue.of(r, stage="transform", reason="mask_empty", message=(
            f"{r.path}: its series' annotations paint no voxel of a mapped class and mask.empty is bad; fix the "
            "map (segments, rois) or set empty: keep")) for r in group.series.refs))
    return labels, metadata, used
