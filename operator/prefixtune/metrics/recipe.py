"""Which series make each signal, per engine: one recipe that both sources evaluate.

The names come from the engine adapter's ``MetricNames``; the per-engine rules (how a hit rate is
formed, which unit it counts) follow engines.md section 2:

- vLLM: hit rate = prefix_cache_hits / prefix_cache_queries (tokens); prefill reduction =
  prompt_tokens_cached / prompt_tokens (falls back to hits / prompt tokens).
- SGLang: hit rate = prefill_effective_tokens{mode=~".*_hit"} / prefill_effective_tokens (all modes),
  tokens; the same ratio is the prefill reduction (hit tokens are exactly the prompt tokens not computed).
- TensorRT-LLM: hit rate = reused / (reused + missed) KV blocks, as the engine counts it; prefill
  reduction = prompt_cached_tokens / prompt_tokens (tokens).

The ScrapeSource evaluates a recipe on scraped snapshots, the PrometheusSource renders it to PromQL, so
the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixtune.engines.base import EngineName, MetricNames
from prefixtune.metrics.exposition import Matcher

HIT_MODE = Matcher("mode", "=~", ".*_hit")  # SGLang: device_hit, host_hit, storage_hit

# DCGM exporter (engines.md 2.4): the profiling ratio is preferred, the coarse % is the fallback.
DCGM_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0..1
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent 0..100
DCGM_SERIES: tuple[tuple[str, float], ...] = ((DCGM_ENGINE_ACTIVE, 1.0), (DCGM_GPU_UTIL, 0.01))


@dataclass(frozen=True)
class Term:
    """The sum of every series called ``name`` whose labels pass ``matchers``."""

    name: str
    matchers: tuple[Matcher, ...] = ()


@dataclass(frozen=True)
class Recipe:
    engine: EngineName
    hits: tuple[Term, ...]  # numerator of the hit rate
    queries: tuple[Term, ...]  # denominator (summed)
    hit_unit: str
    prompt_tokens: Term | None
    prompt_saved: tuple[Term, ...]  # prompt tokens not recomputed (numerator of prefill reduction)
    prompt_total: tuple[Term, ...]  # denominator of prefill reduction
    generation_tokens: Term | None
    requests: Term | None
    preemptions: Term | None
    running: str | None
    waiting: str | None
    kv_usage: str | None
    ttft: str | None  # histogram base names
    itl: str | None
    tpot: str | None  # per request (``MetricNames.tpot``); may be the same series as ``itl``

    def counters(self) -> tuple[Term, ...]:
        terms: list[Term | None] = [
            *self.hits,
            *self.queries,
            self.prompt_tokens,
            *self.prompt_saved,
            *self.prompt_total,
            self.generation_tokens,
            self.requests,
            self.preemptions,
        ]
        seen: dict[Term, None] = {t: None for t in terms if t is not None}
        return tuple(seen)

    def gauges(self) -> tuple[str, ...]:
        return tuple(g for g in (self.running, self.waiting, self.kv_usage) if g)

    def histograms(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h for h in (self.ttft, self.itl, self.tpot) if h))

    def sample_names(self) -> frozenset[str]:
        """Every sample name the recipe reads (a histogram's buckets, sum and count)."""
        names = {t.name for t in self.counters()} | set(self.gauges())
        names |= {h + suffix for h in self.histograms() for suffix in ("_bucket", "_sum", "_count")}
        return frozenset(names)


def _term(name: str, *matchers: Matcher) -> Term | None:
    return Term(name, tuple(matchers)) if name else None


def recipe(engine: EngineName | str, names: MetricNames) -> Recipe:
    """The recipe for ``engine`` with the adapter's metric names."""
    try:
        eng = EngineName(engine)
    except ValueError as err:
        known = ", ".join(e.value for e in EngineName)
        raise ValueError(f"engine must be one of {known}; got {engine!r}") from err
    prompt = _term(names.prompt_tokens)
    if "hit_label" in names.extra:  # hits are the modes of one counter that match a label (SGLang)
        source = names.hit_denominator or names.hit_numerator
        label = names.extra.get("hit_label", HIT_MODE.label)
        hit_mode = Matcher(label, "=~", names.extra.get("hit_label_regex", HIT_MODE.value))
        hits: tuple[Term, ...] = (Term(names.hit_numerator, (hit_mode,)),) if names.hit_numerator else ()
        queries: tuple[Term, ...] = (Term(source),) if source else ()
        saved, whole = hits, queries
    else:
        hits = (Term(names.hit_numerator),) if names.hit_numerator else ()
        if names.hit_denominator:
            queries = (Term(names.hit_denominator),)
        elif names.hit_miss and hits:
            queries = (*hits, Term(names.hit_miss))
        else:
            queries = ()
        whole = (prompt,) if prompt else ()
        if names.cached_prompt_tokens:
            saved = (Term(names.cached_prompt_tokens),)
        elif names.hit_unit == "tokens":
            saved = hits
        else:
            saved, whole = (), ()
    requests = _term(names.requests_finished) or (_term(names.e2e + "_count") if names.e2e else None)
    return Recipe(
        engine=eng,
        hits=hits,
        queries=queries,
        hit_unit=names.hit_unit,
        prompt_tokens=prompt,
        prompt_saved=saved,
        prompt_total=whole,
        generation_tokens=_term(names.generation_tokens),
        requests=requests,
        preemptions=_term(names.preemptions),
        running=names.requests_running or None,
        waiting=names.requests_waiting or None,
        kv_usage=names.kv_usage or None,
        ttft=names.ttft or None,
        itl=names.itl or None,
        tpot=names.tpot or None,
    )


def for_engine(engine: EngineName | str, version: str | None = None) -> Recipe:
    """The recipe with the names from the engine adapter (``prefixtune.engines.get_adapter``), for
    the engine release ``version`` (None: the newest the adapter describes)."""
    from prefixtune.engines import get_adapter  # the adapters register lazily; import at use

    adapter = get_adapter(engine)
    return recipe(engine, adapter.metrics if version is None else adapter.metrics_for(version))


# What each signal of the recipe is made of, for telling a user what an engine release cannot show.
_SIGNALS: tuple[tuple[str, str], ...] = (
    ("hits", "prefix-cache hit rate"),
    ("prompt_saved", "prefill reduction (cached prompt tokens)"),
    ("prompt_tokens", "prompt tokens/s"),
    ("generation_tokens", "output tokens/s (throughput, goodput)"),
    ("running", "running requests"),
    ("waiting", "queue length"),
    ("kv_usage", "KV cache usage"),
    ("ttft", "TTFT histogram"),
    ("itl", "ITL histogram"),
    ("requests", "request count"),
)
# The recipe fields an objective cannot be scored without (tuning.objective.score).
OBJECTIVE_NEEDS: dict[str, tuple[str, ...]] = {
    "goodput": ("generation_tokens", "ttft", "itl", "requests"),
    "throughput": ("generation_tokens", "requests"),
    "ttft": ("ttft", "requests"),
}


def _present(r: Recipe, name: str) -> bool:
    return bool(getattr(r, name))


def missing_signals(full: Recipe, running: Recipe) -> list[str]:
    """The signals ``full`` (the newest release) reads that ``running`` (the pod's release) lacks."""
    return [text for name, text in _SIGNALS if _present(full, name) and not _present(running, name)]


def objective_refusal(running: Recipe, objective: str) -> str:
    """Why ``objective`` cannot be scored from ``running``'s series ("" when it can)."""
    lacking = [name for name in OBJECTIVE_NEEDS.get(objective, ()) if not _present(running, name)]
    if not lacking:
        return ""
    can = [o for o, needs in OBJECTIVE_NEEDS.items() if all(_present(running, n) for n in needs)]
    texts = dict(_SIGNALS)
    return (
        f"objective {objective} needs {', '.join(texts[n] for n in lacking)}, which this engine release "
        f"does not export; objectives it can score: {', '.join(can) or 'none'}"
    )
