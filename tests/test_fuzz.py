"""Fuzz the readers with mutated real files: every mutation ends as samples or a known issue.

Seeds are real files: pydicom's shipped DICOM test files (native, big-endian, deflated, RLE,
JPEG, JPEG-LS, JPEG 2000, palette, multi-frame), CT slices from :func:`packer.demo.write_ct_slice`,
and PNG, JPEG, TIFF and BMP files written by OpenCV. Mutations: bit flips, byte overwrites and
truncation at random offsets (biased towards the header), and header fields set to odd values
(DICOM Rows/Columns/BitsAllocated/NumberOfFrames/..., PNG IHDR size, JPEG SOF size, TIFF size).

For each mutated file, ``probe_*``, ``read_*`` and :func:`packer.read.read_sample` must return a
header / list of Samples / an Issue whose reason is in REASONS, never raise, never hang (each call
runs under a ``signal`` timer; a native hang is caught by ``faulthandler``), and never fall back
to ``unexpected_error``: every crash the fuzzer found became a proper reason in the readers.

One test builds a whole tree of good files and seeded mutants of them (plus the defects a
trial found packed or misnamed) and checks the build's promise: one record per bad file or its
samples, never both; the good files' members byte for byte those of a build without the bad
ones; and ``max_bad_fraction`` failing the build only after the report is written.

The default run is sized for CI (well under 60 s); ``PACKER_FUZZ_LONG=1`` runs 20× the examples
with a random seed. ``PACKER_FUZZ_REPORT=1`` prints the reasons seen at the end.

What it found (each now a proper reason in the readers): pydicom decoding a damaged top-level
element lazily, outside the parse boundary (NotImplementedError for an unknown VR,
BytesLengthException for a bad value length; also raised from the file meta) → ``unreadable``;
the same inside functional-group items (OSError from a cut sequence item) → ``unreadable`` via
``dicom_attrs.element``; a multi-valued or text Rows/Bits Stored (``int(list)``) → ``bad_shape``;
StopIteration from pydicom when fragments run out → ``truncated``/``decode_failed``; a TIFF tag
with a count of 0 (``tags[...][0]`` on an empty tuple) → treated as absent; JPEG headers within
the default limits that take ~10 s to decode (hence the tight ``LIMITS`` below).
"""

from __future__ import annotations

import faulthandler
import io
import json
import os
import random
import signal
import struct
import tarfile
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from functools import cache, partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pydicom
import pytest
from dicom_files import TEST_FILES, ct_dataset, ct_pixels, enhanced_ct_dataset, file_window, lut_item, window
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydicom.datadict import tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_file_meta_info
from pydicom.sequence import Sequence as DicomSequence
from pydicom.tag import Tag
from pydicom.uid import UID, RLELossless

from packer.config import (
    DicomTransformConfig,
    ImageTransformConfig,
    JobConfig,
    LimitsConfig,
    PackConfig,
    SafetyConfig,
    SplitConfig,
)
from packer.demo import write_ct_slice
from packer.read import read_sample
from packer.read.dicom import DicomHeader, probe_dicom, read_dicom
from packer.read.image import ImageHeader, probe_image, read_image
from packer.records import EXCLUSIONS, REASONS, Excluded, Issue, Sample, SampleRef
from packer.where import Condition

pytestmark = pytest.mark.slow  # fuzzing: thousands of mutated files through every reader
LONG = os.environ.get("PACKER_FUZZ_LONG") == "1"
EXAMPLES = 20 if LONG else 1
CALL_BUDGET_S = 5.0  # per reader call; a mutated 40 KB file decodes in milliseconds
HARD_BUDGET_S = 60  # faulthandler kills the run if native code ignores the signal

