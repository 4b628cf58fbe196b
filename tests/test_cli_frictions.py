"""User-facing frictions: typo'd job keys, absolute roots, cut lists, empty splits, and what the
build summary says the report and bad-sample file hold."""

from __future__ import annotations

import json
import re
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
from packer.pipeline.split import entity_unit, split_for_unit
from packer.schemas import load_schema, schema_registry
from tests.helpers import REPO


def photo(seed: int) -> np.ndarray:
    """A textured colour image, different for every seed."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (64, 48), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def photo_job(tmp_path: Path, rows: list[tuple[str, np.ndarray | None, str]], *, split: dict[str, Any],
              max_bad: float = 0.05, times: list[str] | None = None) -> Path:
    """Images (``None``: a zero-byte file) with a table ``path,label,entity,timestamp`` and a job over them."""
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    lines = ["path,label,entity,timestamp"]
    for i, (rel, image, entity) in enumerate(rows):
        if image is None:
            (raw / rel).write_bytes(b"")
        else:
            cv2.imwrite(str(raw / rel), image)
        lines.append(f"{rel},{('a', 'b')[i % 2]},{entity},{times[i] if times else '2024-01-01'}")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    doc = {"name": "photos", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": split, "transform": {"image": {"size": [32, 32]}}, "pack": {"format": "webdataset"},
           "output": "out", "validate": {"max_bad_fraction": max_bad}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    return job


def entities_in(split: str, ratios: dict[str, float], seed: int, count: int) -> list[str]:
    """``count`` entity ids that the entity split sends to ``split``."""
    ordered = [(name, ratios.get(name, 0.0)) for name in ("train", "valid", "test")]
    found = [e for e in (f"E{i:04d}" for i in range(10_000))
             if split_for_unit(entity_unit(e, seed), ordered) == split]
    return found[:count]


def validate(job: Path, *extra: str) -> tuple[int, str, dict[str, Any], ET.Element]:
    report, junit = job.parent / "report.json", job.parent / "junit.xml"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(report),
                                       "--junit", str(junit), *extra])
    return result.exit_code, result.output, json.loads(report.read_text()), ET.parse(junit).getroot()


def demo_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "workflows" / "demo.yaml").read_text())
    return doc


# 1. typos in the job file ------------------------------------------------------------------------

def rename(doc: dict[str, Any], path: tuple[Any, ...], new: str) -> None:
    *parents, old = path
    node = doc
    for part in parents:
        node = node[part]
    node[new] = node.pop(old)


@pytest.mark.parametrize(("path", "typo", "where"), [
    (("split",), "splt", "splt"),
    (("sources", 0, "root"), "rooot", "sources[0].rooot"),
    (("split", "ratios"), "ratio", "split.ratio"),
    (("transform", "dicom", "windows"), "window", "transform.dicom.window"),
    (("transform", "image", "color"), "colour", "transform.image.colour"),
    (("pack", "format"), "fromat", "pack.fromat"),
    (("phi", "key_file"), "keyfile", "phi.keyfile"),
    (("validate", "max_bad_fraction"), "max_bad_fracton", "validate.max_bad_fracton"),
])
def test_an_unknown_key_is_reported_first_with_the_closest_known_key(tmp_path: Path, path: tuple[Any, ...],
                                                                     typo: str, where: str) -> None:
    """Today's message for ``splt:`` was "'split' is a required property (and 1 more problem(s))"."""
    doc = demo_doc()
    rename(doc, path, typo)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2
    assert result.output == f"packer: error: {job}: {where}: unknown key (did you mean {path[-1]!r}?)\n"


def test_a_misspelt_choice_names_the_closest_allowed_value(tmp_path: Path) -> None:
    doc = demo_doc()
    doc["sources"][0]["kind"] = "dicm"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2
    assert "sources[0].kind: 'dicm' is not one of ['dicom', 'image', 'nifti'] (did you mean 'dicom'?)" in result.output


def test_an_unknown_key_inside_a_one_of_is_found_in_every_branch(tmp_path: Path) -> None:
    doc = demo_doc()
    doc["transform"]["dicom"]["windows"] = [{"centre": 40, "width": 400}]
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2
    assert result.output == (f"packer: error: {job}: transform.dicom.windows[0].centre: unknown key "
                             "(did you mean 'center'?)\n")


@pytest.mark.parametrize(("where", "value", "reported", "meant"), [
    (("transform", "dicom", "sample"), {"neighbours": 2}, "transform.dicom.sample.neighbours", "neighbors"),
    (("sources", 1, "table"), {"file": "labels.csv", "join": [{"file": "more.csv", "onn": ["path"]}]},
     "sources[1].table.join[0].onn", "on"),
    (("sources", 1, "label"), {"colum": "grade"}, "sources[1].label.colum", "column"),
    (("transform", "dicom", "windows"), [{"zscore": {"ovr": "all"}}], "transform.dicom.windows[0].zscore.ovr",
     "over"),
])
def test_an_unknown_key_in_a_value_of_several_forms_names_the_closest_key_of_the_form_it_fits(
        tmp_path: Path, where: tuple[Any, ...], value: Any, reported: str, meant: str) -> None:
    """A misspelt key in a value that takes a word or a mapping (label, sample), or a form chosen by
    its key (a zscore window, a table with joins), was "... is not valid under any of the given
    schemas" and a page of description, or jsonschema's "Additional properties are not allowed"."""
    doc = demo_doc()
    *parents, last = where
    node = doc
    for part in parents:
        node = node[part]
    node[last] = value
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2
    assert result.output.startswith(f"packer: error: {job}: {reported}: unknown key (did you mean {meant!r}?)"), \
        result.output


