"""End to end: emitted modules equal the original model (outputs, loss, gradients), bound to the CPU.

Every emitted module runs under strict devices (:mod:`backends.torch.strict`): each logical device
of the plan is bound to its own CPU tag, the forward fails on the first op that reads a tensor from
another logical device, and the step's copies per (tensor, device) and the bytes resident per device
must equal the plan's transfers and parameter bytes.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models
from backends.strict_report import observed_transfers, planned_parameters, planned_transfers
from backends.torch.strict import StrictRun
from partitioner import Plan, from_module, load_profile, partition
from partitioner.errors import DeviceMismatch, HetpartError, PlanMismatch
from tests.e2e.placements import DLRM_PLACEMENT, factory_plan, plan_for, plan_with_placement

PROFILES = ("h200-host", "cpu-gpu-npu", "2xh200-host", "a100-host", "cpu")


def _outputs(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in value if isinstance(t, torch.Tensor)]  # type: ignore[union-attr]


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor:
    return sum(o.float().sum() for o in outputs)  # type: ignore[return-value]


def emit_strict(plan: Plan, model: torch.nn.Module, **kwargs: object) -> tuple[torch.nn.Module, StrictRun]:
    """``plan.emit`` with every logical device on its own CPU tag, built and watched under strict devices."""
    run = StrictRun(plan)
    with run:
        emitted = run.watch(plan.emit(model, run.device_map, **kwargs))
    return emitted, run


def strict_step(run: StrictRun, emitted: torch.nn.Module, inputs: tuple) -> list[torch.Tensor]:
    """One forward under strict devices; its copies and the resident bytes must be the plan's."""
    with run:
        got = _outputs(run.step(emitted, *inputs))
    report = run.report()
    assert report.passed, report.to_text()
    return got


def assert_same_forward(model: torch.nn.Module, emitted: torch.nn.Module, inputs: tuple, run: StrictRun) -> None:
    with torch.no_grad():
        expected, got = _outputs(model(*inputs)), strict_step(run, emitted, inputs)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)


def assert_same_gradients(model: torch.nn.Module, emitted: torch.nn.Module, inputs: tuple, run: StrictRun) -> None:
    model.zero_grad()
    emitted.zero_grad()
    loss_ref = _loss(_outputs(model(*inputs)))
    loss_ref.backward()
    loss = _loss(strict_step(run, emitted, inputs))  # forward under strict devices, backward outside
    loss.backward()
    torch.testing.assert_close(loss.cpu(), loss_ref, rtol=1e-4, atol=1e-4)
    ours = dict(emitted.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        assert ours[name].grad is not None, f"no gradient for {name}"
        grad = ours[name].grad
        grad = grad.to_dense() if grad.is_sparse else grad  # a row-sparse table's gradient (training_state)
        torch.testing.assert_close(grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=f"gradient of {name}")


@pytest.mark.parametrize("name", models.names())
@pytest.mark.parametrize("profile", PROFILES)
def test_ilp_plans_run_and_match_the_original(name: str, profile: str) -> None:
    model, inputs = models.get(name, "tiny")
    accel = [d for d in load_profile(profile).names() if d != "cpu"]
    caps = {d: "24KB" for d in accel}  # tight caps push work onto several devices
    plan = partition(model, inputs, profile, memory=caps or None, model_name=name)
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)
    assert list(emitted.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("name", models.names())
def test_training_plans_give_equal_loss_and_gradients(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    plan = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "24KB", "npu:0": "16KB"}, training=True,
                     optimizer="sgd", model_name=name)
    assert not plan.weights
    emitted, run = emit_strict(plan, model)
    emitted.train()
    assert_same_gradients(model, emitted, inputs, run)
    opt = torch.optim.SGD(emitted.parameters(), lr=0.1)  # an optimizer over emitted.parameters() just works
    opt.step()


def test_state_dict_round_trips_and_shared_parameters_stay_shared() -> None:
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "h200-host", pins={"lm_head": "cuda:0", "tok_emb": "cpu"})
    emitted, run = emit_strict(plan, model)
    assert emitted.lm_head.weight is emitted.tok_emb.weight
    assert run.mode.device_of(emitted.lm_head.weight) == "cpu"  # with its owner, tok_emb
    other, _ = models.get("gpt", "tiny", seed=1)
    emitted.load_state_dict(other.state_dict())
    assert_same_forward(other, emitted, inputs, run)
    reloaded, _ = models.get("gpt", "tiny", seed=2)
    reloaded.load_state_dict(emitted.state_dict())
    assert_same_forward(reloaded, emitted, inputs, run)


