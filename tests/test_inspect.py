"""packer inspect, diff and ls on real demo builds: the numbers shown are the manifest's and
the files'; diffs name exactly the samples that were added or changed in the raw tree."""

from __future__ import annotations

import csv
import hashlib
import hmac
import json
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from packer.commands.inspect import diff_command, inspect_command, ls_command
from packer.config import load_job
from packer.demo import write_ct_slice, write_photo
from packer.pipeline.build import BuildOptions, build
from tests.helpers import demo_job_doc, write_job

CLI = click.Group(commands=[inspect_command, diff_command, ls_command])


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(CLI, [str(a) for a in args])


def key_of(source: str, relpath: str, key: bytes) -> str:
    """The sample key packer gives a single-image file when pseudonymizing (the demo job does):
    source + 16 hex of HMAC-SHA256(key, "path" NUL source NUL relpath)."""
    mac = hmac.new(key, f"path\x00{source}\x00{relpath}".encode(), hashlib.sha256).hexdigest()
    return f"{source}-{mac[:16]}"


def index_rows(version: Path) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in pq.read_table(version / "_index.parquet").to_pylist()}


@dataclass(frozen=True)
class Builds:
    first: Path        # the demo tree as written
    grown: Path        # + one new CT patient, + one new photo subject, one photo's pixels replaced
    reseeded: Path     # grown tree, split seed 18
    grown_parquet: Path  # grown tree packed as Parquet
    registry: Path
    added: frozenset[str]
    changed: str


def _add_rows(table: Path, rows: list[list[str]]) -> None:
    with open(table, "a", newline="") as fh:
        csv.writer(fh).writerows(rows)


@pytest.fixture(scope="module")
def builds(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Builds:
    tmp = tmp_path_factory.mktemp("inspect")
    raw = Path(shutil.copytree(demo_raw.root, tmp / "raw"))
    key = (raw / "phi.key").read_text().strip().encode()
    registry = tmp / "manifests"

    def run(*, to_registry: bool = True, **overrides: Any) -> Path:
        doc = demo_job_doc(raw, tmp / "out", **({"registry": str(registry)} if to_registry else {}), **overrides)
        return build(load_job(write_job(tmp / "job", doc)), BuildOptions(scheduler="sync", quiet=True)).version_dir

    first = run()
    rng = np.random.default_rng(99)
    write_ct_slice(raw / "ct" / "PAT0099" / "ST01" / "IM001.dcm", patient_id="PAT0099", study_date="20240301",
                   pixels_hu=rng.uniform(-1000, 1000, size=(64, 64)))
    _add_rows(raw / "ct_labels.csv", [["PAT0099/ST01/IM001.dcm", "nodule"]])
    write_photo(raw / "photos" / "S099" / "01.png", rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8))
    _add_rows(raw / "photos" / "labels.csv", [["S099/01.png", "circle", "S099", "2024-03-01T10:00:00"]])
    first_photo = sorted((raw / "photos" / "S001").glob("*.png"))[0]
    write_photo(first_photo, rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8))
    grown = run()
    split = dict(demo_job_doc(raw, tmp)["split"], seed=18)
    reseeded = run(split=split)
    grown_parquet = run(to_registry=False, pack=dict(demo_job_doc(raw, tmp)["pack"], format="parquet"))
    return Builds(first=first, grown=grown, reseeded=reseeded, grown_parquet=grown_parquet, registry=registry,
                  added=frozenset({key_of("ct", "PAT0099/ST01/IM001.dcm", key), key_of("photos", "S099/01.png", key)}),
                  changed=key_of("photos", f"S001/{first_photo.name}", key))


