"""Stratified splits (``stratify: label``): every promised label in every split, shares near the
ratios, and a warning that names only what explains a miss."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from packer.config import SplitConfig
from packer.pipeline.audit import audit_assignment
from packer.pipeline.split import assign_splits
from packer.records import SampleRef, SpilledSample
from packer.targets import MultiLabelTarget

RATIOS = (("train", 0.8), ("valid", 0.1), ("test", 0.1))
STRATIFIED = SplitConfig(by="entity", ratios=RATIOS, seed=17, stratify="label")


def sample(i: int, entity: str, label: str) -> SpilledSample:
    ref = SampleRef(sample_id=f"s-{i:06d}", source="s", kind="image", path=f"/raw/{i}.png", relpath=f"{i}.png",
                    label=label, entity=entity)
    return SpilledSample(key=ref.sample_id, ref=ref, spill="x", offset=0, pixel_bytes=1, meta_bytes=1, shape=(1, 1, 1),
                         dtype="uint8", sha256=f"{i:064x}")


def samples_of(rows: list[tuple[str, str]]) -> list[SpilledSample]:
    return [sample(i, entity, label) for i, (entity, label) in enumerate(rows)]


def splits_holding(samples: list[SpilledSample], split: dict[str, str], label: str) -> set[str]:
    return {split[s.key] for s in samples if label in (s.ref.label or "").split("|")}


def test_a_rare_label_whose_carriers_each_hold_a_label_of_their_own_still_reaches_every_split() -> None:
    """`rare` on 4 entities, each also carrying a label no other entity holds (x, y, z, w). The
    repair pass refused to move a group that was its split's last carrier of *any* label, so it
    protected x, y, z and w (one carrier each: nothing was promised them) and left all four
    carriers of `rare` in train. A label on fewer groups than splits protects nothing."""
    rows = [(f"E{i}", "common") for i in range(40)] + [(f"N{i}", "") for i in range(10)]
    rows += [("R0", "rare|x"), ("R1", "rare|y"), ("R2", "rare|z"), ("R3", "rare|w")]
    samples = samples_of(rows)
    for seed in (0, 17, 123):
        cfg = replace(STRATIFIED, seed=seed)
        assignment = assign_splits(samples, cfg, strata=MultiLabelTarget.held_names)
        split = dict(assignment.split.items())
        assert splits_holding(samples, split, "rare") == {"train", "valid", "test"}, seed
        assert splits_holding(samples, split, "common") == {"train", "valid", "test"}, seed
        assert audit_assignment(samples, assignment, cfg).rule("entity_overlap").count == 0
        again = assign_splits(list(reversed(samples)), cfg, strata=MultiLabelTarget.held_names)
        assert dict(again.split.items()) == split


def test_the_repair_never_takes_a_promised_labels_last_carrier_from_a_split() -> None:
    """`rare` (3 carriers) and `b` (3 carriers) share their carriers so that moving one for
    `rare` could leave a split without `b`: every label carried by 3 or more groups ends in
    every split, whatever the seed."""
    rows = [(f"E{i}", "common") for i in range(40)]
    rows += [("R0", "rare|b"), ("R1", "rare|b"), ("R2", "rare"), ("B0", "b")]
    rows += [("Q0", "q|rare"), ("Q1", "q"), ("Q2", "q")]
    samples = samples_of(rows)
    for seed in range(12):
        cfg = replace(STRATIFIED, seed=seed)
        split = dict(assign_splits(samples, cfg, strata=MultiLabelTarget.held_names).split.items())
        for label in ("common", "rare", "b", "q"):
            assert splits_holding(samples, split, label) == {"train", "valid", "test"}, (seed, label)


def test_the_repair_leaves_a_label_missing_rather_than_take_a_promised_labels_last_carrier(tmp_path: Path) -> None:
    """`rare` sits on three groups in train, two of them pinned there: the only one that could
    move is train's one carrier of `b` (whose other carriers are pinned to valid and test). Moving
    it would trade `rare` reaching valid for `b` leaving train; the repair does not."""
    rows = [(f"E{i}", "common") for i in range(40)]
    rows += [("R0", "rare|b"), *[("R1", "rare")] * 3, *[("R2", "rare")] * 3, ("BV", "b"), ("BT", "b")]
    pins = tmp_path / "pins.csv"
    pins.write_text("entity,split\nR1,train\nR2,train\nBV,valid\nBT,test\n")
    samples = samples_of(rows)
    split = dict(assign_splits(samples, replace(STRATIFIED, pinned=pins),
                               strata=MultiLabelTarget.held_names).split.items())
    assert splits_holding(samples, split, "b") == {"train", "valid", "test"}
    assert splits_holding(samples, split, "rare") == {"train"}
