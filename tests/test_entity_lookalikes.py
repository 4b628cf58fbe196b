"""One patient under two ids that differ only in case, spacing or leading zeros (``MRN0042`` and
``mrn0042``, ``0045`` and ``45``: two systems exporting one record number) is split as two
entities, and may land in two splits. packer cannot know they are one patient, so it does not
merge them; it reports them (``entity_lookalikes`` in the audit) and warns, naming them by
pseudonym and sample key, never by raw id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.demo import render_ct_phantom, write_ct_slice
from packer.phi import Pseudonymizer

KEY = "0123456789abcdef" * 4
#: two lookalike pairs, a lone id, and two unrelated ids that merely look alike to a person
IDS = ["MRN0042", "mrn0042", "0045", "45", "MRN0099", "MRN0100", "MRN0101"]


def ct_job(tmp_path: Path) -> Path:
    root = tmp_path / "raw"
    rows = ["path,label"]
    for i, patient in enumerate(IDS):
        for k in range(2):
            name = f"p{i}/{k}.dcm"
            write_ct_slice(root / name, patient_id=patient, study_date="20240105", instance_number=k + 1,
                           pixels_hu=render_ct_phantom(np.random.default_rng(10 * i + k), z=k / 2))
            rows.append(f"{name},{'ab'[k]}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    return write_job(tmp_path, root)


def write_job(tmp_path: Path, root: Path, ratios: dict[str, float] | None = None) -> Path:
    """The job over ``root`` and ``tmp_path/labels.csv``, split by entity."""
    doc: dict[str, Any] = {
        "name": "twins",
        "sources": [{"kind": "dicom", "root": str(root), "labels": str(tmp_path / "labels.csv")}],
        "split": {"by": "entity", "ratios": ratios or {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1,
                  "balance": {"accept": True}, "near_duplicates": {"enabled": False}},
        "transform": {"dicom": {"windows": ["lung"], "size": [16, 16]}},
        "pack": {"format": "webdataset", "max_samples": 8},
        "output": str(tmp_path / "out"),
    }
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def test_ids_equal_but_for_case_spacing_or_leading_zeros_are_reported_by_pseudonym(tmp_path: Path) -> None:
    job = ct_job(tmp_path)
    report = tmp_path / "v.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(report)],
                                env={"PACKER_PHI_KEY": KEY})
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    rule = doc["audit"]["rules"]["entity_lookalikes"]
    assert rule["severity"] == "report" and rule["count"] == 2
    phi = Pseudonymizer(mode="pseudonymize", dates="shift", key=KEY.encode())
    groups = sorted(sorted(e["entity_id"] for e in finding["entities"]) for finding in rule["findings"])
    assert groups == sorted([sorted([phi.entity("MRN0042"), phi.entity("mrn0042")]),
                             sorted([phi.entity("0045"), phi.entity("45")])])
    for finding in rule["findings"]:  # each entity with its splits and a key packer locate maps to a file
        assert all(e["splits"] and e["key"].startswith("raw-") for e in finding["entities"])
    warning = next(w["message"] for w in doc["warnings"] if "case, spacing or leading zeros" in w["message"])
    assert "entity_lookalikes" in warning
    assert "pin each group to one split with split.pinned" in warning  # by: entity takes a pin
    text = result.output + json.dumps(doc)
    assert not any(raw in text for raw in ("MRN0042", "mrn0042", "MRN0099", "'45'", "0045"))


def test_a_build_records_lookalikes_in_leakage_json_the_manifest_and_its_output(tmp_path: Path) -> None:
    job = ct_job(tmp_path)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"],
                                env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 0, result.output
    version = next((tmp_path / "out" / "twins").glob("*/manifest.json")).parent
    leakage = json.loads((version / "leakage.json").read_text())
    assert leakage["rules"]["entity_lookalikes"]["count"] == 2
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["audit"]["rules"]["entity_lookalikes"]["count"] == 2
    assert "case, spacing or leading zeros" in result.output


def test_unrelated_ids_are_not_lookalikes() -> None:
    from packer.phi import entity_form

    assert entity_form("MRN0042") == entity_form(" mrn 42") == entity_form("MRN00042")
    assert entity_form("0045") == entity_form("45")
    # a space ends a run of digits: "2024 0042" is "2024 42" (it was 20240042 against 202442)
    assert entity_form("2024 0042") == entity_form("2024 42") == entity_form("2024 042")
    assert len({entity_form(e) for e in ("MRN0099", "MRN0100", "MRN0101", "450", "4.5", "MRN-42")}) == 6


def test_ids_that_differ_only_in_bytes_their_character_set_cannot_decode_are_two_entities(tmp_path: Path) -> None:
    """Under (0008,0005) ISO_IR 192 (UTF-8), PatientIDs MRN<FF>01 and MRN<FE>01 are not UTF-8;
    pydicom reads both as 'MRN\ufffd01', which made two patients one entity. They are two, named
    by pseudonym only, and the build says which files hold such ids (by tag, never by value)."""
    root = tmp_path / "raw"
    rows = ["path,label"]
    for i, raw in enumerate([b"MRN\xff01", b"MRN\xfe01", "Müller".encode()]):
        for k in range(2):
            name = f"p{i}/{k}.dcm"
            write_ct_slice(root / name, patient_id="placeholder", study_date="20240105", instance_number=k + 1,
                           pixels_hu=render_ct_phantom(np.random.default_rng(10 * i + k), z=k / 2),
                           SpecificCharacterSet="ISO_IR 192", PatientID=raw)
            assert raw in (root / name).read_bytes()
            rows.append(f"{name},{'ab'[k]}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    job = write_job(tmp_path, root, {"train": 0.34, "valid": 0.33, "test": 0.33})
    report = tmp_path / "v.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(report)],
                                env={"PACKER_PHI_KEY": KEY})
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    assert sum(split["entities"] for split in doc["splits"].values()) == 3
    assert sum(split["samples"] for split in doc["splits"].values()) == 6
    warning = next(w["message"] for w in doc["warnings"] if "reader's warning" in w["message"])
    assert "4 file(s)" in warning and "(0010,0020) PatientID" in warning
    text = result.output + json.dumps(doc)
    assert "MRN" not in text and "Müller" not in text


def test_the_report_lists_each_lookalike_group_with_its_entities_splits_and_sample_keys(tmp_path: Path) -> None:
    """README: the lookalike groups are listed in leakage.json, packer validate and the report,
    each entity with its splits and a sample key. The report counted them ("2 findings counted")
    and listed none."""
    import re

    from packer.htmlreport import render_html_report

    job = ct_job(tmp_path)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"],
                                env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 0, result.output
    version = next((tmp_path / "out" / "twins").glob("*/manifest.json")).parent
    findings = json.loads((version / "leakage.json").read_text())["rules"]["entity_lookalikes"]["findings"]
    text = render_html_report(version, quiet=True)
    table = re.search(r'<table id="entity-lookalikes".*?</table>', text, flags=re.S)
    assert table is not None, "no entity-lookalikes table"
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr data-group.*?</tr>", table.group(0))]
    listed = [(r[1], r[2], r[3]) for r in rows]  # entity_id, splits, sample key
    expected = [(e["entity_id"], " + ".join(e["splits"]), e["key"]) for f in findings for e in f["entities"]]
    assert listed == expected
    crossing = sum(f["across_splits"] for f in findings)
    assert f"{len(findings)} lookalike groups" in text and f"{crossing} across splits" in text
    assert not any(re.search(rf"\b{raw}\b", text) for raw in ("MRN0042", "mrn0042", "MRN0099", "0045"))


def test_the_lookalike_warning_offers_only_what_the_split_takes() -> None:
    """A time split refuses a pin its dates contradict (a lookalike pair across its splits has
    records in two periods) and a given split takes no pin at all: the warning offered
    split.pinned there too, and following it failed with exit 2."""
    from packer.pipeline.audit import LOOKALIKE_OTHER_FIX, lookalikes_warning

    class Rule:
        count = 1
        findings = ({"across_splits": True,
                     "entities": [{"entity_id": "MRN0042", "splits": ["train"], "path": "a.png"},
                                  {"entity_id": "mrn42", "splits": ["test"], "path": "b.png"}]},)

    class Report:
        def rule(self, name: str) -> Rule:
            return Rule()

    said = {by: lookalikes_warning(Report(), "leakage.json", by) for by in ("entity", "time", "list", "column")}
    assert "pin each group to one split with split.pinned" in said["entity"]
    assert all("pin each group" not in said[by] for by in ("time", "list", "column")), said
    assert "list every file of the group in one split's list" in said["list"]
    assert set(LOOKALIKE_OTHER_FIX) == {"entity", "time", "list", "column"}

