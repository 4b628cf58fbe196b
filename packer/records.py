"""Plain records that flow between pipeline stages (and pickle to dask workers).

A raw file is described by a :class:`SampleRef`; reading and transforming it yields
one or more :class:`Sample` (several for multi-frame files or tiles) or exactly one
:class:`Issue`, the bad-sample record. Nothing in between returns ``None``. The pixel pass
spills each sample's bytes and returns a :class:`SpilledSample` for it to the client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

#: Stages a bad-sample record can come from, in pipeline order.
STAGES = ("discover", "read", "validate", "split", "transform", "pack")

#: Every reason code a bad-sample record may carry. ``schemas/bad_sample.schema.json``
#: lists the same codes; a test keeps them in step.
REASONS = (
    "unreadable",
    "not_dicom",
    "no_pixel_data",
    "decode_failed",
    "truncated",
    "bad_shape",
    "bad_geometry",
    "bad_dtype",
    "non_finite",
    "constant_image",
    "missing_label",
    "unknown_label",
    "bad_target",
    "mask_missing",
    "mask_unreadable",
    "mask_size",
    "mask_values",
    "mask_empty",
    "mask_geometry",
    "mask_overlap",
    "annotation_orphan",
    "annotation_unmapped",
    "annotation_frames",
    "contour_off_slice",
    "channel_geometry",
    "series_no_position",
    "series_orientation",
    "series_geometry",
    "series_duplicate_position",
    "series_gap",
    "series_too_short",
    "series_localizer",
    "series_kernels",
    "series_mixed",
    "series_incomplete",
    "missing_entity",
    "missing_time",
    "not_in_split",
    "missing_file",
    "ambiguous_path",
    "join_unmatched",
    "missing_window",
    "unsupported",
    "unsupported_transfer_syntax",
    "unsupported_dimensions",
    "too_large",
    "outside_root",
    "burned_in_annotation",
    "decoder_crash",
    "unexpected_error",
)

_KEY_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


def safe_key(text: str) -> str:
    """Turn ``text`` into a tar-member-safe key part: ``[A-Za-z0-9_-]`` only, no dots."""
    return _KEY_SAFE.sub("_", text).strip("_") or "x"


@dataclass(frozen=True, slots=True)
class SampleRef:
    """One raw file the job will read, with everything known before decoding it.

    ``path`` is absolute, or the full URL of a file behind an fsspec URL (``s3://...``);
    ``relpath`` is POSIX and relative to the source root.
    ``label``, ``entity`` and ``time`` are ``None`` only on refs that end as issues.
    ``maybe_label_map``: why discovery's name rules take the file for a label map without being
    sure (``name ending '_seg'``: a segmentation word whose prefix names no image, beside an image
    of its folder), for its kind's header read to decide
    (:attr:`packer.read.kinds.SourceKind.label_maps_by_content`); None for every other file.
    """

    sample_id: str
    source: str
    kind: str
    path: str
    relpath: str
    label: str | None = None
    entity: str | None = None
    time: str | None = None
    extra: tuple[tuple[str, str], ...] = ()
    maybe_label_map: str | None = None


#: SampleRef's field names, in order.
REF_FIELDS = tuple(f.name for f in fields(SampleRef))


@dataclass(frozen=True)
class Issue:
    """A bad-sample record: which file, which stage, which reason code, and why."""

    sample_id: str
    path: str
    stage: str
    reason: str
    message: str

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r}; expected one of {STAGES}")
        if self.reason not in REASONS:
            raise ValueError(f"unknown reason {self.reason!r}; expected one of {REASONS}")

    @classmethod
    def of(cls, ref: SampleRef, *, stage: str, reason: str, message: str) -> Issue:
        return cls(sample_id=ref.sample_id, path=ref.path, stage=stage, reason=reason, message=message)

    def to_json(self) -> dict[str, str]:
        return {
            "sample_id": self.sample_id,
            "path": self.path,
            "stage": self.stage,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True)
class MemberIssue:
    """A file's :class:`Issue` from the header pass, with the group its header still names (a
    DICOM file's entity, study and series UIDs): the group is not packed without the file (a
    series would pack one slice short, and a volume with a zero slice in its place), unless
    :attr:`holds` says otherwise."""

    issue: Issue
    group: tuple[str, ...]
    #: The UIDs an annotation may reference the file by (a DICOM image's Series and SOP Instance
    #: UIDs): where no group of the file is made, its annotation gets this file's reason, not an
    #: orphan's (:func:`packer.read.dicom_masks.link`)
    names: tuple[str, ...] = ()
    #: Whether ``group`` is held back without the file (False: a file refused for its own label,
    #: entity or time, which its group packs without)
    holds: bool = True


#: Why a file is left out of the dataset without being a bad sample (counted and listed, never
#: packed, never against ``max_bad_fraction``): ``not_in_table`` (a ``files: table`` source's
#: file its table does not name), ``filtered`` (a row or header a ``where:`` condition leaves
#: out), ``not_image`` (a DICOM object without an image: SR, presentation state, RT plan, ...),
#: ``not_requested`` (an image object a job packs only when its ``where:`` asks: RT Dose, a
#: secondary capture), ``annotation`` (a SEG or RTSTRUCT read as its series' mask),
#: ``label_conflict`` (a sample of a duplicate group whose targets disagree, left out with the
#: whole group by ``split.duplicates.label_conflict: drop_group``), ``not_downloaded`` (a table
#: row naming no file under the root, under the table's ``missing: drop``: a partial download),
#: ``unsupported_format`` (a file of a format its source's kind finds but does not read: a WebP or
#: GIF under an image source, an NRRD or MGZ volume under a NIfTI source; its detail says how to
#: convert it), ``label_map`` (a file of a source without a table whose folder or name marks it
#: as a mask or label map), ``straddles_cutoff`` (a record of an entity that straddles a time
#: split's cutoff, left out by ``split.entity_policy: drop_straddlers``; stage ``split``).
EXCLUSIONS = ("not_in_table", "filtered", "not_image", "not_requested", "annotation", "label_conflict",
              "not_downloaded", "unsupported_format", "label_map", "straddles_cutoff", "folder_link")


@dataclass(frozen=True)
class Excluded:
    """A file left out on purpose: its path (or URL), the stage that decided, why
    (:data:`EXCLUSIONS`) and a detail a person can act on (``ViewPosition is LL``,
    ``Modality SR (Basic Text SR Storage)``). ``modality`` and ``sop_class`` (its name): what a
    DICOM file's header says, for the counts per modality and SOP class; empty elsewhere."""

    sample_id: str
    path: str
    stage: str
    why: str
    detail: str
    modality: str = ""
    sop_class: str = ""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r}; expected one of {STAGES}")
        if self.why not in EXCLUSIONS:
            raise ValueError(f"unknown exclusion {self.why!r}; expected one of {EXCLUSIONS}")

    def to_json(self) -> dict[str, str]:
        out = {"sample_id": self.sample_id, "path": self.path, "stage": self.stage, "why": self.why,
               "detail": self.detail}
        if self.modality:  # a table row's exclusion has no header
            out["modality"] = self.modality
        if self.sop_class:
            out["sop_class"] = self.sop_class
        return out

    @classmethod
    def of(cls, ref: SampleRef, *, stage: str, why: str, detail: str, modality: str = "",
           sop_class: str = "") -> Excluded:
        return cls(sample_id=ref.sample_id, path=ref.path, stage=stage, why=why, detail=detail, modality=modality,
                   sop_class=sop_class)


