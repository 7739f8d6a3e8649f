"""The baseline solvers: single device, accelerate's fill (greedy, sequential-fill) and HEFT.

Checks: invariants of every baseline on every zoo model and three profiles; accelerate's measured
device maps (shared/calibration/accelerate-h200.json) reproduced on the emb-transformer scenario;
HEFT on a hand-built DAG with a hand-computed schedule; fallbacks; determinism.
"""

from __future__ import annotations

import functools
import math

import pytest

import models
from cost_models.profiles import DeviceSet, load_profile, load_profile_text
from partitioner import from_module
from partitioner.errors import HetpartError
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor
from partitioner.solvers.greedy import (
    ModuleTree,
    clean_device_map,
    device_map_fill,
    solve_greedy,
    solve_sequential_fill,
)
from partitioner.solvers.heft import heft_schedule, solve_heft, upward_ranks
from partitioner.solvers.problem import (
    Objective,
    Options,
    Problem,
    Solution,
    StreamMode,
    accelerator_devices,
    evaluate,
)
from partitioner.solvers.single import solve_single

PROFILES = ("h200-host", "cpu-gpu-npu", "2xh200-host")
CAP_HALF = 4_496_539_680    # accelerate-h200.json: "emb + half the layers"
CAP_2GIB = 2_147_483_648    # accelerate-h200.json: "below the embedding"
MS = 1e-3


@functools.cache
def tiny_graph(name: str) -> OpGraph:
    module, inputs = models.get(name, "tiny")
    return from_module(module, inputs, name=name)


@functools.cache
def emb_base() -> OpGraph:
    module, inputs = models.get("emb-transformer", "base", device="meta")
    return from_module(module, inputs, name="emb-transformer")


def baselines(problem: Problem, no_split: tuple[str, ...]) -> list[Solution]:
    singles = [solve_single(problem, d) for d in problem.device_names]
    return [solve_greedy(problem, no_split), solve_sequential_fill(problem, no_split), solve_heft(problem), *singles]


def emb_problem(cap: int, objective: Objective = Objective.LATENCY) -> Problem:
    devices = load_profile("h200-host").with_memory({"cuda:0": cap})
    return Problem(emb_base(), devices, Options(objective=objective))


# --------------------------------------------------------------------------------------------
# Every baseline, every zoo model, three profiles
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", models.names())
def test_every_baseline_places_every_node_on_an_allowed_device(name: str, profile: str) -> None:
    problem = Problem(tiny_graph(name), load_profile(profile))
    main_gpu = accelerator_devices(problem.devices)[0]
    for sol in baselines(problem, models.entry(name).no_split_classes):
        placement = sol.placement
        assert set(placement.device) == set(problem.nodes), sol.solver
        for node, device in placement.device.items():
            assert device in problem.allowed[node], (sol.solver, node, device)
        if sol.solver == "greedy":  # streamed nodes run on the main GPU, weights from the host
            assert placement.stream_mode is StreamMode.SYNC
            assert all(placement.device[n] == main_gpu and home == problem.host
                       for n, home in placement.streamed.items())
        else:
            assert not placement.streamed, sol.solver
        ev = evaluate(problem, placement)
        assert math.isfinite(ev.total_s) and ev.total_s > 0, sol.solver
        assert sol.seconds >= 0


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", models.names())
def test_heft_order_is_topological(name: str, profile: str) -> None:
    problem = Problem(tiny_graph(name), load_profile(profile), Options(objective=Objective.MAKESPAN))
    order = solve_heft(problem).placement.order
    assert sorted(order) == sorted(problem.nodes)
    position = {n: i for i, n in enumerate(order)}
    for u, v in problem.graph.dag.edges:
        assert position[u] < position[v], (u, v)


@pytest.mark.parametrize("name", models.names())
def test_uncapped_fill_puts_the_whole_model_on_the_main_gpu(name: str) -> None:
    problem = Problem(tiny_graph(name), load_profile("h200-host"))
    # accelerate's clean_device_map does not fold a root with a single child: {"layers": 0} for mlp
    assert set(device_map_fill(problem, models.entry(name).no_split_classes).values()) == {"cuda:0"}
    assert set(solve_sequential_fill(problem).placement.device.values()) == {"cuda:0"}
    assert not solve_greedy(problem).placement.streamed


def test_without_an_accelerator_everything_runs_on_the_cpu() -> None:
    problem = Problem(tiny_graph("gpt"), load_profile("cpu"))
    for sol in (solve_greedy(problem, ("Block",)), solve_sequential_fill(problem), solve_heft(problem)):
        assert set(sol.placement.device.values()) == {"cpu"}
        assert not sol.placement.streamed


