"""What a table that places no row says: the real cause and a fix the job does not already have.

A CheXpert download unzipped under another folder name, a join that leaves out every row, a join
whose keys one table writes as decimals (``1000.0``, as pandas writes an id column with a blank),
and ``uncertain_values`` written as YAML numbers: each test writes the tree as a user has it and
checks what packer says or does with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import discover


def _job(tmp_path: Path, source: dict[str, Any]) -> Path:
    doc = {"name": "t", "sources": [{"kind": "image", **source}], "split": {"by": "entity"},
           "pack": {"format": "webdataset"}, "output": "out"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _files(root: Path, relpaths: list[str]) -> None:
    for rel in relpaths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\x89PNG fake")


def _csv(path: Path, header: str, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")


# -- a download under another folder name --------------------------------------------------------

CHEXPERT = [f"train/patient0000{p}/study1/view1_frontal.jpg" for p in range(1, 4)]


def _renamed_chexpert(tmp_path: Path, path_base: str | None) -> Path:
    """CheXpert-v1.0-small unzipped as data/chexpert: its Path cells start 'CheXpert-v1.0-small/'."""
    root = tmp_path / "data" / "chexpert"
    _files(root, CHEXPERT)
    _csv(root / "train.csv", "Path,Cardiomegaly", [f"CheXpert-v1.0-small/{rel},1.0" for rel in CHEXPERT])
    table: dict[str, Any] = {"file": "data/chexpert/train.csv", "path": "Path"}
    if path_base is not None:
        table["path_base"] = path_base
    return _job(tmp_path, {"root": "data/chexpert", "table": table, "entity": {"path": r"(?P<entity>patient\d+)/"},
                           "label": {"kind": "multilabel", "columns": ["Cardiomegaly"]}})


@pytest.mark.parametrize("path_base", ["data", None])
def test_cells_starting_with_another_folder_name_than_the_root_say_so_not_set_path_base_again(
        tmp_path: Path, path_base: str | None) -> None:
    """The job already sets path_base to the folder above the root (as the README says for
    CheXpert): advising that again sends the user in a circle. The cause is the root's name."""
    with pytest.raises(ConfigError) as caught:
        discover(load_job(_renamed_chexpert(tmp_path, path_base)))
    said = str(caught.value)
    assert "the folder they start from (e.g. the folder above the root)" not in said
    assert "'CheXpert-v1.0-small'" in said and "'chexpert'" in said  # the cells' first folder, the root's name
    assert "rename" in said and "ln -s" in said
    link = f"ln -s {tmp_path / 'data' / 'chexpert'} {tmp_path / 'data' / 'CheXpert-v1.0-small'}"
    assert link in said
    # under phi: pseudonymize the folder is not named, and no placeholder passes for a folder name
    from packer.pipeline.tables import _renamed_top_fix

    source = load_job(_renamed_chexpert(tmp_path, path_base)).sources[0]
    hidden = _renamed_top_fix(source, "CheXpert-v1.0-small", hide_paths=True)
    assert "CheXpert-v1.0-small" not in hidden and "FIRST" not in hidden, hidden
    assert "the cells start with a folder (its name, the first part of the path cells, hidden" in hidden, hidden
    assert "<the cells' first folder>" in hidden, hidden
    assert ("set table.path_base to" in said) == (path_base is None)  # told to set it only where the job has none


def test_the_link_the_renamed_folder_message_gives_makes_the_rows_name_their_files(tmp_path: Path) -> None:
    """The advice works: with the link it names, every row is placed."""
    job = _renamed_chexpert(tmp_path, "data")
    (tmp_path / "data" / "CheXpert-v1.0-small").symlink_to(tmp_path / "data" / "chexpert")
    found = discover(load_job(job))
    assert sorted(ref.relpath for ref in found.refs) == CHEXPERT
    assert found.issues == []


def test_cells_from_another_folder_than_the_jobs_path_base_say_the_path_base_it_has(tmp_path: Path) -> None:
    """Where the job sets a path_base the cells do not start from, the advice names that setting
    as it is and asks to point it elsewhere, never "set path_base" as if it were missing."""
    _files(tmp_path / "raw", ["a/x.png", "a/y.png"])
    _csv(tmp_path / "t.csv", "path,entity,label", ["elsewhere/b/x.png,p1,cat", "elsewhere/b/y.png,p2,dog"])
    job = _job(tmp_path, {"root": "raw", "table": {"file": "t.csv", "path_base": "raw/a"}})
    with pytest.raises(ConfigError) as caught:
        discover(load_job(job))
    said = str(caught.value)
    assert "set table.path_base" not in said
    assert f"than table.path_base ({tmp_path / 'raw' / 'a'})" in said
    assert "point table.path_base at the folder the cells start from, or table.find: name" in said


