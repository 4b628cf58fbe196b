"""Manifest: the one model of a built version's ``manifest.json``: read, check, hash, seal, write.

:func:`read_manifest` is how every part of packer reads a manifest (the loader, ``packer
verify``, the HTML report, ``inspect``/``diff``/``ls`` and the build itself): a local path, a
version folder, a ``file://`` URL or an fsspec URL (:mod:`packer.storage`), parsed, checked
against ``schemas/manifest.schema.json`` once and its ``dataset_hash`` recomputed, into a frozen
:class:`Manifest`. ``strict`` raises the first problem found; a lenient read returns them as
:attr:`Manifest.problems` for the caller to report.

``dataset_hash`` is sha256 over the canonical JSON of every manifest field except
``created_at``, ``version`` and ``dataset_hash`` itself. It therefore covers the resolved
config, the library versions that shape the bytes, every shard's sha256 and the sample
index: one flipped byte anywhere changes it. The version folder is its first 12 hex digits.

The per-sample tables the manifest records are written by :mod:`packer.pipeline.publish`;
their columns (:data:`INDEX_SCHEMA`, :data:`SPLITS_SCHEMA`) are part of the format, so they
are described here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packer import __version__, storage
from packer.errors import ConfigError, IntegrityError, PackerError
from packer.files import atomic_output, canonical_json, folder_locked_now, parent_folder
from packer.schemas import load_schema
from packer.storage import MANIFEST_FILE  # defined by storage, which reads version folders

FORMAT_VERSION = 1
INDEX_FILE = "_index.parquet"
SPLITS_FILE = "_splits.parquet"
_UNHASHED = ("created_at", "version", "dataset_hash")
_BYTE_SHAPING = ("numpy", "opencv-python-headless", "pydicom", "pylibjpeg", "pylibjpeg-libjpeg",
                 "pylibjpeg-openjpeg", "pylibjpeg-rle", "pyarrow")
#: Libraries that decide which files are refused without shaping a packed byte: simplejpeg's strict
#: decode reports JPEG scan data cut short (its pixels are OpenCV's, a test holds it). Their versions
#: key the build cache and are checked on a cluster's workers (:func:`decoding_libraries`), but are
#: not in the manifest, so no dataset's hash moved when the check came
_VERDICT_SHAPING = ("simplejpeg",)
#: Environment variables that decide which files are refused: OpenCV's image-size limits
#: (``OPENCV_IO_MAX_IMAGE_WIDTH``, ``_HEIGHT``, ``_PIXELS``; packer.read.image checks them first,
#: as ``too_large``). Those set key the build cache under :data:`DECODING_ENVIRONMENT`; unset, the
#: key is what it was before they were in it.
_VERDICT_SHAPING_VARIABLES = "OPENCV_IO_MAX_IMAGE_"
#: The entry of :func:`decoding_libraries` that holds :data:`_VERDICT_SHAPING_VARIABLES`' values: a
#: setting, not a library, so a cluster's check of its workers' libraries leaves it out.
DECODING_ENVIRONMENT = "decoding environment"
_RESTORE = "restore the manifest from the registry copy or rebuild"


def _restore(where: str) -> str:
    """The fix for a damaged manifest at ``where``: a version's ``manifest.json`` is restored from
    its registry copy, but a registry copy (``<registry>/<name>/<version>.json``, the version's
    twelve hex digits) is the copy, so it is restored from the version folder's own manifest.json."""
    parts = where.replace("\\", "/").rsplit("/", 2)
    if not _VERSION_NAME.fullmatch(parts[-1].removesuffix(".json")) or not parts[-1].endswith(".json"):
        return _RESTORE  # a manifest.json, or a file a registry never writes (a copy under another name)
    name = parts[-2] if len(parts) > 1 else "<name>"
    return (f"this is a registry copy: copy the version folder's own {MANIFEST_FILE} "
            f"(<output>/{name}/{parts[-1].removesuffix('.json')}/{MANIFEST_FILE}) over it, or rebuild")


def library_versions(extra: Iterable[str] = ()) -> dict[str, str]:
    """Versions of packer and of every library whose behaviour shapes the packed bytes; ``extra``:
    the libraries of the source kinds a job uses beyond those (``nibabel`` for NIfTI), recorded
    only where used so that other datasets keep their ``dataset_hash``."""
    versions = {"packer": __version__}
    for name in (*_BYTE_SHAPING, *sorted(set(extra) - set(_BYTE_SHAPING))):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@functools.cache
