"""Coarsening: an OpGraph → a smaller OpGraph whose ops are groups of the original ops.

In: an :class:`~partitioner.ir.OpGraph` and :class:`CoarsenOptions`. Out: a :class:`Coarsening`
holding the coarse graph (each op is a group, named after its first member in program order),
the members of every group and the group of every op; :meth:`Coarsening.expand` turns a value
per group (a device, say) back into a value per original op.

Passes, in order, each optional: fold zero-cost views into a neighbour, merge single-consumer
chains, merge ops of the same module (``module_depth``). A merge happens only if the coarse graph
stays a DAG; the check is a reachability search bounded by a topological rank that is kept valid
under contraction (the relabelling of Pearce & Kelly's dynamic topological order), so a merge
costs the size of the region between the two groups, not the size of the graph.
The input graph is never modified.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar

from partitioner.errors import GraphError
from partitioner.ir import Op, OpClass, OpGraph

log = logging.getLogger(__name__)

T = TypeVar("T")

GROUP_KIND = "group"  # Op.kind (and module_type, when members differ) of a group with several members


@dataclasses.dataclass(frozen=True)
class CoarsenOptions:
    """What :func:`coarsen` may merge."""

    fold_views: bool = True                        # fold zero-cost ops (OpClass.VIEW) into a neighbour
    merge_chains: bool = True                      # merge u -> v when v is u's only consumer and u is v's only producer
    module_depth: int | None = None                # also merge ops whose module paths agree on this many dotted components
    max_group_ops: int | None = None               # never grow a group beyond this many ops
    keep_separate: frozenset[str] = frozenset()    # op names never merged with anything (pinned ops, for example)
    align: tuple[str, ...] = ()                    # module paths whose ops must form one group (placed whole)

    def __post_init__(self) -> None:
        if self.module_depth is not None and self.module_depth < 1:
            raise ValueError(f"module_depth must be at least 1 (or None), not {self.module_depth}")
        if self.max_group_ops is not None and self.max_group_ops < 1:
            raise ValueError(f"max_group_ops must be at least 1 (or None), not {self.max_group_ops}")
        object.__setattr__(self, "keep_separate", frozenset(self.keep_separate))


@dataclasses.dataclass(frozen=True)
class Coarsening:
    """A coarse graph and the correspondence between its groups and the original ops.

    ``members`` maps each group (an op name of :attr:`graph`) to its original ops in program
    order, in the coarse graph's topological order; ``group_of`` maps each original op to its
    group, in the original graph's topological order.
    """

    graph: OpGraph
    members: Mapping[str, tuple[str, ...]]
    group_of: Mapping[str, str]

    def expand(self, per_group: Mapping[str, T]) -> dict[str, T]:
        """A value per group → the same value for each member op.

        Raises:
            KeyError: ``per_group`` lacks a group (the message names it).

        Example:
            >>> c = coarsen(graph)
            >>> device_of_op = c.expand({group: "cuda:0" for group in c.members})
            >>> set(device_of_op) == set(graph.ops)
            True
        """
        missing = [g for g in self.members if g not in per_group]
        if missing:
            raise KeyError(f"no value for group(s) {', '.join(missing[:5])}: give one value per group of the coarse graph")
        return {op: per_group[group] for op, group in self.group_of.items()}


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def coarsen(graph: OpGraph, options: CoarsenOptions = CoarsenOptions()) -> Coarsening:
    """Merge the ops of ``graph`` into groups as ``options`` allows; the result is a DAG.

    Raises:
        ValueError: ``options.keep_separate`` names an op the graph does not have.

    Example:
        >>> import models
        >>> from partitioner.frontends.fx import from_module
        >>> graph = from_module(*models.get("gpt", "tiny"))
        >>> c = coarsen(graph, CoarsenOptions(module_depth=2))
        >>> len(c.graph) < len(graph)
        True
    """
    return _build(graph, _contract(graph, options))


def identity(graph: OpGraph) -> Coarsening:
    """The trivial coarsening: every op its own group; the graph is returned as is (it is immutable).

    Example:
        >>> c = identity(graph)
        >>> c.graph is graph and c.members[next(iter(graph.ops))] == (next(iter(graph.ops)),)
        True
    """
    names = [op.name for op in graph.topological_order()]
    return Coarsening(graph, MappingProxyType({n: (n,) for n in names}), MappingProxyType({n: n for n in names}))


def auto_coarsen(
    graph: OpGraph,
    threshold: int = 300,
    *,
    keep_separate: frozenset[str] = frozenset(),
    max_group_ops: int | None = None,
) -> Coarsening:
    """Coarsen only as much as needed to bring ``graph`` to at most ``threshold`` ops.

    At or below the threshold: :func:`identity`. Otherwise fold views and merge chains; if still
    above, also group by module at depth 1, 2, 3, ... and keep the deepest depth that is at or
    below the threshold (or the coarsest result when none is). ``keep_separate`` and
    ``max_group_ops`` are passed to every pass.

    Example:
        >>> module, inputs = models.get("gpt", "base", device="meta")
        >>> c = auto_coarsen(from_module(module, inputs), threshold=100)
        >>> len(c.graph) <= 100
        True
    """
    if len(graph) <= threshold:
        return identity(graph)
    base = CoarsenOptions(keep_separate=frozenset(keep_separate), max_group_ops=max_group_ops)
    best = _contract(graph, base)
    log.info("auto_coarsen %s: %d ops -> %d after folding views and chains", graph.name, len(graph), best.count)
    if best.count > threshold:
        deepest = max((len(op.module_path.split(".")) for op in graph if op.module_path), default=0)
        tries = [_contract(graph, dataclasses.replace(base, module_depth=d)) for d in range(1, deepest + 1)]
        for depth, c in enumerate(tries, start=1):
            log.info("auto_coarsen %s: module depth %d -> %d groups", graph.name, depth, c.count)
        under = [c for c in tries if c.count <= threshold]
        best = under[-1] if under else min([best, *tries], key=lambda c: c.count)
    return _build(graph, best)


# --------------------------------------------------------------------------------------------
# Contraction state: union-find over ops plus the group-level DAG with a topological rank
# --------------------------------------------------------------------------------------------


class _Contraction:
    """Groups of ops (by position in topological order) and the DAG between them.

    Invariant: ``rank[u] < rank[v]`` for every group edge ``u -> v``. Only roots of the
    union-find carry meaningful ``members``, ``succ``, ``pred`` and ``rank``.
    """

    def __init__(self, graph: OpGraph, options: CoarsenOptions) -> None:
        self.ops: tuple[Op, ...] = graph.topological_order()
        self.pos = {op.name: i for i, op in enumerate(self.ops)}
        n = len(self.ops)
        self.parent = list(range(n))
        self.members: list[list[int]] = [[i] for i in range(n)]
        self.rank = list(range(n))
        self.succ: list[set[int]] = [set() for _ in range(n)]
        self.pred: list[set[int]] = [set() for _ in range(n)]
        for u, v in graph.dag.edges:
            self.succ[self.pos[u]].add(self.pos[v])
            self.pred[self.pos[v]].add(self.pos[u])
        unknown = sorted(options.keep_separate - set(self.pos))
        if unknown:
            raise ValueError(f"keep_separate names op(s) not in graph {graph.name!r}: {', '.join(unknown[:5])}")
        self.pinned = [op.name in options.keep_separate for op in self.ops]
        self.max_ops = options.max_group_ops

    @property
    def count(self) -> int:
        """The number of groups."""
        return sum(1 for i, p in enumerate(self.parent) if i == p)

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def roots_in_order(self) -> list[int]:
        """The groups in topological order (by rank)."""
        return sorted((i for i, p in enumerate(self.parent) if i == p), key=lambda r: self.rank[r])

    def first_index(self, root: int) -> int:
        """Program-order index of the group's first member."""
        return min(self.ops[m].index for m in self.members[root])

    def merge(self, a: int, b: int) -> int | None:
        """Merge the groups of ops ``a`` and ``b``; the surviving root, or None if not allowed."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        if self.pinned[a] or self.pinned[b]:
            return None
        if self.max_ops is not None and len(self.members[a]) + len(self.members[b]) > self.max_ops:
            return None
        if self.rank[a] > self.rank[b]:
            a, b = b, a
        if self.pred[b] <= {a}:          # every path into b comes straight from a: no cycle possible
            return self._union(a, b, self.rank[a])
        if self.succ[a] <= {b}:          # every path out of a goes straight to b
            return self._union(a, b, self.rank[b])
        forward = self._reach(a, b)
        if forward is None:
            return None
        backward = self._reach_back(b, a)
        return self._union_relabel(a, b, forward, backward)

    def _reach(self, a: int, b: int) -> set[int] | None:
        """Groups reachable from ``a`` other than by the edge a -> b and ranked below ``b``; None if b is among them."""
        limit = self.rank[b]
        seen: set[int] = set()
        stack = [x for x in self.succ[a] if x != b and self.rank[x] < limit]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            for y in self.succ[x]:
                if y == b:
                    return None
                if y not in seen and self.rank[y] < limit:
                    stack.append(y)
        return seen

    def _reach_back(self, b: int, a: int) -> set[int]:
        """Groups that reach ``b`` (not through a direct edge from ``a``) and are ranked above ``a``."""
        limit = self.rank[a]
        seen: set[int] = set()
        stack = [x for x in self.pred[b] if x != a and self.rank[x] > limit]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            stack.extend(y for y in self.pred[x] if y not in seen and self.rank[y] > limit)
        return seen

    def _union_relabel(self, a: int, b: int, forward: set[int], backward: set[int]) -> int:
        """Merge a and b, re-ranking the region between them: what reaches b, then the group, then what a reaches."""
        pool = sorted([self.rank[x] for x in forward | backward] + [self.rank[a], self.rank[b]])
        before = sorted(backward, key=self.rank.__getitem__)
        after = sorted(forward, key=self.rank.__getitem__)
        for x, r in zip(before, pool):
            self.rank[x] = r
        for x, r in zip(after, pool[len(before) + 1:]):
            self.rank[x] = r
        return self._union(a, b, pool[len(before)])

    def _union(self, a: int, b: int, rank: int) -> int:
        keep, gone = (a, b) if len(self.members[a]) >= len(self.members[b]) else (b, a)
        self.parent[gone] = keep
        self.members[keep].extend(self.members[gone])
        self.members[gone] = []
        self.rank[keep] = rank
        for x in self.succ[gone]:
            self.pred[x].discard(gone)
            if x != keep:
                self.pred[x].add(keep)
                self.succ[keep].add(x)
        for x in self.pred[gone]:
            self.succ[x].discard(gone)
            if x != keep:
                self.succ[x].add(keep)
                self.pred[keep].add(x)
        self.succ[keep].discard(gone)
        self.pred[keep].discard(gone)
        self.succ[gone], self.pred[gone] = set(), set()
        return keep


# --------------------------------------------------------------------------------------------
# Passes
# --------------------------------------------------------------------------------------------


def _contract(graph: OpGraph, options: CoarsenOptions) -> _Contraction:
    """Run the passes ``options`` asks for and return the grouping (no graph built yet)."""
    c = _Contraction(graph, options)
    if options.align:
        _align_modules(c, options.align)
    if options.fold_views:
        _fold_views(c, graph)
        log.debug("%s: %d groups after folding views", graph.name, c.count)
    # module grouping before chains: a chain merged across two modules would belong to neither
    if options.module_depth is not None:
        _group_modules(c, options.module_depth)
        log.debug("%s: %d groups after module grouping at depth %d", graph.name, c.count, options.module_depth)
    if options.merge_chains:
        _merge_chains(c, options.module_depth)
        log.debug("%s: %d groups after merging chains", graph.name, c.count)
    return c


def _align_modules(c: _Contraction, paths: tuple[str, ...]) -> None:
    """Merge all ops of each module path into one group, so the module is placed whole.

    Raises:
        GraphError: the module's ops cannot form one group because an op outside it lies on a
            path between two of its ops (the module is not convex in the graph).
    """
    limit, c.max_ops = c.max_ops, None  # alignment is a constraint, not a size choice
    try:
        for path in paths:
            prefix = path + "."
            ops = [i for i, op in enumerate(c.ops) if op.module_path == path or op.module_path.startswith(prefix)]
            for i in ops[1:]:
                if c.merge(ops[0], i) is None:
                    raise GraphError(
                        f"module {path!r} cannot be kept whole: op {c.ops[i].name!r} cannot join "
                        f"{c.ops[ops[0]].name!r} without an op outside the module in between "
                        f"(or one of them is pinned alone); drop its class from --align-modules"
                    )
    finally:
        c.max_ops = limit


def _fold_views(c: _Contraction, graph: OpGraph) -> None:
    """A view with one producing op joins that op; a view fed only by graph inputs joins its first consumer."""
    input_only: list[int] = []
    for i, op in enumerate(c.ops):
        if not op.is_view:
            continue
        producers = {c.pos[p] for t in op.inputs if (p := graph.tensors[t].producer) is not None}
        if len(producers) == 1:
            c.merge(producers.pop(), i)
        elif not producers:
            input_only.append(i)
    for i in input_only:
        group = c.find(i)
        if not all(c.ops[m].is_view for m in c.members[group]):
            continue
        for consumer in sorted(c.succ[group], key=c.first_index):
            if c.merge(group, consumer) is not None:
                break


def _merge_chains(c: _Contraction, depth: int | None = None) -> None:
    """Merge u -> v while v is u's only successor group and u is v's only predecessor group.

    With a module ``depth``, only groups of the same module (at that depth) merge, so module
    grouping keeps its granularity (a chain of transformer blocks stays a chain of blocks).
    """
    for root in c.roots_in_order():
        if c.find(root) != root:
            continue
        group: int | None = root
        while group is not None and len(c.succ[group]) == 1:
            (nxt,) = c.succ[group]
            if len(c.pred[nxt]) != 1:
                break
            if depth is not None and _module_key(_anchor_path(c, group), depth) != _module_key(_anchor_path(c, nxt), depth):
                break
            group = c.merge(group, nxt)


def _group_modules(c: _Contraction, depth: int) -> None:
    """Greedily, in topological order, merge each group into the last group with the same module key."""
    open_group: dict[str, int] = {}
    for root in c.roots_in_order():
        if c.find(root) != root:
            continue
        key = _module_key(_anchor_path(c, root), depth)
        if not key:
            continue
        last = open_group.get(key)
        merged = c.merge(last, root) if last is not None else None
        open_group[key] = merged if merged is not None else root


def _anchor_path(c: _Contraction, root: int) -> str:
    """The module path of a group's heaviest op (a view folded in from a neighbour does not count)."""
    anchor = max(c.members[root], key=lambda m: (c.ops[m].flops, c.ops[m].bytes_read + c.ops[m].bytes_written, -m))
    return c.ops[anchor].module_path


