"""Training with gradient accumulation: a global batch run as micro-batches through an emitted module.

In: a module (the emitted module of a plan with a ``batch`` section, :mod:`partitioner.plan.batch`,
or any module), the inputs of one global batch, the number of accumulation steps and a loss
function. Out: the gradients of the whole batch in every parameter's ``.grad``, the full batch's
loss, and (on request) the outputs of the whole batch, concatenated.

A global batch of ``G`` rows (dimension 0 of every tensor input) is cut into ``steps`` equal
micro-batches (:func:`~partitioner.micro_batches.split_micro_batches`); each runs forward and
backward in turn, and backward adds into ``.grad``, so only one micro-batch's activations are
alive at a time. For a loss that is a **mean** over the batch, each micro-batch's loss is scaled
by ``1 / steps`` (the mean of equal micro-batches' means is the batch's mean); for a **sum** it is
not scaled. Either way the summed gradients are the full batch's (up to float rounding), except
for layers whose forward depends on the whole batch (batch norm in train mode sees micro-batch
statistics, as in any gradient accumulation).

Example:
    >>> step = AccumulatingStep(plan, model, {"cuda:0": "cpu"}, loss_fn=loss)   # doctest: +SKIP
    >>> loss = step(tokens)     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from partitioner.errors import HetpartError
from partitioner.micro_batches import batch_size, split_micro_batches

__all__ = ["AccumulatedStep", "AccumulatingStep", "accumulate_gradients", "concat_outputs"]

#: loss_fn(outputs of one micro-batch, that micro-batch's inputs) -> a scalar tensor
LossFn = Callable[[Any, tuple], torch.Tensor]
_REDUCTIONS = ("mean", "sum")


@dataclasses.dataclass(frozen=True)
class AccumulatedStep:
    """What one accumulated step computed: the full batch's loss (detached) and, when kept, the
    outputs of each micro-batch in order."""

    loss: torch.Tensor
    outputs: tuple[Any, ...] = ()


def accumulate_gradients(
    module: torch.nn.Module,
    inputs: Any,
    steps: int,
    loss_fn: LossFn,
    *,
    reduction: str = "mean",
    keep_outputs: bool = False,
    forward: Callable[[torch.nn.Module, tuple], Any] | None = None,
) -> AccumulatedStep:
    """Run ``inputs`` as ``steps`` micro-batches forward and backward, adding each one's gradients
    into ``.grad`` (not zeroed first: zero them, or call :class:`AccumulatingStep`).

    Parameters:
        module: the module to train (an emitted module runs one micro-batch's shape).
        inputs: a tensor or a tuple of positional arguments: the global batch along dimension 0.
        steps: accumulation steps; the batch must split into that many equal micro-batches.
        loss_fn: ``loss_fn(outputs, micro_inputs)``, a scalar tensor.
        reduction: ``"mean"`` when the loss is a mean over the batch (scaled by ``1 / steps``),
            ``"sum"`` when it is a sum (not scaled).
        keep_outputs: keep each micro-batch's outputs (detached) in the result.
        forward: ``forward(module, micro_inputs)`` instead of ``module(*micro_inputs)``.

    Raises:
        HetpartError: ``steps`` below 1, an unknown reduction, a loss that is not a scalar, or a
            batch that does not split into ``steps`` equal micro-batches.

    Example:
        >>> model = torch.nn.Linear(3, 1)
        >>> x = torch.ones(4, 3)
        >>> accumulate_gradients(model, x, 2, lambda out, _: out.mean()).loss.shape
        torch.Size([])
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise HetpartError(f"accumulation steps {steps!r}: expected a whole number, at least 1")
    if reduction not in _REDUCTIONS:
        raise HetpartError(f"reduction {reduction!r}: use 'mean' (a loss averaged over the batch, scaled by "
                           f"1/steps) or 'sum' (a loss summed over the batch)")
    call = forward or (lambda m, a: m(*a))
    scale = 1.0 / steps if reduction == "mean" else 1.0
    total = None
    outputs = []
    for chunk in split_micro_batches(inputs, steps):
        out = call(module, chunk)
        loss = loss_fn(out, chunk)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise HetpartError(f"loss_fn must return a scalar tensor, got "
                               f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}")
        (loss * scale).backward()
        part = loss.detach() * scale
        total = part if total is None else total + part.to(total.device)
        if keep_outputs:
            outputs.append(pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out))
    return AccumulatedStep(total, tuple(outputs))


