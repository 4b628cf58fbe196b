"""Every kind of training target, built from real files and read back by stock readers and ShardDataset.

A source's ``label:`` says where a sample's target comes from (a table column, the ImageFolder
folder, a DICOM header attribute, nowhere) and what it is (one class, several labels, numbers).
"""

from __future__ import annotations

import json
import textwrap
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds
import yaml
from hypothesis import given
from hypothesis import strategies as st

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.demo import render_photo, write_ct_slice, write_demo_key, write_photo
from packer.errors import ConfigError
from packer.loader import ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.targets import Refused, Target, mapped_name, names_text, number_text, target_class
from packer.verify import verify_dataset
from tests.helpers import write_job


def _job(tmp: Path, sources: list[dict[str, Any]], fmt: str = "webdataset", **extra: Any) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "name": "targets",
        "sources": sources,
        "split": {"by": "entity", "ratios": {"train": 1.0}},
        # the sources' kinds only: a section for a kind no source is, is warned of
        "transform": {kind: {"size": [32, 32]} for kind in ("dicom", "image") if any(s["kind"] == kind
                                                                                   for s in sources)},
        "pack": {"format": fmt},
        "output": str(tmp / "out"),
        "phi": {"key_file": str(write_demo_key(tmp, 7))},
        **extra,
    }
    return write_job(tmp / "job", doc)


def _build(job: Path) -> BuildResult:
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))


def _ct(root: Path, name: str, patient: str, seed: int, **overrides: Any) -> None:
    rng = np.random.default_rng(seed)
    hu = rng.normal(0, 300, size=(32, 32)).astype(np.float32)
    hu[8:24, 8 + seed % 8:16 + seed % 8] = 800  # a bright block, unlike any other file's
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    write_ct_slice(root / name, patient_id=patient, study_date="20240101", pixels_hu=hu, **overrides)


def ct_beside_float16_mr(tmp_path: Path) -> Path:
    """A job of two sources whose samples have different dtypes: two CT slices windowed to uint8
    beside an MR NIfTI case z-scored to float16 (8×8 each)."""
    import nibabel as nib

    ct, mr = tmp_path / "ct", tmp_path / "mr"
    for i in range(2):
        _ct(ct, f"P{i}/s0.dcm", f"P{i}", seed=i)
    mr.mkdir()
    volume = np.random.default_rng(0).uniform(100, 900, size=(8, 8, 3)).astype(np.float32)
    nib.save(nib.Nifti1Image(volume, np.diag([1.0, 1.0, 2.0, 1.0])), mr / "case1.nii.gz")
    return _job(tmp_path, [{"kind": "dicom", "name": "ct", "root": str(ct), "label": "none"},
                           {"kind": "nifti", "name": "mr", "root": str(mr), "label": "none"}],
                transform={"dicom": {"size": [8, 8], "windows": ["lung"]},
                           "nifti": {"size": [8, 8], "windows": ["zscore"], "output": "float16"}})


def _photo(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_photo(path, render_photo(np.random.default_rng(seed), ("circle", "square")[seed % 2], height=48, width=64))


def _samples(result: BuildResult, split: str = "train") -> list[dict[str, Any]]:
    ds = ShardDataset(result.manifest_path, split, shuffle=False)
    return sorted(iter(ds), key=lambda item: item["key"])


def _wds(result: BuildResult) -> list[dict[str, Any]]:
    urls = sorted(str(p) for p in result.version_dir.glob("train-*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode())


def _parquet(result: BuildResult) -> pads.Dataset:
    return pads.dataset(sorted(str(p) for p in result.version_dir.glob("train-*.parquet")), format="parquet")


def _manifest(result: BuildResult) -> dict[str, Any]:
    return json.loads(result.manifest_path.read_text())


def _deep_ok(result: BuildResult) -> None:
    outcome = verify_dataset(result.manifest_path, deep=True)
    assert outcome.ok, [p.message for p in outcome.problems]


# -- none: unlabeled ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_an_unlabeled_dicom_folder_packs_every_file_without_a_label(tmp_path: Path, fmt: str) -> None:
    raw = tmp_path / "raw"
    for i in range(6):
        _ct(raw, f"p{i}/slice.dcm", f"P{i}", i)
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}], fmt))
    manifest = _manifest(result)
    assert manifest["target"] == {"kind": "none", "names": []} and manifest["label_map"] == {}
    assert manifest["splits"]["train"]["samples"] == 6 and manifest["bad_samples"]["total"] == 0
    items = _samples(result)
    assert len(items) == 6 and all("label" not in item and "target" not in item for item in items)
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=4)))
    assert set(batch) == {"image", "key"} and batch["image"].shape[0] == 4
    if fmt == "webdataset":
        assert all("cls" not in s and "npy" in s for s in _wds(result))
    else:
        table = _parquet(result).to_table(columns=["label", "label_name"])
        assert table.num_rows == 6 and table["label"].null_count == 6
    _deep_ok(result)


