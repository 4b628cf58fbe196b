"""Label conflicts: copies of one image whose targets disagree are found at build time, with no model.

Each raw tree plants exact duplicates (the same file bytes under two names, so the same packed
pixels) whose table rows give different targets, next to copies that agree. The expected
groups are written down here from the planted rows; leakage.json, ``packer validate``, the build
summary, excluded.jsonl and the shards (read by stock webdataset) must say the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
import webdataset as wds
from click.testing import CliRunner

from packer.cli import main
from packer.config import SplitConfig, load_job
from packer.demo import write_demo_key
from packer.errors import ConfigError, LeakageError
from packer.exclusions import read_excluded
from packer.htmlreport import write_html_report
from packer.phi import pseudonymizer_for
from packer.pipeline.audit import finding_text
from packer.pipeline.conflicts import aligned_dice, find_label_conflicts, mask_dice
from packer.pipeline.datacheck import format_summary, summary, validate_job
from packer.pipeline.discover import make_sample_id
from packer.pipeline.nearcopy import thumbnail, verify
from packer.pipeline.sampletable import as_table
from packer.pipeline.split import assign_splits, group_samples
from packer.schemas import load_schema, schema_registry
from packer.targets import target_class
from tests.test_split import links, sample
from tests.test_targets import _build, _job, _manifest, _photo


def _tree(tmp: Path, rows: list[dict[str, str]], copies: dict[str, str]) -> Path:
    """Photos for ``rows`` (each a table row naming its ``path``), then each ``copies`` entry
    (copy path → original path) as the original's bytes under another name; ``table.csv``
    lists every row."""
    raw = tmp / "raw"
    originals = [row for row in rows if row["path"] not in copies]
    for i, row in enumerate(originals):
        _photo(raw / row["path"], i)
    for copy, original in copies.items():
        shutil.copyfile(raw / original, raw / copy)
    columns = list(rows[0])
    (raw / "table.csv").write_text("\n".join([",".join(columns)] + [",".join(r[c] for c in columns) for r in rows])
                                   + "\n")
    return raw


def _row(path: str, entity: str, **target: str) -> dict[str, str]:
    return {"path": path, "entity": entity, "timestamp": "2024-01-01", **target}


def _source(raw: Path, **label: Any) -> dict[str, Any]:
    return {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"), **({"label": label} if label else {})}


def _leakage(version: Path) -> dict[str, Any]:
    return json.loads((version / "leakage.json").read_text())


def _check_schema(rule: dict[str, Any]) -> None:
    """leakage.json's rule against the one schema of the rule (validate.schema.json's)."""
    schema = load_schema("validate")["properties"]["audit"]["properties"]["rules"]["properties"]["label_conflicts"]
    jsonschema.Draft202012Validator(schema, registry=schema_registry()).validate(rule)


def _groups(rule: dict[str, Any]) -> list[list[tuple[str, str | None]]]:
    """Each finding's members as (key, target text), in the finding's order."""
    return [[(s["key"], s["label"]) for s in finding["samples"]] for finding in rule["findings"]]


def _keys(job: Path) -> dict[str, str]:
    """Raw relative path → sample key of every image in the job's one source (its pseudonymized id)."""
    config = load_job(job)
    source = config.sources[0]
    phi = pseudonymizer_for(config.phi)
    paths = [p.relative_to(source.root).as_posix() for p in Path(source.root).rglob("*.png")]
    return {path: make_sample_id(source.name, path, phi) for path in paths}


def _packed(version: Path) -> set[str]:
    """The keys of the packed samples, read by stock webdataset."""
    urls = sorted(str(p) for p in version.glob("*.tar"))
    return {sample["__key__"] for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False)}


# -- the target kinds' own answer ------------------------------------------------------------------------


