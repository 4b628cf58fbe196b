"""Benchmark the near-copy audit of an incremental build: verified pairs reused from the build cache.

    .venv/bin/python benchmarks/nearcopy_reuse.py                   # 20,000 files, +1 %, writes the section
    .venv/bin/python benchmarks/nearcopy_reuse.py --files 5000 --no-write

A tree of tiny 24×24 grey PNGs like issue 40's (one entity per 20 files, 1 % exact copies of other
entities' files planted under other entities; each entity a smooth random base, each file its own
noise and a small shift) is built with ``packer build --workers 2`` into one output with one build
cache. Then 1 % new files of new entities are added and the same job is built again (same output,
same cache: the incremental build). With ``--fresh-check`` the grown tree is also built into a
second output with an empty cache (the cold audit of the same inputs; its ``dataset_hash`` must
equal the incremental build's). Reported per build: wall, the near-copy phase's wall (candidate
search plus verification, from the build's ``near copies:`` line), candidate pairs, pairs verified
and pairs reused. Then, on the grown tree's signatures from the cache, the candidate search alone
(:func:`packer.pipeline.nearcopy.candidate_pairs`) and the thumbnails' digests the pair cache
keys on (:func:`packer.pipeline.paircache.thumb_digests`), timed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml
from decode import describe_machine, publish_run  # noqa: E402 - sibling script: one RESULTS.md writer

from packer.pipeline.nearcopy import QUERY_ZOOMS, candidate_pairs, read_signatures
from packer.pipeline.neighborcache import NeighborCache, sample_identities, search_candidates
from packer.pipeline.paircache import thumb_digests
from packer.schemas import schema_defaults

SECTION = "## Near-copy audit of an incremental build: verified pairs reused"
DEFAULT_DATA = Path("/work/bench-data/nearcopy-reuse")
SIZE = 24
PER_ENTITY = 20


def _image(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
    shifted = np.roll(base, tuple(int(v) for v in rng.integers(-1, 2, 2)), axis=(0, 1))
    return np.clip(shifted + rng.normal(0, 12, (SIZE, SIZE)), 0, 255).astype(np.uint8)


def _base(rng: np.random.Generator) -> np.ndarray:
    coarse = rng.uniform(0, 255, (4, 4)).astype(np.float32)
    return np.asarray(cv2.resize(coarse, (SIZE, SIZE), interpolation=cv2.INTER_CUBIC), dtype=np.float32)


def write_files(raw: Path, first_entity: int, files: int, seed: int, copies: float) -> list[list[str]]:
    """``files`` PNGs of entities ``E<first_entity>``...; ``copies`` of them are byte copies of an
    earlier file, under the next entity. Returns the table rows (path, label, entity, timestamp)."""
    rng = np.random.default_rng([seed, first_entity])
    rows: list[list[str]] = []
    written: list[Path] = []
    entity = first_entity
    base = _base(rng)
    for n in range(files):
        if n and n % PER_ENTITY == 0:
            entity += 1
            base = _base(rng)
        rel = f"E{entity:06d}/{n % PER_ENTITY:02d}.png"
        path = raw / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if written and rng.random() < copies:  # an exact copy of another entity's file
            path.write_bytes(written[int(rng.integers(0, max(1, len(written) - PER_ENTITY)))].read_bytes())
        else:
            cv2.imwrite(str(path), _image(rng, base))
        written.append(path)
        rows.append([rel, "abc"[entity % 3], f"E{entity:06d}", "2020-01-01T00:00:00"])
    return rows


def write_table(raw: Path, rows: list[list[str]], append: bool) -> None:
    with open(raw / "labels.csv", "a" if append else "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        if not append:
            out.writerow(["path", "label", "entity", "timestamp"])
        out.writerows(rows)


def job_doc(raw: Path) -> dict[str, Any]:
    return {"name": "tiny", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
            "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 5,
                      "balance": {"accept": True}},
            "transform": {"image": {"size": [SIZE, SIZE], "color": "gray"}},
            "pack": {"format": "webdataset"}, "output": str(raw.parent / "out"), "phi": {"mode": "keep"}}


def build(job: Path, out: Path, cache: Path, workers: int, log: Path) -> dict[str, Any]:
    """One ``packer build`` in a child process: wall, the near-copy line's numbers, dataset_hash."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from packer.console import main; main()", "build", str(job),
                           "--out", str(out), "--cache-dir", str(cache), "--workers", str(workers), "--no-report"],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"packer build failed ({done.returncode}); see {log}")
    near = re.search(r"near copies: (\d+) candidate pairs, (\d+) verified, (\d+) reused from the build cache, "
                     r"(\d+) of \d+ samples' neighbour lists reused, (\d+) links \(([\d.]+)s\)", done.stdout)
    if near is None:
        raise RuntimeError(f"no 'near copies:' line in {log}")
    manifests = sorted(out.glob("tiny/*/manifest.json"), key=lambda p: p.stat().st_mtime)
    manifest = json.loads(manifests[-1].read_text())
    progress = [line for line in done.stderr.splitlines() if line.lstrip().startswith("nearcopy:")]
    return {"wall_s": round(wall, 1), "candidates": int(near[1]), "verified": int(near[2]), "reused": int(near[3]),
            "lists_reused": int(near[4]), "links": int(near[5]), "near_s": float(near[6]),
            "dataset_hash": manifest["dataset_hash"],
            "samples": manifest["inputs"]["samples"], "nearcopy_progress_lines": len(progress)}


