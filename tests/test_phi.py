"""No PHI in outputs: plant identifiers in tags, file and folder names, build, scan every byte."""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.demo import encode_photo, render_ct_phantom, render_photo, write_ct_slice
from packer.phi import Pseudonymizer

PHI = {
    "name": "DOE^JOHNATHAN",
    "name_in_path": "Johnathan_Doe",
    "birth_date": "19450317",
    "mrn": "MRN83746251",
    "accession": "ACC99887766",
    "address": "12 Elmwood Street Springfield",
    "institution": "Saint Mercy Hospital",
    "photo_subject": "SUBJ-MARIA-LOPEZ",
}
KEY = "0123456789abcdef" * 4


def plant_tree(root: Path) -> None:
    rng = np.random.default_rng(0)
    folder = root / "ct" / f"{PHI['name_in_path']}_{PHI['mrn']}"
    for i in range(12):
        patient = PHI["mrn"] if i < 6 else f"MRN0000{i:02d}"
        write_ct_slice(folder / f"{PHI['accession']}_{i:02d}.dcm", patient_id=patient, study_date="20240105",
                       pixels_hu=render_ct_phantom(rng, z=i / 12), instance_number=i + 1,
                       PatientName=PHI["name"], PatientBirthDate=PHI["birth_date"], AccessionNumber=PHI["accession"],
                       PatientAddress=PHI["address"], InstitutionName=PHI["institution"],
                       OtherPatientIDs=PHI["mrn"])
    rows = ["path,label"] + [f"{PHI['name_in_path']}_{PHI['mrn']}/{PHI['accession']}_{i:02d}.dcm,{('a', 'b')[i % 2]}"
                             for i in range(12)]
    broken = folder / f"{PHI['accession']}_broken.dcm"  # a bad file: its path must stay in the local report
    broken.write_bytes(b"not dicom at all")
    (root / "ct_labels.csv").write_text("\n".join(rows) + "\n")
    photos = root / "photos" / PHI["photo_subject"]
    photos.mkdir(parents=True)
    table = ["path,label,entity,timestamp,note"]
    for i in range(8):
        (photos / f"{PHI['name_in_path']}_{i}.png").write_bytes(encode_photo(render_photo(rng, "circle"), ".png"))
        table.append(f"{PHI['photo_subject']}/{PHI['name_in_path']}_{i}.png,circle,{PHI['photo_subject']}-{i % 4},"
                     f"2024-0{1 + i % 8}-01,{PHI['address']}")
    (root / "photos" / "labels.csv").write_text("\n".join(table) + "\n")


