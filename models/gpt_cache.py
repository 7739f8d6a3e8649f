"""The zoo GPT's generation step: its own static KV cache, as buffers, for one batch and context.

In: a :class:`~models.gpt.GPT` (its modules are used as they are, never copied), the batch and the
number of cache positions. Out: :class:`CachedGPT`, whose ``forward(input_ids, cache_position)``
writes the keys and values of ``input_ids`` (``[batch, tokens]``) at ``cache_position`` (the
``tokens`` positions they take) into ``cache_k_i`` / ``cache_v_i`` (``[batch, heads, max_context,
head dim]`` per block) and attends over the whole cache, each position seeing the positions up to
its own (its row of the ``causal`` mask buffer); it returns the logits of every token. A prompt (positions ``0..P-1``) and one decode step
(position ``p``) are the same code, so a capture at each shape gives the same ops.

Example:
    >>> from models.gpt import CONFIGS, GPT
    >>> step = GPT(CONFIGS["tiny"]).with_static_cache(1, 16)
    >>> step(torch.zeros(1, 4, dtype=torch.long), torch.arange(4)).shape
    torch.Size([1, 4, 128])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.blocks import Block

__all__ = ["CachedGPT"]


class CachedGPT(nn.Module):
    """``gpt`` with a static KV cache of ``batch`` sequences and ``max_context`` positions."""

    def __init__(self, gpt: nn.Module, batch: int, max_context: int) -> None:
        """``gpt``: a :class:`~models.gpt.GPT` (its ``tok_emb``, ``pos_emb``, ``blocks``, ``ln_f`` and
        ``lm_head`` are used as they are)."""
        super().__init__()
        limit = gpt.pos_emb.num_embeddings
        if max_context > limit:
            raise ValueError(f"the GPT has {limit} positions (max_seq) but the cache asks for {max_context}: "
                             f"ask for fewer tokens or build the GPT with a larger max_seq")
        self.gpt = gpt
        self.vocab_size = gpt.lm_head.out_features
        self.max_context = max_context
        weight = gpt.tok_emb.weight
        self.register_buffer("causal", torch.ones(max_context, max_context, dtype=torch.bool,
                                                  device=weight.device).tril(), persistent=False)
        for i, block in enumerate(gpt.blocks):
            shape = (batch, block.attn.n_heads, max_context, block.attn.head_dim)
            self.register_buffer(f"cache_k_{i}", torch.zeros(shape, dtype=weight.dtype, device=weight.device))
            self.register_buffer(f"cache_v_{i}", torch.zeros(shape, dtype=weight.dtype, device=weight.device))

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        gpt = self.gpt
        x = gpt.tok_emb(input_ids) + gpt.pos_emb(cache_position).unsqueeze(0)
        # each position's row of the causal mask, taken where the mask lives (an index may sit on another device)
        visible = self.causal[cache_position]  # [tokens, max_context]
        for i, block in enumerate(gpt.blocks):
            x = x + self._attend(block, block.ln1(x), i, cache_position, visible)
            x = x + block.mlp(block.ln2(x))
        return gpt.lm_head(gpt.ln_f(x))

    def _attend(self, block: Block, h: torch.Tensor, i: int, cache_position: torch.Tensor,
                visible: torch.Tensor) -> torch.Tensor:
        attn = block.attn
        q, k, v = attn._heads(attn.q_proj(h)), attn._heads(attn.k_proj(h)), attn._heads(attn.v_proj(h))
        keys, values = self.get_buffer(f"cache_k_{i}"), self.get_buffer(f"cache_v_{i}")
        keys[:, :, cache_position] = k  # an index_put_: its positions may sit on another device
        values[:, :, cache_position] = v
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible)
        return attn.o_proj(y.transpose(1, 2).flatten(2))