def source_digest() -> str:
    """16 hex digits of sha256 over packer's own source: every ``packer/**/*.py``, in the order
    of its path relative to the package folder, each as that path, a NUL, its bytes and a NUL.

    Packer's version string does not move between commits, so this is what tells two packers
    apart: the build cache keys on it (:func:`decoding_libraries`), so a decoded sample or a
    bad-sample verdict made by other code is never reused. It depends on the files only, not on
    where the package lies, so an editable install and a clone of one commit agree. Computed once
    per process (about 20 ms)."""
    folder = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for relative, path in sorted((path.relative_to(folder).as_posix(), path) for path in folder.rglob("*.py")):
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def decoding_libraries(extra: Iterable[str] = ()) -> dict[str, str]:
    """:func:`library_versions` and those of the libraries that decide which files are bad
    (:data:`_VERDICT_SHAPING`): what keys the build cache's decoded samples and verdicts, and what
    every worker of a cluster must run. Its ``packer`` entry also names packer's code
    (:func:`source_digest`), so a packer upgrade decodes every file again; the manifest records
    :func:`library_versions`, which leaves the digest out, so no ``dataset_hash`` depends on it.
    Where one of OpenCV's size limits is set in this process's environment, the entry
    :data:`DECODING_ENVIRONMENT` holds them (``NAME=value``, sorted), so a verdict made under
    other limits is not reused; none set, there is no such entry."""
    versions = {**library_versions(extra), "packer": f"{__version__} source {source_digest()}"}
    for name in _VERDICT_SHAPING:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    settings = sorted(f"{name}={value}" for name, value in os.environ.items()
                      if name.startswith(_VERDICT_SHAPING_VARIABLES))
    if settings:
        versions[DECODING_ENVIRONMENT] = " ".join(settings)
    return versions


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config)).hexdigest()


