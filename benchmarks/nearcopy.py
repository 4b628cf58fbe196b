"""Benchmark the near-copy check (packer.pipeline.nearcopy) on similar-anatomy phantoms with planted copies.

    .venv/bin/python benchmarks/nearcopy.py                        # 300 and 3,000 patients, writes the section
    .venv/bin/python benchmarks/nearcopy.py --patients 300 --no-write

For each size, ``packer.demo.write_copies_tree`` writes CT patients of similar anatomy (4 slices
each, 256×256) and 90 planted copies of their slices under other entities (10 of each kind in
``COPY_KINDS``: PNG, JPEG q75, resized 0.9×, shifted (3, 2) px, cropped 5/3 px, lung and bone
windows, and DICOM copies, plain and RLE). The job packs 2-window CT and grey exports at 64×64
(the issue's setting) and runs ``packer.pipeline.stages.run_stages`` (discovery, pixel pass, candidates,
verification, split, audit) on a local dask cluster. Reported per size: recall per copy kind
(copy and source in one split group; linked directly), the near links between different
patients (false links) and their rate per verified candidate pair, groups holding more than one
patient, the split shares, and the time of the whole preparation and of the near-copy stage.
Then the candidate search alone on random unit signatures (no build) at larger sizes, for time
and memory. Nothing is asserted; a planted copy missed or a false link is printed as it is.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from decode import describe_machine, publish_run  # noqa: E402 - sibling script: one RESULTS.md writer

from packer.config import load_job
from packer.demo import COPY_KINDS, write_copies_tree
from packer.pipeline.cluster import open_executor
from packer.pipeline.nearcopy import EMBED_DIM, QUERY_ZOOMS, candidate_pairs
from packer.pipeline.stages import run_stages

SECTION = "## Near copies: precision, recall and scale"
DEFAULT_DATA = Path("/work/bench-data/nearcopy")


def job_doc(raw: Path, out: Path) -> dict[str, Any]:
    return {"name": "copies",
            "sources": [{"kind": "dicom", "root": str(raw / "ct"), "labels": str(raw / "ct_labels.csv")},
                        {"kind": "image", "root": str(raw / "exports"), "table": str(raw / "exports" / "labels.csv")}],
            "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 17,
                      "balance": {"accept": True}},
            "transform": {"dicom": {"windows": ["lung", "mediastinum"], "size": [64, 64]},
                          "image": {"size": [64, 64], "color": "gray"}},
            "pack": {"format": "webdataset"}, "output": str(out), "phi": {"mode": "keep"}}


def one_size(data: Path, patients: int, workers: int) -> dict[str, Any]:
    root = data / f"p{patients}"
    started = time.perf_counter()
    tree = write_copies_tree(root / "raw", patients=patients, copies=min(patients, 10 * len(COPY_KINDS)))
    written = time.perf_counter() - started
    job_file = root / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_doc(root / "raw", root / "out")))
    job = load_job(job_file)
    with open_executor(None, workers) as executor:
        t0 = time.perf_counter()
        prepared = run_stages(job, executor, through="audit", cache_dir=root / "cache", quiet=True).prepared
        total = time.perf_counter() - t0
    table = prepared.samples
    outcome = tree.evaluate(table.column("source"), table.column("relpath"),
                            [g.members for g in prepared.assignment.groups], prepared.links.i.tolist(),
                            prepared.links.j.tolist(), prepared.links.candidates)
    balance = prepared.audit.rule("split_balance").detail
    return {"patients": patients, "samples": len(table), "tree_s": written, "prepare_s": total,
            "near_s": prepared.near_seconds, "outcome": outcome, "shares": balance["shares"],
            "largest_group_share": balance["largest_group_share"]}


def search_scale(sizes: list[int], neighbors: int = 16) -> list[dict[str, Any]]:
    """The candidate search alone on random unit signatures of ``n`` samples (entities of 4),
    made block by block as the build reads them from the signature files (the base whole, the
    other zooms :data:`~packer.pipeline.nearcopy.QUERY_BLOCK` rows at a time)."""
    rows = []
    step = 65536  # QUERY_BLOCK is a multiple: a block of rows is made from whole steps
    for n in sizes:
        def zoom(z: int, part: slice, n: int = n) -> np.ndarray:
            start, stop = part.start or 0, n if part.stop is None else part.stop
            out = np.empty((stop - start, EMBED_DIM), dtype=np.float16)
            for lo in range(start - start % step, stop, step):  # float16 as the signature files hold them
                block = np.random.default_rng([n, z, lo]).standard_normal((min(step, n - lo), EMBED_DIM),
                                                                          dtype=np.float32)
                block /= np.linalg.norm(block, axis=1, keepdims=True)
                a, b = max(lo, start), min(lo + len(block), stop)
                out[a - start:b - start] = block[a - lo:b - lo]
            return out

        groups = np.arange(n) // 4
        tracemalloc.start()
        t0 = time.perf_counter()
        found = candidate_pairs(zoom, groups, neighbors)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows.append({"n": n, "seconds": seconds, "pairs": len(found),
                     "signature_mb": n * len(QUERY_ZOOMS) * EMBED_DIM * 2 / 1e6, "peak_mb": peak / 1e6})
    return rows


def run(data: Path, sizes: list[int], search: list[int], workers: int) -> tuple[str, dict[str, Any]]:
    results = [one_size(data, n, workers) for n in sizes]
    lines = [
        "Similar-anatomy chest phantoms (`packer.demo.write_copies_tree`: every patient its own body plan, "
        "lungs, heart, aorta, vessels; 4 slices of 256×256 each) with 90 planted copies of slices under other "
        "entities, 10 of each kind; packed at 64×64 (CT: lung + mediastinum windows; exports: grey). "
        "`packer.pipeline.stages.run_stages` on a local dask cluster of "
        f"{workers} workers, default `split.near_duplicates` (neighbors 16, min_score 0.984, max_ratio 0.5).",
        "",
        "| patients | samples | copies grouped with their source | linked directly | false links "
        "(different patients) | per verified pair | groups with >1 patient | split train/valid/test | "
        "prepare | of which near copies |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        o = r["outcome"]
        grouped = sum(g for g, _ in o.grouped.values())
        linked = sum(g for g, _ in o.linked.values())
        planted = sum(t for _, t in o.grouped.values())
        shares = "/".join(f"{r['shares'][s]:.1%}" for s in ("train", "valid", "test"))
        rate = o.false_links / o.candidates if o.candidates else 0.0
        lines.append(f"| {r['patients']:,} | {r['samples']:,} | {grouped}/{planted} | {linked}/{planted} | "
                     f"{o.false_links} of {o.near_links} links | {rate:.1e} ({o.candidates:,} verified) | "
                     f"{o.mixed_groups} (largest: {o.largest_mixed} patients) | {shares} | {r['prepare_s']:.0f} s | "
                     f"{r['near_s']:.0f} s |")
    lines += ["", "Per copy kind, grouped / linked (all sizes together):", "",
              "| kind | " + " | ".join(COPY_KINDS) + " |", "|---|" + "---:|" * len(COPY_KINDS)]
    for label, attr in (("grouped", "grouped"), ("linked", "linked")):
        cells = []
        for kind in COPY_KINDS:
            hit = sum(getattr(r["outcome"], attr)[kind][0] for r in results)
            total = sum(getattr(r["outcome"], attr)[kind][1] for r in results)
            cells.append(f"{hit}/{total}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Precision: of the links a copy of each kind made (to its source or to anything else), those that "
              "joined it to its source's patient; `patients`: links between the CT patients' own slices (a slice and "
              "a neighbour of the same patient is no leak; two patients are a false link). All sizes together:", "",
              "| | " + " | ".join([*COPY_KINDS, "patients", "all"]) + " |",
              "|---|" + "---:|" * (len(COPY_KINDS) + 2)]
    cells = []
    for kind in [*COPY_KINDS, "patients"]:
        hit = sum(r["outcome"].precision.get(kind, (0, 0))[0] for r in results)
        total = sum(r["outcome"].precision.get(kind, (0, 0))[1] for r in results)
        cells.append(f"{hit}/{total}")
    hit = sum(h for r in results for h, _ in r["outcome"].precision.values())
    total = sum(t for r in results for _, t in r["outcome"].precision.values())
    cells.append(f"{hit}/{total} ({hit / total:.1%})" if total else "0/0")
    lines.append("| precision | " + " | ".join(cells) + " |")
    scale = search_scale(search)
    lines += ["", "Candidate search alone (`nearcopy.candidate_pairs`: 16 neighbours at the sample's size and 2 at "
              "±6 % zoom; exact up to 30,000 samples, an inverted file of 4·√n clusters with 24 probed above, built "
              "once), random unit signatures (the worst case for the inverted file's clusters), the base zoom in "
              "memory and the others read 131,072 rows at a time:", "",
              "| samples | seconds | pairs | signatures (all zooms, on disk) | peak traced memory |",
              "|---:|---:|---:|---:|---:|"]
    for row in scale:
        lines.append(f"| {row['n']:,} | {row['seconds']:.1f} | {row['pairs']:,} | {row['signature_mb']:.0f} MB | "
                     f"{row['peak_mb']:.0f} MB |")
    machine = describe_machine()
    lines += ["", f"- Machine: {machine['nproc']} cores (nproc), CPU {machine['cpu']}, RAM {machine['ram_gib']} GiB, "
              f"Python {machine['python']}, numpy {machine['numpy']}, OpenCV {machine['opencv']}. "
              f"Date: {machine['date']}.",
              f"- Reproduce: `.venv/bin/python benchmarks/nearcopy.py --patients {','.join(map(str, sizes))} "
              f"--search {','.join(map(str, search))}`."]
    record = {"sizes": [{k: (vars(v) if k == "outcome" else v) for k, v in r.items()} for r in results],
              "search": scale, "median_prepare_s": statistics.median(r["prepare_s"] for r in results)}
    return "\n".join(lines), record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", default="300,3000", help="tree sizes in patients (default 300,3000)")
    parser.add_argument("--search", default="10000,50000", help="sizes for the candidate search alone")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"input folder (default {DEFAULT_DATA})")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = parser.parse_args()
    start = time.perf_counter()
    body, record = run(args.data, [int(v) for v in args.patients.split(",")],
                       [int(v) for v in args.search.split(",") if v], args.workers)
    publish_run(SECTION, body, start, record=record, write=not args.no_write)


if __name__ == "__main__":
    main()
