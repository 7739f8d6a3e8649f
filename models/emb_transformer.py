"""``emb-transformer``: a very large embedding table feeding pre-norm blocks and a small head.

In the zoo as the memory-bound placement case: at ``base`` the table alone is 4 GiB
(1,048,576 x 1024 fp32) while each block is ~48 MiB and the head is 64 KiB, so where the
table goes dominates the plan. ``base`` is a calibration scenario and its sizes are
fixed: module names ``emb``, ``layers.0`` ... ``layers.7``, ``head``; every block holds
exactly 50,384,896 parameter bytes; the head 65,600 bytes; input 4 x 512 int64 token ids;
output ``(4, 512, 16)``. There is deliberately no final LayerNorm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.blocks import Block, init_weights


@dataclass(frozen=True)
class EmbTransformerConfig:
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    out_features: int
    batch: int
    seq: int


CONFIGS: dict[str, EmbTransformerConfig] = {
    "tiny": EmbTransformerConfig(vocab=512, d_model=32, n_layers=2, n_heads=4, d_ff=128,
                                 out_features=16, batch=2, seq=16),
    "small": EmbTransformerConfig(vocab=32768, d_model=256, n_layers=4, n_heads=8, d_ff=1024,
                                  out_features=16, batch=2, seq=128),
    # Calibration scenario: do not change.
    "base": EmbTransformerConfig(vocab=1_048_576, d_model=1024, n_layers=8, n_heads=16,
                                 d_ff=4096, out_features=16, batch=4, seq=512),
}


class EmbTransformer(nn.Module):
    """``emb`` -> ``layers`` (non-causal pre-norm blocks) -> ``head``."""

    def __init__(self, cfg: EmbTransformerConfig) -> None:
        super().__init__()
        # the table is filled once, by init_weights below: skipping nn.Embedding's own init halves
        # the time to build the 4 GiB base model
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model, _weight=torch.empty(cfg.vocab, cfg.d_model))
        self.layers = nn.ModuleList(
            Block(cfg.d_model, cfg.n_heads, cfg.d_ff, is_causal=False)
            for _ in range(cfg.n_layers)
        )
        self.head = nn.Linear(cfg.d_model, cfg.out_features)
        init_weights(self)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "emb-transformer")
    model = EmbTransformer(cfg)
    input_ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), dtype=torch.int64)
    return model, (input_ids,)


ENTRY = ZooEntry(
    name="emb-transformer",
    description="huge embedding table (4 GiB at base) feeding pre-norm blocks and a small head; calibration scenario",
    build=build,
    no_split_classes=("Block",),
)
