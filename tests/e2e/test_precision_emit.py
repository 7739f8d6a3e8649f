"""End to end: emitted modules of precision plans, bound to the CPU (where torch runs bfloat16 and
float16 matmuls), against the float32 model within the documented 16-bit tolerances
(:mod:`backends.compare`), for inference and a training step; and checks that fail when a cast
the plan needs is missing."""

from __future__ import annotations

import pytest
import torch

import models
from backends.torch import precision as emitted_precision
from backends.torch.check import check_plan
from backends.torch.precision import SCALER_ATTR, LossScaler
from partitioner import partition

BF16 = {"cuda:0": "bf16", "cpu": "bf16"}


def _plan(name: str, size: str, precision, *, training: bool = False, **kwargs):  # noqa: ANN001, ANN202
    module, inputs = models.get(name, size)
    plan = partition(module, inputs, "h200-host", precision=precision, training=training, time_limit=30, **kwargs)
    return plan, module, inputs


@pytest.mark.parametrize("name,size", [("gpt", "tiny"), ("emb-transformer", "tiny"), ("mlp", "tiny")])
def test_inference_in_bf16_is_within_the_bf16_tolerance_on_strict_devices(name: str, size: str) -> None:
    plan, module, inputs = _plan(name, size, BF16, pins={"*": "cpu"} if name == "mlp" else None)
    assert plan.precision["ops"]
    report = check_plan(plan, module, inputs, repeat=1, strict_devices=True)
    assert report.passed, report.to_text()
    assert all(e.computed_in == "bfloat16" for e in report.outputs)
    assert all(e.max_rel > 0 for e in report.outputs if e.dtype == "float32")  # it really ran in 16 bits


def test_a_plan_split_over_two_devices_casts_at_its_dtype_boundaries() -> None:
    plan, module, inputs = _plan("gpt", "tiny", {"cuda:0": "bf16", "cpu": "fp32"}, pins={"blocks.1*": "cuda:0"})
    on_cpu = {op for op, d in plan.placement.items() if d == "cpu"}
    assert plan.precision["ops"] and not on_cpu & set(plan.precision["ops"])
    emitted = plan.emit(module, {"cuda:0": "cpu"})
    code = emitted.code
    assert "torch.bfloat16" in code and "torch.float32" in code
    out = emitted(*inputs)
    assert out.dtype == torch.float32
    report = check_plan(plan, module, inputs, {"cuda:0": "cpu"}, repeat=1)
    assert report.passed, report.to_text()


