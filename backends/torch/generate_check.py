"""``hetpart check --generate N``: a generation plan's emitted loop beside the original's greedy decoding.

In: a :class:`~partitioner.plan.generation.GenerationPlan`, the model (real weights), the number of
new tokens, a binding or strict devices, and a prompt (default: random token ids of half the planned
prompt length, seeded). Out: a :class:`GenerationCheck`: how many new tokens equal the original's,
the largest logit difference over the steps where both saw the same tokens, the times of both, each
phase's strict-devices report, and a verdict (its last line of text).

The original's greedy decoding is transformers' own ``generate(do_sample=False)`` where the model
has it (its dynamic cache, not the plan's static one), else the model's forward over the whole
sequence once per new token (no cache at all).

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

__all__ = ["GenerationCheck", "check_generation", "reference_greedy"]


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

    @property
    def passed(self) -> bool:
        return (self.equal_tokens == self.compared_tokens and self.logits_close
                and all(r.passed for r in self.strict.values()))

    def to_text(self) -> str:
        rtol, atol = self.tolerance
        lines = [f"generation check of {self.model_name}: prompt {self.prompt_tokens} tokens, "
                 f"{self.new_tokens} new tokens, greedy",
                 f"  tokens   {self.equal_tokens} of {self.compared_tokens} new tokens equal the original's",
                 f"  logits   max abs difference {self.max_logit_error:.3g} "
                 f"({'within' if self.logits_close else 'OUTSIDE'} rtol {rtol:g}, atol {atol:g})",
                 f"  time     emitted: prefill {_ms(self.prefill_s)}, decode {_ms(self.decode_s)} per token "
                 f"(median); original generate {_ms(self.original_s)} in all"]
        for phase, report in self.strict.items():
            lines.append(f"  {phase}: " + report.to_text().replace("\n", "\n  "))
        if self.passed:
            verdict = "PASSED: the emitted generate loop gives the original's tokens"
        elif self.equal_tokens != self.compared_tokens:
            verdict = (f"FAILED: new token {self.equal_tokens + 1} differs from the original's")
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
    mine, theirs = tokens[:, length:], want[:, length:].cpu()
    compared = max(mine.shape[1], theirs.shape[1])
    same = 0
    while same < min(mine.shape[1], theirs.shape[1]) and torch.equal(mine[:, same], theirs[:, same]):
        same += 1
    steps = min(same + 1, emitted_logits.shape[1], want_logits.shape[1])  # the logits of equal histories
    a, b = emitted_logits[:, :steps], want_logits[:, :steps]
    rtol, atol = (1e-4, 1e-4) if _dtype(model) == torch.float32 else (2e-2, 2e-2)
    error = float((a - b).abs().max()) if steps else 0.0
    close = bool(torch.allclose(a, b, rtol=rtol, atol=atol)) if steps else True
    return GenerationCheck(model_name, length, new_tokens, same, compared, error, (rtol, atol), close,
                           prefill_s, statistics.median(decode) if decode else None, original_s,
                           generator.device_reports() if strict_devices else {})


def _dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
