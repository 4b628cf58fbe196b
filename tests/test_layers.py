"""The layers of docs/ARCHITECTURE.md hold: import-linter checks the contracts in pyproject.toml.

``make lint`` runs the same check; this test puts it in ``make test``, which CI runs, so a change
that adds a back-edge between layers (a stage imported by the loader, the CLI imported by a
stage, a reader imported by a transform) fails CI.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _lint_imports() -> str:
    found = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert found, "lint-imports is missing: install the dev extra (make install)"
    return found


def test_every_import_contract_is_kept() -> None:
    done = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_contracts_name_every_top_level_module_of_packer() -> None:
    """A new top-level module must be placed in a layer, not slip between the contracts."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = {m for c in config for key in ("source_modules", "forbidden_modules") for m in c.get(key, [])}
    top = {f"packer.{p.stem if p.is_file() else p.name}" for p in (ROOT / "packer").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    allowed_unnamed = {"packer.discover"}  # the re-export of make_sample_id for the peer harness
    assert top - named - allowed_unnamed == set()


def test_a_back_edge_breaks_a_contract(tmp_path: Path) -> None:
    """The check can fail: a copy of the package whose loader imports a stage is refused."""
    copy = tmp_path / "packer"
    shutil.copytree(ROOT / "packer", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "loader" / "leak.py").write_text("from packer.pipeline import stages  # noqa: F401\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    done = subprocess.run([_lint_imports(), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "packer.loader.leak -> packer.pipeline.stages" in done.stdout
