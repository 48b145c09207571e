"""Every registered method and every registered command on an accelerator gives what it gives on the CPU.

Runs only where a GPU is present (or where ``STREETLAMP_TEST_DEVICE`` names a device); skipped otherwise.
``STREETLAMP_TEST_DEVICE=cpu`` (what CI runs) places the model on the *virtual device* of
``tests/helpers/virtual_device.py``: CPU memory that a torch function mode keeps apart from the host, so a
tensor made without the model's device meets the model's activations and fails here as it fails on a GPU
(issue 35: ``circuit --device cuda`` failed on a lent H200 while every CPU test passed).

* float32 on the device equals float32 on the CPU to float tolerance, per method and family
  (TF32 is switched off for the comparison: it changes matmuls at the 1e-3 level by design);
* bfloat16 on the device runs every method, returns finite float32 arrays, and ranks tokens
  like float32 (Spearman, loose bound: bf16 keeps 8 bits of mantissa);
* every registered command (read from the registry: a command added later fails here until it has a
  case in :data:`CASES` or a reason in :data:`NO_MODEL`) runs through the CLI on the device in float32
  and in bfloat16 and writes no bfloat16 array; ``circuit``'s edge scores on the device equal the CPU's.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from streetlamp.errors import StreetlampError
from streetlamp.methods.registry import REGISTRY, get_method
from streetlamp.models.adapter import ModelAdapter, Target
from streetlamp.models.tiny import FAMILY_KINDS, WORDS, save_tiny, tiny_model
from tests.conftest import TEXTS, f32_tol
from tests.helpers.virtual_device import VDEV, VirtualDevice

DEVICE = os.environ.get("STREETLAMP_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
on_gpu = pytest.mark.skipif(not DEVICE, reason="no GPU here (set STREETLAMP_TEST_DEVICE to force a device)")
VIRTUAL = DEVICE == "cpu"  # the CPU: the model goes to the virtual device, under its mode
PLACE = str(VDEV) if VIRTUAL else DEVICE


def on_place(d: torch.device) -> bool:
    """``d`` is where the tests place the model (the virtual device: exactly; a GPU: any of its kind)."""
    return d == VDEV if VIRTUAL else d.type == torch.device(DEVICE).type


def on_device() -> contextlib.AbstractContextManager:
    """The virtual device's mode on the CPU; nothing on a real accelerator."""
    return VirtualDevice() if VIRTUAL else contextlib.nullcontext()


@pytest.fixture(autouse=True)
def mode() -> Iterator[VirtualDevice | None]:
    """Every test runs under the virtual device's mode on the CPU (the CPU references too: host tensors
    only meet host tensors there, so they never raise)."""
    with on_device() as m:
        yield m


FAST: dict[str, dict] = {
    "integrated_gradients": {"steps": 8, "adaptive": False},
    "shap": {"n_samples": 64},
    "lime": {"n_samples": 64},
    "attention_attribution": {"steps": 4},
}


@pytest.fixture(autouse=True)
def _no_tf32():
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def pair(family: str, dtype: str = "float32") -> tuple[ModelAdapter, ModelAdapter]:
    model, tok = tiny_model(family, seed=1)
    cpu = ModelAdapter(model, tok, f"tiny-{family}")
    dev = ModelAdapter(copy.deepcopy(model), copy.deepcopy(tok), f"tiny-{family}").to(PLACE, dtype)
    return cpu, dev


def run(name: str, adapter: ModelAdapter):
    return get_method(name, **FAST.get(name, {})).attribute(adapter, adapter.encode(TEXTS), target=Target(), seed=3)


@on_gpu
@pytest.mark.parametrize("family", sorted(FAMILY_KINDS))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_float32_on_device_equals_cpu(name: str, family: str) -> None:
    cpu, dev = pair(family)
    if cpu.kind not in get_method(name).kinds:
        pytest.skip(f"{name} does not apply to {cpu.kind}")
    try:
        get_method(name).check(cpu)
    except StreetlampError as e:  # a method that refuses the family says so in one line (as below)
        pytest.skip(str(e))
    assert on_place(dev.device)
    for a, b in zip(run(name, cpu), run(name, dev)):
        assert a.info["target"] == b.info["target"]
        for k in a.arrays:
            x, y = a.arrays[k], b.arrays[k]
            assert y.dtype == x.dtype, f"{name}.{k}: dtype differs on {DEVICE}"
            if k == "completeness" and abs(x[2] - x[3]) < 1e-3:
                # [delta, delta/|dF|, F(e), F(e'), sum]: on tiny random models dF ~ 1e-6, so the ratio is
                # float noise over float noise (measured on an H200: it differed); compare the rest
                x, y = np.delete(x, 1), np.delete(y, 1)
            np.testing.assert_allclose(
                y, x, atol=2e-4, rtol=2e-3, err_msg=f"{name}.{k} differs on {DEVICE} vs cpu ({family})"
            )


