"""One entity id in two Unicode forms is one entity. A folder ``Müller`` written once as NFC (one
code point for the ü, as Linux keeps it) and once as NFD (``u`` and a combining diaeresis, as a
macOS export names it) prints alike and is one patient: the split put the two in different
splits, and the ``entity_lookalikes`` audit, which flags ``MÜLLER`` against ``Müller``, said
nothing. packer compares entity ids in NFC, as it does class folders, table cells and split
lists; ids that differ only in a compatibility form (full-width ``ＭＲＮ００４２`` against
``MRN0042``) are lookalikes, reported and never merged, as those differing in case are."""

from __future__ import annotations

import hashlib
import hmac
import json
import unicodedata
from pathlib import Path

import cv2
import numpy as np
import pyarrow.parquet as pq
import yaml

from packer.config import load_job
from packer.phi import Pseudonymizer, entity_form
from packer.pipeline.build import BuildOptions, build

NFC = unicodedata.normalize("NFC", "Müller")
NFD = unicodedata.normalize("NFD", "Müller")
KEY = b"0123456789abcdef" * 4


def write_people(tmp_path: Path, people: list[str]) -> None:
    """Two random PNGs in ``raw/<person>/`` for each person."""
    k = 0
    for person in people:
        (tmp_path / "raw" / person).mkdir(parents=True)
        for i in range(2):
            k += 1
            pixels = np.random.default_rng(k).integers(0, 256, (16, 16, 3), dtype=np.uint8)
            assert cv2.imwrite(str(tmp_path / "raw" / person / f"{i}.png"), pixels)


def build_folders(tmp_path: Path, people: list[str], phi: dict) -> Path:
    """Two PNGs in a folder per person, entity from the folder, split by entity; the version folder."""
    write_people(tmp_path, people)
    (tmp_path / "phi.key").write_text(KEY.decode())
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "names", "sources": [{"kind": "image", "name": "photos", "root": "raw", "label": "none",
                                      "entity": {"component": 0}}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1,
                  "balance": {"accept": True}},
        "transform": {"image": {"color": "rgb"}}, "pack": {"format": "webdataset"}, "output": "out", "phi": phi},
        sort_keys=False, allow_unicode=True))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    return Path(result.manifest_path).parent


def test_an_id_in_nfc_and_in_nfd_is_one_entity_in_one_split_written_in_nfc(tmp_path: Path) -> None:
    version = build_folders(tmp_path, [NFC, NFD] + [f"P{i:02d}" for i in range(10)], {"mode": "keep"})
    index = pq.read_table(version / "_index.parquet").to_pandas()
    mueller = index[[unicodedata.normalize("NFC", e) == NFC for e in index.entity_id]]
    assert len(mueller) == 4
    assert set(mueller.entity_id) == {NFC}
    assert mueller.split.nunique() == 1
    rules = json.loads((version / "leakage.json").read_text())["rules"]
    assert rules["entity_overlap"]["count"] == 0


def test_under_pseudonymization_both_forms_get_one_pseudonym_and_an_nfc_id_keeps_its_own() -> None:
    phi = Pseudonymizer(mode="pseudonymize", dates="shift", key=KEY)
    assert phi.entity(NFD) == phi.entity(NFC)
    # an id already in NFC (every ASCII id) keeps the pseudonym earlier builds gave it
    assert phi.entity(NFC) == "e-" + hmac.new(KEY, f"entity\x00{NFC}".encode(), hashlib.sha256).hexdigest()[:20]
    assert phi.entity("MRN0042") == "e-" + hmac.new(KEY, b"entity\x00MRN0042", hashlib.sha256).hexdigest()[:20]


def test_ids_that_differ_in_unicode_or_compatibility_form_share_one_lookalike_form() -> None:
    assert entity_form(NFD) == entity_form(NFC) == entity_form("MÜLLER")
    assert entity_form("ＭＲＮ００４２") == entity_form("MRN0042") == entity_form("mrn 42")
    assert entity_form("Müller") != entity_form("Muller")


def test_a_full_width_id_beside_its_ascii_spelling_is_reported_as_a_lookalike_not_merged(tmp_path: Path) -> None:
    version = build_folders(tmp_path, ["ＭＲＮ００４２", "MRN0042"] + [f"P{i:02d}" for i in range(6)],
                            {"mode": "pseudonymize", "key_file": "phi.key"})
    index = pq.read_table(version / "_index.parquet").to_pandas()
    assert index.entity_id.nunique() == 8
    look = json.loads((version / "leakage.json").read_text())["rules"]["entity_lookalikes"]
    assert look["count"] == 1


def test_a_pinned_table_naming_an_id_in_nfd_pins_the_patient_written_in_nfc(tmp_path: Path) -> None:
    """A pinned table saved on a Mac writes ``Müller`` decomposed; the samples' id is NFC. The pin
    named no sample (a stray-pin warning) and the patient went where the ratios sent it."""
    (tmp_path / "pins.csv").write_text(f"entity,split\n{NFD},test\n", encoding="utf-8")
    write_people(tmp_path, [NFC] + [f"P{i:02d}" for i in range(10)])
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "pins", "sources": [{"kind": "image", "name": "photos", "root": "raw", "label": "none",
                                     "entity": {"component": 0}}],
        "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 1,
                  "pinned": "pins.csv", "balance": {"accept": True}},
        "transform": {"image": {"color": "rgb"}}, "pack": {"format": "webdataset"}, "output": "out"},
        sort_keys=False, allow_unicode=True))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    version = Path(result.manifest_path).parent
    index = pq.read_table(version / "_index.parquet").to_pandas()
    assert set(index[index.entity_id == NFC].split) == {"test"}
    warned = (version / "warnings.jsonl").read_text() if (version / "warnings.jsonl").exists() else ""
    assert "pinned" not in warned, warned
