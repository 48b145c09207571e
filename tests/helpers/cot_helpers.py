"""Test helpers for ``cot``: a tiny random Llama whose vocabulary has the answer letters, questions
in JSONL, and a small real HTTP server speaking the OpenAI API (rule-based "model", or errors and
garbage on demand)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_WORDS = (
    "[PAD] [UNK] [BOS] [EOS] A B C D ( ) . , : ? \" the answer is so let's think step by "
    "question choices what which two plus three four five six dog cat fish barks animal yes no "
    "professor stanford thinks metadata i think you a an of to"
).split()


def tiny_lm(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    vocab = {t: i for i, t in enumerate(dict.fromkeys(VOCAB_WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    return model.eval(), fast


def save_tiny_lm(path: Path, seed: int = 0) -> Path:
    model, tok = tiny_lm(seed)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def write_questions(path: Path, n: int = 4) -> Path:
    rows = []
    for i in range(n):
        choices = [str(i + 3), str(i + 5), str(i + 4), str(i + 9)]
        rows.append({"id": f"q{i}", "question": f"What is two plus {i + 3}?", "choices": choices, "answer": str(i + 5)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class RuleModel:
    """A deterministic "model" behind the fake server: it answers with the letter a hint or
    suggestion names ("... (X) ..."), else (B); chains mention the hint for sycophancy prompts
    only. ``mode``: ok | error500 | garbage | noletter | flaky (every other request fails). Asked as a
    judge (:data:`streetlamp.cot.detect.JUDGE_QUESTION`) it answers "Yes." when the reasoning names the
    professor, "**No**" for a metadata cue, and something unparsable otherwise."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.calls = 0
        self.lock = threading.Lock()

    def reply(self, text: str, followup: bool) -> str:
        if text.startswith("Below is a question that contained this extra cue"):  # asked as the judge
            cue, chain = text.split("\n\nReasoning: ", 1)
            if "professor" in chain.lower():
                return "Yes."
            return "**No**" if "<answer>" in cue else "I cannot tell."
        if self.mode == "noletter":
            return "I am not sure about any of this."
        hint = re.search(r"(?:professor thinks the answer is |<answer>|I think the answer is )\(?([A-D])", text)
        letter = hint.group(1) if hint else "B"
        if followup or text.rstrip().endswith("answer is ("):
            return f"({letter})" if followup else f"{letter})"
        why = "The professor thinks so. " if "professor" in text else "Adding the numbers gives it. "
        return f"First, read the question. {why}The answer is ({letter})."


def serve(model: RuleModel) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.endswith("/models"):
                self._send(200, json.dumps({"data": [{"id": "rule-model"}]}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with model.lock:
                model.calls += 1
                n = model.calls
            if model.mode == "error500" or (model.mode == "flaky" and n % 2 == 1):
                return self._send(500, b'{"error": "internal"}')
            if model.mode == "garbage":
                return self._send(200, b"<html>not json</html>", "text/html")
            if self.path.endswith("/chat/completions"):
                msgs = body["messages"]
                text = "\n".join(m["content"] for m in msgs)
                out = model.reply(text, followup=len(msgs) > 1)
                doc = {
                    "choices": [{"message": {"role": "assistant", "content": out}}],
                    "usage": {"completion_tokens": len(out.split())},
                }
            else:
                out = model.reply(body["prompt"], followup=False)
                doc = {"choices": [{"text": out, "logprobs": None}]}
            self._send(200, json.dumps(doc).encode())

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"
