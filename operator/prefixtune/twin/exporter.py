"""The engines' own Prometheus metrics, maintained from a twin engine's events.

``EngineExporter`` is an ``EngineObserver``: the twin calls it as requests are admitted, produce
tokens, finish or get preempted, and it keeps each engine's REAL series in its own
``CollectorRegistry`` (names, types, label sets and bucket boundaries as the engines export them;
see reference/engines.md section 2). Gauges (running, waiting, KV usage, pool) are read from the
engine's ``Gauges`` snapshot at scrape time (``render()``).

Buckets: vLLM's from ``vllm/v1/metrics/loggers.py`` (TTFT, ITL/TPOT, request latency, iteration
tokens, 1-2-5 token buckets up to max_model_len); SGLang's from ``srt/metrics/collector.py``
(TTFT, ITL, e2e; queue time and per-request TPOT reuse the e2e and ITL lists: assumed);
TensorRT-LLM's from ``tensorrt_llm/metrics/collector.py`` (TTFT, TPOT, e2e, queue, prefill, decode,
inference).

Counting rules follow the engines:
- vLLM counts prefix-cache queries/hits in tokens once per request at admission; re-admissions after
  a preemption go to counters vLLM does not export. Prompt tokens (total, cached, by source) are
  counted when the prefill ends (first token).
- SGLang counts ``prefill_effective_tokens_total`` per prefill (re-prefills after a retraction count
  again), ``cached_tokens_total`` and the token totals per finished request.
- TensorRT-LLM counts reused/missed blocks per context phase (iteration stats) and prompt, cached
  and generated tokens per finished request.

Each engine's series are a table (``SERIES`` in ``twin/models/<engine>.py``): ``Series`` rows that
``TableMetrics`` turns into prometheus_client objects, moved by the events each row names.

A GPU-utilization gauge is not an engine metric: ``DcgmExporter`` is a separate observer that
serves ``DCGM_FI_DEV_GPU_UTIL`` as NVIDIA's DCGM exporter would.
"""

from __future__ import annotations

import enum
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Generic, NamedTuple, TypeAlias, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from prefixtune.engines.base import ParsedCommand
from prefixtune.engines.sglang import SGLANG_ITL_BUCKETS, SGLANG_TTFT_BUCKETS
from prefixtune.twin.cache.base import CacheStats, Match
from prefixtune.twin.models.base import twin_model
from prefixtune.twin.observer import Gauges, NullObserver
from prefixtune.twin.prompt import ROOT_KEY, chain_key
from prefixtune.twin.request import Request

CONTENT_TYPE = CONTENT_TYPE_LATEST

# --- bucket lists, per engine ---------------------------------------------------------------------
VLLM_TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_ITL = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
VLLM_LATENCY = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SGLANG_TTFT = SGLANG_TTFT_BUCKETS  # SGLang's own defaults (the adapter's fact)
SGLANG_E2E = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)  # fmt: skip
SGLANG_ITL = SGLANG_ITL_BUCKETS  # SGLang's own defaults (the adapter's fact)
TRT_PREFILL = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
    640.0, 2560.0,
)  # fmt: skip

DEFAULT_MAX_MODEL_LEN = 131_072  # Llama 3.1/3.3 context length, when the command sets none


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exponent += 1


