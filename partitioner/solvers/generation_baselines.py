"""The placements generation users get today, as pairs of phase placements costed by hetpart's model.

In: a :class:`~partitioner.solvers.generation.GenerationProblem`. Out: a
:class:`~partitioner.solvers.generation.JointSolution` per baseline (both phases' placements, the
weighted objective; status "heuristic", or "infeasible" with the reason in ``note``).

* ``llama.cpp --fit``: llama.cpp's ``-ngl``, with ``--fit`` choosing the largest count that fits
  (memory only, ``llama_params_fit``): the last ``k`` decoder layers (their weights, their KV cache,
  their ops) on the GPU, the rest computed on the CPU; the token embedding always on the CPU
  (``dev_input``); the output norm and head on the GPU only when every layer is there too
  (``-ngl`` = layers + 1, ``dev_output``). Prefill with batch x prompt >= 32 tokens
  (``GGML_OP_OFFLOAD_MIN_BATCH``) computes the weight ops of CPU layers on the GPU, their weights
  copied in from pinned host memory (``op_offload``), while their attention stays with its KV cache on
  the CPU; decode computes CPU layers on the CPU.
* ``llama.cpp -ot exps=CPU``: MoE models only: every layer on the GPU (as many as fit, from the last)
  except the routed experts' weights, which stay in host memory (computed on the CPU in decode, on
  the GPU with op offload in prefill).
* ``greedy``: accelerate's ``device_map="auto"`` as ``dispatch_model`` runs it (:func:`solve_greedy`):
  one device map for both phases, offloaded weights copied synchronously each step.

Layers are found by module path (``layers.N``, ``h.N``, ``blocks.N``); experts by a module
``experts`` (not ``shared_expert``). A model without numbered layers has no llama.cpp baseline.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable

from partitioner.solvers.generation import GenerationProblem, JointSolution, PhasePair
from partitioner.solvers.greedy import solve_greedy
from partitioner.solvers.problem import Placement, Problem, Status, StreamMode, accelerator_devices

__all__ = ["GENERATION_BASELINES", "OP_OFFLOAD_MIN_BATCH", "generation_baselines", "layer_of", "run_generation_baseline"]

OP_OFFLOAD_MIN_BATCH = 32  # llama.cpp's GGML_OP_OFFLOAD_MIN_BATCH: tokens at which CPU weights go to the GPU
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")
_EXPERTS = re.compile(r"(?:^|\.)experts(?:\.|$)")


def layer_of(path: str) -> int | None:
    """The decoder layer index in a module path (``inner.model.model.layers.3.mlp`` -> 3), or None."""
    found = _LAYER.findall(path or "")
    return int(found[-1]) if found else None


class _Structure:
    """Each node's layer (None: before or after the layers), whether it is an expert, and its side."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        ops = p.original.ops
        self.layer: dict[str, int | None] = {}
        self.expert: dict[str, bool] = {}
        for n in p.nodes:
            members = [ops[m] for m in p.members[n] if m in ops]
            layers = [layer_of(op.module_path) for op in members]
            known = [i for i in layers if i is not None]
            self.layer[n] = max(set(known), key=known.count) if known else None
            weight = sum(op.param_bytes for op in members)
            in_experts = sum(op.param_bytes for op in members if _EXPERTS.search(op.module_path or ""))
            self.expert[n] = weight > 0 and 2 * in_experts >= weight
        layered = [i for i, n in enumerate(p.nodes) if self.layer[n] is not None]
        first = layered[0] if layered else len(p.nodes)
        self.side = {n: "input" if i < first else "output" for i, n in enumerate(p.nodes) if self.layer[n] is None}
        self.count = 1 + max((i for i in self.layer.values() if i is not None), default=-1)

    @property
    def has_experts(self) -> bool:
        return any(self.expert.values())


def _llama_cpp(p: Problem, s: _Structure, gpu: str, k: int, experts_on_cpu: bool, op_offload: bool) -> Placement:
    """``-ngl k`` (``k = layers + 1`` puts the output on the GPU too), optionally ``-ot exps=CPU``."""
    first_gpu = s.count - min(k, s.count)
    device: dict[str, str] = {}
    streamed: dict[str, str] = {}
    for n in p.nodes:
        layer = s.layer[n]
        if layer is not None:
            on_gpu = layer >= first_gpu and k > 0
        else:
            on_gpu = s.side[n] == "output" and k > s.count
        if experts_on_cpu and s.expert[n]:
            on_gpu = False
        home = gpu if on_gpu and gpu in p.allowed[n] else p.host if p.host in p.allowed[n] else p.allowed[n][0]
        device[n] = home
        if home == p.host and op_offload and n in p.streamable and gpu in p.allowed[n] \
                and not (layer is None and s.side[n] == "input"):  # get_rows of the token embedding stays
            device[n] = gpu
            streamed[n] = p.host
    return in_stream_forms(p, Placement(device, streamed, StreamMode.PREFETCH))


def in_stream_forms(p: Problem, placement: Placement) -> Placement:
    """``placement`` with every streamed node's choice written out: the host holds its weights in
    the form it computes in (:meth:`~partitioner.solvers.problem.Problem.stream_form`; a packed
    linear streams packed), so the other phase's stored form can be matched to it; as placed
    without ``precision``."""
    if p.precision is None or not placement.streamed:
        return placement
    precision = dict(placement.precision)
    for n in placement.streamed:
        precision[n] = p.stream_form(n, placement.device[n], precision.get(n))
    return dataclasses.replace(placement, precision=precision)


