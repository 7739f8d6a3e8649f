"""Pipeline plans: the plan's section (round trip, old plans, bad files), the stage modules chained in
one process against the model, the torchrun commands, a launch that does not match the plan, and the
summary and report."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

import models
from backends.pipeline.__main__ import main as rank_main
from backends.pipeline.stages import StageGraphs, parameter_names
from models.synthetic import random_chain
from partitioner import Plan, partition
from partitioner.cli import main as cli_main
from partitioner.micro_batches import micro_batch_inputs
from partitioner.plan import PlanFormatError
from partitioner.report.html import render_html


@pytest.fixture(scope="module")
def gpt_plan(tmp_path_factory):
    """gpt:tiny (tied embedding and head) in 2 stages on 4x-cpu-host, 2 micro-batches, training."""
    module, inputs = models.get("gpt", "tiny")
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", training=True, stages=2,
                     micro_batches=2, schedule="gpipe", solver="pipeline-dp", model_name="gpt:tiny")
    path = tmp_path_factory.mktemp("plan") / "gpt.json"
    plan.save(path)
    return Plan.load(path)


def test_the_pipeline_section_round_trips_and_old_plans_still_load(gpt_plan, tmp_path):
    section = gpt_plan.pipeline
    assert section["world_size"] == 2 and [s["rank"] for s in section["stages"]] == [0, 1]
    assert [s["host"] for s in section["stages"]] == ["host0", "host1"]
    assert Plan.from_json(gpt_plan.to_json()) == gpt_plan
    old = json.loads(gpt_plan.to_json())
    del old["pipeline"]
    assert not Plan.from_dict(old).pipeline          # a plan from before pipelines
    for path, value, words in (("schedule", "zigzag", "pipeline.schedule"),
                               ("world_size", 3, "pipeline.world_size"),
                               ("stages", [], "pipeline.world_size")):
        bad = json.loads(gpt_plan.to_json())
        bad["pipeline"][path] = value
        with pytest.raises(PlanFormatError, match=words):
            Plan.from_dict(bad, "bad.json")
    bad = json.loads(gpt_plan.to_json())
    bad["pipeline"]["stages"][1].update(device="host0/cpu", host="host0")
    with pytest.raises(PlanFormatError, match=r"pipeline\.stages\[1\]"):
        Plan.from_dict(bad, "bad.json")


def test_stage_modules_chained_in_one_process_equal_the_model(gpt_plan):
    module, inputs = models.get("gpt", "tiny")
    micro = micro_batch_inputs(inputs, 2)
    graphs = StageGraphs(gpt_plan, module, micro)
    stages = [graphs.module(s) for s in range(graphs.num_stages)]
    assert graphs.input_count(1) == len(graphs.live[0]) > 0
    names = parameter_names(module)
    held = [{names[t] for t in graphs.attributes(s) if t in names} for s in range(2)]   # buffers are not trained
    tied = held[0] & held[1]
    assert tied == {"tok_emb.weight"}                 # the tied embedding/head sits on both stages
    out = micro
    for stage in stages:
        out = stage(*out) if isinstance(out, tuple) else stage(out)
    reference = module(*micro)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    out.float().pow(2).mean().backward()
    reference.float().pow(2).mean().backward()
    grads: dict[str, torch.Tensor] = {}
    for stage in stages:
        for name, p in stage.named_parameters():
            grads[names[name]] = grads.get(names[name], 0) + p.grad
    for name, p in module.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)   # tied weights: the stages' gradients add up


def test_launch_prints_one_torchrun_command_per_host(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert cli_main(["plan", "mlp:tiny", "--devices", "2x-h200-host", "--objective", "throughput",
                     "--stages", "4", "--micro-batches", "4", "--schedule", "gpipe", "-o", str(plan_path)]) == 0
    plan = Plan.load(plan_path)
    assert [s["device"] for s in plan.pipeline["stages"]] == ["host0/cpu", "host0/cuda:0", "host1/cpu", "host1/cuda:0"]
    capsys.readouterr()
    assert cli_main(["launch", str(plan_path), "--master-addr", "10.0.0.1", "--training"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torchrun")]
    assert len(lines) == 2
    for node_rank, line in enumerate(lines):
        argv = shlex.split(line)
        flags = dict(zip(argv[1:], argv[2:]))
        assert flags["--nnodes"] == "2" and flags["--nproc-per-node"] == "2" and flags["--node-rank"] == str(node_rank)
        assert flags["--master-addr"] == "10.0.0.1" and flags["-m"] == "backends.pipeline"
        assert argv[argv.index("backends.pipeline") + 1] == str(plan_path) and "--training" in argv
        assert flags["--model"] == "mlp:tiny"


def test_a_launch_whose_world_size_is_not_the_plans_is_refused(gpt_plan, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert rank_main([gpt_plan.source, "--model", "gpt:tiny"]) == 2
    err = capsys.readouterr().err
    assert "has 2 stages" in err and "started 3 processes" in err and "hetpart launch" in err
    monkeypatch.delenv("WORLD_SIZE")
    assert rank_main([gpt_plan.source, "--model", "gpt:tiny"]) == 2
    assert "WORLD_SIZE is not set" in capsys.readouterr().err


def test_summary_and_report_show_stages_and_the_schedule(gpt_plan):
    text = gpt_plan.summary()
    assert "pipeline   2 stages, gpipe, 2 micro-batches" in text
    assert "stage 0  rank 0  host0/cpu" in text and "stage 1  rank 1  host1/cpu" in text
    page = render_html(gpt_plan)
    assert '<section id="pipeline">' in page and '<svg class="pipeline"' in page
    # 2 stages x 2 micro-batches x (forward, backward), plus an optimizer step per stage
    assert page.count('class="bar" data-stage=') == 2 * 2 * 2 + 2
    assert 'data-kind="B" x=' in page and "host (node rank)" in page


def test_relayed_transfers_are_checked_against_the_pipeline_section():
    graph = random_chain(3, 8, skip_prob=1.0)   # skip connections: tensors cross stages that do not read them
    plan = partition(graph, None, "4x-cpu-host", objective="throughput", micro_batches=4, stages=4)
    readers = {t.tensor: {plan.placement[v] for u, v in plan.edges if u == t.tensor} for t in plan.transfers}
    relays = [i for i, t in enumerate(plan.transfers) if t.tensor in plan.placement and t.dst not in readers[t.tensor]]
    assert relays and Plan.from_json(plan.to_json()) == plan
    bad = json.loads(plan.to_json())
    bad["transfers"][relays[0]]["to"] = "host3/cpu" if bad["transfers"][relays[0]]["to"] != "host3/cpu" else "host1/cpu"
    with pytest.raises(PlanFormatError, match=rf"transfers\[{relays[0]}\].*does not send it between"):
        Plan.from_dict(bad, "bad.json")
