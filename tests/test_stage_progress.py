"""Progress on every long stage: a client stage prints its progress line (count, rate, ETA) on
stderr only once it has run a few seconds, obeys ``quiet``, and never changes what is built."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_cli_frictions import photo, photo_job
from test_split import BY_ENTITY, sample

from packer import progress as progress_module
from packer.config import load_job
from packer.pipeline import nearcopy
from packer.pipeline.audit import RULES, audit_assignment
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import discover
from packer.pipeline.nearcopy import EMBED_DIM, QUERY_ZOOMS, candidate_pairs
from packer.pipeline.split import assign_splits
from packer.progress import STAGE_DELAY, Progress, stage_progress


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def delayed(clock: Clock, stream: io.StringIO, *, quiet: bool = False, total: int | None = 10) -> Progress:
    return Progress("split", total, unit="groups", quiet=quiet, stream=stream, interval=10.0, delay=4.0,
                    show_bad=False, clock=clock)


def test_a_delayed_stage_that_ends_before_its_delay_prints_nothing() -> None:
    clock, stream = Clock(), io.StringIO()
    progress = delayed(clock, stream)
    for _ in range(9):
        clock.now += 0.4
        progress.update()
    progress.close()  # 3.6 s: under the 4 s delay
    assert stream.getvalue() == ""


def test_a_delayed_stage_prints_at_once_after_its_delay_then_every_interval_and_a_closing_line() -> None:
    clock, stream = Clock(), io.StringIO()
    progress = delayed(clock, stream)
    clock.now += 3.9
    progress.update(2)
    assert stream.getvalue() == ""
    clock.now += 0.1  # 4.0 s: the delay is over, and the next update says so at once
    progress.update(2)
    assert stream.getvalue() == "   split: 4/10 groups     1.0/s  eta     6s\n"
    clock.now += 9.9  # within the interval: no new line
    progress.update(1)
    assert stream.getvalue().count("\n") == 1
    clock.now += 0.1  # 14 s, one interval after the first line
    progress.update(2)
    clock.now += 1.0
    progress.update(3)
    progress.close()
    assert stream.getvalue().splitlines() == ["   split: 4/10 groups     1.0/s  eta     6s",
                                              "   split: 7/10 groups     0.5/s  eta     6s",
                                              "   split: 10/10 groups     0.7/s  eta     0s  (15.0s)"]


def test_a_stage_that_outlasts_its_delay_without_an_update_still_gets_its_closing_line() -> None:
    clock, stream = Clock(), io.StringIO()
    progress = delayed(clock, stream, total=None)  # an unknown total: count and rate, no ETA
    progress.update(3)
    clock.now += 6.0
    progress.close()
    assert stream.getvalue() == "   split: 3 groups     0.5/s  (6.0s)\n"


def test_quiet_prints_nothing_however_long_the_stage_runs() -> None:
    clock, stream = Clock(), io.StringIO()
    progress = delayed(clock, stream, quiet=True)
    for _ in range(10):
        clock.now += 30.0
        progress.update()
    progress.close()
    assert stream.getvalue() == ""


def test_on_a_terminal_the_delayed_line_is_redrawn_in_place_and_an_error_ends_it() -> None:
    clock, stream = Clock(), Terminal()
    with pytest.raises(RuntimeError), delayed(clock, stream) as progress:
        clock.now += 5.0
        progress.update(5)
        clock.now += 0.05  # under the terminal's 0.1 s redraw interval
        progress.update(1)
        clock.now += 0.1
        progress.update(1)
        raise RuntimeError("the stage failed")
    assert stream.getvalue() == ("\r   split: 5/10 groups     1.0/s  eta     5s"
                                 "\r   split: 7/10 groups     1.4/s  eta     2s\n")


def test_without_a_delay_the_first_line_waits_one_interval_and_the_closing_line_always_comes() -> None:
    clock, stream = Clock(), io.StringIO()  # the pixel pass's and the pack pass's lines, as before delays
    progress = Progress("pack", 4, unit="samples", stream=stream, interval=10.0, clock=clock)
    clock.now += 9.0
    progress.update(2)
    assert stream.getvalue() == ""
    clock.now += 1.0
    progress.update(1, bad=1)
    clock.now += 0.5
    progress.update(1)
    progress.close()
    assert stream.getvalue().splitlines() == ["    pack: 3/4 samples     0.3/s  eta     3s  bad 1",
                                              "    pack: 4/4 samples     0.4/s  eta     0s  bad 1  (10.5s)"]


def test_a_pass_waiting_for_results_keeps_printing_its_line_with_what_it_waits_on() -> None:
    """A pass whose workers were all paused for memory got no result and printed nothing, for
    ever: the line came only with a result. Waiting, it comes at the usual interval all the same,
    ending with the executor's note on the workers; under quiet, not at all."""
    clock, stream = Clock(), io.StringIO()
    progress = Progress("pack", 4, unit="samples", stream=stream, interval=10.0, clock=clock)
    clock.now += 10.0
    progress.update(1)
    for second in range(1, 26):  # no result for 25 s; the executor asks ten times a second, here once a second
        clock.now += 1.0
        progress.waiting("waiting: the dask worker is paused for memory" if second > 5 else "")
    assert stream.getvalue().splitlines() == [
        "    pack: 1/4 samples     0.1/s  eta    30s  bad 0",
        "    pack: 1/4 samples     0.1/s  eta    60s  bad 0  waiting: the dask worker is paused for memory",
        "    pack: 1/4 samples     0.0/s  eta    90s  bad 0  waiting: the dask worker is paused for memory"]

    quiet_stream = io.StringIO()
    quiet = Progress("pack", 4, unit="samples", quiet=True, stream=quiet_stream, interval=10.0, clock=clock)
    for _ in range(30):
        clock.now += 1.0
        quiet.waiting("waiting: the dask worker is paused for memory")
    assert quiet_stream.getvalue() == ""


