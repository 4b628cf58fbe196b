"""packer: raw DICOM files and images → validated, leakage-free, versioned training shards.

From Python (:mod:`packer.api`, which ``packer build`` and ``packer validate`` are thin layers
over): ``packer.build(job, out=...) -> Manifest``, ``packer.validate(job) -> ValidationResult``,
``packer.open(version_folder) -> Manifest``. They load on first use: ``import packer`` stays
cheap (no job parser, no dask, no torch).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would triple the cost of `import packer`
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

__all__ = ["Manifest", "ValidationResult", "__version__", "build", "open", "validate"]

#: The names ``packer`` gives from its modules, loaded when first asked for. By string, through
#: importlib, and not even under TYPE_CHECKING: every module imports ``packer`` itself, and an
#: import here would make each of them import the pipeline (import-linter counts type-only
#: imports too, and the layers docs/ARCHITECTURE.md draws would break). Type checkers see
#: these names as Any: ``from packer import api`` and ``api.build`` give the typed signatures.
_LAZY = {"build": "packer.api", "validate": "packer.api", "open": "packer.api",
         "ValidationResult": "packer.api", "Manifest": "packer.manifest"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
