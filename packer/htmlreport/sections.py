"""The report's sections that come from the manifest and the bad-sample report.

Each ``render_*`` function returns one ``<section>`` whose ``<h2>`` carries a stable id
(``SECTION_IDS``); the pixel sections live in ``imagery.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from packer.badsamples import failed_build
from packer.buildwarnings import WARNINGS_FILE
from packer.exclusions import unmapped_count
from packer.files import human_bytes
from packer.htmlreport.balance import render_balance, target_fact
from packer.htmlreport.collect import ReportData
from packer.htmlreport.findings import AuditFindings, DuplicateGroup
from packer.htmlreport.markup import esc, note, num, plural, split_color, table
from packer.htmlreport.masks import mask_fact, render_mask_classes
from packer.htmlreport.svg import bar_chart, timeline_chart
from packer.htmlreport.thumbs import Pane
from packer.inspection import SPLITS_TABLE, total_entities
from packer.storage import is_url

SECTION_IDS = {
    "summary": "Summary",
    "splits": "Splits",
    "contact-sheets": "Contact sheets",
    "intensities": "Intensities",
    "bad-samples": "Bad samples",
    "leakage-audit": "Leakage audit",
}


def section(ident: str, body: str, lead: str = "") -> str:
    intro = f'<p class="lead">{lead}</p>' if lead else ""
    return f'<section class="block"><h2 id="{esc(ident)}">{esc(SECTION_IDS[ident])}</h2>{intro}{body}</section>'


def _fact(name: str, value: str, *, field: str | None = None, mono: bool = False) -> str:
    attr = f' data-field="{esc(field)}"' if field else ""
    cls = ' class="mono"' if mono else ""
    return f"<div><dt>{esc(name)}</dt><dd{attr}{cls}>{value}</dd></div>"


def _pretty(value: Any) -> str:
    return esc(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str))


def without_paths(value: Any) -> Any:
    """``value`` with every ``path`` entry dropped (audit findings carry raw relative paths)."""
    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items() if k != "path"}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    return value


def _redacted_table(value: Any, what: str) -> Any:
    """A source's ``labels`` or ``table`` with its file paths (a string, or an object's ``file``,
    ``path_base`` and each ``join``'s ``file``) replaced by ``<WHAT>``-style placeholders."""
    if isinstance(value, str):
        return f"<{what}>"
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key in ("file", "path_base"):
        if isinstance(out.get(key), str):
            out[key] = f"<{what} {key}>"
    if isinstance(out.get("join"), list):
        out["join"] = [{**j, "file": f"<{what} join {n} file>"} if isinstance(j, dict) and "file" in j else j
                       for n, j in enumerate(out["join"], 1)]
    return out


def config_shown(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's job config as the report shows it: as recorded, except that a pseudonymized
    dataset's report names no job path (a source's ``root``, ``labels``, ``table``, a split list's
    file, the pinned table, the PHI key file), as those can name a patient's folder; each is shown as
    ``<root of source 'NAME'>`` and the like. The manifest keeps them (but for their names that may
    identify a patient, recorded as ``<id>``: :meth:`~packer.config.JobConfig.manifest_config`):
    they are the dataset's identity."""
    config = manifest.get("config") or {}
    if (manifest.get("phi") or {}).get("mode") != "pseudonymize" or not isinstance(config, dict):
        return config
    shown = dict(config)
    if isinstance(config.get("sources"), list):
        sources = []
        for n, source in enumerate(config["sources"]):
            if not isinstance(source, dict):
                sources.append(source)
                continue
            name = source.get("name", n)
            source = dict(source)
            if "root" in source:
                source["root"] = f"<root of source {name!r}>"
            for key in ("labels", "table"):
                if key in source:
                    source[key] = _redacted_table(source[key], f"{key} of source {name!r}")
            sources.append(source)
        shown["sources"] = sources
    split = config.get("split")
    if isinstance(split, dict) and isinstance(split.get("lists"), dict):
        lists = {name: (f"<list of split {name!r}>" if isinstance(item, str) else
                        {**item, "file": f"<list of split {name!r}>"} if isinstance(item, dict) and "file" in item
                        else item)
                 for name, item in split["lists"].items()}
        shown["split"] = split = {**split, "lists": lists}
    if isinstance(split, dict) and split.get("pinned"):
        shown["split"] = {**split, "pinned": "<pinned table>"}
    phi = config.get("phi")
    if isinstance(phi, dict) and phi.get("key_file"):
        shown["phi"] = {**phi, "key_file": "<key file>"}
    return shown


def _constant_slices(inputs: dict[str, Any]) -> str:
    """The series slices packed though constant (an all-air edge slice), when there are some."""
    count = int(inputs.get("constant_slices") or 0)
    return f"; {count:,} constant slice{'s' if count != 1 else ''} packed as series context" if count else ""


def _left_out(inputs: dict[str, Any]) -> str:
    """The input files left out on purpose (``excluded.jsonl``), so that the summary's samples,
    bad samples and these account for every input file."""
    count = sum(int(n) for n in (inputs.get("excluded") or {}).values())
    return (f'; {count:,} left out on purpose (<a href="#excluded">listed under Bad samples</a>)'
            if count else "")