@dataclass(frozen=True)
class Sample:
    """A transformed, training-ready sample: ``image`` is C×H×W (uint8 by default).

    ``key`` is the sample id, suffixed for frames (``-f0007``), pages (``-p00002``) or tiles
    (``-t00128_00512``): the grammar of :mod:`packer.keys`.
    ``metadata`` holds JSON-serialisable values only.
    """

    key: str
    ref: SampleRef
    image: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The segmentation mask, F×H×W class ids on the image's H×W grid (F: 1, or the frames of
    #: a ``frames: stack`` sample), where the source has masks
    mask: np.ndarray | None = None
    #: A digest of the stored pixels the sample was rendered from, where its reader knows them
    #: (:func:`packer.read.dicom_render.stored_digest`; ``""`` elsewhere): two samples with equal
    #: ones are exact duplicates whatever each was windowed to
    stored_digest: str = ""
    #: A digest of the object's globally unique id where its reader knows one (a DICOM slice's
    #: SOP Instance UID, :func:`packer.read.dicom_render.instance_digest`; ``""`` elsewhere and in
    #: series jobs): two entities' files with one are a mix-up the build warns of
    instance: str = ""
    #: Where the source image lies in ``image``'s H×W as (top, left, height, width), where the
    #: rest is padding (``resize: fit``'s letterbox; :attr:`packer.transform.image.Tile.content`),
    #: ``None`` where it fills the output: near-copy evidence is drawn from this box alone
    #: (:func:`packer.pipeline.nearcopy.packed_signature`). Not packed.
    content: tuple[int, int, int, int] | None = None


@dataclass(frozen=True, slots=True)
class SpilledSample:
    """One transformed sample whose bytes sit in a spill file: ``pixels`` then ``metadata`` JSON.

    ``signature``/``sig_row``: the chunk's signature file in the build cache and this sample's row
    in it (its thumbnail and embeddings for the near-copy check, :mod:`packer.pipeline.nearcopy`); ``""``
    and -1 where none was made (``validate --quick``)."""

    key: str
    ref: SampleRef
    spill: str
    offset: int
    pixel_bytes: int
    meta_bytes: int
    shape: tuple[int, ...]
    dtype: str
    #: What ``_index.parquet`` records for the sample in the job's shard format
    #: (:func:`packer.shards.encode.pixels_digest`); exact duplicates are grouped by it
    sha256: str
    signature: str = ""
    sig_row: int = -1
    #: Bytes of the sample's mask (``.npy``), after its metadata in the spill; 0 without one
    mask_bytes: int = 0
    #: sha256 (hex) of the sample's metadata JSON bytes then its mask bytes, as spilled: with
    #: ``sha256`` it fixes every byte the pack pass copies of this sample, so a planned shard's
    #: content key (:mod:`packer.pipeline.reuse`) needs no spill read; ``""`` in a cache entry
    #: written before it existed (its shards are then written, never reused)
    meta_sha256: str = ""
    #: xxh3-64 of the pixel bytes as spilled (:func:`packer.pipeline.spill.pixels_check`): what a
    #: later build's reuse checks the bytes against where they are now, instead of hashing them
    #: with sha256 again; 0 in a cache entry written before it was recorded (sha256 is checked then)
    pixels_xxh3: int = 0
    #: :attr:`Sample.stored_digest` of the sample (``""`` where its reader knows no stored pixels)
    stored_digest: str = ""
    #: Every packed pixel holds one value (a white background tile, a black frame): such samples
    #: share their digest with every other blank one of the same shape while showing nothing of
    #: an image, so they are no duplicate evidence (:func:`packer.pipeline.dedup.exact_groups`)
    blank: bool = False
    #: :attr:`Sample.instance` of the sample (``""`` where its reader knows no unique id)
    instance: str = ""

    @property
    def nbytes(self) -> int:
        return self.pixel_bytes + self.meta_bytes + self.mask_bytes
