"""A MixedDataset reads its members as they are and says what it reads.

- A loader state records each member setting that decides the member's order under the mix (its
  ``shuffle_buffer``), and a state saved under another is refused naming the member; states saved
  before the buffer was recorded still load.
- The mix's ``on_error``/``max_skipped`` apply to what is read through the mix: the member
  ShardDatasets the caller made keep their own, and read alone afterwards behave as they were made.
- A member that is a view contributes its view's sources to the mix's shapes, and so to the
  message of a batch that cannot be stacked: never a source the view leaves out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import packer
from packer.errors import ConfigError
from packer.loader import MixedDataset, MixedShapesError, ShardDataset, ShardReadError, make_loader
from tests.loader_fixtures import build_dataset, flip_pixel_byte

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loaderviews")
    return {"a": build_dataset(root / "a", shard_sizes=(20, 15, 15)),   # 50 samples
            "b": build_dataset(root / "b", shard_sizes=(12, 18))}       # 30 samples


def mix_of(manifests: dict[str, Path], *, buffer: int, shuffle: bool = True, member_seed: int = 0) -> MixedDataset:
    return MixedDataset([(ShardDataset(manifests["a"], "train", shuffle_buffer=buffer, seed=member_seed), 1),
                         (ShardDataset(manifests["b"], "train"), 1)], names=["a", "b"], seed=5, shuffle=shuffle)


def saved_after(dataset: MixedDataset, batches: int) -> tuple[list[str], dict[str, Any]]:
    """The keys of the first ``batches`` batches and the (JSON round-tripped) state after them."""
    loader = make_loader(dataset, batch_size=5)
    it = iter(loader)
    keys = [k for _ in range(batches) for k in next(it)["key"]]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return keys, state


def rest_after(dataset: MixedDataset, state: dict[str, Any]) -> list[str]:
    loader = make_loader(dataset, batch_size=5)
    loader.load_state_dict(state)
    try:
        return [k for batch in loader for k in batch["key"]]
    finally:
        loader.close()


# -- 1. the state records each member's shuffle_buffer ----------------------------------------------
def test_a_state_saved_under_another_member_shuffle_buffer_is_refused_naming_the_member(
        manifests: dict[str, Path]) -> None:
    _, state = saved_after(mix_of(manifests, buffer=1024), 3)
    assert [m.get("shuffle_buffer") for m in state["mix"]] == [1024, 1024]
    loader = make_loader(mix_of(manifests, buffer=2), batch_size=5)
    with pytest.raises(ConfigError, match=r"member a: shuffle_buffer saved 1024, now 2"):
        loader.load_state_dict(state)


def test_a_state_resumes_exactly_under_the_same_buffer_and_whatever_the_members_own_seed(
        manifests: dict[str, Path]) -> None:
    whole = [k for b in make_loader(mix_of(manifests, buffer=8), batch_size=5) for k in b["key"]]
    done, state = saved_after(mix_of(manifests, buffer=8), 3)
    # the mix's seed orders its members: a member's own seed changes nothing, so it is not compared
    assert done + rest_after(mix_of(manifests, buffer=8, member_seed=7), state) == whole


def test_without_shuffle_the_buffer_is_not_compared_as_the_order_is_the_packed_one(
        manifests: dict[str, Path]) -> None:
    whole = [k for b in make_loader(mix_of(manifests, buffer=2, shuffle=False), batch_size=5) for k in b["key"]]
    done, state = saved_after(mix_of(manifests, buffer=1024, shuffle=False), 3)
    assert done + rest_after(mix_of(manifests, buffer=2, shuffle=False), state) == whole


def test_a_state_saved_before_the_buffer_was_recorded_still_resumes(manifests: dict[str, Path]) -> None:
    whole = [k for b in make_loader(mix_of(manifests, buffer=8), batch_size=5) for k in b["key"]]
    done, state = saved_after(mix_of(manifests, buffer=8), 3)
    for member in state["mix"]:
        del member["shuffle_buffer"]  # as the previous identity wrote it
    assert done + rest_after(mix_of(manifests, buffer=8), state) == whole


# -- 2. the mix does not change its members' on_error/max_skipped ---------------------------------------
@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-sample dataset whose sample 3 fails its checksum (verify="sample", the default)."""
    manifest = build_dataset(tmp_path_factory.mktemp("damaged") / "d", shard_sizes=(10, 10))
    flip_pixel_byte(manifest.parent / "train-000000.tar", 3)
    return manifest


