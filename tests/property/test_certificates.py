"""The certificate, checked against brute force: for random instances of at most about ten ops,
every objective, pipeline stages (GPipe and 1F1B, a stage count or not), streaming on and off,
training, pins (pinned producers with consumers on other devices included), tied weights,
coarsened and not, the ILP at gap 0 (HiGHS, cold and warm started, and CBC)

* returns a placement within its stated gap of the enumerated optimum (evaluated on the
  *original* graph),
* states a bound no higher than that optimum,
* reports an objective equal to ``evaluate`` of its placement on the original graph (makespan on
  a coarsened graph: equal to the coarse evaluation, which the original graph's schedule never
  exceeds), and
* the physical and the memory-aware lower bounds are no higher than the optimum.

With ``precision="auto"`` (accelerators faster in 16 bits, a host as fast or a little faster,
sometimes an accelerator running only bfloat16), coarsened and not, the same holds against brute force over every
(device, dtype) of every node.

The instances are drawn by hypothesis with a fixed seed (``derandomize``) so CI sees the same
ones every run; the last test checks that every kind of instance was drawn and prints the counts.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.synthetic import random_dag, random_profile
from partitioner.ir import OpClass, OpGraph
from partitioner.coarsen import CoarsenOptions, coarsen
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.pipeline import PipelineSpec, Schedule
from partitioner.solvers.problem import Objective, Options, Problem, Status, evaluate
from tests.property.oracle import count_candidates, expand, optimum

EXAMPLES = 500
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TOLERANCE = 1e-6
COUNTS: collections.Counter = collections.Counter()


@st.composite
def instances(draw: st.DrawFn) -> tuple[Problem, dict]:
    """A small problem and a description of what it exercises."""
    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from(list(Objective)))
    n_devices = draw(st.integers(2, 3))
    n_ops = draw(st.sampled_from(range(9 if n_devices == 2 else 6, 1, -1)))  # hypothesis favours the first
    streaming = draw(st.booleans())
    training = draw(st.booleans()) and not streaming  # training never streams
    tied = draw(st.booleans())
    coarsened = draw(st.booleans())
    sizes = draw(st.sampled_from(((1 << 22, 1 << 23), (1 << 16, 1 << 22, 1 << 26))))  # similar or mixed weights
    graph = random_dag(seed, n_ops, tied_prob=0.7 if tied else 0.0, max_inputs=draw(st.sampled_from((3, 2, 1))),
                       param_prob=0.7, param_sizes=sizes)
    profile = random_profile(seed, n_devices, tight=draw(st.booleans()))
    share = draw(st.sampled_from((None, 0.0, 0.25)))  # accelerators: room to stream plus this share of the weights
    if share is not None and graph.total_param_bytes():
        largest = max(op.param_bytes for op in graph.ops.values())
        working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
        cap = 2 * largest + working + int(share * graph.total_param_bytes())
        profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    pins = draw(_pins(graph, profile.names()))
    members, problem_graph = None, graph
    if coarsened:
        c = coarsen(graph, CoarsenOptions(module_depth=1, keep_separate=frozenset(pins)))
        assume(len(c.graph) < len(graph))
        problem_graph, members = c.graph, c.members
    spec = None
    if draw(st.integers(0, 4)) == 0:  # a fifth are pipeline stages (throughput of micro-batches, no streaming)
        micro_batches, schedule = draw(st.integers(1, 4)), draw(st.sampled_from(list(Schedule)))
        stages = draw(st.sampled_from((None, 2)))
        assume(not (schedule is Schedule.ONE_F_ONE_B and stages is not None and stages > micro_batches))  # refused
        spec = PipelineSpec(micro_batches, schedule, stages)
        objective, streaming = Objective.THROUGHPUT, False
    try:
        # training state choices (offload, recompute) are certified by tests/property/test_training_state.py
        problem = Problem(problem_graph, profile, Options(objective=objective, streaming=streaming, training=training,
                                                          pipeline=spec, offload=False, recompute=False),
                          pins=pins, members=members, original=graph)
    except Exception:  # a pin on a device that cannot run the op: not an instance
        assume(False)
        raise
    assume(count_candidates(problem) <= 2500)
    fanout = any(t.producer in problem.pins and len(t.consumers) >= 2
                 and any(problem.pins.get(c, problem.pins[t.producer]) != problem.pins[t.producer] for c in t.consumers)
                 for t in problem.tensors)
    info = {"objective": objective.value, "pipeline": spec is not None, "streaming": streaming, "training": training, "tied": bool(problem.shared),
            "coarsened": coarsened, "pinned": bool(problem.pins), "pinned producer, several consumers": fanout,
            "nodes": len(problem.nodes), "candidates": count_candidates(problem)}
    return problem, info


@st.composite
def _pins(draw: st.DrawFn, graph, devices: tuple[str, ...]) -> dict[str, str]:
    """No pins, a few random ones, or a producer with several consumers pinned apart from them."""
    kind = draw(st.sampled_from(["none", "random", "fanout"]))
    ops = sorted(graph.ops, key=lambda n: graph.ops[n].index)
    if kind == "none":
        return {}
    if kind == "random":
        chosen = draw(st.lists(st.sampled_from(ops), min_size=1, max_size=3, unique=True))
        return {op: draw(st.sampled_from(devices)) for op in chosen}
    fan = [op for op in ops if len(graph.successors(op)) >= 2]
    assume(fan)
    producer = draw(st.sampled_from(fan))
    home, away = draw(st.permutations(devices))[:2]
    pins = {producer: home}
    for consumer in graph.successors(producer)[:2]:
        pins[consumer] = away
    return pins


def check(problem: Problem, info: dict, solver: str, warm: bool) -> list[str]:
    """Every way the certificate can fail on this instance (empty when it holds)."""
    best, _ = optimum(problem)
    start = solve_heft(problem).placement if warm else None
    if start is not None and not evaluate(problem, start).feasible:
        start = None
    sol = solve_ilp(problem, solver=solver, time_limit=60, gap=0.0, warm_start=start)
    info["16-bit chosen"] = bool(sol.placement.precision)
    info["packed chosen"] = any("+" in a for a in sol.placement.precision.values())
    if best == float("inf"):
        return [] if sol.status is Status.INFEASIBLE else [f"no placement fits, the ILP says {sol.status.value}"]
    if sol.status is Status.INFEASIBLE:
        return [f"the ILP says infeasible, the optimum is {best}"]
    tol = TOLERANCE * best + 1e-15
    original, flat = expand(problem, sol.placement)
    on_original = evaluate(original, flat)
    own = evaluate(problem, sol.placement)
    out = []
    if not on_original.feasible:
        out.append(f"the placement breaks {on_original.violations[0]}")
    target = _bound_target(problem, best)
    value = own.total_s if _makespan_coarse(problem) else on_original.total_s
    if value > target * (1 + TOLERANCE) + 1e-15:
        out.append(f"placement {value} is not within gap 0 of the optimum {target}")
    if sol.bound is None or sol.bound > target + tol:
        out.append(f"bound {sol.bound} above the optimum {target}")
    if sol.objective is None or abs(sol.objective - own.total_s) > tol:
        out.append(f"solver objective {sol.objective} != evaluate {own.total_s}")
    if _makespan_coarse(problem):
        if on_original.total_s > own.total_s + tol:
            out.append(f"coarse makespan {own.total_s} below the original graph's {on_original.total_s}")
    elif abs(on_original.total_s - own.total_s) > tol:
        out.append(f"coarse evaluation {own.total_s} != original {on_original.total_s}")
    if physical_lower_bound(original) > best + tol:
        out.append(f"physical lower bound {physical_lower_bound(original)} above the optimum {best}")
    memory_bound = memory_aware_lower_bound(problem)
    if memory_bound > best + tol:
        out.append(f"memory-aware lower bound {memory_bound} above the optimum {best}")
    return out


def _makespan_coarse(problem: Problem) -> bool:
    return problem.options.objective is Objective.MAKESPAN and problem.graph is not problem.original


def _bound_target(problem: Problem, best: float) -> float:
    """What the bound must not exceed: the optimum, or for makespan on a coarsened graph the
    optimum of the coarse schedule (groups run whole), which is what that ILP models."""
    if not _makespan_coarse(problem):
        return best
    from partitioner.solvers.problem import Placement
    from tests.property.oracle import orders, placements

    coarse_best = float("inf")
    for placement in placements(problem):
        for order in orders(problem):
            ev = evaluate(problem, Placement(placement.device, placement.streamed, placement.stream_mode, order))
            if ev.feasible:
                coarse_best = min(coarse_best, ev.total_s)
    return coarse_best


def _record(info: dict, solver: str, failures: list[str]) -> None:
    COUNTS["instances"] += 1
    COUNTS["nodes total"] += info.get("nodes", 0)
    COUNTS["candidates total"] += info.get("candidates", 0)
    COUNTS[f"solver {solver}"] += 1
    COUNTS[f"objective {info['objective']}"] += 1
    for key in ("pipeline", "streaming", "training", "tied", "coarsened", "pinned", "pinned producer, several consumers"):
        COUNTS[key] += bool(info[key])
    COUNTS["violations"] += len(failures)


@SETTINGS
@given(case=instances(), warm=st.booleans())
def test_highs_certificate_holds(case: tuple[Problem, dict], warm: bool) -> None:
    problem, info = case
    failures = check(problem, info, "highs", warm)
    _record(info, "highs", failures)
    assert not failures, (info, failures)


@settings(SETTINGS, max_examples=80)
@given(case=instances())
def test_cbc_certificate_holds(case: tuple[Problem, dict]) -> None:
    problem, info = case
    failures = check(problem, info, "cbc", warm=True)
    _record(info, "cbc", failures)
    assert not failures, (info, failures)


@st.composite
def precision_instances(draw: st.DrawFn) -> tuple[Problem, dict]:
    """A small problem planned with ``precision="auto"``: accelerators many times faster in 16 bits,
    the host as fast or a little faster, and sometimes an accelerator that runs only bfloat16."""
    import dataclasses

    from cost_models.precision import resolve_precision

    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]))
    n_devices = draw(st.integers(2, 3))
    n_ops = draw(st.sampled_from(range(6 if n_devices == 2 else 4, 1, -1)))
    training = draw(st.booleans())
    streaming = draw(st.booleans()) and not training
    graph = random_dag(seed, n_ops, tied_prob=0.5 if draw(st.booleans()) else 0.0, max_inputs=2, param_prob=0.7,
                       param_sizes=(1 << 16, 1 << 22, 1 << 26))
    profile = random_profile(seed, n_devices, tight=draw(st.booleans()))
    host_speedup = draw(st.sampled_from((1.0, 1.5)))
    low_only = draw(st.booleans()) and n_devices == 3
    devices = []
    for i, d in enumerate(profile.devices):
        f32 = d.peak("float32")
        speedup = host_speedup if d.name == "cpu" else draw(st.sampled_from((2.0, 8.0)))
        peaks = {"float32": f32, "bfloat16": f32 * speedup, "float16": f32 * speedup}
        dtypes = ("bfloat16",) if low_only and d.name != "cpu" and i == len(profile.devices) - 1 else None
        devices.append(dataclasses.replace(d, peak_flops=peaks, dtypes=dtypes))
    profile = dataclasses.replace(profile, devices=tuple(devices))
    if draw(st.booleans()):  # a cap that 16-bit weights fit and float32 ones may not
        cap = max(1, graph.total_param_bytes() // 3) + (1 << 24)
        profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    packs = not training and draw(st.booleans())  # linears whose weights may be packed, int8 or int4
    if packs:
        graph = _as_linears(graph)
        profile = dataclasses.replace(profile, devices=tuple(  # at the 16-bit rate: fewer bytes, as fast
            dataclasses.replace(d, weight_only={"int8": 2 * d.peak("bfloat16"), "int4": 1.5 * d.peak("bfloat16")}
                                if d.name != "cpu" or draw(st.booleans()) else {})
            for d in profile.devices))
    setting = {"activations": "auto", "weights": "auto"} if packs else "auto"
    options = Options(objective=objective, streaming=streaming, training=training,
                      precision=resolve_precision(setting, profile))
    coarsened = draw(st.booleans())
    members, problem_graph = None, graph
    if coarsened:  # groups whose members read one tensor in several dtypes, and cast between themselves
        c = coarsen(graph, CoarsenOptions(module_depth=1))
        assume(len(c.graph) < len(graph))
        problem_graph, members = c.graph, c.members
    try:
        problem = Problem(problem_graph, profile, options, members=members, original=graph)
    except Exception:  # an op no device can run in a dtype it needs: not an instance
        assume(False)
        raise
    assume(count_candidates(problem) <= 3000)
    info = {"objective": objective.value, "pipeline": False, "streaming": streaming, "training": training,
            "tied": bool(problem.shared), "coarsened": coarsened, "pinned": False,
            "pinned producer, several consumers": False, "nodes": len(problem.nodes),
            "candidates": count_candidates(problem), "low only": low_only, "packs": packs}
    return problem, info


def _as_linears(graph: OpGraph) -> OpGraph:
    """``graph`` with each matmul owning its weight made an ``aten.linear`` of a ``[16, n]`` weight
    (so weight-only packing may apply to it)."""
    import dataclasses

    linear = {op.name for op in graph.ops.values() if op.op_class.value == "matmul" and op.owned_params}
    ops = [dataclasses.replace(op, kind="aten.linear.default") if op.name in linear else op
           for op in graph.topological_order()]
    params = [dataclasses.replace(p, shape=(16, p.shape[0] // 16)) if p.owner in linear else p
              for p in graph.params.values()]
    return OpGraph(graph.name, ops, graph.tensors.values(), params, graph.inputs, graph.outputs)


@settings(SETTINGS, max_examples=150)
@given(case=precision_instances(), warm=st.booleans())
def test_precision_certificate_holds(case: tuple[Problem, dict], warm: bool) -> None:
    """precision="auto": the ILP's (device, dtype) choice is within gap 0 of brute force over
    every (device, dtype) per node, its objective is evaluate's, and the lower bounds hold."""
    problem, info = case
    failures = check(problem, info, "highs", warm)
    _record(info, "highs", failures)
    COUNTS["precision"] += 1
    COUNTS["precision, 16-bit chosen"] += info["16-bit chosen"]
    COUNTS["precision, coarsened"] += info["coarsened"]
    COUNTS["precision, packed weights offered"] += info["packs"]
    COUNTS["precision, packed weights chosen"] += info["packed chosen"]
    assert not failures, (info, failures)


