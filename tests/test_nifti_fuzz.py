"""Damaged NIfTI files: every file ends as samples or exactly one reason-coded bad-sample record.

Seeds are small real files written by nibabel (:mod:`nifti_files`): float32, float64 NIfTI-2,
CT as int16 + ``scl_inter``, big-endian scaled int16, uint8 with neither form, qform-only, a 4-D
file, as ``.nii`` and ``.nii.gz``. Mutations: header fields set to odd values (``dim``,
``datatype``, ``bitpix``, ``pixdim``, ``vox_offset``, the scaling, the forms' codes and values,
``magic``, ``sizeof_hdr``), random bytes (biased to the 348/540-byte header), and the gzip
stream itself (cut short, bytes flipped, junk appended, the CRC broken). Each file goes through
the pipeline's own path (``probe_for_read``, ``read_sample``, the per-sample checks) as an
image, as a label map of a good image, and as a case's second channel, under several
``transform.nifti`` settings, and must come out as well-formed samples or one Issue whose reason
is in ``REASONS``, never ``unexpected_error``, never an exception, within a time budget.

The named bad inputs are pinned first (fast); the hypothesis runs are ``slow`` (``make test``),
sized for CI; ``PACKER_FUZZ_LONG=1`` runs 20× the examples with a random seed.

What it found (each now fixed in ``packer/read/nifti.py`` and pinned below): zero or negative
``pixdim`` that nibabel silently repaired to a 1 mm grid (``bad_geometry``); a qform quaternion
that is no rotation beside a valid sform (ValueError raised in the probe: the whole build
failed; now the sform is used) and an infinite ``vox_offset`` (OverflowError, likewise; now
``unreadable``); a ``.nii.gz`` of a few KB
whose header promises a gigabyte within the limits, which nibabel allocated and inflated
(``truncated``, from the header); a bit flipped inside a ``.nii.gz``'s deflate stream, read as
wrong voxels because nibabel never reaches the gzip CRC (``decode_failed``). Still open, and
so kept out of the fuzzed settings: a header whose voxel size, resampled to
``transform.nifti`` ``spacing``, asks for an absurd grid
(:func:`test_resampling_to_an_absurd_grid_is_too_large`, a bug in ``nifti_kind.py``).
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
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nifti_files import (
    ANTERIOR,
    RIGHT,
    SUPERIOR,
    Form,
    build_nifti,
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
from packer.records import REASONS, Issue, Sample, SampleRef

LONG = os.environ.get("PACKER_FUZZ_LONG") == "1"
EXAMPLES = 20 if LONG else 1
CALL_BUDGET_S = 5.0  # per file; a mutated 10 KB file reads in milliseconds
FUZZ = settings(max_examples=1, deadline=None, derandomize=not LONG, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
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

ODD_NUMBERS = [0, 1, -1, 2, 3, 7, 8, 16, 255, 256, 32767, -32768, 65535, 2**31 - 1, 2**31, 0.5, 1e-30, 1e30, -1e30,
               float("nan"), float("inf"), float("-inf")]
DATATYPES = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2304, 7, 99]
FIELDS = ["dim", "datatype", "bitpix", "pixdim", "vox_offset", "scl_slope", "scl_inter", "qform_code", "sform_code",
          "quatern_b", "quatern_c", "quatern_d", "qoffset_x", "srow_x", "srow_y", "srow_z", "magic", "sizeof_hdr",
          "cal_min", "cal_max", "intent_code"]


def unpacked(name: str) -> tuple[bytearray, bool]:
    data = seeds()[name][0]
    gz = name.endswith(".gz")
    return bytearray(gzip.decompress(data) if gz else data), gz


@st.composite
def header_field_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    """A seed with 1-3 header fields set to odd values (one element of an array field)."""
    name = draw(st.sampled_from(sorted(seeds())))
    raw, gz = unpacked(name)
    version, endian = seeds()[name][1:]
    view = header_view(raw, version=version, endian=endian)
    for field_name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True)):
        kind = view.dtype.fields[field_name][0]
        with np.errstate(all="ignore"):
            if field_name == "magic":
                view[field_name] = draw(st.sampled_from([b"n+1\0", b"ni1\0", b"n+2\0", b"xxxx", b"\0\0\0\0"]))
            elif kind.shape:
                index = draw(st.integers(0, kind.shape[0] - 1))
                view[field_name][index] = np.array(draw(st.sampled_from(ODD_NUMBERS))).astype(kind.base,
                                                                                              casting="unsafe")
            else:
                value = draw(st.sampled_from(DATATYPES if field_name == "datatype" else ODD_NUMBERS))
                view[field_name] = np.array(value).astype(kind, casting="unsafe")
    out = bytes(raw)
    return name, gzip.compress(out, mtime=0) if gz else out


@st.composite
def byte_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    """A seed (inflated) with 1-4 of: a bit flipped, 1-8 bytes overwritten, the end cut off;
    offsets biased to the header; re-compressed where the seed was."""
    name = draw(st.sampled_from(sorted(seeds())))
    raw, gz = unpacked(name)
    for _ in range(draw(st.integers(1, 4))):
        if not raw:
            break
        end = len(raw) - 1
        offset = draw(st.one_of(st.integers(0, min(end, 560)), st.integers(0, end)))
        kind = draw(st.sampled_from(["flip", "overwrite", "overwrite", "truncate"]))
        if kind == "flip":
            raw[offset] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            patch = draw(st.binary(min_size=1, max_size=8))
            raw[offset:offset + len(patch)] = patch
        else:
            del raw[offset:]
    out = bytes(raw)
    return name, gzip.compress(out, mtime=0) if gz else out


@st.composite
def gzip_mutations(draw: st.DrawFn) -> tuple[str, bytes]:
    """A ``.nii.gz`` seed's compressed bytes cut short, with bytes flipped, with junk appended,
    or with its CRC or length trailer broken."""
    name = draw(st.sampled_from(sorted(n for n in seeds() if n.endswith(".gz"))))
    data = bytearray(seeds()[name][0])
    kind = draw(st.sampled_from(["truncate", "flip", "junk", "trailer"]))
    if kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "junk":
        data += draw(st.binary(min_size=1, max_size=64))
    else:
        at = len(data) - draw(st.integers(1, 8))
        data[at] ^= 0xFF
    return name, bytes(data)


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


def check_outcome(what: str, result: Any) -> None:
    """A non-empty list of well-formed Samples, or an Issue with a known reason (never
    ``unexpected_error``: a defect of the file must have a name)."""
    if isinstance(result, Issue):
        SEEN[(what, result.reason)] += 1
        assert result.reason in REASONS
        assert result.reason != "unexpected_error", f"{what} fell back to unexpected_error: {result.message}"
        assert result.message
        return
    assert isinstance(result, list) and result, f"{what} returned {result!r}"
    for sample in result:
        assert isinstance(sample, Sample)
        assert sample.image.ndim in (3, 4) and min(sample.image.shape) >= 1
        assert sample.image.dtype in (np.uint8, np.uint16, np.float16) and sample.image.flags.c_contiguous
        assert np.isfinite(sample.image.astype(np.float32)).all()
    SEEN[(what, "ok")] += 1


def run_mutated(folder: Path, case: tuple[str, bytes], setting: str, role: str) -> None:
    name, data = case
    path = folder / f"mutated-{name}"
    path.write_bytes(data)
    check_outcome(f"{role}/{setting}", timed(lambda: outcome(folder, path.name, setting, role)))


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


def test_unmutated_seeds_read_cleanly(fuzz_dir: Path) -> None:
    """Every seed, in every role and setting, becomes samples (the 4-D seed only where
    ``channels_from: last_axis`` makes its volumes channels, and not as a label map)."""
    for name in sorted(seeds()):
        write_seed(fuzz_dir, name)
        for setting in SETTINGS:
            for role in ROLES:
                got = reason(timed(partial(outcome, fuzz_dir, name, setting, role)))
                if role == "label_map":  # class ids: only the uint8 seed's are; a 4-D file is no label map
                    want = {"uint8_no_forms.nii": "ok", "four_d.nii.gz": "mask_unreadable"}.get(name, "mask_values")
                elif name == "four_d.nii.gz" and setting != "stacks":
                    want = "unsupported_dimensions"
                else:
                    want = "ok"
                assert got == want, (name, setting, role)


@pytest.mark.parametrize("cut", [0.002, 0.02, 0.1, 0.5, 0.99])
def test_a_cut_nii_gz_is_truncated(fuzz_dir: Path, cut: float) -> None:
    """A ``.nii.gz`` cut short, after its header or inside it: ``truncated`` (a cut inside the
    header left nibabel no header to tell the file type by, which read as ``unreadable``, "not a
    NIfTI file"; the gzip stream's own end tells)."""
    data = seeds()["float32.nii.gz"][0]
    name = write_seed(fuzz_dir, f"cut-{cut}.nii.gz", data[: max(3, int(len(data) * cut))])
    assert reason(outcome(fuzz_dir, name)) == "truncated"


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("offset", [0, 100, 348, 356, 1000, 10**6])
def test_a_wrong_vox_offset_is_unreadable_or_truncated(fuzz_dir: Path, suffix: str, offset: int) -> None:
    """``vox_offset`` inside the header (below 352): ``unreadable``; past where the voxels
    could start (the file, or its inflated stream, ends before the last one): ``truncated``."""
    name = write_seed(fuzz_dir, f"offset-{offset}{suffix}", with_fields(f"float32{suffix}", vox_offset=offset))
    assert reason(outcome(fuzz_dir, name)) == ("unreadable" if offset < 352 else "truncated")


@pytest.mark.parametrize("slope", [float("inf"), float("-inf")])
@pytest.mark.parametrize("seed", ["ct_int16.nii.gz", "scaled_bigendian.nii", "float64_nifti2.nii.gz"])
def test_an_infinite_scl_slope_is_unreadable_not_packed_unscaled(fuzz_dir: Path, seed: str, slope: float) -> None:
    """nibabel reads a scl_slope that is not finite as "no scaling" (NaN is its own mark for
    that), so a CT stored as int16 with scl_inter -1024 and a damaged slope of inf packed its
    stored values as if they were HU: every voxel 1024 too bright, with no record. An infinite
    slope is a damaged header: unreadable, naming the field. NaN keeps meaning "no scaling"."""
    name = write_seed(fuzz_dir, f"slope-{slope}-{seed}", with_fields(seed, scl_slope=slope))
    found = outcome(fuzz_dir, name)
    assert isinstance(found, Issue) and (found.reason, found.stage) == ("unreadable", "read"), found
    assert name in found.message and "scl_slope" in found.message and "inf" in found.message
    unscaled = write_seed(fuzz_dir, f"slope-nan-{seed}", with_fields(seed, scl_slope=float("nan")))
    assert isinstance(outcome(fuzz_dir, unscaled), list)


@pytest.mark.parametrize(("seed", "fields", "want"), [
    ("float32.nii", {"dim": {0: 9}}, "unreadable"), ("float32.nii", {"datatype": 999}, "unreadable"),
    ("float32.nii", {"dim": {1: 0}}, "bad_shape"), ("float32.nii.gz", {"dim": {2: -5}}, "bad_shape"),
    ("ct_int16.nii.gz", {"scl_slope": 1e-38}, "constant_image")], ids=["dim0", "datatype", "dim1", "dim2", "slope"])
def test_a_damaged_header_field_message_names_the_file_and_ends_with_the_fix(fuzz_dir: Path, seed: str,
                                                                             fields: dict[str, Any], want: str) -> None:
    """dim[0] of 9 (nibabel then guesses the other byte order and complains of vox_offset), an
    unknown datatype, a zero or negative size, a slope that flattens every voxel: each record
    names the file and, in its last clause, what to do, as the truncated ones do."""
    name = write_seed(fuzz_dir, f"field-{next(iter(fields))}-{seed}", with_fields(seed, **fields))
    found = outcome(fuzz_dir, name)
    assert isinstance(found, Issue) and found.reason == want, found
    assert name in found.message
    fix = found.message.rsplit(";", 1)[-1]
    assert any(word in fix for word in ("fix", "export", "copy", "remove", "replace")), found.message


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


@pytest.mark.parametrize("where, value", [("column", 2.4e24), ("column", 2e5), ("origin", -3e8)])
def test_an_affine_no_scanner_gives_is_bad_geometry(fuzz_dir: Path, where: str, value: float) -> None:
    """A damaged sform (a flipped exponent bit: a 2.4e24 mm voxel column, or a first voxel 300 km
    away) placed the voxels on that grid and packed with only the forms-differ warning, its
    pixel spacing 2.4e24 mm in the metadata: ``bad_geometry``. A big but possible header (a
    voxel of 1 m, an origin 10 m off) still reads."""
    values = phantom().astype(np.float32)
    for scale, want in ((1.0, "bad_geometry"), (None, "ok")):
        affine = GRID.affine.copy()
        column, origin = (value, affine[0, 3]) if where == "column" else (affine[0, 0], value)
        if scale is None:  # the plausible neighbour of the same edit
            column, origin = (1000.0, affine[0, 3]) if where == "column" else (affine[0, 0], 1e4)
        affine[0, 0], affine[0, 3] = column, origin
        name = f"affine-{where}-{value}-{want}.nii"
        write_nifti(fuzz_dir / name, values, affine, form=Form(1, 0))
        assert reason(outcome(fuzz_dir, name)) == want, (where, value, want)


@pytest.mark.parametrize(("voxel", "want"), [(5e-5, "ok"), (1e-4, "ok"), (0.7, "ok"), (0.0, "bad_geometry")])
def test_a_tiny_voxel_is_not_a_singular_affine_but_a_collapsed_direction_is(fuzz_dir: Path, voxel: float,
                                                                            want: str) -> None:
    """An electron-microscopy volume of 5e-5 mm voxels (determinant 1.25e-13) was "singular"
    (an absolute determinant test), its affine printed as all zeros; a direction collapsed onto
    another, whatever the voxel size, still is."""
    values = phantom().astype(np.float32)
    affine = np.diag([voxel or 1.0, voxel or 1.0, voxel or 1.0, 1.0])
    if voxel == 0.0:
        affine[:3, 2] = affine[:3, 1]  # the third axis along the second: no volume
    name = f"voxel-{voxel}.nii"
    write_nifti(fuzz_dir / name, values, affine, form=Form(1, 0))
    found = outcome(fuzz_dir, name)
    assert reason(found) == want, found
    if want == "bad_geometry":
        assert isinstance(found, Issue) and "is singular or not finite" in found.message


@pytest.mark.parametrize(("code", "voxel", "mm"), [(1, 0.002, 2.0), (3, 2000.0, 2.0), (2, 2.0, 2.0), (0, 2.0, 2.0)],
                         ids=["meter", "micron", "mm", "unknown"])
def test_the_spatial_unit_the_header_declares_is_read_as_mm(fuzz_dir: Path, code: int, voxel: float,
                                                            mm: float) -> None:
    """xyzt_units (NIfTI-1 codes 1 metre, 2 mm, 3 micrometre; 0 unknown, read as mm): a file in
    metres with pixdim 0.002 was packed with 0.002 mm pixels (a 1 mm spacing made its 8³ volume
    one voxel), one in micrometres with 2000 was refused as 2 m voxels."""
    values = phantom().astype(np.float32)
    name = f"units-{code}.nii"
    write_nifti(fuzz_dir / name, values, np.diag([voxel, voxel, voxel, 1.0]), form=Form(1, 0),
                fields={"xyzt_units": code})
    found = outcome(fuzz_dir, name)
    assert isinstance(found, list), found
    assert found[0].metadata["pixel_spacing"] == pytest.approx([mm, mm])


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


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_voxels_are_non_finite(fuzz_dir: Path, value: float) -> None:
    values = phantom().astype(np.float32)
    values[3, 4, 5] = value
    write_nifti(fuzz_dir / "non-finite.nii.gz", values, GRID.affine)
    assert reason(outcome(fuzz_dir, "non-finite.nii.gz")) == "non_finite"


@pytest.mark.parametrize("name", ["beyond.nii", "beyond.nii.gz"])
def test_a_finite_float64_voxel_beyond_float32_is_named_as_such_not_as_infinite(fuzz_dir: Path, name: str) -> None:
    """One float64 voxel of 1e300, no NaN, no infinity: the cast to float32 made it infinite, and
    the record said "0 NaN and 1 infinite voxel(s)" (under fill: min it was silently replaced as
    one). It is named as what it is, on the mapped and the inflated path alike."""
    values = phantom().astype(np.float64)
    values[3, 4, 5] = 1e300
    write_nifti(fuzz_dir / name, values, GRID.affine)
    found = outcome(fuzz_dir, name)
    assert isinstance(found, Issue) and found.reason == "non_finite", found
    assert "1 voxel(s) hold finite values beyond float32's range" in found.message and "1e+300" in found.message
    assert "infinite voxel" not in found.message


@pytest.mark.parametrize("dtype", [np.dtype([("R", "u1"), ("G", "u1"), ("B", "u1")]), np.dtype(np.complex64),
                                   np.dtype(np.complex128)], ids=["rgb24", "complex64", "complex128"])
def test_colour_and_complex_voxels_are_unsupported(fuzz_dir: Path, dtype: np.dtype) -> None:
    write_nifti(fuzz_dir / "odd-type.nii", np.zeros(GRID.shape, dtype=dtype), GRID.affine)
    assert reason(outcome(fuzz_dir, "odd-type.nii")) == "unsupported"


def test_a_4d_file_needs_channels_from(fuzz_dir: Path) -> None:
    """A 4-D file without ``channels_from: last_axis``: ``unsupported_dimensions``; with it, its
    volumes are channels (two volumes × two windows = 4 channels a slice stack's centre)."""
    name = write_seed(fuzz_dir, "four_d.nii.gz")
    assert reason(outcome(fuzz_dir, name, "slices")) == "unsupported_dimensions"
    stacks = outcome(fuzz_dir, name, "stacks")
    assert not isinstance(stacks, Issue) and stacks[0].image.shape[0] == 2 * 2 * 3


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


@pytest.mark.parametrize("sample", ["volume", "slice"])
def test_resampling_to_an_absurd_grid_is_too_large(fuzz_dir: Path, sample: str) -> None:
    """An sform with a 90 m voxel (within what ``bad_geometry`` lets through: a 1e30 mm one is
    refused before this), resampled to 5 mm (``sample: {volume: {spacing}}``) or slices to
    2 mm (``spacing``), asks for a grid far too large: ``too_large`` (as a DICOM series is,
    against ``limits.max_voxels`` / ``max_pixels``), never an attempt."""
    affine = GRID.affine.copy()
    affine[2, 2] = 9e4
    write_nifti(fuzz_dir / "absurd.nii.gz", phantom().astype(np.float32), affine)
    nifti = ({"windows": ["abdomen"], "sample": {"volume": {"spacing": [5.0, 5.0, 5.0]}}} if sample == "volume"
             else {"windows": ["abdomen"], "axis": "coronal", "spacing": [2.0, 2.0]})
    SETTINGS[f"absurd-{sample}"] = nifti
    try:
        got = timed(lambda: outcome(fuzz_dir, "absurd.nii.gz", job=make_job(fuzz_dir, f"absurd-{sample}", "image")))
    finally:
        del SETTINGS[f"absurd-{sample}"]
    assert reason(got) == "too_large", getattr(got, "message", got)


def test_a_volume_resampled_past_max_voxels_is_too_large(fuzz_dir: Path) -> None:
    """``limits.max_voxels`` bounds a volume "before and after resampling" (config.LimitsConfig):
    a 21×17×9 file (3,213 voxels, within a limit of 10,000) resampled from 6×6×9 mm to 3 mm
    becomes 27×34×42 = 38,556 voxels: ``too_large``, from the header, before any resampling."""
    limits = {**LIMITS, "max_voxels": 10_000}
    SETTINGS["fine-volume"] = {"windows": ["abdomen"], "sample": {"volume": {"spacing": [3.0, 3.0, 3.0]}}}
    try:
        job = make_job(fuzz_dir, "fine-volume", "image", limits=limits)
    finally:
        del SETTINGS["fine-volume"]
    assert int(np.prod(GRID.shape)) < 10_000
    got = outcome(fuzz_dir, write_seed(fuzz_dir, "float32.nii.gz"), job=job)
    assert reason(got) == "too_large", [s.image.shape for s in got] if isinstance(got, list) else got


def test_damaged_files_in_a_build_become_one_record_each(tmp_path: Path) -> None:
    """End to end (discovery, pixel pass, packing): two good cases (one with a broken qform
    beside its sform, which crashed the build) and one file of each named defect; each damaged
    file is exactly one bad-sample record with its reason, the good cases are packed."""
    raw = tmp_path / "raw"
    raw.mkdir()
    values = phantom().astype(np.float32)
    write_nifti(raw / "good.nii.gz", values, GRID.affine)
    data = seeds()["float32.nii.gz"][0]
    (raw / "cut.nii.gz").write_bytes(data[: len(data) // 2])
    (raw / "quaternion.nii.gz").write_bytes(with_fields("float32.nii.gz", quatern_b=3.0))  # ignored: sform
    (raw / "offset.nii").write_bytes(with_fields("float32.nii", vox_offset=np.inf))
    (raw / "promise.nii.gz").write_bytes(with_fields("float32.nii.gz", dim=[3, 1000, 1000, 300, 1, 1, 1, 1]))
    crc = bytearray(data)
    crc[-8] ^= 0xFF
    (raw / "crc.nii.gz").write_bytes(bytes(crc))
    write_nifti(raw / "pixdim.nii", values, GRID.affine, form=Form(0, 1), fields={("pixdim", 1): 0.0})
    write_nifti(raw / "four_d.nii.gz", np.stack([values, values], axis=-1), GRID.affine)
    expected = {"cut.nii.gz": "truncated", "offset.nii": "unreadable",
                "promise.nii.gz": "truncated", "pixdim.nii": "bad_geometry", "four_d.nii.gz": "unsupported_dimensions",
                "crc.nii.gz": "decode_failed"}
    good = ["good.nii.gz", "quaternion.nii.gz"]
    rows = [{"path": name, "entity": name.replace(".", "_")} for name in [*good, *expected]]
    packed = build_nifti(tmp_path, rows, {"windows": ["abdomen"], "sample": "volume"})
    assert sorted((Path(b["path"]).name, b["reason"]) for b in packed.bad) == sorted(expected.items())
    assert sorted(r["entity_id"] for r in packed.records.values()) == sorted(n.replace(".", "_") for n in good)


# ------------------------------------------------------------------------------------ fuzzing

SETTING, ROLE = st.sampled_from(sorted(SETTINGS)), st.sampled_from(ROLES)


@settings(FUZZ, max_examples=40)
@given(case=st.one_of(header_field_mutations(), byte_mutations(), gzip_mutations()), setting=SETTING, role=ROLE)
def test_fuzz_smoke(fuzz_dir: Path, case: tuple[str, bytes], setting: str, role: str) -> None:
    """A few of each mutation, in the fast lane: the slow runs below are the real fuzzing."""
    run_mutated(fuzz_dir, case, setting, role)


@pytest.mark.slow
@settings(FUZZ, max_examples=600 * EXAMPLES)
@given(case=header_field_mutations(), setting=SETTING, role=ROLE)
def test_fuzz_header_fields(fuzz_dir: Path, case: tuple[str, bytes], setting: str, role: str) -> None:
    run_mutated(fuzz_dir, case, setting, role)


@pytest.mark.slow
@settings(FUZZ, max_examples=600 * EXAMPLES)
@given(case=byte_mutations(), setting=SETTING, role=ROLE)
def test_fuzz_bytes(fuzz_dir: Path, case: tuple[str, bytes], setting: str, role: str) -> None:
    run_mutated(fuzz_dir, case, setting, role)


@pytest.mark.slow
@settings(FUZZ, max_examples=300 * EXAMPLES)
@given(case=gzip_mutations(), setting=SETTING, role=ROLE)
def test_fuzz_gzip_stream(fuzz_dir: Path, case: tuple[str, bytes], setting: str, role: str) -> None:
    run_mutated(fuzz_dir, case, setting, role)


def test_timer_catches_a_hang() -> None:
    """The per-call budget works: a call that sleeps past it fails instead of stalling CI."""
    global CALL_BUDGET_S
    saved, CALL_BUDGET_S = CALL_BUDGET_S, 0.05
    try:
        with pytest.raises(Hang):
            timed(lambda: time.sleep(2))
    finally:
        CALL_BUDGET_S = saved


def test_a_nii_gz_cut_in_its_gzip_trailer_says_so_not_that_voxels_are_missing(fuzz_dir: Path) -> None:
    """A ``.nii.gz`` whose last 4 bytes (the trailer's length) are cut holds every voxel: its
    record said "the gzip stream ends before the last voxel", the wrong defect to look for."""
    data = seeds()["float32.nii.gz"][0]
    name = write_seed(fuzz_dir, "trailer.nii.gz", data[:-4])
    found = outcome(fuzz_dir, name)
    assert reason(found) == "truncated"
    assert "ends after its last voxel" in found.message and "before its trailer" in found.message


def test_a_whole_gzip_stream_holding_too_few_voxels_says_export_again_not_copy_again(fuzz_dir: Path) -> None:
    """A ``.nii.gz`` whose gzip stream is whole (CRC-32 and length check) but whose NIfTI holds
    half its voxels was 'the gzip stream is cut short ... copy the file again': copying cannot help."""
    inner = gzip.decompress(seeds()["float32.nii.gz"][0])
    name = write_seed(fuzz_dir, "short_inner.nii.gz", gzip.compress(inner[:len(inner) - (len(inner) - 352) // 2]))
    found = outcome(fuzz_dir, name)
    assert reason(found) == "truncated"
    assert "gzip stream is whole" in found.message and "export it again" in found.message
    assert "copy the file again" not in found.message.replace("copying it again cannot help", "")
