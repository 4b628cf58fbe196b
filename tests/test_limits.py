"""Hostile sizes are refused from headers, before anything is allocated; burned-in text is refused.

Every file is tiny but its header claims a huge image. Each test checks the reason, that the
message names the header field, its value and the job key to raise, that the decoder was never
called, and (where Python or numpy would allocate) that ``tracemalloc``'s peak stays small.
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pydicom
import pytest
from dicom_files import config, ct_dataset, make_ref, save, shipped, window
from pydicom.uid import DeflatedExplicitVRLittleEndian, RLELossless

import packer.read.dicom as dicom_mod
import packer.read.image as image_mod
from packer.config import (
    ImageTransformConfig,
    JobConfig,
    LimitsConfig,
    PackConfig,
    SafetyConfig,
    SplitConfig,
)
from packer.read import read_sample
from packer.read.dicom import DicomHeader, probe_dicom, read_dicom
from packer.read.image import ImageHeader, probe_image, read_image
from packer.records import Issue, Sample, SampleRef

PEAK_LIMIT = 50 * 2**20
DEFAULT_LIMITS = LimitsConfig()
TIME = ("StudyDate", "StudyTime")


def image_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="img", source="photos", kind="image", path=str(path), relpath=path.name,
                     label="a", entity="e", time=None)


def peak_of(call: Callable[[], Any]) -> tuple[Any, int]:
    """(result, peak bytes traced while ``call`` ran)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def no_decode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test if either reader reaches its pixel decoder."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the decoder was called for a file the header check should have refused")

    monkeypatch.setattr(image_mod, "_decode", refuse)
    monkeypatch.setattr(dicom_mod, "pixel_array", refuse)
    yield


