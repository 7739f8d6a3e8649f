"""Pipeline stages: the semantics recomputed by hand, the chain DP against the ILP, the ILP against
brute force, the baselines, the schedule simulation, and bad input."""

from __future__ import annotations

import itertools

import pytest

import models
import partitioner  # noqa: F401  (package first: cost_models and partitioner import each other)
from cost_models.profiles import DeviceSet, load_profile
from models.synthetic import random_chain, random_dag
from partitioner import partition
from partitioner.errors import HetpartError, InfeasiblePlacement
from partitioner.ir import OpGraph
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.pipeline import PipelineCost, PipelineSpec, StageCost, pipeline_cost, timeline
from partitioner.solvers.pipeline_baselines import PIPELINE_BASELINES, _min_max, run_pipeline_baseline
from partitioner.solvers.pipeline_dp import is_chain, solve_pipeline_dp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, Status, evaluate
from partitioner.verify import verify_placement


def _problem(devices, graph=None, *, training=False, schedule="1f1b", micro_batches=4, stages=None, caps=None):
    profile = load_profile(devices) if isinstance(devices, str) else devices
    if caps:
        profile = profile.with_memory(caps)
    options = Options(objective=Objective.THROUGHPUT, training=training, streaming=False,
                      pipeline=PipelineSpec(micro_batches, schedule, stages))
    return Problem(graph, profile, options)


def test_step_is_bottleneck_times_micro_batches_plus_bubble():
    graph = random_chain(3, 6, skip_prob=1.0)   # every op from the third on also reads an earlier tensor
    p = _problem("4x-cpu-host", graph, micro_batches=5)
    d = p.device_names
    cut = {"op0": d[0], "op1": d[0], "op2": d[1], "op3": d[1], "op4": d[3], "op5": d[3]}   # host2 skipped
    cost = pipeline_cost(p, Placement(cut))
    assert [s.device for s in cost.stages] == [d[0], d[1], d[3]] and not cost.violations
    # by hand: stage times, and every tensor alive across a boundary (relayed through stage 1)
    stage_t = [sum(p.compute[n][dev] for n, x in cut.items() if x == dev) for dev in (d[0], d[1], d[3])]
    pos = {n: i for i, n in enumerate(p.nodes)}
    stage_of = {n: [d[0], d[1], d[3]].index(x) for n, x in cut.items()}
    sends = [[], []]
    for t in graph.tensors.values():
        first = stage_of[t.producer] if t.producer else 0
        last = max([stage_of[c] for c in t.consumers] + ([2] if t.name in graph.outputs else []), default=first)
        for b in range(first, last):
            sends[b].append(t)
    assert any(len([b for b in range(2) if t in sends[b]]) == 2 for t in graph.tensors.values())  # a relayed one
    link_t = [sum(p.transfer_s(t.nbytes, a, b) for t in sends[i]) for i, (a, b) in enumerate([(d[0], d[1]), (d[1], d[3])])]
    times = stage_t + link_t
    assert cost.step_s == pytest.approx((5 - 1) * max(times) + sum(times))
    assert cost.bubble_s == pytest.approx(sum(times) - max(times)) and pos
    ev = evaluate(p, Placement(cut))
    assert ev.total_s == cost.step_s and ev.feasible
    verify_placement(p, Placement(cut), ev)


