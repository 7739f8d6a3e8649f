"""A causal language model's generation step: one module whose KV cache is state (buffers).

In: a causal LM (a transformers ``PreTrainedModel`` with a generation head, or a model offering
``with_static_cache(batch, max_context)`` such as the zoo's GPT), the largest batch and the
context (prompt + new tokens) to plan for. Out: a :class:`DecodeStep`, an ``nn.Module`` with

* ``forward(input_ids, cache_position) -> logits``: ``input_ids`` of shape ``[batch, tokens]``,
  ``cache_position`` the ``tokens`` positions they take in the cache (``arange(P)`` for a prompt of
  ``P`` tokens, ``[p]`` for the token at position ``p``); the step writes their keys and values into
  the cache and attends over the whole static cache (masked beyond each position);
* the cache as buffers of fixed size ``[batch, kv heads, max_context, head dim]`` per layer (their
  names in ``cache_names``), so a capture sees them as the state of the ops that write them and the
  planner places them like weights, counted at their full size;
* one capture per phase at fixed shapes (:func:`phase_inputs`): the prefill at the prompt length,
  the decode step at one token. Both captures have the same ops and parameters.

transformers models get transformers' own ``StaticCache`` through its export wrapper
(``transformers.integrations.executorch.TorchExportableModuleWithStaticCache``), the one its
ExecuTorch export uses; the caller's model is not changed (its generation config is put back).

A prompt shorter than the planned prompt length runs padded on the right: the padding's keys land
in cache positions the next tokens overwrite before they are read, and every real position
attends only to positions before it, so the logits of the real tokens are those of the unpadded
prompt.

Example:
    >>> step = decode_step(model, batch=1, max_context=640)            # doctest: +SKIP
    >>> logits = step(*phase_inputs(step, 512))                        # prefill shapes
    >>> logits = step(*phase_inputs(step, 1, start=512))               # one decode step
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from partitioner.errors import CaptureError

__all__ = ["DecodeStep", "decode_step", "phase_inputs", "is_decode_step"]


class DecodeStep(nn.Module):
    """A causal LM with a static KV cache as buffers; ``forward(input_ids, cache_position)``.

    ``batch`` and ``max_context`` are the cache's planned sizes, ``vocab_size`` the logits' width,
    ``cache_names`` the cache buffers' names (keys and values of every layer, and any length counter
    the cache keeps), ``kind`` where the cache comes from (``"transformers"`` or ``"model"``).
    """

    def __init__(self, inner: nn.Module, *, batch: int, max_context: int, vocab_size: int, kind: str) -> None:
        super().__init__()
        self.inner = inner
        self.batch = batch
        self.max_context = max_context
        self.vocab_size = vocab_size
        self.kind = kind
        self.cache_names = tuple(f"inner.{name}" for name, _ in inner.named_buffers()
                                 if _is_cache_buffer(name))

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        if self.kind == "transformers":
            return self.inner(input_ids=input_ids, cache_position=cache_position)
        return self.inner(input_ids, cache_position)

    @torch.no_grad()
    def reset(self) -> None:
        """Empty the cache (zeros everywhere), ready for a new request."""
        for name in self.cache_names:
            self.get_buffer(name).zero_()


def _is_cache_buffer(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf.startswith(("key_cache", "value_cache", "cumulative_length", "cache_k", "cache_v"))


def is_decode_step(model: Any) -> bool:
    """Whether ``model`` is already a :class:`DecodeStep`."""
    return isinstance(model, DecodeStep)


def decode_step(model: Any, *, batch: int, max_context: int) -> DecodeStep:
    """``model``'s generation step with a static cache for ``batch`` sequences of ``max_context`` tokens.

    Raises:
        CaptureError: ``model`` is no causal language model whose cache can be made static (named,
            with what is accepted), or a size is not a positive integer.
    """
    if is_decode_step(model):
        if (model.batch, model.max_context) != (batch, max_context):
            raise CaptureError(f"the decode step was built for batch {model.batch} and {model.max_context} tokens "
                               f"of context, not batch {batch} and {max_context}: build it again with decode_step")
        return model
    for what, value in (("batch", batch), ("max_context", max_context)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CaptureError(f"{what} must be a positive integer, not {value!r}")
    if hasattr(model, "with_static_cache"):
        try:
            inner = model.with_static_cache(batch, max_context)
        except ValueError as exc:  # the model's own refusal (a context beyond its positions, ...)
            raise CaptureError(f"{type(model).__name__}.with_static_cache: {exc}") from exc
        return DecodeStep(inner, batch=batch, max_context=max_context, vocab_size=int(inner.vocab_size), kind="model")
    return _transformers_step(model, batch, max_context)


def _transformers_step(model: Any, batch: int, max_context: int) -> DecodeStep:
    name = type(model).__name__
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None or not hasattr(model, "generation_config") \
            or not _is_causal_lm(model):
        raise CaptureError(
            f"{name} is not a causal language model whose KV cache hetpart can capture: generation plans take a "
            f"transformers model with a generation head (AutoModelForCausalLM: GPT-2, Llama, Mistral, Qwen2-MoE, ...) "
            f"or a model with a with_static_cache(batch, max_context) method (the zoo's gpt)")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if limit is not None and max_context > int(limit):
        raise CaptureError(f"{name} has {limit} positions (max_position_embeddings) but the plan asks for a context "
                           f"of {max_context} tokens (prompt + new tokens): ask for fewer tokens")
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    saved = model.generation_config
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": batch, "max_cache_len": max_context})
    try:
        with torch.no_grad():
            inner = TorchExportableModuleWithStaticCache(model, batch_size=batch, max_cache_len=max_context)
    except Exception as exc:  # transformers raises AssertionError / ValueError / NotImplementedError here
        raise CaptureError(f"transformers could not give {name} a static KV cache: {str(exc).splitlines()[0][:300]}; "
                           f"generation plans need a model whose cache_implementation='static' works") from exc
    finally:
        model.generation_config = saved
    inner.model.generation_config = copy.copy(saved)
    vocab = int(getattr(text, "vocab_size", 0) or model.get_output_embeddings().weight.shape[0])
    return DecodeStep(inner, batch=batch, max_context=max_context, vocab_size=vocab, kind="transformers")


def _is_causal_lm(model: nn.Module) -> bool:
    get = getattr(model, "get_output_embeddings", None)
    try:
        return get is not None and get() is not None and getattr(model, "can_generate", lambda: True)()
    except (AttributeError, NotImplementedError, TypeError):
        return False


def phase_inputs(step: DecodeStep, tokens: int, *, start: int = 0,
                 device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Example inputs of one phase: ``tokens`` token ids per sequence (zeros) at positions ``start ...``.

    ``phase_inputs(step, P)`` are the prefill's shapes, ``phase_inputs(step, 1, start=P)`` a decode step's.
    """
    if start + tokens > step.max_context:
        raise CaptureError(f"positions {start}..{start + tokens - 1} do not fit the cache of {step.max_context} "
                           f"tokens: plan a longer context")
    ids = torch.zeros((step.batch, tokens), dtype=torch.long, device=device)
    return ids, torch.arange(start, start + tokens, dtype=torch.long, device=device)
