"""Lower bounds on a problem's objective that no placement can beat, printed beside every plan.

In: a :class:`~partitioner.solvers.problem.Problem`. Out: seconds.

* :func:`physical_lower_bound`: every node on its fastest allowed device with free transfers (for
  ``latency``: the sum; for ``makespan``: the longest path of compute, then the optimizer steps
  of the busiest device: at least their average and the largest one), and the total of that work spread
  evenly over all devices (``throughput`` and ``makespan``); for pipeline stages, the work once
  (the first micro-batch's trip) plus ``M - 1`` times its share per device. It ignores memory,
  so under tight caps it can fall far below the optimum (3% of it was seen).
* :func:`memory_aware_lower_bound`: the optimum of a linear program that keeps what memory
  forces: each op of the *original* graph split over its devices (fractions summing to 1), its
  weights resident or streamed (streamed bytes load the host link), its optimizer state with them,
  offloaded or streamed for its step (training), its saved activations kept, recomputed or held on
  the host (their copies load the link; the buffer and issue latency left out), parameters, saved
  activations, working sets and stream buffers within every cap, an op never on a device where
  it cannot fit alone; its objective is the latency sum, or each device's and link's load, with
  activation copies left out; for pipeline stages, ``M - 1`` times the busiest device's compute
  plus all the compute plus the largest optimizer step, with the activations of the fewest
  micro-batches the schedule keeps (GPipe: ``M``, 1F1B: one) and no relay. Every placement is a
  point of this program, so its optimum is a lower bound, and it is at least the physical one.
  It is computed on the uncoarsened graph, so it bounds every placement, coarsened or not.

With precision (``Options.precision``) both price every node in its cheapest dtype (fastest
compute, fewest bytes), so they bound every choice of dtypes too.

With splits (``Options.splits``) a node's fastest time is also each split's least charge
(:meth:`~partitioner.solvers.problem.Problem.split_cost`: its latency, or its longest shard), and
the total work spread over the devices stays a bound (two shards' times add up to at least the
whole op's on the faster device: each shard reads at least its share of the bytes and does its
share of the flops). In the memory-aware program each split that fits alone is one more
alternative of its op (``k``, beside the whole op on each device): its latency on the path, or each
shard on its device, each shard's weight and working set on its device, its copies on the links.
A split region (:mod:`partitioner.solvers.split_regions`) may hide a member split's copies and all
but one shard from the latency sum, and shard its interior ops: with ``latency`` a region member's
split is charged its shortest shard (:meth:`~partitioner.solvers.problem.Problem.split_floor`),
an interior node at least its fastest shard in any region, and the copies a region may drop are
left off the links in the memory-aware program.
A time split (:mod:`partitioner.solvers.chunked_streaming`) is priced there the same way: its
pipelined time is at least the whole op's on its home (each chunk does its share of the flops and
reads at least its share of the bytes, launch included), so the physical bound stays one.
"""

from __future__ import annotations

import logging

from partitioner.solvers.expert_streaming import cuts_experts, fold_expert_weights
from partitioner.solvers.milp import Milp, Term
from partitioner.solvers.pipeline import Schedule
from partitioner.solvers.problem import Objective, Problem
from partitioner.solvers.split_regions import droppable, interior_floor
from partitioner.solvers.train_state import grad_hop_s, saved_hop_s, state_hop_s, update_hop_s

log = logging.getLogger(__name__)


def fastest(problem: Problem, node: str) -> float:
    """A node's time on its fastest allowed device, with its cheapest optimizer step."""
    compute = min(problem.least_compute(node, d) for d in problem.compute[node])
    compute = min([compute, *(problem.split_floor(node, sp) for sp in problem.split_choices.get(node, ())),
                   interior_floor(problem, node)])
    hidden = problem.train_state and problem.options.objective is Objective.LATENCY  # host steps beside backward
    step = min(problem.opt_step[node].values()) if problem.options.training and not hidden else 0.0
    return compute + step


