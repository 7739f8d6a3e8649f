"""Split choices of a linear (partitioner/solvers/splits.py): what is offered, what it costs (bytes by
hand), how evaluate and the ILP price it, the option and CLI surface, and that plans without
``splits`` are unchanged."""

from __future__ import annotations

import json

import pytest
import torch

import models
from partitioner import from_module, load_profile, partition
from partitioner.cli import main
from partitioner.errors import HetpartError
from partitioner.options import PlanOptions
from partitioner.solvers.formulation import Formulation, Units
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.splits import Split, SplitOptions, resolve_splits, shard_sizes


def _linear_problem(objective: Objective = Objective.LATENCY, **splits: object) -> Problem:
    """One 4 -> 8 linear with a bias, on a [2, 4] input, h200-host."""
    torch.manual_seed(0)
    graph = from_module(torch.nn.Linear(4, 8).eval(), (torch.randn(2, 4),))
    return Problem(graph, load_profile("h200-host"),
                   Options(objective=objective, streaming=False, splits=SplitOptions(**splits)))


def test_shard_sizes_round_the_home_share_and_keep_one_each() -> None:
    assert shard_sizes(8, (0.75, 0.25)) == (6, 2)
    assert shard_sizes(8, (0.01, 0.99)) == (1, 7)
    assert shard_sizes(2, (0.99, 0.01)) == (1, 1)
    with pytest.raises(HetpartError, match="cannot be split"):
        shard_sizes(1, (0.5, 0.5))


def test_a_linear_is_offered_each_pair_axis_and_fraction() -> None:
    p = _linear_problem(fractions=(0.25, 0.75), proportional=False, balanced=False)
    (node,) = p.split_choices
    labels = {s.label for s in p.split_choices[node]}
    assert len(labels) == 2 * 2 * 2  # (cpu, cuda:0) both ways x cols, rows x two fractions
    assert "cols[cuda:0=0.75,cpu=0.25]" in labels and "rows[cpu=0.25,cuda:0=0.75]" in labels


def test_split_prices_by_hand() -> None:
    """Weight [8, 4] and bias [8] in float32, input [2, 4]: every byte of the price counted by hand."""
    p = _linear_problem(fractions=(0.75, 0.5), proportional=False, balanced=False)
    (node,) = p.split_choices
    cols = p.split_price[(node, Split("cols", ("cpu", "cuda:0"), (0.75, 0.25)))]
    assert cols.param_bytes == (6 * 4 * 4 + 6 * 4, 2 * 4 * 4 + 2 * 4)  # rows of W and of b
    assert (cols.copy_in, cols.copy_out) == (2 * 4 * 4, 2 * 2 * 4)  # the whole input out, 2 columns back
    rows = p.split_price[(node, Split("rows", ("cpu", "cuda:0"), (0.5, 0.5)))]
    assert rows.param_bytes == (8 * 2 * 4 + 8 * 4, 8 * 2 * 4)  # the bias stays whole on home
    assert (rows.copy_in, rows.copy_out) == (2 * 2 * 4, 2 * 8 * 4)  # half the input out, a whole partial back
    assert rows.copy_in_s == p.transfer_s(16, "cpu", "cuda:0") and rows.copy_out_s == p.transfer_s(64, "cuda:0", "cpu")
    assert rows.latency_s == rows.copy_in_s + max(rows.shard_s[0], rows.shard_s[1] + rows.copy_out_s)
    assert rows.work_bytes[0] == p.work_mem[node]


