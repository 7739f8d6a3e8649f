"""Model folders: planned without reading a weight, loaded by the plan straight into each tensor's home.

Each architecture (Llama with tied embeddings, Qwen2-MoE whose experts transformers stores one per
module and fuses on loading, GPT-2, BERT, T5) is built small from its config with random weights,
written with ``save_pretrained`` in shards of 20 KB (an index and a dozen or more shards), planned
from the folder with one block pinned to ``cuda:0``, and loaded from the folder by the plan under
strict devices (each logical device on its own CPU tag): outputs equal the model that was saved,
copies and resident bytes equal the plan's. Then the other ways in: a ``torch.save`` state dict
beside a config, a folder loaded in another dtype (through the staging buffer), streamed weights,
the generated file's ``build("./folder")``, the CLI, an accelerate ``device_map`` as pins, and an
ONNX model whose weights are external data.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.torch.check import check_plan
from backends.torch.from_checkpoint import LOAD_STATS_ATTR
from backends.torch.source import op_lines
from backends.torch.strict import StrictRun
from partitioner import partition
from partitioner.errors import HetpartError
from partitioner.frontends.hf_folder import is_hollow, open_folder
from partitioner.plan import Plan

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SEQ = 8
SMALL = dict(vocab_size=256, use_cache=False)
DECODER = dict(SMALL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
ARCHES = {  # name: (config, class, the module pinned to cuda:0)
    "llama": (lambda: transformers.LlamaConfig(**DECODER, tie_word_embeddings=True), "LlamaForCausalLM",
              "model.layers.0*"),
    "qwen2-moe": (lambda: transformers.Qwen2MoeConfig(**DECODER, moe_intermediate_size=32, num_experts=4,
                                                      shared_expert_intermediate_size=64, num_experts_per_tok=2),
                  "Qwen2MoeForCausalLM", "model.layers.1*"),
    "gpt2": (lambda: transformers.GPT2Config(**SMALL, n_embd=64, n_layer=2, n_head=4, n_positions=64),
             "GPT2LMHeadModel", "transformer.h.0*"),
    "bert": (lambda: transformers.BertConfig(**SMALL, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=128, max_position_embeddings=64),
             "BertForMaskedLM", "bert.encoder.layer.1*"),
    "t5": (lambda: transformers.T5Config(**SMALL, d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16),
           "T5ForConditionalGeneration", "decoder.block.0*"),
}
_counter = itertools.count()


def shapes(name: str) -> dict[str, tuple[int, int]]:
    return {"input_ids": (1, SEQ), **({"decoder_input_ids": (1, SEQ)} if name == "t5" else {})}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    config, cls, _ = ARCHES[name]
    torch.manual_seed(seed)
    return getattr(transformers, cls)(config()).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Each architecture written in 20 KB shards: (folder, the model that was saved)."""
    out = {}
    for name in ARCHES:
        folder = tmp_path_factory.mktemp(name)
        model = build(name)
        model.save_pretrained(folder, max_shard_size="20KB")
        out[name] = (folder, model)
    return out


def planned(folder: Path | str, name: str, **options: object):  # noqa: ANN201 - a Plan
    options.setdefault("pins", {ARCHES[name][2]: "cuda:0"})
    return partition(str(folder), None, "h200-host", input_shapes=shapes(name), time_limit=10, **options)


def _load(path: Path):  # noqa: ANN202 - the generated module
    spec = importlib.util.spec_from_file_location(f"hetpart_checkpoint_{next(_counter)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", list(ARCHES))
