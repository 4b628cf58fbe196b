"""What a raw file that would not open is, the same for every source kind: its reason code and a
sentence that says why and what to do (without the file's name, which each kind prefixes its
own way).

A broken symbolic link is ``missing_file`` whether an image, a DICOM or a NIfTI source lists
it: the counts by reason (the build's summary, the manifest, the JUnit properties) must not
depend on which kind read it. A link that leads back to itself, a permission refused and any
other ``OSError`` are ``unreadable``.
"""

from __future__ import annotations

import errno
import os


def link_text(path: str) -> str | None:
    """Where the symbolic link at ``path`` points (as written in the link), or None for a file
    that is no link (or a remote path)."""
    try:
        return os.readlink(path) if os.path.islink(path) else None
    except OSError:
        return None


def open_failure(path: str, err: OSError) -> tuple[str, str]:
    """``(reason, sentence)`` for ``err``, raised opening (or stating) the raw file at ``path``."""
    link = link_text(path)
    if isinstance(err, FileNotFoundError):
        return "missing_file", (
            f"a symbolic link to {link}, which does not exist; fix the link or remove it" if link is not None
            else "file not found where discovery listed it: it was removed or moved while the build ran, or "
                 "(on a cluster) the worker that read it does not see it at that path; restore it, or mount "
                 "the data at the same path on every worker, and build again")
    if link is not None and err.errno == errno.ELOOP:
        return "unreadable", (f"a symbolic link to {link} that leads back to itself through links "
                              f"({err.strerror or err}); point it at the real file or remove it")
    return "unreadable", f"cannot read the file ({err.strerror or err}); check it and its permissions"
