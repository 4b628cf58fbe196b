"""Training from shards on CPU: prefetcher, the example script, 2-process DDP, the benchmark."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from loader_fixtures import build_dataset, ddp_worker, split_keys

from packer.loader import DevicePrefetcher, ShardDataset, make_loader
from packer.loader.bench import bench_loader, format_table
from packer.manifest import seal_manifest

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("train"), shard_sizes=(5, 7, 3, 6))


def test_prefetcher_converts_and_normalises_on_cpu(manifest):
    loader = make_loader(ShardDataset(manifest, "train", shuffle=False), 4)
    raw = next(iter(loader))
    batch = next(iter(DevicePrefetcher(loader, "cpu", mean=(0.5,), std=(0.25,))))
    assert batch["image"].dtype == torch.float32 and batch["image"].shape == (4, 1, 4, 4)
    expected = (raw["image"].double() / 255 - 0.5) / 0.25      # hand-computed, 0..1 units
    assert torch.allclose(batch["image"].double(), expected, atol=1e-6)
    assert batch["key"] == raw["key"] and torch.equal(batch["label"], raw["label"])
    plain = next(iter(DevicePrefetcher(loader, "cpu")))
    assert float(plain["image"].max()) <= 1.0 and torch.allclose(plain["image"] * 255, raw["image"].float())
    floats = torch.full((2, 1, 4, 4), 0.75)
    (out,) = DevicePrefetcher([{"image": floats, "key": ["a", "b"]}], "cpu", mean=(0.5,), std=(0.5,))
    assert torch.allclose(out["image"], torch.full((2, 1, 4, 4), 0.5)) and float(floats[0, 0, 0, 0]) == 0.75


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 6, 4, 5)])   # B×C×H×W and B×C×D×H×W (volumes)
def test_per_channel_mean_and_std_follow_the_channel_axis_of_images_and_volumes(shape):
    channels = torch.arange(3, dtype=torch.uint8).view(1, 3, *(1,) * (len(shape) - 2)) * 100
    batch = {"image": channels.expand(*shape).contiguous(), "key": ["a", "b"]}
    mean, std = (0.0, 0.2, 0.4), (1.0, 2.0, 4.0)
    (out,) = DevicePrefetcher([batch], "cpu", mean=mean, std=std)
    for c in range(3):
        assert torch.allclose(out["image"][:, c], torch.tensor((100 * c / 255 - mean[c]) / std[c]))
    listed = {"image": list(batch["image"]), "key": ["a", "b"]}   # collate="list": C first in each image
    (each,) = DevicePrefetcher([listed], "cpu", mean=mean, std=std)
    assert all(torch.allclose(image, out["image"][i]) for i, image in enumerate(each["image"]))


def test_tiny_model_trains_from_shards(manifest):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    before = [p.detach().clone() for p in model.parameters()]
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = make_loader(ShardDataset(manifest, "train", seed=1), 7, 2)
    batches = DevicePrefetcher(loader, "cpu", mean=(0.5,), std=(0.3,))
    losses = []
    for epoch in range(15):
        batches.set_epoch(epoch)
        total = 0.0
        for batch in batches:
            loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
            optim.zero_grad()
            loss.backward()
            optim.step()
            total += loss.item()
        losses.append(total)
    loader.close()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]                      # pixel 2 shows the label: easy to learn
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def load_example():
    spec = importlib.util.spec_from_file_location("packer_example_train", REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_example_feeds_float_samples_as_stored_and_normalises_integer_ones(tmp_path, monkeypatch):
    """A float16 dataset holds z-scores (an MR job's ``output: float16``: "as nnU-Net trains on
    them"); train.py normalised every dataset with mean 0.5, std 0.25 as if it were 0..1, so the
    model saw (z - 0.5) × 4. Integer samples keep that normalisation."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    example = load_example()
    seen = {}

    def pick(dataset, channels, device):
        objective = example.pick_objective(dataset, channels, device)

        def loss(model, batch):
            seen.setdefault(dataset.info.dtype, (batch["image"].clone(), list(batch["key"])))
            return objective.loss(model, batch)

        return example.Objective(objective.summary, objective.model, loss)

    for dtype in ("float16", "uint8"):
        manifest = build_dataset(tmp_path / dtype, shard_sizes=(4,), dtype=dtype)
        args = example.parse_args(["--manifest", str(manifest.parent), "--epochs", "1", "--batch-size", "4",
                                   "--workers", "0", "--device", "cpu"])
        example.run(args, pick=pick)
    from loader_fixtures import sample_image

    for dtype, (images, keys) in seen.items():
        stored = torch.stack([torch.from_numpy(sample_image(int(k[1:]))).float() for k in keys])
        expected = stored / 10 - 5 if dtype == "float16" else (stored / 255 - 0.5) / 0.25
        assert torch.allclose(images, expected, atol=1e-2), dtype


def _one_process_example(manifest, tmp_path, monkeypatch, *, batch_size, workers):
    """examples/train.py loaded, outside torchrun (no RANK/WORLD_SIZE), its checkpoint path and
    the arguments of a one-epoch CPU run over ``manifest``'s version."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    ckpt = tmp_path / "ckpt.pt"
    return load_example(), ckpt, ["--manifest", str(manifest.parent), "--epochs", "1", "--batch-size",
                                  str(batch_size), "--workers", str(workers), "--device", "cpu", "--checkpoint",
                                  str(ckpt)]


def test_example_trains_checkpoints_and_resumes_mid_epoch(manifest, tmp_path, monkeypatch):
    example, ckpt, common = _one_process_example(manifest, tmp_path, monkeypatch, batch_size=4, workers=1)
    first = example.main([*common, "--max-steps", "2"])
    assert first["steps"] == 2 and all(map(lambda x: x == x, first["losses"]))
    assert torch.load(ckpt, weights_only=True)["loader"]["segment"][-1] == 8
    second = example.main([*common, "--resume"])
    assert second["steps"] == 6                                 # 21 samples: 6 batches of 4 in all
    assert Counter(first["keys"] + second["keys"]) == Counter(split_keys(21))


def test_example_resumed_from_a_finished_checkpoint_says_there_is_nothing_to_train(manifest, tmp_path, monkeypatch,
                                                                                  capsys):
    """The docstring's `--resume` run on a checkpoint that holds every epoch printed nothing at
    all, exit 0: no telling whether it trained."""
    example, ckpt, common = _one_process_example(manifest, tmp_path, monkeypatch, batch_size=8, workers=0)
    assert example.main(common)["steps"] == 3
    capsys.readouterr()
    again = example.main([*common, "--resume"])
    assert again["steps"] == 3 and again["losses"] == []
    out = capsys.readouterr().out
    assert f"nothing to train: {ckpt} already holds every epoch of --epochs 1 (step 3)" in out, out


def test_example_refuses_a_checkpoint_of_another_model_or_dataset_with_exit_2(manifest, tmp_path, monkeypatch,
                                                                             capsys):
    """A checkpoint of a dataset with another class count (another head) was a RuntimeError
    traceback, exit 1, where the docstring promises exit 2 and one line."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    example = load_example()
    ckpt = tmp_path / "ckpt.pt"
    common = ["--epochs", "1", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--checkpoint", str(ckpt)]
    example.main(["--manifest", str(manifest.parent), *common, "--max-steps", "1"])
    saved = torch.load(ckpt, weights_only=True)
    last = list(saved["model"])[-1]
    saved["model"][last] = torch.zeros(saved["model"][last].shape[0] + 2, *saved["model"][last].shape[1:])
    torch.save(saved, ckpt)  # the same loader state, another head: the model check's own message
    with pytest.raises(SystemExit) as stopped:
        example.main(["--manifest", str(manifest.parent), *common, "--resume"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert re.search(r"^train\.py: cannot resume from .*ckpt\.pt: its model does not fit this run's", err, re.M), err
    assert "Traceback" not in err
    other = build_dataset(tmp_path / "other", shard_sizes=(4,), classes=5)
    with pytest.raises(SystemExit) as stopped:
        example.main(["--manifest", str(other.parent), *common, "--resume"])
    assert stopped.value.code == 2 and "another dataset configuration" in capsys.readouterr().err


def test_example_stopped_by_max_steps_mid_epoch_prints_the_epoch_line_and_says_so(manifest, tmp_path, monkeypatch,
                                                                                     capsys):
    """--max-steps that ended an epoch part way used to stop without the epoch's line (step, loss, objective)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    example = load_example()
    common = ["--manifest", str(manifest.parent), "--epochs", "2", "--batch-size", "4", "--workers", "0",
              "--device", "cpu"]
    stopped = example.main([*common, "--max-steps", "2"])   # 21 samples: 6 batches an epoch, stopped after 2
    out = capsys.readouterr().out
    assert stopped["steps"] == 2
    assert re.fullmatch(r"epoch 0: step 2, last loss [0-9.]+ \(class: 3 classes\); stopped at --max-steps 2\n",
                        out), out
    example.main([*common, "--max-steps", "8"])             # epoch 0 whole, then 2 batches of epoch 1
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"loss [0-9.]+", "loss L", line) for line in lines] == [
        "epoch 0: step 6, last loss L (class: 3 classes)",
        "epoch 1: step 8, last loss L (class: 3 classes); stopped at --max-steps 8"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # two spawned DDP processes (gloo)
def test_the_example_under_torchrun_takes_the_ddp_path_even_with_one_process(manifest, monkeypatch):
    """One GPU is one process: under torchrun the example still initialises the process group
    (NCCL on CUDA; gloo here) and wraps the model in DDP, so a one-GPU machine exercises the
    path a many-GPU one takes (benchmarks/gpu_check.py runs it so)."""
    for name, value in {"TORCHELASTIC_RUN_ID": "one", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    backends: list[str] = []
    real = torch.distributed.init_process_group
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda backend, **kw: (backends.append(backend), real(backend, **kw))[1])
    wrapped: list[int] = []
    real_ddp = torch.nn.parallel.DistributedDataParallel
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel",
                        lambda module, **kw: (wrapped.append(1), real_ddp(module, **kw))[1])
    result = load_example().main(["--manifest", str(manifest.parent), "--epochs", "1", "--batch-size", "4",
                                  "--workers", "0", "--device", "cpu"])
    assert backends == ["gloo"] and wrapped == [1]
    assert result["steps"] == 6 and not torch.distributed.is_initialized()  # 21 samples, batches of 4; torn down


def test_two_process_gloo_ddp_with_padding(manifest, tmp_path):
    steps = 100                                              # more than two epochs: run both to the end
    try:
        torch.multiprocessing.spawn(ddp_worker, args=(2, free_port(), str(manifest), str(tmp_path), steps),
                                    nprocs=2, join=True)
    except torch.multiprocessing.ProcessExitedException as err:
        # gloo's C++ side has aborted a rank once in CI (SIGABRT, a transport race on a loaded
        # 2-core machine, not a loader error): run the whole job once more before failing
        if err.signal_name != "SIGABRT":
            raise
        torch.multiprocessing.spawn(ddp_worker, args=(2, free_port(), str(manifest), str(tmp_path), steps),
                                    nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]    # from torch.distributed
    # 21 samples over 2 ranks, padded to 11 each: 3 batches of 4 per epoch on both ranks
    assert ranks[0]["steps"] == ranks[1]["steps"] == 6
    assert len(ranks[0]["keys"]) == len(ranks[1]["keys"]) == 11
    assert set(ranks[0]["keys"] + ranks[1]["keys"]) == set(split_keys(21))
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"])      # DDP kept replicas in step
    assert all(loss == loss for r in ranks for loss in r["losses"])


def test_bench_loader_reports_every_stage(manifest):
    result = bench_loader(manifest, "train", workers=(0, 1), batch_sizes=(4, 8), pin_memory=(False,), seconds=0.05)
    assert set(result) == {"dataset", "config", "raw_read", "decode", "loader", "device"}
    assert result["dataset"]["samples"] == 21 and result["raw_read"]["bytes"] > 0
    # the worker counts first; then the batch sizes around the fastest count (one pin_memory value: no row)
    fastest = max(result["loader"][:2], key=lambda r: r["samples_per_s"])["num_workers"]
    assert result["config"]["fastest_workers"] == fastest
    assert [(r["vary"], r["num_workers"], r["batch_size"]) for r in result["loader"]] == [
        ("num_workers", 0, 4), ("num_workers", 1, 4), ("batch_size", fastest, 4), ("batch_size", fastest, 8)]
    assert all(r["samples"] > 0 and r["samples_per_s"] > 0 for r in result["loader"])
    assert result["device"]["steps"] > 0 and "h2d_ms_per_batch" not in result["device"]
    json.dumps(result)
    table = format_table(result)
    assert "raw read" in table and "samples/s" in table
    assert f"(num_workers {fastest} was the fastest: the pin_memory and batch_size rows and the device step use it)" \
        in table


@pytest.mark.slow  # three subprocesses, one of them under torch.distributed.run
def test_the_prepared_gpu_check_runs_every_step_on_the_cpu(manifest, tmp_path):
    """benchmarks/gpu_check.py is what a session lent a GPU runs in one call: its CPU dry run
    goes through the same three steps (the loader benchmark, the example, the example under
    torchrun) and writes what RESULTS.md needs."""
    import subprocess

    out = tmp_path / "gpu"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--manifest",
                           str(manifest.parent), "--out", str(out), "--device", "cpu", "--seconds", "0.3",
                           "--batch-size", "4"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    assert [(s["step"], s["exit"]) for s in report["steps"]] == [("loader", 0), ("train", 0), ("ddp", 0)]
    assert report["loader"]["dataset"]["samples"] == 21 and report["machine"]["device"] == "cpu"
    table = (out / "gpu_check.md").read_text()
    assert "| ddp | 0 |" in table and "num_workers" in table and "waiting for data" in table
    assert "epoch 0:" in (out / "ddp.log").read_text()


@pytest.mark.parametrize(("option", "said"), [
    (["--save-every", "0"], "--save-every: expected an integer of at least 1"),
    (["--max-steps", "-1"], "--max-steps: expected an integer of at least 0, got -1"),
    (["--epochs", "0"], "--epochs: expected an integer of at least 1, got 0"),
    (["--device", "bogus"], "'bogus' is not a torch device"),
    (["--device", "cuda:7"], "'cuda:7': "),
])
def test_example_refuses_a_wrong_option_value_with_exit_2(manifest, option, said, capsys):
    """--save-every 0 was a ZeroDivisionError, --device bogus or cuda without CUDA a RuntimeError:
    tracebacks, exit 1, where the docstring promises exit 2 for a wrong option. --max-steps -1 trained
    one step and --epochs 0 none, both exiting 0 as if the run had done what was asked."""
    example = load_example()
    with pytest.raises(SystemExit) as stopped:
        example.main(["--manifest", str(manifest.parent), "--epochs", "1", *option])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err


def test_example_names_the_size_fix_when_samples_differ_in_size_only(tmp_path, monkeypatch, capsys):
    """Samples of one channel count and several sizes: the script offered --sources and
    transform.channels, neither of which makes one shape."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    manifest = build_dataset(tmp_path / "sizes", shard_sizes=(6,), shape=None, shapes=[(1, 4, 4), (1, 6, 5)])
    doc = json.loads(manifest.read_text())
    body = {k: v for k, v in doc.items() if k not in ("dataset_hash", "version", "created_at")}
    body["sample_schema"]["shapes"] = {"src": [[1, 4, 4], [1, 6, 5]]}  # as a build lists each source's shapes
    manifest.write_text(json.dumps(seal_manifest(body)))
    example = load_example()
    with pytest.raises(SystemExit) as stopped:
        example.main(["--manifest", str(manifest.parent), "--epochs", "1", "--device", "cpu"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "this model takes one shape; build the dataset with one size (transform.<kind>.size" in err, err
    assert "transform.channels" not in err and "--sources" not in err