def job_doc(root: Path, out: Path, phi: dict[str, Any] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "phi",
        "sources": [{"kind": "dicom", "root": str(root / "ct"), "labels": str(root / "ct_labels.csv")},
                    {"kind": "image", "root": str(root / "photos"), "table": str(root / "photos" / "labels.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
        "transform": {"dicom": {"windows": ["lung"], "size": [32, 32]}, "image": {"size": [32, 32]}},
        "pack": {"format": "webdataset", "max_samples": 5},
        "output": str(out), "registry": str(out / "registry"),
    }
    if phi is not None:
        doc["phi"] = phi
    return doc


def tree_files(root: Path) -> list[Path]:
    """Every file under ``root``, recursively, hidden files and folders included."""
    return sorted(Path(folder) / name for folder, _, names in os.walk(root) for name in names)


def output_texts(out: Path, logs: str) -> dict[str, str]:
    """Every byte under the output tree, as text: files (hidden ones and any build cache
    included), tar members, Parquet values, logs.

    Excluded by design and documented as local: a version folder's bad_samples.jsonl (raw
    paths, for the people who built the data). The build cache is not excluded: it lives
    outside the output tree, and a cache left inside it would be found."""
    texts = {"<cli output>": logs}
    for path in tree_files(out):
        if path.name == "bad_samples.jsonl" and (path.parent / "manifest.json").is_file():
            continue
        name = str(path.relative_to(out))
        data = path.read_bytes()
        texts[name] = data.decode("latin-1")
        if path.suffix == ".tar":
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    blob = tar.extractfile(member)
                    texts[f"{name}:{member.name}"] = member.name + (blob.read().decode("latin-1") if blob else "")
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            texts[f"{name}:values"] = json.dumps(table.to_pylist(), default=str)
            texts[f"{name}:schema"] = str(pq.ParquetFile(path).metadata) + str(table.schema)
    return texts


def phi_hits(texts: dict[str, str]) -> list[tuple[str, str]]:
    needles = set(PHI.values()) | {"1945-03-17", "2024-01-05", "Elmwood", "Mercy", "MARIA"}
    return sorted((where, needle) for where, text in texts.items() for needle in needles if needle in text)


def build(tmp_path: Path, phi: dict[str, Any] | None, fmt: str = "webdataset",
          env: dict[str, str] | None = None) -> tuple[int, Path, str]:
    root, out = tmp_path / "raw", tmp_path / "out"
    if not root.exists():
        plant_tree(root)
    doc = job_doc(root, out, phi)
    doc["pack"]["format"] = fmt
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    # the build cache goes to the work folder, outside ``out`` (and never to the real ~/.cache)
    env = {"PACKER_WORK_DIR": str(tmp_path / "work"), **(env or {})}
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env=env)
    return result.exit_code, out, result.output


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_no_planted_identifier_reaches_any_shared_output(tmp_path: Path, fmt: str) -> None:
    code, out, logs = build(tmp_path, None, fmt, env={"PACKER_PHI_KEY": KEY})
    assert code == 0, logs
    texts = output_texts(out, logs)
    assert any(name.endswith("report.html") for name in texts)
    assert any(PHI["accession"] in line for line in (next(out.glob("phi/*/bad_samples.jsonl")).read_text(),))
    assert any(name.endswith(".npy") for name in texts) or any(name.endswith(":values") for name in texts)
    assert phi_hits(texts) == []
    # the scan would catch the cache: it names raw ids, and it was written outside the output tree
    cache = tree_files(tmp_path / "work" / "cache")
    assert any(path.name.endswith(".packed.json") for path in cache)  # records, signatures, pointers
    assert phi_hits({str(path): path.read_bytes().decode("latin-1") for path in cache})


def test_the_scan_finds_identifiers_when_phi_is_kept(tmp_path: Path) -> None:
    """The scan can fail: with phi: keep and dates: keep the raw ids and dates do reach outputs."""
    code, out, logs = build(tmp_path, {"mode": "keep", "dates": "keep"})
    assert code == 0, logs
    texts = output_texts(out, logs)
    hits = {needle for _, needle in phi_hits(texts)}
    assert PHI["mrn"] in hits and PHI["photo_subject"] in hits and "2024-01-05" in hits
    # as the README says of keep: raw relative paths travel in the shards' records, header PHI never does
    records = "".join(text for name, text in texts.items() if name.endswith(".json") and ".tar:" in name)
    assert PHI["name_in_path"] in records and PHI["accession"] in records
    assert not any(PHI[k] in records for k in ("name", "birth_date", "institution"))  # the address is a table cell


def test_a_dicom_job_without_a_key_refuses_to_run_and_says_how(tmp_path: Path) -> None:
    code, out, logs = build(tmp_path, None, env={"PACKER_PHI_KEY": ""})
    assert code == 2
    assert "packer key new" in logs and "phi: {mode: keep}" in logs
    assert not out.exists()


def test_builds_with_different_keys_differ_and_record_only_a_fingerprint(tmp_path: Path) -> None:
    first = build(tmp_path / "a", None, env={"PACKER_PHI_KEY": KEY})
    second = build(tmp_path / "b", None, env={"PACKER_PHI_KEY": KEY[::-1]})
    manifests = [json.loads(next((o / "phi").glob("*/manifest.json")).read_text()) for _, o, _ in (first, second)]
    prints = [m["phi"]["key_fingerprint"] for m in manifests]
    assert prints[0] != prints[1] and all(len(p) == 16 for p in prints)
    assert manifests[0]["dataset_hash"] != manifests[1]["dataset_hash"]
    for manifest in manifests:
        assert KEY not in json.dumps(manifest) and KEY[::-1] not in json.dumps(manifest)


def test_key_file_is_read_and_short_keys_are_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "phi.key"
    key_file.write_text("short\n")
    code, _, logs = build(tmp_path, {"key_file": str(key_file)}, env={"PACKER_PHI_KEY": ""})
    assert code == 2 and "at least 16" in logs
    key_file.write_text(KEY + "\n")
    code, out, logs = build(tmp_path, {"key_file": str(key_file)}, env={"PACKER_PHI_KEY": ""})
    assert code == 0, logs


def test_dates_are_shifted_in_the_split_table(tmp_path: Path) -> None:
    code, out, logs = build(tmp_path, None, env={"PACKER_PHI_KEY": KEY})
    assert code == 0, logs
    table = pq.read_table(next(out.glob("phi/*/_splits.parquet"))).to_pylist()
    assert all(row["time"] is None for row in table)
    photos = sorted(row["days_since_first"] for row in table if row["key"].startswith("photos"))
    assert photos[0] == 0.0 and max(photos) > 0


@pytest.mark.parametrize("command", ["build", "validate"])
@pytest.mark.parametrize(("phi", "warned"), [
    ({"key_file": "phi.key"}, True),  # keep by default (no DICOM source): the key is not used, say so
    ({"key_file": "phi.key", "mode": "keep"}, True),
    ({"key_file": "phi.key", "mode": "pseudonymize"}, False),
    ({}, False),  # keep, no key given: nothing to say
])
def test_a_key_file_under_keep_is_a_warning_that_the_key_is_not_used(tmp_path: Path, phi: dict[str, str],
                                                                     warned: bool, command: str) -> None:
    """A NIfTI export's case folders are often named after the patient (DOE_JANE_MRN998877/t1.nii.gz).
    A job without a DICOM source keeps raw ids unless it says pseudonymize; one that names a key
    file but keeps is warned that the key is not used, rather than left to think it pseudonymized.
    packer validate, the check CI runs on the job file, says it too (only build did)."""
    raw = tmp_path / "raw"
    for i in range(2):
        path = raw / f"DOE_JANE_MRN99887{i}" / "photo.png"
        path.parent.mkdir(parents=True)
        path.write_bytes(encode_photo(render_photo(np.random.default_rng(i), "circle"), ".png"))
    (tmp_path / "phi.key").write_text(KEY + "\n")
    doc = {"name": "photos", "sources": [{"kind": "image", "root": "raw", "label": "none", "entity": "path_part:0"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"image": {"size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": "out", **({"phi": phi} if phi else {})}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, [command, str(tmp_path / "job.yaml"), "--scheduler", "sync", "-q"])
    assert result.exit_code == 0, result.output
    said = "packer: warning: phi.key_file names phi.key, but phi.mode is keep" in result.output
    assert said is warned, result.output



def _unlabelled_photo_job(tmp_path: Path, raw: Path, name: str, mode: str) -> tuple[Path, Pseudonymizer]:
    """A job of one unlabelled image source over ``raw`` under ``phi.mode`` ``mode``, and its pseudonymizer."""
    doc = {"name": name, "sources": [{"kind": "image", "root": str(raw), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out"), "phi": {"mode": mode}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job, Pseudonymizer(mode=mode, dates="shift", key=KEY.encode() if mode == "pseudonymize" else None)


@pytest.mark.parametrize(("mode", "shown"), [("pseudonymize", False), ("keep", True)])
def test_the_own_entity_warning_names_a_patient_folder_by_its_place_not_its_id(tmp_path: Path, mode: str,
                                                                              shown: bool) -> None:
    """Every file its own entity while folders look like patient ids (patient0042/...): the
    warning says where the id is; under PHI it does not quote the folder, a raw id."""
    from packer.config import load_job
    from packer.pipeline.discover import discover

    raw = tmp_path / "raw"
    for i in range(4):
        path = raw / f"patient00{42 + i % 2}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_photo(render_photo(np.random.default_rng(i), "circle"), ".png"))
    job, phi = _unlabelled_photo_job(tmp_path, raw, "own", mode)
    (warning,) = discover(load_job(job), phi).warnings
    assert "leakage protection is off" in warning and "entity: {component: 0}" in warning
    assert ("patient0042" in warning) is shown


@pytest.mark.parametrize(("folder", "refused"), [
    ("Doe^John_19600101", True), ("export_20240105", True),
    # a date with separators, year, day or month first (only YYYYMMDD was caught)
    ("Doe_John_1960-01-01", True), ("Doe_John_01.01.1960", True), ("Doe_John_1960_01_01", True),
    ("Doe_John_12-31-1960", True),
    # a month spelled as a name, with or without separators, and eight digits day or month first
    ("Doe_John_31-Dec-1960", True), ("Doe_John_1960-Dec-31", True), ("Doe_John_31Dec1960", True),
    ("Doe_John_december_31_1960", True), ("Doe_John_31_JAN_1960", True), ("Doe_John_31121960", True),
    ("Doe_John_12311960", True),
    # a YYYYMMDD that starts a longer run of digits, as a DICOM DT (date and time) writes it
    ("20230504101112", True), ("Study20230504101112", True), ("20230504101112.123456", True),
    ("batch_2024130100", False),
    # a spelled month with an ordinal day, in any order
    ("Exam_4th_May_2023", True), ("4th_May_2023", True), ("May 4th, 2023", True), ("2023_may_1ST", True),
    ("Dec_22nd_1960", True), ("Task_1st_round", False),
    ("ct", False), ("CheXpert-v1.0-small", False), ("CT_1960-01", False), ("series_2024-13-01", False),
    ("Task02_Heart", False), ("images_001", False), ("stage_2_train_images", False),
    ("ISIC_2019_Training_Input", False), ("mimic-cxr-jpg-2.0.0", False), ("Decathlon_Mar_2018", False),
    ("scans_12345678", False)])
def test_a_source_named_after_a_root_folder_that_may_name_a_patient_is_refused_under_pseudonymize(
        tmp_path: Path, folder: str, refused: bool) -> None:
    """A source's name defaults to its root folder's, and is written in clear into every sample
    id, tar member, manifest and report: a root `Doe^John_19600101/` put the patient's name and
    birth date into every shipped file under phi: pseudonymize."""
    from packer.config import load_job
    from packer.errors import ConfigError

    raw = tmp_path / folder
    raw.mkdir()
    job, _ = _unlabelled_photo_job(tmp_path, raw, "own", "pseudonymize")
    if not refused:
        assert load_job(job).sources[0].name == folder.replace(".", "_")
        return
    with pytest.raises(ConfigError, match=r"sources\[0\]: its name defaults to its root folder's name, which may "
                                          r"identify a patient .* give the source a name of its own") as err:
        load_job(job)
    assert folder not in str(err.value) and folder.replace(".", "_") not in str(err.value)  # CI logs keep messages
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0]["name"] = "ct"
    job.write_text(yaml.safe_dump(doc))
    assert load_job(job).sources[0].name == "ct"
    doc["phi"] = {"mode": "keep"}  # kept in clear on purpose: the job's word
    doc["sources"][0].pop("name")
    job.write_text(yaml.safe_dump(doc))
    load_job(job)


def test_a_patient_named_folder_in_a_job_path_is_recorded_as_id_in_the_manifest_under_pseudonymize(
        tmp_path: Path) -> None:
    """The refusal of a root `DOE^JOHN_19280101/` says phi: pseudonymize never writes such a name,
    yet once the source had its `name: ct` the manifest (shared, copied to the registry) still
    recorded the root, its parent folder and the label table's path as written."""
    from packer.config import load_job

    raw = tmp_path / "DOE^JOHN_19280101" / "Doe_John_1928-01-01"
    rows = ["path,label,entity"]
    for i in range(4):
        (raw / f"a{i}.png").parent.mkdir(parents=True, exist_ok=True)
        (raw / f"a{i}.png").write_bytes(encode_photo(render_photo(np.random.default_rng(i), "circle"), ".png"))
        rows.append(f"a{i}.png,{'cat' if i % 2 else 'dog'},p{i}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    job, _ = _unlabelled_photo_job(tmp_path, raw, "own", "pseudonymize")
    doc = yaml.safe_load(job.read_text())
    doc["sources"][0].pop("label")
    doc["sources"][0].update(name="ct", table=str(raw / "labels.csv"))
    job.write_text(yaml.safe_dump(doc))
    env = {"PACKER_WORK_DIR": str(tmp_path / "work"), "PACKER_PHI_KEY": KEY}
    first = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"], env=env)
    assert first.exit_code == 0, first.output
    (manifest,) = (tmp_path / "out").rglob("manifest.json")
    text = manifest.read_text()
    assert "DOE^JOHN" not in text and "19280101" not in text and "1928-01-01" not in text
    recorded = json.loads(text)["config"]["sources"][0]
    assert recorded["root"] == str(tmp_path / "<id>" / "<id>")
    assert recorded["table"] == str(tmp_path / "<id>" / "<id>" / "labels.csv")
    # the recorded config still serves: a rebuild from the cache, inspect and diff read it
    (raw / "a4.png").write_bytes(encode_photo(render_photo(np.random.default_rng(4), "square"), ".png"))
    (raw / "labels.csv").write_text("\n".join([*rows, "a4.png,dog,p4"]) + "\n")
    second = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"], env=env)
    assert second.exit_code == 0, second.output
    (new,) = {p.parent for p in (tmp_path / "out").rglob("manifest.json")} - {manifest.parent}
    inspect = CliRunner().invoke(main, ["inspect", str(new)], env=env)
    assert inspect.exit_code == 0 and "<id>" in inspect.output, inspect.output
    diff = CliRunner().invoke(main, ["diff", str(manifest.parent), str(new)], env=env)
    assert diff.exit_code == 0 and "DOE^JOHN" not in diff.output, diff.output
    # a job whose paths name no patient records them as written: its config_hash is as it was
    plain = load_job(job).sources[0]
    assert plain.root_spec == str(raw)
    doc["sources"][0].update(root=str(tmp_path / "ct"), table=str(tmp_path / "ct" / "labels.csv"))
    (tmp_path / "ct").mkdir()
    job.write_text(yaml.safe_dump(doc))
    assert load_job(job).manifest_config() == load_job(job).identity()


@pytest.mark.parametrize(("layout", "warned"), [
    # BraTS: a case folder that names its files after itself, in no patient-like spelling
    ({"BraTS20_Training_006": ["BraTS20_Training_006_t1", "BraTS20_Training_006_flair"],
      "BraTS20_Training_007": ["BraTS20_Training_007_t1", "BraTS20_Training_007_flair"]}, True),
    # an image-folder layout: class folders, files named otherwise
    ({"grade1": ["a1", "b2"], "grade2": ["c3", "d4"]}, False),
    # folders by year, files by date: no id
    ({"2019": ["2019_01_03", "2019_02_11"], "2020": ["2020_05_01", "2020_06_30"]}, False),
])
def test_the_own_entity_warning_sees_a_case_folder_that_names_its_files(tmp_path: Path, layout: dict[str, list[str]],
                                                                       warned: bool) -> None:
    """Every file its own entity while each folder holds several files named after it
    (``BraTS20_Training_006/BraTS20_Training_006_t1``): that folder is the case, and the warning
    names it; class folders whose files are named otherwise are not taken for one."""
    from packer.config import load_job
    from packer.pipeline.discover import discover

    raw = tmp_path / "raw"
    for i, (folder, names) in enumerate(sorted(layout.items())):
        for j, name in enumerate(names):
            path = raw / folder / f"{name}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(encode_photo(render_photo(np.random.default_rng(10 * i + j), "circle"), ".png"))
    job, _ = _unlabelled_photo_job(tmp_path, raw, "own", "keep")
    warnings = discover(load_job(job)).warnings
    if warned:
        (warning,) = warnings
        assert "leakage protection is off" in warning and "'BraTS20_Training_006'" in warning
        assert "entity: {component: 0}" in warning
    else:
        assert warnings == []


@pytest.mark.parametrize(("mode", "shown"), [("pseudonymize", False), ("keep", True)])
def test_a_sample_id_collision_warning_names_sample_ids_not_paths_under_pseudonymization(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, shown: bool) -> None:
    """Two files whose sample ids collide (a 64-bit hash collision, forced here) are renamed
    and warned about: under phi: pseudonymize the warning names the sample ids (packer locate
    maps them back), never the raw paths, whose folders hold a patient's name; keep names them."""
    from packer.config import load_job
    from packer.pipeline import discover as discover_module

    raw = tmp_path / "raw"
    folder = raw / f"{PHI['name_in_path']}_{PHI['mrn']}"
    for i in range(2):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.png").write_bytes(encode_photo(render_photo(np.random.default_rng(i), "circle"), ".png"))
    job, phi = _unlabelled_photo_job(tmp_path, raw, "clash", mode)
    monkeypatch.setattr(discover_module, "make_sample_id", lambda source, relpath, phi=None: f"{source}-0000beef")
    found = discover_module.discover(load_job(job), phi)
    assert found.refs.column("sample_id") == ["raw-0000beef", "raw-0000beef-dup2"]
    (said,) = [w for w in found.warnings if "0000beef-dup2" in w]  # printed, and kept in warnings.jsonl
    assert (PHI["name_in_path"] in said) is shown and (PHI["mrn"] in said) is shown
    assert (str(folder / "1.png") in said) is shown
    if not shown:
        assert "two files share sample id raw-0000beef" in said and "packer locate" in said


@pytest.mark.parametrize("mode", ["pseudonymize", "keep"])
def test_an_internal_error_prints_no_raw_path_under_pseudonymization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     mode: str) -> None:
    """A bug (an exception packer did not anticipate) ends the build with ``packer: internal
    error``, exit 1, and a traceback to report. Its message named the file it met, whose folder
    holds a patient's name; under phi: pseudonymize the path is shown as ``<source NAME>/…``
    (the exception type and the frames stay), and PACKER_RAW_TRACEBACK=1 prints it whole.
    phi: keep prints it as before."""
    from packer.read.image_kind import ImageKind
    from packer.records import SampleRef

    def boom(self: ImageKind, ref: SampleRef, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"boom at {ref.path}")

    root = tmp_path / "raw"
    plant_tree(root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc(root, tmp_path / "out", {"mode": mode})))
    monkeypatch.setattr(ImageKind, "probe", boom)
    env = {"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work"), "PACKER_RAW_TRACEBACK": ""}
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env=env)
    assert result.exit_code == 1, result.output
    assert "packer: internal error" in result.output
    assert "RuntimeError: boom at " in result.output and "Traceback (most recent call last)" in result.output
    assert "in boom" in result.output  # the frames (code locations) are kept
    if mode == "keep":
        assert f"RuntimeError: boom at {root / 'photos' / PHI['photo_subject']}" in result.output
        return
    assert "RuntimeError: boom at <source photos>/…" in result.output, result.output
    assert str(root) not in result.output
    assert phi_hits({"<build output>": result.output}) == []
    assert "PACKER_RAW_TRACEBACK=1" in result.output
    raw = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env={**env, "PACKER_RAW_TRACEBACK": "1"})
    assert raw.exit_code == 1 and f"boom at {root / 'photos' / PHI['photo_subject']}" in raw.output


def test_an_internal_error_prints_no_bare_file_name_folder_name_or_quoted_value_under_pseudonymization(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug's message need not hold a whole path: a file's bare name, its folder's name (a
    patient's), or a header value quoted as Python quotes one, all name the patient. Under phi:
    pseudonymize none of them is printed; the type, the frames and the message's other words are."""
    from packer.read.image_kind import ImageKind
    from packer.records import SampleRef

    def boom(self: ImageKind, ref: SampleRef, *args: Any, **kwargs: Any) -> Any:
        folder = Path(ref.path).parent.name
        raise RuntimeError(f"boom in {Path(ref.path).name} of {folder}: cannot use {PHI['name']!r}")

    root = tmp_path / "raw"
    plant_tree(root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc(root, tmp_path / "out", {"mode": "pseudonymize"})))
    monkeypatch.setattr(ImageKind, "probe", boom)
    env = {"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work"), "PACKER_RAW_TRACEBACK": ""}
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env=env)
    assert result.exit_code == 1, result.output
    assert "RuntimeError: boom in <path> of <id>: cannot use '<value>'" in result.output, result.output
    assert phi_hits({"<build output>": result.output}) == []
    raw = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env={**env, "PACKER_RAW_TRACEBACK": "1"})
    assert raw.exit_code == 1 and f"of {PHI['photo_subject']}: cannot use {PHI['name']!r}" in raw.output


