"""packer verify on real demo builds: fresh builds pass; flipped, truncated, deleted, unlisted
and re-sealed shards, and edited manifests, fail with exit 5 naming the shard (and sample)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.commands.verify import verify_command
from packer.config import load_job
from packer.errors import ConfigError
from packer.manifest import seal_manifest
from packer.pipeline.build import BuildOptions, build
from packer.verify import verify_dataset
from tests.helpers import demo_job_doc, write_job

FORMATS = ("webdataset", "parquet")
CLI = click.Group(commands=[verify_command])


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(CLI, ["verify", *map(str, args), "--quiet"])


@pytest.fixture(scope="module", params=FORMATS)
def built(request: pytest.FixtureRequest, demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh demo build (each format); tests copy it before changing anything."""
    tmp = tmp_path_factory.mktemp(f"verify-{request.param}")
    doc = demo_job_doc(demo_raw.root, tmp / "out", pack={"format": request.param, "max_samples": 32})
    result = build(load_job(write_job(tmp / "job", doc)), BuildOptions(scheduler="sync", quiet=True))
    return result.version_dir


@pytest.fixture()
def version(built: Path, tmp_path: Path) -> Path:
    """A copy of the built version to damage: plain file copies, writable (published shards are
    read-only, mode 0444; copyfile does not copy modes)."""
    return Path(shutil.copytree(built, tmp_path / built.name, copy_function=shutil.copyfile))


def manifest_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def shard_files(folder: Path) -> list[str]:
    return [s["file"] for split in manifest_of(folder)["splits"].values() for s in split["shards"]]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def pixel_byte(shard: Path) -> tuple[int, str]:
    """(file offset of a byte inside the first sample's pixel data, that sample's key), found with
    stock readers: tarfile member offsets, or the image cell's bytes located in the Parquet file."""
    if shard.suffix == ".tar":
        with tarfile.open(shard) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(".npy"))
        return member.offset_data + member.size - 1, member.name.split(".")[0]
    raw = shard.read_bytes()
    for row in pq.read_table(shard, columns=["key", "image"]).to_pylist():
        start = raw.find(row["image"])
        if start > 0 and raw.rfind(row["image"]) == start:  # a cell whose bytes occur once in the file
            return start + len(row["image"]) // 2, row["key"]
    raise AssertionError(f"{shard}: no image cell with unique bytes to flip")


def reseal(folder: Path) -> Path:
    """Record the shards' current sizes and sha256 in the manifest and re-seal it, and name the
    folder after the new version, as a forger would (a manifest in another version's folder is
    found without --deep); the folder's new path."""
    manifest = manifest_of(folder)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            data = (folder / shard["file"]).read_bytes()
            shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    body = {k: v for k, v in manifest.items() if k not in ("dataset_hash", "version", "created_at")}
    sealed = seal_manifest(body)
    (folder / "manifest.json").write_text(json.dumps(sealed, indent=2, sort_keys=True))
    return folder.rename(folder.parent / sealed["version"]) if folder.name == manifest["version"] else folder


def rewrite_tar(path: Path, edit: Callable[[str, bytes], tuple[str, bytes]]) -> None:
    """Rewrite every member of a tar shard through ``edit(name, data) -> (name, data)``."""
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            new_name, new_data = edit(name, data)
            info = tarfile.TarInfo(new_name)
            info.size = len(new_data)
            tar.addfile(info, io.BytesIO(new_data))
    path.write_bytes(out.getvalue())


def test_a_fresh_build_verifies_plain_and_deep(built: Path) -> None:
    manifest = manifest_of(built)
    for deep in ([], ["--deep"]):
        result = invoke(built, *deep)
        assert result.exit_code == 0, result.output
        assert "every check passed" in result.output
    hashed = [p for p in built.iterdir() if p.suffix in (".tar", ".parquet")]  # shards + _index + _splits
    report = verify_dataset(built / "manifest.json", deep=True)
    assert report.ok and report.problems == () and report.warnings == ()
    assert report.files_checked == len(hashed)
    assert report.bytes_checked == sum(p.stat().st_size for p in hashed)
    rows = pq.read_metadata(built / "_index.parquet").num_rows
    assert report.samples_checked == manifest["inputs"]["samples"] == rows
    payload = json.loads(CliRunner().invoke(CLI, ["verify", str(built), "--json", "-q"]).stdout)
    assert payload["ok"] is True and payload["problems"] == [] and payload["version"] == manifest["version"]