def too_large(result: Any, *needles: str) -> Issue:
    assert isinstance(result, Issue), f"expected too_large, got {type(result).__name__}"
    assert (result.reason, result.stage) == ("too_large", "read"), result.message
    for needle in needles:
        assert needle in result.message, (needle, result.message)
    return result


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bytes(width: int, height: int, *, bit_depth: int = 8, colour_type: int = 0, zeros: int = 1 << 20) -> bytes:
    """A PNG whose IHDR says ``width``×``height`` and whose IDAT is a zlib stream of ``zeros`` zero
    bytes (a decompression bomb in miniature: 1 MiB of zeros compresses to about 1 KiB)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(bytes(zeros), 9))
            + png_chunk(b"IEND", b""))


def jpeg_with_size(path: Path, height: int, width: int) -> Path:
    """A real 16×16 JPEG from OpenCV with its SOF0 height and width overwritten."""
    ok, encoded = cv2.imencode(".jpg", np.arange(256, dtype=np.uint8).reshape(16, 16))
    assert ok
    data = bytearray(encoded.tobytes())
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    path.write_bytes(bytes(data))
    return path


# ------------------------------------------------------------------------------------ images


def test_png_header_claiming_100000_squared_is_too_large_without_decoding(tmp_path: Path, no_decode: None) -> None:
    path = tmp_path / "huge.png"
    path.write_bytes(png_bytes(100_000, 100_000))
    assert path.stat().st_size < 10_000
    for call in (lambda: probe_image(image_ref(path)), lambda: read_image(image_ref(path), ImageTransformConfig())):
        result, peak = peak_of(call)
        too_large(result, "huge.png", "IHDR width 100000", "height 100000", "10000000000 pixels",
                  "limits.max_pixels 268435456")
        assert peak < PEAK_LIMIT


def test_png_bomb_30000_squared_of_zeros_is_refused_before_decode(tmp_path: Path, no_decode: None) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(png_bytes(30_000, 30_000, zeros=30_001 * 64))  # 64 rows' worth of filtered zeros
    for call in (lambda: probe_image(image_ref(path)), lambda: read_image(image_ref(path), ImageTransformConfig())):
        result, peak = peak_of(call)
        too_large(result, "IHDR width 30000", "900000000 pixels", "limits.max_pixels")
        assert peak < PEAK_LIMIT


def test_jpeg_sof_claiming_65500_squared_is_too_large(tmp_path: Path, no_decode: None) -> None:
    path = jpeg_with_size(tmp_path / "huge.jpg", 65_500, 65_500)
    for result in (probe_image(image_ref(path)), read_image(image_ref(path), ImageTransformConfig())):
        too_large(result, "JPEG SOF width 65500 × height 65500", f"{65_500 ** 2} pixels", "limits.max_pixels")


def test_bmp_header_claiming_100000_squared_is_too_large_and_says_bmp_once(tmp_path: Path, no_decode: None) -> None:
    path = tmp_path / "huge.bmp"
    cv2.imwrite(str(path), np.zeros((4, 4), np.uint8))
    data = bytearray(path.read_bytes())
    data[18:26] = struct.pack("<ii", 100_000, 100_000)  # BITMAPINFOHEADER width, height
    path.write_bytes(bytes(data))
    too_large(probe_image(image_ref(path)), "huge.bmp: BMP width 100000 × height 100000",  # was "BMP BMP width"
              f"{100_000 ** 2} pixels")


def test_decoded_bytes_limit_counts_channels_depth_and_working_copies(tmp_path: Path, no_decode: None) -> None:
    # 4000×4000 RGBA 16-bit: 16e6 px (under max_pixels); decoded 16e6·4·2 = 128e6 bytes, plus
    # float32 working copies 2·16e6·4·4 = 512e6 bytes: 640e6 in all.
    path = tmp_path / "deep.png"
    path.write_bytes(png_bytes(4000, 4000, bit_depth=16, colour_type=6))
    limits = LimitsConfig(max_decoded_bytes=600_000_000)
    for result in (probe_image(image_ref(path), limits=limits),
                   read_image(image_ref(path), ImageTransformConfig(), limits=limits)):
        too_large(result, "640000000 bytes", "limits.max_decoded_bytes 600000000")
    assert isinstance(probe_image(image_ref(path), limits=LimitsConfig(max_decoded_bytes=640_000_000)), ImageHeader)


def test_tiff_with_huge_tiles_is_too_large(tmp_path: Path, no_decode: None) -> None:
    """A 2×2 TIFF whose TileWidth × TileLength say 100000×100000: libtiff would allocate the tile."""
    entries = [(256, 3, 2), (257, 3, 2), (258, 3, 8), (259, 3, 1), (262, 3, 1), (277, 3, 1),
               (322, 4, 100_000), (323, 4, 100_000), (324, 4, 8), (325, 4, 4)]
    data = b"II*\x00" + struct.pack("<I", 12) + b"\x00\x40\x80\xff" + struct.pack("<H", len(entries))
    for tag, kind, value in entries:
        field = struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
        data += struct.pack("<HHI", tag, kind, 1) + field
    path = tmp_path / "tiles.tif"
    path.write_bytes(data + struct.pack("<I", 0))
    for result in (probe_image(image_ref(path)), read_image(image_ref(path), ImageTransformConfig())):
        too_large(result, "a 10000000000-byte TIFF tile/strip buffer", "limits.max_decoded_bytes")


def test_opencv_pixel_limit_is_checked_from_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       no_decode: None) -> None:
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "1000")
    path = tmp_path / "small.png"
    path.write_bytes(png_bytes(100, 20))
    too_large(probe_image(image_ref(path)), "over OpenCV's OPENCV_IO_MAX_IMAGE_PIXELS 1000", "2000")


def test_file_bigger_than_the_decoded_limit_is_not_read(tmp_path: Path, no_decode: None) -> None:
    path = tmp_path / "padded.png"
    path.write_bytes(png_bytes(8, 8) + bytes(5000))
    limits = LimitsConfig(max_decoded_bytes=4000)
    for result in (probe_image(image_ref(path), limits=limits),
                   read_image(image_ref(path), ImageTransformConfig(), limits=limits)):
        too_large(result, f"the file is {path.stat().st_size} bytes", "limits.max_decoded_bytes 4000")


def test_images_under_the_limits_still_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.png"
    ok, encoded = cv2.imencode(".png", np.arange(64 * 48, dtype=np.uint16).reshape(64, 48))
    path.write_bytes(encoded.tobytes())
    # 64×48 × 1 channel × 2 bytes = 6144, plus float32 copies 2·3072·3·4 = 73728: 79872 in all.
    exact = LimitsConfig(max_pixels=64 * 48, max_decoded_bytes=79_872)
    samples = read_image(image_ref(path), ImageTransformConfig(), limits=exact)
    assert isinstance(samples, list) and samples[0].image.shape == (3, 64, 48)
    too_large(read_image(image_ref(path), ImageTransformConfig(), limits=LimitsConfig(max_pixels=64 * 48 - 1)),
              "limits.max_pixels 3071")


# ------------------------------------------------------------------------------------- DICOM


def huge_dicom(tmp_path: Path, rows: int, columns: int, frames: int, name: str = "huge.dcm") -> Path:
    """A native CT file whose header claims rows×columns×frames but holds 16×16 pixels."""
    ds = ct_dataset()
    ds.Rows, ds.Columns, ds.NumberOfFrames = rows, columns, frames
    return save(ds, tmp_path / name)


def dicom_calls(path: Path, limits: LimitsConfig = DEFAULT_LIMITS) -> list[Callable[[], Any]]:
    ref = make_ref(path)
    return [lambda: probe_dicom(ref, entity_keyword="PatientID", time_keywords=TIME, limits=limits),
            lambda: read_dicom(ref, config(), limits=limits)]


def test_dicom_claiming_65535_squared_by_10000_frames_is_too_large(tmp_path: Path, no_decode: None) -> None:
    path = huge_dicom(tmp_path, 65535, 65535, 10_000)
    assert path.stat().st_size < 10_000
    for call in dicom_calls(path):
        result, peak = peak_of(call)
        too_large(result, "huge.dcm", "(0028,0010) Rows 65535 × (0028,0011) Columns 65535", "4294836225 pixels",
                  "limits.max_pixels 268435456", "raise limits.max_pixels in the job file")
        assert peak < PEAK_LIMIT


def test_dicom_frame_count_over_the_limit(tmp_path: Path, no_decode: None) -> None:
    path = huge_dicom(tmp_path, 16, 16, 10_001)
    for call in dicom_calls(path):
        too_large(call(), "(0028,0008) Number of Frames is 10001", "limits.max_frames 10000")
    # At the limit the size check passes and the real defect shows: the header describes 10,000
    # frames and the (whole, not cut) Pixel Data holds one.
    result = read_dicom(make_ref(huge_dicom(tmp_path, 16, 16, 10_000, "at_limit.dcm")), config())
    assert isinstance(result, Issue) and result.reason == "bad_shape", result
    assert "Number of Frames 10000" in result.message and "cut short" not in result.message, result.message


def test_dicom_decoded_bytes_count_stored_frames_and_float64_working_copies(tmp_path: Path, no_decode: None) -> None:
    # 16×16 int16, 100 frames: stored 16·16·100·1·2 = 51200; working 2·256·1·8 = 4096 → 55296.
    path = huge_dicom(tmp_path, 16, 16, 100)
    for call in dicom_calls(path, LimitsConfig(max_decoded_bytes=55_295)):
        too_large(call(), "decoding needs about 55296 bytes", "100 frame(s) × 16×16 × 1 sample(s) × 2 byte(s)",
                  "limits.max_decoded_bytes 55295")
    header = dicom_calls(path, LimitsConfig(max_decoded_bytes=55_296))[0]()
    assert isinstance(header, DicomHeader) and header.frames == 100


def test_encapsulated_dicom_with_huge_rows_is_refused_before_decode(tmp_path: Path, no_decode: None) -> None:
    ds = pydicom.dcmread(shipped("MR_small_RLE.dcm"))
    ds.Rows, ds.Columns = 60_000, 60_000
    path = save(ds, tmp_path / "rle.dcm")
    for call in dicom_calls(path):
        result, peak = peak_of(call)
        too_large(result, "Rows 60000", "limits.max_pixels")
        assert peak < PEAK_LIMIT


def test_codestream_bigger_than_rows_columns_is_bad_shape_before_decode(tmp_path: Path, no_decode: None) -> None:
    ds = pydicom.dcmread(shipped("MR_small_jp2klossless.dcm"))  # a 64×64 JPEG 2000 codestream
    ds.Rows, ds.Columns = 32, 32
    result = read_dicom(make_ref(save(ds, tmp_path / "j2k.dcm")), config())
    assert isinstance(result, Issue) and (result.reason, result.stage) == ("bad_shape", "validate")
    assert "64×64" in result.message and "32×32" in result.message


def test_pixel_spacing_that_resamples_to_a_huge_image_is_too_large(tmp_path: Path) -> None:
    """A 16×16 CT whose Pixel Spacing says 100 mm, resampled to 0.5 mm: 3200×3200 pixels."""
    path = save(ct_dataset(PixelSpacing=[100, 100]), tmp_path / "spacing.dcm")
    limits = LimitsConfig(max_pixels=1_000_000)  # small, so a regression allocates 40 MB, not 4 GB
    result = read_dicom(make_ref(path), config(spacing=(0.5, 0.5)), limits=limits)
    too_large(result, "(0028,0030) Pixel Spacing [100.0, 100.0]", "3200×3200 = 10240000 pixels",
              "limits.max_pixels 1000000")
    samples = read_dicom(make_ref(path), config(spacing=(50.0, 50.0)), limits=limits)
    assert isinstance(samples, list) and samples[0].image.shape == (1, 32, 32)


def test_element_length_past_the_end_of_the_file_allocates_nothing(tmp_path: Path) -> None:
    """An element claiming 0xFFFFFFF0 bytes: CPython's read(n) would reserve 4 GiB for it."""
    path = save(ct_dataset(), tmp_path / "length.dcm")
    with open(path, "ab") as handle:
        handle.write(struct.pack("<HH2sHI", 0x7FE1, 0x0010, b"OB", 0, 0xFFFFFFF0) + bytes(16))
    for call in dicom_calls(path):
        result, peak = peak_of(call)
        assert isinstance(result, DicomHeader | list | Issue)
        assert peak < PEAK_LIMIT


