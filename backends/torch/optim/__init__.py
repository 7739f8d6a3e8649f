"""The emitted training step's optimizer: each parameter's state, gradient and step where the plan puts them.

In: a training plan and the module ``plan.emit`` built from it. Out: a real
``torch.optim.Optimizer`` (``plan.emit_optimizer(emitted, lr=...)``), so the training loop stays
``loss.backward(); opt.step(); opt.zero_grad()`` and LR schedulers, ``state_dict`` and
``load_state_dict`` work.

============  ===================================================================================
module        what it does
============  ===================================================================================
``kinds``     the plan's optimizer name as torch's classes; the hyperparameters the plan priced
``copies``    gradients to the state's device as backward makes them, updated masters back
              (side streams and events on CUDA, plain copies on a CPU binding), counted per link
``placed``    :class:`PlacedOptimizer`: torch's optimizers per state device, post-accumulate-grad
              hooks and a worker thread running host steps beside backward
``streamed_state``  a state kept on the host, brought to the weight's device for its step and sent
              back (a side stream on CUDA), stepped from the hook beside backward
``from_plan`` :func:`placed_optimizer`: the plan's places for the module emitted from it
``reference`` :func:`reference_optimizers`: the same torch optimizer over an eager model (checks)
============  ===================================================================================

Example:
    >>> emitted = plan.emit(model, {"cuda:0": "cpu:1"})      # doctest: +SKIP
    >>> opt = plan.emit_optimizer(emitted, lr=1e-3)               # doctest: +SKIP
    >>> emitted(*inputs).sum().backward(); opt.step(); opt.zero_grad()   # doctest: +SKIP
"""

from __future__ import annotations

from backends.torch.optim.from_plan import placed_optimizer
from backends.torch.optim.kinds import OptimizerKind, optimizer_kind
from backends.torch.optim.placed import PlacedOptimizer, StateRow, StepTiming

__all__ = ["OptimizerKind", "PlacedOptimizer", "StateRow", "StepTiming", "optimizer_kind", "placed_optimizer"]
