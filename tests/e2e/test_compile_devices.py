"""The torch.compile backend on logical devices that really differ (strict devices).

Each plan's ``cpu`` and ``cuda:0`` are bound to distinct CPU tags (``cpu:1``, ``cpu:2``), so the
backend inserts its copies of inputs and model state as on a real GPU, and the compiled graphs run
under :class:`~backends.compile.strict.StrictCompile`: an op that reads a tensor from another
logical device, or runs away from its planned one, is an error. Outputs, gradients, an SGD step
over the caller's ``model.parameters()`` and BatchNorm's running statistics are compared with eager.
"""

from __future__ import annotations

import copy

import pytest
import torch

import models
from backends.compile import HetpartBackend
from backends.compile.state import StateCopies
from backends.compile.strict import StrictCompile
from tests.e2e.test_compile_backend import PROFILE, assert_same_gradients, leaves, split_caps, used_devices

DEVICES = ("cpu", "cuda:0")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def strict_compile(model: torch.nn.Module, run: StrictCompile, **options: object) -> torch.nn.Module:
    return torch.compile(model, backend=run.backend,
                         options={"devices": PROFILE, "device_map": run.device_map, **options})


def kept_copies(run: StrictCompile) -> dict[tuple[str, str], torch.Tensor]:
    out: dict[tuple[str, str], torch.Tensor] = {}
    for gm in run.graphs:
        state = getattr(gm, "_hetpart_state", None)
        if isinstance(state, StateCopies):
            out.update(state.held())
    return out


