"""SAELens's and circuit-tracer's own code on random dictionaries, run by the test-only ``.feat-venv`` interpreter
(tests/models/test_feature_formats.py): never imported by streetlamp.

Usage: ``.feat-venv/bin/python tests/helpers/features_peer.py OUT``. Writes, in float64:

- ``OUT/saelens/<name>/``: SAEs and transcoders of each architecture streetlamp reads, built with SAELens's
  classes and written by its ``save_model`` (``cfg.json`` + ``sae_weights.safetensors``);
- ``OUT/circuit-tracer/``: a skip transcoder set (JumpReLU) written by ``TranscoderSet.to_safetensors`` plus
  the ``config.yaml`` circuit-tracer's cache holds;
- ``OUT/inputs.safetensors`` (``x [n, d]``) and ``OUT/peer.safetensors``: for each dictionary, the latents and
  the reconstruction the peer computes on ``x`` after reading its own files back with its own loader
  (``SAE.load_from_disk``, ``load_transcoder_set``): ``<name>.acts``, ``<name>.recon``;
- ``OUT/peer.json``: the versions and the names.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

D, WIDTH, N = 12, 32, 20


def randomise(module: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = 0.1 if name.startswith("b_") or "threshold" in name or "skip" in name else D**-0.5
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def saelens(out: Path, x: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    from sae_lens import SAE
    from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig
    from sae_lens.saes.transcoder import (
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        SkipTranscoder,
        SkipTranscoderConfig,
        Transcoder,
        TranscoderConfig,
    )

    def meta(hook: str, hook_out: str | None = None) -> SAEMetadata:
        m = {"hook_name": hook, "model_name": "tiny-llama"}
        return SAEMetadata(**m, **({"hook_name_out": hook_out} if hook_out else {}))

    base = {"d_in": D, "d_sae": WIDTH, "dtype": "float64"}
    tc = {**base, "d_out": D, "apply_b_dec_to_input": False}
    saes = {
        "standard": StandardSAE(StandardSAEConfig(**base, metadata=meta("blocks.0.hook_resid_pre"))),
        "standard_no_bdec": StandardSAE(
            StandardSAEConfig(**base, apply_b_dec_to_input=False, metadata=meta("blocks.1.hook_resid_pre"))
        ),
        "topk": TopKSAE(TopKSAEConfig(**base, k=5, metadata=meta("blocks.0.hook_resid_post"))),
        "topk_rescaled": TopKSAE(
            TopKSAEConfig(**base, k=6, rescale_acts_by_decoder_norm=True, metadata=meta("blocks.2.hook_resid_pre"))
        ),
        "jumprelu": JumpReLUSAE(JumpReLUSAEConfig(**base, metadata=meta("blocks.3.hook_resid_pre"))),
        "transcoder": Transcoder(
            TranscoderConfig(**tc, metadata=meta("blocks.0.hook_mlp_in", "blocks.0.hook_mlp_out"))
        ),
        "skip_transcoder": SkipTranscoder(
            SkipTranscoderConfig(**tc, metadata=meta("blocks.1.hook_mlp_in", "blocks.1.hook_mlp_out"))
        ),
        "jumprelu_skip_transcoder": JumpReLUSkipTranscoder(
            JumpReLUSkipTranscoderConfig(**tc, metadata=meta("blocks.2.mlp.hook_in", "blocks.2.mlp.hook_out"))
        ),
    }
    res = {}
    for name, sae in saes.items():
        randomise(sae, g)
        folder = out / "saelens" / name
        sae.save_model(folder)
        back = SAE.load_from_disk(folder, dtype="float64")  # the peer's own loader on its own files
        with torch.no_grad():
            acts = back.encode(x)
            recon = back.decode(acts)
            if hasattr(back, "W_skip"):
                recon = back.forward(x)  # the skip term is added in forward
        res[f"saelens/{name}.acts"], res[f"saelens/{name}.recon"] = acts, recon
    return res


def circuit_tracer(out: Path, x: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    from circuit_tracer.transcoder.activation_functions import JumpReLU
    from circuit_tracer.transcoder.single_layer_transcoder import (
        SingleLayerTranscoder,
        TranscoderSet,
        load_transcoder_set,
    )

    folder = out / "circuit-tracer"
    tcs = {}
    for l in range(2):
        act = JumpReLU(torch.zeros(WIDTH, dtype=torch.float64), 0.1)
        tcs[l] = SingleLayerTranscoder(
            D, WIDTH, act, l, skip_connection=True, device=torch.device("cpu"), dtype=torch.float64
        )
        randomise(tcs[l], g)
    hooks = {"feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out"}
    TranscoderSet(tcs, scan="tiny-llama", **hooks).to_safetensors(str(folder))
    # what circuit-tracer's cache (save_transcoders_to_cache) keeps beside the layer files
    (folder / "config.yaml").write_text(yaml.dump({"model_kind": "transcoder_set", "scan": "tiny-llama", **hooks}))
    paths = {l: str(folder / f"layer_{l}.safetensors") for l in range(2)}
    back = load_transcoder_set(
        paths,
        scan="tiny-llama",
        device=torch.device("cpu"),
        dtype=torch.float64,
        lazy_encoder=False,
        lazy_decoder=False,
        **hooks,
    )
    res = {}
    with torch.no_grad():
        for l in range(2):
            acts = back[l].encode(x)
            res[f"circuit-tracer/{l}.acts"] = acts
            res[f"circuit-tracer/{l}.recon"] = back[l].decode(acts, x)
    return res


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    res = {**saelens(out, x, g), **circuit_tracer(out, x, g)}
    save_file({"x": x}, str(out / "inputs.safetensors"))
    save_file({k: v.contiguous() for k, v in res.items()}, str(out / "peer.safetensors"))
    info = {"sae_lens": version("sae-lens"), "circuit_tracer": version("circuit-tracer"), "names": sorted(res)}
    (out / "peer.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()
