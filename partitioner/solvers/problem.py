"""The placement problem every solver solves, and the one evaluation every placement gets.

In: an OpGraph (possibly coarsened), a DeviceSet with caps applied, pins and options. Out: a
:class:`Problem` holding every cost a solver needs as plain numbers (per-node time on each
allowed device, transfer times per device pair, memory per node), and :func:`evaluate`, which
turns a :class:`Placement` into predicted time, per-device and per-link load, memory per device
and transfers. The ILP's objective is this evaluation written as linear constraints; the
baselines are costed by calling it; tests compare the two.

Semantics (documented once, here):

* a node runs on one device; its time there is the sum of its member ops' times (forward, or
  forward + backward in training);
* graph inputs start on the host CPU; a tensor read on another device than where it was
  produced crosses the route between them once per destination, whatever the number of
  consumers there (training: the gradient crosses back, doubling the time);
* weights: a node's own parameters live where it computes, unless they are *streamed*: kept in
  host memory and copied in every step. ``StreamMode.PREFETCH`` (pinned memory, a copy stream,
  double-buffered) loads the link in parallel with compute and holds two buffers of the largest
  streamed node on the device, and adds each copy's issue latency (the route's latency: the
  copy launch and the event the compute waits on; measured 1.04x all-GPU with 36 prefetched
  ops) to the node; ``StreamMode.SYNC`` (accelerate's offload: pageable memory,
  synchronous, no prefetch) adds the copy to the critical path and holds one buffer. In
  inference a streamed node may compute in any choice it has on its device, and its weights are
  held on the host and cross the link in that choice's form (cast or packed once, when loaded): a
  packed linear streams its packed values and scales, and its device holds a buffer of that size
  (``Problem.stream_forms``); in training they stream as float32 master weights;
* a parameter shared by several nodes (tied weights) is resident with its owner; another user
  on a device where it is not resident copies it in every step, synchronously, costed from the
  slowest source (it adds to the critical path and to the destination's busy time);
* training state (:mod:`partitioner.solvers.train_state`): a trainable node's optimizer state lives
  with its weights (``resident``), or on the host while the weights stay on the computing device
  (``Placement.state``: the gradient crosses to the host as backward produces it, the host steps,
  the updated weights cross back), or on the host and streamed to the computing device for its
  step and back (``Placement.streamed_state``), or the weights themselves live on the host and are streamed in
  both passes; a gather's table may update row-sparse (``Problem.sparse_ops``); a node may
  recompute its activations in backward (``Placement.recompute``) or hold them in host memory
  (``Placement.saved_on_host``: copied out in forward and back in backward, beside compute). With
  ``latency``, host steps run beside backward, each once its gradient is complete (see that module);
* objectives: ``latency`` = max(sum of compute and critical-path copies, busiest link);
  ``throughput`` = max(busiest device, busiest link); ``makespan`` = list schedule of the nodes
  in the placement's order (devices run concurrently, a node starts when its device is free and
  its inputs have arrived), at least the busiest link; training adds each device's optimizer step;
* pipeline stages (``Options.pipeline``): contiguous stages, relayed tensors, micro-batches and a
  schedule's bubble, in :mod:`partitioner.solvers.pipeline`; ``evaluate`` hands such problems there;
* memory on a device = parameters resident there (training: with gradients and optimizer state)
  + stream buffers (weights; training: one of the largest streamed optimizer state, one of the largest
  saved activation copied to or from the host) + activations (inference: the largest node's working
  set; training: saved activations of its nodes, except those held on the host, plus that working set);
* precision (``Options.precision``, :mod:`cost_models.precision`): a node computes its flexible
  member ops in one dtype of ``choices[node][device]`` (``Placement.precision``; default the first,
  float32 where the device runs it), at ``compute_in`` (the cost model's ``op_time_in``); in 16 bits
  its float32 activations take half the bytes (copies, working set, saved activations) and, in
  inference, so do its resident weights (training keeps float32 master weights, gradients and
  optimizer state); in training a node whose weights are streamed computes in float32. Where a float32 tensor
  reaches a reader in another dtype, the reader's device casts it (``cast_s``; once per tensor and
  reading op, so a coarse node costs what its members do on the original graph), and a 16-bit
  graph output is cast back to float32 where it is produced;
* splits (``Options.splits``, :mod:`partitioner.solvers.splits`): a linear may be split over two
  or more devices (``Placement.split``; its node's device is the split's home, where its input
  arrives and its output is rejoined): each shard's compute on its device, each shard's weight in
  its device's memory, the input copied to each other device and its shard's output copied back
  (``"split"`` transfers, on the links in every objective); with ``latency`` the op adds its path
  (:func:`~partitioner.solvers.splits.split_path_s`; two devices: ``copy in + max(home shard,
  other shard + copy out)``), with ``throughput`` each device its shard.
  A time split (axis ``time``, :mod:`partitioner.solvers.chunked_streaming`) computes the linear on
  an accelerator from chunks of its weight held on the host and streamed in one after another: its
  pipelined time on the accelerator, the weight in host memory, its chunk buffers in the working set,
  one ``"split"`` transfer of the weight's bytes (each chunk's copy on the link). A fused experts op
  (a grouped matmul, in one node with the view owning its weight) takes time splits by expert alike
  (:mod:`partitioner.solvers.expert_streaming`): its chunks are groups of whole experts; with axis
  ``experts`` its experts may be divided between two devices (:mod:`partitioner.solvers.expert_devices`).
  An embedding split by table rows or an elementwise op or norm split by batch
  (:mod:`partitioner.solvers.split_axes`) is priced and placed the same way: its home copies the
  indices or the rows out, and the partial outputs or output rows come back.
  Column splits feeding a row split through elementwise ops, all over the same devices and
  fractions with those ops on the home, form a *region* (:mod:`partitioner.solvers.split_regions`):
  the columns' outputs are never rejoined, each device runs the ops between on its shard, and the
  columns' copies back and the row's copies out are not made (``region_effect``).
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import functools
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

from cost_models.costs import ANALYTIC, CostModel
from cost_models.precision import (
    FLOAT32, Precision, activations, compose, itemsize_factor, op_precision, packed_weight_bytes, quantizable_weight,
    weight_shape_problem, weights,
)
from cost_models.profiles import DeviceKind, DeviceSet
from cost_models.training import (
    Optimizer,
    parameter_memory,
    parse_optimizer,
    saved_activation_bytes,
)
from partitioner.errors import HetpartError, UnsupportedOp
from partitioner.solvers.packing_error import budget_violation
from partitioner.ir import OpGraph
from partitioner.solvers.pipeline import PipelineSpec, evaluate_pipeline
from partitioner.solvers.chunked_streaming import AXIS as TIME_AXIS
from partitioner.solvers.chunked_streaming import TimeSplit, price_time_split, time_split_choices
from partitioner.solvers.expert_devices import AXIS as EXPERTS_AXIS
from partitioner.solvers.expert_devices import expert_device_choices, price_expert_devices
from partitioner.solvers.expert_streaming import expert_split_choices, price_expert_split
from partitioner.solvers.split_offers import price_offered, split_choices, splits_it_takes
from partitioner.solvers.split_regions import RegionOffer, offer_regions, region_effect
from partitioner.solvers.splits import Split, SplitOptions, SplitPrice, split_op
from partitioner.solvers.train_state import (
    cost_training_state, grad_hop_s, grad_s, gradient_leaves, offloaded, saved_buffer_bytes, saved_hop_s, saved_issue_s,
    saved_s, state_buffer_bytes, state_s, step_schedule, update_hop_s, update_s,
)


class Objective(str, enum.Enum):
    """What a placement minimises."""

    LATENCY = "latency"        # one sample, ops one after another (eager execution)
    THROUGHPUT = "throughput"  # pipelined micro-batches: the slowest device or link sets the pace
    MAKESPAN = "makespan"      # one sample, devices run concurrently (asynchronous GPU work)


class StreamMode(str, enum.Enum):
    """How streamed weights reach the computing device."""

    PREFETCH = "prefetch"  # pinned host memory, copy stream, double-buffered: overlaps compute
    SYNC = "sync"          # pageable memory, synchronous copy before each use (accelerate's offload)


@dataclasses.dataclass(frozen=True)
class Options:
    """How to place: objective, mode, and the limits beyond device memory."""

    objective: Objective = Objective.LATENCY
    training: bool = False                     # cost a training step (forward + backward + optimizer)
    optimizer: Optimizer = Optimizer.ADAM      # optimizer whose state and step are costed in training
    streaming: bool = True                     # may weights be streamed from host memory (inference only)
    link_budget: Mapping[str, int] = dataclasses.field(default_factory=dict)  # link label -> max bytes per step
    contiguous_stages: bool = False            # devices form a pipeline: no edge goes back to an earlier stage
    pipeline: PipelineSpec | None = None       # plan pipeline stages (solvers/pipeline.py semantics) instead
    precision: Precision | None = None         # dtypes per device (cost_models/precision.py); None: as traced
    offload: bool = True                       # training: may optimizer state live on the host, away from its weights
    stream_state: bool = True                  # training (with offload): may host-held state be streamed to the
                                               # computing accelerator for its step (and back)
    recompute: bool = True                     # training: may a node recompute its activations in backward
    save_on_host: bool = True                  # training: may a node hold its saved activations in host memory
    delayed_update: bool = False               # training: the host step of iteration t runs beside t+1 (opted in)
    sparse_updates: bool = True                # training: may gathers' tables update row-sparse (where allowed)
    placed_optimizer: bool = True              # training: hetpart's placed optimizer runs the step (state may
                                               # leave its weights, host steps beside backward); False: each
                                               # step after backward where its weights live
    splits: SplitOptions | None = None         # inference: may an op be split over devices (None: never)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where every node runs, where streamed weights live, and in which order nodes are issued.

    ``device`` maps every node to its computing device. ``streamed`` maps the nodes whose own
    parameters are streamed to the device holding them (the host CPU). ``order`` is the issue
    order (a topological order) used by the makespan schedule; empty means topological order.
    """

    device: Mapping[str, str]
    streamed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stream_mode: StreamMode = StreamMode.PREFETCH
    order: tuple[str, ...] = ()
    precision: Mapping[str, str] = dataclasses.field(default_factory=dict)  # node -> dtype (absent: the default)
    state: Mapping[str, str] = dataclasses.field(default_factory=dict)  # training: node -> host holding its
                                                                        # optimizer state away from its weights
    recompute: frozenset[str] = frozenset()    # training: nodes recomputing their activations in backward
    overlap: bool = True                       # training: host steps start as gradients arrive (False: after backward)
    streamed_state: frozenset[str] = frozenset()  # training: nodes whose optimizer state lives on the host and
                                                  # is streamed to their computing device for its step and back
    split: Mapping[str, Split | TimeSplit] = dataclasses.field(default_factory=dict)  # node -> its split (device[node]
                                                                                     # is its home)
    saved_on_host: frozenset[str] = frozenset()   # training: nodes whose saved activations the host holds (copied
                                                  # out in forward, back in backward)

    def residence(self, node: str) -> str:
        """The device holding ``node``'s own parameters."""
        return self.streamed.get(node, self.device[node])

    def state_device(self, node: str) -> str:
        """The device running ``node``'s optimizer step (and holding its state, unless streamed)."""
        return self.state.get(node, self.residence(node))

    def state_home(self, node: str, host: str) -> str:
        """The device holding ``node``'s optimizer state between steps: the host ``host`` for a
        streamed state, else where its step runs."""
        return host if node in self.streamed_state else self.state_device(node)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One copy per step: a tensor (``kind="activation"``), a node's streamed weights
    (``"weights"``) or a shared parameter read away from its owner (``"param"``)."""

    tensor: str
    src: str
    dst: str
    bytes: int
    seconds: float
    kind: str = "activation"


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A placement's predicted cost and whether it fits."""

    objective: Objective
    total_s: float
    critical_path_s: float                 # the sequential sum (latency) or the schedule's end (makespan)
    per_device_s: Mapping[str, float]      # busy time of each device (compute + optimizer step)
    per_link_s: Mapping[str, float]        # busy time of each link (label -> seconds)
    memory: Mapping[str, int]              # bytes used on each device
    capacity: Mapping[str, int]
    transfers: tuple[Transfer, ...]
    violations: tuple[str, ...]            # memory over capacity, unsupported devices, pins broken
    schedule: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # makespan: start, end

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclasses.dataclass(frozen=True)
class CrossTensor:
    """A tensor as the problem sees it: producer node (``None`` = graph input on the host)."""

    name: str
    producer: str | None
    consumers: tuple[str, ...]
    bytes: int
    float32: bool = False            # a float32 tensor as traced (precision may hold it in 16 bits)
    follows: bool = False            # held in its producer node's dtype (the producing op is flexible)
    reads: tuple[tuple[int, int], ...] = ()  # per consumer: (member ops reading it in the node's dtype, in float32)


