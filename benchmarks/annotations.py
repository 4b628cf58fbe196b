"""Benchmark DICOM SEG and RTSTRUCT masks (issue #37): the annotation path against packing without masks.

    .venv/bin/python benchmarks/annotations.py                          # 20 series × 150 slices, writes the section
    .venv/bin/python benchmarks/annotations.py --no-write --series 4 --slices 60 --cases plain2,masks2

**Data** (written once under ``--data``, default ``/work/bench-data/annotations``, kept while
``stamp.json`` matches): ``--series`` CT series of ``--slices`` axial slices, 512×512 int16 (CT
Image Storage, 1 mm pixels, 2 mm between slices, rescale -1024/1), seeded per series
(``--seed``), each with

- a **BINARY SEG** of 5 segments written with highdicom 0.28 (``Liver``, ``Spleen``,
  ``Tumour`` inside the liver, ``Kidney L``, ``Kidney R``: ellipsoids and a sphere, voxel in
  where its centre is inside). highdicom is given only the slices some segment touches as
  source images, and omits empty frames itself: a valid SEG whose frames reference their own
  slices, as a viewer writes it, at a fraction of the time of handing it all 150 slices;
- an **RTSTRUCT of 10 ROIs** (``BODY`` on every slice, ``SpinalCord`` on every slice, lungs,
  heart, oesophagus, liver, kidneys, bladder: 96-point closed polygons; ``Lung_L`` has a vessel
  as a hole, drawn as a second contour, on its upper slices, and ``Liver`` a hole for the portal
  vein on its middle slices).

The CT pixels are rendered from the same shapes (air -1000, body 40, lungs -850, heart 50, liver
60, kidneys 30, bladder 10, cord 35, tumour 20 HU) plus σ 12 HU noise.

**Cases** (``--cases``), each a fresh ``packer.pipeline.build.build`` in a child process with a
fresh output and build cache, ``transform.dicom: {windows: [lung, mediastinum], size: [256, 256],
sample: slice}``, WebDataset, ``phi: keep``, no HTML report, and ``split.near_duplicates`` off (every
series is the same phantom moved a little, so the near-copy search links most slices of all series
and verifying those links took minutes, the same in both cases and nothing to do with masks):

- ``plain2`` / ``plain1``: no ``mask:`` (the SEG and RTSTRUCT files are left out as
  ``not_image``), on the default LocalCluster of 2 workers / ``scheduler="sync"`` pinned to one core;
- ``masks2`` / ``masks1``: ``mask: {from: dicom, segments: {5}, rois: {10}}``, the same two ways.

Measured per case: wall, CPU of the process tree (``wait4``), masks/s (slices packed with a mask
per wall second), peak RSS of the whole tree (sum over processes of each one's ``VmHWM``, polled
every 0.1 s; and the largest single process), the CPU other processes used meanwhile. The target:
wall(masks) ≤ 1.25 × wall(plain) on the same scheduler.

**The annotation step alone**, in this process, on ``--ref-series`` series, median of
``--repeats``:

- packer: :func:`packer.read.dicom_masks.paint_series` (parse both objects, map, place, decode,
  paint under ``later_wins``), and its halves ``paint_seg`` and ``paint_rtstruct``;
- by hand, what a user would write: highdicom ``Segmentation.get_volume`` (``combine_segments``
  false: a D×H×W×5 bool volume of the slices the SEG covers) then a loop that paints each
  segment's voxels into a uint8 label map over the series; pydicom + one ``cv2.fillPoly`` per
  slice and ROI (all the ROI's contours at once: OpenCV's fill is even-odd, so a contour inside
  another is a hole) after mapping the points to pixels through IPP and Pixel Spacing.

Then a cProfile of ``paint_series`` on one series (top functions by their own time).

Prints the tables and one JSON line; writes the section of ``RESULTS.md`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SECTION = "## DICOM SEG and RTSTRUCT masks: the annotation path against packing without masks"
DEFAULT_DATA = Path("/work/bench-data/annotations")
PIXEL_MM = 1.0
SLICE_MM = 2.0
SIZE = 512
TARGET = 1.25
#: A pair of builds is not judged when other processes used more CPU than this (cores) during one of them.
BUSY_CORES = 0.25
CASES = ("plain2", "masks2", "plain1", "masks1")
MIB = 2**20
POINTS = 96

# ---------------------------------------------------------------- the shapes (mm, LPS; t: 0 feet .. 1 head)

#: RTSTRUCT ROIs: name → (t from, t to, cx, cy, ax, ay); ellipses in the axial plane.
ROIS: dict[str, tuple[float, float, float, float, float, float]] = {
    "BODY": (0.0, 1.0, 0.0, 0.0, 170.0, 120.0),
    "SpinalCord": (0.0, 1.0, 0.0, 95.0, 7.0, 6.0),
    "Lung_L": (0.58, 1.0, 72.0, -5.0, 48.0, 62.0),
    "Lung_R": (0.58, 1.0, -72.0, -5.0, 48.0, 62.0),
    "Heart": (0.6, 0.85, 12.0, -42.0, 42.0, 36.0),
    "Esophagus": (0.3, 1.0, 6.0, 62.0, 8.0, 7.0),
    "Liver": (0.36, 0.6, -60.0, 5.0, 72.0, 56.0),
    "Kidney_L": (0.22, 0.4, 62.0, 58.0, 24.0, 34.0),
    "Kidney_R": (0.22, 0.4, -62.0, 58.0, 24.0, 34.0),
    "Bladder": (0.0, 0.14, 0.0, -35.0, 42.0, 36.0),
}
#: Holes drawn as a second contour of the ROI: name → (t from, t to, cx, cy, ax, ay).
HOLES = {"Lung_L": (0.8, 1.0, 72.0, -5.0, 12.0, 10.0), "Liver": (0.44, 0.52, -50.0, 10.0, 9.0, 9.0)}
#: SEG segments: label → (t centre, t half-height, cx, cy, ax, ay); ellipsoids (a sphere: ax = ay).
SEGMENTS: dict[str, tuple[float, float, float, float, float, float]] = {
    "Liver": (0.48, 0.12, -60.0, 5.0, 70.0, 54.0),
    "Spleen": (0.5, 0.06, 78.0, 30.0, 30.0, 42.0),
    "Tumour": (0.5, 0.07, -70.0, 8.0, 20.0, 20.0),
    "Kidney L": (0.31, 0.08, 62.0, 58.0, 24.0, 34.0),
    "Kidney R": (0.31, 0.08, -62.0, 58.0, 24.0, 34.0),
}
SEG_CODES = {"Liver": ("10200004", "Liver"), "Spleen": ("78961009", "Spleen"), "Tumour": ("108369006", "Neoplasm"),
             "Kidney L": ("64033007", "Kidney"), "Kidney R": ("64033007", "Kidney")}
HU = {"BODY": 40.0, "Lung_L": -850.0, "Lung_R": -850.0, "Heart": 50.0, "Liver": 60.0, "Kidney_L": 30.0,
      "Kidney_R": 30.0, "Bladder": 10.0, "SpinalCord": 35.0, "Esophagus": 20.0}


@dataclass(frozen=True)
class Geometry:
    """One series: its patient, slice heights (mm), and a per-series shift and scale of the shapes."""

    index: int
    zs: tuple[float, ...]
    dx: float
    dy: float
    scale: float

    @property
    def patient(self) -> str:
        return f"BENCH{self.index:03d}"

    def t(self, k: int) -> float:
        return k / max(len(self.zs) - 1, 1)

    def ellipse(self, shape: tuple[float, ...], k: int) -> tuple[float, float, float, float]:
        """(cx, cy, ax, ay) of an ROI or hole on slice ``k``: breathes a little along the series."""
        _, _, cx, cy, ax, ay = shape
        wobble = 1.0 + 0.06 * np.sin(2 * np.pi * self.t(k) * 3 + self.index)
        return cx * self.scale + self.dx, cy * self.scale + self.dy, ax * self.scale * wobble, ay * self.scale


def geometry(seed: int, index: int, slices: int) -> Geometry:
    rng = np.random.default_rng([seed, index, 1])
    z0 = float(np.round(rng.uniform(-400, -300), 1))
    return Geometry(index, tuple(round(z0 + SLICE_MM * k, 3) for k in range(slices)), float(rng.uniform(-10, 10)),
                    float(rng.uniform(-10, 10)), float(rng.uniform(0.92, 1.05)))


def _centres() -> tuple[np.ndarray, np.ndarray]:
    """x (columns) and y (rows) of the pixel centres (mm): IPP (-256, -256), 1 mm pixels."""
    along = -SIZE / 2 * PIXEL_MM + np.arange(SIZE, dtype=np.float32) * PIXEL_MM
    return along[None, :], along[:, None]


def _inside(ellipse: tuple[float, float, float, float]) -> np.ndarray:
    x, y = _centres()
    cx, cy, ax, ay = ellipse
    return np.asarray(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2 <= 1.0)


def roi_shapes(geo: Geometry, k: int) -> dict[str, list[tuple[float, float, float, float]]]:
    """ROI name → its contours' ellipses on slice ``k`` (the first the outline, a second a hole)."""
    t = geo.t(k)
    out: dict[str, list[tuple[float, float, float, float]]] = {}
    for name, shape in ROIS.items():
        if shape[0] <= t <= shape[1]:
            out[name] = [geo.ellipse(shape, k)]
            hole = HOLES.get(name)
            if hole is not None and hole[0] <= t <= hole[1]:
                out[name].append(geo.ellipse(hole, k))
    return out


