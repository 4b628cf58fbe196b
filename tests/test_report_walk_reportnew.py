"""What report.html says of masks where the words once said otherwise than the pixels:

- a mask ``pad`` that is a named class (README, Masks from DICOM SEG and RTSTRUCT: pad is "0, a
  class id, or an id the loss ignores") is that class in the legend, the mask table, the overlay
  colours, the hover text and the empty-mask counts; only a pad id that is no class is "pad";
- the contact sheets' lead says how a volume's D×H×W label map is drawn (its three middle planes,
  lined up with the volume's panes), and keeps "frame 0 of a multi-frame mask" for a dataset of
  slices, where it is what is drawn.

Expected numbers are counted from the masks the loader reads back, never from the report.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer.config import load_job
from packer.demo_annotations import write_annotated_examples
from packer.demo_nifti import write_nifti_examples
from packer.htmlreport import render_html_report
from packer.htmlreport.imagery import _mask_drawn
from packer.htmlreport.thumbs import MASK_ALPHA, MASK_COLORS, PAD_COLOR
from packer.pipeline.build import BuildOptions, build
from tests.helpers import write_job
from tests.test_htmlreport import decode_data_uri, parse
from tests.test_masks import _photo_set, _photo_source
from tests.test_report_masks import manifest_of, mask_cells, read_back, thumbnails

pytestmark = pytest.mark.slow

SPLIT = {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 2, "balance": {"accept": True}}
BODY = 1  # the RTSTRUCT class the job also pads masks with


def _build_version(tmp: Path, doc: dict[str, Any]) -> Path:
    doc = {"name": "reportnew", "split": SPLIT, "pack": {"format": "webdataset"}, "output": str(tmp / "out"),
           "validate": {"max_bad_fraction": 0.9}, **doc}
    job = write_job(tmp / "job", doc)
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir


@pytest.fixture(scope="module")
def padded_by_body(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's annotated CT slices, masks from their SEG and RTSTRUCT, ``pad: 1`` (body)."""
    tmp = tmp_path_factory.mktemp("pad-class")
    write_annotated_examples(tmp / "raw", 7)
    mask = {"from": "dicom", "rois": {"body": {"id": BODY, "aliases": ["BODY", "External"]},
                                      "lung": {"id": 2, "aliases": ["Lung_L", "LUNG RIGHT", "LUNG LEFT", "Lung_R"]},
                                      "heart": {"id": 3, "aliases": ["HEART"]}},
            "segments": {"liver": {"id": 4, "codes": ["SCT:10200004"]},
                         "tumour": {"id": 5, "aliases": ["Tumor", "lesion"]}},
            "overlap": "later_wins", "empty": "keep", "pad": BODY}
    return _build_version(tmp, {
        "sources": [{"kind": "dicom", "root": str(tmp / "raw"), "label": "none", "mask": mask}],
        "transform": {"dicom": {"windows": ["lung", "mediastinum", "liver"], "size": [64, 64], "sample": "slice"}},
        "phi": {"mode": "keep"}})


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_a_pad_id_that_is_a_named_class_is_that_class_in_the_legend_and_the_table(padded_by_body: Path) -> None:
    mask = manifest_of(padded_by_body)["mask"]
    assert mask["pad"] == BODY and mask["names"][str(BODY)]["name"] == "body"  # the setting under test
    text = render_html_report(padded_by_body)
    legend = re.search(r'<div class="legend" id="mask-legend">(.*?)</div>', text, re.S)
    assert legend is not None
    key = re.search(rf'<span class="key" data-mask-id="{BODY}"><i style="background:([^;"]+)"></i>(.*?)</span>',
                    legend.group(1))
    assert key is not None and key.groups() == (MASK_COLORS[BODY - 1], f"{BODY} body")
    assert PAD_COLOR not in legend.group(1) and "(pad)" not in legend.group(1)
    # the legend says that the padding of a resize carries the class's id
    note = re.search(r'data-field="mask-pad-class">(.*?)</span>', legend.group(1))
    assert note is not None and f"{BODY} body" in note.group(1) and "padding" in note.group(1)
    row = re.search(rf'<tr data-mask-id="{BODY}"><th scope="row">(.*?)</th>', text)
    assert row is not None and _text(row.group(1)) == f"{BODY} body" and PAD_COLOR not in row.group(1)
    fact = re.search(r'<dd data-field="mask">(.*?)</dd>', text)
    assert fact is not None and f"fit pads with {BODY} (body)" in fact.group(1)


