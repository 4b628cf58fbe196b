"""packer diff across versions whose vocabulary, target order, files or refused inputs changed:
a label new to a multi-label vocabulary, numeric target columns in another order, a file moved
to another class folder, new rows refused as bad samples.

Expected numbers are counted here from the inputs, never taken from the diff under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from packer.inspection import diff_datasets, format_diff
from packer.targets import Target
from tests.test_targets import _build, _job, _photo, _photo_table


def _findings_build(tmp: Path, findings: list[str]) -> Path:
    raw = _photo_table(tmp, [{"path": f"{i}.png", "findings": f, "entity": f"E{i}", "timestamp": "2024-01-01"}
                             for i, f in enumerate(findings)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "multilabel", "column": "findings"}}
    return _build(_job(tmp, [source])).version_dir


def _keys_by_path(version: Path) -> dict[str, str]:
    """The sample key of each raw file name, from ``_splits.parquet``'s entity ids (``E<i>``)."""
    table = pq.read_table(version / "_splits.parquet", columns=["key", "entity_id"]).to_pylist()
    return {row["entity_id"]: row["key"] for row in table}


def test_a_label_new_to_the_vocabulary_relabels_only_the_samples_that_hold_it(tmp_path: Path) -> None:
    """Adding 'atelectasis' to three samples put it in the vocabulary; diff listed every sample as
    relabeled ('nodule -> nodule') and counted ignored_out for the new label on every one."""
    findings = ["effusion", "nodule|effusion", "", "nodule", "mass", "effusion", "nodule", "mass"]
    before = _findings_build(tmp_path / "v1", findings)
    gained = (0, 2, 5)
    edited = [(f + "|atelectasis").strip("|") if i in gained else f for i, f in enumerate(findings)]
    after = _findings_build(tmp_path / "v2", edited)
    keys = _keys_by_path(after)

    diff = diff_datasets(before, after)
    assert sorted(c.key for c in diff.relabeled) == sorted(keys[f"E{i}"] for i in gained)
    assert diff.by_label() == {"atelectasis": {"relabeled_in": 3}}
    # and back: the label leaves the vocabulary, counted out of the samples that held it only
    back = diff_datasets(after, before)
    assert sorted(c.key for c in back.relabeled) == sorted(keys[f"E{i}"] for i in gained)
    assert back.by_label() == {"atelectasis": {"relabeled_out": 3}}
    assert "ignored" not in json.dumps(diff.to_json()) + json.dumps(back.to_json())
    assert "3 relabeled" in format_diff(diff)


def _numbers_build(tmp: Path, columns: list[str]) -> Path:
    raw = _photo_table(tmp, [{"path": f"{i}.png", "age": str(40 + i), "dose": str(i / 2), "entity": f"E{i}",
                              "timestamp": "2024-01-01"} for i in range(6)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "numeric", "columns": columns}}
    return _build(_job(tmp, [source])).version_dir


def test_numeric_target_columns_in_another_order_are_a_note_of_moved_positions(tmp_path: Path) -> None:
    """[age, dose] -> [dose, age] swaps every sample's packed target vector (batch['target'][:, 0]
    was age, is dose); diff said nothing: no value changed, so none was relabeled."""
    before = _numbers_build(tmp_path / "v1", ["age", "dose"])
    after = _numbers_build(tmp_path / "v2", ["dose", "age"])
    first = pq.read_table(before / "_index.parquet", columns=["key", "target"]).to_pylist()
    second = {row["key"]: row["target"] for row in pq.read_table(after / "_index.parquet").to_pylist()}
    assert all(second[row["key"]] == row["target"][::-1] for row in first)  # the vectors did swap

    diff = diff_datasets(before, after)
    assert diff.relabeled == ()
    (note,) = [n for n in diff.notes if n.startswith("target positions changed")]
    assert note.startswith("target positions changed: 0 age -> dose, 1 dose -> age; ")
    assert "a model trained on the old version reads them as other values" in note
    assert f"  note: {note}" in format_diff(diff)
    assert not diff.empty
    assert not [n for n in diff_datasets(after, after).notes if n.startswith("target positions")]
    # a column added at the end moves nothing already there; a multi-label name sorted first does
    assert Target("numeric", ("age", "dose")).moved_positions(Target("numeric", ("age", "dose", "bmi"))) == ()
    assert Target("multilabel", ("b", "c")).moved_positions(Target("multilabel", ("a", "b", "c"))) == (
        "0 b -> a", "1 c -> b")
    assert Target("class", ("b", "c")).moved_positions(Target("class", ("a", "b", "c"))) == ()  # the label map's note