@on_gpu
@pytest.mark.parametrize("family", sorted(FAMILY_KINDS))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_bfloat16_on_device_runs(name: str, family: str) -> None:
    """Tiny random models: bf16 runs every method and returns finite float arrays.

    (Their score differences are often below bf16's resolution, so ranks are checked on the
    trained classifier below.)"""
    cpu, dev = pair(family, "bfloat16")
    if cpu.kind not in get_method(name).kinds:
        pytest.skip(f"{name} does not apply to {cpu.kind}")
    try:
        get_method(name).check(cpu)
    except StreetlampError as e:  # a method that refuses the family says so in one line
        pytest.skip(str(e))
    assert next(dev.hf_model.parameters()).dtype == torch.bfloat16
    for b in run(name, dev):
        for k, arr in b.arrays.items():
            if np.issubdtype(arr.dtype, np.floating):
                assert arr.dtype in (np.float32, np.float64), f"{name}.{k} came back as {arr.dtype}"
                assert np.all(np.isfinite(arr)), f"{name}.{k} not finite in bfloat16"


@pytest.fixture(scope="module")
def minilm_pair() -> tuple[ModelAdapter, ModelAdapter, ModelAdapter]:
    import streetlamp

    try:
        cpu = streetlamp.load("minilm-sentiment")
    except (StreetlampError, OSError) as e:
        pytest.skip(f"minilm-sentiment not available: {e}")
    with on_device():  # the module's fixture is made before a test's mode: tag its weights here
        return (
            cpu,
            streetlamp.load("minilm-sentiment").to(PLACE),
            streetlamp.load("minilm-sentiment").to(PLACE, "bfloat16"),
        )


SENTENCES = [
    "the movie was not good , but the acting was great .",
    "a gripping , beautifully shot film that never lets go .",
]


@on_gpu
@pytest.mark.parametrize("name", list(REGISTRY))
def test_trained_classifier_on_device(name: str, minilm_pair) -> None:
    """minilm-sentiment: float32 on the device equals the CPU; bfloat16 ranks tokens as float32 does
    (measured on this CPU in bf16: Spearman >= 0.99 for every method on these sentences)."""
    cpu, dev, bf = minilm_pair
    m = get_method(name, **FAST.get(name, {}))
    ref = m.attribute(cpu, cpu.encode(SENTENCES), target=Target(), seed=3)
    for a, b in zip(ref, m.attribute(dev, dev.encode(SENTENCES), target=Target(), seed=3)):
        np.testing.assert_allclose(
            b.scores,
            a.scores,
            atol=2e-4 * max(1.0, np.abs(a.scores).max()),
            rtol=2e-3,
            err_msg=f"{name} on {DEVICE} vs cpu",
        )
    for a, b in zip(ref, m.attribute(bf, bf.encode(SENTENCES), target=Target(), seed=3)):
        assert np.all(np.isfinite(b.scores))
        rho = spearmanr(a.scores, b.scores).statistic
        assert rho > 0.9, f"{name}: bf16 Spearman vs fp32 only {rho:.2f}"


# -- every registered command through the CLI -------------------------------------------------------------
PAIRS = (
    "clean,corrupt,answer,wrong\n"
    "when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a "
    "drink to, mary, john\nthe movie was good and the acting,the film was bad and the acting, good, bad\n"
)


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return checkpoints(tmp_path_factory.mktemp("device"))


