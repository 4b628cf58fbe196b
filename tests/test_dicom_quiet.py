"""pydicom's own opinions of a header stay off stderr: a damaged file is a bad sample, not noise.

pydicom checks each value against its VR's rules as it converts it and warns (never raises) on
a mismatch, quoting the value, and its parser warns as it recovers from a damaged encoding.
packer's workers printed those warnings between the progress lines, without the file's name,
and with the quoted bytes: a patient's name among them. The DICOM kind reads under
:func:`packer.read.dicom_attrs.pydicom_quietly`: the same outcome, nothing printed, and the
caller's own pydicom setting as it was.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from dicom_files import ct_dataset, make_ref, save
from pydicom import config as pydicom_config

from packer.config import load_job
from packer.read.dicom_attrs import pydicom_quietly
from packer.read.kinds import source_kind
from packer.records import Sample

NAME = "Quaggenbush^Wilhelmina"


def _noisy_slice(path: Path) -> Path:
    """A good CT slice whose Study Instance UID is not a UID and quotes a patient's name:
    pydicom's check of the UI VR warns on it as the header is converted."""
    ds = ct_dataset(PatientName=NAME, PatientID="P1", StudyInstanceUID=f"1.2.{NAME}")
    return save(ds, path)


def _job(tmp_path: Path, root: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "quiet", "sources": [{"kind": "dicom", "root": str(root), "label": "none"}],
        "split": {"by": "entity", "ratios": {"train": 1.0}},
        "transform": {"dicom": {"windows": [{"center": 40, "width": 400}], "size": [16, 16]}},
        "pack": {"format": "webdataset"}, "phi": {"mode": "keep"}, "output": str(tmp_path / "out")}))
    return job


def test_the_dicom_kind_reads_a_header_pydicom_objects_to_without_a_warning(tmp_path: Path) -> None:
    path = _noisy_slice(tmp_path / "raw" / "a.dcm")
    job = load_job(_job(tmp_path, path.parent))
    kind, source = source_kind("dicom"), job.sources[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probed = kind.probe(make_ref(path), source, job, keep=True, placement=False)
        samples = kind.read(probed.ref, job, probed.state)
    assert isinstance(samples, list) and all(isinstance(s, Sample) for s in samples)
    assert [str(w.message) for w in caught] == []
    assert pydicom_config.settings.reading_validation_mode == pydicom_config.WARN  # left as it was


def test_pydicom_quietly_restores_the_callers_setting_and_warnings_filters() -> None:
    pydicom_config.settings.reading_validation_mode = pydicom_config.RAISE
    try:
        with pydicom_quietly():
            assert pydicom_config.settings.reading_validation_mode == pydicom_config.IGNORE
            with pytest.raises(ZeroDivisionError):  # and on the way out of an error too
                with pydicom_quietly():
                    raise ZeroDivisionError
            assert pydicom_config.settings.reading_validation_mode == pydicom_config.IGNORE
        assert pydicom_config.settings.reading_validation_mode == pydicom_config.RAISE
    finally:
        pydicom_config.settings.reading_validation_mode = pydicom_config.WARN
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("the caller's own warning", UserWarning, stacklevel=1)
    assert len(caught) == 1


@pytest.mark.slow  # a real dask cluster, in a subprocess as a user runs it
def test_a_build_over_damaged_headers_prints_no_pydicom_warning_and_no_name(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    good = _noisy_slice(raw / "good.dcm").read_bytes()
    start = good.index(b"DICM") + 4
    for k in range(6):  # headers with bits flipped all over: pydicom recovers, warns, or gives up
        damaged = bytearray(good)
        for i in range(40):
            damaged[start + (k * 97 + i * 31) % 900] ^= 1 << (i % 8)
        (raw / f"m{k}.dcm").write_bytes(bytes(damaged))
    job = _job(tmp_path, raw)
    doc = yaml.safe_load(job.read_text())
    doc["validate"] = {"max_bad_fraction": 1.0}
    job.write_text(yaml.safe_dump(doc))
    packer = str(Path(sys.executable).with_name("packer"))
    out = subprocess.run([packer, "build", str(job), "--workers", "1", "--no-report", "-q"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Warning" not in out.stderr and "Quaggenbush" not in out.stderr, out.stderr[-3000:]
    assert "bad samples: 6 of 7 files" in out.stdout, out.stdout  # the damaged ones, each with its reason
