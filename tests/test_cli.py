"""The command line: help that teaches, exit codes as documented, a real end-to-end run."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from packer.cli import main
from tests.helpers import REPO, demo_job_doc, write_job


def commands() -> list[str]:
    return sorted(main.commands)


@pytest.mark.parametrize("name", commands())
def test_every_command_has_help_and_is_in_the_readme(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert len(main.commands[name].help or "") > 40
    assert f"packer {name}" in (REPO / "README.md").read_text()


def test_the_readme_synopsis_names_every_option_of_every_command() -> None:
    """The README's "Commands and exit codes" block left out validate's --scheduler and --quiet,
    verify's and locate's --storage-option and bench-loader's --batch-sizes, --seconds, --json."""
    block = (REPO / "README.md").read_text().split("## Commands and exit codes", 1)[1].split("```", 2)[1]
    lines: dict[str, str] = {}
    for line in block.strip().splitlines():
        lines[line.split()[1]] = lines.get(line.split()[1], "") + " " + line
    assert set(lines) == set(main.commands)
    for name, synopsis in lines.items():
        command = main.commands[name]
        command = command.commands["new"] if isinstance(command, click.Group) else command
        for param in command.params:
            if isinstance(param, click.Option) and "--help" not in param.opts:
                assert any(f"{opt} " in synopsis + " " or f"{opt}]" in synopsis or f"{opt}|" in synopsis
                           or f"{opt}=" in synopsis for opt in param.opts + param.secondary_opts), (name, param.opts)


def test_validate_help_lists_every_exit_code_the_readme_gives_it() -> None:
    """README: validate exits 6 when its --json/--junit file cannot be written; --help left 6 out,
    and called --scheduler a tcp address only (a scheduler file works, as for build)."""
    text = " ".join(CliRunner().invoke(main, ["validate", "--help"]).output.split())
    for code in ("0 clean", "2 usage/config error", "3 bad fraction", "4 leakage found", "6 the --json/--junit file",
                 "1 internal error"):
        assert code in text
    assert "scheduler file" in text


