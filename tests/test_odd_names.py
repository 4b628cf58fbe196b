"""Odd names under a local root: folders nested past PATH_MAX, names that are not valid UTF-8 on
files and on folder links. Each is a record naming the file and the fix, never a crash, and
``packer locate`` gives back the real name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from packer.config import load_job
from packer.pipeline.discover import discover


def write_png(path: bytes | Path, seed: int) -> None:
    ok, encoded = cv2.imencode(".png", np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    assert ok
    with open(path, "wb") as out:
        out.write(encoded.tobytes())


def image_job(folder: Path, **overrides: Any) -> Path:
    """A job file in ``folder`` over the image source ``folder/raw`` (labels from folders)."""
    doc = {"name": "odd", "sources": [{"kind": "image", "name": "photos", "root": "raw", "label": "folder"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out", "phi": {"mode": "keep"},
           **overrides}
    (folder / "job.yaml").write_text(yaml.safe_dump(doc))
    return folder / "job.yaml"


def test_a_folder_nested_past_path_max_is_told_to_be_shortened_not_chmod_ed(tmp_path: Path) -> None:
    """18 folders of 242-byte names make a path longer than PATH_MAX (4096 bytes on Linux): the
    walk cannot list the deepest, and the fix is a shorter path; chmod cannot make it readable."""
    for label in ("cat", "dog"):
        (tmp_path / "raw" / label).mkdir(parents=True)
        write_png(tmp_path / "raw" / label / "a.png", len(label))
    fd = os.open(tmp_path / "raw" / "dog", os.O_RDONLY)
    try:
        for depth in range(18):  # made relative to an open folder: no path this long is ever passed
            name = "x" * 240 + f"{depth:02d}"
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        deep = os.open("deep.png", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
        os.close(deep)
    finally:
        os.close(fd)
    found = discover(load_job(image_job(tmp_path)))
    assert sorted(r.relpath for r in found.refs) == ["cat/a.png", "dog/a.png"]
    (issue,) = found.issues
    assert issue.reason == "unreadable" and issue.path.startswith(str(tmp_path / "raw" / "dog" / ("x" * 240)))
    assert "this folder cannot be listed (File name too long)" in issue.message
    assert "longer than the operating system allows" in issue.message and "shorten" in issue.message
    assert "chmod" not in issue.message


def test_folder_links_whose_names_are_not_utf8_get_their_records_with_the_names_escaped(tmp_path: Path) -> None:
    """A link ``cat/r\\xe9sultats -> ../dog`` (a Latin-1 name) and one ``cat/archiv\\xe9`` to a folder
    outside the root crashed discovery (surrogates not allowed, hashing the name); each gets the
    record a link of a UTF-8 name gets, its name escaped as a file's that is not valid UTF-8."""
    for folder in ("raw/cat", "raw/dog", "outside"):
        (tmp_path / folder).mkdir(parents=True)
    write_png(tmp_path / "raw" / "cat" / "a.png", 1)
    write_png(tmp_path / "raw" / "dog" / "b.png", 2)
    write_png(tmp_path / "outside" / "c.png", 3)
    raw = os.fsencode(tmp_path / "raw")
    os.symlink(b"../dog", raw + b"/cat/r\xe9sultats")
    os.symlink(b"../../outside", raw + b"/cat/archiv\xe9")
    found = discover(load_job(image_job(tmp_path)))
    assert sorted(r.relpath for r in found.refs) == ["cat/a.png", "dog/b.png"]
    root = str(tmp_path / "raw")
    (outside,) = found.issues
    assert (outside.reason, outside.path) == ("outside_root", f"{root}/cat/archiv\\xe9")
    assert outside.message.startswith(f"{root}/cat/archiv\\xe9 is a link to the folder {tmp_path / 'outside'}, "
                                      "outside the source root")
    (through,) = found.excluded
    assert (through.why, through.path) == ("folder_link", f"{root}/cat/r\\xe9sultats/b.png")
    assert f"this file is packed once, as {root}/dog/b.png" in through.detail
    assert len({outside.sample_id, through.sample_id, *(r.sample_id for r in found.refs)}) == 4


def test_locate_gives_back_the_real_bytes_of_a_name_that_is_not_utf8(tmp_path: Path) -> None:
    """``caf\\xe9.png`` (Latin-1) is an unreadable bad sample whose record holds the name escaped;
    ``packer locate -z`` printed that escaped text, which is the name of another file here
    (``caf\\\\xe9.png``, with a real backslash): xargs -0 opened the wrong one. Under -z the
    name's own bytes come out; a line quotes it as a JSON string that gives them back, while
    the backslash-named file's line is its bare name."""
    import json

    from click.testing import CliRunner

    from packer.cli import main

    folder = tmp_path / "raw" / "c"
    folder.mkdir(parents=True)
    latin1 = os.fsencode(folder) + b"/caf\xe9.png"
    write_png(latin1, 1)
    write_png(folder / "caf\\xe9.png", 2)
    write_png(folder / "ok.png", 3)
    job = image_job(tmp_path)
    found = discover(load_job(job))
    (bad,) = found.issues
    assert bad.reason == "unreadable" and bad.path == f"{folder}/caf\\xe9.png"
    literal = next(r.sample_id for r in found.refs if r.relpath == "c/caf\\xe9.png")
    assert literal != bad.sample_id

    nul = CliRunner().invoke(main, ["locate", "-z", str(job), bad.sample_id, literal])
    assert nul.exit_code == 0, nul.output
    assert nul.stdout_bytes.split(b"\0")[:-1] == [bad.sample_id.encode() + b"\t" + latin1,
                                                   literal.encode() + b"\t" + os.fsencode(folder) + b"/caf\\xe9.png"]
    lines = CliRunner().invoke(main, ["locate", str(job), bad.sample_id, literal])
    assert lines.exit_code == 0, lines.output
    shown = dict(line.split("\t") for line in lines.stdout_bytes.decode("utf-8").splitlines())
    assert shown[bad.sample_id] == f'"{folder}/caf\\udce9.png"'
    assert os.fsencode(json.loads(shown[bad.sample_id])) == latin1
    assert shown[literal] == f"{folder}/caf\\xe9.png"


def test_an_unsupported_file_whose_name_is_not_utf8_has_an_id_of_its_own(tmp_path: Path) -> None:
    """``caf\\xe9.webp`` (Latin-1; a format the image source does not read) and ``caf\\\\xe9.webp``
    (a real backslash) are two files: their ``unsupported_format`` records are two samples'
    records, not one id given twice (the escaped text alone is the other file's name)."""
    folder = tmp_path / "raw" / "c"
    folder.mkdir(parents=True)
    write_png(folder / "ok.png", 1)
    for name in (os.fsencode(folder) + b"/caf\xe9.webp", os.fsencode(folder / "caf\\xe9.webp")):
        with open(name, "wb") as out:
            out.write(b"RIFF\x1a\x00\x00\x00WEBPVP8 " + bytes(20))
    found = discover(load_job(image_job(tmp_path)))
    left_out = [e for e in found.excluded if e.why == "unsupported_format"]
    assert len(left_out) == 2
    assert len({e.sample_id for e in left_out} | {r.sample_id for r in found.refs}) == 3
