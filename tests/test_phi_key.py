"""Where the PHI key comes from: the job's key file and PACKER_PHI_KEY must agree, the build says
which it used (never the key), and ``packer key new`` makes a key that works as printed."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import PhiConfig
from packer.demo import render_ct_phantom, write_ct_slice
from packer.errors import ConfigError
from packer.phi import ENV_KEY, load_key

KEY_A = "a1" * 32
KEY_B = "b2" * 32


def fingerprint_of(key: str) -> str:
    """The manifest's key_fingerprint, computed here from its definition (sha256 over a domain tag)."""
    import hashlib

    return hashlib.sha256(b"packer-phi-key-fingerprint\x00" + key.encode()).hexdigest()[:16]


def ct_tree(root: Path) -> None:
    """Six CT slices of three patients, labelled, under ``root/ct``."""
    rng = np.random.default_rng(3)
    rows = ["path,label"]
    for i in range(6):
        rel = f"P{i % 3}/s{i}.dcm"
        write_ct_slice(root / "ct" / rel, patient_id=f"PAT{i % 3}", study_date="20240105",
                       pixels_hu=render_ct_phantom(rng, z=i / 6), instance_number=i + 1)
        rows.append(f"{rel},{('a', 'b')[i % 2]}")
    (root / "ct_labels.csv").write_text("\n".join(rows) + "\n")


