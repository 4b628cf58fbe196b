"""The HTML report at the edges of its counts: a build that packed no sample at all (every input
file bad).

A report of zero samples says so where there is nothing to show, instead of an empty list after
"counted:" or a label table with a header and no rows."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from packer.cli import main
from tests.helpers import write_job


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