def test_each_target_kind_says_when_two_copies_disagree() -> None:
    assert target_class("class").conflicts("cat", "dog", tolerance=0.0)
    assert not target_class("class").conflicts("cat", "cat", tolerance=0.0)
    multilabel = target_class("multilabel")
    assert multilabel.conflicts("effusion|nodule", "nodule", tolerance=0.0)  # effusion held by one only
    assert not multilabel.conflicts("effusion|nodule", "effusion|nodule", tolerance=0.0)
    assert not multilabel.conflicts("effusion|nodule", "?effusion|nodule", tolerance=0.0)  # ignored: says nothing
    assert not multilabel.conflicts("", "", tolerance=0.0)
    numeric = target_class("numeric")
    assert numeric.conflicts("50.0|1.0", "50.0|1.5", tolerance=0.25)
    assert not numeric.conflicts("50.0|1.0", "50.0|1.25", tolerance=0.25)
    # a gap of exactly the tolerance never conflicts, whatever binary floating point makes of it
    # (0.8 - 0.7 is 0.10000000000000009 in float64, 0.6 - 0.5 is 0.09999999999999998)
    for low, high in (("0.7", "0.8"), ("0.5", "0.6"), ("0.2", "0.3"), ("1.1", "1.2"), ("0.35", "0.45")):
        assert not numeric.conflicts(low, high, tolerance=0.1), (low, high)
    assert numeric.conflicts("0.7", "0.8001", tolerance=0.1)
    assert not target_class("none").conflicts("", "", tolerance=0.0)


def test_mask_dice_is_the_mean_over_the_classes_either_mask_holds() -> None:
    a = np.array([[1, 1, 0, 0], [2, 2, 0, 255]], dtype=np.uint8)
    b = np.array([[1, 0, 0, 0], [0, 0, 2, 255]], dtype=np.uint8)
    # class 1: 2·1/(2+1); class 2: 0 shared of 2+1; 255 is the pad, 0 background: neither counts
    assert mask_dice(a, b, pad=255) == pytest.approx((2 / 3 + 0.0) / 2)
    assert mask_dice(a, a, pad=255) == 1.0
    assert mask_dice(np.zeros((2, 2)), np.zeros((2, 2))) == 1.0  # no class on either side: they agree
    assert mask_dice(a, b[:, :2]) == 0.0  # shapes differ: nothing agrees


# -- class targets: warn (the default), fail, validate, the build summary ------------------------------------


def _class_tree(tmp: Path, other: str = "dog") -> Path:
    """Six photos of six entities; ``copy_a.png`` is ``0.png`` under another entity with another
    class, ``other`` (a conflict), ``copy_b.png`` is ``1.png`` with the same class (no conflict)."""
    rows = [_row(f"{i}.png", f"E{i}", label=("cat", "dog")[i % 2]) for i in range(6)]
    rows += [_row("copy_a.png", "E90", label=other), _row("copy_b.png", "E91", label="dog")]
    return _tree(tmp, rows, {"copy_a.png": "0.png", "copy_b.png": "1.png"})


def test_copies_with_different_classes_are_listed_with_their_labels_and_packed_under_warn(tmp_path: Path) -> None:
    job = _job(tmp_path, [_source(_class_tree(tmp_path))],
               phi={"mode": "pseudonymize", "key_file": str(write_demo_key(tmp_path, 7))})
    result = _build(job)
    keys = _keys(job)
    assert _packed(result.version_dir) == set(keys.values())  # warn packs everything
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    _check_schema(rule)
    assert rule["count"] == 1 and rule["severity"] == "report" and rule["policy"] == "warn"
    assert _groups(rule) == [sorted([(keys["0.png"], "cat"), (keys["copy_a.png"], "dog")])]
    (finding,) = rule["findings"]
    assert finding["labels"] == ["cat", "dog"] and finding["linked_by"] == "exact" and finding["targets_differ"]
    # pseudonymized: entity pseudonyms, no raw path, no raw id (as leakage.json's other findings)
    assert all("path" not in s and s["entity_id"] not in ("E0", "E90") for s in finding["samples"])
    manifest = _manifest(result)
    assert manifest["audit"]["rules"]["label_conflicts"]["count"] == 1  # recorded where it found a group