@dataclasses.dataclass(frozen=True)
class SharedParam:
    """A parameter read by nodes other than its owner."""

    name: str
    owner: str
    users: tuple[str, ...]
    bytes: int


class Problem:
    """A graph, devices and options, reduced to the numbers solvers need.

    Example:
        >>> problem = Problem(graph, load_profile("h200-host").with_memory({"cuda:0": "2GB"}))
        >>> problem.compute["linear"]["cuda:0"]      # doctest: +SKIP
        2.7e-05
    """

    def __init__(
        self,
        graph: OpGraph,
        devices: DeviceSet,
        options: Options = Options(),
        *,
        pins: Mapping[str, str] | None = None,
        members: Mapping[str, Sequence[str]] | None = None,
        original: OpGraph | None = None,
        costs: CostModel | None = None,
        state_writers: Collection[str] = (),
    ) -> None:
        self.graph = graph
        self.costs = costs or ANALYTIC  # op, copy and optimizer-step times (cost_models.costs)
        self.original = original or graph
        self.devices = devices
        self.options = dataclasses.replace(options, optimizer=parse_optimizer(options.optimizer))
        self.members: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {n: tuple(members[n]) if members else (n,) for n in graph.ops}
        )
        self.host = devices.host_device().name
        self.nodes: tuple[str, ...] = tuple(op.name for op in graph.topological_order())
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.device_names = devices.names()
        self.capacity = {d.name: d.memory for d in devices.devices}
        self.precision = self.options.precision
        self.pins = self._resolve_pins(pins or {})
        self.allowed = self._allowed()
        self._cost_nodes()
        self.tensors = self._cross_tensors()
        self.shared = self._shared_params()
        cost_training_state(self)
        self._offer_splits()
        self.link_labels = tuple(link.label for link in devices.links)
        # ops that write their own state (a KV cache): their buffers live where they are written, never streamed
        writers = frozenset(state_writers)
        self.state_writers = frozenset(n for n in self.nodes if writers.intersection(self.members[n]))
        self.streamable = tuple(
            n for n in self.nodes
            if self.options.streaming and self.param_bytes[n] > 0 and (not self.options.training or self.train_state)
            and n not in self.state_writers
        )

    # -- construction -------------------------------------------------------------------------

    def _offer_splits(self) -> None:
        """``split_choices[node]``: the splits each node may take, and ``split_price[(node, split)]``."""
        self.split_choices: dict[str, tuple[Split | TimeSplit, ...]] = {}
        self.split_price: dict[tuple[str, Split | TimeSplit], SplitPrice] = {}
        self.region_offer = RegionOffer()  # column splits into a row split, nothing rejoined between
        self._region_linears: frozenset[str] = frozenset()
        opts = self.options.splits
        if opts is None:
            return
        o = self.options
        refused = [why for why, on in (
            ("training=True (a training step's splits are not priced yet)", o.training),
            ("precision (16-bit or packed shards are not priced yet)", o.precision is not None),
            ("pipeline stages", o.pipeline is not None),
            ("objective 'makespan' (its schedule has no shards)", o.objective is Objective.MAKESPAN)) if on]
        if refused:
            raise HetpartError(f"splits are planned for inference with the latency or throughput objective, but "
                               f"the request has {refused[0]}; drop splits (CLI: --split), or plan without it")
        timed = TIME_AXIS in opts.axes
        if timed and not o.streaming:
            raise HetpartError("time splits stream a linear's weight chunks from host memory, but the request has "
                               "streaming=False (--no-streaming); allow streaming, or drop 'time' from the split axes")
        for n in self.nodes:
            choices = split_choices(self, n, opts)
            in_time = time_split_choices(self, n, opts.chunks) if timed else ()
            by_expert = expert_split_choices(self, n, opts.chunks) if timed else ()
            across = expert_device_choices(self, n, opts) if EXPERTS_AXIS in opts.axes else ()
            for sp in choices:
                self.split_price[(n, sp)] = price_offered(self, n, sp)
            for sp in across:
                self.split_price[(n, sp)] = price_expert_devices(self, n, sp)
            for sp in in_time:
                self.split_price[(n, sp)] = price_time_split(self, n, sp)
            for sp in by_expert:
                self.split_price[(n, sp)] = price_expert_split(self, n, sp)
            choices += across
            in_time += by_expert
            if choices or in_time:
                self.split_choices[n] = choices + in_time
        self.region_offer = offer_regions(self)
        self._region_linears = self.region_offer.linears()

    def split_cost(self, node: str, split: Split) -> float:
        """What ``split`` of ``node`` adds to the objective: its latency with ``latency``, its longest
        shard with ``throughput``."""
        price = self.split_price[(node, split)]
        return price.latency_s if self.options.objective is Objective.LATENCY else price.critical_s

    def split_floor(self, node: str, split: Split) -> float:
        """The least ``split`` of ``node`` can add to the objective (bounds, cutoffs): :meth:`split_cost`,
        or with ``latency`` for a col or the row of a region candidate its shortest shard, the least a
        region's longest branch charges it (:mod:`partitioner.solvers.split_regions`)."""
        price = self.split_price[(node, split)]
        if self.options.objective is Objective.LATENCY and node in self._region_linears:
            return min(price.shard_s)
        return self.split_cost(node, split)

    def split_fits(self, node: str, split: Split) -> bool:
        """Whether ``split`` of ``node`` alone fits on each of its devices."""
        price = self.split_price[(node, split)]
        return all(price.param_bytes[i] + price.work_bytes[i] <= self.capacity[d]
                   for i, d in enumerate(split.devices))

    def _resolve_pins(self, pins: Mapping[str, str]) -> dict[str, str]:
        """Pins map op names or globs over op names / module paths to a device; resolved per node."""
        resolved: dict[str, str] = {}
        by: dict[str, str] = {}  # node -> the pattern that pinned it first
        for pattern, device in pins.items():
            if device not in self.device_names:
                raise HetpartError(
                    f"pin {pattern!r} -> {device!r}: no such device; the profile has {', '.join(self.device_names)}"
                )
            matched = False
            for node in self.nodes:
                ops = [self.original.ops[m] for m in self.members[node]]
                if any(
                    op.name == pattern or fnmatch.fnmatchcase(op.name, pattern)
                    or (op.module_path and fnmatch.fnmatchcase(op.module_path, pattern))
                    for op in ops
                ):
                    if resolved.get(node, device) != device:
                        raise HetpartError(
                            f"pins {by[node]!r}={resolved[node]} and {pattern!r}={device} both match "
                            f"{self._pinned_what(node)}, which must run on one device; drop or narrow one pin")
                    resolved[node] = device
                    by.setdefault(node, pattern)
                    matched = True
            if not matched:
                raise HetpartError(
                    f"pin {pattern!r} matches no op name or module path of {self.graph.name!r}; "
                    f"module paths look like {', '.join(sorted({o.module_path for o in self.original.ops.values() if o.module_path})[:3])}"
                )
        return resolved

    def _pinned_what(self, node: str) -> str:
        """``op 'linear_3'``, or the module a group of ops kept together comes from."""
        members = self.members[node]
        if len(members) == 1:
            return f"op {members[0]!r}"
        paths = [self.original.ops[m].module_path.split(".") for m in members if self.original.ops[m].module_path]
        common: list[str] = []
        for atoms in zip(*paths):
            if len(set(atoms)) > 1:
                break
            common.append(atoms[0])
        where = f"module {'.'.join(common)!r}" if common and len(paths) == len(members) else "one group"
        return f"{where} ({len(members)} ops kept together, e.g. {members[0]!r})"

    def _allowed(self) -> dict[str, tuple[str, ...]]:
        allowed: dict[str, tuple[str, ...]] = {}
        for node in self.nodes:
            ops = [self.original.ops[m] for m in self.members[node]]
            ok = tuple(
                d.name for d in self.devices.devices
                if all(d.supports(op.kind, op.op_class.value) and self.costs.unsupported(op, d) is None
                       for op in ops)
            )
            if self.precision is not None and ok:
                kinds = self.precision_kinds(node)
                ok = tuple(d for d in ok if self.precision.choices(kinds, d))
                if not ok:
                    raise UnsupportedOp(
                        f"op {node!r} ({ops[0].kind}) must compute in float32 (cost_models/precision.py) but "
                        f"no device that supports it runs float32; add one, or give it a device without a "
                        f"dtypes limit in the profile")
            if not ok:
                measured = [f"{d.name}: {why}" for d in self.devices.devices for op in ops
                            if (why := self.costs.unsupported(op, d)) is not None]
                raise UnsupportedOp(
                    f"op {node!r} ({ops[0].kind}) is supported by no device of profile {self.devices.name!r}"
                    + (f" (failed when measured: {'; '.join(measured)})" if measured else "")
                    + f"; add a device that runs {ops[0].op_class.value} ops"
                )
            pinned = self.pins.get(node)
            if pinned is not None:
                if pinned not in ok:
                    raise UnsupportedOp(
                        f"op {node!r} ({ops[0].kind}, {ops[0].op_class.value}) is pinned to {pinned}, "
                        f"which cannot run it; devices that can: {', '.join(ok)}"
                    )
                ok = (pinned,)
            allowed[node] = ok
        return allowed

    def precision_kinds(self, node: str) -> set[str]:
        """The precision classes (``fixed``, ``flexible``, ``native``) of ``node``'s member ops."""
        return {self.op_kind[m] for m in self.members[node]}

    @functools.cached_property
    def op_kind(self) -> dict[str, str]:
        """Each original op's precision class (cost_models.precision.op_precision)."""
        g = self.original
        return {name: op_precision(op, g.tensors, g.params) for name, op in g.ops.items()}

    @functools.cached_property
    def quantizable(self) -> dict[str, str]:
        """Original ops whose weight may be packed (``precision`` with ``weights``): op -> weight parameter.

        A linear whose own 2-D float32 weight no other op reads, not matched by ``keep``
        (:func:`~cost_models.precision.quantizable_weight`)."""
        if self.precision is None or not self.precision.packs:
            return {}
        g, keep = self.original, self.precision.keep
        out = {}
        for name, op in g.ops.items():
            param = quantizable_weight(op, g.params)
            if param is None or any(fnmatch.fnmatchcase(name, k) or op.module_path and (
                    fnmatch.fnmatchcase(op.module_path, k) or fnmatch.fnmatchcase(op.module_path, k + ".*"))
                    for k in keep):
                continue
            out[name] = param
        return out

    @functools.cached_property
    def error_squares(self) -> dict[str, dict[str, float]]:
        """Per node and packed choice, its members' squared measured errors (a budget's terms:
        :mod:`partitioner.solvers.packing_error`); empty without ``precision.max_error``."""
        from partitioner.solvers.packing_error import error_squares

        return error_squares(self)

    def op_dtype(self, op: str, dtype: str) -> str:
        """The choice member op ``op`` computes in when its node computes in ``dtype``: the node's
        activation dtype where the op is flexible (else float32), with the node's packed weight
        dtype where the op's weight may be packed."""
        act = activations(dtype)
        act = act if act != FLOAT32 and self.op_kind[op] == "flexible" else FLOAT32
        w = weights(dtype)
        return compose(act, w) if w and self.packable(op, w) else act

    def packable(self, op: str, weight: str) -> bool:
        """Whether original op ``op`` may hold its weight packed in ``weight`` (its shape allows it)."""
        if op not in self.quantizable:
            return False
        return weight_shape_problem(self.original.params[self.quantizable[op]].shape, weight) is None

    def op_param_bytes(self, op, choice: str) -> int:  # noqa: ANN001
        """Bytes of ``op``'s own parameters held for inference in member choice ``choice`` (packed
        weight and scales, the rest in the activation dtype)."""
        w = weights(choice)
        if w is None:
            return int(op.param_bytes * itemsize_factor(choice)) if choice != FLOAT32 else op.param_bytes
        param = self.original.params[self.quantizable[op.name]]
        rest = op.param_bytes - param.nbytes
        return packed_weight_bytes(param.shape[0], param.shape[1], w) + int(rest * itemsize_factor(choice))

    def _cost_nodes(self) -> None:
        training, opt = self.options.training, self.options.optimizer
        cost = self.costs.training_op_time if training else self.costs.op_time
        self.choices: dict[str, dict[str, tuple[str, ...]]] = {}
        self.compute_in: dict[str, dict[str, dict[str, float]]] = {}
        self.param_mem_at: dict[str, dict[str, int]] = {}
        self.work_mem_at: dict[str, dict[str, int]] = {}
        self.saved_at: dict[str, dict[str, int]] = {}
        self.saved_parts_at: dict[str, dict[str, tuple[int, ...]]] = {}  # each member op's saved bytes, per dtype
        self.saved_ops: dict[str, tuple[str, ...]] = {}  # the member ops saving activations (saved_parts_at's order)
        self.compute: dict[str, dict[str, float]] = {}
        self.param_bytes: dict[str, int] = {}
        self.stream_parts: dict[str, tuple[int, ...]] = {}  # each member op's own weights: streamed one copy per op
        self.stream_parts_at: dict[str, dict[str, tuple[int, ...]]] = {}  # ... held in each choice's form
        self.param_mem: dict[str, int] = {}
        self.trainable: dict[str, int] = {}
        self.work_mem: dict[str, int] = {}
        self.saved: dict[str, int] = {}
        self.opt_step: dict[str, dict[str, float]] = {}
        tensors = self.original.tensors
        for node in self.nodes:
            ops = [self.original.ops[m] for m in self.members[node]]
            self.compute[node] = {
                d: sum(cost(op, self.devices.device(d)).seconds for op in ops) for d in self.allowed[node]
            }
            self.param_bytes[node] = sum(op.param_bytes for op in ops)
            self.stream_parts[node] = tuple(op.param_bytes for op in ops if op.param_bytes > 0)
            self.param_mem[node] = sum(parameter_memory(op, opt, training=training) for op in ops)
            self.trainable[node] = sum(op.trainable_param_bytes for op in ops)
            self.work_mem[node] = max(
                sum(tensors[t].nbytes for t in op.inputs) + sum(tensors[t].nbytes for t in op.outputs) for op in ops
            )
            saving = {op.name: b for op in ops
                      if (b := saved_activation_bytes(op, sum(tensors[t].nbytes for t in op.outputs)))}
            self.saved[node] = sum(saving.values()) if training else 0
            self.saved_ops[node] = tuple(saving) if training else ()
            self.saved_parts_at[node] = {FLOAT32: tuple(saving.values()) if training else ()}
            self.opt_step[node] = {  # one optimizer step per member op, as on the original graph
                d.name: sum(self.costs.optimizer_step_time(op.trainable_param_bytes, d, opt).seconds for op in ops)
                if training else 0.0
                for d in self.devices.devices
            }
            self._cost_precision(node, ops)

    def _cost_precision(self, node: str, ops: list) -> None:
        """Per dtype a node may compute in: its time on each device (with casts between its own
        members) and its parameters, working set and saved activations."""
        training, tensors = self.options.training, self.original.tensors
        kinds = self.precision_kinds(node)
        packs = any(m in self.quantizable for m in self.members[node])
        self.choices[node] = {d: self.precision.choices(kinds, d, packs) if self.precision else (FLOAT32,)
                              for d in self.allowed[node]}
        dtypes = {a for per_d in self.choices[node].values() for a in per_d}
        if dtypes == {FLOAT32}:
            self.compute_in[node] = {d: {FLOAT32: t} for d, t in self.compute[node].items()}
            self.stream_parts_at[node] = {FLOAT32: self.stream_parts[node]}
            self.param_mem_at[node] = {FLOAT32: self.param_mem[node]}
            self.work_mem_at[node] = {FLOAT32: self.work_mem[node]}
            self.saved_at[node] = {FLOAT32: self.saved[node]}
            return
        members = set(self.members[node])

        def size(tensor: str, dtype: str) -> int:  # bytes of a tensor held in dtype
            t = tensors[tensor]
            return int(t.nbytes * itemsize_factor(dtype)) if t.dtype == FLOAT32 else t.nbytes

        self.compute_in[node], self.param_mem_at[node], self.work_mem_at[node], self.saved_at[node] = {}, {}, {}, {}
        self.saved_parts_at[node] = {}
        self.stream_parts_at[node] = {}
        for a in dtypes:
            eff = {op.name: self.op_dtype(op.name, a) for op in ops}
            self.param_mem_at[node][a] = sum(
                parameter_memory(op, self.options.optimizer, training=training) if training or eff[op.name] == FLOAT32
                else self.op_param_bytes(op, eff[op.name]) for op in ops)
            self.stream_parts_at[node][a] = self.stream_parts[node] if training else tuple(
                b for op in ops if op.param_bytes > 0 and (b := self.op_param_bytes(op, eff[op.name])) > 0)
            self.work_mem_at[node][a] = max(
                sum(size(t, eff[op.name]) for t in (*op.inputs, *op.outputs)) for op in ops)
            parts = tuple(saved_activation_bytes(op, sum(size(t, eff[op.name]) for t in op.outputs))
                          for op in ops if op.name in self.saved_ops[node])
            self.saved_at[node][a] = sum(parts) if training else 0
            self.saved_parts_at[node][a] = parts if training else ()
        for d, per_d in self.choices[node].items():
            device = self.devices.device(d)
            self.compute_in[node][d] = {}
            for a in per_d:
                eff = {op.name: self.op_dtype(op.name, a) for op in ops}
                seconds = sum(self.compute_time(op, device, eff[op.name]) for op in ops)
                for op in ops:  # casts between the node's own members (once per reading op)
                    for t in dict.fromkeys(op.inputs):
                        src = tensors[t].producer
                        if src in members and tensors[t].dtype == FLOAT32 and \
                                activations(eff[src]) != activations(eff[op.name]):
                            seconds += self.cast_s(tensors[t].nbytes, d)
                self.compute_in[node][d][a] = seconds
            self.compute[node][d] = self.compute_in[node][d][per_d[0]]

    def compute_time(self, op, device, dtype: str) -> float:  # noqa: ANN001
        """Seconds ``op`` takes on ``device`` computing in ``dtype`` (as traced when float32)."""
        if dtype == FLOAT32:
            cost = self.costs.training_op_time if self.options.training else self.costs.op_time
            return cost(op, device).seconds
        packed = self.op_param_bytes(op, dtype) if weights(dtype) else 0
        return self.costs.op_time_in(op, device, dtype, training=self.options.training, weight_bytes=packed).seconds

    @functools.cache  # noqa: B019
    def cast_s(self, nbytes_fp32: int, device: str) -> float:
        """Seconds to cast a float32 tensor of ``nbytes_fp32`` to 16 bits or back on ``device``
        (training: and its gradient back)."""
        one = self.costs.cast_time(nbytes_fp32, self.devices.device(device)).seconds
        return 2 * one if self.options.training else one

    def default_dtype(self, node: str, device: str) -> str:
        """The dtype ``node`` computes in on ``device`` when a placement does not say (baselines)."""
        return self.choices[node][device][0] if device in self.choices[node] else FLOAT32

    def dtype_of(self, placement: Placement, node: str) -> str:
        """The dtype ``node`` computes in under ``placement``."""
        return placement.precision.get(node) or self.default_dtype(node, placement.device[node])

    def tensor_dtype(self, t: CrossTensor | str, node_dtype: Mapping[str, str]) -> str:
        """The dtype a tensor crosses in: its producer node's when it follows it, else float32."""
        t = self.tensor_info[t] if isinstance(t, str) else t
        return activations(node_dtype[t.producer]) if t.follows and t.producer is not None else FLOAT32

    def copy_bytes(self, t: CrossTensor, dtype: str) -> int:
        """Bytes of ``t`` held in ``dtype`` (float32 tensors only shrink)."""
        return int(t.bytes * itemsize_factor(dtype)) if t.float32 else t.bytes

    @property
    def has_choices(self) -> bool:
        """Whether some node may compute in more than one dtype on some device."""
        return any(len(c) > 1 for per_d in self.choices.values() for c in per_d.values())

    @property
    def output_casts(self) -> tuple[tuple[str, str, int], ...]:
        """(tensor, producer node, float32 bytes) of graph outputs a 16-bit producer casts back."""
        tensors = self.original.tensors
        group_of = {op: n for n in self.nodes for op in self.members[n]}
        out = []
        for name in dict.fromkeys(self.original.outputs):
            t = tensors.get(name)
            if t is None or t.producer is None or t.dtype != FLOAT32 or t.producer not in group_of:
                continue
            if self.op_kind[t.producer] == "flexible":
                out.append((name, group_of[t.producer], t.nbytes))
        return tuple(out)

    def _cross_tensors(self) -> tuple[CrossTensor, ...]:
        out = []
        for t in self.graph.tensors.values():
            consumers = tuple(sorted(set(t.consumers) & set(self.graph.ops), key=self.index.__getitem__))
            if consumers and t.nbytes > 0:
                orig = self.original.tensors.get(t.name, t)
                float32 = self.precision is not None and orig.dtype == FLOAT32
                follows = float32 and orig.producer is not None and self.op_kind.get(orig.producer) == "flexible"
                reads = tuple(self._readers(t.name, c) if float32 else (0, 0) for c in consumers)
                out.append(CrossTensor(t.name, t.producer, consumers, t.nbytes, float32, follows, reads))
        self.tensor_info = {t.name: t for t in out}
        return tuple(out)

    def _readers(self, tensor: str, node: str) -> tuple[int, int]:
        """(member ops of ``node`` reading ``tensor`` in the node's dtype, those reading it in float32).

        Casts are priced per reading op, so a coarse node costs what its members cost one by one."""
        readers = [m for m in self.members[node] if tensor in self.original.ops[m].inputs]
        flexible = sum(self.op_kind[m] == "flexible" for m in readers)
        return flexible, len(readers) - flexible

    def _shared_params(self) -> tuple[SharedParam, ...]:
        """Parameters read by ops other than their owner op, as nodes: the owner's node and the
        nodes of the other readers. A reader in the owner's own (coarse) node counts too: when
        that node streams its weights, the reader copies the parameter like any other."""
        out = []
        group_of = {op: n for n in self.nodes for op in self.members[n]}
        for p in self.original.params.values():
            if p.owner is None or p.owner not in group_of:
                continue
            users = tuple(dict.fromkeys(group_of[u] for u in p.users if u != p.owner and u in group_of))
            if users:
                out.append(SharedParam(p.name, group_of[p.owner], users, p.nbytes))
        return tuple(out)

    # -- transfer costs -----------------------------------------------------------------------

    @functools.cache  # noqa: B019 - the problem is immutable and lives as long as its solve
    def transfer_s(self, nbytes: int, src: str, dst: str) -> float:
        """Seconds per step to move ``nbytes`` of activations src -> dst (training: and the gradient back)."""
        one = self.costs.transfer_time(nbytes, src, dst, self.devices).seconds
        return 2 * one if self.options.training else one

    @functools.cache  # noqa: B019
    def stream_s(self, nbytes: int, src: str, dst: str, mode: StreamMode) -> float:
        """Seconds per step to bring ``nbytes`` of weights from ``src`` to ``dst``."""
        return self.costs.transfer_time(nbytes, src, dst, self.devices, pinned=mode is StreamMode.PREFETCH).seconds

    @functools.cache  # noqa: B019
    def hops(self, src: str, dst: str) -> tuple[str, ...]:
        """Labels of the links a copy from ``src`` to ``dst`` occupies."""
        return tuple(link.label for link in self.devices.route(src, dst))

    @functools.cache  # noqa: B019
    def hop_s(self, nbytes: int, src: str, dst: str, label: str, pinned: bool = True) -> float:
        """Seconds link ``label`` is busy with a copy of ``nbytes`` from ``src`` to ``dst``."""
        for link in self.devices.route(src, dst):
            if link.label == label:
                bandwidth = link.bandwidth if pinned else (link.pageable_bandwidth or link.bandwidth)
                return link.latency + nbytes / bandwidth
        return 0.0

    @functools.cache  # noqa: B019
    def stream_issue_s(self, dst: str) -> float:
        """Seconds a prefetched weight copy to ``dst`` adds to its node: the route's latency."""
        return sum(link.latency for link in self.devices.route(self.host, dst))

    @property
    def stream_passes(self) -> int:
        """Copies of a streamed weight per step: forward only, or forward and backward (training)."""
        return 2 if self.options.training else 1

    def stream_forms(self, node: str, dst: str) -> tuple[str, ...]:
        """The choices ``node`` may compute in on ``dst`` while its weights stream there from the host.

        Inference: every choice it has there; the host keeps the weights in that choice's form,
        cast or packed once when loaded (a packed linear streams its packed values and scales:
        :meth:`stream_parts_to`). Training and plans without precision: float32 (the master
        weights), or the one dtype the device runs."""
        dtypes = self.choices[node].get(dst, (FLOAT32,))
        if self.options.training or self.precision is None:
            return (FLOAT32,) if FLOAT32 in dtypes else dtypes[:1]
        return dtypes

    def stream_form(self, node: str, dst: str, choice: str | None = None) -> str:
        """The form ``node``'s weights stream to ``dst`` in when it computes in ``choice`` there
        (default: its default choice there, :meth:`default_dtype`)."""
        if self.options.training or self.precision is None:
            return self.stream_forms(node, dst)[0]
        return choice or self.default_dtype(node, dst)

    def stream_parts_to(self, node: str, dst: str, choice: str | None = None) -> tuple[int, ...]:
        """Bytes of each member op's weights as streamed to ``dst`` when ``node`` computes in
        ``choice`` there (:meth:`stream_form`): a packed weight's values and scales, the rest in the
        choice's activation dtype."""
        return self.stream_parts_at[node][self.stream_form(node, dst, choice)]

    def stream_bytes(self, node: str, dst: str, choice: str | None = None) -> int:
        """Bytes per step streamed to ``dst`` for ``node`` (every member op's weights, once per pass)."""
        return self.stream_passes * sum(self.stream_parts_to(node, dst, choice))

    def stream_mem(self, node: str, dst: str, choice: str | None = None) -> int:
        """Host bytes of ``node``'s weights when it streams them to ``dst`` (in the form streamed)."""
        return self.param_mem_at[node][self.stream_form(node, dst, choice)]

    def node_stream_s(self, node: str, src: str, dst: str, mode: StreamMode, choice: str | None = None) -> float:
        """Seconds per step to stream every member op's weights of ``node`` (one copy per op and pass)."""
        return self.stream_passes * sum(self.stream_s(b, src, dst, mode)
                                        for b in self.stream_parts_to(node, dst, choice))

    def node_stream_issue_s(self, node: str, dst: str) -> float:
        """Issue latency a prefetched ``node`` pays on ``dst``: once per member op's copy and pass
        (a packed weight's tensors count as one copy, like a float weight and its bias)."""
        return self.stream_passes * len(self.stream_parts[node]) * self.stream_issue_s(dst)

    def node_stream_hop_s(self, node: str, src: str, dst: str, label: str, pinned: bool = True,
                          choice: str | None = None) -> float:
        """Seconds link ``label`` is busy streaming ``node``'s weights (one copy per member op and pass)."""
        return self.stream_passes * sum(self.hop_s(b, src, dst, label, pinned)
                                        for b in self.stream_parts_to(node, dst, choice))

    def least_stream_hop_s(self, node: str, dst: str, label: str) -> float:
        """The least time link ``label`` is busy streaming ``node``'s weights to ``dst`` (bounds)."""
        return min(self.node_stream_hop_s(node, self.host, dst, label, choice=a) for a in self.stream_forms(node, dst))

    def least_stream_mem(self, node: str, dst: str) -> int:
        """The fewest host bytes ``node``'s weights take when streamed to ``dst`` (bounds)."""
        return min(self.stream_mem(node, dst, a) for a in self.stream_forms(node, dst))

    def least_stream_buffer(self, node: str, dst: str) -> int:
        """The smallest prefetch buffer ``node``'s streamed weights need on ``dst`` (bounds)."""
        return min(self.stream_buffer_bytes(node, StreamMode.PREFETCH, dst, a) for a in self.stream_forms(node, dst))

    @functools.cache  # noqa: B019
    def one_way_s(self, nbytes: int, src: str, dst: str) -> float:
        """Seconds to copy ``nbytes`` once from ``src`` to ``dst`` (a gradient out, an updated weight back)."""
        return self.costs.transfer_time(nbytes, src, dst, self.devices).seconds if src != dst and nbytes else 0.0


    def stream_buffer_bytes(self, node: str, mode: StreamMode, dst: str, choice: str | None = None) -> int:
        """Buffer on ``dst`` ``node``'s streamed weights need: its largest member copy (in the form
        streamed), once or twice."""
        return self.buffer_factor(mode) * max(self.stream_parts_to(node, dst, choice), default=0)

    def shared_param_s(self, param: SharedParam, dst: str) -> float:
        """Seconds to copy a shared parameter to ``dst``, from the slowest possible source."""
        return max((self.transfer_s(param.bytes, s, dst) for s in self.device_names if s != dst), default=0.0)

    def least_compute(self, node: str, device: str) -> float:
        """``node``'s time on ``device`` in its fastest dtype there (bounds: no placement is faster)."""
        return min(self.compute_in[node][device].values())

    def least_param_mem(self, node: str) -> int:
        """``node``'s parameter bytes in the dtype that holds them in the fewest (bounds)."""
        return min(self.param_mem_at[node].values())

    def least_resident_mem(self, node: str, device: str) -> int:
        """The fewest parameter bytes ``node`` must keep on ``device`` when it computes there with its
        weights resident: its weights alone where its optimizer state may live on the host."""
        if node in self.offloadable and device != self.host:
            return self.weight_mem[node]
        return self.param_mem[node]

    def least_work_mem(self, node: str) -> int:
        """``node``'s working set in the dtype that needs the fewest bytes (bounds)."""
        return min(self.work_mem_at[node].values())

    def least_saved(self, node: str) -> int:
        """``node``'s saved activations in the dtype that needs the fewest bytes (bounds)."""
        return min(self.saved_at[node].values())

    def fits_alone(self, node: str, device: str) -> bool:
        """Whether ``node`` alone fits on ``device`` in some dtype it may use there: its working
        set, saved activations (or the buffer of those held on the host) and its parameters, or its
        stream buffer where it may stream them there. When it does not, no feasible placement puts it
        there."""
        need = []
        dtypes = self.choices[node].get(device, (FLOAT32,))
        for a in dtypes:
            weights = self.param_mem_at[node][a]
            if node in self.streamable and device != self.host and a in self.stream_forms(node, device):
                weights = min(weights, self.stream_buffer_bytes(node, StreamMode.PREFETCH, device, a))
            if node in self.offloadable and device != self.host:  # optimizer state on the host
                weights = min(weights, self.weight_mem[node])
            if node in self.state_streamable and device != self.host:  # state on the host, streamed for the step
                weights = min(weights, self.param_mem[node] - self.state_mem[node] + max(self.state_parts[node]))
            saved = 0 if node in self.recomputable and len(dtypes) == 1 else self.saved_at[node][a]
            if node in self.saved_hostable and device != self.host and len(dtypes) == 1:  # held on the host
                saved = min(saved, max(self.saved_parts_at[node][a], default=0))  # but its buffer
            need.append(self.work_mem_at[node][a] + saved + weights)
        return min(need) <= self.capacity[device]

    def buffer_factor(self, mode: StreamMode) -> int:
        """Reused device buffers for streamed weights: two for double-buffered prefetch, one for sync."""
        return 2 if mode is StreamMode.PREFETCH else 1


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


