"""Benchmark `sample: volume` against the straightforward loop and MONAI, on the same series.

    .venv/bin/python benchmarks/volumes.py                       # 8 series × 96 slices × 256²
    .venv/bin/python benchmarks/volumes.py --series 20 --slices 200 --size 512 --rounds 1   # the issue's size

Data (written once under ``--data`` with ``packer.demo`` phantoms): ``--series`` CT series of
``--slices`` slices of ``--size``² int16, 2.5 mm apart, a 350 mm field of view (pixels of
350/``--size`` mm: 1.37 at 256, 0.68 at 512), file names and Instance Numbers shuffled. Every
contender makes the same volume per series: one window (lung, -600/1500), resampled to
1 × 1 × 1 mm with linear interpolation, uint8.

- **packer**: ``packer build`` of a job with ``sample: {volume: {spacing: [1, 1, 1]}}`` in a
  fresh process with ``--workers 1`` and a fresh cache (so per core), everything on: header
  pass, series checks, decode, window, canonical orientation, resample, near-copy signatures,
  hashes, split, audit, shards, manifest (no HTML report). Wall time; CPU and peak RSS of the
  build's process tree (``wait4``: the client and its worker, the largest of them).
- **reference loop**: one process: per series ``pydicom.dcmread`` every file, sort by Image
  Position projected on the normal, stack the rescaled values, window (PS3.3 LINEAR), resample
  with the same centre-aligned separable linear interpolation written the straightforward
  numpy way (:func:`linear_axis`, the definition packer's faster version is tested against),
  quantise. No validation, no hashing, nothing written.
- **MONAI** (when installed; not a packer dependency): ``LoadImage(reader="PydicomReader")`` of
  the series folder, ``Spacing(pixdim=(1, 1, 1), mode="bilinear")``,
  ``ScaleIntensityRange(-1350, 150, 0, 1, clip=True)``, then to uint8. MONAI orders slices by
  Instance Number (its documented behaviour), which here is shuffled, so its volumes are
  scrambled: its speed is measured, not its output.

Every run is a fresh process, so its peak RSS (``ru_maxrss``) is its own; packer's is the
largest of its processes (client or worker). Rounds are interleaved (packer, reference, MONAI
per round); medians of ``--rounds``. Prints a table and one JSON line; ``--write`` appends the
section to ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_data(root: Path, series: int, slices: int, size: int) -> None:
    from packer.demo import make_uids, render_ct_phantom, seeded_rng, write_ct_slice

    stamp = root / "stamp.json"
    want = {"series": series, "slices": slices, "size": size}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return
    shutil.rmtree(root, ignore_errors=True)
    for s in range(series):
        patient = f"VOL{s:03d}"
        rng = seeded_rng(0, "bench-volume", s)
        numbers = rng.permutation(slices) + 1
        for k in range(slices):
            hu = render_ct_phantom(seeded_rng(0, "bench-slice", s, k), size=size, z=-1 + 2 * k / slices,
                                   anatomy=seeded_rng(0, "bench-anatomy", s))
            write_ct_slice(root / "raw" / patient / f"{int(rng.integers(0, 2**32)):08x}.dcm", patient_id=patient,
                           study_date="20240101", pixels_hu=hu, uids=make_uids(0, patient, k, study=1),
                           instance_number=int(numbers[k]), slice_location_mm=2.5 * k)
    stamp.write_text(json.dumps(want))


JOB = """name: volumes
sources: [{kind: dicom, root: raw, label: none}]
split: {by: entity, ratios: {train: 0.8, valid: 0.1, test: 0.1}, seed: 1, balance: {accept: true}}
transform:
  dicom:
    windows: [lung]
    sample: {volume: {spacing: [1, 1, 1]}}
    series: {min_slices: 3}
pack: {format: webdataset}
output: out
phi: {mode: keep}
limits: {max_voxels: 2000000000}
"""


def run_packer(root: Path) -> dict[str, float]:
    (root / "job.yaml").write_text(JOB)
    for folder in ("out", "cache"):
        shutil.rmtree(root / folder, ignore_errors=True)
    start = time.perf_counter()
    child = subprocess.Popen([str(REPO / ".venv" / "bin" / "packer"), "build", str(root / "job.yaml"), "--workers",
                              "1", "--cache-dir", str(root / "cache"), "--no-report", "--quiet"])
    _, status, usage = os.wait4(child.pid, 0)  # this build's own usage: its process tree, waited for
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"packer build exited {child.returncode}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def linear_axis(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Centre-aligned linear resampling along ``axis`` to ``size``, the straightforward numpy way."""
    n = array.shape[axis]
    x = np.clip((np.arange(size) + 0.5) * (n / size) - 0.5, 0, n - 1)
    low = np.floor(x).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    shape = [1] * array.ndim
    shape[axis] = size
    weight = (x - low).astype(np.float32).reshape(shape)
    return np.take(array, low, axis=axis) * (1 - weight) + np.take(array, high, axis=axis) * weight


