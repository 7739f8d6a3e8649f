"""What a plan's placement implies: the memory and copies it needs, recomputed and compared with the record.

In: a :class:`~partitioner.plan.record.Plan` whose names resolve (the reader's checks ran), and, for
the exact check, the :class:`~partitioner.ir.OpGraph` it was made for. Out: nothing, or an error
naming the section, the device or op, and the fix (re-plan). A plan edited in its placement alone
keeps the memory and transfers of the old placement; these checks refuse it wherever it is read.

* From the plan alone (:func:`check_implied`, run whenever a plan is built or read, so ``explain``,
  ``report`` and ``launch`` refuse it too): ``model.op_bytes`` (each op's output and parameter bytes)
  and ``model.edges`` (with the bytes each edge carries) give each device a floor on its memory: the
  parameters resident there (a streamed op's on the device holding its weights; in 16 bits, their
  share), the buffers of the weights streamed to it (two of the largest for ``prefetch``, one for
  ``sync``) and the largest output of an op computing there; a recorded ``used`` below it is refused.
  They also fix which copies must exist: every edge that carries bytes between two devices needs a
  copy of its producer's output to the consumer's device (in a pipeline plan, one per stage boundary
  it crosses, and no edge goes back a stage), and the streamed weights between two devices add up
  to the weight copies between them, each in the form its device computes with (packed, 16-bit or
  float32: :func:`streamed_bytes`). (A torch graph names each tensor after the op making it,
  ``op`` or ``op.1``; an ONNX graph's tensor names say nothing of their producer, so there an edge
  needs some copy between the two devices.)
* With the graph (:func:`check_against_graph`, run by :meth:`Plan.check_graph`: ``emit``,
  ``check``, the compile backend's plan cache): the placement is evaluated on the graph with
  :func:`partitioner.solvers.problem.evaluate`, the one cost semantics of every solver (parameters,
  activations and stream buffers per device; pipeline stages with their micro-batches in flight):
  no device may need more memory than the plan records, every copy (tensor, devices, bytes) must be
  the plan's, every op holding its saved activations on the host must save the bytes the plan
  says, and every op must sit on a device that can run it. (Copy *times* depend on the cost model and are not
  compared.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cost_models.precision import FLOAT32, itemsize_factor
from partitioner.errors import PlanMismatch
from partitioner.plan.values import _REPLAN

if TYPE_CHECKING:
    from partitioner.ir import OpGraph
    from partitioner.plan.fields import FieldReader

__all__ = ["memory_floor", "check_implied", "check_against_graph", "streamed_bytes"]


def _key(path: str, key: str) -> str:
    return f'{path}["{key}"]'


#: the least share of its float32 parameter bytes a linear holds with its weight packed (the weight
#: alone shrinks this much; scales and the bias add to it)
PACKED_FLOOR = {"int8": 0.25, "float8": 0.25, "int4": 0.125}


def memory_floor(plan: Any) -> dict[str, tuple[int, int, int, str | None]]:
    """Per device, what the placement alone puts there at least: (resident parameter bytes, stream
    buffer bytes, the largest output of an op computing there, the op with the most resident
    parameter bytes there or None).

    Example:
        >>> memory_floor(plan)["cuda:0"]                   # doctest: +SKIP
        (4194304, 0, 256, 'linear')
    """
    low = plan.precision.get("ops", {}) if plan.precision else {}
    buffers_of = 2 if plan.stream_mode == "prefetch" else 1
    names = plan.devices.names()
    params, buffers, largest = dict.fromkeys(names, 0), dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    heaviest: dict[str, tuple[int, str]] = {}
    packed = plan.precision.get("weights", {}) if plan.precision else {}
    viewed = _expert_weight_views(plan)
    for op, device in plan.placement.items():
        out, par = plan.op_bytes.get(op, (0, 0))
        share = itemsize_factor(low[op]) if op in low else 1.0
        home = plan.weights.get(op, device)
        if not plan.training:  # training keeps float32 master weights; inference holds them as computed
            par = int(par * (PACKED_FLOOR[packed[op]] if op in packed else share))
        if op in plan.splits or op in viewed:  # its shards' bytes need the weight's shape: checked with the graph
            par = 0
        if home != device:  # streamed: held on its home in that form, copied into a reused buffer where it runs
            buffers[device] = max(buffers[device], buffers_of * par)
        params[home] += par
        if par > heaviest.get(home, (0, ""))[0]:
            heaviest[home] = (par, op)
        if op not in viewed:  # a view of a weight held on the host, chunk by chunk: nothing on the device
            largest[device] = max(largest[device], int(out * share))
    return {d: (params[d], buffers[d], largest[d], heaviest.get(d, (0, None))[1]) for d in names}


def _expert_weight_views(plan: Any) -> set[str]:
    """The ops owning the fused weights of ops split in time by expert (held on the host, chunk by chunk)."""
    from partitioner.plan.splits import expert_weight_op

    from partitioner.solvers.expert_streaming import entry_cuts_experts

    return {view for op, e in plan.splits.items() if entry_cuts_experts(e)
            and (view := expert_weight_op(plan, op, e)) is not None}


def check_implied(plan: Any, r: FieldReader) -> None:
    """Raise (through ``r``) where the recorded memory is below what the placement puts on a device,
    where an edge crossing devices has no copy, where streamed weights and weight copies disagree,
    or where a pipeline edge goes back a stage (see the module docstring).

    Example:
        >>> check_implied(plan, FieldReader("plan.json"))   # doctest: +SKIP
    """
    for device, (params, buffers, largest, heaviest) in memory_floor(plan).items():
        used = plan.memory[device]["used"]
        if used < params + buffers + largest:
            example = f", e.g. {heaviest!r} (parameter bytes {plan.op_bytes[heaviest][1]:,})" if heaviest else ""
            r.fail(f"{_key('memory', device)}.used",
                   f"{used:,} bytes, but the placement puts at least {params + buffers + largest:,} bytes on "
                   f"{device} ({params:,} of resident parameters{example}, {buffers:,} of stream buffers, "
                   f"{largest:,} of its largest output): the memory section does not match the placement "
                   f"(was the placement edited?); {_REPLAN}")
    _check_weight_copies(plan, r)
    _check_crossings(plan, r)


def _check_weight_copies(plan: Any, r: FieldReader) -> None:
    """The weight copies between two devices carry the streamed parameters between them (twice in
    training: forward and backward)."""
    if any(op not in plan.op_bytes for op in plan.weights):
        return  # a plan without op_bytes (hand-made, or older) says no weight sizes
    passes = 2 if plan.training else 1
    implied: dict[tuple[str, str], int] = {}
    for op, home in plan.weights.items():
        pair = (home, plan.placement[op])
        implied[pair] = implied.get(pair, 0) + passes * streamed_bytes(plan, op)
    recorded: dict[tuple[str, str], int] = {}
    for t in plan.transfers:
        if t.kind == "weights":
            recorded[(t.src, t.dst)] = recorded.get((t.src, t.dst), 0) + t.bytes
    for pair in sorted(set(implied) | set(recorded)):
        if implied.get(pair, 0) != recorded.get(pair, 0):
            r.fail("transfers", f"copy {recorded.get(pair, 0):,} bytes of weights {pair[0]} -> {pair[1]}, but "
                                f"the ops streamed from {pair[0]} to {pair[1]} (weights, placement) hold "
                                f"{implied.get(pair, 0):,}: the transfers do not match the placement (was it "
                                f"edited?); {_REPLAN}")


def streamed_bytes(plan: Any, op: str) -> int:
    """Bytes of ``op``'s weights per streamed copy: held as its device computes with them (inference:
    packed with their scales where ``precision.weight_bytes`` lists it, in 16 bits where
    ``precision.ops`` does; training: float32 master weights)."""
    par = plan.op_bytes[op][1]
    section = plan.precision or {}
    if plan.training:
        return par
    if op in section.get("weight_bytes", {}):
        return section["weight_bytes"][op]
    low = section.get("ops", {})
    return int(par * itemsize_factor(low[op])) if op in low else par


def _check_crossings(plan: Any, r: FieldReader) -> None:
    """Every edge carrying bytes between two devices has its copies (a pipeline: one per boundary)."""
    if not plan.edge_bytes:
        return  # an older plan: its edges do not say which carry bytes
    sent: set[tuple[str, str, str]] = set()  # (producer op, from, to) of each activation copy
    loose: set[tuple[str, str]] = set()      # (from, to) of copies whose producer their name does not give
    for t in plan.transfers:
        if t.kind == "activation":
            producer = t.tensor if t.tensor in plan.placement else t.tensor.rpartition(".")[0]
            sent.add((producer, t.src, t.dst))
            if producer not in plan.placement and plan.capture == "onnx":  # ONNX names its tensors freely
                loose.add((t.src, t.dst))
    stages = [st["device"] for st in plan.pipeline["stages"]] if plan.pipeline else []
    index = {d: i for i, d in enumerate(stages)}
    for (u, v), nbytes in zip(plan.edges, plan.edge_bytes):
        src, dst = plan.placement[u], plan.placement[v]
        if src == dst or nbytes == 0:
            continue
        if stages and index[dst] < index[src]:
            r.fail(_key("placement", v), f"{dst!r} is an earlier pipeline stage than {src!r}, where its input "
                                         f"{u!r} is computed: stages must be contiguous (was the placement "
                                         f"edited?); {_REPLAN}")
        for hop in _hops(src, dst, stages, index):
            if (u, *hop) not in sent and hop not in loose:
                r.fail("transfers", f"no copy of {u!r}'s output {hop[0]} -> {hop[1]}, but the placement runs "
                                    f"{u!r} on {src} and its consumer {v!r} on {dst} ({nbytes:,} bytes cross): "
                                    f"the transfers do not match the placement (was it edited?); {_REPLAN}")


def _hops(src: str, dst: str, stages: list[str], index: dict[str, int]) -> Iterable[tuple[str, str]]:
    """The copies a tensor takes from ``src`` to ``dst``: direct, or relayed stage by stage."""
    if not stages:
        return ((src, dst),)
    return tuple((stages[i], stages[i + 1]) for i in range(index[src], index[dst]))


# --------------------------------------------------------------------------------------------
# With the graph: the placement evaluated as every solver evaluates it
# --------------------------------------------------------------------------------------------


def check_against_graph(plan: Any, graph: OpGraph) -> None:
    """Raise PlanMismatch unless ``plan``'s placement, evaluated on ``graph`` (the graph it was made
    for: :meth:`Plan.check_graph` checked the fingerprint and ops), needs exactly the memory per
    device and the copies the plan records, on devices that can run every op.

    Raises:
        PlanMismatch: the first line names the section and device (``memory["cuda:0"].used``) or the
            copy, the recorded and the implied values, and the fix; further lines list other differences.

    Example:
        >>> check_against_graph(Plan.load("plan.json"), from_module(model, inputs))   # doctest: +SKIP
    """
    evaluation = _evaluate(plan, graph)
    lines = []
    for device in plan.devices.names():
        recorded, implied = plan.memory[device]["used"], evaluation.memory.get(device, 0)
        if implied > recorded:  # a plan that says it fits where it does not (recording more only over-reserves)
            capacity = plan.memory[device]["capacity"]
            over = f", over its capacity of {capacity:,}" if implied > capacity else ""
            lines.append(f"{_key('memory', device)}.used is {recorded:,} bytes, but the placement needs "
                         f"{implied:,} bytes on {device} for this model{over}")
    lines += [f"placement: {v}" for v in evaluation.violations if v.endswith(")") and "cannot run it" in v]
    lines += [f"splits: {v}" for v in evaluation.violations if v.startswith("op ") and " is split " in v]
    lines += _copy_differences(plan.transfers, evaluation.transfers)
    lines += _held_differences(plan, evaluation.transfers)
    if lines:
        more = [f"  also: {line}" for line in lines[1:6]]
        raise PlanMismatch("\n".join([
            f"{plan.source}: {lines[0]}: the plan's sections do not match its placement (was the plan file "
            f"edited?); {_REPLAN}", *more]))


def _evaluate(plan: Any, graph: OpGraph) -> Any:
    """``evaluate`` of the plan's placement on ``graph``, under the plan's options."""
    from cost_models.precision import compose, resolve_precision
    from partitioner.solvers.pipeline import PipelineSpec
    from partitioner.plan.splits import split_of
    from partitioner.solvers.problem import Objective, Options, Placement, Problem, StreamMode, evaluate
    from partitioner.solvers.expert_streaming import entry_cuts_experts, fold_expert_weights
    from partitioner.solvers.splits import SplitOptions, even_shares

    section = plan.pipeline
    spec = PipelineSpec(section["micro_batches"], section["schedule"]) if section else None
    precision = resolve_precision(dict(plan.precision["setting"]) if not isinstance(plan.precision["setting"], str)
                                  else plan.precision["setting"], plan.devices) if plan.precision else None
    if precision is not None and precision.max_error is not None:  # measured when planned: precision.error
        precision = dataclasses.replace(precision, max_error=None)
    state = plan.training_state
    params = state.get("params", {}) if state else {}
    options = Options(objective=Objective(plan.objective), training=plan.training, optimizer=plan.optimizer,
                      pipeline=spec, precision=precision,
                      sparse_updates=any(ps["update"] == "sparse" for ps in params.values()),
                      delayed_update=bool(state.get("delayed_update")) if state else False,
                      save_on_host=bool(state.get("saved_on_host")) if state else False)
    split = {op: split_of(entry) for op, entry in plan.splits.items()}
    if split:  # offer exactly the recorded fractions and axes: a split the op cannot take is a violation
        fractions = tuple(sorted({sp.fractions[0] for sp in split.values() if sp.axis != "time"
                                  and len(sp.devices) == 2}))
        chunks = tuple(sorted({sp.chunks for sp in split.values() if sp.axis == "time"}))
        degrees = tuple(sorted({len(sp.devices) for sp in split.values() if sp.axis != "time"}))
        uneven = any(sp.fractions != even_shares(len(sp.devices)) for sp in split.values()
                     if sp.axis != "time" and len(sp.devices) > 2)  # rate-proportional: offered with proportional
        options = dataclasses.replace(options, splits=SplitOptions(
            **({"fractions": fractions} if fractions else {}), **({"chunks": chunks} if chunks else {}),
            **({"degrees": degrees} if degrees else {}), proportional=uneven, balanced=False,
            axes=tuple(sorted({sp.axis for sp in split.values()}))))
    by_expert = any(entry_cuts_experts(e) for e in plan.splits.values())
    folded = fold_expert_weights(graph) if by_expert else None
    if folded is not None:  # a time split by expert cuts an experts op and its weight's view as one node
        return _evaluate_folded(plan, graph, folded, options, split)
    problem = Problem(graph, plan.devices, options)
    ops = plan.precision.get("ops", {}) if plan.precision else {}
    packed = plan.precision.get("weights", {}) if plan.precision else {}
    dtypes = {op: compose(ops.get(op, FLOAT32), packed.get(op)) for op in plan.placement} if precision is not None else {}
    host = plan.devices.host_device().name
    offloaded = {ps["op"]: host for ps in params.values() if ps["step"] == host and ps["weights"] == ps["compute"] != host}
    streamed_state = frozenset(ps["op"] for ps in params.values() if ps["state"] == host != ps["step"])
    recompute = frozenset(state.get("recompute", ())) if state else frozenset()
    saved_on_host = frozenset(state.get("saved_on_host", ())) if state else frozenset()
    return evaluate(problem, Placement(dict(plan.placement), dict(plan.weights), StreamMode(plan.stream_mode),
                                       precision=dtypes, state=offloaded, recompute=recompute,
                                       streamed_state=streamed_state, split=split, saved_on_host=saved_on_host))


def _evaluate_folded(plan: Any, graph: OpGraph, folded: Any, options: Any, split: dict[str, Any]) -> Any:
    """``evaluate`` of the plan's placement on ``graph`` with each experts op and its weight's view in
    one node (:func:`~partitioner.solvers.expert_streaming.fold_expert_weights`); a node whose ops the
    plan places apart takes its experts op's device, and the split then names the view's misplacement."""
    from partitioner.solvers.problem import Placement, Problem, StreamMode, evaluate

    problem = Problem(folded.graph, plan.devices, options, members=folded.members, original=graph)
    group = folded.group_of
    device = {g: plan.placement[ops[-1]] for g, ops in folded.members.items()}
    streamed = {group[op]: home for op, home in plan.weights.items()}
    return evaluate(problem, Placement(device, streamed, StreamMode(plan.stream_mode),
                                       split={group[op]: sp for op, sp in split.items()}))


def _copies(transfers: Iterable[Any]) -> dict[tuple[str, ...], int]:
    """Bytes per copy: (kind, tensor, from, to); weight copies summed per (from, to) (a coarse node's
    weights are one copy, its ops' one each: the same bytes)."""
    out: dict[tuple[str, ...], int] = {}
    for t in transfers:
        summed = t.kind in ("weights", "gradient", "update", "state", "saved")  # per coarse node in a plan, per op on the graph
        key = (t.kind, "", t.src, t.dst) if summed else (t.kind, t.tensor, t.src, t.dst)
        out[key] = out.get(key, 0) + t.bytes
    return {k: b for k, b in out.items() if b}


def _held_differences(plan: Any, implied: Iterable[Any]) -> list[str]:
    """``training_state.saved_on_host``'s bytes beside each listed op's saved activations on the graph."""
    held = plan.training_state.get("saved_on_host", {}) if plan.training_state else {}
    host = plan.devices.host_device().name
    saved = {t.tensor: t.bytes for t in implied if t.kind == "saved" and t.dst == host}
    return [f"training_state.saved_on_host[{op!r}] says {nbytes:,} bytes, but {op} saves {saved.get(op, 0):,} bytes "
            f"of activations here" for op, nbytes in held.items() if saved.get(op, 0) != nbytes]


def _copy_differences(recorded: Iterable[Any], implied: Iterable[Any]) -> list[str]:
    ours, theirs = _copies(recorded), _copies(implied)
    lines = []
    for key in sorted(set(ours) | set(theirs)):
        kind, tensor, src, dst = key
        what = f"{kind} {src} -> {dst}" if not tensor else f"{kind} {tensor!r} {src} -> {dst}"
        if key not in theirs:
            lines.append(f"transfers list a copy of {what} ({ours[key]:,} bytes) that the placement does not make")
        elif key not in ours:
            lines.append(f"transfers lack the copy of {what} ({theirs[key]:,} bytes) that the placement makes")
        elif ours[key] != theirs[key]:
            lines.append(f"transfers copy {what} in {ours[key]:,} bytes, but the placement copies {theirs[key]:,}")
    return lines
