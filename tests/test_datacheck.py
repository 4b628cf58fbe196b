"""packer validate: the CI data check finds planted leaks, reports as JSON and JUnit, exits right."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import cv2
import jsonschema
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.pipeline.datacheck import summary, validate_job
from packer.pipeline.split import entity_unit, split_for_unit
from packer.schemas import load_schema, schema_registry
from tests.helpers import REPO, demo_job_doc, write_job

RATIOS = (("train", 0.8), ("valid", 0.1), ("test", 0.1))


def photo(seed: int) -> np.ndarray:
    """A textured colour image, different for every seed."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (128, 96), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def entities_in_different_splits(seed: int) -> tuple[str, str]:
    by_split: dict[str, str] = {}
    for i in range(1000):
        entity = f"P{i:03d}"
        by_split.setdefault(split_for_unit(entity_unit(entity, seed), RATIOS), entity)
    return by_split["train"], by_split["test"]


def image_job(tmp_path: Path, rows: list[tuple[str, np.ndarray, str, str]], **split: Any) -> Path:
    """Write images and a table (path, label, entity) and a job over them; return the job path."""
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    lines = ["path,label,entity,timestamp"]
    for rel, image, label, entity in rows:
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(raw / rel), image)
        lines.append(f"{rel},{label},{entity},2024-01-01")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    doc = {"name": "leaks", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
           "split": {"by": "entity", "seed": 5, **split}, "transform": {"image": {"size": [64, 64]}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    return write_job(tmp_path, doc)


def base_rows(n: int = 30) -> list[tuple[str, np.ndarray, str, str]]:
    return [(f"s{i:03d}.png", photo(i), ("a", "b")[i % 2], f"E{i:03d}") for i in range(n)]


def run_validate(job: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    out = job.parent / "report.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out), *extra])
    return result.exit_code, json.loads(out.read_text()), result.output


def test_demo_validates_clean_with_schema_valid_json_and_junit(demo_raw: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    code, report, output = run_validate(job, "--junit", str(tmp_path / "junit.xml"))
    assert code == 0, output
    validator = jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry())
    validator.validate(report)
    assert report["bad_samples"]["total"] == len(demo_raw.defects)
    assert sum(s["samples"] for s in report["splits"].values()) == report["inputs"]["samples"]
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite[0].tag == "properties"  # first, as the JUnit schema orders a testsuite's children
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names[0] == "bad_fraction" and "entity_overlap" in names and "near_duplicates_across_splits" in names
    assert suite.get("failures") == "0"
    assert not (tmp_path / "out").exists()  # validate writes no shards


def test_same_image_as_png_and_jpeg_under_two_patients_is_found(tmp_path: Path) -> None:
    first, second = entities_in_different_splits(5)
    copy = photo(999)
    rows = [*base_rows(), ("x/orig.png", copy, "a", first), ("y/copy.jpg", copy, "a", second)]
    # default duplicates: group → the two patients share a split and the cluster is reported
    code, report, _ = run_validate(image_job(tmp_path / "group", rows))
    assert code == 0
    spans = report["audit"]["rules"]["duplicates_span_entities"]
    assert spans["count"] == 1 and spans["findings"][0]["entities"] == sorted([first, second])
    # without grouping the near duplicate lands across splits and fails the check
    code, report, output = run_validate(image_job(tmp_path / "fail", rows, duplicates="fail"),
                                        "--junit", str(tmp_path / "j.xml"))
    assert code == 4, output
    near = report["audit"]["rules"]["near_duplicates_across_splits"]
    assert near["count"] == 1
    pair = near["findings"][0]
    assert {pair["a"]["path"], pair["b"]["path"]} == {"x/orig.png", "y/copy.jpg"}
    assert pair["score"] >= 0.98 and pair["structure"] > 0.6 and pair["zoom"] == 1.0  # the evidence of the link
    failure = next(c for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
                   if c.get("name") == "near_duplicates_across_splits").find("failure")
    assert failure is not None and "copy.jpg" in (failure.text or "")


def test_near_pairs_within_max_cross_split_are_said_not_counted_as_none(tmp_path: Path) -> None:
    """max_cross_split: 1 tolerates the one crossing near copy: the rule passes, and the summary
    said "near_duplicates_across_splits: 0", hiding a known leak from the CI log."""
    first, second = entities_in_different_splits(5)
    copy = photo(999)
    rows = [*base_rows(), ("x/orig.png", copy, "a", first), ("y/copy.jpg", copy, "a", second)]
    job = image_job(tmp_path, rows, duplicates="fail", near_duplicates={"max_cross_split": 1})
    code, report, output = run_validate(job)
    assert code == 0, output
    assert report["audit"]["rules"]["near_duplicates_across_splits"]["pairs"] == 1
    assert ("[  ok] near_duplicates_across_splits: 0 (1 crossing pair(s) tolerated: "
            "split.near_duplicates.max_cross_split 1)") in output
    assert "copy.jpg" in output  # the pair itself, as a failing rule's findings are listed


def test_an_exact_copy_across_splits_is_found(tmp_path: Path) -> None:
    first, second = entities_in_different_splits(5)
    copy = photo(777)
    rows = [*base_rows(), ("a/one.png", copy, "a", first), ("b/two.png", copy, "b", second)]
    code, report, _ = run_validate(image_job(tmp_path, rows, duplicates="fail"))
    assert code == 4
    exact = report["audit"]["rules"]["exact_duplicates_across_splits"]
    assert exact["count"] == 1
    assert {s["path"] for s in exact["findings"][0]["samples"]} == {"a/one.png", "b/two.png"}


def test_a_patient_repeated_in_two_sources_is_one_group(tmp_path: Path, demo_raw: Any) -> None:
    """The demo's CT patients appear again in a photo table: same entity id, one split."""
    raw = tmp_path / "raw"
    shutil.copytree(demo_raw.root, raw)
    extra = raw / "extra_photos"
    extra.mkdir()
    lines = ["path,label,entity,timestamp"]
    for i in range(1, 13):
        cv2.imwrite(str(extra / f"p{i}.png"), photo(100 + i))
        lines.append(f"p{i}.png,circle,PAT{i:04d},2024-01-01")
    (extra / "labels.csv").write_text("\n".join(lines) + "\n")
    doc = demo_job_doc(raw, tmp_path / "out")
    doc["sources"].append({"kind": "image", "root": str(extra), "table": str(extra / "labels.csv")})
    result = validate_job(load_job(write_job(tmp_path, doc)), scheduler="sync", quiet=True)
    assert result.exit_code == 0
    split_of: dict[str, set[str]] = {}
    for sample in result.prepared.samples:
        split_of.setdefault(sample.ref.entity or "", set()).add(result.prepared.assignment.split[sample.key])
    assert all(len(splits) == 1 for splits in split_of.values())
    sources_of = {e: {s.ref.source for s in result.prepared.samples if s.ref.entity == e} for e in split_of}
    assert sum(len(s) == 2 for s in sources_of.values()) == 12


def test_quick_mode_reads_headers_only_and_still_reports_missing_labels(tmp_path: Path) -> None:
    rows = base_rows(10)
    job = image_job(tmp_path, rows)
    (tmp_path / "raw" / "unlisted.png").write_bytes((tmp_path / "raw" / "s000.png").read_bytes())
    code, report, _ = run_validate(job, "--quick")
    assert code == 3  # 1 bad of 11 > 5%
    assert report["quick"] is True and report["bad_samples"]["by_reason"] == {"missing_label": 1}


def test_quick_mode_reports_a_mask_file_the_table_names_but_the_disk_lacks_as_the_full_check_does(
        tmp_path: Path) -> None:
    """A row whose mask file was never copied: the full check said mask_missing (exit 3), --quick,
    which checks "labels, entities, times, unreadable files", said clean (exit 0), though it says
    missing_file for a missing image. Both now say it, once, from the listing."""
    raw = tmp_path / "raw"
    (raw / "masks").mkdir(parents=True)
    lines = ["path,label,entity,mask"]
    for i in range(8):
        cv2.imwrite(str(raw / f"s{i}.png"), photo(i)[:, :, 0])
        if i != 5:
            cv2.imwrite(str(raw / "masks" / f"s{i}.png"), (photo(i)[:, :, 0] > 128).astype(np.uint8))
        lines.append(f"s{i}.png,{('a', 'b')[i % 2]},E{i},masks/s{i}.png")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    doc = {"name": "masked", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv"),
                                          "mask": {"column": "mask", "classes": [0, 1]}}],
           "split": {"by": "entity", "seed": 5}, "transform": {"image": {"size": [64, 64], "color": "gray"}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "validate": {"max_bad_fraction": 0.0}}
    job = write_job(tmp_path, doc)
    for extra in ((), ("--quick",)):
        code, report, _ = run_validate(job, *extra)
        assert code == 3, extra
        (record,) = report["bad_samples"]["records"]  # one record: the decode pass does not say it again
        assert record["reason"] == "mask_missing" and record["path"] == str(raw / "s5.png")
        assert f"its mask {raw / 'masks' / 's5.png'} does not exist" in record["message"]
        assert "row 7, column 'mask'" in record["message"]
        assert report["inputs"]["files"] == 8


def test_quick_mode_says_which_rules_it_did_not_run_instead_of_passing_them(tmp_path: Path) -> None:
    """--quick hashes no pixels: a copy across splits cannot be seen. The summary showed
    `[  ok] exact_duplicates_across_splits: 0`, the JUnit cases passed and the JSON said passed,
    count 0: a CI dashboard read "no leak" where nothing was checked."""
    first, second = entities_in_different_splits(5)
    copy = photo(777)
    job = image_job(tmp_path, [*base_rows(), ("a/one.png", copy, "a", first), ("b/two.png", copy, "b", second)],
                    duplicates="fail")
    code, report, output = run_validate(job, "--quick", "--junit", str(tmp_path / "j.xml"))
    assert code == 0, output  # nothing it checked failed
    jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry()).validate(report)
    not_run = {"exact_duplicates_across_splits", "exact_duplicates_within_split", "near_duplicates_across_splits",
               "duplicates_span_entities", "label_conflicts"}
    rules = report["audit"]["rules"]
    # split_balance ran on groups without the duplicate links: partly run, never passed either
    partly = not_run | {"split_balance"}
    assert {name for name, rule in rules.items() if "skipped" in rule} == partly
    assert "--quick" in rules["exact_duplicates_across_splits"]["skipped"]
    assert rules["split_balance"]["skipped"].startswith("partly run: headers only (--quick)")
    # not run is never passed: a CI script reading a rule's "passed" read true for a rule that never ran
    assert {name for name, rule in rules.items() if rule["passed"] is None} == partly
    for name in not_run:
        assert f"[skip] {name}: not run: headers only (--quick), so no pixels are hashed" in output
        assert f"[  ok] {name}" not in output and f"[skip] {name}: 0" not in output  # a count reads as "none found"
    assert "5 rule(s) not run (headers only, --quick: no pixels compared" in output.splitlines()[-1]
    suite = ET.parse(tmp_path / "j.xml").getroot()
    skipped = {c.get("name"): c.find("skipped") for c in suite.iter("testcase")}
    assert {name for name, element in skipped.items() if element is not None} == partly
    assert suite.get("skipped") == "6" and "--quick" in (skipped["label_conflicts"].get("message") or "")
    # a full check runs them all and finds the copy
    code, report, _ = run_validate(job)
    assert code == 4 and not any("skipped" in rule for rule in report["audit"]["rules"].values())


def test_validate_warnings_point_at_its_own_report_not_at_a_leakage_json_it_never_writes(tmp_path: Path) -> None:
    # "every group is listed under entity_lookalikes in leakage.json": packer validate writes no leakage.json
    rows = [*base_rows(12), ("twin.png", photo(500), "a", "e 003")]
    code, report, output = run_validate(image_job(tmp_path, rows))
    assert code == 0, output
    (warning,) = [w["message"] for w in report["warnings"] if w["code"] == "entity_lookalikes"]
    assert "leakage.json" not in warning and "leakage.json" not in output
    assert warning.endswith("every group is listed under entity_lookalikes in the validate report's audit")


def test_junit_empty_splits_case_holds_only_empty_splits_and_other_warnings_go_to_the_suite(tmp_path: Path) -> None:
    # the passing case empty_splits carried every warning (an entity lookalike there read as an empty split)
    rows = [*base_rows(12), ("twin.png", photo(500), "a", "e 003")]
    code, _, output = run_validate(image_job(tmp_path, rows), "--junit", str(tmp_path / "j.xml"))
    assert code == 0, output
    suite = ET.parse(tmp_path / "j.xml").getroot()
    (empty,) = [c for c in suite.iter("testcase") if c.get("name") == "empty_splits"]
    held = empty.find("system-out")
    lines = (held.text or "").splitlines() if held is not None else []
    assert empty.find("failure") is None and all(line.startswith("warning: split ") for line in lines)
    assert not any("entity ids" in line for line in lines)
    assert [c.tag for c in suite][-2:] == ["system-out", "system-err"]  # after the cases, as the schema has it
    said = suite.find("system-out")
    assert said is not None and (said.text or "").startswith("warning (entity_lookalikes): 1 group(s) of entity ids")


def test_validate_help_tells_a_ci_author_what_the_reports_hold_and_when_they_are_written() -> None:
    """A CI step needs: which exits still write the reports, which report may leave the runner,
    and every exit code it can see (130 was missing)."""
    said = " ".join(CliRunner().invoke(main, ["validate", "--help"], terminal_width=200).output.split())
    assert "130 interrupted" in said
    assert "written on exits 0, 3 and 4" in said
    assert "raw paths" in said and "keep it local" in said
    assert "by sample key" in said and "max_bad_fraction" in said


def test_junit_bad_fraction_counts_against_the_files_the_fraction_counts(tmp_path: Path, demo_raw: Any) -> None:
    # "8 bad of 68 files (12.5% > 1.0%)": 8/68 is 11.8%; the fraction leaves out the 4 files left out on purpose,
    # as packer build says it ("8 of 64 input files are bad (and 4 left out on purpose, which do not count)")
    text = (REPO / "workflows" / "annotated-slices.yaml").read_text().replace("../demo-raw", str(demo_raw.root))
    doc = yaml.safe_load(text)
    doc.update(output=str(tmp_path / "out"), validate={"max_bad_fraction": 0.01})
    doc.pop("registry", None)
    job = write_job(tmp_path, doc)
    code, report, output = run_validate(job, "--junit", str(tmp_path / "j.xml"))
    assert code == 3, output
    left_out = report["excluded"]["total"]
    counted = report["inputs"]["files"] - left_out
    assert left_out and report["bad_samples"]["fraction"] == pytest.approx(report["bad_samples"]["total"] / counted,
                                                                          abs=1e-6)
    (case,) = [c for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase") if c.get("name") == "bad_fraction"]
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith(f"{report['bad_samples']['total']} bad of {counted} files "
                                                 f"(and {left_out} left out on purpose, which do not count) (")


def test_bad_fraction_over_threshold_exits_3(demo_raw: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out", validate={"max_bad_fraction": 0.01}))
    code, report, _ = run_validate(job)
    assert code == 3 and report["passed"] is False and report["exit_code"] == 3


def test_summary_is_schema_valid_for_a_leak(tmp_path: Path) -> None:
    first, second = entities_in_different_splits(5)
    copy = photo(4242)
    rows = [*base_rows(12), ("a.png", copy, "a", first), ("b.png", copy, "a", second)]
    result = validate_job(load_job(image_job(tmp_path, rows, duplicates="fail")), scheduler="sync", quiet=True)
    assert summary(result)["exit_code"] == 4


def test_the_ci_workflow_is_a_valid_github_workflow() -> None:
    workflow = REPO / ".github" / "workflows" / "validate-data.yml"
    exe = Path(sys.executable).with_name("check-jsonschema")
    if not exe.exists():
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", str(workflow)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = workflow.read_text()
    assert "packer validate" in text and "--junit" in text


def test_the_ci_workflow_runs_when_what_it_checks_with_changes_and_installs_as_make_does() -> None:
    """A pull request that edits the workflow itself, pyproject.toml or constraints.txt did not run
    it (paths: workflows, schemas, packer only); and it installed without constraints.txt, so the
    runner's decoders (which shape the pixel hashes the duplicate rules compare) were whatever pip
    picked that day, not the versions `make` installs."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "validate-data.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    paths = triggers["pull_request"]["paths"]
    for needed in (".github/workflows/validate-data.yml", "pyproject.toml", "constraints.txt"):
        assert needed in paths
    steps = workflow["jobs"]["validate"]["steps"]
    install = next(step["run"] for step in steps if step.get("name") == "Install packer")
    assert "-c constraints.txt" in install
    assert any("packer demo-data demo-raw" in step.get("run", "") for step in steps)


def test_the_test_workflow_runs_what_ci_runs() -> None:
    """CI runs `bash .ci/run` on a fresh clone, and .ci/run calls the README's test command; a
    GitHub workflow runs the same entry point on every pull request, with the Python the Makefile
    expects and time for the slow tests."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "tests.yml").read_text())
    assert "pull_request" in workflow[True] and "push" in workflow[True]
    job = workflow["jobs"]["test"]
    assert job["timeout-minutes"] >= 90
    steps = job["steps"]
    assert any(step.get("with", {}).get("python-version") == "3.11" for step in steps)
    assert any("bash .ci/run" in step.get("run", "") for step in steps)
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci and "make test" in (REPO / "README.md").read_text()


def test_the_readme_shell_command_validates_a_json_report_offline(tmp_path: Path) -> None:
    """The schema refers to the bad-sample schema by its $id (https://packer.dev/...): a stock
    `check-jsonschema --schemafile schemas/validate.schema.json` fetched it and failed offline
    (DNS error); the README gives the command that resolves it from schemas/."""
    import re
    import shlex

    exe = Path(sys.executable).with_name("check-jsonschema")
    if not exe.exists():
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]')")
    readme = (REPO / "README.md").read_text()
    found = re.search(r"^check-jsonschema --base-uri .*$", readme, flags=re.M)
    assert found, "the README gives no shell command that validates a --json report offline"
    job = image_job(tmp_path, base_rows(6))
    run_validate(job, "--quick")
    command = found.group().split("#")[0].replace("$PWD", str(REPO)).replace("FILE", str(job.parent / "report.json"))
    proc = subprocess.run([str(exe), *shlex.split(command)[1:]], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_pseudonymized_leak_names_keys_and_packer_locate_finds_their_files(tmp_path: Path) -> None:
    """Pseudonymized, the audit names samples by key (no raw path in a shareable report); the
    summary says how to find the files, and `packer locate` does, with the job's key."""
    from packer.phi import Pseudonymizer

    key = "c3" * 32
    pseudonyms = Pseudonymizer(mode="pseudonymize", dates="shift", key=key.encode())
    by_split: dict[str, str] = {}  # the split goes by pseudonym: two raw ids whose pseudonyms part
    for i in range(1000):
        by_split.setdefault(split_for_unit(entity_unit(pseudonyms.entity(f"P{i:03d}"), 5), RATIOS), f"P{i:03d}")
    first, second = by_split["train"], by_split["test"]
    copy = photo(777)
    job = image_job(tmp_path, [*base_rows(), ("a/one.png", copy, "a", first), ("b/two.png", copy, "b", second)],
                    duplicates="fail")
    doc = yaml.safe_load(job.read_text())
    doc["phi"] = {"mode": "pseudonymize"}
    job.write_text(yaml.safe_dump(doc))
    env = {"PACKER_PHI_KEY": key}
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out)], env=env)
    assert result.exit_code == 4
    assert f"`packer locate {job.resolve()} KEY ...` prints their files" in result.output
    (finding,) = json.loads(out.read_text())["audit"]["rules"]["exact_duplicates_across_splits"]["findings"]
    keys = [sample["key"] for sample in finding["samples"]]
    assert all("path" not in sample for sample in finding["samples"])
    located = CliRunner().invoke(main, ["locate", str(job), *keys], env=env)
    assert located.exit_code == 0, located.output
    assert sorted(line.split("\t")[1].rsplit("/raw/", 1)[1] for line in located.output.splitlines()) == [
        "a/one.png", "b/two.png"]
    # another key makes other ids: nothing found, exit 2, and the message says why it may be
    other = CliRunner().invoke(main, ["locate", str(job), keys[0]], env={"PACKER_PHI_KEY": "d4" * 32})
    assert other.exit_code == 2 and "built with another PHI key" in other.output


