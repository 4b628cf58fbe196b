"""Masks as a walker brings them: saved by the usual tools in the usual layouts.

A mask saved as a JPEG-compressed TIFF is as lossy as a ``.jpg`` mask, which packer refuses
(``mask_unreadable``): JPEG invents class ids along every edge. The TIFF's pixels were packed with
those invented ids, silently where no classes were declared. A TIFF mask page whose Compression
tag is lossy (or may be, and the header cannot tell) is now ``mask_unreadable`` too, naming the
compression and the fix.

Pascal VOC's ``SegmentationClass/`` and ``SegmentationObject/`` and Cityscapes' ``gtFine/``
(``*_gtFine_labelIds.png``, ``*_gtFine_color.png``, ...) hold label maps; a source without a table
packed each as a training image. They are now left out as ``label_map``, as Kvasir's ``masks/``
and ISIC's ``_GroundTruth/`` are.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import webdataset as wds
import yaml
from PIL import Image

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.pipeline.discover import MaskPartners, discover, mask_named
from packer.transform.mask import MaskError, decode_mask, decode_mask_pages
from tests.test_targets import _build, _job

IDS = np.zeros((48, 64), np.uint8)
IDS[10:30, 12:40] = 1
IDS[32:44, 40:60] = 2


def _with_compression(tiff: bytes, number: int, pages: range = range(1 << 16)) -> bytes:
    """``tiff`` (a little-endian classic TIFF) with the Compression (259) of each IFD of ``pages``
    (all by default) set to ``number``: what the header says, whatever the strips hold."""
    out = bytearray(tiff)
    assert out[:4] == b"II*\x00"
    offset, page, patched = struct.unpack_from("<I", out, 4)[0], 0, 0
    while offset:
        count = struct.unpack_from("<H", out, offset)[0]
        for at in range(offset + 2, offset + 2 + 12 * count, 12):
            if page in pages and struct.unpack_from("<H", out, at)[0] == 259:
                struct.pack_into("<H", out, at + 8, number)
                patched += 1
        offset, page = struct.unpack_from("<I", out, offset + 2 + 12 * count)[0], page + 1
    assert patched == min(page, len(pages))
    return bytes(out)


def _plain_tiff(pages: list[np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.stack(pages) if len(pages) > 1 else pages[0], byteorder="<",
                     photometric="minisblack", compression=None, metadata=None)
    return buffer.getvalue()


def _jpeg_tiff(ids: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(ids).save(buffer, format="TIFF", compression="jpeg", quality=75)
    return buffer.getvalue()


def _mask_build(tmp_path: Path, masks: dict[str, bytes], classes: list[int] | None
                ) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """Build an image source pairing one image with each mask file of ``masks``: the bad-sample
    records and the packed masks, both by the mask's file name."""
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    rows = ["path,mask,entity"]
    rng = np.random.default_rng(0)
    for n, (name, data) in enumerate(masks.items()):
        Image.fromarray((rng.random(IDS.shape) * 255).astype(np.uint8)).save(raw / f"img{n}.png")
        (raw / name).write_bytes(data)
        rows.append(f"img{n}.png,{name},E{n}")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    mask: dict[str, Any] = {"column": "mask", **({"classes": classes} if classes is not None else {})}
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"), "label": "none", "mask": mask}
    result = _build(_job(tmp_path, [source], transform={"image": {"color": "gray"}},
                         validate={"max_bad_fraction": 1.0}))
    names = {f"img{n}.png": name for n, name in enumerate(masks)}
    bad = {names[Path(r["path"]).name]: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    packed: dict[str, np.ndarray] = {}
    for shard in sorted(result.version_dir.rglob("*.tar")):
        for item in wds.WebDataset(str(shard), shardshuffle=False):
            record = yaml.safe_load(item["json"])
            packed[names[Path(record["path"]).name]] = np.load(io.BytesIO(item["mask.npy"]))
    return bad, packed


@pytest.mark.parametrize("classes", [None, [0, 1, 2]])
def test_a_jpeg_compressed_tiff_mask_is_unreadable_as_a_jpeg_mask_is(tmp_path: Path, classes: list[int] | None
                                                                    ) -> None:
    """Quality 75 turns ids {0, 1, 2} into 0..4 along the edges: without classes they packed, with
    classes the record blamed undeclared ids and never said JPEG. Lossless TIFFs of the same ids
    pack exactly, and the lossy ones (JPEG decoded by OpenCV; old-style JPEG, WebP, JPEG 2000 it
    does not decode) are refused for their compression, never told to re-save as JPEG."""
    plain = _plain_tiff([IDS])
    masks = {"jpeg.tif": _jpeg_tiff(IDS), "ojpeg.tif": _with_compression(plain, 6),
             "webp.tif": _with_compression(plain, 50001), "jp2k.tif": _with_compression(plain, 34712),
             "none.tif": plain}
    for compression in ("lzw", "tiff_deflate"):
        buffer = io.BytesIO()
        Image.fromarray(IDS).save(buffer, format="TIFF", compression=compression)
        masks[f"{compression}.tif"] = buffer.getvalue()
    # Compression 7 holding a lossless JPEG stream (SOF3, as DNG and tifffile's lossless mode
    # write it) keeps the ids exactly: its frame marker says so, and it packs
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, IDS, compression="jpeg", compressionargs={"lossless": True})
    masks["ljpeg.tif"] = buffer.getvalue()
    bad, packed = _mask_build(tmp_path, masks, classes)
    assert sorted(bad) == ["jp2k.tif", "jpeg.tif", "ojpeg.tif", "webp.tif"]
    assert sorted(packed) == ["ljpeg.tif", "lzw.tif", "none.tif", "tiff_deflate.tif"]
    for mask in packed.values():
        assert np.array_equal(mask.reshape(IDS.shape), IDS)
    said = {"jpeg.tif": "JPEG (Compression 7)", "ojpeg.tif": "old-style JPEG (Compression 6)",
            "webp.tif": "WebP (Compression 50001)", "jp2k.tif": "JPEG 2000 (Compression 34712)"}
    for name, record in bad.items():
        message = record["message"]
        assert record["reason"] == "mask_unreadable", message
        assert said[name] in message and "lossy" in message and "invents class ids" in message, message
        assert "save the mask as PNG or as a TIFF with LZW, Deflate or no compression" in message, message
        assert f"mask {tmp_path / 'raw' / name}" in message and message.count(name) == 1, message
        assert "JPEG compression" not in message  # the fix for images OpenCV cannot decode is no fix for a mask


