"""The report's sample index stays columnar: selection, label counts and key lookups over Arrow
columns give exactly what the former per-row Python objects gave (same samples, same order)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.htmlreport import shards
from packer.htmlreport.collect import ReportData, ReportLimits, _select
from packer.htmlreport.shards import IndexEntry, SampleIndex, load_index, selection_rank
from packer.targets import Target

SPLITS = ["train", "valid", "test", "extra"]
# label 1 is named "3", as an unmapped label 3 is: two label values share one contact sheet
LABEL_NAMES = {0: "normal", 1: "3", 2: "nodule"}


def reference_select(entries: list[IndexEntry], limits: ReportLimits, label_names: dict[int, str],
                     dataset_hash: str) -> dict[str, Any]:
    """The selection as it was computed over one IndexEntry per row (sorted by rank, counted in a loop)."""
    ranked = sorted(entries, key=lambda e: selection_rank(dataset_hash, e.key))
    label_totals: dict[str, Counter[str]] = {}
    for entry in entries:
        label_totals.setdefault(entry.split, Counter())[label_names.get(entry.label, str(entry.label))] += 1
    shown = {split: {name for name, _ in counts.most_common(limits.labels_per_split)}
             for split, counts in label_totals.items()}
    histogram: set[str] = set()
    per_split: Counter[str] = Counter()
    sheets: dict[tuple[str, str], list[str]] = defaultdict(list)
    for entry in ranked:
        if per_split[entry.split] < limits.histogram_samples:
            per_split[entry.split] += 1
            histogram.add(entry.key)
        label = label_names.get(entry.label, str(entry.label))
        cell = sheets[(entry.split, label)]
        if label in shown[entry.split] and len(cell) < limits.per_sheet:
            cell.append(entry.key)
    totals = Counter(e.split for e in entries)
    return {"histogram": histogram, "sheets": {cell: keys for cell, keys in sheets.items() if keys},
            "label_totals": [(split, list(counts.items())) for split, counts in label_totals.items()],
            "histogram_totals": [(split, (per_split[split], totals[split])) for split in totals]}


def columnar_select(index: SampleIndex, limits: ReportLimits, label_names: dict[int, str],
                    dataset_hash: str) -> dict[str, Any]:
    data = ReportData(manifest={"dataset_hash": dataset_hash}, folder=Path("."), limits=limits, splits=[],
                      kinds={}, target=Target("class", tuple(label_names[i] for i in range(len(label_names)))))
    histogram, sheets = _select(index, data)
    return {"histogram": histogram, "sheets": sheets,
            "label_totals": [(split, list(counts.items())) for split, counts in data.label_totals.items()],
            "histogram_totals": list(data.histogram_totals.items())}


def random_entries(rng: random.Random, n: int, distinct_keys: int) -> list[IndexEntry]:
    """``n`` rows over at most ``distinct_keys`` keys (fewer keys than rows: some keys repeat)."""
    splits = rng.sample(SPLITS, rng.randint(1, len(SPLITS)))
    return [IndexEntry(key=f"k{rng.randrange(distinct_keys)}·é", split=rng.choice(splits), shard=f"s{i % 3}.tar",
                       position=i * 512, label=rng.choice([0, 0, 0, 1, 2, 3, 7]), entity_id=f"E{rng.randrange(9)}",
                       source=rng.choice(["ct", "photos"]))
            for i in range(n)]


limits_strategy = st.builds(ReportLimits, sheet_columns=st.integers(1, 4), sheet_rows=st.integers(1, 2),
                            labels_per_split=st.integers(1, 5), histogram_samples=st.integers(0, 12))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 120), limits=limits_strategy, dataset_hash=st.text(max_size=8))
def test_the_columnar_selection_equals_the_per_row_selection(seed: int, n: int, limits: ReportLimits,
                                                            dataset_hash: str) -> None:
    rng = random.Random(seed)
    entries = random_entries(rng, n, distinct_keys=max(1, rng.choice([n, n, n // 2])))
    assert columnar_select(SampleIndex.from_entries(entries), limits, LABEL_NAMES, dataset_hash) == \
        reference_select(entries, limits, LABEL_NAMES, dataset_hash)


def test_an_index_read_from_parquet_in_several_row_groups_selects_as_the_rows_do(tmp_path: Path) -> None:
    rng = random.Random(7)
    entries = random_entries(rng, 3000, distinct_keys=2900)
    pq.write_table(pa.Table.from_pylist([vars_of(e) for e in entries]), tmp_path / "_index.parquet",
                   row_group_size=400)
    index, note = load_index(tmp_path, {})
    assert note is None and len(index) == len(entries)
    limits = ReportLimits(histogram_samples=150, sheet_columns=4, sheet_rows=3, labels_per_split=3)
    assert columnar_select(index, limits, LABEL_NAMES, "h") == reference_select(entries, limits, LABEL_NAMES, "h")


def vars_of(entry: IndexEntry) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in shards._INDEX_COLUMNS}


@pytest.mark.parametrize("batch", [1, 3, 4096])
def test_rank_order_sorts_rows_as_sorted_does_across_batches(monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    monkeypatch.setattr(shards, "_RANK_BATCH", batch)
    entries = random_entries(random.Random(3), 50, distinct_keys=30)
    expected = sorted(range(len(entries)), key=lambda i: selection_rank("h", entries[i].key))  # stable: row order
    assert SampleIndex.from_entries(entries).rank_order("h").tolist() == expected
    assert SampleIndex.from_entries([]).rank_order("h").tolist() == []


def test_entries_by_key_are_the_rows_a_dict_of_every_row_gives(tmp_path: Path) -> None:
    entries = random_entries(random.Random(5), 400, distinct_keys=300)
    every_row = {e.key: e for e in entries}  # a key listed twice: its last row
    pq.write_table(pa.Table.from_pylist([vars_of(e) for e in entries]), tmp_path / "_index.parquet")
    asked = set(random.Random(6).sample(sorted(every_row), 60)) | {"missing", ""}
    for index in (SampleIndex.from_entries(entries), load_index(tmp_path, {})[0]):
        found = index.entries(asked)
        assert found == {k: every_row[k] for k in asked if k in every_row}
        assert all(type(e.label) is int and type(e.split) is str for e in found.values())
        assert index.entries([]) == {}


def test_an_empty_index_selects_nothing() -> None:
    assert columnar_select(SampleIndex.from_entries([]), ReportLimits(), LABEL_NAMES, "h") == {
        "histogram": set(), "sheets": {}, "label_totals": [], "histogram_totals": []}


def test_null_splits_and_labels_select_as_the_rows_do(tmp_path: Path) -> None:
    """The index file's columns are non-null as packer writes them; a null (another writer) still
    groups as its own value, as it did as None in a Python row."""
    rng = random.Random(11)
    entries = [IndexEntry(key=e.key, split=None if i % 7 == 0 else e.split, shard=e.shard,  # type: ignore[arg-type]
                          position=e.position, label=None if i % 5 == 0 else e.label,  # type: ignore[arg-type]
                          entity_id=e.entity_id, source=e.source)
               for i, e in enumerate(random_entries(rng, 300, distinct_keys=300))]
    pq.write_table(pa.Table.from_pylist([vars_of(e) for e in entries]), tmp_path / "_index.parquet")
    limits = ReportLimits(histogram_samples=20, sheet_columns=2, sheet_rows=2, labels_per_split=3)
    expected = reference_select(entries, limits, LABEL_NAMES, "h")
    assert any(split is None for split, _ in expected["label_totals"])
    for index in (SampleIndex.from_entries(entries), load_index(tmp_path, {})[0]):
        assert columnar_select(index, limits, LABEL_NAMES, "h") == expected
