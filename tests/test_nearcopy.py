"""Near copies: planted copies of every kind are linked to their source, look-alike patients are not,
and a split that collapses anyway fails loudly with the links that made it."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.cli import main
from packer.config import load_job
from packer.demo import COPY_KINDS, CopiesTree, write_copies_tree
from packer.errors import ConfigError
from packer.pipeline import nearcopy
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.cluster import open_executor
from packer.pipeline.stages import run_stages


def photo(seed: int, size: int = 256) -> np.ndarray:
    """A seeded photo-like H×W×3 uint8 image: smooth colour field, filled ellipses, blur, grain."""
    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.uniform(0, 255, (6, 6, 3)).astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC)
    for _ in range(25):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        center = tuple(int(v) for v in rng.integers(0, size, 2))
        axes = tuple(int(v) for v in rng.integers(4, size // 4, 2))
        cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
    img = np.asarray(cv2.GaussianBlur(img, (0, 0), 1.5)) + np.asarray(rng.normal(0, 4, img.shape), dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(image: np.ndarray, quality: int = 75) -> np.ndarray:
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(data, cv2.IMREAD_COLOR)


def packed(image: np.ndarray, size: int = 64) -> np.ndarray:
    """What packer's image transform makes of it: resized (area), C×H×W."""
    return np.ascontiguousarray(cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA).transpose(2, 0, 1))


def signature_of(image: np.ndarray) -> Any:
    return nearcopy.signature(packed(image))


# ---------------------------------------------------------------- signatures and verification


def test_a_thumbnail_is_the_grey_image_scaled_to_its_full_range() -> None:
    thumb = nearcopy.thumbnail(packed(photo(1)))
    assert thumb.shape == (64, 64) and thumb.dtype == np.uint8 and (thumb.min(), thumb.max()) == (0, 255)
    assert not nearcopy.thumbnail(np.full((3, 32, 32), 7, dtype=np.uint16)).any()
    assert np.array_equal(nearcopy.thumbnail(np.arange(16.0).reshape(4, 4)),
                          nearcopy.thumbnail(np.arange(16.0).reshape(1, 4, 4) * 3 + 100))  # any affine intensity
    for bad in (np.zeros((0, 4)), np.zeros(5), np.full((2, 2), np.nan)):
        with pytest.raises(ValueError):
            nearcopy.thumbnail(bad)


@pytest.mark.parametrize("kind", ["jpeg75", "resized", "shifted", "cropped", "gamma", "png"])
def test_copies_of_a_photo_verify_and_other_photos_do_not(kind: str) -> None:
    source = photo(3)
    height, width = source.shape[:2]
    copy = {"jpeg75": lambda: jpeg(source),
            "resized": lambda: cv2.resize(source, (int(width * 0.9), int(height * 0.9)), interpolation=cv2.INTER_AREA),
            "shifted": lambda: cv2.warpAffine(source, np.array([[1, 0, 3], [0, 1, 2]], dtype=np.float32),
                                              (width, height), borderMode=cv2.BORDER_REPLICATE),
            "cropped": lambda: source[5:height - 3, 5:width - 3],
            "gamma": lambda: np.clip(255 * (source / 255.0) ** 0.6, 0, 255).astype(np.uint8),  # a monotone re-mapping
            "png": lambda: source.copy()}[kind]()
    evidence = nearcopy.verify(signature_of(source)["thumb"], signature_of(copy)["thumb"])
    assert evidence.score >= nearcopy.MIN_SCORE, evidence
    assert abs(evidence.dy) <= 2 and abs(evidence.dx) <= 2 and 0.94 <= evidence.zoom <= 1.06
    for other in (4, 5, 6):
        assert nearcopy.verify(signature_of(source)["thumb"], signature_of(photo(other))["thumb"]).score \
            < nearcopy.MIN_SCORE


