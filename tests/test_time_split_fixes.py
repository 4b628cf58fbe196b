"""Time splits over samples that hold several files' pixels (volumes, neighbour stacks), and
time columns of tables: every input file counted once, each sample timed by its latest file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pydicom
import pytest

from packer.config import load_job
from packer.errors import ConfigError
from packer.exclusions import read_excluded
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.datacheck import validate_job
from packer.pipeline.split import split_codes
from tests.helpers import write_job
from tests.test_series import _write_series
from tests.test_targets import _build, _job
from tests.test_time_split import photo

CUTOFFS = {"valid": "2024-01-01", "test": "2024-07-01"}


def test_a_volume_left_out_by_drop_straddlers_leaves_out_and_counts_every_file_of_its_series(tmp_path: Path) -> None:
    """P1's first scan (2023) puts P1 in train; its second (2024-08, test's period) is a 5-slice
    volume ``drop_straddlers`` leaves out. Its 5 files are left out, not its first one: each has
    its own ``straddles_cutoff`` record, the manifest counts 5, and the 5 P1 files of 2023 and the
    5 of P2 are the 10 packed (README: one record per file; every input file counted once)."""
    raw = tmp_path / "raw"
    _write_series(raw / "early", slices=5, seed=1, patient="P1", series_uid="1.2.826.0.1.7.1",
                  overrides={i: {"AcquisitionDateTime": "20230301100000"} for i in range(5)})
    late = _write_series(raw / "late", slices=5, seed=2, patient="P1", series_uid="1.2.826.0.1.7.2",
                         overrides={i: {"AcquisitionDateTime": "20240801100000"} for i in range(5)})
    noise = np.random.default_rng(3).integers(0, 3000, size=(5, 16, 16), dtype=np.int16)  # no copy of P1's
    _write_series(raw / "other", slices=5, seed=3, patient="P2", series_uid="1.2.826.0.1.7.3",
                  overrides={i: {"AcquisitionDateTime": "20240201100000", "PixelData": noise[i].tobytes()}
                             for i in range(5)})
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none", "time": ["AcquisitionDateTime"]}],
               split={"by": "time", "cutoffs": CUTOFFS, "entity_policy": "drop_straddlers",
                      "balance": {"accept": True}},
               transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": "volume"}})
    result = _build(job)
    records = [r for r in read_excluded(result.version_dir / "excluded.jsonl") if r["why"] == "straddles_cutoff"]
    assert sorted(Path(r["path"]).name for r in records) == sorted(p.name for p in late)
    assert len({r["sample_id"] for r in records}) == 5
    inputs = result.manifest["inputs"]
    assert inputs["files"] == 15 and inputs["excluded"] == {"straddles_cutoff": 5}
    assert result.manifest["splits"]["train"]["samples"] == 1 and result.manifest["splits"]["valid"]["samples"] == 1


def test_a_volume_left_out_by_a_label_conflict_leaves_out_and_counts_every_file_of_its_series(tmp_path: Path) -> None:
    """Two patients' exports of one 4-slice series, labelled differently, under
    ``label_conflict: drop_group``: both volumes are left out, and with them their 8 files, one
    ``label_conflict`` record a file (not one a volume), beside P3's 4 packed files."""
    raw = tmp_path / "raw"
    paths = {p: _write_series(raw / p, slices=4, seed=1, patient=p, series_uid=f"1.2.826.0.1.8.{n}")
             for n, p in enumerate(("P1", "P2"))}  # pixels alike: one image, two patients
    noise = np.random.default_rng(5).integers(0, 3000, size=(4, 16, 16), dtype=np.int16)
    paths["P3"] = _write_series(raw / "P3", slices=4, seed=2, patient="P3", series_uid="1.2.826.0.1.8.9",
                                overrides={i: {"PixelData": noise[i].tobytes()} for i in range(4)})
    table = raw / "labels.csv"
    table.write_text("path,label\n" + "".join(f"{path.relative_to(raw).as_posix()},{'ab'[n % 2]}\n"
                                              for n, p in enumerate(paths) for path in paths[p]))
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "labels": str(table)}],
               split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"label_conflict": "drop_group"}},
               transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": "volume"}})
    result = _build(job)
    records = [r for r in read_excluded(result.version_dir / "excluded.jsonl") if r["why"] == "label_conflict"]
    assert sorted(r["path"] for r in records) == sorted(str(p) for p in paths["P1"] + paths["P2"])
    assert result.manifest["inputs"]["excluded"] == {"label_conflict": 8}
    assert result.manifest["splits"]["train"]["samples"] == 1


