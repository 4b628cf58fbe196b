"""Damaged NIfTI files: every file ends as samples or exactly one reason-coded bad-sample record.

Small real seeds written by nibabel (:mod:`nifti_files`) go through the pipeline's own path
(``probe_for_read``, ``read_sample``, the per-sample checks), damaged in named ways.
"""

from __future__ import annotations

import gzip
import logging
import os
import signal
import time
import tracemalloc
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from nifti_files import (
    ANTERIOR,
    RIGHT,
    SUPERIOR,
    Form,
    grid,
    header_view,
    phantom_ras,
    voxel_centres,
    write_nifti,
)

from packer.config import JobConfig, load_job
from packer.pipeline.checks import find_sample_issue
from packer.pipeline.probe import probe_for_read
from packer.read import read_sample
from packer.records import Issue, Sample, SampleRef

LONG = os.environ.get("PACKER_FUZZ_LONG") == "1"
EXAMPLES = 20 if LONG else 1
CALL_BUDGET_S = 5.0  # per file; a mutated 10 KB file reads in milliseconds
#: Tight limits, so that a mutated header that now asks for 2 GB is refused by the limits
#: rather than worked through (the limits are what keeps a real build's memory bounded).
LIMITS = {"max_pixels": 1 << 16, "max_frames": 512, "max_decoded_bytes": 1 << 24, "max_voxels": 1 << 20}
SEEN: Counter[tuple[str, str]] = Counter()


