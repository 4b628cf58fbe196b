"""Photos a walk through real-world formats found mishandled.

- A valid 12-bit JPEG (SOF1 extended, or SOF3 lossless at 12 or 16 bits) was ``decode_failed``
  "re-export it, or remove it": blamed on the file, when OpenCV (packer's decoder) reads only
  8-bit JPEG. It is ``unsupported``, naming the precision and the fix, as a 12-bit JPEG inside a
  TIFF is; an 8-bit lossless JPEG still packs exactly.

Files are real, written by imagecodecs (libjpeg-turbo 3's 12-bit and lossless encoders); an
independent decoder (imagecodecs) reads each one back, so the file is known to be valid.
"""

from __future__ import annotations

from pathlib import Path

import imagecodecs
import numpy as np
import pytest

from packer.config import ImageTransformConfig
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