def common_module_path(paths: Iterable[str]) -> str:
    """The longest common dotted prefix of module paths.

    Example:
        >>> common_module_path(["blocks.1.attn.q_proj", "blocks.1.attn", "blocks.10"])
        'blocks'
    """
    common: list[str] | None = None
    for path in paths:
        parts = path.split(".") if path else []
        if common is None:
            common = parts
            continue
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        del common[n:]
    return ".".join(common or [])


def _module_key(path: str, depth: int) -> str:
    """The first ``depth`` dotted components of ``path`` (``"layers.3.attn.q"``, 2 -> ``"layers.3"``)."""
    return ".".join(path.split(".")[:depth]) if path else ""


# --------------------------------------------------------------------------------------------
# Building the coarse graph
# --------------------------------------------------------------------------------------------


def _build(graph: OpGraph, c: _Contraction) -> Coarsening:
    """The coarse OpGraph of a finished contraction, with the member maps."""
    roots = c.roots_in_order()
    groups = [sorted((c.ops[m] for m in c.members[r]), key=lambda op: op.index) for r in roots]
    name_of_root = {r: members[0].name for r, members in zip(roots, groups)}
    group_of = {op.name: name_of_root[c.find(i)] for i, op in enumerate(c.ops)}
    order = _GroupOrder(group_of, {members[0].name: members[0].index for members in groups})
    consumers: dict[str, list[str]] = {}
    for op in c.ops:
        for t in op.inputs:
            consumers.setdefault(t, []).append(op.name)

    ops = [_group_op(members, group_of, graph, consumers) for members in groups]
    kept: dict[str, None] = dict.fromkeys(graph.inputs)
    for op in ops:
        kept.update(dict.fromkeys(op.inputs + op.outputs))
    kept.update(dict.fromkeys(graph.outputs))
    tensors = []
    for name in kept:
        t = graph.tensors[name]
        producer = group_of[t.producer] if t.producer is not None else None
        tensors.append(dataclasses.replace(t, producer=producer, consumers=order.groups(consumers.get(name, ()), producer)))
    params = [
        dataclasses.replace(p, owner=group_of.get(p.owner, p.owner) if p.owner is not None else None, users=order.groups(p.users))
        for p in graph.params.values()
    ]
    coarse = OpGraph(
        graph.name, ops, tensors, params, graph.inputs, graph.outputs, source=graph.source, module_types=graph.module_types
    )
    log.info("coarsened %s: %d ops -> %d groups", graph.name, len(graph), len(coarse))
    members_of = {members[0].name: tuple(op.name for op in members) for members in groups}
    members_of = {op.name: members_of[op.name] for op in coarse.topological_order()}
    return Coarsening(coarse, MappingProxyType(members_of), MappingProxyType(group_of))


