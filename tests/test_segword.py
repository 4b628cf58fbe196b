"""A name ending in a segmentation word, beside an image, is a label map or an image: the file decides.

A source without a table leaves label maps out by name (``label_map``), so that no label map
becomes a model's input. Its strong rules name them for sure: a prefix naming an image
(BraTS's ``<case>_seg``), a case folder, an empty prefix (KiTS's ``segmentation.nii.gz``), BIDS,
masks folders. The weak rule does not: a name ending in ``seg``, ``segm``, ``segmentation`` or
``labelmap`` whose prefix names no image, beside an image of its folder, is KiTS21's
``aggregated_AND_seg.nii.gz`` beside ``imaging.nii.gz`` and QUBIQ's rater label maps
``task01_seg01.nii.gz`` beside ``image.nii.gz`` (label maps), but also dcm2niix's
``SAX_cine_seg.nii.gz`` (``-f %p``) and ``LGE_PSIR_seg_12.nii.gz`` (``%p_%s``), MR images of a
segmented k-space protocol. A name cannot tell them apart (the number, tried before, is on
both sides); the NIfTI file can: such a file is listed, and its probe leaves it out as
``label_map`` (stage ``read``) where it holds one volume of integer voxels, unscaled, of few
distinct values, and packs it as an image otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import yaml

from packer.config import load_job
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import discover
from packer.pipeline.probe import probe_ref
from packer.records import Excluded, Issue, SampleRef

AFFINE = np.diag([1.5, 1.5, 8.0, 1.0])


def _save(path: Path, data: np.ndarray, *, slope: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(data, AFFINE)
    if slope is not None:
        img.header.set_slope_inter(slope, 0.0)
    nib.save(img, str(path))


def _mr(seed: int, shape: tuple[int, ...] = (10, 10, 4), dtype: Any = np.int16) -> np.ndarray:
    """An MR volume: hundreds of distinct values."""
    return np.random.default_rng(seed).integers(0, 2000, shape).astype(dtype)


def _labels(dtype: Any = np.uint8, classes: int = 3) -> np.ndarray:
    data = np.zeros((10, 10, 4), dtype)
    for c in range(1, classes):
        data[c % 10, 2:5, c % 4] = c
    return data


def _job(tmp_path: Path, root: Path, **nifti: Any) -> Path:
    doc = {"name": "t", "sources": [{"kind": "nifti", "root": str(root), "entity": {"component": 0},
                                     "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.0, "test": 0.5}, "seed": 2},
           "transform": {"nifti": {"windows": [{"center": 400, "width": 800}], "sample": "slice", "axis": "axial",
                                   "size": [10, 10], **nifti}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "build")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _probed(job_path: Path) -> dict[str, SampleRef | Issue | Excluded]:
    """Each discovered file's probe outcome, by file name; discovery must leave nothing out."""
    job = load_job(job_path)
    found = discover(job)
    assert not found.excluded, found.excluded
    return {Path(ref.relpath).name: probe_ref(ref, job) for ref in found.refs}


def test_qubiq_rater_label_maps_numbered_after_seg_are_left_out_when_their_header_is_read(tmp_path: Path) -> None:
    """QUBIQ's caseNN/task01_segNN.nii.gz (uint8, 0 and 1) beside image.nii.gz: label maps,
    though 'seg' is numbered (since 84623f6 they were packed as MR images)."""
    root = tmp_path / "Training"
    for case in range(2):
        _save(root / f"case{case:02d}" / "image.nii.gz", _mr(case))
        for rater in (1, 2, 3):
            _save(root / f"case{case:02d}" / f"task01_seg{rater:02d}.nii.gz", _labels(classes=2))
    job = load_job(_job(tmp_path, root))
    found = discover(job)
    assert {ref.relpath: ref.maybe_label_map for ref in found.refs} == {
        **{f"case{c:02d}/image.nii.gz": None for c in range(2)},
        **{f"case{c:02d}/task01_seg{r:02d}.nii.gz": f"name ending '_seg{r:02d}'" for c in range(2) for r in (1, 2, 3)}}
    out = {ref.relpath: probe_ref(ref, job) for ref in found.refs}
    assert all(isinstance(out[f"case{c:02d}/image.nii.gz"], SampleRef) for c in range(2))
    seg = out["case00/task01_seg01.nii.gz"]
    assert isinstance(seg, Excluded) and (seg.stage, seg.why) == ("read", "label_map")
    assert seg.detail.startswith("name ending '_seg01' beside an image of its folder, and the file holds one volume "
                                 "of uint8 voxels, unscaled, of 2 distinct values (a label map has at most 128, "
                                 "and at most one per 8 voxels)")
    assert "name it in a table's mask column" in seg.detail
    assert sum(isinstance(o, Excluded) for o in out.values()) == 6


def test_dcm2niix_segmented_k_space_mr_images_are_packed_numbered_or_not(tmp_path: Path) -> None:
    """dcm2niix names a segmented k-space protocol's series SAX_cine_seg (-f %p) or
    LGE_PSIR_seg_12 (%p_%s): int16 MR volumes of hundreds of values, images; the 4-D cine's
    volumes are its channels here (channels_from: last_axis), as the user chose."""
    root = tmp_path / "study"
    for p in range(2):
        _save(root / f"P{p:02d}" / "SAX_cine_seg.nii.gz", _mr(p, (10, 10, 4, 3)))
        _save(root / f"P{p:02d}" / "LGE_PSIR_seg_12.nii.gz", _mr(10 + p))
        _save(root / f"P{p:02d}" / "T1_MOLLI.nii.gz", _mr(20 + p))
    out = _probed(_job(tmp_path, root, channels_from="last_axis", windows=[{"center": 400, "width": 800}],
                       output="float16"))
    assert all(isinstance(o, SampleRef) for o in out.values()), out


