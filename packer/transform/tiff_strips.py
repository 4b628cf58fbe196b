"""The compressed strips and tiles of a TIFF page, checked without decoding a pixel: does each
Deflate, LZW or PackBits strip or tile decode to the bytes its rows need?

libtiff (under OpenCV) pads a strip whose stream is cut short (a StripByteCounts smaller than
the stream) or damaged with zero rows and returns the page, so packer would pack zero rows as
if they were data: black rows of an image, background rows of a mask. A Deflate stream damaged
in place can still give every row, wrong: libtiff stops once it has the rows and never reaches
the stream's Adler-32 checksum, so packer inflates each Deflate strip to its end. Both decoders ask
:func:`strip_problem` first: the image reader
(:func:`packer.read.image_structure.check_strip_data`) and the mask decoder
(:mod:`packer.transform.mask`), which may not import a reader. Pure functions of the file's
bytes and one IFD's integer tags. Which IFDs of a chain are pages (:func:`page_indices`) is
here too, for the same two decoders: a thumbnail is no page of an image, nor of its mask.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

Tags = dict[int, tuple[int, ...]]  # TIFF tag → its integer values

_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES = 256, 257, 258, 277
_TIFF_ROWS_PER_STRIP, _TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH = 278, 322, 323
_TIFF_COMPRESSION, _TIFF_PLANAR = 259, 284
#: The tags :func:`strip_problem` reads of an IFD: its size, layout, compression and the offsets
#: and byte counts of its strips (273, 279) or tiles (324, 325).
STRIP_TAGS = frozenset({_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES, _TIFF_ROWS_PER_STRIP,
                        _TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH, _TIFF_COMPRESSION, _TIFF_PLANAR, 273, 279, 324, 325})


#: NewSubfileType: bit 0 flags a reduced-resolution version of another image in the file
TIFF_NEW_SUBFILE_TYPE = 254


def is_reduced(tags: Tags) -> bool:
    """The IFD whose integer ``tags`` are given is a reduced-resolution image (NewSubfileType
    bit 0): a thumbnail or a pyramid level of another image in the file, not a page."""
    return bool(tags.get(TIFF_NEW_SUBFILE_TYPE, (0,))[0] & 1)


def page_indices(chain: Sequence[Tags]) -> list[int]:
    """The indices of the IFDs of ``chain`` (each IFD's integer tags, in order) that are pages:
    all but the reduced-resolution ones (:func:`is_reduced`), or all where every IFD is flagged
    reduced (there is then no full-resolution image they could stand for). The image reader's
    pages and a TIFF mask's are chosen by this one rule, so a mask saved as its image was (a
    thumbnail beside each) has a page for each of the image's."""
    full = [index for index, tags in enumerate(chain) if not is_reduced(tags)]
    return full or list(range(len(chain)))