def test_an_unknown_key_with_no_close_match_lists_the_keys_the_schema_allows_there(tmp_path: Path) -> None:
    doc = demo_doc()
    doc["phi"]["rotate_monthly"] = True
    doc["pack"]["format"] = "zip"  # a second, unrelated problem is still counted
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2
    allowed = ", ".join(sorted(load_schema("job")["properties"]["phi"]["properties"]))
    assert result.output.startswith(f"packer: error: {job}: phi.rotate_monthly: unknown key (the keys allowed in phi "
                                    f"are {allowed})\n  also pack.format: 'zip' is not one of ")


# 2. an absolute root is not "relative to the job file" --------------------------------------------

def test_a_missing_root_says_relative_to_the_job_file_only_when_it_was(tmp_path: Path) -> None:
    job = photo_job(tmp_path, [("a.png", photo(1), "E1")], split={"by": "entity"})
    doc = yaml.safe_load(job.read_text())
    for root, relative in ((str(tmp_path / "gone"), False), ("gone", True)):
        doc["sources"][0]["root"] = root
        job.write_text(yaml.safe_dump(doc))
        result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q"])
        assert result.exit_code == 2, result.output
        assert f"folder {tmp_path / 'gone'} does not exist (root: {root!r}" in result.output
        assert ("relative to the job file" in result.output) is relative


# 3. cut lists say how much was cut -------------------------------------------------------------------

def test_the_validate_summary_says_how_many_bad_paths_it_left_out(tmp_path: Path) -> None:
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"ok{i}.png", photo(i), f"E{i}") for i in range(10)]
    rows += [(f"empty{i}.png", None, f"B{i}") for i in range(7)]
    code, output, report, _ = validate(photo_job(tmp_path, rows, split={"by": "entity"}, max_bad=1.0))
    assert code == 0, output
    assert report["bad_samples"]["total"] == 7
    lines = output.splitlines()
    listed = [line for line in lines if re.search(r"/empty\d\.png: ", line)]  # each with its message
    assert len(listed) == 5
    assert lines[lines.index(listed[-1]) + 1] == "    … and 2 more"  # never "… and 1 more": that one is listed


def test_cut_junit_bodies_and_audit_findings_say_how_many_more(tmp_path: Path) -> None:
    seed, ratios = 5, {"train": 0.8, "valid": 0.1, "test": 0.1}
    train, test = entities_in("train", ratios, seed, 5), entities_in("test", ratios, seed, 5)
    rows: list[tuple[str, np.ndarray | None, str]] = []
    for i in range(5):  # five images, each under one train and one test entity: five exact duplicates across
        rows += [(f"t{i}.png", photo(100 + i), train[i]), (f"c{i}.png", photo(100 + i), test[i])]
    rows += [(f"empty{i:02d}.png", None, f"B{i}") for i in range(53)]
    job = photo_job(tmp_path, rows, split={"by": "entity", "seed": seed, "ratios": ratios, "duplicates": "fail"},
                    max_bad=1.0)
    code, output, _, junit = validate(job)
    assert code == 4, output
    lines = output.splitlines()
    rule = lines.index("  [FAIL] exact_duplicates_across_splits: 5")
    assert lines[rule + 4] == "         … and 2 more"
    assert "    … and 48 more" in lines  # 53 bad paths, 5 listed
    bodies = {case.get("name"): "".join(case.itertext()) for case in junit.iter("testcase")}
    assert bodies["bad_fraction"].splitlines()[-1] == "… and 3 more"  # 50 listed
    assert len(bodies["bad_fraction"].splitlines()) == 51


# 4. an empty split is a warning --------------------------------------------------------------------------