def test_a_dicom_file_without_a_label_says_how_to_pack_unlabeled_data(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _ct(raw, "a.dcm", "P0", 0)
    _ct(raw, "b.dcm", "P1", 1)
    (tmp_path / "labels.csv").write_text("path,label\na.dcm,x\n")
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "labels": str(tmp_path / "labels.csv")}],
                         validate={"max_bad_fraction": 0.5}))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "missing_label" and "label: none" in record["message"]


def test_stratifying_an_unlabeled_source_is_a_config_error_naming_it(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _ct(raw, "a.dcm", "P0", 0)
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "name": "export", "label": "none"}],
               split={"by": "entity", "ratios": {"train": 1.0}, "stratify": "label"})
    with pytest.raises(ConfigError, match="stratify.*'export' has no labels"):
        load_job(job)


# -- folder: the ImageFolder layout ---------------------------------------------------------
@pytest.mark.parametrize("kind", ["image", "dicom"])
def test_an_imagefolder_tree_takes_each_class_from_its_folder(tmp_path: Path, kind: str) -> None:
    raw = tmp_path / "raw"
    for i in range(6):
        cls = ("cat", "dog", "eel")[i % 3]
        if kind == "image":
            _photo(raw / cls / f"{i}.png", i)
        else:
            _ct(raw, f"{cls}/{i}.dcm", f"P{i}", i)
    if kind == "image":
        _photo(raw / "loose.png", 99)  # directly under the root: no class folder
    else:
        _ct(raw, "loose.dcm", "P99", 99)
    result = _build(_job(tmp_path, [{"kind": kind, "root": str(raw), "label": "folder"}],
                         validate={"max_bad_fraction": 0.5}))
    manifest = _manifest(result)
    assert manifest["label_map"] == {"cat": 0, "dog": 1, "eel": 2} and "target" not in manifest
    assert manifest["splits"]["train"]["class_counts"] == {"cat": 2, "dog": 2, "eel": 2}
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "missing_label" and record["path"].endswith("loose." + ("png" if kind == "image" else
                                                                                       "dcm"))
    assert "class folder" in record["message"]
    names = {v: k for k, v in manifest["label_map"].items()}
    records = {s["__key__"]: s for s in _wds(result)}
    for item in _samples(result):
        assert names[int(item["label"])] == records[item["key"]]["json"]["label"]
    _deep_ok(result)


