"""Series: group DICOM files into series, order their slices in space, check them, and stack neighbours.

Used when ``transform.dicom.sample`` is ``{neighbors: k}``. On the client, :func:`assemble`
turns every file's header facts (:class:`~packer.read.dicom_series.SliceGeometry`) into series:

- **grouping**: files of one entity with the same Study and Series Instance UID; a multi-frame
  file is a series of its own, its frames the slices (positions from the functional groups);
  a series of several acquisitions at more than one position each, separate runs or repeats of
  the same positions, that fails as one stack (a gap or a repeated position between its runs) is
  stacked per Acquisition Number (:func:`_acquisitions`); interleaved ones are one stack;
- **order**: by Image Position (Patient) projected on the slice normal (row × column cosines
  of Image Orientation (Patient)), turned so that its dominant component is positive in LPS
  (:func:`stacking_direction`: axial inferior → superior, sagittal right → left, coronal
  anterior → posterior, head first or feet first alike): never by Instance Number or file
  name, which need not follow position (dcm2niix, nibabel; ``../shared/DOMAIN-series-targets.md`` §1);
- **checks**, each failure a reason of its own, given to every file of the series:
  ``series_localizer`` (localizer or derived images among original ones, or localizers among
  the derived images of a reformat: left out and reported, or with ``drop_localizers: false``
  the series fails; derived images at the original slices' own positions on their grid, two or
  more, are second images of those slices, not left out: :func:`_second_images`), ``series_no_position``
  (a slice without position or orientation, or with cosines that are not orthonormal),
  ``series_orientation`` (orientations differ by more than 1e-4 per cosine),
  ``series_kernels`` (slices of two or more Convolution Kernels: reconstructions never mixed),
  ``series_geometry`` (rows, columns or pixel spacing differ),
  ``series_duplicate_position`` (two slices within 1e-3 mm along the normal),
  ``series_mixed`` (slices of two or more echoes, temporal positions or b-values at different
  positions: :func:`_mixed`),
  ``series_gap`` (a step differs from the median step by more than ``gap_tolerance``),
  ``series_too_short`` (fewer than ``min_slices``).

On a worker, :func:`stack_neighbors` makes each slice of an assembled series a sample whose
channels are its slices ``-k .. +k`` (sorted along the normal), each slice's windows in the
job's order. Neighbours are by index, as the RSNA winners took them; the checks above make
the index steps equal in millimetres within ``gap_tolerance``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from packer.config import DicomTransformConfig, SeriesConfig
from packer.read.dicom_series import FRAME_IDENTITY, IMAGE_IDENTITY, IMAGE_TIMES, HeaderFingerprint, SliceGeometry
from packer.records import Issue, Sample, SampleRef
from packer.transform.volume import AXIS_TIE, build_volume, canonical_order, resampled_shape, stack_affine

#: Two orientations agree when every cosine differs by at most this (DS values are rounded
#: to 16 characters; dcm2niix uses 1e-4).
ORIENTATION_TOLERANCE = 1e-4
#: Two slices closer than this along the normal (mm) share a position.
POSITION_TOLERANCE = 1e-3
#: Two Pixel Spacings agree when they differ by at most this fraction (DS rounding: 0.683594
#: against 0.68359375 is 6e-7).
SPACING_TOLERANCE = 1e-4
#: A slice lies off the line through the series' first and last slices (across it, in the
#: plane: a slice shifted in x or y) by at most this many pixels; a volume stacks every slice on
#: that line, so one further off would be packed where it is not.
OFF_LINE_PIXELS = 0.5


@dataclass(frozen=True)
class Series:
    """An assembled series: ``refs`` its files (in the order their first slice comes),
    ``slices`` its slices in order along the normal as (index into ``refs``, frame),
    ``steps`` the distances between consecutive slices (mm), ``uid_key`` a short digest of
    its UIDs (never the UIDs: they identify the study)."""

    uid_key: str
    refs: tuple[SampleRef, ...]
    slices: tuple[tuple[int, int], ...]
    steps: tuple[float, ...]
    #: Image Position (Patient) of the first slice, the orientation's six cosines, the pixel
    #: spacing (row, column mm), the grid, and the mean step between slices as a vector (mm)
    origin: tuple[float, float, float] = (0.0, 0.0, 0.0)
    orientation: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    pixel_spacing: tuple[float, float] | None = None
    rows: int = 0
    columns: int = 0
    step: tuple[float, float, float] = (0.0, 0.0, 1.0)
    #: Each file of ``refs`` as the header pass read it (:attr:`SliceGeometry.fingerprint`), where known
    fingerprints: tuple[HeaderFingerprint | None, ...] = ()
    #: Each file of ``refs``: its Modality and SOP class name (:attr:`SliceGeometry.modality`,
    #: :attr:`SliceGeometry.sop_class`), which a record of a file left out is counted by
    objects: tuple[tuple[str, str], ...] = ()
    #: A series of one slice whose header gives no depth (:attr:`SliceGeometry.depth`): its
    #: ``step`` is 1 mm along the normal by assumption, which its volume's warnings say
    depth_assumed: bool = False

    def affine(self) -> np.ndarray:
        """The stack's 4×4 affine as assembled (D along the sorted normal, H down, W across)."""
        return stack_affine(np.asarray(self.origin), np.asarray(self.orientation), self.pixel_spacing or (1.0, 1.0),
                            np.asarray(self.step))


@dataclass(frozen=True)
class Assembled:
    """Every series that passed, and one bad-sample record per file of every one that did not
    (and per localizer left out)."""

    series: tuple[Series, ...]
    issues: tuple[Issue, ...]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def _normal(orientation: Sequence[float] | np.ndarray) -> np.ndarray:
    row, col = np.asarray(orientation[:3], dtype=np.float64), np.asarray(orientation[3:6], dtype=np.float64)
    normal = np.cross(row, col)
    length = np.linalg.norm(normal)
    return normal / length if length > 0 else normal


def stacking_direction(orientation: Sequence[float] | np.ndarray) -> np.ndarray:
    """The unit direction a series' slices are ordered along: the slice normal (row × column
    cosines), turned so that its dominant component (largest absolute value; the first of those
    within :data:`~packer.transform.volume.AXIS_TIE` of it, as the volume's axes break a tie, so a
    45-degree series and its copy rounded otherwise stack alike) is positive in DICOM patient
    space (LPS). Axial stacks then run inferior → superior,
    sagittal right → left and coronal anterior → posterior whatever the patient position: a
    feet-first scan (typical IOP ``[-1,0,0,0,1,0]``, row × column pointing to the feet) stacks
    its 2.5D channels in the same anatomical order as a head-first one."""
    normal = _normal(orientation)
    size = np.abs(normal)
    dominant = int(np.flatnonzero(size >= size.max() - AXIS_TIE)[0])
    return -normal if normal[dominant] < 0 else normal


#: How far an orientation's cosines may be from unit length and from orthogonal (DS values
#: written with 3 decimals by old exports still pass; all zeros or two equal vectors do not).
ORTHONORMAL_TOLERANCE = 1e-2


def _orthonormal(orientation: np.ndarray) -> bool:
    """Whether the six cosines are two unit vectors at right angles (PS3.3 C.7.6.2.1.1), within
    :data:`ORTHONORMAL_TOLERANCE`."""
    row, col = orientation[:3], orientation[3:6]
    return bool(abs(np.linalg.norm(row) - 1) <= ORTHONORMAL_TOLERANCE
                and abs(np.linalg.norm(col) - 1) <= ORTHONORMAL_TOLERANCE
                and abs(float(np.dot(row, col))) <= ORTHONORMAL_TOLERANCE)


def _is_localizer(geometry: SliceGeometry) -> bool:
    """Image Type marks a localizer (value 3, PS3.3 C.8.2.1.1.1) or a derived image."""
    return "LOCALIZER" in geometry.image_type or (bool(geometry.image_type) and geometry.image_type[0] == "DERIVED")


