"""ONNX models end to end: plan with the ILP, write the parts, run them chained, compare with one session.

Zoo models exported to ONNX are placed on ``cpu-gpu-npu`` under memory caps (every device bound
to the CPU provider here) and their chained part sessions must equal the whole-model session; an
old-format model (IR version 3, weights made by ConstantOfShape from initializers listed as graph
inputs) must keep its weights folded in every part; the written folder, its manifest and the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from backends.onnx_parts import build_parts, check_parts, example_feeds, load_parts, part_model, split, whole_session
from backends.onnx_parts.providers import session_options
from models.onnx_models import export_zoo, light_model
from partitioner import from_onnx, partition
from partitioner.cli import main
from partitioner.errors import HetpartError, OnnxError, PlanMismatch

CPU_ONLY = {"cuda:0": "cpu", "npu:0": "cpu"}
MLP_PINS = {"/layers/layers.0/*": "cpu", "/layers/layers.[1-9]/*": "cuda:0"}  # first Gemm on the cpu


@pytest.mark.parametrize("name", models.names())
def test_zoo_exports_split_on_cpu_gpu_npu_under_a_cap_equal_the_whole_model(name: str, tmp_path: Path) -> None:
    path = export_zoo(name, "small", tmp_path / f"{name}.onnx")
    graph = from_onnx(path)
    cap = int(0.4 * graph.total_param_bytes())  # neither accelerator holds the model alone
    plan = partition(graph, devices="cpu-gpu-npu", memory={"cuda:0": cap, "npu:0": cap}, time_limit=3)
    assert len(set(plan.placement.values())) >= 2
    report = check_parts(plan, path, device_map=CPU_ONLY, repeat=1)
    assert report.passed, report.to_text()
    parts = build_parts(plan, graph, CPU_ONLY)
    assert len(parts.manifest.parts) >= 2
    devices = [p.device for p in parts.manifest.parts]
    assert all(a != b for a, b in zip(devices, devices[1:]))  # a device's ops that can run together do
    # the bound runs go through onnxruntime's C binding; its public wrappers give the same outputs
    assert any(raw is not None for raw in parts._raw)
    feeds = example_feeds(parts.manifest.inputs)
    fast = parts.run(feeds)
    parts._raw = [None] * len(parts._raw)
    public = parts.run(feeds)
    for output in parts.output_names:
        np.testing.assert_array_equal(fast[output], public[output])


def test_old_models_keep_their_weights_folded_in_every_part(tmp_path: Path) -> None:
    """light_squeezenet (IR 3, weights from ConstantOfShape, initializers listed as inputs): each part
    carries the constant subgraphs of its weights and onnxruntime folds them when the part loads, so
    no ConstantOfShape survives optimisation and no part receives a weight as an input."""
    path = light_model("squeezenet")
    graph = from_onnx(path)
    order = [op.name for op in graph.topological_order()]
    placement = {op: ("cpu" if k < len(order) // 3 else "cuda:0" if k < 2 * len(order) // 3 else "npu:0")
                 for k, op in enumerate(order)}
    parts = split(placement, order, graph)
    assert [p.device for p in parts] == ["cpu", "cuda:0", "npu:0"]
    first = graph.tensors["data_0"].consumers
    computed = set(first).union(*(nx.descendants(graph.dag, op) for op in first))  # ops that depend on the image
    for part in parts:
        model = part_model(graph.source, part, "squeezenet")
        assert model.ir_version >= 4 and not {i.name for i in model.graph.input} & {t.name for t in model.graph.initializer}
        assert all(t == "data_0" or graph.tensors[t].producer in computed for t in part.inputs)  # never a weight
        options = session_options()
        options.optimized_model_filepath = str(tmp_path / f"opt{part.index}.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(tmp_path / f"opt{part.index}.onnx")
        assert not [n for n in optimized.graph.node if n.op_type == "ConstantOfShape"], part.index
    x = (np.arange(3 * 224 * 224).reshape(1, 3, 224, 224) / (3 * 224 * 224)).astype(np.float32)
    want = onnx.numpy_helper.to_array(onnx.load_tensor(str(path).replace(".onnx", "_output_0.pb")))
    plan = partition(graph, devices="cpu-gpu-npu", pins={op: d for op, d in placement.items()}, time_limit=5)
    got = build_parts(plan, graph, CPU_ONLY).run({"data_0": x})
    np.testing.assert_allclose(got["softmaxout_1"], want, rtol=1e-3, atol=1e-7)


def test_written_parts_run_from_their_folder_with_external_data(tmp_path: Path) -> None:
    source = export_zoo("mlp", "tiny", tmp_path / "src.onnx")
    external = tmp_path / "model" / "mlp.onnx"
    external.parent.mkdir()
    onnx.save_model(onnx.load(source), str(external), save_as_external_data=True, location="mlp.weights",
                    size_threshold=0)
    plan = partition(external, devices="cpu-gpu-npu", pins=MLP_PINS,
                     time_limit=5)
    folder = plan.emit_onnx(tmp_path / "parts", external)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [p["device"] for p in manifest["parts"]] == ["cpu", "cuda:0"]
    assert sorted(f.name for f in folder.iterdir()) == ["manifest.json", "part_0.onnx", "part_0.onnx.data",
                                                        "part_1.onnx", "part_1.onnx.data"]
    feeds = example_feeds([("input", "float32", plan.inputs[0][0])])
    want = whole_session(external).run(None, feeds)[0]
    got = load_parts(folder, {"cuda:0": "cpu"}).run(feeds)
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-6)


def test_emit_writes_nothing_on_failure_and_replaces_only_with_force(tmp_path: Path) -> None:
    mlp = export_zoo("mlp", "tiny", tmp_path / "mlp.onnx")
    gpt = export_zoo("gpt", "tiny", tmp_path / "gpt.onnx")
    plan = partition(mlp, devices="cpu-gpu-npu", time_limit=5)
    with pytest.raises(PlanMismatch):
        plan.emit_onnx(tmp_path / "parts", gpt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt.onnx", "mlp.onnx"]
    plan.emit_onnx(tmp_path / "parts", mlp)
    with pytest.raises(HetpartError, match="--force"):
        plan.emit_onnx(tmp_path / "parts", mlp)
    (tmp_path / "parts" / "part_7.onnx").write_text("old")  # a part of an earlier emit: replaced
    plan.emit_onnx(tmp_path / "parts", mlp, force=True)
    assert not (tmp_path / "parts" / "part_7.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt.onnx", "mlp.onnx", "parts"]
    (tmp_path / "parts" / "stale.txt").write_text("mine")  # not a part: --force never deletes it
    with pytest.raises(HetpartError, match="holds 'stale.txt'"):
        plan.emit_onnx(tmp_path / "parts", mlp, force=True)
    assert (tmp_path / "parts" / "stale.txt").read_text() == "mine"


def test_a_missing_provider_and_a_broken_manifest_are_named(tmp_path: Path) -> None:
    path = export_zoo("mlp", "tiny", tmp_path / "mlp.onnx")
    plan = partition(path, devices="cpu-gpu-npu", pins=MLP_PINS, time_limit=5)
    folder = plan.emit_onnx(tmp_path / "parts", path)
    with pytest.raises(OnnxError) as err:
        load_parts(folder)
    assert "'cuda:0' runs on CUDAExecutionProvider" in str(err.value) and "--bind cuda:0=cpu" in str(err.value)
    with pytest.raises(OnnxError, match="the plan's profile does not have"):
        load_parts(folder, {"tpu:0": "cpu"})
    manifest = folder / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(OnnxError, match="manifest.json: not valid JSON.*cut off"):
        load_parts(folder, {"cuda:0": "cpu"})
    data = json.loads(text)
    data["parts"][1]["inputs"] = ["nowhere"]
    manifest.write_text(json.dumps(data))
    with pytest.raises(OnnxError, match=r"parts\[1\] \(part_1.onnx\) reads 'nowhere'"):
        load_parts(folder, {"cuda:0": "cpu"})


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_command_takes_an_onnx_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = export_zoo("convnet", "tiny", tmp_path / "convnet.onnx", dynamic_batch=True)
    plan, parts, out = tmp_path / "plan.json", tmp_path / "parts", tmp_path / "out"
    code, text, err = run(capsys, "inspect", str(model), "--devices", "cpu-gpu-npu", "--input-shape", "input=2x3x32x32")
    assert code == 0 and "conv" in text, err
    code, _, err = run(capsys, "plan", str(model), "--devices", "cpu-gpu-npu", "-o", str(plan))
    assert code == 2 and "input 'input'" in err and "--input-shape input=Nx3x32x32" in err and not plan.exists()
    code, text, err = run(capsys, "plan", str(model), "--devices", "cpu-gpu-npu", "--input-shape", "input=2x3x32x32",
                          "--pin", "stages.1*=npu:0", "--time-limit", "5", "-o", str(plan))
    assert code == 0 and "ort-fallback" in text and "openvino-pipeline" in text, err
    code, text, err = run(capsys, "emit", str(model), "--plan", str(plan), "-o", str(parts),
                          "--input-shape", "input=2x3x32x32")
    assert code == 0 and "parts and manifest.json" in text, err
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    code, text, err = run(capsys, "run", str(parts), "--input", f"input={x}", "--bind", "npu:0=cpu", "-o", str(out))
    assert code == 0 and "float32 2x10" in text and len(list(out.iterdir())) == 1, err
    want = whole_session(model).run(None, {"input": np.load(x)})[0]
    np.testing.assert_allclose(np.load(next(out.iterdir())), want, rtol=1e-5, atol=1e-6)
    code, text, err = run(capsys, "check", str(model), "--plan", str(plan), "--input-shape", "input=2x3x32x32",
                          "--bind", "npu:0=cpu", "--input", f"input={x}", "--repeat", "1")
    assert code == 0 and "passed" in text, err
    code, text, err = run(capsys, "report", str(plan), "-o", str(tmp_path / "r.html"), "--model", str(model),
                          "--input-shape", "input=2x3x32x32")
    assert code == 0, err
    code, text, err = run(capsys, "explain", str(plan), "stages.1*")
    assert code == 0 and "npu:0" in text and "pinned" in text, err


def test_run_and_check_refuse_bad_input_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = export_zoo("mlp", "tiny", tmp_path / "mlp.onnx")
    plan = tmp_path / "plan.json"
    assert run(capsys, "plan", str(model), "--devices", "cpu-gpu-npu", "--pin", "/layers/layers.0/*=cpu",
               "--pin", "/layers/layers.[1-9]/*=cuda:0", "-o", str(plan))[0] == 0
    assert run(capsys, "emit", str(model), "--plan", str(plan), "-o", str(tmp_path / "parts"))[0] == 0
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 3), np.float32))
    code, _, err = run(capsys, "run", str(tmp_path / "parts"), "--input", f"input={bad}", "--bind", "cuda:0=cpu",
                       "-o", str(tmp_path / "out"))
    assert code == 2 and "--input input: shape (3, 3)" in err and not (tmp_path / "out").exists()
    code, _, err = run(capsys, "run", str(tmp_path / "parts"), "--bind", "cuda:0=cpu")
    assert code == 2 and "input 'input' (float32, shape 8x64) is not given" in err
    code, _, err = run(capsys, "run", str(tmp_path / "parts"), "--random", "-o", str(tmp_path / "out"))
    assert code == 2 and "CUDAExecutionProvider" in err and not (tmp_path / "out").exists()
    code, _, err = run(capsys, "check", str(model), "--plan", str(plan), "--training", "--bind", "cuda:0=cpu")
    assert code == 2 and "forward only" in err
    code, _, err = run(capsys, "plan", str(model), "--training", "-o", str(tmp_path / "p2.json"))
    assert code == 2 and "inference" in err and not (tmp_path / "p2.json").exists()
    code, _, err = run(capsys, "plan", str(tmp_path / "absent.onnx"))
    assert code == 2 and "absent.onnx" in err and "does not exist" in err
