"""Transformer pieces shared by the zoo's ``gpt``, ``bert`` and ``emb-transformer`` models.

Attention is written the HuggingFace way, with explicit ``q_proj``/``k_proj``/``v_proj``/
``o_proj`` ``nn.Linear`` layers around ``F.scaled_dot_product_attention``, and not with
``nn.MultiheadAttention``: every projection is then a placeable module of its own,
accelerate's offload hooks work on it, and both ``torch.export`` and
``torch.fx.symbolic_trace`` see plain ops. Heads are split with ``unflatten``/``flatten``
on sizes fixed at construction, so no Python code reads a traced shape.

:class:`Block` is the pre-norm block (GPT-2 style, optionally causal); :class:`EncoderBlock`
the post-norm block of BERT. Both are meant to be kept whole by a device-map fill.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention over ``(B, T, D)`` with separate q/k/v/o projections."""

    def __init__(self, d_model: int, n_heads: int, *, is_causal: bool = False) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.is_causal = is_causal
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, H, T, Dh)``."""
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.q_proj(x))
        k = self._heads(self.k_proj(x))
        v = self._heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)
        return self.o_proj(y.transpose(1, 2).flatten(2))


class Attention(nn.Module):
    """Multi-head attention of ``x`` (queries) over ``memory`` (keys and values; ``x`` itself for
    self-attention), with an optional additive ``bias`` ``(1 or B, H, T, S)`` on the scores.

    The encoder-decoder models (``t5``, ``bart``) and the MoE decoder use it: ``bias=False`` and
    ``scale=1.0`` give T5's attention, the defaults Bart's.
    """

    def __init__(self, d_model: int, n_heads: int, *, head_dim: int | None = None, bias: bool = True,
                 scale: float | None = None, is_causal: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim or d_model // n_heads
        inner = self.n_heads * self.head_dim
        self.scale = scale
        self.is_causal = is_causal
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.o_proj = nn.Linear(inner, d_model, bias=bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        kv = x if memory is None else memory
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(kv)), self._heads(self.v_proj(kv))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=self.is_causal and bias is None,
                                           scale=self.scale)
        return self.o_proj(y.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """Position-wise MLP: ``ff1`` -> GELU -> ``ff2``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.ff1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.ff2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff2(self.act(self.ff1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        is_causal: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=eps)
        self.attn = SelfAttention(d_model, n_heads, is_causal=is_causal)
        self.ln2 = nn.LayerNorm(d_model, eps=eps)
        self.mlp = FeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class EncoderBlock(nn.Module):
    """Post-norm (BERT) block: ``ln1(x + attn(x))``, then ``ln2(x + mlp(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, eps: float = 1e-12) -> None:
        super().__init__()
        self.attn = SelfAttention(d_model, n_heads, is_causal=False)
        self.ln1 = nn.LayerNorm(d_model, eps=eps)
        self.mlp = FeedForward(d_model, d_ff)
        self.ln2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """HuggingFace-style init: N(0, std) for Linear and Embedding weights, zero biases.

    A no-op in effect on the meta device, where there is no data to fill.
    """
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
