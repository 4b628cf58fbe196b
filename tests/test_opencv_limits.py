"""OpenCV's own image-size limits: packer checks the variables OpenCV reads, names them in its
advice, and keys the build cache on them.

OpenCV refuses an image wider or taller than 2**20 pixels, or of more than 2**30 pixels, unless
``OPENCV_IO_MAX_IMAGE_WIDTH``, ``_HEIGHT`` or ``_PIXELS`` say otherwise; it reads them once, when
the library loads, so the checks that raise them run packer in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.manifest import DECODING_ENVIRONMENT, decoding_libraries, library_versions
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import REPO

#: 2 × 1,048,600: 24 columns over OpenCV's default width limit of 1,048,576, 2 MB of pixels.
STRIP_WIDTH = (1 << 20) + 24

_READ = """
import json, sys
import cv2
from packer.config import ImageTransformConfig
from packer.read.image import read_image
from packer.records import Issue, SampleRef
ref = SampleRef(sample_id="strip", source="photos", kind="image", path=sys.argv[1], relpath="strip.tif",
                label="a", entity="e", time=None)
result = read_image(ref, ImageTransformConfig(size=(8, 8), color="gray"))
try:
    decoded = cv2.imread(sys.argv[1], cv2.IMREAD_UNCHANGED)
except cv2.error:  # over a limit: validateInputImageSize's assertion
    decoded = None
print(json.dumps({"reason": result.reason if isinstance(result, Issue) else "packed",
                  "message": result.message if isinstance(result, Issue) else "",
                  "opencv": None if decoded is None else list(decoded.shape)}))
"""


def read_strip(path: Path, **variables: str) -> dict[str, object]:
    """What packer's read and OpenCV's own ``imread`` make of ``path`` in a process started with
    ``variables`` in its environment (and no other OpenCV size limit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCV_IO_", "CV_IO_"))}
    done = subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**env, "PYTHONPATH": str(REPO), **variables})
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def strip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2 × 1,048,600 grey TIFF (libpng refuses a PNG that wide): a line scan, far below
    ``limits.max_pixels`` but over OpenCV's width limit."""
    path = tmp_path_factory.mktemp("strip") / "strip.tif"
    assert cv2.imwrite(str(path), (np.arange(STRIP_WIDTH) % 251).astype(np.uint8)[None, :].repeat(2, 0))
    return path


def test_following_the_too_large_advice_packs_the_image(strip: Path) -> None:
    refused = read_strip(strip)
    assert refused["reason"] == "too_large" and refused["opencv"] is None
    assert f"{STRIP_WIDTH} is over OpenCV's OPENCV_IO_MAX_IMAGE_WIDTH {1 << 20}" in str(refused["message"])
    assert "set the environment variable OPENCV_IO_MAX_IMAGE_WIDTH higher" in str(refused["message"])
    advised = read_strip(strip, OPENCV_IO_MAX_IMAGE_WIDTH=str(4 << 20))
    assert advised == {"reason": "packed", "message": "", "opencv": [2, STRIP_WIDTH]}
    assert read_strip(strip, OPENCV_IO_MAX_IMAGE_WIDTH="4MB")["reason"] == "packed"  # OpenCV's own unit


def test_the_c_constants_name_is_no_setting_and_the_message_says_so(strip: Path) -> None:
    """``CV_IO_MAX_IMAGE_WIDTH`` (the name of the constant in OpenCV's loadsave.cpp, which packer's
    advice once named) changes nothing for OpenCV, so it changes nothing for packer either."""
    found = read_strip(strip, CV_IO_MAX_IMAGE_WIDTH=str(4 << 20))
    assert found["reason"] == "too_large" and found["opencv"] is None
    assert "CV_IO_MAX_IMAGE_WIDTH, which is set here, is only the name of OpenCV's C++ constant" in str(
        found["message"])


def test_the_limits_key_the_cache_only_where_set(monkeypatch: pytest.MonkeyPatch) -> None:
    unset = decoding_libraries()
    assert set(unset) == {*library_versions(), "simplejpeg"}  # the keys of every build without them
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "500")
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_WIDTH", "4MB")
    assert decoding_libraries() == {**unset, DECODING_ENVIRONMENT:
                                    "OPENCV_IO_MAX_IMAGE_PIXELS=500 OPENCV_IO_MAX_IMAGE_WIDTH=4MB"}


def _build(folder: Path, out: str, cache: str) -> BuildResult:
    """Four 16×16 and four 32×32 grey PNGs, each its own entity, built with ``cache`` as the build cache."""
    raw = folder / "raw"
    if not raw.exists():
        rows = []
        for i in range(8):
            side = 16 if i % 2 else 32
            (raw / f"P{i}").mkdir(parents=True)
            assert cv2.imwrite(str(raw / f"P{i}/a.png"), np.random.default_rng(i).integers(0, 255, (side, side),
                                                                                            dtype=np.uint8))
            rows.append(f"P{i}/a.png,{'ab'[i % 2]},P{i}")
        (raw / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows) + "\n")
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "t", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16], "color": "gray"}}, "validate": {"max_bad_fraction": 0.75},
        "pack": {"format": "webdataset"}, "output": out}, sort_keys=False))
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False,
                                             cache_dir=folder / cache))


def test_a_warm_cache_refuses_what_a_fresh_build_refuses_under_a_lower_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32×32 image is 1,024 pixels: over ``OPENCV_IO_MAX_IMAGE_PIXELS=500``, whose check runs
    before OpenCV decodes (so it holds in this process, whose OpenCV loaded without it)."""
    assert _build(tmp_path, "warm-out", "warm").manifest["bad_samples"]["by_reason"] == {}
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "500")
    warm, fresh = _build(tmp_path, "warm-out", "warm"), _build(tmp_path, "fresh-out", "fresh")
    assert fresh.manifest["bad_samples"]["by_reason"] == {"too_large": 4}
    assert warm.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
