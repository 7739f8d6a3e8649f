"""``mlp``: a plain stack of ``nn.Linear`` layers with ReLU between them.

In the zoo as the simplest possible chain: one input, one output, every op a matmul or
an elementwise op, no shared weights and no branches. Placement is a pure cut-the-chain
problem, which makes it the first model any partitioner change is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size


@dataclass(frozen=True)
class MLPConfig:
    in_features: int
    hidden: int
    depth: int  # number of Linear layers
    out_features: int
    batch: int


CONFIGS: dict[str, MLPConfig] = {
    "tiny": MLPConfig(in_features=64, hidden=64, depth=3, out_features=64, batch=8),
    "small": MLPConfig(in_features=1024, hidden=1024, depth=6, out_features=1024, batch=64),
    "base": MLPConfig(in_features=8192, hidden=8192, depth=8, out_features=8192, batch=64),
}


def linear_relu_stack(widths: list[int], *, final_relu: bool = False) -> nn.Sequential:
    """``Linear(widths[0], widths[1])``, ReLU, ... ``Linear(widths[-2], widths[-1])``."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if final_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """``layers`` is an ``nn.Sequential``: Linear, ReLU, Linear, ... Linear."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        if cfg.depth < 1:
            raise ValueError(f"MLP depth must be at least 1, got {cfg.depth}")
        widths = [cfg.in_features] + [cfg.hidden] * (cfg.depth - 1) + [cfg.out_features]
        self.layers = linear_relu_stack(widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "mlp")
    model = MLP(cfg)
    x = torch.randn(cfg.batch, cfg.in_features)
    return model, (x,)


ENTRY = ZooEntry(
    name="mlp",
    description="Linear/ReLU chain: the simplest cut-the-chain placement problem",
    build=build,
)
