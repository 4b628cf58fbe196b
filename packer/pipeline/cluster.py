"""Run stage tasks on dask: a local cluster by default, an existing scheduler, or in-process.

This is the only module that imports dask. Tasks are plain top-level functions over
picklable records; results come back in completion order and callers sort them, so the
output never depends on which worker finished first.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, overload

from packer.errors import ClusterLostError, ConfigError, PackerError, Surface, a_type, called_from, exhausted, surface
from packer.manifest import DECODING_ENVIRONMENT, decoding_libraries

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """One worker process per core, at most 8 (decoding holds the GIL in places)."""
    return max(1, min(8, os.cpu_count() or 1))


class WorkerLost(Exception):
    """A task's worker process died every time it ran the task (e.g. a native decoder crash)."""


class _RunDefect:
    """A :class:`~packer.errors.PackerError` a task raised (a full disk, a bad table), carried
    back as its result: dask would log it as a failed computation, with a traceback, on the
    worker's stderr before packer's own one-line error."""

    def __init__(self, error: PackerError) -> None:
        self.error = error


Environment = tuple[tuple[str, str], ...]


def _environment_probe(libraries: tuple[str, ...]) -> Callable[[], Environment]:
    """A function that returns its process's environment: packer's version and a digest of its
    code (16 hex digits of sha256 over its source files, relative path and bytes, in path order,
    so two installs that report the same version but run different code, a development checkout
    on another commit or an edited file, differ), and the version of each of ``libraries``.

    It is nested and imports only the standard library inside, so cloudpickle ships it by value:
    it runs on a worker with any packer, an older one that knows no such check included."""

    def probe() -> tuple[tuple[str, str], ...]:
        import hashlib
        from importlib import import_module, metadata
        from pathlib import Path

        package = import_module("packer")
        folder = Path(package.__file__ or "").resolve().parent
        digest = hashlib.sha256()
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        found = {"packer": str(getattr(package, "__version__", "unknown")), "packer code": digest.hexdigest()[:16]}
        for name in libraries:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = "not installed"
        return tuple(sorted(found.items()))

    return probe


@functools.cache
def environment(extra: tuple[str, ...] = ()) -> Environment:
    """What shapes packed bytes in this process (:func:`_environment_probe`) for the libraries the
    manifest records and those that decide which files are bad
    (:func:`packer.manifest.decoding_libraries`; ``extra``: a job's source-kind libraries). A worker
    whose environment differs from the client's would pack other bytes under the client's recorded
    versions: :func:`check_workers` and every task (:func:`_run`) refuse it."""
    return _environment_probe(tuple(name for name in decoding_libraries(extra)
                                    if name not in ("packer", DECODING_ENVIRONMENT)))()


def _library_names(expected: Environment) -> tuple[str, ...]:
    return tuple(name for name, _ in expected if name not in ("packer", "packer code"))


def _mismatch(where: str, expected: Environment, found: Environment) -> str | None:
    """``<where>: <name> <theirs> there, <ours> on the client; ...`` for what differs, or None."""
    theirs = dict(found)
    differ = [f"{name} {theirs.get(name, 'not installed')} there, {ours} on the client"
              for name, ours in expected if theirs.get(name, "not installed") != ours]
    return f"{where} ({'; '.join(differ)})" if differ else None


def _mixed_versions(mismatches: list[str]) -> ConfigError:
    return ConfigError(f"{', '.join(mismatches)}: the cluster's workers must run the packer and libraries of the "
                       "client that started the build, or shards would mix bytes from two versions under the "
                       "client's recorded versions, so nothing was packed there. Install the client's environment "
                       "on every worker (the same packer and constraints.txt) and restart it, or stop that worker")


@functools.cache
def _worker_environment(libraries: tuple[str, ...]) -> Environment:
    return _environment_probe(libraries)()


def _environment_mismatch(expected: Environment) -> ConfigError | None:
    """The ConfigError for a worker whose environment is not ``expected`` (the client's)."""
    from distributed import get_worker

    try:
        where = f"dask worker {get_worker().address}"
    except ValueError:  # not in a worker (a test calls the task directly)
        where = "this process"
    mismatch = _mismatch(where, expected, _worker_environment(_library_names(expected)))
    return None if mismatch is None else _mixed_versions([mismatch])


def check_workers(client: Any, expected: Environment) -> None:
    """Raise the ConfigError that names every worker of ``client``'s cluster whose environment is
    not ``expected``, before any task runs (a worker that joins later is checked by its tasks)."""
    found = client.run(_environment_probe(_library_names(expected)), on_error="return")
    mismatches = []
    for address, environment_there in sorted(found.items()):
        if isinstance(environment_there, BaseException):
            mismatches.append(f"dask worker {address} (its environment could not be read: {environment_there!r})")
            continue
        mismatch = _mismatch(f"dask worker {address}", expected, environment_there)
        if mismatch is not None:
            mismatches.append(mismatch)
    if mismatches:
        raise _mixed_versions(mismatches)


#: A path every worker must see as the client does: (path, what it is, the fix, ``file`` for a
#: file the client wrote there or ``entries`` for a folder that must hold something).
SharedPath = tuple[str, str, str, str]


def _shared_path_probe(shared: tuple[SharedPath, ...]) -> Callable[[], list[str]]:
    """A function that returns what its process cannot see of ``shared`` (:func:`_unseen`'s
    messages, without the worker's name). Nested, so that cloudpickle ships it by value."""

    def probe() -> list[str]:
        import os

        unseen = []
        for path, what, fix, kind in shared:
            if kind == "file":
                seen = os.path.isfile(path)
                why = "the probe file this run wrote there is missing, so it is another folder there"
            else:
                try:
                    with os.scandir(path) as entries:
                        seen = next(entries, None) is not None
                except OSError:
                    seen = False
                why = "it is missing or empty there: the raw data is not mounted at that path"
            if not seen:
                unseen.append(f"cannot see {what} {os.path.dirname(path) if kind == 'file' else path} ({why}); {fix}")
        return unseen

    return probe


#: Shared paths this worker process has already seen: checked once per process, not per task.
_SEEN_SHARED: set[SharedPath] = set()


def _unseen_shared(shared: tuple[SharedPath, ...]) -> ConfigError | None:
    """The ConfigError for the first of ``shared`` this worker process cannot see, or None."""
    todo = tuple(entry for entry in shared if entry not in _SEEN_SHARED)
    if not todo:
        return None
    unseen = _shared_path_probe(todo)()
    if not unseen:
        _SEEN_SHARED.update(todo)
        return None
    from distributed import get_worker

    try:
        where = f"dask worker {get_worker().address}"
    except ValueError:
        where = "this process"
    return ConfigError(f"{where} {unseen[0]}")


