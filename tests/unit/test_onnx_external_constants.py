"""Tensors held by ``Constant`` nodes in external data files get the checks initializers get.

Their location is resolved against the model's folder, never the current one (a file planted in the
current folder changed a folded constant); a missing, outside, linked-out, truncated or malformed
reference is a one-line error naming the node and attribute; the importer lists every external
tensor (``LoadedOnnx.external``) and reads a node's bytes in for whoever copies it
(``inline_external_data``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from partitioner import from_onnx
from partitioner.errors import OnnxError
from partitioner.frontends.onnx_external import inline_external_data
from partitioner.frontends.onnx_load import load_onnx

F = TensorProto.FLOAT
SHAPE = np.array([4, 2], np.int64)
WEIGHT = (np.arange(16, dtype=np.float32) / 10).reshape(2, 8)


def _external(name: str, array: np.ndarray, location: str, start: int, **entries: str) -> onnx.TensorProto:
    tensor = numpy_helper.from_array(array, name)
    raw = tensor.raw_data
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": str(start), "length": str(len(raw)), **entries}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _model(location: str = "c.bin", **entries: str) -> onnx.ModelProto:
    """y = Reshape(x, [4, 2]) @ w, with the shape and w held by Constants whose bytes are in ``location``."""
    shape = _external("shape", SHAPE, location, 0, **entries)
    weight = _external("w", WEIGHT, location, SHAPE.nbytes)
    nodes = [helper.make_node("Constant", [], ["shape"], value=shape, name="cshape"),
             helper.make_node("Constant", [], ["w"], value=weight, name="cw"),
             helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
             helper.make_node("Add", ["shape", "s"], ["twice"], name="twice"),   # folded: needs shape's value
             helper.make_node("MatMul", ["r", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [8])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(SHAPE, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _write(folder: Path, model: onnx.ModelProto, data: bytes | None = None, name: str = "c.bin") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = SHAPE.tobytes() + WEIGHT.tobytes()
    (folder / name).write_bytes(data)
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    return path


def _error(path: Path | onnx.ModelProto, *words: str) -> None:
    with pytest.raises(OnnxError) as err:
        from_onnx(path)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_file_planted_in_the_current_folder_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "model", _model())
    planted = tmp_path / "cwd"
    planted.mkdir()
    (planted / "c.bin").write_bytes(np.array([2, 4], np.int64).tobytes() + np.ones(16, np.float32).tobytes())
    monkeypatch.chdir(planted)
    graph = from_onnx(path)
    values = graph.source.analysis.values
    np.testing.assert_array_equal(values["shape"], SHAPE)       # the model folder's bytes, not the planted ones
    np.testing.assert_array_equal(values["twice"], 2 * SHAPE)
    assert graph.params["w"].nbytes == WEIGHT.nbytes


def test_a_missing_file_is_named_with_the_node_and_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "model", _model())
    (tmp_path / "model" / "c.bin").unlink()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.bin").write_bytes(SHAPE.tobytes() + WEIGHT.tobytes())  # in the current folder: not read
    _error(path, "node 'cshape' (Constant) attribute 'value'", "'c.bin'", "copy that file beside the model")


def test_data_outside_the_models_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside.bin").write_bytes(SHAPE.tobytes() + WEIGHT.tobytes())
    path = _write(tmp_path / "model", _model("../outside.bin"))
    _error(path, "node 'cshape' (Constant) attribute 'value'", "outside the model's folder")
    path = _write(tmp_path / "absolute", _model(str(tmp_path / "outside.bin")))
    _error(path, "outside the model's folder")
    linked = tmp_path / "linked"
    path = _write(linked, _model("link.bin"))
    os.symlink(tmp_path / "outside.bin", linked / "link.bin")
    _error(path, "'link.bin'", "outside the model's folder")


def test_a_truncated_file_and_malformed_entries_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "short", _model(), data=SHAPE.tobytes() + b"\0" * 8)
    _error(path, "node 'cw' (Constant) attribute 'value'", "truncated")
    path = _write(tmp_path / "bad", _model(offset="abc"))
    _error(path, "node 'cshape' (Constant) attribute 'value'", "malformed external_data", "'abc'")
    path = _write(tmp_path / "long", _model(length="3"))
    _error(path, "node 'cshape'", "16 bytes", "length of 3")


def test_a_model_in_memory_cannot_read_external_constants() -> None:
    _error(_model(), "node 'cshape' (Constant) attribute 'value'", "pass the model's path")


def test_a_constant_in_a_loop_body_is_checked_too(tmp_path: Path) -> None:
    inner = helper.make_node("Constant", [], ["k"], value=_external("k", WEIGHT[0], "gone.bin", 0), name="inner")
    body = helper.make_graph([inner, helper.make_node("Add", ["h", "k"], ["h2"]),
                              helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h", F, [8])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h2", F, [8])])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="loop")], "g",
                              [helper.make_tensor_value_info("x", F, [8])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.array(2, np.int64), "n")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "loop.onnx"
    onnx.save(model, str(path))
    _error(path, "node 'loop' (Loop) body 'body': node 'inner' (Constant) attribute 'value'", "'gone.bin'")


def test_the_importer_lists_external_tensors_and_reads_a_nodes_bytes_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a part needs: which nodes hold external tensors, and a copy of each with its bytes read
    from the model's folder; a model of such copies runs from bytes in any current folder."""
    path = _write(tmp_path / "model", _model())
    loaded = load_onnx(path)
    file = (tmp_path / "model" / "c.bin").resolve()
    assert [(t.what, t.name, t.node, t.file, t.offset, t.length) for t in loaded.external] == [
        ("node 'cshape' (Constant) attribute 'value'", "shape", 0, file, 0, SHAPE.nbytes),
        ("node 'cw' (Constant) attribute 'value'", "w", 1, file, SHAPE.nbytes, WEIGHT.nbytes)]
    assert loaded.external_nodes == frozenset({0, 1})
    reshape = loaded.model.graph.node[2]
    assert inline_external_data(reshape, loaded.base_dir) is reshape  # nothing to read: the node itself
    copy = onnx.ModelProto()
    copy.CopyFrom(loaded.model)
    for i in sorted(loaded.external_nodes):
        copy.graph.node[i].CopyFrom(inline_external_data(copy.graph.node[i], loaded.base_dir))
    assert loaded.model.graph.node[1].attribute[0].t.data_location == TensorProto.EXTERNAL  # the original keeps it
    np.testing.assert_array_equal(numpy_helper.to_array(copy.graph.node[1].attribute[0].t), WEIGHT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    x = np.arange(8, dtype=np.float32)
    got = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x.reshape(4, 2) @ WEIGHT, rtol=1e-6)