def segment_masks(geo: Geometry, k: int) -> dict[str, np.ndarray]:
    """Segment label → H×W bool on slice ``k`` (only segments that touch it)."""
    x, y = _centres()
    height = SLICE_MM * max(len(geo.zs) - 1, 1)
    z = SLICE_MM * k
    out = {}
    for label, (tc, th, cx, cy, ax, ay) in SEGMENTS.items():
        dz = (z - tc * height) / max(th * height, SLICE_MM)
        if abs(dz) > 1.0:
            continue
        cx, cy = cx * geo.scale + geo.dx, cy * geo.scale + geo.dy
        r = ((x - cx) / (ax * geo.scale)) ** 2 + ((y - cy) / (ay * geo.scale)) ** 2 + dz * dz
        mask = np.asarray(r <= 1.0)
        if mask.any():
            out[label] = mask
    return out


def render_hu(geo: Geometry, k: int, seed: int) -> np.ndarray:
    hu = np.full((SIZE, SIZE), -1000.0, dtype=np.float32)
    for name, ellipses in roi_shapes(geo, k).items():
        inside = _inside(ellipses[0])
        for hole in ellipses[1:]:
            inside &= ~_inside(hole)
        hu[inside] = HU[name]
    tumour = segment_masks(geo, k).get("Tumour")
    if tumour is not None:
        hu[tumour] = 20.0
    hu += np.random.default_rng([seed, geo.index, 2, k]).standard_normal(hu.shape, dtype=np.float32) * 12.0
    return np.maximum(hu, -1024.0, out=hu)


