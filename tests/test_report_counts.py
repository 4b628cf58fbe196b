"""report.html counts each kind of audit finding from the rules' counts, not from the capped lists.

leakage.json lists the first 200 findings of a rule beside its full count (README). The report
counted the listed ones: 210 exact-duplicate groups were "Findings: 200 duplicate groups" and
"Duplicates (200 groups)", and nothing said more existed. Each total now comes from the rule's
count, and the report says how many of them are listed.
"""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.htmlreport import render_html_report
from tests.helpers import write_job

GROUPS = 210  # exact-duplicate groups the raw tree holds: over the 200 leakage.json lists


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build of 10 entities x 21 distinct images, each stored twice in its entity's folder: 210
    groups of two exact duplicates within a split."""
    tmp = tmp_path_factory.mktemp("dups")
    rng, rows = np.random.default_rng(11), []
    for e in range(10):
        (tmp / "raw" / f"e{e}").mkdir(parents=True)
        for j in range(21):
            pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
            for c in range(2):
                rel = f"e{e}/x{j}_{c}.png"
                cv2.imwrite(str(tmp / "raw" / rel), pixels)
                rows.append([rel, "a", f"E{e}", "2024-01-01"])
    with open(tmp / "raw" / "t.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["path", "label", "entity", "timestamp"], *rows])
    job = write_job(tmp, {"name": "dupcount", "sources": [{"kind": "image", "root": str(tmp / "raw"),
                                                           "table": str(tmp / "raw" / "t.csv")}],
                          "split": {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 2,
                                    "balance": {"accept": True}},
                          "transform": {"image": {"size": [8, 8], "color": "gray"}},
                          "pack": {"format": "parquet"}, "output": str(tmp / "out")})
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert built.exit_code == 0, built.output
    (folder,) = (tmp / "out" / "dupcount").glob("*/")
    return folder


def _headline(text: str) -> str:
    found = re.search(r'id="leakage-status"><strong>(.*?)</strong>', text)
    assert found is not None
    return found.group(1)


def test_the_report_counts_every_duplicate_group_and_says_the_first_200_are_listed(version: Path) -> None:
    rule = json.loads((version / "leakage.json").read_text())["rules"]["exact_duplicates_within_split"]
    assert (rule["count"], len(rule["findings"])) == (GROUPS, 200)
    text = (version / "report.html").read_text()
    assert _headline(text) == f"Findings: {GROUPS} duplicate groups (first 200 listed)"
    assert f'<h3>Duplicates <span class="muted">({GROUPS} groups; first 200 listed)</span></h3>' in text
    assert (f"{GROUPS - 200} more groups not listed (leakage.json lists the first 200 of {GROUPS}, and counts them "
            "all).") in text


def _planted(version: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((version / "manifest.json").read_text())
    listed = json.loads((version / "leakage.json").read_text())["rules"]
    planted = copy.deepcopy(manifest)
    for name, rule in planted["audit"]["rules"].items():  # the findings in the manifest: read as they are
        rule.setdefault("findings", listed.get(name, {}).get("findings", []))
    return planted


def test_entities_in_two_splits_are_counted_from_the_rule_not_from_the_200_listed(version: Path) -> None:
    planted = _planted(version)
    planted["audit"]["rules"]["entity_overlap"] = {
        "severity": "report", "count": 230, "passed": False,
        "findings": [{"entity_id": f"P{i:03d}", "splits": ["train", "test"]} for i in range(200)]}
    text = render_html_report(version, manifest=planted)
    assert _headline(text).startswith("Findings: 230 entities in more than one split (first 200 listed); ")
    assert "30 more entities not listed (leakage.json lists the first 200 of 230, and counts them all)." in text


def test_groups_of_two_rules_one_of_them_listed_in_part_are_counted_as_at_least_the_larger(version: Path) -> None:
    """A pair two rules find is one group, so where one rule's list is cut the report cannot know
    how many of its unlisted pairs the other rule found too: it says at least as many as either."""
    planted = _planted(version)
    within = planted["audit"]["rules"]["exact_duplicates_within_split"]["findings"]
    planted["audit"]["rules"]["duplicates_span_entities"] = {
        "severity": "report", "count": 3, "passed": False, "findings": within[:3]}  # groups both rules found
    text = render_html_report(version, manifest=planted)
    assert _headline(text) == f"Findings: at least {GROUPS} duplicate groups (first 200 listed)"
    assert f'<h3>Duplicates <span class="muted">(at least {GROUPS} groups; first 200 listed)</span></h3>' in text
