"""The HTML report escapes every string a user supplies: label names from a table, entity ids,
source names, and whatever a received dataset's manifest and index say.

The dataset is real: a build of PNG photos whose label table holds hostile labels and entity
ids. A received copy of it then names its source with a hostile string too (in the manifest,
the index and the job config it records), as an edited dataset can; the job file itself cannot
(source names are ``[A-Za-z0-9_-]``). Each payload, had it run, would mark the document
(``data-pwned`` on ``<html>``, or a ``pwned`` title); the checks are on the parsed markup and,
with headless Chromium, on the DOM the browser built after loading the page.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packer.htmlreport import SECTION_IDS, render_html_report
from tests.test_htmlreport import ReportParser, parse
from tests.test_htmlreport_browser import chromium, run_chromium  # noqa: F401  (the fixture)
from tests.test_targets import _build, _job, _photo_table

PAYLOADS = {
    "script": "<script>document.documentElement.dataset.pwned='script'</script>",
    "attribute": "\"><img src=x onerror=\"document.documentElement.dataset.pwned='img'\">",
    "single": "'><svg onload='document.title=`pwned`'>",
    "url": "javascript:document.documentElement.dataset.pwned='url'",
    "comment": "--><b id=pwned>comment</b><!--",
}
#: A folder and a file name (no '/' in either) of a broken file, listed as a bad sample
HOSTILE_FOLDER = "<svg onload=\"document.documentElement.dataset.pwned='folder'\">"
HOSTILE_FILE = "x\"><img src=x onerror=\"document.documentElement.dataset.pwned='file'\">.png"
#: A source name for the received copy: closes the attribute and the element it may land in
HOSTILE_SOURCE = "ct\"'><img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A received version folder with hostile labels, entities and source name, and its manifest."""
    tmp = tmp_path_factory.mktemp("hostile")
    labels = [*PAYLOADS.values(), "normal"]
    rows = [{"path": f"{i}.png", "label": labels[i % len(labels)].replace(",", " "),
             "entity": (PAYLOADS["attribute"] if i == 0 else f"E{i}"), "timestamp": "2024-01-01"}
            for i in range(18)]
    raw = _photo_table(tmp, rows)
    # row 17 a copy of row 0's pixels under another hostile entity: a duplicate cluster the audit
    # reports, its members captioned with their entities
    shutil.copyfile(raw / rows[0]["path"], raw / rows[17]["path"])
    rows[17]["entity"] = PAYLOADS["script"]
    # a file whose name is a payload, in a folder whose name is one: not a PNG, so a bad sample
    # whose path and message the report lists
    broken = raw / HOSTILE_FOLDER / HOSTILE_FILE
    broken.parent.mkdir()
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    rows.append({"path": f"{HOSTILE_FOLDER}/{HOSTILE_FILE}", "label": "normal", "entity": "E99",
                 "timestamp": "2024-01-01"})
    table = raw / "table.csv"
    # CSV: quote every cell (the payloads hold quotes), doubling the quotes inside
    lines = ["path,label,entity,timestamp"] + [",".join('"' + row[c].replace('"', '""') + '"'
                                                           for c in ("path", "label", "entity", "timestamp"))
                                                  for row in rows]
    table.write_text("\n".join(lines) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(table)}
    split = {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "balance": {"accept": True}}
    built = _build(_job(tmp, [source], validate={"max_bad_fraction": 0.5}, split=split))
    copy = tmp / "received"
    shutil.copytree(built.version_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert set(PAYLOADS.values()) <= set(manifest["label_map"]), manifest["label_map"]  # the build kept them
    index = pq.read_table(copy / "_index.parquet")
    column = index.schema.get_field_index("source")
    old = index["source"][0].as_py()
    hostile_column = pa.array([HOSTILE_SOURCE] * len(index), index.schema.field("source").type)
    index = index.set_column(column, "source", hostile_column)
    pq.write_table(index, copy / "_index.parquet")
    manifest["config"]["sources"][0]["name"] = HOSTILE_SOURCE
    manifest["sample_schema"]["shapes"] = {HOSTILE_SOURCE: manifest["sample_schema"]["shapes"].pop(old)}
    return copy, manifest


def _injected(parsed: ReportParser) -> list[str]:
    """Elements and attributes no packer report has, that a payload would bring."""
    out = [f"<{tag}>" for tag in ("script", "iframe", "object", "embed", "b") if parsed.tags[tag]]
    out += [f"{tag} {name}={value!r}" for tag, name, value in parsed.attributes
            if name.startswith("on") or (name in ("href", "src", "xlink:href", "action", "formaction")
                                         and value.strip().lower().startswith("javascript:"))
            or (name == "id" and value == "pwned")]
    out += [f"img src={src!r}" for src in parsed.images if not src.startswith("data:image/png;base64,")]
    return out


def test_every_hostile_label_entity_and_source_reaches_the_report_as_text(hostile: tuple[Path, dict[str, Any]]
                                                                         ) -> None:
    folder, manifest = hostile
    text = render_html_report(folder, manifest=manifest)
    parsed = parse(text)
    assert _injected(parsed) == []
    assert parsed.unbalanced == []
    assert parsed.tags["svg"] > 0 and parsed.tags["img"] > 0  # the report's own charts and thumbnails are there
    shown = parsed.all_text
    for payload in PAYLOADS.values():  # each label is named, as written (escaped in the markup)
        assert " ".join(payload.split()) in shown, payload
    assert " ".join(HOSTILE_SOURCE.split()) in shown
    assert HOSTILE_FILE in shown and "expected IHDR" in shown  # the bad file is listed, path and message
    # the duplicate cluster is shown, captioned with both hostile entities
    assert f"· {PAYLOADS['script']}" in shown and f"· {PAYLOADS['attribute']}" in shown
    # no payload text was cut into markup: every '<' of a payload is an entity in the file
    for payload in (*PAYLOADS.values(), HOSTILE_SOURCE, HOSTILE_FOLDER, HOSTILE_FILE):
        assert payload not in text


#: Manifest fields the report reads to find and decode the shards: left as they are
STRUCTURE = {"format", "file", "sha256", "dtype", "layout", "kind", "version", "dataset_hash", "created_at", "mode",
             "dates", "report", "by", "rows", "bytes"}
PAYLOAD = "\"'><img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"


def _poisoned(value: Any, key: str = "") -> Any:
    """``value`` with the payload appended to every string a person could have written."""
    if isinstance(value, dict):
        named = key in ("label_map", "shapes", "excluded", "excluded_by_modality", "excluded_by_sop_class")
        return {(k + PAYLOAD if named else k): _poisoned(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_poisoned(v, key) for v in value]
    if isinstance(value, str) and key not in STRUCTURE:
        return value + PAYLOAD
    return value


def test_a_manifest_whose_every_written_string_is_hostile_renders_as_text(hostile: tuple[Path, dict[str, Any]]
                                                                          ) -> None:
    """Beyond the planted fields: every string of the manifest a person or a tool could have
    written (names, config values, label and source names, split names in the config, excluded
    counts by modality and SOP class, audit settings) carries the payload."""
    folder, manifest = hostile
    poisoned = _poisoned(manifest)
    assert json.dumps(poisoned).count("onerror") > 50
    parsed = parse(render_html_report(folder, manifest=poisoned))
    assert _injected(parsed) == []
    assert parsed.unbalanced == []


@pytest.mark.slow  # starts headless Chromium
def test_chromium_builds_no_element_from_a_hostile_string_and_runs_none(chromium: str,  # noqa: F811
                                                                         hostile: tuple[Path, dict[str, Any]],
                                                                         tmp_path: Path) -> None:
    folder, manifest = hostile
    page = tmp_path / "report.html"
    page.write_text(render_html_report(folder, manifest=manifest), encoding="utf-8")
    proc = run_chromium(chromium, tmp_path / "profile", "--dump-dom", page.resolve().as_uri())
    dom = proc.stdout
    assert all(f'id="{ident}"' in dom for ident in SECTION_IDS), proc.stderr[-2000:]
    parsed = parse(dom)
    # no payload ran: none marked <html>, none retitled the page (SVG <title>s hold labels, as text)
    assert [(tag, name) for tag, name, _ in parsed.attributes if name == "data-pwned"] == []
    head_title = re.search(r"<head>.*?<title>(.*?)</title>", dom, re.S)
    assert head_title is not None and head_title[1].startswith("packer report"), head_title
    assert _injected(parsed) == []
    for payload in PAYLOADS.values():
        assert " ".join(payload.split()) in parsed.all_text
