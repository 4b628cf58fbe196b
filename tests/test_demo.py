"""The seeded demo tree: reproducible bytes, decodable good files, exactly the planted defects."""

from __future__ import annotations

import csv
import hashlib
from datetime import datetime
from pathlib import Path

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.errors import InvalidDicomError

from packer.demo import (
    SERIES,
    DemoTree,
    cut_jpeg,
    write_bench_tree,
    write_copies_tree,
    write_ct_slice,
    write_demo_tree,
)
from packer.errors import ConfigError
from packer.records import REASONS

BROKEN_DICOM = {"broken/zero_byte.dcm", "broken/notes.dcm", "broken/no_pixels.dcm", "broken/truncated.dcm"}


def tree_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by POSIX relpath."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def read_table(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def to_hu(ds: pydicom.Dataset) -> np.ndarray:
    """Modality LUT by hand (PS3.3 C.11.1): stored * slope + intercept."""
    return ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoTree:
    return write_demo_tree(tmp_path_factory.mktemp("demo") / "raw", seed=0)


def good_dicom_paths(tree: DemoTree) -> list[str]:
    ct = tree.root / "ct"
    return sorted(p.relative_to(ct).as_posix() for p in ct.rglob("*.dcm") if p.relative_to(ct).parts[0] != "broken")


def test_same_seed_same_bytes_other_seed_other_bytes(demo: DemoTree, tmp_path: Path) -> None:
    again = write_demo_tree(tmp_path / "again", seed=0)
    other = write_demo_tree(tmp_path / "other", seed=1)
    first, second, third = tree_digests(demo.root), tree_digests(again.root), tree_digests(other.root)
    assert first == second
    assert len(first) > 100
    shared_dicom = [rel for rel in first if rel.endswith(".dcm") and first[rel] == third.get(rel)]
    # only the zero-byte and the text file carry no seeded content
    assert sorted(shared_dicom) == ["ct/broken/notes.dcm", "ct/broken/zero_byte.dcm"]
    assert first["ct_labels.csv"] != third["ct_labels.csv"]


def test_rewrite_replaces_an_earlier_demo_tree(tmp_path: Path) -> None:
    write_demo_tree(tmp_path, seed=3)
    (tmp_path / "nifti" / "ct" / "imagesTr" / "CT099_0000.nii.gz").write_bytes(b"left from an older demo")
    small = write_demo_tree(tmp_path, seed=3, patients=1, photo_subjects=1, photos_per_subject=2)
    assert not (tmp_path / "ct" / "PAT0005").exists()
    assert not (tmp_path / "nifti" / "ct" / "imagesTr" / "CT099_0000.nii.gz").exists()
    assert len(list((tmp_path / "ct").rglob("IM*.dcm"))) == 1 * 2 * 3
    assert small.dicom_files == 6 + 3 and small.images == 2


def test_writing_the_same_tree_again_keeps_each_files_inode_and_mtime(tmp_path: Path) -> None:
    """make demo writes the tree every time; the build cache keys a file by its inode, size and
    mtime, so an unchanged file must stay the same file, or every make demo decodes it again.
    A file that comes out different (another seed) is a new file."""
    write_demo_tree(tmp_path, seed=3, patients=1, photo_subjects=1, photos_per_subject=2)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}
    write_demo_tree(tmp_path, seed=3, patients=1, photo_subjects=1, photos_per_subject=2)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files} == before
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files  # nothing left aside
    write_demo_tree(tmp_path, seed=4, patients=1, photo_subjects=1, photos_per_subject=2)
    slice_ = tmp_path / "ct" / "PAT0001" / "ST01" / "IM001.dcm"
    assert slice_.stat().st_ino != before[slice_][0]


def test_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "ct").mkdir()
    (tmp_path / "ct" / "mine.dcm").write_bytes(b"precious")
    with pytest.raises(ConfigError, match="packer demo tree"):
        write_demo_tree(tmp_path)
    assert (tmp_path / "ct" / "mine.dcm").read_bytes() == b"precious"


def test_tree_is_small(demo: DemoTree) -> None:
    assert sum(p.stat().st_size for p in demo.root.rglob("*") if p.is_file()) < 4 * 1024 * 1024
    # the annotated CT series (tests/test_demo_annotations.py): 62 slices of 64x64 or 56x56, 2 SEGs, 3 RTSTRUCTs
    assert sum(p.stat().st_size for p in (demo.root / "annotated").rglob("*") if p.is_file()) < 1024 * 1024
    # the NIfTI volumes (tests/test_demo_nifti.py): 8 CT cases, 4 MR sequences and small broken files
    assert sum(p.stat().st_size for p in (demo.root / "nifti").rglob("*") if p.is_file()) < 1.25 * 1024 * 1024


