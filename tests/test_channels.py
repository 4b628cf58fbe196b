"""transform.channels: one channel count for a whole dataset, by documented rules, never a silent reshape."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.badsamples import read_bad_samples
from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.transform.channels import LUMA, Mapped, channel_rule, match_channels
from tests.dicom_files import save, secondary_capture_rgb
from tests.helpers import demo_job_doc, write_job

CT_WINDOWS = ["lung", "mediastinum", "bone_body"]


def natural_doc(demo_raw: Any, out: Path) -> dict[str, Any]:
    """The demo job with the same windows but no transform.channels: each sample keeps its own count."""
    doc = demo_job_doc(demo_raw.root, out)
    doc["transform"] = copy.deepcopy(doc["transform"])
    doc["transform"].pop("channels", None)
    doc["transform"]["dicom"]["windows"] = CT_WINDOWS
    return doc


def run(doc: dict[str, Any], folder: Path) -> BuildResult:
    return build(load_job(write_job(folder, doc)), BuildOptions(scheduler="sync", quiet=True, html_report=False))


def samples_of(result: BuildResult) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    """Every packed sample, read with stock webdataset: key -> (image, the .json member)."""
    shards = sorted(str(p) for p in result.version_dir.glob("*.tar"))
    return {s["__key__"]: (s["npy"], s["json"]) for s in wds.WebDataset(shards, shardshuffle=False).decode()}


@pytest.fixture(scope="module")
def builds(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuildResult]:
    root = tmp_path_factory.mktemp("channels")
    return {"channels": run(demo_job_doc(demo_raw.root, root / "out-channels"), root / "job-channels"),
            "natural": run(natural_doc(demo_raw, root / "out-natural"), root / "job-natural")}


@settings(max_examples=200, deadline=None)
@given(natural=st.integers(1, 6), target=st.integers(1, 6), color=st.booleans(),
       dtype=st.sampled_from(["uint8", "uint16", "float16"]), height=st.integers(1, 5), width=st.integers(1, 5),
       seed=st.integers(0, 2**32 - 1))
def test_channel_rules_keep_replicate_luma_and_refuse_everything_else(natural: int, target: int, color: bool,
                                                                      dtype: str, height: int, width: int,
                                                                      seed: int) -> None:
    rng = np.random.default_rng(seed)
    image = (rng.random((natural, height, width)) * 200).astype(dtype)
    got = match_channels(image, target, color=color)
    rule = channel_rule(natural, target, color=color)
    if natural == target:
        assert isinstance(got, Mapped) and got.rule == rule == "keep" and got.image is image
    elif natural == 1:
        assert isinstance(got, Mapped) and got.rule == "replicate" and got.image.shape == (target, height, width)
        assert all(np.array_equal(channel, image[0]) for channel in got.image)
    elif color and natural == 3 and target == 1:
        assert isinstance(got, Mapped) and got.rule == "luma" and got.image.shape == (1, height, width)
        want = sum(w * image[i].astype(np.float64) for i, w in enumerate(LUMA))
        if image.dtype.kind == "u":
            want = np.rint(want)
        assert got.image.dtype == image.dtype
        assert np.allclose(got.image[0].astype(np.float64), want, atol=0.01 * max(1.0, float(np.abs(want).max())))
    else:
        assert rule is None and isinstance(got, str)
        assert f"{natural} channels" in got and f"asks for {target}" in got


@pytest.mark.parametrize(("transform", "named"), [
    ({"channels": 3, "dicom": {"windows": ["lung", "mediastinum"]}},
     ["transform.dicom.windows", "gives 2 channel(s)", "source(s) ct", "list 3 windows", "sources=[...]"]),
    ({"channels": 3, "dicom": {"windows": CT_WINDOWS, "modality_windows": {"CR": ["lung", "bone"]}}},
     ["transform.dicom.modality_windows.CR", "ct (Modality CR)", "list 3 windows for CR"]),
    ({"channels": 1, "dicom": {"windows": ["lung"]}, "image": {"color": "rgb"}},
     ["transform.image.color (rgb)", "source(s) photos", "color: gray"]),
    # the per-kind key is named as the job wrote it (the message said transform.channels, which the job lacked)
    ({"dicom": {"windows": ["lung"]}, "image": {"color": "rgb", "channels": 2}},
     ["transform.image.color (rgb)", "gives 3 channel(s)", "transform.image.channels is 2",
      "drop transform.image.channels and"]),
    ({"dicom": {"windows": ["lung", "bone"], "channels": 3}},
     ["transform.dicom.windows", "transform.dicom.channels is 3", "drop transform.dicom.channels and"]),
])
def test_a_count_the_job_fixes_that_cannot_be_mapped_is_a_config_error_naming_source_and_fix(
        demo_raw: Any, tmp_path: Path, transform: dict[str, Any], named: list[str]) -> None:
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["transform"] = transform
    job = write_job(tmp_path, doc)
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    for text in [str(job), *named]:
        assert text in str(caught.value)
    result = CliRunner().invoke(main, ["build", str(job)])
    assert result.exit_code == 2 and "transform." in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("transform", [
    {"channels": 1, "dicom": {"windows": ["lung"], "modality_windows": {"CR": ["file"]}}, "image": {"color": "gray"}},
    {"channels": 3, "dicom": {"windows": CT_WINDOWS}, "image": {"color": "gray"}},      # grey photos replicated
    {"dicom": {"windows": CT_WINDOWS, "channels": 3}, "image": {"color": "rgb", "channels": 3}},
    {"channels": 4, "dicom": {"windows": ["lung"], "output": "float16"}, "image": {"color": "gray"}},
])
def test_counts_that_map_are_accepted(demo_raw: Any, tmp_path: Path, transform: dict[str, Any]) -> None:
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["transform"] = transform
    job = load_job(write_job(tmp_path, doc))
    assert job.dicom.channels == transform.get("channels", transform["dicom"].get("channels"))


def test_a_job_without_channels_keeps_its_identity(demo_raw: Any, tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, natural_doc(demo_raw, tmp_path / "out")))
    transform = job.identity()["transform"]
    assert "channels" not in transform["dicom"] and "channels" not in transform["image"]


def test_channels_give_every_sample_one_shape_by_the_documented_rules(builds: dict[str, BuildResult]) -> None:
    manifest = builds["channels"].manifest
    assert manifest["sample_schema"]["shape"] == [3, 64, 64]
    assert manifest["sample_schema"]["shapes"] == {"ct": [[3, 64, 64]], "photos": [[3, 64, 64]]}
    natural = samples_of(builds["natural"])
    mapped = samples_of(builds["channels"])
    assert set(natural) == set(mapped)
    replicated = 0
    for key, (image, info) in mapped.items():
        own, own_info = natural[key]
        assert image.shape == (3, 64, 64) and image.dtype == own.dtype == np.uint8
        if own.shape[0] == 1:     # the CR radiograph, with its own file window: replicated
            replicated += 1
            assert info["metadata"]["channels"] == {"from": 1, "rule": "replicate"}
            assert info["metadata"]["modality"] == "CR"
            assert all(np.array_equal(channel, own[0]) for channel in image)
        else:                     # CT slices (3 windows) and RGB photos: kept, byte for byte
            assert np.array_equal(image, own) and "channels" not in info["metadata"]
            assert info == own_info
    assert replicated == 1


def test_a_colour_dicom_to_one_channel_is_the_luma_of_its_unrounded_values_rounded_once(tmp_path: Path) -> None:
    """16-bit RGB packed as uint8 with transform.channels: 1 took the luma of the already rounded
    uint8 R, G, B and rounded again: about one pixel in five one level off the README's
    round(255 · (0.299 R + 0.587 G + 0.114 B) / 65535). The luma is now taken from the unrounded
    values, in a single-frame file and in each frame of a split one. 8-bit RGB, whose levels
    the first rounding never changed, packs byte for byte as the rule on its stored values."""
    rng = np.random.default_rng(20)
    rgb16 = rng.integers(0, 65536, (2, 16, 16, 3)).astype(np.uint16)
    rgb8 = rng.integers(0, 256, (12, 12, 3)).astype(np.uint8)
    raw = tmp_path / "raw"
    for name, pixels in (("rgb16", rgb16), ("rgb8", rgb8)):
        ds = secondary_capture_rgb(pixels)
        ds.PatientID = name
        save(ds, raw / f"{name}.dcm")
    doc = {"name": "luma", "sources": [{"kind": "dicom", "name": "sc", "root": str(raw), "label": "none",
                            "where": {"SOPClassUID": "Secondary Capture Image Storage"}}],
           "split": {"by": "entity", "ratios": {"train": 1.0}, "seed": 1},
           "transform": {"channels": 1, "dicom": {"windows": ["file"], "output": "uint8"}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "phi": {"mode": "keep"}}
    packed = samples_of(run(doc, tmp_path / "job"))
    assert len(packed) == 3
    for image, info in packed.values():
        assert image.dtype == np.uint8 and info["metadata"]["channels"] == {"from": 3, "rule": "luma"}
        if image.shape == (1, 12, 12):
            np.testing.assert_array_equal(image, match_channels(rgb8.transpose(2, 0, 1), 1, color=True).image)
            continue
        frame = rgb16[info["metadata"]["frame"]].astype(np.float64)
        luma = LUMA[0] * frame[..., 0] + LUMA[1] * frame[..., 1] + LUMA[2] * frame[..., 2]
        np.testing.assert_array_equal(image[0], np.rint(255 * luma / 65535))


def test_a_count_only_the_file_tells_that_cannot_be_mapped_makes_it_a_bad_shape_sample(
        demo_raw: Any, tmp_path: Path) -> None:
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["transform"]["dicom"]["frames"] = "stack"      # a 3-frame file × 3 windows = 9 channels
    doc["validate"] = {"max_bad_fraction": 0.5}
    result = run(doc, tmp_path / "job")
    records = [r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl") if r["reason"] == "bad_shape"]
    assert [Path(r["path"]).name for r in records] == ["ct_multiframe.dcm"]
    assert records[0]["stage"] == "transform"
    assert "9 channels" in records[0]["message"] and "asks for 3" in records[0]["message"]
    assert "frames: split" in records[0]["message"]
    assert result.manifest["sample_schema"]["shape"] == [3, 64, 64]
    assert json.loads(result.manifest_path.read_text())["bad_samples"]["by_reason"]["bad_shape"] == 1


def test_a_count_that_cannot_become_one_channel_says_what_can(demo_raw: Any, tmp_path: Path) -> None:
    # said "only 1 channel (replicated) or exactly 1 can be mapped": replication is no way to one channel
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    doc["transform"] = {"channels": 1, "dicom": {"windows": ["lung", "bone"]}, "image": {"color": "gray"}}
    with pytest.raises(ConfigError) as caught:
        load_job(write_job(tmp_path, doc))
    said = str(caught.value)
    assert "only 1 channel (replicated) or exactly 1" not in said, said
    assert ("transform.channels is 1: only a sample of exactly 1 channel, or of 3 colour channels of a colour DICOM "
            "(their luminance), can be mapped, never a silent reshape") in said, said


@pytest.mark.parametrize(("windows", "channels", "said"), [
    (["abdomen"], 1, "the stack's 3 slices (sample: {neighbors: 1}) times 1 channel(s) a slice make 3: set "
                     "transform.channels to 3;"),
    (["abdomen", "liver"], 3, "the stack's 3 slices (sample: {neighbors: 1}) times 2 channel(s) a slice make 6: set "
                              "transform.channels to 6, or give 'vol' 1 channel(s) a slice"),
])
def test_a_nifti_stack_whose_channel_count_is_set_by_its_neighbours_names_them(
        tmp_path: Path, windows: list[str], channels: int, said: str) -> None:
    """A 2k+1-slice stack has (2k+1) × windows channels: the error blamed transform.nifti.windows and
    asked for windows making 1 channel, which no windows can do under neighbors: 1."""
    (tmp_path / "vol").mkdir()
    job = write_job(tmp_path, {
        "name": "stack", "sources": [{"kind": "nifti", "name": "vol", "root": str(tmp_path / "vol"), "label": "none"}],
        "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"),
        "transform": {"channels": channels, "nifti": {"windows": windows, "sample": {"neighbors": 1}}}})
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    message = str(caught.value)
    assert "transform.nifti.sample: gives" in message and said in message, message
