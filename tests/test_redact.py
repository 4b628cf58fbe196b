"""What an internal error prints of a message under phi: pseudonymize (:mod:`packer.redact`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from packer import redact


@pytest.fixture
def roots(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(redact.RAW_TRACEBACK_ENV, raising=False)
    redact.forget_jobs()
    redact._ROOTS.update({"/data/ct": "ct", "/data/ct2": "ct2"})
    yield
    redact.forget_jobs()


@pytest.mark.parametrize(("message", "shown"), [
    # the rest of a path under a root goes up to a quote or the line's end: a folder name may hold spaces
    ("boom at /data/ct/Doe John/1.dcm", "boom at <source ct>/…"),
    ("[Errno 2] No such file: '/data/ct2/MRN1/x.dcm'", "[Errno 2] No such file: '<source ct2>/…'"),
    ("cell 'Doe_John/1.dcm' of row 3", "cell '<path>' of row 3"),  # a relative path: no root, still a path
    ("/data/ctx/P1.dcm is odd", "<path> is odd"),  # /data/ct is no prefix of /data/ctx: a path all the same
    ("no path here: 3 files", "no path here: 3 files"),
])
def test_paths_in_a_message_are_shown_by_their_source_or_as_path(roots: None, message: str, shown: str) -> None:
    assert redact.redact_text(message) == shown


def test_a_chained_exception_keeps_its_types_and_frames_and_loses_its_paths(roots: None) -> None:
    first, second = "/data/ct/P1/a.dcm", "/data/ct2/P2/b.dcm"  # not on the raising lines, which the frames show
    try:
        try:
            raise ValueError(f"inner {first}")
        except ValueError as inner:
            raise RuntimeError(f"outer {second}") from inner
    except RuntimeError as err:
        text = redact.format_exception(err)
    assert "P1" not in text and "P2" not in text
    assert "ValueError: inner <source ct>/…\n" in text and "RuntimeError: outer <source ct2>/…\n" in text
    assert text.index("ValueError") < text.index("direct cause") < text.index("RuntimeError: outer")
    assert "in test_a_chained_exception_keeps_its_types_and_frames_and_loses_its_paths" in text


def test_without_a_pseudonymizing_job_or_with_the_variable_set_the_traceback_is_whole(
        roots: None, monkeypatch: pytest.MonkeyPatch) -> None:
    err = RuntimeError("boom at /data/ct/P1/a.dcm")
    monkeypatch.setenv(redact.RAW_TRACEBACK_ENV, "1")
    assert "boom at /data/ct/P1/a.dcm" in redact.format_exception(err)
    monkeypatch.delenv(redact.RAW_TRACEBACK_ENV)
    assert "boom at <source ct>/…" in redact.format_exception(err)
    redact.forget_jobs()
    assert "boom at /data/ct/P1/a.dcm" in redact.format_exception(err)


@pytest.mark.parametrize(("message", "shown"), [
    # a bare file name has no separator, and a hospital export's file names carry names and record numbers
    ("cannot decode Doe_John_MRN0042.dcm here", "cannot decode <path> here"),
    ("frame of IM_SMITH^ANNA.nii.gz", "frame of <path>"),
    # a header value quoted as Python quotes a value it cannot use (pydicom's DS, a KeyError's key)
    ("could not convert string to float: 'DOE^JOHN 19450317'", "could not convert string to float: '<value>'"),
    ('no entity for "MRN83746251"', 'no entity for "<value>"'),
    # what names code, not a person, stays: Python's types and builtins, DICOM keywords
    ("unsupported operand type(s) for +: 'int' and 'NoneType'", "unsupported operand type(s) for +: 'int' and "
                                                                "'NoneType'"),
    ("KeyError: 'PatientID'", "KeyError: 'PatientID'"),
    ("'NoneType' object has no attribute 'pixel_array'", "'NoneType' object has no attribute 'pixel_array'"),
])
def test_bare_file_names_and_quoted_values_are_hidden_too(roots: None, message: str, shown: str) -> None:
    assert redact.redact_text(message) == shown


def test_names_noted_from_the_data_are_hidden_wherever_a_message_puts_them(roots: None) -> None:
    """A folder or file name under a source root (without an extension: DICOM's IM0001) and a raw entity id
    are noted as the job meets them; a message that quotes one bare shows <id> instead."""
    redact.note_names(["Doe_John_MRN0042", "IM0001", "MRN83746251"])
    assert (redact.redact_text("series Doe_John_MRN0042 slice IM0001 of patient MRN83746251 (3 files)")
            == "series <id> slice <id> of patient <id> (3 files)")
    assert redact.redact_text("IM00012 is another word") == "IM00012 is another word"
    redact.note_names(["RTSTRUCT", "SEG", "imagesTr", "train"])  # folder names every export uses name nobody
    assert redact.redact_text("no RTSTRUCT or SEG in imagesTr of train") == "no RTSTRUCT or SEG in imagesTr of train"
    # nor do the words copies and scratch files are named with, which packer's own messages use
    redact.note_names(["copy", "backup", "old", "original"])
    said = "duplicate images: a copy of one's image under the other (the original, not an old backup)"
    assert redact.redact_names(said) == said
    redact.forget_jobs()
    assert redact.redact_text("slice IM0001") == "slice IM0001"  # a later command starts afresh


def test_a_noted_name_spelled_as_a_word_of_the_message_is_hidden_only_where_it_stands_as_a_name(
        roots: None) -> None:
    """A laterality-named export (left.dcm, right.dcm) noted `left`: every "left" of a message became
    <id> ("all 1 files of the job are <id> out on purpose"), and a name holding a space was replaced
    inside longer words too. Such a name is hidden quoted, as a path's part or a file name, never as
    the message's own word."""
    redact.note_names(["left", "left.dcm", "right side", "Doe John"])
    assert (redact.redact_names("all 1 files of the job are left out on purpose, on the right side")
            == "all 1 files of the job are left out on purpose, on the right side")
    assert (redact.redact_names("file 'left' in raw/left/ and left.dcm: \"right side\", scans/right side/a.dcm")
            == "file '<id>' in raw/<id>/ and <id>: \"<id>\", scans/<id>/a.dcm")
    assert redact.redact_names("patient Doe John, not Doe Johnson") == "patient <id>, not Doe Johnson"
