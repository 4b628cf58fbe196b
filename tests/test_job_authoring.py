"""A job's authoring mistakes are config errors at load that name the key and the fix, and what
a job may write means what the README says it means."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError

JOB = {
    "name": "t",
    "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
    "split": {"by": "entity", "seed": 3},
    "pack": {"format": "webdataset"},
    "output": "out",
}


def write_job(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    return path


def test_a_registry_url_is_refused_at_load_not_written_to_a_local_folder(tmp_path: Path) -> None:
    job = write_job(tmp_path, registry="s3://bucket/registry")
    with pytest.raises(ConfigError, match=r"registry: .*s3://bucket/registry.*local folder") as err:
        load_job(job)
    assert str(job) in str(err.value)
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("written", ["true", "True", "TRUE", "'true'"])
def test_where_true_keeps_the_cells_in_any_of_yamls_spellings_as_a_map_key_does(tmp_path: Path,
                                                                                   written: str) -> None:
    """pandas writes a bool column True/False: where: {finding: true} kept none of its rows."""
    doc = yaml.safe_dump(JOB) + ""
    path = tmp_path / "job.yaml"
    path.write_text(doc.replace("  table: raw/labels.csv\n",
                                f"  table: raw/labels.csv\n  where: {{finding: {written}}}\n"))
    (condition,) = load_job(path).sources[0].where
    assert [condition.holds([cell]) for cell in ("true", "True", "TRUE")] == [True, True, True]
    assert [condition.holds([cell]) for cell in ("false", "False", "tRuE", "yes", "1")] == [False] * 5


def test_where_false_and_a_list_of_booleans_match_every_spelling(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB).replace(
        "  table: raw/labels.csv\n", "  table: raw/labels.csv\n  where: {a: false, b: {not: [true]}}\n"))
    a, b = load_job(path).sources[0].where
    assert a.holds(["False"]) and a.holds(["FALSE"]) and not a.holds(["True"])
    assert not b.holds(["True"]) and b.holds(["False"]) and b.holds([])


def test_an_output_url_of_an_unknown_protocol_is_refused_at_load_naming_the_key(tmp_path: Path) -> None:
    """A root of the same protocol was refused at load; an output one passed validate and failed the build."""
    job = write_job(tmp_path, output="s4://bucket/datasets")
    with pytest.raises(ConfigError, match=r"output: s4://bucket/datasets: .*s4") as err:
        load_job(job)
    assert str(job) in str(err.value)


@pytest.mark.parametrize("output", ["labels.csv", "labels.csv/datasets"])
def test_an_output_where_a_file_stands_is_refused_at_load(tmp_path: Path, output: str) -> None:
    (tmp_path / "labels.csv").write_text("path,label\n")
    job = write_job(tmp_path, output=output)
    with pytest.raises(ConfigError, match=r"output: .*labels\.csv is a file, not a folder; point output at a folder"):
        load_job(job)
    assert (tmp_path / "labels.csv").read_text() == "path,label\n"


def test_an_output_url_of_a_known_protocol_still_loads_as_written(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    assert load_job(write_job(tmp_path, output="s3://bucket/datasets/")).output == "s3://bucket/datasets/"


@pytest.mark.parametrize(("written", "meant"), [("slices", "slice"), ("Volume", "volume"), ("volum", "volume")])
def test_a_misspelt_word_among_const_choices_gets_did_you_mean(tmp_path: Path, written: str, meant: str) -> None:
    """transform.nifti.sample is slice | volume | {...}, written as const branches: no suggestion came."""
    job = write_job(tmp_path, sources=[{"kind": "nifti", "root": "raw", "table": "raw/labels.csv"}],
                    transform={"nifti": {"sample": written}})
    with pytest.raises(ConfigError, match=rf"transform\.nifti\.sample.*did you mean '{meant}'\?"):
        load_job(job)


def test_a_mapping_job_reads_numpy_values_as_the_python_values_they_hold(tmp_path: Path) -> None:
    """Values computed in a notebook are numpy's: np.int64(8) was refused as 'not of type integer'."""
    np = pytest.importorskip("numpy")
    from packer.config import job_from_mapping

    plain = {**JOB, "pack": {"format": "webdataset", "max_samples": 8}, "labels": [0, 1],
             "split": {"by": "entity", "seed": 3, "ratios": {"train": 0.75, "test": 0.25}}}
    computed = {**JOB, "pack": {"format": "webdataset", "max_samples": np.int64(8)},
                "labels": np.array([0, 1]),
                "split": {"by": "entity", "seed": np.int32(3),
                          "ratios": {"train": np.float64(0.75), "test": np.float32(0.25)}}}
    job = job_from_mapping(computed, base_dir=tmp_path)
    assert job.pack.max_samples == 8 and type(job.pack.max_samples) is int
    assert job.labels == ("0", "1")
    assert job.identity() == job_from_mapping(plain, base_dir=tmp_path).identity()


