"""The HTML report at the edges of its counts: a build that packed no sample at all (every input
file bad) and findings that number exactly one.

A report of zero samples says so where there is nothing to show, instead of an empty list after
"counted:" or a label table with a header and no rows; a count of one takes the singular
("1 group", not "1 groups")."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.demo import render_ct_phantom, write_ct_slice
from tests.helpers import write_job

KEY = "0123456789abcdef" * 4


def _section(page: str, ident: str) -> str:
    found = re.search(rf'<h2 id="{ident}">.*?</section>', page, flags=re.S)
    assert found is not None, f"no section {ident!r} in the report"
    return found.group(0)


@pytest.fixture(scope="module")
def zero_sample_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The report of a build labelled by folder whose three input files are all truncated PNGs."""
    tmp = tmp_path_factory.mktemp("zero-samples")
    raw = tmp / "raw" / "cats"
    raw.mkdir(parents=True)
    for i in range(3):
        (raw / f"b{i}.png").write_bytes(b"\x89PNG\r\n\x1a\nxx")
    job = write_job(tmp, {"name": "zero", "sources": [{"kind": "image", "root": str(tmp / "raw"), "label": "folder"}],
                          "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}},
                          "pack": {"format": "webdataset"}, "output": str(tmp / "out")})
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert built.exit_code == 3, built.output  # every file bad: over max_bad_fraction, kept for its report
    (report,) = (tmp / "out" / "zero").glob("*/report.html")
    return report.read_text()


def test_the_intensities_lead_of_a_build_without_samples_lists_no_empty_count(zero_sample_page: str) -> None:
    intensities = _section(zero_sample_page, "intensities")
    lead = re.search(r'<p class="lead">(.*?)</p>', intensities, flags=re.S)
    assert lead is not None, "the Intensities section has no lead"
    assert "counted:" not in lead.group(1), lead.group(1)
    assert "(the same seeded order as the contact sheets)" in lead.group(1)
    assert "under the chart" not in lead.group(1)  # no chart is drawn, so the lead does not describe one
    assert "No packed samples." in intensities


def test_the_splits_section_of_a_build_without_samples_draws_no_empty_label_balance(zero_sample_page: str) -> None:
    splits = _section(zero_sample_page, "splits")
    assert 'id="label-counts"' not in splits  # no "Samples per label and split" table with no rows
    assert '<div class="legend"></div>' not in splits
    assert "Samples per label and split" not in splits
    assert "<h3>Label balance</h3>" in splits
    assert "No labelled sample was packed, so there is no balance to show." in splits
    assert 'id="splits-table"' in splits  # the splits themselves are still listed, with their zeros


def _one_of_each_finding(tmp: Path) -> str:
    """The report of a CT build with one lookalike pair of patient ids (MRN0042, mrn0042) and one
    patient whose two slices hold the same pixels under two labels: one duplicate group, one label
    conflict, one lookalike group."""
    root, rows = tmp / "raw", ["path,label"]
    for i, patient in enumerate(["MRN0042", "mrn0042", "MRN0099", "MRN0100"]):
        for k in range(2):
            name = f"p{i}/{k}.dcm"
            same = i == 2  # MRN0099's two slices are one image
            write_ct_slice(root / name, patient_id=patient, study_date="20240105", instance_number=k + 1,
                           pixels_hu=render_ct_phantom(np.random.default_rng(10 * i + (0 if same else k)),
                                                       z=0.0 if same else k / 2))
            rows.append(f"{name},{'ab'[k]}")
    (tmp / "labels.csv").write_text("\n".join(rows) + "\n")
    doc = {"name": "one", "sources": [{"kind": "dicom", "root": str(root), "labels": str(tmp / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "seed": 1, "balance": {"accept": True},
                     "near_duplicates": {"enabled": False}},
           "transform": {"dicom": {"windows": ["lung"], "size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": str(tmp / "out")}
    (tmp / "job.yaml").write_text(yaml.safe_dump(doc))
    built = CliRunner().invoke(main, ["build", str(tmp / "job.yaml"), "--scheduler", "sync", "-q"],
                               env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp / "work")})
    assert built.exit_code == 0, built.output
    (report,) = (tmp / "out" / "one").glob("*/report.html")
    return report.read_text()


def test_a_count_of_one_finding_takes_the_singular(tmp_path: Path) -> None:
    page = _one_of_each_finding(tmp_path)
    audit = _section(page, "leakage-audit")
    assert "<strong>Findings: 1 duplicate group; 1 label conflict; 1 group of lookalike entity ids</strong>" in audit
    assert 'Duplicates <span class="muted">(1 group)</span>' in audit
    assert 'Label conflicts <span class="muted">(1 group)</span>' in audit
    assert 'Lookalike entity ids <span class="muted">(1 lookalike group, 1 across splits)</span>' in audit
    assert not re.search(r"\b1 (groups|conflicts|findings|samples|entities)\b", page)
