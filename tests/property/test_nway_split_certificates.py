"""The certificate with splits over three or four devices, checked against brute force (``tests/property/oracle.py``).

For random small instances whose matmuls are linears, on a host CPU and two or three accelerators
(``models.synthetic.random_profile``: random speeds and links, an accelerator pair sometimes
linked directly, else copies between them cross the host's links and wait for each other), with
``SplitOptions.degrees`` offering splits over every device of the profile (a device's group: the
next devices in profile order, even shares and, sometimes, rate-proportional ones) and sometimes
pairs too, latency and throughput, accelerators capped at half the largest weight or not, the ILP
at gap 0 with HiGHS and with CBC:

* returns a placement within gap 0 of the enumerated optimum (every device, stream and split),
* states a bound no higher than that optimum, and the physical and memory-aware bounds hold,
* reports an objective equal to ``evaluate`` of its placement.

A fixed instance (three like accelerators, each holding less than half of a linear's weight) checks
that a three-way split is chosen, by both solvers, at brute force's optimum.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.synthetic import random_dag, random_profile
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Problem, evaluate
from partitioner.solvers.splits import SplitOptions
from tests.property.oracle import count_candidates, optimum
from tests.property.test_certificates import _as_linears, check

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
COUNTS: collections.Counter = collections.Counter()


@st.composite
def nway_instances(draw: st.DrawFn) -> tuple[Problem, dict]:
    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]))
    n_devices = draw(st.integers(3, 4))
    n_ops = draw(st.sampled_from((3, 2) if n_devices == 3 else (2,)))
    graph = _as_linears(random_dag(seed, n_ops, max_inputs=2, param_prob=0.9,
                                   param_sizes=(1 << 20, 1 << 22, 1 << 24)))
    profile = random_profile(seed, n_devices, tight=draw(st.booleans()))
    if draw(st.booleans()):  # accelerators hold about half the largest weight: whole, it does not fit
        largest = max(op.param_bytes for op in graph.ops.values())
        working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
        cap = largest // 2 + 2 * working
        profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    degrees = draw(st.sampled_from(((n_devices,), (2, n_devices))))
    splits = SplitOptions(fractions=(0.5,), proportional=draw(st.booleans()), balanced=False, degrees=degrees,
                          axes=draw(st.sampled_from((("cols",), ("rows",), ("cols", "rows")))))
    streaming = draw(st.booleans())
    problem = Problem(graph, profile, Options(objective=objective, streaming=streaming, splits=splits))
    assume(any(len(sp.devices) > 2 for choices in problem.split_choices.values() for sp in choices))
    assume(count_candidates(problem) <= 3000)
    info = {"objective": objective.value, "pipeline": False, "streaming": streaming, "training": False,
            "tied": False, "coarsened": False, "pinned": False, "pinned producer, several consumers": False,
            "nodes": len(problem.nodes), "candidates": count_candidates(problem), "devices": n_devices}
    return problem, info


@SETTINGS
@given(case=nway_instances(), solver=st.sampled_from(["highs", "cbc"]))
def test_nway_split_certificate_holds(case: tuple[Problem, dict], solver: str) -> None:
    problem, info = case
    failures = check(problem, info, solver, False)
    COUNTS["instances"] += 1
    COUNTS[f"objective {info['objective']}"] += 1
    COUNTS[f"{info['devices']} devices"] += 1
    sol = solve_ilp(problem, solver=solver, gap=0.0)
    COUNTS["n-way split chosen"] += any(len(sp.devices) > 2 for sp in sol.placement.split.values())
    assert not failures, (info, solver, failures)


def test_nway_instances_chose_nway_splits() -> None:
    if COUNTS["instances"] == 0:
        pytest.skip("run with the property test above")
    assert COUNTS["n-way split chosen"] > 0, f"no instance chose a split over 3+ devices: widen the strategy ({COUNTS})"
    assert COUNTS["objective latency"] and COUNTS["objective throughput"] and COUNTS["4 devices"]


THREE_GPUS = """
[devices.cpu]
kind = "cpu"
memory = "64GiB"
peak_flops = { float32 = 1e12 }
mem_bandwidth = "40GB/s"
launch_overhead = "2us"
""" + "".join(f"""
[devices."cuda:{i}"]
kind = "gpu"
memory = "16GiB"
peak_flops = {{ float32 = 5e13 }}
mem_bandwidth = "2000GB/s"
launch_overhead = "10us"

[[links]]
between = ["cpu", "cuda:{i}"]
bandwidth = "25GB/s"
latency = "10us"
""" for i in range(3)) + "".join(f"""
[[links]]
between = ["cuda:{i}", "cuda:{j}"]
bandwidth = "300GB/s"
latency = "5us"
""" for i, j in ((0, 1), (0, 2), (1, 2)))


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_a_linear_too_big_for_two_of_three_gpus_is_split_three_ways(solver: str) -> None:
    """A 512 x 8192 linear (16 MiB of weight) after a norm: each GPU holds under half of it, so on
    the GPUs it runs only split three ways; the ILP chooses such a split, at brute force's optimum."""
    import torch

    from cost_models.profiles import load_profile_text
    from partitioner import from_module

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.LayerNorm(512), torch.nn.Linear(512, 8192)).eval()
    graph = from_module(module, (torch.randn(256, 512),))
    profile = load_profile_text(THREE_GPUS, "three-gpus")
    options = Options(streaming=False, splits=SplitOptions(axes=("cols",), degrees=(3,)))
    probe = Problem(graph, profile, options)
    op = max(probe.nodes, key=lambda n: probe.param_mem[n])
    cap = probe.param_mem[op] * 2 // 5 + 2 * probe.work_mem[op] + (1 << 20)
    problem = Problem(graph, profile.with_memory({f"cuda:{i}": cap for i in range(3)}), options)
    assert {len(sp.devices) for sp in problem.split_choices[op]} == {3}
    best, arg = optimum(problem)
    assert arg is not None and len(arg.split[op].devices) == 3, "brute force found no three-way split best"
    sol = solve_ilp(problem, solver=solver, gap=0.0)
    assert len(sol.placement.split[op].devices) == 3 and sol.placement.split[op].home.startswith("cuda")
    assert evaluate(problem, sol.placement).total_s == pytest.approx(best, rel=1e-6)
    assert sol.bound <= best * (1 + 1e-6) and physical_lower_bound(problem) <= best * (1 + 1e-6)
