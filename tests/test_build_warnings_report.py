"""The warnings a build prints reach its HTML report.

``packer build`` prints what its stages warn of (``packer: warning: <job>: ...``); a reviewer
who reads only ``report.html`` must see the same: the build keeps them, with the code ``packer
validate --json`` gives each, in ``warnings.jsonl`` beside the shards (outside the dataset's
identity: the manifest and its ``dataset_hash`` do not change), and the report shows them at its
top, as printed (pseudonymised), escaped. A build that warns of nothing has no such file and no box.
Real DICOM files written by pydicom (tests/test_instance_uids.py's shared SOP Instance UID).
"""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.buildwarnings import WARNINGS_FILE, write_warnings
from packer.cli import main
from packer.config import load_job
from packer.htmlreport import render_html_report
from packer.manifest import read_manifest
from packer.pipeline.build import BuildOptions, build
from tests.test_instance_uids import SHARED, job_for, write_raw


class _Box(HTMLParser):
    """The text of each ``<li>`` inside the element with id ``build-warnings``, by its data-code."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # >0 inside the box
        self.found = False
        self.items: list[tuple[str, str]] = []
        self._code: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if named.get("id") == "build-warnings":
            self.found, self.depth = True, 1
            return
        if self.depth:
            self.depth += 1
            if tag == "li":
                self._code, self._text = named.get("data-code"), []

    def handle_endtag(self, tag: str) -> None:
        if not self.depth:
            return
        if tag == "li" and self._code is not None:
            self.items.append((self._code, "".join(self._text)))
            self._code = None
        self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self._code is not None:
            self._text.append(data)


def _box(html: str) -> _Box:
    parser = _Box()
    parser.feed(html)
    return parser


def test_a_shared_sop_instance_uid_warning_is_at_the_top_of_the_report_as_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_raw(tmp_path / "raw")
    job = load_job(job_for(tmp_path))
    result = build(job, BuildOptions(scheduler="sync", quiet=True))
    printed = [line.removeprefix(f"packer: warning: {job.name}: ") for line in capsys.readouterr().err.splitlines()
               if line.startswith("packer: warning: ")]
    (uid_line,) = [line for line in printed if "SOP Instance UID" in line]

    records = [json.loads(line) for line in (result.version_dir / WARNINGS_FILE).read_text().splitlines()]
    assert {"code": "instance_uids", "message": uid_line} in records
    assert [r["message"] for r in records] == printed  # every warning printed, in order, and nothing else

    html = (result.version_dir / "report.html").read_text(encoding="utf-8")
    box = _box(html)
    assert ("instance_uids", f"instance_uids {uid_line}") in box.items
    assert len(box.items) == len(records)
    assert html.index('id="build-warnings"') < html.index('id="splits"')  # at the top, in the summary
    assert "MRN" not in uid_line and SHARED not in html  # pseudonymised as printed, never the UID
    # outside the identity: the manifest does not list the file, and its hash still checks out
    manifest = read_manifest(result.version_dir, strict=True)
    assert WARNINGS_FILE not in json.dumps(manifest.data)

    again = build(job, BuildOptions(scheduler="sync", quiet=True))  # the version as it is: kept, box and all
    assert again.reused and again.version_dir == result.version_dir
    assert [json.loads(line) for line in (again.version_dir / WARNINGS_FILE).read_text().splitlines()] == records
    assert ("instance_uids", f"instance_uids {uid_line}") in _box((again.version_dir / "report.html").read_text()).items


def test_a_build_that_warns_of_nothing_has_no_warnings_file_and_no_box(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_raw(tmp_path / "raw", shared=False)
    result = build(load_job(job_for(tmp_path)), BuildOptions(scheduler="sync", quiet=True))
    assert "packer: warning:" not in capsys.readouterr().err
    assert not (result.version_dir / WARNINGS_FILE).exists()
    html = (result.version_dir / "report.html").read_text(encoding="utf-8")
    assert 'id="build-warnings"' not in html and not _box(html).found


def test_a_hostile_warning_text_is_escaped(tmp_path: Path) -> None:
    write_raw(tmp_path / "raw", shared=False)
    result = build(load_job(job_for(tmp_path)), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    payload = 'entity "x"><script>alert(1)</script><img src=x onerror=alert(2)>'
    write_warnings(result.version_dir, [("entity_lookalikes", payload)])
    html = render_html_report(result.version_dir, quiet=True)
    assert "<script>alert" not in html and "<img src=x" not in html
    assert _box(html).items == [("entity_lookalikes", f"entity_lookalikes {payload}")]


def test_a_damaged_warnings_file_is_said_in_the_report(tmp_path: Path) -> None:
    write_raw(tmp_path / "raw", shared=False)
    result = build(load_job(job_for(tmp_path)), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    (result.version_dir / WARNINGS_FILE).write_text('{"code": "nonsense", "message": "m"}\n')
    html = render_html_report(result.version_dir, quiet=True)
    assert f"{WARNINGS_FILE}, the warnings the build printed, could not be read" in html
    assert "line 1" in html


def test_the_summarys_warnings_of_the_packed_dataset_are_in_warnings_jsonl_too(tmp_path: Path) -> None:
    """A split that asked for samples and got none (the build's summary warns) was missing from
    warnings.jsonl and the report's warning box, which the README says hold every printed warning."""
    from packer.buildwarnings import read_warnings

    raw = tmp_path / "raw" / "cls"
    raw.mkdir(parents=True)
    cv2.imwrite(str(raw / "only.png"), np.random.default_rng(1).integers(0, 255, (16, 16), dtype=np.uint8))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "one", "sources": [{"kind": "image", "root": str(tmp_path / "raw"),
                                                              "label": "folder"}],
                                   "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}},
                                   "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}))
    printed = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert printed.exit_code == 0, printed.output
    (version,) = (tmp_path / "out" / "one").glob("*/manifest.json")
    recorded = read_warnings(version.parent / "warnings.jsonl")
    empty = [w.message for w in recorded if w.code == "empty_split"]
    assert len(empty) == 2 and all(f"warning: {m}" in printed.output for m in empty)
    page = (version.parent / "report.html").read_text()
    assert all(html.escape(m, quote=True) in page or m in page for m in empty)
