"""End to end: ``torch.compile(model, backend="hetpart")`` gives eager outputs and gradients.

Every plan runs on two logical devices (``h200-host``: cpu and cuda:0, cuda:0 bound to the CPU)
under caps that no single device meets, so each graph is split.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models
from backends.compile import HetpartBackend, hetpart
from partitioner import Plan, partition_outcome
from partitioner.cli import main as cli_main

PROFILE = "h200-host"
BIND = {"cuda:0": "cpu"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # each test compiles its own graphs (and stays under dynamo's recompile limit)
    yield
    torch._dynamo.reset()


def split_caps(model: torch.nn.Module, inputs: tuple, training: bool = False) -> dict[str, int]:
    """Caps on cpu and cuda:0 below what one device needs for the model, above its largest op."""
    single = partition_outcome(model, inputs, PROFILE, solver="single:cpu", training=training, optimizer="sgd")
    used = single.plan.memory["cpu"]["used"]
    cap = max(int(used * 0.85), max(single.problem.work_mem.values()) + 4096)
    return {"cpu": cap, "cuda:0": cap}


def compile_with(model: torch.nn.Module, backend: HetpartBackend, **options: object) -> torch.nn.Module:
    return torch.compile(model, backend=backend, options={"devices": PROFILE, "device_map": BIND, **options})


def leaves(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in value if isinstance(t, torch.Tensor)]  # type: ignore[union-attr]


def assert_same_gradients(model: torch.nn.Module, reference: torch.nn.Module, step: int) -> None:
    """Every parameter's gradient equals the eager reference's (None where it has none)."""
    for (pname, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, pname
            continue
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"grad of {pname} at step {step}")


def used_devices(plan: Plan) -> set[str]:
    return set(plan.placement.values())


@pytest.mark.parametrize("name", models.names())
def test_every_zoo_model_compiles_split_and_gives_eager_outputs(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    backend = HetpartBackend()
    compiled = compile_with(model, backend, memory=split_caps(model, inputs))
    with torch.no_grad():
        got, expected = leaves(compiled(*inputs)), leaves(model(*inputs))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    assert len(backend.records) == 1 and backend.solves == 1
    plan = backend.records[0].plan
    assert used_devices(plan) == {"cpu", "cuda:0"}, "the caps must force a split"
    assert not plan.training  # compiled under no_grad: an inference plan


@pytest.mark.parametrize("name", models.names())
def test_training_gives_eager_loss_and_gradients_over_three_steps(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    reference = copy.deepcopy(model)
    backend = HetpartBackend()
    compiled = compile_with(model, backend, memory=split_caps(model, inputs, training=True), optimizer="sgd")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)          # the original parameters
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(3):
        loss = sum(o.float().sum() for o in leaves(compiled(*inputs)))
        loss_ref = sum(o.float().sum() for o in leaves(reference(*inputs)))
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-4, atol=1e-4, msg=f"loss at step {step}")
        assert_same_gradients(model, reference, step)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    for (pname, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"{pname} after three steps")
    plan = backend.records[0].plan
    assert plan.training and used_devices(plan) == {"cpu", "cuda:0"}
    assert backend.solves == 1  # three steps, one plan


class _WithBreak(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x).relu()
        torch._dynamo.graph_break()  # a deliberate break: dynamo hands over two graphs
        return self.b(y).tanh()


def test_a_graph_break_is_planned_per_graph_and_correct() -> None:
    torch.manual_seed(0)
    model, x = _WithBreak(), torch.randn(4, 16)
    backend = HetpartBackend()
    compiled = compile_with(model, backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        compiled(x)
    assert [r.plan_from for r in backend.records] == ["solved", "solved"]
    first, second = (r.plan for r in backend.records)
    assert first.fingerprint != second.fingerprint
    assert len(first.placement) == 2 and len(second.placement) == 2  # linear + relu | linear + tanh


def test_later_calls_and_recompiles_do_not_replan(monkeypatch: pytest.MonkeyPatch) -> None:
    import backends.compile.backend as backend_module

    calls: list[str] = []
    solve = backend_module.partition_outcome

    def counting(*args: object, **kwargs: object):  # counts every solver call, then solves
        calls.append(str(kwargs.get("model_name")))
        return solve(*args, **kwargs)

    monkeypatch.setattr(backend_module, "partition_outcome", counting)
    model, inputs = models.get("gpt", "tiny")
    backend = HetpartBackend()
    options = {"memory": split_caps(model, inputs)}
    with torch.no_grad():
        compiled = compile_with(model, backend, **options)
        first = compiled(*inputs)
        compiled(*inputs)                                           # the same graph: no compile at all
        twin = models.get("gpt", "tiny", seed=1)[0]  # other weights, same graph: its own weights are read
        torch.testing.assert_close(compile_with(twin, backend, **options)(*inputs), twin(*inputs))
        torch._dynamo.reset()                         # dynamo forgets its graphs and hands this one over again
        torch.testing.assert_close(compile_with(model, backend, **options)(*inputs), first)
    assert len(calls) == 1 and backend.solves == 1
    assert [r.plan_from for r in backend.records] == ["solved", "memory"]
    assert all(r.plan is backend.records[0].plan for r in backend.records)


def test_a_changed_batch_size_gets_its_own_plan() -> None:
    model, _ = models.get("mlp", "tiny")
    backend = HetpartBackend()
    compiled = compile_with(model, backend)
    with torch.no_grad():
        for batch in (8, 32, 8, 16, 32):
            x = torch.randn(batch, 64)
            torch.testing.assert_close(compiled(x), model(x))
    solved = [r.plan.inputs[-1][0][0] for r in backend.records if r.plan_from == "solved"]
    assert sorted(solved) == [8, 16, 32], "each batch size is planned once, a size seen before is not"
    # the second size made dynamo recompile with a dynamic batch: one graph, a plan per size
    assert {r.name for r in backend.records if r.plan.inputs[-1][0][0] != 8} == {"MLP [0/1] (layers.0 … layers.4)"}


def test_dynamic_true_plans_each_shape_once() -> None:
    model, _ = models.get("mlp", "tiny")
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, dynamic=True, options={"devices": PROFILE, "device_map": BIND})
    with torch.no_grad():
        for batch in (4, 12, 4, 12):
            x = torch.randn(batch, 64)
            torch.testing.assert_close(compiled(x), model(x))
    assert backend.solves == 2 and len(backend.records) == 2


def _run(code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr + done.stdout


_OTHER_PROCESS = """
import logging, sys, torch, models
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
model, inputs = models.get("gpt", "tiny")
compiled = torch.compile(model, backend="hetpart", options={options})   # by name: no hetpart import
with torch.no_grad():
    torch.testing.assert_close(compiled(*inputs), model(*inputs))
