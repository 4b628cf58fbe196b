"""Shared fixtures: a generated demo raw tree and job files pointing at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


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


@pytest.fixture(scope="session")
def demo_raw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A demo raw tree (seed 0), written once per test session. Tests must not modify it."""
    from packer.demo import write_demo_tree

    return write_demo_tree(tmp_path_factory.mktemp("demo-raw"), seed=0)
