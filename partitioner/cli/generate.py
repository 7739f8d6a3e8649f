"""``hetpart generate``: run a generation plan's emitted loop (prefill, then decode steps, each with its
phase's placement) on a prompt; print the tokens, and the measured times beside the plan's prediction."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from partitioner.cli.args import add_bind, add_folder_flags, naming_the_model, pairs, positive_int
from partitioner.errors import HetpartError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    ge = sub.add_parser("generate", parents=[common],
                        help="run a generation plan's prefill and decode steps on a prompt; print the tokens")
    ge.add_argument("model", help="the causal LM the plan was made for: zoo name (gpt:small), file.py:factory or "
                                  "a transformers model folder")
    ge.add_argument("--plan", required=True, metavar="PLAN.json", help="a generation plan from "
                                                                        "`hetpart plan MODEL --generate ...`")
    prompt = ge.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", action="append", metavar="ID,ID,...",
                        help="a prompt as comma-separated token ids (repeat for more sequences, of one length)")
    prompt.add_argument("--prompt-tokens", type=positive_int, metavar="N",
                        help="a prompt of N random token ids (seeded by --seed)")
    ge.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                    help="tokens to generate (default: the plan's --new-tokens)")
    ge.add_argument("--sample", action="store_true", help="sample the tokens (default: greedy)")
    ge.add_argument("--temperature", type=float, metavar="T", help="with --sample: divide the logits by T")
    ge.add_argument("--top-k", type=positive_int, metavar="K", help="with --sample: keep the K likeliest tokens")
    ge.add_argument("--top-p", type=float, metavar="P", help="with --sample: keep the likeliest tokens holding mass P")
    ge.add_argument("--seed", type=int, default=0, metavar="S",
                    help="seeds the random prompt and, with --sample, the draws (default 0)")
    add_bind(ge)
    ge.add_argument("--strict-devices", action="store_true",
                    help="bind every plan device to its own CPU tag and fail on the first op reading a tensor "
                         "from another device; print each phase's copies per link beside the plan's")
    add_folder_flags(ge)
    ge.set_defaults(func=_cmd_generate)


def load_generation(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The generation plan of ``--plan``, the model with real weights, and its name."""
    from partitioner.model_source import load_model
    from partitioner.plan.generation import GenerationPlan

    gen = GenerationPlan.load(args.plan)
    loaded = load_model(args.model, dtype=getattr(args, "folder_dtype", None),
                        trust_remote_code=getattr(args, "trust_remote_code", False))
    if loaded.is_onnx:
        raise HetpartError("generation plans run a torch causal language model; an ONNX model has no KV cache "
                           "hetpart can make static: give the zoo model or model folder the plan was made for")
    model = loaded.folder.reference() if loaded.folder is not None else loaded.module
    return gen, model.eval(), loaded.name


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    if not args.sample and (args.temperature is not None or args.top_k is not None or args.top_p is not None):
        raise HetpartError("--temperature, --top-k and --top-p shape sampled decoding: add --sample")
    gen, model, name = load_generation(args)
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    with naming_the_model(gen.prefill, name):
        generator = gen.emit_generate(model, binding or None, strict_devices=args.strict_devices)
    if args.prompt_ids:
        try:
            rows = [[int(t) for t in text.split(",") if t.strip()] for text in args.prompt_ids]
        except ValueError:
            raise HetpartError(f"--prompt-ids {' '.join(args.prompt_ids)}: give token ids as whole numbers separated "
                               f"by commas, e.g. --prompt-ids 1,450,3290") from None
        if len({len(r) for r in rows}) != 1 or not rows[0]:
            raise HetpartError("--prompt-ids: every prompt needs the same number of token ids (at least one); "
                               "run prompts of different lengths one by one")
        prompt = torch.tensor(rows, dtype=torch.long)
    else:
        rng = torch.Generator().manual_seed(args.seed)
        prompt = torch.randint(0, generator.vocab_size, (1, args.prompt_tokens), generator=rng)
    sampling = {"do_sample": True, "seed": args.seed, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p} if args.sample else {}
    tokens = generator.generate(prompt, max_new_tokens=args.max_new_tokens, **sampling)
    length = prompt.shape[1]
    for row in tokens.tolist():
        print("prompt:", " ".join(map(str, row[:length])))
        print("new:   ", " ".join(map(str, row[length:])))
    print(_timing_line(gen, generator, prompt.shape[0]))
    if args.strict_devices:
        for phase, report in generator.device_reports().items():
            print(f"{phase}: " + report.to_text())
        if not all(r.passed for r in generator.device_reports().values()):
            return 1
    return 0


def _timing_line(gen: Any, generator: Any, rows: int) -> str:
    t = generator.timings
    decode = statistics.median(t["decode_s"]) if t["decode_s"] else None

    def ms(s: float | None) -> str:
        return "-" if s is None else f"{s * 1e3:.2f} ms"

    line = f"measured: prefill {ms(t['prefill_s'])}, decode {ms(decode)} per token (median)"
    if decode:
        line += f", {rows / decode:,.1f} tokens/s"
    pre, dec = gen.predicted.get("prefill_s"), gen.predicted.get("decode_s")
    return line + f"; predicted for the plan's devices: prefill {ms(pre)}, decode {ms(dec)} per token"
