"""Sentiment prompt pairs for a causal LM: a review with a positive or a negative adjective, continued by
`` good`` or `` bad``; the corrupted prompt swaps the adjective for one of the other polarity (same token
length: pairs whose adjectives tokenise to different lengths are skipped by :func:`sentiment`)."""

from __future__ import annotations

import random
from collections.abc import Callable

from ...errors import StreetlampError
from ...interventions.circuits.tasks import TaskPair

POSITIVE = ["great", "wonderful", "excellent", "amazing", "fantastic", "brilliant", "lovely", "superb", "delightful"]
NEGATIVE = ["terrible", "awful", "horrible", "boring", "dreadful", "dull", "poor", "painful", "disappointing"]
TEMPLATES = [
    "The movie was {X}. Overall, the movie was",
    "I thought the film was {X}, and my friends said it was",
    "The food at this restaurant was {X}. In short, it was",
    "The book was {X}. All in all, the book was",
]


def sentiment(n: int, seed: int = 0, n_tokens: Callable[[str], int] | None = None) -> list[TaskPair]:
    """``n`` pairs, half with a positive clean adjective (answer `` good``, wrong `` bad``), half negative (the
    reverse); ``n_tokens``: the tokenizer's length, to keep clean and corrupted prompts of equal length."""
    rng = random.Random(seed)
    out: list[TaskPair] = []
    for i in range(n):
        t = i % len(TEMPLATES)
        for _try in range(200):
            pos, neg = rng.choice(POSITIVE), rng.choice(NEGATIVE)
            clean_word, corrupt_word = (pos, neg) if i % 2 == 0 else (neg, pos)
            clean, corrupt = TEMPLATES[t].format(X=clean_word), TEMPLATES[t].format(X=corrupt_word)
            if n_tokens is None or n_tokens(clean) == n_tokens(corrupt):
                break
        else:
            raise StreetlampError("sentiment: no adjective pair of equal token length in 200 draws")
        ans, wrong = (" good", " bad") if i % 2 == 0 else (" bad", " good")
        out.append(TaskPair(clean, corrupt, ans, wrong, t))
    return out
