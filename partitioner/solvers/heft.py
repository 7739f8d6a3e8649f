"""HEFT list scheduling (Topcuoglu, Hariri and Wu, 2002), made memory-aware.

In: a :class:`~partitioner.solvers.problem.Problem`. Out: a
:class:`~partitioner.solvers.problem.Solution` named ``heft`` whose placement gives every node
the device where it finishes earliest, and whose ``order`` is the nodes sorted by HEFT start
time (a topological order), so that :func:`~partitioner.solvers.problem.evaluate`'s makespan
schedule replays HEFT's.

The algorithm:

1. *upward rank*: ``rank(v) = w(v) + max over successors s of (c(v, s) + rank(s))``, where
   ``w(v)`` is the mean of ``problem.compute[v]`` over the devices allowed for ``v`` and
   ``c(v, s)`` the mean of ``problem.transfer_s(bytes v sends s, a, b)`` over the pairs of
   *distinct* devices ``a`` allowed for ``v`` and ``b`` allowed for ``s`` (the paper's mean
   start-up latency plus bytes over mean bandwidth); 0 when no such pair exists;
2. nodes are taken by decreasing rank, ties by topological index (among those whose
   predecessors are scheduled, which the ranks already imply);
3. each goes to the allowed device with the earliest finish time, with the *insertion policy*:
   it may take an idle gap between nodes already scheduled on the device if it fits there after
   its inputs have arrived. Inputs arrive as :func:`evaluate` says: graph inputs start on the
   host, a tensor from another device arrives at its producer's finish plus ``transfer_s``.

Memory awareness: a device is skipped when the node would push it over its capacity, counted as
:func:`~partitioner.solvers.problem.memory_use` counts it without streaming: the parameters
resident there (``param_mem``) + the largest working set of its nodes (``work_mem``, the
reserve, including the node's own) + saved activations (training). When no allowed device has
room the node goes to the host CPU (or, if it may not run there, to its earliest-finishing
allowed device); the placement then reports the overflow through ``evaluate``. Shared (tied)
parameters read away from their owner are not part of HEFT's costs.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import time
from collections.abc import Mapping

from partitioner.solvers.problem import Placement, Problem, Solution, Status


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where and when HEFT runs one node."""

    device: str
    start: float
    finish: float
    overflow: bool = False  # no allowed device had room: the host (or the earliest finish) was taken


def upward_ranks(problem: Problem) -> dict[str, float]:
    """HEFT's upward rank of every node (mean compute plus mean communication to the exit).

    Example:
        >>> ranks = upward_ranks(problem)                         # doctest: +SKIP
        >>> max(ranks, key=ranks.get) == problem.nodes[0]
        True
    """
    dag = problem.graph.dag
    rank: dict[str, float] = {}
    for node in reversed(problem.nodes):
        mean = sum(problem.compute[node].values()) / len(problem.compute[node])
        tail = max((_mean_comm(problem, node, s, dag.edges[node, s]["bytes"]) + rank[s]
                    for s in dag.successors(node)), default=0.0)
        rank[node] = mean + tail
    return rank


def _mean_comm(problem: Problem, src_node: str, dst_node: str, nbytes: int) -> float:
    """Mean seconds to send ``nbytes`` between distinct devices allowed for the two nodes."""
    if nbytes <= 0:
        return 0.0
    pairs = [(a, b) for a in problem.allowed[src_node] for b in problem.allowed[dst_node] if a != b]
    if not pairs:
        return 0.0
    return sum(problem.transfer_s(nbytes, a, b) for a, b in pairs) / len(pairs)