def _readme_split_folders_recipe() -> dict[str, Any]:
    """The README's job for an image tree shipped as split folders of class folders, as printed."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("its class from the second", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    doc: dict[str, Any] = yaml.safe_load(textwrap.dedent(block))
    return doc


def test_the_readme_split_folders_recipe_packs_each_file_under_its_class_folder(tmp_path: Path) -> None:
    """README, by: column: a dataset shipped as train/, val/, test/ folders, each of class
    folders. Pasted as printed, every sample's class is its class folder, not its split's."""
    recipe = _readme_split_folders_recipe()
    data = tmp_path / recipe["sources"][0]["root"]
    seed = 0
    for split, count in (("train", 4), ("val", 2), ("test", 2)):
        for cls in ("cat", "dog"):
            for i in range(count):
                seed += 1
                _photo(data / split / cls / f"{cls}{i}_{split}.png", seed)
    job = write_job(tmp_path, {"name": "folders", **recipe, "transform": {"image": {"size": [32, 32]}},
                               "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")})
    result = _build(job)
    manifest = _manifest(result)
    assert manifest["label_map"] == {"cat": 0, "dog": 1}
    assert {name: manifest["splits"][name]["samples"] for name in ("train", "valid", "test")} == {
        "train": 8, "valid": 4, "test": 4}
    names = {v: k for k, v in manifest["label_map"].items()}
    seen = 0
    for split in ("train", "valid", "test"):
        urls = sorted(str(p) for p in result.version_dir.glob(f"{split}-*.tar"))
        for record in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode():
            folder, cls, _ = record["json"]["path"].split("/")
            assert names[int(record["cls"])] == cls and {"val": "valid"}.get(folder, folder) == split, record["json"]
            seen += 1
    assert seen == 16


def test_a_class_folder_that_is_the_split_folder_is_a_config_error(tmp_path: Path) -> None:
    """label: folder reads the first folder; with the split read from that folder too, every
    class would be its split's name: refused, naming both keys and the class folder to read."""
    (tmp_path / "data").mkdir()
    source = {"kind": "image", "root": str(tmp_path / "data"), "label": "folder",
              "fields": {"split": {"component": 0}}}
    job = _job(tmp_path, [source], split={"by": "column", "column": "split"})
    with pytest.raises(ConfigError, match=r"label: folder.*fields\.split: \{component: 0\}.*same folder.*"
                                          r"label: \{folder: true, component: 1\}"):
        load_job(job)


def test_a_class_folder_component_may_not_be_the_file_name(tmp_path: Path) -> None:
    job = _job(tmp_path, [{"kind": "image", "root": str(tmp_path), "label": {"folder": True, "component": -1}}])
    with pytest.raises(ConfigError, match=r"label\.component: -1 is the file name"):
        load_job(job)


