"""Validate: checks every transformed sample must pass before it is packed."""

from __future__ import annotations

import numpy as np

from packer.config import JobConfig
from packer.records import Issue, Sample

_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "float16": np.float16}


def expected_dtype(sample: Sample, job: JobConfig) -> np.dtype:
    if sample.ref.kind == "dicom" and sample.image.ndim == 3 and sample.image.shape[0] != 3:
        return np.dtype(_DTYPES[job.dicom.output])
    if sample.ref.kind == "dicom":
        # colour DICOM comes out as RGB uint8 whatever the output precision
        return np.dtype(np.uint8) if sample.image.dtype == np.uint8 else np.dtype(_DTYPES[job.dicom.output])
    return np.dtype(np.uint8)


def find_sample_issue(sample: Sample, job: JobConfig) -> Issue | None:
    """The first thing wrong with a transformed sample's array, as a ``validate`` issue, or None.

    Checks: C×H×W with no empty axis, the configured dtype, the configured size, finite values.
    """
    ref, image = sample.ref, sample.image
    if image.ndim != 3 or 0 in image.shape:
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} has shape {image.shape}; expected C×H×W, none empty")
    want = expected_dtype(sample, job)
    if image.dtype != want:
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} has dtype {image.dtype}; expected {want}")
    size = job.dicom.size if ref.kind == "dicom" else (job.image.tile_size or job.image.size)
    if size is not None and tuple(image.shape[1:]) != tuple(size):
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} is {image.shape[1]}×{image.shape[2]}; "
                                f"the job asks for {size[0]}×{size[1]}")
    if image.dtype.kind == "f" and not np.isfinite(image).all():
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} holds NaN or infinite values")
    return None
