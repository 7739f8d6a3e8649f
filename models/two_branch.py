"""``two-branch``: two independent heavy branches on one input, merged at the end.

In the zoo for inter-op parallelism: ``branch_a`` (a deep, wide MLP) and ``branch_b``
(a 1-D conv stack over the same feature vector) share the input and nothing else, so a
partitioner may run them on two devices at once and pay only for sending the input out
and the two branch outputs back to ``merge`` (``nn.Linear`` on their concatenation). The
branches are of different kinds on purpose, so their best devices may differ too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.mlp import linear_relu_stack


@dataclass(frozen=True)
class TwoBranchConfig:
    in_features: int
    a_width: int  # branch_a: MLP hidden width
    a_depth: int  # branch_a: number of Linear layers
    b_channels: int  # branch_b: Conv1d channels
    b_depth: int  # branch_b: number of Conv1d layers
    b_pool: int  # branch_b: length after adaptive average pooling
    branch_out: int  # each branch's output width
    out_features: int
    batch: int


CONFIGS: dict[str, TwoBranchConfig] = {
    "tiny": TwoBranchConfig(in_features=32, a_width=64, a_depth=3, b_channels=8, b_depth=2,
                            b_pool=4, branch_out=16, out_features=8, batch=4),
    "small": TwoBranchConfig(in_features=512, a_width=2048, a_depth=4, b_channels=64,
                             b_depth=4, b_pool=8, branch_out=256, out_features=64, batch=32),
    "base": TwoBranchConfig(in_features=4096, a_width=8192, a_depth=6, b_channels=128,
                            b_depth=6, b_pool=16, branch_out=1024, out_features=256, batch=64),
}


class ConvBranch(nn.Module):
    """Treats ``(B, F)`` as a 1-channel sequence: Conv1d/ReLU stack, pool, flatten, ``proj``."""

    def __init__(self, channels: int, depth: int, pool: int, out_features: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Conv1d(1 if i == 0 else channels, channels, 3, padding=1), nn.ReLU()]
        self.convs = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool1d(pool)
        self.proj = nn.Linear(channels * pool, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(self.convs(x.unsqueeze(1)))
        return self.proj(torch.flatten(y, 1))


class TwoBranch(nn.Module):
    """``merge(cat(branch_a(x), branch_b(x)))``; the branches share only ``x``."""

    def __init__(self, cfg: TwoBranchConfig) -> None:
        super().__init__()
        widths_a = [cfg.in_features] + [cfg.a_width] * (cfg.a_depth - 1) + [cfg.branch_out]
        self.branch_a = linear_relu_stack(widths_a)
        self.branch_b = ConvBranch(cfg.b_channels, cfg.b_depth, cfg.b_pool, cfg.branch_out)
        self.merge = nn.Linear(2 * cfg.branch_out, cfg.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch_a(x)
        b = self.branch_b(x)
        return self.merge(torch.cat([a, b], dim=1))


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "two-branch")
    model = TwoBranch(cfg)
    x = torch.randn(cfg.batch, cfg.in_features)
    return model, (x,)


ENTRY = ZooEntry(
    name="two-branch",
    description="two independent heavy branches (wide MLP, 1-D conv stack) on one input, merged by a Linear",
    build=build,
)