def test_inspect_text_and_json_show_the_manifest_and_file_numbers(builds: Builds, demo_raw: Any) -> None:
    manifest = json.loads((builds.first / "manifest.json").read_text())
    text = invoke("inspect", builds.first)
    assert text.exit_code == 0, text.output
    assert f"dataset demo version {manifest['version']}" in text.output
    assert manifest["dataset_hash"] in text.output and manifest["created_at"] in text.output
    for split, entry in manifest["splits"].items():
        assert f"  {split:<7}{entry['samples']:>8}{entry['entities']:>10}{len(entry['shards']):>8}" in text.output
        for label, count in entry["class_counts"].items():
            assert f"{label} {count} ({100 * count / entry['samples']:.1f}%)" in text.output
    for reason, count in manifest["bad_samples"]["by_reason"].items():
        assert f"{reason} {count}" in text.output
    assert "audit         passed" in text.output
    for rule in json.loads((builds.first / "leakage.json").read_text())["rules"]:  # every rule the audit ran is named
        assert f"    {rule:<32} " in text.output

    summary = json.loads(invoke("inspect", builds.first / "manifest.json", "--json").stdout)
    sizes = {split: [(builds.first / s["file"]).stat().st_size for s in entry["shards"]]
             for split, entry in manifest["splits"].items()}
    for split, entry in summary["splits"].items():
        assert entry["samples"] == manifest["splits"][split]["samples"]
        assert entry["bytes"] == sum(sizes[split])
        assert entry["shard_bytes"]["median"] == int(statistics.median(sizes[split]))
    every = [size for split_sizes in sizes.values() for size in split_sizes]
    assert summary["totals"]["shard_bytes"] == {"min": min(every), "median": int(statistics.median(every)),
                                                "max": max(every)}
    assert summary["totals"]["samples"] == len(index_rows(builds.first))
    assert summary["bad_samples"]["total"] == len(demo_raw.defects)
    assert summary["audit"]["passed"] is True
    assert summary["libraries"] == manifest["libraries"] and summary["config"] == manifest["config"]


def test_inspect_says_reported_not_failed_for_a_report_rule_with_findings() -> None:
    """An audit that passed listed its report-only rules with findings as FAILED: "audit passed"
    above "duplicates_span_entities FAILED"; packer validate calls them notes."""
    from packer.inspection import _audit_lines

    lines = _audit_lines({"passed": True, "rules": {
        "duplicates_span_entities": {"passed": False, "count": 1, "severity": "report"},
        "entity_overlap": {"passed": True, "count": 0, "severity": "fail"}}})
    text = "\n".join(lines)
    assert "audit         passed" in text and "FAILED" not in text
    assert "duplicates_span_entities         reported count 1 (report)" in text
    failed = "\n".join(_audit_lines({"passed": False, "rules": {
        "entity_overlap": {"passed": False, "count": 2, "severity": "fail"}}}))
    assert "entity_overlap                   FAILED   count 2 (fail)" in failed


def test_inspect_refuses_an_edited_manifest(builds: Builds, tmp_path: Path) -> None:
    manifest = json.loads((builds.first / "manifest.json").read_text())
    manifest["inputs"]["samples"] += 1
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    result = invoke("inspect", tmp_path)
    assert result.exit_code == 5 and "dataset_hash" in result.output


def test_inspect_reads_a_manifest_url_as_a_local_one(builds: Builds) -> None:
    """The README says manifest paths may be URLs; inspect refused them as 'does not exist'."""
    import fsspec

    store = fsspec.filesystem("memory")
    base = "memory://inspect-url/demo/v1"
    for path in builds.first.iterdir():
        store.pipe(f"{base}/{path.name}", path.read_bytes())
    try:
        remote, local = invoke("inspect", base, "--json"), invoke("inspect", builds.first, "--json")
    finally:
        store.rm("/inspect-url", recursive=True)
    assert remote.exit_code == 0, remote.output
    assert json.loads(remote.output) | {"manifest": ""} == json.loads(local.output) | {"manifest": ""}
    assert invoke("inspect", "nowhere/at/all").exit_code == 2


def test_diff_of_a_build_against_itself_is_empty(builds: Builds) -> None:
    result = invoke("diff", builds.first, builds.first / "manifest.json")
    assert result.exit_code == 0, result.output
    assert "no differences" in result.output
    payload = json.loads(invoke("diff", builds.first, builds.first, "--json").stdout)
    assert payload["empty"] is True
    assert all(payload["samples"][kind] == [] for kind in ("added", "removed", "changed", "moved", "relabeled"))