def agree_forms(gp: GenerationProblem, pair: PhasePair) -> PhasePair:
    """``pair`` with one stored form per weight where it can be had: a node that keeps its weights
    where it computes stores them in the form the other phase's node streams them in, where its
    device offers a choice of that form; else the streaming node computes where its weights live
    instead (no stream), in that node's form where offered. Other disagreements are left for
    evaluation to name."""
    if gp.prefill.precision is None:
        return pair
    device = [dict(pair.prefill.device), dict(pair.decode.device)]
    streamed = [dict(pair.prefill.streamed), dict(pair.decode.streamed)]
    chosen = [dict(pair.prefill.precision), dict(pair.decode.precision)]
    for a, b in gp.links:
        names = gp.shared[(a, b)]
        for me, other, mine, theirs in ((0, 1, a, b), (1, 0, b, a)):
            if theirs not in streamed[other] or mine in streamed[me]:
                continue
            there = dataclasses.replace(pair[other], device=device[other], streamed=streamed[other],
                                        precision=chosen[other])
            want = gp.form_of(other, theirs, gp.phases[other].dtype_of(there, theirs), names)
            options = _choices_of_form(gp, me, mine, device[me][mine], names, want)
            if options:
                chosen[me][mine] = options[0]
                continue
            home = streamed[other][theirs]
            here = dataclasses.replace(pair[me], device=device[me], streamed=streamed[me], precision=chosen[me])
            form = gp.form_of(me, mine, gp.phases[me].dtype_of(here, mine), names)
            if home in gp.phases[other].allowed[theirs]:
                del streamed[other][theirs]
                device[other][theirs] = home
                options = _choices_of_form(gp, other, theirs, home, names, form)
                if options:
                    chosen[other][theirs] = options[0]
                else:
                    chosen[other].pop(theirs, None)
    return PhasePair(*(dataclasses.replace(pl, device=d, streamed=s_, precision=c)
                       for pl, d, s_, c in zip(pair, device, streamed, chosen)))


def _choices_of_form(gp: GenerationProblem, phase: int, node: str, device: str, names: tuple[str, ...],
                     form: tuple[str, ...]) -> list[str]:
    """The choices of ``node`` on ``device`` that store its weights in ``form``."""
    return [c for c in gp.phases[phase].choices[node].get(device, ()) if gp.form_of(phase, node, c, names) == form]


def _tokens(p: Problem) -> int:
    """Tokens per step of a phase: the batch times the sequence of its first graph input."""
    g = p.original
    shape = g.tensors[g.inputs[0]].shape if g.inputs else ()
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _fill(gp: GenerationProblem, name: str, experts_on_cpu: bool) -> JointSolution:
    start = time.perf_counter()
    pre, dec = gp.phases
    gpus = accelerator_devices(pre.devices)
    s_pre, s_dec = _Structure(pre), _Structure(dec)
    if not gpus or s_dec.count == 0:
        return _none(name, "no accelerator, or no numbered decoder layers to place", start)
    gpu = gpus[0]
    offload = _tokens(pre) >= OP_OFFLOAD_MIN_BATCH
    reasons = []
    for k in range(s_dec.count + 1, -1, -1):
        pair = agree_forms(gp, PhasePair(_llama_cpp(pre, s_pre, gpu, k, experts_on_cpu, offload),
                                         _llama_cpp(dec, s_dec, gpu, k, experts_on_cpu, False)))
        _, _, total, violations = gp.evaluate(pair)
        if not violations:
            layers = min(k, s_dec.count)
            note = (f"-ngl {k}: the last {layers} of {s_dec.count} layers on {gpu}"
                    + (", the output layer too" if k > s_dec.count else "")
                    + (", routed experts in host memory" if experts_on_cpu else "")
                    + (f"; prefill streams host weights to {gpu} (op offload at >= {OP_OFFLOAD_MIN_BATCH} tokens)"
                       if offload else ""))
            return JointSolution(name, pair, Status.HEURISTIC, total, None, time.perf_counter() - start, note)
        reasons.append(violations[0])
    return _none(name, f"not even -ngl 0 fits: {reasons[-1]}", start)


def _greedy(gp: GenerationProblem) -> JointSolution:
    start = time.perf_counter()
    pair = agree_forms(gp, PhasePair(*(in_stream_forms(p, solve_greedy(p).placement) for p in gp.phases)))
    _, _, total, violations = gp.evaluate(pair)
    note = "accelerate's device_map='auto', one map for both phases, offloaded weights copied synchronously"
    if violations:
        return JointSolution("greedy", pair, Status.INFEASIBLE, total, None, time.perf_counter() - start,
                             f"does not fit: {violations[0]}")
    return JointSolution("greedy", pair, Status.HEURISTIC, total, None, time.perf_counter() - start, note)


def _none(name: str, why: str, start: float) -> JointSolution:
    return JointSolution(name, PhasePair(Placement({}), Placement({})), Status.INFEASIBLE, None, None,
                         time.perf_counter() - start, why)


GENERATION_BASELINES: dict[str, Callable[[GenerationProblem], JointSolution]] = {
    "llama.cpp --fit": lambda gp: _fill(gp, "llama.cpp --fit", False),
    "llama.cpp -ot exps=CPU": lambda gp: _fill(gp, "llama.cpp -ot exps=CPU", True),
    "greedy": _greedy,
}


def run_generation_baseline(name: str, gp: GenerationProblem) -> JointSolution:
    """The baseline called ``name`` (a key of :data:`GENERATION_BASELINES`)."""
    return GENERATION_BASELINES[name](gp)


def generation_baselines(gp: GenerationProblem) -> dict[str, JointSolution]:
    """Every baseline that applies: ``-ot exps=CPU`` only for models with routed experts."""
    names = [n for n in GENERATION_BASELINES if n != "llama.cpp -ot exps=CPU" or _Structure(gp.decode).has_experts]
    return {n: run_generation_baseline(n, gp) for n in names}
