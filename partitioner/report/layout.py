"""Where the nodes of the placed-graph drawing go: ops, or module groups for big graphs.

In: a :class:`~partitioner.plan.Plan` (placement, module paths, schedule, edges).
Out: a :class:`GraphLayout`: nodes with the ops they stand for, how many of those run on each
device, and a layer (column, left to right by topological depth) and slot (row within the
column); edges between nodes, marked ``cross`` when some op-level edge they stand for joins two
devices. Nothing here draws: :mod:`partitioner.report.svg` turns the layout into SVG.

A plan with at most ``max_nodes`` ops is drawn op by op. A bigger one is coarsened to module
level: ops are grouped by their module path cut to the deepest depth that leaves at most
``max_nodes`` groups (``"layers.3.attn.q_proj"`` at depth 2 is ``"layers.3"``); when even depth 1
leaves too many, consecutive ops in schedule order are grouped instead. Module groups can form
cycles (a top-level op before and after a block); layers then come from the graph of strongly
connected components, so every node of a cycle shares one column.

Example:
    >>> layout = graph_layout(plan, max_nodes=150)            # doctest: +SKIP
    >>> layout.coarsened, len(layout.nodes) <= 150   # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from partitioner.plan import Plan

__all__ = ["GraphLayout", "GraphNode", "GraphEdge", "graph_layout", "MAX_NODES", "TOP_LEVEL"]

#: Above this many ops the drawing is coarsened to module groups.
MAX_NODES = 150
#: The label of the group of ops issued by the root module itself (module path "").
TOP_LEVEL = "(top level)"


@dataclasses.dataclass(frozen=True)
class GraphNode:
    """One box of the drawing: an op, or a group of ops."""

    key: str                        # op name; module path prefix; "ops 1-7" for schedule chunks
    ops: tuple[str, ...]            # the ops it stands for, in schedule order
    devices: Mapping[str, int]      # device -> how many of its ops run there, in profile order
    layer: int                      # column, by topological depth
    slot: int                       # row within the column

    @property
    def label(self) -> str:
        """What the box says: the key, or :data:`TOP_LEVEL` for the root module's ops."""
        return self.key or TOP_LEVEL

    @property
    def split(self) -> bool:
        """Whether its ops run on more than one device."""
        return len(self.devices) > 1


@dataclasses.dataclass(frozen=True)
class GraphEdge:
    """An arrow between two nodes, standing for ``count`` op-level edges."""

    src: str
    dst: str
    cross: bool          # some op-level edge it stands for joins two devices
    count: int


@dataclasses.dataclass(frozen=True)
class GraphLayout:
    """Nodes and edges of the drawing; ``depth`` is the module depth used when coarsened
    (``None`` when drawn op by op, ``0`` when grouped by schedule chunks)."""

    coarsened: bool
    depth: int | None
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]

    @property
    def layers(self) -> int:
        """Number of columns."""
        return 1 + max((n.layer for n in self.nodes), default=-1)

    @property
    def slots(self) -> int:
        """Rows of the fullest column."""
        return 1 + max((n.slot for n in self.nodes), default=-1)


def graph_layout(plan: Plan, max_nodes: int = MAX_NODES) -> GraphLayout:
    """Group (if needed) and place the plan's ops for drawing.

    Example:
        >>> [n.key for n in graph_layout(plan).nodes][:2]     # doctest: +SKIP
        ['embedding', 'layer_norm']
    """
    scheduled = set(plan.schedule)
    order = list(plan.schedule) + sorted(op for op in plan.placement if op not in scheduled)
    group_of, depth = _groups(plan, order, max_nodes)
    members: dict[str, list[str]] = {}
    for op in order:
        members.setdefault(group_of[op], []).append(op)
    dag = nx.DiGraph()
    dag.add_nodes_from(members)
    edges: dict[tuple[str, str], list[bool]] = {}
    for u, v in plan.edges:
        gu, gv = group_of[u], group_of[v]
        if gu != gv:
            edges.setdefault((gu, gv), []).append(plan.placement[u] != plan.placement[v])
            dag.add_edge(gu, gv)
    layer = _layers(dag)
    slot = _slots(members, layer, dag, {op: i for i, op in enumerate(order)})
    names = plan.devices.names()
    nodes = []
    for key, ops in members.items():
        count = {d: sum(1 for op in ops if plan.placement[op] == d) for d in names}
        nodes.append(GraphNode(key, tuple(ops), {d: c for d, c in count.items() if c},
                               layer[key], slot[key]))
    return GraphLayout(depth != -1, None if depth == -1 else depth, tuple(nodes),
                       tuple(GraphEdge(u, v, any(c), len(c)) for (u, v), c in edges.items()))


def _groups(plan: Plan, order: list[str], max_nodes: int) -> tuple[dict[str, str], int]:
    """op -> node key, and the module depth used (-1: one node per op; 0: schedule chunks)."""
    if len(order) <= max_nodes:
        return {op: op for op in order}, -1
    paths = {op: plan.modules.get(op, "") for op in order}
    deepest = max((len(p.split(".")) for p in paths.values() if p), default=0)
    for depth in range(deepest, 0, -1):
        group_of = {op: ".".join(p.split(".")[:depth]) for op, p in paths.items()}
        if len(set(group_of.values())) <= max_nodes:
            return group_of, depth
    size = math.ceil(len(order) / max_nodes)
    group_of = {}
    for i in range(0, len(order), size):
        chunk = order[i:i + size]
        for op in chunk:
            group_of[op] = f"ops {i + 1}-{i + len(chunk)}"
    return group_of, 0


def _layers(dag: nx.DiGraph) -> dict[str, int]:
    """Longest-path depth of each node, over the graph of strongly connected components."""
    cond = nx.condensation(dag)
    depth: dict[int, int] = {}
    for c in nx.topological_sort(cond):
        depth[c] = max((depth[p] + 1 for p in cond.predecessors(c)), default=0)
    return {n: depth[cond.graph["mapping"][n]] for n in dag}


def _slots(members: Mapping[str, list[str]], layer: Mapping[str, int], dag: nx.DiGraph,
           position: Mapping[str, int]) -> dict[str, int]:
    """Rows within each column: schedule order, then two barycentre sweeps to cut crossings."""
    columns: dict[int, list[str]] = {}
    for key in sorted(members, key=lambda k: position[members[k][0]]):
        columns.setdefault(layer[key], []).append(key)
    slot = {key: i for column in columns.values() for i, key in enumerate(column)}
    for _ in range(2):
        for neighbours, layers in ((dag.predecessors, sorted(columns)),
                                   (dag.successors, sorted(columns, reverse=True))):
            for index in layers:
                def centre(key: str) -> float:
                    near = [slot[n] for n in neighbours(key) if layer[n] != index]
                    return sum(near) / len(near) if near else float(slot[key])
                columns[index].sort(key=lambda k: (centre(k), slot[k]))
                slot.update({key: i for i, key in enumerate(columns[index])})
    return slot