def test_diff_names_exactly_the_added_and_changed_samples(builds: Builds) -> None:
    result = invoke("diff", builds.first, builds.grown, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    samples = payload["samples"]
    new_rows = index_rows(builds.grown)
    assert {c["key"] for c in samples["added"]} == builds.added
    assert [c["key"] for c in samples["changed"]] == [builds.changed]
    assert samples["removed"] == [] and samples["moved"] == [] and samples["relabeled"] == []
    assert payload["config"] == [] and payload["versions"] == []
    added_by_split: dict[str, int] = {}
    for key in builds.added:
        added_by_split[new_rows[key]["split"]] = added_by_split.get(new_rows[key]["split"], 0) + 1
    assert {split: c["added"] for split, c in samples["by_split"].items() if "added" in c} == added_by_split
    assert samples["by_label"]["nodule"]["added"] == 1 and samples["by_label"]["circle"]["added"] == 1
    text = invoke("diff", builds.first, builds.grown).output
    assert "2 added, 0 removed, 1 changed, 0 moved split" in text
    assert all(key in text for key in builds.added | {builds.changed})


def test_diff_across_formats_compares_each_samples_pixels(builds: Builds) -> None:
    """A WebDataset version against a Parquet one: the index's per-sample sha256 hashes the
    .npy member in one and the raw pixels in the other, so diff said "0 changed" without
    comparing any content. It must name the sample whose pixels changed, and find none changed
    between the same tree packed both ways."""
    same = json.loads(invoke("diff", builds.grown, builds.grown_parquet, "--json").stdout)
    assert same["samples"]["content_compared"] is True
    assert all(same["samples"][kind] == [] for kind in ("added", "removed", "changed", "moved", "relabeled"))
    assert [c["path"] for c in same["config"]] == ["pack.format"]
    payload = json.loads(invoke("diff", builds.first, builds.grown_parquet, "--json").stdout)
    assert payload["samples"]["content_compared"] is True
    assert [c["key"] for c in payload["samples"]["changed"]] == [builds.changed]
    assert {c["key"] for c in payload["samples"]["added"]} == builds.added
    back = json.loads(invoke("diff", builds.grown_parquet, builds.first, "--json").stdout)
    assert [c["key"] for c in back["samples"]["changed"]] == [builds.changed]
    text = invoke("diff", builds.first, builds.grown_parquet).output
    assert "2 added, 0 removed, 1 changed, 0 moved split" in text
    assert "formats differ (webdataset vs parquet)" in text and "pixels were read from its" in text


def test_diff_across_formats_refuses_a_parquet_shard_whose_pixels_its_index_does_not_record(
        builds: Builds, tmp_path: Path) -> None:
    import pyarrow as pa

    copy = Path(shutil.copytree(builds.grown_parquet, tmp_path / "v"))
    shard = sorted(copy.glob("train-*.parquet"))[0]
    table = pq.read_table(shard)
    images = table.column("image").to_pylist()
    images[0] = bytes(255 - b for b in images[0])
    pq.write_table(table.set_column(table.schema.get_field_index("image"), "image",
                                    pa.array(images, pa.binary())), shard)
    result = invoke("diff", builds.grown, copy)
    assert result.exit_code == 5
    assert f"{shard}: sample {table.column('key')[0].as_py()}: its image cell hashes to sha256" in result.output
    assert "not what _index.parquet records" in result.output and "packer verify" in result.output


def test_diff_reports_config_changes_and_samples_that_moved_split(builds: Builds) -> None:
    payload = json.loads(invoke("diff", builds.grown, builds.reseeded, "--json").stdout)
    assert payload["config"] == [{"path": "split.seed", "change": "changed", "old": 17, "new": 18}]
    old, new = index_rows(builds.grown), index_rows(builds.reseeded)
    moved = {key for key in old if old[key]["split"] != new[key]["split"]}
    assert moved, "seed 18 should move some entity"
    assert {c["key"] for c in payload["samples"]["moved"]} == moved
    assert payload["samples"]["added"] == payload["samples"]["removed"] == payload["samples"]["changed"] == []
    assert "split.seed: 17 -> 18" in invoke("diff", builds.grown, builds.reseeded).output


def test_diff_of_registry_copies_compares_config_only(builds: Builds) -> None:
    old = builds.registry / "demo" / f"{builds.grown.name}.json"
    new = builds.registry / "demo" / f"{builds.reseeded.name}.json"
    result = invoke("diff", old, new)
    assert result.exit_code == 0, result.output
    assert "samples not compared" in result.output and "split.seed: 17 -> 18" in result.output
    assert result.output.count("samples not compared") == 1  # both copies' folder, said once


def test_diff_json_of_a_registry_copy_and_its_version_says_content_was_not_compared(builds: Builds) -> None:
    # content_compared was true whenever the formats matched, so a script gating on it read `changed: []` as
    # "no pixels changed" though no per-sample sha256 was read: one side is a manifest alone
    copy = builds.registry / "demo" / f"{builds.grown.name}.json"
    result = invoke("diff", copy, builds.grown, "--json")
    assert result.exit_code == 0, result.output
    samples = json.loads(result.output)["samples"]
    assert samples["compared"] is False and samples["content_compared"] is False and samples["changed"] == []
    text = invoke("diff", copy, builds.grown).output
    assert "samples not compared" in text and "changed" not in text.replace("not compared", "")


def test_ls_lists_registry_versions_newest_first(builds: Builds, tmp_path: Path) -> None:
    registry = Path(shutil.copytree(builds.registry, tmp_path / "manifests"))
    order = [builds.first.name, builds.grown.name, builds.reseeded.name]
    for month, version in enumerate(order, start=1):  # created_at is outside the hash: set it to known times
        path = registry / "demo" / f"{version}.json"
        manifest = json.loads(path.read_text())
        manifest["created_at"] = f"2024-0{month}-01T00:00:00Z"
        path.write_text(json.dumps(manifest))
    result = invoke("ls", registry)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("demo ")]
    assert [line.split()[1] for line in lines] == order[::-1]
    grown = json.loads((builds.grown / "manifest.json").read_text())
    counts = " ".join(f"{grown['splits'][s]['samples']:>7}" for s in ("train", "valid", "test"))
    assert any(counts in line and grown["dataset_hash"][:16] in line for line in lines)
    listed = json.loads(invoke("ls", registry, "--name", "demo", "--json").stdout)
    assert [e["version"] for e in listed] == order[::-1]
    assert listed[1]["samples"] == {s: grown["splits"][s]["samples"] for s in ("train", "valid", "test")}
    assert "no manifests" in invoke("ls", registry, "--name", "other").output
    assert invoke("ls", tmp_path / "nowhere").exit_code == 2
    # one dataset's folder of the registry (what a newcomer types) lists that dataset's versions; it
    # said "no manifests under manifests/demo", which holds them
    one = invoke("ls", registry / "demo")
    assert one.exit_code == 0 and [line.split()[1] for line in one.output.splitlines()
                                   if line.startswith("demo ")] == order[::-1], one.output
    typo = invoke("ls", registry, "--name", "dmeo").output
    assert "no manifests" in typo and "its datasets: demo (closest)" in typo, typo