def _stack_of(members: list[tuple[SampleRef, SliceGeometry]]) -> list[tuple[SampleRef, SliceGeometry]]:
    """The files of ``members`` that are the series' slices, the others localizers (or derived
    images) that ``drop_localizers`` leaves out: the original images where there are any (a
    reformat or a projection exported among them is left out too), with the derived images that
    are second images of their slices (:func:`_second_images`: a DWI's trace images beside its b0,
    which then meet the originals at their positions, series_duplicate_position); else, in a
    reformat (derived images only), every file but the localizers, which a scanner exports into
    such a series as well and which were stacked into the reformat's volume (or turned it down as
    series_orientation); ``[]`` where every file is a localizer (a scout series)."""
    originals = [(ref, g) for ref, g in members if not _is_localizer(g)]
    if not originals:
        return [(ref, g) for ref, g in members if "LOCALIZER" not in g.image_type]
    seconds = _second_images(originals, [(ref, g) for ref, g in members
                                         if _is_localizer(g) and "LOCALIZER" not in g.image_type])
    return [(ref, g) for ref, g in members if not _is_localizer(g) or ref.sample_id in seconds]


def _second_images(originals: Sequence[tuple[SampleRef, SliceGeometry]],
                   derived: Sequence[tuple[SampleRef, SliceGeometry]]) -> set[str]:
    """The sample ids of the ``derived`` images that are second images of original slices, not
    reformats or projections: each lies on an original's grid (its orientation within
    :data:`ORIENTATION_TOLERANCE`, rows, columns and pixel spacing) at that original's own
    position (within :data:`POSITION_TOLERANCE` along the normal, half a pixel across it), and
    they stand at two or more of the originals' positions and at least half of them, and at least
    half of the derived images on that grid stand at such a position (a Siemens DWI's TRACEW
    images beside its b0: one at every slice, none between). A lone one (a MIP that happens to sit
    at a slice), a few (thick same-plane reformats at every fifth slice, key images saved back into
    the series), a thin reformat whose every fifth image meets a slice, or any in another plane or
    on another grid, is not: ``set()``."""
    on: set[str] = set()
    on_grid = 0  # the derived images on an original's grid, at a slice's position or not
    hit: set[tuple[int, int, int]] = set()  # the originals' positions they stand at
    for ref, d in derived:
        if d.orientation is None or any(p is None for p in d.positions):
            continue
        normal = _normal(d.orientation)
        across = OFF_LINE_PIXELS * (min(d.spacing) if d.spacing else 1.0)
        places = np.asarray([p for _, o in originals
                             if o.orientation is not None and o.rows == d.rows and o.columns == d.columns
                             and _same_spacing(d.spacing, o.spacing) == o.spacing
                             and float(np.abs(np.asarray(o.orientation) - np.asarray(d.orientation)).max())
                             <= ORIENTATION_TOLERANCE
                             for p in o.positions if p is not None], dtype=np.float64).reshape(-1, 3)
        if not len(places):
            continue
        on_grid += 1
        matches = [np.flatnonzero((np.abs(off @ normal) <= POSITION_TOLERANCE)
                                  & (np.linalg.norm(off - np.outer(off @ normal, normal), axis=1) <= across))
                   for off in (places - np.asarray(p, dtype=np.float64) for p in d.positions)]
        if all(m.size for m in matches):
            on.add(ref.sample_id)
            hit.update(_place_key(places[i]) for m in matches for i in m)
    originals_at = {_place_key(p) for _, o in originals for p in o.positions if p is not None}
    return on if len(hit) >= 2 and 2 * len(hit) >= len(originals_at) and 2 * len(on) >= on_grid else set()


def _place_key(position: Any) -> tuple[int, int, int]:
    """A slice position (mm) to the micrometre, to count distinct places."""
    x, y, z = (int(v) for v in np.rint(np.asarray(position, dtype=np.float64) * 1000))
    return x, y, z


def _fail(refs: Sequence[SampleRef], reason: str, what: str, uid_key: str, part: str = "") -> list[Issue]:
    """Each of ``refs`` refused with ``reason``: its series (``uid_key``), or ``part`` of it (an
    acquisition stacked on its own, named as such: the series' other parts are judged apart)."""
    unit = part or f"series {uid_key} ({len(refs)} files)"
    tail = ("this acquisition is not packed (the series' other acquisitions are stacked, and judged, on their own)"
            if part else "the series is not packed")
    return [Issue.of(ref, stage="validate", reason=reason, message=f"{ref.path}: {unit}: {what}; {tail}")
            for ref in refs]


def assemble(files: Sequence[tuple[SampleRef, SliceGeometry]], cfg: SeriesConfig) -> Assembled:
    """Group, order and check (see the module docstring). ``files``: probed refs (entity set)
    with their geometry, in any order: the result does not depend on it."""
    groups: dict[tuple[str, ...], list[tuple[SampleRef, SliceGeometry]]] = {}
    for ref, geometry in files:
        key: tuple[str, ...] = (ref.entity or "", geometry.study_uid, geometry.series_uid)
        if geometry.frames > 1:  # a multi-frame object is a series of its own
            key = (*key, ref.sample_id)
        groups.setdefault(key, []).append((ref, geometry))
    series: list[Series] = []
    issues: list[Issue] = []
    for key in sorted(groups):
        uid_key = _digest(*key)
        members, copies = _one_per_instance(sorted(groups[key], key=lambda m: m[0].sample_id), uid_key)
        outcome = _check(members, cfg, uid_key)
        parts = [(members, outcome, uid_key)]
        if not isinstance(outcome, Series) and outcome and outcome[0].reason in _ACQUISITION_REASONS:
            parts = [(part, _check(part, cfg, part_key, f"acquisition {number or '(none)'} of series {uid_key} "
                                                        f"({len(part)} of its {len(members)} files)"), part_key)
                     for part, part_key, number in _acquisitions(members, key, cfg)] or parts
        refused: dict[str, Issue] = {}  # each file of this group a refusal names, by sample id
        recorded: set[str] = set()  # each member a part packs or has a record for
        for _, part_outcome, _ in parts:
            if isinstance(part_outcome, Series):
                series.append(part_outcome)
                recorded.update(ref.sample_id for ref in part_outcome.refs)
            else:
                issues.extend(part_outcome)
                refused.update((i.sample_id, i) for i in part_outcome)
                recorded.update(refused)
        # the localizers left out of what packs or is refused (a refused series' too: they had no
        # record, and the input counts did not add up); with drop_localizers only
        issues.extend(_left_out([m for m in members if m[0].sample_id not in recorded], cfg, uid_key))
        issues.extend(_copy_issue(*copy, uid_key, refused.get(copy[2].sample_id)) for copy in copies)
    return Assembled(series=tuple(series), issues=tuple(issues))


#: The failures a series of several acquisitions shows where each acquisition is a sound stack:
#: the step between two runs (a chest then an abdomen) or the positions they share (pre and post
#: contrast), or their kernels (a chest run reconstructed with a lung kernel, the abdomen with a soft one).
_ACQUISITION_REASONS = ("series_gap", "series_duplicate_position", "series_kernels", "series_mixed")


