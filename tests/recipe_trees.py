"""Synthetic trees in the exact published layouts of five public datasets, for the recipes.

Each ``write_*`` function writes a small tree (tens of files, tiny images with different
pixels per file) under ``data/<the folder as the dataset ships>``, with the real file names,
table headers, column order and cell conventions, and the pitfalls the real data has: several
views per study, lateral views, patients with many follow-ups, rows repeated per box, labels
missing for a few studies, files that are no part of the labelled set. It returns what it wrote
as plain Python values (the truth the tests compare a build with), computed here, never by
packer.

Sources of the layouts: torchxrayvision's dataset classes (``torchxrayvision/datasets.py``) and
the tables it ships (``Data_Entry_2017_v2020.csv.gz``, ``chexpert_train.csv.gz``,
``kaggle_stage_2_train_labels.csv.zip``); the PhysioNet page of MIMIC-CXR-JPG 2.0.0; the
Kaggle pages of NIH Chest X-rays and the RSNA Pneumonia Detection Challenge; the Medical
Segmentation Decathlon's ``dataset.json`` (as MONAI's ``DecathlonDataset`` reads it).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import JPEGBaseline8Bit, SecondaryCaptureImageStorage, generate_uid

from tests.nifti_files import write_nifti

# the 14 findings of ChestX-ray14, in the order of Wang et al. (2017), table 1 and the README
NIH_FINDINGS = ("Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia",
                "Pneumothorax", "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia")

# CheXpert's 14 observations, in the column order of train.csv and valid.csv
CHEXPERT_LABELS = ("No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion",
                   "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
                   "Pleural Other", "Fracture", "Support Devices")

# MIMIC-CXR-JPG's mimic-cxr-2.0.0-chexpert.csv has the same 14 columns, in alphabetical order
MIMIC_LABELS = tuple(sorted(CHEXPERT_LABELS))

def _pixels(shape: tuple[int, ...], key: str) -> np.ndarray:
    """Random uint8 pixels seeded by the file's name: different for every file (no planted
    copies), the same on every run."""
    return np.random.default_rng(zlib.crc32(key.encode())).integers(0, 256, shape, dtype=np.uint8)


def _image(path: Path, shape: tuple[int, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), _pixels(shape, path.as_posix().rsplit("/data/", 1)[-1])), path


def _csv_text(header: list[str], rows: list[list[str]], *, trailing_comma: bool = False) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    text = out.getvalue()
    if trailing_comma:  # NIH's Data_Entry_2017.csv ends every line, the header too, with a comma
        text = "".join(line + ",\n" for line in text.splitlines())
    return text


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


# -- NIH ChestX-ray14 (the Kaggle download "NIH Chest X-rays": images_001/images/ ... images_012/images/) --


@dataclass(frozen=True)
class NihImage:
    name: str                     # Image Index: <patient:08d>_<follow-up:03d>.png
    relpath: str                  # images_00N/images/<name>
    patient: str                  # Patient ID as written (no leading zeros)
    findings: tuple[str, ...]     # the labels after dropping "No Finding"
    view: str


@dataclass(frozen=True)
class NihTree:
    root: Path
    images: tuple[NihImage, ...]
    train_val: tuple[str, ...]    # names in train_val_list.txt
    test: tuple[str, ...]         # names in test_list.txt


# (patient, [(Finding Labels, view), ...] one per follow-up, age, gender)
_NIH_PATIENTS: list[tuple[int, list[tuple[str, str]], int, str]] = [
    (1, [("Cardiomegaly", "PA"), ("Cardiomegaly|Emphysema", "PA"), ("Cardiomegaly|Effusion", "PA")], 58, "M"),
    (2, [("No Finding", "PA")], 80, "M"),
    (3, [("Hernia", "PA"), ("Hernia", "PA"), ("Hernia|Infiltration", "PA"), ("Hernia", "AP")], 74, "F"),
    (4, [("Mass|Nodule", "AP")], 82, "M"),
    # a patient with many follow-ups, lying (AP) and standing (PA)
    (5, [("No Finding", "PA"), ("Infiltration", "AP"), ("Pleural_Thickening|Pneumothorax", "AP"),
         ("Consolidation|Edema|Fibrosis", "AP"), ("No Finding", "PA"), ("Atelectasis|Effusion|Infiltration", "AP"),
         ("Pneumonia", "AP"), ("No Finding", "PA"), ("Effusion", "AP")], 39, "F"),
    (6, [("Atelectasis|Pneumonia", "PA")], 414, "M"),    # the published file has ages over 400
    (7, [("Effusion|Infiltration", "PA"), ("No Finding", "PA")], 55, "F"),
    (8, [("No Finding", "PA")], 24, "F"),
    (9, [("Nodule", "PA"), ("Mass|Nodule", "PA")], 66, "M"),
    (10, [("No Finding", "AP")], 47, "M"),
    (11, [("Emphysema|Pneumothorax", "PA"), ("Emphysema", "PA"), ("Emphysema|Pneumothorax", "AP")], 61, "M"),
    (12, [("No Finding", "PA")], 33, "F"),
    (13, [("Cardiomegaly|Edema|Effusion", "AP")], 71, "F"),
    (14, [("Fibrosis", "PA"), ("Fibrosis|Pleural_Thickening", "PA")], 69, "M"),
    (15, [("No Finding", "PA")], 19, "M"),
    (16, [("Consolidation", "AP"), ("Consolidation|Pneumonia", "AP")], 52, "F"),
    (17, [("Hernia|Mass", "PA")], 77, "F"),
    (18, [("No Finding", "PA")], 41, "M"),
    (19, [("Atelectasis", "AP"), ("Atelectasis|Effusion", "AP")], 60, "M"),
    (20, [("No Finding", "PA")], 28, "F"),
]
_NIH_TEST = {3, 9, 11, 16}   # the official test list is patient-wise
_NIH_RGBA = "00000007_000.png"  # a few of the published PNGs are RGBA, not grayscale


def write_nih(data: Path) -> NihTree:
    """``data/nih-chest-xrays/``: the Kaggle "NIH Chest X-rays" download, unzipped.

    ``Data_Entry_2017.csv`` with its published header (the bracketed ``OriginalImage[Width,Height]``
    and ``OriginalImagePixelSpacing[x,y]`` cells are read by any CSV reader as two columns each, and
    every line ends with a comma: a twelfth, unnamed column), images in consecutive blocks of
    sorted names under ``images_001/images/`` ... , ``train_val_list.txt`` and ``test_list.txt``
    one name a line, the test list patient-wise."""
    root = data / "nih-chest-xrays"
    rows: list[list[str]] = []
    names: list[tuple[str, str, tuple[str, ...], str]] = []
    for patient, follow_ups, age, gender in _NIH_PATIENTS:
        for n, (findings, view) in enumerate(follow_ups):
            name = f"{patient:08d}_{n:03d}.png"
            width, height, spacing = (2500, 2048, "0.168") if n % 2 else (2682, 2749, "0.14300000000000002")
            rows.append([name, findings, str(n), str(patient), str(age + n // 3), gender, view, str(width),
                         str(height), spacing, spacing])
            names.append((name, str(patient), tuple(f for f in findings.split("|") if f != "No Finding"), view))
    header = ["Image Index", "Finding Labels", "Follow-up #", "Patient ID", "Patient Age", "Patient Gender",
              "View Position", "OriginalImage[Width", "Height]", "OriginalImagePixelSpacing[x", "y]"]
    _write(root / "Data_Entry_2017.csv", _csv_text(header, rows, trailing_comma=True))
    images = []
    for i, (name, patient, findings, view) in enumerate(sorted(names)):
        relpath = f"images_{1 + i // 12:03d}/images/{name}"
        shape = (20, 18, 4) if name == _NIH_RGBA else (20 + i % 3, 18)
        _image(root / relpath, shape)
        images.append(NihImage(name, relpath, patient, findings, view))
    test = tuple(im.name for im in images if int(im.patient) in _NIH_TEST)
    train_val = tuple(im.name for im in images if int(im.patient) not in _NIH_TEST)
    _write(root / "train_val_list.txt", "".join(f"{n}\n" for n in train_val))
    _write(root / "test_list.txt", "".join(f"{n}\n" for n in test))
    _write(root / "BBox_List_2017.csv", "Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
                                        "00000013_000.png,Cardiomegaly,225.08,547.02,86.8,79.1\n")
    return NihTree(root, tuple(images), train_val, test)


# -- CheXpert-v1.0-small -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChexpertImage:
    relpath: str                  # relative to CheXpert-v1.0-small/: train/patient00001/study1/view1_frontal.jpg
    patient: str                  # patient00001
    split: str                    # train | valid (the table it is listed in)
    frontal: bool
    cells: tuple[str, ...]        # the 14 observation cells as written: "1.0", "0.0", "-1.0" or ""


@dataclass(frozen=True)
class ChexpertTree:
    root: Path
    images: tuple[ChexpertImage, ...]


_CHEXPERT_HEADER = ["Path", "Sex", "Age", "Frontal/Lateral", "AP/PA", *CHEXPERT_LABELS]


def _chexpert_cells(rng: np.random.Generator, *, valid: bool) -> tuple[str, ...]:
    """One study's 14 cells: valid.csv holds radiologists' 1.0/0.0 only; train.csv the labeler's
    1.0, 0.0, -1.0 (uncertain) and blank (not mentioned); No Finding is 1.0 or blank."""
    if valid:
        cells = [str(v) for v in rng.choice(["1.0", "0.0"], size=14, p=[0.3, 0.7])]
        return tuple(cells)
    cells = [str(v) for v in rng.choice(["1.0", "0.0", "-1.0", ""], size=14, p=[0.2, 0.15, 0.2, 0.45])]
    cells[0] = "1.0" if rng.random() < 0.2 else ""
    return tuple(cells)


def write_chexpert(data: Path) -> ChexpertTree:
    """``data/CheXpert-v1.0-small/``: ``train.csv`` and ``valid.csv`` whose ``Path`` starts with
    ``CheXpert-v1.0-small/`` (the folder above the root), one row per image; the labels are the
    study's, so a study's frontal and lateral rows carry the same cells; laterals have a blank
    ``AP/PA``; a study with two frontal views; a patient with four studies; ``Sex: Unknown`` and
    ``Age: 0`` as the real table has them."""
    root = data / "CheXpert-v1.0-small"
    rng = np.random.default_rng(7)
    # (patient number, [(study, views)]); a view is "frontal" or "lateral"
    train = [(1, [(1, ["frontal"])]),
             (2, [(1, ["frontal", "lateral"]), (2, ["frontal"])]),
             (3, [(1, ["frontal"])]),
             (4, [(1, ["frontal", "lateral"])]),
             (5, [(1, ["frontal", "frontal", "lateral"]), (2, ["frontal"]), (3, ["frontal", "lateral"]),
                  (4, ["frontal"])]),
             (6, [(1, ["frontal"])]),
             (7, [(1, ["lateral"]), (2, ["frontal"])]),
             (8, [(1, ["frontal", "lateral"])]),
             (9, [(1, ["frontal"]), (2, ["frontal"])]),
             (10, [(1, ["frontal"])])]
    valid = [(64541, [(1, ["frontal"])]), (64542, [(1, ["frontal", "lateral"])]), (64543, [(1, ["frontal"])]),
             (64544, [(1, ["frontal"])])]
    images: list[ChexpertImage] = []
    for split, patients in (("train", train), ("valid", valid)):
        rows = []
        for number, studies in patients:
            patient = f"patient{number:05d}"
            sex = "Unknown" if number == 6 else ("Female" if number % 2 else "Male")
            age = "0" if number == 9 else str(30 + number * 3)
            for study, views in studies:
                cells = _chexpert_cells(rng, valid=split == "valid")
                for v, view in enumerate(views, start=1):
                    relpath = f"{split}/{patient}/study{study}/view{v}_{view}.jpg"
                    _image(root / relpath, (24 + v, 20) if view == "frontal" else (24, 22))
                    ap_pa = "" if view == "lateral" else ("PA" if (number + study) % 3 == 0 else "AP")
                    rows.append([f"CheXpert-v1.0-small/{relpath}", sex, age, view.capitalize(), ap_pa, *cells])
                    images.append(ChexpertImage(relpath, patient, split, view == "frontal", cells))
        _write(root / f"{split}.csv", _csv_text(_CHEXPERT_HEADER, rows))
    return ChexpertTree(root, tuple(images))


# -- MIMIC-CXR-JPG 2.0.0 (wget -r https://physionet.org/files/mimic-cxr-jpg/2.0.0/) ------------------------


@dataclass(frozen=True)
class MimicImage:
    dicom_id: str
    relpath: str                  # files/p10/p10000032/s50414267/<dicom_id>.jpg
    subject: str
    study: str
    view: str                     # ViewPosition as written ("" for the images without one)
    split: str                    # as written in mimic-cxr-2.0.0-split.csv: train | validate | test
    cells: tuple[str, ...] | None  # the study's 14 chexpert cells (MIMIC_LABELS order); None: no row


@dataclass(frozen=True)
class MimicTree:
    root: Path
    images: tuple[MimicImage, ...]


_MIMIC_META = ["dicom_id", "subject_id", "study_id", "PerformedProcedureStepDescription", "ViewPosition", "Rows",
               "Columns", "StudyDate", "StudyTime", "ProcedureCodeSequence_CodeMeaning", "ViewCodeSequence_CodeMeaning",
               "PatientOrientationCodeSequence_CodeMeaning"]
_MIMIC_VIEWS = {"PA": ("CHEST (PA AND LAT)", "postero-anterior", "Erect"),
                "LATERAL": ("CHEST (PA AND LAT)", "lateral", "Erect"),
                "LL": ("CHEST (PA AND LAT)", "left lateral", "Erect"),
                "AP": ("CHEST (PORTABLE AP)", "antero-posterior", "Recumbent"),
                "": ("CHEST (PORTABLE AP)", "", "")}


def write_mimic(data: Path) -> MimicTree:
    """``data/physionet.org/files/mimic-cxr-jpg/2.0.0/``, as ``wget -r`` writes it: the three
    tables gzipped as published (``mimic-cxr-2.0.0-metadata.csv.gz``, ``-chexpert.csv.gz``,
    ``-split.csv.gz``), images under ``files/p<first two digits>/p<subject_id>/s<study_id>/``.

    Pitfalls planted: studies with a frontal and a lateral (``LATERAL``, ``LL``) view, a study
    with two frontal views, an image without a ``ViewPosition``, a subject with many follow-up
    studies, subjects under ``p11`` and ``p19``, a study with no row in the chexpert table (2.0.0
    has 227,835 studies and 227,827 label rows), a study whose label row is all blank, dates
    shifted into the 22nd century, ``validate`` (not ``valid``) in the split table."""
    root = data / "physionet.org" / "files" / "mimic-cxr-jpg" / "2.0.0"
    rng = np.random.default_rng(11)
    # (subject, split, [(study, [views])])
    subjects = [("10000032", "train", [("50414267", ["PA", "LATERAL"]), ("53189527", ["PA", "LATERAL"]),
                                       ("53911762", ["AP"]), ("56699142", ["AP"])]),
                ("10000764", "train", [("57375967", ["AP", ""])]),
                ("10000898", "validate", [("50771383", ["PA", "LATERAL"]), ("54205396", ["PA", "LL"])]),
                ("10001217", "train", [("52067803", ["AP", "AP"])]),
                ("10001884", "train", [(f"5{n}000000", ["AP"]) for n in range(1, 7)]),  # six follow-ups
                ("10002013", "test", [("51061876", ["PA", "LATERAL"])]),
                ("11000011", "train", [("55112233", ["PA", "LATERAL"])]),
                ("19999733", "test", [("57132437", ["AP"])]),
                ("12000560", "validate", [("50000001", ["AP"])])]
    no_labels = "56699142"         # a study the chexpert table lacks
    all_blank = "53911762"         # a study whose label row is blank everywhere
    meta, labels, splits = [], [], []
    images: list[MimicImage] = []
    day = 0
    for subject, split, studies in subjects:
        for study, views in studies:
            if study == all_blank:
                cells: tuple[str, ...] | None = ("",) * 14
            elif study == no_labels:
                cells = None
            else:
                cells = tuple(str(v) for v in rng.choice(["1.0", "0.0", "-1.0", ""], size=14,
                                                         p=[0.25, 0.15, 0.15, 0.45]))
            if cells is not None:
                labels.append([subject, study, *cells])
            day += 1
            for view in views:
                dicom_id = "-".join(f"{int(x):08x}" for x in rng.integers(0, 2**32, size=5))
                relpath = f"files/p{subject[:2]}/p{subject}/s{study}/{dicom_id}.jpg"
                _image(root / relpath, (26, 22) if view in ("PA", "AP") else (26, 24))
                step, orientation, position = _MIMIC_VIEWS[view]
                meta.append([dicom_id, subject, study, step, view, "3056", "2544", f"2180{(day % 9) + 1:02d}15",
                             f"{100000 + day * 137}.{day % 1000:03d}", step, orientation, position])
                splits.append([dicom_id, study, subject, split])
                images.append(MimicImage(dicom_id, relpath, subject, study, view, split, cells))
    _write(root / "mimic-cxr-2.0.0-metadata.csv.gz", _csv_text(_MIMIC_META, meta))
    _write(root / "mimic-cxr-2.0.0-chexpert.csv.gz", _csv_text(["subject_id", "study_id", *MIMIC_LABELS], labels))
    _write(root / "mimic-cxr-2.0.0-split.csv.gz", _csv_text(["dicom_id", "study_id", "subject_id", "split"], splits))
    return MimicTree(root, tuple(images))


# -- RSNA Pneumonia Detection Challenge (kaggle competitions download rsna-pneumonia-detection-challenge) --


@dataclass(frozen=True)
class RsnaImage:
    patient_id: str               # a UUID: one image each
    klass: str                    # stage_2_detailed_class_info.csv's class
    target: int                   # stage_2_train_labels.csv's Target
    boxes: int                    # rows in the labels table (1 for a negative, with blank box cells)


@dataclass(frozen=True)
class RsnaTree:
    root: Path
    images: tuple[RsnaImage, ...]
    test_ids: tuple[str, ...] = field(default=())


RSNA_CLASSES = ("Lung Opacity", "No Lung Opacity / Not Normal", "Normal")


def _rsna_dicom(path: Path, patient_id: str, sex: str, age: int, view: str) -> None:
    """A DICOM as the challenge ships it: Secondary Capture of a CR, 8-bit MONOCHROME2, JPEG
    Baseline, PatientID and PatientName the patientId, no window, dates all 1901-01-01."""
    pixels = _pixels((32, 32), patient_id)
    ok, jpeg = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    instance = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = instance
    ds.SOPClassUID, ds.SOPInstanceUID = SecondaryCaptureImageStorage, instance
    ds.StudyDate, ds.StudyTime = "19010101", "000000.00"
    ds.Modality, ds.ConversionType = "CR", "WSD"
    ds.ReferringPhysicianName = ""
    ds.SeriesDescription = f"view: {view}"
    ds.PatientName, ds.PatientID = patient_id, patient_id
    ds.PatientBirthDate = ""
    with warnings.catch_warnings():  # the challenge's ages are bare numbers ("51"), not DICOM's "051Y"
        warnings.simplefilter("ignore", UserWarning)
        ds.PatientSex, ds.PatientAge = sex, str(age)
    ds.BodyPartExamined, ds.ViewPosition = "CHEST", view
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.StudyID, ds.SeriesNumber, ds.InstanceNumber = "", "1", "1"
    ds.PatientOrientation = ""
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = pixels.shape
    ds.PixelSpacing = [0.14300000000000002, 0.14300000000000002]
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.LossyImageCompression, ds.LossyImageCompressionMethod = "01", "ISO_10918_1"
    ds.PixelData = encapsulate([jpeg.tobytes()])
    ds["PixelData"].VR = "OB"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ds.save_as(path, enforce_file_format=True)
    assert pydicom.dcmread(path).pixel_array.shape == pixels.shape


def write_rsna(data: Path) -> RsnaTree:
    """``data/rsna-pneumonia-detection-challenge/``: ``stage_2_train_images/<patientId>.dcm``,
    ``stage_2_train_labels.csv`` (one row per box; a negative has one row with blank box cells
    and Target 0), ``stage_2_detailed_class_info.csv`` (``patientId,class``, repeated as often as
    the labels table repeats the image), unlabelled ``stage_2_test_images/`` and the sample
    submission."""
    root = data / "rsna-pneumonia-detection-challenge"
    rng = np.random.default_rng(5)
    plan = [("Lung Opacity", 2), ("Lung Opacity", 1), ("Lung Opacity", 3), ("Lung Opacity", 1),
            ("No Lung Opacity / Not Normal", 1), ("No Lung Opacity / Not Normal", 1),
            ("No Lung Opacity / Not Normal", 1), ("No Lung Opacity / Not Normal", 1),
            ("Normal", 1), ("Normal", 1), ("Normal", 1), ("Normal", 1), ("Lung Opacity", 2), ("Normal", 1)]
    labels, classes, images = [], [], []
    for i, (klass, boxes) in enumerate(plan):
        patient_id = _uuid(rng)
        target = int(klass == "Lung Opacity")
        for _ in range(boxes):
            if target:
                x, y, w, h = (float(v) for v in rng.integers(100, 700, size=4))
                labels.append([patient_id, f"{x}", f"{y}", f"{w}", f"{h}", "1"])
            else:
                labels.append([patient_id, "", "", "", "", "0"])
            classes.append([patient_id, klass])
        _rsna_dicom(root / "stage_2_train_images" / f"{patient_id}.dcm", patient_id, "MF"[i % 2], 20 + 4 * i,
                    "PA" if i % 3 else "AP")
        images.append(RsnaImage(patient_id, klass, target, boxes))
    _write(root / "stage_2_train_labels.csv", _csv_text(["patientId", "x", "y", "width", "height", "Target"], labels))
    _write(root / "stage_2_detailed_class_info.csv", _csv_text(["patientId", "class"], classes))
    test_ids = tuple(_uuid(rng) for _ in range(3))
    for i, patient_id in enumerate(test_ids):
        _rsna_dicom(root / "stage_2_test_images" / f"{patient_id}.dcm", patient_id, "F", 50 + i, "PA")
    _write(root / "stage_2_sample_submission.csv",
           _csv_text(["patientId", "PredictionString"], [[p, "0.5 0 0 100 100"] for p in test_ids]))
    return RsnaTree(root, tuple(images), test_ids)


def _uuid(rng: np.random.Generator) -> str:
    digits = "".join(f"{int(v):x}" for v in rng.integers(0, 16, size=32))
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{digits[16:20]}-{digits[20:]}"


# -- the Medical Segmentation Decathlon, Task02_Heart ---------------------------------------------------------


@dataclass(frozen=True)
class DecathlonCase:
    case: str                     # la_007
    image: str                    # imagesTr/la_007.nii.gz (relative to the root)
    label: str | None             # labelsTr/la_007.nii.gz; None for a test case
    foreground: int               # label voxels equal to 1
    slices: int                   # axial slices


@dataclass(frozen=True)
class DecathlonTree:
    root: Path
    training: tuple[DecathlonCase, ...]
    test: tuple[DecathlonCase, ...]
    apple_double: tuple[str, ...]  # the ._* files the tarball carries, relative to the root


def write_decathlon(data: Path) -> DecathlonTree:
    """``data/Task02_Heart/`` as ``Task02_Heart.tar`` unpacks: ``dataset.json`` (its keys as
    published, ``relase`` spelling included; paths ``./imagesTr/la_007.nii.gz``), ``imagesTr/``,
    ``labelsTr/`` (0 background, 1 left atrium, on the image's grid), unlabelled ``imagesTs/``,
    and the macOS ``._la_007.nii.gz`` AppleDouble files the tarball carries beside the images
    (they end in ``.nii.gz`` but are no NIfTI)."""
    root = data / "Task02_Heart"
    affine = np.diag([-1.25, -1.25, 1.37, 1.0])
    training, test, apple = [], [], []
    # every published case is 320×320 in plane (1.25 mm), 90-130 slices of 1.37 mm: a few slices here
    for case, depth in (("la_003", 3), ("la_004", 4), ("la_005", 3), ("la_007", 2), ("la_009", 3), ("la_010", 4),
                        ("la_011", 2)):
        image = f"imagesTr/{case}.nii.gz"
        volume = _pixels((320, 320, depth), image).astype(np.int16) * 3 + 40
        write_nifti(_mkdirs(root / image), volume, affine)
        grid = np.indices(volume.shape)
        centre = np.array(volume.shape) / 2 - 0.5 + np.array([8 * (int(case[-1]) % 3 - 1), 0, 0])
        atrium = (((grid[0] - centre[0]) / 40) ** 2 + ((grid[1] - centre[1]) / 30) ** 2
                  + ((grid[2] - centre[2]) / 1.5) ** 2) <= 1
        write_nifti(_mkdirs(root / "labelsTr" / f"{case}.nii.gz"), atrium.astype(np.uint8), affine)
        training.append(DecathlonCase(case, image, f"labelsTr/{case}.nii.gz", int(atrium.sum()), depth))
    for case in ("la_001", "la_002", "la_006"):
        image = f"imagesTs/{case}.nii.gz"
        write_nifti(_mkdirs(root / image), _pixels((320, 320, 2), image).astype(np.int16), affine)
        test.append(DecathlonCase(case, image, None, 0, 2))
    for case in training[:3]:
        for folder in ("imagesTr", "labelsTr"):
            rel = f"{folder}/._{case.case}.nii.gz"
            # an AppleDouble header: magic 0x00051607, version 2, then macOS filler
            (root / rel).write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(4000))
            apple.append(rel)
    doc = {"name": "LeftAtrium", "description": "Left atrium segmentation", "reference": "King’s College London",
           "licence": "CC-BY-SA 4.0", "relase": "1.0 04/05/2018", "tensorImageSize": "3D",
           "modality": {"0": "MRI"}, "labels": {"0": "background", "1": "left atrium"},
           "numTraining": len(training), "numTest": len(test),
           "training": [{"image": f"./{c.image}", "label": f"./{c.label}"} for c in reversed(training)],
           "test": [f"./{c.image}" for c in test]}
    (root / "dataset.json").write_text(json.dumps(doc, indent=4, ensure_ascii=False))
    return DecathlonTree(root, tuple(training), tuple(test), tuple(apple))


def _mkdirs(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