class _Timeline:
    """The busy intervals of one device, sorted by (start, finish) and disjoint, so their ends
    are sorted too; finds the earliest idle gap for the insertion policy."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []
        self.ends: list[float] = []

    def earliest(self, ready: float, duration: float) -> float:
        """The earliest start >= ``ready`` of an idle gap at least ``duration`` long."""
        i = bisect.bisect_right(self.ends, ready)  # intervals before i end by ``ready``
        start = ready
        for begin, end in self.intervals[i:]:
            if start + duration <= begin:
                return start
            start = max(start, end)
        return start

    def add(self, start: float, finish: float) -> None:
        i = bisect.bisect_right(self.intervals, (start, finish))
        self.intervals.insert(i, (start, finish))
        self.ends.insert(i, finish)


@dataclasses.dataclass
class _Memory:
    """What :func:`memory_use` would count on each device for the nodes placed so far."""

    params: dict[str, int]
    work: dict[str, int]
    saved: dict[str, int]

    @classmethod
    def empty(cls, devices: tuple[str, ...]) -> _Memory:
        return cls({d: 0 for d in devices}, {d: 0 for d in devices}, {d: 0 for d in devices})

    def fits(self, problem: Problem, node: str, device: str) -> bool:
        need = (self.params[device] + problem.param_mem[node]
                + max(self.work[device], problem.work_mem[node])
                + self.saved[device] + problem.saved[node])
        return need <= problem.capacity[device]

    def add(self, problem: Problem, node: str, device: str) -> None:
        self.params[device] += problem.param_mem[node]
        self.work[device] = max(self.work[device], problem.work_mem[node])
        self.saved[device] += problem.saved[node]


def heft_schedule(problem: Problem) -> dict[str, Slot]:
    """HEFT's device, start and finish for every node (see the module docstring).

    Example:
        >>> slots = heft_schedule(problem)                        # doctest: +SKIP
        >>> slots["linear"]
        Slot(device='cuda:0', start=1.9e-05, finish=4.6e-05)
    """
    rank = upward_ranks(problem)
    dag = problem.graph.dag
    waiting = {n: dag.in_degree(n) for n in problem.nodes}
    ready = [(-rank[n], problem.index[n], n) for n in problem.nodes if waiting[n] == 0]
    heapq.heapify(ready)
    timelines = {d: _Timeline() for d in problem.device_names}
    memory = _Memory.empty(problem.device_names)
    slots: dict[str, Slot] = {}
    while ready:
        _, _, node = heapq.heappop(ready)
        slot = _best_slot(problem, node, slots, timelines, memory)
        slots[node] = slot
        timelines[slot.device].add(slot.start, slot.finish)
        memory.add(problem, node, slot.device)
        for succ in dag.successors(node):
            waiting[succ] -= 1
            if waiting[succ] == 0:
                heapq.heappush(ready, (-rank[succ], problem.index[succ], succ))
    return slots


def _best_slot(problem: Problem, node: str, slots: Mapping[str, Slot],
               timelines: Mapping[str, _Timeline], memory: _Memory) -> Slot:
    """The earliest-finishing slot of ``node`` on a device with room (ties: profile order)."""
    candidates = [_slot_on(problem, node, d, slots, timelines) for d in problem.allowed[node]]
    roomy = [s for s in candidates if memory.fits(problem, node, s.device)]
    if roomy:
        return min(roomy, key=lambda s: s.finish)
    host = [s for s in candidates if s.device == problem.host]
    chosen = host[0] if host else min(candidates, key=lambda s: s.finish)
    return dataclasses.replace(chosen, overflow=True)


def _slot_on(problem: Problem, node: str, device: str, slots: Mapping[str, Slot],
             timelines: Mapping[str, _Timeline]) -> Slot:
    """The earliest slot of ``node`` on ``device``, once its inputs have arrived there."""
    ready = max((_arrival(problem, t, device, slots) for t in problem.graph.ops[node].inputs), default=0.0)
    duration = problem.compute[node][device]
    start = timelines[device].earliest(ready, duration)
    return Slot(device, start, start + duration)


def _arrival(problem: Problem, tensor: str, device: str, slots: Mapping[str, Slot]) -> float:
    """When ``tensor`` is available on ``device`` (graph inputs start on the host)."""
    t = problem.graph.tensors[tensor]
    src, ready = (problem.host, 0.0) if t.producer is None else (slots[t.producer].device, slots[t.producer].finish)
    if src == device or t.nbytes <= 0:
        return ready
    return ready + problem.transfer_s(t.nbytes, src, device)


def solve_heft(problem: Problem) -> Solution:
    """Place ``problem``'s nodes with memory-aware HEFT; ``order`` is HEFT's start order.

    Example:
        >>> sol = solve_heft(problem)                             # doctest: +SKIP
        >>> evaluate(problem, sol.placement).total_s
        0.0123
    """
    start = time.perf_counter()
    slots = heft_schedule(problem)
    order = tuple(sorted(problem.nodes, key=lambda n: (slots[n].start, problem.index[n])))
    full = [n for n in problem.nodes if slots[n].overflow]
    note = (f"{len(full)} nodes found no device with room and went to {problem.host}, e.g. {', '.join(full[:3])}"
            if full else "")
    return Solution(
        solver="heft",
        placement=Placement(device={n: slots[n].device for n in problem.nodes}, order=order),
        status=Status.HEURISTIC,
        seconds=time.perf_counter() - start,
        note=note,
    )