def _acquisitions(members: list[tuple[SampleRef, SliceGeometry]], key: tuple[str, ...], cfg: SeriesConfig
                  ) -> list[tuple[list[tuple[SampleRef, SliceGeometry]], str, str]]:
    """``members`` split by Acquisition Number, each part with its digest and its number, where the series holds
    several acquisitions at more than one position each (the runs of one series: dcm2niix stacks
    across acquisitions, which leaves such a series with a gap or repeated positions) that are
    runs of their own (:func:`_separate_runs`); else ``[]``, and the series stays one. A scanner
    that numbers every slice its own acquisition (sequential CT) gives one-position parts (both
    echoes of a slice in one, say): no split, so a real gap is still ``series_gap`` and two
    echoes at a position ``series_duplicate_position``. Acquisitions whose positions interleave
    (MR concatenations: every other slice) are one scan: no split, or a missing slice would
    leave a complete acquisition packed at twice the spacing. The localizers ``drop_localizers``
    leaves out count in no part (a scout of its own acquisition number, or of none, stopped the
    split)."""
    if cfg.drop_localizers:
        members = _stack_of(members) or members
    by_acquisition: dict[str, list[tuple[SampleRef, SliceGeometry]]] = {}
    for ref, geometry in members:
        by_acquisition.setdefault(geometry.acquisition, []).append((ref, geometry))
    if len(by_acquisition) < 2 or "" in by_acquisition:
        return []
    orientation = members[0][1].orientation
    if orientation is None or any(p is None for _, g in members for p in g.positions):
        return []  # not reached: a series without places fails as series_no_position, which splits nothing
    normal = stacking_direction(orientation)
    places = [_distinct(np.asarray([float(np.dot(normal, np.asarray(p))) for _, g in part for p in g.positions]))
              for part in by_acquisition.values()]
    if any(len(part) < 2 for part in places) or not _separate_runs(places):
        return []
    return [(by_acquisition[number], _digest(*key, "acquisition", number), number)
            for number in sorted(by_acquisition, key=lambda n: (len(n), n))]


def _distinct(along: np.ndarray) -> np.ndarray:
    """The positions ``along`` the normal (mm), sorted, each once (within :data:`POSITION_TOLERANCE`)."""
    ordered = np.sort(along)
    return ordered[np.concatenate(([True], np.diff(ordered) > POSITION_TOLERANCE))]


def _separate_runs(places: Sequence[np.ndarray]) -> bool:
    """Whether acquisitions at these positions along the normal (each sorted, distinct) are
    runs of their own, every two of them either mostly apart (a chest then an abdomen, or the
    stations of a whole-body scan, which may overlap by a few slices: at most half of either's
    positions lie within the other's range) or at some of the same positions (pre and post
    contrast, one of them maybe missing a slice). Two whose positions mostly fall between one
    another's, at no shared position, interleave (every other slice of one scan: MR
    concatenations), and are judged as one stack."""
    for n, a in enumerate(places):
        for b in places[n + 1:]:
            shared = bool((np.abs(a[:, None] - b[None, :]) <= POSITION_TOLERANCE).any())
            if not shared and (_inside_share(a, b) > 0.5 or _inside_share(b, a) > 0.5):
                return False
    return True


def _inside_share(a: np.ndarray, b: np.ndarray) -> float:
    """The share of positions ``a`` that lie within the range of positions ``b`` (both sorted)."""
    inside = (a >= b[0] - POSITION_TOLERANCE) & (a <= b[-1] + POSITION_TOLERANCE)
    return float(inside.mean())


def _one_per_instance(members: list[tuple[SampleRef, SliceGeometry]], uid_key: str
                      ) -> tuple[list[tuple[SampleRef, SliceGeometry]],
                                 list[tuple[SampleRef, SliceGeometry, SampleRef, SliceGeometry]]]:
    """``members`` (in sample id order) with each image once: a file with the SOP Instance UID
    and the positions of an earlier one is the same image exported twice (a copy in another
    folder), not a second slice at that position, unless their headers tell two images apart
    (:func:`_differences`: another echo of an export that gave each position one UID); then
    both stay, and :func:`_check` refuses the series naming the UID they share. The copy that
    reads stays in the series: one
    whose header and Pixel Data check out (:attr:`HeaderFingerprint.pixels`) before one that
    does not (cut short, or a damaged copy made larger by bytes after its image), then the largest,
    then the first; each other copy is a bad sample naming the one kept and why it was not kept."""
    seen: dict[tuple[str, tuple[Any, ...]], int] = {}  # the image → its index in ``kept``
    kept: list[tuple[SampleRef, SliceGeometry]] = []
    copies: list[tuple[SampleRef, SliceGeometry, SampleRef, SliceGeometry]] = []  # (copy, its geometry, kept, its)
    for ref, geometry in members:
        same = (geometry.sop_uid, geometry.positions)
        at = seen.get(same) if geometry.sop_uid else None
        if at is not None and _differences(kept[at][1], geometry):
            at = None  # two images that share a UID (another echo): not a copy, both stay (refused by _check)
        if at is None:
            if geometry.sop_uid and same not in seen:
                seen[same] = len(kept)
            kept.append((ref, geometry))
            continue
        first, first_geometry = kept[at]
        if _rank(geometry) > _rank(first_geometry):  # the copy that reads replaces a worse one
            kept[at] = (ref, geometry)
            copies = [(c, cg, ref, geometry) if k is first else (c, cg, k, kg) for c, cg, k, kg in copies]
            copies.append((first, first_geometry, ref, geometry))
        else:
            copies.append((ref, geometry, first, first_geometry))
    return kept, copies


def _differences(a: SliceGeometry, b: SliceGeometry) -> list[str]:
    """What tells the images of two files apart (``Echo Numbers 1 against 2``), from their headers
    (their Pixel Data is not read here; a copy in another transfer syntax, or cut short, differs
    there and is still one image): ``[]`` where nothing does."""
    return [f"{name} {x or '(none)'} against {y or '(none)'}" for name, x, y in _facts(a, b) if x != y]


def _facts(a: SliceGeometry, b: SliceGeometry) -> list[tuple[str, str, str]]:
    """The header facts :func:`_differences` compares, by DICOM keyword (as ``where:`` names them)."""
    return [*zip(IMAGE_IDENTITY, a.identity, b.identity, strict=False),
            ("AcquisitionNumber", a.acquisition, b.acquisition), ("ConvolutionKernel", a.kernel, b.kernel),
            ("ImageType", "\\".join(a.image_type), "\\".join(b.image_type)),
            ("Rows", str(a.rows), str(b.rows)), ("Columns", str(a.columns), str(b.columns))]


def _size(geometry: SliceGeometry) -> int:
    """The file's size as the header pass saw it (-1 unknown)."""
    return geometry.fingerprint.size if geometry.fingerprint is not None else -1


def _pixels(geometry: SliceGeometry) -> str | None:
    """What is wrong with the file's Pixel Data as the header pass saw it ("" nothing, None unknown)."""
    return geometry.fingerprint.pixels if geometry.fingerprint is not None else None


def _rank(geometry: SliceGeometry) -> tuple[int, int]:
    """Which copy of one image to keep, the highest: Pixel Data that checks out, then unknown, then
    a known problem; then the size."""
    pixels = _pixels(geometry)
    return (1 if pixels == "" else 0 if pixels is None else -1), _size(geometry)


def _copy_issue(copy: SampleRef, geometry: SliceGeometry, kept: SampleRef, kept_geometry: SliceGeometry,
                uid_key: str, refused: Issue | None = None) -> Issue:
    """The record of a copy left out for ``kept``; ``refused``: the kept file's own record where
    its series was refused after all (then nothing is packed, and the record says so)."""
    problem, kept_problem = _pixels(geometry), _pixels(kept_geometry)
    if problem and kept_problem == "":
        why = (f"; {kept.path} ({_size(kept_geometry):,} bytes) is its header and one whole Pixel Data, this copy "
               f"({_size(geometry):,} bytes) is not: {problem}; remove this one")
    elif problem and kept_problem:
        why = f"; neither copy checks out (this one: {problem}; the one kept: {kept_problem}): export the image again"
    elif problem == "" and kept_problem == "":  # both whole: nothing is wrong with either
        why = (f"; both copies are whole (each its header and one whole Pixel Data), {_size(geometry):,} bytes "
               f"against {_size(kept_geometry):,} (another transfer syntax, say); the larger is kept: remove one "
               "of them")
    elif 0 <= _size(geometry) < _size(kept_geometry) and not kept_problem:
        # this copy's Pixel Data cannot be measured from its header (a compressed syntax, which is smaller anyway)
        why = (f"; this copy is {_size(geometry):,} bytes against {_size(kept_geometry):,}, and its header does not "
               "say whether its Pixel Data is whole (a compressed syntax, or a file cut short); the larger is kept: "
               "remove this one")
    else:
        why = ": remove one of them"
    # assembled: a slice may still be refused while its pixels are read, so "takes", not "is packed"
    where = (f"series {uid_key} takes {kept.path}, not this copy (the series' own records say whether it packed)"
             if refused is None else
             f"series {uid_key} holds {kept.path} in this copy's place, and is not packed ({refused.reason}: see "
             f"the record of {kept.path})")
    return Issue.of(copy, stage="validate", reason="series_duplicate_position", message=(
        f"{copy.path}: the same image as {kept.path} (its SOP Instance UID and position), one file twice in the "
        f"export; {where}{why}"))


