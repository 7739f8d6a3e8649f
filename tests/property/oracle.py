"""The brute-force oracle: the true optimum of a small placement problem, by enumeration with ``evaluate``.

In: a :class:`~partitioner.solvers.problem.Problem` of at most about ten nodes (coarsened or not).
Out: the best feasible objective over every placement the ILP may choose (each node on each allowed
device, each streamable node's weights resident or streamed, and for ``makespan`` every issue
order), each evaluated on the *original* graph, so that the ILP's certificate is checked against
something independent of the ILP and of coarsening.

Precision (``Options.precision``): every dtype a node may compute in on its device is tried too,
streamed or not (a streamed node's weights cross in that dtype's form: packed bytes for a packed
choice); in training a streamed node computes in float32 only.

Training state (``partitioner.solvers.train_state``): each trainable node computing on an
accelerator with its weights resident keeps its optimizer state there, on the host (stepped there)
or on the host streamed to the accelerator for its step, and each
node that may recompute or hold its saved activations on the host (in one dtype on its device, as
the ILP offers them) keeps them, recomputes them, or (on an accelerator) holds them on the host.

Splits (``Options.splits``): each node on its device is whole or takes each split homed there that
the problem offers (its weights then resident).

Makespan: the list schedule depends only on the order of the nodes sharing a device, so every
topological order is tried (few at these sizes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import networkx as nx

from partitioner.solvers.problem import Objective, Placement, Problem, StreamMode, evaluate

#: Above this many (placement x order) candidates the oracle refuses: the test must draw smaller instances.
MAX_CANDIDATES = 60_000


def expand(problem: Problem, placement: Placement) -> tuple[Problem, Placement]:
    """A coarse problem's placement as a placement of the original graph (and that problem).

    Every member op takes its group's device; the members of a streamed group that own weights
    stream them; the issue order lists each group's members in program order.
    """
    if problem.original is problem.graph:
        return problem, placement
    original = original_problem(problem)
    device = {op: placement.device[n] for n in problem.nodes for op in problem.members[n]}
    streamed = {op: home for n, home in placement.streamed.items()
                for op in problem.members[n] if original.param_bytes[op]}
    order = tuple(op for n in (placement.order or problem.nodes) for op in problem.members[n])
    precision = {op: problem.op_dtype(op, a) for n, a in placement.precision.items() for op in problem.members[n]}
    state = {op: home for n, home in placement.state.items() for op in problem.members[n] if original.trainable[op]}
    recompute = frozenset(op for n in placement.recompute for op in problem.members[n] if original.saved[op])
    streamed_state = frozenset(op for n in placement.streamed_state for op in problem.members[n]
                               if original.trainable[op])
    split = {op: sp for n, sp in placement.split.items() for op in problem.members[n] if op in original.split_choices}
    saved_on_host = frozenset(op for n in placement.saved_on_host for op in problem.members[n] if original.saved[op])
    return original, Placement(device, streamed, placement.stream_mode, order, precision, state, recompute,
                               placement.overlap, streamed_state, split=split, saved_on_host=saved_on_host)


def original_problem(problem: Problem) -> Problem:
    """The same devices, options and pins on the original (uncoarsened) graph."""
    pins = {op: d for n, d in problem.pins.items() for op in problem.members[n]}
    return Problem(problem.original, problem.devices, problem.options, pins=pins)


def placements(problem: Problem) -> Iterator[Placement]:
    """Every placement the ILP may return (devices, streaming choices; not orders)."""
    host = problem.host
    streamable = set(problem.streamable)
    for combo in itertools.product(*(problem.allowed[n] for n in problem.nodes)):
        device = dict(zip(problem.nodes, combo))
        optional = [n for n in problem.nodes if n in streamable and device[n] != host]
        for mask in itertools.product((False, True), repeat=len(optional)):
            streamed = {n: host for n, on in zip(optional, mask) if on}
            for dtypes in itertools.product(*(_dtypes(problem, n, device[n], n in streamed) for n in problem.nodes)):
                precision = dict(zip(problem.nodes, dtypes))
                for state, recompute, streamed_state, saved_on_host in _training_states(problem, device, streamed):
                    for split in _splits(problem, device, streamed):
                        yield Placement(device, streamed, StreamMode.PREFETCH, precision=precision, state=state,
                                        recompute=recompute, streamed_state=streamed_state, split=split,
                                        saved_on_host=saved_on_host)


def _splits(problem: Problem, device: dict, streamed: dict) -> Iterator[dict]:
    """Every choice of splits with these devices: each unstreamed node whole or split from its device."""
    nodes = [n for n in problem.split_choices if n not in streamed]
    options = [(None, *(sp for sp in problem.split_choices[n] if sp.home == device[n])) for n in nodes]
    for combo in itertools.product(*options):
        yield {n: sp for n, sp in zip(nodes, combo) if sp is not None}


def _training_states(problem: Problem, device: dict, streamed: dict
                     ) -> Iterator[tuple[dict, frozenset, frozenset, frozenset]]:
    """Every (state, recompute, streamed_state, saved_on_host) the ILP may choose with these devices
    and streams: each node's state resident, offloaded (host step) or streamed for its step, and its
    saved activations kept, recomputed or held on the host."""
    away = set(problem.offloadable) | set(problem.state_streamable)
    movable = [n for n in problem.nodes if n in away and device[n] != problem.host and n not in streamed]
    homes = [("resident",) + (("host",) if n in problem.offloadable else ())
             + (("streamed",) if n in problem.state_streamable else ()) for n in movable]
    single = [n for n in problem.nodes if len(problem.choices[n][device[n]]) == 1]
    holds = {n for n in single if n in problem.saved_hostable and device[n] != problem.host and n not in streamed}
    kept = [n for n in single if n in problem.recomputable or n in holds]
    ways = [("kept",) + (("recompute",) if n in problem.recomputable else ()) + (("host",) if n in holds else ())
            for n in kept]
    for choice in itertools.product(*homes):
        state = {n: problem.host for n, h in zip(movable, choice) if h == "host"}
        streamed_state = frozenset(n for n, h in zip(movable, choice) if h == "streamed")
        for saved in itertools.product(*ways):
            yield (state, frozenset(n for n, w in zip(kept, saved) if w == "recompute"), streamed_state,
                   frozenset(n for n, w in zip(kept, saved) if w == "host"))


def _dtypes(problem: Problem, node: str, device: str, streamed: bool) -> tuple[str, ...]:
    """The dtypes ``node`` may compute in on ``device`` (streamed weights: the forms the host may
    hold them in, packed ones included; float32 only in training)."""
    choices = problem.choices[node][device]
    if not streamed:
        return choices
    return tuple(a for a in choices if a in problem.stream_forms(node, device))


def orders(problem: Problem) -> list[tuple[str, ...]]:
    """Every topological order of the problem's nodes (makespan), else just the default."""
    if problem.options.objective is not Objective.MAKESPAN:
        return [()]
    return [tuple(o) for o in nx.all_topological_sorts(problem.graph.dag)]


