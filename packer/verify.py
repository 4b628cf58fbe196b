"""Verify a built dataset version against its manifest, and optionally decode every sample.

Plain checks (read every byte once, decode nothing):

- the manifest (read by :func:`packer.manifest.read_manifest`, whose problems become
  findings): readable JSON, valid against ``schemas/manifest.schema.json``, its own
  ``dataset_hash`` matches its content, and its counts agree with each other;
- every listed shard and ``_index.parquet``: present, size and sha256 as recorded; in a shard
  whose sha256 does not match, each sample whose checksum (xxh3 over all its packed members,
  :mod:`packer.shards.checksum`) differs from the index's is named, so the damage is located
  to samples without decoding anything;
- the index rows agree with the shard list (shard names, splits, samples per shard);
- the version folder holds no unlisted shard-like files (``*.tar``, ``*.parquet``) that
  glob-based readers would pick up, and stale ``*.partial`` temporaries are reported as warnings.

Deep checks (``deep=True``) decode every sample with stock readers only (``tarfile``,
``numpy.load(allow_pickle=False)``, ``pyarrow``), not :mod:`packer.shards`' own readers, so a
bug there cannot hide a defect; member names follow the rule every packer reader applies
(:func:`packer.shards.members.parse_member_name`). Each sample is checked against
``sample_schema``, ``label_map`` and its ``_index.parquet`` row (per-sample sha256), so they
catch a sample whose bytes changed even when the shard hashes in the manifest were re-sealed
to match.

Every problem names the file (``shard``) and, where one is known, the sample ``key``.

The version may be local (a path or ``file://`` URL) or remote (``s3://...`` or another
fsspec URL, see :mod:`packer.storage`): remote files are hashed and decoded as they stream
in, nothing is written to disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import tarfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.config import SPLITS
from packer.errors import ConfigError, PackerError
from packer.files import TMP_SUFFIX, arrow_readable
from packer.manifest import INDEX_FILE, INDEX_SCHEMA, read_manifest, resolve_manifest_path
from packer.progress import Progress
from packer.shards.checksum import INDEX_COLUMN, describe, members_checksum
from packer.shards.members import KEY_PATTERN, irregular_member, parse_member_name
from packer.shards.parquet import SCHEMA as PARQUET_SCHEMA
from packer.shards.parquet import FilePrefix, read_parquet_samples
from packer.shards.tar import TarSample, resume_scan, scan_tar, stream_tar_samples, tar_sample_checksum
from packer.storage import VersionFolder, local_path, manifest_url
from packer.targets import Target

SHARD_SUFFIXES = {"webdataset": ".tar", "parquet": ".parquet"}
_REBUILD = "rebuild the version with `packer build` or restore the file from a good copy"
#: How a problem with a file the manifest does not list begins (no build fixes it: delete the file)
UNLISTED = "shard-like file the manifest does not list"
#: Manifest problems (:class:`packer.manifest.ManifestProblem` kinds) of an intact manifest in a format
#: this packer does not read: nothing is damaged, so the fix is :data:`UPGRADE`, not a restore
UNREAD_FORMATS = ("format_version", "packer_version")
UPGRADE = ("the manifest was written by another packer version and nothing could be checked: verify it with the "
           "packer that built it, or upgrade packer")


@dataclass(frozen=True)
class Problem:
    """One finding: the file it concerns (relative to the version folder), the sample key if
    one is known, and a message that says what differs and how to fix it."""

    shard: str
    key: str | None
    message: str

    def __str__(self) -> str:
        where = self.shard + (f" [{self.key}]" if self.key is not None else "")
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, str | None]:
        return {"shard": self.shard, "key": self.key, "message": self.message}


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify_dataset` checked and found. ``ok`` is True when ``problems`` is
    empty; ``warnings`` (stale temporaries) never make a dataset fail. ``fix``: the one fix for
    every problem where one decides it (:data:`UPGRADE`: a manifest of a format this packer does
    not read), else None (restore the named files or rebuild)."""

    manifest: str
    name: str | None
    version: str | None
    deep: bool
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...]
    files_checked: int
    bytes_checked: int
    samples_checked: int
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """A stable, JSON-ready dict (what ``packer verify --json`` prints)."""
        return {"manifest": self.manifest, "name": self.name, "version": self.version, "deep": self.deep,
                "ok": self.ok, "files_checked": self.files_checked, "bytes_checked": self.bytes_checked,
                "samples_checked": self.samples_checked,
                "problems": [p.to_json() for p in self.problems],
                "warnings": [w.to_json() for w in self.warnings]}


@dataclass
class _Findings:
    """Mutable accumulator used while verifying; frozen into a VerifyResult at the end."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    #: Listed files whose sha256 does not match the manifest's
    damaged: set[str] = field(default_factory=set)
    files: int = 0
    bytes: int = 0
    samples: int = 0
    fix: str | None = None

    def add(self, shard: str, message: str, key: str | None = None) -> None:
        self.problems.append(Problem(shard=shard, key=key, message=message))


@dataclass(frozen=True)
class _Expect:
    """What the manifest says every sample must look like."""

    target: Target
    mask: dict[str, Any] | None
    layout: str
    dtype: str | None
    shape: tuple[int, ...] | None
    shapes: dict[str, set[tuple[int, ...]]]


def _locate(manifest_path: str | Path, storage_options: Mapping[str, Any] | None) -> tuple[VersionFolder, str]:
    """The version folder and the manifest's file name, for a path or URL of either."""
    local = local_path(manifest_path)
    if local is not None:
        file = resolve_manifest_path(local)
        return VersionFolder(file.parent), file.name
    base, name = manifest_url(str(manifest_path)).rsplit("/", 1)
    return VersionFolder(base, storage_options), name


