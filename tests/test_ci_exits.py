"""How a CI job's ``packer`` run ends when the job, not the data, goes wrong: cancelled while the
command line still loads, out of open files, and what ``packer validate`` tells the log."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from packer.cli import main
from tests.test_dicom_exports import export_job, write_export

REPO = Path(__file__).resolve().parents[1]

_CANCELLED_WHILE_LOADING = textwrap.dedent("""
    import importlib.abc, os, signal, sys

    class Cancelled(importlib.abc.MetaPathFinder):  # the signal lands while packer.cli is being imported
        def find_spec(self, name, path, target=None):
            if name == "packer.cli":
                os.kill(os.getpid(), signal.SIG{sig})
                signal.sigtimedwait([], 0.5)  # let the handler run here, inside the import
            return None

    sys.meta_path.insert(0, Cancelled())
    sys.argv = ["packer", "--help"]
    from packer.console import main
    main()
""")


def _cancel_while_loading(sig: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", _CANCELLED_WHILE_LOADING.format(sig=sig)], env=env,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_a_sigterm_while_the_command_line_loads_is_one_line_and_143_as_ctrl_c_is_130() -> None:
    """CI and batch schedulers cancel with SIGTERM at any moment, right after launch included: the
    README's 143 row (handled as Ctrl-C is) holds before packer.cli is loaded, not only after."""
    term = _cancel_while_loading("TERM")
    assert term.returncode == 143, (term.returncode, term.stderr)
    assert term.stderr.strip() == "packer: stopped by SIGTERM" and term.stdout == ""
    ctrl_c = _cancel_while_loading("INT")
    assert ctrl_c.returncode == 130, (ctrl_c.returncode, ctrl_c.stderr)
    assert ctrl_c.stderr.strip() == "packer: interrupted"


def test_once_loaded_the_command_handles_sigterm_itself_and_a_parents_choice_is_kept() -> None:
    """The loading-time handler is gone once the command line is loaded (packer.commands installs
    its own only over the default), and a SIGTERM a parent set to be ignored stays ignored."""
    script = textwrap.dedent("""
        import signal, sys
        from packer import console
        sys.argv = ["packer", "--version"]
        if {ignore}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            console.main()
        except SystemExit:
            pass
        print(signal.getsignal(signal.SIGTERM).name)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for ignore, expected in ((False, "SIG_DFL"), (True, "SIG_IGN")):
        run = subprocess.run([sys.executable, "-c", script.format(ignore=ignore)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines()[-1] == expected


def test_validate_says_where_its_left_out_files_are_listed_and_its_stdout_is_one_line(tmp_path: Path) -> None:
    """A build lists the files left out on purpose in excluded.jsonl; packer validate writes no such
    file (its list is the report's excluded.records), so its log must not send anyone to one. The
    line is a progress note, on stderr: validate's stdout is its opening line alone (README, 141)."""
    job = export_job(tmp_path, tmp_path / "raw")
    write_export(tmp_path / "raw")
    env = {"PACKER_WORK_DIR": str(tmp_path / "work")}
    run = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "--json",
                                    str(tmp_path / "v.json")], env=env)
    assert run.exit_code == 0, run.output
    assert len(run.stdout.splitlines()) == 1 and "input files, running on" in run.stdout
    assert ("5 files left out on purpose by their headers (not_image 2, not_requested 3); not bad samples, listed "
            "in the validate report's excluded.records") in run.stderr
    assert "excluded.jsonl" not in run.output and not list(tmp_path.rglob("excluded.jsonl"))

    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env=env)
    assert built.exit_code == 0, built.output
    assert "5 files left out on purpose by their headers (not_image 2, not_requested 3); not bad samples, listed " \
           "in excluded.jsonl" in built.stderr
    assert len(list((tmp_path / "out").rglob("excluded.jsonl"))) == 1


