"""Streamed optimizer state: kept on the host, stepped on the weight's device, equal to eager training.

Plans put ``gpt:tiny``'s blocks and token embedding on ``cuda:0``, bound to its own CPU tag
(``{"cuda:0": "cpu:1"}``: every copy is real); a hand-made ``training_state`` section keeps the
state of ``blocks.0`` and the embedding on the host, streamed to ``cuda:0`` for each step, and
(in the mixed case) offloads ``blocks.1``'s to the host's worker. Each test trains the emitted
module with ``plan.emit_optimizer`` and a copy of the original with torch's own class.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import models
from partitioner import partition
from partitioner.errors import HetpartError
from partitioner.plan.values import PlanFormatError
from tests.e2e.training_states import with_training_state

BIND = {"cuda:0": "cpu:1"}
STREAM = ["blocks.0*", "tok_emb*"]
PINS = {"blocks.*": "cuda:0", "tok_emb*": "cuda:0"}
STATE_COPIES = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "adagrad": 1}


@pytest.fixture(scope="module")
def plans():
    model, inputs = models.get("gpt", "tiny")
    made = {}

    def plan_for(optimizer: str = "adam"):
        if optimizer not in made:
            made[optimizer] = partition(model, inputs, "h200-host", training=True, optimizer=optimizer, pins=PINS)
        return model.train(), inputs, made[optimizer]

    return plan_for


def pair(model, plan, **hyper):
    """(eager copy, its torch optimizer), (emitted module, its placed optimizer)."""
    reference = copy.deepcopy(model).train()
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    opt = plan.emit_optimizer(emitted, **hyper)
    cls = opt.kind.dense
    return (reference, cls(reference.parameters(), **opt.kind.hyperparameters(cls, opt.kind.defaults))), (emitted, opt)


def train_step(module, opt, inputs, scheduler=None):
    opt.zero_grad()
    loss = module(*inputs).float().mean()
    loss.backward()
    opt.step()
    if scheduler is not None:
        scheduler.step()
    return loss.detach()


def assert_same_parameters(reference, emitted) -> None:
    trained = dict(emitted.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(trained[name].detach(), p.detach(), rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def streamed_bytes(emitted) -> int:
    return sum(p.numel() * 4 for n, p in emitted.named_parameters() if n.startswith(("blocks.0.", "tok_emb")))


@pytest.mark.parametrize("optimizer, hyper", [
    ("adam", {"lr": 1e-2}),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}),
    ("sgd-momentum", {"lr": 0.1, "momentum": 0.9}),
    ("adagrad", {"lr": 0.1}),
])
def test_three_steps_equal_eager_training_beside_offloaded_state(plans, optimizer, hyper) -> None:
    model, inputs, plan = plans(optimizer)
    plan = with_training_state(plan, model, stream_state=STREAM, offload=["blocks.1*"])
    states = {ps["step"] for name, ps in plan.training_state["params"].items() if name.startswith("blocks.0.")}
    assert states == {"cuda:0"}
    (reference, eager), (emitted, opt) = pair(model, plan, **hyper)
    for _ in range(3):
        assert torch.equal(train_step(emitted, opt, inputs), train_step(reference, eager, inputs))
        assert_same_parameters(reference, emitted)
    moved = opt.last_copies
    state = STATE_COPIES[optimizer] * streamed_bytes(emitted)
    assert moved[("state", "cpu", "cuda:0")] == state and moved[("state", "cuda:0", "cpu")] == state
    offloaded = sum(p.numel() * 4 for n, p in emitted.named_parameters() if n.startswith("blocks.1."))
    assert moved[("gradient", "cuda:0", "cpu")] == offloaded  # streamed states send no gradient out
    rows = {r.name: r for r in opt.placement()}
    assert rows["blocks.0.attn.q_proj.weight"].state == "cpu" and rows["blocks.0.attn.q_proj.weight"].state_bytes > 0
    count = sum(n.startswith(("blocks.0.", "tok_emb")) for n, _ in emitted.named_parameters())
    assert f"{count} with state streamed" in repr(opt)


def test_the_state_waits_on_the_host_between_steps(plans) -> None:
    """The stepped moments go back into fresh host tensors: the tensors the optimizer keeps are not
    the ones the step wrote on the weight's device."""
    model, inputs, plan = plans("adam")
    plan = with_training_state(plan, model, stream_state=STREAM)
    (_, _), (emitted, opt) = pair(model, plan, lr=1e-2)
    p = emitted.get_parameter("blocks.0.attn.q_proj.weight")
    seen = []
    original = opt._step_inner

    def watch(inner, groups, *, planned_sparse):
        original(inner, groups, planned_sparse=planned_sparse)
        if p in inner.state:
            seen.append(inner.state[p]["exp_avg"])
    opt._step_inner = watch
    train_step(emitted, opt, inputs)
    kept = opt.state[p]["exp_avg"]
    assert seen and all(kept.data_ptr() != t.data_ptr() for t in seen)
    torch.testing.assert_close(kept, seen[-1], rtol=0, atol=0)


def test_schedulers_state_dict_and_accumulation(plans) -> None:
    model, inputs, plan = plans("adam")
    plan = with_training_state(plan, model, stream_state=STREAM)
    (reference, eager), (emitted, opt) = pair(model, plan, lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    eager_sched = torch.optim.lr_scheduler.StepLR(eager, step_size=1, gamma=0.5)
    for _ in range(2):
        assert torch.equal(train_step(emitted, opt, inputs, sched), train_step(reference, eager, inputs, eager_sched))
    assert opt.param_groups[0]["lr"] == eager.param_groups[0]["lr"] == 2.5e-3
    saved = opt.state_dict()
    torch.testing.assert_close(saved["state"], eager.state_dict()["state"], rtol=0, atol=0)
    again = plan.emit_optimizer(emitted, lr=1e-2)
    again.load_state_dict(saved)
    p = emitted.get_parameter("blocks.0.attn.q_proj.weight")
    assert again.state[p]["exp_avg"].device.type == "cpu"
    for module, o in ((emitted, again), (reference, eager)):  # two backward passes accumulated, one step
        o.zero_grad()
        with again.accumulating() if o is again else _nothing():
            module(*inputs).float().mean().backward()
        module(*inputs).float().mean().backward()
        o.step()
    assert_same_parameters(reference, emitted)


class _nothing:  # noqa: N801 - a context manager standing for the eager loop's missing accumulating()
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_zero_grad_before_step_is_refused(plans) -> None:
    model, inputs, plan = plans("adam")
    plan = with_training_state(plan, model, stream_state=STREAM)
    (_, _), (emitted, opt) = pair(model, plan, lr=1e-2)
    emitted(*inputs).float().mean().backward()
    with pytest.raises(HetpartError, match="cannot be taken back"):
        opt.zero_grad()


def test_a_streamed_state_that_is_not_dense_and_exact_is_refused(plans) -> None:
    model, inputs, plan = plans("adam")
    plan = with_training_state(plan, model, stream_state=STREAM)
    section = plan.training_state
    name = "blocks.0.attn.q_proj.weight"
    delayed = dict(section, delayed_update=True)
    with pytest.raises(PlanFormatError, match="a streamed state steps densely and at once"):
        dataclasses.replace(plan, training_state=delayed)
    wrong = dict(section, params={**section["params"], name: dict(section["params"][name], state="cuda:0",
                                                                     step="cpu")})
    with pytest.raises(PlanFormatError, match="only a state held on the host"):
        dataclasses.replace(plan, training_state=wrong)
