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

A GPU-utilization gauge is not an engine metric: ``DcgmExporter`` is a separate observer that
serves ``DCGM_FI_DEV_GPU_UTIL`` as NVIDIA's DCGM exporter would.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from prefixtune.engines.base import EngineName, ParsedCommand
from prefixtune.twin.cache.base import CacheStats, Match
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
SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_E2E = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)  # fmt: skip
SGLANG_ITL = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
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


class _Window:
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


class _EngineMetrics:
    """One engine's series. Subclasses create them and map the twin's events onto them."""

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


def _inc_to(counter: Counter, total: float) -> None:
    """Raise a counter child to ``total`` (it mirrors a cumulative count kept by the cache model)."""
    current = counter._value.get()  # the child's value, as prometheus_client keeps it
    if total > current:
        counter.inc(total - current)


def _tpot(decode_s: float, output_len: int) -> float:
    return decode_s / (output_len - 1) if output_len > 1 else 0.0


class _Vllm(_EngineMetrics):
    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        lab = {"model_name": exporter.model, "engine": "0"}
        names = list(lab)
        r = self.registry
        g = exporter.gauge_value

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, names, registry=r).labels(**lab).set_function(fn)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", g("running"))
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", g("waiting"))
        waiting_by = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            [*names, "reason"],
            registry=r,
        )
        waiting_by.labels(**lab, reason="capacity").set_function(g("waiting"))
        waiting_by.labels(**lab, reason="deferred").set(0)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", g("kv_usage"))

        def counter(name: str, doc: str, extra: Mapping[str, str] | None = None) -> Counter:
            labels = {**lab, **(extra or {})}
            return Counter(name, doc, list(labels), registry=r).labels(**labels)

        self.queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        counter(
            "vllm:external_prefix_cache_queries", "External prefix cache queries (KV connector), in tokens."
        )
        counter("vllm:external_prefix_cache_hits", "External prefix cache hits (KV connector), in tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.cached_tokens = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*names, "source"],
            registry=r,
        )
        self.compute_tokens = by_source.labels(**lab, source="local_compute")
        self.local_hit_tokens = by_source.labels(**lab, source="local_cache_hit")
        by_source.labels(**lab, source="external_kv_transfer")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        # The twin generates exactly the requested max_tokens: every request ends by length.
        self.success = success.labels(**lab, finished_reason="length")
        success.labels(**lab, finished_reason="stop")
        success.labels(**lab, finished_reason="abort")

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**lab)

        tok = buckets_1_2_5(exporter.max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.req_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Prefill tokens computed (not from cache), per request.",
            tok,
        )
        self.req_preemptions = hist(
            "vllm:request_num_preemptions", "Number of preemptions per request.", (0, 1, 2, 5, 10, 20)
        )
        self.iteration = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            VLLM_ITERATION_TOKENS,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", VLLM_TTFT
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", VLLM_ITL
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            VLLM_ITL,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", VLLM_LATENCY
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_LATENCY,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            VLLM_LATENCY,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            VLLM_LATENCY,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            VLLM_LATENCY,
        )
        self.config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
                "gpu_memory_utilization",
                "num_cpu_blocks",
                "num_gpu_blocks",
            ],
            registry=r,
        )
        self.computed: dict[int, int] = {}

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        cfg = self.x.parsed.config if self.x.parsed is not None else None
        self.config_info.clear()
        self.config_info.labels(
            block_size=str(gauges.block_size),
            cache_dtype=str(self.x.option("kv_cache_dtype", "auto")),
            enable_prefix_caching=str(bool(cfg.prefix_caching) if cfg else True),
            engine="0",
            gpu_memory_utilization=str(float(cfg.memory_fraction) if cfg else 0.92),
            num_cpu_blocks="None",
            num_gpu_blocks=str(gauges.pool_blocks),
        ).set(1)

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        if first:  # scheduler stats; re-admissions after preemption go to unexported counters
            self.queries.inc(req.prompt_len)
            self.hits.inc(match.hit_tokens)
        recomputed = max(0, req.prompt_len - match.hit_tokens)  # generated tokens not counted: unknown
        self.computed[req.req_id] = self.computed.get(req.req_id, 0) + recomputed

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        # Iteration stats: the prompt's tokens (and where they came from) when its prefill ends.
        cached = self.x.cached_of.get(req.req_id, 0)
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(req.prompt_len)
        self.cached_tokens.inc(cached)
        self.local_hit_tokens.inc(cached)
        self.compute_tokens.inc(max(0, req.prompt_len - cached))
        self.generation_tokens.inc(1)

    def on_tokens(self, gap_s: float, count: int, now: float) -> None:
        observe_many(self.itl, gap_s, count)
        self.generation_tokens.inc(count)

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        self.success.inc()
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.prefill.observe(prefill_s)
        self.decode.observe(decode_s)
        self.inference.observe(prefill_s + decode_s)
        self.tpot.observe(_tpot(decode_s, req.output_len))
        self.req_prompt.observe(req.prompt_len)
        self.req_gen.observe(req.output_len)
        self.req_computed.observe(self.computed.pop(req.req_id, req.prompt_len))
        self.req_preemptions.observe(self.x.preemptions_of.get(req.req_id, 0))

    def on_preempted(self, req: Request, now: float) -> None:
        self.preemptions.inc()

    def on_step(self, now: float, duration_s: float, steps: int, prefill: int, decode: int) -> None:
        if steps > 0:  # a skipped-ahead run of steps: its mean tokens per step, ``steps`` times
            observe_many(self.iteration, (prefill + decode) / steps, steps)


