"""The text of a generated file: identifiers, literals, ``__init__``'s registrations and the file around them.

In: the plan, its :class:`~backends.torch.source.layout.Layout` and the printed forward
(:class:`~backends.torch.source.forward.Body`). Out: the file's text (:func:`render`). Nothing a
model or a plan supplies is pasted into code: identifiers come from :class:`Names` (strict,
unique, never a keyword, builtin or helper), names appear as ``ascii()`` literals, and in comments
only when plain (:func:`comment_text`).
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from typing import TYPE_CHECKING, Any

import torch

from backends.torch.module import STREAMER_ATTR
from partitioner.errors import HetpartError

if TYPE_CHECKING:
    from backends.strict_devices import Site
    from backends.torch.source.forward import Body
    from backends.torch.source.layout import Layout


CLASS_NAME = "PartitionedModel"


LITERAL_LIMIT = 4096  # largest non-persistent buffer or constant written out element by element


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.:/+\-]+")   # safe in a comment as is


_TORCH_NAME = re.compile(r"torch\.[A-Za-z_][A-Za-z0-9_]*")  # str() of a dtype, layout, memory format


_HELPERS = ("_submodule", "_parameter", "_buffer", "_alias", "_get", "load_weights")


_RESERVED = frozenset(
    set(dir(builtins)) | {"self", "torch", "pytree", "WeightStreamer", "TrainingStreamer", "install_refetch",
                          CLASS_NAME, "build", "_OUT_SPEC", *_HELPERS, "build_optimizer", "_TRAINING_STATE"}
)


class Names:
    """Identifiers of one generated file: strict, unique, never a keyword, builtin or helper."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._counters: dict[str, int] = {}

    def make(self, candidate: str, prefix: str) -> str:
        """``candidate`` if it is a plain identifier (plus ``_1``... when taken), else ``prefix<n>``."""
        if not IDENT.fullmatch(candidate) or candidate.startswith("__") or len(candidate) > 64:
            n = self._counters.get(prefix, 0)
            self._counters[prefix] = n + 1
            candidate = f"{prefix}{n}"
        name, i = candidate, 1
        while name in self._used or name in _RESERVED or keyword.iskeyword(name):
            name, i = f"{candidate}_{i}", i + 1
        self._used.add(name)
        return name


def comment_text(value: Any) -> str:
    """``value`` for a comment: as is when plain, else its ``ascii()`` literal (no line breaks)."""
    value = str(value)
    return value if _PLAIN_TEXT.fullmatch(value) else ascii(value)


def joined(qualified: str) -> str:
    """``blocks.0.ln1.weight`` → ``blocks_0_ln1_weight``; "" when a component is not plain."""
    parts = qualified.split(".")
    return "_".join(parts) if all(re.fullmatch(r"[A-Za-z0-9_]+", p) for p in parts) else ""


def device_tag(device: str) -> str:
    """``cuda:0`` → ``cuda_0`` for identifiers; "" when the name holds anything else."""
    return device.replace(":", "_") if re.fullmatch(r"[A-Za-z0-9_:]+", device) else ""


