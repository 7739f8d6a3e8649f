"""The ONNX front end: costs by hand, constant folding, parameters, control flow, bad input.

Small models are built with ``onnx.helper`` so every FLOP and byte can be checked by hand; zoo
exports are compared with the torch front end's capture of the same model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cost_models.profiles import load_profile
from models.onnx_models import export_zoo, light_model
from partitioner import from_module, from_onnx
from partitioner.errors import OnnxError
from partitioner.frontends.onnx import module_path
from partitioner.ir import OpClass
from partitioner.solvers.problem import Problem

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), *, opset=17, ir=8, value_info=(), opsets=()):  # noqa: ANN001, ANN201
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers), value_info=list(value_info))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *opsets])
    m.ir_version = ir
    return m


def vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:  # noqa: ANN001
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


# --------------------------------------------------------------------------------------------
# Costs
# --------------------------------------------------------------------------------------------


def test_flops_and_bytes_of_common_ops_by_hand() -> None:
    w = init("w", np.ones((4, 3, 3, 3), np.float32))
    b = init("b", np.ones((16, 8), np.float32))
    c = init("c", np.ones((8,), np.float32))
    shape = init("shape", np.array([2, 128], np.int64))
    table = init("table", np.ones((10, 8), np.float32))
    idx = init("idx", np.array([[1, 2]], np.int64))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv"),   # [1,4,8,8]
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),        # [2,128]
        helper.make_node("Slice", ["flat", "s0", "s1", "s2"], ["a"], name="slice"),   # [2,16]
        helper.make_node("Gemm", ["a", "b", "c"], ["g"], name="gemm"),                 # [2,8]
        helper.make_node("Softmax", ["g"], ["out"], name="softmax"),
        helper.make_node("Gather", ["table", "idx"], ["emb"], name="gather"),          # [1,2,8]
    ]
    consts = [init("s0", np.array([0], np.int64)), init("s1", np.array([16], np.int64)),
              init("s2", np.array([1], np.int64))]
    g = from_onnx(model(nodes, [vi("x", [1, 3, 8, 8])], [vi("out", None), vi("emb", None)],
                        [w, b, c, shape, table, idx, *consts]))
    op = g.ops
    # the Relu is fused into the Conv (as onnxruntime runs it): one op, the Relu's 256 FLOPs added,
    # and no bytes for the tensor between them
    assert "relu" not in op and op["conv"].aten_ops == ("Conv", "Relu") and op["conv"].outputs == ("r",)
    assert op["conv"].op_class is OpClass.CONV and op["conv"].flops == 2 * (4 * 8 * 8) * 3 * 9 + 256
    assert op["conv"].bytes_read == (3 * 64 + 4 * 27) * 4 and op["conv"].bytes_written == 4 * 64 * 4
    assert op["conv"].groups == 1 and op["gemm"].groups == 1
    assert op["reshape"].op_class is OpClass.VIEW and op["reshape"].bytes_read == 0
    assert op["gemm"].op_class is OpClass.MATMUL and op["gemm"].flops == 2 * 2 * 8 * 16 + 2 * 8
    assert op["softmax"].flops == 5 * 16
    depthwise = from_onnx(model([helper.make_node("Conv", ["x", "dw"], ["y"], group=3, pads=[1, 1, 1, 1], name="dw")],
                                [vi("x", [1, 3, 8, 8])], [vi("y", None)], [init("dw", np.ones((3, 1, 3, 3), np.float32))]))
    assert depthwise.ops["dw"].groups == 3 and depthwise.ops["dw"].flops == 2 * (3 * 8 * 8) * 9
    assert op["slice"].op_class is OpClass.DATA_MOVEMENT and op["slice"].bytes_written == 2 * 16 * 4
    # a gather reads the rows it returns (and its indices), not the whole table
    assert op["gather"].op_class is OpClass.GATHER and op["gather"].bytes_written == 16 * 4
    assert op["gather"].bytes_read == 16 * 4 + 2 * 8
    assert g.tensors["flat"].shape == (2, 128) and g.tensors["a"].nbytes == 2 * 16 * 4
    assert op["conv"].param_bytes == 4 * 27 * 4 and op["gather"].param_bytes == (80 * 4 + 2 * 8)


def test_matmul_of_two_activations_next_to_a_softmax_is_attention() -> None:
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["s"], name="scores"),      # [2,4,8,8]
        helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="weighted"),     # [2,4,8,16]
        helper.make_node("MatMul", ["o", "w"], ["y"], name="proj"),          # a weight: a projection
    ]
    inputs = [vi("q", [2, 4, 8, 16]), vi("k", [2, 4, 16, 8]), vi("v", [2, 4, 8, 16])]
    g = from_onnx(model(nodes, inputs, [vi("y", None)], [init("w", np.ones((16, 16), np.float32))]))
    assert g.ops["scores"].op_class is OpClass.ATTENTION and g.ops["weighted"].op_class is OpClass.ATTENTION
    assert g.ops["proj"].op_class is OpClass.MATMUL
    assert g.ops["scores"].flops == 2 * (2 * 4 * 8 * 8) * 16


def test_chains_onnxruntime_fuses_are_one_op() -> None:
    """Conv -> BatchNormalization [-> residual Sum] [-> Relu] (every conv of ResNet-50) is one op, as
    onnxruntime runs it; a Conv whose output has a second reader, and a Relu after a Relu, are not fused."""
    g = from_onnx(light_model("resnet50"))
    kinds = [op.kind for op in g.ops.values()]
    assert len(g) == 58 and kinds.count("Conv") == 53 and "Sum" not in kinds and "Relu" not in kinds
    assert sum(op.aten_ops == ("Conv", "BatchNormalization", "Relu") for op in g.ops.values()) == 33
    assert sum(op.aten_ops == ("Conv", "BatchNormalization", "Sum", "Relu") for op in g.ops.values()) == 16
    assert sum(op.aten_ops == ("Conv", "BatchNormalization") for op in g.ops.values()) == 4
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv"), helper.make_node("Relu", ["y"], ["r"], name="r1"),
             helper.make_node("Relu", ["r"], ["r2"], name="r2"), helper.make_node("Add", ["y", "r2"], ["z"], name="add")]
    g = from_onnx(model(nodes, [vi("x", [1, 3, 4, 4])], [vi("z", None)], [init("w", np.ones((3, 3, 1, 1), np.float32))]))
    assert sorted(g.ops) == ["add", "conv", "r1", "r2"]


def test_a_residual_add_joins_the_conv_chain_it_sums_into() -> None:
    """x -> conv -> Add(conv, x) -> Relu is one op (NCHWc's Sum and activation); an Add that broadcasts
    a smaller tensor, or whose conv input has another reader, is not."""
    w = init("w", np.ones((3, 3, 1, 1), np.float32))

    def graph(second: str, extra: list | None = None, shape: list | None = None):  # noqa: ANN202
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv"),
                 helper.make_node("Add", ["y", second], ["s"], name="add"),
                 helper.make_node("Relu", ["s"], ["z"], name="relu"), *(extra or [])]
        inputs = [vi("x", [1, 3, 4, 4])] + ([vi("b", shape)] if shape else [])
        outputs = [vi("z", None)] + ([vi("y2", None)] if extra else [])
        return from_onnx(model(nodes, inputs, outputs, [w]))

    g = graph("x")
    assert sorted(g.ops) == ["conv"] and g.ops["conv"].aten_ops == ("Conv", "Add", "Relu")
    assert sorted(graph("b", shape=[1, 3, 1, 1]).ops) == ["add", "conv", "relu"]  # broadcast: an Add kernel
    g = graph("x", extra=[helper.make_node("Neg", ["y"], ["y2"], name="neg")])
    assert sorted(g.ops) == ["add", "conv", "neg", "relu"]  # y has a second reader: conv writes it
    # a constant added after the sum cannot be folded into the convolution: the chain ends at the sum
    c = init("c", np.ones((1, 3, 1, 1), np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv"), helper.make_node("Add", ["y", "x"], ["s"], name="add"),
             helper.make_node("Add", ["s", "c"], ["t"], name="shift"), helper.make_node("Relu", ["t"], ["z"], name="relu")]
    g = from_onnx(model(nodes, [vi("x", [1, 3, 4, 4])], [vi("z", None)], [w, c]))
    assert sorted(g.ops) == ["conv", "relu", "shift"] and g.ops["conv"].aten_ops == ("Conv", "Add")
    assert g.ops["shift"].aten_ops == ()


def test_an_op_without_a_cost_entry_is_costed_by_its_bytes_and_listed() -> None:
    g = from_onnx(model([helper.make_node("Det", ["x"], ["d"], name="det")], [vi("x", [3, 4, 4])], [vi("d", None)]))
    assert g.ops["det"].op_class is OpClass.OTHER and g.ops["det"].flops == 0
    assert g.ops["det"].bytes_read == 48 * 4 and g.source.fallback_ops == ("Det",)


# --------------------------------------------------------------------------------------------
# Constants, parameters, shapes
# --------------------------------------------------------------------------------------------


def test_constant_subgraphs_fold_into_parameters_counted_once() -> None:
    """ConstantOfShape makes a weight (no op, a parameter); an Identity of it is the same weight."""
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["w"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Identity", ["w"], ["w_tied"]),
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Conv", ["y", "w_tied"], ["z"], pads=[1, 1, 1, 1], name="conv2"),
    ]
    g = from_onnx(model(nodes, [vi("x", [1, 3, 8, 8])], [vi("z", None)],
                        [init("wshape", np.array([3, 3, 3, 3], np.int64))]))
    assert sorted(g.ops) == ["conv1", "conv2"]
    assert list(g.params) == ["w"] and g.params["w"].aliases == ("w_tied",) and g.params["w"].nbytes == 81 * 4
    assert g.ops["conv1"].owned_params == ("w",) and g.ops["conv2"].params == ("w",)
    assert g.total_param_bytes() == 81 * 4


def test_shape_arithmetic_folds_so_every_tensor_has_a_static_shape(tmp_path: Path) -> None:
    """The torch exporter's attention reshapes compute their targets with Shape -> Slice -> Concat
    chains whose slice ends come from Reshape(Mod(...)): onnx's inference alone leaves those shapes
    unknown; folding the chains (as onnxruntime does) makes every shape static, and none is an op."""
    path = export_zoo("gpt", "tiny", tmp_path / "gpt.onnx")
    inferred = onnx.shape_inference.infer_shapes(onnx.load(path), strict_mode=True, data_prop=True)
    unknown = [v.name for v in inferred.graph.value_info
               if not all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)]
    assert len(unknown) > 20
    g = from_onnx(path)
    assert all(d >= 0 for t in g.tensors.values() for d in t.shape)
    assert not any(op.kind in ("Shape", "Slice", "Concat", "Mod", "Constant") and not op.inputs
                   for op in g.ops.values())
    assert not any(op.kind == "Shape" for op in g.ops.values())


def test_old_models_keep_initializers_listed_as_inputs_as_weights() -> None:
    g = from_onnx(light_model("squeezenet"))
    assert g.inputs == ("data_0",) and not any(op.kind == "ConstantOfShape" for op in g.ops.values())
    conv_weights = sum(op.param_bytes for op in g.ops.values() if op.op_class is OpClass.CONV)
    assert conv_weights > 4_000_000  # SqueezeNet 1.0: 1.2 M parameters, made by ConstantOfShape chains


def test_zoo_exports_cost_like_the_torch_capture(tmp_path: Path) -> None:
    import models

    for name in ("mlp", "convnet", "gpt"):
        g = from_onnx(export_zoo(name, "tiny", tmp_path / f"{name}.onnx"))
        module, inputs = models.get(name, "tiny")
        t = from_module(module, inputs)
        assert g.total_flops() == pytest.approx(t.total_flops(), rel=0.15), name
        if name == "mlp":
            assert g.total_param_bytes() == t.total_param_bytes()
        if name == "convnet":  # the exporter folds BatchNorm into the convs and keeps one copy of equal biases
            assert g.total_param_bytes() < t.total_param_bytes()


def test_module_paths_come_from_the_torch_exporter_names() -> None:
    assert module_path("/layer1/layer1.0/conv1/Conv") == "layer1.0.conv1"
    assert module_path("/blocks.0/attn/MatMul_1") == "blocks.0.attn"
    assert module_path("/Relu") == "" and module_path("conv_3") == ""


# --------------------------------------------------------------------------------------------
# Control flow and devices
# --------------------------------------------------------------------------------------------


def _loop_model(trips: int) -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["h2"]), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("cond", [], TensorProto.BOOL), vi("h", [4, 8])],
        [vi("cond_out", [], TensorProto.BOOL), vi("h2", [4, 8])])
    nodes = [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body, name="loop"),
             helper.make_node("Relu", ["y"], ["out"], name="relu")]
    inits = [init("trips", np.array(trips, np.int64)), init("w", np.ones((8, 8), np.float32))]
    return model(nodes, [vi("x", [4, 8])], [vi("out", None)], inits)


def test_a_loop_is_one_op_costed_by_its_body_times_its_trips() -> None:
    g = from_onnx(_loop_model(3))
    loop = g.ops["loop"]
    assert loop.op_class is OpClass.OTHER and loop.inputs == ("x",)
    assert loop.flops == 3 * 2 * 4 * 8 * 8 and loop.params == ("trips", "w")  # w read from the body


def test_if_costs_its_costlier_branch_and_scan_its_length() -> None:
    def branch(op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x", "w"], ["r"])], op, [], [vi("r", [4, 8])])

    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch("MatMul"), else_branch=branch("Add"), name="if")]
    g = from_onnx(model(nodes, [vi("x", [4, 8]), vi("c", [], TensorProto.BOOL)], [vi("y", None)],
                        [init("w", np.ones((8, 8), np.float32))]))
    assert g.ops["if"].flops == 2 * 4 * 8 * 8 and set(g.ops["if"].inputs) == {"c", "x"}
    body = helper.make_graph([helper.make_node("Add", ["s", "xi"], ["s2"]), helper.make_node("Identity", ["s2"], ["yi"])],
                             "body", [vi("s", [8]), vi("xi", [8])], [vi("s2", [8]), vi("yi", [8])])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, name="scan")]
    g = from_onnx(model(nodes, [vi("s0", [8]), vi("xs", [5, 8])], [vi("s", None), vi("ys", None)]))
    assert g.ops["scan"].flops == 5 * 8


def test_op_classes_meet_the_profiles_supported_ops() -> None:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="gather"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="matmul")]
    g = from_onnx(model(nodes, [vi("ids", [2, 3], TensorProto.INT64)], [vi("y", None)],
                        [init("table", np.ones((10, 8), np.float32)), init("w", np.ones((8, 4), np.float32))]))
    problem = Problem(g, load_profile("cpu-gpu-npu"))
    assert "npu:0" not in problem.allowed["gather"] and "npu:0" in problem.allowed["matmul"]
    assert "npu:0" not in Problem(from_onnx(_loop_model(2)), load_profile("cpu-gpu-npu")).allowed["loop"]


# --------------------------------------------------------------------------------------------
# Input shapes
# --------------------------------------------------------------------------------------------


def _symbolic() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", ["batch", 3, 4])], [vi("y", None)])


def test_symbolic_dimensions_are_bound_from_input_shapes() -> None:
    g = from_onnx(_symbolic(), {"x": (5, 3, 4)})
    assert g.tensors["y"].shape == (5, 3, 4) and g.ops["relu"].flops == 60
    assert from_onnx(_symbolic(), [(2, 3, 4)]).tensors["y"].shape == (2, 3, 4)  # positional, as plans record


@pytest.mark.parametrize("shapes, words", [
    (None, ["input 'x'", "dimension 0 ('batch') unknown", "--input-shape x=Nx3x4"]),
    ({"x": (5, 4, 4)}, ["input 'x'", "batchx3x4", "dimension 1: 3 vs 4"]),
    ({"x": (5, 3)}, ["rank 3", "rank 2"]),
    ({"y": (5, 3, 4)}, ["'y'", "not an input", "'x'"]),
])
def test_input_shape_errors_name_the_input_and_the_fix(shapes, words) -> None:  # noqa: ANN001
    with pytest.raises(OnnxError) as err:
        from_onnx(_symbolic(), shapes)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------
# Bad files and graphs
# --------------------------------------------------------------------------------------------


def test_a_truncated_corrupt_or_empty_file_is_one_line_naming_it(tmp_path: Path) -> None:
    good = light_model("squeezenet").read_bytes()
    for label, data in (("half", good[: len(good) // 2]), ("text", b"hello world\n"), ("empty", b"")):
        path = tmp_path / f"{label}.onnx"
        path.write_bytes(data)
        with pytest.raises(OnnxError) as err:
            from_onnx(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value), label
        assert ("truncated" in str(err.value)), label
    with pytest.raises(OnnxError, match="no such ONNX file"):
        from_onnx(tmp_path / "absent.onnx")


def test_external_data_is_read_from_beside_the_model_and_a_missing_file_is_named(tmp_path: Path) -> None:
    w = init("w", np.ones((64, 64), np.float32))
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", [2, 64])], [vi("y", None)], [w])
    path = tmp_path / "big.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="big.weights", size_threshold=0)
    assert (tmp_path / "big.weights").stat().st_size == 64 * 64 * 4
    assert from_onnx(path).ops["mm"].param_bytes == 64 * 64 * 4
    (tmp_path / "big.weights").write_bytes(b"\0" * 100)
    with pytest.raises(OnnxError, match="truncated"):
        from_onnx(path)
    (tmp_path / "big.weights").unlink()
    with pytest.raises(OnnxError) as err:
        from_onnx(path)
    assert "'w'" in str(err.value) and "big.weights" in str(err.value) and "copy that file" in str(err.value)


def test_an_unknown_domain_and_an_op_without_shape_inference_are_named() -> None:
    custom = model([helper.make_node("Frob", ["x"], ["y"], domain="acme.ops", name="frob")], [vi("x", [2])],
                   [vi("y", None)], opsets=[helper.make_opsetid("acme.ops", 1)])
    with pytest.raises(OnnxError) as err:
        from_onnx(custom)
    assert "'acme.ops'" in str(err.value) and "'frob'" in str(err.value)
    unknown = model([helper.make_node("NotAnOp", ["x"], ["t"], domain="com.microsoft", name="mystery"),
                     helper.make_node("Relu", ["t"], ["y"])], [vi("x", [2])], [vi("y", None)],
                    opsets=[helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(OnnxError) as err:
        from_onnx(unknown)
    assert "'mystery' (NotAnOp" in str(err.value) and "'t'" in str(err.value) and "value_info" in str(err.value)
    typed = onnx.ModelProto()
    typed.CopyFrom(unknown)
    typed.graph.value_info.append(vi("t", [2]))  # the fix the message gives
    assert from_onnx(typed).source.fallback_ops == ("com.microsoft.NotAnOp",)


def test_a_cycle_and_a_dangling_input_are_named() -> None:
    cyclic = model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                    helper.make_node("Relu", ["a"], ["b"], name="second")], [vi("x", [2])], [vi("b", None)])
    with pytest.raises(OnnxError, match="cycle through nodes 'first' .* -> 'second'"):
        from_onnx(cyclic)
    dangling = model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [vi("x", [2])], [vi("y", None)])
    with pytest.raises(OnnxError) as err:
        from_onnx(dangling)
    assert "'add'" in str(err.value) and "'ghost'" in str(err.value) and "add it as an input" in str(err.value)
