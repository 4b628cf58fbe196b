"""Given splits: a public dataset's official split (lists of files or entities, a table column),
reproduced exactly, carved by patient where a split is missing, and audited as given.

Every test builds (or validates) a small real tree of PNGs with a label table: NIH
ChestX-ray14's bare file-name lists, the Decathlon's ``./imagesTr/...`` paths in a CSV column,
MIMIC-CXR's ``split`` column with ``validate`` for valid.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from packer.badsamples import read_bad_samples
from packer.cli import main
from packer.config import SPLITS, load_job
from packer.errors import ConfigError, LeakageError
from packer.manifest import config_hash
from packer.phi import pseudonymizer_for
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import make_sample_id
from packer.pipeline.splitlists import stem_of
from tests.helpers import write_job

SOURCE = "xray"


def photo(seed: int) -> np.ndarray:
    """A textured colour image, different for every seed (no two are near copies)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (128, 96), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def nih_relpath(patient: int, image: int) -> str:
    """Where NIH ChestX-ray14 keeps a patient's image: ``images_00k/images/<patient>_<image>.png``."""
    return f"images_{1 + patient % 2:03d}/images/{patient:08d}_{image:03d}.png"


def write_tree(folder: Path, files: dict[str, tuple[str, int]], *, columns: dict[str, dict[str, str]] | None = None
               ) -> Path:
    """PNGs at ``files`` (relpath → (entity, image seed)) and a table path,label,entity (plus
    ``columns``: name → relpath → cell); returns the raw root."""
    raw = folder / "raw"
    extra = sorted(columns or {})
    lines = [",".join(["path", "label", "entity", *extra])]
    for i, (rel, (entity, seed)) in enumerate(sorted(files.items())):
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(raw / rel), photo(seed))
        lines.append(",".join([rel, "ab"[i % 2], entity, *((columns or {})[c].get(rel, "") for c in extra)]))
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    return raw


def job_file(folder: Path, split: dict[str, Any], name: str = "job.yaml") -> Path:
    doc = {"name": "official", "sources": [{"name": SOURCE, "kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": split, "transform": {"image": {"size": [32, 32]}}, "pack": {"format": "webdataset"},
           "output": "out"}
    return write_job(folder, doc, name)


def run_build(job: Path) -> BuildResult:
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True))


def built_splits(result: BuildResult) -> dict[str, str]:
    """Sample key → split, as ``_index.parquet`` records it."""
    index = pq.read_table(result.version_dir / "_index.parquet", columns=["key", "split"]).to_pylist()
    return {row["key"]: row["split"] for row in index}


def key(rel: str) -> str:
    return make_sample_id(SOURCE, rel)


def unit(seed: int, text: str) -> float:
    """The seeded hash packer documents for its splits: sha256 of ``packer-split␀seed␀text``, as a
    number in [0, 1)."""
    digest = hashlib.sha256(f"packer-split\x00{seed}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def validate(job: Path) -> tuple[int, dict[str, Any], str]:
    out = job.parent / "report.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out)])
    return result.exit_code, (json.loads(out.read_text()) if out.exists() else {}), result.output


# ---------------------------------------------------------------------------------------------
# NIH ChestX-ray14: two lists of bare file names, no valid list


@pytest.fixture(scope="module")
def nih(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[str, int]]]:
    folder = tmp_path_factory.mktemp("nih")
    files = {nih_relpath(p, k): (f"{p:08d}", 10 * p + k) for p in range(12) for k in range(2)}
    write_tree(folder, files)
    names = {rel: rel.rsplit("/", 1)[1] for rel in files}
    train_val = [names[rel] for rel, (entity, _) in sorted(files.items()) if int(entity) < 9]
    test = [names[rel] for rel, (entity, _) in sorted(files.items()) if int(entity) >= 9]
    (folder / "train_val_list.txt").write_text("# NIH ChestX-ray14\n\n" + "\n".join(train_val) + "\n")
    (folder / "test_list.txt").write_text("\n".join(test) + "\n\n")
    return folder, files


def carve_seed(entities: list[str], ratio: float) -> int:
    """The first seed whose carve takes some of ``entities`` but not all (computed here from the
    documented hash, not by packer)."""
    return next(seed for seed in range(100)
                if 0 < sum(unit(seed, f"carve\x00train\x00{e}") < ratio for e in entities) < len(entities))


def test_nih_lists_of_bare_names_are_reproduced_and_valid_is_carved_whole_by_patient(
        nih: tuple[Path, dict[str, tuple[str, int]]]) -> None:
    folder, files = nih
    train_val = sorted({e for e, _ in files.values() if int(e) < 9})
    seed = carve_seed(train_val, 0.3)
    job = job_file(folder, {"by": "list", "match": "name", "seed": seed,
                            "lists": {"train": "train_val_list.txt", "test": "test_list.txt"},
                            "carve": {"valid": {"from": "train", "ratio": 0.3}}})
    result = run_build(job)
    carved = {e for e in train_val if unit(seed, f"carve\x00train\x00{e}") < 0.3}
    want = {key(rel): "test" if int(e) >= 9 else "valid" if e in carved else "train" for rel, (e, _) in files.items()}
    assert built_splits(result) == want
    assert result.issues == ()
    recorded = result.manifest["config"]["split"]
    assert recorded["lists"] == {
        name: {"file": file, "sha256": hashlib.sha256((folder / file).read_bytes()).hexdigest()}
        for name, file in (("train", "train_val_list.txt"), ("test", "test_list.txt"))}
    assert recorded["match"] == "name" and recorded["carve"] == {"valid": {"from": "train", "ratio": 0.3}}
    assert "ratios" not in recorded and recorded["accept_leaks"] is False
    assert result.manifest["audit"]["passed"] is True


