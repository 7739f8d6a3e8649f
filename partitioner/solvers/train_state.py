"""Training state as part of a placement: where each trainable node's optimizer state lives, how
its gradient gets there, row-sparse updates, recompute, and when host steps run.

In: a :class:`~partitioner.solvers.problem.Problem` in training mode (:func:`cost_training_state`
fills its per-node numbers when it is built) and a
:class:`~partitioner.solvers.problem.Placement`. Out: those numbers, and :func:`step_schedule`,
when the host's optimizer steps end, which :func:`~partitioner.solvers.problem.evaluate` and the
ILP (:mod:`partitioner.solvers.train_state_rows`) both use.

Semantics (``DESIGN.md``, "Training state is placement"). For a node with trainable parameters
(``P`` trainable bytes, ``F`` frozen, ``G`` gradient bytes: ``P``, or the rows a batch can touch
for a row-sparse table; ``k`` state copies of the optimizer):

* **resident** (the default): weights, gradient and state on the computing device ``d``
  (``F + P + G + kP`` there); the step runs there, in its stream, after the node's backward;
* **offloaded** (``Placement.state[node] = host``): the weights stay on ``d`` (``F + P``), the host
  holds a float32 master copy, the gradient and the state (``P + G + kP``); the gradient crosses
  ``d -> host`` as backward produces it (``G`` bytes), the host steps, and the updated weights
  cross back (``P`` bytes);
* **streamed** (``Placement.streamed``): everything lives on the host (``F + P + G + kP``), the
  weights are copied to ``d`` in forward and again in backward (two copies per step, a reused
  buffer on ``d``), the gradient crosses back (``G``), and the host steps;
* **state streamed** (``Placement.streamed_state``; Adam-like optimizers with state, dense updates,
  not with a delayed update): weights and gradient on ``d`` (``F + P + G`` there), the optimizer
  state on the host (``kP``); once the node's gradient is complete its state crosses ``host -> d``
  (``kP`` bytes), ``d`` steps it in its stream (the same update as resident, on the weight itself:
  no master copy) and the state crosses back (``kP``). ``d`` holds one reused buffer of the
  largest streamed state part (one member op's state) beside the rest;
* a node computing on the host keeps everything there and the host steps.

A **row-sparse** update (a trainable gather whose table no other op reads, when the optimizer
allows: exactly for SGD and Adagrad, lazily for ``sparse-adam``, :func:`cost_models.training.sparse_update`)
writes no dense gradient in backward and steps only the rows a batch can touch. A node that
**recomputes** (``Placement.recompute``) saves no activations and runs its forward again in
backward. A node computing on an accelerator ``d`` may instead hold its **saved activations on the
host** (``Placement.saved_on_host``; not with recompute, nor with its weights streamed): the host's memory counts them, ``d``'s
holds one reused buffer of the largest member op's saved activations (the copy in flight), each
member op's saved bytes cross ``d -> host`` in forward and ``host -> d`` in backward, and these
copies are priced as prefetched weights are: the link's load (a parallel resource the step
cannot end before) and each copy's issue latency on ``d``.

When host steps run (objective ``latency``). The devices run the step's forward and backward one
op after another (``S``: compute, copies, stream issue, and the steps resident on accelerators).
Backward reaches a node's gradient at ``G_n = S - (backward time of the nodes before it)`` at the
latest; its gradient arrives on the host a copy later; one host worker steps the nodes in the
order their gradients arrive, each once its gradient is there and the previous step is done; an
offloaded node's updated weights then cross back. The step ends at the latest of ``S``, the last
updated weight's arrival, the host's total work (its compute and every host step) and each
link's load. Streamed states have their own chain on the link, beside the host worker's: in
the order their gradients complete, each node's state comes in, is stepped on ``d`` and goes back
(one at a time, through the one buffer), starting once its gradient is complete and the previous
one is back; the step ends no earlier than the last one back (the accelerator's step time also
counts in ``S``, as resident steps do). Both chains share the link with every other copy only
through the link's total load. With ``Placement.overlap`` false (what ZeRO-Offload, FSDP2 and torchao do), host steps
start only after backward. With ``Options.delayed_update`` (ZeRO-Offload's one-step delayed
update, opted in) the host's steps of one iteration run beside the next one's forward and
backward: the worker's chain no longer waits, and only the host's total work and the links bound
the step. Other objectives (throughput, makespan, pipeline stages) price each step on its state's
device; streaming, offload and recompute are offered with ``latency`` and ``throughput`` only.
"""

