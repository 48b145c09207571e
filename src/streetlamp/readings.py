"""How to read a score: notes that ``explain`` prints and the report shows beside a method's scores.

* **Attention sink** (:func:`attention_sink`). Decoders park attention on one key, usually the first
  token, whatever it is (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks");
  an attention-derived score (attention, rollout, flow) inherits it: on a 3,840-token text SmolLM2's
  rollout of the explained row puts 0.998 of its mass on position 0. A key is called the sink of a
  non-negative score when it takes at least :data:`SINK_SHARE` (one half) of the score's total over the
  keys read. The reason for one half: such a key outweighs all the other keys together, so it is the
  top token whatever the text says and any top-k list starts with it; the ranking the reader wants is
  the one among the other keys, which is what the note offers: each other key's share of the mass
  left when the sink is set aside (as ``replicate --exclude-first`` leaves the first token out).
* **Position skew** (:func:`position_skew`): a signed relevance (AttnLRP) whose first or last token
  takes at least :data:`SKEW_TIMES_UNIFORM` times a uniform share of the total ``|relevance|``; see
  docs/decoder.md for how that share grows with the length of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SINK_SHARE = 0.5  # a key with at least half the mass outweighs all the others together (see the module doc)
SKEW_TIMES_UNIFORM = 5.0  # a position with 5x its uniform share of |relevance| is marked (docs/decoder.md)
ATTENTION_FAMILY = "attention"  # the methods whose scores are attention-derived (Method.family)


def attention_sink(
    scores: np.ndarray, labels: Sequence[str], keys: Sequence[int] | None = None, top: int = 3
) -> dict[str, Any] | None:
    """The sink of a non-negative score over ``keys`` (default: every position), or None.

    Returns ``{"key", "token", "share", "threshold", "set_aside": [[key, token, share of the rest], ...]}``
    (the ``top`` other keys, their shares renormalised over the keys left). None when the score has a
    negative value or no mass, when fewer than 3 keys are read (with two keys one of them always holds
    half), or when no key reaches :data:`SINK_SHARE`."""
    s = np.asarray(scores, np.float64)
    ks = list(range(len(s))) if keys is None else [int(k) for k in keys]
    if len(ks) < 3:
        return None
    v = s[ks]
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        return None
    total = float(v.sum())
    if total <= 0:
        return None
    i = int(np.argmax(v))
    share = float(v[i]) / total
    if share < SINK_SHARE:
        return None
    rest = total - float(v[i])
    others = sorted((k for k in ks if k != ks[i]), key=lambda k: -s[k])[:top]
    return {
        "key": ks[i],
        "token": labels[ks[i]],
        "share": share,
        "threshold": SINK_SHARE,
        "set_aside": [[k, labels[k], float(s[k]) / rest if rest > 0 else 0.0] for k in others],
    }


def sink_line(name: str, sink: dict[str, Any]) -> str:
    """The printed note: where the sink is, and the reading with it set aside."""
    rest = ", ".join(f"{t!r}@{k} {v:.0%}" for k, t, v in sink["set_aside"])
    return (
        f"  attention sink in {name}: {sink['token']!r}@{sink['key']} takes {sink['share']:.1%} of its mass "
        f"(at least {sink['threshold']:.0%}: more than all other tokens together); with it set aside, "
        f"the top tokens are {rest or 'none'} (shares of the rest)"
    )


def position_skew(scores: np.ndarray) -> dict[str, Any] | None:
    """The first and last positions' shares of the total ``|score|`` and their multiples of a uniform
    share, when either reaches :data:`SKEW_TIMES_UNIFORM` (None otherwise, or with fewer than 3 tokens)."""
    a = np.abs(np.asarray(scores, np.float64))
    n = len(a)
    total = float(a.sum())
    if n < 3 or not np.isfinite(total) or total <= 0:
        return None
    first, last = float(a[0]) / total, float(a[-1]) / total
    if max(first, last) * n < SKEW_TIMES_UNIFORM:
        return None
    return {
        "first": {"share": first, "times_uniform": first * n, "sign": float(np.sign(scores[0]))},
        "last": {"share": last, "times_uniform": last * n, "sign": float(np.sign(scores[-1]))},
        "threshold_times_uniform": SKEW_TIMES_UNIFORM,
        "n_tokens": n,
    }


def skew_line(name: str, skew: dict[str, Any]) -> str:
    f, last = skew["first"], skew["last"]
    return (
        f"  position skew in {name}: position 0 takes {f['share']:.1%} of the total |relevance| "
        f"({f['times_uniform']:.1f}x uniform, {'negative' if f['sign'] < 0 else 'positive'}), the last token "
        f"{last['share']:.1%} ({last['times_uniform']:.1f}x); this grows with the length of the text "
        "(docs/decoder.md): read the middle tokens' ranking, not the ends'"
    )
