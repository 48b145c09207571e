"""``streetlamp probe``'s control accuracy (Hewitt & Liang's control task), rebuilt outside the runner:
the task's items aligned to tokens, the split by text, one control label per word type
(:func:`streetlamp.probing.control.control_labels`, seed + 1 as the runner documents), the features
recorded at each probed site by our own forward pass, a linear probe refitted on the training items and
scored on the test items **against the control labels**. Accuracies are counts over the test items:
equal, exactly. The test also asserts that scoring that control probe against the task labels gives
another number, so the mistake cannot pass. Likewise the capacity sweep's rows (issue 35: its own copy of
the scoring had the same bug), a rank sweep at layer 1 refitted with the sweep's documented probe."""

from __future__ import annotations

import json

import numpy as np

import streetlamp
from streetlamp.cli import main
from streetlamp.groundtruth.train import weights_path
from streetlamp.probing.control import control_labels
from streetlamp.probing.probes import ProbeSpec, fit_probe
from streetlamp.probing.tasks import align, planted_task

GT = "gt-negation-normal"  # a 2-layer d=32 ground-truth model with a word-level tokenizer: fast
N, SEED = 60, 0


def test_control_accuracy_is_a_refit_on_rebuilt_control_labels(tmp_path) -> None:
    out = tmp_path / "run"
    args = ["probe", "--model", GT, "--task", "category", "--n-examples", str(N), "--layers", "embed,0,1"]
    args += ["--probes", "linear", "--no-mdl", "--no-amnesic", "--sweep", "rank:1,4", "--sweep-layer", "1"]
    args += ["--seed", str(SEED)]
    assert main([*args, "--out", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    # rebuild the task, its items' token positions and the split by text (60/20/20, seeded)
    a = streetlamp.load(weights_path("negation", "normal"))  # the folder gt-negation-normal names
    task = planted_task("category", N, SEED)
    enc = a.encode(task.texts)
    ids = [enc.input_ids[b, :n].tolist() for b, n in enumerate(enc.lengths)]
    kept, positions, _ = align(a.tokenizer, task, ids, "first", "refuse")
    task.items = [task.items[k] for k in kept]
    y = task.y()
    K = len(task.classes)
    words = [it.word for it in task.items]
    text_of = np.array([it.text for it in task.items])
    order = np.random.default_rng(SEED).permutation(len(task.texts))
    n_tr, n_dv = round(0.6 * len(task.texts)), round(0.2 * len(task.texts))
    part = np.full(len(task.texts), 2)
    part[order[:n_tr]], part[order[n_tr : n_tr + n_dv]] = 0, 1
    tr, dv, te = (np.flatnonzero(part[text_of] == p) for p in range(3))
    assert man["task"]["items_per_split"] == [len(tr), len(dv), len(te)]
    yc = control_labels(words, y, K, seed=SEED + 1)
    sites = man["representation"]["sites"]
    rows = {r["site"]: r for r in man["results"] if r["probe"] == "linear"}
    assert set(rows) == set(sites) and len(sites) == 3
    fwd = a.forward(enc, record=sites)
    differs = sweep_differs = 0
    X1 = np.zeros(0)
    for site in sites:
        X = np.stack([fwd.cache[site][it.text, q].detach().float().numpy() for it, q in zip(task.items, positions)])
        spec = ProbeSpec("linear", weight_decay=1e-3, seed=SEED)  # the runner's --probes linear
        pc = fit_probe(spec, X[tr], yc[tr], K, X[dv], yc[dv])
        want = pc.accuracy(X[te], yc[te])
        assert rows[site]["control_accuracy"] == want, site
        assert rows[site]["control_train_accuracy"] == pc.accuracy(X[tr], yc[tr]), site
        pt = fit_probe(spec, X[tr], y[tr], K, X[dv], y[dv])
        assert rows[site]["task_accuracy"] == pt.accuracy(X[te], y[te]), site
        differs += abs(pc.accuracy(X[te], y[te]) - want) >= 1 / len(te)
        if site == "layers.1.resid_post":
            X1 = X
    # the sweep: a rank-r linear probe (the sweep's MLP settings with kind linear, rank r, no dropout)
    assert [(r["site"], r["value"]) for r in man["sweep"]] == [
        ("layers.1.resid_post", 1.0),
        ("layers.1.resid_post", 4.0),
    ]
    for r in man["sweep"]:
        spec = ProbeSpec("linear", rank=int(r["value"]), weight_decay=1e-3, seed=SEED, max_epochs=100)
        pc = fit_probe(spec, X1[tr], yc[tr], K, X1[dv], yc[dv])
        want = pc.accuracy(X1[te], yc[te])
        assert r["control_accuracy"] == want, r
        assert r["control_train_accuracy"] == pc.accuracy(X1[tr], yc[tr]), r
        pt = fit_probe(spec, X1[tr], y[tr], K, X1[dv], y[dv])
        assert r["task_accuracy"] == pt.accuracy(X1[te], y[te]), r
        assert r["selectivity"] == r["task_accuracy"] - r["control_accuracy"]
        sweep_differs += abs(pc.accuracy(X1[te], y[te]) - want) >= 1 / len(te)
    # not vacuous: the control labels are not the task labels, and scoring against the wrong ones differs
    assert (yc[te] != y[te]).mean() > 0.1
    assert differs > 0 and sweep_differs > 0
