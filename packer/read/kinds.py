"""Source kinds: what packer can read, one registered class per kind, each answering the same questions.

A source kind (``kind:`` of a source in the job file) is a subclass of :class:`SourceKind` in a
module of this package whose name ends in ``_kind`` (``dicom_kind.py``, ``image_kind.py``,
``nifti_kind.py``); the module registers an instance with :func:`register` when it is imported,
and :func:`source_kind` imports every such module the first time it is asked. The rest of
packer never compares kind strings: discovery asks a kind what it lists and where its table is,
the probe and the pixel pass ask it to probe and read a file, the checks ask it what a sample
must look like, the raw store asks which bytes its probe reads, and the HTML report asks how its
channels are shown. A stage that needs more of a kind (DICOM series assembly) gets it through
:meth:`SourceKind.grouping`. ``docs/ARCHITECTURE.md`` shows how to add a kind.

The questions, in the order a file meets them:

========================= ============================================================ ===========
question                  answered by                                                  runs on
========================= ============================================================ ===========
what does it list?        :meth:`~SourceKind.lists` (suffix) and :meth:`~SourceKind.sniff` client
what can it not read?     :meth:`~SourceKind.unsupported` (its family's other formats) client
what does its job say?    :meth:`~SourceKind.parse_settings` (``transform.<kind>``),   client
                          :meth:`~SourceKind.parse_source` (its own source keys),
                          :meth:`~SourceKind.check_job`
what does its header say? :meth:`~SourceKind.probe` (identity, limits; no pixels)      worker
what are its samples?     :meth:`~SourceKind.read`, :meth:`~SourceKind.attach_masks`   worker
what must a sample be?    :meth:`~SourceKind.expected_dtype`, ``expected_size``, ...   worker
grouped before decoding?  :meth:`~SourceKind.grouping` (:class:`Grouping`)             both
which bytes are a header? :meth:`~SourceKind.rehearse_probe` (remote raw files)        worker
how is it shown?          :meth:`~SourceKind.rgb_channels`                             report
========================= ============================================================ ===========
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from packer.errors import ConfigError
from packer.records import Excluded, Issue, MemberIssue, Sample, SampleRef
from packer.transform.channels import match_channels
from packer.where import Condition

if TYPE_CHECKING:
    from packer.config import JobConfig, LimitsConfig, SourceConfig

class RangedFile(Protocol):
    """A read-only binary file of known ``size``: ``read_at(offset, count)`` (fewer at the end),
    and ``read``/``seek``/``tell`` as a local file (what pydicom and the image probe read from)."""

    size: int

    def read_at(self, offset: int, count: int) -> bytes: ...

    def read(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def tell(self) -> int: ...


_REGISTRY: dict[str, SourceKind] = {}
_LOADED = False


@dataclass(frozen=True)
class Probed:
    """What a header probe learnt of one file: ``ref`` with the identity the header gives
    (entity, time) filled in; ``state``: what :meth:`SourceKind.read` may reuse (a parsed file)
    or a :class:`Grouping`'s placement facts, None otherwise; ``attribute``: the value of the
    source's label attribute (``label: {attribute: ...}``), where the kind reads one;
    ``time_note``: where the header gave no time, why (the values it could not read and what to
    do), for the file's ``missing_time`` record under a split by time."""

    ref: SampleRef
    state: Any = None
    attribute: str | None = None
    time_note: str | None = None


