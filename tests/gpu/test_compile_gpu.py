"""The torch.compile backend on a real GPU: plans split over the host and ``cuda:0``.

Skipped without CUDA (marker ``gpu``). The plan's ``cuda:0`` is the real device (no binding): the
backend's copies of inputs and model state cross the PCIe link. What each test shows:

* zoo models compiled for inference and for training give eager's outputs, gradients, parameters
  after an SGD step over the caller's ``model.parameters()``, and BatchNorm statistics;
* the model's state stays where the caller keeps it (the host): weights read on the GPU are
  kept there as copies (``StateCopies``) that really live on the GPU, and outputs come back on
  the device eager returns them on;
* a model's own moves of its state (``inv_freq.to(device=x.device, dtype=...)``, ``.to(x.device)``,
  ``.to(other)``, ``.cpu()``) run on the device its op is placed on.
"""

from __future__ import annotations

import copy

import pytest
import torch

import models
from backends.compile import HetpartBackend
from backends.compile.state import StateCopies
from tests.e2e.test_compile_backend import PROFILE, leaves, split_caps, used_devices
from tests.e2e.test_compile_devices import FORMS, _OwnMoves

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ZOO = ("mlp", "convnet", "gpt", "t5", "moe")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(model: torch.nn.Module, backend: HetpartBackend, graphs: list, **options: object) -> torch.nn.Module:
    def spy(gm, example_inputs, options=None, mode=None):  # noqa: ANN001 - dynamo's backend signature
        out = backend(gm, example_inputs, options, mode)
        graphs.append(out)
        return out

    spy.__name__ = "hetpart"
    return torch.compile(model, backend=spy, options={"devices": PROFILE, **options})


def _kept(graphs: list) -> dict:
    out = {}
    for gm in graphs:
        state = getattr(gm, "_hetpart_state", None)
        if isinstance(state, StateCopies):
            out.update(state.held())
    return out


@pytest.mark.parametrize("name", ZOO)
def test_inference_split_over_the_gpu_keeps_weights_there(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    backend, graphs = HetpartBackend(), []
    compiled = _compiled(model, backend, graphs, memory=split_caps(model, inputs))
    with torch.no_grad():
        got, got_again, expected = leaves(compiled(*inputs)), leaves(compiled(*inputs)), leaves(model(*inputs))
    for g, g2, e in zip(got, got_again, expected, strict=True):
        assert g.device == e.device
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(g2, e, rtol=1e-3, atol=1e-4)
    assert all(used_devices(r.plan) == {"cpu", "cuda:0"} for r in backend.records)
    assert all(p.device.type == "cpu" for p in model.parameters()), "the caller's weights are never moved"
    for (tensor, device), copy_ in _kept(graphs).items():
        assert copy_.device == torch.device(device), f"{tensor} kept on {copy_.device}, not {device}"
    assert any(c.is_cuda for c in _kept(graphs).values()) or not any(
        d == "cuda:0" and r.plan.param_names.get(op) for r in backend.records for op, d in r.plan.placement.items())


@pytest.mark.parametrize("name", ZOO)
def test_training_split_over_the_gpu_matches_eager(name: str) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()
    reference = copy.deepcopy(model)
    backend, graphs = HetpartBackend(), []
    compiled = _compiled(model, backend, graphs, memory=split_caps(model, inputs, training=True), optimizer="sgd")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(2):
        loss = sum(o.float().sum() for o in leaves(compiled(*inputs)))
        loss_ref = sum(o.float().sum() for o in leaves(reference(*inputs)))
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-3, atol=1e-3, msg=f"loss at step {step}")
        for (pname, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
            if q.grad is not None:
                assert p.grad is not None and p.grad.device == p.device, pname
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=f"grad of {pname}")
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    for (bname, b), (_, r) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        torch.testing.assert_close(b, r, rtol=1e-3, atol=1e-4, msg=bname)
    for (pname, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4, msg=pname)
    assert backend.records[0].plan.training and used_devices(backend.records[0].plan) == {"cpu", "cuda:0"}


@pytest.mark.parametrize("form", FORMS)
def test_a_models_own_moves_run_on_the_gpu(form: str) -> None:
    torch.manual_seed(0)
    model, x = _OwnMoves(form), torch.randn(4, 16)
    backend, graphs = HetpartBackend(), []
    compiled = _compiled(model, backend, graphs, pins={"lin": "cpu", "head": "cuda:0"})
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
    assert out.device.type == "cpu"
    out.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "cpu" for p in model.parameters())
