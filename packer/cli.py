"""The ``packer`` command line: parse options, call the library, map errors to exit codes.

Exit codes: 0 success · 1 internal error · 2 usage or config error · 3 too many bad samples
(report and manifest still written) · 4 leakage found by the split audit · 5 integrity
failure (a shard or manifest does not match its hash) · 6 a file system refused a write (full,
over quota, read-only) · 7 the connection to the dask scheduler was lost · 130 interrupted (Ctrl-C) ·
143 stopped by SIGTERM · 141 stdout or stderr was closed by its reader (``packer ... | head -1``): the
command stopped there, quietly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from packer import __version__
from packer.commands import exit_closed_output, exits, output_closed, stand_in_for_closed_streams
from packer.config import SPLITS


class _Packer(click.Group):
    """The command group, which ends quietly with exit 141 when the reader of stdout or stderr has gone also
    outside the commands' own bodies (which :func:`~packer.commands.exits` covers): ``--help``, ``--version``, an
    error message. click would exit 1 there, packer's "internal error"."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        stand_in_for_closed_streams()  # `packer ... >&-`: a write to the closed stream ends it with 141 too
        try:
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            if not output_closed():
                raise
            exit_closed_output()

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not output_closed():
                raise
            exit_closed_output()


@click.group(cls=_Packer, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="packer")
def main() -> None:
    """packer: turn a messy folder of DICOM files and images into validated, leakage-free,
    versioned training shards (WebDataset tar or Parquet) with a manifest and a bad-sample report.

    \b
    Start here:
      packer demo-data demo-raw          # write a small raw tree with some broken files
      packer build workflows/demo.yaml   # discover, validate, split, transform, pack, hash

    Exit codes: 0 ok, 1 internal error, 2 usage/config error, 3 too many bad samples,
    4 leakage found, 5 integrity failure, 6 disk full or read-only (the message names the file),
    7 the dask scheduler was lost (rerun: the build cache keeps what was decoded), 130 Ctrl-C,
    143 SIGTERM (kill, a batch scheduler's cancel: the cache is kept as on Ctrl-C),
    141 the output's reader went away (packer ... | head): the command stopped there, quietly.
    """


