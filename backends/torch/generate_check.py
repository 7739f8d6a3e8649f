"""``hetpart check --generate N``: a generation plan's emitted loop beside the original's greedy decoding.

In: a :class:`~partitioner.plan.generation.GenerationPlan`, the model (real weights), the number of
new tokens, a binding or strict devices, and a prompt (default: random token ids of half the planned
prompt length, seeded). Out: a :class:`GenerationCheck`: how many new tokens equal the original's,
the largest logit difference over the steps where both saw the same tokens, the times of both, each
phase's strict-devices report, and a verdict (its last line of text).

The original's greedy decoding is transformers' own ``generate(do_sample=False)`` where the model
has it (its dynamic cache, not the plan's static one), else the model's forward over the whole
sequence once per new token (no cache at all).

A plan made with ``precision`` (16-bit ops, packed weights) computes other numbers than the float
model by design, so, as :mod:`backends.torch.check` does for single plans, its tokens and logits
are compared with the same plan's loop run unplaced (every device bound to the host: the same
packing and casts, no placement) within bfloat16's tolerance, and the relative L2 error of both
loops' logits against the float model's greedy decoding is reported beside it
(:class:`PrecisionErrors`).

Example:
    >>> report = check_generation(gen, model, 32, strict_devices=True)   # doctest: +SKIP
    >>> print(report.to_text())                                          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping
from typing import Any

import torch

from backends.torch.generate import emit_generate
from partitioner.errors import GenerationError
from partitioner.frontends.decode_step import DecodeStep

__all__ = ["GenerationCheck", "PrecisionErrors", "check_generation", "reference_greedy"]

#: (rtol, atol) of a float32 plan's logits, and of a 16-bit or packed plan's against its unplaced loop
FLOAT_TOLERANCE, LOW_TOLERANCE = (1e-4, 1e-4), (2e-2, 2e-2)


@torch.no_grad()
def reference_greedy(model: torch.nn.Module, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The original model's greedy tokens ``[batch, length + new]`` and the logits each new token
    was chosen from ``[batch, new, vocab]`` (float32, on the CPU); see the module docstring."""
    if hasattr(model, "generate") and hasattr(model, "generation_config"):
        out = model.generate(ids, max_new_tokens=new, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        return out.sequences, torch.stack(out.logits, dim=1).float().cpu()
    seq, seen = ids, []
    for _ in range(new):
        logits = model(seq)[:, -1].float().cpu()
        seen.append(logits)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True).to(seq.device)], dim=1)
    return seq, torch.stack(seen, dim=1)


@dataclasses.dataclass(frozen=True)
class PrecisionErrors:
    """A plan with ``precision`` against the float model: the relative L2 error of its logits
    (over the steps where all three saw the same tokens) and the same error of the unplaced loop."""

    weights: Mapping[str, int]   # packed dtype -> linears packed in it (the decode step's)
    low_ops: int                 # ops the decode step computes in 16 bits
    placed: float                # the emitted loop's logits against the float model's
    reference: float             # the unplaced loop's logits against the float model's
    float_tokens: int            # new tokens equal to the float model's greedy ones, from the first

    def to_text(self) -> str:
        held = ", ".join(f"{n} linears in {w}" for w, n in sorted(self.weights.items())) or "no packed weights"
        return (f"  precision {held}, {self.low_ops} ops in 16 bits: compared with the same plan run unplaced on "
                f"the host; logits' relative error against the float model {self.placed:.2e} (unplaced "
                f"{self.reference:.2e}); {self.float_tokens} new tokens equal the float model's")


