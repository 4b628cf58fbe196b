"""Public label tables as they ship: CheXpert's 1.0/0.0/-1.0/blank columns, NIH ChestX-ray14's
``Finding Labels`` and numeric tables with missing-value tokens.

A CheXpert-like table is built end to end under each uncertainty policy of Irvin et al. (AAAI
2019): U-Ones, U-Zeros, U-Ignore, and a mapping per column. The expected targets and masks are
computed here from the table's cells by the policy's definition, then compared with what stock
``webdataset``, stock ``pyarrow`` and packer's ``ShardDataset`` read from the shards.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import torch
import webdataset as wds

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.errors import ConfigError
from packer.loader import ShardDataset, make_loader
from packer.targets import Target
from packer.verify import verify_dataset
from tests.test_targets import _build, _job, _photo
from tests.test_verify import reseal, rewrite_tar

LABELS = ["No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Atelectasis", "Edema"]
# One row per study, the cells as CheXpert's labeler writes them: 1.0, 0.0, -1.0 (uncertain), blank (not mentioned)
CELLS = [
    ["1.0", "", "", "", ""],
    ["", "", "1.0", "-1.0", ""],
    ["", "0.0", "-1.0", "1.0", "-1.0"],
    ["", "", "0.0", "", "1.0"],
    ["", "-1.0", "1.0", "0.0", "0.0"],
    ["0.0", "0.0", "0.0", "-1.0", "-1.0"],
    ["", "", "-1.0", "", "1.0"],
]


def _read(cell: str, uncertain: str, blank: str) -> tuple[int, int]:
    """(target, mask) of one cell by the policies' definitions: ones and zeros replace an
    uncertain (or blank) cell by 1 or 0; ignore keeps 0 in the target and masks it out."""
    policy = {"1.0": "ones", "0.0": "zeros", "-1.0": uncertain, "": blank}[cell]
    return {"ones": (1, 1), "zeros": (0, 1), "ignore": (0, 0)}[policy]


def _chexpert_table(tmp: Path) -> Path:
    """Photos with a CheXpert-like table (``path``, demographics, view, the five label columns);
    ``Age`` is unique per row, so a sample's record (its ``extra``) names its row."""
    raw = tmp / "raw"
    rows = []
    for i, cells in enumerate(CELLS):
        _photo(raw / f"patient{i:05d}/study1/view1_frontal.png", i)
        rows.append({"path": f"patient{i:05d}/study1/view1_frontal.png", "Sex": ("Female", "Male")[i % 2],
                     "Age": str(40 + i), "Frontal/Lateral": "Frontal", "AP/PA": ("AP", "PA")[i % 2],
                     **dict(zip(LABELS, cells, strict=True)), "entity": f"patient{i:05d}",
                     "timestamp": "2024-01-01"})
    with (raw / "train.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return raw


def _source(raw: Path, **label: Any) -> dict[str, Any]:
    return {"kind": "image", "root": str(raw), "table": str(raw / "train.csv"),
            "label": {"kind": "multilabel", "columns": LABELS, **label}}


def _row_of(record: dict[str, Any] | str | bytes) -> int:
    info = record if isinstance(record, dict) else json.loads(record)
    return int(info["extra"]["Age"]) - 40


# (label settings, the policy per column for uncertain cells, the blank policy)
POLICIES = {
    "u-ones": ({"uncertain": "ones", "blank": "zeros"}, dict.fromkeys(LABELS, "ones"), "zeros"),
    "u-zeros": ({"uncertain": "zeros", "blank": "zeros"}, dict.fromkeys(LABELS, "zeros"), "zeros"),
    "u-ignore": ({"uncertain": "ignore", "blank": "ignore"}, dict.fromkeys(LABELS, "ignore"), "ignore"),
    # CheXpert's best per label: U-Ones for Atelectasis and Edema, U-Zeros for Cardiomegaly
    "per-column": ({"uncertain": {"Atelectasis": "ones", "Edema": "ones", "Cardiomegaly": "zeros",
                                  "default": "ignore"}, "blank": "zeros"},
                   {**dict.fromkeys(LABELS, "ignore"), "Atelectasis": "ones", "Edema": "ones",
                    "Cardiomegaly": "zeros"}, "zeros"),
}


def _expected(uncertain: dict[str, str], blank: str) -> tuple[list[list[int]], list[list[int]]]:
    """Per row of :data:`CELLS`, the target and the mask its policies give."""
    read = [[_read(cell, uncertain[name], blank) for cell, name in zip(cells, LABELS, strict=True)]
            for cells in CELLS]
    return [[t for t, _ in row] for row in read], [[m for _, m in row] for row in read]


@pytest.mark.parametrize(("policy", "fmt"), [("u-ones", "webdataset"), ("u-zeros", "parquet"),
                                             ("u-ignore", "webdataset"), ("u-ignore", "parquet"),
                                             ("per-column", "webdataset"), ("per-column", "parquet")])
def test_a_chexpert_table_packs_each_uncertainty_policy_as_its_definition_says(tmp_path: Path, policy: str,
                                                                               fmt: str) -> None:
    settings, uncertain, blank = POLICIES[policy]
    targets, masks = _expected(uncertain, blank)
    masked = any(0 in row for row in masks)
    result = _build(_job(tmp_path, [_source(_chexpert_table(tmp_path), **settings)], fmt))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["target"] == {"kind": "multilabel", "names": LABELS, **({"target_mask": True} if masked else {})}
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    split = manifest["splits"]["train"]
    positives = np.array(targets).sum(axis=0).tolist()
    assert split["class_counts"] == dict(zip(LABELS, positives, strict=True))
    if masked:
        ignored = (np.array(masks) == 0).sum(axis=0).tolist()
        assert split["ignored_counts"] == dict(zip(LABELS, ignored, strict=True))
        assert split["negative_counts"] == {name: len(CELLS) - p - i
                                            for name, p, i in zip(LABELS, positives, ignored, strict=True)}
    else:
        assert "ignored_counts" not in split and "negative_counts" not in split

    # stock readers
    if fmt == "webdataset":
        urls = sorted(str(p) for p in result.version_dir.glob("train-*.tar"))
        for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode():
            row = _row_of(sample["json"])
            assert sample["target.npy"].dtype == np.uint8 and sample["target.npy"].tolist() == targets[row]
            if masked:
                assert sample["target_mask.npy"].dtype == np.uint8
                assert sample["target_mask.npy"].tolist() == masks[row]
            else:
                assert "target_mask.npy" not in sample
    else:
        files = sorted(str(p) for p in result.version_dir.glob("train-*.parquet"))
        table = pads.dataset(files, format="parquet").to_table()
        assert ("target_mask" in table.column_names) == masked
        for i, record in enumerate(table["metadata"].to_pylist()):
            row = _row_of(record)
            assert table["target"][i].as_py() == targets[row]
            if masked:
                assert table.schema.field("target_mask").type.value_type == pa.uint8()
                assert table["target_mask"][i].as_py() == masks[row]

    # packer's loader: items and batches
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False, records=True))
    assert len(items) == len(CELLS)
    for item in items:
        row = _row_of(item["record"])
        assert item["target"].tolist() == targets[row]
        assert ("target_mask" in item) == masked
        if masked:
            assert item["target_mask"].dtype == torch.float32 and item["target_mask"].tolist() == masks[row]
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=len(CELLS))))
    assert ("target_mask" in batch) == masked
    if masked:
        assert batch["target_mask"].shape == (len(CELLS), len(LABELS))
        assert batch["target_mask"].dtype == torch.float32
    outcome = verify_dataset(result.manifest_path, deep=True)
    assert outcome.ok, [p.message for p in outcome.problems]


