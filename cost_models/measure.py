"""The measurement runner: every op of a captured graph timed on one device, where it really runs.

In: a ``torch.fx.GraphModule`` (a captured model: ``ExportedProgram.module()`` or a traced
module), real arguments, a device present on this machine, :class:`MeasureOptions` and a
:class:`~cost_models.measure_cache.MeasurementCache`. Out: :class:`DeviceMeasurements`: each call
node's forward time (and, for training, its forward under autograd, its backward, and the
optimizer step's seconds per trainable byte), the ops that failed on the device with the reason,
and how many answers came from the cache.

How it measures: the whole graph runs through :class:`~cost_models.timed_pass.TimedPass`, which
times each op where it sits (its inputs are the real values the previous ops produced, its output is
allocated as in a real run, the caches hold what the previous op left; releasing its output after
its last use counts to it too) — one untimed warm-up pass, then timed passes (at least
``min_repeats``, at most ``repeats``, fewer when one pass is slow), and each distinct op signature
(:func:`~cost_models.signature.node_signature`) keeps the median of every sample of every op sharing
it. Timing an op alone in a loop misses what a whole model pays in its own loop. Measuring first
calls :func:`~cost_models.allocator.keep_freed_memory`: glibc then serves every block from a heap it
keeps, so the times are those of a loop in its steady state, not of one whose gradients (or, with
the default allocator, tensors of 32 MiB and more) are faulted in again on some steps and not on
others (1.5-2x on the backward of an embedding-heavy model; the default allocator's first touch is
in :mod:`cost_models.analytic`). A training pass runs the forward with autograd on, sums the float
outputs, times each op's share of the backward (:func:`~cost_models.timed_pass.backward_timing`),
then times one optimizer step over all trainable parameters.

An op that raises on the device is marked unsupported there with the reason (the first line of the
error) and the pass goes on with its output computed on the CPU, or zeros of its recorded shape,
instead of aborting. ``KeyboardInterrupt`` stops the measuring: what was measured so far is put in
the cache (saved atomically) and returned with ``interrupted=True``. Threads: ``threads`` fixes
torch's intra-op thread count while measuring; it is part of every cache key.

The load: a :class:`~cost_models.machine_load.Meter` (default
:class:`~cost_models.machine_load.LoadMeter`: other processes' CPU time, this process's own
threads left out) reads how busy the machine was over the samples of each flush, and the cache
records it with them. An entry measured while busy is measured again when the warm-up pass finds
the machine not busy (a warm-up too short to tell is waited out to :data:`DECIDE_S`, only when some
entry of the graph was measured while busy); while it is still busy the entry is reused, and the
ops priced from such entries are listed in :attr:`DeviceMeasurements.busy` (the plan's summary
says how many), with a warning. Busy samples never replace quiet ones
(:meth:`~cost_models.measure_cache.MeasurementCache.put`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping

import torch
import torch.fx
from torch.utils._pytree import tree_leaves, tree_map

from cost_models.allocator import keep_freed_memory
from cost_models.machine_load import LoadMeter, LoadReading, Meter
from cost_models.measure_cache import CacheEntry, MeasurementCache
from cost_models.signature import Environment, environment
from cost_models.timed_pass import Clock, PassStopped, TimedPass, backward_timing
from cost_models.training import parse_optimizer
from partitioner.errors import HetpartError

__all__ = ["MeasureOptions", "OpTimes", "DeviceMeasurements", "measure_ops", "make_optimizer", "ProgressFn"]

log = logging.getLogger(__name__)

#: ``progress(done, total, what)``: called after each pass (``what`` names the device and phase).
ProgressFn = Callable[[int, int, str], None]
_SAVE_EVERY_S = 5.0
#: The shortest span that decides whether the machine is busy now, when an entry measured while busy
#: could be reused: on 2 CPUs, counters of 10 ms ticks tell 0.6 CPUs of other work from none in it.
DECIDE_S = 0.25


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
    """How much to measure."""

    repeats: int = 7            # timed passes at most; the median of the samples is kept
    min_repeats: int = 3        # timed passes at least, however slow one is
    warmup: int = 1             # untimed passes first (allocator, caches, lazy initialisation)
    budget_s: float = 20.0      # seconds of timed passes per device and mode before using fewer
    training: bool = False      # also measure training passes: backward and the optimizer step
    optimizer: str = "adam"     # the optimizer whose step a training pass times
    threads: int | None = None  # torch's intra-op threads while measuring (None: as they are)


@dataclasses.dataclass
class OpTimes:
    """What was measured for one op on one device (seconds; None: not measured)."""

    signature: str
    forward_s: float | None = None        # inference forward
    train_forward_s: float | None = None  # forward with autograd recording
    backward_s: float | None = None       # its autograd nodes in the backward pass


@dataclasses.dataclass
class DeviceMeasurements:
    """Every op of a graph measured on one physical device."""

    device: str
    env: Environment
    ops: dict[str, OpTimes]
    unsupported: dict[str, str]                 # op -> why it failed on this device
    optimizer_s_per_byte: dict[str, float]      # optimizer name -> step seconds per trainable byte
    passes: int = 0                             # timed passes run (all modes)
    cached: int = 0                             # (kind, signature) answered by the cache alone
    stale: int = 0                              # lookups that found only another torch version / thread count
    interrupted: bool = False
    busy: set[str] = dataclasses.field(default_factory=set)  # ops whose times were measured while busy
    load: LoadReading | None = None             # the load over the last samples this run took (None: none taken)


def make_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer a plan's ``optimizer`` names (``sgd``, ``sgd-momentum``, ``adam``, ``adamw``,
    ``adagrad``; ``sparse-adam`` steps dense parameters with Adam, as the placed optimizer does).

    Example:
        >>> type(make_optimizer("adam", [torch.nn.Parameter(torch.ones(2))])).__name__
        'Adam'
    """
    opt = parse_optimizer(name).value
    if opt in ("adam", "sparse-adam"):
        return torch.optim.Adam(params, lr=1e-6)
    if opt == "adamw":
        return torch.optim.AdamW(params, lr=1e-6)
    if opt == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-6)
    return torch.optim.SGD(params, lr=1e-6, momentum=0.9 if opt == "sgd-momentum" else 0.0)


