"""``convnet``: a ResNet-style CNN (basic residual blocks, BatchNorm, global pool, fc).

In the zoo for convolution-heavy compute with BatchNorm buffers (running statistics
that are state but not parameters) and residual skips that a cut must carry across
devices: the 1x1-conv shortcuts where stride or width changes make some skips cost
compute, the identity ones only memory traffic. ``base`` is ResNet-18 at 224x224.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from models._zoo import Built, ZooEntry, pick_size


@dataclass(frozen=True)
class ConvNetConfig:
    image: int
    batch: int
    widths: tuple[int, ...]  # channels per stage
    depths: tuple[int, ...]  # basic blocks per stage
    stem_kernel: int
    stem_stride: int
    stem_pool: bool  # 3x3/2 max-pool after the stem, as ResNet on ImageNet
    classes: int
    in_channels: int = 3


CONFIGS: dict[str, ConvNetConfig] = {
    "tiny": ConvNetConfig(image=32, batch=2, widths=(8, 16), depths=(1, 1),
                          stem_kernel=3, stem_stride=1, stem_pool=False, classes=10),
    "small": ConvNetConfig(image=64, batch=8, widths=(32, 64, 128, 256), depths=(2, 2, 2, 2),
                           stem_kernel=3, stem_stride=1, stem_pool=False, classes=100),
    # ResNet-18 (11.7M parameters).
    "base": ConvNetConfig(image=224, batch=8, widths=(64, 128, 256, 512), depths=(2, 2, 2, 2),
                          stem_kernel=7, stem_stride=2, stem_pool=True, classes=1000),
}


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN; identity shortcut, or 1x1 conv+BN when stride/width change."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.act2 = nn.ReLU()
        self.shortcut: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                nn.BatchNorm2d(c_out),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.shortcut is None else self.shortcut(x)
        return self.act2(out + skip)


def _stem(cfg: ConvNetConfig) -> nn.Sequential:
    """``conv`` (no bias) -> ``bn`` -> ``act`` [-> ``pool``]."""
    layers: dict[str, nn.Module] = {
        "conv": nn.Conv2d(cfg.in_channels, cfg.widths[0], cfg.stem_kernel,
                          stride=cfg.stem_stride, padding=cfg.stem_kernel // 2, bias=False),
        "bn": nn.BatchNorm2d(cfg.widths[0]),
        "act": nn.ReLU(),
    }
    if cfg.stem_pool:
        layers["pool"] = nn.MaxPool2d(3, stride=2, padding=1)
    return nn.Sequential(OrderedDict(layers))


def _stage(c_in: int, c_out: int, depth: int, stride: int) -> nn.Sequential:
    blocks = [BasicBlock(c_in, c_out, stride)]
    blocks += [BasicBlock(c_out, c_out, 1) for _ in range(depth - 1)]
    return nn.Sequential(*blocks)


class ConvNet(nn.Module):
    """``stem`` -> ``stages.0`` ... -> ``pool`` -> flatten -> ``fc``."""

    def __init__(self, cfg: ConvNetConfig) -> None:
        super().__init__()
        if len(cfg.widths) != len(cfg.depths):
            raise ValueError("ConvNetConfig.widths and .depths must have the same length")
        self.stem = _stem(cfg)
        c_ins = (cfg.widths[0],) + cfg.widths[:-1]
        self.stages = nn.ModuleList(
            _stage(c_in, c_out, depth, 1 if i == 0 else 2)
            for i, (c_in, c_out, depth) in enumerate(zip(c_ins, cfg.widths, cfg.depths))
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cfg.widths[-1], cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "convnet")
    model = ConvNet(cfg)
    images = torch.randn(cfg.batch, cfg.in_channels, cfg.image, cfg.image)
    return model, (images,)


ENTRY = ZooEntry(
    name="convnet",
    description="ResNet-style CNN (ResNet-18 at base): convs, BatchNorm buffers, residual skips",
    build=build,
    no_split_classes=("BasicBlock",),
)
