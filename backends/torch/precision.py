"""Precision in the emitted module: ops compute in the dtype the plan gives them.

In: a GraphModule that :func:`~backends.torch.module.place_module` has placed (transfers
inserted) and a plan with a ``precision`` section (:mod:`partitioner.plan.precision`). Out: the
same module, in place, with explicit casts:

* an op the plan computes in 16 bits reads every float32 input (activations, weights, copies)
  through ``.to(dtype)``, inserted right before it on its own device, so what it produces is
  16-bit; an op computing as traced (float32: softmax, norms, losses, reductions, and every op
  the plan leaves out) reads a 16-bit input through ``.to(torch.float32)``: a cast at each
  dtype boundary, where the plan's cost model puts it (on the reader's device, once per value
  and device);
* every float32 output of the model is cast back to float32 where it is produced in 16 bits;
* inference plans store a weight in 16 bits when the op owning it computes in that dtype (the
  plan's memory counts it so; no cast per call; a tied reader in another dtype casts it); training plans keep float32 master weights: the
  parameters stay float32 and their casts are part of the graph, so gradients (and the optimizer
  step) land in float32;
* a training plan with float16 ops gets a :class:`LossScaler` (``module.hetpart_loss_scaler``):
  dynamic loss scaling as ``torch.amp.GradScaler`` does it, against float16 gradient underflow.

Example:
    >>> emitted = plan.emit(model, {"cuda:0": "cpu"})        # doctest: +SKIP
    >>> print(emitted.code)                                   # doctest: +SKIP
    ... linear = torch.ops.aten.linear.default(to_3, to_bf16_1, to_bf16_2) ...
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute, rebind_tensor
from backends.torch.packed import pack_linears
from partitioner.errors import HetpartError

__all__ = ["apply_precision", "LossScaler", "SCALER_ATTR", "DTYPES"]

SCALER_ATTR = "hetpart_loss_scaler"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FLOATS = frozenset(DTYPES.values())
_ASSERT_METADATA = torch.ops.aten._assert_tensor_metadata.default


def apply_precision(gm: torch.fx.GraphModule, plan: Any, *,
                    shared_from: torch.nn.Module | None = None) -> torch.fx.GraphModule:
    """Insert the casts of ``plan``'s precision section into placed ``gm`` (see the module docstring);
    packed linears read ``shared_from``'s packed buffers where given
    (:func:`~backends.torch.packed.pack_linears`).

    Raises:
        HetpartError: the plan was captured without fake values (symbolic trace), so the traced
            dtypes the casts depend on are unknown.
    """
    section = plan.precision
    if not section or not (section.get("ops") or section.get("weights")):
        return gm
    if section.get("weights"):
        pack_linears(gm, plan, section["weights"], shared_from=shared_from)
    if plan.capture != "export":
        raise HetpartError(f"{plan.source} computes ops in 16 bits but was captured with {plan.capture!r}: "
                           f"precision needs the dtypes torch.export records; re-plan with capture 'export'")
    low = {op: DTYPES[a] for op, a in section["ops"].items()}
    if not plan.training:
        _store_low_weights(gm, plan, low)
    _Casts(gm, low).run()
    fp16 = any(d is torch.float16 for d in low.values())
    if plan.training and fp16:
        setattr(gm, SCALER_ATTR, LossScaler())
    gm.graph.lint()
    gm.recompile()
    return gm


class _Casts:
    """The cast-inserting walk over one graph: what dtype each value holds, and casts where it must change."""

    def __init__(self, gm: torch.fx.GraphModule, low: Mapping[str, torch.dtype]) -> None:
        self.gm, self.low = gm, low
        self.held: dict[torch.fx.Node, torch.dtype | None] = {}
        self.casts: dict[tuple[torch.fx.Node, torch.dtype], torch.fx.Node] = {}

    def run(self) -> None:
        for node in list(self.gm.graph.nodes):
            if node.target is _ASSERT_METADATA:
                self._assert_as_held(node)
            elif node.op == "output":
                self._cast_inputs(node, lambda arg: torch.float32)
            elif node.op in ("call_function", "call_method", "call_module") and node.name in self.low:
                want = self.low[node.name]
                self._cast_inputs(node, lambda arg: want)
            elif node.op in ("call_function", "call_method", "call_module") and not self._is_copy(node):
                self._cast_inputs(node, lambda arg: torch.float32)
            self.held[node] = self._holds(node)

    def _assert_as_held(self, node: torch.fx.Node) -> None:
        """torch.export's dtype assertion (``_assert_tensor_metadata``, before a ``.to(dtype)``)
        checks the value as it is held: the traced float32 where precision holds it in 16 bits is
        not what it reads (casting it back for the check would be a copy the plan does not have)."""
        arg = node.args[0] if node.args else None
        held = self.held.get(arg) if isinstance(arg, torch.fx.Node) else None
        if held in _FLOATS and node.kwargs.get("dtype") in _FLOATS and node.kwargs["dtype"] is not held:
            node.kwargs = {**node.kwargs, "dtype": held}

    def _cast_inputs(self, node: torch.fx.Node, want: Any) -> None:
        """Cast each input that holds a 16-bit or float32 value of a float32 tensor to ``want(arg)``."""
        for arg in list(node.all_input_nodes):
            held = self.held.get(arg)
            if held not in _FLOATS or _traced(arg, self.held) is not torch.float32:
                continue
            dtype = want(arg)
            if held is dtype:
                continue
            key = (arg, dtype)
            if key not in self.casts:
                with self.gm.graph.inserting_before(node):
                    cast = self.gm.graph.call_method("to", (arg, dtype), {})
                cast.meta["hetpart_cast"] = str(dtype).removeprefix("torch.")
                if "hetpart_device" in arg.meta:
                    cast.meta["hetpart_device"] = arg.meta["hetpart_device"]
                self.held[cast] = dtype
                self.casts[key] = cast
            node.replace_input_with(arg, self.casts[key])

    def _is_copy(self, node: torch.fx.Node) -> bool:
        """A device copy place_module inserted (``x.to(device)``) or a streamed weight's fetch."""
        return node.op == "call_method" and node.target in ("to", "get") and "val" not in node.meta

    def _holds(self, node: torch.fx.Node) -> torch.dtype | None:
        """The dtype ``node``'s value holds at run time (None: not one floating tensor)."""
        if node.op == "get_attr":
            value = attribute(self.gm, str(node.target))
            return value.dtype if isinstance(value, torch.Tensor) else None
        if "hetpart_cast" in node.meta:
            return DTYPES[node.meta["hetpart_cast"]]
        if self._is_copy(node):
            if node.target == "get":  # a streamed weight: as the host holds it (its op's dtype)
                return attribute(self.gm, str(node.args[1])).dtype
            first = node.args[0]
            return self.held.get(first) if isinstance(first, torch.fx.Node) else None
        traced = _traced(node, self.held)
        if node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and source.name in self.low and traced is torch.float32:
                return self.low[source.name]  # an item of a tuple computed in 16 bits
            return traced
        if node.name in self.low and traced is torch.float32 and node.kwargs.get("dtype") is None:
            return self.low[node.name]  # (an op given an explicit dtype produces it)
        return traced


