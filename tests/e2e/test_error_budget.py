"""End to end: an accuracy budget (``precision={"weights": "auto", "max_error": e}``) gives a plan
whose measured output error against the float model keeps it, recorded in the plan file; a
tighter budget packs less and costs time; the emitted plan checks under strict devices against
the same packing unplaced; and a budget no plan meets is refused with the least error found and
the ops causing it."""

from __future__ import annotations

import json

import pytest
import torch

import models
from backends.torch.check import check_plan
from backends.torch.weight_errors import packed_error, weight_errors
from cost_models.precision import PrecisionError
from partitioner import Plan, partition
from partitioner.errors import HetpartError
from partitioner.plan.values import PlanFormatError

pytest.importorskip("torchao")

CAP = {"cuda:0": "8MB"}  # mlp:small holds 24 MiB of float32 weights: the GPU fits them only packed or streamed


@pytest.fixture(scope="module")
def mlp():  # noqa: ANN201
    return models.get("mlp", "small")


@pytest.fixture(scope="module")
def budgeted(mlp):  # noqa: ANN001, ANN201
    module, inputs = mlp
    return {budget: partition(module, inputs, "h200-host", memory=CAP, time_limit=20,
                              precision={"weights": "auto", "max_error": budget})
            for budget in (0.05, 0.004)}


def test_each_plan_keeps_its_budget_as_measured(budgeted) -> None:  # noqa: ANN001
    for budget, plan in budgeted.items():
        error = plan.precision["error"]
        assert plan.precision["weights"], plan.summary()  # packing pays under the cap
        assert error["max_error"] == budget
        assert 0 < error["measured"]["all"] <= budget
        assert set(error["ops"]) == set(plan.precision["weights"])
        assert error["estimated"] == pytest.approx(error["measured"]["all"], rel=0.5)  # the estimate is close
        assert f"of max_error {budget:g}" in plan.summary()
    loose, tight = budgeted[0.05], budgeted[0.004]
    assert tight.precision["error"]["measured"]["all"] < loose.precision["error"]["measured"]["all"]
    assert tight.predicted["total_s"] >= loose.predicted["total_s"]  # accuracy costs time here


def test_budgeted_plan_checks_under_strict_devices_and_round_trips(budgeted, mlp, tmp_path) -> None:  # noqa: ANN001
    module, inputs = mlp
    plan = budgeted[0.004]
    assert "float8" not in plan.precision["weights"].values()  # no host kernel: the check runs on this CPU
    report = check_plan(plan, module, inputs, repeat=1, strict_devices=True)
    assert report.passed, report.to_text()
    assert report.packed.budget == 0.004
    assert report.packed.worst <= 0.004 * 1.01
    assert "max_error 0.004 is kept on these inputs" in report.to_text()
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path).precision["error"] == plan.precision["error"]
    edited = json.loads(path.read_text())
    edited["precision"]["error"]["measured"]["all"] = 0.5  # over its own budget
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(PlanFormatError, match="over max_error"):
        Plan.load(tmp_path / "edited.json")


def test_a_plan_packing_weights_records_its_measured_error_without_a_budget(mlp) -> None:
    module, inputs = mlp
    plan = partition(module, inputs, "h200-host", memory=CAP, time_limit=20, precision={"weights": "int8"})
    error = plan.precision["error"]
    assert set(error) == {"measured", "measured_by"} and error["measured_by"] == "the plan's kernels on the host"
    assert 0 < error["measured"]["all"] < 0.02
    assert "measured error" in plan.summary() and "against the float model" in plan.summary()
    hollow, hollow_inputs = models.get("mlp", "small", device="meta")
    plan = partition(hollow, hollow_inputs, "h200-host", memory=CAP, time_limit=20, precision={"weights": "int8"})
    assert plan.precision["weights"] and "error" not in plan.precision  # no values to measure: check reports it


def test_a_budget_no_plan_meets_names_the_least_error_and_its_ops(mlp) -> None:
    module, inputs = mlp
    with pytest.raises(PrecisionError, match=r"least error found is [0-9.e-]+ .*largest alone: linear"):
        partition(module, inputs, "h200-host", memory=CAP, time_limit=20,
                  precision={"weights": "int4", "max_error": 1e-4})


def test_weight_errors_are_measured_one_weight_at_a_time_and_leave_the_model_as_it_was(mlp) -> None:
    module, inputs = mlp
    before = {n: p.detach().clone() for n, p in module.state_dict().items()}
    errors = weight_errors(module, inputs, {"layers.0.weight": ("int8", "int4"), "layers.10.weight": ("int8",)})
    assert 0 < errors["layers.0.weight"]["int8"] < errors["layers.0.weight"]["int4"]
    both = packed_error(module, inputs, {"layers.0.weight": "int8", "layers.10.weight": "int8"})
    alone = [errors["layers.0.weight"]["int8"], errors["layers.10.weight"]["int8"]]
    assert max(alone) < both <= sum(alone) * 1.1  # errors of two weights add, about in quadrature
    assert all(torch.equal(before[n], p) for n, p in module.state_dict().items())


def test_what_cannot_be_measured_is_refused_by_name(mlp) -> None:
    module, inputs = mlp
    with pytest.raises(PrecisionError, match="max_error=.*bounds the error packed weights cost; add weights=auto"):
        partition(module, inputs, "h200-host", precision={"max_error": 0.01})
    for bad in (0, -0.1, "abc", True, float("nan")):
        with pytest.raises(PrecisionError, match="a number above 0"):
            partition(module, inputs, "h200-host", precision={"weights": "auto", "max_error": bad})
    hollow = torch.nn.Linear(32, 32, device="meta")
    with pytest.raises(HetpartError, match="'weight' has no values .*meta device"):
        weight_errors(hollow, (torch.randn(2, 32, device="meta"),), {"weight": ("int8",)})
    from partitioner.frontends.fx import from_module

    graph = from_module(module, inputs)
    with pytest.raises(PrecisionError, match="OpGraph or ONNX model"):
        partition(graph, None, "h200-host", precision={"weights": "auto", "max_error": 0.01})
