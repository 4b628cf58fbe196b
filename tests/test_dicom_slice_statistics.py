"""A DICOM series normalised slice by slice (percentiles, a z-score) and packed as a volume or a
neighbour stack records every slice's statistics, so that a prediction can be mapped back: the
sample recorded one slice's alone (that of its first or centre slice), which reproduces no other."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from tests.helpers import write_job

MR = "1.2.840.10008.5.1.4.1.1.4"


def _series(root: Path, slices: int = 5) -> list[np.ndarray]:
    """An MR series of 8×8 slices 2 mm apart, each of another intensity; its stored pixels."""
    root.mkdir(parents=True)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    rng = np.random.default_rng(5)
    out = []
    for k in range(slices):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.TransferSyntaxUID = MR, ExplicitVRLittleEndian
        meta.MediaStorageSOPInstanceUID = sop = generate_uid()
        ds = Dataset()
        ds.file_meta, ds.preamble = meta, b"\0" * 128
        ds.SOPClassUID, ds.SOPInstanceUID, ds.PatientID, ds.Modality = MR, sop, "P1", "MR"
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.SeriesNumber, ds.InstanceNumber, ds.ImageType = 1, k + 1, ["ORIGINAL", "PRIMARY", "M"]
        ds.ImagePositionPatient, ds.ImageOrientationPatient = [0.0, 0.0, 2.0 * k], [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.PixelSpacing, ds.SliceThickness, ds.Rows, ds.Columns = [1.0, 1.0], 2.0, 8, 8
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        pixels = rng.gamma(2, 50 * (k + 1), (8, 8)).astype("<u2")
        ds.PixelData = pixels.tobytes()
        ds.save_as(root / f"s{k}.dcm", enforce_file_format=True)
        out.append(pixels.astype(np.float64))
    return out


@pytest.mark.parametrize("sample", ["volume", {"neighbors": 1}], ids=["volume", "stack"])
def test_every_slice_s_statistics_are_recorded_and_reproduce_its_packed_values(tmp_path: Path, sample: object) -> None:
    stored = _series(tmp_path / "raw" / "mr")
    job = write_job(tmp_path, {
        "name": "t", "sources": [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
        "split": {"by": "entity", "ratios": {"train": 1.0}}, "phi": {"mode": "keep"},
        "transform": {"dicom": {"output": "uint8", "windows": [{"percentiles": [5, 95]}], "sample": sample}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    (shard,) = result.version_dir.glob("train-*.tar")
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard) as tar:
        for member in tar.getmembers():
            key, ext = member.name.split(".", 1)
            samples.setdefault(key, {})[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
    for members in samples.values():
        image = np.load(io.BytesIO(members["npy"])).astype(np.float64)
        metadata = json.loads(members["json"])["metadata"]
        if sample == "volume":
            per_slice, planes, chosen = metadata["volume"]["slice_windows"], image[0], range(len(stored))
        else:
            neighbours = metadata["neighbors"]
            per_slice, planes = neighbours["windows"], image
            chosen = [min(max(neighbours["slice"] + d, 0), len(stored) - 1) for d in (-1, 0, 1)]
        assert len(per_slice) == len(planes)
        for plane, windows, k in zip(planes, per_slice, chosen, strict=True):
            low, high = windows[0]["low"], windows[0]["high"]
            assert windows[0]["count"] == 64
            assert np.array_equal(plane, np.rint(np.clip((stored[k] - low) / (high - low), 0, 1) * 255))
