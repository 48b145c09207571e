"""The model-kind registry: one object per kind whose facts the engines read; no module compares a kind
with its name."""

from __future__ import annotations

import ast
import copy
import json
import pickle

import pytest

from streetlamp.models.kinds import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, KINDS, ModelKind, kind_named
from tests.test_imports import modules


def _compares_a_kind_with_its_name(node: ast.Compare) -> bool:
    """``x.kind == "causal_lm"``, ``kind != "classifier"``, ``adapter.kind in ("causal_lm", "seq2seq")``..."""

    def is_kind(e: ast.expr) -> bool:
        return (isinstance(e, ast.Attribute) and e.attr == "kind") or (isinstance(e, ast.Name) and e.id == "kind")

    def names_a_kind(e: ast.expr) -> bool:
        if isinstance(e, ast.Constant):
            return e.value in KINDS
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_kind(x) for x in e.elts)
        return isinstance(e, ast.Name) and e.id in ("CLASSIFIER", "CAUSAL_LM", "ENCODER_DECODER")

    sides = [node.left, *node.comparators]
    return any(is_kind(a) for a in sides) and any(names_a_kind(b) for b in sides)


def test_no_module_branches_on_a_kind_name() -> None:
    """The engines read a kind's facts (``adapter.kind.causal``, ``.labels``, ``.removal``, ``.view``,
    ``.stacks``, ``.generative``), never compare it with a name: a new kind is one object and one line."""
    bad = [
        f"{m}:{node.lineno}: {ast.unparse(node)}"
        for m, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare) and _compares_a_kind_with_its_name(node)
    ]
    assert not bad, "kind compared with its name:\n" + "\n".join(bad)


def test_the_reader_finds_kind_comparisons() -> None:
    """The check above can fail."""
    found = [
        _compares_a_kind_with_its_name(n)
        for src in (
            "a.kind == 'causal_lm'",
            "kind != 'classifier'",
            "adapter.kind in ('causal_lm', 'seq2seq')",
            "a.kind == ENCODER_DECODER",
            "spec.kind == 'linear'",
            "a.kind.causal == True",
        )
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.Compare)
    ]
    assert found == [True, True, True, True, False, False]


def test_the_facts_of_each_kind() -> None:
    """What each kind is, written out: the engines' branches follow from these."""
    facts = {k: (k.readout, k.labels, k.view, k.removal, k.stacks, k.causal, k.generative) for k in KINDS.values()}
    assert facts == {
        "classifier": ("label", True, "sequence", "token", 1, False, False),
        "causal_lm": ("next_token", False, "sequence", "causal", 1, True, True),
        "seq2seq": ("next_token", False, "source_target", "token", 2, False, True),
    }
    assert [k for k in KINDS.values() if k.loads("GPT2LMHeadModel")] == [CAUSAL_LM]
    assert [k for k in KINDS.values() if k.loads("ViTForImageClassification")] == [CLASSIFIER]
    assert [k for k in KINDS.values() if k.loads("T5ForConditionalGeneration")] == [ENCODER_DECODER]


def test_a_kind_is_its_name_and_one_object() -> None:
    """Manifests, messages and ``Method.kinds`` hold the name; a copy or a pickle is the registered object."""
    assert (
        CAUSAL_LM == "causal_lm"
        and f"{CAUSAL_LM}" == "causal_lm"
        and json.dumps({"k": CAUSAL_LM}) == '{"k": "causal_lm"}'
    )
    assert type(CAUSAL_LM.name) is str and kind_named("seq2seq") is ENCODER_DECODER
    for k in KINDS.values():
        assert copy.deepcopy(k) is k and pickle.loads(pickle.dumps(k)) is k and isinstance(k, ModelKind)
    with pytest.raises(AttributeError, match="frozen"):
        CLASSIFIER.causal = True  # type: ignore[misc]


def test_adapters_hold_their_kind_object(tiny) -> None:  # type: ignore[no-untyped-def]
    assert tiny.kind is KINDS[tiny.kind.name] and tiny.describe()["kind"] == tiny.kind.name
    assert type(tiny.describe()["kind"]) is str