def _print_summary(result: Any) -> None:
    from packer.pipeline.build import dataset_warnings
    from packer.targets import Target

    manifest = result.manifest
    said = ""
    if result.reused:
        rewritten = result.reports_rewritten
        reports = (f"; its local reports rewritten where this build's differ: {', '.join(rewritten)}"
                   if rewritten else "")
        if result.restored:
            said = (f" (already built: {len(result.restored)} missing or damaged file(s) restored from this build: "
                    f"{', '.join(result.restored)}{reports})")
        else:
            said = f" (already built: shards and manifest as they were{reports})" if rewritten else \
                " (already built: nothing rewritten)"
    lines = [f"dataset {manifest['name']} version {manifest['version']}{said}"]
    target = Target.of_manifest(manifest)
    for split in SPLITS:
        entry = manifest["splits"][split]
        classes = target.brief(entry)
        lines.append(f"  {split:<5} {entry['samples']:>7} samples  {entry['entities']:>5} entities  "
                     f"{len(entry['shards']):>4} shards  [{classes}]")
    # an empty split, shapes no batch stacks: warnings, the build goes on (packer.build prints them on stderr)
    lines.extend(f"  warning: {message}" for _, message in dataset_warnings(manifest))
    bad = manifest["bad_samples"]
    reasons = ", ".join(f"{k} {v}" for k, v in bad["by_reason"].items()) or "none"
    inputs = manifest["inputs"]
    left_out = inputs.get("excluded", {})
    excluded = sum(left_out.values())
    if excluded:  # every input file once: packed, bad or left out on purpose
        from packer.exclusions import EXCLUDED_FILE, describe_counts

        lines.append(f"  inputs: {inputs['files']} files: {inputs['files'] - bad['total'] - excluded} packed, "
                     f"{bad['total']} bad, {excluded} left out on purpose ({describe_counts(left_out)}; not bad "
                     f"samples, listed in {result.version_dir / EXCLUDED_FILE})")
    lines.append(f"  bad samples: {bad['total']} of {inputs['files'] - excluded} files "
                 f"({bad['fraction']:.1%}, limit {bad['max_fraction']:.1%}): {reasons}")
    conflicts = manifest["audit"]["rules"].get("label_conflicts")  # recorded only where it found a group
    if conflicts is not None and conflicts["count"]:
        lines.append(f"  label conflicts: {conflicts['count']} group(s) of copies whose targets or masks differ "
                     f"(policy {conflicts['policy']}, {conflicts['dropped']} samples dropped); listed under "
                     f"label_conflicts in {result.version_dir / 'leakage.json'}")
    lines.append(f"  {result.work_line}")
    lines.append(f"  dataset_hash {manifest['dataset_hash']}")
    phi = manifest.get("phi") or {}
    if result.phi_key_source is not None:  # where the key came from, never the key
        lines.append(f"  phi key   from {result.phi_key_source}; fingerprint {phi.get('key_fingerprint')}")
    lines.append(f"  shards    {result.version_dir}/")
    lines.append(f"  manifest  {result.manifest_path}")
    holds = "local only: raw paths and messages of the bad files" if bad["total"] else "empty: no bad files"
    lines.append(f"  bad       {result.version_dir / bad['report']}  ({holds})")
    if result.html_report is not None:
        from packer.htmlreport.sections import report_privacy

        lines.append(f"  report    {result.html_report}  (open in a browser; {report_privacy(manifest)})")
    if result.registry_copy is not None:
        lines.append(f"  registry  {result.registry_copy}"
                     + ("" if result.registry_written else "  (already there: left as it was)"))
    if result.published is not None:
        published = result.published
        copied = (f" ({len(published.copied)} shards of them copied in the store from an earlier version)"
                  if published.copied else "")
        note = ("already there: nothing uploaded" if published.skipped
                else f"{len(published.uploaded)} files uploaded{copied}, each read back and checked")
        lines.append(f"  remote    {result.published.manifest_url}  ({note})")
    elif result.remote_url is not None:
        lines.append(f"  remote    not published to {result.remote_url}: too many bad samples (exit 3)")
    total = sum(seconds for _, seconds in result.stage_seconds)
    if total > 0:
        cached = f", {result.files_cached} from the build cache" if result.files_cached else ""
        decoded = f"{result.files_decoded} file{'' if result.files_decoded == 1 else 's'} decoded"
        lines.append(f"  time by stage, summed over tasks ({decoded}{cached}):")
        for stage, seconds in sorted(result.stage_seconds, key=lambda item: -item[1]):
            lines.append(f"    {stage:<32} {seconds:8.2f}s  {seconds / total:6.1%}")
    click.echo("\n".join(lines))


@main.command()
@click.argument("job", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", metavar="DIR|URL",
              help="Write under this folder instead of the job's 'output', or build in the local work folder "
                   "($PACKER_WORK_DIR, default ~/.cache/packer/work) and publish to a URL (s3://bucket/prefix), "
                   "manifest last. Does not change the dataset hash.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Option for the stores reached through URLs: the output's and the raw sources' (sent to the "
                   "workers too), e.g. endpoint_url=http://127.0.0.1:9000 (repeatable; AWS_* environment "
                   "variables work too).")
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes of the local dask cluster "
              "(default: one per core, at most 8).")
@click.option("--scheduler", metavar="ADDRESS",
              help="Run on an existing dask.distributed scheduler (tcp://host:port or a scheduler file), "
                   "or 'sync' to run in-process for debugging.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines; only the final summary.")
@click.option("--no-report", is_flag=True, help="Skip the HTML quality report (report.html next to the manifest).")
@click.option("--resume/--fresh", default=True, show_default=True,
              help="--resume (the default) reuses the build cache: after a crash or kill -9, files already "
                   "decoded and spilled (their hashes checked) are not decoded again, and the result is "
                   "byte-identical to an uninterrupted build; a rebuild with the same sources and transforms "
                   "decodes only new or changed files, reading the rest back from the last version's shards (a "
                   "changed source or transform setting decodes every file). --fresh deletes the cache first (and "
                   "an old one left at <output>/<name>/.cache).")