def test_deflate_bomb_is_too_large_before_inflating_in_memory(tmp_path: Path, no_decode: None) -> None:
    ds = ct_dataset(np.zeros((512, 512), dtype=np.int16))  # 512 KiB of zeros deflate to about 1 KiB
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    path = tmp_path / "deflated.dcm"
    ds.save_as(path, enforce_file_format=True)
    assert path.stat().st_size < 20_000
    for call in dicom_calls(path, LimitsConfig(max_decoded_bytes=200_000)):
        result, peak = peak_of(call)
        too_large(result, "deflated data set", "inflates to more than", "limits.max_decoded_bytes 200000")
        assert peak < 2 * 2**20  # the inflated data set was never held


def test_a_deflated_data_set_counts_twice_against_the_limit(tmp_path: Path, no_decode: None) -> None:
    """pydicom holds the inflated data set and a copy of each element's value at once: a 600 MiB
    data set under a 700 MiB limit passed the check and a header read peaked at 1.27 GB. A data
    set between half the limit and the limit is now too_large; under half, it reads."""
    ds = ct_dataset(np.zeros((512, 512), dtype=np.int16))  # 512 KiB of pixels, a few KiB of header
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    path = tmp_path / "deflated.dcm"
    ds.save_as(path, enforce_file_format=True)
    for call in dicom_calls(path, LimitsConfig(max_decoded_bytes=800_000)):  # inflated: ~525 kB, over 400 kB
        result, _ = peak_of(call)
        too_large(result, "inflates to more than", "held about 2 times while it is read",
                  "limits.max_decoded_bytes 800000")
    for call in dicom_calls(path, LimitsConfig(max_decoded_bytes=1_200_000)):
        result, _ = peak_of(call)
        assert not isinstance(result, Issue) or "deflated data set" not in result.message, result