def _non_finite_filled(inputs: dict[str, Any]) -> str:
    """The NIfTI files packed with NaN or infinite voxels replaced (transform.nifti.non_finite), when there are some."""
    count = int(inputs.get("non_finite_filled") or 0)
    return f"; {count:,} file{'s' if count != 1 else ''} with NaN/infinite voxels filled" if count else ""


def render_summary(data: ReportData) -> str:
    m = data.manifest
    splits = m.get("splits", {})
    bad = m.get("bad_samples", {})
    inputs = m.get("inputs", {})
    files = int(inputs.get("files", 0))
    schema = m.get("sample_schema", {})
    dtypes = schema.get("dtypes") or {}  # each source's, where they differ
    shapes = "; ".join(f"{esc(src)} {' / '.join('×'.join(map(str, s)) for s in shp)}"
                       + (f" {esc('/'.join(dtypes[src]))}" if src in dtypes else "")
                       for src, shp in schema.get("shapes", {}).items()) or "-"
    target_name, target_value, target_field = target_fact(data)
    facts = [
        _fact("Name", esc(m.get("name", "?")), field="name"),
        _fact("Version", esc(m.get("version", "?")), field="version", mono=True),
        _fact("Created", esc(m.get("created_at", "?")), field="created_at"),
        _fact("Format", esc(m.get("format", "?")), field="format"),
        _fact("Dataset hash", esc(m.get("dataset_hash", "?")), field="dataset_hash", mono=True),
        _fact("Config hash", esc(m.get("config_hash", "?")), field="config_hash", mono=True),
        _fact("Samples", f'{int(inputs.get("samples", 0)):,} <span class="muted">from '
              f'{files:,} input {plural(files, "file")}{_left_out(inputs)}{_constant_slices(inputs)}'
              f'{_non_finite_filled(inputs)}</span>', field="inputs.samples"),
        _fact("Bad samples", f'{int(bad.get("total", 0)):,} ({float(bad.get("fraction", 0)):.1%}, '
              f'limit {float(bad.get("max_fraction", 0)):.1%})', field="bad_samples.total"),
        _fact(target_name, target_value, field=target_field),
        _fact("Sample schema", f'{esc(schema.get("dtype") or "mixed")} {esc(schema.get("layout", ""))}: {shapes}'),
        _fact("packer", esc(m.get("packer_version", "?")), field="packer_version"),
    ]
    masks = mask_fact(data)
    if masks is not None:  # after the sample schema
        facts.insert(10, _fact("Masks", masks, field="mask"))
    phi = m.get("phi")
    if isinstance(phi, dict):
        facts.insert(9, _fact("PHI", esc(", ".join(f"{k} {v}" for k, v in phi.items() if k != "key_fingerprint")
                                          or "-"), field="phi"))
    rows, totals = [], [0, 0, 0, 0]
    for split in data.splits:
        entry = splits[split]
        shards = entry.get("shards", [])
        size = sum(int(s.get("bytes", 0)) for s in shards)
        values = [int(entry.get("samples", 0)), int(entry.get("entities", 0)), len(shards), size]
        totals = [t + v for t, v in zip(totals, values, strict=True)]
        rows.append(f'<tr data-split="{esc(split)}"><th scope="row"><i class="dot" style="background:'
                    f'{split_color(split)}"></i>{esc(split)}</th>'
                    + num(values[0], "samples") + num(values[1], "entities") + num(values[2], "shards")
                    + f'<td class="num" data-field="bytes" data-value="{size}" title="{size:,} bytes">'
                      f'{esc(human_bytes(size))}</td></tr>')
    # distinct entities: an entity in two splits (a given split, leaks accepted) counts once
    entities = total_entities(m, data.folder / SPLITS_TABLE)
    foot = ('<tr data-split="total"><th scope="row">total</th>' + num(totals[0], "samples")
            + (num(entities, "entities") if entities is not None else
               '<td class="num" data-field="entities" title="entities in several splits">?</td>')
            + num(totals[2], "shards") + f'<td class="num" data-field="bytes" data-value="{totals[3]}" '
            f'title="{totals[3]:,} bytes">{esc(human_bytes(totals[3]))}</td></tr>')
    counts = table(["split", "samples", "entities", "shards", "bytes"], rows, table_id="summary-counts",
                   cls="data", foot=foot, numeric=(1, 2, 3, 4))
    libs = "".join(f"<tr><th scope=\"row\">{esc(k)}</th><td class=\"mono\">{esc(v)}</td></tr>"
                   for k, v in m.get("libraries", {}).items())
    failed = failed_build(m)  # the wording packer ls and inspect give it: this version is not one to train on
    warn = (f'<p class="alert" role="alert" id="failed-build"><strong>FAILED BUILD</strong> {esc(failed)}; fix the '
            'files or raise validate.max_bad_fraction, and build again</p>' if failed is not None else "")
    warn += "".join(f'<p class="alert" role="alert">{esc(w)}</p>' for w in data.warnings) + _build_warnings(data)
    redacted = (m.get("phi") or {}).get("mode") == "pseudonymize"  # config_shown names no job path
    body = (f'{warn}<dl class="facts">{"".join(facts)}</dl>'
            f'<div class="cols"><div><h3>Counts per split</h3>{counts}</div>'
            f'<div><h3>Library versions</h3><table class="data compact" id="summary-libraries"><tbody>{libs}'
            f"</tbody></table></div></div>"
            f'<details><summary>Job config <span class="muted">(resolved, as hashed into the dataset'
            f'{"; job paths redacted: the manifest has them" if redacted else ""})'
            f'</span></summary><pre class="json">{_pretty(config_shown(m))}</pre></details>'
            f'<details><summary>DICOM decoders <span class="muted">({len(m.get("decoders", {}))} transfer '
            f'syntaxes)</span></summary><pre class="json">{_pretty(m.get("decoders", {}))}</pre></details>')
    return section("summary", body)


