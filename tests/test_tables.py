"""Tables as they ship: a source's ``table:`` object places each row on its file without edits.

Each test writes a tree in a published layout (CheXpert's ``Path`` relative to the folder above
the root, NIH's bare names under ``images_00N/images/``, MIMIC-CXR-JPG's ids joined over tables,
RSNA's row per box, the Decathlon's dataset.json) and checks what discovery makes of it: every
file is a sample, a bad sample with a reason, or left out on purpose, and nothing is counted twice.
"""

from __future__ import annotations

import gzip
import json
import posixpath
import tarfile
import unicodedata
import zipfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import Discovery, discover
from tests.helpers import write_job


def _files(root: Path, relpaths: list[str], real: bool = False) -> None:
    for i, rel in enumerate(relpaths):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if real:  # a decodable image, different per file (no planted duplicates)
            rng = np.random.default_rng(i)
            cv2.imwrite(str(path), rng.integers(0, 255, (24, 24), dtype=np.uint8))
        else:
            path.write_bytes(b"\x89PNG fake")


def _job(tmp_path: Path, source: dict[str, Any], **extra: Any) -> Path:
    doc = {"name": "t", "sources": [{"kind": "image", **source}], "split": {"by": "entity"},
           "pack": {"format": "webdataset"}, "output": "out", **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _csv(path: Path, header: str, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")


def _by_path(found: Discovery) -> dict[str, Any]:
    return {ref.relpath: ref for ref in found.refs}


# -- CheXpert: Path from the folder above the root, patient in the path, frontal only -------------

CHEXPERT = ["train/patient00001/study1/view1_frontal.jpg", "train/patient00001/study1/view2_lateral.jpg",
            "train/patient00002/study1/view1_frontal.jpg", "train/patient00002/study2/view1_frontal.jpg",
            "train/patient00003/study1/view1_frontal.jpg"]


def _chexpert(tmp_path: Path, real: bool = False) -> Path:
    root = tmp_path / "CheXpert-v1.0-small"
    _files(root, CHEXPERT, real)
    view = {"frontal": "Frontal", "lateral": "Lateral"}
    rows = [f"CheXpert-v1.0-small/{rel},Female,68,{view[rel.rsplit('_', 1)[1][:-4]]},AP,{i % 2}.0,{(i + 1) % 2}.0"
            for i, rel in enumerate(CHEXPERT)]
    _csv(root / "train.csv", "Path,Sex,Age,Frontal/Lateral,AP/PA,Cardiomegaly,Edema", rows)
    return _job(tmp_path, {
        "root": "CheXpert-v1.0-small", "table": {"file": "CheXpert-v1.0-small/train.csv", "path": "Path",
                                                 "path_base": "."},
        "entity": {"path": r"(?P<entity>patient\d+)/"}, "where": {"Frontal/Lateral": "Frontal"},
        "label": {"kind": "multilabel", "columns": ["Cardiomegaly", "Edema"]}})


def test_chexpert_paths_from_the_folder_above_the_root_place_every_row(tmp_path: Path) -> None:
    found = discover(load_job(_chexpert(tmp_path)))
    refs = _by_path(found)
    frontal = [rel for rel in CHEXPERT if "lateral" not in rel]
    assert sorted(refs) == frontal and found.issues == []
    assert [refs[rel].entity for rel in frontal] == ["patient00001", "patient00002", "patient00002", "patient00003"]
    assert refs[frontal[0]].label == "Edema" and refs[frontal[1]].label == "Edema"  # rows 0 and 2: Edema 1.0
    assert refs[frontal[2]].label == "Cardiomegaly"
    # the lateral view is left out by the filter, counted and said, not a bad sample
    assert [(Path(e.path).name, e.why, e.stage) for e in found.excluded] == [
        ("view2_lateral.jpg", "filtered", "discover")]
    assert "Frontal/Lateral is 'Lateral'" in found.excluded[0].detail
    assert found.rows_filtered == 1


def test_a_row_written_from_the_root_under_path_base_is_told_how_to_write_it(tmp_path: Path) -> None:
    """One CheXpert row without the ``CheXpert-v1.0-small/`` prefix: path_base reads it next to
    the root. Its outside_root record quotes the cell as written, says the root holds that path
    and how to write it; the file's missing_label record names the row instead of saying that no
    row names it."""
    job = _chexpert(tmp_path)
    table = tmp_path / "CheXpert-v1.0-small" / "train.csv"
    table.write_text(table.read_text().replace("CheXpert-v1.0-small/train/patient00002/study1/", "train/patient00002/"
                                               "study1/"))
    found = discover(load_job(job))
    (outside,) = [i for i in found.issues if i.reason == "outside_root"]
    cell = "train/patient00002/study1/view1_frontal.jpg"
    assert outside.path == str(tmp_path / cell)  # where path_base reads it, absolute like every record's path
    assert outside.message == (
        f"{table} row 4: {cell!r}, read from table.path_base ({tmp_path}), is '../{cell}' from the source root "
        f"{tmp_path / 'CheXpert-v1.0-small'}, outside it; the root holds {cell!r} itself, so this cell is written "
        f"from the root, not from path_base: write it as 'CheXpert-v1.0-small/{cell}', as the other rows are, or, "
        "where every cell is written from the root, drop table.path_base")
    unlabeled = found.unlabeled[str(tmp_path / "CheXpert-v1.0-small" / cell)]
    assert f"{table} row 4 names {cell!r}, but the table's cells are read from table.path_base" in unlabeled


@pytest.mark.parametrize("cell", ["/mnt/old-server/imgs/a5.png", "./imgs/../../old/a5.png"])
def test_an_outside_root_cell_under_path_base_is_quoted_as_the_table_writes_it(tmp_path: Path, cell: str) -> None:
    """A table made by a glob on another machine holds '/mnt/old-server/imgs/a5.png': under
    path_base its outside_root record quoted '../../mnt/old-server/imgs/a5.png', the path rebuilt
    from where the cell led, a text the table never held, so the user could not find the row."""
    _files(tmp_path / "imgs", ["a0.png"])
    _csv(tmp_path / "t.csv", "path,label,entity", ["imgs/a0.png,x,E0", f"{cell},y,E1"])
    found = discover(load_job(_job(tmp_path, {"root": "imgs", "table": {"file": "t.csv", "path_base": "."}})))
    (outside,) = [i for i in found.issues if i.reason == "outside_root"]
    rel = posixpath.relpath(posixpath.normpath(posixpath.join(str(tmp_path), cell)), str(tmp_path / "imgs"))
    how = ("an absolute path (not read from table.path_base)" if cell.startswith("/") else
           f"read from table.path_base ({tmp_path})")
    assert outside.message == (
        f"{tmp_path / 't.csv'} row 3: {cell!r}, {how}, is {rel!r} from the source root {tmp_path / 'imgs'}, outside "
        "it; give a path inside the root, or set safety.outside_root: allow")


def _build_records(job: Path, **phi: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = yaml.safe_load(job.read_text())
    doc["labels"] = ["Edema", "Cardiomegaly"]  # positions not in alphabetical order
    if phi:
        doc["phi"] = phi
    job.write_text(yaml.safe_dump(doc))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    assert list(read_bad_samples(result.version_dir / "bad_samples.jsonl")) == []
    records = []
    for shard in sorted(result.version_dir.rglob("*.tar")):
        with tarfile.open(shard) as tar:
            records += [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")]
    return json.loads(result.manifest_path.read_text()), records


def test_a_chexpert_build_packs_the_frontal_views_and_records_their_paths(tmp_path: Path) -> None:
    manifest, records = _build_records(_chexpert(tmp_path, real=True))
    assert sum(s["samples"] for s in manifest["splits"].values()) == 4
    # phi: keep (an image job's default): each record names its raw file, relative to the root
    assert sorted(r["path"] for r in records) == [rel for rel in CHEXPERT if "lateral" not in rel]
    # the label map's keys are written in position order: a loop over them meets position 0 first
    assert list(manifest["label_map"].items()) == [("Edema", 0), ("Cardiomegaly", 1)]


def test_pseudonymized_records_never_name_their_raw_files(tmp_path: Path) -> None:
    (tmp_path / "phi.key").write_text("k" * 64)
    _, records = _build_records(_chexpert(tmp_path, real=True), mode="pseudonymize", key_file="phi.key")
    assert len(records) == 4 and all("path" not in r for r in records)
    assert not any("patient0000" in json.dumps(r) for r in records)


def test_a_path_pattern_that_matches_nothing_shows_a_path(tmp_path: Path) -> None:
    job = _chexpert(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["entity"] = {"path": r"(?P<entity>pid\d+)"}
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.entity .*pid.*matches none of the 5 files; a file's path "
                                          r"relative to the root is 'train/patient00001/study1/view1_frontal.jpg'"):
        discover(load_job(job))


def test_without_path_base_the_error_says_where_the_paths_start(tmp_path: Path) -> None:
    job = _chexpert(tmp_path)
    doc = yaml.safe_load(job.read_text())
    del doc["sources"][0]["table"]["path_base"]
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"none of the table's 5 rows names a file .*row 2 gives "
                                          r"'CheXpert-v1.0-small/train/.*path_base") as raised:
        discover(load_job(job))
    # the cells start with the root's own folder: the fix is exact, and find: name, which the
    # many view1_frontal.jpg files would make ambiguous_path, is not offered
    assert str(raised.value).endswith("the cells start with the root's own folder name ('CheXpert-v1.0-small/'): "
                                      "set table.path_base to the folder above the root")


def test_cells_that_start_in_a_folder_under_the_root_are_told_to_move_the_root_down(tmp_path: Path) -> None:
    """root: . with the files under imgs/ and cells like sub00/img0.png: the hint pointed at the
    folder above the root; the paths start in a folder below it."""
    for subject in range(3):
        for n in range(2):
            path = tmp_path / "data" / "imgs" / f"sub{subject:02d}" / f"img{n}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(path), np.full((8, 8), 40 * subject + n, dtype=np.uint8))
    rows = [f"sub{s:02d}/img{n}.png,{'ab'[n]},sub{s:02d}" for s in range(3) for n in range(2)]
    (tmp_path / "data" / "labels.csv").write_text("path,label,subject\n" + "\n".join(rows) + "\n")
    message = _discover_error(_image_job(tmp_path, root="data", table="data/labels.csv", entity="subject"))
    assert "the cells start in a folder under the root ('imgs/' then the cell)" in message, message
    assert "data/imgs, or table.path_base to it" in message and "folder above the root" not in message


def test_a_misspelt_path_column_is_a_config_error_with_the_closest_column(tmp_path: Path) -> None:
    job = _chexpert(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["path"] = "path"
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"missing column 'path' \(named by table.path\); did you mean 'Path'\? "
                                          r"\(set table.path: Path\)"):
        discover(load_job(job))



@pytest.mark.parametrize(("rows", "why"), [
    (['"b.png,dog', "c.png,cat", "d.png,dog"], "holds the rows in between as its text"),
    (['"b.png,dog', "c.png", "d.png"],
     r"swallows the rows in between \(a table's file path takes no line break: rename a file whose name holds one\)"),
])
def test_an_unclosed_quote_that_swallows_the_rows_below_is_a_config_error_naming_its_line(
        tmp_path: Path, rows: list[str], why: str) -> None:
    """A fresh-user trial left a quote open in a file cell: the csv module read every row below
    into that one cell, and the build reported those files as missing_label plus one missing_file
    whose path ran over several lines, with no hint. The table is refused, naming the line where
    the quote opens and the fix."""
    _files(tmp_path / "raw", ["a.png", "b.png", "c.png", "d.png"], real=True)
    _csv(tmp_path / "labels.csv", "path,label", ["a.png,cat", *rows])
    job = _job(tmp_path, {"root": str(tmp_path / "raw"), "table": {"file": str(tmp_path / "labels.csv")},
                          "label": {"column": "label"}})
    with pytest.raises(ConfigError, match=rf"labels.csv: the 'path' cell of the row on line 3 opens a quote \(\"\) "
                                          rf"that does not close on its line: the cell runs to line 5 and {why}.*"
                                          r"close the quote on line 3") as raised:
        discover(load_job(job))
    # it names the swallowed lines, never their text: a row of a table can hold a patient's id
    assert "(lines 4-5)" in str(raised.value) and "c.png" not in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("rows", "end", "line", "swallowed", "cells"), [
    # the quote opens on the last line: the entity took in the time, and the row was read whole
    (['b.png,dog,"Smithers^Waylon,2022-01-01'], "\n", 3, "", 3),
    (['b.png,dog,"Smithers^Waylon,2022-01-01'], "", 3, "", 3),
    # a line below it that reads as no row (too few separators): read as a note of two lines
    (['b.png,dog,"Smithers^Waylon,2022-01-01', "c.png,cat"], "\n", 3, r" and the line below it \(line 4\)", 3),
    # in the last cell: the row has all its cells, the quote is still open
    (['b.png,dog,S2,"2022-01-01'], "\n", 3, "", 4),
])
def test_a_quote_left_open_to_the_end_of_the_table_is_a_config_error_naming_its_line(
        tmp_path: Path, rows: list[str], end: str, line: int, swallowed: str, cells: int) -> None:
    """A quote opened in the last row's entity cell ran to the end of the file: the csv module
    read the rest of the row into that cell without a word, so the entity became
    'Smithers^Waylon,2022-01-01' (one patient split in two) and the row had no time. A quote that
    never closes is refused as one that swallows rows is, naming the table and the line."""
    _files(tmp_path / "raw", ["a.png", "b.png", "c.png"], real=True)
    (tmp_path / "labels.csv").write_text("\n".join(["path,label,entity,timestamp", "a.png,cat,S1,2022-01-01", *rows])
                                         + end)
    job = _job(tmp_path, {"root": str(tmp_path / "raw"), "table": {"file": str(tmp_path / "labels.csv")},
                          "label": {"column": "label"}, "time": "timestamp"})
    column = "timestamp" if cells == 4 else "entity"
    with pytest.raises(ConfigError, match=rf"labels.csv: the '{column}' cell of the row on line {line} opens a quote "
                                          rf"\(\"\) that never closes: the cell runs to the end of the table, taking "
                                          rf"in the rest of its row{swallowed} \(the row has {cells} cells where the "
                                          rf"header names 4 columns\); close the quote on line {line}") as raised:
        discover(load_job(job))
    assert "Smithers" not in str(raised.value)  # the cell's text may be a patient's name


def test_a_quoted_report_of_several_lines_with_commas_is_text_not_swallowed_rows(tmp_path: Path) -> None:
    """A narrow table (path, label, entity, report) whose quoted report cell spans lines, one of
    them a sentence with three commas ("Lungs clear, no effusion, ..."), written by Python's own
    csv.writer: it was refused as an unclosed quote, since the sentence had as many commas as a
    row. A line is a swallowed row only where it also names a file."""
    import csv as csv_module

    _files(tmp_path / "raw", ["a.png", "b.png", "c.png"], real=True)
    with (tmp_path / "labels.csv").open("w", newline="") as fh:
        writer = csv_module.writer(fh)
        writer.writerow(["path", "label", "entity", "report"])
        writer.writerow(["a.png", "cat", "p1", "FINDINGS:\nLungs clear, no effusion, no pneumothorax, heart normal."])
        writer.writerow(["b.png", "dog", "p2", "normal"])
        writer.writerow(["c.png", "cat", "p3", "two\nlines, no rows"])
    job = _job(tmp_path, {"root": str(tmp_path / "raw"), "table": {"file": str(tmp_path / "labels.csv")},
                          "label": {"column": "label"}})
    found = _by_path(discover(load_job(job)))
    assert sorted(found) == ["a.png", "b.png", "c.png"] and found["b.png"].label == "dog"
    # a row is numbered by the line it starts on, as an editor shows it (it was the line it ends on)
    (tmp_path / "raw" / "b.png").unlink()
    (issue,) = [i for i in discover(load_job(job)).issues if i.reason == "missing_file"]
    assert "labels.csv row 4 lists 'b.png'" in issue.message, issue.message


@pytest.mark.parametrize(("label", "header", "fix"), [
    ({"kind": "numeric", "columns": ["BoneAge"]}, "boneage,male", "columns: [boneage]"),
    ({"kind": "numeric", "columns": ["age", "Dose"]}, "age,dose", "columns: [age, dose]"),
    ({"kind": "multilabel", "columns": ["Cardiomegaly", "edema"]}, "Cardiomegaly,Edema",
     "columns: [Cardiomegaly, Edema]"),
])
def test_a_misspelt_column_of_a_label_column_list_is_fixed_in_that_list(
        tmp_path: Path, label: dict[str, Any], header: str, fix: str) -> None:
    """A numeric target's misspelt column (columns: [BoneAge], the table says boneage) offered the
    fix 'set label: {column: boneage}': a class target, which would pack a bone-age regression as
    ~200 classes. The fix of a column list is that list, corrected, in the job's own form."""
    _files(tmp_path / "raw", ["a.png"])
    _csv(tmp_path / "raw" / "t.csv", f"path,entity,{header}", ["a.png,p1,1,0"])
    job = _job(tmp_path, {"root": "raw", "table": "raw/t.csv", "label": label})
    with pytest.raises(ConfigError) as raised:
        discover(load_job(job))
    message = str(raised.value)
    assert "(named by label.columns); did you mean" in message and f"(in label:, write {fix})" in message, message
    assert "label: {column:" not in message


def test_a_column_named_with_a_leading_space_is_suggested_as_yaml_that_names_it(tmp_path: Path) -> None:
    """SIIM-ACR's train-rle.csv has the header 'ImageId, EncodedPixels': the second column's name
    starts with a space. The fix the error offers must be one that works when pasted into the job:
    the name quoted (bare YAML drops the space), written where the key takes a column name
    (label: {column: ...}; 'label: NAME' is no valid setting)."""
    root = tmp_path / "images"
    root.mkdir()
    cv2.imwrite(str(root / "a.png"), np.full((8, 8), 7, np.uint8))
    (tmp_path / "train-rle.csv").write_text("path, EncodedPixels\na.png, -1\n")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "siim", "output": "out",
        "sources": [{"kind": "image", "root": "images", "table": "train-rle.csv", "entity": "path",
                     "label": {"column": "EncodedPixels"}}],
        "split": {"by": "entity", "ratios": {"train": 1.0}}, "pack": {"format": "webdataset"}}))
    with pytest.raises(ConfigError) as raised:
        discover(load_job(job))
    message = str(raised.value)
    assert "missing column 'EncodedPixels' (named by label); did you mean ' EncodedPixels'? " \
           "(set label: {column: ' EncodedPixels'}, or, in a label: mapping naming 'EncodedPixels', write " \
           "' EncodedPixels' there: the name starts or ends with a space, so quote it)" in message, message
    assert "set label: ' EncodedPixels'" not in message
    # the fix offered works as pasted, also where the job leaves label: out (the default column 'label')
    (tmp_path / "train-rle.csv").write_text("path, label\na.png, -1\n")
    doc = yaml.safe_load(job.read_text())
    del doc["sources"][0]["label"]
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"set label: \{column: ' label'\}"):
        discover(load_job(job))
    doc["sources"][0]["label"] = {"column": " label"}
    job.write_text(yaml.safe_dump(doc))
    assert [r.label for r in discover(load_job(job)).refs] == ["-1"]


