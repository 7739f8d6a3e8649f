"""Small causal LMs for generation tests: transformers' GPT-2, Llama, Mistral and Qwen2-MoE from
configs (random weights) and the zoo's GPT."""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformers as T

from models.gpt import CONFIGS, GPT

VOCAB = 4096
_ATTENTION = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                  vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)

#: name -> (builder, a module path whose ops a test pins to the accelerator, so the cache is split)
ARCHITECTURES: dict[str, tuple[Callable[[], torch.nn.Module], str]] = {
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=VOCAB,
                                                     n_positions=256, bos_token_id=1, eos_token_id=2)),
             "inner.model.transformer.h.1*"),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(intermediate_size=1024, **_ATTENTION)),
              "inner.model.model.layers.1*"),
    "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(intermediate_size=1024, **_ATTENTION)),
                "inner.model.model.layers.1*"),
    "qwen2-moe": (lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
        intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=256, num_experts=4,
        num_experts_per_tok=2, **_ATTENTION)), "inner.model.model.layers.1*"),
    "zoo-gpt": (lambda: GPT(CONFIGS["small"]), "inner.gpt.blocks.3*"),
}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return ARCHITECTURES[name][0]().eval()


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
