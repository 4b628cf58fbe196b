"""Source kinds are registered classes: the rest of packer asks the registry, never compares kind strings.

A new kind is its module (a ``SourceKind`` subclass that registers itself), its schema entry and
its README section; these tests hold the package to that: no module outside ``packer/read/``
branches on a kind string, every registered kind is in the job schema and the README, an
unknown kind is refused naming the registered ones, and a kind defined outside packer (here, in
this test) goes through discovery, the header probe, the pixel pass, the checks and the pack
without a line of packer changing.
"""

from __future__ import annotations

import ast
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer.config import JobConfig, LimitsConfig, SourceConfig, load_job
from packer.errors import ConfigError
from packer.read import kinds as registry
from packer.read.kinds import Probed, SourceKind, kind_names, source_kind, source_kinds
from packer.records import Issue, Sample, SampleRef
from packer.schemas import load_schema
from tests.helpers import write_job

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "packer"


def _outside_read() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent != PACKAGE / "read":
            yield path


def _kind_strings(node: ast.AST, names: frozenset[str]) -> list[str]:
    """The registered kind names ``node`` compares with, as string constants (``x == "dicom"``,
    ``kind in ("dicom", "image")``), or uses as the keys of a dict display holding two or more
    of them (a lookup by kind)."""
    found: list[str] = []
    if isinstance(node, ast.Compare):
        for side in (node.left, *node.comparators):
            elements = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            found += [e.value for e in elements if isinstance(e, ast.Constant) and e.value in names]
    elif isinstance(node, ast.Dict):  # a table keyed by kind (a batch's "image" key alone is not one)
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
        found += keys if len(keys) > 1 else []
    return found


def test_no_module_outside_read_branches_on_a_kind_string() -> None:
    """Discovery, the probe, the pixel pass, the checks, the raw store and the report ask the
    source kind (packer.read.kinds); a comparison with "dicom" outside packer/read/ is a stage
    that grew its own rule for one kind."""
    names = frozenset(kind_names())
    offenders = []
    for path in _outside_read():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            offenders += [f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}: {name!r}"
                          for name in _kind_strings(node, names)]
    assert offenders == [], "ask the source kind instead (packer/read/kinds.py):\n" + "\n".join(offenders)


def test_the_guard_would_catch_a_branch_on_a_kind() -> None:
    names = frozenset(kind_names())
    caught = [name for text in ('if ref.kind == "dicom": pass', 'ok = kind in ("image", "x")',
                                'size = {"dicom": 1, "nifti": 2}[kind]')
              for node in ast.walk(ast.parse(text)) for name in _kind_strings(node, names)]
    assert caught == ["dicom", "image", "dicom", "nifti"]


def test_the_builtin_kinds_are_registered_by_their_modules() -> None:
    assert kind_names() == ("dicom", "image", "nifti")
    modules = sorted(p.stem for p in (PACKAGE / "read").glob("*_kind.py"))
    assert modules == ["dicom_kind", "image_kind", "nifti_kind"]
    assert all(type(kind).__module__ == f"packer.read.{kind.name}_kind" for kind in source_kinds())


def test_every_registered_kind_is_in_the_schema_and_the_readme() -> None:
    schema = load_schema("job")
    assert schema["$defs"]["source"]["properties"]["kind"]["enum"] == list(kind_names())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [name for name in kind_names() if f"kind: {name}" not in readme]
    assert missing == [], f"document these source kinds in README.md (a `kind: <name>` example): {missing}"


def test_an_unknown_kind_names_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sources\\[1\\].kind: unknown source kind 'dcm'; packer reads dicom, image, "
                                          "nifti"):
        source_kind("dcm", "sources[1].kind")
    job = write_job(tmp_path, {"name": "t", "sources": [{"kind": "dcm", "root": "raw"}], "split": {"by": "entity"},
                               "pack": {"format": "webdataset"}, "output": "out"})
    with pytest.raises(ConfigError, match="dicom.*image.*nifti"):  # the schema's enum is the registry's
        load_job(job)


def test_registering_a_second_kind_of_one_name_is_refused() -> None:
    class Impostor(SourceKind):
        name = "dicom"

    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Impostor())


# -- a fourth kind, defined here -----------------------------------------------------------------

