"""``packer inspect``, ``packer diff`` and ``packer ls``: read-only views of built datasets
(thin layer over packer.inspection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from packer.commands import exits, json_document, local_folder_argument, refuse_registry_copy


def _echo_json(value: Any) -> None:
    click.echo(json_document(value))


@click.command("inspect")
@click.argument("manifest")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (a stable dict for scripts).")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Option for the store of a MANIFEST URL (s3://...), e.g. endpoint_url=http://127.0.0.1:9000.")
@exits
def inspect_command(manifest: str, as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Summarise a built dataset: MANIFEST is its manifest.json, the version folder, or a registry
    copy, as a local path or a URL (s3://bucket/prefix/name/version/).

    Shows name, version, dataset_hash, created_at, format, packer and library versions, DICOM
    decoders, the target kind and names, per split samples/entities/shards/bytes and targets
    (class balance; samples holding each label for multi-label; min/mean/max for numeric
    targets; "unlabeled"), shard sizes, the sample schema, bad-sample reasons, the split audit
    and the config. Reads only the manifest; exits 5 if it fails its hash (run `packer verify`
    to check the shards too).
    """
    from packer.inspection import format_summary, inspect_dataset
    from packer.manifest import resolve_manifest_path
    from packer.storage import is_url, parse_storage_options

    if not is_url(manifest):
        resolve_manifest_path(manifest)   # a missing version: exit 2 naming the versions its dataset folder holds
    summary = inspect_dataset(manifest, storage_options=parse_storage_options(storage_option))
    if as_json:
        _echo_json(summary)
    else:
        click.echo(format_summary(summary))


@click.command("diff")
@click.argument("old", type=click.Path(path_type=str))
@click.argument("new", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print every difference as JSON.")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Keys listed per kind of change in the text output.")
@click.option("--check", is_flag=True,
              help="First verify both versions as `packer verify` does (every shard, index and table re-hashed "
                   "against its manifest); exit 5 without a diff when either fails (2 for a registry copy, as "
                   "verify: pass the version folder).")
@exits
def diff_command(old: str, new: str, as_json: bool, limit: int, check: bool) -> None:
    """Compare two built versions OLD and NEW (manifests or version folders).

    Samples added, removed and changed (by key; content by the per-sample sha256 in each
    _index.parquet), samples that moved split or changed target (class, multi-label labels or
    numbers: "relabeled"), per split and per label; the same bytes under a new key ("rekeyed": a
    file renamed or moved to another class folder), flagged where its split changed; then the
    input and bad-sample counts, the config differences (key paths) and packer/library/decoder
    version differences ("no differences" only where the dataset_hashes agree). Versions of different target kinds are
    compared without per-sample targets, with a note saying so. A WebDataset version against
    a Parquet one reads the Parquet side's pixels to compare content, with a note saying so.
    A difference is not an error: exits 0 (5 only if a manifest, index or splits table fails its
    hash or a version folder lacks one, or a shard it has to read is missing or damaged; a
    registry copy is compared without samples, with a note). It compares the shards' recorded sha256, and
    hashes no shard itself: a shard missing or of another size than its manifest records is a
    warning on stderr; --check first verifies both versions (every file re-hashed, as `packer
    verify` does) and exits 5 without a diff, naming each problem, when either fails (2 for a
    registry copy, as verify says: it holds no file to check; pass the version folder).
    """
    from packer.inspection import diff_datasets, format_diff
    from packer.manifest import resolve_manifest_path

    old_path, new_path = (local_folder_argument(value, command="diff") for value in (old, new))
    for shown, path in ((old, old_path), (new, new_path)):
        located = resolve_manifest_path(path)   # a missing version: exit 2 naming the versions its folder holds
        if check:  # as verify says it: a registry copy is no damaged version, --check has nothing of it to hash
            refuse_registry_copy(shown, located, "--check has nothing here to verify (diff without --check "
                                 "compares it by its manifest)")
    if check:
        _check_versions({"OLD": old_path, "NEW": new_path})
    diff = diff_datasets(old_path, new_path)
    if not check:  # the manifests read: say what a stat finds wrong with their shards
        _warn_shard_sizes({"OLD": old_path, "NEW": new_path})
    if as_json:
        _echo_json(diff.to_json())
    else:
        click.echo(format_diff(diff, limit=limit))


