"""Plan files: round trip, file layout, validation messages, atomic save, device map, fingerprint."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import partitioner.plan.record as plan_module
from partitioner import from_module, load_profile
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.ir import OpGraph
from partitioner.plan import BaselineInfo, Plan, PlanFormatError, SolverInfo, TransferInfo

DEVICES = load_profile("h200-host")   # devices cpu and cuda:0

#: op -> module path; every op but "relu_0" owns parameters
MODULES = {
    "embedding": "emb",
    "q_proj": "layers.0.attn.q_proj",
    "ff1_0_mm": "layers.0.mlp.ff1",
    "ff1_0_bias": "layers.0.mlp.ff1",
    "relu_0": "layers.0.mlp.act",
    "ff1_1": "layers.1.mlp.ff1",
    "head": "head",
}
PARAM_OPS = tuple(op for op in MODULES if op != "relu_0")

TOP_LEVEL = ["format_version", "model", "devices", "objective", "training", "optimizer", "placement",
             "weights", "stream_mode", "schedule", "transfers", "memory", "predicted", "solver",
             "baselines"]


def make_plan(placement: dict[str, str] | None = None, *, weights: dict[str, str] | None = None,
              modules: dict[str, str] = MODULES, param_ops: tuple[str, ...] = PARAM_OPS,
              **changes: Any) -> Plan:
    """A hand-made plan: ``placement`` defaults to everything on cuda:0."""
    placement = placement or {op: "cuda:0" for op in modules}
    fields: dict[str, Any] = dict(
        model_name="tiny-lm", fingerprint="0123456789abcdef", op_count=len(placement),
        modules=modules, param_ops=param_ops, devices=DEVICES, objective="latency", training=False,
        optimizer="adam", placement=placement, weights=weights or {}, stream_mode="prefetch",
        schedule=tuple(placement),
        transfers=(TransferInfo("input", "cpu", "cuda:0", 4096, 1.8e-5),
                   TransferInfo("head", "cuda:0", "cpu", 512, 1.7e-5)),
        memory={"cpu": {"used": 0, "capacity": DEVICES.device("cpu").memory},
                "cuda:0": {"used": 123_456, "capacity": DEVICES.device("cuda:0").memory}},
        predicted={"total_s": 1.5e-4, "per_device_s": {"cpu": 0.0, "cuda:0": 1.2e-4},
                   "per_link_s": {"cpu<->cuda:0": 3.5e-5}, "lower_bound_s": 1.4e-4,
                   "per_op_s": {op: 1e-5 for op in placement}},
        solver=SolverInfo("ilp", "optimal", 1.5e-4, 1.4e-4, 0.0667, 0.25),
        baselines={"all-gpu": BaselineInfo(1.5e-4, True), "all-cpu": BaselineInfo(9e-3, True, "slow")},
    )
    fields.update(changes)
    return Plan(**fields)


def split_placement() -> dict[str, str]:
    """emb on cpu, layer 0 on cuda:0 (its parameter-less relu on cpu), layer 1 on cpu, head on cuda:0."""
    return {"embedding": "cpu", "q_proj": "cuda:0", "ff1_0_mm": "cuda:0", "ff1_0_bias": "cuda:0",
            "relu_0": "cpu", "ff1_1": "cpu", "head": "cuda:0"}


# --------------------------------------------------------------------------------------------
# Round trip and layout
# --------------------------------------------------------------------------------------------


def test_save_load_round_trip_gives_an_equal_plan(tmp_path: Path) -> None:
    plan = make_plan(split_placement(), weights={"head": "cpu"}, stream_mode="sync", training=False)
    path = plan.save(tmp_path / "plan.json")
    loaded = Plan.load(path)
    assert loaded == plan
    assert loaded.source == str(path)
    assert loaded.devices == DEVICES and loaded.solver.gap == pytest.approx(0.0667)
    assert loaded.transfers[0] == TransferInfo("input", "cpu", "cuda:0", 4096, 1.8e-5, "activation")
    assert Plan.from_dict(plan.to_dict()) == plan
    assert loaded.to_json() == plan.to_json()   # the same plan gives the same bytes


def test_file_has_exactly_the_documented_keys_in_order(tmp_path: Path) -> None:
    make_plan().save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    assert list(data) == TOP_LEVEL
    assert data["format_version"] == 1
    assert list(data["model"]) == ["name", "fingerprint", "op_count", "modules", "param_ops", "capture", "inputs", "edges", "param_names", "op_bytes"]
    assert list(data["solver"]) == ["name", "status", "objective", "bound", "gap", "seconds"]
    assert data["transfers"][0] == {"tensor": "input", "from": "cpu", "to": "cuda:0", "bytes": 4096,
                                    "seconds": 1.8e-5, "kind": "activation"}
    assert data["baselines"]["all-cpu"] == {"total_s": 9e-3, "feasible": True, "note": "slow"}
    assert data["memory"]["cuda:0"] == {"used": 123_456, "capacity": DEVICES.device("cuda:0").memory}
    assert data["devices"] == json.loads(json.dumps(DEVICES.to_dict()))


def test_non_finite_numbers_are_written_as_null_and_read_back_as_none(tmp_path: Path) -> None:
    inf, nan = float("inf"), float("nan")
    plan = make_plan(
        predicted={"total_s": inf, "per_device_s": {"cpu": nan, "cuda:0": 1e-4}, "per_link_s": {}},
        solver=SolverInfo("ilp", "feasible", 1e-4, -inf, nan, 3.0),
        baselines={"all-gpu": BaselineInfo(inf, False, "cuda:0 over capacity")},
    )
    text = plan.save(tmp_path / "plan.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    data = json.loads(text)
    assert data["predicted"]["total_s"] is None and data["predicted"]["per_device_s"]["cpu"] is None
    assert data["solver"]["bound"] is None and data["solver"]["gap"] is None
    assert data["baselines"]["all-gpu"]["total_s"] is None
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded.predicted["total_s"] is None and loaded.predicted["per_device_s"]["cpu"] is None
    assert loaded.predicted["per_device_s"]["cuda:0"] == 1e-4
    assert (loaded.solver.bound, loaded.solver.gap, loaded.baselines["all-gpu"].total_s) == (None, None, None)
    assert loaded == plan


def test_a_number_that_must_be_known_cannot_be_infinite() -> None:
    with pytest.raises(PlanFormatError, match=r"transfers\[1\]\.seconds: expected a non-negative number, got "):
        make_plan(transfers=(TransferInfo("x", "cpu", "cuda:0", 8, 1e-5), TransferInfo("y", "cpu", "cuda:0", 8, math.inf)))


# --------------------------------------------------------------------------------------------
# Validation: each kind of bad file is rejected with the file and the field named
# --------------------------------------------------------------------------------------------


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def test_another_format_version_names_both_versions(tmp_path: Path) -> None:
    data = make_plan().to_dict()
    data["format_version"] = 2
    data["renamed_in_v2"] = {}      # the version is reported before the keys it does not know
    with pytest.raises(PlanFormatError) as err:
        Plan.load(write(tmp_path, data))
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'plan.json'}: format_version: ")
    assert "format_version 2 plan" in message and "reads format_version 1" in message
    assert "upgrade hetpart" in message and "hetpart plan" in message
    data["format_version"] = 0
    with pytest.raises(PlanFormatError, match="format_version 0 plan.*reads format_version 1"):
        Plan.load(write(tmp_path, data))


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value
    return mutate


def _delete(*path: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        for key in path[:-1]:
            d = d[key]
        del d[path[-1]]
    return mutate


BAD_FIELDS = {
    "gap not a number": (_set(("solver", "gap"), "abc"), 'solver.gap: expected a number or null, got "abc"'),
    "device not in devices": (_set(("placement", "q_proj"), "cuda:7"),
                              "placement[\"q_proj\"]: device 'cuda:7' is not in the plan's devices (cpu, cuda:0)"),
    "missing top-level key": (_delete("schedule"), "schedule: missing"),
    "missing nested key": (_delete("solver", "bound"), "solver.bound: missing"),
    "unknown top-level key": (_set(("placment",), {}), 'unknown top-level key "placment" (did you mean "placement"?)'),
    "unknown nested key": (_set(("solver", "time"), 1.0), 'solver: unknown key "time"'),
    "transfer to an unknown device": (_set(("transfers", 0, "to"), "npu:0"),
                                      "transfers[0].to: device 'npu:0' is not in the plan's devices"),
    "transfer bytes not an integer": (_set(("transfers", 1, "bytes"), 1.5),
                                      "transfers[1].bytes: expected a non-negative integer, got 1.5"),
    "op_count disagrees": (_set(("model", "op_count"), 99), "model.op_count: 99, but placement places 7 ops"),
    "training not a bool": (_set(("training",), "yes"), 'training: expected true or false, got "yes"'),
    "objective unknown": (_set(("objective",), "speed"), 'objective: "speed" is not one of latency, throughput, makespan'),
    "scheduled op not placed": (_set(("schedule", 2), "nope"), "schedule[2]: op 'nope' is not an op of the plan"),
    "op scheduled twice": (_set(("schedule", 1), "embedding"), "schedule[1]: 'embedding' appears twice"),
    "streamed op not placed": (_set(("weights", "nope"), "cpu"), "weights[\"nope\"]: op 'nope' is not an op of the plan"),
    "module of an unknown op": (_set(("model", "modules", "nope"), "x"), "model.modules[\"nope\"]: op 'nope'"),
    "param op without a module": (_set(("model", "param_ops"), ["relu_0", "ghost"]), "model.param_ops[1]: op 'ghost'"),
    "memory not an integer": (_set(("memory", "cpu", "used"), "1GB"), 'memory["cpu"].used: expected a non-negative integer, got "1GB"'),
    "predicted time of an unknown device": (_set(("predicted", "per_device_s", "tpu"), 1.0),
                                            "predicted.per_device_s[\"tpu\"]: device 'tpu' is not in the plan's devices"),
    "placement not an object": (_set(("placement",), ["cpu"]), 'placement: expected an object, got ["cpu"]'),
    "bad device profile": (_set(("devices", "devices", "cpu", "memory"), "lots"), "devices.cpu.memory"),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_a_bad_field_is_rejected_with_its_path(tmp_path: Path, case: str) -> None:
    mutate, expected = BAD_FIELDS[case]
    data = make_plan().to_dict()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(PlanFormatError) as err:
        Plan.load(path)
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)


def test_a_plan_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(PlanFormatError, match=r"^p\.json: the file: expected an object, got \[1, 2\]"):
        Plan.from_json("[1, 2]", "p.json")


def test_a_truncated_file_is_called_truncated(tmp_path: Path) -> None:
    text = make_plan().to_json()
    path = tmp_path / "plan.json"
    number = re.search(r"\d\.\d", text).start() + 2              # right after a decimal point: "0."
    literal = re.search(r"\b(null|true|false)\b", text).start() + 3  # inside a literal: "nul"
    for cut in (len(text) // 2, text.index('"q_proj"') + 3, number, literal):  # between values; in a string
        path.write_text(text[:cut])
        with pytest.raises(PlanFormatError, match=r"^.*plan\.json: line \d+: .*truncated"):
            Plan.load(path)
    path.write_text("")
    with pytest.raises(PlanFormatError, match="empty"):
        Plan.load(path)


def test_a_json_syntax_error_names_the_line(tmp_path: Path) -> None:
    lines = make_plan().to_json().splitlines()
    broken = next(i for i, line in enumerate(lines) if line.startswith(' "objective"'))
    lines[broken] = lines[broken].replace('"objective":', '"objective";')
    path = tmp_path / "plan.json"
    path.write_text("\n".join(lines))
    with pytest.raises(PlanFormatError, match=rf"plan\.json: line {broken + 1}, column \d+: JSON syntax error"):
        Plan.load(path)


def test_nan_tokens_and_duplicate_keys_are_rejected() -> None:
    text = make_plan().to_json()
    with pytest.raises(PlanFormatError, match="NaN is not allowed"):
        Plan.from_json(text.replace('"total_s": 0.00015', '"total_s": NaN', 1), "p.json")
    with pytest.raises(PlanFormatError, match='the key "training" appears twice'):
        Plan.from_json(text.replace('"training": false', '"training": false, "training": true'), "p.json")


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(HetpartError, match="no such plan file.*hetpart plan"):
        Plan.load(tmp_path / "absent.json")


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------


def test_save_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("old")
    with pytest.raises(HetpartError, match="exists: pass force=True"):  # the keyword a Python caller passes
        make_plan().save(path)
    assert path.read_text() == "old"
    make_plan().save(path, force=True)
    assert Plan.load(path) == make_plan()
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("where", ["serialise", "write", "fsync", "replace"])
def test_an_interrupted_save_leaves_the_old_file_and_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text("old plan")
    if where == "serialise":
        monkeypatch.setattr(plan_module.json, "dumps", _boom)
    elif where == "write":   # the disk fills up after the first 100 bytes
        real_fdopen = os.fdopen

        def half_writer(fd: int, *args: Any, **kwargs: Any) -> Any:
            f = real_fdopen(fd, *args, **kwargs)
            f.write = lambda data: (os.write(fd, bytes(data[:100]) if isinstance(data, (bytes, bytearray))  # type: ignore[method-assign]
                                    else data[:100].encode()), _boom())
            return f
        monkeypatch.setattr(plan_module.os, "fdopen", half_writer)
    else:
        monkeypatch.setattr(plan_module.os, where, _boom)
    with pytest.raises((HetpartError, OSError), match="No space left"):
        make_plan().save(path, force=True)
    monkeypatch.undo()
    assert path.read_text() == "old plan"
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]


def test_an_interrupted_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module.os, "replace", _boom)
    with pytest.raises(HetpartError, match=r"cannot write .*plan\.json: .*No space left"):
        make_plan().save(tmp_path / "plan.json")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------
# The device map
# --------------------------------------------------------------------------------------------


def test_device_map_maps_whole_modules_where_their_weights_agree() -> None:
    # layer 0's q_proj and ff1 are both on cuda:0, so "layers.0" is mapped whole; relu_0 (no
    # parameters) runs on cpu and does not count
    assert make_plan(split_placement()).to_device_map() == {
        "emb": "cpu", "layers.0": "cuda:0", "layers.1": "cpu", "head": "cuda:0"}
    both_layers_on_gpu = split_placement() | {"ff1_1": "cuda:0"}
    assert make_plan(both_layers_on_gpu).to_device_map() == {"emb": "cpu", "layers": "cuda:0", "head": "cuda:0"}
    deeper = split_placement() | {"q_proj": "cpu"}
    assert make_plan(deeper).to_device_map() == {
        "emb": "cpu", "layers.0.attn": "cpu", "layers.0.mlp": "cuda:0", "layers.1": "cpu", "head": "cuda:0"}


def test_device_map_of_a_single_device_plan_is_the_root() -> None:
    everything_on_gpu = {op: "cuda:0" for op in MODULES} | {"relu_0": "cpu"}
    assert make_plan(everything_on_gpu).to_device_map() == {"": "cuda:0"}


def test_device_map_puts_streamed_weights_where_they_live() -> None:
    plan = make_plan(weights={"ff1_1": "cpu"})   # computed on cuda:0, weights kept in host memory
    assert plan.to_device_map() == {"emb": "cuda:0", "layers.0": "cuda:0", "layers.1": "cpu", "head": "cuda:0"}
    assert make_plan(weights={op: "cpu" for op in PARAM_OPS}).to_device_map() == {"": "cpu"}


def test_device_map_of_a_split_leaf_module_names_it() -> None:
    plan = make_plan(split_placement() | {"ff1_0_bias": "cpu"})
    with pytest.raises(PlanMismatch) as err:
        plan.to_device_map()
    message = str(err.value)
    assert message.startswith("module layers.0.mlp.ff1 is split across cpu and cuda:0: the plan is not "
                              "module-aligned")
    assert "ff1_0_mm (cuda:0)" in message and "ff1_0_bias (cpu)" in message
    assert "--align-modules" in message


def test_device_map_of_a_module_with_own_parameters_and_split_children() -> None:
    modules = MODULES | {"layer_scale": "layers.0"}
    placement = split_placement() | {"layer_scale": "cuda:0", "q_proj": "cpu"}
    plan = make_plan(placement, modules=modules, param_ops=PARAM_OPS + ("layer_scale",))
    with pytest.raises(PlanMismatch, match=r"module layers\.0 holds parameters of its own \(layer_scale on "
                                           r"cuda:0\) while its submodules are split across cpu and cuda:0"):
        plan.to_device_map()


# --------------------------------------------------------------------------------------------
# Checks against the graph and the devices
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_graphs() -> tuple[OpGraph, OpGraph]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return (from_module(model, torch.randn(2, 8), name="tiny"),
            from_module(model, torch.randn(3, 8), name="tiny-batch3"))


def plan_for(graph: OpGraph) -> Plan:
    """Every op of ``graph`` on the CPU, with the memory and copies that placement needs there."""
    from partitioner.solvers.problem import Placement, Problem, evaluate

    ops = graph.topological_order()
    placement = {op.name: "cpu" for op in ops}
    ev = evaluate(Problem(graph, DEVICES), Placement(placement))
    return make_plan(placement, modules={op.name: op.module_path for op in ops},
                     param_ops=tuple(op.name for op in ops if op.owned_params),
                     fingerprint=graph.fingerprint(), model_name=graph.name,
                     memory={d: {"used": ev.memory[d], "capacity": ev.capacity[d]} for d in ev.memory},
                     transfers=tuple(TransferInfo(t.tensor, t.src, t.dst, t.bytes, t.seconds, t.kind)
                                     for t in ev.transfers),
                     predicted={"total_s": 1e-5, "per_device_s": {"cpu": 1e-5}, "per_link_s": {}})


def test_check_graph_accepts_the_graph_it_was_made_for(tiny_graphs: tuple[OpGraph, OpGraph]) -> None:
    graph, _ = tiny_graphs
    plan = plan_for(graph)
    plan.check_graph(graph)
    assert plan.to_device_map() == {"": "cpu"}


def test_check_graph_mismatch_shows_both_fingerprints(tiny_graphs: tuple[OpGraph, OpGraph],
                                                      tmp_path: Path) -> None:
    graph, other = tiny_graphs
    assert graph.fingerprint() != other.fingerprint()
    plan = Plan.load(plan_for(graph).save(tmp_path / "plan.json"))
    with pytest.raises(PlanMismatch) as err:
        plan.check_graph(other)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'plan.json'} was made for another graph")
    assert re.search(rf"plan: +model 'tiny', {len(graph)} ops, fingerprint {graph.fingerprint()}", message)
    assert re.search(rf"graph: +model 'tiny-batch3', {len(other)} ops, fingerprint {other.fingerprint()}", message)
    assert "hetpart plan" in message


def test_check_devices_names_what_differs() -> None:
    plan = make_plan()
    plan.check_devices(load_profile("h200-host"))
    with pytest.raises(PlanMismatch, match=r"only in the profile: cuda:1"):
        plan.check_devices(load_profile("2xh200-host"))
    with pytest.raises(PlanMismatch, match=r"cuda:0 differs"):
        plan.check_devices(DEVICES.with_memory({"cuda:0": "8GiB"}))


# --------------------------------------------------------------------------------------------
# From a solve
# --------------------------------------------------------------------------------------------


def test_from_solution_records_the_evaluation(tiny_graphs: tuple[OpGraph, OpGraph], tmp_path: Path) -> None:
    from partitioner.solvers.problem import Placement, Problem, Solution, Status, evaluate

    graph, _ = tiny_graphs
    problem = Problem(graph, DEVICES)
    placement = Placement({n: "cuda:0" for n in problem.nodes})
    all_cpu = evaluate(problem, Placement({n: "cpu" for n in problem.nodes}))
    solution = Solution("single-device", placement, Status.HEURISTIC, seconds=0.01)
    plan = Plan.from_solution(problem, solution, baselines={"all-cpu": all_cpu})
    ev = evaluate(problem, placement)
    assert plan.placement == {op.name: "cuda:0" for op in graph}
    assert plan.op_count == len(graph) and plan.fingerprint == graph.fingerprint()
    assert plan.predicted["total_s"] == pytest.approx(ev.total_s)
    assert plan.solver == SolverInfo("single-device", "heuristic", ev.total_s, None, None, 0.01)
    assert plan.baselines["all-cpu"].total_s == pytest.approx(all_cpu.total_s)
    assert [(t.tensor, t.src, t.dst, t.kind) for t in plan.transfers] == [(graph.inputs[0], "cpu", "cuda:0", "activation")]
    assert sum(plan.predicted["per_op_s"].values()) == pytest.approx(sum(problem.compute[n]["cuda:0"] for n in problem.nodes))
    assert plan.to_device_map() == {"": "cuda:0"}
    assert Plan.load(plan.save(tmp_path / "plan.json")) == plan
    plan.check_graph(graph)
    assert "tiny" in plan.summary() and "cuda:0" in plan.summary()


def test_plan_is_frozen_and_replace_revalidates() -> None:
    plan = make_plan()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.objective = "makespan"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.placement["q_proj"] = "cpu"  # type: ignore[index]
    with pytest.raises(PlanFormatError, match="stream_mode"):
        dataclasses.replace(plan, stream_mode="lazy")
