"""A series job's files left out on purpose are counted by Modality and SOP class.

The manifest counts the files a build leaves out by why, by modality and by SOP class
(``inputs.excluded``, ``excluded_by_modality``, ``excluded_by_sop_class``). A slice job's record
of a localizer carries its header's Modality and SOP class; a series job read the same header
to assemble its series, yet its records of a dropped localizer and of an end slice under
``edge: skip`` carried neither, so the per-modality and per-class counts missed them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_series import _series_job, _write_series
from tests.test_targets import _build

LOCALIZER = {"ImageType": ["ORIGINAL", "PRIMARY", "LOCALIZER"], "ImagePositionPatient": [0.0, 0.0, 40.0]}


def _left_out(version_dir: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (version_dir / "excluded.jsonl").read_text().splitlines()]


def test_a_dropped_localizer_is_counted_by_its_headers_modality_and_sop_class(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    scout = _write_series(raw / "scout", seed=7, patient="F", overrides={0: LOCALIZER})
    _write_series(raw / "plain", seed=8, patient="G")
    result = _build(_series_job(tmp_path, raw, series={"drop_localizers": True}))
    (record,) = _left_out(result.version_dir)
    assert Path(record["path"]) == scout[0]
    assert (record["why"], record["modality"], record["sop_class"]) == ("not_requested", "CT", "CT Image Storage")
    inputs = json.loads(result.manifest_path.read_text())["inputs"]
    assert inputs["excluded"] == {"not_requested": 1}
    assert inputs["excluded_by_modality"] == {"CT": 1}
    assert inputs["excluded_by_sop_class"] == {"CT Image Storage": 1}


def test_end_slices_left_out_by_edge_skip_are_counted_by_modality_and_sop_class(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write_series(raw / "a", seed=1, slices=5)  # neighbors: 2 stacks its centre only: 4 files left out
    _write_series(raw / "b", seed=2, slices=4, patient="P2")  # too short for a stack: all 4 left out
    result = _build(_series_job(tmp_path, raw, sample={"neighbors": 2, "edge": "skip"}))
    records = _left_out(result.version_dir)
    assert len(records) == 8
    assert {(r["modality"], r["sop_class"]) for r in records} == {("CT", "CT Image Storage")}
    inputs = json.loads(result.manifest_path.read_text())["inputs"]
    assert inputs["excluded"] == {"not_requested": 8}
    assert inputs["excluded_by_modality"] == {"CT": 8}
    assert inputs["excluded_by_sop_class"] == {"CT Image Storage": 8}
