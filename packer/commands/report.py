"""``packer report``: write the self-contained HTML report of a built dataset version."""

from __future__ import annotations

from pathlib import Path

import click

from packer.commands import exits, local_folder_argument


@click.command("report")
@click.argument("manifest_arg", metavar="MANIFEST", type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the HTML file (default: report.html in the version folder).")
@exits
def report(manifest_arg: str, output: Path | None) -> None:
    """Write one self-contained HTML report of the dataset version at MANIFEST (its manifest.json
    or the version folder): summary, splits and targets (label balance, per-label shares for
    multi-label, value histograms for numeric targets), contact sheets, intensity histograms,
    bad samples and the leakage audit.

    \b
    The file has inline CSS and images, no scripts and no network access, so it opens from
    file:// anywhere. A pseudonymized dataset's report names bad samples by sample id only;
    under phi.mode keep it lists their raw paths and entity ids: keep that file local.
    Each sample the report reads is checked against its checksum in _index.parquet (xxh3); a
    sample that fails is named at the top of the report, flagged where it is shown and in a
    warning here: run `packer verify` on the version. Without a readable index nothing is
    checked, and a warning here says so.
    Exits 5 when the manifest cannot be read (not JSON, breaking the manifest schema, of a newer
    format or another version's) or names a file outside the version folder (the report opens no
    such file), 2 when MANIFEST is not a dataset version (a registry copy, with neither index nor
    shards beside it, is not: pass the version folder). An edited manifest (its dataset_hash no
    longer matches) is reported, under a warning.
    """
    from packer.errors import IntegrityError
    from packer.files import human_bytes
    from packer.htmlreport import write_report
    from packer.htmlreport.collect import damaged_finding, unreadable_finding
    from packer.htmlreport.sections import report_privacy
    from packer.manifest import detached_manifest_error, read_manifest, resolve_manifest_path
    from packer.verify import shard_size_problems

    manifest = local_folder_argument(manifest_arg, command="report")
    located = resolve_manifest_path(manifest)
    read = read_manifest(located, strict=False)
    data = read.data
    detached = detached_manifest_error(str(manifest), located, data, "a report would show no samples")
    if detached is not None:
        raise detached
    unreadable = [problem for problem in read.problems if problem.kind != "dataset_hash"]
    if unreadable:  # a shape this packer cannot read (or another version's manifest): nothing it says can be shown
        outside = "; packer report reads no file outside the version folder" \
            if unreadable[0].kind == "unsafe_file" else ""
        raise IntegrityError(f"{located}: {unreadable[0].detail}{outside}; no report was written")
    # packer report has no --out: a refused file is placed elsewhere with -o, not by building again
    written = write_report(manifest, output, elsewhere="write the report elsewhere (packer report MANIFEST -o FILE)")
    path = written.path
    shows = report_privacy(data)
    click.echo(f"report {path} ({human_bytes(path.stat().st_size)}; {shows})")
    for problem in read.problems:  # shown at the report's top; the log too
        if problem.kind == "dataset_hash":
            click.echo(f"packer: warning: {located}: {problem.detail} (the report shows its numbers as written, "
                       "under this warning)", err=True)
    if written.damaged:  # the report's first finding; a terminal or CI log should see it too
        click.echo(f"packer: warning: {damaged_finding(list(written.damaged), written.checked)}", err=True)
    if written.index_note:  # the checksums are in the index: the samples shown went unchecked, as the HTML says
        click.echo(f"packer: warning: {located.parent}: {written.index_note}, so no sample the report shows could be "
                   "checked against its checksum: run `packer verify` on the version", err=True)
    if written.unreadable:
        click.echo(f"packer: warning: {unreadable_finding(written.unreadable, written.selected)}", err=True)
    damaged = shard_size_problems(located.parent, data)
    if damaged:  # a stat each: what the report could not tell from the samples it read
        shown = ", ".join(damaged[:3]) + (f" and {len(damaged) - 3} more" if len(damaged) > 3 else "")
        click.echo(f"packer: warning: {len(damaged)} shard(s) missing or not the size the manifest records ({shown}): "
                   "the report shows no sample of a missing shard, and of a shard of another size the samples it "
                   "could read whose checks pass (its first finding names any that fail); the shard's own bytes are "
                   "not what the manifest hashed: run `packer verify` on the version", err=True)