# -- NIH ChestX-ray14: bare names under images_00N/images/, entity from a column -------------------


def _nih(tmp_path: Path, extra_file: str | None = None) -> Path:
    root = tmp_path / "nih"
    names = ["00000001_000.png", "00000001_001.png", "00000002_000.png", "00000003_000.png"]
    files = [f"images_00{1 + i // 2}/images/{n}" for i, n in enumerate(names)]
    _files(root, files + ([extra_file] if extra_file else []))
    rows = [f"{n},Cardiomegaly|Effusion,0,{n[:8].lstrip('0')},58,M,PA,2682,2749,0.143,0.143," for n in names[:2]]
    rows += [f"{n},Effusion,0,{n[:8].lstrip('0')},81,F,PA,2500,2048,0.168,0.168," for n in names[2:]]
    _csv(root / "Data_Entry_2017.csv", "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,"
         "Patient Gender,View Position,OriginalImage[Width,Height],,OriginalImagePixelSpacing[x,y],", rows)
    return _job(tmp_path, {
        "root": "nih", "table": {"file": "nih/Data_Entry_2017.csv", "path": "Image Index", "find": "name"},
        "entity": "Patient ID", "label": {"kind": "multilabel", "column": "Finding Labels"}})


def test_nih_bare_names_are_found_under_the_root(tmp_path: Path) -> None:
    found = discover(load_job(_nih(tmp_path)))
    refs = _by_path(found)
    assert sorted(refs) == ["images_001/images/00000001_000.png", "images_001/images/00000001_001.png",
                            "images_002/images/00000002_000.png", "images_002/images/00000003_000.png"]
    assert [r.entity for r in refs.values()] == ["1", "1", "2", "3"]
    assert refs["images_001/images/00000001_000.png"].label == "Cardiomegaly|Effusion"
    assert found.issues == [] and found.excluded == []
    # the comma ending every line makes a column without a name or a value: it is not a cell of any
    # record (it rode in every sample's record as "": "")
    assert all("" not in dict(r.extra) for r in refs.values())
    assert dict(refs["images_001/images/00000001_000.png"].extra)["Patient Age"] == "58"


def test_an_unnamed_column_that_holds_values_is_kept(tmp_path: Path) -> None:
    from packer.pipeline.tables import _without_trailing_commas

    rows = [(2, {"a": "1", "": "x"}), (3, {"a": "2", "": ""})]
    assert _without_trailing_commas(("a", ""), rows) == (("a", ""), rows)
    assert _without_trailing_commas(("a", ""), [(2, {"a": "1", "": " "})]) == (("a",), [(2, {"a": "1"})])


@pytest.mark.parametrize(("table", "sep"), [("participants.tsv", "\t"), ("labels.tsv.gz", "\t"), ("labels.csv", "\t"),
                                            ("misnamed.tsv", ","), ("excel-de.csv", ";")])
def test_a_tab_separated_table_is_read_by_its_tabs(tmp_path: Path, table: str, sep: str) -> None:
    # BIDS ships participants.tsv; a spreadsheet exported "as text" is tab-separated whatever its
    # name. It used to be one column, and the error said "missing column 'path'" above a header
    # that plainly has it. A header that has commas and no tab is a CSV whatever its name; one
    # with semicolons and neither is Excel's "CSV" where the decimal mark is a comma.
    _files(tmp_path / "raw", ["a/1.png", "b/2.png"])
    text = "path\tlabel\tentity\tnote\n" "a/1.png\tcat\tS1\ta, b\n" "b/2.png\tdog\tS2\t\n"
    if sep == ",":
        text = text.replace("a, b", '"a, b"').replace("\t", ",")
    elif sep == ";":
        text = text.replace("\t", ";")
    path = tmp_path / "raw" / table
    path.write_bytes(gzip.compress(text.encode()) if table.endswith(".gz") else text.encode())
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": f"raw/{table}"})))
    refs = _by_path(found)
    assert [(r.label, r.entity, r.extra) for r in refs.values()] == [("cat", "S1", (("note", "a, b"),)),
                                                                     ("dog", "S2", (("note", ""),))]
    assert found.issues == []


@pytest.mark.parametrize(("sep", "spacing"), [(";", "0.143"), (";", "0,143"), ("\t", "0.143"), ("\t", "0,143")])
def test_a_comma_inside_a_column_name_does_not_make_a_semicolon_or_tab_table_comma_separated(
        tmp_path: Path, sep: str, spacing: str) -> None:
    """NIH's Data_Entry_2017.csv names a column 'OriginalImage[Width,Height]'. Re-saved by Excel where
    the decimal mark is a comma it is semicolon-separated (its spacings then '0,143'), exported as
    text it is tab-separated, and either keeps its .csv name: the header's comma made it a comma
    table, and row 2 was refused as "cut short, as an interrupted download leaves the last row"."""
    _files(tmp_path / "raw", ["00000001_000.png", "00000002_000.png"])
    header = ["Image Index", "Finding Labels", "Patient ID", "OriginalImage[Width,Height]", "Spacing"]
    rows = [["00000001_000.png", "Effusion", "1", "2500 2048", spacing],
            ["00000002_000.png", "No Finding", "2", "", ""]]
    (tmp_path / "raw" / "Data_Entry_2017.csv").write_text("".join(sep.join(r) + "\n" for r in [header, *rows]))
    table = {"file": "raw/Data_Entry_2017.csv", "path": "Image Index"}
    found = discover(load_job(_job(tmp_path, {"root": "raw", "entity": "Patient ID",
                                              "label": {"column": "Finding Labels"}, "table": table})))
    refs = _by_path(found)
    assert [(r.label, r.entity) for r in refs.values()] == [("Effusion", "1"), ("No Finding", "2")]
    assert dict(refs["00000001_000.png"].extra)["OriginalImage[Width,Height]"] == "2500 2048"
    assert dict(refs["00000001_000.png"].extra)["Spacing"] == spacing


def test_a_short_row_above_others_names_the_delimiter_read_not_a_cut_download(tmp_path: Path) -> None:
    """Only the last row is what an interrupted download cuts short; a short row with rows below it
    was told so too ("download the table again"). It is now told with the delimiter the table was
    read with, and how to name another."""
    _files(tmp_path / "raw", ["a.png", "b.png", "c.png"])
    _csv(tmp_path / "raw" / "labels.csv", "path,label,entity", ["a.png,cat,S1", "b.png,dog", "c.png,cat,S3"])
    message = _discover_error(_job(tmp_path, {"root": "raw", "table": "raw/labels.csv"}))
    assert "row 3 has 2 cells but the header names 3 columns (no cell for 'entity'); the table was read as " \
           "comma-separated" in message, message
    assert "sep=;" in message and "download" not in message, message


@pytest.mark.parametrize(("hint", "sep"), [("sep=;", ";"), ("sep=\t", "\t"), ('"sep=|"', "|"), ("sep=,", ",")])
def test_excel_s_sep_line_names_the_delimiter_and_is_not_the_header(tmp_path: Path, hint: str, sep: str) -> None:
    """Excel writes (and reads) a first line 'sep=;' naming the delimiter. It was read as the header:
    the real header became row 2, refused as "3 cells but the header names 2 columns ... a value
    holding the separator needs quotes", which no quoting fixes. Rows keep the numbers an editor
    gives them, the hint line counted."""
    _files(tmp_path / "raw", ["a/1.png", "b/2.png"])
    rows = [["path", "label", "entity", "note"], ["a/1.png", "cat", "S1", "a, b; c"], ["b/2.png", "dog", "S2", ""],
            ["gone.png", "dog", "S3", ""]]
    note = '"a, b; c"' if sep in ",;" else "a, b; c"
    text = hint + "\r\n" + "".join(sep.join(r).replace("a, b; c", note) + "\r\n" for r in rows)
    (tmp_path / "raw" / "labels.csv").write_text(text, newline="")
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": "raw/labels.csv"})))
    refs = _by_path(found)
    assert [(r.label, r.entity, r.extra) for r in refs.values()] == [("cat", "S1", (("note", "a, b; c"),)),
                                                                     ("dog", "S2", (("note", ""),))]
    (issue,) = found.issues
    assert "labels.csv row 5 lists 'gone.png'" in issue.message, issue.message


@pytest.mark.parametrize(("name", "head", "said"), [
    ("labels.xlsx", b"PK\x03\x04\x14\x00\x06\x00", "a zip archive (an Excel .xlsx"),
    ("labels.xls", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Excel .xls workbook"),
    ("labels.parquet", b"PAR1\x15\x04\x15\x10", "a Parquet file"),
    ("labels.csv.gz", b"PAR1\x15\x04\x15\x10", "a Parquet file")])
def test_a_table_saved_as_a_workbook_or_parquet_is_named_as_such_with_how_to_export_it(
        tmp_path: Path, name: str, head: bytes, said: str) -> None:
    """It was 'not UTF-8 text; save the table as UTF-8', or its zip signature read as a header row."""
    _files(tmp_path / "raw", ["a/1.png"])
    content = head + bytes(range(256)) * 4
    (tmp_path / "raw" / name).write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    message = _discover_error(_job(tmp_path, {"root": "raw", "table": f"raw/{name}"}))
    assert f"{said}" in message and "not a text table" in message and "export it as CSV (UTF-8)" in message, message
    assert "save the table as UTF-8" not in message


@pytest.mark.parametrize(("members", "said"), [
    # Kaggle's per-file download: kaggle competitions download -f stage_2_train.csv
    (["stage_2_train.csv"], "a zip archive holding stage_2_train.csv, not a text table"),
    (["a/train.csv", "a/test.csv"], "a zip archive holding a/train.csv, a/test.csv, not a text table"),
    # a real workbook keeps the advice to export it
    (["[Content_Types].xml", "xl/workbook.xml"], "a zip archive (an Excel .xlsx"),
    (["mimetype", "content.xml"], "a zip archive (an Excel .xlsx or OpenDocument .ods")])
def test_a_zipped_csv_is_told_to_be_unzipped_and_a_workbook_to_be_exported(
        tmp_path: Path, members: list[str], said: str) -> None:
    """A zipped CSV was called a workbook and told to go through pd.read_excel, which cannot read
    it: the message names what the archive holds and says to unzip it."""
    _files(tmp_path / "raw", ["a/1.png"])
    with zipfile.ZipFile(tmp_path / "raw" / "labels.csv.zip", "w") as zipped:
        for member in members:
            zipped.writestr(member, "path,label\na/1.png,x\n")
    message = _discover_error(_job(tmp_path, {"root": "raw", "table": "raw/labels.csv.zip"}))
    assert said in message, message
    workbook = "[Content_Types].xml" in members or "mimetype" in members
    assert ("read_excel" in message) is workbook and ("unzip labels.csv.zip" in message) is not workbook
    if members == ["stage_2_train.csv"]:
        assert "name stage_2_train.csv in the job" in message


@pytest.mark.parametrize("find", ["path", "name"])
def test_a_table_names_a_file_whose_name_is_spelled_in_another_unicode_form(tmp_path: Path, find: str) -> None:
    # the table is NFC text (é one code point); the files were made on macOS (é as e + U+0301):
    # each such file was a missing_label and its row a missing_file, under one printed path
    nfd = [unicodedata.normalize("NFD", n) for n in ("a/Zoë.png", "a/café.png")]
    _files(tmp_path / "raw", [*nfd, "a/plain.png"])
    cells = ["Zoë.png", "café.png", "plain.png"] if find == "name" else ["a/Zoë.png", "a/café.png", "a/plain.png"]
    _csv(tmp_path / "raw" / "t.csv", "path,label,entity",
         [f"{unicodedata.normalize('NFC', c)},x,E{i}" for i, c in enumerate(cells)])
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "find": find}})))
    assert sorted(r.relpath for r in found.refs) == sorted([*nfd, "a/plain.png"])
    assert all(r.label == "x" for r in found.refs) and found.issues == []