def _data_chunks(tags: Tags) -> list[tuple[int, int, int]]:
    """(offset, stored bytes, decoded bytes) of each strip or tile of one IFD, as libtiff sizes
    its decode buffer: a strip holds RowsPerStrip rows (the last one the rest), a tile TileLength
    rows of TileWidth pixels; one sample a pixel when the planes are separate
    (PlanarConfiguration 2), else SamplesPerPixel."""
    if _TIFF_WIDTH not in tags or _TIFF_LENGTH not in tags:
        return []
    width, height = tags[_TIFF_WIDTH][0], tags[_TIFF_LENGTH][0]
    samples = 1 if tags.get(_TIFF_PLANAR, (1,))[0] == 2 else tags.get(_TIFF_SAMPLES, (1,))[0]
    bits = tags.get(_TIFF_BITS, (1,))[0] * samples
    if _TIFF_TILE_WIDTH in tags and _TIFF_TILE_LENGTH in tags:
        offsets, counts = tags.get(324, ()), tags.get(325, ())
        per = [(tags[_TIFF_TILE_WIDTH][0] * bits + 7) // 8 * tags[_TIFF_TILE_LENGTH][0]] * len(offsets)
    else:
        offsets, counts = tags.get(273, ()), tags.get(279, ())
        rows = max(1, min(tags.get(_TIFF_ROWS_PER_STRIP, (height,))[0], height))
        strips = -(-height // rows)
        # a separate-planes file repeats the strips of one plane for each sample
        per = [(width * bits + 7) // 8 * min(rows, height - (i % strips) * rows) for i in range(len(offsets))]
    return list(zip(offsets, counts, per, strict=False))


#: How far past the bytes its rows need a Deflate strip is inflated to reach its stream's end
#: (and its Adler-32 checksum): a writer that pads its last strip to RowsPerStrip rows stores a
#: little more. A stream still going here is left unchecked past it, as libtiff leaves it unread:
#: a zip bomb is never inflated further.
DEFLATE_SLACK = 64 * 1024


def _rows_before_error(raw: bytes, wanted: int) -> int:
    """``wanted`` where a broken zlib stream gives that many bytes before it breaks, else 0."""
    try:
        return wanted if len(zlib.decompressobj().decompress(raw, wanted)) >= wanted else 0
    except zlib.error:
        return 0


def _inflated(raw: bytes, wanted: int) -> tuple[int, str]:
    """Bytes a zlib (TIFF Deflate) stream gives, up to ``wanted`` plus :data:`DEFLATE_SLACK`,
    and what is wrong with it ("" where nothing is). The stream is inflated to its end, where
    zlib checks its Adler-32: a damaged stream can still give every byte the rows need, with
    wrong values, and only its checksum (or a later block) tells. One that gives the rows' bytes
    but stops without its end (the data cut inside its last block or checksum) is wrong too;
    one that gives fewer is judged by its length (the caller's message). A stream that breaks
    counts the rows' bytes where it gives them all first (libtiff decodes such a strip whole,
    wrong), else 0."""
    inflater, got, limit = zlib.decompressobj(), 0, wanted + DEFLATE_SLACK
    try:
        got = len(inflater.decompress(raw, limit))
    except zlib.error as err:
        return _rows_before_error(raw, wanted), f"is not a valid Deflate stream ({err})"
    if inflater.eof or got < wanted or inflater.unconsumed_tail or got >= limit:  # ended; short; past the slack
        return got, ""
    return got, ("ends before its stream does (its last block or Adler-32 checksum is missing, so its data "
                 "cannot be told whole)")


#: code k of a run between Clears is read with this many bits (k = 0, 1, ...): TIFF LZW widens
#: its codes one code early, when the table (258 entries, then one more a code) reaches 511,
#: 1023 and 2047; after 4096 entries (3838 codes) it stops growing, at 12 bits
_LZW_WIDTHS = np.concatenate([np.full(254, 9), np.full(512, 10), np.full(1024, 11), np.full(2048, 12)]).astype(np.int64)
_LZW_FULL = np.full(4096, 12, np.int64)  # codes of a run past a full table


def _lzw_run(padded: np.ndarray, start: int, total_bits: int) -> tuple[np.ndarray, int]:
    """The codes of one run from bit ``start``, up to and with the first Clear (256) or End of
    Information (257), or to the end of the data; and the bit after the last one read."""
    taken: list[np.ndarray] = []
    first = 0  # the run's next code
    while True:
        widths = _LZW_WIDTHS[first:] if first < len(_LZW_WIDTHS) else _LZW_FULL
        ends = start + np.cumsum(widths)
        fit = int(np.searchsorted(ends, total_bits, side="right"))  # the codes that end in the data
        if fit == 0:
            return (np.concatenate(taken) if taken else np.zeros(0, np.int64)), start
        complete = fit == len(widths)
        widths, ends = widths[:fit], ends[:fit]
        begins = ends - widths
        byte = begins >> 3
        window = (padded[byte].astype(np.int64) << 16) | (padded[byte + 1].astype(np.int64) << 8) | padded[byte + 2]
        codes = (window >> (24 - (begins & 7) - widths)) & ((1 << widths) - 1)
        stop = np.flatnonzero((codes == 256) | (codes == 257))
        if stop.size:
            taken.append(codes[:stop[0] + 1])
            return np.concatenate(taken), int(ends[stop[0]])
        taken.append(codes)
        first, start = first + fit, int(ends[-1])
        if not complete:
            return np.concatenate(taken), start


def _string_lengths(parent: np.ndarray) -> np.ndarray:
    """Each code's string length, where ``parent[i]`` is the earlier code whose string code i's
    extends by one byte (−1: a literal, one byte): list ranking by pointer jumping, about
    log2(4096) = 12 rounds."""
    length = np.ones(parent.size, np.int64)
    pointer = parent.copy()
    while True:  # each code's string is length[i] bytes plus the string of pointer[i]
        live = np.flatnonzero(pointer >= 0)
        if live.size == 0:
            return length
        ahead = pointer[live]
        length[live] += length[ahead]
        pointer[live] = pointer[ahead]


def _lzw_decoded(raw: bytes, wanted: int) -> tuple[int, str]:
    """Bytes a TIFF LZW stream (MSB-first codes of 9-12 bits, as libtiff's ``LZWDecode`` reads
    them) gives, up to about ``wanted``. Only the lengths of the strings are found, in numpy:
    run by run between Clear codes, code i after a Clear is one byte (a literal) or one byte more
    than code e's string, where e (i − 1 at most) is the table entry it names. A stream in the
    old LSB-first LZW (it starts 00 01) is not checked: it counts as whole."""
    if raw[:2] == b"\x00\x01":
        return wanted, ""
    padded = np.frombuffer(raw + bytes(3), np.uint8)
    total_bits, at, got = 8 * len(raw), 0, 0
    while got < wanted and at + 9 <= total_bits:
        codes, at = _lzw_run(padded, at, total_bits)
        end = int(codes[-1]) if codes.size else -1
        body = codes[:-1] if end in (256, 257) else codes
        if body.size:
            if body[0] > 255:
                return got, f"is not a valid LZW stream (code {int(body[0])} right after a Clear)"
            parent = np.where(body >= 258, body - 258, -1)
            named = np.minimum(np.arange(body.size) - 1, 4095 - 258)  # the last entry code i may name
            wrong = np.flatnonzero(parent > named)
            if wrong.size:
                return got, f"is not a valid LZW stream (code {int(body[wrong[0]])} before the table holds it)"
            got += int(_string_lengths(parent).sum())
        if end != 256:  # End of Information, or the data ran out
            break
    return got, ""


def _packbits_decoded(raw: bytes, wanted: int) -> tuple[int, str]:
    """Bytes a PackBits stream gives, up to ``wanted``."""
    got, at, size = 0, 0, len(raw)
    while got < wanted and at < size:
        n = raw[at]
        at += 1
        if n < 128:  # n + 1 literal bytes
            take = min(n + 1, size - at)
            got, at = got + take, at + take
        elif n > 128 and at < size:  # the next byte 257 - n times
            got, at = got + 257 - n, at + 1
        elif n > 128:
            break
    return got, ""


#: Compressions whose strips are inflated before every decode (zlib is fast), and those checked
#: only when a decoded page holds a zero sample (packer's decoders of their lengths are slower
#: than libtiff's: LZW's 10 MB/s in numpy): libtiff pads a strip of any of them that runs out
#: with zero rows
TIFF_CHECKED_ALWAYS = frozenset({8, 32946})
TIFF_CHECKED_ON_ZERO = frozenset({5, 32773})
_DECODED_BY = {8: _inflated, 32946: _inflated, 5: _lzw_decoded, 32773: _packbits_decoded}
_CODEC_NAMES = {8: "Deflate", 32946: "Deflate", 5: "LZW", 32773: "PackBits"}


def strip_problem(data: bytes, tags: Tags, compressions: frozenset[int], *, where: str = "") -> str | None:
    """What is wrong with the first strip or tile of the IFD whose integer ``tags`` are given, if
    it is compressed with one of ``compressions`` (Deflate, LZW, PackBits) and does not decode to
    the bytes its rows need (``None`` where every one does, or the compression is not checked):
    a stored stream cut short or damaged. ``where`` (" of IFD 2") follows the chunk's number in
    the text. Decodes at most the size of each strip."""
    compression = tags.get(_TIFF_COMPRESSION, (1,))[0]
    if compression not in compressions or compression not in _DECODED_BY:
        return None
    for number, (offset, count, wanted) in enumerate(_data_chunks(tags)):
        got, problem = _DECODED_BY[compression](data[offset:offset + count], wanted)
        if got >= wanted and not problem:
            continue
        problem = problem or f"decodes to {got} bytes where its rows need {wanted}"
        chunk = "tile" if _TIFF_TILE_WIDTH in tags and _TIFF_TILE_LENGTH in tags else "strip"
        libtiff = ("would decode the rows it gives without a word" if got >= wanted else
                   "would fill the missing rows with zeros")
        return (f"{_CODEC_NAMES[compression]} {chunk} {number}{where} ({count} bytes at byte {offset}) {problem}: "
                f"its data or its {chunk.capitalize()}ByteCounts is damaged (libtiff {libtiff})")
    return None