def physical_lower_bound(problem: Problem) -> float:
    """Seconds that no placement of ``problem`` can beat (memory ignored).

    Example:
        >>> physical_lower_bound(problem) <= evaluate(problem, placement).total_s   # doctest: +SKIP
        True
    """
    best = {n: fastest(problem, n) for n in problem.nodes}
    total = sum(best.values())
    objective = problem.options.objective
    spec = problem.options.pipeline
    if spec is not None:  # every stage time <= the bottleneck, and they add up to at least the work
        compute = sum(min(problem.least_compute(n, d) for d in problem.compute[n]) for n in problem.nodes)
        steps = sum(best.values()) - compute
        devices = len(problem.device_names)
        return compute * (1 + (spec.micro_batches - 1) / devices) + steps / devices
    if objective is Objective.LATENCY:
        return total
    spread = total / len(problem.device_names)
    if objective is Objective.THROUGHPUT:
        if problem.train_state:  # a node's step may run on another device than its compute (the host)
            single = [max(min(problem.least_compute(n, d) for d in problem.compute[n]),
                          min(problem.opt_step[n].values())) for n in problem.nodes]
            return max([spread, *single])
        return max(spread, max(best.values(), default=0.0))
    # makespan: the schedule ends after its longest path of compute, and the optimizer steps run
    # after it, each device's one after another (the busiest device's steps, at least their average
    # and the largest single one); steps of one path on several devices overlap, so they are not
    # part of the path
    steps = {n: best[n] - min(problem.least_compute(n, d) for d in problem.compute[n]) for n in problem.nodes}
    finish: dict[str, float] = {}
    for n in problem.nodes:
        ready = max((finish[u] for u in problem.graph.dag.predecessors(n)), default=0.0)
        finish[n] = ready + best[n] - steps[n]
    after = max(sum(steps.values()) / len(problem.device_names), max(steps.values(), default=0.0))
    return max(spread, max(finish.values(), default=0.0) + after)


def memory_aware_lower_bound(problem: Problem, *, time_limit: float = 10.0) -> float:
    """Seconds that no placement of ``problem``'s original graph can beat, memory caps included
    (see the module docstring); at least :func:`physical_lower_bound`.

    Example:
        >>> memory_aware_lower_bound(problem) >= physical_lower_bound(problem)   # doctest: +SKIP
        True
    """
    from partitioner.solvers.highs import run_highs

    p = problem if problem.graph is problem.original else _original(problem)
    physical = physical_lower_bound(p)
    scale = 1e4 / physical if physical > 0 else 1e6
    milp = _program(p, scale)
    result = run_highs(milp, time_limit=time_limit, gap=0.0, relax=True)
    if result.state != "optimal" or result.objective is None:
        log.info("memory-aware bound: the LP stopped (%s); using the physical bound", result.note or result.state)
        return physical
    return max(physical, result.objective / scale * (1 - 1e-9))


def _original(problem: Problem) -> Problem:
    pins = {op: d for n, d in problem.pins.items() for op in problem.members[n]}
    experts = fold_expert_weights(problem.original) if any(
        cuts_experts(sp) for choices in problem.split_choices.values() for sp in choices) else None
    if experts is not None:  # a time split by expert cuts an experts op and its weight's view as one node
        return Problem(experts.graph, problem.devices, problem.options, pins=pins, members=experts.members,
                       original=problem.original)
    return Problem(problem.original, problem.devices, problem.options, pins=pins)


