"""Public datasets as they ship: their tables, their official split lists and their file names
read as published, with no file rewritten by hand.

NIH ChestX-ray14 downloaded in part (its first archives only, ``missing: drop``) with its
official lists; PadChest's ``Labels`` column written as Python list text; a DICOM export whose
files are named by their SOP Instance UID, without an extension. Every test builds a small real
tree and reads what the build wrote.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest

from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.splitlists import stem_of
from packer.targets.multilabel import _names_of_column
from tests.dicom_files import ct_dataset, ct_pixels, save
from tests.helpers import write_job


def photo(seed: int) -> np.ndarray:
    """A textured grey image, different for every seed (no two are near copies)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (64, 48), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def run_build(job: Path) -> BuildResult:
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True))


def built_splits(result: BuildResult) -> Counter[tuple[str, str]]:
    """How many samples of each (entity, split), as ``_index.parquet`` records them."""
    index = pq.read_table(result.version_dir / "_index.parquet", columns=["entity_id", "split"]).to_pylist()
    return Counter((row["entity_id"], row["split"]) for row in index)


def excluded(result: BuildResult) -> dict[str, str]:
    """File name → why, as ``excluded.jsonl`` lists the files left out on purpose."""
    lines = (result.version_dir / "excluded.jsonl").read_text().splitlines()
    return {Path(record["path"]).name: record["why"] for record in map(json.loads, lines)}


# ---------------------------------------------------------------------------------------------
# NIH ChestX-ray14, its first archive only, with its official lists


def nih_partial(folder: Path) -> tuple[Path, dict[str, Any]]:
    """Patients 0-11 in ``images_001`` (downloaded), 12-15 in ``images_002`` (not downloaded);
    patient 3's second image is an AP view, which the job's ``where:`` leaves out. The lists
    are NIH's: ``train_val_list.txt`` names patients 0-13 (two of them not downloaded),
    ``test_list.txt`` patients 14-15 (none downloaded)."""
    data = folder / "nih"
    rows = []
    for patient in range(16):
        for image in range(2):
            name = f"{patient:08d}_{image:03d}.png"
            if patient < 12:
                where = data / "images_001" / "images" / name
                where.parent.mkdir(parents=True, exist_ok=True)
                assert cv2.imwrite(str(where), photo(10 * patient + image))
            view = "AP" if (patient, image) == (3, 1) else "PA"
            rows.append(f"{name},{'No Finding' if image else 'Effusion'},{image},{patient},{view}")
    (data / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels,Follow-up #,Patient ID,View Position\n"
                                              + "\n".join(rows) + "\n")
    (data / "train_val_list.txt").write_text("".join(f"{p:08d}_{i:03d}.png\n" for p in range(14) for i in range(2)))
    (data / "test_list.txt").write_text("".join(f"{p:08d}_{i:03d}.png\n" for p in range(14, 16) for i in range(2)))
    source = {"kind": "image", "name": "nih", "root": "nih",
              "table": {"file": "nih/Data_Entry_2017.csv", "path": "Image Index", "find": "name", "missing": "drop"},
              "entity": "Patient ID", "where": {"View Position": "PA"},
              "label": {"kind": "multilabel", "column": "Finding Labels", "map": {"No Finding": None}}}
    split = {"by": "list", "match": "name", "lists": {"train": "nih/train_val_list.txt", "test": "nih/test_list.txt"}}
    return data, {"name": "nih-partial", "sources": [source], "split": split,
                  "transform": {"image": {"size": [16, 16], "color": "gray"}}, "pack": {"format": "webdataset"},
                  "output": "out"}


