"""``explain-generation`` on encoder-decoders: each row against an independent computation on HF's eager twin."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.commands.explain import GenerationSettings
from streetlamp.commands.explain.generation import explain_generation
from streetlamp.models.seq2seq import Seq2SeqAdapter
from streetlamp.models.tiny import save_tiny, tiny_seq2seq
from streetlamp.store.files import load_arrays
from tests.conftest import F64_TOL

SOURCE = "the movie was not good"
TARGET = [5, 9, 7]
GL4 = {"rule": "gauss_legendre", "steps": 4, "adaptive": False}


def _independent(adapter: Seq2SeqAdapter, family: str) -> dict[str, np.ndarray]:
    """IG (4-node Gauss–Legendre, pad baseline, structural specials kept), gradient x input and the last
    decoder layer's head-mean attention of each target, computed on the eager twin target by target."""
    twin = copy.deepcopy(adapter.hf_model)
    twin.set_attn_implementation("eager")
    tok = adapter.tokenizer
    src = tok(SOURCE, return_tensors="pt").input_ids[0]
    start = twin.config.decoder_start_token_id
    dec = torch.tensor([start] + TARGET[:-1])
    S, k = len(src), len(TARGET)
    emb = twin.get_input_embeddings()
    specials = {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id} - {None}

    def F(xs: torch.Tensor, xd: torch.Tensor, j: int) -> torch.Tensor:
        logits = twin(inputs_embeds=xs[None], decoder_inputs_embeds=xd[None]).logits[0, j]
        return torch.log_softmax(logits, -1)[TARGET[j]]

    t, w = np.polynomial.legendre.leggauss(4)
    alphas, weights = (t + 1) / 2, w / 2
    ig = np.zeros((k, S + k))
    gxi = np.zeros((k, S + k))
    ends = np.zeros((k, 2))
    for j in range(k):
        ids = torch.cat([src, dec[: j + 1]])
        with torch.no_grad():
            e = emb(ids)
            eb = torch.where(
                torch.tensor([int(i) in specials for i in ids])[:, None], e, emb(torch.full_like(ids, tok.pad_token_id))
            )
        total = torch.zeros(len(ids), dtype=torch.float64)
        for a, wk in zip(alphas, weights):
            x = (eb + float(a) * (e - eb)).requires_grad_(True)
            (g,) = torch.autograd.grad(F(x[:S], x[S:], j), x)
            total += float(wk) * (g * (e - eb)).sum(-1)
        ig[j, : S + j + 1] = total.numpy()
        with torch.no_grad():
            ends[j] = [float(F(e[:S], e[S:], j)), float(F(eb[:S], eb[S:], j))]
        # gradient x input over the whole decoder input: the causal decoder gives later inputs exactly 0
        with torch.no_grad():
            full = emb(torch.cat([src, dec]))
        x = full.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F(x[:S], x[S:], j), x)
        row = (g * full).sum(-1).detach().numpy()
        assert np.all(row[S + j + 1 :] == 0)
        gxi[j] = row
    with torch.no_grad():
        ref = twin(input_ids=src[None], decoder_input_ids=dec[None], output_attentions=True)
    cross = np.zeros((k, S + k))
    self_ = np.zeros((k, S + k))
    cross[:, :S] = ref.cross_attentions[-1][0].mean(0).numpy()
    self_[:, S:] = ref.decoder_attentions[-1][0].mean(0).numpy()
    return {"ig": ig, "gxi": gxi, "ends": ends, "cross": cross, "self": self_}


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_rows_equal_independent_per_target_computations(family: str, tmp_path: Path) -> None:
    model, tok = tiny_seq2seq(family, seed=1)
    adapter = Seq2SeqAdapter(model.double(), tok, f"tiny-{family}")
    res = explain_generation(
        adapter,
        GenerationSettings.from_values(
            prompt=SOURCE, methods=["integrated_gradients", "gradient_x_input", "attention"], ig_params=GL4
        ),
        tmp_path / "g",
        continuation_ids=TARGET,
    )
    ref = _independent(adapter, family)
    S = len(tok(SOURCE).input_ids)
    assert res.matrices["integrated_gradients"].shape == (len(TARGET), S + len(TARGET))
    np.testing.assert_allclose(res.matrices["integrated_gradients"], ref["ig"], rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(res.matrices["gradient_x_input"], ref["gxi"], rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(res.matrices["attention.cross_attn"], ref["cross"], rtol=0, atol=F64_TOL)
    np.testing.assert_allclose(res.matrices["attention.self_attn"], ref["self"], rtol=0, atol=F64_TOL)
    # the target attends to the source and to earlier targets: both blocks carry weight
    assert np.abs(ref["ig"][:, :S]).sum() > 1e-3 and np.abs(ref["ig"][1:, S + 1 :]).sum() > 1e-3
    a = load_arrays(tmp_path / "g" / "arrays.safetensors")
    np.testing.assert_allclose(a["completeness"][:, 2:4], ref["ends"], rtol=0, atol=F64_TOL)
    assert a["allowed"].sum(1).tolist() == [S + j + 1 for j in range(len(TARGET))]
    assert a["attention.encoder"].shape == (2, 4, S, S)
    m = json.loads((tmp_path / "g" / "manifest.json").read_text())
    assert m["encoder_decoder"] and m["source_tokens"] == S and m["generated_ids"] == TARGET
    assert len(m["tokens"]) == S + len(TARGET) and m["tokens"][S] == tok.convert_ids_to_tokens(
        model.config.decoder_start_token_id
    )


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("s2s")
    return {f: save_tiny(f, root / f, seed=2) for f in ("bart", "t5")}


def test_cli_greedy_default_ig(dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "o"
    args = ["explain-generation", "i loved it", "--model", str(dirs["bart"]), "--new-tokens", "3", "--out", str(out)]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    a = load_arrays(out / "arrays.safetensors")
    assert m["continuation"] == "greedy" and len(m["generated_ids"]) == 3 and "src:" in stdout
    assert a["integrated_gradients.matrix"].shape == (3, m["source_tokens"] + 3)
    assert (out / "generation.png").exists() and (out / "report.html").exists()
    # completeness: the shared path's sums reach F(e) - F(e') within the recorded tolerance
    comp = a["completeness"]
    assert np.all(comp[:, 1] <= m["parameters"]["methods"]["integrated_gradients"]["tolerance"])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["explain", "the movie"], "explain reads one stack of layers"),
        (["lens", "the movie"], "lens reads one stack of layers"),
        (["probe", "--task", "pos"], "probe reads one stack of layers"),
        (["explain-generation", "the movie", "--methods", "rollout"], "two stacks joined by cross-attention"),
        (["explain-generation", "the movie", "--methods", "alti"], "cross-attention hop"),
        (["explain-generation", "the movie", "--methods", "attention_x_gradient"], "explain-generation runs attention"),
        (
            [
                "explain-generation",
                "the movie",
                "--methods",
                "occlusion",
                "--method-params",
                '{"occlusion": {"group": "word"}}',
            ],
            "group 'word' is not built there",
        ),
        (["explain-generation", "the movie", "--continuation", "zebra"], "unknown token"),
        (
            [
                "explain-generation",
                "the movie",
                "--methods",
                "attention",
                "--method-params",
                '{"attention": {"layer": 7}}',
            ],
            "the decoder has 2 layers",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], needle: str
) -> None:
    out = tmp_path / "never"
    rc = main([*argv, "--model", str(dirs["t5"]), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1 and not out.exists()


def test_conformance_of_the_methods_that_apply(tmp_path: Path) -> None:
    """The capability flags the registry's conformance test checks, for the encoder-decoder path: no
    method is stochastic (another seed, the same matrices), and only the gradient methods need
    gradients (attention and occlusion run with autograd off)."""
    model, tok = tiny_seq2seq("bart", seed=4)
    adapter = Seq2SeqAdapter(model, tok, "tiny-bart")
    methods = ["attention", "saliency", "gradient_x_input", "integrated_gradients", "occlusion"]
    runs = [
        explain_generation(
            adapter,
            GenerationSettings.from_values(prompt=SOURCE, methods=methods, ig_params=GL4, seed=seed),
            tmp_path / str(seed),
            continuation_ids=TARGET,
        )
        for seed in (0, 7)
    ]
    assert runs[0].matrices.keys() == runs[1].matrices.keys()
    for name, mat in runs[0].matrices.items():
        assert np.array_equal(mat, runs[1].matrices[name]), name
    with torch.inference_mode():  # attention needs no gradient
        res = explain_generation(
            adapter,
            GenerationSettings.from_values(prompt=SOURCE, methods=["attention", "occlusion"]),
            tmp_path / "inf",
            continuation_ids=TARGET,
        )
    np.testing.assert_array_equal(res.matrices["attention.cross_attn"], runs[0].matrices["attention.cross_attn"])
    np.testing.assert_array_equal(res.matrices["occlusion"], runs[0].matrices["occlusion"])
    assert np.all(runs[0].matrices["saliency"] >= 0)
