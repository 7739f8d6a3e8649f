"""An AccumulatingStep called again starts from zero gradients: each call's gradients are that
global batch's own (the mean over its micro-batches of a mean loss), never added to the last
call's, with or without an optimizer; and they equal the full batch's gradients on the model."""

from __future__ import annotations

import torch

import models
from backends.torch.training import AccumulatingStep
from partitioner.batching import fit_batch


def _mse(out: torch.Tensor, _inputs: tuple) -> torch.Tensor:
    return (out.float() ** 2).mean()


def test_a_second_call_gives_that_batchs_gradients_not_their_sum_with_the_firsts() -> None:
    torch.manual_seed(0)
    module, (x,) = models.get("mlp", "tiny")
    fit = fit_batch(module, (x,), "h200-host", global_batch=8, micro_batch=4, pins={"*": "cpu"}, time_limit=10)
    assert fit.steps == 2
    step = AccumulatingStep(fit.plan, module, loss_fn=_mse)
    other = torch.randn_like(x)
    step(x)
    step(other)                                         # no optimizer: the weights stay as they are
    got = {n: p.grad.clone() for n, p in step.module.named_parameters()}
    reference = models.get("mlp", "tiny")[0]
    reference.load_state_dict(module.state_dict())
    _mse(reference(other), (other,)).backward()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
