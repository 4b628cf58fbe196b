"""Public datasets as they ship, walked through discovery and the build: CBIS-DDSM's path cells
that end in a line break, KiTS21's aggregated label maps beside each case's image, and a table
whose every labelled file is bad beside as many files it leaves out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import nibabel as nib
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.badsamples import read_bad_samples
from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import MaskPartners, discover, mask_named
from packer.pipeline.probe import probe_ref
from packer.records import Excluded, SampleRef

# -- CBIS-DDSM: a quoted path cell with a line break before its closing quote ---------------------


def _png(path: Path, seed: int, mask: bool = False) -> None:
    """A 16x16 image (a mask: a square of 255 on 0), in the format of ``path``'s extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mask:
        image = np.zeros((16, 16), np.uint8)
        image[4:8, 4:8] = 255
    else:
        image = np.random.default_rng(seed).integers(0, 255, (16, 16), dtype=np.uint8)
    cv2.imwrite(str(path), image)


def _image_job(tmp_path: Path, source: dict[str, Any]) -> Path:
    doc = {"name": "t", "sources": [{"kind": "image", "root": "data", **source}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": "build"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cbis_table(tmp_path: Path, path_cell: str) -> Path:
    """A CBIS-DDSM-like table of 4 rows (path,label,mask,patient): the mask cells of rows 1 and 3
    end in a quoted line break, as CBIS-DDSM's do; row 2's path cell is ``path_cell``. Lines: 1
    the header, 2 row 0, 3-4 row 1, 5 (and on) row 2."""
    data = tmp_path / "data"
    rows = ["path,label,mask,patient"]
    for i in range(4):
        _png(data / f"img/{i}.png", i)
        _png(data / f"roi/{i}.png", i, mask=True)
        mask = f'"roi/{i}.png\n"' if i % 2 else f"roi/{i}.png"
        path = path_cell if i == 2 else f"img/{i}.png"
        rows.append(f"{path},{'ab'[i % 2]},{mask},P{i}")
    (data / "t.csv").write_text("\n".join(rows) + "\n")
    return _image_job(tmp_path, {"table": {"file": "data/t.csv"}, "entity": "patient",
                                 "mask": {"column": "mask", "classes": [0, 255]}})


@pytest.mark.parametrize("cell", ['"img/2.png\n"', '"\nimg/2.png"', '" img/2.png\r\n"'])
def test_a_path_cell_whose_line_break_pads_the_path_is_read_as_a_mask_cell_is(tmp_path: Path, cell: str) -> None:
    """CBIS-DDSM quotes some path cells with a line break before the closing quote. A mask
    cell so written was read (its spaces and line breaks stripped); the same cell in the path
    column stopped the build, saying its quote "does not close on its line" and naming the
    swallowed lines as "lines 7-6". A line break around the path is padding, in every column
    that names a file."""
    job = _cbis_table(tmp_path, cell)
    found = discover(load_job(job))
    refs = {ref.relpath: ref for ref in found.refs}
    assert sorted(refs) == [f"img/{i}.png" for i in range(4)], [i.message for i in found.issues]
    assert refs["img/2.png"].label == "a" and not found.issues
    # the row is numbered by the line it opens on (5), as an editor shows it
    (tmp_path / "data" / "img" / "2.png").unlink()
    (issue,) = [i for i in discover(load_job(job)).issues if i.reason == "missing_file"]
    assert "t.csv row 5 lists 'img/2.png'" in issue.message, issue.message


@pytest.mark.parametrize(("cell", "closes", "taken"), [
    ('"img/2\n.png"', 6, ""),
    ('"img/2.png\nimg/9.png\nimg/8.png"', 7, " and takes in the line between (line 6)"),
    ('"img/2.png\nimg/9.png\nimg/8.png\nimg/7.png"', 8, " and takes in the lines between (lines 6-7)"),
])
def test_a_path_cell_with_a_line_break_inside_the_path_is_refused_naming_where_its_quote_opens_and_closes(
        tmp_path: Path, cell: str, closes: int, taken: str) -> None:
    """A line break inside a path is no file name packer takes (or a stray quote that closed
    further down). The table is refused naming the line the quote opens on (5, not where the
    row ends) and the one it closes on, with no backwards range and no rows swallowed where
    the quote closes on the next line."""
    with pytest.raises(ConfigError) as raised:
        discover(load_job(_cbis_table(tmp_path, cell)))
    message = str(raised.value)
    assert (f"t.csv: the 'path' cell of the row on line 5 holds a line break inside its file path: its quote opens "
            f"on line 5 and closes on line {closes}{taken}; a table's file path takes no line break: rename a file "
            "whose name holds one, or, where the quote was left open by mistake, close it on line 5") in message, \
        message
    assert "img/9" not in message  # the lines' text is a row of the table, and may hold a patient's id


# -- KiTS21: aggregated label maps beside each case's imaging.nii.gz ----------------------------

#: KiTS21's affine: 0.8 mm in-plane, 3 mm slices, axes in the order its files keep them
_KITS_AFFINE = np.array([[0, 0, -0.8, 0], [0, -0.8, 0, 0], [-3.0, 0, 0, 0], [0, 0, 0, 1.0]])


def _volume(path: Path, seed: int, labels: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if labels:
        data = np.zeros((4, 10, 10), np.uint8)
        data[1:3, 2:5, 2:5] = 1
        data[2, 3, 3] = 2
    else:
        data = np.random.default_rng(seed).integers(-1000, 1000, (4, 10, 10)).astype(np.int16)
    nib.save(nib.Nifti1Image(data, _KITS_AFFINE), path)


def _nifti_job(tmp_path: Path, root: Path) -> Path:
    doc = {"name": "t", "sources": [{"kind": "nifti", "root": str(root), "entity": {"component": 0},
                                     "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 2},
           "transform": {"nifti": {"windows": [{"center": 40, "width": 400}], "sample": "slice", "axis": "axial",
                                   "size": [10, 10]}},
           "pack": {"format": "webdataset"}, "output": "build"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_kits21_aggregated_label_maps_beside_the_case_image_are_left_out(tmp_path: Path) -> None:
    """KiTS21 ships case_XXXXX/{imaging, aggregated_AND_seg, aggregated_MAJ_seg, aggregated_OR_seg}
    .nii.gz: no image is named 'aggregated_AND' and the case's image is not named after its folder,
    so the three label maps of every case were packed as CT images (a model fed its answers). A
    name ending in a segmentation word (seg, segm, segmentation, labelmap) beside an image that is
    no label map is a label map whatever its prefix, where its header says so: discovery lists it
    as a candidate (its ref's maybe_label_map) and its probe leaves it out (stage read)."""
    root = tmp_path / "kits21" / "data"
    for case in range(3):
        folder = root / f"case_{case:05d}"
        _volume(folder / "imaging.nii.gz", case)
        for kind in ("AND", "MAJ", "OR"):
            _volume(folder / f"aggregated_{kind}_seg.nii.gz", case, labels=True)
        _volume(folder / "segmentations" / "kidney_instance-1_annotation-1.nii.gz", case, labels=True)
    job = load_job(_nifti_job(tmp_path, root))
    found = discover(job)
    probed = [probe_ref(ref, job) for ref in found.refs]
    assert sorted(ref.relpath for ref in probed if isinstance(ref, SampleRef)) == [
        f"case_{case:05d}/imaging.nii.gz" for case in range(3)]
    out = [*found.excluded, *(e for e in probed if isinstance(e, Excluded))]
    whys = sorted((Path(e.path).name, e.stage, e.why, e.detail.split(" beside")[0].split(":")[0]) for e in out)
    assert whys == sorted([(f"aggregated_{kind}_seg.nii.gz", "read", "label_map", "name ending '_seg'")
                           for kind in ("AND", "MAJ", "OR")] * 3
                          + [("kidney_instance-1_annotation-1.nii.gz", "discover", "label_map",
                              "folder 'segmentations'")] * 3)


@pytest.mark.parametrize(("files", "kept"), [
    # a segmentation word inside a name, not ending it, says nothing: images of a segment, a corrected T1
    (["scans/segment_01.nii.gz", "scans/segment_02.nii.gz", "scans/t1_seg_corrected.nii.gz"], None),
    # mask, label and gt are words of photos too: a face-mask set's with_mask_2.jpg, a parcel's
    # shipping_label.jpg beside other photos keep the rule that their prefix must name an image
    (["faces/0001.jpg", "faces/with_mask_2.jpg"], None),
    # dcm2niix's %p_%s names: a segmented k-space cine or LGE's protocol then its series number
    (["P01/SAX_cine_seg_5.nii.gz", "P01/LGE_PSIR_seg_12.nii.gz", "P01/T1_MOLLI_8.nii.gz"], None),
    (["photos/IMG_0001.jpg", "photos/shipping_label.jpg", "photos/road_gt.jpg"], None),
    # a folder of label maps alone: no image beside them, so they are what the user chose to pack
    (["maps/aggregated_AND_seg.nii.gz", "maps/aggregated_OR_seg.nii.gz"], None),
    # beside an image that is no label map, a name ending in a segmentation word is a label map
    (["case_7/imaging.nii.gz", "case_7/aggregated_MAJ_seg.nii.gz", "case_7/liver_Segm.nii.gz",
      "case_7/rater2_segmentation_1.nii.gz", "case_7/consensus-labelmap.nii.gz"], ["case_7/imaging.nii.gz"]),
])
def test_a_segmentation_word_ending_a_name_beside_an_image_marks_a_label_map_and_nothing_else_does(
        files: list[str], kept: list[str] | None) -> None:
    partners = MaskPartners.of(files)
    assert [rel for rel in files if mask_named(rel, partners) is None] == (files if kept is None else kept)


# -- every labelled file bad beside files left out: the bad files' reasons come first -------------


def _cbis_mass_job(tmp_path: Path, cases: int, crops: int) -> Path:
    """A CBIS-DDSM-like root: ``cases`` full images, each in the table with a ROI mask saved as
    JPEG (lossy: mask_unreadable), and ``crops`` cropped images the table does not name
    (``files: table`` leaves them out as not_in_table)."""
    data = tmp_path / "data"
    rows = ["patient_id,pathology,image file path,ROI mask file path"]
    for i in range(cases):
        _png(data / f"full/P_{i:05d}_LEFT_CC.png", i)
        _png(data / f"roi/P_{i:05d}_LEFT_CC_1.jpg", i, mask=True)  # written as JPEG, by its extension
        rows.append(f"P_{i:05d},{'MALIGNANT' if i % 2 else 'BENIGN'},full/P_{i:05d}_LEFT_CC.png,"
                    f"roi/P_{i:05d}_LEFT_CC_1.jpg")
    for i in range(crops):
        _png(data / f"crop/P_{i:05d}_LEFT_CC_1.png", 100 + i)
    (data / "mass.csv").write_text("\n".join(rows) + "\n")
    return _image_job(tmp_path, {"table": {"file": "data/mass.csv", "path": "image file path", "files": "table"},
                                 "entity": "patient_id", "label": {"column": "pathology"},
                                 "mask": {"column": "ROI mask file path", "classes": [0, 255]}})


def test_every_labelled_file_bad_beside_as_many_left_out_is_a_bad_fraction_with_its_bad_sample_list(
        tmp_path: Path) -> None:
    """Every labelled image of a CBIS-DDSM-like table was bad (its mask a JPEG) beside as many
    crops the table leaves out: the build stopped with a config error (exit 2) that blamed the
    left-out crops and wrote no bad-sample list, though README keeps that error for bad files
    fewer than those left out (an export's broken file or two). It is a bad fraction (exit 3)
    with bad_samples.jsonl, in packer build and packer validate alike."""
    job = _cbis_mass_job(tmp_path, cases=4, crops=4)
    env = {"PACKER_WORK_DIR": str(tmp_path / "work")}
    validated = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "--json",
                                          str(tmp_path / "v.json")], env=env)
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report"], env=env)
    assert validated.exit_code == 3 and built.exit_code == 3, (validated.output, built.output)
    assert "4 of 4 input files are bad (and 4 left out on purpose, which do not count)" in built.stderr, built.stderr
    assert "bad samples: 4 (100.0%, over limit 5.0%): mask_unreadable 4" in validated.output, validated.output
    assert "JPEG is lossy" in validated.output and "left out on purpose: 4 (not_in_table 4)" in validated.output
    assert "no sample to pack" not in validated.output + built.output
    (listed,) = (tmp_path / "build").rglob("bad_samples.jsonl")
    assert {record["reason"] for record in read_bad_samples(listed)} == {"mask_unreadable"}
    assert json.loads((tmp_path / "v.json").read_text())["bad_samples"]["by_reason"] == {"mask_unreadable": 4}


def test_bad_files_fewer_than_those_left_out_are_a_config_error_that_says_why_they_are_bad(tmp_path: Path) -> None:
    """Where the bad files are fewer than those left out, packing nothing is the config error,
    but it named the first file left out only, and no bad-sample list is written: the user never
    learnt that the masks were JPEG. It counts the bad files' reasons, commonest first, and quotes
    the first bad file's message, in packer build and packer validate alike."""
    job = _cbis_mass_job(tmp_path, cases=2, crops=4)
    env = {"PACKER_WORK_DIR": str(tmp_path / "work")}
    for command in (["validate", str(job), "--scheduler", "sync"],
                    ["build", str(job), "--scheduler", "sync", "--no-report"]):
        run = CliRunner().invoke(main, command, env=env)
        assert run.exit_code == 2, run.output
        message = run.stderr
        assert ("no sample to pack: 4 of the job's 6 files are left out on purpose (not_in_table 4) and the other 2 "
                "are bad (mask_unreadable 2)") in message, message
        first_bad = tmp_path / "data" / "full" / "P_00000_LEFT_CC.png"
        assert f"The first bad file, {first_bad}: mask_unreadable: " in message, message
        assert "JPEG" in message, message
    assert not list((tmp_path / "build").rglob("bad_samples.jsonl"))