def _packed_instance(seed: int) -> Problem | None:
    """A small inference problem whose accelerator holds its linears' weights only packed: float32
    weights over its cap, a quarter of them under it (None: too many candidates to enumerate)."""
    import dataclasses

    from cost_models.precision import resolve_precision

    graph = _as_linears(random_dag(seed, 4, max_inputs=2, param_prob=1.0, param_sizes=(1 << 22, 1 << 24)))
    profile = random_profile(seed, 2)
    profile = dataclasses.replace(profile, devices=tuple(
        dataclasses.replace(d, peak_flops={"float32": d.peak("float32"), "bfloat16": 4 * d.peak("float32")},
                            weight_only={"int8": 4 * d.peak("float32"), "int4": 3 * d.peak("float32")})
        for d in profile.devices))
    cap = graph.total_param_bytes() // 3 + (1 << 22)
    profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    options = Options(precision=resolve_precision({"activations": "auto", "weights": "auto"}, profile))
    problem = Problem(graph, profile, options)
    return problem if count_candidates(problem) <= 3000 else None


def test_packed_weight_choices_keep_the_certificate_on_fixed_instances() -> None:
    """weights="auto": on instances where packing pays, the ILP's (device, dtype) choice with packed
    forms is within gap 0 of brute force, its objective is evaluate's, and the bounds hold."""
    chosen = 0
    for seed in range(60):
        problem = _packed_instance(seed)
        if problem is None:
            continue
        info = {"objective": "latency", "pipeline": False, "streaming": True, "training": False, "tied": False,
                "coarsened": False, "pinned": False, "pinned producer, several consumers": False,
                "nodes": len(problem.nodes), "candidates": count_candidates(problem)}
        failures = check(problem, info, "highs", False)
        assert not failures, (seed, failures)
        chosen += info["packed chosen"]
        if chosen >= 3:
            break
    assert chosen >= 1, "no instance where packing pays: widen _packed_instance"


