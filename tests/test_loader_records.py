"""ShardDataset(records=True) on multi-label builds: records batch in a plain torch DataLoader,
the README names the record's keys as they are, and a process that reads a view exits cleanly.

The builds are real (PNG photos, a table with a multi-label column, webdataset and Parquet);
the expected labels are the raw table's, read here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_targets import _build, _job, _photo_table

torch = pytest.importorskip("torch", reason="the loader extra")

from packer.loader import ShardDataset  # noqa: E402

#: Each row's findings: any number of labels, so a record's "labels" list varies in length
FINDINGS = ["a|b", "b", "", "a", "a|b|c", "c", "", "b", "a", "a|b", "", "b|c"]


@pytest.fixture(scope="module", params=["webdataset", "parquet"])
def multilabel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp(f"records-{request.param}")
    raw = _photo_table(tmp, [{"path": f"{i}.png", "findings": value, "entity": f"E{i}", "timestamp": "2024-01-01"}
                             for i, value in enumerate(FINDINGS)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "multilabel", "column": "findings"}}
    return _build(_job(tmp, [source], request.param)).manifest_path


def _readme_loader_snippet() -> str:
    """The README's first loader snippet (the one a user copies first)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Loading shards in PyTorch"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]  # type: ignore[index]


@pytest.mark.parametrize("workers", [0, 2])
def test_readme_snippet_with_records_batches_multilabel_records_in_a_plain_dataloader(multilabel: Path,
                                                                                     workers: int) -> None:
    snippet = _readme_loader_snippet()
    assert 'ShardDataset("build/demo/<version>/manifest.json", "train")' in snippet
    assert "DataLoader(dataset, batch_size=32, num_workers=2)" in snippet
    # the snippet as written, on this build, with records=True, its 12 samples in batches of 5, its multi-hot target
    code = (snippet.replace('"build/demo/<version>/manifest.json", "train"', f'"{multilabel}", "train", records=True')
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


def test_the_readme_names_the_record_keys_as_records_have_them(multilabel: Path) -> None:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Loading shards in PyTorch"):]
    sentence = section[section.index("`records=True` adds"):]
    sentence = sentence[:sentence.index("\n\n")]
    named = set(re.findall(r"`([a-z_]+)`", sentence))
    (record, *_) = (item["record"] for item in ShardDataset(multilabel, "train", shuffle=False, records=True))
    assert set(record) <= named, f"README does not name {set(record) - named}"
    assert {"entity", "target"} & named == {"target"}  # "target" is a numeric dataset's; there is no "entity"
    assert "entity_id" in record and "labels" in record
