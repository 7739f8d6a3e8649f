"""Unit parsing and formatting (cost_models.units)."""

from __future__ import annotations

import math

import pytest

from cost_models.units import (
    format_bytes, format_flops, format_rate, format_seconds, parse_bandwidth, parse_bytes,
    parse_flops, parse_seconds,
)
from partitioner.errors import ProfileError, UnitError


@pytest.mark.parametrize("text, expected", [
    ("64GiB", 64 * 2**30),
    ("141GB", 141 * 10**9),
    ("512 MiB", 512 * 2**20),
    ("4.5GB", 4_500_000_000),
    ("1024", 1024),
    ("2KB", 2000),
    ("2kB", 2000),
    ("2KiB", 2048),
    ("1TiB", 2**40),
    ("3TB", 3 * 10**12),
    ("100B", 100),
    ("0.5KiB", 512),
    (150109880320, 150109880320),
    (1.5e9, 1_500_000_000),
    (0, 0),
])
def test_parse_bytes(text, expected):
    got = parse_bytes(text)
    assert got == expected
    assert isinstance(got, int)


@pytest.mark.parametrize("text, expected", [
    ("55GB/s", 55e9),
    ("4.1TB/s", 4.1e12),
    ("900 GB/s", 900e9),
    ("9GiB/s", 9 * 2**30),
    ("512MiB/s", 512 * 2**20),
    ("100B/s", 100.0),
    (3e10, 3e10),
    ("2e9", 2e9),
])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == expected   # exact: strings are read as decimals


@pytest.mark.parametrize("text, expected", [
    ("17us", 17e-6),
    ("17µs", 17e-6),      # micro sign U+00B5
    ("17μs", 17e-6),      # greek mu U+03BC
    ("2ms", 2e-3),
    ("1.5s", 1.5),
    ("300ns", 300e-9),
    ("1.7 us", 1.7e-6),
    (0.25, 0.25),
    ("3", 3.0),
])
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == expected


@pytest.mark.parametrize("text, expected", [
    (51e12, 51e12),
    ("51TFLOPS", 51e12),
    ("51 TFLOP/s", 51e12),
    ("790 TFLOPs", 790e12),
    ("1.5e12", 1.5e12),
    ("120 GFLOPS", 120e9),
    ("2PFLOPS", 2e15),
    (10**12, 1e12),
])
def test_parse_flops(text, expected):
    assert parse_flops(text) == expected


@pytest.mark.parametrize("parse, bad", [
    (parse_bytes, "-5GB"),
    (parse_bytes, ""),
    (parse_bytes, "   "),
    (parse_bytes, "64gigs"),
    (parse_bytes, "64gb"),          # unit letters are matched as written
    (parse_bytes, "8Gb"),           # gigabits
    (parse_bytes, "nan"),
    (parse_bytes, float("nan")),
    (parse_bytes, -1),
    (parse_bytes, True),
    (parse_bytes, None),
    (parse_bytes, [64]),
    (parse_bandwidth, "55GB"),      # a size, not a rate
    (parse_bandwidth, "10Gb/s"),    # bits
    (parse_bandwidth, "-1GB/s"),
    (parse_bandwidth, float("inf")),
    (parse_bandwidth, "1e400"),
    (parse_seconds, "5 minutes"),
    (parse_seconds, "-2ms"),
    (parse_seconds, "2 sec"),
    (parse_flops, "51 TB/s"),
    (parse_flops, "fast"),
    (parse_flops, -1.0),
])
def test_rejects_bad_values(parse, bad):
    with pytest.raises(UnitError):
        parse(bad, where="test")


def test_error_names_where_value_and_form():
    where = 'h200-host.toml: devices."cuda:0".memory'
    with pytest.raises(UnitError) as err:
        parse_bytes("64 gigs", where=where)
    msg = str(err.value)
    assert where in msg and "'64 gigs'" in msg
    assert "GiB" in msg and "e.g." in msg            # the expected form with an example
    assert isinstance(err.value, ProfileError)       # UnitError is a ProfileError

    with pytest.raises(UnitError, match=r"links\[0\]\.bandwidth: '10Gb/s'.*bits"):
        parse_bandwidth("10Gb/s", where="links[0].bandwidth")
    with pytest.raises(UnitError, match=r"negative"):
        parse_seconds("-2ms", where="x")
    with pytest.raises(UnitError, match=r"e\.g\. \"17us\""):
        parse_seconds("2 sec", where="x")
    with pytest.raises(UnitError, match=r"TFLOPS"):
        parse_flops("fast", where="x")


def test_error_without_where_starts_with_value():
    with pytest.raises(UnitError, match=r"^'abc' is not valid"):
        parse_bytes("abc")


def test_formatters():
    assert format_bytes(4 * 2**30) == "4.00 GiB"
    assert format_bytes(150109880320) == "139.80 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_seconds(0.0527) == "52.7 ms"
    assert format_seconds(17e-6) == "17.0 µs"
    assert format_seconds(1.5) == "1.50 s"
    assert format_seconds(300e-9) == "300 ns"
    assert format_seconds(0) == "0 s"
    assert format_rate(55e9) == "55.0 GB/s"
    assert format_rate(4.1e12) == "4.10 TB/s"
    assert format_rate(9e9) == "9.00 GB/s"
    assert format_flops(1.2e12) == "1.2 TFLOP"
    assert format_flops(150994944) == "151.0 MFLOP"
    assert format_flops(51e12, per_second=True) == "51.0 TFLOP/s"
    assert format_flops(12) == "12 FLOP"


def test_format_then_parse_is_close():
    for n in (1, 1000, 2**20, 3 * 10**9, 150109880320):
        text = format_bytes(n).replace(" ", "")
        assert math.isclose(parse_bytes(text), n, rel_tol=5e-3)
    assert math.isclose(parse_bandwidth(format_rate(55e9).replace(" ", "")), 55e9)
    assert math.isclose(parse_seconds(format_seconds(17e-6).replace(" ", "")), 17e-6)
