"""Two engines behind one interface: the local model (streetlamp's adapter) and any
OpenAI-compatible server (``/v1/chat/completions`` or ``/v1/completions``).

``generate(prompts, max_new_tokens, seeds)``: a continuation of each prompt (the chain of thought);
``choose(prompts, letters)``: the answer letter after each prompt (which ends with the answer cue
``So the answer is (``), with the letters' probabilities where the engine gives them.

Failures of the *model* (no parsable letter) come back as ``Choice(letter=None)`` and are counted by
the runner; failures of the *server* (unreachable, HTTP errors after the retries, answers that are
not OpenAI JSON, the request budget spent) raise :class:`StreetlampError` with one line, so the run
stops with everything already stored kept and a rerun resumes.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import StreetlampError
from ..extras import require
from .prompts import Prompt

CHAT_FOLLOWUP = "So what is the answer? Reply with the letter of one choice in parentheses, e.g. (A), and nothing else."
_LETTER_AT_START = re.compile(r"^\s*\(?([A-Z])\)?(?![a-z])")
_LETTER_ANYWHERE = re.compile(r"\(([A-Z])\)")


@dataclass
class Generation:
    text: str
    n_tokens: int | None = None


@dataclass
class Choice:
    letter: str | None  # None: no parsable answer among the letters
    probs: dict[str, float] | None = None  # P(letter) where the engine gives (log)probabilities
    raw: str = ""
    letter_mass: float | None = None  # sum of the letters' probabilities (local engine)


class Engine(Protocol):
    name: str

    def describe(self) -> dict: ...
    def generate(self, prompts: list[Prompt], max_new_tokens: int, seeds: list[int]) -> list[Generation]: ...
    def choose(self, prompts: list[Prompt], letters: list[str]) -> list[Choice]: ...
    def can_continue(self) -> bool: ...
    def count_tokens(self, text: str) -> int: ...


def parse_letter(text: str, letters: str, after_cue: bool) -> str | None:
    """The answer letter in a model's reply: right at the start after the cue ``(``, else the first
    ``(X)``; only letters of the question's choices count."""
    m = _LETTER_AT_START.match(text)
    if m and m.group(1) in letters:
        return m.group(1)
    if not after_cue or not m:
        for m2 in _LETTER_ANYWHERE.finditer(text):
            if m2.group(1) in letters:
                return m2.group(1)
    return None


# -- local ---------------------------------------------------------------------------------------
class LocalEngine:
    """Generation with the adapter's Hugging Face model (KV cache), greedy at ``temperature == 0``,
    else sampled with ``torch.manual_seed(seed)`` per prompt (reproducible on one machine); the
    answer letter is the argmax of the next-token logits over the choices' letters."""

    name = "local"

    def __init__(self, adapter: Any, temperature: float = 0.0, top_p: float = 1.0) -> None:
        if not adapter.kind.causal:
            raise StreetlampError(f"cot needs a causal LM; {adapter.name} is a {adapter.kind}")
        self.adapter = adapter
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        tok = adapter.tokenizer
        self.chat = bool(getattr(tok, "chat_template", None))
        self._letter_ids: dict[str, int] = {}

    def describe(self) -> dict:
        return {
            "engine": "local",
            "model": self.adapter.name,
            "source": self.adapter.source,
            "decoding": "greedy" if self.temperature == 0 else "sampling",
            "temperature": self.temperature,
            "top_p": self.top_p,
            "chat_template": self.chat,
        }

    def can_continue(self) -> bool:
        return True

    def count_tokens(self, text: str) -> int:
        return len(self.adapter.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, p: Prompt) -> str:
        tok = self.adapter.tokenizer
        if self.chat:
            head = tok.apply_chat_template(
                [{"role": "user", "content": p.user}], tokenize=False, add_generation_prompt=True
            )
        else:
            head = f"User: {p.user}\n\nAssistant:"
        return head + p.assistant

    def ids(self, p: Prompt) -> list[int]:
        ids = self.adapter.tokenizer(self.render(p), add_special_tokens=False)["input_ids"]
        if len(ids) >= self.adapter.max_positions:
            raise StreetlampError(f"prompt of {len(ids)} tokens exceeds the model's {self.adapter.max_positions}")
        return list(ids)

    def generate(self, prompts: list[Prompt], max_new_tokens: int, seeds: list[int]) -> list[Generation]:
        import torch

        out = []
        model = self.adapter.hf_model
        tok = self.adapter.tokenizer
        for p, seed in zip(prompts, seeds):
            ids = torch.tensor([self.ids(p)], device=self.adapter.device)
            kw: dict[str, Any] = {"do_sample": False}
            if self.temperature > 0:
                torch.manual_seed(seed)
                kw = {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}
            with torch.no_grad():
                gen = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                    stopping_criteria=[_AnswerStop(tok, ids.shape[1])],
                    top_k=None,
                    **kw,
                )
            new = gen[0, ids.shape[1] :].tolist()
            out.append(Generation(tok.decode(new, skip_special_tokens=True), len(new)))
        return out

    def letter_id(self, letter: str) -> int:
        if letter not in self._letter_ids:
            self._letter_ids[letter] = self.adapter.token_id(letter)
        return self._letter_ids[letter]

    def letter_logits(self, p: Prompt, letters: str) -> tuple[Any, list[int]]:
        """Next-token log-probabilities ``[vocab]`` after the prompt, and the letters' ids."""
        import torch

        from ..methods.gradient import ids_inputs

        ids = torch.tensor(self.ids(p))
        logits = self.adapter.forward(ids_inputs(self.adapter, ids)).logits[0].double()
        return torch.log_softmax(logits, -1), [self.letter_id(c) for c in letters]

    def choose(self, prompts: list[Prompt], letters: list[str]) -> list[Choice]:
        out = []
        for p, ls in zip(prompts, letters):
            logp, lid = self.letter_logits(p, ls)
            probs = {c: float(logp[i].exp()) for c, i in zip(ls, lid)}
            best = max(probs, key=lambda c: probs[c])
            top = int(logp.argmax())
            out.append(Choice(best, probs, self.adapter.tokenizer.decode([top]), sum(probs.values())))
        return out


