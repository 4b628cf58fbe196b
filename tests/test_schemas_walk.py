"""The JSON Schemas in schemas/ say what packer writes and accepts: every field a report holds is
documented there, no field names a file that is not written, and a value the schema accepts is one
the code accepts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError
from packer.files import parse_byte_size
from packer.schemas import load_schema, schema_registry
from tests.helpers import write_job


def _photo(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return cv2.resize(rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8), (32, 24), interpolation=cv2.INTER_CUBIC)


def _dated_job(tmp_path: Path, **extra: Any) -> Path:
    """Eight dated images of eight patients and one empty file (a bad sample), split by entity."""
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    lines = ["path,label,entity,timestamp"]
    for i in range(8):
        cv2.imwrite(str(raw / f"s{i}.png"), _photo(i))
        lines.append(f"s{i}.png,{'ab'[i % 2]},P{i},2024-01-0{i + 1}")
    (raw / "broken.png").write_bytes(b"")
    lines.append("broken.png,a,P9,2024-02-01")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    doc = {"name": "dated", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
           "split": {"by": "entity", "seed": 5, **extra}, "transform": {"image": {"size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "phi": {"mode": "keep", "dates": "keep"},
           "validate": {"max_bad_fraction": 0.05}}
    return write_job(tmp_path, doc)


def _validate_json(job: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    out = job.parent / f"report{'-'.join(flags)}.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out), *flags])
    assert out.is_file(), result.output
    return result.exit_code, json.loads(out.read_text())


def _documented(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a ``$ref`` into another of packer's schemas followed."""
    while "$ref" in node:
        resolved = schema_registry().resolver(base_uri=schema["$id"]).lookup(node["$ref"])
        node = resolved.contents
    return node


def test_validate_json_holds_only_documented_fields_and_names_no_file_it_did_not_write(tmp_path: Path) -> None:
    """validate --json wrote bad_samples.report: "bad_samples.jsonl", a file packer validate never
    writes, and audit.entities_per_split and audit.time_ranges, which validate.schema.json did not list."""
    job = _dated_job(tmp_path)
    schema = load_schema("validate")
    validator = jsonschema.Draft202012Validator(schema, registry=schema_registry())
    code, full = _validate_json(job)
    assert code == 3  # one bad file of nine is over max_bad_fraction 0.05
    _, quick = _validate_json(job, "--quick")
    assert quick["quick"] is True
    off_job = _dated_job(tmp_path / "off", near_duplicates={"enabled": False})
    _, off = _validate_json(off_job)
    assert any("skipped" in rule for rule in off["audit"]["rules"].values())
    for report in (full, quick, off):
        validator.validate(report)
        assert "report" not in report["bad_samples"]
        assert sum(report["audit"]["entities_per_split"].values()) == 8  # the good files' patients, each once
        assert report["audit"]["time_ranges"], "the dated samples' time ranges are reported"
        for section in ("bad_samples", "audit"):
            documented = schema["properties"][section]
            assert documented.get("additionalProperties") is False, f"{section}: an undocumented field must fail"
            for key in report[section]:
                assert key in documented["properties"], f"validate --json writes {section}.{key}, undocumented"
                assert _documented(schema, documented["properties"][key]).get("description") or key in (
                    "total", "fraction", "max_fraction", "by_reason", "by_stage", "records", "passed", "rules")
    assert not list(tmp_path.rglob("bad_samples.jsonl"))
    # a field the schema does not know fails it, in either section
    for section, field in (("bad_samples", "report"), ("audit", "surprise")):
        edited = {**full, section: {**full[section], field: "bad_samples.jsonl"}}
        assert not validator.is_valid(edited), f"{section}.{field} passed validate.schema.json"


