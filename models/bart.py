"""``bart``: a Bart encoder-decoder, laid out like HuggingFace's ``BartForConditionalGeneration``.

In the zoo beside ``t5`` for the other common encoder-decoder layout: learned positions (offset
by 2, as Bart's), a LayerNorm on each stack's embeddings, *post*-norm layers with GELU
feed-forwards, cross-attention over the encoder's output in every decoder layer, and the token
embedding shared by both stacks and the LM head (plus a fixed ``final_logits_bias``). ``base`` is
bart-base (140M parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.blocks import Attention, FeedForward, init_weights


@dataclass(frozen=True)
class BartConfig:
    vocab: int
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int  # encoder layers; the decoder has as many
    max_positions: int
    batch: int
    src_len: int
    tgt_len: int


CONFIGS: dict[str, BartConfig] = {
    "tiny": BartConfig(vocab=128, d_model=32, n_heads=4, d_ff=64, n_layers=1, max_positions=32,
                       batch=2, src_len=16, tgt_len=8),
    "small": BartConfig(vocab=8192, d_model=256, n_heads=4, d_ff=1024, n_layers=3, max_positions=256,
                        batch=2, src_len=128, tgt_len=64),
    # bart-base (140M parameters).
    "base": BartConfig(vocab=50265, d_model=768, n_heads=12, d_ff=3072, n_layers=6, max_positions=1024,
                       batch=1, src_len=512, tgt_len=128),
}

POSITION_OFFSET = 2  # Bart's learned positions start at index 2


class Positions(nn.Module):
    """Learned positions 0..len-1 (stored at offset 2), as a ``(1, len, D)`` tensor."""

    def __init__(self, cfg: BartConfig, length: int) -> None:
        super().__init__()
        self.table = nn.Embedding(cfg.max_positions + POSITION_OFFSET, cfg.d_model)
        self.register_buffer("ids", torch.arange(length).unsqueeze(0) + POSITION_OFFSET, persistent=False)

    def forward(self) -> torch.Tensor:
        return self.table(self.ids)


class BartEncoderLayer(nn.Module):
    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        self.attn = Attention(cfg.d_model, cfg.n_heads)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff)
        self.norm2 = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ff(x))


class BartDecoderLayer(nn.Module):
    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        self.attn = Attention(cfg.d_model, cfg.n_heads, is_causal=True)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.cross = Attention(cfg.d_model, cfg.n_heads)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff)
        self.norm3 = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        x = self.norm2(x + self.cross(x, memory))
        return self.norm3(x + self.ff(x))


class Bart(nn.Module):
    """``(input_ids (B, S), decoder_input_ids (B, T))`` -> logits ``(B, T, vocab)``."""

    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        self.shared = nn.Embedding(cfg.vocab, cfg.d_model)
        self.encoder_positions = Positions(cfg, cfg.src_len)
        self.encoder_norm = nn.LayerNorm(cfg.d_model)
        self.encoder = nn.ModuleList(BartEncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder_positions = Positions(cfg, cfg.tgt_len)
        self.decoder_norm = nn.LayerNorm(cfg.d_model)
        self.decoder = nn.ModuleList(BartDecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.lm_head.weight = self.shared.weight
        self.register_buffer("final_logits_bias", torch.zeros(1, cfg.vocab))
        init_weights(self)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        x = self.encoder_norm(self.shared(input_ids) + self.encoder_positions())
        for layer in self.encoder:
            x = layer(x)
        y = self.decoder_norm(self.shared(decoder_input_ids) + self.decoder_positions())
        for layer in self.decoder:
            y = layer(y, x)
        return self.lm_head(y) + self.final_logits_bias


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "bart")
    model = Bart(cfg)
    return model, (torch.randint(0, cfg.vocab, (cfg.batch, cfg.src_len)),
                   torch.randint(0, cfg.vocab, (cfg.batch, cfg.tgt_len)))


ENTRY = ZooEntry(
    name="bart",
    description="Bart encoder-decoder: learned positions, post-norm layers, cross-attention, tied embedding and head",
    build=build,
    no_split_classes=("BartEncoderLayer", "BartDecoderLayer"),
)
