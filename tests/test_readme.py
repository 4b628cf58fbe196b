"""The README tells the truth about the demo: the version, hash and counts it quotes, the
screenshot it shows, and the columns of the tables it documents are the committed demo's."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import cv2
import numpy as np
import pyarrow as pa
import pytest

from packer.manifest import INDEX_SCHEMA, SPLITS_SCHEMA
from tests.demo_version import REPO, committed_demo

README = (REPO / "README.md").read_text(encoding="utf-8")


def screenshot_module() -> Any:
    spec = importlib.util.spec_from_file_location("screenshot", REPO / "docs" / "screenshot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_demo_version_and_hash_the_readme_quotes_is_the_committed_one() -> None:
    manifest = committed_demo()
    quoted = re.findall(r"(?:version |demo/|dataset_hash )([0-9a-f]{12,64})\b", README)
    assert quoted, "the README quotes no demo version: the make demo output block is gone?"
    for token in quoted:
        assert manifest["dataset_hash"].startswith(token), (
            f"README.md quotes demo version/hash {token}, the committed manifest is {manifest['version']}: "
            "after `make demo` changes the version, update the README's quoted output")


def test_make_install_pins_the_byte_shaping_libraries_the_committed_demo_records() -> None:
    """dataset_hash covers the library versions: an unpinned new release (opencv 5.1 did it) gives a
    fresh `make demo` another version than the README quotes, with the same shard bytes."""
    pinned = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                  if line and not line.startswith("#"))
    recorded = {name: version for name, version in committed_demo()["libraries"].items() if name != "packer"}
    assert {name: pinned.get(name) for name in recorded} == recorded
    # the libraries recorded only by the jobs that use them (a NIfTI source, masks from DICOM SEG)
    # are pinned too, so that those datasets keep their hash on a fresh machine; Pillow, which an
    # image source records (the demo's photos), is among the demo's
    assert set(pinned) - set(recorded) == {"nibabel", "highdicom"} and "pillow" in recorded
    assert "-c constraints.txt" in (REPO / "Makefile").read_text()


def test_the_quoted_make_demo_output_has_the_committed_counts() -> None:
    manifest = committed_demo()
    lines = re.findall(r"^\s+(train|valid|test)\s+(\d+) samples\s+(\d+) entities\s+(\d+) shards\s+\[(.*)\]$",
                       README, flags=re.M)
    assert [line[0] for line in lines] == ["train", "valid", "test"]
    for split, samples, entities, shards, classes in lines:
        entry = manifest["splits"][split]
        assert (int(samples), int(entities), int(shards)) == (entry["samples"], entry["entities"],
                                                              len(entry["shards"])), split
        assert classes == ", ".join(f"{k} {v}" for k, v in entry["class_counts"].items())
    bad = re.search(r"bad samples: (\d+) of (\d+) files", README)
    assert bad is not None
    assert (int(bad[1]), int(bad[2])) == (manifest["bad_samples"]["total"], manifest["inputs"]["files"])


def test_the_report_screenshot_shows_the_committed_version() -> None:
    shot = REPO / "docs" / "report-screenshot.png"
    assert "docs/report-screenshot.png" in README
    module = screenshot_module()
    text = module.png_text(shot.read_bytes())
    assert text.get(module.KEYWORD.decode()) == committed_demo()["version"], (
        "docs/report-screenshot.png shows another demo version: `make demo && make screenshot`")


def test_the_screenshot_version_chunk_round_trips() -> None:
    module = screenshot_module()
    ok, png = cv2.imencode(".png", np.zeros((4, 5, 3), np.uint8))
    assert ok
    marked = module.png_with_text(png.tobytes(), b"packer-demo-version", "0123456789ab")
    assert module.png_text(marked) == {"packer-demo-version": "0123456789ab"}
    assert cv2.imdecode(np.frombuffer(marked, np.uint8), cv2.IMREAD_COLOR).shape == (4, 5, 3)


def documented_columns(table: str) -> list[str]:
    match = re.search(rf"{re.escape(table)}\s+# one row per sample: (.*)$", README, flags=re.M)
    assert match is not None, f"README's output layout no longer documents {table}"
    return [c.strip() for c in match[1].split(",")]


@pytest.mark.parametrize("table", ["_splits.parquet", "_index.parquet"])
def test_the_documented_table_columns_are_the_real_ones(table: str) -> None:
    schema: pa.Schema = SPLITS_SCHEMA if table == "_splits.parquet" else INDEX_SCHEMA
    assert documented_columns(table) == schema.names


def test_make_lint_is_documented_as_what_it_runs() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    runs = {tool for tool in ("ruff", "mypy", "lint-imports") if tool in lint}
    line = next(line for line in README.splitlines() if line.startswith("make lint"))
    assert runs and all(tool in line for tool in runs), f"README says {line!r}; the Makefile runs {sorted(runs)}"


def test_every_bad_sample_reason_code_is_documented() -> None:
    from packer.records import REASONS

    section = README.split("## Bad-sample reason codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    assert set(REASONS) - documented == set(), "add these reason codes to the README's table"


def readme_python_blocks() -> list[tuple[int, str]]:
    """Each ```python block of the README, with the line its code starts on."""
    return [(README[:m.start(1)].count("\n") + 1, m[1])
            for m in re.finditer(r"^```python\n(.*?)^```", README, flags=re.S | re.M)]


def test_every_readme_python_block_runs_as_pasted_with_nothing_to_fill_in() -> None:
    """A newcomer pastes a block as it is: no ``<version>`` or ``<path>`` to replace, and no name
    (``manifest``, ``model``, ``epochs``, ``backbone``, ``torch``) that an earlier block or the
    reader's own code was supposed to define. tests/test_golden_path.py runs them after the builds."""
    import builtins
    import symtable

    blocks = readme_python_blocks()
    assert len(blocks) >= 8
    for line, code in blocks:
        assert not re.search(r"<[a-z][\w-]*>", code), f"README.md line {line}: a placeholder to fill in:\n{code}"
        table = symtable.symtable(code, f"README.md:{line}", "exec")
        defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
        used: set[str] = set()
        pending = [table]
        while pending:
            scope = pending.pop()
            used |= {s.get_name() for s in scope.get_symbols()
                     if s.is_referenced() and (s.is_global() or scope is table) and not s.is_assigned()}
            pending.extend(scope.get_children())
        undefined = sorted(used - defined - set(dir(builtins)))
        assert not undefined, f"README.md line {line}: the block uses {undefined} without defining them:\n{code}"


def test_the_quoted_shard_dataset_signature_is_the_real_one() -> None:
    """The README quotes ShardDataset's whole signature: every keyword, with its default, as the
    code has it (a reader looking for the shuffle buffer's size found none quoted)."""
    import inspect

    from packer.loader import ShardDataset

    quoted = re.search(r"`ShardDataset\(manifest, split, \*, (.*?)\)` reads both formats", README, re.S)
    assert quoted is not None, "README: the ShardDataset signature in 'Loading shards' is gone"
    said = {}
    for part in re.split(r",\s*", " ".join(quoted.group(1).split())):
        name, default = part.split("=", 1)
        said[name] = default.split("|")[0].strip('"')
    real = {name: p.default for name, p in inspect.signature(ShardDataset.__init__).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert list(said) == list(real)
    assert {name: str(value) for name, value in real.items()} == said


def test_the_cluster_block_names_the_shared_cache_packer_requires_on_a_cluster() -> None:
    # packer refuses --scheduler without a shared --cache-dir or PACKER_WORK_DIR (exit 2): the
    # block a user pastes must carry one, not only the bullet below it
    block = README.split("## Running on a cluster", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    build = next(line for line in block.splitlines() if line.startswith("packer build"))
    assert "--scheduler" in build and "--cache-dir" in build, build


def test_bench_loader_help_lists_every_device_the_readme_synopsis_does() -> None:
    from click.testing import CliRunner

    from packer.cli import main

    synopsis = re.search(r"packer bench-loader [^\n]*--device ([a-z|]+)", README)
    assert synopsis is not None
    text = " ".join(CliRunner().invoke(main, ["bench-loader", "--help"]).output.split())
    assert all(device in text for device in synopsis.group(1).split("|")), (synopsis.group(1), text)
