"""Splits: a pure function of (seed, entity), stable under shuffling and growth; grouped; pinned."""

from __future__ import annotations

import json
import pickle
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import SplitConfig
from packer.errors import ConfigError
from packer.pipeline.audit import audit_assignment
from packer.pipeline.nearcopy import Evidence, EvidenceArrays, NearLinks
from packer.pipeline.split import SplitGroup, assign_splits, entity_unit, split_for_time
from packer.records import SampleRef, SpilledSample
from packer.targets import MultiLabelTarget

RATIOS = (("train", 0.8), ("valid", 0.1), ("test", 0.1))
BY_ENTITY = SplitConfig(by="entity", ratios=RATIOS, seed=17)
TIME = SplitConfig(by="time", ratios=RATIOS, seed=0, cutoffs=(("test", "2024-07-01"), ("valid", "2024-01-01")))


def sample(i: int, entity: str, *, time: str | None = None, label: str = "a", sha: str | None = None) -> SpilledSample:
    ref = SampleRef(sample_id=f"s-{i:06d}", source="s", kind="image", path=f"/raw/{i}.png", relpath=f"{i}.png",
                    label=label, entity=entity, time=time)
    return SpilledSample(key=ref.sample_id, ref=ref, spill="x", offset=0, pixel_bytes=1, meta_bytes=1, shape=(1, 1, 1),
                         dtype="uint8", sha256=sha or f"{i:064x}")


def links(*pairs: tuple[int, int]) -> NearLinks:
    """Verified near copies between sample indices, with the evidence of a clear copy."""
    evidence = EvidenceArrays.of([Evidence(structure=0.9, detail=0.9, intensity=0.99, zoom=1.0, dy=0, dx=0)
                                  for _ in pairs])
    return NearLinks(np.array([min(p) for p in pairs]), np.array([max(p) for p in pairs]),
                     np.full(len(pairs), 0.99, dtype=np.float32), evidence, candidates=len(pairs))


def split_of(samples: list[SpilledSample], cfg: SplitConfig = BY_ENTITY) -> dict[str, str]:
    return assign_splits(sorted(samples, key=lambda s: s.key), cfg).split


entities = st.lists(st.text(alphabet="ABCDEFGHIJ0123456789", min_size=1, max_size=6), min_size=1, max_size=60)


@given(entities, st.integers(min_value=0, max_value=2**31))
@settings(max_examples=50, deadline=None)
def test_no_entity_in_two_splits_and_order_does_not_matter(ents: list[str], seed: int) -> None:
    cfg = replace(BY_ENTITY, seed=seed)
    samples = [sample(i, e) for i, e in enumerate(ents)]
    assignment = assign_splits(samples, cfg)
    shuffled = samples[:]
    random.Random(seed).shuffle(shuffled)
    assert assign_splits(shuffled, cfg).split == assignment.split
    assert audit_assignment(samples, assignment, cfg).rule("entity_overlap").count == 0


@given(entities, entities)
@settings(max_examples=50, deadline=None)
def test_new_entities_never_move_old_ones(old: list[str], new: list[str]) -> None:
    before = split_of([sample(i, e) for i, e in enumerate(old)])
    after = split_of([sample(i, e) for i, e in enumerate(old)] + [sample(10_000 + i, e) for i, e in enumerate(new)])
    assert all(after[key] == split for key, split in before.items())


@given(st.lists(st.integers(min_value=0, max_value=499), min_size=1, max_size=30, unique=True),
       st.integers(min_value=0, max_value=2**31))
@settings(max_examples=50, deadline=None)
def test_a_new_copy_under_an_id_sorting_after_the_groups_keeps_the_group_where_it_was(
        copied: list[int], seed: int) -> None:
    """The README's growth rule: an old patient whose image a new patient's file copies stays in
    its split when the new id sorts after the group's smallest (sequential record numbers); one
    sorting before it gives the group another id to hash (documented: the split is a function of
    the inputs alone, so it cannot know which member came first)."""
    cfg = replace(BY_ENTITY, seed=seed)
    old = [sample(i, f"P{i:05d}") for i in range(500)]
    before = split_of(old, cfg)
    after = split_of(old + [sample(20_000 + k, f"Q{k:05d}", sha=old[i].sha256) for k, i in enumerate(copied)], cfg)
    assert all(after[key] == split for key, split in before.items())
    assert all(after[f"s-{20_000 + k:06d}"] == before[old[i].key] for k, i in enumerate(copied))
    first = split_of(old + [sample(20_000 + k, f"A{k:05d}", sha=old[i].sha256) for k, i in enumerate(copied)], cfg)
    assert all(first[f"s-{20_000 + k:06d}"] == first[old[i].key] for k, i in enumerate(copied))  # still one group


def test_ratios_are_met_within_sampling_error() -> None:
    counts = Counter(split_of([sample(i, f"P{i:05d}") for i in range(20_000)]).values())
    # binomial sd for p=0.1, n=20000 is ~42; allow 5 sd
    assert abs(counts["valid"] - 2000) < 215 and abs(counts["test"] - 2000) < 215


def test_entity_unit_is_uniform_and_seeded() -> None:
    assert entity_unit("P1", 1) != entity_unit("P1", 2)
    assert 0 <= entity_unit("P1", 1) < 1