# --------------------------------------------------------------------------------------------
# Measuring a graph on a device
# --------------------------------------------------------------------------------------------


def measure_ops(
    gm: torch.fx.GraphModule,
    args: tuple,
    device: str,
    *,
    options: MeasureOptions = MeasureOptions(),
    cache: MeasurementCache | None = None,
    progress: ProgressFn | None = None,
    meter: Meter | None = None,
) -> DeviceMeasurements:
    """Time every call node of ``gm`` run on ``args`` on ``device`` (see the module docstring).

    ``gm`` is not modified: it is copied to the device (always copied for training passes,
    whose optimizer step changes the weights). ``meter`` reads the machine's load (default: a
    :class:`~cost_models.machine_load.LoadMeter`).

    Example:
        >>> m = measure_ops(program.module(), inputs, "cpu")        # doctest: +SKIP
        >>> m.ops["linear"].forward_s
        0.0021
    """
    cache = cache if cache is not None else MeasurementCache()
    dev = torch.device(device)
    keep_freed_memory()   # times of a loop whose freed pages are reused, not faulted in again
    with _threads(options.threads):
        env = environment(str(dev))
        run = _Run(gm, args, dev, env, options, cache, progress, meter if meter is not None else LoadMeter())
        try:
            run.measure()
        except KeyboardInterrupt:
            run.result.interrupted = True
            log.warning("measuring on %s interrupted: keeping %d measured samples", dev, run.kept)
        finally:
            run.flush()
            _save(cache)
    if run.result.busy:
        load = run.result.load.describe() if run.result.load is not None else "the machine was busy"
        log.warning("%d of %d ops on %s were measured while other processes shared the CPUs (%s): their times may "
                    "be too high; they are measured again when the machine is quiet", len(run.result.busy),
                    len(run.result.ops), dev, load)
    return run.result


