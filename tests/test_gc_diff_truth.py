"""What packer diff, ls and gc say of versions must be true of the folders: copies of one image
paired with their own new keys, a damaged version folder told from a registry copy, a linked-in
version not counted as this dataset's, bytes held by a version gc leaves alone blamed on it, and
the leftovers of a killed build named and removed.

Real builds of real image files; expected facts come from the inputs and from the folders
(``os.stat``, the Parquet tables), never from the code under test.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from packer.config import load_job
from packer.demo import render_photo, write_demo_key, write_photo
from packer.inspection import diff_datasets, format_diff
from packer.pipeline.build import BuildOptions, build
from tests.helpers import write_job


def _build(tmp: Path, root: Path, name: str = "ds", **extra: Any) -> Path:
    """Build ``root``'s images (``labels.csv``: path, label, entity, timestamp) into ``tmp/out``;
    the version folder."""
    doc: dict[str, Any] = {
        "name": name,
        "sources": [{"kind": "image", "root": str(root), "table": str(root / "labels.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 1},
        "transform": {"image": {"size": [16, 16], "color": "rgb"}},
        "pack": {"format": "webdataset", "max_samples": 8},
        "output": str(tmp / "out"),
        "phi": {"mode": "pseudonymize", "key_file": str(write_demo_key(tmp, 7))},
        "validate": {"max_bad_fraction": 0.9},
        **extra,
    }
    job = load_job(write_job(tmp / f"job-{root.name}", doc))
    return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir


def _images_with_copies(root: Path, entities: int = 12) -> dict[str, str]:
    """Per entity two images of its own and one image filed twice (``dup0.png`` labelled a,
    ``dup1.png`` labelled b: a label conflict, common in real data). The label of each path."""
    import numpy as np

    rng = np.random.default_rng(3)
    labels: dict[str, str] = {}
    rows = ["path,label,entity,timestamp"]
    for e in range(entities):
        for i in range(2):
            labels[f"E{e}/{i}.png"] = "ab"[(e + i) % 2]
            write_photo(root / f"E{e}/{i}.png", render_photo(rng, ("circle", "square")[i], height=24, width=24))
        copy = render_photo(rng, "circle", height=24, width=24)
        for j, label in enumerate("ab"):
            labels[f"E{e}/dup{j}.png"] = label
            write_photo(root / f"E{e}/dup{j}.png", copy)
    rows += [f"{path},{label},{path.split('/')[0]},2023-01-0{1 + len(rows) % 8}T00:00:00"
             for path, label in labels.items()]
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return labels


# -- diff: copies of one image under new keys ----------------------------------------------------------


def test_a_renamed_source_pairs_each_copy_of_an_image_with_its_own_new_key(tmp_path: Path) -> None:
    """Renaming the source root changes every pseudonymized key; diff pairs removed and added
    samples by their sha256. Where an image is filed twice with two labels, it paired the copies
    "in key order", and the new keys sort in another order than the old ones: a pure rename showed
    copies relabeled a -> b and b -> a. It now pairs copies of the same target (then split, then
    entity) first: nothing relabeled or moved; a real relabel beside the rename is still listed."""
    raw = tmp_path / "raw"
    labels = _images_with_copies(raw)
    before = _build(tmp_path, raw)
    scans = Path(shutil.copytree(raw, tmp_path / "scans"))
    after = _build(tmp_path, scans)
    old = pq.read_table(before / "_index.parquet", columns=["key", "label", "sha256"]).to_pylist()
    new = pq.read_table(after / "_index.parquet", columns=["key", "label", "sha256"]).to_pylist()
    assert not {row["key"] for row in old} & {row["key"] for row in new}  # every key changed
    assert len({row["sha256"] for row in old}) == len(labels) - 12  # each entity's copy: one digest, two labels

    diff = diff_datasets(before, after)
    assert diff.added == diff.removed == diff.relabeled == diff.moved == ()
    assert len(diff.rekeyed) == len(labels)
    assert [(c.old_key, c.old_label, c.new_label) for c in diff.rekeyed if c.old_label != c.new_label] == []
    assert [c.old_key for c in diff.rekeyed if c.old_split != c.new_split] == []
    assert not any(column.startswith("relabeled") for counts in diff.by_label().values() for column in counts)
    assert "leak risk" not in format_diff(diff, limit=100)

    # one real relabel (of an image filed once) beside the rename: that one, and only it, is listed
    edited = (scans / "labels.csv").read_text().replace("E3/0.png,b,", "E3/0.png,a,")
    assert labels["E3/0.png"] == "b" and edited != (scans / "labels.csv").read_text()
    (scans / "labels.csv").write_text(edited)
    relabeled = _build(tmp_path, scans)
    again = diff_datasets(before, relabeled)
    assert [(c.old_label, c.new_label) for c in again.rekeyed if c.old_label != c.new_label] == [("b", "a")]
