"""Duration strings of the custom resource ("2s", "150ms", "1m30s") <-> seconds.

The format is the subset of Go's ``time.ParseDuration`` that makes sense for tuning windows: one or
more ``<number><unit>`` parts with units h, m, s, ms, summed. Go-compatible on purpose: the CRD's CEL
rules call ``duration(...)`` on the same strings, so the API server and the operator agree.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# RE2-compatible (the API server checks it with Go's regexp): no lookarounds.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(h|ms|m|s))+$"
DURATION_MAX_LENGTH = 32
DURATION_EXAMPLES = '"150ms", "2s", "1m30s", "10m", "1h"'

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s)")
_WHOLE = re.compile(DURATION_PATTERN)
# Exact: "700ms" is 0.7 s, not 700 x 0.001 = 0.7000000000000001 (a bound SGLang's histograms are
# rendered with, read by whoever reads the pod's command)
_UNIT_SECONDS = {"h": Fraction(3600), "m": Fraction(60), "s": Fraction(1), "ms": Fraction(1, 1000)}


class DurationError(ValueError):
    """A string that is not a duration; the message gives examples of valid ones."""


def parse_duration(text: object) -> float:
    """Seconds in ``text`` ("1m30s" -> 90.0). Raises DurationError with examples on bad input."""
    if not isinstance(text, str):
        raise DurationError(f"must be a duration string such as {DURATION_EXAMPLES}, got {text!r}")
    if len(text) > DURATION_MAX_LENGTH or not _WHOLE.fullmatch(text):
        raise DurationError(
            f"{text!r} is not a duration; use a number followed by a unit (h, m, s, ms), "
            f"e.g. {DURATION_EXAMPLES}"
        )
    return float(
        sum((Fraction(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text)), Fraction(0))
    )


def format_duration(seconds: float) -> str:
    """The canonical string for ``seconds`` (90 -> "1m30s", 0.15 -> "150ms", 0 -> "0s").

    Whole milliseconds use h/m/s/ms parts; anything finer is written in seconds with up to nine
    decimals, so parse_duration(format_duration(x)) == x to the nanosecond.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise DurationError(f"cannot format {seconds!r} as a duration (must be finite and >= 0)")
    millis = round(seconds * 1000)
    if abs(millis - seconds * 1000) > 1e-6:
        return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"
    if millis == 0:
        return "0s"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if secs:
        parts.append(f"{secs}s")
    if millis:
        parts.append(f"{millis}ms")
    return "".join(parts)
