"""Files named as masks or label maps are never packed as images by a source without a table.

A segmentation set ships its label maps beside its images: BraTS's ``<case>_seg.nii.gz`` in each
case's folder, the Medical Segmentation Decathlon's ``labelsTr/``, KiTS's ``segmentation.nii.gz``,
BUSI's ``benign (1)_mask.png`` next to ``benign (1).png``, Kvasir-SEG's ``masks/``. A ``kind: nifti``
or ``kind: image`` source without a table used to pack each of them as an image of its own: a
model trained on that build sees its answers as inputs, and under ``label: folder`` ``masks``
became a class. Such files are now left out as ``label_map`` (listed in ``excluded.jsonl``,
counted, warned about); where a source has a table, the table decides, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import nibabel as nib
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.pipeline.discover import MaskPartners, discover, mask_named
from packer.schemas import load_schema


@pytest.mark.parametrize(("relpath", "why"), [
    ("BraTS20_Training_001/BraTS20_Training_001_seg.nii.gz", "name ending '_seg'"),
    ("BraTS20_Training_355/W39_1998.09.19_Segm.nii", "name ending '_Segm'"),
    ("case_00000/segmentation.nii.gz", "name ending 'segmentation'"),
    ("Task03_Liver/labelsTr/liver_0.nii.gz", "folder 'labelsTr'"),
    ("s0000/segmentations/liver.nii.gz", "folder 'segmentations'"),
    ("benign/benign (1)_mask.png", "name ending '_mask'"),
    ("benign/benign (1)_mask_1.png", "name ending '_mask_1'"),
    ("ISIC_0000000_segmentation.png", "name ending '_segmentation'"),
    ("Kvasir-SEG/masks/cju0qkwl35piu0993l0dewei2.jpg", "folder 'masks'"),
    ("CVC-ClinicDB/Ground Truth/1.tif", "folder 'Ground Truth'"),
    ("ISIC2018_Task1_Training_GroundTruth/ISIC_0000000_segmentation.png",
     "folder 'ISIC2018_Task1_Training_GroundTruth'"),
    ("DRIVE/training/1st_manual/21_manual1.gif", None),  # not named by these rules: packed
    ("BraTS20_Training_001/BraTS20_Training_001_t1ce.nii.gz", None),
    ("case_00000/imaging.nii.gz", None),
    ("benign/benign (1).png", None),
    ("Task03_Liver/imagesTr/liver_0.nii.gz", None),
    ("chest/segment_normal_0001.png", None),
    ("photos/gtx_1080.jpg", None),
])
def test_which_names_mark_a_mask_or_label_map(relpath: str, why: str | None) -> None:
    assert mask_named(relpath) == why


def _volume(path: Path, seed: int, *, labels: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 3, (8, 8, 4)).astype(np.uint8) if labels else rng.normal(0, 100, (8, 8, 4)).astype(np.int16)
    nib.save(nib.Nifti1Image(data, np.diag([1.0, 1.0, 2.0, 1.0])), str(path))


def _png(path: Path, seed: int, *, mask: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels = (rng.integers(0, 2, (24, 24)) * 255).astype(np.uint8) if mask else \
        rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), pixels)


def _job(tmp_path: Path, kind: str, root: Path, **source: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "named", "sources": [{"kind": kind, "root": str(root), "label": "none", **source}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16]}} if kind == "image" else
        {"nifti": {"windows": [{"center": 0, "width": 400}], "sample": "volume", "output": "uint8"}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"),
        "validate": {"max_bad_fraction": 0.0}}
    doc["sources"][0] = {k: v for k, v in doc["sources"][0].items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_brats_folder_without_a_table_packs_its_sequences_and_leaves_its_label_maps_out(tmp_path: Path) -> None:
    root = tmp_path / "brats"
    for case in range(3):
        name = f"BraTS20_Training_{case:03d}"
        for k, sequence in enumerate(("t1", "flair")):
            _volume(root / name / f"{name}_{sequence}.nii.gz", 10 * case + k)
        _volume(root / name / f"{name}_seg.nii.gz", 10 * case + 9, labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert sorted(Path(ref.relpath).name for ref in found.refs) == sorted(
        f"BraTS20_Training_{c:03d}_{s}.nii.gz" for c in range(3) for s in ("t1", "flair"))
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [
        (f"BraTS20_Training_{c:03d}_seg.nii.gz", "label_map") for c in range(3)]
    assert found.excluded[0].detail.startswith("name ending '_seg': named as a mask or label map")
    assert any("3 file(s) named as masks or label maps left out (excluded.jsonl, why label_map; name ending "
               "'_seg' (3))" in warning for warning in found.warnings)


def test_a_decathlon_folder_without_a_table_leaves_labels_tr_out_and_a_table_packs_what_it_names(
        tmp_path: Path) -> None:
    root = tmp_path / "Task03_Liver"
    for case in range(2):
        _volume(root / "imagesTr" / f"liver_{case}.nii.gz", case)
        _volume(root / "labelsTr" / f"liver_{case}.nii.gz", 50 + case, labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert [ref.relpath for ref in found.refs] == ["imagesTr/liver_0.nii.gz", "imagesTr/liver_1.nii.gz"]
    assert [(e.why, e.detail.split(":")[0]) for e in found.excluded] == [("label_map", "folder 'labelsTr'")] * 2
    # with a table naming the label maps as masks, the table decides: nothing is left out, no warning
    table = tmp_path / "cases.csv"
    table.write_text("path,entity,mask\n" + "".join(
        f"imagesTr/liver_{c}.nii.gz,liver_{c},labelsTr/liver_{c}.nii.gz\n" for c in range(2)))
    tabled = discover(load_job(_job(tmp_path, "nifti", root, table=str(table),
                                    mask={"column": "mask", "classes": [0, 1, 2]})))
    assert [ref.relpath for ref in tabled.refs] == ["imagesTr/liver_0.nii.gz", "imagesTr/liver_1.nii.gz"]
    assert tabled.excluded == [] and not any("label_map" in w for w in tabled.warnings)


def test_a_table_that_lists_a_mask_named_file_as_an_image_packs_it(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _png(root / "a.png", 0)
    _png(root / "a_mask.png", 1)
    table = tmp_path / "t.csv"
    table.write_text("path,label,entity\na.png,x,E1\na_mask.png,y,E2\n")
    found = discover(load_job(_job(tmp_path, "image", root, label=None, table=str(table))))
    assert [ref.relpath for ref in found.refs] == ["a.png", "a_mask.png"] and found.excluded == []


def test_a_busi_layout_under_label_folder_builds_two_classes_of_images_and_lists_the_masks_left_out(
        tmp_path: Path) -> None:
    root = tmp_path / "Dataset_BUSI_with_GT"
    for k, label in enumerate(("benign", "malignant")):
        for i in range(1, 4):
            _png(root / label / f"{label} ({i}).png", 10 * k + i)
            _png(root / label / f"{label} ({i})_mask.png", 100 + 10 * k + i, mask=True)
        _png(root / label / f"{label} (1)_mask_1.png", 7, mask=True)  # BUSI's second mask of one image
    run = CliRunner().invoke(main, ["build", str(_job(tmp_path, "image", root, label="folder")),
                                    "--scheduler", "sync"])
    assert run.exit_code == 0, run.output
    assert "8 file(s) named as masks or label maps left out (excluded.jsonl, why label_map" in run.output
    version = next((tmp_path / "out").rglob("manifest.json")).parent
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["inputs"]["samples"] == 6 and manifest["inputs"]["excluded"] == {"label_map": 8}
    assert manifest["label_map"] == {"benign": 0, "malignant": 1}  # no "masks" class, no mask as a benign image
    records = read_excluded(version / EXCLUDED_FILE)
    assert sorted(Path(r["path"]).name for r in records) == sorted(
        [f"{label} ({i})_mask.png" for label in ("benign", "malignant") for i in range(1, 4)]
        + ["benign (1)_mask_1.png", "malignant (1)_mask_1.png"])
    validator = jsonschema.Draft202012Validator(load_schema("excluded"))
    for record in records:
        validator.validate(record)
        assert record["why"] == "label_map" and record["stage"] == "discover"


def test_a_root_of_label_maps_alone_is_packed_as_images_it_names_no_other_image(tmp_path: Path) -> None:
    """A file is left out as a label map only beside the image it belongs to: a root holding label
    maps alone (the user's choice of labelsTr/ as the root) packs them, as asked."""
    root = tmp_path / "labelsTr"
    for case in range(2):
        _volume(root / "masks" / f"case_{case}.nii.gz", case, labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert len(found.refs) == 2 and found.excluded == []

def test_a_mask_word_in_a_name_counts_only_where_the_rest_names_an_image_of_the_source() -> None:
    """A face-mask classification set names its images with_mask_12.jpg and without_mask_7.jpg:
    no image is named 'with' or 'without' (or with_..., without_... other than these), so they are
    images. BUSI's benign (1)_mask.png has benign (1).png; ISIC's masks, in a folder of their
    own, have their images elsewhere in the source; KiTS's segmentation.nii.gz has imaging.nii.gz
    in its case folder."""
    faces = MaskPartners.of(["with_mask/with_mask_1.jpg", "with_mask/with_mask_2.jpg",
                             "without_mask/without_mask_1.jpg"])
    assert all(mask_named(rel, faces) is None
               for rel in ("with_mask/with_mask_1.jpg", "without_mask/without_mask_1.jpg"))
    busi = MaskPartners.of(["benign/benign (1).png", "benign/benign (1)_mask.png", "benign/benign (1)_mask_1.png"])
    assert [mask_named(rel, busi) for rel in ("benign/benign (1).png", "benign/benign (1)_mask.png",
                                             "benign/benign (1)_mask_1.png")] == [None, "name ending '_mask'",
                                                                                 "name ending '_mask_1'"]
    isic = MaskPartners.of(["images/ISIC_0000000.jpg", "masks_of_task1/ISIC_0000000_segmentation.png"])
    assert mask_named("masks_of_task1/ISIC_0000000_segmentation.png", isic) == "name ending '_segmentation'"
    kits = MaskPartners.of(["case_00000/imaging.nii.gz", "case_00000/segmentation.nii.gz", "lonely/mask.png"])
    assert mask_named("case_00000/segmentation.nii.gz", kits) == "name ending 'segmentation'"
    assert mask_named("lonely/mask.png", kits) is None  # no image beside it: an image named mask


def test_a_mask_named_file_in_a_case_folder_is_that_case_s_label_map_whatever_its_prefix(tmp_path: Path) -> None:
    """BraTS 2020's case 355 names its label map W39_1998.09.19_Segm.nii: no image is named
    W39_1998.09.19, but its folder is a case folder, whose other files are the case's images
    (BraTS20_Training_355_t1.nii, ...), so the file ending in a mask word is that case's label
    map. It was packed as an image. A folder whose images are not named after it (a class folder
    of a face-mask set) keeps the prefix rule."""
    case = "BraTS20_Training_355"
    brats = MaskPartners.of([f"{case}/{case}_t1.nii", f"{case}/{case}_flair.nii", f"{case}/W39_1998.09.19_Segm.nii"])
    assert mask_named(f"{case}/W39_1998.09.19_Segm.nii", brats) == "name ending '_Segm'"
    faces = MaskPartners.of(["faces/0001.jpg", "faces/with_mask_2.jpg"])
    assert mask_named("faces/with_mask_2.jpg", faces) is None
    root = tmp_path / "brats"
    for k, sequence in enumerate(("t1", "flair")):
        _volume(root / case / f"{case}_{sequence}.nii", k)
    _volume(root / case / "W39_1998.09.19_Segm.nii", 9, labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert sorted(Path(ref.relpath).name for ref in found.refs) == [f"{case}_flair.nii", f"{case}_t1.nii"]
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("W39_1998.09.19_Segm.nii", "label_map")]


def test_kits23_instance_masks_beside_their_case_s_segmentation_are_left_out(tmp_path: Path) -> None:
    """KiTS23 keeps one binary mask per instance and annotator in case_XXXXX/instances/
    (kidney_instance-1_annotation-1.nii.gz) beside imaging.nii.gz and segmentation.nii.gz: they
    were packed as images. An instances/ folder counts only beside its case's label map: one of
    images with no mask-named file beside it is packed."""
    kits = MaskPartners.of(["case_00000/imaging.nii.gz", "case_00000/segmentation.nii.gz",
                            "case_00000/instances/kidney_instance-1_annotation-1.nii.gz",
                            "photos/cover.jpg", "photos/instances/a.jpg"])
    assert mask_named("case_00000/instances/kidney_instance-1_annotation-1.nii.gz", kits) == "folder 'instances'"
    assert mask_named("photos/instances/a.jpg", kits) is None
    root = tmp_path / "kits23"
    for case in range(2):
        _volume(root / f"case_{case:05d}" / "imaging.nii.gz", case)
        _volume(root / f"case_{case:05d}" / "segmentation.nii.gz", 10 + case, labels=True)
        _volume(root / f"case_{case:05d}" / "instances" / "kidney_instance-1_annotation-1.nii.gz", 20 + case,
                labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert [ref.relpath for ref in found.refs] == ["case_00000/imaging.nii.gz", "case_00001/imaging.nii.gz"]
    assert sorted(e.detail.split(":")[0] for e in found.excluded) == ["folder 'instances'"] * 2 + [
        "name ending 'segmentation'"] * 2


def test_a_face_mask_classification_set_builds_both_classes(tmp_path: Path) -> None:
    root = tmp_path / "Face Mask Dataset"
    for k, label in enumerate(("with_mask", "without_mask")):
        for i in range(1, 4):
            _png(root / label / f"{label}_{i}.jpg", 10 * k + i)
    found = discover(load_job(_job(tmp_path, "image", root, label="folder")))
    assert len(found.refs) == 6 and found.excluded == []
    assert {ref.label for ref in found.refs} == {"with_mask", "without_mask"}


def test_a_masks_folder_counts_only_where_its_files_have_their_images() -> None:
    """Kvasir-SEG's masks/x.jpg has images/x.jpg; TotalSegmentator's s0000/segmentations/liver.nii.gz
    has s0000/ct.nii.gz beside its folder; a classification set whose classes are mask/ and
    no_mask/ has neither, and its mask/ images are packed."""
    kvasir = MaskPartners.of(["images/cju0.jpg", "masks/cju0.jpg"])
    assert mask_named("masks/cju0.jpg", kvasir) == "folder 'masks'"
    total = MaskPartners.of(["s0000/ct.nii.gz", "s0000/segmentations/liver.nii.gz"])
    assert mask_named("s0000/segmentations/liver.nii.gz", total) == "folder 'segmentations'"
    classes = MaskPartners.of(["mask/a.jpg", "mask/b.jpg", "no_mask/c.jpg"])
    assert mask_named("mask/a.jpg", classes) is None and mask_named("mask/a.jpg") == "folder 'mask'"
    # nnU-Net's raw layout (the demo's too): imagesTr/x_0000.nii.gz, a channel suffix, holds
    # labelsTr/x.nii.gz's image; the label maps were packed as input images, without a word
    nnunet = MaskPartners.of(["imagesTr/liver_0_0000.nii.gz", "imagesTr/liver_0_0001.nii.gz",
                              "labelsTr/liver_0.nii.gz", "labelsTr/liver_1.nii.gz"])
    assert mask_named("labelsTr/liver_0.nii.gz", nnunet) == "folder 'labelsTr'"
    # without an images folder beside it, a masks folder's file needs an image of its own name
    flat = MaskPartners.of(["scans/liver_0_0000.nii.gz", "scans/liver_10_0000.nii.gz", "masks/liver_0.nii.gz",
                            "masks/liver_1.nii.gz"])
    assert mask_named("masks/liver_0.nii.gz", flat) == "folder 'masks'"
    assert mask_named("masks/liver_1.nii.gz", flat) is None  # liver_10's image is not liver_1's


def test_a_decathlon_label_map_whose_image_is_missing_is_still_left_out(tmp_path: Path) -> None:
    """A partial download lacks imagesTr/la_003.nii.gz but ships labelsTr/la_003.nii.gz: the
    images folder beside labelsTr/ marks the layout, so that label map is no image either. It was
    packed as one, because the folder rule looked for an image of its name alone."""
    partners = MaskPartners.of(["imagesTr/la_001.nii.gz", "labelsTr/la_001.nii.gz", "labelsTr/la_003.nii.gz"])
    assert mask_named("labelsTr/la_003.nii.gz", partners) == "folder 'labelsTr'"
    kvasir = MaskPartners.of(["Kvasir-SEG/images/a.jpg", "Kvasir-SEG/masks/b.jpg"])
    assert mask_named("Kvasir-SEG/masks/b.jpg", kvasir) == "folder 'masks'"
    root = tmp_path / "Task02_Heart"
    for case in (1, 2, 3):
        if case != 3:
            _volume(root / "imagesTr" / f"la_{case:03d}.nii.gz", case)
        _volume(root / "labelsTr" / f"la_{case:03d}.nii.gz", 50 + case, labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert [ref.relpath for ref in found.refs] == ["imagesTr/la_001.nii.gz", "imagesTr/la_002.nii.gz"]
    assert [(e.why, e.detail.split(":")[0]) for e in found.excluded] == [("label_map", "folder 'labelsTr'")] * 3


def test_a_masks_folder_file_without_an_image_of_its_name_is_still_named_by_its_own_name(tmp_path: Path) -> None:
    """The folder rule and the name rule each suffice: masks/p0_mask.nii.gz has no image named
    p0_mask (the folder rule's partner), but its name ends in '_mask' and volumes/p0.nii.gz is the
    image its rest names. It was packed as an image of its own."""
    partners = MaskPartners.of(["volumes/p0.nii.gz", "masks/p0_mask.nii.gz"])
    assert mask_named("masks/p0_mask.nii.gz", partners) == "name ending '_mask'"
    root = tmp_path / "set"
    for case in range(2):
        _volume(root / "volumes" / f"p{case}.nii.gz", case)
        _volume(root / "masks" / f"p{case}_mask.nii.gz", 50 + case, labels=True)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert [ref.relpath for ref in found.refs] == ["volumes/p0.nii.gz", "volumes/p1.nii.gz"]
    assert [(e.why, e.detail.split(":")[0]) for e in found.excluded] == [("label_map", "name ending '_mask'")] * 2


def test_a_ground_truth_folder_named_after_a_patient_is_named_by_its_kind_under_phi(tmp_path: Path) -> None:
    """Under pseudonymization the warning named the folder that marked the masks as written
    (Doe_John_MRN0042_GroundTruth), into stderr, warnings.jsonl, the report and JUnit; it now says
    what kind of folder it was. With phi: keep the name stays, to say which folder."""
    from packer.phi import Pseudonymizer

    root = tmp_path / "raw"
    for n, patient in enumerate(("Doe_John_MRN0042", "Roe_Jane_MRN0043")):
        _png(root / patient / f"{patient}_img.png", n)
        _png(root / patient / f"{patient}_GroundTruth" / f"{patient}_img.png", 10 + n, mask=True)
    job = load_job(_job(tmp_path, "image", root))
    hidden = " ".join(discover(job, Pseudonymizer(mode="pseudonymize", dates="shift", key=b"k" * 32)).warnings)
    assert "a masks or ground-truth folder (2)" in hidden and "MRN" not in hidden, hidden
    assert "folder 'Doe_John_MRN0042_GroundTruth'" in " ".join(discover(job).warnings)
