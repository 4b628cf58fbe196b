"""What packer's Python calls promise a long-lived caller (a notebook, an orchestrator's worker),
as README's "From Python" documents it: a job of the wrong type is a typed ConfigError naming
the argument, never a bare TypeError; every warning a call prints names its job, as calls on
threads or one after another in one process print theirs into the same stderr."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import packer
from packer import api
from packer.errors import ConfigError


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
