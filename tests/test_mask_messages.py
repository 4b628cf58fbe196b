"""Bad-mask records say what is wrong once, in the user's terms, with the fix that applies.

Each test packs real image and mask files through a build and reads the bad-sample record: its
reason code (which the checks already get right) and its message, which must name the mask file
once, describe the mask as it was saved, and give a fix the user has not already made.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from packer.badsamples import read_bad_samples
from packer.transform.mask import MaskError, check_mask
from tests.test_targets import _build, _job

IDS = np.zeros((40, 60), np.uint8)
IDS[5:20, 5:30] = 1  # a 40×60 label map of classes 0 and 1 (not square: a transpose shows)


def _records(tmp_path: Path, rows: dict[str, str]) -> dict[str, dict[str, str]]:
    """Build an image source whose table pairs each image (relative path) with its mask; the
    bad-sample records, by image file name. The images and masks must already be written."""
    raw = tmp_path / "raw"
    lines = ["path,mask,entity,label"] + [f"{image},{mask},E{n},x" for n, (image, mask) in enumerate(rows.items())]
    (raw / "table.csv").write_text("\n".join(lines) + "\n")
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "mask": {"column": "mask", "classes": [0, 1]}}
    result = _build(_job(tmp_path, [source], transform={"image": {"color": "gray"}},
                         validate={"max_bad_fraction": 1.0}))
    return {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}


def _image(raw: Path, name: str, ids: np.ndarray = IDS) -> str:
    (raw / "img").mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(raw / "img" / name), (ids * 100 + 20).astype(np.uint8))
    return f"img/{name}"


def _mask_dir(raw: Path) -> Path:
    (raw / "m").mkdir(parents=True, exist_ok=True)
    return raw / "m"


def test_a_mask_defect_found_while_decoding_names_the_mask_file_once(tmp_path: Path) -> None:
    """decode_mask puts the mask's name in its messages and the record prefixed it again:
    "a.png: mask M: M: a colour mask". Every record names the image, then the mask once."""
    raw = tmp_path / "raw"
    masks = _mask_dir(raw)
    cv2.imwrite(str(masks / "colour.png"), np.dstack([IDS * 50, IDS * 10, IDS]))
    cv2.imwrite(str(masks / "lossy.jpg"), IDS * 255)
    np.save(masks / "half.npy", IDS.astype(np.float32) / 2)
    np.save(masks / "negative.npy", IDS.astype(np.int16) - 1)
    cv2.imwrite(str(masks / "small.png"), IDS[:, :50])
    rows = {_image(raw, f"{name}.png"): f"m/{mask}" for name, mask in (
        ("colour", "colour.png"), ("lossy", "lossy.jpg"), ("half", "half.npy"), ("negative", "negative.npy"),
        ("small", "small.png"))}
    records = _records(tmp_path, rows)
    assert {name: r["reason"] for name, r in records.items()} == {
        "colour.png": "mask_values", "lossy.png": "mask_unreadable", "half.png": "mask_values",
        "negative.png": "mask_values", "small.png": "mask_size"}
    for image, mask in rows.items():
        message = records[Path(image).name]["message"]
        assert message.startswith(f"{raw / image}: mask {raw / mask}"), message
        assert message.count(mask) == 1, message


def test_a_pickled_object_array_mask_is_refused_as_a_pickle_not_as_a_short_file(tmp_path: Path) -> None:
    """np.save of an object array (a list of arrays, a ragged stack) writes a whole file holding a
    pickle; its record said the header "promises a 1×40×60 object array, more than the file's 5085
    bytes", a truncation that is not so. It says the file holds Python objects and how to save it."""
    raw = tmp_path / "raw"
    masks = _mask_dir(raw)
    np.save(masks / "boxed.npy", np.array([IDS], dtype=object), allow_pickle=True)
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = IDS, IDS[:10]
    np.save(masks / "ragged.npy", ragged, allow_pickle=True)
    records = _records(tmp_path, {_image(raw, "boxed.png"): "m/boxed.npy", _image(raw, "ragged.png"): "m/ragged.npy"})
    assert {name: r["reason"] for name, r in records.items()} == {
        "boxed.png": "mask_unreadable", "ragged.png": "mask_unreadable"}
    for record in records.values():
        message = record["message"]
        assert "more than the file's" not in message, message
        assert "Python objects (a pickle)" in message and "save an integer array" in message, message


