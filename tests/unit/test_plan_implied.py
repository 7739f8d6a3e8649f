"""A plan's memory and copies are what its placement implies: edited placements are refused everywhere.

From the file alone (``Plan.load``: ``explain``, ``report``) for everything the plan determines; on the
model's graph (``Plan.check_graph``: ``emit``, ``check --strict-devices``, the compile backend's plan
cache) exactly. Pipeline and batch sections with counts their runs cannot use are refused when read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import models
from partitioner import partition
from partitioner.cli import main
from partitioner.errors import PlanMismatch
from partitioner.frontends.fx import from_module
from partitioner.plan import Plan, PlanFormatError

FACTORY = '''
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 16)), (torch.randn(1, 1024),)
'''
CAP = 100_000  # 97.66 KiB: the 4 MiB linear cannot sit there, nor stream through two buffers of it
BIND = {"cuda:0": "cpu", "npu:0": "cpu"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def big() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 16)), (torch.randn(1, 1024),)


@pytest.fixture(scope="module")
def capped_plan(big: tuple[nn.Module, tuple]) -> Plan:
    """The 4 MiB linear on the host, the rest where the solver likes, cuda:0 capped at 97.66 KiB."""
    model, inputs = big
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": CAP}, pins={"linear_1": "cuda:0"},
                     time_limit=10)
    assert plan.placement["linear"] == "cpu" and not plan.weights
    return plan


def _moved(plan: Plan, op: str, device: str) -> dict:
    """The plan's dict with ``op`` moved to ``device`` and nothing else changed."""
    d = json.loads(plan.to_json())
    d["placement"][op] = device
    return d


def test_weights_moved_onto_a_small_device_are_refused_when_read(
        capped_plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(_moved(capped_plan, "linear", "cuda:0")))
    with pytest.raises(PlanFormatError, match=r'memory\["cuda:0"\]\.used: .* bytes, but the placement puts at '
                                              r"least 4,2\d\d,\d\d\d bytes on cuda:0 .*'linear'.*re-plan"):
        Plan.load(path)
    code, out, err = run(capsys, "explain", str(path), "linear")
    assert code == 2 and "fits" not in out and 'memory["cuda:0"].used' in err
    code, out, err = run(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))
    assert code == 2 and 'memory["cuda:0"].used' in err


def test_check_with_strict_devices_refuses_the_edited_plan(
        capped_plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI reads the file first; the same placement edit in a plan without edge bytes and op sizes
    (what the file alone cannot check) is refused by check's graph check instead."""
    (tmp_path / "big.py").write_text(FACTORY)
    spec = f"{tmp_path / 'big.py'}:build"
    d = _moved(capped_plan, "linear", "cuda:0")
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    code, _, err = run(capsys, "check", spec, "--plan", str(path), "--strict-devices", "--repeat", "1")
    assert code == 2 and 'memory["cuda:0"].used' in err
    d["model"]["edges"] = [e[:2] for e in d["model"]["edges"]]
    del d["model"]["op_bytes"]
    path.write_text(json.dumps(d))
    Plan.load(path)  # the file alone no longer says what the ops weigh
    code, _, err = run(capsys, "check", spec, "--plan", str(path), "--strict-devices", "--repeat", "1")
    assert code == 2 and "hetpart: error:" in err
    assert 'memory["cuda:0"].used is' in err and "over its capacity of 100,000" in err and "re-plan" in err


def test_a_moved_op_without_weights_is_refused_by_its_missing_copies() -> None:
    torch.manual_seed(0)
    model, inputs = models.get("mlp", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"linear_1": "cuda:0", "linear_2": "npu:0"}, time_limit=10)
    assert plan.placement["relu"] == "cpu"
    d = _moved(plan, "relu", "npu:0")  # linear (cpu) -> relu now crosses; relu -> linear_1 still does
    for t in d["transfers"]:  # the copy of relu's output made to leave its new device: still one missing
        if t["tensor"] == "relu":
            t["from"] = "npu:0"
    with pytest.raises(PlanFormatError, match=r"transfers: no copy of 'linear''s output cpu -> npu:0.*consumer "
                                              r"'relu' on npu:0 \(2,048 bytes cross\).*re-plan"):
        Plan.from_dict(d, "edited.json")
    graph = from_module(model, inputs)
    old = json.loads(plan.to_json())  # an older plan: edges without bytes; only the graph can tell
    old["model"]["edges"] = [e[:2] for e in old["model"]["edges"]]
    old["placement"]["relu"] = "npu:0"
    for t in old["transfers"]:
        if t["tensor"] == "relu":
            t["from"] = "npu:0"
    edited = Plan.from_dict(old, "old.json")
    with pytest.raises(PlanMismatch, match=r"^old\.json: .*transfers lack the copy of activation 'linear' cpu -> "
                                           r"npu:0 \(2,048 bytes\).*re-plan"):
        edited.check_graph(graph)
    with pytest.raises(PlanMismatch, match="transfers lack the copy"):
        edited.emit(model, BIND)