def verify_dataset(manifest_path: str | Path, *, deep: bool = False, quiet: bool = True,
                   stream: TextIO | None = None, storage_options: Mapping[str, Any] | None = None) -> VerifyResult:
    """Check a built version (``manifest.json`` or its folder) against its recorded hashes.

    ``manifest_path`` is a local path, a ``file://`` URL or an fsspec URL (``s3://...``,
    opened with ``storage_options``). Returns a report naming every problem; it never raises
    for a defect of the data (``ConfigError`` when a URL's filesystem is not installed, or when
    a local path is plainly not a version: :func:`packer.manifest.resolve_manifest_path`).
    ``deep`` also decodes every sample (see the module docstring). ``quiet=False`` prints
    progress lines to ``stream`` (default stderr). A manifest that is unreadable or breaks
    the schema ends the check early: nothing else it says can be trusted.
    """
    folder, name = _locate(manifest_path, storage_options)
    file = folder.where(name)
    found = _Findings()
    manifest = _read_manifest(folder, name, storage_options, found)
    if manifest is None:
        return _result(file, None, deep, found)
    _check_manifest_counts(name, manifest, found)
    shards = [(split, entry) for split in SPLITS for entry in manifest["splits"].get(split, {}).get("shards", [])]
    side = _side_files(manifest)
    progress = Progress("verify", len(shards) + len(side), unit="files", quiet=quiet, stream=stream)
    index_rows = _check_index(folder, manifest, shards, found)
    for entry in side:
        if entry["file"] != manifest["index"]["file"]:
            _check_file(folder, entry, found)
    progress.update(len(side), bad=len(found.problems))
    present: list[tuple[str, dict[str, Any]]] = []
    recorded = {entry["sha256"]: entry for _, entry in shards}  # a file with another's bytes is named as its copy
    for split, entry in shards:
        before = len(found.problems)
        if _check_file(folder, entry, found, recorded):
            present.append((split, entry))
        progress.update(bad=len(found.problems) - before)
    for _, entry in present:
        if entry["file"] in found.damaged:
            _name_damaged_samples(folder, manifest["format"], entry, (index_rows or {}).get(entry["file"], []),
                                  found)
    _check_extra_files(folder, {entry["file"] for _, entry in shards} | {e["file"] for e in side}, found)
    if shards and not present:
        found.add(name, f"none of the {len(shards)} listed shards is beside {file}; if this is a registry "
                        "copy, verify the version folder <output>/<name>/<version>/ instead")
    progress.close()
    if deep:
        _verify_samples(folder, manifest, present, index_rows, found, quiet=quiet, stream=stream)
    return _result(file, manifest, deep, found)


def shard_size_problems(folder: Path, manifest: Mapping[str, Any]) -> list[str]:
    """The shards ``manifest`` lists that are missing from the local version ``folder`` or of
    another size than it records, as ``"<file> (missing)"`` / ``"<file> (1,000 bytes, not 4,096)"``:
    a stat each, no hashing (:func:`verify_dataset` checks the bytes). For commands that read a
    version and trust its recorded hashes (``packer report``, ``packer diff``) to warn cheaply."""
    damaged = []
    for entry in (manifest.get("splits") or {}).values():
        for shard in (entry.get("shards") or ()) if isinstance(entry, dict) else ():
            if not isinstance(shard, dict) or not shard.get("file"):
                continue
            if not _plain_name(str(shard["file"])):  # never stat a path a received manifest points elsewhere
                damaged.append(f"{shard['file']!r} (not a plain file name inside the version folder: not opened)")
                continue
            try:
                size = (folder / str(shard["file"])).stat().st_size
            except OSError:
                damaged.append(f"{shard['file']} (missing)")
                continue
            if isinstance(shard.get("bytes"), int) and size != shard["bytes"]:
                damaged.append(f"{shard['file']} ({size:,} bytes, not {shard['bytes']:,})")
    return damaged


def _plain_name(file: str) -> bool:
    """True for a shard's file name as builds write it: one name in the version folder, no
    folder part, ``..``, drive or URL."""
    return file not in ("", ".", "..") and not any(c in file for c in "/\\:\0")


def _result(file: str, manifest: dict[str, Any] | None, deep: bool, found: _Findings) -> VerifyResult:
    return VerifyResult(manifest=file, name=(manifest or {}).get("name"), version=(manifest or {}).get("version"),
                        deep=deep, problems=tuple(found.problems), warnings=tuple(found.warnings),
                        files_checked=found.files, bytes_checked=found.bytes, samples_checked=found.samples,
                        fix=found.fix)


def _why(err: OSError) -> str:
    """An OSError's reason: the OS's words for a local file, the store's message for a remote one."""
    return err.strerror or str(err) or type(err).__name__


def _read_manifest(folder: VersionFolder, name: str, storage_options: Mapping[str, Any] | None,
                   found: _Findings) -> dict[str, Any] | None:
    """The manifest (:func:`packer.manifest.read_manifest`, lenient), its problems added as
    findings; None when it cannot be read or its shape is wrong: nothing else it says can be trusted."""
    try:
        manifest = read_manifest(folder.where(name), storage_options=storage_options, strict=False)
    except ConfigError:  # not a version, no credentials, a missing bucket: the caller's to fix (exit 2), not the data's
        raise
    except PackerError as err:  # unreadable, not a JSON object, or the store failed mid-read
        found.add(name, str(err))
        return None
    for problem in manifest.problems:
        if problem.kind == "dataset_hash":
            found.add(name, problem.detail)
            continue
        found.add(name, f"{manifest.location}: {problem.detail}")  # the detail gives the fix (restore, upgrade)
        if problem.kind in UNREAD_FORMATS:
            found.fix = UPGRADE
        return None
    data = manifest.data
    if data["version"] != data["dataset_hash"][:12]:
        found.add(name, f"version {data['version']!r} is not the first 12 hex digits of dataset_hash "
                        f"{data['dataset_hash'][:12]!r}; restore the manifest or rebuild")
    return data