def test_a_4d_cine_named_seg_is_an_image_series_whatever_its_values(tmp_path: Path) -> None:
    """More than one volume is a series (cine, DWI, fMRI), never a label map: even a cine of
    uint8 voxels of few values is not left out by its name."""
    root = tmp_path / "study"
    _save(root / "P00" / "T1_MOLLI.nii.gz", _mr(0))
    _save(root / "P00" / "SAX_cine_seg.nii.gz", np.stack([_labels()] * 3, axis=-1))
    out = _probed(_job(tmp_path, root, channels_from="last_axis", output="float16"))
    assert isinstance(out["SAX_cine_seg.nii.gz"], SampleRef), out


def test_without_channels_from_a_4d_cine_named_seg_is_its_dimensions_bad_sample_not_a_label_map(
        tmp_path: Path) -> None:
    """A 4-D file the job cannot sample says so (unsupported_dimensions, with the fix), as any
    other 4-D file does: it is not hidden among the label maps left out on purpose."""
    root = tmp_path / "study"
    _save(root / "P00" / "T1_MOLLI.nii.gz", _mr(0))
    _save(root / "P00" / "SAX_cine_seg.nii.gz", _mr(1, (10, 10, 4, 5)))
    out = _probed(_job(tmp_path, root))
    cine = out["SAX_cine_seg.nii.gz"]
    assert isinstance(cine, Issue) and cine.reason == "unsupported_dimensions", cine


def test_the_header_and_values_decide_a_weakly_named_file(tmp_path: Path) -> None:
    """Whole-number voxels, unscaled, of few values are a label map, whatever the type (fslmaths and
    MONAI write float32 label maps); fractional float voxels, scaled voxels or many values are an image."""
    root = tmp_path / "case"
    _save(root / "imaging.nii.gz", _mr(0))
    _save(root / "a_int16_seg.nii.gz", _labels(np.int16, classes=5))
    _save(root / "b_int32_labelmap.nii.gz", _labels(np.int32, classes=8))
    _save(root / "c_float_seg.nii.gz", _labels(np.float32))
    _save(root / "f_fraction_seg.nii.gz", _labels(np.float32) * 0.5)
    _save(root / "g_parcels_seg.nii.gz", np.arange(16 * 16 * 16, dtype=np.int16).reshape(16, 16, 16) % 100)
    # a magnitude LGE peaking at a few hundred: MR units are arbitrary, hundreds of values are an image's
    lge = np.random.default_rng(2).normal(300, 120, (32, 32, 8)).clip(0, 700).astype(np.int16)
    _save(root / "h_LGE_PSIR_seg_12.nii.gz", lge)
    _save(root / "d_scaled_seg.nii.gz", _labels(np.int16), slope=0.5)
    _save(root / "e_many_values_seg.nii.gz", _mr(1, dtype=np.uint16))
    out = _probed(_job(tmp_path, root))
    left_out = sorted(name for name, o in out.items() if isinstance(o, Excluded))
    assert left_out == ["a_int16_seg.nii.gz", "b_int32_labelmap.nii.gz", "c_float_seg.nii.gz",
                        "g_parcels_seg.nii.gz"], out
    assert all(isinstance(o, SampleRef) for name, o in out.items() if name not in left_out), out


def test_strong_name_rules_still_leave_label_maps_out_at_discovery_and_alone_they_are_packed(tmp_path: Path) -> None:
    """A prefix naming an image (BraTS) or an empty prefix still decides by name, before any
    read; label maps with no image in their folder are what the user chose to pack."""
    root = tmp_path / "raw"
    _save(root / "BraTS_001" / "BraTS_001_t1.nii.gz", _mr(0))
    _save(root / "BraTS_001" / "BraTS_001_seg.nii.gz", _labels())
    _save(root / "BraTS_001" / "segmentation.nii.gz", _labels())
    _save(root / "maps" / "aggregated_AND_seg.nii.gz", _labels())
    job = load_job(_job(tmp_path, root))
    found = discover(job)
    assert sorted((Path(e.path).name, e.stage, e.why) for e in found.excluded) == [
        ("BraTS_001_seg.nii.gz", "discover", "label_map"), ("segmentation.nii.gz", "discover", "label_map")]
    assert {ref.relpath: ref.maybe_label_map for ref in found.refs} == {
        "BraTS_001/BraTS_001_t1.nii.gz": None, "maps/aggregated_AND_seg.nii.gz": None}
    assert all(isinstance(probe_ref(ref, job), SampleRef) for ref in found.refs)


def test_kits21_aggregated_label_maps_are_built_out_and_listed_as_label_maps(tmp_path: Path) -> None:
    """The whole build: KiTS21's aggregated_{AND,MAJ,OR}_seg beside imaging.nii.gz are not packed
    and excluded.jsonl says why; the cases' CT images are packed."""
    root = tmp_path / "kits21" / "data"
    for case in range(2):
        _save(root / f"case_{case:05d}" / "imaging.nii.gz", _mr(case) - 1000)
        for agg in ("AND", "MAJ", "OR"):
            _save(root / f"case_{case:05d}" / f"aggregated_{agg}_seg.nii.gz", _labels())
    version = build(load_job(_job(tmp_path, root)), BuildOptions(scheduler="sync", quiet=True)).version_dir
    records = read_excluded(version / EXCLUDED_FILE)
    assert sorted((Path(r["path"]).name, r["stage"], r["why"]) for r in records) == sorted(
        [(f"aggregated_{agg}_seg.nii.gz", "read", "label_map") for agg in ("AND", "MAJ", "OR")] * 2)
    manifest = (version / "manifest.json").read_text()
    assert '"label_map": 6' in manifest