class SourceKind:
    """One kind of raw source. Subclass it in a ``read/<name>_kind.py`` module, set the class
    attributes, override what differs, and ``register(YourKind())`` at the module's end.

    Class attributes:

    - ``name``: the ``kind:`` value in the job file, and ``SampleRef.kind``.
    - ``table_key``: the source key naming its label table (``labels`` for DICOM, whose entity
      and time come from headers; ``table`` otherwise); the other key is refused.
    - ``table_columns``: the columns a table of this kind has, as its error messages name them.
    - ``identity_in_header``: entity and time come from each file's header (``probe``), not from
      table columns; a table-less source of a kind without it gives each file its own entity.
    - ``default_entity``, ``default_time``: what ``entity:`` and ``time:`` default to.
    - ``attribute_labels``: a class label may come from a header attribute (``label: {attribute}``).
    - ``pseudonymize_by_default``: a job with a source of this kind pseudonymizes unless it says
      ``phi.mode: keep`` (its headers carry patient identifiers).
    - ``always_recorded``: its ``transform.<name>`` settings are in every job's identity, used or
      not (DICOM and images: every dataset built before the registry recorded both, and their
      ``config_hash`` must not move); other kinds' settings are recorded only where a source uses
      the kind.
    - ``looked_for``: what an empty listing says it looked for.
    """

    name: ClassVar[str]
    table_key: ClassVar[str] = "table"
    table_columns: ClassVar[str] = "path,label,entity,timestamp"
    identity_in_header: ClassVar[bool] = False
    default_entity: ClassVar[str] = "entity"
    default_time: ClassVar[tuple[str, ...]] = ("timestamp",)
    attribute_labels: ClassVar[bool] = False
    pseudonymize_by_default: ClassVar[bool] = False
    always_recorded: ClassVar[bool] = False
    looked_for: ClassVar[str] = ""
    #: Bytes of a file's head :meth:`sniff` needs (0: the suffix alone decides)
    head_bytes: ClassVar[int] = 0
    #: The source keys of the job file only this kind reads (:meth:`parse_source`); a source of
    #: another kind that sets one is refused, naming the kinds that take it
    source_keys: ClassVar[tuple[str, ...]] = ()
    #: Its masks are label maps of volumes, which may be resampled to their image's grid
    #: (``mask.grid: resample``); other kinds' masks are 2-D files on the image's stored size
    volume_masks: ClassVar[bool] = False
    #: Its sources may read their masks from annotation objects among their own files
    #: (``mask: {from: dicom}``: DICOM SEG and RTSTRUCT, :mod:`packer.read.dicom_masks`)
    annotation_masks: ClassVar[bool] = False
    #: Its file names can mark a file as a mask or label map rather than an image (``masks/``,
    #: ``labelsTr/``, ``*_seg.nii.gz``, ``*_mask.png``): without a table such files are left out
    #: (``label_map``, :func:`packer.pipeline.discover.mask_named`), never packed as images
    names_masks: ClassVar[bool] = False
    #: Its probe tells a label map from an image by the file's header and values: a file that
    #: only the weak name rule takes for a label map (a segmentation word whose prefix names no
    #: image, beside an image of its folder: :func:`packer.pipeline.discover.label_map_candidate`)
    #: is listed with :attr:`~packer.records.SampleRef.maybe_label_map` set, for its probe to
    #: decide, instead of being left out by its name
    label_maps_by_content: ClassVar[bool] = False
    #: Each file is a unit of work of its own (a volume: seconds of inflating and resampling), so
    #: the pixel pass gives it a chunk of its own instead of cutting files into content-defined
    #: chunks of about 32: the workers then share the files one by one
    file_per_task: ClassVar[bool] = False
    #: The libraries whose versions shape this kind's samples beyond packer's own (recorded in the
    #: manifest and the cache key of a job that uses the kind: ``nibabel`` for NIfTI)
    libraries: ClassVar[tuple[str, ...]] = ()
    #: The parts a sample key of this kind's files may carry after the file id
    #: (:func:`packer.keys.make_key`): ``frame`` (a frame or slice of a file), ``page``, ``tile``
    key_parts: ClassVar[frozenset[str]] = frozenset()

    #: How many first bytes of a file :meth:`file_key_parts` and :meth:`file_format` look at (0:
    #: the kind alone tells which parts its files' keys carry)
    key_head_bytes: ClassVar[int] = 0

    def makes_tile(self, job: JobConfig, tile: tuple[int, int]) -> bool:
        """Whether a file of this kind can make the tile whose top-left pixel is ``tile``
        under ``job`` (``packer locate`` refuses keys no reader makes). None are tiled here."""
        return False

    def nearest_tile(self, job: JobConfig, tile: tuple[int, int]) -> tuple[int, int] | None:
        """The top-left pixel of the tile ``job`` cuts nearest ``tile`` (one it does not cut) at or
        above and left of it, for ``packer locate`` to name a key that exists; None where the job
        cuts no tiles."""
        return None

    def file_key_parts(self, head: bytes) -> frozenset[str]:
        """The parts the sample keys of one file of this kind may carry, where its format (from
        its first :attr:`key_head_bytes` bytes, ``head``) decides them, as a TIFF alone has
        pages: :attr:`key_parts` here, whatever the file."""
        return self.key_parts

    def file_format(self, head: bytes) -> str | None:
        """The format a file of this kind is in as its reader tells it from ``head`` (``PNG``),
        for messages; None where the kind has one format or the head names none."""
        return None

    # -- listing (client) -------------------------------------------------------------------
    def lists(self, suffix: str) -> bool | None:
        """Whether a file whose lower-cased suffix is ``suffix`` (``.dcm``, ``.gz``, ``""``) is one
        of this kind's: True, False, or None when only its first :attr:`head_bytes` can tell
        (:meth:`sniff`). ``suffix`` of ``x.nii.gz`` is ``.gz``; :meth:`lists_name` sees the name."""
        raise NotImplementedError

    def lists_name(self, name: str, suffix: str) -> bool | None:
        """:meth:`lists` for a file named ``name`` (lower case, no folder); override where the
        suffix alone cannot tell (``.nii.gz``)."""
        return self.lists(suffix)

    def sniff(self, head: bytes) -> bool:
        """Whether a file whose :meth:`lists` verdict was None is one, from its first bytes."""
        return False

    def unsupported(self, name: str, suffix: str) -> str | None:
        """For a file this kind does not list (named ``name``, lower case, no folder; ``suffix``
        as :meth:`lists` gets it): where it is a file of this kind's family that packer cannot
        read (a WebP image under an image source), what it is and what to do, as the detail of its
        ``unsupported_format`` record in ``excluded.jsonl`` (nothing is left out unsaid). None
        (the default) for a file that is none of the kind's (``README.txt``, ``labels.csv``): it
        stays unlisted."""
        return None

    def lists_unread(self, name: str, suffix: str) -> bool:
        """Whether a file whose name could not tell (:meth:`lists` gave None) and whose first
        bytes could not be read (a broken link, a loop of links, no read permission, a named
        pipe) is listed all the same, so that the read names its defect (``missing_file``,
        ``unreadable``) as it does for a file named as this kind's: True for a name that would be
        one of the kind's by its bytes (an extension-less ``IMAGES/IM0035`` in a DICOM export).
        False (the default): such a file stays unlisted, or is told by its name (:meth:`unsupported`)."""
        return False

    def unrecognised(self, name: str, suffix: str, head: bytes) -> str | None:
        """For a file whose name could not tell (:meth:`lists` gave None) and whose ``head``
        (its first :attr:`head_bytes`, fewer for a shorter file; for a ``.gz``, ``.bz2`` or ``.xz``
        file, the first bytes of its decompressed stream) :meth:`sniff` refused: where
        such a file is most likely a damaged or unreadable one of this kind's (an empty ``IM0035``
        in a DICOM export), what it is and what to do, as the detail of its ``unsupported_format``
        record; None (the default) where it is most likely some other file, left unlisted."""
        return None

    # -- the job file (client) --------------------------------------------------------------
    def parse_settings(self, raw: Mapping[str, Any], shared: Mapping[str, Any]) -> Any:
        """This kind's ``transform.<name>`` section (``raw``, ``{}`` when absent) as its frozen
        settings object (with ``to_json()``); ``shared``: the whole ``transform`` section, for
        keys every kind reads (``channels``). Raises ConfigError naming the key."""
        raise NotImplementedError

    def parse_source(self, raw: Mapping[str, Any], where: str) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
        """This kind's own keys of one source (``raw``, the source as written; ``where``:
        ``sources[2]``): (options as sorted pairs, recorded in the source's identity only when
        non-empty; table columns that name further files of a row's sample, whose files are not
        samples of their own). Default: none. Raises ConfigError."""
        return (), ()

    def header_keys(self, keys: Sequence[str]) -> tuple[str, ...]:
        """Which of a source's ``where:`` keys name header attributes of this kind's files (tested
        by the probe, before decoding) rather than table columns (tested while listing). Default:
        none (a kind without header attributes filters table rows only)."""
        return ()

    def header_conditions(self, conditions: tuple[Condition, ...], where: str) -> tuple[Condition, ...]:
        """The header conditions (those :meth:`header_keys` named) as the probe tests them (a
        DICOM SOP class given by name becomes its UID). Default: as given. Raises ConfigError."""
        return conditions

    def header_key_problem(self, key: str, fix: str) -> str | None:
        """Why ``key`` names no header attribute whose value a job could read (a ``label:
        {attribute}``: a DICOM sequence or an attribute of bytes, with ``fix``, what to give
        instead, after it; an attribute written as its tag, with the keyword to write); None
        where it may. Default: None (a kind without header attributes
        refuses ``label: {attribute}`` by :attr:`attribute_labels`)."""
        return None

    def header_key_hint(self, key: str) -> str:
        """A hint for a ``where:`` key that names neither a header attribute nor (the source has
        no table) a table column: ``" (did you mean the DICOM keyword 'Modality'?)"``, or ``""``."""
        return ""

    def check_job(self, job: JobConfig, sources: Sequence[SourceConfig]) -> None:
        """Refuse a job whose settings this kind cannot honour; ``sources``: its sources of this
        kind (possibly none: settings that need one are refused then). Raises ConfigError."""

    def config_warnings(self, job: JobConfig, sources: Sequence[SourceConfig]) -> tuple[str, ...]:
        """Sentences for settings this kind honours differently from what they seem to ask (the
        build and ``packer validate`` print them, code ``transform``); ``sources``: the job's sources
        of this kind, never none. Default: none."""
        return ()

    # -- header and pixels (worker) ---------------------------------------------------------
    def probe(self, ref: SampleRef, source: SourceConfig, job: JobConfig, *, keep: bool,
              placement: bool, placed: Any = None) -> Probed | Issue | MemberIssue | Excluded:
        """Read ``ref``'s header (never its pixels, unless ``keep``: then the parsed file may be
        kept for :meth:`read`) and say what it gives (:class:`Probed`: entity and time where the
        kind reads them from headers; with ``placement``, the facts the kind's :class:`Grouping`
        needs), or the file's Issue, or (a file its header leaves out on purpose: the source's
        header ``where:``, an object that is no image) its Excluded record, before any pixel is
        decoded. Identity checks (label, entity, time) are the caller's. ``placed``: what the
        placement probe of this file left for the pixel pass (:meth:`Grouping.placed`), which
        may spare checks it made on the same bytes; passed only where there is one (a kind whose
        grouping leaves nothing, or that has none, need not take it)."""
        raise NotImplementedError

    def sample_keys(self, ref: SampleRef, state: Any, job: JobConfig) -> tuple[str, ...]:
        """The keys of the samples the file would make, from what :meth:`probe` (``keep=False``)
        gave (``state``): what ``packer validate --quick`` counts. Default: one, the file's id."""
        return (ref.sample_id,)

    def sample_instance(self, ref: SampleRef, state: Any, job: JobConfig) -> str:
        """The :attr:`~packer.records.Sample.instance` the file's samples would carry, from what
        :meth:`probe` (``keep=False``) gave (``state``): what ``packer validate --quick`` checks
        shared instance UIDs by. Default: ``""`` (the kind knows no unique id)."""
        return ""

    def header_notes(self, ref: SampleRef, state: Any, job: JobConfig) -> tuple[str, ...]:
        """The reader's warnings about the file that its header alone tells (a NIfTI file's sform
        and qform disagreeing), as its samples' ``metadata.warnings`` word them, from what
        :meth:`probe` (``keep=False``) gave (``state``): what ``packer validate --quick`` warns
        of. Default: none."""
        return ()

    def read(self, ref: SampleRef, job: JobConfig, state: Any = None) -> list[Sample] | Issue:
        """Decode, validate and transform one file into its samples, or its Issue (never None,
        never an exception for a defect of the file). ``state``: what :meth:`probe` kept."""
        raise NotImplementedError

    def rehearse_probe(self, ref: SampleRef, handle: RangedFile, limits: LimitsConfig) -> bool:
        """Make, through ``handle`` (a remote file that fetches what is read), every read the header
        probe of ``ref`` makes, so that a remote file's header pass fetches only those ranges. True
        when the probe needs the whole file anyway (the caller then fetches it whole). Default:
        True (fetch it whole)."""
        return True

    # -- what a sample must be (worker) -----------------------------------------------------
    def expected_dtype(self, sample: Sample, job: JobConfig) -> np.dtype:
        """The dtype ``sample`` must have under ``job``."""
        raise NotImplementedError

    def dtype_rule(self, job: JobConfig) -> str:
        """The job setting that decides a sample's dtype, as a message names it."""
        raise NotImplementedError

    def expected_size(self, job: JobConfig) -> tuple[int, ...] | None:
        """The (H, W) (or (D, H, W)) every sample must have, None when the job leaves it free."""
        return None

    def sample_ndim(self, job: JobConfig) -> int:
        """The dimensions of this kind's samples as :meth:`read` gives them: 3 (C×H×W), or 4
        (C×D×H×W) where it makes volumes itself."""
        return 3

    def channels(self, job: JobConfig) -> int | None:
        """The channel count the job asks of this kind's samples (``transform.channels``)."""
        return None

    def colour(self, sample: Sample) -> bool:
        """Whether ``sample``'s three channels are R, G, B (so 3 → 1 may take the luminance)."""
        return False

    def channel_advice(self, sample: Sample, job: JobConfig, target: int, key: str) -> list[str]:
        """What a ``bad_shape`` for ``sample``'s channel count adds for this kind (where its count
        comes from, a setting that would give ``target``), each clause only where it applies; the
        shared fix (drop ``key``) is :func:`with_channels`'. Default: nothing."""
        return []

    def attach_masks(self, samples: list[Sample], source: SourceConfig, job: JobConfig) -> list[Sample] | Issue:
        """``samples`` (all of one file) each with its mask, or the file's mask defect. Called
        only for a source with ``mask:``. Default: the 2-D rule of :mod:`packer.read.masks`."""
        from packer.read.masks import attach_masks

        return attach_masks(self, samples, source, job)

    def mask_grid(self, metadata: Mapping[str, Any]) -> tuple[int, int, int]:
        """(frames, height, width) a file's mask must have, from its first sample's metadata."""
        raise NotImplementedError

    def mask_frames(self, samples: Sequence[Sample]) -> list[tuple[int, int]]:
        """The stored (height, width) of each frame of the file whose ``samples`` these are, in
        the order of the mask's frames. Default: :meth:`mask_grid`'s, every frame one size."""
        frames, height, width = self.mask_grid(samples[0].metadata)
        return [(height, width)] * frames

    def place_masks(self, samples: Sequence[Sample], mask: np.ndarray, source: SourceConfig,
                    job: JobConfig) -> list[np.ndarray]:
        """Each sample's mask, given the file's checked F×H×W ``mask``: through the geometry the
        sample's metadata records (orientation, resample, resize, tiles, frames)."""
        raise NotImplementedError

    # -- grouped before decoding ------------------------------------------------------------
    def grouping(self, job: JobConfig) -> Grouping | None:
        """How files of this kind are grouped before any is decoded (DICOM series for 2.5D
        stacks and volumes), or None: each file is its own unit of work."""
        return None

    # -- the report -------------------------------------------------------------------------
    def rgb_channels(self, channels: int) -> bool:
        """Whether a packed sample of this kind with ``channels`` channels shows as one colour
        picture (R, G, B[, A]) rather than a picture per channel."""
        return False


