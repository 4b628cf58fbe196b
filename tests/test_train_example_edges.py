"""examples/train.py (and train3d.py, which runs its loop) at the edges of what it trains: a mix of
segmentation datasets whose mask classes differ, a split with no samples, a numeric target whose
train split is empty; and the loader's refusals as the command-line tools word them (their own
flags), beside the Python API's wording for Python callers."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import main as packer_cli
from packer.errors import ConfigError
from packer.loader import MixedDataset, ShardDataset, make_loader
from tests.helpers import REPO
from tests.test_masks import _photo_set, _photo_source
from tests.test_targets import _build, _job, _photo_table, ct_beside_float16_mr

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _example(name: str = "train") -> ModuleType:
    """examples/<name>.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"packer_example_{name}", REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _refusal(capsys: pytest.CaptureFixture[str], script: str, args: list[str]) -> tuple[int | str | None, str]:
    """Run examples/<script>.py with ``args`` on the CPU, in this process; its exit code and stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        _example(script).main([*args, "--epochs", "1", "--device", "cpu", "--workers", "0"])
    return stopped.value.code, capsys.readouterr().err


def _segmentation(tmp: Path, classes: list[int]) -> Path:
    """A segmentation dataset of three photos whose masks hold ids 0-3 (255 pads), declaring ``classes``."""
    raw = _photo_set(tmp, [(40, 40), (40, 40), (40, 40)])
    job = _job(tmp, [_photo_source(raw, classes=classes)], transform={"image": {"size": [32, 32], "color": "gray"}})
    return _build(job).version_dir


def test_a_mix_of_segmentation_datasets_whose_mask_classes_differ_is_refused_naming_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The mix's mask was its first member's: train.py sized its head for classes 0-3 and crashed
    with torch's IndexError on the first batch of the other member holding id 4 (README: members
    share masks, else a ConfigError names the member and the field)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    four = _segmentation(tmp_path / "four", [0, 1, 2, 3, 255])
    five = _segmentation(tmp_path / "five", [0, 1, 2, 3, 4, 255])
    members = [(ShardDataset(four, "train"), 1.0), (ShardDataset(five, "train"), 1.0)]
    with pytest.raises(ConfigError, match=re.escape("MixedDataset: five has mask classes [0, 1, 2, 3, 4, 255] but "
                                                    "four has [0, 1, 2, 3, 255]")):
        MixedDataset(members, names=["four", "five"])

    code, err = _refusal(capsys, "train", ["--mix", f"{four}=0.5", "--mix", f"{five}=0.5"])
    assert code == 2
    assert "mask classes [0, 1, 2, 3, 4, 255] but " in err and "has [0, 1, 2, 3, 255]" in err
    assert "mask.classes" in err  # the fix: declare one list of ids in both jobs

    same = _segmentation(tmp_path / "same", [0, 1, 2, 3, 255])  # the fix taken: one list of ids
    done = _example().main(["--mix", f"{four}=0.5", "--mix", f"{same}=0.5", "--epochs", "1", "--device", "cpu",
                            "--workers", "0", "--batch-size", "2"])
    assert done["objective"] == "segmentation: 4 classes" and done["steps"] == 3


def _photos_split_train_and_valid(tmp: Path) -> Path:
    """Four photos of four entities, asked to split 90/10: every entity lands in train, valid is empty."""
    raw = _photo_table(tmp, [{"path": f"{c}/{i}.png"} for i, c in enumerate("xyxy")])
    job = _job(tmp, [{"kind": "image", "root": str(raw), "label": "folder"}],
               split={"by": "entity", "ratios": {"train": 0.9, "valid": 0.1}})
    return _build(job).version_dir


@pytest.mark.parametrize("script", ["train", "train3d"])
def test_training_on_a_split_with_no_samples_is_refused_naming_the_split_and_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """It printed nothing, exited 0 and wrote a step-0 checkpoint, which --resume then said
    'already holds every epoch' of."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # train3d.py imports train.py from beside it
    version = _photos_split_train_and_valid(tmp_path)
    checkpoint = tmp_path / "c.pt"
    code, err = _refusal(capsys, script, ["--manifest", str(version), "--split", "valid",
                                          "--checkpoint", str(checkpoint)])
    assert code == 2
    assert f"{script}.py: {version}" in err
    assert ("split 'valid' has no samples (other splits: test 0, train 4); nothing to train: choose another split "
            "with --split") in err
    assert not checkpoint.exists()


