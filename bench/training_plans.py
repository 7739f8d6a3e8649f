"""Training under a memory cap: hetpart's plan beside every offload baseline, predicted.

For each case the plan is made with ``partition_outcome(..., training=True)`` on ``h200-host`` with
``cuda:0`` capped, and every placement is costed by the same model (:mod:`partitioner.solvers.problem`,
:mod:`partitioner.solvers.train_state`): hetpart's ILP, the all-GPU step with the same optimizer
(``single:cuda:0``, which does not fit), and the offload systems users run today —
ZeRO-Offload, FSDP2's ``CPUOffloadPolicy`` and torchao's ``CPUOffloadOptimizer``
(:mod:`partitioner.solvers.offload_baselines`) — and accelerate's ``greedy`` fill. ``*`` marks a
placement that does not fit the cap. Each row says where the optimizer state lives (parameter
tensors resident with it on the GPU, offloaded to the host beside GPU weights, kept on the host and
streamed to the GPU for its step, or streamed from the host with their weights; and how many ops
keep their saved activations on the host), how much of the host's optimizer step hides behind
backward, and whether hetpart is at least as fast as every baseline that fits. The last line
prices the calibration's measured training scenario (the embedding and its dense SGD update on the
CPU) beside its 467 ms measurement.

Cases (``../shared/research/training-offload.md`` and issue 31):

* the seed case ``emb-transformer:base`` (a 4 GiB embedding) under the demo's cap (4,496,539,680
  bytes), with SGD (its row-sparse update is exact), ``sparse-adam`` and Adam (exact, dense);
* a Llama-style 1.2B model (transformers ``LlamaConfig``: hidden 2048, 16 layers, vocabulary
  128,256, tied embeddings), batch 1 x 1024 tokens, ``cuda:0`` at 12 GB, Adam;
* a GPT-2-XL-sized model (1.5B: 48 layers, width 1600), batch 1 x 1024 tokens, ``cuda:0`` at 24 GB, Adam.

    python bench/training_plans.py [--cases seed,llama,gpt2xl] [--time-limit 60]
    python bench/plan_quality.py --training          # the same table
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import models
from cost_models.units import format_bytes, format_seconds
from partitioner import partition_outcome
from partitioner.plan.training_state import param_states
from plan_quality import baseline_cells  # bench/ is the script's folder

SEED_CAP = 4496539680
BASELINES = ("zero-offload", "fsdp2-offload", "torchao-offload", "greedy")


def _seed() -> tuple[torch.nn.Module, tuple]:
    module, inputs = models.get("emb-transformer", "base", device="meta")
    return module, inputs if isinstance(inputs, tuple) else (inputs,)


def _hf(config_fn: Callable[[], object], cls_name: str) -> tuple[torch.nn.Module, tuple]:
    import transformers

    config = config_fn()
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        module = getattr(transformers, cls_name)(config)
    module.config.use_cache = False
    return module, (torch.zeros(1, 1024, dtype=torch.long, device="meta"),)


def _llama() -> tuple[torch.nn.Module, tuple]:
    import transformers

    return _hf(lambda: transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True), "LlamaForCausalLM")


def _gpt2xl() -> tuple[torch.nn.Module, tuple]:
    import transformers

    return _hf(lambda: transformers.GPT2Config(n_layer=48, n_embd=1600, n_head=25, n_positions=1024,
                                               vocab_size=50257), "GPT2LMHeadModel")


#: name -> (label, model factory, cuda:0 cap, optimizers)
CASES = {
    "seed": ("emb-transformer:base", _seed, SEED_CAP, ("sgd", "sparse-adam", "adam")),
    "llama": ("Llama-style 1.2B", _llama, "12GB", ("adam",)),
    "gpt2xl": ("GPT-2-XL-sized 1.5B", _gpt2xl, "24GB", ("adam",)),
}


def state_summary(plan) -> str:  # noqa: ANN001 - a Plan
    """``96 resident, 34 offloaded, 20 state streamed, 1 on host``: where parameter tensors' state lives
    (``state streamed``: on the host, stepped on the GPU; ``streamed``: the weights too, stepped on the host)."""
    kinds: dict[str, int] = {}
    for ps in param_states(plan).values():
        kind = "streamed" if ps.streamed else "state streamed" if ps.streamed_state else "offloaded" if ps.offloaded \
            else "on host" if ps.state == plan.devices.host_device().name else "resident"
        kinds[kind] = kinds.get(kind, 0) + 1
    held = plan.training_state.get("saved_on_host", {}) if plan.training_state else {}
    activations = f"; saved activations of {len(held)} ops on the host ({format_bytes(sum(held.values()))})" if held else ""
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + activations


def hidden_share(plan) -> str:  # noqa: ANN001
    """``49% of 200 ms; streamed 255 ms, 0 ms after``: the host step's share beside backward, and the
    streamed states' trips (copies and GPU steps) with what of them runs after backward."""
    step = plan.training_state.get("step") if plan.training_state else None
    if not step:
        return "-"
    host = step["per_device_s"].get(plan.devices.host_device().name, 0.0)
    out = f"{step['hidden_s'] / host:.0%} of {format_seconds(host)}" if host else "no host step"
    if "streamed_s" in step:
        out += f"; streamed {format_seconds(step['streamed_s'])}, {format_seconds(step['streamed_after_s'])} after"
    return out


