"""Duration strings <-> seconds."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixtune.api.durations import (
    DURATION_PATTERN,
    DurationError,
    format_duration,
    parse_duration,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2s", 2.0),
        ("150ms", 0.15),
        ("1m30s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1h2m3s4ms", 3723.004),
        ("0.5s", 0.5),
        ("1.5m", 90.0),
        ("0s", 0.0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "2 s", "s", "-1s", "1d", "1sec", "1.s", ".5s", "1m 30s", "2S"])
def test_parse_rejects_with_examples(text: str) -> None:
    with pytest.raises(DurationError, match=r'"150ms", "2s", "1m30s"'):
        parse_duration(text)


@pytest.mark.parametrize("value", [2, 2.0, None, ["2s"]])
def test_parse_rejects_non_strings(value: object) -> None:
    with pytest.raises(DurationError, match="duration string"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (2, "2s"),
        (0.15, "150ms"),
        (90, "1m30s"),
        (3600, "1h"),
        (3723.004, "1h2m3s4ms"),
        (0.0005, "0.0005s"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert re.fullmatch(DURATION_PATTERN, text)


@pytest.mark.parametrize("seconds", [-1.0, float("inf"), float("nan")])
def test_format_rejects(seconds: float) -> None:
    with pytest.raises(DurationError):
        format_duration(seconds)


@given(st.integers(min_value=0, max_value=10 * 24 * 3_600_000))
def test_round_trip_milliseconds(millis: int) -> None:
    seconds = millis / 1000
    text = format_duration(seconds)
    assert re.fullmatch(DURATION_PATTERN, text)
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-9)
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize(
    ("text", "seconds"), [("700ms", 0.7), ("150ms", 0.15), ("1h2m3s4ms", 3723.004), ("20ms", 0.02)]
)
def test_parse_is_exact_to_the_float_nearest_the_decimal(text: str, seconds: float) -> None:
    # 700 x 0.001 is 0.7000000000000001: an SGLang pod's rendered histogram bounds showed it
    assert parse_duration(text) == seconds
