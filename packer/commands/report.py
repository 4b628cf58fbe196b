"""``packer report``: write the self-contained HTML report of a built dataset version."""

from __future__ import annotations

from pathlib import Path

import click

from packer.commands import exits


@click.command("report")
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the HTML file (default: report.html in the version folder).")
@exits
def report(manifest: Path, output: Path | None) -> None:
    """Write one self-contained HTML report of the dataset version at MANIFEST (its manifest.json
    or the version folder): summary, splits and targets (label balance, per-label shares for
    multi-label, value histograms for numeric targets), contact sheets, intensity histograms,
    bad samples and the leakage audit.

    \b
    The file has inline CSS and images, no scripts and no network access, so it opens from
    file:// anywhere. A pseudonymized dataset's report names bad samples by sample id only;
    under phi.mode keep it lists their raw paths and entity ids: keep that file local.
    Exits 5 when the manifest cannot be read, 2 when MANIFEST is not a dataset version.
    """
    from packer.files import human_bytes
    from packer.htmlreport import write_html_report
    from packer.htmlreport.sections import report_privacy
    from packer.manifest import read_manifest

    path = write_html_report(manifest, output)
    shows = report_privacy(read_manifest(manifest, strict=False, check_hash=False).data)
    click.echo(f"report {path} ({human_bytes(path.stat().st_size)}; {shows})")
