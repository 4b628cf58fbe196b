"""What a DICOM source says of the objects and files a real export holds beside its images.

An MR Spectroscopy object and an RT Dose of DVHs only are valid objects without Pixel Data: left
out as not_image, never bad samples told they are damaged. A file that holds its Pixel Data but
lost an Image Pixel element is told that element is missing, not that it has no pixels. A Zarr
store's chunks and an archive without a suffix are told as what they are, not as failed exports,
and the report's legend does not tell a zip of DICOM files to become a PNG.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from packer.htmlreport import render_html_report
from packer.pipeline.discover import source_relpaths
from packer.read.dicom import probe_dicom
from packer.read.kinds import source_kind
from packer.records import Excluded, Issue
from packer.where import Condition
from tests.dicom_files import ct_dataset, make_ref, save
from tests.test_dicom_read import issue_of, read
from tests.test_targets import _build, _job

MR_SPECTROSCOPY = "1.2.840.10008.5.1.4.1.1.4.2"
RT_DOSE = "1.2.840.10008.5.1.4.1.1.481.2"


def _object(sop_class: str, modality: str) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.SOPClassUID, ds.Modality = sop_class, modality
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientID, ds.StudyDate, ds.StudyTime = "P1", "20230504", "101112"
    return ds


def mr_spectroscopy() -> Dataset:
    """A single-voxel MR Spectroscopy object (PS3.3 A.49): its MR Spectroscopy module holds Rows
    and Columns (the voxel grid) and Spectroscopy Data, and no Pixel Data."""
    ds = _object(MR_SPECTROSCOPY, "MR")
    ds.ImageType = ["ORIGINAL", "PRIMARY", "SPECTROSCOPY", "NONE"]
    ds.Rows = ds.Columns = 1
    ds.NumberOfFrames = 1
    ds.DataPointRows, ds.DataPointColumns = 1, 16
    ds.SpectroscopyData = np.zeros(32, np.float32).tobytes()
    return ds


def dvh_only_dose() -> Dataset:
    """An RT Dose of DVHs only (PS3.3 A.18.3: Image Pixel is required only for grid-based doses)."""
    ds = _object(RT_DOSE, "RTDOSE")
    ds.DoseUnits, ds.DoseType, ds.DoseSummationType = "GY", "PHYSICAL", "PLAN"
    dvh = Dataset()
    dvh.DVHType, dvh.DoseUnits, dvh.DoseType, dvh.DVHDoseScaling = "CUMULATIVE", "GY", "PHYSICAL", 1.0
    dvh.DVHVolumeUnits, dvh.DVHNumberOfBins, dvh.DVHData = "CM3", 2, [1.0, 10.0, 1.0, 5.0]
    ds.DVHSequence = DicomSequence([dvh])
    return ds


def probe(path: Path, where: tuple[Condition, ...] = ()) -> object:
    return probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=(), where=where)


def test_an_mr_spectroscopy_object_with_rows_and_columns_but_no_pixel_data_is_not_image(tmp_path: Path) -> None:
    found = probe(save(mr_spectroscopy(), tmp_path / "svs_press.dcm"))
    assert isinstance(found, Excluded), found
    assert (found.why, found.modality, found.sop_class) == ("not_image", "MR", "MR Spectroscopy Storage")
    assert "holds no image" in found.detail


def test_a_ct_file_with_rows_and_columns_but_no_pixel_data_stays_a_damaged_image(tmp_path: Path) -> None:
    ds = ct_dataset()
    del ds.PixelData
    path = save(ds, tmp_path / "cut.dcm")
    found = probe(path)
    assert not isinstance(found, Excluded), found
    issue = issue_of(found if isinstance(found, Issue) else read(path), "no_pixel_data")
    assert "CT Image Storage" in issue.message and "Pixel Data" in issue.message


def test_a_file_holding_its_pixel_data_without_rows_is_bad_shape_naming_rows_missing(tmp_path: Path) -> None:
    ds = ct_dataset()
    del ds.Rows
    issue = issue_of(probe(save(ds, tmp_path / "norows.dcm")), "bad_shape")
    assert "(0028,0010) Rows" in issue.message and "missing" in issue.message
    assert "holds its Pixel Data" in issue.message
    assert "without its pixels" not in issue.message and "has no image" not in issue.message
    ds = ct_dataset()
    ds["PixelData"].VR = "OW"  # as read from a file: without Bits Allocated pydicom cannot pick OB or OW
    del ds.BitsAllocated
    ds.Columns = None  # empty, beside the absent one: each said as what it is
    issue = issue_of(probe(save(ds, tmp_path / "mixed.dcm")), "bad_shape")
    assert "(0028,0011) Columns is present but empty" in issue.message
    assert "(0028,0100) BitsAllocated is missing" in issue.message


def test_an_icon_thumbnails_pixel_data_is_not_the_files_own(tmp_path: Path) -> None:
    """An Icon Image Sequence item (PS3.3 C.7.6.1.1.6) holds its own Rows, Columns and Pixel Data:
    a file without its own Rows and Pixel Data has no image (no_pixel_data), not "holds its Pixel
    Data" (bad_shape); with its own Pixel Data, the missing Rows is still named."""
    icon = Dataset()
    icon.Rows = icon.Columns = 4
    icon.SamplesPerPixel, icon.PhotometricInterpretation = 1, "MONOCHROME2"
    icon.BitsAllocated = icon.BitsStored = 8
    icon.HighBit, icon.PixelRepresentation = 7, 0
    icon.PixelData = bytes(range(16))
    ds = ct_dataset()
    ds.IconImageSequence = DicomSequence([icon])
    del ds.Rows
    kept = save(ds, tmp_path / "kept.dcm")
    del ds.PixelData
    lost = save(ds, tmp_path / "lost.dcm")
    for found in (probe(lost), read(lost)):
        issue = issue_of(found, "no_pixel_data")
        assert "(0028,0010) Rows" in issue.message and "holds its Pixel Data" not in issue.message
    for found in (probe(kept), read(kept)):
        issue = issue_of(found, "bad_shape")
        assert "(0028,0010) Rows is missing" in issue.message and "holds its Pixel Data" in issue.message


