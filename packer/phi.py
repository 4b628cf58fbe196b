"""PHI: keyed pseudonyms for entity ids and sample ids, and date shifting for outputs.

Medical record numbers live in small spaces, so a plain hash of one is reversible by brute
force. packer uses HMAC-SHA256 with a secret key that never appears in the job file, the
manifest or any output: it comes from the file named by ``phi.key_file`` or from the
environment variable ``PACKER_PHI_KEY`` (``packer key new FILE`` makes one). When both are
set they must hold the same key: the key decides the pseudonyms, and with them the split and
``dataset_hash``, so a key exported for one project must not silently override the key file
another job names (``load_key`` refuses, exit 2). The manifest records only a fingerprint of
the key, so builds made with different keys are told apart without revealing either key; the
build summary says where the key came from.

What the key protects: raw entity ids and raw file paths cannot be recovered from shared
outputs, and they cannot be linked across datasets built with different keys. What it does
not protect: anyone holding the key can test guesses; pixels can still identify a person
(faces, burned-in text — see ``safety.burned_in_annotation``); and the local bad-sample report
and build cache name raw paths by design.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from packer.config import PhiConfig
from packer.errors import ConfigError
from packer.redact import note_names

ENV_KEY = "PACKER_PHI_KEY"
MIN_KEY_BYTES = 16
HOW_TO = ("create one with: packer key new phi.key (keep the file out of the repository, and keep it: "
          "rebuilding the dataset needs it), then set phi: {key_file: phi.key} in the job (relative to the job "
          f"file) or export {ENV_KEY}=$(cat phi.key); or write phi: {{mode: keep}} to keep raw ids on purpose")


def how_to(job_dir: Path | None) -> str:
    """:data:`HOW_TO` for a job in ``job_dir``: the key is made beside the job file, where its
    ``key_file: phi.key`` is looked for, whatever folder the command runs in (a job under
    workflows/ run from the repository's root made ./phi.key, which the job did not find)."""
    if job_dir is None:
        return HOW_TO
    try:
        made = os.path.relpath(job_dir / "phi.key")
    except ValueError:  # another drive (Windows)
        made = str(job_dir / "phi.key")
    if made == "phi.key":
        return HOW_TO
    return (f"create one beside the job file with: packer key new {made} (keep the file out of the repository, and "
            "keep it: rebuilding the dataset needs it), then set phi: {key_file: phi.key} in the job (key_file is "
            f"relative to the job file) or export {ENV_KEY}=$(cat {made}); or write phi: {{mode: keep}} to keep raw "
            "ids on purpose")


@dataclass(frozen=True)
class PhiKey:
    """A loaded PHI key and where it came from (``source``: words for messages, never the key).
    ``key`` is left out of the repr so that no log or traceback prints it."""

    key: bytes = field(repr=False)
    source: str


@dataclass(frozen=True)
class Pseudonymizer:
    """Applies the job's PHI policy. ``key`` is None when ``phi.mode`` is ``keep``; ``key_source``
    says where it came from (``PhiKey.source``)."""

    mode: str
    dates: str
    key: bytes | None = field(repr=False)
    key_source: str | None = None  # where the key came from, for the build summary (never the key)

    @property
    def active(self) -> bool:
        return self.key is not None

    @property
    def fingerprint(self) -> str | None:
        """16 hex of sha256 over a domain tag and the key: identifies the key, reveals nothing."""
        if self.key is None:
            return None
        return hashlib.sha256(b"packer-phi-key-fingerprint\x00" + self.key).hexdigest()[:16]

    def _mac(self, domain: str, value: str) -> str:
        if self.key is None:
            raise RuntimeError("no PHI key loaded; check Pseudonymizer.active before calling")
        return hmac.new(self.key, f"{domain}\x00{value}".encode(), hashlib.sha256).hexdigest()

    def entity(self, raw: str) -> str:
        """The entity id written to outputs: ``e-`` + 20 hex of HMAC, or the raw id with ``keep``,
        either of the id in NFC (:func:`entity_text`), so that one id in two Unicode forms is one
        entity. Under pseudonymization the raw id is noted for :mod:`packer.redact`: no error
        message prints it."""
        text = entity_text(raw)
        if not self.active:
            return text
        note_names((raw, text) if text != raw else (raw,))
        return f"e-{self._mac('entity', text)[:20]}"

    def lookalike(self, raw: str) -> str:
        """What tells entity ids apart that differ only in case, spacing, leading zeros or
        compatibility form (:func:`entity_form`): under pseudonymization a keyed digest of that form, so the client
        holds no raw id; the form itself with ``keep``."""
        form = entity_form(raw)
        return self._mac("entity-form", form)[:20] if self.active else form

    def path_digest(self, source: str, relpath: str) -> str:
        """16 hex identifying a raw file: keyed when pseudonymizing, plain sha256 otherwise."""
        if self.active:
            return self._mac(f"path\x00{source}", relpath)[:16]
        return hashlib.sha256(relpath.encode()).hexdigest()[:16]

    def time(self, value: str | None, first: str | None) -> str | float | None:
        """A record time as written to outputs: days since the entity's first record with
        ``dates: shift``, the ISO string with ``dates: keep``."""
        if value is None or self.dates == "keep":
            return value
        if first is None:
            return None
        return round((_parse(value) - _parse(first)).total_seconds() / 86400.0, 4)


_LEADING_ZEROS = re.compile(r"(?<![0-9])0+(?=[0-9])")


def entity_text(raw: str) -> str:
    """An entity id as packer compares and writes it: in NFC, as class folders, table cells and
    split lists are compared. ``Müller`` with one code point for the ü (as Linux keeps a folder
    name) and with ``u`` and a combining diaeresis (NFD, as a macOS export writes it) print alike
    and are one id: they were two entities, which the split could put in train and in test. An id
    already in NFC, as every ASCII id is, is itself."""
    return raw if raw.isascii() else unicodedata.normalize("NFC", raw)


def entity_form(raw: str) -> str:
    """An entity id with its compatibility forms folded (NFKC: full-width ``ＭＲＮ００４２`` is
    ``MRN0042``, as structure names compare), then case, whitespace and the leading zeros of each
    run of digits removed: ``MRN0042``, ``mrn0042``, `` MRN 42`` and ``MRN00042`` share one form,
    the way one record number looks when two systems export it. Two ids with one form are likely
    one patient, so the audit reports them (``entity_lookalikes``); they are never merged, since
    only the data's owner can tell (ids that differ only in NFC against NFD are one id already:
    :func:`entity_text`)."""
    text = "".join(_LEADING_ZEROS.sub("", unicodedata.normalize("NFKC", raw)).split())  # digit runs' zeros, spaces
    return unicodedata.normalize("NFKC", text.casefold())  # casefold may leave what NFKC folds (NFKC_Casefold)


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value) if "T" in value else datetime.combine(date.fromisoformat(value),
                                                                                 datetime.min.time())


