"""Run stage tasks on dask: a local cluster by default, an existing scheduler, or in-process.

This is the only module that imports dask. Tasks are plain top-level functions over
picklable records; results come back in completion order and callers sort them, so the
output never depends on which worker finished first.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

from packer.errors import ConfigError, PackerError

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


def _run(fn: Callable[[T], R], item: T) -> R | _RunDefect:
    """Dask task: ``fn(item)``, or the PackerError it raised as a :class:`_RunDefect`."""
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

    def __init__(self, client: Any | None, description: str) -> None:
        self.client = client
        self.description = description

    def threads(self) -> int:
        """Worker threads of the cluster now; 0 in-process."""
        if self.client is None:
            return 0
        return int(sum(self.client.nthreads().values()))

    def window(self) -> int:
        """Tasks kept in flight: four per worker thread, at least eight."""
        if self.client is None:
            return 1
        return max(8, 4 * self.threads())

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T],
                      keys: Sequence[str] | None = None) -> Iterator[tuple[T, R | WorkerLost]]:
        """Yield ``(item, result)`` as tasks finish. A task whose workers kept dying (dask's
        ``allowed-failures`` exhausted) yields ``(item, WorkerLost)`` instead of raising, so the
        caller can isolate the culprit; any other exception propagates. ``keys`` name the dask
        tasks (they show on the dashboard).

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
        from distributed.scheduler import KilledWorker

        client = self.client
        names = list(keys) if keys is not None else [None] * len(items)
        item_of: dict[Any, T] = {}
        running = as_completed()
        submitted = 0

        def submit_next() -> None:
            nonlocal submitted
            future = client.submit(_run, fn, items[submitted], key=names[submitted], pure=False)
            item_of[future.key] = items[submitted]
            running.add(future)
            submitted += 1

        while submitted < min(len(items), self.window()):
            submit_next()
        for future in running:
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
            finally:
                future.release()


@contextlib.contextmanager
def open_executor(scheduler: str | None = None, workers: int | None = None) -> Iterator[Executor]:
    """``scheduler``: None → LocalCluster of ``workers`` processes; ``"sync"`` → in-process;
    ``tcp://host:port`` or a scheduler-file path → that dask.distributed cluster."""
    if scheduler == "sync":
        yield Executor(None, "in-process (sync)")
        return
    with _no_message_logs():
        yield from _open_distributed(scheduler, workers)


#: dask keeps its last ``distributed.admin.low-level-log-length`` (default 1000) batches of comm
#: messages for debugging. A batch carries whole task specs, and a task's arguments are a chunk's
#: file records or a shard's sample records: on the client (and the in-process scheduler of a
#: LocalCluster) that log held unpickled copies of every task of a build, ~1 KB per sample of
#: a pass, growing with the dataset. packer runs with the log off.
MESSAGE_LOG_LENGTH = 0


@contextlib.contextmanager
def _no_message_logs() -> Iterator[None]:
    import dask
    import distributed  # noqa: F401 - loads distributed's config defaults before the set below

    # dask.config.set undoes a key that did not exist by deleting it: set before distributed's
    # defaults were loaded, it took all of "distributed.*" with it on exit, and the next
    # LocalCluster in the same process failed with KeyError: 'comm'
    with dask.config.set({"distributed.admin.low-level-log-length": MESSAGE_LOG_LENGTH}):
        yield


def _open_distributed(scheduler: str | None, workers: int | None) -> Iterator[Executor]:
    from distributed import Client, LocalCluster

    if scheduler is None:
        n = workers or default_workers()
        # dask's workers start with MALLOC_TRIM_THRESHOLD_=65536; packer's tasks override it with
        # fixed glibc thresholds (packer.allocator), on this cluster and on any other
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                               silence_logs=logging.ERROR)
        client = Client(cluster)
        try:
            yield Executor(client, f"local dask cluster, {n} worker process(es)")
        finally:
            client.close()
            cluster.close()
        return
    try:
        client = (Client(scheduler_file=scheduler) if os.path.isfile(scheduler)
                  else Client(scheduler, timeout="30s"))
    except OSError as err:
        raise ConfigError(f"--scheduler {scheduler}: cannot connect to the dask scheduler ({err}); "
                          "start one with `dask scheduler` or omit --scheduler for a local cluster") from err
    try:
        dashboard = getattr(client, "dashboard_link", None)
        yield Executor(client, f"dask cluster at {scheduler}" + (f" (dashboard {dashboard})" if dashboard else ""))
    finally:
        client.close()