def _packed_stream_instance(seed: int, coarsened: bool) -> Problem | None:
    """A small inference problem whose weights are all linears' and packed in int8 on the accelerator
    (many times faster than the host, which has no int8 kernel), with room there for the largest
    packed weight's two stream buffers and half the smallest, not for all of them: the best plan streams
    some weights packed (None: nothing to pack, or too many candidates to enumerate)."""
    import dataclasses

    from cost_models.precision import packed_weight_bytes, resolve_precision

    graph = random_dag(seed, 4, max_inputs=2, param_prob=1.0, param_sizes=(1 << 22, 1 << 24))
    owners = {op.name for op in graph.ops.values() if op.owned_params}
    ops = [dataclasses.replace(op, kind="aten.linear.default", op_class=OpClass.MATMUL) if op.name in owners else op
           for op in graph.topological_order()]
    params = [dataclasses.replace(p, shape=(16, p.shape[0] // 16)) if p.owner in owners else p
              for p in graph.params.values()]
    graph = OpGraph(graph.name, ops, graph.tensors.values(), params, graph.inputs, graph.outputs)
    profile = random_profile(seed, 2)
    profile = dataclasses.replace(profile, devices=tuple(
        dataclasses.replace(d, peak_flops={"float32": d.peak("float32"), "bfloat16": 4 * d.peak("float32")},
                            weight_only={"int8": 4 * d.peak("float32")} if d.name != "cpu" else {})
        for d in profile.devices))
    packed = [packed_weight_bytes(*p.shape, "int8") for p in params if p.owner in owners]
    if sum(packed) <= 2 * max(packed, default=0):  # streaming would save no memory there
        return None
    working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
    cap = 2 * max(packed) + working + min(packed) // 2
    profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    options = Options(precision=resolve_precision({"weights": "int8"}, profile))
    members, problem_graph = None, graph
    if coarsened:
        c = coarsen(graph, CoarsenOptions(module_depth=1))
        if len(c.graph) == len(graph):
            return None
        problem_graph, members = c.graph, c.members
    problem = Problem(problem_graph, profile, options, members=members, original=graph)
    return problem if count_candidates(problem) <= 3000 else None


@pytest.mark.parametrize("coarsened", [False, True])
def test_packed_weights_streamed_keep_the_certificate_on_fixed_instances(coarsened: bool) -> None:
    """A streamed node may compute in a packed choice, its packed bytes on the link, in host memory
    and in its device's buffer: on instances where streaming packed weights pays, the ILP's choice
    (device, dtype, streamed) is within gap 0 of brute force over every such choice, its objective
    is evaluate's, and the bounds hold."""
    chosen = 0
    for seed in range(80):
        problem = _packed_stream_instance(seed, coarsened)
        if problem is None:
            continue
        info = {"objective": "latency", "pipeline": False, "streaming": True, "training": False, "tied": False,
                "coarsened": coarsened, "pinned": False, "pinned producer, several consumers": False,
                "nodes": len(problem.nodes), "candidates": count_candidates(problem)}
        failures = check(problem, info, "highs", bool(seed % 2))
        assert not failures, (seed, failures)
        sol = solve_ilp(problem, solver="highs", time_limit=60, gap=0.0)
        chosen += any("+" in problem.dtype_of(sol.placement, n) for n in sol.placement.streamed)
        if chosen >= 3:
            break
    assert chosen >= 1, "no instance where streaming packed weights pays: widen _packed_stream_instance"


def test_the_oracle_saw_every_kind_of_instance(capsys: pytest.CaptureFixture[str]) -> None:
    if COUNTS["instances"] == 0:
        pytest.skip("run with the oracle tests above")
    with capsys.disabled():
        print("\noracle:", ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items())))
    for key in ("objective latency", "objective throughput", "objective makespan", "pipeline", "streaming", "training",
                "tied", "coarsened", "pinned", "pinned producer, several consumers", "solver highs", "solver cbc",
                "precision", "precision, 16-bit chosen", "precision, coarsened", "precision, packed weights offered"):
        assert COUNTS[key] > 0, f"no instance with {key}: widen the strategy"
    assert COUNTS["violations"] == 0

