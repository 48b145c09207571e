"""What ``streetlamp explain`` prints and writes, read back and recomputed from the run folder's stored
arrays with scipy: the special-token share of attention, the table of top tokens (values and ranks), the
printed Kendall tau(attention, |occlusion|) and every cell of ``kendall_tau.csv``; special positions
(``manifest["special_positions"]``) excluded as the policy in :mod:`streetlamp.stats` says.

Each number is compared at the precision it is printed with, and each test asserts that the wrong
variant (special tokens kept, signed instead of absolute occlusion) prints a different number, so a
bug of that kind cannot pass."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from streetlamp.cli import main
from streetlamp.models.tiny import tiny_model
from streetlamp.store.files import load_arrays

TEXT = "the movie was not good , but the acting was great ."
METHODS = ["attention", "occlusion", "rollout", "gradient_x_input"]


def tau(a: np.ndarray, b: np.ndarray) -> float:
    return float(kendalltau(np.asarray(a, np.float64), np.asarray(b, np.float64)).statistic)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """family -> (run folder, printed lines). The BERT's classifier is scaled so that occlusion moves the
    output visibly (its changes are not all ~0 and tied at 4 decimals)."""
    root = tmp_path_factory.mktemp("explain")
    out: dict[str, tuple[Path, list[str]]] = {}
    for family in ("bert", "gpt2"):
        model, tok = tiny_model(family, seed=3 if family == "bert" else 1)
        if family == "bert":
            with torch.no_grad():
                model.classifier.weight.mul_(60)
        ck = root / f"ck-{family}"
        model.save_pretrained(ck, safe_serialization=True)
        tok.save_pretrained(ck)
        run = root / family
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["explain", TEXT, "--model", str(ck), "--methods", ",".join(METHODS), "--out", str(run)])
        assert rc == 0
        out[family] = (run, buf.getvalue().splitlines())
    return out


def stored(run: Path) -> tuple[dict[str, np.ndarray], dict, np.ndarray]:
    arrays = load_arrays(run / "arrays.safetensors")
    man = json.loads((run / "manifest.json").read_text())
    special = np.zeros(len(man["tokens"]), bool)
    special[man["special_positions"]] = True
    return arrays, man, special


def line(lines: list[str], pattern: str) -> re.Match:
    for ln in lines:
        m = re.search(pattern, ln)
        if m:
            return m
    raise AssertionError(f"no line matches {pattern!r} in:\n" + "\n".join(lines))


def test_special_token_share_is_the_stored_row(runs: dict) -> None:
    run, lines = runs["bert"]
    a, man, special = stored(run)
    row = a["attention.tokens"].astype(np.float64)
    assert special.any() and (~special).any()
    share = row[special].sum()
    m = line(lines, r"^  (\d+)% of it goes to special tokens")
    assert m.group(1) + "%" == f"{share:.0%}"
    # not vacuous: the mean, the max or the complement would print something else
    assert len({f"{v:.0%}" for v in (share, row[special].mean(), 1 - share)}) == 3
    # a decoder with no special tokens in the text prints no share line
    run_g, lines_g = runs["gpt2"]
    if not stored(run_g)[2].any():
        assert not any("goes to special tokens" in ln for ln in lines_g)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_printed_kendall_tau_is_scipys_on_the_stored_arrays(runs: dict, family: str) -> None:
    run, lines = runs[family]
    a, man, special = stored(run)
    keep = ~special
    row = a["attention.tokens"].astype(np.float64)
    occ = a["occlusion.tokens"].astype(np.float64)
    want = tau(row[keep], np.abs(occ[keep]))
    m = line(lines, r"Kendall tau\(attention, \|occlusion\|\) over the (\d+) word tokens = (-?[\d.]+|nan)$")
    assert int(m.group(1)) == int(keep.sum())
    assert m.group(2) == f"{want:.2f}"
    # not vacuous: signed occlusion gives another printed number, and so does keeping the special tokens
    # (on the BERT: [CLS] and [SEP] are in its text)
    assert f"{tau(row[keep], occ[keep]):.2f}" != m.group(2)
    if special.any():
        assert f"{tau(row, np.abs(occ)):.2f}" != m.group(2)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_top_token_table_is_the_stored_arrays(runs: dict, family: str) -> None:
    """Every row of the table: the attention value, its rank among the word tokens (1 = most), the change
    when the token is removed (minus occlusion's stored score) and its rank by |change|; ties broken by
    position, as the table says nothing else."""
    run, lines = runs[family]
    a, man, special = stored(run)
    row = a["attention.tokens"].astype(np.float64)
    occ = a["occlusion.tokens"].astype(np.float64)
    groups = a.get("occlusion.groups")
    words = [j for j in range(len(row)) if not special[j]]
    occluded = [j for j in words if groups is None or groups[j] >= 0]
    att_rank = {j: r + 1 for r, j in enumerate(sorted(words, key=lambda j: (-row[j], j)))}
    occ_rank = {j: r + 1 for r, j in enumerate(sorted(occluded, key=lambda j: (-abs(occ[j]), j)))}
    start = lines.index("  top by attention:")
    stop = next(i for i, ln in enumerate(lines) if ln.startswith("attention's top"))
    seen = {"top by attention": [], "top by occlusion": []}
    group = ""
    for ln in lines[start:stop]:
        if ln.strip().rstrip(":") in seen:
            group = ln.strip().rstrip(":")
            continue
        m = re.match(r"^  '(.*)'@(\d+)\s+(-?[\d.]+)\s+(\d+)\s+(\S+|not removed)\s+(\d+|-)$", ln)
        assert m, ln
        j = int(m.group(2))
        seen[group].append(j)
        assert m.group(1) == man["token_labels"][j]
        assert m.group(3) == f"{row[j]:.3f}" and int(m.group(4)) == att_rank[j]
        if j in occ_rank:
            assert m.group(5) == f"{-occ[j]:+.4f}" and int(m.group(6)) == occ_rank[j]
    k = 3
    assert seen["top by attention"] == sorted(words, key=lambda j: (-row[j], j))[:k]
    assert seen["top by occlusion"] == sorted(occluded, key=lambda j: (-abs(occ[j]), j))[:k]
    shared = len(set(seen["top by attention"]) & set(seen["top by occlusion"]))
    assert line(lines, r"share (\d+) token\(s\)").group(1) == str(shared)
    # not vacuous: the attention ranks are not the positions, the occlusion ranks not those by signed change
    assert [att_rank[j] for j in words] != list(range(1, len(words) + 1))
    signed = {j: r + 1 for r, j in enumerate(sorted(occluded, key=lambda j: (-occ[j], j)))}
    assert signed != occ_rank


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_kendall_tau_csv_is_scipys_on_the_stored_arrays(runs: dict, family: str) -> None:
    run, _ = runs[family]
    a, man, special = stored(run)
    keep = ~special
    with open(run / "kendall_tau.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["method", *METHODS]
    differs = 0
    for r in rows[1:]:
        x = a[f"{r[0]}.tokens"].astype(np.float64)
        assert len(r) == len(METHODS) + 1
        for name, cell in zip(METHODS, r[1:]):
            y = a[f"{name}.tokens"].astype(np.float64)
            want = tau(x[keep], y[keep])
            assert cell == ("" if np.isnan(want) else f"{want:.4f}"), (r[0], name)
            differs += f"{tau(x, y):.4f}" != cell
    assert {rows[i][i] for i in range(1, len(rows))} == {"1.0000"}
    if special.any():  # not vacuous: keeping the special tokens changes at least one cell
        assert differs > 0