# -- numbers written as YAML numbers in a label's cell lists -------------------------------------


def _yaml_job(tmp_path: Path, label: str) -> Path:
    """A job file as a user writes it, the label object in YAML flow style (numbers stay numbers)."""
    path = tmp_path / "job.yaml"
    path.write_text(f"""name: t
sources:
  - kind: image
    root: imgs
    table: t.csv
    label: {label}
split: {{by: entity}}
pack: {{format: webdataset}}
output: out
""")
    return path


def test_uncertain_values_written_as_a_yaml_number_match_the_cells_of_that_value(tmp_path: Path) -> None:
    """README: uncertain_values' "number matches by value, -1.00 too": written as the number -1
    (as labels: [0, 1] and map: {0: no} take numbers) it is taken, and -1.00 and -1 read as uncertain."""
    cells = ["1.0", "0.0", "-1.00", "-1"]
    _files(tmp_path / "imgs", [f"a{i}.png" for i in range(len(cells))])
    _csv(tmp_path / "t.csv", "path,entity,A,B", [f"a{i}.png,p{i},{c},1.0" for i, c in enumerate(cells)])
    job = _yaml_job(tmp_path, "{kind: multilabel, columns: [A, B], uncertain: {A: ones, B: zeros}, "
                              "uncertain_values: [-1]}")
    found = discover(load_job(job))
    assert found.issues == []
    labels = {ref.relpath: ref.label for ref in found.refs}
    assert labels == {"a0.png": "A|B", "a1.png": "B", "a2.png": "A|B", "a3.png": "A|B"}


def test_numeric_missing_tokens_written_as_yaml_numbers_are_taken(tmp_path: Path) -> None:
    """``missing: ["", -1]``: the number -1 is taken (it was "-1 is not of type 'string'"), and the
    cell -1 is a missing_label bad sample naming the token, as the empty cell is; 1 and 2.5 are values."""
    cells = ["2.5", "-1", "", "1"]
    _files(tmp_path / "imgs", [f"a{i}.png" for i in range(len(cells))])
    _csv(tmp_path / "t.csv", "path,entity,age", [f"a{i}.png,p{i},{c}" for i, c in enumerate(cells)])
    found = discover(load_job(_yaml_job(tmp_path, "{kind: numeric, columns: [age], missing: ['', -1]}")))
    assert sorted(ref.relpath for ref in found.refs) == ["a0.png", "a3.png"]
    missing = sorted((Path(issue.path).name, issue.reason) for issue in found.issues)
    assert missing == [("a1.png", "missing_label"), ("a2.png", "missing_label")]
    assert "'-1' is one of the source's missing-value tokens" in next(
        issue.message for issue in found.issues if issue.path.endswith("a1.png"))


# -- join keys ------------------------------------------------------------------------------------


def _joined(tmp_path: Path, main_ids: list[str], joined_ids: list[str], missing: str = "bad") -> Path:
    """Images a0.png... with a main table keyed on subject_id and a joined table of sites."""
    _files(tmp_path / "imgs", [f"a{i}.png" for i in range(len(main_ids))])
    _csv(tmp_path / "t.csv", "path,subject_id,label", [f"a{i}.png,{s},cat" for i, s in enumerate(main_ids)])
    _csv(tmp_path / "j.csv", "subject_id,site", [f"{s},s{i}" for i, s in enumerate(joined_ids)])
    return _job(tmp_path, {"root": "imgs", "table": {
        "file": "t.csv", "join": [{"file": "j.csv", "on": "subject_id", "missing": missing}]},
        "entity": {"column": "subject_id"}})


def test_join_keys_a_table_writes_as_decimals_match_the_integers_of_the_other(tmp_path: Path) -> None:
    """pandas writes an id column that has a blank as floats (1000.0): README reads 13.0 as 13 in a
    path template for that reason, and a join compares keys by the same rule, on both sides."""
    found = discover(load_job(_joined(tmp_path, ["1000", "1001.0", "1e3", "0042"], ["1000.0", "1001", "42"])))
    sites = {ref.relpath: dict(ref.extra)["site"] for ref in found.refs}
    assert sites == {"a0.png": "s0", "a1.png": "s1", "a2.png": "s0"}
    # a whole number written with leading zeros is an id as written: 0042 is not 42 (nor 42.0)
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("a3.png", "join_unmatched")]
    assert "no row of" in found.issues[0].message and "subject_id='0042'" in found.issues[0].message


