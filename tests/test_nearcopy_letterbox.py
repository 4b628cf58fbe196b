"""Near copies under ``resize: fit``: the letterbox padding is no evidence. Signatures are drawn from
the box the image lies in, so different photos of one unusual aspect are not linked, and a photo
re-encoded and resized still is."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from packer.config import ImageTransformConfig, load_job
from packer.pipeline import nearcopy
from packer.pipeline.cluster import open_executor
from packer.pipeline.stages import run_stages
from packer.transform.image import transform_image


def photo(seed: int, height: int, width: int) -> np.ndarray:
    """A seeded photo-like H×W×3 uint8 image: smooth colour field, filled ellipses, blur, grain."""
    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.uniform(0, 255, (4, 12, 3)).astype(np.float32), (width, height),
                     interpolation=cv2.INTER_CUBIC)
    for _ in range(30):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(4, max(5, height // 3))), int(rng.integers(4, max(5, height // 3))))
        cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
    img = np.asarray(cv2.GaussianBlur(img, (0, 0), 1.5)) + rng.normal(0, 4, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def texture(seed: int, height: int, width: int) -> np.ndarray:
    """Seeded uniform noise, H×W×3 uint8: no two seeds share any structure."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def fit(image: np.ndarray, size: int = 64) -> tuple[np.ndarray, tuple[int, int, int, int] | None]:
    """What packer's image transform makes of ``image`` under ``resize: fit``: (C×H×W, content box)."""
    tile, = transform_image(image, ImageTransformConfig(size=(size, size), resize="fit", color="gray"))
    return tile.image, tile.content


# ---------------------------------------------------------------- the content box


def test_fit_records_where_the_image_lies_and_stretch_and_crop_fill_the_output() -> None:
    wide = photo(1, 60, 240)
    image, content = fit(wide)
    assert content == (24, 0, 16, 64)
    rows = np.flatnonzero(image[0].any(axis=1))
    assert (rows.min(), rows.max()) == (24, 39)  # the padding is black, outside the box only
    tall, _ = fit(np.ascontiguousarray(wide.transpose(1, 0, 2)))
    assert fit(np.ascontiguousarray(wide.transpose(1, 0, 2)))[1] == (0, 24, 64, 16)
    assert tall.shape == (1, 64, 64)
    for policy in ("stretch", "crop"):
        tile, = transform_image(wide, ImageTransformConfig(size=(64, 64), resize=policy, color="gray"))
        assert tile.content is None


def test_a_tile_records_the_part_of_the_image_it_holds() -> None:
    cfg = ImageTransformConfig(size=(64, 64), resize="fit", color="gray", tile_size=(32, 32))
    tiles = transform_image(photo(2, 60, 240), cfg)
    assert [(t.origin, t.content) for t in tiles] == [
        ((0, 0), (24, 0, 8, 32)), ((0, 32), (24, 0, 8, 32)), ((32, 0), (0, 0, 8, 32)), ((32, 32), (0, 0, 8, 32))]
    square = transform_image(photo(2, 64, 64), cfg)
    assert all(t.content is None for t in square)  # every tile all image
    strip = transform_image(photo(3, 20, 240), ImageTransformConfig(size=(96, 96), resize="fit", color="gray",
                                                                     tile_size=(32, 32)))
    assert [t.content for t in strip][:3] == [(0, 0, 0, 0)] * 3  # padding alone: an empty box


# ---------------------------------------------------------------- signatures


def test_two_noise_panoramas_are_not_copies_once_their_padding_is_left_out() -> None:
    a, box_a = fit(texture(10, 60, 360))
    b, box_b = fit(texture(11, 60, 360))
    # the whole letterboxed outputs agree on their padding: they verify as copies
    whole = nearcopy.verify(nearcopy.packed_signature(a)["thumb"], nearcopy.packed_signature(b)["thumb"])
    assert whole.score >= 0.984
    boxed = nearcopy.verify(nearcopy.packed_signature(a, box_a)["thumb"],
                            nearcopy.packed_signature(b, box_b)["thumb"])
    assert boxed.score < 0.5 and boxed.intensity < 0.2


