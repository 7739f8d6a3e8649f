"""Splits of ops other than linears (partitioner/solvers/split_axes.py): an embedding by table rows,
elementwise ops and norms by batch. Which ops take which axis (and the refusals naming what an op
can take), the prices counted by hand, evaluate and the ILP on them, and the option surface."""

from __future__ import annotations

import pytest
import torch

import models
from partitioner import Plan, from_module, load_profile
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.split_batches import cut_dim
from partitioner.solvers.split_offers import splits_it_takes, splittable_ops, why_not_split
from partitioner.solvers.splits import Split, SplitOptions, resolve_splits


def _problem(module: torch.nn.Module, inputs: tuple, objective: Objective = Objective.LATENCY,
             **splits: object) -> Problem:
    torch.manual_seed(0)
    return Problem(from_module(module.eval(), inputs), load_profile("h200-host"),
                   Options(objective=objective, streaming=False, splits=SplitOptions(**splits)))


def _table(**splits: object) -> Problem:
    """A 10 x 4 float32 table looked up by [2, 3] int64 indices."""
    torch.manual_seed(0)
    return _problem(torch.nn.Embedding(10, 4), (torch.randint(0, 10, (2, 3)),), **splits)


def test_which_ops_of_gpt_small_take_which_splits() -> None:
    model, inputs = models.get("gpt", "small")
    graph = from_module(model, inputs)
    takes = {}
    for op in graph.ops.values():
        takes.setdefault(op.kind, set()).add(splits_it_takes(op, graph))
    assert takes["aten.linear.default"] == {"cols, rows or time splits", "no split"}  # the head is tied
    assert takes["aten.layer_norm.default"] == {"batch splits"} and takes["aten.gelu.default"] == {"batch splits"}
    assert takes["aten.embedding.default"] == {"table splits", "no split"}  # the token table is tied to the head
    assert takes["aten.add.Tensor"] == {"batch splits", "no split"}  # token + position broadcasts the positions
    tied = graph.ops["embedding"]
    assert "read by another op too" in why_not_split(tied, graph, "table")
    assert why_not_split(graph.ops["layer_norm"], graph, "table").startswith(
        "it is aten.layer_norm.default, and only aten embedding ops take table splits")
    assert "only aten elementwise ops (add, div" in why_not_split(graph.ops["linear"], graph, "batch")
    assert "is broadcast to its output's" in why_not_split(graph.ops["add"], graph, "batch")


def test_the_batch_dimension_or_else_the_sequence() -> None:
    assert cut_dim((2, 128, 64), 1, 2) == 0
    assert cut_dim((1, 128, 64), 1, 2) == 1  # a batch of one: the sequence
    assert cut_dim((1, 64), 1, 2) is None    # a norm's only other dimension is its own
    assert cut_dim((3, 8, 4), 1, 4) is None  # three rows for four devices: the batch is not cut, nor the sequence
    assert cut_dim((1, 1, 8), 0, 2) is None  # one batch row, one position: nothing to cut


def test_table_split_prices_by_hand() -> None:
    p = _table(axes=("table",), fractions=(0.5, 0.8), proportional=False, balanced=False)
    (node,) = p.split_choices
    half = p.split_price[(node, Split("table", ("cpu", "cuda:0"), (0.5, 0.5)))]
    assert half.param_bytes == (5 * 4 * 4, 5 * 4 * 4)  # five rows of the table each
    assert (half.copy_in, half.copy_out) == (2 * 3 * 8, 2 * 3 * 4 * 4)  # the indices out, a whole partial back
    assert half.work_bytes[1] == 2 * 3 * 8 + 2 * 3 * 4 * 4
    assert half.latency_s == half.copy_in_s + max(half.shard_s[0], half.shard_s[1] + half.copy_out_s)
    most = p.split_price[(node, Split("table", ("cuda:0", "cpu"), (0.8, 0.2)))]
    assert most.param_bytes == (8 * 16, 2 * 16)


def test_batch_split_prices_by_hand() -> None:
    p = _problem(torch.nn.LayerNorm(4), (torch.randn(6, 4),), axes=("batch",), fractions=(0.5,),
                 proportional=False, balanced=False)
    (node,) = p.split_choices
    price = p.split_price[(node, Split("batch", ("cpu", "cuda:0"), (0.5, 0.5)))]
    assert price.param_bytes == (2 * 4 * 4, 2 * 4 * 4)  # the weight and bias on each device
    assert (price.copy_in, price.copy_out) == (3 * 4 * 4, 3 * 4 * 4)  # three rows out, three back
    assert price.work_bytes == (p.work_mem[node], 2 * 3 * 4 * 4)


