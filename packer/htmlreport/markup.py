"""Small HTML helpers shared by the sections: escaping, numbers, colours, tables."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

SPLIT_COLORS = {"train": "#4c72b0", "valid": "#dd8452", "test": "#55a868"}
_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
            "#64b5cd")
CHANNEL_COLORS = ("#c0392b", "#27ae60", "#2e6fd8", "#7f8c8d")


def esc(value: Any) -> str:
    """``html.escape`` of ``str(value)``, quotes included (safe in text and attribute values)."""
    return html.escape(str(value), quote=True)


def palette(names: Iterable[str]) -> dict[str, str]:
    """A stable colour per name: ten muted colours, then golden-angle hues."""
    out = {}
    for i, name in enumerate(names):
        out[name] = _PALETTE[i] if i < len(_PALETTE) else f"hsl({(i * 137.508) % 360:.0f},42%,52%)"
    return out


def split_color(split: str) -> str:
    return SPLIT_COLORS.get(split, "#7f8c8d")


def num(value: int, field: str | None = None) -> str:
    """A right-aligned count cell; ``field`` names it for tests and tools (``data-field``)."""
    attr = f' data-field="{esc(field)}"' if field else ""
    return f'<td class="num"{attr} data-value="{int(value)}">{int(value):,}</td>'


def table(headers: Sequence[str], rows: Iterable[str], *, table_id: str | None = None, cls: str = "",
          foot: str = "", numeric: Sequence[int] = ()) -> str:
    """A table from ready-made ``<tr>`` rows; ``numeric`` header indexes are right-aligned."""
    ident = f' id="{esc(table_id)}"' if table_id else ""
    num_cls = ' class="num"'
    head = "".join(f'<th{num_cls if i in numeric else ""}>{esc(h)}</th>' for i, h in enumerate(headers))
    tfoot = f"<tfoot>{foot}</tfoot>" if foot else ""
    return (f'<table{ident} class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody>{tfoot}</table>')


def swatch_legend(colors: dict[str, str]) -> str:
    items = "".join(f'<span class="key"><i style="background:{c}"></i>{esc(n)}</span>' for n, c in colors.items())
    return f'<div class="legend">{items}</div>'


def plural(count: int, one: str, many: str = "") -> str:
    """The noun for ``count`` things: ``one`` for a count of 1, else ``many`` (``one`` + "s"
    unless given), as in ``f"{n:,} {plural(n, 'group')}"``: "1 group", "2 groups", "0 entities"."""
    return one if count == 1 else many or one + "s"


def note(text: str, cls: str = "note") -> str:
    return f'<p class="{esc(cls)}">{text}</p>'
