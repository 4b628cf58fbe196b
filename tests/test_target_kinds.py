"""Target kinds are classes registered by name (packer/targets/): the rest of packer asks their
methods and never compares a kind's name, and the README documents every registered kind.

The scan reads the source of every module with ``ast``, so a new ``if target.kind ==
"multilabel":`` anywhere outside ``packer/targets/`` fails here with its file and line. The
job-file parser (``packer/config.py``) is the one other place: it turns the YAML's ``kind:``
into those names.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from packer.targets import (
    KINDS,
    ClassTarget,
    MultiLabelTarget,
    NoTarget,
    NumericTarget,
    Target,
    TargetMismatch,
    target_class,
    target_kinds,
)
from tests.demo_version import REPO

PACKAGE = REPO / "packer"
#: the names a target kind goes by, written out (not taken from the registry, so that a scan
#: still knows "multilabel" if the registry ever stopped registering it)
KIND_NAMES = {"class", "multilabel", "numeric", "none"}
#: where kind names may be compared: the kinds' own package and the job-file parser
ALLOWED = {PACKAGE / "config.py"}


def _mentions_kind(node: ast.AST) -> bool:
    return "kind" in ast.unparse(node).lower()


def _kind_names_in(node: ast.AST) -> set[str]:
    """The kind names ``node`` is, or holds (a tuple, list or set of constants)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and item.value in KIND_NAMES}


def kind_branches(source: str) -> list[tuple[int, str]]:
    """(line, code) of each place in ``source`` that branches on a target kind's name: a
    comparison (``==``, ``!=``, ``in``, ``not in``) of something that mentions ``kind`` with a
    kind name or a collection of them, a ``match`` on such a thing with a kind-name case, and a
    dict literal keyed by two or more kind names (a table indexed by kind)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for left, right in zip(operands, operands[1:], strict=False):
                if (_kind_names_in(right) and _mentions_kind(left)) or (_kind_names_in(left) and _mentions_kind(right)):
                    found.append((node.lineno, ast.unparse(node)))
                    break
        elif isinstance(node, ast.Match) and _mentions_kind(node.subject):
            found += [(case.pattern.lineno, ast.unparse(case.pattern)) for case in node.cases
                      if isinstance(case.pattern, ast.MatchValue) and _kind_names_in(case.pattern.value)]
        elif isinstance(node, ast.Dict):
            keys = {key.value for key in node.keys if isinstance(key, ast.Constant) and key.value in KIND_NAMES}
            if len(keys) >= 2:
                found.append((node.lineno, ast.unparse(node)[:80]))
    return sorted(found)


def _checked_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py")
                  if path not in ALLOWED and (PACKAGE / "targets") not in path.parents)


def test_the_scan_finds_each_way_of_branching_on_a_kind_name() -> None:
    source = '''
if target.kind == "multilabel": pass
if "numeric" != info.target.kind: pass
if info.target.kind in ("none", "numeric"): pass
if (manifest.get("target") or {}).get("kind") == "none": pass
kind = target.kind
if kind == "class": pass
match target.kind:
    case "numeric": pass
HEADINGS = {"class": "classes", "multilabel": "labels"}
'''
    assert [line for line, _ in kind_branches(source)] == [2, 3, 4, 5, 7, 9, 10]
    harmless = '''
if source.kind == "dicom": pass
if problem.kind == "dataset_hash": pass
if origin == "none": pass
reasons = ", ".join(names) or "none"
if old.kind == new.kind: pass
'''
    assert kind_branches(harmless) == []


def test_no_module_outside_the_targets_package_branches_on_a_target_kind_name() -> None:
    modules = _checked_modules()
    assert PACKAGE / "inspection.py" in modules and PACKAGE / "loader" / "readers.py" in modules
    found = [f"{path.relative_to(REPO)}:{line}: {code}" for path in modules
             for line, code in kind_branches(path.read_text(encoding="utf-8"))]
    assert found == [], ("these modules branch on a target kind's name; ask a method of the kind's class in "
                         "packer/targets/ instead:\n" + "\n".join(found))


def _readme_kinds() -> list[tuple[str, str]]:
    """(kind, class) of each row of the table of kinds in the README's target section."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "\n### Targets" in readme, "README.md has no '### Targets' section"
    section = readme.split("\n### Targets", 1)[1].split("\n### ", 1)[0]
    assert "\n| kind | class |" in section, "the target section has no table of kinds (| kind | class | ...)"
    table = section.split("\n| kind | class |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([a-z]+)` \| `(\w+)` \|", table, flags=re.M)


