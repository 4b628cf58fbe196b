"""A table whose rows reach their files through a link to a folder inside the root (the
versioned layout ``raw/latest -> v2``, rows ``latest/0.png``): the listing does not enter such a
link (each file is listed once, at its real path), and where every row goes through it the job
stops naming the link and the rows to write, not a path_base that cannot help."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import discover


def _tree(tmp_path: Path, folder: str) -> Path:
    """Four PNGs in raw/v2, the link raw/latest -> v2, and a table naming them under ``folder``."""
    raw = tmp_path / "raw"
    (raw / "v2").mkdir(parents=True)
    for i in range(4):
        assert cv2.imwrite(str(raw / "v2" / f"{i}.png"), np.full((8, 8), 40 * i, np.uint8))
    os.symlink("v2", raw / "latest")
    (raw / "t.csv").write_text("path,label,entity\n" + "".join(f"{folder}/{i}.png,{'ab'[i % 2]},e{i}\n"
                                                              for i in range(4)))
    doc = {"name": "t", "sources": [{"kind": "image", "name": "photos", "root": str(raw), "table": str(raw / "t.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
           "transform": {"image": {"size": [8, 8]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path / "job.yaml"


def test_every_row_through_a_folder_link_is_told_the_link_and_the_real_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        discover(load_job(_tree(tmp_path, "latest")))
    said = str(err.value)
    assert "none of the table's 4 rows names a file under" in said
    assert ("the rows name the files through a link to a folder inside the root, which the listing does not enter"
            in said), said
    assert "the cell 'latest/0.png' goes through the link 'latest'; the file is listed as 'v2/0.png'" in said, said
    assert "write the rows with the real folder's paths" in said and "path_base" not in said, said


def test_the_rows_written_as_advised_name_every_file(tmp_path: Path) -> None:
    found = discover(load_job(_tree(tmp_path, "v2")))
    assert sorted(ref.relpath or "" for ref in found.refs) == [f"v2/{i}.png" for i in range(4)]
