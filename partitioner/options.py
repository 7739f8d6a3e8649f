"""What a plan is asked: one frozen, validated record of every option ``partition`` takes.

In: keyword arguments (``partition(model, inputs, devices, memory=..., training=True)``), an
existing record, a plan's recorded request, or the flags of ``hetpart plan``. Out: a
:class:`PlanOptions`, validated once when it is made (a value of the wrong kind, a value out of
range, or a combination that cannot be planned is refused there, the message naming both
options), which the planner, the fallback plans, the batch fit, the compile backend and the CLI
all read. Derived requests are made with :meth:`PlanOptions.replace` (``dataclasses.replace`` on
the sections, validated again).

The record has sections for what belongs together (``hardware``, ``search``, ``constraints``,
``train``, ``pipeline``, ``source``) and top-level fields for single choices (``objective``,
``precision``, ``batch``, ``fallbacks``, ``costs``). Every leaf field has a name unique across
the record, which is its keyword in ``partition`` and in ``torch.compile``'s options, and its
metadata: one line of documentation, the CLI flag that sets it (``dest`` of the flag is the field
name), and whether it applies to the compile backend (or why not). ``help(partition)``, the
README's options list, the CLI's flag table and the compile backend's unknown-option error are
produced from that metadata (:func:`describe_options`, :func:`options_table`).

Adding an option is one field here (plus its CLI flag, whose ``dest`` is the field's name), read
where the planner's pass needs it.

Example:
    >>> opts = PlanOptions.build(devices="h200-host", memory={"cuda:0": "2GB"}, training=True)
    >>> opts.hardware.memory, opts.train.optimizer
    ({'cuda:0': '2GB'}, 'adam')
    >>> opts.replace(optimizer="sgd").train.optimizer
    'sgd'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from partitioner.errors import HetpartError

#: The longest solve a time limit may ask for (a week): beyond it a limit is a mistake.
MAX_TIME_LIMIT = 7 * 24 * 3600.0


class UnknownOption(HetpartError, TypeError):
    """A keyword that is no field of :class:`PlanOptions` (a TypeError too, as for any function)."""


def _field(default: Any = dataclasses.MISSING, *, doc: str, flag: str | None, compile: bool | str = True,
           recorded: bool = True, factory: Callable[[], Any] | None = None) -> Any:
    """A leaf option: its default, one line of documentation, the CLI flag that sets it (or how
    the CLI sets it, in words), whether the compile backend takes it (True, or why not), and
    whether a plan records it."""
    meta = {"doc": doc, "flag": flag, "compile": compile, "recorded": recorded}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """The devices a plan is made for and their memory caps."""

    devices: Any = _field("h200-host", flag="--devices", doc=(
        "a built-in profile name, a TOML path or a DeviceSet; 'detect' (this machine) or 'detect:NAME' caps each "
        "accelerator at the memory free now"))
    memory: Any = _field(None, flag="--memory", doc="caps below the profile, e.g. {'cuda:0': '2GB'}")
    detect_margin: Any = _field(0.05, flag="--detect-margin", doc=(
        "with devices 'detect[:NAME]': memory left free on each accelerator, a share (0.05, '5%') or a size ('2GiB')"))


@dataclasses.dataclass(frozen=True)
class Search:
    """Which solver and how long it may search."""

    solver: Any = _field("auto", flag="--solver", doc=(
        "'auto' (HiGHS if installed, else CBC), 'highs', 'cbc', or a baseline ('greedy', 'sequential-fill', "
        "'heft', 'single:DEVICE'; pipelines: 'pipeline-dp' and the splits of partitioner.solvers.pipeline_baselines; "
        "with splits: 'hetegen', 'megatron'; "
        "generation: 'llama.cpp --fit', 'llama.cpp -ot exps=CPU', 'greedy', 'one placement')"))
    time_limit: Any = _field(60.0, flag="--time-limit", doc=(
        "seconds for everything after capture (coarsening, baselines, the lower bound and the ILP); at the limit "
        "the best placement found is returned with its proven gap"))
    gap: Any = _field(0.01, flag="--gap", doc="the relative optimality gap at which the ILP stops (0.01 for 1%)")
    coarsen: Any = _field("auto", flag="--coarsen", doc=(
        "'auto' (views folded into their producers; above a size threshold, ops grouped by module), True (group "
        "now) or False (every op on its own)"))
    progress: Any = _field(None, flag="(the CLI prints the solver's progress itself)", recorded=False,
                           compile="torch.compile reports nothing while it compiles", doc=(
                               "called with the ILP's progress (incumbent, bound, gap) while it solves"))


@dataclasses.dataclass(frozen=True)
class Constraints:
    """What restricts where ops may go."""

    pins: Any = _field(None, flag="--pin", doc="module-path globs or op names -> device, e.g. {'emb*': 'cpu'}")
    streaming: Any = _field(True, flag="--no-streaming", doc=(
        "allow weights to stay in host memory and be streamed in with prefetch (inference plans of torch models)"))
    no_split: Any = _field((), flag="(set from the model: a zoo model's no-split classes)", doc=(
        "module classes the 'greedy' baseline keeps whole (accelerate's no_split_module_classes)"))
    align_modules: Any = _field((), flag="--align-modules", doc=(
        "module classes every solver keeps whole (each instance on one device), so the plan exports as a device_map"))
    link_budget: Any = _field(None, flag="--link-budget", doc=(
        "bytes per step a link may carry, e.g. {'cpu<->cuda:0': 10**9}"))
    contiguous_stages: Any = _field(False, flag="--contiguous-stages", doc=(
        "devices in profile order form contiguous stages (every edge goes forward in that order)"))
    device_map_pins: Any = _field(None, flag="--device-map", compile="give the modules as pins (module-path globs)",
                                  doc=(
        "a hand-made accelerate device_map as pins, e.g. {'model.embed_tokens': 'cpu', 'model.layers.0': 0}: each "
        "module (and all under it; the longest key wins) is fixed there, the rest is placed by the solver"))


@dataclasses.dataclass(frozen=True)
class Train:
    """Whether a training step is planned, and what its optimizer costs."""

    training: Any = _field(False, flag="--training", doc=(
        "plan a training step (backward, gradients, optimizer state and step); the compile backend's None decides "
        "per graph (grad mode on and a parameter that requires grad)"))
    optimizer: Any = _field("adam", flag="--optimizer", doc=(
        "the optimizer whose state and step a training plan costs: sgd, sgd-momentum, adam, adamw, adagrad, or "
        "sparse-adam (torch.optim.SparseAdam's lazy rows for embeddings, Adam elsewhere)"))
    placed_optimizer: Any = _field(True, flag="(plan.emit_optimizer runs it; the compile backend does not)",
                                   compile="the compile backend trains with your own optimizer, stepped after backward where each parameter lives", doc=(
        "training: the step runs hetpart's placed optimizer (plan.emit_optimizer), which may keep optimizer state "
        "on the host and step it beside backward; False prices each step after backward where its weights live"))
    offload: Any = _field(True, flag="--no-offload", compile="the compile backend trains with your own optimizer, stepped after backward where each parameter lives", doc=(
        "training: the plan may keep a parameter's optimizer state, gradient and step on the host while its "
        "weights stay on the computing device"))
    recompute: Any = _field(True, flag="--no-recompute", compile="the compile backend trains with your own optimizer, stepped after backward where each parameter lives", doc=(
        "training: the plan may recompute a node's activations in backward instead of saving them"))
    save_on_host: Any = _field(True, flag="--no-save-on-host", compile="the compile backend trains with your own optimizer, stepped after backward where each parameter lives", doc=(
        "training: the plan may hold a node's saved activations in host memory instead of on its accelerator "
        "(copied out in forward and back in backward, beside compute)"))
    sparse_updates: Any = _field(True, flag="--dense-updates", compile="the compile backend trains with your own optimizer, stepped after backward where each parameter lives", doc=(
        "training: an embedding's table may update only the rows a batch touches where that equals the dense "
        "update (sgd, adagrad) or is asked for (sparse-adam)"))
    delayed_update: Any = _field(False, flag="--delayed-update", compile="the compile backend trains with your own optimizer, stepped after backward where each parameter lives", doc=(
        "training: run the host's optimizer step of one iteration beside the next one (ZeRO-Offload's one-step "
        "delayed update); it changes the training, so only when asked, and the plan says so"))


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """Pipeline stages (partitioner.solvers.pipeline); all None: no pipeline unless the profile is a cluster."""

    micro_batches: Any = _field(None, flag="--micro-batches", compile="a compiled graph runs in one process", doc=(
        "micro-batches per step (the example inputs are one step's batch)"))
    schedule: Any = _field(None, flag="--schedule", compile="a compiled graph runs in one process",
                           doc="'gpipe' or '1f1b' (default)")
    stages: Any = _field(None, flag="--stages", compile="a compiled graph runs in one process",
                         doc="exactly this many stages (default: the best)")


@dataclasses.dataclass(frozen=True)
class Generate:
    """Generation (partitioner.generation_planner): a prefill and a decode step with a static KV cache, one plan."""

    generate: Any = _field(False, flag="--generate", compile="a compiled graph is one forward pass: plan generation "
                           "with plan_generation", doc=(
        "plan generation: a prefill placement (at prompt_tokens) and a decode-step placement (one token, the KV cache "
        "at its full size), solved together with shared memory; made by plan_generation (partition refuses it)"))
    prompt_tokens: Any = _field(512, flag="--prompt-tokens", compile="a compiled graph is one forward pass: plan "
                                "generation with plan_generation", doc=(
        "generation: the prompt length the prefill is planned for (shorter prompts run padded)"))
    new_tokens: Any = _field(128, flag="--new-tokens", compile="a compiled graph is one forward pass: plan generation "
                             "with plan_generation", doc=(
        "generation: tokens generated per request; the cache holds prompt_tokens + new_tokens"))
    sequences: Any = _field(1, flag="--batch", compile="a compiled graph is one forward pass: plan generation with "
                            "plan_generation", doc="generation: sequences decoded together (the cache's batch)")
    generation_objective: Any = _field("request", flag="--generation-objective", compile="a compiled graph is one "
                                       "forward pass: plan generation with plan_generation", doc=(
        "generation: what to minimise: 'request' (prefill + new_tokens - 1 decode steps), 'decode' (time per decode "
        "step) or 'prefill' (time of the prefill)"))


@dataclasses.dataclass(frozen=True)
class Source:
    """How the model becomes a graph."""

    capture: Any = _field("export", flag="--capture", compile="dynamo hands the backend its graph", doc=(
        "'export' (torch.export) or 'symbolic_trace' (torch.fx)"))
    model_name: Any = _field(None, flag="(the MODEL argument)", compile="named after the compiled model", doc=(
        "the name the plan carries (default: the model's class)"))
    dynamic_shapes: Any = _field(None, flag="--dynamic", compile="dynamo recompiles per shape", doc=(
        "input dimensions the emitted module may be called with at other sizes: ('batch', 'seq'), {'len': 2}, or one "
        "{dim: name} per input; costed at the example sizes"))
    input_shapes: Any = _field(None, flag="--input-shape", compile="ONNX models and model folders only", doc=(
        "ONNX models: static shapes of inputs with symbolic dimensions, {'input': (1, 3, 224, 224)}; a model folder: "
        "shapes of its forward's inputs, {'input_ids': (1, 512)} (default: input_ids of 1 x 128 tokens)"))
    folder_dtype: Any = _field(None, flag="--dtype", compile="the compiled model is already built", doc=(
        "a model folder: the dtype it is built, planned and loaded in, e.g. 'bf16' (default: config.json's; "
        "weights stored in another dtype are cast while loading)"))
    trust_remote_code: Any = _field(False, flag="--trust-remote-code", recorded=False,
                                    compile="the compiled model is already built", doc=(
        "a model folder whose config.json names its own modeling code (auto_map): allow building it (runs that code)"))


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """Everything a plan is asked (see the module docstring); made with :meth:`build`."""

    hardware: Hardware = dataclasses.field(default_factory=Hardware)
    objective: Any = _field("latency", flag="--objective", doc=(
        "'latency' (one sample, ops one after another), 'throughput' (pipelined: the slowest device or link sets "
        "the pace) or 'makespan' (one sample, devices concurrent)"))
    search: Search = dataclasses.field(default_factory=Search)
    constraints: Constraints = dataclasses.field(default_factory=Constraints)
    train: Train = dataclasses.field(default_factory=Train)
    pipeline: Pipeline = dataclasses.field(default_factory=Pipeline)
    generation: Generate = dataclasses.field(default_factory=Generate)
    precision: Any = _field(None, flag="--precision", compile="the compile backend runs float32 plans only", doc=(
        "the dtype each device computes in: 'auto' (the solver chooses per op) or {'cuda:0': 'bf16', 'cpu': 'fp32'}; "
        "softmax, norms, reductions and losses stay float32; {'weights': 'int8'} (or int4, fp8, auto) packs linear "
        "weights for inference; latency and throughput objectives only"))
    splits: Any = _field(None, flag="--split", compile="the compile backend runs whole-op plans only", doc=(
        "inference: a linear may be split over devices by output columns or by its reduction dimension, "
        "chosen by the solver: True (offered fractions 0.25, 0.5, 0.75, each pair's rate-proportional one and the "
        "one whose branches end together, both axes; and degrees 4 and 8 where a host has that many like devices, "
        "in even shares), 'cols:0.5', 'cols,rows@8' (degrees after '@') or {'fractions': [...], 'axes': ['cols'], "
        "'degrees': [2, 8]}; axis "
        "'time' adds time splits (a linear computed on one accelerator from its weight's row chunks streamed from "
        "the host, a fused experts op from groups of its experts: 'cols,time', 'time:8/16' or {'axes': ['time'], "
        "'chunks': [8, 16]}); axes 'table' (an embedding's table rows) and 'batch' (elementwise ops and norms by rows) "
        "add splits of those ops: 'cols,rows,table,batch'; axis 'experts' divides a fused experts op's experts between "
        "two devices ('experts', 'cols,rows,experts,time'); None: every op whole"))
    batch: Any = _field(None, flag="hetpart fit --micro-batch", compile="a compiled graph runs the batch it is given",
                        doc=("size the micro-batch from memory (training): 'auto' (the largest dividing the example "
                             "batch that fits) or a micro-batch; the plan records the accumulation steps"))
    fallbacks: Any = _field(None, flag="--fallbacks", compile="backends.torch.emit_live runs fallback plans", doc=(
        "fractions in (0, 1), e.g. [0.75, 0.5]: plans solved ahead of time with each accelerator's memory at that "
        "share, run by backends.torch.emit_live when the free memory shrinks"))
    source: Source = dataclasses.field(default_factory=Source)
    costs: Any = _field("analytic", flag="--costs", compile="the backend prices a graph with the profile (measure "
                        "a model's ops with hetpart profile and plan it ahead)", doc=(
        "'analytic' (the profile's roofline), 'profiled' (measure the model's ops here, cached), a costs file from "
        "hetpart profile, or a cost_models.costs.CostModel"))

    def __post_init__(self) -> None:
        _validate(self)

    # -- making and deriving ---------------------------------------------------------------

    @classmethod
    def build(cls, options: PlanOptions | None = None, /, **keywords: Any) -> PlanOptions:
        """``options`` (default: every default) with the given fields replaced.

        Raises:
            UnknownOption: a keyword that is no option (the message lists them).
            HetpartError: a bad value or combination (see the module docstring).

        Example:
            >>> PlanOptions.build(objective="throughput").objective
            'throughput'
        """
        if options is not None and not isinstance(options, PlanOptions):
            raise HetpartError(f"options={options!r}: expected a PlanOptions record, e.g. "
                               f"options=PlanOptions.build(memory={{'cuda:0': '2GB'}})")
        base = options if options is not None else cls()
        return base.replace(**keywords) if keywords else base

    def replace(self, **keywords: Any) -> PlanOptions:
        """A new record with the given leaf fields replaced (validated again).

        Example:
            >>> PlanOptions.build().replace(training=True, optimizer="sgd").train.training
            True
        """
        unknown = sorted(k for k in keywords if k not in FIELDS)
        if unknown:
            raise UnknownOption(f"unknown option {', '.join(map(repr, unknown))}: the options are "
                                f"{', '.join(FIELDS)}")
        by_section: dict[str | None, dict[str, Any]] = {}
        for name, value in keywords.items():
            by_section.setdefault(FIELDS[name], {})[name] = value
        changes = dict(by_section.pop(None, {}))
        for section, values in by_section.items():
            changes[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **changes)

    def get(self, name: str) -> Any:
        """The value of leaf field ``name``, wherever its section is."""
        section = FIELDS[name]
        return getattr(getattr(self, section) if section else self, name)

    def flat(self) -> dict[str, Any]:
        """Every leaf field by name."""
        return {name: self.get(name) for name in FIELDS}

    def explicit(self) -> dict[str, Any]:
        """The leaf fields that differ from their defaults (what was asked)."""
        default = PlanOptions()
        return {name: value for name, value in self.flat().items() if _differs(value, default.get(name))}

    # -- the plan's record of it ------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """The request as a plan records it: every recorded field, as JSON values (a DeviceSet by
        its name, a cost model by its description)."""
        return {name: _jsonable(value) for name, value in self.flat().items() if META[name]["recorded"]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PlanOptions:
        """The record a plan's ``request`` section stands for (see :meth:`to_record`).

        Example:
            >>> PlanOptions.from_record(PlanOptions.build(gap=0.05).to_record()).search.gap
            0.05
        """
        values = dict(record)
        for name in ("no_split", "align_modules"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        if isinstance(values.get("dynamic_shapes"), list):
            values["dynamic_shapes"] = tuple(values["dynamic_shapes"])
        return cls.build(**values)

    def describe(self) -> str:
        """One line of what was asked beyond the defaults: ``memory cuda:0=2GB, training True``."""
        asked = {k: v for k, v in self.explicit().items() if META[k]["recorded"]}
        if not asked:
            return "defaults"
        return ", ".join(f"{name} {_shown(value)}" for name, value in asked.items())


SECTIONS: dict[str, type] = {"hardware": Hardware, "search": Search, "constraints": Constraints, "train": Train,
                             "pipeline": Pipeline, "generation": Generate, "source": Source}


def _leaves() -> Iterator[tuple[str | None, dataclasses.Field]]:
    for f in dataclasses.fields(PlanOptions):
        if f.name in SECTIONS:
            for leaf in dataclasses.fields(SECTIONS[f.name]):
                yield f.name, leaf
        else:
            yield None, f


#: leaf field name -> its section (None: a top-level field)
FIELDS: dict[str, str | None] = {leaf.name: section for section, leaf in _leaves()}
#: leaf field name -> its metadata (doc, flag, compile, recorded) and default
META: dict[str, dict[str, Any]] = {
    leaf.name: {**leaf.metadata, "default": leaf.default if leaf.default is not dataclasses.MISSING else None}
    for _, leaf in _leaves()
}


# -- validation --------------------------------------------------------------------------------


def check_limits(time_limit: Any, gap: Any, names: tuple[str, str] = ("time_limit", "gap")) -> None:
    """Raise unless ``time_limit`` is a number of seconds in (0, a week] and ``gap`` a fraction in [0, 1).

    ``names`` are the names the message uses (``("--time-limit", "--gap")`` on the command line).

    Raises:
        HetpartError: names the parameter, the value and the valid range.

    Example:
        >>> check_limits(60, 0.01)
    """
    def number(value: Any) -> float | None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None

    t, g = number(time_limit), number(gap)
    if t is None or not 0 < t <= MAX_TIME_LIMIT:
        raise HetpartError(f"{names[0]} {time_limit!r}: expected seconds above 0 and at most "
                           f"{MAX_TIME_LIMIT:g} (a week), e.g. {names[0]} 60")
    if g is None or not 0 <= g < 1:
        raise HetpartError(f"{names[1]} {gap!r}: expected a relative optimality gap from 0 (prove optimal) "
                           f"up to but not including 1, e.g. {names[1]} 0.01")


def check_fractions(fractions: Any) -> tuple[float, ...]:
    """The fallback fractions as floats, each in (0, 1), no repeats; else a HetpartError.

    Example:
        >>> check_fractions([0.75, 0.5])
        (0.75, 0.5)
    """
    if fractions is None:
        return ()
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Sequence):
        raise HetpartError(f"fallbacks {fractions!r}: expected a list of fractions, e.g. fallbacks=[0.75, 0.5]")
    out = []
    for f in fractions:
        ok = isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < 1
        if not ok:
            raise HetpartError(f"fallback fraction {f!r} is outside (0, 1): each fallback plan gets that share of "
                               f"the primary plan's accelerator memory, e.g. fallbacks=[0.75, 0.5]")
        if float(f) in out:
            raise HetpartError(f"fallback fraction {f!r} is given twice; list each level once")
        out.append(float(f))
    return tuple(out)


def objective_of(value: Any) -> Any:
    """The :class:`~partitioner.solvers.problem.Objective` named by ``value``; else a HetpartError."""
    from partitioner.solvers.problem import Objective

    try:
        return Objective(value)
    except ValueError:
        raise HetpartError(
            f"unknown objective {value!r}: use one of {', '.join(o.value for o in Objective)}"
        ) from None


def _validate(opts: PlanOptions) -> None:
    """Every check that needs no model and no profile (see the module docstring)."""
    from cost_models.training import Optimizer

    hw, search, cons, train, pipe, src = (opts.hardware, opts.search, opts.constraints, opts.train, opts.pipeline,
                                         opts.source)
    _check("devices", hw.devices, _is_devices(hw.devices),
           "a built-in profile name (e.g. 'h200-host'), the path of a TOML profile or a DeviceSet")
    _mapping("memory", hw.memory, (int, str), 'a byte count: an integer or a string such as "8GB"', "{'cuda:0': '8GB'}")
    _check("detect_margin", hw.detect_margin, _number(hw.detect_margin) or isinstance(hw.detect_margin, str),
           "a share (0.05, '5%') or a size ('2GiB')")
    _checked("objective", lambda: objective_of(opts.objective))
    _check("solver", search.solver, isinstance(search.solver, str) and bool(search.solver),
           "a solver name, e.g. 'auto', 'highs' or 'greedy'")
    _checked("time_limit", lambda: check_limits(search.time_limit, 0.0), "must be a positive number of seconds")
    _checked("gap", lambda: check_limits(1.0, search.gap), "must be a fraction in [0, 1)")
    _one_of("coarsen", search.coarsen, ("auto", "on", "off", True, False), "'auto', True or False")
    _check("progress", search.progress, search.progress is None or callable(search.progress), "a function or None")
    _mapping("pins", cons.pins, (str,), 'a device name such as "cpu"', "{'emb*': 'cpu'}")
    _one_of("streaming", cons.streaming, (True, False), "True or False")
    for name in ("no_split", "align_modules"):
        value = getattr(cons, name)
        ok = isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(c, str) for c in value)
        _check(name, value, ok, "a list of module class names, e.g. ['Block']")
    _mapping("link_budget", cons.link_budget, (int,), "a number of bytes", "{'cpu<->cuda:0': 1000000000}")
    _one_of("contiguous_stages", cons.contiguous_stages, (True, False), "True or False")
    _check("device_map_pins", cons.device_map_pins, cons.device_map_pins is None or (
        isinstance(cons.device_map_pins, Mapping) and all(isinstance(k, str) for k in cons.device_map_pins)),
        "an accelerate device_map: module path -> GPU index or device name, e.g. {'model.layers.0': 0}")
    _one_of("trust_remote_code", src.trust_remote_code, (True, False), "True or False")
    _check("folder_dtype", src.folder_dtype, src.folder_dtype is None or isinstance(src.folder_dtype, str),
           "a dtype name such as 'bf16' or 'float32'")
    _one_of("training", train.training, (True, False, None), "True, False or None (decide per graph)")
    _one_of("optimizer", getattr(train.optimizer, "value", train.optimizer), tuple(o.value for o in Optimizer),
            "one of " + ", ".join(o.value for o in Optimizer))
    for name in ("placed_optimizer", "offload", "recompute", "save_on_host", "sparse_updates", "delayed_update"):
        _one_of(name, getattr(train, name), (True, False), "True or False")
    for name in ("micro_batches", "stages"):
        value = getattr(pipe, name)
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        _check(name, value, ok, "a whole number of at least 1")
    _one_of("schedule", getattr(pipe.schedule, "value", pipe.schedule), (None, "gpipe", "1f1b"), "'gpipe' or '1f1b'")
    _check("capture", src.capture, isinstance(src.capture, str), "'export' or 'symbolic_trace'")
    _check("model_name", src.model_name, src.model_name is None or isinstance(src.model_name, str), "a name")
    gen = opts.generation
    _one_of("generate", gen.generate, (True, False), "True or False")
    for name in ("prompt_tokens", "new_tokens", "sequences"):
        value = getattr(gen, name)
        _check(name, value, isinstance(value, int) and not isinstance(value, bool) and value >= 1,
               "a whole number of at least 1")
    _one_of("generation_objective", gen.generation_objective, ("request", "decode", "prefill"),
            "'request', 'decode' or 'prefill'")
    from partitioner.solvers.splits import resolve_splits

    _checked("splits", lambda: resolve_splits(opts.splits))
    fractions = check_fractions(opts.fallbacks)
    _combinations(opts, objective_of(opts.objective), fractions)


def _combinations(opts: PlanOptions, objective: Any, fractions: tuple[float, ...]) -> None:
    """Refuse what cannot be planned together, naming both options."""
    from partitioner.solvers.problem import Objective

    pipe = opts.pipeline
    asked = [n for n in ("micro_batches", "schedule", "stages") if getattr(pipe, n) is not None]
    batch = opts.batch
    if batch is not None:
        if not (batch == "auto" or (isinstance(batch, int) and not isinstance(batch, bool))):
            raise HetpartError(f"batch={batch!r}: expected 'auto' (the largest micro-batch that fits) or a whole "
                               f"number (the micro-batch), e.g. batch='auto'")
        if not opts.train.training:
            raise HetpartError("batch sizing accumulates gradients over micro-batches: it plans training steps; "
                               "pass training=True (CLI: --training)")
        refused = asked + (["dynamic_shapes"] if opts.source.dynamic_shapes is not None else [])
        if refused:
            raise HetpartError(f"batch sizing plans one micro-batch per step and accumulates; it does not combine "
                               f"with {', '.join(refused)} (pipeline stages split the batch themselves): drop them")
    if asked and objective is not Objective.THROUGHPUT:
        raise HetpartError(f"--micro-batches, --schedule and --stages plan pipeline stages, whose objective is "
                           f"throughput; got --objective {objective.value}: use --objective throughput")
    if opts.generation.generate:
        refused = [name for name, on in (("training", opts.train.training), ("pipeline stages", asked),
                                          ("batch sizing", batch is not None), ("fallbacks", fractions),
                                          ("dynamic_shapes", opts.source.dynamic_shapes is not None)) if on]
        if refused:
            raise HetpartError(f"a generation plan places one prefill and one decode step for inference; it does not "
                               f"combine with {', '.join(refused)}: drop {'it' if len(refused) == 1 else 'them'}")
    if opts.splits not in (None, False, "off"):
        refused = [name for name, on in (("training", opts.train.training), ("precision", opts.precision is not None),
                                          ("pipeline stages", asked), ("generate", opts.generation.generate),
                                          ("objective makespan", objective is Objective.MAKESPAN),
                                          ("fallbacks", fractions)) if on]
        if refused:
            raise HetpartError(f"splits are planned for inference with the latency or throughput objective; they do "
                               f"not combine with {', '.join(refused)} yet: drop splits (CLI: --split) or "
                               f"{'it' if len(refused) == 1 else 'them'}")
    if fractions and asked:
        raise HetpartError("fallback plans are not made for pipeline plans (each stage is a process of its own); "
                           "drop fallbacks, or plan without stages")
    if opts.precision is not None and (asked or objective is Objective.MAKESPAN):
        from cost_models.precision import PrecisionError

        raise PrecisionError("precision is planned for the latency and throughput objectives without pipeline "
                             "stages (the makespan and pipeline models do not price 16-bit copies and casts): "
                             "drop precision, or plan with objective 'latency' or 'throughput'")
    if opts.train.training and _packs(opts.precision):
        from cost_models.precision import PrecisionError

        raise PrecisionError("precision weights=... packs linear weights for inference, but training=True: a training "
                             "step updates float32 master weights; drop weights from precision (16-bit compute "
                             "is planned for training: precision={'cuda:0': 'bf16'} or 'auto')")


def _packs(precision: Any) -> bool:
    """Whether a precision setting asks for packed weights (a ``weights`` key)."""
    if isinstance(precision, str) and precision.strip().lower() != "auto":
        return any(item.strip().startswith("weights=") for item in precision.split(","))
    return isinstance(precision, Mapping) and precision.get("weights") is not None


class OptionError(HetpartError, ValueError):
    """A value of the wrong kind or out of range for an option (the message names the option)."""


def _check(name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise OptionError(f"option {name!r} must be {expected}; got {value!r}")


def _checked(name: str, check: Callable[[], Any], rule: str = "") -> None:
    """Run a check that has a sentence of its own (a limit, an objective), naming the option and its rule first."""
    try:
        check()
    except HetpartError as err:
        raise OptionError(f"option {name!r}{' ' + rule if rule else ''}: {err}") from None


def _same(value: Any, choice: Any) -> bool:
    """``value`` is ``choice``: True is not 1, "1" is not 1 (a str enum such as ``Objective`` is its value)."""
    if choice is None or isinstance(choice, bool):
        return value is choice
    return isinstance(value, type(choice)) and value == choice


def _one_of(name: str, value: Any, choices: tuple[Any, ...], expected: str) -> None:
    _check(name, value, any(_same(value, c) for c in choices), expected)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(name: str, value: Any, kinds: tuple[type, ...], expected: str, example: str) -> None:
    """None, or a dict of non-empty string keys to values of ``kinds`` (never a bool)."""
    if value is None:
        return
    _check(name, value, isinstance(value, Mapping), f"a dict, e.g. {example}")
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise OptionError(f"option {name!r}: key {key!r} must be a non-empty string, e.g. {example}")
        if isinstance(item, bool) or not isinstance(item, kinds):
            raise OptionError(f"option {name!r}: the value for {key!r} must be {expected}; got {item!r}")


def _is_devices(value: Any) -> bool:
    from cost_models.profiles import DeviceSet

    return isinstance(value, DeviceSet) or (isinstance(value, str) and bool(value))


def _differs(value: Any, default: Any) -> bool:
    if value is None or default is None:
        return value is not default
    try:
        return bool(value != default)
    except Exception:  # noqa: BLE001 - a value whose comparison fails (a tensor) differs
        return True


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and isinstance(value.value, str):  # an Enum (Objective, Schedule)
        return value.value
    name = getattr(value, "name", None)
    if isinstance(name, str):  # a DeviceSet
        return name
    describe = getattr(value, "describe", None)
    return describe() if callable(describe) else type(value).__name__


def _shown(value: Any) -> str:
    value = _jsonable(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


# -- documentation produced from the record ----------------------------------------------------


def describe_options(indent: str = "    ") -> str:
    """Every option with its default and one line: the ``Parameters`` of ``help(partition)``."""
    lines = []
    for name, meta in META.items():
        lines.append(f"{indent}{name} (default {meta['default']!r}): {meta['doc']}")
    return "\n".join(lines)


def options_table() -> str:
    """The README's options list: option, CLI flag, torch.compile, what it means (Markdown)."""
    rows = ["| option | CLI | torch.compile | what it asks |", "| --- | --- | --- | --- |"]
    for name, meta in META.items():
        flag = meta["flag"]
        flag = f"`{flag}`" if flag and flag.startswith(("-", "hetpart")) else flag or ""
        compile_ = "yes" if meta["compile"] is True else f"no: {meta['compile']}"
        rows.append(f"| `{name}` | {flag} | {compile_} | {meta['doc'].replace('|', '/')} |")
    return "\n".join(rows)


__all__ = ["FIELDS", "MAX_TIME_LIMIT", "META", "OptionError", "PlanOptions", "UnknownOption", "check_fractions", "check_limits", "describe_options",
           "objective_of", "options_table"]
