"""Coarsening: invariants on every zoo model, cycle refusal, module grouping, auto mode, scale, limits."""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter

import networkx as nx
import pytest

import models
from partitioner import from_module
from partitioner.coarsen import (
    Coarsening,
    CoarsenOptions,
    _contract,
    _Contraction,
    auto_coarsen,
    coarsen,
    common_module_path,
    identity,
)
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo() -> dict[str, OpGraph]:
    """Every zoo model at tiny size, captured with torch.export."""
    graphs = {}
    for name in models.names():
        module, inputs = models.get(name, "tiny")
        graphs[name] = from_module(module, inputs, name=name)
    return graphs


def _op(
    name: str, index: int, inputs: tuple[str, ...], *, op_class: OpClass = OpClass.ELEMENTWISE, module: str = "",
    params: tuple[str, ...] = (), flops: int = 10,
) -> Op:
    view = op_class is OpClass.VIEW
    return Op(
        name=name, kind="aten.view.default" if view else "aten.add.Tensor", op_class=op_class, index=index,
        module_path=module, module_type="M", dtype="float32", inputs=inputs, outputs=(name,), params=params,
        owned_params=params, flops=0 if view else flops, bytes_read=0 if view else 8, bytes_written=0 if view else 4,
        param_bytes=16 * len(params), trainable_param_bytes=16 * len(params), aten_ops=(name,),
    )


def _graph(name: str, ops: list[Op], outputs: tuple[str, ...], params: tuple[Param, ...] = ()) -> OpGraph:
    """A graph from ops that each produce one tensor named after themselves; "x" is the input."""
    consumers: dict[str, list[str]] = {}
    for op in ops:
        for t in op.inputs:
            consumers.setdefault(t, []).append(op.name)
    tensors = [Tensor("x", None, tuple(consumers.get("x", ())), (4,), "float32", 16)]
    tensors += [Tensor(op.name, op.name, tuple(consumers.get(op.name, ())), (4,), "float32", 16) for op in ops]
    return OpGraph(name, ops, tensors, params, ("x",), outputs)


def triangle() -> OpGraph:
    """x -> a; a -> c -> b; a -> b; b -> d. Merging a with b alone would make a <-> c a cycle."""
    ops = [_op("a", 0, ("x",)), _op("c", 1, ("a",)), _op("b", 2, ("a", "c")), _op("d", 3, ("b",))]
    return _graph("triangle", ops, ("d",))


def layered(layers: int = 100, width: int = 100, seed: int = 0) -> OpGraph:
    """A random layered DAG: each op reads 1-3 ops of the layer before; about a quarter are views."""
    rng = random.Random(seed)
    ops: list[Op] = []
    previous = ["x"]
    for layer in range(layers):
        current = []
        for j in range(width):
            name = f"l{layer}_{j}"
            inputs = tuple(sorted(set(rng.sample(previous, min(len(previous), rng.randint(1, 3))))))
            op_class = OpClass.VIEW if rng.random() < 0.25 else OpClass.MATMUL
            ops.append(_op(name, len(ops), inputs, op_class=op_class, module=f"layers.{layer}.part{j % 4}"))
            current.append(name)
        previous = current
    return _graph("layered", ops, tuple(previous))


def check_coarsening(graph: OpGraph, c: Coarsening) -> None:
    """Every invariant a coarsening must keep, whatever the options."""
    coarse = c.graph
    assert nx.is_directed_acyclic_graph(coarse.dag)
    # every op in exactly one group; the two maps agree
    assert Counter(m for ms in c.members.values() for m in ms) == Counter(list(graph.ops))
    assert set(c.group_of) == set(graph.ops) and set(c.members) == set(coarse.ops)
    for group, ms in c.members.items():
        assert all(c.group_of[m] == group for m in ms)
        assert group == ms[0] and [graph.ops[m].index for m in ms] == sorted(graph.ops[m].index for m in ms)
        assert (coarse.ops[group].kind == "group") == (len(ms) > 1)
    # totals and the graph's interface
    assert coarse.total_flops() == graph.total_flops()
    assert coarse.total_param_bytes() == graph.total_param_bytes()
    assert sum(op.param_bytes for op in coarse) == sum(op.param_bytes for op in graph)
    assert coarse.inputs == graph.inputs and coarse.outputs == graph.outputs
    # every coarse edge stands for an original edge between members of the two groups
    for u, v in coarse.dag.edges:
        assert any(graph.dag.has_edge(a, b) for a in c.members[u] for b in c.members[v]), (u, v)
    # and every original edge between groups is still there
    for a, b in graph.dag.edges:
        ga, gb = c.group_of[a], c.group_of[b]
        assert ga == gb or coarse.dag.has_edge(ga, gb), (a, b)
    # records point at groups
    for t in coarse.tensors.values():
        assert t.producer is None or t.producer in coarse.ops
        assert set(t.consumers) <= set(coarse.ops) and t.producer not in t.consumers
    for p in coarse.params.values():
        assert (p.owner is None or p.owner in coarse.ops) and set(p.users) <= set(coarse.ops)
    assert all(op.outputs for op in coarse)
    # expand round-trips
    per_group = {g: i for i, g in enumerate(c.members)}
    per_op = c.expand(per_group)
    assert set(per_op) == set(graph.ops)
    assert all(per_op[m] == per_group[g] for g, ms in c.members.items() for m in ms)