def test_a_cut_list_never_ends_in_and_1_more_it_shows_that_entry_instead() -> None:
    from packer.pipeline.datacheck import _and_more, _cut

    assert (_cut(6, 5), _and_more(6, 5)) == (6, [])  # one over the limit: listed whole
    assert (_cut(7, 5), _and_more(7, 5, "  ")) == (5, ["  … and 2 more"])
    assert (_cut(3, 5), _and_more(3, 5)) == (3, [])


@pytest.mark.parametrize("flag", ["--json", "--junit"])
def test_a_report_path_under_a_file_exits_6_after_the_check_not_2(tmp_path: Path, flag: str) -> None:
    """--json afile/report.json with afile a regular file ran the whole check, said 'clean', then
    exited 2 ('the job could not be checked', which CI reads as a broken job) where every other
    unwritable report path exits 6."""
    job = image_job(tmp_path, base_rows(4))
    (tmp_path / "afile").write_text("not a folder")
    target = tmp_path / "afile" / "report.out"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--quick", flag, str(target)])
    assert result.exit_code == 6, result.output
    assert f"cannot write {target}: {tmp_path / 'afile'} is a file, not a folder; give {flag}" in result.output


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full (Linux) gives real ENOSPC writes")
@pytest.mark.parametrize("flag", ["--json", "--junit"])
def test_a_report_file_the_disk_refuses_exits_6_with_a_fix_for_that_file(tmp_path: Path, flag: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the fix said "choose another output folder (packer build --out DIR)": validate has no --out
    import builtins

    import packer.files

    job = image_job(tmp_path, base_rows(4))
    target = tmp_path / "reports" / "check.out"

    def full_for_it(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        temporary = str(file).startswith(f"{target}.") and str(file).endswith(".partial")  # this writer's own name
        return builtins.open("/dev/full" if temporary else file, mode, *args, **kwargs)

    monkeypatch.setattr(packer.files, "open", full_for_it, raising=False)
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--quick", flag, str(target)])
    assert result.exit_code == 6, result.output
    assert f"cannot write {target}: the file system is full" in result.output
    assert f"free space there, or write the file elsewhere (another {flag} FILE)" in result.output
    assert "packer build --out" not in result.output


@pytest.mark.parametrize("flag", ["--json", "--junit"])
def test_a_report_path_that_is_a_pipe_is_written_into_not_replaced_by_a_file(tmp_path: Path, flag: str) -> None:
    """`--junit >(tee ...)`, `--json /dev/stdout`: the report was written to PATH.partial and renamed
    over the pipe (or, as root, over /dev/stdout or /dev/full), so the reader got nothing and the
    device or pipe was gone; a path that is not a regular file is written into."""
    import errno
    import os
    import stat
    import threading

    job = image_job(tmp_path, base_rows(4))
    fifo = tmp_path / "report.pipe"
    os.mkfifo(fifo)
    os.link(fifo, tmp_path / "same.pipe")  # reachable after a rename, to unblock the reader
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "same.pipe").read_bytes()), daemon=True)
    reader.start()
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--quick", flag, str(fifo)])
    if reader.is_alive():  # nothing was written into the pipe: open it once, so the reader returns
        try:
            os.close(os.open(tmp_path / "same.pipe", os.O_WRONLY | os.O_NONBLOCK))
        except OSError as err:  # ENXIO: no reader has it open any more, it returned in the meantime
            assert err.errno == errno.ENXIO, err
    reader.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and not (tmp_path / "report.pipe.partial").exists()
    assert got and got[0].startswith(b"{" if flag == "--json" else b"<?xml")


