"""The HTML report of a built dataset: sections, numbers, images, escaping, no network, bounds."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.commands.report import report
from packer.config import load_job
from packer.htmlreport import SECTION_IDS, ReportLimits, render_html_report, write_html_report
from packer.htmlreport.stats import ChannelHistograms
from packer.htmlreport.thumbs import channel_names, composite, composite_pane, png_data_uri, sample_panes
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import demo_job_doc, write_job

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
SVG_LEAVES = {"rect", "line", "polyline", "polygon", "path", "circle"}


class ReportParser(HTMLParser):
    """Collects what the tests check: headings, images, attributes, table cells, text, tag balance."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.h2: dict[str, str] = {}
        self.images: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.cells: dict[tuple[str | None, str | None, str], int] = {}
        self.body_rows: Counter[str | None] = Counter()
        self.tags: Counter[str] = Counter()
        self.text: list[str] = []
        self.unbalanced: list[str] = []
        self._stack: list[str] = []
        self._tables: list[str | None] = []
        self._in_tbody = False
        self._row: str | None = None
        self._h2: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags[tag] += 1
        self.attributes.extend((tag, k, v or "") for k, v in attrs)
        if tag not in VOID and tag not in SVG_LEAVES:
            self._stack.append(tag)
        if tag == "h2":
            self._h2 = a.get("id", "")
            self.h2[self._h2] = ""
        elif tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "table":
            self._tables.append(a.get("id"))
        elif tag == "tbody":
            self._in_tbody = True
        elif tag == "tr":
            self._row = a.get("data-split")
            if self._in_tbody:
                self.body_rows[self._tables[-1]] += 1
        elif tag == "td" and "data-field" in a:
            self.cells[(self._tables[-1] if self._tables else None, self._row, a["data-field"])] = int(a["data-value"])

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID and tag not in SVG_LEAVES:
            self._stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in SVG_LEAVES:
            return
        if not self._stack or self._stack[-1] != tag:
            self.unbalanced.append(f"</{tag}> closes <{self._stack[-1] if self._stack else None}>")
        else:
            self._stack.pop()
        if tag == "table":
            self._tables.pop()
        elif tag == "tbody":
            self._in_tbody = False
        elif tag == "h2":
            self._h2 = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._h2 is not None:
            self.h2[self._h2] += data

    @property
    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())


def parse(text: str) -> ReportParser:
    parser = ReportParser()
    parser.feed(text)
    parser.close()
    return parser


