"""The baselines ONNX users get today: onnxruntime's provider fallback and OpenVINO's pipeline split.

Hand-built chains with chosen weight bytes and output sizes, so every cut can be checked by hand;
then both baselines in the plans and reports of ONNX models.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cost_models.profiles import load_profile, load_profile_text
from models.onnx_models import export_zoo
from partitioner import partition
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor
from partitioner.report import write_report
from partitioner.solvers import ONNX_BASELINE_NAMES, run_baseline
from partitioner.solvers.openvino_pipeline import solve_openvino_pipeline
from partitioner.solvers.ort_fallback import solve_ort_fallback
from partitioner.solvers.problem import Problem, evaluate

NPU_FIRST = """
name = "npu-first"
[devices.cpu]
kind = "cpu"
memory = "64GiB"
peak_flops = { float32 = 1e12 }
mem_bandwidth = "10GB/s"
launch_overhead = "1us"
[devices."npu:0"]
kind = "npu"
memory = "1MB"
peak_flops = { float32 = 1e13 }
mem_bandwidth = "100GB/s"
launch_overhead = "1us"
supported_ops = ["matmul"]
[devices."cuda:0"]
kind = "gpu"
memory = "1GB"
peak_flops = { float32 = 1e13 }
mem_bandwidth = "100GB/s"
launch_overhead = "1us"
supported_ops = ["matmul", "elementwise"]
[[links]]
between = ["cpu", "npu:0"]
bandwidth = "10GB/s"
latency = "1us"
[[links]]
between = ["cpu", "cuda:0"]
bandwidth = "10GB/s"
latency = "1us"
"""


def chain(spec: list[tuple[str, OpClass, int, int]]) -> OpGraph:
    """Ops in a chain from graph input ``x``: (name, class, weight bytes, output elements)."""
    ops, tensors, params, previous = [], [Tensor("x", None, (spec[0][0],), (16,), "float32", 64)], [], "x"
    for k, (name, cls, weight, elements) in enumerate(spec):
        owned = (f"{name}.w",) if weight else ()
        ops.append(Op(name=name, kind="MatMul" if cls is OpClass.MATMUL else "Relu", op_class=cls, index=k,
                      module_path="", module_type="", dtype="float32", inputs=(previous,), outputs=(name,),
                      params=owned, owned_params=owned, flops=1000, bytes_read=0, bytes_written=0,
                      param_bytes=weight, trainable_param_bytes=0))
        if weight:
            params.append(Param(f"{name}.w", (weight // 4,), "float32", weight, False, name, (name,)))
        consumer = (spec[k + 1][0],) if k + 1 < len(spec) else ()
        tensors.append(Tensor(name, name, consumer, (elements,), "float32", 4 * elements))
        previous = name
    return OpGraph("chain", ops, tensors, params, ("x",), (previous,))


M, E = OpClass.MATMUL, OpClass.ELEMENTWISE


def test_ort_fallback_takes_providers_in_order_and_ignores_memory() -> None:
    # npu:0 (listed first) claims the matmuls, cuda:0 the elementwise op the npu refuses, the cpu
    # nothing; the npu's 1 MB cap is not checked while placing, so the evaluation says it does not fit.
    graph = chain([("a", M, 2_000_000, 16), ("b", E, 0, 16), ("c", M, 0, 16)])
    problem = Problem(graph, load_profile_text(NPU_FIRST, "npu-first.toml"))
    sol = solve_ort_fallback(problem)
    assert dict(sol.placement.device) == {"a": "npu:0", "b": "cuda:0", "c": "npu:0"}
    ev = evaluate(problem, sol.placement)
    assert not ev.feasible and "npu:0" in ev.violations[0]
    assert len([t for t in ev.transfers if t.kind == "activation"]) == 3  # x in, and a copy at both boundaries


def test_ort_fallback_sends_what_no_accelerator_runs_to_the_cpu() -> None:
    graph = chain([("a", M, 0, 16), ("b", OpClass.GATHER, 0, 16)])
    sol = solve_ort_fallback(Problem(graph, load_profile("cpu-gpu-npu").with_memory({})))
    assert dict(sol.placement.device) == {"a": "cuda:0", "b": "cuda:0"}  # the GPU runs everything
    sol = solve_ort_fallback(Problem(graph, load_profile_text(NPU_FIRST, "npu-first.toml")))
    assert sol.placement.device["b"] == "cpu" and "fall back to cpu" in sol.note


def test_openvino_pipeline_cuts_by_weight_share_at_the_fewest_crossing_elements() -> None:
    # weights 1000 B each (x1.2 = 1200 per matmul); relus weigh nothing. Total 4800, two GPUs with
    # equal room that holds it all: each gets 2400. The running sum reaches 2400 after b and stays
    # there through the relu r (a window of two positions): r's output has 4 elements, b's 64, so
    # the cut falls after r; cuda:1 takes the rest.
    graph = chain([("a", M, 1000, 64), ("b", M, 1000, 64), ("r", E, 0, 4), ("c", M, 1000, 64), ("d", M, 1000, 64)])
    profile = load_profile("2xh200-host")
    devices = profile.with_memory({"cuda:0": "3GB", "cuda:1": "3GB"})
    sol = solve_openvino_pipeline(Problem(graph, devices))
    assert dict(sol.placement.device) == {"a": "cuda:0", "b": "cuda:0", "r": "cuda:0", "c": "cuda:1", "d": "cuda:1"}
    # room in a 1:3 ratio: cuda:0's share is 1200, reached after a alone
    devices = profile.with_memory({"cuda:0": "1GB", "cuda:1": "3GB"})
    assert solve_openvino_pipeline(Problem(graph, devices)).placement.device["b"] == "cuda:1"


def test_openvino_pipeline_fills_the_gpus_to_their_memory_and_gives_the_cpu_the_rest() -> None:
    # 4800 B (x1.2) against 2500 + 1300 B of room: cuda:0 ends where the sum reaches 2500 within
    # 0.95-1.05x (after b: 2400), cuda:1 at 3800 (none within the window; the last position not
    # above 3990 is after c: 3600), the cpu, unlimited, takes d.
    graph = chain([("a", M, 1000, 100), ("b", M, 1000, 100), ("c", M, 1000, 100), ("d", M, 1000, 100)])
    devices = load_profile("2xh200-host").with_memory({"cuda:0": 2500, "cuda:1": 1300})
    sol = solve_openvino_pipeline(Problem(graph, devices))
    assert dict(sol.placement.device) == {"a": "cuda:0", "b": "cuda:0", "c": "cuda:1", "d": "cpu"}
    # activations are not counted: with b's 800 B working set cuda:0 needs 2800 B, over its 2500
    ev = evaluate(Problem(graph, devices), sol.placement)
    assert "device cuda:0 needs 2,800 bytes" in ev.violations[0]


def test_onnx_plans_and_reports_show_both_baselines(tmp_path: Path) -> None:
    path = export_zoo("mlp", "tiny", tmp_path / "mlp.onnx")
    plan = partition(path, devices="cpu-gpu-npu", memory={"cuda:0": "40KB"}, time_limit=10)
    for name in ONNX_BASELINE_NAMES:
        assert name in plan.baselines and plan.baselines[name].total_s is not None
        assert name in plan.summary()
    assert not plan.baselines["ort-fallback"].feasible  # the GPU takes all 50 KB of weights, over 40 KB
    assert plan.predicted["total_s"] <= min(b.total_s for b in plan.baselines.values() if b.feasible) * (1 + 1e-9)
    html = write_report(plan, tmp_path / "r.html").read_text()
    assert "ort-fallback" in html and "openvino-pipeline" in html
    with pytest.raises(Exception, match="unknown solver 'nope'.*'ort-fallback'"):
        run_baseline("nope", Problem(chain([("a", M, 0, 4)]), load_profile("cpu")))
