"""What the loader's callers hand it: device names, custom batches, numpy numbers and arrays."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from loader_fixtures import build_dataset

from packer.errors import PYTHON_API, ConfigError, called_from
from packer.loader import DevicePrefetcher, ShardDataset, make_loader
from packer.loader.device import usable_device
from packer.loader.readers import _view_dtype

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

REPO = Path(__file__).resolve().parent.parent


def _available(kind: str) -> bool:
    if kind == "mps":
        return torch.backends.mps.is_available()
    backend = getattr(torch, kind, None)
    return bool(getattr(backend, "is_available", lambda: False)())


# device types whose backend this machine lacks: each has torch's own availability function (mps, xpu,
# mtia) or none (xla, hip: asked of an empty tensor); a machine that has one skips it
MISSING_BACKENDS = [pytest.param(kind, marks=pytest.mark.skipif(_available(kind), reason=f"{kind} is here"))
                    for kind in ("mps", "xpu", "mtia", "xla", "hip", "xpu:1")]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("inputs"), shard_sizes=(5, 7))


def load_example():
    spec = importlib.util.spec_from_file_location("packer_example_train_inputs", REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", MISSING_BACKENDS)
def test_a_device_whose_backend_is_missing_is_refused_by_name(device):
    """usable_device asked only about CUDA: mps or xpu on a machine without them passed, and the
    run died later in torch ("PyTorch is not linked with support for mps devices")."""
    kind = device.split(":")[0].upper()
    with pytest.raises(ConfigError, match=rf"^--device {device}: .*{kind}.*; use --device cpu"):
        usable_device(device, f"--device {device}")


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "meta"])
def test_cpu_and_meta_are_always_usable(device):
    assert usable_device(device, device) == torch.device(device)


def test_a_string_torch_does_not_know_is_named():
    with pytest.raises(ConfigError, match=r"^'gpu' is not a torch device; expected cpu, cuda"):
        usable_device("gpu", "'gpu'")


@pytest.mark.parametrize("device", MISSING_BACKENDS)
def test_train_example_refuses_a_missing_backend_as_a_usage_error(manifest, device, capsys, monkeypatch):
    """examples/train.py --device mps (or xpu) without that backend: exit 2 naming the device, as
    --device cuda without CUDA gives, not torch's traceback (exit 1) once the loader has started."""
    example = load_example()
    started = []
    monkeypatch.setattr(example, "ShardDataset", lambda *a, **k: started.append(a))
    with pytest.raises(SystemExit) as stopped:
        example.main(["--manifest", str(manifest.parent), "--epochs", "1", "--workers", "0", "--device", device])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --device: '{device}': " in err and "use --device cpu" in err and "Traceback" not in err
    assert not started


@pytest.mark.parametrize("device", MISSING_BACKENDS)
def test_bench_loader_refuses_a_missing_backend_before_measuring(manifest, device, monkeypatch):
    """packer bench-loader --device mps ran every measurement, then ended in 'internal error'."""
    from click.testing import CliRunner

    from packer.cli import main
    from packer.loader import bench

    measured = []
    monkeypatch.setattr(bench, "_loader", lambda *a, **k: measured.append(a) or {})
    result = CliRunner().invoke(main, ["bench-loader", str(manifest), "--seconds", "0.1", "--workers", "0",
                                       "--device", device])
    assert result.exit_code == 2, result.output
    assert f"--device {device}: " in result.output and "internal error" not in result.output
    assert not measured


class Pair(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


COLLATES = {
    "tuple": lambda items: (torch.stack([i["image"] for i in items]), torch.stack([i["label"] for i in items])),
    "namedtuple": lambda items: Pair(torch.stack([i["image"] for i in items]),
                                     torch.stack([i["label"] for i in items])),
    "nested dict": lambda items: {"image": torch.stack([i["image"] for i in items]),
                                  "targets": {"label": torch.stack([i["label"] for i in items])},
                                  "pair": (torch.stack([i["label"] for i in items]), [i["image"] for i in items]),
                                  "key": [i["key"] for i in items], "size": torch.Size([2, 3])},
}


@pytest.mark.parametrize("shape", list(COLLATES))
def test_prefetcher_moves_every_tensor_of_a_batch_of_a_collate_of_your_own(manifest, shape):
    """The README lets collate=fn return a batch "of any type ((images, labels), a dict of your own
    names)", but DevicePrefetcher took it for a flat dict: a tuple batch raised AttributeError
    ('tuple' object has no attribute 'items') and tensors nested in a dict or tuple stayed on the
    host (a device mismatch at the model on CUDA). "meta" stands in for the GPU."""
    loader = make_loader(ShardDataset(manifest, "train", shuffle=False), 4, collate=COLLATES[shape])
    host = next(iter(loader))
    batch = next(iter(DevicePrefetcher(loader, "meta")))
    assert type(batch) is type(host)
    assert {t.device.type for t in _tensors(batch)} == {"meta"}
    assert [t.shape for t in _tensors(batch)] == [t.shape for t in _tensors(host)]
    if shape == "nested dict":
        assert batch.keys() == host.keys() and type(batch["pair"]) is tuple and type(batch["pair"][1]) is list
        assert batch["key"] == host["key"] and batch["size"] == torch.Size([2, 3])
        assert batch["image"].dtype == torch.float32   # a dict batch's image is still converted
    else:
        assert batch[0].dtype == host[0].dtype          # no "image" name: moved, not converted


def test_prefetcher_records_the_stream_of_exactly_the_tensors_it_hands_out(manifest, monkeypatch):
    """On CUDA every tensor of the batch handed out is record_stream-ed on the compute stream so the
    caching allocator does not reuse its memory early; tensors in tuples were skipped."""
    recorded: list[int] = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: recorded.append(id(self)))
    loader = make_loader(ShardDataset(manifest, "train", shuffle=False), 4, collate=COLLATES["nested dict"])
    prefetcher = DevicePrefetcher(loader, "meta")
    batch = prefetcher._prepare(next(iter(loader)))
    prefetcher._record(batch, object())
    assert sorted(recorded) == sorted(id(t) for t in _tensors(batch)) and len(recorded) == 7
    recorded.clear()
    pair = prefetcher._prepare(next(iter(make_loader(ShardDataset(manifest, "train"), 4, collate=COLLATES["tuple"]))))
    prefetcher._record(pair, object())
    assert sorted(recorded) == sorted(id(t) for t in pair)