def _left_out(members: Sequence[tuple[SampleRef, SliceGeometry]], cfg: SeriesConfig, uid_key: str) -> list[Issue]:
    """One record for each localizer of ``members`` (the files of a series that neither pack nor
    have a record of their refusal) that ``drop_localizers`` left out."""
    if not cfg.drop_localizers:
        return []
    return [Issue.of(ref, stage="validate", reason="series_localizer",
                     message=f"{ref.path}: a localizer or derived image (Image Type {'/'.join(g.image_type)}) in "
                             f"series {uid_key}; left out of the series (series.drop_localizers)")
            for ref, g in members if _is_localizer(g)]


def _spacing_text(spacing: Any) -> str:
    """A slice's pixel spacing as a geometry refusal names it: ``at (0.5, 0.5)``, or that it has none."""
    if spacing is None:
        return "without (0028,0030) Pixel Spacing"
    return f"at {tuple(round(float(v), 6) for v in spacing)}"


def _check(members: list[tuple[SampleRef, SliceGeometry]], cfg: SeriesConfig, uid_key: str,
           part: str = "") -> Series | list[Issue]:
    refs = [ref for ref, _ in members]
    stack = _stack_of(members)
    if cfg.drop_localizers and not stack:
        # a scout series: no stack to check, each file a localizer left out, as among slices (a
        # series of derived images only, a reformat, is still a stack: checked below)
        return [Issue.of(ref, stage="validate", reason="series_localizer",
                         message=f"{ref.path}: a localizer (Image Type {'/'.join(g.image_type)}) in series "
                                 f"{uid_key}, whose {len(members)} file(s) are all localizers: a scout, not a "
                                 "stack; left out (series.drop_localizers)")
                for ref, g in members]
    if not cfg.drop_localizers and len(stack) != len(members):
        # a localizer refuses its series, a scout series of localizers only too (it was packed
        # as a stack where its scouts lay at distinct positions of one plane)
        what = ("every one of its files is a localizer: a scout, not a stack" if not stack else
                f"{len(members) - len(stack)} localizer or derived image(s) among its {len(members)} files")
        return _fail(refs, "series_localizer", f"{what} (series.drop_localizers is false)", uid_key, part)
    if len(stack) != len(members):
        members, refs = stack, [ref for ref, _ in stack]
    kernels: dict[str, list[str]] = {}
    for ref, g in members:
        if g.kernel:
            kernels.setdefault(g.kernel, []).append(ref.path)
    if len(kernels) > 1:
        # two reconstructions of one scan under one Series Instance UID pass every check below
        # where their slices interleave (or split as acquisitions): a volume alternating kernels
        shown = ", ".join(f"{kernel!r} ({len(paths)} file(s), e.g. {paths[0]})" for kernel, paths in
                          sorted(kernels.items(), key=lambda item: (-len(item[1]), item[0])))
        first_kernel = min(kernels, key=lambda k: (-len(kernels[k]), k))
        return _fail(refs, "series_kernels", f"its slices are reconstructions with different Convolution Kernel "
                                             f"({shown}), which one stack would mix; pack one reconstruction per "
                                             f"source with where: {{ConvolutionKernel: {first_kernel}}}",
                     uid_key, part)
    first = members[0][1]
    placeless = [(ref, g) for ref, g in members if g.orientation is None or any(p is None for p in g.positions)]
    if placeless:
        ref, g = placeless[0]
        missing = [name for name, gone in (("Image Orientation (Patient)", g.orientation is None),
                                           ("Image Position (Patient)", any(p is None for p in g.positions))) if gone]
        where = (f"{sum(p is None for p in g.positions)} of the {g.frames} frames of {ref.path} have no "
                 f"Image Position (Patient) ({g.unplaced})" if g.frames > 1 and g.unplaced
                 else f"{sum(p is None for p in g.positions)} of the {g.frames} frames of {ref.path} have no "
                 "Image Position (Patient) (a multi-frame object gives one per frame, in its Per-frame "
                 "Functional Groups)" if g.frames > 1 and g.orientation is not None
                 else f"{ref.path} has no {' and no '.join(missing)}")
        return _fail(refs, "series_no_position", f"{where}, so the slices cannot be ordered in space", uid_key, part)
    base = np.asarray(first.orientation, dtype=np.float64)
    # any slice's (or frame's) orientation that is no orientation, not the first file's alone: which
    # file comes first must not decide the reason (an all-zero one in a broken export, anywhere)
    broken = next(((ref, np.asarray(o, dtype=np.float64)) for ref, g in members
                   for o in (g.orientation, *g.frame_orientations)
                   if o is not None and not _orthonormal(np.asarray(o, dtype=np.float64))), None)
    if broken is not None:
        cosines = [round(float(v), 6) for v in broken[1]]
        return _fail(refs, "series_no_position", f"{broken[0].path} has an Image Orientation (Patient) {cosines} "
                                                 "whose row and column cosines are not two orthogonal unit vectors, "
                                                 "so no slice normal orders the slices", uid_key, part)
    turned = [(i, frame, o) for i, (_, g) in enumerate(members)
              for frame, o in enumerate((g.orientation, *g.frame_orientations))
              if o is not None and np.abs(np.asarray(o) - base).max() > ORIENTATION_TOLERANCE]
    if turned:
        i, frame, o = turned[0]
        ref, g = members[i]
        # the frame of the base orientation it is compared with: its own object's, where it holds one
        level = next((n for n, other in enumerate((g.orientation, *g.frame_orientations)) if other is not None
                      and np.abs(np.asarray(other) - base).max() <= ORIENTATION_TOLERANCE), None)
        at, level_frame = (i, level) if level is not None and g.frames > 1 else (0, 0)
        where = f"{ref.path} frame {frame}" if g.frames > 1 else ref.path  # 0-based, as its key (-f0002)
        first_where = (f"{members[at][0].path} frame {level_frame}" if members[at][1].frames > 1
                       else members[at][0].path)
        cause = (_one_object(g, frame, level_frame, "in different planes") if at == i
                 else "a reformat or a localizer exported into the series: remove it")
        return _fail(refs, "series_orientation", f"its slices have different Image Orientation (Patient): "
                                                 f"{where} has {[round(float(v), 4) for v in o]}, "
                                                 f"{first_where} {[round(float(v), 4) for v in base]}"
                                                 f"{f' ({len(turned)} such slices)' if len(turned) > 1 else ''}; "
                                                 f"{cause}", uid_key, part)
    # every frame's own spacing: an enhanced file's frame of another scale was stacked at frame 0's
    grid = {(g.rows, g.columns, _same_spacing(s, first.spacing)) for _, g in members for s in (g.spacing,
                                                                                                 *g.frame_spacings)}
    if len(grid) > 1:
        counts: dict[tuple[Any, ...], list[str]] = {}
        for ref, g in members:
            for spacing in dict.fromkeys((g.spacing, *g.frame_spacings)):
                counts.setdefault((g.rows, g.columns, spacing), []).append(ref.path)
        shown = ", ".join(f"{r}×{c} {_spacing_text(s)} ({len(paths)} file(s), e.g. {paths[0]})"
                          for (r, c, s), paths in sorted(counts.items(), key=lambda item: -len(item[1])))
        return _fail(refs, "series_geometry", f"its slices differ in rows, columns or pixel spacing ({shown})",
                     uid_key, part)
    normal = stacking_direction(base)
    slices = sorted(((float(np.dot(normal, np.asarray(pos))), i, frame) for i, (_, g) in enumerate(members)
                     for frame, pos in enumerate(g.positions)), key=lambda s: (s[0], s[1], s[2]))
    if len(slices) < cfg.min_slices:
        return _fail(refs, "series_too_short", f"{len(slices)} slice(s), fewer than series.min_slices "
                                               f"({cfg.min_slices})", uid_key, part)
    steps = np.diff([s[0] for s in slices])
    if (steps < POSITION_TOLERANCE).any():
        at = int(np.argmax(steps < POSITION_TOLERANCE))
        both = " and ".join(_slice_name(members, slices[n]) for n in (at, at + 1))
        return _fail(refs, "series_duplicate_position", f"two slices share the position {slices[at][0]:.3f} mm "
                                                        f"along the slice normal ({both}: "
                                                        f"{_duplicate_cause(members, slices[at], slices[at + 1])})",
                     uid_key, part)
    mixed = _mixed(members)
    if mixed is not None:
        return _fail(refs, "series_mixed", mixed, uid_key, part)
    median = float(np.median(steps)) if steps.size else 0.0  # one slice (min_slices: 1): no step to check
    off = np.abs(steps - median) > cfg.gap_tolerance * median
    if off.any():
        at = int(np.argmax(off))
        both = " and ".join(_slice_name(members, slices[n]) for n in (at, at + 1))
        (_, i, frame), (_, j, other) = slices[at], slices[at + 1]
        g = members[i][1]
        cause = ("a missing or extra slice (restore the missing file, or raise series.gap_tolerance for a series "
                 "that is irregular by design)")
        if i == j and g.frames > 1:  # one file: nothing to restore
            cause = _one_object(g, frame, other, "that far apart")
            if not _frames_told(g, frame, other):  # nothing tells them apart: it may be irregular by design
                cause += ", or raise series.gap_tolerance for an object that is irregular by design"
        return _fail(refs, "series_gap", f"a step of {steps[at]:.3f} mm between {both} (slices {at + 1} and "
                                         f"{at + 2} along the slice normal) where the median step is {median:.3f} "
                                         f"mm (series.gap_tolerance {cfg.gap_tolerance:g}): {cause}", uid_key, part)
    shifted = _off_line(members, slices, first.spacing)
    if shifted is not None:
        return _fail(refs, "series_geometry", shifted, uid_key, part)
    order = []  # files in the order their first slice comes
    for _, i, _ in slices:
        if i not in order:
            order.append(i)
    index = {i: n for n, i in enumerate(order)}
    first_pos = np.asarray(members[slices[0][1]][1].positions[slices[0][2]], dtype=np.float64)
    last_pos = np.asarray(members[slices[-1][1]][1].positions[slices[-1][2]], dtype=np.float64)
    depth = members[slices[0][1]][1].depth
    if len(slices) == 1 and members[slices[0][1]][1].depth_problem:  # its only depth is damaged: no fallback
        return _fail(refs, "series_geometry", f"a series of one slice takes its depth from the header, and "
                                              f"{members[slices[0][1]][1].depth_problem}", uid_key, part)
    if len(slices) > 1:
        step = (last_pos - first_pos) / (len(slices) - 1)
    else:  # one slice: no second position, so the header's depth (else 1 mm, said in its warnings)
        step = normal * (depth or 1.0)
    return Series(uid_key=uid_key, refs=tuple(refs[i] for i in order),
                  slices=tuple((index[i], frame) for _, i, frame in slices), steps=tuple(float(s) for s in steps),
                  origin=(float(first_pos[0]), float(first_pos[1]), float(first_pos[2])),
                  orientation=tuple(float(v) for v in base), pixel_spacing=first.spacing, rows=first.rows,
                  columns=first.columns, step=(float(step[0]), float(step[1]), float(step[2])),
                  fingerprints=tuple(members[i][1].fingerprint for i in order),
                  objects=tuple((members[i][1].modality, members[i][1].sop_class) for i in order),
                  depth_assumed=len(slices) == 1 and depth is None)


