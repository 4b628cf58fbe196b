"""Reuse of unchanged shards: a planned shard whose bytes would equal a shard of an earlier
version of the same output is linked from that version instead of written again.

Identity is decided before anything is written, from the planned shard's *content key*
(:func:`shard_content_key`): sha256 over everything that determines the shard's bytes, i.e.
the shard format, :data:`KEY_FORMAT`, the manifest's format version and library versions
(packer's own among them), the target, and per sample, in order, exactly what
:func:`~packer.pipeline.assemble.write_shard` hands :func:`~packer.shards.encode.encode_sample`:
its record fields (key, ids, source, kind, label, entity, extra, raw path where kept), split,
encoded target and the sha256s of its pixels, metadata and mask as spilled. Every manifest
records its shards' keys (``splits.<split>.shards[].content_key``), so the versions in the
output's dataset folder are the only place a build looks: no cache or registry needs to survive,
and each version folder stays complete on its own.

:class:`EarlierShards` finds a key in the earlier versions; the shard's index rows (positions,
sizes, sha256s, checksums) come from that version's ``_index.parquet``, checked against its
manifest, so the new index and manifest are byte-identical to a fresh build's. The pack task
(:func:`link_earlier`) re-checks the earlier file's bytes against its manifest's sha256 before
linking (:func:`packer.files.clone_file`: reflink, hard link or copy); a file that no longer
matches is never linked, and the shard is written from its samples instead.

Shards are immutable: every shard file is made read-only when written or linked, and every
writer in the build writes a new file and renames it into place, so no write can reach an
earlier version through a link.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from packer.errors import PackerError
from packer.files import arrow_readable, canonical_json, clone_file, file_sha256
from packer.manifest import FORMAT_VERSION, MANIFEST_FILE, read_manifest
from packer.records import SpilledSample
from packer.shards.encode import encode_sample
from packer.shards.writer import ShardWrite
from packer.targets import Target

#: Part of every content key: raise it whenever a shard writer changes the bytes it writes for
#: the same samples without a library or packer version changing, so that no build links a
#: shard written the old way.
KEY_FORMAT = 1

_INDEX_COLUMNS = ["key", "shard", "position", "bytes", "sha256", "xxh3"]


def shard_content_key(samples: Sequence[SpilledSample], *, split: str, fmt: str, target: Target,
                      libraries: dict[str, str], raw_paths: bool) -> str:
    """The content key (64 hex) of a shard of ``samples`` (in shard order) in ``split``, format
    ``fmt``: equal keys mean equal shard bytes. ``libraries``: the manifest's ``libraries``;
    ``raw_paths``: records name their raw files (:attr:`~packer.pipeline.assemble.ShardTask.raw_paths`).
    ``""`` when a sample's metadata digest is unknown (a build cache entry from before it was
    recorded): such a shard is always written."""
    if any(not sample.meta_sha256 for sample in samples):
        return ""
    digest = hashlib.sha256(canonical_json({
        "key_format": KEY_FORMAT, "format": fmt, "format_version": FORMAT_VERSION, "libraries": libraries,
        "target": target.manifest_record(), "label_map": target.label_map, "split": split,
        "samples": len(samples)}))
    for sample in samples:
        encoded = encode_sample(key=sample.key, ref=sample.ref, shape=sample.shape, dtype=sample.dtype, pixels=b"",
                                metadata={}, split=split, target=target, sha256=sample.sha256,
                                relpath=sample.ref.relpath if raw_paths else None)
        digest.update(canonical_json({
            "info": encoded.info, "label": encoded.label, "label_name": encoded.label_name,
            "target": _array_text(encoded.target), "target_mask": _array_text(encoded.target_mask),
            "sha256": sample.sha256, "pixel_bytes": sample.pixel_bytes, "meta_sha256": sample.meta_sha256,
            "mask_bytes": sample.mask_bytes}))
    return digest.hexdigest()


def _array_text(values: Any) -> list[str] | None:
    return None if values is None else [str(values.dtype), values.tobytes().hex()]


@dataclass(frozen=True)
class ReuseSource:
    """An earlier version's shard file to link: its path and what its manifest records."""

    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class EarlierShard:
    """A planned shard found in an earlier version: the file to link and its index rows (a
    :class:`ShardWrite` named after the earlier file, as its writer reported it)."""

    source: ReuseSource
    columns: ShardWrite