def test_a_file_whose_name_starts_or_ends_with_a_space_is_named_by_its_cell_as_written(tmp_path: Path) -> None:
    """Cells are trimmed (exports pad them: ``a.png, x``), but where only the cell as written names
    a file (' lead.png' on disk), it is that file: the trimmed cell was a missing_file for a name
    the row does not hold and the file a missing_label no row could ever fix. A padded cell
    naming a file without the spaces still names that one."""
    _files(tmp_path / "raw", [" lead.png", "trail .png", "plain.png"])
    _csv(tmp_path / "raw" / "t.csv", "path,label,entity",
         ['" lead.png",a,E1', '"trail .png",b,E2', '" plain.png ",c,E3'])
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": "raw/t.csv"})))
    assert found.issues == []
    assert {r.relpath: r.label for r in found.refs} == {" lead.png": "a", "trail .png": "b", "plain.png": "c"}


def test_a_name_two_files_share_is_ambiguous_for_both(tmp_path: Path) -> None:
    found = discover(load_job(_nih(tmp_path, extra_file="images_009/images/00000002_000.png")))
    ambiguous = sorted((i.path.split("/nih/")[1], i.reason) for i in found.issues)
    assert ambiguous == [("images_002/images/00000002_000.png", "ambiguous_path"),
                         ("images_009/images/00000002_000.png", "ambiguous_path")]
    assert "2 files under the root have that name" in found.issues[0].message
    assert len(found.refs) == 3  # each file counted once: a sample or a bad sample, never both


def _ham10000(tmp_path: Path) -> None:
    """HAM10000 as Kaggle ships it: every image twice, in two folders whose names differ in case;
    ISIC_0000002 (a melanoma) only once."""
    copies = {"ISIC_0000000": 2, "ISIC_0000001": 2, "ISIC_0000002": 1, "ISIC_0000003": 2}
    _files(tmp_path / "raw", [f"{part}/{image}.jpg" for image, n in copies.items()
                              for part in ("HAM10000_images_part_1", "ham10000_images_part_1")[:n]])
    _csv(tmp_path / "raw" / "meta.csv", "lesion_id,image_id,dx",
         ["HAM_0,ISIC_0000000,mel", "HAM_1,ISIC_0000001,nv", "HAM_2,ISIC_0000002,mel", "HAM_3,ISIC_0000003,nv"])


def test_a_name_two_files_share_is_filtered_not_ambiguous_where_where_leaves_its_row_out(tmp_path: Path) -> None:
    """Under find: name, the two copies of an nv image that `where: {dx: mel}` leaves out were
    ambiguous_path bad samples (and failed the build): the name was judged before the filter. A
    file whose row is left out is filtered, never a bad sample; a kept row's name stays ambiguous."""
    _ham10000(tmp_path)
    table = {"file": "raw/meta.csv", "path": {"template": "{image_id}.jpg"}, "find": "name"}
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": table, "entity": {"column": "lesion_id"},
                                              "label": {"column": "dx"}, "where": {"dx": "mel"}})))
    assert sorted((i.path.split("/raw/")[1], i.reason) for i in found.issues) == [
        ("HAM10000_images_part_1/ISIC_0000000.jpg", "ambiguous_path"),
        ("ham10000_images_part_1/ISIC_0000000.jpg", "ambiguous_path")]
    assert [r.relpath for r in found.refs if r.label is not None] == ["HAM10000_images_part_1/ISIC_0000002.jpg"]
    assert sorted((e.path.split("/raw/")[1], e.why) for e in found.excluded) == sorted(
        (f"{part}/ISIC_000000{n}.jpg", "filtered") for n in (1, 3)
        for part in ("HAM10000_images_part_1", "ham10000_images_part_1"))
    assert all("dx is 'nv'; where: dx = mel" in e.detail for e in found.excluded)
    assert found.rows_filtered == 2


def test_a_where_on_a_path_field_picks_the_copy_a_shared_name_means(tmp_path: Path) -> None:
    """A condition on a field of the path holds for one copy of a name and not the other: the
    row is kept for that copy alone, which is then its file, not an ambiguous one."""
    _ham10000(tmp_path)
    table = {"file": "raw/meta.csv", "path": {"template": "{image_id}.jpg"}, "find": "name"}
    found = discover(load_job(_job(tmp_path, {
        "root": "raw", "table": table, "entity": {"column": "lesion_id"}, "label": {"column": "dx"},
        "fields": {"part": {"component": 0}}, "where": {"part": "HAM10000_images_part_1"}})))
    assert found.issues == []
    assert sorted((r.relpath, r.label) for r in found.refs) == [
        (f"HAM10000_images_part_1/ISIC_000000{n}.jpg", dx) for n, dx in enumerate(["mel", "nv", "mel", "nv"])]
    assert sorted(e.path.split("/raw/")[1] for e in found.excluded) == [
        f"ham10000_images_part_1/ISIC_000000{n}.jpg" for n in (0, 1, 3)]
    assert found.rows_filtered == 0


def test_bare_names_without_find_name_say_to_set_it(tmp_path: Path) -> None:
    job = _nih(tmp_path)
    doc = yaml.safe_load(job.read_text())
    del doc["sources"][0]["table"]["find"]
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"row 2 gives '00000001_000.png' .*bare file names in subfolders: set "
                                          r"table.find: name"):
        discover(load_job(job))


@pytest.mark.parametrize(("layout", "fix"), [
    # Kaggle: train.csv's id names train_images/<id>.png (RSNA: <patientId>.dcm)
    ("", r"set table.path: \{template: '\{image_id\}.png'\}"),
    # the same ids, with the images spread over subfolders
    ("part1/", r"set table.path: \{template: '\{image_id\}.png'\} and table.find: name"),
    # ... where the job has find: name already: the template is all it lacks
    ("part1/find", r"set table.path: \{template: '\{image_id\}.png'\}$"),
])
def test_ids_without_the_file_extension_say_the_template_that_adds_it(tmp_path: Path, layout: str,
                                                                         fix: str) -> None:
    folder, find = layout.removesuffix("find"), layout.endswith("find")
    _files(tmp_path / "raw", [f"{folder}1000015157.png", f"{folder}1000201771.png"])
    _csv(tmp_path / "train.csv", "image_id,label,entity", ["1000015157,0,E1", "1000201771,1,E2"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "train.csv", "path": "image_id",
                                                   **({"find": "name"} if find else {})}})
    with pytest.raises(ConfigError, match=r"row 2 gives '1000015157' .*the cells are file names without their "
                                          r"extension \(.png\): " + fix):
        discover(load_job(job))


def test_a_job_whose_every_file_is_left_out_is_a_config_error_naming_why(tmp_path: Path) -> None:
    """RSNA's files are all Secondary Captures, left out unless asked; a where: that no row meets
    does the same. Packing nothing is never a clean result: the build said 'clean' and advised
    more entities or another seed for the empty splits."""
    from packer.pipeline.datacheck import validate_job

    _files(tmp_path / "raw", ["a.png", "b.png"], real=True)
    _csv(tmp_path / "t.csv", "path,label,entity,view", ["a.png,x,E1,AP", "b.png,y,E2,AP"])
    job = load_job(_job(tmp_path, {"root": "raw", "table": {"file": "t.csv"}, "where": {"view": "PA"}}))
    with pytest.raises(ConfigError, match=r"no sample to pack: all 2 files of the job are left out on purpose "
                                          r"\(filtered 2\); the first, .*a.png: view is 'AP'; where: view = PA"):
        validate_job(job, scheduler="sync", quiet=True)
    # under pseudonymize the cell's value stays out of the message (a note column may hold a name)
    _csv(tmp_path / "t.csv", "path,label,entity,view", ["a.png,x,E1,Jane Doe 1960", "b.png,y,E2,AP"])
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    job = load_job(_job(tmp_path, {"root": "raw", "table": {"file": "t.csv"}, "where": {"view": "PA"}},
                        phi={"mode": "pseudonymize", "key_file": "phi.key"}))
    with pytest.raises(ConfigError, match=r"left out by where: view = PA \(the value it has is not shown") as refused:
        validate_job(job, scheduler="sync", quiet=True)
    assert "Jane" not in str(refused.value) and "AP" not in str(refused.value)


@pytest.mark.parametrize("max_bad", [0.05, 1.0])
def test_a_job_whose_files_are_left_out_but_for_a_bad_one_is_the_same_config_error(tmp_path: Path,
                                                                                    max_bad: float) -> None:
    """A real export has a broken file or two: with them, a where: that no row meets said 'too many
    bad samples (exit 3)', 100% bad, and under a lenient max_bad_fraction built an empty dataset
    with exit 0, advising more entities or another seed; what packed nothing was the where:."""
    from packer.pipeline.datacheck import validate_job

    _files(tmp_path / "raw", ["a.png", "b.png"], real=True)
    (tmp_path / "raw" / "c.png").write_bytes(b"")  # unreadable, and view PA: not filtered
    _csv(tmp_path / "t.csv", "path,label,entity,view", ["a.png,x,E1,AP", "b.png,y,E2,AP", "c.png,z,E3,PA"])
    job = load_job(_job(tmp_path, {"root": "raw", "table": {"file": "t.csv"}, "where": {"view": "PA"}},
                        validate={"max_bad_fraction": max_bad}))
    with pytest.raises(ConfigError, match=r"no sample to pack: 2 of the job's 3 files are left out on purpose "
                                          r"\(filtered 2\) and the other 1 is bad \(unreadable 1\); the first left "
                                          r"out, .*a.png: view is 'AP'; where: view = PA"):
        validate_job(job, scheduler="sync", quiet=True)


def test_an_empty_entity_cell_names_its_row_column_and_fix(tmp_path: Path) -> None:
    """ISIC 2019's metadata leaves lesion_id blank for some images: the record said only "the
    source's entity field is empty for this file"."""
    _files(tmp_path / "raw", ["ISIC_0000000.jpg", "ISIC_0000001.jpg"])
    _csv(tmp_path / "meta.csv", "image,label,lesion_id", ["ISIC_0000000,MEL,", "ISIC_0000001,NV,BCN_0000001"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "meta.csv", "path": {"template": "{image}.jpg"}},
                          "entity": "lesion_id"})
    found = discover(load_job(job))
    assert [r.relpath for r in found.refs] == ["ISIC_0000001.jpg"]
    (issue,) = found.issues
    assert issue.reason == "missing_entity" and issue.path.endswith("ISIC_0000000.jpg")
    assert issue.message == (f"{tmp_path / 'meta.csv'} row 2, column 'lesion_id' (the source's entity:): empty, so "
                             "the file has no entity to keep it in one split; fill the cell, make each such file its "
                             "own entity (entity: {column: lesion_id, empty: file}), or leave such rows out with "
                             "where: {lesion_id: {match: '.'}}")
    # ISIC's images without a lesion id: each its own entity, by the job's word
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["entity"] = {"column": "lesion_id", "empty": "file"}
    job.write_text(yaml.safe_dump(doc))
    loaded = load_job(job)
    assert loaded.sources[0].to_json()["entity"] == {"column": "lesion_id", "empty": "file"}
    found = discover(loaded)
    assert found.issues == [] and sorted((r.relpath, r.entity) for r in found.refs) == [
        ("ISIC_0000000.jpg", "ISIC_0000000.jpg"), ("ISIC_0000001.jpg", "BCN_0000001")]
    doc["sources"][0]["entity"] = {"column": "lesion_id"}  # empty: bad, the default, is the plain column
    job.write_text(yaml.safe_dump(doc))
    assert load_job(job).sources[0].to_json()["entity"] == "lesion_id"


def test_a_where_value_that_is_empty_is_a_config_error_saying_what_drops_empty_cells(tmp_path: Path) -> None:
    """An empty cell is no value: {not: [""]} kept every empty row, silently."""
    _files(tmp_path / "raw", ["a.png"])
    _csv(tmp_path / "t.csv", "path,label,entity", ["a.png,x,E1"])
    for spec in ({"not": [""]}, "", ["A", " "]):
        job = _job(tmp_path, {"root": "raw", "table": {"file": "t.csv"}, "where": {"entity": spec}})
        with pytest.raises(ConfigError, match=r"sources\[0\].where.entity: an empty value never matches: an empty "
                                              r"cell is no value.*to leave out the rows whose entity is empty, write "
                                              r"entity: \{match: '.'\}"):
            load_job(job)


@pytest.mark.parametrize(("wanted", "kept"), [
    (10, ["10", "10.0", "1e1"]),  # an unquoted number: the same number in plain decimal notation
    ({"not": [10]}, ["007", "07", "1_0", "7", "\uff11\uff10"]),
    ("007", ["007"]),  # quoted: that text, an id whose leading zeros make it another entity than 7
    (["07", 7], ["07", "7", "007"]),
])
def test_a_where_number_compares_as_a_plain_decimal_and_a_quoted_value_as_its_text(
        tmp_path: Path, wanted: Any, kept: list[str]) -> None:
    """where: {site: 10} kept cells 1_0 and a full-width １０ (Python's float() reads both), and the
    quoted where: {site: '007'} kept the rows of sites 7 and 07."""
    sites = ["10", "10.0", "1e1", "1_0", "\uff11\uff10", "007", "7", "07"]
    names = [f"a{i}.png" for i in range(len(sites))]
    _files(tmp_path / "raw", names)
    (tmp_path / "t.csv").write_text("path,label,entity,site\n" + "".join(
        f"{name},x,E{i},{site}\n" for i, (name, site) in enumerate(zip(names, sites, strict=True))), encoding="utf-8")
    job = load_job(_job(tmp_path, {"root": "raw", "table": {"file": "t.csv"}, "where": {"site": wanted}}))
    found = discover(job)
    assert sorted(dict(ref.extra)["site"] for ref in found.refs) == sorted(kept)
    assert job.sources[0].to_json()["where"] == {"site": wanted}  # a number is recorded as one, text as text


