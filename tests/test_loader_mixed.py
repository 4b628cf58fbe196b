"""A mixed-shape dataset (2-window CT, a 1-channel radiograph, RGB photos) through the loader:
views by source and label read only their samples and keep every loader guarantee; a mixed
batch is refused by name; bench-loader and train.py handle it."""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError, IntegrityError
from packer.loader import MixedShapesError, ShardDataset, ShardReadError, collate_stack, make_loader
from packer.manifest import compute_dataset_hash
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import REPO, demo_job_doc, write_job

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def mixed_doc(raw: Path, out: Path, fmt: str) -> dict[str, Any]:
    """The demo job as it was before transform.channels: each source keeps its own channel count."""
    doc = demo_job_doc(raw, out)
    doc["transform"] = copy.deepcopy(doc["transform"])
    doc["transform"].pop("channels", None)
    doc["transform"]["dicom"]["windows"] = ["lung", "mediastinum"]
    doc["pack"] = {**doc["pack"], "format": fmt, "max_samples": 8}
    return doc


@pytest.fixture(scope="module", params=["webdataset", "parquet"])
def mixed(request: pytest.FixtureRequest, demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    root = tmp_path_factory.mktemp(f"mixed-{request.param}")
    job = load_job(write_job(root, mixed_doc(demo_raw.root, root / "out", request.param)))
    return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False))


def index_keys(result: BuildResult, split: str, *, source: str | None = None, label: str | None = None) -> list[str]:
    rows = pq.read_table(result.version_dir / "_index.parquet").to_pylist()
    label_id = None if label is None else result.manifest["label_map"][label]
    return sorted(r["key"] for r in rows if r["split"] == split and (source is None or r["source"] == source)
                  and (label_id is None or r["label"] == label_id))


def keys_of(loader: Any) -> list[str]:
    """Every key the loader yields in one epoch; its workers are shut down after (see ShardLoader.close)."""
    try:
        return [key for batch in loader for key in batch["key"]]
    finally:
        loader.close()


def test_the_fixture_really_mixes_shapes(mixed: BuildResult) -> None:
    schema = mixed.manifest["sample_schema"]
    assert schema["shape"] is None
    assert schema["shapes"] == {"ct": [[1, 64, 64], [2, 64, 64]], "photos": [[3, 64, 64]]}


def test_a_view_of_one_source_holds_exactly_its_samples_and_one_shape(mixed: BuildResult) -> None:
    for source, shape in (("photos", (3, 64, 64)), ("ct", None)):
        dataset = ShardDataset(mixed.manifest_path, "train", sources=[source])
        assert dataset.samples == len(dataset) == len(index_keys(mixed, "train", source=source)) > 0
        assert dataset.shape == shape
        got = [item["key"] for item in dataset]
        assert sorted(got) == index_keys(mixed, "train", source=source)
    labels = ShardDataset(mixed.manifest_path, "train", labels=["circle", "square"])
    want = sorted(index_keys(mixed, "train", label="circle") + index_keys(mixed, "train", label="square"))
    assert sorted(item["key"] for item in labels) == want
    both = ShardDataset(mixed.manifest_path, "train", sources=["photos"], labels=["circle"])
    assert sorted(i["key"] for i in both) == sorted(
        set(index_keys(mixed, "train", source="photos")) & set(index_keys(mixed, "train", label="circle")))



def test_a_label_view_whose_samples_come_from_one_source_has_that_sources_shape(mixed: BuildResult) -> None:
    """dataset.shape is the view's one shape by the manifest: a labels= view counts the sources
    its samples come from (circle and square are photos' labels only), not every source."""
    photos_only = ShardDataset(mixed.manifest_path, "train", labels=["circle", "square"])
    assert {r["source"] for r in pq.read_table(mixed.version_dir / "_index.parquet").to_pylist()
            if r["split"] == "train" and r["label"] in {mixed.manifest["label_map"][n] for n in ("circle", "square")}
            } == {"photos"}
    assert photos_only.shape == (3, 64, 64)
    assert ShardDataset(mixed.manifest_path, "train", labels=["nodule"]).shape is None  # CT: 1 and 2 channels
    assert ShardDataset(mixed.manifest_path, "train", labels=["normal", "circle"]).shape is None  # both sources

