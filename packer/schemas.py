"""Load the JSON Schemas in ``schemas/`` and validate documents against them.

The schema files are the single source of truth: the code never restates them. In a
source checkout they live at the repository root; an installed wheel carries a copy
inside the package (``packer/_schemas``).
"""

from __future__ import annotations

import json
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from packer.errors import ConfigError

_HERE = Path(__file__).resolve().parent
_CANDIDATES = (_HERE / "_schemas", _HERE.parent / "schemas")


def schema_dir() -> Path:
    for candidate in _CANDIDATES:
        if (candidate / "job.schema.json").is_file():
            return candidate
    raise FileNotFoundError(f"packer's JSON Schemas are missing; looked in {', '.join(map(str, _CANDIDATES))}")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """``load_schema("job")`` reads ``schemas/job.schema.json``."""
    with open(schema_dir() / f"{name}.schema.json", encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    return schema


@cache
def schema_registry() -> Any:
    """All of packer's schemas by their ``$id``, so they can ``$ref`` one another."""
    from referencing import Registry, Resource

    resources = []
    for path in sorted(schema_dir().glob("*.schema.json")):
        schema = load_schema(path.name.removesuffix(".schema.json"))
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def _plain(value: Any) -> Any:
    """YAML turns ``2024-01-01`` into a date; the schemas speak JSON, so make it a string."""
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _key_path(error: jsonschema.ValidationError) -> str:
    parts: list[str] = []
    for part in error.absolute_path:
        parts.append(f"[{part}]" if isinstance(part, int) else (f".{part}" if parts else str(part)))
    return "".join(parts) or "(top level)"


def validate_document(doc: Any, schema_name: str, *, source: str) -> Any:
    """Validate ``doc`` against ``schemas/<schema_name>.schema.json``; return the JSON-plain doc.

    Raises ConfigError naming ``source``, the key path and what was expected.
    """
    plain = _plain(doc)
    if schema_name == "job" and not isinstance(plain, dict):
        raise ConfigError(f"{source}: a job file is a YAML mapping with name, sources, split, pack and output")
    validator_cls = jsonschema.validators.validator_for(load_schema(schema_name))
    validator = validator_cls(load_schema(schema_name), format_checker=validator_cls.FORMAT_CHECKER,
                              registry=schema_registry())
    errors = sorted(validator.iter_errors(plain), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        error = errors[0]
        best = jsonschema.exceptions.best_match(errors) or error
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ConfigError(f"{source}: {_key_path(best)}: {best.message}{more}")
    return plain
