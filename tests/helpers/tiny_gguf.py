"""Write a tiny random Llama or Qwen2 as a GGUF file, the way llama.cpp's converter lays one out.

Independent of transformers' GGUF reader: tensor names, the Llama q/k row permutation for RoPE
(llama.cpp's ``permute``), the byte-level BPE vocabulary and its merges are written here from the
GGUF specification with the ``gguf`` package's writer; ``gguf.quants`` quantises (Q8_0) and gives
the reference dequantisation. Used by tests/models/test_gguf_tiny.py.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "Ġ w", "Ġ t", "Ġt he"]  # byte-level BPE merges (Ġ is the space byte)
LAYERS, HEADS, KV_HEADS, D_MODEL, D_FF, CONTEXT = 2, 4, 2, 32, 64, 128


def vocabulary() -> list[str]:
    byte_chars = bytes_to_unicode()
    merged = [m.replace(" ", "") for m in MERGES]
    return SPECIALS + [byte_chars[b] for b in range(256)] + merged


def permute_qk(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``permute``: RoPE's rotate-half pairs to interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_source(arch: str, seed: int = 0) -> PreTrainedModel:
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(vocabulary()),
        hidden_size=D_MODEL,
        intermediate_size=D_FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common)).eval()
        with torch.no_grad():  # random q/k/v biases, so their layout is checked too
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
        return model
    raise ValueError(arch)


def gguf_names(arch: str) -> dict[str, str]:
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    names["lm_head.weight"] = "output.weight"
    for i in range(LAYERS):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        names |= {
            hf + "input_layernorm.weight": gg + "attn_norm.weight",
            hf + "post_attention_layernorm.weight": gg + "ffn_norm.weight",
            hf + "self_attn.o_proj.weight": gg + "attn_output.weight",
            hf + "mlp.gate_proj.weight": gg + "ffn_gate.weight",
            hf + "mlp.up_proj.weight": gg + "ffn_up.weight",
            hf + "mlp.down_proj.weight": gg + "ffn_down.weight",
        }
        for p in "qkv":
            names[hf + f"self_attn.{p}_proj.weight"] = gg + f"attn_{p}.weight"
            if arch == "qwen2":
                names[hf + f"self_attn.{p}_proj.bias"] = gg + f"attn_{p}.bias"
    return names


def write_tiny_gguf(path: Path, arch: str = "llama", quant: str = "F32", seed: int = 0) -> PreTrainedModel:
    """Write the GGUF; return the model it should load as (weights quantised then dequantised by
    ``gguf.quants`` when ``quant`` is "Q8_0"; 1-d tensors stay float32, as llama.cpp keeps them)."""
    model = tiny_source(arch, seed)
    qtype = {"F32": gguf.GGMLQuantizationType.F32, "Q8_0": gguf.GGMLQuantizationType.Q8_0}[quant]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(D_MODEL)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(D_FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(D_MODEL // HEADS)
    w.add_rope_freq_base(float(model.config.rope_parameters["rope_theta"]))
    w.add_vocab_size(len(vocabulary()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default" if arch == "llama" else "qwen2")
    w.add_token_list(vocabulary())
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(vocabulary()) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)
    names = gguf_names(arch)
    expected = {}
    for key, tensor in model.state_dict().items():
        arr = tensor.detach().numpy().astype(np.float32)
        if key.endswith(("q_proj.weight", "k_proj.weight")) and arch == "llama":
            stored = permute_qk(arr, HEADS, HEADS if "q_proj" in key else KV_HEADS)
        else:
            stored = arr
        if arr.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(stored, qtype)
            w.add_tensor(names[key], q, raw_shape=q.shape, raw_dtype=qtype)
            # Q8_0 blocks run along a row, so un-permuting rows commutes with the round trip
            arr = gguf.quants.dequantize(q, qtype).reshape(arr.shape)
            if key.endswith(("q_proj.weight", "k_proj.weight")) and arch == "llama":
                n = HEADS if "q_proj" in key else KV_HEADS
                arr = arr.reshape(n, arr.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(tensor.shape)
        else:
            w.add_tensor(names[key], stored)
        expected[key] = torch.from_numpy(np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model.load_state_dict(expected)
    return model
