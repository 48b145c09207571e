"""Cross-check of Smooth and Efficient MPRT's arithmetic against Quantus itself (issue 27).

Quantus (``pip install quantus``; 0.6.0 here) runs its own ``SmoothMPRT`` and ``EfficientMPRT`` on a tiny
tabular torch MLP with a gradient x input explanation; every explanation Quantus asks for is recorded, and
streetlamp's own functions (:func:`~streetlamp.evaluation.mprt_variants.smooth_mean`,
:func:`~streetlamp.stats.spearman_rho`, :func:`~streetlamp.evaluation.mprt_variants.entropy_rise`) recompute
each per-example score from the same explanations. What this checks: the denoising mean (with Quantus' last,
noise-free sample), the absolute value taken after the mean, Spearman's rho, the histogram entropy and the
relative rise. What it cannot check: the text-specific parts (noise on the embed site keyed by token, the
stages of a Transformer), which tests/evaluation/test_mprt_variants.py checks against Hugging Face.

Run: ``PYTHONPATH=src:QUANTUS_DIR python scripts/check_mprt_against_quantus.py``. Quantus imports
scikit-image and OpenCV for image segmentation only; when they are absent, empty stand-ins are put in
``sys.modules`` (no metric used here touches them).
"""

from __future__ import annotations

import copy
import sys
import types

for _name in ("skimage", "skimage.segmentation", "cv2"):
    try:
        __import__(_name)
    except ImportError:
        _m = types.ModuleType(_name)
        _m.slic = _m.felzenszwalb = None  # type: ignore[attr-defined]
        sys.modules[_name] = _m

import numpy as np  # noqa: E402
import quantus  # noqa: E402
import torch  # noqa: E402

from streetlamp.evaluation.mprt_variants import entropy_rise, smooth_mean  # noqa: E402
from streetlamp.stats import spearman_rho  # noqa: E402

CALLS: list[tuple[str, np.ndarray]] = []  # (model fingerprint, explanation batch), in call order


def fingerprint(model: torch.nn.Module) -> str:
    return ",".join(f"{float(p.detach().double().sum()):.12e}" for p in model.parameters())


def explain(model: torch.nn.Module, inputs: np.ndarray, targets: np.ndarray, **kwargs: object) -> np.ndarray:
    """Gradient x input of the target logit, float64; every call recorded."""
    m = copy.deepcopy(model).double()  # Quantus predicts in float32 on the model itself
    x = torch.as_tensor(np.asarray(inputs), dtype=torch.float64).requires_grad_(True)
    out = m(x)
    out.gather(1, torch.as_tensor(np.asarray(targets)).long().view(-1, 1)).sum().backward()
    a = (x.grad * x).detach().numpy()
    CALLS.append((fingerprint(model), a.copy()))
    return a


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 12))
    model = mlp().eval()
    y = model(torch.as_tensor(x, dtype=torch.float32)).argmax(-1).numpy()
    worst = 0.0

    # Efficient MPRT: relative entropy rise between the original and the fully randomised model
    CALLS.clear()
    e = quantus.EfficientMPRT(complexity_func_kwargs={"n_bins": 10}, disable_warnings=True)
    got = np.asarray(e(model=model, x_batch=x, y_batch=y, explain_func=explain, device="cpu"))
    orig = fingerprint(model)
    a0 = next(a for f, a in CALLS if f == orig)
    a1 = next(a for f, a in reversed(CALLS) if f != orig)
    ours = np.array([entropy_rise(a0[i], a1[i], np.zeros(12, bool), 10)["emprt_rise"] for i in range(len(x))])
    d = float(np.abs(ours - got).max())
    worst = max(worst, d)
    print(f"EfficientMPRT, {len(x)} examples, 10 bins: Quantus {np.round(got, 4).tolist()}")
    print(f"  streetlamp entropy_rise on the same explanations: max |difference| {d:.2e}")

    # Smooth MPRT: mean over N (the last noise-free), abs after the mean, Spearman per layer (top down)
    n = 4
    CALLS.clear()
    sm = quantus.SmoothMPRT(nr_samples=n, noise_magnitude=0.1, layer_order="top_down", disable_warnings=True)
    real_explain = quantus.explain
    quantus.explain = explain  # SmoothMPRT calls quantus.explain for its noisy inputs
    try:
        scores = sm(model=model, x_batch=x, y_batch=y, explain_func=explain, device="cpu")
    finally:
        quantus.explain = real_explain
    groups: list[tuple[str, list[np.ndarray]]] = []
    for f, a in CALLS:
        if groups and groups[-1][0] == f and len(groups[-1][1]) < n:
            groups[-1][1].append(a)
        else:
            groups.append((f, [a]))
    assert all(len(g) == n for _, g in groups), [len(g) for _, g in groups]
    # CALLS: the a_batch (original, smoothed), the original again (the "original" score), then each layer
    base = [smooth_mean(groups[0][1][-1][i], [a[i] for a in groups[0][1][:-1]]) for i in range(len(x))]
    layers = [k for k in scores if k != "original"]
    assert len(layers) == len(groups) - 2, (layers, len(groups))
    for k, (_, g) in zip(layers, groups[2:]):
        rnd = [smooth_mean(g[-1][i], [a[i] for a in g[:-1]]) for i in range(len(x))]
        ours = np.array([spearman_rho(np.abs(base[i]), np.abs(rnd[i])) for i in range(len(x))])
        d = float(np.abs(ours - np.asarray(scores[k], np.float64)).max())
        worst = max(worst, d)
        print(f"SmoothMPRT layer {k} (N={n}): Quantus mean rho {np.mean(scores[k]):.4f}; max |difference| {d:.2e}")
    print(f"largest difference over every score: {worst:.2e}")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
