"""Workloads for the twin: the field-notes presets, workload files, and Mooncake trace replay.

A workload is a ``WorkloadSpec`` (loadable from YAML or JSON; the format is documented in
``docs/workloads.md``). ``generate(spec_or_name, rate=, duration_s=, seed=)`` turns it into
``Request`` objects whose ``seq`` carries prefix identity (``TokenSeq``) without tokens:

    prompt = shared prefixes (one item from each pool, in order)
           + session context (unique per session)
           + history (every earlier turn's unique part AND its output, when ``session.history``)
           + this turn's unique part (``suffix``)
    seq    = prompt + this turn's output

Keys of shared-prefix items depend only on the workload name, the pool and the item (not on the
seed), so two generators of the same workload share the same system prompts, as two clients of
one application do. Everything unique (context, suffixes, outputs) depends on the seed.

``rate`` is the mean *request* rate. For multi-turn workloads sessions arrive at
``rate / E[turns]`` and each session's turns follow its start, one think time apart. The think time
is counted from the previous turn's arrival (an open-loop generator cannot know the response time),
so it stands for response time + user think time.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefixtune.twin.arrivals import Arrivals
from prefixtune.twin.prompt import ROOT_KEY, Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request
from prefixtune.twin.trace import TraceError, TraceKeys, TraceRecord, load_trace

DIST_KINDS = ("fixed", "uniform", "normal", "lognormal", "geometric")


class WorkloadError(ValueError):
    """A workload name, file or parameter that cannot be used; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dist(_Model):
    """A distribution of a non-negative quantity (token counts, seconds, turns).

    ``fixed`` (value), ``uniform`` (low, high; integers are drawn inclusive of both ends),
    ``normal`` (mean, std), ``lognormal`` (median, sigma: the log's standard deviation),
    ``geometric`` (mean >= 1; values 1, 2, 3, ...). Samples are clipped to [min, max].
    A bare number in a file means ``fixed``.
    """

    dist: Literal["fixed", "uniform", "normal", "lognormal", "geometric"] = "fixed"
    value: float | None = None
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    std: float | None = None
    median: float | None = None
    sigma: float | None = None
    min: float = 0.0
    max: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, data: Any) -> Any:
        if isinstance(data, bool):
            raise ValueError("expected a number or a mapping with 'dist', got a boolean")
        if isinstance(data, int | float):
            return {"dist": "fixed", "value": data}
        return data

    @model_validator(mode="after")
    def _check(self) -> Dist:
        need = {
            "fixed": ("value",),
            "uniform": ("low", "high"),
            "normal": ("mean", "std"),
            "lognormal": ("median", "sigma"),
            "geometric": ("mean",),
        }[self.dist]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"dist {self.dist!r} needs {', '.join(need)}; missing {', '.join(missing)}")
        for f in ("value", "low", "high", "mean", "median", "min"):
            v = getattr(self, f)
            if v is not None and v < 0:
                raise ValueError(f"{f} must be >= 0, got {v}")
        if self.dist == "uniform" and self.high is not None and self.low is not None and self.high < self.low:
            raise ValueError(f"uniform needs low <= high, got low={self.low} high={self.high}")
        if self.std is not None and self.std < 0:
            raise ValueError(f"std must be >= 0, got {self.std}")
        if self.sigma is not None and self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if self.dist == "lognormal" and self.median == 0:
            raise ValueError("lognormal median must be > 0")
        if self.dist == "geometric" and self.mean is not None and self.mean < 1:
            raise ValueError(f"geometric mean must be >= 1, got {self.mean}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, n: int, *, integer: bool) -> list[float]:
        """``n`` draws as plain floats (rounded to whole numbers when ``integer``)."""
        if self.dist == "fixed":
            assert self.value is not None
            x = np.full(n, self.value, dtype=float)
        elif self.dist == "uniform":
            assert self.low is not None and self.high is not None
            if integer:
                x = rng.integers(math.ceil(self.low), math.floor(self.high) + 1, n).astype(float)
            else:
                x = rng.uniform(self.low, self.high, n)
        elif self.dist == "normal":
            assert self.mean is not None and self.std is not None
            x = rng.normal(self.mean, self.std, n)
        elif self.dist == "lognormal":
            assert self.median is not None and self.sigma is not None
            x = rng.lognormal(math.log(self.median), self.sigma, n)
        else:
            assert self.mean is not None
            x = rng.geometric(1.0 / self.mean, n).astype(float)
        if integer:
            x = np.rint(x)
        x = np.clip(x, self.min, self.max if self.max is not None else np.inf)
        return [float(v) for v in x]

    def ints(self, rng: np.random.Generator, n: int) -> list[int]:
        return [int(v) for v in self.sample(rng, n, integer=True)]

    def expected(self, *, integer: bool) -> float:
        """The mean after rounding and clipping (estimated from a fixed-seed sample: deterministic)."""
        if self.dist == "fixed":
            return self.sample(np.random.default_rng(0), 1, integer=integer)[0]
        return float(np.mean(self.sample(np.random.default_rng(20_240_601), 50_000, integer=integer)))


class PrefixPool(_Model):
    """A pool of shared prefixes (system prompts, document sets, tool-schema sets): each session picks
    one item by popularity; items' lengths are drawn once per pool (same for every seed)."""

    name: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=100_000)
    length: Dist
    zipf: float | None = Field(default=None, gt=0)  # popularity ~ 1 / rank**zipf
    weights: tuple[float, ...] | None = None  # explicit popularity, one weight per item

    @model_validator(mode="after")
    def _check(self) -> PrefixPool:
        if self.zipf is not None and self.weights is not None:
            raise ValueError("give either zipf or weights, not both")
        if self.weights is not None:
            if len(self.weights) != self.count:
                raise ValueError(f"weights has {len(self.weights)} entries but count is {self.count}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        return self

    def probabilities(self) -> npt.NDArray[np.float64]:
        w: npt.NDArray[np.float64]
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=np.float64)
        elif self.zipf is not None:
            w = 1.0 / np.arange(1, self.count + 1, dtype=float) ** self.zipf
        else:
            w = np.ones(self.count, dtype=np.float64)
        out: npt.NDArray[np.float64] = w / w.sum()
        return out

    def item_lengths(self, workload: str) -> list[int]:
        rng = np.random.default_rng(chain_key(ROOT_KEY, "pool-lengths", workload, self.name))
        return self.length.ints(rng, self.count)


