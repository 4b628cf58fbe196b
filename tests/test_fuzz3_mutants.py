"""Mutants of valid files (one byte deleted or flipped) that packer read as the wrong thing.

Each test starts from a good file, damages it the way a fuzzer did, and states what the record
must say: damage is ``decode_failed`` (the file is broken, copy it again), a cut is ``truncated``,
a header that disagrees with whole pixel data is ``bad_shape``, and only a foreign format is
``unsupported``. Where the same bytes reach packer as another kind (a DICOM frame and a ``.jpg``),
both readers reach the same verdict.
"""

from __future__ import annotations

import gzip
from io import BytesIO
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from dicom_files import config, ct_dataset, image_dataset, make_ref, save, window
from pydicom.encaps import encapsulate
from pydicom.uid import (
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEGBaseline8Bit,
    SecondaryCaptureImageStorage,
)

from packer.config import ImageTransformConfig, LimitsConfig
from packer.opencv import cv2
from packer.read import nifti
from packer.read.dicom import read_dicom
from packer.read.image import probe_image, read_image
from packer.read.nifti import NiftiDefect
from packer.records import Issue, Sample, SampleRef

# ------------------------------------------------------------------ DICOM JPEG frame, damaged DHT


def _photo() -> np.ndarray:
    """A smooth 32×32 grey image (a blurred noise field)."""
    noise = np.random.default_rng(3).integers(0, 255, (32, 32)).astype(np.uint8)
    return cv2.GaussianBlur(noise, (5, 5), 0)


def _jpeg(image: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return encoded.tobytes()


def _dicom_jpeg(frame: bytes, path: Path) -> Path:
    """A Secondary Capture grey 8-bit slice whose one frame is the JPEG Baseline ``frame``."""
    ds = image_dataset(np.zeros((32, 32), np.uint8), modality="OT", sop_class=SecondaryCaptureImageStorage)
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.PixelData = encapsulate([frame + b"\0" * (len(frame) % 2)])
    ds["PixelData"].VR = "OB"
    return save(ds, path)


def _read_dicom(path: Path) -> list[Sample] | Issue:
    return read_dicom(make_ref(path), config(window(128.0, 256.0)))


def _read_photo(path: Path) -> list[Sample] | Issue:
    ref = SampleRef(sample_id="img", source="src", kind="image", path=str(path), relpath=path.name,
                    label="a", entity="e", time=None)
    return read_image(ref, ImageTransformConfig())


def _without(data: bytes, at: int) -> bytes:
    return data[:at] + data[at + 1:]


@pytest.mark.parametrize("offset", [21, 22, 24, 26, 28, 30])
def test_a_dicom_jpeg_frame_whose_huffman_table_lost_a_byte_is_decode_failed_as_the_same_jpg_is(
        tmp_path: Path, offset: int) -> None:
    """One byte deleted from the first DHT segment (its code counts or values): the segment's
    length now runs into the next one, libjpeg-turbo warns "N extraneous bytes before marker" and
    then cannot decode (strict or not), and OpenCV refuses the same bytes as a .jpg. pylibjpeg's
    libjpeg decoded the frame with the wrong Huffman tables: garbage (or all zeros, recorded as
    constant_image) packed as a good sample. The frame is decode_failed, naming the damage."""
    good = _jpeg(_photo())
    damaged = _without(good, good.index(b"\xff\xc4") + offset)
    photo = tmp_path / "same.jpg"
    photo.write_bytes(damaged)
    as_photo = _read_photo(photo)
    assert isinstance(as_photo, Issue) and as_photo.reason == "decode_failed"  # the reference
    found = _read_dicom(_dicom_jpeg(damaged, tmp_path / "sc.dcm"))
    assert isinstance(found, Issue), "the damaged frame packed"
    assert (found.reason, found.stage) == ("decode_failed", "read"), found.message
    assert "frame 0" in found.message and "does not decode" in found.message, found.message
    assert "copy or export the file again" in found.message, found.message


@pytest.mark.parametrize("where", ["before DQT", "before SOS", "before EOI"])
def test_a_dicom_jpeg_frame_with_stray_bytes_between_whole_segments_still_packs(tmp_path: Path, where: str) -> None:
    """Zero bytes between two whole marker segments, as some writers leave them: libjpeg-turbo
    warns "N extraneous bytes before marker" (strict mode stops) but decodes the frame right
    without strict mode, as OpenCV reads the same bytes as a .jpg. Not damage: the frame packs,
    with the pixels of the frame without them."""
    image = _photo()
    good = _jpeg(image)
    marker = {"before DQT": b"\xff\xdb", "before SOS": b"\xff\xda", "before EOI": b"\xff\xd9"}[where]
    at = good.rindex(marker)
    padded = good[:at] + b"\0\0\0\0" + good[at:]
    clean = _read_dicom(_dicom_jpeg(good, tmp_path / "clean.dcm"))
    found = _read_dicom(_dicom_jpeg(padded, tmp_path / "padded.dcm"))
    assert not isinstance(clean, Issue), clean.message
    assert not isinstance(found, Issue), found.message
    np.testing.assert_array_equal(found[0].image, clean[0].image)


# ------------------------------------------------- native DICOM: header larger than whole pixel data


def _ct_slice(path: Path, *, rows: int, syntax: str = ExplicitVRLittleEndian) -> Path:
    """A native 64×64 16-bit CT slice in ``syntax``, whole, whose header says ``rows`` Rows."""
    ds = ct_dataset(np.random.default_rng(1).integers(0, 3000, (64, 64)).astype(np.int16))
    ds.Rows = rows
    ds.file_meta.TransferSyntaxUID = syntax
    return save(ds, path)


@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian, ExplicitVRBigEndian])
def test_a_header_describing_more_pixels_than_whole_pixel_data_holds_is_bad_shape_not_a_cut(
        tmp_path: Path, syntax: str) -> None:
    """Rows edited 64 → 128, the Pixel Data element whole (its declared length, 8192, is the bytes
    it holds): no byte is missing, yet the record said the file was cut short, copy it again. The
    header disagrees with the stored image, as for the opposite case (more bytes than the header
    describes): bad_shape, naming the fields to check."""
    path = _ct_slice(tmp_path / "ct.dcm", rows=128, syntax=syntax)
    found = _read_dicom(path)
    assert isinstance(found, Issue), "a header larger than the pixel data read"
    assert (found.reason, found.stage) == ("bad_shape", "validate"), found.message
    assert "8192 bytes" in found.message and "16384" in found.message, found.message
    assert "(0028,0010) Rows" in found.message and "cut short" not in found.message, found.message


