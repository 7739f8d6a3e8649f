"""``convnext``: a ConvNeXt CNN, laid out like timm's ``convnext_atto``.

In the zoo for a modern convolutional graph: a patchify stem, stages of blocks (7x7 depthwise
convolution, channels-last LayerNorm, an inverted-bottleneck MLP of two linears with GELU, a
learned per-channel layer scale, and a residual skip around all of it), downsampling layers of
LayerNorm plus a strided 2x2 convolution, then global pooling, LayerNorm and a linear head.
Every block's skip carries a full activation past five ops and two layout permutes, so cuts are
expensive; the depthwise convolutions are memory-bound and the linears compute-bound, so the best
device differs between neighbours. ``base`` is convnext_atto (3.7M parameters) at 224x224.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models._zoo import Built, ZooEntry, pick_size


@dataclass(frozen=True)
class ConvNeXtConfig:
    image: int
    batch: int
    dims: tuple[int, ...]    # channels per stage
    depths: tuple[int, ...]  # blocks per stage
    classes: int


CONFIGS: dict[str, ConvNeXtConfig] = {
    "tiny": ConvNeXtConfig(image=32, batch=2, dims=(8, 16), depths=(1, 1), classes=10),
    "small": ConvNeXtConfig(image=64, batch=8, dims=(40, 80, 160, 320), depths=(2, 2, 2, 2), classes=100),
    # convnext_atto (3.7M parameters).
    "base": ConvNeXtConfig(image=224, batch=8, dims=(40, 80, 160, 320), depths=(2, 2, 6, 2), classes=1000),
}

EPS = 1e-6


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """``x + gamma * pwconv2(gelu(pwconv1(norm(dwconv(x)))))``, the MLP in channels-last layout."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=EPS)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """``images (B, 3, H, W)`` -> logits ``(B, classes)``."""

    def __init__(self, cfg: ConvNeXtConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cfg.dims[0], 4, stride=4), LayerNorm2d(cfg.dims[0], eps=EPS))
        stages = []
        for i, (dim, depth) in enumerate(zip(cfg.dims, cfg.depths)):
            down = (nn.Sequential(LayerNorm2d(cfg.dims[i - 1], eps=EPS), nn.Conv2d(cfg.dims[i - 1], dim, 2, stride=2))
                    if i else nn.Identity())
            stages.append(nn.Sequential(down, *(ConvNeXtBlock(dim) for _ in range(depth))))
        self.stages = nn.Sequential(*stages)
        self.head_norm = nn.LayerNorm(cfg.dims[-1], eps=EPS)
        self.head = nn.Linear(cfg.dims[-1], cfg.classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))
        return self.head(self.head_norm(x.mean(dim=(2, 3))))


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "convnext")
    return ConvNeXt(cfg), (torch.randn(cfg.batch, 3, cfg.image, cfg.image),)


ENTRY = ZooEntry(
    name="convnext",
    description="ConvNeXt CNN (convnext_atto layout): depthwise 7x7 convolutions, channels-last MLPs, "
                "layer scale and residual skips",
    build=build,
    no_split_classes=("ConvNeXtBlock",),
)
