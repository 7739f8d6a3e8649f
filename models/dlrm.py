"""``dlrm``: a DLRM-style recommender (bottom MLP, EmbeddingBags, dot interaction, top MLP).

In the zoo because its memory and its compute live in different places: the
embedding tables hold nearly all the bytes but do sparse gathers, while the MLPs hold
few bytes and do all the FLOPs. That is the case that pushes tables to a big-memory
device and MLPs to a fast one. The feature interaction joins every table's output in one
``bmm``, so the tables form K parallel branches that must all meet on one device.

Inputs: ``dense (B, num_dense)`` float, ``indices (K, B * pooling)`` int64 and
``offsets (K, B)`` int64, one row per table (every bag holds ``pooling`` ids). The
strict lower triangle of the interaction matrix is taken with index buffers fixed at
construction, so nothing depends on the data and the model traces with symbolic_trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.mlp import linear_relu_stack


@dataclass(frozen=True)
class DLRMConfig:
    num_dense: int
    bottom: tuple[int, ...]  # bottom-MLP widths; the last is the embedding dim
    table_rows: tuple[int, ...]  # rows of each EmbeddingBag
    top: tuple[int, ...]  # top-MLP hidden widths (a final Linear to 1 follows)
    batch: int
    pooling: int  # ids per bag

    @property
    def embedding_dim(self) -> int:
        return self.bottom[-1]


CONFIGS: dict[str, DLRMConfig] = {
    "tiny": DLRMConfig(num_dense=13, bottom=(32, 16), table_rows=(100, 50, 200, 80),
                       top=(32,), batch=8, pooling=2),
    "small": DLRMConfig(num_dense=13, bottom=(256, 128, 64), table_rows=(20_000,) * 8,
                        top=(256, 128), batch=128, pooling=8),
    "base": DLRMConfig(num_dense=13, bottom=(512, 256, 128),
                       table_rows=(4_000_000, 2_000_000, 1_000_000, 1_000_000,
                                   500_000, 100_000, 10_000, 1_000),
                       top=(1024, 512, 256), batch=512, pooling=16),
}


class DotInteraction(nn.Module):
    """Pairwise dot products of ``n`` feature vectors: ``(B, n, D)`` -> ``(B, n(n-1)/2)``."""

    def __init__(self, n_features: int) -> None:
        super().__init__()
        rows, cols = torch.tril_indices(n_features, n_features, offset=-1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        z = torch.bmm(features, features.transpose(1, 2))
        return z[:, self.rows, self.cols]


class DLRM(nn.Module):
    """``bottom`` MLP, ``embeddings`` (ModuleList of EmbeddingBag), ``interaction``, ``top`` MLP."""

    def __init__(self, cfg: DLRMConfig) -> None:
        super().__init__()
        d = cfg.embedding_dim
        k = len(cfg.table_rows)
        self.bottom = linear_relu_stack([cfg.num_dense, *cfg.bottom], final_relu=True)
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(rows, d, mode="sum") for rows in cfg.table_rows
        )
        self.interaction = DotInteraction(k + 1)
        n_pairs = (k + 1) * k // 2
        self.top = linear_relu_stack([d + n_pairs, *cfg.top, 1])

    def forward(
        self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        bags = [bag(indices[i], offsets[i]) for i, bag in enumerate(self.embeddings)]
        pairs = self.interaction(torch.stack([x, *bags], dim=1))
        return self.top(torch.cat([x, pairs], dim=1))


def example_inputs(cfg: DLRMConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense features, ``(K, B * pooling)`` ids (each row in range of its table), offsets."""
    n_ids = cfg.batch * cfg.pooling
    dense = torch.rand(cfg.batch, cfg.num_dense)
    indices = torch.stack([torch.randint(0, rows, (n_ids,)) for rows in cfg.table_rows])
    offsets = torch.arange(0, n_ids, cfg.pooling).expand(len(cfg.table_rows), -1).contiguous()
    return dense, indices, offsets


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "dlrm")
    return DLRM(cfg), example_inputs(cfg)


ENTRY = ZooEntry(
    name="dlrm",
    description="DLRM recommender: EmbeddingBag tables hold the bytes, MLPs do the FLOPs, dot interaction joins them",
    build=build,
)