#: The attributes whose values name one image of several that an MR series holds of each place
#: (an echo, a temporal position, a b-value; the what of each, as a record names it): a stack whose
#: slices hold two or more values of one (a slice without it aside) would alternate them where their
#: positions interleave (echo 1 at 0, 3, 6 mm, echo 2 at 1.5, 4.5 mm), as it refuses them where they
#: share positions. Not Trigger Time (a gated CT or MR writes one per slice), Echo Time (a value that
#: may differ slightly between slices of one echo), Image Type or Slice Thickness, nor Frame Reference
#: Time: a static whole-body PET's beds start at different times, so its slices hold one per bed
#: (PS3.3 C.8.9.4.1.5)
MIXED = (("EchoNumbers", "echoes"), ("TemporalPositionIdentifier", "temporal positions"),
         ("DiffusionBValue", "b-values"))


def _value_key(text: str) -> tuple[int, tuple[float, ...], str]:
    """A value of :data:`MIXED` as compared and sorted: as numbers where each of its values is one
    (``1`` and ``01``, ``1000`` and ``1000.0`` are one value), else as text."""
    try:
        return 0, tuple(float(v) for v in text.split("\\")), ""
    except ValueError:
        return 1, (), text


def _mixed(members: Sequence[tuple[SampleRef, SliceGeometry]]) -> str | None:
    """What is wrong where the slices of ``members`` (a stack, no two at one position) hold two or
    more values of an attribute of :data:`MIXED`, ignoring slices without it: the values, each
    with its file count and a file, and the ``where:`` that keeps the first; None where none do."""
    for name, what in MIXED:
        at = IMAGE_IDENTITY.index(name)
        files: dict[tuple[int, tuple[float, ...], str], list[str]] = {}
        written: dict[tuple[int, tuple[float, ...], str], str] = {}
        for ref, g in members:
            text = g.identity[at] if len(g.identity) > at else ""
            if text:
                written.setdefault(_value_key(text), text)
                files.setdefault(_value_key(text), []).append(ref.path)
        if len(files) > 1:
            values = sorted(files)
            shown = "; ".join(f"{name} {written[v]} ({len(files[v])} file{'s' if len(files[v]) > 1 else ''}, "
                              f"e.g. {files[v][0]})" for v in values)
            return (f"its slices hold {len(values)} values of {name} ({shown}) at different positions: {what} of one "
                    "series whose slices interleave along the normal (or lie apart), which one stack would "
                    f"alternate; keep one with the source's where: {{{name}: {written[values[0]]}}}, a source (or "
                    "job) for each")
    return None


def _same_spacing(spacing: tuple[float, float] | None, first: tuple[float, float] | None
                  ) -> tuple[float, float] | None:
    """``first`` where ``spacing`` agrees with it within :data:`SPACING_TOLERANCE`, else ``spacing``."""
    if spacing is None or first is None:
        return spacing
    return first if all(abs(a - b) <= SPACING_TOLERANCE * max(abs(b), 1e-9) for a, b in zip(spacing, first,
                                                                                          strict=True)) else spacing


