"""Benchmark the disk a `packer build` needs beyond the dataset it writes, and the bytes it writes to the disk.

    .venv/bin/python benchmarks/build_disk.py --job JOB.yaml --runs 3   # prints a table for RESULTS.md
    .venv/bin/python benchmarks/build_disk.py --job JOB.yaml --modes default --cache-root /dev/shm --every 1

Each run is ``packer build JOB --out OUT --cache-dir CACHE --fresh --quiet --no-report
--workers N`` (plus ``--keep-spill`` for the opt-in mode) in a fresh process, with fresh
output and cache folders in ``--scratch`` (the cache in ``--cache-root`` where given, e.g. a
tmpfs, to see what the spill costs the output's disk; both deleted afterwards). While it runs, a
thread walks both folders every ``--every`` seconds and sums the blocks allocated to their files
(``st_blocks`` × 512: a punched hole counts as freed, a sparse file as what it holds). Reported:
the dataset's size (the version folder at the end), the peak of OUT + CACHE during the build,
the extra disk (peak minus dataset, and as a share of the dataset), what the cache holds
after the build, the build's wall time, and the bytes written to the block device under
``--scratch`` (``/proc/diskstats``, Linux): during the build, and by a ``sync`` right after it
(what was still only in the page cache). A spill that lives longer than the kernel's dirty
expiry is written back before it is freed, so a large build writes more than its dataset.
The modes alternate for ``--runs`` rounds; medians. Sampling can miss a peak shorter than
``--every``; the spill changes size by shards, which take far longer to write than that.
Nothing else should write to that disk meanwhile: the counts are the whole device's.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKER = Path(sys.executable).with_name("packer")
MODES = {"default": [], "--keep-spill": ["--keep-spill"]}


def block_device(folder: Path) -> str | None:
    """The name ``/proc/diskstats`` gives the block device holding ``folder`` (a partition's own
    name, e.g. ``vda1``), or None where there is none (tmpfs, overlay, not Linux)."""
    dev = os.stat(folder).st_dev
    link = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    return link.resolve().name if link.exists() else None


def sectors_written(device: str | None) -> int:
    """512-byte sectors written to ``device`` since boot (field 10 of ``/proc/diskstats``); 0 without one."""
    if device is None:
        return 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if fields[2] == device:
            return int(fields[9])
    return 0


def allocated(*folders: Path) -> int:
    """Bytes allocated to every file under ``folders`` (``st_blocks`` × 512), files vanishing meanwhile skipped."""
    total = 0
    stack = [os.fspath(f) for f in folders]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def one_build(job: Path, scratch: Path, workers: int, extra: list[str], every: float,
              cache_root: Path | None = None) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="build-disk-", dir=scratch))
    cache_dir = Path(tempfile.mkdtemp(prefix="build-disk-cache-", dir=cache_root)) if cache_root else run_dir
    out, cache = run_dir / "out", cache_dir / "cache"
    device = block_device(scratch)
    peak, done = 0, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, allocated(out, cache))
            time.sleep(every)

    watcher = threading.Thread(target=watch, daemon=True)
    os.sync()  # what earlier work left in the page cache is not counted as this build's
    before = sectors_written(device)
    started = time.perf_counter()
    watcher.start()
    try:
        subprocess.run([str(PACKER), "build", str(job), "--out", str(out), "--cache-dir", str(cache), "--fresh",
                        "--quiet", "--no-report", "--workers", str(workers), *extra],
                       check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        during = sectors_written(device) - before
        os.sync()
        after_sync = sectors_written(device) - before - during
        done.set()
        watcher.join()
        peak = max(peak, allocated(out, cache))
        (version,) = [p for p in out.glob("*/*") if (p / "manifest.json").is_file()]
        dataset = allocated(version)
        return {"dataset": dataset, "peak": peak, "extra": peak - dataset, "cache_after": allocated(cache),
                "wall": wall, "written": during * 512, "synced": after_sync * 512}
    finally:
        done.set()
        shutil.rmtree(run_dir, ignore_errors=True)
        if cache_dir != run_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    fs = subprocess.run(["df", "-T", "."], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, scratch on {fs}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--every", type=float, default=0.01, help="seconds between walks of the folders")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()),
                        help="folder for each run's output (made if missing; default: the temp folder)")
    parser.add_argument("--cache-root", type=Path, default=None,
                        help="put each run's build cache here instead of beside its output (e.g. /dev/shm)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    args = parser.parse_args()
    unknown = [name for name in args.modes.split(",") if name not in MODES]
    if unknown:
        parser.error(f"--modes: unknown mode {unknown[0]!r}; the modes are {', '.join(MODES)}")
    modes = {name: MODES[name] for name in args.modes.split(",")}
    args.scratch.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for _ in range(args.runs):
        for mode, extra in modes.items():
            results[mode].append(one_build(args.job.resolve(), args.scratch, args.workers, extra, args.every,
                                           args.cache_root))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    mb = 1e6
    lines = [f"### Extra disk during a build (benchmarks/build_disk.py, packer at {commit})", "",
             f"Job `{args.job}`, {args.workers} workers, medians of {args.runs} run(s) per mode, folders walked every "
             f"{args.every * 1000:.0f} ms. Machine: {machine()}. Cache "
             f"{'in ' + str(args.cache_root) if args.cache_root else 'beside the output'}; bytes written to "
             f"{block_device(args.scratch) or 'no block device'}.", "",
             "| mode | dataset MB | peak out+cache MB | extra MB | extra / dataset | cache after MB | build s "
             "| written during the build MB | written by a sync after it MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(f"| {mode} | {med['dataset'] / mb:,.0f} | {med['peak'] / mb:,.0f} | {med['extra'] / mb:,.0f} | "
                     f"{med['extra'] / med['dataset']:.1%} | {med['cache_after'] / mb:,.1f} | {med['wall']:.1f} "
                     f"| {med['written'] / mb:,.0f} | {med['synced'] / mb:,.0f} |")
    print("\n".join(lines))  # pasted into RESULTS.md by hand, with the section it belongs to

if __name__ == "__main__":
    main()