def test_a_one_split_job_says_near_copies_were_not_compared_or_compares_them_when_it_acts_on_conflicts(
        tmp_path: Path) -> None:
    """A one-split job skips the near-copy search (enabled: auto), so near copies whose class
    differs went unchecked while label_conflicts said passed, not that only exact copies were
    compared; under label_conflict: fail a near copy with another class passed the audit. Under
    warn the rule now says near copies were not compared; fail and drop_group turn the search on."""
    one = {"by": "entity", "ratios": {"train": 1.0}}
    result = _build(_job(tmp_path, [_source(_class_tree(tmp_path))], split=one))
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    _check_schema(rule)
    assert rule["count"] == 1 and rule["near_copies_compared"] is False  # the exact copy's conflict still found
    assert "only exact copies' targets were compared" in rule["near_copies"]
    for policy, near in (("warn", False), ("fail", True), ("drop_group", True)):
        job = load_job(_job(tmp_path / policy, [_source(tmp_path / "raw")],
                            split={**one, "duplicates": {"label_conflict": policy}}))
        assert job.split.near_enabled is near, policy


def test_a_dataset_without_conflicts_keeps_its_manifest_as_before_the_rule(tmp_path: Path) -> None:
    rows = [_row(f"{i}.png", f"E{i}", label=("cat", "dog")[i % 2]) for i in range(4)]
    rows.append(_row("copy.png", "E9", label="cat"))
    result = _build(_job(tmp_path, [_source(_tree(tmp_path, rows, {"copy.png": "0.png"}))]))
    assert "label_conflicts" not in _manifest(result)["audit"]["rules"]
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    assert rule["count"] == 0 and rule["findings"] == []  # leakage.json always says it looked


def test_the_build_summary_counts_conflicting_groups(tmp_path: Path) -> None:
    job = _job(tmp_path, [_source(_class_tree(tmp_path))])
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert run.exit_code == 0, run.output
    line = next(line for line in run.output.splitlines() if "label conflicts" in line)
    assert "label conflicts: 1 group(s)" in line and "policy warn" in line and "0 samples dropped" in line


def test_label_conflict_fail_writes_leakage_json_and_exits_4(tmp_path: Path) -> None:
    job = _job(tmp_path, [_source(_class_tree(tmp_path))],
               split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"label_conflict": "fail"}})
    with pytest.raises(LeakageError, match="label_conflicts: 1 finding") as raised:
        _build(job)
    assert "[cat]" in str(raised.value) and "[dog]" in str(raised.value) and "drop_group" in str(raised.value)
    rule = json.loads((tmp_path / "out" / "targets" / "leakage.json").read_text())["rules"]["label_conflicts"]
    assert rule["severity"] == "fail" and rule["count"] == 1 and not rule["passed"]
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert run.exit_code == 4


def test_under_fail_the_build_does_not_say_the_copies_are_packed_as_they_are(tmp_path: Path) -> None:
    """The warning printed before the audit fails named the warn policy ("packed as they are
    (split.duplicates.label_conflict: warn ...)") under label_conflict: fail, where nothing is packed."""
    job = _job(tmp_path, [_source(_class_tree(tmp_path))],
               split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"label_conflict": "fail"}})
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert run.exit_code == 4
    line = next(line for line in run.output.splitlines() if "group(s) of copies of one image" in line)
    assert "packed as they are" not in line and "label_conflict: warn" not in line
    assert "label_conflict: fail" in line and "exit 4" in line

def test_validate_lists_the_conflict_as_a_finding_and_fails_only_under_fail(tmp_path: Path) -> None:
    raw = _class_tree(tmp_path)
    warned = validate_job(load_job(_job(tmp_path / "warn", [_source(raw)])), scheduler="sync", quiet=True)
    doc = summary(warned)  # schema-checked against validate.schema.json
    rule = doc["audit"]["rules"]["label_conflicts"]
    assert warned.exit_code == 0 and rule["count"] == 1 and rule["findings"][0]["labels"] == ["cat", "dog"]
    assert "[note] label_conflicts: 1" in format_summary(warned)
    failing = validate_job(load_job(_job(tmp_path / "fail", [_source(raw)], split={
        "by": "entity", "ratios": {"train": 1.0}, "duplicates": {"mode": "group", "label_conflict": "fail"}})),
        scheduler="sync", quiet=True)
    assert failing.exit_code == 4 and "[FAIL] label_conflicts: 1" in format_summary(failing)
    assert "result: the split audit failed: label_conflicts (exit 4)" in format_summary(failing)


