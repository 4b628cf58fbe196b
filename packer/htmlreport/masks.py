"""What the report says about a dataset's segmentation masks (the manifest's ``mask``).

Only a dataset with masks gets any of it (a dataset without keeps its report's bytes): a
summary fact (dtype, layout, declared class ids, pad id), a legend of the overlay colours next
to the contact sheets (:func:`packer.htmlreport.thumbs.mask_color`), and in the splits section
the share of mask pixels per class id and the number of empty masks per split, counted over the
masks of the histogram samples (every mask of a split up to ``histogram_samples`` samples; the
text says which).
"""

from __future__ import annotations

from packer.htmlreport.collect import MaskSchema, ReportData
from packer.htmlreport.markup import esc, note, num, plural, table
from packer.htmlreport.stats import MaskCounts
from packer.htmlreport.thumbs import MASK_ALPHA, MASK_COLORS, mask_color

MASK_ROWS = 50  # class ids listed in the table and the legend


def _ids_text(ids: tuple[int, ...]) -> str:
    return ", ".join(map(str, ids))


def mask_fact(data: ReportData) -> str | None:
    """The summary's facts value for the masks (HTML); None without masks."""
    mask = data.mask
    if mask is None:
        return None
    classes = (f"classes {esc(_ids_text(mask.classes))}" if mask.classes is not None
               else "classes not declared (any id)")
    pad = f" · fit pads with {mask.pad}" if mask.pad else ""
    if mask.pad_class:
        pad += f" ({esc(mask.pad_class)})"
    layout = esc(data.manifest.get("mask", {}).get("layout", "FHW"))
    return f'{esc(mask.dtype)} {layout}: {classes} <span class="muted">(0 background{pad})</span>'


def mask_class_ids(data: ReportData) -> list[int]:
    """The class ids the report names: the declared ones and any other id a read mask holds."""
    declared = set(data.mask.classes or ()) if data.mask is not None else set()
    return sorted(declared | data.mask_ids)


def _name(class_id: int, mask: MaskSchema) -> str:
    if class_id == 0:
        return "0 background"
    if class_id == mask.pad_only:
        return f"{class_id} (pad)"
    name = dict(mask.names).get(class_id)
    return f"{class_id} {name}" if name else str(class_id)


def _swatch(class_id: int, mask: MaskSchema, cls: str = "") -> str:
    """The colour box of ``class_id`` (the background's is empty: it is not drawn)."""
    color = mask_color(class_id, mask.pad_only)
    style = "background:transparent;border:1px solid #9aa5b1" if color is None else f"background:{color}"
    attr = f' class="{cls}"' if cls else ""
    return f'<i{attr} style="{style}"></i>'


def render_mask_legend(data: ReportData) -> str:
    """The overlay's colours by class id, above the contact sheets ('' without masks)."""
    mask = data.mask
    if mask is None:
        return ""
    ids = mask_class_ids(data)
    keys = "".join(f'<span class="key" data-mask-id="{i}">{_swatch(i, mask)}{esc(_name(i, mask))}</span>'
                   for i in ids[:MASK_ROWS])
    drawn = [i for i in ids if i and i != mask.pad_only]
    repeat = (f' <span class="muted">(colours repeat every {len(MASK_COLORS)} ids)</span>'
              if drawn and max(drawn) > len(MASK_COLORS) else "")
    rest = len(ids) - MASK_ROWS
    more = f' <span class="muted">… {rest:,} more {plural(rest, "id")}</span>' if rest > 0 else ""
    return (f'<div class="legend" id="mask-legend"><strong>Mask overlay</strong> <span class="muted">'
            f"({MASK_ALPHA:.0%} opaque; 0 is not drawn)</span>{keys}{more}{repeat}{_pad_class_note(mask)}</div>")