def test_a_config_error_names_no_folder_or_file_of_the_data_under_pseudonymization(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PackerError (exit 2) is printed where CI logs keep it: under phi: pseudonymize a folder or
    file name of the data, or a raw entity id, that its message quotes is shown as <id>."""
    import packer.pipeline.stages as stages_module
    from packer.errors import ConfigError

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError(f"cannot split {PHI['photo_subject']}-1 (folder {PHI['photo_subject']}); fix the table")

    root = tmp_path / "raw"
    plant_tree(root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc(root, tmp_path / "out", {"mode": "pseudonymize"})))
    monkeypatch.setattr(stages_module, "assign_splits", refuse)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"],
                                env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 2, result.output
    assert "packer: error: cannot split <id> (folder <id>); fix the table" in result.output, result.output
    assert phi_hits({"<build output>": result.output}) == []


def test_a_path_pattern_that_matches_no_file_shows_no_patient_folder_under_pseudonymization(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error shows a file's relative path as an example of what the pattern met; under phi:
    pseudonymize its folder and file names (a patient's name, an accession number) are <id>, as
    the command prints it and as the Python API raises it (it raised them as written, into the
    exception text an orchestrator writes to shared logs)."""
    import packer
    from packer.errors import ConfigError

    root = tmp_path / "raw"
    plant_tree(root)
    doc = job_doc(root, tmp_path / "out", None)
    doc["sources"][0]["entity"] = {"path": "NOPE(?P<entity>[0-9]+)/"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"],
                                env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 2, result.output
    assert "matches none of the 13 files; a file's path relative to the root is '<id>/<id>'" in result.output
    assert phi_hits({"<build output>": result.output}) == []
    monkeypatch.setenv("PACKER_PHI_KEY", KEY)
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    with pytest.raises(ConfigError) as raised:
        packer.validate(job, scheduler="sync", progress=False)
    assert "a file's path relative to the root is '<id>/<id>'" in str(raised.value), str(raised.value)
    assert phi_hits({"<exception>": str(raised.value)}) == []


def test_nifti_header_text_and_patient_named_case_folders_reach_no_output_under_pseudonymization(
        tmp_path: Path) -> None:
    """A NIfTI export's header carries free text (``descrip``, ``aux_file``, ``intent_name``: a
    converter may write the patient's name or the study there) and its case folders often are the
    patient's name. Under phi: pseudonymize none of it reaches a shared output or the CLI output,
    a broken file's and a missing file's rows included."""
    import nibabel as nib

    root = tmp_path / "raw" / "nifti"
    rows = ["path,entity,mask"]
    rng = np.random.default_rng(0)
    for i in range(4):
        case = f"{PHI['name_in_path']}_{i}"
        (root / case).mkdir(parents=True)
        image = nib.Nifti1Image(rng.normal(0, 100, (16, 16, 6)).astype(np.int16), np.diag([2.0, 2.0, 4.0, 1.0]))
        image.header["descrip"] = PHI["name"].encode()
        image.header["aux_file"] = PHI["mrn"].encode()
        image.header["intent_name"] = b"Mercy"
        nib.save(image, root / case / f"{PHI['accession']}_{i}.nii.gz")
        mask = np.zeros((16, 16, 6), np.uint8)
        mask[4:10, 4:10, 1:4] = 1
        nib.save(nib.Nifti1Image(mask, np.diag([2.0, 2.0, 4.0, 1.0])), root / case / f"mask_{i}.nii.gz")
        rows.append(f"{case}/{PHI['accession']}_{i}.nii.gz,{PHI['mrn']}{i % 2},{case}/mask_{i}.nii.gz")
    (root / f"{PHI['name_in_path']}_0" / f"{PHI['accession']}_broken.nii.gz").write_bytes(b"not nifti")
    rows.append(f"{PHI['name_in_path']}_0/{PHI['accession']}_broken.nii.gz,{PHI['mrn']}0,"
                f"{PHI['name_in_path']}_0/mask_0.nii.gz")
    rows.append(f"{PHI['name_in_path']}_9/{PHI['accession']}_gone.nii.gz,{PHI['mrn']}0,"
                f"{PHI['name_in_path']}_9/mask_9.nii.gz")
    (root / "cases.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    doc = {"name": "phi", "sources": [{"kind": "nifti", "root": str(root), "table": str(root / "cases.csv"),
                                       "label": "none", "mask": {"column": "mask", "classes": [0, 1]}}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
           "transform": {"nifti": {"windows": ["abdomen"],
                                   "sample": {"volume": {"spacing": [4, 4, 4], "size": [4, 8, 8]}}}},
           "pack": {"format": "webdataset"}, "output": str(out), "validate": {"max_bad_fraction": 0.9},
           "phi": {"mode": "pseudonymize"}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    env = {"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")}
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"], env=env)
    assert result.exit_code == 0, result.output
    checked = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync"], env=env)
    assert checked.exit_code == 0, checked.output
    texts = output_texts(out, result.output + checked.output)
    assert sum(1 for name in texts if name.endswith(".npy")) >= 4  # the cases were packed
    bad = next(out.glob("phi/*/bad_samples.jsonl")).read_text()
    assert f"{PHI['accession']}_broken" in bad and f"{PHI['accession']}_gone" in bad  # local: the paths stay
    assert phi_hits(texts) == []


def test_validate_summary_names_bad_samples_by_key_under_pseudonymization(tmp_path: Path) -> None:
    """packer validate's printed summary goes to CI logs: under PHI it lists the bad files by
    sample key (packer locate maps them back), as the report does; --json keeps their paths."""
    root = tmp_path / "raw"
    plant_tree(root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc(root, tmp_path / "out", None)))
    report = tmp_path / "v.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "--json", str(report)],
                                env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 0, result.output
    (bad,) = json.loads(report.read_text())["bad_samples"]["records"]
    assert PHI["accession"] in bad["path"]  # the local JSON keeps the path
    assert f"not_dicom              {bad['sample_id']}" in result.output
    assert "packer locate" in result.output
    assert phi_hits({"<validate output>": result.output}) == []


