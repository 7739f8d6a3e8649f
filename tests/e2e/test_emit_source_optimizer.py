"""``hetpart emit --training``: the generated file builds the plan's placed optimizer too.

The file's ``build_optimizer(module, lr=...)`` trains ``build(model)`` as torch's optimizer trains
the original: the plan (``gpt:tiny``, blocks and embedding on ``cuda:0``, bound to its own CPU tag)
offloads the state of ``blocks.0`` and the embedding to the host, and keeps ``blocks.1``'s there,
streamed to ``cuda:0`` for each step.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import models
from partitioner import partition
from partitioner.cli import main
from tests.e2e.training_states import with_training_state


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "h200-host", training=True, optimizer="adam",
                     pins={"blocks.*": "cuda:0", "tok_emb*": "cuda:0"})
    plan = with_training_state(plan, model.train(), offload=["blocks.0*", "tok_emb*"], stream_state=["blocks.1*"])
    folder = tmp_path_factory.mktemp("emit")
    return model, inputs, plan, str(plan.save(folder / "plan.json")), folder


def test_the_generated_optimizer_trains_as_eager(planned, capsys) -> None:
    model, inputs, plan, path, folder = planned
    target = folder / "placed.py"
    assert main(["emit", "gpt:tiny", "--plan", path, "-o", str(target), "--bind", "cuda:0=cpu:1", "--training"]) == 0
    assert "build_optimizer(module, lr=...) in it builds the plan's adam optimizer" in capsys.readouterr().out
    text = target.read_text()
    assert "def build_optimizer(module: PartitionedModel, params" in text and "'tok_emb.weight': ('embedding'" in text
    generated = load(target, "hetpart_generated_optimizer")
    module = generated.build(model)
    opt = generated.build_optimizer(module, lr=1e-2)
    assert isinstance(opt, torch.optim.Optimizer)
    reference = copy.deepcopy(model).train()
    eager = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for _ in range(3):
        for m, o in ((reference, eager), (module, opt)):
            o.zero_grad()
            m(*inputs).float().mean().backward()
            o.step()
        trained = dict(module.named_parameters())
        for name, p in reference.named_parameters():
            torch.testing.assert_close(trained[name].detach(), p.detach())
    assert opt.last_copies[("gradient", "cuda:0", "cpu")] > 0
    assert opt.last_copies[("state", "cpu", "cuda:0")] == opt.last_copies[("state", "cuda:0", "cpu")] > 0


def test_emit_without_training_writes_no_optimizer_and_says_so(planned, capsys) -> None:
    model, inputs, plan, path, folder = planned
    target = folder / "forward_only.py"
    assert main(["emit", "gpt:tiny", "--plan", path, "-o", str(target), "--bind", "cuda:0=cpu:1"]) == 0
    assert "note: a training plan" in capsys.readouterr().out
    text = target.read_text()
    assert "build_optimizer" not in text and "# Needs only torch." in text


def test_emit_training_of_an_inference_plan_is_refused(planned, capsys, tmp_path) -> None:
    model, inputs, _, _, _ = planned
    infer = partition(model.eval(), inputs, "h200-host").save(tmp_path / "infer.json")
    model.train()
    code = main(["emit", "gpt:tiny", "--plan", str(infer), "-o", str(tmp_path / "x.py"), "--training"])
    assert code != 0
    assert "is an inference plan" in capsys.readouterr().err and not (tmp_path / "x.py").exists()
