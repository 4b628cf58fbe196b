"""The report of datasets whose masks come from annotations: where a sample's mask is drawn,
which base the tables' paths are relative to, and that structures no map names are counted.

Expected overlays are blended here with :func:`~packer.htmlreport.thumbs.mask_overlay` over the
slice the mask belongs to (README "Downstream, as any mask": a neighbour stack carries its centre
slice's mask), never taken from the pane under test.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from packer.badsamples import read_bad_samples
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.htmlreport import write_html_report
from packer.htmlreport.thumbs import mask_overlay, sample_panes
from tests.test_dicom_masks import BODY, LUNG, SEGMENTS, _mask_job, _write_series, write_rtstruct, write_seg
from tests.test_htmlreport import decode_data_uri
from tests.test_targets import _build


def _stack(k: int, windows: int) -> tuple[np.ndarray, dict[str, object]]:
    """A neighbour stack of slices -k…+k, each with ``windows`` windows, every slice a different
    level (slice s, window w: 20 + 40 s + 5 w), so each pane shows which slice it is."""
    names = [{"name": f"w{w}"} for w in range(windows)]
    info = {"metadata": {"windows": names, "neighbors": {"k": k, "channels_per_slice": windows,
                                                         "edge": "replicate"}}}
    chw = np.stack([np.full((16, 16), 20 + 40 * s + 5 * w, np.uint8)
                    for s in range(2 * k + 1) for w in range(windows)])
    return chw, info


@pytest.mark.parametrize(("k", "names"), [(1, ["-1 w0", "+0 w0 + mask", "+1 w0"]),
                                           (2, ["-2 w0", "-1 w0", "+0 w0 + mask", "+1 w0"])])  # 4 panes at most
def test_a_one_window_neighbour_stack_draws_its_mask_over_the_centre_slice(k: int, names: list[str]) -> None:
    """With one window there is no ``+0 composite`` pane: the mask (the centre slice's) goes on
    the ``+0`` pane, not on the last one, which is a neighbour."""
    chw, info = _stack(k, 1)
    mask = np.zeros((16, 16), np.uint8)
    mask[2:6, 3:9] = 1
    panes = sample_panes(chw, info, "dicom", mask=mask)
    assert [p.name for p in panes] == names
    drawn = [p for p in panes if p.name.endswith("+ mask")]
    assert len(drawn) == 1
    shown = decode_data_uri(drawn[0].uri)[..., ::-1]  # BGR → RGB
    assert np.array_equal(shown, mask_overlay(chw[k], mask))
    assert not np.array_equal(shown, mask_overlay(chw[-1], mask))


def test_a_multi_window_neighbour_stack_draws_its_mask_over_the_centre_composite() -> None:
    """With two windows per slice the centre slice's composite (``+0 composite``) carries the mask."""
    chw, info = _stack(1, 2)
    mask = np.zeros((16, 16), np.uint8)
    mask[8:12, 8:12] = 2
    panes = sample_panes(chw, info, "dicom", mask=mask)
    assert [p.name for p in panes] == ["-1 w0", "+0 w0", "+1 w0", "+0 composite + mask"]
    centre = chw[2:4]
    composite = np.dstack([centre[0], centre[1], ((centre[0].astype(np.uint16) + centre[1]) // 2).astype(np.uint8)])
    shown = decode_data_uri(panes[-1].uri)[..., ::-1]
    assert np.abs(shown.astype(int) - mask_overlay(composite, mask).astype(int)).max() <= 1


def _report(tmp: Path, raw: Path, mask: dict[str, Any], phi: dict[str, Any]) -> tuple[Path, str]:
    """Build a job of ``raw``'s DICOM with masks from ``mask`` under ``phi``; its version and report."""
    job = _mask_job(tmp, raw, mask)
    doc = yaml.safe_load(job.read_text())
    doc["phi"] = phi if phi.get("mode") == "keep" else {**doc["phi"], **phi}
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = _build(job)
    target = tmp / "report.html"
    write_html_report(result.version_dir, target)
    return result.version_dir, target.read_text(encoding="utf-8")


def _path_cells(report: str, table_id: str) -> list[tuple[str, str]]:
    """(full path, shown text) of each path cell of the table ``table_id``."""
    found = re.search(rf'<table id="{table_id}".*?</table>', report, re.S)
    assert found, table_id
    return [(html.unescape(full), html.unescape(text))
            for full, text in re.findall(r'<td class="mono path" title="([^"]*)">([^<]*)</td>', found.group(0))]


@pytest.mark.slow
def test_both_tables_of_paths_are_relative_to_the_one_folder_the_report_names(tmp_path: Path) -> None:
    """Patient A's SEG is left out on purpose (read as its series' mask), patient B's RTSTRUCT,
    whose one ROI no map names, is a bad sample: each table's paths, read under the "Paths are
    relative to" note, are the files' own (A/SEG/seg.dcm, not SEG/seg.dcm under a base that is B's)."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    write_seg(raw / "A" / "SEG" / "seg.dcm", a)
    b = _write_series(raw / "B" / "CT", "PB", seed=2)
    write_rtstruct(raw / "B" / "RT" / "rt.dcm", b, {"Hart": LUNG})
    version, report = _report(tmp_path, raw, {"rois": {"heart": 3}, **SEGMENTS}, phi={"mode": "keep"})
    assert [Path(r["path"]).name for r in read_excluded(version / EXCLUDED_FILE)] == ["seg.dcm"]
    assert "rt.dcm" in {Path(r["path"]).name for r in read_bad_samples(version / "bad_samples.jsonl")}
    bases = {html.unescape(b) for b in re.findall(r"Paths are relative to <code>([^<]*)</code>", report)}
    assert len(bases) == 1, bases  # one base, however many notes say it
    (base,) = bases
    for table_id in ("bad-samples-table", "excluded-table"):
        cells = _path_cells(report, table_id)
        assert cells, table_id
        for full, text in cells:
            assert Path(base) / text == Path(full), (table_id, base, text, full)
    excluded = _path_cells(report, "excluded-table")
    assert [text for _, text in excluded] == [str(Path("A") / "SEG" / "seg.dcm")]
    # the left-out table says its base itself, after its heading: a reader need not find the other note
    left_out = report[report.index('id="excluded"'):]
    assert f"Paths are relative to <code>{html.escape(base)}</code>" in left_out[:left_out.index("excluded-table")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pseudonymize", "keep"])
def test_the_report_counts_the_structures_no_map_names_without_naming_them(tmp_path: Path, mode: str) -> None:
    """workflows/annotated-slices.yaml: a structure no map names is "ignored and counted as
    unmapped in the report". Patient A's RTSTRUCT has a mapped body and two structures the map
    does not name (one a person's name); patient B's SEG is all mapped. The report says 2, in one
    annotation object, also when pseudonymized, where it lists no detail and names no structure."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    write_rtstruct(raw / "A" / "RT" / "rt.dcm", a, {"External": BODY, "Dr Smith check": LUNG, "PTV_boost": LUNG})
    b = _write_series(raw / "B" / "CT", "PB", seed=2)
    write_seg(raw / "B" / "SEG" / "seg.dcm", b)
    mask = {"rois": {"body": {"id": 1, "aliases": ["External"]}}, **SEGMENTS}
    version, report = _report(tmp_path, raw, mask, phi={"mode": mode})
    records = read_excluded(version / EXCLUDED_FILE)
    assert sorted(r["why"] for r in records) == ["annotation", "annotation"]
    assert read_bad_samples(version / "bad_samples.jsonl") == []
    text = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]+"', "", report)).split())
    said = re.search(r"Unmapped structures: (\d+) structure\(s\) the map does not name, ignored, in (\d+) of (\d+) "
                     r"annotation object\(s\)", text)
    assert said, text[text.index("Left out on purpose"):][:3000]
    assert said.groups() == ("2", "1", "2")
    assert "Dr Smith" not in report and "PTV_boost" not in report