class EarlierShards:
    """The shards of the earlier versions in a dataset folder, by content key.

    Versions whose manifest does not read cleanly (schema, ``dataset_hash``), that this user may
    not look into (a colleague's folder of mode 700) or whose format is not ``fmt`` are ignored;
    so is a version whose ``_index.parquet`` does not match its manifest.
    The newest version (``created_at``) is asked first, so a daily build reads one earlier index
    however many versions are kept; each version's index is read once, when first wanted."""

    def __init__(self, dataset_root: Path, fmt: str) -> None:
        self._by_key: dict[str, list[tuple[Path, dict[str, Any], dict[str, Any]]]] = {}
        self._rows: dict[Path, dict[str, dict[str, list[Any]]] | None] = {}
        versions: list[tuple[str, Path, dict[str, Any]]] = []
        for folder in sorted(dataset_root.iterdir()) if dataset_root.is_dir() else []:
            try:
                if folder.name.startswith(".") or not (folder / MANIFEST_FILE).is_file():
                    continue
            except PermissionError:  # a folder this user may not look into (a colleague's, mode 700): no source
                continue
            try:
                manifest = read_manifest(folder, strict=False)
            except (PackerError, OSError):  # not a readable version: simply not a source
                continue
            data = manifest.data
            if not manifest.problems and data.get("format") == fmt and isinstance(data.get("index"), dict):
                versions.append((str(data.get("created_at", "")), folder, data))
        for _, folder, data in sorted(versions, key=lambda v: (v[0], v[1].name), reverse=True):
            for split in data["splits"].values():
                for entry in split["shards"]:
                    if entry.get("content_key"):
                        self._by_key.setdefault(entry["content_key"], []).append((folder, entry, data["index"]))

    def __len__(self) -> int:
        return len(self._by_key)

    def find(self, key: str, keys: Sequence[str]) -> EarlierShard | None:
        """An earlier shard with content ``key`` whose index rows list exactly ``keys`` (the
        planned samples, in order), or None."""
        for folder, entry, index in self._by_key.get(key, []):
            rows = self._index_rows(folder, index)
            mine = rows.get(entry["file"]) if rows is not None else None
            if mine is None or mine["key"] != list(keys) or len(keys) != entry["samples"]:
                continue
            columns = ShardWrite(file=entry["file"], bytes=entry["bytes"], sha256=entry["sha256"],
                                 positions=array("q", mine["position"]), sizes=array("q", mine["bytes"]),
                                 digests=bytes.fromhex("".join(mine["sha256"])), checksums=array("Q", mine["xxh3"]))
            return EarlierShard(ReuseSource(path=str(folder / entry["file"]), bytes=entry["bytes"],
                                            sha256=entry["sha256"]), columns)
        return None

    def _index_rows(self, folder: Path, index: dict[str, Any]) -> dict[str, dict[str, list[Any]]] | None:
        if folder not in self._rows:
            self._rows[folder] = _read_index_rows(folder / index["file"], index["sha256"])
        return self._rows[folder]


def _read_index_rows(path: Path, sha256: str) -> dict[str, dict[str, list[Any]]] | None:
    """The index rows of every shard in ``path`` (an ``_index.parquet``), by shard file, each
    column a list in position order; None when the file is missing or is not the one its
    manifest records (``sha256``)."""
    try:
        if file_sha256(path)[1] != sha256:
            return None
        with arrow_readable(path) as source:
            table = pq.read_table(source, columns=_INDEX_COLUMNS)
    except OSError:
        return None
    table = table.take(pc.sort_indices(table, [("shard", "ascending"), ("position", "ascending")]))
    columns = {name: table.column(name).to_pylist() for name in _INDEX_COLUMNS}
    rows: dict[str, dict[str, list[Any]]] = {}
    start = 0
    shards = columns["shard"]
    for stop in range(1, len(shards) + 1):
        if stop == len(shards) or shards[stop] != shards[start]:
            rows[shards[start]] = {name: values[start:stop] for name, values in columns.items() if name != "shard"}
            start = stop
    return rows


def link_earlier(source: ReuseSource, path: Path) -> tuple[str, str]:
    """Link the earlier shard ``source`` to ``path`` once its bytes check out against the size
    and sha256 its manifest records: ``(how, "")`` (:func:`packer.files.clone_file`'s answer).
    A file that does not check out is never linked: ``("", why)``, a sentence for the build's
    warning, and the caller writes the shard from its samples."""
    earlier = Path(source.path)
    try:
        size, digest = file_sha256(earlier)
    except OSError as err:
        return "", f"{earlier}: could not be read to reuse it ({err})"
    if size != source.bytes or digest != source.sha256:
        return "", (f"{earlier}: its bytes no longer match its manifest (sha256 {digest[:12]}…, {size} bytes; the "
                    f"manifest records {source.sha256[:12]}…, {source.bytes} bytes), so it was not reused: "
                    f"{path.name} was written from its samples instead. Check that version with "
                    f"`packer verify {earlier.parent}`")
    return clone_file(earlier, path), ""
