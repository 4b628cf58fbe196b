"""Where a report goes and what it shows.

The output: :func:`packer.files.atomic_output` replaces a regular file atomically (a temporary
beside it, renamed over it), but a path that is no regular file is written *into*: a FIFO
(``packer report V -o >(gzip > r.gz)``), ``/dev/stdout``, ``/dev/null``; renaming over one would
replace the pipe or, as root, the device node with a file; so is a link that leads to one. A
link to a regular file is replaced by the new file and the file it led to is left as it was: it
may be a DVC or git-annex cache object shared by other names. The special files here are FIFOs
and links in a temporary folder, never a real device.
"""

from __future__ import annotations

import base64
import html
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from pydicom.uid import ComputedRadiographyImageStorage as CR

from packer.cli import main as CLI
from packer.config import load_job
from packer.demo import write_demo_key
from packer.files import TMP_SUFFIX, atomic_output
from packer.htmlreport import render_html_report
from packer.htmlreport.thumbs import Pane, composite_pane, sample_panes
from packer.pipeline.build import BuildOptions, build
from tests.dicom_files import image_dataset, save
from tests.photo_jobs import build_tree, write_tree
from tests.test_masks import _photo_set, _photo_source, _png
from tests.test_targets import _build, _job


class FifoReader:
    """Reads everything written into the FIFO at ``path``, on a thread (opening a FIFO waits for
    its other end)."""

    def __init__(self, path: Path) -> None:
        self.got = b""
        self._thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self._thread.start()

    def _read(self, path: Path) -> None:
        with open(path, "rb") as fh:
            self.got = fh.read()

    def result(self) -> bytes:
        self._thread.join(10)
        assert not self._thread.is_alive(), "nothing opened the FIFO for writing: the report went elsewhere"
        return self.got


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX))


def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path: Path) -> None:
    for shared in (False, True):
        fifo = tmp_path / f"report-{shared}.fifo"
        os.mkfifo(fifo)
        reader = FifoReader(fifo)
        with atomic_output(fifo, shared=shared) as fh:
            fh.write(b"<!DOCTYPE html>")
        assert reader.result() == b"<!DOCTYPE html>"
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []


