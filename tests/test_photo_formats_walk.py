"""Photos a walk through real-world formats found mishandled.

- A valid 12-bit JPEG (SOF1 extended, or SOF3 lossless at 12 or 16 bits) was ``decode_failed``
  "re-export it, or remove it": blamed on the file, when OpenCV (packer's decoder) reads only
  8-bit JPEG. It is ``unsupported``, naming the precision and the fix, as a 12-bit JPEG inside a
  TIFF is; an 8-bit lossless JPEG still packs exactly.
- A TIFF of more than 4 samples per pixel (RGB + alpha + a saved selection, as Photoshop writes:
  ExtraSamples [2, 0]) was ``decode_failed`` too: OpenCV reads 1 to 4 samples a pixel. It is
  ``unsupported``, naming the layout (samples per pixel, ExtraSamples) and the fix.
- Images under JFIF's own suffixes (``.jif``, ``.jfi``), Canon's HEIF suffix (``.hif``), HEIF and
  AVIF image sequences (``.heics``, ``.heifs``, ``.avifs``) and camera raw suffixes beyond
  .dng/.cr2/.nef/.arw vanished from a build: not packed, not in ``excluded.jsonl``, not counted.
  Each is left out as ``unsupported_format`` with its fix.

Files are real, written by imagecodecs (libjpeg-turbo 3's 12-bit and lossless encoders) or
tifffile; an independent decoder (imagecodecs, tifffile) reads each one back, so the file is known
to be valid.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import imagecodecs
import numpy as np
import pytest
import tifffile
import yaml

from packer.config import ImageTransformConfig, load_job
from packer.pipeline.discover import discover
from packer.read.image import probe_image, read_image
from packer.records import Issue, Sample, SampleRef

#: a window in 12-bit units, so that a decoded 12-bit image would have a range to scale to 8 bits
DEFAULT = ImageTransformConfig()
WINDOW_12 = ImageTransformConfig(window=(("center", 2048), ("width", 4096)))
_R, _C = np.mgrid[0:40, 0:60]
#: a 12-bit grey ramp that uses values above 255
GREY_12 = ((_R * 60 + _C * 30) % 4000 + 50).astype(np.uint16)


def make_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="s", source="photos", kind="image", path=str(path), relpath=path.name,
                     label="a", entity="e", time="2024-01-01")


def read_ok(path: Path, cfg: ImageTransformConfig = DEFAULT) -> list[Sample]:
    result = read_image(make_ref(path), cfg)
    assert not isinstance(result, Issue), result
    return result


def read_issue(path: Path, cfg: ImageTransformConfig = DEFAULT) -> Issue:
    result = read_image(make_ref(path), cfg)
    assert isinstance(result, Issue), f"expected an Issue, got {[s.key for s in result]}"
    assert result.message.startswith(f"{path.name}: ")
    return result


# --- 1. JPEG of another precision than 8 bits -----------------------------------------------------

WIDE_JPEGS = {
    "sof1_12bit.jpg": (lambda: imagecodecs.jpeg8_encode(np.dstack([GREY_12] * 3), level=95, bitspersample=12), 12),
    "sof1_12bit_grey.jpg": (lambda: imagecodecs.jpeg8_encode(GREY_12, level=95, bitspersample=12), 12),
    "lossless_12bit.jpg": (lambda: imagecodecs.ljpeg_encode(GREY_12, bitspersample=12), 12),
    "lossless_16bit.jpg": (lambda: imagecodecs.ljpeg_encode(GREY_12 * 16, bitspersample=16), 16),
}


@pytest.mark.parametrize("name", sorted(WIDE_JPEGS))
def test_a_valid_jpeg_of_more_than_8_bits_is_unsupported_naming_its_precision_not_damaged(
        tmp_path: Path, name: str) -> None:
    encode, bits = WIDE_JPEGS[name]
    path = tmp_path / name
    path.write_bytes(encode())
    assert int(imagecodecs.imread(str(path)).max()) > 255  # valid: an independent decoder reads it at full depth
    header = probe_image(make_ref(path))
    assert not isinstance(header, Issue) and header.bit_depth == bits  # the header pass lets it through
    issue = read_issue(path, WINDOW_12)
    assert issue.reason == "unsupported" and issue.stage == "read", issue.message
    assert f"a {bits}-bit JPEG (SOF precision {bits}:" in issue.message
    assert "16-bit PNG" in issue.message  # the fix
    assert "re-export" not in issue.message and "remove it" not in issue.message  # not blamed on the file


def test_an_8_bit_lossless_jpeg_still_packs_exactly(tmp_path: Path) -> None:
    grey = (GREY_12 >> 4).astype(np.uint8)
    path = tmp_path / "lossless_8bit.jpg"
    path.write_bytes(imagecodecs.ljpeg_encode(grey, bitspersample=8))
    (sample,) = read_ok(path, ImageTransformConfig(color="gray"))
    assert sample.metadata["bit_depth"] == 8
    assert np.array_equal(sample.image[0], grey)


# --- 2. TIFF of more than 4 samples per pixel ----------------------------------------------------

_RGB = np.dstack([_R * 6, _C * 4, (_R + _C) * 2]).astype(np.uint8)
_OPAQUE = np.full((40, 60), 255, np.uint8)


@pytest.mark.parametrize(("photometric", "planes", "extras"), [
    ("rgb", [_RGB, _OPAQUE, _RGB[..., 0]], [2, 0]),  # Photoshop: alpha + a saved selection
    ("rgb", [_RGB, _OPAQUE, _RGB[..., 0]], [0, 0]),
    ("rgb", [_RGB, _RGB], [1, 0, 0]),
    ("separated", [_RGB, _OPAQUE, _OPAQUE], [2]),  # CMYK + alpha
])
def test_a_tiff_of_more_than_4_samples_per_pixel_is_unsupported_naming_its_layout(
        tmp_path: Path, photometric: str, planes: list[np.ndarray], extras: list[int]) -> None:
    path = tmp_path / "extra.tif"
    pixels = np.dstack(planes)
    tifffile.imwrite(path, pixels, photometric=photometric, extrasamples=extras)
    assert tifffile.imread(path).shape == pixels.shape  # valid: tifffile reads every sample
    spp = pixels.shape[2]
    issue = read_issue(path)
    assert issue.reason == "unsupported" and issue.stage == "read", issue.message
    assert "TIFF IFD 0 at byte " in issue.message
    assert f"{spp} samples per pixel" in issue.message and f"ExtraSamples {extras}" in issue.message
    assert "1 to 4 samples" in issue.message and "without the extra channels" in issue.message
    assert "re-export" not in issue.message and "remove it" not in issue.message


def test_a_later_page_of_more_than_4_samples_names_its_ifd(tmp_path: Path) -> None:
    path = tmp_path / "pages.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(_RGB, photometric="rgb")
        tif.write(np.dstack([_RGB, _OPAQUE, _OPAQUE]), photometric="rgb", extrasamples=[2, 0])
    issue = read_issue(path)
    assert issue.reason == "unsupported", issue.message
    assert "TIFF IFD 1 at byte " in issue.message and "5 samples per pixel" in issue.message


def test_rgb_and_one_extra_sample_still_packs_its_colour(tmp_path: Path) -> None:
    path = tmp_path / "rgb_extra.tif"
    tifffile.imwrite(path, np.dstack([_RGB, _RGB[..., 0]]), photometric="rgb", extrasamples=[0])
    (sample,) = read_ok(path)
    assert np.array_equal(sample.image, _RGB.transpose(2, 0, 1))


# --- 3. image suffixes that were silently unlisted ------------------------------------------------

#: suffix → how the exclusion's detail starts (after "a"/"an") or, for a rename, what it ends with
NEWLY_NAMED = {
    ".jif": "rename it to .jpg", ".jfi": "rename it to .jpg",
    ".hif": "HEIF image (.hif)", ".heics": "HEIF image sequence (.heics)", ".heifs": "HEIF image sequence (.heifs)",
    ".avifs": "AVIF image sequence (.avifs)", ".cr3": "Canon raw image (.cr3)", ".crw": "Canon raw image (.crw)",
    ".nrw": "Nikon raw image (.nrw)", ".orf": "Olympus raw image (.orf)", ".rw2": "Panasonic raw image (.rw2)",
    ".raf": "Fujifilm raw image (.raf)", ".pef": "Pentax raw image (.pef)", ".srw": "Samsung raw image (.srw)",
    ".jls": "JPEG-LS image (.jls)", ".qoi": "QOI image (.qoi)",
}


def test_images_under_other_well_known_suffixes_are_left_out_with_their_fix_not_unlisted(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    root.mkdir()
    (root / "a.png").write_bytes(cv2_png())
    for suffix in NEWLY_NAMED:
        (root / f"x{suffix.upper() if suffix == '.hif' else suffix}").write_bytes(b"not read")  # any case
    (root / "notes.txt").write_text("no image")
    job = {"name": "sfx", "sources": [{"kind": "image", "root": str(root), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert [ref.relpath for ref in found.refs] == ["a.png"] and found.issues == []
    detail = {Path(e.path).suffix.lower(): (e.why, e.detail) for e in found.excluded}
    assert sorted(detail) == sorted(NEWLY_NAMED)  # each one, and not notes.txt
    for suffix, said in NEWLY_NAMED.items():
        why, text = detail[suffix]
        assert why == "unsupported_format"
        if said.startswith("rename"):
            assert text.endswith(f"; if it is one of them, {said}"), text
        else:
            assert said in text and "which packer does not read" in text and "convert it to PNG" in text, text
    assert "each frame" in detail[".avifs"][1] and "each frame" in detail[".heics"][1]


def cv2_png() -> bytes:
    ok, encoded = cv2.imencode(".png", _RGB)
    assert ok
    return encoded.tobytes()