def _run(fn: Callable[[T], R], item: T, expected: Environment | None = None,
         shared: tuple[SharedPath, ...] = (), caller: Surface | None = None) -> R | _RunDefect:
    """Dask task: ``fn(item)``, or the PackerError it raised as a :class:`_RunDefect`. With
    ``expected`` (the client's :func:`environment`), a worker whose environment differs runs
    nothing and returns the ConfigError that says so; likewise a worker that cannot see one of
    ``shared`` (:meth:`Executor.require_shared`). ``caller``: the client's
    :func:`~packer.errors.surface`, so that a message made in the worker names the options as
    the caller gave them (a keyword argument from Python, a flag from the command line)."""
    if caller is not None:
        with called_from(caller):
            return _run(fn, item, expected, shared)
    if expected is not None:
        mismatch = _environment_mismatch(expected)
        if mismatch is not None:
            return _RunDefect(mismatch)
    unseen = _unseen_shared(shared)
    if unseen is not None:
        return _RunDefect(unseen)
    try:
        return fn(item)
    except PackerError as err:
        return _RunDefect(err)


class LazySequence(Sequence[T]):
    """``count`` items made by ``make(i)`` when read, so a long task list need not exist at once:
    :meth:`Executor.map_unordered` reads an item when it submits it (the sliding window)."""

    def __init__(self, count: int, make: Callable[[int], T]) -> None:
        self._count, self._make = count, make

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(f"item {index} of {self._count}")
        return self._make(index % self._count)


class Executor:
    """Maps a function over items on a dask client, or in-process when ``client`` is None."""

    def __init__(self, client: Any | None, description: str, *, expected: Environment | None = None,
                 local: bool = False) -> None:
        self.client = client
        self.description = description
        #: packer's own local cluster (its fixes name --workers), not one given by --scheduler
        self.local = local
        #: The client's :func:`environment`, checked by every task on its worker (None: not checked)
        self.expected = expected
        #: Paths every worker must see as the client does (:meth:`require_shared`)
        self.shared: tuple[SharedPath, ...] = ()
        #: Set by a Ctrl-C while the cluster is open, even one Python could not raise (see
        #: :func:`_noted_interrupts`); :meth:`map_unordered` raises it at the next result.
        self.interrupted = False

    def require_shared(self, paths: Iterable[SharedPath]) -> None:
        """Check that every worker sees ``paths`` as this client does (a file the client wrote,
        or a folder with entries), now and in each later task (a worker that joins later):
        ConfigError naming the worker, the path and the fix where one does not. In-process: nothing
        to check."""
        if self.client is None:
            return
        self.shared = (*self.shared, *paths)
        with self._talking():
            found = self.client.run(_shared_path_probe(self.shared), on_error="return")
        unseen = [f"dask worker {address} {problem if isinstance(problem, str) else repr(problem)}"
                  for address, problems in sorted(found.items())
                  for problem in (problems if isinstance(problems, list) else [problems])]
        if unseen:
            raise ConfigError("; ".join(unseen))

    def threads(self) -> int:
        """Worker threads of the cluster now; 0 in-process."""
        if self.client is None:
            return 0
        with self._talking():
            return int(sum(self.client.nthreads().values()))

    def lost(self, why: str) -> ClusterLostError:
        """The error of a build whose scheduler went away mid-run (``why``: what dask said)."""
        return ClusterLostError(
            f"lost the connection to the dask scheduler of the {self.description} mid-run ({why}: the scheduler "
            "stopped, or the network to it broke); nothing was published. Start the scheduler and its workers "
            "again and rerun the same command: the build cache keeps every file decoded so far")

    @contextlib.contextmanager
    def _talking(self) -> Iterator[None]:
        """A call to the scheduler: a closed connection is :meth:`lost` (exit 7, one line), not
        an internal error with dask's traceback (only the wait on a task's result said so)."""
        from distributed.comm.core import CommClosedError

        try:
            yield
        except (CommClosedError, ConnectionError) as err:
            raise self.lost(f"{type(err).__name__}: {err}") from err
        except OSError as err:  # dask's "Timed out trying to connect", a refused connection
            if self.client is not None and self.client.status == "running":
                raise
            raise self.lost(f"{type(err).__name__}: {err}") from err

    def window(self) -> int:
        """Tasks kept in flight: four per worker thread, at least eight."""
        if self.client is None:
            return 1
        return max(8, 4 * self.threads())

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T], keys: Sequence[str] | None = None, *,
                      waiting: Callable[[str], None] | None = None) -> Iterator[tuple[T, R | WorkerLost]]:
        """Yield ``(item, result)`` as tasks finish. A task whose workers kept dying (dask's
        ``allowed-failures`` exhausted) yields ``(item, WorkerLost)`` instead of raising, so the
        caller can isolate the culprit; any other exception propagates. ``keys`` name the dask
        tasks (they show on the dashboard).

        ``waiting`` (the pass's :meth:`~packer.progress.Progress.waiting`) is called about ten
        times a second while no result has come, with what :class:`_WorkerWatch` says of the
        workers once the wait has lasted :data:`STALL_CHECK_S` ("" until then, or when all is
        well): a pass whose workers were all paused for memory waited on dask without a word,
        for ever, since its progress line was printed only when a result arrived.

        Tasks are submitted in a sliding window (:meth:`window`), not all at once: a task's
        arguments (a chunk's file records, a shard's sample records) live pickled on the client
        and unpickled in the scheduler until it finishes, so submitting everything would make
        memory grow with the size of the dataset instead of with the cluster. For the same reason
        ``items`` may be a :class:`LazySequence`: each item is then made when it is submitted.
        """
        items = items if isinstance(items, Sequence) else list(items)
        if self.client is None:
            for item in items:
                yield item, fn(item)
            return
        from distributed import as_completed
        from distributed.client import FutureCancelledError
        from distributed.scheduler import KilledWorker

        client = self.client
        window = self.window()  # the first word with the scheduler: a lost one is said here (exit 7)
        caller = surface()  # the workers' messages name the options as this run's caller gave them
        names = list(keys) if keys is not None else [None] * len(items)
        item_of: dict[Any, T] = {}
        running = as_completed()
        submitted = 0

        def submit_next() -> None:
            nonlocal submitted
            item = items[submitted]  # once: a LazySequence makes the item on each access
            with self._talking():
                future = client.submit(_run, fn, item, self.expected, self.shared, caller, key=names[submitted],
                                       pure=False)
            item_of[future.key] = item
            running.add(future)
            submitted += 1

        while submitted < min(len(items), window):
            submit_next()
        watch = _WorkerWatch(self, STALL_CHECK_S)
        while (future := self._next_done(running, watch, waiting)) is not None:
            if submitted < len(items):
                submit_next()  # before handing back this result, so the workers stay busy
            item = item_of.pop(future.key)
            try:
                result = future.result()
                if isinstance(result, _RunDefect):
                    raise result.error
                yield item, result
            except KilledWorker as err:
                yield item, WorkerLost(str(err))
            except FutureCancelledError as err:
                if client.status == "running":
                    raise
                raise self.lost(str(err.reason)) from err
            finally:
                future.release()

    def _next_done(self, running: Any, watch: _WorkerWatch, waiting: Callable[[str], None] | None) -> Any | None:
        """The next finished future of ``running`` (dask's ``as_completed``), or None once none is
        left. While none is ready, ``waiting`` is called each tenth of a second with
        :meth:`_WorkerWatch.note`, and a Ctrl-C Python dropped (:func:`_noted_interrupts`) is raised."""
        while not running.has_ready():
            if self.interrupted:
                raise KeyboardInterrupt  # a Ctrl-C Python dropped where it landed (see _noted_interrupts)
            if running.is_empty():
                return None
            with running.thread_condition:  # what as_completed's own blocking next() waits on
                running.thread_condition.wait(timeout=0.1)
            if waiting is not None and not running.has_ready():
                waiting(watch.note())
        if self.interrupted:
            raise KeyboardInterrupt
        watch.result_came()
        return next(running)


