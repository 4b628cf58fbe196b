"""Discover: every raw file listed once, in a stable order, with labels and entities resolved."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import TypeVar

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import (
    _suffix,
    _walk_relpaths,
    discover,
    make_sample_id,
    normalize_time,
    source_relpaths,
)
from packer.pipeline.probe import check_identity, probe_ref
from packer.read.kinds import source_kind
from packer.records import Issue, SampleRef

T = TypeVar("T")


def make_tree(tmp_path: Path, rows: list[str], files: list[str], header: str = "path,label,entity,timestamp") -> Path:
    root = tmp_path / "raw"
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"\x89PNG fake")
    root.mkdir(exist_ok=True)
    (root / "labels.csv").write_text("\n".join([header, *rows]) + "\n")
    job = {"name": "t", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return tmp_path / "job.yaml"


def test_files_are_listed_sorted_with_table_values(tmp_path: Path) -> None:
    job = load_job(make_tree(tmp_path, ["b/2.png,dog,S2,2024-02-01,x", "a/1.png,cat,S1,2023-01-05,y"],
                             ["b/2.png", "a/1.png", "c/3.PNG"], header="path,label,entity,timestamp,site"))
    found = discover(job)
    refs, issues = found.refs, found.issues
    assert [r.relpath for r in refs] == ["a/1.png", "b/2.png", "c/3.PNG"]
    assert (refs[0].label, refs[0].entity, refs[0].time, refs[0].extra) == ("cat", "S1", "2023-01-05", (("site", "y"),))
    assert refs[2].label is None  # on disk but not in the table: reported as missing_label by check_identity
    assert refs[0].sample_id == make_sample_id("raw", "a/1.png")
    assert issues == []


def test_a_file_whose_name_no_table_cell_can_name_is_told_to_be_renamed(tmp_path: Path) -> None:
    """A backslash in a cell is read as a folder separator, and the table reader refuses a line
    break in a cell: files so named cannot be labelled. Their records said to add the row (which
    cannot work), and the row's said its file does not exist."""
    job = load_job(make_tree(tmp_path, ["ok.png,cat,S1,", "c\\d.png,dog,S2,"], ["ok.png", "c\\d.png", "a\nb.png"]))
    found = discover(job)
    table = tmp_path / "raw" / "labels.csv"
    for name, odd, read_as in (("c\\d.png", "a backslash", "a folder separator"),
                               ("a\nb.png", "a line break", "the end of the row")):
        assert found.unlabeled[str(tmp_path / "raw" / name)].endswith(
            f"no label: no row of {table} names {name!r}, and none can: its name holds {odd}, which a table cell "
            f"reads as {read_as}; rename the file (and its row)")
    (row,) = [i for i in found.issues if i.reason == "missing_file"]
    assert ("a backslash in the cell is read as a folder separator, and the root holds 'c\\\\d.png' itself"
            in row.message)


def test_table_row_without_file_is_a_missing_file_issue(tmp_path: Path) -> None:
    job = load_job(make_tree(tmp_path, ["a/1.png,cat,S1,", "gone.png,cat,S1,"], ["a/1.png"]))
    issues = discover(job).issues
    assert [(i.reason, i.stage) for i in issues] == [("missing_file", "discover")]
    assert "gone.png" in issues[0].message and "row 3" in issues[0].message


def test_row_numbers_are_the_lines_a_text_editor_shows(tmp_path: Path) -> None:
    # a blank line and a quoted line break: the records were counted, so every later message
    # pointed one or two lines above the row it meant
    rows = ["a/1.png,cat,S1,", "", '"a/2.png",dog,S2,', "b/3.png,cat,S3,\"2024-01-01\"", "gone.png,cat,S1,"]
    job = load_job(make_tree(tmp_path, rows, ["a/1.png", "a/2.png", "b/3.png"], header="path,label,entity,timestamp"))
    assert "row 6 lists 'gone.png'" in discover(job).issues[0].message
    rows = ['a/1.png,"cat",S1,', '"a/2.png",dog,"S\n2",', "gone.png,cat,S1,"]
    job = load_job(make_tree(tmp_path, rows, ["a/1.png", "a/2.png"], header="path,label,entity,timestamp"))
    assert "row 5 lists 'gone.png'" in discover(job).issues[0].message
    # blank lines above the header: the header was read as empty, and every row refused as
    # having more cells than it
    job = load_job(make_tree(tmp_path, rows, ["a/1.png", "a/2.png"], header="\n\npath,label,entity,timestamp"))
    assert "row 7 lists 'gone.png'" in discover(job).issues[0].message


@pytest.mark.parametrize(("rows", "header", "match"), [
    (["a.png,cat,S1,", "a.png,dog,S2,"], "path,label,entity,timestamp", "listed twice"),
    (["a.png,cat"], "path,label", "missing column"),
    ([",cat,S1,"], "path,label,entity,timestamp", "column 'path' is empty"),
    # an unquoted comma in a cell: the cells after it sat under the wrong columns, and the last
    # one was dropped without a word
    (["a.png,cat,S1,2024-01-01,Smith, J."], "path,label,entity,timestamp,reader",
     r"row 2 has 6 cells but the header names 5 columns \(cells past the last: ' J\.'\)"),
    # a last row cut short (an interrupted download): its missing label cells packed as blank (0)
    (["a.png,cat,S1,2024-01-01,x", "b.png,dog"], "path,label,entity,timestamp,reader",
     r"row 3 has 2 cells but the header names 5 columns \(no cell for 'entity', 'timestamp', 'reader'\); "
     "the row was cut short"),
    # a header and no rows (a cut download): every file was a missing_label, not one error
    ([], "path,label,entity,timestamp", r"the table has no rows \(its header: path, label, entity, timestamp\)"),
    # two columns of one name: the reader silently took the second one's labels
    (["a.png,cat,S1,,dog"], "path,label,entity,timestamp,label",
     r"column 'label' \(named by label\) is in the header 2 times, and only the last one's cells would be read"),
    # a column the job does not name, repeated (merged exports): each record kept the second one's
    # cells only, and the first one's reached no output, without a word
    (["a.png,cat,S1,,first,second"], "path,label,entity,timestamp,note,note",
     r"column 'note' is in the header 2 times, and only the last one's cells would be read \(each sample's record "
     r"keeps a column by its name\); rename all but one of them, e.g. note_2"),
])
def test_bad_tables_are_config_errors_naming_row_and_column(tmp_path: Path, rows: list[str], header: str,
                                                            match: str) -> None:
    job = load_job(make_tree(tmp_path, rows, ["a.png"], header=header))
    with pytest.raises(ConfigError, match=match):
        discover(job)


