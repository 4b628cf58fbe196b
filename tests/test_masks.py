"""Segmentation masks: packed next to their image, with exactly the image's geometry, and read back.

Every image here is drawn from its own mask (each class id a block of one intensity), so after
any transform a mask pixel must sit on an image pixel of its class's intensity: wherever the
mask is uniform around a pixel, the image value there is a function of the mask id alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.demo import write_ct_slice
from packer.errors import ConfigError
from packer.loader import ShardDataset, make_loader
from packer.pipeline.discover import discover
from packer.verify import verify_dataset
from tests.test_targets import _build, _job, _manifest

GREYS = {0: 20, 1: 90, 2: 160, 3: 230}  # class id -> grey of its block in a photo
HU = {0: -500, 1: 0, 2: 500, 3: 1000}   # class id -> HU of its block in a CT slice


def _blocks(height: int, width: int, seed: int, block: int = 12) -> np.ndarray:
    """A class-id map of ``block``-sized rectangles (non-square layout: transposes show)."""
    rng = np.random.default_rng(seed)
    rows, cols = -(-height // block), -(-width // (block + 4))
    ids = rng.integers(0, 4, size=(rows, cols)).astype(np.uint8)
    ids[0, 0], ids[-1, -1] = 1, 2  # never one class only
    return np.repeat(np.repeat(ids, block, axis=0), block + 4, axis=1)[:height, :width].copy()


def _png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, data = cv2.imencode(".png", array)
    assert ok
    path.write_bytes(data.tobytes())


def _uniform(mask: np.ndarray, radius: int = 2) -> np.ndarray:
    """Pixels of a 2-D mask whose (2·radius+1)² neighbourhood holds one id (edges excluded)."""
    h, w = mask.shape
    out = np.zeros_like(mask, dtype=bool)
    inner = mask[radius:h - radius, radius:w - radius]
    same = np.ones_like(inner, dtype=bool)
    for dr in range(-radius, radius + 1):
        for dc in range(-radius, radius + 1):
            same &= mask[radius + dr:h - radius + dr, radius + dc:w - radius + dc] == inner
    out[radius:h - radius, radius:w - radius] = same
    return out


def _assert_aligned(image: np.ndarray, mask: np.ndarray, seen: dict[int, set[int]]) -> None:
    """On every pixel inside a uniform mask region, the image value is one per mask id (±1):
    the mask labels the image's own pixels. ``seen`` gathers each id's value across samples."""
    assert mask.shape[-2:] == image.shape[-2:]
    for channel in range(image.shape[0]):
        for frame in range(mask.shape[0]):
            inside = _uniform(mask[frame])
            for cls in np.unique(mask[frame][inside]):
                found = image[channel][inside & (mask[frame] == cls)].astype(int)
                assert found.max() - found.min() <= 1, (cls, found.min(), found.max())
                seen.setdefault(int(cls), set()).add(int(found.min()))


def _check_seen(seen: dict[int, set[int]]) -> None:
    """Across samples each id kept its value (±1), and the ids' values differ."""
    assert len(seen) >= 3
    for values in seen.values():
        assert max(values) - min(values) <= 1, seen
    lowest = [min(v) for v in seen.values()]
    assert len(set(lowest)) == len(lowest), seen


def _photo_set(tmp: Path, sizes: list[tuple[int, int]]) -> Path:
    raw = tmp / "raw"
    rows = ["path,mask,entity,timestamp,label"]
    for i, (h, w) in enumerate(sizes):
        ids = _blocks(h, w, i)
        grey = np.vectorize(GREYS.get)(ids).astype(np.uint8)
        _png(raw / "img" / f"{i}.png", grey)
        _png(raw / "masks" / f"{i}.png", ids)
        rows.append(f"img/{i}.png,masks/{i}.png,E{i},2024-01-01,x")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    return raw


def _photo_source(raw: Path, **mask: Any) -> dict[str, Any]:
    return {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
            "mask": {"column": "mask", "classes": [0, 1, 2, 3, 255], "pad": 255, **mask}}


