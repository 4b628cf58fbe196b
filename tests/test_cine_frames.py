"""Multi-frame clips (ultrasound cines, fades, long loops): what makes a clip a bad sample, and
the keys its frames are packed under.

A file whose every frame is flat carries no information whether its frames are packed one
sample each or stacked as channels, even where each frame's grey is another; a long cine's frame
keys sort as text in frame order, so ``pack.order: path`` keeps its frames in time order.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from dicom_files import config, image_dataset, make_ref, save, window
from pydicom.uid import UltrasoundMultiFrameImageStorage

from packer.config import LimitsConfig, load_job
from packer.keys import KeyParts, frame_key, make_key, parse_key
from packer.read.dicom import read_dicom
from packer.read.kinds import source_kind
from packer.read.nifti_kind import read_nifti
from packer.records import Excluded, Issue, MemberIssue, SampleRef
from tests.helpers import write_job


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
    # the file's own display (no window a colour file would be told it does not take)
    result = read_dicom(make_ref(_us_clip(frames, tmp_path / "mostly.dcm")), config())
    assert isinstance(result, list) and len(result) == 6
    warned = [bool(s.metadata.get("warnings")) for s in result]
    assert warned == [True, True, True, False, True, True]
    assert result[0].metadata["warnings"][0].startswith("constant frame: every pixel has the same stored value")


def test_in_a_series_job_flat_frames_are_slices_its_series_judges(tmp_path: Path) -> None:
    """A series job reads a multi-frame file's frames as slices of its series: each flat one is
    context, a constant slice, and the series (not the file) is refused when every slice is."""
    result = read_dicom(make_ref(_us_clip(_fade(), tmp_path / "fade.dcm")), config(sample="volume"))
    assert isinstance(result, list) and len(result) == 6
    assert all(s.metadata["warnings"][0].startswith("constant slice: ") for s in result)


def test_frame_keys_are_padded_to_the_files_last_frame_so_they_sort_as_text_in_frame_order() -> None:
    """Keys went -f9999 then -f10000, which sorts as text between -f1000 and -f1001: a long cine
    packed under pack.order: path (which orders a file's samples by key) came out of time order.
    A frame is padded to the width of its file's last frame index, at least 4 digits: a file of up
    to 10,000 frames (limits.max_frames' default) keeps the keys it always had."""
    assert frame_key("us-0123456789abcdef", 7, 10_000) == "us-0123456789abcdef-f0007"
    assert frame_key("us-0123456789abcdef", 9_999, 10_000) == "us-0123456789abcdef-f9999"
    assert frame_key("us-0123456789abcdef", 7, 10_001) == "us-0123456789abcdef-f00007"
    assert make_key("us-0123456789abcdef", frame=7, frames=100_000) == "us-0123456789abcdef-f00007"
    assert frame_key("us-0123456789abcdef", 7, 100_001) == "us-0123456789abcdef-f000007"
    keys = [frame_key("us-0123456789abcdef", i, 10_005) for i in range(10_005)]
    assert sorted(keys) == keys
    assert parse_key("us-0123456789abcdef-f00007") == KeyParts("us-0123456789abcdef", frame=7)
    assert parse_key("us-0123456789abcdef-f10004") == KeyParts("us-0123456789abcdef", frame=10_004)


def test_a_cine_of_more_than_10000_frames_is_keyed_in_frame_order(tmp_path: Path) -> None:
    """The reader keys a 10,001-frame clip -f00000 … -f10000 (limits.max_frames raised), one width."""
    frames = np.zeros((10_001, 2, 2, 3), np.uint8)
    frames[:, 0, 0, 0] = np.arange(10_001) % 256
    frames[:, 1, 1, 1] = np.arange(10_001) // 256
    frames[:, 0, 1, 2] = 255
    path = _us_clip(frames, tmp_path / "long.dcm")
    result = read_dicom(make_ref(path), config(window(127.5, 256)), limits=LimitsConfig(max_frames=20_000))
    assert isinstance(result, list), result
    keys = [s.key for s in result]
    assert (keys[0], keys[9_999], keys[10_000]) == ("s1-f00000", "s1-f09999", "s1-f10000")
    assert sorted(keys) == keys and [parse_key(k).frame for k in keys] == list(range(10_001))


def test_nifti_slice_keys_are_padded_as_frames_and_named_before_reading_as_after(tmp_path: Path) -> None:
    """A NIfTI file's slices are keyed as frames: a series of 10,001 time points (X, Y, T) gives
    -f00000 … -f10000, and the keys the header pass names (what validate --quick counts) are the
    reader's."""
    values = np.zeros((2, 2, 10_001), np.int16)
    values[0, 0, :] = np.arange(10_001) % 500
    values[1, 1, :] = 7
    root = tmp_path / "raw"
    root.mkdir()
    nib.save(nib.Nifti1Image(values, np.diag([1.0, 1.0, 1.0, 1.0])), root / "long.nii.gz")
    (root / "cases.csv").write_text("path,entity\nlong.nii.gz,A\n")
    job = load_job(write_job(tmp_path, {
        "name": "long", "sources": [{"kind": "nifti", "root": "raw", "table": "raw/cases.csv", "label": "none"}],
        "split": {"by": "entity", "ratios": {"train": 1.0}},
        "transform": {"nifti": {"windows": [{"center": 250, "width": 500}]}}, "pack": {"format": "webdataset"},
        "limits": {"max_frames": 20_000}, "output": "out"}))
    ref = SampleRef(sample_id="nt-0123456789abcdef", source="raw", kind="nifti", path=str(root / "long.nii.gz"),
                    relpath="long.nii.gz", label=None, entity="A", time=None)
    kind = source_kind("nifti")
    probed = kind.probe(ref, job.sources[0], job, keep=False, placement=False)
    assert not isinstance(probed, Issue | Excluded | MemberIssue), probed
    named = kind.sample_keys(ref, probed.state, job)
    read = read_nifti(ref, job)
    assert isinstance(read, list), read
    assert [s.key for s in read] == list(named)
    assert (named[0], named[-1]) == ("nt-0123456789abcdef-f00000", "nt-0123456789abcdef-f10000")
    assert sorted(named) == list(named)
