"""Generation on a GPU host, measured through the emitted loop beside the prediction.

The Llama-3-8B shape (transformers ``LlamaConfig``: hidden 4096, intermediate 14336, 32 layers, 32
heads, 8 KV heads, vocabulary 128,256; random bf16 weights, about 16 GB) on ``h200-host`` with
``cuda:0`` capped at 16 GB, prompt 512 tokens, 128 new:

1. ``plan_generation`` (the joint plan) and ``plan_generation(solver="llama.cpp --fit")`` (the
   llama.cpp rule's pair, placed by the same planner's costing);
2. each emitted with ``emit_generate`` on this machine (``cuda:0`` as it is), one request as warm-up,
   then ``--repeat`` requests: the prefill's tokens/s and the decode steps' tokens/s (medians),
   beside the plan's prediction.

Needs a CUDA GPU with 16 GB free beside the cap and host memory for the weights (about 2x16 GB while
the model is planned and emitted). ``--small`` runs the same code on a 2-layer, hidden-512 Llama with
``cuda:0`` capped at 145 MB, prompt 64 and 32 new tokens, bound to the CPU when no GPU is present: the
check that the script itself works, on any machine.

    python bench/gpu_generation.py [--small] [--repeat 3] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, when run as a script

from partitioner import plan_generation  # noqa: E402


def _model(small: bool, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if small:
        config = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
                             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=256)
    else:
        config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if not small else torch.float32)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a 2-layer model, runnable on a CPU")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.small:
        sys.exit("no CUDA GPU here: run with --small to check the script on this machine")
    for line in run_generation(args.small, args.repeat, args.time_limit):
        print(line, flush=True)


def run_generation(small: bool, repeat: int = 3, time_limit: float = 60.0) -> list[str]:
    """The table's lines (``bench/gpu_check.py`` case (k) calls it)."""
    torch.set_grad_enabled(False)
    prompt_tokens, new_tokens = (64, 32) if small else (512, 128)
    cap = {"cuda:0": "145MB" if small else "16GB"}
    binding = None if torch.cuda.is_available() else {"cuda:0": "cpu"}
    # planned as built (bf16 on the CPU): a capture on the meta device lays attention's output out
    # unlike a real device, and the plan would not match the module emitted from real weights
    model = _model(small, "cpu")
    planned = {name: plan_generation(model, "h200-host", memory=cap, prompt_tokens=prompt_tokens,
                                     new_tokens=new_tokens, time_limit=time_limit,
                                     **({"solver": solver} if solver else {}))
               for name, solver in (("hetpart", None), ("llama.cpp --fit", "llama.cpp --fit"))}
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(1))
    where = torch.cuda.get_device_name(0) if binding is None else "the CPU (cuda:0 bound to cpu)"
    lines = [f"(k) Llama {'small' if small else '3-8B shape'}, h200-host plans, cuda:0 capped at {cap['cuda:0']}, "
             f"prompt {prompt_tokens}, {new_tokens} new; run on {where}; medians of {repeat} requests",
             f"  {'plan':<18} {'prefill tok/s':>14} {'predicted':>10} {'decode tok/s':>13} {'predicted':>10} "
             f"{'request s':>10} {'predicted':>10}"]
    for name, gen in planned.items():
        generator = gen.emit_generate(model, binding)
        generator.generate(prompt, max_new_tokens=new_tokens)  # warm-up
        pre, dec, req = [], [], []
        for _ in range(repeat):
            generator.generate(prompt, max_new_tokens=new_tokens, eos_token_id=None)
            t = generator.timings
            pre.append(t["prefill_s"])
            dec.append(statistics.median(t["decode_s"]))
            req.append(t["prefill_s"] + sum(t["decode_s"]))
        p = gen.predicted
        lines.append(f"  {name:<18} {prompt_tokens / statistics.median(pre):>14,.0f} "
                     f"{p['prefill_tokens_per_s']:>10,.0f} {1 / statistics.median(dec):>13,.1f} "
                     f"{p['decode_tokens_per_s']:>10,.1f} {statistics.median(req):>10.3f} {p['request_s']:>10.3f}")
        del generator
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return lines


if __name__ == "__main__":
    main()