#: Seconds a pass goes without a result before it asks the scheduler how its workers are (and then
#: between two asks): workers all paused for memory, dying and restarting, or all gone are then
#: said in the pass's progress line (:class:`_WorkerWatch`). A pass whose results keep coming never asks.
STALL_CHECK_S = 5.0


class _WorkerWatch:
    """What a pass that waits for results says of the cluster's workers. dask pauses a worker whose
    process passes ``distributed.worker.memory.pause`` (80% by default) of its memory limit, and
    resumes it only once its memory falls: workers all paused ran nothing, and the build sat
    silent for good; a worker past its limit's ``terminate`` fraction is killed and its nanny
    starts it again, over and over, just as silently. The scheduler's worker states (and its
    event log's ``remove-worker`` events since the last result, by the scheduler's clock against
    this one's) are read once the pass has had no result for ``every`` seconds, then every
    ``every`` seconds."""

    def __init__(self, executor: Executor, every: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.executor, self.every, self.clock, self.wall = executor, every, clock, wall
        self.said = ""
        self.result_came()

    def result_came(self) -> None:
        """A result arrived: the cluster works; the next ask waits for a stall as long again."""
        self._next = self.clock() + self.every
        self.since = self.wall()
        self.said = ""

    def note(self) -> str:
        """What is wrong with the workers, as of the last ask ("" when nothing is)."""
        now = self.clock()
        client = self.executor.client
        if now >= self._next and client is not None:
            self._next = now + self.every
            with self.executor._talking():
                workers = dict(client.scheduler_info(n_workers=-1).get("workers") or {})
                events = client.get_events("all")
            left = sum(1 for when, event in events
                       if when >= self.since and isinstance(event, dict) and event.get("action") == "remove-worker")
            scheduler = getattr(getattr(client, "scheduler", None), "address", None) or "the scheduler"
            self.said = _workers_note(workers, left, self.wall() - self.since, scheduler, self.executor.local)
        return self.said


def _workers_note(workers: dict[str, Any], left: int, seconds: float, scheduler: str, local: bool) -> str:
    """What :class:`_WorkerWatch` says of ``workers`` (the scheduler's worker infos), ``left`` of
    which left the cluster in the ``seconds`` the pass has waited ("" when nothing is wrong)."""
    limit = _memory_limits(workers)
    notes = []
    if left:
        notes.append(f"{left} dask worker(s) left the cluster in the {seconds:.0f} s this pass has waited for a "
                     "result (a worker past its memory limit is killed, and its nanny starts it again"
                     + (f"; {limit})" if workers else ")"))
    if not workers:
        notes.append(f"the dask scheduler at {scheduler} has no worker now; the pass goes on when one joins"
                     + ("" if local else f" ({_start_a_worker(scheduler)})"))
    paused = [info for info in workers.values() if info.get("status") == "paused"]
    if paused:
        who = ("the dask worker is" if len(workers) == 1 else
               f"every dask worker ({len(workers)}) is" if len(paused) == len(workers)
               else f"{len(paused)} of {len(workers)} dask workers are")
        notes.append(f"{who} paused for memory ({limit}; dask pauses a worker past "
                     "distributed.worker.memory.pause, 80% of its limit by default, and resumes it once its "
                     "memory falls)")
    if not notes:
        return ""
    fix = f": {_more_memory_fix(local)}" if left or paused else ""
    return f"waiting: {'; '.join(notes)}{fix}"


def _memory_limits(workers: dict[str, Any]) -> str:
    """The memory limit of the scheduler's ``workers`` (its worker infos), as dask's worker logs
    write it: ``memory limit 247.96 MiB each``, a range where they differ."""
    from dask.utils import format_bytes

    sizes = sorted({int(info.get("memory_limit") or 0) for info in workers.values()} - {0})
    if not sizes:
        return "no memory limit"
    shown = " to ".join(format_bytes(size) for size in dict.fromkeys((sizes[0], sizes[-1])))
    return f"memory limit {shown}" + (" each" if len(workers) > 1 else "")


def _more_memory_fix(local: bool) -> str:
    """How to give a cluster's tasks the memory they need."""
    if local:
        return (f"run fewer local workers ({surface().option('workers', 'N')}; each gets a larger share of this "
                "machine's memory), or lower the job's pack.max_bytes (a Parquet shard is assembled in memory)")
    return ("start each worker with a larger --memory-limit or fewer --nthreads (each thread holds a task's files), "
            "or lower the job's pack.max_bytes (a Parquet shard is assembled in memory)")


def _start_a_worker(address: str) -> str:
    """How to give a scheduler a worker."""
    return f"start one with `dask worker {address}` where the data and PACKER_WORK_DIR are reachable; Ctrl-C stops"


#: The dask log records packer's local cluster (its scheduler here, its worker processes) prints on
#: stderr: errors, not dask's chatter.
DASK_LOG_LEVEL = logging.ERROR
#: ... under PHI pseudonymization (``private``): critical ones only. dask logs a task that raised
#: as an error, "Compute Failed", with the exception's text (and, in dask versions before its Task
#: specs, the repr of the task's arguments: file records holding raw paths). That text may quote a
#: raw path (a folder named after a patient), and the failure reaches the command anyway, as the
#: exception the client raises.
PRIVATE_DASK_LOG_LEVEL = logging.CRITICAL


@contextlib.contextmanager
def open_executor(scheduler: str | None = None, workers: int | None = None,
                  libraries: Iterable[str] = (), *, private: bool = False) -> Iterator[Executor]:
    """``scheduler``: None → LocalCluster of ``workers`` processes; ``"sync"`` → in-process;
    ``tcp://host:port`` or a scheduler-file path → that dask.distributed cluster (``workers``
    given with a ``scheduler`` is ignored, with a warning on stderr). On a cluster every task
    first checks that its worker runs this process's :func:`environment` (``libraries``: the
    job's source-kind libraries beyond the manifest's usual ones), and fails the run with a
    ConfigError where it does not. ``private`` (PHI pseudonymization): the local cluster's dask
    logs print at :data:`PRIVATE_DASK_LOG_LEVEL` (a cluster given by ``scheduler`` logs where its
    own processes run, as they are configured)."""
    if scheduler is not None and workers is not None:
        runs = ("every task runs in this one process" if scheduler == "sync"
                else "the tasks run on that scheduler's own workers")
        print(f"packer: warning: {surface().option('workers', workers)} sizes the local cluster only; with "
              f"{surface().option('scheduler', scheduler)} "
              f"{runs}", file=sys.stderr, flush=True)
    if scheduler == "sync":
        yield Executor(None, f"this one process ({surface().option('scheduler', 'sync')})")
        return
    check_scheduler(scheduler)  # an address dask cannot parse, a missing or empty scheduler file: no client started
    with _cluster_config():
        yield from _open_distributed(scheduler, workers, environment(tuple(sorted(set(libraries)))),
                                     log_level=PRIVATE_DASK_LOG_LEVEL if private else DASK_LOG_LEVEL)


#: dask keeps its last ``distributed.admin.low-level-log-length`` (default 1000) batches of comm
#: messages for debugging. A batch carries whole task specs, and a task's arguments are a chunk's
#: file records or a shard's sample records: on the client (and the in-process scheduler of a
#: LocalCluster) that log held unpickled copies of every task of a build, ~1 KB per sample of
#: a pass, growing with the dataset. packer runs with the log off.
MESSAGE_LOG_LENGTH = 0

#: dask's workers sample the running task's Python stack every 10 ms for the dashboard's profile
#: page (``distributed.worker.profile``), and fold the samples into a call tree per task. packer
#: never reads it. Measured on a 20-series SEG + RTSTRUCT build (one worker, four runs each way,
#: interleaved): the worker's CPU seconds, median 36.2 with it and 33.3 without (runs spread
#: 32.1-36.6), nothing measurable on a build without masks (benchmarks/RESULTS.md). A local
#: cluster starts its workers with it off; a cluster given by --scheduler keeps its own settings
#: (DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False where its workers start).
WORKER_PROFILE = False


@contextlib.contextmanager
def _cluster_config() -> Iterator[None]:
    import dask
    import distributed  # noqa: F401 - loads distributed's config defaults before the set below

    # dask.config.set undoes a key that did not exist by deleting it: set before distributed's
    # defaults were loaded, it took all of "distributed.*" with it on exit, and the next
    # LocalCluster in the same process failed with KeyError: 'comm'. A local cluster's nannies
    # hand the config in force when they start to their worker processes.
    with dask.config.set({"distributed.admin.low-level-log-length": MESSAGE_LOG_LENGTH,
                          "distributed.worker.profile.enabled": WORKER_PROFILE}):
        yield


#: Why a local cluster's worker processes fail to start when a script calls packer at import time.
UNGUARDED_SCRIPT = ("each worker process of the local dask cluster imports the script that started it again "
                    "(Python's spawn start method), so a script that calls packer.build or packer.validate must "
                    "do so under `if __name__ == \"__main__\":` (or from a function called there)")


def unguarded_script() -> str | None:
    """The script whose top-level code runs this call outside an ``if __name__ == "__main__":``
    block (directly, or through a function it calls there), or None: a call from the command
    line, a notebook, ``python -c``, a guarded block, or a script whose source cannot be read.
    Such a call runs again in every worker process the local cluster spawns, which re-imports
    the script, and there :func:`packer.api._refuse_worker_reimport` refuses it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            script = frame.f_globals.get("__file__")
            if not isinstance(script, str) or os.path.abspath(frame.f_code.co_filename) != os.path.abspath(script):
                return None
            try:
                tree = ast.parse(Path(script).read_text(encoding="utf-8"), filename=script)
            except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
                return None  # not a script spawn can import again either: say nothing more than before
            line = frame.f_lineno
            guarded = any(isinstance(node, ast.If) and _is_main_test(node.test) and node.body[0].lineno <= line
                          <= (node.body[-1].end_lineno or node.body[-1].lineno) for node in tree.body)
            return None if guarded else script
        frame = frame.f_back
    return None


def _program_not_a_file() -> str | None:
    """Why a local cluster cannot start from this program, or None: a program read from standard
    input (``python - <<EOF``, a heredoc step of a CI job) has ``__file__`` ``<stdin>``, which
    the spawned worker processes try to import again as ``<cwd>/<stdin>`` and die, however well
    the program guards its calls. (``python -c`` and notebooks set no ``__file__``: spawn then
    imports nothing, and the cluster starts.)"""
    program = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(program, str) or os.path.isfile(program):
        return None
    return (f"{program}: the local dask cluster's worker processes cannot start from a program that is not a file "
            "(read from standard input, `python -`): each worker imports the program that started it again "
            "(Python's spawn start method); save the program as a file and run that, or run in this process "
            f"({surface().option('scheduler', 'sync')})")


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


#: Names of the environment variables dask sets in this process for the worker processes it
#: spawns (beside ``distributed.nanny.pre-spawn-environ``'s): a nanny sets its workers'
#: ``PYTHONHASHSEED``, and marks their process titles with this process's id.
_SPAWN_ENVIRONMENT = ("PYTHONHASHSEED", "__DASK_PARENT_PID")


@dataclass
class _LocalClusters:
    """What this process looked like before its first running local cluster (:func:`_local_cluster_held`)."""

    count: int = 0
    propagate: bool = True
    #: each StreamHandler of dask's loggers (``distributed``, ``bokeh``) and its level before
    handler_levels: list[tuple[logging.Handler, int]] = field(default_factory=list)
    #: the log levels the running clusters print dask's records at, one per cluster
    levels: list[int] = field(default_factory=list)
    #: the spawn environment's variables as they were (None: not set)
    environment: dict[str, str | None] = field(default_factory=dict)


_HELD = _LocalClusters()
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def _local_cluster_held(log_level: int) -> Iterator[None]:
    """While packer's own local clusters run, this process is set up for them, and is as it was
    once the last one ends (counted under a lock: calls on threads each run a cluster, and a
    save-and-restore per cluster, undone in the wrong order, left the change in place for good):

    - dask's log records (its scheduler and nannies log in this process) stop at the
      ``distributed`` logger: they no longer reach the caller's root handlers (an orchestrator's
      or notebook's logging at INFO got dask's chatter, and under PHI pseudonymization an error
      record may quote a raw path);
    - that logger's own stderr handler (and bokeh's) prints them at ``log_level`` only, the most
      silent level of the clusters running (``LocalCluster(silence_logs=...)`` did so per cluster,
      and the first to close set the handler back to INFO under the other's close: its "Remove
      client" and "Closing scheduler" lines reached the caller's stderr);
    - the variables dask's nannies set in ``os.environ`` before spawning a worker
      (``OMP_NUM_THREADS=1`` and the rest of ``distributed.nanny.pre-spawn-environ``,
      ``PYTHONHASHSEED``, ``__DASK_PARENT_PID``) are set back: left, torch imported after a build
      in the same notebook, and every process it starts, ran on one CPU thread."""
    with _HELD_LOCK:
        if _HELD.count == 0:
            _hold_process_state()
        _HELD.count += 1
        _HELD.levels.append(log_level)
        _set_dask_handler_levels(max(_HELD.levels))
    try:
        yield
    finally:
        with _HELD_LOCK:
            _HELD.count -= 1
            _HELD.levels.remove(log_level)
            if _HELD.count == 0:
                _release_process_state()
            else:
                _set_dask_handler_levels(max(_HELD.levels))


def _hold_process_state() -> None:
    """Save what the first local cluster changes (under :data:`_HELD_LOCK`)."""
    import dask

    logger = logging.getLogger("distributed")
    _HELD.propagate = logger.propagate
    logger.propagate = False
    _HELD.handler_levels = [(handler, handler.level) for name in ("distributed", "bokeh")
                            for handler in logging.getLogger(name).handlers
                            if isinstance(handler, logging.StreamHandler)]
    spawned = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    _HELD.environment = {name: os.environ.get(name) for name in (*spawned, *_SPAWN_ENVIRONMENT)}


def _release_process_state() -> None:
    """Set back what :func:`_hold_process_state` saved, the last local cluster ended (under :data:`_HELD_LOCK`)."""
    logging.getLogger("distributed").propagate = _HELD.propagate
    for handler, level in _HELD.handler_levels:
        handler.setLevel(level)
    for name, value in _HELD.environment.items():
        if value is None:
            os.environ.pop(name, None)
        elif os.environ.get(name) != value:
            os.environ[name] = value
    _HELD.handler_levels, _HELD.environment = [], {}


def _set_dask_handler_levels(level: int) -> None:
    """Each saved stderr handler of dask's loggers prints records at ``level`` and above."""
    for handler, _ in _HELD.handler_levels:
        handler.setLevel(level)


def _open_distributed(scheduler: str | None, workers: int | None, expected: Environment, *,
                      log_level: int = DASK_LOG_LEVEL) -> Iterator[Executor]:
    if scheduler is None:
        with _local_cluster_held(log_level):
            yield from _open_local(workers, expected, log_level)
        return
    yield from _open_remote(scheduler, expected)


_DASHBOARD_IMPORT_LOCK = threading.Lock()


def _import_dashboard_once() -> None:
    """Import dask's dashboard module before a scheduler does. Each new scheduler imports it
    lazily; two local clusters starting at once on threads (two ``packer.build`` calls) raced on
    that first import, and one failed with "module 'distributed.dashboard' has no attribute
    'scheduler'". Without bokeh the scheduler goes on without a dashboard, as it does here."""
    with _DASHBOARD_IMPORT_LOCK:
        try:
            import distributed.dashboard.scheduler  # noqa: F401
        except ImportError:
            return  # no bokeh: the scheduler serves its plain routes (dask's own fallback)


def _open_local(workers: int | None, expected: Environment, log_level: int) -> Iterator[Executor]:
    """packer's own local cluster (:func:`_open_distributed` without a scheduler)."""
    from distributed import Client, LocalCluster

    _import_dashboard_once()
    unspawnable = _program_not_a_file()
    if unspawnable is not None:
        raise ConfigError(unspawnable)
    n = workers or default_workers()
    # dask's workers start with MALLOC_TRIM_THRESHOLD_=65536; packer's tasks override it with
    # fixed glibc thresholds (packer.allocator), on this cluster and on any other
    with _held_interrupts() as starting:
        start_records = _HeldRecords("distributed.nanny")
        try:
            with start_records:
                cluster = _call_interrupts_blocked(lambda: LocalCluster(
                    n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                    # this process's dask logging is set once for all its clusters (_local_cluster_held)
                    silence_logs=False, worker_class=_nanny_class(), worker_log_level=log_level))
        except RuntimeError as err:
            if "failed to start" not in str(err):
                start_records.replay()
                raise
            # out of open files or memory (a CI container's low `ulimit -n`): the machine's
            # condition, exit 6 with its fix, found in the chain dask raised it through
            cause: BaseException | None = err
            seen: set[int] = set()
            while cause is not None and id(cause) not in seen:
                seen.add(id(cause))
                resource = exhausted(cause, "a pipe or socket of the local dask cluster") \
                    if isinstance(cause, OSError) else None
                if resource is not None:
                    raise resource from err
                cause = cause.__cause__ or cause.__context__
            start_records.replay()  # not the machine's condition: what dask logged may tell the user more
            script = unguarded_script()
            if script is not None:  # the workers ran its call again and refused it: a usage error
                raise ConfigError(f"{script}: the local dask cluster's worker processes did not start "
                                  f"({str(err).rstrip('.')}): {UNGUARDED_SCRIPT}") from err
            raise PackerError(f"the local dask cluster's worker processes did not start "
                              f"({str(err).rstrip('.')}); run it again, or run in this process "
                              f"({surface().option('scheduler', 'sync')}) to see what stops them") from err
        start_records.replay()
        try:
            client = Client(cluster)
            _one_opencv_thread(client)
        except BaseException:
            _close_quietly(None, cluster)
            raise
    yield from _serve(Executor(client, f"local dask cluster, {n} worker process(es)", expected=expected, local=True),
                      starting, client, cluster)


class _HeldRecords(logging.Filter):
    """The records of the logger ``name`` held back while a local cluster starts (``with``), and
    handed on (:meth:`replay`) unless the start fails for a reason packer says in one line: a
    nanny that cannot start its worker for want of open files logs "Failed to start process" with
    a traceback before dask raises, and that traceback beside exit 6's one line (raise
    ``ulimit -n``) read like a crash in a CI log."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._logger = logging.getLogger(name)
        self._held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self._held.append(record)
        return False

    def __enter__(self) -> _HeldRecords:
        self._logger.addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeFilter(self)

    def replay(self) -> None:
        """Hand the held records to the logger's handlers, as if never held; once."""
        held, self._held = self._held, []
        for record in held:
            self._logger.handle(record)


@functools.cache
def _nanny_class() -> type:
    """dask's Nanny, whose worker process logs dask's records at ``worker_log_level`` only (as
    ``silence_logs`` sets it), while the nanny here leaves this process's log handlers alone:
    ``silence_logs`` lowered them per nanny, with a save and restore that nannies of clusters on
    threads undid in the wrong order (:func:`_local_cluster_held` sets them once for all)."""
    from distributed import Nanny

    class QuietNanny(Nanny):  # type: ignore[misc]
        def __init__(self, *args: Any, worker_log_level: int, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "silence_logs": False})
            self.silence_logs = worker_log_level  # what the worker process is started with

    return QuietNanny


