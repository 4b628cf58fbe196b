"""Sample keys: one grammar (packer.keys) for every suffix a reader adds to a file's sample id,
and `packer locate` resolving every key the real readers make (frames, pages, tiles, pages' tiles).

The locate test takes its keys from the readers themselves (read_image on real PNG and multi-page
TIFF files), so a reader that grows a suffix locate cannot parse fails here.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from packer.cli import main
from packer.config import load_job
from packer.keys import KeyParts, frame_key, key_source, make_key, page_key, parse_key
from packer.pipeline.discover import discover
from packer.read.image import read_image
from packer.records import Issue
from tests.helpers import write_job

#: Sample ids as discovery makes them: safe_key(source) (which may itself look like a key:
#: "scan-p00001"), "-", 16 hex (which may be "f" and 15 digits), and -dupN after a collision.
IDS = st.builds(lambda source, digest, dup: f"{source}-{digest}{dup}",
                st.one_of(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,11}", fullmatch=True),
                          st.sampled_from(["scan-p00001", "ct-f0001", "x-t00000_00000"])),
                st.one_of(st.from_regex(r"[0-9a-f]{16}", fullmatch=True),
                          st.from_regex(r"f[1-9][0-9]{14}", fullmatch=True)),
                st.sampled_from(["", "-dup1", "-dup12"]))
INDEX = st.integers(min_value=0, max_value=2_000_000)
PARTS = st.one_of(
    st.builds(KeyParts, IDS),
    st.builds(KeyParts, IDS, frame=INDEX),
    st.builds(KeyParts, IDS, page=INDEX),
    st.builds(KeyParts, IDS, tile=st.tuples(INDEX, INDEX)),
    st.builds(KeyParts, IDS, page=INDEX, tile=st.tuples(INDEX, INDEX)),
)


@given(PARTS)
def test_parse_inverts_make_for_every_suffix_kind(parts: KeyParts) -> None:
    key = make_key(parts.file_id, frame=parts.frame, page=parts.page, tile=parts.tile)
    assert parse_key(key) == parts
    assert make_key(parse_key(key).file_id, frame=parts.frame, page=parts.page, tile=parts.tile) == key


def test_keys_are_written_as_the_readers_always_wrote_them() -> None:
    """Shards and indexes already published name samples so: the grammar keeps their spelling."""
    assert frame_key("ct-0123456789abcdef", 7) == "ct-0123456789abcdef-f0007"
    assert frame_key("ct-0123456789abcdef", 12345) == "ct-0123456789abcdef-f12345"
    assert page_key("img-00ff", 2) == "img-00ff-p00002"
    assert make_key("img-00ff", tile=(128, 0)) == "img-00ff-t00128_00000"
    assert make_key("img-00ff", page=1, tile=(0, 64)) == "img-00ff-p00001-t00000_00064"
    assert parse_key("img-00ff-p00001-t00000_00064") == KeyParts("img-00ff", page=1, tile=(0, 64))
    assert parse_key("ct-0123456789abcdef-f12345") == KeyParts("ct-0123456789abcdef", frame=12345)


@pytest.mark.parametrize(("key", "parts"), [
    ("a-f12", KeyParts("a-f12")),  # a frame index is at least 4 digits
    ("a-f0000000012", KeyParts("a-f0000000012")),  # ... and at most 9 (a longer file's frames pad to its last)
    ("a-p0001", KeyParts("a-p0001")),  # a page index is at least 5 digits
    ("a-t00001", KeyParts("a-t00001")),  # a tile is row_col
    ("a-t1_2", KeyParts("a-t1_2")),
    ("a-t00000_00000-p00001", KeyParts("a-t00000_00000", page=1)),  # the page comes before the tile
    ("a-p00001-f0001", KeyParts("a-p00001", frame=1)),  # no reader makes a page's frames
    ("ct-f123456789012345", KeyParts("ct-f123456789012345")),  # 16 hex, not a frame: at most 9 digits
])
def test_a_suffix_no_reader_makes_is_part_of_the_file_id(key: str, parts: KeyParts) -> None:
    """Not padded as readers pad, or in an order no reader writes: that part is the file id's, so
    each key has one reading, and make_key gives the key back from it."""
    assert parse_key(key) == parts
    assert make_key(parts.file_id, frame=parts.frame, page=parts.page, tile=parts.tile) == key


def test_make_key_refuses_what_no_reader_makes() -> None:
    with pytest.raises(ValueError, match="frame and a page"):
        make_key("a", frame=1, page=2)
    with pytest.raises(ValueError, match="0-based index"):
        make_key("a", tile=(-1, 0))
    with pytest.raises(ValueError, match="0-based index"):
        frame_key("a", 10**9)


def _texture(seed: int, height: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return cv2.resize(rng.integers(0, 256, (8, 8), dtype=np.uint8), (width, height), interpolation=cv2.INTER_CUBIC)


def _job(tmp_path: Path, *, tiled: bool) -> Path:
    """A job over a 3-page TIFF and a PNG (labels from a table); tiled: 32×32 tiles, no resize."""
    raw = tmp_path / "raw"
    (raw / "scans").mkdir(parents=True, exist_ok=True)
    ok, encoded = cv2.imencodemulti(".tiff", [_texture(page, 64, 96) for page in range(3)])
    assert ok
    (raw / "scans" / "stack.tiff").write_bytes(encoded.tobytes())
    cv2.imwrite(str(raw / "scans" / "photo.png"), _texture(9, 64, 64))
    (raw / "labels.csv").write_text("path,label,entity\nscans/stack.tiff,a,P1\nscans/photo.png,b,P2\n")
    image = {"tile": {"size": [32, 32]}} if tiled else {"size": [32, 32]}
    doc = {"name": "keys", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
           "split": {"by": "entity", "seed": 1}, "transform": {"image": image},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    return write_job(tmp_path / ("tiled" if tiled else "whole"), doc)


def _reader_keys(job_path: Path) -> dict[str, str]:
    """Every sample key the image reader makes for the job's files, with the file it read."""
    job = load_job(job_path)
    keys: dict[str, str] = {}
    for ref in discover(job).refs:
        samples = read_image(ref, job.image)
        assert not isinstance(samples, Issue), samples
        keys.update((sample.key, ref.path) for sample in samples)
    return keys