@pytest.mark.parametrize("image", [
    {"size": [40, 40], "resize": "fit", "color": "gray"},
    {"size": [40, 40], "resize": "crop", "color": "gray"},
    {"size": [30, 50], "resize": "stretch", "color": "gray"},
    {"size": [96, 96], "resize": "fit", "color": "rgb"},  # upscaling
    {"size": [64, 64], "color": "gray", "tile": {"size": [32, 32], "stride": [16, 16]}},
])
def test_image_masks_follow_every_resize_and_tile(tmp_path: Path, image: dict[str, Any]) -> None:
    raw = _photo_set(tmp_path, [(60, 90), (90, 60), (48, 48)])
    result = _build(_job(tmp_path, [_photo_source(raw)], transform={"image": image}))
    manifest = _manifest(result)
    assert manifest["mask"] == {"dtype": "uint8", "classes": [0, 1, 2, 3, 255], "layout": "FHW", "pad": 255}
    assert manifest["libraries"]["pillow"] != "not installed"  # it reads palette masks: part of the identity
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    tiles = 9 if "tile" in image else 1
    assert len(items) == 3 * tiles and not (result.version_dir / "bad_samples.jsonl").read_text()
    seen: dict[int, set[int]] = {}
    for item in items:
        assert item["mask"].dtype.is_floating_point is False and item["mask"].shape[0] == 1
        _assert_aligned(item["image"].numpy(), item["mask"].numpy(), seen)
    _check_seen(seen)
    assert verify_dataset(result.manifest_path, deep=True).ok


def test_the_pad_collate_pads_masks_with_the_datasets_pad_id(tmp_path: Path) -> None:
    """Photos kept at their own sizes, batched with collate="pad": the images are padded with
    zeros and the masks with the job's mask.pad (255 here, the id a loss ignores), as fit pads
    them; background (0) there would train the padding as background."""
    raw = _photo_set(tmp_path, [(30, 50), (44, 36), (48, 48)])
    result = _build(_job(tmp_path, [_photo_source(raw)], transform={"image": {"color": "gray"}}))
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train", shuffle=False), 3, 0, collate="pad")))
    assert batch["mask"].shape == (3, 1, 48, 50)
    for mask, (height, width) in zip(batch["mask"], batch["size"].tolist(), strict=True):
        assert (mask[:, height:, :] == 255).all() and (mask[:, :, width:] == 255).all()
        assert (mask[:, :height, :width] != 255).any()  # the mask itself, not padding


def test_an_exif_rotated_photo_and_its_mask_turn_together(tmp_path: Path) -> None:
    raw = _photo_set(tmp_path, [(40, 70)])
    png = raw / "img" / "0.png"
    # the same pixels as a TIFF whose Orientation (6: rotate 90° clockwise to view) the transform applies
    tiff = raw / "img" / "0.tif"
    ok, data = cv2.imencode(".tif", cv2.imread(str(png), cv2.IMREAD_UNCHANGED))
    assert ok
    tiff.write_bytes(_with_orientation(data.tobytes(), 6))
    png.unlink()
    (raw / "table.csv").write_text("path,mask,entity,timestamp,label\nimg/0.tif,masks/0.png,E0,2024-01-01,x\n")
    result = _build(_job(tmp_path, [_photo_source(raw)], transform={"image": {"color": "gray"}}))
    (item,) = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    assert tuple(item["image"].shape) == (1, 70, 40)  # turned upright
    seen: dict[int, set[int]] = {}
    _assert_aligned(item["image"].numpy(), item["mask"].numpy(), seen)
    _check_seen(seen)


def _with_orientation(tiff: bytes, orientation: int) -> bytes:
    """``tiff`` (little-endian, as OpenCV writes it) with an Orientation tag of ``orientation``
    added to its first IFD (rewritten at the end of the file)."""
    import struct

    assert tiff[:4] == b"II*\x00"
    ifd = struct.unpack_from("<I", tiff, 4)[0]
    count = struct.unpack_from("<H", tiff, ifd)[0]
    entries = [tiff[ifd + 2 + 12 * i: ifd + 14 + 12 * i] for i in range(count)]
    entries = [e for e in entries if struct.unpack_from("<H", e)[0] != 0x0112]
    entries.append(struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0))
    entries.sort(key=lambda e: struct.unpack_from("<H", e)[0])
    new_ifd = len(tiff) + len(tiff) % 2
    body = tiff + b"\0" * (new_ifd - len(tiff))
    body += struct.pack("<H", len(entries)) + b"".join(entries) + struct.pack("<I", 0)
    return body[:4] + struct.pack("<I", new_ifd) + body[8:]


