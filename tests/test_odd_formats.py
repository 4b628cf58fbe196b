"""Image files an image source finds but does not read, and the advice each gets.

Every image file under an image source's root is packed, bad, or left out as
``unsupported_format`` with what it is and what to do (README, Transforms: "an image of another
format under the root ... is left out as `unsupported_format` in `excluded.jsonl`"): whole-slide
scans (Aperio .svs, Hamamatsu .ndpi, ...), animated PNGs named .apng, PCX, JPEG XR, XPM.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import yaml
from PIL import Image

from packer.config import load_job
from packer.pipeline.discover import discover

WHOLE_SLIDE = {"s.svs": "Aperio SVS", "s.ndpi": "Hamamatsu NDPI", "s.scn": "Leica SCN", "s.mrxs": "3DHISTECH MIRAX",
               "s.vsi": "Olympus VSI", "s.czi": "Zeiss CZI", "s.bif": "Ventana BIF"}


def _job(tmp_path: Path, root: Path) -> Path:
    doc = {"name": "photos", "sources": [{"kind": "image", "root": str(root), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _excluded(tmp_path: Path, root: Path) -> dict[str, tuple[str, str]]:
    found = discover(load_job(_job(tmp_path, root)))
    assert [ref.relpath for ref in found.refs] == ["a.png"] and found.issues == []
    return {Path(e.path).name: (e.why, e.detail) for e in found.excluded}


def _photo(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8))


def test_whole_slide_scans_are_left_out_naming_the_scanner_format_and_the_route_packer_reads(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    root.mkdir()
    assert cv2.imwrite(str(root / "a.png"), np.zeros((8, 8), np.uint8))
    for name in WHOLE_SLIDE:  # .svs and .ndpi are TIFF inside; the others need not be real here
        _photo(len(name)).save(root / name, format="TIFF")
    detail = _excluded(tmp_path, root)
    assert sorted(detail) == sorted(WHOLE_SLIDE)
    for name, what in WHOLE_SLIDE.items():
        why, said = detail[name]
        assert why == "unsupported_format"
        suffix = Path(name).suffix
        assert said.startswith(f"a whole-slide image ({what}, {suffix}), which packer does not read"), said
        assert "DICOM" in said and "kind: dicom" in said and "OpenSlide" in said, said


def test_apng_pcx_jpeg_xr_and_xpm_are_left_out_as_unsupported_format(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    root.mkdir()
    assert cv2.imwrite(str(root / "a.png"), np.zeros((8, 8), np.uint8))
    _photo(1).save(root / "b.apng", format="PNG")
    _photo(2).save(root / "c.pcx", format="PCX")
    _photo(3).save(root / "d.xpm", format="XPM") if "XPM" in Image.SAVE else (root / "d.xpm").write_text(
        "/* XPM */\nstatic char *d[] = {\"1 1 1 1\", \"a c #000000\", \"a\"};\n")
    (root / "e.jxr").write_bytes(b"II\xbc\x01" + bytes(60))  # a JPEG XR signature
    (root / "f.ico").write_bytes(b"\0\0\1\0" + bytes(60))
    detail = _excluded(tmp_path, root)
    assert sorted(detail) == ["b.apng", "c.pcx", "d.xpm", "e.jxr", "f.ico"]
    assert {why for why, _ in detail.values()} == {"unsupported_format"}
    assert detail["b.apng"][1].startswith("an animated PNG (.apng)")
    assert "rename it to .png" in detail["b.apng"][1] and "its own PNG" in detail["b.apng"][1]
    assert detail["c.pcx"][1].startswith("a PCX image (.pcx), which packer does not read")
    assert detail["d.xpm"][1].startswith("an XPM image (.xpm), which packer does not read")
    assert detail["e.jxr"][1].startswith("a JPEG XR image (.jxr), which packer does not read")


def test_a_dicom_file_named_jpg_is_told_the_rename_a_dicom_source_needs(tmp_path: Path) -> None:
    """A DICOM source never reads a file named as an image (README: the image suffixes are never
    read as DICOM), so "read it with a source of kind: dicom" alone was a dead end: the advice
    says to rename it to .dcm, and a dicom source over the root then lists it."""
    from dicom_files import ct_dataset, ct_pixels, save

    from packer.config import ImageTransformConfig
    from packer.read.image import read_image
    from packer.records import Issue, SampleRef

    root = tmp_path / "raw"
    for i in range(2):
        save(ct_dataset(ct_pixels((16, 16), seed=i)), root / f"IM{i}.dcm")
    scan = save(ct_dataset(ct_pixels((16, 16), seed=9)), root / "scan.jpg")
    ref = SampleRef(sample_id="scan", source="photos", kind="image", path=str(scan), relpath="scan.jpg",
                    label=None, entity="scan", time=None)
    issue = read_image(ref, ImageTransformConfig(size=(16, 16)))
    assert isinstance(issue, Issue) and issue.reason == "unsupported"
    assert "a DICOM file (DICM at byte 128) named .jpg" in issue.message
    assert "rename it to .dcm, which a kind: dicom source reads" in issue.message, issue.message

    def dicom_files() -> list[str]:
        doc = {"name": "ct", "sources": [{"kind": "dicom", "root": str(root), "label": "none"}],
               "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
               "transform": {"dicom": {"windows": [{"center": 40, "width": 400}]}},
               "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
        (tmp_path / "ct.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return sorted(ref.relpath or "" for ref in discover(load_job(tmp_path / "ct.yaml")).refs)

    assert dicom_files() == ["IM0.dcm", "IM1.dcm"]  # kind: dicom alone does not read scan.jpg
    scan.rename(root / "scan.dcm")
    assert dicom_files() == ["IM0.dcm", "IM1.dcm", "scan.dcm"]
