"""Manifest: describe a built dataset version, hash it, write it atomically, load it back.

The per-sample tables the manifest records are written by :mod:`packer.pipeline.publish`;
their columns (``INDEX_SCHEMA``, ``SPLITS_SCHEMA``) are part of the format, so they stay here.

``dataset_hash`` is sha256 over the canonical JSON of every manifest field except
``created_at``, ``version`` and ``dataset_hash`` itself. It therefore covers the resolved
config, the library versions that shape the bytes, every shard's sha256 and the sample
index: one flipped byte anywhere changes it. The version folder is its first 12 hex digits.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa

from packer import __version__
from packer.errors import IntegrityError
from packer.files import atomic_output, canonical_json
from packer.schemas import load_schema

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "_index.parquet"
SPLITS_FILE = "_splits.parquet"
_UNHASHED = ("created_at", "version", "dataset_hash")
_BYTE_SHAPING = ("numpy", "opencv-python-headless", "pydicom", "pylibjpeg", "pylibjpeg-libjpeg",
                 "pylibjpeg-openjpeg", "pylibjpeg-rle", "pyarrow")


def library_versions() -> dict[str, str]:
    """Versions of packer and of every library whose behaviour shapes the packed bytes."""
    versions = {"packer": __version__}
    for name in _BYTE_SHAPING:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config)).hexdigest()


def compute_dataset_hash(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest without its unhashed fields."""
    content = {k: v for k, v in manifest.items() if k not in _UNHASHED}
    return hashlib.sha256(canonical_json(content)).hexdigest()


def seal_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Fill ``dataset_hash``, ``version`` and ``created_at`` into a manifest body."""
    digest = compute_dataset_hash(manifest)
    return {**manifest, "dataset_hash": digest, "version": digest[:12],
            "created_at": datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")}


def validate_manifest(manifest: dict[str, Any], *, source: str) -> None:
    """Raise IntegrityError if ``manifest`` breaks ``schemas/manifest.schema.json``."""
    import jsonschema

    schema = load_schema("manifest")
    validator_cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(validator_cls(schema).iter_errors(manifest))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(top level)"
        raise IntegrityError(f"{source}: manifest field {where}: {error.message}")


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    """Validate and write ``folder/manifest.json`` atomically (sorted keys, 2-space indent)."""
    validate_manifest(manifest, source=str(folder / MANIFEST_FILE))
    path = folder / MANIFEST_FILE
    with atomic_output(path) as fh:
        fh.write(json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    return path


def resolve_manifest_path(path: str | Path) -> Path:
    """Accept a manifest file or the version folder holding it."""
    candidate = Path(path)
    return candidate / MANIFEST_FILE if candidate.is_dir() else candidate


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and schema-check a manifest; IntegrityError names the file and the field."""
    file = resolve_manifest_path(path)
    try:
        manifest: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise IntegrityError(f"{file}: cannot read the manifest ({err.strerror})") from err
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{file}: not valid JSON ({err.msg} at line {err.lineno})") from err
    validate_manifest(manifest, source=str(file))
    if compute_dataset_hash(manifest) != manifest["dataset_hash"]:
        raise IntegrityError(f"{file}: dataset_hash does not match the manifest's content; the manifest was edited")
    return manifest


INDEX_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("shard", pa.string(), nullable=False),
    pa.field("position", pa.int64(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("label", pa.int64(), nullable=False),
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
])


SPLITS_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("fold", pa.int32(), nullable=True),
    pa.field("time", pa.string(), nullable=True),
    pa.field("days_since_first", pa.float64(), nullable=True),
    pa.field("label", pa.string(), nullable=False),
])