def _check_manifest_counts(name: str, manifest: dict[str, Any], found: _Findings) -> None:
    """Counts the manifest states twice must agree (a re-sealed manifest can still lie)."""
    suffix = SHARD_SUFFIXES[manifest["format"]]
    seen: set[str] = set()
    total = 0
    target = Target.of_manifest(manifest)
    for split, entry in manifest["splits"].items():
        listed = sum(s["samples"] for s in entry["shards"])
        total += entry["samples"]
        if listed != entry["samples"]:
            found.add(name, f"splits.{split}: the shards hold {listed} samples but samples says {entry['samples']}")
        counts_problem = target.split_problem(entry)
        if counts_problem is not None:
            found.add(name, f"splits.{split}: {counts_problem}")
        for shard in entry["shards"]:
            if not shard["file"].startswith(f"{split}-") or not shard["file"].endswith(suffix):
                found.add(name, f"splits.{split} lists {shard['file']}, which is not a {manifest['format']} shard "
                                f"of split {split} ({split}-NNNNNN{suffix})")
            if shard["file"] in seen:
                found.add(name, f"{shard['file']} is listed twice")
            seen.add(shard["file"])
    if not total == manifest["inputs"]["samples"] == manifest["index"]["rows"]:
        found.add(name, f"sample counts disagree: splits {total}, inputs.samples {manifest['inputs']['samples']}, "
                        f"index.rows {manifest['index']['rows']}")
    indices = sorted(manifest["label_map"].values())
    if indices != list(range(len(indices))):
        found.add(name, f"label_map indices {indices} are not 0..{len(indices) - 1}")


def _check_file(folder: VersionFolder, entry: dict[str, Any], found: _Findings,
                recorded: Mapping[str, dict[str, Any]] | None = None) -> bool:
    """Size and sha256 of one listed file; True when it exists (even if it differs). ``recorded``:
    the listed shards by their recorded sha256: a shard whose bytes are another's (two files
    swapped, or one overwritten with a copy of another) is named as that shard's copy, and its
    samples, intact, are not named as damaged; one of another's size is hashed to tell."""
    recorded = recorded or {}
    path = folder.where(entry["file"])
    try:
        size = folder.size(entry["file"])
    except FileNotFoundError:
        found.add(entry["file"], f"missing from {folder.where()}: the manifest lists it ({entry['bytes']} bytes); "
                                 f"{_REBUILD}")
        return False
    except OSError as err:
        found.add(entry["file"], f"cannot stat {path} ({_why(err)})")
        return False
    if size != entry["bytes"] and not any(other["bytes"] == size and other["file"] != entry["file"]
                                          for other in recorded.values()):
        _wrong_size(entry, size, found)
        return True
    try:
        size, digest = folder.sha256(entry["file"])
    except OSError as err:
        found.add(entry["file"], f"cannot read {path} ({_why(err)})")
        return False
    found.files += 1
    found.bytes += size
    copy_of = recorded.get(digest) if digest != entry["sha256"] else None
    if copy_of is not None and copy_of["file"] != entry["file"]:
        found.add(entry["file"], f"sha256 {digest[:16]}… does not match the manifest's {entry['sha256'][:16]}…: this "
                                 f"file is {copy_of['file']}'s bytes (the sha256 the manifest records for it): "
                                 "shard files were swapped, or this one overwritten with a copy of that one; restore "
                                 f"{entry['file']} from the version's own copy, or rebuild the version with "
                                 "`packer build`")
        return True
    if size != entry["bytes"]:  # of another shard's size, but not its bytes
        _wrong_size(entry, size, found)
        return True
    if digest != entry["sha256"]:
        found.damaged.add(entry["file"])
        found.add(entry["file"], f"sha256 {digest[:16]}… does not match the manifest's {entry['sha256'][:16]}…: "
                                 f"the file was modified or corrupted after the build; {_REBUILD}")
    return True


def _wrong_size(entry: dict[str, Any], size: int, found: _Findings) -> None:
    """A listed file of another size than the manifest records: damaged (its sha256 cannot match
    either: the samples it lost or changed are named), truncated or grown."""
    kind = "truncated" if size < entry["bytes"] else "grown"
    found.damaged.add(entry["file"])
    found.add(entry["file"], f"{size} bytes, the manifest records {entry['bytes']} ({kind}); {_REBUILD}")


def _check_index(folder: VersionFolder, manifest: dict[str, Any], shards: list[tuple[str, dict[str, Any]]],
                 found: _Findings) -> dict[str, list[dict[str, Any]]] | None:
    """Hash ``_index.parquet`` and check its rows against the shard list; rows by shard file, or
    None when the index is missing, damaged or unreadable (its one finding says so, and the
    samples are then not compared with it one by one)."""
    if not _check_file(folder, manifest["index"], found):
        return None
    try:
        if folder.local is not None:
            with arrow_readable(folder.local / INDEX_FILE) as source:
                table = pq.read_table(source)
        else:
            table = pq.read_table(pa.BufferReader(folder.read_bytes(INDEX_FILE)))
    except (pa.ArrowException, OSError) as err:
        found.add(INDEX_FILE, f"unreadable as Parquet ({err}); {_REBUILD}")
        return None
    wanted = [*INDEX_SCHEMA.names, *(["target"] if Target.of_manifest(manifest).has_vector else [])]
    if INDEX_COLUMN not in table.column_names:  # an index from before per-sample checksums: still a valid index
        wanted.remove(INDEX_COLUMN)
    missing = [name for name in wanted if name not in table.column_names]
    if missing:
        found.add(INDEX_FILE, f"lacks the columns {missing}; {_REBUILD}")
        return None
    if table.num_rows != manifest["index"]["rows"]:
        found.add(INDEX_FILE, f"{table.num_rows} rows, the manifest records {manifest['index']['rows']}")
    by_shard: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for number, row in enumerate(table.select(wanted).to_pylist(), start=1):
        nulls = [column for column in ("key", "shard", "split") if not isinstance(row[column], str)]
        if nulls:  # an edited index (its sha256 re-sealed): no sample or shard to file the row under
            found.add(INDEX_FILE, f"row {number} has no {' or '.join(nulls)} (null); every row names its sample "
                                  f"key, shard and split; {_REBUILD}", key=row["key"] if "key" not in nulls else None)
            continue
        by_shard[row["shard"]].append(row)
    split_of = {entry["file"]: split for split, entry in shards}
    for shard, rows in sorted(by_shard.items()):
        if shard not in split_of:
            found.add(INDEX_FILE, f"{len(rows)} rows name shard {shard!r}, which the manifest does not list")
            continue
        for row in rows:
            if row["split"] != split_of[shard]:
                found.add(INDEX_FILE, f"row says split {row['split']!r}, shard {shard} is in {split_of[shard]!r}",
                          key=row["key"])
    for _, entry in shards:
        if len(by_shard.get(entry["file"], [])) != entry["samples"]:
            found.add(INDEX_FILE, f"{len(by_shard.get(entry['file'], []))} rows for {entry['file']}, the manifest "
                                  f"records {entry['samples']} samples")
    shards_of: dict[str, list[str]] = defaultdict(list)
    for shard, rows in by_shard.items():
        for row in rows:
            shards_of[row["key"]].append(shard)
    for key, where in sorted(shards_of.items()):
        if len(where) > 1:
            found.add(INDEX_FILE, f"key listed {len(where)} times ({', '.join(sorted(where))}); keys must be unique",
                      key=key)
    return dict(by_shard)