@dataclasses.dataclass(frozen=True)
class GenerationCheck:
    """What :func:`check_generation` found."""

    model_name: str
    prompt_tokens: int
    new_tokens: int
    equal_tokens: int            # new tokens equal to the original's, from the first
    compared_tokens: int         # new tokens the longer of the two produced
    max_logit_error: float       # over the steps both ran on the same tokens
    tolerance: tuple[float, float]  # rtol, atol
    logits_close: bool
    prefill_s: float
    decode_s: float | None       # median per decode step
    original_s: float
    strict: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # phase -> DeviceReport
    precision: PrecisionErrors | None = None  # a plan made with precision: its error against float

    @property
    def passed(self) -> bool:
        return (self.equal_tokens == self.compared_tokens and self.logits_close
                and all(r.passed for r in self.strict.values()))

    def to_text(self) -> str:
        rtol, atol = self.tolerance
        whose = "the unplaced loop's (same precision)" if self.precision is not None else "the original's"
        lines = [f"generation check of {self.model_name}: prompt {self.prompt_tokens} tokens, "
                 f"{self.new_tokens} new tokens, greedy",
                 f"  tokens   {self.equal_tokens} of {self.compared_tokens} new tokens equal {whose}",
                 f"  logits   max abs difference {self.max_logit_error:.3g} "
                 f"({'within' if self.logits_close else 'OUTSIDE'} rtol {rtol:g}, atol {atol:g})",
                 f"  time     emitted: prefill {_ms(self.prefill_s)}, decode {_ms(self.decode_s)} per token "
                 f"(median); original generate {_ms(self.original_s)} in all"]
        if self.precision is not None:
            lines.append(self.precision.to_text())
        for phase, report in self.strict.items():
            lines.append(f"  {phase}: " + report.to_text().replace("\n", "\n  "))
        if self.passed:
            verdict = f"PASSED: the emitted generate loop gives {whose} tokens"
        elif self.equal_tokens != self.compared_tokens:
            verdict = (f"FAILED: new token {self.equal_tokens + 1} differs from {whose}")
        elif not self.logits_close:
            verdict = "FAILED: the tokens are equal but the logits differ beyond the tolerance"
        else:
            verdict = "FAILED: strict devices found a copy or a resident tensor the plan does not have"
        lines.append(f"verdict: {verdict}")
        return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def check_generation(gen: Any, model: Any, new_tokens: int, device_map: Mapping[str, str] | None = None, *,
                     strict_devices: bool = False, prompt: torch.Tensor | None = None, seed: int = 0,
                     model_name: str = "the model") -> GenerationCheck:
    """Run ``gen``'s emitted loop and the original's greedy decoding on one prompt; compare (see
    the module docstring).

    Raises:
        GenerationError: more new tokens than the plan's cache leaves after the prompt.
        (and what :func:`~backends.torch.generate.emit_generate` raises)
    """
    if isinstance(model, DecodeStep):
        raise GenerationError("check the model itself, not its decode step: the original's greedy decoding "
                              "runs the model as it is")
    generator = emit_generate(gen, model, device_map, strict_devices=strict_devices)
    if prompt is None:
        rng = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, generator.vocab_size, (gen.batch, max(1, gen.prompt_tokens // 2)), generator=rng)
    tokens = generator.generate(prompt, max_new_tokens=new_tokens)
    emitted_logits = generator.last_logits
    prefill_s = generator.timings["prefill_s"]
    decode = generator.timings["decode_s"]
    started = time.perf_counter()
    want, want_logits = reference_greedy(model, prompt, new_tokens)
    original_s = time.perf_counter() - started
    length = prompt.shape[1]
    precision = None
    compare_to, compare_logits = want, want_logits
    rtol, atol = FLOAT_TOLERANCE if _dtype(model) == torch.float32 else LOW_TOLERANCE
    if gen.precision:  # held to the same precision unplaced, its error against float reported
        unplaced = emit_generate(gen, model, {d: "cpu" for d in gen.prefill.devices.names()})
        compare_to = unplaced.generate(prompt, max_new_tokens=new_tokens)
        compare_logits = unplaced.last_logits
        rtol, atol = LOW_TOLERANCE
        precision = _precision_errors(gen, tokens[:, length:], emitted_logits, compare_logits,
                                      want[:, length:].cpu(), want_logits)
    same, compared, steps = _agreement(tokens[:, length:], compare_to[:, length:].cpu(), emitted_logits,
                                       compare_logits)
    a, b = emitted_logits[:, :steps], compare_logits[:, :steps]
    error = float((a - b).abs().max()) if steps else 0.0
    close = bool(torch.allclose(a, b, rtol=rtol, atol=atol)) if steps else True
    return GenerationCheck(model_name, length, new_tokens, same, compared, error, (rtol, atol), close,
                           prefill_s, statistics.median(decode) if decode else None, original_s,
                           generator.device_reports() if strict_devices else {}, precision)


def _agreement(mine: torch.Tensor, theirs: torch.Tensor, my_logits: torch.Tensor,
               their_logits: torch.Tensor) -> tuple[int, int, int]:
    """New tokens equal from the first, tokens compared (the longer run), and the steps whose
    logits both computed from equal histories."""
    compared = max(mine.shape[1], theirs.shape[1])
    same = 0
    while same < min(mine.shape[1], theirs.shape[1]) and torch.equal(mine[:, same], theirs[:, same]):
        same += 1
    return same, compared, min(same + 1, my_logits.shape[1], their_logits.shape[1])


def _precision_errors(gen: Any, mine: torch.Tensor, placed: torch.Tensor, unplaced: torch.Tensor,
                      float_tokens: torch.Tensor, float_logits: torch.Tensor) -> PrecisionErrors:
    counts: dict[str, int] = {}
    for w in gen.precision["decode"]["weights"].values():
        counts[w] = counts.get(w, 0) + 1
    same, _, steps = _agreement(mine, float_tokens, placed, float_logits)

    def relative(logits: torch.Tensor) -> float:
        if not steps:
            return 0.0
        a, b = logits[:, :steps].float(), float_logits[:, :steps].float()
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    return PrecisionErrors(counts, len(gen.precision["decode"]["ops"]), relative(placed), relative(unplaced), same)


def _dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