def _off_line(members: Sequence[tuple[SampleRef, SliceGeometry]], slices: Sequence[tuple[float, int, int]],
              spacing: tuple[float, float] | None) -> str | None:
    """What is wrong where a slice lies off the line through the first and last slices by more
    than :data:`OFF_LINE_PIXELS` (the smaller pixel spacing; 1 mm without one): a slice shifted in
    its plane, which a volume would stack in line with the others. The line may slant (a gantry
    tilt shifts every slice by the same step); a slice is compared with the point of the line at
    its own depth along the normal."""
    if len(slices) < 3:
        return None
    positions = np.array([members[i][1].positions[frame] for _, i, frame in slices], dtype=np.float64)
    depths = np.array([depth for depth, _, _ in slices], dtype=np.float64)
    span = depths[-1] - depths[0]
    if span <= 0:
        return None
    along = (depths - depths[0]) / span
    expected = positions[0] + along[:, None] * (positions[-1] - positions[0])
    off = np.linalg.norm(positions - expected, axis=1)
    limit = OFF_LINE_PIXELS * (min(spacing) if spacing else 1.0)
    if float(off.max()) <= limit:
        return None
    at = int(np.argmax(off))
    return (f"{_slice_name(members, slices[at])} (slice {at + 1} along the slice normal) lies {off[at]:.3f} mm off "
            f"the line through the first and last slices' Image Position (Patient), more than {OFF_LINE_PIXELS:g} "
            f"pixel ({limit:.3f} mm): a slice shifted in its plane would be stacked where it is not; re-export the "
            "series, or remove the file")


def _duplicate_cause(members: Sequence[tuple[SampleRef, SliceGeometry]], one: tuple[float, int, int],
                     other: tuple[float, int, int]) -> str:
    """Why two slices (their (depth, file, frame) places) may share a position, as far as their
    headers tell: two files of one SOP Instance UID left in the series are different images
    (:func:`_one_per_instance` keeps one of a copy), which picking one of would mix them; two
    files whose headers tell them apart (:func:`_contrasts`: Echo Numbers, b-value, Image Type, ...)
    are two images of each position (echoes, b-values, magnitude and phase) that one stack cannot
    hold; else a file twice or a second acquisition."""
    (_, a), (_, b) = members[one[1]], members[other[1]]
    if one[1] == other[1]:  # frames of one multi-frame object: not a copy, nor another acquisition
        return _one_object(a, one[2], other[2], "at one place")
    if a.sop_uid and a.sop_uid == b.sop_uid:
        return (f"one SOP Instance UID shared by different images ({'; '.join(_differences(a, b))}), not one "
                "image exported twice: an export that gave each position one UID; export the series again "
                f"with a UID per image, or keep one image per position with the source's where:"
                f"{_keep(a, b) or ' (an Echo Numbers value, say)'}")
    told = _contrasts(a, b)
    if told and not _contrasts(a, b, times=False):  # their times alone: a time point of each
        return (f"two images of one position that their headers tell apart by their times alone ({'; '.join(told)}), "
                "not a file exported twice: several time points in one series (a perfusion or dynamic scan) or an "
                "acquisition repeated, which one stack cannot hold; keep one time point with the source's "
                f"where:{_keep(a, b)}, a source (or job) for each: a where: on a time keeps the images written "
                "with that one time (one time point; a time point whose slices each have their own time, one slice)")
    if told:
        kind = ("two acquisitions in one series" if len(told) == 1 and told[0].startswith("AcquisitionNumber ")
                else "several echoes, b-values, image types (magnitude and phase, original and derived), temporal "
                     "positions, frames of a dynamic series or tube voltages in one series")
        return (f"two images of one position that their headers tell apart ({'; '.join(told)}), not a file "
                f"exported twice: {kind}, which one stack cannot hold; keep one image per position with the source's "
                f"where:{_keep(a, b)}, a source (or job) for each")
    return "one file twice in the export, or two acquisitions in one series"


#: The header facts (:func:`_facts`) that tell two images of one position apart as a ``where:``
#: can keep one of them, in the order a record suggests them: Instance Number differs between
#: any two files, and rows, columns and kernel have been checked alike before positions are;
#: their times (:data:`~packer.read.dicom_series.IMAGE_TIMES`) last, where nothing else does
_CONTRASTS = (*IMAGE_IDENTITY[1:], "ImageType", "AcquisitionNumber")


def _time_facts(a: SliceGeometry, b: SliceGeometry) -> list[tuple[str, str, str]]:
    """The times of day of two files, by DICOM keyword, as :func:`_facts` gives its facts."""
    return list(zip(IMAGE_TIMES, a.times, b.times, strict=False))


def _contrasts(a: SliceGeometry, b: SliceGeometry, times: bool = True) -> list[str]:
    """What tells the images of two files at one position apart beyond their Instance Number
    (``EchoNumbers 1 against 2``), in :data:`_CONTRASTS` order; where nothing of those does (and
    ``times``), their Acquisition and Content Times that differ; ``[]`` where nothing does."""
    facts = {name: (x, y) for name, x, y in _facts(a, b) if x != y}
    told = [name for name in _CONTRASTS if name in facts]
    if not told and times:
        facts = {name: (x, y) for name, x, y in _time_facts(a, b) if x != y}
        told = [name for name in IMAGE_TIMES if name in facts]
    return [f"{name} {facts[name][0] or '(none)'} against {facts[name][1] or '(none)'}" for name in told]


def _image_type_value(mine: Sequence[str], theirs: Sequence[str]) -> str:
    """One value of Image Type ``mine`` that ``theirs`` lacks, as ``where: {ImageType: ...}`` keeps
    the images of ``mine`` by it: ORIGINAL where ``theirs`` is derived, else the first of value 3
    on (the image's flavour: M or P, TRACEW, ADC), else any; "" where none."""
    only = [(n, value) for n, value in enumerate(mine) if value and value not in theirs]
    ranked = sorted(only, key=lambda item: (item[1] != "ORIGINAL", item[0] < 2, item[0]))
    return ranked[0][1] if ranked else ""


def _keep(a: SliceGeometry, b: SliceGeometry) -> str:
    """The ``where:`` that keeps one of the images ``a`` and ``b`` and not the other (`` {EchoNumbers:
    1}``: ``a``'s value, ``b``'s where ``a`` has none), by the first of :data:`_CONTRASTS` that tells
    them apart; by Image Type, each side's value (`` {ImageType: ORIGINAL} (or {ImageType: TRACEW})``);
    where none does, by their times, quoted (`` {AcquisitionTime: '120002'}``); "" where nothing does."""
    for name, x, y in sorted(_facts(a, b), key=lambda f: _CONTRASTS.index(f[0]) if f[0] in _CONTRASTS else 99):
        if x == y or name not in _CONTRASTS:
            continue
        if name == "ImageType":
            mine, theirs = _image_type_value(a.image_type, b.image_type), _image_type_value(b.image_type,
                                                                                             a.image_type)
            if mine or theirs:
                shown = [f"{{ImageType: {v}}}" for v in (mine, theirs) if v]
                return f" {shown[0]}" + (f" (or {shown[1]})" if len(shown) > 1 else "")
            continue
        if x or y:
            return f" {{{name}: {x or y}}}"
    for name, x, y in _time_facts(a, b):  # a time is text: quoted (an unquoted 070000 is a YAML octal number)
        if x != y and (x or y):
            return f" {{{name}: '{x or y}'}}"
    return ""


def _frames_told(geometry: SliceGeometry, one: int, other: int) -> str:
    """What tells frames ``one`` and ``other`` of a multi-frame object apart, as far as their
    :data:`FRAME_IDENTITY` values do (" (StackID 1 against 2)"), or "" where none differs or its
    groups could not be read."""
    if len(geometry.frame_identity) <= max(one, other):  # () where its groups could not be read
        return ""
    told = [f"{name} {x or '(none)'} against {y or '(none)'}" for (_, name), x, y
            in zip(FRAME_IDENTITY, geometry.frame_identity[one], geometry.frame_identity[other], strict=True)
            if x != y]
    return " (" + "; ".join(told) + ")" if told else ""


def _one_object(geometry: SliceGeometry, one: int, other: int, how: str) -> str:
    """Why frames ``one`` and ``other`` of one multi-frame object (``geometry``) sit ``how`` (at one
    place, in different planes, that far apart) and what packs them: there is no file to remove
    or restore, as there is in a folder of single-frame files."""
    return (f"two frames of one multi-frame object {how}: several temporal positions, echoes or stacks in one "
            f"object{_frames_told(geometry, one, other)}, which one stack cannot hold; pack its frames one sample "
            "each in a job with sample: slice and frames: split")


