"""packer from Python: build, check and open datasets from pipelines and notebooks.

    import packer

    manifest = packer.build("workflows/demo.yaml", out="build", workers=2)   # -> Manifest
    result = packer.validate("workflows/demo.yaml")                          # -> ValidationResult
    manifest = packer.open("build/demo/dd135f309238")                        # -> Manifest

``packer build`` and ``packer validate`` are thin layers over :func:`run_build` and
:func:`validate`: the same job, the same options, the same bytes, the same errors. A job is a
job file's path, the mapping its YAML parses to (an orchestrator's task can write it in Python;
relative paths are then relative to ``base_dir``) or a loaded :class:`~packer.config.JobConfig`.

Errors are the command line's: every defect of the run raises a
:class:`~packer.errors.PackerError` subclass whose ``exit_code`` is what ``packer`` exits with
(``ConfigError`` 2, ``BadFractionError`` 3, ``LeakageError`` 4, ``IntegrityError`` 5,
``FileSystemError`` 6, also for a full or read-only disk met inside a library's write). Nothing
here exits the process; what is printed is progress (``progress=False`` silences it) and
warnings, on stderr as the command line prints them. A message that names an option names it as
the caller gave it: the keyword argument (``scheduler='...'``) from Python, the flag
(``--scheduler ...``) from ``packer build`` (:func:`packer.errors.surface`).
"""

from __future__ import annotations

import contextlib
import numbers
import os
import reprlib
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

from packer.config import JobConfig, job_from_mapping, load_job
from packer.errors import (
    PYTHON_API,
    BadFractionError,
    ConfigError,
    LeakageError,
    PackerError,
    a_type,
    called_from,
    exhausted,
    out_of_memory,
    refused_write,
    surface,
    surface_set,
)
from packer.manifest import Manifest, read_manifest
from packer.redact import Noted, job_scope, note_job, redact_names, redacting

if TYPE_CHECKING:  # the pipeline (dask, pyarrow) loads when a build or a check runs, not on import
    from packer.pipeline.build import BuildResult
    from packer.pipeline.datacheck import ValidateResult
    from packer.records import Issue

__all__ = ["Job", "StorageOptions", "ValidationResult", "build", "check_built", "load", "open", "run_build",
           "validate"]

#: What the calls take as a job: a job file (path), the mapping a job file's YAML parses to, or
#: a loaded job.
Job: TypeAlias = str | os.PathLike[str] | Mapping[str, Any] | JobConfig

#: What the calls take as ``storage_options``: a mapping of the filesystem's options, or the command
#: line's ``KEY=VALUE`` strings (a list or tuple; a lone str is refused at run time, as it would be
#: taken for its characters).
StorageOptions: TypeAlias = Mapping[str, Any] | Sequence[str] | None


def load(job: Job, *, base_dir: str | os.PathLike[str] | None = None) -> JobConfig:
    """The :class:`~packer.config.JobConfig` of ``job``: a job file (YAML), a mapping (what such
    a file parses to: validated against the same schema, with the same messages, naming the job
    ``<dict>``; relative paths are relative to ``base_dir``, by default the current folder) or a
    JobConfig, returned as it is. Raises ConfigError (exit code 2). Warns (``UnicodeWarning``)
    where Python decodes file names by a locale that is not UTF-8 (the ``packer`` command runs in
    UTF-8 mode there; a notebook or task does not): job files and tables are UTF-8, so a
    non-ASCII file name would not match its row."""
    encoding = sys.getfilesystemencoding().replace("-", "").lower()
    if encoding != "utf8":
        warnings.warn(f"Python decodes file names as {sys.getfilesystemencoding()} here (the locale), while job "
                      "files and tables are read as UTF-8: a file whose name is not ASCII will not match its table "
                      "row and gets another sample id than under a UTF-8 locale; run Python in UTF-8 mode (python -X "
                      "utf8, or PYTHONUTF8=1 in its environment), as the packer command does", UnicodeWarning,
                      stacklevel=3)
    if isinstance(job, JobConfig):
        return job
    if isinstance(job, Mapping):
        return job_from_mapping(job, base_dir=base_dir)
    if isinstance(job, str | os.PathLike) and isinstance(os.fspath(job), str):
        return load_job(Path(job))
    raise ConfigError(f"job={reprlib.repr(job)}: give a job file path (a str or a pathlib.Path), a mapping or a "
                      f"JobConfig, not {a_type(job)}")


