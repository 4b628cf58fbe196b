"""DICOM files damaged one value at a time (a mutation harness's finds): a header value that
no longer describes the pixels, a rescale that flattens them, a transfer syntax that names
another codec. Each becomes its own reason-coded bad sample, not a packed image that is wrong."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from dicom_files import ct_dataset, ct_pixels, save, shipped, window
from pydicom.encaps import encapsulate, generate_frames
from pydicom.pixels import pixel_array
from pydicom.uid import JPEG2000Lossless, RLELossless
from test_dicom_read import issue_of, read  # the DICOM reader's test helpers

from packer.records import Issue, Sample

SOFT_TISSUE = window(40.0, 400.0)




def samples_of(result: Any) -> list[Sample]:
    assert not isinstance(result, Issue), result.message
    return list(result)


def rle_ct(pixels: np.ndarray) -> pydicom.Dataset:
    """A CT dataset holding ``pixels`` (H×W or F×H×W int16) as RLE Lossless."""
    ds = ct_dataset(pixels)
    ds.compress(RLELossless, pixels)
    return ds


def frames_of(ds: pydicom.Dataset) -> list[bytes]:
    return list(generate_frames(ds.PixelData, number_of_frames=int(ds.get("NumberOfFrames", 1) or 1)))


def rle_frame(pixels: np.ndarray, extra: bytes = b"") -> bytes:
    """An RLE Lossless frame of int16 ``pixels`` (H×W): its two segments (high bytes, then low
    bytes, PS3.5 G.2) as literal PackBits runs, each padded to even length, ``extra`` decoded
    bytes appended to the low bytes' segment."""
    raw = np.ascontiguousarray(pixels, dtype=">i2").view(np.uint8).reshape(-1, 2)
    segments = []
    for data in (raw[:, 0].tobytes(), raw[:, 1].tobytes() + extra):
        runs = b"".join(bytes([len(chunk) - 1]) + chunk for chunk in (data[i:i + 128]
                                                                   for i in range(0, len(data), 128)))
        segments.append(runs + b"\x80" * (len(runs) % 2))  # 128: no operation, an even length
    header = struct.pack("<16L", 2, 64, 64 + len(segments[0]), *([0] * 13))
    return header + b"".join(segments)


# ---------------------------------------------------------------- RLE segments longer than Rows × Columns


@pytest.mark.parametrize(("attribute", "delta"), [("Columns", -1), ("Rows", -1), ("Columns", -8)])
def test_rle_file_whose_rows_or_columns_is_short_of_its_segments_is_bad_shape(tmp_path: Path, attribute: str,
                                                                                delta: int) -> None:
    """An RLE Lossless CT whose Columns (or Rows) is one short of what its segments decode to:
    pydicom only warns of "non-conformant padding" and keeps the first Rows × Columns bytes of
    each segment, a sheared image packed as data. The native twin is bad_shape; so is this."""
    ds = rle_ct(ct_pixels((32, 32)))
    setattr(ds, attribute, getattr(ds, attribute) + delta)
    found = issue_of(read(save(ds, tmp_path / "short.dcm"), SOFT_TISSUE), "bad_shape", "validate")
    rows, columns = int(ds.Rows), int(ds.Columns)
    assert found.message.startswith("short.dcm: RLE frame 0's segment 0 decodes to 1024 bytes"), found.message
    assert f"(0028,0010) Rows {rows} × (0028,0011) Columns {columns} give {rows * columns}" in found.message
    assert "fix the wrong one, or re-export the file" in found.message


def test_rle_multi_frame_names_the_frame_whose_segment_is_too_long(tmp_path: Path) -> None:
    pixels = ct_pixels((3, 16, 16))
    ds = rle_ct(pixels)
    ds.PixelData = encapsulate([rle_frame(pixels[0]), rle_frame(pixels[1]), rle_frame(pixels[2], b"\x07" * 16)])
    found = issue_of(read(save(ds, tmp_path / "long.dcm"), SOFT_TISSUE), "bad_shape", "validate")
    assert "RLE frame 2's segment 1 decodes to 272 bytes" in found.message, found.message


