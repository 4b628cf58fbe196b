"""What a NIfTI source makes of files whose names say they are no input image of its own.

Foreign volumes compressed whole. A ``kind: nifti`` source leaves an MGH, MINC, NRRD, MetaImage
or Analyze/NIfTI-1 pair file out as ``unsupported_format`` (README, "NIfTI volumes"). The same
formats as their tools ship them gzipped -- BrainWeb's and ICBM's ``.mnc.gz``, FSL's
NIFTI_PAIR_GZ and ANALYZE_GZ ``.hdr.gz`` + ``.img.gz`` -- were looked up by their last suffix
(``.gz``) alone, matched nothing, and vanished: neither listed, nor excluded, nor bad. Each now
gets the record its uncompressed name gets, saying to decompress it first, then convert it.

BIDS label maps. In a BIDS tree the part of a name after its last ``_`` is the file's type (its
suffix) and the parts before it are entities (``sub-01_ses-1_desc-brain``): a brain mask
``sub-01_ses-1_desc-brain_mask.nii.gz`` and the derivatives' ``*_dseg.nii.gz`` and
``*_probseg.nii.gz`` are label maps whose rest names no image (the image is ``sub-01_ses-1_T1w``),
so a source without a table packed them as input images. A BIDS name whose suffix is ``mask``,
``dseg`` or ``probseg`` is now left out as ``label_map`` beside an image of its subject, as the
other label-map names are beside theirs.

Label maps by declaration. A NIfTI header whose ``intent_code`` is 1002 (NIFTI_INTENT_LABEL) or
1003 (NIFTI_INTENT_NEURONAME) says its voxels are labels, whatever the file is called: without a
table it is left out as ``label_map`` when its header is read; with one, the table decides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import yaml

from packer.config import load_job
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import MaskPartners, discover, mask_named
from packer.read.nifti_kind import UNSUPPORTED_VOLUME_FORMATS

AFFINE = np.diag([1.0, 1.0, 2.0, 1.0])


def _data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 500, (6, 7, 5)).astype(np.int16)


def _volume(path: Path, seed: int) -> Path:
    """A real NIfTI file (nibabel writes it), 6×7×5 int16 voxels of 1×1×2 mm, different per seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(_data(seed), AFFINE), str(path))
    return path


