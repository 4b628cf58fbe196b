"""packer from Python in a long-lived process (a notebook, an orchestrator's worker): a call leaves
the process as it found it, and what one call did never changes what the next one says or does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import packer
from packer import redact
from packer.errors import ConfigError
from tests.helpers import REPO

KEY = "0123456789abcdef" * 4

#: A folder named as a patient: job A's data holds it, job B's (empty) root is named so too.
PATIENT = "Whitfield"


def image_job(root: Path, out: Path, mode: str) -> dict[str, Any]:
    return {"name": root.name.lower(), "sources": [{"kind": "image", "root": str(root),
                                                    "table": str(root / "labels.csv")}],
            "split": {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 1},
            "transform": {"image": {"size": [16, 16], "color": "rgb"}},
            "pack": {"format": "webdataset", "max_samples": 16}, "output": str(out), "phi": {"mode": mode}}


def plant_photos(root: Path, folders: list[str], *, images: bool = True) -> None:
    """One photo per folder (its entity), and the table naming them (``images``: False, the table alone)."""
    rng = np.random.default_rng(7)
    root.mkdir(parents=True, exist_ok=True)
    lines = ["path,label,entity,timestamp"]
    for i, folder in enumerate(folders):
        if images:
            (root / folder).mkdir()
            cv2.imwrite(str(root / folder / "img.png"), rng.integers(0, 256, size=(24, 24, 3), dtype=np.uint8))
        lines.append(f"{folder}/img.png,{'ab'[i % 2]},{folder},2024-01-01")
    (root / "labels.csv").write_text("\n".join(lines) + "\n")


def error_of(job: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        packer.validate(job, scheduler="sync", progress=False)
    return str(raised.value)


def test_a_keep_job_says_the_same_after_a_pseudonymizing_job_ran_in_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job A pseudonymizes, and its data has a folder named as a patient; job B keeps raw paths
    (phi.mode keep), and its root, which holds no image, is named so too. B's error names its root
    as written whether A ran before it or not: A's names are A's, not the process's."""
    monkeypatch.setenv("PACKER_PHI_KEY", KEY)
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv(redact.RAW_TRACEBACK_ENV, raising=False)
    folders = [PATIENT, *(f"Subject{i:03d}" for i in range(9))]
    plant_photos(tmp_path / "a", folders)
    plant_photos(tmp_path / "b" / PATIENT, folders, images=False)
    job_a = image_job(tmp_path / "a", tmp_path / "out", "pseudonymize")
    job_b = image_job(tmp_path / "b" / PATIENT, tmp_path / "out", "keep")

    alone = error_of(job_b)
    assert f"no image files under {tmp_path / 'b' / PATIENT}" in alone, alone
    packer.validate(job_a, scheduler="sync", progress=False)  # notes PATIENT as a name of A's data
    assert error_of(job_b) == alone


