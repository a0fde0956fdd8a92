"""Mooncake traces (FAST'25 release): load, validate, and turn into token-sequence identities.

One JSON object a line: ``timestamp`` (arrival, ms from the trace start), ``input_length`` and
``output_length`` (tokens), ``hash_ids`` (one id per 512-token block of the prompt, prefix-chained:
the same id at position k means the same first (k + 1) * 512 tokens; the last id covers the partial
remainder). See shared/traces/NOTICE and reference/workloads-and-calibration.md §A1.

A prompt becomes one ``Segment`` per hash id (length 512, the last one the remainder), keyed by the
id. The ids are already chained, so the segment key needs no parent: ``(key, o)`` names the prefix
ending o tokens into that block, as ``TokenSeq`` requires. Re-blocking to an engine block size that
divides 512 then falls out of ``TokenSeq.block_ids(b)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prefixtune.twin.prompt import ROOT_KEY, Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request

MOONCAKE_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace file that does not follow the Mooncake format (the message names file, line and field)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    line: int  # 1-based line number in the source (for messages and stable ordering)
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(obj: dict[str, object], name: str, where: str, minimum: int) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: field {name!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(f"{where}: field {name!r} must be >= {minimum}, got {value}")
    return value


def parse_record(text: str, line: int, source: str = "<trace>") -> TraceRecord:
    """Parse and validate one line of a Mooncake trace."""
    where = f"{source}:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object with fields {', '.join(_FIELDS)}")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)} (required: {', '.join(_FIELDS)})")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts != ts or ts < 0:
        raise TraceError(f"{where}: field 'timestamp' must be a number of ms >= 0, got {ts!r}")
    input_length = _int_field(obj, "input_length", where, 1)
    output_length = _int_field(obj, "output_length", where, 1)
    raw_ids = obj["hash_ids"]
    if not isinstance(raw_ids, list) or not raw_ids:
        raise TraceError(f"{where}: field 'hash_ids' must be a non-empty list of integers")
    for h in raw_ids:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise TraceError(f"{where}: field 'hash_ids' must hold integers >= 0, got {h!r}")
    expected = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    if len(raw_ids) != expected:
        raise TraceError(
            f"{where}: field 'hash_ids' has {len(raw_ids)} ids but input_length {input_length} needs "
            f"ceil({input_length}/{MOONCAKE_BLOCK_TOKENS}) = {expected}"
        )
    return TraceRecord(line, float(ts), input_length, output_length, tuple(raw_ids))


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> list[TraceRecord]:
    """Parse a whole trace (blank lines skipped), checking that the ids are consistently chained:
    an id always sits at the same block position after the same parent id."""
    records: list[TraceRecord] = []
    parent_of: dict[int, int] = {}  # id -> parent id (-1 at position 0); position follows from it
    first_seen: dict[int, int] = {}
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        rec = parse_record(text, n, source)
        prev = -1
        for h in rec.hash_ids:
            known = parent_of.setdefault(h, prev)
            if known != prev:
                raise TraceError(
                    f"{source}:{n}: field 'hash_ids': id {h} follows {_name(prev)} here but "
                    f"{_name(known)} on line {first_seen[h]}; ids must be prefix-chained"
                )
            first_seen.setdefault(h, n)
            prev = h
        records.append(rec)
    if not records:
        raise TraceError(f"{source}: the trace holds no records")
    return records


def _name(parent: int) -> str:
    return "the start" if parent < 0 else f"id {parent}"


def load_trace(path: str | Path) -> list[TraceRecord]:
    """Load a Mooncake JSONL trace in file order (``TraceError`` with the line on bad input)."""
    p = Path(path)
    try:
        with p.open(encoding="utf-8") as fh:
            return parse_trace(fh, source=str(p))
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror or exc}") from None


def arrival_order(records: Sequence[TraceRecord]) -> list[TraceRecord]:
    """Records by timestamp, keeping file order within equal timestamps (the conversation trace is
    quantized in 3 s buckets, so the order inside a bucket is the file's)."""
    return sorted(records, key=lambda r: r.timestamp_ms)  # sorted() is stable


_MASK63 = (1 << 63) - 1
_ODD = 0x9E3779B97F4A7C15  # odd: multiplying by it is a bijection modulo 2**63


class TraceKeys:
    """Segment keys for trace hash ids, within a namespace (two traces' ids do not collide).

    ``key(id) = (id * odd mod 2**63) xor base(namespace)``: a bijection, so distinct ids never share
    a key, and ~50x cheaper than a cryptographic hash per id (a trace has 10^5 distinct ids).
    """

    def __init__(self, namespace: str = "mooncake") -> None:
        self.namespace = namespace
        self._base = chain_key(ROOT_KEY, "trace", namespace) & _MASK63
        self._out_base = chain_key(ROOT_KEY, "trace output", namespace) & _MASK63
        self._segs: dict[int, Segment] = {}  # full 512-token segments, shared between records

    def key(self, hash_id: int) -> int:
        return ((hash_id * _ODD) & _MASK63) ^ self._base

    def output_key(self, line: int) -> int:
        """A key for the output of the record on ``line`` (never part of a prompt)."""
        return ((line * _ODD) & _MASK63) ^ self._out_base

    def prompt(self, rec: TraceRecord) -> TokenSeq:
        """The prompt's identity: one segment per hash id, the last one the remainder."""
        ids = rec.hash_ids
        segs = self._segs
        out = []
        for h in ids[:-1]:
            seg = segs.get(h)
            if seg is None:
                seg = segs[h] = Segment(self.key(h), MOONCAKE_BLOCK_TOKENS)
            out.append(seg)
        out.append(Segment(self.key(ids[-1]), rec.input_length - MOONCAKE_BLOCK_TOKENS * (len(ids) - 1)))
        return TokenSeq(tuple(out))


def to_requests(
    records: Sequence[TraceRecord], *, namespace: str = "mooncake", sort: bool = True
) -> list[Request]:
    """Requests in arrival order (stable), ``req_id`` = index, arrival in seconds from the trace start.

    The output has its own identity (one segment keyed by the line), which no later prompt contains:
    the trace's next-turn prompts carry their own ids.
    """
    keys = TraceKeys(namespace)
    ordered = arrival_order(records) if sort else list(records)
    out: list[Request] = []
    for i, rec in enumerate(ordered):
        prompt = keys.prompt(rec)
        out_key = keys.output_key(rec.line)
        out.append(
            Request(
                req_id=i,
                arrival_s=rec.timestamp_ms / 1000.0,
                seq=prompt.extend(Segment(out_key, rec.output_length)),
                prompt_len=rec.input_length,
                output_len=rec.output_length,
                kind="trace",
            )
        )
    return out


def load_requests(path: str | Path, *, namespace: str | None = None) -> list[Request]:
    """``load_trace`` + ``to_requests`` (the namespace defaults to the file name)."""
    p = Path(path)
    return to_requests(load_trace(p), namespace=namespace or p.name)