@pytest.mark.parametrize(("number", "name"), [
    (7, "JPEG"), (6, "old-style JPEG"), (34892, "DNG lossy JPEG"), (50001, "WebP"), (34927, "WebP"),
    (50002, "JPEG XL"), (52546, "JPEG XL"), (33003, "JPEG 2000"), (33005, "JPEG 2000"), (34712, "JPEG 2000"),
])
def test_the_decoder_refuses_every_lossy_tiff_compression_from_its_tag(number: int, name: str) -> None:
    """decode_mask and decode_mask_pages (the per-page decoder) refuse on the tag alone, on any
    page: a lossless first page does not let a lossy second one through."""
    plain = _plain_tiff([IDS, IDS])
    lossy = _with_compression(plain, number)
    for decoder in (decode_mask, decode_mask_pages):
        with pytest.raises(MaskError) as caught:
            decoder(lossy, "m.tif")
        assert caught.value.reason == "mask_unreadable"
        assert caught.value.message.startswith("m.tif page 0: ") and f"(Compression {number})" in caught.value.message
        assert name in caught.value.message
    # only the second page lossy
    with pytest.raises(MaskError, match=rf"^m\.tif page 1: .*\(Compression {number}\)"):
        decode_mask(_with_compression(plain, number, range(1, 2)), "m.tif")
    assert np.array_equal(decode_mask(plain, "m.tif"), np.stack([IDS, IDS]))


def _touch_png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 16), dtype=np.uint8)).save(path)


VOC = ["VOC2012/JPEGImages/2007_000032.jpg", "VOC2012/SegmentationClass/2007_000032.png",
       "VOC2012/SegmentationObject/2007_000032.png", "VOC2012/SegmentationClassAug/2007_000032.png"]
