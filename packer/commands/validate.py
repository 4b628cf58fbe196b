"""``packer validate``: the CI data check (discover, read, split, audit; no shards written)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from packer.commands import exits


@click.command("validate")
@click.argument("job", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--quick", is_flag=True, help="Read headers only (labels, entities, times, unreadable files); "
              "skips decoding, so duplicate and pixel checks do not run: their rules are reported as skipped.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a machine-readable report (schemas/validate.schema.json) to this file ('-': stdout, "
                   "which then holds the report alone). It lists the bad and left-out files' raw paths and "
                   "messages: keep it local.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write JUnit XML (a test case for bad_fraction, one per audit rule, and empty_splits) for CI "
                   "dashboards; under PHI pseudonymization it names bad files by sample key only, so it may be "
                   "published ('-': stdout).")
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes of the local dask cluster.")
@click.option("--scheduler", metavar="ADDRESS",
              help="Run on an existing dask.distributed scheduler (tcp://host:port or a scheduler file), "
                   "or 'sync' to run in-process for debugging.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Option for the store of sources given as URLs, e.g. endpoint_url=http://127.0.0.1:9000 "
                   "(repeatable; AWS_* environment variables work too).")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@exits
def validate_command(job: Path, quick: bool, json_path: Path | None, junit_path: Path | None, workers: int | None,
                     scheduler: str | None, quiet: bool, storage_option: tuple[str, ...]) -> None:
    """Check JOB's data without building: every file is read and decoded, the split is applied
    and audited for leakage (entity overlap, exact and near duplicates across splits, time
    order). Prints a summary on stderr; lists cut short say how many entries they left out.

    A split whose ratio (or time cutoff) asked for samples but that got none is a warning: in
    the summary, in the --json report's "warnings" and as the JUnit case empty_splits (which
    passes). So is what the stages warn of as they run (every file its own entity, split shares
    off the ratios, leaks a policy accepts, label conflicts): printed then, and listed in the
    --json report's "warnings" by code. Without --quick, samples of several shapes or dtypes,
    which no batch stacks, are warned of as the build does (several_shapes, several_dtypes).
    Warnings do not change the exit code.

    The --json and --junit files are written on exits 0, 3 and 4 (a failed check still leaves its
    reports to publish), not on 2 (the job could not be checked) or later codes.

    \b
    Exit codes: 0 clean · 2 usage/config error · 3 bad fraction over validate.max_bad_fraction
    · 4 leakage found · 6 the --json/--junit file could not be written (disk full or read-only)
    · 7 the dask scheduler was lost (--scheduler) · 130 interrupted (Ctrl-C) · 143 stopped by SIGTERM
    · 141 the output's reader went away (| head): stopped there · 1 internal error.
    """
    from packer.api import validate
    from packer.storage import parse_storage_options

    json_path, junit_path = _stdout_dash(json_path), _stdout_dash(junit_path)
    if json_path is not None and junit_path is not None and (os.path.abspath(json_path) == os.path.abspath(junit_path)
                                                             or _is_stdout(json_path) and _is_stdout(junit_path)):
        raise click.UsageError(f"--json and --junit both write {json_path}: one report would replace or run into the "
                               "other; give each its own file")
    # a report on stdout stays one document: the opening line, stdout's only other text, goes to stderr
    to_stdout = any(p is not None and _is_stdout(p) for p in (json_path, junit_path))
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        result = validate(job, quick=quick, workers=workers, scheduler=scheduler, progress=not quiet,
                          storage_options=parse_storage_options(storage_option))
    click.echo(result.summary(), err=True)
    if json_path is not None:
        result.write_json(json_path)
    if junit_path is not None:
        result.write_junit(junit_path)
    if result.exit_code != 0:
        # the summary above already says what failed: exit with its code and no "packer: error:" line
        # (a PackerError would add one); ``exits`` lets click's Exit through, click exits with its code
        raise click.exceptions.Exit(result.exit_code)


def _stdout_dash(path: Path | None) -> Path | None:
    """``-`` for a report file means stdout, as for most command-line tools (else a file named ``-``)."""
    return Path("/dev/stdout") if path is not None and str(path) == "-" else path


def _is_stdout(path: Path) -> bool:
    """Whether writing ``path`` writes this process's stdout (``/dev/stdout``, ``/proc/self/fd/1``, or
    the very file stdout was redirected to)."""
    try:
        named, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):  # no such file yet (a report to write), or stdout closed/not a file descriptor
        return False
    return (named.st_dev, named.st_ino) == (out.st_dev, out.st_ino)
