"""Colour DICOM as an ultrasound walk met it: a colour file's header at odds with what colour
samples are (signed Pixel Representation), with the job (windows, channels) or with its own JPEG
codestream (component count). Each is packed as stored with a warning that says what was
overruled or not applied, or refused with a message that names the attribute and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydicom.dataset import Dataset

from packer.buildwarnings import WARNINGS_FILE
from packer.config import JobConfig, WindowSpec, load_job
from packer.pipeline.build import BuildOptions, build
from packer.read.dicom import read_dicom
from packer.read.kinds import with_channels
from packer.records import Issue, Sample
from tests.dicom_files import config, file_window, image_dataset, make_ref, save, window
from tests.helpers import write_job

US_IMAGE = "1.2.840.10008.5.1.4.1.1.6.1"


def read(path: Path, *windows: WindowSpec, **kwargs: Any) -> list[Sample] | Issue:
    return read_dicom(make_ref(path), config(*windows, **kwargs))


def samples_of(result: list[Sample] | Issue) -> list[Sample]:
    assert isinstance(result, list), result.message
    return result


def colour_file(tmp_path: Path, name: str, stored: np.ndarray, *, photometric: str = "RGB",
                pixel_representation: int = 0, bits_stored: int | None = None, **attrs: object) -> Path:
    """A US image holding ``stored`` (H×W×3, or H×W palette indices) natively, its header's
    (0028,0103) Pixel Representation ``pixel_representation`` whatever the array's dtype."""
    ds = image_dataset(stored, photometric=photometric, modality="US", sop_class=US_IMAGE, bits_stored=bits_stored,
                       **attrs)
    ds.PixelRepresentation = pixel_representation
    return save(ds, tmp_path / name)


# ------------------------------------------------- (0028,0103) Pixel Representation 1 on colour


def test_an_rgb_image_flagged_signed_packs_its_stored_bytes_and_says_the_header_was_overruled(
        tmp_path: Path) -> None:
    """PS3.3 C.8.5.6.1 requires Pixel Representation 0 for US, and R, G, B samples are unsigned;
    some writers set 1 anyway. pydicom then reads the bytes as int8 and every byte >= 128 became
    0 in the packed image, silently. The stored bytes are what is packed (uint8 output of 8-bit
    RGB is the stored value), and each sample says the header's (0028,0103) was overruled."""
    rgb = np.random.default_rng(8).integers(0, 256, (16, 20, 3), dtype=np.uint8)
    assert (rgb >= 128).sum() > 100  # half the range: what the signed reading destroyed
    [sample] = samples_of(read(colour_file(tmp_path, "signed.dcm", rgb, pixel_representation=1)))
    np.testing.assert_array_equal(sample.image, rgb.transpose(2, 0, 1))
    [warning] = sample.metadata["warnings"]
    assert "(0028,0103) Pixel Representation is 1" in warning and "overruled" in warning, warning
    assert "unsigned" in warning and "set it to 0" in warning, warning


def test_an_rgb_image_with_pixel_representation_0_says_nothing_about_it(tmp_path: Path) -> None:
    rgb = np.random.default_rng(8).integers(0, 256, (16, 20, 3), dtype=np.uint8)
    [sample] = samples_of(read(colour_file(tmp_path, "unsigned.dcm", rgb)))
    np.testing.assert_array_equal(sample.image, rgb.transpose(2, 0, 1))
    assert "warnings" not in sample.metadata


def test_a_signed_flagged_12_bit_rgb_image_reads_its_bits_stored_unsigned(tmp_path: Path) -> None:
    """16 bits allocated, 12 stored: the stored values (0..4095) are read unsigned, masked to Bits
    Stored, as for Pixel Representation 0; signed, the values >= 2048 were negative and clipped."""
    rgb = np.random.default_rng(3).integers(0, 4096, (8, 10, 3), dtype=np.uint16)
    signed = samples_of(read(colour_file(tmp_path, "signed12.dcm", rgb, pixel_representation=1, bits_stored=12),
                             output="uint16"))
    unsigned = samples_of(read(colour_file(tmp_path, "unsigned12.dcm", rgb, bits_stored=12), output="uint16"))
    np.testing.assert_array_equal(signed[0].image, unsigned[0].image)
    np.testing.assert_array_equal(signed[0].image, np.rint(rgb.transpose(2, 0, 1) * (65535 / 4095)))
    assert any("(0028,0103)" in w for w in signed[0].metadata["warnings"])


