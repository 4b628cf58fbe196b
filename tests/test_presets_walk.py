"""Window presets are Hounsfield-unit windows: where a job gives them (or a DICOM-only key) to a
section or a file they do not fit, packer says so, in words that lead to the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dicom_files import config, ct_dataset, image_dataset, make_ref, save, window
from pydicom.uid import MRImageStorage

from packer import api
from packer.config import parse_window
from packer.errors import ConfigError
from packer.read.dicom import read_dicom
from packer.records import Sample
from tests.helpers import write_job
from tests.test_targets import _build, _job


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


def _mr(path: Path, modality: str = "MR", **attrs: Any) -> Path:
    pixels = (np.arange(16 * 16).reshape(16, 16) * 16 + 200).astype(np.uint16)
    return save(image_dataset(pixels, modality=modality, sop_class=MRImageStorage, **attrs), path)


def _read(path: Path, *windows: Any, **kwargs: Any) -> list[Sample]:
    result = read_dicom(make_ref(path), config(*windows, **kwargs))
    assert isinstance(result, list), f"{result.reason}: {result.message}"
    return result


def _preset_notes(sample: Sample) -> list[str]:
    return [w for w in sample.metadata.get("warnings", ()) if "HU" in w]


@pytest.mark.parametrize("modality", ["MR", "CR", "DX", "MG", "US", "XA", "PT", "NM"])
def test_a_non_ct_file_windowed_by_hu_presets_says_so(tmp_path: Path, modality: str) -> None:
    """An MR (any file whose stored values are not HU) under CT presets was packed through them
    with no word: its lung channel one level in every pixel. It is packed, and says which windows
    were HU presets, its Modality, and what to give instead."""
    lung, bone = parse_window("lung", "w"), parse_window("bone_body", "w")
    (sample,) = _read(_mr(tmp_path / "mr.dcm", modality), lung, window(2000, 4000), bone)
    (note,) = _preset_notes(sample)
    assert f"Modality {modality}" in note and "lung, bone_body" in note, note
    assert "c2000w4000" not in note, note  # an explicit window is the user's own, in the file's units
    assert f"modality_windows: {{{modality}: [zscore]}}" in note and "[file]" in note, note
    assert [w["name"] for w in sample.metadata["windows"]] == ["lung", "c2000w4000", "bone_body"]


def test_a_fallback_preset_that_was_applied_is_named_too(tmp_path: Path) -> None:
    """windows: [file] with fallback_window: mediastinum: an MR without Window Center/Width is
    windowed by the preset, and says so; one with its own window is not."""
    file_only = parse_window("file", "w")
    fallback = parse_window("mediastinum", "f")
    (without,) = _read(_mr(tmp_path / "a.dcm"), file_only, fallback_window=fallback)
    assert ["mediastinum" in n for n in _preset_notes(without)] == [True], without.metadata.get("warnings")
    (own,) = _read(_mr(tmp_path / "b.dcm", WindowCenter=2000, WindowWidth=4000), file_only, fallback_window=fallback)
    assert _preset_notes(own) == []


def test_ct_or_no_modality_or_no_preset_says_nothing(tmp_path: Path) -> None:
    lung = parse_window("lung", "w")
    (ct,) = _read(save(ct_dataset(), tmp_path / "ct.dcm"), lung)
    assert "warnings" not in ct.metadata
    (blank,) = _read(_mr(tmp_path / "none.dcm", modality=""), lung)
    assert "warnings" not in blank.metadata
    (capture,) = _read(_mr(tmp_path / "ot.dcm", modality="OT", RescaleType="HU", RescaleSlope=1,
                           RescaleIntercept=-1024), lung)  # a secondary capture of a CT says its values are HU
    assert "warnings" not in capture.metadata
    (mr,) = _read(_mr(tmp_path / "mr.dcm"), window(2000, 4000), parse_window("zscore", "w"), output="float16")
    assert "warnings" not in mr.metadata
    (own,) = _read(_mr(tmp_path / "mrf.dcm", WindowCenter=2000, WindowWidth=4000), lung,
                   modality_windows=(("MR", (parse_window("file", "w"),)),), fallback_window=parse_window("lung", "f"))
    assert "warnings" not in own.metadata  # MR's own windows: its file's, the fallback preset unused
    assert own.metadata["windows"][0]["source"] == "file"


def test_the_build_packs_the_mr_and_warns_of_it(tmp_path: Path) -> None:
    from packer.demo import write_ct_slice

    raw = tmp_path / "raw"
    write_ct_slice(raw / "ct.dcm", patient_id="P1", study_date="20240101",
                   pixels_hu=np.random.default_rng(0).normal(0, 300, size=(32, 32)).astype(np.float32))
    _mr(raw / "mr.dcm", PatientID="P2")
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"windows": ["lung", "mediastinum"], "size": [16, 16]}})
    result = _build(job)
    assert (result.version_dir / "bad_samples.jsonl").read_text() == ""
    kept = result.version_dir / "warnings.jsonl"
    warned = [json.loads(line)["message"] for line in (kept.read_text() if kept.exists() else "").splitlines()]
    assert any("Modality MR" in w and "HU" in w for w in warned), warned


def test_a_one_letter_typo_of_a_key_here_is_a_typo_though_a_section_beside_takes_it(tmp_path: Path) -> None:
    """transform.dicom.window is transform.image's key, and one letter from transform.dicom's windows."""
    doc = _nifti_job(tmp_path, {"windows": ["lung"]})
    doc["transform"] = {"dicom": {"window": ["lung"]}}
    message = _load_error(tmp_path, doc)
    assert message.endswith("transform.dicom.window: unknown key (did you mean 'windows'?)"), message