def test_on_a_terminal_a_waiting_note_is_a_whole_line_once_an_interval_under_the_live_line() -> None:
    clock, terminal = Clock(), Terminal()
    progress = Progress("process", 4, stream=terminal, interval=10.0, clock=clock)
    clock.now += 1.0
    progress.update(1)
    for _ in range(150):  # 15 s of waiting, asked ten times a second
        clock.now += 0.1
        progress.waiting("waiting: the dask worker is paused for memory")
    lines = terminal.getvalue().split("\n")
    assert len(lines) == 3 and lines[-1].startswith("\r process: 1/4 files")  # two note lines, the live one after
    assert all(line.endswith("  bad 0  waiting: the dask worker is paused for memory") for line in lines[:2])


def test_a_client_stage_waits_a_few_seconds_read_when_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 3.0 <= STAGE_DELAY <= 5.0
    assert stage_progress("audit", 8, unit="rules").delay == STAGE_DELAY
    monkeypatch.setattr(progress_module, "STAGE_DELAY", 0.0)
    made = stage_progress("audit", 8, unit="rules")
    assert made.delay == 0.0 and not made.show_bad and made.stream is sys.stderr


# -- the stages, with no delay: each prints its line with the right total ---------------------


@pytest.fixture
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "STAGE_DELAY", 0.0)


def last_line(stage: str, err: str) -> str:
    """The stage's closing line (the one with its seconds)."""
    lines = [line for line in err.splitlines() if re.match(rf"\s*{stage}: .*\(\d+\.\ds\)$", line)]
    assert lines, f"no closing {stage} line in {err!r}"
    return lines[-1].strip()


def listed_tree(tmp_path: Path, files: int) -> Path:
    """``files`` images in ``files // 3 + 1`` folders and a table naming them all, and a job over them."""
    raw = tmp_path / "raw"
    rows = ["path,label,entity"]
    for i in range(files):
        rel = f"p{i // 3:02d}/{i:03d}.png"
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        (raw / rel).write_bytes(b"\x89PNG fake")
        rows.append(f"{rel},{'ab'[i % 2]},P{i // 3:02d}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    job = {"name": "t", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return tmp_path / "job.yaml"


def test_discovery_shows_the_walk_the_table_and_the_files_with_their_counts(
        tmp_path: Path, no_delay: None, capsys: pytest.CaptureFixture[str]) -> None:
    job = load_job(listed_tree(tmp_path, 14))  # 14 images and labels.csv, which the walk finds too
    assert len(discover(job).refs) == 14
    err = capsys.readouterr().err
    assert last_line("listing", err).startswith("listing: 15 files ")  # no total known while walking: no ETA
    assert "eta" not in last_line("listing", err)
    assert last_line("table", err).startswith("table: 14/14 files ")
    assert last_line("discover", err).startswith("discover: 14/14 files ")  # the images: labels.csv is not one
    assert "bad" not in err


def test_discovery_under_quiet_or_shorter_than_the_delay_prints_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_job(listed_tree(tmp_path, 14))
    discover(job)  # the real delay: a 15-file listing is far quicker
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress_module, "STAGE_DELAY", 0.0)
    discover(job, quiet=True)
    assert capsys.readouterr().err == ""


