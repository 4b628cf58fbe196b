"""The neighbour-list cache: an incremental candidate search gives exactly the full search's pairs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_nearcopy import copies_job
from test_paircache import _grow

from packer.config import load_job
from packer.demo import write_copies_tree
from packer.pipeline import nearcopy
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.nearcopy import EMBED_DIM, QUERY_ZOOMS, candidate_pairs, nearest
from packer.pipeline.neighborcache import NEIGHBORS_FILE, NeighborCache, sample_identities, search_candidates


def _unit(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    """n × zooms × d float16 unit vectors near a few centres (look-alikes, so lists overlap), with
    some exact repeats (equal cosines: ties the order must break by index)."""
    pick = rng.integers(0, len(centres), n)
    out = centres[pick][:, None, :] + rng.normal(0, 0.35, (n, len(QUERY_ZOOMS), EMBED_DIM))
    repeat = rng.random(n) < 0.1
    if n > 1:
        out[repeat] = out[rng.integers(0, n, int(repeat.sum()))]
    out /= np.linalg.norm(out, axis=2, keepdims=True)
    return out.astype(np.float16)


def _search(tmp: Path, keys: list[str], entities: list[str | None], emb: np.ndarray, k: int):
    order = np.argsort(keys, kind="stable")  # a build's samples are sorted by key
    keys = [keys[i] for i in order]
    entities = [entities[i] for i in order]
    emb = emb[order]
    codes = {e: c for c, e in enumerate(sorted({e for e in entities if e is not None}))}
    groups = np.array([codes[e] if e is not None else -1 - s for s, e in enumerate(entities)], dtype=np.int64)
    rows_of = lambda z, rows: emb[rows, z]  # noqa: E731
    cache = NeighborCache.open(tmp, k)
    assert cache.ignored == ""
    got = search_candidates(rows_of, groups, k, sample_identities(keys, entities, rows_of), cache)
    cache.save()
    want = candidate_pairs(emb, groups, k)
    np.testing.assert_array_equal(got.i, want.i)
    np.testing.assert_array_equal(got.j, want.j)
    np.testing.assert_array_equal(got.similarity, want.similarity)
    return cache.reused


@pytest.mark.parametrize("seed", range(12))
def test_incremental_search_equals_the_full_search_after_adds_removals_changes_and_moves(tmp_path: Path,
                                                                                           seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.choice([2, 4, 8, 16]))
    n = int(rng.integers(20, 400))
    centres = rng.normal(0, 1, (int(rng.integers(1, 6)), EMBED_DIM))
    keys = [f"s{v:06d}" for v in rng.choice(10**6, n, replace=False)]
    entities: list[str | None] = [None if rng.random() < 0.05 else f"e{rng.integers(0, max(2, n // 5))}"
                                  for _ in range(n)]
    emb = _unit(rng, n, centres)
    assert _search(tmp_path, keys, entities, emb, k) == 0
    for _ in range(3):  # three rebuilds, each from the last one's cache
        n = len(keys)
        keep = rng.random(n) >= rng.choice([0.0, 0.01, 0.1, 0.4])  # removed samples
        keys = [key for key, kept in zip(keys, keep, strict=True) if kept]
        entities = [e for e, kept in zip(entities, keep, strict=True) if kept]
        emb = emb[keep]
        changed = rng.random(len(keys)) < 0.03  # new pixels
        emb[changed] = _unit(rng, int(changed.sum()), centres)
        for s in np.flatnonzero(rng.random(len(keys)) < 0.03):  # moved to another (or a new) entity
            entities[s] = f"e{rng.integers(0, max(2, n // 5) + 3)}"
        added = int(rng.integers(0, max(2, n // 10)))  # new samples, keys anywhere in the order
        keys += [f"s{v:06d}x" for v in rng.choice(10**6, added, replace=False)]
        entities += [f"n{rng.integers(0, 1 + added // 3)}" for _ in range(added)]
        emb = np.concatenate([emb, _unit(rng, added, centres)])
        reused = _search(tmp_path, keys, entities, emb, k)
        assert 0 <= reused <= len(keys)


def test_an_unchanged_rebuild_reuses_every_list_and_a_damaged_file_is_ignored(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    n, k = 300, 8
    keys = [f"k{s:04d}" for s in range(n)]
    entities: list[str | None] = [f"e{s // 3}" for s in range(n)]
    emb = _unit(rng, n, rng.normal(0, 1, (3, EMBED_DIM)))
    _search(tmp_path, keys, entities, emb, k)
    assert _search(tmp_path, keys, entities, emb, k) == n
    path = tmp_path / NEIGHBORS_FILE
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert NeighborCache.open(tmp_path, k).ignored == "damaged or cut short"
    assert NeighborCache.open(tmp_path, k + 1).ignored.startswith("written for other search parameters")


# ---------------------------------------------------------------- builds: cold and incremental


def _lists_reused(job: Path, out: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, bytes, int, int]:
    """(dataset_hash, leakage.json's bytes, samples whose lists were reused, samples) of a build."""
    capsys.readouterr()
    result = build(load_job(job), BuildOptions(out=out, scheduler="sync", html_report=False, cache_dir=cache))
    said = capsys.readouterr().out
    counts = re.search(r"(\d+) of (\d+) samples' neighbour lists reused", said)
    assert counts, said
    return (result.manifest["dataset_hash"], (result.version_dir / "leakage.json").read_bytes(),
            int(counts[1]), int(counts[2]))


@pytest.mark.slow  # four builds of a 270-sample tree (about 30 s)
def test_an_incremental_search_gives_the_same_leakage_and_dataset_hash_as_a_cold_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = write_copies_tree(tmp_path / "raw", patients=60, copies=18, seed=3)
    job = copies_job(tree, tmp_path / "job")
    cache, out = tmp_path / "cache", tmp_path / "out"
    first = _lists_reused(job, out, cache, capsys)
    assert first[2] == 0

    # the next day: new patients and a new copy, one file withdrawn, one file moved to another patient
    _grow(tree.root, new=6)
    labels = tree.root / "exports" / "labels.csv"
    lines = labels.read_text(encoding="utf-8").splitlines()
    (tree.root / "exports" / lines[5].split(",")[0]).unlink()
    moved = lines[9].split(",")
    moved[2] = "Y0001"  # a patient's file re-assigned to another patient
    lines = lines[:5] + lines[6:9] + [",".join(moved)] + lines[10:]
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")

    partly = _lists_reused(job, out, cache, capsys)
    cold = _lists_reused(job, tmp_path / "elsewhere", tmp_path / "fresh-cache", capsys)
    warm = _lists_reused(job, out, cache, capsys)
    assert partly[0] == cold[0] == warm[0]  # dataset_hash
    assert partly[1] == cold[1] == warm[1]  # leakage.json, byte for byte
    assert partly[3] == cold[3] == warm[3] and cold[2] == 0
    assert partly[3] // 2 < partly[2] < partly[3]  # most old samples' lists merged, the new ones searched
    assert warm[2] == warm[3]
    near = json.loads(cold[1])["rules"]["duplicates_span_entities"]["findings"]
    assert any("Z0001" in finding["entities"] for finding in near)
    # the file holds the last build's samples only (a merged list may be shorter than a searched one)
    files = list(cache.glob(f"*/{NEIGHBORS_FILE}"))
    assert len(files) == 1 and NeighborCache.open(files[0].parent, 16).rows.shape == (warm[3],)


def test_the_exact_search_answers_the_same_in_any_block_and_ties_go_to_the_lower_index(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The incremental search merges scores of earlier builds: a pair's score may not depend on the
    block it was computed in (float32 products did, at the fifth decimal, for ~2% of the pairs)."""
    rng = np.random.default_rng(3)
    emb = _unit(rng, 600, rng.normal(0, 1, (2, EMBED_DIM)))[:, 0]
    groups = np.arange(600) // 4
    whole = nearest(emb, emb, groups, groups, 12)
    monkeypatch.setattr(nearcopy, "_BLOCK_ELEMENTS", 7 * 600)  # blocks of 7 query rows
    pieces = [nearest(emb, emb[lo:lo + 37], groups[lo:lo + 37], groups, 12) for lo in range(0, 600, 37)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in pieces]), whole[0])
    np.testing.assert_array_equal(np.concatenate([p[1] for p in pieces]), whole[1])
    columns = np.arange(100, 600)  # a part of the base: the same pairs score the same
    index, score = nearest(emb[columns], emb[:50], groups[:50], groups[columns], 12)
    for row in range(50):
        for at, found in enumerate(index[row].tolist()):
            hit = np.flatnonzero(whole[0][row] == columns[found])
            if len(hit):
                assert score[row, at] == whole[1][row, hit[0]]
    index, score = whole
    assert (score[:, :-1] >= score[:, 1:]).all()
    tied = score[:, :-1] == score[:, 1:]
    assert tied.any() and (index[:, :-1][tied] < index[:, 1:][tied]).all()  # repeats: equal scores


def test_a_new_sample_that_ranks_in_no_old_list_leaves_those_lists_as_they_were_without_ranking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An old list that no new sample can enter (every new cosine surely below its last kept
    entry) is taken as it is: no ranking against the new samples, and still the full search's answer."""
    from packer.pipeline import neighborcache

    rng = np.random.default_rng(5)
    centres = rng.normal(0, 1, (3, EMBED_DIM))
    n = 300
    keys = [f"s{i:06d}" for i in range(n)]
    entities: list[str | None] = [f"e{i // 4}" for i in range(n)]
    emb = _unit(rng, n, centres)
    _search(tmp_path, keys, entities, emb, 8)
    far = -centres.sum(axis=0)  # opposite every centre: below every kept entry of every list
    new = np.repeat((far / np.linalg.norm(far))[None, None, :], len(QUERY_ZOOMS), axis=1).astype(np.float16)
    ranked: list[int] = []
    real = neighborcache._merged_in_full
    monkeypatch.setattr(neighborcache, "_merged_in_full",
                        lambda k_index, *rest: ranked.append(len(k_index)) or real(k_index, *rest))
    assert _search(tmp_path, [*keys, "s999999"], [*entities, "new"], np.concatenate([emb, new]), 8) == n
    assert ranked == []