@dataclass(frozen=True)
class SampleSpan:
    """The files one sample of a group holds pixels of, from headers: ``key`` as the pixel pass
    keys the sample, ``files`` its own file first, then the others it holds, in order. ``whole``:
    the sample stands for every one of ``files`` (a volume: each file is packed, or left out, with
    it), not only for its own (a neighbour stack, whose neighbours are context and are samples of
    their own)."""

    key: str
    files: tuple[SampleRef, ...]
    whole: bool = False

    @property
    def latest(self) -> str | None:
        """The latest record time among :attr:`files` (ISO text orders as the split compares it),
        or None where none has one."""
        times = [ref.time for ref in self.files if ref.time is not None]
        return max(times) if times else None


class Grouping:
    """Files of one kind grouped before decoding: the header facts of each file (on workers),
    the groups from those (on the client), and a group's samples from its files' (on a worker).
    A group is an object with ``refs`` (its files, in order) that pickles; one group is one
    unit of work."""

    def assemble(self, placed: Sequence[tuple[SampleRef, Any]], job: JobConfig, *,
                 held: Sequence[MemberIssue] = ()) -> tuple[tuple[Any, ...], tuple[Issue | Excluded, ...]]:
        """The groups the probed files make, and one record per file refused (an Issue) or left
        out on purpose (an Excluded) on the way. ``held``: files the header pass refused whose
        headers name their group (their own Issues are the caller's): a group that is whole only
        with one of them (:attr:`MemberIssue.holds`) is not made, and its files are refused."""
        raise NotImplementedError

    def member(self, issue: Issue, ref: SampleRef, placed: Any) -> Issue | MemberIssue:
        """A file refused after its placement probe for its own label, entity or time (``placed``:
        what that probe gave), for :meth:`assemble`: its Issue with what names its group, where the
        kind can say, so that what refers to the group (an annotation of a series) is told the file's
        reason where no group of it is made; never held (:attr:`MemberIssue.holds`): its group packs
        without it. Default: the Issue alone."""
        return issue

    def file_job(self, job: JobConfig, group: Any = None) -> JobConfig:
        """The job each file of ``group`` is read with (a volume's slices at their own size, and
        unrounded where the volume is resampled)."""
        return job

    def decoded(self, group: Any) -> Sequence[SampleRef]:
        """The files of ``group`` the pixel pass reads into samples, in order (default: all of
        ``group.refs``); the others (a series' SEG and RTSTRUCT) are read by :meth:`combine`."""
        return tuple(group.refs)

    def placed(self, group: Any) -> Sequence[Any]:
        """For each :meth:`decoded` file of ``group``, in that order, what its placement probe
        left for the pixel pass's probe (:meth:`SourceKind.probe`'s ``placed``), or None. Default:
        nothing (each file is probed again as any file)."""
        return [None] * len(self.decoded(group))

    def combine(self, group: Any, per_file: Sequence[list[Sample]], job: JobConfig
                ) -> tuple[list[Sample], tuple[Issue | Excluded, ...]]:
        """A group's samples from each of its :meth:`decoded` files' samples (in that order), and
        the records of its other files (an annotation used: Excluded; a defect: Issues, and then
        no samples). Where :meth:`partial` holds, a file that could not be read has an empty list."""
        raise NotImplementedError

    def partial(self, job: JobConfig) -> bool:
        """Whether a group whose file cannot be read still packs its other files (each file its own
        samples: the group only places what they share) rather than refusing them all as
        ``series_incomplete``. Default: no."""
        return False

    def headers_only(self, group: Any, job: JobConfig) -> tuple[Issue | Excluded, ...]:
        """``validate --quick``: the records of the group's files that are not :meth:`decoded`
        (a series' annotations), as far as headers tell, or the records that refuse the whole
        group where its headers already do (then :meth:`counted` gives it no samples). Default: none."""
        return ()

    def counted(self, group: Any, job: JobConfig) -> list[tuple[SampleRef, str]]:
        """(ref, key) of each sample the group would make, from headers alone (``validate --quick``)."""
        raise NotImplementedError

    def spans(self, group: Any, job: JobConfig) -> list[SampleSpan]:
        """For each sample the group would make (as :meth:`counted` keys it), the files whose
        pixels it holds, from headers: what a time split times it by (its latest file) and what
        leaving it out leaves out. Default: each sample holds its own file only."""
        return [SampleSpan(key=key, files=(ref,)) for ref, key in self.counted(group, job)]


