"""Precision per device: the accuracy policy, the cost model's 16-bit prices, the ILP's (device,
dtype) choice, the plan's precision section, and bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

import models
from cost_models.costs import ANALYTIC
from cost_models.precision import FLOAT32, PrecisionError, op_precision, parse_dtype, resolve_precision
from cost_models.profiles import load_profile
from partitioner import Plan, from_module, partition, partition_outcome
from partitioner.errors import HetpartError, PlanMismatch, ProfileError
from partitioner.plan import PlanFormatError
from partitioner.solvers.problem import Options, Problem, evaluate


class Wide(nn.Module):
    """Three large matmuls with a layer norm and a softmax between them (the policy's fp32 ops)."""

    def __init__(self, width: int = 2048) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(width, width) for _ in range(3))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(torch.relu(self.a(x)))
        return torch.softmax(self.c(torch.relu(self.b(x))), dim=-1)


@pytest.fixture(scope="module")
def wide():
    with torch.device("meta"):
        module = Wide()
    return module, (torch.empty(2048, 2048, device="meta"),)


def gpu_fast_cpu_not():
    """h200-host with a CPU whose profile lists no bfloat16 rate (so bf16 is not faster there)."""
    profile = load_profile("h200-host")
    cpu = dataclasses.replace(profile.device("cpu"), peak_flops={"float32": 1.5e12})
    return dataclasses.replace(profile, devices=tuple(cpu if d.name == "cpu" else d for d in profile.devices))


# -- the accuracy policy ---------------------------------------------------------------------------


def test_policy_keeps_softmax_norms_reductions_and_losses_in_float32() -> None:
    module, inputs = models.get("gpt", "tiny")
    graph = from_module(module, inputs)
    kinds = {op.kind.split(".")[1]: op_precision(op, graph.tensors, graph.params) for op in graph.ops.values()}
    assert kinds["layer_norm"] == "fixed"
    assert kinds["linear"] == "flexible"
    assert all(v == "fixed" for k, v in kinds.items() if k in ("softmax", "_softmax", "log_softmax", "sum", "mean"))
    loss_graph = from_module(nn.CrossEntropyLoss(), (torch.randn(4, 5), torch.tensor([0, 1, 2, 3])))
    assert {op_precision(op, loss_graph.tensors, loss_graph.params) for op in loss_graph.ops.values()} <= {"fixed",
                                                                                                             "native"}


def test_auto_offers_what_runs_well_and_a_dtypes_limit() -> None:
    p = resolve_precision("auto", load_profile("cpu-gpu-npu"))
    assert p.dtypes["cuda:0"] == (FLOAT32, "bfloat16")  # float16 is no faster there: bfloat16's range wins
    assert p.dtypes["npu:0"] == ("bfloat16",) and not p.can_fp32["npu:0"]
    assert resolve_precision("auto", gpu_fast_cpu_not()).dtypes["cpu"] == (FLOAT32,)
    fixed = resolve_precision({"cuda:0": "bf16"}, load_profile("h200-host"))
    assert fixed.dtypes == {"cuda:0": ("bfloat16",), "cpu": (FLOAT32,)}
    assert resolve_precision("cuda:0=fp16,cpu=fp32", load_profile("h200-host")).setting == {"cuda:0": "float16",
                                                                                            "cpu": "float32"}
    assert resolve_precision(None, load_profile("cpu-gpu-npu")) is None  # as traced: plans before precision


# -- the cost model ---------------------------------------------------------------------------------