from __future__ import annotations

from cost_models.training import dense_gradient_time, sparse_update
from partitioner.ir import OpClass

# Problem and Placement (partitioner.solvers.problem) are annotations only: problem.py imports this
# module, which imports nothing back.

__all__ = ["cost_training_state", "saved_buffer_bytes", "saved_hop_s", "saved_issue_s", "saved_s", "state_hop_s",
           "state_s", "step_schedule", "step_split", "streamed_trips", "tidy"]


def cost_training_state(p: Problem) -> None:
    """Fill ``p``'s training-state numbers: ``train_state`` (choices offered), ``sparse_ops``,
    ``grad_bytes``, ``weight_mem``, ``offload_mem``, ``state_mem`` / ``state_parts`` / ``op_state``
    (optimizer-state bytes per node, member op and original op), ``fwd_in`` (a node's forward seconds per device
    and dtype, paid again when it recomputes), ``op_bwd`` / ``op_step`` / ``op_grad`` (per original op,
    for the step schedule), ``offloadable`` and ``recomputable``; and re-price parameter memory,
    optimizer steps and sparse gathers' backward."""
    o = p.options
    p.train_state = bool(o.training and o.placed_optimizer and o.pipeline is None and o.objective.value != "makespan")
    p.sparse_exact = o.optimizer.sparse_exact
    p.grad_bytes = dict(p.trainable)
    p.weight_mem = dict(p.param_bytes)
    p.offload_mem = {n: 0 for n in p.nodes}
    p.fwd_in = {}
    p.grad_parts = {n: () for n in p.nodes}    # per member op: gradient bytes (one copy each)
    p.update_parts = {n: () for n in p.nodes}  # per member op: trainable weight bytes (one copy back each)
    p.state_mem = {n: 0 for n in p.nodes}
    p.state_parts = {n: () for n in p.nodes}   # per member op: optimizer-state bytes (one copy each way)
    p.op_state = {}
    p.sparse_ops = frozenset()
    p.offloadable, p.recomputable, p.state_streamable, p.saved_hostable = (), (), (), ()
    p.op_order = tuple(op.name for op in p.original.topological_order())  # backward runs it in reverse
    p.node_of = {op: n for n in p.nodes for op in p.members[n]}
    p.op_bwd, p.op_step, p.op_grad = {}, {}, {}
    if not o.training:
        return
    graph = p.original
    p.sparse_ops = frozenset(_sparse_ops(p)) if o.placed_optimizer else frozenset()
    k = o.optimizer.state_copies
    for n in p.nodes:
        ops = [graph.ops[m] for m in p.members[n]]
        step_bytes = {op.name: _update_bytes(p, op) for op in ops}
        grad = sum(step_bytes.values())
        trainable = p.trainable[n]
        frozen = p.param_bytes[n] - trainable
        p.grad_bytes[n] = grad
        p.grad_parts[n] = tuple(b for b in step_bytes.values() if b)
        p.update_parts[n] = tuple(op.trainable_param_bytes for op in ops if op.trainable_param_bytes)
        p.param_mem[n] = frozen + trainable + grad + k * trainable
        p.offload_mem[n] = trainable + grad + k * trainable
        p.state_mem[n] = k * trainable
        p.state_parts[n] = tuple(k * b for b in p.update_parts[n])
        p.param_mem_at[n] = {a: p.param_mem[n] for a in p.param_mem_at[n]}  # float32 masters in training
        p.opt_step[n] = {d.name: sum(p.costs.optimizer_step_time(b, d, o.optimizer).seconds
                                     for b in step_bytes.values()) for d in p.devices.devices}
        for op in ops:
            p.op_grad[op.name] = step_bytes[op.name]
            p.op_state[op.name] = k * op.trainable_param_bytes
            p.op_step[op.name] = {d.name: p.costs.optimizer_step_time(step_bytes[op.name], d, o.optimizer).seconds
                                  for d in p.devices.devices}
            p.op_bwd[op.name] = {}
        p.fwd_in[n] = {}
        for d, per_a in p.compute_in[n].items():
            device = p.devices.device(d)
            p.fwd_in[n][d] = {}
            for a in per_a:
                fwd_total = 0.0
                for op in ops:
                    fwd, bwd = _fwd_bwd(p, op, device, p.op_dtype(op.name, a))
                    p.op_bwd[op.name].setdefault(d, {})[a] = bwd
                    fwd_total += fwd
                    if op.name in p.sparse_ops:
                        per_a[a] = max(per_a[a] - dense_gradient_time(op, device).seconds, 0.0)
                p.fwd_in[n][d][a] = min(fwd_total, per_a[a])
            p.compute[n][d] = per_a[p.choices[n][d][0]]
    if p.train_state and o.offload:
        p.offloadable = tuple(n for n in p.nodes if p.trainable[n] > 0)
    if p.train_state and o.offload and o.stream_state and k and not o.delayed_update:
        p.state_streamable = tuple(n for n in p.nodes if p.trainable[n] > 0 and not p.sparse_ops.intersection(p.members[n]))
    activations = tuple(n for n in p.nodes if p.saved[n] > 0
                        and not all(graph.ops[m].op_class is OpClass.VIEW for m in p.members[n]))
    if p.train_state and o.recompute:
        p.recomputable = activations
    if p.train_state and o.save_on_host:
        p.saved_hostable = activations


