"""An emitted module trains its own parameters: an optimizer over the original's is refused.

``plan.emit`` copies each parameter to its planned device (here ``cuda:0`` bound to its own CPU
tag, so the copies are real), so gradients land on the emitted module's parameters. An optimizer
built over the original ``model.parameters()`` would step nothing; its step must say so.
"""

from __future__ import annotations

import copy

import pytest
import torch

import models
from partitioner import partition
from partitioner.errors import HetpartError

BIND = {"cuda:0": "cpu:1"}


@pytest.fixture(scope="module")
def planned():
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "h200-host", training=True, optimizer="sgd",
                     pins={"layers.1*": "cuda:0"})
    return module, inputs, plan


def test_an_optimizer_over_the_original_parameters_is_refused_at_its_step(planned) -> None:
    module, inputs, plan = planned
    emitted = plan.emit(module, BIND)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    emitted(*inputs).sum().backward()
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(HetpartError, match=r"emitted\.parameters\(\)") as caught:
        optimizer.step()
    assert "of the original model" in str(caught.value)
    assert all(torch.equal(b, p) for b, p in zip(before, module.parameters()))


def test_the_emitted_parameters_train_as_the_original_would(planned) -> None:
    module, inputs, plan = planned
    reference = copy.deepcopy(module)
    emitted = plan.emit(module, BIND)
    for model in (reference, emitted):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(*inputs).sum().backward()
        optimizer.step()
    trained = dict(emitted.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(trained[name].detach().cpu(), parameter.detach())


def test_eager_training_of_the_original_beside_an_emitted_module_is_not_refused(planned) -> None:
    module, inputs, plan = planned
    original = copy.deepcopy(module)
    emitted = plan.emit(original, BIND)
    emitted(*inputs).sum().backward()
    optimizer = torch.optim.SGD(original.parameters(), lr=0.1)
    original(*inputs).sum().backward()
    optimizer.step()  # the original has gradients of its own: a legitimate step