def test_the_report_lists_each_conflicting_group_with_its_labels(tmp_path: Path) -> None:
    job = _job(tmp_path, [_source(_class_tree(tmp_path, other="<b>dog</b>"))])
    result = _build(job)
    html = write_html_report(result.version_dir).read_text()
    keys = _keys(job)
    table = html[html.index('id="label-conflicts"'):]
    table = table[:table.index("</table>")]
    assert keys["0.png"] in table and keys["copy_a.png"] in table and "<td>cat</td>" in table
    assert "&lt;b&gt;dog&lt;/b&gt;" in table and "<b>dog" not in html  # a label is text, never markup
    assert keys["copy_b.png"] not in table  # a copy that agrees is no conflict


# -- multi-label targets: drop_group --------------------------------------------------------------------------


def test_drop_group_leaves_every_member_out_before_the_split_and_records_each_file(tmp_path: Path) -> None:
    rows = [_row(f"{i}.png", f"E{i}", findings=f) for i, f in enumerate(["effusion|nodule", "nodule", "", "mass"])]
    rows += [_row("copy_a.png", "E90", findings="effusion"),      # 0.png without nodule: conflicts
             _row("copy_b.png", "E91", findings="nodule"),        # 1.png as it is: agrees
             _row("copy_c.png", "E92", findings="effusion|nodule")]  # 0.png again, agreeing with 0.png
    raw = _tree(tmp_path, rows, {"copy_a.png": "0.png", "copy_b.png": "1.png", "copy_c.png": "0.png"})
    job = _job(tmp_path, [_source(raw, kind="multilabel", column="findings")], labels=["effusion", "mass", "nodule"],
               split={"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "balance": {"accept": True},
                      "duplicates": {"label_conflict": "drop_group"}})
    result = _build(job)
    keys = _keys(job)
    assert _packed(result.version_dir) == {keys[name] for name in ("1.png", "2.png", "3.png", "copy_b.png")}
    excluded = read_excluded(result.version_dir / "excluded.jsonl")
    assert sorted(Path(r["path"]).name for r in excluded) == ["0.png", "copy_a.png", "copy_c.png"]
    _check_schema_excluded(excluded)
    assert all(r["why"] == "label_conflict" and r["stage"] == "split" and "drop_group" in r["detail"]
               for r in excluded)
    manifest = _manifest(result)
    assert manifest["inputs"]["excluded"] == {"label_conflict": 3}
    assert sum(manifest["splits"][s]["samples"] for s in ("train", "valid", "test")) == 4
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    _check_schema(rule)
    assert rule["dropped"] == 3 and rule["count"] == 1
    (finding,) = rule["findings"]
    assert finding["dropped"] and finding["size"] == 3 and all(s["split"] is None for s in finding["samples"])
    assert finding["labels"] == ["effusion", "effusion|nodule"]
    # packer validate's summary says where each member went: nowhere, in words
    line = finding_text("label_conflicts", finding, members=6, where=True)
    assert "None" not in line and line.count("(left out, entity ") == 3, line