@pytest.mark.slow  # a subprocess build on a real dask cluster
def test_packer_build_console_script_end_to_end(demo_raw: Any, tmp_path: Path) -> None:
    """The installed `packer` command on the demo tree: exit 0, summary, files where it says."""
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    exe = Path(sys.executable).with_name("packer")
    proc = subprocess.run([str(exe), "build", str(job), "--workers", "1", "--quiet"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr
    manifest_line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("manifest"))
    manifest = json.loads(Path(manifest_line.split()[1]).read_text())
    assert f"dataset_hash {manifest['dataset_hash']}" in proc.stdout
    assert f"bad samples: {len(demo_raw.defects)} of" in proc.stdout


def test_exit_3_when_bad_fraction_is_over_threshold_but_everything_is_written(demo_raw: Any, tmp_path: Path) -> None:
    doc = demo_job_doc(demo_raw.root, tmp_path / "out", validate={"max_bad_fraction": 0.01})
    doc["registry"] = str(tmp_path / "registry")
    job = write_job(tmp_path, doc)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert result.exit_code == 3, result.output
    assert "max_bad_fraction" in result.output
    (manifest,) = (tmp_path / "out" / "demo").glob("*/manifest.json")
    assert (manifest.parent / "bad_samples.jsonl").is_file()
    # a failed build is not a dataset version to list: nothing in the registry (packer ls showed a 0/0/0 one)
    assert not (tmp_path / "registry").exists() and "  registry " not in result.output


def test_a_bad_fraction_just_over_the_limit_fails_though_its_recorded_value_is_rounded(tmp_path: Path) -> None:
    """1 bad file of 3 is 0.3333333...: over max_bad_fraction 0.3333333, though the manifest records
    0.333333 (6 places). The rounded value was judged: exit 0, and ls/inspect/validate called the
    version good (and 1 bad file in 3 million passed a limit of 0)."""
    import cv2
    import numpy as np

    from packer.badsamples import over_limit, summarize_issues
    from packer.records import Issue

    raw = tmp_path / "raw" / "cls"
    raw.mkdir(parents=True)
    for i in range(2):
        cv2.imwrite(str(raw / f"{i}.png"), np.random.default_rng(i).integers(0, 255, (16, 16), dtype=np.uint8))
    (raw / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    job = write_job(tmp_path, {"name": "third", "sources": [{"kind": "image", "root": str(tmp_path / "raw"),
                                                            "label": "folder"}],
                               "split": {"by": "entity", "ratios": {"train": 1.0}}, "pack": {"format": "webdataset"},
                               "validate": {"max_bad_fraction": 0.3333333}, "output": str(tmp_path / "out")})
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert built.exit_code == 3, built.output
    (manifest,) = (tmp_path / "out" / "third").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["bad_samples"]["fraction"] == 0.333333  # as recorded, unchanged
    assert "FAILED BUILD" in CliRunner().invoke(main, ["ls", str(tmp_path / "out" / "third")]).output
    assert CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q"]).exit_code == 3
    one_bad = [Issue(sample_id="s", path="p", stage="read", reason="unreadable", message="m")]
    summary = summarize_issues(one_bad, inputs=3_000_000, max_fraction=0.0)
    assert summary["fraction"] == 0.0 and over_limit(summary, 3_000_000)


def test_the_summary_says_when_the_registry_copy_was_already_there(demo_raw: Any, tmp_path: Path) -> None:
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["registry"] = str(tmp_path / "registry")
    job = write_job(tmp_path, doc)
    first = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    again = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    (copy,) = (tmp_path / "registry" / "demo").glob("*.json")
    assert f"  registry  {copy}\n" in first.output  # written by this build
    assert f"  registry  {copy}  (already there: left as it was)\n" in again.output


def test_exit_2_naming_the_file_where_the_output_folder_must_be(demo_raw: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    (tmp_path / "a-file").write_text("not a folder")
    chosen = CliRunner().invoke(main, ["build", str(job), "--out", str(tmp_path / "a-file"), "-q"])
    assert chosen.exit_code == 2, chosen.output
    assert chosen.output.strip() == (f"packer: error: --out {tmp_path / 'a-file'}: cannot create the folder "
                                     f"{tmp_path / 'a-file' / 'demo'}: {tmp_path / 'a-file'} is a file, "
                                     "not a folder; choose another output folder (packer build --out DIR)")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "demo").write_text("")  # inside the output: removing it is the fix
    inside = CliRunner().invoke(main, ["build", str(job), "-q"])
    assert inside.exit_code == 2, inside.output
    assert (f"the job's output {tmp_path / 'out'}: cannot create the folder {tmp_path / 'out' / 'demo'}: "
            f"{tmp_path / 'out' / 'demo'} is a file, not a folder; remove that file") in inside.output


def test_exit_2_on_a_bad_job_file(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nsources: []\nsplit: {by: entity}\npack: {format: webdataset}\noutput: out\n")
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2
    assert "sources" in result.output


def test_exit_4_when_the_audit_finds_leakage(demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Force a broken assignment (every other sample to test) and check the audit stops the build."""
    import packer.pipeline.stages as stages_module

    real = stages_module.assign_splits

    def leaky(samples: Any, cfg: Any, edges: Any, **options: Any) -> Any:
        honest = real(samples, cfg, edges, **options)
        split = {s.key: ("train", "test")[i % 2] for i, s in enumerate(samples)}
        return dataclasses.replace(honest, split=split)

    monkeypatch.setattr(stages_module, "assign_splits", leaky)
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert result.exit_code == 4, result.output
    from packer.phi import Pseudonymizer

    key = (demo_raw.root / "phi.key").read_text().strip().encode()
    phi = Pseudonymizer(mode="pseudonymize", dates="shift", key=key)
    assert "entity_overlap" in result.output and "PAT0001" not in result.output  # pseudonyms only
    # the message names the file it points at (it said "listed in leakage.json", in no folder)
    assert f"(every finding is listed in {tmp_path / 'out' / 'demo' / 'leakage.json'})" in result.output
    leaked = json.loads((tmp_path / "out" / "demo" / "leakage.json").read_text())["rules"]["entity_overlap"]
    assert phi.entity("PAT0001") in {f["entity_id"] for f in leaked["findings"]}
    assert any(phi.entity(f"PAT{i:04d}") in result.output for i in range(1, 16))
    assert (tmp_path / "out" / "demo" / "leakage.json").is_file()


def test_demo_data_writes_a_tree(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo-data", str(tmp_path / "raw"), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "raw" / "ct_labels.csv").is_file()
    assert "truncated" in result.output


def test_the_stage_times_line_counts_decoded_and_cached_files_truthfully(demo_raw: Any, tmp_path: Path) -> None:
    """A first build decodes every readable file and claims no cache; a second build whose
    packing differs (a new version) takes every file from the build cache and decodes none."""
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    first = CliRunner().invoke(main, ["build", str(write_job(tmp_path / "a", doc)), "--scheduler", "sync", "-q"])
    assert first.exit_code == 0, first.output
    bad_before_decoding = 1  # the table row whose file does not exist is never decoded
    decoded = demo_raw.dicom_files + demo_raw.images + len(demo_raw.defects) - bad_before_decoding
    assert f"({decoded} files decoded):" in first.output
    doc["pack"]["max_samples"] = 7
    second = CliRunner().invoke(main, ["build", str(write_job(tmp_path / "b", doc)), "--scheduler", "sync", "-q"])
    assert second.exit_code == 0, second.output
    assert f"(0 files decoded, {decoded} from the build cache):" in second.output


def _with_closed_output(args: list[str], *, closed: str) -> subprocess.CompletedProcess[str]:
    """``python -m packer.cli ARGS`` whose stdout (``closed="stdout"``) or stderr is a pipe that its reader
    has already closed, as ``packer ... | head -1`` leaves it once head has read its line; the other
    stream is captured."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    other = subprocess.PIPE
    try:
        return subprocess.run([sys.executable, "-m", "packer.cli", *args], cwd=REPO, text=True, timeout=300,
                              stdout=write_end if closed == "stdout" else other,
                              stderr=write_end if closed == "stderr" else other,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    finally:
        os.close(write_end)


@pytest.mark.slow  # subprocesses, one a build on a real dask cluster
def test_a_closed_stdout_or_stderr_ends_every_command_quietly_with_141(demo_raw: Any, tmp_path: Path) -> None:
    """`packer validate JOB | head -1` ended in a BrokenPipeError traceback, "internal error" and exit 1
    (and click's own --help, exit 1 and nothing): a reader that has gone is no error of the data."""
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert built.exit_code == 0, built.output
    (version,) = (path.parent for path in (tmp_path / "out" / "demo").glob("*/manifest.json"))
    runs = {"validate": ["validate", str(job), "--scheduler", "sync"],
            "build on a cluster": ["build", str(job), "--out", str(tmp_path / "again"), "--workers", "1"],
            "inspect": ["inspect", str(version)], "inspect --json": ["inspect", str(version), "--json"],
            "verify": ["verify", str(version)], "diff": ["diff", str(version), str(version)],
            "--help": ["--help"], "verify --help": ["verify", "--help"]}
    for what, args in runs.items():
        proc = _with_closed_output(args, closed="stdout")
        assert (proc.returncode, "Traceback" in proc.stderr, "internal error" in proc.stderr) == (141, False, False), \
            (what, proc.stderr)
    # validate's summary goes to stderr: `packer validate JOB 2>&1 | head -1`
    proc = _with_closed_output(runs["validate"], closed="stderr")
    assert proc.returncode == 141, proc.stdout


def _with_stdout_closed(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m packer.cli ARGS >&-``: stdout closed outright (no descriptor 1 at all, which Python
    makes ``sys.stdout = None``), not a pipe whose reader has gone; stderr is captured."""
    return subprocess.run([sys.executable, "-m", "packer.cli", *args], cwd=REPO, text=True, timeout=300,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1),
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow  # subprocesses
def test_a_stdout_closed_outright_ends_like_a_closed_pipe_with_141(demo_raw: Any, tmp_path: Path) -> None:
    """`packer validate JOB >&-` exited 0 and its stdout line was lost silently (a write to Python's
    ``sys.stdout = None`` is dropped): a command whose output cannot be written has not finished."""
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    for what, args in {"validate": ["validate", str(job), "--scheduler", "sync"], "--help": ["--help"]}.items():
        proc = _with_stdout_closed(args)
        assert (proc.returncode, "Traceback" in proc.stderr, "internal error" in proc.stderr) == (141, False, False), \
            (what, proc.stderr)
    # with nothing for stdout (-q: validate's summary goes to stderr), nothing is lost: exit 0
    proc = _with_stdout_closed(["validate", str(job), "--scheduler", "sync", "-q"])
    assert proc.returncode == 0 and "result: clean" in proc.stderr, proc.stderr


def test_a_broken_pipe_that_is_not_the_output_is_still_a_bug(capsys: pytest.CaptureFixture[str]) -> None:
    """Only a closed stdout or stderr ends quietly: a pipe of the command's own that broke is an internal error."""
    from packer.commands import exits

    def verify() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as caught:
        exits(verify)()
    assert caught.value.code == 1
    assert "internal error" in capsys.readouterr().err


def test_ctrl_c_exits_130_with_one_line_and_build_says_how_to_resume(capsys: pytest.CaptureFixture[str]) -> None:
    from packer.commands import exits

    def build() -> None:
        raise KeyboardInterrupt

    def verify() -> None:
        raise KeyboardInterrupt

    for command, hint in ((build, "; files decoded so far stay in the build cache, and the same command resumes"),
                          (verify, "")):
        with pytest.raises(SystemExit) as caught:
            exits(command)()
        assert caught.value.code == 130
        assert capsys.readouterr().err == f"\npacker: interrupted{hint}" + (" from them (--fresh starts over)\n"
                                                                             if hint else "\n")


def test_ctrl_c_while_the_command_line_is_still_loading_is_one_line_and_130(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The console script imports packer.cli (click, numpy, dask) first; a Ctrl-C then is not a traceback."""
    import importlib.abc

    import packer
    from packer import console

    class Interrupted(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> None:
            if name == "packer.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "packer.cli")
    monkeypatch.delattr(packer, "cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupted(), *sys.meta_path])
    with pytest.raises(SystemExit) as caught:
        console.main()
    assert caught.value.code == 130
    assert capsys.readouterr().err.strip() == "packer: interrupted"
    monkeypatch.undo()
    assert sys.modules["packer.cli"].main is main


def test_an_output_url_the_build_cannot_use_fails_before_anything_is_decoded(demo_raw: Any, tmp_path: Path) -> None:
    """An unknown protocol or a storage option the store does not take used to surface after the whole build."""
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    env = {"PACKER_WORK_DIR": str(tmp_path / "work")}
    unknown = CliRunner().invoke(main, ["build", str(job), "--out", "s5://bucket/x", "-q"], env=env)
    assert unknown.exit_code == 2 and "Protocol not known: s5" in unknown.output
    pytest.importorskip("s3fs")
    wrong = CliRunner().invoke(main, ["build", str(job), "--out", "s3://bucket/x", "--storage-option", "foo=bar",
                                      "-q"], env=env)
    assert wrong.exit_code == 2 and "the storage options (given: foo) are not accepted" in wrong.output
    assert not (tmp_path / "work").exists()  # no cache, no decoding


def test_the_console_script_reads_names_and_tables_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """Under a locale whose encoding is not UTF-8 (here C with Python's UTF-8 coercions off, as a
    Latin-1 locale does too) Python decoded file names by the locale: café.png was a file 'not
    valid UTF-8' ('rename it with convmv', which would garble it), its row a missing file; a
    class name the locale cannot spell crashed the summary. The console script runs in UTF-8
    mode instead: the same dataset, the same hash, the summary printed."""
    import cv2
    import numpy as np

    raw = tmp_path / "raw"
    raw.mkdir()
    rows = ["path,label,entity"]
    for n, (name, label) in enumerate([("café.png", "結節"), ("plain.png", "normal"), ("b.png", "normal")]):
        cv2.imwrite(str(raw / name), np.random.default_rng(n).integers(0, 255, (24, 24), dtype=np.uint8))
        rows.append(f"{name},{label},P{n}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    doc = {"name": "loc", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": {"by": "entity", "seed": 1}, "transform": {"image": {"size": [24, 24]}},
           "pack": {"format": "webdataset"}, "output": "out", "phi": {"mode": "keep"}}
    job = write_job(tmp_path, doc)
    exe = Path(sys.executable).with_name("packer")
    hashes = {}
    for case, env in {"utf-8": {"LC_ALL": "C.UTF-8"},
                      "C": {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}}.items():
        proc = subprocess.run([str(exe), "build", str(job), "--scheduler", "sync", "--no-report"], text=True,
                              capture_output=True, timeout=300, cwd=tmp_path,
                              env={**{k: v for k, v in os.environ.items() if not k.startswith("LC_")}, **env})
        assert proc.returncode == 0, f"{case}:\n{proc.stderr}"
        assert "bad samples: 0 of 3" in proc.stderr + proc.stdout, f"{case}:\n{proc.stderr}"
        hashes[case] = [line for line in (proc.stdout + proc.stderr).splitlines() if "dataset_hash" in line]
    assert hashes["C"] == hashes["utf-8"] and hashes["C"], hashes


@pytest.mark.parametrize("number", [errno.EMFILE, errno.ENFILE])
def test_running_out_of_file_descriptors_is_a_resource_error_naming_the_file_and_ulimit(
        number: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Too many open files is the machine's limit, not a bug: exit 6 (as a refused write), one line
    naming the file and saying to raise the limit, no traceback."""
    from packer.commands import exits

    @exits
    def opens_too_many() -> None:
        raise OSError(number, os.strerror(number), "/cache/0a1b.spill")

    with pytest.raises(SystemExit) as stopped:
        opens_too_many()
    assert stopped.value.code == 6
    err = capsys.readouterr().err
    assert "/cache/0a1b.spill" in err and "Traceback" not in err and "internal error" not in err
    assert ("ulimit -n" if number == errno.EMFILE else "fs.file-max") in err