def test_a_file_above_the_class_folder_depth_is_missing_label(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for i in range(4):
        _photo(raw / "train" / ("cat", "dog")[i % 2] / f"{i}.png", i)
    _photo(raw / "train" / "loose.png", 9)  # in the split folder, no class folder below it
    result = _build(_job(tmp_path, [{"kind": "image", "root": str(raw), "label": {"folder": True, "component": 1}}],
                         validate={"max_bad_fraction": 0.5}))
    assert _manifest(result)["label_map"] == {"cat": 0, "dog": 1}
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "missing_label" and "label.component 1" in record["message"]


def test_a_class_folder_in_another_unicode_form_is_the_listed_label(tmp_path: Path) -> None:
    """macOS names a folder café as e and a combining accent (NFD); the job's labels: typed it
    as one code point (NFC). The two print alike: every file was unknown_label saying "'café'
    is not in the job's labels (café, dog)". The folder is the listed class, in its spelling."""
    nfd, nfc = unicodedata.normalize("NFD", "café"), unicodedata.normalize("NFC", "café")
    raw = tmp_path / "raw"
    for i in range(6):
        _photo(raw / (nfd, "dog")[i % 2] / f"{i}.png", i)
    result = _build(_job(tmp_path, [{"kind": "image", "root": str(raw), "label": "folder"}], labels=[nfc, "dog"]))
    manifest = _manifest(result)
    assert manifest["label_map"] == {nfc: 0, "dog": 1} and manifest["bad_samples"]["total"] == 0
    assert manifest["splits"]["train"]["class_counts"] == {nfc: 3, "dog": 3}


def test_a_name_the_labels_list_in_two_unicode_forms_is_unknown_naming_both() -> None:
    """A labels: list holding café in both forms: a third spelling matching both is no class (a
    guess would merge two listed classes); the message shows their code points."""
    nfd, nfc = unicodedata.normalize("NFD", "café"), unicodedata.normalize("NFC", "café")
    assert mapped_name(nfd, {}, (nfc, "dog"), "x.png") == nfc
    assert mapped_name(nfd, {}, (nfd, nfc), "x.png") == nfd  # a listed spelling is itself
    a_ring = ("\u00c5", "A\u030a", "\u212b")  # Å: one code point, A and a combining ring, the angstrom sign
    refused = mapped_name(a_ring[0], {}, a_ring[1:], "x.png")
    assert isinstance(refused, Refused) and refused.reason == "unknown_label"
    assert "'A\\u030a' and '\\u212b' in all but Unicode form" in refused.message and "keep one" in refused.message


def test_a_multilabel_name_in_another_unicode_form_is_the_listed_label() -> None:
    nfd, nfc = unicodedata.normalize("NFD", "café"), unicodedata.normalize("NFC", "café")
    text = target_class("multilabel").text_of_cells({"findings": f"{nfd}|dog"}, where="t.csv row 2", separator="|",
                                                    value_map={}, known=(nfc, "dog"))
    assert text == names_text([nfc, "dog"])


# -- a DICOM attribute ----------------------------------------------------------------------
def test_a_header_attribute_with_a_value_map_labels_each_file(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    parts = {"a": "CHEST", "b": "THORAX", "c": "ABDOMEN", "d": "HEAD", "e": None}
    for i, (name, part) in enumerate(parts.items()):
        _ct(raw, f"{name}.dcm", f"P{i}", i, BodyPartExamined=part)
    source = {"kind": "dicom", "root": str(raw),
              "label": {"attribute": "BodyPartExamined", "map": {"CHEST": "chest", "THORAX": "chest",
                                                                  "ABDOMEN": "abdomen"}}}
    result = _build(_job(tmp_path, [source], validate={"max_bad_fraction": 0.5}))
    manifest = _manifest(result)
    assert manifest["label_map"] == {"abdomen": 0, "chest": 1}
    assert manifest["splits"]["train"]["class_counts"] == {"abdomen": 1, "chest": 2}
    bad = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert bad["d.dcm"]["reason"] == "unknown_label" and "'HEAD'" in bad["d.dcm"]["message"]
    assert bad["e.dcm"]["reason"] == "missing_label" and "BodyPartExamined" in bad["e.dcm"]["message"]
    _deep_ok(result)


@pytest.mark.parametrize("attribute", ["PatientName", "PatientID", "AccessionNumber", "StudyDate"])
def test_an_identifying_attribute_may_not_be_a_label(tmp_path: Path, attribute: str) -> None:
    job = _job(tmp_path, [{"kind": "dicom", "root": str(tmp_path), "label": {"attribute": attribute}}])
    with pytest.raises(ConfigError, match=f"{attribute}.*may not be a label.*BodyPartExamined"):
        load_job(job)


@pytest.mark.parametrize("attribute", ["StudyDescription", "SeriesDescription", "ProtocolName"])
def test_a_free_text_attribute_is_a_label_only_through_names_the_job_gives(tmp_path: Path, attribute: str) -> None:
    # "CT chest for <patient name> follow-up": its raw value would be a class name in every shard
    source: dict[str, Any] = {"kind": "dicom", "root": str(tmp_path), "label": {"attribute": attribute}}
    with pytest.raises(ConfigError, match=f"{attribute} is free text that may name the patient.*map:"):
        load_job(_job(tmp_path / "a", [source]))
    load_job(_job(tmp_path / "b", [{**source, "label": {"attribute": attribute, "map": {"CT CHEST": "chest"}}}]))
    load_job(_job(tmp_path / "c", [source], labels=["CT CHEST"]))
    load_job(_job(tmp_path / "d", [source], phi={"mode": "keep"}))


# -- class ids as names ---------------------------------------------------------------------
def test_class_ids_written_as_numbers_keep_their_numeric_order(tmp_path: Path) -> None:
    """A Kaggle table's integer class column (0..11): without ``labels:``, "10" must not sort
    between "1" and "2", or every label index from 2 on would differ from the table's id."""
    rows = [{"path": f"{i}.png", "label": str(i % 12), "entity": f"E{i}", "timestamp": "2024-01-01"}
            for i in range(12)]
    raw = _photo_table(tmp_path, rows)
    result = _build(_job(tmp_path, [{"kind": "image", "root": str(raw), "table": str(raw / "table.csv")}]))
    assert _manifest(result)["label_map"] == {str(i): i for i in range(12)}
    for item in ShardDataset(result.manifest_path, "train", shuffle=False, records=True):
        assert item["label"] == int(item["record"]["label"]) == item["record"]["label_index"]


def test_class_names_that_are_numbers_sort_by_value_and_others_as_text() -> None:
    from packer.targets.classes import ClassTarget

    assert ClassTarget.from_texts(["10", "2", "-1.0", "0.5", "1"], labels=(), columns=()).names == (
        "-1.0", "0.5", "1", "2", "10")
    assert ClassTarget.from_texts(["10", "2", "b", "a"], labels=(), columns=()).names == ("10", "2", "a", "b")
    assert ClassTarget.from_texts(["10", "2"], labels=("2", "10"), columns=()).names == ("2", "10")


def test_multi_label_class_ids_get_the_positions_of_their_numbers(tmp_path: Path) -> None:
    """Human Protein Atlas: ``Target`` cells such as "16 0" list integer class ids. Multi-hot
    position k is class id k, as a class target numbers them (never "0, 1, 10, 11, 2, ...")."""
    tags = ["16 0", "7 1 2 0", "5", "1", "18", "2 10", "11 3", "4 9", "6 8", "12 13", "14 15", "17"]
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "Target": t, "entity": f"E{i}", "timestamp": "2024-01-01"}
                                  for i, t in enumerate(tags)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "multilabel", "column": "Target", "separator": " "}}
    result = _build(_job(tmp_path, [source]))
    assert _manifest(result)["label_map"] == {str(i): i for i in range(19)}
    for item in ShardDataset(result.manifest_path, "train", shuffle=False, records=True):
        ids = sorted(int(n) for n in item["record"]["labels"])
        assert np.flatnonzero(item["target"].numpy()).tolist() == ids
    from packer.targets.multilabel import MultiLabelTarget

    assert MultiLabelTarget.from_texts(["10|2", "b|a"], labels=(), columns=()).names == ("10", "2", "a", "b")
    assert MultiLabelTarget.from_texts(["10|2", "-1"], labels=(), columns=("x",)).names == ("x", "-1", "2", "10")


