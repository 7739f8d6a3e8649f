"""``hetpart check MODEL --plan plan.json --training --steps 3``: the emitted module, trained by the
plan's placed optimizer, equals eager training with torch's optimizer after every step.

Plans for ``gpt:small``, the seed model ``emb-transformer:small`` and a small HF GPT-2 put their
blocks (and embeddings) on ``cuda:0``; a hand-made ``training_state`` section offloads part of the
state to the host. The CLI runs with ``cuda:0`` bound to its own CPU tag, or under strict devices.
"""

from __future__ import annotations

import textwrap

import pytest

import models
from partitioner import partition
from partitioner.cli import main
from tests.e2e.training_states import with_training_state

HF_FACTORY = '''
import torch
import transformers as tf


def build():
    torch.manual_seed(0)
    config = tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32, use_cache=False,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return tf.GPT2LMHeadModel(config), (torch.randint(0, 128, (2, 16)),)
'''


def saved_plan(tmp_path, model, inputs, pins, offload, optimizer="adam", name="plan.json"):
    plan = partition(model, inputs, "h200-host", training=True, optimizer=optimizer, pins=pins)
    plan = with_training_state(plan, model.train(), offload=offload)
    return str(plan.save(tmp_path / name))


def run(capsys, *argv):
    code = main(["check", *argv])
    return code, capsys.readouterr().out


def test_gpt_small_trains_as_eager_with_adam_and_sgd(tmp_path, capsys) -> None:
    model, inputs = models.get("gpt", "small")
    for optimizer, args in (("adam", ["lr=1e-3"]), ("sgd", ["lr=0.5"])):
        path = saved_plan(tmp_path, model, inputs, {"blocks.*": "cuda:0", "tok_emb*": "cuda:0"},
                          ["blocks.0*", "blocks.2*", "tok_emb*"], optimizer, f"{optimizer}.json")
        code, out = run(capsys, "gpt:small", "--plan", path, "--training", "--steps", "3", "--bind", "cuda:0=cpu:1",
                        "--optimizer-args", *args)
        assert code == 0, out
        lines = out.splitlines()
        assert lines[-1].startswith("passed: loss and every parameter within tolerance after each of 3 steps")
        assert sum(1 for line in lines if line.split()[:1] in (["1"], ["2"], ["3"]) and line.endswith("ok")) == 3
        assert "gradient  cuda:0->cpu" in out and "weights   cpu->cuda:0" in out


def test_the_seed_model_under_strict_devices_shows_state_gradients_and_copies(tmp_path, capsys) -> None:
    model, inputs = models.get("emb-transformer", "small")
    path = saved_plan(tmp_path, model, inputs, {"layers.*": "cuda:0", "emb*": "cuda:0"}, ["emb*", "layers.0*"])
    code, out = run(capsys, "emb-transformer:small", "--plan", path, "--training", "--steps", "3",
                    "--strict-devices")
    assert code == 0, out
    assert "strict devices: every logical device on its own CPU tag" in out
    state = next(line for line in out.splitlines() if line.split()[:3] == ["cuda:0", "cpu", "dense"])
    assert "cpu:1" in state and state.endswith("ok")  # the offloaded state, on the host's tag
    table = 32768 * 256 * 4
    gradient = next(line for line in out.splitlines() if line.strip().startswith("gradient"))
    assert int(gradient.split()[2].replace(",", "")) > table  # the table's gradient left cuda:0, and layers.0's
    assert out.splitlines()[-1].startswith("passed:")