class Hang(BaseException):
    """Raised by the timer: a BaseException, so no reader boundary can turn it into an Issue."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang(f"a NIfTI read ran past {CALL_BUDGET_S} s")


def timed(call: Callable[[], Any]) -> Any:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CALL_BUDGET_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------- seeds

GRID = grid("fuzz", RIGHT, ANTERIOR, SUPERIOR, (6.0, 6.0, 9.0))


def phantom() -> np.ndarray:
    return phantom_ras(voxel_centres(GRID.affine, GRID.shape))


@cache
def seeds() -> dict[str, tuple[bytes, int, str]]:
    """name → (file bytes, NIfTI version, header byte order)."""
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"packer-nifti-seeds-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    values, affine = phantom(), GRID.affine
    specs: dict[str, tuple[np.ndarray, dict[str, Any]]] = {
        "float32.nii": (values.astype(np.float32), {}),
        "float32.nii.gz": (values.astype(np.float32), {}),
        "ct_int16.nii.gz": (np.rint(values + 1024).astype(np.int16), {"slope": 1.0, "inter": -1024.0}),
        "scaled_bigendian.nii": (np.rint((values + 1024) * 2).astype(np.int16),
                                 {"slope": 0.5, "inter": -1024.0, "endian": ">"}),
        "qform_only.nii.gz": (values.astype(np.float32), {"form": Form(0, 1)}),
        "float64_nifti2.nii.gz": (values.astype(np.float64), {"version": 2}),
        "uint8_no_forms.nii": ((values > 0).astype(np.uint8) * 40 + 3, {"form": Form(0, 0)}),
        "four_d.nii.gz": (np.stack([values, -values], axis=-1).astype(np.float32), {}),
    }
    out = {}
    for name, (data, options) in specs.items():  # each with a display range, for the "file" window
        path = write_nifti(folder / name, data, affine, fields={"cal_min": -160.0, "cal_max": 240.0}, **options)
        out[name] = (path.read_bytes(), int(options.get("version", 1)), str(options.get("endian", "<")))
        path.unlink()
    folder.rmdir()
    return out


# --------------------------------------------------------------------------------- mutations


def unpacked(name: str) -> tuple[bytearray, bool]:
    data = seeds()[name][0]
    gz = name.endswith(".gz")
    return bytearray(gzip.decompress(data) if gz else data), gz


# ------------------------------------------------------------------------------------ checks

#: transform.nifti settings the fuzzed files go through. No ``spacing``: see the module docstring.
SETTINGS: dict[str, dict[str, Any]] = {
    "slices": {"windows": ["abdomen", {"percentiles": [1, 99]}]},
    "volume": {"windows": ["zscore"], "output": "float16", "sample": {"volume": {"size": [8, 16, 16]}}},
    "stacks": {"windows": [{"percentiles": [0.5, 99.5]}, "file"], "sample": {"neighbors": 1}, "axis": "sagittal",
               "channels_from": "last_axis", "size": [20, 20]},
}
#: How the mutated file enters a case: as its image, as the label map of a good image, or as a
#: good image's second channel (``channel_files``).
ROLES = ("image", "label_map", "channel")
GOOD = "good.nii.gz"


def make_job(folder: Path, setting: str, role: str, limits: dict[str, Any] | None = None) -> JobConfig:
    source: dict[str, Any] = {"kind": "nifti", "root": ".", "label": "none", "table": "cases.csv"}
    if role == "label_map":
        source["mask"] = {"column": "mask", "grid": "resample"}
    if role == "channel":
        source["channel_files"] = ["second"]
    (folder / "cases.csv").write_text("path,entity,mask,second\n")
    doc = {"name": "fuzz", "sources": [source], "split": {"by": "entity", "ratios": {"train": 1.0}},
           "transform": {"nifti": SETTINGS[setting]}, "pack": {"format": "webdataset"}, "output": "out",
           "limits": LIMITS if limits is None else limits}
    job_file = folder / f"job-{setting}-{role}.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    return load_job(job_file)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("nifti-fuzz")
    write_nifti(folder / GOOD, phantom().astype(np.float32), GRID.affine, fields={"cal_min": 0.0, "cal_max": 80.0})
    nibabel_log = logging.getLogger("nibabel")
    level = nibabel_log.level
    nibabel_log.setLevel(logging.CRITICAL)  # thousands of "pixdim should be positive" repairs
    try:
        yield folder
    finally:
        nibabel_log.setLevel(level)
    if os.environ.get("PACKER_FUZZ_REPORT") == "1":
        print("\nNIfTI fuzz outcomes:", dict(sorted(SEEN.items())))


@cache
def job_for(folder: Path, setting: str, role: str) -> JobConfig:
    return make_job(folder, setting, role)


def outcome(folder: Path, name: str, setting: str = "slices", role: str = "image",
            job: JobConfig | None = None) -> list[Sample] | Issue:
    """The file ``folder/name`` through the pixel pass's own steps, in ``role``: its probe, its
    read, and the per-sample checks (the first Issue wins, as in the pipeline)."""
    job = job or job_for(folder, setting, role)
    image = name if role == "image" else GOOD
    extra = (("mask", name),) if role == "label_map" else (("second", name),) if role == "channel" else ()
    ref = SampleRef(sample_id="fz", source=job.sources[0].name, kind="nifti", path=str(folder / image),
                    relpath=image, label="", entity="e", extra=extra)
    probed = probe_for_read(ref, job)
    if isinstance(probed, Issue):
        return probed
    result = read_sample(probed[0], job, state=probed[1])
    if isinstance(result, Issue):
        return result
    for sample in result:
        problem = find_sample_issue(sample, job)
        if problem is not None:
            return problem
    return result


def reason(result: list[Sample] | Issue) -> str:
    return result.reason if isinstance(result, Issue) else "ok"


def write_seed(folder: Path, name: str, data: bytes | None = None) -> str:
    (folder / name).write_bytes(seeds()[name][0] if data is None else data)
    return name


def with_fields(name: str, **fields: Any) -> bytes:
    """Seed ``name`` with header fields set (raw, unchecked), re-compressed where it was."""
    raw, gz = unpacked(name)
    version, endian = seeds()[name][1:]
    view = header_view(raw, version=version, endian=endian)
    for field_name, value in fields.items():
        if isinstance(value, dict):
            for index, element in value.items():
                view[field_name][index] = element
        else:
            view[field_name] = value
    return gzip.compress(bytes(raw), mtime=0) if gz else bytes(raw)


# ------------------------------------------------------------------------------- named inputs


@pytest.mark.parametrize("forms", [Form(0, 1), Form(0, 0)], ids=["qform", "pixdim_only"])
@pytest.mark.parametrize("pixdim", [(0.0, 6.0, 9.0), (6.0, -6.0, 9.0), (6.0, 6.0, float("nan"))])
def test_zero_or_negative_voxel_size_without_sform_is_bad_geometry(fuzz_dir: Path, forms: Form,
                                                                 pixdim: tuple[float, float, float]) -> None:
    """A voxel size of 0, below 0 or NaN where the geometry comes from pixdim (qform, or no
    form): ``bad_geometry``. (nibabel repairs 0 to 1 and -6 to 6 when it loads the header;
    packer must not place the voxels on that invented grid.) With an sform, which places the
    voxels by itself, the same file reads."""
    values = phantom().astype(np.float32)
    for sform, want in ((0, "bad_geometry"), (1, "ok")):
        name = f"pixdim-{sform}-{forms.qform_code}-{pixdim}.nii"
        write_nifti(fuzz_dir / name, values, GRID.affine, form=Form(sform, forms.qform_code),
                    fields={("pixdim", 1): pixdim[0], ("pixdim", 2): pixdim[1], ("pixdim", 3): pixdim[2]})
        assert reason(outcome(fuzz_dir, name)) == want, (sform, pixdim)


def test_a_quaternion_that_is_no_rotation_never_escapes(fuzz_dir: Path) -> None:
    """A qform whose quaternion has b² + c² + d² > 1 (no rotation has it; nibabel's
    ``get_qform`` raises ValueError, which escaped packer's probe and ended the build): beside
    an sform, which places the voxels, it is ignored and the file reads; alone, nibabel cannot
    load the file (its affine would be the qform): ``unreadable``."""
    for seed, want in (("float32.nii.gz", "ok"), ("qform_only.nii.gz", "unreadable")):
        name = write_seed(fuzz_dir, f"quaternion-{seed}", with_fields(seed, quatern_b=3.0))
        assert reason(outcome(fuzz_dir, name)) == want, seed


def test_an_infinite_vox_offset_is_unreadable(fuzz_dir: Path) -> None:
    """``vox_offset = inf`` (nibabel's ``int(vox_offset)`` raises OverflowError inside
    ``nib.load``, which escaped the probe): ``unreadable``."""
    for suffix in (".nii", ".nii.gz"):
        name = write_seed(fuzz_dir, f"offset-inf{suffix}", with_fields(f"float32{suffix}", vox_offset=np.inf))
        assert reason(outcome(fuzz_dir, name)) == "unreadable"


@pytest.mark.parametrize("where", ["crc", "length", "stream"])
def test_a_damaged_gzip_stream_is_decode_failed_not_wrong_voxels(fuzz_dir: Path, where: str) -> None:
    """A ``.nii.gz`` whose CRC-32 or length trailer does not match, or with a bit flipped inside
    its deflate stream that zlib still decodes: ``decode_failed``. (nibabel inflates only up to
    the last voxel and never reaches the trailer: such a file read as wrong voxels, silently.)"""
    data = bytearray(seeds()["float32.nii.gz"][0])
    if where == "stream":  # a flip that still inflates to as many bytes, other ones: only the CRC can tell
        raw = gzip.decompress(bytes(data))
        for at in range(len(data) // 2, len(data) - 8):
            flipped = bytearray(data)
            flipped[at] ^= 0x01
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)  # the bare deflate stream: no CRC to check
            try:
                inflated = inflater.decompress(bytes(flipped[10:-8]))
            except zlib.error:
                continue
            if inflater.eof and len(inflated) == len(raw) and inflated != raw:
                data = flipped
                break
        else:
            pytest.fail("no flipped bit inflates silently")
    else:
        data[-8 if where == "crc" else -4] ^= 0xFF
    name = write_seed(fuzz_dir, f"damaged-{where}.nii.gz", bytes(data))
    assert reason(outcome(fuzz_dir, name)) == "decode_failed"


def test_gzip_members_and_trailing_bytes_read_as_one_stream(fuzz_dir: Path) -> None:
    """The same voxels whether the ``.nii.gz`` is one gzip member, several (bgzip, ``cat a.gz
    b.gz``), or one followed by junk or zero padding (ignored, as gunzip does)."""
    data = seeds()["float32.nii.gz"][0]
    raw = gzip.decompress(data)
    variants = {"one": data, "members": b"".join(gzip.compress(raw[i:i + 1000], mtime=0)
                                                 for i in range(0, len(raw), 1000)),
                "junk": data + b"not gzip at all", "zeros": data + bytes(7)}
    images = []
    for label, variant in variants.items():
        got = outcome(fuzz_dir, write_seed(fuzz_dir, f"stream-{label}.nii.gz", variant))
        assert not isinstance(got, Issue), (label, got)
        images.append(got[0].image)
    for image in images[1:]:
        np.testing.assert_array_equal(image, images[0])


def test_a_tiny_nii_gz_promising_a_huge_volume_is_refused_without_inflating(fuzz_dir: Path) -> None:
    """A 4 KB ``.nii.gz`` whose header promises 2000³ float32 voxels (32 GB, over the default
    limits): ``too_large``; one promising 1000×1000×300 (1.2 GB, within them) cannot hold it
    (DEFLATE inflates at most 1032:1): ``truncated``. Both from the header, in milliseconds and
    without allocating the promised array."""
    default_limits = make_job(fuzz_dir, "slices", "image", limits={})
    for dim, want in (([3, 2000, 2000, 2000, 1, 1, 1, 1], "too_large"), ([3, 1000, 1000, 300, 1, 1, 1, 1],
                                                                         "truncated")):
        name = write_seed(fuzz_dir, f"promise-{dim[1]}.nii.gz", with_fields("float32.nii.gz", dim=dim))
        assert (fuzz_dir / name).stat().st_size < 10_000
        tracemalloc.start()
        started = time.perf_counter()
        try:
            got = outcome(fuzz_dir, name, job=default_limits)
            seconds = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert reason(got) == want
        assert seconds < 0.5, f"{seconds:.2f} s: the stream was inflated"
        assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB allocated for a {dim} promise"