def test_an_ignored_label_is_named_in_the_record_and_not_held(tmp_path: Path) -> None:
    result = _build(_job(tmp_path, [_source(_chexpert_table(tmp_path), uncertain="ignore", blank="zeros")]))
    urls = sorted(str(p) for p in result.version_dir.glob("train-*.tar"))
    by_row = {_row_of(s["json"]): s["json"] for s in wds.WebDataset(urls, shardshuffle=False,
                                                                     empty_check=False).decode()}
    # row 2: Atelectasis positive, Cardiomegaly and Edema uncertain, Enlarged Cardiomediastinum 0
    assert by_row[2]["labels"] == ["Atelectasis"]
    assert by_row[2]["ignored_labels"] == ["Cardiomegaly", "Edema"]
    assert "ignored_labels" not in by_row[3]


def test_diff_counts_a_label_moved_from_known_negative_to_ignored_as_a_relabel(tmp_path: Path) -> None:
    """uncertain: zeros -> ignore keeps every target vector (an uncertain cell is 0 either way)
    but masks the uncertain labels out of the loss: the training target changed, so each sample
    with an uncertain cell is relabeled, counted as ignored_in under each label it now ignores."""
    from packer.inspection import diff_datasets

    raw = _chexpert_table(tmp_path)
    zeros = _build(_job(tmp_path, [_source(raw, uncertain="zeros", blank="zeros")]))
    ignore = _build(_job(tmp_path, [_source(raw, uncertain="ignore", blank="zeros")]))
    diff = diff_datasets(zeros.version_dir, ignore.version_dir)
    assert len(diff.relabeled) == sum("-1.0" in cells for cells in CELLS)
    uncertain = {name: sum(cells[i] == "-1.0" for cells in CELLS) for i, name in enumerate(LABELS)}
    assert {name: counts.get("ignored_in", 0) for name, counts in diff.by_label().items() if name in LABELS} == {
        name: n for name, n in uncertain.items() if n}
    assert any(c.new_label.endswith("; ignored: Cardiomegaly, Edema") for c in diff.relabeled if c.new_label)
    assert diff_datasets(ignore.version_dir, ignore.version_dir).relabeled == ()


