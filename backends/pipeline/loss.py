"""The loss a pipeline training step uses, and its target, made the same way on every process.

In: a loss name (``"mse"`` or ``"cross-entropy"``), or ``path/to/file.py:function`` naming the
user's own ``loss(output, target)``; the shape of the model's output for one step. Out: the loss
function the last stage applies to each micro-batch's output, and a target tensor that every
process (each rank and the single-process reference) builds identically from a seed.

========================  ===========================================================================
loss                      ``loss(output, target)`` per micro-batch (``output``: the model's first output)
========================  ===========================================================================
``mse``                   ``mean((output - target)^2)``; target: standard normal, the output's shape
``cross-entropy``         ``cross_entropy(output.reshape(-1, C), target.reshape(-1))``; target: class
                          indices in ``[0, C)``, ``C`` the output's last dimension
``file.py:function``      the user's function; the target is the ``mse`` one
========================  ===========================================================================

The schedule averages the micro-batch losses (``scale_grads``): a step's loss is their mean, and
the gradients are those of the mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from partitioner.errors import HetpartError
from partitioner.model_source import import_file

__all__ = ["LOSSES", "loss_function", "make_target", "first_output"]

LOSSES = ("mse", "cross-entropy")


def first_output(output: Any) -> torch.Tensor:
    """The model's first output tensor (the whole output when it is one tensor)."""
    if isinstance(output, torch.Tensor):
        return output
    for item in output:
        if isinstance(item, torch.Tensor):
            return item
    raise HetpartError("the model returns no tensor: a pipeline loss needs one")


def _mse(output: Any, target: torch.Tensor) -> torch.Tensor:
    return ((first_output(output).float() - target) ** 2).mean()


def _cross_entropy(output: Any, target: torch.Tensor) -> torch.Tensor:
    logits = first_output(output).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def loss_function(name: str) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """The loss called ``name`` (see the module docstring).

    Example:
        >>> loss_function("mse")(torch.ones(2, 3), torch.zeros(2, 3)).item()
        1.0
    """
    if name == "mse":
        return _mse
    if name == "cross-entropy":
        return _cross_entropy
    path, sep, fn = name.rpartition(":")
    if sep and path.endswith(".py"):
        return _user_loss(Path(path), fn, name)
    raise HetpartError(f"unknown loss {name!r}: use {', '.join(LOSSES)} or path/to/file.py:function")


def make_target(name: str, shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    """The target of a step whose first output has ``shape``, the same on every process.

    Example:
        >>> torch.equal(make_target("mse", (4, 2), 1), make_target("mse", (4, 2), 1))
        True
    """
    generator = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if name == "cross-entropy":
        if not shape:
            raise HetpartError("cross-entropy needs an output with a class dimension; use --loss mse")
        return torch.randint(0, shape[-1], shape[:-1], generator=generator)
    return torch.randn(shape, generator=generator)


def _user_loss(path: Path, fn: str, spec: str) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    loss = getattr(import_file(path, spec), fn, None)
    if not callable(loss):
        raise HetpartError(f"{str(path)!r} has no function {fn!r} to use as the loss")
    return loss
