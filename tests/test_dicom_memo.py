"""A header's converted values are remembered across files (a series' slices repeat most of their
header) without ever changing what a file reads as.

``convert_remembered`` keys each raw value by everything pydicom's conversion reads. These tests
hold it to the plain conversion on every file pydicom ships (implicit and explicit VR, big
endian, many character sets), and on the three ways a memo could go wrong: a value pydicom
resolves from another element (``US or SS`` by Pixel Representation), the same bytes under two
character sets, and one file's element changed after another file reused its value.
"""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import FileMetaDataset
from pydicom.uid import ImplicitVRLittleEndian

from packer.read import dicom_attrs
from packer.read.dicom_attrs import convert_faithfully, convert_remembered, pydicom_quietly
from tests.dicom_files import ct_dataset, ct_pixels, save

DATA = Path(pydicom.__file__).parent / "data"
SHIPPED = sorted([*(DATA / "test_files").glob("*.dcm"), *(DATA / "charset_files").glob("*.dcm")])


def _converted(path: Path, convert: object) -> list[tuple[object, ...]]:
    """Every public top-level element of ``path`` converted by ``convert``: (tag, VR, value
    type, value text)."""
    ds = pydicom.dcmread(path, force=True)
    out = []
    for tag in list(ds.keys()):
        if tag.is_private:
            continue
        try:
            elem = convert(ds, tag)  # type: ignore[operator]
        except Exception as err:  # noqa: BLE001 - a damaged element must fail alike both ways
            out.append((int(tag), type(err).__name__))
            continue
        out.append((int(tag), elem.VR, type(elem.value).__name__, repr(elem.value)))
    return out


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    dicom_attrs._MEMO.clear()


def test_every_shipped_file_reads_the_same_remembered_or_not() -> None:
    assert len(SHIPPED) > 20
    with pydicom_quietly():
        expected = {path: _converted(path, convert_faithfully) for path in SHIPPED}
        for _ in range(2):  # the second round reads every value from the memo
            for path in SHIPPED:
                assert _converted(path, convert_remembered) == expected[path], path.name
    assert dicom_attrs._MEMO  # something was remembered


def _implicit(path: Path, representation: int) -> Path:
    """An implicit-VR CT file whose Pixel Padding Value, (0028,0120) ``US or SS``, is the bytes
    FF FF: 65535 for unsigned pixels, -1 for signed."""
    ds = ct_dataset(ct_pixels((4, 4)))
    ds.PixelRepresentation = representation
    ds.PixelPaddingValue = 0xFFFF if representation == 0 else -1
    ds.file_meta = FileMetaDataset(ds.file_meta)
    ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian
    return save(ds, path)


def test_a_value_pydicom_resolves_by_pixel_representation_is_never_remembered(tmp_path: Path) -> None:
    unsigned, signed = _implicit(tmp_path / "u.dcm", 0), _implicit(tmp_path / "s.dcm", 1)
    values = []
    for path in (unsigned, signed, unsigned):
        ds = pydicom.dcmread(path)
        assert ds.get_item(0x00280120).VR is None  # implicit: pydicom resolves it from the dictionary
        for tag in list(ds.keys()):
            convert_remembered(ds, tag)
        values.append(ds.PixelPaddingValue)
    assert values == [65535, -1, 65535]


def test_the_same_bytes_under_two_character_sets_read_as_each_set_says(tmp_path: Path) -> None:
    name = "Müller".encode("latin-1")  # b"M\\xfcller": ü in Latin-1; under UTF-8 an undecodable byte
    paths = []
    for charset in ("ISO_IR 100", "ISO_IR 192", "ISO_IR 100"):
        ds = ct_dataset(ct_pixels((4, 4)), SpecificCharacterSet=charset)
        ds.add_new(0x00100010, "PN", name)
        paths.append(save(ds, tmp_path / f"{len(paths)}.dcm"))
    read = []
    for path in paths:
        ds = pydicom.dcmread(path)
        for tag in list(ds.keys()):
            convert_remembered(ds, tag)
        read.append(str(ds.PatientName))
    assert read == ["Müller", "M\\xfcller", "Müller"]


def test_setting_a_value_in_one_file_never_reaches_another(tmp_path: Path) -> None:
    paths = [save(ct_dataset(ct_pixels((4, 4)), PatientName="Doe^Jane"), tmp_path / f"{i}.dcm") for i in range(3)]
    sets = [pydicom.dcmread(p) for p in paths]
    for ds in sets[:2]:  # the second's values come from the memo
        for tag in list(ds.keys()):
            convert_remembered(ds, tag)
    for changed in sets[:2]:  # pydicom sets a value on the element object itself
        changed.PatientName = "Changed^Here"
        changed["PatientID"].value = "other"
        ds = pydicom.dcmread(paths[2])
        for tag in list(ds.keys()):
            convert_remembered(ds, tag)
        assert str(ds.PatientName) == "Doe^Jane" and ds.PatientID != "other"


def test_pixel_data_is_never_remembered(tmp_path: Path) -> None:
    """Two files with the same small pixels: the second's Pixel Data is its own element, with
    its own length (a remembered one once lost its length and read as 'undefined')."""
    from packer.read.dicom import read_dicom
    from tests.dicom_files import config, make_ref

    paths = [save(ct_dataset(ct_pixels((8, 8))), tmp_path / f"{i}.dcm") for i in range(2)]
    for path in paths:
        samples = read_dicom(make_ref(path), config())
        assert isinstance(samples, list), samples
    assert not any(key[0] >> 16 == 0x7FE0 for key in dicom_attrs._MEMO)
