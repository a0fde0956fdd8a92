"""Name the bottleneck from measured Signals, and spot the field-notes patterns. Pure functions.

``diagnose(signals, baseline=None, history=())`` returns the bound (prefill, decode, kv-capacity,
queueing, unknown, or insufficient-data) with the readings that support it, plus findings:

- ``ttft-down-throughput-flat``: caching cut TTFT against the baseline but throughput did not rise
  (serving is decode-bound; caching only saves prefill).
- ``p99-stuck``: TTFT p50 fell against the baseline but p99 did not (misses make the tail: long
  prefixes evicted, or always-missing requests such as new sessions); without a baseline, a high hit
  rate with a p99 many times p50 raises ``miss-dominated-tail``.
- ``short-prefix-hits``: hit rate high but prefill reduction much lower (hits on short prefixes). Only
  an engine that counts hits in blocks can show it: TensorRT-LLM counts a partially reused block as a
  reused one; vLLM's and SGLang's hit counters are tokens, the same quantity as the reduction.
- ``eviction-pressure``: KV usage high with preemptions, or the hit rate falling while KV is full.
- ``hit-rate-up-throughput-down``: more hits but less throughput than the previous window (look at
  the batch size and GPU utilization: the cache may be taking memory from the batch).
- ``caching-earns-nothing``: hit rate below 0.6 in every window seen: consider turning caching off.
- ``running-cap-binds`` (needs ``limits``): the running batch sits at the running-request cap while
  KV memory is free and requests queue: the cap, not memory, limits the batch.
- ``token-budget-itl-spikes`` (needs ``limits``): ITL p99 far above p50 while the prompt tokens each
  request computes fill most of a step's token budget: the decodes wait on large prefill chunks.
  Where chunks share steps with the decodes and long prompts are chunked (vLLM), a smaller budget
  cuts the spikes at some TTFT; SGLang runs a prompt's prefill batches back to back apart from
  decode, and trtllm-serve without chunked prefill refuses prompts over its budget, so there it does
  not (the widening asks the adapter: ``budget_cuts_itl``). Prompts much shorter than the budget make
  the same spikes at any budget.
- ``token-budget-chunks-ttft`` (needs ``limits``): a prompt needs many steps of what the budget
  leaves after the running decodes (one token each) and TTFT is about that many steps: TTFT is mostly
  chunked prefill; a larger budget cuts it at some ITL.
- ``routing-splits-cache`` (needs ``routing``): two or more replicas behind a policy blind to the
  request's prefix (kube-proxy, random, round_robin, power_of_two: ``routing.policy.PREFIX_BLIND``)
  while one replica holding the whole load's cache would hit more (``single_replica_hit_rate``: from
  the twin, ``twin/replicas.single_cache_hit_rate``, or per-session statistics): the cost is named
  in points of hit rate. Without that estimate, the finding still names the policy and the replicas.

The bound: a full KV pool with preemptions or a queue is kv-capacity; a queue against the batch is
queueing; many computed prompt tokens per output token is prefill (the token mix, robust to chunked
prefill inflating ITL); otherwise the split of a request's time between TTFT and decode decides.
``caching-earns-nothing`` is not raised when the caller says caching is off.

Thresholds are in ``Thresholds`` (documented defaults; all heuristics, not engine facts).
Each is one small rule function: ``BOUND_RULES`` (the first that applies names the bound) and
``FINDING_RULES`` (every one that applies adds its finding, in that order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixtune.metrics.signals import Signals
from prefixtune.routing.policy import PREFIX_BLIND, RoutingPolicy

PREFILL = "prefill"
DECODE = "decode"
KV_CAPACITY = "kv-capacity"
QUEUEING = "queueing"
UNKNOWN = "unknown"
INSUFFICIENT = "insufficient-data"
BOUNDS = (PREFILL, DECODE, KV_CAPACITY, QUEUEING, UNKNOWN, INSUFFICIENT)
TTFT_DOWN_THROUGHPUT_FLAT = "ttft-down-throughput-flat"  # its finding also names an unknown bound: decode


@dataclass(frozen=True)
class Thresholds:
    min_requests: float = 20.0  # fewer finished requests in the window: insufficient data
    kv_full: float = 0.90  # KV usage at or above this is "full"
    queue_ratio: float = 0.5  # waiting >= this x running (and >= min_waiting) is queueing
    min_waiting: float = 1.0
    prefill_share: float = 0.5  # TTFT share of a request's service time at or above this: prefill-bound
    # Prompt tokens computed per output token at or above this: prefill-bound whatever the latencies
    # say. A prefill token costs about as much GPU time as a decode token in a mid-size batch or less
    # (compute- vs bandwidth-bound), so at 20:1 prefill is most of the work. Needed because with
    # chunked prefill every decode step carries prefill chunks, and ITL then measures prefill time.
    prefill_token_ratio: float = 20.0
    high_hit_rate: float = 0.5
    earns_nothing_hit_rate: float = 0.6  # field notes: "hit rate stably below 60%"
    reduction_gap: float = 0.2  # prefill reduction this much below the hit rate: short-prefix hits
    ttft_drop: float = 0.15  # relative fall of TTFT p50 that counts as "down"
    flat: float = 0.05  # relative change of throughput/p99 within this is "flat"
    tail_ratio: float = 5.0  # p99 / p50 at or above this with a high hit rate: miss-dominated tail
    hit_rate_fall: float = 0.05  # absolute fall of the hit rate that counts as "falling"
    cap_share: float = 0.9  # running batch mean at or above this x the running cap: the cap binds
    itl_tail_ratio: float = 3.0  # ITL p99 / p50 at or above this: ITL spikes
    chunk_share: float = 0.5  # computed prompt >= this x the token budget: steps carry large chunks
    many_steps: float = 4.0  # a prompt's prefill over at least this many steps: chunking decides TTFT
    routing_gap: float = 0.05  # single-replica hit rate this far above the measured one: routing costs


@dataclass(frozen=True)
class BatchLimits:
    """The batch limits the measured config runs (None: not known). Engine-neutral: the running cap
    is vLLM's ``--max-num-seqs``, SGLang's ``--max-running-requests``, TensorRT-LLM's
    ``max_batch_size``; the token budget per step is ``--max-num-batched-tokens``,
    ``--chunked-prefill-size``, ``max_num_tokens``."""

    max_running: int | None = None
    max_batched_tokens: int | None = None


@dataclass(frozen=True)
class ReplicaRouting:
    """How requests reach the replicas: their number, the routing policy, and (None: not known) the
    hit rate one replica holding the whole load's cache would have on the same traffic."""

    replicas: int = 1
    policy: RoutingPolicy = RoutingPolicy.KUBE_PROXY
    single_replica_hit_rate: float | None = None


