"""What packer's Python calls promise a long-lived caller (a notebook, an orchestrator's worker),
as README's "From Python" documents it: a job of the wrong type is a typed ConfigError naming
the argument, never a bare TypeError; every warning a call prints names its job, as calls on
threads or one after another in one process print theirs into the same stderr; and a job whose
every file is bad is told so, not told to reseed its split; and a call leaves the process's
environment as it found it, OpenCV's import included."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import packer
from packer import api
from packer.errors import BadFractionError, ConfigError
from packer.pipeline.split import empty_splits
from tests.helpers import REPO


@pytest.mark.parametrize("call", ["validate", "build", "run_build"])
@pytest.mark.parametrize(("job", "named"), [
    (None, "not None"),
    (5, "not an int"),
    (b"job.yaml", "not a bytes"),
    (["job.yaml"], "not a list"),
])
def test_a_job_that_is_no_path_mapping_or_job_config_is_a_config_error_naming_the_argument(
        call: str, job: Any, named: str) -> None:
    """packer.validate(None) and packer.build(5) were a bare TypeError (exit 1 from a task
    runner that maps PackerError.exit_code), unlike every other argument of the same calls."""
    with pytest.raises(ConfigError, match=re.escape(f"job={job!r}: give a job file path (a str or a pathlib.Path), "
                                                    f"a mapping or a JobConfig, {named}")) as raised:
        getattr(api, call)(job, scheduler="sync", progress=False)
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(("given", "said"), [
    (5, "storage_options: an int (not shown"),
    (1.5, "storage_options: a float (not shown"),
    ("k=v", "storage_options: a str (not shown"),
])
def test_storage_options_of_the_wrong_type_name_it_with_the_right_article(given: Any, said: str) -> None:
    """It said "storage_options: a int"."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        packer.open("nowhere", storage_options=given)


def _two_shape_images(root: Path, name: str) -> Path:
    """Eight PNGs of two shapes in two label folders, and a job ``name`` over them with no
    transform size: the several_shapes warning that validate and build print at their close."""
    rng = np.random.default_rng(0)
    for i in range(8):
        folder = root / "img" / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        shape = (16, 16) if i < 4 else (20, 24)
        Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(folder / f"i{i}.png")
    job = root / "job.yaml"
    job.write_text(f"name: {name}\nsources: [{{kind: image, root: img, label: folder}}]\n"
                   "split: {by: entity, ratios: {train: 0.5, valid: 0.25, test: 0.25}, seed: 1}\n"
                   "pack: {format: webdataset}\noutput: out\nphi: {mode: keep}\n")
    return job


@pytest.mark.parametrize("call", ["validate", "build"])
def test_the_warnings_a_call_prints_at_its_close_name_its_job(tmp_path: Path, call: str) -> None:
    """The several-shapes (and empty-split) warnings that packer.validate and packer.build print
    after the run were "packer: warning: source img packs ...", naming no job, while the stages'
    were "packer: warning: <job>: ...": with two calls in one process, whose was it?"""
    job = _two_shape_images(tmp_path, "shapesjob")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        getattr(packer, call)(str(job), scheduler="sync", progress=False)
    warned = [line for line in err.getvalue().splitlines() if line.startswith("packer: warning:")]
    assert any("packs samples of 2 shapes" in line for line in warned), warned
    assert all(line.startswith("packer: warning: shapesjob: ") for line in warned), warned


def test_a_build_whose_every_file_is_bad_says_no_split_has_a_sample_once_not_reseed_per_split(
        tmp_path: Path) -> None:
    """Eight damaged PNGs: the build raised BadFractionError as documented, but printed and kept
    three warnings, one per split, advising "add entities, change split.ratios, or try another
    split.seed": no seed or ratio fills a split from 0 samples."""
    for i in range(8):
        folder = tmp_path / "img" / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"x{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    (tmp_path / "job.yaml").write_text(
        "name: allbad\nsources: [{kind: image, root: img, label: folder}]\n"
        "split: {by: entity, ratios: {train: 0.5, valid: 0.25, test: 0.25}}\n"
        "pack: {format: webdataset}\noutput: out\nphi: {mode: keep}\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(BadFractionError) as raised:
        packer.build(str(tmp_path / "job.yaml"), scheduler="sync", progress=False)
    assert raised.value.version_dir is not None
    kept = [json.loads(line) for line in (raised.value.version_dir / "warnings.jsonl").read_text().splitlines()]
    empty = [record["message"] for record in kept if record["code"] == "empty_split"]
    assert len(empty) == 1, empty
    assert empty[0].startswith("no split has a sample: the job has 0 samples"), empty
    assert "bad" in empty[0] and "split.seed" not in empty[0] and "add entities" not in empty[0]
    printed = [line for line in err.getvalue().splitlines() if "no split has a sample" in line]
    assert printed == [f"packer: warning: allbad: {empty[0]}"]


