"""``evaluate --answer-tokens N``: every answer token scored under forced decoding, checked against a
hand computation with plain Hugging Face forwards and real greedy generation on a tiny GPT-2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.evaluation.erasure import PERCENTS
from streetlamp.methods.occlusion import Occlusion
from streetlamp.models.adapter import Inputs, Target
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from streetlamp.store import read_metrics
from streetlamp.store.files import load_arrays

N = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("answer")
    ckpt = save_tiny("gpt2", tmp / "tiny-gpt2", seed=2)
    data = tmp / "prompts.csv"
    data.write_text("text,label\nthe movie was very good and the acting,good\nthe plot is not,bad\n")
    out = tmp / "run"
    argv = ["evaluate", "--model", str(ckpt), "--data", str(data), "--out", str(out), "--methods", "occlusion"]
    assert main([*argv, "--adv-steps", "2", "--permutations", "2", "--answer-tokens", str(N)]) == 0
    return ckpt, out


def test_answer_metrics_equal_a_hand_computation(run) -> None:
    ckpt, out = run
    adapter = load(str(ckpt))
    hf, tok = adapter.hf_model, adapter.tokenizer
    df = read_metrics(out)
    for eid in ("prompts-000000", "prompts-000001"):
        a = load_arrays(out / "arrays" / f"{eid}.safetensors")
        prompt = a["input_ids"].tolist()

        def logits(ids: list[int]) -> torch.Tensor:
            with torch.no_grad():
                return hf(input_ids=torch.tensor([ids])).logits[0].double()

        def greedy(ids: list[int]) -> list[int]:
            ids, new = list(ids), []
            for _ in range(N):
                new.append(int(logits(ids)[-1].argmax()))
                ids.append(new[-1])
            return new

        answer = greedy(prompt)
        assert a["answer_ids"].tolist() == answer

        def logp(x: list[int]) -> np.ndarray:  # log p(a_j | x, a_<j), j = 0..N-1
            lp = torch.log_softmax(logits(x + answer), -1)
            return np.array([float(lp[len(x) - 1 + j, answer[j]]) for j in range(N)])

        # the scores are occlusion's on each prefix (token j explained on prompt + a_<j)
        sc = a["occlusion.answer_scores"].astype(np.float64)
        for j in range(N):
            full = torch.tensor(prompt + answer[:j])
            e = Occlusion().attribute(adapter, Inputs.from_ids(adapter, [full]), target=Target(answer[j]))[0]
            np.testing.assert_allclose(sc[j], e.scores[: len(prompt)], atol=1e-6)
        # the decoder removal rule by hand: the last prompt token stays, a removed first token becomes BOS
        cand = [i for i in range(len(prompt) - 1) if prompt[i] not in (tok.bos_token_id, tok.eos_token_id)]

        def erase(drop: set[int]) -> list[int]:
            return [
                tok.bos_token_id if i == 0 and i in drop else t for i, t in enumerate(prompt) if i == 0 or i not in drop
            ]

        def top(s: np.ndarray, k: int) -> set[int]:
            order = sorted(cand, key=lambda i: (-s[i], i))
            return set(order[: max(1, math.ceil(k / 100 * len(order)))])

        base = logp(prompt)
        m = df[(df.example_id == eid) & (df.method == "occlusion")].set_index("metric").value
        comp_all = []
        for k in PERCENTS:
            comp = [math.exp(base[j]) - math.exp(logp(erase(top(sc[j], k)))[j]) for j in range(N)]
            suff = [math.exp(base[j]) - math.exp(logp(erase(set(cand) - top(sc[j], k)))[j]) for j in range(N)]
            comp_all += comp
            assert m[f"answer_comprehensiveness@{k}"] == pytest.approx(np.mean(comp), abs=1e-6)
            assert m[f"answer_sufficiency@{k}"] == pytest.approx(np.mean(suff), abs=1e-6)
            whole = top(sc.sum(0), k)
            erased = erase(whole)
            assert m[f"answer_logprob_comprehensiveness@{k}"] == pytest.approx(
                base.sum() - logp(erased).sum(), abs=1e-6
            )
            kept = erase(set(cand) - whole)
            assert m[f"answer_logprob_sufficiency@{k}"] == pytest.approx(base.sum() - logp(kept).sum(), abs=1e-6)
            assert m[f"answer_flipped@{k}"] == float(greedy(erased) != answer)  # real generation
        assert m["answer_aopc_comprehensiveness"] == pytest.approx(np.mean(comp_all), abs=1e-6)
        assert max(abs(c) for c in comp_all) > 1e-3  # the check has teeth
        assert m["answer_logprob"] == pytest.approx(base.sum(), abs=1e-6)
        flips = [k for k in PERCENTS if m[f"answer_flipped@{k}"]]
        assert (m["answer_flip_fraction"] == flips[0] / 100) if flips else math.isnan(m["answer_flip_fraction"])


def test_answer_tokens_refused_on_a_classifier(tmp_path, capsys) -> None:
    ckpt = save_tiny("bert", tmp_path / "tiny-bert", seed=1)
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie,0\n")
    argv = ["evaluate", "--model", str(ckpt), "--data", str(data), "--out", str(tmp_path / "r"), "--answer-tokens", "2"]
    assert main(argv) == 2
    assert "needs a causal LM" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_answer_positions_are_reserved_before_the_store(run, tmp_path) -> None:
    """A prompt that fits the model but not with its N-token answer is skipped (or truncated) before
    anything is written; an answer longer than the model's positions is one line."""
    from streetlamp.commands.evaluate.run import prepare
    from streetlamp.data.loaders import Dataset, Example
    from streetlamp.errors import StreetlampError

    ckpt, _ = run
    adapter = load(str(ckpt))
    ds = Dataset("d", "test", [Example("a", "the movie was very good", "good"), Example("b", "the plot", "bad")])
    n = len(adapter.tokenizer("the movie was very good")["input_ids"])
    adapter.max_positions = n + 1
    kept, skipped = prepare(adapter, ds, truncate=False, reserve=0)
    assert [e.id for e in kept] == ["a", "b"] and skipped == []
    kept, skipped = prepare(adapter, ds, truncate=False, reserve=2)  # n + 2 > n + 1: "a" no longer fits
    assert [e.id for e in kept] == ["b"] and skipped == ["a"]
    kept, _ = prepare(adapter, ds, truncate=True, reserve=2)
    assert len(kept[0].ids) == n - 1 and kept[0].truncated
    with pytest.raises(StreetlampError, match="leaves no room"):
        prepare(adapter, ds, truncate=False, reserve=n)