def test_one_hot_columns_give_one_class_in_the_columns_order(tmp_path: Path) -> None:
    """ISIC 2019's ground truth: one 0/1 column per diagnosis (written 1.0 / 0.0), exactly one 1
    per image. A single-label task: one class each, indexed in the table's column order."""
    onehot = [("0.0", "1.0", "0.0"), ("1.0", "0.0", "0.0"), ("0.0", "0.0", "1"), ("0.0", "1.0", "0.0"),
              ("0.0", "0.0", "0.0"), ("1.0", "1.0", "0.0"), ("0.0", "", "1.0"), ("0.0", "0.5", "1.0")]
    # UNK: a class no training image holds (as in ISIC 2019), still a class of the label map
    rows = [{"path": f"{i}.png", "MEL": m, "NV": n, "BCC": b, "UNK": "0.0", "entity": f"E{i}",
             "timestamp": "2024-01-01"} for i, (m, n, b) in enumerate(onehot)]
    raw = _photo_table(tmp_path, rows)
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"columns": ["MEL", "NV", "BCC", "UNK"]}}
    result = _build(_job(tmp_path, [source], validate={"max_bad_fraction": 0.6}))
    assert _manifest(result)["label_map"] == {"MEL": 0, "NV": 1, "BCC": 2, "UNK": 3}
    got = {item["record"]["path"]: item["label"]
           for item in ShardDataset(result.manifest_path, "train", shuffle=False, records=True)}
    assert got == {"0.png": 1, "1.png": 0, "2.png": 2, "3.png": 1}
    bad = {r["path"].rsplit("/", 1)[1]: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert {k: r["reason"] for k, r in bad.items()} == {"4.png": "bad_target", "5.png": "bad_target",
                                                        "6.png": "bad_target", "7.png": "bad_target"}
    assert "row 6: no column of MEL, NV, BCC, UNK holds 1; a one-hot row names exactly one class" in \
        bad["4.png"]["message"]
    assert "kind: multilabel" in bad["4.png"]["message"]
    assert "row 7: MEL and NV both hold 1" in bad["5.png"]["message"]
    assert "row 8, column 'NV': empty" in bad["6.png"]["message"]
    assert "row 9, column 'NV': '0.5' is not 0 or 1" in bad["7.png"]["message"]


def test_one_hot_columns_through_a_map_name_their_classes_in_the_columns_order() -> None:
    from packer.config import _parse_target

    target = _parse_target({"columns": ["MEL", "NV", "BCC"], "map": {"MEL": "melanoma", "NV": "nevus", "BCC": "bcc"}},
                           False, "label")
    assert target.named_columns == ("melanoma", "nevus", "bcc")
    assert _parse_target({"columns": ["MEL", "NV"], "map": {"NV": "nevus"}}, False, "label").named_columns == (
        "nevus",)  # MEL is unknown_label: no class of its own
    assert _parse_target({"column": "dx"}, False, "label").named_columns == ()


def test_a_map_key_true_or_false_matches_the_cell_in_any_of_yamls_spellings(tmp_path: Path) -> None:
    """YAML reads an unquoted ``true:`` key as a boolean, whose Python text ``True`` matched no
    table cell ``true``: every sample was unknown_label. A true/false key is a cell text like an
    int key (``0:`` matches ``0``), and matches true, True and TRUE (pandas writes True)."""
    cells = ["true", "false", "True", "FALSE", "TRUE", "False"]
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "finding": c, "entity": f"E{i}", "timestamp": "2024-01-01"}
                                  for i, c in enumerate(cells)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"column": "finding", "map": {True: "positive", False: "negative"}}}
    job = _job(tmp_path, [source])
    assert "true: positive" in job.read_text()  # an unquoted key: YAML reads it as a boolean
    result = _build(job)
    assert not read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert _manifest(result)["label_map"] == {"negative": 0, "positive": 1}
    got = {item["record"]["path"]: item["label"]
           for item in ShardDataset(result.manifest_path, "train", shuffle=False, records=True)}
    assert got == {f"{i}.png": int(c.lower() == "true") for i, c in enumerate(cells)}
    clash = {**source, "label": {"column": "finding", "map": {True: "positive", "TRUE": "negative"}}}
    with pytest.raises(ConfigError, match=r"label.map.TRUE: the keys 'true' and 'TRUE' both stand for the cell"):
        load_job(_job(tmp_path / "clash", [clash]))


