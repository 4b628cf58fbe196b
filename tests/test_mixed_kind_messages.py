"""A job that mixes kinds (CT stacks, NIfTI slices, photos) is told only the fixes that can work:
every change its shapes need, no collate the loader then refuses, no channel count another
source is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packer.config import load_job
from packer.errors import ConfigError
from tests.helpers import write_job

# -- a neighbour stack's channel count: only fixes that give it --------------------------------------------------


def _stack_job(tmp_path: Path, kind: str, channels: int, windows: list[Any], neighbors: int,
               photos: bool = True, **extra: Any) -> Path:
    for folder in ("scans", "img"):
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "img" / "t.csv").write_text("path,label,entity\n")
    (tmp_path / "k.key").write_text("ab" * 32 + "\n")
    sources: list[dict[str, Any]] = [{"kind": kind, "name": "scan", "root": str(tmp_path / "scans"), "label": "none"}]
    if photos:
        sources.append({"kind": "image", "name": "photo", "root": str(tmp_path / "img"),
                        "table": str(tmp_path / "img" / "t.csv"), "label": "none"})
    return write_job(tmp_path, {
        "name": "stack", "sources": sources, "output": str(tmp_path / "out"), "pack": {"format": "webdataset"},
        "split": {"by": "entity"}, "phi": {"key_file": str(tmp_path / "k.key")},
        "transform": {"channels": channels, kind: {"windows": windows, "sample": {"neighbors": neighbors}, **extra},
                      **({"image": {"color": "rgb"}} if photos else {})}})


def _refusal(job: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    return str(caught.value)


@pytest.mark.parametrize("kind", ["dicom", "nifti"])
def test_a_stack_beside_rgb_photos_is_told_the_stack_size_that_makes_their_count(tmp_path: Path, kind: str) -> None:
    # 5 slices × 1 window beside RGB photos under transform.channels: 3. No windows times 5 make 3, and
    # transform.channels: 5 is refused for the photos; neighbors: 1 (3 slices × 1 window) is the way
    said = _refusal(_stack_job(tmp_path, kind, 3, ["lung" if kind == "dicom" else "abdomen"], 2))
    assert f"set transform.{kind}.sample: {{neighbors: 1}} (3 slices × 1 channel(s) a slice make 3)" in said, said
    assert "times the stack's" not in said, said
    assert "transform.channels to" not in said, said
    assert "drop transform.channels and load each source on its own" in said, said


@pytest.mark.parametrize("kind", ["dicom", "nifti"])
def test_a_stack_alone_may_set_the_count_to_its_own(tmp_path: Path, kind: str) -> None:
    # no other source shares transform.channels: the stack's own 5 is a fix; 3 is no multiple of 5 slices
    said = _refusal(_stack_job(tmp_path, kind, 3, ["lung" if kind == "dicom" else "abdomen"], 2, photos=False))
    assert "set transform.channels to 5" in said and "neighbors: 1" in said, said
    assert "times the stack's" not in said, said


def test_a_stack_whose_count_is_a_multiple_is_told_the_windows_and_no_impossible_stack(tmp_path: Path) -> None:
    # 6 channels from 3-slice stacks of 1 window: 2 windows a slice; no odd stack of 1 window makes 6
    said = _refusal(_stack_job(tmp_path, "dicom", 6, ["lung"], 1))
    assert "list 2 window(s) that, times the stack's 3 slices, make 6 channels" in said, said
    assert "neighbors:" not in said.split("Fix:")[1], said


def test_modality_windows_of_a_stack_are_told_the_windows_a_slice(tmp_path: Path) -> None:
    # 3-slice stacks under transform.channels: 3: CT's 2 windows make 6. "list 3 windows for CT (or 1,
    # replicated)" made 9 or 3 slices × 1 = 3 only by luck of the words; the count a slice is 1
    said = _refusal(_stack_job(tmp_path, "dicom", 3, ["lung"], 1, modality_windows={"CT": ["lung", "bone"]}))
    assert "transform.dicom.modality_windows.CT: gives 6 channel(s)" in said, said
    assert "list 1 window(s) for CT that, times the stack's 3 slices, make 3 channels" in said, said
    assert "replicated" not in said.split("Fix:")[1] and "neighbors:" not in said.split("Fix:")[1], said