def evaluate(problem: Problem, placement: Placement) -> Evaluation:
    """Predicted time, loads, memory and transfers of ``placement`` (see the module docstring).

    Example:
        >>> ev = evaluate(problem, Placement({n: "cuda:0" for n in problem.nodes}))   # doctest: +SKIP
        >>> ev.total_s, ev.feasible
    """
    p, x = problem, placement.device
    missing = [n for n in p.nodes if n not in x]
    if missing:
        raise HetpartError(f"placement leaves {len(missing)} ops unplaced, e.g. {missing[:3]}")
    if p.options.pipeline is not None:  # pipeline stages: their own semantics (solvers/pipeline.py)
        return evaluate_pipeline(p, placement)
    violations: list[str] = []
    for n in p.nodes:
        if x[n] not in p.allowed[n]:
            why = "is pinned elsewhere" if n in p.pins else "cannot run it"
            violations.append(f"op {n} placed on {x[n]}, which {why} (allowed: {', '.join(p.allowed[n])})")
    violations += _split_violations(p, placement)
    dtype = node_dtypes(p, placement)
    for n in p.nodes:
        if x[n] in p.choices[n] and dtype[n] not in p.choices[n][x[n]]:
            violations.append(f"op {n} computes in {dtype[n]} on {x[n]}, which offers it "
                              f"{', '.join(p.choices[n][x[n]])} only")
        if n in placement.streamed and placement.streamed[n] != x[n] and x[n] in p.choices[n] \
                and dtype[n] not in p.stream_forms(n, x[n]):
            violations.append(f"op {n} streams its weights held as {p.stream_forms(n, x[n])[0]} (float32 master "
                              f"weights in training) but computes in {dtype[n]}")
        if n in placement.streamed and placement.streamed[n] != x[n] and n in p.state_writers:
            violations.append(f"op {n} writes its own buffers (a KV cache), so they cannot be streamed: "
                              f"they live where it computes")
    over_budget = budget_violation(p, dtype)
    if over_budget:
        violations.append(over_budget)
    casts = cast_load(p, placement, dtype)
    transfers = _transfers(p, placement)
    link_load = {label: 0.0 for label in p.link_labels}
    for t in transfers:
        if t.kind == "param":  # costed on the critical path from the slowest source (see docstring)
            continue
        for label in p.hops(t.src, t.dst):
            if t.kind == "weights":
                pinned = placement.stream_mode is not StreamMode.SYNC
                link_load[label] += p.node_stream_hop_s(t.tensor, t.src, t.dst, label, pinned, dtype[t.tensor])
            elif t.kind == "gradient":
                link_load[label] += grad_hop_s(p, t.tensor, t.src, label)
            elif t.kind == "update":
                link_load[label] += update_hop_s(p, t.tensor, t.dst, label)
            elif t.kind == "state":
                link_load[label] += sum(p.hop_s(b, t.src, t.dst, label) for b in p.state_parts[t.tensor])
            elif t.kind == "split":  # each copy of the split as priced (a time split: one per chunk)
                continue
            elif t.kind == "saved":
                link_load[label] += saved_hop_s(p, t.tensor, dtype[t.tensor], t.src, t.dst, label)
            else:
                factor = 2 if p.options.training else 1
                link_load[label] += factor * p.hop_s(t.bytes, t.src, t.dst, label)
    for n, sp in placement.split.items():
        price = p.split_price.get((n, sp))
        for src, dst, nbytes, _ in price.copies if price is not None else ():
            for label in p.hops(src, dst):
                link_load[label] += p.hop_s(nbytes, src, dst, label)
    regions = region_effect(p, placement)  # copies a column split into a row split does not make
    for label, seconds in regions.link_s.items():
        link_load[label] += seconds
    violations += _state_violations(p, placement)
    busy = {d: 0.0 for d in p.device_names}
    opt = {d: 0.0 for d in p.device_names}
    split_extra = 0.0  # latency: a split's path minus its shards' busy time (shards overlap, copies wait)
    for n in p.nodes:
        sp = placement.split.get(n)
        if sp is not None and (n, sp) in p.split_price:
            price = p.split_price[(n, sp)]
            for d, seconds in zip(sp.devices, price.shard_s):
                busy[d] += seconds
            split_extra += price.latency_s - sum(price.shard_s)
            continue
        busy[x[n]] += p.compute_in[n].get(x[n], {}).get(dtype[n], float("inf")) + casts[n]
        if n in placement.recompute:
            busy[x[n]] += p.fwd_in.get(n, {}).get(x[n], {}).get(dtype[n], 0.0)
        if n in placement.saved_on_host and x[n] != p.host:
            busy[x[n]] += saved_issue_s(p, n, dtype[n], x[n])
        home = placement.state_device(n)
        opt[home] += p.opt_step[n][home]
    for d, seconds in regions.busy_s.items():  # interior ops on their shards
        busy[d] += seconds
    split_extra += regions.extra_s
    for t in transfers:
        if t.kind == "param":
            busy[t.dst] += t.seconds
        elif t.kind == "weights" and placement.stream_mode is StreamMode.PREFETCH:
            busy[t.dst] += p.node_stream_issue_s(t.tensor, t.dst)
    critical = sum(t.seconds for t in transfers if t.kind == "activation")
    if placement.stream_mode is StreamMode.SYNC:
        critical += sum(t.seconds for t in transfers if t.kind == "weights")
    schedule: dict[str, tuple[float, float]] = {}
    objective = p.options.objective
    if objective is Objective.LATENCY and p.train_state:  # host steps beside backward (solvers/train_state.py)
        critical += sum(busy.values()) + sum(s for d, s in opt.items() if d != p.host)
        worker = 0.0 if p.options.delayed_update else step_schedule(p, placement, critical, dtype)
        total = max([critical, worker, busy[p.host] + opt[p.host], *link_load.values()])
    elif objective is Objective.LATENCY:
        critical += sum(busy.values()) + sum(opt.values()) + split_extra
        total = max([critical, *link_load.values()])
    elif objective is Objective.THROUGHPUT:
        total = max([*(busy[d] + opt[d] for d in p.device_names), *link_load.values()])
        critical = total
    else:
        schedule = list_schedule(p, placement)
        end = max((f for _, f in schedule.values()), default=0.0)
        params = sum(t.seconds for t in transfers if t.kind == "param")
        critical = end + params + max(opt.values(), default=0.0)
        total = max([critical, *link_load.values()])
    busy = {d: busy[d] + opt[d] for d in p.device_names}
    for label, limit in p.options.link_budget.items():
        used = sum(t.bytes for t in transfers if label in p.hops(t.src, t.dst))
        if used > limit:
            violations.append(f"link {label} carries {used:,} bytes per step, over its budget of {limit:,}")
    memory = memory_use(p, placement)
    for d, used in memory.items():
        if used > p.capacity[d]:
            violations.append(f"device {d} needs {used:,} bytes, over its capacity of {p.capacity[d]:,}")
    if p.options.contiguous_stages:
        stage = {d: i for i, d in enumerate(p.device_names)}
        for t in p.tensors:
            if t.producer is None:
                continue
            for c in t.consumers:
                if stage[x[c]] < stage[x[t.producer]]:
                    violations.append(f"edge {t.producer} -> {c} goes back from {x[t.producer]} to {x[c]}")
    return Evaluation(
        objective=objective,
        total_s=total,
        critical_path_s=critical,
        per_device_s=MappingProxyType(busy),
        per_link_s=MappingProxyType(link_load),
        memory=MappingProxyType(memory),
        capacity=MappingProxyType(dict(p.capacity)),
        transfers=tuple(transfers),
        violations=tuple(violations),
        schedule=MappingProxyType(schedule),
    )


