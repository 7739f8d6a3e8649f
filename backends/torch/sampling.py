"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p.

In: the logits of the last position of each sequence (``[batch, vocab]``) and a :class:`Sampling`
record. Out: the next token of each sequence (``[batch]``, int64). The order is transformers'
(``generate``'s logits warpers): temperature, then top-k, then top-p (nucleus), then one draw from
the softmax. Draws come from the record's own ``torch.Generator`` seeded by ``seed``, so a seeded
run repeats exactly and the process's global random state is left alone.

Example:
    >>> s = Sampling.build(do_sample=True, temperature=0.7, top_k=50, seed=0)
    >>> next_token(torch.tensor([[0.0, 5.0, 1.0]]), Sampling.build()).tolist()
    [1]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from partitioner.errors import GenerationError

__all__ = ["Sampling", "next_token"]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How tokens are chosen: greedy (``do_sample=False``), or sampled; checked by :meth:`build`."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    @classmethod
    def build(cls, *, do_sample: bool = False, temperature: float | None = None, top_k: int | None = None,
              top_p: float | None = None, seed: int | None = None) -> Sampling:
        """The record of these settings.

        Raises:
            GenerationError: a value out of range, or a sampling setting given for greedy decoding.
        """
        if not isinstance(do_sample, bool):
            raise GenerationError(f"do_sample must be True or False, not {do_sample!r}")
        given = [n for n, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("seed", seed))
                 if v is not None]
        if given and not do_sample:
            raise GenerationError(f"{', '.join(given)} only change sampled decoding; greedy decoding "
                                  f"(do_sample=False) takes the most likely token: pass do_sample=True or drop them")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or not math.isfinite(temperature) or temperature <= 0):
            raise GenerationError(f"temperature must be a number above 0 (1.0 leaves the logits as they are), "
                                  f"not {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise GenerationError(f"top_k must be a positive integer (the tokens kept), not {top_k!r}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0 < top_p <= 1):
            raise GenerationError(f"top_p must be a number in (0, 1] (the probability mass kept), not {top_p!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise GenerationError(f"seed must be a non-negative integer, not {seed!r}")
        return cls(do_sample, float(temperature if temperature is not None else 1.0), top_k,
                   None if top_p is None else float(top_p), seed)

    def generator(self) -> torch.Generator | None:
        """A CPU generator for this request's draws (seeded when ``seed`` is set)."""
        if not self.do_sample:
            return None
        gen = torch.Generator("cpu")
        if self.seed is not None:
            gen.manual_seed(self.seed)
        else:
            gen.seed()
        return gen


def next_token(logits: torch.Tensor, sampling: Sampling, generator: Any = None) -> torch.Tensor:
    """The next token of each row of ``logits`` (``[batch, vocab]``, on the CPU)."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ordered, index = torch.sort(scores, descending=False, dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - sampling.top_p  # the low tail outside the kept mass
        drop[..., -1:] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(-1, index, drop), float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