def test_an_hf_model_trains_as_eager(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    factory = tmp_path / "hf_gpt2.py"
    factory.write_text(textwrap.dedent(HF_FACTORY))
    from partitioner.model_source import load_model

    loaded = load_model(f"{factory}:build")
    path = saved_plan(tmp_path, loaded.module, loaded.example_inputs, {"transformer.h.*": "cuda:0"},
                      ["transformer.h.0.*"])
    code, out = run(capsys, f"{factory}:build", "--plan", path, "--training", "--steps", "3", "--bind",
                    "cuda:0=cpu:1", "--optimizer-args", "lr=1e-3", "betas=(0.9,0.95)")
    assert code == 0, out
    assert "betas=(0.9, 0.95)" in out and out.splitlines()[-1].startswith("passed:")


def test_steps_flags_refuse_what_they_cannot_do(tmp_path, capsys) -> None:
    model, inputs = models.get("gpt", "tiny")
    train = saved_plan(tmp_path, model, inputs, {"blocks.*": "cuda:0"}, [], "sgd", "train.json")
    infer = str(partition(model.eval(), inputs, "h200-host", pins={"blocks.*": "cuda:0"}).save(tmp_path / "infer.json"))
    cases = [
        (["gpt:tiny", "--plan", train, "--steps", "3"], "--steps trains the emitted module: add --training"),
        (["gpt:tiny", "--plan", train, "--optimizer-args", "lr=1"], "--optimizer-args sets the optimizer of --steps"),
        (["gpt:tiny", "--plan", train, "--training", "--steps", "1", "--optimizer-args", "lr=fast"],
         "the value is not a Python literal"),
        (["gpt:tiny", "--plan", train, "--training", "--steps", "1", "--optimizer-args", "momentum=0.9"],
         "the plan priced 'sgd' (no momentum buffer); re-plan with optimizer='sgd-momentum'"),
        (["gpt:tiny", "--plan", infer, "--training", "--steps", "1"], "is an inference plan"),
    ]
    for argv, message in cases:
        code = main(["check", *argv, "--bind", "cuda:0=cpu:1"])
        err = capsys.readouterr().err
        assert code != 0 and message in err, (argv, err)


def test_a_plan_the_ilp_made_with_a_delayed_update_trains_as_its_definition(tmp_path, capsys) -> None:
    """The planner's own training state (streamed, offloaded, row-sparse, recomputed where it chose)
    with ZeRO-Offload's delayed update opted in: checked against eager training whose host-stepped
    weights lag one step (backends/torch/training_check.py), under strict devices."""
    model, inputs = models.get("emb-transformer", "small")
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "6MB"}, training=True, optimizer="adam",
                     delayed_update=True, time_limit=20)
    assert plan.training_state["delayed_update"]
    path = str(plan.save(tmp_path / "delayed.json"))
    code, out = run(capsys, "emb-transformer:small", "--plan", path, "--training", "--steps", "3", "--strict-devices")
    assert code == 0, out
    assert out.splitlines()[-1].startswith("passed: loss and every parameter within tolerance after each of 3 steps")


def test_a_plan_the_ilp_made_with_streamed_state_trains_as_eager_under_strict_devices(tmp_path, capsys) -> None:
    """gpt:small with cuda:0 capped at three times its parameter bytes: the planner keeps some
    optimizer state on the host and streams it to cuda:0 for each step (beside offloaded state);
    three Adam steps equal eager training, and the state copies are the plan's, under strict devices."""
    model, inputs = models.get("gpt", "small")
    cap = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": cap}, training=True, optimizer="adam",
                     time_limit=20)
    params = plan.training_state["params"].values()
    streamed = [ps for ps in params if ps["state"] == "cpu" and ps["step"] == "cuda:0"]
    assert streamed, plan.summary()
    assert "streamed to cuda:0 for the step" in plan.summary()
    step = plan.training_state["step"]
    assert step["streamed_s"] > 0 and 0 <= step["streamed_after_s"] <= step["streamed_s"]
    assert f"streamed   {len(streamed)} params' state to and from the host" in plan.summary()
    path = str(plan.save(tmp_path / "streamed.json"))
    code, out = run(capsys, "gpt:small", "--plan", path, "--training", "--steps", "3", "--strict-devices")
    assert code == 0, out
    state_in = next(line.split() for line in out.splitlines() if line.split()[:2] == ["state", "cpu->cuda:0"])
    assert state_in[2] == state_in[3] and int(state_in[2].replace(",", "")) > 0 and state_in[-1] == "ok"
    assert out.splitlines()[-1].startswith("passed: loss and every parameter within tolerance after each of 3 steps")