class TiedUnread(torch.nn.Module):
    """``b.weight`` is ``a.weight``; the forward reads only ``a``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).relu()


def test_a_tied_name_no_op_reads_stays_tied() -> None:
    model, inputs = TiedUnread(), (torch.randn(2, 8),)
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"a": "cuda:0"})
    emitted, run = emit_strict(plan, model)
    assert emitted.b.weight is emitted.a.weight
    assert run.mode.device_of(emitted.b.weight) == "cuda:0"
    assert_same_forward(model, emitted, inputs, run)


def test_the_callers_model_is_not_changed() -> None:
    model, inputs = models.get("mlp", "tiny")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = partition(model, inputs, "h200-host", pins={"layers.0*": "cuda:0"})
    emitted, _ = emit_strict(plan, model)
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
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(models.names()), seed=st.integers(0, 10_000))
def test_random_placements_train_the_same(name: str, seed: int) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    plan = plan_for(model, inputs, "cpu-gpu-npu", random.Random(seed), stream=False)
    emitted, run = emit_strict(plan, model)
    emitted.train()
    assert_same_gradients(model, emitted, inputs, run)


def test_a_tensor_read_on_two_other_devices_is_copied_once_to_each() -> None:
    """Per (tensor, device), not per tensor: a consumer on a third device never reads a copy made for
    another device. Each activation the plan moves is copied exactly once per step per destination."""
    model, inputs = models.get("gpt", "tiny")
    graph = from_module(model, inputs)
    shared = next(t for t in graph.tensors.values() if t.producer is not None and len(set(t.consumers)) >= 3)
    first, second, third = list(dict.fromkeys(shared.consumers))[:3]
    plan = plan_with_placement(model, inputs, {first: "cuda:0", second: "npu:0", third: "npu:0"})
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)
    copies = observed_transfers(plan, run.mode.copies)
    assert copies[(shared.name, "cpu", "cuda:0", "activation")] == (1, shared.nbytes)
    assert copies[(shared.name, "cpu", "npu:0", "activation")] == (1, shared.nbytes)
    assert {k: b for k, (_, b) in copies.items()} == planned_transfers(plan)
    assert all(times == 1 for times, _ in copies.values())


def test_every_copy_of_an_ilp_plan_is_a_transfer_of_the_plan() -> None:
    model, inputs = models.get("emb-transformer", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"emb": "cpu", "layers.0*": "cuda:0", "layers.1*": "npu:0",
                                                          "head": "cuda:0"}, streaming=False)
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)
    planned = planned_transfers(plan)
    assert {src for _, src, _, _ in planned} >= {"cpu", "cuda:0", "npu:0"}, "copies leave all three devices"
    assert {k: b for k, (_, b) in observed_transfers(plan, run.mode.copies).items()} == planned
    links = {(r.src, r.dst): (r.copies, r.bytes) for r in run.report().links}
    for src, dst in {(k[1], k[2]) for k in planned}:
        ours = [b for k, b in planned.items() if (k[1], k[2]) == (src, dst)]
        assert links[(src, dst)] == (len(ours), sum(ours))


def test_streamed_parameters_live_on_the_host_and_cross_the_link_once_per_step() -> None:
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"})
    assert plan.weights and set(plan.weights.values()) == {"cpu"}, "the cap should force streaming from the host"
    emitted, run = emit_strict(plan, model)
    named = dict(emitted.named_parameters(remove_duplicate=False))
    for op in plan.weights:
        for name in plan.param_names[op]:
            assert run.mode.device_of(named[name]) == "cpu", f"{name} of streamed op {op} is not on the host"
    resident = {r.device: r.resident for r in run.report().devices}
    assert resident == planned_parameters(plan)
    streamed_bytes = sum(plan.op_bytes[op][1] for op in plan.weights)
    assert resident["cpu"] >= streamed_bytes > 0, "the streamed weights are resident on the host"
    expected = {(op, "cpu", plan.placement[op], "weights"): plan.op_bytes[op][1] for op in plan.weights}
    for _ in range(2):  # every step fetches each streamed op's weights once again
        assert_same_forward(model, emitted, inputs, run)
        weights = {k: v for k, v in observed_transfers(plan, run.mode.copies).items() if k[3] == "weights"}
        assert weights == {k: (1, b) for k, b in expected.items()}


def test_an_item_of_a_multi_output_op_moves_to_its_own_device() -> None:
    model, inputs = models.get("dlrm", "tiny")
    plan = plan_with_placement(model, inputs, DLRM_PLACEMENT)
    planned = planned_transfers(plan)
    assert ("embedding_bag.0", "cpu", "cuda:0", "activation") in planned
    assert ("getitem", "cuda:0", "cpu", "activation") in planned
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)
    assert {k: b for k, (_, b) in observed_transfers(plan, run.mode.copies).items()} == planned


def test_ops_are_issued_in_the_plans_order() -> None:
    """branch_b before branch_a: the emitted forward issues the plan's order, not the program's."""
    model, inputs = models.get("two-branch", "tiny")
    graph = from_module(model, inputs)
    nodes = [op.name for op in graph.topological_order()]
    b_first = tuple(sorted(nodes, key=lambda n: not graph.ops[n].module_path.startswith("branch_b")))
    assert b_first != tuple(nodes)
    plan = plan_with_placement(model, inputs, {n: "cuda:0" for n in nodes if "branch_b" in graph.ops[n].module_path},
                               order=b_first)
    emitted, run = emit_strict(plan, model)
    assert [n.name for n in emitted.graph.nodes if n.name in plan.placement] == list(b_first)
    assert_same_forward(model, emitted, inputs, run)


def test_copies_follow_logical_devices_even_when_two_share_a_physical_one() -> None:
    """Bound to one CPU, the module still copies per logical device, as the plan's transfers say
    (each such copy a no-op at run time); rebinding a device never changes the code's copies."""
    model, inputs = models.get("emb-transformer", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"emb": "cpu", "layers.0*": "cuda:0", "layers.1*": "npu:0",
                                                          "head": "cuda:0"}, streaming=False)
    emitted = plan.emit(model, {"cuda:0": "cpu", "npu:0": "cpu"})
    copies = set()
    for node in emitted.graph.nodes:
        if node.op == "call_method" and node.target == "to":
            (dst,) = {plan.placement[u.name] for u in node.users}
            source = node.args[0]
            if source.op != "placeholder" or dst != "cpu":  # an input read where it arrives: a no-op copy
                copies.add((str(source.target) if source.op == "get_attr" else source.name, dst))
    assert copies == {(t.tensor, t.dst) for t in plan.transfers}
    with torch.no_grad():
        torch.testing.assert_close(emitted(*inputs), model(*inputs))