def _ct_set(tmp: Path, frames: int, size: int = 48) -> Path:
    raw = tmp / "raw"
    rows = ["path,label,mask"]
    for i in range(3):
        ids = np.stack([_blocks(size, size, 10 * i + f, block=8) for f in range(frames)])
        hu = np.vectorize(HU.get)(ids).astype(np.float32)
        (raw / "ct").mkdir(parents=True, exist_ok=True)
        write_ct_slice(raw / "ct" / f"{i}.dcm", patient_id=f"P{i}", study_date="20240101",
                       pixels_hu=hu if frames > 1 else hu[0])
        (raw / "masks").mkdir(parents=True, exist_ok=True)
        if frames > 1:
            np.save(raw / "masks" / f"{i}.npy", ids)
            rows.append(f"ct/{i}.dcm,x,masks/{i}.npy")
        else:
            _png(raw / "masks" / f"{i}.png", ids[0])
            rows.append(f"ct/{i}.dcm,x,masks/{i}.png")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    return raw


def _aligned_train_items(manifest: Any, count: int) -> list[dict[str, Any]]:
    """The train split's ``count`` items, each mask checked aligned with its image, every class seen."""
    items = list(ShardDataset(manifest, "train", shuffle=False))
    assert len(items) == count
    seen: dict[int, set[int]] = {}
    for item in items:
        _assert_aligned(item["image"].numpy(), item["mask"].numpy(), seen)
    _check_seen(seen)
    return items


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
@pytest.mark.parametrize("dicom", [
    {"size": [32, 40], "resize": "fit"},
    {"size": [40, 40], "resize": "crop", "spacing": [11.0, 9.0]},  # resampled from the file's spacing first
])
def test_dicom_masks_follow_spacing_and_resize(tmp_path: Path, fmt: str, dicom: dict[str, Any]) -> None:
    raw = _ct_set(tmp_path, frames=1)
    source = {"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"),
              "mask": {"column": "mask", "classes": [0, 1, 2, 3, 255], "pad": 255}}
    windows = {"windows": [{"center": 250, "width": 2000}], **dicom}
    result = _build(_job(tmp_path, [source], fmt, transform={"dicom": windows}))
    _aligned_train_items(result.manifest_path, 3)
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=3)))
    assert batch["mask"].shape == (3, 1, *batch["image"].shape[-2:])
    if fmt == "webdataset":
        urls = sorted(str(p) for p in result.version_dir.glob("train-*.tar"))
        for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode():
            assert sample["mask.npy"].dtype == np.uint8 and sample["mask.npy"].shape[-2:] == sample["npy"].shape[-2:]
    else:
        for path in result.version_dir.glob("train-*.parquet"):
            for row in pq.read_table(path, columns=["mask", "mask_shape", "mask_dtype", "shape"]).to_pylist():
                assert row["mask_dtype"] == "uint8" and row["mask_shape"][1:] == row["shape"][1:]
                assert len(row["mask"]) == int(np.prod(row["mask_shape"]))
    assert verify_dataset(result.manifest_path, deep=True).ok


def test_a_multi_frame_dicom_split_into_frames_gives_each_frame_its_own_mask(tmp_path: Path) -> None:
    raw = _ct_set(tmp_path, frames=3)
    source = {"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"), "mask": {"column": "mask"}}
    result = _build(_job(tmp_path, [source], transform={"dicom": {"windows": [{"center": 250, "width": 2000}],
                                                                  "size": [40, 40], "frames": "split"}}))
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    assert len(items) == 9 and all(item["key"].endswith(("-f0000", "-f0001", "-f0002")) for item in items)
    masks, seen = set(), {}
    for item in items:
        _assert_aligned(item["image"].numpy(), item["mask"].numpy(), seen)
        masks.add(item["mask"].numpy().tobytes())
    _check_seen(seen)
    assert len(masks) == 9  # each frame got its own frame's mask