def test_every_registered_target_kind_is_documented_in_the_readme() -> None:
    registered = [(kind, target_class(kind).__name__) for kind in target_kinds()]
    documented = _readme_kinds()
    assert documented == registered, (
        f"README's target kinds {documented} are not the registered ones {registered}: give every kind of "
        "packer/targets/ its row (kind, class) in the README's '### Targets' table of kinds, in registration order")


def test_each_kind_name_gives_its_class_and_the_registry_lists_them_in_order() -> None:
    assert KINDS == target_kinds() == ("class", "multilabel", "numeric", "none")
    assert [type(Target(kind)) for kind in KINDS] == [ClassTarget, MultiLabelTarget, NumericTarget, NoTarget]
    assert [target_class(kind).KIND for kind in KINDS] == list(KINDS)
    with pytest.raises(ValueError, match="unknown target kind 'ordinal'"):
        Target("ordinal")
    with pytest.raises(ValueError, match="ClassTarget holds class targets, not 'numeric'"):
        ClassTarget("numeric")


@pytest.mark.parametrize("kind,names", [("class", ("a", "b")), ("multilabel", ("x", "y", "z")),
                                        ("numeric", ("age",)), ("none", ())])
def test_a_target_is_equal_by_value_hashable_and_survives_pickle_copy_and_replace(kind: str,
                                                                                 names: tuple[str, ...]) -> None:
    target = Target(kind, names)
    assert target == Target(kind, names) and hash(target) == hash(Target(kind, names))
    assert target != Target(kind, (*names, "extra"))
    for again in (pickle.loads(pickle.dumps(target)), copy.deepcopy(target), dataclasses.replace(target)):
        assert again == target and type(again) is type(target)
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.names = ()  # type: ignore[misc]


def test_the_kinds_count_a_split_their_own_way() -> None:
    labels = np.array([0, 2, 2, 0, 2], dtype=np.int64)
    hot = np.array([[1, 0], [1, 1], [0, 0]], dtype=np.uint8)
    numbers = np.array([[1.0, 10.0], [3.0, 20.0]], dtype=np.float32)
    assert Target("class", ("a", "b", "c")).split_counts(labels, np.zeros((5, 0))) == {
        "class_counts": {"a": 2, "c": 3}}  # a class no sample has is left out
    assert Target("multilabel", ("x", "y")).split_counts(np.full(3, -1), hot) == {"class_counts": {"x": 2, "y": 1}}
    assert Target("numeric", ("age", "dose")).split_counts(np.full(2, -1), numbers) == {
        "class_counts": {}, "target_stats": {"age": {"min": 1.0, "mean": 2.0, "max": 3.0},
                                             "dose": {"min": 10.0, "mean": 15.0, "max": 20.0}}}
    assert Target("numeric", ("age",)).split_counts(np.zeros(0), np.zeros((0, 1), np.float32))["target_stats"] == {
        "age": {}}
    assert Target("none").split_counts(np.zeros(0), np.zeros((0, 0))) == {"class_counts": {}}


