"""Packed weights on this CPU: measured time of int8 and int4 plans beside their predictions.

A Llama-style model from a transformers config (hidden 1024, intermediate 2816, 4 layers, vocab
8192, float32, random weights), one token (decode-shaped: every weight read once) and 32 tokens,
planned on this machine as ``hetpart calibrate --devices detect`` measures it (its CPU's float32
matmul rate, streaming rate and weight-only kernel rates), as traced and with
``precision={"weights": "int8"}`` / ``"int4"``; each plan emitted and timed (medians of
interleaved runs, one thread pool, nothing else running), and its output error against the float
model. Run it alone: other processes on the 2 cores stall torch's threads.

    python bench/packed_cpu.py [--repeat 30] [--tokens 1,32]
"""

from __future__ import annotations

import argparse
import logging

import torch

from backends.compare import interleaved_medians
from cost_models.detect import detect_local
from cost_models.units import format_bytes, format_seconds
from partitioner import partition


def _model() -> torch.nn.Module:
    import transformers

    config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                      num_attention_heads=16, num_key_value_heads=4, vocab_size=8192,
                                      use_cache=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--tokens", default="1,32")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    devices = detect_local()
    cpu = devices.device("cpu")
    print(f"this CPU (detect): float32 {cpu.peak('float32') / 1e9:.0f} GFLOP/s, {cpu.mem_bandwidth / 1e9:.1f} GB/s, "
          f"weight-only " + ", ".join(f"{w} {r / 1e9:.0f} GFLOP/s" for w, r in cpu.weight_only.items()))
    model = _model()
    print(f"{'tokens':>6} {'setting':>8} {'weights':>10} {'predicted':>10} {'measured':>10} {'pred/meas':>9} "
          f"{'vs float (measured)':>19} {'output error':>12}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = (torch.randint(0, 8192, (1, tokens)),)
        with torch.no_grad():
            reference = model(*inputs).logits
        plans = {name: partition(model, inputs, devices, precision=setting, time_limit=30)
                 for name, setting in (("float32", None), ("int8", {"weights": "int8"}),
                                       ("int4", {"weights": "int4"}))}
        emitted = {name: plan.emit(model) for name, plan in plans.items()}

        def run(module: torch.nn.Module):  # noqa: ANN202
            return lambda: module(*inputs)

        with torch.no_grad():
            measured = interleaved_medians([run(m) for m in emitted.values()], args.repeat, lambda: None)
            errors = {}
            for name, module in emitted.items():
                out = module(*inputs)
                out = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, tuple) else out
                errors[name] = float((out.float() - reference).norm() / reference.norm())
        base = measured[0]
        for (name, plan), seconds in zip(plans.items(), measured):
            predicted = plan.predicted["total_s"]
            print(f"{tokens:>6} {name:>8} {format_bytes(plan.memory['cpu']['used']):>10} {format_seconds(predicted):>10} "
                  f"{format_seconds(seconds):>10} {predicted / seconds:>8.2f}x {base / seconds:>18.2f}x "
                  f"{errors[name]:>12.2e}")


if __name__ == "__main__":
    main()
