"""A tiny labelled photo tree and the job that builds it in one process, for tests of what a
build writes (per-sample tables' forms: string widths, row groups).

24 grey 16×16 PNGs of six entities (four files each), labelled ``circle``/``square`` in turn by
a table; the job splits by entity and packs four samples a shard, so a build has shards in
every split.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import yaml
from click.testing import CliRunner

from packer.cli import main as CLI
from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.verify import verify_dataset

LABELS = ("circle", "square")


def write_tree(root: Path, count: int = 24) -> dict[str, np.ndarray]:
    """``count`` grey PNGs under ``root`` and their ``labels.csv``; returns each file's pixels."""
    rows, pixels = [], {}
    for i in range(count):
        rel = f"P{i // 4:02d}/img{i:02d}.png"
        image = np.random.default_rng(i).integers(0, 255, (16, 16), dtype=np.uint8)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(root / rel), image)
        rows.append(f"{rel},{LABELS[i % 2]},P{i // 4:02d}")
        pixels[rel] = image
    (root / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows) + "\n")
    return pixels


def build_tree(folder: Path, out: str, *, fresh: bool = True) -> Path:
    """Build the tree under ``folder/raw`` into ``folder/out`` (one process); returns the version folder."""
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "t", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16], "color": "gray"}},
        "pack": {"format": "webdataset", "max_samples": 4}, "output": out}, sort_keys=False))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False, fresh=fresh))
    return Path(result.manifest_path).parent


def grow_and_rebuild(folder: Path) -> BuildResult:
    """Add one labelled file to the tree under ``folder/raw`` and build the job again (reusing
    what it can of the earlier version in the same output)."""
    assert cv2.imwrite(str(folder / "raw/P05/extra.png"), np.full((16, 16), 7, np.uint8))
    with open(folder / "raw/labels.csv", "a") as fh:
        fh.write("P05/extra.png,circle,P05\n")
    return build(load_job(folder / "job.yaml"), BuildOptions(scheduler="sync", quiet=True, html_report=False))


def assert_read_by_every_command(reference: Path, version: Path, scratch: Path) -> None:
    """``version`` (the tree built in another form) passes verify, quick and deep (every sample
    checked), and inspect, report and diff read it; diff finds no sample that differs from
    ``reference`` (the same samples, keys, labels and sha256s)."""
    for deep in (False, True):
        result = verify_dataset(version, deep=deep)
        assert result.ok, result.problems
        assert result.samples_checked == 24 or not deep
    runner = CliRunner()
    for args in (["verify", str(version), "--deep", "-q"], ["inspect", str(version)],
                 ["diff", str(reference), str(version)],
                 ["report", str(version), "--output", str(scratch / "report.html")]):
        ran = runner.invoke(CLI, args)
        assert ran.exit_code == 0, (args, ran.output, ran.exception)
    diff = runner.invoke(CLI, ["diff", str(reference), str(version)]).output
    # the same samples and shards; the tables written in another form hash otherwise (their bytes
    # are in the manifest), so the diff says so rather than "no differences"
    lines = diff.splitlines()[1:]
    assert lines[0] == "  samples: 0 added, 0 removed, 0 changed, 0 moved split, 0 relabeled", diff
    assert " 0 new (0 B), 0 removed (0 B)" in lines[1], diff
    assert lines[2:4] == ["  config: unchanged", "  versions: unchanged"], diff
    assert lines[4].endswith("though no list above says how: the manifests differ in index, splits_table (compare "
                             "them with packer inspect --json)") and len(lines) == 5, diff