def _slice_name(members: Sequence[tuple[SampleRef, SliceGeometry]], place: tuple[float, int, int]) -> str:
    """A slice of ``members`` (its (depth, file, frame) place) as a record names it: the file, and
    its frame where the file holds several, 0-based as its sample key (``-f0002``) and
    ``metadata.frame`` count (it said frame 3 of key -f0002)."""
    ref, geometry = members[place[1]]
    return f"{ref.path} frame {place[2]}" if geometry.frames > 1 else ref.path


def volume_size(series: Series, cfg: DicomTransformConfig) -> tuple[int, int, int]:
    """(D, H, W) of the volume ``series`` makes under ``cfg``, before any crop or pad, from the
    headers alone (for ``limits.max_voxels``, before a pixel is decoded)."""
    return resampled_shape((len(series.slices), series.rows, series.columns), series.affine(), cfg.volume_spacing)


def volume_shrinks(series: Series, cfg: DicomTransformConfig) -> str | None:
    """What is wrong where ``volume.spacing`` would leave the volume of ``series`` under 2 voxels
    along an axis it stacks 2 or more along (``None`` where it does not): a Pixel Spacing written
    in metres (0.0005 for 0.5 mm) shrinks a slice to one voxel, which ``size`` scales back up as
    an image of one level, packed silently. Names the header value that sets that axis' mm."""
    if cfg.volume_spacing is None:
        return None
    shape = (len(series.slices), series.rows, series.columns)
    stacked = resampled_shape(shape, series.affine(), None)
    resampled = volume_size(series, cfg)
    order = canonical_order(series.affine())
    for axis, (before, after) in enumerate(zip(stacked, resampled, strict=True)):
        if after < 2 <= before:
            source = order[axis]
            step = float(np.linalg.norm(series.affine()[:3, source]))
            what = (f"its slices' step of {step:g} mm along the normal (Image Position (Patient))" if source == 0
                    else f"its slices' (0028,0030) Pixel Spacing {list(series.pixel_spacing or ())} mm")
            return (f"{what} resampled to sample.volume.spacing {list(cfg.volume_spacing)} mm turns its "
                    f"{'×'.join(map(str, stacked))} voxels into {'×'.join(map(str, resampled))}: under 2 along "
                    f"axis {'dhw'[axis]}, the image ({before} × {step:g} mm) would be gone; a value written in "
                    "metres or cm, not mm? fix the header")
    return None


def volume_resamples(series: Series, cfg: DicomTransformConfig) -> bool:
    """Whether the volume ``series`` makes under ``cfg`` is resampled: its slices lie off the
    uniform grid (:func:`off_grid`), or ``volume.spacing`` changes a size. Its slices are then
    rendered unrounded (``cfg.unrounded``) and the volume quantised once, after the resample
    (:func:`~packer.transform.volume.build_volume`); a volume on its slices' own grid is stacked
    from their levels, as before."""
    if cfg.volume_spacing is not None and volume_size(series, cfg) != resampled_shape(
            (len(series.slices), series.rows, series.columns), series.affine(), None):
        return True
    return off_grid(series) is not None


def one_slice_depth_note(axis: int, spacing: float) -> str:
    """A volume's warning where its series is one slice whose header gives no depth: the 1 mm
    assumed, and where the record holds it. The slice's normal is the stack's D, but the volume
    is made canonical, so a sagittal or coronal slice's normal ends on another voxel axis
    (``axis``: 0, 1, 2 for d, h, w; ``metadata.volume.affine``'s column of that index), whose
    ``spacing`` is 1 mm unless ``volume.spacing`` resampled it."""
    held = "say 1 mm" if abs(spacing - 1.0) < 1e-6 else f"say {spacing:g} mm, resampled from it"
    return (f"one slice without Spacing Between Slices or Slice Thickness: its depth spacing of 1 mm is assumed "
            f"(along the slice's normal, voxel axis {'dhw'[axis]}: the affine's {('first', 'second', 'third')[axis]} "
            f"column and volume.spacing[{axis}] {held})")

#: How a slice's ``metadata.warnings`` says it is constant, packed as its series' context (the
#: build counts these notes: the manifest's ``inputs.constant_slices``)
CONSTANT_SLICE = "constant slice"


def constant_slice_note(why: str) -> str:
    """The warning a constant slice of a series carries (``why``: which value every pixel has)."""
    return f"{CONSTANT_SLICE}: {why}; packed as context of its series"


def is_constant_note(warning: str) -> bool:
    """True for a :func:`constant_slice_note`."""
    return warning.startswith(CONSTANT_SLICE + ":")


#: How a sample's unit of values reaches the build as a note (file id, text), as its readers'
#: warnings do (:func:`units_note`); not a warning of its own
UNITS_NOTE = "values in units: "


def units_note(metadata: dict[str, Any]) -> str | None:
    """The note of a sample whose values are in one of several units its modality may have (a PET
    slice's Units (0054,1001), ``metadata.pet_units``: BQML, GML for SUVbw, CNTS, ...), from
    which the build warns of a job that packs values of two units together; None for any other."""
    unit = metadata.get("pet_units")
    return f"{UNITS_NOTE}PT {unit}" if unit else None


def is_units_note(text: str) -> bool:
    """True for a :func:`units_note`."""
    return text.startswith(UNITS_NOTE)


def is_constant_slice(sample: Sample) -> bool:
    """True for a series' slice whose every pixel is equal (its :func:`constant_slice_note`)."""
    return any(is_constant_note(str(w)) for w in sample.metadata.get("warnings", ()))


def stack_volume(slices: Sequence[Sample], series: Series, cfg: DicomTransformConfig) -> list[Sample]:
    """One sample of a whole series: its slices (each C×H×W, windowed, at native size: levels, or
    float32 unrounded values where the volume is resampled, :func:`volume_resamples`) stacked
    to C×D×H×W, made canonical, resampled and cropped or padded (:mod:`packer.transform.volume`),
    with the affine and spacing in its metadata (``volume.slices``: the packed depth D, as a
    NIfTI volume's; ``volume.series_slices``: the series' slice count). Keyed by its first file's sample id; its
    ``volume.constant_slices``: how many slices are constant (present only when some are; each
    slice's own note is its file's, not the volume's warning)."""
    stacked = np.stack([s.image for s in slices], axis=1)
    irregular = off_grid(series)
    # a resampled volume's slices come unrounded (float32, :func:`volume_resamples`): quantised once, resampled
    volume = build_volume(stacked, series.affine(), spacing=cfg.volume_spacing, size=cfg.volume_size,
                          positions=None if irregular is None else irregular[0],
                          fill=volume_blacks(stacked, slices[0].metadata, cfg.output),
                          output=cfg.output if stacked.dtype == np.float32 else None)
    first = slices[0]
    about: dict[str, object] = {
        # slices: the packed depth D, as a NIfTI volume's; series_slices: how many the series had (what
        # constant_slices and slice_rescale count), D only for an axial series packed on its own grid
        "slices": int(volume.array.shape[1]), "series_slices": len(slices),
        "affine": [[round(float(v), 6) for v in row] for row in volume.affine],
        "spacing": [round(v, 6) for v in volume.spacing], "layout": "CDHW", "frame": "LPS"}
    constant = sum(is_constant_slice(s) for s in slices)
    if constant:
        about["constant_slices"] = constant
    stats = slice_statistics(slices)
    if stats is not None:  # each slice normalised, or windowed by its file, on its own: every slice's, in order
        about["slice_windows"] = stats
    rescales = slice_rescale(slices)
    if rescales is not None:
        about["slice_rescale"] = rescales
    metadata = {**first.metadata, "volume": about, **({} if rescales is None else NO_ONE_RESCALE)}
    warnings = [w for w in metadata.pop("warnings", ()) if not is_constant_note(str(w))]
    if series.depth_assumed:
        axis = canonical_order(series.affine()).index(0)  # the output axis the stack's D became
        warnings.append(one_slice_depth_note(axis, volume.spacing[axis]))
    if irregular is not None:
        warnings.append(off_grid_note(irregular[1], series))
    if warnings:
        metadata["warnings"] = warnings
    metadata.pop("frame", None)
    return [replace(first, key=series.refs[0].sample_id, ref=series.refs[0], image=volume.array,
                    metadata=metadata)]


