"""PHI: keyed pseudonyms for entity ids and sample ids, and date shifting for outputs.

Medical record numbers live in small spaces, so a plain hash of one is reversible by brute
force. packer uses HMAC-SHA256 with a secret key that never appears in the job file, the
manifest or any output: it comes from the environment variable ``PACKER_PHI_KEY`` or from
the file named by ``phi.key_file``. The manifest records only a fingerprint of the key, so
builds made with different keys are told apart without revealing either key.

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
from dataclasses import dataclass
from datetime import date, datetime

from packer.config import PhiConfig
from packer.errors import ConfigError

ENV_KEY = "PACKER_PHI_KEY"
MIN_KEY_BYTES = 16
HOW_TO = ("create one with: python -c \"import secrets; print(secrets.token_hex(32))\" > phi.key "
          "(keep it out of the repository), then set phi.key_file: phi.key in the job or export "
          f"{ENV_KEY}=$(cat phi.key); or write phi: {{mode: keep}} to keep raw ids on purpose")


@dataclass(frozen=True)
class Pseudonymizer:
    """Applies the job's PHI policy. ``key`` is None when ``phi.mode`` is ``keep``."""

    mode: str
    dates: str
    key: bytes | None

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
        """The entity id written to outputs: ``e-`` + 20 hex of HMAC, or the raw id with ``keep``."""
        return f"e-{self._mac('entity', raw)[:20]}" if self.active else raw

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


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value) if "T" in value else datetime.combine(date.fromisoformat(value),
                                                                                 datetime.min.time())


def load_key(cfg: PhiConfig) -> bytes | None:
    """The secret key for ``pseudonymize``, from ``PACKER_PHI_KEY`` or ``phi.key_file``.

    Raises ConfigError (exit 2) explaining how to create a key when none is available or it is
    too short. Returns None for ``keep``.
    """
    if cfg.mode == "keep":
        return None
    text = os.environ.get(ENV_KEY)
    where = f"environment variable {ENV_KEY}"
    if not text and cfg.key_file is not None:
        try:
            text = cfg.key_file.read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"phi.key_file: cannot read {cfg.key_file} ({err.strerror}); {HOW_TO}") from err
        where = str(cfg.key_file)
    if not text:
        raise ConfigError(f"phi.mode is pseudonymize (the default for DICOM sources) but no key was given; {HOW_TO}")
    key = text.strip().encode()
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"the PHI key in {where} is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes, "
                          f"e.g. 64 hex characters; {HOW_TO}")
    return key


def pseudonymizer_for(cfg: PhiConfig) -> Pseudonymizer:
    return Pseudonymizer(mode=cfg.mode, dates=cfg.dates, key=load_key(cfg))
