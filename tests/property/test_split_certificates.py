"""The certificate with split choices, checked against brute force (``tests/property/oracle.py``).

For random small instances whose matmuls are linears (``Options.splits``: each linear whole on a
device or split by output columns or by its reduction dimension over two devices, at offered
fractions and, sometimes, the one proportional to the devices' rates), latency and throughput,
tight caps or not, streaming on or off, the ILP at gap 0 (HiGHS, cold and warm started):

* returns a placement within gap 0 of the enumerated optimum (every device, stream and split),
* states a bound no higher than that optimum, and the physical and memory-aware bounds hold,
* reports an objective equal to ``evaluate`` of its placement.

A fixed instance where only a split fits checks that splits are chosen at all.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.synthetic import random_dag, random_profile
from partitioner.errors import HetpartError
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.splits import SplitOptions
from tests.property.oracle import count_candidates, optimum
from tests.property.test_certificates import _as_linears, check

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
COUNTS: collections.Counter = collections.Counter()


@st.composite
def split_instances(draw: st.DrawFn) -> tuple[Problem, dict]:
    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]))
    n_devices = draw(st.integers(2, 3))
    n_ops = draw(st.sampled_from(range(4 if n_devices == 2 else 3, 1, -1)))
    graph = _as_linears(random_dag(seed, n_ops, max_inputs=2, param_prob=0.8,
                                   param_sizes=(1 << 20, 1 << 22, 1 << 24)))
    profile = random_profile(seed, n_devices, tight=draw(st.booleans()))
    if draw(st.booleans()):  # accelerators hold about half the largest weight: whole there, it does not fit
        largest = max(op.param_bytes for op in graph.ops.values())
        working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
        cap = largest // 2 + 2 * working
        profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    fractions = draw(st.sampled_from(((0.5,), (0.25, 0.75))))
    splits = SplitOptions(fractions=fractions, proportional=draw(st.booleans()), balanced=draw(st.booleans()),
                          axes=draw(st.sampled_from((("cols",), ("rows",), ("cols", "rows")))))
    streaming = draw(st.booleans())
    problem = Problem(graph, profile, Options(objective=objective, streaming=streaming, splits=splits))
    assume(problem.split_choices)
    assume(count_candidates(problem) <= 3000)
    info = {"objective": objective.value, "pipeline": False, "streaming": streaming, "training": False,
            "tied": False, "coarsened": False, "pinned": False, "pinned producer, several consumers": False,
            "nodes": len(problem.nodes), "candidates": count_candidates(problem)}
    return problem, info


@SETTINGS
@given(case=split_instances(), warm=st.booleans())
def test_split_certificate_holds(case: tuple[Problem, dict], warm: bool) -> None:
    problem, info = case
    failures = check(problem, info, "highs", warm)
    sol = solve_ilp(problem, gap=0.0)
    COUNTS["instances"] += 1
    COUNTS[f"objective {info['objective']}"] += 1
    COUNTS["split chosen"] += bool(sol.placement.split)
    assert not failures, (info, failures)


def test_split_instances_chose_splits() -> None:
    if COUNTS["instances"] == 0:
        pytest.skip("run with the property test above")
    assert COUNTS["split chosen"] > 0, f"no instance chose a split: widen the strategy ({COUNTS})"
    assert COUNTS["objective latency"] and COUNTS["objective throughput"]


def _one_big_linear(cap: int | None) -> Problem:
    """A norm and a 512 x 8192 linear (16 MiB of weight) on ``h200-host``, ``cuda:0`` capped at ``cap``."""
    import torch

    from cost_models.profiles import load_profile
    from partitioner import from_module

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.LayerNorm(512), torch.nn.Linear(512, 8192)).eval()
    graph = from_module(module, (torch.randn(64, 512),))
    profile = load_profile("h200-host")
    if cap is not None:
        profile = profile.with_memory({"cuda:0": cap})
    return Problem(graph, profile, Options(streaming=False, splits=SplitOptions()))


def test_a_linear_over_the_accelerators_cap_is_split_rather_than_left_on_the_host() -> None:
    """Whole, the big weight fits only on the host; three quarters of it fit on the accelerator, and
    the ILP's split equals brute force's optimum (and beats every whole placement)."""
    probe = _one_big_linear(None)
    op = max(probe.nodes, key=lambda n: probe.param_mem[n])
    cap = probe.param_mem[op] * 3 // 4 + 2 * probe.work_mem[op] + (1 << 20)
    problem = _one_big_linear(cap)
    whole = Problem(problem.graph, problem.devices, dataclasses.replace(problem.options, splits=None))
    best_whole, _ = optimum(whole)
    best, arg = optimum(problem)
    assert arg is not None and arg.split, "brute force found no split better than whole placement"
    assert best < best_whole
    sol = solve_ilp(problem, gap=0.0)
    assert sol.placement.split
    assert evaluate(problem, sol.placement).total_s == pytest.approx(best, rel=1e-6)
    assert sol.bound <= best * (1 + 1e-6) and physical_lower_bound(problem) <= best * (1 + 1e-6)


def test_a_split_the_op_cannot_take_is_a_violation_naming_the_op_and_its_splits() -> None:
    problem = _one_big_linear(None)
    op = next(iter(problem.split_choices))
    offered = problem.split_choices[op][0]
    bad = dataclasses.replace(offered, fractions=(0.3, 0.7))
    device = {n: offered.home for n in problem.nodes}
    ev = evaluate(problem, Placement(device, split={op: bad}))
    assert not ev.feasible
    assert f"op {op} is split {bad.label}, which it cannot take; it can take: {offered.label}" in ev.violations[0]
    away = Placement({**device, op: offered.others[0]}, split={op: offered})
    assert "a split op's device is its home" in evaluate(problem, away).violations[0]


def test_splits_are_refused_for_training_naming_the_option() -> None:
    graph = _as_linears(random_dag(3, 3, param_prob=1.0))
    with pytest.raises(HetpartError, match=r"training=True .*drop splits \(CLI: --split\)"):
        Problem(graph, random_profile(3, 2), Options(training=True, streaming=False, splits=SplitOptions()))