def _build_warnings(data: ReportData) -> str:
    """The box of what the build warned of as it ran (``warnings.jsonl``), each with its code as
    ``packer validate --json`` gives it; nothing where the build warned of nothing."""
    if data.build_warnings_note is not None:
        return f'<p class="alert" role="alert" id="build-warnings">{esc(data.build_warnings_note)}</p>'
    if not data.build_warnings:
        return ""
    items = "".join(f'<li data-code="{esc(w.code)}"><code>{esc(w.code)}</code> {esc(w.message)}</li>'
                    for w in data.build_warnings)
    return (f'<div class="alert" role="alert" id="build-warnings"><strong>The build warned of '
            f'{len(data.build_warnings)} thing{"s" if len(data.build_warnings) != 1 else ""}</strong> '
            f'<span class="muted">(printed as <code>packer: warning:</code>; kept in {WARNINGS_FILE})</span>'
            f"<ul>{items}</ul></div>")


def _parse_time(text: Any) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _timeline(data: ReportData) -> str:
    ranges = data.audit.time_ranges
    spans = []
    for split in data.splits + sorted(set(ranges) - set(data.splits)):
        if split in ranges and len(ranges[split]) == 2:
            start, end = _parse_time(ranges[split][0]), _parse_time(ranges[split][1])
            if start and end:
                spans.append((split, start, end, split_color(split)))
    split_cfg = data.manifest.get("config", {}).get("split", {})
    cutoffs = []
    if split_cfg.get("by") == "time":
        for name, value in (split_cfg.get("cutoffs") or {}).items():
            moment = _parse_time(value)
            if moment:
                cutoffs.append((str(name), moment))
    if not spans:
        phi: dict[str, Any] = data.manifest["phi"] if isinstance(data.manifest.get("phi"), dict) else {}
        why = (f" (record dates are withheld: phi dates {esc(phi['dates'])})"
               if phi.get("dates") not in (None, "keep") else "")
        return note(f"The audit records no time ranges{why}.", "muted")
    chart = timeline_chart(spans, cutoffs, label="time range per split")
    what = ("Records before the valid cutoff go to train, then valid until the test cutoff; each entity goes "
            "where its first record falls." if cutoffs else
            f"Split by {esc(split_cfg.get('by', '?'))}: no cutoffs; the spans show when each split's records "
            "were taken.")
    return f'<h3>Time range per split</h3><p class="muted">{what}</p>{chart}'


def render_splits(data: ReportData) -> str:
    m = data.manifest
    splits = m.get("splits", {})
    ranges = data.audit.time_ranges
    rows = []
    for split in data.splits:
        entry = splits[split]
        span = ranges.get(split)
        when = f"{esc(span[0])} → {esc(span[1])}" if span and len(span) == 2 else '<span class="muted">-</span>'
        rows.append(f'<tr><th scope="row"><i class="dot" style="background:{split_color(split)}"></i>{esc(split)}</th>'
                    + num(entry.get("samples", 0), "samples") + num(entry.get("entities", 0), "entities")
                    + (f"<td>{when}</td>" if ranges else "") + "</tr>")
    headers = ["split", "samples", "entities"] + (["time range (first → last record)"] if ranges else [])
    overview = table(headers, rows, table_id="splits-table", cls="data", numeric=(1, 2))
    return section("splits", f"{overview}{render_balance(data)}{render_mask_classes(data)}{_timeline(data)}")


def common_folder(paths: Sequence[str]) -> str:
    """The longest folder that holds every path or every URL ('' when there is none, or when
    local paths and URLs are mixed). A URL's folder keeps its ``scheme://``; os.path would
    fold it to ``scheme:/``."""
    present = [p for p in paths if p]
    if not present:
        return ""
    urls = [is_url(p) for p in present]
    if any(urls):
        if not all(urls):
            return ""
        segments = [p.split("/")[:-1] for p in present]
        common: list[str] = []
        for parts in zip(*segments, strict=False):  # the shortest path bounds the common part
            if any(part != parts[0] for part in parts):
                break
            common.append(parts[0])
        folder = "/".join(common)
        return folder if folder.split("://", 1)[-1] and "://" in folder else ""
    try:
        return os.path.commonpath([os.path.dirname(p) for p in present])
    except ValueError:  # mixed absolute and relative paths, or different drives
        return ""