def _open_remote(scheduler: str, expected: Environment) -> Iterator[Executor]:
    """A client of the dask scheduler at ``scheduler`` (an address or a scheduler file)."""
    from distributed import Client

    with _held_interrupts() as starting:
        try:
            _check_it_speaks_dask(scheduler)
            client = (Client(scheduler_file=scheduler) if os.path.isfile(scheduler)
                      else Client(scheduler, timeout="30s"))
        except OSError as err:
            raise ConfigError(f"{surface().option('scheduler', scheduler)}: cannot connect to the dask scheduler "
                              f"({err}); start one with `dask scheduler` or {surface().omit('scheduler')} for a "
                              "local cluster") from err
        except ValueError as err:  # dask's parser: "missing port number in address 'localhost'"
            raise _not_an_address(scheduler, err) from err
        except MemoryError as err:  # a reply that is no dask frame (HTTP) read as a frame count: not this run's memory
            raise ConfigError(f"{surface().option('scheduler', scheduler)}: cannot connect to the dask scheduler: "
                              "it does not speak dask (its reply, read as a dask message, asked for an impossible "
                              f"allocation: {err}); give the scheduler's own address (tcp://host:8786 by default, "
                              "the one `dask scheduler` prints as 'Scheduler at'), or "
                              f"{surface().omit('scheduler')} for a local cluster") from err
    try:
        wait_for_a_worker(client, scheduler)
        check_workers(client, expected)
    except BaseException:
        with _held_interrupts():
            _close(client, None)
        raise
    dashboard = getattr(client, "dashboard_link", None)
    description = f"dask cluster at {scheduler}" + (f" (dashboard {dashboard})" if dashboard else "")
    yield from _serve(Executor(client, description, expected=expected), starting, client)