def test_a_changed_list_is_another_dataset(
        nih: tuple[Path, dict[str, tuple[str, int]]], tmp_path: Path) -> None:
    folder, _ = nih
    split = {"by": "list", "match": "name", "lists": {"train": "train_val_list.txt", "test": "test_list.txt"}}
    before = config_hash(load_job(job_file(folder, split, "hash.yaml")).identity())
    lines = (folder / "test_list.txt").read_text()
    try:
        (folder / "test_list.txt").write_text(lines + "# a comment changes the bytes, so the identity\n")
        after = config_hash(load_job(job_file(folder, split, "hash.yaml")).identity())
    finally:
        (folder / "test_list.txt").write_text(lines)
    assert after != before
    assert config_hash(load_job(job_file(folder, split, "hash.yaml")).identity()) == before


def test_a_file_in_no_list_is_a_not_in_split_bad_sample(tmp_path: Path) -> None:
    files = {f"p{p}/{k}.png": (f"P{p}", 10 * p + k) for p in range(6) for k in range(2)}
    write_tree(tmp_path, files)
    (tmp_path / "train.txt").write_text("\n".join(r for r in files if int(r[1]) < 4) + "\n")
    (tmp_path / "test.txt").write_text("p4/0.png\np4/1.png\n")  # p5's two files are in no list
    result = run_build(job_file(tmp_path, {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"},
                                           "accept_leaks": False}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).relative_to(tmp_path / "raw").as_posix(), r["reason"], r["stage"])
                  for r in records) == [("p5/0.png", "not_in_split", "split"), ("p5/1.png", "not_in_split", "split")]
    assert "no split list names it" in records[0]["message"]
    assert set(built_splits(result)) == {key(r) for r in files if not r.startswith("p5")}
    assert result.manifest["bad_samples"]["by_reason"] == {"not_in_split": 2}


# ---------------------------------------------------------------------------------------------
# lists by path (a CSV column, the Decathlon's ./imagesTr/...) and by entity


def test_lists_by_path_from_a_csv_column_and_by_entity(tmp_path: Path) -> None:
    files = {f"imagesTr/case_{c:03d}.png": (f"C{c:03d}", c) for c in range(8)}
    write_tree(tmp_path / "path", files)
    (tmp_path / "path" / "training.csv").write_text(
        "image,label\n" + "".join(f"./imagesTr/case_{c:03d}.png,./labelsTr/case_{c:03d}.png\n" for c in range(6)))
    (tmp_path / "path" / "test.csv").write_text("image\n./imagesTr/case_006.png\nimagesTr/case_007.png\n")
    by_path = run_build(job_file(tmp_path / "path", {"by": "list", "lists": {
        "train": {"file": "training.csv", "column": "image"}, "test": {"file": "test.csv", "column": "image"}}}))
    assert built_splits(by_path) == {key(r): "train" if int(r[-7:-4]) < 6 else "test" for r in files}

    visits = {f"{p}/visit{v}.png": (p, 10 * i + v) for i, p in enumerate(["anna", "ben", "carl", "dora"])
              for v in range(3)}
    write_tree(tmp_path / "entity", visits)
    (tmp_path / "entity" / "train.txt").write_text("anna\nben\n")
    (tmp_path / "entity" / "valid.txt").write_text("carl\n")
    (tmp_path / "entity" / "test.txt").write_text("dora\n")
    by_entity = run_build(job_file(tmp_path / "entity", {"by": "list", "match": "entity", "lists": {
        "train": "train.txt", "valid": "valid.txt", "test": "test.txt"}}))
    where = {"anna": "train", "ben": "train", "carl": "valid", "dora": "test"}
    assert built_splits(by_entity) == {key(rel): where[entity] for rel, (entity, _) in visits.items()}


def test_a_split_csv_of_dicom_ids_names_files_by_stem(tmp_path: Path) -> None:
    """MIMIC-CXR's split CSV names each image by its dicom_id, the file name without .jpg."""
    ids = {f"files/p10/p1000{p}/s5{p}/{p:02d}aa804e-bde0afdd-{k}.jpg": (f"1000{p}", 10 * p + k)
           for p in range(4) for k in range(2)}
    write_tree(tmp_path, ids)
    official = ("train", "train", "validate", "test")
    rows = [(rel.rsplit("/", 1)[1][:-4], official[int(e[-1])]) for rel, (e, _) in ids.items()]
    for split, wanted in (("train", "train"), ("valid", "validate"), ("test", "test")):
        (tmp_path / f"{split}.csv").write_text("dicom_id,study_id,subject_id,split\n" + "".join(
            f"{dicom_id},5,1,{value}\n" for dicom_id, value in rows if value == wanted))
    result = run_build(job_file(tmp_path, {"by": "list", "match": "stem", "lists": {
        s: {"file": f"{s}.csv", "column": "dicom_id"} for s in SPLITS}}))
    where = {"0": "train", "1": "train", "2": "valid", "3": "test"}
    assert built_splits(result) == {key(rel): where[e[-1]] for rel, (e, _) in ids.items()}


def test_a_stem_is_the_name_without_its_extension() -> None:
    assert [stem_of(n) for n in ("00000001_000.png", "la_003.nii.gz", "1.2.840.10008.5.dcm", "README", ".hidden")] \
        == ["00000001_000", "la_003", "1.2.840.10008.5", "README", ".hidden"]