def observe_many(hist: Histogram, value: float, count: int) -> None:
    """``count`` observations of ``value`` at once (decode runs arrive in bulk).

    Uses the child's bucket counters directly, as SGLang's own exporter does; falls back to a loop
    if prometheus_client's internals differ.
    """
    if count <= 0:
        return
    bounds = getattr(hist, "_upper_bounds", None)
    buckets = getattr(hist, "_buckets", None)
    total = getattr(hist, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for _ in range(count):
            hist.observe(value)
        return
    buckets[bisect_left(bounds, value)].inc(count)
    total.inc(value * count)


class TimeWindow:
    """Sums of (time, value) events over the last ``span_s`` of simulated time."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.events: deque[tuple[float, float]] = deque()
        self.total = 0.0

    def add(self, t: float, value: float) -> None:
        self.events.append((t, value))
        self.total += value

    def sum(self, now: float) -> float:
        while self.events and self.events[0][0] < now - self.span_s:
            self.total -= self.events.popleft()[1]
        return max(0.0, self.total)


class EngineMetrics:
    """One engine's series: what the exporter calls with the twin's events. The built-in engines
    declare theirs as a table (``TableMetrics`` below); a subclass may also build them by hand."""

    def __init__(self, exporter: EngineExporter) -> None:
        self.x = exporter
        self.registry = exporter.registry

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        """Scrape time: config-info series and counters that mirror the cache's own totals."""

    # events (defaults: nothing)
    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None: ...
    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None: ...
    def on_tokens(self, gap_s: float, count: int, now: float) -> None: ...
    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None: ...
    def on_preempted(self, req: Request, now: float) -> None: ...
    def on_step(self, now: float, duration_s: float, steps: int, prefill: int, decode: int) -> None: ...


def inc_to(counter: Counter, total: float) -> None:
    """Raise a counter child to ``total`` (it mirrors a cumulative count kept by the cache model)."""
    current = counter._value.get()  # the child's value, as prometheus_client keeps it
    if total > current:
        counter.inc(total - current)


def tpot(decode_s: float, output_len: int) -> float:
    return decode_s / (output_len - 1) if output_len > 1 else 0.0


def rendered_buckets(value: object, default: Sequence[float]) -> tuple[float, ...]:
    """A histogram's bounds as the command rendered them (a parsed option), else ``default``."""
    if isinstance(value, tuple) and value and all(isinstance(b, int | float) for b in value):
        return tuple(float(b) for b in value)
    return tuple(float(b) for b in default)


# --- metric tables: each engine's series as data, one builder -------------------------------------
class SeriesKind(enum.Enum):
    """The prometheus_client type of a series."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


MODEL_NAME = "\x00model"  # a label value the builder replaces with the exporter's model name
# A histogram's bounds, or a function of the exporter for bounds that depend on the command.
Buckets: TypeAlias = "Sequence[float] | Callable[[EngineExporter], Sequence[float]]"


class Admitted(NamedTuple):
    """Event: a request was admitted (``first``: not a re-admission after a preemption)."""

    m: TableMetrics
    req: Request
    match: Match
    now: float
    first: bool


class FirstToken(NamedTuple):
    """Event: a request's prefill ended with its first token."""

    m: TableMetrics
    req: Request
    ttft_s: float
    now: float


class Tokens(NamedTuple):
    """Event: ``n`` decode tokens, ``gap_s`` apart."""

    m: TableMetrics
    gap_s: float
    n: int  # (``count`` is a tuple method)
    now: float


class Finished(NamedTuple):
    """Event: a request finished (``cached``: its prefix-cache hit tokens at first admission)."""

    m: TableMetrics
    req: Request
    cached: int
    e2e_s: float
    queue_s: float
    prefill_s: float
    decode_s: float


class Preempted(NamedTuple):
    """Event: a request was preempted (SGLang: retracted)."""

    m: TableMetrics
    req: Request
    now: float


class Steps(NamedTuple):
    """Event: a run of ``steps`` engine steps ending at ``now``."""

    m: TableMetrics
    now: float
    duration_s: float
    steps: int
    prefill: int
    decode: int


class Scrape(NamedTuple):
    """Scrape time: the engine's snapshot and the cache model's totals."""

    m: TableMetrics
    gauges: Gauges
    stats: CacheStats | None


E = TypeVar("E")  # one of the event types above


@dataclass(frozen=True)
class Move(Generic[E]):
    """How event ``on`` moves a series: a counter ``inc``s by ``amount``, a histogram observes it
    (``times`` observations at once when given); only when ``when`` holds (if given)."""

    on: type[E]
    amount: Callable[[E], float]
    times: Callable[[E], int] | None = None
    when: Callable[[E], bool] | None = None


@dataclass(frozen=True)
class Child:
    """One label value of a series' ``by`` label: a gauge's scrape-time ``source`` or the moves."""

    value: str
    source: str | Callable[[TableMetrics], float] | None = None
    moves: tuple[Move[Any], ...] = ()


@dataclass(frozen=True)
class Series:
    """One row of an engine's metric table.

    ``labels`` are the series' fixed labels (``MODEL_NAME`` for the model name). A gauge reads
    ``source`` at scrape time (a ``Gauges`` field name or a function of the metrics); counters and
    histograms follow ``moves``. With ``by``, the series has one child per ``children`` entry under
    that extra label (each with its own source or moves), else one child. ``buckets``: a
    histogram's bounds, or a function of the exporter for bounds that depend on the command.
    ``mirror``: a counter raised at scrape time to a total the cache model keeps (None: leave it).
    ``info``: a gauge whose only child is the config, re-labelled (label name, value) and set to 1
    at each scrape.
    """

    name: str
    kind: SeriesKind
    doc: str
    labels: Mapping[str, str] = field(default_factory=dict)
    source: str | Callable[[TableMetrics], float] | None = None
    moves: tuple[Move[Any], ...] = ()
    by: str = ""
    children: tuple[Child, ...] = ()
    buckets: Buckets = ()
    mirror: Callable[[Scrape], float | None] | None = None
    info: tuple[tuple[str, Callable[[Scrape], str]], ...] = ()


def gauge(
    name: str,
    doc: str,
    labels: Mapping[str, str],
    source: str | Callable[[TableMetrics], float] | None = None,
    *,
    by: str = "",
    children: tuple[Child, ...] = (),
) -> Series:
    """A gauge row: read from ``source`` at scrape time (or per child of ``by``)."""
    return Series(name, SeriesKind.GAUGE, doc, labels, source, by=by, children=children)


def counter(
    name: str,
    doc: str,
    labels: Mapping[str, str],
    *moves: Move[Any],
    by: str = "",
    children: tuple[Child, ...] = (),
    mirror: Callable[[Scrape], float | None] | None = None,
) -> Series:
    """A counter row: moved by ``moves`` (or per child of ``by``), or mirroring a total."""
    return Series(name, SeriesKind.COUNTER, doc, labels, moves=moves, by=by, children=children, mirror=mirror)


def at_finish(amount: Callable[[Finished], float]) -> Move[Finished]:
    """A move by ``amount`` when a request finishes (the event most of the engines' series count)."""
    return Move(Finished, amount)


def histogram(name: str, doc: str, labels: Mapping[str, str], buckets: Buckets, *moves: Move[Any]) -> Series:
    """A histogram row: observes what ``moves`` say."""
    return Series(name, SeriesKind.HISTOGRAM, doc, labels, moves=moves, buckets=buckets)


def info(
    name: str, doc: str, labels: Mapping[str, str], *config: tuple[str, Callable[[Scrape], str]]
) -> Series:
    """A config-info gauge row: one child labelled (name, value) from ``config``, set to 1."""
    return Series(name, SeriesKind.GAUGE, doc, labels, info=config)


class MetricState:
    """An engine's per-exporter metric state (the hook for what a table row cannot say): sees each
    event after the table's moves. The default keeps nothing."""

    def update(self, event: object) -> None:
        return None


class TableMetrics(EngineMetrics):
    """The generic builder: an engine's ``table`` (its ``Series`` rows, in exposition order) turned
    into prometheus_client objects, with each event dispatched to the moves that name it. ``state``
    is the engine's own per-exporter state (derived gauges, per-request sums): built from the
    metrics, it sees every event after the series moved (``update``)."""

    table: ClassVar[tuple[Series, ...]]
    state_type: ClassVar[type[MetricState]] = MetricState

    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        self.state: Any = self.state_type()
        self._moves: dict[type, list[Callable[[Any], None]]] = {}
        self._scrape: list[Callable[[Scrape], None]] = []
        for row in self.table:
            self._build(row)

    def _build(self, row: Series) -> None:
        x = self.x
        fixed = {k: x.model if v == MODEL_NAME else v for k, v in row.labels.items()}
        names = [*fixed, *(name for name, _ in row.info), *([row.by] if row.by else [])]
        if row.kind is SeriesKind.GAUGE:
            metric: Gauge | Counter | Histogram = Gauge(row.name, row.doc, names, registry=self.registry)
        elif row.kind is SeriesKind.COUNTER:
            metric = Counter(row.name, row.doc, names, registry=self.registry)
        else:
            buckets = row.buckets(x) if callable(row.buckets) else row.buckets
            if not buckets:
                raise ValueError(f"{row.name}: a histogram needs buckets")
            metric = Histogram(row.name, row.doc, names, buckets=buckets, registry=self.registry)
        if row.info:
            if not isinstance(metric, Gauge):
                raise ValueError(f"{row.name}: only a gauge carries config info")
            self._scrape.append(partial(_relabel, metric, fixed, row.info))
            return
        for c in row.children if row.by else (Child("", row.source, row.moves),):
            child = metric.labels(**fixed, **({row.by: c.value} if row.by else {})) if names else metric
            if c.source is not None:
                if not isinstance(child, Gauge):
                    raise ValueError(f"{row.name}: only a gauge has a scrape-time source")
                source = c.source
                child.set_function(
                    x.gauge_value(source) if isinstance(source, str) else partial(source, self)
                )
            for move in c.moves:
                self._moves.setdefault(move.on, []).append(_mover(row.name, child, move))
            if row.mirror is not None:
                if not isinstance(child, Counter):
                    raise ValueError(f"{row.name}: only a counter mirrors a total")
                self._scrape.append(partial(_raise_to, child, row.mirror))

    def _fire(self, event: Any) -> None:
        for move in self._moves.get(type(event), ()):
            move(event)
        self.state.update(event)

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        scrape = Scrape(self, gauges, stats)
        for step in self._scrape:
            step(scrape)

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        self._fire(Admitted(self, req, match, now, first))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self._fire(FirstToken(self, req, ttft_s, now))

    def on_tokens(self, gap_s: float, count: int, now: float) -> None:
        self._fire(Tokens(self, gap_s, count, now))

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        self._fire(Finished(self, req, cached, e2e_s, queue_s, prefill_s, decode_s))

    def on_preempted(self, req: Request, now: float) -> None:
        self._fire(Preempted(self, req, now))

    def on_step(self, now: float, duration_s: float, steps: int, prefill: int, decode: int) -> None:
        self._fire(Steps(self, now, duration_s, steps, prefill, decode))


def _mover(name: str, child: object, move: Move[Any]) -> Callable[[Any], None]:
    """The update one move makes to one child (closures specialized per case: this is on the twin's
    event path)."""
    amount, times, when = move.amount, move.times, move.when
    if isinstance(child, Counter):
        if times is not None:
            raise ValueError(f"{name}: a counter moves once per event")
        inc = child.inc
        if when is None:
            return lambda e: inc(amount(e))
        return lambda e: inc(amount(e)) if when(e) else None
    if not isinstance(child, Histogram):
        raise ValueError(f"{name}: a gauge is read at scrape time, not moved by events")
    hist = child
    if times is None:
        observe = hist.observe
        if when is None:
            return lambda e: observe(amount(e))
        return lambda e: observe(amount(e)) if when(e) else None
    n = times
    if when is None:
        return lambda e: observe_many(hist, amount(e), n(e))
    return lambda e: observe_many(hist, amount(e), n(e)) if when(e) else None


def config_label(field: str, default: float | bool) -> Callable[[Scrape], str]:
    """An info label from the command's effective config (``default`` without one): its ``field``
    as the type of ``default``, as a string."""

    def value(s: Scrape) -> str:
        cfg = s.m.x.parsed.config if s.m.x.parsed is not None else None
        return str(type(default)(getattr(cfg, field)) if cfg else default)

    return value


def _raise_to(counter: Counter, total: Callable[[Scrape], float | None], scrape: Scrape) -> None:
    value = total(scrape)
    if value is not None:
        inc_to(counter, value)


def _relabel(
    gauge: Gauge,
    fixed: Mapping[str, str],
    info: tuple[tuple[str, Callable[[Scrape], str]], ...],
    scrape: Scrape,
) -> None:
    gauge.clear()
    gauge.labels(**fixed, **{name: value(scrape) for name, value in info}).set(1)


def _families_of(engine: str, version: str | None) -> frozenset[str] | None:
    """The metric families an older engine release exports (``EngineAdapter.metrics_for``), or None
    for the release the adapter describes (the twin then serves every series it models)."""
    from prefixtune.engines import get_adapter

    adapter = get_adapter(engine)
    if version is None or version == adapter.version_of(adapter.default_image):
        return None
    names = adapter.metrics_for(version)
    found = [getattr(names, f) for f in names.__dataclass_fields__ if isinstance(getattr(names, f), str)]
    found += [v for k, v in names.extra.items() if ":" in v or v.startswith(str(engine))]
    return frozenset({"process_start_time_seconds", *(n.removesuffix("_total") for n in found if n)})


_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _family(name: str, families: frozenset[str]) -> str:
    if name in families:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return name


def _only(text: bytes, families: frozenset[str]) -> bytes:
    """The exposition with only the samples (and HELP/TYPE lines) of ``families``."""
    kept = []
    for line in text.decode().splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            name = parts[2] if len(parts) > 2 else ""
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
        if _family(name, families) in families:
            kept.append(line)
    return ("\n".join(kept) + "\n").encode()


_EMPTY = Gauges(
    now=0.0,
    running=0,
    waiting=0,
    kv_usage=0.0,
    pool_blocks=0,
    pool_tokens=0,
    block_size=0,
    free_blocks=0,
    status="ok",
)


class EngineExporter:
    """An ``EngineObserver`` keeping one engine's Prometheus series (see the module doc).

    ``gauges`` returns the engine's current snapshot; ``render()`` refreshes the scrape-time gauges
    from it and returns the text exposition. ``parsed`` gives the effective config for the
    config-info series.
    """

    def __init__(
        self,
        engine: str,
        model: str,
        *,
        parsed: ParsedCommand | None = None,
        gauges: Callable[[], Gauges] | None = None,
        cache_stats: Callable[[], CacheStats] | None = None,
        kv_bytes_per_token: int = 0,
        max_model_len: int | None = None,
        start_time: float | None = None,
        version: str | None = None,
    ) -> None:
        from prefixtune.engines import get_adapter

        twin = twin_model(engine)  # ValueError naming the known engines
        self.engine = get_adapter(twin.name).name
        self.model = model
        self.parsed = parsed
        self.families = _families_of(self.engine, version)
        self._gauges = gauges
        self._cache_stats = cache_stats
        self.kv_bytes_per_token = kv_bytes_per_token
        self.snapshot = _EMPTY
        mml = (
            max_model_len
            if max_model_len is not None
            else self.option("max_model_len", DEFAULT_MAX_MODEL_LEN)
        )
        self.max_model_len = int(mml)  # type: ignore[call-overload]
        self.registry = CollectorRegistry(auto_describe=True)
        Gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            registry=self.registry,
        ).set(time.time() if start_time is None else start_time)
        self.first_admitted: set[int] = set()
        self.cached_of: dict[int, int] = {}
        self.host_cached: dict[int, int] = {}
        self.preemptions_of: dict[int, int] = {}
        self.waiting_preempted: set[int] = set()
        self.metrics = twin.metrics(self)

    # --- helpers ---------------------------------------------------------------------------------
    def option(self, key: str, default: object) -> object:
        if self.parsed is None:
            return default
        return self.parsed.options.get(key, default)

    @property
    def paused(self) -> int:
        return len(self.waiting_preempted)

    def gauge_value(self, field: str) -> Callable[[], float]:
        """A scrape-time reader of one quantity of the current snapshot."""

        def read() -> float:
            s = self.snapshot
            if field == "used_tokens":
                return float((s.pool_blocks - s.free_blocks) * s.block_size)
            if field == "used_blocks":
                return float(s.pool_blocks - s.free_blocks)
            return float(getattr(s, field))

        return read

    def bind(
        self,
        gauges: Callable[[], Gauges],
        cache_stats: Callable[[], CacheStats] | None = None,
        kv_bytes_per_token: int | None = None,
    ) -> None:
        self._gauges = gauges
        if cache_stats is not None:
            self._cache_stats = cache_stats
        if kv_bytes_per_token is not None:
            self.kv_bytes_per_token = kv_bytes_per_token

    def refresh(self) -> None:
        if self._gauges is not None:
            self.snapshot = self._gauges()
        stats = self._cache_stats() if self._cache_stats is not None else None
        self.metrics.refresh(self.snapshot, stats)

    def render(self) -> bytes:
        """The text exposition (Prometheus format 0.0.4) as of the engine's current state."""
        self.refresh()
        text = generate_latest(self.registry)
        return text if self.families is None else _only(text, self.families)

    # --- EngineObserver --------------------------------------------------------------------------
    def admitted(self, req: Request, match: Match, now: float) -> None:
        first = req.req_id not in self.first_admitted
        if first:
            self.first_admitted.add(req.req_id)
            self.cached_of[req.req_id] = match.hit_tokens
            self.host_cached[req.req_id] = match.host_tokens
        self.waiting_preempted.discard(req.req_id)
        self.metrics.on_admitted(req, match, now, first)

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.metrics.on_first_token(req, ttft_s, now)

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        self.metrics.on_tokens(gap_s, count, now)

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        cached = self.cached_of.pop(req.req_id, 0)
        self.metrics.on_finished(req, cached, e2e_s, queue_s, prefill_s, decode_s)
        self.first_admitted.discard(req.req_id)
        self.preemptions_of.pop(req.req_id, None)
        self.host_cached.pop(req.req_id, None)

    def preempted(self, req: Request, now: float) -> None:
        self.preemptions_of[req.req_id] = self.preemptions_of.get(req.req_id, 0) + 1
        self.waiting_preempted.add(req.req_id)
        self.metrics.on_preempted(req, now)

    def step(
        self, now: float, duration_s: float, steps: int, prefill_tokens: int, decode_tokens: int
    ) -> None:
        self.metrics.on_step(now, duration_s, steps, prefill_tokens, decode_tokens)

    def oom(self, now: float, reason: str) -> None:
        return None


