"""A series refusal gives the fix that applies: one multi-frame object holding several stacks is
not a folder with a file to remove or restore.

Each Enhanced CT here is a real file (written with pydicom, read back by packer's header reader)
holding two stacks, told apart by Frame Content's Stack ID: in two planes, or at two stations
along one axis. Packed as neighbour stacks (``sample: {neighbors: k}``) they are refused with the
reason the check finds, and the record says that the frames are one object's, what tells them
apart, and the job that packs them (``sample: slice`` with ``frames: split``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence

from packer.read.dicom_series import slice_geometry
from packer.read.series import assemble
from tests.dicom_files import save
from tests.test_series import CFG, _ref, write_enhanced_ct

SAGITTAL = [0.0, 1.0, 0.0, 0.0, 0.0, -1.0]


def _two_stacks(path: Path, z: list[float], *, sagittal_from: int | None = None,
                stacks: list[str] | None = None) -> list[str]:
    """An Enhanced CT of ``len(z)`` frames at ``z`` mm; frames from ``sagittal_from`` on turned
    sagittal; each frame's Stack ID from ``stacks`` (none where ``stacks`` is None). The refusals'
    messages of its series, one per file."""
    frames = np.stack([np.full((16, 16), 100 * i, dtype=np.int16) for i in range(len(z))])
    write_enhanced_ct(path, frames, z)
    ds = pydicom.dcmread(path)
    for n, group in enumerate(ds.PerFrameFunctionalGroupsSequence):
        if stacks is not None:
            content = Dataset()
            content.StackID, content.InStackPositionNumber = stacks[n], n % (len(z) // 2) + 1
            group.FrameContentSequence = DicomSequence([content])
        if sagittal_from is not None and n >= sagittal_from:
            plane = Dataset()
            plane.ImageOrientationPatient = SAGITTAL
            group.PlaneOrientationSequence = DicomSequence([plane])
    save(ds, path)
    out = assemble([(_ref(1), slice_geometry(pydicom.dcmread(path, stop_before_pixels=True)))], CFG)
    assert not out.series
    return [f"{issue.reason}: {issue.message}" for issue in out.issues]


def test_one_object_of_an_axial_and_a_sagittal_stack_is_told_to_pack_its_frames_one_by_one(tmp_path: Path) -> None:
    """Stack 1 axial, stack 2 sagittal, in one file: series_orientation said "a reformat or a
    localizer exported into the series: remove it", and there is no file to remove."""
    (message,) = _two_stacks(tmp_path / "e.dcm", [0.0, 2.0, 4.0, 6.0] * 2, sagittal_from=4,
                             stacks=["1"] * 4 + ["2"] * 4)
    assert message.startswith("series_orientation: ")
    assert "remove it" not in message
    assert "one multi-frame object" in message and "StackID 2 against 1" in message
    assert "sample: slice and frames: split" in message


def test_one_object_of_two_axial_stations_is_told_to_pack_its_frames_one_by_one(tmp_path: Path) -> None:
    """Two axial stations 94 mm apart in one file: series_gap said "restore the missing file"."""
    (message,) = _two_stacks(tmp_path / "e.dcm", [0.0, 2.0, 4.0, 6.0, 100.0, 102.0, 104.0, 106.0],
                             stacks=["1"] * 4 + ["2"] * 4)
    assert message.startswith("series_gap: ") and "a step of 94.000 mm" in message
    assert "restore the missing file" not in message
    assert "one multi-frame object" in message and "StackID 1 against 2" in message
    assert "sample: slice and frames: split" in message


def test_one_object_whose_frames_nothing_tells_apart_is_still_told_it_is_one_object(tmp_path: Path) -> None:
    """Without a Stack ID (a three-plane scout saved as one object; frames of one object missing
    between two runs) the record cannot name what separates the frames, but still that they are
    one file's, the slice job, and (for a gap) the tolerance for an object irregular by design."""
    (turned,) = _two_stacks(tmp_path / "scout.dcm", [0.0, 2.0, 4.0, 6.0], sagittal_from=2)
    assert turned.startswith("series_orientation: ") and "remove it" not in turned
    assert "one multi-frame object" in turned and "sample: slice and frames: split" in turned
    assert "against" not in turned
    (gap,) = _two_stacks(tmp_path / "gap.dcm", [0.0, 2.0, 4.0, 12.0, 14.0, 16.0])
    assert gap.startswith("series_gap: ") and "restore the missing file" not in gap
    assert "one multi-frame object" in gap and "sample: slice and frames: split" in gap
    assert "raise series.gap_tolerance" in gap