def test_bad_masks_are_reason_coded_bad_samples(tmp_path: Path) -> None:
    raw = _photo_set(tmp_path, [(40, 60)] * 6)
    _png(raw / "masks" / "1.png", _blocks(40, 50, 1))                      # wrong size
    bad_ids = _blocks(40, 60, 2)
    bad_ids[0, 0] = 7
    _png(raw / "masks" / "2.png", bad_ids)                                 # an undeclared class id
    (raw / "masks" / "3.png").unlink()                                     # no such file
    _png(raw / "masks" / "4.png", np.zeros((40, 60), np.uint8))            # all background
    table = (raw / "table.csv").read_text().replace("img/5.png,masks/5.png", "img/5.png,")  # no mask named
    (raw / "table.csv").write_text(table)
    result = _build(_job(tmp_path, [_photo_source(raw, empty="bad")], validate={"max_bad_fraction": 0.9}))
    reasons = {Path(r["path"]).name: (r["reason"], r["message"])
               for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert {name: reason for name, (reason, _) in reasons.items()} == {
        "1.png": "mask_size", "2.png": "mask_values", "3.png": "mask_missing", "4.png": "mask_empty",
        "5.png": "mask_missing"}
    assert "40×50" in reasons["1.png"][1] and "40×60" in reasons["1.png"][1]
    assert "7" in reasons["2.png"][1]
    assert _manifest(result)["splits"]["train"]["samples"] == 1


def test_mask_settings_are_checked_when_the_job_is_read(tmp_path: Path) -> None:
    raw = _photo_set(tmp_path, [(40, 60)])
    with pytest.raises(ConfigError, match="pad: 9 is not one of the declared classes"):
        load_job(_job(tmp_path, [_photo_source(raw, pad=9)]))
    with pytest.raises(ConfigError, match=r"mask\.pad: 300 is above 255, and with no classes declared masks are "
                                          r"uint8.*classes: \[0, 1, \.\.\., 300\]"):
        load_job(_job(tmp_path, [{**_photo_source(raw), "mask": {"column": "mask", "pad": 300}}]))
    wide = load_job(_job(tmp_path, [_photo_source(raw, classes=[0, 1, 2, 3, 300], pad=300)]))
    assert wide.sources[0].mask is not None and wide.sources[0].mask.dtype == "uint16"  # declared: uint16 masks
    masked, bare = _photo_source(raw), {**_photo_source(raw), "name": "other"}
    bare.pop("mask")
    with pytest.raises(ConfigError, match="pack masks but 'other' does not"):
        load_job(_job(tmp_path, [{**masked, "name": "seg"}, bare]))
    folder = {"kind": "image", "root": str(raw), "label": "folder", "mask": {"column": "mask"}}
    with pytest.raises(ConfigError, match="masks are named by a column of the source's table"):
        load_job(_job(tmp_path, [folder]))


def test_a_changed_mask_file_is_decoded_again(tmp_path: Path) -> None:
    raw = _photo_set(tmp_path, [(40, 60), (40, 60)])
    job = _job(tmp_path, [_photo_source(raw)])
    first = _build(job)
    changed = _blocks(40, 60, 99)
    _png(raw / "masks" / "0.png", changed)
    second = _build(job)
    assert _manifest(first)["dataset_hash"] != _manifest(second)["dataset_hash"]
    again = _build(job)
    assert _manifest(again)["dataset_hash"] == _manifest(second)["dataset_hash"]
    assert _manifest(again)["mask"]["classes"] == [0, 1, 2, 3, 255]


def test_a_16_bit_mask_needs_its_ids_declared(tmp_path: Path) -> None:
    raw = _photo_set(tmp_path, [(40, 60), (40, 60)])
    ids = _blocks(40, 60, 0).astype(np.uint16) * 100  # ids 0, 100, 200, 300
    np.save(raw / "masks" / "0.npy", ids)
    (raw / "masks" / "0.png").unlink()  # no longer named by the table: it would be listed as an image
    (raw / "table.csv").write_text((raw / "table.csv").read_text().replace("masks/0.png", "masks/0.npy"))
    result = _build(_job(tmp_path, [{**_photo_source(raw), "mask": {"column": "mask"}}],
                         validate={"max_bad_fraction": 0.9}))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "mask_values" and "mask.classes" in record["message"]
    declared = {**_photo_source(raw), "mask": {"column": "mask", "classes": [0, 1, 2, 3, 100, 200, 300]}}
    # (1.png's ids 0-3 fit the declared list too)
    result = _build(_job(tmp_path / "declared", [declared]))
    assert _manifest(result)["mask"]["dtype"] == "uint16"
    masks = [item["mask"] for item in ShardDataset(result.manifest_path, "train", shuffle=False)]
    assert {int(v) for m in masks for v in m.unique()} >= {100, 300}


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_rebuild_reads_images_and_masks_back_from_the_published_shards(tmp_path: Path, fmt: str) -> None:
    """The pack pass frees the spill; the next build of the same samples (here another split
    seed: a new version) reads them back from the last version's shards, masks included, and
    gives the bytes of a fresh build."""
    raw = _photo_set(tmp_path, [(60, 90), (90, 60), (48, 48), (40, 60)])
    image = {"size": [40, 40], "resize": "fit", "color": "gray"}

    def job(folder: Path, seed: int) -> Path:
        return _job(folder, [_photo_source(raw)], fmt=fmt, transform={"image": image},
                    split={"by": "entity", "ratios": {"train": 1.0}, "seed": seed})

    first = _build(job(tmp_path / "a", 0))
    again = _build(job(tmp_path / "a", 1))
    fresh = _build(job(tmp_path / "b", 1))
    assert first.files_decoded == 4 and again.files_decoded == 0 and fresh.files_decoded == 4
    assert again.version_dir != first.version_dir
    assert _manifest(again)["dataset_hash"] == _manifest(fresh)["dataset_hash"]
    shards = sorted(p.name for p in again.version_dir.iterdir() if p.suffix in (".tar", ".parquet"))
    assert shards and all((again.version_dir / n).read_bytes() == (fresh.version_dir / n).read_bytes()
                          for n in shards)
    seen: dict[int, set[int]] = {}
    for item in ShardDataset(again.manifest_path, "train", shuffle=False):
        _assert_aligned(item["image"].numpy(), item["mask"].numpy(), seen)


def test_a_mask_column_the_table_lacks_is_a_config_error_naming_the_header(tmp_path: Path) -> None:
    """A typo in mask.column is the job's mistake, said before anything is decoded, as a
    misspelt label column is: not every image a mask_missing bad sample and every mask an input."""
    raw = _photo_set(tmp_path, [(40, 60)] * 3)
    job = load_job(_job(tmp_path, [_photo_source(raw, column="seg_mask")]))
    with pytest.raises(ConfigError, match=r"sources\[0\].table .*table.csv: missing column .seg_mask. .*did you "
                                          r"mean .mask.*the header "
                                          r"row has path, .*mask"):
        discover(job)


def test_an_unlabelled_dicom_source_takes_its_masks_from_its_table(tmp_path: Path) -> None:
    """A segmentation set without class labels (SIIM-ACR's masks converted to PNG, say) has a
    table naming each DICOM file's mask; with label: none that table was refused as "unused"
    although mask: {column} uses it, and the README says masks go with any target kind."""
    raw = _ct_set(tmp_path, frames=1)
    source = {"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"), "label": "none",
              "mask": {"column": "mask", "classes": [0, 1, 2, 3, 255], "pad": 255}}
    result = _build(_job(tmp_path, [source], transform={"dicom": {"windows": [{"center": 250, "width": 2000}],
                                                                  "size": [40, 40]}}))
    items = _aligned_train_items(result.manifest_path, 3)
    assert all("label" not in item for item in items)  # an unlabeled dataset's items hold no label



