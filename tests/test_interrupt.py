"""Ctrl-C in a terminal during `packer build` on the local dask cluster (issue 18): exit 130, packer's
one line and nothing from dask, and a build cache the same command resumes from.

A terminal sends SIGINT to its whole foreground process group, packer's dask worker processes
included; these tests do the same to a real `packer build` started in its own session, at several
moments of the build: one second in, and moments told by what the build has done so far (a fixed
delay lands in a different stage on every machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.demo_version import committed_demo
from tests.helpers import REPO

pytestmark = pytest.mark.slow

PACKER = Path(sys.executable).with_name("packer")
INTERRUPTED = ("packer: interrupted; files decoded so far stay in the build cache, and the same command resumes "
               "from them (--fresh starts over)")
#: What dask's workers, nannies and loggers printed over packer's line before issue 18 was fixed.
NOISE = ("Traceback", "distributed.", "Nanny", "Status.init", "KeyboardInterrupt", "Error", "Exception")
#: packer's own lines a build may print before the interrupt: its "N input files, running on ..."
#: line (and any other "packer: ..." line) and a stage's progress line.
PACKER_LINE = re.compile(r"packer: |\s*[a-z]+: \d+/\d+ ")


class Build:
    """A `packer build` of the demo job in its own session (as a terminal runs a foreground job),
    its stdout and stderr read together, as a terminal shows them, while it runs."""

    def __init__(self, job: Path, out: Path, work: Path, *args: str) -> None:
        self.out, self.work = out, work
        self.proc = subprocess.Popen([str(PACKER), "build", str(job), "--out", str(out), "--workers", "2", *args],
                                     env={**os.environ, "PACKER_WORK_DIR": str(work)}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     preexec_fn=_terminal_sigint)
        self.started = time.monotonic()
        self.lines: list[str] = []
        self.workers: list[psutil.Process] = []  # dask's worker processes when SIGINT was sent
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def interrupt_when(self, moment: Callable[[Build], bool], timeout: float = 180, *,
                       signum: int = signal.SIGINT, group: bool = True) -> None:
        """Send SIGINT to the build's process group, as Ctrl-C in a terminal does, once ``moment``
        holds (or ``signum``, to the group or to packer's process alone); fail if the build ends first."""
        deadline = time.monotonic() + timeout
        while not moment(self):
            if self.proc.poll() is not None:
                pytest.fail(f"the build ended (exit {self.proc.returncode}) before it could be interrupted:\n"
                            f"{self.finish()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"the moment to interrupt never came in {timeout}s:\n{self.finish()}")
            time.sleep(0.005)
        self.workers = [child for child in self.children() if "spawn_main" in _cmdline(child)]
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            os.kill(self.proc.pid, signum)

    def finish(self, timeout: float = 180) -> str:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return self.output

    def children(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []

    def cache_files(self, pattern: str) -> list[Path]:
        """Build cache files matching ``pattern``, wherever this packer keeps the cache (under
        $PACKER_WORK_DIR, or in the output tree as older packers did)."""
        return [*self.work.rglob(pattern), *self.out.rglob(pattern)]


def _terminal_sigint() -> None:
    """In the child before exec: SIGINT as a terminal's foreground job has it. A suite started
    in the background by a non-interactive shell inherits SIGINT ignored, and an ignored signal
    stays ignored across exec; packer then rightly never sees the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def python_sigint() -> Any:
    """Python's own SIGINT handler (KeyboardInterrupt) in this process for one test, whatever
    the suite inherited (see :func:`_terminal_sigint`); the inherited one is put back after."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""  # gone (or going) since it was listed


def one_second_in(build: Build) -> bool:
    """A clock, as a person would press Ctrl-C (on a 2-core machine, while the cluster starts), but
    not before packer's command runs (it has a child process): on a loaded machine Python can
    still be importing packer after a second, before packer can catch anything."""
    return time.monotonic() - build.started >= 1.0 and bool(build.children())


def worker_processes_starting(build: Build) -> bool:
    """LocalCluster is starting: a worker process exists (it may still be importing dask)."""
    return any("spawn_main" in _cmdline(child) for child in build.children())


def pixel_pass_started(build: Build) -> bool:
    """The cluster is up and the first chunks are submitted: packer printed its "running on" line."""
    return any("running on local dask cluster" in line for line in build.lines)


def chunk_being_spilled(build: Build) -> bool:
    """Mid pixel pass: a worker is writing a chunk's spill file (``*.partial``)."""
    return bool(build.cache_files("*.partial"))


def chunk_cached(build: Build) -> bool:
    """Mid pixel pass: at least one chunk is complete in the build cache (spill and records)."""
    return any(spill.with_suffix(".json").is_file() for spill in build.cache_files("*.spill"))


def shard_packed(build: Build) -> bool:
    """Mid pack pass: a shard is complete in the staging folder, so its samples' spill bytes are
    being freed (the resumed build decodes those chunks again)."""
    return bool(list(build.out.glob("demo/.staging-*/*.tar")))


def version_published(build: Build) -> bool:
    """The version's manifest is in place, and the build is finishing (pointers, report, summary)."""
    return bool(list(build.out.glob("demo/*/manifest.json")))


MOMENTS: dict[str, Callable[[Build], bool]] = {
    "version-published": version_published,
    "one-second-in": one_second_in,
    "workers-starting": worker_processes_starting,
    "pixel-pass-started": pixel_pass_started,
    "chunk-being-spilled": chunk_being_spilled,
    "chunk-cached": chunk_cached,
    "shard-packed": shard_packed,
}


def dataset_hash(output: str) -> str:
    found = re.search(r"dataset_hash ([0-9a-f]{64})", output)
    assert found, f"no dataset_hash line in:\n{output}"
    return found.group(1)


@pytest.fixture(scope="module")
def job(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed demo job, verbatim, beside a copy of the session's demo raw tree, as
    `make demo` lays them out: the job's relative source paths are part of its config hash, so
    this job builds to the committed demo manifest (its registry copy goes to tmp/manifests)."""
    tmp = tmp_path_factory.mktemp("interrupt-demo")
    shutil.copytree(demo_raw.root, tmp / "demo-raw")
    (tmp / "workflows").mkdir()
    return Path(shutil.copy(REPO / "workflows" / "demo.yaml", tmp / "workflows" / "demo.yaml"))


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    """The committed demo manifest (manifests/demo/<version>.json): what an uninterrupted build gives."""
    return committed_demo()


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_ctrl_c_prints_one_line_exits_130_and_the_same_command_resumes(
        moment: str, job: Path, committed: dict[str, Any], tmp_path: Path) -> None:
    build = Build(job, tmp_path / "out", tmp_path / "work", "--fresh")
    build.interrupt_when(MOMENTS[moment])
    output = build.finish()

    assert build.proc.returncode == 130, output
    for noise in NOISE:
        assert noise not in output, f"dask's {noise!r} reached the terminal:\n{output}"
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines and lines[-1] == INTERRUPTED, output
    # at most: the header, the process bar, the near-copy bar, the near-copy summary, (once the version
    # is published) the pack bar, the one line
    assert len(lines) <= (6 if moment == "version-published" else 5), output
    assert all(PACKER_LINE.match(line) for line in lines), output
    _, alive = psutil.wait_procs(build.workers, timeout=30)
    assert not alive, f"dask worker processes outlived the interrupted build: {alive}"

    resumed = Build(job, tmp_path / "out", tmp_path / "work")  # the same command, as the message says (no --fresh)
    again = resumed.finish()
    assert resumed.proc.returncode == 0, again
    version = dataset_hash(again)[:12]
    manifest = json.loads((tmp_path / "out" / "demo" / version / "manifest.json").read_text())
    if manifest["libraries"] != committed["libraries"]:
        pytest.fail(f"library versions differ from the committed demo manifest ({committed['libraries']} → "
                    f"{manifest['libraries']}); the bytes may legitimately change: re-run `make demo` and commit")
    assert dataset_hash(again) == committed["dataset_hash"], again
    if moment in ("chunk-cached", "version-published"):
        reused = re.search(r"packer: reused (\d+) of \d+ files from the build cache", again)
        assert reused and int(reused.group(1)) > 0, f"the chunks cached before Ctrl-C were decoded again:\n{again}"


@pytest.mark.parametrize(("moment", "group"), [("workers-starting", True), ("pixel-pass-started", False)])
def test_sigterm_ends_a_build_as_ctrl_c_does_with_exit_143_and_the_same_command_resumes(
        moment: str, group: bool, job: Path, committed: dict[str, Any], tmp_path: Path) -> None:
    """SIGTERM, as `kill PID` sends it to packer alone and a batch scheduler's cancel (Slurm's
    scancel) to every process of the job: one line, exit 143 (128 + 15), the workers gone, and
    the build cache kept for the same command. Python's default ended the process on the spot,
    with no line and the resource tracker's "leaked semaphore" warning; a group SIGTERM while
    the workers started was reported as "Nanny failed to start" with advice about scripts."""
    build = Build(job, tmp_path / "out", tmp_path / "work", "--fresh")
    build.interrupt_when(MOMENTS[moment], signum=signal.SIGTERM, group=group)
    output = build.finish()

    assert build.proc.returncode == 143, output
    for noise in (*NOISE, "leaked", "Nanny failed"):
        assert noise not in output, f"{noise!r} reached the terminal:\n{output}"
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines and lines[-1] == INTERRUPTED.replace("interrupted", "stopped by SIGTERM"), output
    _, alive = psutil.wait_procs(build.workers, timeout=30)
    assert not alive, f"dask worker processes outlived the stopped build: {alive}"
    resumed = Build(job, tmp_path / "out", tmp_path / "work")
    again = resumed.finish()
    assert resumed.proc.returncode == 0, again
    assert dataset_hash(again) == committed["dataset_hash"], again


def test_local_cluster_workers_block_sigint_and_packer_does_not(python_sigint: None) -> None:
    """The mechanism: the worker processes start with SIGINT blocked (a terminal's Ctrl-C never
    reaches them), while packer's main thread still takes it as KeyboardInterrupt, which closes
    the cluster and leaves Python's SIGINT handler as it found it."""
    from packer.pipeline.cluster import open_executor

    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), open_executor(None, 2) as executor:
        assert executor.client is not None
        masks = executor.client.run(lambda: sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        assert len(masks) == 2 and all({signal.SIGINT, signal.SIGTERM} <= set(mask) for mask in masks.values()), masks
        assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
        client = executor.client
        signal.raise_signal(signal.SIGINT)
    assert executor.interrupted
    assert client.status == "closed"
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_finished_build_silences_its_workers_loggers_before_closing_the_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker heartbeat that meets a scheduler already closing logs a CommClosedError traceback
    (dask/distributed #9032) under a build that succeeded: packer's own workers are silenced
    first, then the client and the cluster close."""
    from distributed import Client

    from packer.pipeline import cluster as cluster_module

    calls: list[tuple[int, str]] = []  # (the client's id, what was called): other clients (an earlier
    run, close = Client.run, Client.close  # test's, garbage-collected now) may close meanwhile

    def spy_run(self: Client, function: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((id(self), getattr(function, "__name__", repr(function))))
        return run(self, function, *args, **kwargs)

    def spy_close(self: Client, *args: Any, **kwargs: Any) -> Any:
        calls.append((id(self), "close"))
        return close(self, *args, **kwargs)

    monkeypatch.setattr(Client, "run", spy_run)
    monkeypatch.setattr(Client, "close", spy_close)
    with cluster_module.open_executor(None, 1) as executor:
        assert executor.client is not None
        client = executor.client
    assert client.status == "closed"
    ours = [name for who, name in calls if who == id(client)]
    assert ours[:2] == ["_quiet_worker", "close"], calls


def test_a_build_stopped_once_its_version_is_published_leaves_the_cache_it_resumes_from(
        job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache's pointers to where the samples sit in the published version were written after
    the manifest landed: a build stopped in between (SIGINT, kill -9) left a complete version and
    no pointer, its spill already consumed by the pack pass, and the same command decoded every
    file again. The pointers now go first."""
    from packer.config import load_job
    from packer.pipeline import build as build_module
    from packer.pipeline.build import BuildOptions, build

    publish = build_module._publish

    def published_then_stopped(*args: Any, **kwargs: Any) -> Any:
        publish(*args, **kwargs)
        raise KeyboardInterrupt  # the moment after the manifest's rename

    options = BuildOptions(scheduler="sync", quiet=True, html_report=False, out=tmp_path / "out",
                           cache_dir=tmp_path / "cache")
    monkeypatch.setattr(build_module, "_publish", published_then_stopped)
    with pytest.raises(KeyboardInterrupt):
        build(load_job(job), options)
    monkeypatch.setattr(build_module, "_publish", publish)
    again = build(load_job(job), options)
    assert again.files_decoded == 0 and again.files_cached > 0, (again.files_decoded, again.files_cached)


def test_a_cache_that_cannot_take_the_pointers_does_not_stop_the_version_being_published(
        job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pointers go before the manifest; a full or read-only cache (packer's FileSystemError,
    exit 6) raised there left every shard written and no manifest. The version is published, then
    the cache's failure is raised."""
    from packer.config import load_job
    from packer.errors import FileSystemError
    from packer.pipeline import build as build_module
    from packer.pipeline.build import BuildOptions, build

    def full(*args: Any, **kwargs: Any) -> int:
        raise FileSystemError("cannot write the pointer: the file system is full")

    monkeypatch.setattr(build_module, "write_packed_pointers", full)
    with pytest.raises(FileSystemError, match="the file system is full"):
        build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False, out=tmp_path / "out",
                                          cache_dir=tmp_path / "cache"))
    assert len(list((tmp_path / "out" / "demo").glob("*/manifest.json"))) == 1

