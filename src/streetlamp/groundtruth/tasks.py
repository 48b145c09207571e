"""Generated text-classification tasks whose deciding tokens are planted and known per example.

Every example is a sequence of whitespace-separated words from one small shared vocabulary
(:data:`VOCAB`), so a word-level tokenizer maps word ``i`` of the text to token ``i + 1``
(after ``[CLS]``). ``planted`` lists the word positions that decide the label: the label is a
function of the planted words alone (tests check this by recomputing it from them).

Tasks (all binary):

* ``keyword``  -- one category word (fruit or animal) among fillers; label = its category.
* ``order``    -- the markers ``alpha`` and ``omega`` once each; label = ``alpha`` comes first.
* ``negation`` -- one sentiment word, directly preceded by ``not`` 35% of the time; label =
  sentiment XOR negated (``STRAY_NOT_P`` > 0 adds non-adjacent ``not`` distractors). Planted:
  the sentiment word, and the ``not`` right before it when present.
* ``together`` -- one colour and one creature; label 1 iff (red, cat) or (blue, dog): neither
  word alone says anything about the label (XOR), both are needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import specs
from ..errors import StreetlampError

FILLERS = (
    "the a of to and in on at with for from by as is was it this that they we you one two "
    "see go make time day way new old big small long"
).split()
FRUIT, ANIMAL = ("apple", "pear", "plum"), ("lion", "wolf", "bear")
MARKERS = ("alpha", "omega")
POSITIVE, NEGATIVE = ("good", "great", "nice"), ("bad", "awful", "poor")
NEGATOR = "not"
COLOURS, CREATURES = ("red", "blue"), ("cat", "dog")
VOCAB: tuple[str, ...] = (
    tuple(FILLERS) + FRUIT + ANIMAL + MARKERS + POSITIVE + NEGATIVE + (NEGATOR,) + COLOURS + CREATURES
)
MIN_LEN, MAX_LEN = 6, 12
NEGATED_P = 0.35  # < 0.5: the sentiment word alone is a partial cue, which avoids the XOR plateau
STRAY_NOT_P = 0.0  # > 0 adds a non-adjacent `not` distractor (harder: the 2-layer d=32 model reached 92%)


@dataclass
class Example:
    words: list[str]
    label: int
    planted: list[int]  # word positions (0-based, in `words`) that decide the label

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass(frozen=True)
class Task:
    name: str
    labels: tuple[str, str]
    description: str
    make: Callable[[np.random.Generator], Example]
    rule: Callable[[list[str]], int]  # the label from the planted words alone (in text order)

    def generate(self, n: int, seed: int) -> list[Example]:
        rng = np.random.default_rng(seed)
        return [self.make(rng) for _ in range(n)]


def _fillers(rng: np.random.Generator, n: int) -> list[str]:
    return [str(w) for w in rng.choice(FILLERS, size=n)]


def _length(rng: np.random.Generator) -> int:
    return int(rng.integers(MIN_LEN, MAX_LEN + 1))


def _place(rng: np.random.Generator, n: int, k: int) -> list[int]:
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


def _keyword(rng: np.random.Generator) -> Example:
    n = _length(rng)
    words = _fillers(rng, n)
    label = int(rng.integers(2))
    (pos,) = _place(rng, n, 1)
    words[pos] = str(rng.choice(ANIMAL if label else FRUIT))
    return Example(words, label, [pos])


def _order(rng: np.random.Generator) -> Example:
    n = _length(rng)
    words = _fillers(rng, n)
    i, j = _place(rng, n, 2)
    label = int(rng.integers(2))
    words[i], words[j] = (MARKERS[0], MARKERS[1]) if label else (MARKERS[1], MARKERS[0])
    return Example(words, label, [i, j])


def _negation(rng: np.random.Generator) -> Example:
    n = _length(rng)
    words = _fillers(rng, n)
    positive = bool(rng.integers(2))
    negated = bool(rng.random() < NEGATED_P)
    pos = int(rng.integers(1, n))  # room for a `not` before it
    words[pos] = str(rng.choice(POSITIVE if positive else NEGATIVE))
    planted = [pos]
    if negated:
        words[pos - 1] = NEGATOR
        planted = [pos - 1, pos]
    elif rng.random() < STRAY_NOT_P:  # a stray `not` that negates nothing
        far = [i for i in range(n) if i not in (pos - 1, pos)]
        words[int(rng.choice(far))] = NEGATOR
    return Example(words, int(positive != negated), planted)


def _together(rng: np.random.Generator) -> Example:
    n = _length(rng)
    words = _fillers(rng, n)
    i, j = (int(x) for x in rng.permutation(_place(rng, n, 2)))
    c, a = int(rng.integers(2)), int(rng.integers(2))
    words[i], words[j] = COLOURS[c], CREATURES[a]
    return Example(words, int(c == a), sorted([i, j]))


def _rule_keyword(p: list[str]) -> int:
    return int(p[0] in ANIMAL)


def _rule_order(p: list[str]) -> int:
    return int(p == [MARKERS[0], MARKERS[1]])


def _rule_negation(p: list[str]) -> int:
    return int((p[-1] in POSITIVE) != (p[0] == NEGATOR))


def _rule_together(p: list[str]) -> int:
    colour = next(w for w in p if w in COLOURS)
    creature = next(w for w in p if w in CREATURES)
    return int(COLOURS.index(colour) == CREATURES.index(creature))


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("keyword", ("fruit", "animal"), "one category word among fillers decides", _keyword, _rule_keyword),
        Task("order", ("omega_first", "alpha_first"), "which of two markers comes first", _order, _rule_order),
        Task(
            "negation",
            ("negative", "positive"),
            "sentiment word, flipped by an adjacent 'not'",
            _negation,
            _rule_negation,
        ),
        Task(
            "together",
            ("mismatch", "match"),
            "colour and creature together (XOR), neither alone",
            _together,
            _rule_together,
        ),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise StreetlampError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return TASKS[name]


def parse_tasks(spec: str | None) -> list[str]:
    return specs.parse_tasks(spec, TASKS)


def planted_mask(example: Example, n_tokens: int) -> np.ndarray:
    """Bool ``[n_tokens]`` over the encoded tokens ``[CLS] w0 .. w_{n-1} [SEP]``: True at planted words."""
    if n_tokens != len(example.words) + 2:
        raise StreetlampError(f"expected {len(example.words) + 2} tokens ([CLS] words [SEP]), got {n_tokens}")
    m = np.zeros(n_tokens, dtype=bool)
    m[[p + 1 for p in example.planted]] = True
    return m
