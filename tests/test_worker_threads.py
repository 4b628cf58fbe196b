"""OpenCV runs one thread in each worker process of packer's local cluster, never touches the
calling process's pool, and its answers do not depend on it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from packer.errors import ConfigError
from packer.threads import ENV_THREADS, worker_cv_threads


def _cv_threads(_: int) -> int:
    return int(cv2.getNumThreads())


@pytest.mark.slow  # a real dask cluster
def test_a_local_workers_opencv_runs_one_thread_and_the_calling_process_keeps_its_pool() -> None:
    from packer.pipeline.cluster import open_executor

    before = cv2.getNumThreads()
    with open_executor(None, workers=1) as executor:
        seen = {threads for _, threads in executor.map_unordered(_cv_threads, [0, 1, 2])}
    assert seen == {1}
    assert cv2.getNumThreads() == before  # a notebook or a sync build keeps every core


@pytest.mark.slow  # a real dask cluster
def test_an_in_process_cluster_leaves_the_calling_processs_pool_alone() -> None:
    """A threaded cluster's tasks run in the caller's own process: packer must not change its
    OpenCV there (it did, when the setting was made inside each task)."""
    from distributed import Client, LocalCluster

    from packer.pipeline.cluster import open_executor

    before = cv2.getNumThreads()
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster):
        with open_executor(cluster.scheduler_address) as executor:
            assert {t for _, t in executor.map_unordered(_cv_threads, [0, 1])} == {before}
    assert cv2.getNumThreads() == before


@pytest.mark.slow  # a real dask cluster
def test_the_variable_sets_another_count_and_zero_leaves_opencvs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.pipeline.cluster import open_executor

    monkeypatch.setenv(ENV_THREADS, "3")
    with open_executor(None, workers=1) as executor:
        assert {t for _, t in executor.map_unordered(_cv_threads, [0])} == {3}
    monkeypatch.setenv(ENV_THREADS, "0")
    monkeypatch.delenv("OPENCV_FOR_THREADS_NUM", raising=False)
    with open_executor(None, workers=1) as executor:
        assert {t for _, t in executor.map_unordered(_cv_threads, [0])} == {cv2.getNumThreads()}


@pytest.mark.parametrize("text", ["one", "-1", "1.5", ""])
def test_a_bad_thread_count_names_the_variable_and_the_fix(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(ENV_THREADS, text)
    with pytest.raises(ConfigError, match=rf"{ENV_THREADS}=.*whole number of threads"):
        worker_cv_threads()


def _thumb_pairs(seed: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Thumbnails with structure at every scale, each against a shifted, zoomed, re-windowed copy
    of itself (refined) and against an unrelated one (usually turned away early)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        base = cv2.GaussianBlur(rng.uniform(0, 255, (64, 64)).astype(np.float32), (0, 0), float(rng.uniform(0.8, 3)))
        base = np.clip(base * rng.uniform(2, 5) - 200 + rng.uniform(-40, 40), 0, 255).astype(np.uint8)
        matrix = cv2.getRotationMatrix2D((31.5, 31.5), 0.0, float(rng.uniform(0.93, 1.07)))
        matrix[:, 2] = matrix[:, 2] + rng.uniform(-3, 3, size=2)
        moved = cv2.warpAffine(base.astype(np.float32), matrix, (64, 64), borderMode=cv2.BORDER_REPLICATE)
        copy = np.clip(np.sqrt(moved / 255.0) * 255.0 + rng.normal(0, 1.5, moved.shape), 0, 255).astype(np.uint8)
        other = np.clip(rng.normal(128, 40, (64, 64)), 0, 255).astype(np.uint8)
        pairs += [(base, copy), (base, other)]
    return pairs


def test_near_copy_evidence_and_resizes_are_the_same_on_one_thread_and_on_several() -> None:
    from packer.pipeline.nearcopy import REFINE_MARGIN, signature, verify
    from packer.pipeline.nearscreen import half_bands

    pairs = _thumb_pairs(7, 60)
    image = np.random.default_rng(3).integers(0, 4096, (2, 517, 389)).astype(np.float32)
    default = cv2.getNumThreads()
    seen = {}
    try:
        for threads in (1, max(2, default)):
            cv2.setNumThreads(threads)
            evidence = [verify(a, b, floor=0.984 - REFINE_MARGIN) for a, b in pairs]
            refined = [verify(a, b) for a, b in pairs[:20]]
            sizes = [cv2.resize(image[0], (256, 256), interpolation=how)
                     for how in (cv2.INTER_AREA, cv2.INTER_LINEAR, cv2.INTER_NEAREST_EXACT)]
            screened = half_bands(np.stack([a for a, _ in pairs[:16]]))
            signed = signature(np.clip(image / 16, 0, 255).astype(np.uint8))
            seen[threads] = (evidence, refined, sizes, screened, signed)
    finally:
        cv2.setNumThreads(default)
    one, several = seen.values()
    assert one[0] == several[0] and one[1] == several[1]
    assert sum(e.score >= 0.984 for e in one[0]) > 0  # copies among them, not only rejections
    for a, b in zip(one[2], several[2], strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(one[3], several[3])
    assert one[4].tobytes() == several[4].tobytes()
