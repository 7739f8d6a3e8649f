"""OpGraph: construction checks, deterministic order, edges, fingerprint."""

from __future__ import annotations

import pytest

from partitioner.errors import GraphError
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor


def _op(name: str, index: int, inputs: tuple[str, ...], *, params: tuple[str, ...] = (), flops: int = 10) -> Op:
    return Op(
        name=name, kind="aten.add.Tensor", op_class=OpClass.ELEMENTWISE, index=index, module_path="", module_type="M",
        dtype="float32", inputs=inputs, outputs=(name,), params=params, owned_params=params, flops=flops,
        bytes_read=8, bytes_written=4, param_bytes=16 * len(params), trainable_param_bytes=16 * len(params),
    )


def _t(name: str, producer: str | None, nbytes: int = 4, shape: tuple[int, ...] = (1,)) -> Tensor:
    return Tensor(name, producer, (), shape, "float32", nbytes)


def diamond(shape_b: tuple[int, ...] = (1,)) -> OpGraph:
    """x -> a -> (c, b) -> d, with c listed before b in program order."""
    ops = [_op("a", 0, ("x",), params=("w",)), _op("c", 1, ("a",)), _op("b", 2, ("a",)), _op("d", 3, ("b", "c"))]
    tensors = [_t("x", None), _t("a", "a", 8), _t("b", "b", shape=shape_b), _t("c", "c"), _t("d", "d")]
    params = [Param("w", (4,), "float32", 16, True, "a", ("a",))]
    return OpGraph("diamond", ops, tensors, params, ("x",), ("d",))


def test_order_is_topological_and_breaks_ties_by_program_order() -> None:
    g = diamond()
    assert [op.name for op in g.topological_order()] == ["a", "c", "b", "d"]
    assert [op.name for op in g] == ["a", "c", "b", "d"]
    assert g.predecessors("d") == ("c", "b")
    assert g.successors("a") == ("c", "b")


def test_edges_carry_tensor_names_and_bytes() -> None:
    g = diamond()
    assert g.dag.edges["a", "b"] == {"tensors": ("a",), "bytes": 8}
    assert set(g.dag.edges) == {("a", "c"), ("a", "b"), ("b", "d"), ("c", "d")}


def test_totals() -> None:
    g = diamond()
    assert g.total_flops() == 40
    assert g.total_param_bytes() == 16
    assert g.output_shapes("b") == ((1,),)


def test_fingerprint_is_stable_and_sees_shapes() -> None:
    assert diamond().fingerprint() == diamond().fingerprint()
    assert diamond().fingerprint() != diamond(shape_b=(2,)).fingerprint()


def test_duplicate_op_name_is_rejected() -> None:
    ops = [_op("a", 0, ("x",)), _op("a", 1, ("x",))]
    with pytest.raises(GraphError, match="two ops are named 'a'"):
        OpGraph("g", ops, [_t("x", None), _t("a", "a")], [], ("x",), ("a",))


def test_dangling_tensor_is_rejected() -> None:
    with pytest.raises(GraphError, match="reads tensor 'nope'"):
        OpGraph("g", [_op("a", 0, ("nope",))], [_t("a", "a")], [], (), ("a",))


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(GraphError, match="reads parameter 'w'"):
        OpGraph("g", [_op("a", 0, ("x",), params=("w",))], [_t("x", None), _t("a", "a")], [], ("x",), ("a",))


def test_cycle_is_rejected_with_the_ops_named() -> None:
    ops = [_op("a", 0, ("b",)), _op("b", 1, ("a",))]
    with pytest.raises(GraphError, match="cycle through"):
        OpGraph("g", ops, [_t("a", "a"), _t("b", "b")], [], (), ("b",))


def test_unknown_op_lookup_suggests_close_names() -> None:
    with pytest.raises(KeyError, match="did you mean"):
        diamond().op("aa")