# --------------------------------------------------------------------------------------------
# Zoo models
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", models.names())
def test_zoo_models_coarsen_to_valid_smaller_dags(zoo: dict[str, OpGraph], name: str) -> None:
    graph = zoo[name]
    c = coarsen(graph)
    check_coarsening(graph, c)
    if any(op.is_view for op in graph):
        assert len(c.graph) < len(graph)
    # no view is left on its own next to a producer it could have joined
    for op in c.graph:
        if op.is_view and op.kind != "group":
            producers = {graph.tensors[t].producer for t in op.inputs} - {None}
            assert len(producers) != 1, op.name


@pytest.mark.parametrize("name", models.names())
def test_every_option_set_keeps_the_invariants(zoo: dict[str, OpGraph], name: str) -> None:
    graph = zoo[name]
    for options in (
        CoarsenOptions(fold_views=False, merge_chains=False),
        CoarsenOptions(merge_chains=False),
        CoarsenOptions(fold_views=False),
        CoarsenOptions(module_depth=1),
        CoarsenOptions(module_depth=3, max_group_ops=4),
    ):
        check_coarsening(graph, coarsen(graph, options))


def test_nothing_enabled_keeps_every_op(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["gpt"]
    c = coarsen(graph, CoarsenOptions(fold_views=False, merge_chains=False))
    assert len(c.graph) == len(graph)
    assert all(c.graph.ops[n] == graph.ops[n] for n in graph.ops)


def test_group_records(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["gpt"]
    c = coarsen(graph)
    # q projection + its unflatten/transpose views: one matmul group in blocks.0.attn
    group = c.graph.ops[c.group_of["unflatten"]]
    assert c.members[group.name] == ("linear", "unflatten", "transpose")
    assert (group.name, group.kind, group.op_class) == ("linear", "group", OpClass.MATMUL)
    assert group.module_path == "blocks.0.attn" and group.module_type == "group"
    assert group.inputs == ("layer_norm",) and group.outputs == ("transpose",)
    assert group.params == graph.ops["linear"].params
    assert group.aten_ops == tuple(a for m in c.members["linear"] for a in graph.ops[m].aten_ops)
    # the tied embedding weight: same record, owner and users mapped to groups
    tied = c.graph.params["tok_emb.weight"]
    assert tied.owner == c.group_of[graph.params["tok_emb.weight"].owner]
    assert set(tied.users) == {c.group_of[u] for u in graph.params["tok_emb.weight"].users}


def test_deterministic(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["bert"]
    for options in (CoarsenOptions(), CoarsenOptions(module_depth=2)):
        a, b = coarsen(graph, options), coarsen(graph, options)
        assert dict(a.members) == dict(b.members)
        assert [dataclasses.astuple(op) for op in a.graph] == [dataclasses.astuple(op) for op in b.graph]
        assert dict(a.graph.tensors) == dict(b.graph.tensors)


def test_input_graph_is_not_modified(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["gpt"]
    before = (dict(graph.ops), dict(graph.tensors), dict(graph.params), set(graph.dag.edges), graph.fingerprint())
    coarsen(graph, CoarsenOptions(module_depth=2))
    assert before == (dict(graph.ops), dict(graph.tensors), dict(graph.params), set(graph.dag.edges), graph.fingerprint())


# --------------------------------------------------------------------------------------------
# Cycles
# --------------------------------------------------------------------------------------------


def test_triangle_merge_that_would_make_a_cycle_is_refused() -> None:
    graph = triangle()
    # a and b share module "m"; c is elsewhere: a, b alone would form a cycle with c
    ops = [dataclasses.replace(op, module_path="m" if op.name in "ab" else "other") for op in graph]
    graph = _graph("triangle", ops, ("d",))
    c = coarsen(graph, CoarsenOptions(fold_views=False, merge_chains=False, module_depth=1))
    check_coarsening(graph, c)
    assert c.group_of["a"] != c.group_of["b"]
    assert sorted(c.members.values()) == [("a",), ("b",), ("c",), ("d",)]


def test_triangle_merge_is_allowed_once_the_middle_op_joins() -> None:
    graph = triangle()
    ops = [dataclasses.replace(op, module_path="m" if op.name in "abc" else "other") for op in graph]
    graph = _graph("triangle", ops, ("d",))
    c = coarsen(graph, CoarsenOptions(fold_views=False, merge_chains=False, module_depth=1))
    check_coarsening(graph, c)
    assert dict(c.members) == {"a": ("a", "c", "b"), "d": ("d",)}


def test_view_fed_by_input_joins_its_first_consumer_only_without_a_cycle() -> None:
    # v (a view of x) feeds c and b, and c feeds b: v may join c (first consumer) but not b alone
    ops = [
        _op("v", 0, ("x",), op_class=OpClass.VIEW),
        _op("c", 1, ("v",)),
        _op("b", 2, ("v", "c")),
    ]
    graph = _graph("fan", ops, ("b",))
    c = coarsen(graph, CoarsenOptions(merge_chains=False))
    check_coarsening(graph, c)
    assert dict(c.members) == {"v": ("v", "c"), "b": ("b",)}
    assert c.graph.ops["v"].op_class is OpClass.ELEMENTWISE and c.graph.ops["v"].inputs == ("x",)


def test_all_view_group_and_chain() -> None:
    ops = [
        _op("v1", 0, ("x",), op_class=OpClass.VIEW),
        _op("v2", 1, ("v1",), op_class=OpClass.VIEW),
        _op("a", 2, ("v2",)),
        _op("b", 3, ("a",)),
        _op("e", 4, ("a",)),
    ]
    graph = _graph("views", ops, ("b", "e"))
    c = coarsen(graph, CoarsenOptions(merge_chains=False))
    check_coarsening(graph, c)
    assert dict(c.members) == {"v1": ("v1", "v2", "a"), "b": ("b",), "e": ("e",)}
    assert c.graph.ops["v1"].outputs == ("a",)
    only_views = coarsen(graph, CoarsenOptions(merge_chains=False, keep_separate=frozenset({"a"})))
    assert only_views.members["v1"] == ("v1", "v2") and only_views.graph.ops["v1"].op_class is OpClass.VIEW


# --------------------------------------------------------------------------------------------
# Module grouping and auto mode
# --------------------------------------------------------------------------------------------


def test_module_depth_two_groups_transformer_blocks(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["gpt"]
    plain = coarsen(graph)
    c = coarsen(graph, CoarsenOptions(module_depth=2))
    check_coarsening(graph, c)
    assert len(c.graph) < len(plain.graph) < len(graph)
    paths = {op.module_path for op in c.graph}
    assert {"blocks.0", "blocks.1"} <= paths
    assert not any(p.count(".") >= 2 for p in paths)
    block0 = next(g for g in c.members if c.graph.ops[g].module_path == "blocks.0")
    assert {"linear", "scaled_dot_product_attention", "gelu"} <= set(c.members[block0])


def random_dag(seed: int, size: int = 30) -> OpGraph:
    """A small random DAG with long edges, a few module keys and some views."""
    rng = random.Random(seed)
    ops: list[Op] = []
    for i in range(size):
        earlier = ["x"] + [op.name for op in ops]
        inputs = tuple(sorted(set(rng.choices(earlier[-rng.choice((3, 10, size)):], k=rng.randint(1, 3)))))
        op_class = OpClass.VIEW if rng.random() < 0.3 else OpClass.ELEMENTWISE
        ops.append(_op(f"o{i}", i, inputs, op_class=op_class, module=f"m{rng.randint(0, 2)}.s{rng.randint(0, 1)}"))
    consumed = {t for op in ops for t in op.inputs}
    return _graph(f"random{seed}", ops, tuple(op.name for op in ops if op.name not in consumed))


@pytest.mark.parametrize("depth", [1, 2])
def test_random_dags_with_long_edges_stay_acyclic(depth: int) -> None:
    # module keys interleave along long edges, so most merges need the reachability test and re-ranking
    for seed in range(80):
        graph = random_dag(seed)
        for options in (CoarsenOptions(module_depth=depth), CoarsenOptions(fold_views=False, module_depth=depth)):
            check_coarsening(graph, coarsen(graph, options))


def _group_dag(c: _Contraction) -> nx.DiGraph:
    dag = nx.DiGraph()
    for root in c.roots_in_order():
        dag.add_node(root)
        dag.add_edges_from((root, s) for s in c.succ[root])
    return dag


def test_random_merges_are_refused_exactly_when_they_would_make_a_cycle() -> None:
    # the core primitive, against networkx: merge random pairs (adjacent or not) and compare
    refused = accepted = 0
    for seed in range(60):
        graph, rng = random_dag(seed), random.Random(seed)
        c = _contract(graph, CoarsenOptions(fold_views=False, merge_chains=False))
        for _ in range(25):
            a, b = (c.find(i) for i in rng.sample(range(len(graph)), 2))
            if a == b:
                continue
            quotient = nx.contracted_nodes(_group_dag(c), a, b, self_loops=False)
            would_cycle = not nx.is_directed_acyclic_graph(quotient)
            merged = c.merge(a, b)
            assert (merged is None) == would_cycle, (seed, a, b)
            refused, accepted = refused + would_cycle, accepted + (not would_cycle)
            dag = _group_dag(c)
            assert nx.is_directed_acyclic_graph(dag)
            assert all(c.rank[u] < c.rank[v] for u, v in dag.edges), "ranks must stay a topological order"
    assert refused > 50 and accepted > 50


def test_common_module_path() -> None:
    assert common_module_path(["blocks.1.attn.q_proj", "blocks.1.attn", "blocks.10"]) == "blocks"
    assert common_module_path(["a.b", "a.b.c"]) == "a.b"
    assert common_module_path(["a.b", ""]) == ""


def test_identity(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["bert"]
    c = identity(graph)
    assert c.graph is graph and all(c.members[n] == (n,) for n in graph.ops)
    check_coarsening(graph, c)


def test_auto_coarsen_is_identity_at_or_below_the_threshold(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["gpt"]
    assert auto_coarsen(graph, threshold=len(graph)).graph is graph


def test_auto_coarsen_gpt_base_gets_under_the_threshold_quickly() -> None:
    module, inputs = models.get("gpt", "base", device="meta")
    graph = from_module(module, inputs, name="gpt")
    for threshold in (300, 100, 30):
        start = time.perf_counter()
        c = auto_coarsen(graph, threshold=threshold)
        elapsed = time.perf_counter() - start
        assert elapsed < 10, f"auto_coarsen took {elapsed:.1f} s"
        check_coarsening(graph, c)
        assert len(c.graph) <= threshold
    # 30 needs module grouping; the deepest depth under it keeps the 12 blocks apart
    assert sum(op.module_path.startswith("blocks.") for op in c.graph) == 12


def test_auto_coarsen_falls_back_to_the_coarsest() -> None:
    graph = _graph("chain", [_op(f"o{i}", i, ("x" if i == 0 else f"o{i - 1}",)) for i in range(10)], ("o9",))
    c = auto_coarsen(graph, threshold=5, max_group_ops=3)
    check_coarsening(graph, c)
    assert len(c.graph) == 4 and max(len(m) for m in c.members.values()) == 3


# --------------------------------------------------------------------------------------------
# Scale and limits
# --------------------------------------------------------------------------------------------


def test_ten_thousand_op_layered_graph_coarsens_quickly() -> None:
    graph = layered()
    assert len(graph) == 10_000
    for options in (CoarsenOptions(), CoarsenOptions(module_depth=2)):
        start = time.perf_counter()
        c = coarsen(graph, options)
        elapsed = time.perf_counter() - start
        assert elapsed < 20, f"coarsen({options}) took {elapsed:.1f} s on 10,000 ops"
        assert nx.is_directed_acyclic_graph(c.graph.dag) and len(c.graph) < len(graph)
    check_coarsening(graph, c)
    assert len(c.graph) <= 100 * 4 + 100  # at most the 4 modules of each layer, plus stragglers


def test_keep_separate_ops_stay_alone(zoo: dict[str, OpGraph]) -> None:
    graph = zoo["gpt"]
    pinned = frozenset({"linear", "unflatten_1", "layer_norm_1", "add_4"})
    c = coarsen(graph, CoarsenOptions(module_depth=2, keep_separate=pinned))
    check_coarsening(graph, c)
    for name in pinned:
        assert c.members[c.group_of[name]] == (name,)
        assert c.graph.ops[name] == graph.ops[name]
    with pytest.raises(ValueError, match="nope"):
        coarsen(graph, CoarsenOptions(keep_separate=frozenset({"nope"})))


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_max_group_ops_is_respected(zoo: dict[str, OpGraph], limit: int) -> None:
    graph = zoo["bert"]
    c = coarsen(graph, CoarsenOptions(module_depth=1, max_group_ops=limit))
    check_coarsening(graph, c)
    assert max(len(m) for m in c.members.values()) <= limit
    if limit == 1:
        assert len(c.graph) == len(graph)


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="module_depth"):
        CoarsenOptions(module_depth=0)
    with pytest.raises(ValueError, match="max_group_ops"):
        CoarsenOptions(max_group_ops=0)
    with pytest.raises(KeyError, match="no value for group"):
        identity(triangle()).expand({"a": 1})
