"""Allocator settings: glibc thresholds (large decode buffers are reused from the heap, not mapped
afresh per file) and the client's Arrow pool."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from packer.allocator import system_arrow_pool, tune_allocator

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")

# A decode-like loop: per "file" a decoded 640×480×3 image, its float32 copy, a scaled copy and
# a smaller output, all freed after. The minor page faults of the last 20 files tell whether the
# buffers were mapped afresh for each file (glibc's defaults: thousands a file) or reused from
# the heap (next to none).
_CHURN = textwrap.dedent("""
    import resource, sys
    import numpy as np
    applied = False
    if sys.argv[1] == "tuned":
        from packer.allocator import tune_allocator
        applied = tune_allocator()

    def decode_like():
        image = np.ones((480, 640, 3), np.uint8)
        scaled = image.astype(np.float32) * 2
        return scaled[::2, ::2].copy().sum()

    for _ in range(5):
        decode_like()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        decode_like()
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")



def faults(mode: str, **env: str) -> tuple[bool, int]:
    """(whether the thresholds were set, minor faults of 20 files) in a fresh interpreter."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], check=True, capture_output=True, text=True,
                         env={**clean, **env})
    applied, count = out.stdout.split()
    return applied == "True", int(count)


@glibc_only
def test_tuned_processes_reuse_decode_buffers_instead_of_faulting_them_in_again() -> None:
    applied, default = faults("default")
    assert not applied and default > 20 * 1000                           # every buffer mapped afresh
    applied, tuned = faults("tuned")
    assert applied and tuned < 200                                       # the same heap memory, reused


@glibc_only
def test_tuning_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    applied, count = faults("tuned", PACKER_TUNE_MALLOC="0")
    assert not applied and count > 20 * 500
    monkeypatch.setenv("PACKER_TUNE_MALLOC", "0")
    monkeypatch.setattr("packer.allocator._tuned_pid", None)
    assert tune_allocator() is False


def test_the_system_arrow_pool_holds_inside_the_block_and_the_callers_pool_comes_back() -> None:
    before = pa.default_memory_pool()
    with system_arrow_pool():
        assert pa.default_memory_pool().backend_name == "system"
        array = pa.array(range(100_000), pa.int64())
        assert pa.system_memory_pool().bytes_allocated() >= array.nbytes
    assert pa.default_memory_pool().backend_name == before.backend_name
    with pytest.raises(RuntimeError), system_arrow_pool():
        raise RuntimeError("a failed build")
    assert pa.default_memory_pool().backend_name == before.backend_name


# 40 buffers of 1 MiB after a 16 MiB one was freed (which raises glibc's dynamic threshold
# to 16 MiB); every other one is then freed. How much of that half the process gives back
# tells whether the buffers were mappings of their own or heap blocks with live neighbours.
_HOLES = textwrap.dedent("""
    import sys
    if sys.argv[1] == "tuned":
        from packer.allocator import tune_client_allocator
        assert tune_client_allocator()

    def rss_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1])

    big = bytearray(16 << 20)
    del big
    buffers = [bytearray(b"x" * (1 << 20)) for _ in range(40)]
    before = rss_kib()
    del buffers[::2]
    print((before - rss_kib()) // 1024)
""")


@glibc_only
def test_the_client_gives_freed_large_buffers_back() -> None:
    def returned(mode: str) -> int:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        out = subprocess.run([sys.executable, "-c", _HOLES, mode], check=True, capture_output=True, text=True,
                             env=clean)
        return int(out.stdout)

    assert returned("default") < 5      # heap holes between live blocks: nothing comes back
    assert returned("tuned") >= 18      # each freed MiB was its own mapping


def _tuned_here(items: list) -> list[tuple[int, bool]]:
    """Collate that reports (this process's id, whether packer tuned its allocator)."""
    import packer.allocator as allocator

    return [(os.getpid(), allocator._tuned_pid == os.getpid())]


@glibc_only
def test_dataloader_workers_reading_shards_are_tuned_and_the_main_process_is_left_alone(tmp_path) -> None:
    """Where a loader worker copies each sample into a buffer of its own (``PACKER_TAR_MMAP=0``, remote
    shards), tuned it reuses freed ones (on the peer harness's data 3,713 -> 4,605 samples/s with 2
    workers); the training process is the user's."""
    import torch

    import packer.allocator as allocator
    from packer.loader import ShardDataset
    from tests.loader_fixtures import build_dataset

    manifest = build_dataset(tmp_path / "ds", shard_sizes=(4, 4))
    before = allocator._tuned_pid
    loader = torch.utils.data.DataLoader(ShardDataset(manifest, "train"), batch_size=2, num_workers=2,
                                         collate_fn=_tuned_here)
    seen = {pid: tuned for batch in loader for pid, tuned in batch}
    assert len(seen) == 2 and os.getpid() not in seen and all(seen.values())
    assert [_ for _ in ShardDataset(manifest, "train")] and allocator._tuned_pid == before  # in-process: untouched


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_the_heaps_free_pages_go_back_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # the index's per-shard columns are heap buffers: freed, their pages stay in the client's
    # RSS under the index made of them unless they are trimmed
    script = textwrap.dedent("""
        import gc
        from pathlib import Path
        from packer.allocator import trim_heap, tune_client_allocator

        def rss():
            line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
            return int(line.split()[1]) * 1024

        tune_client_allocator()
        small = [bytearray(100_000) for _ in range(2_000)]   # 200 MB of heap buffers
        keep = small[-1::-100]                                # a few, pinning the heap's top
        del small
        gc.collect()
        before = rss()
        print(trim_heap(), (before - rss()) // 2**20)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    trimmed, returned_mib = done.stdout.split()
    assert trimmed == "True" and int(returned_mib) > 150
    from packer import allocator

    allocator._malloc_trim.cache_clear()
    monkeypatch.setenv(allocator.ENV_SWITCH, "0")
    try:
        assert allocator.trim_heap() is False
    finally:
        allocator._malloc_trim.cache_clear()
