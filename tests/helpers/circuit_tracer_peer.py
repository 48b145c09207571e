"""circuit-tracer's own attribution graphs of a local tiny Llama with given per-layer transcoders, run by the
test-only ``.feat-venv`` interpreter (tests/interventions/test_graph_circuit_tracer.py): never imported by streetlamp.

Usage: ``.feat-venv/bin/python tests/helpers/circuit_tracer_peer.py MODEL_DIR CASES.json``: one process for every
case (importing TransformerLens and circuit-tracer is most of a case's time).

- ``MODEL_DIR``: a Hugging Face Llama checkpoint folder (streetlamp's ``save_tiny``), read by this venv's
  transformers 4 and converted to a ``HookedTransformer`` by TransformerLens's own loader
  (``get_pretrained_model_config`` / ``get_pretrained_state_dict`` on the local folder: no hub). The folder's name
  must not contain "llama" (TransformerLens then skips reading its config).
- ``CASES.json``: a list of cases, each ``{"inputs", "out", "dtype"}`` and optionally ``"topk"`` (k),
  ``"max_feature_nodes"``, ``"batch_size"`` (64 unless given), ``"update_interval"`` (4 unless given):

  - ``inputs``: a safetensors file: ``ids [n]`` (the prompt, a special token first) and, per layer ``l``,
    ``{l}.W_enc [width, d]``, ``{l}.b_enc``, ``{l}.W_dec [width, d]``, ``{l}.b_dec`` (circuit-tracer's layout),
    optionally ``{l}.threshold [width]`` (a ``JumpReLU``, bandwidth 0.1 as circuit-tracer's loaders) and
    ``{l}.W_skip [d, d]`` (applied as ``x @ W_skip.T``, circuit-tracer's ``compute_skip``); ReLU unless a
    threshold or ``topk`` says otherwise (``TopK(k)``); read at ``mlp.hook_in`` and written at ``mlp.hook_out``
    (streetlamp's ``mlp`` site);
  - ``dtype``: ``float64`` or ``float32``, the model's and the transcoders' dtype.

Per case: builds circuit-tracer's ``SingleLayerTranscoder`` / ``TranscoderSet`` from those tensors and its
TransformerLens ``ReplacementModel`` around the converted model, runs ``attribute`` (10 logits, 0.95) and writes
``out/graph.safetensors``: ``adjacency``, ``active_features [m, 3]``, ``selected_features``,
``activation_values``, ``logit_ids``, ``logit_probs``, ``input_tokens``, ``tl_logits`` / ``hf_logits`` (the
last position, the converted model against the checkpoint), ``influences_{i}`` (the ``i``-th feature ranking's
``compute_partial_influences`` output, when ``max_feature_nodes`` is below the active count); ``out/peer.json``:
versions and the number of rankings.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def tokenizer(model_dir: Path, out: Path):  # noqa: ANN201 - a transformers tokenizer
    """The checkpoint's tokenizer.json, re-saved by this transformers (TransformerLens reloads it by path)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    specials = {k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"), **specials)
    tok.save_pretrained(out / "tokenizer")
    return AutoTokenizer.from_pretrained(out / "tokenizer")


def run_case(model_dir: Path, case: dict, tok, models: dict) -> None:  # noqa: ANN001 - a transformers tokenizer
    import circuit_tracer.attribution.attribute as ct_attribute
    import transformer_lens.loading_from_pretrained as loading
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.activation_functions import JumpReLU, TopK
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
    from transformers import LlamaForCausalLM

    dtype = {"float64": torch.float64, "float32": torch.float32}[case["dtype"]]
    out = Path(case["out"])
    out.mkdir(parents=True, exist_ok=True)
    if dtype not in models:
        hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).eval()
        cfg = loading.get_pretrained_model_config(str(model_dir), fold_ln=False, device="cpu", dtype=dtype)
        models[dtype] = hf, cfg, loading.get_pretrained_state_dict(str(model_dir), cfg, hf)
    hf, cfg, state = models[dtype]
    # a fresh model per case: _configure_replacement_model wraps the MLPs and adds permanent hooks
    model = TransformerLensReplacementModel(cfg, tokenizer=tok)
    # as circuit-tracer's from_pretrained_and_transcoders: no folding, no centring
    model.load_and_process_state_dict(
        dict(state), fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )

    w = load_file(case["inputs"])
    ids = w["ids"].long()
    layers = sorted({int(k.split(".")[0]) for k in w if k != "ids"})
    tcs = {}
    for l in layers:
        width, d = w[f"{l}.W_enc"].shape
        params = {k: w[f"{l}.{k}"].to(dtype) for k in ("W_enc", "b_enc", "W_dec", "b_dec")}
        if f"{l}.threshold" in w:
            act = JumpReLU(w[f"{l}.threshold"].to(dtype), 0.1)
            params["activation_function.threshold"] = w[f"{l}.threshold"].to(dtype)
        elif case.get("topk"):
            act = TopK(int(case["topk"]))
        else:
            act = F.relu
        skip = f"{l}.W_skip" in w
        if skip:
            params["W_skip"] = w[f"{l}.W_skip"].to(dtype)
        tc = SingleLayerTranscoder(d, width, act, l, skip_connection=skip, device=torch.device("cpu"), dtype=dtype)
        tc.load_state_dict(params)
        tcs[l] = tc
    tset = TranscoderSet(tcs, feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out", scan="tiny")
    model._configure_replacement_model(tset)  # what from_config / from_pretrained_and_transcoders call

    with torch.no_grad():
        tl_logits = model(ids[None])[0, -1]
        hf_logits = hf(ids[None]).logits[0, -1]
    rankings: list[torch.Tensor] = []
    own = ct_attribute.compute_partial_influences

    def record(*args, **kw):  # noqa: ANN002, ANN003, ANN202 - circuit-tracer's arguments, passed on
        infl = own(*args, **kw)
        rankings.append(infl.detach().clone())
        return infl

    ct_attribute.compute_partial_influences = record
    try:
        g = attribute(
            ids,
            model,
            batch_size=int(case.get("batch_size", 64)),
            max_feature_nodes=case.get("max_feature_nodes"),
            update_interval=int(case.get("update_interval", 4)),
        )
    finally:
        ct_attribute.compute_partial_influences = own
    res = {
        "adjacency": g.adjacency_matrix,
        "active_features": g.active_features,
        "selected_features": g.selected_features,
        "activation_values": g.activation_values,
        "logit_ids": torch.tensor([t.vocab_idx for t in g.logit_targets]),
        "logit_probs": g.logit_probabilities,
        "input_tokens": g.input_tokens,
        "tl_logits": tl_logits,
        "hf_logits": hf_logits,
    } | {f"influences_{i}": r for i, r in enumerate(rankings)}
    save_file({k: v.detach().cpu().contiguous() for k, v in res.items()}, str(out / "graph.safetensors"))
    info = {k: version(k) for k in ("circuit-tracer", "transformer-lens", "transformers", "torch")}
    (out / "peer.json").write_text(json.dumps(info | {"rankings": len(rankings)}))


def main() -> None:
    model_dir, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    torch.set_grad_enabled(True)
    tok = tokenizer(model_dir, Path(sys.argv[2]).parent)
    models: dict = {}
    for case in cases:
        run_case(model_dir, case, tok, models)


if __name__ == "__main__":
    main()
