"""Time splits (``partitioner/solvers/chunked_streaming.py``): chunks, the pipelined price counted by
hand, evaluate and the ILP agreeing, the plan section read back and checked, and refusals."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from partitioner import Plan, from_module, load_profile, partition
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.chunked_streaming import SLOTS, TimeSplit, chunk_sizes, pipeline_s
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, StreamMode, evaluate
from partitioner.solvers.splits import SplitOptions, resolve_splits
from tests.property.oracle import optimum

CAP = 24 << 20  # cuda:0: the 16 MiB linear does not fit resident (24.5 MiB) nor streamed whole (32 MiB)


class NormHead(torch.nn.Module):
    """A norm and a 512 x 8192 linear (16 MiB of float32 weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(512)
        self.head = torch.nn.Linear(512, 8192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x)).relu()


def norm_head() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return NormHead().eval(), (torch.randn(256, 512),)


def one_big_linear(objective: Objective = Objective.LATENCY, chunks: tuple[int, ...] = (4, 8),
                   cap: int = CAP) -> Problem:
    module, inputs = norm_head()
    profile = load_profile("h200-host").with_memory({"cuda:0": cap})
    return Problem(from_module(module, inputs), profile,
                   Options(objective=objective, splits=SplitOptions(axes=("time",), chunks=chunks)))


def test_chunk_sizes_are_near_equal_and_refuse_too_many() -> None:
    assert chunk_sizes(8192, 8) == (1024,) * 8
    assert chunk_sizes(10, 4) == (3, 3, 2, 2)
    with pytest.raises(HetpartError, match="cannot be streamed in 11 chunks"):
        chunk_sizes(10, 11)


def test_pipeline_is_the_flow_shop_time() -> None:
    # copy-bound: first copy, then n-1 more copies, then the last compute
    assert pipeline_s([2.0] * 4, [1.0] * 4) == pytest.approx(2 + 1 + 3 * 2)
    # compute-bound: first copy, then every compute
    assert pipeline_s([1.0] * 4, [3.0] * 4) == pytest.approx(1 + 4 * 3)
    # one buffer: each copy waits for the previous compute
    assert pipeline_s([1.0] * 3, [1.0] * 3, slots=1) == pytest.approx(6.0)
    # uneven chunks, by hand: C = 3, 4, 5; K = 4, 6, 8
    assert pipeline_s([3.0, 1.0, 1.0], [1.0, 2.0, 2.0]) == pytest.approx(8.0)


