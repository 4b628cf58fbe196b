"""A NIfTI volume sample is windowed and quantised a slice at a time: its bytes are those of the
whole-volume path: a fixed window applied to the whole resampled volume (display values in float64
for uint16, float32 otherwise), a normalisation (z-score, percentiles) applied to the volume as
stored and its float32 output resampled; then cropped or padded, then quantised."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from packer.config import parse_window
from packer.read.nifti_samples import Case, Slicing, plan_channels, volume_sample
from packer.records import SampleRef
from packer.transform.dicom import display_dtype, quantise
from packer.transform.volume import Volume, crop_or_pad, resample_linear


def _plan(windows: list[Any], output: str, size: tuple[int, int, int] | None) -> Slicing:
    return Slicing(windows=tuple(parse_window(w, f"w[{i}]") for i, w in enumerate(windows)), sample="volume",
                   axis="axial", neighbors=0, edge="replicate", spacing=None, size=None, resize="stretch",
                   output=output, volume_spacing=(1.5, 1.5, 1.5), volume_size=size)


@pytest.mark.parametrize(("windows", "output"), [
    ([{"center": 40, "width": 400}], "uint8"),
    ([{"center": 40, "width": 400}, {"percentiles": [1, 99]}], "uint16"),
    (["zscore", {"center": -600, "width": 1500}], "float16"),
])
@pytest.mark.parametrize("size", [None, (9, 30, 14)])  # resampled 14×18×22: D and W cropped, H padded
def test_a_volume_sample_has_the_bytes_of_the_whole_volume_path(
        windows: list[Any], output: str, size: tuple[int, int, int] | None) -> None:
    rng = np.random.default_rng(11)
    values = rng.normal(0, 300, size=(2, 17, 23, 27)).astype(np.float32)
    values[:, :, :3] = -1024.0  # some background, so the z-score's nonzero mean differs from the mean
    affine = np.diag([1.25, 1.2, 1.25, 1.0])
    case = Case(values=values, affine=affine, names=("t1", "t2"), cal=(None, None))
    plan = _plan(windows, output, size)
    ref = SampleRef(sample_id="v", source="s", kind="nifti", path="/raw/v.nii.gz", relpath="v.nii.gz")
    [sample] = volume_sample(ref, case, plan, {})

    channels = plan_channels(case, plan.windows)
    volume = resample_linear(Volume(values, affine), (1.5, 1.5, 1.5))
    dtype = display_dtype(output)  # float64 for uint16 (exact levels), float32 otherwise
    normalised = resample_linear(Volume(np.stack([channel.render(values[channel.index]) for channel in channels]),
                                        affine), (1.5, 1.5, 1.5))
    # each channel quantised from its own dtype (a normalisation's resampled output is float32)
    whole = np.stack([quantise(normalised.array[c] if channel.stats is not None else
                               channel.render(volume.array[channel.index], dtype), output)
                      for c, channel in enumerate(channels)])
    finished = Volume(whole, volume.affine)
    if size is not None:
        finished = crop_or_pad(finished, size)
    expected = finished.array
    assert sample.image.dtype == np.dtype(output) and sample.image.flags.c_contiguous
    assert sample.image.shape == expected.shape == (len(channels), *(size or volume.array.shape[1:]))
    assert sample.image.tobytes() == expected.tobytes()