@dataclasses.dataclass(frozen=True)
class _GroupOrder:
    """Maps op names to their groups, deduplicated and sorted in program order."""

    group_of: Mapping[str, str]
    index: Mapping[str, int]  # group name -> program-order index of its first member

    def groups(self, op_names: Iterable[str], exclude: str | None = None) -> tuple[str, ...]:
        found = {self.group_of.get(n, n) for n in op_names} - {exclude}
        return tuple(sorted(found, key=lambda g: (self.index.get(g, -1), g)))


def _group_op(members: list[Op], group_of: Mapping[str, str], graph: OpGraph, consumers: Mapping[str, list[str]]) -> Op:
    """One Op record for a group (the member itself when the group has one member)."""
    if len(members) == 1:
        return members[0]
    name = members[0].name
    graph_outputs = frozenset(graph.outputs)

    def outside(op_name: str | None) -> bool:
        return op_name is None or group_of[op_name] != name

    inputs = _unique(t for m in members for t in m.inputs if outside(graph.tensors[t].producer))
    outputs = _unique(
        t for m in members for t in m.outputs
        if t in graph_outputs or any(outside(u) for u in consumers.get(t, ()))
    )
    compute = [m for m in members if not m.is_view]
    main = max(compute or members, key=lambda m: (m.flops, m.bytes_read + m.bytes_written))
    return Op(
        name=name,
        kind=GROUP_KIND,
        op_class=main.op_class if compute else OpClass.VIEW,
        index=members[0].index,
        module_path=common_module_path(m.module_path for m in members),
        module_type=members[0].module_type if len({m.module_type for m in members}) == 1 else GROUP_KIND,
        dtype=(compute or members)[0].dtype,
        inputs=inputs,
        outputs=outputs or members[-1].outputs,
        params=_unique(p for m in members for p in m.params),
        owned_params=_unique(p for m in members for p in m.owned_params),
        flops=sum(m.flops for m in members),
        bytes_read=sum(m.bytes_read for m in members),
        bytes_written=sum(m.bytes_written for m in members),
        param_bytes=sum(m.param_bytes for m in members),
        trainable_param_bytes=sum(m.trainable_param_bytes for m in members),
        aten_ops=tuple(a for m in members for a in m.aten_ops),
    )


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
