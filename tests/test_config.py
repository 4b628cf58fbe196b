"""The job file: schema-validated, defaults filled, errors that name the key path."""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path

import pytest
import yaml

from packer.config import (
    DicomTransformConfig,
    ImageTransformConfig,
    JobConfig,
    LimitsConfig,
    PackConfig,
    SeriesConfig,
    SplitConfig,
    load_job,
    parse_byte_size,
)
from packer.errors import ConfigError
from packer.schemas import schema_defaults

REPO = Path(__file__).resolve().parent.parent

MINIMAL = {
    "name": "t",
    "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
    "split": {"by": "entity", "seed": 3},
    "pack": {"format": "webdataset"},
    "output": "out",
}


def write_job(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_demo_job_loads_with_presets_resolved() -> None:
    job = load_job(REPO / "workflows" / "demo.yaml")
    assert job.name == "demo"
    assert [w.name for w in job.dicom.windows] == ["lung", "mediastinum", "bone_body"]
    assert job.dicom.channels == job.image.channels == 3  # transform.channels: one shape for the whole demo
    assert job.dicom.windows[0].center == -600 and job.dicom.windows[0].width == 1500
    assert job.pack.max_bytes == 64 * 2**20
    assert job.sources[0].root == (REPO / "demo-raw" / "ct").resolve()
    assert job.sources[0].name == "ct" and job.sources[1].name == "photos"


def test_minimal_job_gets_defaults(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, MINIMAL))
    assert dict(job.split.ratios) == {"train": 0.8, "valid": 0.1, "test": 0.1}
    assert job.pack.max_samples == 1000 and job.pack.max_bytes == 256 * 2**20
    assert job.max_bad_fraction == 0.05
    assert job.output == (tmp_path / "out").resolve()
    assert job.sources[0].entity == "entity" and job.sources[0].time == ("timestamp",)


@pytest.mark.parametrize(("split", "enabled", "on"), [
    ({"by": "entity", "ratios": {"train": 1.0}}, "auto", False),
    ({"by": "entity", "ratios": {"train": 0.9, "valid": 0.1}}, "auto", True),
    ({"by": "entity", "ratios": {"train": 1.0}, "folds": 5}, "auto", True),
    ({"by": "entity", "ratios": {"train": 1.0}, "pinned": "pinned.csv"}, "auto", True),
    ({"by": "time", "cutoffs": {"test": "2024-01-01"}}, "auto", True),
    ({"by": "entity", "ratios": {"train": 1.0}}, True, True),
    ({"by": "entity", "ratios": {"train": 0.8, "test": 0.2}}, False, False),
])
def test_near_copies_auto_runs_only_where_samples_can_land_in_two_splits(tmp_path: Path, split: dict,
                                                                          enabled: object, on: bool) -> None:
    """``near_duplicates.enabled: auto`` (the default) is off for a one-split job only: there no copy
    can leak, and the identity (config hash) records what was decided, not the word auto."""
    (tmp_path / "pinned.csv").write_text("entity,split\n")
    job = load_job(write_job(tmp_path, {**MINIMAL, "split": {**split, "near_duplicates": {"enabled": enabled}},
                                        "sources": [{"kind": "dicom", "root": "raw"}], "phi": {"mode": "keep"}}))
    assert job.split.near_enabled is on and job.split.near_auto is (enabled == "auto")
    assert job.identity()["split"]["near_duplicates"]["enabled"] is on


def _at(doc: dict, path: str) -> object:
    for part in path.split("."):
        doc = doc[part]
    return doc