def test_junit_stays_well_formed_xml_when_a_file_name_holds_control_characters(tmp_path: Path) -> None:
    # a bell or escape byte in a raw file name went into the JUnit XML as it was: not XML 1.0,
    # so the CI's test-report step refused the whole file
    job = image_job(tmp_path, base_rows(6))
    for name in ("bell\x07.png", "evil\x1b[31m.png"):
        (tmp_path / "raw" / name).write_bytes((tmp_path / "raw" / "s000.png").read_bytes())
    target = tmp_path / "junit.xml"
    code, _, output = run_validate(job, "--quick", "--junit", str(target))
    assert code == 3, output
    suite = ET.parse(target).getroot()
    (failure,) = (c.find("failure") for c in suite.iter("testcase") if c.get("name") == "bad_fraction")
    text = failure.text if failure is not None else None
    assert text is not None and "bell\\x07.png" in text and "evil\\x1b[31m.png" in text
    # and the summary shows them escaped: printed as they were, they drove the terminal
    assert "bell\\x07.png" in output and "evil\\x1b[31m.png" in output
    assert "\x07" not in output and "\x1b" not in output


def test_the_summary_shows_each_listed_bad_sample_with_its_message_and_fix(tmp_path: Path) -> None:
    """The bad samples' messages name the fix (CheXpert's blank cells: 'set blank: zeros'); the
    summary printed only their paths, leaving the fix in --json or bad_samples.jsonl."""
    job = image_job(tmp_path, base_rows(4))
    (tmp_path / "raw" / "unlisted.png").write_bytes((tmp_path / "raw" / "s000.png").read_bytes())
    code, _, output = run_validate(job)
    assert code == 3
    line = next(line for line in output.splitlines() if line.strip().startswith("missing_label"))
    assert f"{tmp_path / 'raw' / 'unlisted.png'}: no label: no row of {tmp_path / 'raw' / 'labels.csv'} names " \
           "'unlisted.png'; add its row, or, where the table names only the dataset's files, set table.files: " \
           "table" in line