def node_dtypes(p: Problem, placement: Placement) -> dict[str, str]:
    """The dtype every node computes in under ``placement`` (its own, or its device's default)."""
    return {n: p.dtype_of(placement, n) for n in p.nodes}


def cast_load(p: Problem, placement: Placement, dtype: Mapping[str, str]) -> dict[str, float]:
    """Seconds each node spends casting: each float32 tensor it reads in another dtype than the
    tensor is held in (once per tensor), and each graph output it produces in 16 bits."""
    x = placement.device
    out = {n: 0.0 for n in p.nodes}
    if p.precision is None:
        return out
    for t in p.tensors:
        if not t.float32:
            continue
        held = p.tensor_dtype(t, dtype)
        for c, (in_node_dtype, in_float32) in zip(t.consumers, t.reads):
            casts = in_node_dtype * (activations(dtype[c]) != held) + in_float32 * (held != FLOAT32)
            if casts:
                out[c] += casts * p.cast_s(t.bytes, x[c])
    for _, u, nbytes in p.output_casts:
        if activations(dtype[u]) != FLOAT32:
            out[u] += p.cast_s(nbytes, x[u])
    return out


def _transfers(p: Problem, placement: Placement) -> list[Transfer]:
    x = placement.device
    out: list[Transfer] = []
    dtype = node_dtypes(p, placement) if p.precision is not None else {}
    effect = region_effect(p, placement) if placement.split else None
    dropped = effect.dropped if effect is not None else frozenset()
    for t in p.tensors:
        src = x[t.producer] if t.producer is not None else p.host
        nbytes = p.copy_bytes(t, p.tensor_dtype(t, dtype)) if dtype else t.bytes
        for dst in dict.fromkeys(x[c] for c in t.consumers):
            if dst != src:
                out.append(Transfer(t.name, src, dst, nbytes, p.transfer_s(nbytes, src, dst)))
    for n, sp in placement.split.items():
        price = p.split_price.get((n, sp))
        if price is not None:  # named after the split linear (a coarse node's member)
            op = split_op(p, n).name
            for src, dst, nbytes, seconds in split_transfers(sp, price):
                if (n, src, dst) not in dropped:
                    out.append(Transfer(op, src, dst, nbytes, seconds, "split"))
    for op, src, dst, nbytes, seconds in (effect.added if effect is not None else ()):
        out.append(Transfer(op, src, dst, nbytes, seconds, "split"))  # a region's outside tensor to a shard device
    for n, home in placement.streamed.items():
        if home != x[n] and p.param_bytes[n]:
            a = p.dtype_of(placement, n)  # the weights cross in the form the node computes with
            out.append(Transfer(n, home, x[n], p.stream_bytes(n, x[n], a),
                                p.node_stream_s(n, home, x[n], placement.stream_mode, a), "weights"))
    for sp in p.shared:
        home = placement.residence(sp.owner)
        for dst in dict.fromkeys(x[u] for u in sp.users):
            if dst != home:
                out.append(Transfer(sp.name, home, dst, sp.bytes, p.shared_param_s(sp, dst), "param"))
    if p.options.training:
        for n in p.nodes:
            if gradient_leaves(p, placement, n):
                out.append(Transfer(n, x[n], p.host, p.grad_bytes[n], grad_s(p, n, x[n]), "gradient"))
            if offloaded(p, placement, n):
                out.append(Transfer(n, p.host, x[n], p.trainable[n], update_s(p, n, x[n]), "update"))
            if n in placement.streamed_state and x[n] != p.host:  # in for the step, and back
                way = sum(p.one_way_s(b, p.host, x[n]) for b in p.state_parts[n])
                out.append(Transfer(n, p.host, x[n], p.state_mem[n], way, "state"))
                out.append(Transfer(n, x[n], p.host, p.state_mem[n], state_s(p, n, x[n]) - way, "state"))
        adtype = node_dtypes(p, placement) if placement.saved_on_host else {}
        for n in sorted(placement.saved_on_host, key=lambda m: p.index.get(m, -1)):
            if x[n] != p.host and n in p.saved_hostable:  # out in forward, back in backward
                nbytes = p.saved_at[n][adtype[n]]
                out.append(Transfer(n, x[n], p.host, nbytes, saved_s(p, n, adtype[n], x[n], p.host), "saved"))
                out.append(Transfer(n, p.host, x[n], nbytes, saved_s(p, n, adtype[n], p.host, x[n]), "saved"))
    return out


