"""Invariant checks at stage boundaries (tests always run them).

In: an OpGraph, or a Problem with a Placement and its Evaluation. Out: nothing when the
invariants hold; :class:`~partitioner.errors.VerificationError` listing every broken one
otherwise. The checks recompute what they check from the inputs instead of trusting the
stage that produced them.
"""

from __future__ import annotations

import networkx as nx

from partitioner.errors import VerificationError
from partitioner.ir import OpGraph
from partitioner.solvers.problem import Evaluation, Placement, Problem
from partitioner.solvers.split_regions import region_effect


def verify_graph(graph: OpGraph) -> None:
    """Acyclic; every tensor's producer lists it as an output and its consumers as an input."""
    problems: list[str] = []
    if not nx.is_directed_acyclic_graph(graph.dag):
        problems.append("the graph has a cycle")
    for t in graph.tensors.values():
        if t.producer is not None and t.name not in graph.ops[t.producer].outputs:
            problems.append(f"tensor {t.name} names producer {t.producer}, which does not output it")
        for c in t.consumers:
            if c not in graph.ops or t.name not in graph.ops[c].inputs:
                problems.append(f"tensor {t.name} names consumer {c}, which does not read it")
    for op in graph.ops.values():
        for t in op.outputs:
            if graph.tensors[t].producer != op.name:
                problems.append(f"op {op.name} outputs {t}, whose producer is {graph.tensors[t].producer}")
    owners = [p for p in graph.params.values() if p.owner is not None]
    if sum(op.param_bytes for op in graph.ops.values()) != sum(p.nbytes for p in owners):
        problems.append("parameter bytes attributed to ops differ from the parameters' total")
    _raise(f"graph {graph.name!r}", problems)


def verify_placement(problem: Problem, placement: Placement, evaluation: Evaluation) -> None:
    """Every node placed once on an allowed device, streamed weights on the host, memory within
    capacity (recomputed here), every cross-device tensor transferred once per destination and no
    other transfer (pipeline stages: relayed across every boundary it crosses), an issue order that
    is topological."""
    problems: list[str] = []
    x = placement.device
    if set(x) != set(problem.nodes):
        extra, missing = set(x) - set(problem.nodes), set(problem.nodes) - set(x)
        problems.append(f"placement covers {len(x)} nodes; missing {sorted(missing)[:5]}, unknown {sorted(extra)[:5]}")
        _raise("placement", problems)
    for n in problem.nodes:
        if x[n] not in problem.allowed[n]:
            problems.append(f"{n} is on {x[n]}, not one of {problem.allowed[n]}")
    for n, home in placement.streamed.items():
        if home != problem.host or x[n] == problem.host or not problem.param_bytes[n]:
            problems.append(f"{n} streams its weights from {home} to {x[n]}: only host-to-accelerator streaming exists")
    problems += _check_splits(problem, placement, evaluation)
    problems += _check_memory(problem, placement, evaluation)
    if problem.options.pipeline is not None:
        problems += _check_relay(problem, placement, evaluation)
    else:
        problems += _check_transfers(problem, placement, evaluation)
    if placement.order:
        seen: set[str] = set()
        for n in placement.order:
            missing = [u for u in problem.graph.dag.predecessors(n) if u not in seen]
            if missing:
                problems.append(f"issue order runs {n} before its input {missing[0]}")
            seen.add(n)
        if seen != set(problem.nodes):
            problems.append("issue order does not list every node exactly once")
    _raise("placement", problems)


def _check_splits(problem: Problem, placement: Placement, evaluation: Evaluation) -> list[str]:
    """A split node runs on its home, is offered that split, streams nothing, and copies its input
    to each other device and each other shard's output back (one ``split`` transfer per device and
    direction; a time split: its chunks' copies from the host in one)."""
    out = []
    made = [(t.tensor, t.src, t.dst) for t in evaluation.transfers if t.kind == "split"]
    dropped = region_effect(problem, placement).dropped  # a region's columns and row share their shards
    for n, sp in placement.split.items():
        if sp not in problem.split_choices.get(n, ()):
            out.append(f"{n} is split {sp.label}, which the problem does not offer")
            continue
        if placement.device[n] != sp.home or n in placement.streamed:
            out.append(f"{n} is split {sp.label} but runs on {placement.device[n]} or streams its weights")
        op = next(m for m in problem.members[n] if not problem.original.ops[m].is_view)
        pairs = [(src, dst) for src, dst, nbytes, _ in problem.split_price[(n, sp)].copies if nbytes]
        pairs = list(dict.fromkeys(pairs))
        for pair in pairs:  # a time split: its chunks' copies in one transfer, nothing back
            if sum(made.count((name, *pair)) for name in {n, op}) != ((n, *pair) not in dropped):
                out.append(f"{n} is split {sp.label} but its copy {pair[0]} -> {pair[1]} is not made exactly once")
    return out