def count_candidates(problem: Problem) -> int:
    """How many evaluations :func:`optimum` would make."""
    per_node = 1
    streamable = set(problem.streamable)
    for n in problem.nodes:
        options = sum((2 if n in streamable and d != problem.host else 1) * len(problem.choices[n][d])
                      + sum(sp.home == d for sp in problem.split_choices.get(n, ()))
                      for d in problem.allowed[n])
        per_node *= options
    activations = set(problem.recomputable) | set(problem.saved_hostable)
    per_node *= 3 ** len(problem.state_streamable) * 2 ** len(set(problem.offloadable) - set(problem.state_streamable))
    per_node *= 3 ** len(set(problem.recomputable) & set(problem.saved_hostable)) * 2 ** (
        len(activations) - len(set(problem.recomputable) & set(problem.saved_hostable)))  # at most: training-state choices
    return per_node * (len(orders(problem)) if problem.options.objective is Objective.MAKESPAN else 1)


def optimum(problem: Problem) -> tuple[float, Placement | None]:
    """The best feasible objective (evaluated on the original graph) and a placement reaching it.

    ``(inf, None)`` when no placement is feasible.
    """
    if count_candidates(problem) > MAX_CANDIDATES:
        raise ValueError(f"{count_candidates(problem)} candidates: draw a smaller instance")
    best, arg = float("inf"), None
    all_orders = orders(problem)
    for placement in placements(problem):
        for order in all_orders:
            candidate = Placement(placement.device, placement.streamed, placement.stream_mode, order,
                                  placement.precision, placement.state, placement.recompute,
                                  streamed_state=placement.streamed_state, split=placement.split,
                                  saved_on_host=placement.saved_on_host)
            original, flat = expand(problem, candidate)
            ev = evaluate(original, flat)
            if ev.feasible and ev.total_s < best:
                best, arg = ev.total_s, candidate
    return best, arg
