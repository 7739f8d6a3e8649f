"""End to end: a batch-sized plan's emitted module, run as accumulated micro-batches, gives the
gradients of the whole batch (real torch, the plan's GPU bound to the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import models
from backends.torch.check import check_plan
from backends.torch.training import AccumulatingStep, accumulate_gradients, concat_outputs
from partitioner.batching import fit_batch
from partitioner.errors import HetpartError

CAPS = {"cuda:0": "1MB", "cpu": "1MB"}  # gpt:tiny: micro-batch 8 fits, 16 does not
GLOBAL = 32
BIND = {"cuda:0": "cpu"}


@pytest.fixture(scope="module")
def setup():
    module, _ = models.get("gpt", "tiny")
    tokens = torch.randint(0, 128, (GLOBAL, 16), generator=torch.Generator().manual_seed(1))  # distinct rows
    # the user's optimizer steps after the accumulated backward: no placed optimizer
    fit = fit_batch(module, (tokens,), "h200-host", memory=CAPS, time_limit=10, placed_optimizer=False)
    assert (fit.micro_batch, fit.steps) == (8, 4)
    return module, tokens, fit


def _next_token_loss(out: torch.Tensor, inputs: tuple) -> torch.Tensor:
    """A mean loss over the batch: predict each next token."""
    tokens = inputs[0]
    return F.cross_entropy(out[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def _full_batch_grads(module: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    ref = copy.deepcopy(module).train()
    loss = _next_token_loss(ref(tokens), (tokens,))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in ref.named_parameters()}


def test_accumulated_gradients_equal_the_full_batch_gradients(setup) -> None:
    module, tokens, fit = setup
    step = AccumulatingStep(fit.plan, module, BIND, loss_fn=_next_token_loss, reduction="mean")
    loss = step(tokens)
    ref_loss, ref_grads = _full_batch_grads(module, tokens)
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in step.module.named_parameters()}
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, rtol=1e-4, atol=1e-6), name


def test_a_mean_loss_not_scaled_by_the_steps_gives_other_gradients(setup) -> None:
    """The comparison can fail: summing unscaled mean losses gives steps x the gradients."""
    module, tokens, fit = setup
    emitted = fit.plan.emit(module, BIND)
    accumulate_gradients(emitted, (tokens,), fit.steps, _next_token_loss, reduction="sum")
    _, ref_grads = _full_batch_grads(module, tokens)
    got = dict(emitted.named_parameters())["blocks.0.mlp.ff1.weight"].grad
    assert not torch.allclose(got, ref_grads["blocks.0.mlp.ff1.weight"], rtol=1e-4, atol=1e-6)
    assert torch.allclose(got, fit.steps * ref_grads["blocks.0.mlp.ff1.weight"], rtol=1e-4, atol=1e-5)


def test_an_optimizer_step_after_accumulation_equals_the_full_batch_step(setup) -> None:
    module, tokens, fit = setup
    step = AccumulatingStep(fit.plan, module, BIND, loss_fn=_next_token_loss)
    step(tokens, optimizer=torch.optim.SGD(step.module.parameters(), lr=0.1))
    ref = copy.deepcopy(module).train()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    _next_token_loss(ref(tokens), (tokens,)).backward()
    opt.step()
    after = dict(step.module.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.allclose(after[name], p, rtol=1e-5, atol=1e-6), name


def test_hetpart_check_compares_accumulated_with_full_batch_gradients(setup) -> None:
    module, tokens, fit = setup
    report = check_plan(fit.plan, module, (tokens,), BIND, training=True, repeat=1)
    assert report.passed, report.to_text()
    assert report.outputs[0].shape == (GLOBAL, 16, 128)  # the whole batch, joined from the micro-batches
    assert len(report.grads) == len(list(module.parameters()))
    # inputs of another batch are rescaled to the plan's global batch
    again = check_plan(fit.plan, module, (tokens[:2],), BIND, training=True, repeat=1)
    assert again.passed and again.outputs[0].shape[0] == GLOBAL


def test_bad_input_to_the_accumulating_step(setup) -> None:
    module, tokens, fit = setup
    step = AccumulatingStep(fit.plan, module, BIND, loss_fn=_next_token_loss)
    with pytest.raises(HetpartError, match="global batch of 32 rows .4 x 8.; got 24 rows"):
        step(tokens[:24])
    with pytest.raises(HetpartError, match="do not split into 3 equal micro-batches"):
        accumulate_gradients(step.module, (tokens,), 3, _next_token_loss)
    with pytest.raises(HetpartError, match="reduction 'avg'"):
        accumulate_gradients(step.module, (tokens,), 4, _next_token_loss, reduction="avg")
    with pytest.raises(HetpartError, match="scalar tensor"):
        accumulate_gradients(step.module, (tokens,), 4, lambda out, _: out.sum(-1))
    with pytest.raises(HetpartError, match="0-d tensor"):
        concat_outputs((torch.tensor(1.0), torch.tensor(2.0)))
    plain = fit.plan.__class__.from_dict({k: v for k, v in fit.plan.to_dict().items() if k != "batch"})
    with pytest.raises(HetpartError, match="no batch section"):
        AccumulatingStep(plain, module, BIND, loss_fn=_next_token_loss)


def test_hetpart_emit_writes_a_fit_plan_at_its_micro_batch(tmp_path, capsys) -> None:
    """`hetpart emit` of a `hetpart fit` plan captures the model at the plan's micro-batch (not the
    zoo's example batch, which is another graph) and the file it writes runs and says so."""
    import subprocess
    import sys

    from partitioner.cli import main

    plan = tmp_path / "fit.json"
    assert main(["fit", "mlp:tiny", "--devices", "cpu-gpu-npu", "--training", "--global-batch", "8",
                 "--micro-batch", "4", "--pin", "linear_1=cuda:0", "--time-limit", "10", "-o", str(plan)]) == 0
    out = tmp_path / "fit.py"
    assert main(["emit", "mlp:tiny", "--plan", str(plan), "-o", str(out),
                 "--bind", "cuda:0=cpu", "--bind", "npu:0=cpu"]) == 0
    said = capsys.readouterr().out
    assert "one micro-batch of 4" in said and "2 of them per global batch of 8" in said
    run = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
