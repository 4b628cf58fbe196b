"""Benchmark the HTML report (packer.htmlreport): generation time and file size; record it in RESULTS.md.

    .venv/bin/python benchmarks/report.py            # demo + synthetic sets, writes the section
    .venv/bin/python benchmarks/report.py --no-write # print only
    .venv/bin/python benchmarks/report.py --quick    # 20k samples only

Data sets:
- the demo (``packer demo-data`` tree, built with the demo job, WebDataset and Parquet);
- synthetic version folders written straight through packer's shard writers (tar/Parquet
  shards, ``_index.parquet``, ``bad_samples.jsonl``, a sealed manifest based on the demo's):
  tiny samples (half CT-like 2×32×32 with lung/mediastinum windows, half RGB 3×32×32; 10
  labels; 3 splits by entity) at 20k and 100k samples, and 3k large samples (2×256×256 and
  3×256×256, noisy) whose thumbnails hit the 128 px cap and the report's image budget.
Each report is rendered twice in a fresh process; the faster time is shown, with that process's peak RSS.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.conftest.demo_job_doc: the demo job re-pointed at a tree

from decode import publish_run  # noqa: E402 - sibling script: one RESULTS.md writer

from packer.htmlreport import render_html_report  # noqa: E402
from packer.manifest import seal_manifest, write_manifest  # noqa: E402
from packer.pipeline.publish import IndexColumns, write_index  # noqa: E402
from packer.shards.encode import EncodedSample  # noqa: E402
from packer.shards.parquet import write_parquet_shard  # noqa: E402
from packer.shards.tar import write_tar_shard  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## HTML report"
SPLITS = ("train", "valid", "test")
LABELS = tuple(f"class{i:02d}" for i in range(10))
WINDOWS = [{"center": -600.0, "function": "LINEAR", "name": "lung", "source": "preset", "width": 1500.0},
           {"center": 50.0, "function": "LINEAR", "name": "mediastinum", "source": "preset", "width": 350.0}]


def build_demo(root: Path, fmt: str) -> tuple[Path, float]:
    from packer.config import load_job
    from packer.demo import write_demo_tree
    from packer.pipeline.build import BuildOptions, build
    from tests.conftest import demo_job_doc, write_job

    raw = root / "demo-raw"
    if not raw.exists():
        write_demo_tree(raw, seed=0)
    doc = demo_job_doc(raw, root / f"demo-{fmt}")
    doc["pack"]["format"] = fmt
    start = time.perf_counter()
    result = build(load_job(write_job(root / f"job-{fmt}", doc)), BuildOptions(scheduler="sync", quiet=True))
    return result.version_dir, time.perf_counter() - start


def _pattern(rng: np.random.Generator, channels: int, size: int, label: int, noise: float) -> np.ndarray:
    """A smooth background with a label-dependent ellipse, plus Gaussian noise; uint8 C×H×W."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = np.empty((channels, size, size), np.uint8)
    cy, cx = rng.uniform(0.3, 0.7, 2)
    r = 0.12 + 0.02 * label
    blob = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
    for c in range(channels):
        base = rng.uniform(40, 200) + 40 * (yy * rng.uniform(-1, 1) + xx * rng.uniform(-1, 1))
        base = np.where(blob, rng.uniform(0, 255), base) + rng.normal(0, noise, (size, size))
        out[c] = np.clip(base, 0, 255).astype(np.uint8)
    return out