def test_list_items_naming_files_left_out_on_purpose_are_said_to_and_never_offered_a_closest_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Items naming rows left out as ``not_downloaded`` (a partial download, ``missing: drop``)
    or by ``where:`` were called items that name no sample, "the closest existing name is
    '00000011_001.png'" (another patient's file), and a list all of whose files were not
    downloaded stopped the build: "fix the list or split.match", for a list that is right. They
    are counted, by why, as the items naming bad samples are, and the build goes on."""
    _, doc = nih_partial(tmp_path)
    result = run_build(write_job(tmp_path, doc))
    err = capsys.readouterr().err
    assert ("split.lists.train (nih/train_val_list.txt): 5 of its 28 items name files left out as filtered 1, "
            "not_downloaded 4, e.g. line 8: '00000003_001.png'; not packed, and not bad samples: excluded.jsonl "
            "lists each with why") in err, err
    assert ("split.lists.test (nih/test_list.txt): 4 of its 4 items name files left out as not_downloaded, e.g. "
            "line 1: '00000014_000.png'") in err, err
    assert "closest existing" not in err and "name no sample" not in err, err
    assert built_splits(result) == Counter({(str(p), "train"): 1 if p == 3 else 2 for p in range(12)})
    assert excluded(result) == {"00000003_001.png": "filtered", **{
        f"{p:08d}_{i:03d}.png": "not_downloaded" for p in range(12, 16) for i in range(2)}}
    assert result.issues == ()


# ---------------------------------------------------------------------------------------------
# PadChest: a Labels column of Python list text


def test_a_multilabel_cell_written_as_a_list_literal_holds_the_lists_names_whatever_the_separator(
        tmp_path: Path) -> None:
    """PadChest's ``Labels`` column is Python list text, ``['pneumonia', 'nodule']``; read with
    ``separator: ","`` it made the classes ``['pneumonia'`` and ``'nodule']`` (and ``['normal']``,
    which ``map: {normal: null}`` never dropped), silently. A cell written as a list, in Python's
    quotes or JSON's, holds its items' names; one that looks like a list but is none is a
    ``bad_target`` naming its row."""
    images = tmp_path / "padchest" / "images"
    images.mkdir(parents=True)
    cells = ["['pneumonia', 'nodule']", "['normal']", "[' nodule']", '["pneumonia"]', "['cardiomegaly', 'pneumonia']",
             "[]"]
    rows = []
    for i in range(13):
        assert cv2.imwrite(str(images / f"{i:04d}.png"), photo(i))
        cell = "['pneumonia', nodule]" if i == 12 else cells[i % len(cells)]  # an unquoted name: no list of names
        rows.append(f'{i:04d}.png,P{i:03d},"{cell.replace(chr(34), chr(34) * 2)}"')  # a CSV cell: "" for "
    (tmp_path / "labels.csv").write_text("ImageID,PatientID,Labels\n" + "\n".join(rows) + "\n")
    doc = {"name": "padchest", "sources": [{
        "kind": "image", "name": "padchest", "root": "padchest/images",
        "table": {"file": "labels.csv", "path": "ImageID"}, "entity": "PatientID",
        "label": {"kind": "multilabel", "column": "Labels", "separator": ",", "map": {"normal": None}}}],
        "split": {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 1},
        "transform": {"image": {"size": [16, 16], "color": "gray"}}, "pack": {"format": "webdataset"},
        "validate": {"max_bad_fraction": 0.2}, "output": "out"}
    result = run_build(write_job(tmp_path, doc))
    assert result.manifest["target"]["names"] == ["cardiomegaly", "nodule", "pneumonia"]
    held = {row["entity_id"]: tuple(row["target"]) for row in
            pq.read_table(result.version_dir / "_index.parquet", columns=["entity_id", "target"]).to_pylist()}
    want = [(0, 1, 1), (0, 0, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (0, 0, 0)]
    assert held == {f"P{i:03d}": want[i % len(cells)] for i in range(12)}
    (issue,) = result.issues
    assert issue.reason == "bad_target" and issue.path.endswith("0012.png")
    assert "labels.csv row 14, column 'Labels': \"['pneumonia', nodule]\" looks like a list" in issue.message, \
        issue.message



@pytest.mark.parametrize(("cell", "value_map", "want"), [
    ("[none]", {"[none]": None}, ""), ("[no finding]", {"[no finding]": "normal"}, "normal"),
    ("[unsure]", {}, "[unsure]"), ("pneumonia|[REDACTED]", {"[REDACTED]": None}, "pneumonia"),
])
def test_a_bracketed_word_is_a_token_that_map_names_not_a_list(cell: str, value_map: dict[str, str | None],
                                                               want: str) -> None:
    """Only a list of quoted names (or ``[]``) is read as a list: a cell ``[none]`` or
    ``[REDACTED]`` is a token as before, which ``map:`` may name whole or inside a joined cell
    (such cells became bad_target when every bracketed cell was taken for a list)."""
    assert _names_of_column(cell, "row 2", "|", value_map, ()) == want

# ---------------------------------------------------------------------------------------------
# A DICOM export named by SOP Instance UID, without an extension


def test_a_stem_is_the_name_without_its_extension_and_a_suffix_of_digits_is_none() -> None:
    """A UID's last component, or a file's number, is no extension: ``match: stem`` took
    ``1.2.826.0.1.3680043.8.498.101``'s stem for ``1.2.826.0.1.3680043.8.498``."""
    assert [stem_of(name) for name in ("1.2.826.0.1.3680043.8.498.101", "1.2.826.0.1.3680043.8.498.101.dcm",
                                       "1.2.826.0.1.3680043.8.498.101.dcm.gz", "scan.001", "a.png", "la_003.nii.gz",
                                       "case.v2", "README", ".hidden")] \
        == ["1.2.826.0.1.3680043.8.498.101", "1.2.826.0.1.3680043.8.498.101", "1.2.826.0.1.3680043.8.498.101",
            "scan.001", "a", "la_003", "case", "README", ".hidden"]


def test_files_named_by_their_sop_instance_uid_alone_go_where_a_list_of_full_uids_puts_them(tmp_path: Path) -> None:
    """A list of SOP Instance UIDs (a split CSV of ids) named nothing under ``match: stem``
    (exit 2), and files whose UIDs differ in the last component only shared a stem."""
    root = tmp_path / "export"
    where = {}
    for i in range(12):
        uid = f"1.2.826.0.1.3680043.8.498.{100 + i}"
        ds = ct_dataset(ct_pixels(seed=i), PatientID=f"P{i:03d}", SOPInstanceUID=uid)
        ds.file_meta.MediaStorageSOPInstanceUID = uid
        save(ds, root / uid)  # no extension
        where[uid] = "test" if i % 4 == 0 else "train"
    for split in ("train", "test"):
        (tmp_path / f"{split}.txt").write_text("".join(f"{uid}\n" for uid, s in where.items() if s == split))
    doc = {"name": "uids", "sources": [{"kind": "dicom", "name": "ct", "root": "export", "label": "none"}],
           "split": {"by": "list", "match": "stem", "lists": {"train": "train.txt", "test": "test.txt"}},
           "transform": {"dicom": {"windows": ["file"], "size": [16, 16]}}, "pack": {"format": "webdataset"},
           "phi": {"mode": "keep"}, "output": "out"}
    result = run_build(write_job(tmp_path, doc))
    index = pq.read_table(result.version_dir / "_index.parquet", columns=["entity_id", "split"]).to_pylist()
    assert {row["entity_id"]: row["split"] for row in index} == {
        f"P{i:03d}": "test" if i % 4 == 0 else "train" for i in range(12)}
    assert result.issues == ()
