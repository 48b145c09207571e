"""The memory estimate before a run: its terms against independent sizes, refusal unless --force."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streetlamp.cli import main
from streetlamp.models import memory
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import save_tiny, tiny_model


def test_terms_match_independent_sizes(tmp_path: Path) -> None:
    model, tok = tiny_model("llama", seed=0)
    adapter = ModelAdapter(model, tok, "t")
    # weights: the safetensors file holds every parameter once (untied), plus a JSON header
    path = save_tiny("llama", tmp_path / "m")
    est = memory.estimate(adapter, 5)
    size = (path / "model.safetensors").stat().st_size
    assert est.weights <= size < est.weights + 4096
    # recorded attention: the tensors a full recording really holds, plus their float32 copy
    inputs = adapter.encode("the movie was not good")
    assert inputs.lengths[0] == 5
    cache = adapter.forward(inputs, record=["layers.*.attn.pattern"]).cache
    held = sum(cache[f"layers.{l}.attn.pattern"].nbytes for l in range(adapter.n_layers))
    assert est.attention == held + held  # float32 run: the run's copy and the results' copy
    assert est.shape == (2, 4, 5, 5)
    # half precision halves the run's copy only; activations halve
    half = memory.estimate(ModelAdapter(*tiny_model("llama", seed=0), "h").to("cpu", "bfloat16"), 5)
    assert half.attention == held // 2 + held and half.activations * 2 == est.activations
    assert memory.estimate(adapter, 5, record_attention=False).attention == 0


def test_attention_grows_with_the_square_of_the_length() -> None:
    adapter = ModelAdapter(*tiny_model("gpt2", seed=0), "t")
    a, b = memory.estimate(adapter, 100), memory.estimate(adapter, 200)
    assert b.attention == 4 * a.attention


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return save_tiny("llama", tmp_path / "llama")


def test_refused_with_the_estimate_unless_forced(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    out = tmp_path / "o"
    assert (
        main(["explain", "the movie was good", "--model", str(ckpt), "--out", str(out), "--methods", "attention"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory estimate" in err and "[2, 4, 4, 4]" in err and "--force" in err
    assert not out.exists()
    assert (
        main(
            [
                "explain",
                "the movie was good",
                "--model",
                str(ckpt),
                "--out",
                str(out),
                "--methods",
                "attention",
                "--force",
            ]
        )
        == 0
    )
    assert "--force: running anyway" in capsys.readouterr().err and (out / "manifest.json").exists()


def test_fits_runs_quietly(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(
            [
                "explain",
                "the movie was good",
                "--model",
                str(ckpt),
                "--out",
                str(tmp_path / "o"),
                "--methods",
                "attention",
            ]
        )
        == 0
    )
    assert "memory estimate" not in capsys.readouterr().err


def test_float16_runs_and_matches_float32(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from safetensors.numpy import load_file

    outs = {}
    for dt in ("float32", "float16"):
        assert (
            main(
                [
                    "explain",
                    "the movie was not good",
                    "--model",
                    str(ckpt),
                    "--out",
                    str(tmp_path / dt),
                    "--methods",
                    "attention",
                    "--dtype",
                    dt,
                ]
            )
            == 0
        )
        outs[dt] = load_file(str(tmp_path / dt / "arrays.safetensors"))["attention"]
    # float16 keeps 11 significant bits: probabilities to about 2^-11 relative, a few roundings deep
    assert outs["float16"].dtype.name == "float32"
    torch.testing.assert_close(
        torch.from_numpy(outs["float16"]), torch.from_numpy(outs["float32"]), atol=4e-3, rtol=4e-3
    )


def test_force_only_where_the_estimate_is_checked(capsys: pytest.CaptureFixture) -> None:
    """--force skips the memory check; only explain and explain-generation run that check, so only they take
    the flag (elsewhere it would tell the user a check was skipped that never ran)."""
    import argparse

    from streetlamp.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    with_force = {name for name, p in sub.choices.items() if "--force" in p._option_string_actions}
    assert with_force == {"explain", "explain-generation"}
    with pytest.raises(SystemExit) as e:
        main(["heads", "the movie", "--force"])
    assert e.value.code == 2 and "unrecognized arguments: --force" in capsys.readouterr().err
