"""Circuit tasks: pairs of a clean and a corrupted prompt with the answer and the wrong answer.

Generators (each with several templates, seeded): ``ioi`` (indirect object identification, Wang et
al. 2023: the corrupted prompt swaps the subject's second mention for a third name, as their "ABC"
distribution), ``greater-than`` (Hanna et al. 2023: "from the year 1742 to the year 17", answer a
larger two-digit end, wrong a smaller one; the corrupted start year is ``..01``), ``induction`` (a
random word sequence repeated: the clean prompt's second copy predicts the next word; the corrupted
prompt's first copy is other words), ``arithmetic-addition`` / ``arithmetic-subtraction`` and ``mcqa`` (MIB's
templates, :func:`arithmetic`, :func:`mcqa`). ``read_pairs`` reads a CSV with columns ``clean``,
``corrupt``, ``answer``, ``wrong``. :func:`encode_pairs` checks each pair against the tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...data.files import read_csv
from ...errors import StreetlampError
from ...models.adapter import Inputs, ModelAdapter


@dataclass(frozen=True)
class TaskPair:
    clean: str
    corrupt: str
    answer: str  # what the clean prompt should predict (one token, leading space as the model reads it)
    wrong: str  # the competing answer
    template: int = 0


@dataclass
class PairSet:
    """Encoded pairs: clean and corrupted inputs of equal token length per pair, answer/wrong ids."""

    clean: Inputs
    corrupt: Inputs
    answer: torch.Tensor  # [n] output ids
    wrong: torch.Tensor  # [n]
    templates: list[int]

    def __len__(self) -> int:
        return len(self.clean)

    def select(self, idx: list[int] | range) -> PairSet:
        i = list(idx)
        return PairSet(
            self.clean.select(i), self.corrupt.select(i), self.answer[i], self.wrong[i], [self.templates[j] for j in i]
        )


NAMES = ["Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Kate", "Mark"]
PLACES = ["store", "park", "school", "office"]
OBJECTS = ["drink", "book", "ball", "gift"]
IOI_TEMPLATES = [
    "When {A} and {B} went to the {P}, {S} gave a {O} to",
    "After {A} and {B} went to the {P}, {S} gave a {O} to",
    "Then, {A} and {B} had a long day at the {P}. {S} gave a {O} to",
    "While {A} and {B} were at the {P}, {S} handed a {O} to",
]


def ioi(n: int, seed: int = 0, names: list[str] | None = None, templates: list[str] | None = None) -> list[TaskPair]:
    """IOI pairs: clean ``... A and B ..., B gave ... to`` (answer `` A``, wrong `` B``); corrupt: the
    second B replaced by a third name C (the model can no longer tell who the indirect object is)."""
    names, templates = names or NAMES, templates or IOI_TEMPLATES
    if len(set(names)) < 3:
        raise StreetlampError("ioi needs at least three different names")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = i % len(templates)
        a, b, c = rng.sample(names, 3)
        fill = dict(A=a, B=b, P=rng.choice(PLACES), O=rng.choice(OBJECTS))
        if rng.random() < 0.5:  # both name orders (ABB and BAB)
            fill["A"], fill["B"] = b, a
            a, b = b, a
        clean = templates[t].format(S=b, **fill)
        corrupt = templates[t].format(S=c, **fill)
        out.append(TaskPair(clean, corrupt, " " + a, " " + b, t))
    return out


GT_TEMPLATES = [
    "The war lasted from the year {C}{Y} to the year {C}",
    "The reign lasted from the year {C}{Y} to the year {C}",
    "The expedition lasted from the year {C}{Y} to the year {C}",
]


def greater_than(n: int, seed: int = 0, century: int = 17, two_digit: bool = True) -> list[TaskPair]:
    """Greater-than pairs. ``two_digit``: the answer is a two-digit end year (GPT-2 reads ``1742`` as
    ``17`` + ``42``); otherwise its first digit (tokenizers that split numbers into digits). Answer: a
    later end (start + 1 .. +5 years or decades), wrong: an earlier one; corrupt start: ``{C}01``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = i % len(GT_TEMPLATES)
        if two_digit:
            y = rng.randint(12, 89)
            ans, wrong = f"{y + rng.randint(1, 9):02d}", f"{y - rng.randint(1, 9):02d}"
            ys = f"{y:02d}"
        else:
            d = rng.randint(2, 8)
            ans, wrong = str(rng.randint(d + 1, 9)), str(rng.randint(0, d - 1))
            ys = f"{d}{rng.randint(0, 9)}"
        clean = GT_TEMPLATES[t].format(C=century, Y=ys)
        corrupt = GT_TEMPLATES[t].format(C=century, Y="01")
        out.append(TaskPair(clean, corrupt, ans, wrong, t))
    return out


