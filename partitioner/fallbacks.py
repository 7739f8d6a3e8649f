"""Fallback plans: the same model solved ahead of time for less accelerator memory.

In: the primary plan, the profile it was solved on (caps applied) and fractions such as
``(0.75, 0.5)``. Out: the primary plan carrying one :class:`~partitioner.plan.live.FallbackPlan`
per fraction, each solved with every accelerator's memory capped at ``fraction`` x the primary's
capacity there (the CPU keeps its memory: it is where weights stream from and ops fall back to)::

    cap_f(d) = floor(fraction x capacity(d))   for every accelerator d

The emitted module (:mod:`backends.torch.live`) picks among them at run time from the memory
free then; nothing is solved while it runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from cost_models.profiles import DeviceKind, DeviceSet
from partitioner.errors import InfeasiblePlacement
from partitioner.plan import Plan
from partitioner.plan.live import FallbackPlan

__all__ = ["fallback_caps", "with_fallbacks"]


def fallback_caps(profile: DeviceSet, fraction: float) -> dict[str, int]:
    """Memory caps of the fallback at ``fraction``: each accelerator's capacity scaled, at least 1 byte.

    Example:
        >>> from cost_models.profiles import load_profile
        >>> profile = load_profile("h200-host")
        >>> fallback_caps(profile, 0.5)["cuda:0"] * 2 == profile.device("cuda:0").memory
        True
    """
    return {d.name: max(1, math.floor(fraction * d.memory)) for d in profile.devices if d.kind is not DeviceKind.CPU}


def with_fallbacks(plan: Plan, profile: DeviceSet, fractions: tuple[float, ...],
                   solve: Callable[[DeviceSet, Mapping[str, int]], Plan]) -> Plan:
    """``plan`` carrying a fallback plan per fraction; ``solve(profile, caps)`` solves one.

    Raises:
        InfeasiblePlacement: a fraction leaves too little memory for any placement; the message
            names the fraction and the device.
    """
    base = dataclasses.replace(profile, probe=None)
    out = []
    for fraction in fractions:
        try:
            fallback = solve(base, fallback_caps(profile, fraction))
        except InfeasiblePlacement as err:
            raise InfeasiblePlacement(f"fallback plan at {fraction:g} of the primary plan's accelerator memory: "
                                      f"{err}; drop that level or raise it (fallbacks=[...])") from None
        # solved on the captured graph: the model's name, inputs and capture mode are the primary's
        fallback = dataclasses.replace(fallback, model_name=plan.model_name, inputs=plan.inputs, capture=plan.capture)
        out.append(FallbackPlan(fraction, fallback))
    return dataclasses.replace(plan, fallbacks=tuple(out))
