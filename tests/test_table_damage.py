"""A source's table damaged or saved in a form packer does not read as it is, told as what it is.

A NUL byte in a cell (a cut download padded with zeros) is corruption, not a class or an entity
of its own; a compressed table packer does not read as it is (bzip2, xz, zstd, gzip without a
``.gz`` name) is told as such, with the command that decompresses it, not told to be saved as UTF-8;
a JSON Lines table (Hugging Face's ``metadata.jsonl``) is read as a JSON table's records are; a
``sep=;`` line that makes the header one column is named as the cause; a table left empty by a
failed download is told as empty, not asked for a column; a JSON record's object value is carried as
JSON text, not as Python's repr.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import discover

LABELS = ["cat" if i % 2 == 0 else "dog" for i in range(6)]
ROWS = [f"a{i}.png,{LABELS[i]},p{i // 2}" for i in range(6)]


def _images(root: Path, count: int = 6) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):  # decodable, each its own (no planted duplicates)
        cv2.imwrite(str(root / f"a{i}.png"), np.random.default_rng(i).integers(0, 255, (16, 16, 3)).astype(np.uint8))


def _job(tmp_path: Path, table: str | dict[str, Any], data: bytes, **source: Any) -> Path:
    _images(tmp_path / "img")
    name = table if isinstance(table, str) else table["file"]
    (tmp_path / name).write_bytes(data)
    doc = {"name": "t", "sources": [{"kind": "image", "root": "img", "table": table, **source}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": "out"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _discover_error(job: Path) -> str:
    with pytest.raises(ConfigError) as raised:
        discover(load_job(job))
    return str(raised.value)


def _csv(rows: list[str], header: str = "path,label,entity") -> bytes:
    return ("\n".join([header, *rows]) + "\n").encode("utf-8")


# -- a NUL byte in a cell ------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "cell", "column"), [
    (3, "a3.png,d\x00og,p1", "label"), (4, "a4.png,cat,p\x002", "entity"), (2, "a\x002.png,cat,p1", "path")],
    ids=["label", "entity", "path"])
def test_a_nul_byte_in_a_cell_is_a_config_error_naming_the_table_line_and_column(
        tmp_path: Path, row: int, cell: str, column: str) -> None:
    """Python's csv module reads a NUL byte as a character of the cell: ``d\\x00og`` was a class of its
    own beside ``dog``, and ``p\\x002`` an entity apart from ``p2``, which the split could place in
    another split than p2's other file. A NUL inside a cell's text is damage."""
    rows = list(ROWS)
    rows[row] = cell
    message = _discover_error(_job(tmp_path, "labels.csv", _csv(rows)))
    line = row + 2  # the header is line 1
    assert f"{tmp_path / 'labels.csv'}: the {column!r} cell of the row on line {line} holds a NUL byte" in message, \
        message
    assert "download or copy the table again" in message
    assert "\x00" not in message  # the byte itself is never printed


def test_trailing_nul_bytes_are_padding_dropped_not_damage(tmp_path: Path) -> None:
    """DICOM pads a UI value with a NUL (PS3.5 6.2) and SQL Server's bcp -c writes an empty string as a
    lone NUL: a table holding them packed before NUL cells were refused, and must read as text."""
    rows = list(ROWS)
    rows[4] = "a4.png,cat,p2\x00"
    found = discover(load_job(_job(tmp_path, "labels.csv", _csv(rows))))
    assert {ref.entity for ref in found.refs if ref.relpath == "a4.png"} == {"p2"}


@pytest.mark.parametrize("tail", ["a5.png,dog,p" + "\x00" * 4000, "a5.png,dog,p2\n" + "\x00" * 4000],
                         ids=["cut-row-zero-filled", "zero-fill-after-the-table"])
def test_a_run_of_nul_bytes_is_a_cut_files_zero_fill_not_padding(tmp_path: Path, tail: str) -> None:
    """A download cut short and filled with zero bytes to its block size ends in a run of NULs: taken
    as padding, 'p' + NULs packed the entity 'p' (p2's file in another split), and zero fill after a
    whole table told of an empty path cell on a row no editor shows."""
    rows = [*ROWS[:5], tail]
    message = _discover_error(_job(tmp_path, "labels.csv", ("\n".join(["path,label,entity", *rows])).encode()))
    assert "holds a NUL byte (\\x00) inside its text or a run of them" in message, message


def test_a_nul_byte_in_a_joined_table_s_cell_is_told_in_that_table(tmp_path: Path) -> None:
    """A join table is read by the same reader: its damage is told in its own name."""
    meta = tmp_path / "meta.csv"
    sexes = ["F", "M", "F", "M", "F\x00x", "M"]
    meta.write_bytes(_csv([f"a{i}.png,{sex}" for i, sex in enumerate(sexes)], header="path,sex"))
    message = _discover_error(_job(tmp_path, {"file": "labels.csv", "join": [{"file": "meta.csv", "on": ["path"]}]},
                                   _csv(ROWS)))
    assert f"{meta}: the 'sex' cell of the row on line 6 holds a NUL byte" in message, message


def test_a_nul_byte_in_the_header_row_is_told_as_the_header_s(tmp_path: Path) -> None:
    message = _discover_error(_job(tmp_path, "labels.csv", _csv(ROWS, header="path,lab\x00el,entity")))
    assert f"{tmp_path / 'labels.csv'}: column 2 of the header row (line 1) holds a NUL byte" in message, message


def test_a_table_without_nul_bytes_reads_every_row(tmp_path: Path) -> None:
    """The check refuses only the damaged cell's table: the same table whole is read as it was."""
    found = discover(load_job(_job(tmp_path, "labels.csv", _csv(ROWS))))
    assert sorted((r.relpath, r.label) for r in found.refs) == [(f"a{i}.png", LABELS[i]) for i in range(6)]


# -- a compressed table ----------------------------------------------------------------------------

#: zstd's magic number (the standard library has no zstd to compress with): what the file is told by
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def test_a_gzipped_table_named_csv_gz_is_read(tmp_path: Path) -> None:
    found = discover(load_job(_job(tmp_path, "labels.csv.gz", gzip.compress(_csv(ROWS)))))
    assert sorted((r.relpath, r.label) for r in found.refs) == [(f"a{i}.png", LABELS[i]) for i in range(6)]


@pytest.mark.parametrize("name", ["labels.csv", "labels.tsv"])
def test_a_gzipped_table_named_without_gz_is_told_to_be_renamed_or_gunzipped(tmp_path: Path, name: str) -> None:
    """A browser or a download tool that kept the gzip encoding leaves ``labels.csv`` gzipped: it
    was refused as 'not UTF-8 text ...; save the table as UTF-8', which it is, once gunzipped."""
    message = _discover_error(_job(tmp_path, name, gzip.compress(_csv(ROWS))))
    assert f"{tmp_path / name}: a gzip-compressed file, not a text table" in message, message
    stem, ext = name.split(".")
    assert f"mv {name} {name}.gz" in message and f"gzip -dc {name} > {stem}.decompressed.{ext}" in message
    assert "UTF-8" not in message


@pytest.mark.parametrize(("name", "data", "said", "command"), [
    ("labels.csv.bz2", bz2.compress(_csv(ROWS)), "a bzip2-compressed", "bzip2 -dc labels.csv.bz2 > labels.csv"),
    ("labels.csv.xz", lzma.compress(_csv(ROWS)), "an xz-compressed", "xz -dc labels.csv.xz > labels.csv"),
    ("labels.csv.zst", ZSTD_MAGIC + b"\x04\x00" * 20, "a zstd-compressed", "zstd -dc labels.csv.zst > labels.csv"),
    ("labels.csv", bz2.compress(_csv(ROWS)), "a bzip2-compressed", "bzip2 -dc labels.csv > labels.decompressed.csv")],
    ids=["bzip2", "xz", "zstd", "bzip2 named .csv"])
def test_a_table_compressed_otherwise_than_gzip_is_told_so_with_the_command_that_decompresses_it(
        tmp_path: Path, name: str, data: bytes, said: str, command: str) -> None:
    """pandas reads ``.bz2``, ``.xz`` and ``.zst`` tables as they are; packer was saying 'not UTF-8
    text (invalid start byte ...); save the table as UTF-8', the wrong cause and a fix that cannot
    work: the table inside is UTF-8."""
    message = _discover_error(_job(tmp_path, name, data))
    assert f"{tmp_path / name}: {said} file, not a text table" in message, message
    assert command in message and "gzip" in message
    assert "UTF-8" not in message


# -- a JSON Lines table ---------------------------------------------------------------------------


def _json_lines(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")


RECORDS = [{"path": f"a{i}.png", "label": LABELS[i], "entity": f"p{i // 2}"} for i in range(6)]


@pytest.mark.parametrize("name", ["metadata.jsonl", "labels.ndjson", "labels.jsonl.gz", "labels.json"])
def test_a_json_lines_table_is_read_as_a_json_table_s_records(tmp_path: Path, name: str) -> None:
    """Hugging Face imagefolder's ``metadata.jsonl`` and many exporters write one JSON object a line.
    It was read as a CSV ('missing column path ... the header row has {"path": "a0.png", ...}'), or,
    named ``.json``, refused as 'not a JSON document (Extra data at line 2)'."""
    data = _json_lines(RECORDS)
    found = discover(load_job(_job(tmp_path, name, gzip.compress(data) if name.endswith(".gz") else data)))
    assert sorted((r.relpath, r.label, r.entity) for r in found.refs) == [
        (f"a{i}.png", LABELS[i], f"p{i // 2}") for i in range(6)]


def test_a_json_lines_table_s_bad_line_is_told_by_its_line(tmp_path: Path) -> None:
    """Blank lines are skipped and lines keep their numbers, as an editor shows them."""
    cut = '{"path": "a2.png", "label": "cat"\n'  # its closing brace lost
    text = _json_lines(RECORDS[:2]).decode() + "\n" + cut + _json_lines(RECORDS[3:]).decode()
    message = _discover_error(_job(tmp_path, "labels.jsonl", text.encode()))
    assert f"{tmp_path / 'labels.jsonl'}: line 4 is not a JSON object" in message, message
    assert "JSON Lines" in message


def test_a_json_lines_line_that_is_no_object_is_told_by_its_line(tmp_path: Path) -> None:
    text = _json_lines(RECORDS[:2]).decode() + '["a2.png", "cat"]\n'
    message = _discover_error(_job(tmp_path, "labels.jsonl", text.encode()))
    assert f"{tmp_path / 'labels.jsonl'}: line 3 holds a list, not a record (a JSON object)" in message, message


def test_records_key_on_a_json_lines_table_is_refused(tmp_path: Path) -> None:
    """``records:`` names the list inside one JSON document; a JSON Lines file is its records."""
    message = _discover_error(_job(tmp_path, {"file": "labels.jsonl", "records": "training"}, _json_lines(RECORDS)))
    assert "JSON Lines" in message and "records:" in message, message


# -- a sep= line the header contradicts --------------------------------------------------------------


@pytest.mark.parametrize(("hint", "above", "said", "other"), [
    ("sep=;", "", "semicolons", "commas"), ('"sep=;"', "\n", "semicolons", "commas"),
    ("sep=\t", "", "tabs", "commas")], ids=["sep=;", "quoted after a blank line", "sep=tab"])
def test_a_sep_line_that_makes_the_header_one_column_is_named_as_the_cause(
        tmp_path: Path, hint: str, above: str, said: str, other: str) -> None:
    """Excel's ``sep=;`` hint kept above a table re-saved with commas made the header one column:
    'missing column path ... the header row has path,label,entity', a column the header visibly holds."""
    message = _discover_error(_job(tmp_path, "labels.csv", (above + hint + "\n").encode() + _csv(ROWS)))
    line = 1 + above.count("\n")
    shown = hint.strip('"').replace("\t", "<tab>")
    assert (f"{tmp_path / 'labels.csv'}: the {shown} line (line {line}) says the cells are separated "
            f"by {said}, but the header row (line {line + 1}) holds none: read so, it is one column, while "
            f"{other} split it into 3") in message, message
    assert "remove the line" in message and "sep=," in message
    assert "missing column" not in message


def test_a_sep_line_that_agrees_with_the_header_is_read(tmp_path: Path) -> None:
    text = "sep=;\n" + _csv(ROWS).decode().replace(",", ";")
    found = discover(load_job(_job(tmp_path, "labels.csv", text.encode())))
    assert sorted((r.relpath, r.label) for r in found.refs) == [(f"a{i}.png", LABELS[i]) for i in range(6)]


# -- an empty table ----------------------------------------------------------------------------------

EMPTY = "the table is empty: it holds no header row and no rows"


@pytest.mark.parametrize(("name", "data"), [
    ("labels.csv", b""), ("labels.csv", b"\n\n"), ("labels.csv", b"\xef\xbb\xbf"), ("labels.tsv", b" \r\n\t\r\n"),
    ("labels.csv.gz", gzip.compress(b"")), ("labels.json", b""), ("labels.jsonl", b"\n")],
    ids=["0 bytes", "blank lines", "a BOM alone", "blank space", "gzipped", "json", "json lines"])
def test_an_empty_table_is_told_as_empty_not_asked_for_a_column(tmp_path: Path, name: str, data: bytes) -> None:
    """A failed download or a ``> labels.csv`` redirect that failed leaves the file empty: it was
    told 'missing column path ...; name the column that holds each file's name ...; the header row
    has nothing', a fix that cannot work, where a header-only table is told it has no rows."""
    message = _discover_error(_job(tmp_path, name, data))
    assert f"{tmp_path / name}: {EMPTY}" in message, message
    assert "download or copy it again" in message
    assert "name the column" not in message and "missing column" not in message


def test_an_empty_joined_table_is_told_as_empty(tmp_path: Path) -> None:
    (tmp_path / "meta.csv").write_bytes(b"")
    message = _discover_error(_job(tmp_path, {"file": "labels.csv", "join": [{"file": "meta.csv", "on": ["path"]}]},
                                   _csv(ROWS)))
    assert f"{tmp_path / 'meta.csv'}: {EMPTY}" in message, message


# -- a JSON record's object value ----------------------------------------------------------------------


def test_a_json_record_s_object_values_are_carried_as_json_text(tmp_path: Path) -> None:
    """``{"meta": {"age": 3, "sex": "F"}}`` rode into the sample's record as Python's repr,
    ``{'age': 3, 'sex': 'F'}``, which json.loads cannot read back; an object inside a list as
    ``x|{'y': 1}``. Each object is its JSON text, keys in the record's order, non-ASCII kept."""
    records = [{**r, "meta": {"sex": "F", "age": i, "site": "Zürich"}, "tags": ["x", {"y": i}]}
               for i, r in enumerate(RECORDS)]
    found = discover(load_job(_job(tmp_path, "labels.json", json.dumps(records).encode())))
    cells = {r.relpath: dict(r.extra) for r in found.refs}
    assert len(cells) == 6
    for i in range(6):
        meta = cells[f"a{i}.png"]["meta"]
        assert meta == json.dumps({"sex": "F", "age": i, "site": "Zürich"}, ensure_ascii=False)
        assert json.loads(meta) == records[i]["meta"]
        assert cells[f"a{i}.png"]["tags"] == f'x|{{"y": {i}}}'


def test_a_json_table_with_no_records_is_told_so_not_to_name_a_column(tmp_path: Path) -> None:
    """`[]` or a Decathlon file whose `training` list is empty has no keys: the error asked to name
    the column that holds each file's name, a fix that cannot work."""
    message = _discover_error(_job(tmp_path, "labels.json", b"[]"))
    assert "the table has no records (its list is empty)" in message and "name the column" not in message, message


def test_a_list_inside_a_json_list_stays_json_text(tmp_path: Path) -> None:
    """[[1, 2, 3, 4], [5, 6, 7, 8]] (two boxes) was joined as 1|2|3|4|5|6|7|8, the flat list's cell."""
    from packer.pipeline.tables import _cell

    assert _cell([[1, 2, 3, 4], [5, 6, 7, 8]]) == "[1, 2, 3, 4]|[5, 6, 7, 8]"
    assert _cell([1, 2, 3]) == "1|2|3"
