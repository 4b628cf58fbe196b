"""The report's pixel sections: contact sheets and intensity histograms."""

from __future__ import annotations

from collections import Counter
from typing import Any

from packer.htmlreport.collect import NO_LABEL, ReportData, SheetItem
from packer.htmlreport.markup import CHANNEL_COLORS, esc, note, plural, split_color
from packer.htmlreport.masks import render_mask_legend
from packer.htmlreport.sections import section
from packer.htmlreport.stats import ChannelHistograms
from packer.htmlreport.svg import histogram_chart
from packer.htmlreport.thumbs import Pane
from packer.targets import Target

DISPLAY_PX = 96  # largest displayed side of a pane (thumbnails keep up to thumb_px pixels)


def _display_size(pane: Pane) -> tuple[int, int]:
    scale = min(1.0, DISPLAY_PX / max(pane.width, pane.height))
    return round(pane.width * scale), round(pane.height * scale)


#: Characters that would break a hover line (or hide in it), drawn as a visible symbol instead:
#: C0 controls as their Unicode Control Pictures (``\n`` → ``␊``, ``\t`` → ``␉``), DEL as ``␡``, and
#: C1 controls and Unicode's line and paragraph separators as their code (``\x85``, ``\u2028``)
_CONTROLS = str.maketrans({**{c: chr(0x2400 + c) for c in range(0x20)}, 0x7F: "\u2421",
                           **{c: f"\\x{c:02x}" for c in range(0x80, 0xA0)},
                           0x2028: "\\u2028", 0x2029: "\\u2029"})


def _one_line(value: object) -> str:
    """``value`` as text that stays on one line of a thumbnail's hover text, whose lines are its
    caption's fields: a label or entity id holding a line break (a quoted CSV cell) would otherwise
    start a line that passes for another field (``benign\\nentity_id: P999``)."""
    return str(value).translate(_CONTROLS)


def _cell(item: SheetItem, small: bool, target: Target) -> str:
    field = target.caption_field  # how the caption names the target (an unlabeled sample's has none)
    lines = [_one_line(item.key), *([f"{field}: {_one_line(item.label)}"] if field else []),
             f"entity_id: {_one_line(item.entity_id)}", f"source: {_one_line(item.source)}"]
    if len(item.panes) > 1 or item.panes[0].name.removesuffix(" + mask") not in ("RGB", "grey"):
        lines.append(f"channels: {', '.join(_one_line(name) for name in item.channels)}")
    if item.mask is not None:
        lines.append(f"mask: {_one_line(item.mask)}")
    if item.damaged is not None:
        lines.append(f"DAMAGED: {_one_line(item.damaged)}")
    caption = "\n".join(lines)
    imgs = []
    for pane in item.small if small else item.panes:
        w, h = _display_size(pane)
        imgs.append(f'<img src="{pane.uri}" width="{w}" height="{h}" alt="{esc(pane.name)}" '
                    f'title="{esc(caption)}&#10;shown: {esc(_one_line(pane.name))}">')
    if item.damaged is not None:  # said on the sample itself, not only in the finding at the top
        return (f'<figure class="cell damaged" data-key="{esc(item.key)}" data-damaged="checksum">'
                f'<div class="panes">{"".join(imgs)}</div><figcaption title="{esc(item.key)}: {esc(item.damaged)}">'
                f'<span class="flag">⚠ checksum failed: not what was packed</span> {esc(item.entity_id)}'
                '</figcaption></figure>')
    return (f'<figure class="cell" data-key="{esc(item.key)}"><div class="panes">{"".join(imgs)}</div>'
            f'<figcaption title="{esc(item.key)}">{esc(item.entity_id)}</figcaption></figure>')


def _channel_legend(item: SheetItem) -> str:
    names = [p.name for p in item.panes]
    if len(names) == 1:
        return ""
    ch = list(item.channels)
    if names[-1].startswith("+0 composite"):  # a neighbour stack's composite: its centre slice's windows
        ch = [name for name in ch if name.startswith("+0 ")] or ch
    if len(ch) < 2 or not names[-1].split(" + mask")[0].endswith("composite"):  # no composite pane
        return f'<span class="muted">{esc(item.source)}: {esc(" | ".join(names))}</span>'
    mix = (f"R = {ch[0]}, G = {ch[1]}, B = mean" if len(ch) == 2 else
           f"R = {ch[0]}, G = {ch[1]}, B = {ch[2]}")
    return f'<span class="muted">{esc(item.source)}: {esc(" | ".join(names))} (composite: {esc(mix)})</span>'


