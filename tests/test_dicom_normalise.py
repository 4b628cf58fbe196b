"""DICOM frames without a calibrated unit (MR): percentile and z-score normalisation, by modality.

A percentiles window is the frame's own ``low``..``high`` percentiles of its modality values
(padding left out) mapped to [0, 1] and clipped; a z-score (float16 output only) is
``(value - mean) / std`` over the frame's non-padding (``over: nonzero``: non-zero) pixels.
Expectations are numpy's, computed here from the stored values and the rescale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packer.config import WindowSpec, load_job, parse_window
from packer.errors import ConfigError
from packer.read.dicom import read_dicom
from packer.records import Sample
from tests.dicom_files import config, ct_dataset, image_dataset, make_ref, save, window
from tests.helpers import write_job

MR = np.random.default_rng(5).integers(0, 1200, size=(32, 32)).astype(np.uint16)
MR[:4] = 0  # a background of exact zeros, as outside a skull-stripped brain


def percentiles(low: float, high: float, over: str = "all") -> WindowSpec:
    return parse_window({"percentiles": [low, high], "over": over}, "t")


def zscore(over: str = "nonzero") -> WindowSpec:
    return parse_window({"zscore": {"over": over}}, "t")


def mr_file(tmp_path: Path, pixels: np.ndarray = MR, **attrs: object) -> Path:
    return save(image_dataset(pixels, modality="MR", **attrs), tmp_path / "mr.dcm")


def read(path: Path, *specs: WindowSpec, **kwargs: object) -> Sample:
    samples = read_dicom(make_ref(path), config(*specs, **kwargs))
    assert isinstance(samples, list), samples
    (sample,) = samples
    return sample


@pytest.mark.parametrize("over", ["all", "nonzero"])
def test_percentiles_scale_the_frame_s_own_range_into_uint8(tmp_path: Path, over: str) -> None:
    sample = read(mr_file(tmp_path), percentiles(1, 99, over))
    values = MR.astype(np.float64)
    region = values[values != 0] if over == "nonzero" else values.reshape(-1)
    low, high = np.percentile(region, [1, 99])
    expected = np.rint(np.clip((values - low) / (high - low), 0, 1) * 255)
    assert sample.image.dtype == np.uint8
    assert np.abs(sample.image[0].astype(int) - expected).max() <= 1
    (record,) = sample.metadata["windows"]
    assert record["source"] == "percentiles" and record["percentiles"] == [1.0, 99.0] and record["over"] == over
    assert record["low"] == pytest.approx(low, rel=1e-6) and record["high"] == pytest.approx(high, rel=1e-6)
    assert record["count"] == region.size


@pytest.mark.parametrize("over", ["all", "nonzero"])
def test_a_zscore_is_float16_over_the_frame_s_region(tmp_path: Path, over: str) -> None:
    sample = read(mr_file(tmp_path), zscore(over), window(600, 1200), output="float16")
    values = MR.astype(np.float64)
    region = values[values != 0] if over == "nonzero" else values.reshape(-1)
    z = (values - region.mean()) / region.std()
    if over == "nonzero":
        z[values == 0] = 0
    assert sample.image.dtype == np.float16 and sample.image.shape == (2, 32, 32)
    assert np.abs(sample.image[0].astype(np.float64) - z).max() <= np.abs(z).max() * 2 ** -10  # float16 rounding
    linear = np.clip((values - 599.5) / 1199 + 0.5, 0, 1)  # the fixed window beside it, in [0, 1] (PS3.3 C.11.2.1.2)
    assert np.abs(sample.image[1].astype(np.float64) - linear).max() <= 2 ** -11
    zs, fixed = sample.metadata["windows"]
    assert zs["source"] == "zscore" and zs["mean"] == pytest.approx(region.mean(), rel=1e-6)
    assert zs["std"] == pytest.approx(region.std(), rel=1e-6) and fixed["center"] == 600


def test_a_monochrome1_zscore_is_inverted_like_its_windows(tmp_path: Path) -> None:
    """MONOCHROME1 shows its minimum white (PS3.3 C.7.6.3.1.2); packer inverts it so bright means
    dense everywhere. A z-score channel stands in a window's place, so a MONOCHROME1 radiograph
    and the same image stored MONOCHROME2 (values mirrored) give the same channels."""
    stored = np.random.default_rng(3).integers(0, 4096, size=(32, 32)).astype(np.uint16)
    mono1 = save(image_dataset(stored, modality="CR", photometric="MONOCHROME1", bits_stored=12),
                 tmp_path / "m1.dcm")
    mono2 = save(image_dataset((4095 - stored).astype(np.uint16), modality="CR", bits_stored=12),
                 tmp_path / "m2.dcm")
    specs = (zscore("all"), percentiles(0, 100))
    one, two = (read(path, *specs, output="float16") for path in (mono1, mono2))
    assert np.abs(one.image.astype(np.float64) - two.image.astype(np.float64)).max() <= 2 ** -8
    assert one.metadata["windows"][0]["inverted"] is True and "inverted" not in two.metadata["windows"][0]


def test_float16_without_a_normalisation_keeps_its_meaning(tmp_path: Path) -> None:
    """float16 with plain windows stays one channel of modality values (HU for CT)."""
    pixels = np.random.default_rng(1).integers(0, 3000, (16, 16)).astype(np.int16)
    sample = read(save(ct_dataset(pixels), tmp_path / "ct.dcm"), window(40, 400), output="float16")
    assert sample.image.shape == (1, 16, 16)
    assert np.array_equal(sample.image[0], (pixels.astype(np.float64) - 1024).astype(np.float16))


def test_padding_is_left_out_of_the_statistics_and_stays_black(tmp_path: Path) -> None:
    pixels = MR.copy()
    pixels[-4:] = 4095  # Pixel Padding Value: outside the scanned region
    sample = read(mr_file(tmp_path, pixels, PixelPaddingValue=4095), percentiles(0, 100))
    assert sample.metadata["windows"][0]["high"] == float(MR[:-4].max())
    assert (sample.image[0, -4:] == 0).all()


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_padding_under_a_zscore_over_all_pixels_is_the_frames_lowest_not_its_mean(tmp_path: Path,
                                                                                 photometric: str) -> None:
    """README: padded pixels are black, never windowed as tissue. Under {zscore: {over: all}}
    padding was set to 0, the frame's mean: brighter than its real air, average tissue to a
    network. It is now the frame's lowest z-score; over nonzero, 0 (the background stays 0)."""
    pixels = MR.copy()
    pixels[-4:] = 4095
    path = mr_file(tmp_path, pixels, PixelPaddingValue=4095, photometric=photometric)
    sample = read(path, zscore("all"), output="float16")
    real = sample.image[0, :-4].astype(np.float32)
    assert (sample.image[0, -4:] == real.min()).all() and real.min() < -1.0, sample.image[0, -4:]
    nonzero = read(path, zscore("nonzero"), output="float16")
    assert (nonzero.image[0, -4:] == 0).all()


