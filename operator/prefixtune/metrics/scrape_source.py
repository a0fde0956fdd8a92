"""Signals from direct scrapes of the pods' metrics endpoints (no Prometheus needed).

Core (pure): ``window_signals`` turns chains of snapshots (per target: the scrape at the start of the
window, optional intermediate scrapes, the scrape at the end) into ``Signals``:

- Counters and histogram buckets by deltas, chained through the intermediate scrapes exactly like
  Prometheus' ``increase()`` without its extrapolation: when a target restarted between two scrapes
  (a cumulative series decreased, or the process start time / ``_created`` changed) the post-restart
  value counts as the increase since the restart. What happened between the last scrape before the
  restart and the restart itself is lost (as in Prometheus); the target is flagged in ``Window.resets``.
- Rates divide by the time between the first and last scrape actually used.
- Gauges: mean and max over every series and every scrape (start, intermediates, end).
- Quantiles from merged bucket deltas (``histogram_quantile`` semantics, ``histogram.py``).

Shell: ``ScrapeSource`` fetches the endpoints (``bounded.fetch``: on the event loop, bounded in total
time and bytes) and parses them in ``bounded.PARSE_POOL``, off the loop; a target that stalls, sends
too much or sends an invalid exposition is reported in ``errors`` (a short reason, never its body)
and is absent from the snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from prefixtune.engines.base import EngineName, MetricNames
from prefixtune.metrics import bounded
from prefixtune.metrics import histogram as H
from prefixtune.metrics.exposition import Matcher, SeriesKey, Snapshot, matches, parse
from prefixtune.metrics.histogram import Bucket, Slo
from prefixtune.metrics.recipe import DCGM_SERIES, Recipe, Term, for_engine, recipe
from prefixtune.metrics.signals import Signals

END_SLACK_S = 1e-3  # a window this close to its end is done (clocks are floats)
POD_LABELS = ("pod", "exported_pod", "pod_name")  # DCGM's pod label, its renamed and old-namespace forms


@dataclass(frozen=True)
class Window:
    """Signals for one window plus how they were obtained."""

    signals: Signals
    start: float
    end: float
    resets: tuple[str, ...] = ()  # targets whose counters reset (restart) inside the window
    notes: tuple[str, ...] = ()
    queries: Mapping[str, str] = field(default_factory=dict)  # PromQL per signal (PrometheusSource)


@dataclass(frozen=True)
class Increases:
    """Counter increases of one target over its chain of scrapes."""

    values: Mapping[SeriesKey, float]
    seen: frozenset[str]  # cumulative names present at all
    restarted: bool
    start: float
    end: float


def increases(chain: Sequence[Snapshot]) -> Increases | None:
    """Per-series increase over the scrapes of one target (None with fewer than two scrapes)."""
    snaps = sorted(chain, key=lambda s: s.t)
    if len(snaps) < 2:
        return None
    inc: dict[SeriesKey, float] = {}
    restarted = False
    for prev, cur in pairwise(snaps):
        reset = cur.restarted_since(prev)
        restarted |= reset
        for key, value in cur.values.items():
            if key[0] not in cur.cumulative:
                continue
            # A series absent from the previous scrape was created since (prometheus_client children
            # start at 0), so its whole value is its increase; so is every value after a restart.
            delta = value if reset else value - prev.values.get(key, 0.0)
            inc[key] = inc.get(key, 0.0) + max(delta, 0.0)
    seen = frozenset(n for s in snaps for n in s.cumulative)
    return Increases(inc, seen, restarted, snaps[0].t, snaps[-1].t)


def series_increase(samples: Sequence[tuple[float, float]]) -> tuple[float, bool]:
    """Increase of one counter series over its samples (time, value), without extrapolation; a
    decrease is a reset and the post-reset value counts as increase (Prometheus' rule)."""
    total, reset = 0.0, False
    for (_, prev), (_, cur) in pairwise(samples):
        if cur < prev:
            total += cur
            reset = True
        else:
            total += cur - prev
    return total, reset


def _sum_term(incs: Sequence[Increases], term: Term) -> float | None:
    if not any(term.name in i.seen for i in incs):
        return None  # the series does not exist on any target: missing, not zero
    return sum(
        v
        for i in incs
        for (n, labels), v in i.values.items()
        if n == term.name and matches(labels, term.matchers)
    )


def _sum_terms(incs: Sequence[Increases], terms: Sequence[Term]) -> float | None:
    parts = [_sum_term(incs, t) for t in terms]
    if not parts or any(p is None for p in parts):
        return None
    return sum(p for p in parts if p is not None)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def window_buckets(chain: Sequence[Snapshot], base: str) -> tuple[Bucket, ...]:
    """The histogram ``base``'s bucket increases over one target's chain of scrapes (empty with
    fewer than two)."""
    inc = increases(chain)
    return _buckets([inc], base) if inc is not None else ()


def _buckets(incs: Sequence[Increases], base: str) -> tuple[Bucket, ...]:
    name = base + "_bucket"
    pairs: list[tuple[float, float]] = []
    for i in incs:
        for (n, labels), v in i.values.items():
            if n == name:
                le = dict(labels).get("le")
                if le is not None:
                    pairs.append((H.parse_le(le), v))
    return H.buckets_from(pairs)


def _gauge(chains: Sequence[Sequence[Snapshot]], name: str) -> tuple[float, float] | None:
    values = [v for chain in chains for snap in chain for _, v in snap.series(name)]
    if not values:
        return None
    return sum(values) / len(values), max(values)


def gpu_utilization(dcgm: Sequence[Snapshot], pods: Sequence[str] | None) -> float | None:
    """Mean GPU busy ratio (0..1) of the pods' GPUs over the DCGM scrapes (None when not found)."""
    wanted = set(pods) if pods is not None else None
    for name, scale in DCGM_SERIES:
        values: list[float] = []
        for snap in dcgm:
            for labels, v in snap.series(name):
                have = dict(labels)
                pod = next((have[k] for k in POD_LABELS if k in have), None)
                if wanted is None or pod in wanted:
                    values.append(v * scale)
        if values:
            return sum(values) / len(values)
    return None


def window_signals(
    rec: Recipe,
    chains: Mapping[str, Sequence[Snapshot]],
    *,
    slo: Slo | None = None,
    dcgm: Sequence[Snapshot] = (),
    pods: Sequence[str] | None = None,
) -> Window:
    """Signals over the window spanned by the scrapes in ``chains`` (target -> its scrapes)."""
    notes: list[str] = []
    per_target: dict[str, Increases] = {}
    for target, chain in sorted(chains.items()):
        inc = increases(chain)
        if inc is None:
            notes.append(f"target {target}: fewer than two scrapes in the window; its counters are not used")
        else:
            per_target[target] = inc
    incs = list(per_target.values())
    all_snaps = [s for chain in chains.values() for s in chain]
    start = min((s.t for s in all_snaps), default=0.0)
    end = max((s.t for s in all_snaps), default=0.0)
    span = (max(i.end for i in incs) - min(i.start for i in incs)) if incs else 0.0
    resets = tuple(t for t, i in per_target.items() if i.restarted)
    for t in resets:
        notes.append(
            f"target {t}: counters reset (restart) inside the window; treated like Prometheus increase()"
        )

    gauges = {name: _gauge(list(chains.values()), name) for name in rec.gauges()}
    signals = compose(
        rec, incs, span if span > 0 else end - start, gauges=gauges, gpu=gpu_utilization(dcgm, pods), slo=slo
    )
    return Window(signals, start, end, resets, tuple(notes))


def compose(
    rec: Recipe,
    incs: Sequence[Increases],
    span: float,
    *,
    gauges: Mapping[str, tuple[float, float] | None],
    gpu: float | None,
    slo: Slo | None,
) -> Signals:
    """Signals from counter increases over ``span`` seconds, gauge (mean, max) by name, GPU busy."""

    def rate(term: Term | None) -> float | None:
        # Each target over the time its own samples cover: targets are scraped at different offsets.
        if term is None or not incs or _sum_term(incs, term) is None:
            return None
        parts = [(_sum_term([i], term) or 0.0) / (i.end - i.start) for i in incs if i.end > i.start]
        return sum(parts) if parts else None

    def gauge(name: str | None) -> tuple[float, float] | None:
        return gauges.get(name) if name else None

    requests = _sum_term(incs, rec.requests) if rec.requests and incs else None
    ttft = _buckets(incs, rec.ttft) if rec.ttft else ()
    itl = _buckets(incs, rec.itl) if rec.itl else ()
    tpot = _buckets(incs, rec.tpot) if rec.tpot else ()  # per request: the SLO's ITL test
    running, waiting, kv = gauge(rec.running), gauge(rec.waiting), gauge(rec.kv_usage)
    output_rate = rate(rec.generation_tokens)
    per_request = tpot if H.total(tpot) else itl  # per-token gaps where no request was counted
    attainment = H.slo_attainment(ttft, per_request, slo) if slo is not None and ttft else None
    return Signals(
        window_s=span,
        requests=requests,
        hit_rate=_ratio(_sum_terms(incs, rec.hits), _sum_terms(incs, rec.queries)),
        prefill_reduction=_ratio(_sum_terms(incs, rec.prompt_saved), _sum_terms(incs, rec.prompt_total)),
        running_mean=running[0] if running else None,
        running_max=running[1] if running else None,
        waiting_mean=waiting[0] if waiting else None,
        kv_usage_mean=kv[0] if kv else None,
        preemptions_per_s=rate(rec.preemptions),
        gpu_util=gpu,
        ttft_p50_s=H.quantile(0.5, ttft),
        ttft_p90_s=H.quantile(0.9, ttft),
        ttft_p99_s=H.quantile(0.99, ttft),
        itl_p50_s=H.quantile(0.5, itl),
        itl_p99_s=H.quantile(0.99, itl),
        output_tokens_per_s=output_rate,
        input_tokens_per_s=rate(rec.prompt_tokens),
        requests_per_s=rate(rec.requests),
        goodput_tokens_per_s=H.goodput(output_rate, attainment),
        slo_attainment=attainment,
    )


Fetch = Callable[[str], Awaitable[str]]


def _parse(text: str, target: str, t: float, only: frozenset[str] | None = None) -> Snapshot:
    return parse(text, target=target, t=t, only=only)


class ScrapeSource:
    """Measures a window by scraping ``targets`` (name -> metrics URL) directly.

    ``dcgm_urls``: DCGM exporter endpoints; their series are filtered to ``pods`` (by the ``pod``,
    ``exported_pod`` or ``pod_name`` label) for GPU utilization.
    """

    def __init__(
        self,
        engine: EngineName | str,
        targets: Mapping[str, str],
        *,
        names: MetricNames | None = None,
        slo: Slo | None = None,
        dcgm_urls: Sequence[str] = (),
        pods: Sequence[str] | None = None,
        timeout_s: float = 5.0,
        max_bytes: int = bounded.MAX_EXPOSITION_BYTES,
        fetch: Fetch | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not targets:
            raise ValueError("ScrapeSource: targets must name at least one metrics URL")
        self.recipe = recipe(engine, names) if names is not None else for_engine(engine)
        self.targets = dict(targets)
        self.slo = slo
        self.dcgm_urls = tuple(dcgm_urls)
        self.pods = tuple(pods) if pods is not None else None
        self.timeout_s = timeout_s  # the whole read of one target, not one socket read
        self.max_bytes = max_bytes
        self.clock = clock
        self._fetch = fetch or self._fetch_url
        self.errors: list[str] = []

    async def _fetch_url(self, url: str) -> str:
        return await bounded.fetch(url, deadline_s=self.timeout_s, max_bytes=self.max_bytes)

    async def _scrape(self, target: str, url: str, only: frozenset[str] | None = None) -> Snapshot | None:
        sent = self.clock()
        try:
            text = await self._fetch(url)
        except (OSError, ValueError) as err:
            self.errors.append(f"scrape of {target} failed: {err}")
            return None
        # The exporter rendered its values somewhere between sending and receiving: take the midpoint.
        t = (sent + self.clock()) / 2
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(bounded.PARSE_POOL, _parse, text, target, t, only)
        except ValueError:
            self.errors.append(f"scrape of {target} failed: not a valid Prometheus text exposition")
            return None

    async def snapshot(self, only: frozenset[str] | None = None) -> dict[str, Snapshot]:
        """Scrape every target once, concurrently; failed targets are absent (see ``errors``).
        ``only``: keep just these samples of each (``exposition.only_lines``)."""
        names = sorted(self.targets)
        got = await asyncio.gather(*(self._scrape(n, self.targets[n], only) for n in names))
        return {n: s for n, s in zip(names, got, strict=True) if s is not None}

    async def dcgm_snapshot(self) -> list[Snapshot]:
        got = await asyncio.gather(*(self._scrape(f"dcgm:{u}", u) for u in self.dcgm_urls))
        return [s for s in got if s is not None]

    async def measure(
        self,
        window_s: float,
        *,
        sample_every_s: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> Window:
        """Scrape now, every ``sample_every_s`` (gauges and restart tracking), and after ``window_s``."""
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0 seconds, got {window_s!r}")
        if sample_every_s is not None and not sample_every_s > 0:
            raise ValueError(f"sample_every_s must be > 0 seconds or None, got {sample_every_s!r}")
        self.errors = []
        chains: dict[str, list[Snapshot]] = {t: [] for t in self.targets}
        dcgm: list[Snapshot] = []
        began = self.clock()
        deadline = began + window_s
        while True:
            for target, snap in (await self.snapshot()).items():
                chains[target].append(snap)
            dcgm.extend(await self.dcgm_snapshot())
            now = self.clock()
            if now >= deadline - END_SLACK_S:
                break
            step = deadline - now if sample_every_s is None else min(sample_every_s, deadline - now)
            await sleep(step)
        window = window_signals(self.recipe, chains, slo=self.slo, dcgm=dcgm, pods=self.pods)
        return Window(window.signals, window.start, window.end, window.resets, (*window.notes, *self.errors))


__all__ = ["Increases", "Matcher", "ScrapeSource", "Window", "increases", "window_signals"]