def test_deflated_files_under_the_limit_still_read() -> None:
    samples = read_dicom(make_ref(shipped("image_dfl.dcm")), config(window(128, 256)))
    assert isinstance(samples, list) and samples


def test_a_deflate_stream_that_ends_before_its_file_does_is_measured_not_looped_on() -> None:
    """A deflated data set that inflates past one 4 MiB step of the limit check and is followed
    by a byte (the pad to an even length pydicom writes after an odd-length stream): once the
    stream had ended, the byte stayed in unconsumed_tail and the check looped on it forever (a
    2048×2048 16-bit image saved deflated hung the build at 100% CPU)."""
    import io
    import signal
    import zlib

    from packer.read.limits import inflated_size_exceeds

    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    rows, columns = np.mgrid[0:2048, 0:2048]
    data = ((rows + columns) % 4000).astype("<u2").tobytes()  # a smooth image: 8 MiB deflate to a few KiB
    stream = squeeze.compress(data) + squeeze.flush() + b"\x00"

    def hung(*_: object) -> None:
        raise TimeoutError("inflated_size_exceeds did not return")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        assert inflated_size_exceeds(io.BytesIO(stream), 1 << 30) is None
        assert inflated_size_exceeds(io.BytesIO(stream), 1 << 20) > 1 << 20  # over the cap: the count so far
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_jpeg_frame_s_size_is_read_past_any_number_of_segments_before_its_sof() -> None:
    """The codestream size check gave up after 64 marker segments and let the frame be decoded:
    70 comment segments before a SOF claiming 20000×20000 under a 32×32 DICOM header took 2.1 GB
    before the decoder failed. Every segment up to the SOF is walked; the scan never is."""
    from packer.read.limits import Codestream, codestream_header

    comments = b"".join(b"\xff\xfe" + struct.pack(">H", 6) + b"pad!" for _ in range(200))
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 20000, 20000, 1) + b"\x01\x11\x00"
    frame = b"\xff\xd8" + comments + sof + b"\xff\xda" + bytes(64)
    assert codestream_header(frame) == Codestream(20000, 20000, 8)
    assert codestream_header(b"\xff\xd8" + comments + b"\xff\xda" + bytes(8)) is None  # no SOF before the scan