def _photos_with_two_time_columns(folder: Path, time: list[str]) -> Path:
    """Four PNGs whose table has two time columns: ``scanned`` filled for all but x2, ``taken`` an
    ISO date for x2 and, for x3, a date that would put it in another split than its ``scanned``."""
    raw = folder / "raw"
    raw.mkdir(parents=True)
    rows = ["path,label,entity,scanned,taken"]
    for i, (entity, scanned, taken) in enumerate([("A", "2023-02-01", ""), ("B", "2024-08-01", ""),
                                                   ("C", "", "2024-02-01"), ("D", "2024-03-01", "2023-01-01")]):
        assert cv2.imwrite(str(raw / f"x{i}.png"), photo(i))
        rows.append(f"x{i}.png,{'ab'[i % 2]},{entity},{scanned},{taken}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    doc = {"name": "timed", "sources": [{"name": "photos", "kind": "image", "root": "raw", "table": "raw/labels.csv",
                                         "time": time}],
           "split": {"by": "time", "cutoffs": CUTOFFS, "balance": {"accept": True}},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": "out"}
    return write_job(folder, doc)


def test_a_table_sources_time_list_is_a_fallback_read_in_order(tmp_path: Path) -> None:
    """``time: [scanned, taken]``: each row's time is its first cell that reads as a date, as a
    DICOM source's keywords are tried in order: C, with no ``scanned``, is timed by ``taken``
    (valid) where it was a ``missing_time`` bad sample; D keeps its ``scanned`` (valid), though
    its ``taken`` would put it in train."""
    result = build(load_job(_photos_with_two_time_columns(tmp_path, ["scanned", "taken"])),
                   BuildOptions(scheduler="sync", quiet=True, html_report=False))
    splits = {s: result.manifest["splits"][s]["samples"] for s in ("train", "valid", "test")}
    assert splits == {"train": 1, "valid": 2, "test": 1}
    assert result.manifest["bad_samples"]["total"] == 0


def test_every_column_of_a_table_sources_time_list_must_be_in_the_header(tmp_path: Path) -> None:
    """A misspelt second column of ``time:`` was never read and never checked: it is a config
    error naming the column, the field and the header's close name."""
    with pytest.raises(ConfigError, match=r"missing column 'taken_at' \(named by time\); did you mean 'taken'"):
        build(load_job(_photos_with_two_time_columns(tmp_path, ["scanned", "taken_at"])),
              BuildOptions(scheduler="sync", quiet=True, html_report=False))


def _midnight_scan(tmp_path: Path, policy: str, sample: Any) -> Path:
    """P1's scan running past midnight into test's cutoff day (slices 0-2 on 2024-06-30, 3-4 on
    2024-07-01: its first record puts P1 in valid), beside P2 in train and P3 in test."""
    raw = tmp_path / "raw"
    if not raw.exists():
        times = ["20240630235956", "20240630235957", "20240630235959", "20240701000001", "20240701000002"]
        _write_series(raw / "midnight", slices=5, seed=1, patient="P1", series_uid="1.2.826.0.1.9.1",
                      overrides={i: {"AcquisitionDateTime": t} for i, t in enumerate(times)})
        for n, (patient, day) in enumerate((("P2", "20230101"), ("P3", "20240801")), start=2):
            noise = np.random.default_rng(n).integers(0, 3000, size=(5, 16, 16), dtype=np.int16)
            _write_series(raw / patient, slices=5, seed=n, patient=patient, series_uid=f"1.2.826.0.1.9.{n}",
                          overrides={i: {"AcquisitionDateTime": f"{day}100000", "PixelData": noise[i].tobytes()}
                                     for i in range(5)})
    return _job(tmp_path / policy, [{"kind": "dicom", "root": str(raw), "label": "none",
                                     "time": ["AcquisitionDateTime"]}],
                split={"by": "time", "cutoffs": CUTOFFS, "entity_policy": policy, "balance": {"accept": True}},
                transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": sample,
                                     **({"size": [16, 16]} if sample != "volume" else {})}})


