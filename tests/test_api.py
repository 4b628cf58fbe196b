"""packer from Python: ``packer.build``, ``packer.validate`` and ``packer.open`` give what the
command line gives (the same dataset, the same report, the same typed errors and exit codes),
and ``import packer`` stays cheap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.config import job_from_mapping
from packer.errors import BadFractionError, ConfigError, FileSystemError, IntegrityError, LeakageError, PackerError
from packer.manifest import Manifest
from tests.helpers import REPO
from tests.test_cli_frictions import photo, photo_job
from tests.test_datacheck import base_rows, entities_in_different_splits, image_job
from tests.test_datacheck import photo as textured

ENTITY_SPLIT = {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 3}


def photos(count: int, *, bad: int = 0) -> list[tuple[str, Any, str]]:
    """``count`` photos of ``count // 2`` entities, then ``bad`` zero-byte files."""
    rows: list[tuple[str, Any, str]] = [(f"p{i:02d}.png", photo(i), f"E{i // 2:02d}") for i in range(count)]
    return rows + [(f"z{i}.png", None, f"Z{i}") for i in range(bad)]


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_import_packer_loads_no_job_parser_no_dask_no_torch() -> None:
    """Orchestrators import packer in every task process: the import must not pull the pipeline in,
    and naming packer.build loads the API, not dask or torch (they load when a build runs)."""
    code = ("import sys, packer\n"
            "first = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'torch', 'numpy')"
            " or m in ('packer.config', 'packer.api'))\n"
            "assert packer.build is packer.api.build and packer.open is packer.api.open\n"
            "then = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'torch'))\n"
            "print(first, then)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []"


def test_a_job_file_a_dict_and_the_command_line_build_the_same_dataset(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    job = photo_job(tmp_path, photos(12), split=ENTITY_SPLIT)  # relative paths: raw/, out
    built = cli("build", str(job), "--scheduler", "sync", "-q", "--no-report")
    assert built.exit_code == 0, built.output
    (manifest_file,) = (tmp_path / "out" / "photos").glob("*/manifest.json")
    on_disk = json.loads(manifest_file.read_text())

    from_file = packer.build(job, scheduler="sync", progress=False, report=False)
    assert isinstance(from_file, Manifest)
    assert from_file.dataset_hash == on_disk["dataset_hash"]
    assert from_file.version == on_disk["dataset_hash"][:12]
    assert from_file.folder == manifest_file.parent and from_file.path == manifest_file
    assert {s: e["samples"] for s, e in from_file.splits.items()} == {
        s: e["samples"] for s, e in on_disk["splits"].items()}
    assert sum(e["samples"] for e in from_file.splits.values()) == 12
    assert from_file.label_map == {"a": 0, "b": 1}

    # the same job as the mapping its YAML parses to, its paths as path objects and relative to base_dir
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["root"] = Path("raw")
    doc["transform"]["image"]["size"] = (32, 32)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a relative path in a mapping is relative to base_dir, not to the current folder
    from_dict = packer.build(doc, base_dir=tmp_path, scheduler="sync", progress=False, report=False)
    assert from_dict.dataset_hash == on_disk["dataset_hash"] and from_dict.path == manifest_file
    assert not (elsewhere / "out").exists()


def test_progress_is_printed_as_the_command_prints_it_and_silenced_by_progress_false(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    job = photo_job(tmp_path, photos(6), split=ENTITY_SPLIT)
    packer.validate(job, scheduler="sync", progress=False)
    quiet = capfd.readouterr()
    packer.validate(job, scheduler="sync")
    loud = capfd.readouterr()
    # warnings (this split misses its ratios: 3 entities) are printed either way, progress only when asked,
    # where the command prints them: the first line on stdout, the progress lines and warnings on stderr
    assert quiet.out == "" and quiet.err
    assert all(line.startswith("packer: warning: ") for line in quiet.err.splitlines())
    assert loud.out.startswith("packer: photos: 6 input files")
    assert re.search(r"process: 6/6 files", loud.err) and quiet.err in loud.err, loud.err


def test_validate_returns_what_packer_validate_json_writes(tmp_path: Path) -> None:
    first, second = entities_in_different_splits(5)
    copy = textured(777)
    rows = [*base_rows(12), ("a/one.png", copy, "a", first), ("b/two.png", copy, "b", second)]
    job = image_job(tmp_path, rows, duplicates="fail")
    ran = cli("validate", str(job), "--scheduler", "sync", "-q", "--json", str(tmp_path / "cli.json"))
    assert ran.exit_code == 4, ran.output
    written = json.loads((tmp_path / "cli.json").read_text())

    result = packer.validate(job, scheduler="sync", progress=False)
    assert result.report == written
    assert (result.exit_code, result.passed) == (4, False)
    assert result.summary() in ran.output  # the summary the command printed
    exact = result.findings["exact_duplicates_across_splits"]
    assert [f for f in exact] == written["audit"]["rules"]["exact_duplicates_across_splits"]["findings"]
    assert {s["path"] for s in exact[0]["samples"]} == {"a/one.png", "b/two.png"}
    assert set(result.findings) == set(written["audit"]["rules"])
    result.write_json(tmp_path / "api.json")
    assert (tmp_path / "api.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    # a folder names no file: a usage error (exit 2), as --json DIR is on the command line, not a refused write
    for write, name in ((result.write_json, "write_json"), (result.write_junit, "write_junit")):
        with pytest.raises(ConfigError, match=f"is a folder; give {name} the path of a file to write"):
            write(tmp_path)
    with pytest.raises(LeakageError) as raised:
        result.check()
    assert raised.value.exit_code == 4 and "exact_duplicates_across_splits (1)" in str(raised.value)


def test_a_clean_check_passes_and_counts_every_file(tmp_path: Path) -> None:
    result = packer.validate(photo_job(tmp_path, photos(8, bad=0), split=ENTITY_SPLIT), scheduler="sync",
                             progress=False)
    assert (result.exit_code, result.passed, result.issues) == (0, True, ())
    assert result.report["inputs"] == {"files": 8, "samples": 8}
    result.check()  # returns: nothing failed


def test_a_bad_job_file_raises_the_config_error_the_command_line_prints(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nsources: []\nsplit: {by: entity}\npack: {format: webdataset}\noutput: out\n")
    printed = cli("build", str(job))
    assert printed.exit_code == 2
    for call in (packer.build, packer.validate):
        with pytest.raises(ConfigError) as raised:
            call(job, scheduler="sync", progress=False)
        assert raised.value.exit_code == 2
        assert printed.output.strip() == f"packer: error: {raised.value}"
    with pytest.raises(ConfigError) as missing:
        packer.build(tmp_path / "no-such-job.yaml")
    assert str(missing.value).startswith(f"{tmp_path / 'no-such-job.yaml'}: cannot read the job file")


def test_a_dict_job_is_checked_by_the_same_schema_naming_dict_for_the_file(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    doc = yaml.safe_load(job.read_text())
    doc["splt"] = doc.pop("split")
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as from_file:
        packer.validate(job, scheduler="sync")
    with pytest.raises(ConfigError) as from_dict:
        packer.validate(doc, base_dir=tmp_path, scheduler="sync")
    assert str(from_file.value).startswith(f"{job}: splt: unknown key")
    assert str(from_dict.value) == str(from_file.value).replace(str(job), "<dict>")
    with pytest.raises(ConfigError, match=r"^<dict>: a job is a mapping"):
        job_from_mapping(["name", "x"])  # type: ignore[arg-type]


def test_a_missing_raw_root_raises_config_error_exit_2(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["root"] = "gone"
    job.write_text(yaml.safe_dump(doc))
    printed = cli("build", str(job), "--scheduler", "sync", "-q")
    with pytest.raises(ConfigError) as raised:
        packer.build(job, scheduler="sync", progress=False)
    assert raised.value.exit_code == printed.exit_code == 2
    assert f"folder {tmp_path / 'gone'} does not exist" in str(raised.value)
    assert printed.output.strip() == f"packer: error: {raised.value}"
    assert "(root: 'gone', relative to the job file)" in str(raised.value)
    with pytest.raises(ConfigError) as from_dict:
        packer.build(doc, base_dir=tmp_path, scheduler="sync", progress=False)
    assert str(from_dict.value) == str(raised.value).replace(str(job), "<dict>").replace("the job file", "base_dir")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2", True])
def test_a_worker_count_the_command_line_refuses_is_a_config_error_not_a_hang(tmp_path: Path, workers: Any) -> None:
    """``--workers`` takes 1 or more; ``workers=0`` once meant the default silently and
    ``workers=-1`` waited forever for a local cluster of -1 processes."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    assert cli("validate", str(job), "--workers", "0", "-q").exit_code == 2  # what the command line does
    for call in (packer.validate, packer.build):
        with pytest.raises(ConfigError, match=rf"^workers={workers!r}: .* at least 1") as raised:
            call(job, workers=workers, progress=False)
        assert raised.value.exit_code == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("call", "kwargs", "said"), [
    ("validate", {"quick": 0}, "quick=0: give True or False"),
    ("validate", {"quick": "no"}, "quick='no': give True or False"),
    ("build", {"resume": "no"}, "resume='no': give True or False"),
    ("build", {"storage_options": "secret=S3CR3T"}, "storage_options: a str (not shown: it may hold credentials)"),
    ("open", {"storage_options": ["x"]}, "an option without KEY= (not shown: it may hold credentials)"),
])
def test_arguments_of_the_wrong_type_are_config_errors_naming_them_before_any_work(
        tmp_path: Path, call: str, kwargs: dict[str, Any], said: str) -> None:
    """validate(quick="no") ran the check ("no" is truthy) and then failed naming --json; a list
    for storage_options was a bare ValueError from dict(), and packer.open took one silently."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    target: Any = tmp_path / "nowhere" if call == "open" else job
    extra = {} if call == "open" else {"progress": False}
    with pytest.raises(ConfigError, match=re.escape(said)) as raised:
        getattr(packer, call)(target, **extra, **kwargs)
    assert raised.value.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_storage_options_as_key_value_strings_are_taken_as_the_command_line_takes_them_and_never_printed(
        tmp_path: Path) -> None:
    """The command line's form, ["key=...", "secret=..."], was refused with a message that quoted
    the whole list, secret and all; it is parsed as --storage-option parses it (and as
    ShardDataset takes it), and a form that is refused is named by its type alone."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    as_strings = packer.validate(job, quick=True, scheduler="sync", progress=False,
                                 storage_options=["anon=true", "client_kwargs.region_name=eu-west-1"])
    as_mapping = packer.validate(job, quick=True, scheduler="sync", progress=False,
                                 storage_options={"anon": True, "client_kwargs": {"region_name": "eu-west-1"}})
    assert as_strings.exit_code == as_mapping.exit_code == 0
    for given in (["key=AKIAEXAMPLE", 7, "secret=S3CR3T-VALUE"], ("key=AKIAEXAMPLE", "secret=S3CR3T-VALUE", b"x")):
        for call in (packer.open, packer.build):
            with pytest.raises(ConfigError, match="not shown: it may hold credentials") as raised:
                call(tmp_path / "nowhere", storage_options=given)
            assert "S3CR3T-VALUE" not in str(raised.value) and "AKIAEXAMPLE" not in str(raised.value)


def test_too_many_bad_samples_raise_after_everything_is_written(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(8, bad=1), split=ENTITY_SPLIT)  # 1 of 9 bad > 5%
    with pytest.raises(BadFractionError) as raised:
        packer.build(job, scheduler="sync", progress=False, report=False)
    err = raised.value
    assert isinstance(err, PackerError) and err.exit_code == 3
    assert err.version_dir is not None and "1 of 9 input files are bad" in str(err)
    written = packer.open(err.version_dir)  # the version was written all the same
    assert written.data["bad_samples"]["total"] == 1
    assert [json.loads(line)["reason"] for line in (err.version_dir / "bad_samples.jsonl").read_text().splitlines()] \
        == ["unreadable"]
    printed = cli("build", str(job), "--scheduler", "sync", "-q", "--no-report")
    assert printed.exit_code == 3 and f"packer: error: {err}" in printed.output

    checked = packer.validate(job, scheduler="sync", progress=False)
    assert checked.exit_code == 3 and [i.reason for i in checked.issues] == ["unreadable"]
    with pytest.raises(BadFractionError) as failed:
        checked.check()
    assert failed.value.exit_code == 3 and failed.value.version_dir is None


def test_open_reads_a_version_folder_its_manifest_and_a_registry_copy(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(6), split=ENTITY_SPLIT)
    doc = yaml.safe_load(job.read_text())
    doc["registry"] = "registry"
    job.write_text(yaml.safe_dump(doc))
    built = packer.build(job, scheduler="sync", progress=False, report=False)
    version = tmp_path / "out" / "photos" / built.version
    copy = tmp_path / "registry" / "photos" / f"{built.version}.json"
    for location in (version, version / "manifest.json", str(version), copy):
        opened = packer.open(location)
        assert (opened.dataset_hash, opened.splits) == (built.dataset_hash, built.splits)
    assert packer.open(version).folder == version
    # a registry copy says it is one: its folder is the registry's, which holds none of the shards
    assert not packer.open(version).registry_copy and packer.open(copy).registry_copy

    with pytest.raises(ConfigError) as dataset_folder:
        packer.open(version.parent)
    assert dataset_folder.value.exit_code == 2 and f"holds the version(s) {built.version}" in str(dataset_folder.value)
    edited = json.loads((version / "manifest.json").read_text())
    edited["splits"]["train"]["samples"] += 1
    (version / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(IntegrityError) as damaged:
        packer.open(version)
    assert damaged.value.exit_code == 5 and "dataset_hash does not match" in str(damaged.value)


def readme_python_example() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## From Python: `packer.build`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's From Python section has no python example"
    return "\n".join(blocks)


@pytest.mark.slow  # the README's example: a real dask cluster, a validate and a build of the demo, torch
def test_the_readme_python_example_runs(demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as written, from a checkout where `packer demo-data demo-raw` ran: workflows/demo.yaml
    is the committed job (its registry re-pointed into the temporary folder by the layout)."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "demo.yaml").write_bytes((REPO / "workflows" / "demo.yaml").read_bytes())
    (tmp_path / "demo-raw").symlink_to(demo_raw.root)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__main__"}  # run as the script it is written as
    exec(compile(readme_python_example(), "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    manifest = namespace["manifest"]
    assert manifest.folder == tmp_path / "build" / "demo" / manifest.version
    assert (tmp_path / "manifests" / "demo" / f"{manifest.version}.json").is_file()
    assert len(namespace["train"]) == manifest.splits["train"]["samples"]


def test_the_readme_python_examples_bad_fraction_branch_does_not_train_on_the_failed_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's BadFractionError branch opened the version the failed build wrote and made a
    ShardDataset of it, which always refuses such a version (ConfigError): the documented error
    branch always crashed. It now stops, naming the bad-sample report."""
    failed = tmp_path / "build" / "demo" / "0123456789ab"

    class Passed:
        exit_code, report, warnings = 0, {"bad_samples": {"by_reason": {}}}, ()

        def check(self) -> None:
            return None

    def build(*args: Any, **kwargs: Any) -> Any:
        raise BadFractionError("7 of 100 input files are bad", version_dir=failed)

    monkeypatch.setattr(packer, "validate", lambda *a, **k: Passed())
    monkeypatch.setattr(packer, "build", build)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with pytest.raises(SystemExit) as stopped:
        exec(compile(readme_python_example(), "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    assert str(stopped.value) == f"too many bad files: see {failed}/bad_samples.jsonl"


def test_a_version_whose_publish_fails_is_not_listed_in_the_registry(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry copy was written before the upload: a publish that failed (or was killed)
    left a listed version the store had no manifest of. It is written once the publish is done."""
    import packer.pipeline.build as build_module

    job = photo_job(tmp_path, photos(6), split=ENTITY_SPLIT)
    doc = yaml.safe_load(job.read_text())
    doc["registry"] = "registry"
    job.write_text(yaml.safe_dump(doc))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise IntegrityError("memory://packer-api/x: read back different after upload")

    monkeypatch.setattr(build_module, "publish_version", broken)
    with pytest.raises(IntegrityError):
        packer.build(job, out="memory://packer-api/registry-test", scheduler="sync", progress=False, report=False)
    assert not list((tmp_path / "registry").rglob("*.json"))
    monkeypatch.undo()
    published = packer.build(job, out="memory://packer-api/registry-test", scheduler="sync", progress=False,
                             report=False)
    assert (tmp_path / "registry" / "photos" / f"{published.version}.json").is_file()


def test_built_for_a_url_the_manifest_is_the_published_one(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(6), split=ENTITY_SPLIT)
    local = packer.build(job, scheduler="sync", progress=False, report=False)
    published = packer.build(job, out="memory://packer-api/datasets", scheduler="sync", progress=False,
                             report=False)
    assert published.location == f"memory://packer-api/datasets/photos/{local.version}/manifest.json"
    assert published.path is None and published.dataset_hash == local.dataset_hash
    assert packer.open(published.folder).splits == local.splits


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full (Linux) gives real ENOSPC writes")
def test_a_full_disk_raises_file_system_error_exit_6_as_the_command_reports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import packer.files

    def full_for_shards(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(".tar" + packer.files.TMP_SUFFIX):
            return builtins.open("/dev/full", mode, *args, **kwargs)  # the kernel's own ENOSPC on write
        return builtins.open(file, mode, *args, **kwargs)

    job = photo_job(tmp_path, photos(6), split=ENTITY_SPLIT)
    monkeypatch.setattr(packer.files, "open", full_for_shards, raising=False)
    with pytest.raises(FileSystemError) as raised:
        packer.build(job, scheduler="sync", progress=False, report=False)
    assert raised.value.exit_code == 6 and "the file system is full" in str(raised.value)
    assert "choose another output folder (packer.build(..., out=DIR))" in said_to_python(raised.value)
    printed = cli("build", str(job), "--scheduler", "sync", "-q", "--no-report")
    command_line = str(raised.value).replace("packer.build(..., out=DIR)", "packer build --out DIR")
    assert printed.exit_code == 6 and printed.output.endswith(f"packer: error: {command_line}\n")


def test_an_output_folder_that_cannot_be_made_names_the_keyword_to_python_and_the_flag_to_the_shell(
        tmp_path: Path) -> None:
    """It said 'give --out a folder on a writable file system' to a packer.build caller too."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this machine")
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    with pytest.raises(FileSystemError) as raised:
        packer.build(job, out="/proc/packer-test-out", scheduler="sync", progress=False, report=False)
    assert "the output folder cannot be made there" in said_to_python(raised.value)
    assert "packer.build(..., out=DIR)" in str(raised.value)
    printed = cli("build", str(job), "--scheduler", "sync", "-q", "--out", "/proc/packer-test-out")
    assert printed.exit_code == 6 and "(packer build --out DIR)" in printed.output, printed.output


@pytest.mark.slow  # a real local cluster from a subprocess script
def test_a_script_calling_build_at_its_top_level_fails_with_the_main_guard_named(tmp_path: Path) -> None:
    """The local cluster's workers import the calling script again (spawn): a call at the
    script's top level keeps them from starting, and the error says to use the __main__ guard."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    script = tmp_path / "unguarded.py"
    script.write_text(f"import packer\npacker.build({str(job)!r}, workers=1, progress=False, report=False)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr.splitlines()[-1]


def _run_script(script: Path, text: str) -> subprocess.CompletedProcess[str]:
    """``text`` written to ``script`` and run by this Python, with this checkout importable."""
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow  # a real local cluster from a subprocess script
def test_an_unguarded_script_gets_a_config_error_exit_2_in_the_calling_process(tmp_path: Path) -> None:
    """The README's table: a usage error exits 2. The calling process's error was a bare
    PackerError (exit_code 1, "internal error: a bug") while the workers said ConfigError."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    done = _run_script(tmp_path / "unguarded.py",
                       "import sys\nimport packer\nfrom packer.errors import PackerError\n"
                       "try:\n"
                       f"    packer.build({str(job)!r}, workers=1, progress=False, report=False)\n"
                       "except PackerError as err:\n"
                       "    print(type(err).__name__, file=sys.stderr)\n"
                       "    sys.exit(err.exit_code)\n")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == "ConfigError", done.stderr


@pytest.mark.slow  # a real local cluster from a subprocess script
def test_dask_records_of_packers_own_cluster_stay_out_of_the_callers_logging(tmp_path: Path) -> None:
    """An orchestrator's task logs at INFO on the root logger: one build on packer's local
    cluster sent it ~25 of dask's records ("State start", "Start Nanny", "Lost all workers"; under
    PHI pseudonymization an error record may quote a raw path), which the command never prints.
    They stop at dask's own logger now, whose setting is the caller's again after the build."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    done = _run_script(
        tmp_path / "logged.py",
        "import logging, sys\nimport packer\n"
        "class Keep(logging.Handler):\n"
        "    def __init__(self):\n        super().__init__(logging.INFO)\n        self.names = []\n"
        "    def emit(self, record):\n        self.names.append(record.name)\n"
        "if __name__ == '__main__':\n"
        "    keep = Keep()\n    logging.basicConfig(level=logging.INFO, handlers=[keep])\n"
        f"    packer.build({str(job)!r}, workers=1, progress=False, report=False)\n"
        "    logging.getLogger('distributed.scheduler').info('after the build')\n"
        "    print(sorted(set(n for n in keep.names if n.startswith('distributed'))), "
        "logging.getLogger('distributed').propagate)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['distributed.scheduler'] True", done.stdout  # only the caller's


def test_a_program_read_from_stdin_is_told_to_be_a_file_before_any_worker_starts(tmp_path: Path) -> None:
    """``python - <<EOF`` (a heredoc step of a CI job), guarded: the spawned workers tried to
    import ``<cwd>/<stdin>`` and died with tracebacks, and the call raised a bare PackerError
    (exit_code 1, "a bug") whose fix was the guard the program already had."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    program = ("import sys\nimport packer\nfrom packer.errors import PackerError\n"
               "if __name__ == '__main__':\n"
               "    try:\n"
               f"        packer.build({str(job)!r}, workers=1, progress=False, report=False)\n"
               "    except PackerError as err:\n"
               "        print(type(err).__name__, err, file=sys.stderr)\n"
               "        sys.exit(err.exit_code)\n")
    done = subprocess.run([sys.executable, "-"], input=program, capture_output=True, text=True, timeout=300,
                          check=False, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("ConfigError <stdin>: the local dask cluster's worker processes cannot start from "
                                  "a program that is not a file"), done.stderr
    assert "save the program as a file and run that, or run in this process (scheduler='sync')" in done.stderr


def test_a_top_level_call_outside_the_main_guard_is_told_from_a_guarded_one(tmp_path: Path) -> None:
    """What tells the calling process that its workers failed because they ran the script's call
    again: a call from the script's top level (directly, or through a function called there)
    outside ``if __name__ == "__main__":``; not one inside it, nor one from ``python -c``."""
    probe = "from packer.pipeline.cluster import unguarded_script\n"
    cases = {
        "top.py": probe + "print(unguarded_script())\n",
        "through.py": probe + "def main():\n    print(unguarded_script())\n\nmain()\n",
        "guarded.py": probe + "if __name__ == '__main__':\n    print(unguarded_script())\n",
        "reversed.py": probe + "def main():\n    print(unguarded_script())\n\nif '__main__' == __name__:\n    main()\n",
    }
    said = {}
    for name, code in cases.items():
        (tmp_path / name).write_text(code)
        done = subprocess.run([sys.executable, str(tmp_path / name)], capture_output=True, text=True, timeout=120,
                              check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        said[name] = done.stdout.strip()
    assert said == {"top.py": str(tmp_path / "top.py"), "through.py": str(tmp_path / "through.py"),
                    "guarded.py": "None", "reversed.py": "None"}
    inline = subprocess.run([sys.executable, "-c", cases["top.py"]], capture_output=True, text=True, timeout=120,
                            check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert inline.stdout.strip() == "None"


def error_lines(stderr: str) -> list[str]:
    """The last line of each traceback in ``stderr``: what each process said went wrong."""
    lines = stderr.splitlines()
    return [lines[i - 1] for i, line in enumerate(lines) if i and line.startswith("Traceback")] + lines[-1:]


@pytest.mark.slow  # a real local cluster from a subprocess script
@pytest.mark.parametrize("call", ["build", "validate"])
def test_every_worker_of_an_unguarded_script_names_the_main_guard_not_another_error(tmp_path: Path,
                                                                                    call: str) -> None:
    """Each worker process that imports an unguarded script again calls packer there too. That
    call must fail at once with the guard named: not take the build's lock and report 'another
    `packer build` ... is running' (which sends the user to look for a build that does not exist),
    nor start a cluster of its own inside the worker."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    script = tmp_path / "unguarded.py"
    script.write_text(f"import packer\npacker.{call}({str(job)!r}, workers=2, progress=False)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode != 0
    assert "another `packer build`" not in done.stderr
    assert "Status.starting" not in done.stderr
    said = [line for line in error_lines(done.stderr) if line.startswith("packer.errors.")]
    assert said and all('if __name__ == "__main__":' in line for line in said), done.stderr
    assert any(str(script) in line for line in said), done.stderr  # the worker's error names the script


#: A flag of packer's command line, which a caller of the Python API cannot pass (``--scheduler-file``
#: is dask's own command's flag, which a message may well name).
PACKER_FLAG = re.compile(r"--(out|workers|scheduler|cache-dir|keep-spill|fresh|resume|quick|storage-option|json|junit)"
                         r"\b(?!-)")


def said_to_python(err: BaseException | str) -> str:
    """The message, checked to name no command-line flag: a notebook user cannot pass one."""
    text = str(err)
    assert not PACKER_FLAG.search(text), text
    return text


@pytest.mark.parametrize("call", ["build", "validate"])
def test_a_scheduler_dask_cannot_parse_is_named_as_the_keyword_argument(tmp_path: Path, call: str) -> None:
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    with pytest.raises(ConfigError) as raised:
        getattr(packer, call)(job, scheduler="localhost", progress=False)
    message = said_to_python(raised.value)
    assert message.startswith("scheduler='localhost': not a dask scheduler address")
    assert message.endswith("leave scheduler None for a local cluster")
    printed = cli(call, str(job), "--scheduler", "localhost", "-q")  # the command line names its flag
    assert printed.exit_code == 2
    assert printed.output.startswith("packer: error: --scheduler localhost: not a dask scheduler address")
    assert printed.output.rstrip().endswith("omit --scheduler for a local cluster")


def test_a_cluster_build_without_a_shared_cache_folder_names_cache_dir_not_a_flag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PACKER_WORK_DIR", raising=False)
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    with pytest.raises(ConfigError) as raised:
        packer.build(job, scheduler="tcp://127.0.0.1:9", progress=False)
    message = said_to_python(raised.value)
    assert message.startswith("scheduler='tcp://127.0.0.1:9': the cluster's workers write and read the build cache")
    assert "(or pass cache_dir=DIR)" in message
    assert not (tmp_path / "out").exists()


def test_a_missing_scheduler_file_is_named_as_the_keyword_argument(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    missing = str(tmp_path / "scheduler.json")
    for call in (packer.build, packer.validate):
        with pytest.raises(ConfigError) as raised:
            call(job, scheduler=missing, progress=False)
        assert said_to_python(raised.value).startswith(f"scheduler={missing!r}: no such scheduler file")


def test_an_output_folder_that_is_a_file_names_out_as_the_caller_passed_it(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError) as raised:
        packer.build(job, out=blocker, scheduler="sync", progress=False)
    assert said_to_python(raised.value) == (
        f"out={str(blocker)!r}: cannot create the folder {blocker / 'photos'}: {blocker} is a file, not a folder; "
        "choose another output folder (packer.build(..., out=DIR))")


def test_a_cache_folder_that_is_a_file_names_cache_dir_as_the_caller_passed_it(tmp_path: Path) -> None:
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError) as raised:
        packer.build(job, cache_dir=blocker, scheduler="sync", progress=False)
    message = said_to_python(raised.value)
    assert f"(cache_dir): {blocker} is a file, not a folder" in message
    assert message.endswith("choose another cache folder (packer.build(..., cache_dir=DIR), or set PACKER_WORK_DIR)")


def test_warnings_name_the_keyword_arguments_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Workers given with the in-process scheduler, and a build cache an older packer left in
    the output folder: the warnings say what to pass, as the caller passes it."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    (tmp_path / "out" / "photos" / ".cache").mkdir(parents=True)
    packer.build(job, workers=2, scheduler="sync", progress=False, report=False)
    warned = said_to_python(capsys.readouterr().err)
    assert "packer: warning: workers=2 sizes the local cluster only; with scheduler='sync' every task runs" in warned
    assert "or build once with resume=False, which deletes it" in warned


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full (Linux) gives real ENOSPC writes")
def test_a_validation_report_the_disk_refuses_names_the_method_that_wrote_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import packer.files

    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    checked = packer.validate(job, quick=True, scheduler="sync", progress=False)
    target = tmp_path / "check.json"

    def full_for_it(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return builtins.open("/dev/full" if str(file).startswith(f"{target}.") else file, mode, *args, **kwargs)

    monkeypatch.setattr(packer.files, "open", full_for_it, raising=False)
    with pytest.raises(FileSystemError) as raised:
        checked.write_json(target)
    assert said_to_python(raised.value).endswith(
        "free space there, or write the file elsewhere (ValidationResult.write_json(ANOTHER_PATH))")


def test_a_quick_validation_names_quick_as_the_call_takes_it(tmp_path: Path) -> None:
    """README: a message that names an option names it as the call takes it. packer.validate(
    quick=True)'s summary and report said "headers only: --quick" and "run packer validate
    without --quick"; the command's output still names its flag."""
    job = photo_job(tmp_path, photos(4), split=ENTITY_SPLIT)
    checked = packer.validate(job, quick=True, scheduler="sync", progress=False)
    said = checked.summary() + json.dumps(checked.report)
    assert "--quick" not in said, said
    assert "headers only: quick=True" in said and "call packer.validate(..., quick=False)" in said
    printed = cli("validate", str(job), "--quick", "--scheduler", "sync")
    assert "headers only: --quick" in printed.output and "run packer validate without --quick" in printed.output


def test_an_object_store_message_names_storage_options_as_the_api_takes_them() -> None:
    from packer.errors import PYTHON_API, called_from
    from packer.storage import describe_error

    with called_from(PYTHON_API):
        denied = describe_error("s3://b/x", PermissionError("AccessDenied"))
        anonymous = describe_error("s3://b/x", type("NoCredentialsError", (Exception,), {})("none"))
        unreachable = describe_error("s3://b/x", ConnectionError("refused"))
    assert "storage_options={'key': ..., 'secret': ...}" in said_to_python(denied)
    assert "pass storage_options={'anon': True} for a public bucket" in said_to_python(anonymous)
    assert "storage_options={'endpoint_url': 'http://HOST:PORT'}" in said_to_python(unreachable)
    assert "--storage-option anon=true" in describe_error("s3://b/x", type("NoCredentialsError", (Exception,), {})(""))


def test_the_report_lists_as_many_findings_per_rule_as_the_readme_says_and_counts_them_all() -> None:
    from packer.pipeline.audit import MAX_LISTED, RuleResult

    rule = RuleResult("exact_duplicates_within_split", "report", 250, tuple({"n": n} for n in range(250)))
    assert rule.to_json()["count"] == 250 and [f["n"] for f in rule.to_json()["findings"]] == list(range(MAX_LISTED))
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"the report, like `leakage.json`, lists the first {MAX_LISTED} of each" in readme
    assert f"its findings, the first {MAX_LISTED} of each" in readme


def test_a_job_loaded_where_file_names_are_not_decoded_as_utf8_warns_how_to_fix_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packer command runs in UTF-8 mode where the locale's encoding is another; a notebook or
    an orchestrator's task calling packer.build does not, and a non-ASCII file name would then not
    match its UTF-8 table row: the API says so, and how to run Python instead."""
    import warnings

    job = photo_job(tmp_path, photos(4), split={"by": "entity", "seed": 1})
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "iso8859-1")
    with pytest.warns(UnicodeWarning, match=r"decodes file names as iso8859-1.*python -X utf8, or PYTHONUTF8=1"):
        packer.api.load(job)
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnicodeWarning)
        packer.api.load(job)