def _traced(node: torch.fx.Node, held: Mapping[torch.fx.Node, Any]) -> torch.dtype | None:
    """The dtype of ``node``'s value as captured (a copy: its input's)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    if "hetpart_cast" in node.meta or (node.op == "call_method" and node.target in ("to", "get") and val is None):
        first = node.args[0] if node.args else None
        if node.target == "get" or not isinstance(first, torch.fx.Node):
            return torch.float32
        return _traced(first, held)
    if node.op == "get_attr":
        return held.get(node)
    return None


def _store_low_weights(gm: torch.fx.GraphModule, plan: Any, low: Mapping[str, torch.dtype]) -> None:
    """Inference: a float32 weight whose owner op (``plan.param_names``) computes in 16 bits, and
    does not stream it, is stored in that dtype, as the plan's memory counts it (tied names stay
    one tensor; another reader in another dtype casts it)."""
    owner_of = {name: op for op, names in plan.param_names.items() for name in names}
    converted: dict[int, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        target = str(node.target)
        op = owner_of.get(target)
        if op is None or op not in low:  # (a streamed weight too: the host keeps it in its op's dtype)
            continue
        owner, _, attr = target.rpartition(".")
        module = gm.get_submodule(owner) if owner else gm
        value = getattr(module, attr)
        if not isinstance(value, torch.Tensor) or value.dtype is not torch.float32:
            continue
        if id(value) not in converted:
            data = value.detach().to(low[op])
            converted[id(value)] = torch.nn.Parameter(data, requires_grad=False) \
                if isinstance(value, torch.nn.Parameter) else data
        rebind_tensor(module, attr, converted[id(value)])


class LossScaler:
    """Dynamic loss scaling for float16 training, as ``torch.amp.GradScaler`` does it.

    Multiply the loss by :attr:`scale` before ``backward`` (:meth:`scale_loss`), then
    :meth:`unscale` the gradients (divide them by the scale; True when every one is finite) and
    :meth:`update` the scale: halve it after a step with inf/NaN gradients (the step is skipped),
    double it after ``growth_interval`` finite steps in a row. :meth:`step` does the last three
    around an optimizer.

    Example:
        >>> scaler = LossScaler(init_scale=8.0)
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> scaler.scale_loss((w * 3).sum()).backward()
        >>> scaler.unscale([w]), w.grad.tolist()
        (True, [3.0, 3.0])
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        self.scale, self.growth_factor, self.backoff_factor = float(init_scale), growth_factor, backoff_factor
        self.growth_interval, self.good_steps = growth_interval, 0
        self.skipped = 0  # steps skipped for non-finite gradients

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide every gradient by the scale; whether all of them are finite."""
        finite = True
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.scale)
                finite = finite and bool(torch.isfinite(p.grad).all())
        return finite

    def update(self, finite: bool) -> None:
        if not finite:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval and math.isfinite(self.scale * self.growth_factor):
            self.scale *= self.growth_factor
            self.good_steps = 0

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale the optimizer's gradients, step unless one is inf/NaN, update the scale; whether it stepped."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        finite = self.unscale(params)
        if finite:
            optimizer.step()
        self.update(finite)
        return finite
