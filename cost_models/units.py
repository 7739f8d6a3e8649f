"""Quantities with units: parse the strings of a device profile, format numbers for tables.

In: numbers or strings such as ``"64GiB"``, ``"55GB/s"``, ``"17us"``, ``"51TFLOPS"``.
Out: plain SI numbers -- bytes (int), bytes per second, seconds, FLOP/s (float).

Decimal prefixes (KB, MB, GB, TB, PB) are powers of 1000, binary ones (KiB, MiB, GiB,
TiB, PiB) powers of 1024. Unit letters are matched as written, so ``"Gb/s"`` (gigabits)
is rejected instead of being read as gigabytes. Every parse error is a
:class:`~partitioner.errors.UnitError` that names where the value came from, the
value, and the form expected.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal

from partitioner.errors import UnitError

__all__ = [
    "parse_bytes",
    "parse_bandwidth",
    "parse_seconds",
    "parse_flops",
    "format_bytes",
    "format_seconds",
    "format_rate",
    "format_flops",
]

_BYTE_UNITS: dict[str, int] = {
    "B": 1,
    "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50,
}
_SECOND_UNITS: dict[str, Decimal] = {
    "s": Decimal(1), "ms": Decimal("1e-3"), "us": Decimal("1e-6"), "\u00b5s": Decimal("1e-6"),
    "\u03bcs": Decimal("1e-6"), "ns": Decimal("1e-9"),
}
_SI_PREFIX: dict[str, Decimal] = {
    "": Decimal(1), "K": Decimal("1e3"), "k": Decimal("1e3"), "M": Decimal("1e6"),
    "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
}
_FLOP_WORDS = ("FLOPS", "FLOP/s", "FLOPs")

# a number (sign kept so that negatives get their own message), then an optional unit
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*)$")

_BYTES_FORM = ("a byte count: an integer, or a number with a unit B, KB, MB, GB, TB (powers of "
               "1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. \"64GiB\" or \"141GB\"")
_RATE_FORM = ("a rate in bytes per second: a number with a byte unit and \"/s\", "
              "e.g. \"55GB/s\", \"4.1TB/s\" or \"9GiB/s\" (a bare number is bytes/s)")
_SECONDS_FORM = ("a duration: a number with a unit s, ms, us (or \u00b5s) or ns, "
                 "e.g. \"17us\" or \"2ms\" (a bare number is seconds)")
_FLOPS_FORM = ("a FLOP/s rate: a number such as 51e12, or a string such as \"51TFLOPS\", "
               "\"51 TFLOP/s\" or \"1.5e12\"")


def _fail(value: object, where: str, form: str, why: str = "") -> UnitError:
    prefix = f"{where}: " if where else ""
    reason = f" ({why})" if why else ""
    return UnitError(f"{prefix}{value!r} is not valid{reason}; expected {form}")


def _split(value: object, where: str, form: str) -> tuple[Decimal, str]:
    """Split ``value`` into a finite, non-negative number and its unit text ('' for numbers).

    Strings are read as decimals so that ``"4.1TB/s"`` is exactly 4.1e12, not 4.1 * 1e12.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _fail(value, where, form, f"a {type(value).__name__}, not a number or string")
    if isinstance(value, (int, float)):
        if math.isnan(value) or math.isinf(value):
            raise _fail(value, where, form, "not a finite number")
        number, unit = Decimal(value), ""
    else:
        match = _QUANTITY.match(value.strip())
        if not value.strip():
            raise _fail(value, where, form, "empty")
        if match is None:
            raise _fail(value, where, form)
        number, unit = Decimal(match.group(1)), match.group(2)
        if not math.isfinite(float(number)):
            raise _fail(value, where, form, "too large")
    if number < 0:
        raise _fail(value, where, form, "negative")
    return number, unit


def parse_bytes(value: int | float | str, *, where: str = "") -> int:
    """Parse a byte count such as ``"64GiB"``, ``"141GB"``, ``"512 MiB"`` or ``1024``.

    A number without a unit (``80``, ``"80"``, ``80.0``) is a count of bytes and must be whole:
    ``80.5`` is an error (it most likely lacks a unit) rather than 80 or 81 bytes. With a unit, a
    fractional result is rounded half up to whole bytes (``"1.5KB"`` is 1500, ``"0.0005KB"`` 1).

    Example:
        >>> parse_bytes("64GiB"), parse_bytes("4.5GB"), parse_bytes("2KB"), parse_bytes(7)
        (68719476736, 4500000000, 2000, 7)
    """
    number, unit = _split(value, where, _BYTES_FORM)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if unit not in _BYTE_UNITS and unit != "":
        hint = "bits are not accepted; use B for bytes" if unit.endswith("b") else "unknown unit"
        raise _fail(value, where, _BYTES_FORM, hint)
    if unit in ("", "B") and number != number.to_integral_value():
        raise _fail(value, where, _BYTES_FORM, f"not a whole number of bytes; did you mean \"{number}GB\"?")
    return int((number * _BYTE_UNITS.get(unit, 1)).to_integral_value(rounding=ROUND_HALF_UP))


