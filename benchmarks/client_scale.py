"""The client stages of a build alone, at 1M and 10M sample records (issue 40, measure 1).

No pixel is decoded: the script makes the records a pixel pass would hand the client (one
``SpilledSample`` per slice, entities of ``--per-entity`` slices, ``--copies`` of the samples
exact copies of a sample of another entity, labels from five classes) and runs on them, in
order and in this one process, what ``packer build`` runs on its client after the pixel pass:
the sort by key, the split (duplicate groups, entity groups, assignment), the leakage audit,
the shard plan, the index and splits tables. Near-copy search is off (``near_duplicates:
{enabled: false}``): its candidate search and verification are measured by
``benchmarks/nearcopy.py``. For each stage it prints wall seconds and the process's peak RSS
during the stage (``/proc/self/clear_refs`` resets the high-water mark before each), and at the
end the RSS held by the records themselves.

    .venv/bin/python benchmarks/client_scale.py --samples 1000000 10000000

Each size runs in a fresh process (``--one N`` is that child), so one size's allocator state
does not carry into the next. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CLASSES = ("normal", "nodule", "mass", "effusion", "other")


def _status(field: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")   # resets VmHWM to the current RSS (Linux ≥ 4.0)


def _job(folder: Path) -> Any:
    from packer.config import parse_job

    (folder / "raw").mkdir(exist_ok=True)
    doc = {"name": "client-scale",
           "sources": [{"kind": "dicom", "root": "raw", "label": {"attribute": "StudyDescription"}}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 0,
                     "near_duplicates": {"enabled": False}},
           "pack": {"format": "webdataset"}, "output": "out", "phi": {"mode": "keep"}}
    return parse_job(doc, folder / "job.yaml")


def make_records(n: int, per_entity: int, copies: float, seed: int = 0) -> Any:
    """``n`` records as the pixel pass settles them, in a :class:`SampleTable` (built record by
    record through the same builder the pixel pass uses)."""
    from packer.pipeline.sampletable import SampleTable, TableBuilder
    from packer.records import SampleRef, SpilledSample

    rng = np.random.default_rng(seed)
    digests = rng.integers(0, 2**63, size=n, dtype=np.int64)
    entities = -(-n // per_entity)
    # a planted copy is a whole scan exported again under another id: its slices repeat the
    # pixels of another entity's slices (where that entity has as many)
    copied = rng.random(entities) < copies
    original = (np.arange(entities) + 1 + rng.integers(0, max(entities - 1, 1), size=entities)) % entities
    labels = rng.integers(0, len(CLASSES), size=n)
    builder: Any = TableBuilder(SampleTable)
    for i in range(n):
        entity = i // per_entity
        source = int(original[entity]) * per_entity + i % per_entity
        digest = int(digests[source] if copied[entity] and source < n else digests[i])
        sha = f"{digest:016x}" * 4
        sample_id = f"{(i * 2654435761) % (1 << 48):012x}"
        rel = f"E{entity:07d}/S1/IM{i % per_entity:04d}.dcm"
        ref = SampleRef(sample_id=sample_id, source="raw", kind="dicom", path=f"/data/raw/{rel}", relpath=rel,
                        label=CLASSES[labels[i]], entity=f"E{entity:07d}", time=None)
        builder.append(SpilledSample(key=f"{sample_id}-s0000", ref=ref, spill=f"chunk-{i // 2000:06d}.spill",
                                     offset=(i % 2000) * 197_000, pixel_bytes=196_608, meta_bytes=380,
                                     shape=(3, 256, 256), dtype="uint8", sha256=sha,
                                     meta_sha256=f"{(digest ^ 0x5A5A) & ((1 << 63) - 1):016x}" * 4,
                                     pixels_xxh3=digest & ((1 << 63) - 1)))
    return builder.finish(release=True)  # as the pixel pass hands its records over


def run_one(n: int, per_entity: int, copies: float) -> dict[str, Any]:
    from packer.phi import pseudonymizer_for
    from packer.pipeline.audit import audit_assignment
    from packer.pipeline.build import IndexFields, TargetColumns
    from packer.pipeline.labels import dataset_target
    from packer.pipeline.plan import plan_shards
    from packer.pipeline.publish import IndexColumns, write_index, write_splits_table
    from packer.pipeline.split import assign_splits, split_codes
    from packer.shards.writer import ShardWrite

    stages: list[dict[str, Any]] = []
    base_rss = _status("VmRSS")

    def stage(name: str, work: Any) -> Any:
        gc.collect()
        _reset_peak()
        before = _status("VmRSS")
        started = time.perf_counter()
        result = work()
        seconds = time.perf_counter() - started
        stages.append({"stage": name, "seconds": round(seconds, 2),
                       "peak_rss_mib": round(_status("VmHWM") / 2**20, 1),
                       "rss_before_mib": round(before / 2**20, 1), "rss_after_mib": round(_status("VmRSS") / 2**20, 1)})
        print(f"  {n:>10,} {name:<28} {seconds:8.2f} s   peak {stages[-1]['peak_rss_mib']:8.1f} MiB", flush=True)
        return result

    with tempfile.TemporaryDirectory(prefix="client-scale-", dir=str(args_dir)) as tmp:
        folder = Path(tmp)
        job = _job(folder)
        table = stage("records (pixel pass's output)", lambda: make_records(n, per_entity, copies))
        samples = stage("sort by key", functools.partial(table.sorted_by_key, release=True))  # as stages.py
        del table
        records_rss = _status("VmRSS") - base_rss
        cfg = job.split
        assignment = stage("split", lambda: assign_splits(samples, cfg, None, quiet=True))
        audit = stage("audit", lambda: audit_assignment(samples, assignment, cfg, None, quiet=True))
        shards = stage("shard plan", lambda: plan_shards(samples, split_codes(samples, assignment.split), job.pack,
                                                         dataset_target(job, samples.codes("label")[1]),
                                                         raw_paths=job.phi.mode == "keep"))  # as stages.py

        def index() -> None:
            target = dataset_target(job, samples.codes("label")[1])
            targets = TargetColumns.of(samples, target)
            columns = IndexColumns(targets.index_schema(), spill=folder / "index.arrow.partial")  # as build.py
            fields = IndexFields.of(samples)  # as build.py
            for k, shard in enumerate(shards):
                count = len(shard.rows)
                written = ShardWrite(file=f"{shard.split}-{k:06d}.tar", bytes=count * 197_376, sha256="0" * 64,
                                     positions=array("q", range(0, count * 197_376, 197_376)),
                                     sizes=array("q", [196_736] * count), digests=bytes(32 * count),
                                     checksums=array("Q", range(count)))
                keys, entity_ids, sources = fields.of_rows(shard.rows)
                columns.add_shard(written, split=shard.split, keys=keys, labels=targets.index_labels(shard.rows),
                                  entity_ids=entity_ids, sources=sources, targets=targets.index_targets(shard.rows))
            write_index(folder, columns)

        stage("index table", index)
        phi = pseudonymizer_for(job.phi)
        stage("splits table", lambda: write_splits_table(folder, samples, assignment, phi))
        found = {"groups": len(assignment.groups), "largest_group": max(g.size for g in assignment.groups),
                 "shards": len(shards), "audit_failed": bool(audit.failed),
                 "splits": {s: assignment.split_counts().get(s, 0) for s in ("train", "valid", "test")}}
    return {"samples": n, "per_entity": per_entity, "copies": copies, "stages": stages,
            "records_rss_mib": round(records_rss / 2**20, 1),
            "records_bytes_per_sample": round(records_rss / n, 1),
            "peak_rss_mib": max(s["peak_rss_mib"] for s in stages), "found": found}


args_dir = Path(tempfile.gettempdir())


def main() -> None:
    global args_dir
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--per-entity", type=int, default=200, help="slices per entity (a CT scan)")
    parser.add_argument("--copies", type=float, default=0.01,
                        help="share of entities that copy another entity's slices")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the index and splits tables are written (then removed)")
    parser.add_argument("--json", type=Path, help="append each size's result here as a JSON line")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args_dir = args.work
    if args.one is not None:
        from packer.allocator import system_arrow_pool, tune_client_allocator

        tune_client_allocator()  # the client's allocator settings, as packer build makes them
        with system_arrow_pool():
            result = run_one(args.one, args.per_entity, args.copies)
        print("RESULT " + json.dumps(result), flush=True)
        return
    for n in args.samples:
        print(f"{n:,} samples, {args.per_entity} per entity, {args.copies:.0%} copies:", flush=True)
        done = subprocess.run([sys.executable, __file__, "--one", str(n), "--per-entity", str(args.per_entity),
                               "--copies", str(args.copies), "--work", str(args.work)],
                              capture_output=True, text=True, check=False)
        sys.stdout.write("".join(line + "\n" for line in done.stdout.splitlines() if not line.startswith("RESULT ")))
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"the {n:,}-sample run exited {done.returncode}")
        result = json.loads(next(line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")))
        print(f"  records held: {result['records_rss_mib']} MiB ({result['records_bytes_per_sample']} B a sample); "
              f"peak {result['peak_rss_mib']} MiB; {json.dumps(result['found'])}", flush=True)
        if args.json is not None:
            with args.json.open("a", encoding="utf-8") as out:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