#: Seconds between the lines that say a build still waits for its scheduler's first worker.
WORKER_WAIT_LINE_S = 10.0


def wait_for_a_worker(client: Any, scheduler: str, *, every: float = WORKER_WAIT_LINE_S) -> None:
    """Return once ``client``'s scheduler has a worker. A scheduler without one accepts tasks
    and runs none, so the build sat silent; until one joins, a line on stderr says so every
    ``every`` seconds (Ctrl-C stops the wait)."""
    if client.scheduler_info().get("workers"):
        return
    address = getattr(getattr(client, "scheduler", None), "address", None) or scheduler
    print(f"packer: waiting: the dask scheduler at {scheduler} has no worker yet; the build starts when one joins "
          f"({_start_a_worker(address)})", file=sys.stderr, flush=True)
    waited = 0.0
    while True:
        try:
            client.wait_for_workers(1, timeout=every)
            return
        except TimeoutError:
            waited += every
            print(f"packer: waiting: still no dask worker at {scheduler} after {waited:.0f} s", file=sys.stderr,
                  flush=True)


def _one_opencv_thread(client: Any) -> None:
    """OpenCV's pool in each worker process of packer's local cluster: one thread (or
    ``PACKER_WORKER_CV_THREADS``), set by a worker plugin so that restarted workers get it too
    and the calling process keeps its own (:mod:`packer.threads`)."""
    from packer.threads import OpenCVThreads, worker_cv_threads

    threads = worker_cv_threads()
    if threads:
        client.register_plugin(OpenCVThreads(threads))