# ---------------------------------------------------------------------------------------------
# MIMIC-CXR: a split column with "validate"


def test_a_table_column_gives_the_split_and_map_renames_its_values(tmp_path: Path) -> None:
    files = {f"p1{p}/s{p}{k}.png": (f"1{p}", 10 * p + k) for p in range(6) for k in range(2)}
    official = {rel: ("train", "train", "validate", "train", "test", "validate")[int(rel[2])] for rel in files}
    write_tree(tmp_path, files, columns={"split": official})
    result = run_build(job_file(tmp_path, {"by": "column", "column": "split", "map": {"validate": "valid"}}))
    assert built_splits(result) == {key(rel): {"validate": "valid"}.get(s, s) for rel, s in official.items()}
    assert result.manifest["config"]["split"]["column"] == "split"
    assert result.manifest["config"]["split"]["map"] == {"validate": "valid"}


def test_a_split_read_from_each_files_folder_is_a_column_too(tmp_path: Path) -> None:
    """Datasets that ship as train/ val/ test/ folders: fields: {split: {component: 0}}."""
    files = {f"{folder}/{patient}_{k}.png": (patient, 10 * i + k)
             for i, (folder, patient) in enumerate([("train", "a"), ("train", "b"), ("val", "c"), ("test", "d")])
             for k in range(2)}
    raw = write_tree(tmp_path, files)
    doc = yaml.safe_load(job_file(tmp_path, {"by": "column", "column": "split", "map": {"val": "valid"}}).read_text())
    doc["sources"] = [{"name": SOURCE, "kind": "image", "root": str(raw), "label": "none",
                       "entity": {"path": "/([a-z])_"}, "fields": {"split": {"component": 0}}}]
    result = run_build(write_job(tmp_path, doc, "folders.yaml"))
    assert built_splits(result) == {key(rel): {"val": "valid"}.get(rel.split("/")[0], rel.split("/")[0])
                                    for rel in files}


def test_under_pseudonymization_the_column_and_raw_entity_lists_still_decide(tmp_path: Path) -> None:
    """Pseudonyms replace entity ids and table cells before the split: the split cell is kept
    (train/valid/test names nobody), and listed raw ids are pseudonymized like the samples'."""
    files = {f"{p}/{k}.png": (p, 10 * i + k) for i, p in enumerate(["MRN001", "MRN002", "MRN003"]) for k in range(2)}
    official = {"MRN001": "train", "MRN002": "validate", "MRN003": "test"}
    write_tree(tmp_path, files, columns={"split": {rel: official[e] for rel, (e, _) in files.items()}})
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    (tmp_path / "train.txt").write_text("MRN001\n")
    (tmp_path / "valid.txt").write_text("MRN002\n")
    (tmp_path / "test.txt").write_text("MRN003\n")
    splits = {"column": {"by": "column", "column": "split", "map": {"validate": "valid"}},
              "entity": {"by": "list", "match": "entity", "lists": {s: f"{s}.txt" for s in SPLITS}}}
    for name, split in splits.items():
        job_path = job_file(tmp_path, split, f"{name}.yaml")
        doc = yaml.safe_load(job_path.read_text())
        doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
        job = load_job(write_job(tmp_path, doc, f"{name}.yaml"))
        phi = pseudonymizer_for(job.phi)
        result = build(job, BuildOptions(scheduler="sync", quiet=True))
        assert built_splits(result) == {make_sample_id(SOURCE, rel, phi): {"validate": "valid"}.get(official[e],
                                                                                                   official[e])
                                        for rel, (e, _) in files.items()}, name


def test_a_column_value_that_is_no_split_is_a_config_error_with_the_closest_split(tmp_path: Path) -> None:
    files = {f"p{p}.png": (f"P{p}", p) for p in range(4)}
    write_tree(tmp_path, files, columns={"split": {"p0.png": "train", "p1.png": "validate", "p2.png": "validate",
                                                   "p3.png": "test"}})
    code, _, output = validate(job_file(tmp_path, {"by": "column", "column": "split"}))
    assert code == ConfigError.exit_code
    assert "'validate' (2 file(s)" in output and "did you mean valid?" in output
    assert "map: {validate: valid}" in output
    # under PHI the example file is its sample key: a config error goes to CI logs too
    doc = yaml.safe_load(job_file(tmp_path, {"by": "column", "column": "split"}).read_text())
    doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    code, _, output = validate(write_job(tmp_path, doc, "job.yaml"))
    assert code == ConfigError.exit_code
    assert f"'validate' (2 file(s), e.g. sample {SOURCE}-" in output and "p1.png" not in output


@pytest.mark.parametrize(("column", "source", "why", "fix"), [
    ("entity", {}, "the source's entity column (entity: entity)", "split: {by: entity}"),
    ("patient", {"entity": "patient"}, "the source's entity column (entity: patient)", "split: {by: entity}"),
    ("timestamp", {}, "the source's time column (time: timestamp)", "split: {by: time"),
    ("path", {}, "the column naming each file (path: path)", "name that column in split.column"),
    ("label", {}, "a column of its label (label:), which holds classes", "name that column in split.column"),
])
def test_a_split_column_the_job_reads_as_another_role_is_named_as_such(
        tmp_path: Path, column: str, source: dict[str, str], why: str, fix: str) -> None:
    """by: column on the source's entity column was told the table "has no column 'patient'"
    above a header naming it, with the fix "add the column": a row keeps the cells the job reads
    as its path, label, entity and time apart from those the split reads. The error names the
    column's role and what to do instead."""
    files = {f"p{p}.png": (f"P{p}", p) for p in range(4)}
    write_tree(tmp_path, files, columns={"patient": {rel: e for rel, (e, _) in files.items()},
                                         "timestamp": dict.fromkeys(files, "2021-01-01")})
    doc = yaml.safe_load(job_file(tmp_path, {"by": "column", "column": column}).read_text())
    doc["sources"][0].update(source)
    with pytest.raises(ConfigError) as caught:
        load_job(write_job(tmp_path, doc, "job.yaml"))
    message = str(caught.value)
    assert f"sources[0] (source {SOURCE!r}): split.column {column!r} is {why}" in message
    assert fix in message and "has no column" not in message