def _fingerprint(key: bytes) -> str:
    return Pseudonymizer(mode="pseudonymize", dates="shift", key=key).fingerprint or ""


def _checked(text: str, where: str, key_file: Path | None = None) -> bytes:
    """The key in ``text``; too short, a ConfigError whose fix replaces that key where it is
    (``key_file``, the path the job reads; else the environment variable)."""
    key = text.strip().encode()
    if len(key) < MIN_KEY_BYTES:
        if key_file is not None:  # no dataset was built with it (it was refused), so replacing loses nothing
            fix = f"replace it with: packer key new --force {key_file}"
        else:
            fix = f"set a new one with: packer key new NEW.key, then export {ENV_KEY}=$(cat NEW.key)"
        raise ConfigError(f"the PHI key in {where} is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes, "
                          f"e.g. 64 hex characters: {fix} (keep the file out of the repository, and keep it: "
                          "rebuilding the dataset needs it)")
    return key


def _tilde_message(spec: str, path: Path, reason: str | None) -> str:
    """A missing ``phi.key_file`` written with a leading ``~``. A job's paths are relative to the
    job file's folder and ``~`` is not expanded (in no path of a job), so ``~/k.key`` named a
    folder ``~`` beside the job, likely not the key meant: the fix names the home folder's path."""
    home = os.path.expanduser(spec)
    said = (f"phi.key_file: cannot read {path} ({reason}): a job file does not expand ~ (its paths are relative "
            f"to the job file's folder, so {spec} is under a folder named '~' there); write the key's full path in "
            "phi.key_file")
    if home == spec:  # no home folder known for this ~
        return said
    return f"{said} ({home}, if that is the key you meant), or make a key there with: packer key new {home}"