def run_build(job: Job, *, out: str | os.PathLike[str] | None = None, workers: int | None = None,
              scheduler: str | os.PathLike[str] | None = None, progress: bool = True, report: bool = True,
              resume: bool = True, keep_spill: bool = False, cache_dir: str | os.PathLike[str] | None = None,
              storage_options: StorageOptions = None,
              base_dir: str | os.PathLike[str] | None = None) -> BuildResult:
    """Build ``job`` and return the run's facts: what :func:`build` returns comes from its
    manifest, and ``packer build`` prints its summary from them (reused or not, stage times,
    the report, the registry copy, where it was published).

    A bad fraction over ``validate.max_bad_fraction`` is not raised here: everything is written
    and ``result.over_threshold`` says so; :func:`check_built` raises it. The options are
    :func:`build`'s.
    """
    from packer.pipeline.build import BuildOptions
    from packer.pipeline.build import build as build_job
    from packer.storage import is_url

    _refuse_worker_reimport("build")
    with _one_job():
        workers, scheduler = _check_workers(workers), _scheduler(scheduler)
        _paths(out=out, cache_dir=cache_dir, base_dir=base_dir)
        _check_flags(progress=progress, report=report, resume=resume, keep_spill=keep_spill)
        options_given = _storage_options(storage_options)
        config = load(job, base_dir=base_dir)
        note_job(config)  # a JobConfig loaded before the call noted its roots in its caller's scope
        target = None if out is None else os.fspath(out) if is_url(os.fspath(out)) else Path(out)
        options = BuildOptions(out=target, workers=workers, scheduler=scheduler, quiet=not progress,
                               html_report=report, fresh=not resume, keep_spill=keep_spill,
                               cache_dir=None if cache_dir is None else Path(cache_dir),
                               storage_options=options_given)
        with _typed_errors():
            return build_job(config, options)


def check_built(result: BuildResult) -> None:
    """Raise BadFractionError (exit code 3) when the build's bad fraction is over the job's
    ``validate.max_bad_fraction``; its ``version_dir`` is the version written all the same."""
    from packer.pipeline.build import check_bad_fraction

    check_bad_fraction(result)


def build(job: Job, *, out: str | os.PathLike[str] | None = None, workers: int | None = None,
          scheduler: str | os.PathLike[str] | None = None, progress: bool = True, report: bool = True,
          resume: bool = True, keep_spill: bool = False, cache_dir: str | os.PathLike[str] | None = None,
          storage_options: StorageOptions = None,
          base_dir: str | os.PathLike[str] | None = None) -> Manifest:
    """Build the dataset ``job`` describes, as ``packer build`` does; return its manifest.

    Writes ``<output>/<name>/<version>/`` (shards, ``_index.parquet``, ``bad_samples.jsonl``,
    last of the dataset's files ``manifest.json``, then ``report.html``); the same inputs and job give the same
    version and bytes, whatever the options. ``out``: a folder instead of the job's ``output``,
    or a URL (``s3://bucket/prefix``) to publish to. ``workers``: processes of the local dask
    cluster (default one per core, at most 8); ``scheduler``: an existing dask scheduler's
    address or ``"sync"`` (in-process). ``progress``: progress lines on stderr. ``report``:
    write ``report.html``. ``resume``: reuse the build cache (False: ``--fresh``).
    ``keep_spill``, ``cache_dir``, ``storage_options``: as ``packer build``'s
    ``--keep-spill``, ``--cache-dir``, ``--storage-option``. ``base_dir``: for a job given as a
    mapping, the folder its relative paths are relative to.

    Returns the :class:`~packer.manifest.Manifest` (``location``, ``folder``, ``version``,
    ``dataset_hash``, ``splits``, ``label_map``); ``ShardDataset(manifest.location, "train")``
    loads it. Raises ConfigError (2), BadFractionError (3: everything was written, the error's
    ``version_dir`` names it), LeakageError (4), FileSystemError (6).
    """
    result = run_build(job, out=out, workers=workers, scheduler=scheduler, progress=progress, report=report,
                       resume=resume, keep_spill=keep_spill, cache_dir=cache_dir, storage_options=storage_options,
                       base_dir=base_dir)
    from packer.pipeline.build import dataset_warnings

    # what packer build warns of under its summary (an empty split, shapes no batch stacks), under --quiet
    # too: this call prints no summary, so on stderr, as the stages printed theirs, and before a failure
    _print_warnings(result.manifest["name"], (message for _, message in dataset_warnings(result.manifest)))
    check_built(result)
    if result.published is not None:  # the dataset lives at the URL now; the local folder was the work folder
        return read_manifest(result.published.manifest_url, storage_options=_storage_options(storage_options))
    return read_manifest(result.manifest_path)