def _relative(path: str, root: str) -> str:
    if root and root not in ("/", ".") and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return path


def report_privacy(manifest: dict[str, Any]) -> str:
    """What the HTML report of ``manifest`` shows of the people in the data, as the CLI and the
    report's footer say it: :func:`render_bad_samples` lists sample ids when the dataset is
    pseudonymized and raw paths (and raw entity ids) under ``phi.mode: keep``."""
    if (manifest.get("phi") or {}).get("mode") == "pseudonymize":
        return "pseudonymized: bad samples by sample id, no raw paths"
    bad = int((manifest.get("bad_samples") or {}).get("total", 0))
    return "phi.mode keep: raw entity ids" + ("; local only: lists bad-sample paths" if bad else "")


def render_bad_samples(data: ReportData) -> str:
    bad = data.manifest.get("bad_samples", {})
    inputs = data.manifest.get("inputs", {})
    excluded = sum(int(n) for n in (inputs.get("excluded") or {}).values())
    total, files = int(bad.get("total", 0)), int(inputs.get("files", 0)) - excluded
    # the Sensitive banner only where this section lists raw paths: bad-sample or left-out records under
    # phi.mode keep; a pseudonymized dataset's (sample ids) or one with nothing listed holds none
    pseudonymized = (data.manifest.get("phi") or {}).get("mode") == "pseudonymize"
    lists_paths = not pseudonymized and bool(data.bad_records or (inputs.get("excluded") and data.excluded_records))
    banner = ('<p class="sensitive" role="note"><strong>Sensitive: local only, contains raw paths.</strong> '
              "Raw folder and file names may carry patient names or record numbers; do not share this section "
              "outside the team that built the dataset.</p>") if lists_paths else ""
    over = float(bad.get("fraction", 0)) > float(bad.get("max_fraction", 1))
    status = (f'<p class="{"warn" if over else "muted"}">{total:,} of {files:,} input files are bad '
              f'({float(bad.get("fraction", 0)):.1%}; the build fails above '
              f'{float(bad.get("max_fraction", 0)):.1%}).</p>')
    charts = ""
    if total:
        by_reason = sorted(bad.get("by_reason", {}).items(), key=lambda kv: (-kv[1], kv[0]))
        by_stage = list(bad.get("by_stage", {}).items())
        reason_chart = bar_chart(by_reason, label="bad samples by reason", color="#c44e52", width=440)
        stage_chart = bar_chart(by_stage, label="bad samples by stage", color="#8172b3", width=440)
        charts = (f'<div class="cols"><div><h3>By reason</h3>{reason_chart}</div>'
                  f'<div><h3>By stage</h3>{stage_chart}</div></div>')
    if data.bad_records is None:
        listing = note(esc(data.bad_note or "no bad-sample report"), "muted")
    elif not data.bad_records:
        listing = note("No bad samples: every input file was packed.", "ok")
    elif pseudonymized:
        # raw paths and the messages naming them stay in bad_samples.jsonl: a shared report
        # of a pseudonymized dataset must not carry folder names that may hold names or MRNs
        records = data.bad_records
        shown = records[: data.limits.bad_rows]
        rows = [f'<tr><td class="num">{i}</td><td class="mono">{esc(r.get("sample_id", ""))}</td>'
                f"<td><span class=\"tag\">{esc(r.get('reason', ''))}</span></td><td>{esc(r.get('stage', ''))}</td></tr>"
                for i, r in enumerate(shown, 1)]
        banner = ('<p class="muted" role="note">This dataset is pseudonymized: samples are named by sample id. '
                  f"Raw paths and messages are in <code>{esc(bad.get('report', 'bad_samples.jsonl'))}</code>, "
                  "which stays with the people who built the data.</p>")
        listing = (f'<h3>Records <span class="muted">({len(records):,})</span></h3>'
                   + table(["#", "sample_id", "reason", "stage"], rows, table_id="bad-samples-table",
                           cls="data bad", numeric=(0,))
                   + (note(f'<span data-field="bad-rows-not-shown">{len(records) - len(shown):,}</span> more '
                           f"records not shown (first {len(shown):,} listed).", "muted")
                      if len(records) > len(shown) else ""))
    else:
        records = data.bad_records
        root = _paths_base(data)
        shown = records[: data.limits.bad_rows]
        rows = []
        for i, r in enumerate(shown, 1):
            path = str(r.get("path", ""))
            message = str(r.get("message", ""))
            if root and root not in ("/", "."):
                message = message.replace(root.rstrip("/") + "/", "")
            rows.append(f'<tr><td class="num">{i}</td><td class="mono path" title="{esc(path)}">'
                        f"{esc(_relative(path, root))}</td><td><span class=\"tag\">{esc(r.get('reason', ''))}</span>"
                        f"</td><td>{esc(r.get('stage', ''))}</td><td class=\"msg\">{esc(message)}</td></tr>")
        rest = len(records) - len(shown)
        where = f"Paths are relative to <code>{esc(root)}</code>." if root and root not in ("/", ".") else ""
        report = esc(bad.get("report", "bad_samples.jsonl"))
        listing = (f'<h3>Records <span class="muted">({len(records):,} in {report})'
                   f"</span></h3><p class=\"muted\">{where}</p>"
                   + table(["#", "path", "reason", "stage", "message"], rows, table_id="bad-samples-table",
                           cls="data bad", numeric=(0,))
                   + (note(f'<span data-field="bad-rows-not-shown">{rest:,}</span> more '
                           f"{plural(rest, 'record')} not shown (first {len(shown):,} listed).", "muted")
                      if rest > 0 else ""))
    return section("bad-samples", banner + status + charts + listing + _render_excluded(data))


