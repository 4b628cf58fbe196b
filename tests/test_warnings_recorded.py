"""Every warning packer build prints is kept in warnings.jsonl, and packer validate lists what it prints.

README: ``warnings.jsonl`` holds the warnings the build printed, ``{code, message}`` each, as
printed and as ``packer validate --json`` lists them, and report.html shows them at its top. The
warnings the build printed before (and after) its stages ran were printed only: a
``phi.key_file`` that ``phi.mode: keep`` does not use, a build cache inside the output folder,
other versions pseudonymized with another key. A reviewer reading the report never saw them,
and ``packer validate --json`` listed none of its own ``phi`` warning, while its summary counted
the warnings "above" without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.demo import encode_photo, render_photo
from tests.test_phi_key import KEY_A, built_with_two_keys, fingerprint_of

PRINTED = "packer: warning: "


def _photo_job(tmp_path: Path, phi: dict[str, str]) -> Path:
    raw = tmp_path / "raw"
    for i in range(4):
        path = raw / f"case{i}" / "photo.png"
        path.parent.mkdir(parents=True)
        path.write_bytes(encode_photo(render_photo(np.random.default_rng(i), "circle"), ".png"))
    (tmp_path / "phi.key").write_text("c3" * 32 + "\n")
    doc = {"name": "photos", "sources": [{"kind": "image", "root": "raw", "label": "none", "entity": "path_part:0"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"image": {"size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": "out", "phi": phi}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path / "job.yaml"


def _printed(output: str) -> list[str]:
    return [line.removeprefix(PRINTED) for line in output.splitlines() if line.startswith(PRINTED)]


def _recorded(version: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (version / "warnings.jsonl").read_text().splitlines()]


def test_an_unused_key_warning_is_recorded_by_the_build_and_listed_by_validate(tmp_path: Path) -> None:
    job = _photo_job(tmp_path, {"mode": "keep", "key_file": "phi.key"})
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert built.exit_code == 0, built.output
    (printed,) = _printed(built.output)
    assert printed.startswith("phi.key_file names phi.key, but phi.mode is keep")
    (version,) = (tmp_path / "out" / "photos").glob("*/")
    assert _recorded(version) == [{"code": "phi", "message": printed}]
    assert "phi.key_file names phi.key, but phi.mode is keep" in (version / "report.html").read_text()

    checked = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q",
                                        "--json", str(tmp_path / "v.json")])
    assert checked.exit_code == 0, checked.output
    assert json.loads((tmp_path / "v.json").read_text())["warnings"] == [{"code": "phi", "message": printed}]
    summary = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync"])
    assert len(_printed(summary.output)) == 1
    assert re.search(r"result: clean; 1 warning\(s\) above", summary.output), summary.output


def test_a_build_cache_inside_the_output_folder_is_recorded_as_printed(tmp_path: Path) -> None:
    job = _photo_job(tmp_path, {"mode": "keep"})
    cache = tmp_path / "out" / "caches"
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--cache-dir", str(cache)])
    assert built.exit_code == 0, built.output
    (printed,) = _printed(built.output)
    assert "is inside the output folder" in printed
    (version,) = (tmp_path / "out" / "photos").glob("*/")
    assert _recorded(version) == [{"code": "output_folder", "message": printed}]


def test_versions_pseudonymized_with_another_key_are_recorded_in_the_new_versions_warnings(tmp_path: Path) -> None:
    _, _, second, old, new = built_with_two_keys(tmp_path)
    versions = tmp_path / "out" / "keys"
    other_key = [w for w in _recorded(versions / new) if w["code"] == "phi"]
    assert [w["message"] for w in other_key] == [p for p in _printed(second) if "pseudonymized with the PHI key" in p]
    (said,) = other_key
    assert f"version(s) {old} were pseudonymized with the PHI key of fingerprint {fingerprint_of(KEY_A)}" \
        in said["message"]
    first_recorded = _recorded(versions / old) if (versions / old / "warnings.jsonl").exists() else []
    assert not [w for w in first_recorded if w["code"] == "phi"]
