"""Batch sizing from memory (partitioner.batching, hetpart fit): the largest micro-batch that fits,
the next larger one that does not (by the memory model), the plan's batch section, bad input."""

from __future__ import annotations

import json
import re

import pytest
import torch

import models
from partitioner import partition
from partitioner.batching import (
    candidates, check_batches, evaluate_at, fit_batch, global_step_seconds, inputs_at_batch,
)
from partitioner.cli import main
from partitioner.errors import HetpartError, InfeasiblePlacement
from partitioner.plan import Plan, PlanFormatError

# gpt:tiny under these caps: micro-batch 8 fits, 16 does not (activations grow with the batch)
CAPS = {"cuda:0": "1MB", "cpu": "1MB"}


@pytest.fixture(scope="module")
def gpt_tiny():
    return models.get("gpt", "tiny", device="meta")


@pytest.fixture(scope="module")
def fit(gpt_tiny):
    module, inputs = gpt_tiny
    # every activation saved (no recompute) and state with its weights: memory grows with the batch
    return fit_batch(module, inputs, "h200-host", global_batch=64, memory=CAPS, time_limit=10, recompute=False,
                     offload=False)


def test_the_largest_fitting_micro_batch_is_chosen_and_the_next_larger_does_not_fit(fit, gpt_tiny) -> None:
    module, inputs = gpt_tiny
    assert (fit.global_batch, fit.micro_batch, fit.steps) == (64, 8, 8)
    # the chosen plan fits every device, by the memory model
    assert fit.outcome.evaluation.feasible
    assert all(m["used"] <= m["capacity"] for m in fit.plan.memory.values())
    # the next larger candidate was solved and no placement fits it
    nxt = fit.next_larger
    assert nxt is not None and nxt.micro_batch == 16 and not nxt.fits
    assert "no placement fits" in nxt.reason
    # the same placement, evaluated with the model captured at micro-batch 16, puts a device over its cap
    over = evaluate_at(fit, module, inputs, 16)
    assert any(re.match(r"device (cpu|cuda:0) needs [\d,]+ bytes, over its capacity of 1,000,000", v)
               for v in over.violations), over.violations
    at_chosen = evaluate_at(fit, module, inputs, 8)
    assert at_chosen.feasible
    # activations scale with the batch: more bytes at 16 than at 8 on some device
    assert sum(over.memory.values()) > sum(at_chosen.memory.values())


def test_the_search_bisects_the_divisors(fit) -> None:
    tried = [t.micro_batch for t in fit.tried]
    assert tried[0] == 64 and tried[1] == 1  # the whole batch, then the smallest
    assert len(tried) <= 2 + 3  # 7 divisors of 64: bisection needs at most 3 more solves
    assert set(tried) <= set(candidates(64))
    assert all(t.fits == (t.micro_batch <= 8) for t in fit.tried)


def test_the_plan_records_micro_batch_and_steps_and_round_trips(fit) -> None:
    plan = fit.plan
    assert plan.batch["micro_batch"] == 8 and plan.batch["accumulation_steps"] == 8
    assert plan.batch["global_batch"] == 64 and plan.inputs[0].shape[0] == 8
    assert plan.batch["step_s"] == pytest.approx(fit.step_s)
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.batch == plan.batch
    assert "global 64 = 8 x micro-batch 8 (gradient accumulation)" in plan.summary()


def test_older_plans_without_a_batch_section_still_load(fit) -> None:
    d = json.loads(fit.plan.to_json())
    del d["batch"]
    plan = Plan.from_dict(d)
    assert plan.batch == {} and "batch" not in plan.to_dict()


@pytest.mark.parametrize("edit, words", [
    (lambda b: b.update(accumulation_steps=4), "is not global_batch 64"),
    (lambda b: b.update(micro_batch=16, accumulation_steps=4), "inputs have 8 rows"),
    (lambda b: b.update(steps=8), "unknown key"),
    (lambda b: b.update(micro_batch="8"), "expected a non-negative integer"),
])
def test_a_forged_batch_section_is_refused(fit, edit, words) -> None:
    d = json.loads(fit.plan.to_json())
    edit(d["batch"])
    with pytest.raises(PlanFormatError, match=words):
        Plan.from_dict(d)


def test_time_per_global_step_pays_the_optimizer_once(fit) -> None:
    out = fit.outcome
    one = global_step_seconds(out.problem, out.solution.placement, out.evaluation, 1)
    assert one == pytest.approx(out.evaluation.total_s)
    eight = global_step_seconds(out.problem, out.solution.placement, out.evaluation, 8)
    assert eight == pytest.approx(fit.step_s)
    assert 1 * one < eight < 8 * one  # the optimizer step is not repeated per micro-batch


def test_partition_batch_auto_gives_the_same_micro_batch(gpt_tiny) -> None:
    module, inputs = gpt_tiny
    tokens = inputs_at_batch(inputs, 16)
    plan = partition(module, tokens, "h200-host", memory=CAPS, training=True, batch="auto", time_limit=10,
                     recompute=False, offload=False)
    assert plan.batch["global_batch"] == 16 and plan.batch["micro_batch"] == 8
    fixed = partition(module, tokens, "h200-host", memory=CAPS, training=True, batch=4, time_limit=10)
    assert fixed.batch["micro_batch"] == 4 and fixed.batch["accumulation_steps"] == 4


def test_no_micro_batch_fits_names_the_device_the_bytes_at_micro_batch_1_and_the_cap() -> None:
    module, inputs = models.get("mlp", "tiny", device="meta")
    with pytest.raises(InfeasiblePlacement) as err:
        fit_batch(module, inputs, "h200-host", global_batch=16, memory={"cuda:0": "100KB", "cpu": "100KB"},
                  time_limit=10)
    text = str(err.value)
    assert "even micro-batch 1 does not" in text
    assert re.search(r"cuda:0 [\d,]+ bytes \(cap 100,000\)", text) and re.search(r"cpu [\d,]+ bytes \(cap 100,000\)",
                                                                                   text)