def test_every_good_ct_file_decodes_with_air_in_the_corner(demo: DemoTree) -> None:
    paths = good_dicom_paths(demo)
    assert len(paths) == demo.dicom_files == 12 * 2 * 3 + 3
    pixel_hashes = set()
    for rel in paths:
        ds = pydicom.dcmread(demo.root / "ct" / rel)
        assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID
        assert 2023 <= int(ds.StudyDate[:4]) <= 2024
        pixel_hashes.add(hashlib.sha256(ds.pixel_array.tobytes()).hexdigest())
        if ds.Modality != "CT":
            continue
        hu = to_hu(ds)
        assert ds.pixel_array.dtype == np.int16 and ds.PixelRepresentation == 1
        assert abs(hu[..., :4, :4].mean() + 1000) < 15, rel
        assert [float(c) for c in ds.WindowCenter] == [40.0, -600.0]
        assert list(ds.WindowCenterWidthExplanation) == ["MEDIASTINUM", "LUNG"]
    assert len(pixel_hashes) == len(paths)  # no two files share pixels


def test_phantom_has_air_body_lung_and_bone(demo: DemoTree) -> None:
    ds = pydicom.dcmread(demo.root / "ct" / "PAT0001" / "ST01" / "IM002.dcm")
    hu = to_hu(ds)
    assert hu.shape == (64, 64) and ds.BitsStored == 12 and float(ds.PixelSpacing[0]) > 0
    for centre, least in ((-1000, 0.2), (40, 0.1), (-800, 0.05), (700, 0.03)):
        assert np.mean(np.abs(hu - centre) < 60) > least, centre
    lung_window = np.clip((hu + 600 + 750) / 1500, 0, 1)
    soft_window = np.clip((hu - 40 + 200) / 400, 0, 1)
    assert np.abs(lung_window - soft_window).mean() > 0.1


def test_extra_dicom_kinds_decode(demo: DemoTree) -> None:
    ct = demo.root / "ct" / "extra"
    mono1 = pydicom.dcmread(ct / "cr_monochrome1.dcm")
    assert mono1.PhotometricInterpretation == "MONOCHROME1" and mono1.pixel_array.dtype == np.uint16
    assert "WindowCenter" in mono1 and mono1.pixel_array.shape == (64, 64)
    assert mono1.pixel_array[:4, :4].mean() > mono1.pixel_array[32, 32]  # air is high in MONOCHROME1

    multi = pydicom.dcmread(ct / "ct_multiframe.dcm")
    frames = to_hu(multi)
    assert multi.NumberOfFrames == 3 and frames.shape == (3, 64, 64) and float(multi.RescaleIntercept) == -1024
    assert not np.array_equal(frames[0], frames[1])

    rle = pydicom.dcmread(ct / "ct_rle.dcm")
    assert rle.file_meta.TransferSyntaxUID == pydicom.uid.RLELossless
    assert abs(to_hu(rle)[:4, :4].mean() + 1000) < 15
    assert len({mono1.PatientID, multi.PatientID, rle.PatientID}) == 3


def test_planted_dicom_defects(demo: DemoTree) -> None:
    broken = demo.root / "ct" / "broken"
    assert (broken / "zero_byte.dcm").stat().st_size == 0

    notes = (broken / "notes.dcm").read_bytes()
    assert notes.decode("ascii").strip().isprintable() and notes[128:132] != b"DICM"
    with pytest.raises(InvalidDicomError):
        pydicom.dcmread(broken / "notes.dcm")

    header = pydicom.dcmread(broken / "truncated.dcm", stop_before_pixels=True)  # header intact
    assert header.PatientID == "BRK0001" and (header.Rows, header.Columns, header.BitsAllocated) == (64, 64, 16)
    good_slice = demo.root / "ct" / "PAT0001" / "ST01" / "IM001.dcm"
    assert (broken / "truncated.dcm").stat().st_size < good_slice.stat().st_size
    full = pydicom.dcmread(broken / "truncated.dcm")
    assert 0 < len(full.PixelData) < 64 * 64 * 2  # cut inside the pixel data
    with pytest.raises(ValueError, match="less than expected"):
        _ = full.pixel_array

    # an image object without its image (a defect), not a report or plan (packer leaves those out: not_image)
    lost = pydicom.dcmread(broken / "no_pixels.dcm")
    assert "PixelData" not in lost and "Rows" not in lost and lost.SOPClassUID == pydicom.uid.CTImageStorage


