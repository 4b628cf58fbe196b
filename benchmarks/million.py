"""A real build of a million small files (issue 40, measures 2 and 3): wall by stage, memory, planted copies.

    .venv/bin/python benchmarks/million.py                          # 10,000 then 1,000,000 files, writes the section
    .venv/bin/python benchmarks/million.py --files 10000 --no-write

The tree is the bench mix's proportions in small images: 40% CT slices of 64×64 (similar-anatomy
chest phantoms, 40 slices a patient: :func:`packer.demo.write_copies_tree`) and 60% 64×64 PNG
photos (8 a subject), with ``--copies`` planted copies of CT slices under other entities (the nine
``COPY_KINDS``: exports as PNG, JPEG, resized, shifted, cropped, other windows; DICOM copies, plain
and RLE). The job is the near-copy benchmark's (CT: lung and mediastinum windows at 64×64;
images grey at 64×64; entity split 80/10/10; near copies on by default) with the photos as a third
source. Each size is built fresh by ``packer build --workers N`` in a child process (the CLI's own
code path, progress lines and HTML report included) while this process samples, once a second, the
resident memory of the client (the child) and of each of its descendants (the dask workers).

Reported per size: files and samples, build wall, each stage's seconds from its closing progress
line, the near-copy stage's share of the wall, client and worker peak RSS, pack throughput per
core (samples ÷ (pack seconds × workers)) against the smallest size, and the planted copies: how
many share a split group with their source, and the near links joining two different CT patients
(false links). The groups and links are taken from the build's own ``run_stages`` result inside
the child (a wrapper keeps only the planted copies' rows and the links, not the sample table).
Nothing is asserted: what is measured is printed as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import psutil
import yaml
from decode import describe_machine, publish_run  # noqa: E402 - sibling script: one RESULTS.md writer

from packer.demo import (
    COPY_KINDS,
    PHOTO_LABELS,
    random_datetime,
    render_photo,
    seeded_rng,
    write_copies_tree,
    write_photo,
)

SECTION = "## A million small files, built for real (issue 40, measures 2 and 3)"
DEFAULT_DATA = Path("/work/bench-data/million")
SLICES, SIZE, PHOTOS_PER_SUBJECT, CT_SHARE = 40, 64, 8, 0.4
#: Bumped when the tree this script writes changes (a tree on disk with another is written again)
TREE_VERSION = 2
_CLOSING = re.compile(r"^\s*([a-z]+): .*\((\d+(?:\.\d+)?)s\)\s*$")


def render_scene(rng: np.random.Generator, label: str, size: int = SIZE) -> np.ndarray:
    """A BGR uint8 size×size photo with more content than the demo's (``--photos scenes``): a
    smooth background of three random plane waves, four to eight objects (discs, rotated boxes,
    triangles, ellipses, thick lines) of random colour, size and place, the ``label`` shape
    among them, and pixel noise. Two such photos drawn independently share no layout, so a near
    link between them is the detector's error, not the generator's (the demo's photos are one
    shape on a smooth field: at 64 px grey, tens of thousands of them repeat each other)."""
    if label not in PHOTO_LABELS:
        raise ValueError(f"unknown photo label {label!r}; expected one of {PHOTO_LABELS}")
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    canvas = np.broadcast_to(rng.uniform(40, 215, size=3).astype(np.float32), (size, size, 3)).copy()
    for _ in range(3):
        fy, fx = rng.uniform(-4.0, 4.0, size=2)
        wave = np.cos(2 * np.pi * (fy * y + fx * x) + rng.uniform(0, 2 * np.pi))
        canvas += wave[:, :, None] * rng.uniform(-35.0, 35.0, size=3).astype(np.float32)
    img = np.clip(canvas, 0, 255).astype(np.uint8)
    kinds = ["disc", "box", "triangle", "ellipse", "line"]
    objects = int(rng.integers(4, 9))
    main = int(rng.integers(objects))
    for k in range(objects):
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        centre = rng.uniform(0.1, 0.9, size=2) * size
        extent = float(rng.uniform(0.06, 0.25)) * size
        kind = ("disc" if label == "circle" else "box") if k == main else kinds[int(rng.integers(len(kinds)))]
        angle = float(rng.uniform(0, 180))
        if kind == "disc":
            cv2.circle(img, (int(centre[0]), int(centre[1])), max(2, int(extent)), colour, -1, cv2.LINE_AA)
        elif kind == "ellipse":
            axes = (max(2, int(extent)), max(1, int(extent * rng.uniform(0.3, 0.8))))
            cv2.ellipse(img, (int(centre[0]), int(centre[1])), axes, angle, 0, 360, colour, -1, cv2.LINE_AA)
        elif kind == "box":
            corners = cv2.boxPoints(((float(centre[0]), float(centre[1])), (2 * extent, 2 * extent * rng.uniform(
                0.5, 1.0)), angle if k != main else 0.0))
            cv2.fillPoly(img, [np.rint(corners).astype(np.int32)], colour, cv2.LINE_AA)
        elif kind == "triangle":
            points = centre + rng.uniform(-extent, extent, size=(3, 2))
            cv2.fillPoly(img, [np.rint(points).astype(np.int32)], colour, cv2.LINE_AA)
        else:
            end = centre + rng.uniform(-2 * extent, 2 * extent, size=2)
            cv2.line(img, (int(centre[0]), int(centre[1])), (int(end[0]), int(end[1])), colour,
                     int(rng.integers(1, 4)), cv2.LINE_AA)
    noisy = img.astype(np.float32) + rng.standard_normal(img.shape, dtype=np.float32) * float(rng.uniform(3, 9))
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def _photos(root: Path, seed: int, first: int, last: int, total: int, scenes: bool = False) -> list[list[str]]:
    rows = []
    for subject in range(first, last + 1):
        entity = f"S{subject:06d}"
        start = int(seeded_rng(seed, "photo-subject", subject).integers(2))
        for n in range(1, PHOTOS_PER_SUBJECT + 1):
            if (subject - 1) * PHOTOS_PER_SUBJECT + n > total:
                break
            rng = seeded_rng(seed, "photo", subject, n)
            label = PHOTO_LABELS[(start + n) % 2]
            rel = f"{entity}/{n:02d}.png"
            photo = render_scene(rng, label) if scenes else render_photo(rng, label, height=SIZE, width=SIZE)
            write_photo(root / "photos" / rel, photo)
            rows.append([rel, label, entity, random_datetime(rng).isoformat()])
    return rows


def write_tree(root: Path, files: int, copies: int, processes: int, seed: int = 40,
               photos_kind: str = "shapes") -> dict[str, Any]:
    """The mixed tree of about ``files`` files under ``root`` (kept when its stamp says it was
    written with the same arguments). ``photos_kind``: ``shapes`` (the demo's photos) or
    ``scenes`` (:func:`render_scene`). Returns its description, the planted copies included."""
    stamp = root / "tree.json"
    asked = {"files": files, "copies": copies, "seed": seed, "slices": SLICES, "size": SIZE, "tree": TREE_VERSION,
             **({"photos": photos_kind} if photos_kind != "shapes" else {})}
    if stamp.is_file() and json.loads(stamp.read_text()).get("asked") == asked:
        return json.loads(stamp.read_text())
    if root.exists():
        shutil.rmtree(root)
    started = time.perf_counter()
    patients = max(copies, math.ceil(files * CT_SHARE / SLICES))
    tree = write_copies_tree(root, patients=patients, copies=copies, seed=seed, slices=SLICES, size=SIZE,
                             processes=processes)
    photos = files - patients * SLICES - copies
    subjects = math.ceil(photos / PHOTOS_PER_SUBJECT)
    step = max(1, math.ceil(subjects / (16 * processes)))
    ranges = [(a, min(a + step - 1, subjects)) for a in range(1, subjects + 1, step)]
    with ProcessPoolExecutor(processes) as pool:
        parts = pool.map(_photos, *zip(*[(root, seed, a, b, photos, photos_kind == "scenes") for a, b in ranges],
                                       strict=True))
        rows = [row for part in parts for row in part]
    with open(root / "photos" / "labels.csv", "w", encoding="utf-8") as table:
        table.write("path,label,entity,timestamp\n")
        table.writelines(",".join(row) + "\n" for row in rows)
    described = {"asked": asked, "patients": patients, "ct_files": patients * SLICES + sum(
        c.kind.startswith("dicom") for c in tree.copies), "photos": len(rows),
        "exports": sum(not c.kind.startswith("dicom") for c in tree.copies),
        "copies": [vars(c) for c in tree.copies], "seconds": time.perf_counter() - started}
    described["files"] = described["ct_files"] + described["photos"] + described["exports"]
    stamp.write_text(json.dumps(described))
    return described


def job_doc(raw: Path, out: Path) -> dict[str, Any]:
    return {"name": "million",
            "sources": [{"kind": "dicom", "root": str(raw / "ct"), "labels": str(raw / "ct_labels.csv")},
                        {"kind": "image", "root": str(raw / "exports"), "table": str(raw / "exports" / "labels.csv")},
                        {"kind": "image", "name": "photos", "root": str(raw / "photos"),
                         "table": str(raw / "photos" / "labels.csv")}],
            "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 17,
                      "balance": {"accept": True}},
            "transform": {"dicom": {"windows": ["lung", "mediastinum"], "size": [SIZE, SIZE]},
                          "image": {"size": [SIZE, SIZE], "color": "gray"}},
            "pack": {"format": "webdataset"}, "output": str(out), "phi": {"mode": "keep"}}


# ------------------------------------------------------------------ the child: the CLI, with the outcome kept


def _child(job_file: Path, workers: int, tree_file: Path, outcome_file: Path) -> None:
    """Run ``packer build`` as the CLI does; keep the planted copies' groups and the links."""
    import packer.pipeline.build as build_module
    from packer.cli import main

    tree = json.loads(tree_file.read_text())
    run_stages = build_module.run_stages

    def keeping_outcome(*args: Any, **kwargs: Any) -> Any:
        run = run_stages(*args, **kwargs)
        outcome_file.write_text(json.dumps(_outcome(run.prepared, tree)))
        return run

    build_module.run_stages = keeping_outcome  # type: ignore[assignment]
    main(["build", str(job_file), "--workers", str(workers), "--fresh"], standalone_mode=True)


def _copy_key(copy: dict[str, str]) -> tuple[str, str]:
    """A planted copy's (job source, relpath): DICOM copies sit in ``ct``, exports in ``exports``."""
    return ("ct" if copy["kind"].startswith("dicom") else "exports", copy["copy"])


def _outcome(prepared: Any, tree: dict[str, Any]) -> dict[str, Any]:
    """The planted copies' groups and the links, read row by row: no whole text column is made
    (the client's peak is part of what is measured)."""
    samples = prepared.samples
    sources, relpaths = samples.column("source"), samples.field_text("relpath")  # a list of shared names
    links = prepared.links
    ends = {*links.i.tolist(), *links.j.tolist()}
    wanted = {c["source"] for c in tree["copies"]} | {c["copy"] for c in tree["copies"]}
    where: dict[tuple[str, str], int] = {}
    named: dict[int, tuple[str, str]] = {}
    for n in range(len(samples)):
        relpath = relpaths.get(n) or ""
        if relpath in wanted:
            where[(sources[n], relpath)] = n
        if n in ends:
            named[n] = (sources[n], relpath)
    group_of = np.full(len(samples), -1, dtype=np.int32)
    for g, group in enumerate(prepared.assignment.groups):
        group_of[np.asarray(group.members, dtype=np.int64)] = g
    copy_patient = {_copy_key(c): f"ct:{c['source'].split('/')[0]}" for c in tree["copies"]}
    # a link's ends as entities (a source and a folder: a CT patient, a photo's subject); a copy
    # counts as its source's patient
    patient = {n: copy_patient.get(key) or f"{key[0]}:{key[1].split('/')[0]}" for n, key in named.items()}
    per_kind: dict[str, list[int]] = {kind: [0, 0, 0] for kind in COPY_KINDS}  # grouped, linked, planted
    pairs = {(min(a, b), max(a, b)) for a, b in zip(links.i.tolist(), links.j.tolist(), strict=True)}
    missed = []
    for c in tree["copies"]:
        a, b = where.get(("ct", c["source"]), -1), where.get(_copy_key(c), -1)
        grouped = a >= 0 and b >= 0 and group_of[a] == group_of[b] >= 0
        row = per_kind[c["kind"]]
        row[0] += int(grouped)
        row[1] += int((min(a, b), max(a, b)) in pairs)
        row[2] += 1
        if not grouped:
            missed.append(c)
    false = sorted((named[a], named[b]) for a, b in pairs if patient[a] != patient[b])
    return {"per_kind": per_kind, "links": len(pairs), "false_links": len(false),
            "false_examples": ["/".join(a) + " ~ " + "/".join(b) for a, b in false[:20]], "missed": missed[:20],
            "candidates": int(links.candidates), "samples": len(samples),
            "groups": len(prepared.assignment.groups)}


# ------------------------------------------------------------------ the parent: one build, watched


def _watch(process: subprocess.Popen[str], peaks: dict[str, float], stop: threading.Event) -> None:
    parent = psutil.Process(process.pid)
    while not stop.is_set():
        try:
            client = parent.memory_info().rss
            children = []
            for child in parent.children(recursive=True):
                try:
                    children.append(child.memory_info().rss)
                except psutil.Error:
                    continue
        except psutil.Error:
            break
        peaks["client"] = max(peaks.get("client", 0), client)
        peaks["client_since_line"] = max(peaks.get("client_since_line", 0), client)
        peaks["worker"] = max(peaks.get("worker", 0), max(children, default=0))
        peaks["workers_total"] = max(peaks.get("workers_total", 0), sum(children))
        stop.wait(1.0)


def one_size(data: Path, files: int, copies: int, workers: int, photos_kind: str = "shapes") -> dict[str, Any]:
    root = data / (f"f{files}" if photos_kind == "shapes" else f"f{files}-{photos_kind}")
    tree = write_tree(root / "raw", files, copies, workers, photos_kind=photos_kind)
    job_file = root / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_doc(root / "raw", root / "out")))
    outcome_file, log_file = root / "outcome.json", root / "build.log"
    outcome_file.unlink(missing_ok=True)
    for earlier in ("out", "work"):  # a fresh build: no version to find already built, no cache to reuse
        shutil.rmtree(root / earlier, ignore_errors=True)
    env = {**os.environ, "PACKER_WORK_DIR": str(root / "work")}
    command = [sys.executable, __file__, "--child", str(job_file), "--workers", str(workers),
               "--tree", str(root / "raw" / "tree.json"), "--outcome", str(outcome_file)]
    peaks: dict[str, float] = {}
    stop = threading.Event()
    stages: dict[str, float] = {}
    started = time.perf_counter()
    with open(log_file, "w", encoding="utf-8") as log, \
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as child:
        watcher = threading.Thread(target=_watch, args=(child, peaks, stop), daemon=True)
        watcher.start()
        assert child.stdout is not None
        for line in child.stdout:
            # each line with the client's largest resident memory since the line before: where its peak falls
            log.write(f"{time.perf_counter() - started:8.1f} {peaks.pop('client_since_line', 0) / 2**20:6.0f}M {line}")
            log.flush()
            closing = _CLOSING.match(line)
            if closing:  # the near-copy stage's own closing line is packer's "near copies: ..." summary
                name = "near copies" if line.startswith("packer: near copies") else closing.group(1)
                if name != "packer":
                    stages[name] = stages.get(name, 0.0) + float(closing.group(2))
        code = child.wait()
    wall = time.perf_counter() - started
    stop.set()
    watcher.join()
    if code != 0:
        raise SystemExit(f"the build of {files:,} files exited {code}: see {log_file}")
    manifests = sorted((root / "out" / "million").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    manifest = json.loads(manifests[-1].read_text())
    return {"files": tree["files"], "tree_s": tree["seconds"], "samples": manifest["inputs"]["samples"],
            "bad": manifest["bad_samples"].get("count", 0), "version": manifest["version"], "wall_s": wall,
            "stages": stages, "peak_mib": {k: v / 2**20 for k, v in peaks.items()},
            "outcome": json.loads(outcome_file.read_text()), "workers": workers}


def run(data: Path, sizes: list[int], copies: int, workers: int,
        photos_kind: str = "shapes") -> tuple[str, dict[str, Any]]:
    results = [one_size(data, files, min(copies, max(9, files // 1000)), workers, photos_kind) for files in sizes]
    base = results[0]

    def per_core(r: dict[str, Any]) -> float:
        return r["samples"] / (r["stages"].get("pack", float("nan")) * r["workers"])

    names = sorted({name for r in results for name in r["stages"]}, key=lambda n: -max(
        r["stages"].get(n, 0) for r in results))
    lines = [f"`packer build --workers {workers}` of the mixed tree (40% 64×64 CT phantoms, 40 slices a patient; "
             f"60% 64×64 PNG photos ({photos_kind}), 8 a subject; planted copies of the nine kinds), one fresh build "
             "per size.", "",
             "| files | samples | wall s | " + " | ".join(f"{n} s" for n in names)
             + " | near copies / wall | client peak MiB | worker peak MiB (largest, all) | pack samples/s a core |",
             "|---:|---:|---:|" + "---:|" * len(names) + "---:|---:|---:|---:|"]
    for r in results:
        near = r["stages"].get("near copies", 0.0)
        lines.append(f"| {r['files']:,} | {r['samples']:,} | {r['wall_s']:.0f} | "
                     + " | ".join(f"{r['stages'].get(n, 0.0):.0f}" for n in names)
                     + f" | {near / r['wall_s']:.0%} | {r['peak_mib']['client']:,.0f} | "
                       f"{r['peak_mib']['worker']:,.0f}, {r['peak_mib']['workers_total']:,.0f} | "
                       f"{per_core(r):,.0f} ({per_core(r) / per_core(base):.2f}×) |")
    lines += ["", "| files | copies grouped with their source | linked directly | near links | false links "
              "(different patients) | candidates verified | split groups |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        o = r["outcome"]
        grouped = sum(v[0] for v in o["per_kind"].values())
        linked = sum(v[1] for v in o["per_kind"].values())
        planted = sum(v[2] for v in o["per_kind"].values())
        lines.append(f"| {r['files']:,} | {grouped}/{planted} | {linked}/{planted} | {o['links']:,} | "
                     f"{o['false_links']} | {o['candidates']:,} | {o['groups']:,} |")
    machine = describe_machine()
    lines += ["", f"- Machine: {machine['nproc']} cores (nproc), CPU {machine['cpu']}, RAM {machine['ram_gib']} GiB. "
              f"Date: {machine['date']}.",
              f"- Reproduce: `.venv/bin/python benchmarks/million.py --files {' '.join(map(str, sizes))} "
              f"--workers {workers}{'' if photos_kind == 'shapes' else ' --photos ' + photos_kind}`."]
    return "\n".join(lines), {"sizes": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--copies", type=int, default=1000, help="planted copies at 1M files (fewer below: 1 in 1,000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--photos", choices=("shapes", "scenes"), default="shapes",
                        help="the photos: the demo's (one shape on a smooth field) or richer scenes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"work folder (default {DEFAULT_DATA})")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--outcome", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.workers, args.tree, args.outcome)
        return
    started = time.perf_counter()
    body, record = run(args.data, args.files, args.copies, args.workers, args.photos)
    publish_run(SECTION, body, started, record=record, write=not args.no_write)


if __name__ == "__main__":
    main()