def test_a_kaggle_table_without_path_or_entity_columns_says_which_keys_to_set(tmp_path: Path) -> None:
    """Kaggle's Diabetic Retinopathy trainLabels.csv is 'image,level': neither the default 'path'
    nor 'entity' column is there, and no column is close to either name."""
    _files(tmp_path / "train", ["10_left.jpeg", "10_right.jpeg"])
    _csv(tmp_path / "trainLabels.csv", "image,level", ["10_left,0", "10_right,2"])
    plain = _job(tmp_path, {"root": "train", "table": "trainLabels.csv"})
    with pytest.raises(ConfigError, match=r"missing column 'path' \(named by table.path\); name the column that "
                                          r"holds each file's name: table: \{file: trainLabels.csv, path: COLUMN\}"):
        discover(load_job(plain))
    named = _job(tmp_path, {"root": "train", "table": {"file": "trainLabels.csv", "path": {"template": "{image}.jpeg"}},
                            "label": {"column": "level"}})
    with pytest.raises(ConfigError, match=r"missing column 'entity' \(named by entity\); set the source's entity: to "
                                          r"the column holding the patient id, read it from each file's path \(entity: "
                                          r"\{path: REGEX\} or \{component: N\}\), or, where each file is its own "
                                          r"patient, entity: image"):
        discover(load_job(named))


@pytest.mark.parametrize("split", [{"by": "entity"}, {"by": "time", "cutoffs": {"test": "2024-06-01"}}])
def test_a_time_column_the_header_lacks_is_a_config_error_like_an_entity_column(
        tmp_path: Path, split: dict[str, Any]) -> None:
    """A misspelled time: column was no error: under by: entity the real column was copied into
    every record as an extra, and under by: time every file became missing_time, whose message
    blamed the cells. It is named with the closest column, as entity: is; a table without the
    default time column still loads when nothing needs it."""
    _files(tmp_path / "raw", ["a.png", "b.png"])
    _csv(tmp_path / "raw" / "labels.csv", "path,label,entity,timestamp",
         ["a.png,x,p1,2024-01-01", "b.png,y,p2,2024-08-01"])
    typo = _job(tmp_path, {"root": "raw", "table": "raw/labels.csv", "time": "tstamp"}, split=split)
    with pytest.raises(ConfigError, match=r"missing column 'tstamp' \(named by time\); did you mean 'timestamp'\?"):
        discover(load_job(typo))
    _csv(tmp_path / "raw" / "labels.csv", "path,label,entity", ["a.png,x,p1", "b.png,y,p2"])
    untimed = _job(tmp_path, {"root": "raw", "table": "raw/labels.csv"}, split=split)
    if split["by"] == "entity":
        assert len(discover(load_job(untimed)).refs) == 2
    else:  # a time split needs the column: say which key to set, not that every cell is empty
        with pytest.raises(ConfigError, match=r"missing column 'timestamp' \(named by time\); set the source's time:"):
            discover(load_job(untimed))


def test_a_template_pads_numeric_ids_and_says_which_row_does_not_fit(tmp_path: Path) -> None:
    """'{id:05d}.png' (ids zero-padded in the file names, a number in the table) crashed with
    Python's "Unknown format code 'd' for object of type 'str'" and a traceback (exit 1): the
    cells are text. A number spec formats the cell's number; a cell that is none, or an empty
    one, is a config error naming the row and the template, not the column 'path' the table lacks."""
    _files(tmp_path / "raw", ["00007.png", "00042.png"])
    _csv(tmp_path / "raw" / "t.csv", "id,label,entity", ["7,a,p1", "42,b,p2"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "path": {"template": "{id:05d}.png"}}})
    assert sorted(_by_path(discover(load_job(job)))) == ["00007.png", "00042.png"]
    _csv(tmp_path / "raw" / "t.csv", "id,label,entity", ["7,a,p1", "x42,b,p2"])
    with pytest.raises(ConfigError, match=r"row 3: table.path.template '\{id:05d\}.png': column 'id': the cell 'x42' "
                                          r"is not a number in plain decimal notation .*, which \{:05d\} formats"):
        discover(load_job(job))
    _csv(tmp_path / "raw" / "t.csv", "image,label,entity", ["00007,a,p1", ",b,p2"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "path": {"template": "{image}"}}})
    with pytest.raises(ConfigError, match=r"row 3: table.path.template '\{image\}' gives an empty path \(its "
                                          r"column\(s\) 'image' are empty there\)"):
        discover(load_job(job))
    _csv(tmp_path / "raw" / "t.csv", "image,label,entity", ["00007,a,p1", "00042,b,p2"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "path": {"template": "{image}.jpg"}}})
    with pytest.raises(ConfigError, match=r"check table.path.template \('\{image\}.jpg': its folders and extension"):
        discover(load_job(job))


@pytest.mark.parametrize("blank_rows", [1, 2])
def test_a_template_column_empty_in_a_row_is_a_config_error_naming_the_row(tmp_path: Path, blank_rows: int) -> None:
    """EyePACS' trainLabels.csv read through '{image}.jpeg': a row whose image cell is empty (a
    spreadsheet save that leaves ',' rows at the end) named the file '.jpeg'. One such row became
    a missing_file bad sample and an extra input; two became "'.jpeg' is listed twice", pointing at
    repeated:. Any column the template uses being empty is the empty path cell it is: a config
    error naming the row and the column."""
    _files(tmp_path / "raw", ["10_left.jpeg", "10_right.jpeg"])
    _csv(tmp_path / "raw" / "t.csv", "image,level", ["10_left,0", "10_right,1", *[","] * blank_rows])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "path": {"template": "{image}.jpeg"}},
                          "entity": {"path": "^(?P<entity>\\d+)_"}, "label": {"column": "level"}})
    with pytest.raises(ConfigError, match=r"row 4: table.path.template '\{image\}.jpeg' gives '.jpeg' \(its "
                                          r"column\(s\) 'image' are empty there\); give the file's name there"):
        discover(load_job(job))


def test_a_template_of_two_columns_names_the_empty_one(tmp_path: Path) -> None:
    """A row whose folder cell is empty under '{patient}/{image}.png' would name a file at the
    root: the error names the empty column, not the one that has its cell."""
    _files(tmp_path / "raw", ["p1/a.png", "p2/b.png"])
    _csv(tmp_path / "raw" / "t.csv", "patient,image,label", ["p1,a,x", ",b,y"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "path": {"template": "{patient}/{image}.png"}},
                          "entity": "patient"})
    with pytest.raises(ConfigError, match=r"row 3: .* gives '/b.png' \(its column\(s\) 'patient' are empty there\)"):
        discover(load_job(job))


@pytest.mark.parametrize(("cell", "spec"), [("1_5", "03d"), ("\uff11\uff15", "03d"), ("1_5", ".0f"), ("0x0f", "03d")])
def test_a_template_number_spec_reads_only_plain_decimal_cells(tmp_path: Path, cell: str, spec: str) -> None:
    """'IXI{IXI_ID:03d}.png' formatted the cells 1_5 and full-width １５ with Python's int(), which reads
    both as 15: the row was placed on subject 15's file and packed with its own target. A number
    spec reads its cell as numeric targets do, in plain decimal notation; any other cell is a config
    error naming the row, the column and what is wrong with the cell."""
    _files(tmp_path / "raw", ["IXI015.png", "IXI016.png"])
    _csv(tmp_path / "raw" / "t.csv", "IXI_ID,label,entity", ["16,a,p16", f"{cell},b,p15"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv",
                                                   "path": {"template": f"IXI{{IXI_ID:{spec}}}.png"}}})
    with pytest.raises(ConfigError, match=rf"row 3: table.path.template 'IXI\{{IXI_ID:{spec}\}}.png': column 'IXI_ID': "
                                          rf"the cell '{cell}' is not a number in plain decimal notation \(ASCII "
                                          rf"digits, a point, an exponent\), which \{{:{spec}\}} formats"):
        discover(load_job(job))


def test_a_template_integer_spec_formats_a_whole_number_written_as_a_decimal(tmp_path: Path) -> None:
    """pandas writes an id column that has a blank as floats (13.0): '{IXI_ID:03d}' refused the cell
    saying it "is not a whole number", which it is. A whole number in decimal or exponent notation
    is that integer (every digit of a long id kept); a cell with a fractional part is refused,
    and the message says so."""
    _files(tmp_path / "raw", ["IXI013.png", "IXI010.png", "IXI007.png", "IXI-02.png", "IXI12345678901234567890.png"])
    _csv(tmp_path / "raw" / "t.csv", "IXI_ID,label,entity",
         ["13.0,a,p13", "1e1,a,p10", "+7.000,b,p7", "-2.,b,p2", "12345678901234567890.0,a,pbig"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "path": {"template": "IXI{IXI_ID:03d}.png"}}})
    assert {rel: dict(ref.extra)["IXI_ID"] for rel, ref in _by_path(discover(load_job(job))).items()} == {
        "IXI013.png": "13.0", "IXI010.png": "1e1", "IXI007.png": "+7.000", "IXI-02.png": "-2.",
        "IXI12345678901234567890.png": "12345678901234567890.0"}
    _csv(tmp_path / "raw" / "t.csv", "IXI_ID,label,entity", ["13.0,a,p13", "13.5,b,p7"])
    with pytest.raises(ConfigError, match=r"row 3: table.path.template 'IXI\{IXI_ID:03d\}.png': column 'IXI_ID': the "
                                          r"cell '13.5' has a fractional part, and \{:03d\} formats a whole number"):
        discover(load_job(job))


def test_a_partial_download_is_bad_by_default_and_left_out_with_missing_drop(tmp_path: Path) -> None:
    """NIH ships its images in 12 archives; with images_002/ not downloaded, every row naming one of
    its files was a missing_file 'root/<name> does not exist', though find: name looks everywhere."""
    job = _nih(tmp_path)
    for png in (tmp_path / "nih" / "images_002").rglob("*.png"):
        png.unlink()
    found = discover(load_job(job))
    assert sorted(i.reason for i in found.issues) == ["missing_file", "missing_file"]
    assert found.issues[0].message == (f"{tmp_path / 'nih' / 'Data_Entry_2017.csv'} row 4 lists '00000002_000.png', "
                                       f"but no file of that name is under {tmp_path / 'nih'} (find: name); fix the "
                                       "row, or, where part of the dataset is not downloaded, set table.missing: drop")
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["missing"] = "drop"
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert sorted(_by_path(found)) == ["images_001/images/00000001_000.png", "images_001/images/00000001_001.png"]
    assert found.issues == []
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("00000002_000.png", "not_downloaded"),
                                                                    ("00000003_000.png", "not_downloaded")]
    assert "row 4 names '00000002_000.png', and no such file is under the root (table.missing: drop)" in \
        found.excluded[0].detail


def test_a_row_naming_a_folder_says_it_is_a_folder_not_a_missing_file(tmp_path: Path) -> None:
    """A row whose path names a folder (the case's folder instead of its image) was a missing_file
    '<root>/case2 does not exist (or is not a supported file)': it exists, it is a folder."""
    _files(tmp_path / "raw", ["case1/img.png", "case2/img.png"], real=True)
    _csv(tmp_path / "t.csv", "image,label,entity", ["case1/img.png,a,E1", "case2,b,E2"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "t.csv", "path": "image"}})
    found = discover(load_job(job))
    assert sorted(_by_path(found)) == ["case1/img.png", "case2/img.png"]
    assert [(i.reason, i.path) for i in found.issues] == [("missing_file", str(tmp_path / "raw" / "case2"))]
    assert found.issues[0].message == (
        f"{tmp_path / 't.csv'} row 3, column 'image': 'case2' is the folder {tmp_path / 'raw' / 'case2'}, not a "
        "file; point the column at a file inside it (e.g. 'case2/img.png')")
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["missing"] = "drop"  # a folder is no partial download: still said, never dropped
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert [(i.reason, i.path) for i in found.issues] == [("missing_file", str(tmp_path / "raw" / "case2"))]
    assert found.excluded == []


def test_a_row_naming_a_file_the_source_does_not_list_says_which_it_is(tmp_path: Path) -> None:
    """The message was '<path> does not exist (or is not a supported file)' for both; and under
    missing: drop a file that is there was left out as not downloaded."""
    _files(tmp_path / "raw", ["a.png"], real=True)
    (tmp_path / "raw" / "notes.txt").write_text("not an image")
    _csv(tmp_path / "t.csv", "path,label,entity", ["a.png,a,E1", "notes.txt,b,E2", "gone.png,b,E3"])
    table, raw = tmp_path / "t.csv", tmp_path / "raw"
    job = _job(tmp_path, {"root": "raw", "table": "t.csv"})
    found = discover(load_job(job))
    messages = {Path(i.path).name: (i.reason, i.message) for i in found.issues}
    assert messages == {
        "gone.png": ("missing_file", f"{table} row 4 lists 'gone.png', but {raw / 'gone.png'} does not exist; fix "
                                     "the row, or, where part of the dataset is not downloaded, set "
                                     "table.missing: drop"),
        "notes.txt": ("missing_file", f"{table} row 3 lists 'notes.txt', but {raw / 'notes.txt'} is not one of the "
                                      "source's files (it lists files named *.png, *.jpg, *.jpeg, *.tif, *.tiff, "
                                      "*.bmp; hidden files and folders are skipped); point the row at one of them, "
                                      "or remove the row")}
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"] = {"file": "t.csv", "missing": "drop"}
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert [Path(i.path).name for i in found.issues] == ["notes.txt"]
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("gone.png", "not_downloaded")]

