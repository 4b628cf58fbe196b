"""The header pass (``validate --quick``) on raw files behind s3:// URLs (moto's S3 server on
127.0.0.1): it fetches only the byte ranges the header probe reads, and its samples and
bad-sample records are exactly those of the same files on local paths."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import fsspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydicom.dataset import Dataset
from pydicom.uid import DeflatedExplicitVRLittleEndian

from packer.config import JobConfig, load_job
from packer.pipeline import rawstore
from packer.pipeline.datacheck import validate_job
from packer.pipeline.discover import discover
from packer.pipeline.pixels import ChunkTask, process_chunk
from packer.pipeline.rawstore import HEAD_BYTES, remote_listing
from packer.records import SpilledSample
from tests.dicom_files import TEST_FILES, ct_dataset, image_dataset, save
from tests.helpers import write_job
from tests.s3_store import S3Requests, Store, running_store

pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
s3fs = pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "packer-quick"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running



# ------------------------------------------------------------------------------ raw files

def noise(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def with_private_block(ds: Dataset, size: int, seed: int) -> Dataset:
    """``ds`` with a ``size``-byte private OB element in group 0009: it comes before (0010,0020)
    Patient ID and the Image Pixel module, so a probe must read past it to find them."""
    ds.add_new(0x00090010, "LO", "PACKER TEST")
    ds.add_new(0x00091001, "OB", noise(size, seed))
    return ds


def jpeg_with_app_segments(pixels: np.ndarray, segments: int, seed: int) -> bytes:
    """A JPEG whose SOI is followed by ``segments`` 60 000-byte APP2 segments, then the SOF."""
    ok, encoded = cv2.imencode(".jpg", pixels)
    assert ok
    data = encoded.tobytes()
    apps = b"".join(b"\xff\xe2" + struct.pack(">H", 60_002) + noise(60_000, seed + i) for i in range(segments))
    return data[:2] + apps + data[2:]


def encode(ext: str, pixels: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(ext, pixels)
    assert ok
    return encoded.tobytes()


def write_dicom_tree(root: Path) -> list[str]:
    """Good and broken DICOM files, most of them over HEAD_BYTES, plus pydicom's shipped test
    files; returns every relpath (for the label table)."""
    rng = np.random.default_rng(5)
    big_header = with_private_block(ct_dataset(rng.integers(0, 3000, (256, 256), dtype=np.int16),
                                               PatientID="BIGHEAD-1"), 300_000, 1)
    save(big_header, root / "big_header.dcm")
    data = (root / "big_header.dcm").read_bytes()
    (root / "broken" / "cut_in_header.dcm").write_bytes(data[:150_000])  # inside the private element
    save(image_dataset(rng.integers(0, 4000, (4, 256, 256), dtype=np.uint16), PatientID="MULTI-1"),
         root / "multiframe.dcm")
    cut = (root / "multiframe.dcm").read_bytes()
    (root / "broken" / "cut_in_pixels.dcm").write_bytes(cut[:len(cut) // 2])
    save(with_private_block(image_dataset(rng.integers(0, 9, (16, 16), dtype=np.uint16),
                                          NumberOfFrames=50_000), 100_000, 2), root / "broken" / "frames.dcm")
    no_pixels = with_private_block(ct_dataset(), 100_000, 3)
    for keyword in ("PixelData", "Rows", "Columns", "BitsAllocated"):
        delattr(no_pixels, keyword)
    save(no_pixels, root / "broken" / "no_pixels.dcm")
    deflated = ct_dataset(rng.integers(0, 3000, (256, 256), dtype=np.int16), PatientID="DEFLATE-1")
    deflated.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    save(deflated, root / "deflated.dcm")
    (root / "broken" / "notes.dcm").write_bytes(b"Scanner notes. " * 8_000)
    (root / "broken" / "zero.dcm").write_bytes(b"")
    shutil.copytree(TEST_FILES, root / "pydicom")
    assert (root / "deflated.dcm").stat().st_size > HEAD_BYTES
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def write_image_tree(root: Path) -> list[str]:
    """Good and broken images, most of them over HEAD_BYTES; returns the table rows."""
    rng = np.random.default_rng(6)
    pixels = rng.integers(0, 256, (300, 300, 3), dtype=np.uint8)
    tiff = encode(".tiff", pixels)
    assert struct.unpack_from("<I", tiff, 4)[0] > len(tiff) - HEAD_BYTES  # its IFD sits at the end
    files = {
        "big.png": encode(".png", pixels), "small.png": encode(".png", pixels[:8, :8]),
        "big.bmp": encode(".bmp", pixels), "end_ifd.tif": tiff, "cut.tif": tiff[:len(tiff) // 2],
        "app.jpg": jpeg_with_app_segments(pixels, 3, 10),  # the SOF lies past 64 KiB: the probe reads 256 KiB
        "app5.jpg": jpeg_with_app_segments(pixels, 5, 20),  # past 256 KiB: the probe reads 1 MiB
        "app_cut.jpg": jpeg_with_app_segments(pixels, 3, 30)[:150_000],
        "no_sof.jpg": jpeg_with_app_segments(pixels, 2, 40)[:2 + 2 * 60_004] + b"\xff\xd9",  # SOI, APPs, EOI
        "noise.png": noise(100_000, 7),
        "huge.png": encode(".png", np.zeros((20, 20), np.uint8))[:16] + struct.pack(">II", 90_000, 90_000)
                    + encode(".png", np.zeros((20, 20), np.uint8))[24:] + noise(80_000, 8),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    rows = [f"{name},cat,S{i % 4},2024-01-0{i % 9 + 1}" for i, name in enumerate(sorted(files))]
    return [*rows, "missing.png,dog,S9,2024-02-01"]


def quick_job(folder: Path, raw: str, dicom_labels: str, image_table: str) -> JobConfig:
    doc = {"name": "quick",
           "sources": [{"kind": "dicom", "name": "ct", "root": f"{raw}/ct", "labels": dicom_labels},
                       {"kind": "image", "name": "photos", "root": f"{raw}/photos", "table": image_table}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(folder / "out"),
           "phi": {"mode": "keep", "dates": "keep"}}
    return load_job(write_job(folder, doc))


@dataclass(frozen=True)
class Tree:
    local: Path
    url: str
    dicom: list[str]


@pytest.fixture(scope="module")
def tree(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Tree:
    raw = tmp_path_factory.mktemp("quick") / "raw"
    (raw / "ct" / "broken").mkdir(parents=True)
    (raw / "photos").mkdir()
    dicom = write_dicom_tree(raw / "ct")
    (raw / "ct_labels.csv").write_text("\n".join(["path,label", *(f"{rel},normal" for rel in dicom)]) + "\n")
    rows = write_image_tree(raw / "photos")
    (raw / "photos" / "labels.csv").write_text("\n".join(["path,label,entity,timestamp", *rows]) + "\n")
    return Tree(local=raw, url=store.upload(raw, "quick/raw"), dicom=dicom)


Records = tuple[list[tuple[Any, ...]], list[tuple[str, str, str, str, str]]]


def quick_records(tree: Tree, folder: Path, remote: bool) -> Records:
    """The samples and bad-sample records of ``validate --quick``, the raw root written as ``<raw>``."""
    raw = tree.url if remote else str(tree.local)
    job = quick_job(folder, raw, f"{raw}/ct_labels.csv", f"{raw}/photos/labels.csv")
    prepared = validate_job(job, quick=True, scheduler="sync", quiet=True).prepared

    def named(text: str) -> str:
        return text.replace(raw, "<raw>")

    def sample(s: SpilledSample) -> tuple[Any, ...]:
        return (s.key, named(s.ref.path), s.ref.relpath, s.ref.label, s.ref.entity, s.ref.time, s.ref.extra)

    issues = [(i.sample_id, named(i.path), i.stage, i.reason, named(i.message)) for i in prepared.issues]
    return sorted(sample(s) for s in prepared.samples), sorted(issues)


@pytest.fixture(scope="module")
def local_records(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Records:
    return quick_records(tree, tmp_path_factory.mktemp("local-job"), remote=False)


def garble_unfetched_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill what the header fetch left out of each copy with 0xA5 instead of zeros: a probe
    outcome that changes reads a byte the fetch did not bring."""
    runs: list[list[tuple[int, bytes]]] = []
    original_runs, original_fetch = rawstore._RangedObject.runs, rawstore._fetch_probed_ranges

    def recorded(self: Any) -> list[tuple[int, bytes]]:
        runs.append(original_runs(self))
        return runs[-1]

    def garbled(ref: Any, fs: Any, path: str, size: int, local: Path, limits: Any) -> bool:
        wrote = original_fetch(ref, fs, path, size, local, limits)
        if wrote:
            with open(local, "r+b") as copy:
                at = 0
                for offset, data in [*runs[-1], (size, b"")]:
                    copy.seek(at)
                    copy.write(b"\xa5" * (offset - at))
                    at = offset + len(data)
        return wrote

    monkeypatch.setattr(rawstore._RangedObject, "runs", recorded)
    monkeypatch.setattr(rawstore, "_fetch_probed_ranges", garbled)


