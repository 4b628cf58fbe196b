"""HTJ2K transfer syntaxes (1.2.840.10008.1.2.4.201/.202/.203) through packer's DICOM reader.

Codestreams are made by OpenJPH (``imagecodecs.htj2k_encode``, dev extra); packer decodes them
with its pinned plugin, pylibjpeg-openjpeg (OpenJPEG >= 2.5 decodes HT code-blocks, it cannot
encode them). Every codestream is checked to be HTJ2K before use (:func:`ht_markers`): a plain
JPEG 2000 Part 1 stream in its place would decode just as well and prove nothing.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import imagecodecs
import numpy as np
import pydicom
import pytest
from dicom_files import config, ct_dataset, ct_pixels, image_dataset, make_ref, save, window
from pydicom.dataset import Dataset
from pydicom.encaps import encapsulate
from pydicom.pixels import pixel_array
from pydicom.uid import UID, SecondaryCaptureImageStorage

import packer.read.dicom as reader
from packer.read.dicom import DicomHeader, decoder_table, probe_dicom, read_dicom
from packer.records import Issue, Sample
from packer.where import Condition

HTJ2K_LOSSLESS = "1.2.840.10008.1.2.4.201"
HTJ2K_LOSSLESS_RPCL = "1.2.840.10008.1.2.4.202"
HTJ2K = "1.2.840.10008.1.2.4.203"
HTJ2K_SYNTAXES = (HTJ2K_LOSSLESS, HTJ2K_LOSSLESS_RPCL, HTJ2K)
RPCL = 2  # COD SGcod progression order (ISO/IEC 15444-1 Table A.16)


# ---------------------------------------------------------------- building HTJ2K files


def main_header_segments(codestream: bytes) -> dict[bytes, bytes]:
    """Marker → its main-header segment (marker, Lxxx, parameters): from SOC to the first SOT,
    each segment's length read from the stream (ISO/IEC 15444-1 A.4, A.5), nothing guessed."""
    assert codestream[:2] == b"\xff\x4f", "no SOC marker: not a JPEG 2000 codestream"
    segments: dict[bytes, bytes] = {}
    at = 2
    while at + 4 <= len(codestream) and codestream[at:at + 2] != b"\xff\x90":
        (length,) = struct.unpack(">H", codestream[at + 2:at + 4])
        segments.setdefault(codestream[at:at + 2], codestream[at:at + 2 + length])
        at += 2 + length
    return segments


def ht_markers(codestream: bytes) -> dict[str, Any]:
    """What the main header says: HT capability (Rsiz bit 14 + CAP marker, ISO/IEC 15444-15),
    HT code-block style (SPcod bit 6), progression order, decomposition levels, TLM presence, and
    size, precision and sign (SIZ)."""
    segments = main_header_segments(codestream)
    siz, cod = segments[b"\xff\x51"], segments[b"\xff\x52"]
    rsiz, components = struct.unpack(">H", siz[4:6])[0], struct.unpack(">H", siz[38:40])[0]
    first_component = siz[40]
    return {
        "rsiz_ht": bool(rsiz & 0x4000),
        "cap": b"\xff\x50" in segments,
        "ht_blocks": bool(cod[12] & 0x40),
        "progression": cod[5],
        "levels": cod[9],
        "size": struct.unpack(">II", siz[6:14]),  # Xsiz, Ysiz (image origin is 0 here)
        "tlm": b"\xff\x55" in segments,
        "components": components,
        "precision": (first_component & 0x7F) + 1,
        "signed": bool(first_component & 0x80),
        "ends_with_eoc": codestream.endswith(b"\xff\xd9"),
    }