def test_a_missing_label_says_whether_the_row_is_missing_or_its_cell_is_empty(tmp_path: Path) -> None:
    """CheXpert's Edema as a class column: a blank cell said "no label; add a row for ... to the
    source's label table", though train.csv has the row; and a file without a row (the Decathlon's
    imagesTs/) was not told of files: table."""
    from packer.pipeline.datacheck import validate_job

    _files(tmp_path / "raw", ["a.png", "b.png", "c.png", "extra/d.png"], real=True)
    _csv(tmp_path / "t.csv", "Path,Edema,entity", ["a.png,1.0,E1", "b.png,,E2", "c.png,0.0,E3"])
    job = load_job(_job(tmp_path, {"root": "raw", "table": {"file": "t.csv", "path": "Path"},
                                   "label": {"column": "Edema"}}, validate={"max_bad_fraction": 1.0}))
    issues = {Path(i.path).name: i for i in validate_job(job, scheduler="sync", quiet=True).prepared.issues}
    assert {name: i.reason for name, i in issues.items()} == {"b.png": "missing_label", "d.png": "missing_label"}
    assert issues["b.png"].message == (f"{tmp_path / 'raw' / 'b.png'}: {tmp_path / 't.csv'} row 3, column 'Edema': "
                                       "empty; give the sample's class")
    assert issues["d.png"].message == (
        f"{tmp_path / 'raw' / 'extra' / 'd.png'}: no label: no row of {tmp_path / 't.csv'} names 'extra/d.png'; add "
        "its row, or, where the table names only the dataset's files, set table.files: table (or, for unlabeled "
        "data, the source's 'label: none')")


def test_a_folder_labelled_file_without_a_row_is_missing_label_naming_the_row_not_an_entity_cell(
        tmp_path: Path) -> None:
    """label: folder with a table whose entity column is its path column: a file the table has no
    row for was missing_entity, told to fill "its entity column" though it has no row at all.
    README (files: root): one without a row is a missing_label bad sample."""
    from packer.pipeline.datacheck import validate_job

    _files(tmp_path / "raw", ["cat/a.png", "cat/b.png", "dog/c.png", "dog/d.png"], real=True)
    _csv(tmp_path / "files.csv", "path", ["cat/a.png", "cat/b.png", "dog/c.png"])
    job = load_job(_job(tmp_path, {"root": "raw", "table": "files.csv", "label": "folder", "entity": "path"},
                        validate={"max_bad_fraction": 1.0}))
    issues = {Path(i.path).name: i for i in validate_job(job, scheduler="sync", quiet=True).prepared.issues}
    assert {name: i.reason for name, i in issues.items()} == {"d.png": "missing_label"}
    assert issues["d.png"].message == (
        f"{tmp_path / 'raw' / 'dog' / 'd.png'}: no row of {tmp_path / 'files.csv'} names 'dog/d.png': a label: "
        "folder source with a table takes each file's class from its folder and its entity from its row (column "
        "'path', the source's entity:), so a file without a row is not packed; add its row, or, where the table "
        "names only the dataset's files, set table.files: table")


def _odir(tmp_path: Path) -> dict[str, Any]:
    """ODIR-5K: one row per patient, its two fundus images in the Left-Fundus and Right-Fundus
    columns, read as two sources over the one table, each with the patient's ID as its entity."""
    rows = []
    for p in range(4):
        _files(tmp_path / "raw", [f"{p}_left.jpg", f"{p}_right.jpg"])
        rows.append(f"{p},{50 + p},{'Male' if p % 2 else 'Female'},{p}_left.jpg,{p}_right.jpg,normal,cataract")
    _csv(tmp_path / "raw" / "full_df.csv", "ID,Patient Age,Patient Sex,Left-Fundus,Right-Fundus,Left-Keywords,"
         "Right-Keywords", rows)
    return {"name": "odir", "sources": [
        {"kind": "image", "name": eye.lower(), "root": "raw", "entity": {"column": "ID"},
         "table": {"file": "raw/full_df.csv", "path": f"{eye}-Fundus", "files": "table"},
         "label": {"column": f"{eye}-Keywords"}} for eye in ("Left", "Right")],
        "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}


def test_sources_that_share_their_entities_are_not_warned_of_as_each_file_its_own(tmp_path: Path) -> None:
    """ODIR's left and right sources each hold one file per patient, and the ID column that both
    name as the entity keeps a patient's two eyes in one split; yet each source was warned that
    'leakage protection is off', and told to make 'Patient Age' the entity. The entity groups the
    files across the sources that share it, and a patient's age or sex is no id."""
    doc = _odir(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert found.warnings == []
    assert sorted(r.entity for r in found.refs) == ["0", "0", "1", "1", "2", "2", "3", "3"]
    # one source alone: each file is its own entity, but no column or path part names a patient
    doc["sources"] = doc["sources"][:1]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert discover(load_job(tmp_path / "job.yaml")).warnings == []


def test_a_patient_column_whose_cells_group_no_files_is_not_offered_as_the_entity(tmp_path: Path) -> None:
    """A column named like a patient id whose cells are one per file would make each file its own
    entity again: it is not named; one whose cells repeat is."""
    _files(tmp_path / "raw", ["a.png", "b.png", "c.png"])
    _csv(tmp_path / "raw" / "t.csv", "path,label,patient_id,subject_ref", ["a.png,x,p1,s1", "b.png,y,p1,s2",
                                                                           "c.png,x,p2,s3"])
    doc = {"root": "raw", "table": "raw/t.csv", "entity": "path", "label": {"column": "label"}}
    found = discover(load_job(_job(tmp_path, doc)))
    assert len(found.warnings) == 1 and "Column 'patient_id' looks like a patient id" in found.warnings[0]
    _csv(tmp_path / "raw" / "t.csv", "path,label,patient_id,subject_ref", ["a.png,x,p1,s1", "b.png,y,p2,s2",
                                                                           "c.png,x,p3,s3"])
    assert discover(load_job(_job(tmp_path, doc))).warnings == []


def _eyepacs(tmp_path: Path, entity: Any, names: list[str] | None = None) -> Path:
    """Kaggle's Diabetic Retinopathy: trainLabels.csv of image (10_left, no extension) and level."""
    names = names or [f"{p}_{eye}" for p in (10, 13, 15, 16) for eye in ("left", "right")]
    _files(tmp_path / "raw" / "train", [f"{n}.jpeg" for n in names])
    _csv(tmp_path / "raw" / "trainLabels.csv", "image,level", [f"{n},{i % 5}" for i, n in enumerate(names)])
    return _job(tmp_path, {"root": "raw/train", "entity": entity, "label": {"column": "level"},
                           "table": {"file": "raw/trainLabels.csv", "path": {"template": "{image}.jpeg"}}})


def test_a_patient_id_leading_the_file_names_is_offered_when_each_file_is_its_own_entity(tmp_path: Path) -> None:
    """EyePACS' natural first job names the image column as the entity: each eye is its own entity
    and the two eyes of most patients land in different splits, silently, though the README's
    recipe names this set. The file names' leading token groups the eyes: the warning offers the
    recipe's entity: {path: ...}, which reads one entity per patient."""
    found = discover(load_job(_eyepacs(tmp_path, "image")))
    assert found.warnings == [
        "source 'train': each of its 8 files is its own entity, so leakage protection is off: no patient can be "
        "kept in one split. The leading part '10' of the file names (entity: {path: '^(?P<entity>\\d+)_'}) looks "
        "like a patient id: name it in 'entity:'"]
    found = discover(load_job(_eyepacs(tmp_path, {"path": "^(?P<entity>\\d+)_"})))
    assert found.warnings == []
    assert sorted(r.entity for r in found.refs) == ["10", "10", "13", "13", "15", "15", "16", "16"]


@pytest.mark.parametrize("names", [
    [f"ISIC_{n:07d}" for n in range(8)],  # one token for every file: one entity, no patient
    [f"view{v}_{n}" for n in range(4) for v in (1, 2)],  # two views: two groups of all files
    [f"{p}_left" for p in (10, 13, 15, 16)] + [f"{p}_right" for p in (20, 23, 25, 26)],  # no patient twice
])
def test_a_leading_token_that_groups_no_patients_is_not_offered(tmp_path: Path, names: list[str]) -> None:
    assert discover(load_job(_eyepacs(tmp_path, "image", names))).warnings == []


def test_an_entity_column_of_one_file_each_warns_when_a_patient_column_exists(tmp_path: Path) -> None:
    job = _nih(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["entity"] = "Image Index"
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert len(found.warnings) == 1
    assert "each of its 4 files is its own entity" in found.warnings[0]
    assert "leakage protection is off" in found.warnings[0] and "'Patient ID'" in found.warnings[0]
    doc["sources"][0]["entity"] = "Patient ID"
    job.write_text(yaml.safe_dump(doc))
    assert discover(load_job(job)).warnings == []


# -- MIMIC-CXR-JPG: paths built from ids, labels joined from another table -------------------------


def _mimic(tmp_path: Path, *, drop: bool = False) -> Path:
    root = tmp_path / "mimic"
    studies = [("10000032", "50414267", "02aa804e-bde0afdd", "PA"),
               ("10000032", "50414267", "174413ec-4ec4c1f7", "LATERAL"),
               ("10000764", "57375967", "096052b7-d256dc40", "AP"),
               ("10000898", "50771383", "0c4eb1e1-b801903c", "PA")]
    _files(root, [f"files/p{s[:2]}/p{s}/s{st}/{d}.jpg" for s, st, d, _ in studies])
    _csv(root / "mimic-cxr-2.0.0-metadata.csv", "dicom_id,subject_id,study_id,ViewPosition,Rows,Columns",
         [f"{d},{s},{st},{v},3056,2544" for s, st, d, v in studies])
    # the labels of the last study are missing from the chexpert table
    _csv(root / "mimic-cxr-2.0.0-chexpert.csv", "subject_id,study_id,Cardiomegaly,Edema",
         ["10000032,50414267,1.0,0.0", "10000764,57375967,0.0,1.0"])
    return _job(tmp_path, {
        "root": "mimic",
        "table": {"file": "mimic/mimic-cxr-2.0.0-metadata.csv",
                  "path": {"template": "files/p{subject_id:.2}/p{subject_id}/s{study_id}/{dicom_id}.jpg"},
                  "join": [{"file": "mimic/mimic-cxr-2.0.0-chexpert.csv", "on": ["subject_id", "study_id"],
                            **({"missing": "drop"} if drop else {})}]},
        "entity": "subject_id", "where": {"ViewPosition": ["PA", "AP"]},
        "label": {"kind": "multilabel", "columns": ["Cardiomegaly", "Edema"]}})


def test_mimic_paths_are_built_from_ids_and_labels_joined_from_the_chexpert_table(tmp_path: Path) -> None:
    found = discover(load_job(_mimic(tmp_path)))
    refs = _by_path(found)
    assert sorted(refs) == ["files/p10/p10000032/s50414267/02aa804e-bde0afdd.jpg",
                            "files/p10/p10000764/s57375967/096052b7-d256dc40.jpg"]
    assert [r.label for r in refs.values()] == ["Cardiomegaly", "Edema"]
    assert [r.entity for r in refs.values()] == ["10000032", "10000764"]
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("174413ec-4ec4c1f7.jpg", "filtered")]
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("0c4eb1e1-b801903c.jpg", "join_unmatched")]
    assert "no row of" in found.issues[0].message and "subject_id='10000898'" in found.issues[0].message


def test_a_join_with_missing_drop_filters_the_unmatched_rows(tmp_path: Path) -> None:
    found = discover(load_job(_mimic(tmp_path, drop=True)))
    assert found.issues == []
    assert sorted((Path(e.path).name, e.why) for e in found.excluded) == [
        ("0c4eb1e1-b801903c.jpg", "filtered"), ("174413ec-4ec4c1f7.jpg", "filtered")]


def test_a_row_where_filters_out_is_filtered_though_a_joined_table_has_no_row_for_it(tmp_path: Path) -> None:
    """A split table made for the frontal images has no row for the lateral view: where: leaves
    the lateral out, so it is filtered (README: never bad), not a join_unmatched bad sample. A
    frontal image the split table lacks stays join_unmatched, and so does a row that where: can
    judge only on a column of the join that found no row."""
    job = _mimic(tmp_path)
    _csv(tmp_path / "mimic" / "split.csv", "dicom_id,split",
         ["02aa804e-bde0afdd,train", "096052b7-d256dc40,test"])
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["join"].append({"file": "mimic/split.csv", "on": ["dicom_id"]})
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert sorted(_by_path(found)) == ["files/p10/p10000032/s50414267/02aa804e-bde0afdd.jpg",
                                       "files/p10/p10000764/s57375967/096052b7-d256dc40.jpg"]
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("174413ec-4ec4c1f7.jpg", "filtered")]
    assert "ViewPosition is 'LATERAL'" in found.excluded[0].detail
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("0c4eb1e1-b801903c.jpg", "join_unmatched")]
    doc["sources"][0]["where"] = {"split": "train"}  # a column of the split table itself
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert sorted((Path(e.path).name, e.why) for e in found.excluded) == [("096052b7-d256dc40.jpg", "filtered")]
    assert sorted((Path(i.path).name, i.reason) for i in found.issues) == [
        ("0c4eb1e1-b801903c.jpg", "join_unmatched"), ("174413ec-4ec4c1f7.jpg", "join_unmatched")]


def test_a_joined_table_that_repeats_a_column_is_refused_naming_that_table(tmp_path: Path) -> None:
    """A repeated column of a joined table reached each record with its last cells only, as one of
    the main table does: refused, naming the joined table."""
    job = _mimic(tmp_path)
    chexpert = tmp_path / "mimic" / "mimic-cxr-2.0.0-chexpert.csv"
    _csv(chexpert, "subject_id,study_id,Cardiomegaly,Edema,note,note",
         ["10000898,50771383,1.0,0.0,a,b", "10000032,50414267,1.0,0.0,a,b", "10000764,57375967,0.0,0.0,a,b"])
    with pytest.raises(ConfigError, match=rf"{chexpert}: column 'note' is in the header 2 times, and only the last "
                                          "one's cells would be read"):
        discover(load_job(job))


def test_a_bad_label_joined_from_another_table_names_that_tables_row(tmp_path: Path) -> None:
    """The cell to fix is in the joined table: its record names that row first, then the main
    table's row it was joined to (not the main table alone, which does not hold the column)."""
    job = _mimic(tmp_path)
    chexpert = tmp_path / "mimic" / "mimic-cxr-2.0.0-chexpert.csv"
    _csv(chexpert, "subject_id,study_id,Cardiomegaly,Edema",
         ["10000898,50771383,1.0,0.0", "10000032,50414267,1.0,0.0", "10000764,57375967,0.0,maybe"])
    found = discover(load_job(job))
    bad = {Path(i.path).name: i for i in found.issues}
    assert bad["096052b7-d256dc40.jpg"].reason == "bad_target"
    message = bad["096052b7-d256dc40.jpg"].message
    assert message.startswith(f"{chexpert} row 4 (joined to {tmp_path / 'mimic' / 'mimic-cxr-2.0.0-metadata.csv'} "
                              "row 4)"), message
    assert "'maybe'" in message and "Edema" in message


