"""The generated file's training step: ``build_optimizer(module, **hyper)``, the plan's placed optimizer.

In: a training plan and the file's :class:`~backends.torch.source.layout.Layout` (its devices and
their ``DEVICE_*`` constants). Out: the lines :func:`optimizer_source` adds to a file written with
``training=True``: a table of where every trainable parameter's weight, gradient and optimizer
state live (``_TRAINING_STATE``, names as ``ascii()`` literals) and ``build_optimizer``, which returns
hetpart's :class:`~backends.torch.optim.PlacedOptimizer` over the module's parameters with the
plan's optimizer, bound to the file's ``DEVICE_*`` constants (edit those to re-bind both).

Example:
    >>> "def build_optimizer" in "\\n".join(optimizer_source(plan, layout))   # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.torch.optim.from_plan import resident_places
from backends.torch.source.template import CLASS_NAME, literal
from partitioner.errors import HetpartError
from partitioner.plan.training_state import param_states

if TYPE_CHECKING:
    from backends.torch.source.layout import Layout

__all__ = ["optimizer_source"]


def optimizer_source(plan: Any, layout: Layout) -> list[str]:
    """The lines of ``_TRAINING_STATE`` and ``build_optimizer`` (see the module docstring).

    Raises:
        HetpartError: an inference plan (it priced no optimizer).
    """
    if not plan.training:
        raise HetpartError(f"{plan.source} is an inference plan: it priced no gradients or optimizer state, so "
                           f"the file can build no optimizer; re-plan with --training (or emit without --training)")
    section = plan.training_state
    places = param_states(plan) or resident_places(plan)
    optimizer = section.get("optimizer", plan.optimizer) if section else plan.optimizer
    host = plan.devices.host_device().name
    offloaded = sum(p.offloaded for p in places.values())
    streamed = sum(p.streamed_state for p in places.values())
    out = ["", "", "# The training step's optimizer: each parameter's gradient, optimizer state and step live where",
           f"# the plan puts them ({offloaded} of {len(places)} parameters' state on the host, stepped there as",
           f"# backward produces their gradients; {streamed} with their state on the host, streamed to the weight's",
           "# device for the step). Parameter -> (op, computes on, weights on, state on, update, exact, step on).",
           "_TRAINING_STATE = {"]
    for name, p in places.items():
        out.append(f"    {ascii(name)}: {literal((p.op, p.compute, p.weights, p.state, p.update, p.exact, p.step))},")
    out.append("}")
    binding = [f"{ascii(d)}: str({var})" for d, var in layout.device_var.items()]
    if host not in layout.device_var:
        binding.append(f"{ascii(host)}: 'cpu'")
    out += ["", "",
            f"def build_optimizer(module: {CLASS_NAME}, params: object = None,",
            "                    **hyper: object) -> torch.optim.Optimizer:",
            f'    """The plan\'s {_plain(optimizer)} optimizer over ``module``\'s parameters, e.g.',
            "    ``opt = build_optimizer(module, lr=1e-3)``; then ``loss.backward(); opt.step(); opt.zero_grad()``.",
            "",
            "    A torch.optim.Optimizer (LR schedulers, state_dict and load_state_dict work) keeping each",
            "    parameter's optimizer state on the device _TRAINING_STATE names; an offloaded parameter's",
            "    gradient is copied to the host as backward produces it and its step runs there beside the",
            "    rest of backward; step() waits for them and copies the updated weights back. Run backward",
            "    passes that only accumulate inside ``with opt.accumulating():``. hetpart must be installed.",
            '    """',
            "    from backends.torch.optim import PlacedOptimizer  # hetpart's placed optimizer",
            "    from partitioner.plan.training_state import ParamState",
            "",
            "    places = {name: ParamState(name, *place) for name, place in _TRAINING_STATE.items()}",
            f"    binding = {{{', '.join(binding)}}}",
            f"    return PlacedOptimizer(module, places, binding, {ascii(optimizer)}, params,",
            f"                           delayed_update={bool(section.get('delayed_update')) if section else False},"
            f" **hyper)"]
    return out


def _plain(name: str) -> str:
    """An optimizer name for a docstring (the plan's names are plain; anything else is quoted)."""
    return name if name.replace("-", "").isalnum() else ascii(name).replace('"', "'")
