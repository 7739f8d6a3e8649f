"""The optimizers a training plan names, as torch's own classes, and the hyperparameters each accepts.

In: the plan's optimizer name (``"sgd"``, ``"sgd-momentum"``, ``"adam"``, ``"adamw"``,
``"adagrad"``, ``"sparse-adam"``), the user's hyperparameters, and whether any parameter of the
plan updates row-sparse. Out: an :class:`OptimizerKind`: the torch class that steps a dense and a
row-sparse parameter, and the hyperparameter defaults (torch's, with the user's values), checked
against what the plan priced:

==============  =====================================  ==========================================
plan            torch                                  refused (the plan did not price it)
==============  =====================================  ==========================================
``sgd``         ``torch.optim.SGD``                    ``momentum`` (a buffer per parameter)
``sgd-momentum`` ``torch.optim.SGD``                   ``momentum`` missing or 0 (plan: ``sgd``)
``adam``        ``torch.optim.Adam``                   ``amsgrad`` (a third state tensor)
``adamw``       ``torch.optim.AdamW``                  ``amsgrad``
``adagrad``     ``torch.optim.Adagrad``                --
``sparse-adam`` ``torch.optim.SparseAdam`` (sparse),   anything SparseAdam does not take
                ``torch.optim.Adam`` (dense)
==============  =====================================  ==========================================

A row-sparse update equals the dense one for SGD without momentum or weight decay and for
Adagrad without weight decay (torch refuses weight decay with sparse gradients); a plan with
row-sparse parameters therefore refuses ``weight_decay`` for them. torch validates the values
itself (a throwaway optimizer of each class is built over a 1-element tensor).

Example:
    >>> kind = optimizer_kind("adam", {"lr": 0.01})
    >>> kind.dense.__name__, kind.defaults["lr"], kind.defaults["betas"]
    ('Adam', 0.01, (0.9, 0.999))
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from partitioner.errors import HetpartError
from partitioner.plan.training_state import OPTIMIZERS

__all__ = ["OptimizerKind", "optimizer_kind"]

_DENSE: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD, "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW, "adagrad": torch.optim.Adagrad, "sparse-adam": torch.optim.Adam,
}
#: the class stepping a row-sparse gradient (None: the optimizer has no sparse step)
_SPARSE: dict[str, type[torch.optim.Optimizer] | None] = {
    "sgd": torch.optim.SGD, "sgd-momentum": None, "adam": None, "adamw": None,
    "adagrad": torch.optim.Adagrad, "sparse-adam": torch.optim.SparseAdam,
}


@dataclasses.dataclass(frozen=True)
class OptimizerKind:
    """One planned optimizer as torch classes (see the module docstring)."""

    name: str                                       # the plan's name
    dense: type[torch.optim.Optimizer]              # steps a parameter with a dense gradient
    sparse: type[torch.optim.Optimizer] | None      # steps a row-sparse one (None: none exists)
    defaults: Mapping[str, Any]                     # every hyperparameter, torch's defaults + the user's

    def torch_class(self, sparse: bool) -> type[torch.optim.Optimizer]:
        """The class that steps a parameter updated row-sparse (``sparse``) or densely."""
        if sparse:
            if self.sparse is None:
                raise HetpartError(f"optimizer {self.name!r} has no row-sparse step, yet the plan updates a "
                                   f"parameter row-sparse; re-plan (the planner chooses sparse updates only "
                                   f"for sgd, adagrad and sparse-adam)")
            return self.sparse
        return self.dense

    def hyperparameters(self, cls: type[torch.optim.Optimizer], group: Mapping[str, Any]) -> dict[str, Any]:
        """The values of ``group`` (an outer param group) that ``cls``'s constructor takes."""
        known = set(_torch_defaults(cls)) & set(inspect.signature(cls.__init__).parameters)
        return {k: v for k, v in group.items() if k in known}


def optimizer_kind(name: str, hyper: Mapping[str, Any], *, sparse: bool = False) -> OptimizerKind:
    """The torch classes and checked hyperparameters of the plan's optimizer ``name``.

    Parameters:
        name: the optimizer the plan priced.
        hyper: the user's hyperparameters (``lr=...``, ``betas=...``).
        sparse: some parameter of the plan updates row-sparse.

    Raises:
        HetpartError: ``name`` is not an optimizer hetpart models (the message lists them); a
            hyperparameter the plan did not price, or one the torch class does not take, or a
            value torch refuses.

    Example:
        >>> optimizer_kind("sgd", {"lr": 0.1, "momentum": 0.9})
        Traceback (most recent call last):
        ...
        partitioner.errors.HetpartError: momentum=0.9: the plan priced 'sgd' (no momentum buffer); ...
    """
    if name not in OPTIMIZERS:
        raise HetpartError(f"{name!r} is not an optimizer hetpart models: it models {', '.join(OPTIMIZERS)}")
    hyper = dict(hyper)
    _priced(name, hyper, sparse)
    dense, sparse_cls = _DENSE[name], _SPARSE[name]
    # sparse-adam's hyperparameters are the ones both of its classes take (SparseAdam's)
    base = sparse_cls if name == "sparse-adam" else dense
    known = _torch_defaults(base)
    unknown = sorted(set(hyper) - set(known))
    if unknown:
        raise HetpartError(f"{', '.join(unknown)}: not a hyperparameter of {base.__name__} (plan optimizer "
                           f"{name!r}); it takes {', '.join(sorted(known))}")
    for cls in {dense, sparse_cls} - {None}:
        _validate(cls, {k: v for k, v in hyper.items() if k in _torch_defaults(cls)})
    return OptimizerKind(name, dense, sparse_cls, {**known, **hyper})


def _priced(name: str, hyper: Mapping[str, Any], sparse: bool) -> None:
    """Refuse what the plan's state and step do not account for."""
    momentum = hyper.get("momentum", 0)
    if name == "sgd" and momentum:
        raise HetpartError(f"momentum={momentum!r}: the plan priced 'sgd' (no momentum buffer); re-plan with "
                           f"optimizer='sgd-momentum' (CLI: --optimizer sgd-momentum), or drop momentum")
    if name == "sgd-momentum" and not momentum:
        raise HetpartError("the plan priced 'sgd-momentum' (a momentum buffer per parameter) but no momentum was "
                           "given: pass momentum=0.9 (or another value), or re-plan with optimizer='sgd'")
    if name in ("adam", "adamw") and hyper.get("amsgrad"):
        raise HetpartError(f"amsgrad=True keeps a third state tensor per parameter the plan did not price "
                           f"({name!r}: two moments); drop amsgrad, or plan for it")
    if sparse and name in ("sgd", "adagrad") and hyper.get("weight_decay"):
        raise HetpartError(f"weight_decay={hyper['weight_decay']!r}: the plan updates some parameters row-sparse, "
                           f"which equals {name}'s dense update only without weight decay (torch refuses weight "
                           f"decay with sparse gradients); drop weight_decay, or re-plan with dense updates")


def _torch_defaults(cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """torch's own defaults of ``cls`` (read off a throwaway instance)."""
    return dict(cls([torch.zeros(1, requires_grad=True)]).defaults)


def _validate(cls: type[torch.optim.Optimizer], hyper: Mapping[str, Any]) -> None:
    """torch's checks of the values (``Invalid learning rate: -1``), as a HetpartError."""
    try:
        cls([torch.zeros(1, requires_grad=True)], **hyper)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise HetpartError(f"{cls.__name__} refuses the hyperparameters: {exc}") from None