class _Sglang(_EngineMetrics):
    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        sched = {
            "model_name": exporter.model,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tok = {"model_name": exporter.model, "engine_type": "unified"}
        r = self.registry
        g = exporter.gauge_value

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, list(sched), registry=r).labels(**sched).set_function(fn)

        gauge("sglang:num_running_reqs", "The number of running requests.", g("running"))
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", g("waiting"))
        gauge("sglang:token_usage", "The token usage.", lambda: round(exporter.snapshot.kv_usage, 2))
        gauge("sglang:num_used_tokens", "The number of used tokens.", g("used_tokens"))
        gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            g("pool_tokens"),
        )
        gauge("sglang:page_size", "The page size of the KV cache.", g("block_size"))
        gauge("sglang:num_pages", "The number of pages in the KV cache pool.", g("pool_blocks"))
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lambda: self.batch_hit_rate)
        gauge("sglang:gen_throughput", "The generation throughput (token/s).", self._gen_throughput)
        gauge(
            "sglang:num_retracted_reqs",
            "The number of retracted requests.",
            lambda: float(self.last_retracted),
        )
        gauge("sglang:num_paused_reqs", "The number of paused requests.", lambda: 0.0)

        def counter(name: str, doc: str, labels: Mapping[str, str], extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=r)

        eff = counter(
            "sglang:prefill_effective_tokens_total",
            "Prefill tokens by mode: input (computed), device_hit, host_hit, storage_hit. "
            "Hit rate = sum(rate(*_hit)) / sum(rate(all modes)).",
            sched,
            ["mode"],
        )
        self.eff = {
            m: eff.labels(**sched, mode=m) for m in ("input", "device_hit", "host_hit", "storage_hit")
        }
        realtime = counter("sglang:realtime_tokens_total", "Tokens processed, by mode.", sched, ["mode"])
        self.rt = {
            m: realtime.labels(**sched, mode=m) for m in ("prefill_compute", "prefill_cache", "decode")
        }
        self.retracted = counter(
            "sglang:num_retracted_requests_total", "Total number of retracted requests.", sched
        ).labels(**sched)
        streaming = {**tok, "is_streaming": "false"}
        self.prompt_tokens = counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", streaming
        ).labels(**streaming)
        self.generation_tokens = counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", streaming
        ).labels(**streaming)
        cached = counter(
            "sglang:cached_tokens_total", "Number of cached prompt tokens.", tok, ["cache_source"]
        )
        self.cached = {s: cached.labels(**tok, cache_source=s) for s in ("device", "host", "storage")}
        self.requests = counter("sglang:num_requests_total", "Number of requests processed.", tok).labels(
            **tok
        )
        counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tok).labels(**tok)
        self.evicted = counter(
            "sglang:evicted_tokens_total", "Number of tokens evicted from the radix cache.", sched
        ).labels(**sched)

        def hist(name: str, doc: str, labels: Mapping[str, str], buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, list(labels), buckets=buckets, registry=r).labels(**labels)

        self.ttft = hist(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            # --bucket-time-to-first-token (the operator renders bounds that resolve the SLO)
            _ttft_buckets(exporter.option("ttft_buckets", SGLANG_TTFT)),
        )
        self.itl = hist(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok,
            SGLANG_ITL,
        )
        self.tpot = hist(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token per request in seconds.",
            streaming,
            SGLANG_ITL,
        )
        self.e2e = hist(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            SGLANG_E2E,
        )
        self.queue = hist(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", tok, SGLANG_E2E
        )
        self.batch_hit_rate = 0.0
        self.batch_hit = 0
        self.batch_total = 0
        self.last_retracted = 0
        self.retracted_since_step = 0
        self.decoded = _Window(5.0)

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        if stats is not None:
            _inc_to(self.evicted, stats.evicted_blocks * gauges.block_size)

    def _gen_throughput(self) -> float:
        return self.decoded.sum(self.x.snapshot.now) / self.decoded.span_s

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        device = match.hit_tokens - match.host_tokens
        # A re-admission after a retraction also re-prefills the tokens generated so far; the
        # observer does not say how many, so only the prompt's part is counted as computed.
        computed = max(0, req.prompt_len - match.hit_tokens)
        self.eff["input"].inc(computed)
        self.eff["device_hit"].inc(device)
        self.eff["host_hit"].inc(match.host_tokens)
        self.rt["prefill_compute"].inc(computed)
        self.rt["prefill_cache"].inc(match.hit_tokens)
        self.batch_hit += match.hit_tokens
        self.batch_total += req.prompt_len

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.observe(ttft_s)

    def on_tokens(self, gap_s: float, count: int, now: float) -> None:
        observe_many(self.itl, gap_s, count)

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        self.prompt_tokens.inc(req.prompt_len)
        self.generation_tokens.inc(req.output_len)
        host = self.x.host_cached.pop(req.req_id, 0)
        if cached > 0:
            self.cached["device"].inc(cached - host)
            self.cached["host"].inc(host)
        self.requests.inc()
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.tpot.observe(_tpot(decode_s, req.output_len))

    def on_preempted(self, req: Request, now: float) -> None:
        self.retracted.inc()
        self.retracted_since_step += 1

    def on_step(self, now: float, duration_s: float, steps: int, prefill: int, decode: int) -> None:
        # SGLang logs its gauges per batch: the hit rate of the prefill batch just run, the
        # retractions of the last decode batch. Here a "batch" is the run of steps just reported.
        if self.batch_total > 0:
            self.batch_hit_rate = self.batch_hit / self.batch_total
            self.batch_hit = self.batch_total = 0
        self.last_retracted = self.retracted_since_step
        self.retracted_since_step = 0
        self.rt["decode"].inc(decode)
        self.decoded.add(now, decode)


