"""A time split keeps a group of copies together where its first record falls: an entity whose
only record lies in test's period lands in train when an older copy of its image belongs to
another entity. The ``time_order`` finding that names it must say why (the group), not claim
that each entity goes where its own first record falls."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from tests.test_nearcopy import photo


def test_an_entity_pulled_into_train_by_an_older_copy_is_explained_by_its_group(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    rows = []

    def put(rel: str, image: np.ndarray, entity: str, when: str) -> None:
        path = raw / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), image)
        rows.append(f"{rel},x,{entity},{when}")

    rng = np.random.default_rng(0)
    for i in range(20):
        put(f"E{i:03d}/a.png", photo(i, 128), f"E{i:03d}", str(np.datetime64("2023-01-01") + int(rng.integers(0, 700))))
    put("LATE/a.png", photo(104, 128), "LATE", "2024-10-05")  # its only record: test's period
    put("OLDCOPY/a.png", photo(104, 128), "OLDCOPY", "2023-05-01")  # the same image under another id, earlier
    (raw / "labels.csv").write_text("path,label,entity,timestamp\n" + "\n".join(rows) + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"""name: tm
sources: [{{kind: image, root: {raw}, table: {raw / 'labels.csv'}}}]
split: {{by: time, cutoffs: {{valid: '2024-01-01', test: '2024-07-01'}}}}
transform: {{image: {{size: [64, 64], color: rgb}}}}
pack: {{format: webdataset}}
output: {tmp_path / 'out'}
phi: {{mode: keep}}
""")
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False,
                                               cache_dir=tmp_path / "cache"))
    leakage = json.loads((result.version_dir / "leakage.json").read_text())
    naming = [f for f in leakage["rules"]["time_order"]["findings"]
              if "LATE" in {s["entity_id"] for s in f.get("train_samples", []) + f.get("valid_samples", [])}]
    assert naming, "LATE (2024-10-05) was held in train with its older copy: time_order names it"
    for finding in naming:
        assert "group" in finding["fix"] and "copy" in finding["fix"], finding["fix"]
