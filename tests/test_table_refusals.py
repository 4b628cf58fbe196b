"""A source's table that packer cannot take as it is, told as what it is, before any file is decoded.

An XML annotation file (Pascal VOC's, LIDC's) or a page saved from a browser named as a table is
refused as such, with how to convert it, as a workbook or a Parquet file is; and the rows of one
file that give it different splits under ``split: {by: column}`` make it a bad sample naming the
rows, as rows that disagree on its entity do.
"""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import discover

VOC = ('<?xml version="1.0"?>\n<annotation>\n  <folder>VOC2012</folder>\n  <filename>a.png</filename>\n'
       "  <object><name>cat</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object>\n"
       "</annotation>\n")
#: LIDC-IDRI's reading sessions: no line break after the declaration's BOM, a namespaced root
LIDC = ('\ufeff\n\n<?xml version="1.0" encoding="UTF-8"?>\n<LidcReadMessage uid="1.3.6.1" '
        'xmlns="http://www.nih.gov"><ResponseHeader><Version>1.8.1</Version></ResponseHeader></LidcReadMessage>\n')
#: An annotation file without a declaration
BARE = "<annotation><filename>a.png</filename><object><name>cat</name></object></annotation>\n"
PAGE = ("<!DOCTYPE html>\n<html><head><title>labels.csv - Drive</title></head>\n"
        "<body><table><tr><th>path</th><th>label</th></tr><tr><td>a.png</td><td>cat</td></tr></table></body></html>\n")