def _name_damaged_samples(folder: VersionFolder, fmt: str, entry: dict[str, Any], rows: list[dict[str, Any]],
                          found: _Findings) -> None:
    """For a shard whose sha256 does not match: name each sample whose checksum (the bytes of
    all its members, :mod:`packer.shards.checksum`) is no longer the one ``_index.parquet``
    records, so the damage is located to samples without ``--deep``. An index from before
    per-sample checksums names none (the shard's own finding stands)."""
    name = entry["file"]
    if not rows or any(row.get(INDEX_COLUMN) is None for row in rows):
        return
    expected: dict[str, int] = {row["key"]: int(row[INDEX_COLUMN]) for row in rows}
    seen: set[str] = set()
    try:
        for key, value in _sample_checksums(folder, fmt, entry, rows):
            if key is None or key not in expected:
                continue
            seen.add(key)
            if isinstance(value, str):
                found.add(name, f"cannot be read to check its xxh3 ({value}); {_REBUILD}", key=key)
            elif value != expected[key]:
                found.add(name, f"xxh3 {describe(value)}, _index.parquet records {describe(expected[key])}: this "
                                f"sample's bytes changed after the build; {_REBUILD}", key=key)
    except (OSError, tarfile.TarError, pa.ArrowException) as err:
        found.warnings.append(Problem(name, None, f"could not read the shard to name its damaged samples ({err}); "
                                                  "packer verify --deep decodes every sample"))
        return
    unread = sorted(set(expected) - seen)
    if unread:
        found.add(name, f"{len(unread)} samples (from {unread[0]}) could not be reached in the damaged shard to check "
                        f"them; {_REBUILD}")


def _sample_checksums(folder: VersionFolder, fmt: str, entry: dict[str, Any],
                      rows: list[dict[str, Any]]) -> Iterator[tuple[str | None, int | str]]:
    """(key, checksum or why it could not be had) of each sample of the shard ``entry`` names,
    as packer's own readers hash it (the loader's check, here without the loader): a tar shard is
    read on past a damaged member header from the offsets ``rows`` (its rows of ``_index.parquet``)
    record, as the loader reads it, so that only the samples whose headers are damaged are named
    (by their index rows), not the intact ones after them; a Parquet shard with bytes appended is
    read as the manifest's length of it, and its ``key`` and ``label`` cells that its own pages no
    longer give are taken from ``rows``, as the loader takes them, so a sample whose bytes are all
    intact is not named as damaged for a neighbour's page."""
    name, samples = entry["file"], entry["samples"]
    by_position = sorted(rows, key=lambda row: row["position"])
    whole = len(by_position) == samples
    if fmt == "webdataset":
        offsets = [int(row["position"]) for row in by_position] if whole else None
        if folder.local is not None:
            path = folder.local / name
            index = scan_tar(path)
            placed: dict[int, TarSample] = dict(enumerate(index.samples))
            lost: dict[int, str] = {}
            if index.defect is not None and index.cut is None and len(index.samples) < samples and offsets:
                placed, lost, _ = resume_scan(path, index, offsets)
            with open(path, "rb") as fh:
                for position in sorted(placed):
                    value = tar_sample_checksum(fh, placed[position])
                    yield placed[position].key, value if isinstance(value, int) else value.message
            for position, why in sorted(lost.items()):
                yield by_position[position]["key"], f"its member header cannot be read ({why})"
            return
        reached: set[int] = set()
        defect: str | None = None
        with folder.open(name) as stream:
            for item in stream_tar_samples(stream, samples, offsets):
                if isinstance(item, str):
                    defect = item
                    continue
                position, key, members = item
                reached.add(position)
                yield key, members_checksum(key, members)
        if defect is not None and offsets:
            for position in sorted(set(range(samples)) - reached):
                yield by_position[position]["key"], f"its member header cannot be read ({defect})"
        return
    with contextlib.ExitStack() as stack:
        source = _parquet_source(folder, name, entry["bytes"], stack)

        def from_index(column: str) -> list[Any] | str:
            if not whole or any(column not in row for row in by_position):
                return f"_index.parquet holds {len(by_position)} rows of {column!r} for the shard's {samples} samples"
            return [row[column] for row in by_position]

        for _, result in read_parquet_samples(source, range(samples), batch_rows=64, checksums=True,
                                              recover=from_index):
            yield result.key, result.checksum if result.checksum is not None else getattr(result, "message", "")


