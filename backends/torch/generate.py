"""The emitted ``generate`` loop: a generation plan's prefill, then its decode steps, one set of weights.

In: a :class:`~partitioner.plan.generation.GenerationPlan`, the causal LM it was made for (a
transformers model with a generation head, the zoo's GPT, or its
:class:`~partitioner.frontends.decode_step.DecodeStep`), and a binding of the plan's devices
(``{"cuda:0": "cpu"}``), or strict devices. Out: a :class:`PlacedGenerator`.

How it is built: the model's decode step (static KV cache as buffers, sized for the plan's batch
and context) is emitted twice, once per phase, each a module of :mod:`backends.torch.module`
running its phase's placement (its own transfers, its own streamed weights). The prefill module
copies every parameter and cache buffer to its home; the decode module is then built on *those*
tensors (never a second copy: the plan's homes are one per tensor for both phases, and a tensor
found elsewhere is a :class:`~partitioner.errors.PlanMismatch`), so the cache the prefill writes is
the cache the decode steps read and extend, on the devices the plan gave it. A plan made with
``precision`` stores each weight one way for both phases: a weight the prefill module holds in 16
bits is the decode module's too, and a packed linear of the decode module reads the prefill
module's packed buffers (:func:`~backends.torch.packed.pack_linears` with ``shared_from``), so no
weight is held twice.

A request (:meth:`PlacedGenerator.generate`, shaped like transformers' ``generate``): the cache is
emptied; the prompt (``[batch, length]``, ``length <= prompt_tokens``, ``batch <=`` the planned
batch) runs through the prefill at the planned shapes, padded on the right with token 0 (and with
rows of zeros up to the planned batch): padded positions are written into the cache, but every
real position attends only to positions before it, and each decode step overwrites its position
before reading it, so the real tokens' logits are those of the unpadded prompt. Each new token
then runs one decode step at its position. Tokens are chosen on the CPU (:mod:`backends.torch.sampling`:
greedy, or sampled with a seed); generation stops, as transformers' does, once every sequence has
produced an end-of-sequence token (finished rows are filled with the pad token).

With ``strict_devices=True`` both modules are built and run under one
:class:`~backends.strict_devices.StrictDevices` mode, each phase checked against its own placement:
every copy of a cache entry, a weight or an activation between logical devices is one the emitted
code makes; :meth:`PlacedGenerator.device_reports` tells each phase's copies beside its plan.

Example:
    >>> gen = GenerationPlan.load("plan.json")                                    # doctest: +SKIP
    >>> generator = emit_generate(gen, model, {"cuda:0": "cpu"})                   # doctest: +SKIP
    >>> tokens = generator.generate(prompt_ids, max_new_tokens=32)                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from backends.binding import bind_devices
from backends.torch.attributes import attribute, rebind_tensor
from backends.torch.module import capture_for, emit_module, place_module, unlifted_module
from backends.torch.packed import PACKED_ATTR
from backends.torch.precision import DTYPES, apply_precision
from backends.torch.sampling import Sampling, next_token
from backends.torch.strict import StrictRun
from cost_models.precision import activations
from partitioner.errors import GenerationError, HetpartError, PlanMismatch
from partitioner.frontends.decode_step import DecodeStep, decode_step, phase_inputs
from partitioner.ir import NOT_A_TENSOR
from partitioner.plan.phase_homes import stored_forms

__all__ = ["GenerateOutput", "PlacedGenerator", "emit_generate"]


def emit_generate(gen: Any, model: Any, device_map: Mapping[str, str] | None = None, *,
                  strict_devices: bool = False) -> PlacedGenerator:
    """The :class:`PlacedGenerator` running ``gen`` on ``model`` (see the module docstring).

    Raises:
        CaptureError: ``model`` is no causal LM whose cache can be made static.
        PlanMismatch: ``model`` is not the model the plan was made for, or the phases' tensors
            would not share their homes.
        HetpartError: a device of the plan is not present and not bound elsewhere, or a
            ``device_map`` given with ``strict_devices``.
    """
    if strict_devices and device_map:
        raise HetpartError("strict devices bind every device of the plan to its own CPU tag themselves: "
                           "drop device_map (or drop strict_devices to run on the devices it names)")
    step = decode_step(model, batch=gen.batch, max_context=gen.max_context)
    prompt_inputs = phase_inputs(step, gen.prompt_tokens)
    token_inputs = phase_inputs(step, 1, start=gen.prompt_tokens)
    strict = None
    with torch.no_grad():  # a generation step keeps no graph (and cache buffers are written in place)
        if strict_devices:
            strict = (StrictRun(gen.prefill),)
            strict += (StrictRun(gen.decode, mode=strict[0].mode),)
            device_map = strict[0].device_map
            with strict[0]:
                prefill = emit_module(gen.prefill, step, device_map, example_inputs=prompt_inputs)
            with strict[1]:
                decode = _emit_sharing(gen.decode, step, device_map, token_inputs, prefill,
                                       logical_of=strict[0].mode.device_of)
            strict[0].watch(prefill)
            strict[1].watch(decode)
        else:
            prefill = emit_module(gen.prefill, step, device_map, example_inputs=prompt_inputs)
            decode = _emit_sharing(gen.decode, step, device_map, token_inputs, prefill)
    host = torch.device(bind_devices(gen.prefill, device_map).get(gen.prefill.devices.host_device().name, "cpu"))
    return PlacedGenerator(gen, step, prefill, decode, host=host if not strict_devices else torch.device("cpu"),
                           strict=strict, eos_token_id=_generation_value(model, "eos_token_id"),
                           pad_token_id=_generation_value(model, "pad_token_id"))


def _emit_sharing(plan: Any, step: DecodeStep, device_map: Mapping[str, str] | None, example_inputs: Any,
                  source: torch.fx.GraphModule, *, logical_of: Callable[[torch.Tensor], str] | None = None,
                  ) -> torch.fx.GraphModule:
    """``plan``'s module whose parameters and buffers are ``source``'s tensors of the same names.
    ``logical_of`` tells the logical device of a tensor where physical devices cannot (strict devices)."""
    binding = bind_devices(plan, device_map)
    graph = capture_for(plan, step, example_inputs)
    gm = unlifted_module(graph, weights_to_load=True)  # shares the model's weights until rebound below
    tensors = {name for name, t in graph.tensors.items() if t.dtype != NOT_A_TENSOR}
    packed_by_source = set(getattr(source, PACKED_ATTR, {}).values())  # weights the prefill holds packed
    forms = stored_forms(plan)

    def share(gm: torch.fx.GraphModule, home: Mapping[str, str], physical: Mapping[str, torch.device],
              streamed: Any) -> None:
        for target, logical in home.items():
            owner, _, attr = target.rpartition(".")
            module = gm.get_submodule(owner) if owner else gm
            mine = getattr(module, attr)
            if not isinstance(mine, torch.Tensor):
                continue
            if target in packed_by_source:  # the packed step below reads the prefill's packed buffers
                continue
            try:
                theirs = attribute(source, target)
            except AttributeError:
                raise PlanMismatch(f"the decode step reads {target}, which the prefill module does not hold: "
                                   f"the two phases are not captures of one model") from None
            stored = DTYPES.get(activations(forms.get(target, "float32")))
            if theirs.shape != mine.shape or (theirs.dtype != mine.dtype and theirs.dtype != stored):
                raise PlanMismatch(f"{target} is {tuple(theirs.shape)} {theirs.dtype} in the prefill and "
                                   f"{tuple(mine.shape)} {mine.dtype} in the decode step")
            found = theirs.device == physical[logical] if logical_of is None else logical_of(theirs) == logical
            if not found:
                raise PlanMismatch(f"{target} lives on {theirs.device} for the prefill but the decode plan keeps it "
                                   f"on {logical} ({physical[logical]}): both phases share one home per tensor")
            rebind_tensor(module, attr, theirs)

    gm = place_module(gm, plan, binding, tensors=tensors, move_state=share)
    return apply_precision(gm, plan, shared_from=source)  # (a no-op without a precision section)


def _generation_value(model: Any, key: str) -> Any:
    config = getattr(model, "generation_config", None)
    if config is None and isinstance(model, DecodeStep) and model.kind == "transformers":
        config = getattr(model.inner.model, "generation_config", None)
    return getattr(config, key, None) if config is not None else None


class PlacedGenerator:
    """A generation plan's prefill and decode modules over one set of weights and one KV cache.

    ``generate`` is the request; ``prefill`` and ``decode_one`` the two phases on their own;
    after a request, ``last_logits`` holds the logits each new token was chosen from
    (``[batch, new tokens, vocab]``, on the CPU) and ``timings`` the seconds of the prefill and of
    every decode step.
    """

    def __init__(self, gen: Any, step: DecodeStep, prefill: torch.nn.Module, decode: torch.nn.Module, *,
                 host: torch.device, strict: tuple[StrictRun, StrictRun] | None = None,
                 eos_token_id: Any = None, pad_token_id: Any = None) -> None:
        self.plan = gen
        self.prefill_module = prefill
        self.decode_module = decode
        self.batch = gen.batch
        self.prompt_tokens = gen.prompt_tokens
        self.max_context = gen.max_context
        self.vocab_size = step.vocab_size
        self.cache_names = step.cache_names
        self.host = host
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self._strict = strict
        self._reports: dict[str, Any] = {}
        self.last_logits: torch.Tensor | None = None
        self.timings: dict[str, Any] = {"prefill_s": None, "decode_s": []}

    # -- the two phases ----------------------------------------------------------------------------

    @torch.no_grad()
    def reset(self) -> None:
        """Empty the KV cache (zeros on every device holding a part of it)."""
        for name in self.cache_names:
            attribute(self.prefill_module, name).zero_()

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Empty the cache, run the prompt; the logits of each sequence's last prompt token ``[batch, vocab]``."""
        ids = self._prompt(input_ids)
        rows, length = ids.shape
        padded = torch.zeros((self.batch, self.prompt_tokens), dtype=torch.long, device=self.host)
        padded[:rows, :length] = ids.to(self.host)
        self.reset()
        positions = torch.arange(self.prompt_tokens, dtype=torch.long, device=self.host)
        started = time.perf_counter()
        logits = self._run(0, self.prefill_module, padded, positions)
        out = logits[:rows, length - 1].float().cpu()
        self.timings = {"prefill_s": time.perf_counter() - started, "decode_s": []}
        return out

    @torch.no_grad()
    def decode_one(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """One decode step: ``tokens`` (``[batch]``) at cache ``position``; their logits ``[batch, vocab]``."""
        if not 0 <= position < self.max_context:
            raise GenerationError(f"position {position} is outside the cache of {self.max_context} tokens: plan a "
                                  f"longer context (--prompt-tokens / --new-tokens)")
        rows = tokens.shape[0]
        ids = torch.zeros((self.batch, 1), dtype=torch.long, device=self.host)
        ids[:rows, 0] = tokens.to(self.host)
        started = time.perf_counter()
        logits = self._run(1, self.decode_module, ids, torch.tensor([position], dtype=torch.long, device=self.host))
        out = logits[:rows, -1].float().cpu()
        self.timings["decode_s"].append(time.perf_counter() - started)
        return out

    def _run(self, phase: int, module: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._strict is None:
            return module(ids, positions)
        run = self._strict[phase]
        error = ""
        try:
            with run:
                return run.step(module, ids, positions)
        except Exception as exc:
            error = str(exc)
            raise
        finally:
            self._reports[("prefill", "decode")[phase]] = run.report(error)

    def device_reports(self) -> dict[str, Any]:
        """Under strict devices: each phase's last step, copies per link and resident bytes beside its plan."""
        if self._strict is None:
            raise HetpartError("device reports come from a generator emitted with strict_devices=True")
        return dict(self._reports)

    # -- a request ---------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int | None = None, *, max_length: int | None = None,
                 generation_config: Any = None, do_sample: bool | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 attention_mask: torch.Tensor | None = None, eos_token_id: Any = "model", pad_token_id: Any = "model",
                 num_beams: int = 1, return_dict_in_generate: bool = False, output_logits: bool = False,
                 **unsupported: Any) -> Any:
        """The prompt followed by its new tokens, ``[batch, length + new]`` (fewer when every
        sequence ended), as transformers' ``generate(input_ids, max_new_tokens=...)`` returns; with
        ``return_dict_in_generate=True`` a :class:`GenerateOutput` (``sequences``, and ``logits``
        with ``output_logits=True``: one ``[batch, vocab]`` tensor per new token).

        ``max_new_tokens`` defaults to the plan's ``new_tokens`` (``max_length``: the prompt and
        the new tokens together); ``eos_token_id`` and ``pad_token_id`` to the model's generation
        config (``None``: never stop early). A transformers ``generation_config`` supplies what the
        arguments leave out (``max_new_tokens``, ``max_length``, ``do_sample``, ``temperature``,
        ``top_k``, ``top_p``, ``eos_token_id``, ``pad_token_id``, ``num_beams``), as
        transformers reads it. ``seed`` seeds this call's own generator.

        Raises:
            GenerationError: a prompt longer than planned, more sequences than the cache holds,
                more tokens than the cache has positions, a padded ``attention_mask``, bad
                sampling settings, beam search, or an argument transformers has and this loop does not.
        """
        if unsupported:
            raise GenerationError(f"generate() does not take {', '.join(sorted(unsupported))}: the placed loop takes "
                                  f"input_ids, max_new_tokens, max_length, generation_config, do_sample, temperature, "
                                  f"top_k, top_p, seed, attention_mask, eos_token_id, pad_token_id, "
                                  f"return_dict_in_generate and output_logits")
        if generation_config is not None:
            def given(value: Any, key: str) -> Any:
                return value if value is not None else getattr(generation_config, key, None)

            max_new_tokens = given(max_new_tokens, "max_new_tokens")
            max_length = max_length if max_length is not None or max_new_tokens is not None \
                else getattr(generation_config, "max_length", None)
            do_sample = given(do_sample, "do_sample")
            if do_sample:
                temperature, top_k, top_p = (given(temperature, "temperature"), given(top_k, "top_k"),
                                             given(top_p, "top_p"))
            num_beams = getattr(generation_config, "num_beams", 1) if num_beams == 1 else num_beams
            if isinstance(eos_token_id, str) and eos_token_id == "model":
                eos_token_id = getattr(generation_config, "eos_token_id", None)
            if isinstance(pad_token_id, str) and pad_token_id == "model":
                pad_token_id = getattr(generation_config, "pad_token_id", None)
        if num_beams not in (None, 1):
            raise GenerationError(f"num_beams={num_beams}: the placed loop decodes greedily or by sampling, one "
                                  f"sequence per cache row; beam search is not planned (use num_beams=1)")
        do_sample = bool(do_sample)
        if max_length is not None and max_new_tokens is None:
            if isinstance(max_length, bool) or not isinstance(max_length, int):
                raise GenerationError(f"max_length must be a whole number of tokens, not {max_length!r}")
            length = input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) else 0
            max_new_tokens = max_length - length
        sampling = Sampling.build(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        ids = self._prompt(input_ids)
        if attention_mask is not None:
            mask = torch.as_tensor(attention_mask)
            if mask.shape != ids.shape:
                raise GenerationError(f"attention_mask is {tuple(mask.shape)}, the prompt {tuple(ids.shape)}: "
                                      f"give one mask entry per prompt token")
            if not bool((mask != 0).all()):
                raise GenerationError("attention_mask masks prompt tokens: the generation loop runs prompts of one "
                                      "length together (every sequence at the same cache positions); run prompts "
                                      "of different lengths one by one, or trim their padding")
        new = self.plan.new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(new, bool) or not isinstance(new, int) or new < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, not {new!r}")
        length = ids.shape[1]
        if length + new > self.max_context:
            raise GenerationError(f"a prompt of {length} tokens and {new} new tokens need {length + new} cache "
                                  f"positions; the plan's cache holds {self.max_context} (prompt_tokens + "
                                  f"new_tokens): ask for at most {self.max_context - length} new tokens or re-plan")
        eos = _token_set(self.eos_token_id if _from_model(eos_token_id) else eos_token_id)
        pad = self.pad_token_id if _from_model(pad_token_id) else pad_token_id
        if pad is None and eos:
            pad = min(eos)
        generator = sampling.generator()
        rows = ids.shape[0]
        finished = torch.zeros(rows, dtype=torch.bool)
        logits = self.prefill(ids)
        chosen, seen = [], [logits]
        for i in range(new):
            token = next_token(logits, sampling, generator)
            if eos:
                token = torch.where(finished, torch.full_like(token, pad), token)
                finished |= torch.isin(token, torch.tensor(sorted(eos)))
            chosen.append(token)
            if i == new - 1 or bool(finished.all()):
                break
            logits = self.decode_one(token, length + i)
            seen.append(logits)
        self.last_logits = torch.stack(seen, dim=1)
        sequences = torch.cat([ids.cpu(), torch.stack(chosen, dim=1)], dim=1)
        if not return_dict_in_generate:
            return sequences
        return GenerateOutput(sequences, tuple(seen) if output_logits else None)

    def _prompt(self, input_ids: Any) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor):
            raise GenerationError(f"input_ids must be a tensor of token ids [batch, length], not "
                                  f"{type(input_ids).__name__}")
        ids = input_ids.unsqueeze(0) if input_ids.dim() == 1 else input_ids
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32) or ids.shape[1] == 0:
            raise GenerationError(f"input_ids must be integer token ids of shape [batch, length], not "
                                  f"{tuple(input_ids.shape)} {input_ids.dtype}")
        rows, length = ids.shape
        if rows > self.batch:
            raise GenerationError(f"{rows} sequences, but the plan's cache holds {self.batch}: run at most "
                                  f"{self.batch} at a time, or re-plan with --batch {rows}")
        if length > self.prompt_tokens:
            raise GenerationError(f"a prompt of {length} tokens is longer than the planned prefill of "
                                  f"{self.prompt_tokens}: re-plan with --prompt-tokens {length} (or more)")
        if bool((ids < 0).any()) or bool((ids >= self.vocab_size).any()):
            raise GenerationError(f"input_ids hold token ids outside the vocabulary of {self.vocab_size}")
        return ids.long()


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns, named as transformers names it."""

    sequences: torch.Tensor
    logits: tuple[torch.Tensor, ...] | None = None


def _from_model(value: Any) -> bool:
    return isinstance(value, str) and value == "model"


def _token_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, torch.Tensor):
        return {int(v) for v in value.flatten().tolist()}
    if isinstance(value, Sequence):
        return {int(v) for v in value}
    return {int(value)}
