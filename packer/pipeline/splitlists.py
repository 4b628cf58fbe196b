"""Given splits: a dataset's official split, read from list files or from a table column.

Public datasets ship their split: NIH ChestX-ray14 two lists of file names, MIMIC-CXR a CSV
with a ``split`` column, the Medical Segmentation Decathlon ``training`` and ``test`` lists.
``by: list`` reads one file per split (plain text, one item a line, or a CSV column) whose items
name samples by ``match``: their ``path`` relative to the source root, their file ``name``, its
``stem`` (the name without its extension, ``.nii.gz`` as one, a last part of digits being no
extension: :func:`stem_of`) or their ``entity``; an item spelled in another Unicode form than
its sample's name (NFC against a macOS folder's NFD) names it, as a table's cell names its file.
``by: column`` reads each sample's split from a column of its table row, its values renamed by
``map``. Either way each sample goes exactly where the data says, even where that leaks: the
audit (:mod:`packer.pipeline.audit`) then checks the given assignment sample by sample.
Carving the splits the data lacks is :func:`packer.pipeline.split.assign_splits`'s part.

What is refused, and how:

- an item in two lists: ConfigError naming both lists and lines;
- a list none of whose items names a sample, or a table value that is no split: ConfigError
  with an example and the closest name (the usual mistake: lists of names read as paths);
- a list some of whose items name no sample (a partial download, a file left out): a
  warning saying how many, an example line and the closest existing name;
- a list some of whose items name a file refused as a bad sample (a truncated PNG): a warning
  of its own saying how many, why and an example line, pointing at the bad-sample report, never
  at another file as the closest name;
- a list some or all of whose items name a file left out on purpose (``not_downloaded`` under a
  table's ``missing: drop``, a row a ``where:`` leaves out: any reason of ``excluded.jsonl``): a
  warning of its own saying how many and why, never a closest name, never a ConfigError;
- a sample no list names (or whose split cell is empty): a ``not_in_split`` bad sample, never
  dropped unsaid.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import posixpath
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from packer.config import MATCHES, SPLITS, SplitConfig, SplitList, redacted_path
from packer.errors import ConfigError
from packer.pipeline.listings import BUILD_LISTINGS, Listings
from packer.pipeline.sampletable import SampleTable
from packer.records import EXCLUSIONS, Issue


@dataclass(frozen=True)
class GivenSplit:
    """The split the data gives each sample (by index into the sample table; None: none given),
    the ``not_in_split`` records of the samples without one, and warnings for the user."""

    split: list[str | None]
    unlisted: tuple[Issue, ...]
    warnings: tuple[str, ...]


def is_extension(suffix: str) -> bool:
    """Whether the text after a file name's last dot is an extension (``png``, ``dcm``): not
    when it is all digits, which is a DICOM UID's last component (a file named by its SOP
    Instance UID, ``1.2.826.0.1.3680043.8.498.101``) or a file's number (``scan.001``)."""
    return not suffix.isdigit()


def stem_of(name: str) -> str:
    """A file name without its extension: ``a.png`` → ``a``, ``la_003.nii.gz`` → ``la_003``,
    ``1.2.840.10008.5.dcm`` → ``1.2.840.10008.5``; a name without one is its own stem, and a
    suffix of digits is none (:func:`is_extension`): a DICOM file named by its SOP Instance UID
    alone, ``1.2.826.0.1.3680043.8.498.101``, is its own stem, its whole UID."""
    if name.endswith(".gz"):
        name = name[:-3]
    head, dot, suffix = name.rpartition(".")
    return head if dot and head and is_extension(suffix) else name


def name_of(relpath: str, entity: str | None, match: str) -> str:
    """What a list item must say to name a sample, under ``match`` (:data:`packer.config.MATCHES`)."""
    if match == "entity":
        return entity or ""
    path = posixpath.normpath(relpath)
    if match == "path":
        return path
    name = posixpath.basename(path)
    return stem_of(name) if match == "stem" else name


def item_of(text: str, match: str) -> str:
    """A list item as written, in the form :func:`name_of` gives (``./a/b.png`` names ``a/b.png``)."""
    return posixpath.normpath(text) if match == "path" else text


