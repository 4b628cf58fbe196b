"""What the command line says when it stops: each message names the file or folder at fault and a fix
that the command it came from can follow."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main


def refuse_writes_under(monkeypatch: pytest.MonkeyPatch, folder: Path, code: int, *, named: bool) -> None:
    """Path.write_bytes/write_text under ``folder`` fail with ``code``: ``named`` as an open() on a read-only
    mount does (the error carries the file name), or not, as a write() on a full disk does (it carries none)."""
    real_bytes, real_text = Path.write_bytes, Path.write_text

    def refused(self: Path) -> OSError:
        return OSError(code, os.strerror(code), str(self)) if named else OSError(code, os.strerror(code))

    def write_bytes(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.is_relative_to(folder):
            raise refused(self)
        return real_bytes(self, *args, **kwargs)

    def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.is_relative_to(folder):
            raise refused(self)
        return real_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize(("code", "named", "said"), [
    (errno.ENOSPC, False, "the file system is full (No space left on device); free space there, or "),
    (errno.EROFS, True, "the file system is read-only (Read-only file system); "),
])
def test_demo_data_refused_by_the_file_system_names_what_it_could_not_write_and_another_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, named: bool, said: str) -> None:
    """demo-data has no --out: its fix is another DIRECTORY, and where the file system did not say which
    file it refused (a full disk's write()), the message names the folder it was writing into."""
    target = tmp_path / "demo"
    refuse_writes_under(monkeypatch, target, code, named=named)
    result = CliRunner().invoke(main, ["demo-data", str(target)])
    assert result.exit_code == 6, result.output
    message = result.output.split("packer: error: ", 1)[1].strip()
    assert "packer build" not in message and "--out" not in message
    if named:  # the file the file system named, under DIRECTORY
        written = message.removeprefix("cannot write ").split(": ", 1)[0]
        assert Path(written).is_relative_to(target) and Path(written).suffix, message
    else:
        assert message.startswith(f"cannot write a file in {target}: "), message
    assert message.endswith(f"{said}choose another DIRECTORY for packer demo-data"), message


PETS_JOB = """name: pets
sources:
  - kind: image
    root: raw
    label: folder
split:
  by: entity
  ratios: {train: 0.8, valid: 0.1, test: 0.1}
  seed: 17
transform:
  image: {size: [16, 16], color: rgb}
pack: {format: webdataset}
output: out
"""


def misspell(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.mark.parametrize(("old", "typo", "where", "meant"), [
    ("    label: folder", "    lable: folder", "sources[0].lable", "label"),  # a transposition, not 'table'
    ("    label: folder", "    lables: folder", "sources[0].lables", "labels"),
    ("split:", "splt:", "splt", "split"),
    ("  seed: 17", "  sed: 17", "split.sed", "seed"),
    ("  seed: 17", "  sede: 17", "split.sede", "seed"),
    ("  ratios:", "  ratio:", "split.ratio", "ratios"),
    ("output: out", "ouptut: out", "ouptut", "output"),
])
def test_an_unknown_key_names_the_allowed_key_the_user_most_likely_meant(
        tmp_path: Path, old: str, typo: str, where: str, meant: str) -> None:
    """Where two allowed keys are equally similar by difflib's measure ('lable': 'label' and 'table'), the one
    of the same length and the fewest edits (a swapped pair of letters is one), then sharing the most letters,
    is named: 'table' would lead to a second, different error."""
    job = tmp_path / "job.yaml"
    job.write_text(misspell(PETS_JOB, old, typo))
    result = CliRunner().invoke(main, ["validate", str(job), "--quick", "-q"])
    assert result.exit_code == 2, result.output
    assert result.output == f"packer: error: {job}: {where}: unknown key (did you mean {meant!r}?)\n"


def pets_job(tmp_path: Path, text: str = PETS_JOB) -> Path:
    """Ten small noise photos, five a class, under raw/<class>/, and a job over them."""
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "raw" / cls).mkdir(parents=True)
        for i in range(5):
            cv2.imwrite(str(tmp_path / "raw" / cls / f"{i}.png"), rng.integers(0, 255, (8, 8, 3), dtype=np.uint8))
    job = tmp_path / "job.yaml"
    job.write_text(text)
    return job


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="/proc (Linux) takes no folder of one's own")
def test_a_cache_folder_that_cannot_be_made_exits_6_without_promising_decoded_files_in_it(tmp_path: Path) -> None:
    """Refused before any file was decoded, the build has no cache to resume from: the message must not say
    that decoded files stay there and that the next build decodes only the rest."""
    job = pets_job(tmp_path)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q",
                                       "--cache-dir", "/proc/packer-no-cache"])
    assert result.exit_code == 6, result.output
    message = result.output.split("packer: error: ", 1)[1].strip()
    assert message.startswith("cannot write /proc/packer-no-cache/pets-"), message
    assert message.endswith("choose another cache folder (packer build --cache-dir DIR, or set PACKER_WORK_DIR)"), \
        message
    assert not (tmp_path / "out").exists()  # and nothing was left behind


@pytest.mark.parametrize(("inside", "fix"), [
    ({}, "it holds no key file: set phi.key_file to the key an earlier build of this dataset used, or make one "
         "with packer key new {keys}/NAME.key and set phi.key_file to that file"),
    ({"pets.key": "ab" * 32 + "\n", "README.txt": "keys live here\n", "old-key.txt": "cd" * 32 + "\n"},
     "set phi.key_file to the key file in it: {keys}/old-key.txt or {keys}/pets.key"),
])
def test_a_key_file_that_names_a_folder_is_told_to_name_the_key_file_in_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: dict[str, str], fix: str) -> None:
    """`key_file: keys`, the folder instead of the key in it: it was told to make the folder readable by this
    user, which it is."""
    monkeypatch.delenv("PACKER_PHI_KEY", raising=False)
    keys = tmp_path / "keys"
    keys.mkdir()
    for name, text in inside.items():
        (keys / name).write_text(text)
    job = pets_job(tmp_path, PETS_JOB + "phi:\n  mode: pseudonymize\n  key_file: keys\n")
    result = CliRunner().invoke(main, ["validate", str(job), "--quick", "-q", "--scheduler", "sync"])
    assert result.exit_code == 2, result.output
    assert result.output == (f"packer: error: {job}: phi.key_file: {keys} is a folder, not a key file; "
                             f"{fix.format(keys=keys)}\n")


def test_a_rebuild_that_writes_the_missing_html_report_again_says_so(tmp_path: Path) -> None:
    """A version whose report.html is gone (deleted, or a SIGTERM between manifest.json and report.html)
    gets it back from the same command; the summary said "nothing rewritten". A rebuild that finds the
    report as this build renders it leaves it alone, and says nothing was rewritten."""
    job = pets_job(tmp_path)
    first = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert first.exit_code == 0, first.output
    (report,) = (tmp_path / "out" / "pets").glob("*/report.html")
    report.unlink()
    second = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert second.exit_code == 0, second.output
    assert report.is_file()
    assert second.output.splitlines()[0].endswith(
        "(already built: shards and manifest as they were; its local reports rewritten where this build's differ: "
        "report.html)"), second.output
    third = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert third.exit_code == 0, third.output
    assert third.output.splitlines()[0].endswith("(already built: nothing rewritten)"), third.output
