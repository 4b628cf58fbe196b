"""ShardDataset + make_loader over real tar and Parquet shards: exactly-once, order, content."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds
from loader_fixtures import build_dataset, sample_image, split_keys

from packer.errors import ConfigError
from packer.loader import MixedShapesError, ShardDataset, collate_stack, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

FEW = (7, 4)            # 2 shards, 11 samples: fewer shards than ranks × workers
MANY = (3, 2, 4, 1, 3, 2, 5, 2, 3)  # 9 shards, 25 samples


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("loader")
    return {(fmt, name): build_dataset(root / f"{fmt}-{name}", fmt=fmt, shard_sizes=sizes)
            for fmt in ("webdataset", "parquet") for name, sizes in (("few", FEW), ("many", MANY))}


def check_batch(batch: dict) -> None:
    """Every sample's pixels and label match its key (sample i: pixels 0,1 spell i, label i % 3)."""
    for image, label, key in zip(batch["image"], batch["label"], batch["key"], strict=True):
        index = int(key[1:])
        assert image.dtype == torch.uint8 and tuple(image.shape) == (1, 4, 4)
        assert np.array_equal(image.numpy(), sample_image(index))
        assert int(label) == index % 3


def run_epochs(manifest: Path, *, world: int, workers: int, epochs: list[int], uneven: str = "exact",
               batch: int = 2) -> list[list[list[str]]]:
    """keys[epoch run][rank] for one loader per rank (persistent workers across epochs)."""
    out: list[list[list[str]]] = [[] for _ in epochs]
    for rank in range(world):
        dataset = ShardDataset(manifest, "train", seed=11, shuffle_buffer=4, rank=rank, world_size=world,
                               uneven=uneven)
        loader = make_loader(dataset, batch, workers)
        for i, epoch in enumerate(epochs):
            loader.set_epoch(epoch)
            keys = []
            for b in loader:
                check_batch(b)
                keys += b["key"]
            out[i].append(keys)
    return out


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
@pytest.mark.parametrize("shards", ["few", "many"])
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_exactly_once_and_order_reproducible(datasets, fmt, shards, workers, world):
    manifest = datasets[(fmt, shards)]
    total = sum(FEW if shards == "few" else MANY)
    first, again, other = run_epochs(manifest, world=world, workers=workers, epochs=[0, 0, 1])
    assert Counter(k for rank in first for k in rank) == Counter(split_keys(total))
    assert Counter(k for rank in other for k in rank) == Counter(split_keys(total))
    assert first == again
    assert first != other
    # the batch stream of a rank does not depend on the number of workers
    if workers:
        assert first == run_epochs(manifest, world=world, workers=0, epochs=[0])[0]


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
@pytest.mark.parametrize("world,workers", [(2, 0), (3, 2), (2, 3)])
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_pad_and_drop_give_every_rank_the_same_count(datasets, fmt, world, workers, uneven):
    total = sum(FEW)
    (ranks,) = run_epochs(datasets[(fmt, "few")], world=world, workers=workers, epochs=[0], uneven=uneven)
    counts = {len(r) for r in ranks}
    seen = Counter(k for r in ranks for k in r)
    if uneven == "pad":
        assert counts == {-(-total // world)}
        assert set(seen) == set(split_keys(total))
        assert sum(seen.values()) == -(-total // world) * world
    else:
        assert counts == {total // world}
        assert max(seen.values()) == 1 and len(seen) == total // world * world


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_plain_dataloader_over_dataset_is_exactly_once(datasets, fmt):
    manifest = datasets[(fmt, "many")]
    keys = []
    for rank in range(2):
        dataset = ShardDataset(manifest, "train", rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=collate_stack)
        keys += [k for b in loader for k in b["key"]]
    assert Counter(keys) == Counter(split_keys(sum(MANY)))


def test_rank_and_world_size_come_from_the_environment(datasets, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dataset = ShardDataset(datasets[("webdataset", "many")], "train")
    assert (dataset.rank, dataset.world_size) == (2, 3)
    assert len(dataset) == 25 * 3 // 3 - 25 * 2 // 3


def test_a_world_size_without_a_rank_from_anywhere_is_a_config_error(datasets, monkeypatch):
    """world_size=2 with no rank=, no torch.distributed and no RANK made every process rank 0:
    each read the same half, and the other half was never read."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="world_size=2 without rank=.*pass rank= too"):
        ShardDataset(datasets[("webdataset", "many")], "train", world_size=2)
    assert ShardDataset(datasets[("webdataset", "many")], "train", world_size=2, rank=1).rank == 1
    assert ShardDataset(datasets[("webdataset", "many")], "train", world_size=1).rank == 0
    monkeypatch.setenv("RANK", "1")
    assert ShardDataset(datasets[("webdataset", "many")], "train", world_size=2).rank == 1


def test_a_world_size_in_the_environment_without_a_rank_is_a_config_error(datasets, monkeypatch):
    """WORLD_SIZE=2 exported (a job script's leftover), no RANK, no torch.distributed: the
    dataset became rank 0 of 2 and read half the split without a word, in every process."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 is set in the environment but RANK is not.*unset WORLD_SIZE"):
        ShardDataset(datasets[("webdataset", "many")], "train")
    assert ShardDataset(datasets[("webdataset", "many")], "train", rank=0, world_size=1).world_size == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert ShardDataset(datasets[("webdataset", "many")], "train").world_size == 1


def test_shuffle_decorrelates_packed_and_read_order(tmp_path):
    shards, size = 200, 10     # Spearman's rho over a random shard order: sd about 1/sqrt(200) = 0.07
    manifest = build_dataset(tmp_path, shard_sizes=[size] * shards)
    n = shards * size

    def spearman(order: list[int]) -> float:
        d = np.arange(n) - np.argsort(order)     # rank in read order vs packed index
        return 1 - 6 * float((d.astype(np.float64) ** 2).sum()) / (n * (n * n - 1))

    unshuffled = [int(item["key"][1:]) for item in ShardDataset(manifest, "train", shuffle=False)]
    assert spearman(unshuffled) == pytest.approx(1.0)
    dataset = ShardDataset(manifest, "train", seed=0, shuffle_buffer=64)
    rhos, within = [], []
    for epoch in range(4):
        dataset.set_epoch(epoch)
        order = [int(item["key"][1:]) for item in dataset]
        assert sorted(order) == list(range(n))
        rhos.append(spearman(order))
        # inside one shard: read order of its samples vs their packed position
        first = [i for i in order if i < size]
        ranks = np.argsort(np.argsort(first))
        within.append(np.corrcoef(np.arange(size), ranks)[0, 1])
    assert max(abs(r) for r in rhos) < 0.3
    assert float(np.mean(np.abs(rhos))) < 0.15
    assert abs(float(np.mean(within))) < 0.4


def test_items_match_stock_webdataset_reader(datasets):
    manifest = datasets[("webdataset", "many")]
    urls = sorted(str(p) for p in manifest.parent.glob("*.tar"))
    stock = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode())
    ours = list(ShardDataset(manifest, "train", shuffle=False))
    assert [s["__key__"] for s in stock] == [o["key"] for o in ours]
    for s, o in zip(stock, ours, strict=True):
        assert int(s["cls"]) == int(o["label"])
        assert np.array_equal(s["npy"], o["image"].numpy())


def test_items_match_pyarrow_read_table(datasets):
    manifest = datasets[("parquet", "many")]
    ours = list(ShardDataset(manifest, "train", shuffle=False))
    rows = []
    for path in sorted(manifest.parent.glob("train-*.parquet")):
        rows += pq.read_table(path).to_pylist()
    assert [r["key"] for r in rows] == [o["key"] for o in ours]
    for r, o in zip(rows, ours, strict=True):
        assert r["label"] == int(o["label"])
        expected = np.frombuffer(r["image"], dtype=r["dtype"]).reshape(r["shape"])
        assert np.array_equal(expected, o["image"].numpy())


def test_parquet_images_are_writable_tensors_without_warnings(datasets, recwarn):
    item = next(iter(ShardDataset(datasets[("parquet", "few")], "train", shuffle=False)))
    item["image"][0, 0, 0] = 255        # a writable view (Arrow buffers are mutable)
    assert not [w for w in recwarn if "not writable" in str(w.message)]


def test_variable_shapes_collate_to_a_list_or_padded_or_refuse_to_stack(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=(3, 2), shapes=[(1, 4, 4), (1, 2, 6)])
    batch = next(iter(make_loader(ShardDataset(manifest, "train", shuffle=False), 4, 0, collate="list")))
    assert isinstance(batch["image"], list) and [tuple(i.shape) for i in batch["image"]] == [
        (1, 4, 4), (1, 2, 6), (1, 4, 4), (1, 2, 6)]
    assert batch["label"].tolist() == [0, 1, 2, 0]
    padded = next(iter(make_loader(ShardDataset(manifest, "train", shuffle=False), 4, 0, collate="pad")))
    assert padded["image"].shape == (4, 1, 4, 6) and padded["size"].tolist() == [[4, 4], [2, 6], [4, 4], [2, 6]]
    for image, size, listed in zip(padded["image"], padded["size"], batch["image"], strict=True):
        h, w = size.tolist()
        assert torch.equal(image[:, :h, :w], listed) and not image[:, h:, :].any() and not image[:, :, w:].any()
    with pytest.raises(MixedShapesError, match=r"1×4×4 \(2 sample\(s\), e\.g\. s00000\), 1×2×6"):
        next(iter(make_loader(ShardDataset(manifest, "train", shuffle=False), 4, 0)))


def test_transform_is_seeded_per_sample_not_per_worker(datasets):
    manifest = datasets[("webdataset", "many")]

    def noisy(image: torch.Tensor) -> torch.Tensor:
        return image.float() + torch.rand(())

    def collect(workers: int, world: int) -> dict[str, float]:
        out = {}
        for rank in range(world):
            ds = ShardDataset(manifest, "train", seed=2, transform=noisy, rank=rank, world_size=world)
            for b in make_loader(ds, 3, workers):
                out.update({k: float(img.flatten()[2] - int(img.flatten()[2])) for k, img in zip(
                    b["key"], b["image"], strict=True)})
        return out

    single = collect(0, 1)
    assert single == collect(2, 2)
    assert len(set(single.values())) > 20


def test_workers_hold_at_most_shuffle_buffer_samples(tmp_path, monkeypatch):
    import packer.loader.dataset as dataset_module

    manifest = build_dataset(tmp_path, shard_sizes=[30] * 20)
    reads = 0

    def counting(*args, **kwargs):
        nonlocal reads
        for result in real(*args, **kwargs):
            reads += 1
            yield result

    real = dataset_module.read_shard
    monkeypatch.setattr(dataset_module, "read_shard", counting)
    for buffer in (1, 16, 64):
        reads, peak, yielded = 0, 0, 0
        for _item in ShardDataset(manifest, "train", seed=4, shuffle_buffer=buffer):
            yielded += 1
            peak = max(peak, reads - yielded)       # read from disk but not yet handed out
        assert yielded == 600 and peak < buffer


@pytest.mark.slow  # a spawned worker: a fresh interpreter that imports torch
def test_spawned_persistent_workers_follow_set_epoch(datasets):
    manifest = datasets[("parquet", "many")]
    reference = make_loader(ShardDataset(manifest, "train", seed=5), 4, 0)
    spawned = make_loader(ShardDataset(manifest, "train", seed=5), 4, 1, multiprocessing_context="spawn")
    with spawned:
        for epoch in (0, 1):
            reference.set_epoch(epoch)
            spawned.set_epoch(epoch)
            assert [k for b in spawned for k in b["key"]] == [k for b in reference for k in b["key"]]


def test_reading_a_tar_dataset_never_imports_pyarrow(tmp_path: Path) -> None:
    """A process that reads WebDataset shards with verify="off" pays for no Arrow import (20 ms warm,
    far more from a cold disk): the manifest's Arrow schemas are built on first use. Views
    (sources=, labels=), Parquet datasets and verify="sample" (the default: each sample's checksum
    comes from _index.parquet, read once where the dataset is made) do read Arrow files, and
    import it then."""
    import subprocess
    import sys

    manifest = build_dataset(tmp_path / "tar", shard_sizes=(3, 2))
    code = ("import sys\n"
            "from packer.loader import ShardDataset, make_loader\n"
            f"ds = ShardDataset({str(manifest)!r}, 'train', shuffle=False, verify='off')\n"
            "assert len(list(ds)) == 5\n"
            "assert sum(len(b['key']) for b in make_loader(ds, batch_size=2, num_workers=0)) == 5\n"
            "assert 'pyarrow' not in sys.modules, 'pyarrow imported'\n"
            "from packer.manifest import INDEX_SCHEMA, SPLITS_SCHEMA\n"
            "assert INDEX_SCHEMA.names[:3] == ['key', 'split', 'shard'] and 'fold' in SPLITS_SCHEMA.names\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_records_true_delivers_each_samples_json_record_with_it(tmp_path: Path, fmt: str) -> None:
    """The record the shard holds (``.json`` member, ``metadata`` cell), read locally, streamed from
    a store, and batched by make_loader's workers; without ``records`` the items carry none."""
    import fsspec

    manifest = build_dataset(tmp_path / fmt, fmt=fmt, shard_sizes=(3, 4))
    plain = next(iter(ShardDataset(manifest, "train", shuffle=False)))
    assert "record" not in plain
    items = list(ShardDataset(manifest, "train", shuffle=False, records=True))
    assert [item["record"]["key"] for item in items] == [item["key"] for item in items]
    assert all(item["record"]["entity_id"] == f"e{int(item['key'][1:])}" for item in items)
    memory = fsspec.filesystem("memory")
    for path in manifest.parent.iterdir():
        memory.pipe(f"/records-{fmt}/v/{path.name}", path.read_bytes())
    try:
        streamed = list(ShardDataset(f"memory://records-{fmt}/v/manifest.json", "train", shuffle=False,
                                     records=True))
    finally:
        memory.rm(f"/records-{fmt}", recursive=True)
    assert [item["record"] for item in streamed] == [item["record"] for item in items]
    batches = list(make_loader(ShardDataset(manifest, "train", records=True), batch_size=3, num_workers=2))
    for batch in batches:
        assert [record["key"] for record in batch["record"]] == batch["key"]
    assert sum(len(batch["record"]) for batch in batches) == 7


def test_exact_under_torch_distributed_warns_when_ranks_get_different_batch_counts(tmp_path: Path) -> None:
    """ShardDataset's default uneven="exact" under DDP: 20 samples over 3 ranks are 6, 7 and 7,
    in batches of 2 that is 3, 4 and 4 batches, and the rank with fewer leaves its peers waiting
    forever in the gradient all-reduce, without a word. make_loader must say so up front."""
    import warnings

    import torch.distributed as dist

    manifest = build_dataset(tmp_path / "d", shard_sizes=(10, 10))             # 20 samples
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        uneven = ShardDataset(manifest, "train", rank=0, world_size=3)        # 6, 7, 7 samples
        with pytest.warns(UserWarning, match=r"ranks get 4 or 3 batches of 2 \(uneven='exact': 20 samples over "
                                             r"3 ranks\).*uneven='pad'"):
            make_loader(uneven, batch_size=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            make_loader(ShardDataset(manifest, "train", rank=0, world_size=3), batch_size=4)  # 2 batches each
            make_loader(ShardDataset(manifest, "train", rank=0, world_size=3, uneven="pad"), batch_size=2)
    finally:
        dist.destroy_process_group()
    with warnings.catch_warnings():  # outside torch.distributed (a script splitting work itself): no warning
        warnings.simplefilter("error")
        make_loader(ShardDataset(manifest, "train", rank=0, world_size=3), batch_size=2)