# --------------------------------------------------------------------------------------------
# accelerate's fill, against the measured maps
# --------------------------------------------------------------------------------------------


def test_fill_reproduces_accelerates_map_at_embedding_plus_half_the_layers() -> None:
    got = device_map_fill(emb_problem(CAP_HALF), no_split=("Block",))
    gpu = ["emb", "layers.0", "layers.1", "layers.2"]
    cpu = [f"layers.{i}" for i in range(3, 8)] + ["head"]
    assert got == {**{k: "cuda:0" for k in gpu}, **{k: "cpu" for k in cpu}}
    assert list(got) == gpu + cpu  # registration order


def test_fill_puts_everything_on_the_cpu_below_the_embedding() -> None:
    assert device_map_fill(emb_problem(CAP_2GIB), no_split=("Block",)) == {"": "cpu"}


def test_fill_needs_the_reserve_for_the_largest_layer() -> None:
    # Without the reserve of one block (50,384,896 bytes) on the GPU, layers.3 would fit too.
    emb, block = 4_294_967_296, 50_384_896
    assert emb + 4 * block <= CAP_HALF < emb + 5 * block
    got = device_map_fill(emb_problem(CAP_HALF), no_split=("Block",))
    assert got["layers.3"] == "cpu"


def _spilled(module_path: str) -> bool:
    """Whether an op belongs to layers.3 ... layers.7 or the head (the CPU part of the map)."""
    return f"{module_path}.".startswith(("head.", *(f"layers.{i}." for i in range(3, 8))))


def test_greedy_streams_layers_3_to_7_and_the_head_synchronously() -> None:
    problem = emb_problem(CAP_HALF)
    sol = solve_greedy(problem, ("Block",))
    offloaded = {n for n in problem.nodes if _spilled(problem.graph.ops[n].module_path)}
    with_weights = {n for n in offloaded if problem.param_bytes[n] > 0}
    assert set(sol.placement.device.values()) == {"cuda:0"}
    assert sol.placement.stream_mode is StreamMode.SYNC
    assert set(sol.placement.streamed) == with_weights and len(with_weights) == 5 * 8 + 1
    ev = evaluate(problem, sol.placement)
    weights = [t for t in ev.transfers if t.kind == "weights"]
    assert {t.tensor for t in weights} == with_weights
    assert all((t.src, t.dst) == ("cpu", "cuda:0") for t in weights)
    assert sum(t.bytes for t in weights) == 5 * 50_384_896 + 65_600


def test_sequential_fill_computes_the_spilled_layers_on_the_cpu() -> None:
    problem = emb_problem(CAP_HALF)
    sol = solve_sequential_fill(problem, ("Block",))
    for node in problem.nodes:
        spilled = _spilled(problem.graph.ops[node].module_path)
        assert sol.placement.device[node] == ("cpu" if spilled else "cuda:0"), node
    assert not sol.placement.streamed
    assert not [t for t in evaluate(problem, sol.placement).transfers if t.kind == "weights"]


def test_predicted_order_of_the_scenario_matches_the_measurements() -> None:
    # measured: all-GPU 10.9 ms < accelerate 52.7 ms < computing the spilled layers on the CPU
    # (2874 ms for a sequential fill in h200-host.json); accelerate at 2 GiB: 529 ms.
    half, low = emb_problem(CAP_HALF), emb_problem(CAP_2GIB)
    all_gpu = evaluate(half, solve_single(half, "cuda:0").placement).total_s
    greedy = evaluate(half, solve_greedy(half, ("Block",)).placement).total_s
    fill = evaluate(half, solve_sequential_fill(half, ("Block",)).placement).total_s
    assert all_gpu < greedy < fill
    assert 0.5 * 0.529 < evaluate(low, solve_greedy(low, ("Block",)).placement).total_s < 2 * 0.529


def test_tied_weights_are_counted_once_and_placed_together() -> None:
    graph = tiny_graph("gpt")
    tree = ModuleTree.of(graph)
    assert tree.size("") == graph.total_param_bytes()
    assert tree.size("lm_head") == 0  # its weight is tok_emb.weight, counted under tok_emb
    assert tree.buffers[""] == ("position_ids",)  # root buffers come last, as in accelerate
    cap = tree.size("tok_emb") + tree.size("pos_emb") + 2 * tree.size("blocks.0") - 1
    problem = Problem(graph, load_profile("h200-host").with_memory({"cuda:0": cap}))
    got = device_map_fill(problem, ("Block",))
    assert got["tok_emb"] == got["lm_head"] == "cuda:0"
    assert got["blocks"] == "cpu"