def _check_memory(problem: Problem, placement: Placement, evaluation: Evaluation) -> list[str]:
    out = []
    params = {d: 0 for d in problem.device_names}
    for n in problem.nodes:
        sp = placement.split.get(n)
        if sp is not None and (n, sp) in problem.split_price:  # each shard's weight on its device
            for d, nbytes in zip(sp.devices, problem.split_price[(n, sp)].param_bytes):
                params[d] += nbytes
            continue
        if placement.state.get(n) == problem.host and placement.residence(n) != problem.host:
            params[placement.residence(n)] += problem.weight_mem[n]  # its optimizer state lives on the host
            params[problem.host] += problem.offload_mem[n]
        elif n in placement.streamed_state and placement.residence(n) != problem.host:
            params[placement.residence(n)] += problem.least_param_mem(n) - problem.state_mem[n]  # state on the host
            params[problem.host] += problem.state_mem[n]
        else:
            params[placement.residence(n)] += problem.least_param_mem(n)  # 16 bits: as few as half
    for d in problem.device_names:
        if evaluation.memory[d] < params[d]:
            out.append(f"memory on {d} is reported as {evaluation.memory[d]:,} bytes, below its parameters ({params[d]:,})")
        if evaluation.feasible and evaluation.memory[d] > problem.capacity[d]:
            out.append(f"{d} holds {evaluation.memory[d]:,} bytes, over its capacity {problem.capacity[d]:,}")
    return out


def _check_transfers(problem: Problem, placement: Placement, evaluation: Evaluation) -> list[str]:
    x = placement.device
    needed = set()
    for t in problem.tensors:
        src = x[t.producer] if t.producer is not None else problem.host
        for c in t.consumers:
            if x[c] != src:
                needed.add((t.name, src, x[c]))
    made = [(t.tensor, t.src, t.dst) for t in evaluation.transfers if t.kind == "activation"]
    out = []
    if len(made) != len(set(made)):
        out.append("a tensor is sent to the same device twice")
    for key in sorted(needed - set(made)):
        out.append(f"tensor {key[0]} is read on {key[2]} but never sent there from {key[1]}")
    for key in sorted(set(made) - needed):
        out.append(f"tensor {key[0]} is sent from {key[1]} to {key[2]} where no consumer reads it")
    return out


def _check_relay(problem: Problem, placement: Placement, evaluation: Evaluation) -> list[str]:
    """Pipeline stages: every tensor alive across a stage boundary is sent across it, once, from the
    stage before to the stage after (recomputed here from the edges, not from the pipeline module)."""
    x = placement.device
    devices = [d for d in problem.device_names if d in set(x.values())]
    stage = {n: devices.index(x[n]) for n in problem.nodes}
    outputs = set(problem.graph.outputs)
    needed = set()
    for t in problem.graph.tensors.values():
        if t.nbytes <= 0:
            continue
        first = stage[t.producer] if t.producer is not None else 0
        last = max([stage[c] for c in t.consumers if c in stage] + [len(devices) - 1] * (t.name in outputs),
                   default=first)
        needed |= {(t.name, devices[b], devices[b + 1]) for b in range(first, last)}
    made = [(t.tensor, t.src, t.dst) for t in evaluation.transfers if t.kind == "activation"]
    out = ["a tensor is sent across a stage boundary twice"] if len(made) != len(set(made)) else []
    out += [f"tensor {t} crosses from {a} to {b} but is not sent" for t, a, b in sorted(needed - set(made))]
    out += [f"tensor {t} is sent from {a} to {b} but does not cross there" for t, a, b in sorted(set(made) - needed)]
    return out


def _raise(what: str, problems: list[str]) -> None:
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise VerificationError(f"{what} breaks {len(problems)} invariant(s):\n  {shown}{more}")
