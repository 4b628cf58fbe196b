"""``packer locate``: the raw file behind each sample key of a job (local, needs the job's PHI key)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from packer.commands import exits
from packer.errors import ConfigError


@click.command("locate")
@click.argument("job", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("keys", nargs=-1, required=True)
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Option for the store of sources given as URLs (repeatable).")
@click.option("-z", "--null", "null", is_flag=True,
              help="End each KEY<TAB>PATH record with a NUL byte instead of a newline, paths as they are "
                   "(for xargs -0 and scripts; as find -print0, git -z).")
@exits
def locate_command(job: Path, keys: tuple[str, ...], storage_option: tuple[str, ...], null: bool) -> None:
    """Print the raw file behind each sample KEY of JOB, one "KEY<TAB>PATH" line per key.

    A path holding a tab, a line break or another control character (or starting with a double
    quote), or a name that is not valid UTF-8, is printed quoted, as a JSON string
    ("new\\nline.png"; each byte that is not UTF-8 as \\udcXX, "caf\\udce9.png" for the
    Latin-1 byte E9: Python's os.fsencode(json.loads(...)) gives the name's bytes back), so every
    line stays one key and one path; -z prints paths as they are, their bytes as the file system
    holds them, each record ended by a NUL byte.

    A pseudonymized dataset, its leakage audit (leakage.json, validate --json/--junit) and its
    report name samples by key, never by path. This lists JOB's sources again and makes each
    file's sample id as the build does, so it needs the job's PHI key (the same key file or
    PACKER_PHI_KEY); nothing is decoded. A frame's, page's or tile's key (<id>-f0003,
    <id>-p00001, <id>-t00000_00128, <id>-p00001-t00000_00128) names its file; a finding's
    "<source>:<key>", as a warning names a sample, is taken as its key.

    \b
    Its output names raw paths: keep it local. Exits 2 when a key's file id is no file's of this
    job (a file since removed from its sources, another job's sample, or the dataset was built
    with another PHI key), when it is an entity id (e-…: the message lists that entity's sample
    keys where it can), or names a part its file cannot have (a frame of a photo, a page of a PNG
    or JPEG: only a TIFF has pages, by its first bytes, as the reader tells formats; a tile the job
    does not cut), saying which; how many frames or pages the file holds is not checked (nothing
    is decoded).
    """
    from packer.config import load_job
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import locate_samples
    from packer.storage import parse_storage_options

    loaded = load_job(job)
    refused: dict[str, str] = {}
    entities: dict[str, list[str]] = {}
    # a finding's "<source>:<key>" (the entity_lookalikes warning names samples so): the key is after the colon
    sources = {source.name for source in loaded.sources}
    asked = {key: _without_source(key, sources) for key in keys}
    located = locate_samples(loaded, list(dict.fromkeys(asked.values())),
                             pseudonymizer_for(loaded.phi, loaded.job_path),
                             storage_options=parse_storage_options(storage_option), refused=refused, entities=entities)
    found = {key: located[sample_key] for key, sample_key in asked.items()}
    for key, path in found.items():
        if path is None:
            continue
        if null:  # the name's own bytes, also where they are not UTF-8 (xargs -0 opens that file)
            click.echo(f"{key}\t".encode() + os.fsencode(path) + b"\0", nl=False)
        else:
            click.echo(f"{key}\t{_one_line(str(path))}")
    missing = [key for key, path in found.items() if path is None and asked[key] not in refused]
    problems = [f"{key}: no sample of {job} has this key: {why}" for key, why in refused.items()]
    for key in (key for key in missing if asked[key] in entities):
        samples = entities[asked[key]]
        shown = " ".join(samples[:12]) + (f" … ({len(samples)} in all)" if len(samples) > 12 else "")
        problems.append(f"{key}: an entity id of {job}, not a sample key (locate takes sample keys: _index.parquet's "
                        f"key column, a finding's key); its samples: {shown} (`packer locate {job} "
                        f"{samples[0]}` names a file)")
    for key in (key for key in missing if asked[key] not in entities and _ENTITY_ID.fullmatch(asked[key])):
        problems.append(f"{key}: an entity id (e- and 20 hex digits), not a sample key: locate takes sample keys "
                        f"(_index.parquet's key column, a finding's key); no file of {job} whose entity is known "
                        "without reading it (a table's, a path's) is of this entity: its samples are the rows of a "
                        "version's _index.parquet with this entity_id, or its files were removed since the build")
    unmade = [key for key in missing if asked[key] not in entities and not _ENTITY_ID.fullmatch(asked[key])]
    if unmade:
        problems.append(f"{', '.join(unmade)}: no file of {job} makes this sample key; it is the key of a file since "
                        "removed from the job's sources (deleted or renamed, or its table row dropped: an earlier "
                        "version's sample), another job's sample, or the dataset was built with another PHI key "
                        "(packer inspect shows a version's key fingerprint)")
    if problems:
        raise ConfigError("; ".join(problems))


#: An entity id as a pseudonymized dataset writes it (:meth:`packer.phi.Pseudonymizer.entity`)
_ENTITY_ID = re.compile(r"e-[0-9a-f]{20}")


def _without_source(key: str, sources: set[str]) -> str:
    """``key`` without a leading ``<source>:`` naming one of the job's ``sources``, as a finding
    names a sample in a warning (``raw:3f2a…``); any other text as it is (no key holds a colon)."""
    source, colon, rest = key.rpartition(":")
    return rest if colon and source in sources and rest else key


#: The characters by which Python holds a file name's bytes that are not UTF-8 (surrogateescape)
_UNDECODED = re.compile("[\udc80-\udcff]")


def _one_line(path: str) -> str:
    """``path``, or where it holds a control character (a tab or line break would split its
    line), starts with a double quote or holds bytes that are not UTF-8, the JSON string of it
    (quoted, escaped, non-ASCII kept; each such byte as its surrogate's escape, ``\\udce9``, which
    no name of UTF-8 gives, so the line names one file: the Latin-1 ``caf\\xe9.png``
    is ``"caf\\udce9.png"``, the file literally named ``caf\\xe9.png`` is that bare text)."""
    if path.startswith('"') or any(ord(c) < 32 or ord(c) == 127 for c in path) or _UNDECODED.search(path):
        return _UNDECODED.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(path, ensure_ascii=False))
    return path
