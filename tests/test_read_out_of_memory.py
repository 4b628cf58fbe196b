"""Running out of memory while decoding is the machine's condition, never the file's.

A bad sample is data about the file, and it is cached: a MemoryError (or OpenCV's own failed
allocation, ``-4: Insufficient memory``) recorded as ``unexpected_error`` or ``decode_failed``
dropped a good file from this build and, from the cache, from every later one. The read stage's
boundary raises a ResourceError (exit 6) naming the file, the bytes it needs and the fix."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer.config import ImageTransformConfig
from packer.errors import ResourceError
from packer.read import at_boundary
from packer.read import image as image_mod
from packer.read.image import read_image
from packer.records import SampleRef


def _ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="img-001", source="photos", kind="image", path=str(path), relpath=path.name,
                     label="a", entity="E1")


def _big_png(path: Path, width: int, height: int) -> Path:
    """An RGB PNG written row by row (never whole in memory): a few MB on disk."""
    comp = zlib.compressobj(9)
    row = b"\x00" + bytes(range(256)) * (width * 3 // 256) + bytes(width * 3 % 256)
    data = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def test_a_memory_error_inside_a_reader_stops_the_run_naming_the_file() -> None:
    ref = _ref(Path("/raw/big.png"))

    def short_of_memory(progress: object) -> list:
        raise MemoryError("Unable to allocate 1.61 GiB")

    with pytest.raises(ResourceError) as caught:
        at_boundary(ref, short_of_memory, name="/raw/big.png")
    message = str(caught.value)
    assert caught.value.exit_code == 6
    assert "/raw/big.png" in message and "out of memory" in message
    assert "memory limit" in message and "--workers" in message and "limits.max_decoded_bytes" in message


def test_opencvs_insufficient_memory_is_no_decode_failed_bad_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenCV's ``-4: Insufficient memory`` names the bytes the file's pixels need (100×120×3
    uint8 plus the float32 working copies, as limits.max_decoded_bytes counts them)."""
    path = tmp_path / "fine.png"
    cv2.imwrite(str(path), np.zeros((100, 120, 3), np.uint8))

    def no_memory(*args: object) -> None:
        err = cv2.error("OpenCV(5.0) alloc.cpp:73: error: (-4:Insufficient memory) Failed to allocate 36000 bytes")
        err.code = cv2.Error.StsNoMem
        raise err

    monkeypatch.setattr(image_mod.cv2, "imdecode", no_memory)
    with pytest.raises(ResourceError) as caught:
        read_image(_ref(path), ImageTransformConfig())
    message = str(caught.value)
    assert str(path) in message and "Insufficient memory" in message
    assert str(path) in message and "Insufficient memory" in message
    assert f"needs about {100 * 120 * 3 + 100 * 120 * 3 * 4 * 2:,} bytes" in message


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux enforces it")
def test_a_large_image_under_a_low_memory_limit_is_a_resource_error_not_a_bad_sample(tmp_path: Path) -> None:
    """A 12000×12000 RGB PNG (within the default limits) read under a 1.5 GB address-space limit:
    the real decode runs out of memory, and the reader raises, it returns no Issue."""
    big = _big_png(tmp_path / "big.png", 12000, 12000)
    script = textwrap.dedent(f"""
        import resource
        from pathlib import Path
        from packer.config import ImageTransformConfig
        from packer.errors import ResourceError
        from packer.read.image import read_image
        from packer.records import SampleRef
        ref = SampleRef(sample_id="big", source="photos", kind="image", path={str(big)!r}, relpath="big.png",
                        label="a", entity="E1")
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, resource.RLIM_INFINITY))
        try:
            result = read_image(ref, ImageTransformConfig(size=(32, 32)))
        except ResourceError as err:
            print("RESOURCE", err)
        else:
            print("RESULT", type(result).__name__, getattr(result, "reason", ""))
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("RESOURCE"), done.stdout + done.stderr[-2000:]
    assert str(big) in done.stdout and "out of memory" in done.stdout