def test_an_rt_dose_of_dvhs_only_is_not_image_whether_or_not_the_source_asks_for_rt_dose(tmp_path: Path) -> None:
    path = save(dvh_only_dose(), tmp_path / "dvh_only.dcm")
    for where in ((), (Condition("Modality", "in", ("CT", "RTDOSE")),)):
        found = probe(path, where)
        assert isinstance(found, Excluded), (where, found)
        assert (found.why, found.modality) == ("not_image", "RTDOSE"), where
        assert "no dose grid" in found.detail and "DVH" in found.detail
        assert "a dose grid (" not in found.detail


def dose_grid() -> Dataset:
    """A grid-based RT Dose (PS3.3 A.18.3: Image Pixel, Multi-frame and RT Dose modules): Rows,
    Columns, Number of Frames, Grid Frame Offset Vector, Dose Grid Scaling, 32-bit Pixel Data."""
    ds = _object(RT_DOSE, "RTDOSE")
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 32
    ds.HighBit, ds.PixelRepresentation, ds.NumberOfFrames = 31, 0, 1
    ds.ImagePositionPatient, ds.ImageOrientationPatient = [0, 0, 0], [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing = [2.5, 2.5]
    ds.DoseUnits, ds.DoseType, ds.DoseSummationType = "GY", "PHYSICAL", "PLAN"
    ds.GridFrameOffsetVector, ds.DoseGridScaling = [0.0], 0.001
    ds.PixelData = np.arange(64, dtype=np.uint32).tobytes()
    return ds


def cut_before_pixels(ds: Dataset, path: Path, tag: bytes = b"\xe0\x7f\x10\x00") -> Path:
    """``ds`` written to ``path`` and cut where its (top-level, last) pixel data element begins:
    a copy interrupted there."""
    full = save(ds, path).read_bytes()
    path.write_bytes(full[:full.rfind(tag)])
    return path


def test_an_rt_dose_grid_without_its_pixel_data_is_a_damaged_grid_not_a_dvh_only_dose(tmp_path: Path) -> None:
    """Rows and Columns say the dose is grid-based (A.18.3 requires Image Pixel only then): cut
    where its Pixel Data begins, or with it stripped, it is a damaged grid, a bad sample when the
    source asks for RT Dose, and "a dose grid" left out when it does not; never "only DVHs"."""
    cut = cut_before_pixels(dose_grid(), tmp_path / "cut" / "RD.dcm")
    stripped = dose_grid()
    del stripped.PixelData
    for path in (cut, save(stripped, tmp_path / "stripped" / "RD.dcm")):
        found = probe(path, (Condition("Modality", "in", ("CT", "RTDOSE")),))
        assert not isinstance(found, Excluded), (path, found)
        issue = issue_of(found if isinstance(found, Issue) else read(path), "no_pixel_data")
        assert "RT Dose Storage" in issue.message, issue.message
        left_out = probe(path)
        assert isinstance(left_out, Excluded) and left_out.why == "not_requested", left_out
        assert "a dose grid (" in left_out.detail and "DVH" not in left_out.detail


ENHANCED_US_VOLUME = "1.2.840.10008.5.1.4.1.1.6.2"
PARAMETRIC_MAP = "1.2.840.10008.5.1.4.1.1.30"


def _image_object(sop_class: str, modality: str, bits: int) -> Dataset:
    ds = _object(sop_class, modality)
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.NumberOfFrames = 1, "MONOCHROME2", 1
    ds.BitsAllocated = bits
    return ds


@pytest.mark.parametrize(("sop_class", "modality", "name"), [
    (ENHANCED_US_VOLUME, "US", "Enhanced US Volume Storage"),  # Image Pixel module + Pixel Data
    (PARAMETRIC_MAP, "MR", "Parametric Map Storage"),  # Float Pixel Data
])
def test_an_image_object_whose_class_name_lacks_image_cut_before_its_pixels_is_a_damaged_image(
        tmp_path: Path, sop_class: str, modality: str, name: str) -> None:
    """Rows and Columns without pixel data are a valid object only for a class whose module holds
    them without pixels (MR Spectroscopy); any other class's file is an image that lost its pixels
    (no_pixel_data, as a cut CT), whether or not its SOP class's name says Image."""
    ds = _image_object(sop_class, modality, 32 if sop_class == PARAMETRIC_MAP else 8)
    if sop_class == PARAMETRIC_MAP:
        ds.FloatPixelData = np.linspace(0, 1, 64, dtype=np.float32).tobytes()
        tag = b"\xe0\x7f\x08\x00"
    else:
        ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 7, 0
        ds.PixelData = bytes(range(64))
        tag = b"\xe0\x7f\x10\x00"
    path = cut_before_pixels(ds, tmp_path / "IM0001.dcm", tag)
    found = probe(path)
    assert not isinstance(found, Excluded), found
    issue = issue_of(found if isinstance(found, Issue) else read(path), "no_pixel_data")
    assert name in issue.message, issue.message


def test_the_chunks_of_a_zarr_store_under_a_dicom_root_are_told_as_the_stores_not_as_failed_exports(
        tmp_path: Path) -> None:
    save(ct_dataset(), tmp_path / "ct" / "IM0.dcm")
    v3 = tmp_path / "volume.zarr"  # Zarr v3: zarr.json, chunks under c/
    (v3 / "c" / "0").mkdir(parents=True)
    (v3 / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array"}')
    v2 = tmp_path / "export" / "seg"  # Zarr v2 in a folder of any name: .zarray beside chunks 0.0, 0/1
    (v2 / "0").mkdir(parents=True)
    (v2 / ".zarray").write_text('{"zarr_format": 2}')
    for i in range(3):
        chunk = zlib.compress(np.random.default_rng(i).integers(0, 2000, (64, 64)).astype("<u2").tobytes())
        (v3 / "c" / "0" / str(i)).write_bytes(chunk)
        (v2 / "0" / str(i)).write_bytes(chunk)
    (tmp_path / "export" / "IM0035").write_bytes(b"\0" * 200)  # beside the store: still a failed export
    told: dict[str, str] = {}
    assert source_relpaths(source_kind("dicom"), tmp_path, unsupported=told) == ["ct/IM0.dcm"]
    chunks = {rel: what for rel, what in told.items() if rel != "export/IM0035"}
    assert sorted(chunks) == [*(f"export/seg/0/{i}" for i in range(3)), *(f"volume.zarr/c/0/{i}" for i in range(3))]
    for what in chunks.values():
        assert "Zarr store" in what and "NIfTI" in what and "failed or partial export" not in what
    assert "failed or partial export" in told["export/IM0035"]


@pytest.mark.parametrize(("magic", "what"), [(b"PK\x03\x04", "a zip archive"), (b"\x1f\x8b\x08", "gzip"),
                                             (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
                                             (b"Rar!\x1a\x07\x00", "a RAR archive")])
def test_an_archive_without_a_suffix_is_told_as_the_archive_it_is_by_its_first_bytes(
        tmp_path: Path, magic: bytes, what: str) -> None:
    save(ct_dataset(), tmp_path / "IM0.dcm")
    (tmp_path / "EXPORT").write_bytes(magic + bytes(range(256)) * 2)
    told: dict[str, str] = {}
    source_relpaths(source_kind("dicom"), tmp_path, unsupported=told)
    assert what in told["EXPORT"] and "unpack it" in told["EXPORT"], told
    assert "failed or partial export" not in told["EXPORT"]


def test_a_real_zip_written_without_a_suffix_is_told_to_be_unpacked(tmp_path: Path) -> None:
    dicom = save(ct_dataset(), tmp_path / "ct" / "IM0.dcm")
    with zipfile.ZipFile(tmp_path / "EXPORT", "w") as archive:
        archive.write(dicom, "IM0.dcm")
    told: dict[str, str] = {}
    source_relpaths(source_kind("dicom"), tmp_path, unsupported=told)
    assert told["EXPORT"].startswith("a zip archive") and "unzip ARCHIVE -d FOLDER" in told["EXPORT"]


def test_the_reports_legend_for_unsupported_format_does_not_tell_a_zip_of_dicom_files_to_become_a_png(
        tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    dicom = save(ct_dataset(PatientID="P1"), raw / "ct" / "IM0.dcm")
    with zipfile.ZipFile(raw / "study.zip", "w") as archive:
        archive.write(dicom, "IM0.dcm")
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                         validate={"max_bad_fraction": 0.9}))
    assert result.manifest["inputs"]["excluded"] == {"unsupported_format": 1}
    text = " ".join(re.sub("<[^>]+>", " ", render_html_report(result.manifest_path)).split())
    legend = text[text.index("unsupported_format:"):].split(";")[0]
    assert "convert it to PNG" not in legend and "archive" in legend and "unpack" in legend
    assert "its detail in excluded.jsonl says" in legend


@pytest.mark.parametrize("sop_class", ["1.3.46.670589.11.0.0.12.1",  # Philips Private MR Spectrum Storage
                                       "1.3.12.2.1107.5.9.1"])  # Siemens CSA Non-Image
def test_a_vendors_private_spectrum_with_rows_and_columns_is_left_out_not_called_damaged(
        tmp_path: Path, sop_class: str) -> None:
    """Philips keeps an MR spectrum in (2005,1270) beside Rows, Columns and Pixel Spacing, with no
    Pixel Data: a well-formed vendor object, left out as not_image, not a no_pixel_data bad sample
    telling the user to export it again (74884b1 made it one)."""
    ds = _object(sop_class, "MR")
    ds.Rows = ds.Columns = 1
    ds.PixelSpacing = [10, 10]
    path = tmp_path / "SPEC0001.dcm"
    save(ds, path)
    found = probe(path)
    assert isinstance(found, Excluded) and found.why == "not_image", found
    assert "a vendor's private object, without pixel data" in found.detail