class SessionSpec(_Model):
    """Multi-turn structure. ``turns`` per session; ``think_time_s`` between consecutive turns'
    arrivals; ``context`` unique tokens once per session after the shared prefixes (user memory, an
    agent's task); ``first_suffix`` replaces ``suffix`` on the first turn when set; ``history``: each
    turn's prompt carries all earlier turns (their suffixes and outputs)."""

    turns: Dist = Dist(value=1)
    think_time_s: Dist = Dist(value=0)
    context: Dist = Dist(value=0)
    first_suffix: Dist | None = None
    history: bool = True

    @field_validator("turns")
    @classmethod
    def _turns(cls, v: Dist) -> Dist:
        if v.expected(integer=True) < 1 or (v.dist == "fixed" and (v.value or 0) < 1):
            raise ValueError("turns must be at least 1")
        return v


class ArrivalSpec(_Model):
    """The arrival process of requests (single-turn) or sessions (multi-turn); see arrivals.py."""

    process: Literal["poisson", "bursty", "diurnal"] = "poisson"
    cv: float = Field(default=1.0, gt=0)
    period_s: float = Field(default=86_400.0, gt=0)
    amplitude: float = Field(default=0.5, ge=0, lt=1)
    phase_s: float = 0.0

    def to_arrivals(self) -> Arrivals:
        return Arrivals(self.process, self.cv, self.period_s, self.amplitude, self.phase_s)


