"""Step functions of ``explain-generation`` (inseq's names) and chat-templated prompts.

What each generated token ``y_j`` explains, given its prefix ``x_j`` (prompt + earlier tokens):

* ``probability`` / ``logprob`` / ``logit``: ``q(y_j | x_j)`` (``--quantity prob|logprob|logit``);
* ``contrast_prob_diff`` with a token (``--contrast-token TOK``): ``q(y_j | x_j) - q(c | x_j)``, ``c`` one
  vocabulary token (:class:`~streetlamp.models.adapter.Target`'s ``contrast``);
* ``contrast_logprob_diff`` with a prompt (``--contrast-prompt TEXT``): ``log p(y_j | x_j) - log p(y_j | x'_j)``,
  ``x'_j`` the contrastive prompt + the same earlier generated tokens. The second term does not depend
  on the explained input, so every attribution equals the ``logprob`` one (gradients and removal
  differences are unchanged; IG's completeness target ``F(x) - F(baseline)`` too); the contrast enters
  the recorded step values (``step_values``), as in inseq where the contrastive forward carries no gradient;
* ``kl_divergence``: ``-KL(p(. | x_j) || p(. | x'_j))`` of the perturbed input ``x'_j`` against the unedited
  run, for the perturbation methods (occlusion's score is then the KL divergence itself; at the unedited
  input it is 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import StreetlampError
from ...models.adapter import KL, ModelAdapter


def _ids(out: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)``'s ids (a list, or a mapping with ``input_ids``)."""
    ids = out["input_ids"] if not isinstance(out, list) else out
    return [int(i) for i in (ids[0] if ids and isinstance(ids[0], list) else ids)]


def chat_prompt_ids(adapter: ModelAdapter, prompt: str) -> torch.Tensor:
    """The prompt as the user's turn of the tokenizer's chat template, ending with the assistant's header
    (``add_generation_prompt``); the template's own tokenisation, checked against its text re-tokenised."""
    tok = adapter.tokenizer
    if not getattr(tok, "chat_template", None):
        raise StreetlampError(f"--chat: {adapter.name}'s tokenizer has no chat template")
    msgs = [{"role": "user", "content": prompt}]
    ids = _ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    if ids != [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]:
        raise StreetlampError("--chat: the chat template's ids differ from its text re-tokenised")
    return torch.tensor(ids, dtype=torch.long)


def chat_continuation_ids(adapter: ModelAdapter, prompt: str, prompt_ids: list[int], text: str) -> list[int]:
    """Forced decoding under the chat template: the ids of the assistant's reply ``text`` exactly as the
    template writes the whole conversation (it must start with the templated prompt, then the reply)."""
    tok = adapter.tokenizer
    msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
    full = _ids(tok.apply_chat_template(msgs, tokenize=True))
    reply = [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
    n = len(prompt_ids)
    if full[:n] != prompt_ids or full[n : n + len(reply)] != reply or not reply:
        raise StreetlampError(
            f"--chat: the chat template does not write the continuation {text!r} as its tokens after the prompt"
        )
    return reply


@dataclass(frozen=True)
class StepFunction:
    quantity: str
    contrast: int | None = None
    contrast_prompt_ids: tuple[int, ...] | None = None
    contrast_text: str | None = None

    @classmethod
    def build(
        cls,
        adapter: ModelAdapter,
        quantity: str,
        contrast_token: str | None,
        contrast_prompt: str | None,
        chat: bool,
    ) -> StepFunction:
        """The step function of checked settings (``GenerationSettings.check_step``/``validate``: one kind of
        contrast, KL with perturbation methods, one contrast token)."""
        if contrast_token is not None:
            ids = adapter.tokenizer(contrast_token, add_special_tokens=False)["input_ids"]
            return cls(quantity, contrast=int(ids[0]))
        if contrast_prompt is not None:
            ids = chat_prompt_ids(adapter, contrast_prompt) if chat else adapter.encode(contrast_prompt).input_ids[0]
            return cls(quantity, contrast_prompt_ids=tuple(int(i) for i in ids), contrast_text=contrast_prompt)
        return cls(quantity)

    @property
    def name(self) -> str:
        if self.quantity == KL:
            return KL
        if self.contrast is not None:
            return f"contrast_{self.quantity}_diff"
        if self.contrast_prompt_ids is not None:
            return "contrast_logprob_diff"
        return {"prob": "probability"}.get(self.quantity, self.quantity)

    @property
    def explains(self) -> str:
        if self.quantity == KL:
            return f"{KL}: -KL(p(.|x) || p(.|x')) against the unedited run (occlusion: the KL itself; 0 at x)"
        if self.contrast is not None:
            return f"{self.name}: {self.quantity}(y_j) - {self.quantity}(contrast token id {self.contrast})"
        if self.contrast_prompt_ids is not None:
            return (
                f"{self.name}: log p(y_j | prompt, y_<j) - log p(y_j | {self.contrast_text!r}, y_<j); the second "
                "term is a constant of the explained input, so attributions equal the logprob ones"
            )
        return f"{self.name}: {self.quantity}(y_j | prompt, y_<j)"

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "quantity": self.quantity, "explains": self.explains}
        if self.contrast is not None:
            d["contrast_token_id"] = self.contrast
        if self.contrast_text is not None:
            d["contrast_prompt"] = self.contrast_text
            d["contrast_prompt_ids"] = list(self.contrast_prompt_ids or ())
        return d

    @torch.no_grad()
    def values(self, adapter: ModelAdapter, full: torch.Tensor, prompt_len: int) -> np.ndarray:
        """The step function at the unedited input, per generated token ``full[prompt_len:]`` (float64)."""
        gen = full[prompt_len:]
        k = len(gen)
        if self.quantity == KL:
            return np.zeros(k)

        def q(ids: torch.Tensor, start: int) -> torch.Tensor:  # [k, vocab] quantity after positions start-1..
            pos = torch.arange(start - 1, start - 1 + k)
            logits = adapter.logits_at(ids[None], pos)[0].double()
            if self.quantity == "logit":
                return logits
            lp = torch.log_softmax(logits, -1)
            return lp.exp() if self.quantity == "prob" else lp

        qx = q(full, prompt_len)
        f = qx.gather(1, gen.view(-1, 1).to(qx.device))[:, 0]
        if self.contrast is not None:
            f = f - qx[:, self.contrast]
        if self.contrast_prompt_ids is not None:
            c = torch.tensor(self.contrast_prompt_ids, dtype=torch.long)
            qc = q(torch.cat([c, gen]), len(c))
            f = f - qc.gather(1, gen.view(-1, 1).to(qc.device))[:, 0]
        return f.cpu().numpy()
