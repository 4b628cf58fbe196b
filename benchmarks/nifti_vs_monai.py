"""Benchmark NIfTI CT volumes → 3-D samples at 1.5 mm: packer's ``kind: nifti`` against MONAI 1.x.

    .venv/bin/python benchmarks/nifti_vs_monai.py                  # 20 volumes 512×512×200, writes the section
    .venv/bin/python benchmarks/nifti_vs_monai.py --no-write --volumes 4 --cases sync,monai

MONAI is not a packer dependency and never goes into pyproject: install it in a venv of its own,
once (``torch==2.13.0`` first: the CPU build this machine carries, so no multi-GB CUDA build is
pulled), and point ``--monai-python`` at it (the default path below)::

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install torch==2.13.0
    /work/bench-venv/bin/pip install monai nibabel

Without it the MONAI rows are left out (and the ratio with them).

**Data** (written once under ``--data``, default ``/work/bench-data/nifti``, kept while
``stamp.json`` matches): ``--volumes`` CT-like int16 volumes of ``--size``² × ``--slices``
(default 20 × 512×512×200, 100 MiB each decoded), seeded per volume (``--seed``): an air
background with -1024 outside the reconstruction circle, a table, a body outline with
subcutaneous fat and muscle, spine (vertebrae and discs), ribs, aorta, lungs with vessels, heart,
liver, kidneys, bowel gas and pelvis, each placed and sized per patient, plus Gaussian noise
(σ 12 HU). Voxels 0.7 × 0.7 × 1.25 mm (so resampling to 1.5 mm does real work on every axis),
stored LAS as dcm2niix writes axial CT (both contenders flip one axis to reach LPS), HU as
stored values (``scl_slope`` unset), gzip level 6 (``.nii.gz``, dcm2niix's default level).

**Cases**, each one run in a fresh process (``--cases``; the machine is shared, so each run
records the CPU other processes used meanwhile, from ``/proc/stat``):

- ``sync``: ``packer build JOB --scheduler sync`` pinned to one core (per core: one process does
  everything);
- ``workers2``: ``packer build JOB --workers 2`` (a 2-process LocalCluster: per core = rate / 2);
- ``monai``: one process pinned to one core (``torch.set_num_threads(1)``) runs, per volume,
  ``LoadImaged`` → ``EnsureChannelFirstd`` → ``Orientationd(axcodes="LPS")`` →
  ``Spacingd(pixdim=1.5, mode="bilinear")`` → ``ScaleIntensityRanged(-160, 240, 0, 1, clip=True)``
  (the window packer applies: centre 40, width 400) and writes ``rint(255·x)`` as uint8 ``.npy``
  (packer writes uint8 too), one file per volume;
- ``monai2``: two such processes, each on its own core, each with half the volumes (per core =
  rate / 2).

packer's job: ``transform.nifti: {windows: [{center: 40, width: 400}], sample: {volume: {spacing:
[1.5, 1.5, 1.5]}}, output: uint8}``, WebDataset shards, ``--fresh --no-report``, everything else
on (header probe and limits, value checks, near-copy signatures, hashes, split, audit, shards,
manifest). The stage clock packer prints (time summed over tasks) is kept.

**Measures.** Wall time from start to exit; CPU = user + system of the process tree
(``wait4``: the child and every descendant it waited for); volumes/s = volumes / wall;
volumes/s per core = volumes/s / cores the case uses (1 pinned, 2 for two workers or processes).
**Peak RSS per worker**: ``VmHWM`` of each process of the tree, polled every 0.1 s, plus
``ru_maxrss`` of the tree; the largest process that decodes (packer: the sync process or the
largest dask worker; MONAI: the largest process). The **baseline** is the same interpreter with the
same imports and nothing decoded (its ``ru_maxrss``), so peak − baseline is what the volumes cost.
One decoded volume is 512×512×200 int16 = 100 MiB as stored, 200 MiB as float32 (what both
tools compute in); the section compares peak RSS with both (module README: which and why).

Prints the table and one JSON line with every number; writes the section of ``RESULTS.md``
unless ``--no-write``. ``--child`` is the entry of the MONAI and baseline runs (no packer import,
so it runs in MONAI's venv).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SECTION = "## NIfTI volumes against MONAI: 20 CT 512×512×200 → 1.5 mm"
DEFAULT_DATA = Path("/work/bench-data/nifti")
DEFAULT_MONAI_PYTHON = Path("/work/bench-venv/bin/python")
SPACING = (0.7, 0.7, 1.25)  # mm, x y z as stored
WINDOW = (40.0, 400.0)  # centre, width (HU): MONAI a_min -160, a_max 240
TARGET_RATIO = 1.5
TARGET_RSS_VOLUMES = 2.0
CASES = ("sync", "workers2", "monai", "monai2")
MIB = 2**20


# ---------------------------------------------------------------- data


def _ellipse(xs: np.ndarray, ys: np.ndarray, cx: float, cy: float, ax: float, ay: float) -> np.ndarray:
    """Normalised ellipse radius in mm coordinates: < 1 inside."""
    return ((xs - cx) / ax) ** 2 + ((ys - cy) / ay) ** 2


def render_ct_volume(seed: int, index: int, size: int, slices: int) -> np.ndarray:
    """One CT-like volume, HU as int16, shape (X, Y, Z) in Fortran order (NIfTI's storage order).

    x runs to the patient's left, y anterior, z superior (LAS voxel axes; module docstring).
    Everything is drawn in mm so that the anatomy keeps its size whatever ``size``/``slices``."""
    rng = np.random.default_rng([seed, index])
    dx, dy, dz = SPACING
    x = (np.arange(size, dtype=np.float32) - size / 2 + 0.5) * dx
    y = (np.arange(size, dtype=np.float32) - size / 2 + 0.5) * dy
    xs, ys = np.meshgrid(x, y, indexing="ij")  # (X, Y)
    fov = xs**2 + ys**2 > (size / 2 * dx) ** 2
    height = slices * dz
    # the patient: per-volume shape, position and organ placement
    ax0, ay0 = rng.uniform(135, 165), rng.uniform(95, 120)
    cx0, cy0 = rng.uniform(-12, 12), rng.uniform(-5, 15)
    lung_top = rng.uniform(0.45, 0.6) * height
    liver_x, kidney_z = rng.uniform(-70, -50), rng.uniform(0.18, 0.3) * height
    vessels = [(rng.uniform(-0.8, 0.8), rng.uniform(-0.7, 0.7), rng.uniform(2, 5))
               for _ in range(int(rng.integers(8, 16)))]
    gas = [(rng.uniform(-80, 80), rng.uniform(-40, 60), rng.uniform(0, 0.4) * height, rng.uniform(6, 18))
           for _ in range(int(rng.integers(4, 10)))]
    out = np.empty((size, size, slices), dtype=np.int16, order="F")
    for k in range(slices):
        z = (k + 0.5) * dz
        t = z / height
        ax = ax0 * (1 + 0.06 * np.sin(2 * np.pi * t) - 0.08 * t)
        ay = ay0 * (1 + 0.05 * np.cos(3 * np.pi * t))
        cx, cy = cx0, cy0
        hu = np.full((size, size), -1000.0, dtype=np.float32)
        hu[(ys < cy - ay - 12) & (ys > cy - ay - 22) & (np.abs(xs - cx) < 230)] = 150.0  # the table
        body = _ellipse(xs, ys, cx, cy, ax, ay)
        hu[body <= 1.0] = -100.0  # subcutaneous fat
        hu[_ellipse(xs, ys, cx, cy, ax - 14, ay - 12) <= 1.0] = 45.0  # muscle and organs
        spine_y = cy - ay + 45
        if t > 0.45:  # ribs: a broken ring inside the muscle wall
            ring = _ellipse(xs, ys, cx, cy, ax - 20, ay - 16)
            angle = np.arctan2(ys - cy, xs - cx)
            hu[(ring > 0.86) & (ring <= 1.0) & (np.sin(8 * angle + z / 9) > 0.2)] = 650.0
        if t > 0.4 and z > lung_top * 0.85:  # lungs grow towards the top
            grow = min(1.0, (z - lung_top * 0.85) / 40)
            for side in (-1.0, 1.0):
                lx, lay = cx + side * 0.45 * ax, 0.6 * ay * grow
                lung = _ellipse(xs, ys, lx, cy + 5, 0.3 * ax, max(lay, 1.0)) <= 1.0
                hu[lung] = -860.0
                for vx, vy, r in vessels:
                    vessel = _ellipse(xs, ys, lx + vx * 0.25 * ax, cy + 5 + vy * lay, r, r) <= 1.0
                    hu[lung & vessel] = 40.0
            if t > 0.6:  # heart, between the lungs, anterior
                hu[_ellipse(xs, ys, cx + 15, cy + 25, 55 * (1 - abs(t - 0.75)), 45) <= 1.0] = 50.0
        if 0.28 < t < 0.62:  # liver, on the patient's right
            scale = np.sin(np.pi * (t - 0.28) / 0.34)
            hu[_ellipse(xs, ys, cx + liver_x, cy + 5, 75 * scale + 1, 60 * scale + 1) <= 1.0] = 62.0
        if abs(z - kidney_z) < 55:  # kidneys, beside the spine
            r = np.sqrt(1 - ((z - kidney_z) / 55) ** 2)
            for side in (-1.0, 1.0):
                hu[_ellipse(xs, ys, cx + side * 60, spine_y + 15, 28 * r + 1, 40 * r + 1) <= 1.0] = 32.0
        if t < 0.4:
            for gx, gy, gz, r in gas:  # bowel gas: small bubbles
                if abs(z - gz) < r:
                    rr = np.sqrt(r * r - (z - gz) ** 2)
                    hu[_ellipse(xs, ys, cx + gx, cy + gy, rr, rr) <= 1.0] = -900.0
        if t < 0.15:  # pelvis: two iliac wings
            for side in (-1.0, 1.0):
                wing = _ellipse(xs, ys, cx + side * 0.55 * ax, cy - 10, 35, 55)
                hu[(wing > 0.6) & (wing <= 1.0)] = 550.0
        disc = (z % 30) < 6  # vertebral body, cortex, canal; a disc every 30 mm
        vertebra = _ellipse(xs, ys, cx, spine_y, 20, 17)
        hu[vertebra <= 1.0] = 90.0 if disc else 300.0
        if not disc:
            hu[(vertebra > 0.75) & (vertebra <= 1.0)] = 800.0
        hu[_ellipse(xs, ys, cx, spine_y - 27, 8, 7) <= 1.0] = 20.0
        hu[_ellipse(xs, ys, cx + 25, spine_y + 30, 12, 12) <= 1.0] = 180.0  # aorta, with contrast
        hu += rng.standard_normal((size, size), dtype=np.float32) * 12.0
        hu[fov] = -1024.0  # outside the reconstruction circle
        out[:, :, k] = np.clip(np.rint(hu), -1024, 3071)
    return out


def write_volume(path: Path, seed: int, index: int, size: int, slices: int) -> int:
    """Write one ``.nii.gz`` (gzip level 6, mtime 0: the same bytes every time); its size in bytes."""
    import nibabel as nib

    volume = render_ct_volume(seed, index, size, slices)
    affine = np.diag([-SPACING[0], SPACING[1], SPACING[2], 1.0])  # LAS: x to the left, y anterior, z superior
    affine[:3, 3] = [size / 2 * SPACING[0], -size / 2 * SPACING[1], -400.0 + 3.0 * index]
    image = nib.Nifti1Image(volume, affine)
    image.header.set_xyzt_units("mm", "sec")
    image.header.set_qform(affine, code=1)
    image.header.set_sform(affine, code=1)
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as fh:
        fh.write(image.to_bytes())
    partial.rename(path)
    return path.stat().st_size


def ensure_data(root: Path, volumes: int, size: int, slices: int, seed: int) -> dict[str, Any]:
    """The raw volumes under ``root/raw`` (rewritten when ``stamp.json`` does not match)."""
    stamp = root / "stamp.json"
    want = {"volumes": volumes, "size": size, "slices": slices, "seed": seed, "spacing": list(SPACING), "v": 1}
    if stamp.is_file() and json.loads(stamp.read_text()).get("want") == want:
        return dict(json.loads(stamp.read_text()), written_s=0.0)
    shutil.rmtree(root / "raw", ignore_errors=True)
    (root / "raw").mkdir(parents=True)
    start = time.perf_counter()
    paths = [root / "raw" / f"ct{i:03d}.nii.gz" for i in range(volumes)]
    with ProcessPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        sizes = list(pool.map(write_volume, paths, [seed] * volumes, range(volumes), [size] * volumes,
                              [slices] * volumes))
    record = {"want": want, "gz_bytes": sum(sizes), "decoded_bytes": volumes * size * size * slices * 2}
    stamp.write_text(json.dumps(record))
    return dict(record, written_s=time.perf_counter() - start)


# ---------------------------------------------------------------- children (MONAI's venv: stdlib + numpy)


def child_monai(files: list[str], out: Path, threads: int) -> dict[str, Any]:
    """MONAI's chain over ``files``, each result written as uint8 .npy under ``out``."""
    import torch
    from monai.transforms import (
        Compose,
        EnsureChannelFirstd,
        LoadImaged,
        Orientationd,
        ScaleIntensityRanged,
        Spacingd,
    )

    torch.set_num_threads(threads)
    chain = Compose([
        LoadImaged(keys="image"),
        EnsureChannelFirstd(keys="image"),
        Orientationd(keys="image", axcodes="LPS"),
        Spacingd(keys="image", pixdim=1.5, mode="bilinear"),
        ScaleIntensityRanged(keys="image", a_min=WINDOW[0] - WINDOW[1] / 2, a_max=WINDOW[0] + WINDOW[1] / 2,
                             b_min=0.0, b_max=1.0, clip=True),
    ])
    out.mkdir(parents=True, exist_ok=True)
    start, shapes = time.perf_counter(), []
    for path in files:
        image = chain({"image": path})["image"]
        array = np.rint(image.numpy() * 255).astype(np.uint8)
        np.save(out / (Path(path).name.split(".")[0] + ".npy"), array)
        shapes.append(list(array.shape))
    import monai

    return {"seconds": time.perf_counter() - start, "shapes": shapes[:1], "monai": monai.__version__,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def child_baseline(kind: str) -> dict[str, Any]:
    """The imports of a run and nothing decoded: its RSS is the floor under the peak."""
    if kind == "monai":
        import monai.transforms  # noqa: F401
        import nibabel  # noqa: F401
        import torch  # noqa: F401
    else:  # what a packer worker holds before its first volume
        import distributed  # noqa: F401

        import packer.cli  # noqa: F401
        import packer.pipeline.build  # noqa: F401
        import packer.read.nifti_kind  # noqa: F401
    return {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ---------------------------------------------------------------- measuring one run


def cpu_ticks() -> tuple[float, float]:
    """Seconds of (busy, steal) CPU time of the whole machine so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


class TreePeaks:
    """``VmHWM`` of every process under ``root_pid`` (itself included), polled."""

    def __init__(self, root_pid: int, interval: float = 0.1) -> None:
        self.root_pid, self.interval = root_pid, interval
        self.peaks: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> TreePeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.root_pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = []
            for proc in tree:
                try:
                    status = Path(f"/proc/{proc.pid}/status").read_text()
                    if proc.pid not in self.names:
                        self.names[proc.pid] = " ".join(proc.cmdline())[:160]
                except (psutil.Error, OSError):
                    continue
                hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
                if hwm:
                    self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), int(hwm.group(1)) * 1024)
            self._stop.wait(self.interval)


def run_measured(commands: list[list[str]], cores: list[set[int] | None], env: dict[str, str] | None = None
                 ) -> dict[str, Any]:
    """Run ``commands`` at once (each pinned to its ``cores``), wait for all; wall, CPU, RSS, output."""
    busy0, steal0 = cpu_ticks()
    start = time.perf_counter()
    children, peaks = [], []
    for command, pin in zip(commands, cores, strict=True):
        def pin_to(pin: set[int] | None = pin) -> None:
            if pin is not None:
                os.sched_setaffinity(0, pin)

        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 preexec_fn=pin_to, env=env)
        children.append(child)
        peaks.append(TreePeaks(child.pid).__enter__())
    outputs, cpu, maxrss = [], 0.0, 0
    for child, peak in zip(children, peaks, strict=True):
        assert child.stdout is not None
        outputs.append(child.stdout.read())
        _, status, usage = os.wait4(child.pid, 0)
        peak.__exit__()
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            raise RuntimeError(f"{' '.join(child.args)} exited {child.returncode}:\n{outputs[-1][-3000:]}")
        cpu += usage.ru_utime + usage.ru_stime
        maxrss = max(maxrss, usage.ru_maxrss * 1024)
    wall = time.perf_counter() - start
    busy1, steal1 = cpu_ticks()
    processes = [{"pid": pid, "peak": rss, "cmd": p.names.get(pid, "?"), "root": pid == p.root_pid}
                 for p in peaks for pid, rss in p.peaks.items()]
    return {"wall_s": wall, "cpu_s": cpu, "other_cpu_cores": max(0.0, (busy1 - busy0) - cpu) / wall,
            "steal_pct": 100 * (steal1 - steal0) / wall / len(os.sched_getaffinity(0)),
            "tree_maxrss": maxrss, "processes": processes, "outputs": outputs}


def last_json(text: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    return found


# ---------------------------------------------------------------- the cases

JOB = """name: nifti-bench
sources: [{{kind: nifti, root: raw, label: none}}]
split: {{by: entity, ratios: {{train: 0.8, valid: 0.1, test: 0.1}}, seed: 1}}
transform:
  nifti:
    windows: [{{center: {center:g}, width: {width:g}}}]
    sample: {{volume: {{spacing: [1.5, 1.5, 1.5]}}}}
    output: uint8
pack: {{format: webdataset}}
output: {out}
"""


def stage_table(text: str) -> dict[str, float]:
    """packer's 'time by stage' lines: stage → seconds (summed over tasks)."""
    stages: dict[str, float] = {}
    inside = False
    for line in text.splitlines():
        if "time by stage" in line:
            inside = True
            continue
        match = re.match(r"^\s{4}(\S.*?)\s+([\d.]+)s\s+[\d.]+%$", line) if inside else None
        if match:
            stages[match.group(1).strip()] = float(match.group(2))
        elif inside and line.strip():
            inside = False
    return stages


def packer_env(code: Path | None) -> dict[str, str] | None:
    """The environment of packer's runs: ``code``'s ``packer/`` first on the path (another commit,
    checked out with ``git worktree add``), or None for this tree's."""
    if code is None:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}


def run_packer(data: Path, case: str, core: int, code: Path | None) -> dict[str, Any]:
    job = data / "job.yaml"
    job.write_text(JOB.format(center=WINDOW[0], width=WINDOW[1], out=data / "out" / case))
    shutil.rmtree(data / "out" / case, ignore_errors=True)
    shutil.rmtree(data / "cache", ignore_errors=True)
    command = [str(REPO / ".venv" / "bin" / "packer"), "build", str(job), "--fresh", "--no-report", "--quiet",
               "--cache-dir", str(data / "cache")]
    if case == "sync":
        command += ["--scheduler", "sync"]
        run = run_measured([command], [{core}], env=packer_env(code))
    else:
        command += ["--workers", "2"]
        run = run_measured([command], [None], env=packer_env(code))
    text = run.pop("outputs")[0]
    if "bad samples: 0 of" not in text:
        raise RuntimeError(f"packer build reported bad samples or failed:\n{text[-3000:]}")
    workers = [p for p in run["processes"] if not p["root"] and "resource_tracker" not in p["cmd"]]
    client = [p for p in run["processes"] if p["root"]]
    deciding = client if case == "sync" else workers
    found = re.search(r"dataset_hash (\w+)", text)
    run.update(stages=stage_table(text), cores=1 if case == "sync" else 2, dataset_hash=found and found.group(1),
               worker_peak=max((p["peak"] for p in deciding), default=run["tree_maxrss"]),
               client_peak=max((p["peak"] for p in client), default=0),
               workers_seen=len(deciding))
    shutil.rmtree(data / "cache", ignore_errors=True)
    return run


def run_monai(data: Path, case: str, core: int, python: Path, files: list[str]) -> dict[str, Any]:
    out = data / "out" / case
    shutil.rmtree(out, ignore_errors=True)
    groups = [files] if case == "monai" else [files[0::2], files[1::2]]
    pins: list[set[int] | None] = [{core}] if case == "monai" else [{c} for c in sorted(os.sched_getaffinity(0))[:2]]
    commands = [[str(python), __file__, "--child", "monai", "--out", str(out), *group] for group in groups]
    run = run_measured(commands, pins)
    children = [last_json(text) for text in run.pop("outputs")]
    run.update(cores=len(groups), worker_peak=max(p["peak"] for p in run["processes"]), children=children,
               workers_seen=len(groups))
    return run


def agreement(data: Path, files: list[str]) -> dict[str, Any] | None:
    """packer's volume of the first file (sync build) against MONAI's, on their common voxels:
    MONAI's C×L×P×S array transposed to packer's C×S×P×L (both LPS). The grids differ by a
    fraction of a voxel (packer centres the new grid on the old extent, MONAI keeps the first
    voxel's centre) and the windows by a hair (packer's DICOM LINEAR: (x - (c - 0.5)) / (w - 1)),
    so this says the two do the same work, not that they agree bit for bit."""
    import tarfile

    import pyarrow.parquet as pq

    name = Path(files[0]).name
    theirs_path = data / "out" / "monai" / (name.split(".")[0] + ".npy")
    versions = sorted((data / "out" / "sync").glob("*/*/_index.parquet"))
    if not theirs_path.is_file() or not versions:
        return None
    rows = [r for r in pq.read_table(versions[0]).to_pylist() if r["entity_id"] == name]
    with tarfile.open(versions[0].parent / rows[0]["shard"]) as tar:
        member = tar.extractfile(f"{rows[0]['key']}.npy")
        assert member is not None
        ours = np.load(io.BytesIO(member.read()))
    theirs = np.load(theirs_path).transpose(0, 3, 2, 1)
    common = tuple(slice(0, min(a, b)) for a, b in zip(ours.shape, theirs.shape, strict=True))
    diff = np.abs(ours[common].astype(np.int16) - theirs[common].astype(np.int16))
    return {"file": name, "packer_shape": list(ours.shape), "monai_shape": list(theirs.shape),
            "mean_abs": float(diff.mean()), "p99_abs": float(np.percentile(diff, 99)),
            "within_2": float((diff <= 2).mean())}


def baseline(kind: str, python: Path, env: dict[str, str] | None = None) -> int:
    done = subprocess.run([str(python), __file__, "--child", "baseline-" + kind], capture_output=True, text=True,
                          check=True, cwd=REPO, env=env)
    return int(last_json(done.stdout)["rss"])


# ---------------------------------------------------------------- report


def mib(n: float) -> str:
    return f"{n / MIB:,.0f}"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def report(args: argparse.Namespace, data: dict[str, Any], runs: dict[str, dict[str, Any]],
           floors: dict[str, int], machine: dict[str, Any], code: dict[str, Any], load: str,
           agree: dict[str, Any] | None) -> tuple[str, dict]:
    n = args.volumes
    volume_bytes = args.size * args.size * args.slices * 2
    names = {"sync": "packer `--scheduler sync`, 1 core", "workers2": "packer `--workers 2`, 2 cores",
             "monai": "MONAI, 1 process, 1 core", "monai2": "MONAI, 2 processes, 2 cores"}
    rows = ["| case | wall s | CPU s | volumes/s | volumes/s per core | volumes per CPU s | peak RSS per worker MiB "
            "| baseline MiB | peak − baseline MiB | × int16 volume | × float32 volume | other procs (cores) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary: dict[str, dict[str, float]] = {}
    for case in CASES:
        if case not in runs:
            continue
        r = runs[case]
        rate = n / r["wall_s"]
        floor = floors["monai" if case.startswith("monai") else "packer"]
        summary[case] = {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "rate": rate, "per_core": rate / r["cores"],
                         "per_cpu_s": n / r["cpu_s"], "worker_peak": r["worker_peak"], "baseline": floor}
        rows.append(f"| {names[case]} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {rate:.3f} | {rate / r['cores']:.3f} "
                    f"| {n / r['cpu_s']:.3f} | {mib(r['worker_peak'])} | {mib(floor)} "
                    f"| {mib(r['worker_peak'] - floor)} | {r['worker_peak'] / volume_bytes:.2f} "
                    f"| {r['worker_peak'] / (2 * volume_bytes):.2f} | {r['other_cpu_cores']:.2f} |")
    lines = [f"{n} CT-like volumes {args.size}×{args.size}×{args.slices} int16 (0.7×0.7×1.25 mm, LAS, gzip 6: "
             f"{data['gz_bytes'] / 1e6:,.0f} MB on disk, {data['decoded_bytes'] / MIB:,.0f} MiB decoded) → 3-D "
             "samples at 1.5 mm isotropic, window 40/400, uint8. Each case is one run in a fresh process "
             "(`benchmarks/nifti_vs_monai.py` docstring says what each covers).", "", *rows, ""]
    targets: dict[str, Any] = {}
    pairs = [("sync", "monai", "1 core: packer sync / MONAI 1 process"),
             ("workers2", "monai2", "2 cores: packer --workers 2 / MONAI 2 processes")]
    target_rows = ["| target | measured | |", "|---|---:|---|"]
    for ours, theirs, text in pairs:
        if ours in summary and theirs in summary:
            ratio = summary[ours]["per_core"] / summary[theirs]["per_core"]
            targets[f"ratio_{ours}_{theirs}"] = ratio
            target_rows.append(f"| volumes/s per core ≥ {TARGET_RATIO}× MONAI, {text} | {ratio:.2f}× "
                               f"| {verdict(ratio >= TARGET_RATIO)} |")
    for case in ("sync", "workers2"):
        if case in summary:
            peak = summary[case]["worker_peak"]
            for label, unit in (("int16", volume_bytes), ("float32", 2 * volume_bytes)):
                ok = peak <= TARGET_RSS_VOLUMES * unit
                targets[f"rss_{case}_{label}"] = peak / unit
                target_rows.append(f"| peak RSS per worker ≤ {TARGET_RSS_VOLUMES:g}× one decoded volume "
                                   f"({label}: ≤ {mib(TARGET_RSS_VOLUMES * unit)} MiB), {names[case]} "
                                   f"| {mib(peak)} MiB ({peak / unit:.2f}×) | {verdict(ok)} |")
    lines += target_rows
    stages = runs.get("sync", {}).get("stages") or {}
    if stages:
        lines += ["", "packer's stage clock, `--scheduler sync` (seconds summed over tasks; what `packer build` "
                      "prints):", "", "| stage | s | per volume s |", "|---|---:|---:|"]
        lines += [f"| {k} | {v:.2f} | {v / n:.3f} |" for k, v in sorted(stages.items(), key=lambda kv: -kv[1])]
    monai_meta = next((r["children"][0] for c, r in runs.items() if c.startswith("monai")), None)
    versions = f"MONAI {monai_meta['monai']}, torch {monai_meta['torch']}" if monai_meta else "MONAI not run"
    lines.append("")
    hashes = {runs[c]["dataset_hash"] for c in ("sync", "workers2") if c in runs}
    if hashes:
        lines.append(f"- packer's dataset_hash: {', '.join(sorted(h[:16] for h in hashes if h))} (the shards' bytes, "
                     "whatever the worker count).")
    if agree is not None:
        lines.append(f"- Same work: {agree['file']} as packer makes it ({'×'.join(map(str, agree['packer_shape']))}, "
                     f"C×D×H×W) and as MONAI does ({'×'.join(map(str, agree['monai_shape']))} transposed to C×S×P×L), "
                     f"uint8 on their common voxels: mean |Δ| {agree['mean_abs']:.2f} grey levels, 99th percentile "
                     f"{agree['p99_abs']:.0f}, {100 * agree['within_2']:.1f}% within 2 (the grids differ by a fraction "
                     "of a voxel: packer centres the new grid on the old extent, MONAI keeps the first voxel's centre; "
                     "packer's window is DICOM's LINEAR).")
    lines += [
        "- Per core: the pinned single-process cases use one core (volumes/s); the two-process cases divide by 2. "
        "CPU s is user + system of the whole process tree (`wait4`). Peak RSS per worker: the largest `VmHWM` of "
        "the processes that decode (the sync process; the largest dask worker; the largest MONAI process), "
        "polled every 0.1 s. Baseline: the same interpreter and imports with nothing decoded. One decoded volume: "
        f"{mib(volume_bytes)} MiB as stored (int16), {mib(2 * volume_bytes)} MiB as float32.",
        f"- Machine: {machine_text(machine)}; {versions}. Date: {machine['date']}. Code: commit {code['commit']}"
        + (f" plus uncommitted changes to {len(code['uncommitted'])} file(s)" if code["uncommitted"] else "")
        + f". Load: {load}.",
        f"- Command: `.venv/bin/python benchmarks/nifti_vs_monai.py{args.command_suffix}` "
        f"(data under {args.data}; MONAI from `{args.monai_python}`).",
    ]
    record = {"benchmark": "nifti_vs_monai", "machine": machine, "code": code, "data": data, "floors": floors,
              "summary": summary, "targets": targets, "agreement": agree,
              "runs": {c: {k: v for k, v in r.items()} for c, r in runs.items()}}
    return "\n".join(lines), record


def code_state_of(folder: Path) -> dict[str, Any]:
    """The commit of another checkout and its uncommitted packer/ and schemas/ paths."""
    def git(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=folder, capture_output=True, text=True, check=False).stdout

    changed = [line[3:] for line in git("status", "--porcelain", "--", "packer", "schemas").splitlines() if line]
    return {"commit": git("rev-parse", "--short=12", "HEAD").strip(), "uncommitted": changed, "path": str(folder)}


def machine_text(machine: dict[str, Any]) -> str:
    return (f"{machine['nproc']} cores (nproc), CPU {machine['cpu']}, RAM {machine['ram_gib']} GiB, Python "
            f"{machine['python']}, numpy {machine['numpy']}, OpenCV {machine['opencv']}, nibabel {machine['nibabel']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volumes", type=int, default=20, help="volumes (default 20)")
    parser.add_argument("--size", type=int, default=512, help="in-plane size X = Y (default 512)")
    parser.add_argument("--slices", type=int, default=200, help="slices Z (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)} (default all)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"data folder (default {DEFAULT_DATA})")
    parser.add_argument("--monai-python", type=Path, default=DEFAULT_MONAI_PYTHON,
                        help=f"the Python of MONAI's venv (default {DEFAULT_MONAI_PYTHON})")
    parser.add_argument("--code", type=Path, help="measure the packer/ of this checkout instead of this tree's "
                        "(e.g. a `git worktree add` of an older commit; implies --no-write)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "monai":
        print(json.dumps(child_monai(args.files, args.out, threads=1)))
        return
    if args.child and args.child.startswith("baseline-"):
        print(json.dumps(child_baseline(args.child.split("-", 1)[1])))
        return
    import decode  # benchmarks/decode.py: machine, code state, the section writer

    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; choose from {list(CASES)}")
    have_monai = args.monai_python.exists()
    if not have_monai:
        print(f"no MONAI venv at {args.monai_python}: MONAI cases skipped (see the docstring)", file=sys.stderr)
        cases = [c for c in cases if not c.startswith("monai")]
    args.no_write = (args.no_write or args.code is not None or args.volumes != 20
                     or (args.size, args.slices) != (512, 200) or set(cases) != set(CASES))
    args.command_suffix = " ".join([""] + sys.argv[1:])
    started = time.perf_counter()
    data = ensure_data(args.data, args.volumes, args.size, args.slices, args.seed)
    if data["written_s"]:
        print(f"wrote {args.volumes} volumes in {data['written_s']:.0f} s", file=sys.stderr)
    files = sorted(str(p) for p in (args.data / "raw").glob("*.nii.gz"))
    core = max(os.sched_getaffinity(0))  # away from core 0, where interrupts tend to land
    load_before = os.getloadavg()
    floors = {"packer": baseline("packer", REPO / ".venv" / "bin" / "python", packer_env(args.code))}
    if have_monai:
        floors["monai"] = baseline("monai", args.monai_python)
    runs: dict[str, dict[str, Any]] = {}
    for case in cases:
        runs[case] = (run_packer(args.data, case, core, args.code) if not case.startswith("monai")
                      else run_monai(args.data, case, core, args.monai_python, files))
        r = runs[case]
        print(f"{case}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, peak RSS per worker "
              f"{mib(r['worker_peak'])} MiB, other processes {r['other_cpu_cores']:.2f} cores",
              file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    machine = decode.describe_machine()
    import nibabel

    machine["nibabel"] = nibabel.__version__
    code = decode.code_state() if args.code is None else code_state_of(args.code)
    load = (f"1-minute load {load_before[0]:.2f} before, {load_after[0]:.2f} after; CPU steal "
            + ", ".join(f"{c} {runs[c]['steal_pct']:.1f}%" for c in runs))
    agree = agreement(args.data, files) if {"sync", "monai"} <= set(runs) else None
    body, record = report(args, data, runs, floors, machine, code, load, agree)
    decode.publish_run(SECTION, body, started, record=record, write=not args.no_write)


if __name__ == "__main__":
    main()
