"""The placed optimizer trains the emitted module as torch's optimizer trains the original.

Plans put ``gpt:tiny``'s blocks and token embedding on ``cuda:0``, bound to its own CPU tag
(``{"cuda:0": "cpu:1"}``: every copy is real), and a hand-made ``training_state`` section offloads
the state of ``blocks.0`` and the embedding to the host (float32 masters, gradients copied out by
hooks, host steps on the worker). Each test trains the emitted module with ``plan.emit_optimizer``
and a copy of the original with torch's own class, and compares parameters after every step.
"""

from __future__ import annotations

import dataclasses

import copy

import pytest
import torch

import models
from backends.torch.optim import PlacedOptimizer
from partitioner import partition
from partitioner.errors import HetpartError
from partitioner.plan.values import _OPTIMIZERS
from tests.e2e.training_states import with_training_state

BIND = {"cuda:0": "cpu:1"}
OFFLOAD = ["blocks.0*", "tok_emb*"]
PINS = {"blocks.*": "cuda:0", "tok_emb*": "cuda:0"}


def planned_for(optimizer: str):
    """The planner's enum may not know every optimizer the section names yet (adagrad, ...)."""
    if optimizer not in _OPTIMIZERS:
        pytest.skip(f"plans cannot name {optimizer!r} until cost_models.training.Optimizer models it")


@pytest.fixture(scope="module")
def plans():
    """optimizer -> gpt:tiny and its plan for that optimizer (made once)."""
    model, inputs = models.get("gpt", "tiny")
    made = {}

    def plan_for(optimizer: str = "adam"):
        planned_for(optimizer)
        if optimizer not in made:
            made[optimizer] = partition(model, inputs, "h200-host", training=True, optimizer=optimizer, pins=PINS)
        return model.train(), inputs, made[optimizer]

    return plan_for


@pytest.fixture(scope="module")
def gpt(plans):
    return plans("adam")


def pair(model, plan, **hyper):
    """(eager copy, its torch optimizer), (emitted module, its placed optimizer)."""
    reference = copy.deepcopy(model).train()
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    opt = plan.emit_optimizer(emitted, **hyper)
    eager_cls = opt.kind.dense
    return (reference, eager_cls(reference.parameters(), **opt.kind.hyperparameters(eager_cls, opt.kind.defaults))), \
        (emitted, opt)


def train_step(module, opt, inputs):
    opt.zero_grad()
    loss = module(*inputs).float().mean()
    loss.backward()
    opt.step()
    return loss.detach()


def assert_same_parameters(reference, emitted) -> None:
    trained = dict(emitted.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(trained[name].detach(), p.detach(), msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("optimizer, hyper", [
    ("adam", {"lr": 1e-2}),
    ("sgd", {"lr": 0.5}),
    ("sgd-momentum", {"lr": 0.1, "momentum": 0.9}),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}),
    ("adagrad", {"lr": 0.1}),
])
def test_three_steps_equal_eager_training(plans, optimizer, hyper) -> None:
    model, inputs, plan = plans(optimizer)
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (reference, eager), (emitted, opt) = pair(model, plan, **hyper)
    assert isinstance(opt, torch.optim.Optimizer)
    for _ in range(3):
        torch.testing.assert_close(train_step(emitted, opt, inputs), train_step(reference, eager, inputs))
        assert_same_parameters(reference, emitted)
    moved = opt.last_copies
    offloaded = sum(p.numel() * 4 for n, p in emitted.named_parameters() if n.startswith(("blocks.0.", "tok_emb")))
    assert moved[("gradient", "cuda:0", "cpu")] == offloaded
    assert moved[("weights", "cpu", "cuda:0")] == offloaded