@pytest.mark.parametrize("extra", [b"\x07", b"\x00" * 16], ids=["one pad byte", "zeros"])
def test_rle_segment_padding_reads_as_the_image(tmp_path: Path, extra: bytes) -> None:
    """One byte past Rows × Columns pads a segment (PS3.5 G.3.1 for an odd count; some
    ultrasound writers pad even ones too, pydicom issue 1438), and zeros past it are padding, as
    native Pixel Data's are (PS3.5 8.1.1's Note): pydicom drops them, the image reads whole."""
    pixels = ct_pixels((16, 16))
    ds = rle_ct(pixels)
    whole = samples_of(read(save(ds, tmp_path / "whole.dcm"), SOFT_TISSUE))
    ds.PixelData = encapsulate([rle_frame(pixels, extra)])
    path = save(ds, tmp_path / "padded.dcm")
    assert np.array_equal(samples_of(read(path, SOFT_TISSUE))[0].image, whole[0].image)
    with pytest.warns(UserWarning, match=f"non-conformant padding - {256 + len(extra)} vs. 256 bytes"):
        assert np.array_equal(pixel_array(pydicom.dcmread(path), decoding_plugin="pydicom"), pixels)


def test_rle_odd_image_reads(tmp_path: Path) -> None:
    """An odd Rows × Columns (15 × 15) as pydicom encodes it reads: its segments' pad is no damage."""
    samples_of(read(save(rle_ct(ct_pixels((15, 15))), tmp_path / "odd.dcm"), SOFT_TISSUE))


def test_rle_segment_length_walk_accepts_a_real_ct_slice(tmp_path: Path) -> None:
    """The segment-length walk runs on every RLE frame before decoding: on a 512×512 CT slice as
    pydicom encodes it (a round body in air, noise) it finds nothing, and the slice reads whole.
    (Its cost, about a quarter of the frame's decode, is measured by hand, not in a unit test.)"""
    from packer.read.dicom import _rle_segment_problem

    rows, columns = np.mgrid[:512, :512]
    body = (rows - 256) ** 2 + (columns - 256) ** 2 < 200 ** 2
    noise = np.random.default_rng(1).normal(0, 15, (512, 512))
    pixels = np.where(body, 1064 + noise, 0).astype(np.int16)
    ds = rle_ct(pixels)
    assert _rle_segment_problem(frames_of(ds)[0], 512 * 512) is None
    assert np.array_equal(pixel_array(ds, decoding_plugin="pydicom"), pixels)


# ---------------------------------------------------------------- a rescale that flattens what is packed


def test_tiny_slope_with_intercept_zero_is_constant_image_as_float16_modality_values(tmp_path: Path) -> None:
    """Rescale Slope 1e-30, Intercept 0: the float64 modality values of the lowest and highest
    stored value differ (0 and 3e-27), yet `output: float16` without a window packs every pixel
    as one value, 0.0. README: constant_image."""
    path = save(ct_dataset(ct_pixels((16, 16), low=1), slope=1e-30, intercept=0.0), tmp_path / "tiny.dcm")
    found = issue_of(read(path, output="float16"), "constant_image", "validate")
    assert found.message.startswith("tiny.dcm: frame 0: (0028,1053) Rescale Slope 1e-30 and (0028,1052) "
                                    "Rescale Intercept 0"), found.message
    assert "float16" in found.message and "the header is corrupt, fix it" in found.message, found.message


def test_tiny_slope_under_a_job_window_packs_and_under_the_files_own_window_keeps_its_verdict(tmp_path: Path) -> None:
    """The same file under a 40/400 job window packs (every pixel level 102): a window renders
    the float64 modality values, never float16 ones, and what a job's window makes of a file is
    the job's choice, as a bone window on soft tissue is (an earlier version refused it, blaming
    the header, and so refused valid near-constant slices too: -3024/-3023 HU under 40/80). The
    file's own window 40/80 rendering it as one level stays constant_image, as before (the
    file's window is judged: fix the window, or name one)."""
    path = save(ct_dataset(ct_pixels((16, 16), low=1), slope=1e-30, intercept=0.0), tmp_path / "tiny.dcm")
    assert np.unique(samples_of(read(path, SOFT_TISSUE))[0].image).tolist() == [102]
    found = issue_of(read(path), "constant_image", "validate")
    assert "Window Center 40 / Window Width 80" in found.message, found.message