def split_transfers(split: Split | TimeSplit, price: SplitPrice) -> list[tuple[str, str, int, float]]:
    """A split's ``"split"`` transfers, one per ordered pair of its devices with copies between them
    (a time split's chunk copies in one): ``(src, dst, bytes, seconds)``, copies out of home first."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for src, dst, nbytes, seconds in price.copies:
        if nbytes:
            b, s = out.get((src, dst), (0, 0.0))
            out[(src, dst)] = (b + nbytes, s + seconds)
    return [(src, dst, b, s) for (src, dst), (b, s) in out.items()]


def _split_violations(p: Problem, placement: Placement) -> list[str]:
    """Splits the problem does not offer, or whose home is not the node's device."""
    out = []
    for n, sp in placement.split.items():
        offered = p.split_choices.get(n, ())
        if sp not in offered:
            can = ", ".join(s.label for s in offered[:6]) + (" ..." if len(offered) > 6 else "") if offered \
                else _takes_none(p, n)
            out.append(f"op {n} is split {sp.label}, which it cannot take; it can take: {can}")
        elif placement.device[n] != sp.home:
            out.append(f"op {n} is split {sp.label} but placed on {placement.device[n]}: a split op's device is its "
                       f"home, {sp.home}")
        elif n in placement.streamed:
            why = "a time split streams them in chunks, not also whole" if sp.axis == TIME_AXIS \
                else "a split op's shards stay resident"
            out.append(f"op {n} is split {sp.label} and streams its weights: {why}")
    return out


