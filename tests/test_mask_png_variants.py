"""PNG masks as other tools write them: an animated PNG (APNG) is refused rather than read from
its first frame alone, and an RGB PNG with a tRNS colour key (no alpha channel) reads its ids as
the same mask in grey does."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packer.transform.mask import MaskError, decode_mask


def _png(images: list[Image.Image], **params: object) -> bytes:
    out = io.BytesIO()
    images[0].save(out, format="PNG", save_all=len(images) > 1, append_images=images[1:], **params)
    return out.getvalue()


def test_an_animated_png_mask_is_refused_not_read_from_its_first_frame() -> None:
    first, second = np.zeros((16, 16), np.uint8), np.zeros((16, 16), np.uint8)
    first[2:6, 2:6], second[8:12, 8:12] = 1, 2
    data = _png([Image.fromarray(first), Image.fromarray(second)])
    with pytest.raises(MaskError) as err:
        decode_mask(data, "m.png")
    assert err.value.reason == "mask_unreadable" and "animated PNG" in str(err.value)


def test_an_rgb_mask_with_a_trns_colour_key_reads_as_its_grey_twin() -> None:
    ids = np.zeros((16, 16), np.uint8)
    ids[4:12, 4:12] = 2
    grey = decode_mask(_png([Image.fromarray(ids)], transparency=0), "g.png")
    rgb = decode_mask(_png([Image.fromarray(np.dstack([ids] * 3))], transparency=(0, 0, 0)), "c.png")
    assert np.array_equal(grey, ids) and np.array_equal(rgb, ids)