def test_a_builds_manifest_still_names_its_bad_sample_report_which_it_wrote(tmp_path: Path) -> None:
    """Dropping bad_samples.report from validate's report leaves the build's, which the manifest
    schema requires and which names the file beside the shards."""
    job = _dated_job(tmp_path)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert result.exit_code == 3, result.output  # over max_bad_fraction: kept for its report
    (manifest_path,) = (tmp_path / "out").rglob("manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["bad_samples"]["report"] == "bad_samples.jsonl"
    assert (manifest_path.parent / "bad_samples.jsonl").is_file()
    manifest_schema, validate_schema = load_schema("manifest"), load_schema("validate")
    for key in ("entities_per_split", "time_ranges"):  # one definition, documented once, for both
        in_manifest = _documented(manifest_schema, manifest_schema["properties"]["audit"]["properties"][key])
        assert in_manifest == _documented(validate_schema, validate_schema["properties"]["audit"]["properties"][key])
        assert in_manifest["description"]



SIZES = ["1", "1B", "0.5", "0.5B", "0.9B", "1.5B", "0B", "0", "000", "0.0001KB", "0.001KB", "0.0009KB", "0.5KB",
         "0.000001MB", "0.0000009MB", "0.000000001GB", "0.0000000009GB", "0.000000000001TB", "0.0000000000009TB",
         "0.001KiB", "0.0009KiB", "0.0009765625KiB", "0.000001MiB", "0.000000001GiB", "0.000000000001TiB",
         "0.0000000000001TiB", "256MiB", "1 GB", "2.01KB", "00.5MB", "10", "0.00KB"]


def _schema_accepts_size(size: str) -> bool:
    return not list(jsonschema.Draft202012Validator(load_schema("job")["$defs"]["byte_size"]).iter_errors(size))


def _code_accepts_size(size: str) -> bool:
    try:
        return parse_byte_size(size) >= 1
    except ConfigError:
        return False


@pytest.mark.parametrize("size", SIZES)
def test_a_byte_size_the_job_schema_accepts_is_one_packer_accepts(size: str) -> None:
    """byte_size said "at least 1" but its pattern took '0.5', '0.5B', '0.9B' and '0.0001KB',
    which packer refuses as less than one byte: a CI check of job files against the schema
    passed a job that packer build then refused."""
    assert _schema_accepts_size(size) <= _code_accepts_size(size), f"{size!r}: the schema accepts, packer refuses"
    if not size.endswith("iB"):  # decimal units and bytes: the pattern is exactly the code's rule
        assert _schema_accepts_size(size) == _code_accepts_size(size), size


def test_a_binary_size_under_a_thousandth_of_its_unit_is_refused_on_load_naming_the_field(tmp_path: Path) -> None:
    """'0.0009765625KiB' is exactly one byte, but the schema's pattern (readable: a non-zero digit
    within the first 3 decimals per step of the unit) refuses a binary size under 0.001 of its unit;
    the job is checked against the schema on load, so packer refuses it too, and says where."""
    job = _dated_job(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["pack"]["max_bytes"] = "0.0009765625KiB"
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="pack.max_bytes"):
        load_job(job)
    doc["pack"]["max_bytes"] = "0.001KiB"
    job.write_text(yaml.safe_dump(doc))
    assert load_job(job).pack.max_bytes == 1  # 1.024 bytes, rounded


def test_a_byte_sizes_rounding_is_documented_where_the_schema_describes_it() -> None:
    description = load_schema("job")["$defs"]["byte_size"]["description"]
    assert parse_byte_size("1.5B") == 2 and "1.5B is 2 bytes" in description
    assert parse_byte_size("2.01KB") == 2010


@pytest.mark.parametrize("name", ["bad_sample", "excluded"])
def test_a_records_path_description_says_a_name_that_is_not_utf8_is_written_escaped(name: str) -> None:
    """A Latin-1 name's bad-sample record holds 'caf\\xe9.png' (a backslash, x, e, 9), no path on
    disk, while the schema, the record's documented source of truth, called it the raw file's path."""
    description = load_schema(name)["properties"]["path"]["description"]
    assert "not valid UTF-8" in description and "caf\\xe9.png" in description
    assert "packer locate" in description


def test_a_latin1_names_record_holds_the_escaped_text_the_schema_describes(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    for i in range(3):
        cv2.imwrite(str(raw / f"{i}.png"), _photo(i))
    open(os.path.join(os.fsencode(raw), b"caf\xe9.png"), "wb").close()  # empty: a bad sample
    doc = {"name": "esc", "sources": [{"kind": "image", "root": str(raw.parent), "label": "folder"}],
           "split": {"by": "entity"}, "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out"), "phi": {"mode": "keep"}, "validate": {"max_bad_fraction": 1}}
    _, report = _validate_json(write_job(tmp_path, doc))
    (record,) = report["bad_samples"]["records"]
    assert record["path"] == str(raw / "caf\\xe9.png")  # the byte 0xE9 as the four characters \xe9
    assert not os.path.exists(os.fsencode(record["path"]))
    located = CliRunner().invoke(main, ["locate", str(tmp_path / "job.yaml"), record["sample_id"], "-z"])
    assert located.exit_code == 0, located.output
    assert located.stdout_bytes.rstrip(b"\0").split(b"\t")[-1] == os.path.join(os.fsencode(raw), b"caf\xe9.png")