def test_a_full_check_with_near_copies_turned_off_says_the_rule_did_not_run(tmp_path: Path) -> None:
    """With split.near_duplicates.enabled: false the summary said `[  ok]
    near_duplicates_across_splits: 0` and the JUnit case passed; only the JSON's "off" said it
    never ran."""
    job = image_job(tmp_path, base_rows(), near_duplicates={"enabled": False})
    code, report, output = run_validate(job, "--junit", str(tmp_path / "j.xml"))
    assert code == 0, output
    jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry()).validate(report)
    rules = report["audit"]["rules"]
    assert {name for name, rule in rules.items() if "skipped" in rule} == {"near_duplicates_across_splits"}
    assert "enabled is false" in rules["near_duplicates_across_splits"]["skipped"]
    assert "[skip] near_duplicates_across_splits" in output and "[  ok] near_duplicates_across_splits" not in output
    assert "[  ok] exact_duplicates_across_splits" in output  # the exact rules still run
    last = output.splitlines()[-1]
    assert "not run by the job's split settings: near_duplicates_across_splits" in last and "--quick" not in last
    suite = ET.parse(tmp_path / "j.xml").getroot()
    skipped = {c.get("name"): c.find("skipped") for c in suite.iter("testcase")}
    assert [name for name, element in skipped.items() if element is not None] == ["near_duplicates_across_splits"]
    assert suite.get("skipped") == "1"


