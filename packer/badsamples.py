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


def over_limit(summary: Mapping[str, Any]) -> bool:
    """Whether a :func:`summarize_issues` summary (or a manifest's ``bad_samples``) is over its
    ``max_fraction``: the one place the bad-fraction limit is judged (exit 3)."""
    return bool(summary["fraction"] > summary["max_fraction"])


def summarize_issues(issues: Iterable[Issue], *, inputs: int, max_fraction: float) -> dict[str, Any]:
    """Counts by reason and stage, and the bad fraction of the discovered inputs."""
    issues = list(issues)
    return {
        "total": len(issues),
        "fraction": round(len(issues) / inputs, 6) if inputs else 0.0,
        "max_fraction": max_fraction,
        "by_reason": dict(sorted(Counter(i.reason for i in issues).items())),
        "by_stage": dict(sorted(Counter(i.stage for i in issues).items())),
        "report": REPORT_FILE,
    }
