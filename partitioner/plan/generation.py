"""The generation plan: one placement for the prefill and one for the decode step, solved together.

In: the two phase plans (each a :class:`~partitioner.plan.record.Plan` of the same
:class:`~partitioner.frontends.decode_step.DecodeStep`, captured at the prompt length and at one
token), the request planned for, the predicted times, the solver's certificate for the pair and the
baselines costed for both phases; or a generation plan file (:meth:`GenerationPlan.load`).
Out: a frozen :class:`GenerationPlan`, its JSON, a side-by-side summary, and the ``generate`` loop
that runs it (:meth:`GenerationPlan.emit_generate`, from :mod:`backends.torch.generate`).

What both phases share is what lives in memory: every parameter and every cache buffer has one
home (its op's device, or the host when that op streams it) in both phases, checked when a plan is
built or read. Where each op computes, and which weights stream, may differ per phase. A plan made
with ``precision`` records it in each phase plan's ``precision`` section (16-bit ops, and packed
weights with their bytes: :mod:`partitioner.plan.precision`); both phases were planned with one
setting, and each parameter is stored in one form for both (:func:`stored_forms`: float32, 16
bits, or packed), also checked when a plan is built or read.

The file::

    {"format": "hetpart.generation-plan", "version": 1,
     "request": {"prompt_tokens": 512, "new_tokens": 128, "batch": 1, "max_context": 640,
                 "objective": "request"},
     "predicted": {"prefill_s": ..., "decode_s": ..., "request_s": ...,
                   "prefill_tokens_per_s": ..., "decode_tokens_per_s": ...},
     "solver": {...SolverInfo of the pair, its objective and bound in the objective's seconds...},
     "baselines": {"llama.cpp --fit": {"prefill_s": ..., "decode_s": ..., "request_s": ...,
                                       "feasible": true, "note": "..."}, ...},
     "phases": {"prefill": {...a plan...}, "decode": {...a plan...}}}

Example:
    >>> gen = GenerationPlan.load("plan.json")                          # doctest: +SKIP
    >>> print(gen.summary())                                           # doctest: +SKIP
    >>> generator = gen.emit_generate(model, {"cuda:0": "cpu"})        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from partitioner.errors import HetpartError
from partitioner.files import read_text, refuse_overwrite, write_atomic
from partitioner.plan.fields import FieldReader, parse_json
from partitioner.plan.phase_homes import param_homes, stored_forms
from partitioner.plan.record import MAX_PLAN_BYTES, Plan
from partitioner.plan.values import PlanFormatError, SolverInfo

__all__ = ["FORMAT", "GENERATION_OBJECTIVES", "GenerationPlan", "is_generation_dict", "objective_seconds",
           "param_homes", "stored_forms"]

FORMAT = "hetpart.generation-plan"
VERSION = 1
#: what a generation plan minimises: the time of one request (prefill + every decode step), or one
#: phase's time per token (the other phase only breaks ties)
GENERATION_OBJECTIVES = ("request", "decode", "prefill")
#: the weight of the other phase when one phase is the objective: it only chooses among equal plans
TIE_WEIGHT = 1e-3
_REQUEST_KEYS = ("prompt_tokens", "new_tokens", "batch", "max_context", "objective")
_PREDICTED_KEYS = ("prefill_s", "decode_s", "request_s", "prefill_tokens_per_s", "decode_tokens_per_s")
_BASELINE_KEYS = ("prefill_s", "decode_s", "request_s", "feasible", "note")


def objective_seconds(objective: str, new_tokens: int) -> tuple[float, float]:
    """The weights of (prefill seconds, decode-step seconds) in the objective: a request runs the
    prefill once and ``new_tokens - 1`` decode steps (the prefill's logits give the first token).

    Example:
        >>> objective_seconds("request", 128)
        (1.0, 127.0)
    """
    if objective not in GENERATION_OBJECTIVES:
        raise HetpartError(f"generation objective {objective!r}: use one of {', '.join(GENERATION_OBJECTIVES)}")
    steps = max(new_tokens - 1, 0)
    if objective == "request":
        return 1.0, float(steps)
    if objective == "decode":
        return TIE_WEIGHT, 1.0
    return 1.0, TIE_WEIGHT


def request_seconds(prefill_s: float | None, decode_s: float | None, new_tokens: int) -> float | None:
    """Seconds of one request: the prefill, then ``new_tokens - 1`` decode steps."""
    if prefill_s is None or decode_s is None:
        return None
    return prefill_s + max(new_tokens - 1, 0) * decode_s


def is_generation_dict(d: Any) -> bool:
    """Whether decoded JSON is a generation plan (not a single plan)."""
    return isinstance(d, Mapping) and d.get("format") == FORMAT


@dataclasses.dataclass(frozen=True)
class GenerationPlan:
    """A prefill plan and a decode plan of one model that share where everything lives.

    ``request``: ``prompt_tokens`` (the prefill's length), ``new_tokens``, ``batch`` and
    ``max_context`` (the cache's size, prompt + new tokens) and ``objective`` (one of
    :data:`GENERATION_OBJECTIVES`). ``predicted``: seconds of the prefill, of one decode step and of
    the request, and both phases' tokens per second. ``solver``: the pair's certificate, its
    objective and bound in the objective's seconds (a request's time for ``"request"``).
    ``baselines``: each baseline's times for both phases, costed with the same model.
    """

    prefill: Plan
    decode: Plan
    request: Mapping[str, Any]
    predicted: Mapping[str, float | None]
    solver: SolverInfo
    baselines: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    source: str = dataclasses.field(default="<generation plan>", compare=False, repr=False)

    def __post_init__(self) -> None:
        reader = FieldReader(self.source)
        request = reader.keys(dict(self.request), "request", _REQUEST_KEYS)
        for key in ("prompt_tokens", "new_tokens", "batch", "max_context"):
            if reader.count(request[key], f"request.{key}") < 1:
                reader.expected(f"request.{key}", "a positive integer", request[key])
        if request["objective"] not in GENERATION_OBJECTIVES:
            reader.expected("request.objective", f"one of {', '.join(GENERATION_OBJECTIVES)}", request["objective"])
        if request["prompt_tokens"] + request["new_tokens"] > request["max_context"]:
            reader.fail("request", f"prompt_tokens + new_tokens = {request['prompt_tokens'] + request['new_tokens']} "
                                   f"exceed max_context = {request['max_context']}, the cache's size")
        predicted = reader.keys(dict(self.predicted), "predicted", _PREDICTED_KEYS)
        predicted = {k: reader.number_or_null(v, f"predicted.{k}") for k, v in predicted.items()}
        baselines = {}
        for name, row in reader.mapping(dict(self.baselines), "baselines").items():
            row = reader.keys(dict(row), f"baselines.{name}", _BASELINE_KEYS)
            baselines[name] = MappingProxyType({
                **{k: reader.number_or_null(row[k], f"baselines.{name}.{k}") for k in _BASELINE_KEYS[:3]},
                "feasible": reader.boolean(row["feasible"], f"baselines.{name}.feasible"),
                "note": reader.string(row["note"], f"baselines.{name}.note")})
        object.__setattr__(self, "request", MappingProxyType(dict(request)))
        object.__setattr__(self, "predicted", MappingProxyType(predicted))
        object.__setattr__(self, "baselines", MappingProxyType(baselines))
        if self.prefill.training or self.decode.training:
            reader.fail("phases", "a generation plan's phases are inference plans; this one holds a training plan")
        if self.prefill.devices.names() != self.decode.devices.names():
            reader.fail("phases", f"the prefill is placed on {', '.join(self.prefill.devices.names())} and the "
                                  f"decode on {', '.join(self.decode.devices.names())}: both phases need one device set")
        pre, dec = param_homes(self.prefill), param_homes(self.decode)
        if set(pre) != set(dec):
            only = sorted(set(pre) ^ set(dec))
            reader.fail("phases", f"the phases hold different parameters ({', '.join(only[:3])}): they are not "
                                  f"captures of one model")
        differ = [n for n in pre if pre[n] != dec[n]]
        if differ:
            n = differ[0]
            reader.fail("phases", f"parameter {n} lives on {pre[n]} in the prefill and on {dec[n]} in the decode "
                                  f"step ({len(differ)} differ); both phases share memory, so each tensor has one home")
        settings = [(plan.precision or {}).get("setting") for plan in (self.prefill, self.decode)]
        if settings[0] != settings[1]:
            reader.fail("phases", f"the prefill was planned with precision {settings[0]!r} and the decode step with "
                                  f"{settings[1]!r}: plan both phases together with one precision setting")
        pre_f, dec_f = stored_forms(self.prefill), stored_forms(self.decode)
        differ = [n for n in pre_f if n in dec_f and pre_f[n] != dec_f[n]]
        if differ:
            n = differ[0]
            reader.fail("phases", f"parameter {n} is stored as {pre_f[n]} in the prefill and as {dec_f[n]} in the "
                                  f"decode step ({len(differ)} differ); one stored copy serves both phases, so each "
                                  f"weight has one form: re-plan with `hetpart plan MODEL --generate --precision ...`")

    @classmethod
    def from_phases(cls, prefill: Plan, decode: Plan, *, prompt_tokens: int, new_tokens: int, batch: int = 1,
                    max_context: int | None = None, objective: str = "request", solver: SolverInfo | None = None,
                    baselines: Mapping[str, Mapping[str, Any]] | None = None) -> GenerationPlan:
        """The generation plan of two phase plans, its predictions from theirs. Without ``solver``
        the pair carries no proof (status "heuristic", e.g. plans made one by one with pins).

        Raises:
            PlanFormatError: the phases do not share where each tensor lives, or a bad request.
        """
        pre_s, dec_s = prefill.predicted.get("total_s"), decode.predicted.get("total_s")
        predicted = {"prefill_s": pre_s, "decode_s": dec_s,
                     "request_s": request_seconds(pre_s, dec_s, new_tokens),
                     "prefill_tokens_per_s": tokens_per_second(batch * prompt_tokens, pre_s),
                     "decode_tokens_per_s": tokens_per_second(batch, dec_s)}
        if solver is None:
            wp, wd = objective_seconds(objective, new_tokens)
            value = None if pre_s is None or dec_s is None else wp * pre_s + wd * dec_s
            solver = SolverInfo("phases one by one", "heuristic", value, None, None, 0.0)
        request = {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "batch": batch,
                   "max_context": max_context if max_context is not None else prompt_tokens + new_tokens,
                   "objective": objective}
        return cls(prefill, decode, request, predicted, solver, baselines or {})

    # -- what it says -------------------------------------------------------------------------

    @property
    def precision(self) -> Mapping[str, Any]:
        """Each phase's precision: ``{"setting": ..., "prefill": {...}, "decode": {...}}``, a phase's
        ``weights`` ({op: packed dtype}), ``weight_bytes`` ({op: bytes so held}) and ``ops`` ({op:
        16-bit dtype}); empty for a plan made without ``precision``."""
        if not self.prefill.precision and not self.decode.precision:
            return MappingProxyType({})
        phase = {name: {key: dict(plan.precision.get(key, {})) for key in ("weights", "weight_bytes", "ops")}
                 for name, plan in (("prefill", self.prefill), ("decode", self.decode))}
        return MappingProxyType({"setting": self.prefill.precision.get("setting"), **phase})

    @property
    def prompt_tokens(self) -> int:
        return int(self.request["prompt_tokens"])

    @property
    def new_tokens(self) -> int:
        return int(self.request["new_tokens"])

    @property
    def batch(self) -> int:
        return int(self.request["batch"])

    @property
    def max_context(self) -> int:
        return int(self.request["max_context"])

    def phase_difference(self) -> list[tuple[str, str, str]]:
        """``(module path, prefill, decode)`` of every module whose weights are used differently in
        the two phases: where they compute, ``"cuda:0 (streamed from cpu)"`` where they stream;
        the modules holding the most bytes first."""
        def uses(plan: Plan) -> dict[str, str]:
            out: dict[str, set[str]] = {}
            for op in plan.param_ops:
                where = plan.placement[op]
                if op in plan.weights and plan.weights[op] != where:
                    where = f"{where} (streamed from {plan.weights[op]})"
                out.setdefault(plan.modules.get(op, "") or "(top)", set()).add(where)
            return {m: " + ".join(sorted(v)) for m, v in out.items()}

        pre, dec = uses(self.prefill), uses(self.decode)
        weight: dict[str, int] = {}
        for op in self.decode.param_ops:
            module = self.decode.modules.get(op, "") or "(top)"
            weight[module] = weight.get(module, 0) + self.decode.op_bytes.get(op, (0, 0))[1]
        differ = [(m, pre[m], dec[m]) for m in pre if m in dec and pre[m] != dec[m]]
        return sorted(differ, key=lambda row: -weight.get(row[0], 0))  # the largest weights first

    def summary(self) -> str:
        """Both phases side by side: time, tokens/s, memory, ops per device, what differs; baselines."""
        from partitioner.plan.generation_summary import generation_summary

        return generation_summary(self)

    # -- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION,
            "request": dict(self.request),
            "predicted": dict(self.predicted),
            "solver": self.solver.to_dict(),
            "baselines": {name: dict(row) for name, row in self.baselines.items()},
            "phases": {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike[str], *, force: bool = False) -> Path:
        """Write the plan atomically (the file is the old one or the whole plan)."""
        path = Path(path)
        refuse_overwrite([path], force=force, forcing="force=True")
        return write_atomic(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GenerationPlan:
        """Read and check a generation plan file.

        Raises:
            PlanFormatError: not a generation plan (a single plan is named as such), or a bad field.
            HetpartError: the file cannot be read.
        """
        path = Path(path)
        try:
            text = read_text(path, what="plan file", max_bytes=MAX_PLAN_BYTES)
        except FileNotFoundError:
            raise HetpartError(f"{path}: no such plan file; make one with `hetpart plan MODEL --generate ...`") \
                from None
        except OSError as err:
            raise HetpartError(f"{path}: cannot read the plan file: {err.strerror or err}") from None
        return cls.from_dict(parse_json(text, str(path)), str(path))

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> GenerationPlan:
        reader = FieldReader(source)
        top = reader.mapping(d, "")
        if not is_generation_dict(top):
            if "format_version" in top:
                reader.fail("", "this is a plan of one forward pass, not a generation plan: make one with "
                                "`hetpart plan MODEL --generate --prompt-tokens P --new-tokens N`")
            reader.fail("format", f"missing or not {FORMAT!r}: not a generation plan")
        top = reader.keys(top, "", ("format", "version", "request", "predicted", "solver", "baselines", "phases"))
        if top["version"] != VERSION:
            reader.fail("version", f"a version {top['version']!r} generation plan; this hetpart reads version "
                                   f"{VERSION}: re-plan with `hetpart plan MODEL --generate ...`")
        phases = reader.keys(top["phases"], "phases", ("prefill", "decode"))
        solver = _solver_info(reader, top["solver"])
        return cls(Plan.from_dict(phases["prefill"], f"{source}: phases.prefill"),
                   Plan.from_dict(phases["decode"], f"{source}: phases.decode"),
                   top["request"], top["predicted"], solver, top["baselines"], source)

    # -- running it ---------------------------------------------------------------------------

    def emit_generate(self, model: Any, device_map: Mapping[str, str] | None = None, **options: Any) -> Any:
        """The ``generate`` loop that runs this plan on ``model`` (see :mod:`backends.torch.generate`).

        Example:
            >>> gen = plan.emit_generate(model, {"cuda:0": "cpu"})        # doctest: +SKIP
            >>> tokens = gen.generate(prompt_ids, max_new_tokens=32)       # doctest: +SKIP
        """
        from backends.torch.generate import emit_generate

        return emit_generate(self, model, device_map, **options)


def _solver_info(reader: FieldReader, d: Any) -> SolverInfo:
    d = reader.keys(d, "solver", ("name", "status", "objective", "bound", "gap", "seconds"),
                    ("requested_gap", "nodes", "note", "ilp"))
    return SolverInfo(reader.string(d["name"], "solver.name"), reader.string(d["status"], "solver.status"),
                      reader.number_or_null(d["objective"], "solver.objective"),
                      reader.number_or_null(d["bound"], "solver.bound"),
                      reader.number_or_null(d["gap"], "solver.gap"), reader.number(d["seconds"], "solver.seconds"),
                      reader.number_or_null(d.get("requested_gap"), "solver.requested_gap"),
                      d.get("nodes"), str(d.get("note", "")))


def tokens_per_second(tokens: int, seconds: float | None) -> float | None:
    """``tokens / seconds`` (None when the time is unknown or zero)."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return tokens / seconds