@pytest.mark.parametrize("tiled", [False, True], ids=["pages", "tiles"])
def test_locate_finds_the_file_of_every_page_and_tile_key(tmp_path: Path, tiled: bool) -> None:
    job = _job(tmp_path, tiled=tiled)
    keys = _reader_keys(job)
    suffixed = [key for key in keys if parse_key(key) != KeyParts(key)]
    # 3 pages (each 2×3 tiles when tiled), and the PNG's 2×2 tiles when tiled
    assert len(suffixed) == (3 * 6 + 4 if tiled else 3)
    result = CliRunner().invoke(main, ["locate", str(job), *keys])
    assert result.exit_code == 0, result.output
    found = dict(line.split("\t") for line in result.output.splitlines())
    assert found == keys


def test_locate_still_refuses_a_suffixed_key_of_a_file_the_job_does_not_have(tmp_path: Path) -> None:
    job = _job(tmp_path, tiled=True)
    result = CliRunner().invoke(main, ["locate", str(job), "image-0000000000000000-p00001-t00000_00032"])
    assert result.exit_code == 2
    assert "image-0000000000000000-p00001-t00000_00032: no file of" in result.output


@pytest.mark.parametrize(("tiled", "suffix"), [(False, "-t00000_00000"), (True, "-t00016_00000"),
                                               (True, "-t00000_00031")],
                         ids=["untiled-job", "off-the-stride-row", "off-the-stride-col"])
def test_locate_refuses_a_tile_key_the_job_cannot_make(tmp_path: Path, tiled: bool, suffix: str) -> None:
    """A real file's id with a tile suffix the job's transform.image.tile never cuts (no tiles
    at all, or a top-left pixel off the stride grid) is no sample of the job: exit 2, not the
    file's path as if the key were real (a typo in a key from a report must not look found).
    The message says the file is the job's and the tile is what it does not cut, not that the key
    is "another job's sample, or built with another PHI key"."""
    job = _job(tmp_path, tiled=tiled)
    file_id = next(parse_key(key).file_id for key, path in _reader_keys(job).items() if path.endswith("photo.png"))
    result = CliRunner().invoke(main, ["locate", str(job), file_id + suffix])
    assert result.exit_code == 2, result.output
    assert f"{file_id}{suffix}: no sample of" in result.output, result.output
    assert f"{file_id} is a file of the job, but the job cuts no tile at that top-left pixel" in result.output
    assert "another PHI key" not in result.output


@pytest.mark.parametrize(("tiled", "name", "suffix", "named"), [
    (True, "photo.png", "-t00000_00007", "-t00000_00000"),
    (True, "photo.png", "-t00047_00031", "-t00032_00000"),
    (True, "stack.tiff", "-p00001-t00016_00070", "-p00001-t00000_00064"),
    (False, "photo.png", "-t00000_00000", ""),
], ids=["off-the-stride-col", "off-the-stride-both", "a-pages-tile", "untiled-job"])
def test_locate_names_a_key_the_dataset_has_for_a_tile_the_job_does_not_cut(
        tmp_path: Path, tiled: bool, name: str, suffix: str, named: str) -> None:
    """Refusing a tile key off the job's grid, locate points to a key of that file the dataset
    does have: in a tiled job the grid's tile at or above and left of the pixel asked for, never
    the file id, which a tiled job packs no sample under. Before, it said "the sample of the
    whole file is <id>" in a tiled job too."""
    job = _job(tmp_path, tiled=tiled)
    keys = _reader_keys(job)
    file_id = next(parse_key(key).file_id for key, path in keys.items() if path.endswith(name))
    result = CliRunner().invoke(main, ["locate", str(job), file_id + suffix])
    assert result.exit_code == 2, result.output
    assert file_id + named in keys
    if tiled:
        assert file_id not in keys
        assert f"that pixel is the top-left one of {file_id + named}" in result.output, result.output
        assert "the sample of the whole file" not in result.output
    else:
        assert f"its samples of this file are keyed {file_id}" in result.output, result.output