def _side_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Top-level manifest entries that record a file (``index``, ``splits_table``, ...)."""
    return [value for _, value in sorted(manifest.items())
            if isinstance(value, dict) and {"file", "bytes", "sha256"} <= set(value)
            and isinstance(value["file"], str) and "/" not in value["file"] and value["file"] not in ("", ".", "..")]


def _check_extra_files(folder: VersionFolder, listed: set[str], found: _Findings) -> None:
    try:
        children = folder.files()
    except OSError as err:
        found.add(folder.where().rstrip("/").rsplit("/", 1)[-1], f"cannot list {folder.where()} ({_why(err)})")
        return
    for name in children:
        if name.endswith(TMP_SUFFIX):
            found.warnings.append(Problem(name, None, "a temporary of an interrupted write (or of one still "
                                                       "running: a `packer report` writing report.html); it is not "
                                                       "part of the dataset: delete it once no such command runs"))
        elif Path(name).suffix in (".tar", ".parquet") and name not in listed and not name.startswith("_"):
            found.add(name, f"{UNLISTED}: glob-based readers would mix it in; delete it (a build never removes it; "
                            "it may belong to another version)")


def _expectations(manifest: dict[str, Any]) -> _Expect:
    schema = manifest["sample_schema"]
    return _Expect(target=Target.of_manifest(manifest), mask=manifest.get("mask"), layout=schema["layout"],
                   dtype=schema["dtype"],
                   shape=tuple(schema["shape"]) if schema["shape"] is not None else None,
                   shapes={src: {tuple(s) for s in shapes} for src, shapes in schema["shapes"].items()})


def _verify_samples(folder: VersionFolder, manifest: dict[str, Any], shards: list[tuple[str, dict[str, Any]]],
                    index_rows: dict[str, list[dict[str, Any]]] | None, found: _Findings, *, quiet: bool,
                    stream: TextIO | None) -> None:
    """Decode every sample of every present shard; keys must be unique across the dataset.
    ``index_rows`` None (no usable index): the samples are checked without their index rows."""
    expect = _expectations(manifest)
    owner: dict[str, str] = {}
    home = {row["key"]: shard for shard, rows in (index_rows or {}).items() for row in rows}  # where the index puts it
    progress = Progress("decode", sum(entry["samples"] for _, entry in shards), unit="samples", quiet=quiet,
                        stream=stream)
    for split, entry in shards:
        name = entry["file"]
        rows = {row["key"]: row for row in (index_rows or {}).get(name, [])}
        keys: list[str] = []
        damaged: dict[int, str] = {}  # a tar shard's offsets where no member header reads
        if manifest["format"] == "webdataset":
            listed = sorted(row["position"] for row in rows.values()) if len(rows) == entry["samples"] else None
            samples = _tar_samples(folder, name, found, listed, damaged)
        else:
            samples = _parquet_samples(folder, name, entry["bytes"], found)
        foreign = 0
        for key, sample in samples:
            before = len(found.problems)
            if key is not None:
                keys.append(key)
                if owner.setdefault(key, name) != name:
                    found.add(name, f"key also used in {owner[key]}; keys must be unique in a dataset", key=key)
                foreign += key not in rows and key in home
            _check_sample(name, split, key, sample, rows.get(key) if key is not None else None, expect, found,
                          indexed=index_rows is not None, home=home.get(key) if key is not None else None)
            found.samples += 1
            progress.update(bad=len(found.problems) - before)
        if len(keys) != entry["samples"]:
            found.add(name, f"{len(keys)} readable samples, the manifest records {entry['samples']}; {_REBUILD}")
        for key in sorted(set(rows) - set(keys)):
            at = rows[key].get("position")
            if at in damaged:
                found.add(name, f"its member header (byte {at}) cannot be read ({damaged[at]}); the samples after it "
                                f"were read from the offsets _index.parquet records; {_REBUILD}", key=key)
            elif foreign:
                found.add(name, f"listed in _index.parquet but not in the shard, which holds {foreign} samples of "
                                "other shards; restore the shard from the version's own copy, or rebuild the version "
                                "with `packer build`", key=key)
            else:
                found.add(name, f"listed in _index.parquet but not readable from the shard; {_REBUILD}", key=key)
    progress.close()


@contextlib.contextmanager
def _open_tar(folder: VersionFolder, name: str, start: int = 0) -> Iterator[tarfile.TarFile]:
    """A local tar opened for random access (from the member header at byte ``start``: tarfile
    starts at the file's position and keeps the file's offsets); a remote one as a stream (read
    once, front to back, from its start)."""
    if folder.local is not None:
        with open(folder.local / name, "rb") as local:
            local.seek(start)
            with tarfile.open(fileobj=local, mode="r:") as tar:
                yield tar
    else:
        with folder.open(name) as fh, tarfile.open(fileobj=fh, mode="r|") as tar:
            yield tar


def _tar_samples(folder: VersionFolder, shard: str, found: _Findings, offsets: list[int] | None = None,
                 damaged: dict[int, str] | None = None) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """Samples of a WebDataset tar, read with ``tarfile`` (members grouped by key, in order). A
    sample whose member the file ends in (a shard truncated mid-sample) is named as cut short, and
    is not one of the samples.

    ``tarfile`` ends an archive quietly at a member header it cannot read (its checksum fails),
    so one damaged header would hide every sample after it. With ``offsets`` (each sample's first
    member header, ``_index.parquet``'s ``position`` column) a local shard is read on from the next
    sample's offset, as the loader reads it: only the samples whose headers are damaged go
    unread, each offset where nothing could be read put in ``damaged`` with why, not the intact
    samples after them."""
    done: set[str] = set()
    start = 0
    resumable = offsets is not None and folder.local is not None
    while True:
        walk = _TarWalk(done)
        yield from walk.samples(folder, shard, found, start, quiet=resumable)
        if not resumable or offsets is None or walk.cut:
            if walk.error is not None:  # nothing to read on from: the file as a whole
                found.add(shard, f"not a readable tar file ({walk.error}); {_REBUILD}")
            return
        if walk.last_offset < start and damaged is not None:  # not one member read where a sample begins
            damaged[start] = walk.error or _header_defect(folder, shard, start)
        later = [offset for offset in offsets if offset > max(walk.last_offset, start)]
        if not later:
            return
        start = later[0]


def _header_defect(folder: VersionFolder, shard: str, offset: int) -> str:
    """Why the tar member header at byte ``offset`` of a local shard does not read."""
    if folder.local is None:
        return "unreadable member header"
    with open(folder.local / shard, "rb") as fh:
        fh.seek(offset)
        block = fh.read(tarfile.BLOCKSIZE)
    try:
        tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError as err:
        return str(err) or type(err).__name__
    return "a member header tarfile reads, but not as this sample's"


@dataclass
class _TarWalk:
    """One ``tarfile`` walk of a shard from one member header on (:func:`_tar_samples`):
    ``done`` the keys earlier walks gave, ``cut`` whether the file ended in a member,
    ``last_offset`` the header offset of the last member read (-1: none)."""

    done: set[str]
    cut: bool = False
    last_offset: int = -1
    #: why the walk could not begin at all (tarfile refused its first header)
    error: str | None = None

    def samples(self, folder: VersionFolder, shard: str, found: _Findings, start: int, *,
                quiet: bool) -> Iterator[tuple[str | None, dict[str, Any]]]:
        """The walk's samples; ``quiet``: a walk that cannot begin says nothing (its ``error``:
        the caller reads on from the next offset, or says so)."""
        current: str | None = None
        sample: dict[str, Any] = {}
        whole = 0  # samples read to their end
        try:
            with _open_tar(folder, shard, start) as tar:
                while True:
                    try:
                        member = tar.next()
                        if member is None:
                            break
                    except (tarfile.TarError, OSError, EOFError) as err:
                        if current is None and quiet:  # nothing read: the caller reads on from the next offset
                            self.error = str(err) or type(err).__name__
                        else:
                            found.add(shard, f"tar stream unreadable after sample {current} ({err}); {_REBUILD}")
                        break
                    self.last_offset = member.offset
                    try:
                        data = _member_bytes(tar, member)
                    except (tarfile.TarError, OSError, EOFError) as err:
                        parsed = parse_member_name(member.name)
                        cut = parsed[0] if not isinstance(parsed, str) else None
                        if current is not None and current != cut:
                            whole += 1  # the cut member is a new sample's first: the one before it ended whole
                        found.add(shard, f"the shard ends in member {member.name} ({err}) after {whole} whole "
                                         f"samples: this sample is cut short; {_REBUILD}", key=cut)
                        if current == cut:
                            current = None  # not a sample to check: its problem is said
                        self.cut = True
                        break
                    if data is None:
                        parsed = parse_member_name(member.name)
                        found.add(shard, f"{_irregular(member)}; {_REBUILD}",
                                  key=parsed[0] if not isinstance(parsed, str) else None)
                        continue
                    parsed = parse_member_name(member.name)
                    if isinstance(parsed, str):
                        found.add(shard, parsed)
                        continue
                    key, ext = parsed
                    if key != current:
                        if current is not None:
                            whole += 1
                            yield current, sample
                        if key in self.done:
                            found.add(shard, "members of this key appear in two separate groups", key=key)
                        current, sample = key, {"offset": member.offset}
                        self.done.add(key)
                    if ext in sample:
                        found.add(shard, f"member {member.name} appears twice", key=key)
                    sample[ext] = data
        except (tarfile.TarError, OSError, EOFError) as err:
            self.error = str(err) or type(err).__name__
        if current is not None:
            yield current, sample


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
    """A regular member's bytes; None for any other type, refused before a byte is read (a GNU
    sparse member's declared size, up to terabytes, is what tarfile would allocate)."""
    if not member.isreg() or member.issparse():
        return None
    handle = tar.extractfile(member)
    return handle.read() if handle is not None else None


