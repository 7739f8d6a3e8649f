"""Typed access to a decoded JSON file (a plan, a parts manifest): every error names the file and the field path.

In: decoded JSON values, one at a time, and the path they sit at (``solver.gap``,
``placement["linear_3"]``). Out: the value, checked to be of the expected kind, or a
:class:`~partitioner.plan.values.PlanFormatError` naming ``source: path``; :func:`parse_json`
decodes the text first (a truncated file is called truncated, duplicate keys and non-finite
numbers are refused). It imports nothing of the plan record, so every section reader and the
manifest can use it.

Example:
    >>> FieldReader("plan.json").count(3, "model.op_count")
    3
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from partitioner.plan.values import _REPLAN, FORMAT_VERSION, PlanFormatError, _finite_or_none


def _show(value: Any) -> str:
    """A value as it appears in JSON, shortened: ``"abc"``, ``null``, ``{"a": 1}``."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(path: str, key: str) -> str:
    """The path of a mapping entry: ``placement["linear_3"]``."""
    return f"{path}[{json.dumps(key)}]"


def _field(path: str, name: str) -> str:
    """The path of a fixed field: ``solver.gap`` (``gap`` at the top)."""
    return f"{path}.{name}" if path else name


class FieldReader:
    """Checks the type of one decoded JSON value at a time; every error names ``source: path``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> NoReturn:
        raise PlanFormatError(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")

    def expected(self, path: str, what: str, value: Any) -> NoReturn:
        self.fail(path or "the file", f"expected {what}, got {_show(value)}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.expected(path, "an object", value)
        return value

    def keys(self, value: Any, path: str, required: Sequence[str],
             optional: Sequence[str] = ()) -> Mapping[str, Any]:
        """``value`` as an object with every required key and no other than the optional ones."""
        value = self.mapping(value, path)
        for key in required:
            if key not in value:
                self.fail(_field(path, key), f"missing; {path or 'a plan'} needs "
                                             f"{', '.join(required)}")
        allowed = (*required, *optional)
        unknown = [k for k in value if k not in allowed]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
            hint = f" (did you mean {json.dumps(close[0])}?)" if close else ""
            where = f"{path}: unknown key" if path else "unknown top-level key"
            self.fail("", f"{where}{'s' * (len(unknown) > 1)} {', '.join(map(_show, unknown))}{hint}; "
                          f"the keys of {path or f'a format_version {FORMAT_VERSION} plan'} are: "
                          f"{', '.join(allowed)}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            self.expected(path, "a string", value)
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.expected(path, "true or false", value)
        return value

    def count(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.expected(path, "a non-negative integer", value)
        return value

    def number(self, value: Any, path: str) -> float:
        """A finite number (non-negative: every number of a plan is a time, size or ratio)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            self.expected(path, "a non-negative number", value)
        return float(value)

    def number_or_null(self, value: Any, path: str) -> float | None:
        """A number, or None for null and for non-finite numbers (unknown)."""
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            self.expected(path, "a number or null", value)
        return _finite_or_none(value)

    def array(self, value: Any, path: str) -> Sequence[Any]:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            self.expected(path, "an array", value)
        return value

    def string_list(self, value: Any, path: str) -> tuple[str, ...]:
        return tuple(self.string(v, f"{path}[{i}]") for i, v in enumerate(self.array(value, path)))

    def string_map(self, value: Any, path: str, item: Callable[[Any, str], Any]) -> dict[str, Any]:
        return {k: item(v, _key(path, k)) for k, v in self.mapping(value, path).items()}


def parse_json(text: str, source: str) -> Any:
    """Decode ``text``; a syntax error names the line, a file that ends early is called truncated."""
    if not text.strip():
        raise PlanFormatError(f"{source}: the file is empty; {_REPLAN}")

    def reject_constant(token: str) -> NoReturn:
        raise PlanFormatError(f"{source}: {token} is not allowed in a plan; unknown numbers are null")

    try:
        return json.loads(text, parse_constant=reject_constant, object_pairs_hook=_no_duplicates(source))
    except RecursionError:
        raise PlanFormatError(f"{source}: arrays or objects are nested too deeply (thousands of levels) "
                              f"for a plan: the file is not a plan; {_REPLAN}") from None
    except json.JSONDecodeError as err:
        if ends_early(text, err):
            last = text.rstrip().count("\n") + 1
            raise PlanFormatError(
                f"{source}: line {last}: the file ends in the middle of the JSON: it is truncated (an "
                f"interrupted copy or write?); restore it or {_REPLAN}") from None
        raise PlanFormatError(f"{source}: line {err.lineno}, column {err.colno}: JSON syntax error: "
                              f"{err.msg}") from None
    except ValueError as err:  # an integer of more digits than Python converts (4300 by default)
        raise PlanFormatError(f"{source}: a number in the file is too long to read ({_first(err)}); "
                              f"no plan field needs one; {_REPLAN}") from None


def ends_early(text: str, err: json.JSONDecodeError) -> bool:
    """Whether the decoder stopped because the text ends: at its end, in an unterminated string, or
    in a number or literal cut short (``0.``, ``1e-``, ``nul``: what follows the error is that
    fragment alone)."""
    rest = text.rstrip()[err.pos:]
    return not rest or err.msg.startswith("Unterminated string") or re.fullmatch(r"[\w.+\-]+", rest) is not None


def _first(err: BaseException) -> str:
    return str(err).split(";")[0].strip()


def _no_duplicates(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise PlanFormatError(f"{source}: the key {json.dumps(key)} appears twice in one object")
            out[key] = value
        return out
    return build
