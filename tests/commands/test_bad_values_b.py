"""Issue 35 item 3 for ``circuit``, ``atlas``, ``evaluate``, ``cot``, ``probe`` and ``replicate``: a value
out of range, of the wrong type or too large for this machine is refused by the CLI and the Python API
with the same one line (exit 2 on the CLI), before anything is written; a value the CLI accepts as a
string is accepted by the API as that string (wholea's ``test_bad_values.py`` covers the other commands)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import streetlamp
from streetlamp import api
from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import WORDS, save_tiny

PAIRS = """clean,corrupt,answer,wrong
when mary and john went to the store john gave a drink to,when mary and john went to the store mary gave a drink to, mary, john
the movie was good and the acting,the film was bad and the acting, good, bad
"""
GIB = 1 << 30


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("bad_values_b")
    (t / "pairs.csv").write_text(PAIRS)
    rng = np.random.default_rng(0)
    (t / "d.txt").write_text("\n".join(" ".join(rng.choice(WORDS, 5)) for _ in range(4)) + "\n")
    return {"dir": t, "llama": save_tiny("llama", t / "llama", seed=1)}


def api_of(command: str) -> Any:
    """``streetlamp.<command>``, from the registry (``streetlamp.cot`` is also the name of a subpackage: once
    ``streetlamp.cot.prompts`` is imported the package attribute is that module, not the API function)."""
    return api.function_of(api.names()[command.replace("-", "_")])


def refused(capsys: pytest.CaptureFixture, tmp_path: Path, command: str, argv: list[str], api: dict[str, Any]) -> str:
    """The CLI's line (exit 2) and the API's StreetlampError for the same value: equal, one line, no folder.
    Returns the message."""
    out = tmp_path / "cli"
    assert main([command, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streetlamp: error: ") and "\n" not in err, err
    assert not out.exists()
    out = tmp_path / "api"
    with pytest.raises(StreetlampError) as e:
        api_of(command)(**api, out=str(out))
    assert str(e.value) == err.removeprefix("streetlamp: error: ") and not out.exists()
    return str(e.value)


def api_refused(tmp_path: Path, command: str, api: dict[str, Any]) -> str:
    """A value only the API can give (not a string): one line, no raw TypeError, no folder."""
    out = tmp_path / "api"
    with pytest.raises(StreetlampError) as e:
        api_of(command)(**api, out=str(out))
    assert "\n" not in str(e.value) and not out.exists()
    return str(e.value)


# -- circuit ---------------------------------------------------------------------------------------------
def circuit_args(setup: dict[str, Path]) -> tuple[list[str], dict[str, Any]]:
    argv = ["--model", str(setup["llama"]), "--task", str(setup["dir"] / "pairs.csv")]
    return argv, {"model": str(setup["llama"]), "task": str(setup["dir"] / "pairs.csv")}


@pytest.mark.parametrize(
    "flag, field, extra",
    [("--bootstrap", "bootstrap", {}), ("--resamples", "resamples", {"resample": "prompts"})],
)
def test_circuit_resampling_that_cannot_fit_is_refused_with_its_estimate(
    setup: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    field: str,
    extra: dict[str, str],
) -> None:
    """``--bootstrap``/``--resamples 1000000000`` (which allocated 15 GiB and more before) are refused after
    the model loads and before any work, the line saying the estimate and the memory available."""
    from streetlamp.commands.circuit import CircuitSettings
    from streetlamp.commands.circuit.run import memory_needed
    from streetlamp.interventions.circuits.graph import Graph
    from streetlamp.models import memory

    argv, api = circuit_args(setup)
    more = [x for k, v in extra.items() for x in (f"--{k}", v)]
    # this machine's MemAvailable: a terabyte-sized estimate never fits
    assert main(["circuit", *argv, *more, flag, "1000000000", "--out", str(tmp_path / "o")]) == 2
    assert "GiB available" in capsys.readouterr().err and not (tmp_path / "o").exists()
    monkeypatch.setattr(memory, "available_bytes", lambda device: 8 * GIB)  # the same line from CLI and API
    msg = refused(capsys, tmp_path, "circuit", [*argv, *more, flag, "1000000000"], {**api, **extra, field: 10**9})
    s = CircuitSettings(task=api["task"], **{**extra, field: 10**9})  # type: ignore[arg-type]
    if field == "resamples":
        s.resample = ["prompts"]
    need = memory_needed(Graph(2, 4, 2), s, 2)  # the tiny Llama: 2 layers, 4 heads, 2 key/value groups
    assert f"need about {sum(need.values()) / GIB:.3g} GiB" in msg and "more than the 8.00 GiB available" in msg
    assert f"{flag} 1000000000" in msg and sum(need.values()) > 8 * GIB
    # the default settings fit easily
    assert sum(memory_needed(Graph(2, 4, 2), CircuitSettings(task=api["task"]), 2).values()) < 2**24


def test_circuit_bootstrap_estimate_bounds_what_edge_intervals_allocates() -> None:
    """The bootstrap term of the estimate against the peak that ``tracemalloc`` measures while
    :func:`edge_intervals` runs on a graph of 6 layers x 9 heads in 3 key/value groups (SmolLM2's heads):
    at least the peak, and not more than twice it (an estimate that refuses what would fit is as wrong as
    one that lets through what cannot)."""
    from streetlamp.commands.circuit import CircuitSettings
    from streetlamp.commands.circuit.run import edge_intervals, memory_needed
    from streetlamp.interventions.circuits.graph import Graph

    g = Graph(6, 9, 3)
    n = 4
    per = torch.randn(n, g.n_readers, g.n_writers, dtype=torch.float32)
    for boot in (50, 2000):
        s = CircuitSettings(bootstrap=boot)
        tracemalloc.start()
        edge_intervals(g, per, boot, 0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        base = 2 * 8 * n * g.n_readers * g.n_writers  # the per-prompt scores as float64 and their edge gather
        est = memory_needed(g, s, n)["bootstrap"]
        assert peak - base <= est <= 2 * peak, (boot, peak, est)


def test_circuit_random_is_bounded(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--random 1000000000`` ran unbounded (a pass over the prompts per random circuit and size)."""
    argv, api = circuit_args(setup)
    msg = refused(capsys, tmp_path, "circuit", [*argv, "--random", "1000000000"], {**api, "random": 10**9})
    assert msg == "--random must be at most 1000 (got 1000000000)"


@pytest.mark.parametrize(
    "argv, api, message",
    [
        (["--bootstrap", "ten"], {"bootstrap": "ten"}, "--bootstrap must be an integer (got 'ten')"),
        (["--bootstrap", "0"], {"bootstrap": 0}, "--bootstrap must be at least 1 (got 0)"),
        (["--steps", "0"], {"steps": 0}, "--steps must be at least 1 (got 0)"),
        (["--resamples", "1"], {"resamples": 1}, "--resamples must be at least 2 (got 1)"),
        (["--path-threshold", "nan"], {"path_threshold": float("nan")}, "--path-threshold must be a finite number"),
        (["--size", "inf"], {"size": float("inf")}, "--size must be a finite number (got inf)"),
        (["--workers", "0"], {"workers": 0}, "--workers must be at least 1 (got 0)"),
    ],
)
def test_circuit_bad_values(
    setup: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    argv: list[str],
    api: dict[str, Any],
    message: str,
) -> None:
    a, kw = circuit_args(setup)
    assert refused(capsys, tmp_path, "circuit", [*a, *argv], {**kw, **api}).startswith(message)


@pytest.mark.parametrize(
    "api, message",
    [
        ({"task": 123}, "--task must be a string (got 123)"),
        ({"limit": 2.5}, "--limit must be an integer (got 2.5)"),
        ({"model": 42}, "--model must be a string (got 42)"),
        ({"bootstrap": True}, "--bootstrap must be an integer (got True)"),
    ],
)
def test_circuit_api_wrong_types(tmp_path: Path, api: dict[str, Any], message: str) -> None:
    """Python values the CLI cannot give: one line, not a raw TypeError/AttributeError."""
    assert api_refused(tmp_path, "circuit", api) == message


def test_circuit_limit_cli_string(setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--limit 2.5`` on the CLI: the same refusal as the API's ``limit=2.5``, naming the string typed."""
    a, _ = circuit_args(setup)
    assert main(["circuit", *a, "--limit", "2.5", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == "streetlamp: error: --limit must be an integer (got '2.5')"


# -- atlas -----------------------------------------------------------------------------------------------
def atlas_args(setup: dict[str, Path]) -> tuple[list[str], dict[str, Any]]:
    d = str(setup["dir"] / "d.txt")
    return ["--model", str(setup["llama"]), "--data", d], {"model": str(setup["llama"]), "data": d}


@pytest.mark.parametrize(
    "argv, api, message",
    [
        (["--floor", "inf"], {"floor": float("inf")}, "--floor must be a finite number (got inf)"),
        (["--floor", "nan"], {"floor": float("nan")}, "--floor must be a finite number (got nan)"),
        (["--floor", "0"], {"floor": 0}, "--floor must be greater than 0 (got 0)"),
        (["--striking", "1.5"], {"striking": 1.5}, "--striking must be at most 1 (got 1.5)"),
        (["--exact-share", "2"], {"exact_share": 2}, "--exact-share must be at most 1 (got 2)"),
        (["--chunk-size", "0"], {"chunk_size": 0}, "--chunk-size must be at least 1 (got 0)"),
        (["--max-tokens", "1"], {"max_tokens": 1}, "--max-tokens must be at least 2 (got 1)"),
        (["--dtype", "int8"], {"dtype": "int8"}, "--dtype must be one of float32, bfloat16, float16 (got 'int8')"),
    ],
)
def test_atlas_bad_values(
    setup: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    argv: list[str],
    api: dict[str, Any],
    message: str,
) -> None:
    a, kw = atlas_args(setup)
    assert refused(capsys, tmp_path, "atlas", [*a, *argv], {**kw, **api}) == message


def test_atlas_api_wrong_types(tmp_path: Path) -> None:
    assert api_refused(tmp_path, "atlas", {"data": None}) == "--data must be given (got None)"
    assert api_refused(tmp_path, "atlas", {"data": ["movies"]}) == "--data must be a string (got ['movies'])"


# -- evaluate --------------------------------------------------------------------------------------------
def test_evaluate_api_method_params_list(tmp_path: Path) -> None:
    msg = api_refused(tmp_path, "evaluate", {"data": "movies", "method_params": [1, 2]})
    assert msg == "--method-params must be a JSON object (got [1, 2])"


def test_evaluate_api_takes_the_strings_the_cli_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evaluate(soft_pi='0.5')`` (refused with a wrong message before) builds the very settings
    ``--soft-pi 0.5`` builds; so do the other numbers given as the CLI's strings."""
    import streetlamp.commands.evaluate.run as R
    from streetlamp.commands.base import Lines

    got: list[Any] = []

    def record(adapter: Any, s: Any, out: Any, opts: Any) -> Lines:
        got.append(s)
        return Lines(["recorded"])

    monkeypatch.setattr(R, "evaluate", record)  # the command's run, looked up when it runs
    strings = {"soft_pi": "0.5", "eps": "0.02", "permutations": "3", "limit": "4", "soft": "false"}
    argv = ["--soft-pi", "0.5", "--eps", "0.02", "--permutations", "3", "--limit", "4", "--no-soft"]
    assert main(["evaluate", "--data", "movies", *argv, "--out", str(tmp_path / "cli")]) == 0
    streetlamp.evaluate(data="movies", **strings, out=str(tmp_path / "api"))
    cli, api = got
    assert cli == api and (api.soft_pi, api.eps, api.permutations, api.limit, api.soft) == (0.5, 0.02, 3, 4, False)
    assert not (tmp_path / "cli").exists() and not (tmp_path / "api").exists()


@pytest.mark.parametrize(
    "argv, api, message",
    [
        (["--soft-pi", "0"], {"soft_pi": 0}, "--soft-pi must be greater than 0 (got 0)"),
        (["--soft-pi", "1.5"], {"soft_pi": "1.5"}, "--soft-pi must be at most 1 (got 1.5)"),
        (["--answer-tokens", "65"], {"answer_tokens": 65}, "--answer-tokens must be at most 64 (got 65)"),
        (["--limit", "0"], {"limit": 0}, "--limit must be at least 1 (got 0)"),
        (["--ffidelity-lr", "-1"], {"ffidelity_lr": -1}, "--ffidelity-lr must be greater than 0 (got -1)"),
        (["--efficient-mprt-bins", "1"], {"efficient_mprt_bins": 1}, "--efficient-mprt-bins must be at least 2"),
        (["--randomisation-target", "x"], {"randomisation_target": "x"}, "--randomisation-target must be one of"),
    ],
)
def test_evaluate_bad_values(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], api: dict[str, Any], message: str
) -> None:
    got = refused(capsys, tmp_path, "evaluate", ["--data", "movies", *argv], {"data": "movies", **api})
    assert got.startswith(message)


def test_evaluate_stored_settings_keep_the_layout_of_older_stores() -> None:
    """The record a store keeps is the settings' own fields in the layout stores made before the command
    packages have (the adversarial search nested under ``counterfactual``, options added later left out at
    their old behaviour), so such a store resumes; the command's own fields (data, limit, engine) are not in
    it (the run records ``limit``/``chunk_size`` beside it, as before)."""
    from streetlamp.commands.evaluate import EvaluateSettings

    old = {  # the settings of `evaluate --data movies` as a store made by streetlamp before this change holds them
        "methods": ["attention"],
        "method_params": {},
        "seed": 0,
        "batch_size": None,
        "replacement": "delete",
        "flip_layers": "last",
        "cf_layers": "last",
        "counterfactual": {"eps": 0.01, "n_permutations": 10, "steps": 40, "lr": 0.2, "lam": 50.0, "js_threshold": 0.5},
        "truncate": False,
        "soft": True,
        "soft_samples": 10,
        "soft_pi": 0.5,
    }
    assert EvaluateSettings.from_values(data="movies").to_dict() == old
    s = EvaluateSettings.from_values(
        data="movies", ffidelity_train="tweets", answer_tokens="2", adv_steps="3", smooth_mprt="2", randomisation="both"
    ).to_dict()
    assert s["ffidelity"] == {
        "train": "tweets",
        "beta": 0.5,
        "epochs": 2,
        "lr": 3e-5,
        "batch": 16,
        "samples": 4,
        "max_train": 1000,
    }
    assert s["answer_tokens"] == 2 and s["counterfactual"]["steps"] == 3 and s["smooth_mprt_stages"] == "all"


# -- cot, probe, replicate -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command, argv, api, message",
    [
        ("cot", ["--data", "bbh:x", "--limit", "0"], {"data": "bbh:x", "limit": 0}, "--limit must be at least 1"),
        (
            "cot",
            ["--data", "bbh:x", "--max-new-tokens", "5000"],
            {"data": "bbh:x", "max_new_tokens": 5000},
            "--max-new-tokens must be at most 4096 (got 5000)",
        ),
        ("cot", ["--data", "bbh:x", "--points", "0"], {"data": "bbh:x", "points": 0}, "--points must be at least 1"),
        (
            "cot",
            ["--data", "bbh:x", "--temperature", "-1"],
            {"data": "bbh:x", "temperature": -1},
            "--temperature must be at least 0 (got -1)",
        ),
        (
            "cot",
            ["--data", "bbh:x", "--endpoint", "http://127.0.0.1:9/v1", "--engine", "ray"],
            {"data": "bbh:x", "endpoint": "http://127.0.0.1:9/v1", "engine": "ray"},
            "--engine ray fans a local --model out over Ray actors",
        ),
        ("probe", ["--task", "pos", "--limit", "0"], {"task": "pos", "limit": 0}, "--limit must be at least 1 (got 0)"),
        ("probe", ["--task", "pos", "--hidden", "0"], {"task": "pos", "hidden": 0}, "--hidden must be at least 1"),
        ("probe", ["--task", "pos", "--pool", "max"], {"task": "pos", "pool": "max"}, "--pool must be one of"),
        ("replicate", ["--limit", "0"], {"limit": 0}, "--limit must be at least 1 (got 0)"),
        ("replicate", ["--head-examples", "-2"], {"head_examples": -2}, "--head-examples must be at least -1"),
        ("replicate", ["--zero-rows", "first"], {"zero_rows": "first"}, "--zero-rows must be one of all, explained"),
    ],
)
def test_resumable_commands_bad_values(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, argv: list[str], api: dict[str, Any], message: str
) -> None:
    """Refused by the declared constraint before any model or data is read (the runners re-check nothing)."""
    assert refused(capsys, tmp_path, command, argv, api).startswith(message)