def test_validate_warns_of_several_dtypes_as_the_build_does_and_the_build_says_it_once(tmp_path: Path) -> None:
    """A CT source (uint8) beside MR NIfTI z-scored to float16: packer build warned that no batch
    stacks them, packer validate (which decodes) said nothing."""
    from tests.test_targets import ct_beside_float16_mr

    job = ct_beside_float16_mr(tmp_path)
    said = "warning: the sources' samples have different dtypes (ct uint8, mr float16)"
    code, report, output = run_validate(job, "--junit", str(tmp_path / "j.xml"))
    assert code == 0, output
    jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry()).validate(report)
    assert [w["code"] for w in report["warnings"] if w["code"].startswith("several_")] == ["several_dtypes"]
    assert output.count(said) == 1, output
    assert "several_dtypes" in ET.parse(tmp_path / "j.xml").getroot().findtext("system-out", "")
    # --quick decodes no pixels: it has no dtypes to compare
    code, report, output = run_validate(job, "--quick")
    assert not any(w["code"].startswith("several_") for w in report["warnings"]) and said not in output
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report"])
    assert built.exit_code == 0 and built.output.count(said) == 1, built.output


def test_validate_warns_of_several_shapes_as_the_build_does(tmp_path: Path) -> None:
    """Images of two sizes and no transform.image.size: packed as they are, no batch stacks them."""
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = ["path,label,entity,timestamp"]
    for i in range(6):
        cv2.imwrite(str(raw / f"s{i}.png"), cv2.resize(photo(i), (40, 32 if i % 2 else 48)))
        lines.append(f"s{i}.png,{'ab'[i % 2]},e{i},2024-01-01")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    job = write_job(tmp_path, {"name": "sizes", "sources": [{"kind": "image", "name": "photos", "root": str(raw),
                                                             "table": str(raw / "labels.csv")}],
                               "split": {"by": "entity", "seed": 5}, "pack": {"format": "webdataset"},
                               "output": str(tmp_path / "out")})
    code, report, output = run_validate(job)
    assert code == 0, output
    jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry()).validate(report)
    (warning,) = [w for w in report["warnings"] if w["code"].startswith("several_")]
    assert warning["code"] == "several_shapes" and "source photos packs samples of 2 shapes" in warning["message"]
    assert output.count(f"warning: {warning['message']}") == 1, output


