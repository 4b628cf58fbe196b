"""A full, over-quota or read-only file system stops a run with a clear error (exit 6) that names
the file and the fix, never as an internal error; work already done stays usable.

The full disk is real: Linux's ``/dev/full`` answers every write with ENOSPC, and a writer's
open of its temporary file is pointed at it (not through a symlink left at the temporary's name:
a writer removes whatever it finds there first, since that may be a link to a published shard)."""

from __future__ import annotations

import builtins
import errno
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.errors import FileSystemError, refused_write
from packer.files import TMP_SUFFIX, atomic_output
from tests.helpers import demo_job_doc, write_job

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="/dev/full (Linux) gives real ENOSPC writes")


@pytest.mark.parametrize(("code", "said", "fix"), [
    (errno.ENOSPC, "the file system is full", "free space there, or choose another output folder"),
    (errno.EDQUOT, "the disk quota is used up", "free space within the quota"),
    (errno.EROFS, "the file system is read-only", "choose another output folder (packer build --out DIR)"),
    (errno.EFBIG, "the file is over the file system's size limit", "lower pack.max_bytes"),
])
def test_a_refused_write_names_the_file_the_cause_and_the_fix(code: int, said: str, fix: str) -> None:
    error = refused_write(OSError(code, os.strerror(code)), "/data/out/train-000001.tar")
    assert isinstance(error, FileSystemError) and error.exit_code == 6
    assert str(error).startswith(f"cannot write /data/out/train-000001.tar: {said} ({os.strerror(code)}); ")
    assert fix in str(error)


def test_a_file_over_the_size_limit_is_told_to_lower_pack_max_bytes_only_where_it_is_a_shard() -> None:
    """pack.max_bytes sizes shards and no other file: a spill file of the build cache (a chunk of
    decoded files) over the file size limit was told to lower it, which changed nothing."""
    efbig = OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    for shard in ("/out/train-000001.tar", "/out/.test-000000.parquet.3f2a.partial"):
        assert "lower pack.max_bytes" in str(refused_write(efbig, shard))
    spill = str(refused_write(efbig, "/cache/job-1a2b/e14c511ad3905bf0.spill", elsewhere="choose another cache"))
    assert "pack.max_bytes" not in spill and spill.endswith("raise the file size limit (`ulimit -f`, the file "
                                                            "system's own), or choose another cache")


def test_only_the_file_systems_answers_count_and_permission_only_when_opening() -> None:
    for code in (errno.EIO, errno.ENOENT, errno.EMFILE):  # a read error or a bug stays what it is
        assert refused_write(OSError(code, os.strerror(code)), "x", opening=True) is None
    denied = OSError(errno.EACCES, os.strerror(errno.EACCES))
    assert refused_write(denied, "x") is None  # may be a read inside the writer's body
    opened = refused_write(denied, "/ro/x", opening=True, elsewhere="point TMPDIR at a folder with room")
    assert opened is not None and str(opened).endswith("make the folder writable for this user, "
                                                      "or point TMPDIR at a folder with room")


@needs_dev_full
def test_a_writer_on_a_full_disk_raises_the_error_and_leaves_no_file(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.files

    target = tmp_path / "train-000000.tar"

    def full_for_it(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return builtins.open(FULL if str(file) == f"{target}{TMP_SUFFIX}" else file, mode, *args, **kwargs)

    monkeypatch.setattr(packer.files, "open", full_for_it, raising=False)
    with pytest.raises(FileSystemError, match=f"cannot write {target}: the file system is full") as caught:
        with atomic_output(target) as fh:
            fh.write(b"x" * (1 << 20))
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # neither the shard nor its temporary name


def test_a_read_error_inside_a_writer_is_not_blamed_on_the_output(tmp_path: Path) -> None:
    with pytest.raises(OSError) as caught:
        with atomic_output(tmp_path / "x.tar") as fh:
            fh.write(b"abc")
            raise OSError(errno.EIO, "Input/output error", "/raw/spill")
    assert type(caught.value) is OSError and caught.value.filename == "/raw/spill"
    assert list(tmp_path.iterdir()) == []


@needs_dev_full
def test_a_build_whose_shards_meet_a_full_disk_exits_6_and_resumes_once_there_is_room(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.files

    def full_for_shards(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(".tar" + TMP_SUFFIX):
            return builtins.open(FULL, mode, *args, **kwargs)  # the kernel's own ENOSPC on write
        return builtins.open(file, mode, *args, **kwargs)

    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    monkeypatch.setattr(packer.files, "open", full_for_shards, raising=False)
    first = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--quiet"])
    assert first.exit_code == 6, first.output
    assert "internal error" not in first.output and "Traceback" not in first.output
    message = first.output.split("packer: error: ", 1)[1]
    assert message.startswith(f"cannot write {tmp_path / 'out' / 'demo'}/.staging-")
    assert ".tar: the file system is full (No space left on device); free space there, or choose another output " \
           "folder (packer build --out DIR). Files decoded before it stopped stay in the build cache" in message
    assert not list((tmp_path / "out" / "demo").glob("*/manifest.json"))  # nothing published

    monkeypatch.undo()  # room again: the decoded files are not decoded a second time
    second = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"])
    assert second.exit_code == 0, second.output
    assert "from the build cache" in second.output and list((tmp_path / "out" / "demo").glob("*/manifest.json"))


@pytest.mark.slow  # a real dask cluster
def test_a_run_defect_raised_on_a_dask_worker_comes_back_as_itself() -> None:
    from packer.pipeline.cluster import open_executor

    with open_executor(None, workers=1) as executor, pytest.raises(FileSystemError, match="cannot write /x: the fi"):
        list(executor.map_unordered(_refuse, [errno.ENOSPC]))


def _refuse(code: int) -> None:
    raise refused_write(OSError(code, os.strerror(code)), "/x") or AssertionError(code)


def test_a_file_where_a_writers_folder_must_be_is_a_config_error_naming_it(tmp_path: Path) -> None:
    from packer.errors import ConfigError

    (tmp_path / "reports").write_text("a file, not a folder")
    target = tmp_path / "reports" / "2026" / "validate.json"
    with pytest.raises(ConfigError) as caught, atomic_output(target) as fh:
        fh.write(b"{}")
    assert caught.value.exit_code == 2
    assert str(caught.value) == (f"cannot write {target}: {tmp_path / 'reports'} is a file, not a folder; "
                                 "remove it, or write elsewhere")


@pytest.mark.parametrize("code", [errno.EPERM, errno.EACCES, errno.EROFS])
def test_an_output_folder_that_cannot_be_made_exits_6_before_any_file_is_decoded(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """`--out` where the folder cannot be created (/sys, a read-only mount, no permission): the
    build decoded every file, then died at the pack stage with an internal error (exit 1)."""
    import packer.pipeline.build

    out = tmp_path / "out"
    real_mkdir = Path.mkdir

    def refused(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == out / "demo":
            raise OSError(code, os.strerror(code), str(self))
        real_mkdir(self, *args, **kwargs)

    decoded: list[object] = []
    monkeypatch.setattr(Path, "mkdir", refused)
    monkeypatch.setattr(packer.pipeline.build, "run_stages", lambda *a, **k: decoded.append(a) or None)
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, out))
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--quiet"])
    assert result.exit_code == 6, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    message = result.output.split("packer: error: ", 1)[1]
    assert message.startswith(f"cannot write {out / 'demo'}: ") and "choose another output folder" in message
    assert "Files decoded before it stopped" not in message  # none was
    assert decoded == [] and not out.exists()  # nothing ran, nothing left behind
