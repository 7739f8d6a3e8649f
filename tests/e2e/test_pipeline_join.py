"""A rank that never joins a pipeline run, or fails before it joins, is named in one line with the
likely cause, instead of the traceback of a rank that did come. Real rank processes (the rank
program alone, and `hetpart launch --run` under torchrun) with a short --timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import models
from partitioner import partition
from partitioner.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]

DIES = '''
import os
import models

def build():
    if os.environ.get("RANK") == "1":
        os._exit(3)                      # rank 1 stops before it joins, without a word
    return models.get("mlp", "tiny")
'''


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    """mlp:tiny in 2 stages on 4x-cpu-host."""
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", stages=2, solver="pipeline-dp",
                     model_name="mlp:tiny")
    path = tmp_path_factory.mktemp("plans") / "mlp-2.json"
    plan.save(path)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("hetpart pipeline rank")]


@pytest.mark.slow
def test_a_rank_that_never_joins_is_named_by_the_rank_that_came(plan_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", WORLD_SIZE="2", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "backends.pipeline", str(plan_path), "--model", "mlp:tiny", "--timeout", "2"]
    alone = {rank: subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank),
                                                   MASTER_PORT=str(_free_port())),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)}           # each alone: rank 0 waits for rank 1; rank 1 finds no rank 0
    try:
        outputs = {rank: proc.communicate(timeout=120)[0] for rank, proc in alone.items()}
    finally:
        for proc in alone.values():
            if proc.poll() is None:
                proc.kill()
    assert {rank: proc.returncode for rank, proc in alone.items()} == {0: 2, 1: 2}, outputs
    for rank, output in outputs.items():
        assert "Traceback" not in output and len(_error_lines(output)) == 1, output[-3000:]
    zero, = _error_lines(outputs[0])
    assert zero.startswith("hetpart pipeline rank 0: error: rank 0 (stage 0 on host0/cpu -> cpu): rank 1 (stage 1 "
                           "on host1/cpu) never joined within 2 s (1 of 2 ranks joined):"), zero
    assert "torchrun command was not run" in zero and "--master-addr" in zero
    one, = _error_lines(outputs[1])
    assert one.startswith("hetpart pipeline rank 1: error: rank 1 (stage 1 on host1/cpu -> cpu): cannot reach the "
                          "run's store at 127.0.0.1:"), one
    assert "within 2 s" in one and "rank 0 has not started" in one and "--master-addr" in one


@pytest.mark.slow
def test_a_rank_that_stops_before_joining_is_named_in_the_runs_error(plan_path, tmp_path, capsys):
    factory = tmp_path / "dies.py"
    factory.write_text(DIES)
    status = cli_main(["launch", str(plan_path), "--run", "--model", f"{factory}:build", "--timeout", "30"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, err[-20:]
    assert err[-1].startswith("hetpart: error: the pipeline run failed (exit status 1): rank 1 stopped first: it "
                              "exited with status 3 before it reported an error"), err[-1]
