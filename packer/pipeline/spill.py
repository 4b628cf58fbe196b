"""The spill cache: where the pixel pass leaves each chunk's decoded samples for the pack pass.

A chunk of raw files (:mod:`packer.pipeline.pixels`) becomes three files in the build cache,
all named by the chunk's key:

- ``<key>.spill``: every sample's C-order pixel bytes followed by its canonical-JSON metadata,
  one after another (:class:`SpillWriter` writes it, :func:`read_spilled` reads one sample);
- ``<key>.json``: the records (:class:`~packer.records.SpilledSample` offsets, sizes, sha256s,
  the chunk's issues), with the spill's size, a digest chained over the samples' digests, the
  signature file's sha256 and a sha256 over the records themselves (:func:`check_entry`);
- ``<key>.sig.npy``: the near-copy signatures (:mod:`packer.pipeline.nearcopy`).

The spill is a second copy of the dataset, so a build consumes it: a tar shard's task frees
each sample's spilled bytes once the shard holds them (:class:`SpillPuncher`), the client frees
the rest as each shard's task returns and deletes a chunk's spill once all of it is packed
(:class:`SpillConsumer`), and after publishing writes ``<key>.packed.json``
(:func:`write_packed_pointers`): where each of the chunk's samples now sits in the published
version. A later build reuses the chunk by reading its samples back from those shards, checked
against the same digests (:func:`load_cached_chunk`), so "decode only what is new" survives
without a full copy on disk. ``packer build --keep-spill`` keeps the spill instead (reuse then
does not depend on the version folder, at the cost of that second copy): an entry it reuses whose
bytes are in a published version is given a spill of its own, read back and checked
(:func:`load_cached_chunk` with ``own_copy``), and unchanged files of a changed chunk are copied,
not referenced.

The key (:func:`chunk_key`) covers :data:`CACHE_FORMAT`, the library versions (packer's with a
digest of its source, :func:`packer.manifest.decoding_libraries`), the parts of the
job that shape samples and each file's path, table values and fingerprint, so an entry is
reused only for the same source version and processing config. :func:`load_cached_chunk`
re-checks an entry's records, signatures, sizes and digests before it is reused; a damaged
entry is redone.
Cache files are written without fsync, under a temporary name renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import tarfile
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from packer.config import JobConfig, SourceConfig
from packer.errors import FileSystemError, IntegrityError, output_elsewhere, surface
from packer.files import TMP_SUFFIX, arrow_readable, atomic_output, canonical_json, punch_hole
from packer.pipeline.nearcopy import read_signatures, write_signatures
from packer.pipeline.rawstore import RawObject
from packer.records import REF_FIELDS, Excluded, Issue, SampleRef, SpilledSample
from packer.shards.encode import pixels_digest
from packer.shards.members import NPY_HEAD, npy_header, npy_layout
from packer.shards.tar import read_sample_at
from packer.storage import is_url


@dataclass(frozen=True)
class CachedChunk:
    """A complete, verified cache entry: the chunk's samples and issues, its file count, and the
    warnings its readers noted (file id, text: a NIfTI file's sform and qform that disagree)."""

    samples: tuple[SpilledSample, ...]
    issues: tuple[Issue, ...]
    files: int
    notes: tuple[tuple[str, str], ...] = ()
    excluded: tuple[Excluded, ...] = ()
    #: the entry's units of reuse (:mod:`packer.pipeline.filecache`): each unit key (16 bytes) in turn
    units: bytes = b""


#: Part of every chunk's cache key. Any change to packer's code already changes every key: the
#: key's ``packer`` library entry carries a digest of packer's source
#: (:func:`packer.manifest.source_digest`), so an upgraded or edited packer never reuses samples or
#: verdicts another packer made, even where a change forgot to raise this. Raise it still when a
#: reader or transform changes what a raw file turns into: it records the change in the history
#: below (5: PNG eXIf orientation is applied; 6: every page of a multi-page TIFF is read;
#: 7: near-copy signatures replace the dHash;
#: 8: the signature embedding gains the equalised spectrum; 9: each sample's sha256 is the one its
#: shard format records, :func:`~packer.shards.encode.pixels_digest`; 10: DICOM objects without an
#: image, RT Dose, secondary captures and localizers are Excluded records, not samples or issues;
#: 11: an RTSTRUCT contour repeated on its slice is painted once, an ROI in another frame of
#: reference refuses its structure set, and structure names compare in every script; 12: a zero
#: or non-numeric Rescale Slope/Intercept, a MONOCHROME1 z-score channel and Enhanced frames of
#: several orientations read as a trial found they should; 13: a series' slices are ordered along
#: its normal turned to point to +x, +y or +z (its dominant LPS component positive), so a
#: feet-first series stacks inferior → superior like a head-first one; 14: a DICOM file's samples
#: carry the digest of the stored pixels they were rendered from, ``stored_digest``; 15: a trial's
#: mutated files: an overflowing or flattening rescale, a flat file window or VOI LUT and a
#: damaged file-meta element are bad samples, several reasons renamed; 16: header text whose bytes
#: its character set cannot decode is read with each such byte as ``\xNN``, not U+FFFD, and a
#: sample whose entity holds such bytes says so in ``metadata.warnings``; native Pixel Data of
#: undefined length is ``unreadable``, never packed or called a cut encapsulated stream; 17: each
#: sample records whether it is ``blank``, every pixel one value, so blank tiles and frames are
#: no exact duplicates; 18: an image header without Pixel Data and without Photometric
#: Interpretation is ``no_pixel_data``, not ``unsupported``; a series of several acquisitions that
#: fails as one stack is stacked per Acquisition Number; 19: in a series job a projection or 2-D
#: image without Image Position (Patient), a CR, DX or US file, is ``not_requested``, not refused;
#: 20: VOI LUT Data narrower than the bits their descriptor declares are read in the bits they use;
#: 21: a .nii.gz cut inside its header is ``truncated``, not ``unreadable``; 22: a uint8 sample
#: within 2 levels is ``blank`` too, and its near-copy thumbnail is zeros; 23: ST, LT and UT text
#: and text in sequence items (ROIName, SegmentLabel) keep undecodable bytes as ``\xNN`` too;
#: 24: a DICOM slice's sample records a digest of its SOP Instance UID, ``instance``, for the
#: cross-entity UID check); 25: 8-bit Modality/VOI LUT Data packed two entries to an OW word are
#: read entry by entry; LUT Data shorter than their descriptor's entries, or a descriptor's bits per
#: entry outside 1..16, make the LUT malformed; a Window Center/Width value that is no number keeps
#: its place, so the pairs after it stay the file's pairs; an Enhanced file with fewer Per-frame
#: Functional Groups items than frames is ``unreadable``; a Pixel Padding Value/Range Limit written
#: as US over signed pixels is read as SS; 26: DICOM uint16 levels are the window formula's exact
#: value rounded half to even: display values in float64, not float32; a 16-bit palette whose
#: entries never exceed 255 gives its samples a warning; ST, LT and UT text double a backslash
#: of their own that precedes a backslash or ``xNN``, so it never reads as an undecodable byte;
#: 27: an RTSTRUCT that lost an ROI of the map to damage (an empty ContourData, a file cut inside
#: its ROI Contour Sequence, a damaged Referenced ROI Number) refuses its series, ``unreadable``,
#: instead of painting it without that class; 28: NIfTI uint16 levels (windows and percentiles)
#: are the formula's exact value rounded half to even too: display values in float64, not
#: float32, for slices on their own grid and volumes); 29: an image's ``source_channels`` is the
#: header's samples per pixel (grey+alpha PNG 2, CMYK JPEG 4), not what OpenCV decoded; 30: a SEG
#: whose SpacingBetweenSlices differs from its series' slice step is on another grid; 31: a
#: vendor's private SOP class without an image is left out (not_image), not no_pixel_data; the
#: transfer syntax is checked before the photometric (a video is unsupported_transfer_syntax);
#: 33: under edge: skip a file that centres no stack is a not_requested record, and a refused
#: series' files note no reader warnings (they are packed with none); 34: a series of one slice
#: steps by its header's Spacing Between Slices, else Slice Thickness (1 mm, with a warning, only
#: where neither is given); 35: an 8-bit TIFF with unassociated alpha decodes to its stored
#: colours (OpenCV's libtiff path had multiplied them by alpha); 36: a percentiles window ignores
#: infinite pixels, and a float image's alpha composites over white after its window; 37: an
#: RTSTRUCT ROI drawn only on another stack of its series is no 'has no contour' note, and a SEG
#: frame on a slice the export lacks says so (the records and notes a unit's result holds); 38:
#: Dose Grid Scaling scales RT Dose alone, and modality values past float16's range are non_finite;
#: 39: a sample is ``blank`` when each channel is flat on its own (one colour: a tinted slide
#: background), not only when every channel holds one value; a TIFF page or mask of more than 8
#: bits stored as separate planes is refused (OpenCV read it as interleaved), and so is a 16-bit
#: TIFF mask OpenCV hands back at 8 bits; 40: multi-frame RLE with more fragments than frames and no
#: offset table is ``bad_shape`` (frames that cannot be told apart), not ``truncated``; 41: an
#: Enhanced frame's own Frame VOI LUT item wins over a top-level VOI LUT Sequence; 42: and its own
#: Pixel Value Transformation (rescale) over a top-level Modality LUT Sequence; 43: ``fit``'s border
#: under a z-score over all pixels is black (the lowest z-score of a DICOM frame or NIfTI volume),
#: not 0, their mean; 44: a float image's NaN pixels are black before its resize, not spread by the
#: filter over their neighbours; 45: a 10-, 12- or 14-bit TIFF's {center, width} window is in its
#: stored units (OpenCV's values are scaled to 16 bits), and its samples' bit_depth is the stored
#: bits; 46: a TIFF page of a depth OpenCV does not read (2- or 4-bit grey) is ``unsupported``,
#: naming the layout, not ``decode_failed``; 47: a volume padded to ``size`` pads each channel with
#: its black (float16 modality values their smallest, a z-score over all voxels its lowest), not 0,
#: and a series whose slices lie off the uniform grid is resampled onto it from their true positions;
#: 48: text is decoded strictly under its character set (bytes above 0x7F under the default ASCII,
#: and bytes an ISO 2022 code extension cannot decode, kept as ``\xNN`` with a warning; ISO 2022 IR
#: 58's escape sequence consumed), and a person name loses its trailing empty components;
#: 49: a file meta naming a transfer syntax its data set is not in (Big Endian over little) is ``unreadable``.
#: 50: a Pixel Padding Value is reduced to Bits Stored as the pixels are; output_spacing is the packed grid's.
#: 51: an 8-bit palette holding 16-bit entries is read over 0..65535; a compressed colour frame is decoded
#: colour-by-pixel whatever Planar Configuration says; a Siemens MOSAIC is ``unsupported``; a resampled
#: volume is interpolated from unrounded values and rounded once; RT Dose and NM tomogram frames are placed;
#: each bad slice of a series keeps its own record; localizers leave a reformat, two kernels refuse a
#: series, a SOP UID shared by different images is no copy; SEG frame-of-reference and one-plane rules.
#: 52: native Pixel Data longer than its header says is ``bad_shape``; a LUT longer than its descriptor is
#: refused; a DT time must be whole DT syntax; a malformed geometry value (Image Position, Orientation, Pixel
#: Spacing, Spacing Between Slices) is refused, never read as absent or shifted; a resample under 2 pixels
#: is ``bad_geometry``; ``ISO_IR100`` reads as ``ISO_IR 100``; numeric JSON cells true/[3] are no numbers.
#: 53: a multi-frame projection without Plane Position is ``not_requested`` in a series job; ``where:`` and
#: ``label: {attribute:}`` read a keyword absent at the top level from the functional groups.
#: 54: zero padding past native Pixel Data and a one-slice series with Spacing Between Slices 0 are
#: accepted (both after 53, unbumped); a TIFF mask's damaged strips are ``mask_unreadable`` and a deep
#: WhiteIsZero mask keeps its ids; a JPEG turns by its first EXIF segment; a slide's LABEL/OVERVIEW/
#: THUMBNAIL images are ``not_requested`` and Specimen Label in Image YES is burned-in text; running out
#: of memory is no bad sample; an entry's records and signatures carry digests checked on reuse.
#: 55: MONOCHROME2 under Presentation LUT Shape INVERSE renders inverted; Float Pixel Data's own padding
#: value masks it; a palette whose LUT Data miscounts its entries is named; a series job's left-out
#: localizer and end-slice records carry Modality and SOP class; a table's time: list is a fallback.
#: 56: near-copy signatures of fit outputs and padded volumes come from the content box; a multi-frame
#: file whose every frame is flat is constant_image; PT records Units and each slice's rescale where they
#: differ, and a PT file without rescale is unreadable; SPECT projections are not_requested in series jobs.
#: 57: a SEG frame goes to the slice it references and resampled frames reach half their thickness;
#: NIfTI volumes are normalised before resampling; statistics are recorded at full precision; a constant
#: volume of a 4-D NIfTI is constant_image; a padded volume is signed over its whole slice again.
#: 58: SEG slabs reach their boundary and a frame thicker than the series' step is a slab; a volume's
#: slices is its packed depth (DICOM adds series_slices); NIfTI neighbour offsets along the normal;
#: near-ties of axes broken by a fixed rule; a blank volume of a 4-D NIfTI packs again.
#: 59: the SEG placement of 57 and 58 is taken back (frames placed as at 56); a bracketed multilabel
#: word is a token, not a list.
#: 60: RLE segments longer than the image, NIfTI bytes past the header's voxels and rescales that
#: collapse float16 modality values are refused; compressed and unreadable suffix-less files of an
#: export are listed; the job's own output and packer version folders are not; a percentiles
#: fallback records fallback_percentiles; derived images on the originals' positions meet them;
#: BIDS and intent-declared NIfTI label maps are left out; file-name times are read without suffixes.
#: 61: TIFF pages (and TIFF masks) in a compression OpenCV does not decode are refused, JPEG tiles of a
#: TIFF checked strictly; derived images meet the originals only where they stand at half their places.
#: 62: entries record each decoded raw file's xxh3-128 (a move is confirmed by it); 12/16-bit JPEGs and
#: TIFFs over 4 samples unsupported; DICOM values split only at single-byte backslashes (GB18030, ISO
#: 2022); colour DICOM flagged signed read unsigned; float16 rounded once; pixel presence by Pixel Data.
#: 63: FL header values compared as the float32 the file holds; missing_time records name the unread
#: dates; lossless-JPEG TIFF masks read; a vendor's private class without pixel data left out.
#: 64: a deflated DICOM data set counts twice against limits.max_decoded_bytes (one between half the
#: limit and the limit, packed before, is now too_large).
#: 65: NIfTI scl_slope/scl_inter applied in float64 and rounded once (as nibabel); a z-score divides by
#: the real std (no 1e-8 floor), one float32 cannot invert refused as non_finite.
#: 66: where: asks for localizers, slide thumbnails, secondary captures, RT Dose only by naming them; an
#: annotation's damaged Frame of Reference UID unreadable; SEG refusals (undeclared or repeated segment
#: numbers, Bits Allocated against Segmentation Type, excess Pixel Data, non-finite frame planes).
#: 67: a label map's sform/qform note names no file (PHI); where: matches that spell a kind ask for it,
#: numbers and ACR-NEMA spellings of dates/times compare again; BINARY SEGs of a byte a pixel read.
#: 68: a DICOM cut inside a header value truncated (was no_pixel_data); a JPEG codestream narrower than
#: Bits Allocated bad_shape (was decode_failed). 69: a DICOM cut inside an element's header truncated too.
#: 70: a lossy codestream's overshoot just past Bits Stored clipped (was masked to the stored bits).
#: 71: TIFF Deflate strips checked to their stream's end and Adler-32; TIFF masks skip thumbnail IFDs.
#: 72: VOI LUT entries past the declared bits read over the bits they use; a VOI LUT's first mapped
#: value signed when the rescaled range can go below 0 (or written as SS).
#: 73: lossy vs lossless told by each frame's codestream (a reversible J2K masked again); a stray VOI
#: LUT entry past the declared bits clipped; TIFF masks' bits and photometric from their first page.
#: 74: a DICOM cut inside a sequence/item/first element header truncated (was unreadable), a cut
#: non-image object too (was not_image); Lossy Image Compression 01 makes a frame's overshoot clipped.
#: 75: a NIfTI named with a segmentation word whose prefix names no image is a label map only where
#: its voxels say so (one whole-number volume, at most 128 values), decided when it is read.
#: 76: a TIFF's (and TIFF mask's) thumbnail IFDs are not judged by the page checks (compression, strips).
#: 77: a whole non-image object read by pydicom is not_image again (no byte walk); a file padded with
#: zeros, or an explicit-VR UN sequence, is no cut; an annotation of a series refused at the probe gets its reason.
#: 78: a non-CT DICOM file rendered through a CT preset says so in its metadata.warnings.
#: 79: a cut after many whole UN sequences, or after a UN in a big-endian file, is truncated again.
#: 80: native multi-frame Pixel Data padded with a frame's worth of zeros or more is read (was bad_shape).
#: 81: (skipped: a luminance near-copy thumbnail that was reverted; caches written by it must not match).
#: 82: a damaged DICOM JPEG frame is decode_failed, whole-but-short native Pixel Data bad_shape, a damaged
#: image signature decode_failed, early .nii.gz deflate damage decode_failed.
#: 83: a SEG reference without Referenced Frame Number spans a multi-frame source's frames; an annotation cut
#: inside a linking UID, or where its Pixel Data should start, is damaged (its series mask_missing).
#: 84: a PNG whose signature's line endings were translated is decode_failed (was unsupported).
#: 85: a PNG whose CR became LF (signature and IHDR length) is decode_failed too.
#: 86: an animated PNG mask is mask_unreadable; an RGB PNG mask's tRNS colour key no longer reads as alpha.
CACHE_FORMAT = 86


def sample_shaping_config(job: JobConfig) -> dict[str, Any]:
    """The parts of the job that change what a raw file turns into, samples or bad-sample verdict:
    sources, transforms, ``split.by`` (a time split needs a time), the size ``limits`` and the
    burned-in-annotation policy, both applied by the worker, the job's ``labels`` where the
    worker checks header labels against them, and whether near-copy signatures are kept. Not
    split ratios, packing or PHI."""
    identity = job.identity()
    shaping = {"sources": identity["sources"], "transform": identity["transform"], "split_by": job.split.by,
               "limits": identity["limits"], "burned_in_annotation": job.safety.burned_in_annotation}
    if not job.split.near_enabled:  # its entries carry no near-copy signatures (only then: keys stay as they were)
        shaping["signatures"] = False
    if any(s.target.origin == "attribute" for s in job.sources):  # the worker checks header labels against it
        shaping["labels"] = identity["labels"]
    if job.split.by == "time" and job.split.entity_policy == "drop_straddlers" and job.dicom.by_series:
        # the worker times a stack or volume by its latest slice then (dicom_kind.timed_by_latest_slice)
        shaping["stacks_timed_by"] = "latest slice"
    return shaping


def chunk_key(refs: Sequence[SampleRef], job: JobConfig, libraries: dict[str, str],
              listed: Mapping[str, RawObject] | None = None) -> str:
    """Cache key of a chunk: format, library versions, sample-shaping config, and per file its
    path, table values and fingerprint: a local file's size, mtime and inode (files that cannot be
    stat'ed key as missing), a remote file's size and version tag from ``listed`` (discovery's
    listing: no request is made here). Raises ValueError for a URL that ``listed`` lacks."""
    masked = masked_sources(job)
    # the ref's fields, as dataclasses.asdict gives them (its fields are flat), at a fraction of the cost
    files = [[{name: getattr(ref, name) for name in REF_FIELDS}, file_fingerprint(ref, masked, listed)]
             for ref in refs]
    payload = {"format": CACHE_FORMAT, "libraries": libraries, "config": sample_shaping_config(job),
               "files": files}
    return hashlib.sha256(canonical_json(payload)).hexdigest()[:32]


def masked_sources(job: JobConfig) -> dict[str, SourceConfig]:
    """The job's sources whose files bring other files along (a mask, a case's companions), by name."""
    return {s.name: s for s in job.sources if s.mask is not None or s.companions}


def file_fingerprint(ref: SampleRef, masked: Mapping[str, SourceConfig],
                     listed: Mapping[str, RawObject] | None = None) -> list[Any]:
    """What says one raw file's bytes (and its mask's and companions') did not change, without
    reading them: a local file's size, mtime and inode (``["missing"]`` where it cannot be stat'ed), a
    remote file's size and version tag from ``listed`` (no request is made). ``masked``:
    :func:`masked_sources`. Raises ValueError for a URL that ``listed`` lacks."""
    fingerprint: list[Any]
    if is_url(ref.path):
        stat = (listed or {}).get(ref.path)
        if stat is None:
            raise ValueError(f"{ref.path}: not in discovery's listing; pass Discovery.listed to chunk_key")
        fingerprint = ["object", stat.size, stat.version]
    else:
        fingerprint = _stat_fingerprint(ref.path)
    source = masked.get(ref.source)
    if source is not None:  # a mask, and a case's other files, are part of what the file turns into
        if source.mask is not None:
            fingerprint.append(["mask", *_stat_fingerprint(source.mask_file(ref.extra))])
        for column in source.companions:
            fingerprint.append([column, *_stat_fingerprint(source.row_file(ref.extra, column))])
    return fingerprint


def _stat_fingerprint(path: str | None) -> list[Any]:
    """A local file's size, mtime and inode: two files of one size and mtime that swap names
    (tar extraction and ``cp -p`` give many files one mtime) differ by their inodes."""
    try:
        local = os.stat(path) if path is not None else None
    except OSError:
        local = None
    return [local.st_size, local.st_mtime_ns, local.st_ino] if local is not None else ["missing"]


def ref_from_json(data: dict[str, Any]) -> SampleRef:
    return SampleRef(**{**data, "extra": tuple(tuple(pair) for pair in data.get("extra", ()))})


def remove_stale_temporaries(folder: Path) -> int:
    """Delete ``*.partial`` files a killed build left behind; return how many."""
    stale = list(folder.glob(f"*{TMP_SUFFIX}")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def records_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}.json"


def signature_name(key: str) -> str:
    """The file of a chunk's near-copy signatures (:mod:`packer.pipeline.nearcopy`), next to its spill."""
    return f"{key}.sig.npy"


def cache_elsewhere() -> str:
    """The fix for a cache write a full or read-only disk refused: the cache is not in the output folder."""
    option = surface().call("build", "cache_dir", placeholder="DIR")
    return f"choose another cache folder ({option}, or set PACKER_WORK_DIR)"


@contextlib.contextmanager
def cache_output(path: Path) -> Iterator[Any]:
    """:func:`~packer.files.atomic_output` for a cache file (no fsync: :func:`load_cached_chunk` verifies
    entries and a damaged one is redone), whose refusal names the cache's fix, not the output's."""
    try:
        with atomic_output(path, durable=False) as fh:
            yield fh
    except FileSystemError as err:
        if output_elsewhere() not in str(err):  # not this file's refusal (e.g. fetching a raw file into TMPDIR)
            raise
        raise FileSystemError(str(err).replace(output_elsewhere(), cache_elsewhere())) from err


SPILL_SUFFIX = ".spill"
#: ``packer validate``'s masks of one chunk (:class:`SpillWriter` ``mask_dir``): each sample's mask
#: ``.npy`` bytes, zlib-compressed, back to back; beside it ``<key>.masks.json`` maps each sample key
#: to its [offset, length] there (:class:`ScratchMasks` reads them)
MASKS_SUFFIX = ".masks"
#: A chunk's pointer into the published version that holds its samples (:func:`write_packed_pointers`)
PACKED_SUFFIX = ".packed.json"


def spill_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}{SPILL_SUFFIX}"