@pytest.mark.slow  # moto's S3 server
@pytest.mark.parametrize("unfetched", ["zeros", "garbage"])
def test_quick_validate_of_s3_files_gives_the_records_of_local_paths(
        tree: Tree, local_records: Records, unfetched: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if unfetched == "garbage":
        garble_unfetched_bytes(monkeypatch)
    calls = S3Requests(monkeypatch)
    remote = quick_records(tree, tmp_path, remote=True)
    assert remote == local_records

    samples, issues = local_records
    entities = {relpath: entity for _, _, relpath, _, entity, _, _ in samples}
    assert entities["big_header.dcm"] == "BIGHEAD-1"  # read past a 300 kB private element
    assert entities["multiframe.dcm"] == "MULTI-1" and entities["deflated.dcm"] == "DEFLATE-1"
    assert {"app.jpg", "app5.jpg", "end_ifd.tif", "big.bmp", "big.png"} <= entities.keys()
    reasons = {path.rsplit("/", 1)[-1]: reason for _, path, _, reason, _ in issues}
    assert {name: reasons[name] for name in ("cut_in_header.dcm", "frames.dcm", "no_pixels.dcm", "notes.dcm",
                                             "zero.dcm", "cut.tif", "app_cut.jpg", "no_sof.jpg", "noise.png",
                                             "huge.png", "missing.png")} == {
        "cut_in_header.dcm": "truncated", "frames.dcm": "too_large", "no_pixels.dcm": "no_pixel_data",
        "notes.dcm": "not_dicom", "zero.dcm": "unreadable", "cut.tif": "truncated", "app_cut.jpg": "truncated",
        "no_sof.jpg": "decode_failed", "noise.png": "unsupported", "huge.png": "too_large",
        "missing.png": "missing_file"}
    assert entities["broken/cut_in_pixels.dcm"] == "MULTI-1"  # its header is whole: the pixel pass finds the cut

    # only files no larger than the first request (and the deflated one) were fetched whole
    sizes = {p.relative_to(tree.local).as_posix(): p.stat().st_size for p in tree.local.rglob("*") if p.is_file()}
    whole = {key.removeprefix("quick/raw/") for key in calls.whole_gets()}
    assert "ct/deflated.dcm" in whole and "ct/pydicom/CT_small.dcm" in whole
    assert whole - {"ct/deflated.dcm"} <= {rel for rel, size in sizes.items() if size <= HEAD_BYTES}
    for rel in ("ct/multiframe.dcm", "ct/big_header.dcm", "photos/end_ifd.tif", "photos/big.png"):
        assert calls.fetched(f"quick/raw/{rel}") < sizes[rel] * 0.8, rel


@pytest.mark.slow  # moto's S3 server
def test_a_quick_probe_of_a_large_dicom_fetches_a_small_fraction_of_it(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = np.random.default_rng(9).integers(0, 4000, (16, 512, 512), dtype=np.uint16)
    path = save(image_dataset(pixels, PatientID="LARGE-1", WindowCenter=2000, WindowWidth=4000),
                tmp_path / "raw" / "large.dcm")
    size = path.stat().st_size
    assert size > 8 * 2**20
    url = store.upload(tmp_path / "raw", "large")
    store.client.put_object(Bucket=BUCKET, Key="large-labels.csv", Body=b"path,label\nlarge.dcm,normal\n")
    doc = {"name": "large", "sources": [{"kind": "dicom", "root": url, "labels": f"s3://{BUCKET}/large-labels.csv"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"),
           "phi": {"mode": "keep", "dates": "keep"}}
    job = load_job(write_job(tmp_path, doc))
    found = discover(job)
    task = ChunkTask(key="large", refs=tuple(found.refs), job=job, cache_dir=None, decode=False,
                     listed=remote_listing(found.refs, found.listed))

    calls = S3Requests(monkeypatch)
    quick = process_chunk(task)
    sample = quick.samples[0]  # one per frame, as the build keys them: counted from the header
    assert len(quick.samples) == 16
    assert (sample.ref.entity, sample.ref.path, quick.issues) == ("LARGE-1", f"{url}/large.dcm", ())
    fetched = calls.fetched("large/large.dcm")
    assert 0 < fetched <= HEAD_BYTES  # the whole header, and not 1 % of the 8 MiB file
    assert [r.ranged for r in calls.gets("large/large.dcm")] == [True]

    full = process_chunk(replace(task, decode=True))  # the pixel pass still fetches the file whole, once
    assert full.issues == () and [s.key for s in full.samples] == [s.key for s in quick.samples]
    assert calls.fetched("large/large.dcm") - fetched == size
    assert [r.ranged for r in calls.gets("large/large.dcm")] == [True, False]


def dicom_task(store: Store, tmp_path: Path, prefix: str, files: dict[str, bytes]) -> ChunkTask:
    for name, data in files.items():
        store.client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=data)
    doc = {"name": "t", "sources": [{"kind": "dicom", "root": f"s3://{BUCKET}/{prefix}"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    job = load_job(write_job(tmp_path, doc))
    found = discover(job)
    return ChunkTask(key=prefix, refs=tuple(found.refs), job=job, cache_dir=None, decode=False,
                     listed=remote_listing(found.refs, found.listed))


@pytest.mark.slow  # moto's S3 server
def test_a_header_read_front_to_back_costs_few_requests(store: Store, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ds = with_private_block(ct_dataset(np.zeros((512, 512), np.int16)), 1_000_000, 4)
    data = save(ds, tmp_path / "a.dcm").read_bytes()
    task = dicom_task(store, tmp_path, "requests", {"a.dcm": data})
    calls = S3Requests(monkeypatch)
    result = process_chunk(task)
    assert [i.reason for i in result.issues] == ["missing_label"]  # probed whole: only the label is missing
    gets = [(r.ranged, r.body_bytes) for r in calls.gets("requests/a.dcm")]
    header = 1_000_000 + 2_000
    assert all(ranged for ranged, _ in gets) and len(gets) <= 6  # 64 KiB, then a run the size of what is held
    assert header < sum(size for _, size in gets) < min(2 * header + HEAD_BYTES, len(data))


@pytest.mark.slow  # moto's S3 server
def test_an_object_gone_or_shrunk_after_discovery_on_the_quick_pass(store: Store, tmp_path: Path) -> None:
    pixels = np.random.default_rng(3).integers(0, 256, (300, 300, 3), dtype=np.uint8)
    tiff = encode(".tiff", pixels)
    smaller = encode(".tiff", pixels[:200])
    names = {"gone.tif": tiff, "shrunk.tif": tiff}
    for name, data in names.items():
        store.client.put_object(Bucket=BUCKET, Key=f"changed/{name}", Body=data)
    table = "path,label,entity,timestamp\ngone.tif,cat,S1,\nshrunk.tif,cat,S2,\n"
    store.client.put_object(Bucket=BUCKET, Key="changed/labels.csv", Body=table.encode())
    doc = {"name": "t", "sources": [{"kind": "image", "root": f"s3://{BUCKET}/changed",
                                     "table": f"s3://{BUCKET}/changed/labels.csv"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    job = load_job(write_job(tmp_path, doc))
    found = discover(job)
    store.client.delete_object(Bucket=BUCKET, Key="changed/gone.tif")
    store.client.put_object(Bucket=BUCKET, Key="changed/shrunk.tif", Body=smaller)
    result = process_chunk(ChunkTask(key="changed", refs=tuple(found.refs), job=job, cache_dir=None, decode=False,
                                     listed=remote_listing(found.refs, found.listed)))
    (issue,) = result.issues
    assert (issue.stage, issue.reason, issue.path) == ("read", "missing_file", f"s3://{BUCKET}/changed/gone.tif")
    assert issue.message.startswith(f"s3://{BUCKET}/changed/gone.tif: ") and "restore it" in issue.message
    # the IFD the listing's size pointed at is no longer there: fetched whole, probed as it is now
    (sample,) = result.samples
    assert sample.ref.path == f"s3://{BUCKET}/changed/shrunk.tif"


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 5 * HEAD_BYTES), reads=st.lists(st.tuples(st.integers(0, 6 * HEAD_BYTES),
                                                                     st.integers(-1, 3 * HEAD_BYTES)), max_size=8))
def test_a_ranged_object_reads_like_a_local_file(size: int, reads: list[tuple[int, int]]) -> None:
    data = noise(size, size)
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/ranged/object", data)
    source = rawstore._RangedObject(fs, "/ranged/object", size)
    for offset, count in reads:
        expected = data[offset:] if count < 0 else data[offset:offset + count]
        assert source.read_at(offset, count) == expected
        source.seek(offset)
        assert source.read(count) == expected and source.tell() == offset + len(expected)
    for offset, run in source.runs():
        assert data[offset:offset + len(run)] == run and offset % HEAD_BYTES == 0
