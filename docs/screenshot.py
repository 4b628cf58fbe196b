"""Remake docs/report-screenshot.png from the demo build, so the README shows the current report.

    make demo && make screenshot          # or: python docs/screenshot.py build/demo/<version>

Headless Chromium (Debian's ``chromium`` package) renders ``report.html`` from file:// at
1280 px wide; the page's blank tail is cut off. The PNG carries the dataset version it shows
in a ``tEXt`` chunk (keyword ``packer-demo-version``), which tests/test_readme.py compares
with the committed demo manifest: a README whose screenshot shows another version fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
KEYWORD = b"packer-demo-version"
WIDTH, MAX_HEIGHT = 1280, 12000
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def png_with_text(png: bytes, keyword: bytes, text: str) -> bytes:
    """``png`` with a ``tEXt`` chunk ``keyword``=``text`` right after its IHDR chunk."""
    data = keyword + b"\0" + text.encode("latin-1")
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    ihdr_end = 8 + 8 + 13 + 4   # signature, IHDR length+type, IHDR data, CRC
    return png[:ihdr_end] + chunk + png[ihdr_end:]


def png_text(png: bytes) -> dict[str, str]:
    """The ``tEXt`` chunks of ``png``: keyword → text."""
    out, at = {}, 8
    while at + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[at:at + 8])
        if kind == b"tEXt":
            keyword, _, text = png[at + 8:at + 8 + length].partition(b"\0")
            out[keyword.decode("latin-1")] = text.decode("latin-1")
        at += 12 + length
    return out


def crop_blank_tail(image: np.ndarray) -> np.ndarray:
    """Cut the rows at the bottom that are all the page's background (the colour of the last row)."""
    background = image[-1]
    differs = np.flatnonzero(np.abs(image.astype(np.int16) - background).max(axis=(1, 2)) > 8)
    return image[: int(differs[-1]) + 24] if len(differs) else image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version_dir", nargs="?", type=Path,
                        help="the demo's version folder (default: build/demo/<the committed manifest's version>)")
    parser.add_argument("-o", "--output", type=Path, default=REPO / "docs" / "report-screenshot.png")
    args = parser.parse_args(argv)
    version_dir = args.version_dir
    if version_dir is None:
        committed = sorted((REPO / "manifests" / "demo").glob("*.json"))
        if len(committed) != 1:
            parser.error(f"expected one manifest in manifests/demo/, found {len(committed)}; name the version folder")
        version_dir = REPO / "build" / "demo" / committed[0].stem
    report = version_dir / "report.html"
    if not report.is_file():
        parser.error(f"{report} does not exist: run `make demo` first (it writes the report)")
    version = json.loads((version_dir / "manifest.json").read_text(encoding="utf-8"))["version"]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("headless Chromium is not installed: apt-get install -y chromium (Debian), then run again")
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "shot.png"
        done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp}/profile", f"--screenshot={shot}",
                               f"--window-size={WIDTH},{MAX_HEIGHT}", report.resolve().as_uri()],
                              capture_output=True, text=True, timeout=180, check=False)
        image = cv2.imread(str(shot))
        if image is None:
            print(f"chromium wrote no screenshot: {done.stderr[-2000:]}", file=sys.stderr)
            return 1
    ok, encoded = cv2.imencode(".png", crop_blank_tail(image), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok:
        print("OpenCV could not encode the screenshot as PNG", file=sys.stderr)
        return 1
    args.output.write_bytes(png_with_text(encoded.tobytes(), KEYWORD, version))
    print(f"wrote {args.output} ({image.shape[1]}×{image.shape[0]} px before cropping), version {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