def _program(p: Problem, scale: float) -> Milp:
    """The linear program of :func:`memory_aware_lower_bound`, time in ``scale`` units per second."""
    m, mu = Milp(), 1e-6
    x = {n: {d: m.column(f"x[{n}][{d}]", upper=1.0) for d in p.allowed[n] if p.fits_alone(n, d)} for n in p.nodes}
    s = {n: {d: m.column(f"s[{n}][{d}]", upper=1.0) for d in x[n] if d != p.host}
         for n in p.streamable if p.param_bytes[n] > 0}
    k = {n: {sp: m.column(f"k[{n}][{sp.label}]", upper=1.0) for sp in choices if p.split_fits(n, sp)}
         for n, choices in p.split_choices.items()}  # a split: one more alternative of its op
    for n in p.nodes:
        m.equal(f"assign[{n}]", [(1.0, v) for v in x[n].values()] + [(1.0, v) for v in k.get(n, {}).values()], 1.0)
        for d, v in s.get(n, {}).items():
            m.at_most(f"stream_le_x[{n}][{d}]", [(1.0, v), (-1.0, x[n][d])], 0.0)
    time_terms: dict[str, list[Term]] = {d: [] for d in p.device_names}  # per device: compute, issue
    step_terms: dict[str, list[Term]] = {d: [] for d in p.device_names}  # per device: optimizer steps
    # training state (solvers/train_state.py): o = state on the host, weights on d; c = recompute
    o = {n: {d: m.column(f"o[{n}][{d}]", upper=1.0) for d in x[n] if d != p.host} for n in p.offloadable}
    c = {n: {d: m.column(f"c[{n}][{d}]", upper=1.0) for d in x[n]} for n in p.recomputable}
    # g = state on the host, streamed to d for its step (its buffer left out: fewer bytes, still a bound)
    g = {n: {d: m.column(f"g[{n}][{d}]", upper=1.0) for d in x[n] if d != p.host} for n in p.state_streamable}
    for n, per_d in g.items():
        for d, v in per_d.items():
            away = [w for w in (s.get(n, {}).get(d), o.get(n, {}).get(d)) if w is not None]
            m.at_most(f"state_stream_le_x[{n}][{d}]", [(1.0, v), (-1.0, x[n][d])] + [(1.0, w) for w in away], 0.0)
    for n, per_d in o.items():
        for d, v in per_d.items():
            m.at_most(f"offload_le_x[{n}][{d}]", [(1.0, v), (-1.0, x[n][d])] + ([(1.0, s[n][d])] if d in s.get(n, {}) else []), 0.0)
    # h = saved activations held on the host (their buffer and copies' issue left out: still a bound)
    h = {n: {d: m.column(f"h[{n}][{d}]", upper=1.0) for d in x[n] if d != p.host} for n in p.saved_hostable}
    for n, per_d in c.items():
        for d, v in per_d.items():
            m.at_most(f"recompute_le_x[{n}][{d}]", [(1.0, v), (-1.0, x[n][d])], 0.0)
    for n, per_d in h.items():
        for d, v in per_d.items():
            again = [(1.0, w[n][d]) for w in (c, s) if d in w.get(n, {})]
            m.at_most(f"saved_on_host_le_x[{n}][{d}]", [(1.0, v), (-1.0, x[n][d])] + again, 0.0)
    floor = {n: interior_floor(p, n) for n in p.nodes} if p.region_offer.price else {}
    for n in p.nodes:
        for d, v in x[n].items():
            time_terms[d].append((scale * min(p.least_compute(n, d), floor.get(n, float("inf"))), v))
            if p.opt_step[n][d]:  # the step runs where the state lives: with the weights, or on the host
                step_terms[d].append((scale * p.opt_step[n][d], v))
                if d != p.host:
                    away = [w for w in (s.get(n, {}).get(d), o.get(n, {}).get(d)) if w is not None]
                    step_terms[d] += [(-scale * p.opt_step[n][d], w) for w in away]
                    step_terms[p.host] += [(scale * p.opt_step[n][p.host], w) for w in away]
        for d, v in s.get(n, {}).items():
            time_terms[d].append((scale * p.node_stream_issue_s(n, d), v))
        for d, v in c.get(n, {}).items():
            time_terms[d].append((scale * min(p.fwd_in[n][d].values()), v))
    for n, per_sp in k.items():
        for sp, v in per_sp.items():
            price = p.split_price[(n, sp)]
            if p.options.objective is Objective.LATENCY:
                time_terms[sp.home].append((scale * p.split_floor(n, sp), v))
            else:
                for d, seconds in zip(sp.devices, price.shard_s):
                    time_terms[d].append((scale * seconds, v))
    spec = p.options.pipeline
    in_flight = 1 if spec is None else spec.micro_batches if spec.schedule is Schedule.GPIPE else 1
    for d in p.device_names:
        terms: list[Term] = []
        work = m.column(f"work[{d}]")
        buffer = m.column(f"buffer[{d}]")
        for n in p.nodes:
            if d in x[n]:
                terms += [(mu * p.least_param_mem(n), x[n][d]), (mu * in_flight * p.least_saved(n), x[n][d])]
                if d in o.get(n, {}):
                    terms.append((-mu * (p.param_mem[n] - p.weight_mem[n]), o[n][d]))
                if d in g.get(n, {}):
                    terms.append((-mu * p.state_mem[n], g[n][d]))
                if d in c.get(n, {}):
                    terms.append((-mu * in_flight * p.least_saved(n), c[n][d]))
                if d in h.get(n, {}):
                    terms.append((-mu * in_flight * p.least_saved(n), h[n][d]))
                if p.least_work_mem(n):
                    m.at_least(f"working_set[{n}][{d}]", work, [(mu * p.least_work_mem(n), x[n][d])])
            if d in s.get(n, {}):
                terms.append((-mu * p.param_mem[n], s[n][d]))
                m.at_least(f"buffer[{n}][{d}]", buffer,
                           [(mu * p.least_stream_buffer(n, d), s[n][d])])
            if d == p.host:
                terms += [(mu * p.least_stream_mem(n, t), v) for t, v in s.get(n, {}).items()]
                terms += [(mu * p.offload_mem[n], v) for v in o.get(n, {}).values()]
                terms += [(mu * p.state_mem[n], v) for v in g.get(n, {}).values()]
                terms += [(mu * p.least_saved(n), v) for v in h.get(n, {}).values()]
            for sp, v in k.get(n, {}).items():
                if d in sp.devices:
                    i = sp.devices.index(d)
                    price = p.split_price[(n, sp)]
                    terms.append((mu * price.param_bytes[i], v))
                    if price.work_bytes[i]:
                        m.at_least(f"working_set[{n}][{sp.label}][{d}]", work, [(mu * price.work_bytes[i], v)])
        m.at_most(f"mem_cap[{d}]", terms + [(1.0, work), (1.0, buffer)], mu * p.capacity[d])
    T = m.column("T", cost=1.0)
    if spec is not None:  # (M - 1) bottleneck + every stage's time + the slowest optimizer step
        bottleneck, step = m.column("bottleneck"), m.column("optimizer_step")
        for d in p.device_names:
            m.at_least(f"stage_time[{d}]", bottleneck, time_terms[d])
            m.at_least(f"optimizer[{d}]", step, step_terms[d])
        m.at_least("step", T, [t for d in p.device_names for t in time_terms[d]]
                   + [(float(spec.micro_batches - 1), bottleneck), (1.0, step)])
    elif p.options.objective is Objective.LATENCY and p.train_state:  # host steps may hide behind backward
        m.at_least("critical_path", T, [t for d in p.device_names for t in time_terms[d]]
                   + [t for d in p.device_names if d != p.host for t in step_terms[d]])
        m.at_least("host_load", T, time_terms[p.host] + step_terms[p.host])
    elif p.options.objective is Objective.LATENCY:
        m.at_least("critical_path", T, [t for d in p.device_names for t in time_terms[d] + step_terms[d]])
    else:
        for d in p.device_names:
            m.at_least(f"device_load[{d}]", T, time_terms[d] + step_terms[d])
    for label in p.link_labels:
        terms = [(scale * p.least_stream_hop_s(n, d, label), v)
                 for n, per_d in s.items() for d, v in per_d.items() if label in p.hops(p.host, d)]
        for n, per_sp in k.items():  # a split's input out and its other shard's output back
            for sp, v in per_sp.items():
                spared = droppable(p, n, sp) if p.region_offer.price else frozenset()  # a region may drop them
                for src, dst, nbytes, _ in p.split_price[(n, sp)].copies:  # a time split: one per chunk
                    if (src, dst) in spared:
                        continue
                    if label in p.hops(src, dst):
                        terms.append((scale * p.hop_s(nbytes, src, dst, label), v))
        for n in p.nodes:  # gradients out (streamed or offloaded), updated weights back (offloaded)
            if p.options.training and p.grad_bytes[n]:
                for d, v in list(s.get(n, {}).items()) + list(o.get(n, {}).items()):
                    if label in p.hops(d, p.host):
                        terms.append((scale * grad_hop_s(p, n, d, label), v))
            for d, v in o.get(n, {}).items():
                if label in p.hops(p.host, d):
                    terms.append((scale * update_hop_s(p, n, d, label), v))
            for d, v in g.get(n, {}).items():
                if state_hop_s(p, n, d, label):
                    terms.append((scale * state_hop_s(p, n, d, label), v))
            for d, v in h.get(n, {}).items():
                both = min(saved_hop_s(p, n, a, d, p.host, label) + saved_hop_s(p, n, a, p.host, d, label)
                           for a in p.saved_parts_at[n])
                if both:
                    terms.append((scale * both, v))
        if terms:
            m.at_least(f"link_load[{label}]", T, terms)
    return m