def test_a_split_column_missing_from_the_table_says_which_cells_its_rows_carry(tmp_path: Path) -> None:
    """The list of what the rows carry left out the columns the job reads as path, label, entity
    and time, as if the table held only the rest: it says so."""
    files = {f"p{p}.png": (f"P{p}", p) for p in range(4)}
    write_tree(tmp_path, files, columns={"note": dict.fromkeys(files, "x")})
    code, _, output = validate(job_file(tmp_path, {"by": "column", "column": "fold"}))
    assert code == ConfigError.exit_code
    assert ("has no column 'fold' (beside the columns the job reads as each file's path, label, entity and time, "
            "its rows carry note)") in " ".join(output.split())


# ---------------------------------------------------------------------------------------------
# official splits that leak: reproduced exactly, reported by the audit


def test_an_official_split_that_leaks_a_patient_fails_unless_accepted_and_is_reproduced_exactly(
        tmp_path: Path) -> None:
    files = {f"{p}/{k}.png": (p, 10 * i + k) for i, p in enumerate(["ann", "bob", "cat", "dan"]) for k in range(2)}
    write_tree(tmp_path, files)
    # bob's second image is in the test list: the official split leaks bob
    (tmp_path / "train.txt").write_text("ann/0.png\nann/1.png\nbob/0.png\ncat/0.png\ncat/1.png\n")
    (tmp_path / "test.txt").write_text("bob/1.png\ndan/0.png\ndan/1.png\n")
    split = {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}}
    code, report, output = validate(job_file(tmp_path, split, "strict.yaml"))
    assert code == LeakageError.exit_code
    overlap = report["audit"]["rules"]["entity_overlap"]
    assert overlap["severity"] == "fail" and overlap["findings"] == [{"entity_id": "bob", "splits": ["train", "test"]}]
    with pytest.raises(LeakageError, match="split.accept_leaks: true"):
        run_build(job_file(tmp_path, split, "strict.yaml"))

    result = run_build(job_file(tmp_path, {**split, "accept_leaks": True}))
    want = {key(rel): "test" if rel in ("bob/1.png", "dan/0.png", "dan/1.png") else "train" for rel in files}
    assert built_splits(result) == want
    rules = result.manifest["audit"]["rules"]
    assert rules["entity_overlap"]["severity"] == "report" and rules["entity_overlap"]["count"] == 1
    assert rules["entity_overlap"]["accepted"] is True and rules["entity_overlap"]["given"] == "list"
    assert result.manifest["config"]["split"]["accept_leaks"] is True
    # 4 patients, bob in both splits: the totals count him once (they summed the splits' 2 + 3)
    from packer.htmlreport import render_html_report
    from packer.inspection import inspect_dataset

    assert [result.manifest["splits"][s]["entities"] for s in ("train", "test")] == [3, 2]
    assert inspect_dataset(result.version_dir)["totals"]["entities"] == 4
    page = render_html_report(result.version_dir)
    assert re.search(r'data-split="total">.*?data-field="entities" data-value="4"', page), "total row"


def test_an_official_split_that_leaks_an_exact_copy_under_another_patient_is_reported(tmp_path: Path) -> None:
    files = {f"{p}/{k}.png": (p, 10 * i + k) for i, p in enumerate(["ann", "bob", "cat", "dan"]) for k in range(2)}
    files["dan/copy.png"] = ("dan", 0)  # ann/0.png's pixels again, under dan, who is in test
    write_tree(tmp_path, files)
    (tmp_path / "train.txt").write_text("ann\nbob\n")
    (tmp_path / "test.txt").write_text("cat\ndan\n")
    split = {"by": "list", "match": "entity", "lists": {"train": "train.txt", "test": "test.txt"}}
    with pytest.raises(LeakageError, match="exact_duplicates_across_splits"):
        run_build(job_file(tmp_path, split, "strict.yaml"))
    result = run_build(job_file(tmp_path, {**split, "accept_leaks": True}))
    # the copy stays where dan's list puts it: a given split is never regrouped
    assert built_splits(result) == {key(rel): "train" if e in ("ann", "bob") else "test"
                                    for rel, (e, _) in files.items()}
    rules = result.manifest["audit"]["rules"]
    exact = rules["exact_duplicates_across_splits"]
    assert exact["count"] == 1 and exact["severity"] == "report"
    assert rules["duplicates_span_entities"]["count"] == 1
    assert rules["entity_overlap"]["count"] == 0


# ---------------------------------------------------------------------------------------------
# the lists themselves: missing files, the wrong match, one file in two lists


