"""Splits by expert (:mod:`partitioner.solvers.expert_streaming`, ``expert_devices``): the captured form
they take, their price, the choices offered, the plan section's checks, and the certificate against
brute force.

The certificate's instance: one fused experts op (8 experts of ``[2048, 1024]`` in float32, 64 MiB,
256 routed rows, its flops scaled by 1,000 so that the accelerator pays for the copies, as a
prefill does) behind an ``aten.transpose`` view, then a ``relu``; ``cuda:0`` capped at 32 MiB.
Resident the weight does not fit, streamed whole its two buffers do not either, in 4 groups three
16 MiB buffers do not: only 8 groups of one expert (three 8 MiB buffers) put it on the accelerator. Brute force over
every placement (devices, streaming, splits), evaluated with ``evaluate``, agrees with the ILP (both
solvers, gap 0), and both lower bounds stay below the optimum. With experts splits instead (axis
``experts``, :mod:`partitioner.solvers.expert_devices`) a quarter of the experts fits on ``cuda:0``:
priced by hand, and brute force and the ILP both divide the experts 1:3.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from partitioner import Plan, from_module, load_profile
from partitioner.errors import PlanMismatch
from partitioner.plan.values import PlanFormatError
from partitioner.ir import OpGraph
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.chunked_streaming import SLOTS, pipeline_s
from partitioner.solvers.expert_streaming import (ExpertTimeSplit, expert_split_choices, fold_expert_weights,
                                                  weight_views)
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.splits import SplitOptions
from tests.property.oracle import placements

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.moe")  # registers transformers::grouped_mm_fallback


class Experts(torch.nn.Module):
    """One fused experts op as transformers calls it: ``grouped_mm(x, W^T, offs)``, then a relu."""

    def __init__(self, experts: int = 8, rows: int = 2048, cols: int = 1024) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(experts, rows, cols) * 0.01)

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.transformers.grouped_mm_fallback(x, self.w.transpose(-2, -1), offs))


@functools.cache
def _experts_graph() -> OpGraph:
    """The module docstring's graph (captured once: every test reads it, none changes it)."""
    torch.manual_seed(0)
    offs = torch.tensor([32 * (i + 1) for i in range(8)], dtype=torch.int32)
    graph = from_module(Experts(), (torch.randn(256, 1024), offs))
    return OpGraph(graph.name, [dataclasses.replace(op, flops=op.flops * 1000) if "grouped" in op.kind else op
                                for op in graph.topological_order()],
                   graph.tensors.values(), graph.params.values(), graph.inputs, graph.outputs)


def experts_problem(objective: Objective = Objective.LATENCY, chunks: tuple[int, ...] = (4, 8),
                    cap: int = 32 << 20) -> Problem:
    """The module docstring's instance, folded (each experts op with its weight's view)."""
    graph = _experts_graph()
    folded = fold_expert_weights(graph)
    return Problem(folded.graph, load_profile("h200-host").with_memory({"cuda:0": cap}),
                   Options(objective=objective, splits=SplitOptions(axes=("time",), chunks=chunks)),
                   members=folded.members, original=graph)


def test_the_captured_form_is_a_grouped_matmul_over_a_transposed_fused_weight() -> None:
    graph = _plan_json()[1]  # the tiny Mixtral of tests/e2e/test_expert_split_emit.py
    views = weight_views(graph)
    assert len(views) == 4  # two a layer: gate_up_proj and down_proj
    for op, view in views.items():
        assert graph.ops[op].kind == "transformers.grouped_mm_fallback.default"
        assert graph.ops[view].kind == "aten.transpose.int" and graph.ops[view].owned_params
        x, w = graph.tensors[graph.ops[op].inputs[0]], graph.tensors[graph.ops[op].inputs[1]]
        assert graph.ops[op].flops == 2 * x.shape[0] * w.shape[1] * w.shape[2]  # every routed row once
    folded = fold_expert_weights(graph)
    assert sorted(ms for ms in folded.members.values() if len(ms) > 1) == sorted((v, o) for o, v in views.items())


