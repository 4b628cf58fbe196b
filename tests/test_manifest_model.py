"""The one Manifest model: read_manifest strict and lenient, local, file:// and fsspec URLs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import fsspec
import pytest
from loader_fixtures import build_dataset

from packer.errors import ConfigError, IntegrityError
from packer.files import canonical_json
from packer.loader.readers import load_split
from packer.manifest import ShardEntry, read_dataset_hash, read_manifest, resolve_manifest_path
from packer.verify import verify_dataset


@pytest.fixture
def version(tmp_path: Path) -> Path:
    """A version folder: two tar shards (5 + 3 samples) and a sealed manifest."""
    return build_dataset(tmp_path / "v", shard_sizes=(5, 3)).parent


def edit(folder: Path, change: Any) -> dict[str, Any]:
    """Apply ``change(manifest)`` to the folder's manifest.json without re-sealing it."""
    doc = json.loads((folder / "manifest.json").read_text())
    change(doc)
    (folder / "manifest.json").write_text(json.dumps(doc))
    return doc


def test_a_strict_read_returns_the_manifest_and_its_shards(version: Path) -> None:
    doc = json.loads((version / "manifest.json").read_text())
    for location in (version, version / "manifest.json", str(version)):
        manifest = read_manifest(location)
        assert manifest.data == doc and manifest.path == version / "manifest.json"
        assert manifest.location == str(version / "manifest.json") and manifest.problems == ()
    # the hash, computed here from its definition: sha256 of the canonical JSON without three fields
    body = {k: v for k, v in doc.items() if k not in ("created_at", "version", "dataset_hash")}
    assert manifest.content_hash == hashlib.sha256(canonical_json(body)).hexdigest() == doc["dataset_hash"]
    assert not manifest.problems and manifest.version == doc["dataset_hash"][:12]
    shards = [ShardEntry(s["file"], (version / s["file"]).stat().st_size,
                         hashlib.sha256((version / s["file"]).read_bytes()).hexdigest(), s["samples"])
              for s in doc["splits"]["train"]["shards"]]
    assert manifest.shards("train") == tuple(shards) and [s.samples for s in shards] == [5, 3]
    assert manifest.locate(shards[1].file) == version / "train-000001.tar"
    assert (manifest.format, manifest.label_map, manifest.sample_schema["shape"]) == (
        "webdataset", {"c0": 0, "c1": 1, "c2": 2}, [1, 4, 4])


def test_an_edited_manifest_fails_a_strict_read_and_is_a_warning_of_a_lenient_one(version: Path) -> None:
    edit(version, lambda doc: doc["inputs"].update(files=99))  # in schema, but no longer what was hashed
    with pytest.raises(IntegrityError, match="dataset_hash does not match the manifest's content.*edited"):
        read_manifest(version)
    lenient = read_manifest(version, strict=False)
    assert [p.kind for p in lenient.problems] == ["dataset_hash"] and lenient.content_hash != lenient.dataset_hash
    assert lenient.data["inputs"]["files"] == 99
    assert lenient.warnings == (f"{version / 'manifest.json'}: {lenient.problems[0].detail}",)
    assert read_manifest(version, check_hash=False).content_hash is None
    assert read_dataset_hash(version) is None
    # the loader refuses it too, as the README says: an edited label_map would deliver other classes
    with pytest.raises(IntegrityError, match="dataset_hash does not match the manifest's content.*edited"):
        load_split(version, "train")
    report = verify_dataset(version)
    assert not report.ok and any("dataset_hash does not match" in p.message for p in report.problems)


def test_a_schema_violation_names_the_field_and_what_was_expected(version: Path) -> None:
    edit(version, lambda doc: doc["splits"]["train"]["shards"][1].update(sha256="not-hex"))
    with pytest.raises(IntegrityError, match=r"manifest field splits/train/shards/1/sha256: 'not-hex' does not "
                                             r"match '\^\[0-9a-f\]\{64\}\$'"):
        read_manifest(version, check_hash=False)
    lenient = read_manifest(version, strict=False)
    assert [p.kind for p in lenient.problems] == ["schema", "dataset_hash"]
    assert lenient.problems[0].detail.startswith("manifest field splits/train/shards/1/sha256:")
    with pytest.raises(IntegrityError, match="splits/train/shards/1/sha256"):
        load_split(version, "train")


