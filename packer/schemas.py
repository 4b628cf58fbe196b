"""Load the JSON Schemas in ``schemas/`` and validate documents against them.

The schema files are the single source of truth: the code never restates them. In a
source checkout they live at the repository root; an installed wheel carries a copy
inside the package (``packer/_schemas``).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from packer.errors import ConfigError

if TYPE_CHECKING:  # imported where a document is validated: 0.1 s that a loader reading a sealed manifest skips
    import jsonschema

_HERE = Path(__file__).resolve().parent
_CANDIDATES = (_HERE / "_schemas", _HERE.parent / "schemas")


def schema_dir() -> Path:
    for candidate in _CANDIDATES:
        if (candidate / "job.schema.json").is_file():
            return candidate
    raise FileNotFoundError(f"packer's JSON Schemas are missing; looked in {', '.join(map(str, _CANDIDATES))}")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """``load_schema("job")`` reads ``schemas/job.schema.json``."""
    with open(schema_dir() / f"{name}.schema.json", encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    return schema


@cache
def schema_registry() -> Any:
    """All of packer's schemas by their ``$id``, so they can ``$ref`` one another."""
    from referencing import Registry, Resource

    resources = []
    for path in sorted(schema_dir().glob("*.schema.json")):
        schema = load_schema(path.name.removesuffix(".schema.json"))
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


@cache
def schema_defaults(name: str) -> dict[str, Any]:
    """Every ``default`` the schema ``name`` declares, by dotted key path (``"pack.max_samples"``),
    following ``$ref`` within the schema: the code reads its defaults from here, never restating them."""
    schema = load_schema(name)
    found: dict[str, Any] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        if "default" in node:
            found[".".join(path)] = node["default"]
        reference = node.get("$ref")
        if isinstance(reference, str) and reference.startswith("#/$defs/"):
            walk(schema["$defs"][reference.removeprefix("#/$defs/")], path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, (*path, key))

    walk(schema, ())
    return found