def parse_bandwidth(value: int | float | str, *, where: str = "") -> float:
    """Parse a rate such as ``"55GB/s"``, ``"4.1TB/s"``, ``"900 GB/s"`` into bytes per second.

    Example:
        >>> parse_bandwidth("55GB/s"), parse_bandwidth("9GiB/s")
        (55000000000.0, 9663676416.0)
    """
    number, unit = _split(value, where, _RATE_FORM)
    if unit == "":
        return float(number)
    if not unit.endswith("/s") or unit[:-2] not in _BYTE_UNITS:
        hint = ("bits per second are not accepted; use B for bytes"
                if unit[:-2].endswith("b") else "unknown unit")
        raise _fail(value, where, _RATE_FORM, hint)
    return float(number * _BYTE_UNITS[unit[:-2]])


def parse_seconds(value: int | float | str, *, where: str = "") -> float:
    """Parse a duration such as ``"17us"``, ``"17µs"``, ``"2ms"``, ``"300ns"`` or ``1.5`` (seconds).

    Example:
        >>> parse_seconds("2ms"), parse_seconds("1.5s"), parse_seconds(0.25)
        (0.002, 1.5, 0.25)
    """
    number, unit = _split(value, where, _SECONDS_FORM)
    if unit not in _SECOND_UNITS and unit != "":
        raise _fail(value, where, _SECONDS_FORM, "unknown unit")
    return float(number * _SECOND_UNITS.get(unit, Decimal(1)))


def parse_flops(value: int | float | str, *, where: str = "") -> float:
    """Parse a FLOP/s rate: ``51e12``, ``"51TFLOPS"``, ``"51 TFLOP/s"``, ``"1.5e12"``.

    Example:
        >>> parse_flops("51TFLOPS"), parse_flops("790 TFLOP/s"), parse_flops(1.5e12)
        (51000000000000.0, 790000000000000.0, 1500000000000.0)
    """
    number, unit = _split(value, where, _FLOPS_FORM)
    if unit == "":
        return float(number)
    for word in _FLOP_WORDS:
        if unit.endswith(word) and unit[: -len(word)] in _SI_PREFIX:
            return float(number * _SI_PREFIX[unit[: -len(word)]])
    raise _fail(value, where, _FLOPS_FORM, "unknown unit")


# ----------------------------------------------------------------------------- formatting

def _scaled(x: float, steps: tuple[tuple[float, str], ...]) -> tuple[float, str]:
    """Pick the largest unit whose scale fits ``|x|``; the last step is the smallest unit."""
    for scale, unit in steps:
        if abs(x) >= scale:
            return x / scale, unit
    scale, unit = steps[-1]
    return x / scale, unit


def _three_digits(v: float) -> str:
    """Three significant digits without exponent: 4.10, 55.0, 790."""
    a = abs(v)
    decimals = 2 if a < 10 else 1 if a < 100 else 0
    return f"{v:.{decimals}f}"


def format_bytes(n: float) -> str:
    """Format a byte count with binary units: ``"4.00 GiB"``, ``"512 B"``.

    Example:
        >>> format_bytes(4 * 2**30), format_bytes(512)
        ('4.00 GiB', '512 B')
    """
    if not math.isfinite(n):
        return f"{n} B"
    steps = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
    for scale, unit in steps:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    """Format a duration: ``"52.7 ms"``, ``"17.0 µs"``, ``"1.50 s"``.

    Example:
        >>> format_seconds(0.0527), format_seconds(17e-6)
        ('52.7 ms', '17.0 µs')
    """
    if not math.isfinite(s):
        return f"{s} s"
    if s == 0:
        return "0 s"
    v, unit = _scaled(s, ((1.0, "s"), (1e-3, "ms"), (1e-6, "\u00b5s"), (1e-9, "ns")))
    return f"{_three_digits(v)} {unit}"


def format_rate(bytes_per_s: float) -> str:
    """Format a bandwidth with decimal units: ``"55.0 GB/s"``, ``"4.10 TB/s"``.

    Example:
        >>> format_rate(55e9), format_rate(4.1e12)
        ('55.0 GB/s', '4.10 TB/s')
    """
    if not math.isfinite(bytes_per_s):
        return f"{bytes_per_s} B/s"
    v, unit = _scaled(bytes_per_s, ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"),
                                    (1e3, "KB/s"), (1.0, "B/s")))
    return f"{_three_digits(v)} {unit}"


def format_flops(f: float, *, per_second: bool = False) -> str:
    """Format a FLOP count (or, with ``per_second``, a rate): ``"1.2 TFLOP"``, ``"51.0 TFLOP/s"``.

    Example:
        >>> format_flops(1.2e12), format_flops(51e12, per_second=True)
        ('1.2 TFLOP', '51.0 TFLOP/s')
    """
    suffix = "FLOP/s" if per_second else "FLOP"
    if not math.isfinite(f):
        return f"{f} {suffix}"
    v, prefix = _scaled(f, ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"),
                            (1.0, "")))
    return f"{v:.1f} {prefix}{suffix}" if prefix else f"{v:.0f} {suffix}"