def shown_list(entry: SplitList, hidden: bool, *, resolved: bool = False) -> str:
    """A split list's file as a message names it: as the job writes it (``resolved``: the path it
    was read from), or, ``hidden`` under PHI, as the manifest records it (:func:`packer.config.redacted_path`:
    a folder ``Doe^John_19600101/`` shown as ``<id>``), since warnings and errors reach CI logs,
    ``warnings.jsonl``, the report and the JUnit file."""
    if hidden:
        return redacted_path(entry.spec)
    return str(entry.path) if resolved else entry.spec


def read_split_list(entry: SplitList, hidden: bool = False) -> list[tuple[int, str]]:
    """(line number, item) of every item of one split list, in file order: plain text (blank
    lines and lines starting with ``#`` skipped, spaces around an item dropped) or, with
    ``column``, that CSV column's non-empty cells (line 1 is the header).

    Raises ConfigError when the file cannot be read, is not UTF-8, lacks the column, or changed
    since the job was loaded (its sha256 is the dataset's identity). ``hidden`` (under PHI): the
    messages name the file as the manifest records it (:func:`shown_list`).
    """
    where = f"split.lists.{entry.split} ({shown_list(entry, hidden, resolved=True)})"
    try:
        data = entry.path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read the list ({err.strerror or err})") from err
    if hashlib.sha256(data).hexdigest() != (entry.file_sha256 or entry.sha256):
        raise ConfigError(f"{where}: the list changed while the job ran (its sha256 is part of the dataset's "
                          "identity); run again")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from err
    if entry.column is None:
        return [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    from packer.pipeline.tables import long_cells, swallowed_lines, table_head, unclosed_at_end, unreadable_csv

    try:
        with long_cells():  # a list's cells as long as a labels table's (a cell of 131,072 characters)
            # separated as a source's table is (a .tsv list by tabs, an Excel "CSV" by semicolons)
            head = table_head(io.StringIO(text, newline=""), entry.path.name)
            reader = csv.DictReader(head.lines, delimiter=head.delimiter)
            columns = [c for c in reader.fieldnames or [] if c is not None]
            if entry.column not in columns:
                close = difflib.get_close_matches(entry.column, columns, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{where}: no column {entry.column!r}; the header row has "
                                  f"{', '.join(columns) or 'nothing'}{hint}")
            cells = []
            for row in reader:
                number = head.above + reader.line_num
                unclosed_at_end(where, head, number, row, columns)
                cell = (row.get(entry.column) or "").strip()
                swallowed_lines(where, number, entry.column, cell, "a listed item")
                if cell:
                    cells.append((number, cell))
            return cells
    except csv.Error as err:
        raise unreadable_csv(where, err) from err


def _read_items(cfg: SplitConfig, entity_name: Callable[[str], str],
                hidden: bool = False) -> dict[str, list[tuple[str, int, str]]]:
    """Every listed name (in :func:`name_of`'s form; entities through ``entity_name``) with the
    (split, line, item as written) of each list line naming it. ConfigError when two lists name
    one item, naming both lists and lines (``hidden``: not the item, under PHI a raw entity id,
    or a path, name or stem that may name the patient), or when a list names nothing."""
    items: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for entry in cfg.lists:
        lines = read_split_list(entry, hidden)
        if not lines:
            raise ConfigError(f"split.lists.{entry.split} ({shown_list(entry, hidden, resolved=True)}): the list "
                              "names no sample; give it one item a line, or remove the list")
        for number, text in lines:
            name = item_of(text, cfg.match)
            name = entity_name(name) if cfg.match == "entity" else name
            seen = items[name]
            other = next((s for s in seen if s[0] != entry.split), None)
            if other is not None:
                first = next(e for e in cfg.lists if e.split == other[0])
                item = ("an entity" if cfg.match == "entity" else f"a {cfg.match}") if hidden else repr(text)
                raise ConfigError(f"{item} is listed in two splits: split.lists.{other[0]} "
                                  f"({shown_list(first, hidden)}) line {other[1]} and split.lists.{entry.split} "
                                  f"({shown_list(entry, hidden)}) line {number}; a sample "
                                  "goes to one split: remove one of the lines")
            seen.append((entry.split, number, text))
    return items


def _respelled(items: dict[str, list[tuple[str, int, str]]], names: set[str]
               ) -> dict[str, list[tuple[str, int, str]]]:
    """``items`` with each listed name that names no sample as written, but one of ``names`` in
    another Unicode form (a list written as NFC text, ``café/0.png``, and a folder made on macOS,
    named in NFD), keyed by that sample's name instead, as a table's cell names its file
    (:class:`~packer.pipeline.tables.UnicodeSpelling`). An exact name comes first: an item is
    respelled only where no item names the sample as written, and only where one item and one
    name share the normalised form (never a guess)."""
    from packer.pipeline.tables import UnicodeSpelling

    odd = [name for name in items if name not in names and not name.isascii()]
    if not odd:
        return items
    spelled = UnicodeSpelling(sorted(names))
    targets = {name: spelled(name) for name in odd}
    taken = Counter(targets.values())
    out = dict(items)
    for name, target in targets.items():
        if target != name and target in names and target not in items and taken[target] == 1:
            out[target] = out.pop(name)
    return out


def _hint(example: str, match: str, names_by_match: Callable[[str], set[str]]) -> str:
    """Why the items may name nothing: another ``match`` under which ``example`` names a sample."""
    for other in MATCHES:
        if other != match and item_of(example, other) in names_by_match(other):
            return f"; the items look like {other}s: set split.match: {other}"
    return ""


def split_from_lists(table: SampleTable, cfg: SplitConfig,
                     pseudonym: Callable[[str], str] | None = None,
                     bad: Mapping[str, str] | None = None, *, listings: Listings = BUILD_LISTINGS) -> GivenSplit:
    """``by: list``: each sample's split from the lists (:func:`read_split_list`) under
    ``cfg.match``, for the samples of every source. ``pseudonym``: under PHI pseudonymization,
    what turns a listed entity id into the samples' (:meth:`packer.phi.Pseudonymizer.entity`).
    ``bad``: the files refused as bad samples or left out on purpose, by their name under
    ``cfg.match`` (:func:`name_of`), each with its reason code (an exclusion's is one of
    :data:`~packer.records.EXCLUSIONS`): an item naming one is said to, not called unknown
    (None: not known, as under ``match: entity``). ``listings``: where the warnings for such items
    say the bad samples and the files left out are listed (a build's files; packer validate's report).
    See the module docstring for what is refused."""
    # under PHI a list's item is named by its list and line only, like a pinned entity: a raw
    # entity id, or a path, name or stem whose folders or file name may name the patient
    from packer.pipeline.tables import differ_in_unicode_form

    hidden = pseudonym is not None
    items = _read_items(cfg, pseudonym or (lambda raw: raw), hidden=hidden)
    relpaths, entities = table.column("relpath"), table.column("entity")

    def names_by_match(match: str) -> set[str]:
        return {name_of(r, e, match) for r, e in zip(relpaths, entities, strict=True)}

    names = [name_of(r, e, cfg.match) for r, e in zip(relpaths, entities, strict=True)]
    present = set(names)
    items = _respelled(items, present | set(bad or ()))
    split = [items[n][0][0] if n in items else None for n in names]
    warnings: list[str] = []
    for entry in cfg.lists:
        named = shown_list(entry, hidden)
        listed = [(line, text, name) for name, lines in items.items() for s, line, text in lines if s == entry.split]
        missing = sorted((line, text, name) for line, text, name in listed if name not in present)
        # a listed file that is there but was refused (a truncated PNG), or left out on purpose (not
        # downloaded, under missing: drop; a where: row), is no unknown item: the closest existing
        # name would point at another patient's file, and the list is right
        known = bad or {}
        refused = [item for item in missing if item[2] in known and known[item[2]] not in EXCLUSIONS]
        left_out = [item for item in missing if item[2] in known and known[item[2]] in EXCLUSIONS]
        unknown = [item for item in missing if item[2] not in known]
        if unknown:
            line, text, name = unknown[0]
            # a pseudonym close to another says nothing to the user who wrote the raw id; and under PHI a
            # close path, name or stem is the data's, whose folders may name the patient: not printed
            close = [] if pseudonym is not None else difflib.get_close_matches(name, present, n=1)
            nearest = f"; the closest existing {cfg.match} is {close[0]!r}" if close else ""
            if close and differ_in_unicode_form(name, close[0]):  # the two print alike: say what differs
                nearest += (" (it differs from the item only in Unicode form, NFC against NFD: a letter such as é "
                            "written as one code point or as a letter and a combining accent; it is not taken for "
                            f"the item because another {cfg.match} or item reads the same once normalised: write "
                            "the item as it is spelled there)")
            said = (f"split.lists.{entry.split} ({named}): {len(unknown):,} of its {len(listed):,} items name "
                    f"no sample (by {cfg.match}), e.g. line {line}{'' if hidden else f': {text!r}'}{nearest}")
            if len(unknown) == len(listed):  # the list names nothing of the data: a list of the wrong form
                raise ConfigError(said + _hint(text, cfg.match, names_by_match) + "; fix the list or split.match")
            warnings.append(said + (" (a file that is missing, or was a bad sample, is not packed)" if bad is None
                                    else " (a file that is missing, or was left out on purpose, is not packed)"))
        if refused:
            line, text, name = refused[0]
            reasons = ", ".join(f"{reason} {count:,}" for reason, count in
                                sorted(Counter(known[item[2]] for item in refused).items()))
            warnings.append(f"split.lists.{entry.split} ({named}): {len(refused):,} of its {len(listed):,} "
                            f"items name a file refused as a bad sample ({reasons}), e.g. line "
                            f"{line}{'' if hidden else f': {text!r}'}; not packed: {_bad_list(listings)} lists each "
                            "with its reason and fix")
        if left_out:
            line, text, name = left_out[0]
            whys = Counter(known[item[2]] for item in left_out)
            reasons = next(iter(whys)) if len(whys) == 1 else ", ".join(
                f"{why} {count:,}" for why, count in sorted(whys.items()))
            warnings.append(f"split.lists.{entry.split} ({named}): {len(left_out):,} of its {len(listed):,} "
                            f"items name files left out as {reasons}, e.g. line "
                            f"{line}{'' if hidden else f': {text!r}'}; not packed, and not bad samples: "
                            f"{listings.excluded} lists each with why")
    unlisted = _unlisted(table, split, lambda ref: (
        f"{ref.path}: no split list names it (by {cfg.match}: "
        f"{name_of(ref.relpath, ref.entity, cfg.match)!r}; lists "
        f"{', '.join(f'{e.split} {e.spec}' for e in cfg.lists)}); add it to a list, or leave the file out"))
    if unlisted:
        warnings.append(f"{len(unlisted):,} file(s) are in no split list, e.g. "
                        f"{_example(unlisted[0], pseudonym is not None)}: each is a not_in_split bad sample")
    return GivenSplit(split=split, unlisted=unlisted, warnings=tuple(warnings))


def _bad_list(listings: Listings) -> str:
    """The bad samples' list as a split list's warning names it: a build's file as "the bad-sample
    report (bad_samples.jsonl)", packer validate's report's records as they are named."""
    return f"the bad-sample report ({listings.bad})" if listings.bad == BUILD_LISTINGS.bad else listings.bad


def split_from_column(table: SampleTable, cfg: SplitConfig, hide_paths: bool = False) -> GivenSplit:
    """``by: column``: each sample's split from the ``cfg.column`` cell of its table row, renamed
    by ``cfg.value_map``. An empty cell is a ``not_in_split`` bad sample (``hide_paths``, under
    PHI: the warning names one by sample key); a value that is no split (after the map) is a
    ConfigError listing every such value with a count, an example file and the closest split; a
    source whose rows lack the column is a ConfigError."""
    column = cfg.column or ""
    mapping = dict(cfg.value_map)
    split: list[str | None] = []
    wrong: Counter[str] = Counter()
    example: dict[str, str] = {}
    lacking: dict[str, list[str]] = {}
    shown = table.column("key") if hide_paths else table.column("path")  # under PHI a file is its key
    for source, extra, path in zip(table.column("source"), table.column("extra"), shown, strict=True):
        cells = dict(extra)
        if column not in cells:
            lacking.setdefault(source, sorted(cells))
            split.append(None)
            continue
        value = cells[column].strip()
        value = mapping.get(value, value)
        if value and value not in SPLITS:
            wrong[value] += 1
            example.setdefault(value, path)
        split.append(value if value in SPLITS else None)
    if lacking:
        source, has = next(iter(sorted(lacking.items())))
        raise ConfigError(f"split.column: the table of source {source!r} has no column {column!r} (beside the "
                          "columns the job reads as each file's path, label, entity and time, its rows carry "
                          f"{', '.join(has) or 'no other column'}); add the column, or fix split.column")
    if wrong:
        raise _no_split_values(column, wrong, example, hide_paths)
    unlisted = _unlisted(table, split, lambda ref: (
        f"{ref.path}: its table row's {column!r} cell is empty; give its split ({', '.join(SPLITS)})"))
    warnings = (f"{len(unlisted):,} file(s) have an empty {column!r} cell, e.g. {_example(unlisted[0], hide_paths)}: "
                "each is a not_in_split bad sample",) if unlisted else ()
    return GivenSplit(split=split, unlisted=unlisted, warnings=warnings)


#: Words datasets spell their splits with (MIMIC-CXR's ``validate``, a ``val/`` folder, ``dev``):
#: a split column's value that is one of them (in any case) names nobody, and is quoted under
#: PHI as well, with the split it may mean; any other value may be a name (a wrong column).
_SPLIT_WORDS = frozenset(("train", "training", "trn", "valid", "validate", "validation", "val", "dev", "development",
                         "tune", "tuning", "test", "testing", "tst", "holdout", "hold-out", "heldout", "eval",
                         "evaluation"))


def _no_split_values(column: str, wrong: Counter[str], example: Mapping[str, str], hidden: bool) -> ConfigError:
    """The error for a split column's values that are no split (after the map): each value with
    how many files have it, an example file and the closest split, and a ``map:`` renaming them.
    ``hidden`` (under PHI): a value that is no word of :data:`_SPLIT_WORDS` is not quoted (a
    column of patient names or ids, named by mistake), as a ``where:`` filter's or a join key's
    value is not; they are counted, with an example file by sample key, and the fix still said."""
    parts, fixes = [], []
    secret: Counter[str] = Counter()
    for value, count in sorted(wrong.items()):
        if hidden and value.lower() not in _SPLIT_WORDS:
            secret[value] = count
            continue
        close = difflib.get_close_matches(value.lower(), SPLITS, n=1, cutoff=0.5)  # VAL, Validate: valid
        parts.append(f"{value!r} ({count:,} file(s), e.g. {'sample ' if hidden else ''}{example[value]}"
                     + (f"; did you mean {close[0]}?" if close else "") + ")")
        fixes.append(f"{value}: {close[0] if close else '<split>'}")
    if secret:
        first = min(secret, key=lambda value: example[value])
        parts.append(f"{len(secret):,} {'other ' if parts else ''}distinct value{'' if len(secret) == 1 else 's'} "
                     f"({sum(secret.values()):,} file(s), e.g. sample "
                     f"{example[first]}; not shown under phi: pseudonymize: a table cell may hold a name)")
        fixes.append("<value>: <split>")
    fix = ", ".join(fixes)
    wrong_column = (f", or name the column that holds each file's split ({', '.join(SPLITS)}) in split.column"
                    if secret else "")
    return ConfigError(f"split.column {column!r}: values that are no split ({', '.join(SPLITS)}): "
                       f"{'; '.join(parts)}; rename them with split.map, e.g. map: {{{fix}}}{wrong_column}")


def _example(issue: Issue, hide_paths: bool) -> str:
    """A bad sample as a printed warning names it: its raw path, or under PHI (whose folders may
    carry a patient's name) its sample key, which ``packer locate`` maps to the file."""
    return f"sample {issue.sample_id} (packer locate JOB KEY prints its file)" if hide_paths else issue.path


def _unlisted(table: SampleTable, split: Sequence[str | None], say: Callable[..., str]) -> tuple[Issue, ...]:
    """One ``not_in_split`` record per file with samples but no split (a multi-frame file's
    frames share one record)."""
    issues: dict[str, Issue] = {}
    for i in (i for i, s in enumerate(split) if s is None):
        ref = table[i].ref
        if ref.sample_id not in issues:
            issues[ref.sample_id] = Issue.of(ref, stage="split", reason="not_in_split", message=say(ref))
    return tuple(issues.values())
