"""Write a transformers causal LM (Llama or Gemma 3 text) as a GGUF file that llama.cpp loads.

The llama.cpp executor reads GGUF only. The gemma-3-270m profile ships one; the demo
profile (and the executor tests' tiny random models) are transformers folders, written
here once so both executors can run the same weights. Only what llama.cpp's own
converter (``convert_hf_to_gguf.py``) does for these two architectures is done:

  Llama    q/k projections permuted from HF's rotate-half RoPE layout to llama.cpp's
           interleaved one (llama.cpp's LLAMA architecture uses ``LLAMA_ROPE_TYPE_NORM``);
  Gemma 3  RMSNorm weights shifted by +1 (HF computes ``x * (1 + w)``, llama.cpp ``x * w``);
           the sliding window and the local layers' RoPE base written as keys.

Weights are written as F32 (exact) or F16. The vocabulary is written as ``no_vocab`` with its
size: llama.cpp needs the logits' width, never the token strings, because structspec tokenizes
with the profile's transformers tokenizer and feeds llama.cpp token ids. The special ids given
(BOS, EOS, end of turn, end of message) are written as the tokenizer keys llama.cpp's converter
writes (``tokenizer.ggml.*_token_id``).

Raises ``ValueError`` for any other architecture or a configuration llama.cpp would compute
differently (attention soft-capping, RoPE scaling, biases). Cost: one pass over the weights
(about a second for the 16 M-parameter demo target); the file is written to a temporary name
and renamed, so a crash never leaves a half-written GGUF that looks ready.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import gguf
import numpy as np
import torch

SUPPORTED = ("llama", "gemma3_text")


@dataclass(frozen=True)
class ExportedGGUF:
    path: Path
    architecture: str  # llama.cpp's name: llama | gemma3
    tensors: int
    vocab_size: int


def _permute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's [heads * (2, d/2)] rotate-half rows -> llama.cpp's interleaved pairs (its converter's ``permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check(cfg) -> None:
    if cfg.model_type not in SUPPORTED:
        raise ValueError(f"cannot write {cfg.model_type!r} as GGUF; supported: {', '.join(SUPPORTED)}")
    if getattr(cfg, "attn_logit_softcapping", None):
        raise ValueError("attention logit soft-capping has no GGUF key for these architectures")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise ValueError("projection biases are not written")
    rope = getattr(cfg, "rope_parameters", None) or {}
    kinds = rope.values() if all(isinstance(v, dict) for v in rope.values()) else [rope]
    if any(k.get("rope_type", "default") != "default" for k in kinds):
        raise ValueError("RoPE scaling is not written")


def _rope_theta(cfg, layer_type: str, default: float) -> float:
    rope = getattr(cfg, "rope_parameters", None) or {}
    if layer_type in rope and isinstance(rope[layer_type], dict):
        return float(rope[layer_type].get("rope_theta", default))
    return float(rope.get("rope_theta", getattr(cfg, "rope_theta", default)))


def _tensors(model, cfg) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor in HF's [out, in] layout) for every weight llama.cpp reads."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    gemma = cfg.model_type == "gemma3_text"
    shift = 1.0 if gemma else 0.0
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    yield "token_embd.weight", sd["model.embed_tokens.weight"]
    yield "output_norm.weight", sd["model.norm.weight"] + shift
    if not cfg.tie_word_embeddings:
        yield "output.weight", sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if not gemma:  # llama.cpp's Gemma 3 uses NEOX RoPE (HF's layout); its Llama does not
            q, k = _permute_rope(q, heads), _permute_rope(k, kv_heads)
        yield f"blk.{i}.attn_q.weight", q
        yield f"blk.{i}.attn_k.weight", k
        yield f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"]
        yield f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"]
        yield f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"] + shift
        yield f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]
        yield f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"]
        yield f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"]
        if gemma:
            yield f"blk.{i}.attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"] + shift
            yield f"blk.{i}.attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"] + shift
            yield f"blk.{i}.post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + shift
            yield f"blk.{i}.ffn_norm.weight", sd[p + "pre_feedforward_layernorm.weight"] + shift
            yield f"blk.{i}.post_ffw_norm.weight", sd[p + "post_feedforward_layernorm.weight"] + shift
        else:
            yield f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]


def export_gguf(model, path: str | Path, dtype: str = "f32", bos_token_id: int | None = None,
                eos_token_id: int | None = None, eot_token_id: int | None = None,
                eom_token_id: int | None = None) -> ExportedGGUF:
    """Write ``model`` (a transformers ``LlamaForCausalLM`` or ``Gemma3ForCausalLM``) to ``path``.

    ``dtype``: f32 | f16 for the matrices (norms stay F32, as llama.cpp's converter keeps them). The token ids
    (None: not written) become ``tokenizer.ggml.bos_token_id``, ``eos_token_id``, ``eot_token_id``,
    ``eom_token_id``."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    _check(cfg)
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be f32 or f16, not {dtype!r}")
    arch = "gemma3" if cfg.model_type == "gemma3_text" else "llama"
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    vocab = int(model.get_output_embeddings().weight.shape[0])
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        writer.add_name(getattr(cfg, "name_or_path", "") or arch)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        writer.add_context_length(int(cfg.max_position_embeddings))
        writer.add_embedding_length(int(cfg.hidden_size))
        writer.add_block_count(int(cfg.num_hidden_layers))
        writer.add_feed_forward_length(int(cfg.intermediate_size))
        writer.add_head_count(int(cfg.num_attention_heads))
        writer.add_head_count_kv(int(cfg.num_key_value_heads))
        writer.add_key_length(int(head_dim))
        writer.add_value_length(int(head_dim))
        writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
        writer.add_vocab_size(vocab)
        if arch == "llama":
            writer.add_rope_dimension_count(int(head_dim))
            writer.add_rope_freq_base(_rope_theta(cfg, "", 10000.0))
        else:
            if float(getattr(cfg, "query_pre_attn_scalar", head_dim)) != float(head_dim):
                raise ValueError("llama.cpp scales Gemma 3 queries by 1/sqrt(head_dim): query_pre_attn_scalar "
                                 f"{cfg.query_pre_attn_scalar} != head_dim {head_dim}")
            layer_types = list(getattr(cfg, "layer_types", None) or [])
            expected = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(cfg.num_hidden_layers)]
            if layer_types and layer_types != expected:
                raise ValueError("llama.cpp's Gemma 3 takes five sliding layers then one full one; the config has "
                                 f"{layer_types}")
            writer.add_rope_freq_base(_rope_theta(cfg, "full_attention", 1_000_000.0))
            writer.add_rope_freq_base_swa(_rope_theta(cfg, "sliding_attention", 10000.0))
            writer.add_sliding_window(int(cfg.sliding_window))
            if getattr(cfg, "final_logit_softcapping", None):
                writer.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
        writer.add_tokenizer_model("no_vocab")
        if bos_token_id is not None:
            writer.add_bos_token_id(int(bos_token_id))
        if eos_token_id is not None:
            writer.add_eos_token_id(int(eos_token_id))
        if eot_token_id is not None:
            writer.add_eot_token_id(int(eot_token_id))
        if eom_token_id is not None:
            writer.add_eom_token_id(int(eom_token_id))
        count = 0
        for name, tensor in _tensors(model, cfg):
            array = tensor.numpy()
            if dtype == "f16" and array.ndim == 2:
                array = array.astype(np.float16)
            writer.add_tensor(name, np.ascontiguousarray(array))
            count += 1
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return ExportedGGUF(out, arch, count, vocab)
