"""The recipes in workflows/recipes/ pack five public datasets exactly as they ship.

Each test writes a small tree in the dataset's published layout (``tests/recipe_trees.py``:
real file names, headers, cell conventions and pitfalls) under ``data/``, copies the recipe
to ``workflows/recipes/`` beside it, as a checkout holds them, builds it unedited, and reads
the shards back with stock ``webdataset`` and with packer's ``ShardDataset``. What it checks is
what a user of the dataset relies on: every target equals the table's cells under the
recipe's policy (and the ignore mask equals exactly the cells a U-Ignore policy masks), the
official split is reproduced image by image and audited, no patient is in two splits, every
input file is packed once or left out on purpose, and nothing is reported bad.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset as wds
import yaml

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.exclusions import read_excluded
from packer.loader import ShardDataset
from packer.phi import pseudonymizer_for
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import discover
from tests import recipe_trees as trees
from tests.demo_version import REPO

RECIPES = REPO / "workflows" / "recipes"
T = TypeVar("T")


def _home(tmp_path: Path, write: Callable[[Path], T], *jobs: str) -> T:
    """A checkout's layout: workflows/recipes/<job>.yaml and data/<dataset as published>."""
    (tmp_path / "workflows" / "recipes").mkdir(parents=True)
    for job in jobs:
        shutil.copy(RECIPES / f"{job}.yaml", tmp_path / "workflows" / "recipes" / f"{job}.yaml")
    return write(tmp_path / "data")


def _build(home: Path, job: str) -> BuildResult:
    return build(load_job(home / "workflows" / "recipes" / f"{job}.yaml"),
                 BuildOptions(scheduler="sync", quiet=True, html_report=False))


def _recipe(job: str) -> dict[str, Any]:
    return yaml.safe_load((RECIPES / f"{job}.yaml").read_text())


def _tar_samples(version: Path) -> dict[str, dict[str, Any]]:
    """Every sample of every split, read by stock webdataset: key → decoded members, with the
    shard's split (from its file name) under ``split_of_shard``."""
    out: dict[str, dict[str, Any]] = {}
    for shard in sorted(version.glob("*.tar")):
        for sample in wds.WebDataset(str(shard), shardshuffle=False).decode():
            assert sample["__key__"] not in out, f"{sample['__key__']} packed twice"
            out[sample["__key__"]] = {**sample, "split_of_shard": shard.name.split("-")[0]}
    return out


def _loaded(result: BuildResult) -> dict[str, dict[str, Any]]:
    """Every sample of every split through packer's loader: key → item."""
    manifest = json.loads(result.manifest_path.read_text())
    out = {}
    for split, entry in manifest["splits"].items():
        if entry["samples"]:
            for item in ShardDataset(result.manifest_path, split, shuffle=False):
                out[item["key"]] = item
    return out


def _no_entity_in_two_splits(version: Path) -> dict[str, set[str]]:
    """entity → its splits, from _index.parquet; asserts each entity has one."""
    splits: dict[str, set[str]] = defaultdict(set)
    for row in pq.read_table(version / "_index.parquet").to_pylist():
        splits[row["entity_id"]].add(row["split"])
    assert all(len(s) == 1 for s in splits.values()), {e: s for e, s in splits.items() if len(s) > 1}
    return splits


def _audited(version: Path, given: str | None) -> dict[str, Any]:
    """leakage.json: passed, no entity overlap, and (for an official split) audited as given."""
    leakage = json.loads((version / "leakage.json").read_text())
    assert leakage["passed"] and leakage["rules"]["entity_overlap"]["count"] == 0
    if given is not None:
        assert leakage["rules"]["entity_overlap"]["given"] == given
    return leakage


def _nothing_bad(result: BuildResult) -> None:
    assert list(read_bad_samples(result.version_dir / "bad_samples.jsonl")) == []