def test_one_hot_needs_two_columns(tmp_path: Path) -> None:
    source = {"kind": "image", "root": str(tmp_path), "table": str(tmp_path / "t.csv"), "label": {"columns": ["MEL"]}}
    with pytest.raises(ConfigError, match=r"label.columns: a class from one column is 'column: MEL'"):
        load_job(_job(tmp_path, [source]))


# -- several labels -------------------------------------------------------------------------
def _photo_table(tmp: Path, rows: list[dict[str, str]]) -> Path:
    raw = tmp / "raw"
    for i, row in enumerate(rows):
        _photo(raw / row["path"], i)
    columns = list(rows[0])
    lines = [",".join(columns)] + [",".join(row[c] for c in columns) for row in rows]
    (raw / "table.csv").write_text("\n".join(lines) + "\n")
    return raw


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_column_of_names_becomes_a_multi_hot_vector(tmp_path: Path, fmt: str) -> None:
    findings = ["effusion|nodule", "", "nodule", "effusion", "mass|nodule|effusion", "bad|name"]
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "findings": f, "entity": f"E{i}", "timestamp": "2024-01-01"}
                                  for i, f in enumerate(findings)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "multilabel", "column": "findings"}}
    result = _build(_job(tmp_path, [source], fmt, labels=["effusion", "mass", "nodule"],
                         validate={"max_bad_fraction": 0.5}))
    manifest = _manifest(result)
    assert manifest["target"] == {"kind": "multilabel", "names": ["effusion", "mass", "nodule"]}
    assert manifest["splits"]["train"]["class_counts"] == {"effusion": 3, "mass": 1, "nodule": 3}
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "unknown_label" and "'bad'" in record["message"]
    expected = [[1, 0, 1], [0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 1, 1]]
    by_key = {}
    for item in _samples(result):
        assert item["target"].dtype == torch.float32 and "label" not in item
        by_key[item["key"]] = item["target"].tolist()
    assert sorted(by_key.values()) == sorted(expected)
    if fmt == "webdataset":
        for sample in _wds(result):
            vector = sample["target.npy"]
            assert vector.dtype == np.uint8 and vector.tolist() == by_key[sample["__key__"]]
            names = manifest["target"]["names"]
            assert sample["json"]["labels"] == [n for n, v in zip(names, vector, strict=True) if v]
    else:
        table = _parquet(result).to_table(columns=["key", "target"])
        assert dict(zip(table["key"].to_pylist(), table["target"].to_pylist(), strict=True)) == by_key
    index = pq.read_table(result.version_dir / "_index.parquet")
    assert index["label"].null_count == index.num_rows and index["target"].to_pylist() == [
        by_key[k] for k in index["key"].to_pylist()]
    # a view: the samples with any of these labels, read from the index without decoding the rest
    view = ShardDataset(result.manifest_path, "train", labels=["mass", "effusion"], shuffle=False)
    assert sorted(v for v in (item["target"].tolist() for item in view)) == [[1, 0, 0], [1, 0, 1], [1, 1, 1]]
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=5)))
    assert batch["target"].shape == (5, 3) and batch["target"].dtype == torch.float32 and "label" not in batch
    _deep_ok(result)