print("ok")
"""


def test_plan_dir_is_reused_by_another_process_and_stale_files_are_solved_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, inputs = models.get("gpt", "tiny")
    options = {"devices": PROFILE, "device_map": BIND, "memory": split_caps(model, inputs),
               "plan_dir": str(tmp_path / "plans")}
    backend = HetpartBackend()
    with torch.no_grad():
        torch.compile(model, backend=backend, options=options)(*inputs)
    (saved,) = (tmp_path / "plans").iterdir()
    assert backend.records[0].path == str(saved) and Plan.load(saved) == backend.records[0].plan

    out = _run(_OTHER_PROCESS.replace("{options}", json.dumps(options)), tmp_path)
    assert "ok" in out and "plan cache hit (disk)" in out and "solved in" not in out, out

    # cached plans are ordinary plan files: report and explain read them
    assert cli_main(["report", str(saved), "-o", str(tmp_path / "report.html")]) == 0
    assert cli_main(["explain", str(saved), "blocks.0"]) == 0

    for bad, why in ((b"{ not json", "corrupt"), (None, "stale")):
        if bad is None:  # a valid plan of another graph, same options, at this graph's key
            other, other_inputs = models.get("mlp", "tiny")
            other_backend = HetpartBackend()
            same = {k: v for k, v in options.items() if k != "plan_dir"}
            with torch.no_grad():
                torch.compile(other, backend=other_backend, options=same)(*other_inputs)
            bad = other_backend.records[0].plan.to_json().encode()
        saved.write_bytes(bad)
        torch._dynamo.reset()
        fresh = HetpartBackend()
        with caplog.at_level(logging.WARNING, logger="hetpart"), torch.no_grad():
            result = torch.compile(model, backend=fresh, options=options)(*inputs)
        torch.testing.assert_close(result, model(*inputs))
        assert fresh.solves == 1, f"a {why} cached plan is solved again"
        assert any(str(saved) in r.getMessage() and "solving again" in r.getMessage() for r in caplog.records)
        assert Plan.load(saved) == fresh.records[0].plan, f"the {why} file is replaced by the new plan"
        caplog.clear()


def test_the_entry_point_finds_the_backend_by_name() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("hetpart") is hetpart


def _small_transformers():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_huggingface_models_from_small_configs_match_eager(arch: str) -> None:
    tf = _small_transformers()
    torch.manual_seed(0)
    if arch == "gpt2":
        config = tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64, use_cache=False,
                               bos_token_id=0, eos_token_id=0)
        model = tf.GPT2LMHeadModel(config).eval()
    else:
        config = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                               vocab_size=256, max_position_embeddings=64)
        model = tf.BertModel(config).eval()
    ids = torch.randint(0, 256, (2, 16))
    cap = int(sum(p.numel() * p.element_size() for p in model.parameters()) * 0.7)  # no device holds them all
    backend = HetpartBackend()
    compiled = compile_with(model, backend, memory={"cpu": cap, "cuda:0": cap})
    with torch.no_grad():
        got, expected = compiled(ids), model(ids)
    names = ["logits"] if arch == "gpt2" else ["last_hidden_state", "pooler_output"]
    for name in names:
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=1e-4, atol=1e-5)
    assert backend.solves == len(backend.records) >= 1
    assert all(used_devices(r.plan) == {"cpu", "cuda:0"} for r in backend.records)