def test_join_keys_with_a_fractional_part_stay_as_written(tmp_path: Path) -> None:
    """Only a whole number is read as its integer: 13.5 is not 13, and 13.50 is not 13.5."""
    found = discover(load_job(_joined(tmp_path, ["13.5", "7"], ["13.50", "7"])))
    assert [ref.relpath for ref in found.refs] == ["a1.png"]
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("a0.png", "join_unmatched")]


def test_a_joined_row_quoted_for_a_bad_cell_is_found_by_the_key_as_compared(tmp_path: Path) -> None:
    """A record quoting a joined cell names the joined table's row (Records.where): found by the
    key as the join compares it (1000 meets 1000.0), not as the main table writes it."""
    from packer.pipeline.tables import read_records

    _joined(tmp_path, ["1000"], ["1000.0"])
    job = load_job(tmp_path / "job.yaml")
    records = read_records(job.sources[0])
    number, record = records.records[0]
    assert record["site"] == "s0"
    joined_to = f"{tmp_path / 't.csv'} row 2"
    assert records.where(number, record, ["site"]) == f"{tmp_path / 'j.csv'} row 2 (joined to {joined_to})"


@pytest.mark.parametrize("missing", ["bad", "drop"])
def test_a_join_that_matches_no_row_is_a_config_error_with_a_key_from_each_table(tmp_path: Path, missing: str) -> None:
    """Keys that never meet (another id, another table) made every file a join_unmatched bad sample,
    the build ending in a bad-fraction error, or (missing: drop) every row left out: a config error
    shows a key of each table, to compare."""
    with pytest.raises(ConfigError) as caught:
        discover(load_job(_joined(tmp_path, ["1000", "1001"], ["S1000", "S1001", "S1002"], missing)))
    said = str(caught.value)
    assert said.count("j.csv") >= 1 and "t.csv row 2 has subject_id='1000'" in said
    assert "j.csv row 2 has subject_id='S1000'" in said
    assert "matches none of the 2 rows" in said


def test_a_join_that_matches_no_row_names_no_key_under_phi(tmp_path: Path) -> None:
    """The join key is often a patient id: under phi: pseudonymize the error names the rows and the
    columns, never a key."""
    from packer.phi import Pseudonymizer

    job = _joined(tmp_path, ["ZZPHI_1", "ZZPHI_2"], ["ZZPHI_3"])
    with pytest.raises(ConfigError) as caught:
        discover(load_job(job), Pseudonymizer(mode="pseudonymize", dates="shift", key=b"0" * 64))
    said = str(caught.value)
    assert "ZZPHI" not in said and "matches none of the 2 rows" in said and "subject_id" in said


def test_a_joined_table_giving_one_key_as_1000_and_as_1000_0_gives_it_twice(tmp_path: Path) -> None:
    """Keys compare as numbers, so 1000 and 1000.0 in the joined table are one key given twice:
    the config error shows both spellings, not one key the table never writes."""
    with pytest.raises(ConfigError, match=r"rows 2 and 3 both have one key \(subject_id='1000' and "
                                          r"subject_id='1000\.0': a whole number"):
        discover(load_job(_joined(tmp_path, ["1000"], ["1000", "1000.0"])))


def test_rows_a_join_drops_that_name_the_files_are_said_when_no_kept_row_names_one(tmp_path: Path) -> None:
    """missing: drop leaves out the rows naming the files under the root, and the rows it keeps name
    files that are not there: the "no row names a file" error blamed the path column and advised
    find: name, showing a cell and a file that are the same path. It says the join left the rows out,
    with a key of each table."""
    _files(tmp_path / "imgs", [f"a{i}.png" for i in range(4)])
    _csv(tmp_path / "t.csv", "path,subject_id,label",
         [*(f"a{i}.png,{1000 + i},cat" for i in range(4)), "b4.png,2004,cat", "b5.png,2005,cat"])
    _csv(tmp_path / "j.csv", "subject_id,site", ["2004,s4", "2005,s5"])
    job = _job(tmp_path, {"root": "imgs", "table": {
        "file": "t.csv", "join": [{"file": "j.csv", "on": "subject_id", "missing": "drop"}]},
        "entity": {"column": "subject_id"}})
    with pytest.raises(ConfigError) as caught:
        discover(load_job(job))
    said = str(caught.value)
    assert "find: name" not in said and "gives 'a0.png'" not in said
    assert "the join (missing: drop) left out 4 of the 6 rows, among them all 4 naming a file under the root" in said
    assert "no row of" in said and "subject_id='1000'" in said and "j.csv row 2 has subject_id='2004'" in said
    from packer.phi import Pseudonymizer

    with pytest.raises(ConfigError) as hidden:  # under phi: pseudonymize the rows are named, never a key
        discover(load_job(job), Pseudonymizer(mode="pseudonymize", dates="shift", key=b"0" * 64))
    assert "left out 4 of the 6 rows" in str(hidden.value) and "row 2 is one" in str(hidden.value)
    assert "'1000'" not in str(hidden.value) and "'2004'" not in str(hidden.value)