def test_a_pseudonymizing_job_still_hides_its_own_names_after_a_keep_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way round: each call redacts by its own job, so a pseudonymizing job's error hides
    its root's folder name (a patient's) as <id> whatever ran before it."""
    monkeypatch.setenv("PACKER_PHI_KEY", KEY)
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv(redact.RAW_TRACEBACK_ENV, raising=False)
    plant_photos(tmp_path / "keep", [f"Subject{i:03d}" for i in range(10)])
    plant_photos(tmp_path / "phi", [PATIENT, *(f"Subject{i:03d}" for i in range(9))])
    job = image_job(tmp_path / "phi", tmp_path / "out", "pseudonymize")
    job["sources"][0]["entity"] = {"path": "NOPE(?P<entity>[0-9]+)/"}  # its error quotes a file's relative path

    packer.validate(image_job(tmp_path / "keep", tmp_path / "out", "keep"), scheduler="sync", progress=False)
    message = error_of(job)
    assert "a file's path relative to the root is '<id>/<id>'" in message, message
    assert PATIENT not in message


def test_names_noted_in_one_scope_are_not_seen_in_another_thread() -> None:
    """A call of packer.api notes its job's names in its own scope: another thread of the process
    (a second task of the same worker) neither sees them nor redacts by them."""
    seen: list[tuple[bool, str]] = []

    def other_thread() -> None:
        seen.append((redact.redacting(), redact.redact_names(f"folder {PATIENT}")))

    with redact.job_scope() as noted:
        noted.roots["/data/a"] = "a"  # as loading a pseudonymizing job with that root notes it
        redact.note_names([PATIENT])
        assert redact.redact_names(f"folder {PATIENT}") == "folder <id>"
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert noted.names == {PATIENT}
    assert seen == [(False, f"folder {PATIENT}")]
    assert redact.redact_names(f"folder {PATIENT}") == f"folder {PATIENT}"  # nor does the caller's, after


def test_a_build_on_the_local_cluster_leaves_the_callers_environment_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dask's nannies set OMP_NUM_THREADS=1 (and MKL's, OpenBLAS's, MALLOC_TRIM_THRESHOLD_,
    PYTHONHASHSEED, __DASK_PARENT_PID) in this process's environment before they spawn a worker:
    left there, torch imported after a build in the same notebook, and every process it starts,
    ran on one CPU thread. The workers got them; the caller's environment is its own again."""
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_",
                 "PYTHONHASHSEED", "__DASK_PARENT_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the caller's own setting stays the caller's
    plant_photos(tmp_path / "raw", [f"S{i:02d}" for i in range(8)])
    before = dict(os.environ)

    packer.build(image_job(tmp_path / "raw", tmp_path / "out", "keep"), workers=1, progress=False, report=False)

    assert dict(os.environ) == before


#: Two local clusters of one process, the first closed while the second runs (as two calls on
#: threads close theirs); prints whether dask's stderr handler stayed silenced under the second's
#: run and close, and whether it is the caller's (INFO) again after.
TWO_CLUSTERS = """
import logging
from packer.pipeline.cluster import DASK_LOG_LEVEL, open_executor

first, second = open_executor(None, workers=1), open_executor(None, workers=1)
first.__enter__()
second.__enter__()
handlers = [h for h in logging.getLogger("distributed").handlers if isinstance(h, logging.StreamHandler)]
first.__exit__(None, None, None)
print("silenced while the second runs:", bool(handlers) and all(h.level >= DASK_LOG_LEVEL for h in handlers))
second.__exit__(None, None, None)
print("the caller's after:", all(h.level == logging.NOTSET for h in handlers))
"""