def test_zero_one_columns_become_a_multi_hot_vector_in_the_columns_order(tmp_path: Path) -> None:
    rows = [{"path": "0.png", "nodule": "1", "effusion": "0", "entity": "E0", "timestamp": "2024-01-01"},
            {"path": "1.png", "nodule": "0", "effusion": "1", "entity": "E1", "timestamp": "2024-01-01"},
            {"path": "2.png", "nodule": "1", "effusion": "1", "entity": "E2", "timestamp": "2024-01-01"},
            {"path": "3.png", "nodule": "yes?", "effusion": "1", "entity": "E3", "timestamp": "2024-01-01"}]
    raw = _photo_table(tmp_path, rows)
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "multilabel", "columns": ["nodule", "effusion"]}}
    result = _build(_job(tmp_path, [source], validate={"max_bad_fraction": 0.5}))
    manifest = _manifest(result)
    assert manifest["target"]["names"] == ["nodule", "effusion"]
    assert manifest["label_map"] == {"nodule": 0, "effusion": 1}
    assert sorted(item["target"].tolist() for item in _samples(result)) == [[0, 1], [1, 0], [1, 1]]
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "bad_target" and "'yes?' is not 0 or 1" in record["message"]


# -- numbers --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_numeric_columns_become_a_float32_target_vector(tmp_path: Path, fmt: str) -> None:
    values = [("63", "1.5"), ("41.25", "0.125"), ("70", "2"), ("abc", "1"), ("", "3"), ("55", "inf")]
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "age": a, "dose": d, "entity": f"E{i}",
                                   "timestamp": "2024-01-01"} for i, (a, d) in enumerate(values)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "numeric", "columns": ["age", "dose"]}}
    result = _build(_job(tmp_path, [source], fmt, validate={"max_bad_fraction": 0.6}))
    manifest = _manifest(result)
    assert manifest["target"] == {"kind": "numeric", "names": ["age", "dose"]} and manifest["label_map"] == {}
    stats = manifest["splits"]["train"]["target_stats"]
    assert stats["age"]["min"] == 41.25 and stats["age"]["max"] == 70 and stats["dose"]["max"] == 2
    bad = sorted(r["reason"] for r in read_bad_samples(result.version_dir / "bad_samples.jsonl"))
    assert bad == ["bad_target"] * 3
    got = sorted(item["target"].tolist() for item in _samples(result))
    assert got == [[41.25, 0.125], [63.0, 1.5], [70.0, 2.0]]
    if fmt == "webdataset":
        assert sorted(s["target.npy"].tolist() for s in _wds(result)) == got
        assert all(s["target.npy"].dtype == np.float32 for s in _wds(result))
    _deep_ok(result)


