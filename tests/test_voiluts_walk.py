"""VOI LUTs as writers get them wrong: LUT Data wider than the descriptor's bits, a first mapped
value whose sign the input (or the file's explicit VR) decides, and windows that float16 does not apply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
import yaml
from dicom_files import config, ct_dataset, image_dataset, lut_item, make_ref, save, window
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ImplicitVRLittleEndian

from packer.config import load_job, transform_warnings
from packer.read.dicom import read_dicom
from packer.records import Sample
from packer.transform.window import voi_lut_bits

CR = "1.2.840.10008.5.1.4.1.1.1"
DX = "1.2.840.10008.5.1.4.1.1.1.1"
EVERY_12_BIT_VALUE = np.arange(4096, dtype=np.uint16).reshape(64, 64)


def read(path: Path, *windows: Any, **kwargs: Any) -> list[Sample]:
    result = read_dicom(make_ref(path), config(*windows, **kwargs))
    assert isinstance(result, list), f"{result.reason}: {result.message}"
    return result


def radiograph(sop_class: str = CR, modality: str = "CR", **attrs: Any) -> Dataset:
    return image_dataset(EVERY_12_BIT_VALUE, modality=modality, sop_class=sop_class, bits_stored=12, **attrs)


def voi_item(descriptor: tuple[int, int, int], data: np.ndarray, descriptor_vr: str | None = None) -> Dataset:
    """A VOI LUT item whose LUT Data is OW; the descriptor in ``descriptor_vr`` (US or SS) when given."""
    item = Dataset()
    if descriptor_vr is None:
        item.LUTDescriptor = list(descriptor)
    else:
        item.add_new(0x00283002, descriptor_vr, list(descriptor))
    item.add_new(0x00283006, "OW", np.asarray(data, dtype="<u2").tobytes())
    return item


def expected_levels(modality: np.ndarray, first: int, lut: np.ndarray, bits: int) -> np.ndarray:
    """PS3.3 C.11.2.1.1 written out: LUT[clip(x - first)] over 0..2^bits - 1, as 8-bit levels."""
    entry = lut[np.clip(modality.astype(np.int64) - first, 0, lut.size - 1)].astype(np.float64)
    return np.rint(entry / (2 ** bits - 1) * 255).astype(np.int64)


# ---------------------------------------------------------------- LUT Data wider than the descriptor's bits


def test_voi_lut_entries_above_the_declared_bits_are_read_over_the_bits_they_use_and_the_sample_says_so(
        tmp_path: Path) -> None:
    """A descriptor [4096, 0, 12] over 16-bit entries (0..65520, a known writer bug) packed 94% of
    the pixels white (entries / 4095, clipped). They are read over 0..65535, the smallest range
    that holds them, and the window record says what was declared and what was used."""
    lut = (np.arange(4096) * 16).astype(np.uint16)
    ds = radiograph()
    ds.VOILUTSequence = DicomSequence([voi_item((4096, 0, 12), lut)])
    sample = read(save(ds, tmp_path / "wide.dcm"))[0]
    np.testing.assert_array_equal(sample.image[0].astype(np.int64),
                                  expected_levels(EVERY_12_BIT_VALUE, 0, lut, 16))
    assert int((sample.image == 255).sum()) == 8  # entries 65408.. round to 255, not the 3840 past 4095
    assert sample.metadata["windows"][0]["lut_bits"] == {"declared": 12, "used": 16}


def test_voi_lut_entries_above_an_8_bit_descriptor_are_read_over_the_bits_they_use(tmp_path: Path) -> None:
    """Entries up to 1023 under an 8-bit descriptor, one 16-bit word each (not two bytes a word):
    read over 10 bits, not clipped at 255."""
    lut = (np.arange(4096) // 4).astype(np.uint16)
    ds = radiograph()
    ds.VOILUTSequence = DicomSequence([voi_item((4096, 0, 8), lut)])
    sample = read(save(ds, tmp_path / "wide8.dcm"))[0]
    np.testing.assert_array_equal(sample.image[0].astype(np.int64),
                                  expected_levels(EVERY_12_BIT_VALUE, 0, lut, 10))
    assert sample.metadata["windows"][0]["lut_bits"] == {"declared": 8, "used": 10}


@pytest.mark.parametrize(("declared", "largest", "used"),
                         [(12, 4095, 12), (12, 4096, 13), (12, 65535, 16), (8, 255, 8), (8, 256, 9), (16, 65535, 16),
                          (16, 4095, 12), (10, 100, 8), (10, 600, 10)])
def test_voi_lut_bits_widen_to_hold_the_largest_entry_and_narrow_only_below_half_the_range(
        declared: int, largest: int, used: int) -> None:
    assert voi_lut_bits(declared, np.array([0, largest, largest])) == used


@pytest.mark.parametrize("declared", [8, 12])
def test_a_stray_entry_just_past_the_declared_range_is_clipped_not_read_as_a_wider_range(declared: int) -> None:
    """round(i * 2**n / (2**n - 1)) ends at 2**n: one entry in 2**n past the range is the writer's
    rounding; widening by it would divide every entry by 2**(n+1) - 1 and halve the image."""
    top = (1 << declared) - 1
    lut = np.rint(np.arange(top + 1) * (top + 1) / top).astype(np.uint16)
    assert int(lut.max()) == top + 1 and voi_lut_bits(declared, lut) == declared
    wide = lut.copy()
    wide[: wide.size // 50] = top + 1  # 2 entries in 100 past the range: read over the bits they use
    assert voi_lut_bits(declared, wide) == declared + 1


@pytest.mark.parametrize("entries", [10, 32, 99])
def test_one_stray_entry_in_a_short_lut_is_clipped_too(entries: int) -> None:
    lut = np.rint(np.arange(entries) * 4096 / (entries - 1)).astype(np.uint16)
    assert int(lut.max()) == 4096 and voi_lut_bits(12, lut) == 12


def test_a_modality_lut_passes_entries_above_its_declared_bits_through_as_modality_values(tmp_path: Path) -> None:
    """A Modality LUT's entries are modality values, never divided by its range: one of 12 declared
    bits holding 16-bit entries gives those entries, unclipped, to the window after it."""
    table = (np.arange(4096) * 16).astype(np.uint16)
    ds = radiograph(modality="OT")
    ds.ModalityLUTSequence = DicomSequence([lut_item(0, 12, table.tolist())])
    sample = read(save(ds, tmp_path / "mlut.dcm"), window(32768, 65536))[0]
    expected = np.rint(np.clip((table[EVERY_12_BIT_VALUE] - 32767.5) / 65535 + 0.5, 0, 1) * 255)
    np.testing.assert_array_equal(sample.image[0], expected)


# ---------------------------------------------------------------- the first mapped value's sign


def test_a_negative_first_mapped_value_under_a_negative_rescale_slope_is_read_signed(tmp_path: Path) -> None:
    """Unsigned stored values under Rescale Slope -1 are modality values -4095..0: the VOI LUT's
    input is signed, and its first mapped value -4095, written SS or as US 61441, is -4095. Read
    as 61441, every pixel fell before the table and the file was refused as constant_image."""
    lut = (np.arange(4096) * 16).astype(np.uint16)
    images = []
    for vr, first in (("SS", -4095), ("US", 61441)):
        ds = radiograph(DX, "DX", RescaleSlope=-1, RescaleIntercept=0, RescaleType="US")
        ds.VOILUTSequence = DicomSequence([voi_item((4096, first, 16), lut, vr)])
        images.append(read(save(ds, tmp_path / f"{vr}.dcm"))[0].image[0].astype(np.int64))
    np.testing.assert_array_equal(images[0], expected_levels(-EVERY_12_BIT_VALUE.astype(np.int64), -4095, lut, 16))
    np.testing.assert_array_equal(images[1], images[0])


def test_a_first_mapped_value_written_ss_keeps_its_sign_under_unsigned_input(tmp_path: Path) -> None:
    """PS3.3 C.11.2.1.1: the second descriptor value is US or SS; one the file wrote explicitly as
    SS (-100) is -100 even where the input (unsigned stored values, no rescale) cannot go below 0."""
    lut = (np.arange(4196) * 15).astype(np.uint16)
    ds = radiograph()
    ds.VOILUTSequence = DicomSequence([voi_item((4196, -100, 16), lut, "SS")])
    path = save(ds, tmp_path / "ss.dcm")
    assert pydicom.dcmread(path).VOILUTSequence[0]["LUTDescriptor"].VR == "SS"
    image = read(path)[0].image[0].astype(np.int64)
    np.testing.assert_array_equal(image, expected_levels(EVERY_12_BIT_VALUE, -100, lut, 16))


@pytest.mark.parametrize(("attrs", "first", "meant"),
                         [({"RescaleSlope": 1, "RescaleIntercept": -1024}, 64512, -1024),  # HU from unsigned
                          ({}, 40000, 40000),                                            # unsigned input
                          ({"RescaleSlope": 2, "RescaleIntercept": 0}, 40000, 40000)])  # still unsigned
def test_a_first_mapped_value_written_us_follows_the_inputs_sign(tmp_path: Path, attrs: dict[str, Any], first: int,
                                                                  meant: int) -> None:
    """Written US, the 16 bits are read signed exactly when the rescaled stored range can go below 0."""
    stored = (np.arange(64 * 64, dtype=np.uint16) * 16).reshape(64, 64)  # 0..65520: 16 bits stored
    lut = np.arange(4096, dtype=np.uint16) * 16
    ds = image_dataset(stored, modality="OT", **attrs)
    ds.VOILUTSequence = DicomSequence([voi_item((4096, first, 16), lut, "US")])
    image = read(save(ds, tmp_path / "us.dcm"))[0].image[0].astype(np.int64)
    modality = stored.astype(np.int64) * int(attrs.get("RescaleSlope", 1)) + int(attrs.get("RescaleIntercept", 0))
    np.testing.assert_array_equal(image, expected_levels(modality, meant, lut, 16))


def test_a_first_mapped_value_behind_a_signed_ct_rescale_is_read_signed(tmp_path: Path) -> None:
    """A signed CT (HU -1024..1975) with its VOI LUT from -200 written US 65336: still -200."""
    ramp = np.rint(np.linspace(0, 4095, 400)).astype(np.uint16)
    ds = ct_dataset(np.arange(-200, 200, dtype=np.int16).reshape(20, 20) + 1024, center=None, width=None)
    ds.VOILUTSequence = DicomSequence([voi_item((400, 65336, 12), ramp, "US")])
    image = read(save(ds, tmp_path / "ct.dcm"))[0].image[0].astype(np.int64)
    np.testing.assert_array_equal(image, expected_levels(np.arange(-200, 200).reshape(20, 20), -200, ramp, 12))


def test_in_an_implicit_vr_file_the_inputs_sign_decides_not_pydicoms_guess_of_the_vr(tmp_path: Path) -> None:
    """Implicit VR writes no VR: pydicom reports a 'US or SS' descriptor as SS from Pixel
    Representation 1. Signed stored values under intercept 32768 are modality values 0..65535, so
    the first mapped value's 16 bits (0x9C40) are 40000, not -25536."""
    stored = (np.arange(64 * 64, dtype=np.int64) * 16 - 32768).astype(np.int16).reshape(64, 64)
    lut = np.arange(4096, dtype=np.uint16) * 16
    ds = image_dataset(stored, modality="OT", RescaleSlope=1, RescaleIntercept=32768)
    ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian
    ds.VOILUTSequence = DicomSequence([voi_item((4096, 40000 - 65536, 16), lut)])
    path = save(ds, tmp_path / "implicit.dcm")
    assert list(pydicom.dcmread(path).VOILUTSequence[0].LUTDescriptor)[1] == 40000 - 65536
    image = read(path)[0].image[0].astype(np.int64)
    np.testing.assert_array_equal(image, expected_levels(stored.astype(np.int64) + 32768, 40000, lut, 16))


