"""What packer's Python surface takes, as README's "From Python" documents it: the command line's
``KEY=VALUE`` storage options wherever a dict is taken, the ``Manifest`` that ``packer.build``
returns wherever a dataset's location is taken, numpy integers as the whole numbers they hold,
and, for a value of the wrong type (a dask ``Client`` for ``scheduler``, a number for a path), a
typed ConfigError naming the argument as the call takes it, never a bare TypeError from deep
inside pathlib or dask."""

from __future__ import annotations

import collections.abc
import inspect
import os
import re
import subprocess
import sys
import sysconfig
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import packer
from packer import api
from packer.errors import ConfigError
from packer.loader import ShardDataset
from packer.manifest import Manifest
from tests.helpers import REPO
from tests.test_cli_frictions import photo, photo_job

ONE_SPLIT = {"by": "entity", "ratios": {"train": 1.0}, "seed": 3}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """Six photos of six entities, all in train, built in-process."""
    folder = tmp_path_factory.mktemp("built")
    job = photo_job(folder, [(f"p{i}.png", photo(i), f"E{i}") for i in range(6)], split=ONE_SPLIT)
    return packer.build(job, scheduler="sync", progress=False, report=False)


@pytest.fixture
def in_memory(built: Manifest, request: pytest.FixtureRequest) -> Iterator[str]:
    """The built version copied to fsspec's memory filesystem: its manifest's URL."""
    memory = fsspec.filesystem("memory")
    folder = f"/{request.node.name[:40]}/v"
    assert isinstance(built.folder, Path)
    for path in built.folder.iterdir():
        if path.is_file():
            memory.pipe(f"{folder}/{path.name}", path.read_bytes())
    yield f"memory://{folder}/manifest.json"
    memory.rm(folder, recursive=True)


# --- storage_options: the command line's KEY=VALUE strings, as README says ShardDataset takes them


def test_shard_dataset_takes_storage_options_as_the_command_lines_key_value_strings(in_memory: str) -> None:
    """ShardDataset(..., storage_options=["skip_instance_cache=true"]) was a bare ValueError from
    dict(); the strings are parsed as --storage-option parses them (JSON values, dotted keys nest)
    and reach every remote shard, as the same options given as a mapping do."""
    as_strings = ShardDataset(in_memory, "train", shuffle=False, storage_options=["skip_instance_cache=true"])
    as_mapping = ShardDataset(in_memory, "train", shuffle=False, storage_options={"skip_instance_cache": True})
    assert as_strings.info.storage_options == as_mapping.info.storage_options == {"skip_instance_cache": True}
    assert all(shard.storage_options == {"skip_instance_cache": True} for shard in as_strings.info.shards)
    assert [item["key"] for item in as_strings] == [item["key"] for item in as_mapping]
    assert len(as_strings) == 6
    nested = ShardDataset(in_memory, "train", storage_options=("skip_instance_cache=false", "a.b=3"))
    assert nested.info.storage_options == {"skip_instance_cache": False, "a": {"b": 3}}


@pytest.mark.parametrize(("given", "said"), [
    ("secret=S3CR3T-VALUE", "storage_options: a str (not shown: it may hold credentials)"),
    (["key=AKIAEXAMPLE", 7], "storage_options: a list (not shown: it may hold credentials)"),
    (["S3CR3T-VALUE"], "storage_options: an option without KEY= (not shown: it may hold credentials)"),
])
def test_shard_dataset_refuses_other_storage_options_by_type_without_repeating_them(
        built: Manifest, given: Any, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)) as raised:
        ShardDataset(built.location, "train", storage_options=given)
    assert "S3CR3T" not in str(raised.value) and "AKIAEXAMPLE" not in str(raised.value)


# --- workers: a whole number of any integer type, as README reads numpy values


def test_workers_takes_a_numpy_integer_as_the_whole_number_it_holds(tmp_path: Path) -> None:
    """workers=np.int64(1) was refused as "not a whole number"; it is the 1 it holds, passed on as
    a Python int (the local cluster starts with it: a one-worker check of a real job passes)."""
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(2)], split=ONE_SPLIT)
    checked = packer.validate(job, quick=True, workers=np.int64(1), progress=False)
    assert checked.exit_code == 0