@dataclass(frozen=True)
class ValidationResult:
    """What :func:`validate` found: the report ``packer validate --json`` writes, and the run.

    ``report``: that JSON document (``schemas/validate.schema.json``), lists capped as the file
    caps them. ``exit_code``: what ``packer validate`` exits with (0 clean, 3 bad fraction over
    the limit, 4 leakage); ``passed``: it is 0. ``findings``: every finding of every audit rule,
    by rule (the report lists the first 200 of each, as ``leakage.json``; the JUnit file 50);
    ``issues``: every bad sample. ``check()`` raises the failure as the typed error, for a task
    that must fail on it.
    """

    data_check: ValidateResult = field(repr=False, compare=False)
    #: What the check noted for redaction (its job's roots and names under pseudonymize): the
    #: errors of :meth:`write_json` and :meth:`write_junit` are redacted by this job alone.
    noted: Noted | None = field(default=None, repr=False, compare=False)

    @cached_property
    def report(self) -> dict[str, Any]:
        from packer.pipeline.datacheck import summary

        with called_from(PYTHON_API, unless_set=True):  # options named as this API takes them
            return summary(self.data_check)

    @property
    def exit_code(self) -> int:
        return self.data_check.exit_code

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def findings(self) -> dict[str, tuple[dict[str, Any], ...]]:
        """Rule name → its findings (all of them), in the audit's rule order."""
        audit = self.data_check.prepared.audit
        return {name: audit.rule(name).findings for name in self.report["audit"]["rules"]}

    @property
    def issues(self) -> tuple[Issue, ...]:
        """Every bad sample (path, stage, reason, message), in discovery order."""
        return tuple(self.data_check.prepared.issues)

    @property
    def warnings(self) -> tuple[str, ...]:
        """The warnings, which do not fail the check: a split asked for samples that got none, and
        what the stages warned of as they ran (every file its own entity, split shares off the
        ratios, leaks a policy accepts, label conflicts; the --json report's ``warnings``)."""
        return tuple(w["message"] for w in self.report["warnings"])

    def summary(self) -> str:
        """The summary ``packer validate`` prints."""
        from packer.pipeline.datacheck import format_summary

        with called_from(PYTHON_API, unless_set=True):  # options named as this API takes them
            return format_summary(self.data_check)

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write :attr:`report` as ``packer validate --json`` does. Raises FileSystemError (6)."""
        from packer.pipeline.datacheck import write_json

        with _one_job(self.noted), _typed_errors():
            write_json(self.data_check, Path(path))

    def write_junit(self, path: str | os.PathLike[str]) -> None:
        """Write JUnit XML as ``packer validate --junit`` does. Raises FileSystemError (6)."""
        from packer.pipeline.datacheck import write_junit

        with _one_job(self.noted), _typed_errors():
            write_junit(self.data_check, Path(path))

    def check(self) -> None:
        """Raise LeakageError (4) when an audit rule failed, else BadFractionError (3) when the
        bad fraction is over the limit; return when the check passed (warnings do not fail it)."""
        if self.exit_code == LeakageError.exit_code:
            from packer.pipeline.datacheck import failed_rules

            failed = [f"{name} ({count})" for name, count in failed_rules(self.report).items()]
            raise LeakageError(f"{self.report['job']}: the split audit failed: {', '.join(failed)}; the "
                               "findings say which entities or samples (ValidationResult.findings)")
        if self.exit_code == BadFractionError.exit_code:
            bad = self.report["bad_samples"]
            raise BadFractionError(f"{self.report['job']}: {bad['total']} of {self.report['inputs']['files']} input "
                                   f"files are bad ({bad['fraction']:.1%} > max_bad_fraction "
                                   f"{bad['max_fraction']:.1%}); ValidationResult.issues lists them")


def validate(job: Job, *, quick: bool = False, workers: int | None = None,
             scheduler: str | os.PathLike[str] | None = None, progress: bool = True,
             storage_options: StorageOptions = None,
             base_dir: str | os.PathLike[str] | None = None) -> ValidationResult:
    """Check ``job``'s data without building, as ``packer validate`` does: every file read and
    decoded (headers only with ``quick``), the split applied and audited. Writes nothing.

    A failed check is returned, not raised: ``result.exit_code`` is ``packer validate``'s and
    ``result.check()`` raises it. ``workers``, ``scheduler``, ``progress``, ``storage_options``,
    ``base_dir``: as :func:`build`'s. Raises ConfigError (2) for a job that cannot run (a bad
    job, a missing source folder, a malformed table).
    """
    from packer.pipeline.datacheck import validate_job

    _refuse_worker_reimport("validate")
    with _one_job() as noted:
        workers, scheduler = _check_workers(workers), _scheduler(scheduler)
        _paths(base_dir=base_dir)
        _check_flags(quick=quick, progress=progress)
        options_given = _storage_options(storage_options)
        config = load(job, base_dir=base_dir)
        note_job(config)  # a JobConfig loaded before the call noted its roots in its caller's scope
        with _typed_errors():
            checked = validate_job(config, quick=quick, workers=workers, scheduler=scheduler, quiet=not progress,
                                   storage_options=options_given)
        result = ValidationResult(data_check=checked, noted=noted)
        if surface().python:  # packer validate prints these in its summary; this call prints none
            from packer.pipeline.datacheck import closing_warnings

            _print_warnings(config.name, closing_warnings(result.report))
    return result


def open(location: str | os.PathLike[str] | Manifest, *,  # noqa: A001 - packer.open, as tarfile.open: read qualified
         storage_options: StorageOptions = None) -> Manifest:
    """The manifest of a built version: ``location`` is its version folder, its ``manifest.json``
    or a registry copy (``manifests/<name>/<version>.json``), a local path or a URL (``s3://...``,
    read with ``storage_options``), or a :class:`~packer.manifest.Manifest` (what :func:`build`
    returns), read again from its ``location``.

    Checked as the loader and ``packer inspect`` check it: the schema, the format version, and
    that the content still hashes to ``dataset_hash`` (the shards are not re-hashed: that is
    ``packer verify``). Raises ConfigError (2) for a path that is not a version (a dataset
    folder's error lists its versions) and IntegrityError (5) for a damaged or edited manifest.
    """
    with called_from(PYTHON_API, unless_set=True):
        options_given = _storage_options(storage_options)
        where = location.location if isinstance(location, Manifest) else _path_arg("location", location)
        return read_manifest(where, storage_options=options_given)


def _print_warnings(job_name: str, messages: Iterable[str]) -> None:
    """Print ``messages`` on stderr as warnings of the job ``job_name``, as the stages print theirs
    (``packer: warning: <job>: ...``, ``progress=False`` too): calls one after another or on threads
    of one process print into the same stderr, and a line must say whose it is."""
    for message in messages:
        print(f"packer: warning: {job_name}: {message}", file=sys.stderr, flush=True)


def _refuse_worker_reimport(call: str) -> None:
    """Raise ConfigError when this call runs while a spawned process (a local dask cluster's
    worker) imports the script that started the run again: the script calls packer at its top
    level, without the ``__main__`` guard. Left to run, the worker's call took the build's lock
    and failed with "another `packer build` ... is running", or started a cluster of its own
    inside the worker; the run's own error, naming the guard, came only after those. A call
    from a function of the script that a worker runs later is not refused: the script's module
    code is no longer running then."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            from packer.pipeline.cluster import UNGUARDED_SCRIPT

            script = frame.f_globals.get("__file__") or frame.f_code.co_filename
            raise ConfigError(f"{script}: calls packer.{call} at its top level, where a worker process that "
                              f"imports it again runs it too: {UNGUARDED_SCRIPT}")
        frame = frame.f_back


def _check_flags(**flags: object) -> None:
    """Each of ``flags`` a bool, as the command line's flags are: ``quick=0`` or ``quick="no"``
    ran the check (``"no"`` is truthy) and then failed naming ``--json``, an option the call never
    passed."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r}: give True or False")


def _storage_options(storage_options: object) -> dict[str, Any] | None:
    """``storage_options`` as a dict (None stays None): a mapping, or the command line's ``KEY=VALUE``
    strings, parsed as ``--storage-option`` parses them (:func:`packer.storage.parse_storage_options`,
    as ``ShardDataset`` takes them). Anything else is a ConfigError naming its type only: the
    options hold credentials, and the message must never repeat them."""
    if storage_options is None:
        return None
    if isinstance(storage_options, Mapping):
        return dict(storage_options)
    if isinstance(storage_options, list | tuple) and all(isinstance(pair, str) for pair in storage_options):
        from packer.storage import parse_storage_options
        return parse_storage_options(storage_options)
    raise ConfigError(f"storage_options: {a_type(storage_options)} (not shown: it may hold credentials); "
                      "give a mapping of the filesystem's options, as in "
                      "storage_options={'endpoint_url': 'http://127.0.0.1:9000'}, or a list of the command line's "
                      "KEY=VALUE strings")


def _path_arg(name: str, value: object, *, url: bool = True) -> str | os.PathLike[str]:
    """``value`` as a path argument takes it: a str or an ``os.PathLike`` of one (a ConfigError
    naming ``name=`` otherwise: pathlib's own TypeError named neither the argument nor the fix).
    ``url``: whether the argument also takes a URL (the message says what it takes)."""
    if isinstance(value, str | os.PathLike) and isinstance(os.fspath(value), str):
        return value
    what = "a path or a URL" if url else "a path"
    raise ConfigError(f"{name}={reprlib.repr(value)}: give {what} (a str or a pathlib.Path), not a value of "
                      f"type {type(value).__name__}")


def _paths(**paths: object) -> None:
    """Each of ``paths`` None or a path (:func:`_path_arg`); ``out`` may be a URL."""
    for name, value in paths.items():
        if value is not None:
            _path_arg(name, value, url=name == "out")


def _scheduler(scheduler: object) -> str | None:
    """``scheduler`` as the cluster code takes it: None (a local cluster), ``"sync"``, a dask
    scheduler's address, or its scheduler file, also as an ``os.PathLike`` (a bare file name
    is made ``./name``, so that it is read as the file even without ``.json``). A dask
    ``Client`` or cluster object is refused naming the address to pass instead (packer opens
    its own client: the caller's stays the caller's); anything else names the forms taken. It
    was a bare TypeError ("argument of type 'Client' is not iterable") from the cluster code."""
    if scheduler is None or isinstance(scheduler, str):
        return scheduler
    if isinstance(scheduler, os.PathLike) and isinstance(os.fspath(scheduler), str):
        path = os.fspath(scheduler)
        return path if os.sep in path or path.endswith(".json") else os.path.join(os.curdir, path)
    kind = type(scheduler).__name__
    address = getattr(scheduler, "scheduler_address", None)  # a dask cluster (its .scheduler is the Scheduler)
    fix = "cluster.scheduler_address"
    if not isinstance(address, str):
        address, fix = getattr(getattr(scheduler, "scheduler", None), "address", None), "client.scheduler.address"
    if isinstance(address, str):
        raise ConfigError(f"scheduler=<{kind}>: a dask {kind}, not an address; pass scheduler={fix} ({address!r}) "
                          "to run on its cluster (packer connects a client of its own)")
    raise ConfigError(f"scheduler={reprlib.repr(scheduler)}: give a dask scheduler's address ('tcp://host:8786'), "
                      "the file `dask scheduler --scheduler-file FILE` wrote (a str or a pathlib.Path), or 'sync' "
                      f"(in-process), not a value of type {kind}; leave scheduler None for a local cluster")


def _check_workers(workers: object) -> int | None:
    """``workers`` as ``--workers`` takes it (a whole number, at least 1) or None, as a Python int:
    any integer type (``np.int64(2)``, a numpy value read as the Python value it holds, as a job's
    are), not a bool (numpy's is no ``numbers.Integral``). 0 once meant the default silently and a
    negative count waited forever for a cluster that never started."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise ConfigError(f"workers={workers!r}: the local cluster needs a whole number of worker processes, "
                          "at least 1 (None: one per core, at most 8)")
    return int(workers)


@contextlib.contextmanager
def _one_job(noted: Noted | None = None) -> Iterator[Noted | None]:
    """One call's run: messages raised or printed inside name the keyword arguments, and the
    roots and names its job notes for redaction (:mod:`packer.redact`) are its own (``noted``:
    those of an earlier part of the same call; by default none), not what an earlier call of the
    process (or one running beside it on another thread) noted: the same job gives the same
    message whatever ran before. The command line, which runs these functions, keeps its own:
    it forgets them as each command starts and prints its errors redacted after the call returns."""
    if surface_set():
        yield None
        return
    with called_from(PYTHON_API), job_scope(noted) as scope:
        yield scope


@contextlib.contextmanager
def _typed_errors() -> Iterator[None]:
    """An OSError of a full, over-quota or read-only file system met in a library's write
    becomes FileSystemError, as the command line reports it, and running out of open files or
    memory a ResourceError (exit 6 there too); any other error stays what it is.
    Messages raised or printed inside name the keyword arguments, unless the command line called."""
    from_python = surface().python  # the command line prints its errors redacted itself
    try:
        with called_from(PYTHON_API, unless_set=True):
            yield
    except PackerError as err:
        # under PHI pseudonymization the names met in the data are hidden, as the command prints
        # them: a task's exception text lands in shared logs (packer.redact)
        if from_python and redacting() and err.args and isinstance(err.args[0], str):
            err.args = (redact_names(err.args[0]), *err.args[1:])
        raise
    except OSError as err:
        refused = refused_write(err, err.filename or "a file") or exhausted(err, err.filename or "a file")
        if refused is None:
            raise
        raise refused from err
    except MemoryError as err:
        raise out_of_memory(err) from err
