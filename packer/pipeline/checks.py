"""Validate: checks every transformed sample must pass before it is packed."""

from __future__ import annotations

import numpy as np

from packer.config import JobConfig
from packer.records import Issue, Sample

_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "float16": np.float16}

#: What to do about a sample whose array has the wrong type: no job setting makes one, so it is a
#: reader or transform bug, not a defect of the file.
_DTYPE_FIX = "the reader produced the wrong type: report it as a packer bug, with this file"


def expected_dtype(sample: Sample, job: JobConfig) -> np.dtype:
    """The dtype ``sample`` must have: ``transform.dicom.output`` for DICOM (colour DICOM comes out
    as RGB uint8 whatever the output precision), uint8 for images."""
    if sample.ref.kind == "dicom" and sample.image.ndim == 3 and sample.image.shape[0] != 3:
        return np.dtype(_DTYPES[job.dicom.output])
    if sample.ref.kind == "dicom":
        # colour DICOM comes out as RGB uint8 whatever the output precision
        return np.dtype(np.uint8) if sample.image.dtype == np.uint8 else np.dtype(_DTYPES[job.dicom.output])
    return np.dtype(np.uint8)


def _dtype_field(sample: Sample, job: JobConfig) -> str:
    """The job setting that decides ``sample``'s dtype, as the message names it."""
    if sample.ref.kind == "dicom":
        return f"transform.dicom.output is {job.dicom.output}; colour DICOM is always uint8"
    return "images are always uint8"


def find_sample_issue(sample: Sample, job: JobConfig) -> Issue | None:
    """The first thing wrong with a transformed sample's array, as a ``validate`` issue, or None.

    Checks, in order: C×H×W with no empty axis (``bad_shape``), the configured dtype
    (``bad_dtype``), the configured size (``bad_shape``), finite values (``non_finite``: NaN or
    ±inf in a float16 sample).
    """
    ref, image = sample.ref, sample.image
    if image.ndim != 3 or 0 in image.shape:
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} has shape {image.shape}; expected C×H×W, none empty")
    want = expected_dtype(sample, job)
    if image.dtype != want:
        return Issue.of(ref, stage="validate", reason="bad_dtype",
                        message=f"{ref.path}: sample {sample.key} has dtype {image.dtype}; expected {want} "
                                f"({_dtype_field(sample, job)}); {_DTYPE_FIX}")
    size = job.dicom.size if ref.kind == "dicom" else (job.image.tile_size or job.image.size)
    if size is not None and tuple(image.shape[1:]) != tuple(size):
        return Issue.of(ref, stage="validate", reason="bad_shape",
                        message=f"{ref.path}: sample {sample.key} is {image.shape[1]}×{image.shape[2]}; "
                                f"the job asks for {size[0]}×{size[1]}")
    if image.dtype.kind == "f" and not np.isfinite(image).all():
        nan = int(np.isnan(image).sum())
        inf = int(np.isinf(image).sum())
        return Issue.of(ref, stage="validate", reason="non_finite",
                        message=f"{ref.path}: sample {sample.key} holds {nan} NaN and {inf} infinite value(s) "
                                f"(transform.dicom.output is {job.dicom.output}); use transform.dicom.output "
                                "uint8/uint16 with a window instead of float16")
    return None