def test_a_join_dropping_every_row_naming_a_file_quotes_the_joined_key_as_its_table_writes_it(tmp_path: Path) -> None:
    """The joined table's key was quoted as the join compares it ('7' where the row says 7.0) while
    the message asked for keys "as this table writes them": it quotes the cell as written."""
    _files(tmp_path / "imgs", [f"a{i}.png" for i in range(4)])
    _csv(tmp_path / "t.csv", "path,subject_id,label",
         [*(f"a{i}.png,00{42 + i},cat" for i in range(4)), "b4.png,7,cat", "b5.png,8,cat"])
    _csv(tmp_path / "j.csv", "subject_id,site", ["7.0,s1", "8.0,s2", "42.0,s3"])
    job = _job(tmp_path, {"root": "imgs", "table": {
        "file": "t.csv", "join": [{"file": "j.csv", "on": "subject_id", "missing": "drop"}]},
        "entity": {"column": "subject_id"}})
    with pytest.raises(ConfigError) as caught:
        discover(load_job(job))
    said = str(caught.value)
    assert "no row of" in said and "subject_id='0042'" in said
    assert "j.csv row 2 has subject_id='7.0'" in said and "subject_id='7'" not in said


def test_rows_where_leaves_out_are_not_counted_as_the_joins(tmp_path: Path) -> None:
    """Of the four rows naming a file, a join's missing: drop left out two and where: the other two
    (rows another join does not match, which where: leaves out on the columns they have): the
    error said the join left out "all 4 naming a file". It counts the join's and says where:'s."""
    _files(tmp_path / "imgs", [f"a{i}.png" for i in range(4)])
    _csv(tmp_path / "t.csv", "path,subject_id,site_id,label",
         ["a0.png,1000,S1,cat", "a1.png,1001,S1,cat", "a2.png,2000,S2,dog", "a3.png,2001,S2,dog",
          "b4.png,2004,S1,cat"])
    _csv(tmp_path / "j.csv", "subject_id,age", ["2000,40", "2001,41", "2004,44"])
    _csv(tmp_path / "k.csv", "site_id,city", ["S1,Oslo"])
    job = _job(tmp_path, {"root": "imgs", "table": {
        "file": "t.csv", "join": [{"file": "j.csv", "on": "subject_id", "missing": "drop"},
                                  {"file": "k.csv", "on": "site_id", "missing": "bad"}]},
        "entity": {"column": "subject_id"}, "where": {"label": "cat"}})
    with pytest.raises(ConfigError) as caught:
        discover(load_job(job))
    said = str(caught.value)
    assert "all 4" not in said and "all 2" not in said
    assert "the join (missing: drop) left out 2 of the 5 rows, among them 2 of the 4 naming a file under the root " \
           "(where: left out the other 2)" in said


@pytest.mark.parametrize("on", ["image", "image_id"])
def test_a_join_key_the_tables_name_apart_says_to_name_it_alike_not_each_others_name(tmp_path: Path,
                                                                                      on: str) -> None:
    """ISIC 2018's ground truth keys its rows `image`, HAM10000's metadata `image_id`: each table's
    own did-you-mean sent the user to the other's name and back; packer joins on one name, so the
    message says so and which header to rename."""
    _files(tmp_path / "imgs", ["ISIC_0.jpg"])
    _csv(tmp_path / "gt.csv", "image,MEL,NV", ["ISIC_0,1.0,0.0"])
    _csv(tmp_path / "meta.csv", "lesion_id,image_id,dx", ["HAM_0,ISIC_0,mel"])
    job = _job(tmp_path, {"root": "imgs", "table": {"file": "gt.csv", "path": {"template": "{image}.jpg"},
                                                    "join": [{"file": "meta.csv", "on": on}]},
                          "entity": {"column": "lesion_id"},
                          "label": {"kind": "multilabel", "columns": ["MEL", "NV"]}})
    with pytest.raises(ConfigError) as caught:
        discover(load_job(job))
    message = str(caught.value)
    assert "a join's on columns are named alike in both tables" in message
    assert "rename 'image_id' to 'image'" in message or "rename 'image' to 'image_id'" in message