def compute_dataset_hash(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest without its unhashed fields."""
    content = {k: v for k, v in manifest.items() if k not in _UNHASHED}
    return hashlib.sha256(canonical_json(content)).hexdigest()


def seal_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Fill ``dataset_hash``, ``version`` and ``created_at`` into a manifest body."""
    digest = compute_dataset_hash(manifest)
    return {**manifest, "dataset_hash": digest, "version": digest[:12],
            "created_at": datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")}


@functools.cache
def _validator() -> Any:
    import jsonschema  # here, not at the top: a loader reading a sealed manifest never needs it (0.1 s)

    schema = load_schema("manifest")
    return jsonschema.validators.validator_for(schema)(schema)


def _schema_problem(manifest: Mapping[str, Any]) -> str | None:
    """``manifest field <path>: <what is wrong>`` for the best-matching schema violation, or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator().iter_errors(manifest))
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "(top level)"
    return f"manifest field {where}: {error.message}"


def validate_manifest(manifest: Mapping[str, Any], *, source: str) -> None:
    """Raise IntegrityError if ``manifest`` breaks ``schemas/manifest.schema.json``; the message
    names ``source``, the field (``splits/train/shards/0/sha256``) and what was expected."""
    problem = _schema_problem(manifest)
    if problem is not None:
        raise IntegrityError(f"{source}: {problem}")


def _file_order(value: Any, key: str = "") -> Any:
    """``value`` with every object's keys sorted, except ``label_map``'s, which follow their
    positions: a reader looping over its keys meets the names in position order (the
    ``dataset_hash`` is over canonical, sorted JSON, so the order on disk does not change it)."""
    if isinstance(value, dict):
        if key == "label_map" and all(isinstance(v, int) for v in value.values()):
            return dict(sorted(value.items(), key=lambda item: (item[1], item[0])))
        return {k: _file_order(value[k], k) for k in sorted(value)}
    if isinstance(value, list):
        return [_file_order(v) for v in value]
    return value


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    """Validate and write ``folder/manifest.json`` atomically (sorted keys, ``label_map`` in
    position order, 2-space indent)."""
    validate_manifest(manifest, source=str(folder / MANIFEST_FILE))
    path = folder / MANIFEST_FILE
    with atomic_output(path, shared=True) as fh:
        fh.write(json.dumps(_file_order(manifest), indent=2).encode() + b"\n")
    return path


def resolve_manifest_path(path: str | Path) -> Path:
    """The manifest file of ``path``: a ``manifest.json`` (or registry copy ``<version>.json``)
    or the version folder holding one.

    Raises ConfigError (a usage error, exit 2) when ``path`` is plainly not a version: it does not
    exist, it is a file that is not JSON (a shard, say: the message names its version folder), or
    a folder with neither a manifest nor a version's files, or a version whose build stopped
    while publishing it (:func:`is_incomplete_version`: no dataset yet, as ``packer ls`` says); a
    dataset folder (``<output>/<name>/``) gets the list of its versions. Any other version folder
    whose manifest is missing (shards, no index) is returned as is: reading it then fails as a
    damaged version (IntegrityError).
    """
    candidate = Path(path)
    folder = candidate if candidate.is_dir() else candidate.parent if candidate.name == MANIFEST_FILE else None
    if folder is not None and is_incomplete_version(folder):
        if folder_locked_now(parent_folder(folder)):
            raise ConfigError(f"{candidate}: no {MANIFEST_FILE} yet, while a `packer build` (or gc) of this "
                              f"dataset runs (it holds the dataset folder's lock): the version it is publishing "
                              f"({MANIFEST_FILE} comes last), or an earlier build's leftover; wait for the build to "
                              "end, then open it (still without a manifest then, it is a leftover: build again, or "
                              "`packer gc` removes it)")
        raise ConfigError(f"{candidate}: a version whose build stopped while publishing it (it holds {INDEX_FILE} "
                          f"but no {MANIFEST_FILE}: killed, or a full disk), not a dataset; run the same `packer "
                          f"build` again to finish it, or remove it with `packer gc {parent_folder(folder)} --keep N` "
                          "(it removes all but the N newest versions too: --dry-run shows its plan)")
    if candidate.is_dir():
        manifest = candidate / MANIFEST_FILE
        if manifest.is_file() or _holds_version_files(candidate):
            return manifest
        raise ConfigError(f"{candidate}: {_not_a_version(candidate)}")
    if candidate.is_file():
        in_version = (candidate.parent / MANIFEST_FILE).is_file() or _holds_version_files(candidate.parent)
        if candidate.suffix == ".json" and (candidate.name == MANIFEST_FILE or not in_version
                                            or _is_manifest_copy(candidate)):
            return candidate
        beside = f"; pass its version folder {candidate.parent}" if in_version else ""
        raise ConfigError(f"{candidate}: not a manifest (a manifest is a {MANIFEST_FILE} or a registry copy "
                          f"<version>.json){beside}")
    if candidate.name == MANIFEST_FILE and _holds_version_files(candidate.parent):
        return candidate
    # <dataset>/<version> or <dataset>/<version>/manifest.json, with a version that is not there
    dataset = candidate.parent.parent if candidate.name == MANIFEST_FILE else candidate.parent
    # a version is named as a build names it (12 hex digits), a link to one too where it is all there is (a
    # folder of other names holding manifests, a test run's basetemp say, is no dataset folder)
    if dataset.is_dir() and any(re.fullmatch(r"[0-9a-f]{12}", name) for name in (
            *_versions_newest_last(dataset), *_version_links(dataset))):
        raise ConfigError(f"{candidate}: no such file or folder; {dataset} is {_not_a_version(dataset)}")
    raise ConfigError(f"{candidate}: no such file or folder; {_PASS_A_VERSION}")


def _is_manifest_copy(path: Path) -> bool:
    """Whether the JSON file ``path``, which sits in a version folder beside its ``manifest.json``
    or its files, is a copy of a manifest (an object with its ``format_version`` and ``dataset_hash``),
    not another file of the version (``leakage.json``): the copy is read like the manifest, the others are not
    manifests at all, so a command given one names the version folder to pass, never a damaged
    registry copy to overwrite. A file that cannot be read or parsed is no copy."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "dataset_hash" in doc and "format_version" in doc


def is_incomplete_version(folder: Path) -> bool:
    """True when ``folder`` (a folder of a dataset folder) holds a build's ``_index.parquet`` but
    no ``manifest.json``: a build publishes a version by renaming its staging folder to the
    version's name and then writing the manifest, so a build killed between the two, or one whose
    disk filled at the manifest, leaves this. It is no dataset (nothing reads it without its
    manifest); building the same job from the same inputs again replaces it, and ``packer gc``
    removes it."""
    return (not folder.name.startswith(".") and not (folder / MANIFEST_FILE).is_file()
            and (folder / INDEX_FILE).is_file())


_PASS_A_VERSION = f"pass a version folder (<output>/<name>/<version>/) or its {MANIFEST_FILE}"


def _holds_version_files(folder: Path) -> bool:
    """True when ``folder`` holds what a build writes beside its manifest (the sample index,
    the bad-sample report or shards): a version, even with its manifest gone."""
    if not folder.is_dir():
        return False
    if any((folder / name).is_file() for name in (INDEX_FILE, SPLITS_FILE, "bad_samples.jsonl")):
        return True
    return any(entry.suffix in (".tar", ".parquet") for entry in folder.iterdir() if entry.is_file())


def _versions_newest_last(folder: Path) -> list[str]:
    """The version folders in ``folder`` (each holding a manifest), oldest first by the
    manifest's ``created_at`` (unreadable ones first, by name)."""
    return [name for name, _ in _versions_and_failures(folder)]


def _versions_and_failures(folder: Path) -> list[tuple[str, bool]]:
    """:func:`_versions_newest_last`, each with whether it is a failed build's version
    (:func:`packer.badsamples.failed_build`: kept for its report, refused by a loader)."""
    from packer.badsamples import failed_build

    found = []
    for entry in folder.iterdir():
        manifest = entry / MANIFEST_FILE
        # a link (a pinned name such as prod -> <version>) is no version of its own (README: never listed)
        if entry.is_symlink() or not (entry.is_dir() and manifest.is_file()):
            continue
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            created, failed = str(doc.get("created_at") or ""), failed_build(doc) is not None
        except (OSError, ValueError, AttributeError, TypeError):
            created, failed = "", False
        found.append((created, entry.name, failed))
    return [(name, failed) for _, name, failed in sorted(found)]


def _version_links(folder: Path) -> dict[str, str]:
    """Each link in ``folder`` to a version folder (a pinned name), by name: its target as written."""
    return {entry.name: os.readlink(entry) for entry in sorted(folder.iterdir())
            if entry.is_symlink() and (entry / MANIFEST_FILE).is_file()}


def _not_a_version(folder: Path) -> str:
    """Why ``folder`` (no manifest, no version files) is not a version, and what to pass instead."""
    listed = _versions_and_failures(folder)
    versions = [name for name, _ in listed]
    usable = [name for name, failed in listed if not failed]  # a loader refuses a failed build's version
    links = _version_links(folder)
    shown = ", ".join(f"{name} -> {target}" for name, target in links.items())
    if versions:
        held = (f"a dataset folder, not a version: it holds the version(s) {', '.join(versions)} (oldest first)"
                + (f" and the link(s) {shown}" if links else "") + "; ")
        if usable and usable[-1] == versions[-1]:
            return f"{held}pass one of them, e.g. the newest, {folder / versions[-1]}"
        if usable:
            return (f"{held}pass one of them, e.g. the newest that is not a failed build, {folder / usable[-1]} (a "
                    "failed build's version, exit 3, is kept for its report, not to train on)")
        return (f"{held}pass one of them; each is a failed build's version (exit 3: bad samples over "
                "max_bad_fraction), kept for its report and refused by the loaders: fix the inputs or the job and "
                "build again for a version to train on")
    if links:  # versions kept elsewhere (another disk, another team's) and linked in: open them by their links
        return (f"a dataset folder, not a version: it holds no version of its own but the link(s) {shown}; "
                f"pass one of them, e.g. {folder / next(iter(links))}")
    copies = sorted(entry.name for entry in folder.iterdir() if entry.is_file() and entry.suffix == ".json")
    if copies:
        return (f"no {MANIFEST_FILE} here; it holds {', '.join(copies[:5])}{' …' if len(copies) > 5 else ''}: "
                f"pass one of those files (a registry copy) or the version folder it describes")
    return f"no {MANIFEST_FILE} and no dataset version here; {_PASS_A_VERSION}"


def listed_files(data: Mapping[str, Any]) -> list[str]:
    """The files a manifest lists beside itself: its sample index, its splits table and every
    shard, in that order (the names as recorded; entries without one are left out)."""
    side = [str(data[key].get("file") or "") for key in ("index", "splits_table") if isinstance(data.get(key), dict)]
    splits = data.get("splits")  # any JSON at all: this reads manifests the schema refused too
    shards = [str(shard.get("file") or "") for entry in (splits.values() if isinstance(splits, dict) else ())
              if isinstance(entry, dict) and isinstance(entry.get("shards"), list)
              for shard in entry["shards"] if isinstance(shard, dict)]
    return [name for name in (*side, *shards) if name]


def detached_manifest_error(shown: str, located: Path, data: Mapping[str, Any], consequence: str, *,
                            copies_only: bool = False) -> ConfigError | None:
    """The usage error for a manifest read where its version's files are needed but none of the
    files it lists (:func:`listed_files`) is beside it: a registry copy
    (``manifests/<name>/<version>.json``), or a ``manifest.json`` left alone. None when any is
    there (a version with some files missing is a damaged version, an integrity failure for the
    caller to report). ``shown``: the path as the user gave it; ``consequence``: what the command
    would do without them ("a report would show no samples"); ``copies_only``: refuse only a
    file not named ``manifest.json`` (a lone ``manifest.json`` is then a version whose files are
    all missing)."""
    listed = listed_files(data)
    if not listed or (copies_only and located.name == MANIFEST_FILE):
        return None
    if any((located.parent / name).exists() for name in listed):
        return None
    return ConfigError(f"{shown}: none of the {len(listed)} files this manifest lists (its index, splits table and "
                       f"shards) is beside it, so {consequence}; if this is a registry copy, pass the version folder "
                       f"it describes (<output>/{data.get('name', '<name>')}/{data.get('version', '<version>')}/)")


# -- the model --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it: file name inside the version folder, size in bytes,
    sha256 (hex), number of samples and its content key (:mod:`packer.pipeline.reuse`; None in
    manifests written before it existed)."""

    file: str
    bytes: int
    sha256: str
    samples: int
    content_key: str | None = None


@dataclass(frozen=True)
class ManifestProblem:
    """Something wrong with a manifest that was read: ``kind`` is ``format_version`` (written by
    a newer packer), ``unsafe_file`` (a file name that leaves the version folder), ``schema``
    (breaks ``schemas/manifest.schema.json``: damaged or edited), ``packer_version`` (breaks it,
    but its content still hashes to its ``dataset_hash``: sealed by a packer of another format),
    ``version_folder`` (another version's manifest) or ``dataset_hash`` (edited after the build);
    ``detail`` says what and how to fix it, without the manifest's location."""

    kind: str
    detail: str


@dataclass(frozen=True)
class Manifest:
    """A manifest as :func:`read_manifest` read it.

    ``data``: the parsed JSON object (read it, never change it). ``location``: the manifest file
    as a user would type it (a path or a URL); ``path``: the local file, None when remote.
    ``problems``: what a lenient read found (empty after a strict read); ``content_hash``: the
    sha256 the content hashes to (None when the hash was not checked). The typed accessors
    assume a manifest without ``format_version``/``unsafe_file``/``schema`` problems; use
    ``data`` on others.
    """

    data: dict[str, Any]
    location: str
    path: Path | None = None
    problems: tuple[ManifestProblem, ...] = ()
    content_hash: str | None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        """Each problem as one message naming the manifest."""
        return tuple(f"{self.location}: {p.detail}" for p in self.problems)

    @property
    def folder(self) -> Path | str:
        """The folder the manifest is in: the version folder (a local path, or the URL of a remote
        one), or, for a registry copy (:attr:`registry_copy`), the registry's folder, which holds
        none of the version's files: the version folder is wherever the build wrote it."""
        return self.path.parent if self.path is not None else self.location.rsplit("/", 1)[0]

    @property
    def registry_copy(self) -> bool:
        """Whether this is a registry copy (``manifests/<name>/<version>.json``) with none of the
        version's files beside it: a listing, whose :attr:`folder` and :meth:`locate` name files
        that are not there (open the version folder for those)."""
        return self.path is not None and detached_manifest_error(
            str(self.path), self.path, self.data, "", copies_only=True) is not None

    @property
    def detached(self) -> bool:
        """Whether none of the version's files is beside this manifest: a registry copy
        (:attr:`registry_copy`), or a ``manifest.json`` fetched or copied on its own. Such a
        manifest still says what the version holds (its config, counts, libraries); a version
        folder with some of its files missing is no such manifest but a damaged version."""
        return self.path is not None and detached_manifest_error(str(self.path), self.path, self.data, "") is not None

    def locate(self, file: str) -> Path | str:
        """A file of the version folder (a shard, the index): a local path or a URL."""
        folder = self.folder
        return folder / file if isinstance(folder, Path) else storage.join_url(folder, file)

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def version(self) -> str:
        return str(self.data["version"])

    @property
    def dataset_hash(self) -> str:
        return str(self.data["dataset_hash"])

    @property
    def format(self) -> str:
        """``webdataset`` (tar shards) or ``parquet``."""
        return str(self.data["format"])

    @property
    def sample_schema(self) -> dict[str, Any]:
        """``dtype`` (or None: mixed), ``layout`` (``CHW``), ``shape`` (or None: varied), ``shapes`` by source."""
        schema: dict[str, Any] = self.data["sample_schema"]
        return schema

    @property
    def label_map(self) -> dict[str, int]:
        """Label name → index."""
        labels: dict[str, int] = self.data["label_map"]
        return labels

    @property
    def splits(self) -> dict[str, dict[str, Any]]:
        """Split name → its entry (``samples``, ``entities``, ``class_counts``, ``shards``), manifest order."""
        splits: dict[str, dict[str, Any]] = self.data["splits"]
        return splits

    def shards(self, split: str) -> tuple[ShardEntry, ...]:
        """The shards of ``split`` in manifest order (KeyError for a split the manifest lacks)."""
        return tuple(ShardEntry(file=s["file"], bytes=s["bytes"], sha256=s["sha256"], samples=s["samples"],
                                content_key=s.get("content_key"))
                     for s in self.splits[split]["shards"])

    @property
    def index(self) -> dict[str, Any] | None:
        """The ``_index.parquet`` entry (``file``, ``bytes``, ``sha256``, ``rows``)."""
        entry: dict[str, Any] | None = self.data.get("index")
        return entry


def read_manifest(location: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                  strict: bool = True, check_hash: bool = True, schema_if_sealed: bool = True) -> Manifest:
    """Read the manifest at ``location`` into a :class:`Manifest`.

    ``location``: a ``manifest.json`` (or a registry copy ``<version>.json``) or the version
    folder holding one, as a local path, a ``file://`` URL or an fsspec URL (``s3://...``,
    read with ``storage_options``; a URL not ending in ``.json`` is taken as the folder).

    Checks, in order: ``format_version`` is one this packer reads, every file the manifest
    names stays inside the version folder, the schema (once), and, with ``check_hash``, that
    the content still hashes to ``dataset_hash``. ``strict``: the first problem raises
    IntegrityError naming the manifest; otherwise they are returned in ``problems``.
    ``schema_if_sealed=False`` (the loader's start): a manifest whose content still hashes to
    its ``dataset_hash`` is the one a build validated against the schema before sealing it, so
    the schema is not checked again (importing jsonschema is 0.1 s of every process that makes
    a dataset; the hash, 0.2 ms); any other is checked as always.

    Always raises IntegrityError when the manifest cannot be read, is not UTF-8 JSON or is not
    a JSON object; ConfigError when a local ``location`` is plainly not a version
    (:func:`resolve_manifest_path`); for a remote one ``ConfigError``/``PackerError`` when the store fails
    (:func:`packer.storage.storage_error`), ``ConfigError`` when its filesystem is not installed.
    """
    local = storage.local_path(location)
    path: Path | None = None
    if local is not None:
        path = resolve_manifest_path(local)
        where = str(path)
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise IntegrityError(f"{path}: cannot read the manifest ({err.strerror or err}); pass a manifest.json "
                                 "or the version folder holding it") from err
    else:
        where = storage.manifest_url(str(location))
        folder, name = where.rsplit("/", 1)
        version = storage.VersionFolder(folder, storage_options)
        try:
            raw = version.read_bytes(name)
        except FileNotFoundError as err:
            if not _remote_files(version):  # nothing there: a wrong URL, as a wrong local path is
                versions = _remote_versions(version, storage_options)
                if versions:
                    raise ConfigError(f"{version.where()}: a dataset folder, not a version: it holds the version(s) "
                                      f"{', '.join(versions)}; pass one of them, e.g. "
                                      f"{version.where(versions[-1])}/") from err
                raise ConfigError(f"{where}: not found, and {folder}/ holds no file; {_PASS_A_VERSION} (a URL "
                                  "ending in .json is the manifest, any other the version folder)") from err
            raise IntegrityError(f"{where}: cannot read the manifest (not found) beside the version's other files: "
                                 "in an object store, most likely an upload interrupted before its manifest (it goes "
                                 "last); run the same `packer build` again to publish it (it uploads and checks what "
                                 "is missing; a manifest copied there by hand would list shards never checked)"
                                 ) from err
        except OSError as err:
            raise storage.storage_error(where, err, doing="reading the manifest") from err
    doc = _parse(raw, where)
    content_hash = compute_dataset_hash(doc) if check_hash or not schema_if_sealed else None
    sealed = content_hash is not None and content_hash == doc.get("dataset_hash")
    problems = _shape_problems(doc, schema=schema_if_sealed or not sealed, restore=_restore(where))
    if any(p.kind == "schema" for p in problems):
        problems = _named_schema_problems(doc, problems, restore=_restore(where))
    if not check_hash:
        content_hash = None  # computed only to know whether it is sealed: not a verdict the caller asked for
    if content_hash is not None and content_hash != doc.get("dataset_hash"):
        recorded = str(doc.get("dataset_hash"))
        problems.append(ManifestProblem("dataset_hash", (
            f"dataset_hash does not match the manifest's content (it records {recorded[:16]}…, the content "
            f"hashes to {content_hash[:16]}…): the manifest was edited after the build; {_restore(where)}")))
    misplaced = _misplaced(where, doc)
    if misplaced is not None:
        problems.insert(0, ManifestProblem("version_folder", misplaced))
    if strict and problems:
        raise IntegrityError(f"{where}: {problems[0].detail}")
    return Manifest(data=doc, location=where, path=path, problems=tuple(problems), content_hash=content_hash)


_VERSION_NAME = re.compile(r"[0-9a-f]{12}")


def _misplaced(where: str, doc: dict[str, Any]) -> str | None:
    """Why a version folder's ``manifest.json`` is another version's (a build writes each version
    to the folder its version names), or None. A copied manifest made the loader call the intact
    index corrupt, and verify list every shard as damaged, never naming the manifest."""
    folder, _, name = where.replace("\\", "/").rstrip("/").rpartition("/")
    folder_name = folder.rpartition("/")[2]
    version = doc.get("version")
    if name != MANIFEST_FILE or not _VERSION_NAME.fullmatch(folder_name) or not isinstance(version, str) \
            or version == folder_name:
        return None
    return (f"it is version {version}'s manifest, but it sits in the folder of version {folder_name}: another "
            f"version's manifest was copied here, and its index and shards are not these; restore this folder's own "
            f"manifest (from its registry copy, <registry>/{doc.get('name', 'NAME')}/{folder_name}.json, where the "
            f"job names a registry:) or rebuild, or open version {version}'s own folder")


def _remote_files(version: storage.VersionFolder) -> list[str]:
    """The files of a remote version folder; none where the folder is not there. A missing
    bucket is a ConfigError that says so (the URL is wrong, or the bucket was never made)."""
    try:
        return version.files()
    except FileNotFoundError as err:
        if storage.missing_bucket(err):
            raise storage.storage_error(version.where(), err, doing="reading the manifest") from err
        return []


def _remote_versions(folder: storage.VersionFolder, storage_options: Mapping[str, Any] | None) -> list[str]:
    """The published versions in a remote dataset folder: its subfolders named as versions that
    hold a manifest (an interrupted upload's folder has none), by name."""
    names = [name for name in folder.folders() if re.fullmatch(r"[0-9a-f]{12}", name)]
    return [name for name in names
            if MANIFEST_FILE in _remote_files(storage.VersionFolder(folder.where(name), storage_options))]


def _parse(raw: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise IntegrityError(f"{where}: the manifest is not UTF-8 ({err}); {_restore(where)}") from err
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{where}: not valid JSON ({err.msg} at line {err.lineno}); {_restore(where)}") from err
    if not isinstance(doc, dict):
        raise IntegrityError(f"{where}: a manifest is a JSON object, not a JSON {type(doc).__name__}; "
                             f"{_restore(where)}")
    return doc


def _shape_problems(doc: dict[str, Any], *, schema: bool = True, restore: str = _RESTORE) -> list[ManifestProblem]:
    """A newer format_version, file names that leave the version folder, then (``schema``) the
    schema's verdict. ``restore``: the fix for a damaged manifest (:func:`_restore`)."""
    problems = []
    version = doc.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        problems.append(ManifestProblem("format_version", (
            f"format_version {version}; this packer reads version {FORMAT_VERSION}: upgrade packer to read "
            "newer datasets")))
    for where, file in _named_files(doc):
        if not _plain_file(file):
            problems.append(ManifestProblem("unsafe_file", (
                f"{where} {file!r} is not a plain path inside the version folder; {restore}")))
    problem = _schema_problem(doc) if schema else None
    if problem is not None:
        problems.append(ManifestProblem("schema", problem))
    return problems


def _named_schema_problems(doc: dict[str, Any], problems: list[ManifestProblem], *,
                           restore: str) -> list[ManifestProblem]:
    """``problems`` with the schema's verdict told by what it means. A manifest whose content still
    hashes to its ``dataset_hash`` was sealed as it stands, by a build: the packer that built it
    wrote a format this one does not read (each release added optional fields while
    ``format_version`` stayed 1, and the schema allows no field it does not know), so it is
    ``packer_version``: read it with that packer, or upgrade. Restoring it would give the same
    bytes. Any other is damaged or edited: ``schema``, with ``restore``. (A manifest edited by hand
    and re-sealed with the README's recipe is told as another packer's too: nothing tells them
    apart, and the message names the field either way.)"""
    sealed = compute_dataset_hash(doc) == doc.get("dataset_hash")
    told = []
    for problem in problems:
        if problem.kind != "schema":
            told.append(problem)
        elif sealed:
            told.append(ManifestProblem("packer_version", f"{problem.detail}; {_another_packer(doc)}"))
        else:
            told.append(ManifestProblem("schema", f"{problem.detail}; the manifest is damaged: {restore}"))
    return told


def _another_packer(doc: Mapping[str, Any]) -> str:
    """Why a sealed manifest this packer's schema refuses is not damaged, and the fix."""
    recorded = doc.get("packer_version")
    if isinstance(recorded, str) and recorded != __version__:
        by = f"packer {recorded} (its packer_version; this is packer {__version__})"
    elif isinstance(recorded, str):
        by = (f"a packer that reports this one's version (packer_version {recorded}) but ran other code (a newer "
              "or older commit)")
    else:
        by = "another packer (it records no packer_version)"
    return (f"its content still hashes to its dataset_hash, so it is intact, written by {by} in a format this "
            "packer does not read: read it with the packer that built it, or upgrade packer (if it was edited and "
            "re-sealed by hand, rebuild the version)")


def _named_files(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, file name) of every file the manifest names: shards, then top-level entries."""
    splits = doc.get("splits")
    for split, entry in (splits.items() if isinstance(splits, dict) else ()):
        shards = entry.get("shards") if isinstance(entry, dict) else None
        for i, shard in enumerate(shards if isinstance(shards, list) else ()):
            if isinstance(shard, dict) and isinstance(shard.get("file"), str):
                yield f"splits.{split}.shards[{i}].file", shard["file"]
    for key, value in sorted(doc.items()):
        if isinstance(value, dict) and isinstance(value.get("file"), str):
            yield f"{key}.file", value["file"]


def _plain_file(file: str) -> bool:
    """True for a relative path that stays inside its folder: no absolute path, ``..``, drive or URL."""
    parts = file.replace("\\", "/").split("/")
    return bool(file) and not file.startswith(("/", "\\")) and ".." not in parts and ":" not in file


def read_dataset_hash(location: str | os.PathLike[str], *,
                      storage_options: Mapping[str, Any] | None = None) -> str | None:
    """The ``dataset_hash`` of the manifest at ``location`` when it can be read, passes the
    schema and its content still hashes to it; None otherwise (absent, unreadable, damaged or
    edited), so a build never takes such a manifest for the dataset it describes."""
    try:
        manifest = read_manifest(location, storage_options=storage_options, strict=False)
    except PackerError:
        return None
    return None if manifest.problems else manifest.dataset_hash


# -- the per-sample tables' columns (written by packer.pipeline.publish) -----------------------
# Built on first use (module __getattr__): a reader of the manifest alone (the loader) never
# imports pyarrow for them, which costs 20 ms warm and far more from a cold disk.
if TYPE_CHECKING:
    import pyarrow as pa

    #: ``_index.parquet``'s columns for a class dataset; :func:`index_schema` for the others.
    INDEX_SCHEMA: pa.Schema
    #: ``_splits.parquet``'s columns.
    SPLITS_SCHEMA: pa.Schema


@functools.cache
def _index_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field("key", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        # xxh3-64 over all the sample's packed members (packer.shards.checksum): the loader's per-sample check
        pa.field("xxh3", pa.uint64(), nullable=False),
        pa.field("label", pa.int64(), nullable=False),
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
    ])


def index_schema(*, has_label: bool, target: np.dtype | None, masked: bool = False) -> pa.Schema:
    """``_index.parquet``'s columns: :data:`INDEX_SCHEMA` for a class dataset (its bytes as ever);
    without a class target ``label`` is null, and a multi-label or numeric dataset adds ``target``
    (the sample's vector, as its shard holds it). ``masked`` (a target with an ``ignore``
    policy) adds ``target_mask`` (its shard's target mask), so ``packer diff`` tells a label
    moved from a known value to ignored, which changes no ``target`` cell, as a relabel."""
    import pyarrow as pa

    base = _index_schema()
    if has_label and target is None:
        return base
    fields = [pa.field("label", pa.int64(), nullable=True) if f.name == "label" else f for f in base]
    if target is not None:
        fields.append(pa.field("target", pa.list_(pa.from_numpy_dtype(target)), nullable=False))
    if masked:
        fields.append(pa.field("target_mask", pa.list_(pa.uint8()), nullable=False))
    return pa.schema(fields)


@functools.cache
def _splits_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field("key", pa.string(), nullable=False),
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("fold", pa.int32(), nullable=True),
        pa.field("time", pa.string(), nullable=True),
        pa.field("days_since_first", pa.float64(), nullable=True),
        pa.field("label", pa.string(), nullable=False),
    ])


#: The most bytes of UTF-8 text one Arrow ``string`` column holds (its offsets are int32: about
#: 33.5M rows of the index's 64-character ``sha256``). A text column of ``_index.parquet`` or
#: ``_splits.parquet`` that holds more is written as ``large_string`` (int64 offsets, the same
#: Parquet data), the others as ``string``: a dataset whose columns fit has the bytes it always
#: had. Read at each call (:func:`text_type`), so a test may lower it to build large columns small.
STRING_MAX_BYTES = 2**31 - 1


def text_type(size: int) -> pa.DataType:
    """The Arrow type of a text column holding ``size`` bytes of UTF-8: ``string`` up to
    :data:`STRING_MAX_BYTES`, ``large_string`` beyond."""
    import pyarrow as pa

    return pa.string() if size <= STRING_MAX_BYTES else pa.large_string()


def text_size(column: Any) -> int:
    """The bytes of UTF-8 text a ``string``/``large_string`` array or chunked array holds (nulls
    hold none), read from its offsets: no copy of the text."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    total = 0
    for chunk in chunks:
        if len(chunk):
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets = np.frombuffer(chunk.buffers()[1], dtype=width, count=chunk.offset + len(chunk) + 1)
            total += int(offsets[-1]) - int(offsets[chunk.offset])
    return total


def fitted_schema(schema: pa.Schema, columns: Mapping[str, Any]) -> pa.Schema:
    """``schema`` with each ``string`` field whose column in ``columns`` (an array, or the bytes
    of text it holds as an int) holds more than :data:`STRING_MAX_BYTES` of text made
    ``large_string`` (:func:`text_type`); the rest as they are, so a table whose text fits keeps
    the schema, and the bytes, it always had."""
    import pyarrow as pa

    def size(column: Any) -> int:
        return column if isinstance(column, int) else text_size(column)

    return pa.schema([field.with_type(text_type(size(columns[field.name])))
                      if pa.types.is_string(field.type) and field.name in columns else field for field in schema],
                     metadata=schema.metadata)


_LAZY = {"INDEX_SCHEMA": _index_schema, "SPLITS_SCHEMA": _splits_schema}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