#: A volume's slices are taken to lie on the uniform grid between its first and last slice
#: (the affine's step) while none is further from it than this fraction of the step: positions
#: written as DS (16 characters) and table positions rounded to hundredths of a mm stay on it, so
#: a regular series is stacked as read, and an offset this small moves anatomy by a hundredth of
#: a voxel, far less than the blur of resampling it away would cost. Further off (steps
#: irregular within ``series.gap_tolerance``), stacking by index would misplace slices by up
#: to a step: the slices are resampled onto the grid from where they are (:func:`off_grid`).
OFF_GRID_FRACTION = 0.01


def off_grid(series: Series) -> tuple[np.ndarray, float] | None:
    """Where the slices of ``series`` lie along the normal, in steps of its uniform grid from the
    first (0 .. n-1: the positions :func:`~packer.transform.volume.build_volume` resamples from),
    and the largest distance in mm of a slice from that grid, where one lies further from it
    than :data:`OFF_GRID_FRACTION` of the step; None for a series on its grid (every regular one)."""
    if len(series.steps) < 2:
        return None
    depths = np.concatenate([[0.0], np.cumsum(np.asarray(series.steps, dtype=np.float64))])
    step = float(depths[-1]) / (len(depths) - 1)
    if step <= 0:
        return None
    offset = float(np.abs(depths - step * np.arange(len(depths))).max())
    if offset <= OFF_GRID_FRACTION * step:
        return None
    return depths / step, offset


#: How a volume's ``metadata.warnings`` says its slices were resampled onto a uniform grid
OFF_GRID = "irregular slice positions"


def off_grid_note(offset: float, series: Series) -> str:
    """The warning of a volume whose slices lay off the uniform grid (:func:`off_grid`): by how
    much, and what was done about it."""
    steps = [float(s) for s in series.steps]
    return (f"{OFF_GRID}: its {len(series.slices)} slices lie up to {offset:.3f} mm from the uniform grid between "
            f"the first and last ({sum(steps) / len(steps):.3f} mm a step; steps {min(steps):.3f} to "
            f"{max(steps):.3f} mm); resampled along the slice normal onto that grid by linear interpolation between "
            "the two true neighbouring slices (a mask: the nearest true slice), so metadata.volume.affine places "
            "every voxel where it is")


def volume_blacks(stacked: np.ndarray, metadata: dict[str, Any], output: str) -> list[float]:
    """Each channel's black in a C×D×H×W stack of windowed slices (``metadata``: the first
    slice's), which a volume's padding takes (README, Transforms step 5, as a frame's): 0 for a
    window and percentiles (and under ``uint8``/``uint16`` and for colour); a z-score over all
    voxels, the volume's lowest z-score (each slice's own, its padding already its lowest);
    float16 modality values with no window, the volume's smallest value, its largest for
    MONOCHROME1 (or MONOCHROME2 under Presentation LUT Shape INVERSE: the slice records
    ``presentation_lut_shape``), which displays black once inverted (a slice's padding already
    holds its own)."""
    channels = stacked.shape[0]
    photometric = str(metadata.get("photometric_interpretation", "") or "")
    if output != "float16" or photometric not in ("", "MONOCHROME1", "MONOCHROME2") or stacked.size == 0:
        return [0.0] * channels
    windows = metadata.get("windows") or []
    if not windows and channels == 1:  # modality values, no window
        inverted = photometric == "MONOCHROME1" or metadata.get("presentation_lut_shape") == "INVERSE"
        return [float(stacked.max() if inverted else stacked.min())]
    return [float(stacked[c].min()) if isinstance(w, dict) and w.get("source") == "zscore" and w.get("over") == "all"
            else 0.0 for c, w in enumerate(windows[:channels])] + [0.0] * max(0, channels - len(windows))


def slice_statistics(slices: Sequence[Sample]) -> list[Any] | None:
    """Each slice's ``metadata.windows`` where the slices were not all read through one window:
    a window normalised each (percentiles or a z-score: its statistics, ``count`` among them, are
    that slice's own), or the files' own windows differ between slices (``windows: [file]`` over
    a series whose slices, or an enhanced object's frames, carry their own Window Center/Width).
    None otherwise: one window read every slice alike, and the sample's own record (its first
    slice's) says all."""
    windows = [s.metadata.get("windows") for s in slices]
    normalised = any(isinstance(w, dict) and "count" in w for listed in windows if isinstance(listed, list)
                     for w in listed)
    return windows if normalised or any(w != windows[0] for w in windows[1:]) else None


#: What a sample's own ``rescale_slope`` and ``rescale_intercept`` say where its slices (a volume's,
#: a neighbour stack's, a stacked file's frames) have different ones: no one value holds for all,
#: so none is recorded there, only each slice's (:func:`slice_rescale`)
NO_ONE_RESCALE: dict[str, Any] = {"rescale_slope": None, "rescale_intercept": None}


def slice_rescale(slices: Sequence[Sample]) -> list[list[float | None]] | None:
    """Each slice's ``[Rescale Slope, Rescale Intercept]`` (PS3.3 C.11.1: stored value × slope +
    intercept is the modality value; ``[null, null]`` for a slice read through a Modality LUT or
    without a modality transform) where the slices do not all share one: a PET series, whose
    every slice has its own slope, so that levels or float16 values can be mapped back slice by
    slice. None where one pair holds for every slice: the sample's own record says it."""
    pairs = [[s.metadata.get("rescale_slope"), s.metadata.get("rescale_intercept")] for s in slices]
    return pairs if any(p != pairs[0] for p in pairs[1:]) else None


def stack_neighbors(slices: Sequence[Sample], steps: Sequence[float], k: int, edge: str) -> list[Sample]:
    """Each of ``slices`` (one series, or one volume's slices, in order) as a sample whose
    channels are its slices ``-k .. +k``, each with its windows; ``edge``: ``replicate`` repeats
    the end slice where a neighbour is missing, ``skip`` makes no sample of a slice without all
    its neighbours. Every slice must have the same shape (a series has one grid). A sample keeps
    its centre slice's key, metadata and mask."""
    out = []
    offsets = np.concatenate([[0.0], np.cumsum(steps)])
    for i, centre in enumerate(slices):
        if edge == "skip" and (i - k < 0 or i + k >= len(slices)):
            continue
        chosen = [min(max(i + d, 0), len(slices) - 1) for d in range(-k, k + 1)]
        image = np.ascontiguousarray(np.concatenate([slices[j].image for j in chosen], axis=0))
        neighbours: dict[str, Any] = {"k": k, "edge": edge, "slice": i, "slices": len(slices),
                                      "offsets_mm": [round(float(offsets[j] - offsets[i]), 4) for j in chosen],
                                      "channels_per_slice": int(centre.image.shape[0])}
        stats = slice_statistics([slices[j] for j in chosen])
        if stats is not None:  # each slice of the stack normalised or windowed on its own: every slice's
            neighbours["windows"] = stats
        rescales = slice_rescale([slices[j] for j in chosen])
        if rescales is not None:  # the stack's slices of different slopes (PET): every slice's, in the stack's order
            neighbours["rescale"] = rescales
        out.append(replace(centre, image=image, metadata={**centre.metadata, "neighbors": neighbours,
                                                          **({} if rescales is None else NO_ONE_RESCALE)}))
    return out
