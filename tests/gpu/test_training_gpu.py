"""Training under a memory cap on a real GPU: the placed optimizer's CUDA path.

Skipped without CUDA (marker ``gpu``; ``bench/gpu_check.py`` runs these first). What each test shows:

* a plan the ILP made under a cap (optimizer state on the host for some parameters, streamed
  weights, a row-sparse embedding update) trains as eager torch does for three steps through
  ``plan.emit_optimizer``, on the GPU: gradients copied out on a side stream as backward makes
  them, host steps on the worker, updated weights copied back in pinned memory before the next
  forward reads them;
* the offloaded parameters' masters and optimizer state live in host memory, and their device
  gradients are freed once copied out;
* the host steps run beside backward: some of the worker's time falls before ``step()`` is called;
* streamed optimizer states (kept on the host, stepped on the GPU) train as eager and wait in pinned
  host memory between steps.
"""

from __future__ import annotations

import copy

import pytest
import torch

import models
from partitioner import partition

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().mean()


@pytest.fixture(scope="module")
def planned():
    model, inputs = models.get("emb-transformer", "small")
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "6MB"}, training=True, optimizer="adam",
                     time_limit=20)
    host = plan.devices.host_device().name
    assert any(ps["state"] == host and ps["compute"] == "cuda:0" for ps in plan.training_state["params"].values())
    return model, inputs, plan


def test_the_placed_optimizer_trains_as_eager_on_the_gpu(planned) -> None:
    model, inputs, plan = planned
    emitted = plan.emit(copy.deepcopy(model).train())
    opt = plan.emit_optimizer(emitted, lr=1e-3)
    reference = copy.deepcopy(model).cuda().train()
    eager = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        _loss(emitted(*inputs)).backward()
        opt.step()
        eager.zero_grad()
        _loss(reference(*(t.cuda() for t in inputs))).backward()
        eager.step()
        trained = dict(emitted.named_parameters())
        for name, p in reference.named_parameters():
            torch.testing.assert_close(trained[name].detach().cuda(), p.detach(), rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")
    assert opt.last_timing.host_busy_s > 0


def test_offloaded_state_lives_in_pinned_host_memory_and_device_gradients_are_freed(planned) -> None:
    model, inputs, plan = planned
    emitted = plan.emit(copy.deepcopy(model).train())
    opt = plan.emit_optimizer(emitted, lr=1e-3)
    _loss(emitted(*inputs)).backward()
    offloaded = [r for r in opt.placement() if r.state != r.weights]
    assert offloaded
    params = dict(emitted.named_parameters())
    for row in offloaded:
        if params[row.name].device.type == "cuda":
            assert params[row.name].grad is None, row.name  # copied out and freed in backward
    opt.step()
    for row in opt.placement():
        if row.state != row.weights:
            assert row.found_on.startswith("cpu"), row  # master and optimizer state in host memory


def test_streamed_state_steps_on_the_gpu_as_eager_and_waits_in_pinned_host_memory() -> None:
    """gpt:small at three times its parameter bytes: the ILP keeps some optimizer state on the
    host and streams it to cuda:0 for each step (side stream, pinned memory). Three Adam steps equal
    eager training on the GPU; between steps the streamed moments are pinned host tensors."""
    model, inputs = models.get("gpt", "small")
    cap = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": cap}, training=True, optimizer="adam",
                     time_limit=20)
    streamed = [n for n, ps in plan.training_state["params"].items() if ps["state"] == "cpu" and ps["step"] == "cuda:0"]
    assert streamed
    emitted = plan.emit(copy.deepcopy(model).train())
    opt = plan.emit_optimizer(emitted, lr=1e-3)
    reference = copy.deepcopy(model).cuda().train()
    eager = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        _loss(emitted(*inputs)).backward()
        opt.step()
        eager.zero_grad()
        _loss(reference(*(t.cuda() for t in inputs))).backward()
        eager.step()
    trained = dict(emitted.named_parameters())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(trained[name].detach().cuda(), p.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    opt.state_dict()  # waits for the last trip back
    for name in streamed:
        p = emitted.get_parameter(name)
        assert p.device.type == "cuda"
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key].device.type == "cpu" and opt.state[p][key].is_pinned(), (name, key)
    assert opt.last_copies[("state", "cpu", "cuda:0")] > 0


def test_saved_activations_held_on_the_host_wait_in_pinned_memory_and_train_as_without() -> None:
    """A gpt:small plan holding saved activations on the host, emitted on the GPU: each held op's
    saved tensors are pinned host copies between forward and backward, and outputs and gradients
    equal the same module without the hooks bit for bit."""
    from backends.torch.saved_on_host import TARGET_META, HoldOnHost, run_holding

    model, inputs = models.get("gpt", "small")
    cap = {"cuda:0": 84_632_576 + 14_090_240 + 8_650_752}
    plan = partition(model, inputs, "h200-host", memory=cap, training=True, time_limit=20, recompute=False,
                     offload=False, streaming=False, save_on_host=True)
    assert plan.training_state.get("saved_on_host")
    emitted = plan.emit(model.train())
    packed: list[torch.Tensor] = []
    pack = HoldOnHost.pack

    def recording(self, tensor):  # noqa: ANN001, ANN202 - what the real hook made, kept for the check
        held = pack(self, tensor)
        if held is not tensor:
            packed.append(held.tensor)
        return held

    HoldOnHost.pack = recording
    try:
        out = emitted(*(t.cuda() for t in inputs))
    finally:
        HoldOnHost.pack = pack
    assert packed and all(t.device.type == "cpu" and t.is_pinned() for t in packed)
    _loss(out).backward()
    plain_graph = copy.deepcopy(emitted.graph)
    for node in plain_graph.nodes:
        if node.target is run_holding:
            node.target, node.args = node.meta[TARGET_META], node.args[3:]
    plain = torch.fx.GraphModule(emitted, plain_graph)
    grads = {n: p.grad.clone() for n, p in emitted.named_parameters()}
    plain.zero_grad()
    again = plain(*(t.cuda() for t in inputs))
    _loss(again).backward()
    assert torch.equal(out, again)
    for name, p in plain.named_parameters():
        assert torch.equal(grads[name], p.grad), name
