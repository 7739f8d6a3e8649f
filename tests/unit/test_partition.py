"""partition(): the seed case against measured anchors, hand-checked choices, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import models
from cost_models.calibration import measured_anchors
from partitioner import Plan, from_module, load_profile, partition, partition_outcome
from partitioner.errors import GraphError, HetpartError, InfeasiblePlacement, SolverUnavailable, UnsupportedOp
from partitioner.ir import OpGraph
from partitioner.solvers.greedy import solve_greedy
from partitioner.solvers.problem import Options, Placement, Problem, StreamMode, evaluate

ANCHORS = measured_anchors()
CAP_HALF = int(ANCHORS["cap_half_layers"])   # embedding + half the layers' parameters
CAP_2GIB = int(ANCHORS["cap_below_embedding"])
NO_SPLIT = models.entry("emb-transformer").no_split_classes


@pytest.fixture(scope="module")
def seed_graph() -> OpGraph:
    module, inputs = models.get("emb-transformer", "base", device="meta")
    return from_module(module, inputs, name="emb-transformer:base")


def _layer(graph: OpGraph, op: str) -> str:
    path = graph.ops[op].module_path
    return ".".join(path.split(".")[:2]) if path.startswith("layers.") else path.split(".")[0]


def _where(graph: OpGraph, placement: Placement) -> dict[str, set[str]]:
    """Module (emb, layers.N, head) -> devices its parameter-owning ops compute on."""
    out: dict[str, set[str]] = {}
    for op, device in placement.device.items():
        if graph.ops[op].param_bytes:
            out.setdefault(_layer(graph, op), set()).add(device)
    return out


def _problem(graph: OpGraph, cap: int | None, **options: object) -> Problem:
    profile = load_profile("h200-host")
    if cap is not None:
        profile = profile.with_memory({"cuda:0": cap})
    return Problem(graph, profile, Options(**options))


def _hand_placement(graph: OpGraph, *, emb: str, streamed_layers: range = range(0)) -> Placement:
    device = {op: "cuda:0" for op in graph.ops}
    streamed = {}
    for op in graph.ops:
        layer = _layer(graph, op)
        if layer == "emb":
            device[op] = emb
        if layer in {f"layers.{i}" for i in streamed_layers} and graph.ops[op].param_bytes:
            streamed[op] = "cpu"
    return Placement(device, streamed, StreamMode.PREFETCH)


def _within(predicted: float, measured: float, tolerance: float = 0.25) -> bool:
    return abs(predicted - measured) / measured <= tolerance


# -- the cost model against the measured anchors (emb-transformer base, forward) -----------------


def test_anchor_all_gpu(seed_graph: OpGraph) -> None:
    problem = _problem(seed_graph, None)
    total = evaluate(problem, Placement({op: "cuda:0" for op in seed_graph.ops})).total_s
    assert _within(total, ANCHORS["all_gpu_s"]), total


def test_anchor_accelerate_under_both_caps(seed_graph: OpGraph) -> None:
    for cap, measured in ((CAP_HALF, ANCHORS["accelerate_half_s"]), (CAP_2GIB, ANCHORS["accelerate_2gib_s"])):
        problem = _problem(seed_graph, cap)
        greedy = solve_greedy(problem, no_split=NO_SPLIT).placement
        assert greedy.stream_mode is StreamMode.SYNC
        total = evaluate(problem, greedy).total_s
        assert _within(total, measured), (cap, total, measured)


def test_anchor_embedding_on_cpu_layers_on_gpu(seed_graph: OpGraph) -> None:
    for cap, measured in ((CAP_HALF, ANCHORS["emb_cpu_half_s"]), (CAP_2GIB, ANCHORS["emb_cpu_2gib_s"])):
        problem = _problem(seed_graph, cap)
        ev = evaluate(problem, _hand_placement(seed_graph, emb="cpu"))
        assert ev.feasible and _within(ev.total_s, measured), (cap, ev.total_s, measured)


def test_anchor_prefetched_layers(seed_graph: OpGraph) -> None:
    problem = _problem(seed_graph, int(ANCHORS["prefetch_cap"]))
    placement = _hand_placement(seed_graph, emb="cuda:0", streamed_layers=range(2, 8))
    ev = evaluate(problem, placement)
    assert _within(ev.total_s, ANCHORS["prefetched_s"]), ev.total_s
    assert ev.total_s / evaluate(problem, Placement({op: "cuda:0" for op in seed_graph.ops})).total_s < 1.10


# -- the ILP's choices on the seed case ---------------------------------------------------------


def test_without_streaming_the_embedding_goes_to_the_cpu_and_every_layer_to_the_gpu(seed_graph: OpGraph) -> None:
    for cap in (CAP_HALF, CAP_2GIB):
        out = partition_outcome(seed_graph, devices="h200-host", memory={"cuda:0": cap}, streaming=False,
                                no_split=NO_SPLIT)
        where = _where(seed_graph, out.solution.placement)
        assert where.pop("emb") == {"cpu"}
        assert all(devices == {"cuda:0"} for devices in where.values()), where
        assert out.plan.solver.status == "optimal"


def test_greedy_keeps_the_embedding_on_the_gpu_or_streams_everything(seed_graph: OpGraph) -> None:
    half = solve_greedy(_problem(seed_graph, CAP_HALF), no_split=NO_SPLIT).placement
    streamed_layers = {_layer(seed_graph, op) for op in half.streamed}
    assert streamed_layers == {f"layers.{i}" for i in range(3, 8)} | {"head"}
    assert not any(_layer(seed_graph, op) == "emb" for op in half.streamed)
    low = solve_greedy(_problem(seed_graph, CAP_2GIB), no_split=NO_SPLIT).placement
    assert {op for op in seed_graph.ops if seed_graph.ops[op].param_bytes} == set(low.streamed)


def test_with_streaming_the_ilp_picks_what_measured_fastest(seed_graph: OpGraph) -> None:
    # embedding + half the layers: prefetching streamed layers (11.5 ms) beat embedding-on-CPU (15.7 ms)
    half = partition_outcome(seed_graph, devices="h200-host", memory={"cuda:0": CAP_HALF}, no_split=NO_SPLIT)
    assert _where(seed_graph, half.solution.placement)["emb"] == {"cuda:0"}
    assert half.solution.placement.streamed and half.evaluation.feasible
    # below the embedding: embedding on the CPU and layers on the GPU (16.1 ms) beat streaming it (529 ms)
    low = partition_outcome(seed_graph, devices="h200-host", memory={"cuda:0": CAP_2GIB}, no_split=NO_SPLIT)
    where = _where(seed_graph, low.solution.placement)
    assert where.pop("emb") == {"cpu"} and all(d == {"cuda:0"} for d in where.values())
    # and on the 2 GiB cap it is at least 10x faster than accelerate's plan
    greedy_s = low.baselines["greedy"][1].total_s
    assert greedy_s / low.evaluation.total_s >= 10


def test_two_branches_run_on_different_devices_under_makespan() -> None:
    module, inputs = models.get("two-branch", "small")
    graph = from_module(module, inputs)
    out = partition_outcome(graph, devices="2xh200-host", objective="makespan", time_limit=60)
    branch = {p: {d for op, d in out.plan.placement.items() if graph.ops[op].module_path.startswith(p)
                  and graph.ops[op].param_bytes} for p in ("branch_a", "branch_b")}
    assert len(branch["branch_a"]) == 1 and len(branch["branch_b"]) == 1
    assert branch["branch_a"] != branch["branch_b"]


# -- the plan that comes out --------------------------------------------------------------------


def test_plan_records_solver_bounds_and_baselines_and_round_trips(tmp_path: Path, seed_graph: OpGraph) -> None:
    plan = partition(seed_graph, devices="h200-host", memory={"cuda:0": CAP_2GIB}, no_split=NO_SPLIT)
    assert plan.solver.name.startswith("ilp:") and plan.solver.gap is not None and plan.solver.gap <= 0.01
    assert plan.solver.bound <= plan.predicted["total_s"]
    assert plan.predicted["lower_bound_s"] <= plan.predicted["total_s"]
    assert set(plan.baselines) == {"single:cpu", "single:cuda:0", "greedy", "sequential-fill", "heft"}
    for b in plan.baselines.values():
        if b.feasible:
            assert plan.predicted["total_s"] <= b.total_s * (1 + 1e-9)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    assert json.loads(path.read_text())["solver"]["status"] == plan.solver.status
    plan.check_graph(seed_graph)
    assert plan.to_device_map() == {"emb": "cpu", "layers": "cuda:0", "head": "cuda:0"}


def test_same_input_same_plan() -> None:
    module, inputs = models.get("gpt", "tiny")
    first = partition(module, inputs, "cpu-gpu-npu", memory={"cuda:0": "1MB"})
    second = partition(module, inputs, "cpu-gpu-npu", memory={"cuda:0": "1MB"})
    assert first.placement == second.placement and first.schedule == second.schedule


def test_every_objective_and_training_on_a_zoo_model() -> None:
    module, inputs = models.get("gpt", "tiny")
    for objective in ("latency", "throughput", "makespan"):
        for training in (False, True):
            out = partition_outcome(module, inputs, "cpu-gpu-npu", objective=objective, training=training,
                                    time_limit=30)
            assert out.evaluation.feasible
            if training:
                assert not out.solution.placement.streamed  # code generation streams for inference only


# -- bad input ----------------------------------------------------------------------------------


def test_an_infeasible_cap_names_the_device_the_bytes_and_the_cap() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(InfeasiblePlacement) as info:
        partition(module, inputs, "h200-host", memory={"cpu": "1KB", "cuda:0": "1KB"})
    message = str(info.value)
    assert "needs" in message and "bytes" in message and "1,000" in message


def test_pins_beyond_a_cap_are_explained() -> None:
    module, inputs = models.get("emb-transformer", "tiny")
    with pytest.raises(InfeasiblePlacement, match="device cuda:0 must hold at least .* pinned there.* cap is 4,000"):
        partition(module, inputs, "h200-host", memory={"cuda:0": "4KB"}, pins={"emb": "cuda:0"}, streaming=False)


def test_unknown_devices_and_bad_pins() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(HetpartError, match="no device 'cuda:7'"):
        partition(module, inputs, "h200-host", memory={"cuda:7": "1GB"})
    with pytest.raises(HetpartError, match="pin 'layers.0' -> 'tpu:0': no such device"):
        partition(module, inputs, "h200-host", pins={"layers.0": "tpu:0"})
    with pytest.raises(HetpartError, match="matches no op name or module path"):
        partition(module, inputs, "h200-host", pins={"nothing*": "cpu"})
    emb, emb_inputs = models.get("emb-transformer", "tiny")
    with pytest.raises(UnsupportedOp, match="pinned to npu:0, which cannot run it"):
        partition(emb, emb_inputs, "cpu-gpu-npu", pins={"emb": "npu:0"})


def test_unknown_solver_and_objective() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(SolverUnavailable, match="unknown ILP solver 'gurobi'"):
        partition(module, inputs, "h200-host", solver="gurobi")
    with pytest.raises(HetpartError, match="unknown objective 'speed'"):
        partition(module, inputs, "h200-host", objective="speed")


def test_a_baseline_can_be_the_solver() -> None:
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "h200-host", solver="heft")
    assert plan.solver.name == "heft" and plan.solver.status == "heuristic"


def test_a_cyclic_graph_is_rejected() -> None:
    from partitioner.ir import Op, OpClass, Tensor

    def op(name: str, index: int, reads: str) -> Op:
        return Op(name, "aten.add", OpClass.ELEMENTWISE, index, "", "M", "float32", (reads,), (name,), (), (),
                  1, 4, 4, 0, 0)

    with pytest.raises(GraphError, match="cycle"):
        OpGraph("loop", [op("a", 0, "b"), op("b", 1, "a")],
                [Tensor("a", "a", ("b",), (1,), "float32", 4), Tensor("b", "b", ("a",), (1,), "float32", 4)],
                [], (), ("b",))


def test_makespan_refuses_huge_graphs_when_not_coarsened() -> None:
    from models.synthetic import random_dag

    with pytest.raises(SolverUnavailable, match="coarsen"):
        partition(random_dag(1, 450, layers=45), devices="h200-host", objective="makespan", coarsen=False)