class _Trtllm(_EngineMetrics):
    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        lab = {"model_name": exporter.model, "engine_type": "trtllm"}
        names = list(lab)
        r = self.registry
        g = exporter.gauge_value

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, names, registry=r).labels(**lab).set_function(fn)

        gauge("trtllm_num_requests_running", "Number of active requests", g("running"))
        gauge("trtllm_num_requests_waiting", "Number of queued requests", g("waiting"))
        gauge("trtllm_kv_cache_utilization", "KV cache utilization", g("kv_usage"))
        gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", g("pool_blocks"))
        gauge("trtllm_kv_cache_free_blocks", "Free KV cache blocks", g("free_blocks"))
        gauge("trtllm_kv_cache_used_blocks", "Used KV cache blocks", g("used_blocks"))
        gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block", g("block_size"))
        gauge("trtllm_num_paused_requests", "Number of paused requests", lambda: float(exporter.paused))
        gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", self._hit_rate)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(**lab)

        self.reused = counter(
            "trtllm_kv_cache_reused_blocks", "Cumulative number of KV cache blocks reused (cache hits)"
        )
        self.missed = counter(
            "trtllm_kv_cache_missed_blocks", "Cumulative number of KV cache blocks missed (cache misses)"
        )
        self.cached_tokens = counter(
            "trtllm_prompt_cached_tokens_total", "Prompt tokens served from the KV cache."
        )
        self.prompt_tokens = counter(
            "trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed."
        )
        self.generation_tokens = counter(
            "trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced."
        )
        self.completed = counter(
            "trtllm_num_requests_completed_total", "Total number of completed requests across iterations"
        )
        self.onboard = counter(
            "trtllm_kv_cache_onboard_bytes_total", "Total bytes transferred from host to GPU (onboard)"
        )
        self.offload = counter(
            "trtllm_kv_cache_offload_bytes_total", "Total bytes transferred from GPU to host (offload)"
        )
        success = Counter(
            "trtllm_request_success_total",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.success = success.labels(**lab, finished_reason="length")
        success.labels(**lab, finished_reason="stop")

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**lab)

        self.e2e = hist(
            "trtllm_e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            VLLM_LATENCY,
        )
        self.ttft = hist(
            "trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", VLLM_TTFT
        )
        self.tpot = hist(
            "trtllm_time_per_output_token_seconds", "Histogram of time per output token in seconds.", VLLM_ITL
        )
        self.queue = hist(
            "trtllm_request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_LATENCY,
        )
        self.prefill = hist(
            "trtllm_request_prefill_time_seconds",
            "Histogram of prefill (context) phase duration in seconds.",
            TRT_PREFILL,
        )
        self.decode = hist(
            "trtllm_request_decode_time_seconds",
            "Histogram of decode (generation) phase duration in seconds.",
            VLLM_LATENCY,
        )
        self.inference = hist(
            "trtllm_request_inference_time_seconds",
            "Histogram of total inference duration in seconds.",
            VLLM_LATENCY,
        )
        self.config_info = Gauge(
            "trtllm_kv_cache_config_info",
            "KV cache configuration",
            [
                *names,
                "tokens_per_block",
                "enable_block_reuse",
                "enable_partial_reuse",
                "free_gpu_memory_fraction",
                "host_cache_size",
                "max_blocks",
            ],
            registry=r,
        )
        self.reused_total = 0
        self.missed_total = 0

    def _hit_rate(self) -> float:
        total = self.reused_total + self.missed_total
        return self.reused_total / total if total else 0.0

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        if stats is not None and self.x.kv_bytes_per_token > 0:
            per_block = gauges.block_size * self.x.kv_bytes_per_token
            _inc_to(self.onboard, stats.onboarded_blocks * per_block)
            _inc_to(self.offload, stats.offloaded_blocks * per_block)
        cfg = self.x.parsed.config if self.x.parsed is not None else None
        self.config_info.clear()
        self.config_info.labels(
            model_name=self.x.model,
            engine_type="trtllm",
            tokens_per_block=str(gauges.block_size),
            enable_block_reuse=str(bool(cfg.prefix_caching) if cfg else True),
            enable_partial_reuse=str(bool(self.x.option("partial_reuse", True))),
            free_gpu_memory_fraction=str(float(cfg.memory_fraction) if cfg else 0.9),
            host_cache_size=str(int(self.x.option("host_cache_bytes", 0))),  # type: ignore[call-overload]
            max_blocks=str(gauges.pool_blocks),
        ).set(1)

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        self.reused.inc(match.hit_blocks)
        self.missed.inc(match.miss_blocks)
        self.reused_total += match.hit_blocks
        self.missed_total += match.miss_blocks

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.observe(ttft_s)

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        # Per-request metrics in TensorRT-LLM: recorded when the request completes.
        self.prompt_tokens.inc(req.prompt_len)
        self.cached_tokens.inc(cached)
        self.generation_tokens.inc(req.output_len)
        self.success.inc()
        self.completed.inc()
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.prefill.observe(prefill_s)
        self.decode.observe(decode_s)
        self.inference.observe(prefill_s + decode_s)
        self.tpot.observe(_tpot(decode_s, req.output_len))