@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from("abc")), min_size=30, max_size=200),
       st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_stratified_split_keeps_every_label_in_every_split_when_possible(rows: list[tuple[int, str]],
                                                                         seed: int) -> None:
    cfg = replace(BY_ENTITY, stratify="label", seed=seed)
    samples = [sample(i, f"E{e}", label=label) for i, (e, label) in enumerate(rows)]
    split = assign_splits(samples, cfg).split
    assert assign_splits(list(reversed(samples)), cfg).split == split
    assert audit_assignment(samples, assign_splits(samples, cfg), cfg).rule("entity_overlap").count == 0
    for label in {lab for _, lab in rows}:
        # an entity is the unit: a label can reach all three splits only if >= 3 entities carry it
        carriers = {e for e, lab in rows if lab == label}
        if len(carriers) >= 12:
            present = {split[s.key] for s in samples if s.ref.label == label}
            assert present == {"train", "valid", "test"}, (label, len(carriers))


@given(st.lists(st.tuples(st.integers(0, 60), st.sets(st.sampled_from("abcd"), max_size=3)), min_size=60,
                max_size=240), st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
def test_multilabel_stratification_spreads_every_label_not_every_combination(
        rows: list[tuple[int, set[str]]], seed: int) -> None:
    """A multi-label sample counts under each of its labels: a label carried by enough entities
    reaches every split, even when each combination of labels is rare."""
    cfg = replace(BY_ENTITY, stratify="label", seed=seed)
    samples = [sample(i, f"E{e}", label="|".join(sorted(labels))) for i, (e, labels) in enumerate(rows)]
    split = assign_splits(samples, cfg, strata=MultiLabelTarget.held_names).split
    assert assign_splits(list(reversed(samples)), cfg, strata=MultiLabelTarget.held_names).split == split
    for label in "abcd":
        carriers = {e for e, labels in rows if label in labels}
        if len(carriers) >= 12:
            present = {split[s.key] for s, (_, labels) in zip(samples, rows, strict=True) if label in labels}
            assert present == {"train", "valid", "test"}, (label, len(carriers))


def test_a_label_on_enough_entities_reaches_every_split_even_when_its_carriers_hold_commoner_labels() -> None:
    """Found by the property above: label c on 12 entities (one large, the others of one or two
    samples, most also carrying a and b) reached train and test but never valid, because the greedy pass
    scores a group by its average need over all its labels and valid had its a and b already.
    The repair pass moves the smallest carrier that is no split's last carrier of any label."""
    rows = [(0, set())] * 41 + [(0, {"a"})] * 3 + [(3, {"c"}), (3, {"d"}), (5, {"b"}), (5, {"c"}), (2, {"a", "b"}),
                                                  (2, {"b", "d"}), (4, {"b", "c"}), (0, {"a", "b", "c"}),
                                                  (1, {"a", "c", "d"})]
    rows += [(e, {"a", "b", "c"}) for e in range(6, 11)] + [(11, {"a", "c", "d"}), (12, {"a", "b", "c"})]
    cfg = replace(BY_ENTITY, stratify="label", seed=0)
    samples = [sample(i, f"E{e}", label="|".join(sorted(labels))) for i, (e, labels) in enumerate(rows)]
    split = assign_splits(samples, cfg, strata=MultiLabelTarget.held_names).split
    assert audit_assignment(samples, assign_splits(samples, cfg, strata=MultiLabelTarget.held_names),
                            cfg).rule("entity_overlap").count == 0
    for label in "abc":
        present = {split[s.key] for s, (_, labels) in zip(samples, rows, strict=True) if label in labels}
        assert present == {"train", "valid", "test"}, label


def test_multilabel_stratification_beats_stratifying_by_combination() -> None:
    """Every label's share per split stays near the ratios; treating each combination as a
    class (what a single-label rule would do) cannot see the labels inside it."""
    rng = np.random.default_rng(3)
    rows = [(e, {lab for lab in "abcde" if rng.random() < 0.25}) for e in range(300) for _ in range(2)]
    samples = [sample(i, f"E{e}", label="|".join(sorted(labels))) for i, (e, labels) in enumerate(rows)]
    cfg = replace(BY_ENTITY, stratify="label")

    def worst(split: dict[str, str]) -> float:
        gaps = []
        for label in "abcde":
            keys = [s.key for s, (_, labels) in zip(samples, rows, strict=True) if label in labels]
            for name, ratio in RATIOS:
                gaps.append(abs(sum(split[k] == name for k in keys) / len(keys) - ratio))
        return max(gaps)

    per_label = worst(assign_splits(samples, cfg, strata=MultiLabelTarget.held_names).split)
    per_combination = worst(assign_splits(samples, cfg).split)
    assert per_label < 0.03 and per_label < per_combination / 2   # measured: 0.012 against 0.047


def test_duplicates_across_entities_are_grouped_into_one_split() -> None:
    samples = [sample(i, f"P{i}") for i in range(200)]
    samples.append(sample(500, "Q1", sha=samples[0].sha256))       # exact copy under another patient
    samples.append(sample(501, "Q2"))                                 # a verified near copy of sample 1
    near = links((1, 201))
    assignment = assign_splits(samples, BY_ENTITY, near)
    assert assignment.split["s-000500"] == assignment.split["s-000000"]
    assert assignment.split["s-000501"] == assignment.split["s-000001"]
    report = audit_assignment(samples, assignment, BY_ENTITY, near)
    assert not report.failed
    assert report.rule("duplicates_span_entities").count == 2
    # without grouping, a near copy in another split fails the audit, which names the link's evidence
    apart = replace(BY_ENTITY, duplicates="fail")
    split = assign_splits(samples, apart).split
    other = next(k for k, s in enumerate(samples) if split[s.key] != split["s-000001"])
    rule = audit_assignment(samples, assign_splits(samples, apart, links((1, other))), apart,
                            links((1, other))).rule("near_duplicates_across_splits")
    assert rule.failed and rule.count == 1
    assert rule.findings[0]["intensity"] == pytest.approx(0.99) and rule.findings[0]["shift"] == [0, 0]


def test_without_grouping_a_duplicate_across_splits_fails_the_audit() -> None:
    cfg = replace(BY_ENTITY, duplicates="fail")
    samples = [sample(i, f"P{i}") for i in range(100)]
    split = assign_splits(samples, cfg).split
    other = next(s for s in samples if split[s.key] != split["s-000000"])
    samples.append(sample(999, other.ref.entity or "", sha=samples[0].sha256))
    report = audit_assignment(samples, assign_splits(samples, cfg), cfg)
    assert report.failed and report.rule("exact_duplicates_across_splits").count == 1
    reported = audit_assignment(samples, assign_splits(samples, replace(cfg, duplicates="report")),
                                replace(cfg, duplicates="report"))
    assert not reported.failed and reported.rule("exact_duplicates_across_splits").count == 1


def test_time_split_puts_whole_entity_where_it_first_appears() -> None:
    samples = [sample(0, "A", time="2023-05-01"), sample(1, "A", time="2024-08-01"),
               sample(2, "B", time="2024-02-01T10:00:00"), sample(3, "C", time="2024-07-01")]
    assignment = assign_splits(samples, TIME)
    assert assignment.split == {"s-000000": "train", "s-000001": "train", "s-000002": "valid", "s-000003": "test"}
    report = audit_assignment(samples, assignment, TIME)
    assert report.rule("time_order").count == 2  # A's 2024-08 record sits in train after both cutoffs
    # each finding names the train records that do (by key and entity, as every finding; no date
    # under PHI), so the user can see whose later studies are in train, and how to drop them
    for finding in report.rule("time_order").findings:
        assert finding["train_samples_after"] == 1
        assert [(s["key"], s["entity_id"]) for s in finding["train_samples"]] == [("s-000001", "A")]
        assert "drop_straddlers" in finding["fix"]
    hidden = audit_assignment(samples, assignment, TIME, show_paths=False, show_dates=False)
    # no record's date under PHI: only the job's own cutoff, which starts the later split's period
    # (the report's time-order table was blank without it)
    for finding in hidden.rule("time_order").findings:
        assert finding["starts"] == dict(TIME.cutoffs)[finding["split"]]
        assert "2024" not in json.dumps({k: v for k, v in finding.items() if k != "starts"})
    assert hidden.rule("time_order").findings[0]["train_samples"][0]["key"] == "s-000001"


def test_time_order_names_valid_records_that_fall_in_the_test_period() -> None:
    # B is first seen in valid and again after the test cutoff: first_seen keeps its 2024-09
    # record in valid, after test's earliest record. The rule compared train with the later
    # splits only, so it said nothing; train's own findings keep their fields.
    samples = [sample(0, "A", time="2023-05-01"), sample(1, "B", time="2024-02-01"),
               sample(2, "B", time="2024-09-01"), sample(3, "C", time="2024-08-01")]
    assignment = assign_splits(samples, TIME)
    assert assignment.split == {"s-000000": "train", "s-000001": "valid", "s-000002": "valid", "s-000003": "test"}
    report = audit_assignment(samples, assignment, TIME)
    assert report.rule("time_order").count == 1
    finding = report.rule("time_order").findings[0]
    assert (finding["from"], finding["split"], finding["valid_samples_after"]) == ("valid", "test", 1)
    assert [(s["key"], s["entity_id"]) for s in finding["valid_samples"]] == [("s-000002", "B")]
    assert (finding["earliest"], finding["latest_valid"]) == ("2024-08-01", "2024-09-01")
    assert "drop_straddlers" in finding["fix"] and "valid records fall in test's period" in finding["fix"]
    hidden = audit_assignment(samples, assignment, TIME, show_paths=False, show_dates=False)
    assert "2024" not in json.dumps([{k: v for k, v in f.items() if k != "starts"}
                                     for f in hidden.rule("time_order").findings])
    # and train against valid and test at once: each later split its finding, train's fields as before
    samples.append(sample(4, "A", time="2024-10-01"))
    findings = audit_assignment(samples, assign_splits(samples, TIME), TIME).rule("time_order").findings
    assert [(f.get("from", "train"), f["split"]) for f in findings] == [("train", "valid"), ("train", "test"),
                                                                       ("valid", "test")]
    assert set(findings[0]) == {"split", "train_samples_after", "train_samples", "fix", "starts", "earliest",
                                "latest_train"}


def test_time_order_measures_a_later_split_from_its_cutoff_even_when_it_holds_nothing_yet() -> None:
    """A walkthrough's records: A's second study (2024-01-15) falls after the valid cutoff but
    before valid's earliest record (2024-02-01), and R's second (2024-09-01) after the test
    cutoff while test's earliest came later (2024-10-01). The rule measured a split's period from
    its earliest record, said nothing of either, and validate called the data clean, while
    drop_straddlers, by the cutoffs, drops exactly these two. A split with no record at all
    still has its period: a train record past the test cutoff is named too."""
    samples = [sample(0, "A", time="2023-06-01"), sample(1, "A", time="2024-01-15"),
               sample(2, "R", time="2024-02-01"), sample(3, "R", time="2024-09-01"), sample(4, "T", time="2024-10-01")]
    report = audit_assignment(samples, assign_splits(samples, TIME), TIME)
    named = {(f.get("from", "train"), f["split"], f["starts"]): [s["key"] for s in f.get(
        "train_samples", f.get("valid_samples", []))] for f in report.rule("time_order").findings}
    assert named == {("train", "valid", "2024-01-01"): ["s-000001"], ("valid", "test", "2024-07-01"): ["s-000003"]}
    dropped = assign_splits(samples, replace(TIME, entity_policy="drop_straddlers")).excluded
    assert sorted(e.sample_id for e in dropped) == ["s-000001", "s-000003"]
    lone = [sample(0, "A", time="2023-06-01"), sample(1, "A", time="2024-08-01")]  # valid and test hold nothing
    findings = audit_assignment(lone, assign_splits(lone, TIME), TIME).rule("time_order").findings
    assert [(f["split"], f["starts"], f["train_samples_after"]) for f in findings] == [
        ("valid", "2024-01-01", 1), ("test", "2024-07-01", 1)]
    assert all("earliest" not in f for f in findings)


def test_drop_straddlers_lists_the_records_it_leaves_out_as_excluded_not_bad() -> None:
    samples = [sample(0, "A", time="2023-05-01"), sample(1, "A", time="2024-08-01"), sample(2, "B", time="2024-02-01")]
    assignment = assign_splits(samples, replace(TIME, entity_policy="drop_straddlers"))
    assert assignment.split == {"s-000000": "train", "s-000002": "valid"}
    assert assignment.dropped == ()  # left out on purpose: no bad sample
    assert [(e.sample_id, e.why, e.stage) for e in assignment.excluded] == [("s-000001", "straddles_cutoff", "split")]
    assert "falls in test" in assignment.excluded[0].detail and "drop_straddlers" in assignment.excluded[0].detail


def test_the_group_share_counts_only_the_records_a_split_holds_after_dropping_straddlers() -> None:
    # Two entities, each with records in all three periods, joined by an exact copy: the group
    # holds 10 records, but drop_straddlers keeps only the 4 before the first cutoff. The
    # split_balance finding said "holds 10 samples (250%)": its size counted the dropped records,
    # its share divided them by the kept ones.
    months = ("2023-03-01", "2023-06-01", "2024-02-01", "2024-03-01", "2024-08-01")
    samples = [sample(5 * e + k, entity, time=month, sha=f"{5 * e + k:064x}" if k else "c" * 64)
               for e, entity in enumerate(("A", "B")) for k, month in enumerate(months)]
    samples += [sample(10 + i, f"P{i}", time="2023-04-01") for i in range(4)]
    cfg = replace(TIME, entity_policy="drop_straddlers")
    assignment = assign_splits(samples, cfg)
    assert len(assignment.split) == 8 and len(assignment.excluded) == 6
    finding = audit_assignment(samples, assignment, cfg).rule("split_balance").findings[0]
    assert (finding["group_size"], finding["group_share"]) == (4, 0.5)
    assert "holds 4 samples (50%" in finding["summary"]


def test_split_for_time_boundaries() -> None:
    cutoffs = {"valid": "2024-01-01", "test": "2024-07-01"}
    assert split_for_time("2023-12-31T23:59:59", cutoffs) == "train"
    assert split_for_time("2024-01-01", cutoffs) == "valid"
    assert split_for_time("2024-07-01", cutoffs) == "test"


def test_folds_are_entity_grouped_and_skip_test() -> None:
    samples = [sample(i, f"P{i // 3}") for i in range(600)]
    assignment = assign_splits(samples, replace(BY_ENTITY, folds=5))
    for key, split in assignment.split.items():
        assert (key in assignment.fold) == (split != "test")
    by_entity: dict[str, set[int]] = {}
    for s in samples:
        if s.key in assignment.fold:
            by_entity.setdefault(s.ref.entity or "", set()).add(assignment.fold[s.key])
    assert all(len(f) == 1 for f in by_entity.values())
    assert set(assignment.fold.values()) == {0, 1, 2, 3, 4}


def test_pinned_entities_go_where_pinned_and_conflicts_fail(tmp_path: Path) -> None:
    samples = [sample(i, f"P{i}") for i in range(50)]
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nP1,test\nP2,test\nP3,valid\n")
    split = assign_splits(samples, replace(BY_ENTITY, pinned=pins)).split
    assert (split["s-000001"], split["s-000002"], split["s-000003"]) == ("test", "test", "valid")
    samples.append(sample(77, "P3", sha=samples[1].sha256))  # P3 copies P1's image: same group, two pins
    # each entity is named with its own pin (sorted splits read as if P1 were pinned to valid), and the
    # fix is never split.duplicates: report, which would let the copy leak
    with pytest.raises(ConfigError, match=r"pinned to different splits \(P1 to test, P3 to valid\)") as refused:
        assign_splits(samples, replace(BY_ENTITY, pinned=pins))
    assert "duplicates: report" not in str(refused.value) and "pin them to one split" in str(refused.value)
    timed = [sample(0, "P1", time="2023-01-01")]
    with pytest.raises(ConfigError, match="pinned to test"):
        assign_splits(timed, replace(TIME, pinned=pins))
    pins.write_text("entity,split\nP1,holdout\n")
    with pytest.raises(ConfigError, match="row 2"):
        assign_splits(samples, replace(BY_ENTITY, pinned=pins))


def test_pinned_raw_ids_pin_their_pseudonymized_entities_and_a_stray_one_is_a_warning(tmp_path: Path) -> None:
    # under phi: pseudonymize the samples carry e-... pseudonyms while a frozen test table holds
    # the raw ids: no pin matched, the test set was not frozen, and nothing said so
    def pseudonym(raw: str) -> str:
        return f"e-{raw.lower()}"

    samples = [sample(i, pseudonym(f"P{i}")) for i in range(50)]
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nP1,test\nP2,test\ne-p3,valid\nP99,test\n")  # e-p3: copied from a manifest
    assignment = assign_splits(samples, replace(BY_ENTITY, pinned=pins), pseudonym=pseudonym)
    split = assignment.split
    assert (split["s-000001"], split["s-000002"], split["s-000003"]) == ("test", "test", "valid")
    (warning,) = assignment.warnings
    # the raw id stays out of the warning (printed, and in packer validate --json): the row names it
    assert "1 of its entities name no sample, e.g. the one at row 5;" in warning and "P99" not in warning
    assert str(pins) not in warning and warning.startswith("split.pinned: ")  # its folder may be a patient's name
    pins.write_text("entity,split\nP1,test\nP99,test\n")
    kept = assign_splits([sample(i, f"P{i}") for i in range(50)], replace(BY_ENTITY, pinned=pins))
    assert "e.g. the one at row 3: 'P99';" in kept.warnings[0]  # phi: keep writes raw ids anyway
    assert kept.warnings[0].startswith(f"split.pinned ({pins}): ")


def test_a_pinned_entity_whose_samples_drop_group_left_out_is_said_so_not_called_a_typo(tmp_path: Path) -> None:
    """drop_group left out every sample of P7 (a label conflict): the pin warning said "a typo, or
    an entity whose files were all bad samples", neither of which it was."""
    samples = [sample(i, f"P{i}") for i in range(20)]
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nP7,test\nP99,test\n")
    (warning,) = assign_splits(samples, replace(BY_ENTITY, pinned=pins), leave_out=frozenset({7})).warnings
    assert "2 of its entities name no sample, e.g. the one at row 3: 'P99'" in warning, warning
    assert ("(1 had every sample left out by split.duplicates.label_conflict: drop_group; 1: a typo, or an entity "
            "whose files were all bad samples)") in warning, warning
    pins.write_text("entity,split\nP7,test\n")
    (alone,) = assign_splits(samples, replace(BY_ENTITY, pinned=pins), leave_out=frozenset({7})).warnings
    assert alone.endswith("(1 had every sample left out by split.duplicates.label_conflict: drop_group)"), alone


def test_pins_that_disagree_under_phi_name_their_rows_not_pseudonyms(tmp_path: Path) -> None:
    """Under PHI the entities of a pin conflict were named by their pseudonyms (e-6770…), which
    the user, who wrote raw ids in the table, cannot map back to a row; README: pinned ids are
    named by their row."""
    def pseudonym(raw: str) -> str:
        return f"e-{raw.lower()}"

    samples = [sample(i, pseudonym(f"P{i}")) for i in range(10)]
    samples.append(sample(77, pseudonym("P3"), sha=samples[1].sha256))  # P3 copies P1's image: one group
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nP1,test\nP3,valid\n")
    with pytest.raises(ConfigError, match=r"pinned to different splits \(the one at row 2 to test, the one at row 3 "
                                          r"to valid\)") as refused:
        assign_splits(samples, replace(BY_ENTITY, pinned=pins), pseudonym=pseudonym)
    assert "e-p" not in str(refused.value)


def test_a_pinned_row_whose_cells_are_swapped_shows_no_id_under_phi(tmp_path: Path) -> None:
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nP1,test\ntest,MRN0777\n")
    with pytest.raises(ConfigError, match=r"row 3, column 'split': its cell \(not shown under PHI") as refused:
        assign_splits([sample(i, f"e-p{i}") for i in range(5)], replace(BY_ENTITY, pinned=pins),
                      pseudonym=lambda raw: f"e-{raw.lower()}")
    assert "MRN0777" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"row 3, column 'split': 'MRN0777' is not one of"):  # phi: keep
        assign_splits([sample(i, f"P{i}") for i in range(5)], replace(BY_ENTITY, pinned=pins))


