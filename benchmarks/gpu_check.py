"""One prepared run of packer's CUDA paths, for a machine with a GPU (issue 21's GPU paragraph).

Usage (repository root; the dataset built beforehand, here or elsewhere, and carried along):

    python benchmarks/gpu_check.py --manifest build/gpu/<name>/<version> --out OUT_DIR
    python benchmarks/gpu_check.py --manifest build/demo/<version> --out /tmp/gpu --device cpu   # dry run

It runs three steps, each in its own process with its own time limit, and keeps going when one
fails (its error is recorded):

1. ``loader``: :func:`packer.loader.bench.bench_loader` on ``--device``: samples/s by
   ``num_workers`` and ``pin_memory``, the data-wait share of a small step fed by
   ``DevicePrefetcher`` (its side stream on CUDA) and, on CUDA, the host→device copy of a
   pinned batch (ms and GB/s, timed with CUDA events); with ``--verify sample,off`` (the
   default) also the per-sample read check's cost against none, in interleaved rounds.
2. ``train``: ``examples/train.py`` for ``--epochs`` in one process on ``--device``.
3. ``ddp``: the same under ``torch.distributed.run`` with one process per GPU (at least one),
   so ``init_process_group`` takes NCCL on CUDA (gloo on the CPU dry run) and the model is
   wrapped in DistributedDataParallel.

It writes ``OUT_DIR/gpu_check.json`` (every number and each step's outcome), ``gpu_check.md``
(the tables, with the machine: GPU, driver, torch and CUDA versions, CPU cores) and each
step's log. Nothing is asserted and no number is compared here: the figures go into
``benchmarks/RESULTS.md`` by hand, with the machine.

Only the loader is needed on the GPU machine, not the build: it imports torch, numpy, fsspec,
PyYAML and jsonschema (with referencing, jsonschema-specifications and rpds-py); carry those
that machine lacks as wheels, and the built dataset as files (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine(device: str) -> dict[str, Any]:
    """What the run ran on: host, CPU cores, Python, torch, CUDA and the GPU (nvidia-smi's line)."""
    import torch

    info: dict[str, Any] = {"host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
                            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "device": device,
                            "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        query = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        info["nvidia_smi"] = query.stdout.strip() or query.stderr.strip()
    return info


def run_step(name: str, command: list[str], out: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run one step's command, its output to ``out/<name>.log``; its outcome, never raising."""
    log = out / f"{name}.log"
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
            code: int | str = done.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout:.0f} s"
    outcome = {"step": name, "command": command, "exit": code, "seconds": round(time.perf_counter() - started, 2),
               "log": log.name}
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
    outcome["log_tail"] = tail
    return outcome


def loader_step(args: argparse.Namespace) -> None:
    """Step 1, in its own process: bench_loader on the device, the JSON to ``--result``."""
    from packer.loader.bench import bench_loader, format_table

    result = bench_loader(args.manifest, args.split, device=args.device, workers=(0, 1, 2, 4),
                          batch_sizes=(args.batch_size,), seconds=args.seconds,
                          verify=tuple(args.verify.split(",")), rounds=args.rounds)
    Path(args.result).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    table = format_table(result)
    Path(args.result).with_suffix(".txt").write_text(table + "\n", encoding="utf-8")
    print(table)


def markdown(report: dict[str, Any]) -> str:
    """``gpu_check.md``: the machine, each step's outcome and the loader benchmark's table."""
    m = report["machine"]
    lines = ["# packer GPU check", "",
             f"Machine: {m.get('nvidia_smi') or m.get('gpu') or 'no GPU'}; {m['cpu_count']} CPU cores; Python "
             f"{m['python']}; torch {m['torch']} (CUDA {m['torch_cuda']}); device {m['device']}.", "",
             "| step | exit | seconds |", "|---|---|---:|"]
    lines += [f"| {s['step']} | {s['exit']} | {s['seconds']} |" for s in report["steps"]]
    if report.get("loader_table"):  # the loader benchmark's own table, as `packer bench-loader` prints it
        lines += ["", "Loader benchmark:", "", "```", report["loader_table"].rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", required=True, help="manifest.json or the dataset version folder")
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_check.json, gpu_check.md, logs")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0, help="each loader measurement's length")
    parser.add_argument("--verify", default="sample,off",
                        help="the loader's verify modes, comma-separated; with two or more the loader step compares "
                             "them (issue 38's per-sample check against none), default sample,off")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the verify comparison")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of each training step")
    parser.add_argument("--step-timeout", type=float, default=240.0, help="each step's time limit, seconds")
    parser.add_argument("--loader-step", action="store_true", help=argparse.SUPPRESS)  # step 1's own process
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loader_step:
        loader_step(args)
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    import torch

    gpus = torch.cuda.device_count() if args.device.startswith("cuda") else 0
    bench_json = out / "loader.json"
    train = [sys.executable, "examples/train.py", "--manifest", str(args.manifest), "--split", args.split,
             "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--device", args.device]
    steps = [
        ("loader", [sys.executable, str(Path(__file__).resolve()), "--loader-step", "--manifest", str(args.manifest),
                    "--out", str(out), "--device", args.device, "--split", args.split,
                    "--batch-size", str(args.batch_size), "--seconds", str(args.seconds),
                    "--verify", args.verify, "--rounds", str(args.rounds), "--result", str(bench_json)]),
        ("train", train),
        ("ddp", [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={max(gpus, 1)}",
                 *train[1:]]),
    ]
    report: dict[str, Any] = {"machine": machine(args.device), "steps": []}
    for name, command in steps:
        outcome = run_step(name, command, out, args.step_timeout, env)
        report["steps"].append(outcome)
        print(f"{name}: exit {outcome['exit']} in {outcome['seconds']} s", flush=True)
    if bench_json.exists():  # written by step 1's process: this one never imports packer
        report["loader"] = json.loads(bench_json.read_text(encoding="utf-8"))
        report["loader_table"] = bench_json.with_suffix(".txt").read_text(encoding="utf-8")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    (out / "gpu_check.md").write_text(markdown(report), encoding="utf-8")
    print((out / "gpu_check.md").read_text(encoding="utf-8"))
    return 0 if all(s["exit"] == 0 for s in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
