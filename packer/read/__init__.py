"""Read stage: decode raw files into pixel arrays, or bad-sample records when they cannot be.

:func:`at_boundary` is the stage's one boundary for the unexpected: the only place on the read
path that turns an exception a reader did not anticipate into a bad-sample record
(``unexpected_error``). The readers' public entry points (:func:`packer.read.dicom.read_dicom`,
:func:`packer.read.image.read_image`, :func:`packer.read.nifti.read_nifti`, and
:func:`read_sample`, which asks the registry of source kinds, :mod:`packer.read.kinds`, for the
reader) each pass through it exactly once; inside, the readers catch only the specific exceptions they
expect, and report how far they got through a :class:`ReadProgress` instead of catching.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from packer.errors import out_of_memory
from packer.records import Issue, Sample, SampleRef

if TYPE_CHECKING:
    from packer.config import JobConfig


class ReadProgress:
    """How far a reader got with one file: the pipeline stage it is in (``read``, then
    ``validate``, then ``transform``). A reader moves ``stage`` on as it goes, so that the
    boundary names the stage an unforeseen exception came from."""

    __slots__ = ("needed", "stage")

    def __init__(self, stage: str = "read") -> None:
        self.stage = stage
        self.needed: int | None = None  # bytes decoding needs, once the reader has read the header


def at_boundary(ref: SampleRef, read: Callable[[ReadProgress], list[Sample] | Issue], *,
                name: str = "") -> list[Sample] | Issue:
    """``read(progress)``, or the ``unexpected_error`` Issue of what it raised: stage
    ``progress.stage`` (``read`` unless the reader moved it on), message ``{name}: {type}: {text}``
    (without ``{name}: `` when ``name`` is empty; ``name`` is how the reader names the file in
    its messages). One bad file must not end the job, so this catches every ``Exception``, but
    one: running out of memory (a MemoryError, which a reader also raises for a library's own
    failed allocation) is the machine's condition, not the file's, and raises
    :class:`~packer.errors.ResourceError` naming the file and ``progress.needed`` (the bytes its
    pixels need, where the reader knew them): as a bad sample it was cached and the file dropped
    from every later build."""
    progress = ReadProgress()
    try:
        return read(progress)
    except MemoryError as err:
        raise out_of_memory(err, name or ref.path, needed=progress.needed) from err
    except Exception as err:  # noqa: BLE001 - the read stage's one boundary: one bad file must not end the job
        prefix = f"{name}: " if name else ""
        return Issue.of(ref, stage=progress.stage, reason="unexpected_error",
                        message=f"{prefix}{type(err).__name__}: {err}")


def read_sample(ref: SampleRef, job: JobConfig, *, state: Any = None) -> list[Sample] | Issue:
    """Decode, validate and transform one raw file with the reader its kind registered
    (:mod:`packer.read.kinds`).

    ``state``: what the kind's probe kept for the read (a DICOM file as
    ``packer.pipeline.probe.probe_for_read`` parsed it: not parsed again).

    An exception a reader did not anticipate becomes an ``unexpected_error`` issue naming its
    type (:func:`at_boundary`, which each reader passes through once), never a crashed job. An
    unusable setting raises :class:`~packer.errors.ConfigError`: a defect of the run.
    """
    from packer.read.kinds import source_kind

    return source_kind(ref.kind).read(ref, job, state)
