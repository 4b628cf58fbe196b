"""A source's table that packer cannot take as it is, told as what it is, before any file is decoded.

An XML annotation file (Pascal VOC's, LIDC's) or a page saved from a browser named as a table is
refused as such, with how to convert it, as a workbook or a Parquet file is; and the rows of one
file that give it different splits under ``split: {by: column}`` make it a bad sample naming the
rows, as rows that disagree on its entity do.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
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


def test_a_csv_whose_header_cells_are_in_angle_brackets_is_still_a_csv(tmp_path: Path) -> None:
    """No tag closes in it: a header row, not an element."""
    _images(tmp_path / "img", ["a.png", "b.png"])
    (tmp_path / "t.csv").write_text("<path>,<label>\na.png,cat\nb.png,dog\n")
    found = discover(load_job(_job(tmp_path, {"table": {"file": "t.csv", "path": "<path>"},
                                              "label": {"column": "<label>"}, "entity": "<path>"})))
    assert sorted((r.relpath, r.label) for r in found.refs) == [("a.png", "cat"), ("b.png", "dog")]