def test_masks_that_hold_the_pad_class_are_not_counted_empty(padded_by_body: Path) -> None:
    samples = read_back(padded_by_body)
    empty: Counter[str] = Counter()
    pixels: Counter[str] = Counter()
    for sample in samples.values():
        ids = set(np.unique(np.asarray(sample["mask"])).tolist())
        for where in (str(sample["split"]), "total"):
            empty[where] += ids <= {0}  # empty: nothing but background
            pixels[where] += int((np.asarray(sample["mask"]) == BODY).sum())
    holding_body = sum(BODY in np.asarray(s["mask"]) for s in samples.values())
    assert holding_body and empty["total"] and holding_body + empty["total"] <= len(samples)
    cells = mask_cells(parse(render_html_report(padded_by_body)))
    assert {s: cells[f"mask-empty.{s}"] for s in empty} == dict(empty)
    assert {s: cells[f"mask-pixels.{BODY}.{s}"] for s in pixels} == dict(pixels)


def test_the_pad_class_is_drawn_and_hovered_as_that_class(padded_by_body: Path) -> None:
    text = render_html_report(padded_by_body)
    samples = read_back(padded_by_body)
    shown = thumbnails(text)
    drawn_body = 0
    for key, panes in shown.items():
        uri, alt, caption = panes[-1]
        assert alt.endswith("+ mask")
        mask = np.asarray(samples[key]["mask"])[0]
        held = sorted(set(np.unique(mask).tolist()) - {0})
        said = ", ".join(map(str, held)) if held else "empty (all 0)"
        assert f"mask: {said}" in caption and "pad" not in caption, (key, caption)
        where = mask == BODY
        if where.any():
            image = np.moveaxis(np.asarray(samples[key]["image"]), 0, -1).astype(np.float64)  # 3 windows: RGB
            want = image[where] * (1 - MASK_ALPHA) + np.array([int(MASK_COLORS[BODY - 1][i:i + 2], 16)
                                                                for i in (1, 3, 5)]) * MASK_ALPHA
            rgb = decode_data_uri(uri)[..., ::-1].astype(np.float64)
            assert np.abs(rgb[where] - want).max() <= 1, key
            drawn_body += 1
    assert drawn_body


def test_a_pad_id_that_no_class_names_is_still_the_pad(tmp_path: Path) -> None:
    """File masks: ``classes: [0, 1, 2, 3, 255]`` lists the pad 255 as README asks, and no name
    makes it a class, so it is the pad: grey, "(pad)", left out of a mask's classes."""
    raw = _photo_set(tmp_path, [(60, 90), (90, 60), (48, 48), (40, 64)])
    version = _build_version(tmp_path, {"sources": [_photo_source(raw)],
                                        "transform": {"image": {"size": [40, 40], "resize": "fit", "color": "gray"}}})
    text = render_html_report(version)
    legend = re.search(r'<div class="legend" id="mask-legend">(.*?)</div>', text, re.S)
    assert legend is not None and "255 (pad)" in legend.group(1) and PAD_COLOR in legend.group(1)
    assert 'data-field="mask-pad-class"' not in text
    samples = read_back(version)
    assert any(255 in np.asarray(s["mask"]) for s in samples.values())  # fit padded
    cells = mask_cells(parse(text))
    assert cells["mask-empty.total"] == sum(set(np.unique(np.asarray(s["mask"])).tolist()) <= {0, 255}
                                            for s in samples.values())
    lead = _contact_lead(text)
    assert "frame 0 of a multi-frame mask" in lead and "label map" not in lead  # slices: frame 0 is what is drawn


def _contact_lead(text: str) -> str:
    section = text[text.index('id="contact-sheets"'):]
    lead = re.search(r'<p class="lead">(.*?)</p>', section, re.S)
    assert lead is not None
    return _text(lead.group(1))


def test_a_volume_datasets_sheets_say_the_label_map_is_drawn_in_its_middle_planes(tmp_path: Path) -> None:
    write_nifti_examples(tmp_path / "raw", 3)
    version = _build_version(tmp_path, {
        "sources": [{"kind": "nifti", "name": "abdomen_ct", "root": str(tmp_path / "raw" / "ct"),
                     "table": str(tmp_path / "raw" / "ct" / "cases.csv"), "label": "none",
                     "mask": {"column": "mask", "classes": [0, 1, 2, 3]}}],
        "transform": {"nifti": {"windows": ["abdomen", "liver"],
                                "sample": {"volume": {"spacing": [5, 6, 6], "size": [32, 64, 64]}}}}})
    manifest = manifest_of(version)
    assert manifest["sample_schema"]["layout"] == "CDHW" and manifest["mask"]["layout"] == "DHW"
    text = render_html_report(version)
    assert any(alt.endswith("+ mask") for panes in thumbnails(text).values() for _, alt, _ in panes)
    lead = _contact_lead(text)
    assert "frame 0" not in lead
    assert "label map by its three middle planes, lined up with the volume's" in lead, lead
    # volumes beside 2-D samples of another source (layout CDHW holds both): each is said
    mixed = {**manifest, "sample_schema": {**manifest["sample_schema"], "shapes": {
        **manifest["sample_schema"]["shapes"], "photos": [[1, 40, 40]]}}}
    said = _mask_drawn(mixed)
    assert "three middle planes" in said and "a 2-D sample's, frame 0 of a multi-frame mask" in said
