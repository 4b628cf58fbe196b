"""Turn packed C×H×W samples into small PNG data URIs: one pane per channel plus a composite.

Display rules (the contact sheet states them too):
- a sample whose kind says its 3 or 4 channels are colour (an image source: its source kind's
  ``rgb_channels``, :mod:`packer.read.kinds`) is shown as its RGB image (alpha dropped);
- a single channel is shown as grey, and so is a sample whose one channel ``transform.channels``
  replicated (metadata ``channels.rule: replicate``), once;
- otherwise (DICOM windows, or any other multi-channel sample) each channel is shown in
  grey side by side, followed by a composite: C=2 puts the channels in R and G with
  B = their mean, C≥3 shows the first three channels as RGB;
- a 2.5D neighbour stack (metadata ``neighbors``: slices −k…+k, each with its windows) shows
  each slice's first window, named by its offset (``-1 lung``, ``+0 lung``, ``+1 lung``), then
  the composite of the centre slice's windows (``+0 composite``), which is what it is about;
- a grey DICOM sample packed as its modality values (``output: float16`` with no window:
  ``metadata.windows`` empty) whose metadata says it displays inverted (``photometric_interpretation``
  MONOCHROME1 or ``presentation_lut_shape`` INVERSE: its minimum displays white, PS3.3
  C.7.6.3.1.2, C.11.6.1.2) is drawn inverted, as the window applied later inverts it and as
  a windowed (uint8, uint16) or normalised build of the same file packs it (:func:`shown_inverted`).

A sample with a segmentation mask shows it over its last pane (the sole one, the RGB image or the
composite; a neighbour stack's, the centre slice's mask, over its centre slice's: ``+0 composite``,
or with one window ``+0 …``) as a translucent colour per class id (:func:`mask_overlay`): one fixed
colour-blind-safe colour per id (:data:`MASK_COLORS`: Okabe and Ito's seven, then Paul Tol's muted nine), background
0 transparent, the id that ``fit`` pads with in grey where it is no class (a pad id that is a named
class is drawn as that class); of an F×H×W mask, frame 0; of a volume's D×H×W label map, its three
middle planes, lined up with the volume's (:func:`as_chw`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.opencv import cv2
from packer.read.kinds import shows_rgb

MAX_SIDE = 128
#: Colours of mask class ids 1, 2, …: Okabe & Ito (2008) without black, then Paul Tol's "muted";
#: they repeat from id 17 on (:func:`mask_color`)
MASK_COLORS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
               "#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933", "#AA4499")
PAD_COLOR = "#BBBBBB"  # the id resize ``fit`` pads masks with, where it is not 0
MASK_ALPHA = 0.45      # opacity of a mask's colour over its image


@dataclass(frozen=True)
class Pane:
    """One displayed image: what it shows (``name``), its data URI, its pixel size."""

    name: str
    uri: str
    width: int
    height: int

    @property
    def nbytes(self) -> int:
        return len(self.uri)


def to_display(image: np.ndarray) -> np.ndarray:
    """Map a packed array of any numeric dtype to uint8 of the same shape.

    uint8 is returned as is; other integers are scaled from their dtype's full range (so a
    uint16 window output keeps its meaning); floats in [0, 1] are scaled by 255, other floats
    by their own finite min and max (NaN and inf become 0).
    """
    arr = np.asarray(image)
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        scaled = (arr.astype(np.float64) - info.min) * (255.0 / (float(info.max) - info.min))
        return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    values = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(values.min(initial=0.0)), float(values.max(initial=0.0))
    if lo >= 0.0 and hi <= 1.0:
        lo, hi = 0.0, 1.0
    scaled = (values - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(values)
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def shown_inverted(image: np.ndarray, info: dict[str, Any]) -> bool:
    """Whether a packed sample's values still need inverting to display: float values packed with
    no window (DICOM ``output: float16``, modality values as stored; ``metadata.windows`` empty)
    whose record says they display inverted (``photometric_interpretation`` MONOCHROME1, or
    ``presentation_lut_shape`` INVERSE; both together invert once, README Transforms step 5).
    False where a window or a normalisation rendered them: those are inverted already."""
    metadata = info.get("metadata")
    if np.asarray(image).dtype.kind != "f" or not isinstance(metadata, dict) or metadata.get("windows"):
        return False
    return (metadata.get("photometric_interpretation") == "MONOCHROME1"
            or metadata.get("presentation_lut_shape") == "INVERSE")


def display_channels(image: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """C×H×W uint8 of a packed sample as it displays: :func:`as_chw`, :func:`to_display`, and
    inverted where its values are not yet (:func:`shown_inverted`)."""
    chw = to_display(as_chw(image))
    return 255 - chw if shown_inverted(image, info) else chw


def as_chw(image: np.ndarray) -> np.ndarray:
    """A 2-D array becomes 1×H×W; a 3-D array is taken as C×H×W (packer's layout); a 4-D one as
    a C×D×H×W volume, shown by its three middle planes side by side (axial D, coronal H,
    sagittal W, each resized to H×W by nearest neighbour so the panes line up).

    A packed volume's D runs inferior → superior (H posterior, W the patient's left), so the
    coronal and sagittal planes, whose rows are D, are flipped to put superior up, as a viewer
    and ``transform.nifti.axis: coronal`` slices show them (the patient's right on the left of
    the coronal pane, anterior on the left of the sagittal one); the axial plane is as stored."""
    arr = np.asarray(image)
    if arr.ndim == 2:
        return arr[None]
    if arr.ndim == 4:
        _, d, h, w = arr.shape
        planes = [arr[:, d // 2], arr[:, ::-1, h // 2], arr[:, ::-1, :, w // 2]]
        rows = [np.clip(np.round(np.linspace(0, p.shape[1] - 1, h)), 0, None).astype(int) for p in planes]
        cols = [np.clip(np.round(np.linspace(0, p.shape[2] - 1, w)), 0, None).astype(int) for p in planes]
        return np.concatenate([p[:, r][:, :, c] for p, r, c in zip(planes, rows, cols, strict=True)], axis=2)
    if arr.ndim != 3:
        raise ValueError(f"expected an H×W, C×H×W or C×D×H×W array, got shape {arr.shape}")
    return arr


PNG_LEVEL = 3


def png_data_uri(image: np.ndarray, max_side: int = MAX_SIDE) -> Pane:
    """Encode an H×W (grey) or H×W×3 (RGB) uint8 image, shrunk to ``max_side``, as a PNG data URI."""
    h, w = image.shape[:2]
    if max(h, w) > max_side:
        scale = max_side / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    bgr = cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 else image
    # zlib level 3: on 128 px CT and photo thumbnails 2.3x faster than level 6 and 7x faster than
    # level 9 (which took ~4 s of a 10k build's report), for files 5% larger than level 6's.
    ok, data = cv2.imencode(".png", np.ascontiguousarray(bgr), [cv2.IMWRITE_PNG_COMPRESSION, PNG_LEVEL])
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} {image.dtype} image as PNG")
    return Pane(name="", uri="data:image/png;base64," + base64.b64encode(data.tobytes()).decode("ascii"),
                width=int(image.shape[1]), height=int(image.shape[0]))


def neighbour_layout(info: dict[str, Any], channels: int) -> tuple[int, int] | None:
    """(k, channels per slice) of a 2.5D neighbour stack whose record says so and whose
    ``channels`` agree (2k + 1 slices of that many channels each), else None."""
    metadata = info.get("metadata")
    stack = metadata.get("neighbors") if isinstance(metadata, dict) else None
    if not isinstance(stack, dict):
        return None
    k, per_slice = stack.get("k"), stack.get("channels_per_slice")
    if not isinstance(k, int) or not isinstance(per_slice, int) or k < 0 or per_slice < 1:
        return None
    return (k, per_slice) if (2 * k + 1) * per_slice == channels else None


def channel_names(info: dict[str, Any], kind: str, channels: int) -> list[str]:
    """Names of the channels: DICOM window names from ``metadata.windows``, each prefixed by its
    slice's offset in a neighbour stack (``-1 lung``), else R/G/B(/A), else ch0…; the copies of
    a channel that ``transform.channels`` replicated (metadata ``channels.rule: replicate``) are
    named for it and numbered (``file (1/3)``, ``grey (2/3)``)."""
    mapped = (info.get("metadata") or {}).get("channels") if isinstance(info.get("metadata"), dict) else None
    if channels > 1 and isinstance(mapped, dict) and mapped.get("rule") == "replicate":
        base = channel_names(info, kind, 1)[0]
        return [f"{base} ({i + 1}/{channels})" for i in range(channels)]
    windows = (info.get("metadata") or {}).get("windows") if isinstance(info.get("metadata"), dict) else None
    stack = neighbour_layout(info, channels)
    per_slice = stack[1] if stack is not None else channels
    if isinstance(windows, list) and len(windows) == per_slice:
        names = []
        for i, window in enumerate(windows):
            if isinstance(window, dict) and window.get("name"):
                names.append(str(window["name"]))
            elif isinstance(window, dict) and "center" in window and "width" in window:
                names.append(f"C{window['center']:g} W{window['width']:g}")
            else:
                names.append(f"ch{i}")
        if stack is None:
            return names
        return [f"{offset:+d} {name}" for offset in range(-stack[0], stack[0] + 1) for name in names]
    if stack is not None:
        return [f"{offset:+d} ch{c}" for offset in range(-stack[0], stack[0] + 1) for c in range(per_slice)]
    if shows_rgb(kind, channels):
        return ["R", "G", "B", "A"][:channels]
    if channels == 1:
        return ["grey"]
    return [f"ch{i}" for i in range(channels)]


def composite(image: np.ndarray) -> np.ndarray:
    """H×W×3 RGB uint8 from a C×H×W uint8 array (C=2: R, G = channels, B = their mean)."""
    if image.shape[0] == 2:
        mean = ((image[0].astype(np.uint16) + image[1]) // 2).astype(np.uint8)
        return np.dstack([image[0], image[1], mean])
    return np.dstack([image[0], image[1], image[2]])


def mask_color(class_id: int, pad: int | None = None) -> str | None:
    """The colour of mask class ``class_id`` (None: 0, the background, is not drawn); ``pad``: the
    id ``fit`` pads with where it is no class (:attr:`~packer.htmlreport.collect.MaskSchema.pad_only`),
    drawn grey unless it is 0; a pad id that is a named class takes that class's colour, so pass None."""
    if class_id == 0:
        return None
    if pad is not None and class_id == pad:
        return PAD_COLOR
    return MASK_COLORS[(class_id - 1) % len(MASK_COLORS)]


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def mask_overlay(display: np.ndarray, mask: np.ndarray, max_side: int = MAX_SIDE,
                 pad: int | None = None) -> np.ndarray:
    """H×W×3 RGB uint8: ``display`` (H×W grey or H×W×3 RGB uint8) shrunk to ``max_side`` as
    :func:`png_data_uri` shrinks it, with ``mask`` (H×W class ids on its grid, shrunk by nearest
    neighbour) blended over it at :data:`MASK_ALPHA` in each id's :func:`mask_color`."""
    h, w = display.shape[:2]
    if mask.shape != (h, w):
        raise ValueError(f"a {mask.shape} mask does not lie on a {(h, w)} image")
    if max(h, w) > max_side:
        scale = max_side / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        display = cv2.resize(display, size, interpolation=cv2.INTER_AREA)
        mask = cv2.resize(np.ascontiguousarray(mask), size, interpolation=cv2.INTER_NEAREST_EXACT)
    rgb = np.dstack([display] * 3) if display.ndim == 2 else display
    out = rgb.astype(np.float32)
    for class_id in np.unique(mask).tolist():
        color = mask_color(int(class_id), pad)
        if color is not None:
            where = mask == class_id
            out[where] = out[where] * (1 - MASK_ALPHA) + np.array(_rgb(color), np.float32) * MASK_ALPHA
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def sample_panes(image: np.ndarray, info: dict[str, Any], kind: str, max_side: int = MAX_SIDE,
                 max_channels: int = 4, mask: np.ndarray | None = None, pad: int | None = None) -> list[Pane]:
    """The panes that show one sample (see the module docstring for the rules); ``mask``: the
    sample's H×W class ids, drawn over the last pane (named ``… + mask``); of a neighbour stack,
    whose mask is its centre slice's, over the centre slice's (``+0 composite``, or ``+0 …``)."""
    chw = display_channels(image, info)
    mapped = (info.get("metadata") or {}).get("channels") if isinstance(info.get("metadata"), dict) else None
    shown: list[tuple[str, np.ndarray]]
    on = -1  # the pane the mask is drawn over: the last, but a neighbour stack's centre slice's
    if isinstance(mapped, dict) and mapped.get("rule") == "replicate":
        # transform.channels repeated one channel: show it once, named for what it was
        shown = [(f"{channel_names(info, kind, 1)[0]} ×{chw.shape[0]}", chw[0])]
    elif chw.shape[0] == 1:
        shown = [(channel_names(info, kind, 1)[0], chw[0])]
    elif shows_rgb(kind, chw.shape[0]):
        shown = [("RGB", composite(chw))]
    elif (stack := neighbour_layout(info, chw.shape[0])) is not None:
        k, per_slice = stack
        names = channel_names(info, kind, chw.shape[0])
        slices = [(names[s * per_slice], chw[s * per_slice]) for s in range(2 * k + 1)]
        centre = len(slices) // 2  # the centre and the nearest neighbours first, when not all fit
        order = sorted(range(len(slices)), key=lambda s: (abs(s - centre), s))[:max_channels]
        shown = [slices[s] for s in sorted(order)]
        if per_slice > 1:
            shown.append(("+0 composite", composite(centre_slice(chw, stack))))
        else:  # no composite: the mask, the centre slice's, goes on the +0 pane, not on a neighbour
            on = sorted(order).index(centre)
    else:
        names = channel_names(info, kind, chw.shape[0])
        shown = [(names[c], chw[c]) for c in range(min(chw.shape[0], max_channels))]
        shown.append(("composite", composite(chw)))
    if mask is not None and mask.shape == chw.shape[1:]:
        name, under = shown[on]
        shown[on] = (f"{name} + mask", mask_overlay(under, mask, max_side, pad))
    return [_named(png_data_uri(array, max_side), name) for name, array in shown]


def centre_slice(chw: np.ndarray, stack: tuple[int, int]) -> np.ndarray:
    """The centre slice's channels of a neighbour stack of layout ``stack`` (k, channels per slice)."""
    k, per_slice = stack
    return chw[k * per_slice:(k + 1) * per_slice]


def composite_pane(image: np.ndarray, max_side: int = MAX_SIDE, info: dict[str, Any] | None = None) -> Pane:
    """One pane for a sample: RGB composite for C ≥ 2, grey for C = 1; of a neighbour stack
    (``info``, its record, says so), its centre slice's."""
    chw = display_channels(image, info or {})
    stack = neighbour_layout(info or {}, chw.shape[0])
    if stack is not None:
        chw = centre_slice(chw, stack)
    if chw.shape[0] == 1:
        return _named(png_data_uri(chw[0], max_side), "grey")
    return _named(png_data_uri(composite(chw), max_side), "composite")


def _named(pane: Pane, name: str) -> Pane:
    return Pane(name=name, uri=pane.uri, width=pane.width, height=pane.height)