def _polygon(ellipse: tuple[float, float, float, float], z: float, clockwise: bool) -> list[float]:
    cx, cy, ax, ay = ellipse
    angles = np.linspace(0.0, 2 * np.pi, POINTS, endpoint=False)
    if clockwise:
        angles = angles[::-1]
    points = np.stack([cx + ax * np.cos(angles), cy + ay * np.sin(angles), np.full_like(angles, z)], axis=1)
    return [round(float(v), 2) for v in points.ravel()]


def write_series(root: Path, seed: int, index: int, slices: int) -> dict[str, float]:
    """Write one series, its SEG and its RTSTRUCT under ``root/BENCHnnn/``; seconds per part."""
    import highdicom as hd
    import pydicom

    from packer.demo import make_uid, make_uids, write_ct_slice
    from packer.demo_annotations import _Contour, _rtstruct, _Written

    geo = geometry(seed, index, slices)
    folder = root / geo.patient
    frame_uid = make_uid(seed, "bench-annotations-frame", index)
    when = time.perf_counter()
    paths = []
    for k, z in enumerate(geo.zs):
        path = folder / "CT" / f"IM{k + 1:04d}.dcm"
        write_ct_slice(path, patient_id=geo.patient, study_date="20240301", study_time="101500",
                       pixels_hu=render_hu(geo, k, seed), uids=make_uids(seed, f"bench-{index}", k, study=1, series=1),
                       instance_number=k + 1, slice_location_mm=z, FrameOfReferenceUID=frame_uid,
                       PositionReferenceIndicator="", SliceThickness=str(SLICE_MM), PixelSpacing=[PIXEL_MM, PIXEL_MM],
                       ImagePositionPatient=[-SIZE / 2 * PIXEL_MM, -SIZE / 2 * PIXEL_MM, z],
                       SeriesDescription="packer bench annotated CT", PatientBirthDate="")
        paths.append(path)
    times = {"ct_s": time.perf_counter() - when}
    when = time.perf_counter()
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in paths]
    # the SEG: only the slices some segment touches are its source images (empty frames are omitted anyway)
    labels = list(SEGMENTS)
    touched = [(k, segment_masks(geo, k)) for k in range(slices)]
    touched = [(k, m) for k, m in touched if m]
    pixels = np.zeros((len(touched), SIZE, SIZE, len(labels)), dtype=bool)
    for row, (_, masks) in enumerate(touched):
        for label, mask in masks.items():
            pixels[row, :, :, labels.index(label)] = mask
    anatomical = hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure")
    altered = hd.sr.CodedConcept("49755003", "SCT", "Morphologically Altered Structure")
    descriptions = [hd.seg.SegmentDescription(
        segment_number=n, segment_label=label, segmented_property_category=altered if label == "Tumour" else anatomical,
        segmented_property_type=hd.sr.CodedConcept(SEG_CODES[label][0], "SCT", SEG_CODES[label][1]),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL) for n, label in enumerate(labels, start=1)]
    seg_uids = make_uids(seed, f"bench-{index}", "seg", study=1, series=2)
    seg = hd.seg.Segmentation(
        source_images=[headers[k] for k, _ in touched], pixel_array=pixels,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=descriptions,
        series_instance_uid=seg_uids.series, series_number=2, sop_instance_uid=seg_uids.sop, instance_number=1,
        manufacturer="packer bench", manufacturer_model_name="bench", software_versions="packer bench",
        device_serial_number="0", series_description="packer bench SEG")
    fixed = make_uid(seed, "bench-annotations-dimension", index)
    for item in [*seg.get("DimensionOrganizationSequence", []), *seg.get("DimensionIndexSequence", [])]:
        item.DimensionOrganizationUID = fixed
    seg.InstanceCreationDate, seg.InstanceCreationTime = "20240302", "101500"
    seg.ContentDate, seg.ContentTime = "20240302", "101500"
    for equipment in seg.get("ContributingEquipmentSequence", []):
        if "ContributionDateTime" in equipment:
            equipment.ContributionDateTime = "20240302101500"
    (folder / "SEG").mkdir(parents=True, exist_ok=True)
    seg.save_as(folder / "SEG" / "seg.dcm", enforce_file_format=True)
    times["seg_s"] = time.perf_counter() - when
    times["seg_frames"] = int(seg.NumberOfFrames)
    when = time.perf_counter()
    rois: dict[str, list[Any]] = {name: [] for name in ROIS}
    for k, (z, header) in enumerate(zip(geo.zs, headers, strict=True)):
        for name, ellipses in roi_shapes(geo, k).items():
            for n, ellipse in enumerate(ellipses):
                rois[name].append(_Contour(_polygon(ellipse, z, clockwise=n > 0), header))
    kinds = {"BODY": "EXTERNAL"}
    written = _Written(SimpleNamespace(patient=geo.patient), tuple(headers), when=__import__("datetime").datetime(
        2024, 3, 1, 10, 15))  # type: ignore[arg-type]
    ds = _rtstruct(seed, written, [(name, kinds.get(name, "ORGAN"), rois[name]) for name in ROIS],
                   tag="bench-rtstruct")
    (folder / "RTSTRUCT").mkdir(parents=True, exist_ok=True)
    ds.save_as(folder / "RTSTRUCT" / "rtstruct.dcm", enforce_file_format=True)
    times["rt_s"] = time.perf_counter() - when
    times["rt_contours"] = sum(len(c) for c in rois.values())
    return times


