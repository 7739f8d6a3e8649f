"""End to end: emitted modules and generated files follow a training plan's ``training_state``.

For gpt:small, the seed model emb-transformer:small and a transformers Llama from a small config,
a training plan (made by hand, :mod:`tests.e2e.train_plans`) puts most ops on ``cuda:0`` and the
second block on ``npu:0``, streams the position or token embedding and two linears from the host,
updates the embedding table row-sparsely, keeps one parameter's optimizer state on the host and
recomputes the first block's MLP (with the fetch of a streamed weight inside it) and a second run.
``plan.emit`` and ``plan.emit_source`` run it under strict devices (every logical device its own
CPU tag: each copy is real and checked); outputs and every gradient equal the original's (a
row-sparse gradient compared after ``to_dense()``), the copies and resident bytes are the plan's,
a streamed weight's device copy is not alive after forward (it is fetched again in backward),
and the training-state table shows where each weight, gradient and state lives.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

import models
from backends.strict_training import observe_params, training_state_report
from backends.torch.recompute import recompute_regions
from backends.torch.source import op_lines
from backends.torch.strict import StrictRun
from partitioner import Plan
from partitioner.errors import HetpartError
from tests.e2e.train_plans import training_plan, with_training_state

_counter = itertools.count()


class Logits(nn.Module):
    """A transformers causal LM called with token ids positionally, returning its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def _llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=256, tie_word_embeddings=False,
                                      use_cache=False, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Logits(transformers.LlamaForCausalLM(config))
    return model, (torch.randint(0, 256, (2, 16)),)


def _zoo(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return models.get(name, "small")


#: model -> (build, the row-sparse table)
MODELS = {"gpt": (lambda: _zoo("gpt"), "pos_emb.weight"),  # tok_emb.weight is tied to lm_head: dense
          "emb-transformer": (lambda: _zoo("emb-transformer"), "emb.weight"),
          "llama": (_llama, "model.model.embed_tokens.weight")}


@dataclasses.dataclass
class Case:
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    plan: Plan
    sparse: str
    streamed: list[str]       # ops whose weights stream from the host
    recompute: list[str]


def _ops_in(plan: Plan, block: str, part: str) -> list[str]:
    """The ops of ``plan`` in module paths holding ``block`` (".0.") and ``part`` ("mlp")."""
    return [op for op in plan.schedule if block in plan.modules.get(op, "") and part in plan.modules.get(op, "")]


def _case(name: str) -> Case:
    build, sparse = MODELS[name]
    model, inputs = build()
    model.train()
    base = training_plan(model, inputs)
    owner = next(op for op, names in base.param_names.items() if sparse in names)
    second = [op for op in base.schedule if ".1." in base.modules.get(op, "")]
    mlp = _ops_in(base, ".0.", "mlp")
    attention = [op for op in _ops_in(base, ".1.", "attn") if base.param_names.get(op)]
    streamed = [owner, next(op for op in mlp if base.param_names.get(op)), attention[0]]
    norm = [op for op in _ops_in(base, ".1.", "") if base.param_names.get(op)][:1]  # the second block's first norm
    plan = training_plan(model, inputs, device={op: "npu:0" for op in second}, streamed=streamed)
    recompute = [*mlp, *norm]
    host_state = [base.param_names[attention[-1]][0]]
    plan = with_training_state(plan, model, sparse=[sparse], state_on_host=host_state, recompute=recompute)
    return Case(model, inputs, plan, sparse, streamed, recompute)


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request: pytest.FixtureRequest) -> Case:
    return _case(request.param)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"hetpart_trained_{next(_counter)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built(case: Case, run: StrictRun, backend: str, tmp_path: Path) -> nn.Module:
    if backend == "emit":
        with run:
            return run.watch(case.plan.emit(case.model, run.device_map))
    path = case.plan.emit_source(tmp_path / "trained.py", case.model, run.device_map)
    text = path.read_text(encoding="utf-8")
    assert "sparse=True" in text and "torch.utils.checkpoint.checkpoint(" in text and "TrainingStreamer(" in text
    with run:
        generated = _load(path).build(case.model)
    return run.watch(generated, op_lines(case.plan, case.model, run.device_map))


def _watch_fetches(module: nn.Module) -> list[weakref.ref]:
    """Weak references to every weight copy the module's streamer hands out from now on."""
    streamer = module._hetpart_streamer
    fetched: list[weakref.ref] = []
    get = streamer.get

    def recording(target: str, device: Any) -> torch.Tensor:
        tensor = get(target, device)
        fetched.append(weakref.ref(tensor))
        return tensor

    streamer.get = recording
    return fetched