def test_a_flipped_pixel_byte_names_the_shard_and_the_sample_plain_and_deep(version: Path) -> None:
    shard = version / shard_files(version)[1]
    offset, key = pixel_byte(shard)
    flip(shard, offset)
    plain = invoke(version)
    assert plain.exit_code == 5, plain.output
    # the shard's sha256, then the sample whose per-sample checksum (_index.parquet's xxh3) changed
    assert f"{shard.name}: sha256" in plain.output and f"{shard.name} [{key}]: xxh3" in plain.output
    deep = invoke(version, "--deep")
    assert deep.exit_code == 5
    assert f"{shard.name} [{key}]" in deep.output
    report = verify_dataset(version, deep=True)
    assert {(p.shard, p.key) for p in report.problems} >= {(shard.name, None), (shard.name, key)}
    assert {p.shard for p in report.problems} == {shard.name}


def test_a_truncated_shard_fails_by_size(version: Path) -> None:
    shard = version / shard_files(version)[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    result = invoke(version)
    assert result.exit_code == 5
    assert f"{shard.name}: {shard.stat().st_size} bytes" in result.output and "truncated" in result.output
    assert invoke(version, "--deep").exit_code == 5


@pytest.mark.parametrize("built", ["webdataset"], indirect=True)
def test_a_truncated_shard_names_its_lost_samples_without_deep(version: Path) -> None:
    """README: "In a shard whose sha256 does not match, it also names each damaged sample". A
    truncated shard's sha256 does not match either, yet plain verify stopped at the size and
    named no sample: the cut one and the ones after it are named, the whole ones before are not."""
    from packer.shards.tar import scan_tar

    entry = manifest_of(version)["splits"]["train"]["shards"][0]
    shard = version / entry["file"]
    samples = scan_tar(shard).samples
    npy_at, npy_size = samples[3].members["npy"]
    shard.write_bytes(shard.read_bytes()[:npy_at + npy_size // 2])

    result = invoke(version, "--json")
    assert result.exit_code == 5
    problems = [p for p in json.loads(result.stdout)["problems"] if p["shard"] == shard.name]
    assert any("truncated" in p["message"] and p["key"] is None for p in problems)
    named = " ".join(f"{p['key']} {p['message']}" for p in problems)
    assert samples[3].key in named
    assert not any(s.key in named for s in samples[:3])
    assert f"{entry['samples'] - 3} samples (from {samples[3].key}) could not be reached" in named


@pytest.mark.parametrize("built", ["webdataset"], indirect=True)
def test_a_tar_cut_inside_a_sample_counts_only_the_whole_samples_before_it_and_names_the_cut_one(
        version: Path) -> None:
    """A shard truncated in the middle of its 4th sample's .npy: "the archive ends after 4 samples"
    (the loader), and verify --deep's "4 readable samples" and "lacks its .npy member", counted
    the cut sample as one; 3 samples are whole, and the 4th is cut short."""
    from packer.loader import ShardDataset
    from packer.shards.tar import scan_tar, stream_tar_samples

    entry = manifest_of(version)["splits"]["train"]["shards"][0]
    shard = version / entry["file"]
    cut = scan_tar(shard).samples[3]
    npy_at, npy_size = cut.members["npy"]
    shard.write_bytes(shard.read_bytes()[:npy_at + npy_size // 2])

    deep = invoke(version, "--deep", "--json")
    assert deep.exit_code == 5
    problems = {(p["key"], p["message"]) for p in json.loads(deep.stdout)["problems"] if p["shard"] == shard.name}
    assert (cut.key, f"the shard ends in member {cut.key}.npy (unexpected end of data) after 3 whole samples: this "
                     "sample is cut short; rebuild the version with `packer build` or restore the file from a good "
                     "copy") in problems
    assert (None, f"3 readable samples, the manifest records {entry['samples']}; rebuild the version with "
                  "`packer build` or restore the file from a good copy") in problems
    # every key the index lists past the cut says what to do too
    lost = [message for key, message in problems if message.startswith("listed in _index.parquet")]
    assert lost and all(message.endswith("restore the file from a good copy") for message in lost)
    assert not any("lacks" in message for _, message in problems)

    dataset = ShardDataset(version, "train", shuffle=False, on_error="skip", max_skipped=1000)
    list(dataset)
    skipped = [line for line in dataset.skipped_samples if line.startswith(shard.name)]
    assert len(skipped) == entry["samples"] - 3
    ends = (f"truncated: the archive ends after 3 of the manifest's {entry['samples']} samples (member "
            f"'{cut.key}.npy' runs past the end of the file: sample {cut.key} is cut short)")
    assert skipped[0].startswith(f"{shard.name}: sample {cut.key}: {ends}")
    assert all(ends in line for line in skipped)

    with shard.open("rb") as stream:  # as a remote shard is read: one stream, front to back
        items = list(stream_tar_samples(stream, entry["samples"]))
    assert [item[0] for item in items[:-1]] == [0, 1, 2]
    assert items[-1] == (f"unreadable tar stream in member '{cut.key}.npy' (unexpected end of data): "
                         f"sample {cut.key} is cut short")


@pytest.mark.parametrize("built", ["webdataset"], indirect=True)
@pytest.mark.parametrize("which", [0, 3])
def test_a_damaged_member_header_names_its_sample_only_not_the_intact_ones_after_it(version: Path, which: int) -> None:
    """The loader reads past a damaged tar member header from _index.parquet's offsets, losing
    only that sample; verify (plain and --deep) stopped at the header with tarfile and reported
    every sample after it as unreachable, and never the damaged one as such. It now reads on as
    the loader does and names only the sample whose header is damaged (sample 0: the file's first
    header, which tarfile refuses the file for; sample 3: one it ends the archive at quietly)."""
    from packer.shards.tar import scan_tar

    shard = version / shard_files(version)[0]
    samples = scan_tar(shard).samples
    flip(shard, samples[which].offset + 3)  # a byte of the member's name: the header's checksum fails
    for deep in ((), ("--deep",)):
        result = invoke(version, "--json", *deep)
        assert result.exit_code == 5, result.output
        problems = [p for p in json.loads(result.stdout)["problems"] if p["shard"] == shard.name]
        named = {p["key"] for p in problems if p["key"] is not None}
        assert named == {samples[which].key}, (deep, problems)
        text = " ".join(p["message"] for p in problems)
        assert "could not be reached" not in text and "not a readable tar file" not in text, text
        assert "cannot be read" in text and "checksum" in text, text


@pytest.mark.parametrize("built", ["parquet"], indirect=True)
def test_a_parquet_shard_with_bytes_appended_is_read_as_the_manifests_length_of_it(version: Path) -> None:
    """The loader reads a grown Parquet shard as the manifest's length of it (its index is at its
    end); verify opened the grown file, found no Parquet footer, and named every intact sample
    as unreachable (--deep: 'not a readable Parquet file', 0 readable samples). Only the size
    finding remains, as for a tar shard with bytes appended."""
    shard = version / shard_files(version)[0]
    shard.write_bytes(shard.read_bytes() + bytes(4096))
    for deep in ((), ("--deep",)):
        result = invoke(version, "--json", *deep)
        assert result.exit_code == 5, result.output
        problems = [p for p in json.loads(result.stdout)["problems"] if p["shard"] == shard.name]
        assert [p["key"] for p in problems] == [None], (deep, problems)
        assert "(grown)" in problems[0]["message"]


def test_a_deleted_shard_is_named_missing_and_an_unlisted_one_as_unexpected(version: Path) -> None:
    gone, other = shard_files(version)[-1], shard_files(version)[0]
    kept = (version / gone).read_bytes()
    (version / gone).unlink()
    stray = version / ("train-000099" + Path(other).suffix)
    shutil.copy(version / other, stray)
    result = invoke(version, "--deep")
    assert result.exit_code == 5
    assert f"{gone}: missing from {version}" in result.output
    assert f"{stray.name}: shard-like file the manifest does not list" in result.output
    assert "delete the 1 file(s) the manifest does not list (no build removes them)" in result.output
    # a stray file alone: deleting it is the fix; a rebuild, which never removes it, is not offered
    (version / gone).write_bytes(kept)
    alone = invoke(version)
    assert alone.exit_code == 5 and alone.output.rstrip().endswith(
        "1 integrity problem(s); delete the 1 file(s) the manifest does not list (no build removes them)"), alone.output


def test_a_missing_index_is_one_problem_deep_too_not_one_per_sample(version: Path) -> None:
    """--deep without _index.parquet named every sample "not in _index.parquet" (117 false
    problems drowning the one real one); the samples are still decoded and checked."""
    (version / "_index.parquet").unlink()
    report = verify_dataset(version, deep=True)
    assert [(p.shard, p.key) for p in report.problems] == [("_index.parquet", None)]
    assert "missing from" in report.problems[0].message
    assert report.samples_checked == manifest_of(version)["inputs"]["samples"]
    shard = version / shard_files(version)[0]
    flip(shard, pixel_byte(shard)[0])  # damage that decoding finds is still named without an index
    problems = verify_dataset(version, deep=True).problems
    assert {p.shard for p in problems} == {"_index.parquet", shard.name}
    assert not any("not in _index.parquet" in p.message for p in problems)


def test_a_stale_partial_is_a_warning_not_a_failure(version: Path) -> None:
    (version / f"{shard_files(version)[0]}.partial").write_bytes(b"half a shard")
    result = invoke(version)
    assert result.exit_code == 0, result.output
    assert "warn" in result.output and ".partial: a temporary of an interrupted write" in result.output


def test_an_edited_manifest_fails_its_dataset_hash(version: Path) -> None:
    manifest = manifest_of(version)
    manifest["splits"]["train"]["samples"] += 1
    (version / "manifest.json").write_text(json.dumps(manifest))
    result = invoke(version)
    assert result.exit_code == 5
    assert "dataset_hash" in result.output and "edited" in result.output
    assert "splits.train" in result.output


def test_an_unreadable_or_missing_manifest_of_a_version_exits_5(version: Path) -> None:
    (version / "manifest.json").write_text("{not json")
    assert invoke(version).exit_code == 5
    (version / "manifest.json").unlink()
    (version / "_index.parquet").unlink()  # with its index there, a build that stopped while publishing (below)
    result = invoke(version)
    assert result.exit_code == 5 and "cannot read the manifest" in result.output


def test_a_version_whose_build_stopped_while_publishing_exits_2_saying_so(version: Path) -> None:
    """_index.parquet and shards but no manifest.json (`packer ls`: INCOMPLETE) exited 5 saying
    "pass a manifest.json or the version folder holding it", which is what was passed. It is no
    version to check (README: exit 2); the message says what it is and how to finish or remove it."""
    (version / "manifest.json").unlink()
    for passed in (version, version / "manifest.json"):
        result = invoke(passed)
        assert result.exit_code == 2, result.output
        assert f"{passed}: a version whose build stopped while publishing it" in result.output
        assert "run the same `packer build` again to finish it" in result.output
        assert f"packer gc {version.parent} --keep N" in result.output
        assert "pass a manifest.json" not in result.output


def test_a_version_without_manifest_while_a_build_runs_is_not_called_killed(version: Path) -> None:
    """While a live build publishes (shards and index in place, its manifest.json last), verify, the
    loader and `packer ls` called the version one whose build stopped (killed, or a full disk) and
    offered to build again or gc it, both of which the build's lock refuses. The dataset folder's
    lock, held by the build, says it is being published."""
    from packer.files import folder_lock
    from packer.loader import ShardDataset
    from packer.versions import format_versions, list_versions

    (version / "manifest.json").unlink()
    with folder_lock(version.parent, "busy"):  # the build's exclusive lock on its dataset folder
        result = invoke(version)
        assert result.exit_code == 2, result.output
        assert f"{version}: no manifest.json yet, while a `packer build` (or gc) of this dataset runs" in result.output
        assert "killed, or a full disk" not in result.output
        with pytest.raises(ConfigError, match=("while a `packer build` \\(or gc\\) of this dataset runs .* wait for "
                                               "the build to end")):
            ShardDataset(version, "train")
        listed = format_versions(list_versions(version.parent))
        assert "NO MANIFEST YET" in listed and "INCOMPLETE:" not in listed, listed
    listed = format_versions(list_versions(version.parent))  # the lock gone, with no manifest: a stopped build's
    assert "INCOMPLETE:" in listed and "NO MANIFEST YET" not in listed, listed


def test_a_folder_that_is_not_a_version_exits_2_and_names_what_to_pass(version: Path, tmp_path: Path) -> None:
    """A newcomer's likely slip: the dataset folder instead of the version folder under it."""
    dataset = tmp_path / "demo"
    shutil.copytree(version, dataset / version.name)
    result = invoke(dataset)
    assert result.exit_code == 2, result.output
    assert (f"it holds the version(s) {version.name} (oldest first); pass one of them, e.g. the newest, "
            f"{dataset / version.name}") in result.output
    assert "restore" not in result.output
    shard = next((dataset / version.name).glob("train-*"))
    result = invoke(shard)
    assert result.exit_code == 2 and f"pass its version folder {dataset / version.name}" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(empty)
    assert result.exit_code == 2 and "no manifest.json and no dataset version here" in result.output


def test_deep_checks_content_independently_of_resealed_shard_hashes(version: Path) -> None:
    """Change a sample's pixels, then forge the manifest: hashes pass, the index sha256 does not."""
    shard = version / shard_files(version)[0]
    offset, key = pixel_byte(shard)
    flip(shard, offset)
    version = reseal(version)
    shard = version / shard.name
    plain = invoke(version)
    assert plain.exit_code == 0, plain.output
    deep = invoke(version, "--deep")
    assert deep.exit_code == 5
    assert f"{shard.name} [{key}]" in deep.output and "_index.parquet records" in deep.output


def _relabel(name: str, data: bytes) -> tuple[str, bytes]:
    return name, (b"9" if name.endswith(".cls") else data)


def _unsafe(name: str, data: bytes) -> tuple[str, bytes]:
    return ("../" + name if name.endswith(".json") else name), data


def _retype(name: str, data: bytes) -> tuple[str, bytes]:
    if not name.endswith(".npy"):
        return name, data
    buffer = io.BytesIO()
    np.save(buffer, np.load(io.BytesIO(data)).astype(np.float32))
    return name, buffer.getvalue()


@pytest.mark.parametrize("built", ["webdataset"], indirect=True)
@pytest.mark.parametrize(("edit", "expected"), [
    (_relabel, "label index 9 is out of range of label_map"),
    (_unsafe, "unsafe member name '../"),
    (_retype, "dtype float32, sample_schema says uint8"),
], ids=["label", "unsafe-name", "dtype"])
def test_deep_names_forged_tar_contents(version: Path, edit: Callable[[str, bytes], tuple[str, bytes]],
                                        expected: str) -> None:
    shard = version / shard_files(version)[0]
    rewrite_tar(shard, edit)
    version = reseal(version)
    shard = version / shard.name
    assert invoke(version).exit_code == 0
    result = invoke(version, "--deep")
    assert result.exit_code == 5
    assert expected in result.output and shard.name in result.output


@pytest.fixture(scope="module")
def flip_target(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(shutil.copytree(built, tmp_path_factory.mktemp("flip") / built.name, copy_function=shutil.copyfile))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_flipped_byte_in_any_shard_is_caught(flip_target: Path, data: st.DataObject) -> None:
    shards = shard_files(flip_target)
    name = data.draw(st.sampled_from(shards), label="shard")
    path = flip_target / name
    offset = data.draw(st.integers(0, path.stat().st_size - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    original = path.read_bytes()
    changed = bytearray(original)
    changed[offset] ^= 1 << bit
    path.write_bytes(bytes(changed))
    try:
        report = verify_dataset(flip_target)
        assert not report.ok
        # the shard's sha256, and where the flip is in a sample, that sample (or those it hides) by name
        assert {p.shard for p in report.problems} == {name} and report.problems[0].key is None
        assert "sha256" in report.problems[0].message
    finally:
        path.write_bytes(original)
    assert verify_dataset(flip_target).ok


def test_verify_has_help() -> None:
    result = CliRunner().invoke(CLI, ["verify", "--help"])
    assert result.exit_code == 0 and "--deep" in result.output
    assert len(verify_command.help or "") > 40