def test_under_pseudonymization_a_listed_raw_id_stays_out_of_messages(tmp_path: Path) -> None:
    """split.match: entity lists raw patient ids; under PHI a message names the list and line of
    an item (the user holds the list), never the raw id, which would reach CI logs and the JSON."""
    files = {f"{p}/{k}.png": (p, 10 * i + k) for i, p in enumerate(["MRN001", "MRN002", "MRN003"]) for k in range(2)}
    write_tree(tmp_path, files)
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    (tmp_path / "train.txt").write_text("MRN001\nMRN002\nMRN0077-GHOST\n")
    (tmp_path / "test.txt").write_text("MRN003\n")
    split = {"by": "list", "match": "entity", "lists": {"train": "train.txt", "test": "test.txt"}}
    doc = yaml.safe_load(job_file(tmp_path, split).read_text())
    doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
    code, report, output = validate(write_job(tmp_path, doc, "job.yaml"))
    assert code == 0, output
    assert "1 of its 3 items name no sample (by entity), e.g. line 3 (a file" in output
    (tmp_path / "test.txt").write_text("MRN003\nMRN002\n")
    code, _, output = validate(write_job(tmp_path, doc, "job.yaml"))
    assert code == ConfigError.exit_code
    assert ("an entity is listed in two splits: split.lists.train (train.txt) line 2 and split.lists.test "
            "(test.txt) line 2") in " ".join(output.split())
    assert not any(raw in output + json.dumps(report) for raw in ("MRN00", "GHOST"))


def test_under_pseudonymization_a_lists_digest_is_keyed_so_its_raw_ids_cannot_be_guessed_back(
        tmp_path: Path) -> None:
    """The manifest records each list's digest. A plain sha256 of a list of one MRN gave the MRN
    back by trying every number against the committed manifest; under pseudonymize the digest is
    an HMAC with the PHI key (stable for one key and list, so the identity stays reproducible),
    and a list that changes while the job runs is still caught."""
    write_tree(tmp_path, {f"{p}/0.png": (p, i) for i, p in enumerate(["7301842", "6003117"])})
    (tmp_path / "train.txt").write_text("7301842\n")
    (tmp_path / "test.txt").write_text("6003117\n")
    split = {"by": "list", "match": "entity", "lists": {"train": "train.txt", "test": "test.txt"}}
    doc = yaml.safe_load(job_file(tmp_path, split).read_text())
    plain = load_job(write_job(tmp_path, doc, "keep.yaml")).identity()["split"]["lists"]
    assert plain["train"]["sha256"] == hashlib.sha256(b"7301842\n").hexdigest()  # phi: keep (no ids hidden)
    digests = []
    for key in ("5f" * 32, "5f" * 32, "a0" * 32):
        (tmp_path / "phi.key").write_text(key + "\n")
        doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
        lists = load_job(write_job(tmp_path, doc, "job.yaml")).identity()["split"]["lists"]
        digests.append(lists["train"]["sha256"])
        text = json.dumps(lists)
        guesses = {hashlib.sha256(f"{n}\n".encode()).hexdigest() for n in (7301842, 6003117)}
        assert not any(g in text for g in guesses), text
    assert digests[0] == digests[1] != digests[2] and digests[0].startswith("hmac-sha256:")
    assert run_build(write_job(tmp_path, doc, "job.yaml")).manifest_path.exists()  # the run's own check still holds


@pytest.mark.parametrize("by", ["list", "column"])
def test_under_pseudonymization_a_file_in_no_split_is_named_by_key_in_the_warning(tmp_path: Path, by: str) -> None:
    """The warning for files a given split leaves out is printed (and kept in validate --json):
    under PHI it names the sample key, which packer locate maps to the file, not the raw path,
    whose folders carry the patient's name."""
    files = {f"Doe^John_MRN00{i}/{k}.png": (f"P{i}", 10 * i + k) for i in range(3) for k in range(2)}
    cells = {rel: ("train", "test", "")[int(entity[1:])] for rel, (entity, _) in files.items()}
    write_tree(tmp_path, files, columns={"split": cells})
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    (tmp_path / "train.txt").write_text("".join(f"{rel}\n" for rel, s in cells.items() if s == "train"))
    (tmp_path / "test.txt").write_text("".join(f"{rel}\n" for rel, s in cells.items() if s == "test"))
    split = ({"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}} if by == "list" else
             {"by": "column", "column": "split"})
    doc = yaml.safe_load(job_file(tmp_path, split).read_text())
    doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
    code, report, output = validate(write_job(tmp_path, doc, "job.yaml"))
    assert code in (0, 3), output
    (warning,) = [w["message"] for w in report["warnings"] if "not_in_split" in w["message"]]
    assert f"e.g. sample {SOURCE}-" in warning and "packer locate" in warning
    assert "Doe" not in json.dumps(report["warnings"])
    assert not [line for line in output.splitlines() if "warning" in line and "Doe" in line]


def test_under_pseudonymization_no_closest_name_from_the_data_is_printed(tmp_path: Path) -> None:
    """The closest existing name is a raw path of the data (folders named after patients), and so
    is the list's own item: under PHI the warning (stdout, CI logs, validate --json) gives the
    list's line number only, as it does for listed entity ids."""
    files = {f"Doe^John_MRN00{i}/{k}.png": (f"P{i}", 10 * i + k) for i in range(2) for k in range(2)}
    write_tree(tmp_path, files)
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    (tmp_path / "train.txt").write_text("Doe^John_MRN000/0.png\nDoe^John_MRN000/1.png\nDoe^John_MRN000/11.png\n")
    (tmp_path / "test.txt").write_text("Doe^John_MRN001/0.png\nDoe^John_MRN001/1.png\n")
    split = {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}}
    doc = yaml.safe_load(job_file(tmp_path, split).read_text())
    doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
    code, report, output = validate(write_job(tmp_path, doc, "job.yaml"))
    assert code == 0, output
    (warning,) = [w["message"] for w in report["warnings"] if "name no sample" in w["message"]]
    assert "1 of its 3 items name no sample (by path), e.g. line 3 " in warning
    assert "Doe" not in warning and "MRN" not in warning and "11.png" not in warning
    assert "closest" not in warning


