"""A training plan holding saved activations on the host, emitted and run: the listed ops run under
saved-tensor hooks that copy what autograd saves to the host in forward and back in backward;
outputs and gradients equal the same module without the hooks bit for bit and the original within
tolerance; a strict run records the copies out; ``hetpart check --training --strict-devices``
passes; the generated file runs them through the same hooks."""

from __future__ import annotations

import pytest
import torch

import models
from backends.strict_training import observe_params, training_state_report
from backends.torch.saved_on_host import TARGET_META, run_holding
from backends.torch.strict import StrictRun
from partitioner import partition
from partitioner.cli import main

#: gpt:small's parameters with Adam, half its saved activations and its largest working set
CAP = {"cuda:0": 84_632_576 + 14_090_240 + 8_650_752}
ONLY = dict(recompute=False, offload=False, streaming=False, save_on_host=True)


@pytest.fixture(scope="module")
def held():
    model, inputs = models.get("gpt", "small")
    plan = partition(model, inputs, "h200-host", memory=CAP, training=True, time_limit=20, **ONLY)
    assert plan.training_state.get("saved_on_host")
    return model.train(), inputs, plan


def _without_hooks(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``module``'s held ops calling their own targets again (the same weights, no hooks)."""
    import copy

    plain = copy.deepcopy(module.graph)
    for node in plain.nodes:
        if node.target is run_holding:
            node.target, node.args = node.meta[TARGET_META], node.args[3:]
    return torch.fx.GraphModule(module, plain)


def test_held_ops_copy_what_autograd_saves_and_change_nothing(held) -> None:
    model, inputs, plan = held
    run = StrictRun(plan)
    with run:
        module = run.watch(plan.emit(model, run.device_map))
    wrapped = [n.name for n in module.graph.nodes if n.target is run_holding]
    assert sorted(wrapped) == sorted(plan.training_state["saved_on_host"])
    with run:
        got = run.step(module, *inputs)
    report = run.report()
    assert report.passed, report.to_text()
    row = next(r for r in report.links if r.kind == "saved")
    assert (row.src, row.dst) == ("cuda:0", "cpu") and row.copies >= 1 and row.plan_copies == len(wrapped)
    assert "cuda:0->cpu (saved activations)" in report.to_text()
    got.float().sum().backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    lines = training_state_report(plan, observe_params(run.mode, module, plan))
    assert f"  saved activations on the host: {', '.join(plan.training_state['saved_on_host'])}" in lines[-1]

    plain = _without_hooks(module)  # the same parameters: their gradients start again from zero
    plain.zero_grad()
    again = plain(*inputs)
    again.float().sum().backward()
    assert torch.equal(got, again)
    for name, p in plain.named_parameters():
        assert torch.equal(grads[name], p.grad), name

    model.zero_grad()
    expected = model(*inputs)
    expected.float().sum().backward()
    torch.testing.assert_close(got, expected)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=f"gradient of {name}")


def test_without_autograd_nothing_is_copied(held) -> None:
    model, inputs, plan = held
    run = StrictRun(plan)
    with run:
        module = run.watch(plan.emit(model, run.device_map))
    with torch.no_grad(), run:
        run.step(module, *inputs)
    assert not [c for c in run.mode.copies if c.kind == "saved"]


def test_hetpart_check_passes_under_strict_devices_and_over_three_steps(held, tmp_path, capsys) -> None:
    _, _, plan = held
    path = plan.save(tmp_path / "plan.json")
    code = main(["check", "gpt:small", "--plan", str(path), "--training", "--strict-devices"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "cuda:0->cpu (saved activations)" in out and out.splitlines()[-1].startswith("passed")
    code = main(["check", "gpt:small", "--plan", str(path), "--training", "--steps", "3", "--bind", "cuda:0=cpu:1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[-1].startswith("passed: loss and every parameter within tolerance after each of 3 steps")


def test_the_generated_file_holds_them_too(held, tmp_path) -> None:
    import importlib.util

    from backends.torch.source import op_lines

    model, inputs, plan = held
    run = StrictRun(plan)
    path = plan.emit_source(tmp_path / "held.py", model, run.device_map)
    text = path.read_text(encoding="utf-8")
    assert "from backends.torch.saved_on_host import run_holding" in text
    assert text.count("run_holding(DEVICE_CPU, DEVICE_CUDA_0, torch.ops.") == len(plan.training_state["saved_on_host"])
    spec = importlib.util.spec_from_file_location("hetpart_held_source", path)
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    with run:
        module = run.watch(generated.build(model), op_lines(plan, model, run.device_map))
        got = run.step(module, *inputs)
    report = run.report()
    assert report.passed, report.to_text()
    assert next(r for r in report.links if r.kind == "saved").copies >= 1
    got.float().sum().backward()
    model.zero_grad()
    expected = model(*inputs)
    expected.float().sum().backward()
    torch.testing.assert_close(got, expected)
    grads = dict(module.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, msg=f"gradient of {name}")
