"""The attention-sink note (``streetlamp.readings``): the rule on hand-made rows, then on a tiny GPT-2 whose
weights force every head to put most of its attention on position 0: ``explain`` prints the sink and the
reading with it set aside, the manifest (and so the report) carries it, checked against the attention the
model records and a rollout computed here by hand; an ordinary tiny model gets no note."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.methods.attention import record_attention
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import save_tiny, tiny_model
from streetlamp.readings import SINK_SHARE, SKEW_TIMES_UNIFORM, attention_sink, position_skew
from streetlamp.report.viewer import build_html
from streetlamp.store.files import load_arrays
from tests.conftest import f32_tol

TEXT = "the movie was not good at all"
LABELS = list("abcdef")


def test_sink_rule_on_hand_made_rows() -> None:
    half = np.array([0.5, 0.25, 0.125, 0.125])  # exactly half (binary fractions): outweighs the other three
    s = attention_sink(half, LABELS)
    assert s is not None and s["key"] == 0 and s["share"] == SINK_SHARE == 0.5
    assert s["set_aside"] == [[1, "b", 0.5], [2, "c", 0.25], [3, "d", 0.25]]
    assert attention_sink(np.array([0.49, 0.2, 0.2, 0.11]), LABELS) is None  # just under half: no sink
    assert attention_sink(np.array([9.0, 1.0]), LABELS) is None  # two keys: one always holds half
    assert attention_sink(np.array([0.9, -0.05, 0.15]), LABELS) is None  # signed: not a share of mass
    assert attention_sink(np.zeros(4), LABELS) is None
    # over chosen keys (a causal row reads 0..pos): the share is of those keys' total
    s = attention_sink(np.array([0.1, 0.6, 0.2, 0.1, 5.0]), LABELS, keys=[0, 1, 2, 3])
    assert s is not None and s["key"] == 1 and s["share"] == pytest.approx(0.6)
    # the skew note: |relevance| share of the ends against a uniform share
    sk = position_skew(np.array([-9.0] + [0.125] * 8 + [1.0]))  # |.| total 11: first 9/11 of it, last 1/11
    assert sk is not None and sk["first"]["sign"] == -1
    assert sk["first"]["times_uniform"] == pytest.approx(10 * 9 / 11) and sk["last"]["share"] == pytest.approx(1 / 11)
    assert position_skew(np.array([-4.0] + [1.0] * 9)) is None  # 4/13 of it: 3.1x uniform, under 5x
    assert position_skew(np.ones(10)) is None


def sink_gpt2() -> tuple[torch.nn.Module, object]:
    """Every head's query is one constant vector, every key reads the direction v0 that only position 0's
    embedding has (the positions after it carry v1 ⟂ v0): the score to key 0 is ~4.5 above the others,
    so each row puts ~0.9 on position 0. Attention and MLP outputs are zeroed: every layer sees the
    same residual, so every layer sinks."""
    model, tok = tiny_model("gpt2", seed=0, layers=2)
    d = model.config.n_embd
    v0 = torch.tensor([1.0] * (d // 2) + [-1.0] * (d // 2))
    v1 = torch.tensor([1.0, -1.0] * (d // 2))
    with torch.no_grad():
        model.transformer.wpe.weight[:] = v1
        model.transformer.wpe.weight[0] = v0
        for blk in model.transformer.h:
            w, b = blk.attn.c_attn.weight, blk.attn.c_attn.bias  # Conv1D [d, 3d]: query, key, value
            w[:, :d] = 0
            b[:d] = 1.0
            w[:, d : 2 * d] = torch.outer(v0, torch.ones(d)) * 0.05
            b[d : 2 * d] = 0
            for lin in (blk.attn.c_proj, blk.mlp.c_proj):
                lin.weight.zero_()
                lin.bias.zero_()
    return model, tok


def rollout_row(att: np.ndarray, pos: int) -> np.ndarray:
    """Abnar & Zuidema's rollout by hand: Â = 0.5·mean_h A + 0.5·I, rows renormalised, multiplied up."""
    n = att.shape[-1]
    r = np.eye(n)
    for layer in att:
        a = 0.5 * layer.mean(0) + 0.5 * np.eye(n)
        r = (a / a.sum(-1, keepdims=True)) @ r
    return r[pos]


@pytest.fixture(scope="module")
def sink_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, np.ndarray]:
    root = tmp_path_factory.mktemp("sink")
    model, tok = sink_gpt2()
    model.save_pretrained(root / "ckpt", safe_serialization=True)
    tok.save_pretrained(root / "ckpt")
    a = ModelAdapter(model, tok, "sink")
    att = record_attention(a, a.encode(TEXT))[1][0].double().numpy()  # the reference: [layer, head, q, k]
    out = root / "run"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["explain", TEXT, "--model", str(root / "ckpt"), "--methods", "attention,rollout", "--out", str(out)])
    assert rc == 0
    return out, buf.getvalue(), att