def register(kind: SourceKind) -> SourceKind:
    """Add ``kind`` to the registry under ``kind.name``; registering a second kind of one name is
    a packer bug (ValueError)."""
    name = kind.name
    if name in _REGISTRY and type(_REGISTRY[name]) is not type(kind):
        raise ValueError(f"source kind {name!r} is registered twice ({type(_REGISTRY[name]).__name__}, "
                         f"{type(kind).__name__})")
    _REGISTRY[name] = kind
    return kind


def _load() -> None:
    """Import every ``packer/read/*_kind.py`` module once: each registers its kind."""
    global _LOADED
    if _LOADED:
        return
    package = importlib.import_module("packer.read")
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.endswith("_kind")):
        importlib.import_module(f"packer.read.{module}")
    _LOADED = True


def source_kinds() -> tuple[SourceKind, ...]:
    """Every registered kind, by name."""
    _load()
    return tuple(_REGISTRY[name] for name in sorted(_REGISTRY))


def kind_names() -> tuple[str, ...]:
    """The registered kind names, sorted (what ``kind:`` may say)."""
    return tuple(kind.name for kind in source_kinds())


def source_kind(name: str, where: str = "kind") -> SourceKind:
    """The registered kind called ``name``. Raises ConfigError, naming ``where`` and listing the
    registered kinds, for a name no kind has."""
    _load()
    kind = _REGISTRY.get(name)
    if kind is None:
        raise ConfigError(f"{where}: unknown source kind {name!r}; packer reads {', '.join(kind_names())}")
    return kind