# ---------------------------------------------------------------- windows under float16


def job_file(tmp_path: Path, dicom: dict[str, Any]) -> Path:
    doc = {"name": "t", "sources": [{"kind": "dicom", "root": "raw", "entity": "PatientID", "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"dicom": dicom},
           "pack": {"format": "webdataset"}, "output": "out", "phi": {"mode": "keep"}}
    (tmp_path / "raw").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_windows_under_float16_are_warned_of_as_not_applied(tmp_path: Path) -> None:
    said = transform_warnings(load_job(job_file(tmp_path, {"windows": ["lung", "mediastinum", "bone"],
                                                           "output": "float16"})))
    assert len(said) == 1
    assert said[0].startswith("transform.dicom.windows [lung, mediastinum, bone] are not applied under "
                              "transform.dicom.output: float16")
    assert "on the GPU" in said[0] and "output: uint8 or uint16" in said[0]


def test_modality_windows_under_float16_are_warned_of_by_their_key(tmp_path: Path) -> None:
    said = transform_warnings(load_job(job_file(tmp_path, {"modality_windows": {"CR": [{"center": 2000,
                                                                                        "width": 4000}]},
                                                           "output": "float16"})))
    assert len(said) == 1 and said[0].startswith("transform.dicom.modality_windows.CR [c2000w4000] is not applied")


@pytest.mark.parametrize("dicom", [{"output": "float16"},                                  # the default: no choice
                                   {"windows": ["lung", "zscore"], "output": "float16"},   # a normalisation: applied
                                   {"windows": ["lung", "bone"], "output": "uint8"}])
def test_float16_without_chosen_windows_or_with_a_normalisation_is_not_warned_of(tmp_path: Path,
                                                                                 dicom: dict[str, Any]) -> None:
    assert transform_warnings(load_job(job_file(tmp_path, dicom))) == ()


def test_packer_validate_reports_the_float16_windows_warning(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from packer.cli import main

    job = job_file(tmp_path, {"windows": ["lung", "bone"], "output": "float16"})
    ds = ct_dataset(np.arange(256, dtype=np.int16).reshape(16, 16))
    save(ds, tmp_path / "raw" / "a.dcm")
    report_file = tmp_path / "validate.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--quick", "--json", str(report_file), "--scheduler",
                                       "sync", "-q"], env={"PACKER_WORK_DIR": str(tmp_path / "work")})
    said = transform_warnings(load_job(job))[0]
    assert f"packer: warning: t: {said}" in result.output
    report = json.loads(report_file.read_text())
    assert [w["message"] for w in report["warnings"] if w["code"] == "transform"] == [said]


def test_float16_packs_modality_values_whatever_the_windows(tmp_path: Path) -> None:
    """What the warning says: the windows change nothing under float16."""
    path = save(ct_dataset(np.arange(256, dtype=np.int16).reshape(16, 16)), tmp_path / "ct.dcm")
    plain = read(path, output="float16")[0].image
    windowed = read(path, window(40, 400), window(400, 1800), output="float16")[0].image
    np.testing.assert_array_equal(windowed, plain)
    assert plain.shape[0] == 1 and float(plain.min()) == -1024.0
