"""docs/ARCHITECTURE.md is the map of the tree: every module is on it, and every path on it exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _named(path: Path) -> bool:
    rel = path.relative_to(ROOT / "packer")
    candidates = {f"`{rel.as_posix()}`", f"`packer/{rel.as_posix()}`", f"`{rel.stem}.py`",
                  f"`{rel.parent.as_posix()}/`"}
    return any(c in DOC for c in candidates)


def test_every_package_and_top_level_module_is_on_the_map() -> None:
    top = [p for p in (ROOT / "packer").iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()]
    missing = [p.name for p in top if not (_named(p) if p.is_file() else f"`{p.name}/`" in DOC)]
    assert missing == [], f"add these to docs/ARCHITECTURE.md: {missing}"


def test_every_pipeline_and_shards_module_is_on_the_map() -> None:
    modules = [p for pkg in ("pipeline", "shards") for p in (ROOT / "packer" / pkg).glob("*.py")
               if p.name != "__init__.py"]
    missing = [f"{p.parent.name}/{p.name}" for p in modules if f"`{p.name}`" not in DOC]
    assert missing == [], f"add these to docs/ARCHITECTURE.md: {missing}"


def test_every_path_the_map_names_exists() -> None:
    paths = set(re.findall(r"`(packer/[\w/]+(?:\.py)?)`", DOC)) | {
        f"packer/{m}" for m in re.findall(r"`((?:pipeline|shards|loader|read|transform|htmlreport)/\w+\.py)`", DOC)}
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert gone == [], f"docs/ARCHITECTURE.md names paths that are gone: {gone}"
