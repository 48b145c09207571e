"""Greedy generation on a causal LM ends after the model's EOS, as Hugging Face's ``generate`` does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from streetlamp.commands.explain import GenerationSettings
from streetlamp.commands.explain.generation import explain_generation
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model

PROMPT = "the movie was not good"


def test_greedy_ends_at_eos_like_hf_generate(tmp_path: Path) -> None:
    """A bias on the LM head's EOS logit, chosen from the EOS gaps (max logit - EOS logit) along the
    unbiased greedy path, makes EOS win first at step m: our greedy path must end there with EOS kept,
    equal to ``generate(do_sample=False)``; ``--new-tokens`` still caps it; the manifest says why it ended."""
    model, tok = tiny_model("gpt2", seed=3)
    model = model.double()
    a = ModelAdapter(model, tok, "tiny-gpt2")
    eos = int(model.config.eos_token_id)
    assert a.eos_token_ids == {eos}
    ids = a.encode(PROMPT).input_ids[0]
    free = a.generate(ids, 6, stop_at_eos=False)
    gaps = []
    with torch.no_grad():
        for j in range(6):
            lg = model(input_ids=torch.cat([ids, torch.tensor(free[:j], dtype=torch.long)])[None]).logits[0, -1]
            gaps.append(float(lg.max() - lg[eos]))
    assert eos not in free and min(gaps) > 0  # the precondition: EOS never wins unbiased
    m = int(np.argmin(gaps))  # first minimum: every earlier gap is larger
    assert m >= 1  # seed 3: EOS first wins after some generated tokens
    b = gaps[m] + 0.5 * min([g - gaps[m] for g in gaps[:m]] + [1.0])
    handle = model.get_output_embeddings().register_forward_hook(
        lambda mod, args, out: out + torch.nn.functional.one_hot(torch.tensor(eos), out.shape[-1]).to(out) * b
    )
    try:
        ours = a.generate(ids, 6)
        with torch.no_grad():
            hf = model.generate(
                input_ids=ids[None],
                attention_mask=torch.ones_like(ids)[None],
                max_new_tokens=6,
                do_sample=False,
                num_beams=1,
                eos_token_id=eos,
                pad_token_id=tok.pad_token_id,
            )[0, len(ids) :].tolist()
        assert ours == free[:m] + [eos] == hf
        res = explain_generation(
            a, GenerationSettings.from_values(prompt=PROMPT, new_tokens=6, methods=["saliency"]), tmp_path / "g"
        )
        man = json.loads((tmp_path / "g" / "manifest.json").read_text())
        assert man["generated_ids"] == ours and man["stopped_at"] == "eos" and "ended by EOS" in res.summary[0]
        if m > 0:
            assert a.generate(ids, m) == free[:m]  # the cap comes first
    finally:
        handle.remove()
    explain_generation(
        a, GenerationSettings.from_values(prompt=PROMPT, new_tokens=2, methods=["saliency"]), tmp_path / "n"
    )
    assert json.loads((tmp_path / "n" / "manifest.json").read_text())["stopped_at"] == "new_tokens"