def test_an_empty_split_that_was_asked_for_is_a_warning_in_validate_and_build(tmp_path: Path) -> None:
    seed, ratios = 3, {"train": 0.9, "valid": 0.1}  # test: ratio 0, so an empty test is what the job says
    rows: list[tuple[str, np.ndarray | None, str]] = [
        (f"p{i}.png", photo(i), entity) for i, entity in enumerate(entities_in("train", ratios, seed, 4) * 2)]
    job = photo_job(tmp_path, rows, split={"by": "entity", "seed": seed, "ratios": ratios})
    code, output, report, junit = validate(job)
    assert code == 0, output  # a warning does not fail the check
    assert report["passed"] is True and report["splits"]["valid"]["samples"] == 0
    jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry()).validate(report)
    (warning,) = [w for w in report["warnings"] if w["code"] == "empty_split"]
    assert warning["split"] == "valid"
    # what the stages warned of as they ran is in the report too, for a CI step that reads it
    (shares,) = [w for w in report["warnings"] if w["code"] == "split_shares"]
    assert shares["message"].startswith("split shares train 100%, valid 0%") and shares["message"] in output
    message = warning["message"]
    assert message.startswith("split valid has 0 samples (ratios train 0.9, valid 0.1, test 0; 4 entities in all)")
    assert "split.ratios" in message and "split.seed" in message and "entities" in message
    assert f"  warning: {message}" in output.splitlines()
    assert "split test" not in output
    case = next(c for c in junit.iter("testcase") if c.get("name") == "empty_splits")
    assert case.find("failure") is None and junit.get("failures") == "0"
    assert f"warning: {message}" in "".join(case.itertext())

    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert built.exit_code == 0, built.output
    assert f"  warning: {message}" in built.output.splitlines()
    assert "split test" not in built.output


def test_an_empty_time_split_names_its_cutoff(tmp_path: Path) -> None:
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"p{i}.png", photo(i), f"E{i}") for i in range(4)]
    job = photo_job(tmp_path, rows, split={"by": "time", "cutoffs": {"valid": "2025-01-01"}},
                    times=["2024-01-01", "2024-02-01", "2024-03-01", "2024-04-01"])
    code, output, report, _ = validate(job, "--quick")
    assert code == 0, output
    assert [w["split"] for w in report["warnings"]] == ["valid"]  # test has no cutoff: it asked for nothing
    assert report["warnings"][0]["message"].startswith("split valid has 0 samples (by time, cutoffs valid "
                                                       "2025-01-01")
    assert "split.cutoffs" in report["warnings"][0]["message"]


def test_no_warning_when_every_split_that_asked_got_samples(tmp_path: Path) -> None:
    seed, ratios = 3, {"train": 0.5, "valid": 0.5}
    entities = entities_in("train", ratios, seed, 2) + entities_in("valid", ratios, seed, 2)
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"p{i}.png", photo(i), e) for i, e in enumerate(entities)]
    code, output, report, _ = validate(photo_job(tmp_path, rows, split={"by": "entity", "seed": seed,
                                                                         "ratios": ratios}))
    assert code == 0, output
    assert report["warnings"] == [] and "warning" not in output


# 7. the summary says what the report and the bad-sample file hold ---------------------------------------

def test_the_summary_describes_the_report_as_it_is_in_each_phi_mode(tmp_path: Path) -> None:
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"ok{i}.png", photo(i), f"E{i}") for i in range(6)]
    rows.append(("broken_Jane_Doe.png", None, "E9"))
    outputs: dict[str, tuple[str, str, str]] = {}
    reports: dict[str, str] = {}
    for mode, key in (("keep", ""), ("pseudonymize", "f0" * 32)):
        job = photo_job(tmp_path / mode, rows, split={"by": "entity"}, max_bad=0.5)
        doc = yaml.safe_load(job.read_text())
        doc["phi"] = {"mode": mode}
        job.write_text(yaml.safe_dump(doc))
        result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"],
                                    env={"PACKER_PHI_KEY": key})
        assert result.exit_code == 0, result.output
        (version,) = (tmp_path / mode / "out" / "photos").glob("*/manifest.json")
        outputs[mode] = (result.output, (version.parent / "report.html").read_text(),
                         (version.parent / "bad_samples.jsonl").read_text())
        again = CliRunner().invoke(main, ["report", str(version.parent), "-o", str(tmp_path / f"{mode}.html")])
        assert again.exit_code == 0, again.output
        reports[mode] = again.output.strip()
    for mode, (summary, html, jsonl) in outputs.items():
        report_line = next(line for line in summary.splitlines() if line.startswith("  report "))
        shows = report_line.rsplit("open in a browser; ", 1)[1].rstrip(")")
        # `packer report` and the report's own footer say what the build summary says
        assert reports[mode].endswith(f"; {shows})") and f"This report: {shows}." in html
        bad_line = next(line for line in summary.splitlines() if line.startswith("  bad       "))
        assert "broken_Jane_Doe.png" in jsonl and bad_line.endswith("(local only: raw paths and messages of the "
                                                                    "bad files)")
        if mode == "pseudonymize":  # the report names bad samples by sample id only
            assert "broken_Jane_Doe" not in html
            assert report_line.endswith("(open in a browser; pseudonymized: bad samples by sample id, no raw paths)")
            assert "lists bad-sample paths" not in summary
        else:
            assert "broken_Jane_Doe.png" in html
            assert report_line.endswith("local only: lists bad-sample paths)")


