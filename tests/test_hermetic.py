"""No variable of the caller's environment changes a test's outcome.

``tests/conftest.py`` removes packer's, botocore's, OpenCV's and torchrun's variables for the
whole session and points ``PACKER_WORK_DIR`` at a session folder. Here: that cleaning on a
polluted environment, the session's own environment, and a child pytest run under a hostile
environment whose key-, store-, allocator-, rank- and TMPDIR-dependent tests must still pass.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from packer.storage import work_dir
from tests.helpers import REPO, clean_environment, is_hermetic_variable

#: A developer's shell, each value chosen to change an outcome if it reached a test.
HOSTILE = {
    "PACKER_PHI_KEY": secrets.token_hex(32),          # other pseudonyms, another dataset hash
    "PACKER_TUNE_MALLOC": "0",                        # glibc's allocator left untuned
    "AWS_PROFILE": "packer-no-such-profile",          # botocore: ProfileNotFound
    "AWS_ACCESS_KEY_ID": "AKIAHOSTILEHOSTILE00",
    "AWS_SECRET_ACCESS_KEY": "hostile",
    "AWS_DEFAULT_REGION": "xx-nowhere-1",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",         # the discard port: nothing answers
    "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",      # wins over AWS_ENDPOINT_URL in botocore and packer
    "RANK": "1",                                      # the loader would read half of each split
    "WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "hostile",                 # examples/train.py would start a process group
    "OPENCV_IO_MAX_IMAGE_PIXELS": "16",               # OpenCV would refuse every image
}

#: One test per variable above that reads it, and the check below. Each passes only with the
#: session's environment, not the caller's.
SELECTION = (
    "tests/test_hermetic.py::test_no_setting_of_the_callers_environment_reaches_a_test",
    # PACKER_PHI_KEY: the job's key file makes the committed demo hash and the expected pseudonyms
    "tests/test_reproducible.py::test_the_demo_rebuilds_to_the_committed_manifest",
    "tests/test_cli.py::test_exit_4_when_the_audit_finds_leakage",
    # PACKER_TUNE_MALLOC
    "tests/test_allocator.py::test_tuned_processes_reuse_decode_buffers_instead_of_faulting_them_in_again",
    # AWS_*: moto's server on 127.0.0.1 sets AWS_ENDPOINT_URL, not AWS_ENDPOINT_URL_S3
    "tests/test_rawstore_quick.py::test_a_header_read_front_to_back_costs_few_requests",
    # RANK, WORLD_SIZE: ShardDataset's defaults
    "tests/test_loader.py::test_shuffle_decorrelates_packed_and_read_order",
    # TORCHELASTIC_RUN_ID: the example takes it as a torchrun launch
    "tests/test_loader_train.py::test_example_trains_checkpoints_and_resumes_mid_epoch",
    # TMPDIR (here a file: Python falls back to /tmp, the seeds are written to $TMPDIR itself),
    # OPENCV_IO_MAX_IMAGE_PIXELS (read when OpenCV loads, while the tests are collected)
    "tests/test_fuzz.py::test_unmutated_seeds_read_cleanly",
)


def test_clean_environment_removes_the_callers_settings(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as caller:
        for name, value in HOSTILE.items():
            caller.setenv(name, value)
        caller.setenv("PACKER_WORK_DIR", str(tmp_path / "callers-work"))
        caller.setenv("AWS_CONFIG_FILE", str(tmp_path / "callers-aws-config"))
        caller.setenv("TMPDIR", str(tmp_path / "no-such-folder"))
        caller.setenv("PACKER_FUZZ_LONG", "1")
        with pytest.MonkeyPatch.context() as env:
            clean_environment(env, tmp_path / "session")
            assert [name for name in HOSTILE if name in os.environ] == []
            assert work_dir() == tmp_path / "session" / "work" and work_dir().is_dir()
            assert os.environ["AWS_CONFIG_FILE"] == os.environ["AWS_SHARED_CREDENTIALS_FILE"]
            assert not Path(os.environ["AWS_CONFIG_FILE"]).exists()
            assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
            assert os.environ["TMPDIR"] == tempfile.gettempdir() and Path(os.environ["TMPDIR"]).is_dir()
            assert os.environ["PACKER_FUZZ_LONG"] == "1"  # the suite's own opt-in stays
        assert os.environ["PACKER_PHI_KEY"] == HOSTILE["PACKER_PHI_KEY"]  # the caller's again, once undone


def test_no_setting_of_the_callers_environment_reaches_a_test(hermetic_environment: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """Run by the child below under HOSTILE: there, every one of them was set outside."""
    nowhere = str(hermetic_environment.parent / "no-aws-config")
    assert {name: value for name, value in os.environ.items() if is_hermetic_variable(name)} == {
        "PACKER_WORK_DIR": str(hermetic_environment), "AWS_CONFIG_FILE": nowhere,
        "AWS_SHARED_CREDENTIALS_FILE": nowhere, "AWS_EC2_METADATA_DISABLED": "true"}
    assert work_dir() == hermetic_environment
    assert hermetic_environment.is_relative_to(tmp_path_factory.getbasetemp())
    assert Path(os.environ["TMPDIR"]) == Path(tempfile.gettempdir())


@pytest.mark.slow  # a child pytest run: demo builds, moto's S3 server, subprocesses
def test_the_callers_environment_changes_no_outcome(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "home").mkdir(parents=True)
    (outside / "tmp").write_text("a file where a folder should be\n")
    env = {**os.environ, **HOSTILE, "PACKER_WORK_DIR": str(outside / "work"), "HOME": str(outside / "home"),
           "TMPDIR": str(outside / "tmp")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path / 'child'}", *SELECTION],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped)", summary)}
    assert counts.get("passed", 0) + counts.get("skipped", 0) == len(SELECTION), report
    assert counts.get("passed", 0) >= len(SELECTION) - 1, report  # only the glibc-only test may skip
    # nothing went to the caller's work folder or to a ~/.cache of theirs
    assert not (outside / "work").exists()
    assert not (outside / "home" / ".cache" / "packer").exists()