def write_synthetic(folder: Path, template: dict[str, Any], *, n: int, size: int, fmt: str, noise: float,
                    seed: int = 0) -> Path:
    """A version folder of ``n`` samples written through packer's shard writers; returns the folder."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    label_map = {name: i for i, name in enumerate(LABELS)}
    pool = {(src, lab): [_pattern(rng, 2 if src == "ct" else 3, size, lab, noise) for _ in range(16)]
            for src in ("ct", "photos") for lab in range(len(LABELS))}
    by_split: dict[str, list[EncodedSample]] = defaultdict(list)
    times: dict[str, list[str]] = defaultdict(list)
    for i in range(n):
        source = "ct" if i % 2 == 0 else "photos"
        label = int(rng.integers(len(LABELS)))
        entity = f"e-{hashlib.sha256(f'{seed}:{i // 10}'.encode()).hexdigest()[:20]}"
        unit = int(entity[2:10], 16) / 2**32
        split = "train" if unit < 0.8 else "valid" if unit < 0.9 else "test"
        image = np.roll(pool[(source, label)][i % 16], i % size, axis=2)
        key = f"{source}-{hashlib.sha256(f'{seed}:{i}'.encode()).hexdigest()[:16]}"
        meta = {"windows": WINDOWS} if source == "ct" else {}
        info = {"key": key, "sample_id": key, "source": source, "kind": "dicom" if source == "ct" else "image",
                "label": LABELS[label], "label_index": label, "entity_id": entity, "split": split,
                "shape": list(image.shape), "dtype": "uint8", "metadata": meta}
        by_split[split].append(EncodedSample(key=key, split=split, label=label, label_name=LABELS[label],
                                             entity_id=entity, source=source, shape=tuple(image.shape),
                                             dtype="uint8", pixels=image.tobytes(), info=info))
        times[split].append(f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T12:00:00")
    splits, index = {}, IndexColumns()
    per_shard = max(1, (64 << 20) // (size * size * 3 + 1536))
    for split in SPLITS:
        samples = sorted(by_split[split], key=lambda s: s.key)
        shards = []
        for index, start in enumerate(range(0, len(samples), per_shard)):
            name = f"{split}-{index:06d}.{'tar' if fmt == 'webdataset' else 'parquet'}"
            writer = write_tar_shard if fmt == "webdataset" else write_parquet_shard
            written = writer(folder / name, samples[start:start + per_shard])
            shards.append(written.to_entry())
            part = samples[start:start + per_shard]
            index.add_shard(written, split=split, keys=[s.key for s in part], labels=[s.label for s in part],
                            entity_ids=[s.entity_id for s in part], sources=[s.source for s in part])
        splits[split] = {"samples": len(samples), "entities": len({s.entity_id for s in samples}),
                         "class_counts": dict(sorted(Counter(s.label_name for s in samples).items())),
                         "shards": shards}
    bad = [{"message": f"case{i:05d}/slice.dcm: zero-byte file; re-copy it from the source",
            "path": f"/data/export/site-a/case{i:05d}/slice.dcm", "reason": ("unreadable", "truncated")[i % 2],
            "sample_id": f"ct-bad{i:05d}", "stage": "read"} for i in range(max(1, n // 50))]
    (folder / "bad_samples.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in bad))
    near = [{"a": {"key": a.key, "split": "train", "entity_id": a.entity_id, "path": "x"},
             "b": {"key": b.key, "split": "test", "entity_id": b.entity_id, "path": "y"}, "distance": 3}
            for a, b in zip(by_split["train"][:60], by_split["test"][:60], strict=False)]
    audit = json.loads(json.dumps(template["audit"]))
    audit["entities_per_split"] = {s: splits[s]["entities"] for s in SPLITS}
    audit["time_ranges"] = {s: [min(t), max(t)] for s, t in times.items()}
    if isinstance(audit.get("rules"), dict) and "near_duplicates_across_splits" in audit["rules"]:
        audit["rules"]["near_duplicates_across_splits"].update(count=len(near), passed=False)
        leakage = {**audit, "rules": {k: {**v, "findings": near if k == "near_duplicates_across_splits" else []}
                                      for k, v in audit["rules"].items()}}
        (folder / "leakage.json").write_text(json.dumps(leakage))
    body = {k: v for k, v in template.items() if k not in ("dataset_hash", "version", "created_at")}
    body.update(name=f"synthetic-{n}", format=fmt, label_map=label_map, splits=splits, audit=audit,
                inputs={"files": n + len(bad), "samples": n}, index=write_index(folder, index),
                sample_schema={"dtype": "uint8", "layout": "CHW", "shape": None,
                               "shapes": {"ct": [[2, size, size]], "photos": [[3, size, size]]}},
                bad_samples={**template["bad_samples"], "total": len(bad),
                             "fraction": round(len(bad) / (n + len(bad)), 6),
                             "by_reason": dict(Counter(r["reason"] for r in bad)), "by_stage": {"read": len(bad)}})
    body["config"] = {**template["config"], "name": body["name"]}
    write_manifest(folder, seal_manifest(body))
    return folder


_CHILD = """
import json, re, sys, time
from packer.htmlreport import write_html_report
best = float("inf")
for _ in range(2):
    start = time.perf_counter()
    path = write_html_report(sys.argv[1])
    best = min(best, time.perf_counter() - start)