def ensure_data(root: Path, series: int, slices: int, seed: int) -> dict[str, Any]:
    """The raw tree under ``root/raw`` (rewritten when ``stamp.json`` does not match)."""
    stamp = root / "stamp.json"
    want = {"series": series, "slices": slices, "seed": seed, "size": SIZE, "v": 1}
    if stamp.is_file() and json.loads(stamp.read_text()).get("want") == want:
        return dict(json.loads(stamp.read_text()), written_s=0.0)
    shutil.rmtree(root / "raw", ignore_errors=True)
    (root / "raw").mkdir(parents=True)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        parts = list(pool.map(write_series, [root / "raw"] * series, [seed] * series, range(series),
                              [slices] * series))
    total = {key: sum(p[key] for p in parts) for key in parts[0]}
    raw_bytes = sum(p.stat().st_size for p in (root / "raw").rglob("*.dcm"))
    record = {"want": want, "parts": total, "raw_bytes": raw_bytes, "write_s": time.perf_counter() - start}
    stamp.write_text(json.dumps(record))
    return dict(record, written_s=record["write_s"])


# ---------------------------------------------------------------- the job and one build

def job_text(raw: Path, out: Path, masks: bool) -> str:
    rois = ", ".join(f"{name.lower()}: {n}" for n, name in enumerate(ROIS, start=1)).replace("spinalcord", "cord")
    segments = ", ".join(f"seg_{label.lower().replace(' ', '_')}: {{id: {n}, aliases: ['{label}']}}"
                         for n, label in enumerate(SEGMENTS, start=len(ROIS) + 1))
    mask = ("    mask: {from: dicom, rois: {" + rois.replace("cord: 2", "cord: {id: 2, aliases: [SpinalCord]}")
            + "}, segments: {" + segments + "}, overlap: later_wins, empty: keep}\n") if masks else ""
    return (f"name: annotations-bench-{'masks' if masks else 'plain'}\n"
            f"sources:\n  - kind: dicom\n    root: {raw}\n    label: none\n{mask}"
            "split: {by: entity, ratios: {train: 0.8, valid: 0.1, test: 0.1}, seed: 1,"
            " near_duplicates: {enabled: false}}\n"
            "transform:\n  dicom: {windows: [lung, mediastinum], size: [256, 256], sample: slice}\n"
            f"pack: {{format: webdataset}}\nphi: {{mode: keep}}\noutput: {out}\n")


