"""What ``packer: internal error`` prints under ``phi: pseudonymize``: no raw path of a source's files.

A bug (an exception packer did not anticipate) ends a command with ``packer: internal error`` and
a traceback to report (:func:`packer.commands.exits`). Its message may name the file it met
(``boom at /data/ct/Doe_John_MRN0042/IM1.dcm``), and a hospital export's folder and file names
often carry names and record numbers; under ``phi: pseudonymize`` such a path must not reach a
terminal or a CI log. Every job that pseudonymizes notes its source roots here when it is loaded
(:func:`note_job`, called by :func:`packer.config.parse_job`); :func:`format_exception` then
prints the exception's type and its frames (code locations, which are no PHI) in full, and each
message with a path under a source root shown as ``<source NAME>/…`` and any other path (a table
cell, a relative path) as ``<path>``. Setting ``PACKER_RAW_TRACEBACK=1`` prints the traceback
as Python would, on a machine where the raw paths may be seen.
"""

from __future__ import annotations

import os
import re
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packer.config import JobConfig

#: The environment variable that prints an internal error's traceback unredacted.
RAW_TRACEBACK_ENV = "PACKER_RAW_TRACEBACK"

#: Source roots (as text) of the jobs loaded under pseudonymize since :func:`forget_jobs`, and
#: their source names; a process that loaded one such job redacts every internal error.
_ROOTS: dict[str, str] = {}


def note_job(job: JobConfig) -> None:
    """Note ``job``'s source roots (as written once resolved, and with links resolved) where it
    pseudonymizes (``phi.mode`` is not ``keep``); a job that keeps raw paths notes nothing."""
    if job.phi.mode == "keep":
        return
    for source in job.sources:
        root = str(source.root)
        _ROOTS[root.rstrip("/\\") or root] = source.name
        if not isinstance(source.root, str):
            _ROOTS[os.path.realpath(source.root)] = source.name


def forget_jobs() -> None:
    """Forget the roots noted so far (each CLI command starts afresh: :func:`packer.commands.exits`)."""
    _ROOTS.clear()


def redacting() -> bool:
    """Whether an internal error is printed redacted: a pseudonymizing job was loaded, and
    :data:`RAW_TRACEBACK_ENV` does not ask for the raw text."""
    return bool(_ROOTS) and os.environ.get(RAW_TRACEBACK_ENV, "") in ("", "0")


def _pattern() -> re.Pattern[str]:
    roots = sorted(_ROOTS, key=len, reverse=True)  # /data/ct2 before /data/ct
    # a root then the rest of its path, up to a quote or the line's end (a folder name may hold spaces)
    under = "|".join(f"(?P<r{i}>{re.escape(root)})(?:[/\\\\][^'\"\\n]*|(?=[\\s'\":,;)\\]]|$))"
                     for i, root in enumerate(roots))
    other = r"[^\s'\"]*[/\\][^\s'\"]*"  # any other word with a path separator in it
    return re.compile(f"{under}|{other}" if under else other)


def redact_text(text: str) -> str:
    """``text`` with every path under a noted source root as ``<source NAME>/…`` and every other
    word holding a ``/`` or ``\\`` as ``<path>``."""
    pattern = _pattern()
    names = sorted(_ROOTS, key=len, reverse=True)

    def shown(match: re.Match[str]) -> str:
        for group, value in match.groupdict().items():
            if value is not None:
                return f"<source {_ROOTS[names[int(group[1:])]]}>/…"
        return "<path>"

    return pattern.sub(shown, text)


def format_exception(err: BaseException) -> str:
    """The traceback of ``err`` (and of the exceptions it was raised from or while handling) as
    Python prints it, except that under :func:`redacting` each exception's message and notes
    are :func:`redact_text`'d; its type and frames are printed whole."""
    if not redacting():
        return "".join(traceback.format_exception(err))
    chain: list[tuple[BaseException, str]] = []
    current: BaseException | None = err
    seen: set[int] = set()
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, ("\nThe above exception was the direct cause of the following "
                                                "exception:\n\n")
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, ("\nDuring handling of the above exception, another exception "
                                                  "occurred:\n\n")
        else:
            current = None
    out: list[str] = []
    for exc, following in reversed(chain):  # the first raised first, as Python prints them
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            out.append("Traceback (most recent call last):\n")
            out.extend(traceback.format_list(frames))
        message = redact_text(str(exc))
        out.append(f"{type(exc).__module__}.{type(exc).__qualname__}" if type(exc).__module__ not in (
            "builtins", "__main__") else type(exc).__qualname__)
        out.append(f": {message}\n" if message else "\n")
        out.extend(f"{redact_text(str(note))}\n" for note in getattr(exc, "__notes__", ()) or ())
        out.append(following)
    return "".join(out)