def packed_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}{PACKED_SUFFIX}"


#: Joins a chunk's key to an earlier entry's pointer in a sample's ``spill``: a sample of the chunk
#: whose bytes it did not copy, read from where that entry's pointer says (:func:`referenced_name`)
VIA = ".via."


def chunk_of(spill_name: str) -> str:
    """The chunk key of a sample's ``spill`` (``<key>.spill``, ``<key>.packed.json`` or
    ``<key>.via.<earlier>.packed.json``)."""
    return spill_name.split(".", 1)[0]


def referenced_name(key: str, pointer: str) -> str:
    """The ``spill`` of a sample that chunk ``key`` holds by reference: its bytes are where the
    earlier entry's ``pointer`` (``<earlier>.packed.json``) says, in a published version."""
    return f"{key}{VIA}{pointer}"


def pointer_of(spill_name: str) -> str:
    """The pointer file (``<key>.packed.json``) a packed or referenced sample's bytes are read through."""
    return spill_name.split(VIA, 1)[1] if VIA in spill_name else spill_name


def referenced_entries(spill_names: Iterable[str], chunks: Iterable[str]) -> set[str]:
    """The earlier entries whose pointers the samples of ``chunks`` reference (of ``spill_names``,
    the samples' ``spill`` values): they must outlive those chunks' spills."""
    wanted = set(chunks)
    return {chunk_of(pointer_of(name)) for name in spill_names if VIA in name and chunk_of(name) in wanted}


