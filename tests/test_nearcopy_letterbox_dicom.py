"""Near copies of DICOM frames and NIfTI slices under ``resize: fit``: the letterbox is no evidence.

Every DICOM frame (a file's, each of a ``frames: split`` file's, a ``frames: stack``'s, a neighbour
stack's) and every NIfTI slice records the box it lies in (``Sample.content``), as an image does
(tests/test_nearcopy_letterbox.py), so its near-copy signature is drawn from that box, not from
fit's padding: different slices of one unusual aspect (4:1, 6:1) under different patients are not
linked, and the same slice under another patient still is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import yaml
from dicom_files import config, ct_dataset, make_ref, save, window
from pydicom.uid import generate_uid

from packer.config import load_job, parse_window
from packer.pipeline import nearcopy
from packer.pipeline.cluster import open_executor
from packer.pipeline.stages import run_stages
from packer.read.dicom import read_dicom
from packer.read.nifti_samples import Case, Slicing, slice_samples
from packer.records import Sample, SampleRef
from packer.transform.dicom import output_content


def noise(seed: int, rows: int, cols: int) -> np.ndarray:
    """Seeded uniform stored values 0..1999 (-1024..975 HU): no two seeds share any structure."""
    return np.random.default_rng(seed).integers(0, 2000, (rows, cols), dtype=np.int16)


def tissue(seed: int, rows: int, cols: int) -> np.ndarray:
    """Seeded CT-like stored values: ellipses of soft-tissue to bone values on water, with grain."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float32)
    img = np.full((rows, cols), 1000.0, np.float32)
    for _ in range(30):
        cy, cx = rng.uniform(0, rows), rng.uniform(0, cols)
        ry, rx = rng.uniform(4, rows / 3), rng.uniform(4, rows / 3)
        img[((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1] = rng.uniform(200, 1800)
    img += rng.normal(0, 30, img.shape)
    return np.clip(img, 0, 1999).astype(np.int16)


def read(path: Path, **kwargs: Any) -> list[Sample]:
    samples = read_dicom(make_ref(path), config(window(0, 2000), **kwargs))
    assert isinstance(samples, list), samples
    return samples


def verify(a: Sample, b: Sample, *, boxed: bool = True) -> nearcopy.Evidence:
    """The verification of two samples' signatures: drawn from their content boxes, or (``boxed``
    False) from their whole outputs, as before."""
    sig_a = nearcopy.packed_signature(a.image, a.content if boxed else None)
    sig_b = nearcopy.packed_signature(b.image, b.content if boxed else None)
    return nearcopy.verify(sig_a["thumb"], sig_b["thumb"])


# ---------------------------------------------------------------- the content box


def test_the_box_is_where_fit_puts_the_frame_after_any_resample() -> None:
    box = output_content(120, 480, pixel_spacing=None, spacing=None, size=(64, 64), policy="fit")
    assert box == (24, 0, 16, 64)
    # resampled to 1 mm rows first, the grid is 8:1: the box is what finish_image scales
    assert output_content(120, 480, pixel_spacing=(0.5, 0.5), spacing=(1.0, 0.5), size=(64, 64),
                          policy="fit") == (28, 0, 8, 64)
    assert output_content(480, 120, pixel_spacing=None, spacing=None, size=(64, 64), policy="fit") == (0, 24, 64, 16)
    for policy in ("stretch", "crop"):
        assert output_content(120, 480, pixel_spacing=None, spacing=None, size=(64, 64), policy=policy) is None
    assert output_content(120, 480, pixel_spacing=None, spacing=None, size=None, policy="fit") is None


def test_a_dicom_frame_under_fit_records_its_box_and_its_padding_lies_outside_it(tmp_path: Path) -> None:
    path = save(ct_dataset(tissue(1, 120, 480)), tmp_path / "wide.dcm")
    sample, = read(path, size=(64, 64), resize="fit")
    assert sample.content == (24, 0, 16, 64)
    rows = np.flatnonzero(sample.image[0].any(axis=1))
    assert (rows.min(), rows.max()) == (24, 39)
    for policy in ("stretch", "crop"):
        assert read(path, size=(64, 64), resize=policy)[0].content is None
    assert read(path)[0].content is None  # no size: the frame's own grid


@pytest.mark.parametrize("frames", ["split", "stack"])
def test_each_frame_of_a_multi_frame_file_and_a_stack_of_them_record_the_box(tmp_path: Path, frames: str) -> None:
    pixels = np.stack([tissue(s, 480, 120) for s in range(3)])
    path = save(ct_dataset(pixels), tmp_path / "cine.dcm")
    samples = read(path, size=(64, 64), resize="fit", frames=frames)
    assert len(samples) == (3 if frames == "split" else 1)
    assert [s.content for s in samples] == [(0, 24, 64, 16)] * len(samples)


def test_two_different_wide_ct_slices_are_copies_only_through_their_padding(tmp_path: Path) -> None:
    a, = read(save(ct_dataset(noise(10, 48, 288)), tmp_path / "a.dcm"), size=(128, 128), resize="fit")
    b, = read(save(ct_dataset(noise(11, 48, 288)), tmp_path / "b.dcm"), size=(128, 128), resize="fit")
    assert verify(a, b, boxed=False).score >= 0.984  # counted, the shared black border verified them
    boxed = verify(a, b)
    assert boxed.score < 0.5 and boxed.intensity < 0.2


def test_the_same_wide_slice_stored_again_with_noise_still_verifies_from_its_box(tmp_path: Path) -> None:
    source = tissue(4, 120, 480)
    again = source + np.random.default_rng(9).integers(-2, 3, source.shape).astype(np.int16)
    a, = read(save(ct_dataset(source), tmp_path / "a.dcm"), size=(64, 64), resize="fit")
    b, = read(save(ct_dataset(again), tmp_path / "b.dcm"), size=(64, 64), resize="fit")
    assert verify(a, b).score >= 0.984
    stretched, = read(tmp_path / "a.dcm", size=(16, 64), resize="stretch")
    assert verify(a, stretched).score >= 0.99  # fit's signature is a stretch output's: the padding adds nothing


@pytest.mark.parametrize("sample", ["slice", "neighbors"])
def test_a_nifti_slice_and_its_neighbour_stack_record_the_box(sample: str) -> None:
    values = np.random.default_rng(3).uniform(0, 100, (1, 3, 20, 80)).astype(np.float32)
    case = Case(values=values, affine=np.eye(4), names=("ct",), cal=(None,))
    ref = SampleRef(sample_id="c", source="s", kind="nifti", path="/raw/c.nii.gz", relpath="c.nii.gz")
    plan = Slicing(windows=(parse_window({"percentiles": [0, 100]}, "w"),), sample=sample, axis="axial",
                   neighbors=1, edge="replicate", spacing=None, size=(64, 64), resize="fit", output="uint8",
                   volume_spacing=None, volume_size=None)
    samples = slice_samples(ref, case, plan, {})
    assert [s.content for s in samples] == [(24, 0, 16, 64)] * 3
    stretch = slice_samples(ref, case, Slicing(**{**plan.__dict__, "resize": "stretch"}), {})
    assert all(s.content is None for s in stretch)


# ---------------------------------------------------------------- builds


def dicom_slice(path: Path, pixels: np.ndarray, patient: str, *, series: tuple[str, str, str] | None = None,
                position: int = 0) -> None:
    """A CT slice of ``patient``; ``series`` (its Study, Series and Frame of Reference UIDs): a
    slice of that series at ``position`` mm along the normal."""
    ds = ct_dataset(pixels, center=None, width=None)
    ds.PatientID, ds.PatientName = patient, f"P^{patient}"
    if series is not None:
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = series
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [0.0, 0.0, float(position)]
        ds.InstanceNumber = position + 1
    save(ds, path)


def wide(p: int, k: int, *, z: int = 0) -> np.ndarray:
    """Patient ``p``'s image ``k``: 6:1 noise (odd k) or 4:1 tissue, turned tall where p + k is odd."""
    seed = 1000 * p + 10 * k + z
    pixels = noise(seed, 80, 480) if k % 2 else tissue(seed, 120, 480)
    return np.ascontiguousarray(pixels.T) if (p + k) % 2 else pixels


def write_dicom_tree(root: Path, slices: int) -> tuple[str, str]:
    """Six patients of four images (series of ``slices`` slices each), and under a seventh the
    series of P0's image 2 stored again with noise of ±2. Returns (copy, source) of its centre slice."""
    def write(folder: str, patient: str, images: list[np.ndarray]) -> None:
        uids = (generate_uid(), generate_uid(), generate_uid())
        for z, pixels in enumerate(images):
            dicom_slice(root / folder / f"z{z}.dcm", pixels, patient, series=uids if slices > 1 else None, position=z)

    for p in range(6):
        for k in range(4):
            write(f"P{p}/s{k}", f"P{p}", [wide(p, k, z=z) for z in range(slices)])
    rng = np.random.default_rng(9)
    write("COPY/s0", "COPY", [wide(0, 2, z=z) + rng.integers(-2, 3, wide(0, 2).shape).astype(np.int16)
                              for z in range(slices)])
    return f"COPY/s0/z{slices // 2}.dcm", f"P0/s2/z{slices // 2}.dcm"


def write_nifti_tree(root: Path) -> tuple[str, str]:
    """As :func:`write_dicom_tree`, one case per image of three slices each."""
    rows = []
    affine = np.diag([0.5, 0.5, 2.0, 1.0])
    for p in range(6):
        for k in range(4):
            data = np.stack([wide(p, k, z=z).T for z in range(3)], axis=-1)  # nibabel's X × Y × Z
            (root / f"P{p}").mkdir(parents=True, exist_ok=True)
            nib.save(nib.Nifti1Image(data, affine), root / f"P{p}/c{k}.nii")
            rows.append(f"P{p}/c{k}.nii,P{p}")
    source = np.asarray(nib.load(root / "P0/c2.nii").dataobj)
    again = source + np.random.default_rng(9).integers(-2, 3, source.shape).astype(np.int16)
    (root / "COPY").mkdir()
    nib.save(nib.Nifti1Image(again, affine), root / "COPY/c.nii")
    rows.append("COPY/c.nii,COPY")
    (root / "cases.csv").write_text("path,entity\n" + "\n".join(rows) + "\n")
    return "COPY/c.nii", "P0/c2.nii"


def near_links(folder: Path, source: dict[str, Any], transform: dict[str, Any]) -> list[tuple[str, str]]:
    """The distinct near-copy links of a build through its audit, as sorted pairs of relative paths."""
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "lb", "sources": [source],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3,
                  "near_duplicates": {"enabled": True}},
        "transform": transform, "pack": {"format": "webdataset"}, "output": str(folder / "out"),
        "phi": {"mode": "keep"}}))
    with open_executor("sync") as executor:
        prepared = run_stages(load_job(job), executor, through="audit", cache_dir=folder / "cache",
                              quiet=True).prepared
    relpath = prepared.samples.column("relpath")
    return sorted({(min(str(relpath[i]), str(relpath[j])), max(str(relpath[i]), str(relpath[j])))
                   for i, j in zip(prepared.links.i.tolist(), prepared.links.j.tolist(), strict=True)})


