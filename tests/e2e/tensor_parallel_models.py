"""Model factories the tensor-parallel ranks rebuild (``path/to/tensor_parallel_models.py:factory``): each
returns ``(module, example_inputs)`` with the same weights in every process (a fixed seed).

* :func:`mlp`: two linears (8 -> 16 -> 6) with a ReLU between, batch 4;
* :func:`llama`: an HF ``LlamaForCausalLM`` from a small ``transformers`` config (random weights,
  nothing downloaded), called with ``input_ids`` and returning its logits; grouped key/value heads;
* :func:`llama_mha`: the same with as many key/value heads as query heads.
"""

from __future__ import annotations

import torch


class Logits(torch.nn.Module):
    """A causal LM called with positional ``input_ids``, returning its logits (no cache)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def llama(kv_heads: int = 2) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """One Llama layer (hidden 64, 4 heads, ``kv_heads`` KV heads, MLP 128, vocab 256, untied head), batch 2 x 16."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Logits(transformers.LlamaForCausalLM(config)).eval()
    return model, (torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1)),)


def llama_mha() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """:func:`llama` with 4 key/value heads (no grouped heads)."""
    return llama(kv_heads=4)


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """``Linear(8, 16)``, ReLU, ``Linear(16, 6)`` and a batch of 4."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6)).eval()
    return model, (torch.randn(4, 8),)
