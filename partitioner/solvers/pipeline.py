"""Pipeline semantics: contiguous stages over ordered devices, micro-batches, GPipe or 1F1B.

In: a :class:`~partitioner.solvers.problem.Problem` whose options carry a :class:`PipelineSpec`,
and a :class:`~partitioner.solvers.problem.Placement`. Out: :class:`PipelineCost` (the stages,
what each costs per micro-batch, the step time and its parts) and :func:`evaluate_pipeline`, the
placement's :class:`~partitioner.solvers.problem.Evaluation` under these semantics. The ILP
(``ilp.py``, pipeline section), the dynamic program (``pipeline_dp.py``), the pipeline baselines
(``pipeline_baselines.py``), reports and tests all agree on what is written here.

Semantics (documented once, here), as ``torch.distributed.pipelining`` runs a plan:

* stages: the devices that hold at least one node, in profile order (a cluster lists ``host0``'s
  devices first, then ``host1``'s...); stage ``s`` runs its nodes for one micro-batch, then
  sends the result to stage ``s + 1``. Devices may be skipped. Every edge must go forward
  (``stage(producer) <= stage(consumer)``), otherwise the placement is not a pipeline;
* relay: stage ``s`` sends stage ``s + 1`` every tensor alive across their boundary: produced at
  stage ``<= s`` (graph inputs: at stage 0, where the data is loaded) and read at a stage
  ``> s`` (graph outputs: by the last stage, which returns them). A tensor that skips a stage is
  passed through it. Each tensor costs ``transfer_s(bytes, device_s, device_s+1)`` per micro-batch
  (the route's latency plus bytes over bandwidth per link; doubled in training for the gradient);
* times per micro-batch: a stage takes ``t_s`` = the sum of its nodes' times (forward, plus backward
  in training); the boundary after it takes ``c_s``. For ``M`` micro-batches through these
  ``2S - 1`` steps in sequence (a flow shop with identical jobs)::

      step = (M - 1) * max(t_s, c_s)  +  sum(t_s) + sum(c_s)  +  max_s optimizer_s
           = M * bottleneck + bubble + optimizer,   bubble = sum - bottleneck

  the same for GPipe and 1F1B (both have ``S - 1`` stage-times of fill and drain; Narayanan et
  al. 2021): the schedules differ in memory. Optimizer steps run after the last backward, in
  parallel on every stage;
* memory of a stage: its parameters (training: with gradients and optimizer state), its largest
  working set, and the saved activations of the micro-batches in flight: GPipe keeps all ``M``;
  1F1B keeps ``min(M, S - s)`` at stage ``s`` (torch's ``Schedule1F1B`` warm-up depth), and needs
  ``M >= S``. A parameter read by a stage other than its owner's (tied weights) is held there too;
* graph inputs start on stage 0's device (no host copy is charged).

:func:`timeline` simulates the schedule's action order (torch's ``ScheduleGPipe`` /
``Schedule1F1B``) to draw the predicted schedule; with identical stages and free links its end is
the formula's ``(M + S - 1)`` stage-times (the formula is what solvers minimise: it is linear in
the stage times; the simulation is for reading).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from cost_models.analytic import op_time
from cost_models.training import parse_optimizer
from partitioner.errors import HetpartError

if TYPE_CHECKING:
    from partitioner.solvers.problem import Evaluation, Placement, Problem

__all__ = ["Schedule", "PipelineSpec", "StageCost", "PipelineCost", "pipeline_cost", "evaluate_pipeline",
           "stage_order", "crossings", "timeline", "Action", "explain_no_fit", "forward_s", "shared_copies"]


class Schedule(str, enum.Enum):
    """A pipeline schedule of ``torch.distributed.pipelining``."""

    GPIPE = "gpipe"        # all forwards, then all backwards: keeps M micro-batches in flight
    ONE_F_ONE_B = "1f1b"   # warm-up, then one forward per backward: keeps at most S - s in flight


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """How a pipeline runs: micro-batches per step, schedule, and optionally the stage count.

    Example:
        >>> spec = PipelineSpec(8, "1f1b")
        >>> spec.schedule, spec.in_flight(0, 4), spec.in_flight(3, 4)
        (<Schedule.ONE_F_ONE_B: '1f1b'>, 4, 1)
    """

    micro_batches: int = 4                     # M: a step's batch is split into M equal micro-batches
    schedule: Schedule = Schedule.ONE_F_ONE_B  # torch.distributed.pipelining schedule
    stages: int | None = None                  # exactly this many stages; None: the solver chooses

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "schedule", Schedule(self.schedule))
        except ValueError:
            raise HetpartError(f"unknown pipeline schedule {self.schedule!r}: use "
                               f"{' or '.join(s.value for s in Schedule)}") from None
        if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise HetpartError(f"micro-batches must be a positive integer, got {self.micro_batches!r}")
        if self.stages is not None and (isinstance(self.stages, bool) or not isinstance(self.stages, int)
                                        or self.stages < 1):
            raise HetpartError(f"stages must be a positive integer, got {self.stages!r}")
        if self.schedule is Schedule.ONE_F_ONE_B and self.stages is not None and self.stages > self.micro_batches:
            raise HetpartError(f"a 1F1B pipeline of {self.stages} stages needs at least {self.stages} micro-batches, "
                               f"got {self.micro_batches}: raise --micro-batches to {self.stages}, lower --stages, "
                               f"or use --schedule gpipe")

    def in_flight(self, index: int, num_stages: int) -> int:
        """Micro-batches whose activations stage ``index`` of ``num_stages`` holds at once."""
        if self.schedule is Schedule.GPIPE:
            return self.micro_batches
        return max(1, min(self.micro_batches, num_stages - index))

    def max_stages(self, devices: int) -> int:
        """The most stages a pipeline may have on ``devices`` devices under this spec."""
        most = devices if self.schedule is Schedule.GPIPE else min(devices, self.micro_batches)
        return min(most, self.stages) if self.stages is not None else most


@dataclasses.dataclass(frozen=True)
class StageCost:
    """One stage: where it runs, what it holds and what it costs per micro-batch."""

    index: int
    device: str
    nodes: tuple[str, ...]
    forward_s: float          # forward time of one micro-batch
    compute_s: float          # forward (+ backward in training) of one micro-batch: t_s
    send_s: float             # the boundary to the next stage, one micro-batch: c_s (0 for the last)
    sends: tuple[str, ...]    # tensors sent to the next stage
    send_bytes: int
    optimizer_s: float        # the optimizer step over this stage's parameters (training)
    in_flight: int            # micro-batches whose activations it holds at once
    memory: int               # bytes: parameters (+grads, optimizer state), working set, in-flight activations
    params_bytes: int         # of which parameters (with gradients and optimizer state in training)
    activation_bytes: int     # of which saved activations of the micro-batches in flight


@dataclasses.dataclass(frozen=True)
class PipelineCost:
    """A placement read as a pipeline: its stages and the step time's parts (see the docstring)."""

    spec: PipelineSpec
    stages: tuple[StageCost, ...]
    step_s: float             # (M - 1) * bottleneck + sum of stage and boundary times + optimizer
    bottleneck_s: float       # the slowest stage or boundary, per micro-batch
    bubble_s: float           # fill and drain: sum of stage and boundary times - bottleneck
    optimizer_s: float        # the slowest stage's optimizer step
    violations: tuple[str, ...]


