"""What packer's Python calls promise a long-lived caller (a notebook, an orchestrator's worker),
as README's "From Python" documents it: a job of the wrong type is a typed ConfigError naming
the argument, never a bare TypeError."""

from __future__ import annotations

import re
from typing import Any

import pytest

import packer
from packer import api
from packer.errors import ConfigError


@pytest.mark.parametrize("call", ["validate", "build", "run_build"])
@pytest.mark.parametrize(("job", "named"), [
    (None, "not None"),
    (5, "not an int"),
    (b"job.yaml", "not a bytes"),
    (["job.yaml"], "not a list"),
])
def test_a_job_that_is_no_path_mapping_or_job_config_is_a_config_error_naming_the_argument(
        call: str, job: Any, named: str) -> None:
    """packer.validate(None) and packer.build(5) were a bare TypeError (exit 1 from a task
    runner that maps PackerError.exit_code), unlike every other argument of the same calls."""
    with pytest.raises(ConfigError, match=re.escape(f"job={job!r}: give a job file path (a str or a pathlib.Path), "
                                                    f"a mapping or a JobConfig, {named}")) as raised:
        getattr(api, call)(job, scheduler="sync", progress=False)
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(("given", "said"), [
    (5, "storage_options: an int (not shown"),
    (1.5, "storage_options: a float (not shown"),
    ("k=v", "storage_options: a str (not shown"),
])
def test_storage_options_of_the_wrong_type_name_it_with_the_right_article(given: Any, said: str) -> None:
    """It said "storage_options: a int"."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        packer.open("nowhere", storage_options=given)