def test_encapsulated_dicom_under_the_limits_still_reads(tmp_path: Path) -> None:
    ds = ct_dataset(np.random.default_rng(1).integers(0, 3000, (32, 32), dtype=np.int16))
    ds.compress(RLELossless, encoding_plugin="pydicom")
    samples = read_dicom(make_ref(save(ds, tmp_path / "rle.dcm")), config())
    assert isinstance(samples, list) and samples[0].image.shape == (1, 32, 32)


# ------------------------------------------------------------------------- burned-in annotation


def test_burned_in_annotation_is_refused_from_the_header(tmp_path: Path, no_decode: None) -> None:
    path = save(ct_dataset(BurnedInAnnotation="YES"), tmp_path / "burned.dcm")
    for call in dicom_calls(path):
        result = call()
        assert isinstance(result, Issue)
        assert (result.reason, result.stage) == ("burned_in_annotation", "read")
        assert "burned.dcm" in result.message and "(0028,0301)" in result.message
        assert "safety.burned_in_annotation: allow" in result.message


def test_burned_in_annotation_allowed_when_asked(tmp_path: Path) -> None:
    path = save(ct_dataset(BurnedInAnnotation="YES"), tmp_path / "burned.dcm")
    header = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, allow_burned_in=True)
    assert isinstance(header, DicomHeader)
    samples = read_dicom(make_ref(path), config(), allow_burned_in=True)
    assert isinstance(samples, list) and len(samples) == 1


def test_burned_in_annotation_no_reads(tmp_path: Path) -> None:
    samples = read_dicom(make_ref(save(ct_dataset(BurnedInAnnotation="NO"), tmp_path / "clean.dcm")), config())
    assert isinstance(samples, list) and len(samples) == 1


def job(*, burned_in: str = "reject", limits: LimitsConfig = DEFAULT_LIMITS) -> JobConfig:
    return JobConfig(name="t", sources=(), split=SplitConfig(by="entity", ratios=(("train", 1.0),), seed=0),
                     transforms=(("dicom", config()), ("image", ImageTransformConfig())),
                     pack=PackConfig(format="webdataset"),
                     output=Path("out"), limits=limits, safety=SafetyConfig(burned_in_annotation=burned_in))


def test_read_sample_passes_safety_and_limits_through(tmp_path: Path) -> None:
    burned = make_ref(save(ct_dataset(BurnedInAnnotation="YES"), tmp_path / "burned.dcm"))
    rejected = read_sample(burned, job())
    assert isinstance(rejected, Issue) and rejected.reason == "burned_in_annotation"
    allowed = read_sample(burned, job(burned_in="allow"))
    assert isinstance(allowed, list) and isinstance(allowed[0], Sample)
    small = job(burned_in="allow", limits=LimitsConfig(max_pixels=255))  # the file is 16×16
    assert getattr(read_sample(burned, small), "reason", None) == "too_large"
    png = tmp_path / "p.png"
    png.write_bytes(png_bytes(100, 100))
    assert getattr(read_sample(image_ref(png), small), "reason", None) == "too_large"