def test_the_progress_counts_and_the_first_line_add_up_to_the_summarys_bad_samples(tmp_path: Path) -> None:
    """Files refused while listing (a table row without its file) never reach the pixel pass:
    the first line counts them, so that it and the progress line's "bad" add up to the summary."""
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"ok{i}.png", photo(i), f"E{i}") for i in range(6)]
    rows.append(("empty.png", None, "E8"))
    job = photo_job(tmp_path, rows, split={"by": "entity"}, max_bad=0.5)
    table = tmp_path / "raw" / "labels.csv"
    table.write_text(table.read_text() + "gone.png,a,E9,2024-01-01\n")
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("packer: photos: 8 input files (1 bad before decoding: missing_file 1), running on ")
    process = re.search(r"^ process: 7/7 files .* bad (\d+) ", result.output, flags=re.M)
    summary = re.search(r"bad samples: (\d+) of 8 files", result.output)
    assert process is not None and summary is not None, result.output
    assert 1 + int(process[1]) == int(summary[1]) == 2


# 8. a dataset of several shapes says so in the build summary ---------------------------------------

def test_a_source_of_several_sizes_is_a_warning_that_names_its_shapes_and_the_fixes(tmp_path: Path) -> None:
    # torch's default collate (the README's first loader) fails on them naming no sample
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"p{i}.png", photo(i), f"E{i}") for i in range(4)]
    job = photo_job(tmp_path, rows, split={"by": "entity", "ratios": {"train": 1.0}})
    doc = yaml.safe_load(job.read_text())
    del doc["transform"]["image"]["size"]
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    cv2.imwrite(str(tmp_path / "raw" / "p3.png"), cv2.resize(photo(3), (40, 30)))
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert built.exit_code == 0, built.output
    (warning,) = [line for line in built.output.splitlines() if "shapes" in line]
    assert warning.startswith("  warning: source raw packs samples of 2 shapes (3×30×40, 3×48×64)")
    assert "transform.<kind>.size" in warning and 'collate="list"' in warning

    doc["transform"]["image"]["size"] = [32, 32]  # one shape: no warning
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert built.exit_code == 0 and "warning" not in built.output, built.output


@pytest.mark.parametrize("shapes, expected", [
    ({"ct": [[2, 64, 64]]}, []),
    ({"ct": [[2, 64, 64]], "photos": [[2, 64, 64]]}, []),
    ({"brats": [[1, 8, 16, 16], [2, 8, 16, 16]]},
     ["source brats packs samples of 2 shapes (1×8×16×16, 2×8×16×16), which no batch can stack: make them one "
      "channel count with transform.channels"]),
    ({"ct": [[2, 64, 64]], "photos": [[3, 64, 64]]},
     ["the sources' samples have different shapes (ct 2×64×64, photos 3×64×64), which no batch can stack: load one "
      "source at a time (ShardDataset(..., sources=[...]))"]),
    ({"photos": [[3, n, n] for n in range(10, 16)]},
     ["source photos packs samples of 6 shapes (3×10×10, 3×11×11, 3×12×12, 3×13×13 and 2 more), which no batch can "
      "stack: give the kind a size"]),
    # a 2-D source beside a volume source of as many channels: no channel count makes them one
    ({"photos": [[3, 32, 32]], "vol": [[3, 3, 32, 32]]},
     ["the sources' samples have different shapes (photos 3×32×32, vol 3×3×32×32), which no batch can stack: load "
      "one source at a time (ShardDataset(..., sources=[...])), or batch them with make_loader(..., "
      'collate="list")']),
    ({"a": [[3, 32, 32]], "b": [[3, 48, 48]]},
     ["the sources' samples have different shapes (a 3×32×32, b 3×48×48), which no batch can stack: load one "
      "source at a time (ShardDataset(..., sources=[...])), give every source one size, or batch"]),
])
def test_several_shapes_warns_per_source_with_the_fix_that_fits(shapes: dict[str, list[list[int]]],
                                                                  expected: list[str]) -> None:
    from packer.pipeline.sampletable import several_shapes

    everything = {tuple(s) for listed in shapes.values() for s in listed}
    schema = {"shape": list(next(iter(everything))) if len(everything) == 1 else None, "shapes": shapes}
    warnings = several_shapes(schema)
    assert len(warnings) == len(expected)
    for warning, start in zip(warnings, expected, strict=True):
        assert warning.startswith(start), warning


def test_volumes_of_several_sizes_are_told_the_volume_size_and_the_list_collate_only() -> None:
    # transform.<kind>.size is a config error for a volume ("a volume's size and spacing are 3-D") and
    # collate="pad" pads only C×H×W images: a warning that offers either sends the user to a dead end
    from packer.pipeline.sampletable import several_shapes

    (warning,) = several_shapes({"shape": None, "shapes": {"ct": [[1, 4, 32, 40], [1, 4, 48, 24]]}})
    assert warning.startswith("source ct packs samples of 2 shapes (1×4×32×40, 1×4×48×24), which no batch can stack: "
                              "give the volumes one size with sample: {volume: {size: [D, H, W]}}"), warning
    assert "transform.<kind>.size" not in warning and 'collate="pad"' not in warning
    assert 'collate="list"' in warning