#: What the strict Ant JUnit schema (junit-10.xsd, as CI tools validate against) requires of each
#: element packer writes: attribute -> the pattern its value must match
ANT_REQUIRED = {
    "testsuite": {"name": r"\S.*", "timestamp": r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}",
                  "hostname": r"\S+", "tests": r"[0-9]+", "failures": r"[0-9]+", "errors": r"[0-9]+",
                  "time": r"[0-9]+(\.[0-9]+)?"},
    "testcase": {"name": r"\S.*", "classname": r"\S.*", "time": r"[0-9]+(\.[0-9]+)?"},
}


def test_junit_has_every_attribute_the_strict_ant_schema_requires(tmp_path: Path) -> None:
    """The suite had no timestamp, hostname or time, and the cases no time: a CI that validates
    JUnit files against the Ant schema (or shows when and where a check ran) refused or blanked
    them. The timestamp is when the check started (UTC, no zone, as the schema's pattern), the
    hostname the machine's, the suite's time its wall seconds."""
    import re
    import socket
    from datetime import UTC, datetime

    before = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    code, _, output = run_validate(image_job(tmp_path, base_rows(6)), "--junit", str(tmp_path / "j.xml"))
    after = datetime.now(UTC).replace(tzinfo=None)
    assert code == 0, output
    suite = ET.parse(tmp_path / "j.xml").getroot()
    elements = [suite, *suite.iter("testcase")]
    assert len(elements) > 2
    for element in elements:
        for attribute, pattern in ANT_REQUIRED[element.tag].items():
            value = element.get(attribute)
            assert value is not None and re.fullmatch(pattern, value), (element.tag, attribute, value)
    assert before <= datetime.fromisoformat(suite.get("timestamp", "")) <= after
    assert suite.get("hostname") == (socket.gethostname().strip() or "localhost")
    assert 0 < float(suite.get("time", "0")) <= (after - before).total_seconds() + 1
    # the schema's order of the suite's children, its output elements both there (and last) with nothing to say
    tags = [c.tag for c in suite]
    assert tags[0] == "properties" and tags[-2:] == ["system-out", "system-err"], tags
    assert set(tags[1:-2]) == {"testcase"}, tags