def test_a_misaligned_row_names_no_cell_under_phi_pseudonymization(tmp_path: Path) -> None:
    """The stray cells of a row with an unquoted separator were quoted as written (an MRN), before
    any name was known that the command's redaction could hide; under pseudonymization the error
    says how many, and the row."""
    from packer.phi import Pseudonymizer

    job = load_job(make_tree(tmp_path, ["a.png,cat,S1,2024-01-01,Doe, MRN0042"], ["a.png"],
                             header="path,label,entity,timestamp,reader"))
    with pytest.raises(ConfigError, match=r"row 2 has 6 cells but the header names 5 columns \(cells past the "
                                          r"last: 1 not empty; not shown under PHI pseudonymization\)") as refused:
        discover(job, Pseudonymizer(mode="pseudonymize", dates="shift", key=b"k" * 32))
    assert "MRN0042" not in str(refused.value)


def test_a_row_without_the_header_s_trailing_unnamed_column_is_read(tmp_path: Path) -> None:
    """A header ending in a comma (NIH's Data_Entry_2017.csv) names an unnamed empty column; a row
    that lacks that one cell is whole, not cut short."""
    job = load_job(make_tree(tmp_path, ["a.png,cat,S1,,", "b.png,dog,S2,"], ["a.png", "b.png"],
                             header="path,label,entity,timestamp,"))
    found = discover(job)
    assert not found.issues and sorted(r.label for r in found.refs) == ["cat", "dog"]



@pytest.mark.parametrize("header", [",path,label,entity,timestamp,", ",path,label,entity,timestamp,,"])
def test_an_index_column_and_trailing_commas_are_no_repeated_columns(tmp_path: Path, header: str) -> None:
    """A pandas index (an unnamed first column) beside a header's trailing commas names the
    column "" more than once: no job names those, so they are not refused as repeated columns."""
    extra = "," * header.count(",", header.rindex("timestamp"))
    job = load_job(make_tree(tmp_path, [f"0,a.png,cat,S1,{extra}", f"1,b.png,dog,S2,{extra}"], ["a.png", "b.png"],
                             header=header))
    found = discover(job)
    assert not found.issues and sorted(r.label for r in found.refs) == ["cat", "dog"]

def test_missing_root_is_a_config_error(tmp_path: Path) -> None:
    path = make_tree(tmp_path, [], [])
    job = load_job(path)
    (tmp_path / "raw" / "labels.csv").rename(tmp_path / "labels.csv")
    (tmp_path / "raw").rmdir()
    with pytest.raises(ConfigError, match="does not exist"):
        discover(job)


def test_a_root_with_no_raw_files_is_a_config_error_saying_what_was_looked_for(tmp_path: Path) -> None:
    job = load_job(make_tree(tmp_path, [], []))  # the table alone: a typo'd root would build an empty dataset
    with pytest.raises(ConfigError) as caught:
        discover(job)
    # the job file and the source's place in it, as a schema error names them
    assert str(caught.value) == (f"{tmp_path / 'job.yaml'}: sources[0].root (source 'raw'): no image files under "
                                 f"{tmp_path / 'raw'} (root: 'raw', relative to the job file); looked for files named "
                                 "*.png, *.jpg, *.jpeg, *.tif, *.tiff, *.bmp, in subfolders too. Check the root, or "
                                 "remove the source from the job")
    (tmp_path / "ct").mkdir()
    (tmp_path / "ct" / "notes.txt").write_text("DICM" * 40)  # text is never DICOM, preamble or not
    dicom = replace(job, sources=(replace(job.sources[0], kind="dicom", name="ct", root=tmp_path / "ct",
                                          root_spec="ct", table=None),))
    with pytest.raises(ConfigError, match=r"job.yaml: sources\[0\].root \(source 'ct'\): no dicom files under "
                                          r".*looked for \*.dcm files, or other files \(not images, tables or "
                                          r"text\) that start with the DICOM"):
        discover(dicom)
    (tmp_path / "ct" / "notes.txt").rename(tmp_path / "ct.d")
    (tmp_path / "ct").rmdir()
    (tmp_path / "ct.d").rename(tmp_path / "ct")  # now a file where the root folder should be
    with pytest.raises(ConfigError, match=f"sources\\[0\\].root \\(source 'ct'\\): folder {tmp_path / 'ct'} is a file, "
                                          "not a folder"):
        discover(dicom)


def test_dicom_listing_uses_suffix_or_preamble(tmp_path: Path) -> None:
    (tmp_path / "a.dcm").write_bytes(b"anything")
    (tmp_path / "IM0001").write_bytes(b"\0" * 128 + b"DICM" + b"rest")
    (tmp_path / "notes").write_bytes(b"hello")
    (tmp_path / ".hidden.dcm").write_bytes(b"x")
    assert source_relpaths(source_kind("dicom"), tmp_path) == ["IM0001", "a.dcm"]


def test_identity_checks_in_order() -> None:
    base = SampleRef(sample_id="s-1", source="s", kind="image", path="/r/1.png", relpath="1.png")
    assert check_identity(base, needs_time=False).reason == "missing_label"
    labelled = replace(base, label="a")
    assert check_identity(labelled, needs_time=False).reason == "missing_entity"
    with_entity = replace(labelled, entity="E")
    assert check_identity(with_entity, needs_time=False) is None
    assert check_identity(with_entity, needs_time=True).reason == "missing_time"
    # an unreadable cell reads as none: the message says which forms are read, and why 05/03/2024 is not
    assert normalize_time("05/03/2024") is None and normalize_time("2024-03-05T14:30") == "2024-03-05T14:30:00"
    assert "not ISO 8601 (2024-03-05 or 2024-03-05T14:30; a day/month order such as 05/03/2024 is ambiguous" in \
        check_identity(with_entity, needs_time=True).message