def literal(value: Any) -> str:
    """A Python literal for a number, bool, None or (nested) list / tuple of them."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, str):
        return ascii(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(literal(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    raise HetpartError(f"cannot write {type(value).__name__} value {value!r} as a literal")


def torch_name(value: Any) -> str:
    """``torch.float32``, ``torch.strided``, ``torch.contiguous_format`` (checked, never pasted)."""
    text = str(value)
    if not _TORCH_NAME.fullmatch(text):
        raise HetpartError(f"cannot spell {type(value).__name__} {text!r} in generated source")
    return text


def wrapped(head: str, names: list[str], width: int = 88) -> list[str]:
    lines, line = [], head
    for i, name in enumerate(names):
        piece = name + (", " if i + 1 < len(names) else "")
        if len(line) + len(piece) > width and line != head:
            lines.append(line.rstrip() + " \\")
            line = "    "
        line += piece
    return lines + [line]


def init_lines(layout: Layout, training: bool = False) -> list[str]:
    lines = []
    for t in layout.tensors:
        device = layout.device_var[t.device] if t.device else device_literal(t.value.device)
        name = ascii(t.qualified)
        if t.alias_of is not None:
            extra = "" if t.kind == "parameter" or t.persistent else ", persistent=False"
            lines.append(f"_alias(self, {name}, {ascii(t.alias_of)}{extra})")
        elif t.kind == "parameter":
            grad = "" if t.value.requires_grad else ", requires_grad=False"
            lines.append(f"_parameter(self, {name}, {_empty(t.value, device)}{grad})")
        elif t.persistent:
            lines.append(f"_buffer(self, {name}, {_empty(t.value, device)})")
        else:  # not in the state_dict: its value is part of the file
            lines.append(f"_buffer(self, {name}, {_value(t.qualified, t.value, device)}, persistent=False)")
    if layout.streamed:
        pairs = ", ".join(f"({ascii(t)}, str({layout.device_var[d]}))" for t, d in layout.streamed)
        if training:  # fetched again in backward, not kept (backends.torch.train_streaming)
            lines.append(f"self.{STREAMER_ATTR} = TrainingStreamer(self, [{pairs}])")
            lines.append("install_refetch(self)")
        else:
            lines.append(f"self.{STREAMER_ATTR} = WeightStreamer(self, [{pairs}])")
    return lines


def device_literal(device: torch.device) -> str:
    """A tensor no op reads stays on the model's device (the host when the model is on meta)."""
    return f'torch.device({ascii("cpu" if device.type == "meta" else str(device))})'


def _empty(value: torch.Tensor, device: str) -> str:
    return f"torch.empty({literal(tuple(value.shape))}, dtype={torch_name(value.dtype)}, device={device})"


def _value(qualified: str, value: torch.Tensor, device: str) -> str:
    """An expression for a tensor's value: ``arange``, ``full`` or the elements written out."""
    if value.is_meta:
        raise HetpartError(f"buffer {ascii(qualified)} is not saved in the state_dict and the model is on "
                           f"the meta device: its value must be written into the file; build the model "
                           f"with real tensors")
    flat = value.detach().to("cpu").reshape(-1)
    shape, dtype, n = literal(tuple(value.shape)), torch_name(value.dtype), flat.numel()
    tail = f"dtype={dtype}, device={device}"
    counting = n and value.dtype != torch.bool and not value.is_complex()
    if counting and torch.equal(flat, torch.arange(n, dtype=value.dtype)):
        return f"torch.arange({n}, {tail}).reshape({shape})"
    if n > 1 and not value.is_complex() and bool((flat == flat[0]).all()):
        return f"torch.full({shape}, {literal(flat[0].item())}, {tail})"
    if n > LITERAL_LIMIT or value.is_complex():
        raise HetpartError(f"buffer {ascii(qualified)} ({n} elements) is not saved in the state_dict, so "
                           f"its value must be written into the file, and it is too large (over "
                           f"{LITERAL_LIMIT}) or complex; register it as a persistent buffer")
    # made on the host, then moved: torch.tensor(..., device=) copies below the dispatcher, out of
    # sight of the strict-devices check (backends.strict_devices)
    return f"torch.tensor({literal(value.detach().to('cpu').tolist())}, dtype={dtype}).to({device})"