def test_a_slice_cut_inside_its_pixel_data_is_still_truncated(tmp_path: Path) -> None:
    """The cut this must not hide: the file ends inside Pixel Data, fewer bytes held than its
    element declares."""
    path = _ct_slice(tmp_path / "ct.dcm", rows=64)
    path.write_bytes(path.read_bytes()[:-3000])
    found = _read_dicom(path)
    assert isinstance(found, Issue) and found.reason == "truncated", getattr(found, "message", found)
    assert "cut short" in found.message, found.message


# ------------------------------------------------------------- photo with a damaged signature


def _tiff() -> bytes:
    from PIL import Image

    out = BytesIO()
    Image.fromarray(_photo()).save(out, "TIFF")
    return out.getvalue()


def _flip(data: bytes, at: int, bit: int) -> bytes:
    return data[:at] + bytes([data[at] ^ bit]) + data[at + 1:]


def _png() -> bytes:
    ok, encoded = cv2.imencode(".png", _photo())
    assert ok
    return encoded.tobytes()


DAMAGED_SIGNATURES = {  # name: (file, bytes, the format named); one bit of the magic flipped
    "png bit 6": ("photo.png", lambda: _flip(_png(), 6, 0x02), "PNG"),
    "png bit 0": ("photo.png", lambda: _flip(_png(), 0, 0x80), "PNG"),
    "png two bytes, IHDR after": ("photo.png", lambda: b"\0\0" + _png()[2:], "PNG"),
    "jpeg ff c8": ("photo.jpg", lambda: _flip(_jpeg(_photo()), 1, 0x10), "JPEG"),
    "jpeg ff d8 7f": ("photo.jpeg", lambda: _flip(_jpeg(_photo()), 2, 0x80), "JPEG"),
    "tiff 49 69 2a 00": ("photo.tif", lambda: _flip(_tiff(), 1, 0x20), "TIFF"),
    "tiff 42 flipped": ("photo.tiff", lambda: _flip(_tiff(), 2, 0x04), "TIFF"),  # 0x2b would be BigTIFF
}


@pytest.mark.parametrize("case", list(DAMAGED_SIGNATURES))
def test_a_photo_whose_signature_is_damaged_is_decode_failed_not_a_format_to_convert(
        tmp_path: Path, case: str) -> None:
    """A .png whose signature has one bit flipped (its IHDR chunk, CRC intact, at byte 8) was
    `unsupported`, telling the user to convert a PNG to PNG. A near miss of the signature of the
    file's own format (or a damaged magic before a structure that format's alone) is a damaged
    file, as a flipped chunk type is: decode_failed, naming the damaged signature, by the probe
    and by the read alike."""
    name, make, fmt = DAMAGED_SIGNATURES[case]
    path = tmp_path / name
    path.write_bytes(make())
    for found in (_read_photo(path), probe_image(make_ref(path))):
        assert isinstance(found, Issue), "a damaged photo read"
        assert (found.reason, found.stage) == ("decode_failed", "read"), found.message
        assert f"damaged {fmt} signature" in found.message, found.message
        assert "convert" not in found.message and "copy" in found.message, found.message