@dataclass(frozen=True)
class ArraySettings:
    """``transform.array``: nothing to set; each sample is the array scaled to uint8."""

    def to_json(self) -> dict[str, Any]:
        return {}


class ArrayKind(SourceKind):
    """``.npy`` files of 2-D float arrays, min-max scaled to one uint8 channel."""

    name = "array"
    looked_for = "files named *.npy"

    def lists(self, suffix: str) -> bool | None:
        return suffix == ".npy"

    def parse_settings(self, raw: Mapping[str, Any], shared: Mapping[str, Any]) -> ArraySettings:
        return ArraySettings()

    def probe(self, ref: SampleRef, source: SourceConfig, job: JobConfig, *, keep: bool,
              placement: bool) -> Probed | Issue:
        with open(ref.path, "rb") as fh:
            magic = fh.read(6)
        if magic != b"\x93NUMPY":
            return Issue.of(ref, stage="read", reason="unreadable", message=f"{ref.path}: not a .npy file")
        return Probed(ref=ref)

    def read(self, ref: SampleRef, job: JobConfig, state: Any = None) -> list[Sample] | Issue:
        array = np.load(ref.path).astype(np.float64)
        low, high = float(array.min()), float(array.max())
        if high <= low:
            return Issue.of(ref, stage="validate", reason="constant_image", message=f"{ref.path}: constant")
        scaled = np.rint((array - low) / (high - low) * 255).astype(np.uint8)
        return [Sample(key=ref.sample_id, ref=ref, image=scaled[None], metadata={"format": "npy"})]

    def rehearse_probe(self, ref: SampleRef, handle: Any, limits: LimitsConfig) -> bool:
        return True

    def expected_dtype(self, sample: Sample, job: JobConfig) -> np.dtype:
        return np.dtype(np.uint8)

    def dtype_rule(self, job: JobConfig) -> str:
        return "arrays are scaled to uint8"


@pytest.fixture
def array_kind(monkeypatch: pytest.MonkeyPatch) -> Sequence[str]:
    """ArrayKind registered, and the job schema's kind list holding it (its schema entry)."""
    monkeypatch.setitem(registry._REGISTRY, "array", ArrayKind())
    kinds = load_schema("job")["$defs"]["source"]["properties"]["kind"]
    monkeypatch.setitem(kinds, "enum", [*kinds["enum"], "array"])
    return kind_names()


@pytest.mark.slow
def test_a_fourth_kind_is_one_module_and_its_schema_entry(tmp_path: Path, array_kind: Sequence[str]) -> None:
    """A kind no packer module knows about builds like the others: its files are listed, probed,
    read, checked, split by the table's entities, packed, and its broken file reported."""
    from packer.pipeline.build import BuildOptions, build

    assert "array" in array_kind
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = np.random.default_rng(0)
    rows = ["path,label,entity,timestamp"]
    for n in range(6):
        np.save(raw / f"a{n}.npy", rng.normal(size=(12, 10)))
        rows.append(f"a{n}.npy,{'ab'[n % 2]},P{n},2024-01-0{n + 1}")
    (raw / "broken.npy").write_bytes(b"not an array")
    rows.append("broken.npy,a,P9,2024-01-09")
    (raw / "ignored.txt").write_text("not listed: the kind lists *.npy only")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    job = load_job(write_job(tmp_path, {"name": "arrays", "sources": [{"kind": "array", "root": "raw",
                                                                        "table": "raw/table.csv"}],
                                        "split": {"by": "entity", "ratios": {"train": 1.0}},
                                        "pack": {"format": "webdataset"}, "output": "out",
                                        "validate": {"max_bad_fraction": 0.5}}))
    result = build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False, work_dir=tmp_path / "work"))
    manifest = result.manifest
    assert manifest["inputs"] == {"files": 7, "samples": 6}
    assert manifest["bad_samples"]["by_reason"] == {"unreadable": 1}
    assert manifest["sample_schema"]["shape"] == [1, 12, 10]
    assert "array" in manifest["config"]["transform"]  # its settings are in the identity: it is used
    with tarfile.open(next(result.version_dir.glob("train-*.tar"))) as shard:  # stock tarfile reads it
        arrays = [name for name in shard.getnames() if name.endswith(".npy")]
    assert len(arrays) == 6