@pytest.mark.parametrize("name", ["inspect", "diff", "ls"])
def test_every_command_has_help(name: str) -> None:
    result = invoke(name, "--help")
    assert result.exit_code == 0, result.output
    assert len(CLI.commands[name].help or "") > 40


def _demo_copy(demo_raw: Any, tmp_path: Path) -> tuple[Path, bytes, Callable[[], Path]]:
    """A copy of the demo's raw tree to edit, its PHI key, and a build of it (the version folder)."""
    raw = Path(shutil.copytree(demo_raw.root, tmp_path / "raw"))

    def run() -> Path:
        doc = demo_job_doc(raw, tmp_path / "out")
        return build(load_job(write_job(tmp_path / "job", doc)), BuildOptions(scheduler="sync", quiet=True)).version_dir

    return raw, (raw / "phi.key").read_text().strip().encode(), run


def test_diff_names_a_sample_whose_record_changed_but_not_its_pixels_or_label(
        demo_raw: Any, tmp_path: Path) -> None:
    """A table edit that moves a photo to another entity of the same split changes the sample's
    packed record (its entity id) but not its pixels, label or split: diff listed nothing for it
    at all, though the shard holding it is new. It must name it as ``record_changed``, from the
    index's xxh3 (over all of a sample's packed bytes), and nothing else."""
    raw, key, run = _demo_copy(demo_raw, tmp_path)
    first = run()
    table = raw / "photos" / "labels.csv"
    with open(table, newline="") as fh:
        rows = list(csv.reader(fh))
    by_key = {row["key"]: row for row in pq.read_table(first / "_splits.parquet").to_pylist()}
    header, body = rows[0], rows[1:]
    path_at, entity_at = header.index("path"), header.index("entity")
    split_of = {row[entity_at]: by_key[key_of("photos", row[path_at], key)]["split"]
                for row in body if key_of("photos", row[path_at], key) in by_key}
    moved_row = next(row for row in body if key_of("photos", row[path_at], key) in by_key
                     and any(e != row[entity_at] and s == split_of[row[entity_at]] for e, s in split_of.items()))
    moved_row[entity_at] = next(e for e, s in sorted(split_of.items())
                                if e != moved_row[entity_at] and s == split_of[moved_row[entity_at]])
    with open(table, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *body])
    second = run()
    edited = key_of("photos", moved_row[path_at], key)
    payload = json.loads(invoke("diff", first, second, "--json").stdout)
    samples = payload["samples"]
    assert [c["key"] for c in samples["record_changed"]] == [edited]
    assert all(samples[kind] == [] for kind in ("added", "removed", "changed", "moved", "relabeled"))
    assert payload["empty"] is False
    text = invoke("diff", first, second).output
    assert "1 record changed" in text and edited in text
    same = json.loads(invoke("diff", second, second, "--json").stdout)
    assert same["samples"]["record_changed"] == [] and same["empty"] is True


