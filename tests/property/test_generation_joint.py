"""The joint generation ILP against brute force: its objective is the true optimum over every pair of
phase placements that agree on where each parameter lives, its bound holds, and it is never worse than
the one-placement ILP or the warm start it was given.

The two phases are one random DAG at two sizes: the "prefill" with ``SHRINK`` times the FLOPs, the
"decode step" with every activation, FLOP count and byte count divided by ``SHRINK`` (the parameters, and so the memory they
take, unchanged) — the shape of a prompt against one token. Some ops are cache writers (their
buffers may not stream).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.synthetic import random_dag, random_profile
from partitioner.ir import OpGraph
from partitioner.solvers.generation import GenerationProblem, PhasePair, solve_generation
from partitioner.solvers.problem import Options, Placement, Problem, evaluate
from tests.property.oracle import placements

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHRINK = 64


def shrunk(graph: OpGraph, factor: int) -> OpGraph:
    """``graph`` with activations, FLOPs and bytes moved divided by ``factor`` (parameters as they are)."""
    ops = [dataclasses.replace(op, flops=op.flops // factor, bytes_read=max(op.param_bytes, op.bytes_read // factor),
                               bytes_written=op.bytes_written // factor) for op in graph.ops.values()]
    tensors = [dataclasses.replace(t, nbytes=max(1, t.nbytes // factor)) for t in graph.tensors.values()]
    return OpGraph(graph.name, ops, tensors, graph.params.values(), graph.inputs, graph.outputs,
                   module_types=graph.module_types)


def phases(seed: int, n_ops: int, tight: bool, writers: int) -> GenerationProblem:
    graph = random_dag(seed, n_ops, param_prob=0.7)
    profile = random_profile(seed, 2, tight=False)
    if tight and graph.total_param_bytes():  # the accelerator: room to stream, and a quarter of the weights
        largest = max(op.param_bytes for op in graph.ops.values())
        working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
        profile = profile.with_memory({"cuda:0": 2 * largest + working + graph.total_param_bytes() // 4})
    owners = [op.name for op in graph.ops.values() if op.param_bytes][:writers]
    prompt = dataclasses.replace  # the prefill: the same ops doing SHRINK times the arithmetic (compute-bound)
    pre = Problem(OpGraph(graph.name, [prompt(op, flops=op.flops * SHRINK) for op in graph.ops.values()],
                          graph.tensors.values(), graph.params.values(), graph.inputs, graph.outputs),
                  profile, Options(), state_writers=owners)
    dec = Problem(shrunk(graph, SHRINK), profile, Options(), state_writers=owners)
    return GenerationProblem(pre, dec, (1.0, 15.0))


def brute_force(gp: GenerationProblem) -> float:
    """The best weighted objective over every feasible pair whose homes agree."""
    def feasible(problem: Problem) -> list[tuple[Placement, float]]:
        out = []
        for pl in placements(problem):
            ev = evaluate(problem, pl)
            if ev.feasible:
                out.append((pl, ev.total_s))
        return out

    best = float("inf")
    pre, dec = feasible(gp.prefill), feasible(gp.decode)
    for (a, ta), (b, tb) in itertools.product(pre, dec):
        if not gp.home_violations(PhasePair(a, b)):
            best = min(best, gp.weights[0] * ta + gp.weights[1] * tb)
    return best


@SETTINGS
@given(seed=st.integers(0, 10_000), n_ops=st.integers(2, 5), tight=st.booleans(), writers=st.integers(0, 2))
def test_joint_ilp_equals_brute_force_and_its_bound_holds(seed: int, n_ops: int, tight: bool, writers: int) -> None:
    gp = phases(seed, n_ops, tight, writers)
    expected = brute_force(gp)
    sol = solve_generation(gp, warm_start=None, time_limit=30, gap=0.0)
    if expected == float("inf"):
        assert sol.objective is None
        return
    _, _, total, violations = gp.evaluate(sol.placements)
    assert not violations, violations
    assert total == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert sol.objective == pytest.approx(total, rel=1e-9)
    assert sol.bound is not None and sol.bound <= total * (1 + 1e-6) + 1e-12
    for a, b in gp.links:  # every parameter has one home
        assert sol.placements.prefill.residence(a) == sol.placements.decode.residence(b)
    for n in gp.decode.state_writers:  # a cache writer's buffers never stream
        assert n not in sol.placements.decode.streamed and n not in sol.placements.prefill.streamed


@SETTINGS
@given(seed=st.integers(0, 10_000), n_ops=st.integers(2, 5), tight=st.booleans())
def test_one_placement_is_never_better_than_the_joint_plan(seed: int, n_ops: int, tight: bool) -> None:
    gp = phases(seed, n_ops, tight, 0)
    one = solve_generation(gp, warm_start=None, time_limit=30, gap=0.0, same_use=True)
    if one.objective is None:
        return
    for a, b in gp.links:  # the same use of every weight in both phases
        assert one.placements.prefill.device[a] == one.placements.decode.device[b]
        assert (a in one.placements.prefill.streamed) == (b in one.placements.decode.streamed)
    joint = solve_generation(gp, warm_start=one.placements, time_limit=30, gap=0.0)
    assert joint.objective is not None and joint.objective <= one.objective * (1 + 1e-9)


def packed_phases(seed: int, n_ops: int, cap_share: int) -> GenerationProblem | None:
    """The two phases of a random DAG of linears that may pack their weights (int8, int4) or compute
    in bfloat16 on either device, with the accelerator holding ``1/cap_share`` of the float32
    weights (so packing, a 16-bit copy or streaming decides what fits); None when brute force
    would enumerate too many pairs."""
    from cost_models.precision import resolve_precision
    from tests.property.oracle import count_candidates
    from tests.property.test_certificates import _as_linears

    graph = _as_linears(random_dag(seed, n_ops, max_inputs=2, param_prob=1.0, param_sizes=(1 << 20, 1 << 22)))
    profile = random_profile(seed, 2)
    profile = dataclasses.replace(profile, devices=tuple(
        dataclasses.replace(d, peak_flops={"float32": d.peak("float32"), "bfloat16": 4 * d.peak("float32")},
                            weight_only={"int8": 4 * d.peak("float32"), "int4": 3 * d.peak("float32")})
        for d in profile.devices))
    cap = graph.total_param_bytes() // cap_share + (1 << 20)
    profile = profile.with_memory({"cuda:0": cap})
    options = Options(precision=resolve_precision({"activations": "auto", "weights": "auto"}, profile))
    pre = Problem(OpGraph(graph.name, [dataclasses.replace(op, flops=op.flops * SHRINK) for op in graph.ops.values()],
                          graph.tensors.values(), graph.params.values(), graph.inputs, graph.outputs),
                  profile, options)
    dec = Problem(shrunk(graph, SHRINK), profile, options)
    if count_candidates(pre) * count_candidates(dec) > 400_000:
        return None
    return GenerationProblem(pre, dec, (1.0, 15.0))


def test_stored_forms_are_linked_and_the_joint_ilp_equals_brute_force() -> None:
    """Precision with packed weights: the joint ILP (with its ``form[...]`` rows: one stored form of
    every weight for both phases) is within gap 0 of brute force over every pair whose homes and
    stored forms agree, its bound holds, and the instances make the phases want different forms
    (the link binds: some solve would be better without it)."""
    from cost_models.precision import weights as packed_in

    checked = packed = binding = 0
    for seed in range(40):
        gp = packed_phases(seed, 2 + seed % 2, 2 + seed % 3)
        if gp is None:
            continue
        expected = brute_force(gp)
        sol = solve_generation(gp, warm_start=None, time_limit=30, gap=0.0)
        if expected == float("inf"):
            assert sol.objective is None
            continue
        _, _, total, violations = gp.evaluate(sol.placements)
        assert not violations, (seed, violations)
        assert total == pytest.approx(expected, rel=1e-6, abs=1e-12), seed
        assert sol.bound is not None and sol.bound <= total * (1 + 1e-6) + 1e-12
        for a, b in gp.links:
            names = gp.shared[(a, b)]
            assert gp.form_of(0, a, gp.prefill.dtype_of(sol.placements.prefill, a), names) == \
                gp.form_of(1, b, gp.decode.dtype_of(sol.placements.decode, b), names)
        checked += 1
        packed += any(packed_in(gp.decode.dtype_of(sol.placements.decode, n)) for _, n in gp.links)
        free = _unlinked_forms_best(gp)
        binding += free < expected * (1 - 1e-9)
        if checked >= 8 and packed >= 2 and binding >= 1:
            break
    assert checked >= 8 and packed >= 2 and binding >= 1, (checked, packed, binding)


def _unlinked_forms_best(gp: GenerationProblem) -> float:
    """Brute force with homes linked but stored forms free (what the ``form`` rows forbid)."""
    def feasible(problem: Problem) -> list[tuple[Placement, float]]:
        return [(pl, ev.total_s) for pl in placements(problem) if (ev := evaluate(problem, pl)).feasible]

    best = float("inf")
    for (a, ta), (b, tb) in itertools.product(feasible(gp.prefill), feasible(gp.decode)):
        if all(a.residence(x) == b.residence(y) for x, y in gp.links):
            best = min(best, gp.weights[0] * ta + gp.weights[1] * tb)
    return best
