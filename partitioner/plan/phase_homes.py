"""Where a generation plan's phase keeps each parameter, and in which form.

In: one phase's :class:`~partitioner.plan.Plan` (a generation plan's prefill or decode). Out: per
parameter name, the device that holds it (:func:`param_homes`) and the form it is stored in
(:func:`stored_forms`). Both phases of a generation plan must agree on both
(:mod:`partitioner.plan.generation` checks it; :mod:`backends.torch.generate` builds one set of
weights from them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from partitioner.plan import Plan

__all__ = ["param_homes", "stored_forms"]


def param_homes(plan: Plan) -> dict[str, str]:
    """Every parameter and buffer of a phase plan -> the device holding it (its op's device, or
    where a streamed op keeps it)."""
    homes: dict[str, str] = {}
    for op, names in plan.param_names.items():
        home = plan.weights.get(op, plan.placement[op])
        for name in names:
            homes.setdefault(name, home)
    return homes


def stored_forms(plan: Plan) -> dict[str, str]:
    """Every parameter of a phase plan -> the form it is stored in: its owner op's choice as the
    ``precision`` section gives it (``"float32"``, ``"bfloat16"``, ``"bfloat16+int8"``: bfloat16
    with its weight packed in int8, ...); float32 for every one without the section.

    Example:
        >>> stored_forms(gen.decode)["inner.model.lm_head.weight"]       # doctest: +SKIP
        'float32+int8'
    """
    from cost_models.precision import FLOAT32, compose

    section = plan.precision or {}
    ops, packed = section.get("ops", {}), section.get("weights", {})
    forms: dict[str, str] = {}
    for op, names in plan.param_names.items():
        form = compose(ops.get(op, FLOAT32), packed.get(op))
        for name in names:
            forms.setdefault(name, form)
    return forms