def test_inference_stores_16_bit_weights_and_training_keeps_float32_master_weights() -> None:
    plan, module, inputs = _plan("gpt", "tiny", BF16)
    emitted = plan.emit(module, {"cuda:0": "cpu"})
    dtypes = {p.dtype for name, p in emitted.named_parameters() if name.endswith("q_proj.weight")}
    assert dtypes == {torch.bfloat16}
    train_plan, module, inputs = _plan("gpt", "tiny", BF16, training=True)
    trained = train_plan.emit(module.train(), {"cuda:0": "cpu"})
    assert {p.dtype for p in trained.parameters()} == {torch.float32}
    sum(o.float().sum() for o in [trained(*inputs)]).backward()
    grads = [p.grad for p in trained.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
    assert not hasattr(trained, SCALER_ATTR)  # bfloat16 needs no loss scaling


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_training_step_is_within_the_16_bit_tolerance(dtype: str) -> None:
    plan, module, inputs = _plan("gpt", "tiny", {"cuda:0": dtype, "cpu": dtype}, training=True)
    report = check_plan(plan, module, inputs, {"cuda:0": "cpu"}, training=True, repeat=1)
    assert report.passed, report.to_text()
    assert report.grads and report.loss is not None


def test_float16_training_gets_a_loss_scaler_that_backs_off_on_overflow() -> None:
    plan, module, inputs = _plan("gpt", "tiny", {"cuda:0": "fp16", "cpu": "fp16"}, training=True)
    emitted = plan.emit(module.train(), {"cuda:0": "cpu"})
    scaler = getattr(emitted, SCALER_ATTR)
    assert isinstance(scaler, LossScaler) and scaler.scale == 2.0**16
    params = [p for p in emitted.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.0)
    for _ in range(30):  # the sum of all logits times 2**16 overflows float16 gradients: steps are skipped
        optimizer.zero_grad()
        scaler.scale_loss(emitted(*inputs).float().sum()).backward()
        if scaler.step(optimizer):
            break
    assert scaler.skipped >= 1 and scaler.scale < 2.0**16
    assert all(torch.isfinite(p.grad).all() for p in params if p.grad is not None)


def test_the_check_fails_when_the_cast_back_to_float32_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, module, inputs = _plan("gpt", "tiny", BF16)
    original = emitted_precision._Casts._cast_inputs

    def no_output_cast(self, node, want):  # noqa: ANN001, ANN202
        if node.op != "output":
            original(self, node, want)

    monkeypatch.setattr(emitted_precision._Casts, "_cast_inputs", no_output_cast)
    report = check_plan(plan, module, inputs, {"cuda:0": "cpu"}, repeat=1)
    assert not report.passed
    assert "dtype bfloat16" in report.outputs[0].note


def test_the_module_fails_when_a_weight_cast_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, module, inputs = _plan("gpt", "tiny", BF16, training=True)  # training: weights stay float32, cast per call
    original = emitted_precision._Casts._cast_inputs

    def no_weight_casts(self, node, want):  # noqa: ANN001, ANN202
        saved = {arg: self.held[arg] for arg in node.all_input_nodes if arg.op == "get_attr"}
        for arg in saved:
            self.held[arg] = want(arg)  # pretend the weights already hold the op's dtype: no cast
        original(self, node, want)
        self.held.update(saved)

    monkeypatch.setattr(emitted_precision._Casts, "_cast_inputs", no_weight_casts)
    with pytest.raises(RuntimeError, match="dtype|BFloat16|Float"):
        check_plan(plan, module, inputs, {"cuda:0": "cpu"}, training=True, repeat=1)


def test_casts_are_where_the_plan_says_and_no_more() -> None:
    plan, module, inputs = _plan("gpt", "tiny", BF16)
    emitted = plan.emit(module, {"cuda:0": "cpu"})
    casts = [n for n in emitted.graph.nodes if "hetpart_cast" in n.meta]
    assert casts
    # every cast changes the dtype: the value it reads holds another one
    for cast in casts:
        assert cast.args[1] in (torch.bfloat16, torch.float32)
    # the plan's inputs arrive in float32 and are cast once per reading dtype
    placeholders = [n for n in emitted.graph.nodes if n.op == "placeholder"]
    for p in placeholders:
        to_dtypes = [u for u in p.users if "hetpart_cast" in u.meta]
        assert len({u.args[1] for u in to_dtypes}) == len(to_dtypes)


@pytest.mark.parametrize("batch", [None, 2])
def test_bf16_training_of_a_relu_mlp_passes_though_its_first_gradient_crosses_relu_kinks(batch: int | None) -> None:
    """bfloat16 rounds some first-layer pre-activations across ReLU's 0, so the first layer's gradient
    is far from float32's elementwise (torch.autocast moves it just as far): judged norm-wise
    against autocast's error, the check passes, with micro-batches accumulated too."""
    plan, module, inputs = _plan("mlp", "tiny", {"cuda:0": "bf16", "cpu": "fp32"}, training=True,
                                 pins={"*": "cuda:0"}, batch=batch)
    report = check_plan(plan, module, inputs, {"cuda:0": "cpu"}, training=True, repeat=1)
    assert report.passed, report.to_text()
    first = next(e for e in report.grads if e.name == "layers.0.weight")
    assert first.max_rel > 0.05 and first.l2_rel is not None and first.l2_rel <= 2 * first.l2_autocast + 1.6e-2
    assert "vs autocast" in report.to_text()


def test_a_gradient_off_by_a_dropped_micro_batch_fails_the_16_bit_check() -> None:
    """The autocast allowance is not a free pass: an emitted module whose first-layer gradient is
    three quarters of the true one (one of four micro-batches lost) fails."""
    plan, module, inputs = _plan("mlp", "tiny", {"cuda:0": "bf16", "cpu": "fp32"}, training=True,
                                 pins={"*": "cuda:0"})

    def damaged(reference: torch.nn.Module) -> torch.nn.Module:
        emitted = plan.emit(reference, {"cuda:0": "cpu"})
        weight = dict(emitted.named_parameters())["layers.0.weight"]
        weight.register_hook(lambda g: g * 0.75)
        return emitted

    report = check_plan(plan, module, inputs, {"cuda:0": "cpu"}, training=True, repeat=1, build=damaged)
    assert not report.passed
    assert [e.name for e in report.failures()] == ["layers.0.weight"], report.to_text()
