"""``bert``: a BERT encoder (post-norm blocks) with a pooler.

In the zoo for an encoder stack that takes *two* integer inputs (``input_ids`` and
``token_type_ids``), sums three embedding lookups, and returns *two* outputs (the
sequence output and the pooled first token): a partitioner must handle several graph
inputs and outputs, and post-norm blocks whose LayerNorms sit after the residual add.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.blocks import EncoderBlock, init_weights


@dataclass(frozen=True)
class BertConfig:
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_positions: int
    type_vocab: int
    batch: int
    seq: int


CONFIGS: dict[str, BertConfig] = {
    "tiny": BertConfig(vocab=128, d_model=32, n_layers=2, n_heads=4, d_ff=128,
                       max_positions=64, type_vocab=2, batch=2, seq=16),
    "small": BertConfig(vocab=8192, d_model=256, n_layers=4, n_heads=4, d_ff=1024,
                        max_positions=512, type_vocab=2, batch=2, seq=128),
    # bert-base-uncased (110M parameters).
    "base": BertConfig(vocab=30522, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                       max_positions=512, type_vocab=2, batch=1, seq=512),
}

LN_EPS = 1e-12


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.vocab, cfg.d_model)
        self.position = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        self.register_buffer(
            "position_ids", torch.arange(cfg.max_positions).unsqueeze(0), persistent=False
        )

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids.narrow(1, 0, input_ids.size(1))
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        return self.norm(x)


class BertPooler(nn.Module):
    """``tanh(dense(x[:, 0]))``: the first token's hidden state, projected."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x[:, 0]))


class Bert(nn.Module):
    """Returns ``(sequence_output (B, T, D), pooled_output (B, D))``."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(
            EncoderBlock(cfg.d_model, cfg.n_heads, cfg.d_ff, eps=LN_EPS)
            for _ in range(cfg.n_layers)
        )
        self.pooler = BertPooler(cfg.d_model)
        init_weights(self)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x)
        return x, self.pooler(x)


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "bert")
    model = Bert(cfg)
    input_ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    token_type_ids = torch.randint(0, cfg.type_vocab, (cfg.batch, cfg.seq))
    return model, (input_ids, token_type_ids)


ENTRY = ZooEntry(
    name="bert",
    description="BERT encoder: three summed embeddings, post-norm blocks, tanh pooler; two inputs, two outputs",
    build=build,
    no_split_classes=("EncoderBlock",),
)
