"""Native thread pools in packer's dask workers: one thread for each task a worker runs.

A dask worker runs ``threads_per_worker`` tasks at once, and packer's local cluster starts one
single-threaded worker process per core. OpenCV's own thread pool (``parallel_for``: resize,
blur, template matching, affine warps) starts as many threads as the machine has cores in
*every* process, so on a busy cluster each call splits itself across threads that compete with
the other workers' tasks for the same cores, and small images pay the hand-off for nothing: the
near-copy verification of 64×64 thumbnails measured 1.58 ms a pair with OpenCV's default two
threads and 1.33 ms with one in one process while both cores were busy, and 3-10% less
verification time in 10,000-file builds on 2 workers of a quiet 2-core VM (the build's wall
within its noise; ``benchmarks/RESULTS.md``). dask's nanny already sets ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` to 1 in its workers for the same reason
(``distributed.nanny.pre-spawn-environ``); OpenCV's pool in the opencv-python wheels is
pthreads-based and does not read them.

:func:`tune_worker_threads` sets OpenCV to one thread, once per process, and only inside a dask
worker: a build under ``--scheduler sync`` runs its tasks in the client, whose OpenCV keeps
every core. OpenCV's results do not depend on its thread count (each thread computes whole rows
or tiles of the same arithmetic); the tests compare the near-copy evidence and a build's bytes
with one thread and with several. ``PACKER_WORKER_CV_THREADS=N`` sets another count (``0``:
leave OpenCV's default).
"""

from __future__ import annotations

import os

from packer.errors import ConfigError

#: Environment variable: OpenCV threads in a dask worker (default 1; 0 leaves OpenCV's default).
ENV_THREADS = "PACKER_WORKER_CV_THREADS"

_tuned_pid: int | None = None


def worker_cv_threads() -> int:
    """The OpenCV thread count a dask worker gets: :data:`ENV_THREADS`, default 1 (0: untouched).
    Raises ConfigError naming the variable when it is not a whole number ≥ 0."""
    text = os.environ.get(ENV_THREADS, "1").strip()
    if not text.isdigit():
        raise ConfigError(f"{ENV_THREADS}={text!r}: give a whole number of threads (1: one a task, the default; "
                         "0: leave OpenCV's own default)")
    return int(text)


def in_dask_worker() -> bool:
    """True when this code runs in a task on a dask worker (not in the client, not under the
    synchronous scheduler)."""
    try:
        from distributed import get_worker
    except ImportError:  # pragma: no cover - distributed is a core dependency
        return False
    try:
        get_worker()
    except ValueError:
        return False
    return True


def tune_worker_threads() -> bool:
    """In a dask worker, set OpenCV's thread pool to :func:`worker_cv_threads` threads (once per
    process); True when this process's count is set. False, changing nothing, outside a worker or
    when the variable says 0."""
    global _tuned_pid
    if _tuned_pid == os.getpid():
        return True
    threads = worker_cv_threads()
    if threads == 0 or not in_dask_worker():
        return False
    import cv2

    cv2.setNumThreads(threads)
    _tuned_pid = os.getpid()
    return True
