"""PET and nuclear medicine exports as a scanner writes them, packed by real builds.

A PET series stores counts per slice with its own Rescale Slope (PS3.3 C.8.9.4: Bq/ml or SUV
after the slope, Units (0054,1001) saying which); a SPECT export holds planar images, the
projections of the acquisition (Image Type TOMO) and the reconstruction (RECON TOMO), of
which only the last has a place in patient space. The files here are written with pydicom
with the attributes those modules require, and packed by ``build``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import generate_uid

from packer.badsamples import read_bad_samples
from packer.loader import ShardDataset
from tests.dicom_files import image_dataset, save
from tests.test_targets import _build, _job

PET_STORAGE = "1.2.840.10008.5.1.4.1.1.128"
NM_STORAGE = "1.2.840.10008.5.1.4.1.1.20"


def pet_series(root: Path, patient: str, slopes: Sequence[float | None], *, units: str = "BQML",
               intercepts: Sequence[float] | None = None, seed: int = 0) -> list[tuple[Path, np.ndarray]]:
    """A PET series of ``len(slopes)`` 8×8 axial slices 3 mm apart, slice i with Rescale Slope
    ``slopes[i]`` (None: neither Rescale Slope nor Rescale Intercept), Units ``units``. Returns
    each slice's path and stored values, in position order."""
    rng = np.random.default_rng(seed)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    out = []
    for i, slope in enumerate(slopes):
        stored = rng.integers(0, 20000, (8, 8)).astype(np.uint16)
        ds = image_dataset(stored, modality="PT", sop_class=PET_STORAGE, PatientID=patient, PatientName=patient,
                           StudyInstanceUID=study, SeriesInstanceUID=series, FrameOfReferenceUID=frame,
                           ImageType=["ORIGINAL", "PRIMARY"], InstanceNumber=i + 1, Units=units,
                           ImagePositionPatient=[-12.0, -12.0, 3.0 * i], ImageOrientationPatient=[1, 0, 0, 0, 1, 0],
                           PixelSpacing=[3.0, 3.0], SliceThickness=3.0, SeriesType=["WHOLE BODY", "IMAGE"],
                           CorrectedImage=["DECY", "ATTN"], DecayCorrection="START", CountsSource="EMISSION")
        if slope is not None:
            ds.RescaleSlope, ds.RescaleIntercept = f"{slope:.6g}", f"{(intercepts or [0.0] * len(slopes))[i]:.6g}"
        out.append((save(ds, root / f"IM{i:03d}.dcm"), stored))
    return out


def _nm(path: Path, image_type: str, frames: int, *, recon: bool = False) -> Path:
    """An NM object of ``frames`` 8×8 frames, Image Type value 3 ``image_type``; ``recon``: a
    reconstruction placed by its Detector Information item, Slice Vector and slice spacing."""
    detector = Dataset()
    attrs: dict[str, Any] = {"ImageType": ["ORIGINAL", "PRIMARY", image_type, "EMISSION"], "PixelSpacing": [4.0, 4.0]}
    if recon:
        detector.ImagePositionPatient, detector.ImageOrientationPatient = [-16, -16, -20], [1, 0, 0, 0, 1, 0]
        attrs.update(FrameIncrementPointer=[0x00540080], SliceVector=list(range(1, frames + 1)),
                     NumberOfSlices=frames, SpacingBetweenSlices=4.0, SliceThickness=4.0,
                     FrameOfReferenceUID=generate_uid())
    else:  # projections: one frame per detector and angle (PS3.3 C.8.4.8)
        attrs.update(FrameIncrementPointer=[0x00540010, 0x00540020, 0x00540090],
                     EnergyWindowVector=[1] * frames, DetectorVector=[1, 2] * (frames // 2),
                     AngularViewVector=[1 + k // 2 for k in range(frames)])
    stored = np.random.default_rng(frames).integers(0, 3000, (frames, 8, 8)).astype(np.uint16)
    return save(image_dataset(stored, modality="NM", sop_class=NM_STORAGE, force_frames=True,
                              DetectorInformationSequence=DicomSequence([detector]), **attrs), path)


def _excluded(result: Any) -> dict[str, dict[str, Any]]:
    path = result.version_dir / "excluded.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {Path(r["path"]).name: r for r in map(json.loads, lines)}


@pytest.mark.parametrize("sample", ["volume", {"neighbors": 1}], ids=["volume", "neighbors"])
def test_spect_projections_are_left_out_of_a_series_job_as_planar_nm_is(tmp_path: Path, sample: Any) -> None:
    """A SPECT export holds the acquisition's projections (NM Image Type TOMO or GATED TOMO: one
    2-D frame per detector angle, no Image Position (Patient)) beside its reconstruction (RECON
    TOMO). The projections were read as cross-sectional and refused as series_no_position bad
    samples, failing a normal export's build; like planar NM they are not_requested, and the
    reconstruction packs."""
    raw = tmp_path / "raw"
    _nm(raw / "static.dcm", "STATIC", 2)
    _nm(raw / "tomo.dcm", "TOMO", 6)
    _nm(raw / "gated.dcm", "GATED TOMO", 4)
    _nm(raw / "recon.dcm", "RECON TOMO", 6, recon=True)
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                         transform={"dicom": {"output": "float16", "sample": sample}}))
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    left_out = _excluded(result)
    assert {name: r["why"] for name, r in left_out.items()} == {
        "static.dcm": "not_requested", "tomo.dcm": "not_requested", "gated.dcm": "not_requested"}
    assert "no place in patient space" in left_out["tomo.dcm"]["detail"]
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False))
    assert len(items) == (1 if sample == "volume" else 6)


