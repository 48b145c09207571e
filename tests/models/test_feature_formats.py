"""streetlamp reads SAELens's and circuit-tracer's dictionaries as their own code computes them: random weights
written by each peer's own save functions, encoded and decoded by the peer's own code on the same inputs after its
own loader read them back (tests/helpers/features_peer.py), against streetlamp's ``load_features`` and
``Dictionary.encode``/``decode``, latents and reconstructions in float64 (issue 38, must-have 5).

SAELens and circuit-tracer live in their own virtualenv ``.feat-venv`` (``make feat-venv``: torch's CPU wheel,
then sae-lens and circuit-tracer pinned), run in a subprocess: their pins (transformers 4, TransformerLens 3) never
touch this process's packages. Skipped when that environment is missing, failed instead where
STREETLAMP_REQUIRE_PEERS=1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streetlamp.models.dictionaries import load_features
from tests.helpers.peers import missing_peer

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / ".feat-venv" / "bin" / "python"

if not PEER.exists():
    missing_peer(f"SAELens and circuit-tracer not installed in {PEER.parent.parent} (make feat-venv)", True)

# the site each peer dictionary lands on (TL_HOOKS: hook_resid_post of layer 0 is layer 1's resid_pre)
SITES = {
    "standard": (0, "resid_pre"),
    "standard_no_bdec": (1, "resid_pre"),
    "topk": (1, "resid_pre"),
    "topk_rescaled": (2, "resid_pre"),
    "jumprelu": (3, "resid_pre"),
    "transcoder": (0, "mlp"),
    "skip_transcoder": (1, "mlp"),
    "jumprelu_skip_transcoder": (2, "mlp"),
}


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("features-peer")
    run = subprocess.run(
        [str(PEER), str(ROOT / "tests" / "helpers" / "features_peer.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=out,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    # float64 on both sides, the same products summed in possibly another order: rounding of the largest value
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12 * max(1.0, float(theirs.abs().max())))


@pytest.mark.parametrize("name", sorted(SITES))
def test_saelens_equals_streetlamp(peer: Path, name: str) -> None:
    info = json.loads((peer / "peer.json").read_text())
    assert info["sae_lens"].startswith("6.")
    x = load_file(str(peer / "inputs.safetensors"))["x"]
    theirs = load_file(str(peer / "peer.safetensors"))
    fs = load_features(peer / "saelens" / name)
    assert fs.format == "saelens" and list(fs.dictionaries) == [SITES[name]] and fs.model == "tiny-llama"
    d = fs.get(*SITES[name])
    assert d is not None
    acts = d.encode(x)
    assert bool((theirs[f"saelens/{name}.acts"] != 0).any()) and bool((theirs[f"saelens/{name}.acts"] == 0).any())
    close(acts, theirs[f"saelens/{name}.acts"])
    close(d.decode(acts, x), theirs[f"saelens/{name}.recon"])


def test_circuit_tracer_equals_streetlamp(peer: Path) -> None:
    x = load_file(str(peer / "inputs.safetensors"))["x"]
    theirs = load_file(str(peer / "peer.safetensors"))
    fs = load_features(peer / "circuit-tracer")
    assert fs.format == "circuit-tracer" and sorted(fs.dictionaries) == [(0, "mlp"), (1, "mlp")]
    for l in range(2):
        d = fs.get(l, "mlp")
        assert d is not None and d.W_skip is not None and d.activation == "jumprelu"
        acts = d.encode(x)
        close(acts, theirs[f"circuit-tracer/{l}.acts"])
        close(d.decode(acts, x), theirs[f"circuit-tracer/{l}.recon"])