def test_drop_group_counts_a_file_whose_other_tiles_pack_as_packed_not_left_out(tmp_path: Path) -> None:
    """A.png and B.png share their left tile (an exact copy) and differ in class: drop_group
    leaves those two tiles out, and each file's right tile packs. Both files were recorded in
    excluded.jsonl and counted as left out on purpose, though packed (and taken out of the bad
    fraction's denominator); a file is counted once, as packed here."""
    raw = tmp_path / "raw"
    tiles = [_texture(500 + i, (64, 64)) for i in range(12)]
    files = {"A.png": (0, 1), "B.png": (0, 2), **{f"s{i}.png": (i, i + 6) for i in range(3, 6)}}
    for name, (left, right) in files.items():
        _png(raw / name, np.concatenate([tiles[left], tiles[right]], axis=1))
    rows = [_row(name, f"E{n}", label="ab"[n % 2]) for n, name in enumerate(files)]
    lines = ["path,entity,timestamp,label", *(",".join(r.values()) for r in rows)]
    (raw / "table.csv").write_text("\n".join(lines) + "\n")
    job = _job(tmp_path, [_source(raw)], transform={"image": {"tile": {"size": [64, 64], "stride": [64, 64]}}},
               split={"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "balance": {"accept": True},
                      "duplicates": {"label_conflict": "drop_group"}})
    result = _build(job)
    manifest = _manifest(result)
    assert "excluded" not in manifest["inputs"] or not manifest["inputs"]["excluded"], manifest["inputs"]
    assert not (result.version_dir / "excluded.jsonl").exists() or not read_excluded(
        result.version_dir / "excluded.jsonl")
    assert sum(manifest["splits"][s]["samples"] for s in ("train", "valid", "test")) == 8  # 10 tiles, 2 dropped
    keys = _keys(job)
    packed = _packed(result.version_dir)
    assert all(any(k.startswith(keys[name]) for k in packed) for name in ("A.png", "B.png"))
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    assert rule["dropped"] == 2 and rule["count"] == 1


def test_drop_group_leaves_a_class_only_the_dropped_copies_held_out_of_the_label_map(tmp_path: Path) -> None:
    """README: a dropped group is left out "as if it had not been found". A class only a dropped
    copy carried stayed in the label map ({Aonly: 0, a: 1, b: 2}), which moved every packed
    sample's class index; the label map is now the one a build without the copy gives."""
    rows = [_row(f"{i}.png", f"E{i}", label="ab"[i % 2]) for i in range(4)]
    rows.append(_row("copy.png", "E9", label="Aonly"))
    raw = _tree(tmp_path, rows, {"copy.png": "0.png"})
    split = {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "balance": {"accept": True},
             "duplicates": {"label_conflict": "drop_group"}}
    job = _job(tmp_path, [_source(raw)], split=split)
    result = _build(job)
    assert _manifest(result)["label_map"] == {"a": 0, "b": 1}
    packed = {s["__key__"]: int(s["cls"]) for s in wds.WebDataset(sorted(str(p) for p in result.version_dir.glob(
        "*.tar")), shardshuffle=False, empty_check=False)}
    keys = _keys(job)
    assert packed == {keys[f"{i}.png"]: i % 2 for i in (1, 2, 3)}


def _check_schema_excluded(records: list[dict[str, Any]]) -> None:
    schema = load_schema("excluded")
    for record in records:
        jsonschema.Draft202012Validator(schema).validate(record)


# -- numeric targets: the tolerance -----------------------------------------------------------------------------


def test_numeric_copies_conflict_beyond_the_tolerance_only(tmp_path: Path) -> None:
    rows = [_row(f"{i}.png", f"E{i}", age=str(40 + 10 * i)) for i in range(4)]
    rows += [_row("near.png", "E90", age="40.4"),   # 0.png, 0.4 years off: within 0.5
             _row("far.png", "E91", age="57")]      # 1.png, 7 years off
    raw = _tree(tmp_path, rows, {"near.png": "0.png", "far.png": "1.png"})
    job = _job(tmp_path, [_source(raw, kind="numeric", columns=["age"])],
               split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"label_tolerance": 0.5}})
    result = _build(job)
    keys = _keys(job)
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    _check_schema(rule)
    assert rule["tolerance"] == 0.5
    assert _groups(rule) == [sorted([(keys["1.png"], "50.0"), (keys["far.png"], "57.0")])]
    assert _manifest(result)["config"]["split"]["label_conflicts"] == {"policy": "warn", "tolerance": 0.5,
                                                                      "mask_dice": 0.8}


# -- masks: Dice between exact copies -----------------------------------------------------------------------------


def _png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, data = cv2.imencode(".png", array)
    assert ok
    path.write_bytes(data.tobytes())