def _paths_base(data: ReportData) -> str:
    """The one folder the bad samples' and the left-out files' tables show their paths relative
    to ('' where there is none): the common folder of both lists, so a path reads the same in
    either table and under either's "Paths are relative to" note. A pseudonymized dataset's tables
    list sample ids, not paths."""
    if (data.manifest.get("phi") or {}).get("mode") == "pseudonymize":
        return ""
    paths = [str(r.get("path", "")) for r in data.bad_records or []]
    if (data.manifest.get("inputs") or {}).get("excluded"):
        paths += [str(r.get("path", "")) for r in data.excluded_records or []]
    root = common_folder(paths)
    return root if root not in ("/", ".") else ""


def _unmapped_note(records: Sequence[dict[str, Any]]) -> str:
    """How many structures the masks' maps do not name were ignored, over every annotation object
    (not only the rows shown), by count alone: a pseudonymized report lists no detail, and a
    structure's name may be a person's. '' where none was."""
    counts = [unmapped_count(r) for r in records if r.get("why") == "annotation"]
    total = sum(counts)
    if not total:
        return ""
    objects = sum(1 for n in counts if n)
    return note(f"Unmapped structures: {total:,} structure(s) the map does not name, ignored, in {objects:,} of "
                f"{len(counts):,} annotation object(s) (never packed; each object's row in excluded.jsonl counts "
                "its own).", "muted")


def _render_excluded(data: ReportData) -> str:
    """The files left out on purpose (not bad samples): counts by why, modality and SOP class,
    and their list (by sample id in a pseudonymized dataset, as the bad samples are). Nothing
    where no file was left out, so such datasets' reports keep their bytes."""
    inputs = data.manifest.get("inputs", {})
    by_why = inputs.get("excluded") or {}
    if not by_why:
        return ""
    total = sum(int(n) for n in by_why.values())
    counts = []
    for title, key in (("Why", "excluded"), ("Modality", "excluded_by_modality"),
                       ("SOP class", "excluded_by_sop_class")):
        found = sorted((inputs.get(key) or {}).items(), key=lambda kv: (-kv[1], kv[0]))
        if found:
            rows = [f"<tr><td>{esc(name)}</td><td class=\"num\">{int(n):,}</td></tr>" for name, n in found]
            counts.append(f"<div><h4>{title}</h4>"
                          + table([title, "files"], rows, table_id=f"excluded-{key}", cls="data", numeric=(1,))
                          + "</div>")
    head = (f'<h3 id="excluded">Left out on purpose <span class="muted">({total:,} {plural(total, "file")})</span></h3>'
            '<p class="muted">Files the job does not pack by design: not bad samples, never counted against '
            "max_bad_fraction. not_image: a DICOM object without an image (report, presentation state, plan, "
            "structure set, segmentation); not_requested: an image packed only when the source's where: asks (RT "
            "Dose, secondary capture, localizer); filtered: left out by the source's where:; not_in_table: a file "
            "the source's table does not name; annotation: a SEG or RTSTRUCT read as its series' mask; "
            "label_conflict: a copy of an image whose copies' targets disagree, left out with its group "
            "(drop_group); not_downloaded: a table row whose file is not under the root (missing: drop); "
            "unsupported_format: a file of a format its source does not read (an archive or a compressed "
            "DICOM file to unpack, a DICOM export's file that does not start as DICOM, a Zarr store, WebP or GIF "
            "to convert to PNG, NRRD or MetaImage to convert to NIfTI): its detail in excluded.jsonl says what it "
            "is and how to unpack or convert it; "
            "label_map: a file a source without a table would pack as an image, though its folder or name marks "
            "it as a mask or label map (masks/, labelsTr/, *_seg); straddles_cutoff: a record of an entity that "
            "straddles a time split's cutoff, left out by entity_policy: drop_straddlers; folder_link: a file "
            "seen through a link to a folder already under the root, packed once under its own path.</p>"
            f'<div class="cols">{"".join(counts)}</div>')
    records = data.excluded_records
    if records is None:
        return head + note(esc(data.excluded_note or "no list of excluded files"), "muted")
    shown = records[: data.limits.bad_rows]
    pseudonymized = (data.manifest.get("phi") or {}).get("mode") == "pseudonymize"
    rows = []
    root = _paths_base(data)
    for i, r in enumerate(shown, 1):
        if pseudonymized:  # raw paths, and details that may name them, stay in excluded.jsonl
            name = f'<td class="mono">{esc(r.get("sample_id", ""))}</td>'
            detail = ""
        else:
            path = str(r.get("path", ""))
            name = f'<td class="mono path" title="{esc(path)}">{esc(_relative(path, root))}</td>'
            detail = f'<td class="msg">{esc(r.get("detail", ""))}</td>'
        rows.append(f'<tr><td class="num">{i}</td>{name}<td><span class="tag">{esc(r.get("why", ""))}</span></td>'
                    f'<td>{esc(r.get("modality", ""))}</td><td>{esc(r.get("sop_class", ""))}</td>{detail}</tr>')
    columns = (["#", "sample_id", "why", "modality", "SOP class"] if pseudonymized
               else ["#", "path", "why", "modality", "SOP class", "detail"])
    rest = len(records) - len(shown)
    where = f'<p class="muted">Paths are relative to <code>{esc(root)}</code>.</p>' if root else ""
    return (head + _unmapped_note(records) + where
            + table(columns, rows, table_id="excluded-table", cls="data", numeric=(0,))
            + (note(f"{rest:,} more {plural(rest, 'record')} not shown (first {len(shown):,} listed; all in "
                    "excluded.jsonl).", "muted") if rest > 0 else ""))


