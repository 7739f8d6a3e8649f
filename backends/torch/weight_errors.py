"""Measured output error of packed weights: each weight alone, and a whole plan.

In: a model with its real weights and example inputs. Out: relative L2 errors of the model's
outputs against its float outputs, ``||y_packed - y|| / ||y||`` over every floating output taken
together.

* :func:`weight_errors` packs one weight at a time (its values replaced, for one forward, by the
  values its packed form stands for: :func:`~backends.torch.quantized_ops.fake_quantized`) and
  measures the error that alone costs. These are the terms of the accuracy budget the solver
  bounds (:mod:`partitioner.solvers.packing_error`).
* :func:`plan_error` runs a plan's own emitted module, every device bound to the host (the same
  packing kernels, no placement), so the plan records the error it really has
  (:mod:`partitioner.error_budget` tightens the solver's budget when it is over); a plan packing
  float8 weights (a GPU kernel) is measured with every packed weight's values replaced together
  (:func:`packed_error`).

The model is left as it was: each weight is put back (bit for bit) after its forward.

Example:
    >>> errors = weight_errors(model, (x,), {"fc.weight": ("int8", "int4")})   # doctest: +SKIP
    >>> errors["fc.weight"]["int4"] > errors["fc.weight"]["int8"]              # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from backends.torch.quantized_ops import fake_quantized
from partitioner.errors import HetpartError

__all__ = ["weight_errors", "packed_error", "plan_error", "relative_error"]


def weight_errors(module: torch.nn.Module, args: tuple, params: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """Per parameter name and packed weight dtype: the model's relative output error with that one
    weight packed (see the module docstring).

    Raises:
        HetpartError: a name that is no parameter of ``module``, or a parameter on the meta device
            (a model built without weights: there is nothing to measure).
    """
    with _evaluating(module):
        reference = _floats(module(*args))
        return {name: {dtype: packed_error(module, args, {name: dtype}, reference) for dtype in dtypes}
                for name, dtypes in params.items()}


def packed_error(module: torch.nn.Module, args: tuple, packed: Mapping[str, str],
                 reference: Sequence[torch.Tensor] | None = None) -> float:
    """The model's relative output error with the weights ``packed`` (parameter name -> weight
    dtype) replaced by the values their packed form stands for, together; the weights are put back."""
    named = dict(module.named_parameters(remove_duplicate=False))
    _require_values(named, packed)
    with _evaluating(module):
        if reference is None:
            reference = _floats(module(*args))
        originals = {name: named[name].detach().clone() for name in packed}
        try:
            for name, dtype in packed.items():
                named[name].copy_(fake_quantized(originals[name], dtype).to(named[name].dtype))
            return relative_error(_floats(module(*args)), reference)
        finally:
            for name, value in originals.items():
                named[name].copy_(value)


def plan_error(plan: Any, module: torch.nn.Module, args: tuple, params: Mapping[str, str]) -> tuple[dict[str, float], str]:
    """Each output's relative error against the float model of ``plan`` and ``"all"`` for the outputs
    taken together, and how it was measured: the plan's emitted module with every device bound to
    the host (its kernels and dtypes, no placement), or, where the plan packs a weight in float8
    (whose kernel only GPUs have), the float model with each packed weight's values replaced
    (``params``: op -> its weight's parameter name)."""
    packed = dict(plan.precision.get("weights", {})) if plan.precision else {}
    if "float8" in packed.values():
        error = packed_error(module, args, {params[op]: dtype for op, dtype in packed.items()})
        return {"all": error}, "dequantized weights (float8 has no host kernel)"
    emitted = plan.emit(module, {d: "cpu" for d in plan.devices.names()}, example_inputs=args)
    with _evaluating(module):
        reference = _named(module(*args))
        got = _named(emitted(*args))
    out = {name: relative_error([got.get(name)], [ref]) for name, ref in reference.items()}
    out["all"] = relative_error([got.get(n) for n in reference], list(reference.values()))
    return out, "the plan's kernels on the host"


@contextlib.contextmanager
def _evaluating(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode without gradients, its mode restored after."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


def _require_values(named: Mapping[str, torch.nn.Parameter], params: Collection[str]) -> None:
    missing = [p for p in params if p not in named]
    if missing:
        raise HetpartError(f"cannot measure packing errors: {', '.join(missing[:3])} is not a parameter of the model")
    hollow = [p for p in params if named[p].is_meta]
    if hollow:
        raise HetpartError(f"precision max_error measures the error packed weights cost on the example inputs, but "
                           f"{hollow[0]!r} has no values (a model on the meta device, or a model folder planned "
                           f"hollow); plan the model with its weights loaded, or drop max_error and pack "
                           f"explicitly (weights=int8, keep=...)")


def relative_error(values: Sequence[torch.Tensor | None], reference: Sequence[torch.Tensor]) -> float:
    """``||values - reference|| / ||reference||`` over the tensors taken together, in float32 on the
    host (inf where a value is missing or of another shape)."""
    num = den = 0.0
    for v, r in zip(values, reference, strict=True):
        if not isinstance(v, torch.Tensor) or v.shape != r.shape:
            return float("inf")
        a, b = v.detach().float().cpu(), r.detach().float().cpu()
        num += float((a - b).pow(2).sum())
        den += float(b.pow(2).sum())
    return (num ** 0.5) / max(den ** 0.5, 1e-30)


def _floats(result: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _named(result: Any) -> dict[str, torch.Tensor]:
    """The floating outputs named as ``hetpart check`` names them (``output``, ``output[i]``)."""
    leaves = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    named = {"output": leaves[0]} if len(leaves) == 1 else {f"output[{i}]": t for i, t in enumerate(leaves)}
    return {k: v for k, v in named.items() if v.is_floating_point()}
