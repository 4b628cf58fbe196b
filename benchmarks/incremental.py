"""Benchmark incremental versions (issue 39): what a day's change costs against a fresh build.

    .venv/bin/python benchmarks/incremental.py                      # 20,000 files, 10 days (tens of minutes)
    .venv/bin/python benchmarks/incremental.py --files 500 --days 3  # a check that it runs end to end
    .venv/bin/python benchmarks/incremental.py --order path --fresh-workers 2 --logs /tmp/inc-logs
                     # the job with pack.order: path, one fresh build, each build's output kept

Data: a ``packer.demo.write_bench_tree`` tree of ``--files`` good files (the bench mix: 512×512
int16 CT slices and 640×480 JPEGs in the demo's proportions), written once under ``--data``
(reused while its stamp matches) and copied into ``--scratch`` for each run, since the run
changes it. The job is ``benchmarks/pack.py``'s: DICOM windows [lung, mediastinum] 256×256,
images rgb 256×256, WebDataset shards (≤ 1000 samples / 64 MiB), ``phi: keep``, entity split
80/10/10.

Steps, each build a ``packer build JOB --out OUT --cache-dir CACHE --workers N -q --no-report``
in its own process (wall time measured around it, interpreter and cluster start included):

1. build the tree into OUT (cache CACHE): the first version;
2. change the tree: add 1% new files (new entities: new CT patients and photo subjects),
   remove 0.5% (file and table row), re-label 0.5% (the label table's value: nodule/normal,
   circle/square) and change the pixels of 0.5% (a CT slice's top-left 16×16 stored values
   + 1; a photo rendered again from another seed); the four sets are disjoint;
3. build again into OUT with CACHE: the incremental version;
4. build the same inputs fresh into other outputs with fresh caches, with 1 and with 2
   workers;
5. ``--days D``: D times, add 1% new files and build incrementally into OUT.

Reported per build: wall; files decoded (the build's own count: "N files decoded"); bytes
written (the new version folder's files no other version in OUT links, by inode:
``packer.versions``); shards identical to a shard of the previous version (same sha256,
``packer diff``'s shard view) and of those how many are hard-linked (stored once); the build's
summary line about reuse, when it prints one. Then whether every ``dataset_hash`` of step 3-4
is equal, and for the daily series the dataset's disk by inode against the sum of the
versions' sizes (what as many full versions would take). Prints markdown for RESULTS.md and
one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packer.demo import (  # noqa: E402
    render_ct_phantom,
    render_photo,
    seeded_rng,
    write_bench_tree,
    write_ct_slice,
    write_photo,
)
from packer.inspection import diff_shards  # noqa: E402
from packer.manifest import read_manifest  # noqa: E402
from packer.versions import list_versions  # noqa: E402

PACKER = [sys.executable, "-c", "from packer.console import main; main()"]
DEFAULT_DATA = Path("/work/bench-data/incremental")
CT_LABELS, PHOTO_LABELS = ("nodule", "normal"), ("circle", "square")


# ---------------------------------------------------------------- the tree and its changes


def ensure_tree(data: Path, files: int, ct_size: int) -> Path:
    """The bench tree of ``files`` files under ``data``, written once (a stamp marks it complete)."""
    root = data / f"raw-{files}-ct{ct_size}"
    stamp = root.with_suffix(".json")
    if stamp.is_file() and root.is_dir() and json.loads(stamp.read_text()).get("files") == files:
        return root
    if root.exists():
        shutil.rmtree(root)
    write_bench_tree(root, samples=files, seed=0, ct_size=ct_size)
    stamp.write_text(json.dumps({"files": files, "ct_size": ct_size}))
    return root


def read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or ()), list(reader)


def write_table(path: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: r["path"]))


@dataclass
class Tree:
    """The raw tree being changed, with its two label tables in memory."""

    root: Path
    ct_size: int
    ct_columns: list[str] = field(default_factory=list)
    ct_rows: list[dict[str, str]] = field(default_factory=list)
    photo_columns: list[str] = field(default_factory=list)
    photo_rows: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path, ct_size: int) -> Tree:
        tree = cls(root, ct_size)
        tree.ct_columns, tree.ct_rows = read_table(root / "ct_labels.csv")
        tree.photo_columns, tree.photo_rows = read_table(root / "photos" / "labels.csv")
        return tree

    @property
    def files(self) -> int:
        return len(self.ct_rows) + len(self.photo_rows)

    def save(self) -> None:
        write_table(self.root / "ct_labels.csv", self.ct_columns, self.ct_rows)
        write_table(self.root / "photos" / "labels.csv", self.photo_columns, self.photo_rows)

    def add(self, count: int, rng: np.random.Generator, tag: str) -> int:
        """``count`` new files of new entities, CT and photos in the tree's proportion: whole new
        patients (one study of up to 6 slices) and subjects (up to 4 photos)."""
        n_ct = round(count * len(self.ct_rows) / max(self.files, 1))
        written = 0
        patient = 0
        while written < n_ct:
            patient += 1
            pid = f"NEW{tag}P{patient:04d}"
            label = CT_LABELS[int(rng.integers(2))]
            for k in range(1, min(6, n_ct - written) + 1):
                rel = f"{pid}/ST01/IM{k:03d}.dcm"
                hu = render_ct_phantom(rng, size=self.ct_size, z=-1.0 + 0.4 * (k - 1), nodule=label == "nodule",
                                       anatomy=seeded_rng(39, "new-anatomy", tag, patient))  # its own body
                write_ct_slice(self.root / "ct" / rel, patient_id=pid, study_date="20250101", pixels_hu=hu,
                               instance_number=k, slice_location_mm=2.5 * k)
                self.ct_rows.append({"path": rel, "label": label})
                written += 1
        subject = 0
        while written < count:
            subject += 1
            entity = f"NEW{tag}S{subject:04d}"
            for n in range(1, min(4, count - written) + 1):
                label = PHOTO_LABELS[int(rng.integers(2))]
                rel = f"{entity}/{n:02d}.jpg"
                write_photo(self.root / "photos" / rel, render_photo(rng, label, height=480, width=640))
                self.photo_rows.append({"path": rel, "label": label, "entity": entity,
                                        "timestamp": "2025-01-01T10:00:00"})
                written += 1
        return written

    def pick(self, count: int, rng: np.random.Generator, taken: set[str]) -> list[tuple[str, dict[str, str]]]:
        """``count`` existing files (source, row) not in ``taken``, drawn at random; adds them to it."""
        every = [("ct", r) for r in self.ct_rows] + [("photos", r) for r in self.photo_rows]
        order = rng.permutation(len(every))
        chosen = []
        for i in order:
            source, row = every[int(i)]
            if f"{source}/{row['path']}" in taken:
                continue
            taken.add(f"{source}/{row['path']}")
            chosen.append((source, row))
            if len(chosen) == count:
                break
        return chosen

    def remove(self, picked: list[tuple[str, dict[str, str]]]) -> None:
        for source, row in picked:
            (self.root / source / row["path"]).unlink()
            rows = self.ct_rows if source == "ct" else self.photo_rows
            rows.remove(row)

    def relabel(self, picked: list[tuple[str, dict[str, str]]]) -> None:
        for source, row in picked:
            labels = CT_LABELS if source == "ct" else PHOTO_LABELS
            row["label"] = labels[1 - labels.index(row["label"])]

    def change_pixels(self, picked: list[tuple[str, dict[str, str]]], rng: np.random.Generator) -> None:
        import pydicom

        for source, row in picked:
            path = self.root / source / row["path"]
            if source == "ct":
                ds = pydicom.dcmread(path)
                stored = ds.pixel_array.copy()
                stored[:16, :16] += 1
                ds.PixelData = stored.tobytes()
                ds.save_as(path)
            else:
                write_photo(path, render_photo(rng, row["label"], height=480, width=640))


def change_a_day(tree: Tree, rng: np.random.Generator, tag: str) -> dict[str, int]:
    """Step 2: +1% new files, -0.5%, 0.5% re-labelled, 0.5% with changed pixels (disjoint)."""
    base = tree.files
    share = max(1, round(base * 0.005))
    taken: set[str] = set()
    removed, relabeled, changed = (tree.pick(share, rng, taken) for _ in range(3))
    tree.remove(removed)
    tree.relabel(relabeled)
    tree.change_pixels(changed, rng)
    added = tree.add(max(1, round(base * 0.01)), rng, tag)
    tree.save()
    return {"added": added, "removed": len(removed), "relabeled": len(relabeled), "changed": len(changed)}


# ---------------------------------------------------------------- builds


def write_job(path: Path, raw: Path, order: str = "key") -> Path:
    doc = {
        "name": "incremental",
        "sources": [
            {"kind": "dicom", "root": str(raw / "ct"), "entity": "PatientID", "time": ["StudyDate", "StudyTime"],
             "labels": str(raw / "ct_labels.csv")},
            {"kind": "image", "root": str(raw / "photos"), "table": str(raw / "photos" / "labels.csv")},
        ],
        "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 17},
        "transform": {"dicom": {"windows": ["lung", "mediastinum"], "size": [256, 256]},
                      "image": {"size": [256, 256], "color": "rgb"}},
        "pack": {"format": "webdataset", "max_samples": 1000, "max_bytes": "64MiB",
                 **({"order": order} if order != "key" else {})},
        "output": str(path.parent / "unused-output"),
        "validate": {"max_bad_fraction": 0.0},
        "phi": {"mode": "keep"},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass
class Build:
    label: str
    workers: int
    wall_s: float
    version: str
    dataset_hash: str
    files_decoded: int | None
    files_cached: int
    bytes: int = 0            # the version folder's files, each inode once
    bytes_written: int = 0    # its files no other version in the output links
    shards: int = 0
    shards_same: int = 0      # identical (sha256) to a shard of the previous version
    shards_linked: int = 0    # of those, hard-linked (one inode)
    reuse_line: str = ""


#: where each build's stdout and stderr go (``--logs``), None: nowhere
LOGS: list[Path] = []


def run_build(label: str, job: Path, out: Path, cache: Path, workers: int) -> Build:
    """One ``packer build`` in its own process; the numbers from its summary and its output
    (kept as ``<label>.log`` under ``--logs`` when given: the stage table, the near-copy line)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [*PACKER, "build", str(job), "--out", str(out), "--cache-dir", str(cache), "--workers", str(workers),
               "-q", "--no-report"]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    for folder in LOGS:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{label.replace(' ', '-').replace(',', '')}.log").write_text(done.stdout + "\n" + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{label}: packer build exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    text = done.stdout
    version = re.search(r"^dataset \S+ version (\w+)", text, re.M)
    digest = re.search(r"dataset_hash ([0-9a-f]{64})", text)
    decoded = re.search(r"\((\d+) files? decoded(?:, (\d+) from the build cache)?\)", text)
    reuse = [line.strip() for line in text.splitlines() if "wrote" in line and "reused" in line]
    if version is None or digest is None:
        raise SystemExit(f"{label}: no version in the build's summary:\n{text}")
    return Build(label=label, workers=workers, wall_s=wall, version=version.group(1), dataset_hash=digest.group(1),
                 files_decoded=int(decoded.group(1)) if decoded else None,
                 files_cached=int(decoded.group(2) or 0) if decoded else 0, reuse_line=reuse[0] if reuse else "")