def _irregular(member: tarfile.TarInfo) -> str:
    if member.issparse():
        return (f"member {member.name!r} is a sparse file declaring {member.size:,} bytes, not a regular file; "
                "packer writes none: refuse to extract this shard")
    return irregular_member(member.name)


def _load_npy(data: bytes) -> np.ndarray:
    """``data`` as ``numpy.load(allow_pickle=False)`` reads it, its header's shape and dtype checked
    against the bytes there first: numpy allocates what the header declares before reading.
    ValueError (or OSError, EOFError) when it does not load."""
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = header(stream)  # what np.load reads first, before it allocates
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"the header's shape {shape} is not a list of sizes")
    if math.prod(shape) * dtype.itemsize > len(data) - stream.tell():
        raise ValueError(f"the header declares {dtype} {list(shape)}, more than the {len(data) - stream.tell()} "
                         "bytes that follow it")
    return np.asarray(np.load(io.BytesIO(data), allow_pickle=False))


def _parquet_source(folder: VersionFolder, shard: str, size: int, stack: contextlib.ExitStack) -> Any:
    """What a Parquet reader opens of ``shard``: the file, or, where bytes were appended to it
    (a copy padded to a block size), the manifest's ``size`` of it, since a Parquet file's index
    is at its end (as the loader reads it; the size finding is said once, by the shard check)."""
    grown = folder.size(shard) > size > 0
    if folder.local is not None:
        source = stack.enter_context(arrow_readable(folder.local / shard))
        if not grown:
            return source
        if isinstance(source, str):
            return pa.BufferReader(pa.memory_map(source, "r").read_buffer(size))
        return FilePrefix(source, size)
    handle = stack.enter_context(folder.open(shard))
    return FilePrefix(handle, size) if grown else handle


def _parquet_samples(folder: VersionFolder, shard: str, size: int,
                     found: _Findings) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """Rows of a Parquet shard (``size``: the manifest's bytes of it), read column by column so
    one damaged column names itself."""
    columns: dict[str, list[Any] | None] = {}
    with contextlib.ExitStack() as stack:
        try:
            handle = pq.ParquetFile(_parquet_source(folder, shard, size, stack))
        except (pa.ArrowException, OSError, ValueError) as err:  # ValueError: a footer's name that is not UTF-8
            found.add(shard, f"not a readable Parquet file ({err}); {_REBUILD}")
            return
        rows = handle.metadata.num_rows
        extra = [n for n in ("target", "target_mask", "mask", "mask_shape", "mask_dtype")
                 if n in handle.schema_arrow.names]
        mask_type = handle.schema_arrow.field("target_mask").type if "target_mask" in extra else None
        if mask_type is not None and not (pa.types.is_list(mask_type) and mask_type.value_type == pa.uint8()):
            found.add(shard, f"column 'target_mask' is {mask_type}, not list<uint8>; {_REBUILD}")
        for name in [*PARQUET_SCHEMA.names, *extra]:
            if name not in handle.schema_arrow.names:
                found.add(shard, f"lacks column {name!r}; {_REBUILD}")
                columns[name] = None
                continue
            try:
                columns[name] = handle.read(columns=[name]).column(0).to_pylist()
            except (pa.ArrowException, OSError) as err:
                found.add(shard, f"column {name!r} is unreadable ({err}); {_REBUILD}")
                columns[name] = None
    for position in range(rows):
        values = {name: (col[position] if col is not None else None) for name, col in columns.items()}
        key = values["key"]
        if key is None and columns["key"] is not None:
            found.add(shard, f"row {position} has no key")
        elif key is not None and not isinstance(key, str):
            found.add(shard, f"row {position} has key {key!r}, not text; {_REBUILD}")
            key = None
        yield key, {"offset": position, "row": values}


