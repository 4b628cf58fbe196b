"""Benchmark the near-copy verification alone (issue 40): candidates per sample, verification CPU seconds per sample.

    .venv/bin/python benchmarks/nearcopy_verify.py trees                  # write the three trees
    .venv/bin/python benchmarks/nearcopy_verify.py capture p300           # pixel pass + search, inputs kept
    .venv/bin/python benchmarks/nearcopy_verify.py time p300              # verification in this process
    .venv/bin/python benchmarks/nearcopy_verify.py profile p300           # where a pair's time goes
    .venv/bin/python benchmarks/nearcopy_verify.py build p300 OUT         # packer build: dataset_hash, leakage.json
    .venv/bin/python benchmarks/nearcopy_verify.py margins p300 --evidence E.npz  # first stage vs full evidence

Trees (under ``--data``): ``p300`` and ``p3000`` are :func:`packer.demo.write_copies_tree` at 300
and 3,000 patients with 90 planted copies (the near-copy benchmark's trees, its job); ``tiny``
is 20,000 24×24 grey PNGs like issue 40's (one entity per 20 files; 1 % exact copies under other
entities, and 20 resized and 20 JPEG q75 copies of other entities' files).

``capture`` runs the stages through the audit on a local cluster (2 workers) with a build cache,
and keeps what :func:`packer.pipeline.nearcopy.find_near_links` was given (signature files, rows,
groups, settings) and its candidates. ``time`` answers the same question again in this one
process (``--scheduler sync``'s path, no pair cache): the candidates are read back, not searched,
so the seconds are the verification's alone (process CPU time; pin it with ``taskset -c 0``).
It prints one JSON line: candidates, links, a digest of the links' pairs, evidence and rivals
(equal digests: equal links with equal evidence), and the CPU seconds. The code measured is the
``packer`` that Python imports: run it under ``PYTHONPATH=<another checkout>`` for another version.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

DEFAULT_DATA = Path("/work/bench-data/nearcopy-verify")
TINY_FILES = 20_000
TINY_SIZE = 24
PER_ENTITY = 20


def _tiny_base(rng: np.random.Generator) -> np.ndarray:
    coarse = rng.uniform(0, 255, (4, 4)).astype(np.float32)
    return np.asarray(cv2.resize(coarse, (TINY_SIZE, TINY_SIZE), interpolation=cv2.INTER_CUBIC), dtype=np.float32)


def write_tiny_tree(raw: Path, files: int = TINY_FILES, seed: int = 40) -> dict[str, int]:
    """Issue 40's tree: ``files`` 24×24 grey PNGs, entity ``E<n>`` per 20 files (a smooth random
    base, each file its own noise and a shift of up to a pixel); 1 % of the files are byte copies of
    another entity's earlier file, and 20 each are that file resized (to 30×30 or 20×20, the job
    resizes back) or re-encoded as JPEG q75. Writes ``labels.csv``. Returns the copies planted."""
    rng = np.random.default_rng(seed)
    rows: list[str] = ["path,label,entity,timestamp"]
    written: list[tuple[str, np.ndarray]] = []
    planted = {"exact": 0, "resized": 0, "jpeg75": 0}
    base = _tiny_base(rng)
    entity = 1
    for n in range(files):
        if n and n % PER_ENTITY == 0:
            entity += 1
            base = _tiny_base(rng)
        stem = f"E{entity:06d}/{n % PER_ENTITY:02d}"
        draw = rng.random()
        if written and draw < 0.012:
            source_rel, source = written[int(rng.integers(0, max(1, len(written) - PER_ENTITY)))]
            kind = "exact"
            if draw >= 0.01:  # 0.2 % of the files: a resized or JPEG copy while fewer than 20 of it
                preferred = ("resized", "jpeg75") if draw < 0.011 else ("jpeg75", "resized")
                kind = next((k for k in preferred if planted[k] < 20), "exact")
            planted[kind] += 1
            if kind == "exact":
                image, suffix, params = source, ".png", []
            elif kind == "resized":
                side = 30 if planted["resized"] % 2 else 20
                image = cv2.resize(source, (side, side), interpolation=cv2.INTER_AREA)
                suffix, params = ".png", []
            else:
                image, suffix, params = source, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 75]
        else:
            shift = tuple(int(v) for v in rng.integers(-1, 2, 2))
            image = np.clip(np.roll(base, shift, axis=(0, 1)) + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
            suffix, params = ".png", []
            written.append((stem + suffix, image))
        path = raw / (stem + suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        ok, data = cv2.imencode(suffix, image, params)
        if not ok:
            raise RuntimeError(f"OpenCV could not encode {path}")
        path.write_bytes(data.tobytes())
        rows.append(f"{stem + suffix},{'abc'[entity % 3]},E{entity:06d},2020-01-01T00:00:00")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return planted


def tiny_job(raw: Path, out: Path) -> dict[str, Any]:
    return {"name": "tiny", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
            "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 5,
                      "balance": {"accept": True}},
            "transform": {"image": {"size": [TINY_SIZE, TINY_SIZE], "color": "gray"}},
            "pack": {"format": "webdataset"}, "output": str(out), "phi": {"mode": "keep"}}


def write_trees(data: Path, names: list[str]) -> None:
    from nearcopy import job_doc  # noqa: PLC0415 - sibling script: the near-copy benchmark's job

    from packer.demo import COPY_KINDS, write_copies_tree

    for name in names:
        root = data / name
        started = time.perf_counter()
        if name == "tiny":
            planted: Any = write_tiny_tree(root / "raw")
            doc = tiny_job(root / "raw", root / "out")
        else:
            patients = int(name[1:])
            tree = write_copies_tree(root / "raw", patients=patients, copies=min(patients, 10 * len(COPY_KINDS)))
            planted = len(tree.copies)
            doc = job_doc(root / "raw", root / "out")
        (root / "job.yaml").write_text(yaml.safe_dump(doc))
        print(f"{name}: planted {planted}, {time.perf_counter() - started:.0f} s", flush=True)


def capture(data: Path, name: str, workers: int) -> None:
    """Run the stages through the audit; keep find_near_links' inputs and candidates in ``capture.npz``."""
    from packer.config import load_job
    from packer.pipeline import split
    from packer.pipeline.cluster import open_executor
    from packer.pipeline.stages import run_stages

    root = data / name
    seen: dict[str, Any] = {}
    original = split.find_near_links

    def spy(files: Any, file_of: np.ndarray, row_of: np.ndarray, groups: np.ndarray, **kw: Any) -> Any:
        search = kw.get("search")

        def kept(embeddings: Any, groups: np.ndarray, k: int) -> Any:
            from packer.pipeline.nearcopy import candidate_pairs

            found = search(embeddings, groups, k) if search is not None else candidate_pairs(embeddings, groups, k)
            seen["candidates"] = found
            return found
        links = original(files, file_of, row_of, groups, **{**kw, "search": kept})
        seen.update(files=list(files), file_of=file_of, row_of=row_of, groups=groups, neighbors=kw["neighbors"],
                    min_score=kw["min_score"], max_ratio=kw.get("max_ratio"))
        return links

    split.find_near_links = spy
    job = load_job(root / "job.yaml")
    with open_executor(None, workers) as executor:
        started = time.perf_counter()
        prepared = run_stages(job, executor, through="audit", cache_dir=root / "cache", quiet=True).prepared
        took = time.perf_counter() - started
    found = seen["candidates"]
    np.savez(root / "capture.npz", files=np.array(seen["files"]), file_of=seen["file_of"], row_of=seen["row_of"],
             groups=seen["groups"], i=found.i, j=found.j, similarity=found.similarity,
             settings=np.array(json.dumps({k: seen[k] for k in ("neighbors", "min_score", "max_ratio")})))
    print(json.dumps({"tree": name, "samples": len(seen["groups"]), "candidates": len(found),
                      "links": len(prepared.links), "run_stages_s": round(took, 1)}), flush=True)


