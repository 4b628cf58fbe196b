"""Benchmark decode + window throughput per core: packer's readers against the bare decoders.

    .venv/bin/python benchmarks/decode.py            # writes the section of RESULTS.md
    .venv/bin/python benchmarks/decode.py --no-write # print only

One process pinned to one core (``sched_setaffinity``; OpenCV's thread pool set to 1 thread),
files in the page cache (one untimed warm-up pass). Inputs, written once under ``--data``:

- ``--files`` 512×512 int16 CT slices (``packer.demo.write_ct_slice`` of a
  ``render_ct_phantom``, 12 bits stored, rescale -1024/1, Explicit VR Little Endian);
- ``--files`` 1024×768 (width × height) JPEGs (``render_photo``, OpenCV quality 95).

Cases, each timed as ``--repeats`` passes over all files (median reported), round-robin so a
slow spell of a shared machine hits every case alike:

- ``pydicom bare``: ``pydicom.dcmread(path).pixel_array`` (file read + parse + native decode);
- ``read_dicom``: packer's reader with a ``DicomTransformConfig`` of the lung and mediastinum
  presets → uint8 2×512×512 (no resize) or 2×256×256 (``size`` 256×256): parse, checks,
  decode, modality, two windows, uint8, resize;
- ``cv2 bare``: file read + ``cv2.imdecode(..., IMREAD_UNCHANGED)`` (what ``read_image`` calls);
- ``read_image``: packer's reader, rgb → uint8 3×768×1024 or 3×256×256: file read, structure
  checks, decode, constant-image check, BGR→RGB, HWC→CHW, resize.

Prints one table and one JSON line. ``measure_mixed`` is reused by ``benchmarks/pack.py`` for
its decode-only limit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pydicom

from packer.allocator import tune_allocator
from packer.config import DicomTransformConfig, ImageTransformConfig, WindowSpec
from packer.demo import render_ct_phantom, render_photo, seeded_rng, write_ct_slice
from packer.read.dicom import read_dicom
from packer.read.image import read_image
from packer.records import Issue, SampleRef
from packer.transform.window import PRESETS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "RESULTS.md"
SECTION = "## Decode and window throughput"
DEFAULT_DATA = Path("/work/bench-data/decode")
CT_SIZE = 512
JPEG_HW = (768, 1024)
WINDOWS = ("lung", "mediastinum")


# ---------------------------------------------------------------- machine and pinning


def describe_machine() -> dict[str, Any]:
    """nproc, CPU model, RAM, library versions and date, for the record."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.M)
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": model.group(1).strip() if model else platform.processor() or "?",
        "ram_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pydicom": pydicom.__version__,
        "opencv": cv2.__version__,
        "date": dt.date.today().isoformat(),
    }


def machine_line(machine: dict[str, Any]) -> str:
    return (f"{machine['nproc']} cores (nproc), CPU {machine['cpu']}, RAM {machine['ram_gib']} GiB, "
            f"Python {machine['python']}, numpy {machine['numpy']}, pydicom {machine['pydicom']}, "
            f"OpenCV {machine['opencv']}")


def code_state() -> dict[str, Any]:
    """The git commit and the packer/ and schemas/ paths with uncommitted changes (the code measured)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout

    changed = [line[3:] for line in git("status", "--porcelain", "--", "packer", "schemas").splitlines() if line]
    return {"commit": git("rev-parse", "--short=12", "HEAD").strip(), "uncommitted": changed}


def code_line(code: dict[str, Any]) -> str:
    dirty = f" plus uncommitted changes to {len(code['uncommitted'])} packer file(s)" if code["uncommitted"] else ""
    return f"commit {code['commit']}{dirty}"


@contextlib.contextmanager
def one_core() -> Iterator[int]:
    """Pin this process to one core and OpenCV to one thread, restored afterwards; set glibc's
    allocator thresholds as packer's build tasks do."""
    tune_allocator()  # as packer's build tasks run (packer.allocator); it cannot be undone, and need not be
    before = os.sched_getaffinity(0)
    threads = cv2.getNumThreads()
    core = max(before)  # the last core: away from core 0, where interrupts tend to land
    os.sched_setaffinity(0, {core})
    cv2.setNumThreads(1)
    try:
        yield core
    finally:
        cv2.setNumThreads(threads)
        os.sched_setaffinity(0, before)