@pytest.mark.parametrize("workers", [np.int32(2), np.uint8(2), np.int64(8)])
def test_any_integer_type_is_taken_before_the_job_is_read(workers: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        packer.validate({"name": "x"}, workers=workers, progress=False)
    assert not str(raised.value).startswith("workers=")  # the job's own error: it lists no sources


@pytest.mark.parametrize("workers", [np.int64(0), np.True_, True, 2.0, np.float64(2), "2"])
def test_workers_that_are_not_a_whole_number_of_at_least_one_are_refused_by_name(workers: Any) -> None:
    with pytest.raises(ConfigError, match=r"^workers=.*: the local cluster needs a whole number"):
        packer.validate({"name": "x"}, workers=workers, progress=False)


# --- the Manifest packer.build returns, wherever a dataset's location is taken


def test_shard_dataset_and_packer_open_take_the_manifest_packer_build_returns(built: Manifest) -> None:
    """README names the build's result `manifest` and documents ShardDataset(manifest, split);
    ShardDataset(manifest, "train") and packer.open(manifest) were a bare TypeError from pathlib.
    The object stands for its location: the same dataset, checked again as on any open."""
    from_object = ShardDataset(built, "train", shuffle=False)
    from_location = ShardDataset(built.location, "train", shuffle=False)
    assert from_object.info == from_location.info and len(from_object) == 6
    assert [item["key"] for item in from_object] == [item["key"] for item in from_location]
    opened = packer.open(built)
    assert opened.location == built.location and opened.dataset_hash == built.dataset_hash


def test_a_remote_manifest_object_is_read_from_its_url_with_the_options_given(in_memory: str) -> None:
    manifest = packer.open(in_memory, storage_options=["skip_instance_cache=true"])
    dataset = ShardDataset(manifest, "train", storage_options=["skip_instance_cache=true"])
    assert dataset.info.manifest == in_memory and len(dataset) == 6
    assert packer.open(manifest).dataset_hash == manifest.dataset_hash


@pytest.mark.parametrize("location", [5, 2.5, None, b"/tmp/x", ["a", "b"]])
def test_a_location_that_is_no_path_or_url_is_a_config_error_naming_it(location: Any) -> None:
    """packer.open(5) and ShardDataset(5, ...) were bare TypeErrors from pathlib."""
    with pytest.raises(ConfigError, match=r"location|manifest") as raised:
        packer.open(location)
    assert "a path or a URL" in str(raised.value)
    with pytest.raises(ConfigError, match="a path or a URL"):
        ShardDataset(location, "train")


# --- scheduler= and the path arguments: a value of the wrong type is a ConfigError naming the argument


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """An in-process dask cluster and a client of it, as a notebook holds them."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.parametrize("call", [packer.build, packer.validate])
def test_a_dask_client_or_cluster_for_scheduler_says_to_pass_its_address(
        tmp_path: Path, dask_client: Any, call: Callable[..., Any]) -> None:
    """scheduler=client was a bare "TypeError: argument of type 'Client' is not iterable" from
    deep in the cluster code; it is refused before any work, naming scheduler= and the address
    to pass instead."""
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(2)], split=ONE_SPLIT)
    address = dask_client.scheduler.address
    for given, fix in ((dask_client, "client.scheduler.address"), (dask_client.cluster, "cluster.scheduler_address")):
        with pytest.raises(ConfigError) as raised:
            call(job, scheduler=given, progress=False)
        said = str(raised.value)
        assert said.startswith(f"scheduler=<{type(given).__name__}>: a dask {type(given).__name__}, not an address")
        assert f"pass scheduler={fix} ({address!r})" in said
    assert not (tmp_path / "out").exists()


def test_a_scheduler_file_given_as_a_path_is_read_as_the_same_file_given_as_a_str(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README: scheduler takes the file `dask scheduler --scheduler-file` wrote; a pathlib.Path of it
    was a bare TypeError. It is that file, even a bare name without .json in the current folder."""
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(2)], split=ONE_SPLIT)
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "sched").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for given, said in ((tmp_path / "missing.json", "no such scheduler file"),
                        (tmp_path / "empty.json", "it is not a scheduler file's JSON"),
                        (Path("sched"), "it names no scheduler address")):
        with pytest.raises(ConfigError, match=r"^scheduler='[^']*': " + re.escape(said)):
            packer.validate(job, scheduler=given, progress=False)
    with pytest.raises(ConfigError, match=r"^scheduler='[^']*': " + re.escape("no such scheduler file")):
        packer.validate(job, scheduler=str(tmp_path / "missing.json"), progress=False)  # the same as a str


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"scheduler": 5}, "scheduler=5: give a dask scheduler's address"),
    ({"scheduler": b"tcp://h:1"}, "scheduler=b'tcp://h:1': give a dask scheduler's address"),
    ({"out": 5}, "out=5: give a path or a URL"),
    ({"cache_dir": 5}, "cache_dir=5: give a path (a str or a pathlib.Path), not a value of type int"),
    ({"base_dir": 5}, "base_dir=5: give a path (a str or a pathlib.Path), not a value of type int"),
    ({"out": b"/tmp/x"}, "out=b'/tmp/x': give a path or a URL"),
])
def test_arguments_that_are_no_path_or_address_are_config_errors_naming_them(
        tmp_path: Path, kwargs: dict[str, Any], said: str) -> None:
    """out=5, cache_dir=5, base_dir=5 and scheduler=5 were bare TypeErrors from pathlib or dask."""
    job = photo_job(tmp_path, [(f"p{i}.png", photo(i), f"E{i}") for i in range(2)], split=ONE_SPLIT)
    with pytest.raises(ConfigError, match=re.escape(said)) as raised:
        packer.build(job, progress=False, report=False, **kwargs)
    assert raised.value.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_the_cluster_code_refuses_a_scheduler_that_is_no_string_by_name() -> None:
    """Its callers other than packer.api (the build's and the check's own entry points) get a
    ConfigError, not "argument of type 'PosixPath' is not iterable"."""
    from packer.pipeline.cluster import check_scheduler

    with pytest.raises(ConfigError, match=r"^--scheduler: a PosixPath, not a dask scheduler's address"):
        check_scheduler(Path("scheduler.json"))  # type: ignore[arg-type]