@pytest.mark.parametrize("where", ["too-long", "proc"])
def test_an_output_folder_that_cannot_be_made_exits_6_naming_it(tmp_path: Path, where: str) -> None:
    """--out under /proc (mkdir: ENOENT) or with a name over NAME_MAX: a traceback, exit 1 (a
    bug), from the existence checks or from the staging folder after the lock was skipped."""
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this machine")
    job = photo_job(tmp_path, [(f"ok{i}.png", photo(i), f"E{i}") for i in range(4)], split={"by": "entity"})
    out = tmp_path / ("r" * 300) if where == "too-long" else Path("/proc/packer-test-out")
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--out", str(out)])
    assert result.exit_code == 6, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert "the output folder cannot be made there" in result.output or "cannot write" in result.output


# 9. a report path the file system refuses ------------------------------------------------------------

@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_a_report_path_that_cannot_be_created_exits_6_naming_the_path_and_the_option(tmp_path: Path,
                                                                                    option: str) -> None:
    """A name the file system refuses (over NAME_MAX here; /proc or a name with ':' on a network
    share fail the same way) is the path's fault: exit 6 with the path and the option to change,
    after the summary, never an internal error's traceback."""
    job = photo_job(tmp_path, [(f"ok{i}.png", photo(i), f"E{i}") for i in range(4)], split={"by": "entity"})
    target = tmp_path / ("r" * 300 + ".out")
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", option, str(target)])
    assert result.exit_code == 6, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert f"packer: error: cannot write {target}: File name too long; give {option} a path in a writable folder" \
        in result.output
    assert "result: clean" in result.output  # the check ran and said so first


# 10. a report of a manifest without its version folder ----------------------------------------------

def test_a_report_or_verify_of_a_registry_copy_is_refused_and_names_the_version_folder(tmp_path: Path) -> None:
    """A registry copy (manifests/<name>/<version>.json) has no index nor shards beside it: a
    report of it would be an empty page with exit 0, and verify listed every file as missing (exit
    5) before saying, last, what to pass. Both refuse it at once (exit 2), with one count of the
    files it lists; a diff against it compares config and versions only and says so, not "no
    differences"; a lone manifest.json is a version with every file missing (exit 5)."""
    job = photo_job(tmp_path, [(f"ok{i}.png", photo(i), f"E{i}") for i in range(4)], split={"by": "entity"})
    assert CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"]).exit_code == 0
    (version,) = (tmp_path / "out" / "photos").glob("*/manifest.json")
    copy = tmp_path / "registry" / f"{version.parent.name}.json"
    copy.parent.mkdir()
    copy.write_bytes(version.read_bytes())
    refused = CliRunner().invoke(main, ["report", str(copy), "-o", str(tmp_path / "r.html")])
    assert refused.exit_code == 2, refused.output
    assert "none of the" in refused.output and "pass the version folder" in refused.output
    assert not (tmp_path / "r.html").exists()
    assert CliRunner().invoke(main, ["report", str(version.parent), "-o", str(tmp_path / "r.html")]).exit_code == 0
    checked = CliRunner().invoke(main, ["verify", str(copy)])
    assert checked.exit_code == 2, checked.output
    assert "FAIL" not in checked.output and "nothing here to verify" in checked.output
    count = re.search(r"none of the (\d+) files", refused.output)
    assert count is not None and f"none of the {count.group(1)} files" in checked.output  # one way of counting
    assert f"/{version.parent.name}/" in checked.output  # the version folder to pass instead
    compared = CliRunner().invoke(main, ["diff", str(copy), str(version.parent)])
    assert compared.exit_code == 0, compared.output
    assert "samples not compared" in compared.output
    assert "  no differences\n" not in compared.output + "\n"
    assert "no differences in config or library versions" in compared.output
    alone = tmp_path / "alone" / version.parent.name
    alone.mkdir(parents=True)
    (alone / "manifest.json").write_bytes(version.read_bytes())
    assert CliRunner().invoke(main, ["verify", str(alone)]).exit_code == 5  # a version whose files are all gone


# 11. class names that differ only in case -------------------------------------------------------------

