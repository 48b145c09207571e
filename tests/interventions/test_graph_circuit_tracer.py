"""streetlamp's attribution graph against circuit-tracer's own (issue 39, item 5): the same tiny Llama checkpoint
(``save_tiny``) and the same random transcoders (tests/helpers/dictionaries.py ``tiny_transcoders``) on the same
token ids, circuit-tracer 0.5.0's ``attribute`` on its TransformerLens ``ReplacementModel`` (the checkpoint
converted by TransformerLens's own loader, its ``SingleLayerTranscoder`` objects built from the same tensors:
tests/helpers/circuit_tracer_peer.py) against ``interventions.graphs.attribute``: the active features and their
activations, the logit nodes and their probabilities, and the whole adjacency matrix (features, errors, tokens,
logits: the node orders are the same), in float64 on both sides.

transformers' Llama computes RMSNorm and RoPE's cos/sin in float32 whatever the model's dtype; TransformerLens in
the model's. For the float64 comparison both are made float64 here (``_float64_llama``: the same formulas in
the input's dtype), so the two graphs are one float64 computation apart, each stored in float32 (both libraries'
adjacency dtype): an edge may differ by its two roundings, ``2^-24 |w|`` each, plus float64 rounding.

circuit-tracer lives in the test-only ``.feat-venv`` (``make feat-venv``; its pins: transformers 4,
TransformerLens 3), run in a subprocess. Skipped when that environment is missing, failed instead where
STREETLAMP_REQUIRE_PEERS=1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from streetlamp.interventions.graphs import Graph, attribute
from streetlamp.models.adapter import Inputs, ModelAdapter
from streetlamp.models.dictionaries import load_features
from streetlamp.models.tiny import save_tiny, tiny_model
from tests.helpers.dictionaries import tiny_transcoders
from tests.helpers.peers import missing_peer

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / ".feat-venv" / "bin" / "python"

if not PEER.exists():
    missing_peer(f"circuit-tracer not installed in {PEER.parent.parent} (make feat-venv)", True)

TEXT = "when mary and john went to the store , john gave a drink to"
SEED = 0
# float64 on both sides, relative to the largest value compared. Measured: activations 2e-10, logits 3e-11, adjacency
# 5e-9 of the largest (its float32 storage), i.e. above float64 rounding (1e-15) but 2^8 below float32's 2^-24: a
# float32 constant on one side (e.g. a norm's eps) is the likely residue, not located. 2^-28 is 2^4 below float32.
F64 = 2.0**-28


def _float64_llama(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' LlamaRMSNorm and LlamaRotaryEmbedding computing in the input's dtype (they cast to float32):
    the formulas TransformerLens computes in the model's dtype."""
    from transformers.models.llama import modeling_llama as ml

    def rms(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dim = 2 * self.inv_freq.numel()
        base = self.config.rope_parameters["rope_theta"]
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=x.dtype, device=x.device) / dim))
        freqs = position_ids[..., None].to(x.dtype) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", rms)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rope)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Graph, dict[str, torch.Tensor], torch.Tensor, dict]:
    tmp = tmp_path_factory.mktemp("circuit-tracer-peer")
    model_dir = save_tiny("llama", tmp / "tiny-model", seed=SEED)  # no "llama" in the name: see the peer
    fs = load_features(tiny_transcoders(tmp / "transcoders"))
    model, tok = tiny_model("llama", seed=SEED)
    ids = [tok.bos_token_id] + tok(TEXT, add_special_tokens=False).input_ids  # circuit-tracer wants a special first
    w = {"ids": torch.tensor(ids)}
    for (l, _), d in fs.dictionaries.items():  # circuit-tracer's layout: W_enc [width, d_model]
        w |= {f"{l}.W_enc": d.W_enc.T.contiguous(), f"{l}.b_enc": d.b_enc, f"{l}.W_dec": d.W_dec, f"{l}.b_dec": d.b_dec}
    save_file(w, str(tmp / "in.safetensors"))
    run = subprocess.run(
        [str(PEER), str(ROOT / "tests" / "helpers" / "circuit_tracer_peer.py"), str(model_dir)]
        + [str(tmp / "in.safetensors"), str(tmp / "out"), "float64"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = load_file(str(tmp / "out" / "graph.safetensors"))
    info = json.loads((tmp / "out" / "peer.json").read_text())
    with pytest.MonkeyPatch.context() as mp:
        _float64_llama(mp)
        a = ModelAdapter(model.double(), tok, "tiny-llama")
        a.attach_features(fs)
        ours = attribute(a, torch.tensor(ids), batch_size=64)  # zero_bos, 10 logits, 0.95: circuit-tracer's
        out = a.forward(Inputs.from_ids(a, [ids], strings=False)).logits
        logits = out[0, -1] if out.dim() == 3 else out[0]
    return ours, theirs, logits, info


def test_nodes_equal_circuit_tracers(graphs: tuple[Graph, dict[str, torch.Tensor], torch.Tensor, dict]) -> None:
    """The same model (logits), the same active features in the same order with the same activations, the same
    logit nodes with the same probabilities."""
    g, theirs, logits, info = graphs
    assert info["circuit-tracer"] == "0.5.0"
    assert g.ids == theirs["input_tokens"].tolist()
    assert g.info["zero_bos"]  # circuit-tracer zeroes position 0's features and errors
    torch.testing.assert_close(logits, theirs["tl_logits"], rtol=0, atol=F64 * float(logits.abs().max()))
    assert np.array_equal(g.features, theirs["active_features"].numpy())  # (layer, position, index), sorted
    assert theirs["selected_features"].tolist() == list(range(g.n_features))  # every active feature is a node
    assert g.n_features > 100 and (g.features[:, 1] > 0).all()
    acts = theirs["activation_values"].numpy()
    assert np.abs(g.activations - acts).max() <= F64 * np.abs(acts).max()
    assert g.logit_ids.tolist() == theirs["logit_ids"].tolist()
    assert np.abs(g.logit_probs - theirs["logit_probs"].numpy()).max() <= F64


def test_adjacency_equals_circuit_tracers(graphs: tuple[Graph, dict[str, torch.Tensor], torch.Tensor, dict]) -> None:
    """Every entry of the adjacency (targets: features and logits; sources: features, errors, tokens), the
    special first token's node included: float64 on both sides, each stored in float32, so at most the two
    float32 roundings of the value (2^-24 |w| each) and float64 rounding apart."""
    g, theirs, _, _ = graphs
    A, B = g.adjacency.double(), theirs["adjacency"].double()
    assert A.shape == B.shape == (g.n_nodes, g.n_nodes)
    assert int((B != 0).sum()) > 10_000
    tol = 2.0**-23 * B.abs() + F64 * float(B.abs().max())
    bad = torch.nonzero((A - B).abs() > tol)
    assert not len(bad), [(g.label(t), g.label(s), float(A[t, s]), float(B[t, s])) for t, s in bad[:10].tolist()]
    # the zeroed first position: no feature, zero error columns, but the token node's edges (circuit-tracer's)
    assert not A[:, [g.error_start + l * g.n_pos for l in range(g.n_layers)]].any()
    assert A[:, g.token_start].any()