def decode_data_uri(src: str) -> np.ndarray:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    image = cv2.imdecode(np.frombuffer(base64.b64decode(src[len(prefix):]), np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None
    return image


@pytest.fixture(scope="module", params=["webdataset", "parquet"])
def built(request: pytest.FixtureRequest, demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    folder = tmp_path_factory.mktemp(f"report-{request.param}")
    doc = demo_job_doc(demo_raw.root, folder / "out")
    doc["pack"]["format"] = request.param
    return build(load_job(write_job(folder / "job", doc)), BuildOptions(scheduler="sync", quiet=True))


@pytest.fixture(scope="module")
def page(built: BuildResult) -> tuple[str, ReportParser]:
    text = render_html_report(built.version_dir)
    return text, parse(text)


def index_keys(result: BuildResult) -> dict[str, dict[str, Any]]:
    rows = pq.read_table(result.version_dir / "_index.parquet").to_pylist()
    return {r["key"]: r for r in rows}


def test_all_six_sections_have_their_stable_ids_and_the_page_is_well_formed(page: tuple[str, ReportParser]) -> None:
    text, parsed = page
    assert list(parsed.h2) == ["summary", "splits", "contact-sheets", "intensities", "bad-samples", "leakage-audit"]
    assert {k: v.strip() for k, v in parsed.h2.items()} == SECTION_IDS
    assert parsed.unbalanced == []
    assert text.startswith("<!DOCTYPE html>")


def test_summary_counts_equal_the_manifest(built: BuildResult, page: tuple[str, ReportParser]) -> None:
    _, parsed = page
    manifest = built.manifest
    for split, entry in manifest["splits"].items():
        cell = {f: parsed.cells[("summary-counts", split, f)] for f in ("samples", "entities", "shards", "bytes")}
        assert cell == {"samples": entry["samples"], "entities": entry["entities"], "shards": len(entry["shards"]),
                        "bytes": sum(s["bytes"] for s in entry["shards"])}
    assert parsed.cells[("summary-counts", "total", "samples")] == manifest["inputs"]["samples"]
    assert parsed.cells[("summary-counts", "total", "shards")] == sum(
        len(e["shards"]) for e in manifest["splits"].values())
    for field in ("name", "version", "dataset_hash", "created_at"):
        assert str(manifest[field]) in parsed.all_text
    for name, version in manifest["libraries"].items():
        assert f"{name} {version}" in parsed.all_text


def test_every_image_is_a_png_data_uri_that_decodes_and_every_sample_is_shown(
        built: BuildResult, page: tuple[str, ReportParser]) -> None:
    _, parsed = page
    shapes = [decode_data_uri(src).shape for src in parsed.images]
    assert shapes and all(min(s[:2]) > 0 and max(s[:2]) <= 128 for s in shapes)
    # each (split, label) shows min(its samples, 8×4) cells, each a packed sample, none twice
    keys = index_keys(built)
    cells = [v for tag, k, v in parsed.attributes if tag == "figure" and k == "data-key"]
    assert len(set(cells)) == len(cells) and set(cells) <= set(keys)
    groups = Counter((r["split"], r["label"]) for r in keys.values())
    assert Counter((keys[k]["split"], keys[k]["label"]) for k in cells) == {g: min(n, 32) for g, n in groups.items()}
    # a 3-window CT sample shows its three channels and a composite; the radiograph (one window:
    # its own, by modality_windows, replicated to 3 by transform.channels) and the RGB photos one image each
    from packer.loader import ShardDataset

    replicated = {item["key"]: bool((item["image"] == item["image"][:1]).all())
                  for split in ("train", "valid", "test")
                  for item in ShardDataset(built.manifest_path, split, shuffle=False, rank=0, world_size=1)}
    ct = [k for k in cells if k.startswith("ct-")]
    assert sum(replicated[k] for k in ct) == 1  # the CR is on the contact sheet
    assert len(parsed.images) == sum(1 if replicated[k] else 4 for k in ct) + (len(cells) - len(ct))


def test_nothing_points_outside_the_file(page: tuple[str, ReportParser]) -> None:
    text, parsed = page
    for tag, name, value in parsed.attributes:
        if name == "xmlns":
            continue
        lowered = value.strip().lower()
        if name in ("src", "href", "action", "srcset", "poster", "data"):
            assert not lowered.startswith(("http:", "https:", "//", "ftp:", "file:")), (tag, name, value[:80])
            assert lowered.startswith(("data:image/png;base64,", "#")), (tag, name, value[:80])
    assert parsed.tags["script"] == 0 and parsed.tags["link"] == 0 and parsed.tags["iframe"] == 0
    assert "url(" not in text and "@import" not in text


def test_bad_sample_table_has_one_row_per_record_and_is_marked_sensitive(
        built: BuildResult, page: tuple[str, ReportParser]) -> None:
    _, parsed = page
    lines = (built.version_dir / "bad_samples.jsonl").read_text().splitlines()
    assert parsed.body_rows["bad-samples-table"] == len(lines) == built.manifest["bad_samples"]["total"] > 0
    assert built.manifest["phi"]["mode"] == "pseudonymize"  # the demo job: rows name sample ids, never paths
    for record in map(json.loads, lines):
        assert record["sample_id"] in parsed.all_text
        assert Path(record["path"]).name not in parsed.all_text


def test_bad_sample_paths_are_shown_and_marked_sensitive_when_phi_is_kept(built: BuildResult, tmp_path: Path) -> None:
    manifest = {**built.manifest, "phi": {**built.manifest["phi"], "mode": "keep"}}
    parsed = parse(render_html_report(built.version_dir, manifest=manifest))
    assert "Sensitive: local only, contains raw paths." in parsed.all_text
    for record in map(json.loads, (built.version_dir / "bad_samples.jsonl").read_text().splitlines()):
        assert Path(record["path"]).name in parsed.all_text  # shown relative to the common folder of all paths


def test_bad_sample_table_is_capped_with_a_count_of_the_rest(built: BuildResult, tmp_path: Path) -> None:
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    record = json.loads((folder / "bad_samples.jsonl").read_text().splitlines()[0])
    (folder / "bad_samples.jsonl").write_text("".join(json.dumps({**record, "sample_id": f"x{i}"}) + "\n"
                                                      for i in range(530)))
    parsed = parse(render_html_report(folder, limits=ReportLimits(bad_rows=500)))
    assert parsed.body_rows["bad-samples-table"] == 500
    assert "30 more records not shown" in parsed.all_text


def test_clean_audit_says_no_findings(page: tuple[str, ReportParser]) -> None:
    _, parsed = page
    assert "No findings." in parsed.all_text
    assert parsed.body_rows.get("entity-overlap", 0) == 0


def _plant_overlap(manifest: dict[str, Any], entity: str) -> dict[str, Any]:
    planted = copy.deepcopy(manifest)
    rules = planted["audit"].get("rules")
    if rules is not None:
        rules["entity_overlap"] = {**rules.get("entity_overlap", {}), "severity": "fail", "count": 1,
                                   "passed": False, "findings": [{"entity_id": entity, "splits": ["train", "test"]}]}
        planted["audit"]["passed"] = False
    else:
        planted["audit"]["split"]["entity_overlap"] = {entity: ["train", "test"]}
        planted["audit"]["split"]["passed"] = False
    return planted


def test_a_planted_entity_overlap_is_shown(built: BuildResult) -> None:
    planted = _plant_overlap(built.manifest, "PLANTED<&>ENTITY")
    text = render_html_report(built.version_dir, manifest=planted)
    parsed = parse(text)
    assert "No findings." not in parsed.all_text
    assert parsed.body_rows["entity-overlap"] == 1
    assert "PLANTED<&>ENTITY" in parsed.all_text and "PLANTED&lt;&amp;&gt;ENTITY" in text  # escaped in the source


def test_the_earlier_audit_shape_still_renders(built: BuildResult) -> None:
    """audit.split.{entity_overlap, time_ranges} and audit.duplicates = [{a, b, distance}] (keys)."""
    keys = index_keys(built)
    train = next(k for k, r in keys.items() if r["split"] == "train")
    test = next(k for k, r in keys.items() if r["split"] == "test")
    legacy = copy.deepcopy(built.manifest)
    legacy["audit"] = {"split": {"entities_per_split": {"train": 1}, "entity_overlap": {"OLD-ENT": ["train", "valid"]},
                                 "time_ranges": {"train": ["2023-01-01T00:00:00", "2023-06-01T00:00:00"]},
                                 "passed": False},
                       "duplicates": [{"a": train, "b": test, "distance": 3}]}
    parsed = parse(render_html_report(built.version_dir, manifest=legacy))
    assert parsed.body_rows["entity-overlap"] == 1 and "OLD-ENT" in parsed.all_text
    assert parsed.body_rows["duplicate-groups"] == 1 and "cross-split" in parsed.all_text
    assert "Hamming distance 3" in parsed.all_text  # an older build's near pair, as it was judged
    assert "2023-01-01T00:00:00 → 2023-06-01T00:00:00" in parsed.all_text


def test_duplicate_pairs_show_both_thumbnails_and_no_raw_paths(built: BuildResult) -> None:
    keys = index_keys(built)
    a = next(k for k, r in keys.items() if r["split"] == "train")
    b = next(k for k, r in keys.items() if r["split"] == "test")
    planted = copy.deepcopy(built.manifest)
    rules = planted["audit"]["rules"]
    rules["near_duplicates_across_splits"] = {
        **rules["near_duplicates_across_splits"], "count": 1, "passed": False,
        "findings": [{"a": {"key": a, "split": "train", "entity_id": keys[a]["entity_id"], "path": "Doe^Jane/1.dcm"},
                      "b": {"key": b, "split": "test", "entity_id": keys[b]["entity_id"], "path": "Doe^Jane/2.dcm"},
                      "score": 0.9912, "structure": 0.88, "detail": 0.8, "intensity": 0.9912, "zoom": 1.03,
                      "shift": [0, 2], "similarity": 0.97}]}
    text = render_html_report(built.version_dir, manifest=planted)
    parsed = parse(text)
    before = len(parse(render_html_report(built.version_dir)).images)
    assert len(parsed.images) == before + 2
    assert all(decode_data_uri(src).size for src in parsed.images[-2:])
    assert "score 0.991, structure 0.88, zoom 1.03, shift 0,2 px" in parsed.all_text
    assert "cross-split" in parsed.all_text
    assert "Doe^Jane" not in text  # leakage.json's raw paths stay out of the report


def test_copies_two_rules_found_are_one_duplicate_group_naming_both_rules(built: BuildResult) -> None:
    """An exact pair within a split that spans two entities is a finding of two rules: the report
    counted and drew it as two duplicate groups."""
    keys = index_keys(built)
    a, b = [k for k, r in keys.items() if r["split"] == "train"][:2]
    planted = copy.deepcopy(built.manifest)
    rules = planted["audit"]["rules"]
    pair = [{"key": k, "split": "train", "entity_id": keys[k]["entity_id"], "source": "ct"} for k in (a, b)]
    for rule in ("exact_duplicates_within_split", "duplicates_span_entities"):
        rules[rule] = {**rules[rule], "count": 1, "findings": [{"samples": pair, "size": 2}]}
    text = render_html_report(built.version_dir, manifest=planted)
    parsed = parse(text)
    assert parsed.body_rows["duplicate-groups"] == 1
    assert "Duplicates <span class=\"muted\">(1 group)</span>" in text
    assert "duplicates span entities, exact duplicates within split" in text  # one card naming both rules


def test_time_split_cutoffs_are_drawn_on_the_timeline(built: BuildResult) -> None:
    planted = copy.deepcopy(built.manifest)
    planted["config"]["split"] = {**planted["config"]["split"], "by": "time",
                                  "cutoffs": {"valid": "2024-01-01", "test": "2024-07-01"}}
    planted["audit"]["time_ranges"] = {"train": ["2023-02-01T08:00:00", "2023-12-30T17:00:00"],
                                       "valid": ["2024-01-03T09:00:00", "2024-06-20T10:00:00"],
                                       "test": ["2024-07-02T11:00:00", "2024-11-28T11:41:14"]}
    parsed = parse(render_html_report(built.version_dir, manifest=planted))
    assert "valid ≥ 2024-01-01" in parsed.all_text and "test ≥ 2024-07-01" in parsed.all_text
    assert "2024-07-02T11:00:00 → 2024-11-28T11:41:14" in parsed.all_text
    assert parsed.tags["svg"] == parse(render_html_report(built.version_dir)).tags["svg"] + (
        0 if built.manifest["audit"]["time_ranges"] else 1)


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="time.tzset is POSIX-only")
def test_the_timeline_is_the_same_whatever_the_building_process_time_zone(
        built: BuildResult, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeline read its naive UTC times in the process's local zone (timestamp()): under
    TZ=America/St_Johns the marks moved and, across a DST change, a tick read 2024-12-29."""
    planted = copy.deepcopy(built.manifest)
    planted["config"]["split"] = {**planted["config"]["split"], "by": "time",
                                  "cutoffs": {"valid": "2024-07-01", "test": "2024-12-01"}}
    planted["audit"]["time_ranges"] = {"train": ["2024-07-01T00:00:00", "2024-08-15T00:00:00"],
                                       "valid": ["2024-10-01T00:00:00", "2024-10-01T00:00:00"],
                                       "test": ["2024-12-15T00:00:00", "2025-06-30T00:00:00"]}

    def timeline_in(zone: str) -> str:
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        html = render_html_report(built.version_dir, manifest=planted)
        return re.findall(r"<svg(?:(?!</svg>).)*test ≥(?:(?!</svg>).)*</svg>", html, re.S)[0]

    try:
        in_utc, in_st_johns = timeline_in("UTC"), timeline_in("America/St_Johns")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert in_st_johns == in_utc
    assert re.findall(r'font-size="10">(\d{4}-\d\d-\d\d)<', in_utc) == [
        "2024-07-01", "2024-09-30", "2024-12-30", "2025-03-31", "2025-06-30"]


def test_the_time_order_table_names_the_records_and_the_cutoff_when_dates_are_withheld(built: BuildResult) -> None:
    """Under phi dates: shift a time_order finding carries no record's date: the table's rows were
    blank but for the split names (a walkthrough). They show the cutoff that starts the later
    split's period (the job's own, shown in its config), say the record dates are withheld, and
    give how many of the earlier split's records fall in the period and the first keys."""
    keys = [k for k, r in index_keys(built).items() if r["split"] == "train"][:7]
    planted = copy.deepcopy(built.manifest)
    named = [{"key": k, "entity_id": "e-1"} for k in keys]
    planted["audit"]["rules"]["time_order"] = {
        "severity": "report", "count": 1, "passed": True,
        "findings": [{"split": "valid", "train_samples_after": 7, "train_samples": named, "starts": "2024-01-01",
                      "fix": "these train records fall in valid's period"}]}
    text = render_html_report(built.version_dir, manifest=planted)
    row = text[text.index('id="time-order"'):]
    row = row[:row.index("</table>")]
    assert "2024-01-01" in row and "withheld (phi dates: shift)" in row and ">7<" in row
    assert all(k in row for k in keys[:5]) and keys[5] not in row and " ..." in row


def test_every_string_from_the_manifest_is_escaped(built: BuildResult) -> None:
    hostile = copy.deepcopy(built.manifest)
    hostile["name"] = '<script>alert("x")</script>'
    hostile["config"]["note"] = '<img src="https://example.org/x.png">'
    hostile["label_map"] = {f'{k}"><b>': v for k, v in hostile["label_map"].items()}
    text = render_html_report(built.version_dir, manifest=hostile)
    parsed = parse(text)
    assert parsed.tags["script"] == 0 and parsed.tags["b"] == 0
    assert all(src.startswith("data:image/png;base64,") for src in parsed.images)
    assert '<script>alert("x")</script>' in parsed.all_text


def _sheet_keys(text: str) -> list[str]:
    return [v for tag, k, v in parse(text).attributes if tag == "figure" and k == "data-key"]


def test_rendering_is_deterministic_and_the_sample_is_seeded_by_the_dataset_hash(built: BuildResult) -> None:
    text = render_html_report(built.version_dir)
    assert text == render_html_report(built.version_dir)
    other = copy.deepcopy(built.manifest)
    other["dataset_hash"] = "0" * 64
    counts = Counter((r["split"], r["label"]) for r in index_keys(built).values())
    assert max(counts.values()) > 32, "the demo needs a label with more than one sheet of samples"
    assert sorted(_sheet_keys(text)) != sorted(_sheet_keys(render_html_report(built.version_dir, manifest=other)))


def test_without_the_index_the_shards_are_scanned(built: BuildResult, tmp_path: Path) -> None:
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    (folder / "_index.parquet").unlink()
    parsed = parse(render_html_report(folder))
    assert len(parsed.images) == len(parse(render_html_report(built.version_dir)).images)
    assert "the shards were scanned instead" in parsed.all_text


def test_an_index_without_a_column_is_scanned_around(built: BuildResult, tmp_path: Path) -> None:
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    table = pq.read_table(folder / "_index.parquet")
    pq.write_table(table.drop_columns(["entity_id"]), folder / "_index.parquet")
    parsed = parse(render_html_report(folder))
    assert "no column entity_id" in parsed.all_text and "the shards were scanned instead" in parsed.all_text
    assert len(parsed.images) == len(parse(render_html_report(built.version_dir)).images)


def test_the_report_does_not_load_pyarrow_dataset(built: BuildResult) -> None:
    # its import alone costs 37 MiB, at the end of a build's client (packer.allocator)
    code = ("import sys; from packer.htmlreport import render_html_report; "
            f"render_html_report({str(built.version_dir)!r}); print('pyarrow.dataset' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_stale_index_offsets_fall_back_to_scanning_the_shard(built: BuildResult, tmp_path: Path) -> None:
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    table = pq.read_table(folder / "_index.parquet")
    stale = table.set_column(table.schema.get_field_index("position"), "position",
                             pa.array([7] * table.num_rows, pa.int64()))
    pq.write_table(stale, folder / "_index.parquet")
    parsed = parse(render_html_report(folder))
    assert len(parsed.images) == len(parse(render_html_report(built.version_dir)).images)
    assert "could not be read" not in parsed.all_text


def test_a_manifest_from_another_schema_is_reported_under_a_warning(built: BuildResult, tmp_path: Path) -> None:
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["inputs"]["samples"] += 1  # edited: the hash no longer matches
    (folder / "manifest.json").write_text(json.dumps(manifest))
    parsed = parse(render_html_report(folder / "manifest.json"))
    assert "dataset_hash does not match" in parsed.all_text
    assert parsed.cells[("summary-counts", "train", "samples")] == manifest["splits"]["train"]["samples"]
    # the command says so on stderr too: a CI run publishing the report saw exit 0 and nothing else
    said = CliRunner().invoke(report, [str(folder), "-o", str(tmp_path / "r.html")])
    assert said.exit_code == 0 and "dataset_hash does not match the manifest's content" in said.stderr, said.output


def test_cli_writes_the_report_and_maps_errors_to_exit_codes(built: BuildResult, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(report, [str(built.manifest_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output and out.read_text().startswith("<!DOCTYPE html>")
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    default = write_html_report(folder)
    assert default == folder / "report.html" and default.is_file()
    (folder / "manifest.json").write_text("{not json")
    assert CliRunner().invoke(report, [str(folder)]).exit_code == 5
    assert CliRunner().invoke(report, [str(tmp_path / "missing")]).exit_code == 2


@pytest.mark.parametrize("target", ["/proc/packer-report.html", "/proc/packer-no-such-folder/r.html"])
def test_a_report_where_the_file_system_takes_no_new_file_is_exit_6_naming_it(built: BuildResult,
                                                                             target: str) -> None:
    """-o under /proc raised FileNotFoundError on the temporary file (a traceback, exit 1); README
    exit 6 covers a file or folder that cannot be created there."""
    result = CliRunner().invoke(report, [str(built.version_dir), "-o", target])
    assert result.exit_code == 6, result.output
    assert f"cannot write {target}: " in result.stderr and "cannot be created there" in result.stderr
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_refused_report_file_names_the_report_option_not_a_build(built: BuildResult) -> None:
    """The fix read "choose another output folder (packer build --out DIR)": packer report has no
    --out, and building again is no way to place a report."""
    result = CliRunner().invoke(report, [str(built.version_dir), "-o", "/proc/packer-report.html"])
    assert result.exit_code == 6, result.output
    assert "write the report elsewhere (packer report MANIFEST -o FILE)" in result.stderr
    assert "--out" not in result.stderr


def test_the_report_of_a_version_with_a_cut_or_missing_shard_warns_on_the_terminal(built: BuildResult,
                                                                                    tmp_path: Path) -> None:
    """The HTML said some samples could not be read, but `packer report` exited 0 printing only
    where the file is: a CI log showed nothing wrong. A shard missing or of another size than
    the manifest records is now a warning on stderr naming it (a stat, no hashing)."""
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    clean = CliRunner().invoke(report, [str(folder), "-o", str(tmp_path / "a.html")])
    assert clean.exit_code == 0 and "warning" not in clean.output
    shards = [p for p in sorted(folder.glob("*.tar")) + sorted(folder.glob("*.parquet")) if not p.name.startswith("_")]
    shards[0].write_bytes(shards[0].read_bytes()[:1000])
    shards[1].unlink()
    damaged = CliRunner().invoke(report, [str(folder), "-o", str(tmp_path / "b.html")])
    assert damaged.exit_code == 0, damaged.output
    said = damaged.stderr
    assert f"2 shard(s) missing or not the size the manifest records ({shards[0].name} (1,000 bytes, not" in said
    assert f"{shards[1].name} (missing)" in said and "run `packer verify` on the version" in said
    # a shard grown at its end still serves every sample: the warning said the report left its
    # samples out while the report showed them all (a walkthrough); it says what the report did
    if not list(built.version_dir.glob("*.tar")):
        return  # a Parquet file grown at its end loses its footer: unreadable, as the first part checks
    folder2 = tmp_path / "v2"
    shutil.copytree(built.version_dir, folder2)
    grown = next(p for p in sorted(folder2.glob("*.tar")) if not p.name.startswith("_"))
    with grown.open("ab") as fh:
        fh.write(b"\0" * 10240)
    warned = CliRunner().invoke(report, [str(folder2), "-o", str(tmp_path / "c.html")])
    assert warned.exit_code == 0 and "leaves their samples out" not in warned.stderr
    assert "the samples it could read whose checks pass" in warned.stderr


def test_a_report_without_its_index_warns_on_the_terminal_that_nothing_was_checked(built: BuildResult,
                                                                                   tmp_path: Path) -> None:
    """The checksums are in _index.parquet: without it the report scans the shards and checks no
    sample, which only a line inside the HTML said while the command exited 0 with empty stderr."""
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    (folder / "_index.parquet").unlink()
    result = CliRunner().invoke(report, [str(folder), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert f"packer: warning: {folder}: _index.parquet unreadable" in result.stderr
    assert "no sample the report shows could be checked against its checksum" in result.stderr
    assert "run `packer verify` on the version" in result.stderr


def test_thumbnails_are_capped_and_channels_composed_as_documented() -> None:
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, size=(300, 520), dtype=np.uint8)
    assert decode_data_uri(png_data_uri(big).uri).shape == (74, 128)  # 300/520*128 = 73.8
    two = rng.integers(0, 256, size=(2, 16, 16), dtype=np.uint8)
    panes = sample_panes(two, {"metadata": {"windows": [{"name": "lung"}, {"name": "bone"}]}}, "dicom")
    assert [p.name for p in panes] == ["lung", "bone", "composite"]
    bgr = decode_data_uri(panes[2].uri)
    expected_blue = (two[0].astype(int) + two[1]) // 2
    assert np.array_equal(bgr[..., 2], two[0]) and np.array_equal(bgr[..., 1], two[1])
    assert np.array_equal(bgr[..., 0], expected_blue)
    assert np.array_equal(decode_data_uri(panes[0].uri), two[0])
    rgb = rng.integers(0, 256, size=(3, 8, 8), dtype=np.uint8)
    (photo,) = sample_panes(rgb, {}, "image")
    assert np.array_equal(decode_data_uri(photo.uri)[..., ::-1], np.dstack(list(rgb)))
    assert np.array_equal(composite(rgb), np.dstack(list(rgb)))
    wide = sample_panes(np.zeros((2, 8, 8), np.uint16), {}, "dicom")
    assert [p.name for p in wide] == ["ch0", "ch1", "composite"]


def test_saturation_flag_counts_pixels_at_0_or_255() -> None:
    hist = ChannelHistograms.empty(["a", "b"])
    image = np.full((2, 10, 10), 100, np.uint8)
    image[0, :6] = 0           # 60 % at 0 -> saturated
    image[1, :3] = 0
    image[1, 3:5] = 255        # 30 % + 20 % = 50 % -> not more than half
    hist.add(image)
    assert [name for name, _, _ in hist.saturated()] == ["a"]
    assert hist.saturation()[1] == ("b", 0.3, 0.2)
    assert hist.counts[0, 0] == 60 and hist.counts[0, 100] == 40 and hist.counts.sum() == 200


def test_the_common_folder_of_urls_keeps_their_scheme() -> None:
    from packer.htmlreport.sections import common_folder

    assert common_folder(["s3://b/raw/ct/p1/1.dcm", "s3://b/raw/ct/p2/2.dcm", ""]) == "s3://b/raw/ct"
    assert common_folder(["s3://b/raw/1.dcm"]) == "s3://b/raw"
    assert common_folder(["s3://a/x.dcm", "s3://b/y.dcm"]) == ""          # different buckets share no folder
    assert common_folder(["s3://b/raw/1.dcm", "/data/raw/2.dcm"]) == ""   # a URL and a path share none
    assert common_folder(["/data/raw/a/1.dcm", "/data/raw/b/2.dcm"]) == "/data/raw"
    assert common_folder([]) == ""


def test_the_report_holds_index_entries_only_for_the_samples_it_names(built: BuildResult) -> None:
    from packer.htmlreport.collect import collect_report_data

    keys = index_keys(built)
    limits = ReportLimits(histogram_samples=3, sheet_columns=2, sheet_rows=1, labels_per_split=1)
    data = collect_report_data(built.version_dir, built.manifest, limits)
    assert data.index_size == len(keys) == built.manifest["inputs"]["samples"]
    named = {item.key for items in data.sheets.values() for item in items}
    assert named and named <= set(data.entries)
    assert len(data.entries) <= len(built.manifest["splits"]) * (limits.histogram_samples + limits.per_sheet)
    for key, entry in data.entries.items():
        assert {f: getattr(entry, f) for f in ("split", "shard", "position", "label", "entity_id", "source")} == {
            f: keys[key][f] for f in ("split", "shard", "position", "label", "entity_id", "source")}


def test_the_scanned_index_has_the_rows_of_the_index_file(built: BuildResult, tmp_path: Path) -> None:
    from packer.htmlreport.shards import load_index

    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    (folder / "_index.parquet").unlink()
    scanned, note = load_index(folder, built.manifest)
    read, _ = load_index(built.version_dir, built.manifest)
    assert note and len(scanned) == len(read) == built.manifest["inputs"]["samples"]
    # the shards hold no checksum to check themselves against: a scanned row has none (xxh3 None)
    recorded = {key: dataclasses.replace(entry, xxh3=None) for key, entry in read.entries(index_keys(built)).items()}
    assert scanned.entries(index_keys(built)) == recorded
    assert all(entry.xxh3 == index_keys(built)[key]["xxh3"] for key, entry in read.entries(index_keys(built)).items())


def test_a_neighbour_stack_is_shown_by_slice_offset_with_its_centre_slices_composite() -> None:
    """9 channels = slices -1, 0, +1 × (lung, mediastinum, bone): the panes name each slice by its
    offset, and the composite (and a duplicate's thumbnail) is the centre slice's windows."""
    windows = [{"name": "lung"}, {"name": "mediastinum"}, {"name": "bone_body"}]
    info = {"metadata": {"windows": windows, "neighbors": {"k": 1, "channels_per_slice": 3, "edge": "replicate"}}}
    values = [10, 20, 30, 100, 150, 200, 240, 245, 250]  # slice -1, the centre, slice +1
    stack = np.stack([np.full((8, 8), v, np.uint8) for v in values])
    assert channel_names(info, "dicom", 9)[3:6] == ["+0 lung", "+0 mediastinum", "+0 bone_body"]
    panes = sample_panes(stack, info, "dicom")
    assert [p.name for p in panes] == ["-1 lung", "+0 lung", "+1 lung", "+0 composite"]
    for pane in (panes[-1], composite_pane(stack, info=info)):
        rgb = cv2.cvtColor(decode_data_uri(pane.uri), cv2.COLOR_BGR2RGB)
        assert tuple(int(v) for v in rgb[0, 0]) == (100, 150, 200)
    # a record that does not add up (3 slices of 2 windows is not 9 channels) is shown as channels
    odd = {"metadata": {"windows": windows[:2], "neighbors": {"k": 1, "channels_per_slice": 2}}}
    assert channel_names(odd, "dicom", 9) == [f"ch{i}" for i in range(9)]


def test_writing_the_same_report_again_leaves_the_file_alone(built: BuildResult, tmp_path: Path) -> None:
    """A rebuild of a built version says "nothing rewritten": the report too (same inode)."""
    target = tmp_path / "r.html"
    write_html_report(built.version_dir, target)
    before = target.stat()
    write_html_report(built.version_dir, target)
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    target.write_text("stale")
    write_html_report(built.version_dir, target)
    assert target.read_bytes() != b"stale" and target.stat().st_ino != before.st_ino


def test_a_volumes_coronal_and_sagittal_planes_show_superior_up() -> None:
    """A packed volume's D runs inferior → superior (README: D, H and W run superior, posterior and
    left), so d = D - 1 is the top of the body: the coronal and sagittal panes, whose rows are D,
    put it in their first row, as a viewer (and ``transform.nifti.axis: coronal``) shows them; the
    axial pane and the columns (H posterior to the right of the sagittal, W the patient's left to
    the right of the coronal) are as stored."""
    from packer.htmlreport.thumbs import as_chw

    d, h, w = 4, 8, 6
    volume = np.zeros((1, d, h, w), np.uint8)
    volume[0] = (np.arange(d) * 60)[:, None, None] + np.arange(w)[None, None, :]  # value: 60·d + w
    volume[0] += (np.arange(h) * 7)[None, :, None].astype(np.uint8)               # + 7·h
    planes = as_chw(volume)[0]
    axial, coronal, sagittal = planes[:, :w], planes[:, w:2 * w], planes[:, 2 * w:]
    assert np.array_equal(axial, volume[0, d // 2])
    top, bottom = coronal[0], coronal[-1]
    assert int(top[0]) == 60 * (d - 1) + 7 * (h // 2) and int(bottom[0]) == 7 * (h // 2)  # superior up
    assert list(coronal[0]) == [60 * (d - 1) + 7 * (h // 2) + x for x in range(w)]        # right → left
    assert int(sagittal[0, 0]) == 60 * (d - 1) + (w // 2) and int(sagittal[-1, 0]) == w // 2
    assert int(sagittal[0, -1]) - int(sagittal[0, 0]) > 0  # anterior on the left, posterior on the right
    mask = np.zeros((1, d, h, w), np.uint8)
    mask[0, -1] = 1  # the most superior slice
    shown = as_chw(mask)[0]
    assert shown[0, w:].all() and not shown[-1, w:].any()  # a mask's planes flip with its image's


def _intensity_blocks(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, legend names, each card's channel names from its saturation list) per block of
    the intensities section."""
    import re

    section = text[text.index('id="intensities"'):text.index('id="bad-samples"')]
    blocks = []
    for heading, body in re.findall(r"<h3>(.*?)</h3>(.*?)(?=<h3>|$)", section, flags=re.S):
        legend = re.findall(r'<span class="key"><i [^>]*></i>(.*?)</span>', body)
        cards = [[re.sub(r"^⚠ saturated: ", "", li).rsplit(": ", 1)[0] for li in re.findall(r"<li[^>]*>(.*?)</li>", ul)]
                 for ul in re.findall(r'<ul class="sat">(.*?)</ul>', body)]
        blocks.append((re.sub(r"<[^>]+>", "", heading), legend, cards))
    return blocks


def test_each_intensity_histogram_counts_only_samples_whose_channels_it_names(
        built: BuildResult, page: tuple[str, ReportParser]) -> None:
    """The demo's ct source holds CT slices (lung, mediastinum, bone_body) and one CR radiograph
    (its file window replicated to 3 channels, alone in its split): a histogram per source and
    channel count put the CR's copies under the CT's legend, and in a split holding both it would
    count the CR's pixels as "lung". Each block's cards name the block's channels, and every
    sample counted under a name has that name for that channel."""
    text, _ = page
    blocks = _intensity_blocks(text)
    for heading, legend, cards in blocks:
        for names in cards:
            assert names == legend, (heading, legend, names)
    ct = [legend for heading, legend, _ in blocks if heading.startswith("ct ")]
    assert ["lung", "mediastinum", "bone_body"] in ct and len(ct) == 2
    assert any(all(name.startswith("file") for name in legend) for legend in ct), ct


def test_every_audit_rule_says_what_it_checks_for(page: tuple[str, ReportParser]) -> None:
    """The rules table's "checks for" column was empty for split_balance."""
    import re

    text, _ = page
    rules = re.findall(r'<tr data-rule="([^"]+)"><td class="mono">[^<]*</td><td class="muted">([^<]*)</td>', text)
    assert {name for name, _ in rules} >= {"split_balance", "entity_overlap", "time_order"}
    assert [name for name, checks in rules if not checks.strip()] == []


def test_a_volumes_intensity_histogram_counts_every_voxel_not_its_three_middle_planes() -> None:
    """The histograms say "packed values per channel": of a C×D×H×W volume, every voxel. They
    counted the three middle planes the thumbnails show (resized to H×W), so the demo's NIfTI
    volumes read 51% of abdomen voxels at 0 where 72% are."""
    from packer.htmlreport.collect import _render
    from packer.htmlreport.shards import IndexEntry, PackedSample
    from packer.htmlreport.stats import channel_counts

    d, h, w = 6, 4, 5
    volume = np.full((1, d, h, w), 255, np.uint8)
    volume[0, d // 2] = 0                # the axial middle plane
    volume[0, :, h // 2] = 0             # the coronal one
    volume[0, :, :, w // 2] = 0          # the sagittal one
    expected = np.bincount(volume[0].ravel(), minlength=256)
    assert np.array_equal(channel_counts(volume)[0], expected)
    assert int(channel_counts(volume)[0].sum()) == d * h * w
    entry = IndexEntry(key="v-0", split="train", shard="train-000000.tar", position=0, label=None,
                       entity_id="e", source="v")
    rendered = _render(PackedSample(entry=entry, image=volume, info={"kind": "dicom"}), {"v": "dicom"}, 128,
                       counted=True, sheet=True, duplicate=False)
    assert rendered.counts is not None and np.array_equal(rendered.counts[0], expected)
    assert rendered.panes is not None and len(rendered.panes) == 1  # the thumbnail still shows the planes


def test_the_rules_table_lists_every_rule_of_leakage_json_with_its_count(
        built: BuildResult, page: tuple[str, ReportParser]) -> None:
    """leakage.json holds all 9 audit rules; the manifest holds label_conflicts and
    entity_lookalikes only where they found something, and the report's rules table showed the
    manifest's 7 with no word of the other two (packer inspect names them)."""
    import re

    text, _ = page
    leakage = json.loads((built.version_dir / "leakage.json").read_text())["rules"]
    rows = dict(re.findall(r'<tr data-rule="([^"]+)">.*?data-field="rule\.[^"]+" data-value="(\d+)"', text))
    assert {name: int(count) for name, count in rows.items()} == {name: r["count"] for name, r in leakage.items()}


def test_a_pseudonymized_report_names_no_job_path_in_its_config_block(built: BuildResult) -> None:
    """The footer says "no raw paths": a job's source root, labels and table (which can name a
    patient's folder) are redacted in the config block; the manifest keeps them, and a
    phi.mode keep report shows them."""
    planted = copy.deepcopy(built.manifest)
    assert planted["phi"]["mode"] == "pseudonymize"
    ct, photos = planted["config"]["sources"]
    ct.update(root="/work/Smith_John/raw/ct", labels="/work/Smith_John/ct_labels.csv")
    photos.update(root="/work/Smith_John/raw/photos",
                  table={"file": "/work/Smith_John/photos.csv", "path_base": "/work/Smith_John",
                         "join": [{"file": "/work/Smith_John/more.csv", "on": ["entity"]}]})
    planted["config"]["split"]["lists"] = {"test": "/work/Smith_John/test.txt",
                                           "valid": {"file": "/work/Smith_John/valid.csv", "column": "path"}}
    planted["config"]["split"]["pinned"] = "/work/Smith_John/frozen_test.csv"
    text = render_html_report(built.version_dir, manifest=planted)
    assert "Smith_John" not in text
    assert "&lt;root of source &#x27;ct&#x27;&gt;" in text or "&lt;root of source 'ct'&gt;" in text
    assert "job paths redacted: the manifest has them" in text
    assert "no raw paths" in text  # the footer's claim, now true of the config block too
    kept = parse(render_html_report(built.version_dir, manifest={**planted, "phi": {**planted["phi"], "mode": "keep"}}))
    assert "/work/Smith_John/raw/ct" in kept.all_text and "job paths redacted" not in kept.all_text
    assert "/work/Smith_John/frozen_test.csv" in kept.all_text
    # the build's own report: its job's absolute roots are in the manifest (its identity), not the report
    root = built.manifest["config"]["sources"][0]["root"]
    assert Path(root).is_absolute() and root in (built.version_dir / "manifest.json").read_text()
    assert root not in (built.version_dir / "report.html").read_text(encoding="utf-8")


def _flip_pixel_byte(folder: Path, key: str, shard: str) -> int:
    """Flip one byte in the middle of sample ``key``'s pixels in ``folder/shard`` (located with
    stock readers: tarfile's member offset, or the Parquet image cell's bytes in the file), as a
    disk or a copy might; the file keeps its size. Returns the file offset flipped."""
    path = folder / shard
    data = bytearray(path.read_bytes())
    if shard.endswith(".tar"):
        import tarfile

        with tarfile.open(path) as tar:
            member = tar.getmember(f"{key}.npy")
        offset = member.offset_data + member.size - member.size // 4  # inside the pixels, past the npy header
    else:
        cell = next(r["image"] for r in pq.read_table(path, columns=["key", "image"]).to_pylist() if r["key"] == key)
        start = bytes(data).find(cell)
        assert start > 0 and bytes(data).rfind(cell) == start, f"{shard}: the image cell of {key} is not unique"
        offset = start + len(cell) // 2
    data[offset] ^= 0x10
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    return offset


def test_a_sample_whose_bytes_fail_their_checksum_is_named_at_the_top_and_on_the_sample(
        built: BuildResult, tmp_path: Path) -> None:
    """A version with one flipped pixel byte in one sample was reported without a word: its
    (damaged) thumbnail shown as if packed so. Every sample the report decodes is now checked
    against its xxh3 in _index.parquet; a sample that fails is the report's first finding (key,
    shard, both checksums, `packer verify`), its cell is flagged, and `packer report` warns."""
    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    clean = render_html_report(folder)
    assert "fail their checksum" not in clean and "data-damaged" not in clean
    rows = index_keys(built)
    key = _sheet_keys(clean)[3]  # a sample the contact sheets show
    _flip_pixel_byte(folder, key, rows[key]["shard"])
    for check in ("index positions", "stale positions: the shard is scanned"):
        if check.startswith("stale"):
            table = pq.read_table(folder / "_index.parquet")
            pq.write_table(table.set_column(table.schema.get_field_index("position"), "position",
                                            pa.array([7] * table.num_rows, pa.int64())), folder / "_index.parquet")
        text = render_html_report(folder, quiet=True)
        parsed = parse(text)
        alerts = text.split('<p class="alert" role="alert">')
        assert len(alerts) > 1, check
        first = alerts[1].split("</p>")[0]  # the first finding of the summary, above everything else
        assert first.startswith("1 of the ") and "fail their checksum" in first, (check, first)
        assert f"{rows[key]['shard']} [{key}]: xxh3 " in first and "`packer verify`" in first, (check, first)
        assert f"_index.parquet records {rows[key]['xxh3']:016x}" in first, (check, first)
        flagged = [v for tag, k, v in parsed.attributes if tag == "figure" and k == "data-damaged"]
        cells = [(k, v) for tag, k, v in parsed.attributes if tag == "figure" and k == "class" and "damaged" in v]
        assert flagged == ["checksum"] and len(cells) == 1, check
        marked = text.split('data-damaged="checksum"')[0].rsplit("<figure", 1)[1]
        assert f'data-key="{key}"' in marked, check
        assert "checksum failed: not what was packed" in parsed.all_text, check
    result = CliRunner().invoke(report, [str(folder), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "warning: 1 of the " in result.stderr and key in result.stderr and "`packer verify`" in result.stderr


def test_one_samples_damaged_npy_header_loses_that_sample_alone_and_is_a_finding(
        built: BuildResult, tmp_path: Path) -> None:
    """One byte of the first sample's .npy header (its shape) changed: every later sample of its
    tar shard was dropped with that sample's error, the histogram intro still said 'counted: N of
    N', and `packer report` said nothing on stderr."""
    if built.manifest["format"] != "webdataset":
        pytest.skip("a tar member's .npy header")
    import tarfile

    folder = tmp_path / "v"
    shutil.copytree(built.version_dir, folder)
    shard = next(s["file"] for s in built.manifest["splits"]["train"]["shards"])
    path = folder / shard
    with tarfile.open(path) as tar:
        first = next(m for m in tar.getmembers() if m.name.endswith(".npy") and not m.name.endswith("mask.npy"))
    data = bytearray(path.read_bytes())
    header = bytes(data[first.offset_data:first.offset_data + 128])
    at = first.offset_data + header.index(b"'shape': (") + len(b"'shape': (")
    data[at] = ord("9") if data[at] != ord("9") else ord("8")  # (3, 64, 64) -> (9, 64, 64): the same size
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    in_shard = sum(1 for r in index_keys(built).values() if r["shard"] == shard)
    text = render_html_report(folder, quiet=True)
    alerts = text.split('<p class="alert" role="alert">')
    assert any(a.split("</p>")[0].startswith("1 of the ") and "could not be read" in a for a in alerts[1:]), alerts[:2]
    assert in_shard > 1
    assert "1 selected sample could not be read" in text  # that sample alone, not the rest of its shard
    total = built.manifest["splits"]["train"]["samples"]
    counted = re.search(r"counted: train ([0-9,]+) of ([0-9,]+)", text)
    assert counted is not None and int(counted[2].replace(",", "")) == total
    assert int(counted[1].replace(",", "")) == min(total, ReportLimits().histogram_samples) - 1  # what was drawn
    result = CliRunner().invoke(report, [str(folder), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "could not be read" in result.stderr and first.name.removesuffix(".npy") in result.stderr
