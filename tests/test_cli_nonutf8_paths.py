"""Commands on a dataset whose path is not valid UTF-8: an output folder under a Latin-1 name
(``r\\xe9s``, the byte 0xE9, as an old NFS export has), which Python holds as the lone surrogate
``\\udce9`` (PEP 383). Every ``--json`` output is a UTF-8 JSON document (RFC 8259 §8.1) that
names such a byte ``\\udce9`` (as ``packer gc``/``verify`` and ``packer locate`` do, and
``os.fsencode(json.loads(...))`` gives the name's bytes back), and verify, diff and build work
on such a folder instead of dying with a UnicodeEncodeError traceback (exit 1)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner, Result

from packer.cli import main
from tests.helpers import write_job


def _job_doc(tmp: Path, output: Path) -> dict[str, Any]:
    return {"name": "t",
            "sources": [{"kind": "image", "root": str(tmp / "raw"), "table": str(tmp / "raw" / "labels.csv")}],
            "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
            "transform": {"image": {"size": [16, 16], "color": "gray"}},
            "pack": {"format": "webdataset", "max_samples": 4}, "output": str(output)}


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def strict_json(result: Result) -> Any:
    """The command's stdout as a strict reader (jq, a UTF-8 decoder) takes it."""
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout_bytes.decode("utf-8"))


@pytest.fixture(scope="module")
def latin1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the job, a dataset folder under ``<tmp>/r\\xe9s/out/``, the job's folder ``<tmp>``)."""
    tmp = tmp_path_factory.mktemp("nonutf8")
    rows = []
    for i in range(8):
        rel = f"P{i // 2}/img{i}.png"
        (tmp / "raw" / rel).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(tmp / "raw" / rel), np.random.default_rng(i).integers(0, 255, (16, 16), dtype=np.uint8))
        rows.append(f"{rel},{['a', 'b'][i % 2]},P{i // 2}")
    (tmp / "raw" / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows) + "\n")
    job = write_job(tmp, _job_doc(tmp, tmp / "out"))
    built = cli("build", job, "--scheduler", "sync", "-q", "--no-report")
    assert built.exit_code == 0, built.output
    latin = os.fsencode(tmp) + b"/r\xe9s"
    os.mkdir(latin)
    os.rename(os.fsencode(tmp / "out"), latin + b"/out")
    return job, Path(os.fsdecode(latin + b"/out/t")), tmp


def _version(dataset: Path) -> Path:
    (version,) = (p for p in dataset.iterdir() if (p / "manifest.json").is_file())
    return version


def test_inspect_json_names_the_latin1_byte_as_its_escape_in_a_utf8_document(latin1: tuple[Path, Path, Path]) -> None:
    _, dataset, _ = latin1
    version = _version(dataset)
    result = cli("inspect", version, "--json")
    assert b"\xe9" not in result.stdout_bytes
    assert b"r\\udce9s" in result.stdout_bytes     # the escape, as gc --json and locate print it
    summary = strict_json(result)
    assert any(os.fsencode(v).endswith(b"/r\xe9s/out/t/" + version.name.encode() + b"/manifest.json")
               for v in _strings(summary)), "no field names the manifest's path"


def test_ls_json_of_the_dataset_folder_is_utf8_json_with_its_stray_latin1_entry(
        latin1: tuple[Path, Path, Path]) -> None:
    _, dataset, _ = latin1
    stray = os.fsencode(dataset) + b"/caf\xe9"
    os.mkdir(stray)
    try:
        listing = strict_json(cli("ls", dataset, "--json"))
    finally:
        os.rmdir(stray)
    names = [os.fsencode(s) for s in _strings(listing)]
    assert any(n.endswith(b"/r\xe9s/out/t") or n.endswith(b"/r\xe9s/out/t/") for n in names)
    assert any(n.endswith(b"caf\xe9") for n in names), f"the stray entry is not listed: {listing}"