class ReadBackError(IntegrityError, OSError):
    """A sample the build cache points to could not be read back from an earlier version's
    shards (changed or deleted while the build ran): an OSError to the readers that fall back on
    decoding, an IntegrityError (exit 5) where nothing does."""


def load_cached_chunk(cache_dir: Path, key: str, fmt: str, *, own_copy: bool = False) -> CachedChunk | None:
    """The chunk's records if its records file is complete and its samples' bytes check out
    (sizes, each sample's sha256 and the digest chained over them), else None (the chunk is
    then processed again, its unchanged files copied from this entry unit by unit where their
    own bytes still check out: :func:`packer.pipeline.filecache.copy_units`). The bytes are the
    spill file's or, once a build consumed the spill, the published shards' its
    ``.packed.json`` names; the samples returned say which. With ``own_copy`` (``packer build
    --keep-spill``) an entry whose bytes are read back from a published version is given a
    spill of its own first (:func:`_own_copy`), and its samples are read from there.

    The samples come with their sha256 for shard format ``fmt``: a chunk cached by a build of
    the other format is reused too (the key leaves packing out), its samples hashed once more
    for this one (:func:`~packer.shards.encode.pixels_digest`)."""
    try:
        entry = read_entry(cache_dir, key)
        if entry is not None and own_copy:
            entry = _own_copy(cache_dir, key, *entry)
        if entry is None:
            return None
        data, samples = entry
        checked = _chained_digest(cache_dir, samples, data["shard_format"], fmt)
        if checked is None or data.get("spill_digest") != checked[0]:
            return None
        if data["shard_format"] != fmt:
            samples = tuple(replace(s, sha256=digest) for s, digest in zip(samples, checked[1], strict=True))
        if any(not s.meta_sha256 for s in samples):  # an entry from before meta_sha256: filled from the bytes read
            samples = tuple(replace(s, meta_sha256=digest) for s, digest in zip(samples, checked[2], strict=True))
        signed = [s for s in samples if s.signature]  # none where the job skips near copies
        if signed and (len(signed) != len(samples) or
                       len(read_signatures(cache_dir / signature_name(key))) != len(samples)):
            return None
        issues = tuple(Issue(**i) for i in data["issues"])
        notes = tuple((str(n[0]), str(n[1])) for n in data.get("notes", ()))
        excluded = tuple(Excluded(**e) for e in data.get("excluded", ()))
        units = b"".join(index_keys(unit, move) for unit, _, move, _ in unit_records(data))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None  # a damaged cache entry is recomputed: its units copied where they check out, else decoded
    return CachedChunk(samples=samples, issues=issues, files=data["files"], notes=notes, excluded=excluded,
                       units=units)


