"""Under ``phi: pseudonymize`` the messages about a job's given split name no patient.

A split list kept in a folder named after a patient (``Doe^John_19600101/train.txt``) is recorded
in the manifest as ``<id>/train.txt``; its warnings and errors (stderr, ``warnings.jsonl``, the
report, ``packer validate --json`` and the ``--junit`` file CI publishes) name it the same way.
A ``split: {by: column}`` naming a column of patient names hides its values as ``where:`` and
join-key messages do, with the count and the fix still said. A source named after its root
folder is refused where the folder holds a calendar date, however the date is spelled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job, redacted_path
from packer.errors import ConfigError
from tests.helpers import write_job

KEY = "5f" * 32
PATIENT = "Doe^John_19600101"


def write_photos(folder: Path, count: int, *, columns: dict[str, list[str]] | None = None) -> Path:
    """``count`` PNGs ``raw/p<i>/im.png`` (entity P<i>) and a table path,label,entity (plus
    ``columns``: name → one cell per file); returns the raw root."""
    raw = folder / "raw"
    extra = sorted(columns or {})
    lines = [",".join(["path", "label", "entity", *extra])]
    for i in range(count):
        rel = f"p{i}/im.png"
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
        assert cv2.imwrite(str(raw / rel), cv2.resize(pixels, (48, 36), interpolation=cv2.INTER_CUBIC))
        lines.append(",".join([rel, "ab"[i % 2], f"P{i}", *((columns or {})[c][i] for c in extra)]))
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    return raw


def photo_job(folder: Path, split: dict[str, Any], mode: str = "pseudonymize") -> Path:
    (folder / "phi.key").write_text(KEY + "\n")
    doc = {"name": "official", "sources": [{"name": "photos", "kind": "image", "root": "raw",
                                            "table": "raw/labels.csv"}],
           "split": split, "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": "out", "validate": {"max_bad_fraction": 0.5}, "phi": {"mode": mode, "key_file": "phi.key"}}
    return write_job(folder, doc)


def run(folder: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args, "--scheduler", "sync", "-q"],
                                env={"PACKER_WORK_DIR": str(folder / "work")})
    return result.exit_code, result.output


# ---------------------------------------------------------------------------------------------
# split lists in a folder named after a patient


def lists_in_patient_folder(folder: Path) -> Path:
    """Eight photos, one truncated (a bad sample), train and test lists under ``Doe^John_19600101/``,
    the train list naming a file that is not there; returns the job."""
    raw = write_photos(folder, 8)
    broken = raw / "p1/im.png"
    broken.write_bytes(broken.read_bytes()[:60])
    lists = folder / PATIENT
    lists.mkdir()
    (lists / "train.txt").write_text("".join(f"p{i}/im.png\n" for i in range(6)) + "p99/im.png\n")
    (lists / "test.txt").write_text("p6/im.png\np7/im.png\n")
    return photo_job(folder, {"by": "list", "accept_leaks": True,
                              "lists": {"train": f"{PATIENT}/train.txt", "test": f"{PATIENT}/test.txt"}})


def test_a_split_lists_path_is_shown_as_the_manifest_records_it_in_every_warning(tmp_path: Path) -> None:
    """The manifest recorded the list as `<id>/train.txt`, while its warnings (an item naming no
    sample, an item naming a bad sample) quoted the folder as written: on stderr (CI logs), in
    warnings.jsonl, report.html, validate --json and the JUnit file CI publishes."""
    job = lists_in_patient_folder(tmp_path)
    code, output = run(tmp_path, "build", str(job))
    assert code == 0, output
    assert "split.lists.train (<id>/train.txt): 1 of its 7 items name no sample (by path), e.g. line 7 " in output
    assert "split.lists.train (<id>/train.txt): 1 of its 7 items name a file refused as a bad sample" in output
    (version,) = (tmp_path / "out" / "official").iterdir()
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["config"]["split"]["lists"]["train"]["file"] == "<id>/train.txt"
    for name in ("warnings.jsonl", "report.html", "manifest.json"):
        text = (version / name).read_text()
        assert "Doe" not in text and "19600101" not in text, name
    assert "<id>/train.txt" in (version / "warnings.jsonl").read_text()
    assert "Doe" not in output
    code, output = run(tmp_path, "validate", str(job), "--json", str(tmp_path / "v.json"),
                       "--junit", str(tmp_path / "j.xml"))
    assert code == 0, output
    warnings = json.loads((tmp_path / "v.json").read_text())["warnings"]
    assert sum("split.lists.train (<id>/train.txt)" in w["message"] for w in warnings) == 2, warnings
    for text in (output, json.dumps(warnings), (tmp_path / "j.xml").read_text()):
        assert "Doe" not in text and "19600101" not in text


def test_a_split_lists_errors_show_its_path_as_the_manifest_records_it(tmp_path: Path) -> None:
    """The errors a list stops the job with (an item in two lists, a list naming nothing, a list
    that is no UTF-8 text) go to CI logs too."""
    job = lists_in_patient_folder(tmp_path)
    lists = tmp_path / PATIENT
    (lists / "test.txt").write_text("p6/im.png\np0/im.png\n")
    code, output = run(tmp_path, "validate", str(job))
    assert code == ConfigError.exit_code, output
    assert ("a path is listed in two splits: split.lists.train (<id>/train.txt) line 1 and split.lists.test "
            "(<id>/test.txt) line 2") in output, output
    for text, said in (("# nothing\n", "split.lists.test (<id>/test.txt): the list names no sample"),
                       (b"p6/im.png\n\xff\n", "split.lists.test (<id>/test.txt): not UTF-8 text"),
                       ("p98/im.png\n", "split.lists.test (<id>/test.txt): 1 of its 1 items name no sample")):
        (lists / "test.txt").write_bytes(text.encode() if isinstance(text, str) else text)
        code, output = run(tmp_path, "validate", str(job))
        assert code == ConfigError.exit_code, output
        assert said in output and "Doe" not in output, output
    doc = yaml.safe_load(job.read_text())
    doc["phi"]["mode"] = "keep"  # kept in clear on purpose: the job's word
    write_job(tmp_path, doc)
    code, output = run(tmp_path, "validate", str(job))
    assert code == ConfigError.exit_code and f"split.lists.test ({PATIENT}/test.txt): 1 of its 1" in output, output


# ---------------------------------------------------------------------------------------------
# split: {by: column} naming a column of patient names


NAMES = ["DOE^JOHN", "ROE^JANE", "SMITH^ALICE", "JONES^BOB"]


def test_a_split_column_of_names_is_refused_without_quoting_its_cells_under_pseudonymize(tmp_path: Path) -> None:
    """`split: {by: column, column: patient_name}` (the wrong column) listed every distinct cell,
    and a map: spelling them out, in a config error printed to CI logs; under pseudonymize the
    values are counted, not quoted (as a where: filter's or a join key's), and the fix still said."""
    write_photos(tmp_path, 8, columns={"patient_name": [NAMES[i // 2] for i in range(8)]})
    job = photo_job(tmp_path, {"by": "column", "column": "patient_name"})
    code, output = run(tmp_path, "validate", str(job), "--quick")
    assert code == ConfigError.exit_code, output
    assert ("split.column 'patient_name': values that are no split (train, valid, test): 4 distinct values "
            "(8 file(s), e.g. sample photos-") in output, output
    assert "not shown under phi: pseudonymize: a table cell may hold a name" in output
    assert ("rename them with split.map, e.g. map: {<value>: <split>}, or name the column that holds each file's "
            "split (train, valid, test) in split.column") in output
    assert not [name for name in NAMES if name in output or name.split("^")[0] in output], output
    # kept in clear on purpose (phi: keep): each value, its files and a map naming it, as before
    job = photo_job(tmp_path, {"by": "column", "column": "patient_name"}, mode="keep")
    code, output = run(tmp_path, "validate", str(job), "--quick")
    assert code == ConfigError.exit_code, output
    assert "'DOE^JOHN' (2 file(s), e.g. " in output and "map: {DOE^JOHN: <split>, JONES^BOB: <split>" in output


def test_a_split_columns_split_words_are_still_quoted_beside_hidden_values_under_pseudonymize(tmp_path: Path) -> None:
    """A value that is a word datasets spell a split with (MIMIC-CXR's `validate`, `VAL`) names
    nobody: it is quoted with its closest split; a name beside it is counted only."""
    cells = ["train", "validate", "validate", "VAL", "test", "DOE^JOHN", "DOE^JOHN", "ROE^JANE"]
    write_photos(tmp_path, 8, columns={"split": cells})
    code, output = run(tmp_path, "validate", str(photo_job(tmp_path, {"by": "column", "column": "split"})), "--quick")
    assert code == ConfigError.exit_code, output
    assert "'VAL' (1 file(s), e.g. sample photos-" in output and "'validate' (2 file(s), e.g. sample " in output
    assert "did you mean valid?" in output
    assert "2 other distinct values (3 file(s), e.g. sample photos-" in output, output
    assert "map: {VAL: valid, validate: valid, <value>: <split>}" in output, output
    assert "DOE" not in output and "ROE" not in output


# ---------------------------------------------------------------------------------------------
# a root folder holding a date, however it is spelled


DATED = [
    # an abbreviation's period, a comma after the day or the month, a run of separators
    "Smith Jane Dec. 31, 1960", "Smith_Jane_31_Dec._1960", "Smith_Jane_Sept._4_1960", "Smith_Jane_31_December,_1960",
    "Doe_John_31-dec.-1960", "Doe_John_Jan.5.2023", "Doe_John_jan__05__2023", "Doe John 1960, Dec. 31",
    "Doe_John_1960_Sept._4th", "Doe John Mar. 3rd, 2018", "Doe_John_4 Sept. 1960", "Doe_John_sept4_1960",
    "Doe_John_DEC_31_1960", "Doe_John_31 december 1960",
]
UNDATED = [
    # a month's letters in a word, a month and a day without a year, a month and a year
    "decoder_v2", "Dec_model", "may_2_runs", "mayo_2_2019", "octree_12", "Sept_4", "Decathlon_Mar_2018", "Mar_2018",
    "June2023", "jun_2023", "dec_2024", "may_2023_v2", "Task_1st_round",
    # a month between short numbers, as model, run and fold names are spelled: a two-digit year is no year
    "nnUNet_v2_Dec_23", "llama3_june_24", "fold_4_Dec_19", "run1_jan_22", "v1.mar.10", "may_5_10mm", "stage2_feb_28",
]


def dated_root_job(tmp_path: Path, folder: str) -> Path:
    raw = tmp_path / folder
    raw.mkdir()
    assert cv2.imwrite(str(raw / "im.png"), np.zeros((8, 8, 3), dtype=np.uint8))
    (tmp_path / "phi.key").write_text(KEY + "\n")
    return write_job(tmp_path, {"name": "dated", "sources": [{"kind": "image", "root": folder, "label": "none"}],
                                "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}},
                                "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
                                "output": "out", "phi": {"mode": "pseudonymize", "key_file": "phi.key"}})


@pytest.mark.parametrize("folder", DATED)
def test_a_root_folder_holding_a_date_spelled_with_periods_or_commas_needs_a_name(tmp_path: Path, folder: str) -> None:
    """A source without name: is named after its root folder, in clear in every sample id; the
    README promises a date with its month spelled, whole or cut short, with or without separators,
    is refused: `Dec. 31, 1960`, `31_Dec._1960`, `Sept._4_1960` and `31_December,_1960` were not
    (one separator character only: the period after `Dec` or the comma after the day broke it)."""
    job = dated_root_job(tmp_path, folder)
    with pytest.raises(ConfigError, match=r"its name defaults to its root folder's name, which may identify a "
                                          r"patient .* give the source a name of its own") as err:
        load_job(job)
    assert folder not in str(err.value)
    # the same pattern hides the folder wherever the manifest records a job path
    assert redacted_path(f"../{folder}/train.txt") == "../<id>/train.txt"
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["name"] = "ct"
    write_job(tmp_path, doc)
    assert load_job(job).sources[0].name == "ct"


@pytest.mark.parametrize("folder", UNDATED)
def test_a_root_folder_with_a_months_letters_but_no_date_keeps_its_name(tmp_path: Path, folder: str) -> None:
    """Not every month's letters make a date: `decoder`, `Dec_model`, `may_2_runs` (no year), a
    month and a year (`Mar_2018`, `June2023`: no day; a two-digit year needs a separator after
    the day, so `2018` is not read as day 20 of '18)."""
    assert load_job(dated_root_job(tmp_path, folder)).sources[0].name == folder.replace(".", "_")
    assert redacted_path(f"../{folder}/train.txt") == f"../{folder}/train.txt"