def test_a_view_never_reads_the_samples_it_leaves_out(mixed: BuildResult, tmp_path: Path) -> None:
    """Every CT sample's image is made undecodable (same shard sizes): a photos view still reads
    cleanly with on_error="raise", while the whole split stops at the first CT sample."""
    copy_dir = tmp_path / "copy"
    shutil.copytree(mixed.version_dir, copy_dir, copy_function=shutil.copyfile)  # writable: shards are 0444
    ct = [r for r in pq.read_table(copy_dir / "_index.parquet").to_pylist() if r["source"] == "ct"]
    if mixed.manifest["format"] == "webdataset":
        for shard in {r["shard"] for r in ct}:
            data = bytearray((copy_dir / shard).read_bytes())
            at = 0
            while (at := data.find(b"\x93NUMPY", at)) >= 0:
                if data[at - 512:at - 509] == b"ct-":      # the member's name, in its 512-byte tar header
                    data[at:at + 6] = b"BROKEN"
                at += 6
            (copy_dir / shard).write_bytes(bytes(data))
    else:
        for shard in {r["shard"] for r in ct}:
            table = pq.read_table(copy_dir / shard)
            dtypes = ["int64" if s == "ct" else d for s, d in zip(table["source"].to_pylist(),
                                                                    table["dtype"].to_pylist(), strict=True)]
            table = table.set_column(table.schema.get_field_index("dtype"), "dtype", pa.array(dtypes))
            pq.write_table(table, copy_dir / shard, row_group_size=len(table))
            # the manifest records each shard's size: keep it true so the loader's size check passes,
            # and seal it again (the loader refuses a manifest edited after its build)
            manifest = json.loads((copy_dir / "manifest.json").read_text())
            for split in manifest["splits"].values():
                for entry in split["shards"]:
                    if entry["file"] == shard:
                        entry["bytes"] = (copy_dir / shard).stat().st_size
            manifest["dataset_hash"] = compute_dataset_hash(manifest)
            (copy_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardReadError, match="ct-"):
        list(ShardDataset(copy_dir, "train", shuffle=False))
    photos = [item["key"] for item in ShardDataset(copy_dir, "train", sources=["photos"])]
    assert sorted(photos) == index_keys(mixed, "train", source="photos")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_view_is_delivered_exactly_once_across_ranks_and_workers(mixed: BuildResult, world: int,
                                                                   workers: int) -> None:
    seen: list[str] = []
    for rank in range(world):
        dataset = ShardDataset(mixed.manifest_path, "train", sources=["photos"], rank=rank, world_size=world, seed=3)
        with make_loader(dataset, 4, workers) as loader:
            seen += keys_of(loader)
    assert Counter(seen) == Counter(index_keys(mixed, "train", source="photos"))


def test_a_view_shuffles_deterministically_per_epoch(mixed: BuildResult) -> None:
    def order(epoch: int, seed: int = 5) -> list[str]:
        dataset = ShardDataset(mixed.manifest_path, "train", sources=["ct"], seed=seed, shuffle_buffer=16)
        dataset.set_epoch(epoch)
        return [item["key"] for item in dataset]

    assert order(0) == order(0) and order(1) == order(1)
    assert order(0) != order(1) and sorted(order(0)) == sorted(order(1)) == index_keys(mixed, "train", source="ct")
    assert order(0) != order(0, seed=6)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_view_resumes_mid_epoch_with_exactly_what_was_left(mixed: BuildResult, workers: int) -> None:
    def loader() -> Any:
        dataset = ShardDataset(mixed.manifest_path, "train", sources=["ct"], seed=9, shuffle_buffer=8)
        return make_loader(dataset, 4, workers, collate="list")

    full = loader()
    full.set_epoch(2)
    whole = keys_of(full)
    first = loader()
    first.set_epoch(2)
    taken: list[str] = []
    for batch in first:
        taken += batch["key"]
        if len(taken) >= 8:
            state = first.state_dict()
            break
    first.close()
    assert state["sources"] == ["ct"] and state["samples"] == len(whole)
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert taken + keys_of(resumed) == whole
    # a state saved for one view does not load into another
    other = make_loader(ShardDataset(mixed.manifest_path, "train", sources=["photos"], seed=9, shuffle_buffer=8), 4)
    with pytest.raises(ConfigError, match="sources saved"):
        other.load_state_dict(state)