def test_validate_junit_is_safe_to_publish_under_pseudonymization(tmp_path: Path) -> None:
    """CI publishes the JUnit file as test results (the README's recipe, the data-check workflow's
    artifact): under PHI its bad_fraction case lists bad files by reason and sample key, not by
    raw path and message."""
    root = tmp_path / "raw"
    plant_tree(root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc(root, tmp_path / "out", None)))
    junit = tmp_path / "v.xml"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--junit", str(junit)],
                                env={"PACKER_PHI_KEY": KEY, "PACKER_WORK_DIR": str(tmp_path / "work")})
    assert result.exit_code == 0, result.output
    text = junit.read_text()
    phi = Pseudonymizer(mode="pseudonymize", dates="shift", key=KEY.encode())
    broken = f"{PHI['name_in_path']}_{PHI['mrn']}/{PHI['accession']}_broken.dcm"
    assert f"not_dicom: ct-{phi.path_digest('ct', broken)}" in text
    assert phi_hits({"<junit>": text}) == []
    workflow = (Path(__file__).parent.parent / ".github" / "workflows" / "validate-data.yml").read_text()
    assert "path: validate-reports/*.xml" in workflow  # the JSON, which lists raw paths, stays on the runner


@pytest.mark.parametrize("where", [{"PatientID": {"not": ["MRN0099"]}}, {"PatientName": {"match": "DOE"}},
                                   {"AccessionNumber": "ACC1"}, {"PatientBirthDate": {"not": ["19450317"]}},
                                   {"PatientAge": {"not": ["097Y"]}}, {"StationName": "JOHNDOE-HOME"},
                                   {"entity": {"not": ["SUBJ-MARIA-LOPEZ-1"]}},
                                   # any UID but a SOP class's (one list named a few), and Annex E's other ids
                                   {"IrradiationEventUID": "1.2.826.0.1.3680043.99.4242.7"},
                                   {"ConcatenationUID": "1.2.826.0.1.3680043.99.4242.8"},
                                   {"InstanceCreatorUID": "1.2.3.4"}, {"StorageMediaFileSetUID": "1.2.3.5"},
                                   {"DimensionOrganizationUID": "1.2.3.6"},
                                   {"SynchronizationFrameOfReferenceUID": "1.2.3.7"},
                                   {"AdmissionID": "ADM55512345"}, {"ScheduledProcedureStepID": "SPS7788123"},
                                   {"PerformedProcedureStepID": "PPS1"}, {"RequestedProcedureID": "RP99001234"},
                                   {"ResponsiblePerson": "Lopez^Maria"}, {"RegionOfResidence": "Springfield"}])
