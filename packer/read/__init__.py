"""Read stage: decode raw files into pixel arrays, or bad-sample records when they cannot be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from packer.records import Issue, Sample, SampleRef

if TYPE_CHECKING:
    from packer.config import JobConfig


def read_sample(ref: SampleRef, job: JobConfig, *, dataset: Any = None) -> list[Sample] | Issue:
    """Decode, validate and transform one raw file with the reader for its kind.

    ``dataset``: the DICOM file as ``discover.probe_for_read`` parsed it (not parsed again).

    This is the stage's one boundary for the unexpected: an exception a reader did not
    anticipate becomes an ``unexpected_error`` issue naming its type, never a crashed job.
    """
    from packer.read.dicom import read_dicom
    from packer.read.image import read_image

    try:
        if ref.kind == "dicom":
            return read_dicom(ref, job.dicom, limits=job.limits,
                              allow_burned_in=job.safety.burned_in_annotation == "allow", dataset=dataset)
        return read_image(ref, job.image, limits=job.limits)
    except Exception as err:  # noqa: BLE001 - the stage boundary: one bad file must not end the job
        return Issue.of(ref, stage="read", reason="unexpected_error",
                        message=f"{ref.path}: {type(err).__name__}: {err}")
