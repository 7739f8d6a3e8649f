"""ONNX models for tests and benchmarks, nothing downloaded.

In: a zoo name and size, or a DenseNet-style size, and a path. Out: a ``.onnx`` file.

* :func:`export_zoo`: a zoo model (random weights) exported with ``torch.onnx.export``
  (``dynamo=False``: the TorchScript exporter, which needs no ``onnxscript``), opset 17;
* :func:`export_densenet`: a DenseNet-style CNN built here (dense blocks whose layers concatenate
  every earlier feature map, transitions that halve the width and the resolution), exported the same way;
* :func:`light_model`: the "light" models the ``onnx`` wheel ships for its backend tests
  (``onnx/backend/test/data/light``: ResNet-50, DenseNet-121, VGG-19, ...): the real architectures,
  IR version 3, opset 9, weights made by ``ConstantOfShape`` nodes from shape initializers that are
  also listed as graph inputs — the old-exporter form whose constant folding a naive split undoes.

    >>> path = export_zoo("convnet", "tiny", tmp_path / "convnet.onnx")   # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import torch
from torch import nn

import models

#: the densenet sizes: (image side, batch, growth, layers per block, blocks)
DENSENET_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (16, 1, 4, 2, 2),
    "small": (64, 4, 16, 4, 3),
    "base": (224, 8, 32, 6, 4),
}


def export_zoo(name: str, size: str, path: str | os.PathLike[str], *, dynamic_batch: bool = False) -> Path:
    """Export zoo model ``name`` at ``size`` to ``path`` (inputs named ``input``, ``input_1``, ...).

    ``dynamic_batch`` makes dimension 0 of every input symbolic (``batch``), as exporters usually do.

    Example:
        >>> export_zoo("mlp", "tiny", "mlp.onnx")         # doctest: +SKIP
        PosixPath('mlp.onnx')
    """
    module, inputs = models.get(name, size)
    return _export(module, inputs, Path(path), dynamic_batch)


class _DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, 4 * growth, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(torch.relu(self.bn(x)))
        return torch.cat([x, self.conv2(torch.relu(self.bn2(y)))], dim=1)


class DenseNetStyle(nn.Module):
    """stem conv -> (dense block -> transition) x blocks -> pool -> fc, as DenseNet-121."""

    def __init__(self, growth: int, layers: int, blocks: int, classes: int = 100) -> None:
        super().__init__()
        width = 2 * growth
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        stages: list[nn.Module] = []
        for b in range(blocks):
            for _ in range(layers):
                stages.append(_DenseLayer(width, growth))
                width += growth
            if b < blocks - 1:
                stages += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width // 2, 1, bias=False),
                           nn.AvgPool2d(2)]
                width //= 2
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def export_densenet(size: str, path: str | os.PathLike[str]) -> Path:
    """Export a :class:`DenseNetStyle` of ``size`` (see :data:`DENSENET_SIZES`) with random weights.

    Example:
        >>> export_densenet("tiny", "densenet.onnx")      # doctest: +SKIP
        PosixPath('densenet.onnx')
    """
    image, batch, growth, layers, blocks = DENSENET_SIZES[size]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = DenseNetStyle(growth, layers, blocks).eval()
        x = torch.randn(batch, 3, image, image)
    return _export(module, (x,), Path(path), False)


def light_model(name: str) -> Path:
    """The path of a light model shipped in the onnx wheel (``resnet50``, ``densenet121``, ``vgg19``, ...).

    Raises:
        FileNotFoundError: this onnx build does not ship it; the message lists those it has.

    Example:
        >>> light_model("resnet50").name
        'light_resnet50.onnx'
    """
    import onnx

    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    path = folder / f"light_{name}.onnx"
    if not path.is_file():
        have = sorted(p.stem.removeprefix("light_") for p in folder.glob("light_*.onnx"))
        raise FileNotFoundError(f"no light model {name!r} in {folder}; there are: {', '.join(have)}")
    return path


class _RMSNormFormula(nn.Module):
    """``nn.RMSNorm`` written as its formula, with the same weight: the TorchScript exporter has no
    ``aten::rms_norm`` below opset 23, so t5 and moe export their norms as Pow, ReduceMean, Add, Sqrt, Div, Mul."""

    def __init__(self, norm: nn.RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
        self.dims = tuple(range(-len(norm.normalized_shape), 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x / torch.sqrt(x.pow(2).mean(self.dims, keepdim=True) + self.eps)
        return y * self.weight if self.weight is not None else y


def _exportable(module: nn.Module) -> nn.Module:
    """``module``, or a copy whose RMSNorms are written as their formula (see :class:`_RMSNormFormula`)."""
    if not any(isinstance(m, nn.RMSNorm) for m in module.modules()):
        return module
    module = copy.deepcopy(module)
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.RMSNorm):
            owner, _, attr = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, attr, _RMSNormFormula(child))
    return module


def _export(module: nn.Module, inputs: tuple, path: Path, dynamic_batch: bool) -> Path:
    module = _exportable(module)
    names = ["input"] + [f"input_{i}" for i in range(1, len(inputs))]
    axes = {n: {0: "batch"} for n in names} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=17, input_names=names,
                          dynamic_axes=axes)
    return path


__all__ = ["DENSENET_SIZES", "DenseNetStyle", "export_densenet", "export_zoo", "light_model"]
