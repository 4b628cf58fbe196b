"""The report and ``packer inspect`` of datasets with segmentation masks, and of one without.

Expected numbers are counted here from the masks the loader reads back, never taken from the
views under test; the overlay is checked pixel by pixel against the alpha blend of the legend's
colour over the packed image.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner, Result

from packer.commands.inspect import inspect_command
from packer.demo import write_ct_slice
from packer.htmlreport import ReportLimits, render_html_report
from packer.htmlreport.thumbs import MASK_ALPHA, MASK_COLORS, PAD_COLOR
from packer.loader import ShardDataset
from tests.helpers import copy_without_index
from tests.test_htmlreport import ReportParser, decode_data_uri, parse
from tests.test_masks import _blocks, _photo_set, _photo_source, _png
from tests.test_targets import _build, _job

SPLIT = {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "balance": {"accept": True}}
SIZES = [(60, 90), (90, 60), (48, 48), (40, 64), (64, 40), (50, 50), (44, 70), (70, 44)]
EMPTY = 3  # the photo whose mask is planted all background
IMAGE = {"size": [40, 40], "resize": "fit", "color": "gray"}  # fit pads masks with the source's pad, 255
PAD = 255


@dataclass(frozen=True)
class Builds:
    webdataset: Path
    parquet: Path
    plain: Path    # the same photos, a class dataset without masks
    stacked: Path  # multi-frame CT, frames stacked: F=3 masks


def _stacked(tmp: Path) -> Path:
    raw = tmp / "raw"
    rows = ["path,label,mask"]
    for i in range(3):
        ids = np.stack([_blocks(32, 32, 10 * i + f, block=8) for f in range(3)])
        (raw / "ct").mkdir(parents=True, exist_ok=True)
        (raw / "masks").mkdir(parents=True, exist_ok=True)
        write_ct_slice(raw / "ct" / f"{i}.dcm", patient_id=f"P{i}", study_date="20240101",
                       pixels_hu=(ids * 400.0 - 500.0).astype(np.float32))
        np.save(raw / "masks" / f"{i}.npy", ids)
        rows.append(f"ct/{i}.dcm,x,masks/{i}.npy")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    source = {"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"), "mask": {"column": "mask"}}
    return _build(_job(tmp, [source], transform={"dicom": {"windows": [{"center": 250, "width": 2000}],
                                                           "size": [32, 32], "frames": "stack"}})).version_dir


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    tmp = tmp_path_factory.mktemp("report-masks")
    raw = _photo_set(tmp, SIZES)
    _png(raw / "masks" / f"{EMPTY}.png", np.zeros(SIZES[EMPTY], np.uint8))
    masked = _photo_source(raw)
    plain = {k: v for k, v in masked.items() if k != "mask"}
    made = {fmt: _build(_job(tmp / fmt, [masked], fmt, split=SPLIT, transform={"image": IMAGE})).version_dir
            for fmt in ("webdataset", "parquet")}
    return Builds(webdataset=made["webdataset"], parquet=made["parquet"],
                  plain=_build(_job(tmp / "plain", [plain], split=SPLIT, transform={"image": IMAGE})).version_dir,
                  stacked=_stacked(tmp / "stacked"))


def manifest_of(version: Path) -> dict:
    return json.loads((version / "manifest.json").read_text())


def read_back(version: Path) -> dict[str, dict[str, np.ndarray | str]]:
    """Every sample's image, mask and split, by key, as the loader reads them."""
    out: dict[str, dict[str, np.ndarray | str]] = {}
    for split in manifest_of(version)["splits"]:
        for item in ShardDataset(version / "manifest.json", split, shuffle=False):
            out[item["key"]] = {"image": item["image"].numpy(), "mask": item["mask"].numpy(), "split": split}
    return out


def mask_cells(parsed: ReportParser) -> dict[str, int]:
    return {field: value for (table, _, field), value in parsed.cells.items() if table == "mask-classes"}


def expected_cells(samples: dict[str, dict[str, np.ndarray | str]], splits: list[str]) -> dict[str, int]:
    pixels: dict[str, Counter[int]] = {s: Counter() for s in [*splits, "total"]}
    empty, counted = Counter[str](), Counter[str]()
    for sample in samples.values():
        mask, split = np.asarray(sample["mask"]), str(sample["split"])
        ids, counts = np.unique(mask, return_counts=True)
        for where in (split, "total"):
            pixels[where].update(dict(zip(ids.tolist(), counts.tolist(), strict=True)))
            counted[where] += 1
            empty[where] += not (set(ids.tolist()) - {0, PAD})
    ids = sorted({0, 1, 2, 3, PAD} | {i for c in pixels.values() for i in c})
    out = {f"mask-pixels.{i}.{s}": pixels[s][i] for i in ids for s in pixels}
    out.update({f"mask-empty.{s}": empty[s] for s in pixels})
    out.update({f"mask-samples.{s}": counted[s] for s in pixels})
    return out