@pytest.mark.parametrize(("key", "meant"), [("PET", "PT"), ("MRI", "MR"), ("SPECT", "NM"), ("ctt", "CT")])
def test_a_modality_windows_key_that_is_no_modality_code_is_a_config_error_naming_the_code(
        tmp_path: Path, key: str, meant: str) -> None:
    """modality_windows is keyed by Modality (0008,0060), whose code for PET is PT: a key PET
    matched no file, so every PT slice got the CT windows (nearly all white), silently. A key
    that is none of the standard's Defined Terms (retired ones included) is a config error
    naming the code meant."""
    from packer.config import load_job
    from packer.errors import ConfigError

    job = _job(tmp_path, [{"kind": "dicom", "root": str(tmp_path), "label": "none"}],
               transform={"dicom": {"windows": ["mediastinum"], "modality_windows": {key: [{"percentiles": [1, 99]}]}}})
    with pytest.raises(ConfigError, match=f"modality_windows.{key}: '{key}' is no DICOM Modality.*did you mean "
                                          f"{meant}"):
        load_job(job)
    for code in ("pt", "NM", "OT", "ST"):  # any case; a retired code (ST: SPECT, before NM) still names files
        job = _job(tmp_path / code, [{"kind": "dicom", "root": str(tmp_path), "label": "none"}],
                   transform={"dicom": {"windows": ["mediastinum"], "modality_windows": {code: ["file"]}}})
        assert [name for name, _ in load_job(job).dicom.modality_windows] == [code.upper()]


def _records(result: Any) -> list[dict[str, Any]]:
    return [item["record"]["metadata"] for item in ShardDataset(result.manifest_path, "train", shuffle=False,
                                                                records=True)]


@pytest.mark.parametrize("output", ["uint16", "float16"])
def test_a_volume_of_slices_with_their_own_rescale_records_every_slices_slope_and_intercept(
        tmp_path: Path, output: str) -> None:
    """Each slice of a PET series has its own Rescale Slope (counts × slope = Bq/ml). A volume's
    record held its first slice's slope as if it held for the whole volume, so mapping levels
    back by it got every other slice wrong; it now records every slice's [slope, intercept] in
    series order (``volume.slice_rescale``) and no one pair. A series of one slope keeps it."""
    slopes = [0.2, 0.5, 0.8, 1.1]
    pet_series(tmp_path / "raw" / "a", "P1", slopes, intercepts=[0.0, 0.0, 1.0, 0.0])
    pet_series(tmp_path / "raw" / "b", "P2", [0.3] * 4, seed=1)
    windows = {} if output == "float16" else {"windows": [{"center": 20000, "width": 40000}]}
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         transform={"dicom": {"output": output, "sample": "volume", **windows}}))
    records = _records(result)
    (varied,) = [m for m in records if "slice_rescale" in m["volume"]]
    (uniform,) = [m for m in records if "slice_rescale" not in m["volume"]]
    assert varied["volume"]["slice_rescale"] == [[0.2, 0.0], [0.5, 0.0], [0.8, 1.0], [1.1, 0.0]]
    assert (varied["rescale_slope"], varied["rescale_intercept"]) == (None, None)
    assert (uniform["rescale_slope"], uniform["rescale_intercept"]) == (0.3, 0.0)


def test_a_neighbour_stack_records_its_slices_rescale_in_the_stacks_order(tmp_path: Path) -> None:
    """A neighbour stack's channels are its slices -k..+k, each with its own slope: the record
    says each (``neighbors.rescale``, in the stack's order, the end slice repeated at an edge)."""
    pet_series(tmp_path / "raw", "P1", [0.2, 0.5, 0.8])
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         transform={"dicom": {"output": "float16", "sample": {"neighbors": 1}}}))
    records = sorted(_records(result), key=lambda m: m["neighbors"]["slice"])
    assert [m["neighbors"]["rescale"] for m in records] == [
        [[0.2, 0.0], [0.2, 0.0], [0.5, 0.0]], [[0.2, 0.0], [0.5, 0.0], [0.8, 0.0]],
        [[0.5, 0.0], [0.8, 0.0], [0.8, 0.0]]]
    assert all(m["rescale_slope"] is None for m in records)


