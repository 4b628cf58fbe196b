"""A dataset's life after its build, walked as a user does: commands run from inside a version
folder, files of a version passed where a manifest is asked for, the report of a pseudonymized
build, `packer locate` months later and `packer gc` beside a link that pins a version.

One pseudonymized photo dataset (24 grey PNGs of six entities, tests/photo_jobs.py's tree) is
built twice in one process (the second time with one more file), and each test works on its own
copy where it changes anything.
"""

from __future__ import annotations

import json
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner, Result

from packer.cli import main
from packer.config import load_job
from packer.files import parent_folder
from packer.pipeline.build import BuildOptions, build
from tests.photo_jobs import write_tree


def packer(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@dataclass(frozen=True)
class Built:
    folder: Path     # job.yaml, raw/, phi.key and out/ (the dataset out/photos/)
    dataset: Path    # out/photos
    first: Path      # the version of the 24 files
    second: Path     # the version with raw/P05/extra.png added


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    folder = tmp_path_factory.mktemp("lifecycle")
    (folder / "raw").mkdir()
    write_tree(folder / "raw")
    (folder / "phi.key").write_text(secrets.token_hex(32))
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "name": "photos", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16], "color": "gray"}},
        "pack": {"format": "webdataset", "max_samples": 4}, "output": "out",
        "phi": {"mode": "pseudonymize", "key_file": "phi.key"}}, sort_keys=False))
    first = build(load_job(folder / "job.yaml"), BuildOptions(scheduler="sync", quiet=True)).version_dir
    shutil.copy(folder / "raw/P05/img20.png", folder / "raw/P05/extra.png")
    with open(folder / "raw/labels.csv", "a") as fh:
        fh.write("P05/extra.png,circle,P05\n")
    second = build(load_job(folder / "job.yaml"), BuildOptions(scheduler="sync", quiet=True)).version_dir
    assert first != second
    manifest = json.loads((Path(first) / "manifest.json").read_text())
    manifest["created_at"] = "2024-01-01T00:00:00Z"  # outside the hash: the older one, though built the same second
    (Path(first) / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return Built(folder, folder / "out" / "photos", Path(first), Path(second))


@pytest.fixture
def own(built: Built, tmp_path: Path) -> Built:
    """A copy of the built folder this test may change (links within it kept as links)."""
    folder = Path(shutil.copytree(built.folder, tmp_path / "copy", symlinks=True))
    dataset = folder / "out" / "photos"
    return Built(folder, dataset, dataset / built.first.name, dataset / built.second.name)


# 1. hints from inside a version folder name the dataset folder, not "." again

def test_parent_folder_names_the_folder_that_holds_a_path_written_with_dots(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "out" / "photos" / "v1").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "out" / "photos" / "v1")
    assert parent_folder(Path(".")) == Path("..")
    assert parent_folder(Path("..")) == Path("../..")
    assert parent_folder(Path("../v1")) == Path("..")
    assert parent_folder(tmp_path / "out" / "photos" / "v1" / ".") == tmp_path / "out" / "photos"
    assert parent_folder(Path("out/photos/v1")) == Path("out/photos")  # as typed where that is right