def test_a_photo_re_encoded_and_resized_still_verifies_from_its_content_box() -> None:
    source = photo(4, 120, 480)
    ok, data = cv2.imencode(".jpg", cv2.resize(source, (400, 100), interpolation=cv2.INTER_AREA),
                            [cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok
    copy = cv2.imdecode(data, cv2.IMREAD_COLOR)
    (a, box_a), (b, box_b) = fit(source), fit(copy)
    sig_a, sig_b = nearcopy.packed_signature(a, box_a), nearcopy.packed_signature(b, box_b)
    assert nearcopy.verify(sig_a["thumb"], sig_b["thumb"]).score >= 0.984
    # a stretch output of the same photo gives (near enough) the same thumbnail: fit adds nothing
    stretched, = transform_image(source, ImageTransformConfig(size=(16, 64), resize="stretch", color="gray"))
    assert nearcopy.verify(sig_a["thumb"], nearcopy.packed_signature(stretched.image)["thumb"]).score >= 0.99


def test_a_content_box_thinner_than_the_smallest_side_gets_a_blank_signature() -> None:
    image, box = fit(photo(5, 40, 320))  # 8:1 in 64×64: 8 rows of image
    assert box == (28, 0, 8, 64)
    assert not nearcopy.packed_signature(image, box)["thumb"].any()
    assert nearcopy.packed_signature(image)["thumb"].any()  # (the whole output is no evidence of it)


# ---------------------------------------------------------------- a build


def write_tree(root: Path) -> tuple[str, str]:
    """Six entities of four distinct images each, every one 4:1 or 6:1, half of them turned tall;
    and under a seventh entity a JPEG copy of E00's photo ``img1`` at 5/6 of its size. Returns
    (copy, source) relative paths."""
    rows = []
    for e in range(6):
        for k in range(4):
            image = photo(100 * e + k, 120, 480) if k % 2 else texture(100 * e + k, 80, 480)
            if (e + k) % 2:
                image = np.ascontiguousarray(image.transpose(1, 0, 2))
            rel = f"E{e:02d}/img{k}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            assert cv2.imwrite(str(root / rel), image)
            rows.append(f"{rel},x,E{e:02d}")
    source = cv2.imread(str(root / "E00/img1.png"))
    small = cv2.resize(source, (source.shape[1] * 5 // 6, source.shape[0] * 5 // 6), interpolation=cv2.INTER_AREA)
    ok, data = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok
    (root / "COPY").mkdir()
    (root / "COPY/copy.jpg").write_bytes(data.tobytes())
    rows.append("COPY/copy.jpg,x,COPY")
    (root / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows) + "\n")
    return "COPY/copy.jpg", "E00/img1.png"


@pytest.fixture(scope="module")
def panoramas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, str]]:
    root = tmp_path_factory.mktemp("panoramas")
    return root, write_tree(root)


def near_links(tree: Path, folder: Path, resize: str) -> list[tuple[str, str]]:
    """The near-copy links of a build of ``tree`` through its audit, as sorted pairs of relative paths."""
    job = folder / "job.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    job.write_text(yaml.safe_dump({
        "name": "lb", "sources": [{"kind": "image", "root": str(tree), "table": str(tree / "labels.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [64, 64], "color": "gray", "resize": resize}},
        "pack": {"format": "webdataset"}, "output": str(folder / "out"), "phi": {"mode": "keep"}}))
    with open_executor("sync") as executor:
        prepared = run_stages(load_job(job), executor, through="audit", cache_dir=folder / "cache",
                              quiet=True).prepared
    relpath = prepared.samples.column("relpath")
    return sorted((min(str(relpath[i]), str(relpath[j])), max(str(relpath[i]), str(relpath[j])))
                  for i, j in zip(prepared.links.i.tolist(), prepared.links.j.tolist(), strict=True))


@pytest.mark.parametrize("resize", ["stretch", "fit"])
def test_distinct_panoramas_of_several_entities_are_linked_only_to_their_true_copy(
        panoramas: tuple[Path, tuple[str, str]], tmp_path: Path, resize: str) -> None:
    tree, (copy, source) = panoramas
    assert near_links(tree, tmp_path, resize) == [(copy, source)]
