"""The certificate with table and batch splits, checked against brute force (``tests/property/oracle.py``).

Random small instances whose gathers owning a table are embeddings and whose one-input elementwise
ops and norms write their input's shape (``aten.gelu``, ``aten.layer_norm``), some matmuls linears;
every tensor ``[rows, 16]`` float32. ``Options.splits`` offers table and batch splits (and, at
times, cols) at offered fractions and, sometimes, the proportional and balanced ones; latency and
throughput, tight caps or not; the ILP at gap 0 with HiGHS and with CBC, cold and warm started:

* returns a placement within gap 0 of the enumerated optimum (every device, stream and split),
* states a bound no higher than that optimum, and the physical and memory-aware bounds hold,
* reports an objective equal to ``evaluate`` of its placement.

A fixed instance (a table over the accelerator's cap) checks that a table split is chosen at all.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.synthetic import random_dag, random_profile
from partitioner.ir import OpClass, OpGraph
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Problem, evaluate
from partitioner.solvers.splits import SplitOptions
from tests.property.oracle import count_candidates, optimum
from tests.property.test_certificates import _as_linears, check

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
COUNTS: collections.Counter = collections.Counter()
_WIDTH = 16  # every tensor is [nbytes // 64, 16] float32


def _as_tables_and_rows(graph: OpGraph) -> OpGraph:
    """``graph`` with tensors ``[rows, 16]``, each gather owning a parameter an ``aten.embedding``
    of a ``[rows, 16]`` table, and each elementwise op or norm reading one tensor an ``aten.gelu``
    or ``aten.layer_norm`` whose output is its input's size (its bytes written so)."""
    tensors = {t.name: dataclasses.replace(t, shape=(t.nbytes // (4 * _WIDTH), _WIDTH)) for t in graph.tensors.values()}
    kinds, ops = {}, []
    for op in graph.topological_order():  # in order: an output resized before its readers are looked at
        if op.op_class is OpClass.GATHER and op.owned_params:
            kinds[op.name] = "aten.embedding.default"
        elif op.op_class in (OpClass.ELEMENTWISE, OpClass.NORM) and len(op.inputs) == 1 and len(op.outputs) == 1:
            kinds[op.name] = "aten.gelu.default" if op.op_class is OpClass.ELEMENTWISE else "aten.layer_norm.default"
            source, out = tensors[op.inputs[0]], op.outputs[0]
            tensors[out] = dataclasses.replace(tensors[out], shape=source.shape, nbytes=source.nbytes)
            op = dataclasses.replace(op, bytes_read=source.nbytes, bytes_written=source.nbytes)
        ops.append(dataclasses.replace(op, kind=kinds[op.name]) if op.name in kinds else op)
    params = [dataclasses.replace(p, shape=(p.nbytes // (4 * _WIDTH), _WIDTH))
              if kinds.get(p.owner) == "aten.embedding.default" else p for p in graph.params.values()]
    return OpGraph(graph.name, ops, tensors.values(), params, graph.inputs, graph.outputs)


@st.composite
def axis_instances(draw: st.DrawFn) -> tuple[Problem, dict]:
    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]))
    n_devices = draw(st.integers(2, 3))
    n_ops = draw(st.sampled_from(range(4 if n_devices == 2 else 3, 1, -1)))
    graph = _as_tables_and_rows(_as_linears(random_dag(seed, n_ops, max_inputs=1, param_prob=0.9,
                                                       param_sizes=(1 << 20, 1 << 22, 1 << 24))))
    profile = random_profile(seed, n_devices, tight=draw(st.booleans()))
    if draw(st.booleans()):  # accelerators hold about half the largest table or weight
        largest = max(op.param_bytes for op in graph.ops.values())
        working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
        cap = largest // 2 + 2 * working
        profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    axes = draw(st.sampled_from((("table",), ("batch",), ("table", "batch"), ("cols", "table", "batch"))))
    splits = SplitOptions(fractions=draw(st.sampled_from(((0.5,), (0.25, 0.75)))), axes=axes,
                          proportional=draw(st.booleans()), balanced=draw(st.booleans()))
    streaming = draw(st.booleans())
    problem = Problem(graph, profile, Options(objective=objective, streaming=streaming, splits=splits))
    assume(any(sp.axis in ("table", "batch") for ch in problem.split_choices.values() for sp in ch))
    assume(count_candidates(problem) <= 3000)
    info = {"objective": objective.value, "pipeline": False, "streaming": streaming, "training": False,
            "tied": False, "coarsened": False, "pinned": False, "pinned producer, several consumers": False,
            "nodes": len(problem.nodes), "candidates": count_candidates(problem)}
    return problem, info


@SETTINGS
@given(case=axis_instances(), solver=st.sampled_from(["highs", "cbc"]), warm=st.booleans())
def test_table_and_batch_split_certificate_holds(case: tuple[Problem, dict], solver: str, warm: bool) -> None:
    problem, info = case
    failures = check(problem, info, solver, warm)
    sol = solve_ilp(problem, solver=solver, gap=0.0)
    COUNTS["instances"] += 1
    COUNTS[solver] += 1
    COUNTS[f"objective {info['objective']}"] += 1
    for axis in ("table", "batch"):
        COUNTS[f"{axis} offered"] += any(sp.axis == axis for ch in problem.split_choices.values() for sp in ch)
        COUNTS[f"{axis} chosen"] += any(sp.axis == axis for sp in sol.placement.split.values())
    assert not failures, (solver, info, failures)


def test_the_instances_offered_both_axes_and_both_solvers_ran() -> None:
    if COUNTS["instances"] == 0:
        pytest.skip("run with the property test above")
    assert COUNTS["table offered"] and COUNTS["batch offered"], COUNTS
    assert COUNTS["table chosen"] + COUNTS["batch chosen"], f"no instance chose a split: widen the strategy {COUNTS}"
    assert COUNTS["highs"] and COUNTS["cbc"], COUNTS
    assert COUNTS["objective latency"] and COUNTS["objective throughput"], COUNTS


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_a_table_over_the_accelerators_cap_is_split_rather_than_left_on_the_host(solver: str) -> None:
    """A 16 MiB table the accelerator holds three quarters of: brute force's optimum splits it by
    rows and beats every whole placement; the ILP's split equals it, and its bound holds."""
    import torch

    from cost_models.profiles import load_profile
    from partitioner import from_module

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(16384, 256), torch.nn.LayerNorm(256)).eval()
    graph = from_module(module, (torch.randint(0, 16384, (8, 64)),))
    probe = Problem(graph, load_profile("h200-host"), Options(streaming=False))
    table = max(probe.nodes, key=lambda n: probe.param_mem[n])
    cap = probe.param_mem[table] * 3 // 4 + 4 * probe.work_mem[table]
    profile = load_profile("h200-host").with_memory({"cuda:0": cap, "cpu": probe.param_mem[table] * 3 // 4})
    problem = Problem(graph, profile, Options(streaming=False, splits=SplitOptions(axes=("table", "batch"))))
    whole = Problem(graph, profile, Options(streaming=False))
    best_whole, _ = optimum(whole)
    best, arg = optimum(problem)
    assert arg is not None and any(sp.axis == "table" for sp in arg.split.values())
    assert best < best_whole
    sol = solve_ilp(problem, solver=solver, gap=0.0)
    assert any(sp.axis == "table" for sp in sol.placement.split.values())
    assert evaluate(problem, sol.placement).total_s == pytest.approx(best, rel=1e-6)
    assert sol.bound <= best * (1 + 1e-6) and physical_lower_bound(problem) <= best * (1 + 1e-6)