def test_diff_ls_and_report_refuse_an_object_store_url_by_name_and_say_what_reads_it() -> None:
    """They read local folders only (README), but click turned s3://b/x into the path s3:/b/x and
    the error read "s3:/b/x: no such file or folder" (or "no registry folder here"): a URL the
    user never typed, and no word that a URL cannot work here. No request is made."""
    from packer.commands.bench_loader import bench_loader_command
    from packer.commands.report import report

    url = "s3://bucket/datasets/demo/5261f2ed6336"
    cli = click.Group(commands=[inspect_command, diff_command, ls_command, report, bench_loader_command])
    for args, command in (([ "diff", url, "/tmp/x"], "diff"), (["diff", "/tmp/x", url + "/"], "diff"),
                          (["ls", "s3://bucket/datasets/demo"], "ls"), (["report", url], "report"),
                          (["bench-loader", url + "/manifest.json"], "bench-loader")):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert "s3:/bucket" not in result.output.replace("s3://", ""), result.output
        assert f"`packer {command}` reads local folders only" in result.output, result.output
        assert "packer inspect" in result.output and "packer verify" in result.output, result.output
    # given the manifest's URL, the copy names the version folder (a manifest.json/ prefix holds no object)
    result = CliRunner().invoke(cli, ["report", url + "/manifest.json"])
    assert f"aws s3 cp --recursive {url}/ DIR" in result.output and "manifest.json/" not in result.output