def stage_order(problem: Problem, placement: Placement) -> tuple[str, ...]:
    """The stages' devices: the devices holding a node, in profile order."""
    used = set(placement.device.values())
    return tuple(d for d in problem.device_names if d in used)


def crossings(problem: Problem, stage_of: Mapping[str, int], num_stages: int) -> list[list[tuple[str, int]]]:
    """For each boundary ``b`` (between stage ``b`` and ``b + 1``): the ``(tensor, bytes)`` relayed.

    Example:
        >>> crossings(problem, {"a": 0, "b": 1}, 2)        # doctest: +SKIP
        [[('a', 4096)]]
    """
    graph = problem.graph
    outputs = set(graph.outputs)
    out: list[list[tuple[str, int]]] = [[] for _ in range(max(num_stages - 1, 0))]
    for t in graph.tensors.values():
        if t.nbytes <= 0:
            continue
        first = stage_of[t.producer] if t.producer is not None else 0
        readers = [stage_of[c] for c in t.consumers if c in stage_of]
        if t.name in outputs:
            readers.append(num_stages - 1)
        last = max(readers, default=first)
        for b in range(first, last):
            out[b].append((t.name, t.nbytes))
    return out


def pipeline_cost(problem: Problem, placement: Placement) -> PipelineCost:
    """The placement as a pipeline under ``problem.options.pipeline`` (see the module docstring).

    Example:
        >>> cost = pipeline_cost(problem, placement)      # doctest: +SKIP
        >>> [s.device for s in cost.stages], cost.step_s
    """
    spec: PipelineSpec = problem.options.pipeline
    p, x = problem, placement.device
    devices = stage_order(p, placement)
    index = {d: i for i, d in enumerate(devices)}
    stage_of = {n: index[x[n]] for n in p.nodes}
    S = len(devices)
    violations = [f"op {n} placed on {x[n]}, which {'is pinned elsewhere' if n in p.pins else 'cannot run it'} "
                  f"(allowed: {', '.join(p.allowed[n])})" for n in p.nodes if x[n] not in p.allowed[n]]
    for t in p.tensors:
        if t.producer is None:
            continue
        for c in t.consumers:
            if stage_of[c] < stage_of[t.producer]:
                violations.append(f"edge {t.producer} -> {c} goes back from stage {stage_of[t.producer]} "
                                  f"({x[t.producer]}) to stage {stage_of[c]} ({x[c]}): stages must be contiguous")
    if spec.schedule is Schedule.ONE_F_ONE_B and S > spec.micro_batches:
        violations.append(f"1F1B needs at least as many micro-batches as stages: {S} stages, "
                          f"{spec.micro_batches} micro-batches (raise --micro-batches or use --schedule gpipe)")
    if spec.stages is not None and S != spec.stages:
        violations.append(f"the placement has {S} stages, {spec.stages} were asked for")
    relay = crossings(p, stage_of, S)
    nodes_of: list[list[str]] = [[] for _ in devices]
    for n in p.nodes:
        nodes_of[stage_of[n]].append(n)
    copies = shared_copies(p, placement)
    stages = []
    for s, d in enumerate(devices):
        nodes = tuple(nodes_of[s])
        nxt = devices[s + 1] if s + 1 < S else None
        sends = relay[s] if nxt is not None else []
        params = sum(p.param_mem[n] for n in nodes) + copies.get(d, 0)
        in_flight = spec.in_flight(s, S)
        activations = in_flight * sum(p.saved[n] for n in nodes)
        work = max((p.work_mem[n] for n in nodes), default=0)
        stage = StageCost(
            index=s, device=d, nodes=nodes,
            forward_s=sum(forward_s(p, n, d) for n in nodes),
            compute_s=sum(p.compute[n].get(d, float("inf")) for n in nodes),
            send_s=sum(p.transfer_s(nbytes, d, nxt) for _, nbytes in sends) if nxt else 0.0,
            sends=tuple(t for t, _ in sends), send_bytes=sum(b for _, b in sends),
            optimizer_s=sum(p.opt_step[n][d] for n in nodes),
            in_flight=in_flight, memory=params + work + activations, params_bytes=params,
            activation_bytes=activations,
        )
        if stage.memory > p.capacity[d]:
            violations.append(
                f"stage {s} on {d} needs {stage.memory:,} bytes (parameters {params:,}, activations of "
                f"{in_flight} micro-batches in flight {activations:,}, working set {work:,}), over its "
                f"capacity of {p.capacity[d]:,}")
        stages.append(stage)
    times = [s.compute_s for s in stages] + [s.send_s for s in stages[:-1]]
    bottleneck = max(times, default=0.0)
    optimizer = max((s.optimizer_s for s in stages), default=0.0)
    step = (spec.micro_batches - 1) * bottleneck + sum(times) + optimizer
    return PipelineCost(spec, tuple(stages), step, bottleneck, sum(times) - bottleneck, optimizer, tuple(violations))