def encode_htj2k(pixels: np.ndarray, syntax: str, *, precision: int | None = None) -> bytes:
    """One lossless (reversible 5/3) HTJ2K codestream of the 2-D array ``pixels``.

    HTJ2K Lossless RPCL (PS3.5 10.18) needs RPCL progression and TLM markers; OpenJPH writes RPCL
    by default and ``tlm=True`` adds the TLM. ``precision``: OpenJPH (through imagecodecs) always
    writes the container's bit depth (16 for int16), so a 12-bit codestream (PS3.5: precision =
    Bits Stored) is made by rewriting the SIZ Ssiz byte. That is exact for *signed* reversible
    data: there is no DC level shift, and the QCD exponents written for 16 bits still bound the
    12-bit coefficients (only more guard headroom); both OpenJPEG and OpenJPH decode it exactly.
    """
    codestream = bytes(imagecodecs.htj2k_encode(pixels, reversible=True, tlm=syntax == HTJ2K_LOSSLESS_RPCL))
    if precision is not None:
        assert pixels.dtype.kind == "i", "rewriting Ssiz is only exact for signed data"
        assert int(pixels.min()) >= -(1 << (precision - 1)) and int(pixels.max()) < 1 << (precision - 1)
        at = 42  # SOC, then SIZ: marker, Lsiz, Rsiz, 8 × 4-byte sizes, Csiz, then the first Ssiz
        assert codestream[2:4] == b"\xff\x51", "SIZ must follow SOC"
        codestream = codestream[:at] + bytes([0x80 | (precision - 1)]) + codestream[at + 1:]
    markers = ht_markers(codestream)
    assert markers["rsiz_ht"] and markers["cap"] and markers["ht_blocks"], f"not an HTJ2K codestream: {markers}"
    if syntax == HTJ2K_LOSSLESS_RPCL:  # and the lowest resolution at most 64 wide and high
        assert markers["progression"] == RPCL and markers["tlm"], markers
        assert max(markers["size"]) >> markers["levels"] <= 64, markers
    # The reference HTJ2K implementation reads it back exactly: the stream is sound before packer sees it.
    np.testing.assert_array_equal(imagecodecs.htj2k_decode(codestream), pixels)
    return codestream


def as_htj2k(ds: Dataset, syntax: str, frames: list[bytes]) -> Dataset:
    """``ds`` (native pixels) re-encoded: encapsulated (7FE0,0010) of ``frames`` (PS3.5 A.4), OB,
    undefined length, and the transfer syntax in the file meta."""
    ds.file_meta.TransferSyntaxUID = UID(syntax)
    ds.PixelData = encapsulate(frames)
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    return ds


def ct_slice(pixels: np.ndarray, bits_stored: int) -> Dataset:
    """A signed CT-like slice (rescale -1024, a file window 40/80)."""
    return ct_dataset(pixels, bits_stored=bits_stored)


def mono8(pixels: np.ndarray) -> Dataset:
    """An 8-bit unsigned MONOCHROME2 secondary capture."""
    return image_dataset(pixels, modality="OT", sop_class=SecondaryCaptureImageStorage)


def ct16_pixels() -> np.ndarray:
    # Mostly -2000..32766 stored, plus both 16-bit signed extremes: -33792..31743 HU after the intercept.
    pixels = ct_pixels((64, 48), seed=11, low=-2000, high=32767)
    pixels[0, :2] = (-32768, 32767)
    return pixels


def ct12_pixels() -> np.ndarray:
    pixels = ct_pixels((50, 70), seed=12, low=-2048, high=2048)
    pixels[0, :2] = (-2048, 2047)  # the 12-bit signed extremes
    return pixels


def mono8_pixels() -> np.ndarray:
    pixels = np.random.default_rng(13).integers(0, 256, size=(40, 56), dtype=np.uint8)
    pixels[0, :2] = (0, 255)
    return pixels


# ---------------------------------------------------------------- reading


def read(path: Path, *windows: Any, **kwargs: Any) -> list[Sample] | Issue:
    return read_dicom(make_ref(path), config(*windows, **kwargs))


def read_spying(path: Path, monkeypatch: pytest.MonkeyPatch, *windows: Any,
                **kwargs: Any) -> tuple[list[Sample], list[np.ndarray], list[str]]:
    """Read ``path`` and also return the stored values packer's decode step got from pydicom,
    and the plugin it asked for."""
    arrays: list[np.ndarray] = []
    plugins: list[str] = []

    def spy(ds: Any, **options: Any) -> np.ndarray:
        plugins.append(options.get("decoding_plugin", ""))
        arr = pixel_array(ds, **options)
        arrays.append(arr.copy())
        return arr

    with monkeypatch.context() as patch:
        patch.setattr(reader, "pixel_array", spy)
        samples = read(path, *windows, **kwargs)
    assert isinstance(samples, list), getattr(samples, "message", samples)
    return samples, arrays, plugins


