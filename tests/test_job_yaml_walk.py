"""A job file as people and tools write it: JSON's escapes, YAML's words, settings that only
act in some splits, numbers that look like labels. Each test loads a real job file."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest

from packer.badsamples import read_bad_samples
from packer.config import SplitConfig, load_job
from packer.errors import ConfigError
from packer.files import canonical_json
from packer.pipeline.build import BuildOptions, build
from tests.test_config import MINIMAL
from tests.test_time_split import CUTOFFS, build_job, photo, write_tree


def write_json_job(folder: Path, doc: dict) -> Path:
    """The job as Python's json.dump writes it: ASCII only, a character outside the BMP as two
    escaped UTF-16 halves."""
    path = folder / "job.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def test_a_json_escaped_surrogate_pair_is_the_one_character_it_stands_for(tmp_path: Path) -> None:
    path = write_json_job(tmp_path, {**MINIMAL, "labels": ["\U00020BB7cat", "dog"],
                                     "sources": [{**MINIMAL["sources"][0], "where": {"site": "\U0001F600"}}]})
    assert "\\ud842\\udfb7cat" in path.read_text()  # the file holds the two halves
    job = load_job(path)
    assert job.labels == ("\U00020BB7cat", "dog")
    assert "\U0001F600" in json.dumps(job.sources[0].to_json(), ensure_ascii=False)
    canonical_json(job.identity())  # the job hashes: no half of a pair is left to refuse UTF-8


def test_a_json_escaped_surrogate_pair_in_a_key_is_the_one_character(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**MINIMAL, "sources": [{**MINIMAL["sources"][0], "where": {"\U0001F600": "a"}}]}))
    assert "\\ud83d" in path.read_text()
    assert load_job(path).sources[0].to_json()["where"] == {"\U0001F600": "a"}


@pytest.mark.parametrize(("text", "where"), [
    ('"labels": ["\\ud83dcat", "dog"]', "labels[0]"),
    ('"labels": ["cat", "dog\\ude00"]', "labels[1]"),
    ('"sources": [{"kind": "image", "root": "raw", "where": {"\\ud83d": "a"}}]', "sources[0].where"),
])
def test_half_a_surrogate_pair_is_a_config_error_naming_the_field(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({k: v for k, v in MINIMAL.items() if k not in text})[:-1] + ", " + text + "}")
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {where}")
    assert "surrogate" in message and "half" in message
    assert "the character itself" in message  # the fix


JOB_YAML = """name: t
sources:
  - kind: image
    root: raw
    table: raw/labels.csv{source}
split:
  by: entity
  seed: 3{split}
pack:
  format: webdataset
