"""The model of the GPU tests: square linear layers with ReLU, big weights and enough compute to
hide their copies (4096 wide: 64 MiB of fp32 weights and ~2·4096² FLOP per row per layer)."""

from __future__ import annotations

import torch
from torch import nn


class Tower(nn.Module):
    """``depth`` square linear layers of ``width`` with ReLU."""

    def __init__(self, width: int = 4096, depth: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