def test_classes_that_differ_only_in_case_are_a_warning_in_validate_and_build(tmp_path: Path) -> None:
    """A table typed by several people holds 'a' and 'A ': two classes to packer, rarely meant."""
    rows: list[tuple[str, np.ndarray | None, str]] = [(f"p{i}.png", photo(i), f"E{i}") for i in range(6)]
    job = photo_job(tmp_path, rows, split={"by": "entity"})
    table = tmp_path / "raw" / "labels.csv"
    lines = table.read_text().splitlines()
    lines[1] = lines[1].replace(",a,", ",A ,", 1)  # the first photo's class, typed differently
    table.write_text("\n".join(lines) + "\n")
    code, output, report, _ = validate(job)
    assert code == 0, output
    (warning,) = [w for w in report["warnings"] if w["code"] == "labels"]
    assert warning["message"].startswith("classes that differ only in case or spacing are separate classes: 'A' and "
                                         "'a'") or "'A ' and 'a'" in warning["message"], warning["message"]
    assert "labels:" in warning["message"] and warning["message"] in output
    # the map it offers builds as written: every class named, its column given (the hint said
    # "label: {map: {...}}": without a column a config error, with one every other class unknown)
    offered = re.search(r"the source's label: (\{column: .*?\}\})", warning["message"])
    assert offered, warning["message"]
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["label"] = yaml.safe_load(offered.group(1))
    mapped = tmp_path / "mapped.yaml"
    mapped.write_text(yaml.safe_dump(doc))
    code, output, report, _ = validate(mapped)
    assert code == 0 and report["bad_samples"]["total"] == 0, output
    assert not [w for w in report["warnings"] if w["code"] == "labels"], output
    doc = yaml.safe_load(job.read_text())
    doc["labels"] = ["a", "A", "b"]  # listed: the job says they are three
    job.write_text(yaml.safe_dump(doc))
    code, output, report, _ = validate(job)
    assert code == 0 and not [w for w in report["warnings"] if w["code"] == "labels"], output


@pytest.mark.parametrize(("cells", "label"), [
    (["a|b", "A", "a", "b|c", "No Finding", "c"],
     {"kind": "multilabel", "column": "label", "map": {"No Finding": None}}),  # NIH-style names, a token map
    (["x;y", "X", "x", "y", "z;X", "y"], {"kind": "multilabel", "column": "label", "separator": ";"}),
    (["c", "k", "d", "c", "k", "d"], {"column": "label", "map": {"c": "Cat", "k": "cat", "d": "dog"}}),
])
def test_the_label_a_twin_warning_offers_builds_as_written_keeping_the_targets_settings(
        tmp_path: Path, cells: list[str], label: dict[str, Any]) -> None:
    """The offered label: dropped kind: multilabel (every multi-name cell then unknown_label) and
    the source's own map, and keyed a class map by the mapped names instead of the cells (every
    sample unknown_label). Applied as written it must pack every sample, the twins as one."""
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(len(cells))], split={"by": "entity"})
    table = tmp_path / "raw" / "labels.csv"
    lines = table.read_text().splitlines()
    table.write_text("\n".join([lines[0], *(line.replace(",a,", f",{cell},", 1).replace(",b,", f",{cell},", 1)
                                           for line, cell in zip(lines[1:], cells, strict=True))]) + "\n")
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["label"] = label
    job.write_text(yaml.safe_dump(doc))
    code, output, report, _ = validate(job)
    (warning,) = [w for w in report["warnings"] if w["code"] == "labels"]
    offered = re.search(r"the source's label: (\{.*?\}\})", warning["message"])
    assert code == 0 and offered, warning["message"]
    doc["sources"][0]["label"] = yaml.safe_load(offered.group(1))
    assert {k: v for k, v in doc["sources"][0]["label"].items() if k != "map"} == {
        k: v for k, v in label.items() if k != "map"}, offered.group(1)
    job.write_text(yaml.safe_dump(doc))
    code, output, report, _ = validate(job)
    assert code == 0 and report["bad_samples"]["total"] == 0, output
    assert not [w for w in report["warnings"] if w["code"] == "labels"], output


