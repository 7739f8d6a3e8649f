"""Loading a model folder by its plan: peak host memory and time, beside ``safetensors.torch.load_file``.

1. Writes a Llama-shaped folder of about ``--params`` parameters (default 2e9: about 4 GB in bf16)
   to a temporary folder (or ``--folder``): ``config.json``, then the safetensors shards one at a
   time, each tensor random (normal, 0.02) and made only while its shard is written, so the model
   is never in memory whole; ``model.safetensors.index.json`` names the shards.
2. Plans it from the folder (no weight read) with an accelerate ``device_map`` as pins: the last
   layers, about ``--host-share`` (default 25%) of the weights, on ``cpu``, everything else on
   ``cuda:0``.
3. In a fresh process, ``plan.emit(folder, binding)`` with ``cuda:0`` bound to the GPU when there is
   one, else to this host: peak resident memory (``VmHWM``, reset through ``/proc/self/clear_refs``
   after the imports, the plan and the capture-free setup) beside the bound it must stay under:

       bytes homed in host memory + the staging buffer + CONSTANT_BYTES

   "homed in host memory": the tensors the plan keeps on the host, plus, without a GPU, those of
   the devices bound to this host (they live in host memory then). ``CONSTANT_BYTES`` (stated
   below) covers the capture of the hollow model (the exported graph, fake tensors), the emitted
   module's code and the allocator's slack.
4. In another fresh process, ``safetensors.torch.load_file`` of every shard (the state dict a user
   of it holds): its time and peak.
5. Plans an 8B Llama folder (Llama-3-8B's config; ``config.json`` only, no weight file at all) and
   states the seconds (``--skip-8b`` leaves it out).

    python bench/load.py                       # the 2B run (about 4 GB written; needs ~10 GB disk)
    python bench/load.py --params 2e7 --skip-8b  # a quick check of the bench itself
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: What the load may hold beyond the host-homed tensors and the staging buffer (see the docstring).
CONSTANT_BYTES = 768 << 20
SEQ = 128


def llama_config(params: float) -> dict:
    """A Llama config of about ``params`` parameters: the width from a ladder, the depth to match."""
    vocab = 32000
    for hidden in (256, 512, 1024, 2048, 2560, 3072, 4096):
        inter = int(round(hidden * 2.6875 / 128)) * 128
        heads = max(4, hidden // 128)
        kv = max(1, heads // 4)
        per_layer = 2 * hidden * hidden + 2 * hidden * (hidden // heads * kv) + 3 * hidden * inter + 2 * hidden
        layers = round((params - 2 * vocab * hidden) / per_layer)
        if 2 <= layers <= 40:
            break
    layers = max(2, layers)
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, dtype="bfloat16",
                use_cache=False)


LLAMA_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                dtype="bfloat16", use_cache=False)


def write_folder(folder: Path, config: dict, shard_bytes: int) -> tuple[int, int]:
    """config.json, then the shards one by one; returns (parameters, bytes)."""
    import torch
    from safetensors.torch import save_file

    from partitioner.frontends.hf_folder import open_folder

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    hollow = open_folder(folder).module  # the names and shapes to write, from the config
    names = [(n, tuple(t.shape)) for n, t in hollow.state_dict().items()]
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in names:
        nbytes = math.prod(shape) * 2
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    weight_map, total, params = {}, 0, 0
    generator = torch.Generator().manual_seed(0)
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name, shape in group:
            t = torch.empty(shape, dtype=torch.bfloat16)
            if "norm" in name:
                t.fill_(1.0)
            else:
                t.copy_(torch.randn(shape, generator=generator) * 0.02)
            tensors[name] = t
            weight_map[name] = file
            total += t.numel() * 2
            params += t.numel()
        save_file(tensors, folder / file, metadata={"format": "pt"})
        del tensors
        print(f"  wrote {file} ({len(group)} tensors)", file=sys.stderr)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return params, total


def host_device_map(config: dict, host_share: float) -> dict:
    """The last layers, about ``host_share`` of the weights, on cpu; everything else on GPU 0."""
    layers = config["num_hidden_layers"]
    hidden, vocab, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    total = per_layer * layers + 2 * vocab * hidden
    on_host = max(1, min(layers - 1, round(host_share * total / per_layer)))
    device_map = {"": 0}
    device_map.update({f"model.layers.{j}": "cpu" for j in range(layers - on_host, layers)})
    return device_map


def _rss() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child_load(folder: str, plan_file: str) -> dict:
    """In a fresh process: emit the plan from the folder; peak memory and time."""
    import torch

    from backends.torch.from_checkpoint import LOAD_STATS_ATTR
    from partitioner.plan import Plan

    plan = Plan.load(plan_file)
    cuda = torch.cuda.is_available()
    binding = {"cuda:0": "cuda:0" if cuda else "cpu"}
    before = _rss()
    reset = _reset_peak()
    began = time.perf_counter()
    emitted = plan.emit(folder, binding)
    seconds = time.perf_counter() - began
    after = _rss()
    stats = getattr(emitted, LOAD_STATS_ATTR)
    seen: set[int] = set()
    host = device = pinned = 0
    for _, t in [*emitted.named_parameters(), *emitted.named_buffers()]:
        if t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        nbytes = t.numel() * t.element_size()
        if t.device.type == "cpu":
            host += nbytes
            pinned += nbytes if t.is_pinned() else 0
        else:
            device += nbytes
    plan_host = sum(b for op, (_, b) in plan.op_bytes.items()
                    if plan.weights.get(op, plan.placement[op]) == "cpu") if plan.op_bytes else None
    return {"seconds": seconds, "rss_before": before["VmRSS"], "peak": after["VmHWM"], "peak_reset": reset,
            "rss_after": after["VmRSS"], "host_bytes": host, "device_bytes": device, "pinned_bytes": pinned,
            "plan_host_bytes": plan_host, "staging_bytes": stats.staging_bytes, "bytes_read": stats.bytes_read,
            "staged_bytes": stats.staged_bytes, "fill_seconds": stats.seconds, "cuda": cuda}


def child_load_file(folder: str) -> dict:
    """In a fresh process: safetensors.torch.load_file of every shard, all kept."""
    import torch  # noqa: F401 - imported before the measurement, as in the other child

    from safetensors.torch import load_file

    before = _rss()
    reset = _reset_peak()
    began = time.perf_counter()
    state = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(shard))
    touched = sum(float(t.float().sum()) for t in state.values())  # every byte read (load_file maps the file)
    seconds = time.perf_counter() - began
    after = _rss()
    return {"seconds": seconds, "rss_before": before["VmRSS"], "peak": after["VmHWM"], "peak_reset": reset,
            "tensors": len(state), "checksum": touched}


def _child(kind: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise SystemExit(f"the {kind} process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=2e9, help="parameters of the Llama-shaped folder (2e9: ~4 GB)")
    parser.add_argument("--host-share", type=float, default=0.25, help="share of the weights the plan keeps on the host")
    parser.add_argument("--shard-bytes", type=float, default=1e9, help="largest shard written, bytes")
    parser.add_argument("--folder", help="write (or reuse, if it has an index) the folder here, kept afterwards")
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver time limit of each plan, seconds")
    parser.add_argument("--skip-8b", action="store_true", help="do not plan the 8B config folder")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        result = child_load(*rest) if kind == "load" else child_load_file(*rest)
        print(json.dumps(result))
        return 0

    from partitioner import partition

    with tempfile.TemporaryDirectory(prefix="hetpart-load-") as tmp:
        folder = Path(args.folder) if args.folder else Path(tmp) / "llama"
        config = llama_config(args.params)
        began = time.perf_counter()
        if (folder / "model.safetensors.index.json").is_file():
            config = json.loads((folder / "config.json").read_text())
            total = json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
            params = total // 2
            print(f"reusing {folder}", file=sys.stderr)
        else:
            params, total = write_folder(folder, config, int(args.shard_bytes))
        written = time.perf_counter() - began
        print(f"folder: {params / 1e9:.2f}B parameters, {mib(total)} in bf16 ({config['num_hidden_layers']} layers, "
              f"hidden {config['hidden_size']}), written in {written:.1f} s")
        device_map = host_device_map(config, args.host_share)
        began = time.perf_counter()
        plan = partition(str(folder), None, "h200-host", device_map_pins=device_map,
                         input_shapes={"input_ids": (1, SEQ)}, time_limit=args.time_limit)
        print(f"plan from the folder (no weight read): {time.perf_counter() - began:.1f} s, "
              f"{plan.op_count} ops, {sum(1 for k, v in device_map.items() if v == 'cpu')} layers pinned to cpu")
        plan_file = Path(tmp) / "plan.json"
        plan.save(plan_file)
        load = _child("load", str(folder), str(plan_file))
        ref = _child("load_file", str(folder))
        homed = load["host_bytes"]
        bound = homed + load["staging_bytes"] + CONSTANT_BYTES
        growth = load["peak"] - load["rss_before"]
        where = "the GPU" if load["cuda"] else "this host (no GPU: cuda:0 bound to cpu)"
        print(f"\nplan.emit(folder): {load['seconds']:.2f} s in all; the tensors {load['fill_seconds']:.2f} s for "
              f"{mib(load['bytes_read'])} ({load['bytes_read'] / max(load['fill_seconds'], 1e-9) / 1e9:.2f} GB/s), "
              f"the rest the capture of the hollow model and placing; cuda:0 on {where}")
        print(f"  homed in host memory  {mib(homed)} (pinned {mib(load['pinned_bytes'])}; the plan's host share "
              f"{mib(load['plan_host_bytes'])} of {mib(total)}); on the GPU {mib(load['device_bytes'])}")
        print(f"  staging buffer        {mib(load['staging_bytes'])} ({mib(load['staged_bytes'])} went through it)")
        print(f"  peak RSS              {mib(load['peak'])} (before {mib(load['rss_before'])}; growth "
              f"{mib(growth)}; peak reset: {load['peak_reset']})")
        verdict = "ok" if load["peak"] <= load["rss_before"] + bound else "OVER"
        print(f"  bound                 {mib(load['rss_before'] + bound)} = before + homed + staging + "
              f"{mib(CONSTANT_BYTES)} constant: {verdict} (measured beyond homed + staging: "
              f"{mib(growth - homed - load['staging_bytes'])})")
        print(f"\nsafetensors.torch.load_file, every shard, every tensor read once: {ref['seconds']:.2f} s, peak RSS "
              f"{mib(ref['peak'])} (before {mib(ref['rss_before'])}; growth {mib(ref['peak'] - ref['rss_before'])}; "
              f"its tensors map the files, so the pages read stay resident)")
        if not args.skip_8b:
            folder8 = Path(tmp) / "llama-8b"
            folder8.mkdir()
            (folder8 / "config.json").write_text(json.dumps(LLAMA_8B, indent=2))
            began = time.perf_counter()
            plan8 = partition(str(folder8), None, "h200-host", input_shapes={"input_ids": (1, SEQ)},
                              time_limit=args.time_limit)
            print(f"\n8B Llama folder (config.json only, no weight file): planned in "
                  f"{time.perf_counter() - began:.1f} s ({plan8.op_count} ops, status {plan8.solver.status})")
        return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