def stack(samples: list[Sample] | Issue) -> np.ndarray:
    assert isinstance(samples, list), getattr(samples, "message", samples)
    return np.stack([s.image for s in samples])


CT_WINDOWS = (window(40, 80), window(-1024, 65536))  # brain, and one spanning every 16-bit HU value
MONO_WINDOWS = (window(128, 256), window(100, 50, "LINEAR_EXACT"))

CASES = {
    "ct16": (ct16_pixels, lambda p: ct_slice(p, 16), None, CT_WINDOWS),
    "ct12": (ct12_pixels, lambda p: ct_slice(p, 12), 12, CT_WINDOWS),
    "mono8": (mono8_pixels, mono8, None, MONO_WINDOWS),
}


def test_pinned_decoder_covers_htj2k() -> None:
    table = decoder_table()
    assert {uid: table[uid] for uid in HTJ2K_SYNTAXES} == dict.fromkeys(HTJ2K_SYNTAXES, "pylibjpeg")


@pytest.mark.parametrize("syntax", HTJ2K_SYNTAXES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_htj2k_decodes_losslessly_and_equals_native(syntax: str, case: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    make_pixels, make_dataset, precision, windows = CASES[case]
    pixels = make_pixels()
    codestream = encode_htj2k(pixels, syntax, precision=precision)
    markers = ht_markers(codestream)
    assert (markers["precision"], markers["signed"]) == ((precision or pixels.dtype.itemsize * 8),
                                                         pixels.dtype.kind == "i")
    path = save(as_htj2k(make_dataset(pixels), syntax, [codestream]), tmp_path / f"{case}.dcm")
    native = save(make_dataset(pixels), tmp_path / f"{case}-native.dcm")
    assert str(pydicom.dcmread(native, stop_before_pixels=True).file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.1"

    # some test files are secondary captures: an image job packs them only when a condition names them (the
    # pattern writes it out and lets every other class through)
    header = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=("StudyDate",),
                         where=(Condition("SOPClassUID", "match", ("Secondary Capture|.",)),))
    assert isinstance(header, DicomHeader), getattr(header, "message", header)
    assert (header.transfer_syntax_uid, header.rows, header.columns, header.frames) == (syntax, *pixels.shape, 1)

    samples, decoded, plugins = read_spying(path, monkeypatch, *windows, output="uint16")
    assert plugins == ["pylibjpeg"]
    assert decoded[0].dtype == pixels.dtype
    np.testing.assert_array_equal(decoded[0].reshape(pixels.shape), pixels)  # lossless, stored values
    assert samples[0].metadata["transfer_syntax"] == syntax
    assert samples[0].metadata["decoder"] == "pylibjpeg"
    assert samples[0].metadata["bits_stored"] == (precision or pixels.dtype.itemsize * 8)

    # Compression changes nothing: every output packer makes equals the Explicit VR Little Endian file's.
    np.testing.assert_array_equal(stack(samples), stack(read(native, *windows, output="uint16")))
    for output in ("uint8", "float16"):
        np.testing.assert_array_equal(stack(read(path, *windows, output=output)),
                                      stack(read(native, *windows, output=output)))


def test_htj2k_ct_window_matches_hand_computed_values(tmp_path: Path) -> None:
    # PS3.3 C.11.2.1.2 LINEAR, c 40 / w 80 on HU = stored - 1024, quantised round(y * 255).
    pixels = ct12_pixels()
    path = save(as_htj2k(ct_slice(pixels, 12), HTJ2K_LOSSLESS, [encode_htj2k(pixels, HTJ2K_LOSSLESS, precision=12)]),
                tmp_path / "ct.dcm")
    hu = pixels.astype(np.float64) - 1024.0
    expected = np.rint(np.clip((hu - 39.5) / 79.0 + 0.5, 0.0, 1.0) * 255.0)
    assert 0 < np.count_nonzero((expected > 0) & (expected < 255))  # the window's slope is exercised
    np.testing.assert_array_equal(stack(read(path, window(40, 80)))[0, 0], expected)
    # float16 output is the modality values themselves, rounded to float16 (spacing 2 beyond |2048|).
    np.testing.assert_array_equal(stack(read(path, output="float16"))[0, 0], hu.astype(np.float16))


def test_multiframe_htj2k_splits_into_the_native_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = np.stack([mono8_pixels(), 255 - mono8_pixels(), mono8_pixels()[::-1]])
    codestreams = [encode_htj2k(frame, HTJ2K_LOSSLESS_RPCL) for frame in frames]
    path = save(as_htj2k(mono8(frames), HTJ2K_LOSSLESS_RPCL, codestreams), tmp_path / "multi.dcm")
    native = save(mono8(frames), tmp_path / "multi-native.dcm")
    samples, decoded, _ = read_spying(path, monkeypatch, *MONO_WINDOWS)
    np.testing.assert_array_equal(decoded[0].reshape(frames.shape), frames)
    assert [s.key for s in samples] == ["s1-f0000", "s1-f0001", "s1-f0002"]
    np.testing.assert_array_equal(stack(samples), stack(read(native, *MONO_WINDOWS)))


# ---------------------------------------------------------------- damaged codestreams


def _damaged_file(tmp_path: Path, name: str, codestream: bytes) -> Path:
    pixels = ct16_pixels()
    return save(as_htj2k(ct_slice(pixels, 16), HTJ2K_LOSSLESS, [codestream]), tmp_path / name)


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_htj2k_codestream_cut_short_is_a_truncated_issue(keep: float, tmp_path: Path) -> None:
    # A frame without its EOC marker is packer's read/truncated (the file was cut), not a crash.
    codestream = encode_htj2k(ct16_pixels(), HTJ2K_LOSSLESS)
    cut = codestream[:int(len(codestream) * keep)]
    assert not ht_markers(cut)["ends_with_eoc"]
    path = _damaged_file(tmp_path, "cut.dcm", cut)
    found = read(path)
    assert isinstance(found, Issue), "a cut HTJ2K codestream must not decode"
    assert (found.stage, found.reason) == ("read", "truncated"), found.message
    assert found.message.startswith("cut.dcm: ") and "cut short (pylibjpeg: " in found.message
    assert "frame 0 lacks its end marker (FFD9); copy the file again" in found.message
    assert found.path == str(path)


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.97])
def test_htj2k_codestream_missing_bytes_is_a_decode_failed_issue(keep: float, tmp_path: Path) -> None:
    # Bytes lost from inside the codestream, the EOC marker still at the end: the frame looks whole,
    # so only the decoder can tell, and packer reports read/decode_failed naming the file and syntax.
    codestream = encode_htj2k(ct16_pixels(), HTJ2K_LOSSLESS)
    damaged = codestream[:int(len(codestream) * keep)] + b"\xff\xd9"
    path = _damaged_file(tmp_path, "damaged.dcm", damaged)
    found = read(path)
    assert isinstance(found, Issue), "an HTJ2K codestream with bytes missing must not decode"
    assert (found.stage, found.reason) == ("read", "decode_failed"), found.message
    assert found.message.startswith("damaged.dcm: pylibjpeg could not decode High-Throughput JPEG 2000")
    assert "RuntimeError" in found.message
    assert found.path == str(path)


def test_htj2k_frame_larger_than_the_header_is_bad_shape_before_decoding(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The decoder allocates what SIZ says; packer compares it with Rows × Columns first.
    pixels = ct16_pixels()
    small = ct_slice(pixels[:32, :24].copy(), 16)
    path = save(as_htj2k(small, HTJ2K, [encode_htj2k(pixels, HTJ2K)]), tmp_path / "liar.dcm")
    called: list[str] = []
    monkeypatch.setattr(reader, "pixel_array", lambda ds, **options: called.append("decoded"))
    found = read(path)
    assert isinstance(found, Issue)
    assert (found.stage, found.reason) == ("validate", "bad_shape"), found.message
    assert "liar.dcm: frame 0's codestream header says 64×48 pixels" in found.message and "32×24" in found.message
    assert called == []
