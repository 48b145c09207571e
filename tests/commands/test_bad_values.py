"""Hostile and careless values for explain, explain-generation, heads, prune, patch, mediate, lens and
lens-fit (issue 35 item 3): the CLI and the Python API refuse each with the same one-line message, exit 2,
and leave no folder. (evaluate, circuit, atlas ... have theirs in test_bad_values_b.py.)

The settings-level cases name a model that does not exist: a value refused by its declared constraint or
by ``check()`` must be refused before any model is loaded (otherwise the message would be about the
model, and the test fails); the model-level cases (``validate``) load a tiny checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import streetlamp
from streetlamp.api import function_of
from streetlamp.cli import main
from streetlamp.commands import COMMANDS

NO_MODEL = "no-such-model-folder"  # never loaded: the refusal comes first

# (command, CLI arguments after the command, the same as API keywords, the message)
CASES: list[tuple[str, list[str], dict[str, Any], str]] = [
    # lens --types-length -1 gave a traceback after 20 s of work
    ("lens", ["a b", "--types-length", "-1"], {"text": "a b", "types_length": -1}, "--types-length must be at least 2 (got -1)"),
    ("lens", ["a b", "--types-seqs", "0"], {"text": "a b", "types_seqs": 0}, "--types-seqs must be at least 1 (got 0)"),
    ("lens", ["a b", "--types-length", "abc"], {"text": "a b", "types_length": "abc"}, "--types-length must be an integer (got 'abc')"),
    ("lens", ["a b", "--head", "0.0", "--query", "-1"], {"text": "a b", "head": "0.0", "query": -1}, "--query must be at least 0 (got -1)"),
    ("lens", ["a b", "--alpha", "nan", "--swap", "a,b"], {"text": "a b", "alpha": "nan", "swap": "a,b"}, "--alpha must be a finite number (got nan)"),
    # an empty --target / --neutral fell back to the default silently
    ("lens", ["a b", "--target", ""], {"text": "a b", "target": ""}, "--target is empty: give a token (or leave --target out for the default)"),
    ("lens", ["a b", "--target", "  "], {"text": "a b", "target": "  "}, "--target is empty: give a token (or leave --target out for the default)"),
    ("lens", ["a b", "--check", "--neutral", ""], {"text": "a b", "intervention_check": True, "neutral": ""}, "--neutral is empty: give a token (or leave --neutral out for the default)"),
    # --method-params: abc, nan and 2.5 gave tracebacks (2.5 mid-run, leaving the folder); true was read as 1
    *[
        (
            "explain",
            ["the movie", "--method-params", f"integrated_gradients.steps={v}"],
            {"text": "the movie", "method_params": f"integrated_gradients.steps={v}"},
            f"--method-params integrated_gradients.steps must be an integer (got {shown})",
        )
        for v, shown in (("abc", "'abc'"), ("nan", "'nan'"), ("2.5", "2.5"), ("true", "True"))
    ],
    (
        "explain",
        ["the movie", "--method-params", "integrated_gradients.tolerance=nan"],
        {"text": "the movie", "method_params": {"integrated_gradients": {"tolerance": float("nan")}}},
        "--method-params integrated_gradients.tolerance must be a finite number (got nan)",
    ),
    (
        "explain",
        ["the movie", "--methods", "rollout", "--method-params", "rollout.fusion=median"],
        {"text": "the movie", "methods": ["rollout"], "method_params": {"rollout": {"fusion": "median"}}},
        "--method-params rollout.fusion must be one of mean, max, min (got 'median')",
    ),
    (
        "explain-generation",
        ["the movie", "--ig-params", "steps=2.5"],
        {"prompt": "the movie", "ig_params": {"steps": 2.5}},
        "--ig-params steps must be an integer (got 2.5)",
    ),
    (
        "explain-generation",
        ["the movie", "--method-params", "integrated_gradients.adaptive=1"],
        {"prompt": "the movie", "method_params": "integrated_gradients.adaptive=1"},
        "--method-params integrated_gradients.adaptive must be true or false (got 1)",
    ),
    ("explain", ["the movie", "--occlusion-window", "0", "--rows", "last"], {"text": "the movie", "occlusion_window": 0, "rows": "last"}, "--occlusion-window must be at least 1 (got 0)"),
    ("explain-generation", ["the movie", "--new-tokens", "0"], {"prompt": "the movie", "new_tokens": 0}, "--new-tokens must be at least 1 (got 0)"),
    ("explain-generation", ["the movie", "--new-tokens", "65"], {"prompt": "the movie", "new_tokens": 65}, "--new-tokens must be at most 64 (got 65)"),
    ("explain-generation", ["the movie", "--new-tokens", "2.5"], {"prompt": "the movie", "new_tokens": "2.5"}, "--new-tokens must be an integer (got '2.5')"),
    ("heads", ["the movie", "--limit", "0"], {"text": "the movie", "limit": 0}, "--limit must be at least 1 (got 0)"),
    ("prune", ["--data", "movies", "--limit", "3"], {"data": "movies", "limit": 3}, "--limit must be at least 4 (got 3)"),
    ("prune", ["--data", "movies", "--step", "0"], {"data": "movies", "step": 0}, "--step must be at least 1 (got 0)"),
    ("mediate", ["--prompts", "0"], {"prompts": 0}, "--prompts must be at least 1 (got 0)"),
    ("lens-fit", ["--lens", "tuned", "--data", "movies", "--lr", "nan"], {"lens": "tuned", "data": "movies", "lr": float("nan")}, "--lr must be a finite number (got nan)"),
    ("lens-fit", ["--lens", "tuned", "--data", "movies", "--lr", "-1"], {"lens": "tuned", "data": "movies", "lr": -1}, "--lr must be greater than 0 (got -1"),
    ("lens-fit", ["--lens", "tuned", "--data", "movies", "--seq-len", "1"], {"lens": "tuned", "data": "movies", "seq_len": 1}, "--seq-len must be at least 2 (got 1)"),
]  # fmt: skip

# values only the API can pass (the CLI reads strings): each refused in one line, before any work
API_ONLY: list[tuple[str, dict[str, Any], str]] = [
    ("explain", {"text": None}, "TEXT must be given (got None)"),
    ("explain", {"text": 42}, "TEXT must be a string (got 42)"),
    ("lens", {"text": "a b", "head": (3, 1)}, "--head must be a string (got (3, 1))"),
    ("lens", {"text": "a b", "types_length": True}, "--types-length must be an integer (got True)"),
    ("explain-generation", {"prompt": "the movie", "new_tokens": "8x"}, "--new-tokens must be an integer (got '8x')"),
    ("heads", {"text": "the movie", "limit": 2.5}, "--limit must be an integer (got 2.5)"),
]


def api(name: str) -> Any:
    return function_of(next(c for c in COMMANDS if c.name == name))


def cli_message(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("streetlamp: error: "), err
    return err[0].removeprefix("streetlamp: error: ")


@pytest.mark.parametrize("command, argv, keywords, message", CASES, ids=[f"{c[0]} {' '.join(c[1][1:])}" for c in CASES])
def test_cli_and_api_refuse_alike(
    command: str,
    argv: list[str],
    keywords: dict[str, Any],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    out = tmp_path / "run"
    got = cli_message([command, *argv, "--model", NO_MODEL, "--out", str(out)], capsys)
    assert got.startswith(message), got
    with pytest.raises(streetlamp.StreetlampError) as e:
        api(command)(**keywords, model=NO_MODEL, out=out)
    assert str(e.value) == got  # the same one line from the API
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, keywords, message", API_ONLY, ids=[f"{c[0]} {c[1]}" for c in API_ONLY])
def test_api_wrong_types_are_one_line(command: str, keywords: dict[str, Any], message: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(streetlamp.StreetlampError, match="^" + re.escape(message)):
        api(command)(**keywords, model=NO_MODEL, out=out)
    assert not out.exists()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from streetlamp.models.tiny import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("m") / "llama", seed=1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--types-length", "100000"],
            "--types-length 100000: each head-type sequence is repeated (2 x 100000 tokens)",
        ),
        (["--head", "0.99"], "--head 0.99 out of range: layers 0..1, heads 0..3"),
        (["--head", "0.0", "--query", "99"], "--query 99 out of range: the text has positions 0.."),
    ],
)
def test_lens_values_the_model_refuses(
    llama: Path, argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Checked against the model in ``validate``, after loading it and before any work or folder."""
    out = tmp_path / "run"
    got = cli_message(["lens", "when mary and john went", "--model", str(llama), "--out", str(out), *argv], capsys)
    assert got.startswith(message), got
    values = dict(zip((a.lstrip("-").replace("-", "_") for a in argv[::2]), argv[1::2]))
    with pytest.raises(streetlamp.StreetlampError) as e:
        api("lens")("when mary and john went", model=str(llama), out=out, **values)
    assert str(e.value) == got and not out.exists()
