"""How a CI job's ``packer`` run ends when the job, not the data, goes wrong: cancelled while the
command line still loads, out of open files, and what ``packer validate`` tells the log."""

from __future__ import annotations

import os
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