@click.option("--keep-spill", is_flag=True,
              help="Keep the decoded samples in the build cache after packing. By default the pack pass frees "
                   "them as it copies them into shards, so a build needs almost no disk beyond the dataset, "
                   "and a rebuild reads unchanged samples back from the last version's shards (if that "
                   "version folder is deleted, they are decoded again). --keep-spill costs a second full copy "
                   "of the dataset on disk, and rebuilds then reuse samples whatever happens to the output: "
                   "the cache keeps a copy of every sample the version packs, those it reused from an earlier "
                   "version included (read back from there once, their hashes checked).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Keep the build cache under DIR/<name>-<hash>/ instead of $PACKER_WORK_DIR/cache (default "
                   "~/.cache/packer/work/cache). It names raw paths, ids and dates: keep it outside the output. "
                   "With --scheduler on other machines, DIR (or PACKER_WORK_DIR) must be a folder every worker "
                   "mounts at the same path. Does not change the dataset hash.")
@exits
def build(job: Path, out: str | None, workers: int | None, scheduler: str | None, quiet: bool,
          no_report: bool, resume: bool, keep_spill: bool, storage_option: tuple[str, ...],
          cache_dir: Path | None) -> None:
    """Build the dataset described by JOB (a YAML job file, see workflows/demo.yaml).

    Writes <output>/<name>/<version>/ with the shards, _index.parquet, bad_samples.jsonl and,
    last of the dataset's files, manifest.json (then report.html). The version is the first 12
    hex digits of the dataset hash, so the
    same inputs and config always land in the same folder with the same bytes.
    Exits 3 (after writing everything) when the bad fraction exceeds validate.max_bad_fraction.
    """
    from packer.api import check_built, run_build
    from packer.storage import parse_storage_options

    result = run_build(job, out=out, workers=workers, scheduler=scheduler, progress=not quiet, report=not no_report,
                       resume=resume, keep_spill=keep_spill, cache_dir=cache_dir,
                       storage_options=parse_storage_options(storage_option))
    _print_summary(result)
    check_built(result)


@main.command("demo-data")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True, help="Seed: the same seed writes the same bytes.")
@exits
def demo_data(directory: Path, seed: int) -> None:
    """Write a small seeded raw tree into DIRECTORY: CT-like DICOM series (including MONOCHROME1,
    multi-frame and RLE-compressed files), labelled photos, and planted broken files that the
    build must report (zero-byte, truncated and text '.dcm' files, a DICOM without pixels, a
    truncated JPEG, a table row whose file is missing)."""
    from packer.demo import write_demo_tree
    from packer.errors import ConfigError, blocking_file, refused_write

    blocker = blocking_file(directory)
    if blocker is not None:
        raise ConfigError(f"{directory}: {blocker} is a file, not a folder; choose another DIRECTORY")
    try:
        tree = write_demo_tree(directory, seed=seed)
    except OSError as err:  # a full or read-only disk: demo-data's fix is another DIRECTORY, not build's --out
        # a write() on a full disk names no file: name the folder it was writing into
        refused = refused_write(err, err.filename or f"a file in {directory}",
                                elsewhere="choose another DIRECTORY for packer demo-data")
        if refused is None:
            raise
        raise refused from err
    click.echo(f"wrote {tree.dicom_files} DICOM files, {tree.images} images and {len(tree.defects)} "
               f"planted defects under {tree.root}")
    for defect in tree.defects:
        click.echo(f"  {defect.relpath:<40} -> {defect.reason}")


def _register() -> None:
    from packer.commands.bench_loader import bench_loader_command
    from packer.commands.gc import gc_command
    from packer.commands.inspect import diff_command, inspect_command, ls_command
    from packer.commands.key import key_command
    from packer.commands.locate import locate_command
    from packer.commands.report import report as report_command
    from packer.commands.validate import validate_command
    from packer.commands.verify import verify_command

    for command in (validate_command, verify_command, inspect_command, diff_command, ls_command, gc_command,
                    report_command, bench_loader_command, key_command, locate_command):
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