def test_a_where_on_an_identifying_header_attribute_is_refused_under_pseudonymization(
        tmp_path: Path, where: dict[str, Any]) -> None:
    """Leaving out a withdrawn patient with where: {PatientID: {not: [MRN0099]}} wrote the raw MRN
    into the manifest's and the report's config under phi: pseudonymize, which promises that no
    raw entity id is written anywhere. It is a config error naming the key and the fixes."""
    from packer.config import load_job
    from packer.errors import ConfigError

    doc = job_doc(tmp_path / "raw", tmp_path / "out", {"key_file": "phi.key"})
    (keyword,) = where
    index = 1 if keyword == "entity" else 0  # the photos source's entity column
    doc["sources"][index]["where"] = where
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=rf"sources\[{index}\]\.where\.{keyword}: .*identif.*manifest"):
        load_job(job)
    doc["phi"] = {"mode": "keep"}  # keep writes raw ids anyway: allowed
    job.write_text(yaml.safe_dump(doc))
    source = load_job(job).sources[index]
    assert source.header_where or source.where


@pytest.mark.parametrize(("index", "key", "why"), [
    (0, "patientId", "spelled like the DICOM keyword PatientID"), (0, "patient_id", "PatientID"),
    (0, "Patient ID", "PatientID"), (0, "accession-number", "AccessionNumber"),
    (1, "Entity", "source's entity, entity"), (1, "ENTITY", "entity ids"),
    # a person's name (VR PN) that Annex E's list does not name
    (0, "SecondaryReviewerName", "VR PN"), (0, "SelectorPNValue", "VR PN"), (0, "ROIInterpreter", "VR PN")])
