"""accelerate's ``infer_auto_device_map`` fill on hetpart's IR, and the two baselines built on it.

In: a :class:`~partitioner.solvers.problem.Problem` (the module tree and parameters of its
original graph, the devices' capacities) and the module classes that must not be split.
Out: an accelerate-style device map (module path -> device, :func:`device_map_fill`) and two
:class:`~partitioner.solvers.problem.Solution` values that cost it differently:

* ``greedy`` (:func:`solve_greedy`): what ``dispatch_model`` really runs. Modules mapped to an
  accelerator compute there with resident weights; modules mapped to the CPU still *execute on
  the main GPU* (accelerate's ``execution_device``), their weights copied from pageable host
  memory before every call, synchronously (``AlignDevicesHook`` with ``offload=True``);
* ``sequential-fill`` (:func:`solve_sequential_fill`): the same fill, each module computing
  where it is placed (torch.fx's size-based partitioner).

The fill follows accelerate's source (``utils/modeling.py``: ``compute_module_sizes``,
``get_max_layer_size``, ``infer_auto_device_map``, ``clean_device_map``):

* module sizes are the bytes of the parameters and buffers under each path; a tied parameter is
  counted once, under its first qualified name (``named_parameters`` order);
* devices are filled in order: the accelerators (main GPU first), then the host CPU; each holds
  at most its capacity. Modules are taken in registration order (``named_children``); one that
  does not fit is replaced by its direct parameters and children, unless it is a leaf or its
  class is a no-split class, in which case the fill moves to the next device and never returns;
* on the main devices (the first accelerator and the CPU) the usable memory is reduced by the
  largest *layer* (a leaf or no-split module) still to treat. As in accelerate, that largest
  size is recomputed only when every layer that realised it has been treated (or after a
  split), and a module being treated is not counted against itself;
* tied parameters pull the module holding the other copy onto the same device (accelerate's
  ``get_module_size_with_ties``), split when only the tied module is too big;
* what does not fit on the CPU would go to ``"disk"`` in accelerate (which also executes on the
  main GPU); hetpart has no disk, so it is mapped to the host CPU and the note says so.

Differences from accelerate, documented where they occur: a buffer is what the IR marks
``trainable=False`` (a frozen parameter looks the same); the direct buffers of a split submodule
get map entries (accelerate drops them, and ``dispatch_model`` then rejects its own map); a tied
parameter whose other copy is no longer in the list to treat is ignored where accelerate would
raise ``IndexError``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

from partitioner.ir import OpGraph
from partitioner.solvers.problem import (
    Placement,
    Problem,
    Solution,
    Status,
    StreamMode,
    accelerator_devices,
)

#: Where accelerate sends what fits nowhere else; mapped to the host CPU at the end of the fill.
_DISK = "disk"


# --------------------------------------------------------------------------------------------
# The module tree
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModuleTree:
    """What accelerate reads from an ``nn.Module``, rebuilt from an OpGraph.

    ``children`` maps a module path to its child module paths (registration order);
    ``params`` to the qualified names of its direct parameters (aliases of tied parameters
    included, as ``named_parameters(recurse=False)`` lists them); ``buffers`` to its direct
    non-trainable tensors (the IR's ``trainable=False``: buffers, and frozen parameters, which
    it cannot tell apart); ``types`` to its class name;
    ``sizes`` maps module paths and parameter names to bytes (missing names weigh 0, like
    accelerate's ``defaultdict``); ``tied`` holds the groups of names sharing one storage.
    """

    children: Mapping[str, tuple[str, ...]]
    params: Mapping[str, tuple[str, ...]]
    buffers: Mapping[str, tuple[str, ...]]
    types: Mapping[str, str]
    sizes: Mapping[str, int]
    tied: tuple[tuple[str, ...], ...]

    def size(self, name: str) -> int:
        return self.sizes.get(name, 0)

    def is_module(self, name: str) -> bool:
        return name in self.children

    def preorder(self, module: str = "") -> list[str]:
        """Module paths and tensor names in registration order: parameters, children, buffers."""
        out = [module, *self.params[module]]
        for child in self.children[module]:
            out += self.preorder(child)
        return out + list(self.buffers[module])

    @classmethod
    def of(cls, graph: OpGraph) -> ModuleTree:
        """The module tree of ``graph``: ``graph.module_types`` in registration order, completed
        with the ancestors of parameter names and op module paths when the front end gave none.

        Example:
            >>> tree = ModuleTree.of(graph)                        # doctest: +SKIP
            >>> tree.children[""], tree.size("layers.0")
            (('emb', 'layers', 'head'), 50384896)
        """
        qualified = [(q, p.trainable) for p in graph.params.values() for q in (p.name, *p.aliases)]
        paths = dict.fromkeys(["", *graph.module_types])
        for path in [_parent(q) for q, _ in qualified] + [op.module_path for op in graph.ops.values()]:
            for ancestor in _ancestors(path):
                paths.setdefault(ancestor)
        children: dict[str, list[str]] = {p: [] for p in paths}
        for p in paths:
            if p:
                children[_parent(p)].append(p)
        params: dict[str, list[str]] = {p: [] for p in paths}
        buffers: dict[str, list[str]] = {p: [] for p in paths}
        for q, trainable in qualified:
            (params if trainable else buffers)[_parent(q)].append(q)
        sizes: dict[str, int] = {}
        for p in graph.params.values():
            for prefix in [*_ancestors(_parent(p.name)), p.name]:
                sizes[prefix] = sizes.get(prefix, 0) + p.nbytes
        return cls(
            children={p: tuple(c) for p, c in children.items()},
            params={p: tuple(q) for p, q in params.items()},
            buffers={p: tuple(q) for p, q in buffers.items()},
            types={p: graph.module_types.get(p, "") for p in paths},
            sizes=sizes,
            tied=tuple(tuple(sorted((p.name, *p.aliases))) for p in graph.params.values() if p.aliases),
        )


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _ancestors(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["", "a", "a.b", "a.b.c"]``; ``""`` -> ``[""]``."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts) + 1)]


# --------------------------------------------------------------------------------------------
# The fill (accelerate's infer_auto_device_map)
# --------------------------------------------------------------------------------------------


def _splittable(tree: ModuleTree, name: str, no_split: Sequence[str]) -> bool:
    """A module with children whose class may be split (parameters are never split)."""
    return bool(tree.children.get(name)) and tree.types[name] not in no_split


def _split(tree: ModuleTree, name: str) -> list[str]:
    """What replaces a split module: its direct parameters, its children, then its direct buffers.

    accelerate lists buffers only for the root (``named_buffers(recurse=False)``, last) and drops
    those of a split submodule, which leaves them out of the map (``dispatch_model`` then refuses
    it); hetpart keeps them, after the children.
    """
    return [*tree.params[name], *tree.children[name], *tree.buffers[name]]


def max_layer_size(tree: ModuleTree, names: Sequence[str], no_split: Sequence[str]) -> tuple[int, list[str]]:
    """accelerate's ``get_max_layer_size``: the largest layer under ``names`` and the layers of that size.

    A layer is a parameter, a module without children or a module of a no-split class; other
    modules are opened into their children (not their direct parameters, as in accelerate).

    Example:
        >>> max_layer_size(tree, ["layers", "head"], ["Block"])   # doctest: +SKIP
        (50384896, ['layers.0', ..., 'layers.7'])
    """
    best, best_names = 0, []
    todo = list(names)
    while todo:
        name = todo.pop(0)
        if _splittable(tree, name, no_split):
            todo = list(tree.children[name]) + todo
            continue
        size = tree.size(name)
        if size > best:
            best, best_names = size, [name]
        elif size == best:
            best_names.append(name)
    return best, best_names


def _tied_outside(tree: ModuleTree, name: str) -> list[str]:
    """Names tied to a parameter inside ``name`` but lying outside it (accelerate's substring test)."""
    inside = lambda k: name + "." in k + "."  # noqa: E731 - accelerate's exact test, kept verbatim
    groups = [g for g in tree.tied if any(inside(k) for k in g) and not all(inside(k) for k in g)]
    return [k for g in groups for k in g if not inside(k)]


def _size_with_ties(tree: ModuleTree, name: str, tied: list[str], todo: list[str]) -> tuple[int, list[str]]:
    """The size of ``name`` plus the modules still to treat that hold its tied parameters."""
    size, modules = tree.size(name), []
    for param in tied:
        holder = next((n for n in todo if param.startswith(n + ".")), None)
        if holder is None:  # accelerate raises IndexError here; the tie is simply ignored
            continue
        modules.append(holder)
        size += tree.size(holder) - tree.size(param)
    return size, modules


@dataclasses.dataclass
class _FillState:
    """The mutable state of one fill: what is left to treat and what each device holds."""

    todo: list[str]
    used: dict[str, int]
    current: int = 0
    largest: int = 0
    largest_names: list[str] = dataclasses.field(default_factory=list)

    def refresh_largest(self, tree: ModuleTree, no_split: Sequence[str]) -> None:
        modules = [n for n in self.todo if tree.is_module(n)]
        self.largest, self.largest_names = max_layer_size(tree, modules, no_split)


def fill(tree: ModuleTree, capacity: Mapping[str, int], devices: Sequence[str],
         no_split: Sequence[str] = ()) -> dict[str, str]:
    """accelerate's ``infer_auto_device_map`` loop: module path -> device, before cleaning.

    ``devices`` are filled in order (accelerators, main first, then the host CPU, which must be
    last); a module that fits nowhere is mapped to ``"disk"``.

    Example:
        >>> fill(ModuleTree.of(graph), {"cuda:0": 2**30, "cpu": 2**36}, ["cuda:0", "cpu"], ["Block"])   # doctest: +SKIP
        {'emb': 'cpu', 'layers': 'cpu', 'head': 'cpu'}
    """
    order = [*devices, _DISK]
    main = {devices[0], devices[-1]}
    state = _FillState(todo=_split(tree, ""), used={d: 0 for d in order})
    state.largest, state.largest_names = max_layer_size(tree, state.todo, no_split)
    device_map: dict[str, str] = {}
    while state.todo:
        name = state.todo.pop(0)
        state.largest_names = [n for n in state.largest_names if n != name and not n.startswith(name + ".")]
        if not state.largest_names:
            state.refresh_largest(tree, no_split)
        _treat(tree, name, order, main, capacity, no_split, state, device_map)
    return device_map


def _treat(tree: ModuleTree, name: str, order: Sequence[str], main: set[str], capacity: Mapping[str, int],
           no_split: Sequence[str], state: _FillState, device_map: dict[str, str]) -> None:
    """One turn of accelerate's loop for ``name``: place it, split it (or a tied module), or move on."""
    device = order[state.current]
    limit = None if device == _DISK else capacity[device]
    reserved = state.largest if device in main else 0
    if limit is not None:
        limit -= reserved
    size = tree.size(name)
    tied = _tied_outside(tree, name)
    with_ties, tied_modules = _size_with_ties(tree, name, tied, state.todo)
    used = state.used[device]
    if limit is None or used + with_ties <= limit:
        state.used[device] += with_ties
        device_map[name] = device
        for module in tied_modules:
            if module in state.todo:
                state.todo.remove(module)
            device_map[module] = device
        return
    if tied and used + size <= limit:
        for module in tied_modules:
            if _splittable(tree, module, no_split):
                i = state.todo.index(module)
                state.todo[:] = [name, *state.todo[:i], *_split(tree, module), *state.todo[i + 1:]]
                state.refresh_largest(tree, no_split)
                return
    if used + size >= limit and _splittable(tree, name, no_split):
        state.todo[:] = [*_split(tree, name), *state.todo]
        state.refresh_largest(tree, no_split)
        return
    state.used[device] += reserved
    state.current += 1
    state.todo.insert(0, name)


def clean_device_map(device_map: Mapping[str, str], module: str = "") -> dict[str, str]:
    """accelerate's ``clean_device_map``: entries under a module that share one device become one.

    Returns a new dict (the input is not changed), keys in the order accelerate leaves them.

    Example:
        >>> clean_device_map({"a.x": "cpu", "a.y": "cpu", "b": "cuda:0"})
        {'b': 'cuda:0', 'a': 'cpu'}
    """
    out = dict(device_map)
    _clean(out, module)
    return out


def _clean(device_map: dict[str, str], module: str) -> None:
    prefix = f"{module}." if module else ""
    values = [v for k, v in device_map.items() if k.startswith(prefix)]
    if len(set(values)) == 1 and len(values) > 1:
        for k in [k for k in device_map if k.startswith(prefix)]:
            del device_map[k]
        device_map[module] = values[0]
    depth = len(module.split(".")) + 1 if module else 1
    below = [k for k in device_map if k.startswith(prefix) and len(k) > len(module)]
    for child in sorted({".".join(k.split(".")[:depth]) for k in below}):
        _clean(device_map, child)


def fill_devices(problem: Problem) -> tuple[str, ...]:
    """The devices the fill uses, in order: accelerators (main GPU first), then the host CPU."""
    return (*accelerator_devices(problem.devices), problem.host)


def device_map_fill(problem: Problem, no_split: Sequence[str] = ()) -> dict[str, str]:
    """accelerate's device map for ``problem``'s model: module path -> device, cleaned.

    ``max_memory`` is each device's capacity in the problem (caps applied); what would go to
    accelerate's ``"disk"`` is mapped to the host CPU. Keys come in registration order.

    Parameters:
        problem: the placement problem; its original graph supplies modules and parameters.
        no_split: module class names never split (the zoo's ``no_split_classes``, HF's
            ``_no_split_modules``).

    Example:
        >>> device_map_fill(problem, no_split=["Block"])          # doctest: +SKIP
        {'emb': 'cuda:0', 'layers.0': 'cuda:0', ..., 'layers.7': 'cpu', 'head': 'cpu'}
    """
    return _accelerate_map(problem, no_split)[0]


def _accelerate_map(problem: Problem, no_split: Sequence[str]) -> tuple[dict[str, str], int]:
    """The cleaned device map and how many of its raw entries accelerate would send to disk."""
    tree = ModuleTree.of(problem.original)
    raw = fill(tree, problem.capacity, fill_devices(problem), tuple(no_split))
    cleaned = clean_device_map({k: problem.host if d == _DISK else d for k, d in raw.items()})
    rank = {name: i for i, name in enumerate(tree.preorder())}
    ordered = dict(sorted(cleaned.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    return ordered, sum(d == _DISK for d in raw.values())


# --------------------------------------------------------------------------------------------
# From a device map to nodes
# --------------------------------------------------------------------------------------------


def _lookup(device_map: Mapping[str, str], name: str) -> str | None:
    """The device of the longest device-map key that is ``name`` or one of its ancestors."""
    for prefix in reversed(_ancestors(name)):
        if prefix in device_map:
            return device_map[prefix]
    return None


def map_nodes(problem: Problem, device_map: Mapping[str, str]) -> dict[str, str]:
    """The device of every node under ``device_map`` (where its module's weights live).

    A node stands for its first member op (the op itself when the graph is not coarsened). Rule,
    first match wins:

    1. the longest map key that is the op's module path or an ancestor of it (accelerate puts a
       hook on each mapped module, so its ops run on its device);
    2. the longest map key covering one of the op's parameters (the direct parameters of a split
       module are map entries of their own);
    3. the device of the node producing its first input: ops of the root or of a split module
       have no hook and run where their inputs are;
    4. otherwise (it reads only graph inputs) the main device, the first accelerator in the map,
       else the host: accelerate's root hook moves the inputs there.

    Example:
        >>> map_nodes(problem, {"emb": "cuda:0", "layers": "cpu", "head": "cpu"})["embedding"]   # doctest: +SKIP
        'cuda:0'
    """
    accelerators = set(accelerator_devices(problem.devices))
    main = next((d for d in device_map.values() if d in accelerators), problem.host)
    out: dict[str, str] = {}
    for node in problem.nodes:
        op = problem.original.ops[problem.members[node][0]]
        device = _lookup(device_map, op.module_path)
        if device is None:
            device = next((d for p in op.params if (d := _lookup(device_map, p)) is not None), None)
        if device is None:
            producers = [problem.graph.tensors[t].producer for t in problem.graph.ops[node].inputs]
            device = next((out[p] for p in producers if p is not None), main)
        out[node] = device
    return out


def _allowed_or_host(problem: Problem, node: str, device: str) -> str:
    """``device`` if ``node`` may run there, else the host, else its first allowed device."""
    allowed = problem.allowed[node]
    if device in allowed:
        return device
    return problem.host if problem.host in allowed else allowed[0]


# --------------------------------------------------------------------------------------------
# The two solvers
# --------------------------------------------------------------------------------------------


def solve_greedy(problem: Problem, no_split: Sequence[str] = ()) -> Solution:
    """accelerate's fill costed as ``dispatch_model`` runs it.

    Modules mapped to an accelerator compute there with resident weights. Modules mapped to the
    CPU execute on the main GPU with their weights streamed from host memory every call,
    synchronously (``StreamMode.SYNC``: pageable copies, no prefetch). The main GPU is the first
    accelerator holding a module, else the profile's first accelerator (an all-CPU map is still
    executed on the GPU with every weight streamed, as the calibration run measured). Nodes the
    computing device cannot run stay on the host CPU, with their weights; without an accelerator
    everything runs on the CPU.

    Example:
        >>> sol = solve_greedy(problem, no_split=["Block"])       # doctest: +SKIP
        >>> sol.placement.stream_mode, sorted(set(sol.placement.streamed.values()))
        (<StreamMode.SYNC: 'sync'>, ['cpu'])
    """
    start = time.perf_counter()
    device_map, disk = _accelerate_map(problem, no_split)
    mapped = map_nodes(problem, device_map)
    accelerators = accelerator_devices(problem.devices)
    main = next((d for d in device_map.values() if d in accelerators), accelerators[0] if accelerators else None)
    device: dict[str, str] = {}
    streamed: dict[str, str] = {}
    for node in problem.nodes:
        home = mapped[node]
        run = main if home == problem.host and main is not None else home
        device[node] = _allowed_or_host(problem, node, run)
        # a module's buffers go to its execution device (dispatch_model's offload_buffers=False): a KV cache
        # is resident where it is written, only weights stream
        if home == problem.host and device[node] != problem.host and problem.param_bytes[node] > 0 \
                and node not in problem.state_writers:
            streamed[node] = problem.host
    note = _note(problem, device_map, mapped, device, disk)
    if streamed:
        note = f"{len(streamed)} nodes stream their weights from {problem.host} synchronously; " + note
    return Solution(
        solver="greedy",
        placement=Placement(device=device, streamed=streamed, stream_mode=StreamMode.SYNC),
        status=Status.HEURISTIC,
        seconds=time.perf_counter() - start,
        note=note.rstrip("; "),
    )


def solve_sequential_fill(problem: Problem, no_split: Sequence[str] = ()) -> Solution:
    """accelerate's fill with every module computing where it is placed (no streaming).

    This is what a size-based sequential partitioner (torch.fx's ``size_based_partition``)
    gives: the layers that spill to the CPU run on the CPU. Nodes a mapped device cannot run
    go to the host CPU.

    Example:
        >>> sol = solve_sequential_fill(problem, no_split=["Block"])   # doctest: +SKIP
        >>> sol.placement.streamed
        {}
    """
    start = time.perf_counter()
    device_map, disk = _accelerate_map(problem, no_split)
    mapped = map_nodes(problem, device_map)
    device = {node: _allowed_or_host(problem, node, mapped[node]) for node in problem.nodes}
    return Solution(
        solver="sequential-fill",
        placement=Placement(device=device),
        status=Status.HEURISTIC,
        seconds=time.perf_counter() - start,
        note=_note(problem, device_map, mapped, device, disk).rstrip("; "),
    )


def _note(problem: Problem, device_map: Mapping[str, str], mapped: Mapping[str, str],
          device: Mapping[str, str], disk: int) -> str:
    """The device map (when short), fallbacks to the host and what overflowed to 'disk'."""
    parts = []
    if len(device_map) <= 12:
        parts.append("device map " + ", ".join(f"{k or '(root)'}: {v}" for k, v in device_map.items()))
    unsupported = [n for n in problem.nodes if device[n] == problem.host and mapped[n] != problem.host]
    if unsupported:
        parts.append(f"{len(unsupported)} nodes cannot run on their device and stay on {problem.host}, "
                     f"e.g. {', '.join(unsupported[:3])}")
    if disk:
        parts.append(f"{disk} modules did not fit on {problem.host} (accelerate: disk) and are mapped to it")
    return "; ".join(parts) + "; "