def test_the_split_counts_its_groups_and_the_audit_its_rules(no_delay: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    samples = [sample(i, f"P{i % 9}") for i in range(30)]  # 9 entities: 9 split groups
    assignment = assign_splits(samples, BY_ENTITY)
    audit = audit_assignment(samples, assignment, BY_ENTITY)
    err = capsys.readouterr().err
    assert last_line("split", err).startswith("split: 9/9 groups ")
    assert len(audit.rules) == RULES == 9
    assert last_line("audit", err).startswith("audit: 9/9 rules ")
    assign_splits(samples, BY_ENTITY, quiet=True)
    audit_assignment(samples, assignment, BY_ENTITY, quiet=True)
    assert capsys.readouterr().err == ""


def embeddings(n: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    out = rng.normal(0, 1, (n, len(QUERY_ZOOMS), EMBED_DIM))
    return (out / np.linalg.norm(out, axis=2, keepdims=True)).astype(np.float16)


@pytest.mark.parametrize("exact_limit", [nearcopy.EXACT_LIMIT, 20])  # 20: the inverted file answers
def test_the_candidate_search_counts_one_query_per_sample_and_zoom(
        exact_limit: int, no_delay: None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nearcopy, "EXACT_LIMIT", exact_limit)
    groups = np.arange(60) // 2
    candidate_pairs(embeddings(60), groups, 4)
    assert last_line("search", capsys.readouterr().err).startswith("search: 180/180 queries ")


def test_a_build_shows_every_client_stage_without_changing_a_byte(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [(f"p{i:02d}.png", photo(i), f"E{i // 2:02d}") for i in range(12)]
    job = load_job(photo_job(tmp_path, rows, split={"by": "entity", "ratios": {"train": 0.6, "valid": 0.2,
                                                                                "test": 0.2}, "seed": 3}))
    quiet = build(job, BuildOptions(out=tmp_path / "quiet", scheduler="sync", quiet=True))
    # 6 entities miss the ratios: a warning, printed under quiet too; no progress line
    assert all(line.startswith("packer: warning: ") for line in capsys.readouterr().err.splitlines())
    monkeypatch.setattr(progress_module, "STAGE_DELAY", 0.0)
    shown = build(job, BuildOptions(out=tmp_path / "shown", scheduler="sync"))
    err = capsys.readouterr().err
    shards = sum(len(split["shards"]) for split in shown.manifest["splits"].values())
    assert last_line("index", err).startswith(f"index: {shards}/{shards} shards ")
    assert last_line("search", err).startswith("search: 36/36 queries ")  # 12 samples, 3 zooms
    assert last_line("split", err).startswith("split: 6/6 groups ")
    assert last_line("audit", err).startswith("audit: 9/9 rules ")
    assert last_line("discover", err).startswith("discover: 12/12 files ")
    assert re.match(r"report: \d+/\d+ samples ", last_line("report", err))
    assert shown.manifest["dataset_hash"] == quiet.manifest["dataset_hash"]


def test_a_process_without_stderr_prints_no_progress_and_does_not_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """pythonw, a service, `python task.py 2>&-`: sys.stderr is None, and packer.build(progress=True)
    failed mid-build with an AttributeError from the progress line."""
    monkeypatch.setattr(sys, "stderr", None)
    clock = iter(range(0, 100, 20)).__next__
    with Progress("process", 3, clock=lambda: float(clock())) as progress:
        progress.update()
        progress.update(2)
    assert progress.quiet and progress.done == 3