def test_demo_data_under_a_file_names_the_file_instead_of_a_traceback(tmp_path: Path) -> None:
    """DIRECTORY is made with its folders; a file standing where one must be is the user's path
    (exit 2, naming it), not an internal error (exit 1, NotADirectoryError)."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    result = CliRunner().invoke(main, ["demo-data", str(blocker / "demo-raw")])
    assert result.exit_code == 2, result.output
    assert f"{blocker} is a file, not a folder" in result.output and "Traceback" not in result.output
    assert blocker.read_text() == "x"


def test_class_ids_written_two_ways_are_a_warning() -> None:
    """A pandas-written column with a blank cell turns 1 into '1.0': '1' and '1.0' are then two
    classes (and two label indices) of one class id."""
    from packer.config import parse_job
    from packer.pipeline.stages import case_twins_warning

    job = parse_job({"name": "j", "sources": [{"kind": "image", "root": ".", "table": "t.csv"}],
                     "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"},
                    Path("job.yaml"))
    warning = case_twins_warning(job, ["1", "1.0", "0", "2"])
    assert warning is not None and warning.startswith(
        "classes that differ only in case, spacing or how a number is written are separate classes: '1' and '1.0'")
    assert case_twins_warning(job, ["1", "0", "10"]) is None


def test_a_multilabel_twin_warning_maps_the_twins_alone() -> None:
    """A multi-label map keeps the tokens it does not name, so the offered map names the twins
    alone (a class map must name every class)."""
    from packer.config import parse_job
    from packer.pipeline.stages import case_twins_warning

    job = parse_job({"name": "j", "sources": [{"kind": "image", "root": ".", "table": "t.csv",
                                               "label": {"kind": "multilabel", "column": "findings"}}],
                     "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"},
                    Path("job.yaml"))
    warning = case_twins_warning(job, ["Effusion|Mass", "effusion", "Effusion", "Mass"])
    assert warning is not None
    assert "label: {kind: multilabel, column: findings, map: {Effusion: Effusion, effusion: Effusion}}" in warning, \
        warning
    assert "names every class" not in warning


def test_class_names_that_differ_only_in_unicode_form_are_a_warning() -> None:
    """café as one code point (NFC) and as e + a combining accent (NFD: a macOS folder name)
    print the same in the summary, the manifest and the report, and were two classes unwarned."""
    import unicodedata

    from packer.config import parse_job
    from packer.pipeline.stages import case_twins_warning

    job = parse_job({"name": "j", "sources": [{"kind": "image", "root": ".", "label": "folder"}],
                     "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"},
                    Path("job.yaml"))
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    warning = case_twins_warning(job, [nfc, nfd, "tea"])
    assert warning is not None and f"{nfd!r} and {nfc!r}" in warning and "Unicode form" in warning
    assert case_twins_warning(job, [nfc, "tea"]) is None


def test_multilabel_names_that_differ_only_in_case_are_a_warning_too() -> None:
    """NIH-style pipe-separated findings typed by hand hold 'Effusion' and 'effusion': two
    positions of the multi-hot vector, which the README says the build warns of; only a class
    target was checked. Numbers are a numeric target's values, never class names."""
    from packer.config import parse_job
    from packer.pipeline.stages import case_twins_warning

    def job(label: dict[str, object]) -> object:
        return parse_job({"name": "j", "sources": [{"kind": "image", "root": ".", "table": "t.csv", "label": label}],
                          "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"},
                         Path("job.yaml"))

    multi = job({"kind": "multilabel", "column": "findings"})
    warning = case_twins_warning(multi, ["Effusion|Mass", "effusion", "Mass"])  # type: ignore[arg-type]
    assert warning is not None and "'Effusion' and 'effusion'" in warning, warning
    assert case_twins_warning(multi, ["Effusion|Mass", "Mass"]) is None  # type: ignore[arg-type]
    numeric = job({"kind": "numeric", "column": "age"})
    assert case_twins_warning(numeric, ["1", "1.0"]) is None  # type: ignore[arg-type]


def test_a_chexpert_column_read_as_classes_warns_that_minus_one_is_uncertain_there(tmp_path: Path) -> None:
    """CheXpert's table writes 1.0, 0.0 and -1.0 (uncertain) per finding. Read as a class column
    (``label: {column: Pneumonia}``), -1.0 is a third class; ``packer validate`` says so and how
    to read it as uncertain. Not for other class ids, nor when the job lists its classes."""
    import cv2
    import numpy as np

    from packer.config import parse_job
    from packer.pipeline.stages import uncertain_class_warning

    root = tmp_path / "CheXpert-v1.0-small"
    rows = ["Path,Sex,Pneumonia"]
    for i, value in enumerate(["1.0", "0.0", "-1.0", "0.0", "1.0", "-1.0"]):
        rel = f"train/patient{i:05d}/study1/view1_frontal.jpg"
        (root / rel).parent.mkdir(parents=True)
        pixels = np.random.default_rng(i).integers(0, 255, (32, 32), dtype=np.uint8)
        assert cv2.imwrite(str(root / rel), pixels)
        rows.append(f"{rel},Female,{value}")
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    doc = {"name": "chexpert", "sources": [{"kind": "image", "root": str(root), "table": {
        "file": str(root / "train.csv"), "path": "Path"}, "entity": {"path": "(?P<entity>patient[0-9]+)/"},
        "label": {"column": "Pneumonia"}}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
        "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "o")}
    job_path = tmp_path / "job.yaml"
    job_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["validate", str(job_path), "--scheduler", "sync", "-q"])
    assert result.exit_code == 0, result.output
    assert ("class '-1.0' is a class of its own beside '0.0', '1.0': tables in CheXpert's convention (CheXpert, "
            "MIMIC-CXR) write -1.0 for an uncertain finding. To read it as uncertain, make 'Pneumonia' a multilabel "
            "target (label: {kind: multilabel, columns: [Pneumonia], uncertain: ones | zeros | ignore})"
            in " ".join(result.output.split()))
    job = parse_job(doc, job_path)
    assert uncertain_class_warning(job, ["0", "1", "2"]) is None  # class ids
    assert uncertain_class_warning(job, ["-1", "1"]) is not None
    assert uncertain_class_warning(job, ["-1", "-2", "0"]) is None  # a scale, not the convention
    assert uncertain_class_warning(parse_job({**doc, "labels": ["0.0", "1.0", "-1.0"]}, job_path),
                                   ["-1.0", "0.0", "1.0"]) is None


def test_a_class_column_of_ids_or_run_length_masks_warns() -> None:
    """SIIM-ACR's train-rle.csv read as a class column (label: {column: ' EncodedPixels'}) gave
    every image its run-length string as a class of its own, as many classes as images, without a
    word; an id column read as classes does the same. Real classes, however many, do not warn."""
    import numpy as np

    from packer.config import parse_job
    from packer.pipeline.stages import id_like_class_warning

    job = parse_job({"name": "j", "sources": [{"kind": "image", "root": ".", "table": "t.csv"}],
                     "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"},
                    Path("job.yaml"))
    rle = [f"{100 + i} 5 {900 + i} 7 {1500 + i} 3" for i in range(30)] + ["-1"]
    codes = np.array([*range(30), 30, 30, 30], dtype=np.int32)  # 30 images one mask each, 3 with none
    warning = id_like_class_warning(job, codes, rle)
    assert warning is not None and warning.startswith("31 classes for 33 samples, 30 of them held by one sample each; "
                                                      "30 of them read as run-length encoded pixels")
    ids = [f"patient{i:04d}" for i in range(40)]
    assert "the column holds an id or a note" in str(id_like_class_warning(job, np.arange(40, dtype=np.int32), ids))
    classes = [f"class{i}" for i in range(25)]
    assert id_like_class_warning(job, np.repeat(np.arange(25, dtype=np.int32), 4), classes) is None


def test_a_source_whose_every_file_is_bad_is_a_warning_naming_it_in_validate_and_build(tmp_path: Path) -> None:
    # a job that mixes sources, one of which is entirely broken (a cut download), built with exit 0
    # within max_bad_fraction: the bad files were listed, but nothing said that a whole source, and with
    # it its classes, was missing from the dataset
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(4)], split={"by": "entity",
                    "ratios": {"train": 1.0}}, max_bad=0.5)
    broken = tmp_path / "scans" / "cat"
    broken.mkdir(parents=True)
    ok, encoded = cv2.imencode(".png", photo(9))
    for i in range(2):
        (broken / f"s{i}.png").write_bytes(encoded.tobytes()[:200])  # cut short
    doc = yaml.safe_load(job.read_text())
    doc["sources"].append({"kind": "image", "name": "scans", "root": "scans", "label": "folder"})
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    said = "source 'scans' packed no sample: every one of its 2 files is a bad sample (truncated 2)"

    code, output, report, _ = validate(job)
    assert code == 0, output
    (warning,) = [w for w in report["warnings"] if w["code"] == "sources"]
    assert warning["message"].startswith(said), warning
    jsonschema.Draft202012Validator(load_schema("validate"), registry=schema_registry()).validate(report)
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert built.exit_code == 0, built.output
    assert f"packer: warning: photos: {said}" in built.output, built.output
    assert "source 'raw'" not in built.output and "source 'photos'" not in built.output