def test_a_numeric_splits_mean_is_recorded_unrounded_within_its_min_and_max() -> None:
    """target_stats' mean was rounded to 6 decimal places: targets in small units (an ADC of
    7e-10 m²/s) got mean 0.0, below their min. The mean is now the float32 values' mean as float64,
    unrounded, like min and max; it is the same in any order of the samples, stays within [min,
    max] where every value is one number, and the pooled total is unrounded too."""
    adc = np.array([[7.0e-10], [7.5e-10], [8.0e-10], [1.15e-9]], dtype=np.float32)
    target = Target("numeric", ("adc",))
    stats = target.split_counts(np.full(4, -1), adc)["target_stats"]["adc"]
    assert stats["min"] <= stats["mean"] <= stats["max"]
    assert stats["mean"] == pytest.approx(float(np.mean(adc.astype(np.float64))), rel=1e-12)
    assert target.split_counts(np.full(4, -1), adc[::-1])["target_stats"] == {"adc": stats}
    same = np.full((7, 1), 0.1, dtype=np.float32)  # 0.10000000149011612 as float64: no rounding below it
    assert target.split_counts(np.full(7, -1), same)["target_stats"]["adc"] == {
        "min": float(np.float32(0.1)), "mean": float(np.float32(0.1)), "max": float(np.float32(0.1))}
    last = np.array([[9.0e-10]], dtype=np.float32)
    other = target.split_counts(np.full(1, -1), last)["target_stats"]
    pooled = target.summarize_total([{"samples": 4, "class_counts": {}, "target_stats": {"adc": stats}},
                                     {"samples": 1, "class_counts": {}, "target_stats": other}])["target_stats"]
    assert pooled["adc"]["mean"] == pytest.approx(float(np.mean(np.vstack([adc, last]).astype(np.float64))), rel=1e-12)


def test_class_counts_must_add_up_only_where_each_sample_has_one_class() -> None:
    entry = {"samples": 4, "class_counts": {"x": 3, "y": 3}}  # 6 labels held by 4 samples
    assert Target("multilabel", ("x", "y")).split_problem(entry) is None
    assert Target("class", ("x", "y")).split_problem(entry) == "class_counts add up to 6, not samples 4"


def test_a_labels_view_keeps_the_rows_holding_any_wanted_label() -> None:
    assert Target("class", ("a", "b", "c")).holding(np.array([0, 1, 2, 1]), {1, 2}).tolist() == [
        False, True, True, True]
    flat = np.array([1, 0, 0,  0, 1, 1,  0, 0, 0], dtype=np.float32)  # three rows of three labels
    assert Target("multilabel", ("a", "b", "c")).holding(flat, {0, 2}).tolist() == [True, True, False]
    assert Target("numeric", ("age",)).view_column is None and Target("none").view_column is None
    with pytest.raises(ValueError, match="no labels to filter by"):
        Target("numeric", ("age",)).holding(np.zeros(2), {0})


def test_class_targets_mix_by_merging_names_and_vector_targets_only_with_the_same_names() -> None:
    joined, remap = Target("class", ("cat", "dog")).join(Target("class", ("bird", "dog")))
    assert joined == Target("class", ("cat", "dog", "bird")) and remap == {0: 2, 1: 1}
    assert Target("class", ("cat", "dog")).join(Target("class", ("cat",))) == (Target("class", ("cat", "dog")), None)
    same = Target("multilabel", ("a", "b"))
    assert same.join(Target("multilabel", ("a", "b"))) == (same, None)
    with pytest.raises(TargetMismatch, match=r"multilabel target names \['b', 'a'\] differ from \['a', 'b'\]"):
        same.join(Target("multilabel", ("b", "a")))


def test_a_record_states_the_vector_its_target_reads_back_from() -> None:
    for target, text in ((Target("multilabel", ("a", "b", "c")), "a|c"),
                         (Target("numeric", ("age", "dose")), "61|0.5")):
        label, vector = target.encode(text, where="t")
        assert label is None and vector is not None
        record = target.record_fields(text, label, vector)
        assert target.record_vector(record) == tuple(float(v) for v in vector)
    assert Target("class", ("a", "b")).record_fields("b", 1, None) == {"label": "b", "label_index": 1}
    assert Target("none").record_fields("", None, None) == {}


def test_the_diff_counts_a_relabeled_multilabel_sample_under_each_label_it_gained_or_lost() -> None:
    target = Target("multilabel", ("a", "b", "c"))
    old = target.index_target(None, [1, 1, 0])
    new = target.index_target(None, [0, 1, 1])
    assert old == ("a, b", (("a", 1), ("b", 1), ("c", 0)))
    assert target.relabeled(old, new) and not target.relabeled(old, old)
    assert sorted(target.relabel_counts(old, new)) == [("a", "relabeled_out"), ("c", "relabeled_in")]
    assert target.diff_names(*target.index_target(None, [0, 0, 0])) == ("(none)",)
