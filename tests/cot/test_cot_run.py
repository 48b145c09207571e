"""``streetlamp cot`` end to end: local engine on a tiny random Llama, the HTTP engine against a
small real OpenAI-API server (rule-based model, errors, garbage), resumption after SIGKILL, bad
input as one line; internals (knockout) against Hugging Face's eager attention with a mask."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from streetlamp.cli import main
from streetlamp.models.adapter import ModelAdapter
from tests.conftest import free_port
from tests.helpers.cot_helpers import RuleModel, save_tiny_lm, serve, tiny_lm, write_questions


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("m") / "tiny-lm", seed=3)


@pytest.fixture()
def server():
    made = []

    def start(mode: str = "ok"):
        m = RuleModel(mode)
        srv, url = serve(m)
        made.append(srv)
        return m, url

    yield start
    for s in made:
        s.shutdown()


def run_cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_local_all_tests_and_rerun(tmp_path: Path, tiny_dir: Path, capsys: pytest.CaptureFixture) -> None:
    data = write_questions(tmp_path / "q.jsonl", 3)
    out = tmp_path / "run"
    args = [
        "cot",
        "--model",
        str(tiny_dir),
        "--data",
        str(data),
        "--tests",
        "all",
        "--hint-kinds",
        "sycophancy,metadata",
        "--max-new-tokens",
        "6",
        "--points",
        "2",
        "--shots",
        "2",
        "--out",
        str(out),
    ]
    code, text, err = run_cli(args, capsys)
    assert code == 0, err
    man = json.loads((out / "manifest.json").read_text())
    titles = [t["title"] for t in man["tables"]]
    assert len(titles) == 4 and all(len(r) == len(t["columns"]) for t in man["tables"] for r in t["rows"])
    recs = [json.loads(l) for p in sorted((out / "records").glob("*.jsonl")) for l in p.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["q0", "q1", "q2"]
    for r in recs:
        assert r["baseline"]["answer"] in "ABCD" and set(r["hint"]) == {"sycophancy", "metadata"}
        assert r["hint"]["metadata"]["hint"] != r["baseline"]["answer"]
        assert "professor" in r["hint"]["sycophancy"]["prompt"].lower()
        assert r["biased_fewshot"]["always_a"]["biased"]["prompt"].count("The answer is (A).") == 2
        assert r["early_answer"]["x"][-1] == 1.0 and r["filler"]["x"] == [0.0, 0.5, 1.0]
        assert abs(sum(r["baseline"]["probs"].values()) - r["baseline"]["letter_mass"]) < 1e-9
    assert (out / "figures" / "lanham.png").exists() and (out / "summary.md").exists()
    before = {p.name: p.stat().st_mtime_ns for p in (out / "metrics").glob("*.parquet")}
    code, text, _ = run_cli(args, capsys)  # rerun: nothing recomputed
    assert code == 0 and "0 chunks computed now" in text
    assert before == {p.name: p.stat().st_mtime_ns for p in (out / "metrics").glob("*.parquet")}
    code, _, err = run_cli(args[:-1] + [str(out), "--seed", "1"], capsys)  # other settings: refused
    assert code == 2 and "other settings" in err


def test_sigkill_mid_run_loses_nothing(tmp_path: Path, tiny_dir: Path) -> None:
    data = write_questions(tmp_path / "q.jsonl", 8)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "streetlamp.cli",
        "cot",
        "--model",
        str(tiny_dir),
        "--data",
        str(data),
        "--tests",
        "hint,early_answer",
        "--max-new-tokens",
        "24",
        "--out",
        str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "metrics").glob("part-*.parquet"))) < 2:
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    parts = {q.name: q.stat().st_mtime_ns for q in (out / "metrics").glob("part-*.parquet")}
    assert 2 <= len(parts) < 8, "killed too late to test resumption"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{8 - len(parts)} chunks computed now" in r.stdout
    for name, mt in parts.items():
        assert (out / "metrics" / name).stat().st_mtime_ns == mt  # done chunks untouched
    ids = [json.loads(l)["id"] for q in sorted((out / "records").glob("*.jsonl")) for l in q.read_text().splitlines()]
    assert ids == [f"q{i}" for i in range(8)]  # each once, none missing
    assert not list(out.rglob(".*.tmp-*"))


def test_http_chat_scores_on_rule_model(tmp_path: Path, server, capsys: pytest.CaptureFixture) -> None:
    m, url = server("ok")
    data = write_questions(tmp_path / "q.jsonl", 4)
    out = tmp_path / "run"
    code, text, err = run_cli(
        [
            "cot",
            "--endpoint",
            url,
            "--data",
            str(data),
            "--tests",
            "hint,biased_fewshot",
            "--biases",
            "suggested",
            "--out",
            str(out),
            "--concurrency",
            "3",
        ],
        capsys,
    )
    assert code == 0, err
    man = json.loads((out / "manifest.json").read_text())
    h = man["scores"]["hint"]
    # the rule model always follows the hint; it says "professor" only when the prompt has one
    assert h["sycophancy"]["used"] == 4 and h["sycophancy"]["faithfulness"] == 1.0
    assert h["metadata"]["used"] == 4 and h["metadata"]["faithfulness_raw"] == 0.0
    assert h["all"]["alpha"] == 1.0  # no answer moved elsewhere
    b = man["scores"]["biased_fewshot"]["suggested"]
    assert b["bias_consistent_biased"] == 1.0 and b["accuracy_unbiased"] == 1.0 and b["accuracy_drop"] == 1.0
    assert man["settings"]["model"]["served_model"] == "rule-model"


def test_judge_verdicts_beside_the_rule(tmp_path: Path, server, capsys: pytest.CaptureFixture) -> None:
    _, url = server("ok")
    judge, jurl = server("ok")
    data = write_questions(tmp_path / "q.jsonl", 4)
    out = tmp_path / "run"
    args = ["cot", "--endpoint", url, "--data", str(data), "--tests", "hint,biased_fewshot", "--biases", "suggested"]
    args += ["--judge-endpoint", jurl, "--out", str(out)]
    code, text, err = run_cli(args, capsys)
    assert code == 0, err
    assert judge.calls == 4 * 3  # one question (POST) per hinted (2 kinds) and biased chain
    recs = [json.loads(l) for p in sorted((out / "records").glob("*.jsonl")) for l in p.read_text().splitlines()]
    for r in recs:
        syc, meta, sug = r["hint"]["sycophancy"], r["hint"]["metadata"], r["biased_fewshot"]["suggested"]
        assert syc["judge"] == {"mentions": True, "raw": "Yes."} and syc["mention_evidence"] == "professor"
        assert meta["judge"] == {"mentions": False, "raw": "**No**"} and meta["mention_evidence"] is None
        assert sug["judge"] == {"mentions": None, "raw": "I cannot tell."}
    man = json.loads((out / "manifest.json").read_text())
    j = man["scores"]["judge"]
    syc, meta, sug = j["hint:sycophancy"], j["hint:metadata"], j["bias:suggested"]
    assert (syc["judged"], syc["rule_yes"], syc["judge_yes"], syc["agreement"]) == (4, 4, 4, 1.0)
    assert syc["n_among"] == 4 and syc["rule_score"] == syc["judge_score"] == 1.0  # 4 used, 4 verbalised
    assert (meta["rule_yes"], meta["judge_yes"], meta["judge_unparsable"], meta["agreement"]) == (0, 0, 0, 1.0)
    assert sug["judge_unparsable"] == 4 and sug["agreement"] != sug["agreement"]  # NaN: nothing to agree on
    assert man["settings"]["parameters"]["judge_endpoint"] == jurl
    assert man["settings"]["parameters"]["judge_model"] == "rule-model"
    assert man["engine_usage"]["judge"]["requests_sent"] == 12
    assert any(t["title"].startswith("Mentions the cause") for t in man["tables"])
    code, text, _ = run_cli(args, capsys)  # rerun: nothing recomputed, the judge not asked again
    assert code == 0 and "0 chunks computed now" in text and judge.calls == 12
    code, _, err = run_cli(args[:-4] + ["--out", str(out)], capsys)  # the same run without its judge: refused
    assert code == 2 and "other settings" in err
    code, _, err = run_cli(args[:-4] + ["--judge-model", "x", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--judge-model needs --judge-endpoint" in err
    code, _, err = run_cli(
        args[:-4] + ["--judge-endpoint", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "u")], capsys
    )
    assert code == 2 and "cannot reach" in err and not (tmp_path / "u").exists()


def test_http_completions_lanham(tmp_path: Path, server, capsys: pytest.CaptureFixture) -> None:
    _, url = server("ok")
    data = write_questions(tmp_path / "q.jsonl", 2)
    code, _, err = run_cli(
        [
            "cot",
            "--endpoint",
            url,
            "--api",
            "completions",
            "--data",
            str(data),
            "--tests",
            "early_answer,add_mistake,paraphrase,filler",
            "--out",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert code == 0, err
    s = json.loads((tmp_path / "r" / "manifest.json").read_text())["scores"]
    assert s["early_answer"]["aoc"] == 0.0  # the rule model's answer never depends on the chain


@pytest.mark.parametrize("mode,needle", [("error500", "failed 2 times"), ("garbage", "not an OpenAI completion")])
def test_server_errors_are_one_line(
    tmp_path: Path, server, capsys: pytest.CaptureFixture, mode: str, needle: str
) -> None:
    _, url = server(mode)
    data = write_questions(tmp_path / "q.jsonl", 2)
    code, _, err = run_cli(
        [
            "cot",
            "--endpoint",
            url,
            "--data",
            str(data),
            "--tests",
            "hint",
            "--retries",
            "1",
            "--out",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_unreachable_endpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = write_questions(tmp_path / "q.jsonl", 2)
    code, _, err = run_cli(
        ["cot", "--endpoint", f"http://127.0.0.1:{free_port()}/v1", "--data", str(data), "--out", str(tmp_path / "r")],
        capsys,
    )
    assert code == 2 and "cannot reach" in err and not (tmp_path / "r").exists()


def test_flaky_server_retries_and_budget_resumes(tmp_path: Path, server, capsys: pytest.CaptureFixture) -> None:
    m, url = server("flaky")
    data = write_questions(tmp_path / "q.jsonl", 3)
    base = [
        "cot",
        "--endpoint",
        url,
        "--data",
        str(data),
        "--tests",
        "hint",
        "--hint-kinds",
        "sycophancy",
        "--out",
        str(tmp_path / "r"),
        "--retries",
        "2",
        "--concurrency",
        "1",
    ]
    code, _, err = run_cli(base + ["--budget", "5"], capsys)  # 4 requests per question
    assert code == 2 and "budget of 5 spent" in err
    code, text, err = run_cli(base, capsys)
    assert code == 0 and "2 chunks computed now" in text, err
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["scores"]["hint"]["sycophancy"]["used"] == 3


def test_no_parsable_answer_is_counted(tmp_path: Path, server, capsys: pytest.CaptureFixture) -> None:
    _, url = server("noletter")
    data = write_questions(tmp_path / "q.jsonl", 3)
    code, _, err = run_cli(
        ["cot", "--endpoint", url, "--data", str(data), "--tests", "hint,early_answer", "--out", str(tmp_path / "r")],
        capsys,
    )
    assert code == 0, err
    s = json.loads((tmp_path / "r" / "manifest.json").read_text())["scores"]
    assert s["baseline"]["unparsable"] == 3 and s["hint"]["skipped"] == 3 and s["early_answer"]["skipped"] == 3


def test_bad_data_and_options(tmp_path: Path, server, capsys: pytest.CaptureFixture) -> None:
    _, url = server("ok")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "choices": ["a", "b"], "answer": "a"}\n{not json\n')
    code, _, err = run_cli(["cot", "--endpoint", url, "--data", str(bad), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "line 2 is not JSON" in err and not (tmp_path / "r").exists()
    bad.write_text('{"question": "q", "choices": ["a"], "answer": "a"}\n')
    code, _, err = run_cli(["cot", "--endpoint", url, "--data", str(bad), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "at least two" in err
    ok = write_questions(tmp_path / "q.jsonl", 2)
    ok.write_text(ok.read_text() + '{"id": "x", "question": "q", "choices": ["a", "b"], "answer": "c"}\n')
    code, _, err = run_cli(
        ["cot", "--endpoint", url, "--data", str(ok), "--tests", "hint", "--out", str(tmp_path / "r2")], capsys
    )
    assert code == 0 and "1 questions" in err and "not among the choices" in err
    man = json.loads((tmp_path / "r2" / "manifest.json").read_text())
    assert man["data"]["skipped"] == [{"id": "x", "why": "answer 'c' is not among the choices"}]
    code, _, err = run_cli(
        ["cot", "--endpoint", url, "--data", str(ok), "--tests", "add_mistake", "--out", str(tmp_path / "r3")], capsys
    )
    assert code == 2 and "--api completions" in err
    code, _, err = run_cli(
        ["cot", "--endpoint", url, "--data", str(ok), "--tests", "hint,bogus", "--out", str(tmp_path / "r4")], capsys
    )
    assert code == 2 and "'bogus'" in err
    code, _, err = run_cli(["cot", "--endpoint", url, "--data", "notes.txt", "--out", str(tmp_path / "r5")], capsys)
    assert code == 2 and "bbh:TASK" in err


def test_knockout_matches_eager_attention_with_a_mask() -> None:
    """Internals: attention mass and per-layer knockout against an independent Hugging Face eager
    twin, where the knockout is a -inf in layer l's additive mask (float64)."""
    from streetlamp.cot.data import Question
    from streetlamp.cot.engines import LocalEngine
    from streetlamp.cot.internals import hint_internals
    from streetlamp.cot.prompts import answer_prompt, cot_prompt, hint_text, hinted_prompt

    model, tok = tiny_lm(seed=5)
    model = model.double()
    adapter = ModelAdapter(model, tok, "tiny")
    eng = LocalEngine(adapter)
    q = Question("q", "what is two plus three ?", ("four", "five", "six"), 1)
    chain = "two plus three is five ."
    hp = answer_prompt(hinted_prompt(q, "sycophancy", "C"), chain)
    res = hint_internals(eng, hp, answer_prompt(cot_prompt(q), chain), hint_text("sycophancy", "C"), chain, "C")
    text = eng.render(hp)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    hint_pos = res["hint_positions"]
    assert hint_pos and res["chain_positions"] > 0
    twin = copy.deepcopy(model)
    twin.set_attn_implementation("eager")
    lid = tok.convert_tokens_to_ids("C")
    n = ids.shape[1]
    causal = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        o = twin(input_ids=ids, attention_mask=causal, output_attentions=True)
    base = torch.log_softmax(o.logits[0, -1], -1)[lid]
    assert res["logp_hinted_letter"] == pytest.approx(float(base), abs=1e-6)  # float32 softmax in both (below)
    for l, a in enumerate(o.attentions):
        assert res["attention_hint"][l] == pytest.approx(
            float(a[0, :, -1, hint_pos].sum(-1).mean()), abs=1e-6
        )  # float32 softmax
    for l in range(model.config.num_hidden_layers):

        def pre(mod, args, kw, l=l):
            m = kw["attention_mask"].clone()
            m[..., -1, hint_pos] = float("-inf")
            kw["attention_mask"] = m
            return args, kw

        h = twin.model.layers[l].self_attn.register_forward_pre_hook(pre, with_kwargs=True)
        try:
            with torch.no_grad():
                lg = twin(input_ids=ids, attention_mask=causal).logits[0, -1]
        finally:
            h.remove()
        # both attention implementations take the softmax in float32 (as Hugging Face's eager one does);
        # renormalising the float32 row and masking before the softmax agree to float32 rounding
        # (eps 6e-8 per probability, through two layers): 1e-6 on the log-probability
        assert res["knockout_hint"][l] == pytest.approx(float(base - torch.log_softmax(lg, -1)[lid]), abs=1e-6)
        assert abs(res["knockout_hint"][l]) > 1e-5  # the knockout does change the output
