"""A model's weights as one hash: tests that must leave a model untouched compare it before and after."""

from __future__ import annotations

import hashlib

import torch


def weights_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
