"""A tar shard's planned bytes are its written bytes, every member counted: ``pack.max_bytes``
is a hard limit for tar shards, counted exactly (README, Output layout, Shard boundaries).

The planner once allowed each sample three members (``.cls``, ``.json``, ``.npy``) at their raw
sizes plus 64 bytes: a mask (``.mask.npy``) or a target vector (``.target.npy``,
``.target_mask.npy``) went uncounted, as did the ``.npy`` header (400 raw bytes of a 20×20 grey
image are 528 as ``.npy``, two blocks) and the record's fields around the metadata, so shards
came out over ``max_bytes``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import packer.pipeline.stages as stages
from packer.config import load_job
from packer.files import canonical_json
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.plan import PlannedShard, tar_sizes
from packer.pipeline.sampletable import SampleTable
from packer.records import SampleRef, SpilledSample
from packer.shards.encode import encode_sample
from packer.shards.tar import npy_bytes, write_tar_shard
from packer.targets import Target

# -- each sample's bytes, against the writer ---------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
#: (target, a label text it holds) for every kind of record and member a sample may have
TARGETS = [
    (Target("class", ("a", "bb")), st.sampled_from(["a", "bb"])),
    (Target("multilabel", ("x", "y", "z"), masked=True), st.sampled_from(["x", "x|?y", "", "?z|y"])),
    (Target("multilabel", ("x", "y")), st.sampled_from(["x", "x|y", ""])),
    (Target("numeric", ("w", "h")), st.sampled_from(["1.5|2", "0|-3.25"])),
    (Target("none", ()), st.just("")),
]


@st.composite
def samples(draw: st.DrawFn) -> dict[str, Any]:
    channels, height, width = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    dtype = draw(st.sampled_from(["uint8", "<u2", "<f4"]))
    metadata = draw(st.dictionaries(TEXT, st.one_of(TEXT, st.integers(), st.floats(allow_nan=False,
                                                                                    allow_infinity=False)),
                                    max_size=4))
    mask = npy_bytes(np.zeros((height, width), np.uint8)) if draw(st.booleans()) else b""
    extra = tuple(sorted(draw(st.dictionaries(TEXT, TEXT, max_size=2)).items()))
    return {"shape": (channels, height, width), "dtype": dtype, "metadata": metadata, "mask": mask,
            "sample_id": draw(TEXT), "relpath": draw(TEXT) + ".png", "source": draw(TEXT) or "s",
            "entity": draw(TEXT), "extra": extra, "pixels": channels * height * width * np.dtype(dtype).itemsize}


@given(st.sampled_from(range(len(TARGETS))).flatmap(
           lambda t: st.tuples(st.just(t), st.lists(st.tuples(samples(), TARGETS[t][1]), min_size=1, max_size=6))),
       st.booleans(), st.sampled_from(["train", "valid", "test"]))
@settings(max_examples=60, deadline=None)
def test_each_samples_planned_tar_bytes_are_the_bytes_the_writer_gives_it(
        tmp_path_factory: pytest.TempPathFactory, drawn: tuple[int, list[tuple[dict[str, Any], str]]],
        raw_paths: bool, split: str) -> None:
    """Any shape, dtype, metadata, mask, extra columns, target kind (class: ``.cls``; multi-label
    with ignored labels: ``.target.npy`` and ``.target_mask.npy``; numeric; none) and any text
    (quotes, backslashes, control characters, non-ASCII) in ids, paths and metadata."""
    target, _ = TARGETS[drawn[0]]
    spilled, encoded = [], []
    for i, (s, label) in enumerate(drawn[1]):
        key = f"k{i:03d}"
        ref = SampleRef(sample_id=s["sample_id"], source=s["source"], kind="image", path="/raw/" + s["relpath"],
                        relpath=s["relpath"], label=label, entity=s["entity"], extra=s["extra"])
        pixels = bytes(s["pixels"])
        spilled.append(SpilledSample(key=key, ref=ref, spill="x.spill", offset=0, pixel_bytes=len(pixels),
                                     meta_bytes=len(canonical_json(s["metadata"])), shape=s["shape"],
                                     dtype=s["dtype"], sha256="0" * 64, mask_bytes=len(s["mask"])))
        # as write_shard hands it over: the metadata read back from its spilled JSON
        encoded.append(encode_sample(key=key, ref=ref, shape=s["shape"], dtype=s["dtype"], pixels=pixels,
                                     metadata=json.loads(canonical_json(s["metadata"])), split=split,
                                     target=target, mask=s["mask"], relpath=s["relpath"] if raw_paths else None))
    table = SampleTable.of(spilled)
    written = write_tar_shard(tmp_path_factory.mktemp("tar") / "s.tar", encoded)
    ends = [*written.positions[1:], written.bytes]
    actual = [end - start for start, end in zip(written.positions, ends, strict=True)]
    actual[-1] = actual[-1] - 1024  # the end blocks and record padding follow the last sample
    planned = tar_sizes(table, target, raw_paths=raw_paths).of(np.arange(len(spilled)), split).tolist()
    assert planned[:-1] == actual[:-1]
    assert written.bytes == -(-(sum(planned) + 1024) // 10240) * 10240


# -- real builds: planned = written, and within max_bytes ---------------------------------------

def _write_job(folder: Path, *, mask: bool, target: str | None, size: int, max_bytes: int,
               note: int = 0) -> Path:
    """Grey ``size``×``size`` PNGs with a table of label and entity; a mask per image where
    ``mask``, two multi-label columns (blank cells ignored) as the target where ``target``. With
    ``note``: 50 images, one split, and a note column of ``note`` characters carried into each
    record instead (168 pads a record just over one block)."""
    raw = folder / "raw"
    raw.mkdir(parents=True)
    count = 50 if note else 40
    rows = []
    for i in range(count):
        img = np.random.default_rng(i).integers(0, 255, (size, size), dtype=np.uint8)
        assert cv2.imwrite(str(raw / f"img{i:03d}.png"), img)
        if note:
            rows.append(f"img{i:03d}.png,{'ab'[i % 2]},E{i:03d},{'x' * note}")
            continue
        assert cv2.imwrite(str(raw / f"m{i:03d}.png"), (img > 128).astype(np.uint8))
        rows.append(f"img{i:03d}.png,m{i:03d}.png,E{i:03d},{'ab'[i % 2]},{i % 2}.0,{['1.0', '0.0', ''][i % 3]}")
    header = "path,label,entity,note" if note else "path,mask,entity,label,effusion,nodule"
    (raw / "labels.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    src: dict[str, Any] = {"kind": "image", "root": "raw", "table": "raw/labels.csv"}
    if mask:
        src["mask"] = {"column": "mask", "classes": [0, 1]}
    if target is not None:
        src["label"] = {"kind": target, "columns": ["effusion", "nodule"], "blank": "ignore"}
    ratios = {"train": 1.0, "valid": 0.0, "test": 0.0} if note else {"train": 0.8, "valid": 0.1, "test": 0.1}
    job = {"name": "t", "sources": [src], "split": {"by": "entity", "ratios": ratios, "seed": 3},
           "transform": {"image": {"size": [size, size], "color": "gray"}},
           "pack": {"format": "webdataset", "max_samples": 1000, "max_bytes": max_bytes}, "output": "out"}
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return folder / "job.yaml"


@pytest.mark.parametrize(("mask", "target", "size", "max_bytes", "note"), [
    (True, None, 8, 30_000, 0),            # class label (.cls) and a mask
    (False, "multilabel", 8, 30_000, 0),   # a target vector and its mask (blank cells ignored), no .cls
    (True, "multilabel", 8, 40_000, 0),    # both
    (False, None, 20, 20 * 10240, 168),    # .npy over a block by its header only, .json just over one
], ids=["mask", "target", "mask-and-target", "npy-header"])
def test_a_built_tar_shard_holds_the_bytes_planned_for_it_and_stays_within_max_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mask: bool, target: str | None, size: int,
        max_bytes: int, note: int) -> None:
    planned: list[PlannedShard] = []
    plan = stages.plan_shards

    def recorded(*args: Any, **kwargs: Any) -> list[PlannedShard]:
        planned.extend(plan(*args, **kwargs))
        return planned

    monkeypatch.setattr(stages, "plan_shards", recorded)
    result = build(load_job(_write_job(tmp_path, mask=mask, target=target, size=size, max_bytes=max_bytes,
                                       note=note)),
                   BuildOptions(scheduler="sync", quiet=True, html_report=False))
    version = Path(result.manifest_path).parent
    manifest = json.loads(Path(result.manifest_path).read_text())
    written = {shard["file"]: (shard["samples"], shard["bytes"], (version / shard["file"]).stat().st_size)
               for info in manifest["splits"].values() for shard in info["shards"]}
    assert {p.file: (len(p.rows), p.bytes, p.bytes) for p in planned} == written
    assert [f for f, (n, size_, _) in written.items() if n > 1 and size_ > max_bytes] == []
    assert max(n for n, _, _ in written.values()) > 1  # the limit holds several samples a shard
