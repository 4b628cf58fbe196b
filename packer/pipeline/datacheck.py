"""Data check: ``packer validate`` — discover, read, split and audit a job without packing.

Made for CI: it decodes every file (unless ``quick``), applies the job's split, runs every
audit rule, and reports as a human summary, a JSON document (``schemas/validate.schema.json``)
and JUnit XML (one test case per rule). Exit codes follow ``packer build``: 0 clean, 3 bad
fraction over threshold, 4 leakage.

Warnings do not change the exit code: a split the job asked samples for that got none
(:func:`~packer.pipeline.split.empty_splits`, also printed by ``packer build``) is listed in all three outputs, and
the check still passes.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import stat
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import numpy as np

from packer import __version__
from packer.badsamples import over_limit, summarize_issues
from packer.config import MAPPING_JOB, SPLITS, JobConfig
from packer.errors import (
    BadFractionError,
    ConfigError,
    FileSystemError,
    LeakageError,
    blocking_file,
    refused_write,
    surface,
)
from packer.exclusions import describe_counts, exclusion_counts
from packer.files import atomic_output
from packer.phi import unused_key_warning
from packer.pipeline.audit import QUICK_OFF, finding_text
from packer.pipeline.cluster import open_executor
from packer.pipeline.split import empty_splits, split_codes
from packer.pipeline.stages import Prepared, run_stages
from packer.read.kinds import source_libraries
from packer.records import Excluded, Issue
from packer.schemas import validate_document

#: Bad-sample records and findings listed per JUnit failure.
MAX_LISTED = 50
#: Bad-sample paths and findings per rule listed in the human summary.
SUMMARY_ISSUES = 5
SUMMARY_FINDINGS = 3

#: The audit rules ``--quick`` cannot run: they compare pixel hashes and near-copy signatures,
#: which a headers-only pass does not make. Each is reported as skipped, never as passed.
QUICK_NOT_RUN = ("exact_duplicates_across_splits", "exact_duplicates_within_split", "near_duplicates_across_splits",
                 "duplicates_span_entities", "label_conflicts")
#: How a rule a headers-only check could not run begins (:func:`quick_skipped`)
QUICK_SKIPPED = "not run: headers only"
#: How ``split_balance`` begins where a headers-only check judged it without duplicate links
#: (:func:`quick_partial`): it fails on what it sees, and never passes on it
QUICK_PARTIAL = "partly run: headers only"


def quick_skipped() -> str:
    """What a rule a headers-only check cannot run says, naming the option as the caller gives
    it (``--quick`` on the command line, ``quick=True`` in the Python API)."""
    return (f"{QUICK_SKIPPED} ({surface().option('quick')}), so no pixels are hashed or compared; "
            f"{_without_quick()} to check copies across splits")


def quick_partial() -> str:
    """What ``split_balance`` says where a headers-only check found no collapse: its split groups
    join entities by ids alone, while the build also joins those that share copies of one image
    (duplicate links, which need pixels), so a group those links would form is unseen."""
    return (f"{QUICK_PARTIAL} ({surface().option('quick')}), so split groups join entities by their ids alone, "
            "without the duplicate links (copies of one image under several entities) that can join them into "
            f"one group over split.balance.max_group_share; {_without_quick()} to check the groups they form")


def _links_matter(job: JobConfig) -> bool:
    """Whether duplicate links can change ``split_balance``'s verdict: a split the job places (not
    given) into more than one split."""
    return not job.split.given and sum(1 for _, ratio in job.split.ratios if ratio > 0) > 1


def _without_quick() -> str:
    """How to run the full check, as the caller would."""
    return "call packer.validate(..., quick=False)" if surface().python else "run packer validate without --quick"


def off_skipped(auto: bool) -> str:
    """Why the near-copy rule did not run in a full check: the job turned the check off
    (``split.near_duplicates.enabled: false``), or ``auto`` found one split."""
    if auto:
        return ("not run: one split, so no copy can leak across splits (split.near_duplicates.enabled: auto); "
                "set it to true to search near copies anyway")
    return ("not run: split.near_duplicates.enabled is false, so no near copies are searched; "
            "set it to auto or true to check them")


def _cut(total: int, limit: int) -> int:
    """How many of ``total`` entries a list of at most ``limit`` shows: all of them where one
    more line would only say "… and 1 more"."""
    return total if total <= limit + 1 else limit


def _each_reason_first(issues: Sequence[Issue], limit: int) -> list[Issue]:
    """The bad samples a summary of at most ``limit`` lines (:func:`_cut`) shows: the first of
    each reason code before any second of one (so a lone ``annotation_orphan`` is not hidden
    behind a run of ``contour_off_slice``), in the report's order."""
    count = _cut(len(issues), limit)
    if count == len(issues):
        return list(issues)
    firsts: dict[str, int] = {}
    for n, issue in enumerate(issues):
        firsts.setdefault(issue.reason, n)
    chosen = set(sorted(firsts.values())[:count])
    for n in range(len(issues)):
        if len(chosen) >= count:
            break
        chosen.add(n)
    return [issues[n] for n in sorted(chosen)]