def test_a_dicom_file_without_entity_or_time_is_told_which_header_attributes_to_fill() -> None:
    """A DICOM source has no table cell: its records name the keywords its header lacked."""
    ref = SampleRef(sample_id="s-1", source="s", kind="dicom", path="/r/IM1", relpath="IM1", label="a")
    header = ("PatientID", ("StudyDate", "StudyTime"))
    entity = check_identity(ref, needs_time=True, header=header)
    assert entity.reason == "missing_entity" and "header's PatientID" in entity.message
    # and what to do, as the missing_time record says: fill the attribute or name another one
    assert "fill PatientID" in entity.message and "set the source's entity:" in entity.message
    table = check_identity(replace(ref, kind="image"), needs_time=False)
    assert table.reason == "missing_entity" and "give this file an entity" in table.message
    time = check_identity(replace(ref, entity="E"), needs_time=True, header=header)
    assert time.reason == "missing_time" and "StudyDate, StudyTime" in time.message and "cell" not in time.message


@pytest.mark.parametrize(("raw", "iso"), [("2024-01-02", "2024-01-02"), ("2024-01-02T03:04:05", "2024-01-02T03:04:05"),
                                          ("2024-01-02 03:04", "2024-01-02T03:04:00"), ("", None), ("soon", None)])
def test_normalize_time(raw: str, iso: str | None) -> None:
    assert normalize_time(raw) == iso


def test_paths_leaving_the_root_are_outside_root_issues(tmp_path: Path) -> None:
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"\x89PNG fake")
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "../secret.png,cat,S2,", "link.png,cat,S3,"], ["a.png"])
    (tmp_path / "raw" / "link.png").symlink_to(outside)
    found = discover(load_job(job_path))
    refs, issues = found.refs, found.issues
    assert [r.relpath for r in refs] == ["a.png"]
    assert sorted((i.reason, Path(i.path).name) for i in issues) == [("outside_root", "link.png"),
                                                                      ("outside_root", "secret.png")]
    allowed = yaml.safe_load(job_path.read_text())
    allowed["safety"] = {"outside_root": "allow"}
    job_path.write_text(yaml.safe_dump(allowed))
    found = discover(load_job(job_path))
    refs, issues = found.refs, found.issues
    assert sorted(r.relpath for r in refs) == ["../secret.png", "a.png", "link.png"] and issues == []


def test_absolute_table_paths_under_the_root_name_their_files(tmp_path: Path) -> None:
    # a table made by a glob holds absolute paths: each was an outside_root record ("leaves the
    # source root") while its file, under the root, was a missing_label one: two bad records,
    # both wrong, for one good file
    root = tmp_path / "raw"
    (tmp_path / "secret.png").write_bytes(b"\x89PNG fake")
    rows = [f"{root}/a/1.png,cat,S1,", "../raw/b/2.png,dog,S2,", f"{tmp_path}/secret.png,cat,S3,"]
    found = discover(load_job(make_tree(tmp_path, rows, ["a/1.png", "b/2.png"])))
    assert [(r.relpath, r.label) for r in found.refs] == [("a/1.png", "cat"), ("b/2.png", "dog")]
    assert [(i.reason, Path(i.path).name) for i in found.issues] == [("outside_root", "secret.png")]


def test_links_inside_the_root_and_a_linked_root_stay_in_while_linked_folders_are_not_entered(
        tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far.png").write_bytes(b"\x89PNG fake")
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "alias.png,cat,S2,"], ["a.png"])
    root = tmp_path / "raw"
    (root / "alias.png").symlink_to(root / "a.png")  # a link that stays under the root
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)  # a folder link: not followed, and said
    (root / "sub").mkdir()
    (root / "again").symlink_to(root / "sub", target_is_directory=True)  # inside the root: its files are listed
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png", "alias.png"]
    (issue,) = found.issues
    assert (issue.reason, issue.path) == ("outside_root", str(root / "linked"))
    assert f"a link to the folder {elsewhere}, outside the source root" in issue.message
    assert "its files were not read" in issue.message and (root / "linked" / "far.png").exists()
    (root / "linked").unlink()
    # the root itself reached through a link: files under it are inside
    (tmp_path / "root-link").symlink_to(root, target_is_directory=True)
    doc = yaml.safe_load(job_path.read_text())
    doc["sources"][0].update(root="root-link", table="root-link/labels.csv")
    job_path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png", "alias.png"] and found.issues == []


def test_a_link_into_a_hidden_folder_of_the_root_lists_its_files_at_the_links_paths(tmp_path: Path) -> None:
    """raw/cat -> raw/.store/cat, as caches and annexes lay files out: the walk skips hidden
    folders and did not enter folder links inside the root ("listed at their own paths"), so the
    files were in no listing, no record, nowhere. They are listed at the link's paths, each such
    folder once, even through a loop of links."""
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "cat/x.png,cat,S2,", "cat/deep/y.png,cat,S3,"],
                         ["a.png", ".store/cat/x.png", ".store/cat/deep/y.png"])
    root = tmp_path / "raw"
    (root / "cat").symlink_to(".store/cat", target_is_directory=True)
    (root / ".store" / "cat" / "deep" / "up").symlink_to("..", target_is_directory=True)  # a loop
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png", "cat/deep/y.png", "cat/x.png"]
    assert [r.label for r in found.refs] == ["cat"] * 3 and found.issues == []