INDUCTION_WORDS = "cat dog tree house river stone cloud bird lamp door chair apple music paper glass field".split()
INDUCTION_TEMPLATES = ["{X} {Y}", "Notes: {X} . Again: {Y}", "List {X} ; list {Y}"]


def induction(n: int, seed: int = 0, length: int = 5, words: list[str] | None = None) -> list[TaskPair]:
    """Induction pairs: clean ``w1 .. wL`` then ``w1 .. w(L-1)`` (answer `` wL``); corrupt: the first
    copy replaced by other words (wrong: the corrupted copy's last word)."""
    words = words or INDUCTION_WORDS
    if len(set(words)) < 2 * length:
        raise StreetlampError(f"induction needs at least {2 * length} different words")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = i % len(INDUCTION_TEMPLATES)
        w = rng.sample(words, 2 * length)
        seq, other = w[:length], w[length:]
        tpl = INDUCTION_TEMPLATES[t]
        clean = tpl.format(X=" ".join(seq), Y=" ".join(seq[:-1]))
        corrupt = tpl.format(X=" ".join(other), Y=" ".join(seq[:-1]))
        out.append(TaskPair(clean, corrupt, " " + seq[-1], " " + other[-1], t))
    return out


# MIB's arithmetic prompt (its causal-variable track's ``two_digit_addition_task``: ``raw_input``), the
# operator word swapped for subtraction; the answer is the result with no leading space (the prompt ends in one)
ARITH_TEMPLATE = "Q: How much is {a} {op} {b}? A: "


def arithmetic(
    n: int, seed: int = 0, op: str = "+", digits: int = 2, keep: Callable[[TaskPair], bool] | None = None
) -> list[TaskPair]:
    """MIB-style arithmetic pairs: ``digits``-digit operands (subtraction: first >= second), answer the
    result; corrupt: MIB's ``random_counterfactual``, another random problem with another result (wrong:
    its result). ``keep``: a pair is drawn again until it passes (MIB's filter: one-token results, and
    here equal token lengths), at most 200 draws a pair."""
    if op not in ("+", "-"):
        raise StreetlampError(f"arithmetic operator {op!r}: use + or -")
    word = "plus" if op == "+" else "minus"
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    rng = random.Random(seed)

    def draw() -> tuple[int, int, int]:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if op == "-" and a < b:
            a, b = b, a
        return a, b, a + b if op == "+" else a - b

    out = []
    for _ in range(n):
        for _try in range(200):
            a, b, r = draw()
            c, d, r2 = draw()
            if r2 == r:
                continue
            p = TaskPair(
                ARITH_TEMPLATE.format(a=a, op=word, b=b), ARITH_TEMPLATE.format(a=c, op=word, b=d), str(r), str(r2)
            )
            if keep is None or keep(p):
                out.append(p)
                break
        else:
            raise StreetlampError(
                f"arithmetic: no {digits}-digit problem passes the tokenizer's check (one-token results of "
                "equal-length prompts) in 200 draws"
            )
    return out