def test_an_entity_pinned_twice_is_named_by_its_rows_not_its_raw_id(tmp_path: Path) -> None:
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nMRN0042,test\nP2,valid\nMRN0042,train\n")
    with pytest.raises(ConfigError, match="row 4: its entity is pinned at row 2 too, to another split") as err:
        assign_splits([sample(i, f"P{i}") for i in range(5)], replace(BY_ENTITY, pinned=pins))
    assert "MRN0042" not in str(err.value)


@pytest.mark.parametrize(("text", "match"), [
    # a cell over the csv module's default limit of 131,072 characters: read as tables.py reads one
    ("entity,split\n" + "P" * 200_000 + ",test\n", None),
    # an unclosed quote swallows the rows below into one cell: refused, naming the line it opens on
    ('entity,split\nP0,test\n"P1,valid\nP2,train\n', r"the 'entity' cell of the row on line 3 opens a quote"),
    ('entity,split\nP0,test\nP1,"valid\nP2,train\n', r"the 'split' cell of the row on line 3 opens a quote"),
    # on the last row it swallows nothing, and was read as if it closed (P1 pinned to valid)
    ('entity,split\nP0,test\nP1,"valid\n', r"the 'split' cell of the row on line 3 opens a quote \(\"\) that never"),
    ('entity,split\nP0,test\n"P1,valid\n', r"the 'entity' cell of the row on line 3 opens a quote \(\"\) that never"),
])
def test_a_pinned_table_reads_long_cells_and_refuses_an_unclosed_quote(
        tmp_path: Path, text: str, match: str | None) -> None:
    pins = tmp_path / "pins.csv"
    pins.write_text(text)
    from packer.pipeline.split import read_pinned_rows

    if match is None:
        assert read_pinned_rows(pins) == {"P" * 200_000: ("test", 2)}
        return
    with pytest.raises(ConfigError, match=match):
        read_pinned_rows(pins)