def reseal(folder: Path, change: Any) -> dict[str, Any]:
    """Apply ``change(manifest)`` and seal the result as a build does (dataset_hash over the content)."""
    from packer.manifest import compute_dataset_hash

    def sealed(doc: dict[str, Any]) -> None:
        change(doc)
        doc["dataset_hash"] = compute_dataset_hash(doc)
        doc["version"] = doc["dataset_hash"][:12]
    return edit(folder, sealed)


def add_a_field_to_every_shard(doc: dict[str, Any]) -> None:
    """What a newer packer writes: one more optional field, format_version left at 1 (as content_key came)."""
    for shard in doc["splits"]["train"]["shards"]:
        shard["compression"] = "none"


def test_a_sealed_manifest_of_another_packer_is_named_so_with_the_upgrade_fix_not_called_damaged(
        version: Path) -> None:
    """A manifest whose content still hashes to its dataset_hash but carries a field this packer's
    schema does not know was written by another packer: restoring it from the registry would give
    the same bytes, so verify, inspect and report name the field, quote its packer_version and say
    to use that packer or upgrade, never "damaged"/"restore"; verify's closing line too."""
    from click.testing import CliRunner

    from packer.cli import main

    reseal(version, lambda doc: (add_a_field_to_every_shard(doc), doc.update(packer_version="0.2.0")))
    with pytest.raises(IntegrityError, match=r"manifest field splits/train/shards/\d: Additional properties .*"
                                             r"'compression' was unexpected.*written by packer 0\.2\.0 \(its "
                                             r"packer_version; this is packer 0\.1\.0\).*upgrade packer") as err:
        read_manifest(version)
    assert "damaged" not in str(err.value) and "restore" not in str(err.value)
    assert [p.kind for p in read_manifest(version, strict=False).problems] == ["packer_version"]
    report = verify_dataset(version)
    assert not report.ok and report.fix is not None and "upgrade packer" in report.fix
    for command in ("verify", "inspect", "report"):
        done = CliRunner().invoke(main, [command, str(version)])
        assert done.exit_code == 5, done.output
        assert "upgrade packer" in done.output and "0.2.0" in done.output, done.output
        assert "damaged" not in done.output and "restore" not in done.output, done.output
    assert not (version / "report.html").exists()
    # the same field added by hand, not sealed: damaged, as ever (the schema is not loosened for it)
    edit(version, lambda doc: doc.update(packer_version="0.1.0"))
    problems = read_manifest(version, strict=False).problems
    assert [p.kind for p in problems] == ["schema", "dataset_hash"]
    assert problems[0].detail.endswith("the manifest is damaged: restore the manifest from the registry copy or "
                                       "rebuild")
    done = CliRunner().invoke(main, ["verify", str(version)])
    assert done.exit_code == 5 and "restore the named files" in done.output, done.output


def test_a_newer_format_version_is_no_file_to_restore(version: Path) -> None:
    """format_version 2, sealed: verify's closing line gives the upgrade, not "restore the named files"."""
    from click.testing import CliRunner

    from packer.cli import main

    reseal(version, lambda doc: doc.update(format_version=2))
    done = CliRunner().invoke(main, ["verify", str(version)])
    assert done.exit_code == 5, done.output
    assert "format_version 2; this packer reads version 1: upgrade packer" in done.output
    assert "restore" not in done.output, done.output