_HELPER_SOURCE = '''
def _submodule(root: torch.nn.Module, path: str) -> torch.nn.Module:
    """The module at a dotted path, creating empty containers on the way."""
    module = root
    for name in path.split(".") if path else ():
        if module._modules.get(name) is None:
            module.add_module(name, torch.nn.Module())
        module = module._modules[name]
    return module


def _parameter(root: torch.nn.Module, qualified: str, value: torch.Tensor, requires_grad: bool = True) -> None:
    """Register a parameter under its qualified name (names are data here, never code)."""
    owner, _, name = qualified.rpartition(".")
    _submodule(root, owner).register_parameter(name, torch.nn.Parameter(value, requires_grad=requires_grad))


def _buffer(root: torch.nn.Module, qualified: str, value: torch.Tensor, persistent: bool = True) -> None:
    """Register a buffer under its qualified name."""
    owner, _, name = qualified.rpartition(".")
    _submodule(root, owner).register_buffer(name, value, persistent=persistent)


def _alias(root: torch.nn.Module, qualified: str, source: str, persistent: bool = True) -> None:
    """Register the tensor already held at ``source`` under a second name (tied weights)."""
    tensor = _get(root, source)
    owner, _, name = qualified.rpartition(".")
    if isinstance(tensor, torch.nn.Parameter):
        _submodule(root, owner).register_parameter(name, tensor)
    else:
        _submodule(root, owner).register_buffer(name, tensor, persistent=persistent)


def _get(root: torch.nn.Module, qualified: str) -> torch.Tensor:
    """The parameter or buffer at a qualified name."""
    owner, _, name = qualified.rpartition(".")
    return getattr(root.get_submodule(owner), name)
'''


_LOADER_SOURCE = f'''
def load_weights(module: torch.nn.Module, weights: object) -> torch.nn.Module:
    """Copy the model's weights into ``module`` (strictly: every name must match).

    ``weights`` is the original model (its state_dict, and the values of tensors it does not
    save, such as plain tensor attributes), a state_dict, or the path of a file written with
    ``torch.save(model.state_dict(), path)``.
    """
    extra = {{}}
    if isinstance(weights, torch.nn.Module):
        state = weights.state_dict()
        for qualified, _ in module.named_buffers():
            if qualified not in state:
                try:
                    extra[qualified] = _get(weights, qualified)
                except AttributeError:
                    pass  # a constant of the capture: its value is written in this file
    elif isinstance(weights, dict):
        state = weights
    elif isinstance(weights, (str, bytes)) or hasattr(weights, "__fspath__"):
        state = torch.load(weights, map_location="cpu", weights_only=True)
    else:
        raise TypeError(f"weights must be the original model, a state_dict or a file path, "
                        f"not {{type(weights).__name__}}")
    module.load_state_dict(state, strict=True)
    with torch.no_grad():
        for qualified, value in extra.items():
            if isinstance(value, torch.Tensor):
                _get(module, qualified).copy_(value)
    return module


def build(weights: object) -> {CLASS_NAME}:
    """A {CLASS_NAME} holding the model's weights: ``build(model)``, ``build(model.state_dict())``
    or ``build("weights.pt")`` (see load_weights)."""
    return load_weights({CLASS_NAME}(), weights)
'''


# A file emitted from a model folder also loads from one: each weight read from its shard into its tensor.
_FOLDER_LOADER_SOURCE = _LOADER_SOURCE.replace('''    ``torch.save(model.state_dict(), path)``.
    """
    extra = {}''', '''    ``torch.save(model.state_dict(), path)``, or a model folder (config.json and its safetensors
    shards: each weight is read from its shard straight into its tensor here; needs hetpart).
    """
    import os

    if (isinstance(weights, str) or hasattr(weights, "__fspath__")) and os.path.isdir(weights):
        from backends.torch.checkpoint_load import load_folder_into  # hetpart's loader

        load_folder_into(module, weights)
        return module
    extra = {}''')


