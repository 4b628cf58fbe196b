"""The ``image`` source kind: PNG, JPEG, TIFF and BMP files, decoded with OpenCV, labelled by a table or folders.

Lists every file with an image suffix; a file of another image format (WebP, GIF, ...; a
whole-slide scan, .svs, .ndpi, ...), an image compressed whole (``a.png.gz``) or an archive
(``photos.zip``) is left out as ``unsupported_format``, saying to convert, decompress or unpack it
(:meth:`ImageKind.unsupported`). Entity and
time come from the source's table (a file of a table-less ``label: folder`` or ``label: none``
source is its own entity). The reader is
:mod:`packer.read.image`; its samples are uint8 RGB or grey, one per page (TIFF) or tile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from packer.config import (
    ImageTransformConfig,
    JobConfig,
    LimitsConfig,
    SourceConfig,
    job_default,
    parse_size,
)
from packer.errors import ConfigError
from packer.read.archives import archive, compressed
from packer.read.image_structure import sniff_format
from packer.read.kinds import Probed, RangedFile, SourceKind, register
from packer.records import Issue, Sample, SampleRef
from packer.transform.channels import check_channels
from packer.transform.mask import transform_mask_image

#: The suffixes an image source lists.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")

#: Image files an image source finds but does not read, by suffix: each is left out as
#: ``unsupported_format`` (``excluded.jsonl``), never dropped unsaid. OpenCV decodes some of them
#: (WebP, GIF, AVIF, JPEG 2000, Netpbm), but packer's reader checks a file's size and pages from
#: its header before decoding (:mod:`packer.read.image_structure`: PNG, JPEG, TIFF and BMP only),
#: and an animated GIF's frames would be lost to a first-frame decode; so they are converted.
UNSUPPORTED_IMAGE_FORMATS = {
    ".webp": "WebP", ".gif": "GIF", ".avif": "AVIF", ".heic": "HEIC", ".heif": "HEIF", ".hif": "HEIF",
    ".heics": "HEIF", ".heifs": "HEIF", ".avifs": "AVIF", ".jxl": "JPEG XL",
    ".jp2": "JPEG 2000", ".j2k": "JPEG 2000", ".jpx": "JPEG 2000", ".jpf": "JPEG 2000", ".jls": "JPEG-LS",
    ".pbm": "Netpbm", ".pgm": "Netpbm", ".ppm": "Netpbm", ".pnm": "Netpbm", ".pfm": "PFM",
    ".exr": "OpenEXR", ".hdr": "Radiance HDR", ".ras": "Sun raster", ".sr": "Sun raster", ".tga": "TGA",
    ".ico": "ICO", ".psd": "Photoshop", ".svg": "SVG", ".qoi": "QOI", ".dng": "DNG raw", ".cr2": "Canon raw",
    ".cr3": "Canon raw", ".crw": "Canon raw", ".nef": "Nikon raw", ".nrw": "Nikon raw", ".arw": "Sony raw",
    ".orf": "Olympus raw", ".rw2": "Panasonic raw", ".raf": "Fujifilm raw", ".pef": "Pentax raw",
    ".srw": "Samsung raw", ".pcx": "PCX", ".jxr": "JPEG XR", ".wdp": "JPEG XR",
    ".hdp": "JPEG XR", ".xpm": "XPM", ".xbm": "XBM",
}

#: Suffixes of HEIF and AVIF image sequences (bursts, animations) among them: each frame becomes its own PNG
_IMAGE_SEQUENCES = frozenset({".heics", ".heifs", ".avifs"})

#: Whole-slide scans, by suffix: left out as ``unsupported_format`` too, with the route packer does
#: read (DICOM whole-slide files, whose levels a dicom source packs as tiles). Most are TIFF inside
#: (.svs, .ndpi, .scn, .bif), but a slide's base level is tens of gigapixels, its tiles in a
#: pyramid a TIFF page reader does not know.
WHOLE_SLIDE_FORMATS = {
    ".svs": "Aperio SVS", ".ndpi": "Hamamatsu NDPI", ".scn": "Leica SCN", ".mrxs": "3DHISTECH MIRAX",
    ".vsi": "Olympus VSI", ".czi": "Zeiss CZI", ".bif": "Ventana BIF",
}

#: Suffixes of formats packer reads, under a name it does not list: renaming is the fix.
RENAMED_IMAGE_SUFFIXES = {".jfif": ".jpg", ".jpe": ".jpg", ".jif": ".jpg", ".jfi": ".jpg", ".dib": ".bmp"}

#: Every image suffix an image source lists or names: such a file compressed whole (``a.png.gz``)
#: is an image, left out saying to decompress it (an archive, ``photos.zip``, is left out too)
_IMAGE_FAMILY = frozenset({*IMAGE_SUFFIXES, *UNSUPPORTED_IMAGE_FORMATS, *WHOLE_SLIDE_FORMATS,
                           *RENAMED_IMAGE_SUFFIXES, ".apng"})


class ImageKind(SourceKind):
    name = "image"
    names_masks = True
    key_parts = frozenset({"page", "tile"})
    #: Pillow decodes 8-bit grey+alpha TIFF pages (:func:`packer.read.image._pillow_grey_alpha`),
    #: so its version is in the manifest and every cache key of an image source: a Pillow upgrade
    #: reused the samples the old one decoded
    libraries = ("pillow",)

    def makes_tile(self, job: JobConfig, tile: tuple[int, int]) -> bool:
        """Only with ``transform.image.tile``, only on its stride grid and, with a ``size``, only
        inside it (without one the file's size is not known undecoded)."""
        if job.image.tile_size is None:
            return False
        (height, width), (step_r, step_c) = job.image.tile_size, job.image.tile_stride or job.image.tile_size
        row, col = tile
        if row % step_r or col % step_c:
            return False
        size = job.image.size
        return size is None or (row + height <= size[0] and col + width <= size[1])

    def nearest_tile(self, job: JobConfig, tile: tuple[int, int]) -> tuple[int, int] | None:
        """The grid's top-left pixel at or above and left of ``tile`` (rounded down to the stride),
        kept inside ``transform.image.size`` where the job resizes; without a size, whether the
        image reaches that far is not known undecoded."""
        if job.image.tile_size is None:
            return None
        (height, width), (step_r, step_c) = job.image.tile_size, job.image.tile_stride or job.image.tile_size
        row, col = tile[0] // step_r * step_r, tile[1] // step_c * step_c
        size = job.image.size
        if size is not None:  # the last tile that fits the resized image (check_job: at least one does)
            row = min(row, (size[0] - height) // step_r * step_r)
            col = min(col, (size[1] - width) // step_c * step_c)
        return row, col

    #: A file's signature decides its format (:func:`~packer.read.image_structure.sniff_format`),
    #: as the reader decides it, not its suffix: only a TIFF has pages
    key_head_bytes = 16

    def file_key_parts(self, head: bytes) -> frozenset[str]:
        """Pages and tiles of a TIFF, tiles of a PNG, JPEG or BMP (one page each), nothing of a
        file whose signature is none of them: the reader makes it no sample but its bad-sample
        record, keyed by the file id."""
        fmt = sniff_format(head)
        return frozenset() if fmt is None else frozenset({"page", "tile"} if fmt == "tiff" else {"tile"})

    def file_format(self, head: bytes) -> str | None:
        fmt = sniff_format(head)
        return None if fmt is None else fmt.upper()
    always_recorded = True
    looked_for = f"files named *{', *'.join(IMAGE_SUFFIXES)}"

    def lists(self, suffix: str) -> bool | None:
        return suffix in IMAGE_SUFFIXES

    def unsupported(self, name: str, suffix: str) -> str | None:
        read = "image sources read PNG, JPEG, TIFF and BMP files (" + ", ".join(IMAGE_SUFFIXES) + ")"
        if suffix in RENAMED_IMAGE_SUFFIXES:
            return (f"a {suffix} file is not listed: {read}; if it is one of them, rename it to "
                    f"{RENAMED_IMAGE_SUFFIXES[suffix]}")
        if suffix in WHOLE_SLIDE_FORMATS:
            return (f"a whole-slide image ({WHOLE_SLIDE_FORMATS[suffix]}, {suffix}), which packer does not read: "
                    f"{read}, and a slide is far too large to decode whole; convert it to DICOM whole-slide files "
                    "(VL Whole Slide Microscopy, e.g. with wsidicomizer) and read them with a source of kind: dicom, "
                    "which packs a level's tiles, or cut it into PNG tiles yourself (e.g. with OpenSlide)")
        if suffix == ".apng":
            return (f"an animated PNG (.apng), which packer does not read: {read}, and an animated PNG is refused "
                    "(its frames after the first would be lost); save each frame as its own PNG (e.g. ffmpeg -i "
                    "in.apng frame%04d.png), or, if it holds one frame, rename it to .png")
        packed = archive(name)
        if packed is not None:
            return packed.detail("an image source reads the files under its root")
        squeezed = compressed(name)
        if squeezed is not None and squeezed.inner_suffix in _IMAGE_FAMILY:
            return squeezed.detail("an image", read)
        what = UNSUPPORTED_IMAGE_FORMATS.get(suffix)
        if what is None:
            return None
        frames = (" (each frame of an animated one becomes its own PNG)" if suffix == ".gif" else
                  " (each frame becomes its own PNG)" if suffix in _IMAGE_SEQUENCES else "")
        article = "an" if what[0] in "AEIOUX" else "a"
        noun = "image sequence" if suffix in _IMAGE_SEQUENCES else "image"
        return (f"{article} {what} {noun} ({suffix}), which packer does not read: {read}; convert it to PNG "
                f"(lossless){frames}, e.g. with ImageMagick: magick mogrify -format png *{suffix}")

    def parse_settings(self, raw: Mapping[str, Any], shared: Mapping[str, Any]) -> ImageTransformConfig:
        tile = raw.get("tile")
        return ImageTransformConfig(
            size=parse_size(raw.get("size")),
            resize=raw.get("resize", job_default("transform.image.resize")),
            color=raw.get("color", job_default("transform.image.color")),
            alpha=raw.get("alpha", job_default("transform.image.alpha")),
            window=tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                for k, v in (raw.get("window") or {}).items())),
            tile_size=parse_size(tile["size"]) if tile else None,
            tile_stride=parse_size(tile.get("stride")) if tile else None,
            channels=raw.get("channels", shared.get("channels")),
            channels_key="transform.image.channels" if "channels" in raw else "transform.channels",
        )

    def check_job(self, job: JobConfig, sources: Sequence[SourceConfig]) -> None:
        cfg = job.image
        if sources and cfg.size is not None and cfg.tile_size is not None and (
                cfg.tile_size[0] > cfg.size[0] or cfg.tile_size[1] > cfg.size[1]):
            raise ConfigError(f"transform.image.tile.size {list(cfg.tile_size)} is larger than transform.image.size "
                              f"{list(cfg.size)}, which every image of source(s) {', '.join(s.name for s in sources)} "
                              "is resized to: no full tile fits any image. Fix: a tile.size within the size, or a "
                              "larger size")
        if not sources or cfg.channels is None:
            return
        natural = 1 if cfg.color == "gray" else 3
        fix = ("set transform.image.color: gray (its luminance)" if cfg.channels == 1
               else f"transform.image.color gives 1 (gray, replicated) or 3 (rgb) channels, not {cfg.channels}")
        check_channels(cfg.channels, natural, where=f"transform.image.color ({cfg.color})",
                       sources=[s.name for s in sources], fix=fix, key=cfg.channels_key)

    def probe(self, ref: SampleRef, source: SourceConfig, job: JobConfig, *, keep: bool,
              placement: bool, placed: Any = None) -> Probed | Issue:
        from packer.read.image import probe_image

        header = probe_image(ref, limits=job.limits)
        return header if isinstance(header, Issue) else Probed(ref=ref)

    def read(self, ref: SampleRef, job: JobConfig, state: Any = None) -> list[Sample] | Issue:
        from packer.read.image import read_image

        return read_image(ref, job.image, limits=job.limits)

    def rehearse_probe(self, ref: SampleRef, handle: RangedFile, limits: LimitsConfig) -> bool:
        from packer.read.image import probe_image_at

        probe_image_at(ref, handle.read_at, handle.size, limits=limits)  # reads through the handle
        return False

    def expected_dtype(self, sample: Sample, job: JobConfig) -> np.dtype:
        return np.dtype(np.uint8)

    def dtype_rule(self, job: JobConfig) -> str:
        return "images are always uint8"

    def expected_size(self, job: JobConfig) -> tuple[int, ...] | None:
        return job.image.tile_size or job.image.size

    def channels(self, job: JobConfig) -> int | None:
        return job.image.channels

    def mask_grid(self, metadata: Mapping[str, Any]) -> tuple[int, int, int]:
        return int(metadata.get("pages") or 1), int(metadata["source_height"]), int(metadata["source_width"])

    def mask_frames(self, samples: Sequence[Sample]) -> list[tuple[int, int]]:
        """Each full page's own stored size, in page order: the pages of a TIFF may differ in size
        (a full image and a smaller one, not flagged reduced-resolution), and each page's mask
        labels that page's grid; checking every page against page 0's packed a mask on page 0's
        grid stretched onto a smaller page."""
        sizes: dict[int, tuple[int, int]] = {}
        for sample in samples:
            sizes.setdefault(int(sample.metadata.get("page", 0)),
                             (int(sample.metadata["source_height"]), int(sample.metadata["source_width"])))
        return [sizes[page] for page in sorted(sizes)]

    def place_masks(self, samples: Sequence[Sample], mask: np.ndarray, source: SourceConfig,
                    job: JobConfig) -> list[np.ndarray]:
        """Each image sample's mask: its page's mask through the page's orientation, resize and tiles."""
        pad = source.mask.pad if source.mask is not None else 0
        by_page: dict[int, list[np.ndarray]] = {}
        # a sample's "page" is its IFD's index, which counts reduced-resolution IFDs (thumbnails) too;
        # the mask has one page per full page: the n-th full page's is mask[n] (mask[3] of 3 pages crashed)
        ordinal = {page: n for n, page in enumerate(sorted({int(s.metadata.get("page", 0)) for s in samples}))}
        out = []
        for sample in samples:
            page = int(sample.metadata.get("page", 0))
            if page not in by_page:  # tiles of one page come in transform_image's order
                tiles = transform_mask_image(mask[ordinal[page]], job.image, int(sample.metadata.get("orientation", 1)),
                                             pad)
                by_page[page] = list(reversed(tiles))
            out.append(by_page[page].pop())
        return out

    def rgb_channels(self, channels: int) -> bool:
        return channels in (3, 4)


register(ImageKind())