@pytest.mark.parametrize("name", models.names())
def test_inference_on_distinct_devices_gives_eager_outputs(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    run = StrictCompile(DEVICES, host="cpu")
    compiled = strict_compile(model, run, memory=split_caps(model, inputs))
    with torch.no_grad():
        with run:
            got = leaves(compiled(*inputs))
            assert all(run.mode.device_of(o) == "cpu" for o in got), "outputs come back where eager returns them"
            got_again = leaves(compiled(*inputs))  # the second call reads the kept copies
        expected = leaves(model(*inputs))
    for g, g2, e in zip(got, got_again, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(g2, e, rtol=1e-4, atol=1e-5)
    (record,) = run.backend.records
    assert used_devices(record.plan) == set(DEVICES)
    assert {(c.src, c.dst) for c in run.mode.copies} >= {("cpu", "cuda:0")}
    # weights read on cuda:0 are copied there once (bound to cpu:2) and kept; the caller's stay on the host
    kept = kept_copies(run)
    on_gpu = [op for op, d in record.plan.placement.items() if d == "cuda:0" and record.plan.param_names.get(op)]
    if any(op not in record.plan.weights for op in on_gpu):
        assert any(device == run.device_map["cuda:0"] for _, device in kept), "no weight kept on cuda:0"
    for (_, device), tensor in kept.items():
        assert run.mode.device_of(tensor) == {v: k for k, v in run.device_map.items()}[device]
    assert all(run.mode.device_of(p) == "cpu" for p in model.parameters())


@pytest.mark.parametrize("name", models.names())
def test_training_on_distinct_devices_gives_eager_gradients_step_and_buffers(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    reference = copy.deepcopy(model)
    run = StrictCompile(DEVICES, host="cpu")
    compiled = strict_compile(model, run, memory=split_caps(model, inputs, training=True), optimizer="sgd")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)          # the caller's parameters
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(2):
        with run:
            out = leaves(compiled(*inputs))
        loss = sum(o.float().sum() for o in out)
        loss_ref = sum(o.float().sum() for o in leaves(reference(*inputs)))
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-4, atol=1e-4, msg=f"loss at step {step}")
        assert_same_gradients(model, reference, step)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
        for (bname, b), (_, r) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
            torch.testing.assert_close(b, r, rtol=1e-4, atol=1e-5, msg=f"buffer {bname} after step {step}")
    for (pname, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"{pname} after two steps")
    plan = run.backend.records[0].plan
    assert plan.training and used_devices(plan) == set(DEVICES)
    assert {(c.src, c.dst) for c in run.mode.copies} >= {("cpu", "cuda:0")}


def test_batchnorm_statistics_updated_on_another_device_are_written_back() -> None:
    model, inputs = models.get("convnet", "tiny")
    model.train()
    reference = copy.deepcopy(model)
    bn = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bn, "convnet has batch norms"
    run = StrictCompile(DEVICES, host="cpu")
    # every op on cuda:0 (bound to cpu:2): each running statistic is updated in a copy there
    compiled = strict_compile(model, run, pins={"*": "cuda:0"}, optimizer="sgd")
    before = [m.running_mean.clone() for m in bn]
    with run:
        compiled(*inputs)
        written = [(c.src, c.dst) for c in run.mode.copies if c.src == "cuda:0" and c.dst == "cpu"]
    reference(*inputs)
    assert written, "the updated statistics are copied back to the caller's buffers"
    for m, old in zip(bn, before):
        assert not torch.equal(m.running_mean, old)
    for (bname, b), (_, r) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        torch.testing.assert_close(b, r, rtol=1e-4, atol=1e-5, msg=bname)


class _Moves(torch.nn.Module):
    """Moves its own state with one form of ``Tensor.to`` (rotary embeddings, biases)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 16, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 16))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.form == "keywords":        # Llama's rotary: inv_freq.to(device=x.device, dtype=torch.float)
            state = self.inv_freq.to(device=h.device, dtype=torch.float)
        elif self.form == "device":        # BART's final_logits_bias.to(logits.device)
            state = self.inv_freq.to(h.device).float()
        elif self.form == "dtype":
            state = self.inv_freq.to(torch.float32)
        elif self.form == "device_dtype":
            state = self.inv_freq.to(h.device, torch.float32)
        elif self.form == "flags":
            state = self.inv_freq.to(h.device, torch.float32, non_blocking=True, copy=True)
        elif self.form == "tensor":
            state = self.inv_freq.to(h)
        else:                              # "cpu": a device method
            state = self.inv_freq.cpu().float()
        return (h * state + self.bias.to(h.device)).tanh().sum(-1)


class _OwnMoves(torch.nn.Module):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.head = _Moves(form)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lin(x))


FORMS = ("keywords", "device", "dtype", "device_dtype", "flags", "tensor", "cpu")


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("form", FORMS)
def test_a_models_own_moves_of_its_state_compile_on_distinct_devices(form: str, training: bool) -> None:
    torch.manual_seed(0)
    model, x = _OwnMoves(form), torch.randn(4, 16)
    reference = copy.deepcopy(model)
    run = StrictCompile(DEVICES, host="cpu")
    # the linear on the host, everything after it on cuda:0: the moves of state run there
    compiled = strict_compile(model, run, pins={"lin": "cpu", "head": "cuda:0"}, optimizer="sgd")
    with torch.set_grad_enabled(training), run:
        out = compiled(x)
        assert run.mode.device_of(out) == "cpu"
    expected = reference(x)
    torch.testing.assert_close(out, expected)
    plan = run.backend.records[0].plan
    assert used_devices(plan) == set(DEVICES) and plan.training is training
    assert {(c.src, c.dst) for c in run.mode.copies} >= {("cpu", "cuda:0")}
    if training:
        out.sum().backward()
        expected.sum().backward()
        for (pname, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=f"grad of {pname}")


@pytest.mark.parametrize("form", FORMS)
def test_a_models_own_moves_compile_with_both_devices_bound_to_the_cpu(form: str) -> None:
    torch.manual_seed(0)
    model, x = _OwnMoves(form), torch.randn(4, 16)
    compiled = torch.compile(model, backend=HetpartBackend(), options={
        "devices": PROFILE, "device_map": {"cuda:0": "cpu"}, "pins": {"lin": "cpu", "head": "cuda:0"}})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