def test_a_16_bit_matmul_is_priced_faster_and_a_cast_costs_time(wide) -> None:
    graph = from_module(*wide)
    gpu = load_profile("h200-host").device("cuda:0")
    mm = next(op for op in graph.ops.values() if op.kind.startswith("aten.linear"))
    fp32, bf16 = ANALYTIC.op_time(mm, gpu).seconds, ANALYTIC.op_time_in(mm, gpu, "bfloat16").seconds
    assert bf16 < fp32 / 4  # 790 vs 51 TFLOP/s peak, half the bytes
    # training: forward + backward, and the float32 master weights cast on every call
    train = ANALYTIC.op_time_in(mm, gpu, "bfloat16", training=True).seconds
    low = ANALYTIC.training_op_time(dataclasses.replace(mm, dtype="bfloat16", bytes_read=mm.bytes_read // 2,
                                                        bytes_written=mm.bytes_written // 2), gpu).seconds
    assert train == pytest.approx(low + ANALYTIC.cast_time(mm.trainable_param_bytes, gpu).seconds)
    assert ANALYTIC.cast_time(mm.param_bytes, gpu).seconds > 0


def test_memory_of_16_bit_weights_and_activations_is_half(wide) -> None:
    graph = from_module(*wide)
    profile = load_profile("h200-host")
    p = Problem(graph, profile, Options(precision=resolve_precision("auto", profile)))
    node = next(n for n in p.nodes if graph.ops[n].kind.startswith("aten.linear"))
    assert p.param_mem_at[node]["bfloat16"] * 2 == p.param_mem_at[node][FLOAT32]
    assert p.work_mem_at[node]["bfloat16"] * 2 == p.work_mem_at[node][FLOAT32]
    train = Problem(graph, profile, Options(training=True, precision=resolve_precision("auto", profile)))
    assert train.param_mem_at[node]["bfloat16"] == train.param_mem_at[node][FLOAT32]  # float32 master weights
    assert train.saved_at[node]["bfloat16"] < train.saved_at[node][FLOAT32]


# -- the ILP's choice ------------------------------------------------------------------------------------


def test_auto_picks_bf16_on_the_gpu_and_fp32_on_a_cpu_whose_bf16_is_not_faster(wide) -> None:
    module, inputs = wide
    out = partition_outcome(module, inputs, gpu_fast_cpu_not(), precision="auto", pins={"b": "cpu"}, time_limit=30)
    plan = out.plan
    ops = plan.precision["ops"]
    on_gpu = [op for op, d in plan.placement.items() if d == "cuda:0" and plan.modules[op] in ("a", "c")
              and op.startswith("linear")]
    assert on_gpu and all(ops.get(op) == "bfloat16" for op in on_gpu)
    on_cpu = [op for op, d in plan.placement.items() if d == "cpu"]
    assert on_cpu and not any(op in ops for op in on_cpu)
    assert all(plan.modules[op] != "norm" for op in ops)  # the norm stays float32
    # the solver's objective is the evaluator's, and all-float32 is slower
    assert out.solution.objective == pytest.approx(evaluate(out.problem, out.solution.placement).total_s, rel=1e-6)
    fp32 = partition(module, inputs, gpu_fast_cpu_not(), pins={"b": "cpu"}, time_limit=30)
    assert plan.predicted["total_s"] < fp32.predicted["total_s"]
    assert plan.memory["cuda:0"]["used"] < fp32.memory["cuda:0"]["used"]


def test_an_npu_running_only_low_precision_gets_no_norm_or_softmax(wide) -> None:
    module, inputs = wide
    out = partition_outcome(module, inputs, "cpu-gpu-npu", precision="auto", pins={"a": "npu:0", "b": "npu:0"},
                            time_limit=30)
    plan, problem = out.plan, out.problem
    on_npu = [op for op, d in plan.placement.items() if d == "npu:0"]
    assert on_npu and all(plan.precision["ops"].get(op) in ("bfloat16", "float16") for op in on_npu
                          if problem.op_kind[op] == "flexible")
    assert not any(problem.op_kind[op] == "fixed" for op in on_npu)
    assert all("npu:0" not in problem.allowed[n] for n in problem.nodes if "fixed" in problem.precision_kinds(n))


def test_a_fixed_mapping_computes_flexible_ops_in_that_dtype(wide) -> None:
    module, inputs = wide
    plan = partition(module, inputs, "h200-host", precision={"cuda:0": "bf16", "cpu": "bf16"}, time_limit=30)
    kinds = {op: k for op, k in partition_outcome(module, inputs, "h200-host", precision={"cuda:0": "bf16"},
                                                   time_limit=30).problem.op_kind.items()}
    assert {op for op, k in kinds.items() if k == "flexible"} == set(plan.precision["ops"])
    assert set(plan.precision["ops"].values()) == {"bfloat16"}
    assert plan.precision["setting"] == {"cuda:0": "bfloat16", "cpu": "bfloat16"}


# -- the plan's section -------------------------------------------------------------------------------


def test_the_precision_section_round_trips_and_shows_in_the_summary(wide) -> None:
    module, inputs = wide
    plan = partition(module, inputs, gpu_fast_cpu_not(), precision="auto", time_limit=30)
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.precision["ops"] == plan.precision["ops"]
    assert "precision  auto:" in plan.summary()
    assert plan.predicted["per_op_s"]  # per-op times in each op's dtype


def test_a_forged_dtype_in_a_plan_file_is_refused(wide) -> None:
    module, inputs = wide
    d = json.loads(partition(module, inputs, gpu_fast_cpu_not(), precision="auto", time_limit=30).to_json())
    op = next(iter(d["precision"]["ops"]))
    d["precision"]["ops"][op] = "float8"
    with pytest.raises(PlanFormatError, match=r"precision.ops\[.*'float8' is not a dtype"):
        Plan.from_dict(d)
    d["precision"]["ops"][op] = "bfloat16"
    d["precision"]["setting"] = {"tpu:0": "bfloat16"}
    with pytest.raises(PlanFormatError, match="'tpu:0' is not a device of the plan"):
        Plan.from_dict(d)


def test_a_plan_op_in_a_dtype_its_device_cannot_run_is_refused(wide) -> None:
    module, inputs = wide
    d = json.loads(partition(module, inputs, "cpu-gpu-npu", precision="auto", pins={"a": "npu:0"},
                             time_limit=30).to_json())
    d["devices"]["devices"]["npu:0"]["dtypes"] = ["float16"]
    op = next(op for op, dev in d["placement"].items() if dev == "npu:0" and op in d["precision"]["ops"])
    d["precision"]["ops"][op] = "bfloat16"
    with pytest.raises(PlanFormatError, match="whose profile runs only float16"):
        Plan.from_dict(d)


# -- bad input ------------------------------------------------------------------------------------------


def test_an_unknown_dtype_is_refused_naming_it_and_the_choices(wide) -> None:
    with pytest.raises(PrecisionError, match=r"precision\['cuda:0'\]: 'int4' is not a dtype .* bf16"):
        partition(*wide, "h200-host", precision={"cuda:0": "int4"})
    with pytest.raises(PrecisionError, match="'fp64' is not a dtype"):
        parse_dtype("fp64")


def test_an_unknown_device_is_refused_naming_the_profiles_devices(wide) -> None:
    with pytest.raises(PrecisionError, match=r"'cuda:1' is not a device of profile 'h200-host'; its devices are"):
        partition(*wide, "h200-host", precision={"cuda:1": "bf16"})


def test_a_device_that_cannot_run_the_dtype_is_refused_with_the_fix(wide) -> None:
    with pytest.raises(PrecisionError, match=r"npu:0 cannot compute in float32 .*bfloat16, float16.*choose one"):
        partition(*wide, "cpu-gpu-npu", precision={"npu:0": "fp32"})


def test_a_precision_that_is_neither_auto_nor_a_mapping_is_refused(wide) -> None:
    with pytest.raises(PrecisionError, match="write DEVICE=DTYPE"):
        partition(*wide, "h200-host", precision="bf16")
    with pytest.raises(PrecisionError, match='give "auto" or a mapping'):
        partition(*wide, "h200-host", precision=16)


def test_precision_with_makespan_or_pipeline_stages_is_refused(wide) -> None:
    with pytest.raises(PrecisionError, match="latency and throughput"):
        partition(*wide, "h200-host", precision="auto", objective="makespan")


def test_a_profile_dtypes_field_is_checked() -> None:
    d = load_profile("cpu-gpu-npu").to_dict()
    d["devices"]["npu:0"]["dtypes"] = ["bf17"]
    from cost_models.profiles import DeviceSet

    with pytest.raises(ProfileError, match="'bf17' is not a dtype"):
        DeviceSet.from_dict(d)
    assert DeviceSet.from_dict(load_profile("cpu-gpu-npu").to_dict()).device("npu:0").dtypes == ("bfloat16",
                                                                                                  "float16")


def test_backends_that_run_ops_as_traced_refuse_a_precision_plan(wide, tmp_path) -> None:
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "h200-host", precision={"cuda:0": "bf16", "cpu": "bf16"}, time_limit=30)
    assert plan.precision["ops"]
    with pytest.raises(HetpartError, match="emit_source .* runs every op as traced: run it with plan.emit"):
        plan.emit_source(tmp_path / "placed.py", module, {"cuda:0": "cpu"})
    from partitioner.plan.precision import refuse_precision

    for backend in ("the onnxruntime backend (emit_onnx)", "the pipeline backend"):
        with pytest.raises(HetpartError, match="computes .* ops in 16 bits"):
            refuse_precision(plan, backend)


def test_cli_precision_flag(tmp_path, capsys) -> None:
    from partitioner.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "mlp:tiny", "--precision", "cuda:0=bf16,cpu=bf16", "-o", str(out), "--time-limit", "20"]) == 0
    assert Plan.load(out).precision["setting"] == {"cuda:0": "bfloat16", "cpu": "bfloat16"}
    assert main(["plan", "mlp:tiny", "--precision", "cuda:0=bf16,cuda:7=fp16"]) != 0
    assert "'cuda:7' is not a device" in capsys.readouterr().err