def test_clean_device_map_groups_children_sharing_a_device() -> None:
    raw = {"a.x": "cpu", "a.y": "cpu", "b.0": "cuda:0", "b.1": "cpu"}
    assert clean_device_map(raw) == {"a": "cpu", "b.0": "cuda:0", "b.1": "cpu"}
    assert clean_device_map({"a": "cpu", "b": "cpu"}) == {"": "cpu"}
    assert raw == {"a.x": "cpu", "a.y": "cpu", "b.0": "cuda:0", "b.1": "cpu"}  # not mutated


# --------------------------------------------------------------------------------------------
# HEFT on a hand-built DAG
# --------------------------------------------------------------------------------------------

#: cpu: 1 GFLOP/s; npu:0: 4 GFLOP/s, matmul only; a 1 GB/s link without latency: with the
#: flops and bytes below, every time is a round number of milliseconds.
TWO_DEVICES = """
name = "two"
[devices.cpu]
kind = "cpu"
memory = "1GiB"
peak_flops = 1e9
mem_bandwidth = "1GB/s"
launch_overhead = 0
efficiency = { matmul = 1.0, elementwise = 1.0 }
[devices."npu:0"]
kind = "npu"
memory = "NPU_MEMORY"
peak_flops = 4e9
mem_bandwidth = "1GB/s"
launch_overhead = 0
efficiency = { matmul = 1.0 }
supported_ops = ["matmul"]
[[links]]
between = ["cpu", "npu:0"]
bandwidth = "1GB/s"
latency = 0
"""


def two_devices(npu_memory: str = "1GiB") -> DeviceSet:
    return load_profile_text(TWO_DEVICES.replace("NPU_MEMORY", npu_memory), "two.toml")


def _op(name: str, index: int, inputs: tuple[str, ...], cls: OpClass, mflops: float, param: int = 0) -> Op:
    params = (f"{name}.w",) if param else ()
    return Op(
        name=name, kind="aten.mm.default" if cls is OpClass.MATMUL else "aten.add.Tensor", op_class=cls,
        index=index, module_path=name, module_type="M", dtype="float32", inputs=inputs, outputs=(name,),
        params=params, owned_params=params, flops=int(mflops * 1e6), bytes_read=0, bytes_written=0,
        param_bytes=param, trainable_param_bytes=param,
    )