def test_inputs_are_rescaled_along_dimension_0() -> None:
    x = torch.arange(6).reshape(3, 2)
    scale = torch.tensor(2.0)
    big, same = inputs_at_batch((x, scale), 7)
    assert big.shape == (7, 2) and torch.equal(big[3], x[0]) and torch.equal(big[6], x[0])
    assert same is scale
    assert torch.equal(inputs_at_batch(x, 2)[0], x[:2])
    meta = inputs_at_batch(torch.zeros(2, 5, device="meta"), 8)[0]
    assert meta.shape == (8, 5) and meta.device.type == "meta"
    with pytest.raises(HetpartError, match="different first dimensions"):
        inputs_at_batch((torch.zeros(2, 3), torch.zeros(4, 3)), 8)


@pytest.mark.parametrize("global_batch, micro_batch, words", [
    (0, None, "global batch 0: expected a whole number of samples, at least 1"),
    (-4, None, "at least 1"),
    (True, None, "global batch True"),
    (8.0, None, "global batch 8.0"),
    (64, 3, "micro-batch 3 does not divide the global batch of 64.*use one of 1, 2, 4, 8, 16, 32, 64"),
    (64, 0, "micro-batch 0: expected a whole number"),
    (6, 12, "micro-batch 12 does not divide the global batch of 6"),
])
def test_bad_batches_are_refused(global_batch, micro_batch, words) -> None:
    with pytest.raises(HetpartError, match=words):
        check_batches(global_batch, micro_batch)


def test_fit_refuses_inference_pipelines_and_bad_batch_values(gpt_tiny) -> None:
    module, inputs = gpt_tiny
    with pytest.raises(HetpartError, match="pass training=True"):
        fit_batch(module, inputs, "h200-host", training=False)
    with pytest.raises(HetpartError, match="does not combine with micro_batches"):
        fit_batch(module, inputs, "h200-host", micro_batches=2)
    with pytest.raises(HetpartError, match="micro-batch 3 does not divide the global batch of 8"):
        fit_batch(module, inputs, "h200-host", global_batch=8, micro_batch=3)
    with pytest.raises(HetpartError, match="batch='auto'"):
        partition(module, inputs, "h200-host", training=True, batch="largest")


def test_hetpart_fit_prints_the_micro_batch_steps_memory_and_time(capsys, tmp_path) -> None:
    out_file = tmp_path / "plan.json"
    code = main(["fit", "gpt:tiny", "--training", "--global-batch", "16", "--memory", "cuda:0=1MB",
                 "--memory", "cpu=1MB", "--time-limit", "10", "--no-recompute", "--no-offload", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "global batch 16 = 2 x micro-batch 8 (gradient accumulation)" in out
    assert re.search(r"predicted +[\d.]+ \S+ per global step", out)
    assert re.search(r"memory +cpu .* of .*976.56 KiB", out) and re.search(r"memory +cuda:0 ", out)
    assert re.search(r"tried +micro-batch +16: does not fit: no placement fits", out)
    assert Plan.load(out_file).batch["accumulation_steps"] == 2


def test_hetpart_fit_in_bf16_fits_a_larger_micro_batch_under_the_same_caps(capsys, tmp_path) -> None:
    """The caps that hold gpt:tiny to micro-batch 8 in float32 (test above) fit all 16 in bfloat16."""
    out_file = tmp_path / "plan.json"
    code = main(["fit", "gpt:tiny", "--training", "--global-batch", "16", "--memory", "cuda:0=1MB",
                 "--memory", "cpu=1MB", "--time-limit", "10", "--precision", "cuda:0=bf16,cpu=bf16",
                 "--no-recompute", "--no-offload",
                 "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "global batch 16 = 1 x micro-batch 16" in out
    assert re.search(r"precision +cuda:0=bfloat16, cpu=bfloat16: \d+ in bfloat16 on", out)
    plan = Plan.load(out_file)
    assert plan.batch["micro_batch"] == 16 and plan.precision["ops"]


@pytest.mark.parametrize("argv, words", [
    (["--global-batch", "16", "--training", "--precision", "cuda:0=fp8"], "'fp8' is not a dtype"),
    (["--global-batch", "0", "--training"], "global batch 0: expected a whole number"),
    (["--global-batch", "64", "--micro-batch", "3", "--training"], "micro-batch 3 does not divide"),
    (["--global-batch", "64"], "pass --training"),
])
def test_hetpart_fit_refuses_bad_input_in_one_line(capsys, argv, words) -> None:
    code = main(["fit", "gpt:tiny", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and words in err and "Traceback" not in err


def test_a_training_step_that_fits_nowhere_suggests_a_smaller_micro_batch_not_streaming(gpt_tiny) -> None:
    """Weight streaming is for inference plans: the training error points to hetpart fit instead."""
    module, inputs = gpt_tiny
    with pytest.raises(InfeasiblePlacement) as err:
        partition(module, inputs, "h200-host", memory={"cuda:0": "100KB", "cpu": "100KB"}, training=True,
                  time_limit=5)
    assert "smaller micro-batch (hetpart fit" in str(err.value) and "streaming" not in str(err.value)
    with pytest.raises(InfeasiblePlacement, match="allow weight streaming"):  # where it is off
        partition(module, inputs, "h200-host", memory={"cuda:0": "10KB", "cpu": "10KB"}, streaming=False,
                  time_limit=5)
