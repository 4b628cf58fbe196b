"""The report of datasets whose masks come from annotations: where a sample's mask is drawn,
which base the tables' paths are relative to, and that structures no map names are counted.

Expected overlays are blended here with :func:`~packer.htmlreport.thumbs.mask_overlay` over the
slice the mask belongs to (README "Downstream, as any mask": a neighbour stack carries its centre
slice's mask), never taken from the pane under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from packer.htmlreport.thumbs import mask_overlay, sample_panes
from tests.test_htmlreport import decode_data_uri


def _stack(k: int, windows: int) -> tuple[np.ndarray, dict[str, object]]:
    """A neighbour stack of slices -k…+k, each with ``windows`` windows, every slice a different
    level (slice s, window w: 20 + 40 s + 5 w), so each pane shows which slice it is."""
    names = [{"name": f"w{w}"} for w in range(windows)]
    info = {"metadata": {"windows": names, "neighbors": {"k": k, "channels_per_slice": windows,
                                                         "edge": "replicate"}}}
    chw = np.stack([np.full((16, 16), 20 + 40 * s + 5 * w, np.uint8)
                    for s in range(2 * k + 1) for w in range(windows)])
    return chw, info


@pytest.mark.parametrize(("k", "names"), [(1, ["-1 w0", "+0 w0 + mask", "+1 w0"]),
                                           (2, ["-2 w0", "-1 w0", "+0 w0 + mask", "+1 w0"])])  # 4 panes at most
def test_a_one_window_neighbour_stack_draws_its_mask_over_the_centre_slice(k: int, names: list[str]) -> None:
    """With one window there is no ``+0 composite`` pane: the mask (the centre slice's) goes on
    the ``+0`` pane, not on the last one, which is a neighbour."""
    chw, info = _stack(k, 1)
    mask = np.zeros((16, 16), np.uint8)
    mask[2:6, 3:9] = 1
    panes = sample_panes(chw, info, "dicom", mask=mask)
    assert [p.name for p in panes] == names
    drawn = [p for p in panes if p.name.endswith("+ mask")]
    assert len(drawn) == 1
    shown = decode_data_uri(drawn[0].uri)[..., ::-1]  # BGR → RGB
    assert np.array_equal(shown, mask_overlay(chw[k], mask))
    assert not np.array_equal(shown, mask_overlay(chw[-1], mask))


def test_a_multi_window_neighbour_stack_draws_its_mask_over_the_centre_composite() -> None:
    """With two windows per slice the centre slice's composite (``+0 composite``) carries the mask."""
    chw, info = _stack(1, 2)
    mask = np.zeros((16, 16), np.uint8)
    mask[8:12, 8:12] = 2
    panes = sample_panes(chw, info, "dicom", mask=mask)
    assert [p.name for p in panes] == ["-1 w0", "+0 w0", "+1 w0", "+0 composite + mask"]
    centre = chw[2:4]
    composite = np.dstack([centre[0], centre[1], ((centre[0].astype(np.uint16) + centre[1]) // 2).astype(np.uint8)])
    shown = decode_data_uri(panes[-1].uri)[..., ::-1]
    assert np.abs(shown.astype(int) - mask_overlay(composite, mask).astype(int)).max() <= 1
