"""Report: write the bad-sample records as ``bad_samples.jsonl`` and summarise them.

The report names raw paths, which in hospital exports often carry names or record numbers:
it stays next to the shards for the people who built them and is not hashed into the
dataset's identity.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packer.files import read_jsonl, write_jsonl
from packer.records import Issue

REPORT_FILE = "bad_samples.jsonl"


def sort_issues(issues: Iterable[Issue]) -> list[Issue]:
    """Deterministic report order: by path, then sample id, then stage."""
    return sorted(issues, key=lambda i: (i.path, i.sample_id, i.stage, i.reason))


def write_bad_samples(folder: Path, issues: Iterable[Issue]) -> Path:
    """Write one schema-valid JSON record per line; raises if a record breaks the schema."""
    return write_jsonl(folder / REPORT_FILE, (issue.to_json() for issue in sort_issues(issues)), "bad_sample")


def read_bad_samples(path: Path) -> list[dict[str, str]]:
    return read_jsonl(path)


def over_limit(summary: Mapping[str, Any], considered: int | None = None) -> bool:
    """Whether a :func:`summarize_issues` summary (or a manifest's ``bad_samples``) is over its
    ``max_fraction``: the one place the bad-fraction limit is judged (exit 3). ``considered``: the
    files the fraction is of, where known, so that the exact fraction is judged, not the
    recorded one (rounded to 6 places: 1 bad file in 3 million is 0.0, which passed a limit of 0)."""
    total = summary.get("total")
    if considered and isinstance(total, int):
        return bool(total / considered > summary["max_fraction"])
    return bool(summary["fraction"] > summary["max_fraction"])


def considered_files(manifest: Mapping[str, Any]) -> int | None:
    """The input files a manifest's bad fraction is of (its inputs but those left out on
    purpose), None where the manifest does not say."""
    inputs = manifest.get("inputs") or {}
    files = inputs.get("files")
    if not isinstance(files, int):
        return None
    return files - sum(int(n) for n in (inputs.get("excluded") or {}).values())


def manifest_over_limit(manifest: Mapping[str, Any]) -> bool:
    """:func:`over_limit` of a manifest's ``bad_samples``, judged on its exact fraction."""
    return over_limit(manifest["bad_samples"], considered_files(manifest))


def failed_build(manifest: Mapping[str, Any]) -> str | None:
    """Why the build that wrote ``manifest`` failed, where it did: its bad samples over
    ``max_fraction`` (exit 3; the version is written for its report, never listed in a registry
    nor published, and no tool should take it for a usable version). None for a good version."""
    bad = manifest.get("bad_samples") or {}
    if "fraction" not in bad or "max_fraction" not in bad or not manifest_over_limit(manifest):
        return None
    return (f"{bad.get('total', '?')} bad input files, {bad['fraction']:.1%} over max_bad_fraction "
            f"{bad['max_fraction']:.1%} (exit 3; kept for its report, not a version to train on)")


def summarize_issues(issues: Iterable[Issue], *, inputs: int, max_fraction: float) -> dict[str, Any]:
    """Counts by reason and stage, and the bad fraction of the discovered inputs. It names no
    report file: packer validate writes none, and a build adds its own (``report``: :data:`REPORT_FILE`)."""
    issues = list(issues)
    return {
        "total": len(issues),
        "fraction": round(len(issues) / inputs, 6) if inputs else 0.0,
        "max_fraction": max_fraction,
        "by_reason": dict(sorted(Counter(i.reason for i in issues).items())),
        "by_stage": dict(sorted(Counter(i.stage for i in issues).items())),
    }