def test_absolute_cells_name_their_files_when_the_root_is_named_through_a_link(tmp_path: Path) -> None:
    """root: raw where raw -> real (as /data -> /mnt/nfs/data often is), and a table made by a glob
    of the root as the job names it: '<dir>/raw/a.png'. The root's path is resolved (real), so
    each such row was outside_root and its file a missing_label; every row so written stopped
    the build. A link to a file inside the root is still a file of its own."""
    job_path = make_tree(tmp_path, [], ["a.png"])
    (tmp_path / "raw").rename(tmp_path / "real")
    (tmp_path / "raw").symlink_to("real", target_is_directory=True)
    (tmp_path / "real" / "alias.png").symlink_to("a.png")
    (tmp_path / "real" / "labels.csv").write_text(
        f"path,label,entity,timestamp\n{tmp_path}/raw/a.png,cat,S1,\n{tmp_path}/raw/alias.png,dog,S2,\n")
    found = discover(load_job(job_path))
    assert found.issues == []
    assert [(r.relpath, r.label) for r in found.refs] == [("a.png", "cat"), ("alias.png", "dog")]


def test_with_outside_root_allowed_a_link_back_up_the_tree_lists_each_file_once(tmp_path: Path) -> None:
    # a/loop -> .. : followed, it was walked lap after lap until the path got too long, and
    # every file became ~40 samples (a/loop/a/loop/.../x.png), each without a label row
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far.png").write_bytes(b"\x89PNG fake")
    (elsewhere / "back").symlink_to(elsewhere, target_is_directory=True)  # a loop outside the root too
    job_path = make_tree(tmp_path, ["a/1.png,cat,S1,", "far/far.png,cat,S2,"], ["a/1.png"])
    root = tmp_path / "raw"
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)
    (root / "far").symlink_to(elsewhere, target_is_directory=True)
    doc = yaml.safe_load(job_path.read_text())
    doc["safety"] = {"outside_root": "allow"}
    job_path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a/1.png", "far/far.png"] and found.issues == []