@pytest.mark.parametrize("resize", ["stretch", "fit"])
def test_distinct_wide_ct_slices_of_several_patients_are_linked_only_to_their_true_copy(tmp_path: Path,
                                                                                       resize: str) -> None:
    copy, source = write_dicom_tree(tmp_path / "raw", slices=1)
    found = near_links(tmp_path / "build", {"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"},
                       {"dicom": {"windows": [{"center": 0, "width": 2000}], "size": [64, 64], "resize": resize}})
    assert found == [(copy, source)]


@pytest.mark.parametrize("resize", ["stretch", "fit"])
def test_distinct_neighbour_stacks_are_linked_only_to_their_true_copy(tmp_path: Path, resize: str) -> None:
    write_dicom_tree(tmp_path / "raw", slices=3)
    found = near_links(tmp_path / "build", {"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"},
                       {"dicom": {"windows": [{"center": 0, "width": 2000}], "size": [64, 64], "resize": resize,
                                  "sample": {"neighbors": 1}}})
    assert found and all(a.startswith("COPY/s0/") and b.startswith("P0/s2/") for a, b in found), found


@pytest.mark.parametrize("resize", ["stretch", "fit"])
def test_distinct_wide_nifti_slices_of_several_patients_are_linked_only_to_their_true_copy(tmp_path: Path,
                                                                                          resize: str) -> None:
    copy, source = write_nifti_tree(tmp_path / "raw")
    found = near_links(tmp_path / "build", {"kind": "nifti", "root": str(tmp_path / "raw"),
                                            "table": str(tmp_path / "raw" / "cases.csv"), "label": "none"},
                       {"nifti": {"windows": [{"center": -24, "width": 2000}], "size": [64, 64], "resize": resize}})
    assert found == [(copy, source)]
