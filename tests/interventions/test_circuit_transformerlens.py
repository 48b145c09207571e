"""streetlamp's EAP equals TransformerLens 4's edge attribution patching (``attribution_patch`` with
``granularity="edge"`` on a ``TransformerBridge``) on a tiny float64 GPT-2 saved as a local Hugging Face
folder, edge by edge (issue 24 item 7).

TransformerLens lives in its own virtualenv ``.tl-venv`` (``make tl-venv``: torch's CPU wheel, then
transformer-lens 4), run in a subprocess (tests/helpers/tl_peer.py): its pins never touch this process's
packages. Skipped when that environment is missing, failed instead where STREETLAMP_REQUIRE_PEERS=1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from streetlamp.interventions.circuits import scores as S
from streetlamp.interventions.circuits.tasks import encode_pairs
from tests.helpers.peers import missing_peer
from tests.interventions.test_circuit_scores import PAIRS, make

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / ".tl-venv" / "bin" / "python"

if not PEER.exists():
    missing_peer(f"TransformerLens 4 not installed in {PEER.parent.parent} (make tl-venv; docs/circuits.md)", True)


def test_eap_equals_transformerlens_edge_attribution(tmp_path: Path) -> None:
    a, b = make("gpt2")
    folder = tmp_path / "tiny-gpt2"
    a.hf_model.save_pretrained(folder)
    a.tokenizer.save_pretrained(folder)
    pairs = encode_pairs(a, PAIRS)
    spec = {
        "clean": pairs.clean.rows(),
        "corrupt": pairs.corrupt.rows(),
        "answer": pairs.answer.tolist(),
        "wrong": pairs.wrong.tolist(),
    }
    (tmp_path / "pairs.json").write_text(json.dumps(spec))
    out = subprocess.run(
        [
            str(PEER),
            str(ROOT / "tests" / "helpers" / "tl_peer.py"),
            str(folder),
            str(tmp_path / "pairs.json"),
            str(tmp_path / "tl.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    tl = json.loads((tmp_path / "tl.json").read_text())
    assert tl["version"].startswith("4.")
    theirs = {(s, t, i): v for s, t, i, v in tl["edges"]}
    ours_m = S.eap(b, pairs).mean
    g = b.graph
    ours = {}
    for (src, node, inp), r, w in zip(g.edge_names(), *g.edge_index()):
        ours[(src, node, inp)] = float(ours_m[r, w])
    assert set(theirs) == set(ours)  # the same graph: every writer to every later reader, q/k/v apart
    big = max(abs(v) for v in ours.values())
    diff = max(abs(ours[k] - theirs[k]) for k in ours)
    assert big > 1e-3 and diff <= 1e-9 * big, (diff, big)