def _takes_none(p: Problem, node: str) -> str:
    """Why ``node`` is offered no split, naming the splits its op can take."""
    if p.options.splits is None:
        return "none (splits off)"
    ops = [m for m in p.members[node] if not p.original.ops[m].is_view]
    if len(ops) != 1:
        return f"none (a group of {len(ops)} ops is never split)"
    takes = splits_it_takes(p.original.ops[ops[0]], p.original)
    return f"none along {', '.join(p.options.splits.axes)} (the op takes {takes})"


def _state_violations(p: Problem, placement: Placement) -> list[str]:
    """Training-state choices the problem does not offer or that say nothing possible."""
    out = []
    for n, home in placement.state.items():
        if home != p.host:
            out.append(f"op {n} keeps its optimizer state on {home}: state lives with its weights or on the host {p.host}")
        elif not p.train_state or not p.trainable[n]:
            out.append(f"op {n} offloads its optimizer state, which needs a training problem (objective latency or "
                       f"throughput) and trainable parameters")
    for n in sorted(placement.streamed_state, key=str):
        if n not in p.state_streamable:
            out.append(f"op {n} streams its optimizer state, which needs a training problem (objective latency or "
                       f"throughput, offload allowed, no delayed update), an optimizer with state and trainable "
                       f"parameters updated densely")
        elif placement.device[n] == p.host or placement.residence(n) != placement.device[n] or n in placement.state:
            out.append(f"op {n} streams its optimizer state, which needs its weights resident on the accelerator "
                       f"computing it and its state in one place (not also offloaded or weight-streamed)")
    for n in placement.recompute:
        if not p.train_state or not p.saved[n]:
            out.append(f"op {n} recomputes its activations, which needs a training problem and saved activations")
    for n in sorted(placement.saved_on_host, key=str):
        if n not in p.saved_hostable:
            out.append(f"op {n} holds its saved activations on the host, which needs a training problem (objective "
                       f"latency or throughput, save_on_host allowed) and saved activations")
        elif placement.device[n] == p.host:
            out.append(f"op {n} holds its saved activations on the host, where it computes: drop it from "
                       f"saved_on_host")
        if n in placement.recompute:
            out.append(f"op {n} both recomputes its activations and holds them on the host: choose one")
        if placement.residence(n) != placement.device[n]:
            out.append(f"op {n} holds its saved activations on the host and streams its weights from there: "
                       f"the weights' fetched copies are saved by the streamer's own hooks; choose one")
    return out


