"""Shared fixtures: a hermetic environment and a generated demo raw tree.

Plain helpers (``REPO``, ``clean_environment``, ``demo_job_doc``, ``write_job``, ...) live in
``tests/helpers.py``; import them from there, not from this file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import OPENCV_LIMITS_PREFIX, clean_environment


def pytest_configure(config: pytest.Config) -> None:
    """Remove OpenCV's image-size limits (``OPENCV_IO_MAX_IMAGE_*``) before any test module is
    collected: OpenCV reads them once, when it loads, and test modules import it while they are
    collected, before :func:`hermetic_environment` runs (which removes them again, for what
    starts after it)."""
    assert "cv2" not in sys.modules, "OpenCV loaded before the conftest could remove its size limits"
    for name in [name for name in os.environ if name.startswith(OPENCV_LIMITS_PREFIX)]:
        del os.environ[name]


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The whole session runs in :func:`~tests.helpers.clean_environment`; yields the session's work folder.

    Session scope, so it applies before every other fixture: module fixtures that set variables
    themselves (the S3 tests' ``AWS_*`` for moto's server) and tests using ``monkeypatch.setenv``
    change the cleaned environment and give it back when they finish.
    """
    folder = tmp_path_factory.mktemp("environment")
    with pytest.MonkeyPatch.context() as env:
        clean_environment(env, folder)
        yield folder / "work"


@pytest.fixture(scope="session")
def demo_raw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A demo raw tree (seed 0), written once per test session. Tests must not modify it."""
    from packer.demo import write_demo_tree

    return write_demo_tree(tmp_path_factory.mktemp("demo-raw"), seed=0)
