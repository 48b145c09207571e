"""explain-generation step functions (contrast token / prompt, KL), granularity and chat templates, each
against plain Hugging Face forwards or a hand-made tokenisation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.commands.explain import GenerationSettings
from streetlamp.commands.explain.generation import explain_generation
from streetlamp.commands.explain.steps import chat_continuation_ids, chat_prompt_ids
from streetlamp.methods.granularity import aggregate, unit_starts, units
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import save_tiny, tiny_model
from streetlamp.store.files import load_arrays

PROMPT = "the movie was not good but the acting"
CONT = [7, 9, 11]  # forced continuation ids
DELETE = {"occlusion": {"replacement": "delete"}}  # the tiny vocabulary has [MASK]: ask for deletion


@pytest.fixture(scope="module")
def gpt2() -> ModelAdapter:
    model, tok = tiny_model("gpt2", seed=2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # tokens matter: differences far above float64 round-off
    return ModelAdapter(model.double(), tok, "tiny-gpt2")


def logsoftmax_rows(a: ModelAdapter, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(a.hf_model(input_ids=torch.tensor([ids])).logits[0].double(), -1)


def erased(a: ModelAdapter, ids: list[int], i: int) -> list[int]:
    """The decoder removal rule by hand: position 0 becomes BOS (no <|endoftext|> in this vocabulary)."""
    return [a.tokenizer.bos_token_id, *ids[1:]] if i == 0 else ids[:i] + ids[i + 1 :]


def test_contrast_token(gpt2, tmp_path) -> None:
    a = gpt2
    c = a.tokenizer("bad", add_special_tokens=False)["input_ids"][0]
    r = explain_generation(
        a,
        GenerationSettings.from_values(
            prompt=PROMPT, methods=["occlusion"], contrast_token="bad", method_params=DELETE
        ),
        tmp_path / "g",
        continuation_ids=CONT,
    )
    arr = load_arrays(r.out / "arrays.safetensors")
    ids = a.encode(PROMPT).input_ids[0].tolist() + CONT
    p = len(ids) - len(CONT)
    lp = logsoftmax_rows(a, ids)
    want = [float(lp[p - 1 + j, CONT[j]] - lp[p - 1 + j, c]) for j in range(len(CONT))]
    np.testing.assert_allclose(arr["step_values"], want, atol=1e-9)
    # the last row: occlusion of F = logp(y) - logp(c) on prefix ids[:-1], by hand
    pre, y = ids[:-1], ids[-1]
    f = lambda row: float(logsoftmax_rows(a, row)[-1, y] - logsoftmax_rows(a, row)[-1, c])  # noqa: E731
    hand = [f(pre) - f(erased(a, pre, i)) for i in range(len(pre) - 1)]
    np.testing.assert_allclose(arr["occlusion.matrix"][-1, : len(pre) - 1], hand, atol=1e-5)
    m = json.loads((r.out / "manifest.json").read_text())
    assert m["parameters"]["step_function"]["name"] == "contrast_logprob_diff"
    assert m["parameters"]["step_function"]["contrast_token_id"] == c


def test_contrast_prompt_shifts_values_not_attributions(gpt2, tmp_path) -> None:
    a = gpt2
    other = "the plot was great"
    r = explain_generation(
        a,
        GenerationSettings.from_values(prompt=PROMPT, methods=["gradient_x_input"], contrast_prompt=other),
        tmp_path / "c",
        continuation_ids=CONT,
    )
    plain = explain_generation(
        a,
        GenerationSettings.from_values(prompt=PROMPT, methods=["gradient_x_input"]),
        tmp_path / "p",
        continuation_ids=CONT,
    )
    arr = load_arrays(r.out / "arrays.safetensors")
    np.testing.assert_array_equal(arr["gradient_x_input.matrix"], plain.matrices["gradient_x_input"])
    ids = a.encode(PROMPT).input_ids[0].tolist() + CONT
    cids = a.encode(other).input_ids[0].tolist() + CONT
    p, q = len(ids) - len(CONT), len(cids) - len(CONT)
    lp, lc = logsoftmax_rows(a, ids), logsoftmax_rows(a, cids)
    want = [float(lp[p - 1 + j, CONT[j]] - lc[q - 1 + j, CONT[j]]) for j in range(len(CONT))]
    np.testing.assert_allclose(arr["step_values"], want, atol=1e-9)
    assert max(abs(w) for w in want) > 1e-3


def test_kl_divergence_occlusion(gpt2, tmp_path) -> None:
    a = gpt2
    r = explain_generation(
        a,
        GenerationSettings.from_values(
            prompt=PROMPT, methods=["occlusion"], quantity="kl_divergence", method_params=DELETE
        ),
        tmp_path / "k",
        continuation_ids=CONT,
    )
    arr = load_arrays(r.out / "arrays.safetensors")
    pre = (a.encode(PROMPT).input_ids[0].tolist() + CONT)[:-1]
    ref = logsoftmax_rows(a, pre)[-1]
    hand = []
    for i in range(len(pre) - 1):
        q = logsoftmax_rows(a, erased(a, pre, i))[-1]
        hand.append(float((ref.exp() * (ref - q)).sum()))
    np.testing.assert_allclose(arr["occlusion.matrix"][-1, : len(pre) - 1], hand, atol=1e-6)
    assert min(hand) >= 0 and max(hand) > 1e-3
    np.testing.assert_array_equal(arr["step_values"], 0)


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--contrast-token", "good bad"], "is 2 tokens"),
        (["--quantity", "kl_divergence", "--methods", "gradient_x_input"], "perturbation methods only"),
        (["--contrast-prompt", "the plot", "--quantity", "prob"], "use --quantity logprob"),
    ],
)
def test_bad_step_functions_one_line_exit_2(tmp_path, capsys, extra, msg) -> None:
    ckpt = save_tiny("gpt2", tmp_path / "m", seed=2)
    out = tmp_path / "o"
    capsys.readouterr()  # the checkpoint writer's progress bar
    argv = ["explain-generation", PROMPT, "--model", str(ckpt), "--new-tokens", "2", "--out", str(out)]
    assert main([*argv, "--methods", "occlusion", *extra] if "--methods" not in extra else [*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1 and not out.exists()


def test_granularity_on_a_known_tokenisation() -> None:
    tokens = ["The", "Ġcat", "Ġsat", ".", "ĠIt", "Ġwas", "Ġhap", "py", ".", "ĊĊ", "Next", "Ġday", "!"]
    texts = [t.replace("Ġ", " ").replace("Ċ", "\n") for t in tokens]
    special = np.zeros(len(tokens), bool)
    word = unit_starts(texts, tokens, special, "word")
    sent = unit_starts(texts, tokens, special, "sentence")
    para = unit_starts(texts, tokens, special, "paragraph")
    assert np.flatnonzero(word).tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]  # "py" continues "Ġhap"
    assert np.flatnonzero(sent).tolist() == [0, 4, 9]  # "ĊĊ" follows "." with whitespace at its start
    assert np.flatnonzero(para).tolist() == [0, 9]
    assert set(np.flatnonzero(para)) <= set(np.flatnonzero(sent)) <= set(np.flatnonzero(word))
    m = np.arange(2 * len(tokens), dtype=np.float64).reshape(2, -1)
    unit = np.cumsum(sent) - 1
    np.testing.assert_array_equal(
        aggregate(m, unit),
        [[m[0, :4].sum(), m[0, 4:9].sum(), m[0, 9:].sum()], [m[1, :4].sum(), m[1, 4:9].sum(), m[1, 9:].sum()]],
    )


@pytest.mark.slow
def test_smollm2_units_and_chat_template(smollm) -> None:
    a = smollm
    text = "The cat sat. It was happy.\n\nNext day!"
    ids = a.tokenizer(text)["input_ids"]
    unit, labels = units(a, ids, "sentence")
    assert [s.strip() for s in labels] == ["The cat sat.", "It was happy.", "Next day!"]
    assert "".join(labels) == text
    unit, labels = units(a, ids, "paragraph")
    assert [s.strip() for s in labels] == ["The cat sat. It was happy.", "Next day!"]
    # the chat template, written out by hand (SmolLM2's template with its default system turn)
    pid = chat_prompt_ids(a, "What is 2+2?").tolist()
    by_hand = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert pid == a.tokenizer(by_hand)["input_ids"]
    reply = chat_continuation_ids(a, "What is 2+2?", pid, "It is 4.")
    assert reply == a.tokenizer("It is 4.")["input_ids"]
    whole = a.tokenizer(by_hand + "It is 4.<|im_end|>\n")["input_ids"]
    assert whole[: len(pid) + len(reply)] == pid + reply


def test_word_level_tokenizer_sentences(gpt2) -> None:
    """A word-level tokenizer decodes tokens without their spaces: the decoded prefix supplies them."""
    ids = gpt2.encode("the movie was not good . it was bad").input_ids[0].tolist()
    unit, labels = units(gpt2, ids, "sentence")
    assert labels == ["the movie was not good .", " it was bad"] and unit.tolist() == [0] * 6 + [1] * 3