def test_a_numpy_batch_size_gives_a_state_of_plain_ints_that_a_weights_only_checkpoint_restores(manifest):
    """make_loader(ds, np.int64(4)) kept the numpy int: the state's segment held np.int64s, so
    json.dumps(state_dict()) failed and torch.load(weights_only=True) (examples/train.py's resume)
    refused the checkpoint."""
    loader = make_loader(ShardDataset(manifest, "train"), np.int64(4), np.int32(0), prefetch_factor=np.int64(2))
    assert type(loader.batch_size) is int and type(loader.num_workers) is int
    batches = DevicePrefetcher(loader, "cpu")
    batches.set_epoch(0)
    seen = [b["key"] for _, b in zip(range(2), batches, strict=False)]
    state = batches.state_dict()
    assert json.loads(json.dumps(state)) == state
    buffer = io.BytesIO()
    torch.save({"loader": state}, buffer)
    buffer.seek(0)
    resumed = make_loader(ShardDataset(manifest, "train"), 4)
    resumed.load_state_dict(torch.load(buffer, weights_only=True)["loader"])
    rest = [b["key"] for b in resumed]
    everything = [b["key"] for b in make_loader(ShardDataset(manifest, "train"), 4)]
    assert seen + rest == everything


@pytest.mark.parametrize(("argument", "value"), [("batch_size", 8.0), ("batch_size", "8"), ("batch_size", True),
                                                 ("num_workers", 1.0), ("num_workers", "2"),
                                                 ("prefetch_factor", 2.5)])
def test_a_loader_count_that_is_not_an_integer_is_a_config_error_naming_it(manifest, argument, value):
    """batch_size=8.0 passed make_loader and failed at len(loader) ('float' object cannot be
    interpreted as an integer); batch_size="8" failed with "'<' not supported"."""
    arguments = {"batch_size": 4, argument: value}
    with pytest.raises(ConfigError, match=f"^{argument} must be an integer, not {type(value).__name__}"):
        make_loader(ShardDataset(manifest, "train"), **arguments)


def test_labels_and_sources_given_as_numpy_arrays_make_the_view_a_list_makes(manifest):
    """labels=np.array([...]) (np.unique(table.label)) died in `if not labels:` with numpy's "truth
    value of an array ... is ambiguous"; the view is the list's, and its state holds plain strs."""
    as_list = ShardDataset(manifest, "train", labels=["c0", "c2"], shuffle=False)
    for labels in (np.array(["c0", "c2"]), np.array([0, 2]), ("c2", "c0"), {"c0", "c2"}):
        dataset = ShardDataset(manifest, "train", labels=labels, shuffle=False)
        assert len(dataset) == len(as_list) and [i["key"] for i in dataset] == [i["key"] for i in as_list]
        state = make_loader(dataset, 4).state_dict()
        assert state == make_loader(as_list, 4).state_dict() and json.loads(json.dumps(state)) == state
    assert len(ShardDataset(manifest, "train", sources=np.array(["synthetic"]))) == len(ShardDataset(manifest, "train"))


@pytest.mark.parametrize(("argument", "value", "said"), [
    ("labels", np.str_("c0"), r"labels='c0': pass a list of label names, e.g. labels=\['c0'\]"),
    ("labels", np.int64(2), r"^labels=.*2.* \(int64\): pass a list of label names"),
    ("labels", np.array("c0"), r"^labels=.*c0.* \(ndarray\): pass a list of label names"),
    ("labels", np.array([], dtype=str), r"labels=\[\]: an empty view holds no sample"),
    ("sources", 3, r"sources=3 \(int\): pass a list of source names"),
    ("sources", np.array([], dtype=str), r"sources=\[\]: an empty view holds no sample"),
])
def test_a_view_argument_that_is_not_a_collection_of_names_is_a_config_error(manifest, argument, value, said):
    with pytest.raises(ConfigError, match=said):
        ShardDataset(manifest, "train", **{argument: value})


def test_a_numpy_array_of_sources_picks_the_dtype_of_a_view_of_a_dataset_of_several():
    """The dtype check of a dataset whose sources differ in dtype tested `sources or ()`: ambiguous
    for an array of two names, and an empty array is deprecated as a truth value."""
    schema = {"dtypes": {"ct": ["uint8"], "mr": ["float16"], "ct2": ["uint8"]}}
    assert _view_dtype("m.json", schema, np.array(["ct", "ct2"])) == "uint8"
    # a private helper called alone: a Python caller's wording, as ShardDataset (a Python entry point) gives it
    with called_from(PYTHON_API), pytest.raises(ConfigError, match=r"sources=\['ct', 'mr'\] hold float16, uint8"):
        _view_dtype("m.json", schema, np.array(["ct", "mr"]))
