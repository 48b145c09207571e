"""streetlamp's IG and attention equal inseq's on a tiny GPT-2 and on SmolLM2 (scripts/compare_inseq.py).

inseq lives in its own folder ``.inseq-venv`` (``make setup`` installs it with ``--no-deps``: its metadata
pins ``typeguard<=2.13.3`` and CUDA wheels), so the comparison runs in a subprocess with that folder on
``PYTHONPATH`` and never touches this process's packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.peers import missing_peer

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / ".inseq-venv"

if not (PEER / "inseq").is_dir():  # a skip, or a failure where .ci/run requires the peers
    missing_peer(f"inseq not installed in {PEER} (make setup installs it; docs/decoder.md)", module_level=True)


def compare(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PEER), str(ROOT / "src")])}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_inseq.py"), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tiny_gpt2_equals_inseq() -> None:
    res = compare("--steps", "64")
    ig, att = res["ig"], res["attention"]
    assert ig["same_entries"] and att["same_entries"] and ig["n"] > 0 and att["n"] > 0
    # float64 model, same rule and nodes (Gauss-Legendre, 64), same baseline (unk); inseq's scores are float32
    assert ig["max_abs"] > 1e-3 and ig["max_abs_diff"] <= 1e-6 * ig["max_abs"] + 1e-9
    # every layer and head: the same softmax in float64 (Hugging Face's eager path vs streetlamp's)
    assert att["max_abs_diff"] <= 1e-12


@pytest.mark.slow
def test_smollm2_equals_inseq() -> None:
    res = compare("--smollm2")
    ig, att = res["ig"], res["attention"]
    assert (
        ig["same_entries"] and att["same_entries"] and att["n"] == 30 * 9 * (5 + 6)
    )  # 5 prompt tokens, 2 generated: rows of 5 and 6 keys
    # inseq's side runs partly in float32 (its scores are float32 and differ from a float64 forward by
    # a few float32 ulps per layer): 1e-5 absolute on weights <= 1 is ~80 ulps of float32 at 1.0 over
    # 30 layers; IG (32 Gauss-Legendre nodes, unk = <|endoftext|> baseline on both sides) to 1e-4 of its
    # largest value. A different baseline alone moves IG by O(max) (docs/decoder.md: pad vs unk).
    assert att["max_abs_diff"] <= 1e-5
    assert ig["max_abs"] > 1e-2 and ig["max_abs_diff"] <= 1e-4 * ig["max_abs"]