def _samples(entities: int, per: int = 2) -> list:
    from packer.records import SampleRef, SpilledSample

    out = []
    for i in range(entities * per):
        ref = SampleRef(sample_id=f"s-{i:06d}", source="s", kind="image", path=f"/raw/{i}.png", relpath=f"{i}.png",
                        label="a", entity=f"p{i // per}", time=None)
        out.append(SpilledSample(key=ref.sample_id, ref=ref, spill="x", offset=0, pixel_bytes=1, meta_bytes=1,
                                 shape=(1, 1, 1), dtype="uint8", sha256=f"{i:064x}"))
    return out


def test_folds_left_empty_are_warned_of_and_fold_assignment_is_unchanged() -> None:
    """split.folds draws each group's fold from its own hash: 12 entities over 5 folds can leave
    one empty (seed 4), which the build said nothing about; a fold stays where its hash put it."""
    from packer.config import SplitConfig
    from packer.pipeline.split import assign_splits, entity_unit

    cfg = SplitConfig(by="entity", ratios=(("train", 1.0),), seed=4, folds=5)
    assignment = assign_splits(_samples(12), cfg)
    drawn = {f"s-{i:06d}": int(entity_unit(f"fold\x00p{i // 2}", 4) * 5) for i in range(24)}
    assert dict(assignment.fold.items()) == drawn
    empty = sorted(set(range(5)) - set(drawn.values()))
    assert empty, "seed 4 no longer leaves a fold empty: pick another seed for this test"
    (warning,) = [w for w in assignment.warnings if w.startswith("split.folds")]
    assert f"fold{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} of 5" in warning
    assert "no sample" in warning and "another split.seed" in warning


def test_more_folds_than_non_test_groups_is_warned_of_and_full_folds_are_not() -> None:
    from packer.config import SplitConfig
    from packer.pipeline.split import assign_splits

    few = assign_splits(_samples(3), SplitConfig(by="entity", ratios=(("train", 1.0),), seed=0, folds=5))
    (warning,) = [w for w in few.warnings if w.startswith("split.folds")]
    assert "3 non-test split groups cannot fill 5 folds" in warning and "use fewer folds" in warning
    many = assign_splits(_samples(300), SplitConfig(by="entity", ratios=(("train", 1.0),), seed=0, folds=5))
    assert not [w for w in many.warnings if w.startswith("split.folds")]


def test_a_transform_section_for_a_kind_no_source_has_is_warned_of_by_validate(tmp_path: Path) -> None:
    """A NIfTI-only job's transform.image: {size: [8, 8]} built at the volumes' own size without a
    word. A warning, not a config error: a job made from the demo by removing its CT source keeps
    transform.dicom, and should still build."""
    import numpy as np
    from click.testing import CliRunner

    from packer.cli import main
    from packer.config import unused_transforms_warning

    nib = pytest.importorskip("nibabel")
    (tmp_path / "raw").mkdir()
    rows = ["path,label,entity"]
    for i in range(4):
        volume = (np.random.default_rng(i).random((12, 10, 3)) * 1000).astype("int16")
        nib.save(nib.Nifti1Image(volume, np.eye(4)), str(tmp_path / "raw" / f"c{i}.nii.gz"))
        rows.append(f"c{i}.nii.gz,{'ab'[i % 2]},p{i}")
    (tmp_path / "raw" / "labels.csv").write_text("\n".join(rows) + "\n")
    job = write_job(tmp_path, sources=[{"kind": "nifti", "root": "raw", "table": "raw/labels.csv"}],
                    split={"by": "entity", "ratios": {"train": 1.0}},
                    transform={"image": {"size": [8, 8]}, "dicom": {}})  # an empty section sets nothing
    loaded = load_job(job)
    assert loaded.unused_transforms == ("image",)
    said = unused_transforms_warning(loaded)
    assert said is not None and said.startswith("transform.image: no source of this job is of that kind (its "
                                                 "sources are nifti), so its settings are ignored")
    assert "transform.nifti" in said and "remove transform.image" in said
    report_file = tmp_path / "validate.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--quick", "--json", str(report_file), "--scheduler",
                                       "sync", "-q"], env={"PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 0, result.output
    assert f"packer: warning: t: {said}" in result.output
    report = __import__("json").loads(report_file.read_text())
    assert [w["message"] for w in report["warnings"] if w["code"] == "transform"] == [said]


def test_transform_sections_for_the_jobs_kinds_are_not_warned_of(tmp_path: Path) -> None:
    from packer.config import unused_transforms_warning

    job = load_job(write_job(tmp_path, transform={"channels": 3, "image": {"size": [8, 8]}, "nifti": {}}))
    assert job.image.size == (8, 8) and job.unused_transforms == () and unused_transforms_warning(job) is None