hwm = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read())  # ru_maxrss survives exec
print(json.dumps({"seconds": best, "path": str(path), "rss": int(hwm.group(1)) if hwm else 0}))
"""


def measure(folder: Path) -> dict[str, Any]:
    """Render in a fresh process (best of 2), so peak RSS is the report's own."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder)], capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    text = Path(result["path"]).read_text(encoding="utf-8")
    return {"seconds": result["seconds"], "bytes": len(text.encode()), "rss": result["rss"] / 1024,
            "images": text.count('src="data:image/png;base64,'), "warnings": text.count('class="alert"')}


def describe_machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.M)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = model.group(1).strip() if model else platform.processor() or "?"
    ram = f"{int(mem.group(1)) / 2**20:.1f} GiB" if mem else "?"
    import pyarrow

    versions = (f"Python {platform.python_version()}, numpy {np.__version__}, OpenCV {cv2.__version__}, "
                f"pyarrow {pyarrow.__version__}")
    return f"{cores} cores (nproc), CPU {cpu}, RAM {ram}, {versions}"


def run(quick: bool) -> str:
    lines = ["| data set | samples | format | shards on disk | report | images | time | peak RSS |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="packer-report-bench-") as tmp:
        root = Path(tmp)
        cases: list[tuple[str, Path]] = []
        for fmt in ("webdataset", "parquet"):
            folder, _ = build_demo(root, fmt)
            cases.append(("demo", folder))
        template = json.loads((cases[0][1] / "manifest.json").read_text())
        plans = [(20_000, 32, "webdataset", 6.0), (20_000, 32, "parquet", 6.0), (3_000, 256, "webdataset", 18.0)]
        if not quick:
            plans.insert(2, (100_000, 32, "webdataset", 6.0))
        for n, size, fmt, noise in plans:
            start = time.perf_counter()
            folder = write_synthetic(root / f"syn-{n}-{size}-{fmt}", template, n=n, size=size, fmt=fmt, noise=noise)
            print(f"wrote {n:,} samples ({size}px, {fmt}) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            cases.append((f"synthetic {size}×{size}", folder))
        for name, folder in cases:
            manifest = json.loads((folder / "manifest.json").read_text())
            shards = sum(s["bytes"] for e in manifest["splits"].values() for s in e["shards"])
            result = measure(folder)
            if result["warnings"]:
                raise SystemExit(f"{folder}: the report shows {result['warnings']} manifest warning(s)")
            lines.append(f"| {name} | {manifest['inputs']['samples']:,} | {manifest['format']} | "
                         f"{shards / 2**20:,.1f} MiB | {result['bytes'] / 2**20:.2f} MiB | {result['images']:,} | "
                         f"{result['seconds']:.2f} s | {result['rss']:,.0f} MiB |")
            print(lines[-1], file=sys.stderr)
        assert render_html_report(cases[0][1]) == render_html_report(cases[0][1])
    lines += [
        "",
        "Time = `write_html_report(version_dir)` (read index, seeded selection, decode ≤ 2,000 samples per split "
        "for histograms and ≤ 32 per split×label for contact sheets, encode thumbnails, render), best of 2. "
        "Synthetic sets are written straight through packer's shard writers (half CT-like 2-window samples, half "
        "RGB; 10 labels; entity-hashed splits; n/50 bad-sample records; 60 planted cross-split near-duplicate "
        "pairs in leakage.json). The 256 px set has noisy pixels, so its 128 px thumbnails hit the report's "
        "image budget (7 MB of data URIs, 20% of it for duplicate pairs); the report's size does not grow with "
        "the sample count, only the index read and the key ranking do.",
        f"- Machine: {describe_machine()}. Date: {dt.date.today().isoformat()}.",
        "- Reproduce: `.venv/bin/python benchmarks/report.py`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k-sample set")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not update {RESULTS.name}")
    args = parser.parse_args()
    start = time.perf_counter()
    publish_run(SECTION, run(args.quick), start, write=not args.no_write)


if __name__ == "__main__":
    main()