def reference_volume(folder: Path) -> np.ndarray:
    import pydicom

    files = [pydicom.dcmread(p) for p in folder.iterdir()]
    iop = np.array(files[0].ImageOrientationPatient, dtype=float)
    normal = np.cross(iop[:3], iop[3:])
    files.sort(key=lambda ds: float(np.dot(normal, np.array(ds.ImagePositionPatient, dtype=float))))
    hu = np.stack([ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept) for ds in files])
    centre, width = -600.0, 1500.0
    windowed = np.clip((hu - (centre - 0.5)) / (width - 1) + 0.5, 0, 1) * 255
    first, last = (np.array(files[i].ImagePositionPatient, dtype=float) for i in (0, -1))
    spacing = (float(np.linalg.norm(last - first)) / (len(files) - 1), *(float(v) for v in files[0].PixelSpacing))
    volume = windowed.astype(np.float32)
    for axis, step in enumerate(spacing):  # to 1 mm: same extent, round(n · step / 1) voxels
        volume = linear_axis(volume, axis, max(1, round(volume.shape[axis] * step)))
    return np.rint(volume).astype(np.uint8)


def in_process(name: str, root: Path) -> dict[str, float] | None:
    """``run_<name>`` in a fresh process (its own peak RSS); None where it cannot run."""
    done = subprocess.run([sys.executable, __file__, "--one", name, "--data", str(root)], check=True,
                          capture_output=True, text=True)
    found: dict[str, float] | None = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def run_reference(root: Path) -> dict[str, float]:
    start, cpu = time.perf_counter(), time.process_time()
    for folder in sorted((root / "raw").iterdir()):
        reference_volume(folder)
    return {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_monai(root: Path) -> dict[str, float] | None:
    try:
        from monai.transforms import Compose, EnsureChannelFirst, LoadImage, ScaleIntensityRange, Spacing
    except ImportError:
        return None
    chain = Compose([LoadImage(reader="PydicomReader", image_only=True), EnsureChannelFirst(),
                     Spacing(pixdim=(1.0, 1.0, 1.0), mode="bilinear"),
                     ScaleIntensityRange(a_min=-1350, a_max=150, b_min=0.0, b_max=1.0, clip=True)])
    start, cpu = time.perf_counter(), time.process_time()
    for folder in sorted((root / "raw").iterdir()):
        volume = chain(str(folder))
        np.rint(np.asarray(volume) * 255).astype(np.uint8)
    return {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    return f"{cpu}, {os.cpu_count()} cores, {memory} GiB, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("/tmp/packer-bench-volumes"))
    parser.add_argument("--series", type=int, default=8)
    parser.add_argument("--slices", type=int, default=96)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="append the section to benchmarks/RESULTS.md")
    parser.add_argument("--one", choices=["reference", "monai"], help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_reference(args.data) if args.one == "reference" else run_monai(args.data)))
        return
    write_data(args.data, args.series, args.slices, args.size)
    runs: dict[str, list[dict[str, float]]] = {"packer": [], "reference": [], "monai": []}
    for _ in range(args.rounds):
        runs["packer"].append(run_packer(args.data))
        reference = in_process("reference", args.data)
        if reference is not None:
            runs["reference"].append(reference)
        monai = in_process("monai", args.data)
        if monai is not None:
            runs["monai"].append(monai)
    table = {}
    for name, found in runs.items():
        if not found:
            continue
        wall = statistics.median(r["wall"] for r in found)
        table[name] = {"series_per_s": round(args.series / wall, 3), "wall_s": round(wall, 2),
                       "cpu_s": round(statistics.median(r["cpu"] for r in found), 2),
                       "peak_rss_mb": round(max(r["rss_mb"] for r in found))}
    ratio = table["packer"]["series_per_s"] / table["reference"]["series_per_s"]
    lines = ["| | series/s | wall s | CPU s | peak RSS MB |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {v['series_per_s']} | {v['wall_s']} | {v['cpu_s']} | {v['peak_rss_mb']} |"
              for name, v in table.items()]
    text = "\n".join(lines)
    print(text)
    print(f"packer / reference loop: {ratio:.2f}×")
    print(json.dumps({"machine": machine(), "data": vars(args) | {"data": str(args.data)}, "results": table,
                      "ratio_packer_reference": round(ratio, 3)}))
    if args.write:
        with open(REPO / "benchmarks" / "RESULTS.md", "a", encoding="utf-8") as fh:
            fh.write(f"\n## Volumes: `sample: volume` against the reference loop and MONAI\n\n"
                     f"Machine: {machine()}. Data: {args.series} series × {args.slices} slices × {args.size}², "
                     f"1 window, resampled to 1 mm isotropic; medians of {args.rounds} interleaved rounds; "
                     f"packer with `--workers 1` (per core). Command: `.venv/bin/python benchmarks/volumes.py "
                     f"--series {args.series} --slices {args.slices} --size {args.size} --rounds {args.rounds} "
                     f"--write`.\n\n{text}\n\npacker / reference loop: **{ratio:.2f}×**.\n")


if __name__ == "__main__":
    main()