def load_key(cfg: PhiConfig, job_dir: Path | None = None) -> PhiKey | None:
    """The secret key for ``pseudonymize`` and where it came from: the file ``phi.key_file``,
    the environment variable ``PACKER_PHI_KEY`` (an empty value counts as unset), or both when
    they hold the same key. Returns None for ``keep``. ``job_dir``: the job file's folder, where
    the message on a missing key says to make one.

    Raises ConfigError (exit 2) when no key is available (saying how to create one), when a key
    is too short or its file unreadable, and when the variable and the job's key file hold
    different keys: the key decides every pseudonym, and with them the split and
    ``dataset_hash``, so neither may win silently. The message names both places and their
    keys' fingerprints, never a key.
    """
    if cfg.mode == "keep":
        return None
    env_where = f"environment variable {ENV_KEY}"
    env_text = os.environ.get(ENV_KEY)
    env_key = _checked(env_text, env_where) if env_text else None
    file_key = None
    file_where = f"phi.key_file {cfg.key_file}"
    if cfg.key_file is not None:
        try:
            text = cfg.key_file.read_text(encoding="utf-8")
        except FileNotFoundError as err:  # the job names the file: make that one (or point at the real key)
            if cfg.key_file_spec is not None and cfg.key_file_spec.startswith("~"):
                raise ConfigError(_tilde_message(cfg.key_file_spec, cfg.key_file, err.strerror)) from err
            raise ConfigError(
                f"phi.key_file: cannot read {cfg.key_file} ({err.strerror}); create it with: packer key new "
                f"{cfg.key_file} (keep the file out of the repository, and keep it: rebuilding the dataset needs "
                "it), or point phi.key_file at the key an earlier build of this dataset used") from err
        except UnicodeDecodeError as err:  # raw random bytes (head -c 32 /dev/urandom): packer's keys are text
            raise ConfigError(
                f"phi.key_file: {cfg.key_file} is not a text key (byte {err.start} is no UTF-8 text: raw random "
                "bytes?); a key is a line of text, e.g. the 64 hex characters packer key new writes. No dataset "
                f"was built with this file (it was refused), so replacing it loses nothing: packer key new --force "
                f"{cfg.key_file}") from err
        except IsADirectoryError as err:  # key_file: keys, the folder instead of the key in it
            raise ConfigError(_folder_message(cfg.key_file)) from err
        except OSError as err:
            raise ConfigError(f"phi.key_file: cannot read {cfg.key_file} ({err.strerror}); make it readable by this "
                              f"user, or export {ENV_KEY} and remove phi.key_file from the job") from err
        file_key = _checked(text, file_where, cfg.key_file)
    if env_key is not None and file_key is not None:
        if not hmac.compare_digest(env_key, file_key):
            raise ConfigError(
                f"two different PHI keys: the {env_where} (fingerprint {_fingerprint(env_key)}) and the job's "
                f"{file_where} (fingerprint {_fingerprint(file_key)}). The key decides every pseudonym, and with "
                f"them the split and the dataset_hash, so packer will not pick one for you: unset {ENV_KEY} to use "
                "the job's key file, or remove phi.key_file from the job to use the variable (the manifest of an "
                "earlier build records the key_fingerprint it was built with)")
        return PhiKey(key=file_key, source=f"{file_where} (the same key is in {ENV_KEY})")
    if file_key is not None:
        return PhiKey(key=file_key, source=file_where)
    if env_key is not None:
        return PhiKey(key=env_key, source=env_where)
    raise ConfigError("phi.mode is pseudonymize (the default for DICOM sources) but no key was given; "
                      + how_to(job_dir))


def _folder_message(folder: Path) -> str:
    """The message for a ``phi.key_file`` that names a folder: the key files in it (a file with ``key``
    in its name) to name instead, or how to make one."""
    try:
        keys = sorted(str(p) for p in folder.iterdir() if "key" in p.name.lower() and p.is_file())
    except OSError as err:  # a folder this user may not list: nothing to name in it
        keys = []
        listed = f" (cannot list it: {err.strerror})"
    else:
        listed = ""
    said = f"phi.key_file: {folder} is a folder, not a key file; "
    if keys:
        shown = keys[:_KEYS_SHOWN] + ([f"{len(keys) - _KEYS_SHOWN} more"] if len(keys) > _KEYS_SHOWN else [])
        return said + "set phi.key_file to the key file in it: " + " or ".join(shown)
    return (said + f"it holds no key file{listed}: set phi.key_file to the key an earlier build of this dataset "
            f"used, or make one with packer key new {folder / 'NAME.key'} and set phi.key_file to that file")


#: How many key files in a folder named by phi.key_file its message lists.
_KEYS_SHOWN = 5


def unused_key_warning(cfg: PhiConfig) -> str | None:
    """The warning for a job that names ``phi.key_file`` but keeps raw ids (``phi.mode: keep``):
    the key is not used, and the job's author may think the outputs pseudonymized. None otherwise."""
    if cfg.mode != "keep" or cfg.key_file is None:
        return None
    return (f"phi.key_file names {cfg.key_file_spec}, but phi.mode is keep (the default for a job without a "
            "DICOM source): entity ids, sample ids and paths are written raw and the key is not used; set phi: "
            "{mode: pseudonymize} to pseudonymize with it (a NIfTI case folder often carries its patient's name)")


def pseudonymizer_for(cfg: PhiConfig, job_path: Path | None = None) -> Pseudonymizer:
    """The job's :class:`Pseudonymizer`, its key loaded by :func:`load_key` (whose errors it
    raises, naming ``job_path`` first, as every error about a job file does)."""
    try:
        loaded = load_key(cfg, job_path.parent if isinstance(job_path, Path) else None)
    except ConfigError as err:
        if job_path is None:
            raise
        raise ConfigError(f"{job_path}: {err}") from err
    if loaded is None:
        return Pseudonymizer(mode=cfg.mode, dates=cfg.dates, key=None)
    return Pseudonymizer(mode=cfg.mode, dates=cfg.dates, key=loaded.key, key_source=loaded.source)