def test_items_naming_missing_files_warn_with_the_count_an_example_and_the_closest_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {f"img/{i:03d}.png": (f"P{i}", i) for i in range(6)}
    write_tree(tmp_path, files)
    # a partial download: two listed images are not in the tree
    (tmp_path / "train.txt").write_text("img/000.png\nimg/001.png\nimg/002.png\nimg/003.png\nimg/0040.png\n"
                                        "img/099.png\n")
    (tmp_path / "test.txt").write_text("img/004.png\nimg/005.png\n")
    result = run_build(job_file(tmp_path, {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}}))
    err = capsys.readouterr().err
    assert ("split.lists.train (train.txt): 2 of its 6 items name no sample (by path), e.g. line 5: "
            "'img/0040.png'") in err
    assert "the closest existing path is 'img/004.png'" in err
    assert len(built_splits(result)) == 6


def test_items_written_in_another_unicode_form_name_their_files_as_table_cells_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder made on macOS is named in NFD (``cafe`` and a combining accent), a list written
    elsewhere in NFC (one code point for the é): its items named nothing, every café file was a
    not_in_split bad sample, and the warning's closest path printed exactly like the item. An
    item names its file across Unicode forms; one spelled as the file is comes first, and the
    other is then said to differ only in Unicode form."""
    nfd, nfc = "cafe\u0301", "caf\u00e9"
    files = {f"{folder}/{i}.png": (f"{folder}{i}", 10 * k + i) for k, folder in enumerate((nfd, "dog"))
             for i in range(4)}
    write_tree(tmp_path, files)
    items = [f"{nfc}/{i}.png" for i in range(4)] + [f"dog/{i}.png" for i in range(4)]
    (tmp_path / "train.csv").write_text("image\n" + "\n".join(items[0:3] + items[4:7]) + "\n", encoding="utf-8")
    (tmp_path / "valid.txt").write_text(f"{items[3]}\n{items[7]}\n", encoding="utf-8")
    job = job_file(tmp_path, {"by": "list", "lists": {"train": {"file": "train.csv", "column": "image"},
                                                      "valid": "valid.txt"}})
    result = run_build(job)
    where = {key(rel): "valid" if rel.endswith("3.png") else "train" for rel in files}
    assert built_splits(result) == where
    assert "name no sample" not in capsys.readouterr().err
    # the file also listed as it is spelled: that item names it, and the other is told why not
    (tmp_path / "valid.txt").write_text(f"{items[3]}\n{items[7]}\n{nfd}/0.png\n", encoding="utf-8")
    result = run_build(job)
    assert built_splits(result) == {**where, key(f"{nfd}/0.png"): "valid"}
    err = capsys.readouterr().err
    assert "split.lists.train (train.csv): 1 of its 6 items name no sample (by path), e.g. line 2" in err
    assert "differs from the item only in Unicode form, NFC against NFD" in err


def test_an_item_naming_a_file_refused_as_a_bad_sample_is_said_to_and_not_pointed_at_another_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A listed file that is there but truncated was called an item that names no sample, "the
    closest existing name is '00000010_001.png'": another patient's file, for a list that is right.
    It names a bad sample, and the warning says so, by its reason; a missing item beside it is
    still unknown, with its closest name."""
    files = {nih_relpath(p, i): (f"{p:08d}", 10 * p + i) for p in range(11) for i in range(2)}  # 1 bad of 22
    raw = write_tree(tmp_path, files)
    broken = raw / nih_relpath(1, 1)
    broken.write_bytes(broken.read_bytes()[:200])  # cut short: a truncated PNG, a bad sample
    (tmp_path / "train.txt").write_text("\n".join(Path(nih_relpath(p, i)).name for p in range(8) for i in range(2))
                                        + "\n00000002_009.png\n")
    (tmp_path / "test.txt").write_text("\n".join(Path(nih_relpath(p, i)).name for p in range(8, 11) for i in range(2)))
    split = {"by": "list", "match": "name", "lists": {"train": "train.txt", "test": "test.txt"}}
    result = run_build(job_file(tmp_path, split))
    err = capsys.readouterr().err
    assert ("split.lists.train (train.txt): 1 of its 17 items name a file refused as a bad sample (truncated 1), "
            "e.g. line 4: '00000001_001.png'; not packed: the bad-sample report (bad_samples.jsonl)") in err, err
    assert ("1 of its 17 items name no sample (by name), e.g. line 17: '00000002_009.png'; the closest existing "
            "name is") in err, err
    assert "'00000001_001.png'; the closest" not in err
    assert [issue["reason"] for issue in read_bad_samples(result.version_dir / "bad_samples.jsonl")] == ["truncated"]
    assert len(built_splits(result)) == 21
    code, report, output = validate(job_file(tmp_path, split))
    assert code == 0, output
    assert any("name a file refused as a bad sample (truncated 1), e.g. line 4" in w["message"]
               for w in report["warnings"]), report["warnings"]