def _left_out(result: BuildResult, root: Path) -> dict[str, str]:
    """excluded.jsonl as relative path → why (each file once), for the files under ``root``."""
    path = result.version_dir / "excluded.jsonl"
    records = read_excluded(path) if path.exists() else []
    relpaths = [Path(r["path"]).relative_to(root).as_posix() for r in records]
    assert _once(relpaths) == sorted(relpaths)
    return {rel: r["why"] for rel, r in zip(relpaths, records, strict=True)}


def _every_file_once(result: BuildResult, root: Path, packed: Iterable[str], files: Iterable[str]) -> dict[str, str]:
    """Every input file is packed or left out on purpose, once (nothing is bad here), and the
    manifest counts each once; returns the files left out, with why."""
    left_out, files = _left_out(result, root), sorted(files)
    assert _once([*packed, *left_out]) == files
    inputs = json.loads(result.manifest_path.read_text())["inputs"]
    assert inputs["files"] == len(files)
    assert sum(inputs.get("excluded", {}).values()) == len(left_out)
    return left_out


def _hot(names: Iterable[str], order: Iterable[str]) -> list[int]:
    held = set(names)
    return [int(name in held) for name in order]


def _once(values: Iterable[str]) -> list[str]:
    """The values, sorted, asserting none comes twice (a mapping: its keys)."""
    counted = Counter(list(values))
    assert all(n == 1 for n in counted.values()), [v for v, n in counted.items() if n > 1]
    return sorted(counted)


