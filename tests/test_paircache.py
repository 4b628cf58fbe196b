"""The verified-pair cache: a build verifies only the candidate pairs whose thumbnails it has not
verified before, and what it decides (links, leakage.json, dataset_hash) is the same as a build
that verifies every pair."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_nearcopy import copies_job, photo, signature_of

from packer.config import load_job
from packer.demo import ChestAnatomy, export_slice, render_chest_slice, seeded_rng, write_copies_tree
from packer.pipeline import nearcopy
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.paircache import PAIRS_FILE, PairCache, cached_verification
from packer.pipeline.split import verify_in_process

# ---------------------------------------------------------------- the cache in front of the verification


def _tasks(files: tuple[str, ...], pairs: list[tuple[int, int]], floor: float) -> list[nearcopy.VerifyTask]:
    """Pairs of rows of the first signature file, two tasks."""
    a = np.array([p for p, _ in pairs])
    b = np.array([q for _, q in pairs])
    zeros = np.zeros(len(pairs), dtype=np.int64)
    half = len(pairs) // 2
    return [nearcopy.VerifyTask(index=t, files=files, a_file=zeros[s], a_row=a[s], b_file=zeros[s], b_row=b[s],
                                floor=floor) for t, s in enumerate((slice(0, half), slice(half, None)))]


def _answers(run, tasks):  # type: ignore[no-untyped-def]
    got = dict((task.index, evidence) for task, evidence in run(tasks))
    return nearcopy.EvidenceArrays.concat([got[t.index] for t in tasks])


def _counting(calls: list[int]):  # type: ignore[no-untyped-def]
    def run(tasks):  # type: ignore[no-untyped-def]
        for task, evidence in verify_in_process(tasks):
            calls.append(len(task.a_file))
            yield task, evidence
    return run


def test_cached_answers_equal_verified_ones_cold_warm_and_partly_warm(tmp_path: Path) -> None:
    images = [photo(seed) for seed in range(6)]
    rows = [signature_of(image) for image in images] + [signature_of(images[0][8:, 5:])]  # row 6: a crop of 0
    sigs = tmp_path / "chunk.sig.npy"
    nearcopy.write_signatures(sigs, rows)
    files = (str(sigs),)
    first = [(0, 6), (1, 2), (2, 3), (6, 0)]   # (6, 0): the same two thumbnails the other way round
    later = [(0, 6), (1, 2), (3, 4), (4, 5), (0, 1), (6, 0)]
    floor = nearcopy.MIN_SCORE - nearcopy.REFINE_MARGIN
    plain = _answers(verify_in_process, _tasks(files, later, floor))

    cold = PairCache.open(tmp_path)
    calls: list[int] = []
    _answers(cached_verification(_counting(calls), cold), _tasks(files, first, floor))
    assert sum(calls) == 4 and (cold.verified, cold.reused) == (4, 0)
    cold.save()

    warm = PairCache.open(tmp_path)
    calls.clear()
    answered = _answers(cached_verification(_counting(calls), warm), _tasks(files, later, floor))
    assert (warm.verified, warm.reused) == (3, 3) and sum(calls) == 3  # (3, 4), (4, 5), (0, 1) are new
    for name in ("structure", "detail", "intensity", "zoom", "dy", "dx"):
        assert np.array_equal(getattr(answered, name), getattr(plain, name)), name
    # the evidence is not symmetric: (6, 0) is its own pair, not (0, 6) read backwards
    assert (answered.zoom[0], answered.dy[0]) != (answered.zoom[5], answered.dy[5]) or \
        answered.intensity[0] != answered.intensity[5]
    warm.save()
    # another floor is another verification: nothing reused
    other = PairCache.open(tmp_path)
    _answers(cached_verification(verify_in_process, other), _tasks(files, later, 0.0))
    assert (other.verified, other.reused) == (6, 0)


def test_a_task_list_made_as_read_gets_the_answers_of_the_tasks_made_whole(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The build hands the cache a task list that makes each task when read (nearcopy.VerifyTasks),
    each naming only its own files; the cache makes a task again when its misses come back and
    tells the runner how many pairs it sends without making them to count."""
    monkeypatch.setattr(nearcopy, "PAIRS_PER_TASK", 2)
    images = [photo(seed) for seed in range(6)]
    rows = [signature_of(image) for image in images] + [signature_of(images[0][8:, 5:])]
    for k, part in enumerate((rows[:4], rows[4:])):
        nearcopy.write_signatures(tmp_path / f"{k}.sig.npy", part)
    files = (str(tmp_path / "0.sig.npy"), str(tmp_path / "1.sig.npy"))
    file_of, row_of = np.array([0, 0, 0, 0, 1, 1, 1]), np.array([0, 1, 2, 3, 0, 1, 2])
    floor = nearcopy.MIN_SCORE - nearcopy.REFINE_MARGIN
    first, later = [(0, 6), (1, 2), (2, 5)], [(0, 6), (1, 2), (3, 4), (4, 5), (0, 1), (6, 0), (2, 5)]

    def made_as_read(pairs: list[tuple[int, int]]) -> nearcopy.VerifyTasks:
        return nearcopy.VerifyTasks(files, file_of, row_of, np.array([a for a, _ in pairs]),
                                    np.array([b for _, b in pairs]), floor=floor, screen=False)

    def whole(pairs: list[tuple[int, int]]) -> list[nearcopy.VerifyTask]:
        return [nearcopy.VerifyTask(index=0, files=files, a_file=file_of[[a for a, _ in pairs]],
                                    a_row=row_of[[a for a, _ in pairs]], b_file=file_of[[b for _, b in pairs]],
                                    b_row=row_of[[b for _, b in pairs]], floor=floor)]

    sent: list[int] = []

    def counting(tasks):  # type: ignore[no-untyped-def]
        sent.append(nearcopy.pairs_in(tasks))
        yield from verify_in_process(tasks)

    plain = _answers(verify_in_process, whole(later))
    cold = PairCache.open(tmp_path)
    _answers(cached_verification(counting, cold), made_as_read(first))
    assert sent == [3] and (cold.verified, cold.reused) == (3, 0)
    cold.save()
    warm = PairCache.open(tmp_path)
    answered = _answers(cached_verification(counting, warm), made_as_read(later))
    assert sent == [3, 4] and (warm.verified, warm.reused) == (4, 3)
    for name in ("structure", "detail", "intensity", "zoom", "dy", "dx"):
        assert np.array_equal(getattr(answered, name), getattr(plain, name)), name


def test_a_pair_the_first_stage_turned_away_is_verified_in_full_when_asked_in_full(tmp_path: Path) -> None:
    """The first stage's answer (SCREENED) is kept under its own key: a later request for the same
    pair's full evidence (the rival test's) is verified, not answered from the cache."""
    rows = [signature_of(photo(seed)) for seed in range(4)]
    sigs = tmp_path / "chunk.sig.npy"
    nearcopy.write_signatures(sigs, rows)
    pairs = [(0, 1), (1, 2), (2, 3), (3, 0)]
    floor = nearcopy.MIN_SCORE - nearcopy.REFINE_MARGIN
    screened = [dataclasses.replace(task, screen=True) for task in _tasks((str(sigs),), pairs, floor)]
    first = PairCache.open(tmp_path)
    turned_away = _answers(cached_verification(verify_in_process, first), screened).screened
    assert turned_away.all()  # four different photos: look-alikes at most
    first.save()
    again = PairCache.open(tmp_path)
    _answers(cached_verification(verify_in_process, again), screened)
    assert (again.verified, again.reused) == (0, 4)
    full = _answers(cached_verification(verify_in_process, again), _tasks((str(sigs),), pairs, floor))
    assert (again.verified, again.reused) == (4, 4) and not full.screened.any()


def test_the_file_holds_only_the_pairs_the_last_run_looked_at_and_a_damaged_one_is_ignored(tmp_path: Path) -> None:
    rows = [signature_of(photo(seed)) for seed in range(5)]
    sigs = tmp_path / "chunk.sig.npy"
    nearcopy.write_signatures(sigs, rows)
    files = (str(sigs),)
    for pairs in ([(0, 1), (1, 2), (2, 3), (3, 4)], [(0, 1), (0, 2)]):
        cache = PairCache.open(tmp_path)
        _answers(cached_verification(verify_in_process, cache), _tasks(files, pairs, 0.5))
        cache.save()
    assert len(PairCache.open(tmp_path).known) == 2
    path = tmp_path / PAIRS_FILE
    path.write_bytes(path.read_bytes()[:-7])  # cut short, as a crash without fsync might leave it
    damaged = PairCache.open(tmp_path)
    assert len(damaged.known) == 0 and "damaged" in damaged.ignored
    header, _, body = (tmp_path / PAIRS_FILE).read_bytes().partition(b"\n")
    older = json.loads(header) | {"version": nearcopy.VERIFY_VERSION + 1}
    path.write_bytes(json.dumps(older).encode() + b"\n" + body)
    assert "another version" in PairCache.open(tmp_path).ignored
    path.write_bytes(path.read_bytes()[:20])  # cut inside its header
    assert "damaged" in PairCache.open(tmp_path).ignored
    path.write_bytes(b"\x93NUMPY something else")
    assert PairCache.open(tmp_path).ignored == "not a pair cache"


# ---------------------------------------------------------------- builds: cold, warm, grown


def _grow(root: Path, new: int) -> None:
    """Add to the copies tree at ``root`` ``new`` exported slices of new patients (new entities
    Y*) and a resized export of an existing copy under a new entity (a copy to find: Z0001)."""
    rows = []
    for n in range(1, new + 1):
        anatomy = ChestAnatomy.draw(seeded_rng(99, "grown-anatomy", n))
        hu = render_chest_slice(anatomy, seeded_rng(99, "grown-slice", n), size=256, z=0.1 * (n % 5))
        rows.append((f"Y{n:04d}/01.png", export_slice(hu, "png"), f"Y{n:04d}"))
    existing = cv2.imread(str(root / "exports" / "X0001" / "01.png"), cv2.IMREAD_GRAYSCALE)
    rows.append(("Z0001/01.png", cv2.resize(existing, (236, 236), interpolation=cv2.INTER_AREA), "Z0001"))
    with open(root / "exports" / "labels.csv", "a", encoding="utf-8") as fh:
        for rel, image, entity in rows:
            (root / "exports" / rel).parent.mkdir(parents=True)
            cv2.imwrite(str(root / "exports" / rel), image)
            fh.write(f"{rel},normal,{entity},2021-03-01T00:00:00\n")


def _built(job: Path, out: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, bytes, int, int]:
    """(dataset_hash, leakage.json's bytes, pairs verified, pairs reused) of a build."""
    capsys.readouterr()
    result = build(load_job(job), BuildOptions(out=out, scheduler="sync", html_report=False, cache_dir=cache))
    said = capsys.readouterr()
    counts = re.search(r"near copies: (\d+) candidate pairs \(candidates_verified\), (\d+) verifications with "
                       r"the rival test's pairs \((\d+) run, (\d+) reused from the build cache\)", said.out)
    assert counts, said.out
    leakage = json.loads((result.version_dir / "leakage.json").read_text())
    # the line names leakage.json's count, and the verifications (run + reused) are at least those
    assert int(counts[1]) == leakage["rules"]["near_duplicates_across_splits"]["candidates_verified"]
    assert int(counts[2]) == int(counts[3]) + int(counts[4]) >= int(counts[1])
    # the verification shows its progress, counting only the pairs it verifies
    progress = re.findall(r"nearcopy: (\d+)/(\d+) pairs", said.err)
    assert progress[-1:] == ([(counts[3], counts[3])] if int(counts[3]) else []), said.err
    return (result.manifest["dataset_hash"], (result.version_dir / "leakage.json").read_bytes(),
            int(counts[3]), int(counts[4]))


@pytest.mark.slow  # four builds of a 270-sample tree (about 25 s)
def test_a_warm_or_partly_warm_cache_gives_the_same_leakage_and_dataset_hash_as_a_cold_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = write_copies_tree(tmp_path / "raw", patients=60, copies=18, seed=3)
    assert (tree.root / "exports" / "X0001" / "01.png").is_file()
    job = copies_job(tree, tmp_path / "job")
    cache, out = tmp_path / "cache", tmp_path / "out"
    _, _, verified, reused = _built(job, out, cache, capsys)
    assert verified > 10 * 60 and reused == 0

    _grow(tree.root, new=6)  # the next day: the same job, the same output, more files
    partly = _built(job, out, cache, capsys)
    cold = _built(job, tmp_path / "elsewhere", tmp_path / "fresh-cache", capsys)
    warm = _built(job, out, cache, capsys)
    assert partly[0] == cold[0] == warm[0]  # dataset_hash
    assert partly[1] == cold[1] == warm[1]  # leakage.json, byte for byte
    assert partly[2] + partly[3] == cold[2] and 0 < partly[2] < cold[2] // 5  # the new samples' pairs, mostly
    assert (warm[2], warm[3]) == (0, cold[2])
    near = json.loads(cold[1])["rules"]["duplicates_span_entities"]["findings"]
    assert any("Z0001" in finding["entities"] for finding in near)  # the new copy is found, cache or not
    # after a build the file holds the pairs that build looked at: the same file, cold or warm
    cold_files = [p.read_bytes() for p in (tmp_path / "fresh-cache").glob(f"*/{PAIRS_FILE}")]
    warm_files = [p.read_bytes() for p in cache.glob(f"*/{PAIRS_FILE}")]
    assert len(cold_files) == 1 and warm_files == cold_files