def _plain(value: Any) -> Any:
    """YAML turns ``2024-01-01`` into a date; the schemas speak JSON, so make it a string. A key
    is text in JSON: a boolean key (an unquoted ``true:``) is ``true`` as JSON writes it, not
    Python's ``True``."""
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {_key_word(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _key_word(key: Any) -> str:
    """A mapping key as JSON text: a boolean or null key (an unquoted ``true:`` or ``null:``) as
    the job file spells it, ``true`` or ``null``, not Python's ``True`` or ``None``."""
    return json.dumps(key) if key is None or isinstance(key, bool) else str(key)


def _yaml_words(value: Any) -> str:
    """``repr(value)`` with null, true and false as a job file spells them (``[true, false, 'auto']``
    where Python writes ``[True, False, 'auto']``): the words a message may ask the user to write."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_yaml_words, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml_words(k)}: {_yaml_words(v)}" for k, v in value.items()) + "}"
    return repr(value)


_Found = TypeVar("_Found")


def _first_found(value: Any, visit: Callable[[Any, tuple[str | int, ...]], _Found | None],
                 path: tuple[str | int, ...] = ()) -> _Found | None:
    """What ``visit`` finds first in a parsed document, depth first (``visit(value, path)`` for the
    document and every value in it, mappings by key order and lists by index), or None."""
    found = visit(value, path)
    if found is not None:
        return found
    if isinstance(value, dict):
        items: Iterable[tuple[str | int, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _first_found(item, visit, (*path, key))
        if found is not None:
            return found
    return None


def _non_finite(value: Any) -> tuple[tuple[str | int, ...], float] | None:
    """The key path and value of the first NaN or infinity in a parsed document, or None."""
    return _first_found(value, lambda v, path: (path, v) if isinstance(v, float) and not math.isfinite(v) else None)


#: A UTF-16 surrogate pair (a high half, then a low half), and any half of one.
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def joined_surrogate_pairs(text: str) -> str:
    """``text`` with each UTF-16 surrogate pair made the one character it stands for. JSON writes a
    character outside the BMP escaped as two halves (``"\\ud83d\\ude00"``, as Python's json.dump
    does by default), which RFC 8259 (section 7) reads as one character; a YAML reader keeps the
    two halves, which no UTF-8 text can hold. A half without its other half stays as it is."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE_PAIR.sub(lambda m: m.group().encode("utf-16", "surrogatepass").decode("utf-16"), text)


def _lone_surrogate(value: Any) -> tuple[tuple[str | int, ...], str, bool] | None:
    """The key path, text and whether it is a key, of the first string or key in a parsed document
    that holds half of a UTF-16 surrogate pair (pairs are joined before), or None."""
    def visit(v: Any, path: tuple[str | int, ...]) -> tuple[tuple[str | int, ...], str, bool] | None:
        if isinstance(v, str):
            return (path, v, False) if _SURROGATE.search(v) else None
        if isinstance(v, dict):
            key = next((k for k in v if isinstance(k, str) and _SURROGATE.search(k)), None)
            return None if key is None else (path, key, True)
        return None

    return _first_found(value, visit)


def _path_text(parts: Iterable[str | int]) -> str:
    """``["sources", 0, "root"]`` → ``sources[0].root``; no parts → ``(top level)``."""
    text = ""
    for part in parts:
        part = part if part != "" else "''"  # an empty key, as YAML writes it
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _key_path(error: jsonschema.ValidationError, doc: Any = None) -> str:
    """The error's key path; under ``sources[i]`` preceded by which source that is (its name,
    else its root), so a job of several sources says which one without counting."""
    dependent = _dependent(error)
    parts = (*error.absolute_path, *(dependent[:1] if dependent else ()))
    text = _path_text(parts)
    if len(parts) > 1 and parts[0] == "sources" and isinstance(parts[1], int) and isinstance(doc, dict):
        sources = doc.get("sources")
        source = sources[parts[1]] if isinstance(sources, list) and parts[1] < len(sources) else None
        if isinstance(source, dict):
            for key, said in (("name", "source {!r}"), ("root", "the source at {!r}")):
                if isinstance(source.get(key), str) and source[key]:
                    return f"{said.format(source[key])}, {text}"
    return text


#: difflib.get_close_matches' default cutoff: a key less similar than this is not suggested.
_CLOSE = 0.6

#: A key this few edits from one its section takes is a typo of it (``window`` for ``windows``),
#: even where a section beside it takes the key as written (``transform.image.window``).
_TYPO_EDITS = 2


def _edits(a: str, b: str) -> int:
    """The Damerau-Levenshtein distance (optimal string alignment) between ``a`` and ``b``: insertions,
    deletions, substitutions and swaps of two neighbouring letters, one edit each."""
    previous: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        before, previous, row = previous, row, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], before[j - 2] + 1)
    return row[len(b)]


def _shared_letters(a: str, b: str) -> int:
    """How many letters ``a`` and ``b`` have in common, counting repeats (a swap keeps them all)."""
    return sum(min(a.count(c), b.count(c)) for c in set(a))


