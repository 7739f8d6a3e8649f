"""A training plan's state beside a strict-devices run: per parameter, where its weight, gradient
and optimizer state live.

In: a plan with a ``training_state`` section (:mod:`partitioner.plan.training_state`) and, from a
run, what was seen of each parameter (:func:`observe_params`): the logical device its weight lives
on (the :class:`~backends.strict_devices.StrictDevices` mode's tag of it), the layout of the
gradient backward left (row-sparse or dense), and where an optimizer keeps its state when the
caller says (the emitted optimizer knows; the module alone does not). Out: one
:class:`ParamRow` per parameter (:func:`param_rows`) and the table ``hetpart check
--strict-devices`` prints (:func:`training_state_report`): the plan's devices, then what the run
showed, ``DIFFERS`` where they disagree.

The gradient goes where the plan keeps the state (``state``): the module's backward leaves it
beside the weight, and an offloading optimizer moves it there, so the gradient's device is the
plan's; its layout is what backward made.

Example:
    >>> print("\\n".join(training_state_report(plan, observe_params(run.mode, emitted))))   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from backends.compare import _table
from backends.strict_devices import StrictDevices
from partitioner.plan.training_state import param_states

__all__ = ["Observed", "ParamRow", "observe_params", "param_rows", "training_state_report"]


@dataclasses.dataclass(frozen=True)
class Observed:
    """What a run showed of one parameter (None: not seen)."""

    weights: str | None = None    # logical device of the weight
    gradient: str | None = None   # "sparse" | "dense" (None: no gradient yet)
    state: str | None = None      # logical device of its optimizer state


@dataclasses.dataclass(frozen=True)
class ParamRow:
    """One parameter: the plan's devices and update, and what the run showed."""

    name: str
    op: str
    compute: str
    weights: str
    state: str            # its gradient goes there too
    update: str           # "dense" | "sparse"
    seen: Observed = Observed()

    @property
    def ok(self) -> bool:
        return ((self.seen.weights in (None, self.weights)) and (self.seen.gradient in (None, self.update))
                and (self.seen.state in (None, self.state)))


def observe_params(mode: StrictDevices, module: torch.nn.Module, plan: Any,
                   states: Mapping[str, str] | None = None) -> dict[str, Observed]:
    """What ``module`` (built under ``mode``) shows of each parameter of ``plan``'s section, after
    a backward: its weight's logical device, its gradient's layout; ``states`` (parameter →
    logical device) says where an optimizer keeps their state.

    Example:
        >>> observe_params(run.mode, emitted, plan)["emb.weight"].gradient   # doctest: +SKIP
        'sparse'
    """
    out = {}
    for name in param_states(plan):
        param = module.get_parameter(name)
        grad = param.grad
        layout = None if grad is None else ("sparse" if grad.layout is not torch.strided else "dense")
        out[name] = Observed(mode.device_of(param), layout, (states or {}).get(name))
    return out


def param_rows(plan: Any, observed: Mapping[str, Observed] | None = None) -> list[ParamRow]:
    """One row per parameter of ``plan``'s ``training_state`` section, in its order."""
    seen = observed or {}
    return [ParamRow(ps.name, ps.op, ps.compute, ps.weights, ps.state, ps.update, seen.get(ps.name, Observed()))
            for ps in param_states(plan).values()]


def training_state_report(plan: Any, observed: Mapping[str, Observed] | None = None) -> list[str]:
    """The table of :func:`param_rows` (empty for a plan without the section); a run's columns
    only when ``observed`` is given."""
    rows = param_rows(plan, observed)
    if not rows:
        return []
    header = ["parameter", "op", "computes on", "weight on", "gradient to", "state on", "update"]
    if observed is not None:
        header += ["weight seen", "gradient seen", "state seen", ""]
    table = [header]
    for r in rows:
        cells = [r.name, r.op, r.compute, r.weights, r.state, r.state, r.update]
        if observed is not None:
            cells += [r.seen.weights or "-", r.seen.gradient or "-", r.seen.state or "-", "ok" if r.ok else "DIFFERS"]
        table.append(cells)
    section = plan.training_state
    lines = [f"training state ({section['optimizer']}): where each parameter's weight, gradient and state live"]
    lines += _table(table, indent="  ")
    if section.get("recompute"):
        lines.append(f"  recomputed in backward: {', '.join(section['recompute'])}")
    return lines
