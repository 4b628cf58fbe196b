"""What a `packer build` killed mid-write leaves behind, and who removes it.

Every leftover here is made by packer's own code in a process that is then killed (SIGKILL, as
``kill -9`` or the OOM killer does): :func:`packer.files.atomic_output` with ``shared=True`` for a
report or registry copy (named ``<file>.<pid>-<hex>.partial`` for its writer), the build's
shared-folder probe for a first build killed before it published anything. A temporary whose
writer still runs (this test process stands for a `packer report` writing beside a build) must
survive every cleanup. Sizes are counted with ``os.stat`` over the folders, not by the code under
test.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from packer.commands.gc import gc_command
from packer.commands.inspect import ls_command
from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import demo_job_doc, write_job

CLI = click.Group(commands=[ls_command, gc_command])
CLEANUP_LINE = "packer: removed 1 stale temporary file(s) left by an interrupted build"


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(CLI, [str(a) for a in args])


def killed_while_writing(target: Path) -> Path:
    """Run ``atomic_output(target, shared=True)`` in a new process that is SIGKILLed halfway
    through its write; return the temporary it left beside ``target``."""
    before = set(target.parent.glob("*.partial"))
    script = textwrap.dedent("""
        import os, signal, sys
        from pathlib import Path
        from packer.files import atomic_output
        with atomic_output(Path(sys.argv[1]), shared=True) as fh:
            fh.write(b"<html>" * 20000)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    (left,) = set(target.parent.glob("*.partial")) - before
    assert left.name.startswith(f"{target.name}.") and left.stat().st_size == 120000
    return left


def written_by_this_process(target: Path) -> Path:
    """A temporary as a running writer (a `packer report` beside the build: this test process) names it."""
    path = target.with_name(f"{target.name}.{os.getpid()}-0badcafe.partial")
    path.write_bytes(b"half a report")
    return path


@dataclass(frozen=True)
class Built:
    raw: Path
    out: Path
    registry: Path
    version: str