@pytest.mark.parametrize(("name", "head"), [
    ("anim.png", b"GIF89a"),                                  # a GIF named .png
    ("photo.jpg", b"RIFF\x24\0\0\0WEBPVP8 "),                 # a WebP named .jpg
    ("photo.jpg", b"\xff\x4f\xff\x51\0\x2f\0\0"),              # a JPEG 2000 codestream named .jpg
    ("photo.jpg", b"\xff\x0a\xfa\x7f"),                       # a JPEG XL codestream named .jpg
    ("raw.tif", b"IIRO\x08\0\0\0"),                           # an Olympus raw named .tif
    ("photo.png", b"\x8aMNG\r\n\x1a\n"),                      # a MNG named .png
])
def test_a_foreign_format_under_an_image_name_stays_unsupported(tmp_path: Path, name: str, head: bytes) -> None:
    """What is not a near miss of the name's own signature is another format: convert it."""
    path = tmp_path / name
    path.write_bytes(head + bytes(range(200)))
    for found in (_read_photo(path), probe_image(make_ref(path))):
        assert isinstance(found, Issue) and found.reason == "unsupported", getattr(found, "message", found)
        assert "convert the file" in found.message, found.message


# ------------------------------------------------------------- .nii.gz damaged before its header is out


def _nii_gz() -> bytes:
    data = np.random.default_rng(3).integers(-1000, 1000, (24, 24, 8)).astype(np.int16)
    img = nib.Nifti1Image(data, np.diag([1.0, 1.0, 2.0, 1.0]))
    img.header.set_xyzt_units("mm")
    return gzip.compress(img.to_bytes(), mtime=0)


def _load_header(path: Path) -> NiftiDefect:
    with pytest.raises(NiftiDefect) as refused:
        nifti.load_header(str(path), LimitsConfig(), channels_from="last_axis")
    return refused.value


def test_a_whole_nii_gz_damaged_before_its_header_inflates_is_decode_failed_not_truncated(tmp_path: Path) -> None:
    """Byte 40 of a whole .nii.gz (its gzip trailer there) flipped: zlib fails ("invalid code --
    missing end-of-block") before the 348-byte header is out. Nothing is cut, yet it was
    `truncated`, "the gzip stream ends or breaks inside the header"; a zlib error is damage, as the
    same damage further in the stream is: decode_failed, the gzip stream is damaged."""
    gz = bytearray(_nii_gz())
    gz[40] ^= 0xFF
    path = tmp_path / "early.nii.gz"
    path.write_bytes(bytes(gz))
    refused = _load_header(path)
    assert refused.reason == "decode_failed", str(refused)
    assert "gzip stream is damaged" in str(refused) and "zlib" in str(refused), str(refused)
    assert "ends" not in str(refused) and "cut" not in str(refused), str(refused)


@pytest.mark.parametrize("kept", [30, 200])
def test_a_nii_gz_whose_stream_ends_inside_its_header_is_still_truncated(tmp_path: Path, kept: int) -> None:
    """The cut this must not hide: the gzip stream ends before the header is out."""
    path = tmp_path / "cut.nii.gz"
    path.write_bytes(_nii_gz()[:kept])
    refused = _load_header(path)
    assert refused.reason == "truncated", str(refused)


@pytest.mark.parametrize("translate", [(b"\r\n", b"\n"), (b"\n", b"\r\n"), (b"\r", b"\n")],
                         ids=["crlf-to-lf", "lf-to-crlf", "cr-to-lf"])
def test_a_png_whose_line_endings_were_translated_is_a_damaged_png(
        tmp_path: Path, translate: tuple[bytes, bytes]) -> None:
    """PNG's signature holds CR LF and LF to show a text-mode transfer (PNG 12.12): such a file has
    its IHDR a byte or two away from byte 8, and was told to convert a PNG to PNG (unsupported)."""
    ok, buf = cv2.imencode(".png", np.random.default_rng(0).integers(0, 255, (8, 8), dtype=np.uint8))
    data = buf.tobytes()
    old, new = translate
    path = tmp_path / "photo.png"
    path.write_bytes(data[:16].replace(old, new) + data[16:])  # the signature and the IHDR's length (13: CR)
    for found in (_read_photo(path), probe_image(make_ref(path))):
        assert isinstance(found, Issue) and found.reason == "decode_failed", found
        assert "line endings were translated" in found.message, found.message