@pytest.mark.parametrize("outside_root", ["reject", "allow"])
def test_a_class_folder_linked_to_another_under_the_root_is_left_out_file_by_file_and_said(
        tmp_path: Path, outside_root: str) -> None:
    """data/kitty -> cat: its files were neither packed, nor bad, nor left out, and nothing said
    so (with outside_root: allow too, where the walk enters each real folder once). Packing them
    twice would put the same bytes in two classes; each path through the link is a folder_link
    record naming the link and the folder its files are packed from, and the class it would
    have been is warned of."""
    root = tmp_path / "data"
    for name in ("cat/c0.png", "cat/c1.png", "dog/d0.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"\x89PNG fake")
    (root / "kitty").symlink_to("cat", target_is_directory=True)
    job = {"name": "t", "sources": [{"kind": "image", "root": "data", "label": "folder"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out",
           "safety": {"outside_root": outside_root}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert [(r.relpath, r.label) for r in found.refs] == [("cat/c0.png", "cat"), ("cat/c1.png", "cat"),
                                                          ("dog/d0.png", "dog")]
    assert found.issues == []
    linked = [e for e in found.excluded if e.why == "folder_link"]
    assert [e.path for e in linked] == [f"{root}/kitty/c0.png", f"{root}/kitty/c1.png"]
    assert f"{root}/kitty and {root}/cat are one folder" in linked[0].detail
    assert f"packed once, as {root}/cat/c0.png" in linked[0].detail
    assert linked[0].sample_id == make_sample_id("data", "kitty/c0.png")
    (said,) = [w for w in found.warnings if "kitty" in w]
    assert "'kitty' -> 'cat' (2 file(s))" in said and "why folder_link" in said


def test_sample_ids_are_keyed_when_pseudonymizing() -> None:
    from packer.phi import Pseudonymizer

    one = Pseudonymizer(mode="pseudonymize", dates="shift", key=b"k" * 32)
    two = Pseudonymizer(mode="pseudonymize", dates="shift", key=b"j" * 32)
    plain = make_sample_id("ct", "MRN12345/IM1.dcm")
    keyed = make_sample_id("ct", "MRN12345/IM1.dcm", one)
    assert keyed != plain and keyed != make_sample_id("ct", "MRN12345/IM1.dcm", two)
    assert keyed == make_sample_id("ct", "MRN12345/IM1.dcm", one) and keyed.startswith("ct-")


def test_colliding_sample_ids_are_made_unique_deterministically() -> None:
    from packer.pipeline.discover import unique_ids

    refs = [SampleRef(sample_id="s-1", source="s", kind="image", path=f"/r/{n}.png", relpath=f"{n}.png")
            for n in ("a", "b", "c")]
    fixed, said = unique_ids(refs)
    assert [r.sample_id for r in fixed] == ["s-1", "s-1-dup2", "s-1-dup3"]
    assert said == ["sample id s-1 of /r/b.png collides with /r/a.png; using s-1-dup2",
                    "sample id s-1 of /r/c.png collides with /r/a.png; using s-1-dup3"]


def test_a_sample_id_collision_is_a_build_warning_kept_in_warnings_jsonl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The renaming of a colliding sample id was a Python UserWarning, printed with packer's own
    file and line and missing from warnings.jsonl, which holds every warning a build prints."""
    import hashlib
    import warnings

    import cv2
    import numpy as np

    from packer.buildwarnings import read_warnings
    from packer.pipeline import discover as discovering
    from packer.pipeline.build import BuildOptions, build

    def by_name(source: str, relpath: str, phi: object = None) -> str:  # a hash collision: one id per file name
        return f"{source}-{hashlib.sha256(relpath.rsplit('/', 1)[-1].encode()).hexdigest()[:16]}"

    job_path = make_tree(tmp_path, ["a/x.png,cat,S1,", "b/x.png,dog,S2,"], ["a/x.png", "b/x.png"])
    for seed, rel in enumerate(["a/x.png", "b/x.png"]):
        cv2.imwrite(str(tmp_path / "raw" / rel), np.random.default_rng(seed).integers(0, 255, (16, 16), np.uint8))
    monkeypatch.setattr(discovering, "make_sample_id", by_name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = build(load_job(job_path), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    kept = read_warnings(result.version_dir / "warnings.jsonl")
    collided = [w for w in kept if "collides with" in w.message]
    assert len(collided) == 1 and collided[0].code == "entities"
    assert collided[0].message.endswith("-dup2")
    assert f"packer: warning: {load_job(job_path).name}: {collided[0].message}" in capsys.readouterr().err


def test_labels_outside_the_jobs_label_list_name_their_row(tmp_path: Path) -> None:
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "b.png,dgo,S2,"], ["a.png", "b.png"])
    doc = yaml.safe_load(job_path.read_text())
    doc["labels"] = ["cat", "dog"]
    job_path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job_path))
    refs, issues = found.refs, found.issues
    assert [r.relpath for r in refs] == ["a.png"]
    assert [(i.reason, i.stage) for i in issues] == [("unknown_label", "discover")]
    assert "row 3, column 'label'" in issues[0].message and "'dgo'" in issues[0].message


def test_file_urls_list_the_same_files_as_paths(tmp_path: Path) -> None:
    path_job = load_job(make_tree(tmp_path, ["a/1.png,cat,S1,2023-01-05", "gone.png,dog,S2,"], ["a/1.png", "b.png"]))
    doc = yaml.safe_load((tmp_path / "job.yaml").read_text())
    doc["sources"][0].update(root=f"file://{tmp_path}/raw", table=f"file://{tmp_path}/raw/labels.csv")
    (tmp_path / "url").mkdir()
    (tmp_path / "url" / "job.yaml").write_text(yaml.safe_dump(doc))
    url_job = load_job(tmp_path / "url" / "job.yaml")
    assert url_job.sources[0].root == path_job.sources[0].root == (tmp_path / "raw").resolve()
    found = discover(url_job)
    refs, issues = found.refs, found.issues
    assert found == discover(path_job) and found.listed == {}  # local files: nothing remote is listed
    assert [r.path for r in refs] == [str(tmp_path / "raw" / "a" / "1.png"), str(tmp_path / "raw" / "b.png")]
    assert [i.reason for i in issues] == ["missing_file"]


@given(st.lists(st.text(alphabet="ab.C", min_size=1, max_size=6).filter(lambda name: name not in (".", "..")),
                min_size=1, max_size=3))
def test_the_string_suffix_is_paths_suffix(parts: list[str]) -> None:  # parts as a walk gives them: no . or ..
    relpath = "/".join(parts)
    assert _suffix(relpath) == PurePosixPath(relpath).suffix.lower()


def test_the_walk_lists_relative_posix_paths_sorted_without_hidden_files(tmp_path: Path) -> None:
    for rel in ["b/z.png", "b/a b.dcm", "a.png", ".hidden/x.png", "c/.x.png", "c/d/e.jpg", "B.png"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    walked = _walk_relpaths(tmp_path)
    assert walked == ["B.png", "a.png", "b/a b.dcm", "b/z.png", "c/d/e.jpg"]
    assert walked == sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(tmp_path).parts))


def test_a_missing_label_table_names_the_job_file_and_the_key_that_names_the_table(tmp_path: Path) -> None:
    job = load_job(make_tree(tmp_path, ["a/1.png,cat,S1,2023-01-05"], ["a/1.png"]))
    (tmp_path / "raw" / "labels.csv").unlink()
    with pytest.raises(ConfigError) as caught:
        discover(job)
    assert str(caught.value).startswith(f"{tmp_path / 'job.yaml'}: sources[0].table (source 'raw'): "
                                         f"{tmp_path / 'raw' / 'labels.csv'}: cannot read the table")


def test_a_row_naming_a_link_to_a_folder_outside_the_root_is_one_record_saying_both(tmp_path: Path) -> None:
    """Row 'case50', a link to a study folder of another export: the link's outside_root record and
    the row's missing_file record (a folder, not a file) both had the link's sample id, so the one
    path was counted as two input files and two bad samples, doubling the bad fraction."""
    elsewhere = tmp_path / "other-export" / "case50"
    elsewhere.mkdir(parents=True)
    (elsewhere / "a.png").write_bytes(b"\x89PNG fake")
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "case50,cat,S2,"], ["a.png"])
    root = tmp_path / "raw"
    (root / "case50").symlink_to(elsewhere, target_is_directory=True)
    (root / "unnamed").symlink_to(elsewhere, target_is_directory=True)  # no row names it: its own record
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png"]
    assert sorted((i.reason, i.path) for i in found.issues) == [
        ("missing_file", str(root / "case50")), ("outside_root", str(root / "unnamed"))]
    assert len({i.sample_id for i in found.issues}) == 2
    (row,) = [i for i in found.issues if i.reason == "missing_file"]
    assert f"row 3, column 'path': 'case50' is the folder {root / 'case50'}, not a file" in row.message
    assert f"it is a link to the folder {elsewhere}, outside the source root, so none of its files was read: " \
           "move them in, or set safety.outside_root: allow" in row.message


def test_a_mask_or_channel_file_linked_from_outside_the_root_is_outside_root(tmp_path: Path) -> None:
    # the image itself is checked for a link leaving the root; the files its row names beside it (a
    # label map, a case's other sequences) were opened wherever their links led
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "m.png").write_bytes(b"\x89PNG fake")
    (secret / "masks").mkdir()
    (secret / "masks" / "b.png").write_bytes(b"\x89PNG fake")
    job_path = make_tree(tmp_path, ["a.png,cat,S1,,link.png", "b.png,cat,S2,,masks/b.png", "c.png,cat,S3,,own.png"],
                         ["a.png", "b.png", "c.png", "own.png"], header="path,label,entity,timestamp,mask")
    root = tmp_path / "raw"
    (root / "link.png").symlink_to(secret / "m.png")  # the file is a link out
    (root / "masks").symlink_to(secret / "masks", target_is_directory=True)  # a folder on its way is
    doc = yaml.safe_load(job_path.read_text())
    doc["sources"][0]["mask"] = {"column": "mask"}
    job_path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["c.png"]
    assert sorted((i.reason, Path(i.path).name) for i in found.issues) == [
        ("outside_root", "a.png"), ("outside_root", "b.png"), ("outside_root", "masks")]  # masks: the folder link
    assert any("link.png" in i.message and "outside the source root" in i.message for i in found.issues)
    doc["safety"] = {"outside_root": "allow"}  # on purpose: read them
    job_path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png", "b.png", "c.png"]


def test_a_root_whose_every_file_name_is_not_utf8_says_so_not_that_there_are_no_files(tmp_path: Path) -> None:
    """Every class folder a Latin-1 name (caf\\xe9/0.png): the error said "no image files under
    raw ... Check the root", though the folder held the images, named in a form no record holds."""
    job = yaml.safe_load(make_tree(tmp_path, ["a.png,cat,S1,"], ["a.png"]).read_text())
    folder = os.fsencode(tmp_path / "latin") + b"/caf\xe9"
    os.makedirs(folder)
    for i in range(2):
        with open(folder + b"/%d.png" % i, "wb") as fh:
            fh.write(b"\x89PNG fake")
    job["sources"] = [{"kind": "image", "root": str(tmp_path / "latin"), "label": "folder", "entity": "image"}]
    job_path = tmp_path / "latin.yaml"
    job_path.write_text(yaml.safe_dump(job))
    with pytest.raises(ConfigError) as err:
        discover(load_job(job_path))
    message = str(err.value)
    assert "has a name that is not valid UTF-8 (2 file(s), e.g. '" in message and "caf\\xe9/" in message, message
    assert "no image files" not in message and "convmv" in message
    for i in range(3):  # beside files of a format it does not read, the usual message says both
        (tmp_path / "latin" / f"{i}.webp").write_bytes(b"RIFF....WEBP")
    with pytest.raises(ConfigError) as err:
        discover(load_job(job_path))
    message = str(err.value)
    assert "no image files under" in message and "2 file(s) whose names are not valid UTF-8" in message, message
    assert "3 .webp" in message


def test_a_file_name_that_is_not_utf8_is_an_unreadable_sample_named_with_its_bytes_escaped(tmp_path: Path) -> None:
    # A Latin-1 name from an old export (b"caf\xe9.png") used to crash discovery with a
    # UnicodeEncodeError (exit 1) when its sample id was hashed: a bad file must be a record.
    job_path = make_tree(tmp_path, ["a.png,cat,S1,"], ["a.png"])
    latin1 = os.fsencode(tmp_path / "raw") + b"/caf\xe9.png"
    with open(latin1, "wb") as fh:
        fh.write(b"\x89PNG fake")
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png"]
    assert [(i.reason, i.stage, Path(i.path).name) for i in found.issues] == [
        ("unreadable", "discover", "caf\\xe9.png")]
    issue = found.issues[0]
    json.dumps(issue.to_json(), ensure_ascii=False).encode("utf-8")  # writable as bad_samples.jsonl is
    assert "the file name 'caf\\xe9.png' is not valid UTF-8" in issue.message and "rename" in issue.message
    # a file whose valid name is that escaped text, with a real backslash, is another sample
    (tmp_path / "raw" / "caf\\xe9.png").write_bytes(b"\x89PNG fake")
    found_too = discover(load_job(job_path))
    assert sorted(r.relpath for r in found_too.refs) == ["a.png", "caf\\xe9.png"]
    (unreadable,) = [i for i in found_too.issues if i.reason == "unreadable"]
    assert unreadable.sample_id not in {r.sample_id for r in found_too.refs}
    (tmp_path / "raw" / "caf\\xe9.png").unlink()
    # a files: table source: no table row can name it, so it is not in the table, never bad
    doc = yaml.safe_load(job_path.read_text())
    doc["sources"][0]["table"] = {"file": "raw/labels.csv", "files": "table"}
    job_path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png"] and found.issues == []
    assert [(e.why, Path(e.path).name) for e in found.excluded] == [("not_in_table", "caf\\xe9.png")]


def _within(seconds: float, fifo: Path, call: Callable[[], T]) -> T:
    """``call()``'s result, failing the test when it has not returned in ``seconds`` (it is then
    blocked opening ``fifo``: a writer opened and closed here lets it return)."""
    out: list[T] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail(f"blocked on the named pipe {fifo.name}")
    return out[0]


def test_links_in_a_loop_are_left_to_the_read_to_call_unreadable(tmp_path: Path) -> None:
    # l1.png -> l2.png -> l1.png: resolving it raised RuntimeError ("Symlink loop") out of
    # discovery, and the build exited 1 with a traceback
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "l1.png,cat,S2,", "self.png,cat,S3,"], ["a.png"])
    root = tmp_path / "raw"
    (root / "l1.png").symlink_to("l2.png")
    (root / "l2.png").symlink_to("l1.png")
    (root / "self.png").symlink_to("self.png")
    job = load_job(job_path)
    found = discover(job)
    assert [r.relpath for r in found.refs] == ["a.png", "l1.png", "l2.png", "self.png"]
    assert found.issues == []  # l2.png has no row: check_identity makes it missing_label
    loop = next(r for r in found.refs if r.relpath == "l1.png")
    issue = probe_ref(loop, job)
    assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("unreadable", "read")


def test_a_named_pipe_named_like_an_image_is_unreadable_and_nothing_waits_on_it(tmp_path: Path) -> None:
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "pipe.png,cat,S2,"], ["a.png"])
    fifo = tmp_path / "raw" / "pipe.png"
    os.mkfifo(fifo)
    job = load_job(job_path)
    ref = next(r for r in discover(job).refs if r.relpath == "pipe.png")
    issue = _within(10, fifo, lambda: probe_ref(ref, job))
    assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("unreadable", "read")
    assert "named pipe" in issue.message


