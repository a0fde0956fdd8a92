"""PromQL for the signals of one set of pods over one window, rendered from an engine recipe.

Every query is evaluated at the window end (instant query with ``time=end``) over a ``[Ns]`` range:

- counters: ``sum(increase(x{sel}[Ns]))``. Prometheus' ``increase()`` handles counter resets and
  extrapolates from the first/last sample in the range to the range edges (by at most ~1.1 scrape
  intervals), so it estimates the increase over exactly N seconds; rates are that divided by N.
  Ratios (hit rate, prefill reduction) are unaffected by the extrapolation when numerator and
  denominator come from the same scrapes.
- quantiles: ``histogram_quantile(q, sum by (le)(increase(h_bucket{sel}[Ns])))``.
- gauges: ``avg(avg_over_time(g{sel}[Ns]))`` and ``max(max_over_time(...))`` (every series, every sample).
- GPU busy (DCGM): ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio) or ``DCGM_FI_DEV_GPU_UTIL / 100``, each
  tried with the selector as given and with ``pod``/``namespace`` renamed ``exported_pod``/
  ``exported_namespace`` (what a ServiceMonitor with ``honorLabels: false`` produces).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prefixtune.metrics.exposition import Matcher
from prefixtune.metrics.recipe import DCGM_SERIES, Recipe, Term

EXPORTED = {"pod": "exported_pod", "namespace": "exported_namespace", "container": "exported_container"}
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True)
class Selector:
    """Label matchers that pick the pods' series, e.g. ``{namespace="x", pod=~"a|b"}``."""

    matchers: tuple[Matcher, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        """Parse ``{a="x", b=~"y|z"}`` (braces optional)."""
        body = text.strip()
        if body.startswith("{"):
            if not body.endswith("}"):
                raise ValueError(f"label selector {text!r}: missing closing '}}'")
            body = body[1:-1]
        matchers: list[Matcher] = []
        pos = 0
        body = body.strip()
        while pos < len(body):
            m = _MATCHER.match(body, pos)
            if m is None:
                raise ValueError(
                    f'label selector {text!r}: expected label="value" (ops =, !=, =~, !~) at {body[pos:]!r}'
                )
            value = re.sub(r"\\(.)", r"\1", m.group(3))
            matchers.append(Matcher(m.group(1), m.group(2), value))
            pos = m.end()
        return cls(tuple(matchers))

    @classmethod
    def pods(cls, pods: Sequence[str], namespace: str | None = None, **labels: str) -> Selector:
        """Select the named pods (exactly), optionally in one namespace, plus exact label matches."""
        if not pods:
            raise ValueError("Selector.pods: pods must name at least one pod")
        ms: list[Matcher] = []
        if namespace is not None:
            ms.append(Matcher("namespace", "=", namespace))
        ms.append(Matcher("pod", "=~", "|".join(re.escape(p) for p in pods)))
        ms.extend(Matcher(k, "=", v) for k, v in sorted(labels.items()))
        return cls(tuple(ms))

    def renamed(self, names: Mapping[str, str]) -> Selector:
        return Selector(tuple(Matcher(names.get(m.label, m.label), m.op, m.value) for m in self.matchers))

    def render(self, extra: Iterable[Matcher] = ()) -> str:
        return "{" + ", ".join(m.promql() for m in (*self.matchers, *extra)) + "}"


def _series(name: str, sel: Selector, extra: Iterable[Matcher] = ()) -> str:
    return f"{name}{sel.render(extra)}"


def increase(term: Term, sel: Selector, window_s: int) -> str:
    return f"sum(increase({_series(term.name, sel, term.matchers)}[{window_s}s]))"


def increase_sum(terms: Sequence[Term], sel: Selector, window_s: int) -> str:
    return " + ".join(increase(t, sel, window_s) for t in terms)


def ratio(num: Sequence[Term], den: Sequence[Term], sel: Selector, window_s: int) -> str:
    return f"({increase_sum(num, sel, window_s)}) / ({increase_sum(den, sel, window_s)})"


def buckets(base: str, sel: Selector, window_s: int) -> str:
    return f"sum by (le)(increase({_series(base + '_bucket', sel)}[{window_s}s]))"


def histogram_quantile(q: float, base: str, sel: Selector, window_s: int) -> str:
    return f"histogram_quantile({q}, {buckets(base, sel, window_s)})"


def gpu_util(sel: Selector, window_s: int) -> str:
    variants = []
    for name, scale in DCGM_SERIES:
        for s in (sel, sel.renamed(EXPORTED)):
            expr = f"avg(avg_over_time({_series(name, s)}[{window_s}s]))"
            variants.append(expr if scale == 1.0 else f"({expr} * {scale})")
    return " or ".join(variants)


def resets(rec: Recipe, sel: Selector, window_s: int) -> str:
    """Series whose counters reset inside the window (by value or by a changed ``_created``)."""
    parts = [f"resets({_series(t.name, sel, t.matchers)}[{window_s}s]) > 0" for t in rec.counters()]
    for t in rec.counters():
        if t.name.endswith("_total"):
            created = t.name[: -len("_total")] + "_created"
            parts.append(f"changes({_series(created, sel, t.matchers)}[{window_s}s]) > 0")
    return " or ".join(parts)


def raw(name: str, sel: Selector, window_s: int) -> str:
    """The raw samples of every series called ``name`` in the window (a range vector)."""
    return f"{_series(name, sel)}[{window_s}s]"


def gauge_mean(name: str, sel: Selector, window_s: int) -> str:
    return f"avg(avg_over_time({_series(name, sel)}[{window_s}s]))"


def gauge_max(name: str, sel: Selector, window_s: int) -> str:
    return f"max(max_over_time({_series(name, sel)}[{window_s}s]))"


def window_queries(rec: Recipe, sel: Selector, window_s: int) -> dict[str, str]:
    """Signal name -> PromQL (instant query at the window end). Absent keys: the engine lacks the series."""
    if window_s <= 0:
        raise ValueError(f"window_s must be a positive whole number of seconds, got {window_s!r}")
    w = window_s
    q: dict[str, str] = {}
    if rec.requests:
        q["requests"] = increase(rec.requests, sel, w)
        q["requests_per_s"] = f"{increase(rec.requests, sel, w)} / {w}"
    if rec.hits and rec.queries:
        q["hit_rate"] = ratio(rec.hits, rec.queries, sel, w)
    if rec.prompt_saved and rec.prompt_total:
        q["prefill_reduction"] = ratio(rec.prompt_saved, rec.prompt_total, sel, w)
    for signal, name in (("running", rec.running), ("waiting", rec.waiting), ("kv_usage", rec.kv_usage)):
        if name:
            q[f"{signal}_mean"] = f"avg(avg_over_time({_series(name, sel)}[{w}s]))"
    if rec.running:
        q["running_max"] = f"max(max_over_time({_series(rec.running, sel)}[{w}s]))"
    if rec.preemptions:
        q["preemptions_per_s"] = f"{increase(rec.preemptions, sel, w)} / {w}"
    q["gpu_util"] = gpu_util(sel, w)
    if rec.ttft:
        for qq, key in ((0.5, "ttft_p50_s"), (0.9, "ttft_p90_s"), (0.99, "ttft_p99_s")):
            q[key] = histogram_quantile(qq, rec.ttft, sel, w)
    if rec.itl:
        for qq, key in ((0.5, "itl_p50_s"), (0.99, "itl_p99_s")):
            q[key] = histogram_quantile(qq, rec.itl, sel, w)
    if rec.generation_tokens:
        q["output_tokens_per_s"] = f"{increase(rec.generation_tokens, sel, w)} / {w}"
    if rec.prompt_tokens:
        q["input_tokens_per_s"] = f"{increase(rec.prompt_tokens, sel, w)} / {w}"
    return q