def checkpoints(t: Path) -> dict[str, Path]:
    """Tiny checkpoints (a BERT classifier, GPT-2, a grouped-query Llama, Mixtral, the cot test's Llama LM)
    and their data, in ``t`` (what :data:`CASES` reads)."""
    from tests.helpers.cot_helpers import save_tiny_lm, write_questions
    from tests.helpers.dictionaries import tiny_dictionary, tiny_transcoders

    data = t / "d.csv"
    data.write_text(
        "text,label\n"
        + "\n".join(f"{WORDS[i]} {WORDS[i + 1]} {WORDS[i + 2]},{['neg', 'neu', 'pos'][i % 3]}" for i in range(8))
        + "\n"
    )
    (t / "pairs.csv").write_text(PAIRS)
    (t / "sources.txt").write_text("the movie was good. mary went to the store. john hated the plot.")
    (t / "bench.jsonl").write_text(
        '{"sources": ["the movie was good.", "mary went to the store.", "john hated the plot."], '
        '"question": "what is good", "answer": "the movie", "planted": [0], "kind": "k"}\n'
    )
    return {
        "bert": save_tiny("bert", t / "bert", seed=1),
        "gpt2": save_tiny("gpt2", t / "gpt2", seed=1),
        "llama": save_tiny("llama", t / "llama", seed=1),
        "mixtral": save_tiny("mixtral", t / "mixtral", seed=1),
        "lm": save_tiny_lm(t / "lm", seed=3),
        "questions": write_questions(t / "q.jsonl", 2),
        "data": data,
        "pairs": t / "pairs.csv",
        "sources": t / "sources.txt",
        "bench": t / "bench.jsonl",
        "dictionary": tiny_dictionary(t / "dictionary"),  # a transcoder at layer 1 of the tiny Llama
        "transcoders": tiny_transcoders(t / "transcoders"),  # one at each of its layers (graph)
    }