@pytest.mark.parametrize("sample", [{"neighbors": 1, "edge": "replicate"}, "volume"], ids=["neighbors", "volume"])
def test_a_dicom_table_mask_is_per_slice_only_and_the_readme_says_so(tmp_path: Path, sample: Any) -> None:
    """Neighbour stacks and volumes are built from series, and a DICOM file's table mask is
    packed per slice only: the job is refused before anything is read. The README said such a
    mask goes "to every sample, with any target kind" and never said this; it now says so where
    it describes table masks and where it describes stacks and volumes, quoting the error."""
    from tests.demo_version import REPO

    raw = _ct_set(tmp_path, frames=1)
    source = {"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"), "label": "none",
              "mask": {"column": "mask", "classes": [0, 1, 2, 3]}}
    with pytest.raises(ConfigError, match="mask: {from: dicom}") as refused:
        load_job(_job(tmp_path, [source], transform={"dicom": {"windows": ["lung"], "sample": sample}}))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table_masks = " ".join(readme.split("A source's `mask: {column: mask", 1)[1].split("\n#### ", 1)[0].split())
    series = " ".join(readme.split("\n### Series: 2.5D neighbour stacks", 1)[1].split("\n### ", 1)[0].split())
    for section in (table_masks, series):
        assert "packed per slice only" in section and "`mask: {from: dicom}`" in section
        assert "`sample: {neighbors: k}`" in section and "`volume`" in section
    quoted = re.search(r"exit 2: `([^`]+)`", table_masks)
    assert quoted is not None and quoted[1] in " ".join(str(refused.value).split())

