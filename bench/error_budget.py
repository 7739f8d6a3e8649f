"""Plans under an accuracy budget: ``precision={"weights": "auto", "max_error": e}``.

For the seed case (emb-transformer ``base``, GPU capped to the embedding plus half the layers) and
``gpt:small`` (GPU capped at 12 MB) on ``h200-host``, with real random weights (the budget is
measured on the example inputs): the fastest plan with no budget, then plans under tighter budgets
— predicted time, the error measured through the plan's own kernels on this CPU, the solver's
estimate, and which linears it packs where. The whole Llama-3-8B shape (16 GB of bf16 weights, 675
forwards to measure its 225 linears) is beyond this 2-core, 24 GiB machine; ``--llama-layers N`` plans
its first N layers with real weights, the GPU capped at the same share of them as 16 GB of the 8B.

    python bench/error_budget.py [--time-limit 30] [--seed-size small] [--llama-layers 4]
    python bench/plan_quality.py --precision          # prints this table after the precision tables
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import models
from cost_models.units import format_seconds
from partitioner import partition
from partitioner.errors import HetpartError
from cost_models.calibration import measured_anchors

BUDGETS = (None, 0.05, 0.01, 0.002)


def _llama_8b_layers(layers: int) -> tuple[str, Any, dict[str, int]]:
    """The Llama-3-8B shape cut to ``layers`` decoder layers, with real random bfloat16 weights, one
    token (decode-shaped), and ``cuda:0`` capped at the share of its weights that 16 GB is of the
    whole 8B model's 16.06 GB (so it fits as tightly as the 8B row of ``--precision``)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    cap = int(weights * 16e9 / 16.06e9)
    return (f"Llama-3-8B shape, {layers} layers, 1 token, cuda:0 {cap / 1e9:.2f} GB",
            (module, (torch.zeros(1, 1, dtype=torch.long),)), {"cuda:0": cap})


def budget_rows(time_limit: float, seed_size: str = "base", llama_layers: int = 0) -> None:
    """Print the budget table (see the module docstring); ``seed_size="small"`` plans the seed model at
    ``small`` with the GPU capped at its embedding plus half its layers (minutes less to measure);
    ``llama_layers`` adds the Llama-3-8B shape cut to that many layers with real weights."""
    if seed_size == "base":
        seed = ("seed case (GPU emb+half layers)", ("emb-transformer", "base"),
                {"cuda:0": int(measured_anchors()["cap_half_layers"])})
    else:
        module, _ = models.get("emb-transformer", seed_size, device="meta")
        table = sum(p.numel() * 4 for n, p in module.named_parameters() if "emb" in n)
        layers = sum(p.numel() * 4 for n, p in module.named_parameters() if "emb" not in n)
        seed = (f"seed model {seed_size} (GPU emb+half layers)", ("emb-transformer", seed_size),
                {"cuda:0": table + layers // 2})
    cases = [seed, ("gpt:small, 12 MB", ("gpt", "small"), {"cuda:0": "12MB"})]
    if llama_layers:
        cases.append(_llama_8b_layers(llama_layers))
    header = ["case", "max_error", "time", "vs no budget", "measured", "estimated", "packed linears", "plan s"]
    rows = []
    for label, model, caps in cases:
        module, inputs = models.get(*model) if isinstance(model[0], str) else model
        fastest = None
        for budget in BUDGETS:
            setting = {"weights": "auto"} if budget is None else {"weights": "auto", "max_error": budget}
            started = time.perf_counter()
            try:
                plan = partition(module, inputs, "h200-host", memory=caps, precision=setting, time_limit=time_limit)
            except HetpartError as exc:
                rows.append([label, f"{budget:g}" if budget else "none", "-", "-", "-", "-",
                             f"({str(exc).splitlines()[0][:90]})", f"{time.perf_counter() - started:.1f}"])
                continue
            total = plan.predicted["total_s"]
            fastest = fastest or total
            error = plan.precision.get("error", {})
            packed: dict[str, int] = {}
            for op, w in plan.precision.get("weights", {}).items():
                key = f"{w} on {plan.placement[op]}"
                packed[key] = packed.get(key, 0) + 1
            rows.append([label, f"{budget:g}" if budget else "none", format_seconds(total), f"{total / fastest:.2f}x",
                         f"{error['measured']['all']:.2e}" if error else "-",
                         f"{error['estimated']:.2e}" if "estimated" in error else "-",
                         ", ".join(f"{n} {k}" for k, n in sorted(packed.items())) or "-",
                         f"{time.perf_counter() - started:.1f}"])
        del module, model
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print("(predicted times; errors are relative L2 errors of the outputs against the float model on the example "
          "inputs, measured through the plan's kernels on this CPU (float8: dequantized weights, no host kernel); "
          "'plan s' includes measuring each weight packed alone)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--seed-size", default="base", choices=("tiny", "small", "base"),
                        help="the seed model's size (base: the calibration case, minutes to measure its 48 linears)")
    parser.add_argument("--llama-layers", type=int, default=0, metavar="N",
                        help="add the Llama-3-8B shape cut to N layers, real bf16 weights (N=4: 3.9 GB)")
    args = parser.parse_args()
    budget_rows(args.time_limit, args.seed_size, args.llama_layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