def test_price_counted_by_hand() -> None:
    p = one_big_linear()
    (node,) = [n for n in p.split_choices]
    sp = TimeSplit("time", ("cuda:0", "cpu"), 8)
    price = p.split_price[(node, sp)]
    op = p.original.ops[node]
    weight = 8192 * 512 * 4
    x, y = 256 * 512 * 4, 256 * 8192 * 4
    assert price.param_bytes == (8192 * 4, weight)  # the bias on the GPU, the weight on the host
    assert price.work_bytes == (x + 2 * y + SLOTS * weight // 8, 0)
    copy_s = p.stream_s(weight // 8, "cpu", "cuda:0", StreamMode.PREFETCH)
    assert [c[:3] for c in price.copies] == [("cpu", "cuda:0", weight // 8)] * 8
    chunk = p.costs.op_time(type(op)(**{**op.__dict__, "flops": op.flops // 8, "param_bytes": weight // 8 + 4096,
                                        "bytes_read": x + weight // 8 + 4096, "bytes_written": y // 8}),
                            p.devices.device("cuda:0")).seconds
    assert price.latency_s == pytest.approx(copy_s + chunk + 7 * max(copy_s, chunk))
    assert price.shard_s == (price.latency_s, 0.0)


@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_evaluate_ilp_and_brute_force_agree(objective: Objective) -> None:
    p = one_big_linear(objective)
    best, _ = optimum(p)
    sol = solve_ilp(p, gap=0.0)
    ev = evaluate(p, sol.placement)
    assert ev.feasible and sol.objective == pytest.approx(ev.total_s) and ev.total_s == pytest.approx(best)
    (node, sp), = sol.placement.split.items()
    assert sp.axis == "time" and sol.placement.device[node] == "cuda:0"
    price = p.split_price[(node, sp)]
    assert ev.memory["cpu"] >= price.param_bytes[1] and ev.memory["cuda:0"] <= CAP
    assert sum(t.bytes for t in ev.transfers if t.kind == "split") == 8192 * 512 * 4
    link = sum(p.hop_s(b, s, d, "cpu<->cuda:0") for s, d, b, _ in price.copies)
    assert ev.per_link_s["cpu<->cuda:0"] >= link
    assert physical_lower_bound(p) <= best * (1 + 1e-9) and memory_aware_lower_bound(p) <= best * (1 + 1e-9)
    whole = Problem(p.original, p.devices, Options(objective=objective))
    assert solve_ilp(whole, gap=0.0).placement.device[node] == "cpu"  # without time splits: on the CPU
    assert ev.total_s < evaluate(whole, solve_ilp(whole, gap=0.0).placement).total_s


def test_a_time_split_away_from_its_home_or_not_offered_is_a_violation() -> None:
    p = one_big_linear(chunks=(8,))
    node = next(iter(p.split_choices))
    device = {n: "cuda:0" for n in p.nodes}
    bad = TimeSplit("time", ("cuda:0", "cpu"), 4)
    assert "which it cannot take; it can take: time[cuda:0<-cpu,8]" in evaluate(
        p, Placement(device, split={node: bad})).violations[0]
    ok = p.split_choices[node][0]
    away = evaluate(p, Placement({**device, node: "cpu"}, split={node: ok}))
    assert "a split op's device is its home, cuda:0" in away.violations[0]


def test_options_and_refusals() -> None:
    assert resolve_splits("time:8/16").chunks == (8, 16) and resolve_splits("time:8/16").axes == ("time",)
    assert resolve_splits("cols,time").axes == ("cols", "time")
    with pytest.raises(HetpartError, match=r"chunk counts, whole numbers separated by '/'"):
        resolve_splits("time:0.5")
    with pytest.raises(HetpartError, match=r"split chunks \[1\]: each is a whole number"):
        SplitOptions(axes=("time",), chunks=(1,))
    module, inputs = norm_head()
    graph = from_module(module, inputs)
    with pytest.raises(HetpartError, match=r"streaming=False \(--no-streaming\); allow streaming"):
        Problem(graph, load_profile("h200-host"), Options(streaming=False, splits=SplitOptions(axes=("time",))))
    with pytest.raises(HetpartError, match=r"training=True"):
        Problem(graph, load_profile("h200-host"), Options(training=True, splits=SplitOptions(axes=("time",))))
    cols_only = Problem(graph, load_profile("h200-host"), Options(splits=SplitOptions()))
    assert all(sp.axis != "time" for c in cols_only.split_choices.values() for sp in c)  # time is opted in


def _plan() -> tuple[Plan, torch.nn.Module, tuple]:
    module, inputs = norm_head()
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": CAP}, splits="time:4/8")
    return plan, module, inputs


def test_plan_records_and_reads_back_the_time_split(tmp_path) -> None:  # noqa: ANN001
    plan, module, inputs = _plan()
    (op, entry), = plan.splits.items()
    assert dict(entry) == {"axis": "time", "devices": ["cuda:0", "cpu"], "chunks": 8,
                           "bytes": [8192 * 4, 8192 * 512 * 4]}
    assert "time: 8 chunks cpu->cuda:0" in plan.summary()
    path = tmp_path / "plan.json"
    plan.save(path)
    assert dict(Plan.load(path).splits[op]) == dict(entry)
    plan.check_graph(from_module(module, inputs))

    def edited(**change: object) -> str:
        data = json.loads(path.read_text())
        data["splits"][op].update(change)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(data))
        return str(bad)

    with pytest.raises(HetpartError, match=r"1 chunks; an op can take time splits of 2 or more chunks"):
        Plan.load(edited(chunks=1))
    with pytest.raises(HetpartError, match=r"are not an accelerator of the plan and then its host 'cpu'"):
        Plan.load(edited(devices=["cpu", "cuda:0"]))
    with pytest.raises(HetpartError, match=r"do not add up to the op's"):
        Plan.load(edited(bytes=[1, 2]))
    with pytest.raises(HetpartError, match=r"chunks"):
        Plan.load(edited(chunks="many"))
    big = copy.deepcopy(json.loads(path.read_text()))
    big["splits"][op]["chunks"] = 9000
    too_many = tmp_path / "many.json"
    too_many.write_text(json.dumps(big))
    with pytest.raises(PlanMismatch, match=r"8192 rows, fewer than 9000 chunks; it can take time splits of 2 to 8192"):
        Plan.load(too_many).check_graph(from_module(module, inputs))


def test_cli_split_time_is_recorded_and_a_bad_count_is_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from partitioner.cli import main

    path = tmp_path / "time.json"
    assert main(["plan", "gpt:small", "--split", "time:8/16", "--memory", "cuda:0=6MB", "-o", str(path)]) == 0
    assert json.loads(path.read_text())["request"]["splits"] == "time:8/16"
    capsys.readouterr()
    assert main(["plan", "gpt:small", "--split", "time:eight", "-o", str(tmp_path / "bad.json")]) != 0
    assert "time splits take chunk counts, whole numbers separated by '/', e.g. time:8/16" in capsys.readouterr().err


def test_a_time_split_op_that_also_streams_whole_is_a_violation() -> None:
    p = one_big_linear(chunks=(8,))
    node = next(iter(p.split_choices))
    sp = p.split_choices[node][0]
    ev = evaluate(p, Placement({n: "cuda:0" for n in p.nodes}, streamed={node: "cpu"}, split={node: sp}))
    assert f"op {node} is split {sp.label} and streams its weights: a time split streams them in chunks, not also " \
           f"whole" in ev.violations


def test_a_pinned_linear_keeps_its_pin_as_its_time_splits_home() -> None:
    module, inputs = norm_head()
    graph = from_module(module, inputs)
    profile = load_profile("h200-host").with_memory({"cuda:0": CAP})
    options = Options(splits=SplitOptions(axes=("time",), chunks=(8,)))
    on_gpu = Problem(graph, profile, options, pins={"linear": "cuda:0"})
    assert [sp.label for sp in on_gpu.split_choices["linear"]] == ["time[cuda:0<-cpu,8]"]
    sol = solve_ilp(on_gpu, gap=0.0)  # whole on the pinned GPU it does not fit: the time split does
    assert sol.placement.split["linear"].label == "time[cuda:0<-cpu,8]" and evaluate(on_gpu, sol.placement).feasible
    assert Problem(graph, profile, options, pins={"linear": "cpu"}).split_choices == {}


def test_tensor_parallel_ranks_refuse_a_time_split_by_name() -> None:
    from backends.tensor_parallel import mesh_devices

    plan, _, _ = _plan()
    op = next(iter(plan.splits))
    with pytest.raises(PlanMismatch, match=rf"splits op '{op}' in time .*run the plan in one process \(plan.emit\), "
                                           r"or re-plan without time splits \(--split cols,rows\)"):
        mesh_devices(plan)