@pytest.mark.parametrize("sample", [{"neighbors": 1, "edge": "replicate"}, "volume"])
def test_a_stack_is_timed_by_its_latest_slice_under_both_policies_and_in_a_quick_check(tmp_path: Path,
                                                                                       sample: Any) -> None:
    """Slice 2's stack holds slice 3 (test's period), as do slices 3 and 4's: ``drop_straddlers``
    leaves those 3 out, ``validate --quick`` (headers only) leaves out the same, and under
    ``first_seen`` the ``time_order`` rule names exactly them (README: the records
    ``drop_straddlers`` would leave out); it compared each stack's centre time and missed slice
    2's, and ``--quick`` left out only the stacks centred past the cutoff. The volume holds slice
    3 too: it is placed in test by it under either policy and in ``--quick``, where ``first_seen``
    put it in valid by its first slice, test's pixels in valid, and ``time_order`` said nothing."""
    def left_out(result: Any) -> set[str]:
        return {e.sample_id for e in result.prepared.excluded if e.why == "straddles_cutoff"}

    def quiet_check(policy: str, quick: bool = False) -> Any:
        return validate_job(load_job(_midnight_scan(tmp_path, policy, sample)), quick=quick, scheduler="sync",
                            quiet=True)

    def samples_per_split(result: Any) -> list[int]:
        codes = split_codes(result.prepared.samples, result.prepared.assignment.split)
        return np.bincount(codes.astype(np.int64), minlength=3).tolist()

    checks = {"drop": quiet_check("drop_straddlers"), "quick": quiet_check("drop_straddlers", quick=True),
              "first_seen": quiet_check("first_seen")}
    (rule,) = [r for r in checks["first_seen"].prepared.audit.rules if r.rule == "time_order"]
    flagged = {m["key"] for f in rule.findings for m in f.get(f"{f.get('from', 'train')}_samples", [])}
    if sample == "volume":  # P2 in train, P1's volume and P3 in test; nothing left out, nothing out of order
        assert all(samples_per_split(r) == [1, 0, 2] for r in checks.values())
        assert not left_out(checks["drop"]) and not left_out(checks["quick"]) and not flagged
        return
    dropped = left_out(checks["drop"])
    assert len(dropped) == 3 and left_out(checks["quick"]) == dropped and flagged == dropped


def _own_entity_warnings(result: Any) -> list[str]:
    return [said for code, said in result.prepared.warnings if code == "entities" and "its own entity" in said]


def test_volumes_of_one_series_per_patient_are_not_taken_for_files_each_its_own_entity(tmp_path: Path) -> None:
    """Four patients, one 3-slice series each, in folders named by patient id, packed as volumes:
    4 samples of 4 entities, but 12 files, 3 a patient, so no file is its own entity; the
    warning that "each of its 4 files is its own entity ... leakage protection is off" counted
    volumes as files. The same files with one PatientID per file (an anonymiser's) still warn."""
    raw = tmp_path / "raw"
    for n in range(4):
        noise = np.random.default_rng(n).integers(0, 3000, size=(3, 16, 16), dtype=np.int16)
        _write_series(raw / f"PAT{n:04d}", slices=3, seed=n, patient=f"PAT{n:04d}", series_uid=f"1.2.826.0.1.6.{n}",
                      overrides={i: {"PixelData": noise[i].tobytes()} for i in range(3)})

    def checked(name: str, sample: Any) -> Any:
        job = _job(tmp_path / name, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                   transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "sample": sample,
                                        **({"size": [16, 16]} if sample != "volume" else {})}})
        return validate_job(load_job(job), scheduler="sync", quiet=True)

    assert _own_entity_warnings(checked("volumes", "volume")) == []
    for n, path in enumerate(sorted(raw.rglob("*.dcm"))):  # one id per file: each file its own entity
        ds = pydicom.dcmread(path)
        ds.PatientID = f"ANON{n:03d}"
        ds.save_as(path)
    (said,) = _own_entity_warnings(checked("slices", "slice"))
    assert "each of its 12 files is its own entity" in said
