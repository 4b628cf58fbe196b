"""The HTML report in a real browser: headless Chromium opens it from file:// and renders it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import cv2
import pytest

from packer.config import load_job
from packer.htmlreport import SECTION_IDS, write_html_report
from packer.pipeline.build import BuildOptions, build
from tests.helpers import demo_job_doc, write_job

pytestmark = pytest.mark.slow  # starts a real browser (headless Chromium) three times

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium() -> str | None:
    """Headless Chromium's path, or None. Tests never install it: ``make ci-deps`` (run by
    ``.ci/run``) installs Debian's ``chromium`` package where it runs as root with apt-get."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        pytest.skip("headless Chromium is not installed: install it with `make ci-deps` as root "
                    "(Debian/Ubuntu: `apt-get install -y --no-install-recommends chromium`) to run the browser test")
    return found


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # its caches and settings (GLib's dconf among them) go to the profile, not the user's ~/.cache
    env = {**os.environ, "XDG_CACHE_HOME": str(profile / "cache"), "XDG_CONFIG_HOME": str(profile / "config")}
    return subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env)


@pytest.fixture(scope="module")
def report_file(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("browser")
    result = build(load_job(write_job(folder / "job", demo_job_doc(demo_raw.root, folder / "out"))),
                   BuildOptions(scheduler="sync", quiet=True))
    return write_html_report(result.version_dir)


def test_chromium_renders_the_report_from_file_url(chromium: str, report_file: Path, tmp_path: Path) -> None:
    url = report_file.resolve().as_uri()
    shot = tmp_path / "report.png"
    proc = run_chromium(chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,4000", url)
    assert shot.is_file(), proc.stderr[-2000:]
    image = cv2.imread(str(shot))
    assert image is not None and image.shape[:2] == (4000, 1280)
    assert float(image.std()) > 30  # not a blank page
    not_white = (image < 235).any(axis=2).mean()
    assert not_white > 0.1, f"only {not_white:.1%} of the page is drawn"

    # the thumbnails render under the page's Content-Security-Policy: the contact sheets alone
    # (same <head>, other sections cut) show the colour of the composites and photos
    sheets = tmp_path / "sheets.html"
    sheets.write_text(re.sub(r'<section class="block"><h2 id="(?!contact-sheets)[^"]*".*?</section>', "",
                             report_file.read_text(encoding="utf-8"), flags=re.S), encoding="utf-8")
    assert sheets.stat().st_size < report_file.stat().st_size
    sheet_shot = tmp_path / "sheets.png"
    run_chromium(chromium, tmp_path / "profile", f"--screenshot={sheet_shot}", "--window-size=1280,1600",
                 sheets.resolve().as_uri())
    hsv = cv2.cvtColor(cv2.imread(str(sheet_shot)), cv2.COLOR_BGR2HSV)
    assert ((hsv[..., 1] > 120) & (hsv[..., 2] > 80)).sum() > 20_000

    dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", url).stdout
    for ident, heading in SECTION_IDS.items():
        assert f'id="{ident}"' in dom and heading in dom
    assert "No findings." in dom and "<script" not in dom
