"""Signals from a real Prometheus (prometheus-api-client's ``PrometheusConnect.custom_query``).

The queries come from ``promql.window_queries``; each is an instant query at the window end. Empty
results, NaN and infinities are "not measured" (``None``), never 0. Goodput needs the share of requests
under the SLO, which classic histograms only give by interpolation: the bucket increases are fetched
(``sum by (le)(increase(..._bucket[Ns]))``) and interpolated in ``histogram.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefixtune.engines.base import EngineName, MetricNames
from prefixtune.metrics import histogram as H
from prefixtune.metrics import promql
from prefixtune.metrics.exposition import SeriesKey, labels_of
from prefixtune.metrics.histogram import Bucket, Slo
from prefixtune.metrics.promql import Selector
from prefixtune.metrics.recipe import Recipe, for_engine, recipe
from prefixtune.metrics.scrape_source import Increases, Window, compose, series_increase


class QueryClient(Protocol):
    """What PrometheusSource needs from ``prometheus_api_client.PrometheusConnect``."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


def connect(url: str, *, timeout_s: float = 10.0) -> QueryClient:
    """prometheus-api-client for the command-line tools (TLS verified). The operator queries through
    ``bounded.BoundedPrometheus`` instead: bounded in total time and bytes, no bodies in errors."""
    from prometheus_api_client import PrometheusConnect

    client: QueryClient = PrometheusConnect(url=url, disable_ssl=False, timeout=timeout_s)
    return client


def scalar(result: Sequence[Mapping[str, Any]]) -> float | None:
    """The single value of an aggregated instant vector; None when empty, NaN or infinite."""
    if len(result) != 1:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def bucket_vector(result: Sequence[Mapping[str, Any]]) -> tuple[Bucket, ...]:
    """``sum by (le)`` result -> buckets (NaN counts dropped)."""
    pairs: list[tuple[float, float]] = []
    for row in result:
        le = row.get("metric", {}).get("le")
        try:
            v = float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if le is not None and not math.isnan(v):
            pairs.append((H.parse_le(le), v))
    return H.buckets_from(pairs)


def _who(labels: Mapping[str, str]) -> str:
    for key in ("pod", "exported_pod", "instance", "job"):
        if key in labels:
            return f"{key}={labels[key]}"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(no labels)"


class PrometheusSource:
    """Signals for the pods picked by a label selector over a window ending at a given time."""

    def __init__(
        self,
        client: QueryClient | str,
        engine: EngineName | str,
        *,
        names: MetricNames | None = None,
        slo: Slo | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = connect(client) if isinstance(client, str) else client
        self.recipe: Recipe = recipe(engine, names) if names is not None else for_engine(engine)
        self.slo = slo
        self.clock = clock

    def _query(self, query: str, end: float) -> list[dict[str, Any]]:
        return list(self.client.custom_query(query, params={"time": f"{end:.3f}"}))

    def measure(self, selector: Selector | str, window_s: int, end: float | None = None) -> Window:
        """Signals over ``(end - window_s, end]``; ``end`` defaults to now.

        Counters and histogram buckets are read as raw samples (``x{sel}[Ns]``) and their increase is
        taken between the first and last sample of each series, resets handled like ``increase()``
        but without its extrapolation; rates divide by the time those samples cover (reported as
        ``window_s``). Gauges and GPU busy are PromQL ``*_over_time`` aggregates.
        """
        sel = Selector.parse(selector) if isinstance(selector, str) else selector
        if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s <= 0:
            raise ValueError(f"window_s must be a positive whole number of seconds, got {window_s!r}")
        at = self.clock() if end is None else end
        rec = self.recipe
        queries = promql.window_queries(rec, sel, window_s)
        names = sorted({t.name for t in rec.counters()} | {h + "_bucket" for h in rec.histograms()})
        per_target: dict[str, _Target] = {}
        reset_series: list[Mapping[str, str]] = []
        rows = {name: self._query(promql.raw(name, sel, window_s), at) for name in names}
        keep = _one_job_per_pod([r for found in rows.values() for r in found])
        for name in names:
            for row in rows[name]:
                labels = {k: v for k, v in row.get("metric", {}).items() if k != "__name__"}
                if not keep(labels):
                    continue  # the same pod scraped by another job: counted once
                target = per_target.setdefault(_target_of(labels), _Target())
                target.seen.add(name)
                samples = _samples(row.get("values", []))
                if len(samples) < 2:
                    continue
                inc, reset = series_increase(samples)
                target.values[(name, labels_of(labels))] = inc
                target.first = min(target.first, samples[0][0])
                target.last = max(target.last, samples[-1][0])
                if reset:
                    reset_series.append(labels)
        incs = [
            Increases(t.values, frozenset(t.seen), False, t.first, t.last)
            for t in per_target.values()
            if t.last > t.first
        ]
        first = min((i.start for i in incs), default=math.inf)
        last = max((i.end for i in incs), default=-math.inf)
        span = last - first if incs else 0.0
        gauges: dict[str, tuple[float, float] | None] = {}
        for name in rec.gauges():
            mean = scalar(self._query(promql.gauge_mean(name, sel, window_s), at))
            high = scalar(self._query(promql.gauge_max(name, sel, window_s), at))
            gauges[name] = None if mean is None or high is None else (mean, high)
        gpu = scalar(self._query(queries["gpu_util"], at))
        signals = compose(rec, incs, span, gauges=gauges, gpu=gpu, slo=self.slo)
        notes: list[str] = []
        if span <= 0:
            notes.append(f"fewer than two samples of the counters in the last {window_s}s at {at:.3f}")
        reset_rows = self._query(promql.resets(rec, sel, window_s), at)
        resets = tuple(sorted({_who(m) for m in [*reset_series, *(r.get("metric", {}) for r in reset_rows)]}))
        for who in resets:
            notes.append(f"{who}: counters reset (restart) inside the window; counted like increase()")
        start = first if span > 0 else at - window_s
        return Window(signals, start, last if span > 0 else at, resets, tuple(notes), queries)


@dataclass
class _Target:
    values: dict[SeriesKey, float] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    first: float = math.inf
    last: float = -math.inf


def _pod_of(labels: Mapping[str, str]) -> str:
    return labels.get("pod") or labels.get("instance") or ""


def _one_job_per_pod(rows: Sequence[Mapping[str, Any]]) -> Callable[[Mapping[str, str]], bool]:
    """A pod scraped by two or three jobs (a ServiceMonitor and an annotation-based job, say) has
    each series two or three times, differing in ``job`` (and ``instance``): keep the series of one
    job per (namespace, pod), the same job for every metric (the first by name)."""
    jobs: dict[tuple[str, str], str] = {}
    for row in rows:
        labels = row.get("metric", {})
        key = (labels.get("namespace", ""), _pod_of(labels))
        job = str(labels.get("job", ""))
        if key not in jobs or job < jobs[key]:
            jobs[key] = job
    return lambda labels: (
        jobs.get((labels.get("namespace", ""), _pod_of(labels)), "") == labels.get("job", "")
    )


def _target_of(labels: Mapping[str, str]) -> str:
    """Series from one scrape target share its timestamps: group by instance (or pod)."""
    return labels.get("instance") or labels.get("pod") or labels.get("job", "")


def _samples(raw: Sequence[Sequence[Any]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for pair in raw:
        try:
            t, v = float(pair[0]), float(pair[1])
        except (IndexError, TypeError, ValueError):
            continue
        if not math.isnan(v):
            out.append((t, v))
    return out
