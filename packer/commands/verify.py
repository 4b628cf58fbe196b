"""``packer verify``: check a built version against its manifest (thin layer over packer.verify)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from packer.commands import exits, refuse_registry_copy
from packer.errors import IntegrityError


@click.command("verify")
@click.argument("manifest")
@click.option("--deep", is_flag=True,
              help="Also decode every sample with stock readers (tarfile, numpy.load, pyarrow) and check count, "
                   "dtype, shape, label and per-sample sha256 against sample_schema and _index.parquet.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Option for the store of an s3:// (or other fsspec) URL, e.g. endpoint_url=http://127.0.0.1:9000, "
                   "anon=true, client_kwargs.region_name=eu-west-1; repeatable. AWS_* environment variables work too.")
@exits
def verify_command(manifest: str, deep: bool, as_json: bool, quiet: bool, storage_option: tuple[str, ...]) -> None:
    """Check a built dataset version: MANIFEST is its manifest.json or the version folder, a path
    or a URL (file://, s3://bucket/prefix/name/version/).

    Re-hashes every shard and side file the manifest lists (size and sha256), checks the
    manifest's own dataset_hash and counts, and reports missing shards, unlisted shard-like
    files and stale *.partial temporaries (a warning). Every problem names the shard and,
    where known, the sample key. Exits 0 when everything matches, 5 on any integrity failure,
    2 when MANIFEST is not a dataset version (a dataset folder: the message lists its versions;
    a registry copy, with none of its files beside it: pass the version folder it describes).
    """
    from packer.manifest import resolve_manifest_path
    from packer.storage import is_url, parse_storage_options
    from packer.verify import UNLISTED, format_result, verify_dataset

    if not is_url(manifest):
        located = resolve_manifest_path(manifest)  # a missing version: exit 2 naming the versions its folder holds
        refuse_registry_copy(manifest, located, "there is nothing here to verify")
    report = verify_dataset(manifest if is_url(manifest) else Path(manifest), deep=deep, quiet=quiet,
                            storage_options=parse_storage_options(storage_option))
    click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True) if as_json else format_result(report))
    if not report.ok:
        unlisted = [p for p in report.problems if p.message.startswith(UNLISTED)]
        stray = (f"delete the {len(unlisted)} file(s) the manifest does not list (no build removes them)"
                 if unlisted else "")
        if report.fix is not None:  # a manifest this packer does not read: nothing to restore
            raise IntegrityError(f"{report.manifest}: {report.fix}")
        if len(unlisted) == len(report.problems):
            fix = stray
        elif is_url(manifest):  # a rebuild checks each object of this manifest and uploads the damaged ones again
            fix = ("restore the named files from a good copy, or run the same `packer build` again: it checks every "
                   "object the manifest lists (by ETag, else read back) and uploads the damaged or missing ones anew"
                   + (f"; and {stray}" if stray else ""))
        else:
            fix = ("restore the named files from a good copy or rebuild the version with `packer build`"
                   + (f"; and {stray}" if stray else ""))
        raise IntegrityError(f"{report.manifest}: {len(report.problems)} integrity problem(s); {fix}")
