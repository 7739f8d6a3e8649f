"""End to end: emitted modules equal the original model (outputs, loss, gradients), bound to the CPU."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models
from partitioner import Plan, from_module, load_profile, partition
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, StreamMode, evaluate

PROFILES = ("h200-host", "cpu-gpu-npu", "2xh200-host", "a100-host", "cpu")


def _outputs(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in value if isinstance(t, torch.Tensor)]  # type: ignore[union-attr]


def _binding(plan: Plan) -> dict[str, str]:
    return {d: "cpu" for d in plan.devices.names() if d != "cpu"}


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor:
    return sum(o.float().sum() for o in outputs)  # type: ignore[return-value]


def assert_same_forward(model: torch.nn.Module, emitted: torch.nn.Module, inputs: tuple) -> None:
    with torch.no_grad():
        expected, got = _outputs(model(*inputs)), _outputs(emitted(*inputs))
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)


def assert_same_gradients(model: torch.nn.Module, emitted: torch.nn.Module, inputs: tuple) -> None:
    model.zero_grad()
    emitted.zero_grad()
    loss_ref = _loss(_outputs(model(*inputs)))
    loss_ref.backward()
    loss = _loss(_outputs(emitted(*inputs)))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), loss_ref, rtol=1e-4, atol=1e-4)
    ours = dict(emitted.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        assert ours[name].grad is not None, f"no gradient for {name}"
        torch.testing.assert_close(ours[name].grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=f"gradient of {name}")


@pytest.mark.parametrize("name", models.names())
@pytest.mark.parametrize("profile", PROFILES)
def test_ilp_plans_run_and_match_the_original(name: str, profile: str) -> None:
    model, inputs = models.get(name, "tiny")
    accel = [d for d in load_profile(profile).names() if d != "cpu"]
    caps = {d: "24KB" for d in accel}  # tight caps push work onto several devices
    plan = partition(model, inputs, profile, memory=caps or None, model_name=name)
    emitted = plan.emit(model, _binding(plan))
    assert_same_forward(model, emitted, inputs)
    assert list(emitted.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("name", models.names())
def test_training_plans_give_equal_loss_and_gradients(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    plan = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "24KB", "npu:0": "16KB"}, training=True,
                     optimizer="sgd", model_name=name)
    assert not plan.weights
    emitted = plan.emit(model, _binding(plan))
    emitted.train()
    assert_same_gradients(model, emitted, inputs)
    opt = torch.optim.SGD(emitted.parameters(), lr=0.1)  # an optimizer over emitted.parameters() just works
    opt.step()


def test_state_dict_round_trips_and_shared_parameters_stay_shared() -> None:
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "h200-host", pins={"lm_head": "cuda:0", "tok_emb": "cpu"})
    emitted = plan.emit(model, {"cuda:0": "cpu"})
    assert emitted.lm_head.weight is emitted.tok_emb.weight
    other, _ = models.get("gpt", "tiny", seed=1)
    emitted.load_state_dict(other.state_dict())
    assert_same_forward(other, emitted, inputs)
    reloaded, _ = models.get("gpt", "tiny", seed=2)
    reloaded.load_state_dict(emitted.state_dict())
    assert_same_forward(reloaded, emitted, inputs)


def test_the_callers_model_is_not_changed() -> None:
    model, inputs = models.get("mlp", "tiny")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = partition(model, inputs, "h200-host", pins={"layers.0*": "cuda:0"})
    emitted = plan.emit(model, {"cuda:0": "cpu"})
    with torch.no_grad():
        for p in emitted.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_missing_device_names_it_and_the_binding_that_works() -> None:
    model, inputs = models.get("mlp", "tiny")
    plan = partition(model, inputs, "h200-host", pins={"layers.0*": "cuda:0"})
    if torch.cuda.is_available():
        pytest.skip("cuda:0 is present here")
    with pytest.raises(HetpartError, match=r"cuda:0.*not present.*'cuda:0': 'cpu'.*--bind cuda:0=cpu"):
        plan.emit(model)


def test_a_plan_for_another_model_is_rejected() -> None:
    mlp, mlp_inputs = models.get("mlp", "tiny")
    plan = partition(mlp, mlp_inputs, "h200-host")
    gpt, _ = models.get("gpt", "tiny")
    with pytest.raises(PlanMismatch, match=plan.fingerprint):
        plan.emit(gpt, {"cuda:0": "cpu"}, example_inputs=models.get("gpt", "tiny")[1])


# -- random valid placements ----------------------------------------------------------------------


def plan_for(model: torch.nn.Module, inputs: tuple, profile: str, rng: random.Random, *, stream: bool) -> Plan:
    """A plan with a random device per op (and random streamed weights on accelerators)."""
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile(profile), Options(streaming=stream))
    device = {n: rng.choice(problem.allowed[n]) for n in problem.nodes}
    streamed = {
        n: problem.host for n in problem.streamable if device[n] != problem.host and rng.random() < 0.5
    } if stream else {}
    order = tuple(problem.nodes)
    placement = Placement(device, streamed, StreamMode.PREFETCH, order)
    solution = Solution("random", placement, Status.HEURISTIC)
    return Plan.from_solution(problem, solution, evaluate(problem, placement))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(models.names()),
    profile=st.sampled_from(["h200-host", "cpu-gpu-npu", "2xh200-host"]),
    seed=st.integers(0, 10_000),
    stream=st.booleans(),
)
def test_random_placements_compute_the_same(name: str, profile: str, seed: int, stream: bool) -> None:
    model, inputs = models.get(name, "tiny")
    plan = plan_for(model, inputs, profile, random.Random(seed), stream=stream)
    emitted = plan.emit(model, _binding(plan))
    assert_same_forward(model, emitted, inputs)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(models.names()), seed=st.integers(0, 10_000))
def test_random_placements_train_the_same(name: str, seed: int) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    plan = plan_for(model, inputs, "cpu-gpu-npu", random.Random(seed), stream=False)
    emitted = plan.emit(model, _binding(plan))
    emitted.train()
    assert_same_gradients(model, emitted, inputs)


def test_transfers_in_the_code_follow_the_plan() -> None:
    model, inputs = models.get("emb-transformer", "tiny")
    plan = partition(model, inputs, "h200-host", pins={"emb": "cpu", "layers*": "cuda:0", "head": "cuda:0"},
                     streaming=False)
    emitted = plan.emit(model, {"cuda:0": "cpu"})
    code = emitted.code
    assert ".to(" in code
    activation = [t for t in plan.transfers if t.kind == "activation" and t.src != t.dst]
    assert activation  # the embedding's output crosses to the GPU
    assert_same_forward(model, emitted, inputs)


def test_emit_refuses_names_torch_fx_would_paste_into_code(tmp_path) -> None:
    class Evil(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module('x" if getattr(__import__("os"), "system")("touch PWNED") else "', torch.nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return getattr(self, 'x" if getattr(__import__("os"), "system")("touch PWNED") else "')(x)

    model, inputs = Evil(), (torch.randn(2, 4),)
    plan = partition(model, inputs, "cpu")
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(HetpartError, match="emit_source"):
            plan.emit(model)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "PWNED").exists()