#: What the time-order table shows for a record's date that PHI pseudonymization keeps out of the
#: shared outputs (``phi.dates: shift``; leakage.json leaves it out too), rather than a blank cell
WITHHELD_DATE = "withheld (phi dates: shift)"

RULE_TEXT = {
    "entity_overlap": "an entity with samples in two splits",
    "exact_duplicates_across_splits": "the same packed pixels in two splits",
    "near_duplicates_across_splits": "verified near copies in two splits",
    "exact_duplicates_within_split": "the same packed pixels twice in one split",
    "duplicates_span_entities": "a duplicate cluster holding several entities (likely identity error)",
    "time_order": "records of an earlier split in a later split's period (from its cutoff on)",
    "label_conflicts": "copies of one image whose targets (or masks) disagree",
    "entity_lookalikes": "entity ids that differ only in case, spacing or leading zeros (likely one patient)",
    "duplicates": "duplicate pairs",
    "split_balance": "split shares far from the requested ratios, or one group of linked entities too large",
}


def _member_cell(data: ReportData, key: str, split: str | None, entity: str | None, pane: Pane | None) -> str:
    entry = data.entries.get(key)
    split = split or (entry.split if entry else None)
    entity = entity or (entry.entity_id if entry else None)
    where = " · ".join(esc(v) for v in (split, entity) if v) or "not in the index"
    image = (f'<img src="{pane.uri}" width="{pane.width}" height="{pane.height}" alt="{esc(key)}" '
             f'title="{esc(key)}">' if pane else '<div class="noimg">no thumbnail</div>')
    return f'<figure class="dup">{image}<figcaption><code>{esc(key)}</code><br>{where}</figcaption></figure>'


def _group_card(data: ReportData, group: DuplicateGroup, panes: dict[str, Pane]) -> str:
    shown = group.members[: data.limits.group_members]
    cells = "".join(_member_cell(data, m.key, m.split, m.entity_id, panes.get(m.key)) for m in shown)
    more = group.size - len(shown)
    facts = [esc(group.rule.replace("_", " "))]
    if group.evidence is not None:
        facts.append(esc(group.evidence))
    if group.cross_split:
        facts.append("<strong>cross-split</strong>")
    if more > 0:
        facts.append(f"+{more} more")
    return (f'<div class="pair{" cross" if group.cross_split else ""}">{cells}'
            f'<div class="dist">{"<br>".join(facts)}</div></div>')


def _counted(audit: AuditFindings, kind: str) -> str:
    """How many findings of ``kind`` the audit made, from the rules' counts (``leakage.json``
    lists the first of each rule's findings, its count is complete): ``210``, or ``at least
    210`` where a finding two rules made is one and some of them are not listed."""
    total, exact = audit.total(kind)
    return f"{total:,}" if exact else f"at least {total:,}"


def _counted_noun(audit: AuditFindings, kind: str, one: str, many: str = "") -> str:
    """:func:`_counted` with its noun, in the number the count takes: ``1 group``, ``at least 210 groups``."""
    return f"{_counted(audit, kind)} {plural(audit.total(kind)[0], one, many)}"


def _listed(audit: AuditFindings, kind: str, sep: str = "; ") -> str:
    """``; first 200 listed`` (after ``sep``) where ``leakage.json`` lists only the first
    findings of ``kind``; empty where it lists them all."""
    listed, (total, _) = len(getattr(audit, kind)), audit.total(kind)
    return f"{sep}first {listed:,} listed" if total > listed else ""


def _not_listed(audit: AuditFindings, kind: str, shown: int, one: str, many: str = "") -> str:
    """The note under a table of ``shown`` findings of ``kind``: how many more there are (``one``
    or ``many`` of them), and where they are listed (``leakage.json`` lists the first of each
    rule's findings)."""
    listed, (total, exact) = len(getattr(audit, kind)), audit.total(kind)
    if total <= shown:
        return ""
    where = ("all in leakage.json" if total == listed else
             f"leakage.json lists the first {listed:,} of {_counted(audit, kind)}, and counts them all")
    rest = total - shown
    return note(f"{'at least ' if not exact else ''}{rest:,} more {plural(rest, one, many)} not listed ({where}).",
                "muted")