def shows_rgb(name: str, channels: int) -> bool:
    """Whether a packed sample of source kind ``name`` with ``channels`` channels shows as one
    colour picture (:meth:`SourceKind.rgb_channels`); False for a kind this packer does not know
    (a report of a version built by another)."""
    _load()
    kind = _REGISTRY.get(name)
    return kind is not None and kind.rgb_channels(channels)


def kind_libraries(kinds: Sequence[str]) -> tuple[str, ...]:
    """The extra libraries (:attr:`SourceKind.libraries`) of the kinds named ``kinds``, sorted."""
    return tuple(sorted({lib for name in set(kinds) for lib in source_kind(name).libraries}))


def source_libraries(sources: Sequence[SourceConfig]) -> tuple[str, ...]:
    """The extra libraries that shape the samples of ``sources``: their kinds' (:func:`kind_libraries`),
    ``highdicom`` where a source reads its masks from DICOM SEG objects (``mask: {from: dicom}``),
    and ``pillow`` where it reads mask files (a palette PNG's indices; an image source has it anyway)."""
    extra = {"highdicom"} if any(s.mask is not None and s.mask.from_dicom for s in sources) else set()
    if any(s.mask is not None and not s.mask.from_dicom for s in sources):
        extra.add("pillow")
    return tuple(sorted({*kind_libraries([s.kind for s in sources]), *extra}))