def test_a_where_on_a_table_column_spelled_like_an_identifying_keyword_is_refused_under_pseudonymization(
        tmp_path: Path, index: int, key: str, why: str) -> None:
    """RSNA Pneumonia's table spells the header's PatientID as patientId: a where: {patientId:
    {not: [<id>]}} wrote that raw id into the manifest, since only the exact keyword was refused.
    Any spelling of an identifying keyword or of the entity (case, _, -, spaces), and every
    person's name the data dictionary knows, is a config error naming the key, why and the fix."""
    from packer.config import load_job
    from packer.errors import ConfigError

    doc = job_doc(tmp_path / "raw", tmp_path / "out", {"key_file": "phi.key"})
    doc["sources"][index]["where"] = {key: {"not": ["00000003-7d2f-4c1e-9b1a-000000000003"]}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=rf"sources\[{index}\]\.where\.{re.escape(key)}: .*{re.escape(why)}"
                                          r".*manifest.*withdrawn: \{not: \[yes\]\}"):
        load_job(job)
    doc["phi"] = {"mode": "keep"}
    job.write_text(yaml.safe_dump(doc))
    source = load_job(job).sources[index]
    assert source.header_where or source.where


@pytest.mark.parametrize("where", [{"SOPClassUID": "CT Image Storage"}, {"SOPClassUID": "1.2.840.10008.5.1.4.1.1.2"},
                                   {"StudyDate": {"not": ["20200101"]}}, {"SeriesDescription": {"match": "axial"}},
                                   {"Modality": "CT"}])