def test_a_junit_failure_has_the_type_and_message_strict_schemas_require(tmp_path: Path) -> None:
    """A failed case's <failure> had a message but no type, which the Ant schema (and Jenkins'
    xunit) require: a CI validating the file refused the very run it should have shown as failed."""
    job = image_job(tmp_path, base_rows(6))
    raw = tmp_path / "raw"
    (raw / "broken.png").write_bytes(b"not a png")  # a bad sample, over a threshold of none
    with (raw / "labels.csv").open("a") as fh:
        fh.write("broken.png,a,E009,2024-01-01\n")
    doc = yaml.safe_load(job.read_text())
    doc["validate"] = {"max_bad_fraction": 0.0}
    job.write_text(yaml.safe_dump(doc))
    code, _, output = run_validate(job, "--junit", str(tmp_path / "j.xml"))
    assert code == 3, output
    suite = ET.parse(tmp_path / "j.xml").getroot()
    failures = [f for case in suite.iter("testcase") for f in case.iter("failure")]
    assert failures and suite.get("failures") == str(len(failures))
    for failure in failures:
        assert re.fullmatch(r"packer\.validate\.\w+", failure.get("type", "")), failure.attrib
        assert failure.get("message"), failure.attrib
    assert [c.tag for c in suite][-2:] == ["system-out", "system-err"]


def test_the_summary_shows_one_bad_sample_of_each_reason_before_cutting_the_list() -> None:
    """Seven off-slice contours then one orphan annotation: the orphan, the rarer and the more
    serious, was hidden behind "… and 3 more". Each reason gets a line before any gets a second."""
    from packer.pipeline.datacheck import SUMMARY_ISSUES, _and_more, _each_reason_first
    from packer.records import Issue

    issues = [Issue(sample_id=f"s{n}", path=f"rt{n}.dcm", stage="validate", reason="contour_off_slice",
                    message="off") for n in range(7)]
    issues.append(Issue(sample_id="seg", path="seg.dcm", stage="validate", reason="annotation_orphan", message="o"))
    issues.append(Issue(sample_id="s8", path="rt8.dcm", stage="validate", reason="contour_off_slice", message="off"))
    shown = _each_reason_first(issues, SUMMARY_ISSUES)
    assert len(shown) == SUMMARY_ISSUES and "annotation_orphan" in {i.reason for i in shown}
    assert shown == sorted(shown, key=issues.index)  # still in the report's order
    assert _and_more(len(issues), SUMMARY_ISSUES) == [f"… and {len(issues) - SUMMARY_ISSUES} more"]
    assert _each_reason_first(issues[:6], SUMMARY_ISSUES) == issues[:6]  # all shown where one line would say "1 more"


