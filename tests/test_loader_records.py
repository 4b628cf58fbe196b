"""ShardDataset(records=True) on multi-label builds: records batch in a plain torch DataLoader,
the README names the record's keys as they are, and a process that reads a view exits cleanly.

The builds are real (PNG photos, a table with a multi-label column, webdataset and Parquet);
the expected labels are the raw table's, read here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_targets import _build, _job, _photo_table

torch = pytest.importorskip("torch", reason="the loader extra")

from packer.loader import ShardDataset  # noqa: E402

#: Each row's findings: any number of labels, so a record's "labels" list varies in length
FINDINGS = ["a|b", "b", "", "a", "a|b|c", "c", "", "b", "a", "a|b", "", "b|c"]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The manifest of a multi-label build per shard format."""
    out = {}
    for fmt in ("webdataset", "parquet"):
        tmp = tmp_path_factory.mktemp(f"records-{fmt}")
        raw = _photo_table(tmp, [{"path": f"{i}.png", "findings": value, "entity": f"E{i}",
                                  "timestamp": "2024-01-01"} for i, value in enumerate(FINDINGS)])
        source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
                  "label": {"kind": "multilabel", "column": "findings"}}
        out[fmt] = _build(_job(tmp, [source], fmt)).manifest_path
    return out


def _readme_loader_snippet() -> str:
    """The README's first loader snippet (the one a user copies first)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Loading shards in PyTorch"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]  # type: ignore[index]


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
@pytest.mark.parametrize("workers", [0, 2])
def test_readme_snippet_with_records_batches_multilabel_records_in_a_plain_dataloader(builds: dict[str, Path],
                                                                                     fmt: str, workers: int) -> None:
    multilabel = builds[fmt]
    snippet = _readme_loader_snippet()
    # the snippet names the demo's own version (the same on every machine), as a user pastes it
    demo = re.search(r'ShardDataset\("(build/demo/[0-9a-f]{12}/manifest\.json)", "train"\)', snippet)
    assert demo is not None, snippet
    assert "DataLoader(dataset, batch_size=32, num_workers=2)" in snippet
    # the snippet as written, on this build, with records=True, its 12 samples in batches of 5, its multi-hot target
    code = (snippet.replace(f'"{demo[1]}", "train"', f'"{multilabel}", "train", records=True')
            .replace("batch_size=32, num_workers=2", f"batch_size=5, num_workers={workers}")
            .replace('batch["label"]', 'batch["target"]')
            .replace("    images, labels =", "    seen.append(batch)\n    images, labels ="))
    scope: dict[str, object] = {"seen": []}
    exec(compile(code, "README.md", "exec"), scope)
    batches: list[dict] = scope["seen"]  # type: ignore[assignment]
    # an IterableDataset: each worker makes its own batches, its last one short
    assert sum(len(b["record"]) for b in batches) == 12 and max(len(b["record"]) for b in batches) == 5
    names = ["a", "b", "c"]
    for batch in batches:
        assert isinstance(batch["record"], list) and all(isinstance(r, dict) for r in batch["record"])
        assert [r["key"] for r in batch["record"]] == batch["key"]
        for record, target in zip(batch["record"], batch["target"], strict=True):
            assert record["labels"] == [n for n, on in zip(names, target.tolist(), strict=True) if on]
    seen = sorted(tuple(r["labels"]) for b in batches for r in b["record"])
    assert seen == sorted(tuple(f.split("|")) if f else () for f in FINDINGS)


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_the_readme_names_the_record_keys_as_records_have_them(builds: dict[str, Path], fmt: str) -> None:
    multilabel = builds[fmt]
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Loading shards in PyTorch"):]
    sentence = section[section.index("`records=True` adds"):]
    sentence = sentence[:sentence.index("\n\n")]
    named = set(re.findall(r"`([a-z_]+)`", sentence))
    (record, *_) = (item["record"] for item in ShardDataset(multilabel, "train", shuffle=False, records=True))
    assert set(record) <= named, f"README does not name {set(record) - named}"
    assert {"entity", "target"} & named == {"target"}  # "target" is a numeric dataset's; there is no "entity"
    assert "entity_id" in record and "labels" in record


#: A process that opens a labels= view and exits (the report's script); it prints the threads
#: the view left running, as Linux names them (Arrow's pool threads are named after the process)
VIEW_SCRIPT = """
import os, sys
from packer.loader import ShardDataset

def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

before = threads()
d = ShardDataset(sys.argv[1], "train", labels=["b"]); n = len(d)
after = threads()
for name in before:
    after.remove(name)
print(n, [t for t in after if t != "jemalloc_bg_thd"])  # jemalloc's is a plain pthread, no std::thread
"""


@pytest.mark.slow  # 24 interpreters that import torch
def test_a_process_that_reads_a_labels_view_exits_cleanly_every_time(builds: dict[str, Path], tmp_path: Path) -> None:
    """A view reads _index.parquet; Arrow's thread pools, started by pq.read_table, were still
    alive at interpreter exit in about 1 run in 10 and aborted it (exit 134, "terminate called
    without an active exception"). The index is read on the calling thread: no pool thread
    outlives the view, and 24 runs exit 0."""
    import subprocess
    import sys

    script = tmp_path / "view.py"
    script.write_text(VIEW_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    expected = f"{sum('b' in f.split('|') for f in FINDINGS)} []"
    runs = 24
    for start in range(0, runs, 4):  # four at a time
        procs = [subprocess.Popen([sys.executable, str(script), str(builds["parquet"])], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(start, start + 4)]
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and "terminate called" not in err, (proc.returncode, err[-2000:])
            assert out.strip() == expected, out  # the view's size, and no thread left behind by reading it
