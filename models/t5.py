"""``t5``: a T5 (v1.0) encoder-decoder, laid out like HuggingFace's ``T5ForConditionalGeneration``.

In the zoo for the graph an encoder-decoder gives a partitioner: two stacks, the encoder's output
read by the cross-attention of *every* decoder layer (long edges that any cut must carry), one
relative-position bias computed once per stack and added in every layer (another fan-out), and
one embedding shared by the encoder, the decoder and the LM head (tied weights read three times).
Attention has no biases and no score scaling, norms are RMSNorm, the feed-forward is ReLU; the
decoder's output is scaled by ``d_model ** -0.5`` before the tied head, as in T5. ``base`` is
t5-small (60M parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.blocks import Attention, init_weights


@dataclass(frozen=True)
class T5Config:
    vocab: int
    d_model: int
    d_kv: int
    n_heads: int
    d_ff: int
    n_layers: int  # encoder layers; the decoder has as many
    buckets: int
    max_distance: int
    batch: int
    src_len: int
    tgt_len: int


CONFIGS: dict[str, T5Config] = {
    "tiny": T5Config(vocab=128, d_model=32, d_kv=8, n_heads=4, d_ff=64, n_layers=1, buckets=8,
                     max_distance=16, batch=2, src_len=16, tgt_len=8),
    "small": T5Config(vocab=8192, d_model=256, d_kv=32, n_heads=8, d_ff=1024, n_layers=4, buckets=32,
                      max_distance=128, batch=2, src_len=128, tgt_len=64),
    # t5-small (60M parameters).
    "base": T5Config(vocab=32128, d_model=512, d_kv=64, n_heads=8, d_ff=2048, n_layers=6, buckets=32,
                     max_distance=128, batch=1, src_len=512, tgt_len=128),
}

EPS = 1e-6


def relative_buckets(q_len: int, k_len: int, *, bidirectional: bool, buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of every (query, key) offset: exact for small offsets, logarithmic beyond."""
    relative = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out = out + (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = -torch.clamp(relative, max=0)
    exact = buckets // 2
    large = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    return out + torch.where(distance < exact, distance, large)


class RelativeBias(nn.Module):
    """The per-head bias of every (query, key) pair from a learned table over offset buckets."""

    def __init__(self, cfg: T5Config, q_len: int, k_len: int, *, causal: bool) -> None:
        super().__init__()
        self.table = nn.Embedding(cfg.buckets, cfg.n_heads)
        buckets = relative_buckets(q_len, k_len, bidirectional=not causal, buckets=cfg.buckets,
                                   max_distance=cfg.max_distance)
        self.register_buffer("buckets", buckets, persistent=False)
        mask = torch.full((q_len, k_len), torch.finfo(torch.float32).min).triu(1) if causal else torch.zeros(q_len, k_len)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self) -> torch.Tensor:
        return (self.table(self.buckets).permute(2, 0, 1) + self.mask).unsqueeze(0)


class DenseReluDense(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.wi = nn.Linear(d_model, d_ff, bias=False)
        self.act = nn.ReLU()
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi(x)))


class T5EncoderLayer(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.attn = Attention(cfg.d_model, cfg.n_heads, head_dim=cfg.d_kv, bias=False, scale=1.0)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.ff = DenseReluDense(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), bias=bias)
        return x + self.ff(self.norm2(x))


class T5DecoderLayer(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.attn = Attention(cfg.d_model, cfg.n_heads, head_dim=cfg.d_kv, bias=False, scale=1.0)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.cross = Attention(cfg.d_model, cfg.n_heads, head_dim=cfg.d_kv, bias=False, scale=1.0)
        self.norm3 = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.ff = DenseReluDense(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), bias=bias)
        x = x + self.cross(self.norm2(x), memory)
        return x + self.ff(self.norm3(x))


class T5(nn.Module):
    """``(input_ids (B, S), decoder_input_ids (B, T))`` -> logits ``(B, T, vocab)``."""

    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.d_model = cfg.d_model
        self.shared = nn.Embedding(cfg.vocab, cfg.d_model)
        self.encoder_bias = RelativeBias(cfg, cfg.src_len, cfg.src_len, causal=False)
        self.encoder = nn.ModuleList(T5EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.encoder_norm = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.decoder_bias = RelativeBias(cfg, cfg.tgt_len, cfg.tgt_len, causal=True)
        self.decoder = nn.ModuleList(T5DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder_norm = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.lm_head.weight = self.shared.weight
        init_weights(self)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        x = self.shared(input_ids)
        bias = self.encoder_bias()
        for layer in self.encoder:
            x = layer(x, bias)
        memory = self.encoder_norm(x)
        y = self.shared(decoder_input_ids)
        bias = self.decoder_bias()
        for layer in self.decoder:
            y = layer(y, memory, bias)
        return self.lm_head(self.decoder_norm(y) * (self.d_model ** -0.5))


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "t5")
    model = T5(cfg)
    return model, (torch.randint(0, cfg.vocab, (cfg.batch, cfg.src_len)),
                   torch.randint(0, cfg.vocab, (cfg.batch, cfg.tgt_len)))


ENTRY = ZooEntry(
    name="t5",
    description="T5 encoder-decoder: relative position bias, RMSNorm, cross-attention in every decoder layer, "
                "one embedding tied three ways",
    build=build,
    no_split_classes=("T5EncoderLayer", "T5DecoderLayer"),
)