def test_a_work_folder_under_a_file_is_a_config_error_not_an_internal_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PACKER_WORK_DIR naming a file (or a folder below one): validate died at mkdir with a
    traceback (FileExistsError / NotADirectoryError, exit 1), where build says which file is in
    the way (exit 2)."""
    job = image_job(tmp_path, base_rows(6))
    (tmp_path / "notadir").write_text("a file")
    for work in (tmp_path / "notadir", tmp_path / "notadir" / "sub"):
        monkeypatch.setenv("PACKER_WORK_DIR", str(work))
        result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q"])
        assert result.exit_code == 2, result.output
        assert "internal error" not in result.output and "Traceback" not in result.output
        assert (f"the work folder {work} ($PACKER_WORK_DIR): {tmp_path / 'notadir'} is a file, not a folder; remove "
                "that file, or set PACKER_WORK_DIR to a folder") in result.output


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a file system that takes no new folder")
@pytest.mark.parametrize("command", ["validate", "build"])
def test_a_work_folder_that_cannot_be_created_is_a_file_system_error_not_an_internal_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """PACKER_WORK_DIR=/proc/nope: mkdir's FileNotFoundError was a traceback (exit 1)."""
    job = image_job(tmp_path, base_rows(6))
    monkeypatch.setenv("PACKER_WORK_DIR", "/proc/packer-nope")
    result = CliRunner().invoke(main, [command, str(job), "--scheduler", "sync", "-q"])
    assert result.exit_code == 6, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "/proc/packer-nope" in result.output and "cannot be created there" in result.output


def test_the_summary_names_every_member_of_a_label_conflict_whole(tmp_path: Path) -> None:
    """A CI log shows validate's summary: each finding was raw JSON cut at 160 characters, so the
    copy's original and its label were never named. Each member now shows with its label, split
    and entity, and a report rule's finding (entity look-alikes) is whole."""
    first, second = entities_in_different_splits(5)
    copy = photo(777)
    job = image_job(tmp_path, [*base_rows(), ("a/one.png", copy, "a", first), ("b/two.png", copy, "b", second)],
                    duplicates={"mode": "group", "label_conflict": "fail"})
    code, report, output = run_validate(job)
    assert code == 4, output
    (line,) = [line.strip() for line in output.splitlines() if line.strip().startswith("exact+near copies: ")]
    assert "a/one.png [a] (" in line and "b/two.png [b] (" in line and f"entity {first}" in line
    assert f"entity {second}" in line


def test_a_copy_groups_example_shows_the_crossing_and_says_what_it_left_out() -> None:
    """A copy under 7 entities: the build's error showed its first 2 members, both in train
    (`P6 [train] = P2 [train]`), which shows no leak, and no '... and N more'."""
    from packer.pipeline.audit import finding_text

    splits = ["train", "train", "train", "valid", "train", "test", "train"]
    finding = {"samples": [{"path": f"img/P{i}.png", "split": s} for i, s in enumerate(splits)]}
    two = finding_text("exact_duplicates_across_splits", finding, members=2)
    assert two == "img/P0.png [train] = img/P3.png [valid] and 5 more", two
    six = finding_text("exact_duplicates_across_splits", finding, members=6)
    assert six.startswith("img/P0.png [train] = img/P3.png [valid] = img/P5.png [test] = ") and six.endswith(
        " and 1 more"), six
    assert finding_text("exact_duplicates_across_splits", finding, members=7).count("[") == 7


@pytest.mark.parametrize("target", ["-", "/dev/stdout"])
def test_a_report_on_stdout_is_the_only_thing_there(tmp_path: Path, target: str) -> None:
    """`--json -` wrote a file named "-" in the working folder, and `--json /dev/stdout` put the
    opening line ("packer: NAME: N input files ...") in front of the JSON, so stdout did not parse."""
    import subprocess
    import sys

    job = image_job(tmp_path, base_rows(4))
    run = subprocess.run([sys.executable, "-m", "packer.cli", "validate", str(job), "--quick", "--scheduler", "sync",
                          "--json", target], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["passed"] is True
    assert "input files" in run.stderr and not (tmp_path / "-").exists()


@pytest.mark.parametrize("same", ["-", "report.out"])
def test_json_and_junit_cannot_both_go_to_one_place(tmp_path: Path, same: str) -> None:
    job = image_job(tmp_path, base_rows(4))
    place = same if same == "-" else str(tmp_path / same)  # never a file in the working folder
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--quick", "--json", place,
                                       "--junit", place])
    assert result.exit_code == 2 and "--json and --junit both write" in result.output, result.output
