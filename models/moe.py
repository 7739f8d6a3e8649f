"""``moe``: a mixture-of-experts decoder laid out like HuggingFace's Qwen2-MoE.

In the zoo for the widest fan-out a transformer gives a partitioner: in every layer a router
scores the experts, and the experts' SwiGLU MLPs plus a sigmoid-gated shared expert all read the
same hidden state and are summed back, so each layer is a bundle of parallel branches holding
most of the weights. Attention uses rotary position embeddings (q/k/v with biases, o without),
norms are RMSNorm.

The routing is written densely so that ``torch.export`` and ``symbolic_trace`` see a static
graph: the top-k router weights are scattered into a dense ``(B, T, E)`` tensor and every expert
runs on every token, weighted (zero for the experts a token did not choose). Outputs equal a
sparse dispatch's; the FLOPs counted are the dense ones (every expert on every token). ``base``
is Qwen1.5-MoE's layer shape (hidden 2048, experts of 1408, a shared expert of 5632) with 8
experts, top-2, and 4 layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models._zoo import Built, ZooEntry, pick_size
from models.blocks import init_weights


@dataclass(frozen=True)
class MoEConfig:
    vocab: int
    d_model: int
    n_heads: int
    n_layers: int
    n_experts: int
    top_k: int
    d_expert: int
    d_shared: int
    batch: int
    seq: int
    rope_theta: float = 1e6


CONFIGS: dict[str, MoEConfig] = {
    "tiny": MoEConfig(vocab=128, d_model=32, n_heads=4, n_layers=1, n_experts=3, top_k=2, d_expert=32,
                      d_shared=64, batch=2, seq=16),
    "small": MoEConfig(vocab=8192, d_model=256, n_heads=4, n_layers=2, n_experts=8, top_k=2, d_expert=256,
                       d_shared=512, batch=2, seq=128),
    "base": MoEConfig(vocab=151936, d_model=2048, n_heads=16, n_layers=4, n_experts=8, top_k=2, d_expert=1408,
                      d_shared=5632, batch=1, seq=512),
}

EPS = 1e-6


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryAttention(nn.Module):
    """Causal self-attention with rotary embeddings over a fixed sequence length."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(cfg.seq).float(), inv)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).flatten(2))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: one expert's MLP."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert (Qwen2-MoE's block)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.gate = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.d_model, cfg.d_expert) for _ in range(cfg.n_experts))
        self.shared_expert = SwiGLU(cfg.d_model, cfg.d_shared)
        self.shared_expert_gate = nn.Linear(cfg.d_model, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x), dim=-1)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        weights = torch.zeros_like(probs).scatter(-1, top_i, top_w)
        out = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        for e, expert in enumerate(self.experts):
            out = out + weights[..., e:e + 1] * expert(x)
        return out


class MoELayer(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.attn = RotaryAttention(cfg)
        self.post_attention_norm = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.mlp = SparseMoE(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_attention_norm(x))


class MoEDecoder(nn.Module):
    """``input_ids (B, T)`` -> logits ``(B, T, vocab)``."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(MoELayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=EPS)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        init_weights(self)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def build(size: str) -> Built:
    cfg = pick_size(CONFIGS, size, "moe")
    return MoEDecoder(cfg), (torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq)),)


ENTRY = ZooEntry(
    name="moe",
    description="mixture-of-experts decoder (Qwen2-MoE layout): rotary attention, top-k router, "
                "parallel SwiGLU experts and a gated shared expert",
    build=build,
    no_split_classes=("MoELayer",),
)