def test_a_plan_read_back_from_its_file_runs_as_planned(tmp_path) -> None:
    """Transfers survive the file: direction, kind (streamed weights) and bytes, checked by running."""
    model, inputs = models.get("gpt", "tiny")
    made = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"})
    assert {t.kind for t in made.transfers} == {"activation", "weights", "param"}
    plan = Plan.load(made.save(tmp_path / "plan.json"))
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)
    assert {k: b for k, (_, b) in observed_transfers(plan, run.mode.copies).items()} == planned_transfers(made)


@pytest.mark.parametrize(("name", "pins"), [("mlp", {"layers.2": "cuda:0", "layers.4": "npu:0"}),
                                           ("gpt", {"blocks.0*": "cuda:0", "blocks.1*": "npu:0"})])
def test_a_symbolic_trace_plan_moves_each_module_it_calls_whole(name: str, pins: dict[str, str]) -> None:
    """symbolic_trace keeps modules as calls (``call_module``): their parameters go with them, and
    the attributes a trace reads mid-graph are issued before their readers."""
    model, inputs = models.get(name, "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins=pins, capture="symbolic_trace", streaming=False)
    emitted, run = emit_strict(plan, model)
    assert any(n.op == "call_module" and plan.placement.get(n.name) != "cpu" for n in emitted.graph.nodes)
    assert_same_forward(model, emitted, inputs, run)


def test_a_module_called_whole_away_from_its_tied_weight_is_refused() -> None:
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"lm_head": "cuda:0", "tok_emb": "cpu"},
                     capture="symbolic_trace", streaming=False)
    with pytest.raises(HetpartError, match=r"op lm_head runs module lm_head whole on cuda:0.*lm_head\.weight on cpu"):
        plan.emit(model, {"cuda:0": "cpu"})


def test_a_factory_creates_its_tensor_on_its_own_device() -> None:
    plan, model, inputs = factory_plan()
    assert plan.placement["arange"] == "cuda:0"
    emitted, run = emit_strict(plan, model)
    assert_same_forward(model, emitted, inputs, run)


def test_a_missing_copy_fails_on_its_op_naming_the_tensor_and_both_devices() -> None:
    model, inputs = models.get("mlp", "tiny")
    plan = plan_with_placement(model, inputs, {"relu": "cuda:0"})
    emitted, run = emit_strict(plan, model)
    copy = next(n for n in emitted.graph.nodes if n.op == "call_method" and n.target == "to"
                and "relu" in {u.name for u in n.users})
    copy.replace_all_uses_with(copy.args[0])  # the bug: relu reads linear where it was made
    emitted.graph.erase_node(copy)
    emitted.recompile()
    run.watch(emitted)
    with run, pytest.raises(DeviceMismatch, match=r"op relu \(aten\.relu\) is planned on cuda:0 but reads linear on cpu"):
        run.step(emitted, *inputs)


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
