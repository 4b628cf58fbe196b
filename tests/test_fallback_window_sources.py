"""A fallback window says it is one: a file without its own window packed under
``fallback_window`` records ``fallback_<kind>`` as its window's source, so a mixed archive (For
Presentation mammograms with windows, For Processing ones without) tells which samples lost their
own. A percentiles fallback said ``percentiles``, as a requested percentiles window does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dicom_files import config, ct_dataset, file_window, make_ref, save, window

from packer.config import parse_window
from packer.read.dicom import read_dicom


def _sources(path: Path, *windows: object, **kwargs: object) -> tuple[list[str], np.ndarray]:
    samples = read_dicom(make_ref(path), config(*windows, **kwargs))
    assert isinstance(samples, list), samples
    return [w["source"] for w in samples[0].metadata["windows"]], samples[0].image


def test_each_kind_of_fallback_window_is_marked_a_fallback(tmp_path: Path) -> None:
    path = save(ct_dataset(center=None, width=None), tmp_path / "for_processing.dcm")
    percentiles = parse_window({"percentiles": [1, 99]}, "transform.dicom.fallback_window")
    explicit, _ = _sources(path, file_window(), fallback_window=window(40, 80, name="brain"))
    fallen, image = _sources(path, file_window(), fallback_window=percentiles)
    asked, same = _sources(path, percentiles)
    assert explicit == ["fallback_explicit"]
    assert fallen == ["fallback_percentiles"]
    assert asked == ["percentiles"]
    np.testing.assert_array_equal(image, same)  # the same window, only its provenance differs


def test_the_report_counts_a_percentiles_fallback_as_a_normalisation() -> None:
    """The report's intensity note ("normalised by each sample's own statistics") reads the
    windows whose source is a normalisation: a percentiles fallback scales by the sample's own
    percentiles too, so it is one (it vanished from the note when it got its fallback_ source)."""
    from packer.htmlreport.stats import normalisation_stats

    info = {"metadata": {"windows": [{"name": "p1-99", "source": "fallback_percentiles", "low": -3.0, "high": 9.5},
                                     {"name": "own", "source": "file", "center": 40, "width": 80}]}}
    assert normalisation_stats(info, ["a", "b"]) == [("p1-99", {"low": -3.0, "high": 9.5})]