FUZZ = settings(max_examples=1, deadline=None, derandomize=not LONG, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

SHIPPED_DICOM = ("CT_small.dcm", "MR_small_RLE.dcm", "JPEG2000.dcm", "MR_small_jp2klossless.dcm",
                 "MR_small_jpeg_ls_lossless.dcm", "JPEG-lossy.dcm", "JPGExtended.dcm", "SC_rgb_rle_2frame.dcm",
                 "SC_rgb_jpeg_dcmtk.dcm", "SC_ybr_full_422_uncompressed.dcm", "MR_small_bigendian.dcm",
                 "image_dfl.dcm", "examples_palette.dcm", "rtdose.dcm", "liver_1frame.dcm", "MR_small_padded.dcm")

#: Tight limits keep every mutated header cheap: a JPEG whose SOF now says 32768×4097 is within
#: the default limits and takes ~10 s to decode, which is work, not a hang (65535×64 still took
#: 4 s under load with 4M pixels allowed, hence 1M).
LIMITS = LimitsConfig(max_pixels=1 << 20, max_frames=64, max_decoded_bytes=1 << 26)

SEEN: Counter[tuple[str, str]] = Counter()


class Hang(BaseException):
    """Raised by the timer: a BaseException, so no reader boundary can turn it into an issue."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang(f"a reader call ran past {CALL_BUDGET_S} s")


def timed(call: Callable[[], Any]) -> Any:
    """Run ``call`` under a real-time timer; a hang fails the test instead of stalling CI."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    faulthandler.dump_traceback_later(HARD_BUDGET_S, exit=True)
    signal.setitimer(signal.ITIMER_REAL, CALL_BUDGET_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------- seeds


@cache
def dicom_seeds() -> dict[str, bytes]:
    seeds = {name: (TEST_FILES / name).read_bytes() for name in SHIPPED_DICOM if (TEST_FILES / name).is_file()}
    rng = np.random.default_rng(7)
    hu = rng.normal(40, 300, (3, 24, 20)).astype(np.float32)
    buffer_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    for name, pixels, compress in (("demo_ct.dcm", hu[0], None), ("demo_ct_rle.dcm", hu[0], RLELossless),
                                   ("demo_ct_3frames.dcm", hu, None)):
        path = buffer_dir / f"packer-fuzz-seed-{os.getpid()}-{name}"
        write_ct_slice(path, patient_id="P1", study_date="20240102", pixels_hu=pixels, compress=compress)
        seeds[name] = path.read_bytes()
        path.unlink()
    # Nested attributes the renderer reads per frame: functional groups, Modality and VOI LUTs.
    enhanced = enhanced_ct_dataset(ct_pixels((3, 12, 10)), rescales=[(1.0, -1024.0), None, (2.0, -2048.0)],
                                   windows=[(40.0, 400.0), None, (-600.0, 1500.0)], shared_rescale=(1.0, -1024.0),
                                   shared_window=(50.0, 350.0))
    luts = ct_dataset(ct_pixels((12, 10)), center=None, width=None)
    luts.ModalityLUTSequence = DicomSequence([lut_item(0, 16, list(range(0, 6000, 2)))])
    # first mapped 0: behind the Modality LUT (unsigned output) -1024 would read as 64512, before
    # every value, and render the seed flat (constant_image)
    luts.VOILUTSequence = DicomSequence([lut_item(0, 12, list(range(0, 4096, 4)), "SOFT")])
    del luts.RescaleSlope, luts.RescaleIntercept
    for name, ds in (("enhanced_ct.dcm", enhanced), ("lut_ct.dcm", luts)):
        out = io.BytesIO()
        ds.save_as(out, enforce_file_format=True)
        seeds[name] = out.getvalue()
    return seeds


def _encode(suffix: str, array: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(suffix, array)
    assert ok, suffix
    return encoded.tobytes()


@cache
def image_seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(11)
    rows, cols = np.mgrid[0:24, 0:32]
    bgr = np.dstack([rows * 10, cols * 7, (rows + cols) * 4]).astype(np.uint8)
    return {
        "grey.png": _encode(".png", rng.integers(0, 256, (20, 28), dtype=np.uint8)),
        "deep.png": _encode(".png", rng.integers(0, 65536, (16, 12), dtype=np.uint16)),
        "rgba.png": _encode(".png", np.dstack([bgr, rng.integers(0, 256, (24, 32), dtype=np.uint8)])),
        "photo.jpg": _encode(".jpg", bgr),
        "grey.jpg": _encode(".jpg", bgr[:, :, 0]),
        "photo.tif": _encode(".tiff", bgr),
        "deep.tif": _encode(".tiff", rng.integers(0, 65536, (10, 14), dtype=np.uint16)),
        "photo.bmp": _encode(".bmp", bgr),
    }


# --------------------------------------------------------------------------------- mutations

ODD_U16 = st.sampled_from([0, 1, 2, 3, 7, 8, 12, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 255, 256, 4097, 32768,
                           65535])
ODD_U32 = st.sampled_from([0, 1, 2, 255, 65535, 65536, 100_000, 1 << 24, (1 << 31) - 1, 1 << 31, (1 << 32) - 1])


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """1-4 of: flip one bit, overwrite 1-8 bytes, truncate; offsets biased to the first 2 KiB."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        end = len(out) - 1
        offset = draw(st.one_of(st.integers(0, min(end, 2047)), st.integers(0, end)))
        kind = draw(st.sampled_from(["flip", "overwrite", "truncate"]))
        if kind == "flip":
            out[offset] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            patch = draw(st.one_of(st.binary(min_size=1, max_size=8),
                                   st.sampled_from([b"\xff" * 4, b"\x00" * 4, b"\xff\xd9", b"\xff\xd8\xff",
                                                    b"\xfe\xff\xdd\xe0", b"\xff\xff\xff\xff"])))
            out[offset:offset + len(patch)] = patch
        else:
            del out[offset:]
    return bytes(out)


DICOM_FIELDS: dict[str, tuple[str, st.SearchStrategy[Any]]] = {
    "Rows": ("US", ODD_U16),
    "Columns": ("US", ODD_U16),
    "BitsAllocated": ("US", ODD_U16),
    "BitsStored": ("US", ODD_U16),
    "HighBit": ("US", ODD_U16),
    "SamplesPerPixel": ("US", st.sampled_from([0, 1, 2, 3, 4, 65535])),
    "PixelRepresentation": ("US", st.sampled_from([0, 1, 2, 65535])),
    "PlanarConfiguration": ("US", st.sampled_from([0, 1, 2])),
    "NumberOfFrames": ("IS", st.sampled_from(["0", "1", "2", "3", "-1", "1A", "", " ", "999999", "10001",
                                              "2147483648", "1e3", "1.5"])),
    "PhotometricInterpretation": ("CS", st.sampled_from(["", "MONOCHROME1", "MONOCHROME2", "RGB", "YBR_FULL",
                                                         "YBR_FULL_422", "YBR_RCT", "YBR_ICT", "PALETTE COLOR",
                                                         "HSV", "monochrome2", "ARGB"])),
    "RescaleSlope": ("DS", st.sampled_from(["0", "-1", "1e308", "nan", "inf", "abc", ""])),
    "RescaleIntercept": ("DS", st.sampled_from(["-1e308", "nan", "1e400", "x", ""])),
    "WindowCenter": ("DS", st.sampled_from(["nan", "1e308", "", "40\\-600\\x"])),
    "WindowWidth": ("DS", st.sampled_from(["0", "-5", "nan", "0.5", "", "1e-300"])),
    "PixelPaddingValue": ("US", ODD_U16),
    "BurnedInAnnotation": ("CS", st.sampled_from(["YES", "NO", "yes ", ""])),
    "PixelSpacing": ("DS", st.sampled_from(["0\\0", "-1\\1", "1e-300\\1e-300", "nan\\1", "1", "1000\\1000",
                                            "1e300\\1e300"])),
}
#: Sequences the renderer reads items of (functional groups, LUTs): a damaged export may write one
#: with another VR, and it reads back as bytes whose "items" are ints (that crashed the probe, and
#: with it the whole build, until the readers checked for items: the seeds above hold each one).
DICOM_SEQUENCES = ["PerFrameFunctionalGroupsSequence", "SharedFunctionalGroupsSequence", "ModalityLUTSequence",
                   "VOILUTSequence"]
TRANSFER_SYNTAXES = ["1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.1.99", "1.2.840.10008.1.2.2",
                     "1.2.840.10008.1.2.5", "1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51",
                     "1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.4.80",
                     "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91", "1.2.840.10008.1.2.4.201", "1.2.3.4"]


@st.composite
def dicom_header_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """Set 1-3 Image Pixel / intensity fields or the transfer syntax to odd values (or a wrong VR
    and random bytes) and re-save.

    Values go in as raw element bytes, so pydicom writes them as they are, even where it would
    refuse to build them ('1A' for an IS, 'x' for a DS), just as a broken writer would.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(io.BytesIO(data))
        implicit, little = (bool(flag) for flag in ds.original_encoding)
        keywords = draw(st.lists(st.sampled_from([*DICOM_FIELDS, *DICOM_SEQUENCES, "TransferSyntaxUID"]),
                                 min_size=1, max_size=3, unique=True))
        for keyword in keywords:
            if keyword == "TransferSyntaxUID":
                continue  # set in the file meta after writing, so pydicom cannot object
            if keyword in DICOM_SEQUENCES and keyword not in ds:
                continue  # only a sequence the seed holds: its readers are what is fuzzed
            vr, values = DICOM_FIELDS.get(keyword, ("SQ", st.nothing()))
            if vr == "SQ" or draw(st.integers(0, 3)) == 0:  # a wrong VR or value length, as after a flipped byte
                vr = draw(st.sampled_from(["UT", "SS", "UL", "OB", "FD", "DS", "CS", "SQ", "UN", "AT", "US"]))
                raw = draw(st.binary(max_size=12))
            elif vr == "US":
                raw = struct.pack(("<" if little else ">") + "H", draw(values))
            else:
                raw = draw(values).encode("ascii")
                raw += b" " * (len(raw) % 2)
            tag = Tag(tag_for_keyword(keyword) or 0)
            ds._dict[tag] = RawDataElement(tag, None if implicit else vr, len(raw), raw, 0, implicit, little)
        out = io.BytesIO()
        try:
            ds.save_as(out)
        except (ValueError, TypeError, struct.error, OverflowError, AttributeError, KeyError, NotImplementedError):
            return data  # this combination cannot even be written; fuzz the original instead
    if "TransferSyntaxUID" in keywords:
        return with_transfer_syntax(out.getvalue(), draw(st.sampled_from(TRANSFER_SYNTAXES)))
    return out.getvalue()


def with_transfer_syntax(data: bytes, syntax: str) -> bytes:
    """The same data set under a file meta that names another transfer syntax (the data set bytes
    are not re-encoded: a native file may now claim JPEG, a deflated one claim Explicit VR)."""
    if data[132:138] != b"\x02\x00\x00\x00UL":
        return data  # no (0002,0000) File Meta Information Group Length to find the data set by
    group_length = struct.unpack_from("<I", data, 140)[0]
    dataset = data[144 + group_length:]
    meta = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).file_meta
    meta.TransferSyntaxUID = UID(syntax)
    buffer = DicomBytesIO()
    buffer.is_little_endian, buffer.is_implicit_VR = True, False
    write_file_meta_info(buffer, meta, enforce_standard=True)
    return data[:132] + buffer.getvalue() + dataset


def _png_ihdr(data: bytes, draw: st.DrawFn) -> bytes:
    out = bytearray(data)
    if len(out) < 33:
        return data
    struct.pack_into(">II", out, 16, draw(ODD_U32), draw(ODD_U32))
    if draw(st.booleans()):
        out[24] = draw(st.sampled_from([0, 1, 2, 4, 8, 16, 32]))  # bit depth
        out[25] = draw(st.sampled_from([0, 1, 2, 3, 4, 6, 7]))  # colour type
    if draw(st.booleans()):  # a correct CRC gets past libpng's check to the size itself
        struct.pack_into(">I", out, 29, zlib.crc32(bytes(out[12:29])))
    return bytes(out)


def _jpeg_sof(data: bytes, draw: st.DrawFn) -> bytes:
    out = bytearray(data)
    for marker in (b"\xff\xc0", b"\xff\xc2", b"\xff\xc1"):
        at = out.find(marker)
        if at >= 0 and at + 10 <= len(out):
            struct.pack_into(">HH", out, at + 5, draw(ODD_U16), draw(ODD_U16))
            if draw(st.booleans()):
                out[at + 4] = draw(st.sampled_from([0, 1, 8, 12, 16, 255]))  # precision
                out[at + 9] = draw(st.sampled_from([0, 1, 2, 3, 4, 255]))  # components
            break
    return bytes(out)


def _tiff_size(data: bytes, draw: st.DrawFn) -> bytes:
    out = bytearray(data)
    if len(out) < 8:
        return data
    order = "<" if out[:2] == b"II" else ">"
    ifd = struct.unpack_from(order + "I", out, 4)[0]
    if ifd + 2 > len(out):
        return data
    count = struct.unpack_from(order + "H", out, ifd)[0]
    wanted = {256, 257, 258, 277, 278, 322, 323, 273, 279}
    for i in range(count):
        at = ifd + 2 + 12 * i
        if at + 12 > len(out):
            break
        tag, kind = struct.unpack_from(order + "HH", out, at)
        if tag in wanted and draw(st.booleans()):
            if kind == 3:
                struct.pack_into(order + "H", out, at + 8, draw(ODD_U16))
            elif kind == 4:
                struct.pack_into(order + "I", out, at + 8, draw(ODD_U32))
    return bytes(out)


def _bmp_size(data: bytes, draw: st.DrawFn) -> bytes:
    out = bytearray(data)
    if len(out) >= 30:
        struct.pack_into("<iiHH", out, 18, draw(st.sampled_from([0, 1, -1, 65535, 100_000, -(1 << 31)])),
                         draw(st.sampled_from([0, 1, -24, 65535, 100_000, (1 << 31) - 1])), 1,
                         draw(st.sampled_from([0, 1, 4, 8, 16, 24, 32, 64])))
    return bytes(out)


@st.composite
def image_header_mutations(draw: st.DrawFn, name: str, data: bytes) -> bytes:
    edit = {"png": _png_ihdr, "jpg": _jpeg_sof, "tif": _tiff_size, "bmp": _bmp_size}[name.rsplit(".", 1)[1]]
    return edit(data, draw)


# ----------------------------------------------------------------------------------- configs

DICOM_CONFIGS = (
    DicomTransformConfig(windows=(file_window(),), fallback_window=window(40, 400)),
    DicomTransformConfig(windows=(window(40, 400), window(-600, 1500, "LINEAR_EXACT")), size=(12, 16),
                         resize="fit", frames="stack"),
    DicomTransformConfig(windows=(file_window(1), window(50, 350, "SIGMOID")), fallback_window=window(40, 80),
                         spacing=(0.9, 1.3), output="uint16"),
    DicomTransformConfig(windows=(), output="float16", size=(10, 10), resize="crop"),
)
IMAGE_CONFIGS = (
    ImageTransformConfig(),
    ImageTransformConfig(size=(20, 12), resize="crop", color="gray", alpha="composite"),
    ImageTransformConfig(window=(("percentiles", (1.0, 99.0)),), tile_size=(8, 8), tile_stride=(5, 7)),
    ImageTransformConfig(window=(("center", 30000.0), ("width", 20000.0)), size=(9, 9), resize="fit"),
)


#: A header ``where:`` asking for every SOP class: the seeds include secondary captures and an RT
#: Dose, which an image job packs only when a condition names them (``packer.read.dicom_objects``:
#: ``.`` alone finds every class and names none), so the pattern writes both out
ASK_ALL = (Condition("SOPClassUID", "match", ("Secondary Capture|RT Dose|.",)),)


def job_for(dicom: DicomTransformConfig, image: ImageTransformConfig) -> JobConfig:
    return JobConfig(name="fuzz", sources=(), split=SplitConfig(by="entity", ratios=(("train", 1.0),), seed=0),
                     transforms=(("dicom", dicom), ("image", image)), pack=PackConfig(format="webdataset"),
                     output=Path("out"),
                     limits=LIMITS, safety=SafetyConfig(burned_in_annotation="allow"))


# ------------------------------------------------------------------------------------ checks


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)  # thousands of expected decode errors
    try:
        yield tmp_path_factory.mktemp("fuzz")
    finally:
        cv2.utils.logging.setLogLevel(level)
    if os.environ.get("PACKER_FUZZ_REPORT") == "1":
        print("\nfuzz reasons:", dict(sorted(SEEN.items())))


def check_outcome(what: str, result: Any, header_type: type | None = None) -> None:
    """A header (probes), a non-empty list of well-formed Samples (reads), or a known Issue."""
    if isinstance(result, Issue):
        SEEN[(what, result.reason)] += 1
        assert result.reason in REASONS
        assert result.reason != "unexpected_error", f"{what} fell back to unexpected_error: {result.message}"
        assert result.message
        return
    if isinstance(result, Excluded):  # an object an image job leaves out on purpose (a mutated SOP class)
        SEEN[(what, result.why)] += 1
        assert result.why in EXCLUSIONS and result.detail
        return
    if header_type is not None:
        assert isinstance(result, header_type), f"{what} returned {type(result).__name__}"
        SEEN[(what, "ok")] += 1
        return
    assert isinstance(result, list) and result, f"{what} returned {result!r}"
    for sample in result:
        assert isinstance(sample, Sample)
        assert sample.image.ndim == 3 and min(sample.image.shape) >= 1
        assert sample.image.dtype in (np.uint8, np.uint16, np.float16)
        assert sample.image.flags.c_contiguous
    SEEN[(what, "ok")] += 1


def run_dicom(path: Path, data: bytes, cfg_index: int) -> None:
    path.write_bytes(data)
    ref = SampleRef(sample_id="fz", source="fuzz", kind="dicom", path=str(path), relpath=path.name)
    cfg = DICOM_CONFIGS[cfg_index]
    check_outcome("probe_dicom", timed(lambda: probe_dicom(ref, entity_keyword="PatientID", limits=LIMITS,
                                                           time_keywords=("StudyDate", "StudyTime"))), DicomHeader)
    check_outcome("read_dicom", timed(lambda: read_dicom(ref, cfg, limits=LIMITS, allow_burned_in=True)))
    check_outcome("read_sample", timed(lambda: read_sample(ref, job_for(cfg, IMAGE_CONFIGS[0]))))


def run_image(path: Path, data: bytes, cfg_index: int) -> None:
    path.write_bytes(data)
    ref = SampleRef(sample_id="fz", source="fuzz", kind="image", path=str(path), relpath=path.name)
    cfg = IMAGE_CONFIGS[cfg_index]
    check_outcome("probe_image", timed(lambda: probe_image(ref, limits=LIMITS)), ImageHeader)
    check_outcome("read_image", timed(lambda: read_image(ref, cfg, limits=LIMITS)))
    check_outcome("read_sample", timed(lambda: read_sample(ref, job_for(DICOM_CONFIGS[0], cfg))))


@st.composite
def mutated_dicom(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = dicom_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    return name, draw(byte_mutations(seeds[name]))


@st.composite
def header_mutated_dicom(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = dicom_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    data = draw(dicom_header_mutations(seeds[name]))
    if draw(st.integers(0, 3)) == 0:
        data = draw(byte_mutations(data))
    return name, data


@st.composite
def mutated_image(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = image_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    return name, draw(byte_mutations(seeds[name]))


@st.composite
def header_mutated_image(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = image_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    data = draw(image_header_mutations(name, seeds[name]))
    if draw(st.integers(0, 3)) == 0:
        data = draw(byte_mutations(data))
    return name, data


CONFIG_INDEX = st.integers(0, 3)


@settings(FUZZ, max_examples=600 * EXAMPLES)
@given(case=mutated_dicom(), cfg_index=CONFIG_INDEX)
def test_fuzz_dicom_bytes(fuzz_dir: Path, case: tuple[str, bytes], cfg_index: int) -> None:
    run_dicom(fuzz_dir / case[0], case[1], cfg_index)


@settings(FUZZ, max_examples=600 * EXAMPLES)
@given(case=header_mutated_dicom(), cfg_index=CONFIG_INDEX)
def test_fuzz_dicom_header_fields(fuzz_dir: Path, case: tuple[str, bytes], cfg_index: int) -> None:
    run_dicom(fuzz_dir / case[0], case[1], cfg_index)


@settings(FUZZ, max_examples=600 * EXAMPLES)
@given(case=mutated_image(), cfg_index=CONFIG_INDEX)
def test_fuzz_image_bytes(fuzz_dir: Path, case: tuple[str, bytes], cfg_index: int) -> None:
    run_image(fuzz_dir / case[0], case[1], cfg_index)


@settings(FUZZ, max_examples=600 * EXAMPLES)
@given(case=header_mutated_image(), cfg_index=CONFIG_INDEX)
def test_fuzz_image_header_fields(fuzz_dir: Path, case: tuple[str, bytes], cfg_index: int) -> None:
    run_image(fuzz_dir / case[0], case[1], cfg_index)


def test_unmutated_seeds_read_cleanly(fuzz_dir: Path) -> None:
    """The seeds themselves probe and read to samples (under the tight fuzz limits), except
    pydicom's JPEG-lossy.dcm, whose codestream libjpeg rejects (a misplaced marker segment)."""
    cfg = DICOM_CONFIGS[0]
    for name, data in sorted(dicom_seeds().items()):
        path = fuzz_dir / name
        path.write_bytes(data)
        ref = SampleRef(sample_id="seed", source="fuzz", kind="dicom", path=str(path), relpath=name)
        header = timed(partial(probe_dicom, ref, entity_keyword="PatientID", time_keywords=(), limits=LIMITS,
                               where=ASK_ALL))
        if isinstance(header, Excluded):  # a segmentation seed: no image to pack, never a bad sample
            assert (header.why, header.modality) == ("not_image", "SEG"), (name, header)
            continue
        assert isinstance(header, DicomHeader), name
        result = timed(partial(read_dicom, ref, cfg, limits=LIMITS, allow_burned_in=True))
        expected = "decode_failed" if name == "JPEG-lossy.dcm" else "ok"
        assert (result.reason if isinstance(result, Issue) else "ok") == expected, (name, result)
    for name, data in sorted(image_seeds().items()):
        path = fuzz_dir / name
        path.write_bytes(data)
        ref = SampleRef(sample_id="seed", source="fuzz", kind="image", path=str(path), relpath=name)
        assert isinstance(timed(partial(probe_image, ref, limits=LIMITS)), ImageHeader), name
        assert isinstance(timed(partial(read_image, ref, IMAGE_CONFIGS[0], limits=LIMITS)), list), name


def test_timer_catches_a_hang() -> None:
    """The per-call budget works: a call that sleeps past it fails instead of stalling CI."""
    import time

    global CALL_BUDGET_S
    saved, CALL_BUDGET_S = CALL_BUDGET_S, 0.05
    try:
        with pytest.raises(Hang):
            timed(lambda: time.sleep(2))
    finally:
        CALL_BUDGET_S = saved


# ------------------------------------------------------------------------- a whole build

def _mutant(data: bytes, rng: random.Random) -> bytes:
    """1-3 seeded byte mutations of ``data`` (flip a bit, overwrite 1-4 bytes, cut), biased to
    the first 1 KiB where the headers are: the build-level twin of :func:`byte_mutations`."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        offset = rng.randrange(min(len(out), 1024)) if rng.random() < 0.7 else rng.randrange(len(out))
        kind = rng.choice(["flip", "overwrite", "cut"])
        if kind == "flip":
            out[offset] ^= 1 << rng.randrange(8)
        elif kind == "overwrite":
            out[offset:offset + 4] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        else:
            del out[max(offset, 1):]
        if len(out) < 2:
            break
    return bytes(out)


def _mixed_tree(raw: Path, *, bad: bool) -> dict[str, str | None]:
    """Good CT slices and PNG/JPEG photos under ``raw/ct`` and ``raw/photos``; with ``bad``, also
    seeded mutants of them and the defects a trial found packed or misnamed. Returns
    {source/relpath: the reason it must get, or None for a mutant (any outcome but a crash)}."""
    (raw / "ct").mkdir(parents=True)
    (raw / "photos").mkdir()
    rng = np.random.default_rng(5)
    good: dict[str, str | None] = {}
    for i in range(4):
        write_ct_slice(raw / "ct" / f"good{i}.dcm", patient_id=f"P{i}", study_date="20240102",
                       pixels_hu=rng.normal(0, 300, (16, 16)), WindowCenter=40, WindowWidth=400)
        good[f"ct/good{i}.dcm"] = "packed"
    for i in range(3):
        (raw / "photos" / f"good{i}.png").write_bytes(_encode(".png", rng.integers(0, 256, (12, 14, 3), np.uint8)))
        good[f"photos/good{i}.png"] = "packed"
    (raw / "photos" / "good.jpg").write_bytes(_encode(".jpg", rng.integers(0, 256, (12, 14, 3), np.uint8)))
    good["photos/good.jpg"] = "packed"
    if not bad:
        return good
    expected: dict[str, str | None] = dict(good)
    mutate = random.Random(11)
    for i in range(16):
        name = sorted(good)[i % len(good)]
        folder, stem = name.split("/")
        target = f"{folder}/m{i}-{stem}"
        (raw / target).write_bytes(_mutant((raw / name).read_bytes(), mutate))
        expected[target] = None
    ct = (raw / "ct" / "good0.dcm").read_bytes()
    (raw / "ct" / "jpeg2000_label.dcm").write_bytes(with_transfer_syntax(ct, "1.2.840.10008.1.2.4.90"))
    expected["ct/jpeg2000_label.dcm"] = "decode_failed"
    for name, overrides in (("wide.dcm", {"WindowWidth": 1e30}), ("intercept.dcm", {"RescaleIntercept": 1e20})):
        write_ct_slice(raw / "ct" / name, patient_id="PX", study_date="20240102",
                       pixels_hu=rng.normal(0, 300, (16, 16)), WindowCenter=40, **{"WindowWidth": 400, **overrides})
        expected[f"ct/{name}"] = "constant_image"
    png = (raw / "photos" / "good0.png").read_bytes()
    (raw / "photos" / "soi.jpg").write_bytes(b"\xff\xd8")
    (raw / "photos" / "iend.png").write_bytes(png[:-2])
    expected.update({"photos/soi.jpg": "truncated", "photos/iend.png": "truncated"})
    return expected


def _build_mixed(folder: Path, raw: Path, max_bad: float) -> Path:
    from packer.config import load_job
    from packer.pipeline.build import BuildOptions, build, check_bad_fraction

    doc = {"name": "mixed", "sources": [{"kind": "dicom", "root": str(raw / "ct"), "label": "none"},
                                        {"kind": "image", "root": str(raw / "photos"), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
           "transform": {"channels": 1, "dicom": {"windows": ["file"], "size": [16, 16]},
                         "image": {"size": [16, 16], "color": "gray"}},
           "pack": {"format": "webdataset"}, "output": str(folder / "out"), "phi": {"mode": "keep"},
           "validate": {"max_bad_fraction": max_bad}}
    job_file = folder / "job.yaml"
    job_file.parent.mkdir(parents=True, exist_ok=True)
    job_file.write_text(json.dumps(doc))
    result = build(load_job(job_file), BuildOptions(scheduler="sync", quiet=True, html_report=False, fresh=True,
                                                    work_dir=folder / "work"))
    check_bad_fraction(result)  # exit 3, as the CLI and packer.api do after the build
    return Path(result.version_dir)


def _packed(version: Path) -> dict[str, bytes]:
    out = {}
    for shard in sorted(version.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member)
                assert handle is not None
                out[member.name] = handle.read()
    return out


def test_a_mixed_tree_gives_one_record_per_bad_file_and_leaves_the_good_samples_as_they_were(tmp_path: Path) -> None:
    """End to end over DICOM and images: every raw file is packed or exactly one bad-sample
    record (the named defects under their reasons, each message naming its file), never both,
    never neither; the good files' members (pixels and records) are byte for byte what a build
    of the good files alone packs; and over the threshold the build fails (exit 3) only after
    bad_samples.jsonl holds every record."""
    from packer.config import PhiConfig
    from packer.errors import BadFractionError
    from packer.keys import parse_key
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import make_sample_id

    _mixed_tree(tmp_path / "raw-good", bad=False)
    alone = _packed(_build_mixed(tmp_path / "alone", tmp_path / "raw-good", 1.0))
    expected = _mixed_tree(tmp_path / "raw", bad=True)
    version = _build_mixed(tmp_path / "mixed", tmp_path / "raw", 1.0)
    mixed = _packed(version)
    bad = [json.loads(line) for line in (version / "bad_samples.jsonl").read_text().splitlines()]
    phi = pseudonymizer_for(PhiConfig(mode="keep"))
    ids = {make_sample_id(name.split("/")[0], name.split("/", 1)[1], phi): name for name in expected}
    rows = Counter(ids[row["sample_id"]] for row in bad)
    packed = {ids[parse_key(member.split(".")[0]).file_id] for member in mixed}
    for name, want in expected.items():
        assert rows[name] + (name in packed) == 1, (name, rows[name], name in packed)
        if want == "packed":
            assert name in packed, name
        elif want is not None:
            [row] = [row for row in bad if ids[row["sample_id"]] == name]
            assert row["reason"] == want, row
    mutants = [name for name, want in expected.items() if want is None]
    assert 0 < sum(rows[name] for name in mutants) < len(mutants)  # the seeded mutants both pack and fail
    for row in bad:
        assert Path(ids[row["sample_id"]]).name in row["message"] and row["reason"] in REASONS, row
        assert row["reason"] != "unexpected_error", row
    assert alone and all(mixed.get(member) == data for member, data in alone.items())
    with pytest.raises(BadFractionError) as failed:
        _build_mixed(tmp_path / "strict", tmp_path / "raw", 0.05)
    strict = Path(failed.value.version_dir)
    assert sorted((version / "bad_samples.jsonl").read_text().splitlines()) == sorted(
        (strict / "bad_samples.jsonl").read_text().splitlines())