#: Seconds a scheduler's address may take to greet a new connection (dask's handshake: a scheduler
#: writes it as soon as it accepts; an HTTP server, such as the dashboard's port, writes nothing)
HANDSHAKE_WAIT_S = 10.0
#: The frame count a dask message starts with (8 bytes, little-endian) is small; ``HTTP/1.1``
#: read as one is about 3.5e18, and dask then tried to allocate that much (an internal error)
_MAX_FRAMES = 1 << 16


def _check_it_speaks_dask(scheduler: str, *, wait: float = HANDSHAKE_WAIT_S) -> None:
    """Raise ConfigError where the TCP address ``scheduler`` (or the one its scheduler file
    names) accepts a connection but does not greet it as a dask scheduler does: silent for
    ``wait`` seconds (an HTTP server: dask's Client then waited forever) or with bytes no dask
    message starts with (an HTTP reply: dask read them as a frame count and died in numpy); and
    where it speaks dask but is a worker, not the scheduler (:func:`_check_it_is_the_scheduler`).
    Anything else (no connection, another scheme, an unreadable file) is left to dask's Client,
    whose own errors are turned into messages by the caller."""
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port

    address = scheduler
    if os.path.isfile(scheduler):
        try:
            address = str(json.loads(Path(scheduler).read_text(encoding="utf-8"))["address"])
        except (OSError, ValueError, KeyError, TypeError):
            return
    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except (ValueError, TypeError):
        return
    if scheme != "tcp":
        return
    reset: OSError | None = None
    first: bytes | None
    try:
        conn = socket.create_connection((host, int(port)), timeout=wait)
    except (ConnectionResetError, ConnectionAbortedError) as err:  # accepted, then reset before connect returned
        conn, first, reset = None, b"", err
    except OSError:
        return  # dask's Client says it cannot connect, after its own timeout
    if conn is not None:
        with conn:
            conn.settimeout(wait)
            try:
                first = conn.recv(16)
            except TimeoutError:
                first = None
            except OSError as err:  # reset before any greeting (a proxy's idle timeout): a scheduler greets at once
                first, reset = b"", err
    if first is not None and len(first) >= 8 and int.from_bytes(first[:8], "little") < _MAX_FRAMES:
        _check_it_is_the_scheduler(scheduler, address, wait)
        return
    said = (f"accepts connections but said nothing in {wait:g} s" if first is None else
            f"dropped the connection before greeting it ({type(reset).__name__}: {reset})" if reset is not None else
            "closed the connection at once" if not first else f"answered {first[:12]!r}")
    raise ConfigError(f"{surface().option('scheduler', scheduler)}: cannot connect to the dask scheduler: {address} "
                      f"does not speak dask: it {said}, where "
                      "a scheduler greets every connection (an HTTP server such as the dashboard, :8787, does "
                      "not); give the scheduler's own address (tcp://host:8786 by default, the one `dask scheduler` "
                      f"prints as 'Scheduler at'), or {surface().omit('scheduler')} for a local cluster")


def _dask_identity(address: str, wait: float) -> dict[str, Any] | None:
    """The reply of the dask server at ``address`` to ``identity``, the call every dask server
    answers (its ``type``: Scheduler, Worker, Nanny; a worker's names its scheduler), or None
    where it cannot be had in ``wait`` seconds (dask's Client then says why). Asked from a thread
    of its own, so that a caller already inside an event loop (a notebook) can ask too."""
    import asyncio

    from distributed.core import rpc

    async def ask() -> Any:
        async with rpc(address, timeout=wait) as server:
            return await asyncio.wait_for(server.identity(), wait)

    def run() -> Any:
        try:
            return asyncio.run(ask())
        except (OSError, ValueError) as err:  # refused, closed, timed out (TimeoutError is an OSError)
            logging.getLogger(__name__).debug("asking %s for its dask identity: %r", address, err)
            return None

    reply = _in_a_thread(run, "packer: ask the dask scheduler who it is")
    return reply if isinstance(reply, dict) else None