@pytest.mark.parametrize("split", [{"by": "entity"}, {"by": "time", "cutoffs": {"valid": "2024-01-01"}}])
def test_every_default_the_schema_declares_is_what_a_minimal_job_gets(tmp_path: Path, split: dict) -> None:
    """The schema is the one place defaults are written: a job that sets nothing gets each of them."""
    job = load_job(write_job(tmp_path, {**MINIMAL, "split": split,
                                        "sources": [{"kind": "dicom", "root": "raw"}], "phi": {"mode": "keep"}}))
    identity = job.identity()
    normalise = {"pack.max_bytes": parse_byte_size, "limits.max_decoded_bytes": parse_byte_size,
                 "transform.dicom.windows": lambda names: [{"file": 0} for _ in names],
                 # auto is recorded resolved: both splits here (80/10/10, a time split) put samples in several
                 "split.near_duplicates.enabled": lambda v: True if v == "auto" else v}
    checked = 0
    for path, default in schema_defaults("job").items():
        if path == "split.entity_policy" and split["by"] != "time":
            continue  # only a time split has (and records) an entity policy
        if path in ("split.match", "split.accept_leaks"):
            continue  # only a given split (by: list or column) has (and records) them: checked below
        if path == "split.ratios" and split["by"] == "time":
            assert "ratios" not in identity["split"]  # the dates decide; ratios are refused under by: time
            continue
        if path.startswith("transform.dicom.series.") or path == "limits.max_voxels":
            continue  # only series samples assemble (and record) series; checked below; max_voxels when set
        if path.startswith("transform.nifti."):
            continue  # recorded only where a source is NIfTI: checked below
        if path == "pack.order":  # in the identity when set (older hashes kept)
            assert job.pack.order == default == PackConfig(format="webdataset").order
            assert "order" not in identity["pack"]
            continue
        if path == "split.near_duplicates.max_ratio":  # in the identity when set (older hashes kept): checked below
            assert job.split.near_max_ratio == default and SplitConfig(by="entity", ratios=(), seed=0).near_max_ratio \
                == default
            assert "max_ratio" not in identity["split"]["near_duplicates"]
            continue
        if path.startswith("split.duplicates."):
            # the mode is recorded as split.duplicates; the label-conflict settings only where the job
            # changes them (so every older job keeps its hash)
            field = {"mode": "duplicates"}.get(path.rsplit(".", 1)[1], path.rsplit(".", 1)[1])
            assert getattr(job.split, field) == default == getattr(SplitConfig(by="entity", ratios=(), seed=0), field)
            assert "label_conflicts" not in identity["split"]
            continue
        want = normalise.get(path, lambda v: v)(default)
        assert _at(identity, path) == want, path
        checked += 1
    assert checked >= 25
    # the dataclasses' own defaults (configs built in code) agree too
    built = JobConfig(name="t", sources=(), split=SplitConfig(by="entity", ratios=job.split.ratios, seed=0),
                      transforms=(("dicom", DicomTransformConfig(windows=job.dicom.windows)),
                                  ("image", ImageTransformConfig())), recorded=("dicom", "image"),
                      pack=PackConfig(format="webdataset"), output=Path("out")).identity()
    for path, default in schema_defaults("job").items():
        if path not in ("split.entity_policy", "split.ratios", "split.match", "split.accept_leaks",
                        "transform.dicom.windows", "pack.max_bytes", "limits.max_decoded_bytes", "limits.max_voxels",
                        "split.near_duplicates.max_ratio", "split.near_duplicates.enabled", "pack.order",
                        ) and not path.startswith(
                            ("transform.dicom.series.", "transform.nifti.", "split.duplicates.")):
            assert _at(built, path) == default, path
    nifti = load_job(write_job(tmp_path, {**MINIMAL, "split": {"by": "entity"}, "sources": [
        {"kind": "nifti", "root": "raw", "label": "none"}]})).identity()
    assert "nifti" not in identity["transform"]  # a job without NIfTI sources keeps its config hash
    nifti_defaults = {p: d for p, d in schema_defaults("job").items() if p.startswith("transform.nifti.")}
    assert len(nifti_defaults) >= 4
    for path, default in nifti_defaults.items():
        if path == "transform.nifti.non_finite":  # in the identity when set (older hashes kept)
            assert default == "bad" and "non_finite" not in nifti["transform"]["nifti"]
            continue
        want = ([{"percentiles": d["percentiles"], "over": "all"} for d in default]
                if path == "transform.nifti.windows" else default)
        assert _at(nifti, path) == want, path
    assert built["pack"]["max_bytes"] == parse_byte_size(schema_defaults("job")["pack.max_bytes"])
    assert built["limits"]["max_decoded_bytes"] == parse_byte_size(schema_defaults("job")["limits.max_decoded_bytes"])
    stacked = load_job(write_job(tmp_path, {**MINIMAL, "split": split, "sources": [{"kind": "dicom", "root": "raw"}],
                                            "phi": {"mode": "keep"},
                                            "transform": {"dicom": {"sample": {"neighbors": 1}}}})).identity()
    series_defaults = {p: d for p, d in schema_defaults("job").items() if p.startswith("transform.dicom.series.")}
    assert len(series_defaults) == 3 and all(_at(stacked, p) == d for p, d in series_defaults.items())
    assert SeriesConfig().to_json() == {p.rsplit(".", 1)[1]: d for p, d in series_defaults.items()}
    assert LimitsConfig().max_voxels == schema_defaults("job")["limits.max_voxels"]  # recorded only when set
    (tmp_path / "train.txt").write_text("a.png\n")
    given = load_job(write_job(tmp_path, {**MINIMAL, "split": {"by": "list", "lists": {"train": "train.txt"}}}))
    for path in ("split.match", "split.accept_leaks"):  # a given split records them
        assert _at(given.identity(), path) == schema_defaults("job")[path], path
    assert (SplitConfig(by="list", ratios=(), seed=0).match, SplitConfig(by="list", ratios=(), seed=0).accept_leaks) \
        == (schema_defaults("job")["split.match"], schema_defaults("job")["split.accept_leaks"])