def memory_use(p: Problem, placement: Placement) -> dict[str, int]:
    """Bytes each device holds under ``placement``: parameters, stream buffers (weights, streamed
    optimizer state), activations."""
    x = placement.device
    params = {d: 0 for d in p.device_names}
    buffers = {d: 0 for d in p.device_names}
    work = {d: 0 for d in p.device_names}
    saved = {d: 0 for d in p.device_names}
    state_buffers = {d: 0 for d in p.device_names}
    saved_buffers = {d: 0 for d in p.device_names}
    dtype = node_dtypes(p, placement)
    for n in p.nodes:
        d, a = x[n], dtype[n]
        sp = placement.split.get(n)
        if sp is not None and (n, sp) in p.split_price:
            price = p.split_price[(n, sp)]
            for i, shard in enumerate(sp.devices):
                params[shard] += price.param_bytes[i]
                work[shard] = max(work[shard], price.work_bytes[i])
            continue
        streams = n in placement.streamed and placement.streamed[n] != d
        if offloaded(p, placement, n):
            params[d] += p.weight_mem[n]
            params[p.host] += p.offload_mem[n]
        elif n in placement.streamed_state and not streams and d != p.host:
            params[d] += p.param_mem[n] - p.state_mem[n]
            params[p.host] += p.state_mem[n]
            state_buffers[d] = max(state_buffers[d], state_buffer_bytes(p, n))
        else:
            params[placement.residence(n)] += p.stream_mem(n, d, a) if streams else p.param_mem_at[n].get(a, p.param_mem[n])
        if streams:
            buffers[d] = max(buffers[d], p.stream_buffer_bytes(n, placement.stream_mode, d, a))
        work[d] = max(work[d], p.work_mem_at[n].get(a, p.work_mem[n]))
        if n in placement.saved_on_host and d != p.host and n in p.saved_hostable:  # the host holds them
            saved[p.host] += p.saved_at[n][a]
            saved_buffers[d] = max(saved_buffers[d], saved_buffer_bytes(p, n, a))
        elif n not in placement.recompute:
            saved[d] += p.saved_at[n].get(a, p.saved[n])
    for d, nbytes in (region_effect(p, placement).work_bytes if placement.split else {}).items():
        work[d] = max(work[d], nbytes)  # interior ops' shards
    return {d: params[d] + buffers[d] + state_buffers[d] + saved_buffers[d] + work[d] + saved[d]
            for d in p.device_names}


