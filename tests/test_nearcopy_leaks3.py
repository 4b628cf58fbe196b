"""Near copies planted as stop 76's leak walk planted them: a colour photo saved again with its
channels swapped links to its original, distinct photos do not; a series copy that lost an end slice
links per slice and per neighbour stack (README names the volume-mode limit)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.pipeline import nearcopy
from tests.test_nearcopy import photo  # a seeded photo-like H×W×3 uint8 BGR image


def packed_rgb(bgr: np.ndarray, size: int = 64) -> np.ndarray:
    """What packer's image transform (``color: rgb``) packs: RGB, area-resized, C×H×W."""
    rgb = cv2.cvtColor(cv2.resize(bgr, (size, size), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(rgb.transpose(2, 0, 1))


def score(a: np.ndarray, b: np.ndarray) -> float:
    return nearcopy.verify(nearcopy.packed_signature(a)["thumb"], nearcopy.packed_signature(b)["thumb"]).score


def test_a_copy_with_red_and_blue_swapped_verifies_and_other_photos_do_not() -> None:
    """A photo saved again with its channels in the other order (cv2.imwrite given an RGB array, PIL
    saving what cv2.imread returned) is the same photo: a colour thumbnail is the channel mean, which
    no channel order changes. A luminance thumbnail (tried in stop 76) lost these copies (scores
    0.89-0.97 < min_score), so README lists a greyscale copy of a colour photo as a limit instead."""
    for seed in (0, 3, 4, 7):
        source = packed_rgb(photo(seed))
        assert score(source, source[::-1].copy()) >= nearcopy.MIN_SCORE, seed
        for other in (11, 12, 13):
            assert score(source, packed_rgb(photo(other))[::-1].copy()) < nearcopy.MIN_SCORE, (seed, other)


# ---------------------------------------------------------------- a series copy missing an end slice

def _ct_tree(raw: Path, patients: int = 10, depth: int = 8, side: int = 48) -> None:
    """``patients`` CT series of ``depth`` slices (P000...), and P001 re-exported under Y01 without its
    first slice and P002 under Y02 without its last (new UIDs, identical pixels)."""
    from scipy import ndimage

    from packer.demo import DicomUids, make_uid, write_ct_slice

    zz, yy, xx = np.mgrid[0:depth, 0:side, 0:side]
    body = ((yy - side / 2) / (side * 0.42)) ** 2 + ((xx - side / 2) / (side * 0.45)) ** 2 <= 1

    def volume(seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        texture = ndimage.gaussian_filter(rng.normal(0, 1, (depth, side, side)), (1.0, 3.0, 3.0))
        texture /= texture.std()
        cy, cx = rng.uniform(15, 33, 2)
        r = rng.uniform(5, 9)
        return -1000 + body * (1040 + 120 * texture) + 200 * ((((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r) & body)

    def series(pid: str, pixels: np.ndarray, slices: range) -> None:
        study, ser = make_uid(9, "study", pid), make_uid(9, "series", pid)
        for k in slices:
            write_ct_slice(raw / pid / f"{k:03d}.dcm", patient_id=pid, study_date="20230105", pixels_hu=pixels[k],
                           uids=DicomUids(study=study, series=ser, sop=make_uid(9, "sop", pid, f"{k:03d}")),
                           instance_number=k + 1, slice_location_mm=2.5 * k,
                           FrameOfReferenceUID=make_uid(9, "for", pid))

    for i in range(patients):
        series(f"P{i:03d}", volume(i), range(depth))
    series("Y01", volume(1), range(1, depth))
    series("Y02", volume(2), range(0, depth - 1))


@pytest.mark.parametrize("sample", [None, {"neighbors": 1}], ids=["slices", "neighbors"])
def test_a_series_copy_missing_its_first_or_last_slice_links_per_slice_and_per_neighbour_stack(
        tmp_path: Path, sample: dict[str, int] | None) -> None:
    """README's limit: in ``sample: volume`` a copy that lost an end slice may be missed (its
    middle slice is another); slice samples and neighbour stacks find it by the slices they share."""
    _ct_tree(tmp_path / "raw")
    dicom: dict[str, object] = {"windows": ["mediastinum"], "size": [48, 48]}
    if sample is not None:
        dicom["sample"] = sample
    job = {"name": "ds", "phi": {"mode": "keep"},
           "sources": [{"kind": "dicom", "name": "ct", "root": str(tmp_path / "raw"), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "transform": {"dicom": dicom}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "build")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(main, ["build", str(tmp_path / "job.yaml"), "--scheduler", "sync"])
    assert result.exit_code == 0, result.output
    (leakage,) = (tmp_path / "build" / "ds").glob("*/leakage.json")
    findings = json.loads(leakage.read_text())["rules"]["duplicates_span_entities"]["findings"]
    assert {tuple(f["entities"]) for f in findings} == {("P001", "Y01"), ("P002", "Y02")}
