"""Tables: read a source's label table as it ships and place each row on the file it names.

Public datasets ship tables in their own shapes: a ``Path`` column relative to the folder above
the root (CheXpert), bare file names of images spread over ``images_001/images/`` folders
(NIH ChestX-ray14), several tables joined on ids with paths built from them (MIMIC-CXR-JPG),
one row per box (RSNA Pneumonia), a JSON list of records (the Medical Segmentation Decathlon).
A source's ``table:`` object (:class:`~packer.config.TableConfig`) says which shape, and this
module does two things with it, for :mod:`packer.pipeline.discover`:

1. :func:`read_records` reads the table and its joined tables into plain records (column →
   cell), checking every column the job names against the header row (a misspelt column is a
   config error with the closest name), before any file is listed;
2. :func:`place_rows` puts each record on a file of the listing: it builds the file's relative
   path (a path, a template, a bare name looked up in one index of the listing), reads fields
   from that path, applies the ``where:`` filter and the repeated-rows rule, and reads the
   row's label, entity and time into a :class:`TableRow`.

What cannot be placed is said, never dropped: a name two files share is ``ambiguous_path`` for
both files, a row without a match in a joined table is ``join_unmatched`` for its file, and a
table none of whose rows names a listed file is a config error that shows an example of each.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import functools
import gzip
import io
import itertools
import json
import math
import os
import posixpath
import re
import unicodedata
import zipfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from packer.config import JoinConfig, SourceConfig, SplitConfig, TableConfig
from packer.errors import ConfigError, exhausted
from packer.pipeline.labels import Refused, from_row, target_columns
from packer.pipeline.rawstore import read_remote_bytes
from packer.progress import stage_progress
from packer.read.kinds import source_kind
from packer.redact import redacting
from packer.storage import remote_errors, storage_error
from packer.targets import SEPARATOR, target_class
from packer.targets.base import DECIMAL
from packer.where import failed

Record = dict[str, str]


def normalize_time(value: str | None) -> str | None:
    """An ISO date or datetime string, or None when empty or unreadable."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    try:
        if len(text) == 10:
            return date.fromisoformat(text).isoformat()
        return datetime.fromisoformat(text).replace(tzinfo=None).isoformat()
    except ValueError:
        return None


def time_instant(value: str | None) -> datetime | None:
    """The instant a time reads as (:func:`normalize_time`), a date alone being its midnight, as
    the split compares it with a date cutoff: ``2024-03-05``, ``20240305`` and
    ``2024-03-05T00:00`` are one instant; None where it reads as no time."""
    iso = normalize_time(value)
    return None if iso is None else datetime.fromisoformat(iso)


def escapes_root(relpath: str) -> bool:
    """True for a table path that leaves the source root (``..``) or is absolute."""
    return relpath == ".." or relpath.startswith("../") or posixpath.isabs(relpath)


@dataclass(frozen=True)
class TableRow:
    """One row of a label table. ``label``: the target's text (:mod:`packer.targets`), None where
    the cell is empty; ``refused``: why the row's target cannot be used (unknown or bad value);
    ``unlabeled``: where the cell is empty, the message naming the table, row and column."""

    row: int
    label: str | None
    entity: str | None
    time: str | None
    raw_time: str | None
    extra: tuple[tuple[str, str], ...]
    refused: Refused | None = None
    unlabeled: str | None = None
    #: The row's path cell as the table writes it ("" for a path made from a template), which an
    #: ``outside_root`` record quotes: the relative path it was read as may be rewritten past it
    cell: str = ""
    #: Where the entity's cell is written, where a join table gave it: that table's row, joined to
    #: this one's ("" where this table's own row holds it)
    entity_at: str = ""
    #: The other rows naming the same file, where several do (``repeated: same`` or ``union``):
    #: a record about the file (its ``missing_file``) names every row, not only the first
    other_rows: tuple[int, ...] = ()


@dataclass(frozen=True)
class Joined:
    """One ``join`` table as it fed the main table's rows: the columns it added and its row
    number per key, so that a record quoting a joined cell names the joined table's row."""

    file: Path | str
    on: tuple[str, ...]
    columns: frozenset[str]
    rows: Mapping[tuple[str, ...], int]
    #: Its first row's number and ``on`` cells as the table writes them (spaces around them
    #: dropped: ``7.0``, where :attr:`rows` holds ``7``), for a message to quote; None for no row
    first: tuple[int, tuple[str, ...]] | None = None

    def row_of(self, record: Record) -> int | None:
        """The joined table's row that filled ``record``, None where none did."""
        return self.rows.get(join_key(record, self.on))


@dataclass(frozen=True)
class Records:
    """A source's table as read: its records in file order (``number``: the row as the file
    counts it, 2 for a CSV's first data row, 1 for a JSON table's first record, its line for a
    JSON Lines table's), its column
    names, and per record number why a joined table refused it (``join_unmatched``) or left it
    out (``missing: drop``); ``joined``: each join table, in the job's order."""

    path: Path | str
    columns: tuple[str, ...]
    records: tuple[tuple[int, Record], ...]
    unmatched: Mapping[int, str] = field(default_factory=dict)
    dropped: Mapping[int, str] = field(default_factory=dict)
    joined: tuple[Joined, ...] = ()

    def where(self, number: int, record: Record, columns: Sequence[str]) -> str:
        """Where row ``number``'s cells of ``columns`` are written: this table's row, or, for
        cells a join table added, that table's row as well (a bad joined cell is fixed there)."""
        here = f"{self.path} row {number}"
        for join in self.joined:
            if join.columns.intersection(columns):
                row = join.row_of(record)
                if row is not None:
                    here = f"{join.file} row {row} (joined to {here})"
        return here


@dataclass
class Placed:
    """The rows of a source placed on files. ``rows``: by relative path under the root;
    ``refused``: files the table makes bad samples (ambiguous name, no joined row, rows that
    disagree), by relative path; ``filtered``: files a ``where:`` condition left out, with the
    condition; ``rows_filtered``: the rows a filter (or a join's ``missing: drop``) left out,
    whether or not their files are listed. Rows naming no listed file stay in ``rows``:
    :mod:`~packer.pipeline.discover` makes them ``missing_file`` or ``outside_root``."""

    rows: dict[str, TableRow] = field(default_factory=dict)
    refused: dict[str, Refused] = field(default_factory=dict)
    filtered: dict[str, str] = field(default_factory=dict)
    rows_filtered: int = 0
    #: The files every row's file columns name (masks, a case's other files), as table paths are
    #: read (:meth:`_RowReader.file_path`): they belong to a row's sample, also where its file's
    #: rows disagree, and are left out with a row that where: or a join's missing: drop leaves out
    named: set[str] = field(default_factory=set)
    #: The first row (``refused`` set, ``other_rows`` the rest) of each file the listing does not
    #: give whose rows the table refuses (they disagree): not on disk, it is still one file with
    #: one record (``missing_file``), where otherwise it would vanish between ``refused``, which
    #: only the listed files are looked up in, and ``rows``
    refused_rows: dict[str, TableRow] = field(default_factory=dict)


# -- reading -------------------------------------------------------------------------------------


#: The first bytes of file formats a table is sometimes saved as, which are not text
_NOT_TEXT = ((b"PK\x03\x04", "a zip archive (an Excel .xlsx or OpenDocument .ods workbook is one)", "read_excel"),
             (b"\xd0\xcf\x11\xe0", "an old Excel .xls workbook", "read_excel"),
             (b"PAR1", "a Parquet file", "read_parquet"), (b"\x89HDF", "an HDF5 file", "read_hdf"),
             (b"SQLite format 3", "an SQLite database", "read_sql"))


