"""Hand-written inline SVG charts: horizontal bars, 100 % stacked bars, grouped share bars,
histograms, a timeline.

Every function returns one ``<svg>`` element as a string. Text goes through ``html.escape``;
each mark carries a ``<title>`` so hovering shows the exact number (no JavaScript). Inline
SVG inside HTML needs no ``xmlns`` attribute, so none is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from html import escape

FONT = 'font-family="inherit" font-size="12"'
MUTED = "#5b6572"
GRID = "#e3e7ec"


def _f(value: float) -> str:
    """A short SVG coordinate: one decimal, trailing zeros dropped."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _open(width: float, height: float, label: str) -> str:
    return (f'<svg class="chart" width="{_f(width)}" height="{_f(height)}" viewBox="0 0 {_f(width)} {_f(height)}" '
            f'role="img" aria-label="{escape(label)}" {FONT}>')


def bar_chart(rows: Sequence[tuple[str, int]], *, label: str, color: str = "#4c72b0", width: int = 520,
              label_width: int = 170, bar_height: int = 16, gap: int = 6) -> str:
    """Horizontal bars, one per (name, count), scaled to the largest count; empty rows give an empty chart."""
    top = max((v for _, v in rows), default=0) or 1
    height = gap + len(rows) * (bar_height + gap)
    span = width - label_width - 56
    parts = [_open(width, height, label)]
    for i, (name, value) in enumerate(rows):
        y = gap + i * (bar_height + gap)
        w = max(span * value / top, 1.5 if value else 0)
        base = y + bar_height * 0.75
        parts.append(
            f"<g><title>{escape(name)}: {value:,}</title>"
            f'<text x="{label_width - 8}" y="{_f(base)}" text-anchor="end" fill="#1f2933">'
            f"{escape(_clip(name, 26))}</text>"
            f'<rect x="{label_width}" y="{y}" width="{_f(w)}" height="{bar_height}" rx="2" fill="{color}"/>'
            f'<text x="{_f(label_width + w + 6)}" y="{_f(base)}" fill="{MUTED}">{value:,}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def share_chart(rows: Sequence[tuple[str, Sequence[tuple[str, int]]]], colors: Mapping[str, str], *, label: str,
                width: int = 760, label_width: int = 110, bar_height: int = 22, gap: int = 10) -> str:
    """One 100 % stacked bar per row (e.g. per split), segments (e.g. labels) coloured by ``colors``.

    A segment wide enough shows its percentage; every segment's ``<title>`` gives count and share.
    """
    height = gap + len(rows) * (bar_height + gap)
    span = width - label_width - 8
    parts = [_open(width, height, label)]
    for i, (row, segments) in enumerate(rows):
        y = gap + i * (bar_height + gap)
        total = sum(v for _, v in segments)
        parts.append(f'<text x="{label_width - 10}" y="{_f(y + bar_height * 0.7)}" text-anchor="end" '
                     f'fill="#1f2933">{escape(_clip(row, 16))}</text>')
        if not total:
            parts.append(f'<rect x="{label_width}" y="{y}" width="{span}" height="{bar_height}" fill="none" '
                         f'stroke="{GRID}"/><text x="{label_width + 8}" y="{_f(y + bar_height * 0.7)}" '
                         f'fill="{MUTED}">no samples</text>')
            continue
        x = float(label_width)
        for name, value in segments:
            if not value:
                continue
            w = span * value / total
            share = value / total
            parts.append(f'<g><title>{escape(row)} · {escape(name)}: {value:,} ({share:.1%})</title>'
                         f'<rect x="{_f(x)}" y="{y}" width="{_f(w)}" height="{bar_height}" '
                         f'fill="{colors.get(name, "#999")}" stroke="#fff" stroke-width="1"/>')
            if w >= 38:
                parts.append(f'<text x="{_f(x + w / 2)}" y="{_f(y + bar_height * 0.7)}" text-anchor="middle" '
                             f'fill="#fff" font-size="11">{share:.0%}</text>')
            parts.append("</g>")
            x += w
    parts.append("</svg>")
    return "".join(parts)