def test_a_mask_whose_header_claims_another_size_is_refused_before_it_is_decoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 140 KB PNG mask claiming 12000×12000 was decoded whole (a quarter of a GB, past the
    job's limits on images) only to be refused as mask_size after; its header says so first."""
    import zlib

    from packer.transform import mask as mask_module

    raw = _photo_set(tmp_path, [(40, 60)] * 2)
    side = 12000  # a grey PNG of 0 rows, compressed: tiny on disk, 144 MB decoded
    rows = zlib.compress(b"\0" * (side + 1) * side, 9)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    ihdr = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    (raw / "masks" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows)
                                          + chunk(b"IEND", b""))
    decoded: list[str] = []
    real = mask_module.decode_mask
    monkeypatch.setattr("packer.read.masks.decode_mask", lambda data, name: decoded.append(name) or real(data, name))
    result = _build(_job(tmp_path, [_photo_source(raw)], validate={"max_bad_fraction": 0.9}))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert (Path(record["path"]).name, record["reason"]) == ("1.png", "mask_size")
    assert "its header gives 12000×12000 pixels, the image 40×60" in record["message"]
    assert not any(name.endswith("1.png") for name in decoded)


def test_an_image_source_records_pillow_which_decodes_grey_alpha_tiffs_and_a_dicom_one_does_not(
        tmp_path: Path) -> None:
    """Pillow decodes 8-bit grey+alpha TIFF pages of any image source, yet only mask files put its
    version in the manifest and the cache keys: a Pillow upgrade reused what the old one decoded."""
    from packer.read.kinds import source_libraries

    raw = _photo_set(tmp_path, [(20, 20)])
    job = load_job(_job(tmp_path, [{"kind": "image", "root": str(raw), "table": str(raw / "table.csv")}]))
    assert "pillow" in source_libraries(job.sources)
    dicom = load_job(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "name": "ct"}]))
    assert "pillow" not in source_libraries(dicom.sources)