def test_identity_excludes_output_and_keeps_paths_as_written(tmp_path: Path) -> None:
    a = load_job(write_job(tmp_path, MINIMAL))
    other = dict(MINIMAL, output="elsewhere")
    (tmp_path / "b").mkdir()
    b = load_job(write_job(tmp_path / "b", other))
    assert a.identity() == b.identity()
    assert a.identity()["sources"][0]["root"] == "raw"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"pack": {"format": "zip"}}, "pack.format"),
        ({"split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.1}}}, "add up to 1"),
        ({"split": {"by": "time"}}, "split.cutoffs"),
        ({"split": {"by": "time", "cutoffs": {"valid": "2024-13-01"}}}, "split.cutoffs.valid"),
        # settings the chosen split would ignore without a word: cutoffs under by: entity let records
        # after the cutoff land in train
        ({"split": {"by": "entity", "cutoffs": {"test": "2024-07-01"}}},
         "split.cutoffs: only meaningful with 'by: time'"),
        ({"split": {"by": "time", "cutoffs": {"test": "2024-07-01"}, "ratios": {"train": 0.8, "test": 0.2}}},
         "split.ratios: a split by time puts each entity in the split its first record's date falls in"),
        ({"split": {"by": "time", "cutoffs": {"test": "2024-07-01"}, "stratify": "label"}}, "split.stratify: a split "),
        ({"sources": [{"kind": "image", "root": "raw"}]}, "sources[0].table"),
        ({"sources": [{"kind": "dicom", "root": "raw", "table": "x.csv"}]}, "sources[0].table"),
        ({"transform": {"dicom": {"windows": ["lungs"]}}}, "unknown window preset 'lungs' (did you mean 'lung'?)"),
        ({"transform": {"dicom": {"windows": ["lung", {"center": 40}]}}},
         "transform.dicom.windows[1]: {'center': 40} is not valid under any of the given schemas (it lacks 'width': "
         "{center, width} is one form)"),
        ({"phi": "pseudonymize"}, "phi: 'pseudonymize' is not of type 'object' (did you mean {mode: pseudonymize}?)"),
        ({"transform": {"dicom": {"windows": [{"center": 40, "width": 0.5}]}}}, "width"),
        ({"unknown_key": 1}, "unknown_key"),
        ({"pack": {"format": "parquet", "max_bytes": "lots"}}, "pack.max_bytes"),
        ({"transform": {"dicom": {"modality_windows": {"CR": ["lungs"]}}}},
         "transform.dicom.modality_windows.CR[0]: unknown window preset 'lungs'"),
        ({"transform": {"dicom": {"modality_windows": {"cr": ["file"], "CR": ["lung"]}}}}, "given twice"),
        ({"transform": {"dicom": {"modality_windows": {"CR": []}}}}, "modality_windows"),
        ({"transform": {"dicom": {"modality_windows": {"C/R": ["file"]}}}}, "modality_windows"),
    ],
)
def test_bad_jobs_name_the_key(tmp_path: Path, change: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(write_job(tmp_path, {**MINIMAL, **change}))
    assert expected in str(info.value)


@pytest.mark.parametrize("template", [
    "{path.__format__.__globals__[os].environ[SECRET_TOKEN]}",  # would read the process environment
    "{path.nosuchattr}",
    "{path[0]}.png",
    "{path:{entity.__class__}}",  # a nested field in the spec is evaluated too
])
def test_a_path_template_field_is_a_plain_column_and_attribute_or_index_access_is_refused_at_load(
        tmp_path: Path, template: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "AKIA_TOPSECRET_123")
    source = {"kind": "image", "root": "raw", "table": {"file": "raw/labels.csv", "path": {"template": template}}}
    with pytest.raises(ConfigError) as info:
        load_job(write_job(tmp_path, {**MINIMAL, "sources": [source]}))
    message = str(info.value)
    assert "sources[0].table.path.template" in message and "is not a column name" in message
    assert "AKIA_TOPSECRET_123" not in message


def test_a_path_template_keeps_conversions_and_literal_format_specs(tmp_path: Path) -> None:
    template = "files/p{subject_id:.2}/{study_id!s}/{dicom_id:>05}.jpg"
    source = {"kind": "image", "root": "raw", "table": {"file": "raw/labels.csv", "path": {"template": template}}}
    job = load_job(write_job(tmp_path, {**MINIMAL, "sources": [source]}))
    assert job.sources[0].table_map is not None and job.sources[0].table_map.template == template


@pytest.mark.parametrize(("change", "expected"), [
    ({"pack": None}, "pack: null is not of type 'object'"),
    ({"split": {"by": "entity", "seed": True}}, "split.seed: true is not of type 'integer'"),
    ({"splt": 1, "output": None}, "also output: null is not of type 'string'"),  # listed after an unknown key
])
def test_a_null_or_boolean_value_is_named_as_the_job_writes_it_not_as_python_does(
        tmp_path: Path, change: dict, expected: str) -> None:
    """`pack: null` was reported as "None is not of type 'object'": Python's word, not YAML's."""
    with pytest.raises(ConfigError) as info:
        load_job(write_job(tmp_path, {**MINIMAL, **change}))
    assert expected in str(info.value) and "None" not in str(info.value) and "True" not in str(info.value)


@pytest.mark.parametrize("kind", ["image", "dicom", "nifti"])
def test_a_resize_policy_without_a_size_is_a_config_error_naming_the_size_to_add(tmp_path: Path, kind: str) -> None:
    """`resize: crop` says how an image reaches `size`; without a size nothing is resized, and the
    policy was accepted and ignored (samples kept their own size) without a word."""
    with pytest.raises(ConfigError) as info:
        load_job(write_job(tmp_path, {**MINIMAL, "transform": {kind: {"resize": "crop"}}}))
    assert str(info.value) == (f"{tmp_path / 'job.yaml'}: transform.{kind}.resize: acts only with 'size' beside it, "
                               f"which is not given, so it would be ignored; add transform.{kind}.size, or remove "
                               "resize")
    job = load_job(write_job(tmp_path, {**MINIMAL, "transform": {kind: {"resize": "crop", "size": [32, 32]}}}))
    assert job.settings(kind).resize == "crop"
    assert str(info.value).startswith(str(tmp_path / "job.yaml"))


@pytest.mark.parametrize("pinned", ["nope.csv", "raw"])
def test_a_pinned_table_that_cannot_be_read_is_refused_at_load_naming_the_job_and_the_key(tmp_path: Path,
                                                                                        pinned: str) -> None:
    """The split stage read it after listing and decoding every file, and its error named
    neither the job file nor split.pinned, as every other path's error does."""
    (tmp_path / "raw").mkdir()
    job = write_job(tmp_path, {**MINIMAL, "split": {"by": "entity", "pinned": pinned}})
    with pytest.raises(ConfigError) as info:
        load_job(job)
    assert str(info.value).startswith(f"{job}: split.pinned: cannot read {tmp_path / pinned} (")
    assert f"{pinned!r} is relative to the job file" in str(info.value)
    (tmp_path / "pins.csv").write_text("entity,split\nP1,test\n")
    assert load_job(write_job(tmp_path, {**MINIMAL, "split": {"by": "entity", "pinned": "pins.csv"}})).split.pinned \
        == tmp_path / "pins.csv"


@pytest.mark.parametrize("registry", ["labels.csv", "labels.csv/more", "reg"])
def test_a_registry_where_a_file_stands_is_refused_at_load_naming_the_job_and_the_key(tmp_path: Path,
                                                                                      registry: str) -> None:
    """registry: labels.csv (a typo) passed validate; the build did all its work, published the
    version and then failed naming neither the job nor registry, and said to remove the file,
    the user's own label table."""
    (tmp_path / "labels.csv").write_text("path,label\n")
    (tmp_path / "reg").mkdir()
    (tmp_path / "reg" / "t").write_text("not a folder")  # where <registry>/<name>/ must be
    job = write_job(tmp_path, {**MINIMAL, "registry": registry})
    with pytest.raises(ConfigError) as info:
        load_job(job)
    blocker = tmp_path / ("reg/t" if registry == "reg" else "labels.csv")
    assert str(info.value).startswith(f"{job}: registry: {tmp_path / registry} cannot hold the manifest copies")
    assert f"{blocker} is a file, not a folder; point registry at a folder" in str(info.value)
    assert "remove" not in str(info.value)
    assert load_job(write_job(tmp_path, {**MINIMAL, "registry": "new/reg"})).registry == tmp_path / "new" / "reg"


def test_a_billion_laughs_job_file_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    """Nine levels of nine aliases (649 bytes) took 7.7 GB before the unknown-key check ran; the
    document's expanded size is counted on its composed nodes, nothing expanded. Anchors and
    aliases of an ordinary size still read."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"bomb.yaml: the job file expands to more than 1,000,000 values"):
        load_job(bomb)
    shared = tmp_path / "shared.yaml"
    shared.write_text("x_windows: &w [lung, mediastinum]\nname: n\n")
    with pytest.raises(ConfigError, match="x_windows: unknown key"):  # read, then checked as any job
        load_job(shared)


def test_a_job_nested_past_the_yaml_readers_depth_is_a_config_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("labels: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="deep.yaml: mappings or lists nested deeper than a YAML reader can follow"):
        load_job(deep)


def test_unquoted_yaml_dates_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "split": {"by": "time"}}).replace(
        "split:\n  by: time", "split:\n  by: time\n  cutoffs: {valid: 2024-01-01, test: 2024-07-01}"))
    job = load_job(path)
    assert dict(job.split.cutoffs) == {"valid": "2024-01-01", "test": "2024-07-01"}


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_job(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML") as caught:
        load_job(bad)
    assert f'in "{bad}", line 1' in str(caught.value) and "<unicode string>" not in str(caught.value)


def test_a_key_written_twice_is_an_error_naming_both_lines_and_a_merge_may_still_override(tmp_path: Path) -> None:
    """PyYAML kept the last of two equal keys silently: a second `ratios:` (or `output:`)
    replaced the first unseen. YAML 1.2 requires unique keys; a merged key may be overridden."""
    text = yaml.safe_dump({**MINIMAL, "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}}})
    job = tmp_path / "job.yaml"
    job.write_text(text.replace("  ratios:", "  ratios: {train: 1.0}\n  ratios:"))
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    said = str(caught.value)
    assert said.startswith(f"{job}: not valid YAML") and "found the key 'ratios' a second time (first on line" in said
    assert f'in "{job}"' in said
    merged = tmp_path / "merged.yaml"
    merged.write_text(text.replace("split:\n", "split:\n  <<: &s {by: time}\n"))
    assert load_job(merged).split.by == "entity"  # the explicit key overrides the merged one


def test_keys_python_calls_equal_are_different_yaml_keys_and_each_keeps_its_cell(tmp_path: Path) -> None:
    """The duplicate-key check kept keys in a Python dict, where True == 1 == 1.0: a label map of
    a column spelled both ways, {true: positive, 1: positive}, was refused as 'found the key 1 a
    second time'. YAML's true, 1 and 1.0 are three keys; each is the cell text it was written as."""
    text = yaml.safe_dump(MINIMAL).replace(
        "table: raw/labels.csv", "table: raw/labels.csv\n  label: {column: finding, map: {true: positive, 1: positive, "
        "false: negative, 0: negative, 1.0: positive, 0.0: negative}}")
    job = tmp_path / "job.yaml"
    job.write_text(text)
    value_map = dict(load_job(job).sources[0].target.value_map)
    assert {cell: value_map[cell] for cell in ("true", "TRUE", "1", "1.0", "false", "0", "0.0")} == {
        "true": "positive", "TRUE": "positive", "1": "positive", "1.0": "positive",
        "false": "negative", "0": "negative", "0.0": "negative"}
    job.write_text(text.replace("1.0: positive", "true: positive"))
    with pytest.raises(ConfigError, match="found the key True a second time"):  # a real repeat still is one
        load_job(job)


@pytest.mark.parametrize(("block", "key", "written"), [
    ("split:\n  by: column\n  column: fold\n  map:\n    1: train\n    2: valid\n    '1': test\n", "'1'", "1"),
    ("split: {by: entity}\nsources:\n  - kind: image\n    root: raw\n    table: raw/labels.csv\n"
     "    label:\n      column: grade\n      map:\n        0: healthy\n        1: sick\n        '0': sick\n",
     "'0'", "0"),
    ("split:\n  by: entity\n  ratios:\n    train: 0.9\n    'true': 0.1\n    true: 0.0\n", "'true'", "'true'"),
])
def test_two_keys_of_one_mapping_that_are_the_same_text_are_an_error_naming_both_lines(
        tmp_path: Path, block: str, key: str, written: str) -> None:
    """A map: key is a cell's text, so `1: train` and `'1': test` name one cell; each became the
    text '1' and one silently replaced the other (train then had no sample)."""
    rest = {name: value for name, value in MINIMAL.items() if f"{name}:" not in block}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(rest) + block)
    lines = job.read_text().splitlines()
    spellings = (f"{key}:", key.strip("'") + ":")  # quoted and plain: the two lines of the one key
    first, second = (number for number, line in enumerate(lines, 1) if line.strip().startswith(spellings))
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    said = str(caught.value)
    assert said.startswith(f"{job}: not valid YAML")
    assert f"found the key {key} a second time (first on line {first}, written {written}, here" in said
    assert f'in "{job}", line {second}' in said


def test_a_job_file_that_is_not_utf8_text_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    # a binary file or a Latin-1 export given as the job raised UnicodeDecodeError: exit 1 with a traceback
    job = tmp_path / "job.yaml"
    job.write_bytes(b"name: caf\xe9\nsources: []\n")
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    said = str(caught.value)
    assert said.startswith(f"{job}: not UTF-8 text") and "line 1" in said and "save it as UTF-8" in said


def test_every_problem_of_a_job_file_is_listed_and_a_bad_value_gets_its_description(tmp_path: Path) -> None:
    """One run shows what to fix: the first problem, then each further one on its own line."""
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nsources: []\n")
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    first, *also = str(caught.value).splitlines()
    assert first == f"{job}: (top level): 'output' is a required property"
    assert also == ["  also (top level): 'pack' is a required property",
                    "  also (top level): 'split' is a required property", "  also sources: [] should be non-empty"]
    job.write_text(yaml.safe_dump({"name": "x", "sources": [{"kind": "image", "root": "a", "table": "t.csv"}],
                                   "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "o",
                                   "transform": {"image": {"size": [64]}}}))
    with pytest.raises(ConfigError, match=r"transform.image.size: \[64\] is too short. Target \[height, width\] "
                                          r"in pixels.$"):
        load_job(job)


@pytest.mark.parametrize(("text", "value"), [("256MiB", 256 * 2**20), ("1GB", 10**9), ("512", 512),
                                            ("1.5KiB", 1536), (42, 42)])
def test_byte_sizes(text: str | int, value: int) -> None:
    assert parse_byte_size(text) == value


@pytest.mark.parametrize(("text", "value"), [("2.01KB", 2010), ("4.02KB", 4020), ("8.04MB", 8_040_000),
                                            ("0.1KiB", 102), ("1.5B", 2), ("1.25B", 1)])
def test_decimal_byte_sizes_are_read_exactly_and_a_fraction_of_a_byte_rounds_half_up(
        tmp_path: Path, text: str, value: int) -> None:
    """"2.01KB" was 2009 bytes: float 2.01 * 1000 is 2009.999..., which int() truncated."""
    assert parse_byte_size(text) == value
    job = load_job(write_job(tmp_path, {**MINIMAL, "pack": {"format": "webdataset", "max_bytes": text}}))
    assert job.pack.max_bytes == value


def test_source_urls_stay_as_written_and_file_urls_become_paths(tmp_path: Path) -> None:
    doc = {**MINIMAL, "sources": [
        {"kind": "image", "root": "s3://bucket/raw/photos/", "table": "s3://bucket/raw/photos.csv"},
        {"kind": "dicom", "root": f"file://{tmp_path}/ct", "labels": f"file://{tmp_path}/ct.csv"},
    ]}
    job = load_job(write_job(tmp_path, doc))
    photos, ct = job.sources
    assert (photos.name, photos.root, photos.table) == ("photos", "s3://bucket/raw/photos", "s3://bucket/raw/photos.csv")
    assert (ct.name, ct.root, ct.labels) == ("ct", tmp_path / "ct", tmp_path / "ct.csv")
    identity = job.identity()["sources"]  # the dataset's identity records the job as written
    assert identity[0]["root"] == "s3://bucket/raw/photos/" and identity[1]["root"] == f"file://{tmp_path}/ct"


@pytest.mark.parametrize(("field", "url", "match"), [
    ("root", "nosuchproto://bucket/raw",
     r"sources\[0\]\.root: nosuchproto://bucket/raw: Protocol not known.*use a local path, file://, s3://"),
    ("table", "file://otherhost/raw/labels.csv", r"sources\[0\]\.table: file://otherhost/.*file:///abs/path"),
])
def test_a_source_url_that_cannot_be_opened_is_a_config_error_naming_the_field(tmp_path: Path, field: str,
                                                                               url: str, match: str) -> None:
    doc = {**MINIMAL, "sources": [{**MINIMAL["sources"][0], field: url}]}
    with pytest.raises(ConfigError, match=match):
        load_job(write_job(tmp_path, doc))


def test_a_source_url_whose_package_is_missing_says_what_to_install(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here: gs:// URLs open")
    doc = {**MINIMAL, "sources": [{**MINIMAL["sources"][0], "root": "gs://bucket/raw"}]}
    with pytest.raises(ConfigError, match=r"sources\[0\]\.root: gs://bucket/raw: gs:// URLs need gcsfs, which is not "
                                          r"installed; pip install gcsfs"):
        load_job(write_job(tmp_path, doc))


def test_modality_windows_pick_windows_by_the_files_modality(tmp_path: Path) -> None:
    by_modality = {"cr": ["file"], "MR": [{"center": 300, "width": 600}]}
    doc = {**MINIMAL, "transform": {"dicom": {"windows": ["lung", "mediastinum"], "modality_windows": by_modality}}}
    job = load_job(write_job(tmp_path, doc))
    assert [w.name for w in job.dicom.windows_for("CT")] == ["lung", "mediastinum"]
    assert [w.name for w in job.dicom.windows_for(None)] == ["lung", "mediastinum"]
    assert [w.kind for w in job.dicom.windows_for("CR ")] == ["file"]  # keys and values compared upper case
    assert [(w.center, w.width) for w in job.dicom.windows_for("mr")] == [(300, 600)]
    assert job.identity()["transform"]["dicom"]["modality_windows"] == {
        "CR": [{"file": 0}], "MR": [{"name": "c300w600", "center": 300.0, "width": 600.0, "function": "LINEAR"}]}


def test_a_job_without_modality_windows_keeps_its_identity(tmp_path: Path) -> None:
    """The key appears in the identity only when set: older jobs keep their config_hash."""
    job = load_job(write_job(tmp_path, {**MINIMAL, "transform": {"dicom": {"windows": ["lung"]}}}))
    assert "modality_windows" not in job.identity()["transform"]["dicom"]


@pytest.mark.parametrize("tile", [[40, 16], [16, 40], [40, 40]])
def test_a_tile_larger_than_the_resized_image_is_a_config_error_before_any_work(tmp_path: Path, tile) -> None:
    """With transform.image.size fixed, every image is resized to it, so a tile taller or wider
    than that size fits no image: the job file's error (exit 2, naming both keys), not every
    file decoded and then a bad sample (exit 3)."""
    image = {"size": [32, 32], "tile": {"size": tile}}
    with pytest.raises(ConfigError, match=r"transform\.image\.tile\.size.*transform\.image\.size"):
        load_job(write_job(tmp_path, {**MINIMAL, "transform": {"image": image}}))
    fits = {"size": [32, 32], "tile": {"size": [32, 16]}}
    ok = load_job(write_job(tmp_path, {**MINIMAL, "transform": {"image": fits}}))
    assert ok.image.tile_size == (32, 16)


@pytest.mark.parametrize(("written", "read"), [("010", 10), ("0o10", 8), ("0x10", 16), ("1:30", "1:30"), ("1_0", "1_0"),
                                               ("1e3", 1000.0), ("0.5", 0.5), ("2024-01-01", date(2024, 1, 1)),
                                               ("2024-13-45", "2024-13-45")])
def test_job_numbers_are_read_as_yaml_1_2_writes_them(written: str, read: object) -> None:
    """PyYAML reads numbers the YAML 1.1 way: seed: 010 became octal 8 (recorded so in the
    manifest), 1:30 base-60 90 and 1_0 ten, while YAML 1.2's own octal 0o10 was refused."""
    from packer.config import JobLoader

    value = yaml.load(f"v: {written}", Loader=JobLoader)["v"]  # noqa: S506 (a SafeLoader)
    assert value == read and type(value) is type(read)


def test_labels_may_list_integer_class_ids_as_numbers(tmp_path: Path) -> None:
    """A Kaggle grade table (0-4) missing grade 3 re-indexes grade 4 as 3 unless the job lists the
    ids; `labels: [0, 1, 2, 3, 4]`, as anyone writes it, was refused (4 is not of type 'string')."""
    from packer.config import parse_job

    doc = {"name": "j", "sources": [{"kind": "image", "root": ".", "table": "t.csv"}], "split": {"by": "entity"},
           "pack": {"format": "webdataset"}, "output": "out"}
    assert parse_job({**doc, "labels": [0, 1, 2, 3, 4]}, tmp_path / "job.yaml").labels == ("0", "1", "2", "3", "4")
    with pytest.raises(ConfigError, match="labels: '1' is listed twice"):
        parse_job({**doc, "labels": [0, 1, "1"]}, tmp_path / "job.yaml")


def test_a_class_map_may_name_integer_class_ids_as_numbers_and_builds_as_quoted(tmp_path: Path) -> None:
    """Referable diabetic retinopathy (grade >= 2), written as anyone writes it: map: {0: 0, 1: 0,
    2: 1, 3: 1, 4: 1} with labels: [0, 1]. labels: takes the ids as numbers, yet the map's numeric
    values were refused with jsonschema's bare "0 is not valid under any of the given schemas".
    A number there is its text, as in labels:, and builds the very bytes the quoted map builds."""
    import cv2
    import numpy as np

    from packer.pipeline.build import BuildOptions, build

    (tmp_path / "raw").mkdir()
    rows = ["image,level"]
    for p in range(1, 7):
        for k, eye in enumerate(["left", "right"]):
            pixels = np.random.default_rng(2 * p + k).integers(0, 256, (16, 16, 3), dtype=np.uint8)
            cv2.imwrite(str(tmp_path / "raw" / f"{p}_{eye}.png"), pixels)
            rows.append(f"{p}_{eye},{(p + k) % 5}")
    (tmp_path / "raw" / "t.csv").write_text("\n".join(rows) + "\n")

    def built(value_map: dict[int, object], out: str) -> tuple[str, dict[str, bytes]]:
        doc = {"name": "dr", "sources": [{"kind": "image", "root": "raw",
                                          "table": {"file": "raw/t.csv", "path": {"template": "{image}.png"}},
                                          "entity": {"path": "^(?P<entity>\\d+)_"},
                                          "label": {"column": "level", "map": value_map}}],
               "labels": [0, 1], "split": {"by": "entity", "seed": 3, "balance": {"accept": True}},
               "pack": {"format": "webdataset"}, "output": out}
        job = tmp_path / f"{out}.yaml"
        job.write_text(yaml.safe_dump(doc, sort_keys=False))
        result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
        shards = {p.name: p.read_bytes() for p in sorted(result.version_dir.rglob("*.tar"))}
        return result.version_dir.name, shards

    as_numbers = built({0: 0, 1: 0, 2: 1, 3: 1, 4: 1}, "numbers")
    as_text = built({0: "0", 1: "0", 2: "1", 3: "1", 4: "1"}, "text")
    assert as_numbers == as_text and as_numbers[1]


def test_whole_numbers_written_as_decimals_are_read_as_the_integers_the_schema_wants(tmp_path: Path) -> None:
    """JSON Schema's integer is any whole number, so folds: 5.0 passed the schema and crashed the
    splitter (TypeError, exit 1), windows: [{file: 0.0}] made every file an unexpected_error and
    labels: [0.0, 1.0] the classes '0.0'/'1.0' that no 0/1 table cell matches."""
    doc = {**MINIMAL, "split": {"by": "entity", "folds": 5.0}, "labels": [0.0, 1.0, "x"],
           "pack": {"format": "webdataset", "max_samples": 10.0, "max_bytes": 2048.0},
           "transform": {"dicom": {"windows": [{"file": 1.0}], "size": [64.0, 32.0]}}}
    job = load_job(write_job(tmp_path, doc))
    assert job.split.folds == 5 and type(job.split.folds) is int
    assert job.labels == ("0", "1", "x")
    assert job.pack.max_samples == 10 and job.pack.max_bytes == 2048 and type(job.pack.max_bytes) is int
    assert job.dicom.windows[0].selector == 1 and type(job.dicom.windows[0].selector) is int
    assert job.dicom.size == (64, 32)
    assert load_job(write_job(tmp_path, {**MINIMAL, "validate": {"max_bad_fraction": 1.0}})).max_bad_fraction == 1.0
    with pytest.raises(ConfigError, match=r"split\.folds: 2\.5 is not of type 'integer'"):
        load_job(write_job(tmp_path, {**MINIMAL, "split": {"by": "entity", "folds": 2.5}}))


@pytest.mark.parametrize("size", ["0", "0MiB", "0.0 KiB", "0.1B"])
def test_a_byte_size_of_zero_written_as_text_is_refused_as_the_integer_zero_is(tmp_path: Path, size: str) -> None:
    """max_bytes: 0 was refused (minimum 1) while max_bytes: "0" packed with a limit of no byte."""
    with pytest.raises(ConfigError, match=r"pack\.max_bytes"):
        load_job(write_job(tmp_path, {**MINIMAL, "pack": {"format": "webdataset", "max_bytes": size}}))
    with pytest.raises(ConfigError, match=r"pack\.max_bytes"):
        load_job(write_job(tmp_path, {**MINIMAL, "pack": {"format": "webdataset", "max_bytes": 0}}))


@pytest.mark.parametrize(("key", "value"), [("validate", {"max_bad_fraction": math.nan}),
                                            ("split", {"by": "entity", "ratios": {"train": math.nan, "valid": 0.2}}),
                                            ("pack", {"format": "webdataset", "max_samples": math.inf})])
def test_nan_and_infinity_in_a_job_are_refused_naming_the_key(tmp_path: Path, key: str, value: dict) -> None:
    """YAML's .nan passes every minimum and maximum of the schema (each comparison is False):
    max_bad_fraction: .nan validated a job with 75% bad files clean, a .nan ratio split at random."""
    job = write_job(tmp_path, {**MINIMAL, key: value})
    assert ".nan" in job.read_text() or ".inf" in job.read_text()
    with pytest.raises(ConfigError, match=rf"{key}\..*(nan|inf) is not a finite number.*give a finite number"):
        load_job(job)


def test_an_impossible_date_in_a_job_names_the_key(tmp_path: Path) -> None:
    """PyYAML turns 2024-13-45 into a date and raises ValueError: a traceback, exit 1."""
    job = write_job(tmp_path, MINIMAL)
    job.write_text(job.read_text().replace("split:", "split:\n  cutoffs: {valid: 2024-13-45, test: 2025-01-01}", 1)
                   .replace("by: entity", "by: time"))
    with pytest.raises(ConfigError, match=r"split\.cutoffs\.valid: '2024-13-45' is not a 'date'"):
        load_job(job)


def test_a_source_name_too_long_for_a_tar_member_is_a_config_error(tmp_path: Path) -> None:
    """A 90-character name the pattern allows made keys over ustar's 100-byte name: the build
    decoded everything and then died in tarfile ('name is too long'), exit 1."""
    source = {"kind": "image", "root": "raw", "table": "raw/labels.csv"}
    with pytest.raises(ConfigError, match=r"sources\[0\]\.name: 's{33}' is too long.*at most 32"):
        load_job(write_job(tmp_path, {**MINIMAL, "sources": [{**source, "name": "s" * 33}]}))
    job = load_job(write_job(tmp_path, {**MINIMAL, "sources": [{**source, "name": "s" * 32}]}))
    assert job.sources[0].name == "s" * 32
    long_root = "r" * 40
    with pytest.raises(ConfigError, match=r"sources\[0\]: its name defaults to its root folder's name, "
                                          "40 characters.*name: ct"):
        load_job(write_job(tmp_path, {**MINIMAL, "sources": [{**source, "root": long_root}]}))


def test_the_longest_job_name_gives_file_names_a_file_system_holds_and_a_longer_one_is_refused_at_load(
        tmp_path: Path) -> None:
    """A 300-character name passed validate; the build then failed (exit 6) saying to choose
    another folder with --out, which fails the same way: the name itself makes a file name over
    NAME_MAX (255 bytes). The longest file name packer derives from it is the build cache's."""
    from packer.schemas import load_schema
    from packer.storage import build_cache_dir

    longest = load_schema("job")["properties"]["name"]["maxLength"]
    assert len(build_cache_dir("n" * longest, str(tmp_path / "out"), tmp_path).name) == 255
    assert load_job(write_job(tmp_path, {**MINIMAL, "name": "n" * longest})).name == "n" * longest
    with pytest.raises(ConfigError) as info:
        load_job(write_job(tmp_path, {**MINIMAL, "name": "n" * (longest + 1)}))
    assert str(info.value).startswith(f"{tmp_path / 'job.yaml'}: name: 'nnn")
    assert f"is too long. Dataset name; names the folder <output>/<name>/ and the build cache folder " \
           f"<name>-<12 hex digits>, so at most {longest} characters" in str(info.value)


@pytest.mark.parametrize(("root", "name"), [("-scans", "scans"), ("ü.x", "x"), ("__CT 2024", "CT_2024"),
                                             ("ct-raw", "ct-raw"), ("ü", "source0"), ("my.data ñ", "my_data"),
                                             ("scan__", "scan")])
def test_a_name_taken_from_the_root_folder_follows_the_rule_a_written_name_follows(
        tmp_path: Path, root: str, name: str) -> None:
    """A written name matches ^[A-Za-z0-9][A-Za-z0-9_-]*$; one taken from the root did not: a root
    '-scans' made keys starting with '-' (packer locate took one for an option) and 'ü.x' the
    source '_x', whose keys started 'x-', and 'my.data ñ' the source 'my_data_', whose keys
    started 'my_data-': a name is the start of its sample keys."""
    import re

    from packer.records import safe_key

    source = {"kind": "image", "root": root, "label": "folder"}
    job = load_job(write_job(tmp_path, {**MINIMAL, "sources": [source]}))
    assert job.sources[0].name == name
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", job.sources[0].name)
    assert safe_key(job.sources[0].name) == job.sources[0].name


def test_a_written_source_name_that_sample_keys_would_not_start_with_is_refused(tmp_path: Path) -> None:
    """'scan_' passed the name pattern, but sample keys drop a name's end '_': its keys started
    'scan-', not with the source's name, and collided with a source 'scan''s under phi: keep."""
    source = {"kind": "image", "root": "raw", "table": "raw/labels.csv"}
    with pytest.raises(ConfigError, match=r"sources\[0\]\.name: 'scan_' ends with '_', which sample keys drop "
                                          r"\(they would start 'scan-', as a source named 'scan' does\); "
                                          r"name it 'scan', or end the name with a letter or digit"):
        load_job(write_job(tmp_path, {**MINIMAL, "sources": [{**source, "name": "scan_"}]}))
    assert load_job(write_job(tmp_path, {**MINIMAL, "sources": [{**source, "name": "scan_1"}]})).sources[0].name \
        == "scan_1"


def test_the_longest_source_name_gives_member_names_a_ustar_header_holds() -> None:
    import tarfile

    from packer.config import SOURCE_NAME_MAX
    from packer.keys import frame_key
    from packer.records import safe_key
    from packer.shards.members import MEMBER_EXTENSIONS

    longest = max(MEMBER_EXTENSIONS, key=len)
    key = f"{safe_key('s' * SOURCE_NAME_MAX)}-{'f' * 16}-dup99-p123456-t123456_123456"
    assert len(frame_key(key.split("-p")[0], 123456789)) < len(key)
    tarfile.TarInfo(f"{key}.{longest}").tobuf(tarfile.USTAR_FORMAT)  # raises ValueError when it does not fit


def test_a_job_file_reached_through_a_symlink_reads_its_paths_from_the_links_folder_and_is_named_by_it(
        tmp_path: Path) -> None:
    """workflows/job.yaml -> ../real/job.yaml: the paths were read from workflows/ while messages
    named real/job.yaml, "folder workflows/raw does not exist (relative to the job file)", a file
    beside which raw/ does exist. The folder the paths are read from is the one messages name."""
    (tmp_path / "real").mkdir()
    real = write_job(tmp_path / "real", MINIMAL)
    (tmp_path / "workflows").mkdir()
    link = tmp_path / "workflows" / "job.yaml"
    link.symlink_to(Path("..") / "real" / real.name)
    job = load_job(link)
    workflows = (tmp_path / "workflows").resolve()
    assert job.job_path == workflows / "job.yaml"
    assert job.sources[0].root == workflows / "raw" and job.output == workflows / "out"
