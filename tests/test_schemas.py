"""The JSON Schemas in schemas/ are the source of truth: the code must agree with them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from packer.errors import ConfigError
from packer.records import REASONS, STAGES
from packer.schemas import load_schema, schema_dir

REPO = Path(__file__).resolve().parent.parent


SCHEMAS = sorted(p.name.removesuffix(".schema.json") for p in (REPO / "schemas").glob("*.schema.json"))


@pytest.mark.parametrize("name", SCHEMAS)
def test_schemas_are_valid_json_schema(name: str) -> None:
    schema = load_schema(name)
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_schema_dir_is_the_repository_folder() -> None:
    assert schema_dir() == REPO / "schemas"
    assert {"job", "manifest", "bad_sample", "validate"} <= set(SCHEMAS)


def test_reason_and_stage_codes_match_the_bad_sample_schema() -> None:
    props = load_schema("bad_sample")["properties"]
    assert tuple(props["reason"]["enum"]) == REASONS
    assert tuple(props["stage"]["enum"]) == STAGES


def test_every_job_schema_key_is_read_by_the_config_loader() -> None:
    """The loader is config.py plus each source kind's module, which reads its own section."""
    source = "".join(p.read_text() for p in [REPO / "packer" / "config.py",
                                               *sorted((REPO / "packer" / "read").glob("*_kind.py"))])
    schema = load_schema("job")
    keys = set(schema["properties"])
    for definition in ("source", "split", *(d for d in schema["$defs"] if d.endswith("_transform"))):
        keys |= set(schema["$defs"][definition]["properties"])
    keys |= set(schema["properties"]["pack"]["properties"]) | {"max_bad_fraction"}
    unread = sorted(k for k in keys if f'"{k}"' not in source)
    assert unread == [], f"job schema keys the config loader never reads: {unread}"


def test_demo_workflow_validates() -> None:
    import yaml

    from packer.schemas import validate_document

    doc = yaml.safe_load((REPO / "workflows" / "demo.yaml").read_text())
    plain = validate_document(doc, "job", source="demo.yaml")
    assert plain == json.loads(json.dumps(doc, default=str))  # YAML dates and all, as JSON values
    doc["pack"]["format"] = "zip"
    with pytest.raises(ConfigError, match="pack.format"):
        validate_document(doc, "job", source="demo.yaml")