def series_incomplete(refs: Sequence[SampleRef], bad: Mapping[str, str], *, stage: str = "validate",
                      but: Collection[str] = ()) -> list[Issue]:
    """The ``series_incomplete`` record of each file of ``refs`` (but those whose sample ids are
    in ``but``: the bad files, which keep their own records) whose group is not packed because
    other files of it are bad: ``bad`` maps each one's path to its state (its reason code, or why
    it was left out). Every bad file is named (the first few, and how many more), so a user who
    fixes one learns of the others in the same build, not one rebuild at a time."""
    listed = list(bad.items())
    named = ", ".join(f"{path} ({state})" for path, state in listed[:_NAMED_BAD])
    more = f" and {len(listed) - _NAMED_BAD} more" if len(listed) > _NAMED_BAD else ""
    if len(listed) == 1:
        path, state = listed[0]
        why = f"another file of its series, {path}, is bad ({state})"
    else:
        why = f"{len(listed)} other files of its series are bad: {named}{more}"
    return [Issue.of(ref, stage=stage, reason="series_incomplete",
                     message=f"{ref.path}: {why}; a series with a missing slice is not packed")
            for ref in refs if ref.sample_id not in but]


#: How many of a series' bad files a ``series_incomplete`` record names (a record per file of the
#: series: naming hundreds in each would make the report quadratic in the series' length)
_NAMED_BAD = 5