def forward_s(problem: Problem, node: str, device: str) -> float:
    """Forward time of ``node`` on ``device`` (``problem.compute`` holds forward + backward in training)."""
    if not problem.options.training:
        return problem.compute[node].get(device, float("inf"))
    dev = problem.devices.device(device)
    return sum(op_time(problem.original.ops[m], dev).seconds for m in problem.members[node])


def shared_copies(problem: Problem, placement: Placement) -> dict[str, int]:
    """Bytes of shared parameters (tied weights) each device holds beyond its own: one copy per
    device that reads a parameter owned elsewhere (training: with gradient and optimizer state)."""
    x = placement.device
    factor = 2 + parse_optimizer(problem.options.optimizer).state_copies if problem.options.training else 1
    out: dict[str, int] = {}
    for sp in problem.shared:
        for d in dict.fromkeys(x[u] for u in sp.users):
            if d != x[sp.owner]:
                out[d] = out.get(d, 0) + factor * sp.bytes
    return out


def evaluate_pipeline(problem: Problem, placement: Placement) -> Evaluation:
    """The placement's Evaluation under the pipeline semantics (``total_s`` = the step time).

    ``per_device_s`` is each device's busy time per step (M micro-batches and its optimizer step),
    ``per_link_s`` each link's, ``transfers`` the relayed tensors (seconds per micro-batch).
    """
    from partitioner.solvers.problem import Evaluation, Transfer

    p = problem
    cost = pipeline_cost(p, placement)
    M = cost.spec.micro_batches
    busy = {d: 0.0 for d in p.device_names}
    memory = {d: 0 for d in p.device_names}
    links = {label: 0.0 for label in p.link_labels}
    transfers = []
    factor = 2 if p.options.training else 1
    sizes = {t.name: t.nbytes for t in p.graph.tensors.values()}
    for s, stage in enumerate(cost.stages):
        busy[stage.device] = M * stage.compute_s + stage.optimizer_s
        memory[stage.device] = stage.memory
        if s + 1 < len(cost.stages):
            dst = cost.stages[s + 1].device
            for t in stage.sends:
                transfers.append(Transfer(t, stage.device, dst, sizes[t], p.transfer_s(sizes[t], stage.device, dst)))
                for label in p.hops(stage.device, dst):
                    links[label] += M * factor * p.hop_s(sizes[t], stage.device, dst, label)
    return Evaluation(
        objective=p.options.objective, total_s=cost.step_s, critical_path_s=cost.step_s,
        per_device_s=MappingProxyType(busy), per_link_s=MappingProxyType(links),
        memory=MappingProxyType(memory), capacity=MappingProxyType(dict(p.capacity)),
        transfers=tuple(transfers), violations=cost.violations,
    )