# ---------------------------------------------------------------- inputs


def write_inputs(folder: Path, files: int) -> tuple[list[Path], list[Path]]:
    """``files`` CT slices and ``files`` JPEGs under ``folder`` (kept when already there)."""
    ct_dir, jpeg_dir = folder / "ct", folder / "jpeg"
    ct_dir.mkdir(parents=True, exist_ok=True)
    jpeg_dir.mkdir(parents=True, exist_ok=True)
    cts, jpegs = [], []
    for i in range(files):
        ct = ct_dir / f"slice{i:04d}.dcm"
        if not ct.exists():
            hu = render_ct_phantom(seeded_rng(0, "ct", i), size=CT_SIZE, z=(i % 21) / 10 - 1, nodule=i % 2 == 1)
            write_ct_slice(ct, patient_id=f"P{i:04d}", study_date="20240101", pixels_hu=hu, instance_number=i + 1)
        jpeg = jpeg_dir / f"photo{i:04d}.jpg"
        if not jpeg.exists():
            bgr = render_photo(seeded_rng(0, "jpeg", i), ("circle", "square")[i % 2], height=JPEG_HW[0],
                               width=JPEG_HW[1])
            if not cv2.imwrite(str(jpeg), bgr, [cv2.IMWRITE_JPEG_QUALITY, 95]):
                raise OSError(f"{jpeg}: OpenCV could not write the JPEG")
        cts.append(ct)
        jpegs.append(jpeg)
    return cts, jpegs


def ref_for(path: Path, kind: str) -> SampleRef:
    return SampleRef(sample_id=path.stem, source=kind, kind=kind, path=str(path), relpath=path.name,
                     label="x", entity=path.stem, time="2024-01-01T00:00:00")


def dicom_config(size: tuple[int, int] | None) -> DicomTransformConfig:
    """The lung and mediastinum presets, as a job file naming them would give."""
    specs = tuple(WindowSpec(kind="preset", name=n, center=float(PRESETS[n].center), width=float(PRESETS[n].width),
                             function=PRESETS[n].function) for n in WINDOWS)
    return DicomTransformConfig(windows=specs, size=size)


# ---------------------------------------------------------------- cases


def bare_dicom(path: Path) -> np.ndarray:
    return pydicom.dcmread(path).pixel_array


