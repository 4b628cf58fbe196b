"""Jobs of several sources, walked as a user would: the advice a message offers for one source
or several is followed as written, and must work.

- A batch of several shapes, where one source itself holds several, offers a view for the other
  sources; sources of different shapes never share that view (it would mix shapes again).
- The warning for class names that differ only in case offers each source that holds an odd
  spelling its own ``label:`` (its own kind, column, folder, separator), naming the source."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.loader import MixedShapesError, ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import write_job

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def write_photos(folder: Path, prefix: str, sizes: list[int], count: int, seed: int) -> None:
    """``count`` random RGB PNGs under ``folder``, their sides taken from ``sizes`` in turn."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        side = sizes[i % len(sizes)]
        cv2.imwrite(str(folder / f"{prefix}{i:02d}.png"), rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def build_job(root: Path, doc: dict[str, Any], name: str = "job.yaml") -> BuildResult:
    return build(load_job(write_job(root, doc, name)), BuildOptions(scheduler="sync", quiet=True, html_report=False))


# 1. a view offered for the sources of one shape holds one shape ------------------------------------

@pytest.fixture(scope="module")
def four_sources(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """'a' holds 24×24 and 40×40 photos, 'b' and 'd' 16×16 alone, 'c' 32×32 alone; no size."""
    root = tmp_path_factory.mktemp("four-sources")
    sides = {"a": [24, 40], "b": [16], "c": [32], "d": [16]}
    for seed, (source, sizes) in enumerate(sides.items()):
        write_photos(root / "raw" / source, source, sizes, 8, seed)
    return build_job(root, {
        "name": "four", "sources": [{"kind": "image", "root": f"raw/{s}", "label": "none"} for s in sides],
        "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
        "transform": {"image": {"color": "rgb"}}, "pack": {"format": "webdataset"}, "output": str(root / "out")})


def test_a_mixed_batch_offers_one_view_per_shape_and_each_view_stacks(four_sources: BuildResult) -> None:
    """The message listed every single-shape source in one view, sources=["b", "c", "d"], though
    b and c differ in shape: following it raised MixedShapesError again."""
    manifest = four_sources.manifest_path
    with pytest.raises(MixedShapesError) as caught:
        for _ in make_loader(ShardDataset(manifest, "train", shuffle=True, seed=0), batch_size=32):
            pass
    message = str(caught.value)
    assert "source a itself holds several shapes" in message, message
    views = [[s.strip().strip('"') for s in listed.split(",")]
             for listed in re.findall(r"ShardDataset\(manifest, split, sources=\[([^\]]*)\]\)", message)]
    # b and d share 16×16 and may share a view; c (32×32) has its own; a (two shapes) is in none
    assert sorted(views) == [["b", "d"], ["c"]], message
    assert "3×16×16" in message and "3×32×32" in message
    for view in views:
        loaded = [batch for batch in make_loader(ShardDataset(manifest, "train", sources=view), batch_size=32)]
        assert sum(len(batch["key"]) for batch in loaded) == 8 * len(view)


# 2. the label: a case-twin warning offers is each source's own -------------------------------------

def twins_job(root: Path) -> dict[str, Any]:
    """photos: folders circle/ and square/; scans: a table whose 'diagnosis' writes 'Circle';
    drawings: folders Square/ and circle/. Each spelling of a group is held by other sources."""
    for seed, cls in enumerate(("circle", "square")):
        write_photos(root / "raw" / "photos" / cls, cls, [16], 3, seed)
    for seed, cls in enumerate(("Square", "circle")):
        write_photos(root / "raw" / "drawings" / cls, "draw", [16], 3, 10 + seed)
    rows = ["path,diagnosis,entity"]
    for p in range(6):
        write_photos(root / "raw" / "scans" / f"S{p:02d}", "a", [16], 1, 20 + p)
        rows.append(f"S{p:02d}/a00.png,{'Circle' if p % 2 else 'square'},S{p:02d}")
    (root / "scans.csv").write_text("\n".join(rows) + "\n")
    return {"name": "twins",
            "sources": [{"kind": "image", "name": "photos", "root": "raw/photos", "label": "folder"},
                        {"kind": "image", "name": "scans", "root": "raw/scans", "table": str(root / "scans.csv"),
                         "label": {"column": "diagnosis"}},
                        {"kind": "image", "name": "drawings", "root": "raw/drawings", "label": "folder"}],
            "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
            "transform": {"image": {"color": "rgb"}}, "pack": {"format": "webdataset"}, "output": str(root / "out"),
            "validate": {"max_bad_fraction": 1.0}}


def twin_warnings(captured: str) -> list[str]:
    return [line for line in captured.splitlines() if "classes that differ only in case" in line]


def test_a_case_twin_warning_offers_each_source_that_holds_an_odd_spelling_its_own_label(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The warning built its label: from sources[0]'s settings alone (label: {folder: true, ...})
    and named no source: on 'scans' (a table column) it made every scan unknown_label, on
    'photos' it changed nothing. Each source holding a spelling to change gets its own label:,
    named by index and name; applied as written, the warning goes and no sample turns bad."""
    doc = twins_job(tmp_path)
    result = build_job(tmp_path, doc)
    assert not result.issues
    (warning,) = twin_warnings(capsys.readouterr().err)
    offers = re.findall(r"on sources\[(\d+)\] \((\w+)\), the source's label: (\{.*?\}\})", warning)
    offered = {(int(i), name): yaml.safe_load(label) for i, name, label in offers}
    # photos holds 'circle' and 'square' alone, the spellings kept: nothing to change there
    assert offered == {
        (1, "scans"): {"column": "diagnosis", "map": {"Circle": "circle", "square": "square"}},
        (2, "drawings"): {"folder": True, "map": {"Square": "square", "circle": "circle"}},
    }, warning
    for (index, _), label in offered.items():
        doc["sources"][index]["label"] = label
    doc["output"] = str(tmp_path / "mapped")
    mapped = build_job(tmp_path, doc, "mapped.yaml")
    assert not mapped.issues and not twin_warnings(capsys.readouterr().err)
    assert sorted(mapped.manifest["label_map"]) == ["circle", "square"]


def test_each_offered_multilabel_map_keeps_its_sources_column_and_separator_and_names_its_own_twins() -> None:
    """Two multi-label sources, one reading 'findings' split on ';' and one 'labels' split on '|':
    each offer keeps its source's column and separator, and names the twins that source holds."""
    from packer.config import parse_job
    from packer.pipeline.stages import case_twins_warning

    job = parse_job({"name": "j", "sources": [
        {"kind": "image", "name": "nih", "root": "a", "table": "a.csv",
         "label": {"kind": "multilabel", "column": "findings", "separator": ";"}},
        {"kind": "image", "name": "local", "root": "b", "table": "b.csv",
         "label": {"kind": "multilabel", "column": "labels"}}],
        "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}, Path("job.yaml"))
    by_source = {"nih": ["Effusion;Mass", "Mass", "Effusion"], "local": ["effusion|mass", "Effusion", "Mass"]}
    names = [text for texts in by_source.values() for text in texts]
    warning = case_twins_warning(job, names, by_source)
    assert warning is not None
    assert "on sources[0] (nih)" not in warning, warning  # it holds the chosen spellings alone
    assert ("on sources[1] (local), the source's label: {kind: multilabel, column: labels, "
            "map: {Effusion: Effusion, Mass: Mass, effusion: Effusion, mass: Mass}}") in warning, warning
    by_source["nih"].append("MASS")
    warning = case_twins_warning(job, [*names, "MASS"], by_source)
    assert warning is not None
    assert ("on sources[0] (nih), the source's label: {kind: multilabel, column: findings, separator: \";\", "
            "map: {Effusion: Effusion, MASS: Mass, Mass: Mass}}") in warning, warning
