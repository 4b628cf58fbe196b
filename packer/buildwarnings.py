"""Report: the warnings a build printed, kept beside its shards as ``warnings.jsonl``.

``packer build`` prints what its stages warn of (``packer: warning: <job>: ...``: look-alike
entity ids, split shares, label conflicts, shared SOP Instance UIDs, readers' warnings, possible
annotations, ...) and ``packer validate --json`` lists the same warnings with a ``code``. A
reviewer who reads only the HTML report must see them too, so the build writes them, one record
per line (``{"code", "message"}``: the record ``schemas/validate.schema.json`` lists under
``warnings``, the one source of truth for it), into the version folder, and the report shows them
at its top. The messages are as printed: pseudonymized where the job pseudonymizes, naming raw
paths and the job file where it keeps them, so the file is local only, like ``leakage.json``.

Like ``excluded.jsonl`` the file exists only where there were warnings, and it is outside the
dataset's identity: the manifest does not list it and ``dataset_hash`` does not cover it (a
message may name the job file's path, which does not change the packed data).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.files import atomic_output, read_jsonl

WARNINGS_FILE = "warnings.jsonl"


@dataclass(frozen=True)
class BuildWarning:
    """One warning a build printed: its ``code`` (as ``packer validate --json`` lists it) and text."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@functools.cache
def _record_validator() -> Any:
    import jsonschema

    from packer.schemas import load_schema

    return jsonschema.Draft202012Validator(load_schema("validate")["properties"]["warnings"]["items"])


def write_warnings(folder: Path, warnings: Iterable[tuple[str, str]]) -> Path | None:
    """Write ``warnings`` ((code, message) pairs, in the order printed) to ``folder/warnings.jsonl``,
    each record checked against ``schemas/validate.schema.json``'s warning record first; with
    none, remove a ``warnings.jsonl`` an earlier build of the same version left there. A file that
    already holds these records is left alone. Returns the file, or None."""
    records = [BuildWarning(code, message).to_json() for code, message in warnings]
    path = folder / WARNINGS_FILE
    if not records:
        if path.exists():  # asked only where there is one: a read-only published version holds none to remove
            path.unlink()
        return None
    for record in records:
        _record_validator().validate(record)
    data = b"".join(json.dumps(record, sort_keys=True, ensure_ascii=False).encode() + b"\n" for record in records)
    if path.is_file() and path.read_bytes() == data:  # a rebuild of the same version rewrites nothing
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as fh:
        fh.write(data)
    return path


def read_warnings(path: Path) -> list[BuildWarning]:
    """The warnings of a ``warnings.jsonl``; raises ValueError naming the file and line for a line
    that is not a warning record (a hand-edited or damaged file), OSError if it cannot be read."""
    out: list[BuildWarning] = []
    for number, record in enumerate(read_jsonl(path), start=1):
        errors = sorted(_record_validator().iter_errors(record), key=str)
        if errors:
            raise ValueError(f"{path.name} line {number}: {errors[0].message} (expected "
                             "{\"code\": ..., \"message\": ...}: build the version again to rewrite it)")
        out.append(BuildWarning(str(record["code"]), str(record["message"])))
    return out