@pytest.fixture(scope="module")
def built(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("interrupts")
    result = _build(demo_raw.root, tmp / "out", tmp / "manifests", tmp / "job", quiet=True)
    return Built(raw=demo_raw.root, out=tmp / "out", registry=tmp / "manifests", version=result.version_dir.name)


def _build(raw: Path, out: Path, registry: Path, job_folder: Path, *, quiet: bool) -> BuildResult:
    job = load_job(write_job(job_folder, demo_job_doc(raw, out, registry=str(registry))))
    return build(job, BuildOptions(scheduler="sync", quiet=quiet, html_report=True))


def copy_of(built: Built, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the built output folder and registry folder: (dataset folder, registry folder)."""
    shutil.copytree(built.out, tmp_path / "out")
    shutil.copytree(built.registry, tmp_path / "manifests")
    return tmp_path / "out" / "demo", tmp_path / "manifests"


def files_bytes(folder: Path, *, but: str = ".partial") -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.name.endswith(but))


def test_a_report_half_written_by_a_killed_build_is_not_the_versions_and_gc_removes_it(built: Built,
                                                                                       tmp_path: Path) -> None:
    """kill -9 while the build wrote report.html left ``report.html.<pid>-<hex>.partial`` in the
    published version folder: `packer ls` counted its 120 kB as the version's, `packer gc` left
    it there for ever. ls lists it apart, as what it is; gc removes it, as it removes the dataset
    folder's own temporaries, but leaves the one a running `packer report` is writing."""
    root, _ = copy_of(built, tmp_path)
    version = root / built.version
    dead = killed_while_writing(version / "report.html")
    live = written_by_this_process(version / "report.html")

    listed = invoke("ls", root, "--json")
    assert listed.exit_code == 0, listed.output
    listing = json.loads(listed.output)
    (usage,) = listing["versions"]
    assert usage["bytes"] == files_bytes(version)
    assert {"folder": f"{built.version}/{dead.name}", "kind": "temporary", "bytes": 120000} in listing["others"]
    shown = invoke("ls", root)
    assert f"{built.version}/{dead.name}" in shown.output and "a temporary file of a build" in shown.output

    gc = invoke("gc", root, "--keep", "1")
    assert gc.exit_code == 0, gc.output
    assert f"removed {built.version}/{dead.name}" in gc.output
    assert not dead.exists()
    assert live.read_bytes() == b"half a report"  # its writer runs: never removed under it
    assert (version / "report.html").is_file() and (version / "manifest.json").is_file()


def test_the_same_build_again_removes_the_report_a_killed_build_half_wrote(built: Built, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """README: "building the job again writes both" (report and registry copy); it wrote
    report.html but left the killed build's temporary beside it. It removes it now, saying so
    as it says of the dataset folder's temporaries, and leaves a running writer's alone."""
    root, registry = copy_of(built, tmp_path)
    version = root / built.version
    dead = killed_while_writing(version / "report.html")
    live = written_by_this_process(version / "report.html")
    result = _build(built.raw, tmp_path / "out", registry, tmp_path / "job", quiet=False)
    assert result.version_dir == version
    assert not dead.exists()
    assert live.exists()
    assert CLEANUP_LINE in capsys.readouterr().out


def test_a_registry_copy_half_written_by_a_killed_build_is_named_by_ls_and_removed_by_the_next_build(
        built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kill -9 while the build copied its manifest into the registry left
    ``<version>.json.<pid>-<hex>.partial`` in a folder README has users commit; building the job
    again never removed it and `packer ls REGISTRY` skipped it without a word. ls names it; the
    next build removes it (its writer is gone), never a running writer's: no lock covers the
    registry, builds of two outputs write it at once."""
    _, registry = copy_of(built, tmp_path)
    copy = registry / "demo" / f"{built.version}.json"
    dead = killed_while_writing(copy)
    live = written_by_this_process(copy)

    shown = invoke("ls", registry)
    assert shown.exit_code == 0, shown.output
    assert built.version in shown.output
    assert f"{dead}: not a manifest: a registry copy half written by a `packer build` that was killed" in shown.output
    assert json.loads(invoke("ls", registry, "--json").output)[0]["path"] == str(copy)  # --json lists manifests only

    result = _build(built.raw, tmp_path / "out", registry, tmp_path / "job", quiet=False)
    assert result.registry_copy == copy
    assert CLEANUP_LINE in capsys.readouterr().out
    assert sorted(p.name for p in copy.parent.iterdir()) == sorted([copy.name, live.name])


def probe_left_by_a_killed_first_build(root: Path) -> Path:
    """What a first build killed mid pixel pass leaves in its dataset folder: its shared-folder
    probe (made by the build's own code in a process then killed)."""
    script = textwrap.dedent("""
        import os, signal, sys
        from pathlib import Path
        from packer.pipeline.build import _shared_probe
        with _shared_probe(Path(sys.argv[1]), "choose another output folder"):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    (probe,) = root.iterdir()
    assert probe.name.startswith("shared-probe-") and probe.name.endswith(".partial")
    return probe


def held_like_a_build(root: Path) -> int:
    """Take the dataset folder's lock as a running `packer build` holds it; the caller closes the fd."""
    fd = os.open(root, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_dataset_folder_a_killed_first_build_left_only_its_probe_in_is_listed_and_cleaned(tmp_path: Path) -> None:
    """README: `packer ls OUTPUT/NAME` lists a build's ``*.partial`` files as what they are and
    `packer gc` removes them. With only the probe there (no version yet), ls said "no manifests"
    and gc "not a dataset folder; it holds no version folder" (exit 2), removing nothing."""
    root = tmp_path / "out" / "demo"
    probe = probe_left_by_a_killed_first_build(root)

    shown = invoke("ls", root)
    assert shown.exit_code == 0, shown.output
    assert f"{probe.name}" in shown.output and "a temporary file of a build" in shown.output

    fd = held_like_a_build(root)  # a build running now: gc says so, and removes nothing
    try:
        busy = invoke("gc", root, "--keep", "1")
    finally:
        os.close(fd)
    assert busy.exit_code == 2
    assert f"{root}: a `packer build` of this dataset, or another `packer gc` of it, is running" in busy.output
    assert probe.exists()

    gc = invoke("gc", root, "--keep", "1")
    assert gc.exit_code == 0, gc.output
    assert f"removed {probe.name}" in gc.output
    assert list(root.iterdir()) == []


def test_a_first_build_that_holds_the_lock_and_wrote_nothing_yet_is_not_blamed_on_the_path(tmp_path: Path) -> None:
    root = tmp_path / "out" / "demo"
    root.mkdir(parents=True)
    fd = held_like_a_build(root)
    try:
        busy = invoke("gc", root, "--keep", "1")
    finally:
        os.close(fd)
    assert busy.exit_code == 2
    assert "is running" in busy.output and "not a dataset folder" not in busy.output


def test_a_folder_of_other_partial_files_is_still_no_dataset_folder(tmp_path: Path) -> None:
    """Only packer's own names make a dataset folder: gc never cleans an arbitrary folder."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "scan.zip.partial").write_bytes(b"half a download")
    gc = invoke("gc", folder, "--keep", "1")
    assert gc.exit_code == 2
    assert f"{folder}: not a dataset folder; it holds no version folder" in gc.output
    assert (folder / "scan.zip.partial").exists()