def test_float16_modality_values_past_float16s_range_are_non_finite_not_constant(tmp_path: Path) -> None:
    """A PET frame with Rescale Slope 1000 (stored 100..199: 100000..199000 Bq/ml) is a valid
    header, but float16 holds nothing past 65504: every value would be inf. That is non_finite,
    with its fix (a window and uint8/uint16), not constant_image blaming the header (inf == inf)."""
    px = np.random.default_rng(0).integers(100, 200, (16, 16), dtype=np.int16)
    path = save(ct_dataset(px, slope=1000.0, intercept=0.0, center=None, width=None, Modality="PT"),
                tmp_path / "pet.dcm")
    found = issue_of(read(path, output="float16"), "non_finite", "transform")
    assert "199000" in found.message and "uint8/uint16 with a window" in found.message, found.message
    assert "corrupt" not in found.message, found.message


def test_a_job_window_that_renders_a_near_constant_slice_as_one_level_packs(tmp_path: Path) -> None:
    """A CT slice of air (stored -2000/-1999: -3024/-3023 HU, Rescale Intercept -1024, a valid
    header) under a 40/80 job window is all level 0: the window's choice, packed."""
    near = np.full((16, 16), -2000, np.int16)
    near[::2] = -1999
    path = save(ct_dataset(near, center=None, width=None), tmp_path / "air.dcm")
    assert np.unique(samples_of(read(path, window(40.0, 80.0), output="uint8"))[0].image).tolist() == [0]


@pytest.mark.parametrize("windows", [(), (window(40.0, 80.0),)], ids=["float16_values", "uint8_window"])
def test_a_series_near_constant_slice_is_context_as_an_exactly_constant_one_is(tmp_path: Path,
                                                                                 windows: tuple[Any, ...]) -> None:
    """Under sample: {neighbors: k} a series' constant slice is context; a slice of -3024/-3023
    HU, one value in float16, is no less so: it packs too, float16 values or windowed."""
    output = "uint8" if windows else "float16"
    near = np.full((16, 16), -2000, np.int16)
    near[::2] = -1999
    for name, pixels in (("near.dcm", near), ("constant.dcm", np.full((16, 16), -2000, np.int16))):
        path = save(ct_dataset(pixels, center=None, width=None), tmp_path / name)
        assert samples_of(read(path, *windows, output=output, sample="neighbors")), name


def test_tiny_slope_whose_values_stay_distinct_in_the_output_packs(tmp_path: Path) -> None:
    """A small legal slope (1e-4: PET-like units) keeps its values apart in float16 and under a
    window in its units; a tiny slope under a window as narrow as its values packs too (the
    output is not flat). Only what is packed is judged."""
    stored = ct_pixels((16, 16), low=0, high=3000)
    small = save(ct_dataset(stored, slope=1e-4, intercept=0.0), tmp_path / "small.dcm")
    image = samples_of(read(small, output="float16"))[0].image
    assert np.unique(image).size > 100
    assert np.unique(samples_of(read(small, window(0.15, 0.3, "LINEAR_EXACT")))[0].image).size > 100
    tiny = save(ct_dataset(stored, slope=1e-30, intercept=0.0), tmp_path / "tiny.dcm")
    assert np.unique(samples_of(read(tiny, window(1.5e-27, 3e-27, "LINEAR_EXACT")))[0].image).size > 100


def test_a_job_window_that_clips_every_pixel_still_packs(tmp_path: Path) -> None:
    """A bone window on stored values that are all soft tissue is flat: the job's choice, packed
    as today (no rescale took the values apart from each other)."""
    path = save(ct_dataset(ct_pixels((16, 16), low=1000, high=1100)), tmp_path / "soft.dcm")
    image = samples_of(read(path, window(3000.0, 100.0)))[0].image
    assert np.unique(image).tolist() == [0]


