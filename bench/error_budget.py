"""Plans under an accuracy budget: ``precision={"weights": "auto", "max_error": e}``.

For the seed case (emb-transformer ``base``, GPU capped to the embedding plus half the layers) and
``gpt:small`` (GPU capped at 12 MB) on ``h200-host``, with real random weights (the budget is
measured on the example inputs): the fastest plan with no budget, then plans under tighter budgets
— predicted time, the error measured through the plan's own kernels on this CPU, the solver's
estimate, and which linears it packs where. The Llama-3-8B shape is planned on the meta device
(32 GB of float32 weights do not fit this machine), so it gets no budget row.

    python bench/error_budget.py [--time-limit 30] [--seed-size small]
    python bench/plan_quality.py --precision          # prints this table after the precision tables
"""

from __future__ import annotations

import argparse
import time

import models
from cost_models.units import format_seconds
from partitioner import partition
from partitioner.errors import HetpartError
from cost_models.calibration import measured_anchors

BUDGETS = (None, 0.05, 0.01, 0.002)


def budget_rows(time_limit: float, seed_size: str = "base") -> None:
    """Print the budget table (see the module docstring); ``seed_size="small"`` plans the seed model at
    ``small`` with the GPU capped at its embedding plus half its layers (minutes less to measure)."""
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
    header = ["case", "max_error", "time", "vs no budget", "measured", "estimated", "packed linears", "plan s"]
    rows = []
    for label, (name, size), caps in cases:
        module, inputs = models.get(name, size)
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
        del module
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
    args = parser.parse_args()
    budget_rows(args.time_limit, args.seed_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