def concat_outputs(outputs: tuple[Any, ...]) -> Any:
    """The micro-batches' outputs as the whole batch's: every tensor leaf concatenated along
    dimension 0 (on the first one's device).

    Raises:
        HetpartError: an output without a batch dimension (a 0-d tensor) cannot be put back together.

    Example:
        >>> concat_outputs((torch.zeros(2, 3), torch.ones(2, 3))).shape
        torch.Size([4, 3])
    """
    leaves, spec = zip(*(pytree.tree_flatten(o) for o in outputs))
    joined = []
    for i, first in enumerate(leaves[0]):
        if not isinstance(first, torch.Tensor):
            joined.append(first)
            continue
        if first.dim() == 0:
            raise HetpartError(f"output {i} is a 0-d tensor: it has no batch dimension, so micro-batches' outputs "
                               f"cannot be joined into the batch's; return per-sample outputs (dimension 0 the batch)")
        joined.append(torch.cat([part[i].to(first.device) for part in leaves], dim=0))
    return pytree.tree_unflatten(joined, spec[0])


class AccumulatingStep:
    """The training step of a plan with a ``batch`` section: its emitted module, and a call that
    zeroes the gradients and accumulates the plan's micro-batches over one global batch.

    Parameters:
        plan: a plan from :func:`partitioner.batching.fit_batch` (or ``partition(..., batch="auto")``).
        model: the model it was made for (its weights are copied, never moved).
        device_map: binds the plan's devices to present ones, e.g. ``{"cuda:0": "cpu"}``.
        loss_fn, reduction: as for :func:`accumulate_gradients`.

    Raises:
        HetpartError: the plan has no ``batch`` section.

    Example:
        >>> step = AccumulatingStep(plan, model, {"cuda:0": "cpu"}, loss_fn=loss)   # doctest: +SKIP
        >>> optimizer = torch.optim.Adam(step.module.parameters())                   # doctest: +SKIP
        >>> step(tokens, optimizer=optimizer)                                       # doctest: +SKIP
    """

    def __init__(self, plan: Any, model: torch.nn.Module, device_map: Mapping[str, str] | None = None, *,
                 loss_fn: LossFn, reduction: str = "mean") -> None:
        if not plan.batch:
            raise HetpartError(f"{plan.source} has no batch section (micro-batch and accumulation steps): make "
                               f"it with `hetpart fit` or partition(..., batch='auto')")
        self.plan = plan
        self.global_batch = plan.batch["global_batch"]
        self.steps = plan.batch["accumulation_steps"]
        self.module = plan.emit(model, device_map)  # a training plan: captured in train mode
        self.loss_fn = loss_fn
        self.reduction = reduction

    def __call__(self, *inputs: Any, optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Zero the gradients, run the global batch as the plan's micro-batches, step ``optimizer``
        when given; returns the full batch's loss.

        Raises:
            HetpartError: the inputs' batch is not the plan's global batch.
        """
        rows = batch_size(inputs)
        if rows != self.global_batch:
            raise HetpartError(f"the plan accumulates a global batch of {self.global_batch} rows "
                               f"({self.steps} x {self.plan.batch['micro_batch']}); got {rows} rows along "
                               f"dimension 0: pass a global batch of {self.global_batch}")
        if optimizer is not None:
            optimizer.zero_grad()
        for p in self.module.parameters():
            p.grad = None
        step = accumulate_gradients(self.module, inputs, self.steps, self.loss_fn, reduction=self.reduction)
        if optimizer is not None:
            optimizer.step()
        return step.loss