TEXT = "when mary and john went to the store"
Argv = Callable[[dict[str, Path]], list]
# command -> its cases: case -> its arguments (short runs on the tiny checkpoints; --out, --device and --dtype
# are added). Every registered command is here or in NO_MODEL (test_every_command_has_a_device_case).
CASES: dict[str, dict[str, Argv]] = {
    "explain": {
        "classifier": lambda c: (
            ["explain", TEXT, "--model", c["bert"]] + ["--methods", "attention,integrated_gradients,occlusion"]
        ),
        "long-rows": lambda c: (
            ["explain", TEXT, "--model", c["llama"], "--rows", "last", "--layers", "0,-1"]
            + ["--methods", "rollout,flow,attention_x_gradient,occlusion"]
        ),
    },
    "explain-generation": {
        "llama": lambda c: (
            ["explain-generation", "the movie was", "--model", c["llama"], "--new-tokens", "2"]
            + ["--ig-params", '{"max_steps": 16}']
        ),
    },
    "heads": {"bert": lambda c: ["heads", "--data", c["data"], "--model", c["bert"], "--limit", "3"]},
    "prune": {
        "bert": lambda c: (
            ["prune", "--data", c["data"], "--order", "attention,random", "--seeds", "1"]
            + ["--step", "6", "--model", c["bert"]]
        ),
    },
    "patch": {
        "gpt2": lambda c: (
            ["patch", "--model", c["gpt2"], "--clean", "when mary and john went"]
            + ["--corrupt", "when john and mary went", "--sites", "heads", "--paths", "--approx"]
        ),
    },
    "mediate": {"gpt2": lambda c: ["mediate", "--model", c["gpt2"], "--prompts", "2"]},
    "lens": {
        "head": lambda c: (
            ["lens", TEXT, "--model", c["llama"], "--head", "1.0", "--types-length", "4"] + ["--types-seqs", "1"]
        ),
        "check": lambda c: (
            ["lens", TEXT, "--model", c["llama"], "--check", "--types-length", "4"] + ["--types-seqs", "1"]
        ),
    },
    "lens-fit": {
        "tuned": lambda c: (
            ["lens-fit", "--model", c["llama"], "--lens", "tuned", "--data", c["data"]]
            + ["--seq-len", "4", "--heldout", "1", "--steps", "2"]
        ),
    },
    "evaluate": {
        "classifier": lambda c: (
            ["evaluate", "--model", c["bert"], "--data", c["data"], "--limit", "2"]
            + [
                "--methods",
                "attention,integrated_gradients,occlusion",
                "--method-params",
                "integrated_gradients.steps=4",
            ]
            + ["--adv-steps", "2", "--permutations", "2", "--soft-samples", "2", "--ffidelity-train", c["data"]]
            + ["--ffidelity-epochs", "1", "--ffidelity-samples", "1", "--randomisation", "both", "--smooth-mprt", "2"]
            + ["--efficient-mprt"]
        ),
        "lm": lambda c: (
            ["evaluate", "--model", c["gpt2"], "--data", c["data"], "--limit", "2"]
            + ["--methods", "attention,occlusion", "--adv-steps", "2", "--permutations", "2", "--answer-tokens", "2"]
        ),
    },
    "replicate": {
        "llama": lambda c: (
            ["replicate", "--model", c["llama"], "--data", "movies", "--limit", "2"]
            + ["--permutations", "1", "--adv-steps", "1", "--adv-layers", "1", "--head-examples", "1"]
        ),
    },
    "benchmark": {
        "keyword": lambda c: (
            ["benchmark", "--tasks", "keyword", "--methods", "attention,occlusion"] + ["--n-examples", "2"]
        ),
    },
    "probe": {
        "gt": lambda c: (
            ["probe", "--model", "gt-negation-normal", "--task", "category", "--n-examples", "40"]
            + ["--layers", "embed,0", "--probes", "linear", "--no-mdl", "--sweep", "none"]
        ),
    },
    "cot": {
        "local": lambda c: (
            ["cot", "--model", c["lm"], "--data", c["questions"], "--tests", "hint,early_answer"]
            + ["--hint-kinds", "sycophancy", "--max-new-tokens", "4", "--points", "2"]
        ),
    },
    "circuit": {
        "patching": lambda c: (
            ["circuit", "--model", c["llama"], "--task", c["pairs"]]
            + ["--methods", "eap,eap-ig,exact", "--sizes", "0.1,1", "--bootstrap", "5", "--steps", "2"]
            + ["--paths", "2", "--random", "2"]
        ),
        "mean": lambda c: (
            ["circuit", "--model", c["llama"], "--task", c["pairs"], "--ablation", "mean"]
            + ["--methods", "eap-ig-activations,flow-routes,eap-qk,graddrop", "--sizes", "0.1,1", "--bootstrap", "5"]
            + ["--steps", "2", "--resample", "prompts,corrupt", "--resamples", "2"]
        ),
    },
    "atlas": {
        "llama": lambda c: (
            ["atlas", "--model", c["llama"], "--data", c["data"], "--limit", "3", "--top-k", "1"]
            + ["--exact-share", "0.5", "--exact-top", "1", "--compare-task", c["pairs"], "--compare-prompts", "2"]
        ),
    },
    "experts": {
        "mixtral": lambda c: (
            ["experts", "--model", c["mixtral"], "--data", c["data"], "--limit", "2"]
            + ["--max-tokens", "4", "--bootstrap", "10"]
        ),
    },
    "cite": {
        "llama": lambda c: (
            ["cite", "--model", c["llama"], "--context", c["sources"], "--question", "what is good"]
            + ["--answer", "the movie", "--ablations", "4", "--held-out", "2", "--attntrace-samples", "2"]
            + ["--ig-steps", "2"]
        ),
    },
    "cite-bench": {
        "llama": lambda c: (
            ["cite-bench", "--model", c["llama"], "--data", c["bench"], "--chunk-size", "1"]
            + ["--methods", "attention,attntrace,integrated_gradients,contextcite,leave_one_out"]
            + ["--max-answer-tokens", "2", "--ablations", "4", "--held-out", "2", "--ig-steps", "2"]
        ),
    },
    "features-fit": {
        "transcoder": lambda c: (
            ["features-fit", "--model", c["llama"], "--kind", "transcoder", "--data", c["data"], "--width", "8"]
            + ["--tokens", "20", "--seq-len", "4", "--heldout", "1", "--batch-seqs", "2"]
        ),
        "sae": lambda c: (
            ["features-fit", "--model", c["llama"], "--kind", "sae", "--data", c["data"], "--width", "8"]
            + ["--tokens", "20", "--seq-len", "4", "--heldout", "1", "--batch-seqs", "2", "--layers", "1"]
        ),
    },
    "features-audit": {
        "llama": lambda c: (
            ["features-audit", "--model", c["llama"], "--features", c["dictionary"], "--task", c["pairs"]]
            + ["--top", "3", "--edits", "patch,zero,mean,steer", "--error", "both"]
        ),
    },
    "graph": {
        "llama": lambda c: (["graph", TEXT, "--model", c["llama"], "--features", c["transcoders"], "--top", "2"]),
    },
    "features": {
        "llama": lambda c: (
            ["features", TEXT, "--model", c["llama"], "--features", c["transcoders"], "--data", c["data"]]
            + ["--sequences", "6", "--top", "2", "--contexts", "2", "--batch-size", "4"]
        ),
    },
}
# commands that place no model, with the reason (a command that takes --device cannot be listed here)
NO_MODEL = {
    "models": "lists the embedded models",
    "methods": "lists the registered methods",
    "report": "writes report.html from a finished run folder",
    "attention-row": "reads the queries and keys an explain --rows run stored, on the CPU",
}
# commands whose device case is a test of its own (it writes no run folder)
OWN_TEST = {"serve": "test_serve_on_device"}
# bfloat16 refused in one line, by design
REFUSES_BFLOAT16 = {"lens-fit": "a lens is fitted in float32 or float64"}
# found by the virtual device, not fixed yet: strict, so the fix turns these into failures to remove from here
KNOWN: dict[str, str] = {}


