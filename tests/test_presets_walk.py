"""Window presets are Hounsfield-unit windows: where a job gives them (or a DICOM-only key) to a
section or a file they do not fit, packer says so, in words that lead to the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer import api
from packer.errors import ConfigError
from tests.helpers import write_job


def _load_error(tmp_path: Path, doc: dict[str, Any]) -> str:
    job = write_job(tmp_path, doc)
    with pytest.raises(ConfigError) as raised:
        api.load(job)
    return str(raised.value)


def _nifti_job(tmp_path: Path, nifti: dict[str, Any]) -> dict[str, Any]:
    import nibabel as nib

    (tmp_path / "raw").mkdir(exist_ok=True)
    nib.save(nib.Nifti1Image(np.arange(48, dtype=np.int16).reshape(4, 4, 3), np.eye(4)), tmp_path / "raw" / "a.nii.gz")
    return {"name": "x", "sources": [{"kind": "nifti", "root": "raw", "label": "none"}],
            "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"nifti": nifti},
            "pack": {"format": "webdataset"}, "output": "out", "phi": {"mode": "keep"}}


def _image_job(tmp_path: Path, image: dict[str, Any]) -> dict[str, Any]:
    import cv2

    (tmp_path / "img").mkdir(exist_ok=True)
    cv2.imwrite(str(tmp_path / "img" / "a.png"), (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16))
    return {"name": "x", "sources": [{"kind": "image", "root": "img", "label": "none"}],
            "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"image": image},
            "pack": {"format": "webdataset"}, "output": "out"}


@pytest.mark.parametrize("nifti", [{"modality_windows": {"CT": ["lung"]}},
                                   {"windows": ["lung"], "modality_windows": {"CT": ["lung"]}}])
def test_modality_windows_under_nifti_is_named_a_transform_dicom_key(tmp_path: Path, nifti: dict[str, Any]) -> None:
    """transform.nifti.modality_windows was refused as a typo of 'windows' ("did you mean
    'windows'? It is given too: keep one of the two"), never saying the key exists, for DICOM
    files, whose Modality picks their windows: the message names the section that takes it."""
    message = _load_error(tmp_path, _nifti_job(tmp_path, nifti))
    assert "transform.nifti.modality_windows: unknown key (modality_windows is a transform.dicom key" in message, \
        message
    assert "Modality" in message, message
    assert "transform.nifti does not take it" in message, message
    if "windows" in nifti:
        assert "transform.nifti.windows is given" in message, message
    else:
        assert "give transform.nifti.windows" in message, message


def test_modality_windows_under_image_is_named_a_transform_dicom_key(tmp_path: Path) -> None:
    message = _load_error(tmp_path, _image_job(tmp_path, {"modality_windows": {"CT": ["lung"]}}))
    assert "transform.image.modality_windows: unknown key (modality_windows is a transform.dicom key" in message, \
        message
    assert "transform.image does not take it" in message, message
    assert "window" in message.split("does not take it", 1)[1], message  # what transform.image takes


def test_a_key_of_two_other_sections_names_both(tmp_path: Path) -> None:
    """spacing is a transform.dicom and a transform.nifti key; an image has no spacing in mm."""
    message = _load_error(tmp_path, _image_job(tmp_path, {"spacing": [1.0, 1.0]}))
    assert "spacing is a transform.dicom and transform.nifti key" in message, message


def test_a_plain_typo_is_still_a_typo(tmp_path: Path) -> None:
    message = _load_error(tmp_path, _nifti_job(tmp_path, {"windowz": ["lung"]}))
    assert message.endswith("transform.nifti.windowz: unknown key (did you mean 'windows'?)"), message


@pytest.mark.parametrize("value", ["lung", "mediastinum", ["lung"], 40])
def test_an_image_window_it_cannot_take_lists_the_forms_it_takes(tmp_path: Path, value: Any) -> None:
    """transform.image.window: lung got jsonschema's bare "'lung' is not valid under any of the
    given schemas": no word of what an image window is, nor that presets are HU windows."""
    message = _load_error(tmp_path, _image_job(tmp_path, {"window": value}))
    assert "transform.image.window" in message, message
    assert "{center, width}" in message and "{percentiles: [low, high]}" in message, message
    assert "presets (lung, mediastinum, ...) are ct windows in hu" in message.lower(), message
    assert "transform.dicom and transform.nifti" in message, message


def test_a_one_letter_typo_of_a_key_here_is_a_typo_though_a_section_beside_takes_it(tmp_path: Path) -> None:
    """transform.dicom.window is transform.image's key, and one letter from transform.dicom's windows."""
    doc = _nifti_job(tmp_path, {"windows": ["lung"]})
    doc["transform"] = {"dicom": {"window": ["lung"]}}
    message = _load_error(tmp_path, doc)
    assert message.endswith("transform.dicom.window: unknown key (did you mean 'windows'?)"), message
