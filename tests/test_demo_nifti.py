"""The demo's NIfTI tree (demo-raw/nifti/): the cases and label maps are what the README says, the
patients differ, and each planted broken file carries its defect. Checked with nibabel and raw
header bytes, not with packer's reader (tests/test_workflows_nifti.py builds the jobs on it)."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from nibabel.orientations import aff2axcodes

from packer.config import LimitsConfig
from packer.demo_nifti import (
    CT_BROKEN,
    CT_CASES,
    CT_CLASSES,
    LABEL_OTHER_AXES,
    MR_CLASSES,
    MR_SEQUENCES,
    nifti_bytes,
    write_nifti_examples,
)
from packer.records import REASONS

#: The HU each organ is drawn with (packer/demo_nifti.py, Abdomen.render): the median of a label's voxels.
ORGAN_HU = {"liver": 60.0, "kidney": 150.0, "spleen": 45.0}


@pytest.fixture(scope="module")
def nifti(demo_raw: Any) -> Path:
    return Path(demo_raw.root) / "nifti"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _header(path: Path) -> nib.Nifti1Header:
    """The header as stored (no repairs: nibabel's load would fix a zero pixdim)."""
    with gzip.open(path, "rb") as fh:
        return nib.Nifti1Header.from_fileobj(io.BytesIO(fh.read(352)), check=False)


def _canonical(path: Path) -> tuple[np.ndarray, np.ndarray]:
    img = nib.as_closest_canonical(nib.load(path))
    return np.asanyarray(img.dataobj), img.affine


def test_the_tables_list_every_case_with_its_label_map(nifti: Path) -> None:
    ct = _rows(nifti / "ct" / "cases.csv")
    assert [row["path"] for row in ct] == [f"imagesTr/{c}_0000.nii.gz" for c in CT_CASES] + [
        f"broken/{name}.nii.gz" for name in CT_BROKEN]
    assert len({row["entity"] for row in ct}) == len(ct) == 17  # one patient per case
    for row in ct:
        assert (nifti / "ct" / row["path"]).is_file() and (nifti / "ct" / row["mask"]).is_file(), row
    mr = _rows(nifti / "mr" / "cases.csv")
    assert mr == [{"path": "imagesTr/BRAIN001_0000.nii.gz", "entity": "BRAIN001", "mask": "labelsTr/BRAIN001.nii.gz",
                   "t1ce": "imagesTr/BRAIN001_0001.nii.gz", "t2": "imagesTr/BRAIN001_0002.nii.gz",
                   "flair": "imagesTr/BRAIN001_0003.nii.gz"}]
    assert all((nifti / "mr" / mr[0][column]).is_file() for column in ("path", "mask", *MR_SEQUENCES[1:]))


def test_the_ct_cases_are_unscaled_hu_in_the_planted_axes(nifti: Path) -> None:
    for case, (axes, tilt, _) in CT_CASES.items():
        img = nib.load(nifti / "ct" / "imagesTr" / f"{case}_0000.nii.gz")
        assert img.get_data_dtype() == np.int16 and (img.dataobj.slope, img.dataobj.inter) == (1.0, 0.0)
        assert img.header.get_sform(coded=True)[1] == img.header.get_qform(coded=True)[1] == 1
        assert np.allclose(img.header.get_sform(), img.header.get_qform(), atol=1e-4)
        assert "".join(aff2axcodes(img.affine)) == axes, case
        spacing = sorted(np.linalg.norm(img.affine[:3, :3], axis=0))
        assert 5.5 <= spacing[1] <= spacing[2] <= 6.3 and min(abs(spacing[0] - 4), abs(spacing[0] - 5)) < 1e-4, case
        assert sorted(img.shape)[:2] in ([36, 64], [37, 64], [38, 64], [39, 64], [40, 64], [41, 64], [42, 64],
                                         [43, 64], [44, 64]), (case, img.shape)
        columns = img.affine[:3, :3] / np.linalg.norm(img.affine[:3, :3], axis=0)
        along_z = float(np.abs(columns[2]).max())  # the voxel axis closest to superior
        assert np.degrees(np.arccos(along_z)) == pytest.approx(tilt, abs=0.01), case


def test_each_label_map_lies_on_its_image_and_marks_its_organ(nifti: Path) -> None:
    """In canonical axes (nibabel's own, RAS) image and label map share one grid, the label map
    stored in other axes included, and each class's voxels hold its organ's HU."""
    for case, (_, _, moved) in CT_CASES.items():
        hu, affine = _canonical(nifti / "ct" / "imagesTr" / f"{case}_0000.nii.gz")
        labels, label_affine = _canonical(nifti / "ct" / "labelsTr" / f"{case}.nii.gz")
        stored = nib.load(nifti / "ct" / "labelsTr" / f"{case}.nii.gz")
        assert ("".join(aff2axcodes(stored.affine)) == LABEL_OTHER_AXES) == moved, case
        assert labels.shape == hu.shape and np.allclose(label_affine, affine, atol=1e-4), case
        assert stored.get_data_dtype() == np.uint8 and int(stored.header["intent_code"]) == 1002
        assert set(np.unique(labels)) == {0, *CT_CLASSES.values()}, case
        for organ, value in CT_CLASSES.items():
            assert np.median(hu[labels == value]) == pytest.approx(ORGAN_HU[organ], abs=6), (case, organ)
        assert np.median(hu[labels == 0]) < -50  # air and fat outside the organs


def test_the_patients_are_not_near_copies_of_each_other(nifti: Path) -> None:
    """Every third slice of a case is compared with those of the others by packer's near-copy
    signature: no pair of different patients scores as a near copy."""
    from packer.pipeline import nearcopy
    from packer.transform.window import apply_window

    rows, patients = [], []
    for case in CT_CASES:
        hu, _ = _canonical(nifti / "ct" / "imagesTr" / f"{case}_0000.nii.gz")
        for z in range(0, hu.shape[2], 3):
            plane = hu[:, :, z].astype(np.float64)
            rows.append(nearcopy.signature(np.stack([(apply_window(plane, c, w) * 255).astype(np.uint8)
                                                     for c, w in ((50, 400), (30, 150), (400, 1800))])))
            patients.append(case)
    signatures = np.array(rows, dtype=nearcopy.SIGNATURE_DTYPE)
    groups = np.unique(patients, return_inverse=True)[1]
    candidates = nearcopy.candidate_pairs(signatures["embedding"], groups, 16)
    scores = [nearcopy.verify(signatures["thumb"][i], signatures["thumb"][j]).score
              for i, j in zip(candidates.i, candidates.j, strict=True)]
    assert len(candidates) > 500 and max(scores) < nearcopy.MIN_SCORE


def test_the_mr_case_is_four_sequences_on_one_grid_in_their_own_units(nifti: Path) -> None:
    images = [nib.load(nifti / "mr" / "imagesTr" / f"BRAIN001_{n:04d}.nii.gz") for n in range(4)]
    values = [np.asanyarray(img.dataobj) for img in images]
    assert all(img.shape == (48, 48, 30) and np.array_equal(img.affine, images[0].affine) for img in images)
    brain = values[0] != 0
    assert all(np.array_equal(v != 0, brain) for v in values)  # skull-stripped: background exactly 0
    assert brain.any(axis=(0, 1)).all()                           # every axial slice holds brain
    medians = [float(np.median(v[brain])) for v in values]
    assert max(medians) / min(medians) > 1.5                      # no common unit: a fixed window means nothing
    labels = np.asanyarray(nib.load(nifti / "mr" / "labelsTr" / "BRAIN001.nii.gz").dataobj)
    assert labels.shape == (48, 48, 30) and set(np.unique(labels)) == {0, *MR_CLASSES.values()}
    assert not labels[~brain].any()
    t1ce, t1 = values[1] / 1.3, values[0].astype(np.float64)     # the contrast lights up the tumour's rim
    rim = labels == MR_CLASSES["enhancing_tumour"]
    assert np.median(t1ce[rim]) > 2 * np.median(t1[rim])


def test_each_broken_file_carries_its_defect(nifti: Path) -> None:
    broken = nifti / "ct" / "broken"
    assert sorted(p.name for p in broken.glob("*.nii.gz") if not p.name.endswith("_label.nii.gz")) == sorted(
        f"{name}.nii.gz" for name in CT_BROKEN)
    assert all(reason is None or reason in REASONS for _, reason in CT_BROKEN.values())
    with pytest.raises(EOFError):
        gzip.decompress((broken / "truncated.nii.gz").read_bytes())
    assert _header(broken / "truncated.nii.gz")["sizeof_hdr"] == 348  # the header itself reads
    assert int(_header(broken / "vox_offset.nii.gz")["vox_offset"]) == 348
    zero = _header(broken / "zero_pixdim.nii.gz")
    assert float(zero["pixdim"][3]) == 0.0 and np.allclose(zero.get_sform()[:3, 2], 0.0)
    nan = nib.load(broken / "nan_voxels.nii.gz")
    assert nan.get_data_dtype() == np.float32 and np.isnan(np.asanyarray(nan.dataobj)).sum() > 100
    forms = _header(broken / "sform_qform.nii.gz")
    assert np.abs(forms.get_sform() - forms.get_qform()).max() > 5.0
    assert int(_header(broken / "rgb.nii.gz")["datatype"]) == 128       # NIFTI_TYPE_RGB24
    assert int(_header(broken / "complex.nii.gz")["datatype"]) == 32    # NIFTI_TYPE_COMPLEX64
    assert list(_header(broken / "four_d.nii.gz")["dim"][:5])[0] == 4
    image, label = nib.load(broken / "wrong_grid.nii.gz"), nib.load(broken / "wrong_grid_label.nii.gz")
    assert image.shape == label.shape and np.abs(image.affine - label.affine).max() > 1.0


def test_the_readme_lists_the_nifti_tree_and_its_defects(demo_raw: Any) -> None:
    readme = (Path(demo_raw.root) / "README.txt").read_text(encoding="utf-8")
    assert demo_raw.nifti is not None and len(demo_raw.nifti.defects) == 8
    for defect in demo_raw.nifti.defects:
        assert f"  nifti/{defect.relpath} -> {defect.reason}" in readme
        assert CT_BROKEN[Path(defect.relpath).name.removesuffix(".nii.gz")][1] == defect.reason
    assert demo_raw.nifti.warned == ("ct/broken/sform_qform.nii.gz",) and "sform_qform.nii.gz" in readme
    assert "workflows/nifti-slices.yaml, nifti-volume.yaml, nifti-mr.yaml" in readme


def test_same_seed_same_bytes_other_seed_other_pixels(nifti: Path, tmp_path: Path) -> None:
    again, other = write_nifti_examples(tmp_path / "again", seed=0), write_nifti_examples(tmp_path / "other", seed=1)

    def digests(root: Path) -> dict[str, str]:
        return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    first, third = digests(nifti), digests(other.root)
    assert first == digests(again.root) and len(first) == 43
    assert all(first[rel] != third[rel] for rel in first if rel.endswith("_0000.nii.gz"))


# -- the reader's defects the demo works around (packer/read/nifti.py) -----------------------------

def _read(path: Path) -> Any:
    from packer.read.nifti import canonical_values, load_header, read_voxels

    img, header = load_header(str(path), LimitsConfig(), channels_from=None)
    return canonical_values(read_voxels(img, header), header)


def test_ct_stored_with_scl_inter_reads_in_hu(tmp_path: Path) -> None:
    stored = np.full((8, 8, 4), 1024, dtype=np.int16)
    stored[2:6, 2:6] = 1084                                   # 60 HU
    raw = bytearray(nifti_bytes(stored, np.diag([2.0, 2.0, 3.0, 1.0])))
    raw[116:120] = np.float32(-1024.0).tobytes()              # scl_inter (scl_slope, bytes 112-115, is 1)
    (tmp_path / "scaled.nii").write_bytes(bytes(raw))
    assert nib.load(tmp_path / "scaled.nii").dataobj.inter == -1024.0   # nibabel reads the scaling
    assert float(_read(tmp_path / "scaled.nii").array.max()) == 60.0


def test_a_zero_pixdim_with_a_qform_only_is_bad_geometry(tmp_path: Path) -> None:
    from packer.read.nifti import NiftiDefect

    (tmp_path / "flat.nii").write_bytes(nifti_bytes(np.arange(64, dtype=np.int16).reshape(4, 4, 4),
                                                    np.diag([2.0, 2.0, 3.0, 1.0]), sform_code=0,
                                                    pixdim=[2.0, 2.0, 0.0]))
    with pytest.raises(NiftiDefect) as refused:
        _read(tmp_path / "flat.nii")
    assert refused.value.reason == "bad_geometry"