# --- DCGM ---------------------------------------------------------------------------------------

GPU_MODEL_NAMES = {
    "H100-80GB": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
}


class DcgmExporter(NullObserver):
    """``DCGM_FI_DEV_GPU_UTIL`` (percent of the last ``window_s`` simulated seconds the GPU ran
    kernels), with the DCGM exporter's label set (gpu, UUID, pci_bus_id, device, modelName, Hostname;
    pod/namespace/container when the Kubernetes mapping is on). An observer too: it only uses
    ``step`` reports. ``twin serve`` sets the window to one wall second of simulated time (the
    driver's sampling period as a wall-clock scraper sees it), at least 1 s."""

    def __init__(
        self,
        *,
        gpu_model: str = "H100-80GB",
        gpus: int = 1,
        hostname: str = "twin-node",
        pod: str = "",
        namespace: str = "",
        container: str = "",
        uuid_seed: str = "twin",
        window_s: float = 1.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.window_s = window_s
        self.clock = clock
        self.busy: deque[tuple[float, float]] = deque()  # (start, end) of busy intervals, sim time
        labels = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
        k8s = {"pod": pod, "namespace": namespace, "container": container} if pod else {}
        util = Gauge(
            "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", [*labels, *k8s], registry=self.registry
        )
        for i in range(gpus):
            h = f"{chain_key(ROOT_KEY, 'gpu-uuid', uuid_seed, i):016x}"
            uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-0000-{i:012x}"
            util.labels(
                gpu=str(i),
                UUID=uuid,
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                device=f"nvidia{i}",
                modelName=GPU_MODEL_NAMES.get(gpu_model, gpu_model),
                Hostname=hostname,
                **k8s,
            ).set_function(self.utilization)
        self.now = 0.0

    def utilization(self) -> float:
        now = self.clock() if self.clock is not None else self.now
        lo = now - self.window_s
        while self.busy and self.busy[0][1] <= lo:
            self.busy.popleft()
        busy = sum(min(e, now) - max(s, lo) for s, e in self.busy if min(e, now) > max(s, lo))
        return round(100.0 * min(1.0, busy / self.window_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # EngineObserver: only step matters (the other hooks are NullObserver's no-ops)
    def step(
        self, now: float, duration_s: float, steps: int, prefill_tokens: int, decode_tokens: int
    ) -> None:
        self.now = max(self.now, now)
        if duration_s > 0:
            self.busy.append((now - duration_s, now))
        while self.busy and self.busy[0][1] <= self.now - self.window_s:
            self.busy.popleft()  # keep only the window, scraped or not
