"""What ``packer: internal error`` prints under ``phi: pseudonymize``: no raw path of a source's files.

A bug (an exception packer did not anticipate) ends a command with ``packer: internal error`` and
a traceback to report (:func:`packer.commands.exits`). Its message may name the file it met
(``boom at /data/ct/Doe_John_MRN0042/IM1.dcm``), and a hospital export's folder and file names
often carry names and record numbers; under ``phi: pseudonymize`` such a path must not reach a
terminal or a CI log. Every job that pseudonymizes notes its source roots here when it is loaded
(:func:`note_job`, called by :func:`packer.config.parse_job`); :func:`format_exception` then
prints the exception's type and its frames (code locations, which are no PHI) in full, and each
message with a path under a source root shown as ``<source NAME>/…`` and any other path (a table
cell, a relative path) as ``<path>``. A bare file name (``IM_Doe_John.dcm``: no separator) is a
path too, a quoted value (``could not convert string to float: 'DOE^JOHN'``, as Python and pydicom
quote a header value they cannot use) is shown as ``'<value>'`` unless it names code (a builtin
type, a DICOM keyword, a lowercase identifier), and the names the job met in its data (each
folder and file name under a source root, each raw entity id: :func:`note_names`) are shown as
``<id>`` wherever a message puts them as a whole word or a path's part, in a
:class:`~packer.errors.PackerError`'s message too (:func:`redact_names`); one spelled as a plain
lowercase word (the ``left`` of ``left.dcm``) only quoted or in a path, never as the message's
word. What is noted belongs to the run that noted it: a command forgets what an earlier one in
the process noted (:func:`forget_jobs`), and each call of :mod:`packer.api` notes and redacts in
its own :func:`job_scope`. Setting ``PACKER_RAW_TRACEBACK=1`` prints the traceback as Python would, on a machine where
the raw paths may be seen.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import traceback
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packer.config import JobConfig

#: The environment variable that prints an internal error's traceback unredacted.
RAW_TRACEBACK_ENV = "PACKER_RAW_TRACEBACK"


@dataclass
class Noted:
    """What one run noted for redaction: the source roots (as text) of the jobs it loaded under
    pseudonymize, with their source names (``roots``), and the names met in their data
    (``names``, :func:`note_names`), each shown as ``<id>``."""

    roots: dict[str, str] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)


#: Source roots (as text) of the jobs loaded under pseudonymize since :func:`forget_jobs` outside
#: any :func:`job_scope`, and their source names: a command (which forgets them as it starts)
#: that loaded one such job redacts every internal error.
_ROOTS: dict[str, str] = {}

#: Names met in the data of the jobs noted since :func:`forget_jobs` (:func:`note_names`): shown as ``<id>``.
_NAMES: set[str] = set()

#: What the run in progress noted: the process's own (the command line's, forgotten per command)
#: unless a call of :mod:`packer.api` opened its own :func:`job_scope`. A context variable, so
#: that calls on threads of one process (each thread starts with the process's) and calls one
#: after another each redact by their own job only.
_NOTED: ContextVar[Noted | None] = ContextVar("packer_redact_noted", default=None)
_PROCESS = Noted(_ROOTS, _NAMES)


def _noted() -> Noted:
    """What the run in progress noted (:data:`_NOTED`)."""
    noted = _NOTED.get()
    return _PROCESS if noted is None else noted

#: Shorter names are not noted: a folder ``CT`` or ``1`` would hide every such word of every message.
_SHORTEST_NAME = 3

#: DICOM modalities (PS3.3 C.7.3.1.1.1), which exports use as folder names: never noted as names.
_MODALITIES = frozenset((
    "AR ASMT AU BDUS BI BMD CR CT DG DOC DX ECG EPS ES FID GM HC HD IO IOL IVOCT IVUS KER KO LEN LS MG MR M3D NM "
    "OAM OCT OP OPM OPT OPTBSV OPTENF OPV OSS OT PLAN PR PT PX REG RESP RF RG RTDOSE RTIMAGE RTPLAN RTRAD RTRECORD "
    "RTSEGANN RTSTRUCT RWV SEG SM SMR SR SRF STAIN TEXTUREMAP TG US VA XA XC").split())
#: Folder names of published datasets' layouts, and the words people name copies and scratch files
#: with (``copy.png``, ``old/``, ``backup``), which packer's own messages use too: never noted as
#: names (noted, ``copy`` hid that word of "a copy of one's image under the other").
_FOLDER_WORDS = frozenset(("images imagestr imagests labels labelstr labelsts masks mask train training test testing "
                           "valid validation val dev all data dicom nifti series study studies annotations annotation "
                           "broken extra copy copies backup old new final original raw export exports tmp temp misc "
                           "other sample samples image scan scans file files unknown none default").split())

#: The extensions that make a word a file name (a bare one: no separator), as data folders hold them.
_FILE_EXTENSIONS = ("dcm|dicom|ima|img|hdr|nii|gz|bz2|xz|zip|tar|png|jpe?g|jp2|j2k|tiff?|bmp|webp|gif|svs|ndpi|"
                    "mrxs|scn|csv|tsv|txt|json|jsonl|xml|parquet|npy|npz|mha|mhd|nrrd|raw|h5|hdf5|mat")
_FILE_NAME = re.compile(rf"(?<![\w/\\.])[^\s'\"/\\:,;()\[\]{{}}]*[\w)\]]\.(?i:{_FILE_EXTENSIONS})(?![\w.])")
#: A value quoted as Python's repr quotes it: the quote not inside a word (an apostrophe: "file's").
_QUOTED = re.compile(r"(?<!\w)'(?P<qs>[^'\n]*)'(?!\w)|(?<!\w)\"(?P<qd>[^\"\n]*)\"(?!\w)")
#: A quoted word that names code: a lowercase identifier or dotted module path (``'shape'``,
#: ``'numpy.float32'``); a header value (a name, an id) is upper case or holds ``^``, spaces or digits first.
_CODE_WORD = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*")
#: What a message is cut into to look each piece up in the noted names.
_TOKEN = re.compile(r"[^\s'\"()\[\]{},;=]+")
#: A noted name spelled as the words of packer's messages are (lowercase letters, words apart: the
#: ``left`` of ``left.dcm``): shown as ``<id>`` only where it stands as a name, quoted or a part of a
#: path, never where it is a word of the message ("all files are left out on purpose").
_PLAIN_WORDS = re.compile(r"[a-z]+(?: [a-z]+)*")


def note_job(job: JobConfig) -> None:
    """Note ``job``'s source roots (as written once resolved, and with links resolved) where it
    pseudonymizes (``phi.mode`` is not ``keep``); a job that keeps raw paths notes nothing."""
    if job.phi.mode == "keep":
        return
    roots = _noted().roots
    for source in job.sources:
        root = str(source.root)
        roots[root.rstrip("/\\") or root] = source.name
        if not isinstance(source.root, str):
            roots[os.path.realpath(source.root)] = source.name


def note_names(names: Iterable[str]) -> None:
    """Note names met in a pseudonymizing job's data (a file's folder and file names under its
    source root, a raw entity id): :func:`redact_text` and :func:`redact_names` show each as
    ``<id>``. Names shorter than three characters are not noted; nothing is noted unless a job
    that pseudonymizes was loaded (:func:`note_job`)."""
    noted = _noted()
    if not noted.roots:
        return
    noted.names.update(name for name in (n.strip() for n in names) if len(name) >= _SHORTEST_NAME and not _common(name))


def _common(name: str) -> bool:
    """A folder name every dataset uses (``SEG``, ``RTSTRUCT``, ``imagesTr``, ``train``) names no
    person; noted, it would hide that word of every message."""
    return name.upper() in _MODALITIES or name.lower() in _FOLDER_WORDS or name in _code_names()


def forget_jobs() -> None:
    """Forget the roots and names noted so far (each CLI command starts afresh: :func:`packer.commands.exits`)."""
    noted = _noted()
    noted.roots.clear()
    noted.names.clear()


@contextlib.contextmanager
def job_scope(noted: Noted | None = None) -> Iterator[Noted]:
    """Inside, roots and names are noted in, and messages redacted by, ``noted`` alone (default:
    a new, empty one), not what another run of the process noted: a call of :mod:`packer.api`
    redacts by the job it runs, whatever ran before it or runs beside it on another thread."""
    noted = Noted() if noted is None else noted
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


def redacting() -> bool:
    """Whether an internal error is printed redacted: a pseudonymizing job was loaded (in this
    :func:`job_scope`), and :data:`RAW_TRACEBACK_ENV` does not ask for the raw text."""
    return bool(_noted().roots) and os.environ.get(RAW_TRACEBACK_ENV, "") in ("", "0")


def _pattern() -> re.Pattern[str]:
    roots = sorted(_noted().roots, key=len, reverse=True)  # /data/ct2 before /data/ct
    # a root then the rest of its path, up to a quote or the line's end (a folder name may hold spaces)
    under = "|".join(f"(?P<r{i}>{re.escape(root)})(?:[/\\\\][^'\"\\n]*|(?=[\\s'\":,;)\\]]|$))"
                     for i, root in enumerate(roots))
    other = r"[^\s'\"]*[/\\][^\s'\"]*"  # any other word with a path separator in it
    return re.compile(f"{under}|{other}" if under else other)


@cache
def _code_names() -> frozenset[str]:
    """Quoted words that name code, not a person: Python's builtins and types, DICOM keywords."""
    from pydicom.datadict import keyword_dict

    return frozenset(dir(builtins)) | {"NoneType", "ndarray", "Path", "PosixPath", "WindowsPath"} | frozenset(
        keyword_dict)