def _header(plan: Any, layout: Layout, from_folder: bool = False) -> list[str]:
    total = plan.predicted.get("total_s")
    binding = ", ".join(f"{comment_text(d)} -> {comment_text(p)}" for d, p in layout.binding.items())
    mode = "training step" if plan.training else "inference"
    lines = [
        "# Generated by hetpart: the model placed by hand, as its plan says.",
        "#",
        f"# model        {comment_text(plan.model_name)}",
        f"# fingerprint  {comment_text(plan.fingerprint)}",
        f"# profile      {comment_text(plan.devices.name)}",
        f"# objective    {comment_text(plan.objective)} ({mode})",
        f"# predicted    {'unknown' if total is None else f'{total:.4g} s'} per step",
        f"# solver       {comment_text(plan.solver.name)} ({comment_text(plan.solver.status)})",
        f"# binding      {binding}",
        "#",
        "# build(weights) returns the module with the model's weights, from the original model, its",
        "# state_dict, or a file saved with torch.save(model.state_dict(), path):",
        "#     module = build(model)            # or build(\"weights.pt\")",
        "#     outputs = module(*inputs)",
        "# PartitionedModel() alone has EMPTY parameters (uninitialised memory): never run it unloaded.",
        "# The forward is the graph torch.export captured (in the mode the model was in then).",
    ]
    if from_folder:
        lines.append("# build(\"./model-folder\") reads each weight from the folder's shards into its device:")
        lines.append("# hetpart must be installed for that.")
    if layout.streamed and plan.training:
        lines.append("# Streamed weights are fetched by hetpart's TrainingStreamer (again in backward, not kept "
                     "between the passes): hetpart must be installed.")
    elif layout.streamed:
        lines.append("# Streamed weights are fetched by hetpart's WeightStreamer: hetpart must be installed.")
    elif not from_folder:
        lines.append("# Needs only torch.")
    return lines


def render(plan: Any, layout: Layout, body: Body, optimizer: list[str] | None = None, *,
           from_folder: bool = False) -> tuple[str, dict[int, Site]]:
    """The file's text, and what each line of its forward does (line number -> Site); ``optimizer``:
    the lines of ``build_optimizer`` (:mod:`backends.torch.source.optimizer`), after ``build``; a
    file emitted from a model folder (``from_folder``) also builds from one."""
    header = _header(plan, layout, from_folder)
    if body.holds:
        header = [line for line in header if line != "# Needs only torch."]
        header.append("# Ops listed in the plan's training_state.saved_on_host run through hetpart's run_holding: "
                      "what autograd saves for them waits on the host until backward (hetpart must be installed).")
    if optimizer:
        header = [line for line in header if line != "# Needs only torch."]
        header.append("# build_optimizer(module, lr=...) is the plan's optimizer (hetpart's: hetpart must be installed).")
    out = header + ['"""A model placed on several devices by hetpart (see the comment above)."""',
                                   "", "import torch"]
    if body.out_spec is not None:
        out.append("import torch.utils._pytree as pytree")
    if body.checkpoints:
        out.append("import torch.utils.checkpoint")
    if body.holds:
        out.append("from backends.torch.saved_on_host import run_holding  # hetpart's saved-tensor hooks")
    if layout.streamed and plan.training:
        out.append("from backends.torch.train_streaming import TrainingStreamer, install_refetch  # hetpart's streamer")
    elif layout.streamed:
        out.append("from backends.torch import WeightStreamer  # hetpart's streamer")
    out += ["", "# The plan's devices and the devices they run on here (edit to re-bind)."]
    for device, var in layout.device_var.items():
        note = "" if layout.binding[device] == device else f"  # plan device {comment_text(device)}"
        out.append(f"{var} = torch.device({ascii(layout.binding[device])}){note}")
    if body.out_spec is not None:
        out.append(f"_OUT_SPEC = pytree.treespec_loads({ascii(body.out_spec)})")
    out += ["", *_HELPER_SOURCE.strip("\n").split("\n"), "", "",
            f"class {CLASS_NAME}(torch.nn.Module):",
            '    """Parameters on the devices that use them; forward issues the parts in order."""', "",
            "    def __init__(self) -> None:", "        super().__init__()",
            "        # parameters and buffers under the model's names, each created on its device"]
    out += [f"        {line}" for line in init_lines(layout, plan.training)]
    out += ["", f"    def forward({', '.join(['self', *body.inputs])}):"]
    if body.weights:
        out += ["        # parameters and buffers read in place (streamed weights are fetched per part)"]
        out += [f"        {line}" for line in body.weights] + [""]
    first = len(out) + 1  # line number of the body's first line
    sites = {first + i: site for i, site in body.sites.items()}
    out += [f"        {line}" if line else "" for line in body.lines]
    loader = _FOLDER_LOADER_SOURCE if from_folder else _LOADER_SOURCE
    out += ["", "", *loader.strip("\n").split("\n")]
    out += [*(optimizer or []), ""]
    return "\n".join(out), sites