def calibration_line() -> str:
    """The measured training scenario (calibration: the embedding and its dense SGD update on the CPU,
    the layers on the GPU) priced by the cost model, beside its measurement."""
    from cost_models.calibration import load_calibration
    from partitioner import from_module, load_profile
    from partitioner.frontends.fx import capture_mode
    from partitioner.solvers.problem import Options, Placement, Problem, evaluate
    from cost_models.training import Optimizer

    module, inputs = _seed()
    with capture_mode(module, training=True):
        graph = from_module(module, inputs)
    problem = Problem(graph, load_profile("h200-host"), Options(training=True, optimizer=Optimizer.SGD,
                                                                 sparse_updates=False, offload=False))
    table = max(problem.nodes, key=lambda n: problem.trainable[n])
    split = evaluate(problem, Placement({n: "cpu" if n == table else "cuda:0" for n in problem.nodes}))
    gpu = evaluate(problem, Placement({n: "cuda:0" for n in problem.nodes}))
    measured = {row["plan"]: row["train_step_s"] for row in load_calibration()["scenario"]}
    return (f"calibration scenario, dense SGD: embedding on the CPU {format_seconds(split.total_s)} predicted, "
            f"{format_seconds(measured['emb_cpu_rest_gpu'])} measured; all-GPU {format_seconds(gpu.total_s)} "
            f"predicted, {format_seconds(measured['all_gpu'])} measured")


def training_rows(cases: list[str], time_limit: float) -> bool:
    """Print the table; True when hetpart is at least as fast as every baseline that fits, on every row."""
    header = ["case", "optimizer", "hetpart", "all-GPU", "ratio", *BASELINES, "state (parameter tensors)",
              "host step hidden; streamed states", "plan s", "ok"]
    rows, all_ok = [], True
    for key in cases:
        label, factory, cap, optimizers = CASES[key]
        module, inputs = factory()
        for optimizer in optimizers:
            began = time.perf_counter()
            out = partition_outcome(module, inputs, "h200-host", memory={"cuda:0": cap}, training=True,
                                    optimizer=optimizer, time_limit=time_limit)
            seconds = time.perf_counter() - began
            plan, total = out.plan, out.evaluation.total_s
            gpu = plan.baselines["single:cuda:0"]
            cells, ok = baseline_cells(plan, total, BASELINES)
            all_ok &= ok
            rows.append([label, optimizer, format_seconds(total), format_seconds(gpu.total_s) + ("" if gpu.feasible else "*"),
                         f"{total / gpu.total_s:.2f}x", *cells, state_summary(plan), hidden_share(plan),
                         f"{seconds:.1f}", "yes" if ok else "NO"])
            mem = ", ".join(f"{d} {format_bytes(m['used'])}" for d, m in plan.memory.items())
            print(f"# {label} / {optimizer}: {plan.solver.status}, gap {plan.solver.gap or 0:.2%}; memory {mem}")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    print("* does not fit the cap.  ratio = hetpart / all-GPU with the same optimizer (all-GPU does not fit).")
    print(f"hetpart at least as fast as every baseline that fits, on every row: {'yes' if all_ok else 'NO'}")
    print(calibration_line())
    return all_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    return 0 if training_rows([c for c in args.cases.split(",") if c], args.time_limit) else 1


if __name__ == "__main__":
    raise SystemExit(main())