def _check_it_is_the_scheduler(scheduler: str, address: str, wait: float) -> None:
    """Raise ConfigError where the dask server at ``address`` is a worker or a nanny, not a
    scheduler: dask's Client asked it for the scheduler's ``identity(n_workers=...)``, which a
    worker's takes no argument for, and died with that TypeError's traceback (an internal error)."""
    identity = _dask_identity(address, wait)
    if identity is None:
        return
    kind = identity.get("type")
    registered = identity.get("scheduler")
    if kind not in ("Worker", "Nanny") and not isinstance(registered, str):
        return
    what = "a dask worker's nanny" if kind == "Nanny" else "a dask worker"
    its_scheduler = (f" (this worker's is {registered})" if isinstance(registered, str) and registered
                     else "")
    where = "it" if address == scheduler else address  # a scheduler file's address is named
    raise ConfigError(f"{surface().option('scheduler', scheduler)}: {where} is {what}, not the dask scheduler; "
                      f"give the scheduler's address{its_scheduler}: the one `dask scheduler` prints as "
                      "'Scheduler at', or a worker's log as 'Registered to:' (tcp://host:8786 by default), or "
                      f"{surface().omit('scheduler')} for a local cluster")


def _not_an_address(scheduler: str, err: ValueError) -> ConfigError:
    return ConfigError(f"{surface().option('scheduler', scheduler)}: not a dask scheduler address ({err}); give "
                       "tcp://host:port, the file `dask scheduler --scheduler-file FILE` wrote, or sync; "
                       f"{surface().omit('scheduler')} for a local cluster")


def _check_scheduler_file(scheduler: str) -> None:
    """Raise ConfigError for a scheduler file (a path: an address is host:port or tcp://host:port)
    that is not there."""
    a_file = os.sep in scheduler or scheduler.endswith(".json")
    if "://" in scheduler or not a_file:
        return
    if not os.path.isfile(scheduler):
        raise ConfigError(f"{surface().option('scheduler', scheduler)}: no such scheduler file; give the file "
                          "`dask scheduler --scheduler-file FILE` wrote, or the scheduler's address (tcp://host:port)")
    try:
        with open(scheduler, encoding="utf-8") as handle:
            address = json.load(handle).get("address")
    except (OSError, ValueError, AttributeError) as err:  # empty, cut short, not JSON, not an object
        address = None
        why = f"it is not a scheduler file's JSON ({type(err).__name__}: {err})"
    else:
        why = "it names no scheduler address (its \"address\" key)"
    if not isinstance(address, str) or not address:
        raise ConfigError(f"{surface().option('scheduler', scheduler)}: {why}: an empty or half-written file, or one "
                          "a scheduler that stopped left behind; start the scheduler again "
                          "(`dask scheduler --scheduler-file FILE`), or give its address (tcp://host:port)")


def check_scheduler(scheduler: str | None) -> None:
    """Raise the ConfigError an address dask cannot parse gets at connection (``localhost``, a
    typo of ``sync``), or a scheduler file that is not there, before anything else is checked or
    started: the other checks' advice (a shared build cache for a cluster) would be beside the point."""
    if scheduler is None or scheduler == "sync":
        return
    if not isinstance(scheduler, str):  # packer.api turns a Path, a Client or a cluster into this or its error
        raise ConfigError(f"{surface().name('scheduler')}: {a_type(scheduler)}, not a dask scheduler's "
                          "address (tcp://host:port), its scheduler file or sync")
    _check_scheduler_file(scheduler)
    if "://" not in scheduler and (os.sep in scheduler or scheduler.endswith(".json")):  # a scheduler file
        return
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(scheduler)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(location)
    except ValueError as err:
        raise _not_an_address(scheduler, err) from err


# Ctrl-C and the dask cluster.
#
# A terminal sends SIGINT to its whole foreground process group: to packer and to the worker
# processes of its LocalCluster alike. A worker that took it died with a KeyboardInterrupt
# traceback (in the middle of importing, during start-up), its nanny logged the death and tried a
# restart ("Nanny failed to start"), and a Ctrl-C that reached packer while LocalCluster() was
# still starting left a half-built cluster to dask's atexit hook (AssertionError: Status.init):
# dozens of lines over packer's own one. So:
# - the worker processes never act on SIGINT, nor on a SIGTERM sent to the whole group (as a batch
#   scheduler's cancel does: a worker that took it while starting made dask report "Nanny failed
#   to start") (_call_interrupts_blocked): the cluster is started from a thread that blocks both,
#   the threads dask starts from there (its IO loop, and each nanny's
#   process watcher, which spawns the worker process) inherit the blocked mask, and a spawned
#   process keeps the mask across fork and exec (POSIX), before Python even starts in it; CPython's
#   multiprocessing.resource_tracker shields its own process the same way. Packer's client alone
#   takes the Ctrl-C (or SIGTERM: packer.commands relays it to the Ctrl-C handler) and closes the
#   cluster, which stops the workers as at the end of any build (a message from their nanny, and
#   SIGKILL if they do not stop in time);
# - while the cluster starts or stops, a Ctrl-C is held and acted on once it is up or down
#   (_held_interrupts), so it is never left half-made; a second Ctrl-C acts at once, as in dask's
#   own `dask worker` (distributed._signals);
# - while it is open, a Ctrl-C raises KeyboardInterrupt as usual, and is noted, so that one Python
#   drops (raised in a weakref callback) is raised again at the next task result (_noted_interrupts;
#   packer.commands.exits keeps Python from printing the dropped one);
# - after a Ctrl-C, dask's loggers are silenced while the cluster closes (_close_quietly): a
#   closing cluster's complaints about tasks cut short are the interrupt itself, not news. A
#   build that was not interrupted silences its own workers' loggers before the close (the work is
#   done; their heartbeats' complaints about a scheduler closing are noise), not packer's client.


def _serve(executor: Executor, starting: _HeldInterrupt, client: Any, cluster: Any | None = None) -> Iterator[Executor]:
    """Yield ``executor``, then close ``client`` and ``cluster``, holding any Ctrl-C while they
    close: quietly after a Ctrl-C, and acting on one held during start-up or the close once the
    cluster is up or closed."""
    with _noted_interrupts(executor):
        try:
            starting.replay()  # a Ctrl-C held during start-up acts now that the cluster can be closed
            yield executor
            if executor.interrupted:
                raise KeyboardInterrupt  # a Ctrl-C Python dropped where it landed
        except (KeyboardInterrupt, ClusterLostError):
            # a lost scheduler: dask would log its failed reconnection, with a traceback, while
            # the client closes; the error on its way out says what happened
            with _held_interrupts():
                _close_quietly(client, cluster)
            raise
        except BaseException:
            with _held_interrupts():  # another error is on its way out: it is what the user sees
                _close(client, cluster)
            raise
        with _held_interrupts() as stopping:
            _close(client, cluster)
        stopping.replay()