def _pad_class_note(mask: MaskSchema) -> str:
    """Where the pad id is a named class: that resize ``fit``'s padding carries the class's id,
    so it shows (and counts) as that class ('' otherwise)."""
    if mask.pad_class is None:
        return ""
    return (f' <span class="muted" data-field="mask-pad-class">(where a resize padded, the padding is'
            f" {esc(_name(mask.pad or 0, mask))} too: the job pads masks with its id)</span>")


def _share_cell(counts: MaskCounts | None, class_id: int, split: str) -> str:
    """The share of ``class_id`` among the counted mask pixels (``data-value``: its pixels)."""
    if counts is None:
        return '<td class="num muted">-</td>'
    pixels, total = counts.pixels[class_id], sum(counts.pixels.values())
    share = pixels / total if total else 0.0
    text = f"{share:.1%}" if pixels == 0 or share >= 0.001 else "&lt;0.1%"
    return (f'<td class="num" data-field="mask-pixels.{class_id}.{esc(split)}" data-value="{pixels}" '
            f'title="{pixels:,} of {total:,} mask pixels">{text}</td>')


def render_mask_classes(data: ReportData) -> str:
    """The splits section's masks part: pixels per class id and empty masks per split ('' without masks)."""
    mask = data.mask
    if mask is None:
        return ""
    splits = [s for s in data.splits if s in data.split_totals] or list(data.splits)
    per_split = {s: data.mask_counts.get(s) for s in splits}
    pooled = MaskCounts()
    for counts in per_split.values():
        if counts is not None:
            pooled.pixels.update(counts.pixels)
            pooled.samples += counts.samples
            pooled.empty += counts.empty
    ids = mask_class_ids(data)
    rows = [f'<tr data-mask-id="{i}"><th scope="row">{_swatch(i, mask, "dot")}'
            f"{esc(_name(i, mask))}</th>" + "".join(_share_cell(per_split[s], i, s) for s in splits)
            + _share_cell(pooled if pooled.samples else None, i, "total") + "</tr>" for i in ids[:MASK_ROWS]]
    empty = "".join(num(c.empty if c else 0, f"mask-empty.{s}") for s, c in per_split.items())
    counted = "".join(num(c.samples if c else 0, f"mask-samples.{s}") for s, c in per_split.items())
    foot = (f'<tr data-field="mask-empty"><th scope="row">empty masks</th>{empty}'
            f"{num(pooled.empty, 'mask-empty.total')}</tr>"
            f'<tr data-field="mask-samples"><th scope="row">masks counted</th>{counted}'
            f"{num(pooled.samples, 'mask-samples.total')}</tr>")
    shares = table(["class id", *splits, "total"], rows, table_id="mask-classes", cls="data compact", foot=foot,
                   numeric=tuple(range(1, len(splits) + 2)))
    every = all((c.samples if c else 0) >= data.split_totals.get(s, 0) for s, c in per_split.items())
    over = ("every sample's mask" if every else
            f"a sample: the masks of at most {data.limits.histogram_samples:,} samples per split, the seeded "
            "selection of the intensity histograms")
    pad = f" and the pad id {mask.pad_only}" if mask.pad_only else ""
    padded = (f" The pixels of {esc(_name(mask.pad or 0, mask))} include fit's padding where a resize padded: the "
              "job pads masks with its id." if mask.pad_class is not None else "")
    rest, unreadable = len(ids) - MASK_ROWS, len(data.unreadable)
    more = note(f"{rest:,} more class {plural(rest, 'id')} not listed.", "muted") if rest > 0 else ""
    unread = (note(f"{unreadable:,} selected {plural(unreadable, 'sample')} could not be read and "
                   f"{plural(unreadable, 'is', 'are')} not counted.", "warn") if unreadable else "")
    return (f'<h3 id="masks">Masks</h3><p class="muted">Share of mask pixels per class id (every frame counted) and '
            f"masks that hold no id but 0{pad} (empty), per split, over {over}.{padded}</p>{shares}{more}{unread}")