def test_a_signed_flagged_ybr_full_image_is_converted_as_its_unsigned_twin_is(tmp_path: Path) -> None:
    """The decoder's YBR → RGB conversion takes unsigned samples only: a YBR_FULL file flagged
    signed was decode_failed with pydicom's "Invalid ndarray.dtype 'int8' for color space
    conversion". It reads as the same file with Pixel Representation 0 does."""
    ybr = np.random.default_rng(5).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    signed = samples_of(read(colour_file(tmp_path, "signed_ybr.dcm", ybr, photometric="YBR_FULL",
                                         pixel_representation=1)))
    unsigned = samples_of(read(colour_file(tmp_path, "ybr.dcm", ybr, photometric="YBR_FULL")))
    np.testing.assert_array_equal(signed[0].image, unsigned[0].image)
    assert any("(0028,0103)" in w for w in signed[0].metadata["warnings"])


def _palette(ds: Dataset, first_mapped: int) -> None:
    entries = np.arange(256, dtype=np.uint8)
    for colour, values in (("Red", entries), ("Green", entries[::-1]), ("Blue", entries // 2)):
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [256, first_mapped, 8])
        ds[f"{colour}PaletteColorLookupTableDescriptor"].VR = "US" if first_mapped >= 0 else "SS"
        setattr(ds, f"{colour}PaletteColorLookupTableData", values.tobytes())


def test_palette_indices_flagged_signed_look_up_the_entries_they_store(tmp_path: Path) -> None:
    """A palette image's indices are unsigned too: index 200 read as -56 looked up entry 0. Read
    unsigned, each index looks up its own entry."""
    index = np.arange(256, dtype=np.uint8).reshape(16, 16)
    ds = image_dataset(index, photometric="PALETTE COLOR", modality="US", sop_class=US_IMAGE)
    ds.PixelRepresentation = 1
    _palette(ds, 0)
    [sample] = samples_of(read_dicom(make_ref(save(ds, tmp_path / "pal.dcm")), config()))
    np.testing.assert_array_equal(sample.image, np.stack([index, 255 - index, index // 2]))
    assert any("(0028,0103)" in w for w in sample.metadata["warnings"])


def test_a_palette_whose_first_mapped_value_is_negative_keeps_its_signed_indices(tmp_path: Path) -> None:
    """A palette that starts at a negative index (its descriptor's second value, SS where Pixel
    Representation is 1, PS3.3 C.7.6.3.1.5) was written for signed indices: nothing is overruled."""
    index = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    ds = image_dataset(index, photometric="PALETTE COLOR", modality="US", sop_class=US_IMAGE)
    _palette(ds, -128)
    [sample] = samples_of(read_dicom(make_ref(save(ds, tmp_path / "pal.dcm")), config()))
    entry = index.astype(np.int16) + 128
    np.testing.assert_array_equal(sample.image, np.stack([entry, 255 - entry, entry // 2]))
    assert "warnings" not in sample.metadata


# ------------------------------------------------- a channel count colour cannot give


def us_job(tmp_path: Path, transform: dict[str, Any]) -> JobConfig:
    doc = {"name": "us", "sources": [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}, "seed": 1}, "transform": transform,
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "phi": {"mode": "keep"}}
    return load_job(write_job(tmp_path / "job", doc))


def shaped(path: Path, job: JobConfig) -> list[Sample] | Issue:
    """``path`` read and given the job's channel count, as the build does."""
    return with_channels(samples_of(read_dicom(make_ref(path), job.dicom)), job)


def bad_shape(result: list[Sample] | Issue) -> str:
    assert isinstance(result, Issue) and result.reason == "bad_shape", result
    return result.message


RGB = np.random.default_rng(1).integers(0, 256, (16, 20, 3), dtype=np.uint8)


@pytest.mark.parametrize(("transform", "key", "other"), [
    ({"dicom": {"windows": ["abdomen", "liver"], "channels": 2}}, "transform.dicom.channels", "transform.channels"),
    ({"channels": 2, "dicom": {"windows": ["abdomen", "liver"]}}, "transform.channels", "transform.dicom.channels"),
])
def test_a_one_frame_colour_file_refused_a_count_names_the_key_the_job_set_and_no_frames_fix(
        tmp_path: Path, transform: dict[str, Any], key: str, other: str) -> None:
    """A single-frame RGB file gives 3 channels; asked for 2 it is bad_shape. The message said
    "transform.channels asks for 2" and "drop transform.channels" where the job set
    transform.dicom.channels, and "use frames: split" to a 1-frame file under frames: split.
    It names the key the job wrote, says what a colour file gives, and leaves frames out."""
    path = colour_file(tmp_path / "raw", "doppler.dcm", RGB)
    message = bad_shape(shaped(path, us_job(tmp_path, transform)))
    assert f"it has 3 channels and {key} asks for 2" in message, message
    assert f"drop {key} " in message and other not in message, message
    assert "colour" in message and f"1 (its luma) where {key} is 1" in message, message
    assert "frames:" not in message, message


def test_a_stacked_multi_frame_file_is_told_frames_split_only_where_split_gives_the_count(tmp_path: Path) -> None:
    """frames: stack makes a 3-frame grey cine 3 channels of one window; under
    transform.dicom.channels: 2 each frame alone (frames: split) is 1 channel, replicated to 2:
    that fix is offered. A 3-frame colour cine stacked is 9 channels, and split each frame is
    3, still not 2: frames: split is not offered to it."""
    grey = np.random.default_rng(2).integers(0, 256, (3, 16, 20), dtype=np.uint8)
    job = us_job(tmp_path, {"dicom": {"windows": [{"center": 128, "width": 256}], "channels": 2, "frames": "stack"}})
    message = bad_shape(shaped(colour_file(tmp_path / "raw", "grey.dcm", grey, photometric="MONOCHROME2"), job))
    assert "it has 3 channels and transform.dicom.channels asks for 2" in message, message
    assert "use frames: split" in message, message
    colour = np.random.default_rng(3).integers(0, 256, (3, 16, 20, 3), dtype=np.uint8)
    message = bad_shape(shaped(colour_file(tmp_path / "raw", "cine.dcm", colour), job))
    assert "it has 9 channels" in message and "frames:" not in message, message


def test_a_split_multi_frame_colour_file_is_told_frames_stack_where_its_frames_make_the_count(
        tmp_path: Path) -> None:
    colour = np.random.default_rng(4).integers(0, 256, (2, 16, 20, 3), dtype=np.uint8)
    path = colour_file(tmp_path / "raw", "cine.dcm", colour)
    message = bad_shape(shaped(path, us_job(tmp_path, {"dicom": {"windows": ["abdomen"], "channels": 6}})))
    assert "it has 3 channels and transform.dicom.channels asks for 6" in message, message
    assert "frames: stack" in message and "frames: split" not in message, message
    message = bad_shape(shaped(path, us_job(tmp_path, {"dicom": {"windows": ["abdomen"], "channels": 4}})))
    assert "frames:" not in message, message


# ------------------------------------------------- windows a colour file does not take

ABDOMEN = WindowSpec(kind="preset", name="abdomen", center=60, width=400)


def test_windows_asked_of_a_colour_file_are_said_not_to_apply_and_it_packs_as_stored(tmp_path: Path) -> None:
    """A window maps grey values; colour pixels pack as stored colour (README). The job's
    windows were dropped with metadata.windows [] and no word anywhere: each sample now says
    which of the job's windows did not apply, naming the key."""
    path = colour_file(tmp_path, "doppler.dcm", RGB)
    [sample] = samples_of(read(path, ABDOMEN, window(40, 150, name="liver")))
    np.testing.assert_array_equal(sample.image, RGB.transpose(2, 0, 1))
    assert sample.metadata["windows"] == []
    [warning] = sample.metadata["warnings"]
    assert "transform.dicom.windows [abdomen, liver]" in warning, warning
    assert "windows do not apply to colour (RGB) pixels: packed as stored colour" in warning, warning


def test_a_fallback_window_and_a_normalisation_are_named_too_and_the_modality_key_where_it_chose(
        tmp_path: Path) -> None:
    path = colour_file(tmp_path, "doppler.dcm", RGB)
    [sample] = samples_of(read(path, file_window(), fallback_window=ABDOMEN))
    [warning] = sample.metadata["warnings"]
    assert "transform.dicom.fallback_window abdomen" in warning and "windows do not apply" in warning, warning
    [sample] = samples_of(read(path, ABDOMEN, channels=1))
    assert sample.image.shape == (1, 16, 20) and "packed as the luma of its stored colour" in sample.metadata[
        "warnings"][0]
    zscore = WindowSpec(kind="zscore", name="zscore", over="nonzero")
    [sample] = samples_of(read(path, ABDOMEN, modality_windows=(("US", (zscore,)),), output="float16"))
    [warning] = sample.metadata["warnings"]
    assert "transform.dicom.modality_windows.US [zscore]" in warning and "abdomen" not in warning, warning


def test_a_colour_file_under_its_own_file_window_has_nothing_to_be_told(tmp_path: Path) -> None:
    """windows: [file] (the default) asks for the file's own display, which a colour file is as stored."""
    [sample] = samples_of(read(colour_file(tmp_path, "doppler.dcm", RGB), file_window()))
    assert "warnings" not in sample.metadata


def test_the_build_lists_the_unapplied_windows_in_warnings_jsonl(tmp_path: Path) -> None:
    colour_file(tmp_path / "raw", "doppler.dcm", RGB)
    job = us_job(tmp_path, {"dicom": {"windows": ["abdomen", "liver"]}})
    result = build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False))
    said = (result.version_dir / WARNINGS_FILE).read_text()
    assert "transform.dicom.windows [abdomen, liver]" in said and "packed as stored colour" in said, said