#: The first bytes of a compressed file: the compression's name and the suffix its files are named by (the tool
#: that decompresses it is named alike). pandas reads such tables as they are, so they are met; read as text,
#: they were told 'not UTF-8 ...; save the table as UTF-8', which the table inside already is.
_COMPRESSED = ((re.compile(rb"\x1f\x8b"), "gzip", ".gz"),
               (re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)"), "bzip2", ".bz2"),
               (re.compile(rb"\xfd7zXZ\x00"), "xz", ".xz"),
               (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd", ".zst"))


def _gzipped(path: Path | str) -> bool:
    """Whether the table at ``path`` is read through gunzip: its name ends in ``.gz``
    (MIMIC-CXR-JPG's ``.csv.gz``)."""
    return str(path).lower().endswith(".gz")


def _refuse_compressed(path: Path | str, head: bytes) -> None:
    """A config error for a compressed table packer does not read as it is (:data:`_COMPRESSED`):
    bzip2, xz or zstd, or gzip under a name without ``.gz`` (a download tool or a browser that
    kept the gzip transfer encoding); it names the compression and the command that decompresses
    it, and the name to give the job then."""
    name = path.name if isinstance(path, Path) else path.rsplit("/", 1)[-1]
    for magic, what, suffix in _COMPRESSED:
        if not magic.match(head) or (what == "gzip" and _gzipped(path)):
            continue
        stem, dot, ext = name.rpartition(".")
        out = (name[:-len(suffix)] if name.lower().endswith(suffix) and len(name) > len(suffix)
               else f"{stem}.decompressed.{ext}" if dot and stem else f"{name}.decompressed")
        said = (f"{path}: {'an' if what == 'xz' else 'a'} {what}-compressed file, not a text table; packer reads CSV, "
                "TSV and JSON tables")
        if what == "gzip":  # named without .gz: its name says it is text
            raise ConfigError(f"{said}, gzipped ones where the name ends in .gz: rename it (mv {name} {name}.gz) and "
                              f"name {name}.gz in the job, or decompress it (gzip -dc {name} > {out}) and name {out}")
        raise ConfigError(f"{said}, gzipped ones too, but not {what}-compressed ones: decompress it ({what} -dc "
                          f"{name} > {out}) and name {out} in the job instead, or gzip it (packer reads a .csv.gz "
                          "as it is)")


#: How many of a table's first bytes are looked at for a format that is no table (:func:`_refuse_binary`):
#: enough for an XML declaration or an HTML doctype after a BOM and some blank lines
_HEAD_BYTES = 512

#: The opening of a markup document: an XML declaration, a doctype, a comment or an element
_MARKUP = re.compile(r"<(?:\?xml[\s?]|!doctype\s+(?P<doctype>[\w.:-]+)|!--|(?P<element>[A-Za-z_][\w.:-]*)[\s/>])",
                     re.IGNORECASE)
_ELEMENT = re.compile(r"<([A-Za-z_][\w.:-]*)[\s/>]")
_HTML_ELEMENTS = frozenset({"html", "head", "body", "table", "meta", "title"})
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def _markup(head: bytes) -> tuple[str, str | None] | None:
    """("XML" or "HTML", the first element's name) where ``head``, the first bytes of a table,
    opens a markup document after an optional BOM and blank space: an XML declaration, a
    doctype, a comment or an element (a Pascal VOC or LIDC annotation file, a page saved from a
    browser); None otherwise. A document that opens with an element opens a tree: the element
    closes at once (``<a/>``), or holds another (``<annotation>`` then ``<folder>``), or holds text
    that its own end tag closes (``<note>hi</note>``). A header row written in angle brackets
    (``<path>,<label>``) does none of these, whatever markup its cells hold (``<b>fuzzy</b>``):
    it is a CSV's."""
    bom, codec = next(((len(b), c) for b, c in _BOMS if head.startswith(b)), (0, "utf-8"))
    text = head[bom:].decode(codec, errors="ignore").lstrip()  # (a character cut at the end: dropped)
    opened = _MARKUP.match(text)
    if opened is None:
        return None
    first = _ELEMENT.search(text)
    name = first.group(1) if first else None
    html = ((opened["doctype"] or "").lower() == "html" or (name or "").lower() in _HTML_ELEMENTS
            or re.search(r"<html[\s>]", text, re.IGNORECASE) is not None)
    if opened["element"] and not html and not _opens_a_tree(text, opened):
        return None  # a header row in angle brackets (<path>,<label>)
    return ("HTML" if html else "XML"), name



def _utf16(head: bytes) -> str | None:
    """How ``head``, a table's first bytes, is UTF-16 (``UTF-16 LE, after its byte order mark``,
    ``UTF-16 BE, without a byte order mark``), or None. Without a BOM, UTF-16 text of mostly ASCII
    letters is a NUL byte beside each of them: after each (LE) or before each (BE). Read as UTF-8,
    each NUL became a character of the cells, and a table without a BOM was refused for its
    delimiter instead. At least half the byte pairs must have their NUL on one side, and almost
    none on the other (a letter such as U+0100 has its low byte 0), which binary data does not
    show."""
    for bom, order in ((b"\xff\xfe", "LE"), (b"\xfe\xff", "BE")):
        if head.startswith(bom):
            return f"UTF-16 {order}, after its byte order mark"
    pairs = len(head) // 2
    if pairs < 2:
        return None
    odd = head[1:2 * pairs:2].count(0)  # the high byte of a little-endian code unit
    even = head[0:2 * pairs:2].count(0)
    for nul, other, order in ((odd, even, "LE"), (even, odd, "BE")):
        if 2 * nul >= pairs and 20 * other <= pairs:
            return f"UTF-16 {order}, without a byte order mark"
    return None


def _opens_a_tree(text: str, opened: re.Match[str]) -> bool:
    """Whether ``text``, which starts with the element ``opened`` matched, is an XML tree's start
    (:func:`_markup`): the element's tag is self-closing, or another element follows the tag at
    once or on a new line, or its own end tag closes it."""
    name = opened["element"]
    end = text.find(">", opened.end() - 1)
    if end < 0:
        return False
    if text[end - 1] == "/":
        return True
    rest = text[end + 1:]
    after = rest.lstrip()
    gap = rest[:len(rest) - len(after)]
    # a child element follows at once or on a new line: a tab or a space between two tags on one line
    # is a TSV's or a space-separated table's header (<path>\t<label>)
    child = after.startswith("<") and not after.startswith("</") and (not gap or "\n" in gap or "\r" in gap)
    return child or f"</{name}>" in text

#: Members only a workbook's zip holds: an Office Open XML file's and an OpenDocument file's
_WORKBOOK_MEMBERS = frozenset({"[Content_Types].xml", "mimetype"})


def _zip_members(archive: Path | bytes) -> list[str]:
    """The file names a zip archive holds (folders left out); none where it cannot be read."""
    try:
        with zipfile.ZipFile(archive if isinstance(archive, Path) else io.BytesIO(archive)) as zipped:
            return [name for name in zipped.namelist() if not name.endswith("/")]
    except (zipfile.BadZipFile, OSError):  # cut short or damaged: told as a zip archive all the same
        return []


def _refuse_binary(path: Path | str, head: bytes, archive: Path | bytes | None = None) -> None:
    """A config error for a table saved in a binary format (read as text it is 'not UTF-8', or
    its first bytes a header row), or as an XML or HTML document (:func:`_markup`: read as a CSV,
    its first line was the header row), naming the format and how to export it. A zip archive
    (``archive``: the file or its bytes) that is no workbook is told by what it holds: Kaggle's
    per-file download of ``stage_2_train.csv`` is ``stage_2_train.csv.zip``, a CSV that unzips,
    which pandas' read_excel cannot read."""
    _refuse_compressed(path, head)
    members = _zip_members(archive) if archive is not None and head.startswith(b"PK\x03\x04") else []
    if members and not _WORKBOOK_MEMBERS & set(members):
        shown = ", ".join(members[:3]) + (f" and {len(members) - 3:,} more" if len(members) > 3 else "")
        one = members[0].rsplit("/", 1)[-1] if len(members) == 1 else "the table among them"
        raise ConfigError(f"{path}: a zip archive holding {shown}, not a text table; packer reads CSV, TSV and "
                          f"JSON tables (a .gz one too), not zipped ones: unzip it (unzip {Path(str(path)).name}) "
                          f"and name {one} in the job instead")
    for magic, what, reader in _NOT_TEXT:
        if head.startswith(magic):
            raise ConfigError(f"{path}: {what}, not a text table; packer reads CSV, TSV and JSON tables: export it as "
                              f"CSV (UTF-8), e.g. with pandas: pd.{reader}(...).to_csv('labels.csv', index=False)"
                              + (", or from the spreadsheet's Save As" if reader == "read_excel" else ""))
    markup = _markup(head)
    if markup is None:
        utf16 = _utf16(head)
        if utf16 is not None:
            raise ConfigError(f"{path}: not UTF-8 text ({utf16}, as PowerShell's Out-File -Encoding unicode and some "
                              "Windows exports write it); save the table as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8, or "
                              "Out-File -Encoding utf8)")
        return
    kind, element = markup
    if kind == "HTML":
        raise ConfigError(f"{path}: an HTML page (a table saved from a browser?), not a text table; packer reads "
                          "CSV, TSV and JSON tables: download the table itself as CSV, or convert the page's table "
                          "as CSV (UTF-8), e.g. with pandas: pd.read_html(...)[0].to_csv('labels.csv', index=False)")
    root = f" (its first element <{element}>)" if element else ""
    raise ConfigError(f"{path}: an XML document{root}, not a text table; packer reads CSV, TSV and JSON tables: "
                      "convert it to a CSV (UTF-8) with a row per file (an annotation file per image, as Pascal "
                      "VOC's or LIDC's, makes a row per object naming the image and its class, read with "
                      "table: {file: ..., repeated: same}); pandas converts a flat one: "
                      "pd.read_xml(...).to_csv('labels.csv', index=False)")


@contextlib.contextmanager
def _open_text(path: Path | str, storage_options: Mapping[str, Any] | None) -> Iterator[IO[str]]:
    """The table as text (UTF-8, BOM dropped, newlines as written); a URL is read whole. A name
    ending in ``.gz`` is gunzipped as it is read (MIMIC-CXR-JPG ships its tables as ``.csv.gz``).
    A file compressed otherwise (bzip2, xz, zstd; gzip under another name), a binary file (a
    workbook, Parquet) or an XML or HTML document is a config error saying so
    (:func:`_refuse_compressed`, :func:`_refuse_binary`)."""
    if isinstance(path, Path):
        with open(path, "rb") as raw:
            first = raw.read(_HEAD_BYTES)
        _refuse_compressed(path, first)  # (a .gz name on a bzip2 file: told as bzip2, not as a damaged gzip)
        gzipped = _gzipped(path)
        if gzipped:
            with gzip.open(path, "rb") as raw:
                _refuse_binary(path, raw.read(_HEAD_BYTES))
        else:
            _refuse_binary(path, first, path)
        with (gzip.open(path, "rt", newline="", encoding="utf-8-sig") if gzipped
              else open(path, newline="", encoding="utf-8-sig")) as fh:
            yield fh
        return
    try:
        data = read_remote_bytes(path, storage_options)
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: cannot read the table: there is no such object; fix the URL "
                          "or upload the table") from err
    except remote_errors() as err:
        raise storage_error(path, err, doing="reading the table") from err
    _refuse_compressed(path, data[:_HEAD_BYTES])
    try:
        data = gzip.decompress(data) if _gzipped(path) else data
    except (OSError, EOFError) as err:
        raise ConfigError(f"{path}: cannot read the table: not a whole gzip file ({err})") from err
    _refuse_binary(path, data[:_HEAD_BYTES], data)
    yield io.StringIO(data.decode("utf-8-sig"), newline="")


def not_utf8(path: Path | str, err: UnicodeDecodeError,
             storage_options: Mapping[str, Any] | None = None) -> ConfigError:
    """The error for a table that is not UTF-8, naming the first bad byte's offset in the file
    and its line. A file read through a text stream decodes in chunks, so ``err.start`` counted
    from the start of a chunk (byte 2540 for a byte at 18924); the raw bytes are decoded again
    here, once, to say where."""
    at, line = err.start, None
    try:
        if isinstance(path, Path):
            with open(path, "rb") as fh:
                data = fh.read()
        else:
            data = read_remote_bytes(path, storage_options)
        data = gzip.decompress(data) if _gzipped(path) else data
        data.decode("utf-8")
    except UnicodeDecodeError as again:
        at, line = again.start, again.object[:again.start].count(b"\n") + 1
    except (OSError, EOFError):  # cannot be read again: the decoder's own offset, without a line
        at, line = err.start, None
    except remote_errors():
        at, line = err.start, None
    where = f"byte {at}, line {line}" if line is not None else f"byte {at}"
    return ConfigError(f"{path}: not UTF-8 text ({err.reason} at {where}); save the table as UTF-8")


def _cell(value: Any, number: bool = False) -> str:
    """A JSON value as a table cell (numbers as written, lists joined by the label separator, true
    and false as a 0/1 label's 1 and 0, an object as its JSON text, keys in the record's order:
    ``{"age": 3}``, which a sample's record carries and json.loads reads back, never Python's repr
    ``{'age': 3}``). In a column read as a number (``number``: a numeric target's), a boolean or a
    list is its JSON text (``true``, ``[3]``), which is no number: the sample is ``bad_target``, as
    the same cell of a CSV table is, not a 1.0 or 3.0 the record never held."""
    if value is None:
        return ""
    if isinstance(value, dict) or number and isinstance(value, (bool, list)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):  # a list inside it stays JSON text ([[1, 2], [3, 4]]: two boxes, not 1|2|3|4)
        return SEPARATOR.join(json.dumps(v, ensure_ascii=False) if isinstance(v, list) else _cell(v) for v in value)
    return str(value)


def _json_records(fh: IO[str], path: Path | str, key: str | None, *, hide_values: bool = False,
                  number_columns: Sequence[str] = ()) -> tuple[tuple[str, ...], list[tuple[int, Record]]]:
    text = fh.read()
    if not text.strip():
        raise _empty_table(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and key is None and _opens_with_a_record(text):  # JSON Lines named .json
            return _json_lines(text, path, None, number_columns=number_columns)
        raise ConfigError(f"{path}: not a JSON document ({err.msg} at line {err.lineno}); fix the file") from err
    except RecursionError as err:  # json nests lists past Python's stack: no table nests like that
        raise ConfigError(f"{path}: JSON nested too deeply to read; a table is a list of flat records, "
                          "fix the file") from err
    items = doc.get(key) if isinstance(doc, dict) and key is not None else doc
    if key is not None and not isinstance(doc, dict):
        raise ConfigError(f"{path}: records: {key!r} needs a JSON object holding the list; the file holds a "
                          f"{type(doc).__name__}")
    if items is None:
        lists = [k for k, v in doc.items() if isinstance(v, list)] if isinstance(doc, dict) else []
        keys = (f"{len(lists)} (their keys are not shown under PHI pseudonymization: a table keyed by patient id "
                "would print the ids)" if hide_values and lists else ", ".join(repr(k) for k in lists))
        raise ConfigError(f"{path}: records: no key {key!r}; the object's lists are {keys or 'none'}")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        hint = "" if key is not None else "; name the key of the list with records: (MSD: training)"
        raise ConfigError(f"{path}: expected a list of records (objects){hint}")
    if not items:  # no records, so no keys: not "missing column 'path' ... name the column", a fix that cannot work
        where = f"its {key!r} list" if key is not None else "its list"
        raise ConfigError(f"{path}: the table has no records ({where} is empty), as a cut download or the wrong "
                          "file leaves it; check that it is the whole table")
    return _json_table(list(enumerate(items, start=1)), number_columns, path)


def _json_table(items: Sequence[tuple[int, dict[str, Any]]], number_columns: Sequence[str],
                path: Path | str = "") -> tuple[tuple[str, ...], list[tuple[int, Record]]]:
    """(columns, numbered records) of a JSON table's numbered records (objects): every key any of
    them has, in the order first met, and each record's values as cells (:func:`_cell`), their NUL
    padding dropped and a NUL inside refused (:func:`_unpadded`)."""
    columns: list[str] = []
    for _, item in items:
        columns.extend(k for k in item if k not in columns)
    numbers = frozenset(number_columns)
    records = [(n, {k: _cell(v, k in numbers) for k, v in item.items()}) for n, item in items]
    for n, record in records:
        _unpadded(path, f"record {n}", record)
    return tuple(columns), records


#: The names of a JSON Lines table (one record a line: Hugging Face imagefolder's ``metadata.jsonl``)
_JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")

#: What a JSON value is called in a message, by its Python type
_JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _opens_with_a_record(text: str) -> bool:
    """Whether the first line of ``text`` that is not blank is a JSON object alone: a JSON Lines
    table's first record (a JSON document of one record a line, ``{...}`` then ``{...}``, was
    'Extra data' to a JSON reader)."""
    first = next((line for line in text.split("\n") if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except (ValueError, RecursionError):
        return False


def _json_lines(text: str, path: Path | str, key: str | None, *, number_columns: Sequence[str] = ()
                ) -> tuple[tuple[str, ...], list[tuple[int, Record]]]:
    """(columns, numbered records) of a JSON Lines table: one record (a JSON object) a line, read
    as a JSON table's records are (:func:`_json_table`), each numbered by its line as an editor
    shows it; blank lines are skipped. A line that is no JSON object is a config error naming it."""
    if key is not None:
        raise ConfigError(f"{path}: records: {key!r} names the list of records inside one JSON document, but the "
                          "file is JSON Lines (one record a line), which is the list itself: remove records: from "
                          "the table")
    if not text.strip():
        raise _empty_table(path)
    items: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(text.split("\n"), start=1):  # (not splitlines: a JSON string may hold U+2028)
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: line {n} is not a JSON object ({err.msg} at column {err.colno}); a JSON "
                              "Lines table holds one record (a JSON object) a line: fix the line") from err
        except RecursionError as err:
            raise ConfigError(f"{path}: line {n}: JSON nested too deeply to read; a table's records are flat, "
                              "fix the line") from err
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: line {n} holds a {_JSON_TYPES.get(type(item), type(item).__name__)}, not a "
                              "record (a JSON object); a JSON Lines table holds one record a line: fix the line")
        items.append((n, item))
    return _json_table(items, number_columns, path)


#: The longest cell a table may hold (Python's csv module refuses cells over 131,072 characters by
#: default, and Kaggle tables carry run-length encoded masks of millions: HuBMAP's ``encoding``).
MAX_CELL_CHARS = 2**31 - 1


def unreadable_csv(path: Path | str, err: csv.Error) -> ConfigError:
    """What the csv module cannot parse is the table's defect, never a traceback: the error naming it."""
    return ConfigError(f"{path}: not a readable CSV table ({err}); fix the file or save it again as CSV")


@contextlib.contextmanager
def long_cells() -> Iterator[None]:
    """The csv module's cell limit raised to :data:`MAX_CELL_CHARS` while a table is read, and
    restored after (it is one setting of the whole process)."""
    before = csv.field_size_limit(MAX_CELL_CHARS)
    try:
        yield
    finally:
        csv.field_size_limit(before)


class _Lines:
    """The lines of a table as the csv reader takes them, noting when it asked for one past the
    last: it asks so only inside a record, where a quoted cell is still open at the end of the file."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self.ended = False

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        try:
            return next(self._lines)
        except StopIteration:
            self.ended = True
            raise


#: Excel's first line naming a table's delimiter (``sep=;``, ``sep=,``, a tab after ``sep=``),
#: written by its exports in some locales and by tools meant for Excel, quoted by some.
_SEP_LINE = re.compile(r'"?sep=([^\r\n"])"?', re.IGNORECASE)


@dataclass(frozen=True)
class TableHead:
    """Where a text table's rows start, as :func:`table_head` found it: its ``lines`` from the
    header on, the ``delimiter`` of its cells, and how many lines sit ``above`` the header (a
    csv reader's ``line_num`` plus ``above`` is the line as a text editor numbers it)."""

    lines: Iterator[str]
    delimiter: str
    above: int
    #: The line of the ``sep=`` hint that named the delimiter (as an editor numbers it), 0 where none did
    hint_line: int = 0
    #: The header line as written (its line break dropped)
    header: str = ""

    @property
    def ended(self) -> bool:
        """Whether a reader asked for a line past the last: one does only inside a record, so the
        record it read last holds a quoted cell still open at the end of the file."""
        return isinstance(self.lines, _Lines) and self.lines.ended


def table_head(fh: IO[str], name: str) -> TableHead:
    """The header of a CSV/TSV table opened as text (``name``: its file name, whose ``.tsv``
    says tabs) and the delimiter its cells are separated by: the one a ``sep=;`` line above the
    header names (the hint Excel writes and reads, :data:`_SEP_LINE`), else the one that
    splits the header and the first rows alike (:func:`_delimiter`).
    Blank lines above the header (an export's preamble) are skipped, and the hint line with them:
    read as the header it made the real header row 2, refused as holding an unquoted separator.
    Every table packer reads as CSV goes through here, a source's table as much as a split list
    or a pinned table, so that one file is read alike wherever a job names it."""
    header, above, named, hint_line = fh.readline(), 0, None, 0
    while header and (not header.strip() or (named is None and _SEP_LINE.fullmatch(header.rstrip("\r\n")))):
        hint = _SEP_LINE.fullmatch(header.rstrip("\r\n"))
        named, hint_line = (hint.group(1), above + 1) if hint else (named, hint_line)
        header, above = fh.readline(), above + 1
    sample = list(itertools.islice(fh, _SAMPLE_LINES))
    return TableHead(lines=_Lines(itertools.chain([header], sample, fh)),
                     delimiter=named or _delimiter(name, header, sample), above=above, hint_line=hint_line,
                     header=header.rstrip("\r\n"))


def _refuse_contradicted_hint(path: Path | str, head: TableHead) -> None:
    """Raise ConfigError where the ``sep=`` line above a table names a delimiter its header row does
    not hold, while a comma, tab or semicolon splits the header into columns: Excel's hint kept above
    a table re-saved with other separators. Read by the hint, the header is one column, and the
    error was a missing column the header visibly holds ('missing column path ... the header row
    has path,label,entity'). Says which line to remove or correct; never quotes the header (a table
    without one holds a patient's data there)."""
    if not head.hint_line or head.delimiter in head.header:
        return
    other = _named_delimiter("", head.header)
    try:
        width = len(next(csv.reader([head.header], delimiter=other), []))
    except csv.Error:  # a quote left open in the header: told by the reader as it reads
        return
    if other == head.delimiter or width < 2:
        return
    shown = "<tab>" if head.delimiter == "\t" else head.delimiter
    names = {",": "commas", "\t": "tabs", ";": "semicolons"}
    said = names.get(head.delimiter, repr(head.delimiter))
    fix = "sep=<tab>" if other == "\t" else f"sep={other}"
    raise ConfigError(f"{path}: the sep={shown} line (line {head.hint_line}) says the cells are separated by {said}, "
                      f"but the header row (line {head.above + 1}) holds none: read so, it is one column, while "
                      f"{names[other]} split it into {width}; remove the line (the table is then read by the "
                      f"separator that splits its rows), or correct it to {fix}")


def _read_file(path: Path | str, records_key: str | None, storage_options: Mapping[str, Any] | None, *,
               hide_values: bool = False, file_columns: Sequence[str] = (), number_columns: Sequence[str] = ()
               ) -> tuple[tuple[str, ...], list[tuple[int, Record]]]:
    """(columns, numbered records) of a CSV, or of a JSON table (``records_key``: the key of its list),
    or of a JSON Lines table (``.jsonl``, ``.ndjson``: :func:`_json_lines`).
    ``file_columns``: the columns naming files, where a quote left open is told as such;
    ``number_columns``: a numeric target's columns, whose JSON booleans and lists are no numbers
    (:func:`_cell`)."""
    name = path.name if isinstance(path, Path) else path.rsplit("/", 1)[-1]
    try:
        with _open_text(path, storage_options) as fh, long_cells():
            if name.lower().removesuffix(".gz").endswith(_JSON_LINES_SUFFIXES):
                return _json_lines(fh.read(), path, records_key, number_columns=number_columns)
            if name.lower().removesuffix(".gz").endswith(".json") or records_key is not None:
                return _json_records(fh, path, records_key, hide_values=hide_values, number_columns=number_columns)
            head = table_head(fh, name)
            if not head.header.strip():  # (blank lines above a header are skipped: only the end of the file is so)
                raise _empty_table(path)
            _refuse_contradicted_hint(path, head)
            above, delimiter = head.above, head.delimiter
            lines = _Lines(head.lines)
            reader = csv.DictReader(lines, delimiter=delimiter)
            columns = tuple(c for c in (reader.fieldnames or ()) if c is not None)
            _refuse_nul_header(path, columns, above + reader.line_num)
            rows, cut = [], None
            for record in reader:
                if cut is not None:  # a row cut short with rows below it is no interrupted download's last row
                    raise _short_row_error(path, *cut, columns, delimiter, last=False)
                n = above + reader.line_num  # the row as a text editor numbers it: blank lines count
                _refuse_nul_cell(path, n, record)
                extra = [cell for cell in record.get(None) or () if cell.strip()]
                if extra:  # misaligned: every cell after the stray separator is under the wrong column
                    shown = (f"{len(extra)} not empty; not shown under PHI pseudonymization" if hide_values
                             else ", ".join(repr(c) for c in extra[:3]))
                    quoted = f' ("a{delimiter} b")' if delimiter != "\t" else ""
                    raise ConfigError(f"{path}: row {n} has {len(columns) + len(record[None]):,} cells "
                                      f"but the header names {len(columns):,} columns (cells past the last: "
                                      f"{shown}); {_read_as(delimiter)}; a value holding the separator "
                                      f"needs quotes{quoted}, so its cells land under the right columns")
                cells = {k: (v or "") for k, v in record.items() if k is not None}
                _check_swallowed(path, n, cells, columns, delimiter,
                                 _open_cell(record) if lines.ended else None)
                if lines.ended:  # a quote still open at the end of the file (the csv module reads it without a word)
                    _check_unclosed_at_end(path, n, record, cells, columns, file_columns)
                short = [k for k, v in record.items() if v is None and k is not None and k.strip()]
                if (short and any(v.strip() for v in cells.values())
                        and not any("\n" in v for v in cells.values())):  # (a quote left open: _check_path_cells)
                    cut = (n, short)  # its labels are not blank: said once it is known whether it is the last row
                    continue
                # numbered by the line it starts on, as an editor shows it (a quoted cell of several
                # lines made it the line the row ends on)
                rows.append((_opening_line(n, cells), cells))
            if cut is not None:
                raise _short_row_error(path, *cut, columns, delimiter, last=True)
            return _without_trailing_commas(columns, rows)
    except UnicodeDecodeError as err:
        raise not_utf8(path, err, storage_options) from err
    except csv.Error as err:
        raise unreadable_csv(path, err) from err
    except (OSError, EOFError) as err:  # EOFError, BadGzipFile: a cut or damaged .gz
        resource = exhausted(err, path) if isinstance(err, OSError) else None
        if resource is not None:  # out of open files or memory: the machine's condition, not the table's
            raise resource from err
        raise ConfigError(f"{path}: cannot read the table ({getattr(err, 'strerror', None) or err})"
                          f"{_nested_copy_hint(path) if isinstance(err, FileNotFoundError) else ''}") from err


#: What a NUL byte in a table's text is, and what to do about it (:func:`_refuse_nul_cell`)
_NUL_DAMAGE = ("a NUL byte (\\x00) inside its text or a run of them (one trailing NUL is padding, dropped): the "
               "file is damaged (a download or copy cut short and padded with zero bytes, a binary editor's slip); "
               "download or copy the table again, or delete the NUL bytes")


def _refuse_nul_header(path: Path | str, columns: Sequence[str], line: int) -> None:
    """Raise ConfigError where a header cell holds a NUL byte (:func:`_refuse_nul_cell`). ``line``:
    the header's line as a text editor numbers it."""
    at = next((k for k, c in enumerate(columns, start=1) if "\0" in c), None)
    if at is not None:
        raise ConfigError(f"{path}: column {at} of the header row (line {line}) holds {_NUL_DAMAGE}")


def _refuse_nul_cell(path: Path | str, n: int, record: dict[str | None, Any]) -> None:
    """Drop the NUL padding of ``record``'s cells (the row ending on line ``n``) and raise
    ConfigError where a NUL byte stays inside one (:func:`_unpadded`)."""
    cells = {k: v for k, v in record.items() if k is not None and isinstance(v, str)}
    if any("\0" in v for v in cells.values()):
        _unpadded(path, f"the row on line {_opening_line(n, cells)}", record)


def _unpadded(path: Path | str, where: str, record: dict[Any, Any]) -> None:
    """Drop a text cell's one trailing NUL byte in place, and raise ConfigError for any other NUL.
    One trailing NUL is padding, not text: DICOM pads a UI value to even length with one (PS3.5
    6.2), SQL Server's ``bcp -c`` writes an empty string as a lone NUL; dropped, ``p2\\x00`` is the
    entity ``p2``. A NUL inside a cell, or a run of them (a download cut short and filled with zero
    bytes to its block size: ``a5.png,dog,p`` then 4000 NULs would pack the entity ``p``), is
    damage: Python's csv module reads it as a character, so ``d\\x00og`` was a class beside
    ``dog``. The cell is named by its column, never quoted (it may hold a patient's id)."""
    for key, value in record.items():
        if key is None or not isinstance(value, str) or "\0" not in value:
            continue
        if value.endswith("\0") and "\0" not in value[:-1]:  # one: padding (a run is a cut file's zero fill)
            record[key] = value[:-1]
            continue
        raise ConfigError(f"{path}: the {key!r} cell of {where} holds {_NUL_DAMAGE}")


def _empty_table(path: Path | str) -> ConfigError:
    """The error for a table that holds nothing but blank space (0 bytes, blank lines, a byte order
    mark): a download or copy that failed or was cut short, or a redirect into it that failed. Read
    on, its missing header was 'missing column ...; name the column that holds each file's name',
    a fix that cannot work; a table with a header and no rows is told so where its rows are placed."""
    return ConfigError(f"{path}: the table is empty: it holds no header row and no rows, as a download or copy that "
                       "failed or was cut short leaves it; download or copy it again")


def _read_as(delimiter: str) -> str:
    """What a row's error says of the delimiter the table was read with, and how to name another."""
    return (f"the table was read as {_DELIMITER_NAMES.get(delimiter, repr(delimiter))}-separated; if another "
            "character separates its cells, name it on a first line of its own, as Excel does: sep=; (or sep=, "
            "or sep= and a tab)")


def _short_row_error(path: Path | str, n: int, short: Sequence[str], columns: Sequence[str], delimiter: str, *,
                     last: bool) -> ConfigError:
    """The error for row ``n``, which has no cells for the columns ``short``. The ``last`` row of
    the table is what an interrupted download or copy cuts short; a row with rows below it was
    not cut so, and is told with the delimiter the table was read with (a wrong one splits every
    row into fewer cells than the header: a semicolon table whose header has a comma)."""
    said = (f"{path}: row {n} has {len(columns) - len(short):,} cells but the header names {len(columns):,} columns "
            f"(no cell for {', '.join(repr(c) for c in short[:3])}{', ...' if len(short) > 3 else ''}); ")
    if last:
        return ConfigError(said + "the row was cut short, as an interrupted download or copy leaves the last row: "
                           "download the table again, or give the row its missing cells (empty ones are written "
                           "as separators)")
    return ConfigError(said + f"{_read_as(delimiter)}; else give the row its missing cells (empty ones are written "
                       "as separators)")


def _nested_copy_hint(path: Path | str) -> str:
    """Where a missing table is one folder down, as an archive unpacked into a folder of its own
    name leaves it (``CheXpert-v1.0-small/CheXpert-v1.0-small/train.csv``): the path to use."""
    if isinstance(path, str) and "://" in path:
        return ""
    missing = Path(path)
    folder = missing.parent
    nested = folder / folder.name / missing.name
    if nested.is_file():
        return (f"; it is at {nested}: the download was unpacked into a folder of its own name, so move its "
                f"contents up one level (or point the job at {folder / folder.name})")
    return ""


def swallowed_lines(path: Path | str, n: int, column: str, cell: str, what: str) -> None:
    """Raise ConfigError where a cell of a table that holds one item a row (a split list, a pinned
    table) runs over several lines: an unclosed quote swallowed the rows below it. ``n``: the line
    its row ends on (the reader's ``line_num``); ``what``: what the cell holds."""
    if "\n" not in cell:
        return
    start = _opening_line(n, {column: cell})
    raise ConfigError(f"{path}: the {column!r} cell of the row on line {start} opens a quote (\") that does not "
                      f"close on its line: the cell runs to line {n} and swallows the rows in between ({what} holds "
                      f"no line break); close the quote on line {start}, or remove the stray quote")


def unclosed_at_end(path: Path | str, head: TableHead, n: int, record: Mapping[str | None, Any],
                    columns: Sequence[str]) -> None:
    """Raise ConfigError where ``record`` (a split list's or a pinned table's row, read from
    ``head``'s lines, ending on line ``n``) ran to the end of the file inside a quoted cell: the
    csv module reads an unclosed quote on the last row without a word (``P1,"valid`` pinned P1 to
    valid), which a label table's reader already refuses (:func:`_check_unclosed_at_end`)."""
    if head.ended:
        _check_unclosed_at_end(path, n, record, {k: (v or "") for k, v in record.items() if k is not None},
                               columns, ())


def _line_breaks(cells: Mapping[str, str], open_cell: str | None = None) -> int:
    """How many lines a record spans past its first: its quoted cells' line breaks, less one
    where ``open_cell`` (the cell whose quote runs to the end of the file) holds the last line's
    break. A closed quote after a line break (CBIS-DDSM's ``"a.dcm\n"``) ends on the next line."""
    breaks = sum(v.count("\n") for v in cells.values())
    return breaks - (open_cell is not None and cells.get(open_cell, "").endswith("\n"))


def _opening_line(n: int, cells: Mapping[str, str], open_cell: str | None = None) -> int:
    """The line a record that ends on line ``n`` starts on (``open_cell``: :func:`_line_breaks`)."""
    return n - _line_breaks(cells, open_cell)


def _open_cell(record: Mapping[str | None, Any]) -> str:
    """The column of a record the csv reader ended at the end of the file inside a quoted cell:
    the last cell it read."""
    return [k for k, v in record.items() if k is not None and v is not None][-1]


def _swallowed_error(path: Path | str, n: int, cells: Mapping[str, str], column: str, why: str,
                     open_cell: str | None = None) -> ConfigError:
    """The error for a quote opened in ``column`` that swallowed the rows below: it names the
    lines, never the swallowed text, which is a row of the table and may hold a patient's id."""
    start = _opening_line(n, cells, open_cell)
    return ConfigError(
        f"{path}: the {column!r} cell of the row on line {start} opens a quote (\") that does not close on its "
        f"line: the cell runs to line {n} and {why} (lines {start + 1}-{n}); close the quote on line {start}, "
        "or remove the stray quote (a quote inside a quoted cell is written twice: \"\")")


def _path_break_error(path: Path | str, n: int, cells: Mapping[str, str], column: str) -> ConfigError:
    """The error for a file path cell, ending on line ``n``, whose quote closed with a line break
    inside the path (:func:`_breaks_path`): it names where the quote opens and closes and the
    lines it took in whole, never their text."""
    start = _opening_line(n, cells)
    taken = ("" if n - start < 2 else f" and takes in the line between (line {start + 1})" if n - start == 2
             else f" and takes in the lines between (lines {start + 1}-{n - 1})")
    return ConfigError(
        f"{path}: the {column!r} cell of the row on line {start} holds a line break inside its file path: its quote "
        f"opens on line {start} and closes on line {n}{taken}; a table's file path takes no line break: rename a "
        f"file whose name holds one, or, where the quote was left open by mistake, close it on line {start} (a "
        "quote inside a quoted cell is written twice: \"\")")


def _breaks_path(cell: str) -> bool:
    """Whether a cell that names a file holds a line break inside its path. Every file column's
    cell is read without the spaces and line breaks around it (a path, a mask, a template's
    cells): CBIS-DDSM quotes its path cells with a line break before the closing quote."""
    return "\n" in cell.strip()


#: A cell that names a file: no space, a dot and a 2-5 character extension (``img/a.png``,
#: ``0001.dcm``, ``case.nii.gz``)
_FILE_CELL = re.compile(r"[^\s\"']+\.[A-Za-z][A-Za-z0-9]{1,4}")


def _check_unclosed_at_end(path: Path | str, n: int, record: Mapping[str | None, Any], cells: Mapping[str, str],
                           columns: Sequence[str], file_columns: Sequence[str]) -> None:
    """Raise ConfigError for the table's last record, which the csv reader ended at the end of the
    file inside a quoted cell: its quote never closes, and the cell took in the rest of its row
    (and the lines below it, where any). It was read without a word when the quote opened on the
    last line: ``"Doe^John,2022-01-01`` made the entity ``Doe^John,2022-01-01`` and the row had no
    time. ``n``: the line the record ends on."""
    column = _open_cell(record)
    start = _opening_line(n, cells, column)
    if start < n and column in file_columns:
        raise _swallowed_error(path, n, cells, column, _FILE_PATH_BREAK, column)
    given = sum(1 for k, v in record.items() if k is not None and v is not None)
    swallowed = ("" if start == n else f" and the line below it (line {n})" if start + 1 == n
                 else f" and the lines below it (lines {start + 1}-{n})")
    raise ConfigError(
        f"{path}: the {column!r} cell of the row on line {start} opens a quote (\") that never closes: the cell runs "
        f"to the end of the table, taking in the rest of its row{swallowed} (the row has {given:,} cells where the "
        f"header names {len(columns):,} columns); close the quote on line {start}, or remove the stray quote (a quote "
        "inside a quoted cell is written twice: \"\")")


#: Why a file path cell of several lines is an unclosed quote
_FILE_PATH_BREAK = ("swallows the rows in between (a table's file path takes no line break: rename a file whose name "
                    "holds one)")


def _looks_like_row(line: str, columns: Sequence[str], delimiter: str) -> bool:
    """Whether ``line`` (a line inside a multi-line cell) reads as a row of the table: as many
    separators as a row has, and a cell that names a file. A sentence of a report has commas
    too ("Lungs clear, no effusion, heart normal."), but no file name among its parts."""
    if line.count(delimiter) < len(columns) - 1:
        return False
    return any(_FILE_CELL.fullmatch(part.strip()) for part in next(csv.reader([line], delimiter=delimiter), []))


def _check_swallowed(path: Path | str, n: int, cells: Mapping[str, str], columns: Sequence[str],
                     delimiter: str, open_cell: str | None) -> None:
    """Raise ConfigError where an unclosed quote swallowed the rows below it into one cell: a cell
    of several lines one of which reads as a row of the table (:func:`_looks_like_row`; a quoted
    note of several lines holds text, not rows, however many commas its sentences have).
    ``open_cell``: the cell still open at the end of the file, if any (:func:`_line_breaks`)."""
    if len(columns) < 2:
        return
    for column, value in cells.items():
        if "\n" in value and any(_looks_like_row(line, columns, delimiter) for line in value.splitlines()[1:]):
            raise _swallowed_error(path, n, cells, column, "holds the rows in between as its text", open_cell)


def _file_columns(table: TableConfig) -> list[str]:
    """The columns of ``table`` that name its files: its path column, or its template's columns."""
    return _template_columns(table.template) if table.template is not None else [table.path]


def _check_path_cells(table: TableConfig, rows: Sequence[tuple[int, Record]]) -> None:
    """Raise ConfigError for a file path cell with a line break inside its path
    (:func:`_breaks_path`): a table's path almost never holds one (Linux allows one in a name;
    packer's tables do not take such names), and where it does a quote was likely left open
    there. A line break around the path is padding, dropped as spaces are."""
    names = _file_columns(table)
    for start, record in rows:  # rows are numbered by their first line; the error wants the last
        n = start + _line_breaks(record)
        for column in names:
            if _breaks_path(record.get(column, "")):
                raise _path_break_error(table.file, n, record, column)


#: The delimiters :func:`_delimiter` chooses from (where no ``sep=`` line names one), and what messages call each.
_DELIMITER_NAMES = {",": "comma", "\t": "tab", ";": "semicolon"}

#: How many lines under the header :func:`table_head` reads ahead for :func:`_delimiter`.
_SAMPLE_LINES = 20


def _named_delimiter(name: str, header: str) -> str:
    """The delimiter the header line and the file name suggest: a tab for a tab-separated table
    (``.tsv``/``.tab``, gzipped or not, or a header line with tabs and no comma: BIDS'
    ``participants.tsv``, a CSV saved from a spreadsheet as text), a semicolon for a header line
    with semicolons and neither (what Excel writes as "CSV" where the decimal mark is a comma),
    else a comma."""
    if ("\t" in header) != ("," in header):  # the header says which: one of the two and not the other
        return "\t" if "\t" in header else ","
    if ";" in header and "\t" not in header and "," not in header:
        return ";"
    return "\t" if name.lower().removesuffix(".gz").endswith((".tsv", ".tab")) else ","


def _fit(delimiter: str, header: str, rows: Sequence[str]) -> tuple[int, int]:
    """(how many of ``rows`` split by ``delimiter`` into the header's cells, how many cells the
    header splits into); (0, 0) where the header is one cell. A row may lack the unnamed cells a
    header ending in separators names (NIH's Data_Entry_2017.csv), or have empty cells past them."""
    try:
        records = [r for r in csv.reader([header, *rows], delimiter=delimiter) if r]
    except csv.Error:  # a quote the sample cut off: no fit
        return 0, 0
    width = len(records[0]) if records else 0
    if width < 2:
        return 0, 0
    named = width - next((k for k, c in enumerate(reversed(records[0])) if c.strip()), width)
    return sum(len(r) >= named and not any(c.strip() for c in r[width:]) for r in records[1:]), width


def _delimiter(name: str, header: str, rows: Sequence[str] = ()) -> str:
    """The delimiter of a table's cells, of comma, tab and semicolon: the one that splits the
    header and most of its first ``rows`` into the same number of cells (ties: the one splitting
    the header into more), so that a comma inside a column name (NIH's
    ``OriginalImage[Width,Height]`` in a semicolon-separated re-save) does not make a
    semicolon or tab table one of commas. Where none splits any row as the header, and among
    ties that remain, the one the header line and the file name suggest (:func:`_named_delimiter`)."""
    named = _named_delimiter(name, header)
    fits = {d: _fit(d, header, rows) for d in _DELIMITER_NAMES}
    best = max((named, *_DELIMITER_NAMES), key=lambda d: fits[d])  # max keeps the first of equals: named
    return best if fits[best][0] > 0 else named


def _without_trailing_commas(columns: tuple[str, ...], rows: list[tuple[int, Record]]
                             ) -> tuple[tuple[str, ...], list[tuple[int, Record]]]:
    """``columns`` and ``rows`` without the columns that have no name and no value in any row:
    what a comma at the end of every line makes (NIH ChestX-ray14's Data_Entry_2017.csv ends so).
    Such a column cannot be named by a job, and its empty cells would ride in every sample's
    record as ``"": ""``. An unnamed column that holds values is kept."""
    blank = {c for c in columns if not c.strip() and not any(record.get(c, "").strip() for _, record in rows)}
    if not blank:
        return columns, rows
    return (tuple(c for c in columns if c not in blank),
            [(n, {k: v for k, v in record.items() if k not in blank}) for n, record in rows])


def closest(name: str, choices: Sequence[str]) -> str | None:
    """The choice a misspelt ``name`` most likely meant (same letters in another case first)."""
    same = [c for c in choices if c.lower() == name.lower()]
    if same:
        return same[0]
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


#: A header cell that names a file (a name ending in an image file's extension: ``.png``, ``.dcm``,
#: ``.nii.gz``, ``.dcm.gz``; not a separator alone, which headers hold: CheXpert's ``Frontal/Lateral``):
#: a table exported without a header row, whose first row is data.
_DATA_CELL = re.compile(r"\.(?:png|jpe?g|tiff?|bmp|dcm|dicom|dic|ima|nii|nrrd|mha|npy|npz)(?:\.(?:gz|bz2|xz|zst))?$",
                        re.IGNORECASE)


def _names_a_file(cell: str, bases: Sequence[Path | str | None]) -> bool:
    """Whether a header cell reads as a data row's file: a name with an image file's extension
    (:data:`_DATA_CELL`), or, under a local folder of ``bases`` (the table's ``path_base``, the
    source root), a file there by that relative path, or one of that name anywhere below it (a
    table of bare names, ``find: name``): a PACS export's ``IM000001``, a UID, without an extension.
    Only asked once a named column is missing, so the walk (at most :data:`_WALK_LIMIT` entries)
    costs nothing in a build that runs."""
    if _DATA_CELL.search(cell):
        return True
    if not cell.strip() or "\0" in cell:
        return False
    local = [Path(b) for b in dict.fromkeys(bases) if b is not None and not isinstance(b, str)]
    try:
        if os.path.isabs(cell):
            return Path(cell).is_file()
        if any((base / cell).is_file() for base in local):
            return True
    except (OSError, ValueError):  # a name the file system refuses (too long): no file there
        return False
    name, seen = posixpath.basename(cell.replace("\\", "/")), 0
    for base in local:
        for _, _, files in os.walk(base):
            if name in files:
                return True
            seen += len(files) + 1
            if seen > _WALK_LIMIT:
                return False
    return False


#: How many entries :func:`_names_a_file` looks through for a bare name before it gives up.
_WALK_LIMIT = 200_000



def _check_columns(path: Path | str, columns: Sequence[str], wanted: Mapping[str, str],
                   header_hint: Callable[[str], str] | None = None, fixes: Mapping[str, str] | None = None,
                   label_columns: Sequence[str] = (), roots: Sequence[Path | str | None] = ()) -> None:
    """Raise ConfigError for the first column of ``wanted`` (column → the job key naming it)
    the header lacks, with the closest column the header has, else the fix ``fixes`` gives for
    its key; ``header_hint``: for a ``where`` key, the source kind's hint at a header attribute
    it may have meant (DICOM keywords); ``label_columns``: the label's column list, which the fix
    for a ``label.columns`` key writes out; ``roots``: the folders the table's paths are found in
    (its ``path_base``, the source's root), where a header cell that names a file there shows the
    table has no header row (:func:`_names_a_file`)."""
    for column, key in wanted.items():
        if column in columns:
            if columns.count(column) > 1:  # a CSV reader keeps the last one's cells: never a guess
                raise ConfigError(f"{path}: column {column!r} (named by {key}) is in the header "
                                  f"{columns.count(column)} times, and only the last one's cells would be read; "
                                  "rename the others")
            continue
        headerless = any(_names_a_file(c, roots) for c in columns)  # a file's name: the first row is data
        near = None if headerless else closest(column, columns)
        hint = f"; did you mean {near!r}? ({_column_fix(key, column, near, label_columns)})" if near else \
            f"; {fixes[key]}" if fixes and key in fixes and not headerless else ""
        said = header_hint(column).strip().strip("()") if key == "where" and header_hint is not None else ""
        if said:
            hint += f"; or, {said}"
        if headerless:
            hint = ("; its first row reads as data, not as a header (a cell names a file): add a header row "
                    f"naming the columns{hint}")
        # a header row that is data holds a patient's folder names, ids and notes: under phi: pseudonymize
        # (a CI log is not local) its cells are counted, not quoted
        shown = (f"{len(columns)} cell(s), not quoted under phi: pseudonymize" if headerless and redacting()
                 else ", ".join(columns) or "nothing")
        raise ConfigError(f"{path}: missing column {column!r} (named by {key}){hint}; the header row has {shown}")


def _check_repeated(path: Path | str, columns: Sequence[str]) -> None:
    """Raise ConfigError for the first column name the header of the table at ``path`` repeats
    (``note,note``, as merged exports write): a row is read as a mapping, so only the last such
    column's cells are kept (in each sample's record, with every column the job does not name)
    and the others' reach no output. A column without a name is not refused: a pandas index or
    a trailing comma's column, which no job names (:func:`_without_trailing_commas`)."""
    counts = Counter(c for c in columns if c.strip())
    for column, count in counts.items():
        if count > 1:
            raise ConfigError(f"{path}: column {column!r} is in the header {count} times, and only the last one's "
                              f"cells would be read (each sample's record keeps a column by its name); rename all "
                              f"but one of them, e.g. {column}_2, so that every column's cells are kept")


def _column_fix(key: str, column: str, near: str, label_columns: Sequence[str] = ()) -> str:
    """The edit that makes the job key ``key`` name the header's column ``near`` instead of the
    missing ``column``: ``set table.path: Path`` where the key is the column name itself; where
    the key holds it among other settings (``label: {column: ...}``, a ``where:`` condition, a
    path template) the name to write there; for a label's column list (``label.columns``: numeric
    values, 0/1 labels) that list as it should read, never ``label: {column: ...}``, which would
    make the values class names. A name with a space at either end (SIIM's
    ``ImageId, EncodedPixels`` header) is quoted, as plain YAML would drop the space."""
    spaced = near != near.strip()
    written = f"'{near}'" if spaced else near
    if key.endswith(".path") or key in ("entity", "mask.column"):
        fix = f"set {key}: {written}"
    elif key == "label":  # a default column has no place in the job to write over; label: is none, folder or a mapping
        fix = (f"set label: {{column: {written}}}, or, in a label: mapping naming {column!r}, write {written} "
               "there")
    elif key == "label.columns":
        fixed = ", ".join(written if c == column else c for c in label_columns or (column,))
        fix = f"in label:, write columns: [{fixed}]"
    else:
        fix = f"in {key}, write {written} where it says {column!r}"
    return fix + (": the name starts or ends with a space, so quote it" if spaced else "")


def _template_columns(template: str) -> list[str]:
    import string

    return [name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name]


def wanted_columns(source: SourceConfig) -> dict[str, str]:
    """The columns a source's table must have, each with the job key that names it."""
    table = source.table_map
    assert table is not None
    key = source_kind(source.kind).table_key
    wanted: dict[str, str] = {}
    if table.template is not None:
        for column in _template_columns(table.template):
            wanted[column] = f"{key}.path.template"
    else:
        wanted[table.path] = f"{key}.path"
    # a column list (numeric values, 0/1 labels, one-hot classes) is fixed in that list, not as a class's column:
    target = source.target
    listed = target_class(target.kind).has_vector and target.separator is None or len(target.columns) > 1
    for column in target_columns(target):
        wanted.setdefault(column, "label.columns" if listed else "label")
    # a row's further files come from the kind's own keys (nifti: channel_files): name the one the job wrote
    companions = "/".join(source_kind(source.kind).source_keys) or "companions"
    for column in source.file_columns():
        wanted.setdefault(column, "mask.column" if source.mask is not None and column == source.mask.column
                          else companions)
    if not source_kind(source.kind).identity_in_header:
        if source.entity_path is None:
            wanted.setdefault(source.entity, "entity")
        if source.time_path is None and source.time_required:  # a misspelled time: was no error at all
            for column in source.time:  # every column of a fallback list, not only the first
                wanted.setdefault(column, "time")
    fields = {f.name for f in source.fields}
    for condition in source.where:
        if condition.key not in fields:
            wanted.setdefault(condition.key, "where")
    return wanted


def _refuse_keys_named_apart(path: Path | str, columns: Sequence[str], other: Path | str,
                             other_columns: Sequence[str], on: Sequence[str]) -> None:
    """A ``join.on`` key one table holds and the other holds under another name (ISIC's
    ``image`` against HAM10000's ``image_id``): each table's own "did you mean" would send the
    user to the other's name and back, so say that the key must be named alike in both."""
    import difflib

    for key in on:
        sides = ((columns, path, other_columns, other), (other_columns, other, columns, path))
        for has, holder, lacks, lacker in sides:
            if key not in has or key in lacks:
                continue
            near = difflib.get_close_matches(key, [c for c in lacks if c not in has], n=1, cutoff=0.6)
            if near:
                raise ConfigError(
                    f"join.on: {key!r} is a column of {holder} but not of {lacker}, whose key column looks like "
                    f"{near[0]!r}, which {holder} does not have: a join's on columns are named alike in both "
                    f"tables; rename {near[0]!r} to {key!r} in {lacker}'s header line (or {key!r} to {near[0]!r} "
                    f"in {holder}'s and write on: {near[0]})")


def _join(table: TableConfig, path: Path | str, columns: tuple[str, ...], rows: list[tuple[int, Record]],
          storage_options: Mapping[str, Any] | None, *, hide_values: bool = False,
          number_columns: Sequence[str] = ()) -> Records:
    """``rows`` of the table at ``path`` with every ``table.join`` table's columns added.
    ``hide_values``, ``number_columns``: see :func:`read_records` and :func:`_read_file`."""
    unmatched: dict[int, str] = {}
    dropped: dict[int, str] = {}
    all_columns = list(columns)
    joined: list[Joined] = []
    for join in table.join:
        join_columns, join_rows = _read_file(join.file, join.records, storage_options, hide_values=hide_values,
                                             number_columns=number_columns)
        _refuse_keys_named_apart(path, all_columns or columns, join.file, join_columns, join.on)
        _check_columns(path, columns if not all_columns else all_columns, {c: "join.on" for c in join.on})
        _check_columns(join.file, join_columns, {c: "join.on" for c in join.on})
        _check_repeated(join.file, join_columns)
        shared = [c for c in join_columns if c in all_columns and c not in join.on]
        if shared:
            raise ConfigError(f"{join.file}: column {shared[0]!r} is in {path} too; join on it (on: "
                              f"[{', '.join([*join.on, shared[0]])}]) or drop it from one table")
        index, numbers = _join_index(join, join_rows, hide_values=hide_values)
        added = [c for c in join_columns if c not in join.on]
        first = (join_rows[0][0], tuple(join_rows[0][1].get(c, "").strip() for c in join.on)) if join_rows else None
        joined.append(Joined(file=join.file, on=tuple(join.on), columns=frozenset(added), rows=numbers, first=first))
        all_columns.extend(added)
        tried: list[tuple[int, Record]] = []
        matched = 0
        for number, record in rows:
            if number in unmatched or number in dropped:
                continue
            tried.append((number, record))
            match = index.get(join_key(record, join.on))
            if match is None:
                said = ", ".join(f"{c}={record.get(c, '').strip()!r}" for c in join.on)
                message = f"{path} row {number}: no row of {join.file} has {said}"
                (dropped if join.missing == "drop" else unmatched)[number] = message
                continue
            matched += 1
            record.update((k, v) for k, v in match.items() if k not in join.on)
        if tried and not matched:
            raise _join_matches_nothing(path, join, tried, join_rows, hide_values=hide_values)
    return Records(path=path, columns=tuple(all_columns), records=tuple(rows), unmatched=unmatched, dropped=dropped,
                   joined=tuple(joined))


def _whole_number(text: str) -> int | None:
    """The integer ``text`` writes as a whole number in plain decimal notation (``13``, ``13.0``
    as pandas writes an id column that has a blank, ``1e3``: :data:`~packer.targets.base.DECIMAL`),
    None where it is no number, too large for one, or has a fractional part (``13.5``). The rule a
    path template's integer spec (:class:`_Cell`) and a join's keys (:func:`join_key`) read cells by."""
    if not DECIMAL.fullmatch(text) or not math.isfinite(float(text)):
        return None
    exact = Decimal(text)  # not the float: a 20-digit id keeps every digit
    return int(exact) if exact == exact.to_integral_value() else None


def join_key(record: Record, on: Sequence[str]) -> tuple[str, ...]:
    """The key a join compares ``record`` by: its ``on`` cells, spaces around them dropped, and a
    whole number written as a decimal or with an exponent (``1000.0``, as pandas writes an id
    column that has a blank; ``1e3``) read as its integer (:func:`_whole_number`), so ``1000``
    meets ``1000.0``. A cell written as digits alone stays as written: ``0042`` is an id whose
    zeros count, not 42."""
    key = []
    for column in on:
        cell = record.get(column, "").strip()
        whole = _whole_number(cell) if any(c in cell for c in ".eE") else None
        key.append(cell if whole is None else str(whole))
    return tuple(key)


def _join_matches_nothing(path: Path | str, join: JoinConfig, tried: Sequence[tuple[int, Record]],
                          join_rows: Sequence[tuple[int, Record]], *, hide_values: bool = False) -> ConfigError:
    """The config error for a join none of whose rows matches any of the rows ``tried``: keys
    that never meet (another id, another table, another spelling) would make every file a
    ``join_unmatched`` bad sample, or leave every row out (``missing: drop``), with no word on the
    keys. Shows a key of each table (not under PHI pseudonymization, ``hide_values``: a join key is
    often a patient id)."""
    columns = ", ".join(join.on)
    number = tried[0][0]
    if not join_rows:
        example = f"{join.file} has no rows"
    elif hide_values:
        example = (f"{path} row {number} and {join.file} row {join_rows[0][0]} for instance (their keys are not "
                   "shown under phi: pseudonymize; compare them by hand)")
    else:
        def said(record: Record) -> str:
            return ", ".join(f"{c}={record.get(c, '').strip()!r}" for c in join.on)
        example = f"{path} row {number} has {said(tried[0][1])} and {join.file} row {join_rows[0][0]} has " \
                  f"{said(join_rows[0][1])}"
    left = (f"missing: drop would leave out all {len(tried):,} rows" if join.missing == "drop" else
            f"each of the {len(tried):,} rows would be a join_unmatched bad sample")
    return ConfigError(f"{join.file}: the join on {columns} matches none of the {len(tried):,} rows of {path} "
                       f"({left}): {example}; check that the two tables belong together and write the keys alike "
                       "in both (the same ids in the same form: a whole number as 1000 or 1000.0 is one key)")


def _join_index(join: JoinConfig, rows: list[tuple[int, Record]], *,
                hide_values: bool = False) -> tuple[dict[tuple[str, ...], Record], dict[tuple[str, ...], int]]:
    """The join table's row per key, and that row's number."""
    index: dict[tuple[str, ...], Record] = {}
    first: dict[tuple[str, ...], int] = {}
    for number, record in rows:
        key = join_key(record, join.on)
        if key in index:
            if join.repeated == "same" and index[key] == record:
                continue
            written = [", ".join(f"{c}={r.get(c, '').strip()!r}" for c in join.on) for r in (index[key], record)]
            said = (f"the same {', '.join(join.on)} (not shown under phi: pseudonymize: a join key is often a "
                    "patient id)" if hide_values else written[1] if written[0] == written[1]
                    else f"one key ({written[0]} and {written[1]}: a whole number as 1000 or 1000.0 is one key)")
            fix = ("they differ; fix the table" if join.repeated == "same"
                   else "keep one row per key, or set repeated: same where the rows repeat one another")
            raise ConfigError(f"{join.file}: rows {first[key]} and {number} both have {said}; {fix}")
        index[key], first[key] = record, number
    return index, first


def read_records(source: SourceConfig, storage_options: Mapping[str, Any] | None = None, *,
                 hide_values: bool = False) -> Records:
    """The records of ``source``'s table, joined with its ``join`` tables. Raises ConfigError for
    an unreadable table, a column the job names that the header lacks (with the closest one),
    or two joined rows with one key. ``hide_values`` (PHI pseudonymization): that last error, printed
    where CI logs keep it, names the rows and the key's columns, not the key (often a patient id)."""
    table = source.table_map
    assert table is not None
    numbers = source.target.columns if target_class(source.target.kind).cells_are_numbers else ()
    columns, rows = _read_file(table.file, table.records, storage_options, hide_values=hide_values,
                               file_columns=_file_columns(table), number_columns=numbers)
    _check_path_cells(table, rows)
    joined = _join(table, table.file, columns, rows, storage_options, hide_values=hide_values,
                   number_columns=numbers)
    _check_columns(table.file, joined.columns, wanted_columns(source), source_kind(source.kind).header_key_hint,
                   _column_fixes(source), source.target.columns, (table.path_base, source.root))
    _check_repeated(table.file, columns)  # after the named columns' check, whose message names the job key
    return joined


def _column_fixes(source: SourceConfig) -> dict[str, str]:
    """What to set where the header lacks the default file, entity or time column and has none close to
    it (Kaggle's 'image,level'), by the job key naming the column."""
    table = source.table_map
    assert table is not None
    key = source_kind(source.kind).table_key
    name = os.fspath(table.file).replace("\\", "/").rsplit("/", 1)[-1]
    file_column = (_template_columns(table.template) or ["COLUMN"])[0] if table.template is not None else table.path
    return {f"{key}.path": (f"name the column that holds each file's name: {key}: {{file: {name}, path: COLUMN}} "
                            "(ids without the extension: path: {template: '{COLUMN}.png'})"),
            "entity": ("set the source's entity: to the column holding the patient id, read it from each file's path "
                       "(entity: {path: REGEX} or {component: N}), or, where each file is its own patient, entity: "
                       f"{file_column}"),
            "time": ("set the source's time: to the column holding each file's date (ISO 8601), or read it from each "
                     "file's path (time: {path: REGEX})")}


# -- placing -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _real_folder(folder: str) -> str | None:
    """``folder`` with every link on its way resolved (the file's own name is not: a link to a
    file inside the root is a file of its own), or None where it is no folder here. Cached for
    the rows of one table (:func:`place_rows` clears it)."""
    return os.path.realpath(folder).replace(os.sep, "/") if os.path.isdir(folder) else None


def _rebase(cell: str, table: TableConfig, root: Path | str, *, strip: bool = True) -> str:
    """A table cell's path relative to the root (it is written relative to ``path_base``); spaces
    around the cell are dropped (``strip``), as exports pad cells. A cell that is a URL names its
    file whatever ``path_base`` is (:func:`_rebase_url`)."""
    written = (cell.strip() if strip else cell).replace("\\", "/")
    if "://" in written:
        return _rebase_url(written, root)
    text = posixpath.normpath(written)
    if table.path_base is None:
        top = os.fspath(root)
        if "://" in top or not (posixpath.isabs(text) or text.startswith("../")):
            return text
        # an absolute path (a table made by a glob), or one that leaves and re-enters the root:
        # relative to the root where it lies under it (else it still starts with ../: outside_root)
        top = posixpath.normpath(top.replace(os.sep, "/"))
        rel = posixpath.relpath(posixpath.normpath(posixpath.join(top, text)), top)
        if rel.startswith("../") and posixpath.isabs(text):
            # the root as the job names it may pass through a link (raw -> real, /data -> /mnt/...),
            # which the root's own path has resolved: the cell's folder, resolved the same way
            rel = _through_links(text, top, rel)
        return rel
    base, top = os.fspath(table.path_base), os.fspath(root)
    if "://" in top:  # a URL root: compare the paths after the protocol
        base, top = base.split("://", 1)[-1], top.split("://", 1)[-1]
        return posixpath.relpath(posixpath.normpath(posixpath.join(base, text)), top)
    top = top.replace(os.sep, "/")
    joined = posixpath.normpath(posixpath.join(base.replace(os.sep, "/"), text))
    rel = posixpath.relpath(joined, top)
    if rel.startswith("../"):
        # the cell's way from path_base may pass through a link the root's own path resolved (the
        # download linked in: data/CheXpert-v1.0-small -> /mnt/datasets/...): its folder, resolved
        rel = _through_links(joined, top, rel)
    return rel


def is_url_cell(rel: str) -> bool:
    """Whether ``rel``, a table cell's path as :func:`_rebase` read it, is a URL that no path
    relative to the root names (another store, bucket or host than the root's, or a URL under a
    local root): the cell as written, which names no file under the root."""
    return "://" in rel


def _rebase_url(cell: str, root: Path | str) -> str:
    """A cell that is a URL (``s3://bkt/photos/i4.png``, as ``aws s3 ls`` or fsspec's glob writes
    a table): its path relative to a URL root on the same store (scheme and bucket or host alike),
    compared after normalising ``//`` and a trailing slash, never with the scheme's ``//`` eaten:
    ``i4.png`` under ``s3://bkt/photos``, ``../x.png`` leading out of it elsewhere in the bucket
    (``outside_root``, as an absolute local path outside a local root). Under an http(s) root the
    URL's path is percent-decoded, as its listing's names are. Elsewhere (another store, or a
    local root) the cell as written (:func:`is_url_cell`): no relative path names it."""
    top = os.fspath(root)
    if "://" not in top:
        return cell
    scheme, rest = cell.split("://", 1)
    top_scheme, top_rest = top.split("://", 1)
    host, _, path = rest.partition("/")
    top_host, _, top_path = top_rest.partition("/")
    encoded = top_scheme.lower() in ("http", "https")
    if scheme.lower() != top_scheme.lower() or (host.lower() != top_host.lower() if encoded else host != top_host):
        return cell
    if encoded:  # both sides as the listing names them: a root's data%20set/ is the folder 'data set'
        path = unquote(path.split("?", 1)[0].split("#", 1)[0])
        top_path = unquote(top_path.split("?", 1)[0].split("#", 1)[0])
    return posixpath.relpath(posixpath.normpath("/" + path), posixpath.normpath("/" + top_path))


@functools.lru_cache(maxsize=256)
def _folder_names(folder: str) -> tuple[str, ...]:
    """The names in ``folder``, none where it cannot be listed. Cached for the rows of one table
    (:func:`place_rows` clears it)."""
    try:
        return tuple(os.listdir(folder))
    except OSError:
        return ()


def _spelled_on_disk(top: str, rel: str) -> str:
    """``rel`` (under the local root ``top``) as the disk spells it, where a name on its way
    differs from the disk's only in Unicode form and no other name there does too (never a
    guess); else ``rel``. For the files a table's file columns name that the listing lacks."""
    if escapes_root(rel) or os.path.lexists(os.path.join(top, rel)):
        return rel
    done: list[str] = []
    for part in rel.split("/"):
        folder = os.path.join(top, *done)
        if not part.isascii() and not os.path.lexists(os.path.join(folder, part)):
            same = [name for name in _folder_names(folder) if _nfc(name) == _nfc(part)]
            if len(same) != 1:
                return rel
            part = same[0]
        done.append(part)
    return "/".join(done)


def _through_links(path: str, top: str, rel: str) -> str:
    """``path`` relative to the (resolved) root ``top`` with the links on its folder's way
    resolved, where that lands it under the root; else ``rel``, what it was relative to it."""
    folder, name = posixpath.split(path)
    real = _real_folder(folder)
    if real is None:
        return rel
    inside = posixpath.relpath(posixpath.join(real, name), top)
    return rel if inside.startswith("../") else inside


def written_from_base(rel: str, table: TableConfig, root: Path | str) -> str | None:
    """What a table cell holds for the path ``rel`` (relative to the root) where the table's
    cells are written relative to ``path_base``: :func:`_rebase` undone (normalised). None
    without a ``path_base``."""
    if table.path_base is None:
        return None
    base, top = os.fspath(table.path_base), os.fspath(root)
    if "://" in top:
        base, top = base.split("://", 1)[-1], top.split("://", 1)[-1]
    return posixpath.relpath(posixpath.normpath(posixpath.join(top, rel)), posixpath.normpath(base))


class _CellFormatError(ValueError):
    """A template cell that its format spec cannot format: ``column`` and what is wrong (the
    message shows the cell's value)."""

    def __init__(self, column: str, problem: str) -> None:
        super().__init__(f"column {column!r}: {problem}")
        self.column = column


class _Cell(str):
    """A table cell in a path template. A format spec of a number type formats the cell's number
    (``{id:05d}`` makes ``7`` into ``00007``, ``{x:.1f}``): the cells are text, and Python's
    format refused the spec with a traceback. The number is read as numeric targets read theirs,
    in plain decimal notation (:data:`~packer.targets.base.DECIMAL`): Python's int() and float()
    also read ``1_5`` as 15 and full-width ``１６`` as 16, which would name another subject's file.
    A whole number written as a decimal (``13.0``, as pandas writes an id column that has a blank;
    ``1e3``) is that integer for an integer spec. A cell that is no such number raises
    :class:`_CellFormatError`, naming the column."""

    column: str

    def __new__(cls, value: str, column: str) -> _Cell:
        cell = super().__new__(cls, value)
        cell.column = column
        return cell

    def __format__(self, spec: str) -> str:
        kind = spec[-1:]
        number: type[int] | type[float] | None = (int if kind and kind in "bdoxXn" else
                                                  float if kind and kind in "eEfFgG%" else None)
        if number is None:
            return str.__format__(str(self), spec)
        text = str(self)
        if not text:
            raise _CellFormatError(self.column, f"the cell is empty, and {{:{spec}}} formats a number")
        if not DECIMAL.fullmatch(text):
            raise _CellFormatError(self.column, f"the cell {text!r} is not a number in plain decimal notation "
                                                f"(ASCII digits, a point, an exponent), which {{:{spec}}} formats")
        value = float(text)
        if not math.isfinite(value):
            raise _CellFormatError(self.column, f"the cell {text!r} is too large for a number, which "
                                                f"{{:{spec}}} formats")
        if number is float:
            return format(value, spec)
        whole = _whole_number(text)
        if whole is None:
            raise _CellFormatError(self.column, f"the cell {text!r} has a fractional part, and {{:{spec}}} formats "
                                                "a whole number")
        return format(whole, spec)


def _cell_of(table: TableConfig, record: Record) -> str:
    """The path a row names: its path cell, or the template filled with its cells. Raises
    ValueError where a cell does not fit the template's format spec."""
    if table.template is None:
        return record.get(table.path, "")
    return table.template.format_map({k: _Cell(v.strip(), k) for k, v in record.items()})


class UnicodeSpelling:
    """A table path as the listing spells it, where the two differ only in Unicode normalisation:
    a table written as NFC text names ``café.png`` with one code point for the é, while a file
    made on macOS (or unzipped from an archive made there) is named with two (NFD). Built on
    the first non-ASCII path the listing lacks; a path two files share once normalised stays as
    the table spells it (never a guess). Split lists' items are matched the same way
    (:func:`packer.pipeline.splitlists.split_from_lists`)."""

    def __init__(self, listed: Sequence[str]) -> None:
        self._listed = listed
        self._by_nfc: dict[str, str | None] | None = None

    def __call__(self, rel: str) -> str:
        if self._by_nfc is None:
            self._by_nfc = {}
            for name in self._listed:
                if not name.isascii():
                    key = unicodedata.normalize("NFC", name)
                    self._by_nfc[key] = None if key in self._by_nfc else name
        return self._by_nfc.get(unicodedata.normalize("NFC", rel)) or rel


class NameIndex:
    """The listed files of a source by file name, for tables of bare names (``find: name``);
    names compare in Unicode normal form C (:class:`UnicodeSpelling`)."""

    def __init__(self, relpaths: Sequence[str]) -> None:
        self._by_name: dict[str, list[str]] = defaultdict(list)
        for rel in relpaths:
            self._by_name[_nfc(rel.rsplit("/", 1)[-1])].append(rel)

    def find(self, name: str) -> list[str]:
        return self._by_name.get(_nfc(name.strip().rsplit("/", 1)[-1]), [])


def _nfc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def differ_in_unicode_form(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ only in Unicode normalisation (they print alike: ``café``
    with one code point for the é and with an e and a combining accent)."""
    return a != b and _nfc(a) == _nfc(b)


def _missing_suffix(cells: Sequence[str], names: set[str]) -> str | None:
    """The extension (``.png``, ``.nii.gz``) that makes a cell's last part a listed file's name,
    where the cells are ids without it; None where none does."""
    stems: dict[str, str] = {}
    for name in names:
        for i in range(max(1, len(name) - 8), len(name)):
            if name[i] == ".":
                stems.setdefault(name[:i], name[i:])
    return next((stems[part] for part in (c.rsplit("/", 1)[-1] for c in cells[:1000]) if part in stems), None)


def _folder_below(cells: Sequence[str], listed: Sequence[str]) -> str | None:
    """The folder under the root the cells' paths start in, where every listed file one of the
    first cells names is ``<folder>/<cell>``, always the same folder; else None. Reads the
    listing once and holds only the cells (a listing may have millions of files)."""
    wanted = {cell.strip().strip("/") for cell in cells[:1000]} - {""}
    found: set[str] = set()
    for rel in listed:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[i:]) in wanted:
                found.add("/".join(parts[:i]))
                if len(found) > 1:
                    return None
    return found.pop() if found else None


def folder_link_on_way(root: str | Path, rel: str) -> tuple[str, str] | None:
    """Where the path ``rel`` under the local ``root`` passes through a link to a folder inside
    the root, which the listing does not enter (its files are listed at their real paths): the
    link's relative path and the file's real one. None where no folder on its way is a link, or
    the link leads out of the root (that is ``outside_root``'s), or it cannot be resolved. For a
    row's ``missing_file`` record (discovery) and the no-row-matches error alike."""
    parts = rel.split("/")
    try:
        real_root = Path(root).resolve()
        for i in range(1, len(parts)):
            if not Path(root, *parts[:i]).is_symlink():
                continue
            real = Path(root, rel).resolve()
            if not real.is_relative_to(real_root):
                return None
            return "/".join(parts[:i]), real.relative_to(real_root).as_posix()
    except (OSError, RuntimeError):  # a loop, a folder without permission: no diagnosis
        return None
    return None


def _through_folder_links(source: SourceConfig, cells: Sequence[str], listed: set[str]) -> tuple[str, str, str] | None:
    """Whether a table's cells name listed files through a link to a folder inside the root
    (``raw/latest -> v2``, rows ``latest/0.png``): the first such cell, its link and the file's
    real relative path; None where none of the first 1,000 does (or the root is a URL)."""
    table, root = source.table_map, os.fspath(source.root)
    if table is None or "://" in root:
        return None
    for cell in cells[:1000]:
        linked = folder_link_on_way(root, _rebase(cell, table, root))
        if linked is not None and linked[1] in listed:
            return cell, *linked
    return None


def _renamed_top(source: SourceConfig, cells: Sequence[str], listed: set[str]) -> str | None:
    """The first folder the cells start with, where a cell less that folder names a listed file
    and the folder is not the root's own name: the download unpacked or renamed under another
    name (CheXpert-v1.0-small as ``chexpert/``, Kaggle's ``archive/``), so no ``path_base`` makes
    the cells name the root's files. None where none of the first 1,000 cells is one (or the root
    is a URL)."""
    top = os.fspath(source.root).replace(os.sep, "/").rstrip("/")
    if "://" in top:
        return None
    name = top.rsplit("/", 1)[-1]
    for cell in cells[:1000]:
        first, _, rest = posixpath.normpath(cell.strip().replace("\\", "/")).partition("/")
        if rest and first not in (".", "..", name) and rest in listed:
            return first
    return None


def _renamed_top_fix(source: SourceConfig, first: str, *, hide_paths: bool = False) -> str:
    """What to do where the cells start with the folder ``first``, which is not the root's name
    (:func:`_renamed_top`): give the root the cells' name, by renaming it or linking it under that
    name beside the folder the cells are read from. ``hide_paths``: the folder is not named (a
    folder may be a patient's name)."""
    table = source.table_map
    assert table is not None
    key = source_kind(source.kind).table_key
    root = os.fspath(source.root).rstrip("/").rstrip(os.sep)
    parent, name = os.path.split(root)
    base = os.fspath(table.path_base) if table.path_base is not None else parent
    # hidden (phi: pseudonymize): the advice names the folder by where to read it, never a made-up name
    shown, as_named = (("(its name, the first part of the path cells, hidden under phi: pseudonymize)",
                        "<the cells' first folder>") if hide_paths else (repr(first), first))
    said = (f"the cells start with a folder {shown}, which is not the root's folder name {name!r} (the "
            "download unpacked or renamed under another name)")
    link = f"ln -s {root} {os.path.join(base, as_named)}"
    if table.path_base is None:
        return (f"{said}: rename the folder {root} to {as_named} (and the source's root with it), or link it under "
                f"the cells' name ({link}), and set {key}.path_base to {parent}, the folder above it")
    return (f"{said}, so read from {key}.path_base ({base}) they name no folder of the root: rename the folder "
            f"{root} to {as_named} (and the source's root with it), or link it under the cells' name ({link}); or, "
            f"where a folder of that name holds the files elsewhere, point {key}.path_base at the folder above it "
            "and the source's root at it")


def _join_dropped_error(source: SourceConfig, records: Records, rows: int, dropped: Sequence[int], *,
                        filtered: int = 0, hide_paths: bool = False) -> ConfigError:
    """The config error where no row a join keeps names a listed file and rows a join's ``missing:
    drop`` left out do (``dropped``, by number): the cause is the join, not the path column, and a
    key of each table shows how they differ, each as its table writes it (not under PHI
    pseudonymization, ``hide_paths``: a key is often a patient id). ``filtered``: the rows naming
    a listed file that ``where:`` left out, not the join: counted apart."""
    number = dropped[0]
    why = records.dropped[number]  # "<table> row N: no row of <joined> has <key>"
    join = next((j for j in records.joined if f"no row of {j.file} has" in why), None)
    if hide_paths:
        example = (f"row {number} is one (its key is not shown under phi: pseudonymize; compare the tables' "
                   f"{', '.join(join.on) if join is not None else 'join'} columns by hand)")
    else:
        example = why
        if join is not None and join.first is not None:
            said = ", ".join(f"{c}={v!r}" for c, v in zip(join.on, join.first[1], strict=True))
            example += f", while {join.file} row {join.first[0]} has {said}"
    naming = (f"all {len(dropped):,} naming a file under the root" if not filtered else
              f"{len(dropped):,} of the {len(dropped) + filtered:,} naming a file under the root (where: left out "
              f"the other {filtered:,})")
    return ConfigError(f"{records.path}: none of the rows a join keeps names a file under {source.root}: the join "
                       f"(missing: drop) left out {len(records.dropped):,} of the {rows:,} rows, among them {naming} "
                       f"({example}); check that the joined table has rows for these files, with their keys written "
                       "as this table writes them")


def _no_match_error(source: SourceConfig, records: Records, cells: Sequence[str], listed: Sequence[str], *,
                    hide_paths: bool = False) -> ConfigError:
    """Why no row names a listed file, with an example of each (not under PHI pseudonymization,
    ``hide_paths``: a folder or file name may be a patient's) and the likely fix."""
    table = source.table_map
    assert table is not None
    cell, rel = cells[0], listed[0]
    key = source_kind(source.kind).table_key
    names = {r.rsplit("/", 1)[-1] for r in listed}
    suffix = _missing_suffix(cells, names) if table.template is None else None
    listed_set = set(listed)
    backslashed = next((c for c in cells[:1000] if "\\" in c and c in listed_set), None)
    linked = _through_folder_links(source, cells, listed_set)
    if linked is not None:  # the files are there, at the paths the rows give: say why they are not read so
        fix = ("the rows name the files through a link to a folder inside the root, which the listing does not "
               "enter: it names each file once, at its real path" + ("" if hide_paths else (
                   f" (the cell {linked[0]!r} goes through the link {linked[1]!r}; the file is listed as "
                   f"{linked[2]!r})")) + "; write the rows with the real folder's paths")
    elif "://" in cell:  # URLs that are not under the root (those under it name their files)
        fix = (f"the cells are URLs, and none is under the source root {source.root}: point the root at the "
               "folder the URLs are under, or check that the table belongs to this root")
    elif backslashed is not None:  # a Windows zip unpacked where \ is no separator: one file, named with backslashes
        fix = ("a backslash in the cells is read as a folder separator (a table written on Windows), but the files "
               "under the root have backslashes in their names" + ("" if hide_paths else f" ({backslashed!r} is one "
               "file)") + ": an archive made on Windows was unpacked without making its folders; unpack it "
               "again with a tool that makes them (Info-ZIP's unzip does, with a warning), or rename the files, "
               "each part a folder")
    elif suffix is not None:  # Kaggle's image_id, RSNA's patientId: the file's name without its extension
        where = "" if table.find == "name" or any(f"{c}{suffix}" in listed_set for c in cells[:1000]) else (
            f" and {key}.find: name" if table.find == "path" and "/" not in cell else f" and check {key}.path_base")
        fix = (f"the cells are file names without their extension ({suffix}): set {key}.path: "
               f"{{template: '{{{table.path}}}{suffix}'}}{where}")
    elif table.find == "path" and any(c.rsplit("/", 1)[-1] in names for c in cells[:1000]):
        if "/" not in cell:
            fix = f"the cells are bare file names in subfolders: set {key}.find: name"
        elif cell.split("/", 1)[0] == os.fspath(source.root).rstrip("/").rsplit("/", 1)[-1]:
            fix = (f"the cells start with the root's own folder name ({cell.split('/', 1)[0] + '/'!r}): set "
                   f"{key}.path_base to the folder above the root")
        elif (below := _folder_below(cells, listed)) is not None:
            fix = (f"the cells start in a folder under the root ({below + '/'!r} then the cell): set the "
                   f"source's root to {os.fspath(source.root).rstrip('/')}/{below}, or {key}.path_base to it")
        elif (renamed := _renamed_top(source, cells, listed_set)) is not None:
            fix = _renamed_top_fix(source, renamed, hide_paths=hide_paths)
        else:
            # find: name only where the file names tell the files apart (CheXpert's are view1_frontal.jpg ...)
            shared = sum(1 for r in listed if r.rsplit("/", 1)[-1] == cell.rsplit("/", 1)[-1]) > 1
            find = "" if shared else f", or {key}.find: name"
            if table.path_base is None:
                fix = (f"the cells name the files by another folder: set {key}.path_base to the folder they start "
                       "from (e.g. the folder above the root)" + find)
            else:  # the job has a path_base: saying to set one again is no help
                fix = (f"the cells name the files by another folder than {key}.path_base "
                       f"({os.fspath(table.path_base)}), read from which they lead out of the root: point "
                       f"{key}.path_base at the folder the cells start from" + find)
    elif table.template is not None:  # the template makes the paths: its extension or folders, most often
        fix = (f"check {key}.path.template ({table.template!r}: its folders and extension make each path) and that "
               "the table belongs to this root")
    else:
        fix = (f"check {key}.path (the column naming the files: {table.path!r}) and that the table belongs to "
               "this root")
    example = (f"row {records.records[0][0]} names none (its cell and the files' paths are not shown under "
               "phi: pseudonymize; compare them by hand)" if hide_paths else
               f"row {records.records[0][0]} gives {cell!r} and a file under the root is {rel!r}")
    return ConfigError(f"{records.path}: none of the table's {len(cells)} rows names a file under {source.root}: "
                       f"{example}; {fix}")


def place_rows(source: SourceConfig, records: Records, listed: Sequence[str], known: tuple[str, ...] = (), *,
               quiet: bool = False, hide_paths: bool = False, split: SplitConfig | None = None
               ) -> tuple[Placed, dict[str, Refused]]:
    """Put ``records`` on the files of ``listed`` (relative paths under the root, sorted).
    Returns the placement and, by relative path, the files that are not listed and that rows
    without a joined row name: one ``join_unmatched`` refusal per file, naming all its rows (the
    file's other rows, joined or not, make no second record of it); rows left out by a join with
    ``missing: drop`` are counted as filtered. A long placement shows a ``table`` progress
    line (files whose rows are read) unless ``quiet``. ``hide_paths`` (PHI pseudonymization):
    the errors that stop the job, printed where CI logs keep them, name rows, not the files'
    paths, whose folders may carry a patient's name. ``split``: the job's, whose ``by: column``
    column the rows of one file must agree on (:meth:`_RowReader.merge`)."""
    table = source.table_map
    assert table is not None
    _real_folder.cache_clear()  # folders resolved as they are now, not as an earlier job found them
    _folder_names.cache_clear()
    names = NameIndex(listed) if table.find == "name" else None
    listed_set = set(listed)
    spelled = UnicodeSpelling(listed)
    reader = _RowReader(source, records, known, listed_set, spelled, hide_paths=hide_paths, split=split)
    placed = Placed()
    unmatched: dict[str, list[int]] = defaultdict(list)
    by_file: dict[str, list[tuple[int, Record]]] = defaultdict(list)
    cells: list[str] = []
    dropped_here: list[int] = []  # rows a join's missing: drop left out that name a listed file
    filtered_here = 0  # rows where: left out (a join refused them) that name a listed file
    shared_name = False
    if not records.records and listed:  # a cut download or the wrong file: not a missing_label per file
        raise ConfigError(f"{records.path}: the table has no rows (its header: "
                          f"{', '.join(records.columns) or 'nothing'}), so it labels none of the {len(listed):,} "
                          f"files under {source.root}; check that it is the whole table")
    for number, record in records.records:
        try:
            written = _cell_of(table, record)
            cell = written.strip()
        except ValueError as err:
            if not hide_paths:
                said = str(err)
            elif isinstance(err, _CellFormatError):  # the column's name is no PHI, its cell may be
                said = f"column {err.column!r}: its cell does not fit its format spec"
            else:
                said = "a cell does not fit its format spec"
            raise ConfigError(f"{records.path}: row {number}: table.path.template {table.template!r}: {said}; fix the "
                              "cell, or the template's format spec (write {column} for the cell as it is)") from None
        if table.template is not None:
            _check_template_cells(table.template, records.path, number, record, cell, hide_paths=hide_paths)
        elif not cell:
            raise ConfigError(f"{records.path}: row {number}, column {table.path!r} is empty; give the file's "
                              "path relative to the root")
        cells.append(cell)
        # a row's mask (or a case's other file) belongs to its row whatever becomes of the row: kept,
        # refused, or left out by where: or a join's missing: drop (then it is left out with it)
        placed.named.update(reader.named_files(record))
        if names is not None:
            found = names.find(cell)
            if len(found) > 1:
                shared_name = True  # files are listed under the name: not a table that matches nothing
                # a name is ambiguous only for a row that is kept: where: (or a join's missing: drop)
                # leaving the row out filters its files (HAM10000's two copies of each image)
                kept = [] if number in records.dropped else _kept_by_where(source, record, found, placed)
                if not kept:
                    placed.rows_filtered += 1
                    for rel in found:
                        placed.filtered.setdefault(rel, records.dropped.get(number, ""))
                    continue
                if len(kept) > 1:
                    for rel in kept:
                        placed.refused[rel] = Refused("ambiguous_path", (
                            f"{records.path} row {number} names {cell!r}, and {len(kept)} files under the root have "
                            f"that name ({', '.join(kept[:3])}); give the table paths (find: path) or keep one"))
                    continue
                found = kept  # where: keeps the row for one of the files only: that one is its file
            rel = found[0] if found else _rebase(cell, table, source.root)
        else:
            rel = _rebase(cell, table, source.root)
        if rel not in listed_set and written != cell:  # a file whose name starts or ends with a space
            exact = _rebase(written, table, source.root, strip=False)
            rel = exact if exact in listed_set else rel
        if rel not in listed_set and not rel.isascii():
            rel = spelled(rel)
        if number in records.dropped:
            placed.rows_filtered += 1
            if rel in listed_set:
                placed.filtered[rel] = records.dropped[number]
                dropped_here.append(number)
            continue
        if number in records.unmatched:
            if (left_out := _where_leaves_out(source, record, rel)) is not None:
                placed.rows_filtered += 1
                if rel in listed_set:
                    placed.filtered.setdefault(rel, left_out)
                    filtered_here += 1
            else:
                unmatched[rel].append(number)
            continue
        by_file[rel].append((number, record))
    unplaced: dict[str, Refused] = {}
    for rel, numbers in unmatched.items():
        reader.check_repeated(rel, sorted([*numbers, *(number for number, _ in by_file.get(rel, ()))]))
        said = "; ".join(records.unmatched[number] for number in numbers)
        refused = Refused("join_unmatched", said + "; add the row there, or set join missing: drop")
        if rel in listed_set:
            placed.refused[rel] = refused
        else:
            unplaced[rel] = refused
    if cells and listed and not any(rel in listed_set for rel in by_file) and not placed.refused and not shared_name:
        if dropped_here:  # the rows naming the files are there: a join left them out
            raise _join_dropped_error(source, records, len(cells), dropped_here, filtered=filtered_here,
                                      hide_paths=hide_paths)
        raise _no_match_error(source, records, cells, listed, hide_paths=hide_paths)
    with stage_progress("table", len(by_file), unit="files", quiet=quiet) as progress:
        for rel, rows in by_file.items():
            reader.place(rel, rows, placed)
            progress.update()
    for rel in placed.refused:  # a row where: keeps makes its file bad, whatever its other rows' filter says
        placed.filtered.pop(rel, None)
    for rel in unplaced:  # the file's join_unmatched record is its one record
        placed.rows.pop(rel, None)
        placed.refused_rows.pop(rel, None)
        placed.filtered.pop(rel, None)
    return placed, unplaced


def _check_template_cells(template: str, path: Path | str, number: int, record: Record, cell: str, *,
                          hide_paths: bool = False) -> None:
    """Raise the ConfigError for row ``number`` where a column ``template`` uses is empty: the
    template would name another file than the row's (``{image}.jpeg`` with an empty ``image``
    names ``.jpeg``, a missing file, or every such row the same file, "listed twice"), just as
    a path column's empty cell names none. ``cell`` is the filled template (shown unless
    ``hide_paths``: its other cells may be a patient's name)."""
    used = list(dict.fromkeys(_template_columns(template)))
    empty = [c for c in used if not (record.get(c) or "").strip()]
    if not empty:
        return
    columns = ", ".join(repr(c) for c in empty)
    gives = "an empty path" if not cell else "a path without its name" if hide_paths else repr(cell)
    raise ConfigError(f"{path}: row {number}: table.path.template {template!r} gives {gives} (its column(s) "
                      f"{columns} are empty there); give the file's name there, or remove the row")


def _kept_by_where(source: SourceConfig, record: Record, candidates: Sequence[str], placed: Placed) -> list[str]:
    """The files of ``candidates`` (the listed files a bare name in the row ``record`` may mean)
    that ``where:`` keeps the row for, judged per file (a condition on a path field holds for
    one copy and not another); the others are ``filtered`` with the condition."""
    kept = []
    for rel in candidates:
        if (left_out := _where_leaves_out(source, record, rel)) is None:
            kept.append(rel)
        else:
            placed.filtered.setdefault(rel, left_out)
    return kept


def _where_leaves_out(source: SourceConfig, record: Record, rel: str) -> str | None:
    """Why ``where:`` leaves out a row a joined table has no row for, judged on the columns the
    row has (its own table's, the joins that matched, the fields of its path), or None when
    those keep it. A MIMIC-CXR lateral view that a split table made for the frontal images
    lacks is filtered, as the README says, not a ``join_unmatched`` bad sample; a condition on
    a column of the join that found no row cannot be judged, and the row stays unmatched. Also
    judges a row per file a bare name it gives may mean (:func:`_kept_by_where`)."""
    if not source.where:
        return None
    values = {**record, **{f.name: f.value(rel) or "" for f in source.fields}}
    judged = [c for c in source.where if c.key in values]
    miss = failed(judged, {k: (v,) for k, v in values.items()})
    return None if miss is None else f"{miss.key} is {values.get(miss.key, '')!r}; where: {miss.describe()}"


class _RowReader:
    """Reads the rows of one source's table into TableRows, with what every row shares (its
    columns' roles, the source kind) worked out once rather than per row."""

    def __init__(self, source: SourceConfig, records: Records, known: tuple[str, ...], listed: set[str],
                 spelled: UnicodeSpelling, *, hide_paths: bool = False, split: SplitConfig | None = None) -> None:
        assert source.table_map is not None
        self.source, self.table, self.path, self.known = source, source.table_map, records.path, known
        self.listed, self.spelled = listed, spelled
        self.records = records
        self.hide_paths = hide_paths
        header = source_kind(source.kind).identity_in_header
        self.entity_column = None if header or source.entity_path is not None else source.entity
        #: the columns giving the row's time, in order: the first non-empty cell that reads as a time
        self.time_columns: tuple[str, ...] = () if header or source.time_path is not None else tuple(source.time)
        self.target_columns = target_columns(source.target)
        self.file_columns = frozenset(source.file_columns())
        self.fixed = frozenset({self.table.path, "label", self.entity_column, *self.time_columns,
                                *self.target_columns}) - self.file_columns
        #: ``split: {by: column}``'s column, which gives each file its split (its values renamed
        #: by ``split.map``): one file's rows must agree on it, as on its entity
        self.split_column = split.column if split is not None and split.by == "column" else None
        self.split_map = dict(split.value_map) if split is not None else {}

    def place(self, rel: str, rows: list[tuple[int, Record]], placed: Placed) -> None:
        """Place the rows naming one file: fields from its path, the where filter, repeated rows."""
        source = self.source
        kept = rows
        if source.where:
            fields = {f.name: f.value(rel) or "" for f in source.fields}
            kept = []
            for number, record in rows:
                record = {**record, **fields}
                miss = failed(source.where, {k: (v,) for k, v in record.items()})
                if miss is not None:
                    placed.rows_filtered += 1
                    placed.filtered[rel] = f"{miss.key} is {record.get(miss.key, '')!r}; where: {miss.describe()}"
                    continue
                kept.append((number, record))
            if not kept:
                return
            placed.filtered.pop(rel, None)  # another row of the file is kept
        self.check_repeated(rel, [number for number, _ in kept])
        made = [self.row(number, record, rel) for number, record in kept]
        if len(made) == 1:
            placed.rows[rel] = made[0]
            return
        merged = self.merge(rel, made)
        if isinstance(merged, Refused):
            placed.refused[rel] = merged
            if rel not in self.listed:  # not on disk: its missing_file record names the rows (discover)
                placed.refused_rows[rel] = replace(made[0], refused=merged,
                                                   other_rows=tuple(row.row for row in made[1:]))
        else:
            placed.rows[rel] = merged

    def check_repeated(self, rel: str, numbers: Sequence[int]) -> None:
        """Raise the ``repeated: refuse`` ConfigError where rows ``numbers`` (in order) all name ``rel``."""
        if len(numbers) > 1 and self.table.repeated == "refuse":
            named = "its file" if self.hide_paths else repr(rel)  # under PHI: the rows say which
            raise ConfigError(f"{self.path}: row {numbers[1]}: {named} is listed twice (first on row {numbers[0]}); "
                              "keep one row per file, or set repeated: same (rows that agree, one per box) or "
                              "union (a multi-label target holding every row's labels)")

    def file_path(self, cell: str) -> str:
        """The relative path a file column's (non-empty) cell names, read as the path column's
        cells are: from the same base (a mask named like its row's file), normalized, and spelled
        as the listing spells it where the two differ only in Unicode form (:class:`UnicodeSpelling`)."""
        rel = _rebase(cell, self.table, self.source.root)
        if rel in self.listed or rel.isascii():
            return rel
        spelled = self.spelled(rel)
        if spelled != rel or isinstance(self.source.root, str):
            return spelled
        return _spelled_on_disk(os.fspath(self.source.root), rel)  # a file the kind does not list (a .npy mask)

    def named_files(self, record: Record) -> set[str]:
        """The relative paths the file columns of ``record`` name (:meth:`file_path`)."""
        return {self.file_path(v) for k, v in record.items() if k in self.file_columns and v and v.strip()}

    def split_of(self, row: TableRow) -> str | None:
        """The split ``row``'s ``split.column`` cell gives (renamed by ``split.map``), ``""`` where
        it is empty; None where the split is not by column or the row has no such cell."""
        if self.split_column is None or self.split_column not in dict(row.extra):
            return None
        value = dict(row.extra)[self.split_column].strip()
        return self.split_map.get(value, value)

    def merge(self, rel: str, rows: list[TableRow]) -> TableRow | Refused:
        """One row for a file named by several: the first, when they agree on target, entity,
        time, files and split (``split: {by: column}``'s cell) (``same``), or holding every row's
        labels (``union``, multi-label); either way with only the other cells every row agrees on
        (one box per row, RSNA: no box is the file's, and keeping the first row's made the packed
        record, and the dataset's hash, depend on the order of the table's rows). The split cell
        is the first row's where the rows give one split (``train`` and ``train ``)."""
        agreed = set(rows[0].extra).intersection(*(row.extra for row in rows[1:]))
        first = replace(rows[0], extra=tuple(cell for cell in rows[0].extra
                                             if cell in agreed or cell[0] == self.split_column))
        refused = next((r.refused for r in rows if r.refused is not None), None)
        if refused is not None:
            return refused
        files_of = [{k: v for k, v in row.extra if k in self.file_columns} for row in rows]
        for other, its_files in zip(rows[1:], files_of[1:], strict=True):
            # times by the instant they read as (2024-03-05 is 20240305 and 2024-03-05T00:00, a date being
            # its midnight as under the split's cutoffs; 2024-03-05 14:30 is 2024-03-05T14:30:00), else as written
            times = [time_instant(row.time) or row.raw_time for row in (first, other)]
            for what, a, b in (("entity", first.entity, other.entity), ("time", *times),
                               *((column, files_of[0].get(column, ""), its_files.get(column, ""))
                                 for column in sorted(self.file_columns))):
                if a != b:  # a mask (or a case's other file) too: one of the two would be packed unsaid
                    if what == "time":
                        a, b = first.raw_time, other.raw_time
                    return Refused("bad_target", f"{self.path} rows {first.row} and {other.row} name {rel!r} with "
                                                 f"{what} {a!r} and {b!r}; rows of one file must agree")
            if self.split_of(first) != self.split_of(other):  # dropped, it was "the table has no column"
                a, b = (dict(row.extra).get(self.split_column or "", "").strip() for row in (first, other))
                return Refused("bad_target", f"{self.path} rows {first.row} and {other.row} name {rel!r} with the "
                                             f"splits {a!r} and {b!r} (column {self.split_column!r}, split: "
                                             "{by: column}); rows of one file must agree: give them one split")
        united = target_class(self.source.target.kind).union_text([r.label for r in rows]) \
            if self.table.repeated == "union" else None
        others = tuple(row.row for row in rows[1:])
        if united is not None:
            return replace(first, label=united, other_rows=others)
        for other in rows[1:]:
            if other.label != first.label:
                return Refused("bad_target", f"{self.path} rows {first.row} and {other.row} name {rel!r} with the "
                                             f"targets {first.label!r} and {other.label!r}; rows of one file must "
                                             f"agree (repeated: {self.table.repeated})")
        return replace(first, other_rows=others)

    def _joined_at(self, number: int, record: Record, column: str | None) -> str:
        """Where ``column``'s cell of row ``number`` is written, where a join table added it
        (:meth:`Records.where`); "" where the main table holds it."""
        if column is None or not any(column in join.columns for join in self.records.joined):
            return ""
        return self.records.where(number, record, [column])

    def _raw_time(self, record: Record) -> str:
        """The row's time cell: the first of the source's ``time:`` columns whose cell reads as a
        time (a fallback list, as a DICOM source's keywords are), else the first non-empty one (its
        ``missing_time`` record then says it is unreadable), else ``""``."""
        cells = [(record.get(column) or "").strip() for column in self.time_columns]
        filled = [cell for cell in cells if cell]
        return next((cell for cell in filled if normalize_time(cell) is not None), filled[0] if filled else "")

    def row(self, number: int, record: Record, rel: str) -> TableRow:
        """A record as a TableRow: its target, entity and time, and its other cells (with the
        fields of the file's path ``rel``)."""
        label: str | Refused = ""
        if self.target_columns:
            where = self.records.where(number, record, self.target_columns)
            label = from_row(self.source.target, record, where, self.known)
        refused = label if isinstance(label, Refused) and not label.empty else None
        raw_time = self._raw_time(record) if self.time_columns else None
        extra = []
        for k, v in record.items():
            if k in self.fixed:
                continue
            if k in self.file_columns and v.strip():
                v = self.file_path(v)
            extra.append((k, v or ""))
        for f in self.source.fields:
            extra.append((f.name, f.value(rel) or ""))
        return TableRow(
            row=number,
            label=label if isinstance(label, str) else None,  # an empty cell: missing_label after the probe
            refused=refused,
            unlabeled=label.message if isinstance(label, Refused) and label.empty else None,
            entity=((record.get(self.entity_column) or "").strip() or None) if self.entity_column else None,
            entity_at=self._joined_at(number, record, self.entity_column),
            time=normalize_time(raw_time),
            raw_time=raw_time or None,
            extra=tuple(sorted(dict(extra).items())),
            cell="" if self.table.template is not None else str(record.get(self.table.path) or "").strip(),
        )
