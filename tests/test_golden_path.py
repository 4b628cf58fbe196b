"""The newcomer's path, as the README tells it: `make demo`'s two commands, then the README's
first loader snippet pasted as is, `examples/train.py` for an epoch and `packer bench-loader`,
all on that build. If the README's snippet stops working, this test is red."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_version import REPO, committed_demo

pytestmark = pytest.mark.slow   # a real `packer build` on a local dask cluster, then subprocesses

PACKER = str(Path(sys.executable).with_name("packer"))


def first_loader_snippet() -> str:
    """The README's first ```python block that uses packer.loader, verbatim."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M)
    return next(block for block in blocks if "packer.loader" in block)


def run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A checkout's layout (workflows/demo.yaml next to demo-raw/, build/, manifests/), built as
    `make demo` builds it: `packer demo-data demo-raw --seed 0` and `packer build workflows/demo.yaml`."""
    home = tmp_path_factory.mktemp("newcomer")
    (home / "workflows").mkdir()
    shutil.copy(REPO / "workflows" / "demo.yaml", home / "workflows" / "demo.yaml")
    run([PACKER, "demo-data", "demo-raw", "--seed", "0"], home)
    built = run([PACKER, "build", "workflows/demo.yaml"], home)
    version = re.search(r"^dataset demo version ([0-9a-f]{12})$", built.stdout, flags=re.M)
    assert version is not None, built.stdout
    assert f"build/demo/{version[1]}/manifest.json" in built.stdout
    return home, version[1]


def test_make_demo_builds_the_committed_version(newcomer: tuple[Path, str]) -> None:
    assert newcomer[1] == committed_demo()["version"]


def test_the_readme_loader_snippet_runs_as_pasted_to_the_end_of_the_train_split(newcomer: tuple[Path, str]) -> None:
    home, version = newcomer
    snippet = first_loader_snippet()
    # the snippet names the demo's own version, so it runs pasted exactly as the README shows it
    assert f"build/demo/{version}/manifest.json" in snippet and "DataLoader" in snippet, snippet
    script = snippet + '\nprint("last batch", tuple(images.shape), tuple(labels.shape))\n'
    done = run([sys.executable, "-c", script], home)
    last = re.search(r"last batch \((\d+), 3, 64, 64\) \((\d+),\)", done.stdout)
    assert last is not None and last[1] == last[2], done.stdout


def test_the_training_example_trains_an_epoch_on_the_demo(newcomer: tuple[Path, str]) -> None:
    home, version = newcomer
    done = run([sys.executable, str(REPO / "examples" / "train.py"), "--manifest", f"build/demo/{version}",
                "--epochs", "1", "--device", "cpu"], home)
    assert "epoch 0: step" in done.stdout


def test_bench_loader_measures_the_demo(newcomer: tuple[Path, str]) -> None:
    home, version = newcomer
    done = run([PACKER, "bench-loader", f"build/demo/{version}/manifest.json", "--split", "train",
                "--seconds", "0.3", "--workers", "0,1"], home)
    assert "samples/s" in done.stdout and "internal error" not in done.stdout + done.stderr
    assert "collate stack" in done.stdout


def test_the_readme_job_example_builds_when_pasted_in_order(newcomer: tuple[Path, str]) -> None:
    """"The job file": make the key as the README says, save the example as it says, build."""
    home, _ = newcomer
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The job file", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)[0]
    example = re.findall(r"^```yaml\n(.*?)^```", section, flags=re.S | re.M)[0]
    saved_as = re.search(r"save it as `(workflows/[\w.-]+\.yaml)`", section)
    assert saved_as is not None and "name: my-job" in example
    (home / saved_as[1]).write_text(example, encoding="utf-8")
    for line in commands.splitlines():
        command = line.split("#", 1)[0].split()
        assert command[0] == ".venv/bin/packer", line
        run([PACKER, *command[1:]], home)
    key = home / "keys" / "my-job.key"
    assert key.stat().st_mode & 0o777 == 0o600
    built = list((home / "build" / "my-job").glob("*/manifest.json"))
    assert len(built) == 1


def test_the_training_example_trains_a_weighted_mix_of_the_demo_and_a_second_dataset(
        newcomer: tuple[Path, str]) -> None:
    """README, 'Several datasets at once': build the ImageFolder job next to the demo, then
    train on 0.7 demo + 0.3 ImageFolder with --mix."""
    home, version = newcomer
    shutil.copy(REPO / "workflows" / "targets-imagefolder.yaml", home / "workflows" / "targets-imagefolder.yaml")
    built = run([PACKER, "build", "workflows/targets-imagefolder.yaml"], home)
    second = re.search(r"^dataset targets-imagefolder version ([0-9a-f]{12})$", built.stdout, flags=re.M)
    assert second is not None, built.stdout
    done = run([sys.executable, str(REPO / "examples" / "train.py"), "--mix", f"build/demo/{version}=0.7",
                "--mix", f"build/targets-imagefolder/{second[1]}=0.3", "--epochs", "1", "--device", "cpu"], home)
    shares = re.search(r"^mix: demo (\d+), targets-imagefolder (\d+) samples an epoch$", done.stdout, flags=re.M)
    assert shares is not None, done.stdout
    demo, other = int(shares[1]), int(shares[2])
    assert abs(demo / (demo + other) - 0.7) <= 1 / (demo + other) and "epoch 0: step" in done.stdout


def test_the_readme_stock_reader_blocks_run_as_pasted(newcomer: tuple[Path, str]) -> None:
    """README, 'Stock readers open the shards without packer': the tar block on the demo, the
    Parquet block on the build of the job it names, each as pasted: the versions it names are the
    ones those builds print."""
    home, version = newcomer
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("Stock readers open the shards without packer", 1)[1].split("\n## ", 1)[0]
    tar_block, parquet_block = re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    job = re.search(r"`packer build (workflows/[\w.-]+\.yaml)`", section)
    assert job is not None and "train-*.tar" in tar_block and "train-*.parquet" in parquet_block
    assert f"build/demo/{version}/" in tar_block
    done = run([sys.executable, "-c", tar_block + "\nprint('tar', image.shape, label)\n"], home)
    assert re.search(r"^tar \(3, 64, 64\) \d+$", done.stdout, flags=re.M), done.stdout
    shutil.copy(REPO / job[1], home / job[1])
    built = run([PACKER, "build", job[1], "-q"], home)
    name = re.search(r"name: ([\w-]+)", (home / job[1]).read_text())
    assert name is not None
    parquet = re.search(rf"^dataset {name[1]} version ([0-9a-f]{{12}})$", built.stdout, flags=re.M)
    assert parquet is not None and f"build/{name[1]}/{parquet[1]}/" in parquet_block, built.stdout
    done = run([sys.executable, "-c", parquet_block
                + "\nprint('parquet', image.shape, len(target), hf['train'].num_rows)\n"], home)
    assert re.search(r"^parquet \(3, 64, 64\) 4 \d+$", done.stdout, flags=re.M), done.stdout


def test_every_readme_python_block_runs_as_pasted_after_the_builds_it_names(newcomer: tuple[Path, str]) -> None:
    """Each README ```python block, verbatim, from the checkout's folder after `make demo` and the
    builds the text above it names (the From Python block builds on a local cluster of its own:
    tests/test_api.py runs it). A version a block names is the one its build prints."""
    home, version = newcomer
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for job in ("targets-imagefolder", "targets-multilabel"):
        if not (home / "workflows" / f"{job}.yaml").exists():
            shutil.copy(REPO / "workflows" / f"{job}.yaml", home / "workflows" / f"{job}.yaml")
        built = run([PACKER, "build", f"workflows/{job}.yaml", "-q"], home)
        printed = re.search(rf"^dataset {job} version ([0-9a-f]{{12}})\b", built.stdout, flags=re.M)  # or reused
        assert printed is not None, built.stdout
        quoted = set(re.findall(rf"build/{job}/([0-9a-f]{{12}})", readme))
        assert quoted <= {printed[1]}, f"README.md quotes {job} version(s) {quoted}; its build prints {printed[1]}"
    from_python = readme.split("\n## From Python: `packer.build`", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M) if b not in from_python]
    assert len(blocks) >= 8
    for block in blocks:
        assert "<version>" not in block and (f"build/demo/{version}" in block or "build/demo/" not in block)
        run([sys.executable, "-c", block], home)