def test_a_where_on_a_kind_of_object_a_date_or_a_description_is_kept_under_pseudonymization(
        tmp_path: Path, where: dict[str, Any]) -> None:
    """A SOP class names a kind of object, not a patient (``where: {SOPClassUID: RT Dose
    Storage}`` is how a job asks for one), and a cutoff date or a protocol's name is the job
    author's value: though UIDs identify, these stay allowed under phi: pseudonymize."""
    from packer.config import load_job

    doc = job_doc(tmp_path / "raw", tmp_path / "out", {"key_file": "phi.key"})
    doc["sources"][0]["where"] = where
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    (keyword,) = where
    assert [c.key for c in load_job(job).sources[0].header_where] == [keyword]


@pytest.mark.parametrize(("mode", "shown"), [("pseudonymize", False), ("keep", True)])
@pytest.mark.parametrize("table", ["twice", "no_match"])
def test_a_table_error_that_stops_the_job_names_rows_not_a_patients_folder_under_pseudonymization(
        tmp_path: Path, mode: str, shown: bool, table: str) -> None:
    """A label table that lists a file twice, or names none of the files: the job stops with a
    config error printed where CI logs keep it; under PHI it names the rows, not the file's path
    (its folder here is a patient's name), and still says the fix."""
    from packer.config import load_job
    from packer.errors import ConfigError
    from packer.pipeline.discover import discover

    raw = tmp_path / "raw"
    (raw / PHI["name_in_path"]).mkdir(parents=True)
    for i in range(2):
        (raw / PHI["name_in_path"] / f"{i}.png").write_bytes(
            encode_photo(render_photo(np.random.default_rng(i), "circle"), ".png"))
    first = f"{PHI['name_in_path']}/0.png" if table == "twice" else f"elsewhere/{PHI['name_in_path']}/0.png"
    rows = [f"{first},circle,S1", f"{PHI['name_in_path']}/1.png,circle,S2"]
    if table == "twice":
        rows.append(f"{first},circle,S1")
    (raw / "labels.csv").write_text("path,label,entity\n" + "\n".join(rows if table == "twice" else rows[:1]) + "\n")
    doc = {"name": "tables", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out"), "phi": {"mode": mode}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    phi = Pseudonymizer(mode=mode, dates="shift", key=KEY.encode() if mode == "pseudonymize" else None)
    with pytest.raises(ConfigError) as caught:
        discover(load_job(tmp_path / "job.yaml"), phi)
    message = str(caught.value)
    assert ("listed twice" if table == "twice" else "names a file under") in message
    assert "row " in message
    assert (PHI["name_in_path"] in message) is shown