def _ttft_buckets(value: object) -> tuple[float, ...]:
    if isinstance(value, tuple) and value and all(isinstance(b, int | float) for b in value):
        return tuple(float(b) for b in value)
    return tuple(float(b) for b in SGLANG_TTFT)


def _families_of(engine: EngineName, version: str | None) -> frozenset[str] | None:
    """The metric families an older engine release exports (``EngineAdapter.metrics_for``), or None
    for the release the adapter describes (the twin then serves every series it models)."""
    from prefixtune.engines import get_adapter

    adapter = get_adapter(engine)
    if version is None or version == adapter.version_of(adapter.default_image):
        return None
    names = adapter.metrics_for(version)
    found = [getattr(names, f) for f in names.__dataclass_fields__ if isinstance(getattr(names, f), str)]
    found += [v for k, v in names.extra.items() if ":" in v or v.startswith(engine.value)]
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


_ENGINES: dict[EngineName, type[_EngineMetrics]] = {
    EngineName.VLLM: _Vllm,
    EngineName.SGLANG: _Sglang,
    EngineName.TRTLLM: _Trtllm,
}

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
        engine: str | EngineName,
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
        try:
            self.engine = EngineName(engine)
        except ValueError:
            known = ", ".join(e.value for e in EngineName)
            raise ValueError(f"unknown engine {engine!r}; known engines: {known}") from None
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
        self.metrics = _ENGINES[self.engine](self)

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