def test_memory_recorded_below_what_the_placement_needs_is_refused_on_the_graph() -> None:
    torch.manual_seed(0)
    model, inputs = models.get("mlp", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"linear_1": "cuda:0", "linear_2": "npu:0"}, time_limit=10)
    d = json.loads(plan.to_json())
    d["memory"]["npu:0"]["used"] -= 1024  # above what the file alone can tell (18,688), below what it needs
    with pytest.raises(PlanMismatch, match=r'memory\["npu:0"\]\.used is 19,712 bytes, but the placement needs '
                                           r"20,736 bytes on npu:0"):
        Plan.from_dict(d, "edited.json").check_graph(from_module(model, inputs))


def test_the_compile_backend_solves_again_for_an_edited_plan_in_plan_dir(
        big: tuple[nn.Module, tuple], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from backends.compile import HetpartBackend

    model, inputs = big
    options = {"devices": "h200-host", "memory": {"cuda:0": CAP}, "pins": {"2": "cuda:0"},
               "device_map": {"cuda:0": "cpu"}, "plan_dir": str(tmp_path), "time_limit": 10}
    first = HetpartBackend()
    torch._dynamo.reset()
    with torch.no_grad():  # an inference plan: the linear on cuda:0 with its gradient and Adam state would not fit
        torch.testing.assert_close(torch.compile(model, backend=first, options=options)(*inputs), model(*inputs))
    (saved,) = tmp_path.glob("*.json")
    plan = Plan.load(saved)
    heavy = max(plan.op_bytes, key=lambda op: plan.op_bytes[op][1])  # the 4 MiB linear
    assert plan.placement[heavy] == "cpu" and plan.op_bytes[heavy][1] > 4 * 2**20
    saved.write_text(json.dumps(_moved(plan, heavy, "cuda:0")))
    second = HetpartBackend()
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="hetpart"), torch.no_grad():
        out = torch.compile(model, backend=second, options=options)(*inputs)
    torch.testing.assert_close(out, model(*inputs))
    assert [r.plan_from for r in second.records] == ["solved"]
    assert any("ignoring the cached plan" in m and 'memory["cuda:0"].used' in m for m in caplog.messages)
    assert Plan.load(saved).placement[heavy] == "cpu"  # the re-solved plan replaced the edited one
    third = HetpartBackend()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=third, options=options)(*inputs)
    assert [r.plan_from for r in third.records] == ["disk"]  # a plan as made is served from plan_dir