class WorkloadSpec(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    prefixes: tuple[PrefixPool, ...] = ()
    session: SessionSpec = SessionSpec()
    suffix: Dist  # unique tokens each turn adds: question, user message, tool result
    output: Dist  # tokens generated per request (>= 1)
    arrival: ArrivalSpec = ArrivalSpec()
    rate: float | None = Field(default=None, gt=0)  # default mean request rate (requests/s)
    duration_s: float | None = Field(default=None, gt=0)  # default length of a generated run
    max_prompt_tokens: int = Field(default=131_072, ge=1)  # a session ends before exceeding this

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        names = [p.name for p in self.prefixes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"prefixes: duplicate pool name(s) {', '.join(dup)}")
        if self.output.max is not None and self.output.max < 1:
            raise ValueError("output: max must be >= 1 (a request generates at least one token)")
        return self

    @cached_property
    def mean_turns(self) -> float:
        return self.session.turns.expected(integer=True)


# ------------------------------------------------------------------------------------------------
# Presets: the four workload types of the field notes (plus SGLang's generated-shared-prefix).
# Parameters and their sources are documented in docs/workloads.md.


def _ln(median: float, sigma: float, lo: float, hi: float) -> Dist:
    return Dist(dist="lognormal", median=median, sigma=sigma, min=lo, max=hi)


PRESETS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="rag",
            description="RAG over a fixed ~6k-token context (a few document sets, Zipf popular); each "
            "request adds retrieved passages and a question; short answers.",
            prefixes=(
                PrefixPool(name="system", length=Dist(value=200)),
                PrefixPool(
                    name="context",
                    count=4,
                    zipf=1.2,
                    length=Dist(dist="normal", mean=6000, std=250, min=5000, max=7000),
                ),
            ),
            suffix=_ln(480, 0.5, 32, 3000),
            output=_ln(150, 0.6, 8, 1024),
            rate=4.0,
            duration_s=600.0,
        ),
        WorkloadSpec(
            name="chatbot",
            description="Multi-turn chat: one of a few system prompts, per-session user memory, history "
            "(prompts and answers) grows every turn, think time between turns, new sessions keep "
            "arriving.",
            prefixes=(
                PrefixPool(
                    name="system",
                    count=4,
                    zipf=1.0,
                    length=Dist(dist="normal", mean=450, std=120, min=150, max=1000),
                ),
            ),
            session=SessionSpec(
                turns=Dist(dist="geometric", mean=2.0, max=16),
                think_time_s=_ln(20, 0.8, 2, 300),
                context=_ln(250, 0.5, 20, 2000),
            ),
            suffix=_ln(110, 1.0, 4, 4000),
            output=_ln(220, 0.7, 8, 2048),
            rate=4.0,
            duration_s=600.0,
            max_prompt_tokens=32_768,
        ),
        WorkloadSpec(
            name="agent",
            description="Tool-using agent: a system prompt, one of a few tool-schema sets (Zipf), the "
            "task, then steps that append the model's tool call and the tool's result.",
            prefixes=(
                PrefixPool(name="system", length=Dist(value=800)),
                PrefixPool(
                    name="tools",
                    count=6,
                    zipf=1.1,
                    length=Dist(dist="normal", mean=1500, std=400, min=600, max=4000),
                ),
            ),
            session=SessionSpec(
                turns=Dist(dist="uniform", low=1, high=5),
                think_time_s=_ln(4, 0.6, 0.5, 60),
                context=_ln(200, 0.8, 16, 4000),
                first_suffix=Dist(value=0),
            ),
            suffix=_ln(800, 0.9, 10, 8000),
            output=_ln(90, 0.6, 8, 1024),
            rate=4.0,
            duration_s=600.0,
            max_prompt_tokens=32_768,
        ),
        WorkloadSpec(
            name="qa",
            description="Open Q&A: unique user queries behind a short chat-template preamble.",
            prefixes=(PrefixPool(name="preamble", length=Dist(value=12)),),
            suffix=_ln(250, 0.8, 8, 8000),
            output=_ln(250, 0.7, 8, 2048),
            rate=4.0,
            duration_s=600.0,
        ),
        WorkloadSpec(
            name="gsp",
            description="SGLang bench_serving generated-shared-prefix defaults: 64 groups of a "
            "2048-token system prompt, 128-token questions, 256-token outputs.",
            prefixes=(PrefixPool(name="system", count=64, length=Dist(value=2048)),),
            suffix=Dist(value=128),
            output=Dist(value=256),
            rate=4.0,
            duration_s=600.0,
        ),
    )
}


def preset(name: str) -> WorkloadSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)}") from None


# ------------------------------------------------------------------------------------------------
# Workload files