def test_state_lives_on_the_planned_devices(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (_, _), (emitted, opt) = pair(model, plan, lr=1e-3)
    train_step(emitted, opt, inputs)
    rows = {r.name: r for r in opt.placement()}
    assert rows["blocks.0.attn.q_proj.weight"].state == "cpu"
    assert rows["blocks.1.attn.q_proj.weight"].state == "cuda:0"
    emb = emitted.get_parameter("tok_emb.weight")
    # Adam's two moments and the float32 master, on the host
    assert rows["tok_emb.weight"].state_bytes == 3 * emb.numel() * 4
    state = opt.state[emb]
    assert state["exp_avg"].shape == emb.shape
    # the device gradient of an offloaded parameter is freed as soon as it is copied out
    emitted(*inputs).float().mean().backward()
    assert emb.grad is None
    assert emitted.get_parameter("blocks.1.attn.q_proj.weight").grad is not None
    opt.step()


def test_host_steps_run_before_step_is_called(gpt) -> None:
    import time

    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (_, _), (emitted, opt) = pair(model, plan, lr=1e-2)
    emitted(*inputs).float().mean().backward()
    time.sleep(0.5)  # the worker steps the offloaded parameters meanwhile
    before = emitted.get_parameter("blocks.0.attn.q_proj.weight").detach().clone()
    opt.step()
    timing = opt.last_timing
    assert 0 < timing.host_hidden_s <= timing.host_busy_s
    # the weights change only when step() copies the masters back
    assert not torch.equal(before, emitted.get_parameter("blocks.0.attn.q_proj.weight").detach())


def test_an_lr_scheduler_gives_eager_learning_rates_and_parameters(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (reference, eager), (emitted, opt) = pair(model, plan, lr=1e-2)
    schedules = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=5e-2, total_steps=4) for o in (eager, opt)]
    for _ in range(4):
        for (module, o), schedule in zip(((reference, eager), (emitted, opt)), schedules):
            train_step(module, o, inputs)
            schedule.step()
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in eager.param_groups]
        assert [g["betas"] for g in opt.param_groups] == [g["betas"] for g in eager.param_groups]
        assert_same_parameters(reference, emitted)


