"""Splits: a pure function of (seed, entity), stable under shuffling and growth; audited."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import SplitConfig
from packer.errors import LeakageError
from packer.records import SampleRef
from packer.split import assign_splits, audit_splits, entity_unit, raise_on_leakage, split_for_time

RATIOS = (("train", 0.8), ("valid", 0.1), ("test", 0.1))
BY_ENTITY = SplitConfig(by="entity", ratios=RATIOS, seed=17)


def ref(i: int, entity: str, time: str | None = None) -> SampleRef:
    return SampleRef(sample_id=f"s-{i:06d}", source="s", kind="image", path=f"/raw/{i}.png", relpath=f"{i}.png",
                     label="a", entity=entity, time=time)


entities = st.lists(st.text(alphabet="ABCDEFGHIJ0123456789", min_size=1, max_size=6), min_size=1, max_size=60)


@given(entities, st.integers(min_value=0, max_value=2**31))
@settings(max_examples=60, deadline=None)
def test_no_entity_in_two_splits_and_order_does_not_matter(ents: list[str], seed: int) -> None:
    cfg = SplitConfig(by="entity", ratios=RATIOS, seed=seed)
    refs = [ref(i, e) for i, e in enumerate(ents)]
    assignment = assign_splits(refs, cfg)
    shuffled = refs[:]
    random.Random(seed).shuffle(shuffled)
    assert assign_splits(shuffled, cfg) == assignment
    assert audit_splits(refs, assignment).entity_overlap == {}


@given(entities, entities)
@settings(max_examples=60, deadline=None)
def test_new_entities_never_move_old_ones(old: list[str], new: list[str]) -> None:
    old_refs = [ref(i, e) for i, e in enumerate(old)]
    new_refs = old_refs + [ref(10_000 + i, e) for i, e in enumerate(new)]
    before = assign_splits(old_refs, BY_ENTITY)
    after = assign_splits(new_refs, BY_ENTITY)
    assert all(after[sid] == split for sid, split in before.items())


def test_ratios_are_met_within_sampling_error() -> None:
    refs = [ref(i, f"P{i:05d}") for i in range(20_000)]
    counts = Counter(assign_splits(refs, BY_ENTITY).values())
    # binomial sd for p=0.1, n=20000 is ~42; allow 5 sd
    assert abs(counts["valid"] - 2000) < 215 and abs(counts["test"] - 2000) < 215


def test_entity_unit_is_uniform_and_seeded() -> None:
    assert entity_unit("P1", 1) != entity_unit("P1", 2)
    assert 0 <= entity_unit("P1", 1) < 1
    assert entity_unit("P1", 1) == entity_unit("P1", 1)


def test_time_split_puts_whole_entity_where_it_first_appears() -> None:
    cfg = SplitConfig(by="time", ratios=RATIOS, seed=0, cutoffs=(("test", "2024-07-01"), ("valid", "2024-01-01")))
    refs = [ref(0, "A", "2023-05-01"), ref(1, "A", "2024-08-01"),  # straddler, first seen in train
            ref(2, "B", "2024-02-01T10:00:00"), ref(3, "C", "2024-07-01")]
    assignment = assign_splits(refs, cfg)
    assert assignment == {"s-000000": "train", "s-000001": "train", "s-000002": "valid", "s-000003": "test"}
    audit = audit_splits(refs, assignment)
    assert audit.time_ranges["train"] == ("2023-05-01", "2024-08-01")


def test_split_for_time_boundaries() -> None:
    cutoffs = {"valid": "2024-01-01", "test": "2024-07-01"}
    assert split_for_time("2023-12-31T23:59:59", cutoffs) == "train"
    assert split_for_time("2024-01-01", cutoffs) == "valid"
    assert split_for_time("2024-01-01T00:00:01", cutoffs) == "valid"
    assert split_for_time("2024-07-01", cutoffs) == "test"


def test_audit_catches_a_leak_and_names_the_entity() -> None:
    refs = [ref(0, "P9"), ref(1, "P9")]
    audit = audit_splits(refs, {"s-000000": "train", "s-000001": "test"})
    assert audit.entity_overlap == {"P9": ("train", "test")}
    with pytest.raises(LeakageError, match="P9"):
        raise_on_leakage(audit)