def test_a_device_named_like_an_image_is_not_said_to_wait_for_a_writer(tmp_path: Path) -> None:
    """A link to /dev/zero (under outside_root: allow) is unreadable; its message said "reading
    would wait for a writer", the named pipe's reason, which a device is not."""
    from packer.pipeline.probe import _not_a_file

    ref = SampleRef(sample_id="s", source="raw", kind="image", path="/dev/zero", relpath="zero.png")
    issue = _not_a_file(ref)
    assert isinstance(issue, Issue) and issue.reason == "unreadable"
    assert "a device" in issue.message and "wait for a writer" not in issue.message


def test_a_named_pipe_among_dicom_files_without_a_suffix_does_not_hang_the_listing(tmp_path: Path) -> None:
    (tmp_path / "IM0001").write_bytes(b"\0" * 128 + b"DICM" + b"rest")
    os.mkfifo(tmp_path / "IM0002")  # sniffing its head opened it for reading: it waited for a writer
    relpaths = _within(10, tmp_path / "IM0002", lambda: source_relpaths(source_kind("dicom"), tmp_path))
    # listed unread, as IM0002.dcm would be: the read calls it unreadable (a named pipe), never waiting on it
    assert relpaths == ["IM0001", "IM0002"]


def _deny(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """Make ``locked`` behave as a folder without read and execute permission for this user (the
    suite may run as root, for whom chmod 000 changes nothing): listing it and looking at anything
    under it fail with EACCES, as they do for an ordinary user."""
    import errno

    real_scandir, real_stat = os.scandir, os.stat
    under = str(locked)

    def blocked(path: object) -> bool:
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        return text == under or text.startswith(under + os.sep)

    def scandir(path: object = ".") -> object:
        if blocked(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))  # type: ignore[arg-type]
        return real_scandir(path)  # type: ignore[arg-type]

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        if text.startswith(under + os.sep):  # the folder itself can be stat'ed; what is inside cannot
            raise PermissionError(errno.EACCES, "Permission denied", text)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat)


