"""A self-contained HTML report of one built dataset version (``packer report``).

One file, inline CSS and SVG, thumbnails as PNG data URIs, no script and no network
(a Content-Security-Policy forbids any fetch), so it opens from ``file://`` anywhere.
Sections, each an ``<h2>`` with a stable id: ``summary``, ``splits``, ``contact-sheets``,
``intensities``, ``bad-samples``, ``leakage-audit``. What the splits section and the contact
sheets say of the targets follows the dataset's target kind (``balance.py``, ``collect.py``). A
dataset with segmentation masks also gets its masks drawn over the contact sheets, with a legend,
and the share of mask pixels per class id per split (``masks.py``); one without keeps its bytes.

Contact sheets and histograms read a bounded, seeded selection of samples through the
sample index, so the file's size (≈ ≤ 10 MB) and most of its build time do not grow with the
dataset. What it shows is what the shards already hold (keys, targets, entity ids as stored,
pixels, window names), plus the manifest; raw paths appear only in the bad-samples section,
which is marked sensitive, because ``bad_samples.jsonl`` holds them.

Every string that did not come from this package (label, class and source names, entity ids,
paths, messages, table and config values: anything a person, a table or a received manifest
wrote) enters the markup through :func:`~packer.htmlreport.markup.esc` (``html.escape`` with
quotes, so it is safe in text and in quoted attribute values); SVG text through
``html.escape`` likewise. No user string goes into a URL, a ``style``, a tag or attribute
name, or a script (there is none). ``tests/test_htmlreport_hostile.py`` plants script, attribute
and ``javascript:`` payloads in a real build's labels, entities, file names and source name, and
in every string of its manifest, and checks the parsed markup and headless Chromium's DOM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.allocator import system_arrow_pool
from packer.errors import IntegrityError
from packer.htmlreport.collect import DamagedSample, ReportData, ReportLimits, collect_report_data
from packer.htmlreport.imagery import render_contact_sheets, render_intensities
from packer.htmlreport.markup import esc, plural
from packer.htmlreport.sections import (
    SECTION_IDS,
    render_bad_samples,
    render_leakage,
    render_splits,
    render_summary,
    report_privacy,
)
from packer.htmlreport.template import render_page
from packer.manifest import ManifestProblem, read_manifest, resolve_manifest_path

__all__ = ["HTML_REPORT_FILE", "SECTION_IDS", "DamagedSample", "ReportLimits", "WrittenReport", "render_html_report",
           "write_html_report", "write_report"]

HTML_REPORT_FILE = "report.html"


@dataclass(frozen=True)
class WrittenReport:
    """A report written by :func:`write_report`: where, and the samples it read whose bytes fail
    their checksum (the report names them at the top and on each sample)."""

    path: Path
    damaged: tuple[DamagedSample, ...]
    checked: int  # samples read whose checksum was compared with the index's
    unreadable: tuple[tuple[str, str], ...] = ()  # selected samples it could not read: (key, why)
    selected: int = 0  # samples it set out to read
    index_note: str | None = None  # why the index could not be read (the shards were scanned: nothing checked)
    wrote: bool = True  # whether it wrote the file (False: the file held these bytes already, left alone)


def render_html_report(manifest_path_or_dir: str | Path, *, manifest: dict[str, Any] | None = None,
                       limits: ReportLimits | None = None, quiet: bool = False) -> str:
    """Render the report of the dataset version at ``manifest_path_or_dir`` as one HTML string.

    ``manifest_path_or_dir`` is a ``manifest.json`` or its version folder; the shards, the
    index, ``bad_samples.jsonl`` and ``leakage.json`` are read from that folder. ``manifest``
    replaces the file's content when given (it is then not checked). A manifest that breaks
    the current schema (an older or newer packer) or whose ``dataset_hash`` does not match its
    content is still reported, under a warning at the top; IntegrityError is raised only when the
    file cannot be read, is not a JSON object, or names a file that is not a plain path inside the
    version folder (a received manifest edited to read ``../../elsewhere``). The same inputs give
    the same bytes (no clock is read). A long report shows a ``report`` progress line on stderr
    (samples read and drawn) unless ``quiet``. Every sample read is checked against the checksum its
    index row records (``xxh3``); those that fail are named in a finding at the top and flagged
    where shown.
    """
    return _render(manifest_path_or_dir, manifest=manifest, limits=limits, quiet=quiet)[0]


def _render(manifest_path_or_dir: str | Path, *, manifest: dict[str, Any] | None, limits: ReportLimits | None,
            quiet: bool) -> tuple[str, ReportData]:
    manifest_file = resolve_manifest_path(manifest_path_or_dir)
    warnings: list[str] = []
    if manifest is None:
        read = read_manifest(manifest_file, strict=False)
        unsafe = [problem.detail for problem in read.problems if problem.kind == "unsafe_file"]
        if unsafe:  # the report opens the files the manifest names: never one outside the version folder
            raise IntegrityError(f"{manifest_file}: {unsafe[0]}" + (f" (and {len(unsafe) - 1} more such names)"
                                                                     if len(unsafe) > 1 else "")
                                 + "; packer report reads no file outside the version folder")
        manifest, warnings = read.data, [_warning(problem, manifest_file.name) for problem in read.problems]
    with system_arrow_pool():  # see packer.allocator: the report runs at the end of a build's client
        data = collect_report_data(manifest_file.parent, manifest, limits or ReportLimits(), warnings, quiet=quiet)
    body = "".join([render_summary(data), render_splits(data), render_contact_sheets(data),
                    render_intensities(data), render_bad_samples(data), render_leakage(data)])
    name, version = str(manifest.get("name", "?")), str(manifest.get("version", "?"))
    samples = int(manifest.get("inputs", {}).get("samples", 0))
    digest = esc(str(manifest.get("dataset_hash", "?"))[:16])
    subtitle = (f"{samples:,} {plural(samples, 'sample')} · {esc(manifest.get('format', '?'))} · "
                f"created {esc(manifest.get('created_at', '?'))} · "
                f'dataset_hash <span class="mono">{digest}…</span>')
    shows = esc(report_privacy(manifest))
    footer = (f"Generated by packer {esc(manifest.get('packer_version', ''))} from {esc(manifest_file.name)} and the "
              f"shards next to it. Self-contained: no scripts, no network. This report: {shows}.")
    return render_page(title=f"packer report · {name} {version}", heading=name, version=version, subtitle=subtitle,
                       nav=list(SECTION_IDS.items()), body=body, footer=footer), data


def _warning(problem: ManifestProblem, file_name: str) -> str:
    """What the report says, above everything else, about a problem of its manifest (named by
    its file name only: the report is a file to share, the local path is not)."""
    if problem.kind == "dataset_hash":
        return f"{file_name}: {problem.detail}. Verify the shards before trusting these numbers."
    return f"{file_name}: {problem.detail} (written by another packer version?); the report shows what it can read."


def write_html_report(manifest_path_or_dir: str | Path, output: Path | None = None, *,
                      limits: ReportLimits | None = None, quiet: bool = False) -> Path:
    """Write the report (default ``<version folder>/report.html``) atomically; return its path.
    A file that already holds these exact bytes is left alone (a rebuild of a built version
    rewrites nothing). ``quiet``: no progress line (:func:`render_html_report`).

    Raises IntegrityError as :func:`render_html_report` does, OSError if ``output`` cannot be written.
    """
    return write_report(manifest_path_or_dir, output, limits=limits, quiet=quiet).path


def write_report(manifest_path_or_dir: str | Path, output: Path | None = None, *,
                 limits: ReportLimits | None = None, quiet: bool = False,
                 elsewhere: str | None = None) -> WrittenReport:
    """:func:`write_html_report`, also returning the samples read that fail their checksum (for
    ``packer report`` to say so on the terminal too). ``elsewhere``: the fix where the file system
    refuses the file, how this caller puts it somewhere else (default: another build output folder,
    right for a build's own report; ``packer report`` names its ``-o FILE``)."""
    from packer.files import atomic_output

    folder = resolve_manifest_path(manifest_path_or_dir).parent
    target = Path(output) if output is not None else folder / HTML_REPORT_FILE
    text, report = _render(manifest_path_or_dir, manifest=None, limits=limits, quiet=quiet)
    data = text.encode("utf-8")
    wrote = not _holds(target, data)
    if wrote:
        with atomic_output(target, shared=True, elsewhere=elsewhere) as fh:  # packer report beside another, or a build
            fh.write(data)
    return WrittenReport(path=target, damaged=tuple(report.damaged), checked=report.checked,
                         unreadable=tuple(report.unreadable), selected=report.selected,
                         index_note=report.index_note, wrote=wrote)


def _holds(path: Path, data: bytes) -> bool:
    """True when the file ``path`` holds exactly ``data``; False when it differs, is absent or unreadable."""
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False
