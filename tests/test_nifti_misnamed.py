"""NIfTI files whose name says one thing and whose bytes another, and the too_large message.

A ``.nii.gz`` that arrives uncompressed (a web server or browser that inflated a download sent
with ``Content-Encoding: gzip``, a ``gunzip -c`` kept under the old name) and a ``.nii`` that is
really gzip data (``gzip -c`` renamed) cannot be read by nibabel, which picks its decompressor
from the suffix. They stay ``unreadable``, but the message must say what the bytes are and that
renaming the file is the whole fix: "export it again" sends a user back to the scanner.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from packer.config import LimitsConfig
from packer.read.nifti import NiftiDefect, load_header


def _write(path: Path, *, version: int = 1) -> Path:
    klass = nib.Nifti2Image if version == 2 else nib.Nifti1Image
    nib.save(klass(np.arange(4 * 5 * 3, dtype=np.int16).reshape(4, 5, 3), np.diag([0.8, 0.8, 2.5, 1.0])), path)
    return path


@pytest.mark.parametrize("version", [1, 2])
def test_an_uncompressed_file_named_nii_gz_says_rename_it_nii(tmp_path: Path, version: int) -> None:
    real = _write(tmp_path / "case.nii", version=version)
    misnamed = real.rename(tmp_path / "case.nii.gz")
    with pytest.raises(NiftiDefect) as caught:
        load_header(str(misnamed), LimitsConfig(), channels_from=None)
    assert caught.value.reason == "unreadable"
    assert f"an uncompressed NIfTI-{version} file named .nii.gz" in caught.value.message
    assert "rename it case.nii" in caught.value.message


def test_a_gzip_file_named_nii_says_rename_it_nii_gz(tmp_path: Path) -> None:
    real = _write(tmp_path / "case.nii.gz")
    misnamed = real.rename(tmp_path / "case.nii")
    with pytest.raises(NiftiDefect) as caught:
        load_header(str(misnamed), LimitsConfig(), channels_from=None)
    assert caught.value.reason == "unreadable"
    assert "gzip-compressed data named .nii" in caught.value.message and "rename it case.nii.gz" in caught.value.message


def test_a_file_that_is_not_nifti_at_all_keeps_the_export_again_advice(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.nii.gz"
    with gzip.open(bogus, "wb") as fh:
        fh.write(b"these are a radiologist's notes, not a volume" * 20)
    with pytest.raises(NiftiDefect) as caught:
        load_header(str(bogus), LimitsConfig(), channels_from=None)
    assert caught.value.reason == "unreadable" and "rename" not in caught.value.message


def test_a_header_promising_a_huge_volume_says_nothing_was_decoded_once(tmp_path: Path) -> None:
    """A decompression bomb's header (4000³ int16) is refused from the header; the message names the
    limit and says once that nothing was decoded."""
    path = _write(tmp_path / "bomb.nii")
    raw = bytearray(path.read_bytes())
    header = nib.Nifti1Header.from_fileobj(__import__("io").BytesIO(bytes(raw[:348])), check=False)
    header["dim"] = [3, 4000, 4000, 4000, 1, 1, 1, 1]
    raw[:348] = header.binaryblock
    bomb = tmp_path / "bomb.nii.gz"
    with gzip.open(bomb, "wb") as fh:
        fh.write(bytes(raw))
    with pytest.raises(NiftiDefect) as caught:
        load_header(str(bomb), LimitsConfig(), channels_from=None)
    assert caught.value.reason == "too_large" and "limits.max_decoded_bytes" in caught.value.message
    assert caught.value.message.count("nothing was decoded") == 1, caught.value.message


def test_a_label_map_with_a_stray_fraction_names_the_value_and_how_many(tmp_path: Path) -> None:
    """A float32 label map of 0.0/1.0/2.0 packs; one interpolated voxel (1.5, a label map resampled
    linearly by some tool) makes it mask_values, and the message says which value and how many."""
    from packer.badsamples import read_bad_samples
    from tests.test_nifti import nifti_job, phantom, run, save

    labels = np.zeros((24, 20, 10), dtype=np.float32)
    labels[4:8, 5:9, 2:6] = 1.0
    labels[10:12, 5:9, 2:6] = 2.0
    labels[3, 3, 3] = 1.5
    save(tmp_path / "raw" / "a.nii.gz", phantom())
    save(tmp_path / "raw" / "a_seg.nii.gz", labels)
    job = nifti_job(tmp_path, ["a.nii.gz,P1,a_seg.nii.gz"], header="path,entity,seg",
                    source={"mask": {"column": "seg", "classes": [0, 1, 2]}})
    (issue,) = read_bad_samples(run(job, tmp_path).version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "mask_values"
    assert "1 voxel(s) hold values that are not whole numbers, e.g. 1.5" in issue["message"], issue["message"]