def child_build(job: Path, scheduler: str | None, workers: int | None, out: Path, cache: Path) -> dict[str, Any]:
    """One ``build`` in this (child) process; what it packed."""
    from packer.config import load_job
    from packer.pipeline.build import BuildOptions, build

    start = time.perf_counter()
    result = build(load_job(job), BuildOptions(scheduler=scheduler, workers=workers, quiet=True, html_report=False,
                                               fresh=True, out=out, cache_dir=cache))
    manifest = result.manifest
    return {"seconds": time.perf_counter() - start, "issues": len(result.issues),
            "reasons": sorted({i.reason for i in result.issues}),
            "samples": sum(int(v.get("samples", 0)) for v in (manifest.get("splits") or {}).values()
                           if isinstance(v, dict)),
            "dataset_hash": manifest.get("dataset_hash"), "version": str(result.version_dir)}


def run_case(data: Path, case: str) -> dict[str, Any]:
    from nifti_vs_monai import last_json, run_measured  # sibling script: the measured-subprocess harness

    masks = case.startswith("masks")
    sync = case.endswith("1")
    out, cache = data / "out" / case, data / "cache" / case
    for folder in (out, cache):
        shutil.rmtree(folder, ignore_errors=True)
    job = data / f"job-{case}.yaml"
    job.write_text(job_text(data / "raw", out, masks))
    command = [sys.executable, __file__, "--child", str(job), "--out", str(out), "--cache", str(cache),
               "--scheduler", "sync" if sync else "", "--workers", "0" if sync else "2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    core = sorted(os.sched_getaffinity(0))[-1]
    run = run_measured([command], [{core} if sync else None], env=env)
    child = last_json(run.pop("outputs")[0])
    run.update(child=child, cores=1 if sync else 2, masks=masks,
               tree_peak_sum=sum(p["peak"] for p in run["processes"] if "resource_tracker" not in p["cmd"]),
               largest_peak=max((p["peak"] for p in run["processes"]), default=0))
    for folder in (out, cache):
        shutil.rmtree(folder, ignore_errors=True)
    return run


# ---------------------------------------------------------------- the annotation step alone

def _places(paths: list[Path]) -> list[Any]:
    import pydicom

    from packer.read.annotations import SlicePlace

    places = []
    for path in paths:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        places.append(SlicePlace(sop_uid=str(ds.SOPInstanceUID), frame=0,
                                 position=tuple(float(v) for v in ds.ImagePositionPatient),
                                 orientation=tuple(float(v) for v in ds.ImageOrientationPatient),
                                 spacing=(float(ds.PixelSpacing[0]), float(ds.PixelSpacing[1])),
                                 rows=int(ds.Rows), columns=int(ds.Columns)))
    return sorted(places, key=lambda p: p.position[2])


def packer_group(data: Path, patient: str) -> tuple[Any, Any]:
    """(AnnotatedSeries-like group, source config) for ``paint_series`` on one series."""
    from packer.config import load_job
    from packer.read.dicom_masks import AnnotatedSeries
    from packer.records import SampleRef

    job_path = data / "job-ref.yaml"
    job_path.write_text(job_text(data / "raw", data / "out" / "ref", True))
    source = load_job(job_path).sources[0]
    folder = data / "raw" / patient
    cts = sorted((folder / "CT").glob("*.dcm"))

    def ref(path: Path) -> SampleRef:
        rel = str(path.relative_to(data / "raw"))
        return SampleRef(sample_id=rel, source=source.name, kind="dicom", path=str(path), relpath=rel)

    series = SimpleNamespace(refs=tuple(ref(p) for p in cts))
    group = AnnotatedSeries(series=series, places=tuple(_places(cts)),  # type: ignore[arg-type]
                            annotations=((ref(folder / "RTSTRUCT" / "rtstruct.dcm"), "RTSTRUCT"),
                                         (ref(folder / "SEG" / "seg.dcm"), "SEG")))
    return group, source


def packer_paint(group: Any, source: Any) -> np.ndarray:
    from packer.read.dicom_masks import paint_series

    painted = paint_series(group, source.mask, keep_names=False)
    assert not isinstance(painted, list), painted
    return painted.labels


def packer_half(group: Any, source: Any, modality: str) -> None:
    import pydicom

    from packer.read.annotations import Painter

    cfg = source.mask
    shape = (len(group.places), group.places[0].rows, group.places[0].columns)
    painter = Painter(shape=shape, structures=cfg.structures(), overlap=cfg.overlap, dtype=cfg.dtype)
    ref = next(r for r, m in group.annotations if m == modality)
    dataset = pydicom.dcmread(ref.path)
    if modality == "SEG":
        from packer.read.seg import paint_seg

        paint_seg(ref.path, group.places, cfg.segments, painter, dataset=dataset)
    else:
        from packer.read.rtstruct import paint_rtstruct

        paint_rtstruct(ref.path, group.places, cfg.rois, painter, dataset=dataset)


def by_hand(group: Any) -> np.ndarray:
    """What a user writes: highdicom ``get_volume`` for the SEG, ``cv2.fillPoly`` for the RTSTRUCT."""
    import cv2
    import highdicom as hd
    import pydicom

    places = group.places
    depth = {round(p.position[2], 2): k for k, p in enumerate(places)}
    labels = np.zeros((len(places), places[0].rows, places[0].columns), dtype=np.uint8)
    origin = np.asarray(places[0].position[:2])
    spacing = np.asarray([places[0].spacing[1], places[0].spacing[0]])  # x (columns), y (rows)
    rt = pydicom.dcmread(next(r.path for r, m in group.annotations if m == "RTSTRUCT"))
    names = {int(item.ROINumber): str(item.ROIName) for item in rt.StructureSetROISequence}
    ids = {name: n for n, name in enumerate(ROIS, start=1)}
    for roi in rt.ROIContourSequence:
        class_id = ids[names[int(roi.ReferencedROINumber)]]
        per_slice: dict[int, list[np.ndarray]] = {}
        for contour in roi.ContourSequence:
            points = np.asarray(contour.ContourData, dtype=np.float64).reshape(-1, 3)
            pixels = np.rint((points[:, :2] - origin) / spacing).astype(np.int32)
            per_slice.setdefault(depth[round(float(points[0, 2]), 2)], []).append(pixels)
        for k, polygons in per_slice.items():
            mask = np.zeros(labels.shape[1:], dtype=np.uint8)
            cv2.fillPoly(mask, polygons, 1)  # even-odd across the polygons of one call: holes
            labels[k][mask.view(bool)] = class_id
    seg = hd.seg.segread(next(r.path for r, m in group.annotations if m == "SEG"))
    volume = seg.get_volume(combine_segments=False, skip_overlap_checks=True)
    array = volume.array  # D×H×W×S, its own slices in ascending position
    z0 = float(volume.affine[2, 3])
    for d in range(array.shape[0]):
        k = depth[round(z0 + d * SLICE_MM, 2)]
        for s in range(array.shape[3]):
            labels[k][array[d, :, :, s]] = len(ROIS) + 1 + s
    return labels


def time_median(fn: Any, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def reference(data: Path, count: int, repeats: int) -> dict[str, Any]:
    """The annotation step alone on ``count`` series, in this process pinned to one core."""
    import cv2

    cv2.setNumThreads(1)
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sorted(cores)[-1]})
    patients = sorted(p.name for p in (data / "raw").iterdir() if p.is_dir())[:count]
    groups = [packer_group(data, p) for p in patients]
    slices = sum(len(g.places) for g, _ in groups)
    for g, s in groups[:1]:  # warm the imports and the page cache
        packer_paint(g, s)
        by_hand(g)
    cases = {
        "packer paint_series": lambda: [packer_paint(g, s) for g, s in groups],
        "packer paint_seg": lambda: [packer_half(g, s, "SEG") for g, s in groups],
        "packer paint_rtstruct": lambda: [packer_half(g, s, "RTSTRUCT") for g, s in groups],
        "by hand (highdicom get_volume + cv2.fillPoly)": lambda: [by_hand(g) for g, _ in groups],
    }
    out: dict[str, Any] = {"series": count, "slices": slices}
    for name, fn in cases.items():
        median, times = time_median(fn, repeats)
        out[name] = {"median_s": median, "times": times, "masks_per_s": slices / median}
    ours, theirs = packer_paint(*groups[0]), by_hand(groups[0][0])
    os.sched_setaffinity(0, cores)
    out["agreement"] = {"differing_voxels": int((ours != theirs).sum()), "labelled_voxels": int((ours > 0).sum())}
    return out


