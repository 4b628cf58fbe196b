"""Native multi-frame Pixel Data padded with zeros past its frames (older writers padded, PS3.5
8.1.1's Note says to accept it): whatever the padding's length, the frames the header declares
are read, the padding dropped, and each sample says so in ``metadata.warnings``. Bytes past the
frames that are not zeros are no padding: the header does not describe the stored image, and the
file is a ``bad_shape`` bad sample naming the attributes to check.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dicom_files import config, image_dataset, make_ref, save, window
from pydicom.pixels import pack_bits
from pydicom.uid import SecondaryCaptureImageStorage, XRayAngiographicImageStorage

from packer.read.dicom import read_dicom
from packer.records import Issue, Sample

FRAME_BYTES = 32 * 32 * 2


def _xa_clip(frames: int, padding: bytes, path: Path) -> tuple[Path, np.ndarray]:
    """An XA cine of ``frames`` 32×32 frames of 12 bits, its Pixel Data followed by ``padding``;
    without Number of Frames where ``frames`` is 1."""
    pixels = np.random.default_rng(frames).integers(0, 4096, (frames, 32, 32)).astype(np.uint16)
    ds = image_dataset(pixels if frames > 1 else pixels[0], modality="XA", sop_class=XRayAngiographicImageStorage,
                       bits_stored=12)
    assert ("NumberOfFrames" in ds) == (frames > 1)
    ds.PixelData = ds.PixelData + padding
    return save(ds, path), pixels


def _read(path: Path, **kwargs: object) -> list[Sample] | Issue:
    return read_dicom(make_ref(path), config(window(2047.5, 4096), output="uint16", **kwargs))


@pytest.mark.parametrize("frames, padding", [
    (6, 100),                  # less than a frame
    (6, FRAME_BYTES),          # exactly one frame: pydicom would read it as a 7th frame
    (6, 3 * FRAME_BYTES + 8),  # several frames and some
    (1, FRAME_BYTES),          # a single frame without (0028,0008) Number of Frames
])
def test_zero_padding_of_any_length_past_the_frames_is_dropped_with_a_warning(
        tmp_path: Path, frames: int, padding: int) -> None:
    path, _ = _xa_clip(frames, bytes(padding), tmp_path / "padded.dcm")
    clean = _read(_xa_clip(frames, b"", tmp_path / "clean.dcm")[0])
    samples = _read(path)
    assert isinstance(samples, list) and isinstance(clean, list), samples
    assert [s.key for s in samples] == [s.key for s in clean] and len(samples) == frames
    for sample, unpadded in zip(samples, clean, strict=True):
        assert np.array_equal(sample.image, unpadded.image), sample.key
        assert not any("zero byte" in w for w in unpadded.metadata.get("warnings", []))
        (note,) = [w for w in sample.metadata["warnings"] if "zero byte" in w]
        assert f"{padding} zero byte(s) past the {frames * FRAME_BYTES}" in note and "dropped" in note


def test_zero_padding_of_a_whole_frame_stacked_keeps_the_declared_frames(tmp_path: Path) -> None:
    path, _ = _xa_clip(6, bytes(2 * FRAME_BYTES), tmp_path / "padded.dcm")
    samples = _read(path, frames="stack")
    assert isinstance(samples, list), samples
    (sample,) = samples
    assert sample.image.shape == (6, 32, 32)
    assert any("zero byte" in w for w in sample.metadata["warnings"])


@pytest.mark.parametrize("excess", [
    b"\x01" + bytes(99),                           # data right after the frames
    bytes(FRAME_BYTES) + b"\x07\x00",              # a whole zero frame, then data
    np.arange(FRAME_BYTES // 2, dtype="<u2").tobytes(),  # one more frame of data: Number of Frames is wrong
])
def test_excess_bytes_that_are_not_zeros_are_a_bad_shape_naming_the_header(tmp_path: Path, excess: bytes) -> None:
    path, _ = _xa_clip(6, excess, tmp_path / "long.dcm")
    issue = _read(path)
    assert isinstance(issue, Issue), issue
    assert (issue.stage, issue.reason) == ("validate", "bad_shape"), issue.message
    assert f"holds {6 * FRAME_BYTES + len(excess)} bytes" in issue.message
    assert "not zero padding" in issue.message and "(0028,0008) Number of Frames" in issue.message


def _bitmap(frames: int, padding: bytes, path: Path) -> tuple[Path, np.ndarray]:
    """A 1-bit (Bits Allocated 1) secondary capture of ``frames`` 5×5 frames, packed, then ``padding``."""
    bits = np.random.default_rng(7).integers(0, 2, (frames, 5, 5)).astype(np.uint8)
    ds = image_dataset(bits, modality="OT", sop_class=SecondaryCaptureImageStorage)
    ds.BitsAllocated = ds.BitsStored = 1
    ds.HighBit = 0
    ds.PixelData = pack_bits(bits.ravel(), pad=True) + padding
    return save(ds, path), bits


@pytest.mark.parametrize("padding", [4, 40])
def test_one_bit_frames_padded_with_zeros_read_their_bits(tmp_path: Path, padding: int) -> None:
    """Packed 1-bit data: 3 frames of 25 bits are 10 bytes (75 bits, then the even-length pad);
    zeros past them are padding, not frames (pydicom sized excess 1-bit frames wrongly and raised
    a TypeError, a decode_failed bad sample)."""
    path, bits = _bitmap(3, bytes(padding), tmp_path / "bits.dcm")
    samples = read_dicom(make_ref(path), config(window(0.5, 1.0)))
    assert isinstance(samples, list), samples
    assert len(samples) == 3
    for sample, frame in zip(samples, bits, strict=True):
        assert np.array_equal(sample.image[0] > 127, frame.astype(bool)), sample.key
        assert any("zero byte" in w for w in sample.metadata["warnings"])


def test_one_bit_frames_followed_by_data_are_a_bad_shape(tmp_path: Path) -> None:
    path, _ = _bitmap(3, b"\x00\x00\xff\x00", tmp_path / "bits.dcm")
    issue = read_dicom(make_ref(path), config(window(0.5, 1.0)))
    assert isinstance(issue, Issue), issue
    assert (issue.stage, issue.reason) == ("validate", "bad_shape"), issue.message
