"""A graph module's tensor attributes by target: reading them, and rebinding one as what it is.

Shared by the emitted module (:mod:`backends.torch.module`: state moved to its devices) and the
casts of precision plans (:mod:`backends.torch.precision`: weights stored in 16 bits).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["attribute", "rebind_tensor"]


def attribute(gm: torch.nn.Module, target: str) -> Any:
    """The attribute a ``get_attr`` target (``"blocks.0.weight"``) names.

    Example:
        >>> attribute(torch.nn.Sequential(torch.nn.Linear(2, 2)), "0.bias").shape
        torch.Size([2])
    """
    owner, _, attr = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, attr)


def rebind_tensor(module: torch.nn.Module, attr: str, new: torch.Tensor) -> None:
    """Set ``module.attr`` to ``new`` as what it is: a parameter, a buffer (its persistence kept)
    or a plain tensor attribute.

    Example:
        >>> m = torch.nn.BatchNorm1d(2)
        >>> rebind_tensor(m, "running_mean", torch.ones(2))
        >>> "running_mean" in dict(m.named_buffers())
        True
    """
    if isinstance(new, torch.nn.Parameter):
        module._parameters[attr] = new
    elif attr in module._buffers:
        module._buffers[attr] = new
    else:
        setattr(module, attr, new)