def test_state_dict_round_trips_in_torch_format(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (reference, eager), (emitted, opt) = pair(model, plan, lr=1e-2)
    for _ in range(2):
        train_step(emitted, opt, inputs)
        train_step(reference, eager, inputs)
    saved, theirs = opt.state_dict(), eager.state_dict()
    assert saved["state"].keys() == theirs["state"].keys()
    assert saved["param_groups"][0]["params"] == theirs["param_groups"][0]["params"]
    for index, state in theirs["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(saved["state"][index][key], value)
    # a fresh optimizer over the same module takes torch's own state dict and continues as eager does
    fresh = plan.emit_optimizer(emitted, lr=1.0)
    fresh.load_state_dict(theirs)
    assert fresh.param_groups[0]["lr"] == 1e-2
    emb = emitted.get_parameter("tok_emb.weight")
    assert fresh.state[emb]["exp_avg"].device.type == "cpu"
    train_step(emitted, fresh, inputs)
    train_step(reference, eager, inputs)
    assert_same_parameters(reference, emitted)


def test_weights_loaded_into_the_module_refresh_the_masters(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (reference, eager), (emitted, opt) = pair(model, plan, lr=1e-2)
    train_step(emitted, opt, inputs)
    train_step(reference, eager, inputs)
    # both modules get the original weights back; torch's Adam steps what the parameters now hold,
    # and so must the placed one (its masters refreshed, not the weights of step 1)
    emitted.load_state_dict(model.state_dict())
    reference.load_state_dict(model.state_dict())
    train_step(emitted, opt, inputs)
    train_step(reference, eager, inputs)
    assert_same_parameters(reference, emitted)


@pytest.mark.parametrize("last_backward", [True, False], ids=["held-until-the-last-backward", "stepped-by-step"])
def test_accumulated_gradients_step_as_eager(gpt, last_backward: bool) -> None:
    """Backward passes inside ``accumulating()`` hold their steps; the steps start with the backward
    after the block, or, without one, in step() at once (the worker may not have added the gradients yet)."""
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (reference, eager), (emitted, opt) = pair(model, plan, lr=1e-2)
    for module, o, placed in ((reference, eager, False), (emitted, opt, True)):
        o.zero_grad()
        with opt.accumulating() if placed else torch.enable_grad():
            module(*inputs).float().mean().backward()
        if last_backward:
            module(*inputs).float().mean().backward()
        o.step()
    assert_same_parameters(reference, emitted)


def test_a_newer_optimizer_over_the_module_takes_its_hooks(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (_, _), (emitted, old) = pair(model, plan, lr=1e-2)
    copied = plan.emit(copy.deepcopy(model).train(), BIND)
    on_copy = plan.emit_optimizer(copied, lr=1e-2)  # another module: the first optimizer keeps its hooks
    train_step(emitted, old, inputs)
    train_step(copied, on_copy, inputs)
    assert_same_parameters(copied, emitted)
    new = plan.emit_optimizer(emitted, lr=1e-2)
    emitted(*inputs).float().mean().backward()
    with pytest.raises(HetpartError, match=r"a newer placed optimizer was built over this module"):
        old.step()
    new.step()


def test_a_second_gradient_before_step_is_refused(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (_, _), (emitted, opt) = pair(model, plan, lr=1e-2)
    emitted(*inputs).float().mean().backward()
    with pytest.raises(HetpartError, match=r"second gradient for .* before step\(\).*opt\.accumulating\(\)"):
        emitted(*inputs).float().mean().backward()
    with pytest.raises(HetpartError, match=r"zero_grad\(\) before step\(\)"):
        opt.zero_grad()


def test_zero_grad_without_set_to_none_keeps_zeroed_gradients(gpt) -> None:
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD)
    (_, _), (emitted, opt) = pair(model, plan, lr=1e-2)
    with opt.accumulating():
        emitted(*inputs).float().mean().backward()
    opt.zero_grad(set_to_none=False)
    resident = emitted.get_parameter("blocks.1.attn.q_proj.weight")
    assert resident.grad is not None and not resident.grad.any()
    before = [p.detach().clone() for p in emitted.parameters()]
    opt.step()  # Adam's first step with zero gradients moves nothing
    assert all(torch.equal(b, p) for b, p in zip(before, emitted.parameters()))


def test_a_plan_without_a_training_state_steps_where_weights_live(gpt) -> None:
    model, inputs, plan = gpt
    plan = dataclasses.replace(with_training_state(plan, model), training_state={})  # as plans before the section
    (reference, eager), (emitted, opt) = pair(model, plan, lr=1e-2)
    assert not plan.training_state and opt.last_copies == {}
    for _ in range(2):
        train_step(emitted, opt, inputs)
        train_step(reference, eager, inputs)
    assert_same_parameters(reference, emitted)
    assert opt.last_copies == {}


# -- sparse rows ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sparse_emb():
    """optimizer -> emb-transformer:tiny, its embedding sparse=True, and its plan."""
    model, inputs = models.get("emb-transformer", "tiny")
    model.emb.sparse = True  # the eager model makes row-sparse gradients; the capture keeps sparse=True
    made = {}

    def plan_for(optimizer: str):
        planned_for(optimizer)
        if optimizer not in made:
            made[optimizer] = partition(model, inputs, "h200-host", training=True, optimizer=optimizer,
                                        pins={"emb*": "cuda:0", "layers.*": "cuda:0"})
        return model.train(), inputs, made[optimizer]

    return plan_for


@pytest.mark.parametrize("optimizer, hyper", [("sgd", {"lr": 0.5}), ("adagrad", {"lr": 0.1}),
                                              ("sparse-adam", {"lr": 1e-2})])
def test_a_row_sparse_embedding_update_equals_eager(sparse_emb, optimizer, hyper) -> None:
    from backends.torch.optim.reference import reference_optimizers

    model, inputs, plan = sparse_emb(optimizer)
    plan = with_training_state(plan, model, offload=["emb.*"], sparse=["emb.*"])
    assert plan.training_state["params"]["emb.weight"]["update"] == "sparse"
    reference = copy.deepcopy(model).train()
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    opt = plan.emit_optimizer(emitted, **hyper)
    eager = reference_optimizers(reference, opt.kind)
    for _ in range(3):
        for o in eager:
            o.zero_grad()
        reference(*inputs).mean().backward()
        assert reference.emb.weight.grad.is_sparse
        for o in eager:
            o.step()
        train_step(emitted, opt, inputs)
        assert_same_parameters(reference, emitted)
    # the gradient left the device row-sparse: indices and touched rows, not the table
    table = emitted.get_parameter("emb.weight")
    assert 0 < opt.last_copies[("gradient", "cuda:0", "cpu")] < table.numel() * 4


def test_sparse_adam_on_a_dense_embedding_gradient_equals_sparse_adam_on_the_sparse_one(sparse_emb) -> None:
    """An emitted module whose embedding makes a dense gradient: SparseAdam gets its touched rows."""
    from backends.torch.optim.reference import reference_optimizers

    model, inputs, plan = sparse_emb("sparse-adam")
    dense = copy.deepcopy(model)
    dense.emb.sparse = False
    plan = partition(dense, inputs, "h200-host", training=True, optimizer="sparse-adam",
                     pins={"emb*": "cuda:0", "layers.*": "cuda:0"})
    plan = with_training_state(plan, dense, offload=["emb.*"], sparse=["emb.*"])
    emitted = plan.emit(copy.deepcopy(dense).train(), BIND)
    opt = plan.emit_optimizer(emitted, lr=1e-2)
    reference = copy.deepcopy(model).train()  # sparse=True: torch's SparseAdam recipe
    eager = reference_optimizers(reference, opt.kind)
    for _ in range(3):
        for o in eager:
            o.zero_grad()
        reference(*inputs).mean().backward()
        for o in eager:
            o.step()
        train_step(emitted, opt, inputs)
        assert_same_parameters(reference, emitted)


# -- bad input ----------------------------------------------------------------------------------


def test_momentum_on_a_plan_priced_for_sgd_is_refused(plans) -> None:
    model, _, plan = plans("sgd")
    plan = with_training_state(plan, model)
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    with pytest.raises(HetpartError, match=r"momentum=0\.9: the plan priced 'sgd'.*optimizer='sgd-momentum'"):
        plan.emit_optimizer(emitted, lr=0.1, momentum=0.9)
    with pytest.raises(HetpartError, match=r"betas: not a hyperparameter of SGD"):
        plan.emit_optimizer(emitted, lr=0.1, betas=(0.9, 0.99))
    with pytest.raises(HetpartError, match=r"SGD refuses the hyperparameters: Invalid learning rate"):
        plan.emit_optimizer(emitted, lr=-1.0)


def test_amsgrad_the_plan_did_not_price_is_refused(gpt) -> None:
    model, _, plan = gpt
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    with pytest.raises(HetpartError, match=r"amsgrad=True keeps a third state tensor"):
        plan.emit_optimizer(emitted, lr=1e-3, amsgrad=True)


def test_an_optimizer_hetpart_does_not_model_is_named_with_the_ones_it_does() -> None:
    from backends.torch.optim import optimizer_kind

    with pytest.raises(HetpartError, match=r"'lion' is not an optimizer hetpart models: it models sgd, "
                                           r"sgd-momentum, adam, adamw, adagrad, sparse-adam"):
        optimizer_kind("lion", {"lr": 1e-3})


def test_an_inference_plan_builds_no_optimizer(gpt) -> None:
    model, inputs, _ = gpt
    plan = partition(model.eval(), inputs, "h200-host", pins=PINS)
    model.train()
    emitted = plan.emit(copy.deepcopy(model).eval(), BIND)
    with pytest.raises(HetpartError, match=r"inference plan.*re-plan with training=True"):
        plan.emit_optimizer(emitted, lr=1e-3)


def test_a_module_not_emitted_from_the_plan_is_refused(gpt) -> None:
    model, _, plan = gpt
    with pytest.raises(HetpartError, match=r"was not emitted from a plan.*plan\.emit\(model, device_map\)"):
        plan.emit_optimizer(model, lr=1e-3)
    other = with_training_state(plan, model, offload=OFFLOAD)
    emitted = other.emit(copy.deepcopy(model).train(), BIND)
    with pytest.raises(HetpartError, match=r"emitted from another plan .*from another placement"):
        plan.emit_optimizer(emitted, lr=1e-3)


def test_parameters_of_another_module_are_refused(gpt) -> None:
    model, _, plan = gpt
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    with pytest.raises(HetpartError, match=r"not one of the emitted module's"):
        plan.emit_optimizer(emitted, list(model.parameters()), lr=1e-3)


def test_a_delayed_update_gives_the_weights_of_one_step_before(gpt) -> None:
    """ZeRO-Offload's one-step delayed update, opted into: the forward of iteration t+1 reads the
    host-stepped weights as the updates up to t-1 left them; the other parameters step at once.
    Eager reference: a shadow copy steps every parameter with torch's optimizer; before each step
    the model keeps the shadow's host-stepped weights as they were, the rest as they become."""
    model, inputs, plan = gpt
    plan = with_training_state(plan, model, offload=OFFLOAD, delayed_update=True)
    assert plan.training_state["delayed_update"]
    assert not any(ps["exact"] for ps in plan.training_state["params"].values())
    emitted = plan.emit(copy.deepcopy(model).train(), BIND)
    opt = plan.emit_optimizer(emitted, lr=1e-2)
    host = {r.name for r in opt.placement() if r.state != r.weights or r.state == "cpu"}
    assert host and opt.delayed
    reference, shadow = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    eager = torch.optim.Adam(shadow.parameters(), lr=1e-2)
    ref_params, shadow_params = dict(reference.named_parameters()), dict(shadow.named_parameters())
    for _ in range(4):
        train_step(emitted, opt, inputs)
        reference.zero_grad()
        reference(*inputs).float().mean().backward()
        for name, p in ref_params.items():
            shadow_params[name].grad = p.grad
        before = {name: shadow_params[name].detach().clone() for name in host}
        eager.step()
        with torch.no_grad():
            for name, p in ref_params.items():
                p.copy_(before[name] if name in host else shadow_params[name])
        assert_same_parameters(reference, emitted)
    opt.synchronize()  # the last host steps land: every weight as the shadow has it
    assert_same_parameters(shadow, emitted)


def test_the_placed_optimizer_is_exported_for_users() -> None:
    import backends.torch

    assert backends.torch.PlacedOptimizer is PlacedOptimizer
    assert issubclass(PlacedOptimizer, torch.optim.Optimizer)