def test_report_of_a_manifest_it_cannot_read_exits_5_naming_why(version: Path) -> None:
    """packer report --help: exit 5 when the manifest cannot be read; a manifest of the wrong shape
    (splits no object) wrote a report of nothing, or crashed with a traceback."""
    from click.testing import CliRunner

    from packer.cli import main

    for change, expected in ((lambda doc: doc.update(splits=7), "manifest field splits: 7 is not of type 'object'"),
                             (lambda doc: doc.update(format_version=2), "format_version 2")):
        reseal(version, change)
        done = CliRunner().invoke(main, ["report", str(version)])
        assert done.exit_code == 5 and done.exception is None or isinstance(done.exception, SystemExit), done.output
        assert expected in done.output and "no report was written" in done.output, done.output
        assert not (version / "report.html").exists()


def test_a_file_outside_the_version_folder_and_a_newer_format_are_refused_with_their_reason(version: Path) -> None:
    edit(version, lambda doc: doc["splits"]["train"]["shards"][0].update(file="../../etc/x.tar"))
    with pytest.raises(IntegrityError, match=r"splits\.train\.shards\[0\]\.file '\.\./\.\./etc/x\.tar' is not a "
                                             "plain path inside the version folder"):
        read_manifest(version)
    edit(version, lambda doc: doc.update(format_version=2))
    with pytest.raises(IntegrityError, match="format_version 2; this packer reads version 1: upgrade packer"):
        read_manifest(version)
    assert [p.kind for p in read_manifest(version, strict=False).problems][:2] == ["format_version", "unsafe_file"]


