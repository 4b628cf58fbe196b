"""``packer bench-loader``: measure where input throughput goes, one variable at a time."""

from __future__ import annotations

import json
from pathlib import Path

import click

from packer.commands import exits, local_folder_argument

#: An example value of each list option, as its help gives them (--batch-sizes takes no 0)
_EXAMPLES = {"--workers": "0,1,2", "--batch-sizes": "32,64"}


def _ints(text: str, option: str) -> tuple[int, ...]:
    example = _EXAMPLES.get(option, "1,2")
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as err:
        raise click.BadParameter(f"{text!r}: expected comma-separated integers, e.g. {example}",
                                 param_hint=option) from err
    if not values:
        raise click.BadParameter(f"{text!r}: give at least one value, e.g. {example}", param_hint=option)
    return values


@click.command("bench-loader")
@click.argument("manifest_arg", metavar="MANIFEST")
@click.option("--split", default="train", show_default=True, help="Which split's shards to read.")
@click.option("--device", default="cpu", show_default=True,
              help="cpu, or cuda, mps or xpu to also time host→device copies and data-wait vs compute (a "
                   "device this machine has: any other is refused before measuring, exit 2).")
@click.option("--workers", default="0,1,2", show_default=True, help="DataLoader num_workers values to try.")
@click.option("--batch-sizes", default="32", show_default=True, help="Batch sizes to try.")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True,
              help="Time budget per measurement (more than 0).")
@click.option("--sources", metavar="NAME[,NAME]",
              help="Measure a view of these sources only (their samples found in _index.parquet, the others "
                   "never read), e.g. --sources ct.")
@click.option("--collate", type=click.Choice(["stack", "list", "pad"]),
              help="How batches are made: stack (one B×C×H×W tensor), list (a list of tensors, any shapes) or pad "
                   "(padded to the largest height and width). Default: stack when the samples have one shape, "
                   "list when they have several (the table says so).")
@click.option("--verify", "verify", default="sample", show_default=True, metavar="MODE[,MODE]",
              help="ShardDataset verify mode(s): off, sample (every sample's checksum) or shard (every shard's "
                   "sha256). Several (e.g. off,sample) also compare them: decode and loader samples/s per mode, "
                   "interleaved over --rounds rounds, medians and each mode's cost against the first.")
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True,
              help="Interleaved rounds when --verify names several modes.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JSON to this file.")
@exits
def bench_loader_command(manifest_arg: str, split: str, device: str, workers: str, batch_sizes: str, seconds: float,
                         sources: str | None, collate: str | None, verify: str, rounds: int,
                         json_path: Path | None) -> None:
    """Measure MANIFEST's input pipeline one variable at a time: raw shard read MB/s, decode
    samples/s in one process, DataLoader samples/s per num_workers, then, at the fastest
    worker count, pin_memory on/off (with CUDA) and each of --batch-sizes; with --device cuda,
    host→device copy time and data-wait vs compute in a dummy step. Prints a table. Use it
    before tuning: the slowest row is the one to fix.

    A split whose samples have several shapes (say CT slices with 2 windows and RGB photos) is
    measured with the list collate unless --collate says otherwise, and the table says so;
    --sources measures one source's samples alone. --verify off,sample measures what the
    default per-sample check costs, in the same run."""
    from packer.errors import ConfigError, blocking_file
    from packer.files import atomic_output
    from packer.loader.bench import bench_loader, format_table
    from packer.manifest import resolve_manifest_path

    # a URL as typed (click's Path made s3:/b/x of s3://b/x), refused by name: the benchmark reads local shards
    manifest = local_folder_argument(manifest_arg, command="bench-loader")
    resolve_manifest_path(manifest)   # a missing version: exit 2 naming the versions its dataset folder holds
    blocker = blocking_file(json_path.parent) if json_path is not None else None
    if blocker is not None:  # say so now, not after the measurements
        raise ConfigError(f"--json {json_path}: {blocker} is a file, not a folder; write the JSON elsewhere")
    names = [s.strip() for s in sources.split(",") if s.strip()] if sources else None
    modes = [m.strip() for m in verify.split(",") if m.strip()]
    if not modes:
        raise click.BadParameter(f"{verify!r}: give at least one of off, sample, shard", param_hint="--verify")
    result = bench_loader(manifest, split, device=device, workers=_ints(workers, "--workers"),
                          batch_sizes=_ints(batch_sizes, "--batch-sizes"),
                          seconds=seconds, sources=names, collate=collate, rounds=rounds,
                          verify=modes)
    click.echo(format_table(result))
    if json_path is not None:
        with atomic_output(json_path, elsewhere="write the file elsewhere (another --json FILE)", shared=True) as fh:
            fh.write(json.dumps(result, indent=2, sort_keys=True).encode() + b"\n")
