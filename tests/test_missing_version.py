"""A version path that does not exist (a mistyped or removed version) is a usage error (exit 2)
whose message names the path and the fix: the versions its dataset folder does hold. Every
command that takes a version (inspect, verify, report, bench-loader, diff) says so, not only
click's bare "does not exist"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from tests.helpers import demo_job_doc, write_job


@pytest.fixture(scope="module")
def version(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("missing-version")
    job = load_job(write_job(tmp / "job", demo_job_doc(demo_raw.root, tmp / "out")))
    return build(job, BuildOptions(scheduler="sync", quiet=True)).version_dir


@pytest.mark.parametrize("command", [["inspect"], ["verify"], ["verify", "--deep"], ["report"],
                                     ["bench-loader", "--seconds", "0.1"], ["diff", "OTHER"], ["diff", "OTHER", "-"]])
def test_a_missing_version_names_the_versions_its_dataset_folder_holds(version: Path, command: list[str]) -> None:
    missing = version.parent / "0123456789ab"
    args = [str(version) if a == "OTHER" else a for a in command]
    if args[-1] == "-":     # the missing version as diff's NEW
        args[-1] = str(missing)
    else:
        args.append(str(missing))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"{missing}: no such file or folder" in result.output
    assert f"it holds the version(s) {version.name}" in result.output
    assert f"pass one of them, e.g. the newest, {version}" in result.output