def test_a_folder_that_cannot_be_listed_is_a_bad_sample_and_its_rows_do_not_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A locked folder (chmod 000) was skipped by the walk without a word (its unrowed files were
    silently missing), and a table row naming a file in it crashed discovery with PermissionError
    from Path.is_dir()."""
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "locked/in.png,cat,S2,"],
                         ["a.png", "locked/in.png", "locked/unrowed.png"])
    _deny(monkeypatch, tmp_path / "raw" / "locked")
    found = discover(load_job(job_path))
    assert [r.relpath for r in found.refs] == ["a.png"]
    by_path = {i.path: i for i in found.issues}
    folder = by_path[str(tmp_path / "raw" / "locked")]
    assert (folder.reason, folder.stage) == ("unreadable", "discover")
    assert "cannot be listed (Permission denied), so none of its files was read" in folder.message
    assert "chmod a+rx" in folder.message
    row = by_path[str(tmp_path / "raw" / "locked" / "in.png")]
    assert row.reason == "unreadable" and "row 3 lists 'locked/in.png'" in row.message
    assert "not readable by this user" in row.message


def test_walk_names_each_folder_it_cannot_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a/1.png", "a/locked/2.png", "b/3.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    _deny(monkeypatch, tmp_path / "a" / "locked")
    unlisted: list[tuple[str, OSError]] = []
    assert _walk_relpaths(tmp_path, unlisted=unlisted) == ["a/1.png", "b/3.png"]
    assert [(rel, err.errno, err.strerror) for rel, err in unlisted] == [
        ("a/locked", errno.EACCES, "Permission denied")]


def test_a_file_behind_a_folder_without_permission_is_not_called_outside_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lstat of a file in a folder one may read but not enter fails with EACCES: that said
    outside_root, "resolves to <itself>, outside the source root"; reading it says unreadable."""
    import errno

    from packer.pipeline.discover import _outside_root

    path = tmp_path / "rdonly" / "in.png"

    def denied(self: Path) -> bool:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_symlink", denied)
    assert _outside_root(path, tmp_path) is False


def test_a_dangling_or_looping_link_is_named_as_a_link(tmp_path: Path) -> None:
    """A link to a file that does not exist said "file not found; it was listed but is gone,
    re-run discovery", and a link to itself "check it and its permissions": the fix is the link."""
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "dangling.png,cat,S2,", "self.png,cat,S3,"], ["a.png"])
    root = tmp_path / "raw"
    (root / "dangling.png").symlink_to("nope.png")
    (root / "self.png").symlink_to("self.png")
    job = load_job(job_path)
    refs = {r.relpath: r for r in discover(job).refs}
    dangling = probe_ref(refs["dangling.png"], job)
    assert isinstance(dangling, Issue) and dangling.reason == "missing_file"
    assert "a symbolic link to nope.png, which does not exist; fix the link or remove it" in dangling.message
    looping = probe_ref(refs["self.png"], job)
    assert isinstance(looping, Issue) and looping.reason == "unreadable"
    assert "a symbolic link to self.png that leads back to itself" in looping.message


def test_a_broken_absolute_link_is_a_missing_file_not_outside_the_root(tmp_path: Path) -> None:
    """cat/x.png -> /nonexistent/abs/x.png (a tree copied from another machine) said outside_root,
    "move the file in, or set safety.outside_root: allow": there is no file to move, and allowing
    it reads nothing. A broken link is missing_file, naming its target, the image's own or a mask."""
    gone = tmp_path / "elsewhere" / "nope"  # outside the root, and not there
    job_path = make_tree(tmp_path, ["x.png,cat,S2,,xm.png", "b.png,cat,S3,,m.png"], ["b.png", "xm.png"],
                         header="path,label,entity,timestamp,mask")
    root = tmp_path / "raw"
    (root / "x.png").symlink_to(gone / "x.png")
    (root / "m.png").symlink_to(gone / "m.png")
    doc = yaml.safe_load(job_path.read_text())
    doc["sources"][0]["mask"] = {"column": "mask"}
    job_path.write_text(yaml.safe_dump(doc))
    job = load_job(job_path)
    found = discover(job)
    assert [i.reason for i in found.issues if i.reason == "outside_root"] == []
    (mask,) = [i for i in found.issues if Path(i.path).name == "b.png"]
    assert mask.reason == "mask_missing"
    assert f"a symbolic link to {gone / 'm.png'}, which does not exist" in mask.message
    issue = probe_ref(next(r for r in found.refs if r.relpath == "x.png"), job)
    assert isinstance(issue, Issue) and issue.reason == "missing_file"
    assert f"a symbolic link to {gone / 'x.png'}, which does not exist" in issue.message