@pytest.mark.parametrize(("content", "expected"), [
    (None, "cannot read the manifest"), (b"{not json", "not valid JSON"), (b"[1, 2]", "a manifest is a JSON object"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_an_unreadable_manifest_raises_in_either_mode(version: Path, content: bytes | None, expected: str) -> None:
    if content is None:
        (version / "manifest.json").unlink()
        (version / "_index.parquet").unlink()  # with it there, a build that stopped while publishing: a usage error
    else:
        (version / "manifest.json").write_bytes(content)
    for strict in (True, False):
        with pytest.raises(IntegrityError, match=expected):
            read_manifest(version, strict=strict)
    assert read_dataset_hash(version) is None


def test_a_path_that_is_plainly_not_a_version_is_a_usage_error_that_says_what_to_pass(version: Path) -> None:
    """The dataset folder, a shard, a registry folder, an empty folder or a typo: ConfigError
    (exit 2) naming what to pass instead, never "restore the manifest" (exit 5)."""
    dataset = version.parent
    listed = (f"a dataset folder, not a version: it holds the version\\(s\\) {version.name} \\(oldest first\\); "
              "pass one of them")
    with pytest.raises(ConfigError, match=f"{listed}, e.g. the newest, {version}"):
        read_manifest(dataset)
    # the README's placeholder taken literally, or a version that is not there, beside versions named as
    # a build names them (12 hex digits): the versions that are
    named = dataset / "0123456789ab"
    shutil.copytree(version, named)
    versions = f"{version.name}, {named.name}|{named.name}, {version.name}"  # the same created_at: either order
    for missing in (dataset / "<version>", dataset / "fedcba987654" / "manifest.json"):
        with pytest.raises(ConfigError, match=f"{missing}: no such file or folder; {dataset} is a dataset folder, "
                                              f"not a version: it holds the version\\(s\\) ({versions})"):
            read_manifest(missing)
    shutil.rmtree(named)
    # a pinned link (README: prod -> <version>) is no version of its own, never offered as "the newest"
    (dataset / "prod").symlink_to(version.name)
    with pytest.raises(ConfigError, match=(f"it holds the version\\(s\\) {version.name} \\(oldest first\\) and the "
                                           f"link\\(s\\) prod -> {version.name}; pass one of them, e.g. the newest, "
                                           f"{version}$")):
        read_manifest(dataset)
    (dataset / "prod").unlink()
    # versions kept elsewhere and linked in (another disk, another team's): named as links, offered to open
    elsewhere = dataset.parent / "elsewhere"
    elsewhere.mkdir()
    kept = elsewhere / version.name
    version.rename(kept)
    link = dataset / "375dba187d89"  # linked in under its version's name, as a build names it
    link.symlink_to(kept)
    for given in (dataset, dataset / "fedcba987654"):
        with pytest.raises(ConfigError, match=(f"it holds no version of its own but the link\\(s\\) {link.name} -> "
                                               f"{kept}; pass one of them, e.g. {link}$")):
            read_manifest(given)
    link.unlink()
    kept.rename(version)
    # links of other names to folders with manifests (a test run's basetemp, pytest's '...current' links) make
    # no dataset folder: a missing path beside them gets the plain message, not a list of them
    (dataset / "runcurrent").symlink_to(version)
    with pytest.raises(ConfigError, match="fedcba987654: no such file or folder; pass a version folder"):
        read_manifest(dataset / "fedcba987654")
    (dataset / "runcurrent").unlink()
    shard = next(version.glob("*.tar"))
    with pytest.raises(ConfigError, match=f"not a manifest .*; pass its version folder {version}$"):
        read_manifest(shard)
    registry = dataset.parent / "registry"
    registry.mkdir()
    (registry / "abc.json").write_bytes((version / "manifest.json").read_bytes())
    with pytest.raises(ConfigError, match="it holds abc.json: pass one of those files"):
        read_manifest(registry)
    assert read_manifest(registry / "abc.json").data == read_manifest(version).data
    empty = dataset.parent / "empty"
    empty.mkdir()
    for nowhere in (empty, dataset.parent / "missing", version / "typo.json"):
        with pytest.raises(ConfigError, match="pass a version folder .* or its manifest.json"):
            read_manifest(nowhere)
    assert read_dataset_hash(empty) is None and read_dataset_hash(dataset) is None


def fail_the_build_of(version: Path, created_at: str) -> None:
    """Make ``version`` what a build over max_bad_fraction leaves (exit 3, kept for its report)."""
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["created_at"] = created_at
    manifest["bad_samples"].update(total=manifest["inputs"]["files"], fraction=1.0, max_fraction=0.01)
    (version / "manifest.json").write_text(json.dumps(manifest))


def test_a_dataset_folder_suggests_the_newest_version_that_is_not_a_failed_build(version: Path) -> None:
    """"e.g. the newest" named a failed build's version, which a loader then refused (exit 2):
    the suggestion is the newest one a loader takes, and where none is the message says so."""
    dataset = version.parent
    failed = dataset / "ffffffffffff"
    shutil.copytree(version, failed)
    fail_the_build_of(failed, "2999-01-01T00:00:00Z")  # the newest
    with pytest.raises(ConfigError, match=f"e.g. the newest that is not a failed build, {version} ") as raised:
        read_manifest(dataset)
    assert str(failed) not in str(raised.value)
    fail_the_build_of(version, "2000-01-01T00:00:00Z")
    with pytest.raises(ConfigError, match="each is a failed build's version .*build again for a version to train on"):
        read_manifest(dataset)


def test_a_version_folder_without_its_manifest_stays_a_damaged_version(version: Path) -> None:
    (version / "manifest.json").unlink()
    (version / "_index.parquet").unlink()  # with it there, a build that stopped while publishing (below)
    for location in (version, version / "manifest.json"):
        assert resolve_manifest_path(location) == version / "manifest.json"
        with pytest.raises(IntegrityError, match="cannot read the manifest"):
            read_manifest(location)


def test_a_version_whose_build_stopped_while_publishing_is_a_usage_error(version: Path) -> None:
    """Index and shards, no manifest: `packer ls` calls it INCOMPLETE, not a dataset, so reading it
    is a usage error saying so, not an integrity failure asking for the folder that was passed."""
    (version / "manifest.json").unlink()
    for location in (version, version / "manifest.json"):
        with pytest.raises(ConfigError, match="a version whose build stopped while publishing it"):
            resolve_manifest_path(location)


def test_a_damaged_registry_copy_is_restored_from_the_version_not_from_itself(version: Path) -> None:
    """An edited registry copy said "restore the manifest from the registry copy": the broken file
    itself. Its fix is the version folder's own manifest.json; a version's manifest keeps its fix."""
    manifest = json.loads((version / "manifest.json").read_text())
    copy = version.parent.parent / "registry" / manifest["name"] / f"{manifest['version']}.json"
    copy.parent.mkdir(parents=True)
    manifest["inputs"]["samples"] += 1  # edited: the copy no longer hashes to its dataset_hash
    copy.write_text(json.dumps(manifest))
    own = ("copy the version folder's own manifest.json "
           f"\\(<output>/{manifest['name']}/{manifest['version']}/manifest.json\\)")
    [problem] = read_manifest(copy, strict=False).problems
    assert problem.kind == "dataset_hash" and "from the registry copy" not in problem.detail
    with pytest.raises(IntegrityError, match=f"edited after the build; this is a registry copy: {own} over it"):
        read_manifest(copy)
    copy.write_text("{not json")
    with pytest.raises(IntegrityError, match=f"not valid JSON .*; this is a registry copy: {own}"):
        read_manifest(copy)
    (version / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="restore the manifest from the registry copy or rebuild"):
        read_manifest(version)


def test_file_urls_are_local_paths(version: Path) -> None:
    local = read_manifest(version)
    for url in (f"file://{version}", f"file://{version}/manifest.json"):
        manifest = read_manifest(url)
        assert (manifest.data, manifest.path, manifest.location) == (local.data, local.path, local.location)
    assert load_split(f"file://{version}", "train").shards == load_split(version, "train").shards


def test_an_fsspec_url_is_read_through_the_store(version: Path) -> None:
    store = fsspec.filesystem("memory")
    base = "memory://packer-test-manifest/demo/v1"
    for path in version.iterdir():
        store.pipe(f"{base}/{path.name}", path.read_bytes())
    try:
        manifest = read_manifest(base)  # a URL not ending in .json is the version folder
        assert manifest.data == read_manifest(version).data and manifest.path is None
        assert manifest.location == f"{base}/manifest.json" and manifest.folder == base
        assert manifest.locate("train-000000.tar") == f"{base}/train-000000.tar"
        info = load_split(f"{base}/manifest.json", "train")
        assert [s.url for s in info.shards] == [f"{base}/train-000000.tar", f"{base}/train-000001.tar"]
        with pytest.raises(IntegrityError, match="cannot read the manifest \\(not found\\)"):
            read_manifest(f"{base}/missing.json")
        # a URL where nothing is: a usage error (exit 2), as a wrong local path is, for verify too
        for wrong in ("memory://packer-test-manifest/demo/nothing", "memory://no-such-place/v/manifest.json"):
            with pytest.raises(ConfigError, match="holds no file; pass a version folder"):
                read_manifest(wrong)
            with pytest.raises(ConfigError, match="holds no file"):
                verify_dataset(wrong)
    finally:
        store.rm(base, recursive=True)


def test_the_readmes_dataset_hash_recipe_reproduces_the_hash_with_non_ascii_names() -> None:
    """The README and the manifest schema gave the recipe without its encoding: json.dumps'
    default escapes 'é' as \\u00e9, and a table's non-ASCII label then hashed otherwise."""
    import re

    from packer.manifest import compute_dataset_hash, seal_manifest

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    recipe = re.search(r"i\.e\. `(json\.dumps\(content, [^`]+)`", readme)
    assert recipe is not None, "the README's dataset_hash recipe moved"
    sealed = seal_manifest({"label_map": {"pneumonía": 0, "正常": 1}, "name": "ñ", "counts": [1, 2.5]})
    content = {k: v for k, v in sealed.items() if k not in ("created_at", "version", "dataset_hash")}
    digest = hashlib.sha256(eval(recipe.group(1), {"json": json, "content": content})).hexdigest()  # noqa: S307
    assert digest == sealed["dataset_hash"] == compute_dataset_hash(sealed)