@pytest.mark.slow  # two real dask clusters in a fresh interpreter (there dask's own handler prints its records)
def test_a_cluster_that_closes_first_leaves_the_other_clusters_dask_logs_silenced() -> None:
    """Two calls on threads each run a local cluster. dask's own handler printed its INFO records
    ("Remove client", "Closing scheduler") on stderr once the first cluster closed, under the
    other's close: each cluster silenced it with a save and restore, undone in the wrong order.
    It stays silenced while any cluster runs, and is the caller's again after the last."""
    out = subprocess.run([sys.executable, "-c", TWO_CLUSTERS], capture_output=True, text=True, timeout=180,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["silenced while the second runs: True", "the caller's after: True"]
    assert [line for line in out.stderr.splitlines() if " - distributed." in line] == []


def test_overlapping_dicom_reads_on_threads_give_the_caller_its_strict_pydicom_back(tmp_path: Path) -> None:
    """pydicom's value checks and warnings are process-wide, and packer turns them off while it
    reads. Two calls on threads, the first to start ending first (A in, B in, A out, B out): each
    restoring what it found left them off for good, and the caller's strict reading (RAISE) then
    accepted an Instance Number (IS) holding a name. The last one out restores the caller's."""
    import warnings

    import pydicom
    from pydicom import config as pydicom_config
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    from packer.read.dicom_attrs import pydicom_quietly

    ds = pydicom.Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.InstanceNumber = "12345678"
    path = tmp_path / "bad_is.dcm"
    ds.save_as(path)
    path.write_bytes(path.read_bytes().replace(b"12345678", b"Doe^Jane"))

    mode = pydicom_config.settings.reading_validation_mode
    pydicom_config.settings.reading_validation_mode = pydicom_config.RAISE
    filters = list(warnings.filters)
    try:
        steps = [threading.Event() for _ in range(3)]
        inside_b: list[int] = []

        def call_a() -> None:
            with pydicom_quietly():
                steps[0].set()  # A in
                steps[1].wait(30)  # B in
            steps[2].set()  # A out

        def call_b() -> None:
            steps[0].wait(30)
            with pydicom_quietly():
                steps[1].set()
                steps[2].wait(30)
                inside_b.append(pydicom_config.settings.reading_validation_mode)  # still reading, A gone

        threads = [threading.Thread(target=call_a), threading.Thread(target=call_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert inside_b == [pydicom_config.IGNORE]
        assert pydicom_config.settings.reading_validation_mode == pydicom_config.RAISE
        assert list(warnings.filters) == filters
        with pytest.raises(ValueError, match="Doe"):
            _ = pydicom.dcmread(path, force=True).InstanceNumber
    finally:
        pydicom_config.settings.reading_validation_mode = mode
        warnings.filters[:] = filters


@pytest.mark.parametrize("options", [["endpoint_url"], ["client_kwargs=1", "client_kwargs.region_name=x"]])
def test_malformed_storage_options_from_python_are_named_as_the_call_takes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str]) -> None:
    """storage_options given as the command line's KEY=VALUE strings: a malformed one named
    ``--storage-option``, a flag the call has not got."""
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    plant_photos(tmp_path / "raw", [f"S{i:02d}" for i in range(4)])
    job = image_job(tmp_path / "raw", tmp_path / "out", "keep")
    for call in (packer.validate, packer.build):
        with pytest.raises(ConfigError, match=r"^storage_options") as raised:
            call(job, storage_options=options, scheduler="sync", progress=False)
        assert "--storage-option" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"^storage_options"):
        packer.open(tmp_path / "out", storage_options=options)


def test_a_pseudonymizing_dict_jobs_summary_points_at_what_python_offers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under pseudonymization the summary names bad files by sample key and says where their
    paths are. For a job given as a mapping it said "`packer locate <dict> KEY ...`" (no such
    job file) and "--json FILE" (a flag): it names ValidationResult's own ways now, and the job
    file a command needs."""
    monkeypatch.setenv("PACKER_PHI_KEY", KEY)
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    folders = [f"S{i:02d}" for i in range(10)]
    plant_photos(tmp_path / "raw", folders)
    (tmp_path / "raw" / "S00" / "img.png").write_bytes(b"\x89PNG\r\n")  # cut short: a bad sample
    job = image_job(tmp_path / "raw", tmp_path / "out", "pseudonymize")
    job["validate"] = {"max_bad_fraction": 0.5}

    result = packer.validate(job, scheduler="sync", progress=False)

    assert [issue.path for issue in result.issues] == [str(tmp_path / "raw" / "S00" / "img.png")]
    hint = [line.strip() for line in result.summary().splitlines() if "name samples by key" in line]
    assert hint == ["the findings and files above name samples by key: ValidationResult.issues holds each bad "
                    "file's path, ValidationResult.write_json(FILE) lists the bad and left-out files' paths; "
                    "`packer locate JOB KEY ...` prints any key's file once the job is saved as a job file JOB "
                    "(raw paths: keep them local)"]


def test_work_the_cluster_start_hands_to_a_thread_names_the_callers_surface() -> None:
    """The local cluster starts in a thread of its own (signals blocked): what is raised or
    printed there names the options as the caller spells them, like the caller's own thread."""
    from packer.errors import PYTHON_API, called_from, surface
    from packer.pipeline.cluster import _in_a_thread

    with called_from(PYTHON_API):
        seen = _in_a_thread(surface, "test: surface in a thread")
    assert seen is PYTHON_API