@pytest.mark.parametrize(("name", "sep", "hint"), [("pins.csv", ";", ""), ("pins.tsv", "\t", ""),
                                                  ("pins.csv", "\t", ""), ("pins.csv", ";", "sep=;\r\n")])
def test_a_pinned_table_is_separated_as_a_source_table_is(tmp_path: Path, name: str, sep: str, hint: str) -> None:
    """An Excel "CSV" saved where the decimal mark is a comma (semicolons), or a tab-separated
    export, was read with commas: one column 'entity;split', and "a pinned table needs the columns
    entity,split" above a header that has both. Excel's 'sep=;' line names the delimiter and is no
    header; rows keep an editor's line numbers."""
    pins = tmp_path / name
    pins.write_text(f"{hint}entity{sep}split\nP0{sep}test\n\nP1{sep}valid\n")
    from packer.pipeline.split import read_pinned_rows

    above = 1 if hint else 0
    assert read_pinned_rows(pins) == {"P0": ("test", 2 + above), "P1": ("valid", 4 + above)}


def test_a_split_far_from_its_ratios_names_the_chained_group_that_caused_it() -> None:
    from packer.pipeline.split import Assignment, SplitGroup, balance_warning

    keys = [f"k{i}" for i in range(100)]
    giant = SplitGroup(members=tuple(range(90)), entities=tuple(f"E{i}" for i in range(30)))
    rest = tuple(SplitGroup(members=(i,), entities=(f"F{i}",)) for i in range(90, 100))
    skewed = Assignment(split={k: "train" if i < 95 else "test" for i, k in enumerate(keys)}, fold={},
                        groups=(giant, *rest), dropped=(), pinned={})
    message = balance_warning(skewed, BY_ENTITY)
    assert message is not None
    assert "train 95%" in message and "train 80%" in message
    assert "90 samples (90%) of 30 entities" in message
    # a warning means split_balance passed, and its findings are empty: the links that joined the
    # group are the ones duplicates_span_entities lists (the warning pointed at split_balance)
    assert "under duplicates_span_entities in leakage.json" in message and "split_balance" not in message
    singles = tuple(SplitGroup(members=(i,), entities=(f"E{i}",)) for i in range(100))
    balanced = Assignment(split={k: "train" if i < 80 else "valid" if i < 90 else "test" for i, k in enumerate(keys)},
                          fold={}, groups=singles, dropped=(), pinned={})
    assert balance_warning(balanced, BY_ENTITY) is None
    unlucky = Assignment(split={k: "train" if i < 95 else "test" for i, k in enumerate(keys)}, fold={},
                         groups=singles, dropped=(), pinned={})
    assert balance_warning(unlucky, BY_ENTITY) is None  # no group explains it: chance, not a cause
    # eight entities of three samples each, all drawn to train: each holds 12%, over the size test
    # alone, yet none stands out; the first of them was named as the cause
    few = [f"k{i}" for i in range(24)]
    eight = tuple(SplitGroup(members=tuple(range(3 * e, 3 * e + 3)), entities=(f"E{e:03d}",)) for e in range(8))
    drawn = Assignment(split=dict.fromkeys(few, "train"), fold={}, groups=eight, dropped=(), pinned={})
    message = balance_warning(drawn, replace(BY_ENTITY, ratios=(("train", 0.8), ("valid", 0.2))))
    assert message is not None and "E00" not in message
    assert "its 8 split groups are each 3 samples, whole in one split: too few and too coarse" in message
    # one of two entities holding nine tenths stands out (the median of the others, not of all)
    two = (SplitGroup(members=tuple(range(18)), entities=("BIG",)), SplitGroup(members=(18, 19), entities=("S",)))
    keys20 = [f"k{i}" for i in range(20)]
    skew = Assignment(split={k: "train" if i < 18 else "valid" for i, k in enumerate(keys20)}, fold={}, groups=two,
                      dropped=(), pinned={})
    message = balance_warning(skew, replace(BY_ENTITY, ratios=(("train", 0.8), ("valid", 0.2))))
    assert message is not None and "one entity (BIG) holds 18 samples (90%)" in message