def test_under_pseudonymization_an_item_naming_a_bad_sample_is_said_to_by_its_line_only(tmp_path: Path) -> None:
    """The bad sample's keyed id still finds the listed path it names; the warning quotes neither
    it nor a closest name."""
    files = {f"Doe^John_MRN{p:03d}/{i}.png": (f"P{p}", 10 * p + i) for p in range(11) for i in range(2)}
    raw = write_tree(tmp_path, files)
    broken = raw / "Doe^John_MRN001/1.png"
    broken.write_bytes(broken.read_bytes()[:200])
    (tmp_path / "phi.key").write_text("5f" * 32 + "\n")
    for name, patients in (("train", range(8)), ("test", range(8, 11))):
        (tmp_path / f"{name}.txt").write_text("\n".join(f"Doe^John_MRN{p:03d}/{i}.png" for p in patients
                                                        for i in (0, 1)))
    doc = yaml.safe_load(job_file(tmp_path, {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}})
                         .read_text())
    doc["phi"] = {"mode": "pseudonymize", "key_file": "phi.key"}
    code, report, output = validate(write_job(tmp_path, doc, "job.yaml"))
    assert code == 0, output
    (warning,) = [w["message"] for w in report["warnings"] if "split.lists.train" in w["message"]]
    assert "1 of its 16 items name a file refused as a bad sample (truncated 1), e.g. line 4;" in warning, warning
    assert "Doe" not in warning and "closest" not in warning


def test_a_list_of_names_read_as_paths_is_a_config_error_that_says_which_match(tmp_path: Path) -> None:
    files = {nih_relpath(p, 0): (f"{p:08d}", p) for p in range(4)}
    write_tree(tmp_path, files)
    (tmp_path / "train.txt").write_text("00000000_000.png\n00000001_000.png\n00000002_000.png\n")
    (tmp_path / "test.txt").write_text("00000003_000.png\n")
    code, _, output = validate(job_file(tmp_path, {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}}))
    assert code == ConfigError.exit_code
    assert "3 of its 3 items name no sample (by path), e.g. line 1: '00000000_000.png'" in output
    assert "set split.match: name" in output


def test_one_file_in_two_lists_is_a_config_error_naming_both_lists_and_lines(tmp_path: Path) -> None:
    write_tree(tmp_path, {f"{i}.png": (f"P{i}", i) for i in range(4)})
    (tmp_path / "train.txt").write_text("0.png\n1.png\n2.png\n")
    (tmp_path / "test.txt").write_text("# held out\n3.png\n1.png\n")
    code, _, output = validate(job_file(tmp_path, {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}}))
    assert code == ConfigError.exit_code
    assert "'1.png' is listed in two splits: split.lists.train (train.txt) line 2 and split.lists.test " \
           "(test.txt) line 3" in " ".join(output.split())


# ---------------------------------------------------------------------------------------------
# the carve keeps duplicate groups whole


def test_a_carve_moves_an_entity_and_its_exact_copies_under_other_entities_together(tmp_path: Path) -> None:
    files = {f"{p}/{k}.png": (p, 10 * i + k) for i, p in enumerate(f"e{j:02d}" for j in range(10)) for k in range(2)}
    files["z/copy.png"] = ("z", 0)  # an exact copy of e00/0.png under entity z
    write_tree(tmp_path, files)
    (tmp_path / "train.txt").write_text("\n".join(sorted({e for e, _ in files.values()})) + "\n")
    groups = {"e00": "e00", "z": "e00"}  # e00 and z are one split group: its smallest entity is e00
    entities = sorted({e for e, _ in files.values() if e != "z"})
    seed = next(s for s in range(200) if unit(s, "carve\x00train\x00e00") < 0.4
                and not all(unit(s, f"carve\x00train\x00{e}") < 0.4 for e in entities))
    result = run_build(job_file(tmp_path, {"by": "list", "match": "entity", "seed": seed, "lists": {
        "train": "train.txt"}, "carve": {"valid": {"from": "train", "ratio": 0.4}}}))
    splits = built_splits(result)
    by_entity: dict[str, set[str]] = defaultdict(set)
    for rel, (entity, _) in files.items():
        by_entity[entity].add(splits[key(rel)])
    want = {e: {"valid" if unit(seed, f"carve\x00train\x00{groups.get(e, e)}") < 0.4 else "train"} for e in by_entity}
    assert by_entity == want and by_entity["z"] == {"valid"}
    assert result.manifest["audit"]["rules"]["exact_duplicates_across_splits"]["count"] == 0


# ---------------------------------------------------------------------------------------------
# the job file: what a given split takes, and the identity of jobs that do not use it


@pytest.mark.parametrize(("split", "message"), [
    ({"by": "list"}, "split.lists: by: list needs a file per split"),
    ({"by": "list", "lists": {"train": "missing.txt"}}, "split.lists.train: cannot read"),
    ({"by": "list", "lists": {"train": "t.txt"}, "ratios": {"train": 1.0}}, "split.ratios: a given split"),
    ({"by": "list", "lists": {"train": "t.txt"}, "carve": {"valid": {"from": "test", "ratio": 0.1}}},
     "split test has no list to carve from"),
    ({"by": "list", "lists": {"train": "t.txt", "valid": "t.txt"}, "carve": {"valid": {"from": "train", "ratio": 0.1}}},
     "split valid has a list"),
    ({"by": "list", "lists": {"train": "t.txt"}, "carve": {"valid": {"from": "train", "ratio": 0.6},
                                                        "test": {"from": "train", "ratio": 0.4}}}, "add up to 1"),
    ({"by": "column"}, "split.column: by: column needs"),
    ({"by": "column", "column": "split", "match": "name"}, "split.match: only meaningful with by: list"),
    ({"by": "entity", "accept_leaks": True}, "split.accept_leaks: only meaningful with a given split"),
])
def test_a_given_split_refuses_what_does_not_apply(tmp_path: Path, split: dict[str, Any], message: str) -> None:
    (tmp_path / "t.txt").write_text("a.png\n")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_job(job_file(tmp_path, split))