def _mask_tree(tmp: Path) -> tuple[Path, float]:
    """Three photos with masks; ``copy_far.png`` is ``0.png`` with another annotation (the block
    moved: its Dice with the original computed below), ``copy_same.png`` is ``1.png`` with its
    own mask's bytes. Returns the tree and the moved block's Dice."""
    raw = tmp / "raw"
    rows = ["path,mask,entity,timestamp"]
    masks = {}
    for i in range(3):
        _photo(raw / "img" / f"{i}.png", i)
        mask = np.zeros((48, 64), dtype=np.uint8)
        mask[8:24, 8 + 8 * i:24 + 8 * i] = 1
        masks[i] = mask
        _png(raw / "masks" / f"{i}.png", mask)
        rows.append(f"img/{i}.png,masks/{i}.png,E{i},2024-01-01")
    moved = np.zeros((48, 64), dtype=np.uint8)
    moved[8:24, 20:36] = 1  # 16×16, sharing 16×4 pixels with 0.png's block at columns 8..24
    _png(raw / "masks" / "far.png", moved)
    shutil.copyfile(raw / "img" / "0.png", raw / "img" / "copy_far.png")
    shutil.copyfile(raw / "img" / "1.png", raw / "img" / "copy_same.png")
    shutil.copyfile(raw / "masks" / "1.png", raw / "masks" / "same.png")
    rows += ["img/copy_far.png,masks/far.png,E90,2024-01-01", "img/copy_same.png,masks/same.png,E91,2024-01-01"]
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    return raw, 2 * (16 * 4) / (256 + 256)


def test_exact_copies_whose_masks_disagree_conflict_below_the_dice_threshold(tmp_path: Path) -> None:
    raw, dice = _mask_tree(tmp_path)
    source = {**_source(raw), "label": "none", "mask": {"column": "mask", "classes": [0, 1]}}
    job = _job(tmp_path, [source], transform={"image": {}})  # no resize: the masks' Dice as drawn
    result = _build(job)
    keys = _keys(job)
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    _check_schema(rule)
    assert rule["masks_compared"] is True and rule["count"] == 1
    (finding,) = rule["findings"]
    assert {s["key"] for s in finding["samples"]} == {keys["img/0.png"], keys["img/copy_far.png"]}
    assert finding["mask_dice"] == pytest.approx(dice, abs=1e-4) and not finding["targets_differ"]
    # validate keeps no spill but the masks, for the run: it compares them and finds the same group
    checked = summary(validate_job(load_job(job), scheduler="sync", quiet=True))["audit"]["rules"]["label_conflicts"]
    assert checked["masks_compared"] is True and checked["count"] == 1
    assert checked["findings"][0]["mask_dice"] == finding["mask_dice"]


# -- the job file ---------------------------------------------------------------------------------------------


def test_duplicates_takes_its_mode_alone_or_with_the_label_conflict_settings(tmp_path: Path) -> None:
    raw = _class_tree(tmp_path)

    def split(duplicates: Any) -> Any:
        return load_job(_job(tmp_path / str(abs(hash(repr(duplicates)))), [_source(raw)], split={
            "by": "entity", "ratios": {"train": 1.0}, "duplicates": duplicates})).split

    plain, spelled = split("report"), split({"mode": "report", "label_conflict": "warn"})
    assert plain == spelled and plain.duplicates == "report" and plain.label_conflict == "warn"
    assert "label_conflicts" not in plain.to_json()  # defaults: every existing job keeps its config_hash
    dropping = split({"label_conflict": "drop_group", "mask_dice": 0.5})
    assert dropping.duplicates == "group" and dropping.to_json()["label_conflicts"] == {
        "policy": "drop_group", "tolerance": 0.0, "mask_dice": 0.5}
    with pytest.raises(ConfigError, match="label_conflict"):
        split({"label_conflict": "ignore"})


# -- near copies, and what drop_group does to the split groups ------------------------------------------------------


