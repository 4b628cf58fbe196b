"""``packer gc``: remove old versions of a dataset (thin layer over packer.gc)."""

from __future__ import annotations

import json

import click

from packer.commands import exits


@click.command("gc")
@click.argument("folder", metavar="OUTPUT/NAME")
@click.option("--keep", type=int, required=True, metavar="N",
              help="Keep the N newest versions (by the manifest's created_at); N is at least 1.")
@click.option("--dry-run", is_flag=True, help="Print the plan (versions to remove, bytes freed, bytes kept because "
                                              "shared) and change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@exits
def gc_command(folder: str, keep: int, dry_run: bool, as_json: bool) -> None:
    """Remove all but the N newest versions of the dataset folder OUTPUT/NAME, and only the bytes
    no kept version needs.

    Newest means by the manifest's created_at (the time the version was built), not by folder
    name or file times. A shard hard-linked into a kept version stays on disk (it is freed when
    its last link goes); the plan says how many bytes that keeps. Left alone: a folder whose
    manifest cannot be read, or that this user may not look into (a colleague's, of mode 700;
    never counted). Removed: .staging-* folders interrupted builds left (gc holds the
    build lock, so none is a build in progress; a link is removed, never followed). A
    version folder without manifest.json that holds a build's _index.parquet (its build stopped
    while publishing it: killed, or a full disk) is no dataset and is removed, never counted.

    \b
    Safety:
    - each removed version is first renamed to .trash-<version>-*, then its manifest is
      deleted, then the rest: an interrupted gc leaves no half version that looks complete,
      and the next gc removes the .trash-* folder;
    - it cannot know whether a running reader (a training job) uses a version: one that has
      a shard open reads on, but one that opens a shard of a removed version fails. Keep the
      versions your jobs read (--keep), or run gc when none is running;
    - while a build of the dataset runs (it holds the folder's lock) gc refuses with exit 2 and
      removes nothing; gc holds that lock while it plans what to remove and removes it, so a
      build started meanwhile is refused, and a version a build published meanwhile is counted;
    - the build cache's pointers into a removed version no longer resolve, so the next build
      decodes those files again (it says so) and writes the same bytes;
    - registry copies (manifests/<name>/<version>.json) stay: the record of what was built;
    - local output folders only: an object store (s3://...) is refused with exit 2.

    Exits 0, 2 for --keep below 1, a FOLDER that is not a local dataset folder or one a running
    build holds, 6 when the file system refuses a removal (a rerun finishes it).
    """
    from packer.gc import format_gc, plan_gc, run_gc

    plan = plan_gc(folder, keep=keep)
    if not dry_run:
        plan = run_gc(plan)  # made again under the build lock: a build may have published a version meanwhile
    if as_json:
        click.echo(json.dumps({**plan.to_json(), "dry_run": dry_run}, indent=2, sort_keys=True))
    else:
        click.echo(format_gc(plan, dry_run=dry_run))