def redact_names(text: str) -> str:
    """``text`` with every word, and every part of a path, that is a name :func:`note_names`
    noted shown as ``<id>`` (nothing else changes: a :class:`~packer.errors.PackerError`'s message
    keeps the job's own paths and words)."""
    names = _noted().names
    if not names:
        return text

    def quoted(match: re.Match[str]) -> bool:
        before, after = text[match.start() - 1:match.start()], text[match.end():match.end() + 1]
        return before in ("'", '"') and after == before

    def shown(match: re.Match[str]) -> str:
        word = match.group(0)
        bare = word.rstrip(".:")
        if bare in names and (_PLAIN_WORDS.fullmatch(bare) is None or quoted(match)):
            return "<id>" + word[len(bare):]
        parts = re.split(r"([/\\])", word)
        return "".join("<id>" if part in names else part for part in parts) if len(parts) > 1 else word

    for name in (n for n in names if _TOKEN.fullmatch(n) is None):  # a name holding a space: "Doe John"
        # a whole name, not a part of a word; one spelled as the message's words only quoted or in a path
        edge = r"['\"/\\]" if _PLAIN_WORDS.fullmatch(name) else r"\W"
        text = re.sub(rf"(?:(?<={edge})|^){re.escape(name)}(?=$|{edge})", "<id>", text, flags=re.MULTILINE)
    return _TOKEN.sub(shown, text)