# --------------------------------------------------------------------------------------------
# The predicted schedule
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Action:
    """One stage working on one micro-batch: ``kind`` is ``"F"`` (forward), ``"B"`` (backward) or
    ``"O"`` (the optimizer step after the last backward; ``micro_batch`` -1)."""

    stage: int
    micro_batch: int
    kind: str
    start: float
    end: float


def timeline(cost: PipelineCost, training: bool) -> tuple[Action, ...]:
    """Simulate the schedule: every stage issues its actions in torch's order (GPipe: all F then
    all B; 1F1B: ``min(M, S - s)`` F, then B and F alternating, then the remaining B), each as soon
    as the stage is free and its input has arrived (boundary times as in :func:`pipeline_cost`),
    then (training) its optimizer step. With identical stages its end is the formula's
    :attr:`PipelineCost.step_s`; with unlike stages the exact action order can add or remove a few
    percent (1F1B's alternation waits on the slowest neighbour), which the report shows beside it.

    Example:
        >>> acts = timeline(pipeline_cost(problem, placement), training=True)   # doctest: +SKIP
        >>> max(a.end for a in acts)
    """
    stages, M = cost.stages, cost.spec.micro_batches
    S = len(stages)
    order = [_actions(cost.spec.schedule, s, S, M, training) for s in range(S)]
    fwd = [st.forward_s for st in stages]
    bwd = [st.compute_s - st.forward_s for st in stages]
    link = [st.send_s / (2 if training else 1) for st in stages]  # one direction
    done: dict[tuple[int, int, str], float] = {}
    free = [0.0] * S
    pos = [0] * S
    out: list[Action] = []
    while any(pos[s] < len(order[s]) for s in range(S)):
        progressed = False
        for s in range(S):
            while pos[s] < len(order[s]):
                kind, mb = order[s][pos[s]]
                ready = _ready(kind, s, mb, S, done, link)
                if ready is None:
                    break
                start = max(free[s], ready)
                end = start + (fwd[s] if kind == "F" else bwd[s])
                done[(s, mb, kind)] = end
                free[s] = end
                out.append(Action(s, mb, kind, start, end))
                pos[s] += 1
                progressed = True
        if not progressed:
            raise HetpartError("the pipeline schedule deadlocks (a bug in the simulated action order)")
    if training:  # each stage steps its optimizer after its last backward
        out += [Action(s, -1, "O", free[s], free[s] + st.optimizer_s) for s, st in enumerate(stages) if st.optimizer_s]
    return tuple(sorted(out, key=lambda a: (a.start, a.stage)))


