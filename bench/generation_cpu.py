"""A decode step on this CPU, predicted beside measured: a generation plan on two logical devices.

1. This machine calibrated (``hetpart calibrate``'s quick set, or ``--calibrated FILE``), and the
   two-device profile of ``bench/e2e_fidelity.py``: ``cpu`` and ``npu:0``, both the calibrated CPU,
   each capped at 60% of what the model needs alone, so the plan must use both.
2. A small Llama from a transformers config (hidden 512, 8 layers, vocabulary 32,000, float32,
   random weights) planned with ``plan_generation`` (prompt 64 tokens, 32 new).
3. The emitted generate loop (``emit_generate``, ``npu:0`` bound to the CPU): its prefill and its decode
   step, and the original decode step (eager, one device), timed interleaved: each repeat runs one of
   each; medians reported; then one whole request, its tokens compared with transformers' greedy ones.

    python bench/generation_cpu.py [--calibrated FILE] [--repeat 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository

from cost_models.allocator import keep_freed_memory  # noqa: E402
from cost_models.units import format_bytes, format_seconds  # noqa: E402
from e2e_fidelity import local_profile, two_device_profile  # noqa: E402
from partitioner import partition, plan_generation  # noqa: E402
from partitioner.frontends.decode_step import decode_step, phase_inputs  # noqa: E402

PROMPT, NEW = 64, 32


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


def _time(fn, *args) -> float:  # noqa: ANN001
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrated", help="a calibrated profile (TOML) instead of calibrating now")
    parser.add_argument("--write-calibrated", help="write the calibration made now to this TOML file")
    parser.add_argument("--quick", action="store_true", default=True)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_grad_enabled(False)
    profile = local_profile(argparse.Namespace(calibrated=args.calibrated, quick=args.quick, repeat=5,
                                               write_calibrated=args.write_calibrated))
    twins = two_device_profile(profile)
    model = _model()
    step = decode_step(model, batch=1, max_context=PROMPT + NEW)
    whole = partition(step, phase_inputs(step, 1, start=PROMPT), profile, solver="single:cpu").memory["cpu"]["used"]
    caps = {"cpu": int(0.6 * whole), "npu:0": int(0.6 * whole)}
    gen = plan_generation(model, twins, memory=caps, prompt_tokens=PROMPT, new_tokens=NEW, time_limit=30)
    generator = gen.emit_generate(model, {"npu:0": "cpu"})
    dec_in = phase_inputs(step, 1, start=PROMPT)
    prompt = torch.randint(0, 32000, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    token = torch.zeros(1, dtype=torch.long)
    runs = {"prefill (emitted)": (generator.prefill, (prompt,)),
            "decode step (emitted)": (generator.decode_one, (token, PROMPT)),
            "decode step (eager, one device)": (step, dec_in)}
    for fn, inputs in runs.values():  # warm-up
        for _ in range(3):
            fn(*inputs)
    times = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, (fn, inputs) in runs.items():
            times[name].append(_time(fn, *inputs))
    print(f"\n{gen.prefill.model_name} ({format_bytes(whole)} alone) on cpu + npu:0 (both this CPU, each capped at "
          f"{format_bytes(caps['cpu'])}); prompt {PROMPT}, {NEW} new tokens; medians of {args.repeat} interleaved runs")
    used = {phase: {d: sum(1 for x in plan.placement.values() if x == d) for d in ("cpu", "npu:0")}
            for phase, plan in (("prefill", gen.prefill), ("decode", gen.decode))}
    print(f"  ops per device: prefill {used['prefill']}, decode {used['decode']}; "
          f"{len(gen.phase_difference())} modules used differently")
    print(f"  {'step':<32} {'predicted':>10} {'measured':>10} {'error':>7}")
    predicted = {"prefill (emitted)": gen.predicted["prefill_s"], "decode step (emitted)": gen.predicted["decode_s"],
                 "decode step (eager, one device)": None}
    for name, samples in times.items():
        got = statistics.median(samples)
        p = predicted[name]
        error = f"{(p - got) / got:+.0%}" if p else "-"
        print(f"  {name:<32} {format_seconds(p) if p else '-':>10} {format_seconds(got):>10} {error:>7}")
    tokens = generator.generate(prompt, max_new_tokens=NEW)
    request = _time(generator.generate, prompt, NEW)
    same = torch.equal(tokens, model.generate(prompt, max_new_tokens=NEW, do_sample=False))
    print(f"  {'request (generate, ' + str(NEW) + ' tokens)':<32} {format_seconds(gen.predicted['request_s']):>10} "
          f"{format_seconds(request):>10} {(gen.predicted['request_s'] - request) / request:+7.0%}   "
          f"tokens equal transformers' greedy: {same}")
    print(f"  emitted decode step / eager decode step: "
          f"{statistics.median(times['decode step (emitted)']) / statistics.median(times['decode step (eager, one device)']):.2f}x")


if __name__ == "__main__":
    main()
