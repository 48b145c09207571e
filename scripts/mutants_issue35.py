"""Re-introduce the bugs of issue 35 (item 11) one at a time and check that a test fails for each.

Six realistic bugs that once passed the whole suite, as exact text edits of src/streetlamp (the runner
and its rules are :mod:`mutants_issue29`'s: a copy of src/ per mutant, the named test files only, a first
run without any edit must pass; ``killed`` = pytest exit status 1):

    /work/bin/cpu .venv/bin/python scripts/mutants_issue35.py            # all of them
    .venv/bin/python scripts/mutants_issue35.py --only soft_ns_not_clamped
    .venv/bin/python scripts/mutants_issue35.py --list

Exit status 0 when every mutant is killed, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants_issue29 import Mutant, main  # noqa: E402

ATLAS = ("tests/interventions/test_atlas_numbers.py", "tests/interventions/test_atlas.py")

MUTANTS = [
    Mutant(
        "atlas_kl_explained_reversed",
        "the atlas's kl_explained as KL(p' || p)",
        "interventions/atlas_effects.py",
        '"kl_explained": (lc.exp() * (lc - lp)).sum(-1),',
        '"kl_explained": (lp.exp() * (lp - lc)).sum(-1),',
        ATLAS,
    ),
    Mutant(
        "atlas_kl_mean_one_position_too_many",
        "kl_mean over positions 0..n-1 (the last predicts nothing)",
        "interventions/atlas_effects.py",
        "km[r] = float(kl[r, : m - 1].double().mean())",
        "km[r] = float(kl[r, :m].double().mean())",
        ATLAS,
    ),
    Mutant(
        "atlas_streetlight_from_the_mean",
        "the streetlight flag from the mean effect, not its upper bound",
        "interventions/atlas_use.py",
        's["streetlight"] = (s.prominence >= striking) & (s.effect_high < floor)',
        's["streetlight"] = (s.prominence >= striking) & (s.effect < floor)',
        ATLAS,
    ),
    Mutant(
        "soft_ns_not_clamped",
        "soft_ns without its max(0, .)",
        "evaluation/soft.py",
        "variant: max(0.0, s - s0) / denom if",
        "variant: (s - s0) / denom if",
        ("tests/evaluation/test_soft_formula.py", "tests/evaluation/test_soft.py"),
    ),
    Mutant(
        "dla_head_source_keys_reversed",
        "per-key DLA in reversed key order",
        "interventions/lens.py",
        "            source[l] = direct(write(per_key)).cpu().numpy()\n",
        "            source[l] = direct(write(per_key)).cpu().numpy()[..., ::-1]\n",
        ("tests/interventions/test_dla_per_key.py", "tests/interventions/test_lens.py"),
    ),
    Mutant(
        "probe_sweep_control_on_task_labels",
        "the capacity sweep's control probe given the task labels (the second copy of issue 29's bug; the "
        "scoring itself is one function now, issue 29's mutant edits it)",
        "commands/probe/run.py",
        '{"site": site, "kind": kind, "value": v, **task_and_control(spec, X, y, yc, K, (tr, dv, te))}',
        '{"site": site, "kind": kind, "value": v, **task_and_control(spec, X, y, y, K, (tr, dv, te))}',
        ("tests/probing/test_probe_control.py",),
    ),
]


if __name__ == "__main__":
    raise SystemExit(main(MUTANTS, __doc__))