_TABLE_OUT_OF_FILES = textwrap.dedent("""
    import os, resource, sys
    from packer.config import load_job
    from packer.errors import PackerError
    from packer.pipeline.tables import read_records

    source = load_job(sys.argv[1]).sources[0]
    read_records(source)  # everything it imports, imported
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:  # every descriptor the limit allows taken: the table's open is refused with EMFILE
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        read_records(source)
    except PackerError as err:
        for fd in held:
            os.close(fd)
        print(type(err).__name__, err.exit_code, err)
""")


def out_of_files(script: str, job: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (which takes every descriptor, then reads ``job``'s file) in a process of its
    own; it must print a ResourceError with exit code 6."""
    run = subprocess.run([sys.executable, "-c", script, str(job)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ResourceError 6 "), run.stdout
    return run


def test_out_of_open_files_reading_the_label_table_is_exit_6_not_the_tables_fault(tmp_path: Path) -> None:
    """A CI container's low `ulimit -n` is the machine's condition (README exit 6: raise `ulimit -n`,
    never blamed on a file): the table reader said "cannot read the table" and exit 2, as for a
    damaged table."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "labels.csv").write_text("path,label,entity\na.png,cat,p1\n", encoding="utf-8")
    job = tmp_path / "job.yaml"
    job.write_text("name: t\nsources:\n  - kind: image\n    root: raw\n    table: raw/labels.csv\n"
                   "split: {by: entity, ratios: {train: 1.0}}\npack: {format: webdataset}\noutput: out\n",
                   encoding="utf-8")
    run = out_of_files(_TABLE_OUT_OF_FILES, job)
    assert "raise the open-file limit (`ulimit -n" in run.stdout and "cannot read the table" not in run.stdout


def test_out_of_open_files_starting_the_local_dask_cluster_is_exit_6_with_the_ulimit_fix(tmp_path: Path) -> None:
    """The local cluster's worker processes failing to start for want of descriptors ended with
    exit 1 and advice about an `if __name__ == "__main__":` guard, which a command has no use for,
    below the nanny's "Failed to start process" traceback."""
    write_export(tmp_path / "raw")
    job = export_job(tmp_path, tmp_path / "raw")
    env = dict(os.environ, PYTHONPATH=str(REPO), PACKER_WORK_DIR=str(tmp_path / "work"))
    run = subprocess.run([sys.executable, "-m", "packer.cli", "validate", str(job), "--workers", "1"],
                         env=env, capture_output=True, text=True, timeout=300,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20)))
    said = [line for line in run.stderr.splitlines() if line.startswith("packer: error")]
    assert run.returncode == 6, run.stderr
    assert said and "raise the open-file limit (`ulimit -n" in said[-1] and "__main__" not in said[-1]
    assert "Traceback" not in run.stderr, run.stderr  # the nanny's own record of it, held back: one line says it


_JOB_OUT_OF_FILES = textwrap.dedent("""
    import os, resource, sys
    from packer.config import load_job
    from packer.errors import PackerError

    load_job(sys.argv[1])  # everything it imports, imported
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:  # every descriptor the limit allows taken: the job file's open is refused with EMFILE
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        load_job(sys.argv[1])
    except PackerError as err:
        for fd in held:
            os.close(fd)
        print(type(err).__name__, err.exit_code, err)
""")


def test_out_of_open_files_reading_the_job_file_is_exit_6_not_the_jobs_fault(tmp_path: Path) -> None:
    """The job file met with no descriptor left said "cannot read the job file" and exit 2, a config
    error; like the table's, it is the machine's condition: exit 6 with the ulimit fix."""
    (tmp_path / "raw").mkdir()
    job = tmp_path / "job.yaml"
    job.write_text("name: t\nsources:\n  - kind: image\n    root: raw\n    label: none\n"
                   "split: {by: entity, ratios: {train: 1.0}}\npack: {format: webdataset}\noutput: out\n",
                   encoding="utf-8")
    run = out_of_files(_JOB_OUT_OF_FILES, job)
    assert "raise the open-file limit (`ulimit -n" in run.stdout and "job.yaml" in run.stdout