def test_one_requested_split_cannot_collapse_however_large_a_group_is() -> None:
    """ratios {train: 1.0}: every group lands in train, so a giant group (a family of look-alike
    phantoms, say) fails no balance rule; with two splits the same group does."""
    from packer.pipeline.split import Assignment, SplitGroup, measure_balance

    keys = [f"k{i}" for i in range(100)]
    giant = SplitGroup(members=tuple(range(60)), entities=tuple(f"E{i}" for i in range(20)))
    rest = tuple(SplitGroup(members=(i,), entities=(f"F{i}",)) for i in range(60, 100))
    everything_train = Assignment(split={k: "train" for k in keys}, fold={}, groups=(giant, *rest), dropped=(),
                                  pinned={})
    only_train = replace(BY_ENTITY, ratios=(("train", 1.0),))
    assert measure_balance(everything_train, only_train).collapsed is None
    assert measure_balance(everything_train, replace(BY_ENTITY, ratios=(("train", 1.0), ("valid", 0.0),
                                                                        ("test", 0.0)))).collapsed is None
    assert measure_balance(everything_train, BY_ENTITY).collapsed == "group"


def test_shares_off_the_ratios_beyond_tolerance_and_chance_collapse_by_ratios() -> None:
    """No group is large, yet the shares miss the request by more than the tolerance and more than
    4 sigma of what the group sizes explain: a split that collapsed for another reason still fails."""
    from packer.pipeline.split import Assignment, SplitGroup, measure_balance

    keys = [f"k{i}" for i in range(1000)]
    singles = tuple(SplitGroup(members=(i,), entities=(f"E{i}",)) for i in range(1000))
    lopsided = Assignment(split={k: "train" if i < 950 else "test" for i, k in enumerate(keys)}, fold={},
                          groups=singles, dropped=(), pinned={})
    balance = measure_balance(lopsided, BY_ENTITY)
    assert balance.collapsed == "ratios" and balance.worst == "train" and balance.miss == pytest.approx(0.15)
    assert balance.allowed == pytest.approx(4 * (0.8 * 0.2 * 1000) ** 0.5 / 1000)  # 4 sigma of chance: 5.06 points
    near = Assignment(split={k: "train" if i < 830 else ("valid" if i < 900 else "test") for i, k in enumerate(keys)},
                      fold={}, groups=singles, dropped=(), pinned={})
    assert measure_balance(near, BY_ENTITY).collapsed is None              # 3 points off: within tolerance
    accepting = replace(BY_ENTITY, balance_tolerance=0.2)
    assert measure_balance(lopsided, accepting).collapsed is None


