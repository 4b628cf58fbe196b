"""MixedDataset: several packed datasets read as one by weight, with every loader guarantee.

Each epoch gives every member exactly its share of the samples (no sampling error), every sample
of a member once before any is repeated, in an order that depends only on (seed, epoch) and not
on ranks × workers; a loader resumes mid-epoch and refuses a state saved for another mix.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import ConfigError
from packer.loader import MixedDataset, ShardDataset, make_loader
from packer.loader.mix import shares
from packer.manifest import seal_manifest
from tests.loader_fixtures import build_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    return {"a": build_dataset(root / "a", shard_sizes=(50, 30, 40)),                    # 120 samples
            "b": build_dataset(root / "b", fmt="parquet", shard_sizes=(20, 10)),        # 30 samples
            "c": build_dataset(root / "c", shard_sizes=(7, 6), classes=2)}              # 13 samples


def mix_of(manifests: dict[str, Path], weights: dict[str, float], **kwargs: object) -> MixedDataset:
    members = [(ShardDataset(manifests[name], "train", shuffle_buffer=16), w) for name, w in weights.items()]
    return MixedDataset(members, names=list(weights), **kwargs)  # type: ignore[arg-type]


def epoch_keys(dataset: MixedDataset, *, num_workers: int = 0, batch_size: int = 8) -> list[str]:
    loader = make_loader(dataset, batch_size=batch_size, num_workers=num_workers)
    try:
        return [key for batch in loader for key in batch["key"]]
    finally:
        loader.close()


def index_of(key: str) -> int:
    return int(key.rsplit("/s", 1)[1])


@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=5),
       raw=st.lists(st.floats(0.01, 10), min_size=5, max_size=5),
       length=st.one_of(st.sampled_from(["shortest", "longest"]), st.integers(1, 3000)))
@settings(max_examples=300, deadline=None)
def test_shares_add_up_follow_the_weights_and_shortest_never_repeats(sizes: list[int], raw: list[float],
                                                                     length: str | int) -> None:
    weights = raw[:len(sizes)]
    total, counts = shares(sizes, weights, length)
    assert sum(counts) == total
    probs = np.asarray(weights) / sum(weights)
    if length == "shortest":
        assert all(c <= n for c, n in zip(counts, sizes, strict=True))
        assert any(c >= n - 1 for c, n in zip(counts, sizes, strict=True))  # the bounding member is read (nearly) whole
    if length == "longest":
        assert all(c >= n - 1 for c, n in zip(counts, sizes, strict=True)) or total == 0
    if length != "shortest":
        assert all(abs(c - total * p) < 1 for c, p in zip(counts, probs, strict=True))


def test_shortest_epoch_gives_each_member_its_share_and_reads_the_bounding_one(manifests: dict[str, Path]) -> None:
    mix = mix_of(manifests, {"a": 0.7, "b": 0.3}, seed=1)
    assert mix.counts() == {"a": 70, "b": 30} and mix.samples == len(mix) == 100
    keys = epoch_keys(mix)
    assert len(keys) == len(set(keys)) == 100                      # no sample twice
    assert Counter(k.split("/")[0] for k in keys) == {"a": 70, "b": 30}
    assert {index_of(k) for k in keys if k.startswith("b/")} == set(range(30))  # b bounds the epoch: all of it


def test_oversampled_member_goes_through_whole_passes(manifests: dict[str, Path]) -> None:
    mix = mix_of(manifests, {"a": 0.5, "c": 0.5}, seed=2, epoch_length="longest")
    assert mix.counts() == {"a": 120, "c": 120}
    keys = epoch_keys(mix)
    seen = Counter(index_of(k) for k in keys if k.startswith("c/"))
    assert set(seen) == set(range(13)) and set(seen.values()) <= {9, 10}   # 120 = 9 passes of 13 + 3
    order = [index_of(k) for k in keys if k.startswith("c/")]
    for p in range(9):                                             # each pass holds every sample once
        assert sorted(order[13 * p:13 * (p + 1)]) == list(range(13))
    assert Counter(k for k in keys if k.startswith("a/")).most_common(1)[0][1] == 1


def test_fixed_epoch_length(manifests: dict[str, Path]) -> None:
    mix = mix_of(manifests, {"a": 1, "b": 1, "c": 2}, epoch_length=40)
    assert mix.counts() == {"a": 10, "b": 10, "c": 20}
    assert Counter(k.split("/")[0] for k in epoch_keys(mix)) == {"a": 10, "b": 10, "c": 20}


def test_order_depends_on_seed_and_epoch_not_on_workers_or_runs(manifests: dict[str, Path]) -> None:
    first = epoch_keys(mix_of(manifests, {"a": 0.6, "b": 0.4}, seed=5))
    assert epoch_keys(mix_of(manifests, {"a": 0.6, "b": 0.4}, seed=5), num_workers=2) == first
    assert epoch_keys(mix_of(manifests, {"a": 0.6, "b": 0.4}, seed=5), num_workers=3, batch_size=5) == first
    assert epoch_keys(mix_of(manifests, {"a": 0.6, "b": 0.4}, seed=6)) != first
    later = mix_of(manifests, {"a": 0.6, "b": 0.4}, seed=5)
    later.set_epoch(1)
    second = [item["key"] for item in later]
    assert second != first and Counter(k.split("/")[0] for k in second) == Counter(k.split("/")[0] for k in first)


@pytest.mark.parametrize("uneven", ["exact", "pad", "drop"])
def test_ranks_share_the_epoch_exactly_once(manifests: dict[str, Path], uneven: str) -> None:
    whole = epoch_keys(mix_of(manifests, {"a": 0.7, "b": 0.3}, seed=3))
    parts = [epoch_keys(mix_of(manifests, {"a": 0.7, "b": 0.3}, seed=3, rank=r, world_size=3, uneven=uneven),
                        num_workers=2) for r in range(3)]
    if uneven == "exact":
        assert sorted(k for p in parts for k in p) == sorted(whole)
    else:
        assert len({len(p) for p in parts}) == 1                  # DDP lockstep: same length on every rank
        assert set(k for p in parts for k in p) <= set(whole)


def test_resume_mid_epoch_and_refuse_another_mix(manifests: dict[str, Path]) -> None:
    loader = make_loader(mix_of(manifests, {"a": 0.5, "c": 0.5}, seed=4, epoch_length="longest"), batch_size=8)
    loader.set_epoch(1)
    batches = iter(loader)
    done = [k for _ in range(7) for k in next(batches)["key"]]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [k for batch in batches for k in batch["key"]]
    assert [m["weight"] for m in state["mix"]] == [0.5, 0.5] and state["epoch_length"] == "longest"

    again = make_loader(mix_of(manifests, {"a": 0.5, "c": 0.5}, seed=4, epoch_length="longest"), batch_size=8,
                        num_workers=2)
    again.load_state_dict(state)
    again.set_epoch(1)
    assert [k for batch in again for k in batch["key"]] == rest and len(done) + len(rest) == 240
    again.close()

    other = make_loader(mix_of(manifests, {"a": 0.6, "c": 0.4}, seed=4, epoch_length="longest"), batch_size=8)
    with pytest.raises(ConfigError, match=r"mix saved a=fixture@\w+:train×0.5 \+ c=fixture@\w+:train×0.5, "
                                          r"now a=fixture@\w+:train×0.6"):
        other.load_state_dict(state)
    single = make_loader(ShardDataset(manifests["a"], "train"), batch_size=8)
    with pytest.raises(ConfigError, match="saved for a MixedDataset and this loader reads a ShardDataset"):
        single.load_state_dict(state)
    # weights need not add up to 1: the same shares (5 and 5) are the same mix, and resume
    scaled = make_loader(mix_of(manifests, {"a": 5.0, "c": 5.0}, seed=4, epoch_length="longest"), batch_size=8)
    scaled.load_state_dict(state)
    scaled.set_epoch(1)
    assert [k for batch in scaled for k in batch["key"]] == rest


def relabel(manifest: Path, names: list[str]) -> Path:
    """The same dataset with its class indices named ``names`` (label index i is ``names[i]``)."""
    doc = json.loads(manifest.read_text())
    body = {k: v for k, v in doc.items() if k not in ("dataset_hash", "version", "created_at")}
    body["label_map"] = {name: i for i, name in enumerate(names)}
    body["splits"]["train"]["class_counts"] = {}
    manifest.write_text(json.dumps(seal_manifest(body), indent=2, sort_keys=True))
    return manifest


def test_class_labels_are_remapped_by_name(tmp_path: Path) -> None:
    a = build_dataset(tmp_path / "a", shard_sizes=(6,), classes=3)               # c0 c1 c2
    b = relabel(build_dataset(tmp_path / "b", shard_sizes=(6,), classes=3), ["c2", "other", "c0"])
    mix = MixedDataset([(ShardDataset(a, "train"), 1), (ShardDataset(b, "train"), 1)], names=["a", "b"])
    assert mix.info.label_map == {"c0": 0, "c1": 1, "c2": 2, "other": 3}
    assert mix.info.target.names == ("c0", "c1", "c2", "other")
    own = {"a": ["c0", "c1", "c2"], "b": ["c2", "other", "c0"]}
    names = {v: k for k, v in mix.info.label_map.items()}
    items = list(mix)
    assert len(items) == 12
    for item in items:
        member, key = item["key"].split("/")
        assert names[int(item["label"])] == own[member][int(key[1:]) % 3]


def test_a_records_label_index_is_the_mixes_like_the_batch_label(tmp_path: Path) -> None:
    """With ``records=True`` a record's ``label_index`` is in the mix's label map, the map the
    batch's ``label`` uses: a member's own index would name another class (b's 1 is "other",
    the mix's 1 is "c1")."""
    a = build_dataset(tmp_path / "a", shard_sizes=(6,), classes=3)               # c0 c1 c2
    b = relabel(build_dataset(tmp_path / "b", shard_sizes=(6,), classes=3), ["c2", "other", "c0"])
    mix = MixedDataset([(ShardDataset(a, "train", records=True), 1), (ShardDataset(b, "train", records=True), 1)],
                       names=["a", "b"])
    loader = make_loader(mix, batch_size=4, num_workers=0)
    seen = Counter()
    for batch in loader:
        for label, record, key in zip(batch["label"].tolist(), batch["record"], batch["key"], strict=True):
            member = key.split("/")[0]
            own = int(key.rsplit("/s", 1)[1]) % 3               # the member's own index (fixture: i % 3)
            expected = own if member == "a" else {0: 2, 1: 3, 2: 0}[own]   # b's c2/other/c0 in the mix's map
            assert record["label_index"] == label == expected, (key, record["label_index"], label)
            seen[member] += 1
    assert seen == {"a": 6, "b": 6}


def test_members_that_disagree_on_records_are_refused_by_name(manifests: dict[str, Path]) -> None:
    """One member with records=True and one without: the first batch holding both died in the
    collate with a bare KeyError: 'record'."""
    with pytest.raises(ConfigError, match=r"MixedDataset: b has records=False but a has records=True; .*"
                                          r"records=True"):
        MixedDataset([(ShardDataset(manifests["a"], "train", records=True), 1),
                      (ShardDataset(manifests["b"], "train"), 1)], names=["a", "b"])


def test_members_transform_applies_to_its_own_samples(manifests: dict[str, Path]) -> None:
    a = ShardDataset(manifests["a"], "train", transform=lambda image: image.float() * 0)
    b = ShardDataset(manifests["b"], "train", transform=lambda image: image.float() + 1000)
    for item in MixedDataset([(a, 1), (b, 1)], names=["a", "b"]):
        assert (item["image"] == 0).all() if item["key"].startswith("a/") else (item["image"] >= 1000).all()


def test_members_transforms_draw_under_the_mixes_seed_independently_per_member(manifests: dict[str, Path]) -> None:
    """The mix's seed replaces the members' own for their transforms as for their order: the
    augmentations followed each member's seed, and changing the mix's seed changed none of them."""
    def draws(mix_seed: int, member_seed: int) -> dict[str, float]:
        members = [(ShardDataset(manifests["c"], "train", seed=member_seed,
                                 transform=lambda image: torch.rand(1)), 1.0) for _ in range(2)]
        return {item["key"]: float(item["image"]) for item in MixedDataset(members, names=["c", "c2"], seed=mix_seed)}

    first = draws(1, 0)
    assert len(first) == 26  # both members read whole: every sample id of c once in each
    assert draws(1, 5) == first, "a member's own seed must not decide its draws in a mix"
    other = draws(2, 0)
    assert all(other[key] != value for key, value in first.items()), "the mix's seed decides the draws"
    # one sample id in two members: independent draws, as the members' orders are
    assert all(first[f"c/{key[3:]}"] != value for key, value in first.items() if key.startswith("c2/"))


def test_incompatible_members_are_refused_by_name(manifests: dict[str, Path], tmp_path: Path) -> None:
    a = ShardDataset(manifests["a"], "train")
    with pytest.raises(ConfigError, match="weights must be > 0"):
        MixedDataset([(a, 1), (ShardDataset(manifests["b"], "train"), 0)])
    sizes = torch.tensor([20.0, 10.0])
    for weight in ("heavy", "0.7", True, None, sizes / sizes.sum(), np.array([0.5, 0.5])):  # not one number each:
        with pytest.raises(ConfigError, match=r"\(member 1\) has weight .*a weight is a number > 0"):
            MixedDataset([(a, 1), (ShardDataset(manifests["b"], "train"), weight)])
    import decimal
    import fractions
    for weight in ((sizes / sizes.sum())[1], fractions.Fraction(1, 3), decimal.Decimal("0.5"), np.float32(0.5)):
        mix = MixedDataset([(a, 1), (ShardDataset(manifests["b"], "train"), weight)])  # numbers all: taken
        assert mix.weights[1] == float(weight)
    with pytest.raises(ConfigError, match="epoch_length"):
        MixedDataset([(a, 1)], epoch_length="forever")
    with pytest.raises(ConfigError, match="names .* must be unique"):
        MixedDataset([(a, 1), (ShardDataset(manifests["b"], "train"), 1)], names=["x", "x"])
    wide = build_dataset(tmp_path / "wide", shard_sizes=(4,))
    doc = json.loads(wide.read_text())
    body = {k: v for k, v in doc.items() if k not in ("dataset_hash", "version", "created_at")}
    body["sample_schema"]["dtype"] = "uint16"
    wide.write_text(json.dumps(seal_manifest(body)))
    with pytest.raises(ConfigError, match=r"MixedDataset: wide has dtype 'uint16' but a has 'uint8'"):
        MixedDataset([(a, 1), (ShardDataset(wide, "train"), 1)], names=["a", "wide"])


def test_mixed_shapes_across_members_meet_the_collate_rules(tmp_path: Path) -> None:
    small = build_dataset(tmp_path / "small", shard_sizes=(8,))
    big = build_dataset(tmp_path / "big", shard_sizes=(8,), shape=(3, 4, 4))
    mix = MixedDataset([(ShardDataset(small, "train"), 1), (ShardDataset(big, "train"), 1)], names=["s", "b"])
    assert mix.shape is None
    with pytest.raises(ConfigError, match="mixes image shapes"):
        epoch_keys(mix)
    as_lists = make_loader(mix, batch_size=4, collate="list")
    assert sorted(k for batch in as_lists for k in batch["key"]) == sorted(
        [f"s/s{i:05d}" for i in range(8)] + [f"b/s{i:05d}" for i in range(8)])


def test_train_example_trains_a_mix_and_refuses_to_resume_another(manifests: dict[str, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_loader_train import load_example

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    example = load_example()
    ckpt = tmp_path / "ckpt.pt"
    common = ["--epochs", "1", "--batch-size", "8", "--workers", "2", "--device", "cpu", "--checkpoint", str(ckpt)]
    mix = ["--mix", f"{manifests['a'].parent}=0.7", "--mix", f"{manifests['b'].parent}=0.3"]
    first = example.main([*mix, *common, "--max-steps", "3"])
    second = example.main([*mix, *common, "--resume"])
    keys = first["keys"] + second["keys"]
    assert len(keys) == len(set(keys)) == 100 and second["steps"] == 13      # 100 samples: 13 batches of 8
    assert Counter(k.split("/")[0] for k in keys) == {"fixture": 70, "fixture.2": 30}

    other = ["--mix", f"{manifests['a'].parent}=0.5", "--mix", f"{manifests['b'].parent}=0.5"]
    with pytest.raises(SystemExit) as other_mix:
        example.main([*other, *common, "--resume"])
    assert other_mix.value.code == 2
    assert re.search(r"^train\.py: cannot resume from .*ckpt.pt: .*mix saved .*×0.7 .*, now .*×0.5",
                     capsys.readouterr().err, flags=re.M)
    with pytest.raises(SystemExit) as sources:
        example.main([*mix, *common, "--sources", "photos"])
    assert sources.value.code == 2
    assert "train.py: --sources names sources of one dataset" in capsys.readouterr().err


def test_ranks_are_the_mixes_and_a_member_made_for_another_rank_is_refused(manifests: dict[str, Path]) -> None:
    """Members given rank=/world_size= while the mix is not would have handed every rank the whole mix."""
    member = ShardDataset(manifests["a"], "train", rank=1, world_size=3)
    with pytest.raises(ConfigError, match="member a was made as rank 1 of 3, the mix is rank 0 of 1; .* pass "
                                          "rank=/world_size= to MixedDataset"):
        MixedDataset([(member, 1.0)], names=["a"])
    mix = MixedDataset([(member, 1.0)], names=["a"], rank=1, world_size=3)
    assert (mix.rank, mix.world_size) == (1, 3)


@pytest.mark.parametrize(("field", "other"), [("dtype", "uint16"), ("pad", 0)])
def test_members_whose_masks_differ_in_dtype_or_pad_are_refused(tmp_path: Path, field: str, other: Any) -> None:
    """A padded batch's mask takes the first sample's dtype and the first member's pad: ids over
    255 of a uint16 member wrapped in a uint8 batch (300 became 44), and one job's pad id filled
    another's padding."""
    def with_mask(path: Path, mask: dict[str, Any]) -> Path:
        doc = json.loads(path.read_text())
        body = {k: v for k, v in doc.items() if k not in ("dataset_hash", "version", "created_at")}
        body["mask"] = mask
        path.write_text(json.dumps(seal_manifest(body)))
        return path

    mask = {"dtype": "uint8", "classes": [0, 1, 255], "layout": "HW", "pad": 255}
    a = with_mask(build_dataset(tmp_path / "a", shard_sizes=(4,)), mask)
    b = with_mask(build_dataset(tmp_path / "b", shard_sizes=(4,)), {**mask, field: other})
    with pytest.raises(ConfigError, match=rf"MixedDataset: b has mask {field} {other!r} but a has "):
        MixedDataset([(ShardDataset(a, "train"), 1), (ShardDataset(b, "train"), 1)], names=["a", "b"])
    same = with_mask(build_dataset(tmp_path / "same", shard_sizes=(4,)), dict(mask))
    MixedDataset([(ShardDataset(a, "train"), 1), (ShardDataset(same, "train"), 1)], names=["a", "same"])
