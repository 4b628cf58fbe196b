"""OpenCV's thread pool in the worker processes of packer's local dask cluster: one thread each.

packer's local cluster starts one single-threaded worker process per core. OpenCV's own thread
pool (``parallel_for``: resize, blur, template matching, affine warps) starts as many threads as
the machine has cores in *every* process, so each call splits itself across threads that
compete with the other workers' tasks for the same cores, and small images pay the hand-off for
nothing: the near-copy verification of 64×64 thumbnails measured 1.58 ms a pair with OpenCV's
default two threads and 1.33 ms with one in one process while both cores were busy, and 3-10%
less verification time in 10,000-file builds on 2 workers of a quiet 2-core VM (the build's wall
within its noise; ``benchmarks/RESULTS.md``).

dask's nanny sets ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` to 1
for the worker processes it spawns, for the same reason; OpenCV's pool does not read them. Its
own variable, ``OPENCV_FOR_THREADS_NUM``, would have to pass through the nanny's
``pre-spawn-environ``, which dask writes into the *calling* process's environment too, where
OpenCV reads it lazily: a notebook's own OpenCV would have gone single-threaded after a build.
So :class:`OpenCVThreads` is a dask worker plugin that sets the count in each worker process
when it starts (and in each worker that restarts), registered on packer's own local cluster
only: the process that calls packer (a notebook, a training script, a build under
``--scheduler sync``) keeps its pool, and a cluster given by ``--scheduler`` keeps its own
settings. OpenCV's results do not depend on its thread count (each thread computes whole rows
or tiles of the same arithmetic); the tests compare the near-copy evidence, resizes and
signatures on one thread and on several. ``PACKER_WORKER_CV_THREADS=N`` gives the local workers
another count (``0``: OpenCV's own default).
"""

from __future__ import annotations

import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from packer.errors import ConfigError

#: Environment variable: OpenCV threads in a local worker (default 1; 0 leaves OpenCV's default).
ENV_THREADS = "PACKER_WORKER_CV_THREADS"


def worker_cv_threads() -> int:
    """The OpenCV thread count a local worker gets: :data:`ENV_THREADS`, default 1 (0: untouched).
    Raises ConfigError naming the variable when it is not a whole number ≥ 0."""
    text = os.environ.get(ENV_THREADS, "1").strip()
    if not text.isdigit():
        raise ConfigError(f"{ENV_THREADS}={text!r}: give a whole number of threads (1: one a worker, the default; "
                          "0: leave OpenCV's own default)")
    return int(text)


class OpenCVThreads(WorkerPlugin):  # type: ignore[misc]  # distributed's plugin base is untyped
    """A dask worker plugin (``Client.register_plugin``): OpenCV's pool gets ``threads`` threads
    in every worker process of the cluster, now and whenever one (re)starts."""

    name = "packer-opencv-threads"

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def setup(self, worker: Any) -> None:
        from packer.opencv import cv2

        cv2.setNumThreads(self.threads)