@dataclass(frozen=True)
class _UnknownKey:
    """A key the schema node at ``where`` does not allow, and the keys it does allow."""

    where: tuple[str | int, ...]
    key: str
    allowed: tuple[str, ...]  # in the schema's order
    present: frozenset[str]
    #: the other sections of the same parent that take the key (``transform.dicom`` for
    #: ``transform.nifti.modality_windows``), and the start of its description there
    elsewhere: tuple[str, ...] = ()
    what: str = ""

    @property
    def suggestion(self) -> str | None:
        """The closest allowed key, ignoring case, if any is close (difflib's ratio, as
        ``get_close_matches``). Keys equally close by that ratio ('lable': 'label' and 'table' both
        0.8) go to the one of the key's own length, then the fewest edits (a swapped pair of letters
        is one), then the most letters shared, then the first in the schema; difflib would take the
        larger string."""
        typed = self.key.lower()

        def rank(item: tuple[int, str]) -> tuple[float, bool, int, int, int]:
            order, name = item
            lowered = name.lower()
            return (difflib.SequenceMatcher(None, typed, lowered).ratio(), len(lowered) == len(typed),
                    -_edits(typed, lowered), _shared_letters(typed, lowered), -order)

        ranked = sorted(enumerate(self.allowed), key=rank, reverse=True)
        if not ranked or rank(ranked[0])[0] < _CLOSE:
            return None
        return ranked[0][1]

    def message(self, source: str) -> str:
        suggestion = self.suggestion
        typo = suggestion is not None and _edits(self.key.lower(), suggestion.lower()) <= _TYPO_EDITS
        if self.elsewhere and not typo:  # a key of a sibling section, given where it does nothing
            here = _path_text(self.where)
            what = f" ({self.what})" if self.what else ""
            if suggestion is None:
                fix = f"the keys it takes are {', '.join(sorted(self.allowed)) or '(none)'}"
            elif suggestion in self.present:
                fix = f"{here}.{suggestion} is given: keep it and remove {self.key}"
            else:
                fix = f"give {here}.{suggestion}"
            hint = f"{self.key} is a {' and '.join(self.elsewhere)} key{what}; {here} does not take it: {fix}"
        elif suggestion is None:
            where = "at the top level" if not self.where else f"in {_path_text(self.where)}"
            hint = f"the keys allowed {where} are {', '.join(sorted(self.allowed)) or '(none)'}"
        elif suggestion in self.present:
            hint = f"did you mean {suggestion!r}? It is given too: keep one of the two"
        else:
            hint = f"did you mean {suggestion!r}?"
        return f"{source}: {_path_text((*self.where, self.key))}: unknown key ({hint})"


def _schema_at(root: dict[str, Any], path: Sequence[str | int]) -> dict[str, Any] | None:
    """The object schema a document's ``path`` (mapping keys only) leads to in ``root``, following
    ``properties`` and ``$ref`` within it, or None where the path takes another turn (a list, a
    ``oneOf``)."""
    def resolved(node: Any) -> dict[str, Any] | None:
        reference = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(reference, str) and reference.startswith("#/$defs/"):
            node = root.get("$defs", {}).get(reference.removeprefix("#/$defs/"))
        return node if isinstance(node, dict) else None

    node = resolved(root)
    for part in path:
        properties = node.get("properties") if node is not None else None
        if not isinstance(part, str) or not isinstance(properties, dict) or part not in properties:
            return None
        node = resolved(properties[part])
    return node


def _first_words(description: Any) -> str:
    """A description's first clause (to its first full stop or colon), as a message quotes it."""
    if not isinstance(description, str) or not description:
        return ""
    clause = re.split(r"\.\s|:\s|\.$", description, maxsplit=1)[0].strip()
    return clause[:1].lower() + clause[1:] if clause[1:2].islower() else clause


def _with_elsewhere(unknown: _UnknownKey, schema: dict[str, Any]) -> _UnknownKey:
    """``unknown`` with the sections beside its own that take its key: ``transform.nifti`` given
    ``modality_windows``, which only ``transform.dicom`` takes, was suggested ``windows``, as if a
    typo, never told where the key belongs."""
    if not unknown.where or not isinstance(unknown.where[-1], str):
        return unknown
    parent = _schema_at(schema, unknown.where[:-1])
    siblings = parent.get("properties") if parent is not None else None
    if not isinstance(siblings, dict):
        return unknown
    found = [(name, section) for name in siblings if name != unknown.where[-1]
             for section in [_schema_at(schema, (*unknown.where[:-1], name))]
             if section is not None and unknown.key in (section.get("properties") or {})]
    if not found:
        return unknown
    what = _first_words(found[0][1]["properties"][unknown.key].get("description"))
    return replace(unknown, elsewhere=tuple(_path_text((*unknown.where[:-1], name)) for name, _ in found), what=what)