def test_an_empty_entity_joined_from_another_table_names_that_tables_row(tmp_path: Path) -> None:
    """ISIC 2019's lesion_id comes from the joined metadata table (the README's job): a blank one,
    with no empty: policy, is missing_entity, and its record must name the metadata table's row,
    the cell to fill. It named the ground-truth table, which has no lesion_id column, and that
    table's row (a walkthrough's replica; the metadata rows come in another order)."""
    data = tmp_path / "ISIC2019"
    images = ["ISIC_0024306", "ISIC_0024307", "ISIC_0024308"]
    for i, name in enumerate(images):
        (data / "input").mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(data / "input" / f"{name}.png"), np.full((8, 8, 3), 40 * i + 10, np.uint8))
    truth, meta = data / "GroundTruth.csv", data / "Metadata.csv"
    _csv(truth, "image,MEL,NV", [f"{n},0.0,1.0" for n in images])
    _csv(meta, "image,age_approx,lesion_id", ["ISIC_0024308,45.0,", "ISIC_0024307,40.0,HAM_2",
                                              "ISIC_0024306,35.0,HAM_1"])
    job = write_job(tmp_path / "job", {
        "name": "isic", "sources": [{"kind": "image", "root": str(data / "input"),
                                     "table": {"file": str(truth), "path": {"template": "{image}.png"},
                                               "join": [{"file": str(meta), "on": "image"}]},
                                     "entity": {"column": "lesion_id"}, "label": {"columns": ["MEL", "NV"]}}],
        "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"image": {"size": [8, 8]}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")})
    found = discover(load_job(job))
    (issue,) = found.issues
    assert issue.reason == "missing_entity" and Path(issue.path).name == "ISIC_0024308.png"
    assert issue.message.startswith(f"{meta} row 2 (joined to {truth} row 4), column 'lesion_id'"), issue.message


def test_a_join_key_the_joined_table_lacks_is_a_config_error(tmp_path: Path) -> None:
    job = _mimic(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["join"][0]["on"] = ["subject_id", "studyid"]
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"missing column 'studyid' \(named by join.on\); did you mean 'study_id'"):
        discover(load_job(job))


# -- RSNA Pneumonia: one row per box --------------------------------------------------------------


def _rsna(tmp_path: Path, repeated: str, rows: list[str]) -> Path:
    root = tmp_path / "rsna"
    _files(root, ["stage_2_train_images/a1.png", "stage_2_train_images/b2.png", "stage_2_train_images/c3.png"])
    _csv(root / "stage_2_train_labels.csv", "patientId,x,y,width,height,Target", rows)
    return _job(tmp_path, {
        "root": "rsna", "table": {"file": "rsna/stage_2_train_labels.csv",
                                  "path": {"template": "stage_2_train_images/{patientId}.png"}, "repeated": repeated},
        "entity": "patientId", "label": {"column": "Target"}})


def test_rows_of_one_image_that_agree_make_one_sample(tmp_path: Path) -> None:
    found = discover(load_job(_rsna(tmp_path, "same", ["a1,264,152,213,379,1", "a1,562,152,256,453,1",
                                                        "b2,,,,,0", "c3,10,10,5,5,1"])))
    assert [(r.relpath, r.label) for r in found.refs] == [("stage_2_train_images/a1.png", "1"),
                                                           ("stage_2_train_images/b2.png", "0"),
                                                           ("stage_2_train_images/c3.png", "1")]
    assert found.issues == []


def test_rows_of_one_image_keep_only_the_cells_they_agree_on_whatever_their_order(tmp_path: Path) -> None:
    """Two box rows of a1: the file's record held the first row's box (the README: the boxes are
    not packed), so reversing the table's rows changed the packed record and the dataset's hash.
    Only the cells every row of the file shares are kept."""
    rows = ["a1,264,152,213,379,1", "a1,562,152,256,453,1", "b2,,,,,0", "c3,10,10,5,5,1"]
    found = discover(load_job(_rsna(tmp_path / "as-written", "same", rows)))
    reverse = discover(load_job(_rsna(tmp_path / "reversed", "same", rows[::-1])))
    extras = {r.relpath: dict(r.extra) for r in found.refs}
    assert extras == {r.relpath: dict(r.extra) for r in reverse.refs}
    assert extras["stage_2_train_images/a1.png"] == {"y": "152"}  # the one cell both boxes share
    assert extras["stage_2_train_images/c3.png"] == {"x": "10", "y": "10", "width": "5", "height": "5"}


def test_rows_of_one_image_that_disagree_are_a_bad_target(tmp_path: Path) -> None:
    found = discover(load_job(_rsna(tmp_path, "same", ["a1,264,152,213,379,1", "a1,,,,,0", "b2,,,,,0",
                                                        "c3,,,,,0"])))
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("a1.png", "bad_target")]
    assert "rows 2 and 3" in found.issues[0].message


def test_repeated_rows_are_refused_unless_the_job_says_how_to_take_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"row 3: 'stage_2_train_images/a1.png' is listed twice .*repeated: same"):
        discover(load_job(_rsna(tmp_path, "refuse", ["a1,1,1,1,1,1", "a1,2,2,2,2,1", "b2,,,,,0", "c3,,,,,0"])))


def test_repeated_rows_united_give_every_row_s_labels(tmp_path: Path) -> None:
    root = tmp_path / "vindr"
    _files(root, ["a.png", "b.png"])
    _csv(root / "annotations.csv", "image_id,class_name,rad_id",
         ["a,Nodule/Mass,R8", "a,Aortic enlargement,R9", "a,Nodule/Mass,R10", "b,No finding,R8"])
    found = discover(load_job(_job(tmp_path, {
        "root": "vindr", "table": {"file": "vindr/annotations.csv", "path": {"template": "{image_id}.png"},
                                   "repeated": "union"},
        "entity": "image_id", "label": {"kind": "multilabel", "column": "class_name"}})))
    assert [r.label for r in found.refs] == ["Aortic enlargement|Nodule/Mass", "No finding"]


@pytest.mark.parametrize("missing", ["bad", "drop"])
def test_an_absent_file_whose_rows_disagree_is_one_missing_file_record_naming_both(tmp_path: Path,
                                                                                  missing: str) -> None:
    """A file the table names twice with different targets and that is not on disk was in no
    record at all: refused for the disagreement, it was looked for only among the listed files.
    It is one file: one missing_file (or, under missing: drop, not_downloaded) naming both rows."""
    job = _rsna(tmp_path, "same", ["a1,,,,,0", "b2,,,,,0", "c3,,,,,0", "zz,,,,,0", "zz,1,1,5,5,1"])
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["missing"] = missing
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    gone = str(tmp_path / "rsna" / "stage_2_train_images" / "zz.png")
    records = [(i.path, i.reason, i.message) for i in found.issues] + [
        (e.path, e.why, e.detail) for e in found.excluded]
    assert [(path, reason) for path, reason, _ in records] == [
        (gone, "missing_file" if missing == "bad" else "not_downloaded")]
    message = records[0][2]
    assert "stage_2_train_labels.csv rows 5 and 6 " in message
    assert "refuses its rows as well (bad_target:" in message and "the targets '0' and '1'" in message
    assert len(found.refs) == 3


def test_an_absent_file_whose_united_rows_disagree_on_the_entity_is_one_missing_file_record(tmp_path: Path) -> None:
    root = tmp_path / "vindr"
    _files(root, ["a.png"])
    _csv(root / "annotations.csv", "image_id,class_name,patient",
         ["a,Nodule/Mass,P1", "z,Nodule/Mass,P2", "z,Aortic enlargement,P3"])
    found = discover(load_job(_job(tmp_path, {
        "root": "vindr", "table": {"file": "vindr/annotations.csv", "path": {"template": "{image_id}.png"},
                                   "repeated": "union"},
        "entity": "patient", "label": {"kind": "multilabel", "column": "class_name"}})))
    assert [(i.path, i.reason) for i in found.issues] == [(str(root / "z.png"), "missing_file")]
    assert "rows 3 and 4 list 'z.png'" in found.issues[0].message
    assert "entity 'P2' and 'P3'" in found.issues[0].message


def _rsna_joined(tmp_path: Path, repeated: str, rows: list[str]) -> Path:
    """RSNA's labels joined to a class-info table that has no row for the patient ``zz``."""
    job = _rsna(tmp_path, repeated, rows)
    _csv(tmp_path / "rsna" / "class_info.csv", "patientId,class", ["a1,Lung Opacity", "b2,Normal", "c3,Normal"])
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["table"]["join"] = [{"file": "rsna/class_info.csv", "on": "patientId"}]
    job.write_text(yaml.safe_dump(doc))
    return job


@pytest.mark.parametrize("zz_rows", [["zz,,,,,0", "zz,,,,,0"], ["zz,1,1,5,5,1", "zz,2,2,5,5,1", "zz,3,3,5,5,1"]])
def test_an_absent_file_without_a_joined_row_is_one_join_unmatched_record_however_many_rows_name_it(
        tmp_path: Path, zz_rows: list[str]) -> None:
    """Each row of an absent, unjoined file was its own join_unmatched record, all with one
    sample_id: the file counted once per row among the inputs and the bad fraction. The record's
    path was the bare cell; it is the file's path under the root, as every other record's."""
    found = discover(load_job(_rsna_joined(tmp_path, "same", ["a1,,,,,0", "b2,,,,,0", "c3,,,,,0", *zz_rows])))
    gone = str(tmp_path / "rsna" / "stage_2_train_images" / "zz.png")
    assert [(i.path, i.reason) for i in found.issues] == [(gone, "join_unmatched")]
    assert found.excluded == [] and len(found.refs) == 3
    for number in range(5, 5 + len(zz_rows)):
        assert f"stage_2_train_labels.csv row {number}: no row of" in found.issues[0].message


@pytest.mark.parametrize(("repeated", "listed"), [("same", ["a.png"]), ("same", ["a.png", "z.png"]),
                                                  ("refuse", ["a.png"])])
def test_a_file_with_one_joined_row_and_one_without_is_one_record(tmp_path: Path, repeated: str,
                                                                   listed: list[str]) -> None:
    """Rows 3 and 4 name z.png; the site table joins row 3 only. Absent, the file was both a
    join_unmatched and a missing_file record; it is one file: its join_unmatched record. Under
    repeated: refuse two rows of one file are refused, joined or not."""
    root = tmp_path / "sites"
    _files(root, listed)
    _csv(root / "labels.csv", "id,site,label", ["a,s1,cat", "z,s1,dog", "z,s9,dog"])
    _csv(root / "sites.csv", "site,scanner", ["s1,GE"])
    job = _job(tmp_path, {"root": "sites", "entity": "id",
                          "table": {"file": "sites/labels.csv", "path": {"template": "{id}.png"},
                                    "repeated": repeated, "join": [{"file": "sites/sites.csv", "on": "site"}]}})
    if repeated == "refuse":
        with pytest.raises(ConfigError, match=r"row 4: 'z.png' is listed twice \(first on row 3\)"):
            discover(load_job(job))
        return
    found = discover(load_job(job))
    assert [(i.path, i.reason) for i in found.issues] == [(str(root / "z.png"), "join_unmatched")]
    assert "labels.csv row 4: no row of" in found.issues[0].message
    assert found.excluded == [] and [r.relpath for r in found.refs] == ["a.png"]


def test_rows_without_a_joined_row_naming_one_file_are_refused_as_repeated_rows(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"row 6: 'stage_2_train_images/zz.png' is listed twice \(first on row 5\)"):
        discover(load_job(_rsna_joined(tmp_path, "refuse", ["a1,,,,,0", "b2,,,,,0", "c3,,,,,0", "zz,,,,,0",
                                                            "zz,,,,,0"])))


# -- the Medical Segmentation Decathlon: a JSON list of records ------------------------------------


def test_a_dataset_json_is_a_table_of_records(tmp_path: Path) -> None:
    root = tmp_path / "Task02_Heart"
    root.mkdir()
    for case in ("la_003", "la_007"):
        for folder in ("imagesTr", "labelsTr"):
            (root / folder).mkdir(exist_ok=True)
            (root / folder / f"{case}.nii.gz").write_bytes(b"fake")
    (root / "imagesTs").mkdir()
    (root / "imagesTs" / "la_001.nii.gz").write_bytes(b"fake")
    (root / "dataset.json").write_text(json.dumps({
        "name": "LeftAtrium", "labels": {"0": "background", "1": "left atrium"}, "numTraining": 2,
        "training": [{"image": "./imagesTr/la_007.nii.gz", "label": "./labelsTr/la_007.nii.gz"},
                     {"image": "./imagesTr/la_003.nii.gz", "label": "./labelsTr/la_003.nii.gz"}],
        "test": ["./imagesTs/la_001.nii.gz"]}))
    job = _job(tmp_path, {
        "root": "Task02_Heart", "table": {"file": "Task02_Heart/dataset.json", "records": "training",
                                          "path": "image", "files": "table"},
        "entity": {"path": r"(?P<entity>la_\d+)"}, "label": "none",
        "mask": {"column": "label", "classes": [0, 1]}})
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["kind"] = "nifti"
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert [(r.relpath, r.entity, dict(r.extra)["label"]) for r in found.refs] == [
        ("imagesTr/la_003.nii.gz", "la_003", "labelsTr/la_003.nii.gz"),
        ("imagesTr/la_007.nii.gz", "la_007", "labelsTr/la_007.nii.gz")]
    # the test image has no labels: out of the dataset, counted, not bad; label maps are the rows' masks
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("la_001.nii.gz", "not_in_table")]
    assert found.issues == []
    # without files: table the test image is a bad sample, whose record says how to leave it out
    del doc["sources"][0]["table"]["files"]
    job.write_text(yaml.safe_dump(doc))
    (issue,) = discover(load_job(job)).issues
    assert issue.reason == "mask_missing" and issue.message == (
        f"{root / 'imagesTs' / 'la_001.nii.gz'}: no mask ({root / 'dataset.json'} has no row for it); add its row, or, "
        "where the table names only the dataset's files (the Decathlon's imagesTs/ has no labels), set table.files: "
        "table")


