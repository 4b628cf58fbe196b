"""Where a report goes and what it shows.

The output: :func:`packer.files.atomic_output` replaces a regular file atomically (a temporary
beside it, renamed over it), but a path that is no regular file is written *into*: a FIFO
(``packer report V -o >(gzip > r.gz)``), ``/dev/stdout``, ``/dev/null``; renaming over one would
replace the pipe or, as root, the device node with a file. A symbolic link stays a link: the
file it points to is what is replaced. The special files here are FIFOs and links in a temporary
folder, never a real device.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from click.testing import CliRunner

from packer.cli import main as CLI
from packer.files import TMP_SUFFIX, atomic_output
from tests.photo_jobs import build_tree, write_tree


class FifoReader:
    """Reads everything written into the FIFO at ``path``, on a thread (opening a FIFO waits for
    its other end)."""

    def __init__(self, path: Path) -> None:
        self.got = b""
        self._thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self._thread.start()

    def _read(self, path: Path) -> None:
        with open(path, "rb") as fh:
            self.got = fh.read()

    def result(self) -> bytes:
        self._thread.join(10)
        assert not self._thread.is_alive(), "nothing opened the FIFO for writing: the report went elsewhere"
        return self.got


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX))


def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path: Path) -> None:
    for shared in (False, True):
        fifo = tmp_path / f"report-{shared}.fifo"
        os.mkfifo(fifo)
        reader = FifoReader(fifo)
        with atomic_output(fifo, shared=shared) as fh:
            fh.write(b"<!DOCTYPE html>")
        assert reader.result() == b"<!DOCTYPE html>"
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []


def test_a_link_to_a_file_stays_a_link_and_its_file_is_replaced_atomically(tmp_path: Path) -> None:
    real = tmp_path / "reports" / "report.html"
    real.parent.mkdir()
    real.write_bytes(b"old")
    before = os.stat(real).st_ino
    link = tmp_path / "latest.html"
    link.symlink_to(real)
    with atomic_output(link, shared=True) as fh:
        fh.write(b"new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b"new"
    assert os.stat(real).st_ino != before  # a new file renamed over it, never written in place
    assert leftovers(tmp_path) == [] and leftovers(real.parent) == []


def test_a_dangling_link_gets_its_file_and_stays_a_link(tmp_path: Path) -> None:
    link = tmp_path / "latest.html"
    link.symlink_to("report.html")  # relative, as ln -s writes it
    with atomic_output(link) as fh:
        fh.write(b"new")
    assert link.is_symlink() and (tmp_path / "report.html").read_bytes() == b"new"


def test_a_link_to_a_fifo_writes_into_the_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "out.html"
    link.symlink_to(fifo)
    reader = FifoReader(link)
    with atomic_output(link, shared=True) as fh:
        fh.write(b"into the pipe")
    assert reader.result() == b"into the pipe"
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_regular_file_is_still_replaced_by_rename(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_bytes(b"old")
    before = os.stat(target).st_ino
    with atomic_output(target) as fh:
        fh.write(b"new")
    assert target.read_bytes() == b"new" and os.stat(target).st_ino != before


def test_packer_report_writes_into_a_fifo_named_by_o(tmp_path: Path) -> None:
    write_tree(tmp_path / "raw")
    version = build_tree(tmp_path, "out")
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    result = CliRunner().invoke(CLI, ["report", str(version), "-o", str(fifo)])
    assert result.exit_code == 0, result.output
    assert reader.result().startswith(b"<!DOCTYPE html>")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []
