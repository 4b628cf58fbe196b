"""The first stage of near-copy verification turns look-alikes away before the full test, never a
copy the full test links, and the links (with their evidence and rivals) are those of verifying
every candidate in full."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_nearcopy import photo

from packer.demo import COPY_KINDS, ChestAnatomy, export_slice, render_chest_slice, seeded_rng
from packer.pipeline import nearcopy, nearscreen
from packer.pipeline.split import verify_in_process
from packer.transform.window import apply_window

FLOOR = nearcopy.MIN_SCORE - nearcopy.REFINE_MARGIN


def thumb_of(image: np.ndarray) -> np.ndarray:
    """The signature thumbnail of a packed H×W or C×H×W image."""
    return np.asarray(nearcopy.signature(image)["thumb"])


def value(first: np.ndarray, second: np.ndarray) -> float:
    return float(nearscreen.screen_values(first[None], second[None], np.zeros(1, np.intp), np.zeros(1, np.intp))[0])


# ---------------------------------------------------------------- what the value is


def test_the_value_is_the_best_opencv_normalised_correlation_of_the_half_resolution_bands() -> None:
    """Computed independently with cv2.matchTemplate (TM_CCOEFF_NORMED) on the same bands, and the
    same for a pair whatever else is screened with it."""
    thumbs = np.stack([thumb_of(photo(seed)) for seed in range(6)])
    first = np.array([0, 0, 1, 2, 3, 4, 5, 5])
    second = np.array([0, 1, 2, 3, 0, 5, 4, 1])
    got = nearscreen.screen_values(thumbs, thumbs, first, second)
    inner = slice(nearscreen.SHIFT, nearscreen.HALF - nearscreen.SHIFT)
    for p, (a, b) in enumerate(zip(first.tolist(), second.tolist(), strict=True)):
        searched = nearscreen.half_bands(thumbs[b:b + 1])[0]
        expected = max(float(cv2.matchTemplate(searched, nearscreen.half_bands(thumbs[a:a + 1], zoom)[0, inner, inner],
                                               cv2.TM_CCOEFF_NORMED).max()) for zoom in nearscreen.ZOOMS)
        assert got[p] == pytest.approx(expected, abs=1e-5)
        assert value(thumbs[a], thumbs[b]) == pytest.approx(got[p], abs=1e-12)  # alone: the same but for rounding
    assert got[0] == pytest.approx(1.0)  # a thumbnail against itself


def test_what_is_let_through_is_what_reaches_the_threshold() -> None:
    """The zoom-1 shortcut (a pair whose zoom-1 correlation passes is not searched further) decides
    as the value does, on pairs either side of the threshold."""
    rng = np.random.default_rng(11)
    images = [_tiny(rng) for _ in range(20)] + [photo(seed).mean(axis=2).astype(np.float32) for seed in range(6)]
    edits = [edit for image in images for n, edit in enumerate(_edits(image)) if n in (5, 26, 32)]  # shift, zoom, JPEG
    thumbs = np.stack([thumb_of(image) for image in images + edits])
    first, second = (np.array(side) for side in zip(*itertools.permutations(range(len(thumbs)), 2), strict=True))
    values = nearscreen.screen_values(thumbs, thumbs, first, second)
    through = nearscreen.let_through(thumbs, thumbs, first, second)
    assert through.sum() >= 100 and (~through).sum() >= 100  # both kinds of pair are there
    assert np.array_equal(through, values >= nearscreen.SCREEN_MIN)


def test_a_flat_thumbnail_scores_zero_and_the_shape_is_checked() -> None:
    flat = np.full((64, 64), 9, dtype=np.uint8)
    assert value(flat, thumb_of(photo(1))) == 0.0 and value(thumb_of(photo(1)), flat) == 0.0
    with pytest.raises(ValueError, match=r"n×64×64 thumbnails, got shape \(2, 32, 32\)"):
        nearscreen.half_bands(np.zeros((2, 32, 32), dtype=np.uint8))


# ---------------------------------------------------------------- copies pass, look-alikes do not


def _ct_and_copies(seed: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(kind, source thumbnail, copy thumbnail) for each of COPY_KINDS, packed as the near-copy
    benchmark's job packs them: the CT slice as lung + mediastinum windows at 64×64, the exports
    grey at 64×64 (a DICOM copy is the slice itself)."""
    hu = render_chest_slice(ChestAnatomy.draw(seeded_rng(seed, "anatomy")), seeded_rng(seed, "slice"), size=256,
                            z=float(seeded_rng(seed, "level").uniform(-0.9, 0.9)))
    windows = [cv2.resize(apply_window(hu, c, w), (64, 64), interpolation=cv2.INTER_AREA)
               for c, w in ((-600, 1500), (50, 350))]
    source = thumb_of(np.stack(windows))
    for kind in COPY_KINDS:
        if kind.startswith("dicom"):
            yield kind, source, source
            continue
        image = export_slice(hu, kind)
        if kind == "jpeg75":
            ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 75])
            assert ok
            image = cv2.imdecode(data, cv2.IMREAD_GRAYSCALE)
        yield kind, source, thumb_of(cv2.resize(image, (64, 64), interpolation=cv2.INTER_AREA))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_first_stage_lets_every_planted_copy_kind_through_both_ways(seed: int) -> None:
    for kind, source, copy in _ct_and_copies(seed):
        for first, second in ((source, copy), (copy, source)):
            assert nearcopy.verify(first, second, floor=FLOOR).score >= nearcopy.MIN_SCORE, kind  # a copy...
            assert value(first, second) >= nearscreen.SCREEN_MIN + 0.15, kind                    # ...let through


def _tiny(rng: np.random.Generator) -> np.ndarray:
    """A 24×24 image of issue 40's tree: a smooth random base and its own noise."""
    base = cv2.resize(rng.uniform(0, 255, (4, 4)).astype(np.float32), (24, 24), interpolation=cv2.INTER_CUBIC)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.float32)


def _edits(image: np.ndarray) -> Iterator[np.ndarray]:
    """Copies of ``image`` over the verification's whole search (shifts up to 6 thumbnail pixels,
    zooms 0.91-1.09) and what exports do to pixels (JPEG down to quality 30, resizing, gamma,
    another window)."""
    h, w = image.shape
    for dy, dx in itertools.product((-6, -3, 0, 2, 5), repeat=2):
        shift = np.array([[1, 0, dx * w / 64], [0, 1, dy * h / 64]], dtype=np.float32)
        yield cv2.warpAffine(image, shift, (w, h), borderMode=cv2.BORDER_REPLICATE)
    for zoom in (0.91, 0.94, 0.97, 1.03, 1.06, 1.09):
        yield cv2.warpAffine(image, cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), 0, zoom), (w, h),
                             borderMode=cv2.BORDER_REPLICATE)
    for quality in (30, 50, 75, 95):
        ok, data = cv2.imencode(".jpg", np.clip(image, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, quality])
        assert ok
        yield cv2.imdecode(data, cv2.IMREAD_GRAYSCALE).astype(np.float32)
    for factor in (0.5, 0.7, 0.9, 1.25):
        yield cv2.resize(cv2.resize(image, (int(w * factor), int(h * factor)), interpolation=cv2.INTER_AREA), (w, h),
                         interpolation=cv2.INTER_AREA)
    for gamma in (0.5, 2.0):
        yield 255 * (np.clip(image, 0, 255) / 255) ** gamma
    yield np.clip((image - 40) / 160, 0, 1) * 255


def test_no_copy_the_full_test_links_over_its_whole_search_is_turned_away() -> None:
    """Photos, CT exports and tiny images, each copied over the verification's whole range: every
    copy the full test links (either way round) scores at least 0.1 above the stage's threshold."""
    rng = np.random.default_rng(40)
    sources = [photo(seed).mean(axis=2).astype(np.float32) for seed in (10, 11)]
    sources += [export_slice(render_chest_slice(ChestAnatomy.draw(seeded_rng(9, "a", p)), seeded_rng(9, "s", p)),
                             "png").astype(np.float32) for p in (1, 2)]
    sources += [_tiny(rng) for _ in range(2)]
    linked = 0
    for image in sources:
        size = 24 if image.shape[0] == 24 else 64
        source = thumb_of(cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA))
        for edit in _edits(image):
            copy = thumb_of(cv2.resize(edit, (size, size), interpolation=cv2.INTER_AREA))
            for first, second in ((source, copy), (copy, source)):
                if nearcopy.verify(first, second, floor=FLOOR).score >= nearcopy.MIN_SCORE:
                    linked += 1
                    assert value(first, second) >= nearscreen.SCREEN_MIN + 0.1
    assert linked >= 400  # of 2 × 6 × 41 copies: the range was searched, not skipped


def test_the_first_stage_turns_away_nearly_every_look_alike_of_tiny_images() -> None:
    """Other entities' tiny images (another smooth base, other noise) are what the candidate search
    pairs on issue 40's tree: at least 95 % of them are not verified."""
    rng = np.random.default_rng(7)
    thumbs = np.stack([thumb_of(_tiny(rng)) for _ in range(60)])
    first, second = np.triu_indices(len(thumbs), 1)
    values = nearscreen.screen_values(thumbs, thumbs, first, second)
    assert np.mean(values < nearscreen.SCREEN_MIN) >= 0.95


# ---------------------------------------------------------------- the links are the full test's


def _signature_files(tmp_path: Path, thumbs: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, np.ndarray]:
    rows = []
    for thumb in thumbs:
        row = nearcopy.signature(thumb)
        rows.append(row)
    path = tmp_path / "chunk.sig.npy"
    nearcopy.write_signatures(path, rows)
    return [str(path)], np.zeros(len(rows), dtype=np.int64), np.arange(len(rows))


def _full(tasks: Sequence[nearcopy.VerifyTask]) -> Iterator[tuple[nearcopy.VerifyTask, nearcopy.EvidenceArrays]]:
    """Every pair verified in full, whatever the task asks."""
    yield from verify_in_process([dataclasses.replace(task, screen=False) for task in tasks])


def _same(a: nearcopy.NearLinks, b: nearcopy.NearLinks) -> bool:
    fields = ("structure", "detail", "intensity", "zoom", "dy", "dx")
    return (a.candidates == b.candidates and np.array_equal(a.i, b.i) and np.array_equal(a.j, b.j)
            and np.array_equal(a.similarity, b.similarity) and a.rival is not None and b.rival is not None
            and np.array_equal(a.rival, b.rival)
            and all(np.array_equal(getattr(a.evidence, f), getattr(b.evidence, f)) for f in fields))


def test_links_evidence_and_rivals_equal_the_full_verification_on_tiny_images(tmp_path: Path) -> None:
    """Issue 40's kind of tree in small: 40 entities of 6 tiny images, 6 copies (exact, JPEG,
    resized) under other entities. Most candidates are turned away; the links are the same."""
    rng = np.random.default_rng(3)
    images, groups = [], []
    for entity in range(40):
        base = cv2.resize(rng.uniform(0, 255, (4, 4)).astype(np.float32), (24, 24), interpolation=cv2.INTER_CUBIC)
        for _ in range(6):
            images.append(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))
            groups.append(entity)
    for n, source in enumerate((3, 50, 100, 150, 200, 230)):
        image = images[source]
        if n % 3 == 1:
            ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 75])
            image = cv2.imdecode(data, cv2.IMREAD_GRAYSCALE)
        elif n % 3 == 2:
            image = cv2.resize(cv2.resize(image, (30, 30), interpolation=cv2.INTER_AREA), (24, 24),
                               interpolation=cv2.INTER_AREA)
        images.append(image)
        groups.append(100 + n)
    files, file_of, row_of = _signature_files(tmp_path, images)
    seen: list[nearcopy.EvidenceArrays] = []

    def screened(tasks: Sequence[nearcopy.VerifyTask]) -> Iterator[tuple[nearcopy.VerifyTask,
                                                                          nearcopy.EvidenceArrays]]:
        for task, evidence in verify_in_process(tasks):
            if task.screen:
                seen.append(evidence)
            yield task, evidence

    kwargs = {"neighbors": 8, "min_score": nearcopy.MIN_SCORE, "max_ratio": 0.5, "quiet": True}
    fast = nearcopy.find_near_links(files, file_of, row_of, np.array(groups), run=screened, **kwargs)
    full = nearcopy.find_near_links(files, file_of, row_of, np.array(groups), run=_full, **kwargs)
    planted = {(3, 240), (50, 241), (100, 242), (150, 243), (200, 244), (230, 245)}
    assert {(int(i), int(j)) for i, j in zip(full.i, full.j, strict=True)} <= planted and len(full) >= 5
    assert _same(fast, full)
    turned_away = nearcopy.EvidenceArrays.concat(seen).screened
    assert turned_away.mean() >= 0.8


def test_every_pair_the_rival_test_reads_is_verified_in_full(tmp_path: Path) -> None:
    """Look-alike chest slices score high against each other, so a copy's best rival is a
    look-alike with a real score. With a first stage that turned away every pair but the copies,
    the rivals read would be 0; the rivals' pairs are verified in full, and links, evidence and
    rivals are those of the full verification."""
    thumbs, groups = [], []
    for patient in range(30):
        anatomy = ChestAnatomy.draw(seeded_rng(5, "anatomy", patient))
        for level in (0.1,):
            thumbs.append(thumb_of(export_slice(render_chest_slice(anatomy, seeded_rng(5, "slice", patient, level),
                                                                   z=level), "png")))
            groups.append(patient)
    for n, source in enumerate((0, 7, 11, 20, 29)):  # exact copies under five more entities
        thumbs.append(thumbs[source])
        groups.append(100 + n)
    copies = {(0, 30), (7, 31), (11, 32), (20, 33), (29, 34)}
    files, file_of, row_of = _signature_files(tmp_path, thumbs)

    def copies_only(tasks: Sequence[nearcopy.VerifyTask]) -> Iterator[tuple[nearcopy.VerifyTask,
                                                                             nearcopy.EvidenceArrays]]:
        """A first stage that lets only the copies through."""
        full = verify_in_process([dataclasses.replace(task, screen=False) for task in tasks])
        for task, (_, evidence) in zip(tasks, full, strict=True):
            if task.screen:
                away = np.array([(int(a), int(b)) not in copies for a, b in zip(task.a_row, task.b_row, strict=True)])
                evidence = evidence.replaced(np.flatnonzero(away), nearcopy.EvidenceArrays.of(
                    [nearcopy.SCREENED] * int(away.sum())))
            yield task, evidence

    kwargs = {"neighbors": 6, "min_score": nearcopy.MIN_SCORE, "max_ratio": 0.5, "quiet": True}
    fast = nearcopy.find_near_links(files, file_of, row_of, np.array(groups), run=copies_only, **kwargs)
    full = nearcopy.find_near_links(files, file_of, row_of, np.array(groups), run=_full, **kwargs)
    assert {(int(i), int(j)) for i, j in zip(full.i, full.j, strict=True)} == copies
    assert full.rival is not None and (full.rival > 0.8).sum() >= 2  # look-alikes: real rivals, not 0
    assert _same(fast, full)
