"""Sentiment counterfactual pairs for ``atlas --compare-task`` on a classifier (issue 25 item 7's third question).

From the shipped ``movies`` sentences, each one that holds a word of ``SWAP`` becomes a pair: the clean
sentence, the corrupted one with that word (its first occurrence) replaced by its antonym, the answer the
sentence's gold label and the wrong answer the other class. Kept only where the two tokenise to the same
length for the model (the comparison patches position by position).

    .venv/bin/python scripts/atlas_sentiment_pairs.py OUT.csv [--model minilm-sentiment] [--n 32]
"""

from __future__ import annotations

import argparse
import csv
import re

SWAP = {
    "good": "bad",
    "bad": "good",
    "great": "awful",
    "awful": "great",
    "best": "worst",
    "worst": "best",
    "love": "hate",
    "hate": "love",
    "loved": "hated",
    "hated": "loved",
    "funny": "dull",
    "dull": "funny",
    "beautiful": "ugly",
    "ugly": "beautiful",
    "brilliant": "terrible",
    "terrible": "brilliant",
    "boring": "exciting",
    "exciting": "boring",
    "fun": "tedious",
    "wonderful": "horrible",
    "horrible": "wonderful",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="minilm-sentiment")
    ap.add_argument("--n", type=int, default=32)
    args = ap.parse_args()
    import streetlamp
    from streetlamp.data import load_dataset

    a = streetlamp.load(args.model)
    names = [str(v) for _, v in sorted(a.hf_model.config.id2label.items())]
    rows = []
    for ex in load_dataset("movies").examples:
        m = next((m for m in re.finditer(r"[A-Za-z]+", ex.text) if m.group().lower() in SWAP), None)
        if m is None:
            continue
        new = SWAP[m.group().lower()]
        corrupt = ex.text[: m.start()] + new + ex.text[m.end() :]
        if len(a.tokenizer(ex.text)["input_ids"]) != len(a.tokenizer(corrupt)["input_ids"]):
            continue
        gold = a.parse_label(str(ex.label))
        rows.append((ex.text, corrupt, names[gold], names[1 - gold]))
        if len(rows) == args.n:
            break
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["clean", "corrupt", "answer", "wrong"])
        w.writerows(rows)
    print(f"wrote {len(rows)} pairs to {args.out} (labels {names})")


if __name__ == "__main__":
    main()