class _NotKept(Exception):
    """The bytes read back for an entry's own copy did not check out: the copy is discarded."""


def _own_copy(cache_dir: Path, key: str, data: dict[str, Any], samples: tuple[SpilledSample, ...]
              ) -> tuple[dict[str, Any], tuple[SpilledSample, ...]] | None:
    """Entry ``key`` (its parsed records ``data`` and its ``samples`` as :func:`read_entry`
    gives them) with every sample's bytes in a spill of its own: the samples it reads back from
    a published version (through its ``.packed.json`` pointer, or an earlier entry's it holds
    them by reference through) are copied into ``<key>.spill``, in order, each checked against
    its records as it is read (:func:`checked_chain`: its pixels' xxh3 or sha256, then the digest
    chained over all of them). The records are rewritten where they change (samples held by
    reference become the entry's own, at their offsets in the new spill). An entry whose bytes
    are all its spill's already is returned as it is; None (nothing written) where the bytes do
    not check out: its files are then copied unit by unit where they do, else decoded again.
    Written spill first, records second, each under a temporary name: a kill between the two
    leaves a spill the records do not size, an entry refused and redone, never one misread."""
    own = f"{key}{SPILL_SUFFIX}"
    if all(sample.spill == own for sample in samples):
        return data, samples
    placed: list[SpilledSample] = []
    try:
        with cache_output(spill_path(cache_dir, key)) as fh:
            def keep(sample: SpilledSample, pixels: bytes, meta: bytes, mask: bytes) -> None:
                fh.write(pixels)
                fh.write(meta)
                fh.write(mask)
                offset = placed[-1].offset + placed[-1].nbytes if placed else 0
                placed.append(replace(sample, spill=own, offset=offset))

            if checked_chain(cache_dir, samples, data["shard_format"], visit=keep) != data.get("spill_digest"):
                raise _NotKept(key)  # the partial spill is removed, never renamed into place
    except _NotKept:
        return None
    body = {name: value for name, value in data.items() if name != RECORDS_CHECK}
    body["samples"] = [{**recorded, "spill": own, "offset": sample.offset}
                       for recorded, sample in zip(data["samples"], placed, strict=True)]
    body["spill_bytes"] = placed[-1].offset + placed[-1].nbytes
    body[RECORDS_CHECK] = records_digest(body)
    if body != data:
        with cache_output(records_path(cache_dir, key)) as fh:
            fh.write(canonical_json(body))
    return body, tuple(placed)


def index_keys(key: str, move: str) -> bytes:
    """What the cache's file index lists for a unit of per-file reuse: its key and, where it
    has one, its move key, 16 bytes each (:func:`packer.pipeline.filecache.write_file_index`)."""
    return bytes.fromhex(key) + (bytes.fromhex(move) if move else b"")


def unit_records(data: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...], str, str]]:
    """A records file's units of per-file reuse (:meth:`SpillWriter.finish`): each unit's key,
    the ids of its files, its move key (``""`` where it has none, as in entries written before
    move keys) and the xxh3-128 of the raw file its samples were made from, which confirms a move
    (``""`` where the entry records none: a unit without a move key, a file that could not be
    read, an entry written before). Raises KeyError, TypeError, ValueError or IndexError for
    damaged records."""
    return [(str(listed[0]), tuple(str(i) for i in listed[1]), str(listed[2]) if len(listed) > 2 else "",
             str(listed[3]) if len(listed) > 3 else "")
            for listed in data["units"]]


