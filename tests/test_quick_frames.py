"""``packer validate --quick`` reads headers only, yet counts a multi-frame DICOM file's samples
as the build keys them: under ``frames: split`` one per frame its (0028,0008) Number of Frames
declares (``<id>-f0000`` ...), under ``frames: stack`` one; so its split (a ``stratify: label``
split weighs each entity by its samples) and its counts are the build's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from dicom_files import image_dataset, save
from pydicom.uid import XRayAngiographicImageStorage

from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.datacheck import validate_job
from tests.helpers import write_job

#: frames per file: single-frame files (no Number of Frames), a one-frame file that declares it,
#: and cines of several lengths (12 frames: keys still padded to 4 digits)
FRAMES = [1, 1, 1, 1, 1, 1, 1, 30, 25, 1, 12, 20]


def _clip(path: Path, patient: str, frames: int, seed: int) -> None:
    pixels = np.random.default_rng(seed).integers(0, 4096, (frames, 8, 8)).astype(np.uint16)
    ds = image_dataset(pixels if frames > 1 else pixels[0], modality="XA", sop_class=XRayAngiographicImageStorage,
                       bits_stored=12, force_frames=seed == 9, PatientID=patient, WindowCenter=2047.5,
                       WindowWidth=4096)
    save(ds, path)


def _job(tmp_path: Path, frames: str) -> Path:
    raw = tmp_path / "raw"
    rows = ["path,label"]
    for i, count in enumerate(FRAMES):
        _clip(raw / f"c{i}.dcm", f"Q{i}", count, i)
        rows.append(f"c{i}.dcm,{'a' if i % 2 == 0 else 'b'}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    doc: dict[str, Any] = {
        "name": "cine",
        "sources": [{"kind": "dicom", "root": "raw", "labels": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3,
                  "stratify": "label"},
        "transform": {"dicom": {"windows": ["file"], "frames": frames}},
        "pack": {"format": "webdataset"},
        "output": "build",
        "phi": {"mode": "keep"},
    }
    return write_job(tmp_path, doc)


def _splits(result: Any) -> dict[str, str]:
    """Sample key → split, as a validate run assigned them."""
    return dict(result.prepared.assignment.split.items())


@pytest.mark.parametrize("frames", ["split", "stack"])
def test_quick_validate_keys_and_splits_a_multi_frame_file_as_the_build_does(tmp_path: Path, frames: str) -> None:
    job = load_job(_job(tmp_path, frames))
    quick = validate_job(job, quick=True, scheduler="sync", quiet=True)
    full = validate_job(job, quick=False, scheduler="sync", quiet=True)
    built = build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False, work_dir=tmp_path / "work"))
    index = pq.read_table(built.version_dir / "_index.parquet", columns=["key", "split"]).to_pylist()
    packed = {row["key"]: row["split"] for row in index}

    assert _splits(quick) == _splits(full) == packed
    expected = len(FRAMES) if frames == "stack" else sum(FRAMES)
    assert len(packed) == expected
    if frames == "split":
        ids = {key.split("-f")[0] for key in packed if "-f" in key}
        assert len(ids) == 4  # the four multi-frame files, the one-frame file declaring 1 frame keyed by its id
        assert sum(1 for key in packed if key.endswith("-f0011")) == 4  # the 12-, 20-, 25- and 30-frame files