def test_an_assignment_holds_row_codes_and_writes_the_splits_table_a_dict_would(tmp_path: Path) -> None:
    """An assignment keeps each sample's split and fold as one small code per row of the sample
    table (a dict of every key cost ~120 bytes a sample: 1.2 GB at 10M). Read by key it is the
    same mapping; ``_splits.parquet`` written from it, for every row or for a subset of rows (the
    samples a build packs), is byte for byte the one the same assignment as dicts writes."""
    from packer.config import PhiConfig
    from packer.phi import pseudonymizer_for
    from packer.pipeline.publish import write_splits_table
    from packer.pipeline.sampletable import SampleTable
    from packer.pipeline.split import RowCodes

    rng = random.Random(3)
    records = [sample(i, f"P{rng.randrange(40)}", time=f"2024-0{1 + i % 9}-1{i % 10}") for i in range(400)]
    table = SampleTable.of(sorted(records, key=lambda s: s.key))
    made = assign_splits(table, replace(BY_ENTITY, folds=4))
    assert isinstance(made.split, RowCodes) and isinstance(made.fold, RowCodes)
    as_dicts = replace(made, split=dict(made.split.items()), fold=dict(made.fold.items()))
    assert made.split == as_dicts.split and made.fold == as_dicts.fold
    assert len(made.split) == 400 and len(made.fold) == sum(1 for s in made.split.values() if s != "test")
    assert made.split_counts() == dict(Counter(made.split.values()))
    phi = pseudonymizer_for(PhiConfig(mode="keep", dates="keep"))
    rows = np.flatnonzero(np.arange(len(table)) % 3 != 1)
    part = table.take(rows)
    for name, samples, codes in (("all", table, made), ("part", part, made.placed_in(part, rows))):
        (tmp_path / name / "codes").mkdir(parents=True)
        (tmp_path / name / "dicts").mkdir(parents=True)
        write_splits_table(tmp_path / name / "codes", samples, codes, phi)
        write_splits_table(tmp_path / name / "dicts", samples, as_dicts, phi)
        written = [(tmp_path / name / way / "_splits.parquet").read_bytes() for way in ("codes", "dicts")]
        assert written[0] == written[1]
        assert dict(codes.split.items()) == {k: as_dicts.split[k] for k in samples.column("key")}