def test_a_utf8_name_stays_readable_utf8_in_ls_json(latin1: tuple[Path, Path, Path]) -> None:
    _, dataset, _ = latin1
    (dataset / "café").mkdir()
    try:
        result = cli("ls", dataset, "--json")
    finally:
        (dataset / "café").rmdir()
    assert "café".encode() in result.stdout_bytes  # as itself, not \u00e9
    assert any(s.endswith("café") for s in _strings(strict_json(result)))


def test_diff_json_of_a_latin1_version_with_itself_is_empty_utf8_json(latin1: tuple[Path, Path, Path]) -> None:
    _, dataset, _ = latin1
    version = _version(dataset)
    diff = strict_json(cli("diff", version, version, "--json"))
    assert diff["empty"] is True and diff["samples"]["compared"] is True


def test_verify_reads_the_index_of_a_version_under_a_latin1_folder(latin1: tuple[Path, Path, Path]) -> None:
    _, dataset, _ = latin1
    result = cli("verify", _version(dataset), "--json")
    report = strict_json(result)
    assert report["ok"] is True, report


def test_build_out_under_a_latin1_folder_builds_there(latin1: tuple[Path, Path, Path]) -> None:
    from packer.api import run_build
    from packer.config import load_job

    job, dataset, _ = latin1
    out = Path(os.fsdecode(os.fsencode(dataset.parent.parent) + b"/out2"))
    result = run_build(load_job(job), out=out, scheduler="sync", progress=False, report=True)
    assert result.version_dir.parent == out / "t" and result.version_dir.name == _version(dataset).name
    assert strict_json(cli("verify", result.version_dir, "--json"))["ok"] is True
    assert (result.version_dir / "report.html").is_file()


def test_a_parquet_version_under_a_latin1_folder_builds_rebuilds_verifies_and_diffs(
        latin1: tuple[Path, Path, Path]) -> None:
    from packer.api import run_build
    from packer.config import load_job

    _, dataset, tmp = latin1
    out = Path(os.fsdecode(os.fsencode(dataset.parent.parent) + b"/out3"))
    doc = _job_doc(tmp, tmp / "unused")
    job = load_job(write_job(tmp / "parquet", {**doc, "pack": {"format": "parquet", "max_samples": 4}}))
    first = run_build(job, out=out, scheduler="sync", progress=False, report=True).version_dir
    again = run_build(job, out=out, scheduler="sync", progress=False, report=True).version_dir  # reuses first
    assert again == first and (first / "report.html").is_file()
    assert strict_json(cli("verify", first, "--deep", "--json"))["ok"] is True
    across = strict_json(cli("diff", _version(dataset), first, "--json"))   # webdataset vs parquet: pixels compared
    assert across["samples"]["compared"] is True and across["samples"]["changed"] == []


def test_the_build_cache_key_of_a_utf8_output_is_the_bytes_it_always_was(tmp_path: Path) -> None:
    import hashlib

    from packer.storage import build_cache_dir

    location = str(tmp_path / "café")
    cache = build_cache_dir("t", location, tmp_path / "cache")
    assert cache.name == "t-" + hashlib.sha256(f"{location}\nt".encode()).hexdigest()[:12]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_text_output_under_a_strict_utf8_stdout_prints_the_name_as_its_bytes(latin1: tuple[Path, Path, Path]) -> None:
    """Under en_US.UTF-8 Python prints strictly (C.UTF-8 and UTF-8 mode escape), so `packer ls`
    of a dataset under ``r\\xe9s`` ended in a UnicodeEncodeError traceback (exit 1); the name is printed
    as its own bytes, as ``ls`` prints it."""
    import subprocess
    import sys

    _, dataset, _ = latin1
    run = subprocess.run([sys.executable, "-c", "from packer.console import main; main()", "ls", dataset],
                         capture_output=True, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}, timeout=120)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert b"r\xe9s" in run.stdout and b"Traceback" not in run.stderr