def _conflicts_table(audit: AuditFindings, limit: int) -> str:
    """Rule ``label_conflicts``: one row per member of each group (key, target, split, entity),
    the group's first row saying how it was linked, its size and its mask Dice."""
    conflicts, rows = audit.conflicts, []
    for number, group in enumerate(conflicts[:limit], start=1):
        facts = [group.linked_by, f"{group.size} copies"]
        if group.dice is not None:
            facts.append(f"mask Dice {group.dice:.2f}")
        if group.dropped:
            facts.append("left out (drop_group)")
        for k, (member, label) in enumerate(group.members):
            rows.append(f'<tr data-group="{number}"><td class="num">{number if k == 0 else ""}</td>'
                        f'<td class="mono">{esc(member.key)}</td><td>{esc(label)}</td>'
                        f'<td>{esc(member.split or "-")}</td><td class="mono">{esc(member.entity_id or "")}</td>'
                        f'<td class="muted">{esc(", ".join(facts)) if k == 0 else ""}</td></tr>')
    more = _not_listed(audit, "conflicts", min(limit, len(conflicts)), "group")
    return (f'<h3>Label conflicts <span class="muted">({_counted_noun(audit, "conflicts", "group")}'
            f'{_listed(audit, "conflicts")})</span></h3>'
            '<p class="muted">Exact duplicates or verified near copies whose targets (or masks) differ: label noise, '
            "or two patients mixed up (split.duplicates.label_conflict says what the build did).</p>"
            + table(["group", "key", "target", "split", "entity_id", "group facts"], rows,
                    table_id="label-conflicts", cls="data compact", numeric=(0,)) + more)


def _lookalikes_table(audit: AuditFindings, limit: int) -> str:
    """Rule ``entity_lookalikes``: one row per entity of each group (its id, splits and a sample
    key, which ``packer locate`` maps to its file), the group's first row saying whether it crosses splits."""
    groups, rows = audit.lookalikes, []
    for number, group in enumerate(groups[:limit], start=1):
        for k, (member, splits) in enumerate(group.entities):
            crosses = ("across splits" if group.across_splits else "one split") if k == 0 else ""
            rows.append(f'<tr data-group="{number}"><td class="num">{number if k == 0 else ""}</td>'
                        f'<td class="mono">{esc(member.entity_id or "")}</td><td>{esc(" + ".join(splits))}</td>'
                        f'<td class="mono">{esc(member.key)}</td><td class="muted">{esc(crosses)}</td></tr>')
    more = _not_listed(audit, "lookalikes", min(limit, len(groups)), "group")
    crossing = sum(g.across_splits for g in groups)
    listed = _listed(audit, "lookalikes", "")
    return (f'<h3>Lookalike entity ids <span class="muted">({_counted_noun(audit, "lookalikes", "lookalike group")}, '
            + (f"{listed}, {crossing:,} of them" if listed else f"{crossing:,}") + " across splits)</span></h3>"
            '<p class="muted">Entity ids that differ only in case, spacing or leading zeros: likely one patient '
            "exported by two systems, split as two entities. packer never merges them: make the ids agree at the "
            "source (under a split by entity, pinning each group to one split with split.pinned does too).</p>"
            + table(["group", "entity_id", "splits", "sample key", "splits of the group"], rows,
                    table_id="entity-lookalikes", cls="data compact", numeric=(0,)) + more)


def _rules_table(data: ReportData) -> str:
    rows = []
    for rule in data.audit.rules:
        if rule.count == 0:
            result = '<span class="pass">passed</span>'
        elif rule.severity == "fail" and not rule.passed:
            result = '<span class="fail">failed</span>'
        else:
            result = '<span class="flagged">reported</span>'
        detail = ", ".join(f"{esc(k)} {esc(json.dumps(v))}" for k, v in sorted(rule.detail.items()))
        rows.append(f'<tr data-rule="{esc(rule.name)}"><td class="mono">{esc(rule.name)}</td>'
                    f'<td class="muted">{esc(RULE_TEXT.get(rule.name, ""))}</td><td>{esc(rule.severity)}</td>'
                    + num(rule.count, f"rule.{rule.name}") + f'<td>{result}</td><td class="muted">{detail}</td></tr>')
    return table(["rule", "checks for", "severity", "count", "result", "settings"], rows, table_id="audit-rules",
                 cls="data compact", numeric=(3,))


