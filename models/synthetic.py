"""Synthetic random DAGs and device profiles (seeded, reproducible) for property tests and benchmarks."""

from __future__ import annotations

import dataclasses
import random

from cost_models.profiles import DeviceSet, load_profile_text
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor

_CLASSES = (OpClass.MATMUL, OpClass.ELEMENTWISE, OpClass.NORM, OpClass.GATHER, OpClass.VIEW, OpClass.CONV)


def random_dag(
    seed: int, n_ops: int, *, max_inputs: int = 2, param_prob: float = 0.5, layers: int | None = None,
    tied_prob: float = 0.0, param_sizes: tuple[int, ...] = (1 << 16, 1 << 22, 1 << 26),
) -> OpGraph:
    """A connected random DAG: op i reads 1..max_inputs earlier ops (or the input), some own parameters.

    With ``tied_prob`` > 0, an op that would own a new parameter instead reads (ties) an earlier
    op's parameter with that probability, like a language model's head sharing the embedding.
    ``param_sizes`` are the sizes a parameter is drawn from.
    """
    rng = random.Random(seed)
    users: dict[str, list[str]] = {}
    ops, tensors, params = [], [], []
    consumers: dict[str, list[str]] = {"x": []}
    tensors_meta = {"x": ((1024,), 4096)}
    names = []
    width = max(1, n_ops // layers) if layers else None
    for i in range(n_ops):
        name = f"op{i}"
        if width:
            layer_start = (i // width - 1) * width
            pool = names[max(0, layer_start): (i // width) * width] or ["x"]
        else:
            pool = names or ["x"]
        k = rng.randint(1, max_inputs)
        inputs = sorted(set(rng.choice(pool) for _ in range(k)), key=lambda t: -1 if t == "x" else int(t[2:]))
        cls = rng.choice(_CLASSES)
        nbytes = rng.choice([4096, 65536, 1 << 20, 8 << 20])
        flops = 0 if cls in (OpClass.VIEW, OpClass.GATHER) else rng.choice([10**5, 10**7, 10**9, 10**10])
        owned: tuple[str, ...] = ()
        pbytes = 0
        read_params: tuple[str, ...] = ()
        if cls in (OpClass.MATMUL, OpClass.CONV, OpClass.GATHER) and rng.random() < param_prob:
            if tied_prob and users and rng.random() < tied_prob:
                tied = rng.choice(sorted(users))
                users[tied].append(name)
                read_params = (tied,)
            else:
                pbytes = rng.choice(list(param_sizes))
                owned = read_params = (f"{name}.weight",)
                users[owned[0]] = [name]
                params.append(Param(owned[0], (pbytes // 4,), "float32", pbytes, True, name))
        tied_bytes = sum(p.nbytes for p in params if p.name in read_params and p.name not in owned)
        read = 0 if cls is OpClass.VIEW else sum(tensors_meta[t][1] for t in inputs) + pbytes + tied_bytes
        written = 0 if cls is OpClass.VIEW else nbytes
        ops.append(Op(
            name=name, kind=f"aten.{cls.value}", op_class=cls, index=i, module_path=_module_path(i, width),
            module_type="Linear", dtype="float32", inputs=tuple(inputs), outputs=(name,), params=read_params,
            owned_params=owned, flops=flops, bytes_read=read, bytes_written=written, param_bytes=pbytes,
            trainable_param_bytes=pbytes,
        ))
        for t in inputs:
            consumers[t].append(name)
        consumers[name] = []
        tensors_meta[name] = ((nbytes // 4,), nbytes)
        names.append(name)
    for t, (shape, nbytes) in tensors_meta.items():
        producer = None if t == "x" else t
        tensors.append(Tensor(t, producer, tuple(consumers[t]), shape, "float32", nbytes))
    params = [dataclasses.replace(p, users=tuple(users[p.name])) for p in params]
    sinks = tuple(n for n in names if not consumers[n]) or (names[-1],)
    return OpGraph(f"random{seed}", ops, tensors, params, ("x",), sinks)


def _module_path(i: int, width: int | None) -> str:
    """Model-like nesting: ``layer{L}.block{B}.m{i}`` for layered DAGs (blocks of 5 ops), else blocks of 4."""
    if width:
        return f"layer{i // width}.block{(i % width) // 5}.m{i}"
    return f"block{i // 4}.m{i % 4}"


def random_profile(seed: int, n_devices: int = 3, *, tight: bool = False) -> DeviceSet:
    """A host CPU plus accelerators with random speeds, memories and links (all reach the host)."""
    rng = random.Random(seed)
    lines = [
        "[devices.cpu]", 'kind = "cpu"', f'memory = "{rng.choice([1, 4, 64]) if tight else 64}GiB"',
        f"peak_flops = {{ float32 = {rng.choice([5e11, 1e12, 2e12])} }}",
        f'mem_bandwidth = "{rng.choice([20, 40, 80])}GB/s"', 'launch_overhead = "2us"',
    ]
    accels = [f"cuda:{i}" for i in range(n_devices - 1)]
    for i, name in enumerate(accels):
        if i == 1 and rng.random() < 0.5:
            name = accels[i] = "npu:0"
        memory = rng.choice(["64MiB", "256MiB", "1GiB", "16GiB"]) if tight else "16GiB"
        lines += [
            "", f'[devices."{name}"]', f'kind = "{"npu" if name.startswith("npu") else "gpu"}"',
            f'memory = "{memory}"', f"peak_flops = {{ float32 = {rng.choice([1e13, 5e13, 1e14])} }}",
            f'mem_bandwidth = "{rng.choice([500, 1000, 3000])}GB/s"',
            f'launch_overhead = "{rng.choice([5, 10, 20])}us"',
        ]
        if name.startswith("npu"):
            lines.append('supported_ops = ["matmul", "conv", "elementwise", "view"]')
    for name in accels:
        lines += ["", "[[links]]", f'between = ["cpu", "{name}"]', f'bandwidth = "{rng.choice([10, 25, 55])}GB/s"',
                  f'latency = "{rng.choice([5, 10, 20])}us"', f'pageable_bandwidth = "{rng.choice([5, 8])}GB/s"']
    if len(accels) > 1 and rng.random() < 0.5:
        lines += ["", "[[links]]", f'between = ["{accels[0]}", "{accels[1]}"]', 'bandwidth = "200GB/s"', 'latency = "5us"']
    return load_profile_text("\n".join(lines) + "\n", f"random-profile-{seed}")


def random_chain(seed: int, n_ops: int, *, skip_prob: float = 0.3) -> OpGraph:
    """A chain-shaped random graph (its topological order is unique): op ``i`` reads op ``i - 1``
    and, with probability ``skip_prob``, also an earlier op or the input (a tensor that skips
    stages). The graph's outputs are the last op and any op nobody reads."""
    rng = random.Random(seed)
    base = random_dag(seed, n_ops, max_inputs=1, layers=n_ops)  # op i reads op i - 1
    ops, consumers = [], {t: [] for t in base.tensors}
    for op in base.topological_order():
        i = int(op.name[2:])
        inputs = list(op.inputs)
        if i >= 2 and rng.random() < skip_prob:
            earlier = rng.choice(["x"] + [f"op{j}" for j in range(i - 1)])
            inputs.append(earlier)
        extra = sum(base.tensors[t].nbytes for t in inputs[len(op.inputs):]) if not op.is_view else 0
        ops.append(dataclasses.replace(op, inputs=tuple(inputs), bytes_read=op.bytes_read + extra))
        for t in inputs:
            consumers[t].append(op.name)
    tensors = [Tensor(t.name, t.producer, tuple(consumers[t.name]), t.shape, t.dtype, t.nbytes)
               for t in base.tensors.values()]
    sinks = tuple(dict.fromkeys([o.name for o in ops if not consumers[o.name]] + [ops[-1].name]))
    return OpGraph(f"chain{seed}", ops, tensors, list(base.params.values()), ("x",), sinks)