def test_locate_refuses_a_frame_key_of_an_image_file(tmp_path: Path) -> None:
    """Frames come from DICOM and NIfTI files, never from an image: '<png id>-f0001' is no
    sample of the job (exit 2), while the same image's tile keys are located."""
    job = _job(tmp_path, tiled=True)
    keys = _reader_keys(job)
    file_id = next(parse_key(key).file_id for key, path in keys.items() if path.endswith("photo.png"))
    result = CliRunner().invoke(main, ["locate", str(job), file_id + "-f0001"])
    assert result.exit_code == 2, result.output
    assert f"{file_id}-f0001: no sample of" in result.output, result.output
    assert "is an image file of the job, and only DICOM and NIfTI files have frames" in result.output


def test_locate_refuses_a_page_key_of_a_png_or_jpeg_deciding_by_the_files_signature(tmp_path: Path) -> None:
    """Only a TIFF has pages (README: every page of a multi-page TIFF is a sample, keyed
    <id>-p00000): a page key, or a page's tile key, of a PNG or a JPEG is no sample of the job
    (exit 2), as a frame of a photo is not. The reader takes a file's format from its signature,
    not its name, and so does locate: the pages of a multi-page TIFF named .png are located.
    Before, any image file's page keys were located (exit 0)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    cv2.imwrite(str(raw / "photo.png"), _texture(1, 64, 64))
    cv2.imwrite(str(raw / "photo.jpg"), cv2.cvtColor(_texture(2, 64, 64), cv2.COLOR_GRAY2BGR))
    ok, encoded = cv2.imencodemulti(".tiff", [_texture(page, 64, 64) for page in range(2)])
    assert ok
    (raw / "stack-named.png").write_bytes(encoded.tobytes())
    doc = {"name": "pages", "sources": [{"kind": "image", "root": str(raw), "label": "none"}],
           "split": {"by": "entity", "seed": 1}, "transform": {"image": {"tile": {"size": [32, 32]}}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    job = write_job(tmp_path, doc)
    keys = _reader_keys(job)
    assert any(parse_key(key).page == 1 for key, path in keys.items() if path.endswith("stack-named.png"))
    located = CliRunner().invoke(main, ["locate", str(job), *keys])
    assert located.exit_code == 0, located.output
    for name, fmt in (("photo.png", "PNG"), ("photo.jpg", "JPEG")):
        file_id = next(parse_key(key).file_id for key, path in keys.items() if path.endswith(name))
        assert file_id + "-t00000_00000" in keys and not any(parse_key(key).page is not None for key in keys
                                                              if key.startswith(file_id))
        for key in (file_id + "-p00001", file_id + "-p00000-t00000_00000"):
            result = CliRunner().invoke(main, ["locate", str(job), key])
            assert result.exit_code == 2, (key, result.output)
            assert f"{key}: no sample of" in result.output, result.output
            assert (f"{file_id} is an image file of the job, and only TIFF files have pages (-pNNNNN): by its first "
                    f"bytes it is a {fmt} file") in result.output, result.output


def test_a_keys_source_is_read_from_its_file_id_whatever_its_suffix() -> None:
    """The loader names a mixed batch's sources from its keys where no manifest says them."""
    assert key_source("ct-0123456789abcdef") == "ct"
    assert key_source("my-site-0123456789abcdef-f0003") == "my-site"  # a source name with a dash
    assert key_source("photos-0123456789abcdef-dup1-p00002") == "photos"
    assert key_source("not a packer key") is None


def test_locate_prints_a_path_with_a_tab_or_line_break_quoted_and_as_it_is_under_z(tmp_path: Path) -> None:
    """One line per key, one tab per line, whatever the file is called: a path with a tab or a
    line break (legal in a Linux file name) is printed as a JSON string; -z prints it as it is,
    each record ended by NUL. Before, such a path split its key's line or added a tab."""
    import json

    raw = tmp_path / "raw" / "cat"
    raw.mkdir(parents=True)
    for n, name in enumerate(["new\nline.png", "tab\tx.png", '"quoted.png', "plain.png"]):
        cv2.imwrite(str(raw / name), _texture(n, 32, 32))
    doc = {"name": "odd", "sources": [{"kind": "image", "root": str(tmp_path / "raw"), "label": "folder"}],
           "split": {"by": "entity", "seed": 1}, "transform": {"image": {"size": [32, 32]}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    job = write_job(tmp_path, doc)
    keys = _reader_keys(job)
    assert len(keys) == 4
    result = CliRunner().invoke(main, ["locate", str(job), *keys])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 4 and all(line.count("\t") == 1 for line in lines), lines
    shown = dict(line.split("\t") for line in lines)
    found = {key: json.loads(path) if path.startswith('"') else path for key, path in shown.items()}
    assert found == keys
    assert shown[next(k for k, p in keys.items() if p.endswith("plain.png"))] == str(raw / "plain.png")
    nul = CliRunner().invoke(main, ["locate", "-z", str(job), *keys])
    assert nul.exit_code == 0, nul.output
    assert dict(record.split("\t", 1) for record in nul.output.split("\0")[:-1]) == keys
