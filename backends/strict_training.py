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

The gradient goes where the plan runs the step (``step``, the state's device unless the state is
streamed to the weight's): the module's backward leaves it beside the weight, and an offloading
optimizer moves it there, so the gradient's device is the plan's; its layout is what backward made.

Example:
    >>> print("\\n".join(training_state_report(plan, observe_params(run.mode, emitted))))   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from backends.strict_devices import StrictDevices
from backends.strict_report import Observed, ParamRow, training_table
from partitioner.plan.training_state import param_states

__all__ = ["Observed", "ParamRow", "observe_params", "param_rows", "training_state_report", "training_table"]


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
    return [ParamRow(ps.name, ps.op, ps.compute, ps.weights, ps.state, ps.update, seen.get(ps.name, Observed()),
                     ps.step) for ps in param_states(plan).values()]


def training_state_report(plan: Any, observed: Mapping[str, Observed] | None = None) -> list[str]:
    """The table of :func:`param_rows` under a title (empty for a plan without the section); the
    run's columns only when ``observed`` is given."""
    rows = param_rows(plan, observed)
    if not rows:
        return []
    section = plan.training_state
    lines = [f"training state ({section['optimizer']}): where each parameter's weight, gradient and state live"]
    lines += training_table(rows, seen=observed is not None)
    if section.get("recompute"):
        lines.append(f"  recomputed in backward: {', '.join(section['recompute'])}")
    if section.get("saved_on_host"):
        lines.append(f"  saved activations on the host: {', '.join(section['saved_on_host'])} (their copies out: "
                     f"the link row marked 'saved activations')")
    return lines
