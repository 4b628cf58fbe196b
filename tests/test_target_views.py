"""packer report, inspect and diff on real builds of every target kind: multi-label, numeric, unlabeled.

The expected numbers are counted here from ``_index.parquet`` and the raw table, never taken
from the views under test.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from packer.commands.inspect import diff_command, inspect_command
from packer.commands.report import report
from packer.htmlreport import ReportLimits, render_html_report
from packer.htmlreport.collect import NO_LABEL, collect_report_data
from packer.htmlreport.shards import SampleIndex
from tests.helpers import copy_without_index
from tests.test_htmlreport import ReportParser, parse
from tests.test_targets import _build, _ct, _job, _photo_table

CLI = click.Group(commands=[inspect_command, diff_command, report])
FINDINGS = ["a|b", "b", "", "a", "a|b", "b", "", "b", "a", "a|b", "", "b"]
AGES = [20.0, 21.5, 30.0, 41.25, 55.0, 63.0, 18.0, 70.0, 33.0, 47.5, 52.0, 29.0]
SPLIT = {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "balance": {"accept": True}}


def invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(CLI, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def index_rows(version: Path) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in pq.read_table(version / "_index.parquet").to_pylist()}


def manifest_of(version: Path) -> dict[str, Any]:
    return json.loads((version / "manifest.json").read_text())


@dataclass(frozen=True)
class Builds:
    multilabel: Path        # webdataset, FINDINGS
    multilabel_edit: Path   # row 1's findings "b" -> "a"
    numeric: Path           # parquet, AGES
    numeric_edit: Path      # row 1's age 21.5 -> 35
    unlabeled: Path         # CT slices, label: none


def _table_build(tmp: Path, column: str, values: list[str], label: dict[str, Any], fmt: str) -> Path:
    raw = _photo_table(tmp, [{"path": f"{i}.png", column: value, "entity": f"E{i}", "timestamp": "2024-01-01"}
                             for i, value in enumerate(values)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"), "label": label}
    return _build(_job(tmp, [source], fmt, split=SPLIT)).version_dir


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    tmp = tmp_path_factory.mktemp("views")
    multilabel = {"kind": "multilabel", "column": "findings"}
    numeric = {"kind": "numeric", "columns": ["age"]}
    edited = [*FINDINGS]
    edited[1] = "a"
    ages = [repr(a) for a in AGES]
    raw = tmp / "none" / "raw"
    for i in range(8):
        _ct(raw, f"p{i}/slice.dcm", f"P{i}", i)
    unlabeled = _build(_job(tmp / "none", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                            split=SPLIT)).version_dir
    return Builds(multilabel=_table_build(tmp / "ml", "findings", FINDINGS, multilabel, "webdataset"),
                  multilabel_edit=_table_build(tmp / "ml", "findings", edited, multilabel, "webdataset"),
                  numeric=_table_build(tmp / "num", "age", ages, numeric, "parquet"),
                  numeric_edit=_table_build(tmp / "num", "age", [ages[0], "35", *ages[2:]], numeric, "parquet"),
                  unlabeled=unlabeled)


def written_report(version: Path, tmp: Path) -> tuple[str, ReportParser]:
    out = tmp / f"{version.name}.html"
    invoke("report", version, "-o", out)
    text = out.read_text()
    parsed = parse(text)
    assert parsed.unbalanced == [] and list(parsed.h2) == ["summary", "splits", "contact-sheets", "intensities",
                                                           "bad-samples", "leakage-audit"]
    return text, parsed


def sheet_keys(parsed: ReportParser) -> Counter[str]:
    return Counter(v for tag, k, v in parsed.attributes if tag == "figure" and k == "data-key")


def captions(text: str) -> dict[str, str]:
    """Per key, the hover caption of its first thumbnail."""
    found = re.findall(r'<figure class="cell" data-key="([^"]+)"><div class="panes"><img [^>]*title="([^"]*)&#10;',
                       text)
    return {key: caption.replace("&#10;", "\n") for key, caption in reversed(found)}


# -- report ---------------------------------------------------------------------------------
def test_a_multilabel_report_shows_each_labels_share_per_split_and_sheets_per_label(
        builds: Builds, tmp_path: Path) -> None:
    text, parsed = written_report(builds.multilabel, tmp_path)
    rows = index_rows(builds.multilabel)
    names = manifest_of(builds.multilabel)["target"]["names"]
    assert names == ["a", "b"]
    samples = Counter(r["split"] for r in rows.values())
    holding = Counter((r["split"], name) for r in rows.values()
                      for name, v in zip(names, r["target"], strict=True) if v)
    labelled = sum(1 for r in rows.values() if any(r["target"]))
    assert sum(holding.values()) > labelled  # samples with two labels: the counts exceed the samples
    for split in samples:
        for name in names:
            count = holding[(split, name)]
            assert f"{name} · {split}: {count} of {samples[split]} samples ({count / samples[split]:.1%})" in text
    assert "label balance per split" not in text  # no 100 % stacked bars
    unrecorded = manifest_of(builds.multilabel)
    for entry in unrecorded["splits"].values():
        entry["class_counts"] = {}
    counted = render_html_report(builds.multilabel, manifest=unrecorded)  # the shares counted from the index
    shares = re.findall(r"<title>[^<]*samples \(", text)
    assert len(shares) == len(names) * len(samples) and re.findall(r"<title>[^<]*samples \(", counted) == shares
    assert "multilabel: a, b" in parsed.all_text
    # every sample sits on the sheet of each label it holds, those with none under NO_LABEL
    expected = Counter({key: max(1, sum(r["target"])) for key, r in rows.items()})
    assert sheet_keys(parsed) == expected
    assert set(captions(text)) == set(rows)
    for key, caption in captions(text).items():
        held = [n for n, v in zip(names, rows[key]["target"], strict=True) if v]
        assert f"\nlabels: {', '.join(held) or '(none)'}\n" in caption
    assert NO_LABEL in parsed.all_text


def test_multilabel_sheets_keep_their_caps_per_split_and_label(builds: Builds) -> None:
    manifest = manifest_of(builds.multilabel)
    limits = ReportLimits(sheet_columns=1, sheet_rows=1, labels_per_split=2)
    data = collect_report_data(builds.multilabel, manifest, limits)
    rows = index_rows(builds.multilabel)
    groups = Counter((r["split"], n) for r in rows.values()
                     for n in ([n for n, v in zip(["a", "b"], r["target"], strict=True) if v] or [NO_LABEL]))
    shown = {split: {name for name, _ in Counter({n: c for (s, n), c in groups.items() if s == split})
                     .most_common(2)} for split in {s for s, _ in groups}}
    assert {cell for cell, items in data.sheets.items() if items} == {(s, n) for s, names in shown.items()
                                                                     for n in names}
    assert all(len(items) == 1 for items in data.sheets.values())
    for (split, name), (item,) in data.sheets.items():
        held = [n for n, v in zip(["a", "b"], rows[item.key]["target"], strict=True) if v] or [NO_LABEL]
        assert rows[item.key]["split"] == split and name in held


def test_a_numeric_report_shows_a_histogram_and_min_mean_max_per_split(builds: Builds, tmp_path: Path) -> None:
    text, parsed = written_report(builds.numeric, tmp_path)
    rows = index_rows(builds.numeric)
    by_split: dict[str, list[float]] = {}
    for r in rows.values():
        by_split.setdefault(r["split"], []).append(r["target"][0])
    assert sorted(v for values in by_split.values() for v in values) == sorted(AGES)
    for split, values in by_split.items():
        assert f'aria-label="age in {split}"' in text
        row = re.search(rf'<tr data-target="age" data-split="{split}">(.*?)</tr>', text)
        assert row is not None
        cells = [float(c) for c in re.findall(r'<td class="num">([^<]+)</td>', row.group(1))]
        assert cells == pytest.approx([min(values), float(np.mean(values)), max(values)], rel=1e-5)
    assert "numeric: age" in parsed.all_text and "label balance" not in text.lower()
    data = collect_report_data(builds.numeric, manifest_of(builds.numeric), ReportLimits())
    (hist,) = data.value_histograms
    assert hist.edges[0] == min(AGES) and hist.edges[-1] == max(AGES)
    for split, values in by_split.items():
        assert hist.counts[split].sum() == len(values)
        assert hist.counts[split].tolist() == np.histogram(values, np.linspace(min(AGES), max(AGES), 25))[0].tolist()
    assert sheet_keys(parsed) == Counter(rows.keys())  # one grid per split: every sample once
    assert set(captions(text)) == set(rows)
    for key, caption in captions(text).items():
        assert f"\ntarget: age={rows[key]['target'][0]:g}\n" in caption


def test_an_unlabeled_report_says_so_and_shows_no_balance(builds: Builds, tmp_path: Path) -> None:
    text, parsed = written_report(builds.unlabeled, tmp_path)
    assert "unlabeled (no targets)" in parsed.all_text
    assert '<dd data-field="target">unlabeled (no targets)' in text
    assert "label balance per split" not in text and "share of samples holding" not in text
    rows = index_rows(builds.unlabeled)
    assert sheet_keys(parsed) == Counter(rows.keys())
    assert set(captions(text)) == set(rows)
    assert all("label" not in caption and "target" not in caption for caption in captions(text).values())
    # no masks: no legend, no masks table, no overlay (the markers tests/test_report_masks.py checks;
    # the audit's rule descriptions may say "masks", as label_conflicts' does)
    for marker in ("mask-legend", 'id="masks"', "mask-classes", 'data-field="mask"', "+ mask", "segmentation mask"):
        assert marker not in text, marker


@pytest.mark.parametrize("kind", ["multilabel", "numeric"])
def test_without_the_index_the_shards_give_the_same_targets(builds: Builds, kind: str, tmp_path: Path) -> None:
    version = getattr(builds, kind)
    scanned = render_html_report(copy_without_index(version, tmp_path / "v"))
    assert "the shards were scanned instead" in scanned
    original = render_html_report(version)
    assert sheet_keys(parse(scanned)) == sheet_keys(parse(original))
    assert captions(scanned) == captions(original)
    if kind == "numeric":
        table = re.compile(r'<table id="target-stats".*?</table>', re.S)
        assert table.findall(scanned) == table.findall(original)


def test_index_positives_are_the_nonzero_cells_of_the_vectors() -> None:
    vectors = [[0, 1, 1], [0, 0, 0], None, [1], [1, 0, 1, 1]]
    table = pa.table({"key": [f"k{i}" for i in range(5)], "target": pa.array(vectors, pa.list_(pa.uint8()))})
    for start in (0, 1, 3):  # a slice's list offsets do not start at 0
        rows, positions = SampleIndex(table.slice(start)).positives()
        expected = [(r, p) for r, v in enumerate(vectors[start:]) for p, x in enumerate(v or []) if x]
        assert list(zip(rows.tolist(), positions.tolist(), strict=True)) == expected
    matrix = SampleIndex(table).vectors(3)
    assert matrix[0].tolist() == [0, 1, 1] and np.isnan(matrix[2]).all() and np.isnan(matrix[3]).all()


# -- inspect --------------------------------------------------------------------------------
def test_inspect_shows_each_target_kind(builds: Builds) -> None:
    text = invoke("inspect", builds.multilabel).output
    manifest = manifest_of(builds.multilabel)
    assert "target        multilabel: a, b" in text
    for entry in manifest["splits"].values():
        for name, count in entry["class_counts"].items():
            assert f"{name} {count} ({100 * count / entry['samples']:.1f}%)" in text  # share of the split's samples
    summary = json.loads(invoke("inspect", builds.multilabel, "--json").output)
    assert summary["target"] == {"kind": "multilabel", "names": ["a", "b"]}

    text = invoke("inspect", builds.numeric).output
    assert "target        numeric: age" in text
    rows = index_rows(builds.numeric)
    train = [r["target"][0] for r in rows.values() if r["split"] == "train"]
    assert f"age min {min(train):.6g} mean {np.mean(train):.6g} max {max(train):.6g}" in text
    summary = json.loads(invoke("inspect", builds.numeric, "--json").output)
    assert summary["target"] == {"kind": "numeric", "names": ["age"]}
    assert summary["totals"]["target_stats"]["age"]["min"] == min(AGES)
    assert summary["totals"]["target_stats"]["age"]["max"] == max(AGES)
    assert summary["totals"]["target_stats"]["age"]["mean"] == pytest.approx(np.mean(AGES), rel=1e-5)

    text = invoke("inspect", builds.unlabeled).output
    assert "target        none: unlabeled" in text
    assert json.loads(invoke("inspect", builds.unlabeled, "--json").output)["target"] == {"kind": "none",
                                                                                          "names": []}
    for version in (builds.multilabel, builds.numeric, builds.unlabeled):  # none has masks
        assert json.loads(invoke("inspect", version, "--json").output)["mask"] is None
        assert "  masks " not in invoke("inspect", version).output


# -- diff -----------------------------------------------------------------------------------
def _changed_keys(old: Path, new: Path) -> list[str]:
    a, b = index_rows(old), index_rows(new)
    return sorted(k for k in a if k in b and a[k]["target"] != b[k]["target"])


def test_diff_lists_a_sample_whose_labels_changed_as_relabeled(builds: Builds) -> None:
    (key,) = _changed_keys(builds.multilabel, builds.multilabel_edit)
    payload = json.loads(invoke("diff", builds.multilabel, builds.multilabel_edit, "--json").output)
    samples = payload["samples"]
    assert [c["key"] for c in samples["relabeled"]] == [key]
    (change,) = samples["relabeled"]
    assert (change["old_label"], change["new_label"]) == ("b", "a")
    assert change["old_target"] == {"a": 0, "b": 1} and change["new_target"] == {"a": 1, "b": 0}
    assert samples["by_label"] == {"a": {"relabeled_in": 1}, "b": {"relabeled_out": 1}}
    assert samples["added"] == samples["removed"] == samples["moved"] == samples["changed"] == []
    split = index_rows(builds.multilabel_edit)[key]["split"]
    assert samples["by_split"] == {split: {"relabeled": 1}}  # which split's labels changed
    text = invoke("diff", builds.multilabel, builds.multilabel_edit).output
    assert f"relabeled {key}  ({split}, b -> a)" in text and "1 relabeled" in text
    assert f"by split {split:<10} relabeled 1" in text
    assert "no differences" in invoke("diff", builds.multilabel, builds.multilabel).output


def test_diff_lists_a_sample_whose_number_changed_as_relabeled(builds: Builds) -> None:
    (key,) = _changed_keys(builds.numeric, builds.numeric_edit)
    payload = json.loads(invoke("diff", builds.numeric, builds.numeric_edit, "--json").output)
    (change,) = payload["samples"]["relabeled"]
    assert change["key"] == key
    assert change["old_target"] == {"age": 21.5} and change["new_target"] == {"age": 35.0}
    assert (change["old_label"], change["new_label"]) == ("age=21.5", "age=35")
    assert payload["samples"]["by_label"] == {"age": {"relabeled": 1}}
    split = index_rows(builds.numeric_edit)[key]["split"]
    text = invoke("diff", builds.numeric, builds.numeric_edit).output
    assert f"relabeled {key}  ({split}, age=21.5 -> age=35)" in text


def test_a_diff_across_target_kinds_says_so_instead_of_comparing_labels(builds: Builds) -> None:
    text = invoke("diff", builds.multilabel, builds.numeric).output
    assert "note: target kinds differ (old multilabel (a, b), new numeric (age))" in text
    payload = json.loads(invoke("diff", builds.multilabel, builds.numeric, "--json").output)
    assert payload["samples"]["relabeled"] == [] and payload["samples"]["by_label"] == {}
    assert payload["old"]["target"]["kind"] == "multilabel" and payload["new"]["target"]["kind"] == "numeric"
    assert any(c["path"].startswith("sources[0].label") for c in payload["config"])
    unlabeled = json.loads(invoke("diff", builds.unlabeled, builds.unlabeled, "--json").output)
    assert unlabeled["empty"] is True