def _check_sample(shard: str, split: str, key: str | None, sample: dict[str, Any], row: dict[str, Any] | None,
                  expect: _Expect, found: _Findings, *, indexed: bool = True, home: str | None = None) -> None:
    """Check one decoded sample against the manifest's schema and label map and its index row
    (``indexed`` False: there is no usable index to hold one; ``home``: the shard the index puts
    the key in, where ``row``, this shard's row of it, is None)."""
    def bad(message: str) -> None:
        found.add(shard, message, key=key)

    if key is not None and KEY_PATTERN.fullmatch(key) is None:
        bad("key is not [A-Za-z0-9_-]+")
    if key is not None and row is None and indexed and home is not None:
        bad(f"the shard holds another shard's sample: _index.parquet puts it in {home}, not {shard}: shard files "
            f"were swapped, or {shard} overwritten with a copy of another; restore it from the version's own copy, "
            "or rebuild the version with `packer build`")
    elif key is not None and row is None and indexed:
        bad("sample is not in _index.parquet")
    if "row" in sample:
        label, source, pixels, digest = _check_parquet_row(sample["row"], split, bad)
        cell = sample["row"].get("target")
        vector = np.asarray(cell) if cell is not None else None
        mask_cell = sample["row"].get("target_mask")  # the column's type is checked once per shard
        target_mask = np.asarray(mask_cell, dtype=np.uint8) if mask_cell is not None else None
        mask = _parquet_mask(sample["row"], bad)
    else:
        label, source, pixels, digest = _check_tar_sample(sample, split, expect, bad)
        vector = _tar_npy(sample, "target.npy", bad)
        target_mask = _tar_npy(sample, "target_mask.npy", bad)
        mask = _tar_npy(sample, "mask.npy", bad)
    if pixels is not None:
        _check_array(pixels, source or (row or {}).get("source"), expect, bad)
    if expect.mask is not None:
        _check_mask(mask, pixels, expect.mask, bad)
    elif mask is not None:
        bad("carries a mask, but the manifest records no masks")
    problem = expect.target.problem(label, vector)
    if problem is not None:
        bad(problem)
    problem = expect.target.mask_problem(target_mask)
    if problem is not None:
        bad(problem)
    if row is None:
        return
    if row["position"] != sample["offset"]:
        bad(f"found at position {sample['offset']}, _index.parquet records {row['position']}")
    if label is not None and row["label"] != label:
        bad(f"label {label}, _index.parquet records {row['label']}")
    if vector is not None and "target" in row and not np.array_equal(np.asarray(row["target"]), vector):
        bad(f"target {vector.tolist()}, _index.parquet records {row['target']}")
    if digest is not None and digest != row["sha256"]:
        bad(f"pixel bytes have sha256 {digest[:16]}…, _index.parquet records {row['sha256'][:16]}…: the sample "
            f"changed after the build; {_REBUILD}")


def _tar_npy(sample: dict[str, Any], ext: str, bad: Callable[[str], None]) -> np.ndarray | None:
    """The ``.<ext>`` member as numpy loads it (None: absent or unloadable, said through ``bad``)."""
    if ext not in sample:
        return None
    try:
        return _load_npy(sample[ext])
    except (ValueError, OSError, EOFError) as err:
        bad(f".{ext} member does not load with numpy.load(allow_pickle=False) ({err})")
        return None


def _parquet_mask(row: dict[str, Any], bad: Callable[[str], None]) -> np.ndarray | None:
    """The row's mask from its ``mask``, ``mask_shape`` and ``mask_dtype`` cells (None: no mask columns)."""
    data, shape, dtype = row.get("mask"), row.get("mask_shape"), row.get("mask_dtype")
    if data is None or shape is None or dtype is None:
        return None
    try:
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    except (TypeError, ValueError) as err:
        bad(f"mask cells do not hold {dtype} {shape} ({err})")
        return None


def _check_mask(mask: np.ndarray | None, pixels: np.ndarray | None, expect: dict[str, Any],
                bad: Callable[[str], None]) -> None:
    """A sample's mask against the manifest's ``mask``: there, F×H×W on its image's grid (a
    volume's D×H×W), the recorded dtype, only declared class ids."""
    if mask is None:
        bad("has no mask, but the manifest says every sample has one")
        return
    if str(mask.dtype) != expect["dtype"] or mask.ndim != 3:
        bad(f"mask is {mask.dtype} {tuple(mask.shape)}, the manifest says {expect['dtype']} F×H×W")
        return
    if pixels is not None and pixels.ndim == 3 and mask.shape[1:] != pixels.shape[1:]:
        bad(f"mask is {mask.shape[1]}×{mask.shape[2]}, its image {pixels.shape[1]}×{pixels.shape[2]}")
    if pixels is not None and pixels.ndim == 4 and mask.shape != pixels.shape[1:]:  # a volume's D×H×W label map
        bad(f"mask is {'×'.join(map(str, mask.shape))}, its volume {'×'.join(map(str, pixels.shape[1:]))}")
    if expect["classes"] is not None:
        extra = np.setdiff1d(np.unique(mask), np.asarray(expect["classes"]))
        if extra.size:
            bad(f"mask holds class ids {extra[:10].tolist()} the manifest does not declare")


