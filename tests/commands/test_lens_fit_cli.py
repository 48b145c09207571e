"""``streetlamp lens-fit`` and ``streetlamp lens --lens KIND:DIR --check`` in-process on tiny checkpoints: the
lens folder, its held-out KL (recomputed here from the saved lens), the readouts of the lens command equal
to the saved lens's, and bad input refused in one line with exit 2 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from streetlamp.cli import main
from streetlamp.interventions.lens import logit_lens
from streetlamp.interventions.lenses.base import Lens
from streetlamp.interventions.lenses.fit import corpus_sequences, heldout_kl
from streetlamp.interventions.lenses.store import load_lens, save_tuned_lens_package
from streetlamp.models.loading import load
from streetlamp.models.tiny import WORDS, save_tiny
from streetlamp.store.files import load_arrays
from tests.conftest import F64_TOL

TEXT = "when mary and john went to the store , john gave a drink to"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lensfit")
    data = root / "d.csv"
    rows = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(9)) for i in range(30)]
    data.write_text("text,label\n" + "\n".join(f"{r},x" for r in rows) + "\n")
    return {
        "llama": save_tiny("llama", root / "llama", seed=1),
        "llama3": save_tiny("llama", root / "llama3", seed=1, layers=3),
        "bert": save_tiny("bert", root / "bert", seed=1),
        "data": data,
        "root": root,
    }


def fit(setup: dict[str, Path], kind: str, out: Path, *extra: str) -> list[str]:
    return [
        "lens-fit",
        "--model",
        str(setup["llama"]),
        "--lens",
        kind,
        "--data",
        str(setup["data"]),
        "--out",
        str(out),
    ] + [
        "--seq-len",
        "20",
        "--heldout",
        "2",
        *extra,
    ]


@pytest.fixture(scope="module")
def fitted(setup: dict[str, Path]) -> dict[str, Path]:
    out = {}
    for kind, extra in (
        ("tuned", ["--steps", "20", "--lr", "0.01"]),
        ("jacobian", ["--skip-first", "4", "--max-seqs", "3"]),
    ):
        out[kind] = setup["root"] / f"lens-{kind}"
        assert main(fit(setup, kind, out[kind], *extra)) == 0
    return out


@pytest.mark.parametrize("kind", ["tuned", "jacobian"])
def test_lens_fit_writes_a_lens_folder(setup: dict[str, Path], fitted: dict[str, Path], kind: str) -> None:
    out = fitted[kind]
    m = json.loads((out / "manifest.json").read_text())
    rec = json.loads((out / "lens.json").read_text())
    assert m["streetlamp"] == "lens-fit" and rec["kind"] == kind and rec["model"]["n_layers"] == 2
    t = rec["training"]
    assert t["seq_len"] == 20 and t["train_tokens"] == 20 * t["train_sequences"] and t["dtype"] == "float32"
    if kind == "jacobian":
        assert t["exact"] and t["cotangents_per_sequence"] == 32 and t["train_sequences"] == 3
    csv = pd.read_csv(out / "heldout_kl.csv")
    assert list(csv.columns) == ["row", "layer", "kl_logit", f"kl_{kind}", "heldout_tokens"] and len(csv) == 3
    # recompute the held-out KL from the saved lens and the same held-out sequences (same seed, same split)
    a = load(setup["llama"])
    import streetlamp.data.loaders as loaders

    texts = [e.text for e in loaders.load_dataset(str(setup["data"])).examples]
    held = corpus_sequences(a, texts, 20, seed=0)[-2:]
    again = heldout_kl(a, {"logit": Lens.logit(a), kind: load_lens(out, a, kind)}, held)
    np.testing.assert_allclose(csv[f"kl_{kind}"], again["kl"][kind], rtol=1e-5, atol=F64_TOL)
    np.testing.assert_allclose(csv["kl_logit"], again["kl"]["logit"], rtol=1e-5, atol=F64_TOL)
    assert csv[f"kl_{kind}"].iloc[-1] < 1e-6 and csv["kl_logit"].iloc[0] > 1e-4
    arrays = load_arrays(out / "arrays.safetensors")
    np.testing.assert_allclose(arrays[f"heldout_kl.{kind}"], csv[f"kl_{kind}"], rtol=1e-12)
    if kind == "tuned":
        assert np.all(csv["kl_tuned"].iloc[:-1] < csv["kl_logit"].iloc[:-1])
        assert arrays["training.loss"].shape == (20,) and arrays["training.loss"][-1] < arrays["training.loss"][0]


@pytest.mark.parametrize("kind", ["tuned", "jacobian"])
def test_lens_command_reads_the_lens_and_checks_it(
    setup: dict[str, Path], fitted: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["lens", TEXT, "--model", str(setup["llama"]), "--out", str(out), "--types-length", "4", "--types-seqs", "1"]
    assert main(args + ["--lens", f"{kind}:{fitted[kind]}", "--check"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    a = load(setup["llama"])
    lens = load_lens(fitted[kind], a, kind)
    ids = a.encode(TEXT).input_ids[0]
    index = m["parameters"]["target"]["index"]
    want = logit_lens(a, ids, index, lens=lens)
    got = load_arrays(out / "arrays.safetensors")
    np.testing.assert_allclose(got["lens.logprob"], want["logprob"], rtol=1e-6)
    assert m["arrays"]["lens.logit"]["meaning"].startswith(f"{kind} lens:")
    assert m["summary"]["lens"]["kind"] == kind and m["parameters"]["lens"]["folder"] == str(fitted[kind])
    check = pd.read_csv(out / "lens_check.csv")
    assert len(check) == 3 and bool(check["top1_match"].iloc[-1]) and check["kl_patched_lens"].iloc[-1] < 1e-6
    assert m["summary"]["check"]["disagreeing_layers"] == list(check.loc[check["disagrees"], "layer"].astype(str))
    assert m["tables"][-1]["title"].startswith(f"{kind} lens checked against intervention")
    np.testing.assert_allclose(got["check.kl"], check["kl_patched_lens"], rtol=1e-6)


def test_tuned_lens_package_folder_through_the_cli(
    setup: dict[str, Path], fitted: dict[str, Path], tmp_path: Path
) -> None:
    a = load(setup["llama"])
    lens = load_lens(fitted["tuned"], a, "tuned")
    save_tuned_lens_package(tmp_path / "tl", lens, "tiny-llama")
    out = tmp_path / "run"
    args = ["lens", TEXT, "--model", str(setup["llama"]), "--out", str(out), "--types-length", "4", "--types-seqs", "1"]
    assert main(args + ["--lens", f"tuned:{tmp_path / 'tl'}"]) == 2  # a pickle: only when the user opts in
    assert not out.exists()
    assert main(args + ["--lens", f"tuned:{tmp_path / 'tl'}", "--allow-pt"]) == 0
    ours = logit_lens(a, a.encode(TEXT).input_ids[0], 0, lens=lens)
    got = load_arrays(out / "arrays.safetensors")
    np.testing.assert_allclose(got["lens.top_ids"], ours["top_ids"].astype(np.float32))
    # converted once into streetlamp's folder (safetensors), it reads without --allow-pt, to the same readout
    conv = tmp_path / "converted"
    assert main(fit(setup, "tuned", conv, "--convert", str(tmp_path / "tl"))) == 0
    rec = json.loads((conv / "lens.json").read_text())
    assert rec["training"]["converted_from"] == str(tmp_path / "tl") and rec["training"]["train_tokens"] == 0
    back = load_lens(conv, a, "tuned")
    assert back.mean is not None and back.mean.shape == (3, 32)
    ids = a.encode(TEXT).input_ids[0]
    np.testing.assert_allclose(
        logit_lens(a, ids, 0, lens=back)["logprob"], logit_lens(a, ids, 0, lens=lens)["logprob"], atol=1e-4
    )


def test_check_variants_and_coordinate_interventions_through_the_cli(
    setup: dict[str, Path], fitted: dict[str, Path], tmp_path: Path
) -> None:
    """--check-variant both --baseline mean writes both check files (the baseline the lens folder's stored mean,
    recomputed here from the training sequences); --swap writes lens_coords.csv equal to the library's numbers."""
    from streetlamp.interventions.lenses.coords import coordinate_effects
    from streetlamp.interventions.lenses.fit import row_means

    a = load(setup["llama"])
    lens = load_lens(fitted["jacobian"], a, "jacobian")
    import streetlamp.data.loaders as loaders

    texts = [e.text for e in loaders.load_dataset(str(setup["data"])).examples]
    train = corpus_sequences(a, texts, 20, seed=0)[:-2][:3]
    np.testing.assert_allclose(lens.mean, row_means(a, train), rtol=1e-6, atol=1e-7)  # type: ignore[arg-type]
    out = tmp_path / "run"
    args = ["lens", TEXT, "--model", str(setup["llama"]), "--out", str(out), "--types-length", "4", "--types-seqs", "1"]
    args += ["--lens", f"jacobian:{fitted['jacobian']}", "--check-variant", "both", "--baseline", "mean"]
    assert main(args + ["--swap", "mary,john", "--alpha", "2"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    base = pd.read_csv(out / "lens_check_baseline.csv")
    assert len(pd.read_csv(out / "lens_check.csv")) == 3 and len(base) == 3 and set(base["baseline"]) == {"mean"}
    assert bool(base["top1_match"].iloc[-1]) and m["summary"]["check_baseline"]["baseline"] == "mean"
    got = load_arrays(out / "arrays.safetensors")
    np.testing.assert_allclose(got["check_baseline.vectors"], lens.mean.numpy(), rtol=1e-6)  # type: ignore[union-attr]
    np.testing.assert_allclose(got["check_baseline.kl_model"], base["kl_model"], rtol=1e-6)
    coords = pd.read_csv(out / "lens_coords.csv")
    want = coordinate_effects(
        a, a.encode(TEXT).input_ids[0], lens, "swap", [a.parse_label("mary"), a.parse_label("john")], 2.0
    )
    np.testing.assert_allclose(
        coords["dlogp_source_model"], want["model_after"][:, 0] - want["model_before"][0], rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(coords["kl_model"], want["kl"], rtol=1e-5, atol=1e-9)
    assert list(coords["source"].unique()) == ["mary"] and m["parameters"]["coords"]["alpha"] == 2.0
    assert m["lens_view"]["variants"] == ["patch", "baseline"] and len(m["lens_view"]["lens_top"]) == 3


@pytest.mark.parametrize(
    "which, extra, message",
    [
        ("lens", ["--lens", "tuned"], "--lens takes logit, tuned:DIR or jacobian:DIR"),
        ("lens", ["--lens", "jacobian:{tuned}"], "holds a tuned lens, not a jacobian lens"),
        ("lens", ["--lens", "tuned:{root}/nothing"], "does not exist"),
        ("lens", ["--lens", "tuned:{root}"], "no lens here"),
        ("lens3", ["--lens", "tuned:{tuned}"], "a lens reads only the model it was fitted on"),
        ("bert", ["--lens", "tuned:{tuned}"], "pre-norm causal LM"),
        ("fit", ["--skip-first", "20", "--lens", "jacobian"], "--skip-first 20 leaves no position"),
        ("fit", ["--heldout", "99", "--lens", "tuned"], "not more than --heldout 99"),
        ("fit", ["--lens", "tuned", "--lr", "0"], "--lr must be greater than 0 (got 0)"),
        ("fitbert", ["--lens", "tuned"], "pre-norm causal LM"),
        ("fit", ["--lens", "tuned", "--dtype", "bfloat16"], "a lens is fitted in float32 or float64"),
        ("fit", ["--lens", "jacobian", "--convert", "{tuned}"], "holds a tuned lens, not a jacobian lens"),
        ("fit", ["--lens", "tuned", "--convert", "{root}/nothing"], "does not exist"),
        ("lens", ["--check-variant", "baseline", "--baseline", "mean"], "--baseline mean needs --lens"),
        ("lens", ["--swap", "mary"], "--swap takes SOURCE,TARGET"),
        ("lens", ["--baseline", "mean", "--check"], "applies to --check-variant baseline or both"),
        ("lens", ["--swap", "mary,mary"], "source and target are the same token"),
        ("lens", ["--swap", "mary,john", "--ablate", "mary"], "one coordinate intervention per run"),
        ("lens", ["--ablate", "mary john"], "is 2 tokens"),
        ("lens", ["--swap", "mary,john", "--alpha", "0"], "--alpha must be finite and not 0"),
    ],
)
def test_bad_input_is_refused(
    setup: dict[str, Path],
    fitted: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    which: str,
    extra: list[str],
    message: str,
) -> None:
    out = tmp_path / "bad"
    extra = [x.format(tuned=fitted["tuned"], root=setup["root"]) for x in extra]
    if which.startswith("fit"):
        args = ["lens-fit", "--data", str(setup["data"]), "--out", str(out)]
        args += ["--model", str(setup["bert" if which == "fitbert" else "llama"]), "--seq-len", "20", *extra]
    else:
        model = {"lens": "llama", "lens3": "llama3", "bert": "bert"}[which]
        args = ["lens", TEXT, "--model", str(setup[model]), "--out", str(out), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists()