def test_a_json_boolean_or_list_is_no_number_for_a_numeric_target_and_a_0_1_label_for_multilabel(
        tmp_path: Path) -> None:
    """A JSON table's numeric target field holding true, false or [3] was packed as 1.0, 0.0 and
    3.0 (booleans were read as 1/0 and lists joined, which suits 0/1 label columns): the same cell
    of a CSV table is bad_target. A numeric target's boolean or list is now its JSON text, no
    number, so the sample is bad_target naming it; a multilabel 0/1 column still reads true as 1."""
    root = tmp_path / "t"
    _files(root, [f"{i}.png" for i in range(4)])
    values: list[Any] = [True, False, [3], 41.5]
    (root / "dataset.json").write_text(json.dumps({"training": [
        {"image": f"{i}.png", "age": v, "effusion": i == 0, "nodule": 1} for i, v in enumerate(values)]}))
    source = {"root": "t", "table": {"file": "t/dataset.json", "records": "training", "path": "image"},
              "entity": {"component": -1}}
    found = discover(load_job(_job(tmp_path, {**source, "label": {"kind": "numeric", "columns": ["age"]}})))
    assert [(r.relpath, r.label) for r in found.refs] == [("3.png", "41.5")]
    assert [(Path(i.path).name, i.reason, i.message.split(": ", 1)[1]) for i in found.issues] == [
        (f"{i}.png", "bad_target", f"{cell!r} is not a finite number (written as 12, -1.5 or 1e-3); every sample "
                                   "needs a number here") for i, cell in enumerate(["true", "false", "[3]"])]
    found = discover(load_job(_job(tmp_path, {**source, "label": {"kind": "multilabel",
                                                                  "columns": ["effusion", "nodule"]}})))
    assert [(r.relpath, r.label) for r in found.refs] == [
        ("0.png", "effusion|nodule"), ("1.png", "nodule"), ("2.png", "nodule"), ("3.png", "nodule")]
    assert found.issues == []


def test_a_json_table_without_its_records_key_names_the_lists_it_holds(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _files(root, ["a.png"])
    (root / "dataset.json").write_text(json.dumps({"training": [{"image": "a.png"}], "test": []}))
    job = _job(tmp_path, {"root": "t", "table": {"file": "t/dataset.json", "records": "train", "path": "image"},
                          "label": "none", "entity": {"component": -1}})
    with pytest.raises(ConfigError, match=r"records: no key 'train'; the object's lists are 'training', 'test'"):
        discover(load_job(job))



def test_a_json_table_nested_past_the_stack_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _files(root, ["a.png"])
    (root / "dataset.json").write_text('{"training": ' + "[" * 50000 + "]" * 50000 + "}")
    job = _job(tmp_path, {"root": "t", "table": {"file": "t/dataset.json", "records": "training", "path": "image"},
                          "label": "none", "entity": {"component": -1}})
    with pytest.raises(ConfigError, match=r"dataset\.json: JSON nested too deeply to read"):
        discover(load_job(job))

# -- identity: a plain table keeps its config ------------------------------------------------------


def test_a_table_given_as_a_file_keeps_the_config_it_had(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _files(root, ["a.png"])
    _csv(root / "labels.csv", "path,label,entity", ["a.png,cat,S1"])
    plain = load_job(_job(tmp_path, {"root": "raw", "table": "raw/labels.csv"}))
    assert plain.identity()["sources"][0]["table"] == "raw/labels.csv"
    assert "fields" not in plain.identity()["sources"][0] and "where" not in plain.identity()["sources"][0]
    same = load_job(_job(tmp_path, {"root": "raw", "table": {"file": "raw/labels.csv"}}))
    assert same.identity() == plain.identity()


def test_a_field_from_the_path_filters_like_a_column(tmp_path: Path) -> None:
    job = _chexpert(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["fields"] = {"view": {"path": r"view\d+_(?P<view>frontal|lateral)"}}
    doc["sources"][0]["where"] = {"view": "frontal"}
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert len(found.refs) == 4 and all(dict(r.extra)["view"] == "frontal" for r in found.refs)
    assert [e.detail for e in found.excluded] == ["view is 'lateral'; where: view = frontal"]


def test_a_table_less_source_filters_on_its_paths(tmp_path: Path) -> None:
    root = tmp_path / "folders"
    _files(root, ["cat/a_frontal.png", "cat/b_lateral.png", "dog/c_frontal.png"])
    found = discover(load_job(_job(tmp_path, {
        "root": "folders", "label": "folder", "fields": {"view": {"path": r"_(frontal|lateral)\."}},
        "where": {"view": {"not": "lateral"}}})))
    assert [(r.relpath, r.label) for r in found.refs] == [("cat/a_frontal.png", "cat"), ("dog/c_frontal.png", "dog")]
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("b_lateral.png", "filtered")]


def test_a_misspelt_where_key_on_a_dicom_table_suggests_the_column_and_the_keyword(tmp_path: Path) -> None:
    root = tmp_path / "ct"
    root.mkdir()
    _csv(tmp_path / "labels.csv", "path,label,Site", ["a.dcm,nodule,x"])
    job = _job(tmp_path, {"root": "ct", "labels": "labels.csv", "where": {"modality": "CT"}})
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["kind"] = "dicom"
    doc["phi"] = {"mode": "keep"}
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"missing column 'modality' \(named by where\); or, did you mean the "
                                          r"DICOM keyword 'Modality'\?"):
        discover(load_job(job))


def test_a_hand_written_join_may_say_on_unquoted(tmp_path: Path) -> None:
    """YAML 1.1 reads ``on`` as true; job files follow YAML 1.2, where only true and false are."""
    _mimic(tmp_path)
    (tmp_path / "job.yaml").write_text("""\
name: t
sources:
  - kind: image
    root: mimic
    table:
      file: mimic/mimic-cxr-2.0.0-metadata.csv
      path: {template: 'files/p{subject_id:.2}/p{subject_id}/s{study_id}/{dicom_id}.jpg'}
      join: [{file: mimic/mimic-cxr-2.0.0-chexpert.csv, on: [subject_id, study_id], missing: drop}]
    entity: subject_id
    where: {ViewPosition: [PA, AP], Rows: {not: [no, off]}}
    label: {kind: multilabel, columns: [Cardiomegaly, Edema]}
split: {by: entity}
pack: {format: webdataset}
output: out
""")
    job = load_job(tmp_path / "job.yaml")
    assert job.sources[0].table_map is not None and job.sources[0].table_map.join[0].on == ("subject_id", "study_id")
    assert [c.values for c in job.sources[0].where if c.key == "Rows"] == [("no", "off")]
    assert len(discover(job).refs) == 2


def test_a_join_key_given_twice_is_named_by_its_rows_not_its_value_under_phi(tmp_path: Path) -> None:
    """The join key is often the patient id (a clinical table joined on it): under phi: pseudonymize the
    error, printed where CI logs keep it, names the two rows and the column, never the id."""
    from packer.phi import Pseudonymizer

    root = tmp_path / "photos"
    _files(root, ["a.png", "b.png"])
    _csv(root / "labels.csv", "path,label,entity", ["a.png,x,ZZPHI_MRN_5551", "b.png,y,ZZPHI_MRN_5552"])
    _csv(root / "clinical.csv", "entity,age", ["ZZPHI_MRN_5551,40", "ZZPHI_MRN_5551,41", "ZZPHI_MRN_5552,50"])
    job = load_job(_job(tmp_path, {"root": "photos", "table": {
        "file": "photos/labels.csv", "join": [{"file": "photos/clinical.csv", "on": ["entity"]}]}},
        phi={"mode": "pseudonymize"}))
    with pytest.raises(ConfigError) as pseudonymized:
        discover(job, Pseudonymizer(mode="pseudonymize", dates="shift", key=b"0" * 64))
    assert "rows 2 and 3" in str(pseudonymized.value) and "entity" in str(pseudonymized.value)
    assert "ZZPHI" not in str(pseudonymized.value)
    with pytest.raises(ConfigError, match=r"rows 2 and 3 both have entity='ZZPHI_MRN_5551'"):
        discover(job)  # phi: keep (no pseudonymizer): the value helps find the rows


def test_a_cell_longer_than_pythons_csv_field_limit_is_read_not_a_crash(tmp_path: Path) -> None:
    """Kaggle segmentation tables carry run-length encoded masks in a column (HuBMAP's
    ``encoding``: millions of characters for one kidney slide). Python's csv module refuses a cell
    over 131,072 characters by default, and the build ended with an internal error and a traceback
    (_csv.Error: field larger than field limit) before a file was read. The table is read, the long
    cell whole, and the module's limit is as it was afterwards."""
    import csv

    root = tmp_path / "raw"
    _files(root, ["a.png", "b.png"])
    encoding = " ".join(str(n) for n in range(60_000))  # about 350,000 characters
    _csv(root / "train.csv", "path,label,entity,encoding", [f"a.png,x,p1,{encoding}", "b.png,y,p2,1 2"])
    before = csv.field_size_limit()
    found = _by_path(discover(load_job(_job(tmp_path, {"root": "raw", "table": "raw/train.csv"}))))
    assert csv.field_size_limit() == before
    assert {rel: ref.label for rel, ref in found.items()} == {"a.png": "x", "b.png": "y"}


def test_a_file_the_table_names_in_another_column_says_so_when_it_has_no_row_of_its_own(tmp_path: Path) -> None:
    # a Decathlon-style table (path,entity,mask,label) on a source without mask: the label maps it
    # names were missing_label samples told to "add its row", which would pack a label map as an image
    from click.testing import CliRunner

    from packer.cli import main

    root = tmp_path / "raw"
    _files(root, ["imagesTr/a.png", "imagesTr/b.png", "labelsTr/a.png", "labelsTr/b.png"], real=True)
    _csv(root / "cases.csv", "path,entity,mask,label",
         ["imagesTr/a.png,A,labelsTr/a.png,x", "imagesTr/b.png,B,./labelsTr/b.png,y"])
    job = _job(tmp_path, {"root": "raw", "table": "raw/cases.csv"}, validate={"max_bad_fraction": 1.0},
               transform={"image": {"size": [24, 24]}})
    run = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json",
                                    str(tmp_path / "v.json")])
    assert run.exit_code == 0, run.output
    records = {Path(r["path"]).relative_to(root).as_posix(): r
               for r in json.loads((tmp_path / "v.json").read_text())["bad_samples"]["records"]}
    assert sorted(records) == ["labelsTr/a.png", "labelsTr/b.png"]
    for rel, number in (("labelsTr/a.png", 2), ("labelsTr/b.png", 3)):
        message = records[rel]["message"]
        assert records[rel]["reason"] == "missing_label"
        assert f"row {number}'s column 'mask' names it" in message, message
        assert "mask: {column: mask" in message and "table.files: table" in message
        assert "add its row" not in message


def test_a_channel_files_column_the_table_lacks_is_named_by_its_job_key(tmp_path: Path) -> None:
    # said "missing column 't2' (named by companions)": a word of packer's code, not of the job file
    import nibabel as nib

    from packer.api import validate

    root = tmp_path / "raw"
    root.mkdir()
    volume = np.random.default_rng(0).uniform(1, 9, size=(6, 6, 2)).astype(np.float32)
    nib.save(nib.Nifti1Image(volume, np.eye(4)), root / "a_t1.nii.gz")
    _csv(root / "cases.csv", "path,entity,flair", ["a_t1.nii.gz,A,a_t1.nii.gz"])
    doc = {"name": "t", "sources": [{"kind": "nifti", "root": "raw", "table": "raw/cases.csv", "label": "none",
                                     "channel_files": ["t2"]}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match=r"missing column 't2' \(named by channel_files\)"):
        validate(job, scheduler="sync", progress=False)


def test_a_table_unpacked_one_folder_down_is_pointed_at(tmp_path: Path) -> None:
    """An archive unpacked into a folder of its own name (CheXpert-v1.0-small/CheXpert-v1.0-small/)
    left only "cannot read the table (No such file or directory)"."""
    inner = tmp_path / "data" / "Set-v1" / "Set-v1"
    (inner / "a").mkdir(parents=True)
    cv2.imwrite(str(inner / "a" / "x.png"), np.zeros((8, 8), dtype=np.uint8))
    (inner / "labels.csv").write_text("path,label\na/x.png,yes\n")
    message = _discover_error(_image_job(tmp_path, root="data/Set-v1", table="data/Set-v1/labels.csv", entity="path"))
    assert "cannot read the table" in message, message
    assert f"it is at {inner / 'labels.csv'}: the download was unpacked into a folder of its own name" in message


def _image_job(tmp_path: Path, *, root: str, table: str, entity: str) -> Path:
    """A one-source image job (split by ``entity``, all in train) at ``tmp_path/job.yaml``."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "t", "output": "out", "sources": [{"kind": "image", "root": root, "table": table, "entity": entity}],
        "split": {"by": "entity", "ratios": {"train": 1.0}}, "pack": {"format": "webdataset"}}))
    return job


def _discover_error(job: Path) -> str:
    """The ConfigError discovery raises for ``job``, as text."""
    with pytest.raises(ConfigError) as raised:
        discover(load_job(job))
    return str(raised.value)


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_table_that_is_not_utf8_names_the_bad_bytes_offset_and_line_in_the_file(
        tmp_path: Path, gzipped: bool) -> None:
    """A Latin-1 'é' on line 1002 of a 19 KB table: the message said 'at byte 2540', the offset in
    the text stream's last decoded chunk, pointing the user at a clean byte."""
    import gzip as gzip_module

    _files(tmp_path / "raw", ["a.png"])
    lines = ["path,label,entity", *(f"a.png,cat,p{i:05d}" for i in range(1000)), "a.png,caf\xe9,p1"]
    data = ("\n".join(lines) + "\n").encode("latin-1")
    at = data.index(b"\xe9")
    name = "labels.csv.gz" if gzipped else "labels.csv"
    (tmp_path / name).write_bytes(gzip_module.compress(data) if gzipped else data)
    job = _job(tmp_path, {"root": str(tmp_path / "raw"), "table": {"file": str(tmp_path / name)}})
    with pytest.raises(ConfigError, match=rf"not UTF-8 text \(invalid continuation byte at byte {at}, line 1002\)"):
        discover(load_job(job))


def test_a_row_that_differs_from_its_file_only_in_case_is_named_in_both_records(tmp_path: Path) -> None:
    """A table made on Windows names img_1.png; the disk holds Img_1.PNG. The row's missing_file
    and the file's missing_label records said nothing of each other."""
    _files(tmp_path / "raw", ["Img_1.PNG", "b.png"], real=True)
    _csv(tmp_path / "t.csv", "path,label,entity", ["img_1.png,x,p1", "b.png,y,p2"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "t.csv"}})
    found = discover(load_job(job))
    (missing,) = [i for i in found.issues if i.reason == "missing_file"]
    assert "(the root holds 'Img_1.PNG', which differs from it only in case" in missing.message, missing.message
    (unlabeled,) = [message for message in found.unlabeled.values() if "Img_1.PNG" in message]
    assert "but row 2 names 'img_1.png', which differs from it only in case" in unlabeled, unlabeled


