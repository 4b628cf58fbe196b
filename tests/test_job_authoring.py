"""A job's authoring mistakes are config errors at load that name the key and the fix, and what
a job may write means what the README says it means."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError

JOB = {
    "name": "t",
    "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
    "split": {"by": "entity", "seed": 3},
    "pack": {"format": "webdataset"},
    "output": "out",
}


def write_job(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    return path


def test_a_registry_url_is_refused_at_load_not_written_to_a_local_folder(tmp_path: Path) -> None:
    job = write_job(tmp_path, registry="s3://bucket/registry")
    with pytest.raises(ConfigError, match=r"registry: .*s3://bucket/registry.*local folder") as err:
        load_job(job)
    assert str(job) in str(err.value)
    assert not (tmp_path / "s3:").exists()