def test_planted_photo_defects(demo: DemoTree) -> None:
    by_reason = {d.reason: d.relpath for d in demo.defects if d.relpath.startswith("photos/")}
    cut = (demo.root / by_reason["truncated"]).read_bytes()
    assert cut.startswith(b"\xff\xd8") and not cut.endswith(b"\xff\xd9") and len(cut) > 100
    assert not (demo.root / by_reason["missing_file"]).exists()
    listed = {row["path"] for row in read_table(demo.root / "photos" / "labels.csv")}
    assert {by_reason["truncated"][len("photos/"):], by_reason["missing_file"][len("photos/"):]} <= listed


def test_cut_jpeg_never_ends_with_end_of_image() -> None:
    assert cut_jpeg(b"\xff\xd8\xff\xd9" + b"tail") == b"\xff\xd8\xff"
    assert cut_jpeg(bytes(range(10))) == bytes(range(5))


def test_defects_list_and_readme(demo: DemoTree) -> None:
    assert sorted((d.relpath.split("/")[-1], d.reason) for d in demo.defects) == [
        ("missing.jpg", "missing_file"),
        ("no_pixels.dcm", "no_pixel_data"),
        ("notes.dcm", "not_dicom"),
        ("truncated.dcm", "truncated"),
        ("truncated.jpg", "truncated"),
        ("zero_byte.dcm", "unreadable"),
    ]
    assert all(d.reason in REASONS for d in demo.defects)
    readme = (demo.root / "README.txt").read_text(encoding="utf-8")
    assert all(f"{d.relpath} -> {d.reason}" in readme for d in demo.defects)
    # and the defects planted outside ct/ and photos/: masks, and every broken series, by its folder
    assert "targets/segmentation/images/022.png -> mask_missing" in readme
    assert "targets/segmentation/images/023.png -> mask_size" in readme
    for patient, (_, reason) in SERIES.items():
        assert (demo.root / "series" / patient).is_dir()
        line = next(line for line in readme.splitlines() if line.startswith(f"  {patient} "))
        assert line.endswith(f" -> {reason}") if reason else "->" not in line
    assert "see SERIES below" not in readme


def test_ct_labels_list_every_good_file_once(demo: DemoTree) -> None:
    rows = read_table(demo.root / "ct_labels.csv")
    paths = [row["path"] for row in rows]
    assert len(paths) == len(set(paths))
    assert set(paths) == set(good_dicom_paths(demo)) | {"broken/truncated.dcm"}
    assert not (set(paths) & (BROKEN_DICOM - {"broken/truncated.dcm"}))
    assert {row["label"] for row in rows if row["path"] not in BROKEN_DICOM} == {"normal", "nodule"}


def test_photo_labels_list_every_good_image_once(demo: DemoTree) -> None:
    rows = read_table(demo.root / "photos" / "labels.csv")
    on_disk = {p.relative_to(demo.root / "photos").as_posix() for p in (demo.root / "photos").rglob("*")
               if p.suffix in {".jpg", ".png"}}
    defects = {d.relpath[len("photos/"):] for d in demo.defects if d.relpath.startswith("photos/")}
    paths = [row["path"] for row in rows]
    assert len(paths) == len(set(paths)) and set(paths) == on_disk | defects
    assert len(on_disk - defects) == demo.images == 40
    assert {row["label"] for row in rows if row["path"] not in defects} == {"circle", "square"}
    decoded = set()
    for row in rows:
        assert row["entity"] == row["path"].split("/")[0]
        assert 2023 <= datetime.fromisoformat(row["timestamp"]).year <= 2024
        if row["path"] not in defects:
            image = cv2.imread(str(demo.root / "photos" / row["path"]), cv2.IMREAD_UNCHANGED)
            assert image is not None and image.shape == (96, 128, 3)
            decoded.add(hashlib.sha256(image.tobytes()).hexdigest())
    assert len(decoded) == demo.images
    assert {Path(p).suffix for p in on_disk} == {".jpg", ".png"}