def _save(cache: MeasurementCache) -> None:
    """Save the cache; a cache that cannot be written loses no measurement of this run, only the keeping."""
    try:
        cache.save()
    except HetpartError as err:
        log.warning("the measurements are used but not kept: %s", err)


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Run:
    """The state of measuring one graph on one device: samples per signature, flushed to the cache."""

    def __init__(self, gm: torch.fx.GraphModule, args: tuple, dev: torch.device, env: Environment,
                 options: MeasureOptions, cache: MeasurementCache, progress: ProgressFn | None,
                 meter: Meter) -> None:
        self.gm, self.args, self.dev, self.env = gm, args, dev, env
        self.options, self.cache, self.progress, self.meter = options, cache, progress, meter
        self.busy_now = False   # whether the warm-up found the machine busy (then busy entries are reused)
        self.clock = Clock(dev)
        self.failed: dict[str, str] = {}
        self.signatures: dict[str, str] = {}
        self.pending: dict[tuple[str, str], list[float]] = {}   # (kind, signature) -> new samples
        self.sampled: set[tuple[str, str]] = set()               # (kind, signature) measured in this run
        self.stale_before = cache.stale
        self.result = DeviceMeasurements(str(dev), env, {}, self.failed, {})
        self.kept = 0
        self.last_save = time.perf_counter()

    # -- phases ---------------------------------------------------------------------------------

    def measure(self) -> None:
        module = _on_device(self.gm, self.dev, copy_always=False)
        args = _args_on(self.args, self.dev)
        kinds: tuple[str, ...] = ("forward",)
        with torch.inference_mode():
            self.meter.restart()
            self._passes(module, args, self.options.warmup, "warm-up", timed=False)
            self.busy_now = self._busy_now(kinds=("forward", "train_forward", "backward")
                                           if self.options.training else ("forward",))
            self.meter.restart()   # the first samples' span begins here
            if self._missing("forward"):
                self._passes(module, args, self.options.repeats, "forward", timed=True)
        if self.options.training:
            kinds = ("forward", "train_forward", "backward")
            self._training(_on_device(self.gm, self.dev, copy_always=True), args)
        self._collect(kinds)

    def _busy_now(self, kinds: tuple[str, ...]) -> bool:
        """Whether the machine is busy now, over the warm-up (waited out to :data:`DECIDE_S` when that
        is too short to tell); asked only when some entry of the graph was measured while busy."""
        looked_up = (self.cache.get(self.env, kind, sig) for kind in kinds for sig in set(self.signatures.values()))
        if not any(e is not None and e.busy for e in looked_up):
            return False
        reading = self.meter.reading()
        if not (reading.busy or reading.quiet) and reading.wall_s < DECIDE_S:
            time.sleep(DECIDE_S - reading.wall_s)   # this process idle: what is counted is other processes' work
            reading = self.meter.reading()
        return reading.busy

    def _missing(self, kind: str) -> bool:
        """Whether some op's signature lacks ``min_repeats`` samples of ``kind`` in the cache, or has
        only samples measured while busy when the machine is not busy now."""
        entries = [self.cache.get(self.env, kind, sig) for op, sig in self.signatures.items() if op not in self.failed]
        return any(not self._usable(e) for e in entries)

    def _usable(self, entry: CacheEntry | None) -> bool:
        """An entry with ``min_repeats`` samples, measured while quiet or the machine is busy now too."""
        if entry is None or len(entry.samples) < self.options.min_repeats:
            return False
        return not entry.busy or self.busy_now

    def _count(self, wanted: int, one_pass_s: float) -> int:
        """Timed passes to run once one took ``one_pass_s``: fewer when slow, never below min_repeats."""
        fits = int(self.options.budget_s / max(one_pass_s, 1e-9))
        return max(self.options.min_repeats, min(wanted, fits))

    def _passes(self, module: torch.fx.GraphModule, args: tuple, wanted: int, what: str, *, timed: bool) -> None:
        total, done = wanted, 0
        while done < total:
            started = time.perf_counter()
            p = TimedPass(module, self.clock, self.dev, self.failed, training=False)
            try:
                p.run(*args)
            except PassStopped as stop:
                log.warning("op %s failed on %s and its output cannot be stood in for: the ops after "
                            "it are not measured there", stop, self.dev)
            self.signatures.update(p.signatures)
            if timed:
                self._add("forward", p.forward_seconds())
                self.result.passes += 1
                if done == 0:
                    total = self._count(wanted, time.perf_counter() - started)
            done += 1
            self._report(done, total, f"{self.dev} {what}")

    def _training(self, module: torch.fx.GraphModule, args: tuple) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        nbytes = sum(p.numel() * p.element_size() for p in params)
        name = parse_optimizer(self.options.optimizer).value
        opt_sig = f"optimizer.{name}(params={len(params)}, bytes={nbytes})"
        complete = self._usable(self.cache.get(self.env, "optimizer", opt_sig))
        if complete and not (self._missing("train_forward") or self._missing("backward")):
            self._optimizer_rate(name, opt_sig, nbytes)
            return
        opt = make_optimizer(name, params) if params else None
        warmup, total, done = self.options.warmup, self.options.warmup + self.options.repeats, 0
        opt_samples: list[float] = []
        while done < total:
            started = time.perf_counter()
            timed = done >= warmup
            with torch.enable_grad():
                p = TimedPass(module, self.clock, self.dev, self.failed, training=True)
                try:
                    out = p.run(*args)
                except PassStopped as stop:
                    log.warning("training pass on %s stopped at %s: no backward measured there", self.dev, stop)
                    return
                forward = p.forward_seconds()
                floats = [t for t in tree_leaves(out)
                          if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
                with backward_timing(p) as backward:
                    if floats:
                        torch.stack([t.float().sum() for t in floats]).sum().backward()
            if opt is not None:
                self.clock.sync()
                a = self.clock.mark()
                opt.step()
                opt.zero_grad(set_to_none=True)
                b = self.clock.mark()
                self.clock.sync()
                if timed:
                    opt_samples.append(self.clock.seconds(a, b))
            if timed:
                self._add("train_forward", forward)
                self._add("backward", {op: backward.get(op, 0.0) for op in forward})
                self.result.passes += 1
                if done == warmup:
                    total = warmup + self._count(self.options.repeats, time.perf_counter() - started)
            done += 1
            self._report(done, total, f"{self.dev} training")
        if opt_samples:
            reading = self.meter.reading()   # flushed below: the same span as the training samples
            self.cache.put(self.env, "optimizer", opt_sig, opt_samples, busy=reading.busy, load=reading.load)
        self._optimizer_rate(name, opt_sig, nbytes)

    def _optimizer_rate(self, name: str, signature: str, nbytes: int) -> None:
        entry = self.cache.get(self.env, "optimizer", signature)
        if entry is not None and entry.seconds is not None and nbytes:
            self.result.optimizer_s_per_byte[name] = entry.seconds / nbytes

    # -- samples --------------------------------------------------------------------------------

    def _add(self, kind: str, seconds: Mapping[str, float]) -> None:
        """Samples of one pass, by signature (ops sharing a signature pool their samples)."""
        for op, s in seconds.items():
            sig = self.signatures.get(op)
            if sig is not None and op not in self.failed:
                self.pending.setdefault((kind, sig), []).append(s)
        if time.perf_counter() - self.last_save > _SAVE_EVERY_S:
            self.flush()
            _save(self.cache)

    def flush(self) -> None:
        """Move pending samples (and failures) into the cache, with the load over the span they were taken in."""
        if self.pending:
            reading = self.meter.reading()
            self.result.load = reading
            for (kind, sig), samples in self.pending.items():
                self.sampled.add((kind, sig))
                self.cache.put(self.env, kind, sig, samples, busy=reading.busy, load=reading.load)
                self.kept += len(samples)
            self.pending.clear()
            self.meter.restart()
        for op, reason in self.failed.items():
            if op in self.signatures:
                self.cache.put(self.env, "forward", self.signatures[op], unsupported=reason)
        self.last_save = time.perf_counter()

    def _collect(self, kinds: tuple[str, ...]) -> None:
        self.flush()
        field = {"forward": "forward_s", "train_forward": "train_forward_s", "backward": "backward_s"}
        from_cache: set[tuple[str, str]] = set()
        for op, sig in self.signatures.items():
            times = OpTimes(sig)
            for kind in kinds:
                entry = self.cache.get(self.env, kind, sig)
                if entry is not None and entry.seconds is not None and op not in self.failed:
                    setattr(times, field[kind], entry.seconds)
                    if (kind, sig) not in self.sampled:
                        from_cache.add((kind, sig))
                    if entry.busy:
                        self.result.busy.add(op)
            self.result.ops[op] = times
        self.result.cached = len(from_cache)
        self.result.stale = self.cache.stale - self.stale_before

    def _report(self, done: int, total: int, what: str) -> None:
        if self.progress is not None:
            self.progress(done, total, what)


def _on_device(gm: torch.fx.GraphModule, dev: torch.device, *, copy_always: bool) -> torch.fx.GraphModule:
    """``gm`` on ``dev``: itself when every tensor is already there, else a deep copy moved there."""
    tensors = [*gm.parameters(), *gm.buffers()]
    if not copy_always and all(t.device == dev for t in tensors):
        return gm
    with warnings.catch_warnings():  # torch warns about its own pytree specs when they are copied
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(gm).to(dev)


def _args_on(args: tuple, dev: torch.device) -> tuple:
    return tuple(tree_map(lambda v: v.to(dev) if isinstance(v, torch.Tensor) else v, a) for a in args)