def test_an_image_of_one_value_keeps_its_every_pixel_equal_verdict(tmp_path: Path) -> None:
    """A legitimately constant image is refused as before: every pixel equal, not a rescale."""
    path = save(ct_dataset(np.full((16, 16), 7, np.int16), slope=1e-30, intercept=0.0), tmp_path / "one.dcm")
    for found in (issue_of(read(path, output="float16"), "constant_image"), issue_of(read(path), "constant_image")):
        assert "Rescale Slope" not in found.message, found.message


# ---------------------------------------------------------------- frames that are not the declared codec


def with_syntax(path: Path, syntax: str) -> Path:
    """The file at ``path`` with its file meta naming ``syntax``; its data set as it was."""
    data = path.read_bytes()
    assert data[132:138] == b"\x02\x00\x00\x00UL"
    group_length = struct.unpack_from("<I", data, 140)[0]
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    meta = ds.file_meta
    meta.TransferSyntaxUID = pydicom.uid.UID(syntax)
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_file_meta_info

    buf = DicomBytesIO()
    buf.is_little_endian, buf.is_implicit_VR = True, False
    write_file_meta_info(buf, meta, enforce_standard=True)
    path.write_bytes(data[:132] + buf.getvalue() + data[144 + group_length:])
    return path


@pytest.mark.parametrize(("syntax", "name"), [("1.2.840.10008.1.2.4.50", "JPEG Baseline (Process 1)"),
                                              (JPEG2000Lossless, "JPEG 2000 Image Compression (Lossless Only)"),
                                              ("1.2.840.10008.1.2.4.80", "JPEG-LS Lossless Image Compression")])
def test_rle_frames_under_another_compressed_syntax_are_decode_failed_not_truncated(tmp_path: Path, syntax: str,
                                                                                     name: str) -> None:
    """A whole RLE file whose file meta names JPEG, JPEG 2000 or JPEG-LS (a broken converter):
    the decoder fails, and the frame lacks FFD9 because it never was a JPEG codestream. Not
    'truncated, copy the file again': decode_failed, saying the syntax is wrong."""
    path = with_syntax(save(rle_ct(ct_pixels((16, 16))), tmp_path / "relabelled.dcm"), syntax)
    found = issue_of(read(path, SOFT_TISSUE), "decode_failed", "read")
    assert f"the file meta names {syntax} ({name}) but frame 0 does not start as one" in found.message, found.message
    assert "it starts 02 00 00 00 40 00 00 00" in found.message, found.message
    assert "the transfer syntax is wrong: re-export" in found.message
    assert "copy the file again" not in found.message and "cut short" not in found.message


@pytest.mark.parametrize("source", ["jp2k", "SC_rgb_jpeg_dcmtk.dcm"])
def test_jpeg_frames_labelled_rle_are_decode_failed_not_truncated(tmp_path: Path, source: str) -> None:
    """JPEG 2000 or JPEG frames under the RLE Lossless UID: not an RLE header, not a cut file."""
    if source == "jp2k":
        ds = ct_dataset(ct_pixels((64, 64)))
        ds.compress(JPEG2000Lossless, ct_pixels((64, 64)))
        path = save(ds, tmp_path / "labelled.dcm")
        starts = "ff 4f ff 51"
    else:
        path = tmp_path / "labelled.dcm"
        path.write_bytes(shipped(source).read_bytes())
        starts = "ff d8"
    path = with_syntax(path, RLELossless)
    found = issue_of(read(path, SOFT_TISSUE), "decode_failed", "read")
    assert "the file meta names 1.2.840.10008.1.2.5 (RLE Lossless) but frame 0 does not start as one" in found.message
    assert f"it starts {starts}" in found.message, found.message


def test_a_codestream_cut_short_is_still_truncated(tmp_path: Path) -> None:
    """The start is the codec's, the end is missing: truncated, copy the file again, as before."""
    ds = pydicom.dcmread(shipped("MR_small_jp2klossless.dcm"))
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    ds.PixelData = encapsulate([frame[: len(frame) // 4 * 2]])
    found = issue_of(read(save(ds, tmp_path / "cut.dcm")), "truncated", "read")
    assert "frame 0 lacks its end marker (FFD9); copy the file again" in found.message