def load_capture(data: Path, name: str) -> dict[str, Any]:
    got = np.load(data / name / "capture.npz")
    return {"files": [str(f) for f in got["files"]], "file_of": got["file_of"], "row_of": got["row_of"],
            "groups": got["groups"], "i": got["i"], "j": got["j"], "similarity": got["similarity"],
            **json.loads(str(got["settings"]))}


def links_digest(links: Any) -> str:
    """sha256 over the links' pairs, candidate similarity, every evidence field and rival."""
    digest = hashlib.sha256()
    for array in (links.i, links.j, links.similarity, links.rival if links.rival is not None else np.zeros(0),
                  *(getattr(links.evidence, f) for f in ("structure", "detail", "intensity", "zoom", "dy", "dx"))):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def time_verification(data: Path, name: str, evidence_to: Path | None = None) -> None:
    """find_near_links on the captured inputs, its verification run here; one JSON line. With
    ``evidence_to``, every candidate's evidence from the first round of tasks (before the rival
    test asks for more) is saved there (npz, candidate order)."""
    import packer
    from packer.pipeline import nearcopy
    from packer.pipeline.split import verify_in_process

    cap = load_capture(data, name)
    candidates = nearcopy.Candidates(cap["i"], cap["j"], cap["similarity"])
    pairs = 0
    rounds: list[dict[int, Any]] = []

    def run(tasks: Any) -> Any:
        nonlocal pairs
        for task in tasks:
            pairs += len(task.a_file)
        rounds.append({})
        for task, evidence in verify_in_process(tasks):
            rounds[-1][task.index] = evidence
            yield task, evidence

    cpu, wall = time.process_time(), time.perf_counter()
    links = nearcopy.find_near_links(cap["files"], cap["file_of"], cap["row_of"], cap["groups"],
                                     neighbors=cap["neighbors"], min_score=cap["min_score"], run=run,
                                     max_ratio=cap["max_ratio"], search=lambda e, g, k: candidates)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    n = len(cap["groups"])
    first = nearcopy.EvidenceArrays.concat([rounds[0][t] for t in sorted(rounds[0])])
    if evidence_to is not None:
        fields = ("structure", "detail", "intensity", "zoom", "dy", "dx")
        np.savez(evidence_to, **{f: getattr(first, f) for f in fields})
    print(json.dumps({"tree": name, "code": str(Path(packer.__file__).parent.parent), "samples": n,
                      "candidates": len(candidates), "candidates_per_sample": round(len(candidates) / n, 2),
                      "pairs_run": pairs, "turned_away": int((first.zoom == 0).sum()),
                      "links": len(links), "links_digest": links_digest(links),
                      "verify_cpu_s": round(cpu, 2), "verify_wall_s": round(wall, 2),
                      "verify_cpu_ms_per_sample": round(1000 * cpu / n, 3)}), flush=True)