def _and_more(total: int, limit: int, indent: str = "") -> list[str]:
    """The line that says a list of ``total`` entries was cut (:func:`_cut` of ``limit``), if it was."""
    listed = _cut(total, limit)
    return [f"{indent}… and {total - listed} more"] if total > listed else []


@dataclass(frozen=True)
class ValidateResult:
    job: JobConfig
    prepared: Prepared
    quick: bool
    #: when the check started (UTC) and its wall seconds: the JUnit suite's ``timestamp`` and ``time``
    started: datetime | None = None
    seconds: float = 0.0
    #: (code, message) of what the check warned of before the stages ran (a ``phi.key_file`` that
    #: ``phi.mode: keep`` does not use), listed with the stages' own in ``--json``
    warnings: tuple[tuple[str, str], ...] = ()

    @property
    def bad(self) -> dict[str, Any]:
        return summarize_issues(self.prepared.issues, inputs=self.prepared.considered,
                                max_fraction=self.job.max_bad_fraction)

    @property
    def exit_code(self) -> int:
        if self.prepared.audit.failed:
            return LeakageError.exit_code
        if over_limit(self.bad, self.prepared.considered):
            return BadFractionError.exit_code
        return 0


def validate_job(job: JobConfig, *, quick: bool = False, workers: int | None = None, scheduler: str | None = None,
                 quiet: bool = False, storage_options: dict[str, Any] | None = None) -> ValidateResult:
    """Run discover → read/validate → split → audit on ``job``; write nothing. ``storage_options``
    configure the stores of sources given as URLs."""
    started, clock = datetime.now(UTC), time.perf_counter()
    unused_key = unused_key_warning(job.phi)
    warned = (("phi", unused_key),) if unused_key is not None else ()
    for _, message in warned:  # a warning, not progress: printed under --quiet too, as packer build does
        print(f"packer: warning: {message}", file=sys.stderr, flush=True)
    with open_executor(scheduler, workers, source_libraries(job.sources),
                       private=job.phi.mode == "pseudonymize") as executor:
        run = run_stages(job, executor, through="audit", cache_dir=None, decode=not quick, quiet=quiet,
                         storage_options=storage_options)
    return ValidateResult(job=job, prepared=run.prepared, quick=quick, started=started,
                          seconds=time.perf_counter() - clock, warnings=warned)


