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
- An embedded ICC profile (Adobe RGB, Display P3) is not applied: the packed values are the
  file's encoded values, as OpenCV and torchvision give them. README says so (it said nothing).

Files are real, written by imagecodecs (libjpeg-turbo 3's 12-bit and lossless encoders) or
tifffile; an independent decoder (imagecodecs, tifffile) reads each one back, so the file is known
to be valid.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import cv2
import imagecodecs
import numpy as np
import pytest
import tifffile
import yaml
from PIL import Image, ImageCms

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


# --- 4. embedded ICC profiles ---------------------------------------------------------------------

def _s15(value: float) -> bytes:
    return struct.pack(">i", round(value * 65536))


def _xyz(x: float, y: float, z: float) -> bytes:
    return b"XYZ " + bytes(4) + _s15(x) + _s15(y) + _s15(z)


def adobe_rgb_profile() -> bytes:
    """A matrix/TRC ICC v2 profile with Adobe RGB (1998)'s primaries (D50-adapted) and gamma 2.2."""
    gamma = b"curv" + bytes(4) + struct.pack(">IH", 1, round(2.19921875 * 256)) + b"\0\0"
    name = b"Adobe RGB (1998)\0"
    tags = [(b"desc", b"desc" + bytes(4) + struct.pack(">I", len(name)) + name + bytes(78)),
            (b"cprt", b"text" + bytes(4) + b"none\0"), (b"wtpt", _xyz(0.9642, 1.0, 0.8249)),
            (b"rXYZ", _xyz(0.6097, 0.3111, 0.0195)), (b"gXYZ", _xyz(0.2053, 0.6257, 0.0609)),
            (b"bXYZ", _xyz(0.1492, 0.0632, 0.7446)), (b"rTRC", gamma), (b"gTRC", gamma), (b"bTRC", gamma)]
    start, table, data = 128 + 4 + 12 * len(tags), b"", b""
    for signature, body in tags:
        body += bytes(-len(body) % 4)
        table += signature + struct.pack(">II", start + len(data), len(body))
        data += body
    header = (struct.pack(">I", start + len(data)) + b"none" + bytes([2, 0x10, 0, 0]) + b"mntr" + b"RGB " + b"XYZ "
              + bytes(12) + b"acsp" + b"APPL" + bytes(20) + bytes(4) + _s15(0.9642) + _s15(1.0) + _s15(0.8249)
              + bytes(48))
    return header + struct.pack(">I", len(tags)) + table + data


def test_an_embedded_icc_profile_is_not_applied_the_encoded_values_are_packed(tmp_path: Path) -> None:
    rgb = np.zeros((40, 60, 3), np.uint8)
    rgb[:, :30], rgb[:, 30:] = (40, 200, 60), (200, 60, 40)
    plain, tagged = tmp_path / "srgb.png", tmp_path / "adobe_rgb.png"
    Image.fromarray(rgb).save(plain)
    Image.fromarray(rgb).save(tagged, icc_profile=adobe_rgb_profile())
    with Image.open(tagged) as opened:  # the profile is real: LittleCMS converts by it to other sRGB values
        source = ImageCms.ImageCmsProfile(io.BytesIO(opened.info["icc_profile"]))
        as_srgb = np.asarray(ImageCms.profileToProfile(opened, source, ImageCms.createProfile("sRGB"),
                                                       outputMode="RGB"))
    assert int(np.abs(as_srgb.astype(int) - rgb).max()) > 10
    (packed,) = read_ok(tagged)
    (reference,) = read_ok(plain)
    assert np.array_equal(packed.image, rgb.transpose(2, 0, 1))  # the encoded values, as README says
    assert np.array_equal(packed.image, reference.image) and packed.metadata == reference.metadata
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert "an embedded ICC colour profile (Adobe RGB, Display P3, ...) is not applied" in " ".join(readme.split())