def test_price_counted_by_hand() -> None:
    p = experts_problem()
    (node,) = p.split_choices
    assert [sp.chunks for sp in p.split_choices[node]] == [4, 8]
    sp = ExpertTimeSplit("time", ("cuda:0", "cpu"), 8)
    price = p.split_price[(node, sp)]
    weight = 8 * 2048 * 1024 * 4
    assert price.param_bytes == (0, weight) and price.copy_out == weight
    assert [c[2] for c in price.copies] == [weight // 8] * 8
    c = price.copies[0][3]
    (op,) = [o for o in p.original.ops.values() if "grouped" in o.kind]
    # uniform routing: each expert 32 of the 256 rows, an eighth of the flops, x and y
    chunk = dataclasses.replace(op, flops=op.flops // 8, param_bytes=weight // 8,
                                bytes_read=256 * 1024 * 4 // 8 + 32 + weight // 8, bytes_written=256 * 2048 * 4 // 8)
    k = p.costs.op_time(chunk, p.devices.device("cuda:0")).seconds
    assert price.shard_s[0] == pytest.approx(c + k + 7 * max(c, k))
    assert price.shard_s[0] == pytest.approx(pipeline_s([c] * 8, [k] * 8))
    work = 256 * 1024 * 4 + 32 + 2 * 256 * 2048 * 4 + SLOTS * weight // 8
    assert price.work_bytes == (work, 0)


def test_choices_stop_at_the_number_of_experts_and_need_an_accelerator() -> None:
    p = experts_problem(chunks=(2, 8, 16))
    (node,) = p.split_choices
    assert [sp.label for sp in p.split_choices[node]] == ["time[cuda:0<-cpu,2,by=expert]",
                                                          "time[cuda:0<-cpu,8,by=expert]"]
    unfolded = Problem(p.original, p.devices, p.options)  # the view apart: no split by expert
    assert not any(expert_split_choices(unfolded, n, (2,)) for n in unfolded.nodes)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_the_ilp_splits_by_expert_as_brute_force_does(solver: str, objective: Objective) -> None:
    p = experts_problem(objective)
    best, arg = float("inf"), None
    for candidate in placements(p):
        ev = evaluate(p, candidate)
        if ev.feasible and ev.total_s < best:
            best, arg = ev.total_s, candidate
    (sp,) = arg.split.values()
    assert (sp.home, sp.chunks, sp.by) == ("cuda:0", 8, "expert")
    sol = solve_ilp(p, solver=solver, gap=0.0)
    assert dict(sol.placement.split) == dict(arg.split)
    own = evaluate(p, sol.placement)
    assert own.feasible and own.total_s == pytest.approx(best, rel=1e-6)
    assert sol.objective == pytest.approx(own.total_s, rel=1e-6)
    assert sol.bound is not None and sol.bound <= best * (1 + 1e-6)
    assert physical_lower_bound(p) <= best * (1 + 1e-9)
    assert memory_aware_lower_bound(p) <= best * (1 + 1e-6)


@functools.cache
def _plan_json() -> tuple[dict, object]:
    from tests.e2e.test_expert_split_emit import tiny_plan

    plan, model, inputs = tiny_plan()
    return plan.to_dict(), from_module(model, inputs)


def test_hand_edits_to_a_split_by_expert_are_refused(tmp_path) -> None:  # noqa: ANN001
    import json

    data, graph = _plan_json()
    op = next(iter(data["splits"]))

    def load(edit) -> Plan:  # noqa: ANN001
        d = json.loads(json.dumps(data))
        edit(d)
        path = tmp_path / "p.json"
        path.write_text(json.dumps(d))
        return Plan.load(path)

    with pytest.raises(PlanFormatError, match="by"):
        load(lambda d: d["splits"][op].update(by="row"))
    with pytest.raises(PlanFormatError, match="no copy of 'transpose"):  # the view moved off its experts op
        view = next(u for u, v in d_edges(data) if v == op and data["model"]["op_bytes"][u][1] > 0)
        load(lambda d: d["placement"].update({view: "cpu"}))
    with pytest.raises(PlanMismatch, match="4 experts, fewer than 5"):
        load(lambda d: d["splits"][op].update(chunks=5)).check_graph(graph)
    with pytest.raises(PlanFormatError, match="the placement puts at least"):  # a row split: the view's weight counted
        load(lambda d: d["splits"][op].pop("by"))


def d_edges(data: dict) -> list:
    return [tuple(e[:2]) for e in data["model"]["edges"]]


def test_an_experts_split_is_priced_by_hand_and_certified_by_brute_force() -> None:
    """Axis ``experts`` on the same instance: a quarter of the experts (16 MiB) fits beside the working
    set on ``cuda:0``, half does not; the brute-force optimum divides the experts 1:3 with ``cuda:0``
    home (the accelerator's quarter beside the host's three), and the ILP finds it."""
    from partitioner.solvers.expert_devices import ExpertSplit

    graph = _experts_graph()
    folded = fold_expert_weights(graph)
    p = Problem(folded.graph, load_profile("h200-host").with_memory({"cuda:0": 32 << 20}),
                Options(splits=SplitOptions(axes=("experts",), fractions=(0.25, 0.5), proportional=False,
                                            balanced=False)), members=folded.members, original=graph)
    (node,) = p.split_choices
    sp = ExpertSplit("experts", ("cuda:0", "cpu"), (0.25, 0.75))
    price = p.split_price[(node, sp)]
    weight, x, y = 8 * 2048 * 1024 * 4, 256 * 1024 * 4, 256 * 2048 * 4
    assert price.param_bytes == (weight // 4, 3 * weight // 4) and (price.copy_in, price.copy_out) == (x, y)
    assert price.latency_s == pytest.approx(p.transfer_s(x, "cuda:0", "cpu")
                                            + max(price.shard_s[0], price.shard_s[1] + p.transfer_s(y, "cpu", "cuda:0")))
    best, arg = float("inf"), None
    for candidate in placements(p):
        ev = evaluate(p, candidate)
        if ev.feasible and ev.total_s < best:
            best, arg = ev.total_s, candidate
    assert dict(arg.split) == {node: sp}
    sol = solve_ilp(p, gap=0.0)
    assert dict(sol.placement.split) == {node: sp}
    assert evaluate(p, sol.placement).total_s == pytest.approx(best, rel=1e-6)
    assert sol.bound is not None and sol.bound <= best * (1 + 1e-6)
    assert memory_aware_lower_bound(p) <= best * (1 + 1e-6)