def _check_versions(versions: dict[str, Path]) -> None:
    """``packer diff --check``: verify each version (:func:`packer.verify.verify_dataset`, its plain
    checks); IntegrityError naming every problem of those that fail, else one line on stderr."""
    from packer.errors import IntegrityError
    from packer.files import human_bytes
    from packer.verify import format_result, verify_dataset

    results = {role: verify_dataset(path) for role, path in versions.items()}
    failed = {role: result for role, result in results.items() if not result.ok}
    if failed:
        for result in failed.values():
            click.echo(format_result(result), err=True)
        named = "; ".join(f"{role} {result.manifest}: {len(result.problems)} integrity problem(s)"
                          for role, result in failed.items())
        fixes = {result.fix for result in failed.values()}
        if None not in fixes:  # manifests this packer does not read: nothing is damaged, nothing to restore
            raise IntegrityError(f"{named}. No diff: {'; '.join(sorted(str(fix) for fix in fixes))}")
        raise IntegrityError(f"{named}. No diff: it compares the sha256s the manifests record, which these files do "
                             "not hold; restore the named files from a good copy or rebuild the version with "
                             "`packer build`, then diff again")
    files = sum(r.files_checked for r in results.values())
    size = sum(r.bytes_checked for r in results.values())
    click.echo(f"checked: {files} files ({human_bytes(size)}) of both versions match their manifests", err=True)


def _warn_shard_sizes(versions: dict[str, Path]) -> None:
    """A warning on stderr per version whose local shards are missing or of another size than its
    manifest records (a stat each: the diff itself trusts the recorded sha256s). A registry copy,
    with no shard beside it, is compared by its config only and is not warned about."""
    from packer.manifest import read_manifest, resolve_manifest_path
    from packer.verify import shard_size_problems

    for role, path in versions.items():
        located = resolve_manifest_path(path)
        data = read_manifest(located, strict=False, check_hash=False).data
        damaged = shard_size_problems(located.parent, data)
        listed = sum(len(entry.get("shards") or ()) for entry in (data.get("splits") or {}).values()
                     if isinstance(entry, dict))
        if not damaged or sum(1 for d in damaged if d.endswith(" (missing)")) == listed:
            continue
        shown = ", ".join(damaged[:3]) + (f" and {len(damaged) - 3} more" if len(damaged) > 3 else "")
        click.echo(f"packer: warning: {role} {located.parent}: {len(damaged)} shard(s) missing or not the size its "
                   f"manifest records ({shown}); the diff compares recorded sha256s only: run `packer diff --check` "
                   "or `packer verify` on the version", err=True)


@click.command("ls")
@click.argument("folder_arg", required=False, metavar="[REGISTRY | OUTPUT/NAME]",
                type=click.Path(file_okay=False, path_type=str))
