"""Validate: checks every transformed sample must pass before it is packed."""

from __future__ import annotations

import numpy as np

from packer.config import JobConfig
from packer.read.kinds import source_kind
from packer.records import Issue, Sample

#: What to do about a sample whose array has the wrong type: no job setting makes one, so it is a
#: reader or transform bug, not a defect of the file.
_DTYPE_FIX = "the reader produced the wrong type: report it as a packer bug, with this file"


def find_sample_issue(sample: Sample, job: JobConfig) -> Issue | None:
    """The first thing wrong with a transformed sample's array, as a ``validate`` issue, or None.

    Checks, in order: C×H×W (C×D×H×W where the kind makes volumes) with no empty axis
    (``bad_shape``), the configured dtype (``bad_dtype``), the configured size (``bad_shape``),
    finite values (``non_finite``: NaN or ±inf in a float16 sample). What a sample of each kind
    must be, its kind says (:class:`packer.read.kinds.SourceKind`).
    """
    ref, image = sample.ref, sample.image
    kind = source_kind(ref.kind)
    ndim = kind.sample_ndim(job)
    if image.ndim != ndim or 0 in image.shape:
        layout = "C×H×W" if ndim == 3 else "C×D×H×W"
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} has shape {image.shape}; expected {layout}, "
                                "none empty")
    want = kind.expected_dtype(sample, job)
    if image.dtype != want:
        return Issue.of(ref, stage="validate", reason="bad_dtype",
                        message=f"{ref.path}: sample {sample.key} has dtype {image.dtype}; expected {want} "
                                f"({kind.dtype_rule(job)}); {_DTYPE_FIX}")
    size = kind.expected_size(job)
    if size is not None and tuple(image.shape[1:]) != tuple(size):
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} is {'×'.join(map(str, image.shape[1:]))}; "
                                f"the job asks for {'×'.join(map(str, size))}")
    if image.dtype.kind == "f" and not np.isfinite(image).all():
        nan = int(np.isnan(image).sum())
        inf = int(np.isinf(image).sum())
        return Issue.of(ref, stage="validate", reason="non_finite",
                        message=f"{ref.path}: sample {sample.key} holds {nan} NaN and {inf} infinite value(s) "
                                f"({kind.dtype_rule(job)}); the windows or normalisation met NaN or infinite "
                                "input values, or values float16 cannot hold: use an integer output (uint8/uint16) "
                                "with a window, or fix the file")
    return None