def test_unknown_sources_and_labels_are_config_errors_listing_what_exists(mixed: BuildResult) -> None:
    with pytest.raises(ConfigError, match=r"no source 'xray'.*\['ct', 'photos'\]"):
        ShardDataset(mixed.manifest_path, "train", sources=["xray"])
    with pytest.raises(ConfigError, match=r"no label 'cat'.*circle"):
        ShardDataset(mixed.manifest_path, "train", labels=["cat"])
    with pytest.raises(ConfigError, match=r"sources=\['ct'\]"):
        ShardDataset(mixed.manifest_path, "train", sources="ct")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"sources=\[\]: an empty view holds no sample; name at least one of "
                                          r"\['ct', 'photos'\]"):
        ShardDataset(mixed.manifest_path, "train", sources=[])
    with pytest.raises(ConfigError, match=r"labels=\[\]: an empty view"):
        ShardDataset(mixed.manifest_path, "train", labels=[])


def test_a_view_needs_the_index_the_manifest_names(mixed: BuildResult, tmp_path: Path) -> None:
    copy_dir = tmp_path / "copy"
    shutil.copytree(mixed.version_dir, copy_dir, copy_function=shutil.copyfile)  # writable: shards are 0444
    (copy_dir / "_index.parquet").unlink()
    with pytest.raises(IntegrityError, match="_index.parquet: the sample index is missing"):
        ShardDataset(copy_dir, "train", sources=["ct"], verify="off")
    # the default per-sample check needs it too (each sample's checksum), and says how to read without
    with pytest.raises(IntegrityError, match="the sample index is missing.*verify='off'"):
        ShardDataset(copy_dir, "valid")
    assert len(list(ShardDataset(copy_dir, "valid", verify="off"))) == mixed.manifest["splits"]["valid"]["samples"]


def test_a_mixed_batch_names_shapes_sources_and_fixes(mixed: BuildResult) -> None:
    loader = make_loader(ShardDataset(mixed.manifest_path, "train", seed=1), 32, 2)
    with pytest.raises(MixedShapesError) as caught:
        keys_of(loader)
    message = str(caught.value)
    assert "source photos" in message and "source ct" in message and "3×64×64" in message
    # ct itself mixes a radiograph with the slices: one source at a time is offered for photos only
    assert 'sources=["photos"]' in message and "source ct itself holds several shapes" in message
    # 2-channel slices beside 3-channel photos: transform.channels (which replicates 1-channel samples
    # only) cannot make them one, so it is not offered as if it could
    assert "give every source the same number of channels (2, 3 here" in message and 'collate="list"' in message
    assert "transform.channels: 3" not in message
    assert "stack expects" not in message and "Traceback" not in message
    # the three fixes each work
    assert sorted(keys_of(make_loader(ShardDataset(mixed.manifest_path, "train", sources=["photos"]), 32, 2))) \
        == index_keys(mixed, "train", source="photos")
    with make_loader(ShardDataset(mixed.manifest_path, "train"), 32, 2, collate="list") as loader:
        listed = list(loader)
    assert sorted(k for b in listed for k in b["key"]) == index_keys(mixed, "train")
    shapes = {tuple(im.shape) for b in listed for im in b["image"]}
    assert {(2, 64, 64), (3, 64, 64)} <= shapes <= {(1, 64, 64), (2, 64, 64), (3, 64, 64)}


