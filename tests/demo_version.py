"""The demo version the repository commits: the one manifest git tracks under manifests/demo/."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def committed_demo_manifest() -> Path:
    """The demo manifest git tracks (``manifests/demo/<version>.json``), exactly one.

    Files that a local build left in the folder but git does not track (a copied job under the
    same name and registry, say) are not the committed version. Outside a git checkout (an
    unpacked archive), the folder's only manifest.
    """
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", "manifests/demo/*.json"],
                                capture_output=True, text=True, check=True, timeout=60).stdout.split()
        paths = [REPO / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        paths = sorted((REPO / "manifests" / "demo").glob("*.json"))
    assert len(paths) == 1, (f"keep exactly one committed demo manifest (the current version) in manifests/demo/; "
                             f"git tracks {[p.name for p in paths]}")
    return paths[0]


def committed_demo() -> dict[str, Any]:
    """The committed demo manifest's content."""
    manifest: dict[str, Any] = json.loads(committed_demo_manifest().read_text(encoding="utf-8"))
    return manifest
