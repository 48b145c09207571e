"""Arrays made compact for the page: exact float32 for small arrays, fixed-point for large 0..1 ones.

Every encoded array is split into chunks along its first axis (a layer for attention) so the page
decodes only what it shows. A chunk is the array's bytes, byte-shuffled (all first bytes, then all
second bytes ... as Blosc does: the high bytes of nearby numbers repeat, and deflate sees it),
deflate-compressed with zlib (decoded in the page by ``DecompressionStream('deflate')``) and
base64-encoded, so it can sit in a ``<script type="application/octet-stream">`` element: base64
has no ``<``, so the data can never close its script element.

Codecs (``codec`` in the index; ``v`` is the stored value, ``q`` the integer in the file):

* ``f32``: IEEE float32, exact for float32 arrays (float64 arrays lose digits past the 7th).
* ``u16``: ``v = q / 65535`` for arrays inside [0, 1]: absolute error at most 7.7e-6.
* ``u12``: ``v = q / 4095`` (stored in 16 bits) for larger [0, 1] arrays: error at most 1.3e-4; the
  low byte of a 16-bit value is noise that deflate cannot shrink, and 12 bits keep the explain report
  of a 128-token text on a 6 x 12 model under 2 MB;
* ``u8``:  ``v = q / 255`` for [0, 1] arrays too large for that: absolute error at most 0.002.

The page states the error beside every number it shows from a fixed-point array.
Identical chunks (the attention method stores the same tensor as the run's ``attention``) travel once.
"""

from __future__ import annotations

import base64
import hashlib
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

SMALL = 1 << 16  # arrays up to this many values travel as exact float32
U16_BUDGET = 1 << 19  # [0,1] arrays up to this many values travel at 16 bits,
U12_BUDGET = 1 << 23  # up to this many at 12 bits, larger ones at 8 bits

CODECS = {"f32": ("<f4", None), "u16": ("<u2", 65535), "u12": ("<u2", 4095), "u8": ("u1", 255)}


@dataclass
class Packed:
    """The chunks of every packed array, and the index the page reads."""

    index: dict[str, dict] = field(default_factory=dict)
    blobs: list[str] = field(default_factory=list)
    seen: dict[bytes, int] = field(default_factory=dict)

    def add(self, name: str, a: np.ndarray, *, codec: str | None = None, level: int = 6) -> None:
        a = np.asarray(a)
        self.add_chunks(
            name,
            list(a.shape),
            lambda i: a[i] if a.ndim >= 3 else a,
            a.shape[0] if a.ndim >= 3 else 1,
            codec or codec_of(a),
            level,
        )

    def add_chunks(self, name: str, shape: list[int], chunk, n: int, codec: str, level: int = 6) -> None:
        """``chunk(i)`` returns the i-th of ``n`` pieces along the first axis (the whole array when n=1)."""
        dtype, scale = CODECS[codec]
        ids = []
        for i in range(n):
            c = np.asarray(chunk(i))
            if c.dtype == bool:
                c = c.astype(np.uint8)
            q = (
                c.astype(np.float32)
                if scale is None
                else np.rint(np.clip(c.astype(np.float64), 0.0, 1.0) * scale).astype(dtype)
            )
            q = q.astype(np.dtype(dtype))
            raw = np.ascontiguousarray(q).view(np.uint8).reshape(-1, q.dtype.itemsize).T.tobytes()
            key = hashlib.sha256(codec.encode() + raw).digest()
            if key not in self.seen:
                self.blobs.append(base64.b64encode(zlib.compress(raw, level)).decode("ascii"))
                self.seen[key] = len(self.blobs) - 1
            ids.append(self.seen[key])
        self.index[name] = {
            "shape": list(shape),
            "codec": codec,
            "chunks": ids,
            "max_error": 0.0 if scale is None else 0.5 / scale,
        }


def choose_codec(size: int, floating: bool, lo: float, hi: float) -> str:
    """float32 unless the array is large: then fixed point when every value lies in [0, 1]."""
    if size <= SMALL or not floating or not (math.isfinite(lo) and math.isfinite(hi) and lo >= 0.0 and hi <= 1.0):
        return "f32"
    return "u16" if size <= U16_BUDGET else "u12" if size <= U12_BUDGET else "u8"


def codec_of(a: np.ndarray) -> str:
    if a.size <= SMALL or not np.issubdtype(a.dtype, np.floating):
        return "f32"
    return choose_codec(a.size, True, float(np.min(a)), float(np.max(a)))


def unpack(index: dict, blobs: list[str]) -> np.ndarray:
    """What the page decodes, in Python (the tests compare the two)."""
    dtype, scale = CODECS[index["codec"]]
    parts = []
    for i in index["chunks"]:
        raw = zlib.decompress(base64.b64decode(blobs[i]))
        item = np.dtype(dtype).itemsize
        parts.append(np.frombuffer(np.frombuffer(raw, np.uint8).reshape(item, -1).T.tobytes(), dtype))
    q = np.concatenate(parts).reshape(index["shape"])
    return q.astype(np.float64) if scale is None else q.astype(np.float64) / scale