@click.option("--name", help="Only the dataset with this name (registry form).")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@exits
def ls_command(folder_arg: str | None, name: str | None, as_json: bool) -> None:
    """List the versions of a dataset folder (OUTPUT/NAME), or the manifests kept in a registry
    folder (REGISTRY, default ./manifests); newest created_at first.

    \b
    OUTPUT/NAME (a folder holding <version>/manifest.json folders): per version its samples,
    shards, size on disk, the bytes only it holds ("own": what removing it alone frees) and the
    bytes it shares with other versions or links elsewhere ("shared"), counted by inode, so
    hard-linked shards count once; then the total on disk against the versions' sizes added up,
    and the bytes of identical shards stored as separate copies (same sha256, different files).
    Folders that are not versions (.staging-*: a build in progress or interrupted, which the next
    build of the dataset or `packer gc` removes; .trash-*: left
    by an interrupted `packer gc`; a version folder without manifest.json: a build stopped while
    publishing it, which building the job again replaces and `packer gc` removes) are listed after.

    \b
    REGISTRY (<name>/<version>.json copies written by `packer build` when the job names a
    registry): name, version, created_at, samples per split and the dataset_hash prefix.

    Exits 2 when the folder does not exist, 5 when a listed manifest fails its hash.
    """
    from packer.errors import IntegrityError
    from packer.files import parent_folder
    from packer.inspection import DEFAULT_REGISTRY, format_registry, list_registry, registry_temporaries
    from packer.versions import format_versions, is_dataset_folder, list_versions

    folder = None if folder_arg is None else local_folder_argument(folder_arg, command="ls")
    if folder is not None and is_dataset_folder(folder):
        listing = list_versions(folder)
        if as_json:
            _echo_json(listing.to_json())
        else:
            click.echo(format_versions(listing))
        broken_versions = [v for v in listing.versions if v.problem is not None]
        if broken_versions:
            raise IntegrityError(f"{len(broken_versions)} version(s) fail their manifest check: "
                                 + ", ".join(str(v.path) for v in broken_versions) + "; run `packer verify` on them")
        return
    registry = folder or DEFAULT_REGISTRY
    # a folder's own name, where it has one: a registry folder linked in under another name
    # (manifests/photos -> /nfs/registry/photos-2024) is the dataset it is named as, beside the link
    own = None if folder is None else folder.name if folder.name not in ("", ".", "..") else folder.resolve().name
    if (folder is not None and folder.is_dir() and not (folder / "manifest.json").is_file()  # not a version folder
            and not any(folder.glob("*/*.json")) and any(folder.glob("*.json"))
            and name in (None, own)):
        # one dataset's folder of the registry: manifests/<name> (`packer ls .` inside it too)
        registry, name = parent_folder(folder), own
    entries = list_registry(registry, name=name)
    if as_json:
        _echo_json([e.to_json() for e in entries])
    elif not entries:
        datasets = sorted(p.name for p in registry.iterdir() if is_dataset_folder(p))
        shown = ", ".join(datasets[:12]) + (f", … ({len(datasets)} in all)" if len(datasets) > 12 else "")
        hint = (f"; it is an output folder of {len(datasets)} dataset(s) ({shown}): `packer ls "
                f"{registry / datasets[0]}` lists the versions of {datasets[0]}" if datasets else "")
        if (registry / "manifest.json").is_file():  # a version folder: its dataset folder is the parent
            hint = (f"; it is a version folder: `packer ls {parent_folder(registry)}` lists the versions of its "
                    f"dataset, `packer inspect {registry}` shows this one")
        elif name and not datasets:  # a misspelt --name: the registry's names, the closest first
            import difflib

            names = sorted(p.name for p in registry.iterdir() if p.is_dir() and any(p.glob("*.json")))
            close = difflib.get_close_matches(name, names, n=3)
            if names:
                hint = f"; its datasets: {', '.join(close or names[:12])}" + (" (closest)" if close else "")
        click.echo(f"no manifests under {registry}" + (f" for {name!r}" if name else "") + hint)
    else:
        click.echo(format_registry(entries))
    if not as_json:
        for path in registry_temporaries(registry, name=name):
            click.echo(f"{path}: not a manifest: a registry copy half written by a `packer build` that was killed, "
                       "or runs now; the next build of the dataset removes it once its writer is gone (do not "
                       "commit it; or delete it once no build runs)")
    broken = [e for e in entries if e.problem is not None]
    if broken:
        raise IntegrityError(f"{len(broken)} registry manifest(s) fail their check: "
                             + ", ".join(e.path for e in broken))