def test_a_link_to_a_file_is_replaced_and_the_file_it_led_to_is_left_alone(tmp_path: Path) -> None:
    """DVC's ``cache.type: symlink`` makes every tracked file a link into a content-addressed cache
    (files 0444, folders writable): writing through the link rewrote the cache object keyed by the
    old report's bytes, for every workspace sharing it. The link is replaced, as a file would be."""
    cached = tmp_path / "cache" / "ab" / "cdef0123"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"old")
    cached.chmod(0o444)
    link = tmp_path / "version" / "report.html"
    link.parent.mkdir()
    link.symlink_to(cached)
    with atomic_output(link, shared=True) as fh:
        fh.write(b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert cached.read_bytes() == b"old"
    assert leftovers(link.parent) == [] and leftovers(cached.parent) == []


def test_a_dangling_link_is_replaced_by_the_file(tmp_path: Path) -> None:
    link = tmp_path / "latest.html"
    link.symlink_to("report.html")  # relative, as ln -s writes it
    with atomic_output(link) as fh:
        fh.write(b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert not (tmp_path / "report.html").exists()


def test_a_pipe_named_by_a_proc_fd_link_is_written_into(tmp_path: Path) -> None:
    """``-o >(gzip > r.gz)`` hands packer ``/dev/fd/63``, a link to ``/proc/PID/fd/63``, which
    reads as ``pipe:[N]``: resolving the link's text gives a path that does not exist, so the
    special file is found by following the link (stat), not by resolving it."""
    read_end, write_end = os.pipe()
    try:
        named = Path(f"/proc/self/fd/{write_end}")
        assert "pipe:" in os.readlink(named)
        with atomic_output(named) as fh:
            fh.write(b"<!DOCTYPE html>")
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.read() == b"<!DOCTYPE html>"


def test_a_link_to_a_fifo_writes_into_the_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "out.html"
    link.symlink_to(fifo)
    reader = FifoReader(link)
    with atomic_output(link, shared=True) as fh:
        fh.write(b"into the pipe")
    assert reader.result() == b"into the pipe"
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_regular_file_is_still_replaced_by_rename(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_bytes(b"old")
    before = os.stat(target).st_ino
    with atomic_output(target) as fh:
        fh.write(b"new")
    assert target.read_bytes() == b"new" and os.stat(target).st_ino != before


def test_packer_report_writes_into_a_fifo_named_by_o(tmp_path: Path) -> None:
    write_tree(tmp_path / "raw")
    version = build_tree(tmp_path, "out")
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    result = CliRunner().invoke(CLI, ["report", str(version), "-o", str(fifo)])
    assert result.exit_code == 0, result.output
    assert reader.result().startswith(b"<!DOCTYPE html>")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []


# ------------------------------------------------- MONOCHROME1 kept as modality values (float16)
# PS3.3 C.7.6.3.1.2: a MONOCHROME1 image's minimum displays white. A window (uint8, uint16, or a
# float16 normalisation) inverts it when packing; plain `output: float16` keeps the stored values,
# and the sample's metadata says a later window must invert them: the report's thumbnail must too.

RAMP = np.tile(np.linspace(0, 4000, 32), (32, 1)).astype(np.uint16)  # low values left, high right


def _brightness(pane: Pane) -> tuple[float, float]:
    """Mean grey of the left and right edges of a pane's PNG."""
    png = cv2.imdecode(np.frombuffer(base64.b64decode(pane.uri.split(",", 1)[1]), np.uint8), cv2.IMREAD_GRAYSCALE)
    return float(png[:, :3].mean()), float(png[:, -3:].mean())


def _float16_info(**metadata: Any) -> dict[str, Any]:
    return {"metadata": {"windows": [], **metadata}}


def test_float16_modality_values_of_monochrome1_are_shown_inverted() -> None:
    ramp = RAMP.astype(np.float16)[None]
    for info in (_float16_info(photometric_interpretation="MONOCHROME1"),
                 _float16_info(photometric_interpretation="MONOCHROME1", presentation_lut_shape="INVERSE"),
                 _float16_info(photometric_interpretation="MONOCHROME2", presentation_lut_shape="INVERSE")):
        left, right = _brightness(sample_panes(ramp, info, "dicom")[0])
        assert left > 200 and right < 50, info  # the minimum white, once: MONOCHROME1 with INVERSE is not undone
        left, right = _brightness(composite_pane(ramp, info=info))  # a duplicate pair's pane
        assert left > 200 and right < 50, info


def test_values_a_window_already_inverted_and_monochrome2_are_shown_as_packed() -> None:
    windowed = {"metadata": {"photometric_interpretation": "MONOCHROME1", "windows": [{"center": 2000, "width": 4000}]}}
    inverted_ramp = (255 - np.rint(RAMP / 4000 * 255)).astype(np.uint8)[None]  # what the window packed
    left, right = _brightness(sample_panes(inverted_ramp, windowed, "dicom")[0])
    assert left > 200 and right < 50
    zscore = {"metadata": {"photometric_interpretation": "MONOCHROME1",
                           "windows": [{"source": "zscore", "inverted": True}]}}
    left, right = _brightness(sample_panes(-(RAMP.astype(np.float16) - 2000)[None] / 1000, zscore, "dicom")[0])
    assert left > 200 and right < 50  # -z: already inverted
    for info in (_float16_info(photometric_interpretation="MONOCHROME2"), _float16_info(), {}):
        left, right = _brightness(sample_panes(RAMP.astype(np.float16)[None], info, "dicom")[0])
        assert left < 50 and right > 200, info


@pytest.fixture(scope="module")
def monochrome1_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The reports of one set of MONOCHROME1 radiographs built as uint8 and as float16."""
    tmp = tmp_path_factory.mktemp("monochrome1")
    for i in range(6):
        ds = image_dataset(RAMP + i, photometric="MONOCHROME1", modality="CR", sop_class=CR,
                           PatientID=f"P{i}", RescaleSlope=1, RescaleIntercept=0, WindowCenter=2000, WindowWidth=4000)
        save(ds, tmp / "raw" / f"P{i}" / "cr.dcm")
    reports = {}
    for output in ("uint8", "float16"):
        job = tmp / f"{output}.yaml"
        job.write_text(yaml.safe_dump({
            "name": f"cr{output}", "sources": [{"kind": "dicom", "root": "raw", "name": "cr", "label": "none"}],
            "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1,
                      "balance": {"accept": True}},
            "transform": {"dicom": {"windows": ["file"], "output": output, "size": [32, 32]}},
            "pack": {"format": "webdataset"}, "output": "out", "phi": {"key_file": str(write_demo_key(tmp, 3))}}))
        result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True))
        reports[output] = (Path(result.manifest_path).parent / "report.html").read_text()
    return reports


def test_a_monochrome1_radiograph_looks_the_same_in_the_report_packed_as_uint8_or_float16(
        monochrome1_reports: dict[str, str]) -> None:
    for output, text in monochrome1_reports.items():
        uris = re.findall(r'<figure class="cell" data-key="[^"]*"><div class="panes"><img src="([^"]*)"', text)
        assert uris, output
        for uri in uris:
            left, right = _brightness(Pane(name="", uri=uri, width=0, height=0))
            assert left > right + 100, f"{output}: the minimum (left) must display white"


# ------------------------------------------------------------ the hover text of a thumbnail
# Its lines are the caption's fields, `field: value` each; a value holding a line break (a quoted
# CSV cell) must not start a line of its own, which could pass for another field.


def test_a_label_or_entity_holding_control_characters_stays_on_its_own_hover_line(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    rows = []
    for i in range(12):
        rel = f"E{i // 2}/i{i}.png"
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(raw / rel), np.random.default_rng(i).integers(0, 255, (8, 8), dtype=np.uint8))
        label = '"benign\nentity_id: P999"' if i % 2 else '"malignant\tgrade\r2"'
        entity = f'"E{i // 2}\nsource: forged"' if i < 4 else f"E{i // 2}"
        rows.append(f"{rel},{label},{entity}")
    (raw / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows) + "\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "t", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1,
                  "balance": {"accept": True}},
        "transform": {"image": {"size": [8, 8], "color": "gray"}}, "pack": {"format": "webdataset"},
        "output": "out"}))
    result = build(load_job(tmp_path / "job.yaml"), BuildOptions(scheduler="sync", quiet=True))
    text = (Path(result.manifest_path).parent / "report.html").read_text()
    titles = [html.unescape(t) for t in re.findall(r'<img [^>]*?title="([^"]*)"', text)]
    assert len(titles) == 12
    for title in titles:
        lines = title.split("\n")
        fields = [line.split(":", 1)[0] for line in lines[1:]]
        assert fields == ["label", "entity_id", "source", "shown"], lines
        assert not any(c in title for c in "\r\t"), title
    labels = {line for title in titles for line in title.split("\n") if line.startswith("label: ")}
    assert labels == {"label: benign␊entity_id: P999", "label: malignant␉grade␍2"}
    assert any("entity_id: E0␊source: forged" in title for title in titles)


# ------------------------------------------------------------ a mask's caption and the mask table
# `fit` pads a mask with its source's pad id (here 255): padding is no class, so a padded mask of
# background only is empty in the splits table, and its caption must say so too.


def test_a_padded_all_background_mask_is_captioned_empty_as_the_table_counts_it(tmp_path: Path) -> None:
    sizes = [(60, 90), (90, 60), (48, 48), (40, 64), (64, 40), (50, 50)]
    raw = _photo_set(tmp_path, sizes)
    _png(raw / "masks" / "3.png", np.zeros(sizes[3], np.uint8))  # all background, padded by fit
    split = {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "balance": {"accept": True}}
    version = _build(_job(tmp_path, [_photo_source(raw)], split=split,
                          transform={"image": {"size": [40, 40], "resize": "fit", "color": "gray"}})).version_dir
    text = render_html_report(version)
    captions = {key: html.unescape(title).split("\n") for key, title in
                re.findall(r'<figure class="cell" data-key="([^"]*)"><div class="panes"><img [^>]*?title="([^"]*)"',
                           text)}
    assert len(captions) == len(sizes)
    masks = {key: next(line for line in lines if line.startswith("mask: ")) for key, lines in captions.items()}
    counted = re.search(r'data-field="mask-empty.total" data-value="(\d+)"', text)
    assert counted is not None and int(counted.group(1)) == 1  # the table: one empty mask
    assert sorted(m for m in masks.values() if m.startswith("mask: empty")) == ["mask: empty (0 and pad 255)"]
    classes = [m.removeprefix("mask: ").split(" (")[0].split(", ") for m in masks.values()
               if not m.startswith("mask: empty")]
    assert classes and all("255" not in ids for ids in classes), masks  # the pad is named, not listed as a class
    assert any(m.endswith(" (and pad 255)") for m in masks.values()), masks


def test_a_descriptor_link_to_a_regular_file_is_written_into(tmp_path: Path) -> None:
    """``-o /dev/stdout`` with stdout redirected to a file (``> r.html``): the link leads to a
    regular file, and replacing it meant a temporary in /dev (refused; as root, the link itself
    renamed over). A link that names an open descriptor is written into, as the shell opened it."""
    target = tmp_path / "r.html"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with atomic_output(Path(f"/proc/self/fd/{fd}")) as fh:
            fh.write(b"<html>report</html>")
    finally:
        os.close(fd)
    assert target.read_bytes() == b"<html>report</html>"
    assert leftovers(tmp_path) == []


def test_a_descriptor_link_is_written_through_its_descriptor_keeping_what_it_holds(tmp_path: Path) -> None:
    """``-o /dev/stdout >> log.txt``: opening the link anew ("wb") truncated log.txt, losing its
    earlier lines. The descriptor itself is written through, with its offset and O_APPEND."""
    log = tmp_path / "log.txt"
    log.write_bytes(b"earlier line\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        with atomic_output(Path(f"/proc/self/fd/{fd}")) as fh:
            fh.write(b"<html>report</html>")
        os.write(fd, b"\nafter\n")  # the descriptor is still the caller's, open
    finally:
        os.close(fd)
    assert log.read_bytes() == b"earlier line\n<html>report</html>\nafter\n"