def chain_with_side_node(p_param: int = 0) -> OpGraph:
    """x -> p (matmul) -> q (elementwise, cpu only) -> r (matmul); s (matmul) reads x alone.

    Times (ms): p cpu 4 / npu 1; q cpu 3; r cpu 4 / npu 1; s cpu 2 / npu 0.5. Every tensor is
    1 MB = 1 ms over the link.
    """
    mb = 1_000_000
    ops = [
        _op("p", 0, ("x",), OpClass.MATMUL, 4, p_param), _op("q", 1, ("p",), OpClass.ELEMENTWISE, 3),
        _op("r", 2, ("q",), OpClass.MATMUL, 4), _op("s", 3, ("x",), OpClass.MATMUL, 2),
    ]
    consumers = {"x": ("p", "s"), "p": ("q",), "q": ("r",), "r": (), "s": ()}
    tensors = [Tensor(t, None if t == "x" else t, c, (mb // 4,), "float32", mb) for t, c in consumers.items()]
    params = [Param("p.w", (p_param // 4,), "float32", p_param, True, "p", ("p",))] if p_param else []
    return OpGraph("chain", ops, tensors, params, ("x",), ("r", "s"))


def test_heft_upward_ranks_by_hand() -> None:
    # r: mean(4, 1) = 2.5; q: 3 + 1 (npu<->cpu, the only pair of distinct devices) + 2.5 = 6.5;
    # p: 2.5 + 1 + 6.5 = 10; s: mean(2, 0.5) = 1.25
    ranks = upward_ranks(Problem(chain_with_side_node(), two_devices()))
    assert {n: round(v / MS, 9) for n, v in ranks.items()} == {"p": 10, "q": 6.5, "r": 2.5, "s": 1.25}


def test_heft_schedule_by_hand_with_an_insertion() -> None:
    # In rank order: p -> npu [1, 2] (x reaches npu at 1; cpu would end at 4); q -> cpu [3, 6]
    # (p arrives at 3); r -> npu [7, 8] (cpu would end at 10). s comes last: the cpu is idle
    # before q, so s goes into that gap, [0, 2], ahead of q scheduled earlier (npu: 2.5; without
    # insertion the cpu could only start it at 6).
    problem = Problem(chain_with_side_node(), two_devices(), Options(objective=Objective.MAKESPAN))
    slots = heft_schedule(problem)
    got = {n: (s.device, round(s.start / MS, 9), round(s.finish / MS, 9)) for n, s in slots.items()}
    assert got == {"p": ("npu:0", 1, 2), "q": ("cpu", 3, 6), "r": ("npu:0", 7, 8), "s": ("cpu", 0, 2)}
    sol = solve_heft(problem)
    assert sol.placement.order == ("s", "p", "q", "r")
    ev = evaluate(problem, sol.placement)
    assert ev.total_s == pytest.approx(8 * MS)
    for node, slot in slots.items():  # evaluate's makespan schedule replays HEFT's
        assert ev.schedule[node] == pytest.approx((slot.start, slot.finish))


def test_heft_skips_a_device_without_room() -> None:
    # npu:0 holds 4 MB: p's 8 MB of weights do not fit, r (2 MB working set) still does.
    problem = Problem(chain_with_side_node(p_param=8_000_000), two_devices("4MB"))
    device = solve_heft(problem).placement.device
    assert device["p"] == "cpu" and device["r"] == "npu:0"
    assert evaluate(problem, solve_heft(problem).placement).feasible


def test_heft_runs_independent_nodes_in_parallel() -> None:
    # two equal independent matmuls on two equal devices: one each.
    devices = load_profile_text(TWO_DEVICES.replace("NPU_MEMORY", "1GiB").replace("4e9", "1e9"), "two.toml")
    ops = [_op("a", 0, ("x",), OpClass.MATMUL, 4), _op("b", 1, ("x",), OpClass.MATMUL, 4)]
    tensors = [Tensor("x", None, ("a", "b"), (1,), "float32", 0),
               Tensor("a", "a", (), (1,), "float32", 4), Tensor("b", "b", (), (1,), "float32", 4)]
    problem = Problem(OpGraph("pair", ops, tensors, [], ("x",), ("a", "b")), devices)
    assert set(solve_heft(problem).placement.device.values()) == {"cpu", "npu:0"}


def test_heft_sends_the_two_heavy_branches_to_different_gpus() -> None:
    # On h200-host the cost model makes the CPU 30-200x slower on every heavy op of two-branch,
    # so both branches rightly stay on the GPU; with two GPUs they run side by side.
    module, inputs = models.get("two-branch", "base", device="meta")
    graph = from_module(module, inputs, name="two-branch")
    problem = Problem(graph, load_profile("2xh200-host"), Options(objective=Objective.MAKESPAN))
    sol = solve_heft(problem)

    def heavy_devices(branch: str) -> set[str]:
        heavy = (OpClass.MATMUL, OpClass.CONV)
        return {sol.placement.device[n] for n in problem.nodes
                if graph.ops[n].module_path.startswith(branch) and graph.ops[n].op_class in heavy}

    a, b = heavy_devices("branch_a."), heavy_devices("branch_b.")
    assert len(a) == len(b) == 1 and a != b and a | b <= {"cuda:0", "cuda:1"}
    one_gpu = evaluate(problem, solve_single(problem, "cuda:0").placement).total_s
    assert evaluate(problem, sol.placement).total_s < 0.9 * one_gpu


# --------------------------------------------------------------------------------------------
# single device, errors, determinism
# --------------------------------------------------------------------------------------------


def test_single_gpu_runs_everything() -> None:
    problem = Problem(tiny_graph("emb-transformer"), load_profile("cpu-gpu-npu"))
    sol = solve_single(problem, "cuda:0")
    assert sol.solver == "single:cuda:0" and set(sol.placement.device.values()) == {"cuda:0"}
    assert sol.note == ""


def test_single_npu_falls_back_to_the_cpu_for_embeddings() -> None:
    graph = tiny_graph("emb-transformer")
    problem = Problem(graph, load_profile("cpu-gpu-npu"))
    sol = solve_single(problem, "npu:0")
    on_cpu = {n for n, d in sol.placement.device.items() if d == "cpu"}
    assert on_cpu and on_cpu == {n for n in problem.nodes if "npu:0" not in problem.allowed[n]}
    assert {graph.ops[n].op_class for n in on_cpu} == {OpClass.GATHER}
    assert "fall back to cpu" in sol.note and "embedding" in sol.note


def test_single_unknown_device_lists_the_devices() -> None:
    problem = Problem(tiny_graph("mlp"), load_profile("h200-host"))
    with pytest.raises(HetpartError, match="cpu, cuda:0"):
        solve_single(problem, "cuda:7")


def test_baselines_are_deterministic() -> None:
    graph = tiny_graph("gpt")
    devices = load_profile("cpu-gpu-npu").with_memory({"cuda:0": 80_000})
    first, second = (baselines(Problem(graph, devices), ("Block",)) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert a.solver == b.solver
        assert dict(a.placement.device) == dict(b.placement.device)
        assert dict(a.placement.streamed) == dict(b.placement.streamed)
        assert a.placement.order == b.placement.order and a.note == b.note