def redact_text(text: str) -> str:
    """``text`` with every path under a noted source root as ``<source NAME>/…``, every other
    word holding a ``/`` or ``\\`` and every bare file name as ``<path>``, every quoted value that
    names no code as ``'<value>'``, and every noted name (:func:`note_names`) as ``<id>``."""
    pattern = _pattern()
    roots = _noted().roots
    names = sorted(roots, key=len, reverse=True)

    def path(match: re.Match[str]) -> str:
        for group, value in match.groupdict().items():
            if value is not None and group.startswith("r"):
                return f"<source {roots[names[int(group[1:])]]}>/…"
        return "<path>"

    def quoted(inner: str, quote: str, whole: str) -> str:
        as_path = pattern.fullmatch(inner)
        if as_path is not None:
            return f"{quote}{path(as_path)}{quote}"
        if _FILE_NAME.fullmatch(inner) is not None:
            return f"{quote}<path>{quote}"
        if not inner or inner in _code_names() or _CODE_WORD.fullmatch(inner) is not None:
            return whole
        return f"{quote}<value>{quote}"

    def shown(match: re.Match[str]) -> str:
        if match.group("qs") is not None:
            return quoted(match.group("qs"), "'", match.group(0))
        if match.group("qd") is not None:
            return quoted(match.group("qd"), '"', match.group(0))
        if match.group("f") is not None:
            return "<path>"
        return path(match)

    # one pass, so that no rule meets what another wrote (``<source ct>/…`` holds a separator)
    text = re.compile(f"{_QUOTED.pattern}|(?P<f>{_FILE_NAME.pattern})|{pattern.pattern}").sub(shown, text)
    return redact_names(text)


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