def test_a_float32_tensor_of_a_coarse_group_computing_in_16_bits_is_cast_by_its_16_bit_reader(caplog) -> None:
    """A coarse group holding a 16-bit matmul and an op the policy keeps in float32 (a norm, a
    softmax) emits the latter's output in float32: a 16-bit reader casts it, in the ILP as in
    ``evaluate``. (The ILP once took it to be held in the group's dtype, underpricing the cast: its
    objective fell below the evaluation of its own placement, and its bound with it.)"""
    module, inputs = models.get("moe", "tiny", device="meta")
    names = [op.name for op in from_module(module, inputs)]
    pins = {n: ("cuda:0", "npu:0", "cpu")[i % 3] for i, n in enumerate(names) if i % 4 == 0}
    with caplog.at_level("WARNING", logger="partitioner.solvers.ilp"):
        out = partition_outcome(module, inputs, "cpu-gpu-npu", precision="auto", pins=pins, time_limit=20)
    assert not [r for r in caplog.records if "differs from the evaluation" in r.getMessage()]
    assert out.plan.precision["ops"] and out.plan.solver.bound <= out.plan.predicted["total_s"] * (1 + 1e-9)


def _split_bf16_plan():  # noqa: ANN202 - (plan, module, inputs): mlp:tiny over three devices, 16-bit copies
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "cpu-gpu-npu", pins={"linear_1": "cuda:0", "linear_2": "npu:0"},
                     precision={"cuda:0": "bf16", "npu:0": "bf16", "cpu": "fp32"}, time_limit=10)
    return plan, module, inputs