def test_a_list_in_a_folder_that_is_not_there_says_the_folder_is_missing(tmp_path: Path) -> None:
    """A public dataset's recipe run before the data is downloaded named only the split list it could
    not read, so a newcomer fixed the list's path; the folder that is missing is the dataset's."""
    nested = {"by": "list", "lists": {"train": "data/nih/train_val_list.txt"}}
    with pytest.raises(ConfigError, match=(r"split\.lists\.train: cannot read .*train_val_list\.txt \(No such file or "
                                           r"directory; 'data/nih/train_val_list\.txt' is relative to the job file; "
                                           rf"the folder {re.escape(str(tmp_path / 'data'))} does not exist either: "
                                           r"is the dataset downloaded or mounted there\?\); fix the path")):
        load_job(job_file(tmp_path, nested))
    for spec, said in (("~/data/nih/train_val_list.txt", "a leading ~ is not expanded here"),
                       ("https://example.org/nih/train_val_list.txt", "a list is read from a local file, not a URL")):
        with pytest.raises(ConfigError, match=re.escape(said)) as raised:  # no made-up folder <job>/~ blamed
            load_job(job_file(tmp_path, {"by": "list", "lists": {"train": spec}}))
        assert "does not exist either" not in str(raised.value), raised.value
    absolute = {"by": "list", "lists": {"train": str(tmp_path / "missing.txt")}}  # its folder is there
    with pytest.raises(ConfigError, match=r"\(No such file or directory\); fix the path"):
        load_job(job_file(tmp_path, absolute))


def test_a_column_split_needs_a_table_whose_cells_reach_the_samples(tmp_path: Path) -> None:
    doc = yaml.safe_load(job_file(tmp_path, {"by": "column", "column": "split"}).read_text())
    doc["sources"] = [{"kind": "dicom", "root": "raw"}]
    (tmp_path / "raw").mkdir(exist_ok=True)
    with pytest.raises(ConfigError, match="match: stem"):
        load_job(write_job(tmp_path, doc, "dicom.yaml"))


@pytest.mark.parametrize("split", [{"by": "entity", "seed": 3}, {"by": "time", "cutoffs": {"valid": "2024-01-01"}},
                                   {"by": "entity", "pinned": "pins.csv", "folds": 5}])
def test_jobs_that_do_not_give_their_split_record_what_they_always_did(tmp_path: Path, split: dict[str, Any]) -> None:
    """Their config_hash is unchanged (the demo's version in tests/test_demo.py is the proof):
    the split's recorded keys are exactly the ones from before given splits; but a time split
    records no ratios (the dates decide, and ratios under by: time are a config error: the
    schema's defaults it recorded read as the split's request)."""
    (tmp_path / "pins.csv").write_text("entity,split\nP1,test\n")
    recorded = load_job(job_file(tmp_path, split)).identity()["split"]
    before = {"by", "ratios", "seed", "stratify", "folds", "pinned", "duplicates", "near_duplicates", "balance"}
    if split["by"] == "time":
        assert set(recorded) == before - {"ratios"} | {"cutoffs", "entity_policy"}
    else:
        assert set(recorded) == before and set(SPLITS) == set(recorded["ratios"])


@pytest.mark.parametrize(("text", "match"), [
    ("image\n" + "a" * 200_000 + ".png\n", None),  # over the csv module's default cell limit
    ('image\na.png\n"b.png\nc.png\n', r"the 'image' cell of the row on line 3 opens a quote"),
    ('image\na.png\n"b.png\n', r"the 'image' cell of the row on line 3 opens a quote \(\"\) that never closes"),
])
def test_a_csv_split_list_reads_long_cells_and_refuses_an_unclosed_quote(
        tmp_path: Path, text: str, match: str | None) -> None:
    from packer.config import SplitList
    from packer.pipeline.splitlists import read_split_list

    path = tmp_path / "test.csv"
    path.write_text(text)
    entry = SplitList(split="test", path=path, spec="test.csv", column="image",
                      sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    if match is None:
        assert read_split_list(entry) == [(2, "a" * 200_000 + ".png")]
        return
    with pytest.raises(ConfigError, match=match):
        read_split_list(entry)


@pytest.mark.parametrize(("name", "text"), [
    ("train.tsv", "image\tx\na.png\t1\n\nb.png\t2\n"),  # a tab-separated list, by its name
    ("train.csv", "image;x\na.png;1\n\nb.png;2\n"),  # Excel's "CSV" where the decimal mark is a comma
    ("train.csv", "image\tx\na.png\t1\n\nb.png\t2\n"),  # a spreadsheet saved as text, named .csv
    ("train.csv", "sep=|\nimage|x\na.png|1|\nb.png|2\n"),  # Excel's line naming the delimiter, not the header
])
def test_a_csv_split_list_is_separated_as_a_source_table_is(tmp_path: Path, name: str, text: str) -> None:
    """A list's CSV was always read with commas: a .tsv or semicolon list was one column named by its
    whole header line, and the error suggested that line ('image\\tx') as the column to name."""
    from packer.config import SplitList
    from packer.pipeline.splitlists import read_split_list

    path = tmp_path / name
    path.write_text(text)
    entry = SplitList(split="train", path=path, spec=name, column="image",
                      sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    assert read_split_list(entry) == ([(3, "a.png"), (4, "b.png")] if text.startswith("sep=")
                                      else [(2, "a.png"), (4, "b.png")])