@pytest.mark.parametrize("split_config", [
    {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}},
    {"by": "time", "cutoffs": {"valid": "2024-01-01", "test": "2024-06-01"}},
    {"by": "list", "carve": {"valid": {"from": "train", "ratio": 0.2}}},
])
def test_no_sample_at_all_is_one_warning_whatever_the_split_kind(split_config: dict[str, Any]) -> None:
    """By time, it said no entity's first record fell in each split's period; carved, to raise the
    carve ratio: with no sample at all, neither can help."""
    nothing = {name: {"samples": 0, "entities": 0} for name in ("train", "valid", "test")}
    found = empty_splits(split_config, nothing)
    assert [(w.split, w.to_json().get("split")) for w in found] == [(None, None)]
    assert found[0].message.startswith("no split has a sample")


def test_a_split_left_empty_among_others_with_samples_still_gets_the_split_advice() -> None:
    found = empty_splits({"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}},
                         {"train": {"samples": 5, "entities": 3}, "valid": {"samples": 2, "entities": 1},
                          "test": {"samples": 0, "entities": 0}})
    assert [w.split for w in found] == ["test"]
    assert "try another split.seed" in found[0].message


#: Run in a fresh process (OpenCV is imported once per process): ``import packer``, then a
#: validate of an image job with a size (the reader and the transforms import OpenCV), printing
#: the variables OpenCV's import sets after each step and whether OpenCV was imported at all.
CALL_IN_A_FRESH_PROCESS = """
import json, os, sys
from pathlib import Path
import numpy as np
from PIL import Image
names = ("LD_LIBRARY_PATH", "PATH", "QT_QPA_PLATFORM_PLUGIN_PATH", "QT_QPA_FONTDIR")
seen = {"before": {n: os.environ.get(n) for n in names}}
import packer
seen["import"] = {n: os.environ.get(n) for n in names}
root = Path(sys.argv[1])
rng = np.random.default_rng(0)
for i in range(6):
    folder = root / "img" / "ab"[i % 2]
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(folder / f"i{i}.png")
(root / "job.yaml").write_text("name: envjob\\nsources: [{kind: image, root: img, label: folder}]\\n"
                               "split: {by: entity, ratios: {train: 0.5, valid: 0.25, test: 0.25}}\\n"
                               "transform: {image: {size: [16, 16]}}\\n"
                               "pack: {format: webdataset}\\noutput: out\\nphi: {mode: keep}\\n")
packer.validate(str(root / "job.yaml"), scheduler="sync", progress=False)
seen["call"] = {n: os.environ.get(n) for n in names}
seen["cv2"] = "cv2" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.parametrize("ld_library_path", [None, "/opt/site/lib"])
def test_a_call_that_imports_opencv_leaves_the_environment_as_it_found_it(
        tmp_path: Path, ld_library_path: str | None) -> None:
    """OpenCV's cv2/__init__.py prepends its library folder and a ':' to LD_LIBRARY_PATH: after a
    packer.validate it was '<venv>/site-packages/cv2/../../lib64:' in the caller's process, where it
    was unset, and every subprocess the caller started later inherited it (the trailing empty
    element makes the dynamic loader search the current folder)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if ld_library_path is not None:
        env["LD_LIBRARY_PATH"] = ld_library_path
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", CALL_IN_A_FRESH_PROCESS, str(tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["cv2"], "the call did not import OpenCV: this test would check nothing"
    assert seen["before"]["LD_LIBRARY_PATH"] == ld_library_path
    assert seen["import"] == seen["before"]
    assert seen["call"] == seen["before"]


def test_packer_imports_opencv_only_through_the_module_that_restores_the_environment() -> None:
    """A module that imported cv2 itself, loaded first in a process, would set LD_LIBRARY_PATH again."""
    direct = [str(path.relative_to(REPO)) for path in sorted((REPO / "packer").rglob("*.py"))
              if path.name != "opencv.py"
              and re.search(r"^\s*(import cv2\b|from cv2\b)", path.read_text(encoding="utf-8"), re.MULTILINE)]
    assert direct == []