def test_in_flight_activations_gpipe_keeps_all_1f1b_keeps_stages_left():
    graph = random_chain(4, 8, skip_prob=0.0)
    cut = {n: ("host0/cpu", "host1/cpu", "host2/cpu", "host3/cpu")[i // 2] for i, n in enumerate(sorted(graph.ops, key=lambda n: int(n[2:])))}
    for schedule, expected in (("gpipe", [6, 6, 6, 6]), ("1f1b", [4, 3, 2, 1])):
        p = _problem("4x-cpu-host", graph, training=True, schedule=schedule, micro_batches=6)
        cost = pipeline_cost(p, Placement(cut))
        assert [s.in_flight for s in cost.stages] == expected
        for s in cost.stages:
            saved = sum(p.saved[n] for n in s.nodes)
            params = sum(p.param_mem[n] for n in s.nodes)
            assert s.memory == params + max(p.work_mem[n] for n in s.nodes) + s.in_flight * saved


CASES = [  # (seed, training, schedule, stages, cap fraction of the GPUs)
    (0, False, "gpipe", None, None), (1, False, "1f1b", 2, 0.5), (2, True, "gpipe", None, 0.6),
    (3, True, "1f1b", None, 0.4), (4, True, "1f1b", 3, None), (5, True, "gpipe", 2, 0.7),
]


@pytest.mark.parametrize("seed, training, schedule, stages, cap", CASES)
def test_dp_equals_ilp_on_chains(seed, training, schedule, stages, cap):
    graph = random_chain(seed, 7)
    if seed % 2:   # an early op is an output too: the last stage returns it, so it is relayed there
        graph = OpGraph(graph.name, list(graph.ops.values()), list(graph.tensors.values()),
                        list(graph.params.values()), graph.inputs, ("op1", *graph.outputs))
    caps = None
    if cap:
        need = Problem(graph, load_profile("2x-h200-host"), Options(training=training, streaming=False))
        total = sum(need.param_mem.values()) + 4 * sum(need.saved.values())
        caps = {"host0/cuda:0": int(cap * total), "host1/cuda:0": int(cap * total)}
    p = _problem("2x-h200-host", graph, training=training, schedule=schedule, stages=stages, caps=caps)
    assert is_chain(p)
    dp = solve_pipeline_dp(p)
    ilp = solve_ilp(p, gap=0.0, time_limit=60)
    assert dp.status is Status.OPTIMAL and ilp.status is Status.OPTIMAL
    dp_ev, ilp_ev = evaluate(p, dp.placement), evaluate(p, ilp.placement)
    assert dp_ev.feasible and ilp_ev.feasible
    assert dp_ev.total_s == pytest.approx(dp.bound, rel=1e-12)           # the DP's value is the semantics'
    assert dp_ev.total_s == pytest.approx(ilp_ev.total_s, rel=1e-6)       # and the ILP agrees
    assert ilp.bound == pytest.approx(ilp_ev.total_s, rel=1e-6)          # the model is the semantics, exactly


@pytest.mark.parametrize("seed", [0, 1])
def test_ilp_equals_brute_force_on_a_dag(seed):
    graph = random_dag(seed, 6, max_inputs=2)
    cluster = load_profile("4x-cpu-host")
    three = DeviceSet("3-hosts", cluster.devices[:3], tuple(lk for lk in cluster.links if "host3" not in lk.label))
    p = _problem(three.with_memory({"host1/cpu": "200MB"}), training=bool(seed), micro_batches=3, graph=graph)
    assert not is_chain(p)
    evaluations = [evaluate(p, Placement(dict(zip(p.nodes, combo))))
                   for combo in itertools.product(p.device_names, repeat=len(p.nodes))]
    best = min(ev.total_s for ev in evaluations if ev.feasible)
    ilp = solve_ilp(p, gap=0.0, time_limit=60)
    assert ilp.status is Status.OPTIMAL
    assert evaluate(p, ilp.placement).total_s == pytest.approx(best, rel=1e-6)
    assert ilp.bound == pytest.approx(best, rel=1e-6)


def _smallest_cap(graph, schedule):
    """The smallest memory per host (bisection, to 1 KB) at which the DP finds stages."""
    low, high = 1, 1 << 34
    while high - low > 1024:
        mid = (low + high) // 2
        caps = {f"host{i}/cpu": mid for i in range(4)}
        p = _problem("4x-cpu-host", graph, training=True, micro_batches=8, schedule=schedule, caps=caps)
        low, high = (low, mid) if solve_pipeline_dp(p).placement.device else (mid, high)
    return high


def test_1f1b_fits_where_gpipe_does_not():
    graph = random_chain(7, 6, skip_prob=0.0)
    gpipe, one_f_one_b = _smallest_cap(graph, "gpipe"), _smallest_cap(graph, "1f1b")
    assert one_f_one_b < gpipe          # 1F1B keeps at most S - s micro-batches, GPipe all 8
    caps = {f"host{i}/cpu": one_f_one_b for i in range(4)}
    tight = {s: solve_pipeline_dp(_problem("4x-cpu-host", graph, training=True, micro_batches=8, schedule=s,
                                           caps=caps)) for s in ("gpipe", "1f1b")}
    assert tight["gpipe"].status is Status.INFEASIBLE and tight["1f1b"].status is Status.OPTIMAL


def test_baselines_cut_contiguous_stages_on_the_accelerators():
    module, inputs = models.get("mlp", "tiny")
    plan_graph = partitioner.from_module(module, tuple(x[:2] for x in inputs))
    p = _problem("2x-h200-host", plan_graph, micro_batches=4)
    for name in PIPELINE_BASELINES:
        sol = run_pipeline_baseline(name, p)
        cost = pipeline_cost(p, sol.placement)
        assert [s.device for s in cost.stages] == ["host0/cuda:0", "host1/cuda:0"], name
        assert not cost.violations
    weights = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    cuts = _min_max(weights, 3)
    parts = [sum(weights[a:b]) for a, b in zip([0, *cuts], [*cuts, len(weights)])]
    brute = min(max(sum(weights[a:b]) for a, b in zip([0, i, j], [i, j, len(weights)]))
                for i in range(1, len(weights)) for j in range(i + 1, len(weights)))
    assert max(parts) == brute and len(parts) == 3


def _uniform(S, M, f, b, schedule):
    stages = tuple(StageCost(s, f"d{s}", (), f, f + b, 0.0, (), 0, 0.0, 0, 0, 0, 0) for s in range(S))
    return PipelineCost(PipelineSpec(M, schedule), stages, (M - 1) * (f + b) + S * (f + b), f + b,
                        (S - 1) * (f + b), 0.0, ())


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_timeline_of_identical_stages_ends_at_the_formula(schedule):
    S, M, f, b = 4, 6, 1.0, 2.0
    cost = _uniform(S, M, f, b, schedule)
    actions = timeline(cost, training=True)
    assert max(a.end for a in actions) == pytest.approx(cost.step_s) == pytest.approx((M + S - 1) * (f + b))
    for s in range(S):       # the schedule's in-flight depth is what the memory model charges
        events = sorted((a.start if a.kind == "F" else a.end, 1 if a.kind == "F" else -1)
                        for a in actions if a.stage == s and a.kind in "FB")
        depth = max(itertools.accumulate(e[1] for e in events))
        assert depth == cost.spec.in_flight(s, S)


def test_partition_plans_a_pipeline_on_a_cluster():
    module, inputs = models.get("mlp", "tiny")   # batch 8
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput")
    assert plan.pipeline["micro_batches"] == 8 and plan.pipeline["schedule"] == "1f1b"
    assert plan.inputs[0][0] == (1, 64)            # captured at one micro-batch
    assert plan.solver.name == "pipeline-dp" and plan.solver.status == "optimal"
    latency = partition(module, inputs, "4x-cpu-host", objective="latency")
    assert not latency.pipeline
    with pytest.raises(HetpartError, match="does not divide the batch of 8"):
        partition(module, inputs, "4x-cpu-host", objective="throughput", micro_batches=3)
    with pytest.raises(HetpartError, match="use --objective throughput"):
        partition(module, inputs, "4x-cpu-host", objective="latency", schedule="gpipe")
    with pytest.raises(HetpartError, match="1F1B pipeline of 4 stages needs at least 4 micro-batches"):
        partition(module, inputs, "4x-cpu-host", objective="throughput", micro_batches=2, stages=4)


def test_a_stage_that_fits_no_host_is_refused():
    module, inputs = models.get("mlp", "small")
    caps = {f"host{i}/cpu": "2MB" for i in range(4)}   # each layer alone holds 4 MB of weights
    with pytest.raises(InfeasiblePlacement) as err:
        partition(module, inputs, "4x-cpu-host", objective="throughput", memory=caps, training=True)
    msg = str(err.value)
    assert "op linear" in msg and "host0/cpu" in msg and "2,000,000" in msg and "--memory" in msg


def test_partition_of_a_dag_carries_the_ilps_certificate():
    """Not chain-shaped, so the DP is only the start: the plan's status, bound and lower bound are
    the ILP's and the memory-aware LP's, checked against brute force."""
    graph = random_dag(0, 6, max_inputs=2)
    cluster = load_profile("4x-cpu-host")
    three = DeviceSet("3-hosts", cluster.devices[:3], tuple(lk for lk in cluster.links if "host3" not in lk.label))
    devices = three.with_memory({"host1/cpu": "200MB"})
    out = partitioner.partition_outcome(graph, None, devices, objective="throughput", micro_batches=3, gap=0.0,
                                        coarsen=False)
    p, plan = out.problem, out.plan
    best = min(ev.total_s for ev in (evaluate(p, Placement(dict(zip(p.nodes, combo))))
                                     for combo in itertools.product(p.device_names, repeat=len(p.nodes)))
               if ev.feasible)
    assert plan.solver.status == "optimal" and plan.predicted["total_s"] == pytest.approx(best, rel=1e-6)
    assert plan.solver.bound <= best * (1 + 1e-6) and plan.solver.gap == pytest.approx(0.0, abs=1e-6)
    assert plan.solver.name.startswith("ilp:") or plan.solver.ilp.status == "optimal"
    assert plan.predicted["lower_bound_s"] <= best * (1 + 1e-9)
