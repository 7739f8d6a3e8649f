"""Pipeline plans run on torch.distributed.pipelining with gloo and real processes (torchrun), on
4x-cpu-host bound to local CPU ranks: 2 and 4 ranks of inference equal the model; a training step
with GPipe and with 1F1B gives the model's loss and gradients under the same micro-batching; a rank
that dies mid-step stops the others with a clear error instead of a hang."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import models
from backends import get_backend
from partitioner import Plan, partition
from partitioner.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp_path_factory, model: str, stages: int, micro_batches: int, schedule: str, training: bool) -> Plan:
    name, _, size = model.partition(":")
    module, inputs = models.get(name, size)
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", training=training, stages=stages,
                     micro_batches=micro_batches, schedule=schedule, solver="pipeline-dp", model_name=model)
    path = tmp_path_factory.mktemp("plans") / f"{name}-{stages}.json"
    plan.save(path)
    return Plan.load(path)


@pytest.fixture(scope="module")
def gpt_two(tmp_path_factory) -> Plan:
    """gpt:tiny in 2 stages (the tied embedding and head on both), 2 micro-batches."""
    return _plan(tmp_path_factory, "gpt:tiny", 2, 2, "gpipe", training=True)


@pytest.fixture(scope="module")
def mlp_four(tmp_path_factory) -> Plan:
    """mlp:tiny in 4 stages, 4 micro-batches."""
    return _plan(tmp_path_factory, "mlp:tiny", 4, 4, "1f1b", training=True)


def test_two_ranks_inference_equals_the_model(gpt_two, capsys):
    status = cli_main(["launch", gpt_two.source, "--run", "--check", "--timeout", "60"])
    out = capsys.readouterr().out.strip().splitlines()
    assert status == 0, "\n".join(out[-30:])
    assert "pipeline of 2 ranks (gpipe, 2 micro-batches) vs the original, inference" in "\n".join(out)
    assert any(line.split()[:1] == ["output"] and line.endswith("ok") for line in out)
    assert out[-1] == "passed: every tensor within its tolerance"      # the verdict, last


def test_two_ranks_1f1b_training_step_gives_the_models_loss_and_gradients(gpt_two):
    module, inputs = models.get("gpt", "tiny")
    report = get_backend("pipeline").check(gpt_two, module, inputs, model_spec="gpt:tiny", training=True,
                                           schedule="1f1b", timeout_s=60)
    assert report.passed, report.to_text()
    assert report.loss is not None and report.loss.passed and "1f1b" in report.emitted
    names = {g.name for g in report.grads}
    assert names == {n for n, _ in module.named_parameters()} and "tok_emb.weight" in names  # tied, on both stages


def test_four_ranks_gpipe_training_step_gives_the_models_loss_and_gradients(mlp_four):
    module, inputs = models.get("mlp", "tiny")
    report = get_backend("pipeline").check(mlp_four, module, inputs, model_spec="mlp:tiny", training=True,
                                           schedule="gpipe", timeout_s=60)
    assert report.passed, report.to_text()
    assert "4 ranks (gpipe, 4 micro-batches)" in report.emitted and len(report.grads) == 6
    assert report.loss.max_abs < 1e-5


def test_four_ranks_inference_equals_the_model(mlp_four):
    module, inputs = models.get("mlp", "tiny")
    report = get_backend("pipeline").check(mlp_four, module, inputs, model_spec="mlp:tiny", timeout_s=60)
    assert report.passed and [o.name for o in report.outputs] == ["output"], report.to_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_dies_mid_step_stops_the_others_with_a_clear_error(mlp_four, tmp_path_factory):
    plan = _plan(tmp_path_factory, "mlp:tiny", 2, 2, "gpipe", training=True)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "backends.pipeline", plan.source, "--model", "mlp:tiny", "--training",
            "--steps", "1000000", "--timeout", "30", "--verbose"]
    ranks = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        for line in ranks[0].stdout:             # wait until the ranks are stepping
            if "step 3 of" in line:
                break
        ranks[1].send_signal(signal.SIGKILL)      # rank 1 dies in the middle of its steps
        start = time.monotonic()
        rest = ranks[0].communicate(timeout=60)[0]
        took = time.monotonic() - start
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    assert ranks[0].returncode == 2 and took < 35, rest[-2000:]
    error = [line for line in rest.splitlines() if line.startswith("hetpart pipeline rank 0: error:")]
    assert error, rest[-2000:]
    assert "rank 0 (stage 0 on host0/cpu -> cpu): step" in error[0] and "failed" in error[0]
    assert "a peer rank probably stopped" in error[0]


def test_a_plan_on_the_local_cluster_runs_and_each_rank_records_its_busy_time(tmp_path):
    from backends.pipeline.check import read_results
    from backends.pipeline.launch import rank_arguments, run_local
    from backends.pipeline.runtime import RunOptions
    from cost_models.local_cluster import local_cluster

    module, inputs = models.get("mlp", "tiny")
    cluster = local_cluster(2, measure=False).flatten()          # the ranks of this machine, not measured
    plan = partition(module, inputs, cluster, objective="throughput", training=True, stages=2, micro_batches=2,
                     schedule="gpipe", model_name="mlp:tiny")
    path = tmp_path / "plan.json"
    plan.save(path)
    options = RunOptions(training=True, steps=3, results=str(tmp_path), timeout_s=60)
    run = run_local(plan, rank_arguments(path, "mlp:tiny", options), timeout_s=180)
    assert run.returncode == 0, run.output[-3000:]
    for record in read_results(tmp_path, 2):
        assert len(record["forward_s"]) == len(record["backward_s"]) == len(record["step_s"]) == 3
        for fwd, bwd, step in zip(record["forward_s"], record["backward_s"], record["step_s"]):
            assert 0 < fwd and 0 < bwd and fwd + bwd < step      # busy in its actions, within the step