CITYSCAPES = ["leftImg8bit/train/aachen/aachen_000000_000019_leftImg8bit.png",
              "gtFine/train/aachen/aachen_000000_000019_gtFine_labelIds.png",
              "gtFine/train/aachen/aachen_000000_000019_gtFine_instanceIds.png",
              "gtFine/train/aachen/aachen_000000_000019_gtFine_labelTrainIds.png",
              "gtFine/train/aachen/aachen_000000_000019_gtFine_color.png",
              "gtCoarse/train/aachen/aachen_000000_000019_gtCoarse_labelIds.png"]


def test_voc_and_cityscapes_label_maps_are_named_by_their_folders() -> None:
    voc = MaskPartners.of(VOC)
    assert [mask_named(rel, voc) for rel in VOC] == [
        None, "folder 'SegmentationClass'", "folder 'SegmentationObject'", "folder 'SegmentationClassAug'"]
    city = MaskPartners.of(CITYSCAPES)
    assert [mask_named(rel, city) for rel in CITYSCAPES] == [None] + ["folder 'gtFine'"] * 4 + ["folder 'gtCoarse'"]


def test_cityscapes_endings_name_a_label_map_only_in_its_ground_truth_folder() -> None:
    """``_color``, ``_labelIds`` and the like say nothing of a file outside a masks folder: a
    photo ``sunset_color.png`` beside ``sunset.png`` is packed, and so is a gtFine file whose
    city/sequence/frame names no image of the source."""
    photos = ["photos/sunset.png", "photos/sunset_color.png", "photos/a_labelIds.png", "photos/a.png"]
    partners = MaskPartners.of(photos)
    assert [mask_named(rel, partners) for rel in photos] == [None] * 4
    alone = ["leftImg8bit/train/aachen/aachen_000000_000019_leftImg8bit.png",
             "gtFine/train/bonn/bonn_000000_000019_gtFine_labelIds.png"]
    assert mask_named(alone[1], MaskPartners.of(alone)) is None


@pytest.mark.parametrize(("layout", "kept", "folders"), [
    (VOC, ["VOC2012/JPEGImages/2007_000032.jpg"],
     ["SegmentationClass", "SegmentationClassAug", "SegmentationObject"]),
    (CITYSCAPES, ["leftImg8bit/train/aachen/aachen_000000_000019_leftImg8bit.png"], ["gtCoarse", "gtFine"]),
])
def test_a_voc_or_cityscapes_root_without_a_table_packs_only_its_images(
        tmp_path: Path, layout: list[str], kept: list[str], folders: list[str]) -> None:
    root = tmp_path / "data"
    for n, rel in enumerate(layout):
        _touch_png(root / rel, n)
    job = {"name": "seg", "sources": [{"kind": "image", "root": str(root), "label": "none", "entity": "path"}],
           "split": {"by": "entity", "seed": 1, "ratios": {"train": 1.0}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    found = discover(load_job(path))
    assert sorted(ref.relpath for ref in found.refs) == kept
    assert sorted(rel for rel in layout if rel not in kept) == sorted(
        str(Path(e.path).relative_to(root)) for e in found.excluded if e.why == "label_map")
    assert {e.detail.split(":")[0] for e in found.excluded} == {f"folder {f!r}" for f in folders}
    assert any(f"{len(layout) - 1} file(s) named as masks or label maps left out" in w for w in found.warnings)


def test_a_lossless_jpeg_tiff_mask_of_more_than_8_bits_is_told_opencv_cannot_decode_it() -> None:
    """A 16-bit lossless JPEG page (ids over 255) passed the lossless check, then OpenCV's 8-bit
    libjpeg failed and the record said only 're-export it'; it names the precision and the fix."""
    ids = np.zeros((16, 16), np.uint16)
    ids[4:8, 4:8], ids[10:14, 2:6] = 1, 300
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, ids, compression="jpeg", compressionargs={"lossless": True})
    with pytest.raises(MaskError) as raised:
        decode_mask(buffer.getvalue(), "m.tif")
    assert raised.value.reason == "mask_unreadable"
    assert "-bit lossless JPEG (Compression 7), which OpenCV's libtiff (8-bit JPEG only) does not decode" in \
        raised.value.message
    assert "save the mask as a 16-bit PNG" in raised.value.message