output: out
{top}"""


def load_error(tmp_path: Path, *, source: str = "", split: str = "", top: str = "", name: str = "t",
               by: str = "entity") -> str:
    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML.format(source=source, split=split, top=top).replace("name: t\n", f"name: {name}\n")
                    .replace("by: entity", f"by: {by}"))
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    return str(caught.value).removeprefix(f"{path}: ")


def test_an_expected_boolean_in_a_load_error_is_spelled_as_the_job_file_spells_it(tmp_path: Path) -> None:
    # YAML 1.2: yes is a word; the message lists what the key takes as the job would write it
    message = load_error(tmp_path, split="\n  near_duplicates: {enabled: yes}")
    assert message.startswith("split.near_duplicates.enabled: 'yes' is not one of [true, false, 'auto']")
    message = load_error(tmp_path, source="\n    label: {folder: yes}")
    assert "sources[0].label.folder: true was expected" in message
    assert "True" not in message.split(". ")[0]


def test_a_null_key_is_named_null_and_an_empty_key_as_quotes(tmp_path: Path) -> None:
    assert load_error(tmp_path, top="null: 1\n").startswith("null: unknown key (the keys allowed at the top level")
    assert load_error(tmp_path, top="'': 1\n").startswith("'': unknown key (the keys allowed at the top level")
    assert load_error(tmp_path, split="\n  '': 1").startswith("split.'': unknown key")


@pytest.mark.parametrize("written", ["007", "7", "2024", "1.5"])
def test_a_number_where_text_is_due_says_to_quote_it(tmp_path: Path, written: str) -> None:
    message = load_error(tmp_path, name=written)
    assert message.startswith(f"name: {float(written):g} is not of type 'string'")
    # the number as read (7 for 007): the message cannot see the file's text, so it says to keep the zeros
    said = f"{float(written):g}"
    padded = f", or name: '0{said}' for 0{said}" if "." not in written else ""
    assert f"(YAML reads an unquoted number as a number: quote the text as the file writes it, name: '{said}'" \
        f"{padded}; leading zeros are kept only in quotes)" in message


def split_error(tmp_path: Path, split: str, by: str = "entity") -> str:
    (tmp_path / "pins.csv").write_text("entity,split\nP1,test\n")
    return load_error(tmp_path, split=split, by=by)


def test_a_balance_tolerance_under_a_time_split_is_a_config_error_not_a_setting_ignored(tmp_path: Path) -> None:
    # the dates decide a time split's shares: no ratio is asked, so nothing is held to a tolerance
    message = split_error(tmp_path, "\n  cutoffs: {valid: 2024-03-01, test: 2024-06-01}\n  balance: {tolerance: 0.01}",
                          by="time")
    assert message.startswith("split.balance.tolerance: ")
    assert "by: time" in message and "remove balance.tolerance" in message


def test_a_balance_tolerance_beside_a_pinned_table_is_a_config_error_not_a_setting_ignored(tmp_path: Path) -> None:
    message = split_error(tmp_path, "\n  pinned: pins.csv\n  balance: {tolerance: 0.01}")
    assert message.startswith("split.balance.tolerance: ")
    assert "pinned" in message and "remove balance.tolerance" in message


def _split_loaded(tmp_path: Path, balance: str, by: str = "entity") -> SplitConfig:
    """The split of a job with ``balance`` beside a pinned table (by: entity) or under by: time."""
    (tmp_path / "pins.csv").write_text("entity,split\nP1,test\n")
    path = tmp_path / "job.yaml"
    split = (f"\n  pinned: pins.csv\n  balance: {balance}" if by == "entity" else
             f"\n  cutoffs: {{valid: 2024-03-01, test: 2024-06-01}}\n  balance: {balance}")
    path.write_text(JOB_YAML.format(source="", top="", split=split).replace("by: entity", f"by: {by}"))
    return load_job(path).split


def test_the_balance_settings_a_time_split_or_a_pinned_table_applies_still_load(tmp_path: Path) -> None:
    assert _split_loaded(tmp_path, "{max_group_share: 0.3, accept: true}").max_group_share == 0.3
    assert _split_loaded(tmp_path, "{max_group_share: 0.3}", by="time").max_group_share == 0.3


def test_the_default_tolerance_written_out_beside_a_pinned_table_or_a_time_split_still_loads(tmp_path: Path) -> None:
    # README's split example writes balance: {tolerance: 0.05, ...} beside an optional pinned table: the
    # default written out asks for nothing that would be ignored, so the job loads as it did
    assert _split_loaded(tmp_path, "{tolerance: 0.05, max_group_share: 0.2, accept: false}").max_group_share == 0.2
    assert _split_loaded(tmp_path, "{tolerance: 0.05}", by="time").by == "time"


def test_a_time_split_audit_records_no_tolerance_it_never_applied(tmp_path: Path) -> None:
    write_tree(tmp_path, [("A", "2023-02-01"), ("B", "2024-02-01"), ("C", "2024-08-01")])
    result = build_job(tmp_path, {"by": "time", "cutoffs": CUTOFFS})
    balance = json.loads((result.version_dir / "leakage.json").read_text())["rules"]["split_balance"]
    assert "tolerance" not in balance
    assert balance["max_group_share"] == 0.2  # the group share is checked in every split packer makes


def test_labels_written_as_zero_padded_numbers_say_yaml_read_them_as_numbers_and_to_quote_them(
        tmp_path: Path) -> None:
    # YAML 1.2 reads the unquoted 01 as the number 1, whose label is the text "1" (a class id written
    # as a number is its text, on purpose): the cells 01 and 02 match no label, and the message says why
    raw = tmp_path / "raw"
    rows = ["path,label,entity"]
    for i in range(4):
        (raw / f"P{i}").mkdir(parents=True)
        assert cv2.imwrite(str(raw / f"P{i}" / "img.png"), photo(i))
        rows.append(f"P{i}/img.png,0{1 + i % 2},P{i}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML.format(source="", split="", top="labels: [01, 02]\nvalidate: {max_bad_fraction: 1.0}\n"))
    job = load_job(path)
    assert job.labels == ("1", "2")
    result = build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert [b["reason"] for b in bad] == ["unknown_label"] * 4
    said = next(b["message"] for b in bad if "'01'" in b["message"])
    assert "'01' is not in the job's labels (1, 2)" in said
    assert "the job's labels list 1, which YAML reads from an unquoted 01: quote them, labels: ['01', '02']" in said


def test_a_job_indented_with_tabs_is_told_to_indent_with_spaces(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(MINIMAL, indent="\t"))
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    message = str(caught.value)
    assert "found character '\\t' that cannot start any token" in message and "line 2" in message
    assert message.endswith("indent with spaces (YAML does not allow tabs)")


def test_a_root_whose_name_is_not_utf8_is_told_to_be_renamed_not_blamed_on_json(tmp_path: Path) -> None:
    # Python holds the Latin-1 byte 0xE9 of a folder name as the lone half \udce9 (PEP 383): the
    # check for JSON's lone surrogates caught it and spoke only of writing both halves of a pair
    import os

    from packer import api

    root = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9"))
    os.makedirs(os.fsencode(str(root)) + b"/cat")
    doc = {"name": "t", "sources": [{"kind": "image", "root": root, "label": "folder"}],
           "split": {"by": "entity", "seed": 3}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    with pytest.raises(ConfigError) as caught:
        api.load(doc)
    assert "the byte 0xE9 of a file or folder name that is not UTF-8 text" in str(caught.value)
    assert "rename it in UTF-8" in str(caught.value)


def test_a_negative_number_where_text_is_due_gets_no_padded_spelling(tmp_path: Path) -> None:
    message = load_error(tmp_path, name="-7")
    assert "quote the text as the file writes it, name: '-7'; leading zeros" in message
    assert "0-7" not in message