class _AnswerStop:
    """Stop generating once the chain states its answer ("the answer is (X)")."""

    def __init__(self, tok: Any, start: int) -> None:
        self.tok, self.start = tok, start

    def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
        import torch

        text = self.tok.decode(input_ids[0, self.start :][-12:], skip_special_tokens=True)
        done = bool(re.search(r"answer is:? \(?[A-Z]\)", text))
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


# -- OpenAI-compatible HTTP ----------------------------------------------------------------------
@dataclass
class HttpSettings:
    endpoint: str  # base URL ending in /v1
    model: str | None = None
    api: str = "chat"  # chat | completions
    temperature: float = 0.0
    concurrency: int = 4
    retries: int = 4
    backoff: float = 0.5  # seconds, doubled per retry (with jitter)
    timeout: float = 60.0
    budget: int | None = None  # most requests this process may send
    api_key: str | None = None  # from $OPENAI_API_KEY; never recorded

    def record(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "api_key"}


class BudgetSpent(StreetlampError):
    pass


@dataclass
class HttpEngine:
    s: HttpSettings
    sent: int = 0
    retried: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    name = "http"

    def __post_init__(self) -> None:
        require("cot", "httpx")
        import httpx

        if self.s.api not in ("chat", "completions"):
            raise StreetlampError("--api must be chat or completions")
        if not re.match(r"^https?://", self.s.endpoint):
            raise StreetlampError(
                f"--endpoint {self.s.endpoint!r} is not an http(s) URL (e.g. http://127.0.0.1:8080/v1)"
            )
        self.base = self.s.endpoint.rstrip("/")
        headers = {"Authorization": f"Bearer {self.s.api_key}"} if self.s.api_key else {}
        self.client = httpx.Client(
            timeout=self.s.timeout, headers=headers, limits=httpx.Limits(max_connections=max(1, self.s.concurrency))
        )

    def describe(self) -> dict:
        return {"engine": "http", **self.s.record(), "requests_sent": self.sent, "retries_used": self.retried}

    def can_continue(self) -> bool:
        return self.s.api == "completions"

    def count_tokens(self, text: str) -> int:
        """Words, as a stand-in for the server's tokens (the tokenizer is not known here)."""
        return len(text.split())

    def probe(self) -> str:
        """Reach the server once (``GET /models``); returns the model name to use."""
        import httpx

        try:
            r = self.client.get(f"{self.base}/models", timeout=min(10.0, self.s.timeout))
        except httpx.HTTPError as e:
            raise StreetlampError(f"cannot reach {self.base}: {_why(e)}") from None
        if r.status_code >= 400:
            if self.s.model:  # some servers lack /models; the first real request will tell
                return self.s.model
            raise StreetlampError(f"{self.base}/models answered HTTP {r.status_code}; give --served-model NAME")
        if self.s.model:
            return self.s.model
        try:
            names = [m["id"] for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise StreetlampError(
                f"{self.base}/models did not answer an OpenAI model list; give --served-model NAME"
            ) from None
        if len(names) != 1:
            raise StreetlampError(
                f"{self.base} serves {len(names)} models ({', '.join(names[:5])}); choose one with --served-model"
            )
        self.s.model = names[0]
        return names[0]

    def _post(self, path: str, body: dict) -> dict:
        import httpx

        with self._lock:
            if self.s.budget is not None and self.sent >= self.s.budget:
                raise BudgetSpent(
                    f"request budget of {self.s.budget} spent; what is done is stored: rerun "
                    "(with a new --budget) to continue"
                )
            self.sent += 1
        url = f"{self.base}{path}"
        last = ""
        for attempt in range(self.s.retries + 1):
            if attempt:
                with self._lock:
                    self.retried += 1
                time.sleep(self.s.backoff * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
            try:
                r = self.client.post(url, json=body)
            except httpx.TimeoutException:
                last = f"no answer within {self.s.timeout:g} s"
                continue
            except httpx.HTTPError as e:
                last = _why(e)
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last = f"HTTP {r.status_code} {_snippet(r.text)}"
                continue
            if r.status_code >= 400:
                raise StreetlampError(f"{url} refused the request: HTTP {r.status_code} {_snippet(r.text)}")
            try:
                doc = r.json()
                doc["choices"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise StreetlampError(
                    f"{url} answered something that is not an OpenAI completion: {_snippet(r.text)}"
                ) from None
            return doc
        raise StreetlampError(
            f"{url} failed {self.s.retries + 1} times (last: {last}); what is done is stored: rerun to continue"
        )

    def _map(self, fn: Any, items: list) -> list:
        if self.s.concurrency <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(self.s.concurrency) as ex:
            return list(ex.map(fn, items))

    def _messages(self, p: Prompt, followup: bool) -> list[dict]:
        msgs = [{"role": "user", "content": p.user}]
        if followup:
            reply = p.assistant
            cue = "So the answer is ("
            if reply.endswith(cue):
                reply = reply[: -len(cue)]
            msgs += [{"role": "assistant", "content": reply.strip()}, {"role": "user", "content": CHAT_FOLLOWUP}]
        return msgs

    def _text_prompt(self, p: Prompt) -> str:
        return f"User: {p.user}\n\nAssistant: {p.assistant}"

    def generate(self, prompts: list[Prompt], max_new_tokens: int, seeds: list[int]) -> list[Generation]:
        def one(args: tuple[Prompt, int]) -> Generation:
            p, seed = args
            common = {
                "model": self.s.model,
                "max_tokens": max_new_tokens,
                "temperature": self.s.temperature,
                "seed": seed,
            }
            if self.s.api == "chat":
                doc = self._post("/chat/completions", {**common, "messages": self._messages(p, False)})
                text = _field(doc, ("message", "content"))
            else:
                doc = self._post(
                    "/completions", {**common, "prompt": self._text_prompt(p), "stop": ["\nUser:", "\n\nQuestion:"]}
                )
                text = _field(doc, ("text",))
            usage = doc.get("usage") or {}
            return Generation(text, usage.get("completion_tokens") if isinstance(usage, dict) else None)

        return self._map(one, list(zip(prompts, seeds)))

    def choose(self, prompts: list[Prompt], letters: list[str]) -> list[Choice]:
        def one(args: tuple[Prompt, str]) -> Choice:
            p, ls = args
            common = {"model": self.s.model, "temperature": 0.0}
            if self.s.api == "chat":
                doc = self._post(
                    "/chat/completions",
                    {
                        **common,
                        "messages": self._messages(p, True),
                        "max_tokens": 8,
                        "logprobs": True,
                        "top_logprobs": 5,
                    },
                )
                text = _field(doc, ("message", "content"))
                probs = _chat_letter_probs(doc, ls)
                return Choice(parse_letter(text, ls, after_cue=False), probs, text)
            doc = self._post("/completions", {**common, "prompt": self._text_prompt(p), "max_tokens": 2, "logprobs": 5})
            text = _field(doc, ("text",))
            return Choice(parse_letter(text, ls, after_cue=True), _completion_letter_probs(doc, ls), text)

        return self._map(one, list(zip(prompts, letters)))


def _why(e: Exception) -> str:
    msg = str(e) or type(e).__name__
    return msg.splitlines()[0][:200]


def _snippet(text: str) -> str:
    t = " ".join(str(text).split())
    return repr(t[:120] + ("..." if len(t) > 120 else ""))


def _field(doc: dict, path: tuple[str, ...]) -> str:
    x: Any = doc["choices"][0]
    try:
        for k in path:
            x = x[k]
    except (KeyError, TypeError):
        raise StreetlampError(f"server answer lacks choices[0].{'.'.join(path)}: {_snippet(json.dumps(doc))}") from None
    if x is None:
        return ""
    if not isinstance(x, str):
        raise StreetlampError(f"server answer's choices[0].{'.'.join(path)} is not text: {_snippet(json.dumps(doc))}")
    return x


def _letters_from_top(top: dict[str, float], letters: str) -> dict[str, float] | None:
    import math

    out: dict[str, float] = {}
    for tok, lp in top.items():
        t = tok.strip().strip("(")
        if t in letters and isinstance(lp, (int, float)):
            out[t] = out.get(t, 0.0) + math.exp(lp)
    return out or None


def _completion_letter_probs(doc: dict, letters: str) -> dict[str, float] | None:
    try:
        top = doc["choices"][0]["logprobs"]["top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        return None
    return _letters_from_top(top, letters) if isinstance(top, dict) else None


def _chat_letter_probs(doc: dict, letters: str) -> dict[str, float] | None:
    try:
        content = doc["choices"][0]["logprobs"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(content, list):
        return None
    for entry in content[:3]:  # the letter is the first or second token ("(" "A" ")")
        try:
            top = {t["token"]: t["logprob"] for t in entry.get("top_logprobs", [])}
        except (KeyError, TypeError, AttributeError):
            return None
        got = _letters_from_top(top, letters)
        if got:
            return got
    return None