def _star_field(seed: int) -> np.ndarray:
    """A dark field with a few bright blobs of assorted brightness: a histogram of a wide dark
    peak and sparse bright levels (a star field, a dark CT slice with bone)."""
    rng = np.random.default_rng(seed)
    field = rng.integers(0, 6, size=(96, 96)).astype(np.float32)
    for _ in range(12):
        y, x = rng.integers(4, 92, size=2)
        cv2.circle(field, (int(x), int(y)), int(rng.integers(1, 4)), float(rng.integers(120, 256)), -1)
    return np.clip(cv2.GaussianBlur(field, (0, 0), 0.8), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("seed", range(6))
def test_a_sparse_histogram_thumbnail_scores_as_itself_and_its_brightened_copy_links(seed: int) -> None:
    """Equal-count intensity bins merged the sparse bright levels: such a thumbnail scored 0.88-0.95
    against itself, below min_score, so no copy of it (brightened, re-encoded) could ever link."""
    source = _star_field(seed)
    thumb = nearcopy.thumbnail(source)
    assert nearcopy.verify(thumb, thumb).score >= 0.999
    brighter = nearcopy.thumbnail(np.clip(source.astype(int) + 5, 0, 255).astype(np.uint8))
    assert nearcopy.verify(thumb, brighter).score >= nearcopy.MIN_SCORE
    for other in (seed + 10, seed + 20):
        assert nearcopy.verify(thumb, nearcopy.thumbnail(_star_field(other))).score < nearcopy.MIN_SCORE


def test_verification_is_deterministic_and_skipping_refinement_changes_no_decision() -> None:
    rows = [signature_of(photo(s))["thumb"] for s in range(6)] + [signature_of(jpeg(photo(0)))["thumb"]]
    for a in rows:
        for b in rows:
            full = nearcopy.verify(a, b)
            assert nearcopy.verify(a, b) == full
            floored = nearcopy.verify(a, b, floor=nearcopy.MIN_SCORE - nearcopy.REFINE_MARGIN)
            assert (floored.score >= nearcopy.MIN_SCORE) == (full.score >= nearcopy.MIN_SCORE)


def test_a_verification_task_gives_each_pair_its_own_evidence_however_few_thumbnails_it_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task's cache of prepared thumbnails is bounded (PREPARED_LIMIT); what it evicts and
    prepares again must not change any pair's evidence, nor must the shared eta-squared halves."""
    rows = [signature_of(photo(s)) for s in range(5)] + [signature_of(jpeg(photo(0))), signature_of(photo(1)[4:, 4:])]
    files = []
    for half in (rows[:4], rows[4:]):
        files.append(tmp_path / f"{len(files)}.sig.npy")
        nearcopy.write_signatures(files[-1], half)
    where = [(0, r) for r in range(4)] + [(1, r) for r in range(3)]
    pairs = [(a, b) for a in range(len(rows)) for b in range(len(rows)) if a != b]

    def task() -> nearcopy.VerifyTask:
        return nearcopy.VerifyTask(index=0, files=tuple(map(str, files)),
                                   a_file=np.array([where[a][0] for a, _ in pairs]),
                                   a_row=np.array([where[a][1] for a, _ in pairs]),
                                   b_file=np.array([where[b][0] for _, b in pairs]),
                                   b_row=np.array([where[b][1] for _, b in pairs]), floor=0.884)

    roomy = nearcopy.verify_task(task())
    monkeypatch.setattr(nearcopy, "PREPARED_LIMIT", 1)
    tight = nearcopy.verify_task(task())
    alone = [nearcopy.verify(rows[a]["thumb"], rows[b]["thumb"], floor=0.884) for a, b in pairs]
    for field in ("structure", "detail", "intensity", "zoom", "dy", "dx"):
        assert np.array_equal(getattr(roomy, field), getattr(tight, field)), field
        assert getattr(roomy, field).tolist() == pytest.approx([getattr(e, field) for e in alone]), field


@settings(max_examples=40, deadline=None)
@given(pairs=st.sampled_from([0, 1, 4095, 4096, 4097, 9000]), files=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_a_task_list_makes_each_task_when_read_naming_only_the_files_its_pairs_read(
        pairs: int, files: int, seed: int) -> None:
    """The verification's tasks are made as they are submitted (the client held every task's
    arrays at once: 32 bytes a candidate pair); each pair still reads the signature row it did."""
    rng = np.random.default_rng(seed)
    names = tuple(f"/cache/chunk-{k:03d}.sig.npy" for k in range(files))
    samples = 500
    file_of, row_of = rng.integers(0, files, samples), rng.integers(0, 128, samples)
    i, j = rng.integers(0, samples, pairs), rng.integers(0, samples, pairs)
    tasks = nearcopy.VerifyTasks(names, file_of, row_of, i, j, floor=0.5, screen=True)
    assert len(tasks) == -(-pairs // nearcopy.PAIRS_PER_TASK) and nearcopy.pairs_in(tasks) == pairs
    made = [tasks[t] for t in range(len(tasks))]
    assert [t.index for t in made] == list(range(len(tasks))) == [t.index for t in tasks[:]]
    with pytest.raises(IndexError):
        tasks[len(tasks)]
    at = 0
    for task in made:
        assert (task.floor, task.screen) == (0.5, True)
        for side, rows in (("a", i), ("b", j)):
            taken = rows[at:at + len(task.a_file)]
            assert [task.files[f] for f in getattr(task, f"{side}_file")] == [names[f] for f in file_of[taken]]
            assert getattr(task, f"{side}_row").tolist() == row_of[taken].tolist()
        read = set(task.a_file.tolist()) | set(task.b_file.tolist())
        assert read == set(range(len(task.files)))  # no file it does not read
        at += len(task.a_file)
    assert at == pairs


def test_a_flat_thumbnail_verifies_as_nothing() -> None:
    flat = np.zeros((64, 64), dtype=np.uint8)
    assert nearcopy.verify(flat, signature_of(photo(1))["thumb"]).score == 0.0


# ---------------------------------------------------------------- candidates


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), groups=st.integers(1, 20), k=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_exact_nearest_neighbours_of_other_groups_equal_brute_force(n: int, groups: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, 12)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    group = rng.integers(0, groups, n)
    index, score = nearcopy.nearest(vectors, vectors, group, group, k)
    similarity = np.round(vectors @ vectors.T, 5)
    for q in range(n):
        allowed = [b for b in range(n) if group[b] != group[q]]
        want = sorted(allowed, key=lambda b: (-similarity[q, b], b))[:k]
        got = [int(i) for i in index[q] if i >= 0]
        assert got == want
        assert np.allclose(score[q, :len(got)], similarity[q, want], atol=1e-5)


def test_the_inverted_file_finds_the_same_neighbours_on_clustered_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((40, 32)).astype(np.float32)
    vectors = centres[rng.integers(0, 40, 3000)] + 0.5 * rng.standard_normal((3000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    groups = np.arange(3000) // 3
    exact = nearcopy.nearest(vectors, vectors[:500], groups[:500], groups, 8)[0]
    monkeypatch.setattr(nearcopy, "EXACT_LIMIT", 100)
    approximate = nearcopy.nearest(vectors, vectors[:500], groups[:500], groups, 8)[0]
    recall = np.mean([len(set(a) & set(b)) / 8 for a, b in zip(approximate.tolist(), exact.tolist(), strict=True)])
    assert recall > 0.97 and np.mean(approximate[:, 0] == exact[:, 0]) > 0.97
    assert np.array_equal(approximate, nearcopy.nearest(vectors, vectors[:500], groups[:500], groups, 8)[0])


def test_candidate_pairs_are_each_pair_once_across_groups() -> None:
    rows = np.array([signature_of(photo(s % 7)) for s in range(21)], dtype=nearcopy.SIGNATURE_DTYPE)
    groups = np.arange(21)
    groups[7:14] = groups[:7]  # samples 7..13 are the same images under the same groups as 0..6
    found = nearcopy.candidate_pairs(rows["embedding"], groups, 4)
    pairs = list(zip(found.i.tolist(), found.j.tolist(), strict=True))
    assert len(pairs) == len(set(pairs)) and all(i < j and groups[i] != groups[j] for i, j in pairs)
    assert (0, 14) in pairs and (7, 14) in pairs  # the same image under another group is always a candidate


# ---------------------------------------------------------------- builds of the similar-anatomy tree


def copies_job(tree: CopiesTree, folder: Path, **split: Any) -> Path:
    doc = {"name": "copies",
           "sources": [{"kind": "dicom", "root": str(tree.root / "ct"), "labels": str(tree.root / "ct_labels.csv")},
                       {"kind": "image", "root": str(tree.root / "exports"),
                        "table": str(tree.root / "exports" / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 17, **split},
           "transform": {"dicom": {"windows": ["lung", "mediastinum"], "size": [64, 64]},
                         "image": {"size": [64, 64], "color": "gray"}},
           "pack": {"format": "webdataset"}, "output": str(folder / "out"), "phi": {"mode": "keep"}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump(doc))
    return folder / "job.yaml"


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> CopiesTree:
    return write_copies_tree(tmp_path_factory.mktemp("copies") / "raw", patients=60, copies=18, seed=3)


def test_every_planted_copy_is_grouped_with_its_source_and_no_patients_are_joined(small_tree: CopiesTree,
                                                                                  tmp_path: Path) -> None:
    job = load_job(copies_job(small_tree, tmp_path))
    with open_executor("sync") as executor:
        prepared = run_stages(job, executor, through="audit", cache_dir=tmp_path / "cache", quiet=True).prepared
    table = prepared.samples
    outcome = small_tree.evaluate(table.column("source"), table.column("relpath"),
                                  [g.members for g in prepared.assignment.groups], prepared.links.i.tolist(),
                                  prepared.links.j.tolist(), prepared.links.candidates)
    assert outcome.grouped == {kind: (2, 2) for kind in COPY_KINDS}
    assert outcome.linked == {kind: (2, 2) for kind in COPY_KINDS}  # each copy to its very source slice
    assert outcome.false_links == 0 and outcome.mixed_groups == 0
    assert all(hit == total for hit, total in outcome.precision.values()), outcome.precision  # precision 1
    assert sum(total for _, total in outcome.precision.values()) == outcome.near_links
    assert outcome.candidates > 10 * 60  # look-alikes of other patients were verified, and refused
    assert not prepared.audit.failed
    spans = prepared.audit.rule("duplicates_span_entities")
    assert spans.count == 18  # each copy's entity with its source's patient, and nothing else
    # the evidence of every link that joined two entities is in the audit (leakage.json), also when all is well
    near = [f for f in spans.findings if f["near_links"]]
    assert sum(f["near_links"] for f in near) == sum(len(f["evidence"]) for f in near) >= 14  # DICOM copies: exact
    for finding in near:
        for link in finding["evidence"]:
            assert {"a", "b", "score", "structure", "intensity", "zoom", "shift"} <= set(link)
            assert link["intensity"] >= job.split.near_min_score and link["a"]["entity_id"] in finding["entities"]


@pytest.mark.slow   # 300 patients × 4 slices through a local dask cluster
def test_three_hundred_similar_patients_split_within_five_points_with_every_copy_grouped(tmp_path: Path) -> None:
    tree = write_copies_tree(tmp_path / "raw", patients=300, copies=90)
    with open_executor(None, 2) as executor:
        prepared = run_stages(load_job(copies_job(tree, tmp_path)), executor, through="audit",
                              cache_dir=tmp_path / "cache", quiet=True).prepared
    table = prepared.samples
    outcome = tree.evaluate(table.column("source"), table.column("relpath"),
                            [g.members for g in prepared.assignment.groups], prepared.links.i.tolist(),
                            prepared.links.j.tolist())
    assert all(hit == total for hit, total in outcome.grouped.values()), outcome.grouped
    assert outcome.false_links == 0 and outcome.mixed_groups == 0
    shares = prepared.audit.rule("split_balance").detail["shares"]
    assert all(abs(shares[name] - ratio) <= 0.05 for name, ratio in (("train", .8), ("valid", .1), ("test", .1)))


@pytest.mark.slow   # 8 s: two builds of the copies tree; make test-fast stays under two minutes
def test_a_split_that_collapses_fails_the_build_naming_the_group_and_its_links(small_tree: CopiesTree,
                                                                             tmp_path: Path) -> None:
    job = copies_job(small_tree, tmp_path / "collapse", near_duplicates={"min_score": 0.5, "max_ratio": None})
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert result.exit_code == 4, result.output
    message = result.output
    assert "split_balance" in message and "one split group holds" in message
    assert re.search(r"of \d+ entities \((PAT|CPY|X)\d+, (PAT|CPY|X)\d+, (PAT|CPY|X)\d+, \.\.\.\)", message), message
    assert "joined by" in message and "score" in message and "split.balance.accept: true" in message
    assert not list((tmp_path / "collapse" / "out" / "copies").glob("*/manifest.json"))  # no dataset written
    leakage = json.loads((tmp_path / "collapse" / "out" / "copies" / "leakage.json").read_text())
    finding = leakage["rules"]["split_balance"]["findings"][0]
    assert finding["reason"] == "group" and finding["entities"] > 10 and finding["formed_by"]
    assert {"a", "b", "kind", "score", "intensity", "zoom", "shift"} <= set(finding["formed_by"][0])
    # packer validate fails the same way
    checked = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q"])
    assert checked.exit_code == 4 and "split_balance" in checked.output
    # and a job can accept it explicitly: built, with the rule reported and a warning
    accepted = copies_job(small_tree, tmp_path / "accepted", near_duplicates={"min_score": 0.5, "max_ratio": None},
                          balance={"accept": True})
    built = build(load_job(accepted), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    rule = built.manifest["audit"]["rules"]["split_balance"]
    assert rule["severity"] == "report" and rule["count"] == 1


def test_validate_keeps_its_signatures_only_for_the_run(small_tree: CopiesTree, tmp_path: Path) -> None:
    job = copies_job(small_tree, tmp_path)
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json",
                                       str(tmp_path / "report.json")])
    assert result.exit_code == 0, result.output
    near = json.loads((tmp_path / "report.json").read_text())["audit"]["rules"]["near_duplicates_across_splits"]
    assert near["links"] >= 14 and near["candidates_verified"] > 0
    work = Path(os.environ["PACKER_WORK_DIR"])
    assert not list(work.glob("packer-signatures-*"))


def test_a_job_that_still_sets_a_dhash_threshold_is_told_what_replaced_it(tmp_path: Path) -> None:
    tree = CopiesTree(root=tmp_path, patients=0, slices=0, copies=())
    (tmp_path / "ct").mkdir()
    (tmp_path / "exports").mkdir()
    job = copies_job(tree, tmp_path / "job", near_duplicates={"threshold": 4})
    with pytest.raises(ConfigError, match=r"near_duplicates.threshold: .*min_score.*neighbors"):
        load_job(job)


def test_the_rival_test_keeps_copies_that_stand_out_and_drops_a_look_alike_among_look_alikes() -> None:
    """S has two copies, C1 and C2, under two more entities (never paired by the candidate search,
    so their pair is verified on demand); L1, L2, L3 are look-alikes of one another, L1 and L2
    just above min_score. Copies keep a small share of their rivals' disagreement, L1~L2 most of it."""
    S, C1, C2, L1, L2, L3 = range(6)
    scores = {(S, C1): 0.995, (S, C2): 0.994, (S, L1): 0.975, (C1, L1): 0.970, (C2, L2): 0.970,
              (L1, L2): 0.985, (L1, L3): 0.982, (L2, L3): 0.983}
    pairs = sorted(scores)
    candidates = nearcopy.Candidates(np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]),
                                     np.zeros(len(pairs), dtype=np.float32))
    score = np.array([scores[p] for p in pairs])
    groups = np.arange(6)
    passed = np.flatnonzero(score >= 0.984)
    asked: list[tuple[int, int]] = []

    def verify_more(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        asked.extend(zip(i.tolist(), j.tolist(), strict=True))
        return np.array([0.996 if {a, b} == {C1, C2} else 0.9 for a, b in zip(i.tolist(), j.tolist(), strict=True)])

    rival = nearcopy.rival_test(candidates, score, groups, passed, min_score=0.984, max_ratio=0.5,
                                verify_more=verify_more)
    by_pair = {pairs[k]: (float(r), float(nearcopy.residual_ratio(score[k], r)))
               for k, r in zip(passed, rival, strict=True)}
    # the copies' own pair (a copy is no rival), then the look-alikes' deciding copy checks the
    # other way round (larger index first): a score is not symmetric, and one order must not decide
    assert asked == [(C1, C2), (L3, L1), (L3, L2)]
    assert by_pair[(S, C1)][0] == pytest.approx(0.975) and by_pair[(S, C1)][1] == pytest.approx(0.2)
    assert by_pair[(S, C2)][0] == pytest.approx(0.975) and by_pair[(S, C2)][1] <= 0.5
    assert by_pair[(L1, L2)][0] == pytest.approx(0.983) and by_pair[(L1, L2)][1] > 0.5   # 0.015 of 0.017
    off = nearcopy.rival_test(candidates, score, groups, passed, min_score=0.984, max_ratio=None,
                              verify_more=verify_more)
    assert not off.any()


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 2, 0), (2, 0, 1), (0, 2, 1), (2, 1, 0), (1, 0, 2)])
def test_the_rival_test_does_not_depend_on_which_copy_comes_first(order: tuple[int, int, int]) -> None:
    """One image S exported twice (A and B) under two more entities. A~B scores 0.982 one way
    round and 0.995 the other (the score is not symmetric): where A~B was verified the unlucky
    way, each copy was the other's rival and both links to S fell, and which way round it was
    verified followed the sample keys, i.e. the source's name (a walkthrough's planted leak).
    Whatever the samples' order, both links now stand."""
    S, A, B = order
    forward = {(S, A): 0.996, (A, S): 0.995, (S, B): 0.993, (B, S): 0.994, (A, B): 0.982, (B, A): 0.995}

    def verified(i: int, j: int) -> float:
        return forward[(i, j)]

    pairs = sorted({(min(S, A), max(S, A)), (min(S, B), max(S, B)), (min(A, B), max(A, B))})
    candidates = nearcopy.Candidates(np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]),
                                     np.zeros(len(pairs), dtype=np.float32))
    score = np.array([verified(a, b) for a, b in pairs])
    groups = np.arange(3)
    passed = np.flatnonzero(score >= 0.984)

    def verify_more(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.array([verified(a, b) for a, b in zip(i.tolist(), j.tolist(), strict=True)])

    rival = nearcopy.rival_test(candidates, score, groups, passed, min_score=0.984, max_ratio=0.5,
                                verify_more=verify_more)
    kept = {frozenset(pairs[k]) for k, r in zip(passed, rival, strict=True)
            if nearcopy.residual_ratio(score[k], r) <= 0.5}
    assert {frozenset((S, A)), frozenset((S, B))} <= kept


def _rival_links(forward: dict[tuple[int, int], float], groups: np.ndarray) -> set[frozenset[int]]:
    """The links the rival test keeps among the pairs of ``forward`` (its verified scores, one
    entry per order where they differ; the smaller index's order stands for both otherwise)."""
    def verified(i: int, j: int) -> float:
        return forward.get((i, j), forward.get((j, i), 0.9))

    pairs = sorted({(min(i, j), max(i, j)) for i, j in forward})
    candidates = nearcopy.Candidates(np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]),
                                     np.zeros(len(pairs), dtype=np.float32))
    score = np.array([verified(a, b) for a, b in pairs])
    passed = np.flatnonzero((score >= 0.984) & (groups[[a for a, _ in pairs]] != groups[[b for _, b in pairs]]))

    def verify_more(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.array([verified(a, b) for a, b in zip(i.tolist(), j.tolist(), strict=True)])

    rival = nearcopy.rival_test(candidates, score, groups, passed, min_score=0.984, max_ratio=0.5,
                                verify_more=verify_more)
    return {frozenset(pairs[k]) for k, r in zip(passed, rival, strict=True)
            if nearcopy.residual_ratio(score[k], r) <= 0.5}


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_a_copy_of_the_patients_other_slice_is_no_rival_of_a_copy(order: tuple[int, ...]) -> None:
    """Patient A's two neighbouring slices a1 and a2 were each exported again, under entities B
    (b1, resized) and C (c2). c2 resembles a1 as a2 does, and the two copies were verified below
    min_score against each other, so c2 was the rival that rejected a1~b1, and b1 the one that
    rejected a2~c2: both leaks were missed (a walkthrough's planted copies, 4 of 12). c2 is a copy
    of a1's mate a2 and stands out from every other entity (d and e, unrelated patients), so it
    is no independent look-alike. Whatever the samples' order, both links stand."""
    a1, a2, b1, c2 = order
    d, e = 4, 5
    groups = np.zeros(6, dtype=np.int64)
    groups[[a1, a2, b1, c2, d, e]] = [0, 0, 1, 2, 3, 4]
    forward = {(a1, b1): 0.992, (a2, c2): 0.992, (a1, a2): 0.995, (a1, c2): 0.989, (a2, b1): 0.989,
               (b1, c2): 0.975, (c2, d): 0.95, (b1, e): 0.95, (a1, d): 0.94, (a2, e): 0.94}
    assert _rival_links(forward, groups) == {frozenset((a1, b1)), frozenset((a2, c2))}


def test_among_three_look_alike_patients_a_mate_copy_needs_other_entities_to_stand_out_from() -> None:
    """Three phantoms of one design (the demo's annotated CT patients): every slice of C resembles
    A's slices more than A's and B's resemble each other, and no fourth entity exists to show that
    C's slice stands out as a copy would. It stays a rival, and A~B, a look-alike pair, is not
    linked (a first version passed it over and joined two of the phantoms: annotated-stacks.yaml
    failed its audit)."""
    a1, a2, b1, c2 = range(4)
    groups = np.array([0, 0, 1, 2])
    forward = {(a1, b1): 0.986, (a2, c2): 0.990, (a1, a2): 0.995, (a1, c2): 0.985, (a2, b1): 0.97,
               (b1, c2): 0.97}
    assert frozenset((a1, b1)) not in _rival_links(forward, groups)


def test_a_copy_of_a_mate_among_look_alikes_stays_a_rival() -> None:
    """The same copies among look-alike patients D and E: c2 resembles d as much as a2 (it does
    not stand out from every other entity), so it stays the rival it is, and a1~b1, which does not
    stand out from it, is not linked, as before."""
    a1, a2, b1, c2, d, e = range(6)
    groups = np.array([0, 0, 1, 2, 3, 4])
    forward = {(a1, b1): 0.992, (a2, c2): 0.992, (a1, a2): 0.995, (a1, c2): 0.989, (a2, b1): 0.989,
               (b1, c2): 0.975, (c2, d): 0.990, (b1, e): 0.990, (d, e): 0.991}
    links = _rival_links(forward, groups)
    assert frozenset((a1, b1)) not in links and frozenset((a2, c2)) not in links


def test_max_ratio_enters_the_config_identity_only_when_a_job_sets_it(small_tree: CopiesTree, tmp_path: Path) -> None:
    plain = load_job(copies_job(small_tree, tmp_path / "plain"))
    stricter = load_job(copies_job(small_tree, tmp_path / "strict", near_duplicates={"max_ratio": 0.3}))
    off = load_job(copies_job(small_tree, tmp_path / "off", near_duplicates={"max_ratio": None}))
    assert "max_ratio" not in plain.identity()["split"]["near_duplicates"] and plain.split.near_max_ratio == 0.5
    assert stricter.identity()["split"]["near_duplicates"]["max_ratio"] == 0.3
    assert off.identity()["split"]["near_duplicates"]["max_ratio"] is None and off.split.near_max_ratio is None


def test_the_exact_candidate_search_holds_a_bounded_block_of_scores_whatever_the_sample_count() -> None:
    """The exact search (up to ``EXACT_LIMIT`` samples) scores the queries block by block: its
    memory is a block's, not the n × n matrix's. At 12,000 samples the selection's temporaries
    once traced 324 MiB (the client's peak at 10,000 bench files was 490 MB); the block is
    now about 50 MiB, and the pairs are the ones a direct all-pairs search finds."""
    import tracemalloc

    rng = np.random.default_rng(1)
    n, d = 12_000, 48
    embeddings = rng.normal(size=(n, len(nearcopy.QUERY_ZOOMS), d)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=2, keepdims=True)
    embeddings = embeddings.astype(np.float16)
    groups = rng.integers(0, n // 4, n)
    tracemalloc.start()
    try:
        found = nearcopy.candidate_pairs(embeddings, groups, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MiB traced"
    # the same neighbours as the whole similarity matrix gives, for a few queries
    base = embeddings[:, 0].astype(np.float32)
    pairs = set(zip(found.i.tolist(), found.j.tolist(), strict=True))
    for query in (0, 17, 5_000, n - 1):
        scores = np.round(base @ base[query], 5)
        scores[groups == groups[query]] = -np.inf
        best = np.lexsort((np.arange(n), -scores))[:4]
        assert all((min(query, int(b)), max(query, int(b))) in pairs for b in best)


def test_verification_reads_each_thumbnail_it_needs_and_refuses_what_is_not_a_signature(tmp_path: Path) -> None:
    """Tasks read thumbnails with positional reads (not maps whose touched rows stay resident):
    the same bytes as ``read_signatures`` gives, from more files than it keeps open, and a file
    that is not a signature array or lacks the row is a ValueError naming the file."""
    rng = np.random.default_rng(3)
    files = []
    for f in range(5):
        rows = [np.zeros((), dtype=nearcopy.SIGNATURE_DTYPE) for _ in range(3 + f)]
        for row in rows:
            row["thumb"] = rng.integers(0, 256, (nearcopy.THUMB, nearcopy.THUMB), dtype=np.uint8)
        path = tmp_path / f"c{f}.sig.npy"
        nearcopy.write_signatures(path, rows)
        files.append(str(path))
    reader = nearcopy._ThumbReader(files)
    reader.OPEN_FILES = 2  # fewer than the files: older ones are closed and opened again
    try:
        for _ in range(2):
            for f, path in enumerate(files):
                stored = nearcopy.read_signatures(Path(path))
                for r in range(len(stored)):
                    assert np.array_equal(reader.thumb(f, r), stored[r]["thumb"])
        assert len(reader._open) <= 2
        with pytest.raises(ValueError, match=r"c0\.sig\.npy: no signature row 3"):
            reader.thumb(0, 3)
    finally:
        reader.close()
    other = tmp_path / "other.npy"
    np.save(other, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="not a packer signature file"):
        nearcopy._ThumbReader([str(other)]).thumb(0, 0)