def _job(tmp_path: Path, root: Path, **source: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "foreign", "sources": [{"kind": "nifti", "root": str(root), "label": "none", **source}],
        "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
        "transform": {"nifti": {"windows": [{"center": 0, "width": 400}], "sample": "volume", "output": "uint8"}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "validate": {"max_bad_fraction": 1.0}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _left_out(tmp_path: Path, root: Path, **source: Any) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """The listed files' relative paths, and each left-out file's (why, detail) by relative path."""
    found = discover(load_job(_job(tmp_path, root, **source)))
    assert found.issues == []
    return (sorted(ref.relpath for ref in found.refs),
            {Path(e.path).relative_to(root).as_posix(): (e.why, e.detail) for e in found.excluded})


def test_gzipped_minc_and_an_fsl_gzipped_pair_are_left_out_as_their_uncompressed_names_are(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _volume(root / "case0.nii.gz", 0)
    nib.save(nib.MGHImage(_data(1).astype(np.int32), AFFINE), str(root / "case1.mgz"))
    nib.save(nib.Nifti1Pair(_data(2), AFFINE), str(root / "case2.img.gz"))  # FSL's NIFTI_PAIR_GZ: both halves
    (root / "case3.mnc.gz").write_bytes(b"\x1f\x8b" + b"\0" * 30)  # the name decides, as for a .mnc
    listed, out = _left_out(tmp_path, root)
    assert listed == ["case0.nii.gz"]
    assert sorted(out) == ["case1.mgz", "case2.hdr.gz", "case2.img.gz", "case3.mnc.gz"]
    assert {why for why, _ in out.values()} == {"unsupported_format"}
    minc = out["case3.mnc.gz"][1]
    assert minc.startswith("a MINC volume (.mnc) compressed with gzip (.gz), which packer does not read (NIfTI "
                           "sources read .nii and .nii.gz files); decompress it where it lies (e.g. gunzip *.gz in its "
                           "folder), then convert it")
    assert minc.endswith("then convert it to NIfTI with mnc2nii (minc-tools), or e.g. with SimpleITK: import "
                         "SimpleITK as sitk; sitk.WriteImage(sitk.ReadImage(p), p_out) with p_out ending in .nii.gz "
                         "(or c3d p -o p_out.nii.gz, or plastimatch convert --input p --output-img p_out.nii.gz)")
    header, voxels = out["case2.hdr.gz"][1], out["case2.img.gz"][1]
    assert header.startswith("the header of an Analyze 7.5 or NIfTI-1 .hdr/.img pair compressed with gzip (.gz)")
    assert "then convert the pair to one .nii.gz file through this header" in header
    assert voxels.startswith("the voxels of an Analyze 7.5 or NIfTI-1 .hdr/.img pair (its header is the .hdr of "
                             "the same name) compressed with gzip (.gz)")
    assert "then convert the pair through its .hdr (see that file's record)" in voxels
    # both halves of the pair: decompressing one leaves the other unread
    both = "decompress it and the other half of its pair where they lie (e.g. gunzip *.gz in its folder), then"
    assert both in header and both in voxels and "other half" not in minc


def test_each_foreign_format_under_each_compressor_is_left_out_with_its_own_conversion(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _volume(root / "a.nii.gz", 0)
    named = {"b.nrrd.bz2": (".nrrd", "bzip2", "bunzip2"), "c.mha.xz": (".mha", "xz", "unxz"),
             "d.mgh.gz": (".mgh", "gzip", "gunzip"), "e.MNC.ZST": (".mnc", "Zstandard", "unzstd --rm"),
             "f.nhdr.gz": (".nhdr", "gzip", "gunzip"), "g.mhd.gz": (".mhd", "gzip", "gunzip"),
             "h.hdr.bz2": (".hdr", "bzip2", "bunzip2")}
    for name in [*named, "notes.txt.gz", "e.bz2", "table.csv.xz"]:  # no volume names: unlisted, as uncompressed
        (root / name).write_bytes(b"not read")
    listed, out = _left_out(tmp_path, root)
    assert listed == ["a.nii.gz"]
    assert sorted(out) == sorted(named)
    for name, (inner, compressor, command) in named.items():
        why, detail = out[name]
        what, _, fix = UNSUPPORTED_VOLUME_FORMATS[inner].partition(", which packer does not read")
        assert why == "unsupported_format"
        assert detail.startswith(f"{what} compressed with {compressor} (.{name.rsplit('.', 1)[1].lower()})"), name
        assert f"where it lies (e.g. {command} *{name[name.rfind('.'):].lower()} in its folder), then" in detail \
            or f"where they lie (e.g. {command} *{name[name.rfind('.'):].lower()} in its folder), then" in detail, name
        assert detail.endswith(fix.split("; ", 1)[1]), name  # the uncompressed name's conversion, whole


def test_detached_voxels_compressed_as_their_header_encodes_them_are_not_told_to_be_decompressed(
        tmp_path: Path) -> None:
    """An NRRD ``.nhdr`` with ``encoding: gzip`` keeps its voxels in a ``.raw.gz``: decompressing
    that file would break the header that names it; the header's conversion carries it."""
    root = tmp_path / "raw"
    _volume(root / "a.nii.gz", 0)
    (root / "b.nhdr").write_text("NRRD0004\nencoding: gzip\ndata file: b.raw.gz\n")
    (root / "b.raw.gz").write_bytes(b"\x1f\x8b" + b"\0" * 30)
    _, out = _left_out(tmp_path, root)
    assert sorted(out) == ["b.nhdr", "b.raw.gz"]
    detail = out["b.raw.gz"][1]
    assert detail.startswith("raw voxels compressed with gzip (.gz), as the detached data file of an NRRD .nhdr "
                             "header (encoding: gzip), which packer does not read")
    assert "decompress" not in detail
    assert "convert the header that names it to NIfTI (see that file's record; this file stays as it is" in detail


def test_a_table_naming_a_gzipped_pair_gets_what_a_table_naming_the_pair_gets(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _volume(root / "a.nii.gz", 0)
    nib.save(nib.Nifti1Pair(_data(1), AFFINE), str(root / "b.img"))
    nib.save(nib.Nifti1Pair(_data(2), AFFINE), str(root / "c.img.gz"))
    (root / "cases.csv").write_text("path,entity\na.nii.gz,p0\nb.hdr,p1\nc.hdr.gz,p2\n")
    listed, out = _left_out(tmp_path, root, table=str(root / "cases.csv"))
    assert listed == ["a.nii.gz"]  # neither row is a missing_file: its record says why it is not read
    assert sorted(out) == ["b.hdr", "b.img", "c.hdr.gz", "c.img.gz"]
    assert {why for why, _ in out.values()} == {"unsupported_format"}
    plain, squeezed = out["b.hdr"][1], out["c.hdr.gz"][1]
    assert squeezed.startswith(plain.split(", which packer does not read")[0] + " compressed with gzip (.gz)")


BIDS_IMAGES = ["sub-01/ses-1/anat/sub-01_ses-1_T1w.nii.gz", "sub-02/anat/sub-02_T2w.nii.gz",
               "derivatives/fmriprep/sub-01/anat/sub-01_desc-preproc_T1w.nii.gz"]
BIDS_LABELS = {"sub-01/ses-1/anat/sub-01_ses-1_desc-brain_mask.nii.gz": "BIDS suffix '_mask'",
               "derivatives/seg/sub-01/anat/sub-01_space-orig_dseg.nii.gz": "BIDS suffix '_dseg'",
               "derivatives/fmriprep/sub-01/anat/sub-01_label-GM_probseg.nii.gz": "BIDS suffix '_probseg'",
               "derivatives/fmriprep/sub-02/anat/sub-02_desc-aseg_dseg.nii": "BIDS suffix '_dseg'"}


def test_a_bids_tree_without_a_table_leaves_its_masks_and_segmentations_out_as_label_maps(tmp_path: Path) -> None:
    root = tmp_path / "bids"
    for i, rel in enumerate([*BIDS_IMAGES, *BIDS_LABELS]):
        _volume(root / rel, i)
    found = discover(load_job(_job(tmp_path, root)))
    assert sorted(ref.relpath for ref in found.refs) == sorted(BIDS_IMAGES)
    out = {Path(e.path).relative_to(root).as_posix(): (e.why, e.detail.split(":", 1)[0]) for e in found.excluded}
    assert out == {rel: ("label_map", why) for rel, why in BIDS_LABELS.items()}
    assert any("4 file(s) named as masks or label maps left out" in w and "BIDS suffix '_dseg' (2)" in w
               for w in found.warnings), found.warnings


def test_a_bids_label_map_is_one_by_its_suffix_among_bids_entities_only() -> None:
    partners = MaskPartners.of([*BIDS_IMAGES, *BIDS_LABELS, "sub-03_dseg.nii.gz", "brain_dseg.nii.gz",
                                "brain.nii.gz", "sub-01_T1w_probseg.nii.gz", "sub-01_desc-dseg_T1w.nii.gz"])
    for rel, why in BIDS_LABELS.items():
        assert mask_named(rel, partners) == why, rel
    assert mask_named("sub-01/anat/sub-01_T1w.nii.gz", partners) is None
    assert mask_named("sub-01_desc-dseg_T1w.nii.gz", partners) is None  # dseg is an entity's value, not the suffix
    assert mask_named("brain_dseg.nii.gz", partners) is None  # no BIDS entities: not widened beyond BIDS
    assert mask_named("sub-01_T1w_probseg.nii.gz", partners) is None  # T1w is no entity: no BIDS name
    # beside no image of its subject (sub-03 has none) a label map is what the source holds of it: packed
    assert mask_named("sub-03_dseg.nii.gz", partners) is None
    assert mask_named("sub-03_dseg.nii.gz") == "BIDS suffix '_dseg'"  # partners unchecked: the name alone


def test_a_root_of_bids_segmentations_alone_is_packed_and_a_table_decides_where_there_is_one(tmp_path: Path) -> None:
    """The derivatives' segmentation folder chosen as the root holds no image of their subjects:
    its label maps are what was asked for. With a table, the table decides."""
    seg = tmp_path / "seg"
    for i in range(2):
        _volume(seg / f"sub-0{i}" / "anat" / f"sub-0{i}_desc-aseg_dseg.nii.gz", i)
    assert len(discover(load_job(_job(tmp_path, seg))).refs) == 2
    root = tmp_path / "bids"
    for i, rel in enumerate([*BIDS_IMAGES, *BIDS_LABELS]):
        _volume(root / rel, i)
    (root / "cases.csv").write_text("path,entity\n" + "".join(f"{rel},p{i}\n" for i, rel in enumerate(BIDS_LABELS)))
    found = discover(load_job(_job(tmp_path, root, table={"file": str(root / "cases.csv"), "files": "table"})))
    assert sorted(ref.relpath for ref in found.refs) == sorted(BIDS_LABELS)
    assert not any(e.why == "label_map" for e in found.excluded)


def _labelled(path: Path, seed: int, intent: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(np.random.default_rng(seed).integers(0, 4, (6, 7, 5)).astype(np.int16), AFFINE)
    img.header["intent_code"] = intent
    nib.save(img, str(path))
    return path


def test_a_nifti_file_whose_header_declares_labels_is_left_out_as_a_label_map_without_a_table(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _volume(root / "brain.nii.gz", 0)
    _labelled(root / "aparc.nii.gz", 1, 1002)  # named as no label map: its header says it is one
    _labelled(root / "atlas.nii.gz", 2, 1003)
    _labelled(root / "stats.nii.gz", 3, 3)  # NIFTI_INTENT_TTEST: values, an image
    version = build(load_job(_job(tmp_path, root)), BuildOptions(scheduler="sync", quiet=True)).version_dir
    records = {Path(r["path"]).name: r for r in read_excluded(version / EXCLUDED_FILE)}
    assert sorted(records) == ["aparc.nii.gz", "atlas.nii.gz"]
    assert {r["why"] for r in records.values()} == {"label_map"}
    assert records["aparc.nii.gz"]["detail"].startswith(
        "its header's intent_code is 1002 (NIFTI_INTENT_LABEL): the file declares its voxels labels")
    assert records["atlas.nii.gz"]["detail"].startswith("its header's intent_code is 1003 (NIFTI_INTENT_NEURONAME)")
    assert "name it in a table's mask column" in records["aparc.nii.gz"]["detail"]
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["inputs"]["samples"] == 2 and manifest["inputs"]["excluded"] == {"label_map": 2}


def test_a_table_decides_for_a_file_whose_header_declares_labels(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _volume(root / "brain.nii.gz", 0)
    _labelled(root / "aparc.nii.gz", 1, 1002)
    (root / "cases.csv").write_text("path,entity\nbrain.nii.gz,p0\naparc.nii.gz,p1\n")
    version = build(load_job(_job(tmp_path, root, table=str(root / "cases.csv"))),
                    BuildOptions(scheduler="sync", quiet=True)).version_dir
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["inputs"]["samples"] == 2 and not manifest["inputs"].get("excluded")
