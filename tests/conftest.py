from __future__ import annotations

import copy
import os
import socket

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

from streetlamp.models.adapter import ModelAdapter  # noqa: E402
from streetlamp.models.tiny import FAMILY_KINDS, tiny_model  # noqa: E402

FAMILIES = sorted(FAMILY_KINDS)


@pytest.fixture(autouse=True, scope="session")
def messages_name_only_the_commands_options():
    """Every refusal of every command run in the suite (CLI and API: both go through ``execute``) names only
    options that command has (issue 35 item 5: ``circuit`` told the user to pass ``--truncate``)."""
    import streetlamp.commands as C
    from streetlamp.errors import StreetlampError
    from tests.helpers.flags import foreign_flags

    real = C.execute

    def execute(cmd, values):
        try:
            return real(cmd, values)
        except StreetlampError as e:
            bad = foreign_flags(cmd, str(e))
            assert not bad, f"`{cmd.name}` has no {', '.join(bad)}, but its message names it: {e}"
            raise

    with pytest.MonkeyPatch.context() as m:
        m.setattr(C, "execute", execute)
        yield


TEXTS = ["the movie was not good , but the acting was great .", "i loved it", "when mary and john went to the store"]


# Tolerances. Tiny models run in float64, so two routes to the same number (batched vs alone, streetlamp
# vs Hugging Face / Captum / numpy) agree to ~1e-13 on any CPU; F64_TOL leaves a wide margin and still
# sits far below any real difference (the tests assert those are > 1e-3). Embedded models run in
# float32: eps32 ~ 1.2e-7 per operation, compounded over the layers and the summations of a forward
# pass, so a comparison of O(1) quantities gets f32_tol(layers).
F64_TOL = 1e-9


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_same_route(got: np.ndarray, want: np.ndarray, err_msg: str = "") -> None:
    """Two float64 routes to the same array (batched vs alone, two token budgets): integers exactly; float64
    to F64_TOL times the array's size ``max |want|`` (so a tolerance never exceeds the values compared);
    an array stored as float32 also to one float32 ulp of each element (``2^-23`` relative: the two
    float64 values may round to neighbouring float32s). An all-zero array must be exactly zero."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, err_msg
    if not np.issubdtype(want.dtype, np.floating):
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
        return
    scale = float(np.abs(want.astype(np.float64)).max(initial=0.0))
    rtol = 2.0**-23 if np.float32 in (got.dtype, want.dtype) or np.float16 in (got.dtype, want.dtype) else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=F64_TOL * scale, err_msg=err_msg)


def f32_tol(layers: int, scale: float = 1.0) -> float:
    """Tolerance for comparing two float32 routes through ``layers`` layers: 64 eps32 per layer, times |scale|."""
    return 64 * float(torch.finfo(torch.float32).eps) * layers * max(1.0, abs(scale))


@pytest.fixture(params=FAMILIES)
def tiny(request: pytest.FixtureRequest) -> ModelAdapter:
    """A tiny random model of each family, in float64 (see F64_TOL)."""
    model, tok = tiny_model(request.param, seed=1)
    return ModelAdapter(model.double(), tok, f"tiny-{request.param}")


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