def test_a_tiff_with_a_thumbnail_before_a_page_gives_each_full_page_its_own_mask_page(tmp_path: Path) -> None:
    """IFDs: page, reduced-resolution thumbnail, page, page; the mask has one page per full page.
    The mask page was picked by the IFD index (2 and 3), so mask[3] of 3 pages crashed the build."""
    import tifffile

    raw = tmp_path / "raw"
    (raw / "masks").mkdir(parents=True)
    rng = np.random.default_rng(0)
    pages = [rng.integers(0, 256, (20, 30), np.uint8) for _ in range(3)]
    with tifffile.TiffWriter(raw / "slide.tif") as tif:
        tif.write(pages[0], photometric="minisblack")
        tif.write(pages[0][::4, ::4], photometric="minisblack", subfiletype=1)  # reduced resolution: no page
        tif.write(pages[1], photometric="minisblack")
        tif.write(pages[2], photometric="minisblack")
    masks = np.stack([np.full((20, 30), i + 1, np.uint8) for i in range(3)])
    np.save(raw / "masks" / "slide_mask.npy", masks)
    (raw / "table.csv").write_text("path,label,entity,mask\nslide.tif,a,p1,masks/slide_mask.npy\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "mask": {"column": "mask", "classes": [0, 1, 2, 3]}}
    result = _build(_job(tmp_path, [source], transform={"image": {"color": "gray", "size": [20, 30]}}))
    items = {item["key"][-6:]: item for item in ShardDataset(result.manifest_path, "train", shuffle=False)}
    assert sorted(items) == ["p00000", "p00002", "p00003"]
    for suffix, fill in (("p00000", 1), ("p00002", 2), ("p00003", 3)):
        assert np.unique(items[suffix]["mask"].numpy()).tolist() == [fill], suffix


@pytest.mark.parametrize("size", [None, [16, 20]])
def test_a_tiff_whose_pages_differ_in_size_checks_each_pages_mask_against_that_page(
        tmp_path: Path, size: list[int] | None) -> None:
    """Pages 32×40 and 16×24 (not reduced-resolution: each is a sample). Every page's mask was
    checked against page 0's size: the per-page TIFF mask (32×40 + 16×24), the one mask that
    labels these pages one to one, was refused; a 2×32×40 .npy passed and page 1's 32×40 grid was
    stretched onto the 16×24 page (packed misplaced; without a resize, unexpected_error). Each
    page's mask is checked against its own page: the TIFF mask packs aligned, the .npy is a
    mask_size record naming page 1."""
    import tifffile

    raw = tmp_path / "raw"
    raw.mkdir()
    rows = ["path,mask,entity,label"]
    for k in range(2):
        masks = [np.zeros((32, 40), np.uint8), np.zeros((16, 24), np.uint8)]
        masks[0][4:24, 2:30], masks[1][6:14, 10:20] = 1, 2
        images = [np.vectorize(GREYS.get)(m).astype(np.uint8) for m in masks]
        with tifffile.TiffWriter(raw / f"s{k}.tif") as tif:
            for image in images:
                tif.write(image, photometric="minisblack")
        if k == 0:
            with tifffile.TiffWriter(raw / "s0_m.tif") as tif:
                for mask in masks:
                    tif.write(mask, photometric="minisblack")
            rows.append("s0.tif,s0_m.tif,e0,a")
        else:
            on_page0_grid = np.zeros((2, 32, 40), np.uint8)
            on_page0_grid[0], on_page0_grid[1, :16, :24] = masks
            np.save(raw / "s1_m.npy", on_page0_grid)
            rows.append("s1.tif,s1_m.npy,e1,a")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "mask": {"column": "mask", "classes": [0, 1, 2]}}
    transform = {"image": {"color": "gray", **({"size": size} if size else {})}}
    result = _build(_job(tmp_path, [source], transform=transform, validate={"max_bad_fraction": 0.5}))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert [(Path(b["path"]).name, b["reason"]) for b in bad] == [("s1.tif", "mask_size")], bad
    assert "mask page 1 is 32×40 but image page 1 is 16×24" in bad[0]["message"]
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    assert sorted(item["key"][-6:] for item in items) == ["p00000", "p00001"]
    seen: dict[int, set[int]] = {}
    for item in items:
        image, mask = item["image"].numpy(), item["mask"].numpy()
        assert image.shape[1:] == mask.shape[1:] == ((32, 40) if item["key"].endswith("p00000") and not size
                                                     else (16, 24) if not size else tuple(size))
        _assert_aligned(image, mask, seen)
    _check_seen(seen)