# MCQA in MIB's copycolors template (its causal-variable track's simple_MCQA: a colour statement, the
# question, four lettered choices, "Answer:"); the objects and colours here are streetlamp's own list
MCQA_COLORS = ["red", "yellow", "green", "blue", "orange", "white", "black", "brown", "purple", "pink"]
MCQA_OBJECTS = [
    ("banana", "yellow"), ("lemon", "yellow"), ("strawberry", "red"), ("tomato", "red"), ("grass", "green"),
    ("lime", "green"), ("sky", "blue"), ("ocean", "blue"), ("carrot", "orange"), ("pumpkin", "orange"),
    ("snow", "white"), ("milk", "white"), ("coal", "black"), ("crow", "black"), ("chocolate", "brown"),
    ("bear", "brown"), ("plum", "purple"), ("grape", "purple"), ("flamingo", "pink"), ("pig", "pink"),
]  # fmt: skip
MCQA_TEMPLATE = "The {obj} is {color}. What color is the {obj}?\n{choices}\nAnswer:"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def mcqa(n: int, seed: int = 0, n_choices: int = 4) -> list[TaskPair]:
    """MCQA pairs in MIB's template: answer the letter of the colour stated (`` X``: the token after
    ``Answer:``); corrupt: MIB's ``symbol_counterfactual``, the same question and choices under other
    letters, so the answer's letter changes (wrong: the corrupted prompt's letter at the answer's place).
    Template index: the answer's position."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        obj, color = rng.choice(MCQA_OBJECTS)
        choices = [color] + rng.sample([c for c in MCQA_COLORS if c != color], n_choices - 1)
        rng.shuffle(choices)
        pos = choices.index(color)
        sym = list(LETTERS[:n_choices])
        other = rng.sample([x for x in LETTERS if x not in sym], n_choices)

        def fill(s: list[str]) -> str:
            body = "\n".join(f"{x}. {c}" for x, c in zip(s, choices))
            return MCQA_TEMPLATE.format(obj=obj, color=color, choices=body)

        out.append(TaskPair(fill(sym), fill(other), " " + sym[pos], " " + other[pos], pos))
    return out


TASKS = {
    "ioi": ioi,
    "greater-than": greater_than,
    "induction": induction,
    "arithmetic-addition": arithmetic,
    "arithmetic-subtraction": arithmetic,
    "mcqa": mcqa,
}


def read_pairs(path: str | Path) -> list[TaskPair]:
    """Pairs from a CSV with columns ``clean``, ``corrupt``, ``answer``, ``wrong`` (optional ``template``)."""
    p = Path(path)
    header, rows = read_csv(p, "task file")  # regular UTF-8 files only, a byte-order mark dropped
    cols = set(header)
    need = {"clean", "corrupt", "answer", "wrong"}
    if not rows or not need <= cols:
        raise StreetlampError(f"{p}: need a header with columns clean,corrupt,answer,wrong and at least one row")
    out = []
    for i, r in enumerate(rows):
        if any(not (r.get(c) or "").strip() for c in need):
            raise StreetlampError(f"{p}: row {i + 1} has an empty clean, corrupt, answer or wrong")
        t = r.get("template") or "0"
        if not t.isdigit():
            raise StreetlampError(f"{p}: row {i + 1}: template must be a whole number, not {t!r}")
        out.append(TaskPair(r["clean"], r["corrupt"], r["answer"], r["wrong"], int(t)))
    return out


def _one_token(adapter: ModelAdapter, s: str, i: int, what: str) -> int:
    if adapter.kind.labels:
        return adapter.parse_label(s.strip())
    ids = adapter.tokenizer(s, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise StreetlampError(f"pair {i}: the {what} {s!r} is {len(ids)} tokens for this tokenizer; give one token")
    return int(ids[0])


def encode_pairs(adapter: ModelAdapter, pairs: list[TaskPair]) -> PairSet:
    """Tokenise and check: each pair's clean and corrupted prompts have the same token length, the
    answers are one token each (a class name for a classifier) and differ."""
    if not pairs:
        raise StreetlampError("no pairs given")
    clean = adapter.encode([p.clean for p in pairs])
    corrupt = adapter.encode([p.corrupt for p in pairs])
    for i, (n, m) in enumerate(zip(clean.lengths, corrupt.lengths)):
        if n != m:
            raise StreetlampError(
                f"pair {i}: the clean prompt has {n} tokens and the corrupted one {m}; edges are patched position "
                f"by position, so both must have the same token length ({pairs[i].clean!r} / {pairs[i].corrupt!r})"
            )
    ans = [_one_token(adapter, p.answer, i, "answer") for i, p in enumerate(pairs)]
    wrong = [_one_token(adapter, p.wrong, i, "wrong answer") for i, p in enumerate(pairs)]
    for i, (a, w) in enumerate(zip(ans, wrong)):
        if a == w:
            raise StreetlampError(f"pair {i}: the answer and the wrong answer are the same token")
    return PairSet(clean, corrupt, torch.tensor(ans), torch.tensor(wrong), [p.template for p in pairs])


# -- resampled corrupted inputs ------------------------------------------------------------------------
def _swap_word(clean: str, corrupt: str, pool: list[str], rng: random.Random) -> str | None:
    """``corrupt`` with its one word that differs from ``clean`` redrawn from ``pool`` (words of ``clean``
    excluded, punctuation kept); None when the prompts differ in other than one word."""
    wc, wk = clean.split(" "), corrupt.split(" ")
    diff = [i for i, (x, y) in enumerate(zip(wc, wk)) if x != y]
    if len(wc) != len(wk) or len(diff) != 1:
        return None
    i = diff[0]
    word = wk[i]
    core = word.rstrip(",.;:")
    used = {w.rstrip(",.;:") for w in wc}
    choices = [n for n in pool if n not in used and n != core] or [core]
    wk[i] = rng.choice(choices) + word[len(core) :]
    return " ".join(wk)


def resample_corrupt(task: str, pairs: list[TaskPair], seed: int) -> list[TaskPair]:
    """The same clean prompts, answers and wrong answers (so the metric and m(model) stay fixed) with their
    corruption drawn afresh from the task's corrupted distribution:
    ``ioi``: the subject's second mention replaced by another name absent from the clean prompt;
    ``induction``: the first copy replaced by other words absent from the repeated sequence;
    ``greater-than``: the start year ``{C}0y`` with ``y`` uniform in
    ``0 .. min(9, wrong - 1)`` (both answers stay later than it). Any other task (a CSV): each pair's
    corrupted prompt drawn from the corrupted prompts of the pairs with its template (a permutation
    within each template; the token lengths are checked when the pairs are encoded)."""
    rng = random.Random(seed)
    out: list[TaskPair] = []
    if task == "ioi":
        for p in pairs:
            c = _swap_word(p.clean, p.corrupt, NAMES, rng)
            out.append(TaskPair(p.clean, c if c is not None else p.corrupt, p.answer, p.wrong, p.template))
        return out
    if task == "induction":
        for p in pairs:
            tpl = INDUCTION_TEMPLATES[p.template % len(INDUCTION_TEMPLATES)]
            wc, wk = p.clean.split(), p.corrupt.split()
            n = sum(x != y for x, y in zip(wc, wk))  # the first copy's length
            seq = wc[len(wc) - (n - 1) :] + [p.answer.strip()] if n > 1 else [p.answer.strip()]
            other = rng.sample([w for w in INDUCTION_WORDS if w not in seq], n)
            corrupt = tpl.format(X=" ".join(other), Y=" ".join(seq[:-1]))
            out.append(TaskPair(p.clean, corrupt, p.answer, p.wrong, p.template))
        return out
    if task == "greater-than":
        for p in pairs:
            old = p.corrupt.split()
            i = next(j for j, (u, v) in enumerate(zip(p.clean.split(), old)) if u != v)
            hi = min(9, int(p.wrong) - 1) if p.wrong.strip().isdigit() else 1
            old[i] = old[i][:-2] + f"0{rng.randint(0, max(0, hi))}"
            out.append(TaskPair(p.clean, " ".join(old), p.answer, p.wrong, p.template))
        return out
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(p.template, []).append(i)
    take = list(range(len(pairs)))
    for rows in groups.values():
        perm = rows[:]
        rng.shuffle(perm)
        for i, j in zip(rows, perm):
            take[i] = j
    return [TaskPair(p.clean, pairs[take[i]].corrupt, p.answer, p.wrong, p.template) for i, p in enumerate(pairs)]