#: The records file's key holding :func:`records_digest` of the rest of the records
RECORDS_CHECK = "records_sha256"


class DamagedEntry(ValueError):
    """A cache entry's records or near-copy signatures do not match the digests written with them
    (a flipped bit, a block of zeros, an edit): the entry is not reused, its files are decoded
    again. ``path``: the file that did not check out; ``why``: what was found."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def records_digest(body: Mapping[str, Any]) -> str:
    """The sha256 an entry's records carry (:data:`RECORDS_CHECK`) over the rest of them, in
    canonical JSON: their sample records (shapes, dtypes, refs, digests), issues, notes,
    exclusions, units, and the sha256 of the signature file (``signatures_sha256``)."""
    return hashlib.sha256(canonical_json(body)).hexdigest()


def check_entry(cache_dir: Path, key: str, data: Mapping[str, Any]) -> None:
    """Raise :class:`DamagedEntry` unless entry ``key``'s records ``data`` (parsed) match the
    digest written with them and its signature file, where it has one, the sha256 they record
    of it. One sha256 over a small JSON and one over the signatures: the samples' bytes are
    checked against their own digests by the caller, not hashed here."""
    body = {name: value for name, value in data.items() if name != RECORDS_CHECK}
    if records_digest(body) != data[RECORDS_CHECK]:
        raise DamagedEntry(records_path(cache_dir, key),
                           "its records do not match the sha256 written with them (damaged on disk, or edited)")
    wanted = body.get("signatures_sha256")
    if wanted is None:
        return
    path = cache_dir / signature_name(key)
    try:
        found = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        raise DamagedEntry(path, f"its near-copy signatures could not be read ({err.strerror or err})") from err
    if found != wanted:
        raise DamagedEntry(path, "its near-copy signatures do not match the sha256 its records hold "
                                 "(damaged on disk, or edited)")


def read_entry(cache_dir: Path, key: str) -> tuple[dict[str, Any], tuple[SpilledSample, ...]] | None:
    """A cache entry's records (the parsed ``<key>.json``) and its samples, each naming where its
    bytes are now: the spill file, or (once a build consumed it) the ``.packed.json`` pointer
    into the published shards. A sample the entry holds by reference (:func:`referenced_name`)
    is read through the earlier entry's pointer until a build publishes this one's. None when
    the records are missing or the bytes are nowhere (or the spill is not the size recorded).
    The records and the signature file are checked against the digests written with them
    (:func:`check_entry`: raises :class:`DamagedEntry`); the samples' bytes are not: the caller
    checks them against the samples' digests. Raises OSError, ValueError, KeyError, TypeError or
    AttributeError for records that cannot be read."""
    records = records_path(cache_dir, key)
    spill, packed = spill_path(cache_dir, key), packed_path(cache_dir, key)
    if not records.is_file():
        return None
    data = json.loads(records.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or RECORDS_CHECK not in data:
        return None  # an entry written before its records were checked: missed, its files decoded again
    check_entry(cache_dir, key, data)
    samples = tuple(SpilledSample(**{**s, "ref": ref_from_json(s["ref"]), "shape": tuple(s["shape"])})
                    for s in data["samples"])
    if spill.is_file():
        if data.get("spill_bytes") != spill.stat().st_size:
            return None
    elif packed.is_file():
        samples = tuple(replace(s, spill=packed.name) for s in samples)
    elif data.get("spill_bytes") != 0 or any(VIA not in s.spill for s in samples):
        return None  # an entry with bytes of its own has a spill file until its pointer is written
    return data, samples


def _chained_digest(cache_dir: Path, samples: Sequence[SpilledSample], fmt: str,
                    wanted: str) -> tuple[str, list[str], list[str]] | None:
    """The digest :class:`SpillWriter` recorded for ``samples`` (sha256 over each sample's own
    sha256, :func:`~packer.shards.encode.pixels_digest` for shard format ``fmt``, its metadata
    bytes and mask bytes, in order), recomputed from where their bytes are now
    (the spill file, or the published shards a pointer names), with each sample's sha256 for
    shard format ``wanted`` (their own where ``wanted`` is ``fmt``) and each sample's
    :attr:`~packer.records.SpilledSample.meta_sha256`; None when a sample's pixels do
    not match its own sha256 or its bytes are missing, short or unreadable (a spill with holes
    punched by an interrupted pack pass reads as zeros: its pixels no longer match)."""
    digests: list[str] = []
    metas: list[str] = []

    def rehash(sample: SpilledSample, pixels: bytes, meta: bytes, mask: bytes) -> None:
        metas.append(sample.meta_sha256 or hashlib.sha256(meta + mask).hexdigest())  # checked by the chain
        digests.append(sample.sha256 if wanted == fmt else
                       pixels_digest(pixels, shape=sample.shape, dtype=sample.dtype, fmt=wanted).hexdigest())

    chain = checked_chain(cache_dir, samples, fmt, visit=rehash)
    return None if chain is None else (chain, digests, metas)


def pixels_check(pixels: bytes | memoryview) -> int:
    """The check a cache entry records of a sample's pixel bytes as spilled
    (:attr:`~packer.records.SpilledSample.pixels_xxh3`): their xxh3-64, never 0 (0 says "not
    recorded"). A later build reads the bytes back from where they are and compares this
    instead of hashing them with sha256 again: any damage to them (a flipped bit, a hole, a short
    file) changes it, and it costs a few percent of a sha256 over the same bytes."""
    return xxhash.xxh3_64_intdigest(pixels) or 1


def checked_chain(cache_dir: Path, samples: Sequence[SpilledSample], fmt: str, *,
                  visit: Callable[[SpilledSample, bytes, bytes, bytes], None]) -> str | None:
    """The digest chained over ``samples`` as :class:`SpillWriter` made it (each sample's own
    sha256 for shard format ``fmt``, then its metadata and mask bytes, in order), recomputed from
    where their bytes are now; ``visit(sample, pixels, metadata, mask)`` is called for each
    sample whose pixels check out: against the xxh3 recorded with its sha256
    (:func:`pixels_check`) or, in an entry without one, against its sha256. None when a
    sample's pixels do not match or its bytes are missing, short or unreadable (a spill with
    holes punched by an interrupted pack pass reads as zeros): the caller must then discard what ``visit`` was given."""
    chain = hashlib.sha256()
    with SpillReader(cache_dir) as reader:
        for sample in samples:
            try:
                pixels, meta, mask = reader.read_bytes(sample)
            except OSError:  # read_bytes says every failure to read back as an OSError
                return None
            if sample.pixels_xxh3:  # recorded from the same bytes as its sha256, and far cheaper to check
                if pixels_check(pixels) != sample.pixels_xxh3:
                    return None
                chain.update(bytes.fromhex(sample.sha256))
            else:
                digest = pixels_digest(pixels, shape=sample.shape, dtype=sample.dtype, fmt=fmt)
                if digest.hexdigest() != sample.sha256:
                    return None
                chain.update(digest.digest())
            chain.update(meta)
            if mask:
                chain.update(mask)
            visit(sample, pixels, meta, mask)
    return chain.hexdigest()


class _Discard(contextlib.AbstractContextManager["_Discard"]):
    """A file-like sink for ``packer validate``: counts nothing, keeps nothing."""

    def write(self, data: bytes) -> int:
        return len(data)

    def __exit__(self, *exc: object) -> None:
        return None


class ScratchMasks:
    """The masks ``packer validate`` kept in its scratch folder ``mask_dir`` (:data:`MASKS_SUFFIX`):
    a sample's mask ``.npy`` bytes, as a build's spill holds them."""

    def __init__(self, mask_dir: Path) -> None:
        self.mask_dir = mask_dir
        self._places: dict[str, dict[str, list[int]]] = {}

    def mask_bytes(self, sample: SpilledSample) -> bytes:
        """``sample``'s mask bytes; empty where it has none."""
        if not sample.mask_bytes:
            return b""
        chunk = sample.spill.removesuffix(SPILL_SUFFIX)
        path = self.mask_dir / f"{chunk}{MASKS_SUFFIX}"
        if chunk not in self._places:
            self._places[chunk] = json.loads(Path(f"{path}.json").read_bytes())
        offset, length = self._places[chunk][sample.key]
        with open(path, "rb") as fh:
            fh.seek(offset)
            mask = zlib.decompress(fh.read(length))
        if len(mask) != sample.mask_bytes:
            raise IntegrityError(f"{path}: sample {sample.key}'s mask holds {len(mask)} bytes, not the "
                                 f"{sample.mask_bytes} its record says; run packer validate again")
        return mask