def _images(root: Path, names: list[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):  # decodable, each its own (no planted duplicates)
        cv2.imwrite(str(root / name), np.random.default_rng(i).integers(0, 255, (24, 24, 3)).astype(np.uint8))


def _job(tmp_path: Path, source: dict[str, Any], **extra: Any) -> Path:
    doc = {"name": "t", "sources": [{"kind": "image", "root": "img", **source}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": "out", **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _discover_error(job: Path) -> str:
    with pytest.raises(ConfigError) as raised:
        discover(load_job(job))
    return str(raised.value)


# -- a document that is no table ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text", "said"), [
    ("a.xml", VOC, "an XML document (its first element <annotation>), not a text table"),
    ("labels.csv", LIDC, "an XML document (its first element <LidcReadMessage>), not a text table"),
    ("labels.tsv", BARE, "an XML document (its first element <annotation>), not a text table"),
    ("labels.csv.gz", VOC, "an XML document (its first element <annotation>), not a text table"),
    ("labels.json", VOC, "an XML document (its first element <annotation>), not a text table"),
    ("labels.csv", PAGE, "an HTML page (a table saved from a browser?), not a text table")])
def test_an_xml_or_html_document_named_as_a_table_is_refused_as_such_with_how_to_convert_it(
        tmp_path: Path, name: str, text: str, said: str) -> None:
    """It was read as a CSV: 'missing column path ... name the column that holds each file's
    name', with the XML declaration shown as 'the header row', a fix that cannot work. Told by
    its content (a declaration, a doctype or an element after a BOM and blank lines), whatever
    its name says."""
    _images(tmp_path / "img", ["a.png", "b.png"])
    data = text.encode("utf-8")
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    message = _discover_error(_job(tmp_path, {"table": name, "label": {"column": "label"}}))
    assert f"{tmp_path / name}: {said}" in message, message
    assert "packer reads CSV, TSV and JSON tables" in message
    assert ("pd.read_html(...)[0].to_csv" if "HTML" in said else "pd.read_xml(...).to_csv") in message
    assert "name the column" not in message and "header row" not in message and "not valid JSON" not in message


def test_a_dicom_source_s_labels_given_as_xml_are_refused_as_xml(tmp_path: Path) -> None:
    """``labels:`` (a DICOM source's table) reads the same way."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "1.dcm").write_bytes(b"\0" * 128 + b"DICM")
    (tmp_path / "reads.xml").write_text(LIDC, encoding="utf-8")
    doc = yaml.safe_load(_job(tmp_path, {}).read_text())
    doc["sources"] = [{"kind": "dicom", "root": "img", "labels": "reads.xml"}]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    message = _discover_error(tmp_path / "job.yaml")
    assert "reads.xml: an XML document (its first element <LidcReadMessage>), not a text table" in message, message


@pytest.mark.parametrize("text", ["<path>,<label>\na.png,cat\nb.png,dog\n",
                                  "<path>,<label>,<note>\na.png,cat,<b>fuzzy</b>\nb.png,dog,ok<br/>fine\n",
                                  "<path>\t<label>\na.png\tcat\nb.png\tdog\n"],
                         ids=["plain cells", "cells holding markup", "tab-separated"])
def test_a_csv_whose_header_cells_are_in_angle_brackets_is_still_a_csv(tmp_path: Path, text: str) -> None:
    """Its first element is followed by a comma, and no end tag of its own closes it: a header
    row, not an element, whatever markup a free-text column's cells hold."""
    _images(tmp_path / "img", ["a.png", "b.png"])
    (tmp_path / "t.csv").write_text(text)
    found = discover(load_job(_job(tmp_path, {"table": {"file": "t.csv", "path": "<path>"},
                                              "label": {"column": "<label>"}, "entity": "<path>"})))
    assert sorted((r.relpath, r.label) for r in found.refs) == [("a.png", "cat"), ("b.png", "dog")]


# -- rows of one file that give it two splits ------------------------------------------------------


def _split_job(tmp_path: Path, rows: list[str], repeated: str = "same", **split: Any) -> Path:
    _images(tmp_path / "img", [f"{i}.png" for i in range(6)])
    (tmp_path / "t.csv").write_text("\n".join(["path,obj,entity,split", *rows]) + "\n")
    label = {"column": "obj"} if repeated == "same" else {"kind": "multilabel", "column": "obj"}
    return _job(tmp_path, {"table": {"file": "t.csv", "repeated": repeated}, "entity": {"column": "entity"},
                           "label": label}, split={"by": "column", "column": "split", **split},
                validate={"max_bad_fraction": 0.5})


ROWS = ["0.png,dog,E0,train", "1.png,cat,E1,train", "2.png,dog,E2,valid", "3.png,cat,E3,test",
        "4.png,dog,E4,train", "5.png,cat,E5,train"]


@pytest.mark.parametrize("repeated", ["same", "union"])
def test_rows_of_one_file_that_give_it_two_splits_make_it_a_bad_target_naming_them(
        tmp_path: Path, repeated: str) -> None:
    """The merged row kept only the cells its rows agree on: the split cell was dropped, and after
    every file was decoded the build died with "the table ... has no column 'split' ... add the
    column", a column the table has. The disagreement is the file's bad_target record, before
    decoding, as a disagreement on the entity is."""
    job = _split_job(tmp_path, [*ROWS, "0.png,dog,E0,test"], repeated)
    found = discover(load_job(job))
    (issue,) = found.issues
    assert (Path(issue.path).name, issue.reason) == ("0.png", "bad_target")
    assert issue.message == (f"{tmp_path / 't.csv'} rows 2 and 8 name '0.png' with the splits 'train' and 'test' "
                             "(column 'split', split: {by: column}); rows of one file must agree: give them one split")
    assert sorted(r.relpath for r in found.refs) == [f"{i}.png" for i in range(1, 6)]


def test_rows_of_one_file_whose_splits_agree_after_the_map_keep_its_split(tmp_path: Path) -> None:
    """'val' and ' valid' are one split under map: {val: valid}: the file keeps the first row's cell."""
    job = _split_job(tmp_path, [*ROWS[:2], "2.png,dog,E2,val", *ROWS[3:], "2.png,dog,E2, valid"], map={"val": "valid"})
    found = discover(load_job(job))
    assert found.issues == []
    assert {r.relpath: dict(r.extra).get("split") for r in found.refs}["2.png"] == "val"


def test_rows_that_disagree_on_a_split_column_the_split_does_not_read_keep_only_their_shared_cells(
        tmp_path: Path) -> None:
    """Under another split the column is a cell like any other: one box per row, dropped unsaid."""
    job = _split_job(tmp_path, [*ROWS, "0.png,dog,E0,test"])
    doc = yaml.safe_load(job.read_text())
    doc["split"] = {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 1}
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert found.issues == []
    assert "split" not in dict({r.relpath: r for r in found.refs}["0.png"].extra)


def test_a_build_whose_file_rows_give_two_splits_packs_the_others_in_their_splits(tmp_path: Path) -> None:
    job = _split_job(tmp_path, [*ROWS, "0.png,dog,E0,test", "5.png,cat,E5,train"])
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    bad = list(read_bad_samples(result.version_dir / "bad_samples.jsonl"))
    assert [(Path(b["path"]).name, b["reason"]) for b in bad] == [("0.png", "bad_target")]
    splits = {}
    for shard in sorted(result.version_dir.rglob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in (m for m in tar.getmembers() if m.name.endswith(".json")):
                record = json.load(tar.extractfile(member))  # type: ignore[arg-type]
                splits[Path(record["path"]).name] = record["split"]
    assert splits == {"1.png": "train", "2.png": "valid", "3.png": "test", "4.png": "train", "5.png": "train"}
