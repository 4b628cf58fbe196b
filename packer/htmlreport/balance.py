"""What the report says about a dataset's targets, one way per target kind (:mod:`packer.targets`).

class: the label balance per split (100 % stacked bars, samples per label and split);
multilabel: per label the share of each split's samples that hold it (those shares do not add
up: a sample may hold several labels); numeric: per target name a histogram of its values per
split and the min/mean/max; none: a note that the dataset is unlabeled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from packer.htmlreport.collect import NO_LABEL, ReportData
from packer.htmlreport.markup import esc, note, num, palette, plural, split_color, swatch_legend, table
from packer.htmlreport.stats import ValueHistogram
from packer.htmlreport.svg import histogram_chart, prevalence_chart, share_chart
from packer.targets import ClassTarget, MultiLabelTarget, NoTarget, NumericTarget
from packer.targets.unlabeled import UNLABELED

LABEL_ROWS = 50


def target_fact(data: ReportData) -> tuple[str, str, str]:
    """The summary's facts entry for the targets: (name, value HTML, ``data-field``)."""
    fact = data.target.report_fact(data.manifest.get("label_map", {}))
    aside = f' <span class="muted">{esc(fact.aside)}</span>' if fact.aside else ""
    return fact.name, esc(fact.value) + aside, fact.field


@dataclass(frozen=True)
class _Balance:
    """The splits section's target part, one rendering per target kind (a
    :class:`~packer.targets.TargetRenderer`)."""

    data: ReportData

    def render_class(self, target: ClassTarget) -> str:
        return _class_balance(self.data)

    def render_multilabel(self, target: MultiLabelTarget) -> str:
        return _multilabel_balance(self.data)

    def render_numeric(self, target: NumericTarget) -> str:
        return _numeric_values(self.data)

    def render_none(self, target: NoTarget) -> str:
        return ('<h3>Label balance</h3><p class="muted" data-field="unlabeled">'
                f"{UNLABELED}: the samples carry no label or target, so there is no balance to show.</p>")


def render_balance(data: ReportData) -> str:
    """The part of the splits section that shows the targets (see the module's docstring)."""
    return data.target.render(_Balance(data))


def _class_balance(data: ReportData) -> str:
    splits = data.manifest.get("splits", {})
    labels = list(data.manifest.get("label_map", {}))
    for split in data.splits:
        labels += [k for k in splits[split].get("class_counts", {}) if k not in labels]
    if not any(int(count) for s in data.splits for count in splits[s].get("class_counts", {}).values()):
        # no split counts a labelled sample (every input file bad): no legend, bars or table to draw
        return ('<h3>Label balance</h3><p class="muted" data-field="no-labelled-samples">No labelled sample was '
                "packed, so there is no balance to show.</p>")
    colors = palette(labels)
    share = share_chart([(s, [(lab, int(splits[s].get("class_counts", {}).get(lab, 0))) for lab in labels])
                         for s in data.splits], colors, label="label balance per split")
    label_rows = []
    for lab in labels[:LABEL_ROWS]:
        cells = [int(splits[s].get("class_counts", {}).get(lab, 0)) for s in data.splits]
        label_rows.append(f'<tr><th scope="row"><i class="dot" style="background:{colors[lab]}"></i>{esc(lab)}</th>'
                          + "".join(num(c) for c in cells) + num(sum(cells)) + "</tr>")
    more = _more_labels(len(labels))
    counts = table(["label", *data.splits, "total"], label_rows, table_id="label-counts", cls="data compact",
                   numeric=tuple(range(1, len(data.splits) + 2)))
    legend = swatch_legend({k: colors[k] for k in labels[:LABEL_ROWS]})
    return (f"<h3>Label balance</h3>{legend}{share}"
            f"<details><summary>Samples per label and split</summary>{counts}{more}</details>")


def _more_labels(labels: int) -> str:
    """The note under a label table cut at :data:`LABEL_ROWS` rows; empty where it is not cut."""
    rest = labels - LABEL_ROWS
    return note(f"{rest:,} more {plural(rest, 'label')} not listed.", "muted") if rest > 0 else ""


def multilabel_counts(data: ReportData) -> dict[str, dict[str, int]]:
    """Per split, how many samples hold each label: the manifest's ``class_counts``, or where a
    split records none, the count over the index's ``target`` column."""
    out: dict[str, dict[str, int]] = {}
    for split in data.splits:
        recorded = data.manifest.get("splits", {}).get(split, {}).get("class_counts")
        if isinstance(recorded, dict) and recorded:
            out[split] = {str(k): int(v) for k, v in recorded.items()}
        else:
            counted = data.label_totals.get(split, Counter[str]())
            out[split] = {name: counted[name] for name in data.target.names}
    return out


