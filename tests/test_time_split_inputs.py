"""The times a ``by: time`` split reads, from a table's rows, a file's path and a DICOM header.

Rows of one file that write one instant in two ISO forms agree on it; a file named by its date
is timed by its name under ``time: {component: -1}``; and a DICOM ``time:`` that can date no file
(a keyword of no date VR, or a time of day alone) is refused when the job is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.pipeline.discover import discover

CUTOFFS = {"valid": "2024-01-01", "test": "2024-07-01"}


def _images(root: Path, names: list[str]) -> None:
    for i, name in enumerate(names):  # decodable, each its own (no planted duplicates)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / name), np.random.default_rng(i).integers(0, 255, (24, 24, 3)).astype(np.uint8))


def _job(tmp_path: Path, source: dict[str, Any]) -> Path:
    doc = {"name": "t", "sources": [{"name": "s", "kind": "image", "root": "img", **source}],
           "split": {"by": "time", "cutoffs": CUTOFFS},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": "out",
           "validate": {"max_bad_fraction": 0.9}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# -- rows of one file (repeated: same) that write its time in two forms ----------------------------


def _rows_job(tmp_path: Path, times: list[str]) -> Path:
    _images(tmp_path / "img", ["a.png", "b.png"])
    rows = [f"a.png,cat,A,{t}" for t in times] + ["b.png,dog,B,2023-01-01"]
    (tmp_path / "t.csv").write_text("\n".join(["path,label,entity,timestamp", *rows]) + "\n")
    return _job(tmp_path, {"table": {"file": "t.csv", "repeated": "same"}})


@pytest.mark.parametrize("second", ["20240305", "2024-03-05 00:00", "2024-03-05T00:00:00", "2024-03-05T00:00+02:00"])
def test_rows_writing_one_instant_in_two_iso_forms_agree_on_the_time(tmp_path: Path, second: str) -> None:
    """2024-03-05 read as a date and 20240305 as 2024-03-05T00:00:00: the strings differ, the
    instant does not (a date is its midnight, as the split compares it with a cutoff), and the file
    was a bad_target 'rows must agree'. It is packed with the first row's time."""
    found = discover(load_job(_rows_job(tmp_path, ["2024-03-05", second])))
    assert found.issues == []
    assert {r.relpath: r.time for r in found.refs}["a.png"] == "2024-03-05"


@pytest.mark.parametrize(("first", "second"), [("2024-03-05", "2024-03-06"), ("2024-03-05", "2024-03-05T14:30"),
                                               ("2024-03-05", "05/03/2024"), ("soon", "later")])
def test_rows_giving_two_instants_still_make_the_file_a_bad_target(tmp_path: Path, first: str, second: str) -> None:
    """A time of day other than midnight is another instant than the date alone; a cell that reads
    as no time compares as written."""
    found = discover(load_job(_rows_job(tmp_path, [first, second])))
    (issue,) = found.issues
    assert (issue.reason, Path(issue.path).name) == ("bad_target", "a.png")
    assert issue.message == (f"{tmp_path / 't.csv'} rows 2 and 3 name 'a.png' with time {first!r} and {second!r}; "
                             "rows of one file must agree")