def test_a_misspelt_word_where_a_word_or_a_mapping_is_taken_names_the_closest_word_and_what_is_taken(
        tmp_path: Path) -> None:
    # label: foldr said only "'foldr' is not valid under any of the given schemas"
    doc = demo_doc()
    doc["sources"][1]["label"] = "foldr"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["validate", str(job)])
    assert result.exit_code == 2
    assert ("the source at '../demo-raw/photos', sources[1].label: 'foldr' is not valid under any of the given "
            "schemas (did you mean 'folder'?)") in result.output, result.output
    assert "'none': unlabeled. 'folder': the first path component under root is the class" in result.output


def test_a_schema_error_inside_a_source_says_which_source_it_is(tmp_path: Path) -> None:
    # "sources[3].label: ..." made the user count the job's sources; the name, else the root, says which
    doc = demo_doc()
    doc["sources"][0]["name"] = "chest ct"
    doc["sources"][0]["pack_me"] = True
    doc["sources"][1]["label"] = 7
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["validate", str(job)])
    assert result.exit_code == 2
    assert "the source at '../demo-raw/photos', sources[1].label: 7 is not valid" in result.output, result.output
    del doc["sources"][1]["label"]
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(main, ["validate", str(job)])
    assert "unknown key 'pack_me'" in result.output or "pack_me" in result.output, result.output


def test_a_source_whose_every_file_is_filtered_out_is_a_warning_that_says_only_that(tmp_path: Path) -> None:
    # the warning for a source of left-out files read "its 2 files are bad (none) or left out on purpose"
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(4)], split={"by": "entity",
                    "ratios": {"train": 1.0}})
    other = tmp_path / "other"
    other.mkdir()
    rows = ["path,label,entity,site"]
    for i in range(2):
        cv2.imwrite(str(other / f"o{i}.png"), photo(20 + i))
        rows.append(f"o{i}.png,a,F{i},B")
    (other / "labels.csv").write_text("\n".join(rows) + "\n")
    doc = yaml.safe_load(job.read_text())
    doc["sources"].append({"kind": "image", "name": "other", "root": "other", "table": "other/labels.csv",
                           "where": {"site": "A"}})
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, output, report, _ = validate(job)
    assert code == 0, output
    (warning,) = [w for w in report["warnings"] if w["code"] == "sources"]
    assert warning["message"].startswith("source 'other' packed no sample: every one of its 2 files is left out on "
                                         "purpose (filtered 2)"), warning