def test_without_an_uncertain_policy_an_uncertain_cell_stays_a_bad_target(tmp_path: Path) -> None:
    result = _build(_job(tmp_path, [_source(_chexpert_table(tmp_path), blank="zeros")],
                         validate={"max_bad_fraction": 1.0}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    uncertain_rows = [i for i, cells in enumerate(CELLS) if "-1.0" in cells]
    assert len(records) == len(uncertain_rows)
    assert {r["reason"] for r in records} == {"bad_target"}
    assert all("'-1.0' is uncertain" in r["message"] and "uncertain: ones" in r["message"] for r in records)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["splits"]["train"]["samples"] == len(CELLS) - len(uncertain_rows)


def test_a_blank_cell_is_a_bad_target_unless_the_source_says_what_it_means(tmp_path: Path) -> None:
    result = _build(_job(tmp_path, [_source(_chexpert_table(tmp_path), uncertain="zeros")],
                         validate={"max_bad_fraction": 1.0}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    blank_rows = [i for i, cells in enumerate(CELLS) if "" in cells]
    assert len(records) == len(blank_rows) and {r["reason"] for r in records} == {"bad_target"}
    assert all(": empty;" in r["message"] and "blank: zeros" in r["message"] for r in records)


def test_custom_uncertain_values_replace_the_default_ones(tmp_path: Path) -> None:
    rows = [("u", "1"), ("0", "u"), ("1", "0")]
    raw = tmp_path / "raw"
    lines = ["path,a,b,entity,timestamp"]
    for i, (a, b) in enumerate(rows):
        _photo(raw / f"{i}.png", i)
        lines.append(f"{i}.png,{a},{b},E{i},2024-01-01")
    (raw / "t.csv").write_text("\n".join(lines) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "t.csv"),
              "label": {"kind": "multilabel", "columns": ["a", "b"], "uncertain": "ones", "uncertain_values": ["u"]}}
    result = _build(_job(tmp_path, [source]))
    got = sorted(item["target"].tolist() for item in ShardDataset(result.manifest_path, "train", shuffle=False))
    assert got == sorted([[1, 1], [0, 1], [1, 0]])


def _mask_of_two(name: str, data: bytes) -> tuple[str, bytes]:
    if not name.endswith(".target_mask.npy"):
        return name, data
    buffer = io.BytesIO()
    np.save(buffer, np.full(np.load(io.BytesIO(data)).shape, 2, dtype=np.uint8))
    return name, buffer.getvalue()


def _mask_dropped(name: str, data: bytes) -> tuple[str, bytes]:
    return (name.replace(".target_mask.npy", ".target.npy") if name.endswith(".target_mask.npy") else name), data


@pytest.mark.parametrize(("edit", "expected"), [
    (_mask_of_two, "target mask must be uint8 0/1, got uint8 [2]"),
    (_mask_dropped, "lacks its .target_mask.npy member"),
], ids=["values", "missing"])
def test_deep_verify_checks_each_target_mask(tmp_path: Path, edit: Any, expected: str) -> None:
    result = _build(_job(tmp_path, [_source(_chexpert_table(tmp_path), uncertain="ignore", blank="zeros")]))
    shard = next(result.version_dir.glob("train-*.tar"))
    rewrite_tar(shard, edit)
    outcome = verify_dataset(reseal(result.version_dir) / "manifest.json", deep=True)
    assert not outcome.ok
    assert any(expected in p.message for p in outcome.problems), [p.message for p in outcome.problems]


# -- NIH ChestX-ray14: one column of names -----------------------------------------------------
def test_nih_finding_labels_drop_no_finding_through_the_map(tmp_path: Path) -> None:
    findings = ["Cardiomegaly|Effusion", "No Finding", "Effusion", "No Finding", "Infiltration|Effusion|Mass"]
    raw = tmp_path / "raw"
    lines = ["path,Finding Labels,Patient Age,entity,timestamp"]
    for i, labels in enumerate(findings):
        _photo(raw / f"{i:08d}_000.png", i)
        lines.append(f"{i:08d}_000.png,{labels},{30 + i},P{i},2024-01-01")
    (raw / "Data_Entry_2017.csv").write_text("\n".join(lines) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "Data_Entry_2017.csv"),
              "label": {"kind": "multilabel", "column": "Finding Labels", "map": {"No Finding": None}}}
    result = _build(_job(tmp_path, [source], "parquet"))
    manifest = json.loads(result.manifest_path.read_text())
    names = ["Cardiomegaly", "Effusion", "Infiltration", "Mass"]
    assert manifest["target"] == {"kind": "multilabel", "names": names}  # no target_mask: nothing is ignored
    assert manifest["splits"]["train"]["class_counts"] == {"Cardiomegaly": 1, "Effusion": 3, "Infiltration": 1,
                                                           "Mass": 1}
    table = pads.dataset(sorted(str(p) for p in result.version_dir.glob("train-*.parquet")),
                         format="parquet").to_table()
    assert "target_mask" not in table.column_names
    got = {json.loads(m)["extra"]["Patient Age"]: t for m, t in zip(table["metadata"].to_pylist(),
                                                                    table["target"].to_pylist(), strict=True)}
    assert got == {str(30 + i): [int(n in f.split("|")) for n in names] for i, f in enumerate(findings)}


def test_a_map_renames_tokens_of_a_column_and_the_job_labels_check_the_result(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    lines = ["path,findings,entity,timestamp"]
    for i, labels in enumerate(["Effusion|Nodule", "Nodule", "Hernia"]):
        _photo(raw / f"{i}.png", i)
        lines.append(f"{i}.png,{labels},E{i},2024-01-01")
    (raw / "t.csv").write_text("\n".join(lines) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "t.csv"),
              "label": {"kind": "multilabel", "column": "findings", "map": {"Effusion": "effusion",
                                                                            "Nodule": "nodule"}}}
    result = _build(_job(tmp_path, [source], labels=["effusion", "nodule"], validate={"max_bad_fraction": 0.5}))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "unknown_label" and "'Hernia'" in record["message"] and "map:" in record["message"]
    got = sorted(item["target"].tolist() for item in ShardDataset(result.manifest_path, "train", shuffle=False))
    assert got == [[0, 1], [1, 1]]


def _one_column_table(raw: Path, column: str, values: list[str], label: dict[str, Any]) -> dict[str, Any]:
    """An image source of one photo per value, its table giving each one ``column`` cell (and an
    entity and a time of its own), labelled by ``label``."""
    lines = [f"path,{column},entity,timestamp"]
    for i, value in enumerate(values):
        _photo(raw / f"{i}.png", i)
        lines.append(f"{i}.png,{value},E{i},2024-01-01")
    (raw / "t.csv").write_text("\n".join(lines) + "\n")
    return {"kind": "image", "root": str(raw), "table": str(raw / "t.csv"), "label": label}


def test_a_class_column_maps_raw_values_to_class_names(tmp_path: Path) -> None:
    source = _one_column_table(tmp_path / "raw", "finding", ["0", "1", "1", "2"],
                               {"column": "finding", "map": {"0": "normal", "1": "nodule"}})
    result = _build(_job(tmp_path, [source], validate={"max_bad_fraction": 0.5}))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["label_map"] == {"nodule": 0, "normal": 1}
    assert manifest["splits"]["train"]["class_counts"] == {"nodule": 2, "normal": 1}
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "unknown_label" and "'2' is not in the source's label map" in record["message"]


# -- numbers with missing-value tokens ---------------------------------------------------------
def test_a_numeric_missing_token_is_a_missing_label_naming_column_and_token(tmp_path: Path) -> None:
    values = [("63", "1.5"), ("NA", "2"), ("41", "nan"), ("55", ""), ("70", "abc")]
    raw = tmp_path / "raw"
    lines = ["path,age,dose,entity,timestamp"]
    for i, (age, dose) in enumerate(values):
        _photo(raw / f"{i}.png", i)
        lines.append(f"{i}.png,{age},{dose},E{i},2024-01-01")
    (raw / "t.csv").write_text("\n".join(lines) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "t.csv"),
              "label": {"kind": "numeric", "columns": ["age", "dose"], "missing": ["", "NA", "nan"]}}
    result = _build(_job(tmp_path, [source], validate={"max_bad_fraction": 0.9}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    by_path = {Path(r["path"]).name: (r["reason"], r["message"]) for r in records}
    token = "is one of the source's missing-value tokens ('missing:')"
    assert {name: reason for name, (reason, _) in by_path.items()} == {
        "1.png": "missing_label", "2.png": "missing_label", "3.png": "missing_label", "4.png": "bad_target"}
    assert f"column 'age': 'NA' {token}" in by_path["1.png"][1]
    assert f"column 'dose': 'nan' {token}" in by_path["2.png"][1]
    assert f"column 'dose': '' {token}" in by_path["3.png"][1]
    assert "column 'dose': 'abc' is not a finite number" in by_path["4.png"][1]
    assert [item["target"].tolist() for item in ShardDataset(result.manifest_path, "train")] == [[63.0, 1.5]]


def test_numbers_beyond_float32_are_bad_targets_and_numbers_near_its_limit_pack(tmp_path: Path) -> None:
    """Targets are packed as float32: 1e39 is finite in float64 (so it passed) but infinite as
    packed, and the build crashed writing the manifest (``Out of range float values are not JSON
    compliant``), naming no row. 3e38 is a float32, but the split's mean in float32 overflowed
    and crashed the build too. An empty split's stats made ``packer inspect`` crash."""
    source = _one_column_table(tmp_path / "raw", "dose", ["3e38", "3e38", "1e39", "-1e39"],
                               {"kind": "numeric", "columns": ["dose"]})
    job = _job(tmp_path, [source], validate={"max_bad_fraction": 0.9},
               split={"by": "entity", "ratios": {"train": 0.9, "valid": 0.1, "test": 0.0}, "seed": 1})
    result = _build(job)
    by_path = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert {name: r["reason"] for name, r in by_path.items()} == {"2.png": "bad_target", "3.png": "bad_target"}
    assert "column 'dose': '1e39' is beyond float32's range" in by_path["2.png"]["message"]
    manifest = json.loads(result.manifest_path.read_text())
    stats = [entry["target_stats"]["dose"] for entry in manifest["splits"].values() if entry["samples"]]
    assert stats and all(s["max"] == pytest.approx(3e38, rel=1e-6) and s["mean"] == pytest.approx(3e38, rel=1e-6)
                         for s in stats)
    assert any(entry["samples"] == 0 for entry in manifest["splits"].values())  # an empty split: inspect reads it
    from packer.inspection import format_summary, inspect_dataset

    assert "dose min" in format_summary(inspect_dataset(result.manifest_path))


# -- config errors, and what stays as it was -----------------------------------------------------
@pytest.mark.parametrize(("label", "message"), [
    ({"kind": "multilabel", "column": "f", "uncertain": "ones"},
     r"label\.uncertain: only multilabel 0/1 columns \('kind: multilabel' with 'columns:'\)"),
    ({"kind": "numeric", "columns": ["a"], "blank": "zeros"}, r"label\.blank: only multilabel 0/1 columns"),
    ({"column": "f", "uncertain_values": ["-1"]}, r"label\.uncertain_values: only multilabel 0/1 columns"),
    ({"kind": "multilabel", "columns": ["a", "b"], "uncertain": {"c": "ones"}},
     r"label\.uncertain\.c: not one of the target's columns \(a, b\) or 'default'"),
    ({"kind": "multilabel", "columns": ["a"], "uncertain_values": ["-1"]},
     r"uncertain_values: there is no 'uncertain:' policy"),
    ({"kind": "multilabel", "columns": ["a"], "uncertain": "ones", "uncertain_values": ["0"]},
     r"uncertain_values: '0' already means 0, 1 or blank"),
    ({"kind": "multilabel", "columns": ["a"], "map": {"x": "a"}}, r"label\.map: 0/1 columns are named by their column"),
    ({"kind": "multilabel", "columns": ["?a"]}, r"label\.columns: label name '\?a' may not start with '\?'"),
    ({"kind": "multilabel", "column": "f", "map": {"x": "?a"}}, r"label\.map: label name '\?a' may not start"),
    ({"column": "f", "map": {"x": None}}, r"label\.map\.x: null drops a token of a multilabel column"),
    ({"kind": "numeric", "columns": ["a"], "map": {"x": "y"}}, r"label\.map: a value map names classes or labels"),
    ({"column": "f", "missing": ["NA"]}, r"label\.missing: only numeric targets have missing-value tokens"),
])
def test_a_policy_where_it_cannot_apply_is_a_config_error_naming_the_key(tmp_path: Path, label: dict[str, Any],
                                                                         message: str) -> None:
    source = {"kind": "image", "root": str(tmp_path), "table": "t.csv", "label": label}
    with pytest.raises(ConfigError, match=message):
        load_job(_job(tmp_path, [source]))


def test_a_schema_error_names_a_policy_that_does_not_exist(tmp_path: Path) -> None:
    source = {"kind": "image", "root": str(tmp_path), "table": "t.csv",
              "label": {"kind": "multilabel", "columns": ["a"], "uncertain": "maybe"}}
    with pytest.raises(ConfigError, match="uncertain"):
        load_job(_job(tmp_path, [source]))


def test_a_job_label_starting_with_a_question_mark_is_refused(tmp_path: Path) -> None:
    source = {"kind": "image", "root": str(tmp_path), "table": "t.csv",
              "label": {"kind": "multilabel", "column": "f"}}
    with pytest.raises(ConfigError, match=r"labels: label name '\?x' may not start with '\?'"):
        load_job(_job(tmp_path, [source], labels=["a", "?x"]))


def test_only_set_policies_enter_the_config_identity(tmp_path: Path) -> None:
    plain = {"kind": "image", "root": str(tmp_path), "table": "t.csv",
             "label": {"kind": "multilabel", "columns": ["a", "b"]}}
    job = load_job(_job(tmp_path / "plain", [plain]))
    assert job.sources[0].target.to_json() == {"kind": "multilabel", "columns": ["a", "b"]}
    same = {**plain, "label": {**plain["label"], "uncertain": {"default": "ones"}}}
    also = {**plain, "label": {**plain["label"], "uncertain": "ones"}}
    one, two = (load_job(_job(tmp_path / name, [s])) for name, s in (("one", same), ("two", also)))
    assert one.sources[0].target.to_json() == two.sources[0].target.to_json() == {
        "kind": "multilabel", "columns": ["a", "b"], "uncertain": "ones"}
    assert one.identity()["sources"] == two.identity()["sources"] != job.identity()["sources"]
    assert "uncertain" not in json.dumps(job.identity()) and "blank" not in json.dumps(job.identity())


def test_a_target_mask_is_only_for_a_multilabel_target() -> None:
    assert Target("multilabel", ("a",), True).to_json() == {"kind": "multilabel", "names": ["a"], "target_mask": True}
    assert Target.of_json({"kind": "multilabel", "names": ["a"]}).masked is False
    with pytest.raises(ValueError, match="only multilabel targets carry a target mask"):
        Target("numeric", ("a",), True)


def test_rows_joined_by_union_hold_a_label_any_row_holds_and_ignore_only_what_none_holds() -> None:
    united = Target("multilabel", ("a", "b", "c"), True)
    text = type(united).union_text(["a|?b", "?a|?c", None, "b"])
    assert text == "?c|a|b"
    assert united.encode(text)[1].tolist() == [1, 1, 0] and united.encode_mask(text).tolist() == [1, 1, 0]
    assert type(Target("class", ("a",))).union_text(["a", "a"]) is None  # class rows must agree instead


@pytest.mark.parametrize(("cell", "read"), [
    ("1.00", "a"), ("1e0", "a"), ("0.00", ""), ("-0", ""), ("-1.00", "?a"),  # numbers compare as numbers
    ("1.0", "a"), ("yes", "a"), ("-1", "?a"), ("2", None), ("0.5", None), ("nan", None), ("x", None),
    ("0_1", None), ("1_0", None), ("\uff11", None), ("\u0661", None),  # float() reads these as 1, 10, 1, 1
])
def test_a_zero_one_cell_is_read_by_its_number_not_its_spelling(cell: str, read: str | None) -> None:
    # "1.00" (a spreadsheet's two decimals) was a bad_target while "1.0" was a positive
    from packer.targets.base import CellPolicy, Refused

    policy = CellPolicy(uncertain={"a": "ignore"}, uncertain_values=frozenset({"-1", "-1.0"}))
    text = type(Target("multilabel", ("a",))).text_of_cells({"a": cell}, where="t.csv row 2", separator=None,
                                                            value_map={}, known=(), policy=policy)
    if read is None:
        assert isinstance(text, Refused) and text.reason == "bad_target" and "is not 0 or 1" in text.message
    else:
        assert text == read


def test_a_zero_one_column_the_jobs_labels_leave_out_is_unknown_label_not_a_crash() -> None:
    """label: {kind: multilabel, columns: [A, B, C]} with labels: [B, A]: a sample holding C ended
    the build with a traceback (C has no place in the vector); it is unknown_label, as the README
    says of labels the job does not list, and a sample without C packs."""
    from packer.targets.base import Refused

    read = type(Target("multilabel", ("B", "A"))).text_of_cells
    held = read({"A": "1", "B": "0", "C": "1"}, where="t.csv row 2", separator=None, value_map={}, known=("B", "A"))
    assert isinstance(held, Refused) and held.reason == "unknown_label"
    assert "label 'C', which is not in the job's labels (B, A)" in held.message
    assert read({"A": "1", "B": "0", "C": "0"}, where="t.csv row 3", separator=None, value_map={},
                known=("B", "A")) == "A"


@pytest.mark.parametrize(("uncertain", "said"), [
    (None, "the source has no uncertain policy for this column"),
    ({"a": "bad"}, "the source's uncertain policy for this column is bad, which refuses such a cell")])
def test_an_uncertain_cell_refused_says_whether_a_policy_was_set(uncertain: dict[str, str] | None, said: str) -> None:
    from packer.targets.base import CellPolicy, Refused

    policy = CellPolicy(uncertain=uncertain, uncertain_values=frozenset({"-1"}))
    text = type(Target("multilabel", ("a",))).text_of_cells({"a": "-1"}, where="t.csv row 2", separator=None,
                                                            value_map={}, known=(), policy=policy)
    assert isinstance(text, Refused) and text.reason == "bad_target" and said in text.message
