"""Same bytes on any dask cluster; a lost worker changes nothing; a crashing file is isolated."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, WorkerPlugin

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import REPO, demo_job_doc, write_job


def run(demo_raw: Any, tmp_path: Path, scheduler: str | None, workers: int | None = None) -> BuildResult:
    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "out")))
    return build(job, BuildOptions(scheduler=scheduler, workers=workers, quiet=True, cache_dir=tmp_path / "cache"))


def shard_bytes(result: BuildResult) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(result.version_dir.glob("*-0*.*"))}


@pytest.fixture(scope="module")
def reference(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    return run(demo_raw, tmp_path_factory.mktemp("sync"), "sync")


@contextlib.contextmanager
def cli_cluster(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A scheduler and one single-threaded worker started with the ``dask`` command, as on a real
    cluster: (the scheduler file to connect to, the scheduler's process); both killed at the end."""
    scheduler_file = tmp_path / "scheduler.json"
    dask_cli = str(Path(sys.executable).with_name("dask"))
    scheduler = subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", str(scheduler_file)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        worker = subprocess.Popen([dask_cli, "worker", "--scheduler-file", str(scheduler_file), "--nworkers", "1",
                                   "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with Client(scheduler_file=str(scheduler_file), timeout="60s") as client:
            client.wait_for_workers(1, timeout=60)
        yield scheduler_file, scheduler
    finally:
        for proc in (worker, scheduler):
            if proc is not None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.mark.slow  # a LocalCluster and a CLI-started scheduler and worker
def test_in_process_local_cluster_and_cli_started_cluster_give_the_same_bytes(
        demo_raw: Any, reference: BuildResult, tmp_path: Path) -> None:
    local = run(demo_raw, tmp_path / "local", None, workers=2)
    with cli_cluster(tmp_path) as (scheduler_file, _):
        remote = run(demo_raw, tmp_path / "remote", str(scheduler_file))
    assert local.manifest["dataset_hash"] == remote.manifest["dataset_hash"] == reference.manifest["dataset_hash"]
    assert shard_bytes(local) == shard_bytes(remote) == shard_bytes(reference)


class KillOnce(WorkerPlugin):
    """Kill the worker process the first time any pixel-pass task starts executing."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing" and str(key).startswith("process-") and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)


class Poison(WorkerPlugin):
    """Kill the worker whenever a task that reads the poisoned file runs (chunks, then the isolated file)."""

    def __init__(self, sample_id: str) -> None:
        self.sample_id = sample_id

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        name = str(key)
        if finish == "executing" and (name.startswith("process-") or self.sample_id in name):
            os._exit(1)


def register(cluster: LocalCluster, plugin: WorkerPlugin) -> None:
    """Install a worker plugin (kept by the scheduler for restarted workers too), then close
    this client so the build's own client is the only one in the process."""
    with Client(cluster) as client:
        client.register_plugin(plugin)


@pytest.mark.slow  # a real dask cluster
def test_a_worker_killed_mid_build_changes_nothing(demo_raw: Any, reference: BuildResult, tmp_path: Path) -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        register(cluster, KillOnce(str(tmp_path / "killed")))
        result = run(demo_raw, tmp_path, cluster.scheduler_address)
    assert (tmp_path / "killed").exists()  # the kill really happened
    assert result.manifest["dataset_hash"] == reference.manifest["dataset_hash"]
    assert shard_bytes(result) == shard_bytes(reference)


