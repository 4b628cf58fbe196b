"""Data check: ``packer validate`` — discover, read, split and audit a job without packing.

Made for CI: it decodes every file (unless ``quick``), applies the job's split, runs every
audit rule, and reports as a human summary, a JSON document (``schemas/validate.schema.json``)
and JUnit XML (one test case per rule). Exit codes follow ``packer build``: 0 clean, 3 bad
fraction over threshold, 4 leakage.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from packer import __version__
from packer.config import SPLITS, JobConfig
from packer.errors import BadFractionError, LeakageError
from packer.execute import open_executor
from packer.pack.writer import atomic_output
from packer.prepare import Prepared, prepare
from packer.report import summarize_issues
from packer.schemas import validate_document

#: Bad-sample records and findings listed per JUnit failure.
MAX_LISTED = 50


@dataclass(frozen=True)
class ValidateResult:
    job: JobConfig
    prepared: Prepared
    quick: bool

    @property
    def bad(self) -> dict[str, Any]:
        return summarize_issues(self.prepared.issues, inputs=self.prepared.inputs,
                                max_fraction=self.job.max_bad_fraction)

    @property
    def exit_code(self) -> int:
        if self.prepared.audit.failed:
            return LeakageError.exit_code
        if self.bad["fraction"] > self.job.max_bad_fraction:
            return BadFractionError.exit_code
        return 0


def validate_job(job: JobConfig, *, quick: bool = False, workers: int | None = None, scheduler: str | None = None,
                 quiet: bool = False, storage_options: dict[str, Any] | None = None) -> ValidateResult:
    """Run discover → read/validate → split → audit on ``job``; write nothing. ``storage_options``
    configure the stores of sources given as URLs."""
    with open_executor(scheduler, workers) as executor:
        prepared = prepare(job, executor, cache_dir=None, decode=not quick, quiet=quiet,
                           storage_options=storage_options)
    return ValidateResult(job=job, prepared=prepared, quick=quick)


def summary(result: ValidateResult) -> dict[str, Any]:
    """The machine-readable report (validated against ``schemas/validate.schema.json``)."""
    prepared = result.prepared
    per_split = {split: {"samples": 0, "entities": 0} for split in SPLITS}
    entities: dict[str, set[str]] = {split: set() for split in SPLITS}
    split_of = prepared.assignment.split
    for key, entity in zip(prepared.samples.column("key"), prepared.samples.column("entity"), strict=True):
        split = split_of[key]
        per_split[split]["samples"] += 1
        entities[split].add(entity or "")
    for split in SPLITS:
        per_split[split]["entities"] = len(entities[split])
    doc = {
        "packer_version": __version__,
        "job": str(result.job.job_path),
        "name": result.job.name,
        "quick": result.quick,
        "passed": result.exit_code == 0,
        "exit_code": result.exit_code,
        "inputs": {"files": prepared.inputs, "samples": len(prepared.samples)},
        "splits": per_split,
        "bad_samples": {**result.bad, "records": [i.to_json() for i in prepared.issues[:1000]]},
        "audit": prepared.audit.to_json(listed=True),
    }
    validate_document(doc, "validate", source="packer validate --json")
    return doc


def format_summary(result: ValidateResult) -> str:
    """A short human summary: counts by reason, per split, failing and reporting rules."""
    doc = summary(result)
    bad = doc["bad_samples"]
    lines = [f"packer validate {doc['name']}: {doc['inputs']['files']} files, {doc['inputs']['samples']} samples"
             + (" (headers only: --quick)" if result.quick else "")]
    lines.append("  " + "  ".join(f"{s} {v['samples']} samples/{v['entities']} entities"
                                  for s, v in doc["splits"].items()))
    reasons = ", ".join(f"{k} {v}" for k, v in bad["by_reason"].items()) or "none"
    verdict = "over" if bad["fraction"] > bad["max_fraction"] else "within"
    lines.append(f"  bad samples: {bad['total']} ({bad['fraction']:.1%}, {verdict} limit {bad['max_fraction']:.1%}): "
                 f"{reasons}")
    for issue in result.prepared.issues[:5]:
        lines.append(f"    {issue.reason:<22} {issue.path}")
    for name, rule in doc["audit"]["rules"].items():
        state = "ok" if rule["passed"] else ("FAIL" if rule["severity"] == "fail" else "note")
        lines.append(f"  [{state:>4}] {name}: {rule['count']}")
        for finding in rule.get("findings", [])[:3] if not rule["passed"] else []:
            lines.append(f"         {json.dumps(finding, sort_keys=True)[:160]}")
    lines.append("  result: " + {0: "clean", 3: "too many bad samples (exit 3)", 4: "leakage found (exit 4)"}
                 [result.exit_code])
    return "\n".join(lines)


def write_json(result: ValidateResult, path: Path) -> None:
    with atomic_output(path) as fh:
        fh.write(json.dumps(summary(result), indent=2, sort_keys=True).encode() + b"\n")


def write_junit(result: ValidateResult, path: Path) -> None:
    """JUnit XML: a ``bad_fraction`` case plus one case per audit rule; failures list samples."""
    doc = summary(result)
    suite = ET.Element("testsuite", name=f"packer validate {doc['name']}")
    cases = 0
    failures = 0

    def case(name: str, failed: bool, message: str, body: str) -> None:
        nonlocal cases, failures
        cases += 1
        element = ET.SubElement(suite, "testcase", classname=f"packer.validate.{doc['name']}", name=name)
        if failed:
            failures += 1
            ET.SubElement(element, "failure", message=message).text = body
        elif body:
            ET.SubElement(element, "system-out").text = body

    bad = doc["bad_samples"]
    listed = "\n".join(f"{r['reason']}: {r['path']}: {r['message']}" for r in bad["records"][:MAX_LISTED])
    case("bad_fraction", bad["fraction"] > bad["max_fraction"],
         f"{bad['total']} bad of {doc['inputs']['files']} files ({bad['fraction']:.1%} > {bad['max_fraction']:.1%})",
         listed)
    for name, rule in doc["audit"]["rules"].items():
        body = "\n".join(json.dumps(f, sort_keys=True) for f in rule.get("findings", [])[:MAX_LISTED])
        case(name, rule["severity"] == "fail" and not rule["passed"], f"{rule['count']} finding(s)", body)
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    counts = Counter(i.reason for i in result.prepared.issues)
    suite.set("skipped", "0")
    ET.SubElement(suite, "properties").extend(
        [ET.Element("property", name=f"bad.{k}", value=str(v)) for k, v in sorted(counts.items())])
    with atomic_output(path) as fh:
        fh.write(ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n")
