"""Sample keys: the one grammar for the suffixes a reader adds to a file's sample id.

A file gives one sample keyed by its sample id, or several, each keyed by the id and a suffix
that says which part of the file it is::

    key      := file_id                                  one sample per file (a volume: its first file)
              | file_id "-f" frame                       a frame (DICOM multi-frame, NIfTI slice)
              | file_id ["-p" page] ["-t" row "_" col]   a TIFF page, a tile, a page's tile
    frame    := 4 to 9 digits (0-based): as many as the file's last frame needs, at least 4
    page     := 5 digits, or 6 to 9 without a leading zero (0-based, main IFD chain)
    row, col := 5 digits, or 6 to 9 without a leading zero (the tile's top-left pixel)

A file id is ``safe_key(source)-<16 hex>`` (``-dupN`` after a hash collision), so it never
ends in a suffix (16 hex may be ``f`` and 15 digits: hence at most 9 digits in a frame).
A frame is padded to the width of its file's last frame index, so a file's frame keys are of
one width and sort as text in frame order (``pack.order: path``): a file of up to 10,000 frames
has the 4 digits it always had (``-f0007``), one of 10,005 has 5 (``-f00007`` … ``-f10004``).
Readers build keys with :func:`frame_key`, :func:`page_key` and :func:`make_key`; whatever
maps a key back to its file (``packer locate``) uses :func:`parse_key`, so a suffix exists in
exactly one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KeyParts:
    """A sample key read back: the file's sample id and which part of the file the sample is
    (all None: the whole file)."""

    file_id: str
    frame: int | None = None
    page: int | None = None
    tile: tuple[int, int] | None = None


def _index(width: int) -> str:
    # exactly `width` digits, or more (up to 9) without a leading zero: the one spelling f"{n:0{width}d}" gives
    return rf"(?:\d{{{width}}}|[1-9]\d{{{width},8}})"


_FRAME = re.compile(r"^(?P<id>.+)-f(?P<frame>\d{4,9})$")
_PAGE_TILE = re.compile(rf"^(?P<id>.+?)(?:-p(?P<page>{_index(5)}))?(?:-t(?P<row>{_index(5)})_(?P<col>{_index(5)}))?$")


#: One past the largest index a key holds (9 digits; no reader comes near it)
INDEX_LIMIT = 10**9


def _checked(what: str, value: int) -> int:
    if not 0 <= value < INDEX_LIMIT:
        raise ValueError(f"a sample key's {what} is a 0-based index below {INDEX_LIMIT:,}; got {value}")
    return value


def frame_key(sample_id: str, frame: int, frames: int | None = None) -> str:
    """The key of frame ``frame`` (0-based) of a file split into ``frames`` samples, one per frame
    (or slice): ``<id>-f0007``, padded to the width of the last frame index, at least 4 digits, so
    that the file's keys sort as text in frame order. Without ``frames``, the frame's own width."""
    last = _checked("frame", frame if frames is None else max(frames - 1, frame))
    return f"{sample_id}-f{frame:0{max(4, len(str(last)))}d}"


def page_key(sample_id: str, page: int) -> str:
    """The key of page ``page`` (0-based) of a multi-page TIFF: ``<id>-p00002``."""
    return f"{sample_id}-p{_checked('page', page):05d}"


def make_key(file_id: str, *, frame: int | None = None, page: int | None = None,
             tile: tuple[int, int] | None = None, frames: int | None = None) -> str:
    """The key of a part of the file ``file_id``: a frame (of ``frames``: :func:`frame_key`), a page,
    a tile (row, col of its top-left pixel) or a page's tile; ``file_id`` itself for the whole file.
    Raises ValueError for a negative index, or a frame with a page or a tile (no reader makes those)."""
    if frame is not None:
        if page is not None or tile is not None:
            raise ValueError(f"{file_id}: a sample key names a frame and a page or a tile; readers make "
                             "frames (DICOM, NIfTI) or pages and tiles (TIFF, images), never both")
        return frame_key(file_id, frame, frames)
    key = file_id if page is None else page_key(file_id, page)
    if tile is not None:
        row, col = tile
        key = f"{key}-t{_checked('tile row', row):05d}_{_checked('tile column', col):05d}"
    return key


_FILE_ID = re.compile(r"^(?P<source>.+)-[0-9a-f]{16}(?:-dup\d+)?$")


def key_source(key: str) -> str | None:
    """The (safe-keyed) source name a sample key's file id starts with, or None for a key of
    another making."""
    found = _FILE_ID.match(parse_key(key).file_id)
    return found["source"] if found is not None else None


def parse_key(key: str) -> KeyParts:
    """What :func:`make_key` made ``key`` from: the file's sample id and the frame, page or tile.
    A key without a suffix (or with one no reader writes that way) is a file id."""
    frame = _FRAME.match(key)
    if frame is not None:
        return KeyParts(frame["id"], frame=int(frame["frame"]))
    parts = _PAGE_TILE.match(key)
    if parts is None or not parts["id"]:  # no suffix, or nothing before one
        return KeyParts(key)
    tile = (int(parts["row"]), int(parts["col"])) if parts["row"] is not None else None
    page = int(parts["page"]) if parts["page"] is not None else None
    return KeyParts(parts["id"], page=page, tile=tile)
