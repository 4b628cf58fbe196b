"""Damaged or unusual SEG and RTSTRUCT files, read as the README says they are: a SEG on a
multi-frame CT whose Source Image references omit Referenced Frame Number (PS3.3 Table 10-3: the
reference applies to every frame), annotations cut short inside the UIDs that link them, a SEG
cut where its Pixel Data should start, and the contour numbers an RTSTRUCT's notes print."""

from __future__ import annotations

from pathlib import Path

from packer.read.annotations import Painter
from packer.read.rtstruct import paint_rtstruct
from tests.test_rtstruct import MAP, closed, rtstruct, save, series

SQUARE = [(4.0, 4.0), (4.0, 20.0), (20.0, 20.0), (20.0, 4.0)]


def test_an_rtstruct_note_numbers_its_contours_from_one_as_its_refusals_do(tmp_path: Path) -> None:
    """The 2nd ContourSequence item says 9 points and holds 4: its note names it contour 2, as the
    reader's refusals name it ("ContourSequence item 2"), never 1 (the first item, which is fine)."""
    slices = series()
    contours = [closed(slices[k], SQUARE) for k in (3, 4, 5)]
    ds = rtstruct([("Heart", contours)])
    ds.ROIContourSequence[0].ContourSequence[1].NumberOfContourPoints = 9
    path = save(ds, tmp_path / "rs.dcm")
    painter = Painter(shape=(len(slices), slices[0].rows, slices[0].columns), structures=MAP, path=path)
    drawn = paint_rtstruct(path, slices, MAP, painter)
    assert drawn.notes == ("ROI 'Heart': 1 contours whose NumberOfContourPoints disagrees with ContourData "
                           "(ContourData used): contours 2",)
    assert all(painter.labels[k].any() for k in (3, 4, 5))
