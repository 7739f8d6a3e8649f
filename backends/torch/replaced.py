"""The caller's parameters an emitted module replaced, and the optimizer step that would miss them.

``plan.emit`` copies every parameter to its planned device and never touches the caller's model,
so the emitted module trains *its own* parameters: gradients (and BatchNorm statistics) land on
them. An optimizer built over the original ``model.parameters()`` then steps tensors whose
gradients never come and silently trains nothing.

In: the original model and the module emitted from it (:func:`remember`). Out: a weak registry
(it keeps neither module alive) from each original parameter to the emitted module and the
parameter's name there, and one process-wide optimizer step pre-hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``, installed at the first emit) that
refuses a step in which a replaced parameter has no gradient while its replacement has one: the
mistake, named with its fix (build the optimizer over ``emitted.parameters()``). A step over
the original parameters after an eager backward (both models trained side by side, as
``hetpart check`` does) has gradients and passes.

Example:
    >>> emitted = plan.emit(model, {"cuda:0": "cpu"})                 # doctest: +SKIP
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)       # the mistake  # doctest: +SKIP
    >>> emitted(*inputs).sum().backward(); optimizer.step()           # doctest: +SKIP
    HetpartError: the optimizer steps 'fc1.weight' of the original model ...
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from partitioner.errors import HetpartError


class _Replaced:
    """Original parameter -> (weak reference to the emitted module, the parameter's name there)."""

    def __init__(self) -> None:
        self.owners: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.lock = threading.Lock()
        self.hook: Any = None

    def remember(self, model: torch.nn.Module, emitted: torch.nn.Module) -> None:
        ref = weakref.ref(emitted)
        replaced = dict(emitted.named_parameters(remove_duplicate=False))
        with self.lock:
            for name, parameter in model.named_parameters(remove_duplicate=False):
                if name in replaced and replaced[name] is not parameter:
                    self.owners[parameter] = (ref, name)
            if self.hook is None:
                self.hook = register_optimizer_step_pre_hook(self.check_step)

    def check_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    continue
                owner = self.owners.get(parameter)
                if owner is None:
                    continue
                ref, name = owner
                emitted = ref()
                if emitted is None:
                    continue
                replacement = dict(emitted.named_parameters(remove_duplicate=False)).get(name)
                if replacement is not None and replacement.grad is not None:
                    raise HetpartError(
                        f"the optimizer steps {name!r} of the original model, which has no gradient: "
                        f"plan.emit copied it to its planned device and the emitted module trains its "
                        f"own copy (the gradient is there); build the optimizer over "
                        f"emitted.parameters() instead of model.parameters()"
                    )


_REPLACED = _Replaced()


def remember(model: torch.nn.Module, emitted: torch.nn.Module) -> None:
    """Record that ``emitted`` replaced ``model``'s parameters (see the module docstring)."""
    _REPLACED.remember(model, emitted)
