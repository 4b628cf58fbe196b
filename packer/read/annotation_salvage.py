"""What a DICOM file that does not parse still shows of itself, where it may be a SEG or RTSTRUCT.

With masks from DICOM (``mask: {from: dicom}``) an annotation too damaged to parse (a file cut
inside its file meta, a preamble overwritten so ``DICM`` is gone, a header that pydicom cannot
read past some element) would otherwise be only its own ``unreadable``/``not_dicom`` record,
and the series it annotates, referenced by no annotation, would pack with all-zero masks under
``empty: keep``: a labelled lesion silently becomes background. :func:`salvage_refs` looks at
the file's bytes for what still says what it is:

1. **Its class.** The file meta's Media Storage SOP Class UID (0002,0002), read element by
   element as far as the group goes; else an annotation's SOP class UID (Segmentation, Label Map
   Segmentation, RT Structure Set) anywhere in its bytes: an image never holds one (an
   annotation holds its images' classes, not the other way round). A file meta that names
   another class whole is that class: not an annotation, its record stays as it is.
2. **Its references.** A file known to be an annotation is parsed again leniently (pydicom's
   ``force``, with the ``DICM`` marker put back where the preamble lost it); what parses gives
   its Study Instance UID, series, instances and frame of reference, as an intact header would
   (:func:`~packer.read.annotations.annotation_refs`).

The outcome is an :class:`~packer.read.annotations.AnnotationRefs` marked ``damaged`` with the
file's own reason and message: linking (:func:`packer.read.dicom_masks.link`) keeps the file's
record and ties it to the series it names, or may belong to. A file whose bytes say nothing
(``modality`` ""; it still looks like DICOM: a ``DICM`` marker or a group 0002/0008 element at
its start) is only *possibly* an annotation: its record names the series it may belong to, and
the build warns (:func:`packer.read.dicom_masks.possible_annotations_warning`). Bytes that do
not look like DICOM at all (a README, a JPEG) give None: nothing to say.
"""

from __future__ import annotations

import io
import re
import struct

import pydicom
from pydicom.dataset import Dataset

from packer.read.annotations import ANNOTATION_CLASSES, AnnotationRefs, annotation_modality, annotation_refs
from packer.read.dicom_meta import meta_elements

#: The most of a damaged file read to salvage it (its header; a SEG's pixels come last).
SALVAGE_BYTES = 64 << 20
#: An annotation's SOP class UID in a file's bytes, as a whole UID (not the start of a longer one).
_ANNOTATION_UID = re.compile(b"(" + b"|".join(re.escape(uid.encode()) for uid in ANNOTATION_CLASSES)
                             + rb")(?![0-9.])")
#: The start of a data set without file meta: a group 0008 element (implicit or explicit VR little endian).
_DATASET_START = (b"\x08\x00", b"\x02\x00")


def _meta_class(data: bytes) -> tuple[str, bool]:
    """The file meta's Media Storage SOP Class UID (0002,0002) as far as the bytes hold it, and
    whether its value is whole (the element ends within the bytes)."""
    for element, at, length in meta_elements(data):
        if element == 0x0002:
            value = data[at:at + length]
            return value.rstrip(b"\0 ").decode("ascii", "replace"), at + length <= len(data)
    return "", False


def _dataset_class(data: bytes) -> tuple[str, bool]:
    """The data set's SOP Class UID (0008,0016) where its element is found in the bytes (explicit
    or implicit VR little endian), and whether its value is whole."""
    for head in (b"\x08\x00\x16\x00UI", b"\x08\x00\x16\x00"):
        at = data.find(head, 132 if data[128:132] == b"DICM" else 0)
        if at < 0 or at + 8 > len(data):
            continue
        length = (int(struct.unpack_from("<H", data, at + 6)[0]) if len(head) == 6
                  else int(struct.unpack_from("<I", data, at + 4)[0]))
        start = at + 8
        value = data[start:start + length]
        if length > 64 or not re.fullmatch(rb"[0-9.]*[\x00 ]?", value):
            continue
        return value.rstrip(b"\0 ").decode("ascii"), start + length <= len(data)
    return "", False


def _looks_dicom(data: bytes) -> bool:
    return data[128:132] == b"DICM" or data[:2] in _DATASET_START


def _lenient_parse(data: bytes) -> Dataset | None:
    """The data set pydicom reads from ``data`` with ``force`` (``DICM`` put back where the
    preamble lost it), or None where it cannot read one."""
    candidates = [data]
    if data[128:132] != b"DICM" and len(data) > 132 and data[132:134] == b"\x02\x00":
        candidates.insert(0, bytes(128) + b"DICM" + data[132:])
    for candidate in candidates:
        try:
            ds = pydicom.dcmread(io.BytesIO(candidate), force=True, stop_before_pixels=True)
        except Exception:  # noqa: BLE001 - any parse failure: the next candidate, then the bytes alone
            continue
        if len(ds):
            return ds
    return None


def salvage_refs(data: bytes, reason: str, why: str) -> AnnotationRefs | None:
    """What the bytes ``data`` of a file that does not parse (its record: ``reason``, ``why``,
    the message without the path) show of an annotation (see the module docstring): an
    annotation's references marked ``damaged`` (``modality`` "" where nothing tells what the
    file is), or None where the file is plainly not one (its file meta names another class
    whole, or its bytes do not look like DICOM)."""
    for stored, whole in (_meta_class(data), _dataset_class(data)):
        if stored and whole and stored not in ANNOTATION_CLASSES:
            return None  # an image (or other object) whose own record is all there is to say
    stored, _ = _meta_class(data)
    modality = ANNOTATION_CLASSES.get(stored, "")
    if not modality:
        found = _ANNOTATION_UID.search(data)
        modality = ANNOTATION_CLASSES[found.group(1).decode()] if found else ""
    if not modality and not _looks_dicom(data):
        return None
    if modality:
        why = (f"{why}. Its bytes still show a {modality} (its SOP Class UID): the series it annotates is not "
               "packed without it (its records name this file); re-export or re-copy it")
    damaged = AnnotationRefs(modality=modality, study_uid="", series_uids=(), instance_uids=(),
                             frames_of_reference=(), damaged=why, damaged_reason=reason)
    ds = _lenient_parse(data) if modality else None
    if ds is None:
        return damaged
    try:
        refs = annotation_refs(ds)
    except Exception:  # noqa: BLE001 - a damaged sequence: the study alone, where it reads
        try:
            study = str(ds.get("StudyInstanceUID", "") or "").strip()
        except Exception:  # noqa: BLE001 - nor that: the class alone
            study = ""
        return AnnotationRefs(modality=modality, study_uid=study, series_uids=(), instance_uids=(),
                              frames_of_reference=(), damaged=why, damaged_reason=reason)
    return AnnotationRefs(modality=annotation_modality(ds) or modality, study_uid=refs.study_uid,
                          series_uids=refs.series_uids, instance_uids=refs.instance_uids,
                          frames_of_reference=refs.frames_of_reference, structures=refs.structures,
                          damaged=why, damaged_reason=reason)