def test_a_groups_members_are_one_array_that_reads_as_the_tuple_of_its_rows() -> None:
    # at 10M samples a tuple of Python ints per group held ~0.4 GB from the split to the manifest
    from packer.pipeline.split import Members

    group = SplitGroup(members=(3, 5, 1000), entities=("E",))
    assert isinstance(group.members, Members) and group.members.rows.dtype == np.int64
    assert group.members == (3, 5, 1000) == tuple(group.members) and group.members == [3, 5, 1000]
    assert group.members != (3, 5) and group.members != "x"
    assert [type(m) for m in group.members] == [int, int, int] and type(group.members[0]) is int
    assert group.members[1:] == (5, 1000) and len(group.members) == 3 and 5 in group.members
    assert sorted([Members([2]), Members([1, 9]), Members([1])]) == [(1,), (1, 9), (2,)]
    assert group == SplitGroup(members=Members(np.array([3, 5, 1000])), entities=("E",))
    assert hash(group) == hash(SplitGroup(members=[3, 5, 1000], entities=("E",)))
    assert pickle.loads(pickle.dumps(group)) == group
    with pytest.raises(ValueError):
        group.members.rows[0] = 7   # read-only: a group's rows cannot change under it


def test_three_one_sample_entities_all_in_train_are_luck_and_name_no_entity() -> None:
    """Three entities of one sample each, all in train: no entity stands out, so none is named as
    the cause (the warning said "one entity (E0) holds 1 sample (33%)", E0 being merely first);
    the groups' coarseness is."""
    from packer.pipeline.split import Assignment, SplitGroup, balance_warning

    keys = ["k0", "k1", "k2"]
    groups = tuple(SplitGroup(members=(i,), entities=(f"E{i}",)) for i in range(3))
    alone = Assignment(split=dict.fromkeys(keys, "train"), fold={}, groups=groups, dropped=(), pinned={})
    message = balance_warning(alone, BY_ENTITY)
    assert message is not None and "E0" not in message and "its 3 split groups are each 1 sample," in message