def test_a_near_copy_with_another_class_conflicts_and_drop_group_unlinks_the_entities_it_joined() -> None:
    # A's slice 0 and B's slice 2 are a verified near copy (not the same pixels) with different classes
    samples = as_table([sample(0, "A", label="cat"), sample(1, "A", label="cat"), sample(2, "B", label="dog"),
                        sample(3, "B", label="dog")])
    near = links((0, 2))
    cfg = SplitConfig(by="entity", ratios=(("train", 0.5), ("valid", 0.0), ("test", 0.5)), seed=0,
                      label_conflict="drop_group")
    found = find_label_conflicts(samples, near, cfg, target_class("class").conflicts, masks=None)
    assert [(g.members, g.linked_by, g.targets) for g in found.groups] == [((0, 2), "near", True)]
    assert sorted(g.members for g in group_samples(samples, cfg, near)) == [(0, 1, 2, 3)]  # one group by the copy
    # left out before the split: the copy joins nothing, and A and B may land apart
    assert sorted(g.members for g in group_samples(samples, cfg, near, leave_out=found.rows)) == [(1,), (3,)]
    assignment = assign_splits(samples, cfg, near, leave_out=found.rows)
    assert set(assignment.split) == {"s-000001", "s-000003"}
    same = find_label_conflicts(as_table([sample(0, "A", label="cat"), sample(2, "B", label="cat")]), links((0, 1)),
                                cfg, target_class("class").conflicts, masks=None)
    assert same.groups == ()  # copies that agree are no conflict


# -- masks: Dice between near copies, through the alignment their verification found ---------------------------


