"""The per-family tests, run on the tiny ViT (float64) through the shim of tests/helpers/vit_helpers.py.

``tests/conftest.py``'s ``tiny`` fixture feeds text, so ViT is not among its families; here each
shared test that applies to an image classifier is called with a ViT adapter whose ``encode`` turns
the test texts into fixed random images, and with the test module's ``eager_twin`` pointed at
Hugging Face's eager ViT run on the same pixels. Tests that do not apply are listed in
``NOT_APPLICABLE`` with the reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest

from streetlamp.methods.registry import REGISTRY
from streetlamp.models.adapter import ModelAdapter
from tests.helpers.vit_helpers import pixel_twin, tiny_vit

_PER_METHOD = ["test_conformance", "test_explicit_target", "test_seed_matters_only_for_stochastic_methods"]
CASES: list[tuple[str, str, dict]] = [
    *[("test_conformance", f, {"name": n}) for f in _PER_METHOD for n in REGISTRY],
    *[
        ("test_conformance", "test_methods_without_gradients_run_in_inference_mode", {"name": n})
        for n, c in REGISTRY.items()
        if not c.needs_gradients
    ],
    *[("test_conformance", "test_reported_completeness_is_true", {"name": n}) for n in ("integrated_gradients",)],
    *[("test_conformance", "test_reported_completeness_is_true", {"name": n}) for n in ("attention_attribution",)],
    ("test_recording", "test_recorded_attention_equals_hf_eager", {}),
    ("test_recording", "test_batched_equals_alone", {}),
    ("test_recording", "test_recording_leaves_logits_unchanged", {}),
    ("test_recording", "test_scaling_attention_by_one_changes_nothing", {}),
    ("test_recording", "test_head_out_sums_to_attention_output", {}),
    ("test_sites", "test_site_names_pinned", {}),
    ("test_sites", "test_site_shapes", {}),
    ("test_rollout", "test_rollout_is_the_product_of_hf_attention", {"fusion": "mean"}),
    ("test_rollout", "test_rollout_is_the_product_of_hf_attention", {"fusion": "max"}),
    ("test_rollout", "test_flow_equals_networkx_on_tiny_models", {}),
    ("test_attention_grad", "test_attention_x_gradient_matches_eager_autograd", {}),
    ("test_attention_grad", "test_gradient_rollout_matches_direct_computation", {}),
    ("test_attention_grad", "test_attention_attribution_completeness_error_falls_with_steps", {}),
    ("test_gradient", "test_embed_ids_is_the_recorded_embed_site", {}),
    ("test_gradient", "test_ig_records_token_change_against_half_the_steps", {}),
    ("test_lrp", "test_attribute_reports_the_logit_and_what_is_unassigned", {}),
    ("test_lrp", "test_rules_leave_forward_values_unchanged", {}),
]
# Shared per-family tests not run on ViT, and why.
NOT_APPLICABLE = {
    "test_recording.test_zeroing_a_head_equals_zeroed_output_projection": "wraps the eager twin in a second "
    "ModelAdapter; the same check runs in test_vit.py on the ViT twin directly",
    "test_recording.test_float64_equals_hf_eager": "builds a plain ModelAdapter that reads text; test_vit.py "
    "compares ViT in float64 and float32 with Hugging Face's eager attention",
    "test_recording.test_no_hooks_leak": "calls hf_model(input_ids=...); hook leaks are checked for every "
    "method by test_conformance above",
    "test_decomposition.*": "reads each family's modules by model type in the test; norm, ALTI and value "
    "zeroing on ViT are checked by the conformance cases above and in test_vit.py",
}


@pytest.fixture(scope="module")
def vit() -> ModelAdapter:
    return tiny_vit(seed=1, double=True, shim=True)


# where each shared test module lives under tests/ (the ids above keep the short names)
HOME = {"test_recording": "models", "test_sites": "models"}


def _call(module: str, fn: str, kwargs: dict, adapter: ModelAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = importlib.import_module(f"tests.{HOME.get(module, 'methods')}.{module}")
    if hasattr(mod, "eager_twin"):
        monkeypatch.setattr(mod, "eager_twin", pixel_twin)
    test: Callable = getattr(mod, fn)
    test(tiny=adapter, **kwargs)


@pytest.mark.parametrize(
    ("module", "fn", "kwargs"), CASES, ids=[f"{m}.{f}[{','.join(map(str, k.values()))}]" for m, f, k in CASES]
)
def test_shared_case_on_vit(
    module: str, fn: str, kwargs: dict, vit: ModelAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _call(module, fn, kwargs, vit, monkeypatch)
