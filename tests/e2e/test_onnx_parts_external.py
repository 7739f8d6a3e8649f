"""Tensors held by ``Constant`` nodes whose data lives in an external file travel inside the parts, read
from the model's folder: a file of the same name planted in the current folder changes nothing.

The model (built with ``onnx.helper`` and ``onnx.external_data_helper``) keeps two constants in
``consts.bin`` beside it: ``c`` (a top-level ``Constant``) and ``k`` (a ``Constant`` inside an ``If``
branch); ``out = If(flag, relu(x + c) * k, relu(x + c)) * c``, split into three parts.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from backends.onnx_parts import build_parts, check_parts, load_parts, whole_session
from backends.onnx_parts.external import external_tensor
from partitioner import from_onnx, partition
from partitioner.errors import OnnxError

C = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
K = np.array([[0.5, -2.0, 3.0], [4.0, 0.25, -1.0]], np.float32)
BIND = {"cuda:0": "cpu", "npu:0": "cpu"}
PINS = {"add": "cpu", "relu": "cuda:0", "branch": "cuda:0", "scale": "cpu"}


def external_constant(name: str, value: np.ndarray, offset: int) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(value, name)
    set_external_data(tensor, "consts.bin", offset=offset, length=value.nbytes)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return helper.make_node("Constant", [], [name], value=tensor, name=f"const_{name}")


def constant_model(folder: Path) -> Path:
    folder.mkdir()
    (folder / "consts.bin").write_bytes(C.tobytes() + K.tobytes())
    then = helper.make_graph([external_constant("k", K, C.nbytes), helper.make_node("Mul", ["z", "k"], ["t_then"])],
                             "then", [], [helper.make_tensor_value_info("t_then", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["z"], ["t_else"])], "else", [],
                              [helper.make_tensor_value_info("t_else", TensorProto.FLOAT, [2, 3])])
    nodes = [external_constant("c", C, 0),
             helper.make_node("Add", ["x", "c"], ["y"], name="add"),
             helper.make_node("Relu", ["y"], ["z"], name="relu"),
             helper.make_node("If", ["flag"], ["t"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Mul", ["t", "c"], ["out"], name="scale")]
    graph = helper.make_graph(nodes, "constants",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def feeds() -> dict[str, np.ndarray]:
    return {"x": np.array([[-3.0, 1.0, 0.5], [2.0, -7.0, 1.5]], np.float32), "flag": np.array(True)}


def expected() -> np.ndarray:
    x = feeds()["x"]
    return np.maximum(x + C, 0) * K * C


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current folder holding a ``consts.bin`` of other values (what a relative read would find)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "consts.bin").write_bytes(np.full(12, 100.0, np.float32).tobytes())
    monkeypatch.chdir(cwd)
    return cwd


def test_constants_in_external_data_are_read_from_the_models_folder_not_the_current_one(
        tmp_path: Path, planted: Path) -> None:
    path = constant_model(tmp_path / "model")
    plan = partition(from_onnx(path), devices="cpu-gpu-npu", pins=PINS, time_limit=5)
    parts = build_parts(plan, path, BIND)
    assert [p.device for p in parts.manifest.parts] == ["cpu", "cuda:0", "cpu"]
    np.testing.assert_allclose(parts.run(feeds())["out"], expected(), rtol=1e-6)
    report = check_parts(plan, path, feeds(), BIND, repeat=1)
    assert report.passed, report.to_text()
    np.testing.assert_allclose(whole_session(path).run(None, feeds())[0], expected(), rtol=1e-6)


def test_written_parts_carry_their_constants_and_run_without_the_model(tmp_path: Path, planted: Path) -> None:
    path = constant_model(tmp_path / "model")
    plan = partition(from_onnx(path), devices="cpu-gpu-npu", pins=PINS, time_limit=5)
    folder = plan.emit_onnx(tmp_path / "parts", path)
    for part in sorted(folder.glob("part_*.onnx")):  # no part refers to a file outside itself
        assert external_tensor(onnx.load(str(part), load_external_data=False)) is None, part.name
    os.rename(tmp_path / "model", tmp_path / "gone")  # the model and its data file are not needed any more
    np.testing.assert_allclose(load_parts(folder, BIND).run(feeds())["out"], expected(), rtol=1e-6)


def test_a_model_in_memory_with_external_constants_is_refused_naming_the_tensor(tmp_path: Path,
                                                                                planted: Path) -> None:
    path = constant_model(tmp_path / "model")
    plan = partition(from_onnx(path), devices="cpu-gpu-npu", pins=PINS, time_limit=5)
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(OnnxError, match=r"(tensor '[ck]'|node 'const_[ck]' \(Constant\) attribute 'value') keeps its data in 'consts.bin'.*pass the model's path"):
        build_parts(plan, proto, BIND)
    with pytest.raises(OnnxError, match=r"tensor 'c' keeps its data in an external file.*pass the model's path"):
        whole_session(proto)
