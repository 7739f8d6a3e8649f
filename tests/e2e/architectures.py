"""transformers architectures from small configs (random weights, built in code; nothing downloaded).

Shared by ``tests/e2e/test_compile_architectures.py`` and ``bench/architectures.py``. Each
:class:`Arch` builds its model (dropout, layer drop and spec-augment masking off, so training is
deterministic and comparable with eager), its inputs (keyword tensors, as a user calls the model)
and a module-path pin that ``partition()`` accepts for the model.

Example:
    >>> model, kwargs = ARCHES["llama"].build()            # doctest: +SKIP
    >>> model(**kwargs).logits.shape                       # doctest: +SKIP
    torch.Size([2, 8, 256])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

VOCAB, BATCH, SEQ = 256, 2, 8
_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, use_cache=False)


@dataclasses.dataclass(frozen=True)
class Arch:
    """One architecture: how to build it small, what to call it with, a pin by module path."""

    name: str
    config: Callable[[Any], Any]      # transformers module -> config
    model: str                        # the transformers class built from the config
    inputs: Callable[[], dict[str, torch.Tensor]]
    pin: tuple[str, str]              # (module path pattern, device)

    def build(self, seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        """The model (eval mode, random weights from ``seed``) and its keyword inputs."""
        import transformers

        transformers.logging.set_verbosity_error()
        config = self.config(transformers)
        _deterministic(config)
        torch.manual_seed(seed)
        model = getattr(transformers, self.model)(config).eval()
        torch.manual_seed(seed + 1)
        return model, self.inputs()


def _deterministic(config: Any) -> None:
    """No dropout, layer drop, drop path or spec-augment masks: training equals eager's."""
    for key, value in config.to_dict().items():
        if isinstance(value, float) and ("drop" in key or key.startswith("mask_") and key.endswith("_prob")):
            setattr(config, key, 0.0)
    for sub in ("text_config", "vision_config", "audio_config"):
        if getattr(config, sub, None) is not None:
            _deterministic(getattr(config, sub))


def _ids(length: int = SEQ) -> Callable[[], dict[str, torch.Tensor]]:
    return lambda: {"input_ids": torch.randint(3, VOCAB, (BATCH, length))}


def _pixels(size: int = 32) -> Callable[[], dict[str, torch.Tensor]]:
    return lambda: {"pixel_values": torch.randn(BATCH, 3, size, size)}


ARCHES: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", lambda t: t.LlamaConfig(**_DECODER), "LlamaForCausalLM", _ids(), ("model.layers.0.self_attn*", "cpu")),
    Arch("mistral", lambda t: t.MistralConfig(**_DECODER, sliding_window=None), "MistralForCausalLM", _ids(),
         ("model.layers.0.self_attn*", "cpu")),
    Arch("qwen2", lambda t: t.Qwen2Config(**_DECODER), "Qwen2ForCausalLM", _ids(), ("model.layers.0.self_attn*", "cpu")),
    Arch("gemma", lambda t: t.GemmaConfig(**_DECODER, head_dim=16), "GemmaForCausalLM", _ids(),
         ("model.layers.0.self_attn*", "cpu")),
    Arch("phi", lambda t: t.PhiConfig(**{k: v for k, v in _DECODER.items() if k != "num_key_value_heads"}),
         "PhiForCausalLM", _ids(), ("model.layers.0.self_attn*", "cpu")),
    Arch("qwen2-moe", lambda t: t.Qwen2MoeConfig(**_DECODER, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                                 num_experts=4, num_experts_per_tok=2),
         "Qwen2MoeForCausalLM", _ids(), ("model.layers.0.self_attn*", "cpu")),
    Arch("mixtral", lambda t: t.MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2),
         "MixtralForCausalLM", _ids(), ("model.layers.0.self_attn*", "cpu")),
    Arch("bart", lambda t: t.BartConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                        decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                        vocab_size=VOCAB, max_position_embeddings=64, use_cache=False),
         "BartForConditionalGeneration", _ids(), ("model.encoder*", "cpu")),
    Arch("t5", lambda t: t.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=1, num_decoder_layers=1, num_heads=4,
                                    vocab_size=VOCAB, use_cache=False),
         "T5ForConditionalGeneration",
         lambda: {"input_ids": torch.randint(3, VOCAB, (BATCH, SEQ)),
                  "decoder_input_ids": torch.randint(3, VOCAB, (BATCH, 4))}, ("encoder*", "cpu")),
    Arch("whisper", lambda t: t.WhisperConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                              decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                              num_mel_bins=16, max_source_positions=16, max_target_positions=16,
                                              vocab_size=VOCAB, use_cache=False, pad_token_id=0, bos_token_id=1,
                                              eos_token_id=2, decoder_start_token_id=1),
         "WhisperModel",
         lambda: {"input_features": torch.randn(BATCH, 16, 32),
                  "decoder_input_ids": torch.randint(3, VOCAB, (BATCH, 4))}, ("encoder*", "cpu")),
    Arch("vit", lambda t: t.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                      image_size=32, patch_size=8, num_labels=10),
         "ViTForImageClassification", _pixels(), ("vit.embeddings*", "cpu")),
    Arch("wav2vec2", lambda t: t.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2),
                                                conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                num_conv_pos_embedding_groups=4, vocab_size=32),
         "Wav2Vec2ForCTC", lambda: {"input_values": torch.randn(BATCH, 400)}, ("wav2vec2.feature_extractor*", "cpu")),
    Arch("swin", lambda t: t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                        window_size=4, num_labels=10),
         "SwinForImageClassification", _pixels(), ("swin.embeddings*", "cpu")),
    Arch("resnet", lambda t: t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                                            num_labels=10),
         "ResNetForImageClassification", _pixels(), ("resnet.embedder*", "cpu")),
)}


SPLIT_FROM = 10  # graphs of fewer ops are planned without caps


class SplitCaps:
    """``options_for`` of :class:`~backends.compile.strict.StrictCompile`: each graph of
    :data:`SPLIT_FROM` ops or more gets caps on cpu and cuda:0 below what one device needs for it
    and above its largest op (as ``split_caps`` of ``test_compile_backend``), so it is split (the
    pieces a graph break leaves can be too small to split). :attr:`graphs` keeps each graph as
    captured (module paths of its ops)."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Any) -> Any:
        from partitioner.frontends.fx import from_graph_module
        from partitioner.planner import partition_outcome

        graph = from_graph_module(gm, example_inputs)
        self.graphs.append(graph)
        if len(graph) < SPLIT_FROM:
            return options
        training = options.training if options.training is not None else torch.is_grad_enabled()
        single = partition_outcome(graph, None, options.profile(), solver="single:cpu", training=training,
                                   optimizer=options.optimizer)
        used = single.plan.memory["cpu"]["used"]
        cap = max(int(used * 0.85), max(single.problem.work_mem.values()) + 4096)
        return options.replace(memory={"cpu": cap, "cuda:0": cap})


def tensors(output: Any) -> list[torch.Tensor]:
    """The tensors a model returned (a ``ModelOutput``, a tuple or one tensor), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    values = output.to_tuple() if hasattr(output, "to_tuple") else tuple(output)
    out: list[torch.Tensor] = []
    for value in values:
        out.extend(tensors(value) if isinstance(value, (tuple, list)) or hasattr(value, "to_tuple")
                   else [value] if isinstance(value, torch.Tensor) else [])
    return out


def state_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