def test_a_numeric_target_whose_train_split_is_empty_is_refused_not_a_key_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The numbers are standardised by the train split's target_stats, which an empty train split
    records as {} per name: pick_objective read ['mean'] of it, a KeyError traceback (exit 1)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "age": str(20 + 7 * i), "entity": f"E{i}"}
                                  for i in range(4)])
    job = _job(tmp_path, [{"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
                           "label": {"kind": "numeric", "columns": ["age"]}}],
               split={"by": "entity", "ratios": {"train": 0.01, "valid": 0.99}})
    version = _build(job).version_dir

    code, err = _refusal(capsys, "train", ["--manifest", str(version), "--split", "valid"])
    assert code == 2
    assert ("the numeric targets are standardised by the train split's target_stats, and the train split has no "
            "samples (no stats for age)") in err
    code, err = _refusal(capsys, "train", ["--manifest", str(version), "--split", "train"])
    assert code == 2
    assert "split 'train' has no samples (other splits: test 0, valid 4); nothing to train" in err


def _two_sizes(tmp: Path) -> Path:
    """Two photo sources of one channel count, 40×40 and 24×24: no batch of both stacks."""
    big = _photo_table(tmp / "big", [{"path": f"{c}/{i}.png"} for i, c in enumerate("xyxy")])
    small = _photo_table(tmp / "small", [{"path": f"{c}/{i}.png"} for i, c in enumerate("xyxy")])
    job = _job(tmp, [{"kind": "image", "name": "big", "root": str(big), "label": "folder"},
                     {"kind": "image", "name": "small", "root": str(small), "label": "folder"}],
               transform={"image": {"color": "rgb"}})
    for source, size in (("big", 40), ("small", 24)):  # _photo_table writes 64×48 photos: give each source its size
        for png in (tmp / source / "raw").rglob("*.png"):
            Image.open(png).convert("RGB").resize((size, size)).save(png)
    return _build(job).version_dir


def test_the_command_lines_refusals_name_their_own_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """train.py and bench-loader said 'read ShardDataset(..., sources=['ct'])' and
    'make_loader(dataset, batch_size, collate="list")', a Python call, where their flags are
    --sources ct and --collate list."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dtypes = _build(ct_beside_float16_mr(tmp_path / "dtypes")).version_dir
    code, err = _refusal(capsys, "train", ["--manifest", str(dtypes)])
    assert code == 2
    assert ("different dtypes (ct uint8, mr float16), and a batch holds one: read --sources ct, one view per "
            "dtype") in err
    assert "ShardDataset(" not in err

    runner = CliRunner()
    bench = runner.invoke(packer_cli, ["bench-loader", str(dtypes), "--seconds", "0.1", "--workers", "0"])
    assert bench.exit_code == 2
    assert "read --sources ct, one view per dtype" in bench.output and "ShardDataset(" not in bench.output

    shapes = _two_sizes(tmp_path / "shapes")
    bench = runner.invoke(packer_cli, ["bench-loader", str(shapes), "--collate", "stack", "--seconds", "0.1",
                                       "--workers", "0"])
    assert bench.exit_code == 2
    text = " ".join(bench.output.split())  # click wraps nothing here, but the terminal width may
    assert "load one source at a time: --sources NAME; or build with one size" in text
    assert "take the images as a list: --collate list (--collate pad pads height and width)" in text
    assert "make_loader(" not in text and "ShardDataset(" not in text


@pytest.mark.parametrize("workers", [0, 1])
def test_python_callers_keep_the_python_apis_wording(tmp_path: Path, workers: int) -> None:
    """The same refusals from Python name the call's arguments, in a DataLoader worker too (where
    the collate runs, made after the dataset, outside any command)."""
    dtypes = _build(ct_beside_float16_mr(tmp_path / "dtypes")).version_dir
    with pytest.raises(ConfigError, match=re.escape("read ShardDataset(..., sources=['ct']), one view per dtype")):
        ShardDataset(dtypes, "train")
    loader = make_loader(ShardDataset(_two_sizes(tmp_path / "shapes"), "train"), batch_size=8, num_workers=workers)
    with pytest.raises(ConfigError) as mixed:
        next(iter(loader))
    assert "load one source at a time: ShardDataset(manifest, split, sources=[...]); or" in str(mixed.value)
    assert 'take the images as a list: make_loader(dataset, batch_size, collate="list")' in str(mixed.value)
    assert "--sources" not in str(mixed.value) and "--collate" not in str(mixed.value)


def test_load_split_called_from_python_names_pythons_call_not_a_flag(tmp_path: Path) -> None:
    """packer.loader.load_split is a public entry point: its several-dtypes refusal told a Python
    caller to pass '--sources ct' (the surface defaulted to the command line)."""
    from click.testing import CliRunner

    from packer.cli import main
    from packer.errors import ConfigError
    from packer.loader import load_split
    from tests.test_targets import ct_beside_float16_mr

    job = ct_beside_float16_mr(tmp_path)
    assert CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report"]).exit_code == 0
    manifest = next((tmp_path / "out" / "targets").glob("*/manifest.json"))
    with pytest.raises(ConfigError) as err:
        load_split(manifest, "train")
    assert "--sources" not in str(err.value) and "sources=['ct']" in str(err.value), err.value