@pytest.mark.parametrize(("cell", "value"), [
    ("40", 40.0), ("-1.5", -1.5), (".5", 0.5), ("+2.", 2.0), ("1e-3", 0.001), ("2E2", 200.0),
    ("1_5", None), ("\uff11\uff12", None), ("\u0664\u0660", None), ("1,5", None), ("inf", None), ("nan", None),
])
def test_a_numeric_cell_is_a_number_only_in_plain_decimal_notation(cell: str, value: float | None) -> None:
    """float() reads '1_5' as 15 (digit grouping in Python source) and full-width or Arabic-Indic
    digits as ASCII ones: such cells packed as numbers nobody wrote. The README's bad_target: a
    numeric target that is not a finite number, written as a table writes one."""
    from packer.targets.base import Refused
    from packer.targets.numeric import NumericTarget

    text = NumericTarget.text_of_cells({"age": cell}, where="t.csv row 2", separator=None, value_map={}, known=())
    if value is None:
        assert isinstance(text, Refused) and text.reason == "bad_target"
        assert f"t.csv row 2, column 'age': {cell!r} is not a finite number" in text.message
    else:
        assert text == number_text([value])


def test_numeric_targets_cannot_be_stratified_or_given_class_names(tmp_path: Path) -> None:
    source = {"kind": "image", "root": str(tmp_path), "table": "t.csv", "name": "ages",
              "label": {"kind": "numeric", "columns": ["age"]}}
    with pytest.raises(ConfigError, match="'ages' has numeric targets"):
        load_job(_job(tmp_path, [source], split={"by": "entity", "ratios": {"train": 1.0}, "stratify": "label"}))
    with pytest.raises(ConfigError, match="labels: a numeric target has no class names"):
        load_job(_job(tmp_path, [source], labels=["a"]))


def test_sources_of_one_dataset_share_one_target_kind(tmp_path: Path) -> None:
    sources = [{"kind": "dicom", "root": str(tmp_path), "name": "ct", "label": "none"},
               {"kind": "image", "root": str(tmp_path), "name": "photos", "label": "folder"}]
    with pytest.raises(ConfigError, match="'photos' gives class targets, source 'ct' gives none"):
        load_job(_job(tmp_path, sources))


def test_a_multilabel_build_is_byte_reproducible(tmp_path: Path) -> None:
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "findings": ("a|b", "b", "")[i % 3], "entity": f"E{i}",
                                   "timestamp": "2024-01-01"} for i in range(6)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "multilabel", "column": "findings"}}
    first = _build(_job(tmp_path / "one", [source], "parquet"))
    second = _build(_job(tmp_path / "two", [source], "parquet"))
    assert _manifest(first)["dataset_hash"] == _manifest(second)["dataset_hash"]


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=4))
def test_a_numeric_targets_text_is_the_shortest_that_reads_back_as_its_float32s(values: list[float]) -> None:
    """The _splits.parquet label of a numeric sample: 0.2054, not 0.2054000049829483."""
    text = number_text(values)
    assert [np.float32(float(part)) for part in text.split("|")] == [np.float32(v) for v in values]
    digits = [part.lstrip("-").split("e")[0].replace(".", "").strip("0") for part in text.split("|")]
    assert all(len(d) <= 9 for d in digits)  # a float32 needs at most 9 significant digits, never float64's 17
    _, vector = Target("numeric", tuple(f"t{i}" for i in range(len(values)))).encode(text)
    assert vector is not None and vector.tolist() == [float(np.float32(v)) for v in values]