def bare_jpeg(path: Path) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(path.read_bytes(), np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise ValueError(f"{path}: cv2.imdecode returned nothing")
    return image


def packer_reader(kind: str, size: tuple[int, int] | None) -> Callable[[Path], Any]:
    """A one-argument call of read_dicom or read_image that raises on an Issue."""
    if kind == "dicom":
        dicom_cfg = dicom_config(size)

        def run(path: Path) -> Any:
            return _samples(read_dicom(ref_for(path, "dicom"), dicom_cfg))
    else:
        image_cfg = ImageTransformConfig(size=size, color="rgb")

        def run(path: Path) -> Any:
            return _samples(read_image(ref_for(path, "image"), image_cfg))
    return run


def _samples(result: Any) -> Any:
    if isinstance(result, Issue):
        raise RuntimeError(f"benchmark input became a bad sample: {result}")
    return result


@dataclass(frozen=True)
class Timing:
    name: str
    files: int
    seconds: tuple[float, ...]  # wall time of each repeat, for all files
    cpu_seconds: tuple[float, ...] = ()  # this process's CPU time of each repeat

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def per_sample_ms(self) -> float:
        return 1e3 * self.median_s / self.files

    @property
    def rate(self) -> float:
        return self.files / self.median_s

    @property
    def spread(self) -> float:
        """(max - min) / median of the per-repeat times: how noisy the machine was."""
        return (max(self.seconds) - min(self.seconds)) / self.median_s


def time_cases(cases: Sequence[tuple[str, Callable[[Path], Any], Sequence[Path]]], repeats: int) -> list[Timing]:
    """Time each case ``repeats`` times, round-robin (pass r of every case, then pass r + 1), so
    that a slow spell of a shared machine lands on every case alike and ratios stay fair."""
    for _, fn, paths in cases:  # warm-up: page cache, lazy imports, decoder plug-in look-ups
        for path in paths:
            fn(path)
    seconds: list[list[float]] = [[] for _ in cases]
    cpu: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, (_, fn, paths) in enumerate(cases):
            start, start_cpu = time.perf_counter(), time.process_time()
            for path in paths:
                fn(path)
            seconds[i].append(time.perf_counter() - start)
            cpu[i].append(time.process_time() - start_cpu)
    return [Timing(name, len(paths), tuple(seconds[i]), tuple(cpu[i])) for i, (name, _, paths) in enumerate(cases)]


def output_shape(fn: Callable[[Path], Any], path: Path) -> str:
    out = fn(path)
    array = out[0].image if isinstance(out, list) else out
    return f"{array.dtype} {'×'.join(map(str, array.shape))}"


def measure_mixed(dicom_paths: Sequence[Path], jpeg_paths: Sequence[Path], dicom_cfg: DicomTransformConfig,
                  dicom_share: float, repeats: int = 5,
                  image_cfg: ImageTransformConfig | None = None) -> dict[str, float]:
    """The decode-only limit of a mixed data set, per core: packer's ``read_dicom`` (decode,
    modality, windows, resize) per CT file and bare ``cv2.imdecode`` per JPEG, combined as
    ``rate = 1 / (share × t_dicom + (1 - share) × t_jpeg)`` samples/s (``cpu_rate`` from CPU
    time). With ``image_cfg``, also ``readers_rate``: the same mix with packer's ``read_image``
    for the JPEGs, i.e. packer's two readers alone, without the rest of the pipeline."""
    def mix(dicom_s: float, jpeg_s: float) -> float:
        return 1.0 / (dicom_share * dicom_s / len(dicom_paths) + (1 - dicom_share) * jpeg_s / len(jpeg_paths))

    cases: list[tuple[str, Callable[[Path], Any], Sequence[Path]]] = [
        ("read_dicom", lambda p: _samples(read_dicom(ref_for(p, "dicom"), dicom_cfg)), dicom_paths),
        ("cv2.imdecode", bare_jpeg, jpeg_paths)]
    if image_cfg is not None:
        cases.append(("read_image", lambda p: _samples(read_image(ref_for(p, "image"), image_cfg)), jpeg_paths))
    with one_core():
        dicom, jpeg, *rest = time_cases(cases, repeats)
    reader = rest[0] if rest else None
    out = {"dicom_ms": dicom.per_sample_ms, "jpeg_ms": jpeg.per_sample_ms, "dicom_share": dicom_share,
           "rate": mix(dicom.median_s, jpeg.median_s),
           "cpu_rate": mix(statistics.median(dicom.cpu_seconds), statistics.median(jpeg.cpu_seconds))}
    if reader is not None:
        out["read_image_ms"] = reader.per_sample_ms
        out["readers_rate"] = mix(dicom.median_s, reader.median_s)
    return out


# ---------------------------------------------------------------- run and report


def run(data: Path, files: int, repeats: int) -> tuple[str, dict[str, Any]]:
    cts, jpegs = write_inputs(data, files)
    half = (256, 256)
    cases: list[tuple[str, str, Callable[[Path], Any], Sequence[Path]]] = [
        ("dicom", "pydicom bare: dcmread().pixel_array", bare_dicom, cts),
        ("dicom", "packer read_dicom, 2 windows, no resize", packer_reader("dicom", None), cts),
        ("dicom", "packer read_dicom, 2 windows, 256×256", packer_reader("dicom", half), cts),
        ("jpeg", "cv2 bare: imdecode", bare_jpeg, jpegs),
        ("jpeg", "packer read_image rgb, no resize", packer_reader("image", None), jpegs),
        ("jpeg", "packer read_image rgb, 256×256", packer_reader("image", half), jpegs),
    ]
    with one_core() as core:
        measured = time_cases([(name, fn, paths) for _, name, fn, paths in cases], repeats)
        timings = [(kind, timing, output_shape(fn, paths[0]))
                   for (kind, _, fn, paths), timing in zip(cases, measured, strict=True)]
    bare = {kind: t for kind, t, _ in timings if "bare" in t.name}
    machine = describe_machine()
    lines = [
        f"Per core: one process pinned to core {core} of {machine['nproc']}, OpenCV 1 thread, files in the page "
        f"cache. {files} distinct 512×512 int16 CT slices (12 bits stored, Explicit VR Little Endian, ~513 kB) "
        f"and {files} distinct 1024×768 JPEGs (quality 95, "
        f"~{statistics.mean(p.stat().st_size for p in jpegs) / 1e3:.0f} kB); median of {repeats} passes over "
        "all files, the cases timed round-robin. Windows: lung and mediastinum presets. "
        "\"bare\" includes reading the file.",
        "",
        "| input | case | output | samples/s | ms/sample | × bare time | spread |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    code = code_state()
    record: dict[str, Any] = {"benchmark": "decode", "data": str(data), "files": files, "repeats": repeats,
                              "core": core, "machine": machine, "code": code, "cases": []}
    for kind, timing, shape in timings:
        ratio = timing.median_s / bare[kind].median_s
        label = "512×512 CT" if kind == "dicom" else "1024×768 JPEG"
        lines.append(f"| {label} | {timing.name} | {shape} | {timing.rate:,.0f} | {timing.per_sample_ms:.2f} "
                     f"| {ratio:.2f} | {100 * timing.spread:.0f}% |")
        record["cases"].append({"input": kind, "case": timing.name, "output": shape, "samples_per_s": timing.rate,
                                "ms_per_sample": timing.per_sample_ms, "ratio_to_bare": ratio,
                                "seconds": list(timing.seconds),
                                "cpu_seconds": list(timing.cpu_seconds)})
    lines += [
        "",
        "- \"× bare time\" is packer's time per sample over the bare decoder's (packer/bare); spread is "
        "(slowest − fastest pass) / median, a measure of the machine's noise.",
        f"- Machine: {machine_line(machine)}. Date: {machine['date']}. Code: {code_line(code)}.",
        f"- Reproduce: `.venv/bin/python benchmarks/decode.py --data {data}` (also `--files`, `--repeats`).",
    ]
    return "\n".join(lines), record


def write_section(section: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) one ``## `` section of RESULTS.md, leaving the others untouched."""
    text = path.read_text() if path.exists() else "# packer benchmarks\n"
    block = f"{section}\n\n{body}\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def publish_run(section: str, body: str, started: float, *, record: dict[str, Any] | None = None,
                write: bool = True) -> None:
    """How every benchmark script ends: print the section body (and its JSON line), the run
    time since ``started`` (``time.perf_counter()``), and replace the section in RESULTS.md
    unless ``write`` is False."""
    print(body)
    if record is not None:
        print(json.dumps(record, sort_keys=True, default=str))
    print(f"(benchmark took {time.perf_counter() - started:.0f} s)")
    if write:
        write_section(section, body)
        print(f"wrote section {section!r} of {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40, help="distinct files of each kind (default 40)")
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per case, median reported (default 7)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"input folder (default {DEFAULT_DATA})")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not update {RESULTS.name}")
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats: use at least 5 (the median of fewer is too noisy on a shared machine)")
    start = time.perf_counter()
    body, record = run(args.data, args.files, args.repeats)
    publish_run(SECTION, body, start, record=record, write=not args.no_write)


if __name__ == "__main__":
    main()