def _extras(error: jsonschema.ValidationError) -> list[str]:
    """The keys an ``additionalProperties: false`` error is about, in the document's order."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    declared = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [key for key in error.instance
            if key not in declared and not any(re.search(p, key) for p in patterns)]


def _is_unknown_key_error(error: jsonschema.ValidationError) -> bool:
    return (error.validator == "additionalProperties" and error.validator_value is False
            and isinstance(error.instance, dict) and isinstance(error.schema, dict))


def _allowed(error: jsonschema.ValidationError) -> tuple[str, ...]:
    """The keys the schema node allows, in its order."""
    return tuple(error.schema.get("properties", {}))


def _rejects_mappings(error: jsonschema.ValidationError) -> bool:
    """Whether ``error`` says its branch takes no mapping at all (a word, a list, a number)."""
    if error.validator == "type":
        return True
    values = [error.validator_value] if error.validator == "const" else (
        error.validator_value if error.validator == "enum" and isinstance(error.validator_value, list) else None)
    return values is not None and not any(isinstance(v, dict) for v in values)


def _unknown_keys(error: jsonschema.ValidationError) -> list[_UnknownKey]:
    """The unknown keys ``error`` reports: directly (``additionalProperties: false``), or for a
    ``oneOf``/``anyOf`` whose every branch rejects the key (an object branch listing it as
    unexpected, or a branch that is not for mappings at all: a type, or words to choose from).
    Keys one branch allows are not unknown: which branch the user meant is then unclear. But
    where the branches that take every key of the mapping (the forms it can be) all find the
    same unknown key deeper inside it (``{zscore: {ovr: all}}``, a table's ``join: [{onn: …}]``),
    that key is the mistake, reported as any other: the form the user meant is plain."""
    where = tuple(error.absolute_path)
    if _is_unknown_key_error(error):
        present = frozenset(error.instance)
        return [_UnknownKey(where, key, _allowed(error), present) for key in _extras(error)]
    if error.validator not in ("oneOf", "anyOf") or not isinstance(error.instance, dict):
        return []
    branches = error.validator_value if isinstance(error.validator_value, list) else []
    rejected: list[set[str] | None] = []  # per branch: the keys it rejects, None = rejects the whole mapping
    deeper: list[list[jsonschema.ValidationError]] = []  # per branch: its errors inside the mapping's values
    allowed: dict[str, None] = {}  # the branches' keys, in their order
    for index in range(len(branches)):
        mine = [c for c in error.context or () if c.relative_schema_path and c.relative_schema_path[0] == index]
        here = [c for c in mine if tuple(c.absolute_path) == where]
        deeper.append([c for c in mine if tuple(c.absolute_path) != where])
        if any(_rejects_mappings(c) for c in here):
            rejected.append(None)
            continue
        unexpected = [c for c in here if _is_unknown_key_error(c)]
        allowed.update(dict.fromkeys(key for c in unexpected for key in _allowed(c)))
        rejected.append({key for c in unexpected for key in _extras(c)})
    object_branches = [r for r in rejected if r is not None]
    if not object_branches:
        return []
    present = frozenset(error.instance)
    unknown = [_UnknownKey(where, key, tuple(allowed), present) for key in error.instance
               if key not in allowed and all(key in r for r in object_branches)]
    if unknown:
        return unknown
    # the forms that take every key given: an unknown key all of them find inside a value
    fitting = [deeper[index] for index, r in enumerate(rejected) if r is not None and not r]
    found = [[u for c in errors for u in _unknown_keys(c)] for errors in fitting]
    if not found or not found[0]:
        return []
    return [u for u in found[0] if all(any((o.where, o.key) == (u.where, u.key) for o in other)
                                       for other in found[1:])]


def _dependent(error: jsonschema.ValidationError) -> tuple[str, str] | None:
    """For a ``dependentRequired`` error (the schema's way to say a key acts only beside another:
    ``resize`` without ``size`` resizes nothing), the key given and the key it lacks."""
    if error.validator != "dependentRequired" or not isinstance(error.validator_value, dict):
        return None
    return next(((key, need) for key, needs in error.validator_value.items() for need in needs
                 if error.message == f"{need!r} is a dependency of {key!r}"), None)


def _required_key(error: jsonschema.ValidationError) -> str | None:
    """The property a ``required`` error says is missing."""
    if error.validator != "required" or not isinstance(error.instance, dict):
        return None
    return next((name for name in error.validator_value
                 if name not in error.instance and error.message.startswith(repr(name))), None)


def validate_document(doc: Any, schema_name: str, *, source: str) -> Any:
    """Validate ``doc`` against ``schemas/<schema_name>.schema.json``; return the JSON-plain doc.

    Raises ConfigError naming ``source``, the key path and what was expected. An unknown key
    (a typo: ``splt:`` for ``split:``) is reported before anything else, with the closest key
    the schema allows at that place: the other problems it causes (``'split' is a required
    property``) are not the mistake to fix.
    """
    import jsonschema

    plain = _plain(doc)
    if schema_name == "job" and not isinstance(plain, dict):
        raise ConfigError(f"{source}: a job file is a YAML mapping with name, sources, split, pack and output")
    where = _non_finite(plain)
    if where is not None:  # NaN passes every minimum and maximum (each comparison is False)
        path, value = where
        raise ConfigError(f"{source}: {_path_text(path)}: {value} is not a finite number (YAML's .nan and .inf "
                          "are no fraction, ratio or size packer can use); give a finite number")
    lone = _lone_surrogate(plain)
    if lone is not None:  # no UTF-8 text can hold it: the build would fail to write or hash it
        path, text, is_key = lone
        half = next(_SURROGATE.finditer(text)).group()
        said = (f"{source}: {_path_text(path)}: {'the key ' if is_key else ''}{json.dumps(text)} "
                f"holds \\u{ord(half):04x}")
        if 0xDC80 <= ord(half) <= 0xDCFF:  # how Python holds a byte of a name that is not UTF-8 (os.fsdecode)
            raise ConfigError(f"{said}, the byte 0x{ord(half) - 0xDC00:02X} of a file or folder name that is not "
                              "UTF-8 text (a Latin-1 name, say, as Python reads it from the disk): rename it in "
                              "UTF-8 (convmv -f latin1 -t utf8 -r --notest FOLDER); in a job file, half of a "
                              "UTF-16 surrogate pair without its other half, which is no character: write both "
                              "halves, or the character itself")
        raise ConfigError(f"{said}, half of a UTF-16 surrogate pair without its other half, which "
                          "is no character; JSON escapes a character outside the BMP as both halves "
                          "(\\ud83d\\ude00 is one emoji): write both halves, or the character itself")
    validator_cls = jsonschema.validators.validator_for(load_schema(schema_name))
    validator = validator_cls(load_schema(schema_name), format_checker=validator_cls.FORMAT_CHECKER,
                              registry=schema_registry())
    errors = sorted(validator.iter_errors(plain), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if not errors:
        return _whole_numbers_as_int(plain, validator_cls, schema_name)
    found = [(error, [_with_elsewhere(u, load_schema(schema_name)) for u in _unknown_keys(error)])
             for error in errors]
    unknown = [u for _, keys in found for u in keys]
    if unknown:
        # a required key the suggestion supplies is the same mistake, not one more
        fixed = {(u.where, u.suggestion) for u in unknown}
        rest = [e for e, keys in found if not keys and (tuple(e.absolute_path), _required_key(e)) not in fixed]
        also = [u.message(source).removeprefix(f"{source}: ") for u in unknown[1:]]
        raise ConfigError(unknown[0].message(source)
                          + _also(also + [f"{_key_path(e, plain)}: {_message(e)}" for e in rest]))
    best = jsonschema.exceptions.best_match(errors) or errors[0]
    others = [f"{_key_path(e, plain)}: {_what_is_wrong(e)}" for e in errors if e is not best]
    raise ConfigError(f"{source}: {_key_path(best, plain)}: {_what_is_wrong(best)}{_also(others)}")


def _whole_numbers_as_int(plain: Any, validator_cls: Any, schema_name: str) -> Any:
    """``plain`` with each whole float the schema wants as an ``integer`` (``folds: 5.0``) made
    an int. JSON Schema's ``integer`` is any whole number, 5.0 included, so the schema passes
    it, yet the code after it needs an int (a range, an index, a class id that is the table's
    text ``0``, not ``0.0``). A validator whose ``integer`` is Python's int finds those places:
    each is a ``type`` error on a whole float, also inside a ``oneOf`` branch."""
    import jsonschema

    if not _has_whole_float(plain):  # the common case: no second pass over the document
        return plain
    checker = validator_cls.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    strict_cls = jsonschema.validators.extend(validator_cls, type_checker=checker)
    strict = strict_cls(load_schema(schema_name), registry=schema_registry())
    places: set[tuple[str | int, ...]] = set()
    pending = list(strict.iter_errors(plain))
    while pending:
        error = pending.pop()
        pending.extend(error.context or ())
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        if error.validator == "type" and "integer" in wanted and isinstance(error.instance, float) \
                and error.instance.is_integer():
            places.add(tuple(error.absolute_path))
    for place in places:
        if not place:
            return int(plain)
        parent = plain
        for part in place[:-1]:
            parent = parent[part]
        parent[place[-1]] = int(parent[place[-1]])
    return plain


def _has_whole_float(value: Any) -> bool:
    """Whether ``value`` (a plain JSON-like document) holds a float that is a whole number."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if item.is_integer():
                return True
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


#: Checks of one value: where one fails, the schema's description of that value says what it takes.
_VALUE_CHECKS = frozenset({"type", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum",
                           "exclusiveMaximum", "minLength", "maxLength", "pattern", "enum", "const", "format"})


#: A value that matches none of its forms: the schema's description of the value lists them.
_CHOICES = frozenset({"oneOf", "anyOf"})


def _what_is_wrong(error: jsonschema.ValidationError) -> str:
    """jsonschema's message, and for a value that fails a check of its own, the schema's
    description of that value (``[64] is too short. Target [height, width] in pixels.``)."""
    description = error.schema.get("description") if isinstance(error.schema, dict) else None
    dependent = _dependent(error)
    if dependent is not None:
        key, need = dependent
        return (f"acts only with {need!r} beside it, which is not given, so it would be ignored; add "
                f"{_path_text((*error.absolute_path, need))}, or remove {key}")
    message = _message(error)
    if error.validator in ("enum", "const") and isinstance(error.instance, str):
        choices = error.validator_value if error.validator == "enum" else [error.validator_value]
        named = {str(v).lower(): str(v) for v in choices if isinstance(v, str)}
        close = difflib.get_close_matches(error.instance.lower(), list(named), n=1)
        if close:
            message += f" (did you mean {named[close[0]]!r}?)"
    if error.validator in _CHOICES and isinstance(error.instance, str) and isinstance(error.validator_value, list):
        # a word where a word or a mapping is taken (label: foldr, sample: slices): the closest word
        # the branches allow, each an enum's words or a const's one word
        words = {str(v).lower(): str(v) for branch in error.validator_value if isinstance(branch, dict)
                 for v in (*branch.get("enum", ()), *([branch["const"]] if "const" in branch else []))
                 if isinstance(v, str)}
        close = difflib.get_close_matches(error.instance.lower(), list(words), n=1)
        if close:
            message += f" (did you mean {words[close[0]]!r}?)"
    message += _word_for_a_mapping(error) + _missing_in_the_closest_form(error) + _quote_the_number(error)
    if (error.validator in _VALUE_CHECKS or error.validator in _CHOICES) and isinstance(description, str) \
            and description:  # the value's description, which says what each form means
        return f"{message}. {description}"
    return message


def _message(error: jsonschema.ValidationError) -> str:
    """jsonschema's message in the job's words rather than Python's, both the value it names first
    and the values a key takes: ``pack: null is not of type 'object'``, ``'yes' is not one of [true,
    false, 'auto']``, ``true was expected``, where jsonschema says ``None``, ``True``, ``False``,
    words a YAML or JSON job never holds."""
    message = error.message
    python, written = repr(error.instance), _yaml_words(error.instance)
    if written != python and message.startswith(f"{python} "):
        message = written + message.removeprefix(python)
    expected = repr(error.validator_value)
    if error.validator == "enum" and message.endswith(f" {expected}"):
        message = message.removesuffix(expected) + _yaml_words(error.validator_value)
    elif error.validator == "const" and message == f"{expected} was expected":
        message = f"{_yaml_words(error.validator_value)} was expected"
    return message


def _quote_the_number(error: jsonschema.ValidationError) -> str:
    """For a number where text is due (``name: 007``, which YAML reads as 7), to quote it."""
    wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    if error.validator != "type" or "string" not in wanted or {"number", "integer"} & set(wanted) \
            or not isinstance(error.instance, (int, float)) or isinstance(error.instance, bool):
        return ""
    key = error.absolute_path[-1] if error.absolute_path else None
    name = f"{key}: " if isinstance(key, str) else ""
    number = error.instance
    padded = f", or {name}'0{number}' for 0{number}" if isinstance(number, int) and number >= 0 else ""
    return (f" (YAML reads an unquoted number as a number: quote the text as the file writes it, {name}"
            f"'{error.instance}'{padded}; leading zeros are kept only in quotes)")


def _word_for_a_mapping(error: jsonschema.ValidationError) -> str:
    """For a word where a mapping is taken (``phi: pseudonymize``), the mapping it likely meant:
    the key of that mapping whose allowed words include it (``phi: {mode: pseudonymize}``)."""
    if error.validator != "type" or error.validator_value != "object" or not isinstance(error.instance, str):
        return ""
    for key, spec in (error.schema.get("properties") or {}).items():
        words = spec.get("enum", ()) if isinstance(spec, dict) else ()
        if any(isinstance(w, str) and w.lower() == error.instance.lower() for w in words):
            return f" (did you mean {{{key}: {error.instance}}}?)"
    return ""


def _missing_in_the_closest_form(error: jsonschema.ValidationError) -> str:
    """For a mapping that matches none of a value's forms, what the form whose keys it uses
    lacks (``{center: 40}``: an explicit window needs ``width`` too)."""
    if error.validator not in _CHOICES or not isinstance(error.instance, dict) or not error.instance:
        return ""
    where = tuple(error.absolute_path)
    for sub in error.context or ():
        if sub.validator != "required" or tuple(sub.absolute_path) != where or not isinstance(sub.schema, dict):
            continue
        known = set(sub.schema.get("properties") or {}) | set(sub.validator_value or ())
        missing = [k for k in sub.validator_value or () if k not in error.instance]
        if missing and set(error.instance) <= known:
            form = ", ".join(sub.validator_value)
            return f" (it lacks {', '.join(repr(k) for k in missing)}: {{{form}}} is one form)"
    return ""


#: How many further problems of a job file an error lists, one per line, after the first.
ALSO_LISTED = 5


def _also(problems: Sequence[str]) -> str:
    """The further problems of a document, one per line after the first (the first
    :data:`ALSO_LISTED`, then how many more), so that one run shows what to fix."""
    shown = [f"\n  also {problem}" for problem in problems[:ALSO_LISTED]]
    rest = len(problems) - len(shown)
    return "".join(shown) + (f"\n  and {rest} more problem(s)" if rest else "")