def build(data: Path, name: str, out: Path, cache: Path, workers: int) -> None:
    """``packer build`` of the tree into ``out`` with the build cache ``cache``: its dataset_hash
    and the sha256 of its leakage.json, one JSON line."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from packer.console import main; main()", "build",
                           str(data / name / "job.yaml"), "--out", str(out), "--cache-dir", str(cache),
                           "--workers", str(workers), "--no-report"], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    (out.parent / f"{out.name}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"packer build failed ({done.returncode}): {done.stderr[-2000:]}")
    manifest_path = max(out.glob("*/*/manifest.json"), key=lambda p: p.stat().st_mtime)
    manifest = json.loads(manifest_path.read_text())
    leakage = manifest_path.parent / "leakage.json"
    near = [line for line in done.stdout.splitlines() if "near copies:" in line]
    print(json.dumps({"tree": name, "out": str(out), "wall_s": round(wall, 1), "dataset_hash": manifest["dataset_hash"],
                      "leakage_sha256": hashlib.sha256(leakage.read_bytes()).hexdigest()[:16]
                      if leakage.exists() else None, "near": near}), flush=True)


def profile(data: Path, name: str, pairs: int) -> None:
    """Where a pair's verification time goes, on ``pairs`` candidate pairs of the tree (evenly
    spaced in candidate order), each phase timed alone over all of them (one process)."""
    from packer.pipeline import nearcopy as nc

    cap = load_capture(data, name)
    pick = np.linspace(0, len(cap["i"]) - 1, min(pairs, len(cap["i"]))).astype(np.int64)
    reader = nc._ThumbReader(cap["files"])
    thumb = {}
    for s in np.unique(np.r_[cap["i"][pick], cap["j"][pick]]).tolist():
        thumb[s] = np.array(reader.thumb(int(cap["file_of"][s]), int(cap["row_of"][s])))
    reader.close()
    a_of, b_of = cap["i"][pick].tolist(), cap["j"][pick].tolist()
    floor = max(0.0, cap["min_score"] - nc.REFINE_MARGIN)
    timings: dict[str, float] = {}

    def timed(label: str, fn: Any) -> Any:
        started = time.process_time()
        out = fn()
        timings[label] = round(1e6 * (time.process_time() - started) / len(pick), 1)  # µs a pair
        return out

    prepared = timed("prepare both (no reuse)", lambda: [(nc.Prepared(thumb[a]), nc.Prepared(thumb[b]))
                                                          for a, b in zip(a_of, b_of, strict=True)])
    for zoom in nc._COARSE_ZOOMS:
        timed(f"zoomed fine of b at {zoom}", lambda zoom=zoom: [q.fine_at(zoom) for _, q in prepared])
        timed(f"matchTemplate at {zoom}", lambda zoom=zoom: [
            cv2.minMaxLoc(cv2.matchTemplate(q.fine_at(zoom), p.template, cv2.TM_CCOEFF_NORMED))
            for p, q in prepared])
    timed("verify, floor (prepared)", lambda: [nc.verify(p, q, floor=floor) for p, q in prepared])
    full = timed("verify, no floor (prepared)", lambda: [nc.verify(p, q) for p, q in prepared])
    fresh = [(nc.Prepared(thumb[a]), nc.Prepared(thumb[b])) for a, b in zip(a_of, b_of, strict=True)]
    floored = timed("verify, floor (fresh Prepared)", lambda: [nc.verify(p, q, floor=floor) for p, q in fresh])
    refined = sum(1 for e in floored if e.detail != 0.0)
    print(json.dumps({"tree": name, "pairs": len(pick), "refined": refined, "us_per_pair": timings,
                      "score_ge_floor": sum(1 for e in full if e.score >= floor)}), flush=True)


def margins(data: Path, name: str, evidence: Path) -> None:
    """The first stage's value (:func:`packer.pipeline.nearscreen.screen_values`) of every candidate
    pair of the tree against its full evidence (``evidence``: saved by ``time --evidence`` with
    the code before the first stage): the lowest value of a pair that reached ``structure`` 0.6
    or the decision, and how the others spread. One JSON line."""
    from packer.pipeline import nearcopy, nearscreen

    cap = load_capture(data, name)
    full = np.load(evidence)
    score = np.where(full["structure"] >= nearcopy.MIN_STRUCTURE, full["intensity"].astype(np.float64), 0.0)
    reader = nearcopy._ThumbReader(cap["files"])
    values = np.empty(len(cap["i"]))
    try:
        for lo in range(0, len(values), 4096):
            stacks = [np.stack([reader.thumb(int(cap["file_of"][s]), int(cap["row_of"][s]))
                                for s in side[lo:lo + 4096]]) for side in (cap["i"], cap["j"])]
            index = np.arange(len(stacks[0]))
            values[lo:lo + 4096] = nearscreen.screen_values(stacks[0], stacks[1], index, index)
    finally:
        reader.close()
    structured, decided = full["structure"] >= nearcopy.MIN_STRUCTURE, score >= cap["min_score"]
    rest = values[~decided]
    print(json.dumps({"tree": name, "pairs": len(values), "structure_ge_0.6": int(structured.sum()),
                      "min_value_structure_ge_0.6": round(float(values[structured].min()), 4)
                      if structured.any() else None,
                      "passed_min_score": int(decided.sum()),
                      "min_value_passed": round(float(values[decided].min()), 4) if decided.any() else None,
                      "others_p50_p90_p99_max": np.percentile(rest, [50, 90, 99, 100]).round(4).tolist(),
                      "turned_away": round(float(np.mean(values < nearscreen.SCREEN_MIN)), 4)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["trees", "capture", "time", "profile", "build", "margins"])
    parser.add_argument("tree", nargs="?", default="p300,p3000,tiny")
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3000, help="pairs profiled (profile)")
    parser.add_argument("--cache", type=Path, help="build cache folder (build)")
    parser.add_argument("--evidence", type=Path, help="save the candidates' first-round evidence here (time)")
    args = parser.parse_args()
    if args.what == "trees":
        write_trees(args.data, args.tree.split(","))
    elif args.what == "capture":
        capture(args.data, args.tree, args.workers)
    elif args.what == "time":
        time_verification(args.data, args.tree, args.evidence)
    elif args.what == "profile":
        profile(args.data, args.tree, args.pairs)
    elif args.what == "margins":
        if args.evidence is None:
            parser.error("margins needs --evidence (saved by time --evidence with the code before the first stage)")
        margins(args.data, args.tree, args.evidence)
    else:
        if args.out is None or args.cache is None:
            parser.error("build needs OUT and --cache")
        build(args.data, args.tree, args.out, args.cache, args.workers)


if __name__ == "__main__":
    main()