def test_every_command_has_a_device_case() -> None:
    """The registry decides: each command has a device case below, or places no model and says why (runs
    without a GPU too, so a command added later fails here in CI until it has its case)."""
    from streetlamp.commands import COMMANDS

    for c in COMMANDS:
        if c.name in NO_MODEL:
            assert "device" not in c.shared.options(), f"{c.name} takes --device: give it a device case in CASES"
        elif c.name in OWN_TEST:
            assert OWN_TEST[c.name] in globals(), f"{OWN_TEST[c.name]} (the device case of {c.name}) is missing"
        else:
            assert c.name in CASES, (
                f"add a device case for `{c.name}` to CASES in tests/models/test_device.py (its arguments for a "
                "short run on a tiny model), or list it in NO_MODEL with the reason it places no model"
            )
    known = set(CASES) | set(NO_MODEL) | set(OWN_TEST)
    assert not known - {c.name for c in COMMANDS}, "cases for commands that do not exist"


def float_arrays(out: Path) -> dict[str, str]:
    """The dtype of every floating result the run wrote (``arrays*.safetensors``; the long-context q/k store,
    kept patterns and F-Fidelity's fine-tuned copy keep the model's dtype by design; Parquet columns)."""
    import pandas as pd
    from safetensors import safe_open

    got: dict[str, str] = {}
    for f in out.rglob("arrays*.safetensors"):  # the results (not q/k, kept patterns or a fine-tuned copy)
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open is not a mapping
                got[f"{f.name}:{k}"] = h.get_slice(k).get_dtype().lower()
    for f in out.rglob("*.parquet"):
        for k, t in pd.read_parquet(f).dtypes.items():
            got[f"{f.name}:{k}"] = str(t).lower()
    return {k: v for k, v in got.items() if v.startswith(("f", "bf"))}


def _cases() -> list:
    from streetlamp.commands import COMMANDS

    out = []
    for c in COMMANDS:
        if c.name in NO_MODEL or c.name in OWN_TEST:
            continue
        for case in CASES.get(c.name, {"missing": None}):
            mark = [pytest.mark.xfail(VIRTUAL, reason=KNOWN[c.name], strict=True)] if c.name in KNOWN else []
            out.append(pytest.param(c.name, case, marks=mark, id=f"{c.name}-{case}"))
    return out


@on_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("command", "case"), _cases())
def test_command_on_device(
    command: str, case: str, dtype: str, ck: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, mode
) -> None:
    """The command runs on the device (on the CPU: the virtual device, so a tensor made without the model's
    device fails here as on a GPU) and writes no bfloat16 array."""
    from streetlamp.cli import main

    assert command in CASES, f"add a device case for `{command}` to CASES in tests/models/test_device.py"
    out = tmp_path / "run"
    args = [str(a) for a in CASES[command][case](ck)] + ["--out", str(out), "--device", PLACE, "--dtype", dtype]
    rc = main(args)
    err = capsys.readouterr().err
    if dtype == "bfloat16" and command in REFUSES_BFLOAT16:
        assert rc == 2 and REFUSES_BFLOAT16[command] in err and "Traceback" not in err
        return
    assert rc == 0, err
    if mode is not None:
        assert mode.device_calls > 0, "the model never ran on the virtual device"
    arrays = float_arrays(out)
    # float16 is a compact store by design (the atlas's pattern panels); bfloat16 never leaks into a result
    odd = {k: v for k, v in arrays.items() if v not in ("f16", "f32", "f64", "float16", "float32", "float64")}
    assert not odd, f"{command} --dtype {dtype}: arrays not float16/32/64: {odd}"