def test_diff_check_verifies_both_versions_first_and_plain_diff_warns_of_a_shard_of_another_size(
        builds: Builds, tmp_path: Path) -> None:
    """diff compares the sha256s the manifests record and hashed no shard: a version with a
    flipped byte in a shard, or a shard cut short, was diffed as if whole, without a word.
    --check verifies both versions first (packer verify's checks) and exits 5 naming the shard
    and sample, with no diff; a plain diff warns of a shard missing or of another size."""
    clean = invoke("diff", builds.first, builds.grown, "--check")
    assert clean.exit_code == 0, clean.output
    assert clean.stdout == invoke("diff", builds.first, builds.grown).stdout
    assert "checked: " in clean.stderr and "of both versions match their manifests" in clean.stderr
    damaged = Path(shutil.copytree(builds.grown, tmp_path / builds.grown.name, copy_function=shutil.copyfile))
    shard = sorted(damaged.glob("train-*.tar"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # the same size: only hashing finds it
    shard.write_bytes(bytes(data))
    plain = invoke("diff", builds.first, damaged)
    assert plain.exit_code == 0 and "warning" not in plain.stderr, plain.output  # a stat cannot see it
    checked = invoke("diff", builds.first, damaged, "--check")
    assert checked.exit_code == 5, checked.output
    assert checked.stdout == "" and "samples:" not in checked.output  # no diff printed
    assert f"FAIL {shard.name}: sha256" in checked.stderr, checked.stderr
    assert f"FAIL {shard.name} [" in checked.stderr and "this sample's bytes changed after the build" in checked.stderr
    assert f"NEW {damaged / 'manifest.json'}: 2 integrity problem(s)" in checked.stderr  # the shard, its sample
    assert "No diff" in checked.stderr and "rebuild the version" in checked.stderr
    shard.write_bytes(bytes(data[:4096]))
    cut = invoke("diff", builds.first, damaged)
    assert cut.exit_code == 0, cut.output
    assert (f"warning: NEW {damaged}: 1 shard(s) missing or not the size its manifest records ({shard.name} (4,096 "
            "bytes, not") in cut.stderr
    assert "`packer diff --check`" in cut.stderr


def test_diff_says_when_the_label_map_moved_classes_to_other_indices(tmp_path: Path) -> None:
    """One file relabelled to a new class that sorts first (``artifact``) renumbers the others:
    every sample's packed class index changes. The diff said only "record changed (... entity,
    time, table cells or mask)" and "config: no differences"; it now names the moved classes."""
    from packer.inspection import diff_datasets, format_diff
    from tests.photo_jobs import build_tree, write_tree

    write_tree(tmp_path / "raw")
    before = build_tree(tmp_path, "out")
    table = tmp_path / "raw" / "labels.csv"
    table.write_text(table.read_text().replace("P00/img00.png,circle", "P00/img00.png,artifact"))
    after = build_tree(tmp_path, "out", fresh=False)
    diff = diff_datasets(before, after)
    assert [(c.old_label, c.new_label) for c in diff.relabeled] == [("circle", "artifact")]
    (note,) = [n for n in diff.notes if n.startswith("the label map changed")]
    assert note.startswith("the label map changed (added 'artifact'), so classes hold other indices: circle 0 -> 1, "
                           "square 1 -> 2; every sample of those classes packs another label index")
    assert "labels: [...]" in note
    text = format_diff(diff)
    assert f"  note: {note}" in text and "the class index where the label map changed" in text
    assert diff_datasets(after, after).notes == ()  # no note without a change


def test_a_config_list_that_was_empty_is_one_change_of_its_value_not_a_removal() -> None:
    """labels: [] then labels: [dog, cat]: `packer diff` said `labels: [] -> (absent)` and two
    `labels[i]` additions, and --json had {"change": "removed", "path": "labels"}."""
    from packer.inspection import diff_values

    changes = diff_values({"labels": [], "split": {"seed": 1}}, {"labels": ["dog", "cat"], "split": {"seed": 1}})
    assert [(c.path, c.change, c.old, c.new) for c in changes] == [("labels", "changed", [], ["dog", "cat"])]
    back = diff_values({"labels": ["dog"], "pack": {"x": {}}}, {"labels": [], "pack": {"x": {"y": 2}}})
    assert [(c.path, c.change) for c in back] == [("labels", "changed"), ("pack.x", "changed")]
    # leaves stay named by key path, as before
    deep = diff_values({"split": {"seed": 1, "ratios": {"train": 1.0}}}, {"split": {"seed": 2, "folds": 5}})
    assert [(c.path, c.change) for c in deep] == [("split.folds", "added"), ("split.ratios.train", "removed"),
                                                  ("split.seed", "changed")]


def test_diff_names_a_sample_whose_time_alone_changed(demo_raw: Any, tmp_path: Path) -> None:
    """Under dates: shift a record's time is no shard byte, only _splits.parquet's
    days_since_first: an edited timestamp made another dataset_hash, and diff said "no differences"."""
    raw, key, run = _demo_copy(demo_raw, tmp_path)
    first = run()
    table = raw / "photos" / "labels.csv"
    with open(table, newline="") as fh:
        header, *body = list(csv.reader(fh))
    path_at, entity_at, time_at = header.index("path"), header.index("entity"), header.index("timestamp")
    packed = {row["key"] for row in pq.read_table(first / "_splits.parquet").to_pylist()}
    entities = [row[entity_at] for row in body]
    edited_row = next(row for row in body if entities.count(row[entity_at]) > 1 and row[time_at]
                      and key_of("photos", row[path_at], key) in packed
                      and row[time_at] > min(r[time_at] for r in body if r[entity_at] == row[entity_at]))
    edited_row[time_at] = edited_row[time_at].replace(edited_row[time_at][:4], str(int(edited_row[time_at][:4]) + 1))
    with open(table, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *body])
    second = run()
    assert json.loads((first / "manifest.json").read_text())["dataset_hash"] != json.loads(
        (second / "manifest.json").read_text())["dataset_hash"]
    payload = json.loads(invoke("diff", first, second, "--json").stdout)
    assert [c["key"] for c in payload["samples"]["record_changed"]] == [key_of("photos", edited_row[path_at], key)]
    assert payload["empty"] is False