@dataclass(frozen=True)
class Finding:
    code: str
    note: str
    readings: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "note": self.note,
            "readings": {k: float(v) for k, v in self.readings.items()},
        }


@dataclass(frozen=True)
class Diagnosis:
    bound: str
    reason: str
    readings: Mapping[str, float]
    findings: tuple[Finding, ...] = ()
    hit_rate: float | None = None
    prefill_reduction: float | None = None

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.findings)

    def notes(self) -> list[str]:
        return [self.reason, *(f.note for f in self.findings)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound,
            "reason": self.reason,
            "hit_rate": self.hit_rate,
            "prefill_reduction": self.prefill_reduction,
            "readings": {k: float(v) for k, v in self.readings.items()},
            "findings": [f.to_dict() for f in self.findings],
        }


def _present(s: Signals, *names: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in names:
        v = getattr(s, n)
        if v is not None:
            out[n] = float(v)
    return out


def _rel(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return (new - old) / old


def _throughput(s: Signals) -> float | None:
    return s.output_tokens_per_s if s.output_tokens_per_s is not None else s.requests_per_s


def prefill_time_share(s: Signals) -> float | None:
    """TTFT p50 / (TTFT p50 + mean output tokens per request x ITL p50): where a request's time goes."""
    if None in (s.ttft_p50_s, s.itl_p50_s, s.output_tokens_per_s, s.requests_per_s):
        return None
    assert s.ttft_p50_s is not None and s.itl_p50_s is not None
    assert s.output_tokens_per_s is not None and s.requests_per_s is not None
    if s.requests_per_s <= 0:
        return None
    decode = (s.output_tokens_per_s / s.requests_per_s) * s.itl_p50_s
    total = s.ttft_p50_s + decode
    return None if total <= 0 else s.ttft_p50_s / total


def computed_prompt_per_request(s: Signals) -> float | None:
    """Prompt tokens a request computes (not served from the cache), on average."""
    if s.input_tokens_per_s is None or not s.requests_per_s:
        return None
    saved = s.prefill_reduction if s.prefill_reduction is not None else 0.0
    return s.input_tokens_per_s * (1.0 - saved) / s.requests_per_s


def computed_prefill_per_output_token(s: Signals) -> float | None:
    """Prompt tokens actually computed (not served from the cache) per output token."""
    if s.input_tokens_per_s is None or not s.output_tokens_per_s:
        return None
    saved = s.prefill_reduction if s.prefill_reduction is not None else 0.0
    return s.input_tokens_per_s * (1.0 - saved) / s.output_tokens_per_s


@dataclass(frozen=True)
class _Case:
    """What a rule reads: the window, what it is compared with, the thresholds."""

    s: Signals
    t: Thresholds
    baseline: Signals | None
    history: Sequence[Signals]
    prefix_caching: bool | None
    limits: BatchLimits
    routing: ReplicaRouting | None = None

    @property
    def previous(self) -> Signals | None:
        return self.history[-1] if self.history else None


# ---------------------------------------------------------------- the bound: the first rule that applies

_Bound = tuple[str, str, dict[str, float]]


def _kv_capacity(s: Signals, t: Thresholds) -> _Bound | None:
    kv, pre, waiting = s.kv_usage_mean, s.preemptions_per_s, s.waiting_mean
    if not (
        kv is not None
        and kv >= t.kv_full
        and ((pre is not None and pre > 0) or (waiting or 0) >= t.min_waiting)
    ):
        return None
    r = _present(s, "kv_usage_mean", "preemptions_per_s", "waiting_mean", "running_mean")
    return (
        KV_CAPACITY,
        f"KV pool {kv:.0%} used with preemptions or a queue: the batch is limited by KV memory",
        r,
    )


def _queueing(s: Signals, t: Thresholds) -> _Bound | None:
    waiting, running = s.waiting_mean, s.running_mean
    if not (
        waiting is not None and running is not None and waiting >= max(t.min_waiting, t.queue_ratio * running)
    ):
        return None
    r = _present(s, "waiting_mean", "running_mean", "kv_usage_mean", "ttft_p50_s")
    return (
        QUEUEING,
        f"{waiting:.1f} requests waiting on average against {running:.1f} running: arrivals exceed capacity",
        r,
    )


def _prefill_tokens(s: Signals, t: Thresholds) -> _Bound | None:
    ratio = computed_prefill_per_output_token(s)
    if not (ratio is not None and ratio >= t.prefill_token_ratio):
        return None
    r = {
        "computed_prefill_per_output_token": ratio,
        **_present(s, "input_tokens_per_s", "output_tokens_per_s", "prefill_reduction", "gpu_util"),
    }
    return (
        PREFILL,
        f"{ratio:.0f} prompt tokens are computed per output token: prefill is most of the GPU's work "
        "(prefill-bound; caching raises throughput)",
        r,
    )


def _time_share(s: Signals, t: Thresholds) -> _Bound | None:
    share = prefill_time_share(s)
    if share is None:
        return None
    r = {
        "prefill_time_share": share,
        **_present(s, "ttft_p50_s", "itl_p50_s", "output_tokens_per_s", "requests_per_s", "gpu_util"),
    }
    if share >= t.prefill_share:
        return (
            PREFILL,
            f"prefill takes {share:.0%} of a request's service time: "
            "prefill-bound (caching raises throughput)",
            r,
        )
    return (
        DECODE,
        f"decode takes {1 - share:.0%} of a request's service time: decode-bound (caching mostly cuts TTFT)",
        r,
    )


BOUND_RULES: tuple[Callable[[Signals, Thresholds], _Bound | None], ...] = (
    _kv_capacity,
    _queueing,
    _prefill_tokens,
    _time_share,
)


def _bound(s: Signals, t: Thresholds) -> _Bound:
    for rule in BOUND_RULES:
        found = rule(s, t)
        if found is not None:
            return found
    r = _present(s, "kv_usage_mean", "waiting_mean", "running_mean", "ttft_p50_s", "itl_p50_s")
    return UNKNOWN, "not enough latency and throughput signals to tell prefill from decode", r


# ---------------------------------------------------------------- findings: every rule that applies, in order


def _ttft_down_throughput_flat(c: _Case) -> Finding | None:
    if c.baseline is None:
        return None
    s, t = c.s, c.t
    ttft50 = _rel(s.ttft_p50_s, c.baseline.ttft_p50_s)
    thr = _rel(_throughput(s), _throughput(c.baseline))
    if not (ttft50 is not None and thr is not None and ttft50 <= -t.ttft_drop and thr < t.flat):
        return None
    return Finding(
        TTFT_DOWN_THROUGHPUT_FLAT,
        f"TTFT p50 {-ttft50:.0%} lower than the baseline but throughput {thr:+.0%}: serving is "
        "decode-bound; prefix caching saves prefill only",
        {"ttft_p50_change": ttft50, "throughput_change": thr, **_present(s, "hit_rate")},
    )


def _p99_stuck(c: _Case) -> Finding | None:
    if c.baseline is None:
        return None
    s, t = c.s, c.t
    ttft50 = _rel(s.ttft_p50_s, c.baseline.ttft_p50_s)
    ttft99 = _rel(s.ttft_p99_s, c.baseline.ttft_p99_s)
    if not (ttft50 is not None and ttft99 is not None and ttft50 <= -t.ttft_drop and ttft99 > -t.flat):
        return None
    return Finding(
        "p99-stuck",
        f"TTFT p50 {-ttft50:.0%} lower but p99 {ttft99:+.0%}: misses make the tail "
        "(long prefixes evicted, or always-missing requests such as new sessions)",
        {
            "ttft_p50_change": ttft50,
            "ttft_p99_change": ttft99,
            **_present(s, "ttft_p50_s", "ttft_p99_s", "hit_rate"),
        },
    )


def _miss_dominated_tail(c: _Case) -> Finding | None:
    """Without a baseline: a high hit rate with a p99 many times p50."""
    s, t, hr = c.s, c.t, c.s.hit_rate
    if c.baseline is not None:
        return None
    if not (hr is not None and hr >= t.high_hit_rate and s.ttft_p50_s and s.ttft_p99_s is not None):
        return None
    ratio = s.ttft_p99_s / s.ttft_p50_s
    if not ratio >= t.tail_ratio:
        return None
    return Finding(
        "miss-dominated-tail",
        f"hit rate {hr:.0%} yet TTFT p99 is {ratio:.1f}x p50: misses (evicted long prefixes, new "
        "sessions) make the tail",
        {"p99_over_p50": ratio, **_present(s, "hit_rate", "ttft_p50_s", "ttft_p99_s")},
    )


def _short_prefix_hits(c: _Case) -> Finding | None:
    hr, red, t = c.s.hit_rate, c.s.prefill_reduction, c.t
    if not (hr is not None and red is not None and hr >= t.high_hit_rate and red <= hr - t.reduction_gap):
        return None
    return Finding(
        "short-prefix-hits",
        f"hit rate {hr:.0%} but only {red:.0%} of prompt tokens skipped prefill: hits land on short prefixes",
        {"hit_rate": hr, "prefill_reduction": red},
    )


def _eviction_pressure(c: _Case) -> Finding | None:
    s, t, previous, hr = c.s, c.t, c.previous, c.s.hit_rate
    kv, pre = s.kv_usage_mean, s.preemptions_per_s
    if not (kv is not None and kv >= t.kv_full):
        return None
    falling = (
        previous is not None
        and previous.hit_rate is not None
        and hr is not None
        and previous.hit_rate - hr >= t.hit_rate_fall
    )
    if not ((pre is not None and pre > 0) or falling):
        return None
    r = _present(s, "kv_usage_mean", "preemptions_per_s", "hit_rate")
    if falling and previous is not None and previous.hit_rate is not None:
        r["previous_hit_rate"] = previous.hit_rate
    return Finding(
        "eviction-pressure",
        f"KV pool {kv:.0%} used"
        + (f", {pre:.2f} preemptions/s" if pre else "")
        + (", hit rate falling" if falling else "")
        + ": cached prefixes are being evicted",
        r,
    )


def _hit_rate_up_throughput_down(c: _Case) -> Finding | None:
    s, t, previous, hr = c.s, c.t, c.previous, c.s.hit_rate
    if previous is None or hr is None or previous.hit_rate is None:
        return None
    thr = _rel(_throughput(s), _throughput(previous))
    if not (hr - previous.hit_rate >= t.hit_rate_fall and thr is not None and thr <= -t.flat):
        return None
    r = {"hit_rate_change": hr - previous.hit_rate, "throughput_change": thr}
    r.update(_present(s, "running_max", "gpu_util"))
    return Finding(
        "hit-rate-up-throughput-down",
        f"hit rate up {hr - previous.hit_rate:+.2f} but throughput {thr:+.0%}: "
        "check the maximum batch and GPU utilization "
        "(the cache may be taking memory from the batch)",
        r,
    )


def _caching_earns_nothing(c: _Case) -> Finding | None:
    s, t, hr = c.s, c.t, c.s.hit_rate
    windows = [w.hit_rate for w in (*c.history, s) if w.hit_rate is not None]
    if not (
        c.prefix_caching is not False
        and hr is not None
        and windows
        and max(windows) < t.earns_nothing_hit_rate
    ):
        return None
    return Finding(
        "caching-earns-nothing",
        f"hit rate below {t.earns_nothing_hit_rate:.0%} in {len(windows)} window(s) "
        f"(max {max(windows):.0%}): "
        "the cache holds memory the batch could use; consider turning prefix caching off"
        + ("" if len(windows) > 1 else " (one window: confirm over more)"),
        {"hit_rate": hr, "max_hit_rate": max(windows), "windows": float(len(windows))},
    )


def _running_cap_binds(c: _Case) -> Finding | None:
    s, t, cap = c.s, c.t, c.limits.max_running
    running, kv, waiting = s.running_mean, s.kv_usage_mean, s.waiting_mean
    if not (
        cap
        and running is not None
        and running >= t.cap_share * cap
        and (s.running_max is None or s.running_max >= cap)
        and kv is not None
        and kv < t.kv_full
        and waiting is not None
        and waiting >= t.min_waiting
    ):
        return None
    return Finding(
        "running-cap-binds",
        f"running cap binds: {running:.0f} running on average against a cap of {cap}, KV usage {kv:.0%}, "
        f"queue {waiting:.1f}: requests wait for a batch slot while KV memory is free "
        "(a larger running cap admits them)",
        {
            "max_running": float(cap),
            **_present(s, "running_mean", "running_max", "kv_usage_mean", "waiting_mean"),
        },
    )


def _token_budget_itl_spikes(c: _Case) -> Finding | None:
    s, t, budget = c.s, c.t, c.limits.max_batched_tokens
    prompt = computed_prompt_per_request(s)
    if not (budget and prompt is not None and s.itl_p50_s and s.itl_p99_s is not None):
        return None
    ratio = s.itl_p99_s / s.itl_p50_s
    if not (ratio >= t.itl_tail_ratio and prompt >= t.chunk_share * budget):
        return None
    chunk = min(prompt, float(budget))
    return Finding(
        "token-budget-itl-spikes",
        f"token budget {budget}: ITL p99 {s.itl_p99_s * 1000:.0f} ms is {ratio:.1f}x p50 while each request "
        f"computes {prompt:.0f} prompt tokens: decode steps carry prefill chunks of up to {chunk:.0f} "
        "tokens (where chunks share steps with the decodes, as in vLLM, a smaller token budget cuts the "
        "spikes, at some TTFT)",
        {
            "max_batched_tokens": float(budget),
            "computed_prompt_per_request": prompt,
            "itl_p99_over_p50": ratio,
            **_present(s, "itl_p50_s", "itl_p99_s"),
        },
    )


def _token_budget_chunks_ttft(c: _Case) -> Finding | None:
    s, t, budget = c.s, c.t, c.limits.max_batched_tokens
    prompt = computed_prompt_per_request(s)
    if not (budget and prompt is not None and s.ttft_p50_s is not None and s.itl_p50_s):
        return None
    per_step = max(float(budget) - (s.running_mean or 0.0), 1.0)  # each running decode takes a token
    steps = prompt / per_step
    if not (steps >= t.many_steps and s.ttft_p50_s >= 0.5 * steps * s.itl_p50_s):
        return None
    return Finding(
        "token-budget-chunks-ttft",
        f"token budget {budget}: a request's {prompt:.0f} computed prompt tokens take {steps:.0f} steps of "
        f"the {per_step:.0f} tokens the running decodes leave, and TTFT p50 {s.ttft_p50_s:.2f} s is "
        f"{s.ttft_p50_s / s.itl_p50_s:.0f} steps: TTFT is mostly chunked prefill (a larger token budget "
        "cuts it, at some ITL)",
        {
            "max_batched_tokens": float(budget),
            "computed_prompt_per_request": prompt,
            "prefill_steps": steps,
            **_present(s, "ttft_p50_s", "itl_p50_s", "running_mean"),
        },
    )


def _routing_splits_cache(c: _Case) -> Finding | None:
    r, s, t = c.routing, c.s, c.t
    if r is None or r.replicas < 2 or r.policy not in PREFIX_BLIND or c.prefix_caching is False:
        return None
    single, measured = r.single_replica_hit_rate, s.hit_rate
    fix = (
        "a cache-aware router (sglang-router / vllm-router --policy cache_aware) or session affinity "
        "(consistent_hash) keeps them together"
    )
    readings = {"replicas": float(r.replicas), **_present(s, "hit_rate")}
    if single is None or measured is None:
        return Finding(
            "routing-splits-cache",
            f"{r.replicas} replicas behind {r.policy} routing: a session's turns and each hot prefix land "
            f"on any replica (no single-replica estimate to price it: `prefixtune twin whatif --replicas "
            f"{r.replicas} --sweep routing=...` gives one); {fix}",
            readings,
        )
    if single - measured < t.routing_gap:
        return None
    return Finding(
        "routing-splits-cache",
        f"{r.replicas} replicas behind {r.policy} routing: hit rate {measured:.0%} where one replica holding "
        f"the whole load's cache would reach {single:.0%} ({100 * (single - measured):.0f} points lost: a "
        f"session's turns and each hot prefix land on any replica); {fix}",
        {**readings, "single_replica_hit_rate": single, "routing_cost_points": 100 * (single - measured)},
    )


FINDING_RULES: tuple[Callable[[_Case], Finding | None], ...] = (
    _ttft_down_throughput_flat,
    _p99_stuck,
    _miss_dominated_tail,
    _short_prefix_hits,
    _eviction_pressure,
    _hit_rate_up_throughput_down,
    _caching_earns_nothing,
    _running_cap_binds,
    _token_budget_itl_spikes,
    _token_budget_chunks_ttft,
    _routing_splits_cache,
)


def diagnose(
    signals: Signals,
    *,
    baseline: Signals | None = None,
    history: Sequence[Signals] = (),
    thresholds: Thresholds | None = None,
    prefix_caching: bool | None = None,
    limits: BatchLimits | None = None,
    routing: ReplicaRouting | None = None,
) -> Diagnosis:
    """Diagnose one window. ``baseline``: the same workload with caching off or the previous config;
    ``history``: earlier windows of this config, oldest first (for trends and "stably");
    ``prefix_caching``: whether the measured config caches (False: a zero hit rate is no finding);
    ``limits``: the batch limits the measured config runs (None: no batch-limit findings);
    ``routing``: the replicas and their routing (None: no routing finding)."""
    t = thresholds or Thresholds()
    s = signals
    if s.requests is None or s.requests < t.min_requests:
        n = "none" if s.requests is None else f"{s.requests:.0f}"
        return Diagnosis(
            INSUFFICIENT,
            f"insufficient data: {n} requests finished in the window (need >= {t.min_requests:.0f})",
            _present(s, "requests", "window_s"),
            hit_rate=s.hit_rate,
            prefill_reduction=s.prefill_reduction,
        )
    bound, reason, readings = _bound(s, t)
    case = _Case(s, t, baseline, history, prefix_caching, limits or BatchLimits(), routing)
    findings = tuple(f for f in (rule(case) for rule in FINDING_RULES) if f is not None)
    if bound == UNKNOWN and any(f.code == TTFT_DOWN_THROUGHPUT_FLAT for f in findings):
        bound, reason = DECODE, "TTFT fell with caching while throughput stayed flat: decode-bound"
    return Diagnosis(
        bound, reason, readings, findings, hit_rate=s.hit_rate, prefill_reduction=s.prefill_reduction
    )
