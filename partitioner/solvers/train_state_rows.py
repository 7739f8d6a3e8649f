"""The training-state part of the placement ILP: :mod:`partitioner.solvers.train_state` as
columns and rows of a :class:`~partitioner.solvers.formulation.Formulation`.

Columns (model units as in the formulation):

* ``o[v,d]`` binary: node ``v`` computes on accelerator ``d`` with its weights resident there and
  its optimizer state on the host (``o + s <= x``: offloaded and streamed exclude each other);
  its memory on ``d`` falls from ``param_mem`` to ``weight_mem``, the host gains ``offload_mem``,
  the gradient and the updated weights load the link, and its step runs on the host;
* ``g[v,d]`` binary: ``v`` computes on accelerator ``d`` with its weights resident there, its
  optimizer state on the host, streamed to ``d`` for its step and back (``o + s + g <= x``): ``d``'s
  memory falls by the state (``state_mem``) and gains the reused buffer of the largest streamed
  state part (a staircase, as the stream buffers), the host's rises by the state, the state loads
  the link both ways, and the step runs on ``d`` (its time in ``S``);
* ``c[v,d]`` binary: ``v`` recomputes its activations in backward (``c <= x``), where it computes
  in one dtype on ``d``: its saved activations leave ``d``'s memory and its forward time is paid
  again;
* ``h[v,d]`` binary: ``v`` computes on accelerator ``d`` in one dtype and holds its saved
  activations on the host (``c + s + h <= x``: not with recompute nor streamed weights): ``d``'s memory falls by them and
  gains the reused buffer of the largest member op's saved activations (a staircase, as the stream
  buffers), the host's rises by them, the link carries them out and back, and ``d`` pays each
  copy's issue latency;
* with ``latency`` (not a delayed update), the host worker's chain, over the trainable nodes
  ``v_1 .. v_K`` in topological order: ``S`` (the devices' sequential time, ``S >=`` compute,
  copies, issue, accelerator steps; ``T >= S``), ``Q[k] <= Q[k-1] +`` the backward time of the
  nodes from ``v_{k-1}`` up to ``v_k`` (the backward left once ``v_k``'s gradient is complete, at
  most its true value), ``W[k] >= W[k+1] + step_k h_k`` and ``W[k] >= S - Q[k] + gradient copy +
  step_k h_k`` (``h_k``: the state is on the host), ``T >= W[k] + update copy``; and ``T >=`` the
  host's total work; and the link's chain of streamed states over the ops of nodes with ``g``
  columns, ``V[k] >= V[k+1] + (in + step + out)_k g_k``, ``V[k] >= S - Q[k] + (in + step + out)_k
  g_k``, ``T >= V[k]``. At integer points ``W[1]`` and ``V[1]`` are the list schedules of
  :func:`step_schedule`.
"""

from __future__ import annotations

from partitioner.solvers.milp import Column, Term
from partitioner.solvers.train_state import (
    grad_hop_s, grad_s, saved_buffer_bytes, saved_hop_s, saved_issue_s, state_buffer_bytes, state_hop_s, update_hop_s,
    update_s,
)

# Formulation and Placement are annotations only: formulation.py imports this module.

__all__ = ["TrainStateColumns"]


def _name(kind: str, *parts: str) -> str:
    return kind + "".join(f"[{p}]" for p in parts)


