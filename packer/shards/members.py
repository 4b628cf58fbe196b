"""What one packed sample is made of, and how its pieces decode (tar and Parquet alike).

A tar shard holds, per sample, the members ``<key>.cls`` (the class index as ASCII digits,
only in datasets with a class target), ``<key>.json`` (the sample record), ``<key>.npy``
(``numpy.save`` bytes of the C×H×W pixels), ``<key>.target.npy`` (the multi-label or
numeric target vector, only in datasets with one; :mod:`packer.targets`) and
``<key>.target_mask.npy`` (uint8, 1 per target entry to use, 0 per entry a loss skips; only
in datasets whose target is masked); a Parquet shard
holds the same record, target and pixels as columns of one row.
:func:`parse_member_name` is the one rule for member names: the loader, the HTML report
and ``packer verify --deep`` all refuse what it refuses.

Nothing here unpickles: ``.npy`` bytes go through :func:`load_npy`, which reads packer's
own header form directly and hands anything else to ``np.load(allow_pickle=False)``.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

#: The members packer writes for a sample of a tar shard, in the order it writes them
#: (``cls`` only with a class target, ``mask.npy`` only with masks, ``target.npy`` only with a
#: vector target, ``target_mask.npy`` only with a masked target).
MEMBER_EXTENSIONS = ("cls", "json", "npy", "mask.npy", "target.npy", "target_mask.npy")
#: The members a reader decodes besides the pixels: each a few bytes, read whole.
SMALL_MEMBERS = ("mask.npy", "target.npy", "target_mask.npy")
#: What a sample key may hold: it is a member's name prefix, so never a path.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
#: The names :func:`parse_member_name` accepts, as bytes: groups key and extension (for a
#: reader that matches header bytes without decoding them first).
MEMBER_NAME = re.compile(b"(" + KEY_PATTERN.pattern.encode() + rb")\.("
                         + b"|".join(re.escape(ext.encode()) for ext in MEMBER_EXTENSIONS) + b")")


def parse_member_name(name: str) -> tuple[str, str] | str:
    """``(key, ext)`` of a tar member named ``<key>.<ext>`` (key of ``[A-Za-z0-9_-]``, ext one
    of :data:`MEMBER_EXTENSIONS`), or a message saying why the name is refused.

    A name that looks like a path (``/``, ``\\``, ``..``) is unsafe: a reader that extracted it
    could write outside its folder. Readers stop (or, ``verify``, report) at a refused name.
    """
    if name.startswith("/") or "/" in name or "\\" in name or ".." in name:
        return f"unsafe member name {name!r} (a path, not <key>.<ext>); refuse to extract this shard"
    key, _, ext = name.partition(".")
    if KEY_PATTERN.fullmatch(key) is None or ext not in MEMBER_EXTENSIONS:
        return f"member {name!r} is not <key>.{'|'.join(MEMBER_EXTENSIONS)} with a key of [A-Za-z0-9_-]"
    return key, ext


def irregular_member(name: str) -> str:
    """The message for a member that is not a regular file (a link, folder or device)."""
    return f"member {name!r} is not a regular file (a link, folder or device); refuse to extract this shard"


@dataclass(frozen=True)
class Decoded:
    """One readable sample: ``image`` as stored (C×H×W, native byte order), ``label`` its class
    index (None without a ``.cls`` member or label cell), ``target`` its target vector (None
    without one). Whether those fit the dataset is the reader's check (``Target.problem``).

    ``record``: the sample's JSON record (the ``.json`` member or ``metadata`` cell), only where
    the reader was asked for it (the loader never is).
    """

    key: str
    label: int | None
    image: np.ndarray
    record: str | bytes | None = None
    target: np.ndarray | None = None
    #: The segmentation mask (F×H×W class ids on the image's grid), None without one
    mask: np.ndarray | None = None
    #: The target mask (uint8 (L,), 1: use the target entry, 0: skip it), None without one
    target_mask: np.ndarray | None = None
    #: The sample's checksum (:mod:`packer.shards.checksum`) over the bytes read, where the
    #: reader was asked for it (the loader's ``verify="sample"``), else None
    checksum: int | None = None

    def repeat(self) -> Decoded:
        """The sample again with arrays of its own: a stand-in for a skipped one is handed to a
        transform that may work in place, which must not reach the delivery it repeats."""
        def own(array: np.ndarray | None) -> np.ndarray | None:
            return None if array is None else array.copy()

        return dataclasses.replace(self, image=self.image.copy(), target=own(self.target), mask=own(self.mask),
                                   target_mask=own(self.target_mask))

    @classmethod
    def of(cls, key: str, image: np.ndarray, small: SmallMembers, checksum: int | None = None) -> Decoded:
        """The sample ``key`` with pixels ``image`` and what its small members hold."""
        return cls(key=key, label=small.label, image=image, target=small.target, mask=small.mask,
                   target_mask=small.target_mask, checksum=checksum)


@dataclass(frozen=True)
class SmallMembers:
    """What a sample's members other than its pixels hold (each None where absent): its class
    index (``.cls``), target vector (``.target.npy``), mask (``.mask.npy``) and target mask
    (``.target_mask.npy``)."""

    label: int | None = None
    target: np.ndarray | None = None
    mask: np.ndarray | None = None
    target_mask: np.ndarray | None = None


@dataclass(frozen=True)
class SampleDefect:
    """Why a sample (or, ``bad_shard``, its whole shard) could not be read.

    ``reason``: ``missing_member``, ``truncated``, ``bad_label``, ``undecodable``,
    ``bad_sample`` or ``bad_shard``; ``message`` names the member and what is wrong;
    ``key`` the sample's key where it is known.
    """

    reason: str
    message: str
    key: str | None = None
    #: The sample's checksum over the bytes read, where the reader computed one before it
    #: found the defect (a Parquet row; a tar sample's is computed by the caller), else None
    checksum: int | None = None


# -- .npy ---------------------------------------------------------------------------------
#: The exact header ``numpy.save`` writes for a C-order array of a plain numeric dtype (npy
#: format 1.0), e.g. ``{'descr': '|u1', 'fortran_order': False, 'shape': (2, 256, 256), }``.
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=][uif][1248])', 'fortran_order': False, "
                         rb"'shape': \(((?:\d+, )*\d*|\d+,)\), \} *\n")
_NPY_MAGIC = b"\x93NUMPY\x01\x00"
#: Bytes read at the start of an ``.npy`` member to find its header: numpy pads the magic and
#: header to a multiple of 64 bytes, 128 for packer's C×H×W samples.
NPY_HEAD = 256
#: Parsed npy headers by their bytes: a shard's samples share a handful of shapes, and the
#: regular expression and int parsing cost a third of reading a 256×256 sample's pixels.
_LAYOUTS: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}
_LAYOUTS_KEPT = 256


def npy_layout(head: bytes) -> tuple[np.dtype, tuple[int, ...], int] | None:
    """(dtype, shape, offset of the data) of an ``.npy`` whose first bytes are ``head``, for
    the header form ``numpy.save`` writes for a C-order numeric array (format 1.0); ``None``
    for any other form, or a header that does not end within ``head``."""
    if head[:8] != _NPY_MAGIC or len(head) < 10:
        return None
    start = 10 + int.from_bytes(head[8:10], "little")
    if start > len(head):
        return None
    header = head[10:start]
    layout = _LAYOUTS.get(header)
    if layout is None:
        match = _NPY_HEADER.fullmatch(header)
        if match is None:
            return None
        shape = tuple(int(d) for d in match.group(2).decode().replace(" ", "").split(",") if d)
        layout = np.dtype(match.group(1).decode()), shape, start
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.clear()
        _LAYOUTS[header] = layout
    return layout


@functools.lru_cache(maxsize=64)
def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    """The bytes ``numpy.save`` writes before the data of a C-contiguous ``shape`` × ``dtype``
    array (format 1.0, or 2.0 when the header does not fit 1.0's 16-bit length)."""
    fields = {"descr": npy_format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    buffer = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buffer, fields)
    except ValueError:  # numpy.save moves to format 2.0 when the header outgrows 1.0
        buffer = io.BytesIO()
        npy_format.write_array_header_2_0(buffer, fields)
    return buffer.getvalue()


def npy_size_problem(data_bytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
    """Why ``data_bytes`` of npy data cannot hold ``dtype`` ``shape``, or ``None``."""
    count = math.prod(shape)
    if data_bytes == count * dtype.itemsize:
        return None
    return f"npy data holds {data_bytes} bytes, the header promises {count * dtype.itemsize} for shape {shape} {dtype}"


def load_npy(data: bytes | bytearray | memoryview, *, copy: bool = True) -> np.ndarray:
    """Decode ``.npy`` bytes into an array in native byte order, never unpickling: writable
    (its own copy), or with ``copy`` False a view of ``data`` where its layout allows (writable
    where ``data`` is, as a ``bytearray`` is).

    packer's own shards carry numpy's version-1.0 header for a C-order numeric array; that
    header is matched by one strict regular expression (:func:`npy_layout`) and the data
    copied once (numpy parses headers with ``ast.literal_eval``, which cost more than the rest
    of reading a 256×256 sample). Anything else goes through ``np.load(allow_pickle=False)``.
    Raises ValueError for bytes that are not a valid array.
    """
    # npy_layout keys its cache by the header's bytes: another buffer's header is copied (a long
    # one that does not end within NPY_HEAD bytes goes through np.load)
    layout = npy_layout(data if isinstance(data, bytes) else bytes(data[:NPY_HEAD]))
    if layout is not None:
        dtype, shape, start = layout
        problem = npy_size_problem(len(data) - start, dtype, shape)
        if problem is not None:
            raise ValueError(problem)
        pixels = memoryview(data)[start:]
        image = np.frombuffer(bytearray(pixels) if copy else pixels, dtype=dtype).reshape(shape)
        return image if dtype.isnative else image.astype(dtype.newbyteorder("="))
    try:
        return np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    except ValueError:
        raise
    except Exception as err:  # a damaged header reaches numpy's parser: TokenError, SyntaxError, EOFError, ...
        raise ValueError(f"not a valid .npy array ({type(err).__name__}: {err})") from err


# -- a sample from its members ---------------------------------------------------------------
def decode_label(key: str, data: bytes) -> int | SampleDefect:
    """The label index in a ``.cls`` member, or why it is not one."""
    try:
        return int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return SampleDefect("bad_label", f"{key}.cls holds {data[:20]!r}, not an integer", key)


def record_defect(key: str, data: str | bytes | bytearray | memoryview, where: str) -> SampleDefect | None:
    """Why a sample's JSON record (``where``: ``"<key>.json"`` or ``"the metadata cell"``) is not
    one, or None: it must parse as JSON (UTF-8) to an object. A sender controls these bytes, so
    invalid JSON, another JSON value (a list, a number) and nesting too deep for Python's parser
    (``RecursionError``) are each this sample's ``undecodable`` defect, not an exception."""
    try:
        parsed = json.loads(bytes(data) if isinstance(data, (bytearray, memoryview)) else data)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = "nested too deeply to parse" if isinstance(err, RecursionError) else f"not valid JSON ({err})"
        return SampleDefect("undecodable", f"{where} (the sample's record) is {why}; a record must be a JSON "
                                           "object as packer writes it: rebuild the dataset", key)
    if not isinstance(parsed, dict):
        return SampleDefect("undecodable", f"{where} (the sample's record) is a JSON {type(parsed).__name__}, not "
                                           "an object as packer writes it: rebuild the dataset", key)
    return None


def decode_target(key: str, data: bytes, ext: str = "target.npy") -> np.ndarray | SampleDefect:
    """The target vector in a ``.target.npy`` member (or target mask in a ``.target_mask.npy``
    one, ``ext``), or why it is not one (a 1-D numeric array)."""
    try:
        vector = load_npy(data)
    except (ValueError, OSError, EOFError) as err:
        return SampleDefect("undecodable", f"{key}.{ext}: {err}", key)
    if not isinstance(vector, np.ndarray) or vector.ndim != 1 or vector.dtype.kind not in "uif":
        return SampleDefect("undecodable", f"{key}.{ext} holds no 1-D numeric array", key)
    return vector


def decode_mask_member(key: str, data: bytes) -> np.ndarray | SampleDefect:
    """The mask in a ``.mask.npy`` member, or why it is not one (a 3-D unsigned integer array)."""
    try:
        mask = load_npy(data)
    except (ValueError, OSError, EOFError) as err:
        return SampleDefect("undecodable", f"{key}.mask.npy: {err}", key)
    if not isinstance(mask, np.ndarray) or mask.ndim != 3 or mask.dtype.kind != "u":
        return SampleDefect("undecodable", f"{key}.mask.npy holds no F×H×W unsigned integer array", key)
    return mask


def decode_small_members(key: str, members: Mapping[str, bytes]) -> SmallMembers | SampleDefect:
    """What a sample's ``cls``, ``target.npy``, ``mask.npy`` and ``target_mask.npy`` member
    bytes hold (each None where absent), or the first defect among them."""
    label = decode_label(key, members["cls"]) if "cls" in members else None
    if isinstance(label, SampleDefect):
        return label
    target = decode_target(key, members["target.npy"]) if "target.npy" in members else None
    if isinstance(target, SampleDefect):
        return target
    mask = decode_mask_member(key, members["mask.npy"]) if "mask.npy" in members else None
    if isinstance(mask, SampleDefect):
        return mask
    target_mask = (decode_target(key, members["target_mask.npy"], "target_mask.npy")
                   if "target_mask.npy" in members else None)
    if isinstance(target_mask, SampleDefect):
        return target_mask
    return SmallMembers(label=label, target=target, mask=mask, target_mask=target_mask)


def decode_members(key: str, members: Mapping[str, bytes]) -> Decoded | SampleDefect:
    """The sample ``key`` from its member bytes by extension (``cls``, ``npy``, ``mask.npy``,
    ``target.npy`` and ``target_mask.npy`` are read; ``json`` is the caller's to parse if it
    wants the record). Only ``npy`` must be there."""
    if "npy" not in members:
        return SampleDefect("missing_member", f"no {key}.npy member", key)
    small = decode_small_members(key, members)
    if isinstance(small, SampleDefect):
        return small
    try:
        image = load_npy(members["npy"])
    except (ValueError, OSError, EOFError) as err:
        return SampleDefect("undecodable", f"{key}.npy: {err}", key)
    if not isinstance(image, np.ndarray):
        return SampleDefect("undecodable", f"{key}.npy holds no array", key)
    return Decoded.of(key, image, small)