def prevalence_chart(rows: Sequence[tuple[str, Sequence[tuple[str, int, int]]]], colors: Mapping[str, str], *,
                     label: str, width: int = 760, label_width: int = 150, bar_height: int = 9,
                     gap: int = 10) -> str:
    """Per row (e.g. a label) one thin bar per series (e.g. a split) of ``(series, count, total)``:
    the share ``count / total`` on one 0-100 % axis, coloured by ``colors[series]``.

    Unlike :func:`share_chart` the rows' shares need not add up (a sample may hold several
    labels); each bar's ``<title>`` gives count, total and share.
    """
    span = width - label_width - 48
    block = max((len(series) for _, series in rows), default=0) * bar_height
    height = gap + len(rows) * (block + gap) + 14
    parts = [_open(width, height, label)]
    for share in (0.0, 0.5, 1.0):
        x = label_width + span * share
        parts.append(f'<line x1="{_f(x)}" y1="{gap - 4}" x2="{_f(x)}" y2="{height - 14}" stroke="{GRID}"/>'
                     f'<text x="{_f(x)}" y="{height - 3}" text-anchor="middle" fill="{MUTED}" '
                     f'font-size="10">{share:.0%}</text>')
    for i, (name, series) in enumerate(rows):
        y0 = gap + i * (block + gap)
        parts.append(f'<text x="{label_width - 10}" y="{_f(y0 + block / 2 + 4)}" text-anchor="end" '
                     f'fill="#1f2933">{escape(_clip(name, 22))}</text>')
        for j, (part, count, total) in enumerate(series):
            share = count / total if total else 0.0
            y = y0 + j * bar_height
            w = span * share
            parts.append(f"<g><title>{escape(name)} · {escape(part)}: {count:,} of {total:,} samples ({share:.1%})"
                         f'</title><rect x="{label_width}" y="{y}" width="{_f(max(w, 1.0 if count else 0.0))}" '
                         f'height="{bar_height - 1}" fill="{colors.get(part, "#999")}"/>'
                         f'<text x="{_f(label_width + w + 4)}" y="{_f(y + bar_height - 1.5)}" fill="{MUTED}" '
                         f'font-size="9">{share:.0%}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def histogram_chart(series: Sequence[tuple[str, Sequence[int], str]], *, label: str, width: int = 340,
                    height: int = 130, ticks: Sequence[tuple[float, str]] | None = None,
                    clip_ends: bool = True) -> str:
    """Overlaid histograms (name, counts, colour) on a square-root count axis: by default of 256
    bins of pixel values, ticked 0-255.

    With ``clip_ends`` the axis is scaled to the tallest inner bin (1-254) over all channels, so
    the shapes compare and a spike at 0 or 255 (clipping, background) does not flatten everything
    else: a taller end bin is cut at the top (its share belongs in the text next to the chart).
    Other values (a numeric target's) pass ``ticks``, (position 0-1 along the axis, text) each,
    and ``clip_ends=False``: their end bins are the smallest and largest values, not clipping.
    """
    left, right, top_pad, bottom = 8, 12, 6, 18
    plot_w, plot_h = width - left - right, height - top_pad - bottom
    inner = [max(c[1:-1]) for _, c, _ in series if len(c) > 2] if clip_ends else []
    peak = max(inner, default=0) or max((max(c) for _, c, _ in series if len(c)), default=0) or 1
    root = math.sqrt(peak)
    parts = [_open(width, height, label),
             f'<rect x="{left}" y="{top_pad}" width="{plot_w}" height="{plot_h}" fill="#fafbfc" stroke="{GRID}"/>']
    marks = [(plot_w * tick / 255, str(tick)) for tick in (0, 64, 128, 192, 255)] if ticks is None else [
        (plot_w * where, text) for where, text in ticks]
    for offset, text in marks:
        x = left + offset
        anchor = "start" if ticks is not None and offset <= 0 else (
            "end" if ticks is not None and offset >= plot_w else "middle")
        parts.append(f'<line x1="{_f(x)}" y1="{top_pad}" x2="{_f(x)}" y2="{top_pad + plot_h}" stroke="{GRID}"/>'
                     f'<text x="{_f(x)}" y="{height - 4}" text-anchor="{anchor}" fill="{MUTED}" '
                     f'font-size="10">{escape(text)}</text>')
    for name, counts, color in series:
        n = len(counts)
        if not n:
            continue
        points = " ".join(f"{_f(left + plot_w * i / max(n - 1, 1))},"
                          f"{_f(top_pad + plot_h * (1 - min(math.sqrt(c) / root, 1.0)))}"
                          for i, c in enumerate(counts))
        base = top_pad + plot_h
        parts.append(f"<g><title>{escape(name)}</title>"
                     f'<polygon points="{_f(left)},{_f(base)} {points} {_f(left + plot_w)},{_f(base)}" '
                     f'fill="{color}" fill-opacity="0.12"/>'
                     f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.4"/></g>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_chart(ranges: Sequence[tuple[str, datetime, datetime, str]], cutoffs: Sequence[tuple[str, datetime]],
                   *, label: str, width: int = 760, label_width: int = 110, row_height: int = 18,
                   gap: int = 12) -> str:
    """Per-row time spans (name, start, end, colour) on one date axis, cutoffs as dashed lines.

    Positions and tick dates are offsets from the earliest moment (``t - lo``), never
    ``timestamp()``/``fromtimestamp``: those read a naive datetime (the report's times are
    naive UTC) in the building process's local zone, so ``TZ`` moved the marks and, across a
    DST change, labelled a tick with another day."""
    moments = [t for _, a, b, _ in ranges for t in (a, b)] + [t for _, t in cutoffs]
    if not moments:
        return ""
    lo, hi = min(moments), max(moments)
    span_s = max((hi - lo).total_seconds(), 86400.0)
    pad = span_s * 0.03
    scale = (width - label_width - 20) / (span_s + 2 * pad)
    axis_top = 20 if cutoffs else 6
    height = axis_top + len(ranges) * (row_height + gap) + 22

    def x_of(t: datetime) -> float:
        return label_width + ((t - lo).total_seconds() + pad) * scale

    parts = [_open(width, height, label)]
    axis_y = height - 20
    parts.append(f'<line x1="{label_width}" y1="{axis_y}" x2="{width - 20}" y2="{axis_y}" stroke="{MUTED}"/>')
    for k in range(5):
        t = lo + timedelta(seconds=span_s * k / 4)
        x = x_of(t)
        parts.append(f'<line x1="{_f(x)}" y1="{axis_y}" x2="{_f(x)}" y2="{axis_y + 4}" stroke="{MUTED}"/>'
                     f'<text x="{_f(x)}" y="{axis_y + 15}" text-anchor="middle" fill="{MUTED}" font-size="10">'
                     f'{escape(t.strftime("%Y-%m-%d"))}</text>')
    for i, (name, start, end, color) in enumerate(ranges):
        y = axis_top + gap / 2 + i * (row_height + gap)
        x1, x2 = x_of(start), x_of(end)
        parts.append(f'<text x="{label_width - 10}" y="{_f(y + row_height * 0.75)}" text-anchor="end" '
                     f'fill="#1f2933">{escape(_clip(name, 16))}</text>'
                     f'<g><title>{escape(name)}: {escape(start.isoformat())} → {escape(end.isoformat())}</title>'
                     f'<rect x="{_f(x1)}" y="{_f(y)}" width="{_f(max(x2 - x1, 3))}" height="{row_height}" rx="2" '
                     f'fill="{color}"/></g>')
    for name, t in cutoffs:
        x = x_of(t)
        parts.append(f'<g><title>cutoff {escape(name)}: {escape(t.isoformat())}</title>'
                     f'<line x1="{_f(x)}" y1="{axis_top - 4}" x2="{_f(x)}" y2="{axis_y}" stroke="#b03a2e" '
                     f'stroke-dasharray="4 3" stroke-width="1.3"/>'
                     f'<text x="{_f(x)}" y="{axis_top - 7}" text-anchor="middle" fill="#b03a2e" font-size="11">'
                     f'{escape(name)} ≥ {escape(t.strftime("%Y-%m-%d"))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