# --- the public types, as a user's type checker sees them


@pytest.mark.parametrize("call", [api.build, api.run_build, api.validate, api.open])
def test_storage_options_are_annotated_as_the_mapping_or_the_key_value_strings_the_calls_take(
        call: Callable[..., Any]) -> None:
    assert inspect.signature(call).parameters["storage_options"].annotation == "StorageOptions"
    assert set(typing.get_args(api.StorageOptions)) == {
        collections.abc.Mapping[str, Any], collections.abc.Sequence[str], type(None)}


USER_SCRIPT = """\
from pathlib import Path

from packer import api
from packer.manifest import Manifest


def build() -> Manifest:
    return api.build("job.yaml", scheduler=Path("scheduler.json"), storage_options=["anon=true"])


def reopen(manifest: Manifest) -> Manifest:
    return api.open(manifest, storage_options={"anon": True})


def wrong() -> str:
    return api.open("v")
"""


def test_a_users_mypy_strict_sees_packers_signatures_through_an_editable_install(tmp_path: Path) -> None:
    """packer shipped no PEP 561 marker (packer/py.typed): a user's `mypy --strict`, with packer
    installed as `make install` installs it (an editable install: a .pth naming the checkout,
    beside the wheel's packer/_schemas folder), said 'module is installed, but missing library
    stubs or py.typed marker' and typed every packer name as Any. With the marker it reads
    the annotations: the documented calls pass, and a wrong return type is caught."""
    assert (REPO / "packer" / "py.typed").is_file()
    ignored = subprocess.run(["git", "check-ignore", "-q", "packer/py.typed"], cwd=REPO)
    assert ignored.returncode == 1  # not ignored: hatch's wheel (packages = ["packer"]) ships every file in it
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_editable_impl_packer.pth").write_text(f"{REPO}\n")
    (site / "packer" / "_schemas").mkdir(parents=True)  # what the wheel's force-include installs
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    mypy = Path(sysconfig.get_paths()["scripts"]) / "mypy"
    if not mypy.exists():
        mypy = Path(sys.executable).with_name("mypy")
    done = subprocess.run([str(mypy), "--strict", "--python-executable", str(python), "--cache-dir",
                           str(tmp_path / "cache"), "user.py"], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")},
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("user.py:16: error: Incompatible return value type (got \"Manifest\", expected \"str\")")