def test_a_file_gone_after_discovery_says_how_it_can_happen_not_re_run_discovery(tmp_path: Path) -> None:
    """'it was listed but is gone, re-run discovery': packer has no discovery to re-run; the file
    was removed during the build, or a cluster's worker does not see it."""
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "b.png,cat,S2,"], ["a.png", "b.png"])
    job = load_job(job_path)
    refs = {r.relpath: r for r in discover(job).refs}
    (tmp_path / "raw" / "b.png").unlink()
    gone = probe_ref(refs["b.png"], job)
    assert isinstance(gone, Issue) and gone.reason == "missing_file"
    assert "re-run discovery" not in gone.message
    assert "removed or moved while the build ran" in gone.message and "every worker" in gone.message


def test_a_row_through_a_link_to_a_folder_inside_the_root_is_told_the_real_path(tmp_path: Path) -> None:
    """indir -> sub: the walk lists sub/s.png, and a row for indir/s.png said the file "is not one
    of the source's files (it lists files named *.png ...; hidden files and folders are skipped)"."""
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "indir/s.png,cat,S2,"], ["a.png", "sub/s.png"])
    (tmp_path / "raw" / "indir").symlink_to("sub")
    found = discover(load_job(job_path))
    (issue,) = [i for i in found.issues if i.path.endswith("indir/s.png")]
    assert issue.reason == "missing_file"
    assert "reached through the link indir to a folder inside the root" in issue.message
    assert "write the row as 'sub/s.png'" in issue.message and "hidden files" not in issue.message


def test_a_row_the_filter_leaves_out_is_counted_whether_or_not_its_file_is_there(tmp_path: Path) -> None:
    """MIMIC's recipe on a partial download: a LATERAL row whose JPG is missing was in no count and
    no record (a PA row with a missing file is missing_file), so a filtered row was counted only
    where its file happened to be there. Both filtered rows are filtered records now."""
    path = make_tree(tmp_path, ["a.png,cat,S1,,PA", "b.png,cat,S2,,LATERAL", "c.png,dog,S3,,LATERAL"],
                     ["a.png", "b.png"], header="path,label,entity,timestamp,view")
    doc = yaml.safe_load(path.read_text())
    doc["sources"][0]["where"] = {"view": ["PA"]}
    path.write_text(yaml.safe_dump(doc))
    found = discover(load_job(path))
    assert [r.relpath for r in found.refs] == ["a.png"] and found.issues == []
    assert sorted((Path(e.path).name, e.why) for e in found.excluded) == [("b.png", "filtered"), ("c.png", "filtered")]
    (absent,) = [e for e in found.excluded if e.path.endswith("c.png")]
    assert "view is 'LATERAL'" in absent.detail and "not under the root either" in absent.detail


def test_an_outside_root_record_quotes_the_cell_as_the_table_writes_it(tmp_path: Path) -> None:
    """Rows '/etc/hostname' and 'sub/../../secret.png' were quoted as the relative paths they were
    read as ('../../../etc/hostname', '../secret.png'): a user searching the table for the cell
    found nothing."""
    found = discover(load_job(make_tree(tmp_path, ["a.png,cat,S1,", "/etc/hostname,cat,S2,",
                                                   "sub/../../secret.png,dog,S3,"], ["a.png"])))
    messages = {i.reason: [] for i in found.issues}
    for issue in found.issues:
        messages[issue.reason].append(issue.message)
    assert set(messages) == {"outside_root"}
    assert any("row 3: '/etc/hostname' (read as " in m and "leaves the source root" in m for m in messages[
        "outside_root"]), messages
    assert any("row 4: 'sub/../../secret.png' (read as '../secret.png'" in m for m in messages["outside_root"])


def test_a_row_through_a_link_to_a_folder_outside_the_root_is_outside_root(tmp_path: Path) -> None:
    """Row 'linkdir/secret.png', linkdir a link to a folder beside the root: the file exists, is a
    PNG, and nothing outside the root is read, yet its record said missing_file, "not one of the
    source's files (it lists files named *.png, ...)"."""
    elsewhere = tmp_path / "outside"
    elsewhere.mkdir()
    (elsewhere / "secret.png").write_bytes(b"\x89PNG fake")
    job_path = make_tree(tmp_path, ["a.png,cat,S1,", "linkdir/secret.png,cat,S2,"], ["a.png"])
    (tmp_path / "raw" / "linkdir").symlink_to(elsewhere, target_is_directory=True)
    found = discover(load_job(job_path))
    by_reason = {(i.reason, Path(i.path).name): i.message for i in found.issues}
    assert ("outside_root", "secret.png") in by_reason, by_reason
    assert "row 3 lists 'linkdir/secret.png', which resolves to" in by_reason[("outside_root", "secret.png")]
    assert not any(reason == "missing_file" for reason, _ in by_reason)


def test_a_broken_link_is_missing_file_whichever_kind_reads_it(tmp_path: Path) -> None:
    """An image source said missing_file ("a symbolic link to X, which does not exist") and a
    DICOM source unreadable ("cannot open the file (FileNotFoundError...)") for the same broken
    link, so the counts by reason depended on the source kind; a NIfTI source said unreadable too."""
    from packer.config import LimitsConfig
    from packer.read.nifti import NiftiDefect, load_header

    root = tmp_path / "ct"
    root.mkdir()
    (root / "link.dcm").symlink_to("gone.dcm")
    job = {"name": "t", "sources": [{"kind": "dicom", "root": "ct"}], "split": {"by": "entity"},
           "pack": {"format": "webdataset"}, "output": "out"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    loaded = load_job(tmp_path / "job.yaml")
    refs = {r.relpath: r for r in discover(loaded).refs}
    dicom = probe_ref(refs["link.dcm"], loaded)
    assert isinstance(dicom, Issue) and dicom.reason == "missing_file"
    assert "a symbolic link to gone.dcm, which does not exist; fix the link or remove it" in dicom.message
    (tmp_path / "ct.nii.gz").symlink_to("gone.nii.gz")
    with pytest.raises(NiftiDefect) as raised:
        load_header(str(tmp_path / "ct.nii.gz"), LimitsConfig(), channels_from=None)
    assert raised.value.reason == "missing_file" and "which does not exist; fix the link" in raised.value.message