def with_channels(samples: list[Sample], job: JobConfig) -> list[Sample] | Issue:
    """``samples`` with the job's channel count for their kind (``transform.channels``, or the
    kind's own key, see :mod:`packer.transform.channels`); a sample no rule maps makes its file
    ``bad_shape``, its message naming the key the job set and the kind's advice
    (:meth:`SourceKind.channel_advice`)."""
    if not samples:
        return samples
    kind = source_kind(samples[0].ref.kind)
    target = kind.channels(job)
    if target is None:
        return samples
    key = str(getattr(job.settings(kind.name), "channels_key", None) or "transform.channels")
    out = []
    for sample in samples:
        mapped = match_channels(sample.image, target, color=kind.colour(sample), key=key)
        if isinstance(mapped, str):
            advice = kind.channel_advice(sample, job, target, key)
            said = "".join(f"; {clause}" for clause in advice)
            return Issue.of(sample.ref, stage="transform", reason="bad_shape",
                            message=f"{sample.ref.path}: sample {sample.key}: {mapped}{said}; {'or ' if advice else ''}"
                                    f"drop {key} and load each source with ShardDataset(sources=[...])")
        if mapped.rule == "keep":
            out.append(sample)
        else:
            metadata = {**sample.metadata, "channels": {"from": int(sample.image.shape[0]), "rule": mapped.rule}}
            out.append(replace(sample, image=mapped.image, metadata=metadata))
    return out