@pytest.mark.parametrize("files", ["root", "table"])
def test_a_row_that_differs_from_its_file_only_in_case_is_not_dropped_as_not_downloaded(
        tmp_path: Path, files: str) -> None:
    """Under missing: drop, a row naming A0.PNG for the on-disk a0.png was left out as not_downloaded
    ('no such file is under the root') and, under files: table, the file as not_in_table: the file
    vanished with no bad sample. The file is there, so the row is a missing_file naming it, and the
    file's own record names the row."""
    _files(tmp_path / "raw", ["a0.png", "a1.png"], real=True)
    _csv(tmp_path / "t.csv", "path,label,entity", ["A0.PNG,x,p1", "a1.png,y,p2", "a2.png,y,p3"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "t.csv", "files": files, "missing": "drop"}})
    found = discover(load_job(job))
    (missing,) = [i for i in found.issues if i.reason == "missing_file"]
    assert Path(missing.path).name == "A0.PNG"
    own = "not_in_table" if files == "table" else "missing_label"
    assert (f"(the root holds 'a0.png', which differs from it only in case: file names compare with their case, so "
            f"that file has no row; its own record is {own}); fix the row (missing: drop leaves out only rows whose "
            "file is not there)") in missing.message, missing.message
    assert [(Path(e.path).name, e.why) for e in found.excluded if e.why == "not_downloaded"] == [
        ("a2.png", "not_downloaded")]  # a file truly not there is still dropped
    if files == "table":
        (left,) = [e for e in found.excluded if e.why == "not_in_table"]
        assert Path(left.path).name == "a0.png"
        assert "but row 2 names 'A0.PNG', which differs from it only in case" in left.detail, left.detail
    else:
        (unlabeled,) = [message for message in found.unlabeled.values() if "a0.png" in message]
        assert "but row 2 names 'A0.PNG', which differs from it only in case" in unlabeled, unlabeled


def test_a_table_whose_backslashed_cells_are_file_names_says_the_archive_lost_its_folders(tmp_path: Path) -> None:
    """A Windows zip unpacked where a backslash is no separator leaves files named 'case0\\img.png';
    the table (written on Windows) names them so, and a backslash in a cell is a folder separator:
    no row matches. The error printed the cell and the file, two identical strings, and suggested
    find: name, which does not help."""
    names = [f"case{i}\\img.png" for i in range(3)]
    _files(tmp_path / "raw", names)
    _csv(tmp_path / "raw" / "t.csv", "path,label,entity", [f"{n},cat,S{i}" for i, n in enumerate(names)])
    message = _discover_error(_job(tmp_path, {"root": "raw", "table": "raw/t.csv"}))
    assert "a backslash in the cells is read as a folder separator" in message, message
    assert "'case0\\\\img.png' is one file" in message and "find: name" not in message


def test_sources_with_nested_roots_warn_that_they_read_one_file_twice(tmp_path: Path) -> None:
    """root: data beside root: data/sub (a common slip): every file under sub/ was packed twice and
    counted twice among the inputs and the bad samples, without a word; sources over one root parted
    by where: read each file once and say nothing."""
    _files(tmp_path / "data", ["cat/a.png", "sub/dog/b.png", "sub/dog/c.png"])
    doc = {"name": "t", "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out",
           "sources": [{"kind": "image", "name": "all", "root": "data", "label": "folder"},
                       {"kind": "image", "name": "sub", "root": "data/sub", "label": "folder"}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    found = discover(load_job(tmp_path / "job.yaml"))
    (warning,) = [w for w in found.warnings if "several sources" in w]
    assert warning.startswith("2 file(s) are read by several sources (all, sub; e.g. ")
    assert "nested or shared" in warning
    from packer.pipeline.discover import _read_twice

    (hidden,) = _read_twice(found.refs, hide_paths=True)  # under PHI pseudonymization: no path, a folder may be a name
    assert hidden.startswith("2 file(s) are read by several sources (all, sub): ") and "dog" not in hidden
    top = {"top": {"path": "^(?P<top>[^/]+)/"}}
    doc["sources"] = [{"kind": "image", "name": "cats", "root": "data", "label": "folder", "fields": top,
                       "where": {"top": "cat"}},
                      {"kind": "image", "name": "rest", "root": "data", "label": "folder", "fields": top,
                       "where": {"top": "sub"}}]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert not [w for w in discover(load_job(tmp_path / "job.yaml")).warnings if "several sources" in w]


def test_rows_of_one_image_naming_two_masks_disagree_and_neither_mask_is_an_image(tmp_path: Path) -> None:
    """repeated: same kept the first row's mask unsaid and took the second mask file for an image
    without a row (a mask_missing bad sample); the rows disagree, so the image is bad_target, and
    both masks stay the table's files, no samples of their own."""
    _files(tmp_path / "raw", ["i0.png", "i0_m.png", "i0_other.png", "i1.png", "i1_m.png"])
    _csv(tmp_path / "raw" / "t.csv", "path,mask,dx,entity",
         ["i0.png,i0_m.png,a,e0", "i1.png,i1_m.png,a,e1", "i0.png,i0_other.png,a,e0"])
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "repeated": "same"},
                                              "label": {"column": "dx"}, "mask": {"column": "mask"}})))
    assert [r.relpath for r in found.refs] == ["i1.png"]
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("i0.png", "bad_target")]
    assert "rows 2 and 4 name 'i0.png' with mask 'i0_m.png' and 'i0_other.png'" in found.issues[0].message


def test_a_file_with_a_row_of_its_own_is_a_sample_though_another_row_names_it_as_a_mask(tmp_path: Path) -> None:
    """a.png's mask is b.png, and b.png has its own row: b.png was neither packed, nor bad, nor left
    out, and not counted among the inputs. The table gives it a row: it is a sample."""
    _files(tmp_path / "raw", ["a.png", "b.png", "c_m.png"])
    _csv(tmp_path / "raw" / "t.csv", "path,mask,dx,entity", ["a.png,b.png,x,e0", "b.png,c_m.png,x,e1"])
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": "raw/t.csv", "label": {"column": "dx"},
                                              "mask": {"column": "mask"}})))
    assert sorted(r.relpath for r in found.refs) == ["a.png", "b.png"] and not found.issues


def test_the_mask_of_a_row_where_or_a_join_leaves_out_is_left_out_with_its_row(tmp_path: Path) -> None:
    """README: a file whose row where: leaves out (or a join's missing: drop) is filtered, never a
    bad sample. Its row's mask was taken for an image without a row: a mask_missing bad sample
    ("the table has no row for it", which it has), counted against max_bad_fraction. It belongs
    to its row and is left out with it; a row a join leaves unmatched keeps its mask too."""
    _files(tmp_path / "raw", ["i0.png", "i0_m.png", "i1.png", "i1_m.png", "i2.png", "i2_m.png"])
    _csv(tmp_path / "raw" / "t.csv", "path,mask,entity,quality",
         ["i0.png,i0_m.png,e0,good", "i1.png,i1_m.png,e1,poor", "i2.png,i2_m.png,e2,good"])
    _csv(tmp_path / "raw" / "sites.csv", "entity,site", ["e0,A", "e1,A"])  # no row for e2
    job = _job(tmp_path, {"root": "raw", "label": "none", "mask": {"column": "mask"}, "where": {"quality": "good"},
                          "table": {"file": "raw/t.csv",
                                    "join": [{"file": "raw/sites.csv", "on": ["entity"], "missing": "drop"}]}})
    found = discover(load_job(job))
    assert [r.relpath for r in found.refs] == ["i0.png"] and found.issues == []
    assert sorted((Path(e.path).name, e.why) for e in found.excluded) == [("i1.png", "filtered"),
                                                                          ("i2.png", "filtered")]
    doc = yaml.safe_load(job.read_text())
    del doc["sources"][0]["table"]["join"][0]["missing"]  # missing: bad, the default
    job.write_text(yaml.safe_dump(doc))
    found = discover(load_job(job))
    assert [r.relpath for r in found.refs] == ["i0.png"]
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("i2.png", "join_unmatched")]
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("i1.png", "filtered")]


def test_a_mask_cell_spelled_in_another_unicode_form_names_its_file(tmp_path: Path) -> None:
    """README: a cell spelled in another Unicode form than its file's name names that file, and
    mask columns are read as the path column is. The table is NFC text, the files were named on
    macOS (NFD): the image was found, its mask was mask_missing, and the mask file a second bad
    sample with no row. A mask the source does not list (a .npy of class ids) is found too."""
    nfd = {name: unicodedata.normalize("NFD", name) for name in ("Zoë/café.png", "Zoë/café_m.png", "Zoë/crème.png",
                                                                 "Zoë/crème_m.npy")}
    _files(tmp_path / "raw", list(nfd.values()))
    _csv(tmp_path / "raw" / "t.csv", "path,mask,entity",
         [unicodedata.normalize("NFC", "Zoë/café.png,Zoë/café_m.png,e0"),
          unicodedata.normalize("NFC", "Zoë/crème.png,Zoë/crème_m.npy,e1")])
    job = load_job(_job(tmp_path, {"root": "raw", "table": "raw/t.csv", "label": "none", "mask": {"column": "mask"}}))
    found = discover(job)
    assert found.issues == [] and found.excluded == []
    source = job.sources[0]
    assert {r.relpath: source.mask_file(r.extra) for r in found.refs} == {
        nfd["Zoë/café.png"]: str(tmp_path / "raw" / nfd["Zoë/café_m.png"]),
        nfd["Zoë/crème.png"]: str(tmp_path / "raw" / nfd["Zoë/crème_m.npy"])}


def test_a_time_split_takes_each_files_time_from_its_path_without_a_table(tmp_path: Path) -> None:
    """README: time may come from the path like entity. A source with `time: {component: 0}` and
    no table was refused under by: time ('needs each file's time, from a table')."""
    import pyarrow.parquet as pq

    files = {"2023-06-01/A_1.png": "train", "2023-06-02/A_2.png": "train", "2024-02-01/B_1.png": "valid",
             "2024-08-01/C_1.png": "test"}
    _files(tmp_path / "raw", list(files), real=True)
    job = _job(tmp_path, {"root": "raw", "label": "none", "entity": {"path": r"(?P<entity>[A-Z])_\d"},
                          "time": {"component": 0}},
               split={"by": "time", "cutoffs": {"valid": "2024-01-01", "test": "2024-07-01"},
                      "balance": {"accept": True}})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    rows = pq.read_table(result.version_dir / "_splits.parquet").to_pylist()
    assert {row["entity_id"]: row["split"] for row in rows} == {"A": "train", "B": "valid", "C": "test"}
    assert len(rows) == len(files)


def test_a_time_from_the_path_that_is_no_date_names_the_path_not_a_table_cell(tmp_path: Path) -> None:
    files = ["2023-06-01/A_1.png", "2024-02-01/B_1.png", "2024_07_01/C_1.png"]
    _files(tmp_path / "raw", files, real=True)
    job = _job(tmp_path, {"root": "raw", "label": "none", "entity": {"path": r"(?P<entity>[A-Z])_\d"},
                          "time": {"component": 0}},
               split={"by": "time", "cutoffs": {"valid": "2024-01-01", "test": "2024-07-01"},
                      "balance": {"accept": True}}, validate={"max_bad_fraction": 0.5})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "missing_time"
    assert "'2024_07_01/C_1.png' that the source's time: {component: 0} reads" in record["message"]
    assert "cell" not in record["message"]


@pytest.mark.parametrize("by", ["entity", "time"])
def test_rows_of_one_file_agree_on_a_time_written_two_ways_and_not_on_another_time(tmp_path: Path, by: str) -> None:
    """repeated: same compared the time cells as text: '2024-03-05 14:30' and '2024-03-05T14:30:00',
    one time by packer's own reading, made the file bad_target."""
    _files(tmp_path / "raw", ["a.png", "b.png", "c.png"])
    _csv(tmp_path / "raw" / "t.csv", "path,dx,entity,timestamp",
         ["a.png,x,e0,2024-03-05 14:30", "b.png,x,e1,2024-01-01", "a.png,x,e0,2024-03-05T14:30:00",
          "c.png,x,e2,2024-03-05", "c.png,x,e2,2024-03-06"])
    split = {"by": "time", "cutoffs": {"valid": "2024-02-01"}} if by == "time" else {"by": "entity"}
    found = discover(load_job(_job(tmp_path, {"root": "raw", "table": {"file": "raw/t.csv", "repeated": "same"},
                                              "label": {"column": "dx"}}, split=split)))
    assert sorted(r.relpath for r in found.refs) == ["a.png", "b.png"]
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("c.png", "bad_target")]
    assert "with time '2024-03-05' and '2024-03-06'" in found.issues[0].message


@pytest.mark.parametrize("mode", ["keep", "pseudonymize"])
@pytest.mark.parametrize("name", ["img_{i}.png", "IM00000{i}", "img_{i}.dcm.gz"])  # a PACS name has no extension
def test_a_table_without_a_header_row_is_named_so_and_its_first_row_not_quoted_under_pseudonymize(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, name: str) -> None:
    """An export without a header row: the missing-column error quoted its first row as "the header
    row has Doe_John_1960/img_0.png, circle, MRN12345", a patient's folder name and record number
    printed into a CI log under phi: pseudonymize, and it never said the row was data."""
    from packer.redact import job_scope

    monkeypatch.setenv("PACKER_PHI_KEY", "0123456789abcdef" * 4)
    names = [name.format(i=i) for i in range(2)]
    for each in names:
        (tmp_path / "raw" / "Doe_John_1960").mkdir(parents=True, exist_ok=True)
        (tmp_path / "raw" / "Doe_John_1960" / each).write_bytes(b"x")
    (tmp_path / "t.csv").write_text("".join(f"Doe_John_1960/{each},circle,MRN12345\n" for each in names))
    job = _job(tmp_path, {"root": "raw", "table": "t.csv"}, phi={"mode": mode})
    with job_scope(), pytest.raises(ConfigError) as err:
        discover(load_job(job))
    message = str(err.value)
    assert "its first row reads as data, not as a header (a cell names a file): add a header row" in message
    assert ("MRN12345" in message) == ("Doe_John" in message) == (mode == "keep"), message
    assert mode == "keep" or "the header row has 3 cell(s), not quoted under phi: pseudonymize" in message


def test_a_headerless_table_of_bare_pacs_names_found_below_the_root_is_named_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A headerless table of bare names (find: name) or paths under a path_base: its first row named
    files that are not at root/cell, so it was taken for a header and quoted, MRN and all."""
    from packer.redact import job_scope

    monkeypatch.setenv("PACKER_PHI_KEY", "0123456789abcdef" * 4)
    deep = tmp_path / "raw" / "DICOM" / "Doe_John_1960" / "ST000000"
    deep.mkdir(parents=True)
    for i in range(2):
        (deep / f"IM00000{i}").write_bytes(b"x")
    (tmp_path / "t.csv").write_text("".join(f"IM00000{i},circle,MRN12345\n" for i in range(2)))
    job = _job(tmp_path, {"root": "raw", "table": "t.csv"}, phi={"mode": "pseudonymize"})
    with job_scope(), pytest.raises(ConfigError) as err:
        discover(load_job(job))
    assert "its first row reads as data" in str(err.value) and "MRN12345" not in str(err.value), err.value