def _format_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith("function-")) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] != "value_error" and isinstance(got, str | int | float | bool):
            msg += f" (got {got!r})"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_workload(data: Any, *, source: str = "workload") -> WorkloadSpec:
    """A WorkloadSpec from parsed YAML/JSON data, with errors that name the field."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as err:
        raise WorkloadError(f"{source}: {_format_errors(err)}") from None


def load_workload(path: str | Path) -> WorkloadSpec:
    """Read a workload file (YAML, or JSON, which YAML also reads)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise WorkloadError(f"workload file {p}: cannot read it ({err.strerror})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise WorkloadError(f"workload file {p}: not valid YAML/JSON: {err}") from None
    return parse_workload(data, source=f"workload file {p}")


def resolve_workload(name_or_path: str | WorkloadSpec) -> WorkloadSpec:
    """A preset name, a workload file path, or a spec."""
    if isinstance(name_or_path, WorkloadSpec):
        return name_or_path
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if Path(name_or_path).suffix in {".yaml", ".yml", ".json"} or Path(name_or_path).exists():
        return load_workload(name_or_path)
    raise WorkloadError(f"unknown workload {name_or_path!r}; presets: {', '.join(PRESETS)} (or a file path)")


def dump_workload(spec: WorkloadSpec) -> str:
    """YAML text that ``load_workload`` reads back to the same spec."""
    data = _tidy(spec.model_dump(mode="json", exclude_defaults=True))
    return yaml.safe_dump(data, sort_keys=False, width=100)


def _tidy(data: Any) -> Any:
    """Readable YAML: a fixed distribution as a bare number, whole floats as integers."""
    if isinstance(data, dict):
        if set(data) == {"value"}:
            return _tidy(data["value"])
        return {k: _tidy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_tidy(v) for v in data]
    if isinstance(data, float) and data.is_integer():
        return int(data)
    return data


# ------------------------------------------------------------------------------------------------
# Generation


def generate(
    workload: str | WorkloadSpec,
    *,
    rate: float | None = None,
    duration_s: float | None = None,
    seed: int = 0,
) -> list[Request]:
    """Requests of ``workload`` arriving at mean ``rate`` requests/s during ``[0, duration_s)``.

    ``rate``/``duration_s`` default to the spec's. Deterministic given the seed; req_ids are 0..N-1
    in arrival order.
    """
    spec = resolve_workload(workload)
    rate = spec.rate if rate is None else rate
    duration_s = spec.duration_s if duration_s is None else duration_s
    if rate is None or not rate > 0:
        raise WorkloadError(f"rate must be > 0 requests/s (workload {spec.name!r} sets none); got {rate}")
    if duration_s is None or not duration_s > 0:
        raise WorkloadError(f"duration_s must be > 0 (workload {spec.name!r} sets none); got {duration_s}")
    if seed < 0:
        raise WorkloadError(f"seed must be >= 0; got {seed}")

    session_rate = rate / spec.mean_turns
    starts = spec.arrival.to_arrivals().times(session_rate, duration_s, np.random.default_rng([seed, 0]))
    n = len(starts)
    sess = spec.session
    multi_turn = spec.mean_turns > 1 or sess.turns.dist != "fixed"

    # One random stream per quantity, drawn in session order: session i's content depends on the
    # seed and i only (a longer duration appends sessions and changes none of the earlier ones).
    def stream(k: int) -> np.random.Generator:
        return np.random.default_rng([seed, 1, k])

    choices: list[list[int]] = []
    pools = [(p, p.item_lengths(spec.name)) for p in spec.prefixes]
    for k, (pool, _) in enumerate(pools):
        if pool.count == 1:
            choices.append([0] * n)
        else:
            cdf = np.cumsum(pool.probabilities())
            cdf[-1] = 1.0 + 1e-12  # a draw in [0, 1) always lands on an item
            picks = np.searchsorted(cdf, stream(10 + k).random(n), side="right")
            choices.append([int(i) for i in picks])
    turns = [max(1, t) for t in sess.turns.ints(stream(0), n)]
    contexts = sess.context.ints(stream(1), n)
    total = sum(turns)
    suffixes = spec.suffix.ints(stream(2), total)
    firsts = sess.first_suffix.ints(stream(3), n) if sess.first_suffix is not None else None
    outputs = [max(1, o) for o in spec.output.ints(stream(4), total)]
    thinks = sess.think_time_s.sample(stream(5), total, integer=False)

    shared_cache: dict[tuple[int, ...], list[Segment]] = {}
    drafts: list[tuple[float, int, int, TokenSeq, int, int]] = []
    offset = 0
    for i, start in enumerate(starts):
        items = tuple(c[i] for c in choices)
        shared = shared_cache.get(items)
        if shared is None:
            shared = _shared_segments(spec.name, pools, items)
            shared_cache[items] = shared
        sl = slice(offset, offset + turns[i])
        offset += turns[i]
        turn_suffixes = suffixes[sl]
        if firsts is not None:
            turn_suffixes[0] = firsts[i]
        drafts.extend(
            _session(
                spec, shared, contexts[i], turn_suffixes, outputs[sl], thinks[sl], seed, i, start, duration_s
            )
        )
    drafts.sort(key=lambda d: (d[0], d[1], d[2]))
    out: list[Request] = []
    for req_id, (t, s_idx, turn, seq, prompt_len, output_len) in enumerate(drafts):
        if multi_turn:
            kind = f"{spec.name}/new-session" if turn == 0 else f"{spec.name}/follow-up"
        else:
            kind = spec.name
        out.append(
            Request(
                req_id=req_id,
                arrival_s=t,
                seq=seq,
                prompt_len=prompt_len,
                output_len=output_len,
                session=s_idx if multi_turn else None,
                kind=kind,
            )
        )
    return out


def _shared_segments(
    workload: str, pools: Sequence[tuple[PrefixPool, list[int]]], items: tuple[int, ...]
) -> list[Segment]:
    """The shared prefix for one choice of item per pool. Keys chain through the chosen items, so
    the same tools after a different system prompt are a different prefix, as in a real cache."""
    out: list[Segment] = []
    key = ROOT_KEY
    for (pool, lengths), item in zip(pools, items, strict=True):
        key = chain_key(key, "prefix", workload, pool.name, item)
        if lengths[item] > 0:
            out.append(Segment(key, lengths[item]))
    return out


def _session(
    spec: WorkloadSpec,
    shared: list[Segment],
    ctx_len: int,
    suffixes: list[int],
    outputs: list[int],
    thinks: list[float],
    seed: int,
    s_idx: int,
    start: float,
    duration_s: float,
) -> list[tuple[float, int, int, TokenSeq, int, int]]:
    """One session's turns: (arrival, session, turn, seq, prompt_len, output_len)."""
    history_on = spec.session.history
    base = list(shared)
    key = shared[-1].key if shared else ROOT_KEY
    if ctx_len > 0:
        key = chain_key(key, "context", seed, s_idx)
        base.append(Segment(key, ctx_len))
    base_len = sum(s.length for s in base)
    history: list[Segment] = []
    history_len = 0
    t = start
    out: list[tuple[float, int, int, TokenSeq, int, int]] = []
    for turn in range(len(suffixes)):
        if turn > 0:
            t += thinks[turn]
        if t >= duration_s:
            break
        prompt = base + history
        prompt_len = base_len + history_len
        tail_key = prompt[-1].key if prompt else ROOT_KEY
        suffix_len = suffixes[turn]
        if suffix_len > 0 or not prompt:
            tail_key = chain_key(tail_key, "suffix", seed, s_idx, turn)
            prompt.append(Segment(tail_key, max(1, suffix_len)))
            prompt_len += max(1, suffix_len)
        if turn > 0 and prompt_len > spec.max_prompt_tokens:
            break  # the conversation outgrew the context window: the user starts a new one
        out_seg = Segment(chain_key(tail_key, "output", seed, s_idx, turn), outputs[turn])
        out.append((t, s_idx, turn, TokenSeq((*prompt, out_seg)), prompt_len, outputs[turn]))
        if history_on:
            history = [*prompt[len(base) :], out_seg]
            history_len = prompt_len - base_len + outputs[turn]
    return out


# ------------------------------------------------------------------------------------------------
# Trace replay (Mooncake format; the loader is prefixtune.twin.trace)

HOT_FRACTION = 0.01  # an id in more than this share of records is a shared prefix, not a session


def trace_sessions(records: Sequence[TraceRecord], hot_fraction: float = HOT_FRACTION) -> list[int]:
    """A session key per record. The trace has no session id; a session is named by the first hash id
    of its chain that at most ``hot_fraction`` of all records reference (the hot ids before it are
    shared system prompts: id 0 of the conversation trace is in every record). Turns of one
    conversation share their early blocks, so they get the same key. A record made only of hot ids
    is its own session (key ``-line``)."""
    counts: dict[int, int] = {}
    for rec in records:
        for h in rec.hash_ids:
            counts[h] = counts.get(h, 0) + 1
    limit = hot_fraction * len(records)
    out: list[int] = []
    for rec in records:
        key = next((h for h in rec.hash_ids if counts[h] <= limit), -rec.line)
        out.append(key)
    return out


def _bucket_ms(records: Sequence[TraceRecord]) -> float:
    """The width of the timestamp buckets when the trace is quantized, else 0.

    Quantized means most records share their timestamp with others (fewer distinct values than half
    the records); the bucket is then the median gap between consecutive distinct timestamps (the
    conversation trace: 3,000 ms, with a few 2,999/3,001 ms steps).
    """
    distinct = sorted({rec.timestamp_ms for rec in records})
    if len(distinct) < 2 or len(distinct) >= len(records) / 2:
        return 0.0
    gaps = np.diff(np.asarray(distinct, dtype=float))
    return float(np.median(gaps))


@functools.lru_cache(maxsize=4)
def _parsed_trace(
    path: str, mtime_ns: int, size: int
) -> tuple[tuple[TraceRecord, ...], tuple[TokenSeq, ...], tuple[int, ...]]:
    """Records, prompt identities and session keys of a trace file, cached per file version
    (hashing ~200k block ids takes seconds; sweeps replay the same trace many times)."""
    try:
        records = load_trace(path)
    except TraceError as err:
        raise WorkloadError(str(err)) from None
    keys = TraceKeys(Path(path).name)
    prompts = tuple(keys.prompt(rec) for rec in records)
    return tuple(records), prompts, tuple(trace_sessions(records))


def from_trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    session_sample: float = 1.0,
    seed: int = 0,
    limit: int | None = None,
    jitter: bool = True,
) -> list[Request]:
    """Requests replaying a Mooncake trace.

    ``time_scale`` multiplies the arrival rate (arrival = timestamp / time_scale: 2.0 replays twice
    as fast). ``session_sample`` keeps that fraction of sessions (``trace_sessions``), chosen by a
    seeded hash of the session key, so whole conversations stay together. ``jitter``: when the
    timestamps are quantized (the conversation trace: 3 s buckets), each arrival is spread uniformly
    inside its bucket (seeded), keeping each session's turns in file order; otherwise the order
    inside a bucket would decide LRU recency. ``limit`` caps the number of requests (the first in
    arrival order). Deterministic given the seed.
    """
    if not time_scale > 0:
        raise WorkloadError(f"time_scale must be > 0 (a rate multiplier); got {time_scale}")
    if not 0 < session_sample <= 1:
        raise WorkloadError(f"session_sample must be in (0, 1]; got {session_sample}")
    if limit is not None and limit < 1:
        raise WorkloadError(f"limit must be >= 1; got {limit}")
    p = Path(path)
    try:
        stat = p.stat()
    except OSError as err:
        raise WorkloadError(f"cannot read trace {p}: {err.strerror or err}") from None
    records, prompts, sessions = _parsed_trace(str(p.resolve()), stat.st_mtime_ns, stat.st_size)
    bucket_ms = _bucket_ms(records) if jitter else 0.0
    rng = np.random.default_rng([seed, 2])
    offsets = rng.random(len(records)) * bucket_ms if bucket_ms > 0 else np.zeros(len(records))
    threshold = int(session_sample * (1 << 63))

    last_in_session: dict[int, float] = {}
    drafts: list[tuple[float, int, Request]] = []
    order = sorted(range(len(records)), key=lambda i: records[i].timestamp_ms)  # stable: file order
    for i in order:
        rec, sess = records[i], sessions[i]
        if session_sample < 1 and chain_key(seed, "session-sample", sess) >= threshold:
            continue
        t_ms = rec.timestamp_ms + float(offsets[i])
        prev = last_in_session.get(sess)
        if prev is not None and t_ms <= prev:
            t_ms = prev + 1e-3  # a later turn never overtakes an earlier one
        last_in_session[sess] = t_ms
        prompt = prompts[i]
        out_seg = Segment(chain_key(prompt.segments[-1].key, "output", p.name, rec.line), rec.output_length)
        req = Request(
            req_id=0,
            arrival_s=t_ms / 1000.0 / time_scale,
            seq=prompt.extend(out_seg),
            prompt_len=rec.input_length,
            output_len=rec.output_length,
            session=sess,
            kind="trace",
        )
        drafts.append((req.arrival_s, rec.line, req))
    drafts.sort(key=lambda d: (d[0], d[1]))
    if limit is not None:
        drafts = drafts[:limit]
    return [replace(req, req_id=n) for n, (_, _, req) in enumerate(drafts)]