def _fwd_bwd(p: Problem, op, device, dtype: str) -> tuple[float, float]:  # noqa: ANN001
    """``op``'s forward and backward seconds on ``device`` in ``dtype`` (a row-sparse gather's
    backward without its dense gradient)."""
    if dtype == "float32":
        total, fwd = p.costs.training_op_time(op, device).seconds, p.costs.op_time(op, device).seconds
    else:
        total = p.costs.op_time_in(op, device, dtype, training=True).seconds
        fwd = p.costs.op_time_in(op, device, dtype).seconds
    if op.name in p.sparse_ops:
        total -= dense_gradient_time(op, device).seconds
    fwd = min(fwd, max(total, 0.0))
    return fwd, max(total - fwd, 0.0)


def _sparse_ops(p: Problem) -> list[str]:
    """Trainable gathers whose table may update row-sparse: the optimizer allows it, the op owns
    its table alone (no other op reads it: a tied weight's gradient is dense) and reads it with
    one index tensor."""
    if not p.options.optimizer.sparse_rows or not p.options.sparse_updates:
        return []
    shared = {sp.name for sp in p.shared}
    out = []
    for op in p.original.ops.values():
        if op.op_class is not OpClass.GATHER or not op.trainable_param_bytes or len(op.owned_params) != 1:
            continue
        (name,) = op.owned_params
        param = p.original.params[name]
        if name in shared or set(param.users) - {op.name} or not param.shape:
            continue
        if _update_bytes_of(p, op, param) is not None:
            out.append(op.name)
    return out


def _index_elements(p: Problem, op) -> int:  # noqa: ANN001 - an Op
    """Elements of the gather's index input (the rows one batch reads at most)."""
    sizes = [p.original.tensors[t] for t in op.inputs if t in p.original.tensors]
    ints = [t for t in sizes if t.dtype.startswith(("int", "uint"))]
    return max((_numel(t.shape) for t in ints), default=0)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _update_bytes_of(p: Problem, op, param) -> int | None:  # noqa: ANN001
    rows = _index_elements(p, op)
    if rows <= 0:
        return None
    return sparse_update(op, param.shape[0], rows, p.options.optimizer)


def _update_bytes(p: Problem, op) -> int:  # noqa: ANN001 - an Op
    """Trainable bytes ``op``'s gradient and step move per iteration (its rows when sparse)."""
    if op.name in p.sparse_ops:
        (name,) = op.owned_params
        touched = _update_bytes_of(p, op, p.original.params[name])
        if touched is not None:
            return touched
    return op.trainable_param_bytes