def profile(data: Path, top: int = 16) -> str:
    group, source = packer_group(data, sorted(p.name for p in (data / "raw").iterdir() if p.is_dir())[0])
    packer_paint(group, source)
    profiler = cProfile.Profile()
    profiler.enable()
    packer_paint(group, source)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(top)
    return stream.getvalue()


# ---------------------------------------------------------------- report

def mib(n: float) -> str:
    return f"{n / MIB:,.0f}"


def report(data_info: dict[str, Any], runs: dict[str, dict[str, Any]], ref: dict[str, Any] | None,
           prof: str | None, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    import highdicom
    from decode import describe_machine, machine_line  # sibling script

    machine = describe_machine()
    load = os.getloadavg()
    lines = [
        f"`benchmarks/annotations.py --series {args.series} --slices {args.slices}`, {machine['date']}. "
        f"Machine: {machine_line(machine)}, highdicom {highdicom.__version__}; load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
        "",
        f"Data: {args.series} CT series × {args.slices} slices 512×512 int16 "
        f"({data_info['raw_bytes'] / 1e9:.2f} GB with the annotations), each with a BINARY SEG of 5 segments "
        f"({data_info['parts']['seg_frames']} frames in all) and an RTSTRUCT of 10 ROIs "
        f"({data_info['parts']['rt_contours']} contours in all). Job: windows [lung, mediastinum], 256×256, "
        "`sample: slice`, WebDataset, fresh output and cache per case, one run each.",
        "",
        "| case | wall s | CPU s | slices | slices (masks)/s | peak RSS, tree sum MiB | largest process MiB "
        "| other CPU (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"plain2": "no masks, 2 workers", "masks2": "SEG + RTSTRUCT masks, 2 workers",
             "plain1": "no masks, sync (1 core)", "masks1": "SEG + RTSTRUCT masks, sync (1 core)"}
    for case, run in runs.items():
        samples = run["child"]["samples"]
        lines.append(f"| {names[case]} | {run['wall_s']:.1f} | {run['cpu_s']:.1f} | {samples} | "
                     f"{samples / run['wall_s']:.1f} | {mib(run['tree_peak_sum'])} | {mib(run['largest_peak'])} | "
                     f"{run['other_cpu_cores']:.2f} |")
    verdicts = {}
    for n, label in (("2", "2 workers"), ("1", "sync")):
        if f"plain{n}" in runs and f"masks{n}" in runs:
            plain, masks = runs[f"plain{n}"], runs[f"masks{n}"]
            ratio, cpu_ratio = masks["wall_s"] / plain["wall_s"], masks["cpu_s"] / plain["cpu_s"]
            busy = max(plain["other_cpu_cores"], masks["other_cpu_cores"])
            met: bool | None = ratio <= TARGET if busy <= BUSY_CORES else None
            verdicts[label] = {"wall_ratio": ratio, "cpu_ratio": cpu_ratio, "met": met, "other_cpu_cores": busy}
            verdict = ("not judged: other processes used up to " f"{busy:.2f} cores during one of the two builds"
                       if met is None else "met" if met else "not met")
            lines.append("")
            lines.append(f"Overhead, {label}: masks ÷ plain = **{ratio:.2f}×** wall, {cpu_ratio:.2f}× CPU; target "
                         f"≤ {TARGET:.2f}×: **{verdict}**.")
    if ref is not None:
        lines += ["", f"The annotation step alone, one process on one core, {ref['series']} series "
                      f"({ref['slices']} slices), median of {args.repeats}:", "",
                  "| | s | masks/s |", "|---|---:|---:|"]
        for name, value in ref.items():
            if isinstance(value, dict) and "median_s" in value:
                lines.append(f"| {name} | {value['median_s']:.2f} | {value['masks_per_s']:.0f} |")
        agree = ref["agreement"]
        lines += ["", f"packer's label map of the first series against the hand loop's: {agree['differing_voxels']:,} "
                      f"of {agree['labelled_voxels']:,} labelled voxels differ (cv2.fillPoly fills every pixel an "
                      "edge touches; packer fills pixel centres inside)."]
    if prof:
        lines += ["", "cProfile of `paint_series` on one series (by own time):", "", "```",
                  *[line for line in prof.strip().splitlines() if line.strip()][:40], "```"]
    record = {"data": data_info, "runs": runs, "reference": ref, "verdicts": verdicts, "machine": machine,
              "load": load}
    return "\n".join(lines) + "\n", record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=20)
    parser.add_argument("--slices", type=int, default=150)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"input folder (default {DEFAULT_DATA})")
    parser.add_argument("--cases", default="plain2,masks2,plain1,masks1")
    parser.add_argument("--ref-series", type=int, default=4, help="series for the annotation step alone (0: skip)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scheduler", default="", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child_build(args.child, args.scheduler or None, args.workers or None, args.out, args.cache)))
        return
    from decode import publish_run  # sibling script: one RESULTS.md writer

    started = time.perf_counter()
    data_info = ensure_data(args.data, args.series, args.slices, args.seed)
    print(f"data: {json.dumps(data_info)}", flush=True)
    runs = {}
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"--cases: {case!r} is not one of {CASES}")
        runs[case] = run_case(args.data, case)
        print(case, json.dumps({k: v for k, v in runs[case].items() if k != "processes"}), flush=True)
    ref = reference(args.data, min(args.ref_series, args.series), args.repeats) if args.ref_series else None
    prof = None if args.no_profile else profile(args.data)
    body, record = report(data_info, runs, ref, prof, args)
    publish_run(SECTION, body, started, record=record, write=not args.no_write)


if __name__ == "__main__":
    main()
