"""The predicted time of a global step (micro-batch time x accumulation steps, the optimizer step
once) when the optimizer state sits on two devices, against a computation made here from the
plan's own per-op numbers: each op's optimizer step priced by the cost model on the device holding
its weights (``plan.weights``, else its placement), the plan's predicted micro-batch step less
those, ``steps`` times, plus them once."""

from __future__ import annotations

import pytest

import models
from cost_models.training import optimizer_step_time
from partitioner.batching import fit_batch

CAPS = {"cuda:0": "1MB", "cpu": "1MB"}  # gpt:tiny's weights do not fit on one device: state on both


def _optimizer_seconds(fit) -> dict[str, float]:  # noqa: ANN001
    plan, graph = fit.plan, fit.outcome.problem.original
    out = {d: 0.0 for d in plan.devices.names()}
    for name, op in graph.ops.items():
        home = plan.weights.get(name, plan.placement[name])
        out[home] += optimizer_step_time(op.trainable_param_bytes, plan.devices.device(home), plan.optimizer).seconds
    return out


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_a_global_step_pays_each_devices_optimizer_step_once(objective: str) -> None:
    module, inputs = models.get("gpt", "tiny", device="meta")
    fit = fit_batch(module, inputs, "h200-host", global_batch=64, memory=CAPS, objective=objective, time_limit=10,
                    placed_optimizer=False)  # each step after backward where its weights live
    plan, steps = fit.plan, fit.steps
    assert steps > 1 and plan.training
    opt = _optimizer_seconds(fit)
    assert sum(v > 0 for v in opt.values()) == 2, opt          # optimizer state on both devices
    predicted = plan.predicted
    links = steps * max(predicted["per_link_s"].values(), default=0.0)
    if objective == "latency":
        compute = steps * (predicted["critical_path_s"] - sum(opt.values())) + sum(opt.values())
    else:
        compute = max(steps * (predicted["per_device_s"][d] - opt[d]) + opt[d] for d in opt)
    assert fit.step_s == pytest.approx(max(compute, links), rel=1e-9)
    assert plan.batch["step_s"] == pytest.approx(fit.step_s, rel=1e-9)
    assert compute > links or objective == "throughput"         # the optimizer shares matter here


def test_with_the_placed_optimizer_host_steps_run_beside_the_last_micro_batch_only() -> None:
    """A placed optimizer's host steps start as the last micro-batch's gradients arrive
    (solvers/train_state.py): the global step is ``steps - 1`` micro-batch steps without the
    accelerators' optimizer steps, then one whole step (``total_s``), at least the links' load."""
    module, inputs = models.get("gpt", "tiny", device="meta")
    fit = fit_batch(module, inputs, "h200-host", global_batch=64, memory=CAPS, time_limit=10)
    plan, steps = fit.plan, fit.steps
    assert steps > 1 and plan.training_state
    host = plan.devices.host_device().name
    in_stream = sum(s for d, s in plan.training_state["step"]["per_device_s"].items() if d != host)
    predicted = plan.predicted
    links = steps * max(predicted["per_link_s"].values(), default=0.0)
    expected = (steps - 1) * (predicted["critical_path_s"] - in_stream) + predicted["total_s"]
    assert fit.step_s == pytest.approx(max(expected, links), rel=1e-9)