def ct_job(tmp_path: Path, phi: dict[str, Any] | None) -> Path:
    raw = tmp_path / "raw"
    if not raw.exists():
        ct_tree(raw)
    doc: dict[str, Any] = {
        "name": "keys",
        "sources": [{"kind": "dicom", "root": "raw/ct", "labels": "raw/ct_labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
        "transform": {"dicom": {"windows": ["lung"], "size": [16, 16]}},
        "pack": {"format": "webdataset"},
        "output": "out",
    }
    if phi is not None:
        doc["phi"] = phi
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    return job


def build(job: Path, env_key: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"], env={ENV_KEY: env_key})
    return result.exit_code, result.output


def dataset_hash_in(output: str) -> str:
    return next(line.split()[1] for line in output.splitlines() if line.startswith("  dataset_hash "))


def built_with_two_keys(tmp_path: Path) -> tuple[Path, str, str, str, str]:
    """The CT job built twice into one output, with key A then key B: the job file, each build's
    output and the 12-character versions they made (old, new)."""
    job = ct_job(tmp_path, None)
    code, first = build(job, env_key=KEY_A)
    assert code == 0, first
    code, second = build(job, env_key=KEY_B)
    assert code == 0, second
    return job, first, second, dataset_hash_in(first)[:12], dataset_hash_in(second)[:12]

def manifest_of(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "out" / "keys").glob("*/manifest.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# load_key: each case in the library ------------------------------------------------------------

def test_key_file_alone_and_environment_alone_name_their_source(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "phi.key"
    key_file.write_text(KEY_A + "\n")
    monkeypatch.delenv(ENV_KEY, raising=False)
    from_file = load_key(PhiConfig(key_file=key_file))
    assert from_file is not None and from_file.key == KEY_A.encode()
    assert from_file.source == f"phi.key_file {key_file}"
    monkeypatch.setenv(ENV_KEY, KEY_B)
    from_env = load_key(PhiConfig())
    assert from_env is not None and from_env.key == KEY_B.encode()
    assert from_env.source == f"environment variable {ENV_KEY}"
    assert KEY_B not in repr(from_env)  # a logged record never shows the key
    assert load_key(PhiConfig(mode="keep", key_file=key_file)) is None


def test_the_same_key_in_both_places_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "phi.key"
    key_file.write_text(f"  {KEY_A}\n")  # whitespace around a key is not part of it
    monkeypatch.setenv(ENV_KEY, KEY_A)
    loaded = load_key(PhiConfig(key_file=key_file))
    assert loaded is not None and loaded.key == KEY_A.encode()
    assert str(key_file) in loaded.source and ENV_KEY in loaded.source


def test_different_keys_in_the_environment_and_the_key_file_are_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "phi.key"
    key_file.write_text(KEY_A + "\n")
    monkeypatch.setenv(ENV_KEY, KEY_B)
    with pytest.raises(ConfigError) as caught:
        load_key(PhiConfig(key_file=key_file))
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert f"environment variable {ENV_KEY} (fingerprint {fingerprint_of(KEY_B)})" in message
    assert f"phi.key_file {key_file} (fingerprint {fingerprint_of(KEY_A)})" in message
    assert f"unset {ENV_KEY}" in message and "remove phi.key_file" in message
    assert KEY_A not in message and KEY_B not in message


def test_an_empty_variable_counts_as_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "phi.key"
    key_file.write_text(KEY_A + "\n")
    monkeypatch.setenv(ENV_KEY, "")
    loaded = load_key(PhiConfig(key_file=key_file))
    assert loaded is not None and loaded.source == f"phi.key_file {key_file}"
    with pytest.raises(ConfigError, match="packer key new phi.key"):
        load_key(PhiConfig())


# packer build: the error and the summary ---------------------------------------------------------

def test_a_key_file_the_job_names_but_that_is_missing_is_made_at_that_path(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix names the job's own path, not a generic ``phi.key`` beside the shell."""
    monkeypatch.delenv(ENV_KEY, raising=False)
    missing = tmp_path / "keys" / "site.key"
    with pytest.raises(ConfigError, match=f"cannot read {missing} .*create it with: packer key new {missing} "):
        load_key(PhiConfig(key_file=missing))


def test_a_key_file_of_raw_bytes_is_a_config_error_that_says_to_make_a_text_key(tmp_path: Path) -> None:
    """`head -c 32 /dev/urandom > my.key`, a common way to make a secret, died with a
    UnicodeDecodeError traceback (exit 1): packer's keys are text."""
    (tmp_path / "my.key").write_bytes(bytes(range(200, 232)))
    code, output = build(ct_job(tmp_path, {"key_file": "my.key"}), env_key="")
    assert code == 2, output
    assert output.startswith(f"packer: error: {tmp_path / 'job.yaml'}: phi.key_file: {tmp_path / 'my.key'} is not "
                             "a text key"), output
    fix = re.search(r"packer key new --force (\S+)$", output.strip())
    assert fix is not None, output
    made = CliRunner().invoke(main, ["key", "new", "--force", fix.group(1)])
    assert made.exit_code == 0, made.output
    code, output = build(tmp_path / "job.yaml", env_key="")
    assert code == 0, output


def test_a_key_file_under_tilde_says_a_job_does_not_expand_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No path of a job expands ~, so `key_file: ~/k.key` is <job folder>/~/k.key; the fix said
    `packer key new <job folder>/~/k.key`, a folder named '~', not the home the author meant."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code, output = build(ct_job(tmp_path, {"key_file": "~/k.key"}), env_key="")
    assert code == 2, output
    assert f"cannot read {tmp_path / '~' / 'k.key'} " in output and "a job file does not expand ~" in output
    assert f"packer key new {tmp_path / '~'}" not in output
    assert output.strip().endswith(f"({tmp_path / 'home' / 'k.key'}, if that is the key you meant), or make a key "
                                   f"there with: packer key new {tmp_path / 'home' / 'k.key'}"), output


def test_build_refuses_two_different_keys_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "phi.key").write_text(KEY_A + "\n")
    code, output = build(ct_job(tmp_path, {"key_file": "phi.key"}), env_key=KEY_B)
    assert code == 2, output
    assert output.startswith(f"packer: error: {tmp_path / 'job.yaml'}: two different PHI keys: the environment "
                             "variable PACKER_PHI_KEY")
    assert f"phi.key_file {tmp_path / 'phi.key'}" in output
    assert not (tmp_path / "out" / "keys").exists() or not list((tmp_path / "out" / "keys").glob("*/manifest.json"))


def test_build_without_a_key_names_the_job_file_first(tmp_path: Path) -> None:
    """Every error about a job names its file first; the missing key's did not."""
    code, output = build(ct_job(tmp_path, None), env_key="")
    assert code == 2, output
    assert output.startswith(f"packer: error: {tmp_path / 'job.yaml'}: phi.mode is pseudonymize"), output
    assert "packer key new" in output


def test_the_missing_key_fix_works_as_pasted_from_another_folder(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A job under workflows/ run from the folder above: 'packer key new phi.key' made ./phi.key,
    and the job's 'key_file: phi.key' (relative to the job file) then did not find it."""
    job = ct_job(tmp_path / "workflows", None)
    monkeypatch.chdir(tmp_path)
    code, output = build(job, env_key="")
    assert code == 2 and "packer key new workflows/phi.key" in output, output
    made = CliRunner().invoke(main, ["key", "new", "workflows/phi.key"])
    assert made.exit_code == 0, made.output
    doc = yaml.safe_load(job.read_text())
    doc["phi"] = {"key_file": "phi.key"}
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, output = build(job, env_key="")
    assert code == 0, output


def test_the_short_key_fix_replaces_the_key_the_job_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A too-short key_file's fix said 'packer key new phi.key ... key_file: phi.key': from another
    folder that made ./phi.key, and the job, reading its own file, still failed."""
    job = ct_job(tmp_path / "sub", {"key_file": "short.key"})
    (tmp_path / "sub" / "short.key").write_text("abcd\n")
    monkeypatch.chdir(tmp_path)
    code, output = build(job, env_key="")
    assert code == 2 and "is 4 bytes" in output, output
    fix = re.search(r"replace it with: packer key new --force (\S+)", output)
    assert fix is not None, output
    made = CliRunner().invoke(main, ["key", "new", "--force", fix.group(1)])
    assert made.exit_code == 0, made.output
    code, output = build(job, env_key="")
    assert code == 0, output


def test_a_short_key_in_the_environment_says_how_to_set_a_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEY, "abcd")
    with pytest.raises(ConfigError, match=f"environment variable {ENV_KEY} is 4 bytes.*export {ENV_KEY}="):
        load_key(PhiConfig())


def test_build_summary_names_the_key_source_and_fingerprint_never_the_key(tmp_path: Path) -> None:
    (tmp_path / "phi.key").write_text(KEY_A + "\n")
    job = ct_job(tmp_path, {"key_file": "phi.key"})
    code, output = build(job, env_key="")
    assert code == 0, output
    assert manifest_of(tmp_path)["phi"]["key_fingerprint"] == fingerprint_of(KEY_A)
    assert (f"  phi key   from phi.key_file {tmp_path / 'phi.key'}; fingerprint {fingerprint_of(KEY_A)}"
            in output.splitlines())
    assert KEY_A not in output
    code, same = build(job, env_key=KEY_A)  # the same key in both places: the same dataset
    assert code == 0, same
    assert "(the same key is in PACKER_PHI_KEY)" in same and KEY_A not in same
    assert dataset_hash_in(same) == dataset_hash_in(output)


def test_build_summary_names_the_environment_when_it_holds_the_key(tmp_path: Path) -> None:
    code, output = build(ct_job(tmp_path, None), env_key=KEY_B)
    assert code == 0, output
    assert (f"  phi key   from environment variable PACKER_PHI_KEY; fingerprint {fingerprint_of(KEY_B)}"
            in output.splitlines())
    assert KEY_B not in output


def test_no_phi_key_line_when_ids_are_kept(tmp_path: Path) -> None:
    code, output = build(ct_job(tmp_path, {"mode": "keep"}), env_key=KEY_B)
    assert code == 0, output
    assert "phi key" not in output


# packer key new ---------------------------------------------------------------------------------

def test_key_new_writes_a_private_random_key_and_the_printed_job_line_builds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # paths as a user types them, relative to where they stand
    result = CliRunner().invoke(main, ["key", "new", "secrets/phi.key"])
    assert result.exit_code == 0, result.output
    key_file = tmp_path / "secrets" / "phi.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    text = key_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", text)
    lines = result.output.splitlines()
    assert f"  phi: {{key_file: {key_file}}}" in lines      # absolute: right from any job file's folder
    assert "  export PACKER_PHI_KEY=$(cat secrets/phi.key)" in lines
    assert "relative to the job file" in result.output
    assert "out of any repository" in result.output and "rebuilding a dataset needs the key" in result.output
    assert fingerprint_of(text.strip()) in result.output and text.strip() not in result.output
    # the printed line, pasted into a job in another folder than the one the command ran in, builds
    elsewhere = tmp_path / "workflows"
    elsewhere.mkdir()
    job = ct_job(elsewhere, yaml.safe_load(next(line for line in lines if line.startswith("  phi:")))["phi"])
    code, output = build(job, env_key="")
    assert code == 0, output
    assert f"phi key   from phi.key_file {key_file}; fingerprint {fingerprint_of(text.strip())}" in output
    again = CliRunner().invoke(main, ["key", "new", "secrets/other.key"])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "secrets" / "other.key").read_text() != text  # random, not derived


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_key_new_says_whether_git_would_track_the_key(tmp_path: Path) -> None:
    """Advice to add a key to .gitignore is right only where git would track it."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/keys/\n")
    ignored = CliRunner().invoke(main, ["key", "new", str(tmp_path / "keys" / "a.key")])
    assert ignored.exit_code == 0 and "git ignores it here" in ignored.output and ".gitignore" not in ignored.output
    tracked = CliRunner().invoke(main, ["key", "new", str(tmp_path / "b.key")])
    assert tracked.exit_code == 0 and "this git repository would track it: add it to .gitignore" in tracked.output


def test_key_new_never_overwrites_unless_forced(tmp_path: Path) -> None:
    key_file = tmp_path / "phi.key"
    key_file.write_text("the key of an existing dataset\n")
    key_file.chmod(0o644)
    refused = CliRunner().invoke(main, ["key", "new", str(key_file)])
    assert refused.exit_code == 2, refused.output
    assert refused.output.startswith(f"packer: error: {key_file} already exists;")
    assert "--force" in refused.output
    assert key_file.read_text() == "the key of an existing dataset\n"
    forced = CliRunner().invoke(main, ["key", "new", str(key_file), "--force"])
    assert forced.exit_code == 0, forced.output
    assert re.fullmatch(r"[0-9a-f]{64}\n", key_file.read_text())
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600  # not the old file's 0644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phi.key"]  # no temporary left behind



@pytest.mark.parametrize("under", ["k.key", "keys/k.key"], ids=["parent", "grandparent"])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_key_new_under_a_file_says_the_folder_is_a_file(tmp_path: Path, under: str, force: bool) -> None:
    """A FILE whose folder (or a folder above) is a file cannot be created: exit 2 naming that
    file, never "already exists" (nothing is there) nor a traceback (exit 1)."""
    blocker = tmp_path / "labels.csv"
    blocker.write_text("path,label\n")
    result = CliRunner().invoke(main, ["key", "new", str(blocker / under), *(["--force"] if force else [])])
    assert result.exit_code == 2, result.output
    assert f"{blocker} is a file, not a folder" in result.output
    assert "already exists" not in result.output and "Traceback" not in result.output
    assert blocker.read_text() == "path,label\n"

@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_key_new_under_a_link_that_leads_nowhere_names_the_link(tmp_path: Path, force: bool) -> None:
    """keys/ linked to a volume that is not mounted: it said "keys/k.key already exists; pass
    --force", of a file that is not there (and --force said the same)."""
    (tmp_path / "keys").symlink_to(tmp_path / "not-mounted" / "keys")
    result = CliRunner().invoke(main, ["key", "new", str(tmp_path / "keys" / "k.key"), *(["--force"] if force else [])])
    assert result.exit_code == 2, result.output
    link, leads_to = tmp_path / "keys", tmp_path / "not-mounted" / "keys"
    assert f"{link} is a link to {leads_to}, which does not exist" in result.output
    assert "already exists" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("target", ["/proc/packer-no-such-process/k.key", "/proc/packer-k.key"])
def test_key_new_where_the_file_system_takes_no_new_file_is_a_file_system_error(target: str) -> None:
    """/proc takes neither a new folder nor a new file: README exit 6, one message naming the file."""
    result = CliRunner().invoke(main, ["key", "new", target])
    assert result.exit_code == 6, result.output
    assert f"cannot write {target}: " in result.output and "cannot be created there" in result.output
    assert "choose another FILE" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_key_help_teaches_how_to_use_a_key() -> None:
    group = CliRunner().invoke(main, ["key", "--help"])
    assert group.exit_code == 0
    for needed in ("packer key new phi.key", "phi: {key_file: phi.key}", "export PACKER_PHI_KEY=$(cat phi.key)",
                   "relative to the job file", "out of the repository"):
        assert needed in group.output, needed
    new = CliRunner().invoke(main, ["key", "new", "--help"])
    assert new.exit_code == 0 and "0600" in new.output and "--force" in new.output


def test_a_build_with_another_key_says_so_and_diff_and_inspect_name_the_fingerprints(tmp_path: Path) -> None:
    """The wrong key file builds fine (exit 0) with every id and the split changed: the build
    warns, diff says why nothing matches, inspect shows each version's key fingerprint."""
    job, first, second, old, new = built_with_two_keys(tmp_path)
    assert (f"version(s) {old} were pseudonymized with the PHI key of fingerprint {fingerprint_of(KEY_A)}; this "
            f"build used {fingerprint_of(KEY_B)}") in second
    assert "pseudonymized with the PHI key" not in first
    versions = tmp_path / "out" / "keys"
    diff = CliRunner().invoke(main, ["diff", str(versions / old), str(versions / new)])
    assert f"PHI key fingerprints differ ({fingerprint_of(KEY_A)} vs {fingerprint_of(KEY_B)})" in diff.output
    shown = CliRunner().invoke(main, ["inspect", str(versions / new)])
    assert f"  phi           pseudonymize, dates shift; key fingerprint {fingerprint_of(KEY_B)}" in shown.output
    # the second build found every file of the first in the build cache under its new id (the same
    # inode: per-file reuse's move key) and re-keyed its samples; a fresh build with key B gives its bytes
    doc = yaml.safe_load(job.read_text())
    doc["output"] = "fresh"
    fresh_job = tmp_path / "fresh.yaml"
    fresh_job.write_text(yaml.safe_dump(doc, sort_keys=False))
    fresh = CliRunner().invoke(main, ["build", str(fresh_job), "--scheduler", "sync", "-q", "--cache-dir",
                                      str(tmp_path / "fresh-cache")], env={ENV_KEY: KEY_B})
    assert fresh.exit_code == 0, fresh.output
    assert dataset_hash_in(fresh.output) == dataset_hash_in(second)