@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_evaluate_prices_a_table_split_and_the_ilp_agrees(objective: Objective) -> None:
    p = _table(objective=objective, axes=("table",), fractions=(0.5,), proportional=False, balanced=False)
    (node,) = p.split_choices
    sp = Split("table", ("cpu", "cuda:0"), (0.5, 0.5))
    price = p.split_price[(node, sp)]
    ev = evaluate(p, Placement({node: "cpu"}, split={node: sp}))
    assert ev.feasible, ev.violations
    if objective is Objective.LATENCY:
        assert ev.total_s == pytest.approx(max(price.latency_s, *ev.per_link_s.values()))
    else:
        assert ev.per_device_s["cuda:0"] == pytest.approx(price.shard_s[1])
    assert ev.memory["cuda:0"] == price.param_bytes[1] + price.work_bytes[1]
    assert [(t.src, t.dst, t.bytes, t.kind) for t in ev.transfers] == [
        ("cpu", "cuda:0", price.copy_in, "split"), ("cuda:0", "cpu", price.copy_out, "split")]
    sol = solve_ilp(p, gap=0.0)
    assert sol.objective == pytest.approx(evaluate(p, sol.placement).total_s, rel=1e-6)


def test_a_split_the_op_cannot_take_is_a_violation_naming_what_it_can() -> None:
    p = _table(axes=("table",), fractions=(0.5,), proportional=False, balanced=False)
    (node,) = p.split_choices
    ev = evaluate(p, Placement({node: "cpu"}, split={node: Split("batch", ("cpu", "cuda:0"), (0.5, 0.5))}))
    assert f"op {node} is split batch[cpu=0.5,cuda:0=0.5], which it cannot take; it can take: table[" \
        in ev.violations[0]
    other = _table(axes=("batch",))
    ev = evaluate(other, Placement({node: "cpu"}, split={node: Split("table", ("cpu", "cuda:0"), (0.5, 0.5))}))
    assert "it can take: none along batch (the op takes table splits)" in ev.violations[0]


def test_the_new_axes_are_opted_in_by_name() -> None:
    assert resolve_splits("cols,rows,table,batch:0.5").axes == ("cols", "rows", "table", "batch")
    with pytest.raises(HetpartError, match=r"split axes \['heads'\]: each must be one of cols, rows, time, experts, table, "
                                           r"batch"):
        resolve_splits("heads")
    assert resolve_splits(True).axes == ("cols", "rows")
    model, inputs = models.get("emb-transformer", "tiny")
    graph = from_module(model, inputs)
    default = Problem(graph, load_profile("h200-host"), Options(streaming=False, splits=SplitOptions()))
    assert {sp.axis for ch in default.split_choices.values() for sp in ch} == {"cols", "rows"}
    assert splittable_ops(graph, SplitOptions()) == {op.name for op in graph.ops.values() if "linear" in op.kind}
    wider = splittable_ops(graph, SplitOptions(axes=("table", "batch")))
    assert {graph.ops[o].kind for o in wider - splittable_ops(graph, SplitOptions())} == {
        "aten.embedding.default", "aten.layer_norm.default", "aten.add.Tensor", "aten.gelu.default"}


def test_tensor_parallel_ranks_refuse_a_table_split_by_name() -> None:
    from backends.tensor_parallel import mesh_devices

    p = _table(axes=("table",), fractions=(0.5,), proportional=False, balanced=False)
    (node,) = p.split_choices
    sp = p.split_choices[node][0]
    placement = Placement({node: sp.home}, split={node: sp})
    plan = Plan.from_solution(p, Solution("by hand", placement, Status.HEURISTIC), evaluate(p, placement))
    assert plan.splits[node]["axis"] == "table"
    with pytest.raises(PlanMismatch, match=rf"splits op '{node}' along table .*tensor-parallel ranks shard linears "
                                           r"only .*run the plan in one process \(plan.emit"):
        mesh_devices(plan)


def test_with_table_and_batch_splits_asked_those_ops_stay_out_of_coarse_groups() -> None:
    from partitioner import partition_outcome

    module, inputs = models.get("emb-transformer", "tiny")
    outcome = partition_outcome(module, inputs, "h200-host", coarsen=True, splits="table,batch", time_limit=20)
    graph = outcome.problem.original
    wanted = splittable_ops(graph, SplitOptions(axes=("table", "batch")))
    offered = {m for n in outcome.problem.split_choices for m in outcome.problem.members[n]}
    assert wanted and wanted <= offered
    assert {sp.axis for ch in outcome.problem.split_choices.values() for sp in ch} == {"table", "batch"}