def test_a_strict_member_of_a_lenient_mix_stays_strict_on_its_own(damaged: Path, manifests: dict[str, Path]) -> None:
    strict = ShardDataset(damaged, "train", max_skipped=7)   # on_error="raise", the default
    mix = MixedDataset([(strict, 1), (ShardDataset(manifests["b"], "train"), 1)], on_error="skip", max_skipped=3)
    mixed = make_loader(mix, batch_size=4)
    keys = [k for batch in mixed for k in batch["key"]]
    assert mixed.skipped == 1 and len(keys) == mix.samples - 1   # read through the mix: the mix's skip
    assert (strict.on_error, strict.max_skipped) == ("raise", 7)
    with pytest.raises(ShardReadError, match="s00003"):
        [k for batch in make_loader(strict, batch_size=4) for k in batch["key"]]


def test_a_lenient_member_of_a_strict_mix_stays_lenient_on_its_own(damaged: Path, manifests: dict[str, Path]) -> None:
    lenient = ShardDataset(damaged, "train", on_error="skip", max_skipped=7)
    mix = MixedDataset([(lenient, 1), (ShardDataset(manifests["b"], "train"), 1)])   # on_error="raise"
    with pytest.raises(ShardReadError, match="s00003"):
        [k for batch in make_loader(mix, batch_size=4) for k in batch["key"]]
    assert (lenient.on_error, lenient.max_skipped) == ("skip", 7)
    alone = make_loader(lenient, batch_size=4)
    keys = [k for batch in alone for k in batch["key"]]
    assert alone.skipped == 1 and sorted(keys) == sorted(f"s{i:05d}" for i in range(20) if i != 3)


# -- 3. a view member's shapes are its view's ----------------------------------------------------------
def photos(root: Path, n: int, seed: int) -> None:
    root.mkdir(parents=True)
    rows = []
    for i in range(n):
        image = np.random.default_rng(seed * 1000 + i).integers(0, 255, (16, 16, 3), dtype=np.uint8)
        cv2.imwrite(str(root / f"p{i:03d}.png"), image)
        rows.append(f"p{i:03d}.png,{['cat', 'dog'][i % 2]},E{seed}_{i}")
    (root / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows) + "\n")


def build(base: Path, name: str, sources: list[dict[str, str]], color: str) -> str:
    job = {"name": name, "sources": sources,
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 3},
           "transform": {"image": {"size": [16, 16], "color": color}},
           "pack": {"format": "webdataset", "max_samples": 8}, "output": "out"}
    return str(packer.build(job, base_dir=base, scheduler="sync", progress=False, report=False).location)


def test_a_view_members_shapes_in_the_mix_and_its_message_are_the_views_sources_only(tmp_path: Path) -> None:
    photos(tmp_path / "xa", 12, 1)
    photos(tmp_path / "xb", 12, 2)
    photos(tmp_path / "y", 12, 3)
    x = build(tmp_path, "x", [{"kind": "image", "name": "a", "root": "xa", "table": "xa/labels.csv"},
                              {"kind": "image", "name": "b", "root": "xb", "table": "xb/labels.csv"}], "rgb")
    y = build(tmp_path, "y", [{"kind": "image", "name": "g", "root": "y", "table": "y/labels.csv"}], "gray")
    view = ShardDataset(x, "train", sources=["a"])
    assert set(view.info.shapes) == {"a", "b"}   # the split has both: the view reads a only
    mix = MixedDataset([(view, 1), (ShardDataset(y, "train"), 1)])
    assert dict(mix.shapes) == {"x/a": ((3, 16, 16),), "y/g": ((1, 16, 16),)}
    with pytest.raises(MixedShapesError) as raised:
        [None for _ in make_loader(mix, batch_size=16)]
    named = set(re.findall(r"\b[xy]/[a-z]\b", str(raised.value)))
    assert named == {"x/a", "y/g"}, str(raised.value)