def test_a_channels_last_npy_mask_is_named_as_saved_with_the_axis_to_drop(tmp_path: Path) -> None:
    """An H×W×1 .npy (as Keras, PIL and OpenCV pipelines keep a label map) was read as "40×60×1
    (frames×height×width)", 40 frames of 60×1, with no fix. Its record says height×width×channels,
    that its height and width are the image's, and to drop the last axis; an H×W×3 whose channels
    differ is a colour mask, which no axis drop makes a label map."""
    raw = tmp_path / "raw"
    masks = _mask_dir(raw)
    np.save(masks / "one.npy", IDS[:, :, None])
    np.save(masks / "grey.npy", np.dstack([IDS] * 3))
    np.save(masks / "colour.npy", np.dstack([IDS * 50, IDS * 10, IDS]))
    records = _records(tmp_path, {_image(raw, f"{name}.png"): f"m/{name}.npy" for name in ("one", "grey", "colour")})
    assert {name: r["reason"] for name, r in records.items()} == {
        "one.png": "mask_size", "grey.png": "mask_size", "colour.png": "mask_size"}
    for record in records.values():
        message = record["message"]
        assert "frames×height×width) but" not in message, message
        assert "channels last" in message and "the image's 40×60" in message, message
    assert "drop the last axis" in records["one.png"]["message"]
    assert "keep one of its 3 equal channels" in records["grey.png"]["message"]
    assert "a colour mask is not a label map" in records["colour.png"]["message"]


def test_a_frames_last_mask_of_a_multi_frame_image_is_told_to_move_its_frames_first() -> None:
    """A 3-frame image's mask saved H×W×F (frames last, as a NIfTI-minded pipeline stacks them) is
    not channels: its record says frames last and to move that axis first."""
    with pytest.raises(MaskError) as caught:
        check_mask(np.zeros((40, 60, 3), np.uint8), height=40, width=60, frames=3, classes=None)
    assert caught.value.reason == "mask_size"
    assert "frames last" in caught.value.message and "numpy.moveaxis(mask, -1, 0)" in caught.value.message


def _exif_jpeg(path: Path, ids: np.ndarray, orientation: int) -> None:
    """A grey JPEG of ``ids`` as stored, with an EXIF Orientation of ``orientation`` (as a phone writes it)."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((ids * 100 + 20).astype(np.uint8)).save(path, quality=95, exif=exif.tobytes())


def test_a_mask_drawn_on_an_exif_rotated_photo_as_displayed_is_told_so(tmp_path: Path) -> None:
    """A phone photo (EXIF Orientation 6 or 8) whose mask was drawn on the photo as every viewer
    shows it, upright: the mask has the *displayed* size, W×H. It is mask_size (a mask labels the
    stored pixels), but the record said "save it at the image's size", which the user did. It names
    the orientation, that the mask has the displayed size, and how to turn the mask back. A PNG
    mask is refused from its header, a .npy one after decoding: both say so."""
    raw = tmp_path / "raw"
    masks = _mask_dir(raw)
    rows = {}
    for orientation, turned, fmt in ((6, np.rot90(IDS, -1), "png"), (8, np.rot90(IDS, 1), "npy")):
        _exif_jpeg(raw / "img" / f"o{orientation}.jpg", IDS, orientation)
        if fmt == "png":
            cv2.imwrite(str(masks / f"o{orientation}.png"), turned.copy())
        else:
            np.save(masks / f"o{orientation}.npy", turned.copy())
        rows[f"img/o{orientation}.jpg"] = f"m/o{orientation}.{fmt}"
    cv2.imwrite(str(masks / "small.png"), IDS[:, :50])  # another size on an unrotated photo: as before
    rows[_image(raw, "small.png")] = "m/small.png"
    records = _records(tmp_path, rows)
    assert {name: r["reason"] for name, r in records.items()} == {
        "o6.jpg": "mask_size", "o8.jpg": "mask_size", "small.png": "mask_size"}
    for orientation, undo in ((6, "numpy.rot90(mask)"), (8, "numpy.rot90(mask, -1)")):
        message = records[f"o{orientation}.jpg"]["message"]
        assert f"EXIF Orientation {orientation}" in message and "displayed" in message, message
        assert "60×40" in message and undo in message and "strip the image's orientation" in message, message
        assert "so save it at the image's size" not in message, message
    assert "Orientation" not in records["small.png"]["message"]


def test_a_tiff_mask_in_a_compression_opencv_does_not_decode_is_unreadable_not_background(tmp_path: Path) -> None:
    """A TIFF mask compressed with ZSTD or JPEG 2000 (as tifffile and pathology tools write them)
    decoded to zeros, background everywhere, with no record; a Deflate one packs as before."""
    import tifffile

    raw = tmp_path / "raw"
    masks = _mask_dir(raw)
    tifffile.imwrite(masks / "zstd.tif", IDS, compression="zstd")
    tifffile.imwrite(masks / "deflate.tif", IDS, compression="zlib")
    rows = {_image(raw, "zstd.png"): "m/zstd.tif", _image(raw, "deflate.png"): "m/deflate.tif"}
    records = _records(tmp_path, rows)
    assert set(records) == {"zstd.png"}
    assert records["zstd.png"]["reason"] == "mask_unreadable"
    assert "ZSTD" in records["zstd.png"]["message"] and "Deflate" in records["zstd.png"]["message"]
