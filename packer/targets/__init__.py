"""What a dataset's training target is, and how one sample's target is written, stored and read.

A dataset has one target kind (the job's sources must agree), recorded in the manifest. Each
kind is one class, registered by name (:func:`register_target_kind`):

========== ================ ==================================== =========================== ==========================
kind       class            a sample carries                     tar member / Parquet        loader batch
========== ================ ==================================== =========================== ==========================
class      ClassTarget      one class name (``label_map`` index) ``.cls`` / ``label`` int64  ``label`` int64 (B,)
multilabel MultiLabelTarget any number of the ``names``          ``.target.npy`` uint8 (L,)  ``target`` float32 (B, L)
                                                                 / ``target`` list<float32>  multi-hot
numeric    NumericTarget    one float per name of ``names``      ``.target.npy`` float32     ``target`` float32 (B, K)
                                                                 (K,) / ``target``
none       NoTarget         nothing (unlabeled)                  no ``.cls``; ``label`` null no ``label`` or ``target``
========== ================ ==================================== =========================== ==========================

A multilabel target may be ``masked`` (``Target(kind, names, masked=True)``; the manifest's
``target_mask: true``): each sample then also carries a uint8 target mask, 1 per entry to use
and 0 per entry a loss skips (``.target_mask.npy``, Parquet ``target_mask`` list<uint8>, batch
``target_mask`` float32 (B, L)). Only a job with an ``ignore`` policy makes one, so every other
dataset's shards are as they were.

``Target(kind, names)`` (and :meth:`Target.of_manifest`) gives the kind's class. Everything
that differs by kind is a method of it: how a table row becomes the target's text and a
shard's bytes (:meth:`Target.encode`), what the manifest records per split, what ``inspect``,
``diff``, ``verify`` and the HTML report say, what the loader's ``labels=`` view keeps and
whether two datasets mix. The rest of packer asks those methods and never compares a kind's
name (``tests/test_target_kinds.py`` keeps it so).

On the client a sample's target travels as text in ``SampleRef.label`` (one column of the
sample table, whatever the kind): the class name; the multi-label names joined by ``|`` in
sorted order (``""``: none of them; a name prefixed by ``?``, :data:`IGNORED`, is a label the
sample neither holds nor lacks: an uncertain or blank cell under an ``ignore`` policy, 0 in the
target and in the target mask); the numbers as ``repr`` of their float32 values joined by
``|``; ``""`` for an unlabeled sample. :meth:`Target.encode` turns that text into what a shard
holds; ``None`` is a sample without a target, which discovery reports as ``missing_label``.

Adding a kind: a module here with a subclass of :class:`Target` that sets ``KIND`` and answers
every abstract method, decorated with :func:`register_target_kind` and imported below; a
``render_<kind>`` method on :class:`TargetRenderer` (mypy then names every renderer that lacks
it); the kind's row in the README's target section; and, for the job file, its parser in
``packer/config.py`` and ``schemas/``.
"""

from packer.targets.base import (
    FREE_TEXT_LABEL_ATTRIBUTES,
    IGNORED,
    LABEL_ATTRIBUTES,
    NO_POLICY,
    SEPARATOR,
    CellPolicy,
    Refused,
    SampleGroups,
    SheetWords,
    Target,
    TargetFact,
    TargetMismatch,
    TargetRenderer,
    TargetValues,
    mapped_name,
    names_text,
    number_text,
    register_target_kind,
    target_class,
    target_kinds,
)
from packer.targets.classes import ClassTarget
from packer.targets.multilabel import MultiLabelTarget
from packer.targets.numeric import NumericTarget
from packer.targets.unlabeled import NoTarget

#: The registered kind names, in registration order.
KINDS = target_kinds()

__all__ = [
    "FREE_TEXT_LABEL_ATTRIBUTES", "IGNORED", "KINDS", "LABEL_ATTRIBUTES", "NO_POLICY", "SEPARATOR", "CellPolicy",
    "ClassTarget", "MultiLabelTarget",
    "NoTarget", "NumericTarget", "Refused", "SampleGroups", "SheetWords", "Target", "TargetFact", "TargetMismatch",
    "TargetRenderer", "TargetValues", "mapped_name", "names_text", "number_text", "register_target_kind",
    "target_class", "target_kinds",
]