def thumbnails(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """Per sheet key, its panes: (data URI, alt, hover caption)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for key, panes in re.findall(r'<figure class="cell" data-key="([^"]+)"><div class="panes">(.*?)</div>', text, re.S):
        out[key] = re.findall(r'<img src="([^"]+)" [^>]*alt="([^"]*)" title="([^"]*)"', panes)
    return out


def _rgb(color: str) -> np.ndarray:
    return np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)], np.float64)


# -- report ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_the_report_counts_every_masks_pixels_per_class_and_its_empty_masks(builds: Builds, fmt: str) -> None:
    version = getattr(builds, fmt)
    text = render_html_report(version)
    parsed = parse(text)
    assert parsed.unbalanced == []
    splits = list(manifest_of(version)["splits"])
    samples = read_back(version)
    assert len(samples) == len(SIZES) and len({s["split"] for s in samples.values()}) == 3
    expected = expected_cells(samples, [s for s in ("train", "valid", "test") if s in splits])
    assert mask_cells(parsed) == expected
    assert expected["mask-empty.total"] == 1 and expected[f"mask-pixels.{PAD}.total"] > 0  # planted; fit padding
    assert "over every sample's mask" in parsed.all_text
    fact = re.search(r'<dd data-field="mask">(.*?)</dd>', text)
    assert fact is not None and "uint8 FHW: classes 0, 1, 2, 3, 255" in fact.group(1)
    assert "pads with 255" in fact.group(1)
    # the same masks, whatever the shard format
    if fmt == "parquet":
        assert mask_cells(parse(render_html_report(builds.webdataset))) == expected


def test_a_sample_of_masks_is_said_to_be_one(builds: Builds) -> None:
    parsed = parse(render_html_report(builds.webdataset, limits=ReportLimits(histogram_samples=1)))
    cells = mask_cells(parsed)
    assert [cells[f"mask-samples.{s}"] for s in ("train", "valid", "test")] == [1, 1, 1]
    assert "over a sample: the masks of at most 1 samples per split" in parsed.all_text


def test_thumbnails_show_each_class_in_its_legend_colour_over_the_image(builds: Builds) -> None:
    text = render_html_report(builds.webdataset)
    legend = re.search(r'<div class="legend" id="mask-legend">(.*?)</div>', text, re.S)
    assert legend is not None
    keys = dict(re.findall(r'data-mask-id="(\d+)"><i style="background:([^;"]+)', legend.group(1)))
    assert keys == {"0": "transparent", "1": MASK_COLORS[0], "2": MASK_COLORS[1], "3": MASK_COLORS[2],
                    str(PAD): PAD_COLOR}
    assert f"{PAD} (pad)" in legend.group(1) and "0 background" in legend.group(1)
    assert text.index('id="mask-legend"') > text.index('id="contact-sheets"')
    samples = read_back(builds.webdataset)
    shown = thumbnails(text)
    assert shown.keys() == samples.keys()
    colours = {0: None, 1: _rgb(MASK_COLORS[0]), 2: _rgb(MASK_COLORS[1]), 3: _rgb(MASK_COLORS[2]), PAD: _rgb(PAD_COLOR)}
    for key, sample in samples.items():
        ((uri, alt, caption),) = shown[key]
        image, mask = np.asarray(sample["image"])[0].astype(np.float64), np.asarray(sample["mask"])[0]
        held = set(np.unique(mask).tolist()) - {0}
        classes, padded = ", ".join(map(str, sorted(held - {PAD}))), PAD in held  # the pad id is no class
        assert alt == "grey + mask"
        said = (classes + (f" (and pad {PAD})" if padded else "") if classes else
                f"empty (0 and pad {PAD})" if padded else "empty (all 0)")
        assert f"mask: {said}" in caption, (key, caption)
        bgr = decode_data_uri(uri)
        assert bgr.shape == (*image.shape, 3)  # 40×40: drawn at full size
        rgb = bgr[..., ::-1].astype(np.float64)
        for class_id, colour in colours.items():
            where = mask == class_id
            want = image[where][:, None] if colour is None else (
                image[where][:, None] * (1 - MASK_ALPHA) + colour * MASK_ALPHA)
            assert np.abs(rgb[where] - want).max(initial=0) <= 1, (key, class_id)


def test_masks_keep_the_image_budget(builds: Builds) -> None:
    full = sum(len(uri) for panes in thumbnails(render_html_report(builds.webdataset)).values() for uri, _, _ in panes)
    limits = ReportLimits(image_bytes=full // 2, duplicate_share=0.0)
    text = render_html_report(builds.webdataset, limits=limits)
    shown = thumbnails(text)
    assert shown and all(alt == "grey + mask" for panes in shown.values() for _, alt, _ in panes)
    used = sum(len(uri) for panes in shown.values() for uri, _, _ in panes)
    grids = re.findall(r'<div class="grid">(.*?)</div></div>', text, re.S)
    # over the budget only where each grid is down to the one thumbnail it always shows
    assert used <= limits.image_bytes or all(grid.count("<figure") == 1 for grid in grids)
    assert "not shown (report size budget)" in text or "reduced thumbnails" in text


def test_a_stacked_multi_frame_mask_shows_frame_0_and_counts_every_frame(builds: Builds) -> None:
    text = render_html_report(builds.stacked)
    parsed = parse(text)
    samples = read_back(builds.stacked)
    assert all(np.asarray(s["mask"]).shape[0] == 3 for s in samples.values())
    cells = mask_cells(parsed)
    total = Counter[int]()
    for sample in samples.values():
        ids, counts = np.unique(np.asarray(sample["mask"]), return_counts=True)
        total.update(dict(zip(ids.tolist(), counts.tolist(), strict=True)))
    assert {i: cells[f"mask-pixels.{i}.total"] for i in total} == dict(total)
    assert sum(total.values()) == 3 * 3 * 32 * 32
    fact = re.search(r'<dd data-field="mask">(.*?)</dd>', text)
    assert fact is not None and "classes not declared" in fact.group(1)
    for key, panes in thumbnails(text).items():
        uri, alt, _ = panes[-1]
        assert alt == "composite + mask" and all("mask" not in a for _, a, _ in panes[:-1])
        mask = np.asarray(samples[key]["mask"])
        rgb = decode_data_uri(uri)[..., ::-1].astype(np.float64)
        image = np.asarray(samples[key]["image"]).astype(np.float64)  # 3 frames: the composite is the image
        for class_id in (1, 2):
            where = mask[0] == class_id
            want = np.moveaxis(image, 0, -1)[where] * (1 - MASK_ALPHA) + _rgb(MASK_COLORS[class_id - 1]) * MASK_ALPHA
            assert np.abs(rgb[where] - want).max(initial=0) <= 1, (key, class_id)
        assert not np.array_equal(mask[0], mask[1])  # so frame 0 is the one drawn


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_without_the_index_the_shards_give_the_same_masks(builds: Builds, fmt: str, tmp_path: Path) -> None:
    version = getattr(builds, fmt)
    scanned = render_html_report(copy_without_index(version, tmp_path / "v"))
    assert "the shards were scanned instead" in scanned
    original = render_html_report(version)
    assert mask_cells(parse(scanned)) == mask_cells(parse(original))
    assert thumbnails(scanned) == thumbnails(original)


def test_a_dataset_without_masks_has_no_mask_markup(builds: Builds) -> None:
    assert "mask" not in manifest_of(builds.plain)
    text = render_html_report(builds.plain)
    # the bad-sample messages quote what the user could write (a mask file listed as an image of
    # its own: "... give the source mask: {column: mask, ...}"); they are no mask markup
    start, end = text.index('id="bad-samples"'), text.index('id="leakage-audit"')
    markup = text[:start] + text[end:]
    for marker in ("mask-legend", 'id="masks"', "mask-classes", 'data-field="mask"', "+ mask", "mask:",
                   "segmentation mask"):
        assert marker not in markup, marker
    assert all(alt == "grey" for panes in thumbnails(text).values() for _, alt, _ in panes)


# -- inspect --------------------------------------------------------------------------------
def invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(click.Group(commands=[inspect_command]), [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_inspect_says_the_dataset_has_masks(builds: Builds, fmt: str) -> None:
    version = getattr(builds, fmt)
    lines = [line for line in invoke("inspect", version).output.splitlines() if line.strip().startswith("masks ")]
    where = "mask columns" if fmt == "parquet" else "<key>.mask.npy"
    assert lines == [f"  masks         uint8 FHW, one per sample ({where}); classes 0, 1, 2, 3, 255 (0 background); "
                     "fit pads with 255"]
    summary = json.loads(invoke("inspect", "--json", version).output)
    assert summary["mask"] == manifest_of(version)["mask"]
    assert summary["mask"]["dtype"] == "uint8" and summary["mask"]["classes"] == [0, 1, 2, 3, 255]


def test_inspect_of_undeclared_classes_and_of_no_masks(builds: Builds) -> None:
    assert "classes not declared (any id) (0 background)" in invoke("inspect", builds.stacked).output
    assert json.loads(invoke("inspect", "--json", builds.plain).output)["mask"] is None
    assert "masks " not in invoke("inspect", builds.plain).output
