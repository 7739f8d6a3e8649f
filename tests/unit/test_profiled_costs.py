"""partition(costs=...): the profiled model prices every solver's plan from measurements, says what
fell back to the analytic model, is recorded in the plan, and refuses a costs file of another graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import models
from cost_models.copies import CopyTime
from cost_models.cost_table import CostsFileError, CostTable
from cost_models.measure import MeasureOptions
from cost_models.measure_cache import MeasurementCache
from cost_models.profiled import ProfiledCosts
from cost_models.profiler import profile_graph
from cost_models.profiles import load_profile
from partitioner import Plan, from_module, partition
from partitioner.errors import HetpartError, PlanMismatch, UnsupportedOp
from partitioner.solvers.problem import Placement, Problem, evaluate
from tests.unit.test_measure import AccelOnly

FAST = MeasureOptions(repeats=2, min_repeats=2, budget_s=2.0)
SOLVERS = ("auto", "greedy", "sequential-fill", "heft", "single:cpu", "single:npu:0")


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    module, inputs = models.get("gpt", "tiny")
    graph = from_module(module, inputs, name="gpt:tiny")
    profile = profile_graph(graph, inputs, load_profile("cpu-gpu-npu"), bind={"npu:0": "cpu"},
                            options=MeasureOptions(repeats=2, min_repeats=2, training=True), cache=MeasurementCache())
    path = profile.table.save(tmp_path_factory.mktemp("costs") / "costs.json")
    return module, inputs, graph, profile.table, path


def test_every_solver_prices_with_measurements_and_says_what_fell_back(gpt) -> None:  # noqa: ANN001
    module, inputs, graph, table, path = gpt
    for solver in SOLVERS:
        plan = partition(graph, None, "cpu-gpu-npu", costs=str(path), solver=solver)
        assert plan.costs["model"] == "profiled" and plan.costs["source"] == str(path)
        assert plan.costs["measured"]["cpu"] == len(graph)
        assert set(plan.costs["fell_back"]["cuda:0"]) == set(graph.ops)      # not present here: analytic
        for op, device in plan.placement.items():
            physical = table.bind.get(device)
            if physical:   # priced from the measurement of the device it is bound to
                assert plan.predicted["per_op_s"][op] == pytest.approx(table.seconds(op, physical, "forward_s"))
    problem = Problem(graph, load_profile("cpu-gpu-npu"), costs=ProfiledCosts(table))
    ev = evaluate(problem, Placement({op: "cpu" for op in graph.ops}))
    assert ev.total_s == pytest.approx(sum(table.seconds(op, "cpu", "forward_s") for op in graph.ops))


def test_training_uses_measured_backward_and_optimizer_step(gpt) -> None:  # noqa: ANN001
    _, _, graph, table, path = gpt
    plan = partition(graph, None, "cpu-gpu-npu", costs=str(path), solver="single:cpu", training=True, optimizer="adam")
    ops = sum((table.seconds(op, "cpu", "train_forward_s") or 0) + (table.seconds(op, "cpu", "backward_s") or 0)
              for op in graph.ops)
    step = table.optimizer["cpu"]["adam"] * graph.trainable_param_bytes()
    assert plan.predicted["total_s"] == pytest.approx(ops + step, rel=1e-6)
    sgd = partition(graph, None, "cpu-gpu-npu", costs=str(path), solver="single:cpu", training=True, optimizer="sgd")
    assert sgd.predicted["total_s"] != pytest.approx(plan.predicted["total_s"])   # sgd not measured: analytic step


def test_the_plan_records_the_cost_model_and_old_plans_stay_readable(gpt, tmp_path: Path) -> None:  # noqa: ANN001
    _, _, graph, _, path = gpt
    plan = partition(graph, None, "cpu-gpu-npu", costs=str(path), solver="heft")
    saved = Plan.load(plan.save(tmp_path / "p.json"))
    assert saved == plan and saved.costs == plan.costs
    assert "profiled (" in plan.summary() and "cuda:0 not measured" in plan.summary()
    from partitioner.report.html import render_html
    assert "cost model" in render_html(plan) and "profiled" in render_html(plan)
    old = json.loads((tmp_path / "p.json").read_text())
    del old["costs"]                                           # a plan written before costs were recorded
    assert Plan.from_dict(old).costs == {} and "analytic" in Plan.from_dict(old).summary()
    analytic = partition(graph, None, "cpu-gpu-npu", solver="heft")
    assert analytic.costs == {"model": "analytic"}


def test_transfers_between_logical_devices_bound_to_one_cpu_cost_what_was_measured(gpt) -> None:  # noqa: ANN001
    _, _, graph, table, _ = gpt
    costs = ProfiledCosts(table)
    devices = load_profile("cpu-gpu-npu")
    measured = sorted((c.nbytes, c.seconds) for c in table.copies if (c.src, c.dst) == ("cpu", "cpu"))
    assert measured and costs.transfer_time(measured[0][0], "cpu", "npu:0", devices).seconds == measured[0][1]
    analytic = costs.transfer_time(4096, "cpu", "cuda:0", devices).seconds   # cuda:0 not here: the link's model
    assert analytic == pytest.approx(devices.link("cpu", "cuda:0").latency + 4096 / devices.link("cpu", "cuda:0").bandwidth)
    rows = ProfiledCosts(CostTable("m", "f", "t", 1, {"cpu": "cpu", "npu:0": "cpu"}, {}, {},
                                   copies=(CopyTime("cpu", "cpu", True, 1000, 1e-6), CopyTime("cpu", "cpu", True, 3000, 3e-6))))
    assert rows.transfer_time(2000, "cpu", "npu:0", devices).seconds == pytest.approx(2e-6)


def test_an_op_that_failed_on_a_device_is_never_placed_there() -> None:
    model, x = AccelOnly(), torch.randn(4, 8)
    graph = from_module(model, (x,))
    table = profile_graph(graph, (x,), load_profile("h200-host"), options=FAST, cache=MeasurementCache()).table
    plan = partition(graph, None, "h200-host", costs=ProfiledCosts(table))
    assert plan.placement["accel_only"] == "cuda:0"
    assert "no CPU kernel" in plan.costs["unsupported"]["accel_only"]["cpu"]
    with pytest.raises(UnsupportedOp, match="failed when measured: cpu: NotImplementedError"):
        partition(graph, None, "cpu", costs=ProfiledCosts(table))


def test_bad_costs_input_is_one_error_naming_the_fix(gpt, tmp_path: Path) -> None:  # noqa: ANN001
    module, inputs, graph, table, path = gpt
    other, other_inputs = models.get("mlp", "tiny")
    with pytest.raises(PlanMismatch, match="measured on model 'gpt:tiny'.*hetpart profile"):
        partition(other, other_inputs, "cpu", costs=str(path))
    with pytest.raises(HetpartError, match="use 'analytic', 'profiled'"):
        partition(graph, None, "cpu", costs="measured")
    meta, meta_inputs = models.get("gpt", "tiny", device="meta")
    with pytest.raises(HetpartError, match="meta device.*real weights"):
        partition(meta, meta_inputs, "cpu", costs="profiled")
    broken = tmp_path / "broken.json"
    data = json.loads(path.read_text())
    data["ops"]["linear"]["times"]["cpu"]["forward_s"] = -1
    broken.write_text(json.dumps(data))
    with pytest.raises(CostsFileError, match=r"ops\.linear\.times\.cpu\.forward_s"):
        partition(graph, None, "cpu", costs=str(broken))
    with pytest.raises(HetpartError, match="no such costs file"):
        partition(graph, None, "cpu", costs=str(tmp_path / "missing.json"))


def test_a_costs_file_time_longer_than_any_measurement_is_refused(gpt, tmp_path: Path) -> None:  # noqa: ANN001
    module, inputs, graph, table, path = gpt
    data = json.loads(path.read_text())
    data["ops"]["linear"]["times"]["cpu"]["forward_s"] = 3600.0
    broken = tmp_path / "hour.json"
    broken.write_text(json.dumps(data))
    with pytest.raises(CostsFileError, match=r"ops\.linear\.times\.cpu\.forward_s: 3600.0 s is longer than any op"):
        partition(graph, None, "cpu", costs=str(broken))
