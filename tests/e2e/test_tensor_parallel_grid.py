"""Pipeline stages x tensor-parallel groups: 4 gloo ranks under torchrun, 2 stages x 2 tensor-parallel ranks.

``gpt:tiny`` cut in two pipeline stages on ``4x-cpu-host`` (host0, host1; its embedding and head
tied across them), then every linear but the tied head split in halves by hand (cycling through
both axes) over its stage's device and a device of its own (host2 for stage 0, host3 for stage 1):
each stage's split linears are sharded over its two ranks. The ranks' outputs, loss and gradients
(sharded weights gathered, under the model's names; the tied weight summed over its stages) equal
the single-process model under the same micro-batching (``torch.testing.assert_close`` and the
check's report); ``hetpart launch`` prints the 4-rank command of the same plan.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

import models
from backends.pipeline.check import read_results
from backends.pipeline.check import reference_step as pipeline_reference
from backends.pipeline.runtime import RunOptions as PipelineOptions
from backends.tensor_parallel import RunOptions, check_results, run_ranks
from backends.tensor_parallel.grid import grid_of
from partitioner import Plan, partition
from partitioner.cli import main as cli_main

OTHER = {"host0/cpu": "host2/cpu", "host1/cpu": "host3/cpu"}


def grid_plan(module: torch.nn.Module, inputs: tuple, path: Path, model_name: str) -> Plan:
    """A 2-stage inference pipeline plan with every stage's linears (but ``skip``) split in halves
    over its device and its ``OTHER``, written to ``path`` and loaded (the plan's checks pass)."""
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", stages=2, micro_batches=2,
                     schedule="gpipe", solver="pipeline-dp", model_name=model_name)
    plan.save(path.with_suffix(".pipeline.json"))
    data = json.loads(path.with_suffix(".pipeline.json").read_text())
    axes = itertools.cycle(["cols", "rows"])
    data["splits"] = {op: {"axis": next(axes), "devices": [device, OTHER[device]], "fractions": [0.5, 0.5]}
                      for op, device in data["placement"].items() if op.startswith("linear") and op != "linear_12"}
    path.write_text(json.dumps(data))
    return Plan.load(path)


@pytest.fixture(scope="module")
def gpt_tiny_grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, torch.nn.Module, tuple]:
    model, inputs = models.get("gpt", "tiny")
    return grid_plan(model, inputs, tmp_path_factory.mktemp("plans") / "grid.json", "gpt:tiny"), model, inputs


@pytest.mark.slow
def test_two_stages_by_two_tensor_parallel_ranks_equal_the_model(gpt_tiny_grid, tmp_path: Path) -> None:
    plan, model, inputs = gpt_tiny_grid
    assert grid_of(plan) == (("host0/cpu", "host2/cpu"), ("host1/cpu", "host3/cpu"))
    options = RunOptions(training=True, results=str(tmp_path), timeout_s=120)
    run = run_ranks(plan, "gpt:tiny", options, timeout_s=300)
    assert run.returncode == 0, run.output[-3000:]
    records = read_results(tmp_path, 4)
    assert [(r["stage"], r["tp"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert records[0]["sharded"] == [f"blocks.0.attn.{m}_proj" for m in "koqv"]
    assert len(records[2]["sharded"]) == 8 and records[2]["sharded"] == records[3]["sharded"]
    outs, loss, grads = pipeline_reference(model, inputs, 2, PipelineOptions(training=True))
    held = set()
    for record in records:
        if record["stage"] == 1:
            torch.testing.assert_close(record["outputs"][0], outs["output"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(torch.tensor(record["losses"]).mean(), loss, rtol=1e-4, atol=1e-6)
        for name, grad in record["grads"].items():
            torch.testing.assert_close(grad, grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        held |= set(record["grads"])
    assert held == {n for n, g in grads.items() if g is not None}
    assert "tok_emb.weight" in records[0]["grads"] and "tok_emb.weight" in records[3]["grads"]  # tied: both stages
    report = check_results(plan, model, inputs, options, tmp_path)
    assert report.passed, report.to_text()
    assert "2 pipeline stages x 2 tensor-parallel ranks (gpipe, 2 micro-batches, 12 linears sharded)" in report.to_text()


def test_hetpart_launch_prints_the_grid_command(gpt_tiny_grid, capsys) -> None:
    plan = gpt_tiny_grid[0]
    assert cli_main(["launch", plan.source]) == 0
    out = capsys.readouterr().out
    assert "12 split linears over 4 tensor-parallel ranks (2 pipeline stages x 2)" in out
    assert f"torchrun --standalone --nproc-per-node 4 -m backends.tensor_parallel {plan.source} --model gpt:tiny" in out