class _HeldInterrupt:
    """Whether a Ctrl-C arrived while :func:`_held_interrupts` held it, and the handler it was held from."""

    def __init__(self, handler: Callable[[int, FrameType | None], Any] | None) -> None:
        self.handler = handler
        self.arrived = False

    def replay(self) -> None:
        """Hand a held Ctrl-C to the handler it was held from (Python's default one raises
        KeyboardInterrupt)."""
        if self.arrived and self.handler is not None:
            self.arrived = False
            self.handler(signal.SIGINT, None)


def _python_sigint_handler() -> Callable[[int, FrameType | None], Any] | None:
    """The Python SIGINT handler this thread may replace: None off the main thread (only it runs
    signal handlers) and when SIGINT is ignored or not handled from Python (then packer leaves it be)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    return handler if callable(handler) else None


@contextlib.contextmanager
def _held_interrupts() -> Iterator[_HeldInterrupt]:
    """Hold the first Ctrl-C (SIGINT) that arrives in the body instead of raising it; the caller
    calls ``replay()`` when it can act on it. A second Ctrl-C goes to the handler at once."""
    held = _HeldInterrupt(_python_sigint_handler())
    if held.handler is None:
        yield held
        return
    handler = held.handler

    def hold(signum: int, frame: FrameType | None) -> None:
        held.arrived = True
        signal.signal(signal.SIGINT, handler)

    signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def _noted_interrupts(executor: Executor) -> Iterator[None]:
    """Ctrl-C goes to the handler as before (KeyboardInterrupt), and sets ``executor.interrupted``:
    Python cannot raise an exception out of a weakref callback or a ``__del__`` (dask runs many),
    so a Ctrl-C that lands in one is dropped there ("Exception ignored in ...") and the build
    would go on; noted, it is raised again at the next task result or when the cluster closes."""
    handler = _python_sigint_handler()
    if handler is None:
        yield
        return

    def note(signum: int, frame: FrameType | None) -> None:
        executor.interrupted = True
        handler(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


def _call_interrupts_blocked(start: Callable[[], T]) -> T:
    """``start()`` in a thread that blocks SIGINT and SIGTERM, waited for here: every thread it
    starts, and every process those threads spawn, blocks them from birth (see the note above)."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: no signal masks to inherit
        return start()
    from multiprocessing import resource_tracker

    # CPython's resource tracker, when a first multiprocessing lock starts it, blocks SIGINT while
    # it spawns its process and then *unblocks* it in the calling thread: started from dask's IO
    # loop, it undid the mask for every worker spawned after. Started here first, it is running
    # by then and the mask stays.
    resource_tracker.ensure_running()
    return _in_a_thread(start, "packer: start dask cluster", masked=True)


def _in_a_thread(fn: Callable[[], T], name: str, *, masked: bool = False) -> T:
    """``fn()`` run in a new thread named ``name`` and waited for here: its value returned, its
    exception raised here. It runs in a copy of this thread's context (a new thread starts with
    an empty one), so what it raises or prints names the caller's surface (command line or
    Python) and redacts as the caller's call does. ``masked``: the thread starts with SIGINT and
    SIGTERM blocked (a new thread starts with its creator's signal mask, which is set back at once)."""
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome["value"] = context.run(fn)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread, raised there
            outcome["error"] = err

    thread = threading.Thread(target=run, name=name, daemon=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if masked else None
    try:
        thread.start()
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def _close(client: Any, cluster: Any | None) -> None:
    """Close the client, and packer's own cluster after its workers' dask loggers are silenced:
    the work is done, and a worker whose heartbeat meets a scheduler already closing logs a
    CommClosedError traceback (dask/distributed #9032; seen in about one build in twenty)."""
    if cluster is not None:
        try:
            client.run(_quiet_worker, on_error="ignore", callback_timeout=CLOSE_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - closing goes on: the loggers only cost noise
            logging.getLogger(__name__).debug("silencing dask workers before close: %r", err)
    client.close()
    if cluster is not None:
        cluster.close()


#: Seconds an interrupted build waits for each step of closing dask (:func:`_close_quietly`).
CLOSE_TIMEOUT_S = 10


def _close_quietly(client: Any | None, cluster: Any | None) -> None:
    """Close a dask client and packer's own cluster after a Ctrl-C (or a failed start) with dask's
    loggers silenced: here, and in the cluster's worker processes, which log their side of a
    close that cuts tasks short (a heartbeat to a scheduler already gone, say: dask/distributed
    #9032). A close that fails is let go: the user asked packer to stop, the KeyboardInterrupt on
    its way out says so, and the worker processes exit by themselves when packer's process ends
    (each watches a pipe from its nanny for that: ``distributed.process.AsyncProcess``)."""
    steps: list[Callable[[], Any]] = []
    if client is not None and cluster is not None:  # packer's own workers, never a shared cluster's
        steps.append(lambda: client.run(_quiet_worker, on_error="ignore", callback_timeout=CLOSE_TIMEOUT_S))
    if client is not None:
        steps.append(lambda: client.close(timeout=CLOSE_TIMEOUT_S))
    if cluster is not None:
        steps.append(lambda: cluster.close(timeout=CLOSE_TIMEOUT_S))
    with _dask_logs_silenced():
        for step in steps:
            try:
                step()
            except Exception as err:  # noqa: BLE001 - see the docstring: nothing to add to the interrupt
                logging.getLogger(__name__).debug("closing dask after Ctrl-C: %r", err)


def _quiet_worker() -> None:
    """Run on each worker process of packer's cluster before it closes (the build done, or cut short)."""
    _silence_dask_logs()


def _silence_dask_logs() -> list[tuple[logging.Logger, bool]]:
    """Disable every ``distributed.*`` logger (and tornado's and asyncio's, which dask's loop logs
    through) in this process; return each with its ``disabled`` flag before."""
    names = ["distributed", "tornado", "asyncio"]
    names += [name for name in logging.root.manager.loggerDict
              if name.startswith(("distributed.", "tornado.", "asyncio."))]
    saved = [(logger, logger.disabled) for logger in map(logging.getLogger, names)]
    for logger, _ in saved:
        logger.disabled = True
    return saved


@contextlib.contextmanager
def _dask_logs_silenced() -> Iterator[None]:
    """:func:`_silence_dask_logs` for the body, as it was after."""
    saved = _silence_dask_logs()
    try:
        yield
    finally:
        for logger, disabled in saved:
            logger.disabled = disabled