def summary(result: ValidateResult) -> dict[str, Any]:
    """The machine-readable report (validated against ``schemas/validate.schema.json``)."""
    prepared = result.prepared
    per_split = {split: {"samples": 0, "entities": 0} for split in SPLITS}
    entities: dict[str, set[str]] = {split: set() for split in SPLITS}
    codes = split_codes(prepared.samples, prepared.assignment.split)
    entity_codes, entity_of = prepared.samples.codes("entity")
    if (codes < 0).any():  # every packed sample has a split
        raise KeyError(prepared.samples.value("key", int(np.flatnonzero(codes < 0)[0])))
    for code, count in enumerate(np.bincount(codes.astype(np.int64), minlength=len(SPLITS)).tolist()):
        per_split[SPLITS[code]]["samples"] = count
    for pair in np.unique(entity_codes.astype(np.int64) * 4 + codes).tolist():
        entities[SPLITS[pair % 4]].add(entity_of[pair // 4] or "")
    for split in SPLITS:
        per_split[split]["entities"] = len(entities[split])
    audit = prepared.audit.to_json(listed=True)
    if result.quick:  # what a headers-only pass cannot see is said, not passed
        for name in QUICK_NOT_RUN:
            if name in audit["rules"]:
                audit["rules"][name].update(skipped=quick_skipped(), passed=None)
        balance = audit["rules"].get("split_balance")
        if balance is not None and balance["passed"] and _links_matter(result.job):  # a failure it sees stands
            balance.update(skipped=quick_partial(), passed=None)
    else:  # a rule the job turned off (near copies: its detail says why) is said, not passed
        for rule in audit["rules"].values():
            if "off" in rule:
                rule.update(skipped=off_skipped(result.job.split.near_auto), passed=None)
    if surface().python:  # the rules' recorded details name the command's flag; the call's option here
        for rule in audit["rules"].values():
            for key in ("off", "near_copies"):
                if isinstance(rule.get(key), str):
                    rule[key] = rule[key].replace(QUICK_OFF, "packer.validate(quick=True) (headers only)")
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
        "excluded": _excluded_summary(prepared),
        "audit": audit,
        "warnings": [*({"code": code, "message": message} for code, message in result.warnings),
                     *(w.to_json() for w in empty_splits(result.job.split.to_json(), per_split)),
                     *({"code": code, "message": message} for code, message in prepared.warnings),
                     *_sample_schema_warnings(result)],
    }
    validate_document(doc, "validate", source="packer validate --json")
    return doc


#: The warnings of the samples' shapes and dtypes, which the build prints under its summary (from the
#: manifest's sample_schema) and packer validate in its own, never while the stages run.
SAMPLE_SCHEMA_WARNINGS = ("several_shapes", "several_dtypes")


def _sample_schema_warnings(result: ValidateResult) -> list[dict[str, str]]:
    """What the build would warn of the decoded samples' shapes and dtypes
    (:func:`~packer.pipeline.sampletable.several_shapes`, :func:`~packer.pipeline.sampletable.several_dtypes`:
    no batch stacks them). None under --quick, which decodes no pixels."""
    if result.quick:
        return []
    from packer.pipeline.sampletable import sample_schema, several_dtypes, several_shapes

    schema = sample_schema(result.prepared.samples)
    return [*({"code": "several_shapes", "message": m} for m in several_shapes(schema)),
            *({"code": "several_dtypes", "message": m} for m in several_dtypes(schema))]


def closing_warnings(doc: dict[str, Any]) -> list[str]:
    """The warnings of :func:`summary`'s document ``doc`` that the summary prints (a split that asked
    for samples and got none, shapes or dtypes no batch stacks), in its order; the stages' own were
    printed as they ran. ``packer.validate``, which prints no summary, prints these on stderr."""
    return [w["message"] for w in doc["warnings"] if w["code"] == "empty_split" or w["code"] in SAMPLE_SCHEMA_WARNINGS]


def _excluded_summary(prepared: Prepared) -> dict[str, Any]:
    """The files left out on purpose: how many, per why, modality and SOP class, and the first
    1000 records (:mod:`packer.exclusions`)."""
    counts = exclusion_counts(prepared.excluded)
    return {"total": len(prepared.excluded), "by_why": counts.get("excluded", {}),
            "by_modality": counts.get("excluded_by_modality", {}),
            "by_sop_class": counts.get("excluded_by_sop_class", {}),
            "records": [e.to_json() for e in prepared.excluded[:1000]]}


#: Control characters (C0, DEL, C1): a raw file name may hold them, and printed as they are an
#: escape sequence in one recolours, retitles or clears the terminal, a newline forges a line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _shown(text: str) -> str:
    """``text`` for a terminal or a CI log: each control character written as its escape."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def _where_keys_lead(job: JobConfig, *, files: bool) -> str:
    """How the caller finds the files behind the summary's sample keys (``files``: bad or left-out
    files are listed too): ``packer locate`` for a job file, and the report's paths, named as the
    caller takes them; a job given to Python as a mapping has no file for ``packer locate`` to read."""
    paths = f"{surface().option('json', placeholder='FILE')} lists the bad and left-out files' paths"
    if surface().python and job.job_path == MAPPING_JOB:
        located = "`packer locate JOB KEY ...` prints any key's file once the job is saved as a job file JOB"
        return f"ValidationResult.issues holds each bad file's path, {paths}; {located}" if files else located
    return f"`packer locate {job.job_path} KEY ...` prints their files" + (f" ({paths})" if files else "")


def format_summary(result: ValidateResult) -> str:
    """A short human summary: counts by reason, per split, failing and reporting rules."""
    doc = summary(result)
    bad = doc["bad_samples"]
    lines = [f"packer validate {doc['name']}: {doc['inputs']['files']} files, {doc['inputs']['samples']} samples"
             + (f" (headers only: {surface().option('quick')}; files whose pixels do not decode, a truncated one "
                "say, are not found, and copies of one image are not linked (no duplicate links), so counts, split "
                "groups and the split can differ from a full check's)" if result.quick else "")]
    lines.append("  " + "  ".join(f"{s} {v['samples']} samples/{v['entities']} entities"
                                  for s, v in doc["splits"].items()))
    reasons = ", ".join(f"{k} {v}" for k, v in bad["by_reason"].items()) or "none"
    verdict = "over" if over_limit(bad, result.prepared.considered) else "within"
    lines.append(f"  bad samples: {bad['total']} ({bad['fraction']:.1%}, {verdict} limit {bad['max_fraction']:.1%}): "
                 f"{reasons}")
    # the summary goes to CI logs: under PHI files are named by sample key (their folders may carry
    # a patient's name; a detail may quote a header), as the report names them; --json keeps the paths
    hidden = result.prepared.phi.active
    issues = result.prepared.issues
    for issue in _each_reason_first(issues, SUMMARY_ISSUES):
        if hidden:
            lines.append(f"    {issue.reason:<22} {issue.sample_id}")
            continue
        # the message names the fix; most start with the path
        said = issue.message if issue.message.startswith(issue.path) else f"{issue.path}: {issue.message}"
        lines.append(f"    {issue.reason:<22} {_shown(said)}")
    lines.extend(_and_more(len(issues), SUMMARY_ISSUES, "    "))
    excluded = result.prepared.excluded
    if excluded:  # counted, never silent; never against the bad fraction
        lines.append(f"  left out on purpose: {len(excluded)} ({describe_counts(doc['excluded']['by_why'])}); not bad "
                     "samples")
        for record in excluded[:_cut(len(excluded), SUMMARY_ISSUES)]:
            lines.append(f"    {record.why:<22} " + (_hidden_excluded(record) if hidden else
                                                      f"{_shown(record.path)}: {_shown(record.detail)}"))
        lines.extend(_and_more(len(excluded), SUMMARY_ISSUES, "    "))
    lines.extend(f"  warning: {message}" for message in closing_warnings(doc))
    listed = False
    for name, rule in doc["audit"]["rules"].items():
        state = "skip" if "skipped" in rule else "ok" if rule["passed"] else (
            "FAIL" if rule["severity"] == "fail" else "note")
        # a rule not run counts nothing: "[skip] rule: 0" read as "checked, none found"
        tolerated = rule.get("pairs", 0) if state == "ok" else 0  # near pairs within max_cross_split: said, not 0
        lines.append(f"  [{state:>4}] {name}: " + (str(rule["skipped"]).split(";")[0] if state == "skip"
                                                    else str(rule["count"]))
                     + (f" ({tolerated} crossing pair(s) tolerated: split.near_duplicates.max_cross_split "
                        f"{rule.get('tolerated')})" if tolerated else ""))
        if rule["passed"] is False or tolerated:
            findings = result.prepared.audit.rule(name).findings
            listed = listed or bool(findings)
            for finding in findings[:_cut(len(findings), SUMMARY_FINDINGS)]:  # whole: a CI log's only view of it
                lines.append(f"         {_shown(finding_text(name, finding, members=6, where=True))}")
            lines.extend(_and_more(len(findings), SUMMARY_FINDINGS, "         "))
    if hidden and (listed or issues or excluded):  # samples named by key, never by path
        where = _where_keys_lead(result.job, files=bool(issues or excluded))
        lines.append(f"  {'the findings and files above' if issues or excluded else 'the findings'} name samples by "
                     f"key: {where} (raw paths: keep them local)")
    outcome = {0: "clean", 3: "too many bad samples (exit 3)",
               4: f"the split audit failed: {', '.join(failed_rules(doc)) or 'leakage'} (exit 4)"}[result.exit_code]
    warned = len(doc["warnings"])
    not_run = sum(str(rule.get("skipped", "")).startswith(QUICK_SKIPPED) for rule in doc["audit"]["rules"].values())
    partly = [name for name, rule in doc["audit"]["rules"].items()
              if str(rule.get("skipped", "")).startswith(QUICK_PARTIAL)]
    off = [f"{name} ({rule['skipped'].removeprefix('not run: ')})" for name, rule in doc["audit"]["rules"].items()
           if "skipped" in rule and not str(rule["skipped"]).startswith((QUICK_SKIPPED, QUICK_PARTIAL))]
    lines.append(f"  result: {outcome}" + (f"; {warned} warning(s) above, which do not fail the check" if warned
                                          else "")
                 + (f"; {not_run} rule(s) not run (headers only, {surface().option('quick')}: no pixels compared; "
                    f"the copies they find are unchecked: {_without_quick()})" if not_run else "")
                 + (f"; {', '.join(partly)} partly run (no duplicate links, so no split group they join is seen)"
                    if partly else "")
                 + (f"; not run by the job's split settings: {'; '.join(off)}" if off else ""))
    return "\n".join(lines)


def _hidden_excluded(record: Excluded) -> str:
    """A file left out on purpose as the summary names it under PHI: its sample key and what its
    header's class says (modality, SOP class), not its detail, which may quote a table cell or a
    free-text header value."""
    said = " ".join(part for part in (record.modality, f"({record.sop_class})" if record.sop_class else "") if part)
    return f"{record.sample_id}: {said}" if said else record.sample_id


def failed_rules(doc: dict[str, Any]) -> dict[str, int]:
    """The audit rules that failed the check in ``doc`` (:func:`summary`'s report): name → count."""
    return {name: rule["count"] for name, rule in doc["audit"]["rules"].items()
            if rule["severity"] == "fail" and rule["passed"] is False}


def report_elsewhere(option: str) -> str:
    """The fix for a --json or --junit file the file system refuses: there is no output folder to move."""
    shown = surface().option(option, placeholder="ANOTHER_PATH") if surface().python else f"another --{option} FILE"
    return f"write the file elsewhere ({shown})"


@contextlib.contextmanager
def _report_file(path: Path, option: str) -> Iterator[Any]:
    """:func:`~packer.files.atomic_output` for a report the user named with ``option`` (``json``
    or ``junit``, named as the caller names it: :func:`packer.errors.surface`): any
    OSError creating or writing it (a folder that cannot hold files, such as /proc, a name the
    file system refuses, a path too long, a file where one of its folders must be) is the path's
    fault, exit 6 naming it and the option, never a traceback. A folder is a ConfigError (exit 2),
    as the command line's own check of ``--json DIR`` is: the path names no file to write,
    whatever the folder allows."""
    try:
        folder = path.is_dir()
    except OSError:  # a name the file system refuses (too long): the write below says so, exit 6
        folder = False
    if folder:
        example = path / ("validate.json" if option == "json" else "validate-junit.xml")
        raise ConfigError(f"{path} is a folder; give {surface().name(option)} the path of a file to write, e.g. "
                          f"{example}")
    try:
        if _not_a_file(path):  # /dev/stdout, a pipe (--junit >(tee ...)), /dev/full: write into it, never
            with _into(path, option) as fh:  # rename a file over it (as root, over the device itself)
                yield fh
            return
        blocker = blocking_file(path.parent)
        if blocker is not None:  # the report's path, met after a whole check: exit 6 as any unwritable path
            raise FileSystemError(f"cannot write {path}: {blocker} is a file, not a folder; give "
                                  f"{surface().name(option)} a path in a writable folder")
        with atomic_output(path, elsewhere=report_elsewhere(option), shared=True) as fh:
            yield fh
    except OSError as err:
        raise FileSystemError(f"cannot write {path}: {err.strerror or err}; give "
                              f"{surface().name(option)} a path in a writable folder") from err


def _not_a_file(path: Path) -> bool:
    """Whether ``path`` exists as something other than a regular file, links followed: a device,
    a pipe or a socket, which a report is written into as it is."""
    try:
        return not stat.S_ISREG(path.stat().st_mode) and not stat.S_ISDIR(path.stat().st_mode)
    except OSError:  # absent (or unreachable: atomic_output then says why)
        return False


@contextlib.contextmanager
def _into(path: Path, option: str) -> Iterator[Any]:
    """``path`` (not a regular file) opened for writing; a full or refusing device is exit 6
    naming it and ``option``'s fix, as :func:`atomic_output` would say it."""
    try:
        with open(path, "wb") as fh:
            yield fh
    except OSError as err:
        refused = refused_write(err, path, opening=True, elsewhere=report_elsewhere(option))
        if refused is None:
            raise
        raise refused from err


def write_json(result: ValidateResult, path: Path) -> None:
    with _report_file(path, "json") as fh:
        fh.write(json.dumps(summary(result), indent=2, sort_keys=True).encode() + b"\n")


#: What XML 1.0 cannot hold, even escaped: C0 controls but tab, newline and carriage return
#: (a raw file name may carry any of them: ``bell\x07.png``), and the non-characters U+FFFE/U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """``text`` with each character XML cannot hold written as its escape (``\x07``): ElementTree
    writes them as they are, and a CI's JUnit reader then refuses the whole file."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)


def write_junit(result: ValidateResult, path: Path) -> None:
    """JUnit XML: a ``bad_fraction`` case plus one case per audit rule; failures list samples.

    What the strict Ant JUnit schema requires is all there: the suite's ``timestamp``
    (when the check started, UTC, ``2026-12-05T07:00:00`` without a zone, as the schema's pattern
    has it), ``hostname`` (the machine's name, as a CI runner reports it: no patient data) and
    ``time`` (the check's wall seconds); each case's ``time`` is 0, since the rules are judged
    together from one pass over the files (the suite's time is that pass); each ``failure``'s
    ``type`` (``packer.validate.<rule>``) and ``message``; the suite's ``system-out`` and
    ``system-err``, last. A case's own ``system-out`` (a passing rule's findings) and ``skipped``
    go beyond that schema, as in every JUnit file Jenkins, GitLab and Surefire read."""
    doc = summary(result)
    started = result.started or datetime.now(UTC)
    suite = ET.Element("testsuite", name=f"packer validate {doc['name']}",
                       timestamp=started.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
                       hostname=socket.gethostname().strip() or "localhost", time=f"{result.seconds:.3f}")
    cases = 0
    failures = 0

    skipped = 0

    def case(name: str, failed: bool, message: str, body: str, not_run: str | None = None) -> None:
        nonlocal cases, failures, skipped
        cases += 1
        element = ET.SubElement(suite, "testcase", classname=f"packer.validate.{doc['name']}", name=name,
                                time="0")
        if not_run is not None:  # --quick: the rule could not run, so it neither passed nor failed
            skipped += 1
            ET.SubElement(element, "skipped", message=not_run)
        elif failed:
            failures += 1
            # ``type`` (the failed rule) is required by the strict schemas, as is ``message``
            ET.SubElement(element, "failure", message=_xml_text(message),
                          type=f"packer.validate.{name}").text = _xml_text(body)
        elif body:
            ET.SubElement(element, "system-out").text = _xml_text(body)

    bad = doc["bad_samples"]
    issues = result.prepared.issues
    # CI publishes this file as test results: under PHI a bad file is its reason and sample key (packer
    # locate maps it back), never its raw path or message, which may name the patient; --json keeps those
    hidden = result.prepared.phi.active
    listed = "\n".join([*(f"{i.reason}: {i.sample_id}" if hidden else f"{i.reason}: {i.path}: {i.message}"
                          for i in issues[:_cut(len(issues), MAX_LISTED)]),
                        *_and_more(len(issues), MAX_LISTED)])
    # of the files the fraction counts, as packer build says it: those left out on purpose do not count
    left_out = doc["excluded"]["total"]
    counted = f"{doc['inputs']['files'] - left_out} files" + (
        f" (and {left_out} left out on purpose, which do not count)" if left_out else "")
    case("bad_fraction", over_limit(bad, result.prepared.considered),
         f"{bad['total']} bad of {counted} ({bad['fraction']:.1%} > {bad['max_fraction']:.1%})", listed)
    for name, rule in doc["audit"]["rules"].items():
        findings = result.prepared.audit.rule(name).findings
        body = "\n".join([*(json.dumps(f, sort_keys=True) for f in findings[:_cut(len(findings), MAX_LISTED)]),
                          *_and_more(len(findings), MAX_LISTED)])
        case(name, rule["severity"] == "fail" and rule["passed"] is False, f"{rule['count']} finding(s)", body,
             rule.get("skipped"))
    # a warning, not a failure: the case passes and says what it found (like a report rule's findings);
    # the stages' other warnings are the suite's output, not this case's
    case("empty_splits", False, "", "\n".join(f"warning: {w['message']}" for w in doc["warnings"]
                                              if w["code"] == "empty_split"))
    others = [w for w in doc["warnings"] if w["code"] != "empty_split"]
    # the suite's output, then its error output: both always there, last, as the Ant schema requires
    ET.SubElement(suite, "system-out").text = _xml_text("\n".join(f"warning ({w['code']}): {w['message']}"
                                                                   for w in others))
    ET.SubElement(suite, "system-err").text = ""
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    counts = Counter(i.reason for i in result.prepared.issues)
    suite.set("skipped", str(skipped))
    properties = ET.Element("properties")  # before the test cases, where the JUnit schema puts them
    properties.extend([ET.Element("property", name=f"bad.{k}", value=str(v)) for k, v in sorted(counts.items())])
    suite.insert(0, properties)
    with _report_file(path, "junit") as fh:
        fh.write(ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n")
