from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

from streetlamp.models.adapter import ModelAdapter  # noqa: E402
from streetlamp.models.tiny import FAMILY_KINDS, tiny_model  # noqa: E402

FAMILIES = sorted(FAMILY_KINDS)
TEXTS = ["the movie was not good , but the acting was great .", "i loved it", "when mary and john went to the store"]


@pytest.fixture(params=FAMILIES)
def tiny(request: pytest.FixtureRequest) -> ModelAdapter:
    model, tok = tiny_model(request.param, seed=1)
    return ModelAdapter(model, tok, f"tiny-{request.param}")


def eager_twin(adapter: ModelAdapter) -> torch.nn.Module:
    """An independent copy of the model running Hugging Face's own eager attention."""
    twin = copy.deepcopy(adapter.hf_model)
    twin.set_attn_implementation("eager")
    return twin.eval()


_EMBEDDED: dict[str, ModelAdapter] = {}


def embedded(name: str) -> ModelAdapter:
    import streetlamp
    if name not in _EMBEDDED:
        _EMBEDDED[name] = streetlamp.load(name)
    return _EMBEDDED[name]


@pytest.fixture(scope="session")
def minilm() -> ModelAdapter:
    return embedded("minilm-sentiment")


@pytest.fixture(scope="session")
def smollm() -> ModelAdapter:
    return embedded("smollm2-135m")