def test_modality_windows_normalise_mr_beside_ct_presets(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    save(ct_dataset(), raw / "ct.dcm")
    save(image_dataset(MR, modality="MR", PatientID="P2"), raw / "mr.dcm")
    (raw / "labels.csv").write_text("path,label\nct.dcm,a\nmr.dcm,b\n")
    job = load_job(write_job(tmp_path, {
        "name": "t", "sources": [{"kind": "dicom", "root": "raw", "labels": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 1.0}}, "phi": {"mode": "keep"},
        "transform": {"dicom": {"windows": ["brain"], "modality_windows": {"MR": [{"percentiles": [0.5, 99.5]}]}}},
        "pack": {"format": "webdataset"}, "output": "out"}))
    mr = read_dicom(make_ref(raw / "mr.dcm"), job.dicom)
    ct = read_dicom(make_ref(raw / "ct.dcm"), job.dicom)
    assert isinstance(mr, list) and isinstance(ct, list)
    assert mr[0].metadata["windows"][0]["source"] == "percentiles"
    assert ct[0].metadata["windows"][0]["name"] == "brain"


def test_a_zscore_needs_float16_and_cannot_be_a_fallback(tmp_path: Path) -> None:
    doc = {"name": "t", "sources": [{"kind": "dicom", "root": "raw"}], "split": {"by": "entity"},
           "phi": {"mode": "keep"}, "pack": {"format": "webdataset"}, "output": "out"}
    with pytest.raises(ConfigError, match="transform.dicom.output: a z-score is not in \\[0, 1\\] and cannot be uint8"):
        load_job(write_job(tmp_path, {**doc, "transform": {"dicom": {"modality_windows": {"MR": ["zscore"]}}}}))
    with pytest.raises(ConfigError, match="fallback_window: a z-score cannot stand in"):
        load_job(write_job(tmp_path, {**doc, "transform": {"dicom": {"fallback_window": "zscore",
                                                                     "output": "float16"}}}))


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_a_frame_whose_percentiles_coincide_is_split_at_them_as_the_readme_says(tmp_path: Path,
                                                                                photometric: str) -> None:
    """README: "where the two percentiles coincide, a sparse volume's, values at or below them are
    0 and values above 1", as a NIfTI volume reads. A DICOM frame refused such a frame as
    missing_window ("nothing to scale"), so one all-air slice of an MR series took its whole
    volume or neighbour stacks down with it, and the fallback window the message offered packed
    it as flat grey among percentile-scaled slices."""
    flat = np.zeros((16, 16), np.uint16)
    flat[0, 0] = 9  # not constant (that is constant_image), but the 1st..99th percentiles are all 0
    sample = read(mr_file(tmp_path, flat, photometric=photometric), percentiles(1, 99))
    expected = (flat > 0) if photometric == "MONOCHROME2" else (flat == 0)
    np.testing.assert_array_equal(sample.image[0], expected.astype(np.uint8) * 255)
    (record,) = sample.metadata["windows"]
    assert (record["low"], record["high"], record["width"]) == (0.0, 0.0, 0.0)
    wide = read(mr_file(tmp_path, flat), percentiles(1, 99), output="uint16")
    np.testing.assert_array_equal(wide.image[0], (flat > 0).astype(np.uint16) * 65535)


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_fit_s_border_under_a_zscore_over_all_pixels_is_the_frames_lowest_as_padding_is(tmp_path: Path,
                                                                                       photometric: str) -> None:
    """README step 5: padded pixels are black, "`fit`'s border the same". Under {zscore: {over:
    all}} the border was 0, the frame's mean (mid-grey); it is the frame's lowest z-score (the
    highest negated for MONOCHROME1), as padding is. Over nonzero and for percentiles, 0."""
    pixels = MR[4:20]  # 16 × 32, no zeros: fit into 32 × 32 pads 8 rows above and below
    path = mr_file(tmp_path, pixels, photometric=photometric)
    sample = read(path, zscore("all"), zscore("nonzero"), percentiles(0, 100), output="float16", size=(32, 32),
                  resize="fit")
    image = sample.image.astype(np.float32)
    real = image[:, 8:24]
    assert real[0].min() < -1.5
    assert (image[0, :8] == real[0].min()).all() and (image[0, 24:] == real[0].min()).all(), image[0, :8]
    assert (image[1:, :8] == 0).all() and (image[1:, 24:] == 0).all()