def test_a_stack_of_frames_with_their_own_rescale_records_no_one_pair(tmp_path: Path) -> None:
    """frames: stack recorded every frame's pair (``frame_rescale``) beside frame 0's as the
    sample's own; where the frames differ, no one pair is the sample's."""
    from tests.dicom_files import enhanced_ct_dataset

    frames = np.random.default_rng(0).integers(0, 3000, (3, 8, 8)).astype(np.int16)
    save(enhanced_ct_dataset(frames, rescales=[(1.0, -1024.0), (2.0, -2048.0), None], windows=[None] * 3,
                             shared_rescale=(1.0, -1024.0)), tmp_path / "raw" / "varied.dcm")
    save(enhanced_ct_dataset(frames[::-1], rescales=[None] * 3, windows=[None] * 3, shared_rescale=(1.0, -1024.0)),
         tmp_path / "raw" / "uniform.dcm")
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         transform={"dicom": {"output": "float16", "frames": "stack"}}))
    by_pairs = {len({tuple(p) for p in m["frame_rescale"]}): m for m in _records(result)}
    assert by_pairs[2]["frame_rescale"] == [[1.0, -1024.0], [2.0, -2048.0], [1.0, -1024.0]]
    assert (by_pairs[2]["rescale_slope"], by_pairs[2]["rescale_intercept"]) == (None, None)
    assert (by_pairs[1]["rescale_slope"], by_pairs[1]["rescale_intercept"]) == (1.0, -1024.0)


def test_each_pet_sample_records_its_unit_and_a_job_mixing_units_is_warned_of(tmp_path: Path) -> None:
    """Units (0054,1001) says what a PET value is: Bq/ml (BQML) or an SUV the scanner wrote
    (GML, 10⁴ smaller). It was recorded nowhere, and a job packing both trained on a silent mix.
    Each PT sample records it (metadata.pet_units, as an RT Dose records dose_units), and the
    build warns, with the code ``readers``, where one job packs PT values of two units; one unit
    is no warning, and no reader's warning counts it."""
    from packer.buildwarnings import read_warnings

    pet_series(tmp_path / "raw" / "bq", "P1", [0.5, 0.6, 0.7])
    pet_series(tmp_path / "raw" / "suv", "P2", [1e-4] * 3, units="GML", seed=1)
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         transform={"dicom": {"output": "float16", "sample": "volume"}}))
    assert sorted(m["pet_units"] for m in _records(result)) == ["BQML", "GML"]
    (warning,) = [w for w in read_warnings(result.version_dir / "warnings.jsonl") if "units" in w.message]
    assert warning.code == "readers"
    assert "PT values in 2 units: BQML (3 file(s)" in warning.message and "GML (3 file(s)" in warning.message
    assert "metadata.pet_units" in warning.message and "where: {Units: BQML}" in warning.message

    one = _build(_job(tmp_path / "one", [{"kind": "dicom", "root": str(tmp_path / "raw" / "bq"), "label": "none"}],
                      transform={"dicom": {"output": "float16"}}))
    assert {m["pet_units"] for m in _records(one)} == {"BQML"}
    assert not (one.version_dir / "warnings.jsonl").exists()


def _suv_cases(root: Path) -> dict[str, np.ndarray]:
    """Two SUV volumes (float32 NIfTI, as computed upstream from a PET series), a lesion of SUV 12 and 15."""
    import nibabel as nib

    root.mkdir(parents=True)
    out = {}
    for k, peak in enumerate((12.0, 15.0)):
        suv = np.random.default_rng(k).gamma(2.0, 1.5, size=(12, 12, 6)).astype(np.float32)
        suv[5:7, 5:7, 2:4] = peak
        affine = np.diag([-4.0, -4.0, 3.0, 1.0])
        nib.save(nib.Nifti1Image(suv, affine), root / f"c{k}.nii.gz")
        out[f"c{k}"] = suv
    (root / "cases.csv").write_text("path,entity\n" + "".join(f"c{k}.nii.gz,c{k}\n" for k in range(2)))
    return out


@pytest.mark.parametrize("sample", ["volume", {"volume": {"size": [8, 16, 16]}}, "slice"],
                         ids=["volume", "padded", "slice"])