def list_schedule(p: Problem, placement: Placement) -> dict[str, tuple[float, float]]:
    """Start and end of every node when nodes are issued in ``placement.order`` (default:
    topological order) and each device runs its nodes one at a time, as soon as inputs arrive."""
    x = placement.device
    order = placement.order or p.nodes
    free = {d: 0.0 for d in p.device_names}
    end: dict[str, float] = {}
    times: dict[str, tuple[float, float]] = {}
    dtype = node_dtypes(p, placement)
    casts = cast_load(p, placement, dtype)
    arrival = _arrival_fn(p, x, end, dtype)
    for n in order:
        d = x[n]
        ready = max((arrival(t, d) for t in p.graph.ops[n].inputs), default=0.0)
        start = max(free[d], ready)
        finish = start + p.compute_in[n].get(d, {}).get(dtype[n], float("inf")) + casts[n]
        if n in placement.streamed and placement.streamed[n] != d:
            if placement.stream_mode is StreamMode.SYNC:
                finish += p.node_stream_s(n, placement.streamed[n], d, StreamMode.SYNC, dtype[n])
            else:
                finish += p.node_stream_issue_s(n, d)
        times[n] = (start, finish)
        end[n] = finish
        free[d] = finish
    return times


def _arrival_fn(p: Problem, x: Mapping[str, str], end: Mapping[str, float],  # noqa: ANN202
                dtype: Mapping[str, str]):
    tensors = p.graph.tensors

    def arrival(tensor: str, dst: str) -> float:
        t = tensors[tensor]
        info = p.tensor_info.get(tensor)
        nbytes = p.copy_bytes(info, p.tensor_dtype(info, dtype)) if info is not None else t.nbytes
        if t.producer is None:
            return p.transfer_s(nbytes, p.host, dst) if dst != p.host and nbytes else 0.0
        if t.producer not in end:
            raise HetpartError(f"issue order runs a consumer of {tensor!r} before its producer {t.producer!r}")
        src = x[t.producer]
        return end[t.producer] + (p.transfer_s(nbytes, src, dst) if src != dst and nbytes else 0.0)

    return arrival


def accelerator_devices(devices: DeviceSet) -> tuple[str, ...]:
    """Non-CPU devices in profile order (the main GPU first)."""
    return tuple(d.name for d in devices.devices if d.kind is not DeviceKind.CPU)


class Status(str, enum.Enum):
    """How a solver's answer stands (the words plans, summaries and reports show)."""

    OPTIMAL = "optimal"          # proven optimal: the relative gap is about 0 (at most 1e-6)
    WITHIN_GAP = "within gap"    # proven within the requested relative gap; the gap says how far
    TIME_LIMIT = "time limit"    # stopped by the time limit before reaching the requested gap
    HEURISTIC = "heuristic"      # a constructive baseline: no bound
    INFEASIBLE = "infeasible"    # the solver proved there is no placement within the limits
    FEASIBLE = "time limit"      # the word before "time limit" (an alias, for callers that used it)


@dataclasses.dataclass(frozen=True)
class Solution:
    """What a solver returns: a placement and what it knows about it.

    ``bound`` is a proven lower bound on the objective (``None`` for heuristics); ``seconds`` is
    the wall time the solver took; ``objective`` is the solver's own value of its placement (the
    ILP's incumbent; ``None`` for heuristics), which :func:`evaluate` must reproduce. The
    predicted cost comes from :func:`evaluate`.
    """

    solver: str
    placement: Placement
    status: Status
    bound: float | None = None
    seconds: float = 0.0
    note: str = ""
    objective: float | None = None


def explain_infeasibility(problem: Problem) -> str:
    """Why no placement fits, in the user's words: which device, how many bytes at least, the cap.

    Checks, in order: ops that can only run on one device (pins, support) against that device's
    cap; each op's own footprint against the largest device that can run it; the total footprint
    against all devices together. Falls back to naming the tightest device.
    """
    p = problem
    host = p.host
    lines: list[str] = []
    for d in p.device_names:
        only_here = [n for n in p.nodes if p.allowed[n] == (d,)]
        if not only_here:
            continue
        streamable = set(p.streamable) if d != host else set()
        params = sum(p.least_resident_mem(n, d) for n in only_here if n not in streamable)
        work = max(p.work_mem[n] for n in only_here)
        need = params + work + sum(p.saved[n] for n in only_here)
        if need > p.capacity[d]:
            names = ", ".join(only_here[:5]) + (f" and {len(only_here) - 5} more" if len(only_here) > 5 else "")
            why = "pinned there" if any(n in p.pins for n in only_here) else "runnable only there"
            lines.append(
                f"device {d} must hold at least {need:,} bytes ({params:,} of parameters of ops {why}: {names}; "
                f"largest working set {work:,}) but its cap is {p.capacity[d]:,}"
            )
    for n in p.nodes:
        footprint = p.work_mem[n] + (0 if n in p.streamable else min(p.least_resident_mem(n, d) for d in p.allowed[n]))
        room = max(p.capacity[d] for d in p.allowed[n])
        if footprint > room:
            lines.append(
                f"op {n} needs {footprint:,} bytes (parameters {p.param_mem[n]:,}, working set {p.work_mem[n]:,}) "
                f"but the largest device that can run it ({', '.join(p.allowed[n])}) holds {room:,}"
            )
            break
    total = sum(p.param_mem.values()) + sum(p.saved[n] for n in p.nodes if n not in p.recomputable)
    if total > sum(p.capacity.values()):
        caps = ", ".join(f"{d} {c:,}" for d, c in p.capacity.items())
        lines.append(f"the model needs at least {total:,} bytes in all but the devices hold {sum(p.capacity.values()):,} ({caps})")
    if not lines:
        d = min(p.device_names, key=lambda name: p.capacity[name])
        lines.append(f"no placement satisfies every memory cap and pin together; the tightest device is {d} "
                     f"with {p.capacity[d]:,} bytes")
    return "no placement fits: " + "; ".join(lines) + f". To fix: {_fixes(p)}."


def _fixes(p: Problem) -> str:
    """What would change the answer: caps; pins where there are some; a smaller micro-batch for a
    training step; weight streaming only where it is off and could be on (inference of a torch graph)."""
    from partitioner.frontends.onnx_input import is_onnx_graph

    fixes = ["raise the caps (--memory)"]
    if p.pins:
        fixes.append("remove pins")
    if p.options.training:
        fixes.append("size a smaller micro-batch (hetpart fit, partition(batch=...))")
    elif not p.options.streaming and p.options.pipeline is None and not is_onnx_graph(p.original):
        fixes.append("allow weight streaming (drop --no-streaming; streaming=True)")
    return ", ".join(fixes[:-1]) + f" or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