def test_a_plan_whose_precision_section_was_cut_is_refused_by_its_16_bit_copies() -> None:
    plan, _, _ = _split_bf16_plan()
    halved = [t for t in plan.transfers if t.tensor in plan.precision["ops"]]
    assert halved and all(t.bytes * 2 == plan.op_bytes[t.tensor][0] for t in halved)
    whole = json.loads(plan.to_json())
    del whole["precision"]
    with pytest.raises(PlanFormatError, match=r"transfers\[\d\].*a 16-bit share.*precision.ops does not list"):
        Plan.from_json(json.dumps(whole))
    one = json.loads(plan.to_json())
    del one["precision"]["ops"][halved[0].tensor]
    with pytest.raises(PlanFormatError, match=f"does not list '{halved[0].tensor}'"):
        Plan.from_json(json.dumps(one))


def test_an_op_cut_from_a_fixed_settings_section_is_refused_against_the_graph() -> None:
    """An op whose output never leaves its device: only the setting and the graph can tell."""
    plan, module, inputs = _split_bf16_plan()
    crossing = {t.tensor for t in plan.transfers}
    quiet = next(op for op in plan.precision["ops"] if op not in crossing)
    edited = json.loads(plan.to_json())
    del edited["precision"]["ops"][quiet]
    # its weights in float32 take more memory, which the file alone checks: the edit keeps that consistent
    edited["memory"][plan.placement[quiet]]["used"] += plan.op_bytes[quiet][1]
    damaged = Plan.from_json(json.dumps(edited))  # the file alone reads
    with pytest.raises(PlanMismatch, match=rf"precision.ops\['{quiet}'\]: float32 where the setting .*bfloat16"):
        damaged.emit(module, {"cuda:0": "cpu", "npu:0": "cpu"})
    plan.check_graph(from_module(module, inputs))  # the plan as made passes
