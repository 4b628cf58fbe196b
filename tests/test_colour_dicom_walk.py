"""Colour DICOM as an ultrasound walk met it: a colour file's header at odds with what colour
samples are (signed Pixel Representation), with the job (windows, channels) or with its own JPEG
codestream (component count). Each is packed as stored with a warning that says what was
overruled or not applied, or refused with a message that names the attribute and the fix."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.encaps import encapsulate
from pydicom.uid import JPEGBaseline8Bit

from packer.buildwarnings import WARNINGS_FILE
from packer.config import JobConfig, WindowSpec, load_job
from packer.pipeline.build import BuildOptions, build
from packer.read.dicom import read_dicom
from packer.read.kinds import with_channels
from packer.read.limits import codestream_components
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


# ------------------------------------------------- a JPEG codestream of another component count


def jpeg_cine(tmp_path: Path, name: str, frames: list[np.ndarray], *, photometric: str, samples: int) -> Path:
    """A JPEG Baseline US cine whose header says ``photometric`` / ``samples`` over ``frames``
    encoded by Pillow as they are (grey frames: 1 component; colour: 3)."""
    def jpeg(image: np.ndarray) -> bytes:
        out = io.BytesIO()
        Image.fromarray(image).save(out, "JPEG", quality=95)
        return out.getvalue()

    shape = frames[0].shape
    stored = np.zeros((len(frames), *shape[:2], samples), np.uint8).squeeze(-1 if samples == 1 else ())
    ds = image_dataset(stored, photometric="RGB" if samples == 3 else "MONOCHROME2", modality="US",
                       sop_class="1.2.840.10008.5.1.4.1.1.3.1")
    ds.PhotometricInterpretation = photometric
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.PixelData = encapsulate([jpeg(frame) for frame in frames])
    ds["PixelData"].VR = "OB"
    return save(ds, tmp_path / name)


YY, XX = np.mgrid[0:32, 0:48]
GREY = [((XX * 5 + f) % 256).astype(np.uint8) for f in range(3)]
COLOUR = [np.stack([(XX * 5 + f) % 256, (YY * 7) % 256, (XX + YY) % 256], -1).astype(np.uint8) for f in range(3)]


def test_grey_jpeg_frames_under_a_colour_header_are_refused_naming_both_counts_and_the_fix(tmp_path: Path) -> None:
    """A cine whose header says YBR_FULL_422 with 3 samples over 1-component JPEG frames was
    decode_failed with numpy's "could not broadcast input array from shape (1536,) into shape
    (4608,)": nothing said the header and the codestream disagree. The message names (0028,0002)
    and (0028,0004) with the header's values, the frames' component count from their SOF marker,
    and the header values that match the frames."""
    path = jpeg_cine(tmp_path, "grey_frames.dcm", GREY, photometric="YBR_FULL_422", samples=3)
    result = read(path)
    assert isinstance(result, Issue) and result.reason == "decode_failed", result
    message = result.message
    assert "broadcast" not in message, message
    assert "(0028,0002) Samples per Pixel is 3" in message, message
    assert "(0028,0004) Photometric Interpretation YBR_FULL_422" in message, message
    assert "frame 0's JPEG codestream holds 1 component" in message, message
    assert "set (0028,0002) Samples per Pixel to 1 and (0028,0004) Photometric Interpretation to MONOCHROME2" in message


def test_colour_jpeg_frames_under_a_grey_header_are_refused_naming_both_counts_and_the_fix(tmp_path: Path) -> None:
    path = jpeg_cine(tmp_path, "colour_frames.dcm", COLOUR, photometric="MONOCHROME2", samples=1)
    result = read(path)
    assert isinstance(result, Issue) and result.reason == "decode_failed", result
    message = result.message
    assert "broadcast" not in message, message
    assert "(0028,0002) Samples per Pixel is 1" in message and "Photometric Interpretation MONOCHROME2" in message
    assert "frame 0's JPEG codestream holds 3 components" in message, message
    assert "set (0028,0002) Samples per Pixel to 3" in message and "YBR_FULL_422" in message, message


def test_jpeg_frames_whose_components_match_the_header_decode(tmp_path: Path) -> None:
    grey = samples_of(read(jpeg_cine(tmp_path, "grey.dcm", GREY, photometric="MONOCHROME2", samples=1),
                           window(128, 256)))
    colour = samples_of(read(jpeg_cine(tmp_path, "colour.dcm", COLOUR, photometric="YBR_FULL_422", samples=3)))
    assert [s.image.shape for s in grey] == [(1, 32, 48)] * 3 and [s.image.shape for s in colour] == [(3, 32, 48)] * 3


def test_the_component_count_is_read_from_jpeg_sof_and_jpeg_2000_siz_headers_only() -> None:
    """Nf of a SOFn however many segments precede it (ITU T.81 B.2.2), Csiz of a SIZ (T.800
    A.5.1); a header cut short, or no codestream, says nothing."""
    comments = b"".join(b"\xff\xfe\x00\x06pad!" for _ in range(100))
    sof = b"\xff\xc0\x00\x11\x08\x00\x20\x00\x30\x03" + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    assert codestream_components(b"\xff\xd8" + comments + sof + b"\xff\xda") == 3
    assert codestream_components(b"\xff\xd8" + comments + sof[:9]) is None
    assert codestream_components(b"\x00" * 64) is None
    siz = b"\xff\x4f\xff\x51" + struct.pack(">HH8IH", 47, 0, 48, 32, 0, 0, 48, 32, 0, 0, 3) + b"\x07\x01\x01" * 3
    assert codestream_components(siz) == 3 and codestream_components(siz[:41]) is None