def search_alone(cache: Path, root: Path) -> dict[str, Any]:
    """The candidate search and the thumbnails' digests, alone, on the signatures in ``cache``."""
    files = sorted(str(p) for p in cache.glob("*/*.sig.npy"))
    started = time.perf_counter()
    for name in files:
        thumb_digests(name)
    digests_s = time.perf_counter() - started
    embeddings = np.concatenate([np.asarray(read_signatures(Path(name))["embedding"]) for name in files])
    # one group per 20 rows, not the samples' entities (the rows are in chunk order): right for timing only
    groups = np.arange(len(embeddings)) // PER_ENTITY
    k = schema_defaults("job")["split.near_duplicates.neighbors"]
    started = time.perf_counter()
    found = candidate_pairs(embeddings, groups, k)
    search_s = time.perf_counter() - started
    # the neighbour-list cache: lists of a tree without the last 1% of rows and with 0.5% more (later
    # removed), then the whole tree searched from them; checked against the full search
    n = len(embeddings)
    gone = np.arange(n // 200) * 200 + 7
    extra = np.concatenate([embeddings, embeddings[gone, ::-1]])  # rows n...: removed since, other vectors
    every_group = np.concatenate([groups, groups[gone] + 10**6])
    keys = [f"{row:09d}" for row in range(len(extra))]
    entities = [str(g) for g in every_group.tolist()]
    cache = NeighborCache.open(root, k)  # no file there: empty
    timings = {}
    before = np.r_[np.arange(n - n // 100), n + np.arange(len(gone))]
    for name, rows in (("fresh", before), ("incremental", np.arange(n))):
        view = extra[rows]

        def rows_of(z: int, s: slice, view: np.ndarray = view) -> np.ndarray:
            return view[s, z]
        started = time.perf_counter()
        ids = sample_identities([keys[r] for r in rows], [entities[r] for r in rows], rows_of)
        got = search_candidates(rows_of, every_group[rows], k, ids, cache)
        timings[name] = round(time.perf_counter() - started, 1)
        assert cache.fresh is not None
        cache.rows = cache.fresh
    same = bool(np.array_equal(got.i, found.i) and np.array_equal(got.j, found.j)
                and np.array_equal(got.similarity, found.similarity))
    return {"signatures": n, "zooms": len(QUERY_ZOOMS), "search_s": round(search_s, 1),
            "search_pairs": len(found), "digests_s": round(digests_s, 2), "lists_fresh_s": timings["fresh"],
            "lists_incremental_s": timings["incremental"], "lists_reused": cache.reused,
            "incremental_equals_full": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fresh-check", action="store_true", help="also build the grown tree cold, elsewhere")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    root = args.data / f"n{args.files}"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    raw = root / "raw"
    rows = write_files(raw, 1, args.files, seed=1, copies=0.01)
    write_table(raw, rows, append=False)
    job = root / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc(raw)))
    first = build(job, root / "out", root / "cache", args.workers, root / "build1.log")
    added = max(1, args.files // 100)
    write_table(raw, write_files(raw, args.files // PER_ENTITY + 10, added, seed=2, copies=0.0), append=True)
    second = build(job, root / "out", root / "cache", args.workers, root / "build2.log")
    cold = (build(job, root / "out-cold", root / "cache-cold", args.workers, root / "build3.log")
            if args.fresh_check else None)
    alone = search_alone(root / "cache", root)
    record = {"machine": describe_machine(), "files": args.files, "added": added, "fresh": first,
              "incremental": second, "cold_of_grown": cold, "search_alone": alone}
    lines = [f"`benchmarks/nearcopy_reuse.py --files {args.files}`: {args.files:,} tiny {SIZE}×{SIZE} grey PNGs "
             f"(one entity per {PER_ENTITY} files, 1% exact copies under other entities), `packer build --workers "
             f"{args.workers}`; then {added:,} new files of new entities added and the same job built again (same "
             "output, same build cache). One run on a shared, busy machine.", "",
             "| build | samples | wall | near copies (search + verify) | candidate pairs | verified | reused | links |",
             "|---|---|---|---|---|---|---|---|"]
    for name, run in (("fresh", first), ("incremental (+1%)", second), ("cold, grown tree", cold)):
        if run is not None:
            lines.append(f"| {name} | {run['samples']:,} | {run['wall_s']:.1f} s | {run['near_s']:.1f} s | "
                         f"{run['candidates']:,} | {run['verified']:,} | {run['reused']:,} | {run['links']:,} |")
    lines += ["", f"Alone, on the grown tree's {alone['signatures']:,} signatures: the candidate search "
                  f"{alone['search_s']:.1f} s, the thumbnails' digests "
                  f"{alone['digests_s']:.2f} s. With the neighbour-list cache: the search of the tree less its last "
                  f"1% (plus 0.5% since removed) {alone['lists_fresh_s']:.1f} s, then the whole tree from its lists "
                  f"{alone['lists_incremental_s']:.1f} s ({alone['lists_reused']:,} samples' lists reused; "
                  f"the same pairs and similarities as the full search: {alone['incremental_equals_full']})."]
    if cold is not None:
        lines.append(f"dataset_hash incremental == cold: {second['dataset_hash'] == cold['dataset_hash']}.")
    publish_run(SECTION, "\n".join(lines), started, record=record, write=not args.no_write)


if __name__ == "__main__":
    main()
