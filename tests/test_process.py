"""The pixel pass spills into a cache keyed by content and config; chunks are content-defined."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packer.config import (
    Carve,
    JobConfig,
    MaskConfig,
    PathField,
    SeriesConfig,
    SplitList,
    TableConfig,
    TargetConfig,
    WindowSpec,
)
from packer.pipeline.pixels import BOUNDARY, MAX_CHUNK, chunk_bounds
from packer.pipeline.rawstore import RawObject
from packer.read.kinds import source_kinds
from packer.records import REF_FIELDS, Issue, MemberIssue, SampleRef
from packer.where import Condition
from tests.helpers import REPO, demo_job_doc, write_job


def ref(i: int) -> SampleRef:
    return SampleRef(sample_id=f"s-{i:06d}", source="s", kind="image", path=f"/r/{i}.png", relpath=f"{i:06d}.png")


def chunk_refs(refs: list[SampleRef]) -> list[tuple[SampleRef, ...]]:
    """The chunks the pixel pass cuts ``refs`` into: :func:`chunk_bounds` of their ids."""
    return [tuple(refs[start:stop]) for start, stop in chunk_bounds([r.sample_id for r in refs])]


def test_chunks_cover_every_ref_once_in_order() -> None:
    refs = [ref(i) for i in range(1000)]
    chunks = chunk_refs(refs)
    assert [r for c in chunks for r in c] == refs
    assert all(1 <= len(c) <= MAX_CHUNK for c in chunks)
    assert len(chunks) > 1000 / (4 * BOUNDARY)


def test_adding_a_file_changes_only_its_own_chunk() -> None:
    refs = [ref(i) for i in range(0, 2000, 2)]
    before = set(chunk_refs(refs))
    grown = sorted([*refs, ref(1001)], key=lambda r: r.relpath)
    after = set(chunk_refs(grown))
    changed = after - before
    assert len(changed) == 1 and any(r.sample_id == "s-001001" for r in next(iter(changed)))
    assert len(before - after) == 1


def test_one_parse_per_dicom_file_gives_what_probe_then_read_gave(demo_raw: Any, tmp_path: Path) -> None:
    """The pixel pass parses each DICOM file once (probe_for_read hands the dataset to the
    reader). On every file of the demo tree, planted defects included, the outcome is the
    one the header-only probe followed by a fresh full read gives."""

    from packer.config import load_job
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import discover
    from packer.pipeline.probe import probe_for_read, probe_ref
    from packer.read import read_sample

    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    refs = discover(job, pseudonymizer_for(job.phi)).refs
    dicom = [r for r in refs if r.kind == "dicom"]
    assert len(dicom) > 30
    kept = 0
    for r in dicom:
        once = probe_for_read(r, job)
        probed = probe_ref(r, job)
        if isinstance(probed, Issue):
            assert once == probed
            continue
        assert not isinstance(once, Issue) and once[0] == probed
        kept += once[1] is not None
        _same_outcome(read_sample(once[0], job, state=once[1]), read_sample(probed, job))
    assert kept > 30  # the datasets were really handed over


def _same_outcome(got: Any, want: Any) -> None:
    import numpy as np

    if isinstance(want, Issue):
        assert got == want
        return
    assert not isinstance(got, Issue) and [s.key for s in got] == [s.key for s in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.image, b.image)
        assert a.metadata == b.metadata


def test_a_file_the_header_pass_placed_is_read_as_the_full_probe_reads_it(demo_raw: Any, tmp_path: Path) -> None:
    """In a series job the header pass probes each DICOM file (placement), and the pixel pass
    reads it without probing its header again when the file is unchanged (same size and
    mtime, nothing after its Pixel Data). On every file of the demo tree, planted defects
    included, the outcome is the full probe's; a file with an element after its Pixel Data is
    probed in full again, and a file changed after the header pass is refused, saying so: its
    series (and its neighbours' stacks) were assembled from the header it had then."""
    import pydicom

    from packer.config import load_job
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import discover
    from packer.pipeline.probe import probe_for_read, probe_placement
    from packer.read import read_sample
    from packer.read.dicom import reread_placed
    from packer.read.dicom_series import SliceGeometry

    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    refs = [r for r in discover(job, pseudonymizer_for(job.phi)).refs if r.kind == "dicom"]
    trusted: list[SampleRef] = []
    for r in refs:
        placed = probe_placement(r, job)
        if isinstance(placed, (Issue, MemberIssue)) or not isinstance(placed[1], SliceGeometry):
            continue  # (a MemberIssue: a file refused whose header names its series)
        fingerprint = placed[1].fingerprint
        assert fingerprint is not None and fingerprint.size == os.path.getsize(r.path)
        if reread_placed(placed[0], fingerprint) is not None:
            trusted.append(placed[0])
        once, full = probe_for_read(placed[0], job, fingerprint), probe_for_read(placed[0], job)
        assert not isinstance(once, Issue) and not isinstance(full, Issue) and once[0] == full[0] == placed[0]
        _same_outcome(read_sample(once[0], job, state=once[1]), read_sample(full[0], job, state=full[1]))
    assert len(trusted) > 30

    folder = tmp_path / "changed"
    folder.mkdir()
    source = trusted[0]
    for case in ("burned_in", "trailing"):
        path = folder / f"{case}.dcm"
        shutil.copyfile(source.path, path)
        moved = replace(source, path=str(path))
        placed = probe_placement(moved, job)
        assert not isinstance(placed, Issue)
        ds = pydicom.dcmread(path)
        if case == "burned_in":  # changed after the header pass: the read pass refuses it
            ds.BurnedInAnnotation = "YES"
            ds.save_as(path)
            os.utime(path, ns=(0, placed[1].fingerprint.mtime_ns + 10**9))  # type: ignore[union-attr]
        else:  # an element after the Pixel Data, which the header pass never saw
            ds.add_new(0xFFFCFFFC, "OB", b"\0" * 8)
            ds.save_as(path)
            placed = probe_placement(moved, job)
            assert not isinstance(placed, Issue)
        fingerprint = placed[1].fingerprint  # type: ignore[union-attr]
        assert reread_placed(moved, fingerprint) is None
        once, full = probe_for_read(moved, job, fingerprint), probe_for_read(moved, job)
        if case == "burned_in":
            assert isinstance(full, Issue) and full.reason == "burned_in_annotation"
            assert isinstance(once, Issue) and once.reason == "unreadable"
            assert "the file changed while the build ran (" in once.message  # BurnedInAnnotation: its size too
        else:
            assert once == full if isinstance(full, Issue) else once[0] == full[0]  # type: ignore[index]


def test_a_chunk_tasks_repr_leaves_out_the_storage_options() -> None:
    # dask logs a failed task with its arguments: the options may hold credentials
    from packer.pipeline.pixels import ChunkTask

    task = ChunkTask(key="k", refs=(ref(1),), job=None, cache_dir=None,  # type: ignore[arg-type]
                     storage_options={"secret": "s3cr3t-key"})
    assert "s3cr3t-key" not in repr(task) and "s-000001" in repr(task)
    assert task.storage_options == {"secret": "s3cr3t-key"}


# chunk_key, the build cache's key, specified by what it must do. A chunk's cached samples and
# bad-sample records are reused whenever its key comes round again, so the key must change with
# anything that changes what the chunk's files turn into, and stay put for everything else (a
# needless change only decodes the chunk again; a missing one reuses stale samples).
#
# What goes in: per file, in the chunk's order, every SampleRef field and a fingerprint (a local
# file's size and mtime by stat, never its bytes; a remote file's listed size and version tag),
# the job's sources, transform and split.by, the library versions and the cache format.

MTIME_NS = 1_700_000_000 * 10**9
LIBRARIES = {"numpy": "2.2.6", "opencv-python-headless": "4.12.0.88", "pydicom": "3.0.1"}
NAMES = st.text(alphabet="abcdefghij0123456789-_", min_size=1, max_size=8)  # file names: never URLs
TEXT = st.text(max_size=10)
OPTIONAL_TEXT = st.none() | TEXT
EXTRA = st.lists(st.tuples(TEXT, TEXT), max_size=3).map(tuple)
FLOATS = st.floats(-5000, 5000, allow_nan=False)
SIZES = st.none() | st.tuples(st.integers(1, 1024), st.integers(1, 1024))
CHANNELS = st.none() | st.integers(1, 4)
RESIZE = st.sampled_from(["stretch", "fit", "crop"])
WINDOW = st.builds(WindowSpec, kind=st.just("explicit"), name=NAMES, center=FLOATS, width=st.floats(1, 5000),
                   function=st.sampled_from(["LINEAR", "LINEAR_EXACT", "SIGMOID"])) | st.builds(
    WindowSpec, kind=st.just("file"), name=st.just("file"), selector=st.integers(0, 3))
WINDOWS = st.lists(WINDOW, min_size=1, max_size=3).map(tuple)
LISTING = st.builds(RawObject, size=st.integers(0, 2**40), version=TEXT)

Edit = Callable[[JobConfig], JobConfig]


def key(refs: list[SampleRef], job: JobConfig, libraries: dict[str, str] = LIBRARIES,
        listed: dict[str, RawObject] | None = None) -> str:
    from packer.pipeline.spill import chunk_key

    return chunk_key(refs, job, dict(libraries), listed)


@pytest.fixture(scope="module")
def job(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> JobConfig:
    """The demo job (both source kinds, CT windows, modality windows, sizes, channels)."""
    from packer.config import load_job

    folder = tmp_path_factory.mktemp("chunk-key")
    return load_job(write_job(folder, demo_job_doc(demo_raw.root, folder / "out")))


@st.composite
def chunk_files(draw: st.DrawFn) -> list[tuple[SampleRef, int | None]]:
    """A chunk's refs, each with its file name as path (:func:`lay_out` makes it absolute) and
    the size of its file, or None: no such file."""
    names = draw(st.lists(NAMES, min_size=1, max_size=5, unique=True))
    return [(SampleRef(sample_id=draw(TEXT), source=draw(TEXT), kind=draw(st.sampled_from(["dicom", "image"])),
                       path=name, relpath=draw(TEXT), label=draw(OPTIONAL_TEXT), entity=draw(OPTIONAL_TEXT),
                       time=draw(OPTIONAL_TEXT), extra=draw(EXTRA)),
             draw(st.none() | st.integers(0, 64)))
            for name in names]


def lay_out(folder: Path, files: list[tuple[SampleRef, int | None]]) -> list[SampleRef]:
    """Write each file that has a size (that many bytes, mtime MTIME_NS); the refs, paths absolute."""
    refs = []
    for ref, size in files:
        path = folder / ref.path
        if size is not None:
            path.write_bytes(b"x" * size)
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
        refs.append(replace(ref, path=str(path)))
    return refs


def job_kinds() -> list[tuple[str, object]]:
    """(name, kind) of every registered source kind: each has a ``transform.<name>`` section."""
    return [(kind.name, kind) for kind in source_kinds()]


def _setting(section: str, name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Edit]:
    """Edits setting ``job.<section>.<name>`` (``section`` empty: ``job.<name>``) to a drawn value."""
    def edit(value: Any) -> Edit:
        if not section:
            return lambda job: replace(job, **{name: value})
        if section in dict(job_kinds()):  # a source kind's transform settings
            return lambda job: job.with_settings(section, replace(job.settings(section), **{name: value}))
        return lambda job: replace(job, **{section: replace(getattr(job, section), **{name: value})})
    return values.map(edit)


def _source(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Edit]:
    """Edits setting ``<name>`` of one of the job's sources to a drawn value."""
    def edit(drawn: tuple[int, Any]) -> Edit:
        index, value = drawn
        return lambda job: replace(job, sources=tuple(replace(s, **{name: value}) if i == index % len(job.sources)
                                                      else s for i, s in enumerate(job.sources)))
    return st.tuples(st.integers(0, 7), values).map(edit)


def _stacked(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Edit]:
    """Edits ``job.dicom.<name>`` with neighbour samples on (the sampling fields count only then)."""
    def edit(value: Any) -> Edit:
        fields = {"sample": "volume" if name.startswith("volume") else "neighbors", "neighbors": 1, name: value}
        return lambda job: job.with_settings("dicom", replace(job.dicom, **fields))
    return values.map(edit)


#: Settings that change what a raw file turns into: each is part of the key. (A source's
#: ``root``, ``labels`` and ``table`` are the resolved ``*_spec``: the refs' paths and table
#: values carry them.)
PIXEL_SETTINGS: dict[str, st.SearchStrategy[Edit]] = {
    "sources.kind": _source("kind", st.sampled_from(["dicom", "image"])),
    "sources.name": _source("name", NAMES),
    "sources.root_spec": _source("root_spec", NAMES),
    "sources.entity": _source("entity", NAMES),
    # a blank entity cell: a bad sample, or the file its own entity (entity: {column, empty: file})
    "sources.entity_empty": _source("entity_empty", st.sampled_from(["file"])),
    "sources.time": _source("time", st.lists(NAMES, max_size=2).map(tuple)),
    "sources.labels_spec": _source("labels_spec", st.none() | NAMES),
    "sources.table_spec": _source("table_spec", st.none() | NAMES),
    # where labels come from: a header attribute's value is read (and checked) by the worker
    "sources.target": _source("target", st.sampled_from([
        TargetConfig(kind="none", origin="none", columns=()), TargetConfig(origin="folder", columns=()),
        TargetConfig(origin="attribute", columns=(), attribute="BodyPartExamined"),
        TargetConfig(origin="attribute", columns=(), attribute="Modality", value_map=(("CT", "ct"),)),
        TargetConfig(kind="numeric", columns=("age",))])),
    # a mask is part of what a file turns into (its file's stat joins the key as well)
    "sources.mask": _source("mask", st.sampled_from([
        MaskConfig(column="mask"), MaskConfig(column="seg", classes=(0, 1, 2)), MaskConfig(column="mask", empty="bad"),
        MaskConfig(column="mask", classes=(0, 300)), MaskConfig(column="mask", grid="resample")])),
    # a kind's own source keys (a NIfTI case's other files) and the columns naming a case's files
    "sources.options": _source("options", st.sampled_from([(("channel_files", ("t2",)),), (("axis", "coronal"),)])),
    "sources.companions": _source("companions", st.sampled_from([("t2",), ("t2", "flair")])),
    # which rows and files a source keeps, and where a row's file, entity, time and fields come from
    "sources.where": _source("where", st.sampled_from([(Condition("view", "in", ("PA",)),),
                                                       (Condition("view", "not", ("LL", "LAT")),)])),
    "sources.header_where": _source("header_where", st.sampled_from([(Condition("Modality", "in", ("CT",)),),
                                                                     (Condition("ImageType", "match", ("LOC",)),)])),
    "sources.table_map": _source("table_map", st.sampled_from([
        TableConfig(file=Path("t.csv"), file_spec="t.csv", find="name"),
        TableConfig(file=Path("t.csv"), file_spec="t.csv", path="Path", path_base=Path("."), path_base_spec=".")])),
    "sources.entity_path": _source("entity_path", st.sampled_from([PathField("entity", pattern=r"(p\d+)/"),
                                                                   PathField("entity", component=0)])),
    "sources.time_path": _source("time_path", st.sampled_from([PathField("time", pattern=r"(\d{4}-\d\d-\d\d)")])),
    "sources.fields": _source("fields", st.sampled_from([(PathField("view", component=-2),)])),
    # which kinds' settings the identity records (every used kind's, and the always-recorded ones)
    "recorded": _setting("", "recorded", st.sampled_from([("dicom",), ("dicom", "image", "nifti")])),
    "split.by": _setting("split", "by", st.sampled_from(["entity", "time"])),  # time splits need a time
    "dicom.windows": _setting("dicom", "windows", WINDOWS),
    "dicom.fallback_window": _setting("dicom", "fallback_window", st.none() | WINDOW),
    "dicom.size": _setting("dicom", "size", SIZES),
    "dicom.resize": _setting("dicom", "resize", RESIZE),
    "dicom.spacing": _setting("dicom", "spacing", st.none() | st.tuples(st.floats(0.1, 5), st.floats(0.1, 5))),
    "dicom.output": _setting("dicom", "output", st.sampled_from(["uint8", "uint16", "float16"])),
    "dicom.frames": _setting("dicom", "frames", st.sampled_from(["split", "stack"])),
    "dicom.modality_windows": _setting("dicom", "modality_windows", st.lists(
        st.tuples(st.sampled_from(["CR", "DX", "MR", "CT"]), WINDOWS), max_size=2,
        unique_by=lambda p: p[0]).map(tuple)),
    "dicom.channels": _setting("dicom", "channels", CHANNELS),
    # neighbour stacks: what a series chunk turns into (the series' files are the chunk's refs)
    "dicom.sample": _stacked("sample", st.just("neighbors")),
    "dicom.neighbors": _stacked("neighbors", st.integers(2, 4)),
    "dicom.edge": _stacked("edge", st.sampled_from(["skip"])),
    "dicom.volume_spacing": _stacked("volume_spacing", st.tuples(*[st.floats(0.5, 3)] * 3)),
    "dicom.volume_size": _stacked("volume_size", st.tuples(*[st.integers(4, 64)] * 3)),
    "dicom.series": _stacked("series", st.builds(SeriesConfig, gap_tolerance=st.floats(0.01, 0.09),
                                                 drop_localizers=st.just(False), min_slices=st.integers(4, 9))),
    "image.size": _setting("image", "size", SIZES),
    "image.resize": _setting("image", "resize", RESIZE),
    "image.color": _setting("image", "color", st.sampled_from(["rgb", "gray"])),
    "image.alpha": _setting("image", "alpha", st.sampled_from(["drop", "composite"])),
    "image.window": _setting("image", "window", st.sampled_from([(), (("center", 40.0), ("width", 400.0))]) | st.tuples(
        st.floats(0, 100), st.floats(0, 100)).map(lambda p: (("percentiles", tuple(sorted(p))),))),
    "image.tile_size": _setting("image", "tile_size", SIZES),
    "image.tile_stride": _setting("image", "tile_stride", SIZES),  # counts only with tiles: the "tiled" base
    "image.channels": _setting("image", "channels", CHANNELS),
    # NIfTI settings count where a source is NIfTI (the identity records them only then: see the test)
    "nifti.windows": _setting("nifti", "windows", WINDOWS),
    "nifti.sample": _setting("nifti", "sample", st.sampled_from(["neighbors", "volume"])),
    "nifti.neighbors": _setting("nifti", "neighbors", st.integers(1, 4)).map(
        lambda edit: lambda job: edit(job).with_settings("nifti", replace(edit(job).settings("nifti"),
                                                                          sample="neighbors"))),
    "nifti.edge": _setting("nifti", "edge", st.just("skip")).map(
        lambda edit: lambda job: edit(job).with_settings("nifti", replace(edit(job).settings("nifti"),
                                                                          sample="neighbors"))),
    "nifti.volume_spacing": _setting("nifti", "volume_spacing", st.tuples(*[st.floats(0.5, 3)] * 3)).map(
        lambda edit: lambda job: edit(job).with_settings("nifti", replace(edit(job).settings("nifti"),
                                                                          sample="volume"))),
    "nifti.volume_size": _setting("nifti", "volume_size", st.tuples(*[st.integers(4, 64)] * 3)).map(
        lambda edit: lambda job: edit(job).with_settings("nifti", replace(edit(job).settings("nifti"),
                                                                          sample="volume"))),
    "nifti.axis": _setting("nifti", "axis", st.sampled_from(["coronal", "sagittal"])),
    "nifti.spacing": _setting("nifti", "spacing", st.tuples(st.floats(0.1, 5), st.floats(0.1, 5))),
    "nifti.size": _setting("nifti", "size", SIZES),
    "nifti.resize": _setting("nifti", "resize", RESIZE),
    "nifti.output": _setting("nifti", "output", st.sampled_from(["uint16", "float16"])),
    "nifti.channels_from": _setting("nifti", "channels_from", st.just("last_axis")),
    "nifti.channels": _setting("nifti", "channels", CHANNELS),
    # transform.nifti.non_finite: {fill: ...} replaces NaN/inf voxels: other values, other pixels
    "nifti.fill": _setting("nifti", "fill", st.sampled_from([0.0, -1.0, 1000.0, "min"])),
}

#: Settings used before or after the pixel pass (discovery, split, packing, publishing,
#: pseudonyms on the client): changing one keeps every chunk's key.
OTHER_SETTINGS: dict[str, st.SearchStrategy[Edit]] = {
    # where the job wrote a setting, for messages: not what a file becomes
    **{f"{kind}.channels_key": _setting(kind, "channels_key", st.sampled_from(
        ["transform.channels", f"transform.{kind}.channels"])) for kind in ("dicom", "image", "nifti")},
    # whether the table must hold the time column: checked while listing, on the client
    "sources.time_required": _source("time_required", st.booleans()),
    # not written by a job: set per series by DicomSeries.file_job from volume.spacing (in the key) and
    # the series' geometry (its files' keys), so a chunk's key already covers what it decides
    "dicom.unrounded": _setting("dicom", "unrounded", st.booleans()),
    "name": _setting("", "name", NAMES),
    # transform.<kind> sections written for a kind no source is: ignored, only warned of
    "unused_transforms": _setting("", "unused_transforms", st.sampled_from([(), ("nifti",), ("dicom", "image")])),
    "output": _setting("", "output", NAMES.map(lambda n: f"/elsewhere/{n}")),
    "max_bad_fraction": _setting("", "max_bad_fraction", st.floats(0, 1)),
    "registry": _setting("", "registry", st.none() | NAMES.map(Path)),
    "job_path": _setting("", "job_path", NAMES.map(lambda n: Path(f"/jobs/{n}.yaml"))),
    "labels": _setting("", "labels", st.lists(NAMES, max_size=3).map(tuple)),
    "split.ratios": _setting("split", "ratios", st.lists(st.tuples(NAMES, st.floats(0, 1)), min_size=1,
                                                         max_size=3).map(tuple)),
    "split.seed": _setting("split", "seed", st.integers(0, 2**31)),
    "split.cutoffs": _setting("split", "cutoffs", st.lists(st.tuples(NAMES, NAMES), max_size=2).map(tuple)),
    "split.stratify": _setting("split", "stratify", st.none() | NAMES),
    "split.entity_policy": _setting("split", "entity_policy", st.sampled_from(["first_seen", "drop_straddlers"])),
    "split.folds": _setting("split", "folds", st.none() | st.integers(2, 10)),
    "split.pinned": _setting("split", "pinned", st.none() | NAMES.map(Path)),
    "split.pinned_spec": _setting("split", "pinned_spec", st.none() | NAMES),
    "split.duplicates": _setting("split", "duplicates", st.sampled_from(["group", "fail", "report"])),
    # label conflicts among copies are found on the client, from the pixel pass's digests and targets
    "split.label_conflict": _setting("split", "label_conflict", st.sampled_from(["warn", "fail", "drop_group"])),
    "split.label_tolerance": _setting("split", "label_tolerance", st.floats(0, 10)),
    "split.mask_dice": _setting("split", "mask_dice", st.floats(0, 1)),
    "split.near_auto": _setting("split", "near_auto", st.booleans()),  # how near_enabled was decided
    "split.near_neighbors": _setting("split", "near_neighbors", st.integers(1, 64)),
    "split.near_min_score": _setting("split", "near_min_score", st.floats(0, 1)),
    "split.near_max_cross_split": _setting("split", "near_max_cross_split", st.integers(0, 10)),
    "split.near_max_ratio": _setting("split", "near_max_ratio", st.none() | st.floats(0.01, 1)),
    "split.near_max_ratio_set": _setting("split", "near_max_ratio_set", st.booleans()),
    "split.balance_tolerance": _setting("split", "balance_tolerance", st.floats(0, 1)),
    "split.max_group_share": _setting("split", "max_group_share", st.floats(0, 1)),
    "split.accept_imbalance": _setting("split", "accept_imbalance", st.booleans()),
    # a given split (lists, a column, a carve) is decided on the client, after the pixel pass
    "split.lists": _setting("split", "lists", st.sampled_from([
        (SplitList("test", Path("test.txt"), "test.txt", None, "0" * 64),),
        (SplitList("train", Path("t.csv"), "t.csv", "name", "1" * 64),)])),
    "split.match": _setting("split", "match", st.sampled_from(["path", "name", "stem", "entity"])),
    "split.column": _setting("split", "column", st.none() | NAMES),
    "split.value_map": _setting("split", "value_map", st.sampled_from([(("validate", "valid"),)])),
    "split.carve": _setting("split", "carve", st.sampled_from([(Carve("valid", "train", 0.1),)])),
    "split.accept_leaks": _setting("split", "accept_leaks", st.booleans()),
    "pack.format": _setting("pack", "format", st.sampled_from(["webdataset", "parquet"])),
    "pack.max_samples": _setting("pack", "max_samples", st.integers(1, 10**6)),
    "pack.max_bytes": _setting("pack", "max_bytes", st.integers(1, 2**40)),
    "pack.order": _setting("pack", "order", st.sampled_from(["key", "path"])),  # the client's shard plan
    "phi.mode": _setting("phi", "mode", st.sampled_from(["pseudonymize", "keep"])),
    "phi.key_file": _setting("phi", "key_file", st.none() | NAMES.map(Path)),
    "phi.key_file_spec": _setting("phi", "key_file_spec", st.none() | NAMES),
    "phi.dates": _setting("phi", "dates", st.sampled_from(["shift", "keep"])),
    "safety.outside_root": _setting("safety", "outside_root", st.sampled_from(["reject", "allow"])),  # discovery's
}

#: Settings the worker applies while it reads a chunk's files (a file over a limit, or with
#: burned-in text, becomes a bad sample there, and the cache keeps that verdict), and whether the
#: entry keeps near-copy signatures: they belong in the key.
VERDICT_SETTINGS: dict[str, st.SearchStrategy[Edit]] = {
    "limits.max_pixels": _setting("limits", "max_pixels", st.integers(1, 2**40)),
    "limits.max_frames": _setting("limits", "max_frames", st.integers(1, 10**6)),
    "limits.max_decoded_bytes": _setting("limits", "max_decoded_bytes", st.integers(1, 2**40)),
    # checked on the client while series are assembled (a series over it is never a chunk); in the key all the same
    "limits.max_voxels": _setting("limits", "max_voxels", st.integers(1, 2**28)),
    "safety.burned_in_annotation": _setting("safety", "burned_in_annotation", st.sampled_from(["reject", "allow"])),
    # not a verdict, but what the entry holds: near-copy signatures only where the check runs
    "split.near_enabled": _setting("split", "near_enabled", st.booleans()),
}


#: New values for each SampleRef field.
REF_CHANGES: dict[str, st.SearchStrategy[Any]] = {
    "sample_id": TEXT, "source": TEXT, "kind": TEXT, "path": NAMES, "relpath": TEXT,
    "label": OPTIONAL_TEXT, "entity": OPTIONAL_TEXT, "time": OPTIONAL_TEXT, "extra": EXTRA,
    "maybe_label_map": OPTIONAL_TEXT,
}


def test_every_job_setting_is_classified_for_the_key(job: JobConfig) -> None:
    """A new job setting must be placed: part of the key, or not (and tested either way)."""
    named = {f"{section}.{f.name}" for section in ("split", "pack", "limits", "safety", "phi")
             for f in fields(getattr(job, section))}
    named |= {f"{kind}.{f.name}" for kind, settings in job.transforms for f in fields(settings)}
    named |= {f"sources.{f.name}" for f in fields(job.sources[0])} - {"sources.root", "sources.labels",
                                                                          "sources.table"}
    named |= {f.name for f in fields(job)} - {"sources", "split", "transforms", "pack", "limits", "safety", "phi"}
    classified = [*PIXEL_SETTINGS, *OTHER_SETTINGS, *VERDICT_SETTINGS]
    assert len(classified) == len(set(classified))
    assert set(classified) == named


def test_every_field_of_a_ref_is_classified_for_the_key() -> None:
    assert set(REF_CHANGES) == set(REF_FIELDS)


@settings(deadline=None)
@given(files=chunk_files())
def test_equal_inputs_give_equal_keys(job: JobConfig, files: list[tuple[SampleRef, int | None]]) -> None:
    """The key is a function of the refs, the job and the libraries, however the objects were
    made: copies give the same key, and so do the libraries in another order (the worker gets
    them as sorted pairs, the client as :func:`packer.manifest.library_versions` gives them).
    It names files in the cache folder: 32 hex digits."""
    with tempfile.TemporaryDirectory() as folder:
        refs = lay_out(Path(folder), files)
        first = key(refs, job)
        assert re.fullmatch("[0-9a-f]{32}", first)
        assert key([replace(r) for r in refs], replace(job), dict(reversed(LIBRARIES.items()))) == first


def test_the_key_is_the_same_in_another_process(job: JobConfig, tmp_path: Path) -> None:
    """A worker process computes the key the client computes (the retry path) and a later build
    finds the cache by it: nothing in it depends on the process (hash seed, object ids)."""
    (tmp_path / "a.png").write_bytes(b"x")
    refs = [SampleRef(sample_id="s-1", source="photos", kind="image", path=str(tmp_path / "a.png"), relpath="a.png",
                      label="l", entity="e", time="2020-01-01T00:00:00", extra=(("site", "A"), ("scanner", "B"))),
            SampleRef(sample_id="s-2", source="photos", kind="image", path=str(tmp_path / "gone.png"),
                      relpath="gone.png")]
    code = ("import json, sys\n"
            "from packer.config import load_job\n"
            "from packer.pipeline.spill import chunk_key\n"
            "from packer.records import SampleRef\n"
            "args = json.loads(sys.argv[1])\n"
            "refs = [SampleRef(**{**r, 'extra': tuple(map(tuple, r['extra']))}) for r in args['refs']]\n"
            "print(chunk_key(refs, load_job(args['job']), args['libraries']))\n")
    args = {"refs": [asdict(r) for r in refs], "job": str(job.job_path), "libraries": LIBRARIES}
    for seed in ("0", "1"):
        done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=REPO, capture_output=True,
                              text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == key(refs, job)


@settings(deadline=None)
@given(files=chunk_files(), data=st.data())
def test_every_field_of_a_ref_is_part_of_the_key(job: JobConfig, files: list[tuple[SampleRef, int | None]],
                                                 data: st.DataObject) -> None:
    """The cached samples carry their refs (ids, label, entity, time, extra columns), so any
    field of any ref changing gives a new key. A new path does, even to a file of the same
    size and mtime."""
    index = data.draw(st.integers(0, len(files) - 1), label="index")
    name = data.draw(st.sampled_from(sorted(REF_CHANGES)), label="field")
    value = data.draw(REF_CHANGES[name], label="value")
    with tempfile.TemporaryDirectory() as folder:
        refs = lay_out(Path(folder), files)
        before, old = key(refs, job), refs[index]
        if name == "path":
            value = str(Path(folder) / value)
            if os.path.exists(old.path) and not os.path.exists(value):
                shutil.copy2(old.path, value)
        assume(getattr(old, name) != value)
        refs[index] = replace(old, **{name: value})
        assert key(refs, job) != before


@settings(deadline=None)
@given(files=chunk_files(), data=st.data())
def test_a_local_files_size_and_mtime_are_part_of_the_key(job: JobConfig, files: list[tuple[SampleRef, int | None]],
                                                          data: st.DataObject) -> None:
    """A local file is fingerprinted by stat: one that grows or shrinks, is touched, is
    deleted, or appears where there was none gives a new key."""
    index = data.draw(st.integers(0, len(files) - 1), label="index")
    size = files[index][1]
    change = data.draw(st.sampled_from(["size", "mtime", "deleted"] if size is not None else ["created"]),
                       label="change")
    with tempfile.TemporaryDirectory() as folder:
        refs = lay_out(Path(folder), files)
        before, path = key(refs, job), Path(refs[index].path)
        if change == "size":
            path.write_bytes(b"y" * data.draw(st.integers(0, 64).filter(lambda n: n != size), label="new size"))
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
        elif change == "mtime":
            mtime = MTIME_NS + 10**9 * data.draw(st.integers(-10**6, 10**6).filter(bool), label="seconds later")
            os.utime(path, ns=(mtime, mtime))
        elif change == "deleted":
            path.unlink()
        else:
            path.write_bytes(b"")
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
        assert key(refs, job) != before


@settings(deadline=None)
@given(names=st.lists(NAMES, min_size=1, max_size=5, unique=True), data=st.data())
def test_a_remote_files_listed_size_and_version_are_part_of_the_key(job: JobConfig, names: list[str],
                                                                   data: st.DataObject) -> None:
    """A remote file is fingerprinted by discovery's listing: a new size or version tag gives a
    new key. Entries for files outside the chunk do not count (the worker gets its own files'
    entries, the client the whole listing)."""
    urls = [f"s3://bucket/raw/{name}" for name in names]
    listed = {url: data.draw(LISTING, label=url) for url in urls}
    refs = [SampleRef(sample_id=f"s-{i}", source="photos", kind="image", path=url, relpath=url.rsplit("/", 1)[1])
            for i, url in enumerate(urls)]
    before = key(refs, job, listed=listed)
    others = {f"s3://bucket/other/{name}": data.draw(LISTING) for name in data.draw(st.lists(NAMES, max_size=3))}
    assert key(refs, job, listed={**others, **listed}) == before
    url = data.draw(st.sampled_from(urls), label="changed")
    entry = listed[url]
    changed = data.draw(st.builds(RawObject, size=st.integers(0, 2**40), version=st.just(entry.version))
                        | st.builds(RawObject, size=st.just(entry.size), version=TEXT), label="new entry")
    assume(changed != entry)
    assert key(refs, job, listed={**listed, url: changed}) != before


def test_a_remote_file_missing_from_the_listing_is_refused(job: JobConfig) -> None:
    """No listing entry, no fingerprint: the key is refused rather than made without one."""
    ref = SampleRef(sample_id="s-1", source="photos", kind="image", path="s3://bucket/raw/a.png", relpath="a.png")
    with pytest.raises(ValueError, match="s3://bucket/raw/a.png"):
        key([ref], job, listed={"s3://bucket/raw/b.png": RawObject(size=1, version="v")})


@settings(deadline=None)
@given(files=chunk_files().filter(lambda files: len(files) > 1), data=st.data())
def test_the_order_of_the_refs_is_part_of_the_key(job: JobConfig, files: list[tuple[SampleRef, int | None]],
                                                  data: st.DataObject) -> None:
    """A chunk is a run of the sorted ref table and its cached samples are in that order: the
    key names the sequence, so the same files in another order give another key (chunks never
    arrive reordered, so this costs no cache hit)."""
    with tempfile.TemporaryDirectory() as folder:
        refs = lay_out(Path(folder), files)
        shuffled = data.draw(st.permutations(refs), label="order")
        assume(shuffled != refs)
        assert key(shuffled, job) != key(refs, job)


@settings(deadline=None)
@given(libraries=st.dictionaries(NAMES, TEXT, min_size=1, max_size=4), data=st.data())
def test_every_library_version_is_part_of_the_key(job: JobConfig, libraries: dict[str, str],
                                                  data: st.DataObject) -> None:
    """A decoder upgrade can change the pixels: a library whose version changes, or that comes
    or goes, gives a new key."""
    refs = [SampleRef(sample_id="s-1", source="photos", kind="image", path="/nowhere/a.png", relpath="a.png")]
    before = key(refs, job, libraries)
    name = data.draw(st.sampled_from(sorted(libraries)), label="library")
    version = data.draw(TEXT.filter(lambda v: v != libraries[name]), label="version")
    assert key(refs, job, {**libraries, name: version}) != before
    assert key(refs, job, {k: v for k, v in libraries.items() if k != name}) != before
    added = data.draw(NAMES.filter(lambda n: n not in libraries), label="added")
    assert key(refs, job, {**libraries, added: version}) != before


def test_raising_the_cache_format_changes_every_key(job: JobConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """CACHE_FORMAT is raised when a reader or transform changes what a file turns into."""
    from packer.pipeline.spill import chunk_key

    refs = [SampleRef(sample_id="s-1", source="photos", kind="image", path="/nowhere/a.png", relpath="a.png")]
    before = key(refs, job)
    monkeypatch.setitem(chunk_key.__globals__, "CACHE_FORMAT", chunk_key.__globals__["CACHE_FORMAT"] + 1)
    assert key(refs, job) != before


def test_a_change_to_packers_code_changes_every_cache_key_but_not_the_manifest(job: JobConfig,
                                                                              tmp_path: Path) -> None:
    """Packer's version string stays 0.1.0 from commit to commit and CACHE_FORMAT is raised by hand,
    so the build cache keys on a digest of packer's source too: a packer whose code differs by one
    comment computes other keys (its decoded samples and verdicts are not reused), while a copy of
    the same code in another folder (a clone beside an editable install) computes the same keys,
    and the library versions the manifest records, which dataset_hash covers, do not change."""
    code = ("import json, sys\n"
            "from packer.config import load_job\n"
            "from packer.manifest import decoding_libraries, library_versions\n"
            "from packer.pipeline.filecache import unit_keys\n"
            "from packer.pipeline.spill import chunk_key\n"
            "from packer.records import SampleRef\n"
            "job = load_job(sys.argv[1])\n"
            "refs = [SampleRef(sample_id='s-1', source='photos', kind='image', path=sys.argv[2], relpath='a.png')]\n"
            "libraries = decoding_libraries()\n"
            "print(json.dumps({'chunk': chunk_key(refs, job, libraries),\n"
            "                  'unit': unit_keys(refs, job, libraries, group=False)[0].key,\n"
            "                  'manifest': library_versions()}))\n")
    (tmp_path / "a.png").write_bytes(b"x")

    def keys(root: Path) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", code, str(job.job_path), str(tmp_path / "a.png")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(root)})
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    for copy in ("same", "edited"):  # laid out as a wheel installs it: the schemas inside the package
        shutil.copytree(REPO / "packer", tmp_path / copy / "packer", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "schemas", tmp_path / copy / "packer" / "_schemas")
    with open(tmp_path / "edited" / "packer" / "read" / "image.py", "a") as fh:
        fh.write("# another packer\n")
    here, same, edited = keys(REPO), keys(tmp_path / "same"), keys(tmp_path / "edited")
    assert same == here
    assert edited["chunk"] != here["chunk"] and edited["unit"] != here["unit"]
    assert edited["manifest"] == here["manifest"] == {**here["manifest"], "packer": "0.1.0"}


def _tiled(job: JobConfig) -> JobConfig:
    """The demo job with the optional settings it leaves unset set: tiles, spacing, a fallback window."""
    return (job.with_settings("image", replace(job.image, tile_size=(32, 32), tile_stride=(16, 16)))
            .with_settings("dicom", replace(job.dicom, spacing=(0.5, 0.5), fallback_window=WindowSpec(
                kind="explicit", name="soft", center=40.0, width=400.0))))


@pytest.mark.parametrize("setting", sorted(PIXEL_SETTINGS))
@settings(deadline=None, max_examples=50)
@given(base=st.sampled_from(["demo", "tiled"]), data=st.data())
def test_every_setting_that_shapes_the_pixels_is_part_of_the_key(job: JobConfig, setting: str, base: str,
                                                                 data: st.DataObject) -> None:
    """Changing a source's reading settings, split.by (a time split makes a missing time a bad
    sample) or any transform setting, to a value the job's identity tells apart, gives a new key."""
    start = job if base == "demo" else _tiled(job)
    if setting.startswith("nifti."):  # the job has a NIfTI source: its settings are in the identity
        start = replace(start, recorded=(*start.recorded, "nifti"))
    changed = data.draw(PIXEL_SETTINGS[setting], label="edit")(start)
    assume(changed.identity() != start.identity())
    refs = [SampleRef(sample_id="s-1", source="photos", kind="image", path="/nowhere/a.png", relpath="a.png")]
    assert key(refs, changed) != key(refs, start)


@pytest.mark.parametrize("setting", sorted(OTHER_SETTINGS))
@settings(deadline=None, max_examples=20)
@given(data=st.data())
def test_settings_that_do_not_shape_the_pixels_keep_the_key(job: JobConfig, setting: str,
                                                            data: st.DataObject) -> None:
    """Split ratios and seed, packing, the output folder, the name, PHI handling and the like:
    changing them reuses every cached chunk."""
    changed = data.draw(OTHER_SETTINGS[setting], label="edit")(job)
    refs = [SampleRef(sample_id="s-1", source="photos", kind="image", path="/nowhere/a.png", relpath="a.png")]
    assert key(refs, changed) == key(refs, job)


@pytest.mark.parametrize("setting", sorted(VERDICT_SETTINGS))
@settings(deadline=None, max_examples=20)
@given(data=st.data())
def test_every_setting_that_decides_a_files_verdict_is_part_of_the_key(job: JobConfig, setting: str,
                                                                        data: st.DataObject) -> None:
    changed = data.draw(VERDICT_SETTINGS[setting], label="edit")(job)
    assume(changed != job)
    refs = [SampleRef(sample_id="s-1", source="photos", kind="image", path="/nowhere/a.png", relpath="a.png")]
    assert key(refs, changed) != key(refs, job)


def test_files_of_a_kind_that_works_per_file_are_chunks_of_their_own() -> None:
    """A NIfTI volume is seconds of work: each is a chunk alone (the workers share them one by one),
    and the content-defined chunks of the other files around them keep their rule."""
    ids = [f"s-{n:04d}" for n in range(40)]
    alone = [10 <= n < 14 for n in range(40)]
    bounds = chunk_bounds(ids, alone)
    assert [(a, b) for a, b in bounds if 10 <= a < 14] == [(10, 11), (11, 12), (12, 13), (13, 14)]
    assert [b for _, b in bounds][-1] == 40 and all(a < b for a, b in bounds)
    assert [a for a, _ in bounds[1:]] == [b for _, b in bounds[:-1]]  # contiguous, nothing lost
    plain = chunk_bounds(ids[:10])
    assert [(a, b) for a, b in bounds if b <= 10] == plain[:-1] + [(plain[-1][0], 10)]
