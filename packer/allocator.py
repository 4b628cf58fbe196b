"""Allocator settings of packer's processes: glibc's thresholds on workers and the client, Arrow's pool on the client.

**Workers: keep glibc from handing multi-megabyte decode buffers back to the kernel after every file.**

Decoding one file allocates a few arrays of 0.5-4 MB (the decoded image, its float32 and
float64 working copies). glibc serves an allocation that large with its own ``mmap`` and
returns it with ``munmap`` when freed; its dynamic threshold then rises to the freed size, but
an allocation of exactly that size still takes the ``mmap`` path. So every file pays fresh
page faults for every buffer: ``benchmarks/`` measured packer's JPEG reader at 4.8 ms a file
with glibc's defaults and 1.9 ms with fixed thresholds, on the same files and core.

:func:`tune_allocator` sets fixed thresholds (``mallopt``) once per process: allocations up
to 32 MiB come from the heap, and the heap keeps up to 64 MiB of free memory at its top
instead of trimming it after each free. A worker's memory therefore stays within its peak
working set plus 64 MiB; nothing grows with the number of files. It is a no-op where the C
library is not glibc.

**Training process: opt-in.** packer never changes the allocator of the process that trains.
With ``num_workers=0`` the batches are stacked there, and each freshly allocated batch buffer
is mapped and faulted in afresh; calling :func:`tune_allocator` once at the start of training
lets them reuse freed heap memory instead (``benchmarks/read_bounds.py``: a view per source,
9,700 → 12,300-12,700 samples/s on the peer harness's data; 14,300-14,900 with torch's
``THP_MEM_ALLOC_ENABLE=1`` on top). The price is the same as on a worker: up to 64 MiB of freed
memory kept at the heap's top.

**Client: a fixed mmap threshold** (:func:`tune_client_allocator`), so that large buffers the
client frees go back to the kernel, and **Arrow's allocations go to the C library's allocator**
(:func:`system_arrow_pool`).
Arrow's default pool (mimalloc in the wheels) keeps freed pages per thread of Arrow's own
thread pools, and ``release_unused`` does not return them all: reading a 100,000-row sample
index left the client 42 MiB larger, against 10 MiB with the system pool
(``benchmarks/RESULTS.md``). The client allocates a few tables per build, so mimalloc's speed
does not matter there; its retained pages would count in the build's peak.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
from collections.abc import Iterator
from typing import Any

from packer.files import libc_function

log = logging.getLogger("packer.allocator")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024   # glibc's ceiling for this setting on 64-bit systems
TRIM_THRESHOLD = 64 * 1024 * 1024
CLIENT_MMAP_THRESHOLD = 256 * 1024  # glibc's default starting value, kept from rising
#: Set to ``0`` to leave the C library's allocator settings alone.
ENV_SWITCH = "PACKER_TUNE_MALLOC"

_tuned_pid: int | None = None


def tune_allocator() -> bool:
    """Set glibc's mmap and trim thresholds for this process (once); True when they are set.

    Returns False, changing nothing, off glibc, when ``PACKER_TUNE_MALLOC=0``, or when
    ``mallopt`` refuses a value.
    """
    global _tuned_pid
    if _tuned_pid == os.getpid():
        return True
    if not _mallopt({M_MMAP_THRESHOLD: MMAP_THRESHOLD, M_TRIM_THRESHOLD: TRIM_THRESHOLD}):
        return False
    _tuned_pid = os.getpid()
    return True


def tune_client_allocator() -> bool:
    """Fix glibc's mmap threshold at :data:`CLIENT_MMAP_THRESHOLD` in the build's client; True
    when set (False, changing nothing, where :func:`tune_allocator` would not either).

    glibc's default threshold is dynamic: freeing a mapped block raises it to that block's
    size (up to 32 MiB). After the client frees its first multi-megabyte buffer (a table
    column, a batch of dask messages), every buffer below that size comes from the heap, where
    freed ones leave holes the heap cannot give back. A fixed threshold keeps each large
    buffer its own mapping, returned when freed: the client's peak at 100k samples fell by
    about 20 MiB (``benchmarks/RESULTS.md``). Small objects are CPython's business and are
    not affected.
    """
    return _mallopt({M_MMAP_THRESHOLD: CLIENT_MMAP_THRESHOLD})


def _mallopt(settings: dict[int, int]) -> bool:
    if os.environ.get(ENV_SWITCH, "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = libc_function("mallopt", "c_int", "c_int")
    if mallopt is None:
        log.debug("glibc's mallopt is not reachable")
        return False
    if not all(mallopt(option, value) for option, value in settings.items()):
        log.debug("mallopt refused %s", settings)
        return False
    return True


@contextlib.contextmanager
def system_arrow_pool() -> Iterator[None]:
    """Within the block, Arrow allocates through the C library (``pyarrow.system_memory_pool``);
    the previous default pool is restored after, so a program that calls packer keeps its own."""
    import pyarrow as pa

    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


@functools.cache
def _malloc_trim() -> Any:
    if os.environ.get(ENV_SWITCH, "1") == "0" or platform.libc_ver()[0] != "glibc":
        return None
    return libc_function("malloc_trim", "c_size_t")


def trim_heap() -> bool:
    """Hand the free pages inside glibc's heaps back to the kernel (``malloc_trim(0)``); True
    where that was done (a no-op elsewhere, and with ``PACKER_TUNE_MALLOC=0``).

    Buffers under the client's mmap threshold (:data:`CLIENT_MMAP_THRESHOLD`), such as the index's
    per-shard columns, come from the heap; freed in the middle of it, their pages stay in the
    process's RSS and are not reused by the large buffers made next (each its own mapping), so
    code that frees many small buffers to make large ones calls this between the two."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