def test_an_entity_that_stands_out_is_named_with_its_samples_in_the_balance_warning() -> None:
    from packer.pipeline.split import Assignment, SplitGroup, balance_warning

    keys = [f"k{i}" for i in range(10)]
    groups = (SplitGroup(members=tuple(range(6)), entities=("BIG",)),
              *(SplitGroup(members=(i,), entities=(f"E{i}",)) for i in range(6, 10)))
    drawn = Assignment(split={k: "train" if i < 9 else "test" for i, k in enumerate(keys)}, fold={}, groups=groups,
                       dropped=(), pinned={})
    message = balance_warning(drawn, BY_ENTITY)
    assert message is not None and "one entity (BIG) holds 6 samples (60%)" in message


def test_a_missed_share_that_no_link_formed_is_not_told_to_tune_near_copy_settings() -> None:
    """split_balance's error said "raise split.near_duplicates.min_score (or lower max_ratio),
    review the links" for a split whose largest group is one entity joined by 0 links: no
    near-copy setting can move that share; the seed's draw can."""
    from packer.errors import LeakageError
    from packer.pipeline.audit import LeakageAudit, RuleResult, raise_on_leakage

    finding = {"reason": "share", "summary": "split test holds 35.9% of the samples against 10% asked; the largest "
               "split group holds 6 samples (5%) of 1 entities (e1)", "links": 0, "formed_by": []}
    audit = LeakageAudit(rules=(RuleResult("split_balance", "fail", 1, (finding,)),), entities_per_split={},
                         time_ranges={})
    with pytest.raises(LeakageError) as raised:
        raise_on_leakage(audit)
    said = str(raised.value)
    assert "near_duplicates" not in said and "another split.seed" in said and "balance.accept: true" in said


def test_a_collapsed_split_is_told_the_fix_for_every_kind_of_link_that_formed_it_not_only_the_listed_ones() -> None:
    """A group joined by 66 near links and 11 exact copies lists the weakest near links first; the
    advice was chosen from the listed links alone, so the exact copies, which no near-copy setting
    parts, went unmentioned. The count of each kind decides it, and the message says both."""
    from packer.errors import LeakageError
    from packer.pipeline.audit import LeakageAudit, RuleResult, raise_on_leakage

    def where(path: str) -> dict[str, str]:
        return {"path": path, "source": "raw", "key": path}

    near = {"kind": "near", "score": 0.93, "detail": 0.9, "intensity": 0.95, "zoom": 1.0, "shift": [0, 0]}
    listed = [{"a": where(f"n{i}.png"), "b": where(f"m{i}.png"), **near} for i in range(20)]
    finding = {"reason": "group", "summary": "one split group holds 24 samples (46%) of 12 entities (P00, ...)",
               "links": 77, "near_links": 66, "exact_links": 11, "formed_by": listed}
    audit = LeakageAudit(rules=(RuleResult("split_balance", "fail", 1, (finding,)),), entities_per_split={},
                         time_ranges={})
    with pytest.raises(LeakageError) as raised:
        raise_on_leakage(audit)
    said = str(raised.value)
    assert "joined by 77 duplicate link(s) (11 exact copies, 66 near links)" in said, said
    assert "raise split.near_duplicates.min_score" in said and "remove the exact copies" in said, said
