"""NIfTI sources, checked against references packer does not share code with (:mod:`nifti_files`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from nifti_files import ANTERIOR, RIGHT, SUPERIOR, build_nifti, grid, write_nifti

AXIAL = grid("axial", RIGHT, ANTERIOR, SUPERIOR, (3.0, 3.5, 5.0))


def test_ct_in_hounsfield_units_is_windowed_in_hounsfield_units(tmp_path: Path) -> None:
    """CT stored as int16 HU + 1024 with ``scl_inter = -1024`` (as dcm2niix writes it): air
    (-1000 HU) is black, water (0 HU) is the abdomen window's mid-grey, bone (+1000 HU) white."""
    hu = np.full((8, 8, 4), -1000, dtype=np.int16)
    hu[2:6, 2:6] = 0
    hu[3:5, 3:5] = 1000
    (tmp_path / "raw").mkdir()
    write_nifti(tmp_path / "raw" / "ct.nii", (hu + 1024).astype(np.int16), AXIAL.affine, slope=1.0, inter=-1024.0)
    packed = build_nifti(tmp_path, [{"path": "ct.nii", "entity": "ct"}],
                         {"windows": ["abdomen"], "sample": "volume"})
    [key] = packed.of_entity("ct")
    image = packed.images[key][0]
    # abdomen: centre 50, width 400 → 0 HU is ((0 - 49.5) / 399 + 0.5) · 255 = 95.9 → 96
    assert sorted(np.unique(image).tolist()) == [0, 96, 255]