@pytest.mark.parametrize("backend", ["emit", "source"])
def test_training_state_runs_as_planned_and_equals_the_original(case: Case, backend: str, tmp_path: Path) -> None:
    run = StrictRun(case.plan)
    module = _built(case, run, backend, tmp_path)
    if backend == "emit":
        assert len(list(recompute_regions(module))) == 2, "one checkpoint per run of recomputed ops"
    fetched = _watch_fetches(module)
    case.model.zero_grad()
    expected = case.model(*case.inputs)
    expected.float().sum().backward()
    with run:
        got = run.step(module, *case.inputs)
    report = run.report()
    assert report.passed, report.to_text()
    torch.testing.assert_close(got, expected)

    assert len(fetched) >= len(case.streamed) and all(ref() is None for ref in fetched), \
        "a streamed weight's device copy outlived forward"
    got.float().sum().backward()
    assert module._hetpart_streamer.refetches >= 1, "backward fetched no streamed weight again"
    ours = dict(module.named_parameters())
    for name, p in case.model.named_parameters():
        grad = ours[name].grad
        assert grad is not None, name
        if name == case.sparse:
            assert grad.is_sparse, f"{name}: a dense gradient for a row-sparse update"
            assert grad.coalesce().indices().shape[1] <= case.inputs[0].numel(), "rows beyond the batch's tokens"
            grad = grad.to_dense()
        else:
            assert not grad.is_sparse, name
        torch.testing.assert_close(grad, p.grad, msg=f"gradient of {name}")

    observed = observe_params(run.mode, module, case.plan)
    lines = training_state_report(case.plan, observed)
    assert not any("DIFFERS" in line for line in lines), "\n".join(lines)
    row = next(line for line in lines if line.strip().startswith(case.sparse + " "))
    assert row.split()[-4:] == ["cpu", "sparse", "-", "ok"], row  # the streamed table lives on the host
    assert any(line.split()[5] == "cpu" and line.split()[3] == "npu:0" for line in lines[2:] if "dense" in line), \
        "the parameter whose state the plan keeps on the host"


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_recomputed_dropout_draws_its_forward_mask_again() -> None:
    """Dropout inside a checkpointed run: backward's recomputation restores the RNG, so outputs
    and gradients equal the original's under the same seed; under no_grad the run just runs."""
    torch.manual_seed(0)
    model = Dropped().train()
    x = torch.randn(8, 16)
    plan = training_plan(model, (x,), device={"linear_1": "npu:0"}, streamed=["linear"])
    plan = with_training_state(plan, model, recompute=["linear", "dropout", "gelu"])
    run = StrictRun(plan)
    with run:
        emitted = run.watch(plan.emit(model, run.device_map))
    torch.manual_seed(1)
    expected = model(x)
    expected.sum().backward()
    torch.manual_seed(1)
    with run:
        got = run.step(emitted, x)
    assert run.report().passed, run.report().to_text()
    torch.testing.assert_close(got, expected)
    got.sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(emitted.get_parameter(name).grad, p.grad, msg=name)
    with torch.no_grad():
        torch.manual_seed(2)
        again = emitted(x)
        torch.manual_seed(2)
        torch.testing.assert_close(again, model(x))


# -- bad input ---------------------------------------------------------------------------------


def _small(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model, inputs = models.get(name, "tiny")
    return model.train(), inputs


def test_a_sparse_update_of_a_non_gather_op_is_refused(tmp_path: Path) -> None:
    model, inputs = _small("emb-transformer")
    plan = with_training_state(training_plan(model, inputs), model, sparse=["layers.0.attn.q_proj.weight"])
    with pytest.raises(HetpartError, match=r"layers\.0\.attn\.q_proj\.weight a sparse update, but its op linear .* "
                                           r"is no gather .*set its update to 'dense'"):
        plan.emit(model, {"cuda:0": "cpu:1", "npu:0": "cpu:2"})
    with pytest.raises(HetpartError, match="is no gather"):
        plan.emit_source(tmp_path / "bad.py", model, {"cuda:0": "cpu:1", "npu:0": "cpu:2"})
    assert not (tmp_path / "bad.py").exists()


def test_a_sparse_update_of_a_tied_table_is_refused(tmp_path: Path) -> None:
    model, inputs = _small("gpt")  # tok_emb.weight is lm_head.weight
    plan = with_training_state(training_plan(model, inputs), model, sparse=["tok_emb.weight"])
    for build in (lambda: plan.emit(model, {"cuda:0": "cpu:1"}),
                  lambda: plan.emit_source(tmp_path / "tied.py", model, {"cuda:0": "cpu:1"})):
        with pytest.raises(HetpartError, match=r"tok_emb\.weight is also read by linear_\d+ \(tied weights\): its "
                                               r"gradient is .* dense"):
            build()


def test_recompute_in_an_inference_plan_is_refused_when_the_plan_is_made() -> None:
    model, inputs = _small("mlp")
    training = with_training_state(training_plan(model, inputs), model, recompute=["linear"])
    inference = dataclasses.replace(training, training_state={}, training=False)
    with pytest.raises(HetpartError, match="an inference plan has no training state; re-plan with training=True"):
        dataclasses.replace(inference, training_state=training.training_state)


def test_recomputing_a_batch_norm_in_training_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    plan = with_training_state(training_plan(model, (torch.randn(8, 4),)), model, recompute=["batch_norm"])
    with pytest.raises(HetpartError, match=r"cannot recompute batch_norm .* updates running statistics"):
        plan.emit(model, {"cuda:0": "cpu:1"})


def test_the_training_check_shows_each_parameters_state_beside_the_run() -> None:
    """``check_plan(..., training=True, strict_devices=True)``: the row-sparse gradient is compared
    as the dense one it equals, and the report's table says where each weight, gradient and state
    lives, the run's weight device and gradient layout beside the plan's."""
    from backends.torch import check_plan

    model, inputs = _small("emb-transformer")
    plan = training_plan(model, inputs, streamed=["embedding"])
    plan = with_training_state(plan, model, sparse=["emb.weight"], state_on_host=["layers.0.mlp.ff1.weight"],
                               recompute=["gelu"])
    report = check_plan(plan, model, inputs, training=True, strict_devices=True, repeat=1)
    text = report.to_text()
    assert report.passed, text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("  ") and len(line.split()) == 11}
    assert rows["emb.weight"][1:] == ["embedding", "cuda:0", "cpu", "cpu", "cpu", "sparse", "cpu", "sparse", "-", "ok"]
    assert rows["layers.0.mlp.ff1.weight"][3:7] == ["cuda:0", "cpu", "cpu", "dense"]
    assert len(rows) == len(list(model.parameters()))