def test_new_rows_refused_as_bad_samples_are_a_difference_not_no_differences(tmp_path: Path) -> None:
    """Six rows of a class the job's labels: do not list arrive and are refused as unknown_label
    bad samples: every sample and shard is as it was, the dataset_hash differs, and diff said
    'no differences' (--json "empty": true)."""
    rows = [{"path": f"{i}.png", "label": ["cat", "dog"][i % 2], "entity": f"E{i}", "timestamp": "2024-01-01"}
            for i in range(8)]
    raw = _photo_table(tmp_path, rows)
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv")}
    job = _job(tmp_path, [source], labels=["cat", "dog"], validate={"max_bad_fraction": 0.5})
    before = _build(job).version_dir
    raw = _photo_table(tmp_path, rows + [{"path": f"{i}.png", "label": "bird", "entity": f"E{i}",
                                          "timestamp": "2024-01-01"} for i in range(8, 14)])
    after = _build(job).version_dir
    assert json.loads((before / "manifest.json").read_text())["dataset_hash"] != \
        json.loads((after / "manifest.json").read_text())["dataset_hash"]

    diff = diff_datasets(before, after)
    assert diff.added == diff.removed == diff.relabeled == ()
    assert [(c.path, c.old, c.new) for c in diff.inputs] == [
        ("bad_samples.by_reason.unknown_label", 0, 6), ("bad_samples.total", 0, 6), ("inputs.files", 8, 14)]
    assert not diff.empty and diff.to_json()["empty"] is False
    assert diff.to_json()["dataset_hash"]["differs"] is True
    text = format_diff(diff)
    assert "  no differences" not in text.splitlines() and "    bad_samples.by_reason.unknown_label: 0 -> 6" in text
    assert "    inputs.files: 8 -> 14" in text
    same = diff_datasets(before, before)
    assert same.empty and same.inputs == () and same.to_json()["dataset_hash"] == {"differs": False, "fields": []}


def test_a_file_moved_to_another_class_folder_is_paired_by_content_and_its_new_split_flagged(
        tmp_path: Path) -> None:
    """Under label: folder a file's entity is its path, class folder included: moving a test image
    to the right class folder (the usual ImageFolder label fix) makes a new entity whose split is
    drawn afresh. diff listed the same bytes as one sample added and one removed; it now pairs
    them, says which changed split, and split.pinned on the new entity keeps the old split."""
    raw = tmp_path / "raw"
    for i in range(24):
        _photo(raw / ("cat", "dog")[i % 2] / f"img{i:02d}.png", i)
    split = {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3,
             "balance": {"accept": True}}
    source = {"kind": "image", "root": str(raw), "label": "folder"}
    before = _build(_job(tmp_path / "v1", [source], split=split)).version_dir
    old = pq.read_table(before / "_splits.parquet", columns=["key", "entity_id", "split"]).to_pylist()
    fixed = [row for row in old if row["split"] != "train"]  # the labeller fixes every valid and test image
    assert fixed
    for row in fixed:
        folder, name = row["entity_id"].split("/")
        (raw / row["entity_id"]).rename(raw / {"cat": "dog", "dog": "cat"}[folder] / name)
    after = _build(_job(tmp_path / "v2", [source], split=split)).version_dir
    new = {row["entity_id"]: row for row in
           pq.read_table(after / "_splits.parquet", columns=["key", "entity_id", "split"]).to_pylist()}
    expected = {}
    for row in fixed:
        folder, name = row["entity_id"].split("/")
        entity = f"{ {'cat': 'dog', 'dog': 'cat'}[folder] }/{name}"
        expected[row["key"]] = (new[entity]["key"], entity, row["split"], new[entity]["split"])
    assert any(old_split != new_split for *_, old_split, new_split in expected.values())  # the defect's premise

    diff = diff_datasets(before, after)
    assert diff.added == diff.removed == ()
    assert {c.old_key: (c.key, c.new_entity, c.old_split, c.new_split) for c in diff.rekeyed} == expected
    assert all(c.old_label != c.new_label for c in diff.rekeyed)
    changed = sorted(c.key for c in diff.rekeyed if c.old_split != c.new_split)
    payload = diff.to_json()["samples"]["rekeyed"]
    assert sorted(c["key"] for c in payload if c["split_changed"]) == changed
    text = format_diff(diff, limit=100)
    assert f"{len(fixed)} rekeyed (same bytes under a new key; {len(changed)} in another split)" in text
    assert text.count("SPLIT CHANGED: leak risk") == len(changed)
    assert f"  leak risk: {len(changed)} sample(s) are the same bytes" in text

    # the README's way to keep them where they were: pin each new entity to its old split
    pins = tmp_path / "pinned.csv"
    pins.write_text("entity,split\n" + "".join(f"{c['new_entity']},{c['old_split']}\n" for c in payload))
    kept = _build(_job(tmp_path / "v3", [source], split={**split, "pinned": str(pins)})).version_dir
    again = diff_datasets(before, kept)
    assert len(again.rekeyed) == len(fixed) and not [c for c in again.rekeyed if c.split_changed]
    assert "leak risk" not in format_diff(again)


def test_a_file_renamed_within_its_class_folder_is_rekeyed_and_counts_as_no_relabel(tmp_path: Path) -> None:
    """A rekeyed sample (the same bytes under a new key) counts in by_label's relabeled columns
    only where its class changed: renaming cat/img01.png to cat/renamed.png relabels nothing."""
    raw = tmp_path / "raw"
    for i in range(8):
        _photo(raw / ("cat", "dog")[i % 2] / f"img{i:02d}.png", i)
    source = {"kind": "image", "root": str(raw), "label": "folder"}
    before = _build(_job(tmp_path / "v1", [source])).version_dir
    (raw / "cat" / "img00.png").rename(raw / "cat" / "renamed.png")
    after = _build(_job(tmp_path / "v2", [source])).version_dir
    diff = diff_datasets(before, after)
    assert len(diff.rekeyed) == 1 and diff.relabeled == ()
    assert diff.rekeyed[0].old_label == diff.rekeyed[0].new_label == "cat"
    assert not any(column.startswith("relabeled") for counts in diff.by_label().values() for column in counts)
