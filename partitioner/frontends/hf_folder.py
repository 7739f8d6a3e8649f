"""A Hugging Face model folder as a model to plan: built without its weights, no weight read.

In: a folder holding ``config.json`` beside its weights (``model.safetensors``, shards named by
``model.safetensors.index.json``, ``pytorch_model.bin`` or its index), or a ``torch.save`` state-dict
file (``.pt``, ``.pth``, ``.bin``, ``.safetensors``) whose folder holds the ``config.json``. Out: a
:class:`FolderModel`:

* ``module``: the model ``config.json`` describes, the class its ``architectures`` names (else the
  first of causal LM, seq2seq LM, masked LM and the bare model that knows the config), built with
  every parameter on the meta device (no memory, no initialisation), then made *hollow*: each
  parameter and persistent buffer becomes a host tensor of its shape and dtype whose one element
  is repeated (stride 0), so it takes no memory and no weight is read. The values the constructor
  computes that no checkpoint holds (non-persistent buffers such as rotary ``inv_freq``) stay as
  made. Hollow host tensors rather than meta ones: model code that branches on the device
  (Qwen2-MoE counts tokens per expert in float on the CPU and in int32 elsewhere) captures the
  host's path, which runs on every device, and the capture is the one a real host model gives;
* ``example_inputs(device)``: inputs of the declared shapes (``input_shapes``, e.g.
  ``{"input_ids": (1, 512)}``; by default ``input_ids`` of batch 1 and :data:`DEFAULT_SEQUENCE`
  tokens, capped at the config's ``max_position_embeddings``; encoder-decoder models get
  ``decoder_input_ids`` too), passed positionally in the order of the model's ``forward``;
* the forward without a key-value cache (``use_cache`` off: one pass, tensors out);
* the dtype: the config's ``dtype`` (``torch_dtype`` in older configs; float32 when it says none),
  or the ``dtype`` asked.

A folder whose ``config.json`` names its own code (``auto_map``) is refused unless
``trust_remote_code`` is given: building the model would run that code. A folder without
``config.json``, a ``model_type`` or architecture transformers does not know, or a malformed config
is a :class:`~partitioner.errors.CheckpointError` naming the file and the key.

Example:
    >>> folder = open_folder("tiny-llama")                       # doctest: +SKIP
    >>> is_hollow(next(folder.module.parameters()))
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from partitioner.errors import CheckpointError, HetpartError

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_SEQUENCE", "FolderModel", "WEIGHT_SUFFIXES", "hollow_tensor", "is_hollow", "is_model_folder",
           "open_folder", "parse_dtype"]

#: Tokens per example input when no shape is declared (capped at the config's positions).
DEFAULT_SEQUENCE = 128
#: A state-dict file given as MODEL (its folder holds config.json).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
CONFIG = "config.json"
MAX_CONFIG_BYTES = 2**24
#: The task classes tried, in order, for a config that names no architecture.
AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM", "AutoModel")
_DTYPES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}


@dataclasses.dataclass(frozen=True, eq=False)
class FolderModel:
    """A model folder opened for planning and loading (see the module docstring)."""

    folder: Path                       # the folder holding config.json
    weights: Path | None               # a state-dict file given as MODEL (else the folder's own weights)
    config: Any                        # the transformers config
    architecture: str                  # the class built, e.g. "LlamaForCausalLM"
    module: torch.nn.Module            # hollow parameters and persistent buffers; constants as the constructor made them
    dtype: torch.dtype
    input_names: tuple[str, ...]       # the forward's arguments up to the last input given
    input_shapes: Mapping[str, tuple[int, ...]]
    trust_remote_code: bool = False
    dtype_given: bool = False          # the dtype was asked (stored tensors of another dtype are cast on loading)

    @property
    def name(self) -> str:
        """The model's name in plans: the folder's name (the weights file's, when one was given)."""
        return self.weights.stem if self.weights is not None else self.folder.resolve().name

    def example_inputs(self, device: str | torch.device = "cpu", seed: int = 0) -> tuple[Any, ...]:
        """Positional inputs of the declared shapes: token ids in the vocabulary (random from
        ``seed``), masks of ones, float inputs from a normal distribution; ``None`` for the
        forward's arguments in between.

        Example:
            >>> folder.example_inputs("cpu")[0].shape              # doctest: +SKIP
            torch.Size([1, 128])
        """
        generator = torch.Generator().manual_seed(seed)
        vocab = int(getattr(self.config, "vocab_size", None) or 2)
        out: list[Any] = []
        for name in self.input_names:
            shape = self.input_shapes.get(name)
            if shape is None:
                out.append(None)
            elif torch.device(device).type == "meta":
                out.append(torch.empty(shape, dtype=_input_dtype(name, self.dtype), device="meta"))
            elif _input_dtype(name, self.dtype) is torch.int64:
                if "mask" in name:
                    value = torch.ones(shape, dtype=torch.int64)
                elif "type" in name:
                    value = torch.zeros(shape, dtype=torch.int64)
                else:
                    value = torch.randint(0, vocab, shape, generator=generator)
                out.append(value.to(device))
            else:
                out.append(torch.randn(shape, generator=generator).to(self.dtype).to(device))
        return tuple(out)

    def for_plan(self, plan: Any) -> FolderModel:
        """This folder with the inputs a plan recorded (its shapes, positionally), to check or emit it.

        Example:
            >>> folder.for_plan(plan).input_shapes                   # doctest: +SKIP
            {'input_ids': (1, 8)}
        """
        params = _forward_names(self.module)
        specs = tuple(plan.inputs or ())
        if not specs or len(specs) > len(params):
            return self
        shapes = {name: tuple(spec.shape) for name, spec in zip(params, specs) if spec.kind == "tensor"}
        return dataclasses.replace(self, input_names=tuple(params[:len(specs)]), input_shapes=shapes)

    def reference(self) -> torch.nn.Module:
        """The model with its weights, built by transformers itself (``from_pretrained``, on the
        host, eval mode): what ``hetpart check`` compares the loaded plan against. Holds the
        whole model in host memory.

        Example:
            >>> model = folder.reference()                           # doctest: +SKIP
        """
        import transformers

        cls = _model_class(self.config, self.architecture, self.trust_remote_code)
        if self.weights is None:
            with _quiet(transformers):
                model = cls.from_pretrained(self.folder, config=self.config, dtype=self.dtype,
                                            trust_remote_code=self.trust_remote_code)
            return model.eval()
        with _quiet(transformers):
            model = _construct(cls, self.config, self.dtype, self.trust_remote_code).eval()
        if self.weights.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(self.weights)
        else:
            state = torch.load(self.weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=False)
        return model


def is_model_folder(spec: Any) -> bool:
    """Whether a MODEL argument names a model folder: a folder path (with ``/`` in it, or holding
    ``config.json``) or a state-dict file whose folder holds ``config.json``.

    Example:
        >>> is_model_folder("gpt:tiny")
        False
    """
    if isinstance(spec, FolderModel):
        return True
    if not isinstance(spec, (str, Path)):
        return False
    path = Path(spec)
    text = str(spec)
    if path.is_dir():
        return "/" in text or text.startswith(".") or (path / CONFIG).is_file()
    return path.suffix.lower() in WEIGHT_SUFFIXES and path.is_file() and (path.parent / CONFIG).is_file()


def open_folder(
    spec: str | Path | FolderModel,
    *,
    dtype: Any = None,
    trust_remote_code: bool = False,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> FolderModel:
    """Open a model folder (or a state-dict file beside a ``config.json``) for planning.

    Parameters:
        spec: the folder, or a ``.safetensors`` / ``.bin`` / ``.pt`` file whose folder holds config.json.
        dtype: the dtype to build and load in (``"bf16"``, ``torch.float32``); default the config's.
        trust_remote_code: allow a folder that brings its own modeling code (``auto_map``).
        input_shapes: shapes of the forward's inputs by name, e.g. ``{"input_ids": (1, 512)}``.

    Raises:
        CheckpointError: no config.json, a malformed one, an architecture transformers does not
            know, custom code without ``trust_remote_code``, or an input the forward does not take.

    Example:
        >>> open_folder("tiny-llama", input_shapes={"input_ids": (1, 16)}).architecture   # doctest: +SKIP
        'LlamaForCausalLM'
    """
    if isinstance(spec, FolderModel):
        return spec
    path = Path(spec)
    folder, weights = (path, None) if path.is_dir() else (path.parent, path)
    if not path.exists():
        raise CheckpointError(f"model folder {str(path)!r} does not exist")
    config_path = folder / CONFIG
    if not config_path.is_file():
        raise CheckpointError(
            f"{folder} has no {CONFIG}: a Hugging Face model folder holds {CONFIG} beside its weights "
            f"(model.safetensors, or shards listed in model.safetensors.index.json); write one with "
            f"model.save_pretrained(folder), or give a zoo name or file.py:factory")
    raw = _read_config(config_path)
    if raw.get("auto_map") and not trust_remote_code:
        raise CheckpointError(
            f"{config_path}: 'auto_map' names the folder's own modeling code ({', '.join(sorted(raw['auto_map']))}); "
            f"hetpart runs a folder's Python code only when asked: pass --trust-remote-code "
            f"(trust_remote_code=True) if you trust it")
    try:
        import transformers
    except ImportError:
        raise CheckpointError(f"{folder}: a model folder is built by Hugging Face transformers, which is not "
                              f"installed here: pip install transformers") from None

    from torch.utils._python_dispatch import _disable_current_modes

    # building the hollow model is no part of any program a dispatch mode (strict devices) watches
    with _quiet(transformers), _disable_current_modes():
        config = _config(config_path, raw, trust_remote_code)
        _no_cache(config)
        architecture, cls = _architecture(config_path, config, raw, trust_remote_code)
        resolved = parse_dtype(dtype) if dtype is not None else _config_dtype(config_path, config)
        with _empty_parameters():
            module = _construct(cls, config, resolved, trust_remote_code)
        module.eval()
        _hollow(module)
    names, shapes = _inputs(config_path, module, config, input_shapes)
    log.info("opened %s: %s, %s, %d parameters (hollow)", folder, architecture, resolved,
             sum(p.numel() for p in module.parameters()))
    return FolderModel(folder, weights, config, architecture, module, resolved, names, shapes,
                       trust_remote_code, dtype is not None)


def parse_dtype(value: Any) -> torch.dtype:
    """``"bf16"``, ``"bfloat16"``, ``"torch.float16"`` or a ``torch.dtype`` as a floating dtype.

    Example:
        >>> parse_dtype("bf16")
        torch.bfloat16
    """
    if isinstance(value, torch.dtype):
        return value
    text = str(value).removeprefix("torch.").lower()
    found = getattr(torch, _DTYPES.get(text, text), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise HetpartError(f"dtype {value!r}: expected a floating dtype such as bfloat16, float16 or float32 "
                           f"(bf16, fp16, fp32)")
    return found


# -- the config and the class ------------------------------------------------------------------


def read_json_file(path: Path, what: str, max_bytes: int, remedy: str) -> Any:
    """The JSON in ``path`` (a folder's config or weights index); a file that cannot be read or is no
    JSON is a CheckpointError naming it, the line, and ``remedy`` (how such a file is written)."""
    from partitioner.files import read_text

    try:
        return json.loads(read_text(path, what=what, max_bytes=max_bytes))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not JSON ({err.msg} at line {err.lineno}): {remedy}") from None
    except HetpartError as err:
        raise CheckpointError(str(err)) from None


def _read_config(path: Path) -> dict[str, Any]:
    raw = read_json_file(path, "model config", MAX_CONFIG_BYTES,
                         f"a model folder's {CONFIG} is written by config.save_pretrained")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} holds a JSON {type(raw).__name__}, not the object of a model config")
    return raw


def _config(path: Path, raw: Mapping[str, Any], trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    if "model_type" not in raw and not raw.get("auto_map"):
        raise CheckpointError(f"{path} has no 'model_type': transformers cannot tell which architecture it "
                              f"describes; write it with config.save_pretrained")
    try:
        return AutoConfig.from_pretrained(path.parent, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError, TypeError) as err:
        import transformers

        first = str(err).strip().splitlines()[0][:240] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"{path}: model_type {raw.get('model_type')!r} is not an architecture transformers "
            f"{transformers.__version__} knows ({first}); upgrade transformers, or fix 'model_type'") from None


def _architecture(path: Path, config: Any, raw: Mapping[str, Any], trust_remote_code: bool) -> tuple[str, Any]:
    """The class to build: the config's first architecture, else the first Auto class that knows it."""
    import transformers

    names = list(getattr(config, "architectures", None) or [])
    if names:
        name = names[0]
        if trust_remote_code and raw.get("auto_map"):
            return name, _model_class(config, name, True)
        cls = getattr(transformers, name, None)
        if cls is None or not hasattr(cls, "_from_config"):
            raise CheckpointError(
                f"{path}: 'architectures' names {name!r}, which transformers {transformers.__version__} does not "
                f"have; upgrade transformers, or name a class it has (e.g. {type(config).__name__.removesuffix('Config')}"
                f"ForCausalLM)")
        return name, cls
    for auto in AUTO_CLASSES:
        mapping = getattr(getattr(transformers, auto), "_model_mapping", {})
        try:
            cls = mapping[type(config)]
        except (KeyError, ValueError):
            continue
        return cls.__name__, cls
    raise CheckpointError(f"{path}: no 'architectures' and no task class of transformers takes a "
                          f"{type(config).__name__}; add 'architectures': [CLASS] to it")


def _no_cache(config: Any) -> None:
    """The forward is planned as one pass without a key-value cache (a cache object is no tensor
    output a plan can carry): ``use_cache`` off, in sub-configs too."""
    for sub in (config, *(getattr(config, k, None) for k in ("text_config", "decoder"))):
        if sub is not None and getattr(sub, "use_cache", False):
            sub.use_cache = False


def _model_class(config: Any, architecture: str, trust_remote_code: bool) -> Any:
    import transformers

    if trust_remote_code and getattr(config, "auto_map", None):
        for auto in AUTO_CLASSES:
            if auto in config.auto_map:
                return _RemoteClass(getattr(transformers, auto))
    return getattr(transformers, architecture)


class _RemoteClass:
    """An Auto class standing for a folder's own model class (``trust_remote_code``)."""

    def __init__(self, auto: Any) -> None:
        self.auto = auto

    def _from_config(self, config: Any, **kwargs: Any) -> Any:
        return self.auto.from_config(config, trust_remote_code=True, **kwargs)

    def from_pretrained(self, folder: Any, **kwargs: Any) -> Any:
        return self.auto.from_pretrained(folder, **kwargs)


def _construct(cls: Any, config: Any, dtype: torch.dtype, trust_remote_code: bool) -> torch.nn.Module:
    try:
        return cls._from_config(config, dtype=dtype)
    except Exception as err:  # the model's own constructor: named, with the config it was given
        raise CheckpointError(f"building {getattr(cls, '__name__', cls)} from config.json failed: "
                              f"{type(err).__name__}: {str(err).strip()[:240]}") from err


def _config_dtype(path: Path, config: Any) -> torch.dtype:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if value is None or value == "auto":
        return torch.float32
    try:
        return parse_dtype(value)
    except HetpartError:
        raise CheckpointError(f"{path}: 'dtype' {value!r} is not a floating dtype; fix it, or pass --dtype") from None


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' own warnings (unused kwargs, a generation config) are not the user's business here."""
    level = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()


# -- meta construction -------------------------------------------------------------------------


@contextlib.contextmanager
def _empty_parameters() -> Iterator[None]:
    """Every parameter registered inside the block lives on the meta device (no memory, no init);
    buffers are made as the constructor makes them, on the host, so their values can be kept."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def hollow_tensor(like: torch.Tensor) -> torch.Tensor:
    """A host tensor of ``like``'s shape and dtype holding one element (stride 0): no memory.

    Example:
        >>> hollow_tensor(torch.empty(1000, 1000, device="meta")).untyped_storage().nbytes()
        4
    """
    return torch.zeros((), dtype=like.dtype).expand(like.shape)


def is_hollow(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s storage is smaller than the tensor (a hollow stand-in, not a weight)."""
    return tensor.untyped_storage().nbytes() < tensor.numel() * tensor.element_size()


def _hollow(module: torch.nn.Module) -> None:
    """Make every meta parameter and every persistent buffer hollow (tied tensors stay tied); keep
    the buffers a checkpoint does not hold (non-persistent) as the constructor made them."""
    made: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and param.is_meta:
                if id(param) not in made:
                    made[id(param)] = torch.nn.Parameter(hollow_tensor(param), requires_grad=param.requires_grad)
                sub._parameters[name] = made[id(param)]
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None and (buffer.is_meta or name not in sub._non_persistent_buffers_set):
                if id(buffer) not in made:
                    made[id(buffer)] = hollow_tensor(buffer)
                sub._buffers[name] = made[id(buffer)]


# -- inputs ------------------------------------------------------------------------------------


def _inputs(path: Path, module: torch.nn.Module, config: Any,
            declared: Mapping[str, tuple[int, ...]] | None) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]]]:
    """The forward's argument names up to the last input, and the shape of each input."""
    params = _forward_names(module)
    if declared:
        shapes = {name: tuple(int(d) for d in shape) for name, shape in declared.items()}
        unknown = [n for n in shapes if n not in params]
        if unknown:
            raise CheckpointError(f"--input-shape names {', '.join(map(repr, unknown))}, which "
                                  f"{type(module).__name__}.forward does not take; its inputs are: "
                                  f"{', '.join(params[:8])}")
    else:
        positions = [getattr(config, k, None) for k in ("max_position_embeddings", "n_positions", "max_seq_len")]
        limit = min([int(p) for p in positions if isinstance(p, int) and p > 0] or [DEFAULT_SEQUENCE])
        seq = min(DEFAULT_SEQUENCE, limit)
        wanted = ["input_ids"] + (["decoder_input_ids"] if getattr(config, "is_encoder_decoder", False) else [])
        missing = [n for n in wanted if n not in params]
        if missing:
            raise CheckpointError(f"{type(module).__name__}.forward takes no {missing[0]!r} (its inputs are "
                                  f"{', '.join(params[:8])}): declare the inputs with --input-shape NAME=1x...")
        shapes = {n: (1, seq) for n in wanted}
    last = max(params.index(n) for n in shapes)
    return tuple(params[: last + 1]), shapes


def _forward_names(module: torch.nn.Module) -> list[str]:
    return [p.name for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _input_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """Token ids, positions and masks are int64; anything else (pixels, features) is in the model's dtype."""
    return torch.int64 if name.endswith(("_ids", "_mask", "ids")) or name in ("attention_mask", "position_ids") \
        else dtype