def grad_s(p: Problem, n: str, src: str) -> float:
    """Seconds ``n``'s gradients take from ``src`` to the host (one copy per member op)."""
    return sum(p.one_way_s(b, src, p.host) for b in p.grad_parts[n])


def update_s(p: Problem, n: str, dst: str) -> float:
    """Seconds ``n``'s updated weights take from the host to ``dst`` (one copy per member op)."""
    return sum(p.one_way_s(b, p.host, dst) for b in p.update_parts[n])


def grad_hop_s(p: Problem, n: str, src: str, label: str) -> float:
    return sum(p.hop_s(b, src, p.host, label) for b in p.grad_parts[n])


def update_hop_s(p: Problem, n: str, dst: str, label: str) -> float:
    return sum(p.hop_s(b, p.host, dst, label) for b in p.update_parts[n])


def state_s(p: Problem, n: str, d: str) -> float:
    """Seconds ``n``'s optimizer state takes from the host to ``d`` and back (one copy per member op each way)."""
    return sum(p.one_way_s(b, p.host, d) + p.one_way_s(b, d, p.host) for b in p.state_parts[n])


def state_hop_s(p: Problem, n: str, d: str, label: str) -> float:
    """Seconds link ``label`` is busy with ``n``'s state streamed to ``d`` and back."""
    return sum(p.hop_s(b, p.host, d, label) + p.hop_s(b, d, p.host, label) for b in p.state_parts[n])


def state_buffer_bytes(p: Problem, n: str) -> int:
    """The buffer a streamed state of ``n`` needs on its computing device: its largest member op's state."""
    return max(p.state_parts[n], default=0)


def saved_s(p: Problem, n: str, dtype: str, src: str, dst: str) -> float:
    """Seconds ``n``'s saved activations (held in ``dtype``) take one way (one copy per member op)."""
    return sum(p.one_way_s(b, src, dst) for b in p.saved_parts_at[n][dtype])


def saved_hop_s(p: Problem, n: str, dtype: str, src: str, dst: str, label: str) -> float:
    """Seconds link ``label`` is busy with ``n``'s saved activations copied once from ``src`` to ``dst``."""
    return sum(p.hop_s(b, src, dst, label) for b in p.saved_parts_at[n][dtype])


def saved_issue_s(p: Problem, n: str, dtype: str, d: str) -> float:
    """Issue latency ``d`` pays for ``n``'s saved activations held on the host: one per member op's
    copy, out in forward and back in backward (as a prefetched weight copy's)."""
    return 2 * len(p.saved_parts_at[n][dtype]) * p.stream_issue_s(d)


def saved_buffer_bytes(p: Problem, n: str, dtype: str) -> int:
    """The buffer ``n``'s saved activations held on the host need on its computing device: its
    largest member op's saved activations (in ``dtype``)."""
    return max(p.saved_parts_at[n][dtype], default=0)


def offloaded(p: Problem, placement: Placement, n: str) -> bool:
    """``n`` keeps its weights on its computing device and its optimizer state on the host."""
    return placement.state.get(n) == p.host and placement.residence(n) == placement.device[n] != p.host


def gradient_leaves(p: Problem, placement: Placement, n: str) -> bool:
    """``n``'s gradient crosses to the host (offloaded or streamed, computing off the host)."""
    return p.trainable[n] > 0 and placement.device[n] != p.host and placement.state_device(n) == p.host


def step_schedule(p: Problem, placement: Placement, sequential: float, dtype: dict[str, str]) -> float:
    """When the host's last optimizer step (and the updated weights it sends back), and the last
    streamed state back on the host, end, given the devices' sequential time ``sequential`` (see the
    module docstring); 0.0 without host steps or streamed states."""
    host_end, link_end, _ = _chains(p, placement, sequential, dtype)
    return max(host_end, link_end)


