"""Multi-frame clips (ultrasound cines, fades, long loops): what makes a clip a bad sample, and
the keys its frames are packed under.

A file whose every frame is flat carries no information whether its frames are packed one
sample each or stacked as channels, even where each frame's grey is another; a long cine's frame
keys sort as text in frame order, so ``pack.order: path`` keeps its frames in time order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dicom_files import config, image_dataset, make_ref, save, window
from pydicom.uid import UltrasoundMultiFrameImageStorage

from packer.read.dicom import read_dicom
from packer.records import Issue


def _us_clip(frames: np.ndarray, path: Path) -> Path:
    """An RGB ultrasound cine (F×H×W×3, uint8), 30 frames a second."""
    return save(image_dataset(frames, photometric="RGB", modality="US", sop_class=UltrasoundMultiFrameImageStorage,
                              FrameTime="33.3"), path)


def _fade(count: int = 6) -> np.ndarray:
    """Every frame one flat grey, the grey another each frame (a fade, a blank loop)."""
    frames = np.zeros((count, 8, 8, 3), np.uint8)
    for frame in range(count):
        frames[frame] = 20 * frame
    return frames


def test_a_clip_whose_every_frame_is_flat_is_a_constant_image_bad_sample_however_its_frames_are_packed(
        tmp_path: Path) -> None:
    """A fade was packed as one blank sample per frame, each saying the file's other frames carry
    information (and that a file whose every frame is constant is constant_image): the file as a
    whole has many values, so the whole-file check let it through. Split or stacked, no frame of
    it carries information: the file is a constant_image bad sample, the message naming frames."""
    path = _us_clip(_fade(), tmp_path / "fade.dcm")
    for frames in ("split", "stack"):
        result = read_dicom(make_ref(path), config(window(127.5, 256), frames=frames))
        assert isinstance(result, Issue), frames
        assert (result.stage, result.reason) == ("validate", "constant_image")
        assert "every one of its 6 frames is constant" in result.message, result.message
        assert "frame 1: every pixel has the same stored value [20, 20, 20]" in result.message
        assert "and 3 more" in result.message


def test_a_clip_with_one_frame_of_content_is_packed_its_flat_frames_saying_so(tmp_path: Path) -> None:
    """One frame with content among flat ones: the file packs, and each flat frame (only those)
    says it carries no information."""
    frames = _fade()
    frames[3] = np.random.default_rng(0).integers(0, 256, frames[3].shape, dtype=np.uint8)
    result = read_dicom(make_ref(_us_clip(frames, tmp_path / "mostly.dcm")), config(window(127.5, 256)))
    assert isinstance(result, list) and len(result) == 6
    warned = [bool(s.metadata.get("warnings")) for s in result]
    assert warned == [True, True, True, False, True, True]
    assert result[0].metadata["warnings"][0].startswith("constant frame: every pixel has the same stored value")


def test_in_a_series_job_flat_frames_are_slices_its_series_judges(tmp_path: Path) -> None:
    """A series job reads a multi-frame file's frames as slices of its series: each flat one is
    context, a constant slice, and the series (not the file) is refused when every slice is."""
    result = read_dicom(make_ref(_us_clip(_fade(), tmp_path / "fade.dcm")), config(window(127.5, 256),
                                                                                   sample="volume"))
    assert isinstance(result, list) and len(result) == 6
    assert all(s.metadata["warnings"][0].startswith("constant slice: ") for s in result)
