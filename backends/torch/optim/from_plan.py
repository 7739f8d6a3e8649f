"""A plan's placed optimizer for the module emitted from it, and the mark that ties the two.

In: a training plan and the module ``plan.emit`` built from it (:func:`mark_emitted` leaves on it
the plan and the binding it was emitted with). Out: :func:`placed_optimizer`, the
:class:`~backends.torch.optim.placed.PlacedOptimizer` over the module's parameters with each
parameter's place from the plan's ``training_state`` section
(:func:`~partitioner.plan.training_state.param_states`); a training plan without the section steps
every parameter where its weight lives (:func:`resident_places`).

Refused, each with its fix: an inference plan (re-plan with ``training=True``), a module that
``plan.emit`` did not build, or built from another plan, and a plan whose module streams weights
of a parameter the binding does not place.

Example:
    >>> emitted = plan.emit(model, {"cuda:0": "cpu:1"})                    # doctest: +SKIP
    >>> opt = placed_optimizer(plan, emitted, lr=1e-3)                     # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from backends.torch.optim.placed import PlacedOptimizer
from partitioner.errors import HetpartError
from partitioner.plan.training_state import ParamState, param_states

__all__ = ["EMITTED_ATTR", "EmittedFrom", "mark_emitted", "placed_optimizer", "resident_places"]

EMITTED_ATTR = "_hetpart_emitted_from"


class EmittedFrom:
    """The plan a module was emitted from and the binding it was emitted with (shared by copies)."""

    def __init__(self, plan: Any, binding: Mapping[str, str]) -> None:
        self.plan = plan
        self.binding = dict(binding)

    def __deepcopy__(self, memo: dict) -> EmittedFrom:  # a copied module was emitted from the same plan
        return self

    def __getstate__(self) -> dict:  # a pickled module keeps no plan (plans are saved as files)
        return {"plan": None, "binding": self.binding}


def mark_emitted(module: torch.nn.Module, plan: Any, binding: Mapping[str, str]) -> None:
    """Record on ``module`` that it runs ``plan`` under ``binding`` (read by :func:`placed_optimizer`)."""
    object.__setattr__(module, EMITTED_ATTR, EmittedFrom(plan, binding))


def placed_optimizer(plan: Any, emitted: torch.nn.Module, params: Iterable[Any] | None = None,
                     **hyper: Any) -> PlacedOptimizer:
    """The optimizer of ``plan`` over ``emitted``'s parameters (see the module docstring).

    Parameters:
        plan: a training plan.
        emitted: ``plan.emit(model, device_map)``.
        params: parameters or param groups of ``emitted`` (default: all its trainable parameters).
        **hyper: the torch class's hyperparameters (``lr=1e-3``, ...).

    Raises:
        HetpartError: an inference plan; a module not emitted from ``plan``; hyperparameters the
            plan did not price (:mod:`backends.torch.optim.kinds`).

    Example:
        >>> opt = placed_optimizer(plan, plan.emit(model, {"cuda:0": "cpu:1"}), lr=0.1)   # doctest: +SKIP
    """
    if not plan.training:
        raise HetpartError(f"{plan.source} is an inference plan: it priced no gradients, optimizer state or step; "
                           f"re-plan with training=True (CLI: hetpart plan --training --optimizer NAME)")
    mark = getattr(emitted, EMITTED_ATTR, None)
    if mark is not None and mark.plan is None:
        raise HetpartError("the module was unpickled, which keeps no plan: emit it again with plan.emit(model, "
                           "device_map) (or load its weights into a freshly emitted module)")
    if mark is None:
        raise HetpartError(f"the optimizer trains the module plan.emit built ({type(emitted).__name__} was not "
                           f"emitted from a plan): pass emitted = plan.emit(model, device_map)")
    if mark.plan is not plan and mark.plan != plan:
        other = mark.plan
        why = ("for another model" if other.fingerprint != plan.fingerprint else
               "for inference" if not other.training else "from another placement")
        raise HetpartError(f"the module was emitted from another plan ({other.source}, {why}) than the one building "
                           f"the optimizer ({plan.source}): build it with the plan that emitted the module")
    binding = dict(mark.binding)
    binding.setdefault(plan.devices.host_device().name, "cpu")  # offloaded state lives on the host
    places = param_states(plan) or resident_places(plan)
    section = plan.training_state
    return PlacedOptimizer(emitted, places, binding, section.get("optimizer", plan.optimizer) if section
                           else plan.optimizer, params, delayed_update=bool(section.get("delayed_update")), **hyper)


def resident_places(plan: Any) -> dict[str, ParamState]:
    """Each parameter stepped where its weight lives (a training plan without a ``training_state``
    section): computed where its op computes, or on the host its op streams it from."""
    out = {}
    for op, names in plan.param_names.items():
        compute = plan.placement[op]
        weights = plan.weights.get(op, compute)
        for name in names:
            out.setdefault(name, ParamState(name, op, compute, weights, weights))
    return out
