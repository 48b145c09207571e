"""Colour tables for the page, taken from matplotlib so the report and the PNG figures agree."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# colour-blind-safe: viridis (perceptually uniform, sequential) for 0..1 attention;
# RdBu_r (ColorBrewer diverging, red = positive) for signed scores
PALETTES = {"sequential": "viridis", "diverging": "RdBu_r"}


@lru_cache(maxsize=1)
def palettes() -> dict[str, dict[str, str]]:
    """256 colours per palette as one hex string (6 characters a colour)."""
    import matplotlib

    out = {}
    for role, name in PALETTES.items():
        rgb = (matplotlib.colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3] * 255).round().astype(int)
        out[role] = {"name": name, "hex": "".join(f"{r:02x}{g:02x}{b:02x}" for r, g, b in rgb)}
    return out