def _check_tar_sample(sample: dict[str, Any], split: str, expect: _Expect,
                      bad: Callable[[str], None]) -> tuple[int | None, str | None, np.ndarray | None, str | None]:
    target = expect.target
    required = ["json", "npy", *(["cls"] if target.has_label else []),
                *(["target.npy"] if target.has_vector else []), *(["target_mask.npy"] if target.masked else []),
                *(["mask.npy"] if expect.mask else [])]
    for ext in required:
        if ext not in sample:
            bad(f"lacks its .{ext} member")
    label: int | None = None
    if "cls" in sample:
        try:
            label = int(sample["cls"].decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            bad(f".cls member {sample['cls'][:20]!r} is not an ASCII integer")
    source: str | None = None
    if "json" in sample:
        try:
            info = json.loads(sample["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            bad(f".json member is not UTF-8 JSON ({err})")
        except RecursionError:
            bad(".json member nests too deeply to read; packer writes a flat object")
        else:
            if not isinstance(info, dict):
                bad(".json member is not a JSON object")
            elif info.get("source") is not None and not isinstance(info.get("source"), str):
                bad(f".json says source {info.get('source')!r}, not a source name")
            else:
                source = info.get("source")
                if info.get("split") != split:
                    bad(f".json says split {info.get('split')!r}, the shard is in {split!r}")
                if label is not None and info.get("label_index") != label:
                    bad(f".json says label_index {info.get('label_index')!r}, .cls says {label}")
    array: np.ndarray | None = None
    digest: str | None = None
    if "npy" in sample:
        digest = hashlib.sha256(sample["npy"]).hexdigest()
        try:
            array = _load_npy(sample["npy"])
        except (ValueError, OSError, EOFError) as err:
            bad(f".npy member does not load with numpy.load(allow_pickle=False) ({err})")
    return label, source, array, digest


def _check_parquet_row(row: dict[str, Any], split: str,
                       bad: Callable[[str], None]) -> tuple[int | None, str | None, np.ndarray | None, str | None]:
    # every cell is checked for its type first: an edited shard's columns may hold anything
    label, source, image, shape = row["label"], row["source"], row["image"], row["shape"]
    if label is not None and (not isinstance(label, int) or isinstance(label, bool)):
        bad(f"label cell {label!r} is not a class index")
        label = None
    if source is not None and not isinstance(source, str):
        bad(f"source cell {source!r} is not a source name")
        source = None
    if image is not None and not isinstance(image, bytes):
        bad(f"image cell is {type(image).__name__}, not bytes")
        image = None
    if row["split"] is not None and row["split"] != split:
        bad(f"row says split {row['split']!r}, the shard is in {split!r}")
    digest = hashlib.sha256(image).hexdigest() if image is not None else None
    if digest is not None and row["sha256"] is not None and digest != row["sha256"]:
        bad(f"image bytes have sha256 {digest[:16]}…, the row's sha256 column says {str(row['sha256'])[:16]}…")
    if row["metadata"] is not None:
        if not isinstance(row["metadata"], str):
            bad(f"metadata cell is {type(row['metadata']).__name__}, not JSON text")
        else:
            try:
                json.loads(row["metadata"])
            except json.JSONDecodeError as err:
                bad(f"metadata is not JSON ({err})")
            except RecursionError:
                bad("metadata nests too deeply to read; packer writes a flat object")
    if image is None or shape is None or row["dtype"] is None:
        return label, source, None, digest
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in shape):
        bad(f"shape cell {shape!r} is not a list of sizes (whole numbers, none negative)")
        return label, source, None, digest
    try:
        dtype = np.dtype(str(row["dtype"]))
    except TypeError:
        bad(f"dtype {row['dtype']!r} is not a numpy dtype")
        return label, source, None, digest
    expected = math.prod(shape) * dtype.itemsize
    if len(image) != expected:
        bad(f"image holds {len(image)} bytes, shape {shape} of {dtype} needs {expected}")
        return label, source, None, digest
    try:
        return label, source, np.frombuffer(image, dtype=dtype).reshape(shape), digest
    except ValueError as err:  # a dtype numpy will not read from bytes (object, zero-size)
        bad(f"image bytes do not read as {dtype} {shape} ({err})")
        return label, source, None, digest


def _check_array(array: np.ndarray, source: str | None, expect: _Expect, bad: Callable[[str], None]) -> None:
    if expect.dtype is not None and str(array.dtype) != expect.dtype:
        bad(f"dtype {array.dtype}, sample_schema says {expect.dtype}")
    shape = tuple(int(n) for n in array.shape)
    if len(shape) != len(expect.layout):
        bad(f"shape {list(shape)} is not {'×'.join(expect.layout)}")
    elif expect.shape is not None:
        if shape != expect.shape:
            bad(f"shape {list(shape)}, sample_schema says {list(expect.shape)}")
    elif source not in expect.shapes:
        bad(f"source {source!r} has no entry in sample_schema.shapes")
    elif shape not in expect.shapes[source]:
        bad(f"shape {list(shape)} is not one of sample_schema.shapes[{source!r}] "
            f"{sorted(list(s) for s in expect.shapes[source])}")


def format_result(report: VerifyResult, *, per_shard: int = 20) -> str:
    """The human-readable report ``packer verify`` prints: a summary line, then each finding.

    At most ``per_shard`` sample-level findings are listed per file; the rest are counted
    (``VerifyResult.to_json`` always lists all of them).
    """
    mode = "deep" if report.deep else "hashes"
    samples = f", {report.samples_checked} samples decoded" if report.deep else ""
    # a manifest that could not be read (or is another version's) names no dataset: say which file was given
    named = f"{report.name} {report.version}" if report.name and report.version else report.manifest
    head = (f"verify {named} ({mode}): {report.files_checked} files "
            f"hashed ({report.bytes_checked / 2**20:.1f} MiB){samples}")
    lines = [head]
    shown: dict[str, int] = defaultdict(int)
    for problem in report.problems:
        if problem.key is not None:
            shown[problem.shard] += 1
            if shown[problem.shard] > per_shard:
                continue
        lines.append(f"  FAIL {problem}")
    for shard, count in sorted(shown.items()):
        if count > per_shard:
            lines.append(f"  ...  {count - per_shard} more sample problems in {shard} (--json lists all)")
    lines += [f"  warn {w}" for w in report.warnings]
    lines.append("  ok: every check passed" if report.ok else f"  {len(report.problems)} problem(s) found")
    return "\n".join(lines)