def test_ls_inside_a_version_folder_points_at_its_dataset_folder(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(built.first)
    listed = packer("ls", ".")
    assert "it is a version folder: `packer ls ..` lists the versions of its dataset" in listed.output, listed.output
    assert packer("ls", "..").exit_code == 0
    assert built.first.name in packer("ls", "..").output


def test_gc_inside_a_version_folder_points_at_its_dataset_folder(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(built.first)
    refused = packer("gc", ".", "--keep", "1", "--dry-run")
    assert refused.exit_code == 2, refused.output
    assert refused.output.rstrip().endswith("a version folder; pass the dataset folder that holds it, .."), \
        refused.output
    assert packer("gc", "..", "--keep", "1", "--dry-run").exit_code == 0


def test_inspect_inside_a_version_whose_build_stopped_names_the_dataset_folder_to_gc(
        own: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    (own.second / "manifest.json").unlink()  # killed while publishing: the index is there, the manifest not
    monkeypatch.chdir(own.second)
    refused = packer("inspect", ".")
    assert refused.exit_code == 2, refused.output
    assert "remove it with `packer gc .. --keep N`" in refused.output, refused.output


# 2. a version's other JSON file is not a manifest, nor a damaged registry copy

@pytest.mark.parametrize("command", [["inspect"], ["verify"], ["report", "--output", "{tmp}/r.html"], ["diff"]])
def test_a_versions_leakage_json_is_not_a_manifest_and_names_its_version_folder(
        built: Built, tmp_path: Path, command: list[str]) -> None:
    leakage = built.first / "leakage.json"
    before = leakage.read_bytes()
    args = [command[0], leakage, *(a.format(tmp=tmp_path) for a in command[1:])]
    if command[0] == "diff":
        args = ["diff", built.second, leakage]
    refused = packer(*args)
    assert refused.exit_code == 2, refused.output  # a usage error, as _index.parquet is; not 5 (integrity)
    assert (f"{leakage}: not a manifest (a manifest is a manifest.json or a registry copy <version>.json); "
            f"pass its version folder {built.first}") in refused.output, refused.output
    assert "registry copy: copy" not in refused.output and "over it" not in refused.output
    assert leakage.read_bytes() == before


def test_a_manifest_copied_beside_its_version_files_still_reads_as_that_version(own: Built) -> None:
    copy = own.first / "pinned.json"
    shutil.copy(own.first / "manifest.json", copy)
    assert packer("verify", copy, "-q").exit_code == 0
    assert own.first.name in packer("inspect", copy).output


def test_only_a_registry_named_copy_is_told_to_be_restored_from_the_version_folder(own: Built, tmp_path: Path) -> None:
    registry = tmp_path / "manifests" / "photos"
    registry.mkdir(parents=True)
    cut = (own.first / "manifest.json").read_bytes()[:-40]  # cut short: not valid JSON
    for name in (f"{own.first.name}.json", "saved-by-hand.json"):
        (registry / name).write_bytes(cut)
    copy = packer("inspect", registry / f"{own.first.name}.json")
    assert copy.exit_code == 5, copy.output
    assert (f"this is a registry copy: copy the version folder's own manifest.json "
            f"(<output>/photos/{own.first.name}/manifest.json) over it") in copy.output
    other = packer("inspect", registry / "saved-by-hand.json")
    assert other.exit_code == 5, other.output
    assert "restore the manifest from the registry copy or rebuild" in other.output, other.output
    assert "this is a registry copy" not in other.output


# 3. the Bad samples section is marked Sensitive only where it lists raw paths

SENSITIVE = "Sensitive: local only, contains raw paths"


def test_a_pseudonymized_report_without_bad_samples_is_not_marked_as_holding_raw_paths(built: Built) -> None:
    html = (built.first / "report.html").read_text()
    assert (built.first / "bad_samples.jsonl").read_text() == ""  # every file packed
    assert "No bad samples: every input file was packed." in html
    assert SENSITIVE not in html
    assert str(built.folder / "raw") not in html


def test_a_pseudonymized_report_whose_bad_sample_file_is_gone_is_not_marked_as_holding_raw_paths(
        own: Built, tmp_path: Path) -> None:
    (own.first / "bad_samples.jsonl").unlink()
    written = packer("report", own.first, "--output", tmp_path / "r.html")
    assert written.exit_code == 0, written.output
    html = (tmp_path / "r.html").read_text()
    assert "bad_samples.jsonl is missing from the version folder" in html
    assert SENSITIVE not in html


def test_a_kept_phi_report_is_marked_sensitive_exactly_when_it_lists_a_raw_path(own: Built) -> None:
    from packer.htmlreport import render_html_report

    manifest = json.loads((own.first / "manifest.json").read_text())
    kept = {**manifest, "phi": {**manifest["phi"], "mode": "keep"}}
    assert SENSITIVE not in render_html_report(own.first, manifest=kept, quiet=True)  # nothing listed
    bad = own.folder / "raw" / "P00" / "img00.png"
    (own.first / "bad_samples.jsonl").write_text(json.dumps(
        {"path": str(bad), "sample_id": "x", "reason": "decode_error", "stage": "read", "message": "cut short"}) + "\n")
    html = render_html_report(own.first, manifest=kept, quiet=True)
    assert SENSITIVE in html and "img00.png" in html


# 4. packer locate says what a key that names no file is

def index_rows(version: Path) -> list[dict[str, Any]]:
    return pq.read_table(version / "_index.parquet").to_pylist()


def located(job: Path, *keys: str) -> dict[str, str]:
    ran = packer("locate", job, *keys)
    assert ran.exit_code == 0, ran.output
    return dict(line.split("\t") for line in ran.output.splitlines())


def test_locate_given_an_entity_id_lists_that_entitys_samples(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(built.folder)
    rows = index_rows(built.second)  # the version of the tree as it is now
    entity = rows[0]["entity_id"]
    samples = sorted(r["key"] for r in rows if r["entity_id"] == entity)
    assert entity.startswith("e-") and len(samples) >= 4  # tests/photo_jobs.py: four files an entity (P05: five)
    refused = packer("locate", "job.yaml", entity)
    assert refused.exit_code == 2, refused.output
    assert f"{entity}: an entity id of job.yaml, not a sample key" in refused.output, refused.output
    listed = refused.output.split("its samples: ")[1].split(" (")[0].split()
    assert sorted(listed) == samples
    files = located(Path("job.yaml"), *listed)
    assert len({Path(p).parent.name for p in files.values()}) == 1  # one entity: one P0N folder
    assert "another PHI key" not in refused.output


def test_locate_given_an_entity_id_of_no_file_says_it_is_one(built: Built) -> None:
    refused = packer("locate", built.folder / "job.yaml", "e-" + "0" * 20)
    assert refused.exit_code == 2
    assert "e-00000000000000000000: an entity id (e- and 20 hex digits), not a sample key" in refused.output


def test_locate_takes_a_sample_named_source_colon_key_as_a_finding_names_it(built: Built) -> None:
    key = index_rows(built.first)[0]["key"]
    plain = located(built.folder / "job.yaml", key)
    assert located(built.folder / "job.yaml", f"raw:{key}") == {f"raw:{key}": plain[key]}
    other = packer("locate", built.folder / "job.yaml", f"nosuchsource:{key}")
    assert other.exit_code == 2  # only the job's own source names are taken off


def test_locate_of_a_file_removed_since_the_build_names_that_cause(own: Built) -> None:
    job = own.folder / "job.yaml"
    keys = [r["key"] for r in index_rows(own.first)]
    gone_key, gone = next((k, p) for k, p in located(job, *keys).items() if p.endswith("P00/img00.png"))
    Path(gone).unlink()
    table = own.folder / "raw" / "labels.csv"
    table.write_text("".join(line for line in table.read_text().splitlines(keepends=True)
                             if not line.startswith("P00/img00.png,")))
    refused = packer("locate", job, gone_key)
    assert refused.exit_code == 2
    assert (f"{gone_key}: no file of {job} makes this sample key; it is the key of a file since removed from the "
            "job's sources") in refused.output, refused.output


# 5. gc keeps a version that a link of the dataset folder points at

def test_gc_keeps_the_version_a_link_in_the_dataset_folder_pins_and_counts_it_not(own: Built) -> None:
    (own.dataset / "prod").symlink_to(own.first.name, target_is_directory=True)
    planned = packer("gc", own.dataset, "--keep", "1", "--dry-run", "--json")
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert [v["folder"] for v in plan["keep"]] == [own.second.name, own.first.name] and plan["remove"] == []
    assert plan["pinned"] == [{"folder": own.first.name, "links": ["prod"]}]
    ran = packer("gc", own.dataset, "--keep", "1")
    assert ran.exit_code == 0, ran.output
    assert "keeping the 1 newest version(s)" in ran.output
    assert f"keep    {own.first.name}" in ran.output and "(kept: the link prod points at it; not counted)" in ran.output
    assert (own.dataset / "prod" / "manifest.json").is_file()  # the link still leads to a version
    assert packer("verify", own.dataset / "prod", "-q").exit_code == 0
    (own.dataset / "prod").unlink()  # unpinned: the next gc removes it
    assert packer("gc", own.dataset, "--keep", "1").exit_code == 0
    assert sorted(p.name for p in own.dataset.iterdir()) == [own.second.name]


def test_gc_keeps_a_version_pinned_through_a_chain_of_links_and_ignores_links_leading_elsewhere(
        own: Built, tmp_path: Path) -> None:
    (own.dataset / "prod").symlink_to(own.first.name, target_is_directory=True)
    (own.dataset / "current").symlink_to("prod", target_is_directory=True)  # current -> prod -> first
    (tmp_path / "elsewhere").mkdir()
    (own.dataset / "scratch").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    plan = json.loads(packer("gc", own.dataset, "--keep", "1", "--dry-run", "--json").output)
    assert plan["pinned"] == [{"folder": own.first.name, "links": ["current", "prod"]}]
    (own.dataset / "prod").unlink()  # prod, and current through it, now lead out of the dataset folder
    (own.dataset / "prod").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    plan = json.loads(packer("gc", own.dataset, "--keep", "1", "--dry-run", "--json").output)
    assert plan["pinned"] == [] and [v["folder"] for v in plan["remove"]] == [own.first.name]


def test_ls_lists_a_registry_folder_linked_in_under_another_name(built: Built, tmp_path: Path) -> None:
    """manifests/photos -> /nfs/registry/photos-2024 (a registry on shared storage linked in): the
    dataset is the one the link names; 5b3a7e5 took the target's name and found nothing."""
    shared = tmp_path / "nfs" / "photos-2024"
    shared.mkdir(parents=True)
    shutil.copy(built.second / "manifest.json", shared / f"{built.second.name}.json")
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "photos").symlink_to(shared)
    result = packer("ls", tmp_path / "manifests" / "photos")
    assert result.exit_code == 0, result.output
    assert built.second.name in result.output and "no manifests" not in result.output