class TrainStateColumns:
    """The ``o``, ``g``, ``c`` and ``h`` columns of one formulation, and the worker chains' rows."""

    def __init__(self, f: Formulation) -> None:
        self.f = f
        p = f.p
        self.ov: dict[str, dict[str, Column]] = {}
        self.cv: dict[str, dict[str, Column]] = {}
        self.gv: dict[str, dict[str, Column]] = {}
        self.hv: dict[str, dict[str, Column]] = {}
        self.chain: list[tuple[str, Column | None, Column]] = []  # (node, Q, W)
        self.S: Column | None = None
        for n in p.offloadable:
            for d in f.allowed[n]:
                if d == p.host:
                    continue
                o = self.ov.setdefault(n, {})[d] = f.milp.column(_name("o", n, d), upper=1.0, integer=True)
                terms: list[Term] = [(1.0, o), (-1.0, f.x(n, d))]
                s = f.sv.get(n, {}).get(d)
                if s is not None:
                    terms.append((1.0, s))
                f.milp.at_most(_name("offload_le_x", n, d), terms, 0.0)
        for n in p.state_streamable:
            for d in f.allowed[n]:
                if d == p.host:
                    continue
                g = self.gv.setdefault(n, {})[d] = f.milp.column(_name("g", n, d), upper=1.0, integer=True)
                terms = [(1.0, g), (-1.0, f.x(n, d))]
                terms += [(1.0, v) for v in (self.ov.get(n, {}).get(d), f.sv.get(n, {}).get(d)) if v is not None]
                f.milp.at_most(_name("state_stream_le_x", n, d), terms, 0.0)
        for n in p.recomputable:
            for d in f.allowed[n]:
                if len(f.dtypes_on(n, d)) != 1:
                    continue
                c = self.cv.setdefault(n, {})[d] = f.milp.column(_name("c", n, d), upper=1.0, integer=True)
                if isinstance(f.x(n, d), Column):
                    f.milp.at_most(_name("recompute_le_x", n, d), [(1.0, c), (-1.0, f.x(n, d))], 0.0)
        for n in p.saved_hostable:
            for d in f.allowed[n]:
                if d == p.host or len(f.dtypes_on(n, d)) != 1:
                    continue
                h = self.hv.setdefault(n, {})[d] = f.milp.column(_name("h", n, d), upper=1.0, integer=True)
                away = [v for v in (self.cv.get(n, {}).get(d), f.sv.get(n, {}).get(d)) if v is not None]
                f.milp.at_most(_name("saved_on_host_le_x", n, d),
                               [(1.0, h), (-1.0, f.x(n, d))] + [(1.0, v) for v in away], 0.0)

    # -- terms the formulation adds to its rows -------------------------------------------------

    def state_terms(self, n: str, d: str) -> list[Term]:
        """Terms of "``n``'s optimizer state lives on ``d``" (and its step runs there)."""
        f, p = self.f, self.f.p
        terms = f.resident(n, d)
        if d == p.host:
            return terms + [(1.0, o) for o in self.ov.get(n, {}).values()]
        o = self.ov.get(n, {}).get(d)
        return terms + ([(-1.0, o)] if o is not None else [])

    def memory_terms(self, n: str, d: str) -> list[Term]:
        """What offloading and recomputing change in ``d``'s memory."""
        p, mu = self.f.p, self.f.units.memory
        terms: list[Term] = []
        if d == p.host:
            terms += [(mu * p.offload_mem[n], o) for o in self.ov.get(n, {}).values()]
            terms += [(mu * p.state_mem[n], g) for g in self.gv.get(n, {}).values()]
        elif d in self.ov.get(n, {}):
            terms.append((-mu * (p.param_mem[n] - p.weight_mem[n]), self.ov[n][d]))
        if d != p.host and d in self.gv.get(n, {}):
            terms.append((-mu * p.state_mem[n], self.gv[n][d]))
        c = self.cv.get(n, {}).get(d)
        if c is not None:
            (a,) = self.f.dtypes_on(n, d)
            terms.append((-mu * p.saved_at[n][a], c))
        if d == p.host:
            for e, h in self.hv.get(n, {}).items():
                (a,) = self.f.dtypes_on(n, e)
                terms.append((mu * p.saved_at[n][a], h))
        elif d in self.hv.get(n, {}):
            (a,) = self.f.dtypes_on(n, d)
            terms.append((-mu * p.saved_at[n][a], self.hv[n][d]))
        return terms

    def saved_buffers(self, d: str) -> list[tuple[str, float, Column]]:
        """``(node, buffer, h)`` items of the buffer of saved activations copied to and from the host on ``d``."""
        mu = self.f.units.memory
        return [(n, mu * saved_buffer_bytes(self.f.p, n, self.f.dtypes_on(n, d)[0]), per_d[d])
                for n, per_d in self.hv.items() if d in per_d]

    def saved_issue_terms(self, device: str | None = None) -> list[Term]:
        """Issue latency of the copies of saved activations held on the host, on their computing device."""
        p, tu = self.f.p, self.f.units.time
        return [(tu * saved_issue_s(p, n, self.f.dtypes_on(n, d)[0], d), h)
                for n, per_d in self.hv.items() for d, h in per_d.items() if device is None or d == device]

    def state_buffers(self, d: str) -> list[tuple[str, float, Column]]:
        """``(node, buffer, g)`` items of the streamed-state buffer on ``d`` (its largest is held)."""
        mu = self.f.units.memory
        return [(n, mu * state_buffer_bytes(self.f.p, n), per_d[d]) for n, per_d in self.gv.items() if d in per_d]

    def recompute_terms(self, device: str | None = None) -> list[Term]:
        p, tu = self.f.p, self.f.units.time
        out: list[Term] = []
        for n, per_d in self.cv.items():
            for d, c in per_d.items():
                if device is None or d == device:
                    (a,) = self.f.dtypes_on(n, d)
                    out.append((tu * p.fwd_in[n][d][a], c))
        return out

    def link_terms(self, label: str, budget: bool) -> list[Term]:
        """Gradients out and updated weights back on link ``label`` (time, or bytes for a budget)."""
        f, p = self.f, self.f.p
        tu, mu = f.units.time, f.units.memory
        terms: list[Term] = []
        for n in p.nodes:
            if not p.trainable[n]:
                continue
            leaving = dict(self.ov.get(n, {}))
            for d, s in f.sv.get(n, {}).items():
                leaving.setdefault(d, None)
            for d in leaving:
                cols = [v for v in (self.ov.get(n, {}).get(d), f.sv.get(n, {}).get(d)) if v is not None]
                if label in p.hops(d, p.host) and p.grad_bytes[n]:
                    coef = mu * p.grad_bytes[n] if budget else tu * grad_hop_s(p, n, d, label)
                    terms += [(coef, v) for v in cols]
                o = self.ov.get(n, {}).get(d)
                if o is not None and label in p.hops(p.host, d):
                    terms.append((mu * p.trainable[n] if budget else tu * update_hop_s(p, n, d, label), o))
            for d, g in self.gv.get(n, {}).items():
                ways = (label in p.hops(p.host, d)) + (label in p.hops(d, p.host))
                if ways:
                    terms.append((mu * ways * p.state_mem[n] if budget else tu * state_hop_s(p, n, d, label), g))
        for n, per_d in self.hv.items():  # saved activations out in forward, back in backward
            for d, h in per_d.items():
                (a,) = f.dtypes_on(n, d)
                ways = (label in p.hops(p.host, d)) + (label in p.hops(d, p.host))
                if ways:
                    seconds = saved_hop_s(p, n, a, d, p.host, label) + saved_hop_s(p, n, a, p.host, d, label)
                    terms.append((mu * ways * p.saved_at[n][a] if budget else tu * seconds, h))
        return terms

    # -- the latency objective's rows -------------------------------------------------------------

    def latency_rows(self, T: Column, sequential: list[Term]) -> None:
        """``T >= S >= sequential``, the host's total work, and the worker chain (module docstring)."""
        f, p, tu = self.f, self.f.p, self.f.units.time
        host = p.host
        self.S = f.milp.column("S")
        f.ge("sequential", self.S, sequential)
        bounds: list[tuple[str, list[Term]]] = [  # rows on T, added after every W's (warm-start propagation order)
            ("after_sequential", [(1.0, self.S)]),
            (_name("host_load", host), f.compute_terms(host) + self.recompute_terms(host))]
        trainable = [n for n in p.nodes if p.trainable[n] > 0] if not p.options.delayed_update else []
        self._chain(T, trainable, bounds)
        for name, terms in bounds:
            f.ge(name, T, terms)

    def _chain(self, T: Column, trainable: list[str], bounds: list[tuple[str, list[Term]]]) -> None:
        """The worker chain over the original graph's trainable ops in topological order (a coarse
        node's members step one by one, as on the original graph)."""
        f, p, tu = self.f, self.f.p, self.f.units.time
        host = p.host
        if not trainable:
            return
        ops = [op for op in p.op_order if p.op_grad.get(op)]
        index = {op: i for i, op in enumerate(p.op_order)}
        qs: list[Column | None] = []
        previous = 0
        q_prev: Column | None = None
        for op in ops:
            span = p.op_order[previous:index[op]]
            previous = index[op]
            terms = []
            for m in span:
                node = p.node_of[m]
                terms += [(-tu * p.op_bwd[m][d][a], f.r(node, d, a)) for d in f.allowed[node]
                          for a in f.dtypes_on(node, d) if p.op_bwd[m][d][a]]
            if q_prev is None and not terms:
                qs.append(None)
                continue
            q = f.milp.column(_name("Q", op))
            f.milp.at_most(_name("backward_left", op),
                           [(1.0, q)] + ([(-1.0, q_prev)] if q_prev is not None else []) + terms, 0.0)
            qs.append(q)
            q_prev = q
        w_next: Column | None = None
        chain: list[tuple[str, Column | None, Column]] = []
        for op, q in reversed(list(zip(ops, qs))):
            n = p.node_of[op]
            w = f.milp.column(_name("W", op))
            step = [(tu * p.op_step[op][host] * c, v) for c, v in self.state_terms(n, host)]
            if w_next is not None:
                f.ge(_name("worker_after", op), w, [(1.0, w_next)] + step)
            copies = [(tu * p.one_way_s(p.op_grad[op], d, host), v)
                      for d in set(self.ov.get(n, {})) | set(f.sv.get(n, {}))
                      for v in (self.ov.get(n, {}).get(d), f.sv.get(n, {}).get(d)) if v is not None]
            ready = [(1.0, self.S)] + ([(-1.0, q)] if q is not None else []) + copies + step
            f.ge(_name("worker_ready", op), w, ready)
            weight = p.original.ops[op].trainable_param_bytes
            back = [(tu * p.one_way_s(weight, host, d), o) for d, o in self.ov.get(n, {}).items()]
            bounds.append((_name("updated", op), [(1.0, w)] + back))
            chain.append((op, q, w))
            w_next = w
        self.chain = chain
        v_next: Column | None = None
        for op, q in reversed(list(zip(ops, qs))):  # the link's chain of streamed states
            n = p.node_of[op]
            if n not in self.gv:
                continue
            nbytes = p.op_state[op]
            trip = [(tu * (p.one_way_s(nbytes, host, d) + p.op_step[op][d] + p.one_way_s(nbytes, d, host)), g)
                    for d, g in self.gv[n].items()]
            v = f.milp.column(_name("V", op))
            if v_next is not None:
                f.ge(_name("link_after", op), v, [(1.0, v_next)] + trip)
            f.ge(_name("state_ready", op), v, [(1.0, self.S)] + ([(-1.0, q)] if q is not None else []) + trip)
            bounds.append((_name("state_back", op), [(1.0, v)]))
            v_next = v

    # -- warm start and answer --------------------------------------------------------------------

    def start_values(self, values: list[float], placement: Placement, dtype: dict[str, str]) -> None:
        """Set ``o``, ``c`` and ``Q`` from ``placement`` (``S`` and ``W`` follow by propagation)."""
        p = self.f.p
        for n, per_d in self.ov.items():
            for d, o in per_d.items():
                on = placement.device[n] == d and n not in placement.streamed and placement.state.get(n) == p.host
                values[o.index] = 1.0 if on else 0.0
        for n, per_d in self.cv.items():
            for d, c in per_d.items():
                values[c.index] = 1.0 if placement.device[n] == d and n in placement.recompute else 0.0
        for n, per_d in self.gv.items():
            for d, g in per_d.items():
                values[g.index] = 1.0 if placement.device[n] == d and n in placement.streamed_state else 0.0
        for n, per_d in self.hv.items():
            for d, h in per_d.items():
                values[h.index] = 1.0 if placement.device[n] == d and n in placement.saved_on_host else 0.0
        if not self.chain:
            return
        before, prefix = 0.0, {}
        for op in p.op_order:
            prefix[op] = before
            n = p.node_of[op]
            before += p.op_bwd[op].get(placement.device[n], {}).get(dtype[n], 0.0)
        for n, q, _ in self.chain:
            if q is not None:
                values[q.index] = self.f.units.time * prefix[n]

    def answer(self, values: list[float], device: dict[str, str]
               ) -> tuple[dict[str, str], frozenset[str], frozenset[str], frozenset[str]]:
        """The placement's ``state``, ``recompute``, ``streamed_state`` and ``saved_on_host`` in a solution vector."""
        p = self.f.p
        state = {n: p.host for n, per_d in self.ov.items()
                 if device[n] in per_d and values[per_d[device[n]].index] > 0.5}
        recompute = frozenset(n for n, per_d in self.cv.items()
                              if device[n] in per_d and values[per_d[device[n]].index] > 0.5)
        streamed_state = frozenset(n for n, per_d in self.gv.items()
                                   if device[n] in per_d and values[per_d[device[n]].index] > 0.5)
        saved_on_host = frozenset(n for n, per_d in self.hv.items()
                                  if device[n] in per_d and values[per_d[device[n]].index] > 0.5)
        return state, recompute, streamed_state, saved_on_host
