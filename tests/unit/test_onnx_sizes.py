"""ONNX tensor sizes are Python integers, and an absurd shape is a one-line error naming the tensor.

numpy ``int64`` products wrap: a dimension of 2**62 made a tensor of 0 bytes that "fit" on any
device. Every shape the importer reads (graph inputs, given input shapes, initializers, sparse
initializers, every inferred tensor, subgraph bodies) is checked; sizes below the bound are exact.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from partitioner import from_onnx, partition
from partitioner.errors import InputShapeError, OnnxError
from partitioner.frontends.onnx import describe
from partitioner.frontends.onnx_load import MAX_TENSOR_BYTES

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), sparse=()):  # noqa: ANN001, ANN201
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers), sparse_initializer=list(sparse))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:  # noqa: ANN001
    return helper.make_tensor_value_info(name, elem, shape)


def _relu(shape) -> onnx.ModelProto:  # noqa: ANN001
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", shape)], [vi("y", None)])


def _one_line(err: pytest.ExceptionInfo, *words: str) -> None:
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_huge_declared_input_is_refused_not_planned_as_zero_bytes() -> None:
    """A dimension of 2**62 wrapped to 0 bytes: the plan "fitted" on a 1 KB device."""
    with pytest.raises(InputShapeError) as err:
        partition(_relu([2**62, 4]), devices="cpu-gpu-npu", memory={"cuda:0": 1000}, time_limit=2)
    _one_line(err, "input 'x'", "4611686018427387904x4", "1 PiB", "--input-shape x=NxN")


def test_a_huge_given_input_shape_is_refused_before_it_is_bound() -> None:
    with pytest.raises(InputShapeError) as err:
        from_onnx(_relu(["batch", 4]), {"x": (2**62, 4)})
    _one_line(err, "input 'x'", "4611686018427387904x4", "give the shape the model is run with")
    with pytest.raises(InputShapeError) as err:  # beyond int64: protobuf cannot even hold the dimension
        from_onnx(_relu(["batch", 4]), {"x": (2**70, 4)})
    _one_line(err, "input 'x'", str(2**70))


def test_a_negative_declared_dimension_is_unknown_and_bound_from_the_shapes_given() -> None:
    with pytest.raises(InputShapeError) as err:
        from_onnx(_relu([-1, 4]))
    _one_line(err, "input 'x'", "dimension 0", "unknown", "--input-shape x=Nx4")
    assert from_onnx(_relu([-1, 4]), {"x": (3, 4)}).tensors["y"].nbytes == 48


@pytest.mark.parametrize("target, words", [
    ([2**62, 4], ["tensor 'y'", "node 'expand'", "4611686018427387904x4", "1 PiB"]),
    ([-3, 4], ["tensor 'y'", "node 'expand'", "-3x4", "negative"]),
])
def test_an_inferred_tensor_of_absurd_shape_is_named_with_its_node(target, words) -> None:  # noqa: ANN001
    nodes = [helper.make_node("Expand", ["x", "s"], ["y"], name="expand"), helper.make_node("Relu", ["y"], ["z"])]
    m = model(nodes, [vi("x", [1, 4])], [vi("z", None)], [numpy_helper.from_array(np.array(target, np.int64), "s")])
    with pytest.raises(OnnxError) as err:
        from_onnx(m)
    _one_line(err, *words)


def test_initializers_and_sparse_initializers_of_absurd_shape_are_named() -> None:
    mm = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    huge = onnx.TensorProto(name="w", data_type=F, dims=[4, 2**60])
    with pytest.raises(OnnxError) as err:
        from_onnx(model(mm, [vi("x", [2, 4])], [vi("y", None)], [huge]))
    _one_line(err, "initializer 'w'", "4x1152921504606846976", "export it again")
    values = numpy_helper.from_array(np.array([1.0], np.float32), "w")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0], np.int64), "i"), [4, 2**60])
    with pytest.raises(OnnxError) as err:
        from_onnx(model(mm, [vi("x", [2, 4])], [vi("y", None)], sparse=[sparse]))
    _one_line(err, "sparse initializer 'w'", "4x1152921504606846976")


def test_a_subgraph_tensor_of_absurd_shape_is_named() -> None:
    """An If branch expanding to 2**61 x 4 costed the If at negative bytes (int64 wrapped)."""
    target = numpy_helper.from_array(np.array([2**61, 4], np.int64))
    then = helper.make_graph([helper.make_node("Constant", [], ["s"], value=target),
                              helper.make_node("Expand", ["x", "s"], ["t"], name="inner"),
                              helper.make_node("ReduceSum", ["t"], ["r"], keepdims=0)], "then", [], [vi("r", None)])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["r2"], keepdims=0)], "else", [],
                              [vi("r2", None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")]
    m = model(nodes, [vi("x", [1, 4]), vi("c", [], TensorProto.BOOL)], [vi("y", None)])
    with pytest.raises(OnnxError) as err:
        from_onnx(m)
    _one_line(err, "tensor 't'", "node 'inner'", "2305843009213693952x4")


def test_sizes_below_the_bound_are_exact_python_integers() -> None:
    """2**40 x 256 float32 is 2**50 bytes: at the bound, exact (numpy int64 would have been too, but
    a dimension of 2**61 x 4 x 4 bytes wrapped to 0)."""
    shape = [2**40, 256]
    assert describe(helper.make_tensor_type_proto(F, shape))[2] == MAX_TENSOR_BYTES
    assert describe(helper.make_tensor_type_proto(F, [2**61, 4]))[2] == 2**65  # not 0
    g = from_onnx(_relu(shape))
    assert g.tensors["y"].nbytes == MAX_TENSOR_BYTES and g.ops["relu"].flops == 2**48
    with pytest.raises(InputShapeError):
        from_onnx(_relu([2**40, 257]))