@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_evaluate_prices_a_split_and_the_ilp_agrees(objective: Objective) -> None:
    p = _linear_problem(objective, fractions=(0.5,), proportional=False, balanced=False)
    (node,) = p.split_choices
    sp = Split("cols", ("cpu", "cuda:0"), (0.5, 0.5))
    price = p.split_price[(node, sp)]
    ev = evaluate(p, Placement({node: "cpu"}, split={node: sp}))
    assert ev.feasible
    whole = evaluate(p, Placement({node: "cpu"}))
    input_copy = 0.0  # the graph input starts on the host, where the split's home is
    if objective is Objective.LATENCY:
        assert ev.total_s == pytest.approx(max(input_copy + price.latency_s, *ev.per_link_s.values()))
    else:
        assert ev.per_device_s["cpu"] == pytest.approx(price.shard_s[0])
        assert ev.per_device_s["cuda:0"] == pytest.approx(price.shard_s[1])
    assert ev.memory["cuda:0"] == price.param_bytes[1] + price.work_bytes[1]
    assert [(t.src, t.dst, t.bytes, t.kind) for t in ev.transfers] == [
        ("cpu", "cuda:0", price.copy_in, "split"), ("cuda:0", "cpu", price.copy_out, "split")]
    assert whole.memory["cuda:0"] == 0
    f = Formulation(p, Units())
    assert f"k[{node}][{sp.label}]" in f.milp.names
    sol = solve_ilp(p, gap=0.0)
    assert sol.objective == pytest.approx(evaluate(p, sol.placement).total_s, rel=1e-9)


def test_resolve_splits_reads_every_form() -> None:
    assert resolve_splits(None) is None and resolve_splits(False) is None
    assert resolve_splits(True) == SplitOptions() == resolve_splits("on")
    assert resolve_splits("cols:0.25/0.5") == SplitOptions(fractions=(0.25, 0.5), axes=("cols",))
    assert resolve_splits({"axes": ["rows"], "proportional": False}) == SplitOptions(axes=("rows",), proportional=False)
    with pytest.raises(HetpartError, match="split axes .*heads.*must be one of cols, rows"):
        resolve_splits("heads")
    with pytest.raises(HetpartError, match=r"not in \(0, 1\)"):
        resolve_splits("cols:1.5")


def test_splits_are_refused_with_training_naming_both_options() -> None:
    with pytest.raises(HetpartError, match="do not combine with training yet: drop splits \\(CLI: --split\\) or it"):
        PlanOptions.build(splits=True, training=True)
    with pytest.raises(HetpartError, match="option 'splits'"):
        PlanOptions.build(splits="diagonal")


def test_without_splits_a_plan_is_what_it_was() -> None:
    """Off by default: no split columns, no splits section, the same placement as splits=None."""
    module, inputs = models.get("gpt", "tiny")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": "1MB"}, time_limit=20)
    assert not plan.splits and "splits" not in json.loads(plan.to_json())
    assert not any(t.kind == "split" for t in plan.transfers)
    graph = from_module(module, inputs)
    problem = Problem(graph, load_profile("h200-host"), Options())
    assert problem.split_choices == {} and not any(n.startswith("k[") for n in Formulation(problem).milp.names)


