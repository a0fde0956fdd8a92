"""Parsed Prometheus text expositions (one scrape of one pod) and the lookups the sources need.

Parsing uses prometheus_client's own text parser. A ``Snapshot`` keeps every sample with its labels,
which sample names are cumulative (counters and histogram buckets/counts/sums) and the process
identity used to detect restarts (``process_start_time_seconds`` and the ``_created`` timestamps that
prometheus_client exports for counters and histograms).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
SeriesKey = tuple[str, Labels]

CUMULATIVE_TYPES = frozenset({"counter", "histogram", "summary"})
UNTYPED_CUMULATIVE = ("_total", "_bucket")  # untyped samples that are counters by naming convention
START_TIME = "process_start_time_seconds"


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return frozenset(mapping.items())


@dataclass(frozen=True)
class Snapshot:
    """One scrape of one target at wall time ``t`` (seconds since the epoch)."""

    target: str
    t: float
    values: Mapping[SeriesKey, float]
    cumulative: frozenset[str] = frozenset()  # sample names that only grow (until a restart)
    identity: tuple[tuple[SeriesKey, float], ...] = ()  # start time and _created samples, sorted
    labels: Mapping[str, str] = field(default_factory=dict)  # target labels (pod, namespace, ...)

    def only(self, names: frozenset[str], like: Snapshot | None = None) -> Snapshot:
        """This scrape with only the samples called one of ``names`` (its identity kept): what a
        window keeps of a scrape for minutes. A whole engine exposition parses to ~300 KB (vLLM:
        ~300 series); a window keeps up to five scrapes per pod.

        ``like``: an earlier scrape of the same target whose series keys this one reuses where they
        are equal (the same objects, not copies): a key (name and label set) costs several times its
        value, and a target's keys rarely change between scrapes, so a window's later scrapes then
        cost little more than their values."""
        canon: dict[SeriesKey, SeriesKey] = {}
        if like is not None:
            canon = {key: key for key in like.values}
            canon.update((key, key) for key, _ in like.identity)
        values = {canon.get(key, key): v for key, v in self.values.items() if key[0] in names}
        identity = self.identity
        if like is not None:
            identity = (
                like.identity
                if identity == like.identity
                else tuple((canon.get(k, k), v) for k, v in identity)
            )
        cumulative = self.cumulative & names
        if like is not None and cumulative == like.cumulative:
            cumulative = like.cumulative
        return Snapshot(self.target, self.t, values, cumulative, identity, self.labels)

    def series(self, name: str) -> Iterator[tuple[Labels, float]]:
        for (n, labels), v in self.values.items():
            if n == name:
                yield labels, v

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.values)

    def restarted_since(self, before: Snapshot) -> bool:
        """True when this scrape comes from a different process than ``before``.

        A restart shows as a changed process start time or ``_created`` timestamp, or as a cumulative
        series that decreased or vanished (exporters without either still reveal a reset that way).
        """
        mine, theirs = dict(self.identity), dict(before.identity)
        if any(key in theirs and theirs[key] != value for key, value in mine.items()):
            return True
        if any(
            key[0] in self.cumulative and key in before.values and value < before.values[key]
            for key, value in self.values.items()
        ):
            return True
        # A cumulative series that vanished means a new process (its labelled children not yet created).
        return any(key[0] in before.cumulative and key not in self.values for key in before.values)


FAMILY_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _family(sample: str) -> str:
    for suffix in FAMILY_SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


# A sample line's shape (name, optional labels, a value, an optional timestamp): what a line the
# window does not read must still have, so that a broken exposition is reported whatever it breaks.
_SAMPLE_LINE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?\s+(?P<value>\S+)(?:\s+-?[0-9]+)?\s*$")


def _malformed(line: str) -> bool:
    match = _SAMPLE_LINE.match(line)
    if match is None:
        return True
    try:
        float(match.group("value"))
    except ValueError:
        return True
    return False


def only_lines(text: str, names: frozenset[str]) -> str:
    """The lines of an exposition that can yield the samples ``names``: those samples, the HELP and
    TYPE lines of their families, their families' ``_created`` samples and the process start time
    (a snapshot's identity). What ``Snapshot.only(names)`` would keep of the parse, found by the
    sample name at the start of each line instead of running the parser over every line (an engine
    exposition is ~300 series; a window reads a few dozen: the parse was a quarter of the
    operator's CPU at N = 500, ``bench scale``). A line it drops is still checked for a sample's
    shape (a regular expression, not the parser): a malformed one raises ValueError, as the parser
    would, so that a broken exposition is reported whichever lines it breaks."""
    families = {_family(name) for name in names} | set(names)
    kept = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            parts = stripped.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE") or parts[2] in families:
                kept.append(line)  # a HELP or TYPE line of ours, or any other comment
            continue
        name = stripped.split("{", 1)[0].split(None, 1)[0]
        if name in names or name == START_TIME or (name.endswith("_created") and _family(name) in families):
            kept.append(line)
        elif _malformed(stripped):
            raise ValueError(f"line {number} is not a sample")  # its number, never its text
    return "\n".join(kept) + "\n"


def parse(
    text: str,
    *,
    target: str,
    t: float,
    labels: Mapping[str, str] | None = None,
    only: frozenset[str] | None = None,
) -> Snapshot:
    """Parse one exposition. NaN samples are dropped: NaN is "not measured", never a value.
    ``only``: keep just these samples and the snapshot's identity (``only_lines``)."""
    invalid = f"metrics from {target} are not a valid Prometheus text exposition"
    if only is not None:
        try:
            text = only_lines(text, only)
        except ValueError as err:
            raise ValueError(f"{invalid}: {err}") from err
    values: dict[SeriesKey, float] = {}
    cumulative: set[str] = set()
    identity: list[tuple[SeriesKey, float]] = []
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as err:
        raise ValueError(f"{invalid}: {err}") from err
    for family in families:
        # A declared family without samples (labelled children not created yet) still exists: its
        # series are 0, not missing.
        if family.type == "counter":
            cumulative.add(family.name + "_total")
        elif family.type in ("histogram", "summary"):
            cumulative.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        for s in family.samples:
            key = (s.name, labels_of(s.labels))
            if s.name.endswith("_created") or s.name == START_TIME:
                identity.append((key, float(s.value)))
                continue
            if math.isnan(s.value):
                continue
            values[key] = float(s.value)
            if family.type in CUMULATIVE_TYPES or (
                family.type == "unknown" and s.name.endswith(UNTYPED_CUMULATIVE)
            ):
                cumulative.add(s.name)
    identity.sort(key=lambda kv: (kv[0][0], sorted(kv[0][1])))
    return Snapshot(target, t, values, frozenset(cumulative), tuple(identity), dict(labels or {}))


@dataclass(frozen=True)
class Matcher:
    """A PromQL label matcher: ``label op value`` with op one of =, !=, =~, !~ (regexes anchored)."""

    label: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in MATCH_OPS:
            raise ValueError(f"label matcher op must be one of {', '.join(MATCH_OPS)}; got {self.op!r}")
        if not LABEL_NAME.fullmatch(self.label):
            raise ValueError(f"label name {self.label!r} is not a valid Prometheus label name")
        if "~" in self.op:
            try:
                re.compile(self.value)
            except re.error as err:
                raise ValueError(
                    f"label matcher {self.label}{self.op}: bad regex {self.value!r}: {err}"
                ) from err

    def accepts(self, value: str | None) -> bool:
        got = value or ""  # PromQL: a missing label equals the empty string
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        hit = re.fullmatch(self.value, got) is not None
        return hit if self.op == "=~" else not hit

    def promql(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.label}{self.op}"{escaped}"'


MATCH_OPS = ("=", "!=", "=~", "!~")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def matches(labels: Labels, matchers: Iterable[Matcher]) -> bool:
    have = dict(labels)
    return all(m.accepts(have.get(m.label)) for m in matchers)


def total_of(snap: Snapshot, name: str, matchers: Iterable[Matcher] = ()) -> float | None:
    """Sum of every series named ``name`` whose labels match; None when there is none."""
    ms = tuple(matchers)
    found = [v for labels, v in snap.series(name) if matches(labels, ms)]
    return sum(found) if found else None