def test_write_ct_slice_stores_hu_plus_1024_and_applies_overrides(tmp_path: Path) -> None:
    hu = np.array([[-1024.0, -1000.0], [0.0, 1000.4]])
    path = tmp_path / "one.dcm"
    write_ct_slice(path, patient_id="P1", study_date="20240101", pixels_hu=hu, WindowCenter=None, PatientSex="F")
    ds = pydicom.dcmread(path)
    assert ds.pixel_array.tolist() == [[0, 24], [1024, 2024]]
    assert "WindowCenter" not in ds and ds.PatientSex == "F" and ds.StudyDate == "20240101"
    write_ct_slice(tmp_path / "two.dcm", patient_id="P1", study_date="20240101", pixels_hu=hu)
    assert pydicom.dcmread(tmp_path / "two.dcm").SOPInstanceUID == ds.SOPInstanceUID  # derived, not random
    with pytest.raises(ValueError, match="NotAKeyword"):
        write_ct_slice(path, patient_id="P1", study_date="20240101", pixels_hu=hu, NotAKeyword=1)


def test_bench_tree_counts_sizes_and_labels(tmp_path: Path) -> None:
    tree = write_bench_tree(tmp_path / "a", samples=23, seed=5, ct_size=32, photo_size=(24, 40))
    root = tree.root
    assert tree.defects == () and tree.dicom_files + tree.images == 23
    assert tree.dicom_files == round(23 * 75 / 115)
    slices = sorted((root / "ct").rglob("*.dcm"))
    photos = sorted((root / "photos").rglob("*.jpg"))
    assert len(slices) == tree.dicom_files and len(photos) == tree.images
    assert not list((root / "photos").rglob("*.png"))
    assert pydicom.dcmread(slices[0]).pixel_array.shape == (32, 32)
    first_photo = cv2.imread(str(photos[0]))
    assert first_photo is not None and first_photo.shape == (24, 40, 3)
    assert len(read_table(root / "ct_labels.csv")) == tree.dicom_files
    assert len(read_table(root / "photos" / "labels.csv")) == tree.images
    again = write_bench_tree(tmp_path / "b", samples=23, seed=5, ct_size=32, photo_size=(24, 40))
    assert tree_digests(root) == tree_digests(again.root)


@pytest.mark.slow  # writes and hashes a 400-sample benchmark tree
def test_bench_tree_patients_are_not_near_copies_of_each_other(tmp_path: Path) -> None:
    """Each benchmark patient has its own anatomy, so the near-copy check links no two patients
    (grouping whole patients would keep the benchmark's split from its ratios)."""
    import pydicom

    from packer.pipeline import nearcopy
    from packer.transform.window import apply_window

    write_bench_tree(tmp_path / "bench", samples=400, seed=0, ct_size=64)
    files = sorted((tmp_path / "bench" / "ct").rglob("*.dcm"))
    rows, patients = [], []
    for path in files:
        ds = pydicom.dcmread(path)
        hu = ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        rows.append(nearcopy.signature(np.stack([(apply_window(hu, c, w) * 255).astype(np.uint8)
                                                 for c, w in ((-600, 1500), (50, 350))])))
        patients.append(path.relative_to(tmp_path / "bench" / "ct").parts[0])
    signatures = np.array(rows, dtype=nearcopy.SIGNATURE_DTYPE)
    groups = np.unique(patients, return_inverse=True)[1]
    candidates = nearcopy.candidate_pairs(signatures["embedding"], groups, 16)
    scores = [nearcopy.verify(signatures["thumb"][i], signatures["thumb"][j]).score
              for i, j in zip(candidates.i, candidates.j, strict=True)]
    assert len(set(patients)) > 40 and len(candidates) > 100
    assert max(scores) < nearcopy.MIN_SCORE


def test_a_copies_tree_is_the_same_bytes_written_by_one_process_or_several(tmp_path: Path) -> None:
    one = write_copies_tree(tmp_path / "one", patients=5, copies=5, slices=3, size=32)
    two = write_copies_tree(tmp_path / "two", patients=5, copies=5, slices=3, size=32, processes=2)
    assert one.copies == two.copies
    assert tree_digests(tmp_path / "one") == tree_digests(tmp_path / "two")


def test_every_slice_of_a_copies_tree_has_its_own_uids_and_every_patient_its_own_study(tmp_path: Path) -> None:
    # 12 patients × 12 slices: parts such as (1, 12) and (11, 2) once ran together into one UID
    write_copies_tree(tmp_path / "raw", patients=12, copies=9, slices=12, size=16)
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in sorted((tmp_path / "raw" / "ct").rglob("*.dcm"))]
    # two of the nine copy kinds are DICOM copies
    assert len({h.SOPInstanceUID for h in headers}) == len(headers) == 12 * 12 + 2
    studies = {h.PatientID: set() for h in headers}
    for h in headers:
        studies[h.PatientID].add(h.StudyInstanceUID)
    assert all(len(uids) == 1 for uids in studies.values())
    assert len({uid for uids in studies.values() for uid in uids}) == len(studies)