def render_leakage(data: ReportData) -> str:
    audit = data.audit
    limit = data.limits.listed_rows
    parts = []
    if audit.entities_per_split:
        facts = " · ".join(f"{esc(s)} {int(n):,}" for s, n in audit.entities_per_split.items())
        parts.append(f'<p class="muted">Entities per split (recounted by the audit): {facts}.</p>')
    if audit.clean:
        parts.append('<p class="ok" id="leakage-status"><strong>No findings.</strong> No entity is in two splits'
                     + (" and no duplicate rule found anything" if audit.rules else "") + ".</p>")
    else:
        # counted from the rules' counts: leakage.json lists only the first findings of a rule
        found = [_counted_noun(audit, kind, one, many)
                 + (f" ({listed})" if (listed := _listed(audit, kind, "")) else "")
                 if getattr(audit, kind) else ""
                 for kind, one, many in (
                     ("overlap", "entity in more than one split", "entities in more than one split"),
                     ("groups", "duplicate group", ""), ("conflicts", "label conflict", ""),
                     ("lookalikes", "group of lookalike entity ids", "groups of lookalike entity ids"),
                     ("time_order", "time-order finding", ""))]
        counted = sum(r.count for r in audit.rules)
        text = "; ".join(f for f in found if f) or f"{counted:,} {plural(counted, 'finding')} counted"
        verdict = "the audit failed" if audit.passed is False else "reported, not failing the build"
        parts.append(f'<p class="warn" id="leakage-status"><strong>Findings: {esc(text)}</strong> ({verdict}).</p>')
    if audit.note:
        parts.append(note(esc(audit.note), "muted"))
    if audit.rules:
        parts.append("<h3>Rules</h3>" + _rules_table(data))
    if audit.overlap:
        rows = [f'<tr><td class="mono">{esc(e)}</td><td>{esc(" + ".join(s))}</td></tr>'
                for e, s in audit.overlap[:limit]]
        parts.append("<h3>Entity overlap</h3>" + table(["entity_id", "splits"], rows, table_id="entity-overlap",
                                                       cls="data compact"))
        parts.append(_not_listed(audit, "overlap", min(limit, len(audit.overlap)), "entity", "entities"))
    if audit.groups:
        budget, cards = int(data.limits.image_bytes * data.limits.duplicate_share), list[str]()
        for group in audit.groups[: data.limits.duplicate_thumbs]:
            panes = {m.key: data.duplicate_panes[m.key] for m in group.members[: data.limits.group_members]
                     if m.key in data.duplicate_panes}
            cost = sum(p.nbytes for p in panes.values())
            if cards and cost > budget:
                break
            budget -= cost
            cards.append(_group_card(data, group, panes))
        rows = [f'<tr><td class="mono">{esc(g.rule)}</td><td class="mono">{esc(", ".join(m.key for m in g.members))}'
                f'</td><td>{esc(" + ".join(sorted({m.split for m in g.members if m.split})))}</td>'
                f'<td>{esc(g.evidence or "")}</td></tr>'
                for g in audit.groups[:limit]]
        parts.append(f'<h3>Duplicates <span class="muted">({_counted_noun(audit, "groups", "group")}'
                     f'{_listed(audit, "groups")})</span></h3>'
                     f'<div class="pairs">{"".join(cards)}</div><details><summary>All groups</summary>'
                     + table(["rule", "keys", "splits", "evidence"], rows, table_id="duplicate-groups",
                             cls="data compact") + "</details>")
        parts.append(_not_listed(audit, "groups", min(limit, len(audit.groups)), "group"))
        shown = len(cards)
        if len(audit.groups) > shown:
            parts.append(note(f"Thumbnails for the first {shown} {plural(shown, 'group')}.", "muted"))
    if audit.conflicts:
        parts.append(_conflicts_table(audit, limit))
    if audit.lookalikes:
        parts.append(_lookalikes_table(audit, limit))
    if audit.time_order:
        rows = []
        for f in audit.time_order[:limit]:
            earlier = str(f.get("from", "train"))
            named = f.get(f"{earlier}_samples") or []
            keys = ", ".join(str(m.get("key", "")) for m in named[:5] if isinstance(m, dict))
            more = f.get(f"{earlier}_samples_after", len(named))
            rows.append(f"<tr><td>{esc(f.get('split', ''))}</td>"
                    f"<td>{esc(f.get('starts', f.get('earliest', WITHHELD_DATE)))}</td>"
                    f"<td>{esc(earlier)}</td><td>{esc(f.get('latest_' + earlier, WITHHELD_DATE))}</td>"
                    f"<td>{esc(more)}</td><td>{esc(keys)}{' ...' if isinstance(more, int) and more > 5 else ''}"
                    "</td></tr>")
        heading = (f'Time order <span class="muted">({_counted_noun(audit, "time_order", "finding")}'
                   f'{_listed(audit, "time_order")})</span>')
        parts.append(f"<h3>{heading}</h3>" + table(["split", "its period starts", "earlier split",
                                                     "its latest record", "its records in the period",
                                                     "first of them (keys)"], rows,
                                                    table_id="time-order", cls="data compact")
                     + _not_listed(audit, "time_order", min(limit, len(audit.time_order)), "finding"))
    parts.append(f'<details><summary>Audit record <span class="muted">(manifest "audit", raw paths left out)</span>'
                 "</summary>"
                 f'<pre class="json">{_pretty(without_paths(data.manifest.get("audit", {})))}</pre></details>')
    return section("leakage-audit", "".join(parts))