def _actions(schedule: Schedule, s: int, S: int, M: int, training: bool) -> list[tuple[str, int]]:
    if not training:
        return [("F", i) for i in range(M)]
    if schedule is Schedule.GPIPE:
        return [("F", i) for i in range(M)] + [("B", i) for i in range(M)]
    warmup = min(M, S - s)
    out = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while b < M:
        out.append(("B", b))
        b += 1
        if f < M:
            out.append(("F", f))
            f += 1
    return out


def _ready(kind: str, s: int, mb: int, S: int, done: Mapping[tuple[int, int, str], float],
           link: list[float]) -> float | None:
    """When the input of action (kind, s, mb) is there, or None if its producer has not run."""
    if kind == "F":
        if s == 0:
            return 0.0
        prev = done.get((s - 1, mb, "F"))
        return None if prev is None else prev + link[s - 1]
    own = done.get((s, mb, "F"))
    if own is None:
        return None
    if s == S - 1:
        return own
    nxt = done.get((s + 1, mb, "B"))
    return None if nxt is None else max(own, nxt + link[s])


def explain_no_fit(problem: Problem) -> str:
    """Why no pipeline fits, in the user's words: an op larger than every device that can run it,
    or more bytes than all devices hold, counting the fewest micro-batches the schedule keeps."""
    p, spec = problem, problem.options.pipeline
    least = 1 if spec.schedule is Schedule.ONE_F_ONE_B else spec.micro_batches
    lines = []
    for n in p.nodes:
        need = p.param_mem[n] + p.work_mem[n] + least * p.saved[n]
        room = max(p.capacity[d] for d in p.allowed[n])
        if need > room:
            lines.append(f"op {n} needs {need:,} bytes (parameters {p.param_mem[n]:,}, working set {p.work_mem[n]:,}, "
                         f"activations of {least} micro-batch(es) {least * p.saved[n]:,}) but the largest device "
                         f"that can run it holds {room:,} ({', '.join(p.allowed[n])})")
            break
    total = sum(p.param_mem.values()) + least * sum(p.saved.values())
    if total > sum(p.capacity.values()):
        lines.append(f"the model needs at least {total:,} bytes in all but the devices hold {sum(p.capacity.values()):,}")
    if not lines:
        tightest = min(p.device_names, key=p.capacity.__getitem__)
        lines.append(f"every split into contiguous stages has a stage over its device's memory (the smallest is "
                     f"{tightest} with {p.capacity[tightest]:,} bytes)")
    return ("no pipeline stages fit: " + "; ".join(lines) + ". To fix: raise the caps (--memory), add hosts, train "
            "with --schedule 1f1b (fewer micro-batches in flight) or split the batch into more --micro-batches")