def test_every_recipe_is_documented_and_reads_the_data_where_the_readme_says() -> None:
    names = sorted(p.name for p in RECIPES.glob("*.yaml"))
    assert names == ["chexpert-u-ignore.yaml", "chexpert-u-ones.yaml", "decathlon-heart.yaml", "mimic-cxr-jpg.yaml",
                     "nih-chestxray14.yaml", "rsna-pneumonia.yaml"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Recipes: public datasets as they ship", 1)[1].split("\n### ", 1)[0]
    for name in names:
        assert f"`{name}`" in section, name
        job = _recipe(name[:-5])
        assert job["output"] == "../../build"
        for source in job["sources"]:
            folder = source["root"].removeprefix("../../data/").split("/", 1)[0]
            assert source["root"].startswith("../../data/") and f"data/{folder}/" in section, (name, folder)
            table = source.get("table", source.get("labels"))
            assert table["file"].startswith(source["root"].rsplit("/", 1)[0] if name.startswith("rsna")
                                            else source["root"]), name


# -- NIH ChestX-ray14 ----------------------------------------------------------------------------------------------


def _carved(entities: Iterable[str], seed: int, origin: str, ratio: float) -> set[str]:
    """The entities a carve moves, by the README's rule: sha256 of packer-split␀seed␀carve␀from␀entity,
    its first 8 bytes as a fraction of 2**64, below the ratio."""
    def unit(entity: str) -> float:
        digest = hashlib.sha256(f"packer-split\x00{seed}\x00carve\x00{origin}\x00{entity}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64
    return {e for e in entities if unit(e) < ratio}


def test_nih_chestxray14_packs_every_image_with_its_findings_on_the_official_split(tmp_path: Path) -> None:
    tree = _home(tmp_path, trees.write_nih, "nih-chestxray14")
    result = _build(tmp_path, "nih-chestxray14")
    _nothing_bad(result)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["target"]["names"] == list(trees.NIH_FINDINGS)  # "No Finding" is no label
    samples = _tar_samples(result.version_dir)
    by_path = {s["json"]["path"]: s for s in samples.values()}
    images = {im.relpath: im for im in tree.images}
    # every PNG once (the RGBA one too), found by its bare name under images_00N/images/
    assert _every_file_once(result, tree.root, by_path, images) == {}
    for relpath, sample in by_path.items():
        assert sample["target.npy"].tolist() == _hot(images[relpath].findings, trees.NIH_FINDINGS), relpath
        assert sample["json"]["entity_id"] == images[relpath].patient
        assert sample["npy"].shape == (1, 256, 256)
    # the official split, image by image: test_list.txt is test, train_val_list.txt is train and valid,
    # valid carved from it by whole patients (the many-follow-up patient moves with all nine images)
    split = {relpath: s["split_of_shard"] for relpath, s in by_path.items()}
    name_split = {images[relpath].name: sp for relpath, sp in split.items()}
    assert sorted(n for n, sp in name_split.items() if sp == "test") == sorted(tree.test)
    assert sorted(n for n, sp in name_split.items() if sp in ("train", "valid")) == sorted(tree.train_val)
    job = _recipe("nih-chestxray14")["split"]
    carve = job["carve"]["valid"]
    valid_patients = _carved({im.patient for im in tree.images if im.name in tree.train_val}, job["seed"],
                             carve["from"], carve["ratio"])
    assert valid_patients, "the tree should give the carve a patient to move"
    assert sorted(n for n, sp in name_split.items() if sp == "valid") == sorted(
        im.name for im in tree.images if im.patient in valid_patients)
    _no_entity_in_two_splits(result.version_dir)
    _audited(result.version_dir, given="list")
    # the loader reads the same targets
    for key, item in _loaded(result).items():
        assert item["target"].tolist() == samples[key]["target.npy"].tolist()


# -- CheXpert-v1.0-small -------------------------------------------------------------------------------------------


def _chexpert_expected(cells: tuple[str, ...], policy: str) -> tuple[list[int], list[int] | None]:
    """(target, target_mask or None) of one row under U-Ones (uncertain 1, blank 0) or U-Ignore
    (uncertain and blank masked, target 0 there)."""
    if policy == "u-ones":
        return [int(c in ("1.0", "-1.0")) for c in cells], None
    return [int(c == "1.0") for c in cells], [int(c in ("1.0", "0.0")) for c in cells]


@pytest.mark.parametrize("policy", ["u-ones", "u-ignore"])
def test_chexpert_packs_the_frontal_views_under_each_uncertainty_policy(tmp_path: Path, policy: str) -> None:
    job = f"chexpert-{policy}"
    tree = _home(tmp_path, trees.write_chexpert, job)
    result = _build(tmp_path, job)
    _nothing_bad(result)  # the laterals are filtered by Frontal/Lateral, never bad
    samples = _tar_samples(result.version_dir)
    by_path = {s["json"]["path"]: s for s in samples.values()}
    images = {im.relpath: im for im in tree.images}
    frontal = sorted(im.relpath for im in tree.images if im.frontal)
    assert _once(by_path) == frontal and len(frontal) < len(images)  # counting the left out: the test below
    masked = 0
    for relpath, sample in by_path.items():
        target, mask = _chexpert_expected(images[relpath].cells, policy)
        assert sample["target.npy"].tolist() == target, relpath
        if mask is None:
            assert "target_mask.npy" not in sample
        else:
            assert sample["target_mask.npy"].tolist() == mask, relpath
            masked += mask.count(0)
        # the official split: train.csv's images are train, valid.csv's valid
        assert sample["split_of_shard"] == images[relpath].split
        assert sample["json"]["entity_id"] == images[relpath].patient
    if policy == "u-ignore":
        assert masked > 0  # the tree has uncertain and blank cells to mask
    _no_entity_in_two_splits(result.version_dir)
    _audited(result.version_dir, given="column")
    for key, item in _loaded(result).items():
        assert item["target"].tolist() == samples[key]["target.npy"].tolist()
        if policy == "u-ignore":
            assert item["target_mask"].tolist() == samples[key]["target_mask.npy"].tolist()


def test_chexpert_builds_with_its_download_linked_into_data(tmp_path: Path) -> None:
    """The README: "Put the download under data/ (a symbolic link will do)". With
    data/CheXpert-v1.0-small a link to the download elsewhere, the recipe refused every row (its
    root resolved through the link, its path_base did not, so the cells led outside the root) and
    told the user to set the path_base it already sets. It builds as with the files in place."""
    home = tmp_path / "home"
    tree = _home(home, trees.write_chexpert, "chexpert-u-ones")
    elsewhere = tmp_path / "mnt" / "datasets"
    elsewhere.mkdir(parents=True)
    (home / "data" / "CheXpert-v1.0-small").rename(elsewhere / "CheXpert-v1.0-small")
    (home / "data" / "CheXpert-v1.0-small").symlink_to(elsewhere / "CheXpert-v1.0-small", target_is_directory=True)
    result = _build(home, "chexpert-u-ones")
    _nothing_bad(result)
    paths = {s["json"]["path"] for s in _tar_samples(result.version_dir).values()}
    assert paths == {im.relpath for im in tree.images if im.frontal}


def test_chexpert_counts_each_file_once_across_its_two_tables(tmp_path: Path) -> None:
    """Every file is packed by the source whose table names it, or left out once, with one reason."""
    tree = _home(tmp_path, trees.write_chexpert, "chexpert-u-ones")
    doc = _recipe("chexpert-u-ones")
    for source in doc["sources"]:  # discovery alone: the target and the split are the build test's
        source["label"] = "none"
    doc["split"] = {"by": "entity"}
    job = tmp_path / "workflows" / "recipes" / "chexpert-u-ones.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    found = discover(load_job(job))
    placed = [ref.relpath for ref in found.refs]
    left_out = [e.path.split("/CheXpert-v1.0-small/", 1)[1] for e in found.excluded]
    assert found.issues == []
    assert _once(placed + left_out) == sorted(im.relpath for im in tree.images)
    assert {e.why for e in found.excluded} == {"filtered"}


# -- MIMIC-CXR-JPG 2.0.0 -------------------------------------------------------------------------------------------


def test_mimic_cxr_jpg_packs_the_frontal_views_with_their_study_labels_on_the_official_split(tmp_path: Path) -> None:
    tree = _home(tmp_path, trees.write_mimic, "mimic-cxr-jpg")
    result = _build(tmp_path, "mimic-cxr-jpg")
    _nothing_bad(result)  # laterals, images without a view, a study without labels: left out, never bad
    samples = _tar_samples(result.version_dir)
    by_path = {s["json"]["path"]: s for s in samples.values()}
    images = {im.relpath: im for im in tree.images}
    kept = sorted(im.relpath for im in tree.images if im.view in ("PA", "AP") and im.cells is not None)
    assert _once(by_path) == kept
    left_out = _every_file_once(result, tree.root, by_path, images)
    assert set(left_out.values()) == {"filtered"}  # by the view, or by the study's missing label row
    assert {images[p].view for p in left_out} >= {"LATERAL", "LL", ""}
    assert any(images[p].cells is None and images[p].view in ("PA", "AP") for p in left_out)
    for relpath, sample in by_path.items():
        cells = images[relpath].cells
        assert cells is not None
        # uncertain (-1.0) masked, blank read as absent
        assert sample["target.npy"].tolist() == [int(c == "1.0") for c in cells], relpath
        assert sample["target_mask.npy"].tolist() == [int(c != "-1.0") for c in cells], relpath
        assert sample["split_of_shard"] == {"validate": "valid"}.get(images[relpath].split, images[relpath].split)
        assert sample["json"]["entity_id"] == images[relpath].subject
    _no_entity_in_two_splits(result.version_dir)
    _audited(result.version_dir, given="column")
    for key, item in _loaded(result).items():
        assert item["target_mask"].tolist() == samples[key]["target_mask.npy"].tolist()


def test_the_mimic_tables_are_read_gzipped_as_published_and_place_every_frontal_image(tmp_path: Path) -> None:
    """The recipe's table, joins and filter, run by discovery alone: the three .csv.gz tables are
    read as they ship, each path is built from the ids, and each image is placed or left out by
    the filters. (The target and the split are the build test's: here they are set aside.)"""
    tree = _home(tmp_path, trees.write_mimic, "mimic-cxr-jpg")
    assert all(p.read_bytes()[:2] == b"\x1f\x8b" for p in tree.root.glob("*.csv.gz"))  # gzip, as published
    doc = _recipe("mimic-cxr-jpg")
    doc["sources"][0]["label"], doc["split"] = "none", {"by": "entity"}
    job = tmp_path / "workflows" / "recipes" / "mimic-cxr-jpg.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    found = discover(load_job(job))
    assert found.issues == []
    kept = sorted(im.relpath for im in tree.images if im.view in ("PA", "AP") and im.cells is not None)
    assert _once(ref.relpath for ref in found.refs) == kept
    images = {im.relpath: im for im in tree.images}
    # each image's row carries its study's labels and its split, joined on the ids
    for ref in found.refs:
        row = dict(ref.extra)
        assert (row["split"], row["study_id"]) == (images[ref.relpath].split, images[ref.relpath].study)
        assert tuple(row[c] for c in trees.MIMIC_LABELS) == images[ref.relpath].cells
    left_out = sorted(im.relpath for im in tree.images if im.relpath not in kept)
    assert sorted(e.path.split("/2.0.0/", 1)[1] for e in found.excluded) == left_out
    assert {e.why for e in found.excluded} == {"filtered"}
    assert {ref.entity for ref in found.refs} <= {im.subject for im in tree.images}


# -- RSNA Pneumonia Detection Challenge ----------------------------------------------------------------------------


def test_rsna_pneumonia_packs_one_sample_per_image_with_its_class_whatever_its_box_rows(tmp_path: Path) -> None:
    tree = _home(tmp_path, trees.write_rsna, "rsna-pneumonia")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "rsna-pneumonia.key").write_text("5e" * 32)
    result = _build(tmp_path, "rsna-pneumonia")
    _nothing_bad(result)
    manifest = json.loads(result.manifest_path.read_text())
    order = _recipe("rsna-pneumonia")["labels"]
    assert list(manifest["label_map"]) == order == ["Normal", "No Lung Opacity / Not Normal", "Lung Opacity"]
    # pseudonymized: a sample is named by a keyed digest of its file, its entity by one of PatientID
    phi = pseudonymizer_for(load_job(tmp_path / "workflows" / "recipes" / "rsna-pneumonia.yaml").phi)
    expected = {f"rsna-{phi.path_digest('rsna', im.patient_id + '.dcm')}": im for im in tree.images}
    samples = _tar_samples(result.version_dir)
    assert sorted(samples) == sorted(expected)  # one sample per image, however many box rows it has
    assert any(im.boxes > 1 for im in tree.images)
    for key, sample in samples.items():
        image = expected[key]
        assert sample["cls"] == order.index(image.klass)
        assert (image.klass == "Lung Opacity") == bool(image.target)  # Target is a view of class
        assert sample["json"]["entity_id"] == phi.entity(image.patient_id)  # from the header's PatientID
        assert "path" not in sample["json"]
    assert all(image.patient_id not in json.dumps(s["json"]) for s in samples.values() for image in tree.images)
    # the unlabelled test images are not under this job's root; every train image is packed
    assert manifest["inputs"]["files"] == len(tree.images) and "excluded" not in manifest["inputs"]
    _no_entity_in_two_splits(result.version_dir)
    _audited(result.version_dir, given=None)
    assert {key: int(item["label"]) for key, item in _loaded(result).items()} == {
        key: order.index(image.klass) for key, image in expected.items()}


def test_the_rsna_recipes_window_keeps_every_8_bit_level_as_stored(tmp_path: Path) -> None:
    """The files are 8-bit with no window, and the recipe windows "the full 0-255 range". Its
    window was 127.5/256, which under the LINEAR formula (PS3.3 C.11.2.1.2) maps a stored s to
    s + 1/2, so rounding half to even kept the even levels and moved every odd one up (129 levels
    of 256; a walkthrough's replica). Read through the recipe's window, every level is itself."""
    from packer.read.dicom import read_dicom
    from tests.dicom_files import config, image_dataset, make_ref, save
    from tests.dicom_files import window as window_spec

    (window,) = _recipe("rsna-pneumonia")["transform"]["dicom"]["windows"]
    stored = np.arange(256, dtype=np.uint8).reshape(16, 16)
    path = save(image_dataset(stored, modality="CR"), tmp_path / "cr.dcm")
    (sample,) = read_dicom(make_ref(path), config(window_spec(float(window["center"]), float(window["width"]))))
    np.testing.assert_array_equal(sample.image[0], stored)


# -- the Medical Segmentation Decathlon, Task02_Heart ---------------------------------------------------------------


def test_decathlon_heart_packs_every_training_slice_with_its_label_map(tmp_path: Path) -> None:
    tree = _home(tmp_path, trees.write_decathlon, "decathlon-heart")
    result = _build(tmp_path, "decathlon-heart")
    _nothing_bad(result)  # the ._* files and the unlabelled imagesTs/ are not training records
    samples = _tar_samples(result.version_dir)
    per_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in samples.values():
        per_case[sample["json"]["path"]].append(sample)
    cases = {case.image: case for case in tree.training}
    assert sorted(per_case) == sorted(cases)
    for image, slices in per_case.items():
        case = cases[image]
        assert len(slices) == case.slices
        assert {s["json"]["entity_id"] for s in slices} == {case.case}
        assert {s["split_of_shard"] for s in slices} == {slices[0]["split_of_shard"]}  # a case never straddles
        # 320×320 in plane: nothing resized, so the label map's voxels are all there, ids 0 and 1
        masks = np.stack([s["mask.npy"] for s in slices])
        assert masks.shape == (case.slices, 1, 320, 320) and set(np.unique(masks).tolist()) <= {0, 1}
        assert int(masks.sum()) == case.foreground
        assert all(s["npy"].shape == (1, 320, 320) and s["npy"].dtype == np.float16 for s in slices)
    # the test images: each left out once, as not in dataset.json; the AppleDouble ._* files are
    # hidden files, which discovery never lists (so never reads as NIfTI)
    left_out = _every_file_once(result, tree.root, per_case, [c.image for c in (*tree.training, *tree.test)])
    assert left_out == {case.image: "not_in_table" for case in tree.test} and tree.apple_double
    _no_entity_in_two_splits(result.version_dir)
    _audited(result.version_dir, given=None)
    loaded = _loaded(result)
    assert sorted(loaded) == sorted(samples)
    assert all(np.array_equal(item["mask"].numpy(), samples[key]["mask.npy"]) for key, item in loaded.items())


def test_the_readme_brats_snippet_writes_the_case_table_a_nifti_source_packs(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """BraTS ships one folder per case and no table: the README's snippet, run as printed in the
    case folder, writes the table its nifti example reads (t1 the row's file, three more
    sequences as channels, _seg the mask), so no _seg file is packed as an image."""
    from tests.nifti_files import write_nifti

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    snippet = readme.split("cd data/brats && python - <<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    root = tmp_path / "brats"
    cases = ("BraTS20_Training_001", "BraTS20_Training_002")
    affine = np.diag([-1.0, -1.0, 1.0, 1.0])
    for n, case in enumerate(cases):
        for i, seq in enumerate(("t1", "t1ce", "t2", "flair")):
            write_nifti(_mkdir(root / case) / f"{case}_{seq}.nii.gz",
                        np.arange(8 * 8 * 2, dtype=np.int16).reshape(8, 8, 2) * (i + 1) + n, affine)
        write_nifti(root / case / f"{case}_seg.nii.gz", np.tile(np.array([0, 1, 2, 4], np.uint8), 32).reshape(8, 8, 2),
                    affine)
    monkeypatch.chdir(root)
    exec(compile(snippet, "README.md", "exec"), {})  # noqa: S102 - the README's own code, as a user runs it
    doc = {"name": "brats", "sources": [{"kind": "nifti", "root": str(root), "table": str(root / "cases.csv"),
                                         "label": "none", "channel_files": ["t1ce", "t2", "flair"],
                                         "mask": {"column": "seg", "classes": [0, 1, 2, 4]}}],
           "split": {"by": "entity"}, "transform": {"nifti": {"windows": ["zscore"], "output": "float16"}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert found.issues == [] and found.excluded == []
    assert sorted((r.relpath, r.entity) for r in found.refs) == [(f"{c}/{c}_t1.nii.gz", c) for c in cases]
    assert dict(found.refs[0].extra)["seg"] == f"{cases[0]}/{cases[0]}_seg.nii.gz"


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