def test_a_folder_plans_hollow_and_loads_by_the_plan_under_strict_devices(
        name: str, saved: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    folder, model = saved[name]
    assert len(list(folder.glob("*.safetensors"))) > 3 and (folder / "model.safetensors.index.json").is_file()
    opened = open_folder(folder, input_shapes=shapes(name))
    assert all(is_hollow(p) for p in opened.module.parameters())  # planning reads no weight
    plan = planned(folder, name)
    assert plan.model_name == folder.name and set(plan.placement.values()) == {"cpu", "cuda:0"}
    report = check_plan(plan, model, opened.example_inputs("cpu"), strict_devices=True, weights=str(folder))
    assert report.passed, report.to_text()


def test_tied_weights_are_read_once_and_stay_one_parameter(saved: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    folder, model = saved["llama"]
    emitted = planned(folder, "llama").emit(str(folder), {"cuda:0": "cpu"})
    assert emitted.get_parameter("lm_head.weight") is emitted.get_parameter("model.embed_tokens.weight")
    stats = getattr(emitted, LOAD_STATS_ATTR)
    stored = sum(p.numel() * p.element_size() for p in model.parameters())  # each tensor once
    assert stats.bytes_read == stored and stats.staged_bytes == 0  # host-bound tensors: read in place
    ids = torch.randint(0, 256, (1, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(emitted(ids)[0], model(ids).logits, rtol=1e-5, atol=1e-5)


def test_streamed_weights_are_loaded_on_the_host_and_fetched(saved: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    folder, model = saved["gpt2"]
    plan = planned(folder, "gpt2", pins={"*": "cuda:0"}, memory={"cuda:0": "200KB"})
    assert plan.weights, "the cap should make the plan stream weights from the host"
    ids = torch.randint(0, 256, (1, SEQ))
    report = check_plan(plan, model, (ids,), strict_devices=True, weights=str(folder))
    assert report.passed, report.to_text()
    emitted = plan.emit(str(folder), {"cuda:0": "cpu"})
    for op in plan.weights:  # streamed weights live on the host
        assert {emitted.get_parameter(n).device.type for n in plan.param_names[op]} == {"cpu"}


def test_a_folder_loaded_in_another_dtype_goes_through_the_staging_buffer(
        saved: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    folder, model = saved["llama"]
    plan = planned(folder, "llama", folder_dtype="bfloat16")
    assert plan.request["folder_dtype"] == "bfloat16"
    emitted = plan.emit(str(folder), {"cuda:0": "cpu"})  # the plan's dtype, recorded, is the folder's now
    assert {p.dtype for p in emitted.parameters()} == {torch.bfloat16}
    stats = getattr(emitted, LOAD_STATS_ATTR)
    assert stats.staged_bytes == stats.bytes_read > 0 and stats.staging_bytes > 0
    ids = torch.randint(0, 256, (1, SEQ))
    with torch.no_grad():
        expected = open_folder(folder, dtype="bfloat16").reference()(ids).logits  # transformers' own cast
        torch.testing.assert_close(emitted(ids)[0], expected)


def test_a_torch_save_state_dict_beside_a_config(saved: dict[str, tuple[Path, torch.nn.Module]],
                                                 tmp_path: Path) -> None:
    folder, model = saved["bert"]
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    plan = planned(tmp_path / "weights.pt", "bert")
    assert plan.model_name == "weights"
    report = check_plan(plan, model, (torch.randint(0, 256, (1, SEQ)),), strict_devices=True,
                        weights=str(tmp_path / "weights.pt"))
    assert report.passed, report.to_text()


def test_the_generated_file_builds_from_the_folder(saved: dict[str, tuple[Path, torch.nn.Module]],
                                                  tmp_path: Path) -> None:
    folder, model = saved["qwen2-moe"]
    plan = planned(folder, "qwen2-moe")
    run = StrictRun(plan)
    path = plan.emit_source(tmp_path / "placed.py", str(folder), run.device_map)
    with run:
        generated = _load(path).build(str(folder))
    run.watch(generated, op_lines(plan, str(folder), run.device_map))
    ids = torch.randint(0, 256, (1, SEQ))
    with run:
        got = run.step(generated, ids)
    assert run.report().passed, run.report().to_text()
    with torch.no_grad():
        torch.testing.assert_close(got[0], model(ids).logits, rtol=1e-5, atol=1e-5)


def test_the_cli_plans_checks_and_emits_a_folder(saved: dict[str, tuple[Path, torch.nn.Module]], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from partitioner.cli import main

    folder = saved["gpt2"][0]
    plan_file, device_map = tmp_path / "plan.json", tmp_path / "map.json"
    device_map.write_text(json.dumps({"transformer.h.1": 0, "transformer.wte": "cpu"}))
    assert main(["plan", str(folder), "--input-shape", f"input_ids=1x{SEQ}", "--device-map", str(device_map),
                 "--time-limit", "10", "-o", str(plan_file)]) == 0
    plan = Plan.load(plan_file)
    assert {plan.placement[op] for op, path in plan.modules.items() if path.startswith("transformer.h.1")} == {"cuda:0"}
    assert main(["check", str(folder), "--plan", str(plan_file), "--strict-devices", "--repeat", "1"]) == 0
    assert "passed" in capsys.readouterr().out
    out = tmp_path / "placed.py"
    assert main(["emit", str(folder), "--plan", str(plan_file), "--bind", "cuda:0=cpu", "-o", str(out)]) == 0
    generated = _load(out).build(str(folder))
    ids = torch.randint(0, 256, (1, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(generated(ids)[0], saved["gpt2"][1](ids).logits, rtol=1e-5, atol=1e-5)


def test_an_accelerate_device_map_pins_its_modules_and_the_rest_is_placed(
        saved: dict[str, tuple[Path, torch.nn.Module]], tmp_path: Path) -> None:
    folder, model = saved["llama"]
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": 0, "model.layers.0.mlp": "cpu"}
    plan = planned(folder, "llama", pins=None, device_map_pins=device_map)
    for op, path in plan.modules.items():
        if path.startswith("model.layers.0.mlp"):
            assert plan.placement[op] == "cpu", op  # the longest key wins
        elif path.startswith("model.layers.0"):
            assert plan.placement[op] == "cuda:0", op
        elif path.startswith("model.embed_tokens"):
            assert plan.placement[op] == "cpu", op
    report = check_plan(plan, model, (torch.randint(0, 256, (1, SEQ)),), strict_devices=True, weights=str(folder))
    assert report.passed, report.to_text()
    with pytest.raises(HetpartError, match=r"'model\.layers\.7'.*'model\.blocks'.*top-level modules are lm_head, model"):
        planned(folder, "llama", pins=None, device_map_pins={"model.layers.7": 0, "model.blocks": "cpu"})
    with pytest.raises(HetpartError, match=r"'lm_head' -> 'disk'"):
        planned(folder, "llama", pins=None, device_map_pins={"lm_head": "disk"})


def test_an_onnx_model_with_external_data_runs_in_parts(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from backends.onnx_parts import load_parts

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "model" / "mlp.onnx"
    path.parent.mkdir()
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                    size_threshold=0)
    assert (path.parent / "weights.bin").stat().st_size == w1.nbytes + w2.nbytes
    plan = partition(str(path), None, "h200-host", pins={"mm2": "cuda:0"}, time_limit=10)
    parts = plan.emit_onnx(tmp_path / "parts", str(path))
    x = rng.standard_normal((4, 16)).astype(np.float32)
    got = load_parts(parts, {"cuda:0": "cpu"}).run({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)


def test_the_index_records_what_was_saved(saved: dict[str, tuple[Path, torch.nn.Module]]) -> None:
    """The folders above are what transformers writes: an index over per-expert keys for Qwen2-MoE,
    tied weights stored once (so the loader's key matching and conversions are exercised)."""
    index = json.loads((saved["qwen2-moe"][0] / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in index
    assert "model.layers.0.mlp.experts.gate_up_proj" not in index
    llama = json.loads((saved["llama"][0] / "model.safetensors.index.json").read_text())["weight_map"]
    assert "lm_head.weight" not in llama and "model.embed_tokens.weight" in llama