def test_cli_plan_split_and_check_with_strict_devices(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "split.json"
    assert main(["plan", "gpt:small", "--split", "--memory", "cuda:0=6MB", "-o", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["splits"] and data["request"]["splits"] == "on"
    capsys.readouterr()
    assert main(["check", "gpt:small", "--plan", str(path), "--strict-devices", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "passed: every tensor within its tolerance; copies and resident bytes as the plan says" in out


def test_a_device_map_cannot_say_a_split_and_is_refused() -> None:
    from partitioner import Plan
    from partitioner.solvers.problem import Solution, Status

    p = _linear_problem(fractions=(0.5,), proportional=False, balanced=False)
    (node,) = p.split_choices
    sp = p.split_choices[node][0]
    plan = Plan.from_solution(p, Solution("by hand", Placement({node: sp.home}, split={node: sp}), Status.HEURISTIC))
    with pytest.raises(HetpartError, match=r"splits 1 linears over two devices .*an accelerate device_map"):
        plan.to_device_map()


def test_with_splits_each_splittable_linear_stays_out_of_coarse_groups() -> None:
    from partitioner import partition_outcome
    from partitioner.solvers.splits import split_weight

    module, inputs = models.get("gpt", "tiny")
    whole = partition_outcome(module, inputs, "h200-host", coarsen=True, time_limit=20)
    split = partition_outcome(module, inputs, "h200-host", coarsen=True, splits=True, time_limit=20)
    graph = split.problem.original
    linears = {op.name for op in graph.ops.values() if split_weight(op, graph.params)}
    assert linears and len(whole.problem.nodes) < len(split.problem.nodes)
    offered = {m for n in split.problem.split_choices for m in split.problem.members[n]}
    assert linears <= offered
    assert not whole.problem.split_choices and not whole.plan.splits


def _wide_problem(memory: str | None = None, **splits: object) -> Problem:
    """A 4,096 -> 4,096 linear on 8 tokens, h200-host (the GPU shard far faster than the CPU's)."""
    torch.manual_seed(0)
    graph = from_module(torch.nn.Linear(4096, 4096).eval(), (torch.randn(8, 4096),))
    profile = load_profile("h200-host")
    if memory is not None:
        profile = profile.with_memory({"cuda:0": memory})
    return Problem(graph, profile, Options(streaming=False, splits=SplitOptions(**splits)))


@pytest.mark.parametrize("axis", ["cols", "rows"])
def test_the_balanced_share_ends_both_branches_together_and_minimises_latency(axis: str) -> None:
    """At the balanced share the home shard and the other shard plus its copy back end within one
    hundredth of a share of each other, and no other share in hundredths has a shorter latency."""
    from partitioner.solvers.split_offers import balanced_share
    from partitioner.solvers.splits import price_split

    p = _wide_problem(fractions=(0.5,), proportional=False, axes=(axis,))
    (node,) = p.split_choices
    share = balanced_share(p, node, ("cuda:0", "cpu"), axis)
    assert 0.5 < share < 1.0  # the GPU takes most of it
    offered = {sp.fractions[0] for sp in p.split_choices[node] if sp.devices == ("cuda:0", "cpu")}
    assert offered == {0.5, share}

    def price(h: int):
        return price_split(p, node, Split(axis, ("cuda:0", "cpu"), (h / 100, round(1 - h / 100, 10))))

    at = price(round(share * 100))
    assert min(price(h).latency_s for h in range(1, 100)) == pytest.approx(at.latency_s)
    before, after = price(round(share * 100) - 1), price(round(share * 100) + 1)
    assert before.shard_s[0] < before.shard_s[1] + before.copy_out_s or after.shard_s[0] >= after.shard_s[1] + after.copy_out_s


def test_the_hetegen_baseline_splits_every_linear_at_the_balanced_share_and_the_plan_beats_it() -> None:
    from partitioner.solvers import run_baseline
    from partitioner.solvers.split_offers import balanced_share

    p = _wide_problem()
    sol = run_baseline("hetegen", p)
    (node,) = p.split_choices
    sp = sol.placement.split[node]
    assert sp.axis == "cols" and sp.devices == ("cuda:0", "cpu")
    assert sp.fractions[0] == balanced_share(p, node, ("cuda:0", "cpu"), "cols")
    ev = evaluate(p, sol.placement)
    assert ev.feasible
    ilp = solve_ilp(p, gap=0.0, time_limit=30)
    assert evaluate(p, ilp.placement).total_s <= ev.total_s * (1 + 1e-9)


def test_hetegen_is_listed_in_plans_that_offer_splits_and_refused_by_name_in_those_that_do_not() -> None:
    module, inputs = models.get("mlp", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": "8MB"}, splits=True, time_limit=20)
    assert "hetegen" in plan.baselines
    hetegen = plan.baselines["hetegen"]
    assert hetegen.total_s is not None and (not hetegen.feasible or plan.predicted["total_s"] <= hetegen.total_s * (1 + 1e-9))
    with pytest.raises(HetpartError, match="'hetegen' splits linears, and this plan offers no split: add splits=True"):
        partition(module, inputs, "h200-host", solver="hetegen", time_limit=20)