def measure(build: Build, out: Path, previous: str | None) -> Build:
    """Fill in the bytes and shard counts of ``build``'s version in ``out``/incremental."""
    listing = list_versions(out / "incremental")
    usage = next(v for v in listing.versions if v.folder == build.version)
    build.bytes, build.bytes_written, build.shards = usage.bytes, usage.unique_bytes, usage.shards
    if previous is not None and previous != build.version:
        changes = diff_shards(read_manifest(out / "incremental" / previous),
                              read_manifest(out / "incremental" / build.version))
        same = [c for c in changes if c.kind == "reused"]
        build.shards_same, build.shards_linked = len(same), sum(1 for c in same if c.same_inode)
    return build


# ---------------------------------------------------------------- report


def gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def report(args: argparse.Namespace, first: Build, change: dict[str, int], inc: Build, fresh: list[Build],
           days: list[tuple[dict[str, int], Build, int, int]]) -> str:
    hashes = {b.dataset_hash for b in [inc, *fresh]}
    fresh2 = next(b for b in fresh if b.workers == args.workers)
    lines = [f"`benchmarks/incremental.py --files {args.files} --days {args.days} --order {args.order}` on "
             f"{platform.node()} "
             f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. Change: +{change['added']} new files, "
             f"-{change['removed']}, {change['relabeled']} re-labelled, {change['changed']} with new pixels.",
             "",
             "| build | workers | wall | files decoded | bytes written | shards | same as before | hard-linked |",
             "|---|---|---|---|---|---|---|---|"]
    for b in [first, inc, *fresh]:
        lines.append(f"| {b.label} | {b.workers} | {b.wall_s:.1f} s | {b.files_decoded} | {gb(b.bytes_written)} | "
                     f"{b.shards} | {b.shards_same if b.label == 'incremental' else '-'} | "
                     f"{b.shards_linked if b.label == 'incremental' else '-'} |")
    lines += ["",
              f"- incremental wall / fresh wall ({args.workers} workers): {inc.wall_s / fresh2.wall_s:.0%} "
              "(target ≤ 10%)",
              f"- bytes written by the incremental build: {gb(inc.bytes_written)} of {gb(inc.bytes)} "
              f"({inc.bytes_written / max(inc.bytes, 1):.0%} of the version)",
              f"- dataset_hash equal for incremental and the fresh builds ({args.fresh_workers} workers): "
              f"{'yes' if len(hashes) == 1 else 'NO: ' + ', '.join(sorted(h[:12] for h in hashes))}"]
    if inc.reuse_line:
        lines.append(f"- the build says: `{inc.reuse_line}`")
    if days:
        lines += ["", "| day | new files | wall | files decoded | bytes written | shards same as the day before "
                  "| hard-linked | disk by inode | as full versions |", "|---|---|---|---|---|---|---|---|---|"]
        for day, (change_d, b, disk, full) in enumerate(days, start=1):
            lines.append(f"| {day} | +{change_d['added']} | {b.wall_s:.1f} s | {b.files_decoded} | "
                         f"{gb(b.bytes_written)} | {b.shards_same} of {b.shards} | {b.shards_linked} | {gb(disk)} | "
                         f"{gb(full)} |")
        disk, full = days[-1][2], days[-1][3]
        lines.append(f"\nAfter {len(days)} days: {gb(disk)} on disk against {gb(full)} for "
                     f"{len(days) + 2} full versions ({disk / max(full, 1):.0%}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="workers of the incremental builds")
    parser.add_argument("--ct-size", type=int, default=512)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="where the base tree is kept")
    parser.add_argument("--scratch", type=Path, default=Path("/work/bench-scratch/incremental"),
                        help="changed tree, outputs and caches (emptied first, deleted after unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--order", choices=("key", "path"), default="key",
                        help="the job's pack.order (path: new entities' folders, NEW..., sort together)")
    parser.add_argument("--fresh-workers", default="1,2",
                        help="worker counts of the fresh builds, comma-separated (default 1,2)")
    parser.add_argument("--logs", type=Path, help="keep each build's output as LOGS/<label>.log")
    args = parser.parse_args(argv)
    if args.logs is not None:
        LOGS.append(args.logs)

    base = ensure_tree(args.data, args.files, args.ct_size)
    if args.scratch.exists():
        shutil.rmtree(args.scratch)
    raw = Path(shutil.copytree(base, args.scratch / "raw"))
    job = write_job(args.scratch / "job.yaml", raw, args.order)
    out, cache = args.scratch / "out", args.scratch / "cache"
    try:
        first = measure(run_build("first", job, out, cache, args.workers), out, None)
        tree = Tree.load(raw, args.ct_size)
        rng = np.random.default_rng(39)
        change = change_a_day(tree, rng, "D0")
        inc = measure(run_build("incremental", job, out, cache, args.workers), out, first.version)
        fresh = []
        for workers in sorted({int(w) for w in args.fresh_workers.split(",")} | {args.workers}):
            label = f"fresh, {workers} worker{'s' if workers > 1 else ''}"
            folder = args.scratch / f"fresh-{workers}"
            build = run_build(label, job, folder / "out", folder / "cache", workers)
            build.bytes_written = build.bytes = sum(p.stat().st_size for p in (folder / "out" / "incremental" /
                                                                               build.version).iterdir())
            build.shards = sum(1 for p in (folder / "out" / "incremental" / build.version).glob("*.tar"))
            fresh.append(build)
            shutil.rmtree(folder)
        days = []
        previous = inc.version
        for day in range(1, args.days + 1):
            added = tree.add(max(1, round(tree.files * 0.01)), rng, f"D{day}")
            tree.save()
            b = measure(run_build(f"day {day}", job, out, cache, args.workers), out, previous)
            listing = list_versions(out / "incremental")
            days.append(({"added": added}, b, listing.disk_bytes, listing.sum_bytes))
            previous = b.version
        print(report(args, first, change, inc, fresh, days))
        print(json.dumps({"files": args.files, "change": change, "first": asdict(first), "incremental": asdict(inc),
                          "fresh": [asdict(b) for b in fresh],
                          "days": [{"added": c["added"], **asdict(b), "disk_bytes": d, "full_bytes": f}
                                   for c, b, d, f in days]}))
    finally:
        if not args.keep:
            shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