@pytest.mark.slow   # three bench-loader runs, each starting DataLoader workers
def test_bench_loader_measures_a_mixed_split_with_the_list_collate_and_says_so(mixed: BuildResult,
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench-loader", str(mixed.manifest_path), "--seconds", "0.2",
                                       "--workers", "0,1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "collate list" in result.output and "several shapes" in result.output and "--sources" in result.output
    one = CliRunner().invoke(main, ["bench-loader", str(mixed.manifest_path), "--seconds", "0.2",
                                    "--workers", "0", "--sources", "photos"])
    assert one.exit_code == 0, one.output
    assert "(sources photos)" in one.output and "collate stack" in one.output and "several shapes" not in one.output
    refused = CliRunner().invoke(main, ["bench-loader", str(mixed.manifest_path), "--seconds", "0.2",
                                        "--workers", "0", "--collate", "stack"])
    assert refused.exit_code == 2 and "internal error" not in refused.output
    assert "mixes image shapes" in refused.output


def test_a_mixed_batch_of_one_source_does_not_offer_loading_one_source_at_a_time(mixed: BuildResult) -> None:
    """ct holds 1×64×64 radiographs and 2×64×64 slices: a batch of ct alone cannot be fixed by
    choosing a source, so the message leads with the fixes that work."""
    # the radiograph's patient lands in one split: a batch of ct samples from two splits mixes them
    items = [next(iter(ShardDataset(mixed.manifest_path, split, sources=["ct"], shuffle=False)))
             for split in ("train", "valid", "test")]
    assert len({tuple(item["image"].shape) for item in items}) == 2
    with pytest.raises(MixedShapesError) as caught:
        collate_stack(items, shapes=mixed.manifest["sample_schema"]["shapes"])
    message = str(caught.value)
    assert "source ct itself holds several shapes, so loading one source at a time does not help" in message
    assert "sources=[" not in message and "transform.channels: 2" in message and 'collate="list"' in message
    # a view of ct alone names ct alone (make_loader's collate gets the view's shapes): the photos are
    # not in it, so not where a shape comes from nor a fix
    view = ShardDataset(mixed.manifest_path, "train", sources=["ct"])
    assert set(view.shapes) == {"ct"}
    with pytest.raises(MixedShapesError) as caught:
        collate_stack(items, shapes=view.shapes)
    message = str(caught.value)
    assert "photos" not in message and "source ct" in message, message
    # a DataLoader made by hand (collate_fn=collate_stack) passes no shapes: the batch's own keys show
    # ct with both shapes, so the source view is not offered there either
    with pytest.raises(MixedShapesError) as caught:
        next(iter(DataLoader(items, batch_size=3, collate_fn=collate_stack)))
    message = str(caught.value)
    assert "source ct itself holds several shapes, so loading one source at a time does not help" in message
    assert "sources=[" not in message, message


def test_a_mixed_batch_through_a_plain_dataloader_names_the_sources_from_the_keys(mixed: BuildResult) -> None:
    """collate_fn=collate_stack in a DataLoader made by hand passes no manifest shapes: the error
    named the shapes and example keys, not the sources the README promises."""
    items = [next(iter(ShardDataset(mixed.manifest_path, "train", sources=[source], shuffle=False)))
             for source in ("ct", "photos")]
    assert len({tuple(item["image"].shape) for item in items}) == 2
    with pytest.raises(MixedShapesError) as caught:
        collate_stack(items)
    message = str(caught.value)
    assert "sample(s), source ct, e.g. ct-" in message and "sample(s), source photos, e.g. photos-" in message


def test_the_shape_note_of_a_one_source_view_names_that_source_and_not_the_view_as_the_fix(mixed: BuildResult) -> None:
    """ct alone mixes a 1-channel radiograph with 2-window slices: the note lists ct's shapes only,
    and points at transform.channels, not at --sources (the view already is one source)."""
    from packer.loader.bench import choose_collate

    ct = ShardDataset(mixed.manifest_path, "train", sources=["ct"])
    collate, note = choose_collate(ct, None)
    assert collate == "list" and note is not None
    assert "ct 1×64×64, 2×64×64" in note and "photos" not in note
    assert "transform.channels" in note and "--sources" not in note
    assert "photos 3×64×64" in ct.info.describe_shapes() and "photos" not in ct.info.describe_shapes(["ct"])


@pytest.mark.slow   # examples/train.py in two subprocesses
def test_train_example_names_the_shapes_or_trains_on_a_view(mixed: BuildResult) -> None:
    script = REPO / "examples" / "train.py"
    refused = subprocess.run([sys.executable, str(script), "--manifest", str(mixed.version_dir), "--epochs", "1",
                              "--workers", "0"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "several shapes" in refused.stderr and "--sources" in refused.stderr
    # the manifest records shapes per source over all splits: the message says so, not "the train samples have"
    assert "this dataset's sources hold samples of several shapes" in refused.stderr
    assert "over every split, so the train split may hold fewer" in refused.stderr
    trained = subprocess.run([sys.executable, str(script), "--manifest", str(mixed.version_dir), "--epochs", "1",
                              "--workers", "0", "--sources", "photos", "--batch-size", "8"],
                             capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr
    assert "epoch 0: step" in trained.stdout
    # a source the dataset does not have: the loader's message and its exit code (2), no traceback
    unknown = subprocess.run([sys.executable, str(script), "--manifest", str(mixed.version_dir), "--epochs", "1",
                              "--workers", "0", "--sources", "xray"], capture_output=True, text=True, timeout=300)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith("train.py: ") and "no source 'xray'" in unknown.stderr


def test_pad_collate_pads_height_and_width_and_refuses_channel_mixes(mixed: BuildResult) -> None:
    ct = make_loader(ShardDataset(mixed.manifest_path, "train", sources=["photos"]), 5, 0, collate="pad")
    batch = next(iter(ct))
    assert batch["image"].shape == (5, 3, 64, 64) and batch["size"].tolist() == [[64, 64]] * 5
    with pytest.raises(MixedShapesError, match="pads height and width"):
        keys_of(make_loader(ShardDataset(mixed.manifest_path, "train", seed=1), 32, 0, collate="pad"))
    assert isinstance(batch["image"], torch.Tensor) and np.array_equal(batch["label"].shape, (5,))


@pytest.mark.parametrize(("shapes", "wanted", "unwanted"), [
    # one source of volumes of two sizes: neither a view nor a channel count makes them one shape
    ({"ct": ((1, 4, 32, 40), (1, 4, 48, 24))}, "sample: {volume: {size: [D, H, W]}}",
     ("--sources", "transform.channels")),
    # one source of slices of two sizes: the kind's size does
    ({"ct": ((1, 32, 40), (1, 48, 24))}, "transform.<kind>.size", ("--sources", "transform.channels")),
    # two sources of one shape each, differing in channels: the view or the channel count (as before)
    ({"ct": ((2, 64, 64),), "photos": ((3, 64, 64),)}, "--sources", ()),
])
def test_the_bench_shape_note_offers_only_fixes_that_give_one_shape(shapes: dict[str, tuple[tuple[int, ...], ...]],
                                                                     wanted: str, unwanted: tuple[str, ...]) -> None:
    from types import SimpleNamespace

    from packer.loader.bench import choose_collate
    from packer.loader.readers import SplitInfo

    info = SimpleNamespace(shapes=shapes, describe_shapes=lambda sources=None: SplitInfo.describe_shapes(
        SimpleNamespace(shapes=shapes), sources))
    collate, note = choose_collate(SimpleNamespace(shape=None, view=None, info=info), None)
    assert collate == "list" and note is not None and wanted in note, note
    assert not any(text in note for text in unwanted), note


def test_a_job_packing_volumes_beside_2d_images_loads_whole_and_by_source(tmp_path: Path) -> None:
    """A NIfTI source packed as volumes (3×D×H×W) beside photos (3×H×W) built with exit 0 and a
    warning pointing to collate="list" or one source at a time, yet every ShardDataset of it was
    refused: 'sample_schema.shapes ... expected [C, D, H, W]'."""
    import cv2
    import nibabel as nib
    import yaml

    from packer.pipeline.build import BuildOptions, build

    raw = tmp_path / "raw"
    (raw / "photos").mkdir(parents=True)
    (raw / "vol").mkdir()
    rng = np.random.default_rng(5)
    for i in range(2):
        cv2.imwrite(str(raw / "photos" / f"p{i}.png"), rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
        volume = rng.normal(40, 200, (8, 8, 4)).astype(np.int16)
        nib.save(nib.Nifti1Image(volume, np.diag([2.0, 2.0, 3.0, 1.0])), raw / "vol" / f"v{i}.nii.gz")
    (raw / "photos" / "labels.csv").write_text("path,label,entity\np0.png,a,P0\np1.png,a,P1\n")
    (raw / "vol" / "cases.csv").write_text("path,entity,label\nv0.nii.gz,V0,b\nv1.nii.gz,V1,b\n")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "mixed-ranks",
        "sources": [{"kind": "image", "name": "photos", "root": str(raw / "photos"),
                     "table": str(raw / "photos" / "labels.csv")},
                    {"kind": "nifti", "name": "vol", "root": str(raw / "vol"),
                     "table": str(raw / "vol" / "cases.csv")}],
        "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
        "transform": {"image": {"size": [8, 8], "color": "rgb"},
                      "nifti": {"windows": [{"center": 40, "width": 400}] * 3, "sample": "volume"}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    schema = result.manifest["sample_schema"]
    assert schema["layout"] == "CDHW" and {len(s) for v in schema["shapes"].values() for s in v} == {3, 4}
    whole = make_loader(ShardDataset(result.version_dir, "train"), 4, collate="list")
    shapes = sorted(tuple(image.shape) for batch in whole for image in batch["image"])
    assert sorted(len(s) for s in shapes) == [3, 3, 4, 4]
    for source, rank in (("photos", 3), ("vol", 4)):
        view = list(ShardDataset(result.version_dir, "train", sources=[source]))
        assert len(view) == 2 and all(item["image"].dim() == rank for item in view)
    with pytest.raises(MixedShapesError):  # stacked, the two ranks are refused by name, as any mix is
        list(make_loader(ShardDataset(result.version_dir, "train", shuffle=False), 4))


@pytest.mark.parametrize(("label", "label_map", "name"), [
    (2, {"1": 0, "2": 1, "3": 2}, "2"),  # a Kaggle table's class ids: 2 is class '2', not index 2 (class '3')
    (np.int64(2), {"1": 0, "2": 1, "3": 2}, "2"),
    ("2", {"1": 0, "2": 1, "3": 2}, "2"),
    (4, {"0": 0, "1": 1, "2": 2, "4": 3}, "4"),  # was 'no label 4 ... its labels are [..., '4']'
    (1, {"circle": 0, "square": 1}, "square"),  # names that are no integers: an integer is an index
    (np.int32(0), {"circle": 0, "square": 1}, "circle"),
    ("square", {"circle": 0, "square": 1}, "square"),
])
def test_a_label_in_a_view_is_a_name_and_an_integer_a_class_id_where_the_names_are_ids(
        label: object, label_map: dict[str, int], name: str) -> None:
    from packer.loader.readers import _label_name

    assert _label_name(label, label_map, "m") == name


@pytest.mark.parametrize(("label", "label_map", "said"), [
    (3, {"0": 0, "1": 1, "2": 2, "4": 3}, "no label 3 .*an integer names the class id '3' here"),
    (2, {"circle": 0, "square": 1}, "no label 2 "),
    (True, {"circle": 0, "square": 1}, "no label True "),
])
def test_a_view_label_that_names_no_class_is_a_config_error(label: object, label_map: dict[str, int],
                                                            said: str) -> None:
    from packer.loader.readers import _label_name

    with pytest.raises(ConfigError, match=said):
        _label_name(label, label_map, "m")


@pytest.mark.parametrize("saved,resumed", [({"labels": ["square", "nodule"]}, {"labels": ["nodule", "square"]}),
                                           ({"sources": ["photos", "ct"]}, {"sources": {"ct", "photos"}})])
def test_a_view_is_a_set_so_its_listed_order_does_not_refuse_a_resume(mixed: BuildResult, saved: dict[str, Any],
                                                                       resumed: dict[str, Any]) -> None:
    """A view keeps the rows whose source and label are in it: ``labels=["a", "b"]`` and
    ``["b", "a"]`` deliver the same batches, yet a state saved for one was refused by the other
    ("saved for another dataset configuration"), and a view from a Python set (another order in
    each process) could never resume."""
    def loader(view: dict[str, Any]) -> Any:
        return make_loader(ShardDataset(mixed.manifest_path, "train", seed=4, shuffle_buffer=8, **view), 3,
                           collate="list")

    whole = keys_of(loader(saved))
    assert keys_of(loader(resumed)) == whole
    first = loader(saved)
    head = [key for batch in itertools.islice(first, 2) for key in batch["key"]]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    label_map = mixed.manifest["label_map"]
    if "labels" in saved:  # recorded in label-map order, sources sorted
        assert state["labels"] == sorted(saved["labels"], key=label_map.__getitem__)
    else:
        assert state["sources"] == sorted(saved["sources"])
    later = loader(resumed)
    later.load_state_dict(state)
    assert head + keys_of(later) == whole
    # a state a packer saved before the view was recorded canonically keeps the listed order
    key = next(iter(saved))
    later = loader(resumed)
    later.load_state_dict({**state, key: list(saved[key])})
    assert head + keys_of(later) == whole