@on_gpu
def test_circuit_scores_on_device_equal_cpu(ck: dict[str, Path], tmp_path: Path) -> None:
    """float32 edge scores (EAP, EAP-IG, exact patching) on the device equal the CPU's: relative to the largest
    score, within float32 rounding through the model's layers (f32_tol; measured on an H200 on SmolLM2's shape:
    3.5e-6 over 70,651 edges)."""
    from safetensors.numpy import load_file

    from streetlamp.cli import main

    base = [str(a) for a in CASES["circuit"]["patching"](ck)]
    got = {}
    for where in ("cpu", PLACE):
        out = tmp_path / where.replace(":", "")
        assert main([*base, "--out", str(out), "--device", where, "--overwrite"]) == 0
        got[where] = load_file(out / "arrays.safetensors")
    keys = [k for k in got["cpu"] if k.startswith("scores.")]
    assert len(keys) == 3
    for k in keys:
        a, b = got["cpu"][k].astype(np.float64), got[PLACE][k].astype(np.float64)
        rel = np.nanmax(np.abs(a - b)) / np.nanmax(np.abs(a))
        print(f"circuit {k}: max |{PLACE} - cpu| / max |cpu| = {rel:.2e} over {np.isfinite(a).sum()} edges")
        assert np.array_equal(np.isnan(a), np.isnan(b)) and rel <= f32_tol(2), k


@on_gpu
def test_long_context_rollout_runs_on_the_model_device(ck: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    """``explain --rows``: rollout recomputes every layer's rows from the stored queries and keys on the model's
    device (issue 35 item 9: on an H200 the row took 2.7 s to record and the rollout 25 s on the CPU)."""
    from streetlamp.cli import main
    from streetlamp.methods import long_rows

    seen: list[torch.device] = []
    real = long_rows.pattern_block

    def spy(q: torch.Tensor, *args, **kwargs):
        seen.append(q.device)
        return real(q, *args, **kwargs)

    monkeypatch.setattr(long_rows, "pattern_block", spy)
    args = ["explain", TEXT, "--model", str(ck["llama"]), "--rows", "last", "--methods", "rollout"]
    assert main([*args, "--device", PLACE, "--out", str(tmp_path / "o")]) == 0
    assert seen and all(on_place(d) for d in seen), seen


@on_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_serve_on_device(dtype: str, ck: dict[str, Path], monkeypatch, mode) -> None:
    """``serve --device --dtype``: the models the CLI places answer every live request (explain, edit, ablate,
    pair) on the device, in this thread (the server itself is replaced: the mode is per thread)."""
    pytest.importorskip("starlette")
    import streetlamp.commands.serve as serve_pkg
    from streetlamp.cli import main
    from streetlamp.commands.serve import compute as C

    done: list[str] = []

    def answer(adapters: dict, *args, **kwargs) -> None:
        for name, a in adapters.items():
            assert on_place(a.device) and str(next(a.hf_model.parameters()).dtype) == f"torch.{dtype}"
            methods = ["attention", "occlusion"]
            C.explain_text(a, TEXT, methods=methods)
            C.edit_tokens(a, TEXT, [{"position": 2, "op": "remove"}], methods=methods)
            C.ablate_heads(a, TEXT, [[0, 0], [1, 1]], "mean")
            C.minimal_pair(a, TEXT, "when john and mary went to the store", methods=methods)
            done.append(name)

    monkeypatch.setattr(serve_pkg, "serve", answer)
    models = ["--model", str(ck["bert"]), "--model", str(ck["gpt2"])]
    assert main(["serve", *models, "--device", PLACE, "--dtype", dtype]) == 0
    assert len(done) == 2
    if mode is not None:
        assert mode.device_calls > 0, "the models never ran on the virtual device"