def _fit(items: list[SheetItem], budget: int) -> tuple[list[SheetItem], bool, int]:
    """The items that fit ``budget`` bytes of data URIs: full size, else small panes, else fewer."""
    for small in (False, True):
        if sum(i.nbytes(small) for i in items) <= budget:
            return items, small, sum(i.nbytes(small) for i in items)
    shown: list[SheetItem] = []
    used = 0
    for item in items:
        if shown and used + item.nbytes(True) > budget:
            break
        shown.append(item)
        used += item.nbytes(True)
    return shown, True, used


def render_contact_sheets(data: ReportData) -> str:
    limits = data.limits
    target = data.target
    words = target.sheet_words(NO_LABEL)
    group, prefix, hover, grouping = words.group, words.prefix, words.hover, words.grouping
    budget = int(limits.image_bytes * (1 - limits.duplicate_share))
    grids_left = sum(1 for items in data.sheets.values() if items)
    blocks = []
    for split in data.splits:
        totals = data.label_totals.get(split)
        if not totals:
            continue
        parts = []
        for label, count in totals.most_common(limits.labels_per_split):
            items = data.sheets.get((split, label), [])
            # each grid may use an equal share of what the grids before it left over
            shown, small, used = _fit(items, budget // max(1, grids_left)) if items else ([], False, 0)
            budget -= used
            grids_left -= 1 if items else 0
            legends = sorted({_channel_legend(i) for i in shown} - {""})
            dropped = len(items) - len(shown)
            extra = (" · reduced thumbnails" if small and any(i.small is not i.panes for i in shown) else "")
            extra += f" · {dropped} not shown (report size budget)" if dropped else ""
            parts.append(f'<div class="sheet"><h4>{esc(prefix + label)} <span class="muted">{len(shown)} of {count:,} '
                         f'shown{extra}</span></h4>{"<br>".join(legends)}'
                         f'<div class="grid">{"".join(_cell(i, small, target) for i in shown)}</div></div>')
        hidden = len(totals) - min(len(totals), limits.labels_per_split)
        more = note(f"{hidden} less frequent {plural(hidden, group)} not shown.", "muted") if hidden > 0 else ""
        samples = data.split_totals.get(split, sum(totals.values()))
        blocks.append(f'<details open class="split"><summary><i class="dot" style="background:{split_color(split)}">'
                      f'</i>{esc(split)} <span class="muted">{samples:,} {plural(samples, "sample")}</span></summary>'
                      f'{"".join(parts)}{more}</details>')
    unreadable = ""
    if data.unreadable:
        first = "; ".join(f"{esc(k)} ({esc(r)})" for k, r in data.unreadable[:10])
        n = len(data.unreadable)
        unreadable = note(f"{n:,} selected {plural(n, 'sample')} could not be read: {first}", "warn")
    lead = (f"Up to {limits.sheet_columns}×{limits.sheet_rows} samples per split and {group}, picked by "
            f"sha256(dataset_hash, key) so the same dataset always shows the same samples.{grouping} Multi-channel "
            f"DICOM samples show each window in grey, then a colour composite. Hover a thumbnail for its key, {hover}, "
            "entity and windows.")
    if data.manifest.get("sample_schema", {}).get("layout") == "CDHW":
        lead += (" A volume's pane holds its axial, coronal and sagittal middle planes side by side, each stretched "
                 "to H×W: the axial as packed, the coronal (the patient's right on the left) and the sagittal "
                 "(anterior on the left) with superior up.")
    if data.mask is not None:
        stacks = any(p.name.startswith("+0 ") and p.name.endswith(" + mask")
                     for items in data.sheets.values() for i in items for p in i.panes)
        over = "its last thumbnail" + (" (a neighbour stack's: its centre slice's, +0)" if stacks else "")
        lead += (f" Each sample's segmentation mask ({_mask_drawn(data.manifest)}) is drawn over {over}, "
                 "one colour per class id as the legend below says; hover for the ids its mask holds.")
    if data.index_note:
        unreadable += note(esc(data.index_note), "warn")
    body = unreadable + "".join(blocks)
    return section("contact-sheets", render_mask_legend(data) + body if body else note("No packed samples.", "muted"),
                   lead)


def _mask_drawn(manifest: dict[str, Any]) -> str:
    """Which part of a sample's mask its thumbnail shows: a volume's D×H×W label map in the
    volume's three middle planes (:func:`~packer.htmlreport.thumbs.as_chw`, as ``_render`` draws
    it), a C×H×W sample's F×H×W mask by its frame 0; both where a dataset holds both."""
    found_schema = manifest.get("sample_schema")
    schema: dict[str, Any] = found_schema if isinstance(found_schema, dict) else {}
    found_shapes = schema.get("shapes")
    shapes: dict[str, Any] = found_shapes if isinstance(found_shapes, dict) else {}
    ranks = {len(shape) for found in shapes.values() if isinstance(found, list) for shape in found
             if isinstance(shape, list)} or {4 if schema.get("layout") == "CDHW" else 3}
    volume = "a volume's label map by its three middle planes, lined up with the volume's"
    frame = "frame 0 of a multi-frame mask"
    if 4 not in ranks:
        return frame
    return volume if ranks == {4} else f"{volume}; a 2-D sample's, {frame}"


def _saturation_note(hist_sat: list[tuple[str, float, float]], flagged: set[str]) -> str:
    items = []
    for name, low, high in hist_sat:
        text = f"{esc(name)}: {low:.0%} at 0, {high:.0%} at 255"
        if name in flagged:
            items.append(f'<li class="flag" data-saturated="{esc(name)}">⚠ saturated: {text}</li>')
        else:
            items.append(f'<li>{text}</li>')
    return f'<ul class="sat">{"".join(items)}</ul>'


def _histogram_card(split: str, hist: ChannelHistograms) -> str:
    colors = ["#333"] if len(hist.names) == 1 else list(CHANNEL_COLORS)
    series = [(name, hist.counts[c].tolist(), colors[c % len(colors)]) for c, name in enumerate(hist.names)]
    flagged = {name for name, _, _ in hist.saturated()}
    dtypes = ", ".join(sorted(hist.dtypes))
    scaled = "" if dtypes == "uint8" else f" · scaled to 0-255 from {esc(dtypes)}"
    return (f'<div class="card{" flagged" if flagged else ""}" data-split="{esc(split)}"><div class="card-title">'
            f'<i class="dot" style="background:{split_color(split)}"></i>{esc(split)} '
            f'<span class="muted">{hist.samples:,} {plural(hist.samples, "sample")}{scaled}</span></div>'
            f'{histogram_chart(series, label=f"{split} histogram", width=326)}'
            f"{_saturation_note(hist.saturation(), flagged)}{_normalisation_note(hist)}</div>")


def _normalisation_note(hist: ChannelHistograms) -> str:
    """The statistics the normalised channels used (percentiles' low/high, z-score mean/std): each
    sample is scaled by its own, so the histogram alone hides how far apart its inputs were."""
    lines = hist.normalisation_notes()
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f'<ul class="sat" data-normalised="{len(lines)}"><li class="muted">normalised by each sample\'s own ' \
           f"statistics: median (range) of what they were</li>{items}</ul>"


def render_intensities(data: ReportData) -> str:
    # one block per source and channel meaning: its samples' channel names (a source may hold CT
    # slices with three windows and a radiograph whose one window was replicated)
    by_source: dict[tuple[str, int, tuple[str, ...]], dict[str, ChannelHistograms]] = {}
    for (split, source, channels, channel_names), hist in data.histograms.items():
        by_source.setdefault((source, channels, channel_names), {})[split] = hist
    groups = Counter(source for source, _, _ in by_source)
    blocks = []
    flagged_total = 0
    for (source, channels, names), per_split in sorted(  # a source's most counted channel meaning first
            by_source.items(), key=lambda kv: (kv[0][0], kv[0][1], -sum(h.samples for h in kv[1].values()), kv[0][2])):
        colors = ["#333"] if len(names) == 1 else list(CHANNEL_COLORS)
        legend = "".join(f'<span class="key"><i style="background:{colors[c % len(colors)]}"></i>{esc(name)}</span>'
                         for c, name in enumerate(names))
        cards = [_histogram_card(split, per_split[split]) for split in data.splits if split in per_split]
        flagged_total += sum(len(h.saturated()) for h in per_split.values())
        which = f": {', '.join(names)}" if groups[source] > 1 else ""
        blocks.append(f'<h3>{esc(source)} <span class="muted">{channels} channel{"s" if channels > 1 else ""}'
                      f"{esc(which)}</span></h3><div class=\"legend\">{legend}</div>"
                      f"<div class=\"cards\">{''.join(cards)}</div>")
    counted = " · ".join(f"{esc(s)} {c:,} of {t:,}" for s, (c, t) in
                         ((s, data.histogram_totals[s]) for s in data.splits if s in data.histogram_totals))
    lead = (f"Packed values per channel, 256 bins, over at most {data.limits.histogram_samples:,} samples per split "
            f"(the same seeded order as the contact sheets{f'; counted: {counted}' if counted else ''}).")
    if blocks:  # the rest describes the charts: none is drawn where no sample was packed
        lead += (" Square-root count axis scaled to the inner bins: a taller bin at 0 or 255 is cut at the top, and "
                 "its share is listed under the chart. A channel is flagged as saturated when more than half of its "
                 "pixels sit at 0 or 255.")
    summary = (note(f"<strong>{flagged_total} saturated channel(s)</strong> flagged below.", "warn") if flagged_total
               else note("No saturated channel.", "ok"))
    return section("intensities", summary + "".join(blocks) if blocks else note("No packed samples.", "muted"), lead)