def _texture(seed: int, shape: tuple[int, int] = (160, 192)) -> np.ndarray:
    """A grey image with structure at several scales (what the near-copy check can align)."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(shape[0] // 8, shape[1] // 8)).astype(np.float32)
    image = cv2.resize(coarse, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC)
    image = cv2.normalize(image, None, 0, 240, cv2.NORM_MINMAX).astype(np.uint8)
    return cv2.add(image, rng.integers(0, 12, shape, dtype=np.uint8))


def _annotation(shape: tuple[int, int] = (160, 192), shift: int = 0) -> np.ndarray:
    mask = np.zeros(shape, dtype=np.uint8)
    cv2.circle(mask, (60 + shift, 70), 18, 1, -1)
    cv2.rectangle(mask, (110 + shift, 30), (150 + shift, 60), 2, -1)
    return mask


def _warped(array: np.ndarray, zoom: float, dy: float, dx: float, interpolation: int) -> np.ndarray:
    centre = ((array.shape[1] - 1) / 2, (array.shape[0] - 1) / 2)
    matrix = cv2.getRotationMatrix2D(centre, 0.0, zoom)
    matrix[0, 2] += dx
    matrix[1, 2] += dy
    return cv2.warpAffine(array, matrix, (array.shape[1], array.shape[0]), flags=interpolation,
                          borderMode=cv2.BORDER_REFLECT)


@pytest.mark.parametrize(("zoom", "dy", "dx"), [(1.0, 9, -6), (1.05, 5, 7), (0.95, -8, 4), (1.0, 0, 0)])
def test_a_near_copys_mask_is_compared_on_its_sources_grid_through_the_verified_alignment(
        zoom: float, dy: int, dx: int) -> None:
    """A shifted or zoomed copy annotated alike agrees (Dice above the default 0.8) once its mask
    is carried through the alignment the verification found, where a pixel-for-pixel Dice would
    call it a conflict; the same copy carrying its source's mask unmoved (a misplaced annotation)
    disagrees."""
    image, mask = _texture(5), _annotation()
    copy = _warped(image, zoom, dy, dx, cv2.INTER_LINEAR)
    copy_mask = _warped(mask, zoom, dy, dx, cv2.INTER_NEAREST)
    evidence = verify(thumbnail(image), thumbnail(copy))
    assert evidence.score >= 0.9  # a near copy the check links
    aligned = aligned_dice(mask, copy_mask, zoom=evidence.zoom, dy=evidence.dy, dx=evidence.dx)
    assert aligned >= 0.9
    if (dy, dx) != (0, 0):
        assert mask_dice(mask, copy_mask) < 0.8  # unaligned, the geometry alone would look like a conflict
        assert aligned_dice(mask, mask, zoom=evidence.zoom, dy=evidence.dy, dx=evidence.dx) < 0.8


def test_aligned_dice_leaves_out_what_the_copy_does_not_show_and_takes_each_samples_own_size() -> None:
    mask = _annotation()
    half = cv2.resize(mask, (96, 80), interpolation=cv2.INTER_NEAREST)  # the same view at half the size
    assert aligned_dice(mask, half, zoom=1.0, dy=0, dx=0) >= 0.9  # each side's pixels through its own size
    assert aligned_dice(mask, np.zeros_like(half), zoom=1.0, dy=0, dx=0) == 0.0
    assert aligned_dice(mask, half, zoom=1.0, dy=200, dx=0) == 1.0  # no overlap: nothing to compare
    # a slice's 1×H×W and a volume's D×H×W masks: every leading index aligned alike
    stacked = np.stack([mask, mask])
    assert aligned_dice(stacked, np.stack([half, half]), zoom=1.0, dy=0, dx=0) >= 0.9
    assert aligned_dice(stacked, half[None], zoom=1.0, dy=0, dx=0) == 0.0  # another depth: nothing agrees


def test_aligned_dice_leaves_out_the_border_resize_fit_pads_either_mask_with() -> None:
    """A copy cut 20 px on its left, packed with resize: fit: its mask's missing strip is the
    pad id, and the original's structure there landed on it, counted as disagreement (Dice 0.67
    for two identical annotations, a conflict under the 0.8 default). The pad is now left out
    where either mask holds it, as a strip outside the grid is."""
    mask = _annotation()
    mask[60:100, 5:40] = 3  # a structure by the left edge
    copy = mask.copy()
    copy[:, :20] = 255  # fit's border, where the copy shows nothing
    assert aligned_dice(mask, copy, zoom=1.0, dy=0, dx=0, pad=255) == 1.0
    moved = copy.copy()
    moved[60:100, 20:40] = 0  # a structure the copy really lacks still counts
    assert aligned_dice(mask, moved, zoom=1.0, dy=0, dx=0, pad=255) < 0.8


def _near_mask_tree(tmp: Path) -> Path:
    """Four textures with masks, one entity each, and two shifted copies under other entities:
    ``copy_same`` with its mask shifted alike, ``copy_misplaced`` with its source's mask unmoved."""
    raw = tmp / "raw"
    rows = ["path,mask,entity,timestamp"]
    for i in range(4):
        _png(raw / "img" / f"{i}.png", _texture(10 + i))
        _png(raw / "masks" / f"{i}.png", _annotation(shift=4 * i))
        rows.append(f"img/{i}.png,masks/{i}.png,E{i},2024-01-01")
    for name, source, mask in (("copy_same", 0, _warped(_annotation(), 1.0, 6, 9, cv2.INTER_NEAREST)),
                               ("copy_misplaced", 1, _annotation(shift=4))):
        _png(raw / "img" / f"{name}.png", _warped(_texture(10 + source), 1.0, 6, 9, cv2.INTER_LINEAR))
        _png(raw / "masks" / f"{name}.png", mask)
        rows.append(f"img/{name}.png,masks/{name}.png,E9{source},2024-01-01")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    return raw


def test_a_near_copy_whose_mask_is_misplaced_conflicts_and_one_annotated_alike_does_not(tmp_path: Path) -> None:
    raw = _near_mask_tree(tmp_path)
    source = {**_source(raw), "label": "none", "mask": {"column": "mask", "classes": [0, 1, 2]}}
    job = _job(tmp_path, [source], transform={"image": {"color": "gray"}},
               split={"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": True}})
    result = _build(job)
    keys = _keys(job)
    leakage = _leakage(result.version_dir)
    linked = {frozenset(s["key"] for s in finding["samples"])
              for finding in leakage["rules"]["duplicates_span_entities"]["findings"]}
    assert linked == {frozenset({keys["img/0.png"], keys["img/copy_same.png"]}),
                      frozenset({keys["img/1.png"], keys["img/copy_misplaced.png"]})}
    rule = leakage["rules"]["label_conflicts"]
    _check_schema(rule)
    assert rule["masks_compared"] is True and rule["count"] == 1
    (finding,) = rule["findings"]
    assert {s["key"] for s in finding["samples"]} == {keys["img/1.png"], keys["img/copy_misplaced.png"]}
    assert finding["mask_dice"] < 0.8 and not finding["targets_differ"]