@pytest.mark.parametrize("kwargs", [
    dict(devices="cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"}, coarsen=True),  # streamed
    dict(devices="cpu-gpu-npu", pins={"blocks.0*": "cuda:0", "blocks.1*": "npu:0"}, streaming=False,
         objective="makespan"),
    dict(devices="cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"}, precision="auto"),
    dict(devices="2x-h200-host", objective="throughput", micro_batches=2, training=True),  # pipeline
], ids=["streamed-coarse", "split-makespan", "precision", "pipeline-training"])
def test_plans_as_made_pass_the_graph_check(kwargs: dict) -> None:
    """The checks refuse nothing the planner makes: the same semantics on the graph, coarsened or not."""
    from partitioner.planner import partition_outcome

    torch.manual_seed(0)
    model, inputs = models.get("gpt", "tiny")
    out = partition_outcome(model, inputs, kwargs.pop("devices"), time_limit=10, **kwargs)
    plan = Plan.from_json(out.plan.to_json())
    plan.check_graph(out.problem.original)
    assert plan.edge_bytes and len(plan.edge_bytes) == len(plan.edges)


def test_a_split_onnx_plan_passes_and_an_edited_one_is_refused(tmp_path: Path) -> None:
    """ONNX tensors are named freely (``/layers/layers.1/Relu_output_0``), not after their producer op."""
    from models.onnx_models import export_zoo
    from partitioner.frontends.onnx import from_onnx

    path = export_zoo("mlp", "tiny", tmp_path / "mlp.onnx")
    graph = from_onnx(path)
    ops = list(graph.ops)
    plan = partition(path, devices="cpu-gpu-npu", pins={ops[1]: "cuda:0", ops[-1]: "npu:0"}, time_limit=10)
    assert len(set(plan.placement.values())) > 1 and plan.transfers and plan.capture == "onnx"
    loaded = Plan.from_json(plan.to_json())
    loaded.check_graph(graph)
    heavy = next(op for op in ops if plan.op_bytes[op][1] and plan.placement[op] == "cpu")
    with pytest.raises(PlanFormatError, match=r'memory\["npu:0"\]\.used'):
        Plan.from_dict(_moved(plan, heavy, "npu:0"), "edited.json")


@pytest.fixture(scope="module")
def pipeline_plan() -> Plan:
    torch.manual_seed(0)
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "2x-h200-host", objective="throughput", micro_batches=2, training=True,
                     schedule="1f1b", time_limit=10)
    assert plan.pipeline["world_size"] == 2
    return plan


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(micro_batches=0), r"pipeline\.micro_batches: 0: a pipeline step runs at least one"),
    (lambda p: p.update(micro_batches=1), r"pipeline\.micro_batches: 1, fewer than the 2 stages: 1F1B"),
    (lambda p: p["stages"][0].update(in_flight=0), r"pipeline\.stages\[0\]\.in_flight: 0, but stage 0 of 2 keeps 2"),
    (lambda p: p["stages"][1].update(memory=0), r"pipeline\.stages\[1\]\.memory: 0 bytes, but the memory section"),
    (lambda p: p["stages"][1].update(node_rank=7), r"pipeline\.stages\[1\]: node_rank 7 and local_rank 0"),
], ids=["zero-micro-batches", "fewer-than-stages", "in-flight", "stage-memory", "node-rank"])
def test_pipeline_counts_a_run_cannot_use_are_refused_when_read(pipeline_plan: Plan, edit, message: str) -> None:
    d = json.loads(pipeline_plan.to_json())
    edit(d["pipeline"])
    with pytest.raises(PlanFormatError, match=message):
        Plan.from_dict(d, "edited.json")


def test_a_batch_section_of_zero_accumulation_steps_is_refused_when_read() -> None:
    from partitioner.batching import fit_batch

    torch.manual_seed(0)
    model, inputs = models.get("mlp", "tiny")
    plan = fit_batch(model, inputs, "cpu-gpu-npu", global_batch=8, micro_batch=4, time_limit=10).plan
    d = json.loads(plan.to_json())
    d["batch"].update(global_batch=0, accumulation_steps=0)
    with pytest.raises(PlanFormatError, match=r"batch\.accumulation_steps: 0: a global step accumulates at least"):
        Plan.from_dict(d, "edited.json")
