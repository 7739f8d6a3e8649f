"""``hetpart plan --generate``, ``hetpart generate`` and ``hetpart check --generate`` from the shell's view:
a zoo GPT and a transformers Llama folder, planned with cuda:0 capped, run under strict devices."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from partitioner.cli import main


@pytest.fixture(scope="module")
def gpt_plan(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gen") / "gpt.json"
    assert main(["plan", "gpt:small", "--devices", "h200-host", "--memory", "cuda:0=3MB", "--pin",
                 "inner.gpt.blocks.3*=cuda:0", "--generate", "--prompt-tokens", "32", "--new-tokens", "16",
                 "-o", str(path)]) == 0
    return str(path)


def test_check_generate_under_strict_devices_prints_its_verdict_last(gpt_plan: str, capsys) -> None:
    capsys.readouterr()
    assert main(["check", "gpt:small", "--plan", gpt_plan, "--generate", "16", "--strict-devices"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("verdict: PASSED")
    assert "16 of 16 new tokens equal the original's" in "\n".join(out)
    assert sum("cpu->cuda:0" in line and "ok" in line for line in out) == 2  # both phases copy, as planned


def test_generate_prints_the_tokens_and_the_times_beside_the_prediction(gpt_plan: str, capsys) -> None:
    capsys.readouterr()
    assert main(["generate", "gpt:small", "--plan", gpt_plan, "--prompt-ids", "5,6,7,8", "--max-new-tokens", "6",
                 "--bind", "cuda:0=cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "prompt: 5 6 7 8"
    assert len(out[1].split()) == 1 + 6
    assert out[2].startswith("measured: prefill") and "predicted for the plan's devices" in out[2]
    assert main(["generate", "gpt:small", "--plan", gpt_plan, "--prompt-tokens", "8", "--max-new-tokens", "4",
                 "--sample", "--top-k", "3", "--seed", "1", "--strict-devices"]) == 0
    out = capsys.readouterr().out
    assert "prefill: strict devices" in out and "decode: strict devices" in out


@pytest.mark.parametrize("argv, words", [
    (["--prompt-tokens", "40"], "longer than the planned prefill of 32"),
    (["--prompt-ids", "1,2", "--prompt-ids", "3"], "the same number of token ids"),
    (["--prompt-ids", "1,x"], "whole numbers separated by commas"),
    (["--prompt-ids", "1,2", "--top-p", "0.5"], "add --sample"),
    (["--prompt-ids", "1,2", "--max-new-tokens", "47"], "ask for at most 46 new tokens"),
    (["--prompt-ids", "1,2", "--strict-devices", "--bind", "cuda:0=cpu"], "drop device_map"),
])
def test_generate_refuses_bad_requests(gpt_plan: str, argv: list[str], words: str, capsys) -> None:
    capsys.readouterr()
    assert main(["generate", "gpt:small", "--plan", gpt_plan, "--bind", "cuda:0=cpu", *argv]
                if "--bind" not in argv else ["generate", "gpt:small", "--plan", gpt_plan, *argv]) == 2
    assert words in capsys.readouterr().err


def test_a_generation_plan_given_to_a_single_plan_command_names_the_right_one(gpt_plan: str, capsys) -> None:
    capsys.readouterr()
    assert main(["check", "gpt:small", "--plan", gpt_plan, "--bind", "cuda:0=cpu"]) == 2
    assert "--generate 32" in capsys.readouterr().err
    assert main(["check", "gpt:small", "--plan", gpt_plan, "--generate", "4", "--training"]) == 2
    assert "drop them" in capsys.readouterr().err


def test_a_llama_folder_plans_generates_and_checks(tmp_path, capsys) -> None:
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                                 num_key_value_heads=4, vocab_size=4096, max_position_embeddings=256)
                     ).save_pretrained(tmp_path / "llama")
    folder, plan = str(tmp_path / "llama"), str(tmp_path / "plan.json")
    assert main(["plan", folder, "--devices", "h200-host", "--memory", "cuda:0=10MB", "--pin",
                 "inner.model.model.layers.1*=cuda:0", "--generate", "--prompt-tokens", "64", "--new-tokens",
                 "32", "-o", plan]) == 0
    assert json.loads(open(plan).read())["format"] == "hetpart.generation-plan"
    capsys.readouterr()
    assert main(["check", folder, "--plan", plan, "--generate", "32", "--strict-devices"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("verdict: PASSED")


def test_plan_and_check_a_packed_generation_plan(tmp_path, capsys) -> None:
    """``--precision weights=int8`` with ``--generate``: the summary names the packed weights of both
    phases, and ``check --generate`` holds the loop to the same packing run unplaced, reporting the
    error against the float model."""
    path = tmp_path / "gpt-int8.json"
    assert main(["plan", "gpt:small", "--devices", "h200-host", "--memory", "cuda:0=3MB", "--pin",
                 "inner.gpt.blocks.3*=cuda:0", "--generate", "--prompt-tokens", "16", "--new-tokens", "8",
                 "--precision", "weights=int8", "-o", str(path)]) == 0
    text = capsys.readouterr().out
    assert "precision          weights=int8" in text and text.count(" int8 (") == 2
    assert main(["check", "gpt:small", "--plan", str(path), "--generate", "8", "--strict-devices"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("verdict: PASSED")
    joined = "\n".join(out)
    assert "8 of 8 new tokens equal the unplaced loop's (same precision)" in joined
    assert "linears in int8" in joined and "relative error against the float model" in joined