@pytest.mark.slow  # a real dask cluster
def test_a_file_that_crashes_its_worker_becomes_a_decoder_crash_record(demo_raw: Any, reference: BuildResult,
                                                                       tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    victim = sorted(pq.read_table(reference.version_dir / "_index.parquet").column("key").to_pylist())[0]
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        register(cluster, Poison(victim))
        result = run(demo_raw, tmp_path, cluster.scheduler_address)
    crashed = [r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl") if r["reason"] == "decoder_crash"]
    assert [r["sample_id"] for r in crashed] == [victim]
    assert result.manifest["inputs"]["samples"] == reference.manifest["inputs"]["samples"] - 1
    assert result.manifest["bad_samples"]["total"] == reference.manifest["bad_samples"]["total"] + 1


@pytest.mark.slow  # a real dask cluster
def test_chunks_grouped_into_fewer_tasks_give_the_same_bytes(demo_raw: Any, reference: BuildResult, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouping chunks into tasks is a scheduling matter only: chunks, cache entries and bytes stay."""
    import packer.pipeline.pixels as process

    monkeypatch.setattr(process, "GROUPS_PER_THREAD", 1)   # the demo's few chunks, two per task
    seen: list[int] = []
    sizing = process.group_size

    def recording(chunks: int, threads: int) -> int:
        size = sizing(chunks, threads)
        seen.extend(min(size, chunks - start) for start in range(0, chunks, size))
        return size

    monkeypatch.setattr(process, "group_size", recording)
    result = run(demo_raw, tmp_path, None, workers=2)
    assert max(seen) > 1 and sum(seen) == len(list((tmp_path / "cache").glob("*/*.packed.json")))
    assert result.manifest["dataset_hash"] == reference.manifest["dataset_hash"]
    assert shard_bytes(result) == shard_bytes(reference)


def test_group_sizes_leave_every_worker_thread_enough_tasks() -> None:
    from packer.pipeline.pixels import GROUPS_PER_THREAD, MAX_GROUP, group_size

    assert group_size(337, 0) == 1                                               # in-process: no grouping
    size = group_size(337, 2)
    assert size == 337 // (GROUPS_PER_THREAD * 2) and -(-337 // size) >= GROUPS_PER_THREAD * 2
    assert group_size(100_000, 2) == MAX_GROUP
    assert group_size(20, 2) == 1                                                # small builds: one chunk a task


class _Payload:
    """A task argument that stands for a chunk's or a shard's records."""

    def __init__(self, n: int) -> None:
        self.values = list(range(n))


def _length(payload: _Payload) -> int:
    return len(payload.values)


@pytest.mark.slow  # a real dask cluster
def test_the_client_keeps_no_copies_of_finished_tasks_arguments() -> None:
    # dask's comm message log (1000 batches by default) held the unpickled specs, arguments
    # included, of every task: a copy of every record of a build on the client.
    import gc

    from packer.pipeline.cluster import open_executor

    with open_executor(None, workers=1) as executor:
        payloads = [_Payload(1000) for _ in range(12)]
        lengths = sorted(result for _, result in executor.map_unordered(_length, payloads))
        assert lengths == [1000] * 12
        del payloads
        deadline = time.monotonic() + 10
        while True:  # releasing finished futures is asynchronous on the scheduler
            gc.collect()
            alive = sum(type(o) is _Payload for o in gc.get_objects())
            if alive == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert alive == 0, f"{alive} task arguments still held on the client after their tasks finished"


def _cache_fix(_: int) -> str:
    """What a worker's full cache disk would tell the caller to do (packer.pipeline.spill)."""
    from packer.pipeline.spill import cache_elsewhere

    return cache_elsewhere()


@pytest.mark.slow  # a real dask cluster
def test_a_message_made_in_a_worker_names_the_options_as_the_caller_gave_them() -> None:
    """The caller's surface travels with each task: from packer.build a worker's message names
    ``cache_dir=DIR``, which a notebook can pass, not ``--cache-dir DIR``, which it cannot."""
    from packer.errors import COMMAND_LINE, PYTHON_API, called_from
    from packer.pipeline.cluster import open_executor

    with open_executor(None, workers=1) as executor:
        said = {}
        for caller in (PYTHON_API, COMMAND_LINE):
            with called_from(caller):
                said[caller.python] = {fix for _, fix in executor.map_unordered(_cache_fix, [0, 1])}
    assert said == {True: {"choose another cache folder (packer.build(..., cache_dir=DIR), or set PACKER_WORK_DIR)"},
                    False: {"choose another cache folder (packer build --cache-dir DIR, or set PACKER_WORK_DIR)"}}


def _worker_profiles(_: int) -> bool:
    import dask

    return bool(dask.config.get("distributed.worker.profile.enabled"))


@pytest.mark.slow  # a real dask cluster
def test_the_local_clusters_workers_run_without_dasks_statistical_profiler() -> None:
    # sampling every task's stack every 10 ms cost a SEG + RTSTRUCT build a tenth of its worker
    # CPU, for a dashboard page packer never reads; the setting must reach the worker processes
    import dask

    from packer.pipeline.cluster import open_executor

    with open_executor(None, workers=1) as executor:
        seen = [result for _, result in executor.map_unordered(_worker_profiles, [0])]
        assert executor.client is not None
        in_worker = executor.client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
    assert seen == [False]
    assert list(in_worker.values()) == [False]
    assert dask.config.get("distributed.worker.profile.enabled") is True  # the caller's own config is left as it was


@pytest.mark.slow  # two real dask clusters in a subprocess
def test_a_second_local_cluster_in_the_same_process_starts() -> None:
    # a fresh interpreter, so that distributed is first imported by open_executor itself:
    # leaving the first cluster used to delete dask's whole "distributed" config
    code = ("from packer.pipeline.cluster import open_executor\n"
            "for _ in range(2):\n"
            "    with open_executor(None, workers=1) as executor:\n"
            "        assert [r for _, r in executor.map_unordered(abs, [-1])] == [1]\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


#: A task that fails with an error quoting a raw path whose folder is named after a patient
FAILING_TASK = """
from packer.pipeline.cluster import open_executor

def read(path):
    raise RuntimeError(f"cannot decode {{path}}: unexpected end of stream")

with open_executor(None, workers=1, private={private}) as executor:
    try:
        list(executor.map_unordered(read, ["/raw/DOE^JANE_0001/IM1.dcm"], ["process-ct-0123456789abcdef-1-x"]))
    except RuntimeError as err:
        print("the client got", type(err).__name__)
"""


@pytest.mark.slow  # real dask clusters in subprocesses
@pytest.mark.parametrize("private", [True, False])
def test_under_pseudonymization_dask_does_not_print_a_failed_tasks_error_with_its_raw_path(private: bool) -> None:
    """dask's workers log a task that raised ("Compute Failed") with its exception's text on stderr,
    where a raw path names a patient's folder; the client gets the error all the same."""
    out = subprocess.run([sys.executable, "-c", FAILING_TASK.format(private=private)], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "the client got RuntimeError", out.stderr[-2000:]
    assert ("DOE^JANE" in out.stderr) is (not private), out.stderr[-2000:]


@pytest.mark.parametrize(("mode", "private"), [("pseudonymize", True), ("keep", False)])
def test_build_and_validate_open_a_private_cluster_under_pseudonymization(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, private: bool) -> None:
    from click.testing import CliRunner

    import packer.pipeline.build as build_module
    import packer.pipeline.datacheck as datacheck_module
    from packer.cli import main

    asked: list[bool] = []
    for module in (build_module, datacheck_module):
        real = module.open_executor  # type: ignore[attr-defined]

        def noted(*args: Any, real: Any = real, **kwargs: Any) -> Any:
            asked.append(kwargs.get("private", False))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, "open_executor", noted)
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["phi"] = {**doc["phi"], "mode": mode}
    job = write_job(tmp_path, doc)
    for command in (["build", str(job), "--no-report"], ["validate", str(job), "--quick"]):
        result = CliRunner().invoke(main, [*command, "--scheduler", "sync", "-q"])
        assert result.exit_code == 0, result.output
    assert asked == [private, private]


def test_a_lazy_task_list_is_made_one_item_at_a_time_as_tasks_are_submitted() -> None:
    from packer.pipeline.cluster import Executor, LazySequence

    made: list[int] = []

    def make(i: int) -> int:
        made.append(i)
        return i

    items = LazySequence(40, make)
    assert len(items) == 40 and items[-1] == 39 and items[2:5] == [2, 3, 4]
    with pytest.raises(IndexError, match="item 40 of 40"):
        items[40]
    made.clear()
    results = Executor(None, "in-process").map_unordered(abs, items)
    assert next(results) == (0, 0) and made == [0]          # the rest not made yet
    assert [r for _, r in results] == list(range(1, 40)) and made == list(range(40))


def test_on_a_cluster_each_lazy_item_is_made_once() -> None:
    # making an item can cost (a shard's content key hashes every sample's record): submitting
    # one must not make it twice
    from distributed import Client, LocalCluster

    from packer.pipeline.cluster import Executor, LazySequence

    made: list[int] = []

    def make(i: int) -> int:
        made.append(i)
        return i

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        results = sorted(Executor(client, "a thread cluster").map_unordered(abs, LazySequence(30, make)))
    assert results == [(i, i) for i in range(30)]
    assert sorted(made) == list(range(30))


def test_a_scheduler_file_that_does_not_exist_is_a_config_error_that_says_so(tmp_path: Path) -> None:
    """It was an internal error: dask took the path for an address ("missing port number")."""
    from packer.errors import ConfigError
    from packer.pipeline.cluster import open_executor

    missing = tmp_path / "scheduler.json"
    with pytest.raises(ConfigError, match=f"--scheduler {missing}: no such scheduler file"):
        with open_executor(str(missing)):
            pass


@pytest.mark.parametrize(("content", "why"), [("", "it is not a scheduler file's JSON"),
                                               ('{"type": "Scheduler", "addr', "it is not a scheduler file's JSON"),
                                               ("{}", "it names no scheduler address"),
                                               ("[1, 2]", "it is not a scheduler file's JSON")])
def test_an_empty_or_half_written_scheduler_file_is_a_config_error_naming_it(tmp_path: Path, content: str,
                                                                          why: str) -> None:
    """A stale or half-written scheduler file (a scheduler that stopped, or is still starting)
    was an internal error, exit 1: a bare AssertionError from dask's addr_from_args."""
    from packer.errors import ConfigError
    from packer.pipeline.cluster import open_executor

    path = tmp_path / "scheduler.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"--scheduler {path}: {why}.*start the scheduler again"):
        with open_executor(str(path)):
            pass


@pytest.mark.parametrize("address", ["bogus", "localhost", "tcp://"])
def test_a_scheduler_address_without_a_port_is_a_config_error_that_says_so(address: str) -> None:
    """`--scheduler localhost` (or a typo of `sync`) was an internal error: exit 1 and dask's
    traceback ("missing port number in address")."""
    from packer.errors import ConfigError
    from packer.pipeline.cluster import open_executor

    with pytest.raises(ConfigError, match=f"--scheduler {address}: not a dask scheduler address .*tcp://host:port"):
        with open_executor(address):
            pass


def test_a_mistyped_scheduler_is_named_before_the_shared_cache_advice(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --cache-dir a real cluster needs a shared build cache, and the build says so; for
    `--scheduler synk` that advice is beside the point: the address is named first."""
    from click.testing import CliRunner

    from packer.cli import main

    monkeypatch.delenv("PACKER_WORK_DIR", raising=False)  # the default cache: in this user's home
    result = CliRunner().invoke(main, ["build", str(REPO / "workflows" / "demo.yaml"), "--scheduler", "synk",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "--scheduler synk: not a dask scheduler address" in result.output
    assert "build cache" not in result.output
    # a scheduler file that is not there, likewise: following the cache's advice only led to this
    missing = tmp_path / "scheduler.json"
    result = CliRunner().invoke(main, ["build", str(REPO / "workflows" / "demo.yaml"), "--scheduler", str(missing),
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"--scheduler {missing}: no such scheduler file" in result.output and "build cache" not in result.output


def test_workers_given_with_a_scheduler_are_ignored_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    from packer.pipeline.cluster import open_executor

    with open_executor("sync", 3) as executor:
        assert executor.description == "this one process (--scheduler sync)"
    said = capsys.readouterr().err
    assert "packer: warning: --workers 3 sizes the local cluster only" in said
    # sync has no workers: the warning said the tasks ran on "that scheduler's own workers"
    # beside the line saying they run in this one process
    assert "with --scheduler sync every task runs in this one process" in said
    assert "own workers" not in said


def test_a_worker_with_another_packer_or_library_version_packs_nothing_and_the_run_says_which() -> None:
    """A worker started from another environment (another packer, numpy or OpenCV) ran the tasks
    like any other, and the manifest recorded the client's versions over its bytes: a mixed
    dataset that claimed one set of versions."""
    from distributed import Client, LocalCluster

    from packer.errors import ConfigError
    from packer.pipeline.cluster import Executor, check_workers, environment

    ran: list[int] = []

    def record(i: int) -> int:
        ran.append(i)
        return i

    mine = dict(environment())
    assert mine["packer"] and len(mine["packer code"]) == 16 and mine["numpy"] == np.__version__
    client_side = tuple((name, "0.0.0-client" if name == "numpy" else version) for name, version in environment())
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        check_workers(client, environment())
        assert sorted(Executor(client, "same", expected=environment()).map_unordered(record, range(3))) == [
            (0, 0), (1, 1), (2, 2)]
        ran.clear()
        worker = next(iter(client.scheduler_info()["workers"]))
        with pytest.raises(ConfigError) as before:  # when the build connects
            check_workers(client, client_side)
        with pytest.raises(ConfigError) as joined:  # a worker that joins later: its first task
            list(Executor(client, "mixed", expected=client_side).map_unordered(record, range(3)))
    assert ran == []
    for caught in (before, joined):
        message = str(caught.value)
        assert message.startswith(f"dask worker {worker} (numpy {np.__version__} there, 0.0.0-client on the client)")
        assert "packer 0" not in message and "so nothing was packed there" in message  # only what differs is named


@pytest.mark.slow  # a CLI-started scheduler and worker
def test_a_scheduler_killed_mid_run_is_one_line_and_exit_7_not_an_internal_error(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`kill -9` of the scheduler mid-build was exit 1, "internal error (please report it)", after
    dask's FutureCancelledError and its reconnection traceback: a bug report for an outage."""
    import threading

    from packer.errors import ClusterLostError
    from packer.pipeline.cluster import open_executor

    with cli_cluster(tmp_path) as (scheduler_file, scheduler):
        capfd.readouterr()
        started = time.monotonic()
        with pytest.raises(ClusterLostError) as caught:
            with open_executor(str(scheduler_file)) as executor:
                threading.Timer(1.0, scheduler.kill).start()
                list(executor.map_unordered(time.sleep, [30.0, 30.0]))
        assert time.monotonic() - started < 25  # not the tasks' 30 s, not a hang
    assert caught.value.exit_code == 7
    assert str(caught.value).startswith(f"lost the connection to the dask scheduler of the dask cluster at "
                                        f"{scheduler_file}")
    assert "rerun the same command" in str(caught.value)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("call", ["threads", "require_shared", "map_unordered"])
def test_a_scheduler_lost_between_tasks_is_exit_7_whatever_call_finds_it(call: str) -> None:
    """A scheduler killed before a stage's first task came back was exit 1 with dask's traceback:
    only the wait on a task's result said "lost the connection"; the calls that start each stage
    (the cluster's threads, the shared-path check, submitting) raised CommClosedError as is."""
    from distributed.comm.core import CommClosedError

    from packer.errors import ClusterLostError
    from packer.pipeline.cluster import Executor

    class Closed:
        status = "closed"

        def __getattr__(self, name: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                raise CommClosedError("ConnectionPool.nthreads: Stream is closed")
            return call

    executor = Executor(Closed(), "dask cluster at tcp://10.0.0.9:8786")
    with pytest.raises(ClusterLostError) as caught:
        if call == "threads":
            executor.threads()
        elif call == "require_shared":
            executor.require_shared([("/x", "the cache", "fix", "file")])
        else:
            list(executor.map_unordered(abs, [1, 2]))
    assert caught.value.exit_code == 7
    assert str(caught.value).startswith("lost the connection to the dask scheduler of the dask cluster at "
                                        "tcp://10.0.0.9:8786 mid-run (CommClosedError")


def test_a_worker_that_cannot_see_the_cache_or_a_raw_root_stops_the_build_naming_both(tmp_path: Path) -> None:
    """A worker with another mount view (no shared cache folder: its own empty one at the same
    path) ran tasks: the client then failed on a signature file it never wrote there, an internal
    error with a FileNotFoundError traceback; a worker without the raw mount made every file it
    read a missing_file bad sample."""
    from distributed import Client, LocalCluster

    from packer.errors import ConfigError
    from packer.pipeline.cluster import Executor

    probe, raw = tmp_path / "cache" / "shared-probe-1.partial", tmp_path / "raw"
    probe.parent.mkdir()
    probe.touch()
    (raw / "ct").mkdir(parents=True)
    seen = [(str(probe), "the build cache folder (--cache-dir)", "mount it on every worker", "file"),
            (str(raw / "ct"), "the root of source 'ct'", "mount the raw data", "entries")]
    ran: list[int] = []

    def record(i: int) -> int:
        ran.append(i)
        return i

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        worker = next(iter(client.scheduler_info()["workers"]))
        executor = Executor(client, "a thread cluster")
        with pytest.raises(ConfigError) as empty:  # the raw root is there but empty: not mounted
            executor.require_shared(seen)
        (raw / "ct" / "a.dcm").write_bytes(b"x")
        executor = Executor(client, "a thread cluster")
        executor.require_shared(seen)
        assert sorted(executor.map_unordered(record, range(2))) == [(0, 0), (1, 1)]
        ran.clear()
        unseen = (str(tmp_path / "cache" / "shared-probe-2.partial"), "the build cache folder (--cache-dir)",
                  "mount it on every worker", "file")
        with pytest.raises(ConfigError) as missing:  # when the build starts
            Executor(client, "a thread cluster").require_shared([unseen])
        executor.shared = (unseen,)  # a worker that joins later: its first task checks
        with pytest.raises(ConfigError) as joined:
            list(executor.map_unordered(record, range(2)))
    assert ran == []
    assert str(empty.value) == (f"dask worker {worker} cannot see the root of source 'ct' {raw / 'ct'} (it is "
                                "missing or empty there: the raw data is not mounted at that path); mount the raw data")
    for caught in (missing, joined):
        assert str(caught.value) == (f"dask worker {worker} cannot see the build cache folder (--cache-dir) "
                                     f"{tmp_path / 'cache'} (the probe file this run wrote there is missing, so it "
                                     "is another folder there); mount it on every worker")


def test_validate_asks_the_workers_for_its_signature_folder_and_the_raw_roots(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`packer validate --scheduler` on a cluster whose workers have their own $PACKER_WORK_DIR was
    an internal error (FileNotFoundError on a signature file a worker wrote on its own disk)."""
    from packer.pipeline.cluster import Executor
    from packer.pipeline.datacheck import validate_job

    asked: list[tuple[str, str, str, str]] = []

    def record(self: Executor, paths: Any) -> None:
        for path, what, fix, kind in paths:
            assert kind != "file" or Path(path).is_file()  # the probe is there while the workers are asked
            asked.append((path, what, fix, kind))

    monkeypatch.setattr(Executor, "require_shared", record)
    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "out")))
    validate_job(job, scheduler="sync", quiet=True)
    work = Path(os.environ["PACKER_WORK_DIR"])
    (probe, what, fix, kind), *roots = asked
    assert Path(probe).parent.parent == work and kind == "file" and not Path(probe).exists()  # removed after
    assert what == "the work folder's signature folder ($PACKER_WORK_DIR)"
    assert fix.startswith("set PACKER_WORK_DIR to a folder every worker mounts at the same path")
    assert [(path, kind) for path, _, _, kind in roots] == [(str(s.root), "entries") for s in job.sources]


def test_a_build_whose_root_is_nowhere_says_so_before_asking_the_workers(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo in a source's root: the workers were asked to see it first, and each was blamed for
    a folder "not mounted there" that exists nowhere; the job's own error comes first now."""
    from packer.errors import ConfigError
    from packer.pipeline.build import BuildOptions, build
    from packer.pipeline.cluster import Executor

    def asked(self: Executor, paths: Any) -> None:
        raise AssertionError("the workers were asked before the roots were checked")

    monkeypatch.setattr(Executor, "require_shared", asked)
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["sources"][0]["root"] = str(demo_raw.root / "no-such-folder")
    job = load_job(write_job(tmp_path / "job", doc))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.root \(source '.*'\): folder .*no-such-folder does not "
                                          r"exist"):
        build(job, BuildOptions(scheduler="sync", quiet=True))


@pytest.mark.slow  # a real dask scheduler
def test_a_scheduler_without_workers_is_waited_for_aloud_until_one_joins(capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler with no worker takes tasks and runs none: the build sat silent for as long as
    one was missing. It now says so, and again every few seconds, until a worker joins."""
    import threading

    from distributed import Client, LocalCluster

    from packer.pipeline.cluster import wait_for_a_worker

    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        joined = threading.Timer(1.3, lambda: cluster.scale(1))
        joined.start()
        started = time.monotonic()
        wait_for_a_worker(client, cluster.scheduler_address, every=0.5)
        waited = time.monotonic() - started
        joined.join()
        assert client.scheduler_info()["workers"]
    said = capsys.readouterr().err
    assert waited >= 1.0
    assert f"the dask scheduler at {cluster.scheduler_address} has no worker yet" in said
    assert "dask worker" in said and "Ctrl-C stops" in said
    assert said.count("still no dask worker") >= 1
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        wait_for_a_worker(client, cluster.scheduler_address, every=0.5)
    assert capsys.readouterr().err == ""  # a worker already there: not a word


def test_the_workers_must_see_the_output_folder_and_a_shard_missing_there_publishes_nothing(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that saw another folder at the output path (a private mount) wrote its shards
    where the client never looks: the build exited 0 and published a manifest listing shards that
    were not there. The workers are asked to see the output folder, as the cache and the roots;
    and a listed shard missing from the staging folder stops the build before anything is
    published."""
    from packer.errors import FileSystemError
    from packer.pipeline import build as build_module
    from packer.pipeline.build import BuildOptions, build
    from packer.pipeline.cluster import Executor

    asked: list[tuple[str, str, str, str]] = []

    def record(self: Executor, paths: Any) -> None:
        for path, what, fix, kind in paths:
            assert kind != "file" or Path(path).is_file()
            asked.append((path, what, fix, kind))

    monkeypatch.setattr(Executor, "require_shared", record)
    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "out")))
    published = build(job, BuildOptions(scheduler="sync", quiet=True, out=tmp_path / "out"))
    (probe, what, fix, _), = [entry for entry in asked if "output folder" in entry[1]]
    assert Path(probe).parent == published.version_dir.parent and not Path(probe).exists()
    assert what == f"the output folder (--out {tmp_path / 'out'})" and "every worker" in fix

    manifest = json.loads(published.manifest_path.read_text())
    staging = tmp_path / "staging"
    staging.mkdir()
    shard = next(iter(manifest["splits"].values()))["shards"][0]["file"]
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            if entry["file"] != shard:
                os.link(published.version_dir / entry["file"], staging / entry["file"])
    target = tmp_path / "version"
    with pytest.raises(FileSystemError, match=rf"{shard}: the shard \(\d+ bytes\) the build wrote is not there"):
        build_module._publish(staging, target, manifest)
    assert not target.exists()


@contextlib.contextmanager
def _tcp_server(greeting: bytes | None, *, reset: bool = False) -> Iterator[int]:
    """A TCP server on a free local port that writes ``greeting`` to each connection (None: says
    nothing, as an HTTP server waits for a request) and holds it open, or with ``reset`` resets
    each at once (a proxy's idle timeout); yields the port."""
    import socket
    import struct
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # linger 0: a reset, not a clean close
                continue
            held.append(conn)
            if greeting is not None:
                conn.sendall(greeting)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize(("greeting", "said"), [(None, "accepts connections but said nothing in 0.5 s"),
                                                (b"HTTP/1.1 400 Bad Request\r\n\r\n", "answered b'HTTP/1.1 400'")])
def test_an_address_that_does_not_speak_dask_is_a_config_error_not_a_hang_or_a_crash(
        greeting: bytes | None, said: str, tmp_path: Path) -> None:
    """The dashboard's port (an HTTP server) made dask's Client wait forever; a server that
    answers HTTP at once made dask read 'HTTP/1.1' as a frame count and die allocating 3 EiB."""
    from packer.errors import ConfigError
    from packer.pipeline.cluster import _check_it_speaks_dask

    with _tcp_server(greeting) as port:
        address = f"tcp://127.0.0.1:{port}"
        with pytest.raises(ConfigError, match=f"cannot connect to the dask scheduler: {address} does not speak "
                                              f"dask: it {re.escape(said)}.*tcp://host:8786"):
            _check_it_speaks_dask(address, wait=0.5)
        _refused_through_a_scheduler_file(tmp_path, address, "does not speak dask", wait=0.5)
    with _tcp_server(len(b"x" * 58).to_bytes(8, "little") + b"\x01" + bytes(7)) as port:  # a dask greeting's start
        _check_it_speaks_dask(f"tcp://127.0.0.1:{port}", wait=0.5)


def test_an_address_that_drops_the_connection_before_greeting_is_not_dask(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy or load balancer that resets an idle connection (and answers HTTP once spoken to)
    passed the greeting check as "no connection, leave it to dask"; dask's Client then read the
    HTTP reply as a frame count, and the build stopped as "ran out of memory" (exit 6)."""
    from packer.errors import ConfigError
    from packer.pipeline import cluster
    from packer.pipeline.cluster import _check_it_speaks_dask

    with _tcp_server(None, reset=True) as port:
        address = f"tcp://127.0.0.1:{port}"
        with pytest.raises(ConfigError, match=f"{address} does not speak dask: it dropped the connection before "
                                              "greeting it .*Connection ?[Rr]eset"):
            _check_it_speaks_dask(address, wait=2)

    # and where dask's Client itself meets such a reply: a ConfigError (exit 2) that says so, not exit 6
    import distributed

    def http_read_as_frames(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate 3.07 EiB for an array with shape (3543824036068086856,)")

    monkeypatch.setattr(cluster, "_check_it_speaks_dask", lambda scheduler: None)
    monkeypatch.setattr(distributed, "Client", http_read_as_frames)
    with pytest.raises(ConfigError, match=r"tcp://127.0.0.1:9: cannot connect to the dask scheduler: it does not "
                                          r"speak dask .*3.07 EiB.*tcp://host:8786"):
        next(cluster._open_remote("tcp://127.0.0.1:9", cluster.environment()))


def _refused_through_a_scheduler_file(tmp_path: Path, address: str, said: str, *, wait: float) -> None:
    """A scheduler file naming ``address`` is refused as the address itself is (``said``)."""
    from packer.errors import ConfigError
    from packer.pipeline.cluster import _check_it_speaks_dask

    scheduler_file = tmp_path / "scheduler.json"
    scheduler_file.write_text(json.dumps({"type": "Scheduler", "address": address}))
    with pytest.raises(ConfigError, match=said):
        _check_it_speaks_dask(str(scheduler_file), wait=wait)


def test_a_real_scheduler_passes_the_greeting_check() -> None:
    from packer.pipeline.cluster import _check_it_speaks_dask

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        _check_it_speaks_dask(cluster.scheduler_address)


@pytest.mark.slow  # a real dask scheduler and worker
def test_a_workers_address_given_as_the_scheduler_is_a_config_error_naming_the_scheduler(tmp_path: Path) -> None:
    """A dask worker greets a connection as a scheduler does, so dask's Client went on and asked
    it for the scheduler's identity(n_workers=...), and the build died with a TypeError traceback
    from the worker (exit 1, "a bug"). A worker's (or its nanny's) address is now refused with
    exit 2 and the address of the scheduler that worker is registered to."""
    from packer.errors import ConfigError
    from packer.pipeline.cluster import _check_it_speaks_dask

    with LocalCluster(n_workers=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster:
        worker = next(iter(cluster.scheduler_info["workers"]))
        with pytest.raises(ConfigError, match=rf"--scheduler {worker}: it is a dask worker, not the dask "
                                              rf"scheduler; give the scheduler's address \(this worker's is "
                                              rf"{cluster.scheduler_address}\).*'Registered to:'"):
            _check_it_speaks_dask(worker, wait=5)
        _refused_through_a_scheduler_file(tmp_path, worker, "is a dask worker, not the dask scheduler", wait=5)
        _check_it_speaks_dask(cluster.scheduler_address, wait=5)  # the scheduler itself: not a word


def _set_status(dask_worker: Any, status: str) -> None:
    """Run on a worker by ``client.run``: set its status as dask's memory monitor does."""
    from distributed.core import Status

    dask_worker.status = Status[status]


@pytest.mark.slow  # a real dask scheduler and worker
def test_a_pass_whose_workers_are_paused_for_memory_says_so_while_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """dask pauses a worker at 80% of its memory limit: a pass whose workers were all paused got
    no result and printed nothing, for ever. While it waits it now hears, every tenth of a second,
    what the scheduler says of the workers: paused for memory, their limit and the fix; and it
    goes on by itself once dask resumes them (packer does not fail a build for a pause)."""
    from distributed import Client

    from packer.pipeline import cluster as cluster_module
    from packer.pipeline.cluster import Executor

    monkeypatch.setattr(cluster_module, "STALL_CHECK_S", 0.3)
    # the test pauses the worker itself: dask's own memory monitor would resume it at once
    with dask.config.set({"distributed.worker.memory.pause": False}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                         memory_limit="300MB") as cluster, Client(cluster) as client:
        (address,) = client.scheduler_info()["workers"]
        client.run(_set_status, status="paused")
        deadline = time.monotonic() + 10
        while client.scheduler_info()["workers"][address]["status"] != "paused":
            assert time.monotonic() < deadline, "the scheduler never saw the worker paused"
            time.sleep(0.05)
        notes: list[str] = []

        def waiting(note: str) -> None:
            notes.append(note)
            if note:
                client.run(_set_status, status="running")  # dask resumes a worker whose memory fell

        results = list(Executor(client, "a test cluster").map_unordered(abs, [-3], ["abs-minus-3"], waiting=waiting))
    assert results == [(-3, 3)]
    assert notes[0] == ""  # before the wait has lasted STALL_CHECK_S: nothing asked, nothing said
    said = next(note for note in notes if note)
    assert said == ("waiting: the dask worker is paused for memory (memory limit 286.10 MiB; dask pauses a worker "
                    "past distributed.worker.memory.pause, 80% of its limit by default, and resumes it once its "
                    "memory falls): start each worker with a larger --memory-limit or fewer --nthreads (each thread "
                    "holds a task's files), or lower the job's pack.max_bytes (a Parquet shard is assembled in "
                    "memory)")


def test_what_a_waiting_pass_says_of_workers_that_left_or_are_all_gone() -> None:
    from packer.pipeline.cluster import _workers_note

    running = {"tcp://w:1": {"status": "running", "memory_limit": 200_000_000}}
    assert _workers_note(running, 0, 12.0, "tcp://s:8786", local=False) == ""  # a slow task: nothing to say
    restarting = _workers_note(running, 3, 12.0, "tcp://s:8786", local=False)
    assert restarting.startswith("waiting: 3 dask worker(s) left the cluster in the 12 s this pass has waited for a "
                                 "result (a worker past its memory limit is killed, and its nanny starts it again; "
                                 "memory limit 190.73 MiB): start each worker with a larger --memory-limit")
    gone = _workers_note({}, 0, 12.0, "tcp://s:8786", local=False)
    assert gone == ("waiting: the dask scheduler at tcp://s:8786 has no worker now; the pass goes on when one joins "
                    "(start one with `dask worker tcp://s:8786` where the data and PACKER_WORK_DIR are reachable; "
                    "Ctrl-C stops)")
    paused = {f"tcp://w:{i}": {"status": "paused" if i else "running", "memory_limit": 2 << 30} for i in range(3)}
    assert _workers_note(paused, 0, 12.0, "tcp://s:8786", local=True).startswith(
        "waiting: 2 of 3 dask workers are paused for memory (memory limit 2.00 GiB each; ")
    assert _workers_note(paused, 0, 12.0, "tcp://s:8786", local=True).endswith(
        ": run fewer local workers (--workers N; each gets a larger share of this machine's memory), or lower the "
        "job's pack.max_bytes (a Parquet shard is assembled in memory)")