def streamed_trips(p: Problem, placement: Placement, sequential: float, dtype: dict[str, str]) -> tuple[float, float]:
    """The streamed states' seconds in all (each one's copies in and out and its step) and how long
    their chain runs past the devices' sequential time ``sequential`` (after backward)."""
    _, link_end, trips = _chains(p, placement, sequential, dtype)
    return trips, max(0.0, link_end - sequential) if trips else 0.0


def _chains(p: Problem, placement: Placement, sequential: float, dtype: dict[str, str]) -> tuple[float, float, float]:
    """The host worker's end, the link's chain of streamed states' end, and those trips' seconds."""
    x, host = placement.device, p.host
    before = 0.0
    prefix: dict[str, float] = {}
    for op in p.op_order:  # per original op, so a coarse node's members step as they would alone
        n = p.node_of[op]
        prefix[op] = before
        before += p.op_bwd[op].get(x[n], {}).get(dtype[n], 0.0)
    worker = end = link = trips = 0.0
    for op in reversed(p.op_order):
        n = p.node_of[op]
        if p.op_grad[op] and n in placement.streamed_state:  # the link's chain: state in, step, state out
            ready = sequential - prefix[op] if placement.overlap else sequential
            nbytes = p.op_state[op]
            trip = p.one_way_s(nbytes, host, x[n]) + p.op_step[op][x[n]] + p.one_way_s(nbytes, x[n], host)
            link = max(link, ready) + trip
            trips += trip
            continue
        if not p.op_grad[op] or placement.state_device(n) != host:
            continue
        ready = sequential - prefix[op]
        if x[n] != host:
            ready += p.one_way_s(p.op_grad[op], x[n], host)
        if not placement.overlap:
            ready = max(ready, sequential)
        worker = max(worker, ready) + p.op_step[op][host]
        back = p.one_way_s(p.original.ops[op].trainable_param_bytes, host, x[n]) if offloaded(p, placement, n) else 0.0
        end = max(end, worker + back)
    return end, link, trips


def step_split(p: Problem, placement: Placement, sequential: float, total: float) -> tuple[dict[str, float], float, float]:
    """Optimizer-step seconds per device, and of them the seconds hidden beside backward and the
    seconds exposed after it (accelerator steps run in their stream: exposed)."""
    per_device = {d: 0.0 for d in p.device_names}
    for n in p.nodes:
        if p.trainable[n]:
            d = placement.state_device(n)
            per_device[d] += p.opt_step[n][d]
    host_steps = per_device[p.host]
    in_stream = sum(s for d, s in per_device.items() if d != p.host)
    after = max(0.0, min(total - sequential, host_steps)) if p.train_state else host_steps
    return per_device, max(0.0, host_steps - after), in_stream + after


def tidy(p: Problem, placement: Placement, evaluate, deadline: float) -> Placement:  # noqa: ANN001
    """``placement`` with each recompute, each activation held on the host and each offloaded or streamed optimizer state it does not need undone:
    one at a time, kept undone where the placement still fits and is no slower (``evaluate`` is
    :func:`partitioner.solvers.problem.evaluate`). A solver stopped within its gap, or indifferent
    between choices that cost the same (a host step hidden behind backward costs nothing), may keep
    state on the host or recompute where nothing asks for it; the plan then copies and recomputes
    less for the same predicted step. Stops at ``deadline`` (``time.perf_counter()``)."""
    import dataclasses
    import time

    if not p.train_state or not (placement.state or placement.recompute or placement.streamed_state
                                 or placement.saved_on_host):
        return placement
    best = evaluate(p, placement)
    if not best.feasible:
        return placement
    for kind in ("recompute", "saved_on_host", "streamed_state", "state"):
        for n in sorted(getattr(placement, kind), key=p.index.__getitem__):
            if time.perf_counter() > deadline:
                return placement
            if kind in ("recompute", "saved_on_host", "streamed_state"):
                candidate = dataclasses.replace(placement, **{kind: getattr(placement, kind) - {n}})
            else:
                candidate = dataclasses.replace(placement, state={m: h for m, h in placement.state.items() if m != n})
            ev = evaluate(p, candidate)
            if ev.feasible and ev.total_s <= best.total_s * (1 + 1e-12):
                placement, best = candidate, ev
    return placement
