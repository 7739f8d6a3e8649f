"""Sparse initializers and ``Constant(sparse_value=...)``: imported as parameters of their dense bytes.

onnxruntime densifies a sparse initializer when a session starts (and a sparse ``Constant`` is a
dense constant once folded), so a device holds the dense tensor: the plan counts its dense bytes.
The model is built with ``onnx.helper``, onnxruntime runs it whole, and the plan's parts, split
over two devices, compute what the whole model computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.onnx_parts import check_parts
from partitioner import from_onnx, partition
from partitioner.errors import OnnxError
from partitioner.frontends.onnx_fold import densify

F = TensorProto.FLOAT
N = 64


def _sparse(name: str, dense: np.ndarray, coordinates: bool = False) -> onnx.SparseTensorProto:
    flat = np.flatnonzero(dense)
    indices = np.stack(np.unravel_index(flat, dense.shape), axis=1) if coordinates else flat
    return helper.make_sparse_tensor(numpy_helper.from_array(dense.reshape(-1)[flat], name),
                                     numpy_helper.from_array(indices.astype(np.int64), f"{name}_indices"),
                                     list(dense.shape))


def _weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a, b = (np.where(rng.random((N, N)) < 0.1, rng.standard_normal((N, N)), 0).astype(np.float32) for _ in "ab")
    return a, b


def sparse_model() -> onnx.ModelProto:
    """x -> MatMul(sparse initializer w1) -> Relu -> MatMul(Constant sparse_value w2) -> y."""
    w1, w2 = _weights()
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Constant", [], ["w2"], sparse_value=_sparse("w2", w2, coordinates=True), name="w2"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "sparse", [helper.make_tensor_value_info("x", F, [8, N])],
                              [helper.make_tensor_value_info("y", F, None)], sparse_initializer=[_sparse("w1", w1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_densify_reads_linear_and_coordinate_indices() -> None:
    w1, _ = _weights()
    np.testing.assert_array_equal(densify(_sparse("w", w1)), w1)
    np.testing.assert_array_equal(densify(_sparse("w", w1, coordinates=True)), w1)


def test_sparse_weights_are_parameters_of_their_dense_bytes_and_a_split_plan_runs(tmp_path: Path) -> None:
    path = tmp_path / "sparse.onnx"
    onnx.save(sparse_model(), str(path))
    x = np.random.default_rng(1).standard_normal((8, N)).astype(np.float32)
    w1, w2 = _weights()
    whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(whole, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)  # onnxruntime runs it

    graph = from_onnx(path)
    assert sorted(graph.params) == ["w1", "w2"]
    assert all(graph.params[p].nbytes == N * N * 4 and graph.params[p].shape == (N, N) for p in ("w1", "w2"))
    assert graph.ops["mm1"].params == ("w1",) and graph.ops["mm1"].param_bytes == N * N * 4
    assert graph.ops["mm2"].param_bytes == N * N * 4 and graph.total_param_bytes() == 2 * N * N * 4

    # one weight fits on each accelerator, not both: the two MatMuls land on two devices
    cap = N * N * 4 + 8 * N * 4 * 3
    plan = partition(graph, devices="cpu-gpu-npu", memory={"cuda:0": cap, "npu:0": cap},
                     pins={"mm1": "cuda:0", "mm2": "npu:0"}, time_limit=3)
    assert plan.placement["mm1"] != plan.placement["mm2"]
    report = check_parts(plan, path, {"x": x}, device_map={"cuda:0": "cpu", "npu:0": "cpu"}, repeat=1)
    assert report.passed, report.to_text()


def test_a_small_sparse_constant_folds_to_its_dense_value() -> None:
    """Constant(sparse_value) -> Transpose is folded as onnxruntime folds it: a weight of dense bytes."""
    dense = np.array([[0, 1], [2, 0]], np.float32)
    nodes = [helper.make_node("Constant", [], ["c"], sparse_value=_sparse("c", dense), name="c"),
             helper.make_node("Transpose", ["c"], ["ct"], name="t"),
             helper.make_node("MatMul", ["x", "ct"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3, 2])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    imported = from_onnx(model)
    np.testing.assert_array_equal(imported.source.analysis.values["ct"], dense.T)
    assert list(imported.ops) == ["mm"] and imported.params["ct"].nbytes == 16


def test_a_malformed_sparse_initializer_is_one_line() -> None:
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
    indices = numpy_helper.from_array(np.array([0, 1, 2], np.int64), "w_indices")  # 3 indices, 2 values
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", F, [2, 4])],
                              [helper.make_tensor_value_info("y", F, None)],
                              sparse_initializer=[helper.make_sparse_tensor(values, indices, [4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxError) as err:
        from_onnx(model)
    assert "sparse initializer 'w'" in str(err.value) and "[NNZ]" in str(err.value) and "\n" not in str(err.value)
