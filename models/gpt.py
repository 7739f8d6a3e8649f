"""``gpt``: a decoder-only transformer (GPT-2 layout) with a tied LM head.

In the zoo because it is the standard layer-stack placement problem: identical pre-norm
:class:`~models.blocks.Block` s between a large embedding and a large output projection,
and the output projection *shares its weight* with the token embedding
(``lm_head.weight is tok_emb.weight``). A partitioner must count that parameter once and
place both of its users where it lives, or pay for a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.blocks import Block, init_weights


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_seq: int
    batch: int
    seq: int


CONFIGS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab=128, d_model=32, n_layers=2, n_heads=4, d_ff=128,
                      max_seq=16, batch=2, seq=16),
    "small": GPTConfig(vocab=8192, d_model=256, n_layers=4, n_heads=8, d_ff=1024,
                       max_seq=128, batch=2, seq=128),
    # GPT-2 small (124M parameters).
    "base": GPTConfig(vocab=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                      max_seq=1024, batch=1, seq=1024),
}


class GPT(nn.Module):
    """Token + learned position embedding, causal pre-norm blocks, final LN, tied head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.register_buffer(
            "position_ids", torch.arange(cfg.max_seq).unsqueeze(0), persistent=False
        )
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.n_heads, cfg.d_ff, is_causal=True)
            for _ in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        init_weights(self)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids.narrow(1, 0, input_ids.size(1))
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def with_static_cache(self, batch: int, max_context: int) -> nn.Module:
        """This model's generation step with a static KV cache (:class:`~models.gpt_cache.CachedGPT`):
        ``forward(input_ids, cache_position) -> logits``, sharing this model's modules."""
        from models.gpt_cache import CachedGPT

        return CachedGPT(self, batch, max_context)


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "gpt")
    model = GPT(cfg)
    input_ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    return model, (input_ids,)


ENTRY = ZooEntry(
    name="gpt",
    description="decoder-only transformer (GPT-2 layout) with the LM head tied to the token embedding",
    build=build,
    no_split_classes=("Block",),
)
