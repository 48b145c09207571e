"""MIB's files (issue 37 item 2): task rows as MIB's ``dataset.py`` reads them (hand-written rows in the
three file formats, its filter, missing fields refused), circuit files in the format its
``circuit_loading.py`` loads (the edge names against a transcription of the EAP-IG ``Graph.from_model``
edge construction, MIB's sign, the round trip, another model refused), and the generated arithmetic and
MCQA pairs in MIB's templates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits import faithfulness as F
from streetlamp.interventions.circuits import mib as M
from streetlamp.interventions.circuits import tasks as T
from streetlamp.interventions.circuits.graph import Graph


def mib_edge_names(n_layers: int, n_heads: int) -> set[str]:
    """The edges of EAP-IG's Graph.from_model (parallel_attn_mlp False), as its loop adds them: every earlier
    node into each head's q, k, v, then into the layer's MLP (which also reads the layer's heads), then all
    into the logits."""
    names = set()
    stream = ["input"]
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        for node in stream:
            for a in heads:
                for x in "qkv":
                    names.add(f"{node}->{a}<{x}>")
        stream += heads
        for node in stream:
            names.add(f"{node}->m{layer}")
        stream.append(f"m{layer}")
    return names | {f"{node}->logits" for node in stream}


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_edge_names_are_mibs_graph(kv: int) -> None:
    g = Graph(3, 4, kv)
    names = M.edge_names(g)
    flat = [n for ns in names for n in ns]
    assert len(flat) == len(set(flat)) == F.mib_edge_count(g)
    assert set(flat) == mib_edge_names(3, 4)


def _scores(g: Graph, seed: int = 0) -> torch.Tensor:
    s = torch.full((g.n_readers, g.n_writers), float("nan"), dtype=torch.float64)
    r, w = g.edge_index()
    s[r, w] = torch.from_numpy(np.random.default_rng(seed).normal(size=len(r)))
    return s


def test_circuit_round_trip_and_mibs_sign(tmp_path: Path) -> None:
    g = Graph(2, 4, 2)
    s = _scores(g)
    mask = F.circuit(g, s, 30, signed=True)
    d = M.circuit_json(g, s, mask, d_model=16)
    assert d["cfg"] == {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 16}
    # MIB's apply_topn(n, absolute=False) sorts its scores descending: on the file that is our signed ranking
    r, w = g.edge_index()
    top = sorted(d["edges"], key=lambda k: -d["edges"][k]["score"])
    want = F.top_k(g, s, 5, signed=True)
    chosen = {n for (i, j), ns in zip(zip(r, w), M.edge_names(g)) if bool(want[i, j]) for n in ns}
    assert set(top[: len(chosen)]) == chosen  # (a grouped edge is 2 of MIB's, with equal scores)
    in_graph = {k for k, v in d["edges"].items() if v["in_graph"]}
    nodes_on = {k for k, v in d["nodes"].items() if v["in_graph"]}
    ends = {x for k in in_graph for x in (k.split("->")[0], k.split("->")[1].split("<")[0])}
    assert nodes_on == ends | {"input", "logits"}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    s2, m2 = M.read_circuit(p, g, d_model=16)
    torch.testing.assert_close(s2[r, w], s[r, w], rtol=0, atol=1e-15)
    assert torch.equal(m2, mask) and bool(s2[~g.valid()].isnan().all())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["cfg"].update(n_layers=3), "is for another model (n_layers 3, n_heads 4, d_model 16)"),
        (lambda d: d["cfg"].update(n_heads=8), "this model has n_layers 2, n_heads 4, d_model 16"),
        (lambda d: d["cfg"].update(d_model=32), "is for another model"),
        (lambda d: d.pop("nodes"), "needs the keys cfg, nodes and edges"),
        (lambda d: d["edges"].pop("input->a1.h3<k>"), "has no edge 'input->a1.h3<k>'"),
    ],
)
def test_bad_circuit_files(tmp_path: Path, change, message: str) -> None:
    g = Graph(2, 4, 2)
    d = M.circuit_json(g, _scores(g), g.valid(), d_model=16)
    change(d)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    with pytest.raises(StreetlampError, match=message.replace("(", r"\(").replace(")", r"\)")):
        M.read_circuit(p, g, d_model=16)
    with pytest.raises(StreetlampError, match="does not exist"):
        M.read_circuit(tmp_path / "none.json", g)


IOI_ROW = {
    "prompt": "When Mary and John went to the store, John gave a drink to",
    "metadata": {"indirect_object": "Mary", "subject": "John", "random_c": "Anna"},
    "s2_io_flip_counterfactual": {"prompt": "When Mary and John went to the store, Mary gave a drink to"},
}
MCQA_ROW = {
    "prompt": "The lemon is yellow. What color is the lemon?\nA. red\nB. yellow\nAnswer:",
    "choices": {"label": ["A", "B"], "text": ["red", "yellow"]},
    "answerKey": 1,
    "symbol_counterfactual": {
        "prompt": "The lemon is yellow. What color is the lemon?\nQ. red\nR. yellow\nAnswer:",
        "choices": {"label": ["Q", "R"], "text": ["red", "yellow"]},
        "answerKey": 1,
    },
}
ARITH_ROW = {
    "prompt": "Q: How much is 12 plus 30? A: ",
    "label": 42,
    "operator": "+",
    "random_counterfactual": {"prompt": "Q: How much is 21 plus 50? A: ", "label": 71},
}


def _write(tmp_path: Path, rows: list[dict], fmt: str) -> Path:
    p = tmp_path / f"rows.{fmt}"
    if fmt == "jsonl":
        p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif fmt == "json":
        p.write_text(json.dumps(rows))
    else:
        pd.DataFrame(rows).to_parquet(p)
    return p


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_task_files_read_as_mibs_dataset(tmp_path: Path, fmt: str) -> None:
    pairs, dropped = M.read_task(_write(tmp_path, [IOI_ROW], fmt), "ioi")
    assert dropped == 0 and pairs == [
        T.TaskPair(IOI_ROW["prompt"], IOI_ROW["s2_io_flip_counterfactual"]["prompt"], " Mary", " John")
    ]
    pairs, _ = M.read_task(_write(tmp_path, [MCQA_ROW], fmt), "mcqa")
    assert (pairs[0].answer, pairs[0].wrong) == ("B", "R")  # choices.label[answerKey], no space (as dataset.py)
    assert pairs[0].corrupt == MCQA_ROW["symbol_counterfactual"]["prompt"]
    sub = dict(ARITH_ROW, operator="-")
    pairs, dropped = M.read_task(_write(tmp_path, [ARITH_ROW, sub], fmt), "arithmetic-addition")
    assert dropped == 1 and [(p.answer, p.wrong) for p in pairs] == [("42", "71")]


def test_mibs_filter_and_missing_fields(tmp_path: Path) -> None:
    def n_tokens(s: str) -> int:  # a stand-in tokenizer: one token per 4 characters
        return -(-len(s) // 4)

    long = json.loads(json.dumps(IOI_ROW))
    long["metadata"]["random_c"] = "Bartholomew"  # a third name of another token length: MIB drops the row
    pairs, dropped = M.mib_pairs([IOI_ROW, long], "ioi", "f", n_tokens)
    assert len(pairs) == 1 and dropped == 1
    big = dict(ARITH_ROW, label=123456)
    pairs, dropped = M.mib_pairs([ARITH_ROW, big], "arithmetic-addition", "f", n_tokens)
    assert [p.answer for p in pairs] == ["42"] and dropped == 1
    with pytest.raises(StreetlampError, match="keeps none of its 1 rows"):
        M.mib_pairs([big], "arithmetic-addition", "f", n_tokens)
    bad = {k: v for k, v in IOI_ROW.items() if k != "metadata"}
    with pytest.raises(StreetlampError, match=r"f row 2: no field 'metadata.indirect_object'"):
        M.mib_pairs([IOI_ROW, bad], "ioi", "f")
    with pytest.raises(StreetlampError, match="no field 'symbol_counterfactual.answerKey'"):
        M.mib_pairs([{**MCQA_ROW, "symbol_counterfactual": {"prompt": "x"}}], "mcqa", "f")
    with pytest.raises(StreetlampError, match="unknown MIB task"):
        M.mib_pairs([IOI_ROW], "greater-than", "f")
    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(StreetlampError, match="give .jsonl, .json or .parquet"):
        M.read_rows(tmp_path / "x.csv")
    (tmp_path / "x.jsonl").write_text("{not json\n")
    with pytest.raises(StreetlampError, match="cannot read MIB task file"):
        M.read_rows(tmp_path / "x.jsonl")


def test_generated_arithmetic_and_mcqa_are_mibs_templates() -> None:
    for op, word in (("+", "plus"), ("-", "minus")):
        for p in T.arithmetic(40, seed=1, op=op):
            a, b = (int(x) for x in p.clean.removeprefix("Q: How much is ").removesuffix("? A: ").split(f" {word} "))
            c, d = (int(x) for x in p.corrupt.removeprefix("Q: How much is ").removesuffix("? A: ").split(f" {word} "))
            assert p.clean == f"Q: How much is {a} {word} {b}? A: " and 10 <= min(a, b) and max(a, b) <= 99
            assert int(p.answer) == (a + b if op == "+" else a - b) >= 0
            assert int(p.wrong) == (c + d if op == "+" else c - d) != int(p.answer)
    keep = T.arithmetic(20, seed=2, digits=1, keep=lambda p: len(p.answer) == 1 == len(p.wrong))
    assert all(len(p.answer) == 1 == len(p.wrong) for p in keep)
    with pytest.raises(StreetlampError, match="in 200 draws"):
        T.arithmetic(1, keep=lambda p: False)
    for p in T.mcqa(30, seed=3):
        obj_color, rest = p.clean.split(". What color is the ", 1)
        obj, color = obj_color.removeprefix("The ").split(" is ")
        lines = p.clean.split("\n")
        assert lines[-1] == "Answer:" and (obj, color) in T.MCQA_OBJECTS and len(lines) == 6
        choices = dict(line.split(". ", 1) for line in lines[1:5])
        assert choices[p.answer.strip()] == color  # the answer is the letter of the stated colour
        cl = p.corrupt.split("\n")
        assert [x.split(". ", 1)[1] for x in cl[1:5]] == [x.split(". ", 1)[1] for x in lines[1:5]]  # same choices
        assert cl[0] == lines[0] and dict(x.split(". ", 1) for x in cl[1:5])[p.wrong.strip()] == color
        assert p.wrong != p.answer
