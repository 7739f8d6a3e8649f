"""Pipelines that are not the easy case, on real gloo ranks, against the single-process model.

The other pipeline tests have as many micro-batches as stages, a plain chain, tied weights on
every rank and the default loss. Here each run breaks one of those, and the ranks' outputs, loss
and every gradient are held to the single-process model with the same micro-batching
(:func:`backends.pipeline.check.check_results`), and the loss also to one computed here:

* 3 stages and 2 micro-batches (fewer than stages), a value of stage 0 read on stage 2 (stage 1
  must relay it) and a weight tied between stages 0 and 2 only (its gradient is summed over
  those two; a reduction over all three ranks would wait forever on rank 1);
* 2 stages and 3 micro-batches under 1F1B with ``hetpart launch --loss cross-entropy``, and 2
  stages and 4 micro-batches under GPipe with the user's own loss (``--loss file.py:function``):
  a target sized by the stage count, or a ``--loss`` the launch drops, gives another loss.

Three real multi-process runs in all (a few seconds each).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends import get_backend
from backends.pipeline.loss import loss_function, make_target
from backends.pipeline.runtime import tied_groups
from backends.pipeline.stages import StageGraphs, parameter_names
from partitioner import Plan, partition
from partitioner.cli import main as cli_main
from tests.e2e import pipeline_models

MODELS = Path(pipeline_models.__file__).resolve()
SKIP_TIED_PINS = {"linear": "host0/cpu", "relu": "host0/cpu", "mul": "host0/cpu",      # stage 0
                  "linear_1": "host1/cpu", "tanh": "host1/cpu",                           # stage 1
                  "add": "host2/cpu", "linear_2": "host2/cpu"}                            # stage 2


def _saved(plan: Plan, path: Path) -> Plan:
    plan.save(path)
    return Plan.load(path)


def _expected_loss(module: torch.nn.Module, x: torch.Tensor, loss: str, micro_batches: int) -> float:
    """The mean over micro-batches of ``loss`` on the model's output, the target made for the whole batch."""
    with torch.no_grad():
        out = module(x)
        target = make_target(loss, tuple(out.shape)).chunk(micro_batches)
        fn = loss_function(loss)
        return float(torch.stack([fn(o, t) for o, t in zip(out.chunk(micro_batches), target)]).mean())


def test_three_stages_two_micro_batches_relay_a_skipped_value_and_sum_a_weight_tied_on_two(tmp_path):
    module, inputs = pipeline_models.skip_tied()
    plan = _saved(partition(module, inputs, "4x-cpu-host", objective="throughput", training=True, stages=3,
                            micro_batches=2, schedule="gpipe", pins=SKIP_TIED_PINS,
                            model_name=f"{MODELS}:skip_tied"), tmp_path / "plan.json")
    graphs = StageGraphs(plan, module, (inputs[0][:6],))
    assert [n.name for n in graphs.live[0]] == ["relu", "mul"]
    assert [n.name for n in graphs.live[1]] == ["relu", "tanh"]      # stage 1 relays relu to stage 2
    assert tied_groups(graphs, parameter_names(module)) == {"inp.weight": [0, 2]}   # tied: stages 0 and 2 only
    report = get_backend("pipeline").check(plan, module, inputs, model_spec=f"{MODELS}:skip_tied", training=True,
                                           timeout_s=20, run_timeout_s=120)
    assert report.passed, report.to_text()
    assert {g.name for g in report.grads} == {n for n, _ in module.named_parameters()}
    assert all(g.max_abs is not None and g.max_abs < 1e-5 for g in report.grads), report.to_text()
    assert "3 ranks (gpipe, 2 micro-batches)" in report.emitted
    assert report.loss.max_abs < 1e-6


@pytest.mark.parametrize(("micro_batches", "schedule", "loss"), [
    (3, "1f1b", "cross-entropy"),
    (4, "gpipe", f"{MODELS}:weighted_l1"),
], ids=["3-micro-batches-1f1b-cross-entropy", "4-micro-batches-gpipe-user-loss"])
def test_two_stages_with_more_micro_batches_than_stages_and_the_loss_given_to_launch(
        tmp_path, capsys, micro_batches, schedule, loss):
    module, inputs = pipeline_models.chain()
    plan = _saved(partition(module, inputs, "4x-cpu-host", objective="throughput", training=True, stages=2,
                            micro_batches=micro_batches, schedule=schedule, solver="pipeline-dp",
                            model_name=f"{MODELS}:chain"), tmp_path / "plan.json")
    assert plan.pipeline["world_size"] == 2 and plan.pipeline["micro_batches"] == micro_batches
    status = cli_main(["launch", plan.source, "--run", "--check", "--training", "--loss", loss, "--timeout", "30"])
    out = capsys.readouterr().out.strip().splitlines()
    assert status == 0, "\n".join(out[-30:])
    assert f"pipeline of 2 ranks ({schedule}, {micro_batches} micro-batches) vs the original, training" \
        in "\n".join(out)
    assert out[-1] == "passed: every tensor within its tolerance"
    assert f"loss = mean of the micro-batches' {loss};" in "\n".join(out)     # the check used the loss given
    names = {n for n, _ in module.named_parameters()}
    grads = [line for line in out if line.split()[:1] and line.split()[0] in names]
    assert len(grads) == 6 and all(line.endswith("ok") for line in grads), "\n".join(out)
    # the ranks' loss agrees with the check's; and the loss asked for differs from the default here,
    # so ranks that dropped --loss (and trained with mse) would fail the loss row
    reported = [line for line in out if line.split()[:1] == ["loss"]]
    assert reported and reported[0].endswith("ok"), "\n".join(out)
    assert _expected_loss(module, inputs[0], loss, micro_batches) != pytest.approx(
        _expected_loss(module, inputs[0], "mse", micro_batches), rel=1e-3)
