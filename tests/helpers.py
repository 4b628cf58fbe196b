"""Plain helpers the tests import: the repository root, the hermetic environment and demo job files.

``tests/conftest.py`` holds the fixtures and uses these; test modules import them from here
(``from tests.helpers import ...``), never from the conftest.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

#: Prefixes of the caller's environment variables that change what packer, or a library it
#: configures through the environment, does: every packer setting (``PACKER_PHI_KEY``,
#: ``PACKER_WORK_DIR``, ``PACKER_TUNE_MALLOC``, ...), everything botocore reads under s3fs
#: (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``,
#: ``AWS_DEFAULT_REGION``, ``AWS_CONFIG_FILE``, ...), OpenCV's image-size limits
#: (:data:`OPENCV_LIMITS_PREFIX`) and the name of their C++ constants, which packer's too_large
#: message mentions where it is set.
OPENCV_LIMITS_PREFIX = "OPENCV_IO_MAX_IMAGE_"
HERMETIC_PREFIXES = ("PACKER_", "AWS_", OPENCV_LIMITS_PREFIX, "CV_IO_MAX_IMAGE_")
#: torchrun's variables: the loader takes its default rank and world size from them, the example
#: training script a launch by torchrun from TORCHELASTIC_RUN_ID.
HERMETIC_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID")
#: Knobs of the suite itself, read when tests/test_fuzz.py is imported: a developer's opt-in.
SUITE_KNOBS = ("PACKER_FUZZ_LONG", "PACKER_FUZZ_REPORT")


def is_hermetic_variable(name: str) -> bool:
    """Whether the session removes ``name`` from the environment before any test runs."""
    return (name.startswith(HERMETIC_PREFIXES) or name in HERMETIC_NAMES) and name not in SUITE_KNOBS


def clean_environment(env: pytest.MonkeyPatch, folder: Path) -> None:
    """Remove every :func:`is_hermetic_variable` from ``os.environ`` (subprocesses inherit the
    result) and point packer and botocore at ``folder`` instead of the user's home.

    ``PACKER_WORK_DIR`` becomes ``folder/work`` (the build cache and URL builds, never the real
    ``~/.cache``); botocore's config and credentials files become a path that does not exist,
    with no instance-metadata lookup; ``TMPDIR`` becomes the folder Python actually uses (a
    ``TMPDIR`` that is missing or relative would otherwise mean another folder in subprocesses
    and in code that reads the variable itself).
    """
    for name in [name for name in os.environ if is_hermetic_variable(name)]:
        env.delenv(name)
    (folder / "work").mkdir(parents=True, exist_ok=True)
    env.setenv("PACKER_WORK_DIR", str(folder / "work"))
    env.setenv("AWS_CONFIG_FILE", str(folder / "no-aws-config"))
    env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-aws-config"))
    env.setenv("AWS_EC2_METADATA_DISABLED", "true")
    env.setenv("TMPDIR", tempfile.gettempdir())


def demo_job_doc(raw: Path, output: Path, **overrides: Any) -> dict[str, Any]:
    """The committed demo job, re-pointed at ``raw`` and ``output`` (absolute paths)."""
    doc = yaml.safe_load((REPO / "workflows" / "demo.yaml").read_text())
    doc["sources"][0].update(root=str(raw / "ct"), labels=str(raw / "ct_labels.csv"))
    doc["sources"][1].update(root=str(raw / "photos"), table=str(raw / "photos" / "labels.csv"))
    doc["phi"]["key_file"] = str(raw / "phi.key")
    doc["output"] = str(output)
    doc.pop("registry", None)
    for key, value in overrides.items():
        doc[key] = value
    return doc


def write_job(folder: Path, doc: dict[str, Any], name: str = "job.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def copy_without_index(version: Path, folder: Path) -> Path:
    """A copy of a built version folder at ``folder`` whose ``_index.parquet`` is gone (readers
    must then scan the shards)."""
    import shutil

    shutil.copytree(version, folder)
    (folder / "_index.parquet").unlink()
    return folder