def test_forced_sink_is_printed_and_stored(sink_run: tuple[Path, str, np.ndarray]) -> None:
    out, printed, att = sink_run
    n = att.shape[-1]
    row = att[-1, :, -1].mean(0)  # the attention method's default view: last layer, head mean, explained row
    roll = rollout_row(att, n - 1)
    assert row[0] > 0.8 and SINK_SHARE <= roll[0] / roll.sum() < row[0]  # the weights did force a sink
    m = json.loads((out / "manifest.json").read_text())
    labels = m["token_labels"]
    tol = f32_tol(2)
    for name, ref in (("attention", row), ("rollout", roll)):
        s = m["methods"][name]["attention_sink"]
        assert s["key"] == 0 and s["token"] == labels[0] and s["threshold"] == SINK_SHARE
        assert s["share"] == pytest.approx(ref[0] / ref.sum(), abs=tol)
        rest = ref[1:] / ref[1:].sum()
        want = sorted(range(1, n), key=lambda j: -ref[j])[:3]
        got = [k for k, _, _ in s["set_aside"]]
        assert sorted(got) == sorted(want) or np.allclose(ref[got], ref[want], atol=tol)  # ties may swap
        np.testing.assert_allclose([v for _, _, v in s["set_aside"]], rest[np.array(got) - 1], atol=tol)
        assert f"attention sink in {'this attention row' if name == 'attention' else name}: {labels[0]!r}@0" in printed
    assert "with it set aside, the top tokens are" in printed
    html = build_html(out)  # the report carries the note's numbers and the code that words them
    assert '"attention_sink"' in html and "attention sink in ${name}" in html


def test_no_sink_on_an_ordinary_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ckpt = save_tiny("gpt2", tmp_path / "gpt2", seed=1)
    out = tmp_path / "run"
    assert main(["explain", TEXT, "--model", str(ckpt), "--methods", "attention,rollout", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert "attention sink" not in printed and all("attention_sink" not in v for v in m["methods"].values())


def test_forced_sink_on_the_long_path(sink_run: tuple[Path, str, np.ndarray], capsys: pytest.CaptureFixture) -> None:
    """``explain --rows`` (the chunked path of long texts, where the 0.998 was seen): the same note, the
    numbers in the manifest entry of ``rollout.tokens`` (the long view reads them there)."""
    out, _, att = sink_run
    ckpt = out.parent / "ckpt"
    long = out.parent / "long"
    argv = ["explain", TEXT, "--model", str(ckpt), "--methods", "rollout", "--rows", "last", "--layers", "0"]
    assert main([*argv, "--out", str(long)]) == 0
    printed = capsys.readouterr().out
    roll = rollout_row(att, att.shape[-1] - 1)
    s = json.loads((long / "manifest.json").read_text())["arrays"]["rollout.tokens"]["attention_sink"]
    assert s["key"] == 0 and s["share"] == pytest.approx(roll[0] / roll.sum(), abs=f32_tol(2))
    assert f"attention sink in rollout row {att.shape[-1] - 1}: {s['token']!r}@0" in printed
    assert '"attention_sink"' in build_html(long)


@pytest.mark.parametrize("words", [1, 4])
def test_attnlrp_skew_is_marked_on_long_texts_only(words: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A tiny Llama's AttnLRP gives its last token ~4x uniform on 5 tokens (no note) and ~35x on 40
    (the note, with the shares recomputed here from the stored relevance)."""
    ckpt = save_tiny("llama", tmp_path / "llama", seed=1)
    text = (
        " ".join(["the movie was not good but the acting was great"] * words) if words > 1 else "the movie was not good"
    )
    out = tmp_path / "run"
    assert main(["explain", text, "--model", str(ckpt), "--methods", "attnlrp", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    r = np.asarray(load_arrays(out / "arrays.safetensors")["attnlrp.tokens"], np.float64)
    a, n = np.abs(r), len(r)
    first, last = a[0] / a.sum() * n, a[-1] / a.sum() * n
    info = json.loads((out / "manifest.json").read_text())["methods"]["attnlrp"]
    if max(first, last) < SKEW_TIMES_UNIFORM:
        assert n == 5 and "position_skew" not in info and "position skew" not in printed
        return
    assert n == 40 and last > 20  # far above the threshold: the note must be there
    sk = info["position_skew"]
    assert sk["last"]["times_uniform"] == pytest.approx(last, rel=1e-5) and sk["n_tokens"] == n
    assert sk["first"]["share"] == pytest.approx(a[0] / a.sum(), rel=1e-5) and sk["first"]["sign"] == np.sign(r[0])
    assert "position skew in attnlrp: position 0 takes" in printed and "grows with the length" in printed
    assert '"position_skew"' in build_html(out)
