"""Report: write the files left out on purpose as ``excluded.jsonl`` and count them.

A file left out on purpose (:class:`~packer.records.Excluded`: not in the table, filtered by
the source's ``where:``, a DICOM object without an image, an image the job packs only when
asked) is neither a sample nor a bad sample: it is counted here and listed, never against
``max_bad_fraction``. Like ``bad_samples.jsonl`` the list names raw paths, so it stays next to
the shards for the people who built them and is not hashed into the dataset's identity; the
counts (:func:`exclusion_counts`) go into the manifest's ``inputs``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packer.files import read_jsonl, write_jsonl
from packer.records import Excluded

EXCLUDED_FILE = "excluded.jsonl"
#: How an annotation object's record (why ``annotation``) counts the structures the source's map
#: does not name (:func:`packer.read.dicom_masks.paint_series`), never naming them (one may be a person's)
UNMAPPED_SAID = "; {count} structure(s) the map does not name, ignored"
_UNMAPPED_COUNT = re.compile(re.escape(UNMAPPED_SAID).replace(re.escape("{count}"), r"(\d+)"))


def unmapped_count(record: Mapping[str, Any]) -> int:
    """How many structures no map names an annotation object's record (as ``excluded.jsonl``
    holds it) says were ignored; 0 for any other record."""
    found = _UNMAPPED_COUNT.search(str(record.get("detail", ""))) if record.get("why") == "annotation" else None
    return int(found.group(1)) if found is not None else 0


def sort_excluded(excluded: Iterable[Excluded]) -> list[Excluded]:
    """Deterministic order: by path, then sample id."""
    return sorted(excluded, key=lambda e: (e.path, e.sample_id, e.why))


def write_excluded(folder: Path, excluded: Iterable[Excluded]) -> Path:
    """Write one schema-valid JSON record per line (``schemas/excluded.schema.json``) to
    ``folder/excluded.jsonl``; raises if a record breaks the schema."""
    return write_jsonl(folder / EXCLUDED_FILE, (e.to_json() for e in sort_excluded(excluded)), "excluded")


def read_excluded(path: Path) -> list[dict[str, str]]:
    """The records of an ``excluded.jsonl``."""
    return read_jsonl(path)


def exclusion_counts(excluded: Sequence[Excluded]) -> dict[str, Any]:
    """The manifest's ``inputs`` fields for ``excluded`` (empty when nothing was excluded, so a
    dataset without exclusions keeps the manifest, and hash, it had before they were counted):
    ``excluded`` (why → files), ``excluded_by_modality`` and ``excluded_by_sop_class`` (files
    per DICOM Modality and SOP class, of the files whose header was read; each only when
    non-empty). A header read without a Modality (an export's DICOMDIR) counts as ``(none)``, so
    that the modalities sum to the files whose header was read."""
    if not excluded:
        return {}
    out: dict[str, Any] = {"excluded": dict(sorted(Counter(e.why for e in excluded).items()))}
    modality = Counter(e.modality or "(none)" for e in excluded if e.modality or e.sop_class)
    if modality:
        out["excluded_by_modality"] = dict(sorted(modality.items()))
    sop = Counter(e.sop_class for e in excluded if e.sop_class)
    if sop:
        out["excluded_by_sop_class"] = dict(sorted(sop.items()))
    return out


def describe_counts(counts: Mapping[str, int]) -> str:
    """``not_image 2, not_requested 1``."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
