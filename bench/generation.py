"""Generation plans, predicted: hetpart's prefill + decode plan beside the placements users run today.

For each model and machine, ``plan_generation`` places the prefill (P = 512 tokens) and the decode
step (one token, a static KV cache of P + N = 640 positions) together, bf16 weights, batch 1, the
objective a request's time (prefill + N - 1 = 127 decode steps). Every placement is costed by the
same model for both phases (:mod:`partitioner.solvers.generation_baselines`):

* ``hetpart``: the joint ILP (placements may differ per phase; memory shared);
* ``one placement``: the best plan that uses every weight the same way in both phases (the joint ILP
  with each weight's device and streaming linked across phases): the gain of two phases is the gap
  between this row and hetpart's;
* ``llama.cpp --fit``: the last layers on the GPU by memory, the rest computed on the CPU; prefill
  streams CPU weights to the GPU (op offload at >= 32 tokens);
* ``llama.cpp -ot exps=CPU`` (MoE models): routed experts in host memory, everything else on the GPU;
* ``greedy``: accelerate's ``device_map="auto"``, offloaded weights copied synchronously per step.

``*`` marks a placement that does not fit. Each case ends with whether hetpart is at least as fast
as every baseline that fits, and whether its decode placement differs from its prefill placement
(the modules holding the most bytes that are used differently).

Models (transformers configs on the meta device, built in bf16):

* ``llama-3-8b``: LlamaConfig(hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads,
  vocabulary 128,256) — 16.1 GB;
* ``mixtral-8x7b``: MixtralConfig(hidden 4096, intermediate 14336, 32 layers, 8 experts, top 2,
  vocabulary 32,000) — 93 GB;
* ``qwen2-moe``: Qwen2MoeConfig as Qwen1.5-MoE-A2.7B (hidden 2048, 24 layers, 60 experts of 1,408,
  top 4, a shared expert of 5,632, vocabulary 151,936) — 28.6 GB.

Machines: ``h200-host`` with ``cuda:0`` capped at 16 GB and at 40 GB; ``desktop-4090`` (24 GiB).

Weights (``--weights``): ``bf16`` (the model's own dtype: the float rows), ``int8`` / ``int4``
(``precision={"weights": ...}``: every linear whose shape allows it packed) and ``auto`` (the ILP
chooses per op between bf16 and each packed dtype the device has a kernel for); weight-only kernels
are priced by each profile's ``weight_only`` rates and the packed bytes, one stored copy serves both
phases, and the baselines place the same packed model. A last table lists hetpart's plan per weight dtype side by
side: the decode step reads every weight once, so packed bytes are where a decode step gains.

    python bench/generation.py [--models llama-3-8b,mixtral-8x7b,qwen2-moe] [--machines h200-16,h200-40,desktop]
                               [--weights bf16,int8,int4] [--time-limit 60] [--prompt-tokens 512]
                               [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, when run as a script

from cost_models.units import format_bytes, format_seconds  # noqa: E402
from partitioner import plan_generation  # noqa: E402

MACHINES = {
    "h200-16": ("h200-host", {"cuda:0": "16GB"}),
    "h200-40": ("h200-host", {"cuda:0": "40GB"}),
    "desktop": ("desktop-4090", None),
}


def _model(name: str) -> torch.nn.Module:
    import transformers

    if name == "llama-3-8b":
        config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                          num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
        cls = transformers.LlamaForCausalLM
    elif name == "mixtral-8x7b":
        config = transformers.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                            num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                                            num_experts_per_tok=2, vocab_size=32000)
        cls = transformers.MixtralForCausalLM
    elif name == "qwen2-moe":
        config = transformers.Qwen2MoeConfig(hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
                                             shared_expert_intermediate_size=5632, num_experts=60,
                                             num_experts_per_tok=4, num_hidden_layers=24, num_attention_heads=16,
                                             num_key_value_heads=16, vocab_size=151936)
        cls = transformers.Qwen2MoeForCausalLM
    else:
        raise SystemExit(f"unknown model {name!r}: use llama-3-8b, mixtral-8x7b or qwen2-moe")
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        module = cls(config).to(torch.bfloat16)
    return module.eval()


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def case(model: str, machine: str, weights: str, args: argparse.Namespace, rows: list) -> bool:
    devices, memory = MACHINES[machine]
    started = time.perf_counter()
    precision = None if weights == "bf16" else {"weights": weights}
    gen = plan_generation(_model(model), devices, memory=memory, prompt_tokens=args.prompt_tokens,
                          new_tokens=args.new_tokens, time_limit=args.time_limit, model_name=model,
                          precision=precision)
    seconds = time.perf_counter() - started
    p, s = gen.predicted, gen.solver
    gap = "n/a" if s.gap is None else f"{s.gap:.2%}"
    print(f"\n{model} on {machine} ({devices}{', cuda:0 ' + memory['cuda:0'] if memory else ''}), weights "
          f"{weights}: planned in {seconds:.0f} s, {s.status}, gap {gap}")
    print(f"  {'placement':<24} {'prefill tok/s':>14} {'decode tok/s':>13} {'request':>10} {'vs hetpart':>11}")
    request = p["request_s"]
    print(f"  {'hetpart':<24} {_rate(p['prefill_tokens_per_s']):>14} {_rate(p['decode_tokens_per_s']):>13} "
          f"{format_seconds(request):>10} {'1.00x':>11}")
    ok = True
    for name, b in gen.baselines.items():
        if b["prefill_s"] is None:
            print(f"  {name:<24} {'-':>14} {'-':>13} {'-':>10} {'':>11}  ({b['note']})")
            continue
        pre_rate = gen.batch * gen.prompt_tokens / b["prefill_s"]
        dec_rate = gen.batch / b["decode_s"]
        mark = "" if b["feasible"] else " *"
        ratio = f"{b['request_s'] / request:.2f}x"
        print(f"  {name + mark:<24} {pre_rate:>14,.1f} {dec_rate:>13,.1f} {format_seconds(b['request_s']):>10} "
              f"{ratio:>11}")
        if b["feasible"] and b["request_s"] < request * (1 - 1e-9):
            ok = False
    differ = gen.phase_difference()
    packed = gen.precision.get("decode", {}).get("weights", {}) if gen.precision else {}
    rows.append((model, machine, weights, p["prefill_tokens_per_s"], p["decode_tokens_per_s"], request,
                 {d: gen.decode.memory.get(d, {}).get("used", 0) for d in gen.decode.devices.names()},
                 len(packed), len(gen.decode.weights)))
    print(f"  hetpart at least as fast as every baseline that fits: {'yes' if ok else 'NO'}")
    if differ:
        shown = "; ".join(f"{m.removeprefix('inner.model.')}: prefill {a}, decode {b}" for m, a, b in differ[:3])
        print(f"  decode placement differs from prefill in {len(differ)} modules, e.g. {shown}")
    else:
        print("  decode placement is the prefill's")
    return ok


def weights_table(rows: list) -> None:
    """hetpart's plan per weight dtype, side by side for each model and machine."""
    print("\nhetpart's plan per weight dtype (predicted)")
    print(f"  {'model':<14} {'machine':<9} {'weights':<7} {'prefill tok/s':>14} {'decode tok/s':>13} {'request':>10} "
          f"{'decode memory per device':>34} {'packed':>7} {'streamed':>9}")
    for model, machine, weights, pre, dec, request, memory, packed, streamed in rows:
        used = ", ".join(f"{d} {format_bytes(b)}" for d, b in memory.items())
        print(f"  {model:<14} {machine:<9} {weights:<7} {_rate(pre):>14} {_rate(dec):>13} "
              f"{format_seconds(request):>10} {used:>34} {packed:>7} {streamed:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3-8b,mixtral-8x7b,qwen2-moe")
    parser.add_argument("--machines", default="h200-16,h200-40,desktop")
    parser.add_argument("--weights", default="bf16,int8,int4", help="bf16 (as built), int8, int4, auto")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    rows: list = []
    results = [case(m, machine, w, args, rows) for m in args.models.split(",") for machine in args.machines.split(",")
               for w in args.weights.split(",")]
    weights_table(rows)
    print(f"\nhetpart at least as fast as every fitting baseline on {sum(results)} of {len(results)} cases")


if __name__ == "__main__":
    main()