class SpillFreed(OSError):
    """A sample's spilled bytes were already freed (punched out) by an earlier attempt at
    writing its shard; that attempt's output holds them (:mod:`packer.pipeline.assemble`)."""


class SpillReader(contextlib.AbstractContextManager["SpillReader"]):
    """Reads spilled samples, keeping up to :attr:`OPEN_FILES` files open while a shard is
    assembled (its samples usually share few files). A sample whose ``spill`` is a
    ``.packed.json`` pointer is read back from the published shard that pointer names: its
    pixels (the ``.npy`` member's data or the ``image`` cell), its metadata (the record's
    ``metadata``, in canonical JSON as spilled) and its mask (``.npy`` bytes), exactly the
    bytes the spill held."""

    #: At most this many files stay open (least recently read closed first): a shard of a job
    #: packed in key order draws from every spill file, one per ~32 raw files, so one descriptor
    #: per file it touched ran out of ``ulimit -n`` as the dataset grew. A shard reading from
    #: fewer files (the usual case) opens each once, as before.
    OPEN_FILES = 24

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._files: OrderedDict[str, io.BufferedReader] = OrderedDict()
        self._pointers: dict[str, tuple[Path, dict[str, list[Any]]]] = {}
        self._tables: dict[str, pa.Table] = {}  # the last Parquet shard read back (one at a time)

    def read(self, sample: SpilledSample) -> tuple[bytes, dict[str, Any], bytes]:
        """The pixel bytes, metadata and mask (``.npy`` bytes; empty without one) of ``sample``."""
        if sample.spill.endswith(PACKED_SUFFIX):  # the record's metadata as parsed, not spelled out and parsed again
            pixels, metadata, mask, where = self._packed(sample)
            _sized(sample, where, pixels, None, mask)
            return pixels, metadata, mask
        pixels, meta, mask = self.read_bytes(sample)
        return pixels, json.loads(meta), mask

    def read_bytes(self, sample: SpilledSample) -> tuple[bytes, bytes, bytes]:
        """Pixel bytes, metadata JSON bytes and mask bytes of ``sample``, as spilled."""
        if sample.spill.endswith(PACKED_SUFFIX):
            pixels, metadata, mask, where = self._packed(sample)
            meta = canonical_json(metadata)
        else:
            where = self.cache_dir / sample.spill
            fh = self._open(str(where))
            fh.seek(sample.offset)
            pixels, meta = fh.read(sample.pixel_bytes), fh.read(sample.meta_bytes)
            mask = fh.read(sample.mask_bytes) if sample.mask_bytes else b""
            if meta and not meta.strip(b"\0"):  # JSON text never holds a NUL: a punched range reads as zeros
                raise SpillFreed(f"{where}: sample {sample.key}'s spilled bytes were already freed by an earlier "
                                 "attempt at writing its shard")
        _sized(sample, where, pixels, meta, mask)
        return pixels, meta, mask

    def location(self, sample: SpilledSample) -> str:
        """The file ``sample``'s bytes are read from: its spill file in the cache, or the published
        shard its pointer names (the pointer itself where it cannot be read), without reading
        them; for a message that names the file whose bytes did not check out."""
        if not sample.spill.endswith(PACKED_SUFFIX):
            return str(self.cache_dir / sample.spill)
        try:
            version, where = self._pointer(pointer_of(sample.spill))
            return str(version / where[sample.key][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return str(self.cache_dir / pointer_of(sample.spill))

    def _pointer(self, name: str) -> tuple[Path, dict[str, list[Any]]]:
        """The version folder and the per-sample places (shard file, position) pointer ``name`` records."""
        pointer = self._pointers.get(name)
        if pointer is None:
            data = json.loads((self.cache_dir / name).read_text(encoding="utf-8"))
            pointer = self._pointers[name] = (Path(data["version"]), data["samples"])
        return pointer

    def _open(self, path: str) -> io.BufferedReader:
        fh = self._files.get(path)
        if fh is not None:
            self._files.move_to_end(path)
            return fh
        if len(self._files) >= self.OPEN_FILES:
            self._files.popitem(last=False)[1].close()
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as err:
            if err.errno not in (errno.EMFILE, errno.ENFILE) or not self._files:
                raise
            self.close()  # a lower limit than OPEN_FILES allows for: hold only this one
            fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._files[path] = fh
        return fh

    def _packed(self, sample: SpilledSample) -> tuple[bytes, dict[str, Any], bytes, Path]:
        """:meth:`_read_packed`, its failures said as a :class:`ReadBackError` (an OSError, as every
        failure to read back is, and an IntegrityError, exit 5, where it reaches the command line)
        naming the pointer and the fix: the earlier version it reads from was changed or deleted
        while this build ran (a file gone is that too: it was an internal error, a bare
        FileNotFoundError)."""
        try:
            return self._read_packed(sample)
        except (OSError, KeyError, ValueError, TypeError, tarfile.TarError, pa.ArrowException) as err:
            raise ReadBackError(
                f"{self.cache_dir / pointer_of(sample.spill)}: sample {sample.key} could not be read back from the "
                f"earlier version the build cache points to ({type(err).__name__}: {err}); was that version "
                "changed or deleted while this build ran? Run the build again: it decodes those files anew") from err

    def _read_packed(self, sample: SpilledSample) -> tuple[bytes, dict[str, Any], bytes, Path]:
        """The pixel bytes, the record's metadata and the mask's ``.npy`` bytes of a sample
        read back from the published shard its pointer names, and that shard's path."""
        version, where = self._pointer(pointer_of(sample.spill))
        file, position = where[sample.key]
        path = version / file
        if path.suffix == ".parquet":
            table = self._tables.get(str(path))
            if table is None:
                self._tables.clear()
                with arrow_readable(path) as source:
                    table = self._tables[str(path)] = pq.read_table(source, memory_map=True)
            if table["key"][position].as_py() != sample.key:
                raise KeyError(f"{path}: row {position} is not sample {sample.key}")
            pixels = table["image"][position].as_py()
            info = json.loads(table["metadata"][position].as_py())
            mask = b""
            if sample.mask_bytes:
                shape, dtype = table["mask_shape"][position].as_py(), table["mask_dtype"][position].as_py()
                mask = npy_header(tuple(shape), np.dtype(dtype).str) + table["mask"][position].as_py()
            return pixels, info["metadata"], mask, path
        return (*tar_sample_parts(self._open(str(path)), path, position, sample.key), path)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        self._tables.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sized(sample: SpilledSample, where: Path, pixels: bytes, meta: bytes | None, mask: bytes) -> None:
    """Raise OSError naming ``where`` and the fix unless the bytes read back for ``sample`` have
    the sizes its records say (``meta`` None: not compared)."""
    if (len(pixels) != sample.pixel_bytes or len(mask) != sample.mask_bytes
            or (meta is not None and len(meta) != sample.meta_bytes)):
        raise OSError(f"{where}: sample {sample.key} is not what the build cache's records say; delete the "
                      "build cache folder and rebuild")


def tar_sample_as_spilled(fh: io.BufferedReader, path: Path, position: int, key: str) -> tuple[bytes, bytes, bytes]:
    """Sample ``key`` of the tar shard ``path`` (open as ``fh``; its first header at
    ``position``) as the spill held it: the pixel bytes (the ``.npy`` member's data), the
    metadata in canonical JSON (the record's ``metadata``) and the mask's ``.npy`` bytes. Raises
    KeyError, ValueError or ``tarfile.TarError`` where the shard does not hold it whole."""
    pixels, metadata, mask = tar_sample_parts(fh, path, position, key)
    return pixels, canonical_json(metadata), mask


def tar_sample_parts(fh: io.BufferedReader, path: Path, position: int, key: str) -> tuple[bytes, dict[str, Any], bytes]:
    """:func:`tar_sample_as_spilled` with the metadata as parsed from the record: the pixels
    copied once out of the member read."""
    members = read_sample_at(fh, position, key)
    npy = members["npy"]
    layout = npy_layout(bytes(npy[:NPY_HEAD]))
    if layout is None:
        raise ValueError(f"{path}: sample {key}'s .npy member is not in packer's own form")
    info = json.loads(bytes(members["json"]))
    metadata: dict[str, Any] = info["metadata"]
    return bytes(memoryview(npy)[layout[2]:]), metadata, bytes(members.get("mask.npy", b""))


class SpillPuncher:
    """Worker side of freeing the spill: a shard task punches each sample's spilled bytes out as
    soon as the shard file it is writing holds them (flushed to the kernel), so a build's extra
    disk is not a shard per worker but about nothing. Spill files in ``keep`` are left whole;
    ``.packed.json`` samples have nothing to free. Where holes cannot be punched it stops
    trying (the client still deletes finished spill files)."""

    #: At most this many spill files stay open (least recently punched closed first), as
    #: :attr:`SpillReader.OPEN_FILES`: descriptors bounded whatever the number of spill files.
    OPEN_FILES = 24

    def __init__(self, cache_dir: Path, keep: Iterable[str] = ()) -> None:
        self.cache_dir = cache_dir
        self._keep = set(keep)
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._works = True

    def punch(self, sample: SpilledSample) -> None:
        if not self._works or not sample.spill.endswith(SPILL_SUFFIX) or sample.spill in self._keep:
            return
        fd = self._fds.get(sample.spill)
        if fd is not None:
            self._fds.move_to_end(sample.spill)
        else:
            if len(self._fds) >= self.OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
            fd = self._fds[sample.spill] = self._open(self.cache_dir / sample.spill)
        self._works = punch_hole(fd, sample.offset, sample.nbytes)

    def _open(self, path: Path) -> int:
        try:
            return os.open(path, os.O_WRONLY)
        except OSError as err:
            if err.errno not in (errno.EMFILE, errno.ENFILE) or not self._fds:
                raise
            self.close()  # a lower limit than OPEN_FILES allows for: hold only this one
            return os.open(path, os.O_WRONLY)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def write_packed_pointers(cache_dir: Path, version_dir: Path, placed: Iterable[tuple[str, str, str, int]],
                          skip: Iterable[str] = ()) -> int:
    """As a version is published (before its manifest is renamed in, so that a build stopped once
    the version is there still leaves them): for each chunk whose samples are in it, write
    ``<key>.packed.json`` (the version folder and, per sample key, its shard file and position)
    so that a later build reuses the chunk from those shards once its spill is gone. A pointer
    into a version that never got its manifest reads back nothing that checks, and its files are
    decoded again.
    ``placed``: (chunk key, sample key, shard file, position) of every packed sample; ``skip``:
    chunks with samples that were not packed (their spill, or an older pointer, stays the
    source). A pointer that does not match its records is refused when it is loaded
    (:func:`load_cached_chunk`), never trusted. Returns how many were written."""
    by_chunk: dict[str, dict[str, list[Any]]] = defaultdict(dict)
    for chunk, key, file, position in placed:
        by_chunk[chunk][key] = [file, position]
    skipped = set(skip)
    version = os.fspath(version_dir.resolve())
    written = 0
    for chunk, samples in sorted(by_chunk.items()):
        if chunk in skipped:
            continue
        with cache_output(packed_path(cache_dir, chunk)) as fh:
            fh.write(canonical_json({"version": version, "samples": samples}))
        written += 1
    return written


class SpillConsumer:
    """Frees what is left of the spill as the pack pass copies it into shards (client side,
    after each shard's task has returned): the blocks of the packed samples' byte ranges are
    punched out of their spill files (:func:`packer.files.punch_hole`) and a spill file whose
    samples are all packed is deleted. With :class:`SpillPuncher` freeing tar shards' samples as they are written, a
    build needs almost no disk beyond the dataset. Spill files listed in ``keep`` (chunks with
    samples that are not packed, e.g. dropped by the split) are left whole. Where holes cannot
    be punched, only whole files go.

    A hole frees only the file system blocks wholly inside it, so each file's packed ranges are
    kept merged and punched as one: a block shared by two samples packed into different shards
    (neighbours in a chunk, split apart) is freed once both are packed."""

    def __init__(self, cache_dir: Path, spills: Sequence[str], keep: Iterable[str] = ()) -> None:
        self.cache_dir = cache_dir
        self.keep = frozenset(keep)
        self._left: dict[str, int] = defaultdict(int)
        for name in spills:
            if name.endswith(SPILL_SUFFIX) and name not in self.keep:
                self._left[name] += 1
        self._packed: dict[str, list[list[int]]] = defaultdict(list)  # merged [start, end) ranges per file
        self._punch = True
        self.freed = 0  # bytes given back (blocks of holes and of deleted files)

    def packed(self, samples: Iterable[SpilledSample]) -> None:
        """``samples`` are now in a complete shard: free their spill bytes."""
        ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for sample in samples:
            if sample.spill in self._left:
                ranges[sample.spill].append((sample.offset, sample.offset + sample.nbytes))
        for name, spans in ranges.items():
            self._left[name] -= len(spans)
            path = self.cache_dir / name
            if self._left[name] <= 0:
                del self._left[name]
                self._packed.pop(name, None)
                with contextlib.suppress(FileNotFoundError):
                    self.freed += path.stat().st_blocks * 512
                    path.unlink()
            elif self._punch:
                self._punch_out(path, self._merge(name, spans))

    def _merge(self, name: str, spans: list[tuple[int, int]]) -> list[list[int]]:
        """Add ``spans`` to the file's packed ranges; return the merged ranges they touch."""
        merged: list[list[int]] = []
        for start, end in sorted([*map(tuple, self._packed[name]), *spans]):
            if merged and merged[-1][1] >= start:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self._packed[name] = merged
        return [r for r in merged if any(r[0] <= start and end <= r[1] for start, end in spans)]

    def _punch_out(self, path: Path, ranges: list[list[int]]) -> None:
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return
        try:
            before = os.fstat(fd).st_blocks
            for start, end in ranges:
                if not punch_hole(fd, start, end - start):
                    self._punch = False
                    break
            self.freed += (before - os.fstat(fd).st_blocks) * 512
        finally:
            os.close(fd)


@dataclass(frozen=True)
class KnownDigest:
    """A sha256 already known (hex), standing in for the hash object :meth:`SpillWriter.add` takes:
    a sample copied from an entry of the same shard format keeps the sha256 checked there, so its
    pixels are not hashed a second time."""

    hex: str

    def digest(self) -> bytes:
        return bytes.fromhex(self.hex)

    def hexdigest(self) -> str:
        return self.hex


_SAMPLE_FIELDS = tuple(f.name for f in fields(SpilledSample) if f.name != "ref")


def _sample_json(sample: SpilledSample) -> dict[str, Any]:
    """``dataclasses.asdict(sample)`` (its fields and its ref's are flat: nothing to copy deeply),
    at a fraction of the cost: an entry's records are written for every chunk a build touches."""
    out = {name: getattr(sample, name) for name in _SAMPLE_FIELDS}
    out["ref"] = {name: getattr(sample.ref, name) for name in REF_FIELDS}
    return out


class SpillWriter:
    """Writes one chunk's cache entry: samples into the spill as they come, then the records.

    Without a cache folder (``packer validate``) the bytes go nowhere, but the records (sizes,
    sha256s) are made exactly as in a build; ``mask_dir`` (the run's scratch folder) then keeps
    the masks alone, compressed (:data:`MASKS_SUFFIX`), so the label-conflict rule compares
    copies' masks as the build does from its spill. Use as a context manager around the samples;
    :meth:`finish` after it writes the signatures and the records file. ``fmt``: the shard
    format the samples' sha256s are made for (:func:`~packer.shards.encode.pixels_digest`).
    """

    def __init__(self, cache_dir: Path | None, key: str, *, sig_dir: Path | None, fmt: str,
                 mask_dir: Path | None = None) -> None:
        self.cache_dir, self.key, self.sig_dir, self.fmt = cache_dir, key, sig_dir, fmt
        self.mask_dir = mask_dir if cache_dir is None else None
        self._masks: Any = None
        self._mask_places: dict[str, list[int]] = {}
        self._mask_offset = 0
        self.spill_name = f"{key}{SPILL_SUFFIX}"
        self.sig_name = signature_name(key) if sig_dir is not None else ""
        self.samples: list[SpilledSample] = []
        self._signatures: list[np.void] = []
        self._chain = hashlib.sha256()
        self._offset = 0
        self._stack = contextlib.ExitStack()
        self._fh: Any = None

    def __enter__(self) -> SpillWriter:
        target = cache_output(self.cache_dir / self.spill_name) if self.cache_dir is not None else _Discard()
        self._fh = self._stack.enter_context(target)
        if self.mask_dir is not None:
            self._masks = self._stack.enter_context(cache_output(self.mask_dir / f"{self.key}{MASKS_SUFFIX}"))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)  # type: ignore[arg-type]

    def add(self, *, key: str, ref: SampleRef, pixels: bytes, digest: Any, meta: bytes, shape: tuple[int, ...],
            dtype: str, signature: np.void | None, mask: bytes = b"", stored: str = "",
            blank: bool = False, instance: str = "") -> None:
        """Append one sample: its pixel bytes, sha256 object ``digest`` of them (made by
        :func:`~packer.shards.encode.pixels_digest` for this writer's format), metadata JSON
        and, where the source has masks, the mask's ``.npy`` bytes; ``stored``: its
        :attr:`~packer.records.Sample.stored_digest`; ``blank``: every pixel holds one value
        (:func:`~packer.pipeline.dedup.is_blank`); ``instance``: its :attr:`~packer.records.Sample.instance`."""
        self._fh.write(pixels)
        self._fh.write(meta)
        if mask:
            self._fh.write(mask)
            if self._masks is not None:
                packed = zlib.compress(mask, 1)  # a mask is mostly background: a few percent of its bytes
                self._masks.write(packed)
                self._mask_places[key] = [self._mask_offset, len(packed)]
                self._mask_offset += len(packed)
        # the spill's digest chains the samples' own digests: no second pass over the pixels
        meta_sha256, sig_row = self._chained(digest.digest(), meta, mask, signature)
        self.samples.append(SpilledSample(
            key=key, ref=ref, spill=self.spill_name, offset=self._offset, pixel_bytes=len(pixels),
            meta_bytes=len(meta), shape=shape, dtype=dtype, sha256=digest.hexdigest(), signature=self.sig_name,
            sig_row=sig_row, mask_bytes=len(mask), meta_sha256=meta_sha256, pixels_xxh3=pixels_check(pixels),
            stored_digest=stored, blank=blank, instance=instance))
        self._offset += len(pixels) + len(meta) + len(mask)

    def refer(self, held: SpilledSample, *, meta: bytes, mask: bytes, signature: np.void | None) -> None:
        """Append a sample an earlier entry holds without copying its bytes: ``held`` as read from
        that entry (its ``spill`` the pointer into the published version that holds it, its
        sha256 made for this writer's format, its ref already this build's), with its checked
        metadata and mask bytes ``meta`` and ``mask``. Its bytes are read from that version until
        a build publishes this chunk's samples (:func:`write_packed_pointers`); the records chain
        its digest as :meth:`add` would, so the entry checks out the same way."""
        meta_sha256, sig_row = self._chained(bytes.fromhex(held.sha256), meta, mask, signature)
        self.samples.append(replace(held, spill=referenced_name(self.key, pointer_of(held.spill)),
                                    signature=self.sig_name, sig_row=sig_row, meta_sha256=meta_sha256))

    def _chained(self, digest: bytes, meta: bytes, mask: bytes, signature: np.void | None) -> tuple[str, int]:
        """Chain a sample's pixel digest, metadata and mask into the entry's digest and keep its
        signature row; its ``meta_sha256`` and signature row."""
        if signature is not None:
            self._signatures.append(signature)
        self._chain.update(digest)
        self._chain.update(meta)
        if mask:
            self._chain.update(mask)
        meta_digest = hashlib.sha256(meta)
        meta_digest.update(mask)
        return meta_digest.hexdigest(), len(self._signatures) - 1 if self.sig_dir is not None else -1

    def finish(self, *, files: int, issues: Sequence[Issue], notes: Sequence[tuple[str, str]] = (),
               excluded: Sequence[Excluded] = (), units: Sequence[tuple[str, Sequence[str], str, str]] = (),
               cached: bool = True) -> None:
        """Write the signatures (when kept) and, with a cache folder, the records file (``notes``:
        the readers' warnings, and ``excluded``, the files left out on purpose, each kept only
        where there are some, so other entries keep their bytes; ``units``: each unit of
        per-file reuse's key, the ids of its files, its move key, ``""`` for none, and the xxh3-128
        of its raw file that confirms a move, ``""`` for none, :mod:`packer.pipeline.filecache`).
        ``cached`` False: no records file, so no later build reuses the entry (it holds a record
        true of this build only); the spill still serves this build's packing."""
        if self.mask_dir is not None:
            with cache_output(self.mask_dir / f"{self.key}{MASKS_SUFFIX}.json") as fh:
                fh.write(canonical_json(self._mask_places))
        signed = b""
        if self.sig_dir is not None:
            buffer = io.BytesIO()
            write_signatures(buffer, self._signatures)
            signed = buffer.getvalue()
            with cache_output(self.sig_dir / self.sig_name) as fh:
                fh.write(signed)
        if self.cache_dir is not None and not cached:  # nor an earlier build's records for this key
            records_path(self.cache_dir, self.key).unlink(missing_ok=True)
        elif self.cache_dir is not None:
            if self.samples and not self._offset:  # every sample held by reference: no spill file of its own
                (self.cache_dir / self.spill_name).unlink(missing_ok=True)
            record = {"files": files, "spill_bytes": self._offset, "spill_digest": self._chain.hexdigest(),
                      "shard_format": self.fmt,
                      "samples": [_sample_json(s) for s in self.samples], "issues": [i.to_json() for i in issues],
                      "units": [[unit, list(ids), *([move, *([source] if source else [])] if move else [])]
                                for unit, ids, move, source in units]}
            if notes:
                record["notes"] = [list(note) for note in notes]
            if excluded:
                record["excluded"] = [asdict(e) for e in excluded]
            if self.sig_dir is not None:  # the signatures, checked with the records before reuse (check_entry)
                record["signatures_sha256"] = hashlib.sha256(signed).hexdigest()
            record[RECORDS_CHECK] = records_digest(record)
            with cache_output(records_path(self.cache_dir, self.key)) as fh:
                fh.write(canonical_json(record))