def test_nifti_windows_empty_keeps_the_suv_values_under_float16(tmp_path: Path, sample: Any) -> None:
    """README's PET advice: compute SUV upstream, pack a float NIfTI. NIfTI's default window (the
    0.5-99.5 percentiles) scaled each volume into [0, 1], and windows: [] was refused, so no SUV
    reached the shards. windows: [] under output: float16 packs the values as read, one channel
    per input channel (padding with the channel's smallest value); under uint8 it is a config
    error."""
    from packer.config import load_job
    from packer.errors import ConfigError

    truth = _suv_cases(tmp_path / "raw")
    source = [{"kind": "nifti", "root": str(tmp_path / "raw"), "table": str(tmp_path / "raw" / "cases.csv"),
               "label": "none"}]
    result = _build(_job(tmp_path, source, transform={"nifti": {"output": "float16", "sample": sample,
                                                                "windows": []}}))
    items = list(ShardDataset(result.manifest_path, "train", shuffle=False, records=True))
    for entity, suv in truth.items():
        mine = [it for it in items if it["record"]["entity_id"] == entity]
        packed = np.concatenate([it["image"].float().numpy().reshape(-1) for it in mine])
        assert packed.max() == pytest.approx(float(suv.max()), rel=1e-3)  # the lesion's SUV, float16-rounded
        (window,) = mine[0]["record"]["metadata"]["windows"]
        assert window["source"] == "values" and window["high"] == pytest.approx(float(suv.max()))
        if sample != "slice":
            (it,) = mine
            if isinstance(sample, dict):  # 6 slices padded to 8 with the volume's smallest SUV, not 0
                assert it["image"].shape == (1, 8, 16, 16)
                assert it["image"][0, 0].float().min() == pytest.approx(float(suv.min()), rel=1e-3)
            else:
                assert sorted(it["image"].float().numpy().reshape(-1)) == pytest.approx(
                    sorted(suv.astype(np.float16).astype(np.float32).reshape(-1)))
    with pytest.raises(ConfigError, match=r"transform.nifti.windows: \[\] packs the voxels' own values.*output: "
                                          "float16"):
        load_job(_job(tmp_path / "u8", source, transform={"nifti": {"output": "uint8", "windows": []}}))


def test_a_pet_slice_without_rescale_slope_and_intercept_is_unreadable_naming_them(tmp_path: Path) -> None:
    """Rescale Slope and Intercept are Type 1 in a PET image (PS3.3 C.8.9.4) and each slice has
    its own slope (~0.01 here): a slice without them was packed at slope 1, a hundredfold hotter
    than its neighbours, with no record. It is an unreadable bad sample naming both and the fix
    (its series, a volume, is then incomplete); a CT slice without them is read as stored, as
    before."""
    from tests.dicom_files import ct_dataset

    raw = tmp_path / "raw"
    files = pet_series(raw / "pet", "P1", [0.01, 0.011, None, 0.013])
    ct = ct_dataset(PatientID="P2")
    del ct.RescaleSlope, ct.RescaleIntercept
    save(ct, raw / "ct" / "slice.dcm")
    for sample in ("slice", "volume"):
        result = _build(_job(tmp_path / sample, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                             transform={"dicom": {"output": "float16", "sample": sample}},
                             validate={"max_bad_fraction": 1.0}))
        bad = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
        missing = bad[files[2][0].name]
        assert missing["reason"] == "unreadable"
        assert "(0028,1053) Rescale Slope and (0028,1052) Rescale Intercept are absent" in missing["message"]
        assert "PS3.3 C.8.9.4" in missing["message"] and "export the series again" in missing["message"]
        if sample == "slice":
            assert set(bad) == {files[2][0].name}  # the other PET slices and the CT slice pack
            assert len(_records(result)) == 4
        else:
            assert {bad[path.name]["reason"] for path, _ in files if path != files[2][0]} == {"series_incomplete"}


def test_a_secondary_capture_of_modality_pt_without_rescale_packs_as_its_display_levels(tmp_path: Path) -> None:
    """Only a PET image's rescale is Type 1 (PS3.3 C.8.9.4): a workstation's MIP saved as a
    secondary capture with Modality PT holds 8-bit display levels and no Rescale Slope or
    Intercept, as its module allows. It packs as before, not as an unreadable PET slice."""
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16)).astype(np.uint8)
    mip = image_dataset(pixels, modality="PT", sop_class="1.2.840.10008.5.1.4.1.1.7", PatientID="P1",
                        BurnedInAnnotation="NO", WindowCenter="128", WindowWidth="256",
                        ImageType=["DERIVED", "SECONDARY", "MIP"], ConversionType="WSD")
    for keyword in ("RescaleSlope", "RescaleIntercept"):
        if keyword in mip:
            delattr(mip, keyword)
    save(mip, tmp_path / "raw" / "mip.dcm")
    result = _build(_job(tmp_path / "job", [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none",
                                             "where": {"SOPClassUID": {"match": "Secondary Capture"}}}],
                         validate={"max_bad_fraction": 1.0}))
    assert list(read_bad_samples(result.version_dir / "bad_samples.jsonl")) == []
    assert len(_records(result)) == 1