def _multilabel_balance(data: ReportData) -> str:
    counts = multilabel_counts(data)
    labels = list(data.target.names)
    for per_split in counts.values():
        labels += [k for k in per_split if k not in labels]
    samples = {s: int(data.manifest.get("splits", {}).get(s, {}).get("samples", data.split_totals.get(s, 0)))
               for s in data.splits}
    colors = {s: split_color(s) for s in data.splits}
    chart = prevalence_chart([(lab, [(s, counts[s].get(lab, 0), samples[s]) for s in data.splits])
                              for lab in labels[:LABEL_ROWS]], colors, label="share of samples holding each label")
    rows = []
    for lab in labels[:LABEL_ROWS]:
        cells = [counts[s].get(lab, 0) for s in data.splits]
        rows.append(f'<tr data-label="{esc(lab)}"><th scope="row">{esc(lab)}</th>'
                    + "".join(_share_cell(c, samples[s]) for c, s in zip(cells, data.splits, strict=True))
                    + _share_cell(sum(cells), sum(samples.values())) + "</tr>")
    if any(NO_LABEL in data.label_totals.get(s, ()) for s in data.splits):  # counted from the index
        cells = [data.label_totals.get(s, Counter[str]())[NO_LABEL] for s in data.splits]
        rows.append(f'<tr data-label="{esc(NO_LABEL)}"><th scope="row" class="muted">{esc(NO_LABEL)}</th>'
                    + "".join(_share_cell(c, samples[s]) for c, s in zip(cells, data.splits, strict=True))
                    + _share_cell(sum(cells), sum(samples.values())) + "</tr>")
    foot = ('<tr><th scope="row">samples</th>' + "".join(num(samples[s]) for s in data.splits)
            + num(sum(samples.values())) + "</tr>")
    more = _more_labels(len(labels))
    table_html = table(["label", *data.splits, "total"], rows, table_id="label-counts", cls="data compact",
                       foot=foot, numeric=tuple(range(1, len(data.splits) + 2)))
    return (f"<h3>Label balance</h3><p class=\"muted\">Multi-label: per label, the share of each split's samples "
            f"that hold it. A sample may hold several labels or none, so the shares do not add up to 100 %."
            f"</p>{swatch_legend(colors)}{chart}"
            f"<details><summary>Samples per label and split</summary>{table_html}{more}</details>")


def _share_cell(count: int, total: int) -> str:
    share = f" ({count / total:.0%})" if total else ""
    return (f'<td class="num" data-value="{int(count)}" title="{count:,} of {total:,} samples">'
            f'{int(count):,}<span class="muted">{share}</span></td>')


def _number(value: float) -> str:
    return f"{value:.6g}"


def _recorded_stats(data: ReportData, split: str, name: str) -> tuple[float, float, float] | None:
    """(min, mean, max) of target ``name`` in ``split`` as the manifest's ``target_stats`` records them."""
    stats: Any = data.manifest.get("splits", {}).get(split, {}).get("target_stats", {})
    entry = stats.get(name) if isinstance(stats, dict) else None
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), int | float) for k in ("min", "mean", "max")):
        return None
    return float(entry["min"]), float(entry["mean"]), float(entry["max"])


def _value_card(hist: ValueHistogram, split: str, stats: tuple[float, float, float] | None) -> str:
    counts = hist.counts.get(split)
    low, high = float(hist.edges[0]), float(hist.edges[-1])
    ticks = [(0.0, _number(low)), (0.5, _number((low + high) / 2)), (1.0, _number(high))]
    chart = (histogram_chart([(split, counts.tolist(), split_color(split))], label=f"{hist.name} in {split}",
                             width=326, ticks=ticks, clip_ends=False)
             if counts is not None and counts.sum() else note("no values", "muted"))
    counted = hist.stats.get(split)
    samples = int(counted[0]) if counted else 0
    facts = ("min {} · mean {} · max {}".format(*map(_number, stats)) if stats else "-")
    return (f'<div class="card" data-split="{esc(split)}" data-target="{esc(hist.name)}"><div class="card-title">'
            f'<i class="dot" style="background:{split_color(split)}"></i>{esc(split)} '
            f'<span class="muted">{samples:,} {plural(samples, "sample")}</span></div>{chart}'
            f'<p class="muted">{facts}</p></div>')


def _numeric_values(data: ReportData) -> str:
    names = list(data.target.names)
    by_name = {h.name: h for h in data.value_histograms}
    blocks, rows = [], []
    for name in names:
        hist = by_name.get(name)
        for split in data.splits:
            stats = _recorded_stats(data, split, name)
            if stats is None and hist is not None and split in hist.stats:
                stats = hist.stats[split][1:]
            cells = "".join(f'<td class="num">{_number(v)}</td>' for v in stats) if stats else '<td colspan="3">-</td>'
            rows.append(f'<tr data-target="{esc(name)}" data-split="{esc(split)}"><th scope="row">{esc(name)}</th>'
                        f"<td>{esc(split)}</td>{cells}</tr>")
        if hist is not None:
            cards = "".join(_value_card(hist, split, _recorded_stats(data, split, name) or (
                hist.stats[split][1:] if split in hist.stats else None)) for split in data.splits)
            blocks.append(f'<h4>{esc(name)}</h4><div class="cards">{cards}</div>')
    stats_table = table(["target", "split", "min", "mean", "max"], rows, table_id="target-stats", cls="data compact",
                        numeric=(2, 3, 4))
    where = ("Histograms of every sample's values (from the index), bins shared by the splits; min, mean and max "
             "as the manifest records them (target_stats)." if blocks else
             "The index holds no target values: only the manifest's min, mean and max are shown.")
    return f'<h3>Target values</h3><p class="muted">Numeric targets: {esc(", ".join(names) or "-")}. {where}</p>' + (
        "".join(blocks) + stats_table)
