"""Several replicas of one engine behind a router: ``simulate_replicas``, the core of ``twin run
--replicas N --routing POLICY``. Deterministic for a seed (only ``wall_seconds`` varies).

Each replica is its own ``TwinEngine`` (booted from the same command; replica ``i`` seeded ``seed +
i``), and the router model (``twin/router.py``) decides per request. When the policy reads loads
(``power_of_two``, ``cache_aware``) the replicas run in one virtual clock: before each arrival every
replica is advanced to it, and the router sees the requests in flight per replica (sent, not yet
finished or rejected), as the routers count them. The load-blind policies (kube-proxy, random,
round_robin, consistent_hash) decide the same whatever the replicas do, so each replica then runs on
its own share of the requests: the same result, faster.

The total summary merges the replicas: hit rate over all their cache queries, TTFT and ITL
percentiles over all requests, throughputs and goodput summed over one window (from the warm-up to
the last replica's end); ``kv_pool_tokens`` and ``mean_running`` are sums, ``max_running`` the
largest replica's, ``gpu_busy_fraction`` and ``kv_usage_mean`` means over the replicas.

``single_cache_hit_rate`` is the reference a router is measured against: the token hit rate one
cache with the replicas' pools together gets on the whole request stream (see its docstring);
``split_cache_hit_rate`` replays a router's per-replica streams (``ReplicaRun.routed``) through
one pool each in the same idle cache model, the like-for-like figure to hold against it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from prefixtune.engines.base import ParsedCommand
from prefixtune.routing.policy import ROUTER_NEEDS, EngineNeed
from prefixtune.twin.cache.base import KVCache
from prefixtune.twin.engine import TwinEngine, gc_paused
from prefixtune.twin.memory import StartupOOM
from prefixtune.twin.request import Request
from prefixtune.twin.router import RouterModel, RoutingConfig
from prefixtune.twin.run import SimOptions, engine_setup, parse_command, setup_of, snapshot, totals_between
from prefixtune.twin.summary import (
    EngineTotals,
    RunWindow,
    Summary,
    SummaryCollector,
    failed_summary,
    summarize,
)


@dataclass(frozen=True)
class ReplicaRun:
    """The result: the merged summary, one per replica, the router's share and decisions."""

    total: Summary
    replicas: tuple[Summary, ...]
    share: tuple[float, ...]
    routing: RoutingConfig
    decisions: Mapping[str, int] = field(default_factory=dict)
    evicted_tree_tokens: int = 0
    routed: tuple[tuple[Request, ...], ...] = ()  # the requests each replica was sent, in order

    def to_dict(self) -> dict[str, Any]:
        per = []
        for i, (s, share) in enumerate(zip(self.replicas, self.share, strict=True)):
            d = s.to_dict()
            d.pop("setup", None)
            per.append({"replica": i, "share": share, **d})
        return {
            "routing": {
                **self.routing.to_dict(),
                "replicas": len(self.replicas),
                "decisions": dict(self.decisions),
                "evicted_tree_tokens": self.evicted_tree_tokens,
            },
            "total": self.total.to_dict(),
            "replicas": per,
        }


@gc_paused()
def simulate_replicas(
    engine: str,
    argv: Sequence[str] | ParsedCommand,
    gpu: str,
    requests: Sequence[Request],
    replicas: int,
    routing: RoutingConfig,
    options: SimOptions | None = None,
) -> ReplicaRun:
    """Run ``requests`` through ``replicas`` twins of ``engine`` behind the router ``routing``.

    ``options`` as for ``simulate`` (seed, SLO, warm-up, horizon, how to read the command).
    """
    t0 = time.perf_counter()
    o = options if options is not None else SimOptions()
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1; got {replicas}")
    if o.warmup_s < 0:
        raise ValueError(f"warmup_s must be >= 0; got {o.warmup_s}")
    if o.horizon_s is not None and o.horizon_s <= o.warmup_s:
        raise ValueError(f"horizon_s ({o.horizon_s}) must be after warmup_s ({o.warmup_s})")
    parsed = parse_command(engine, argv, model=o.model, tp=o.tp, files=o.files)
    routing = served(routing, parsed)
    info = setup_of(parsed, gpu, o.seed, o.setup)
    info["warmup_s"] = float(o.warmup_s)
    info["horizon_s"] = None if o.horizon_s is None else float(o.horizon_s)
    info["replicas"] = replicas
    info["routing"] = routing.to_dict()
    collectors = [SummaryCollector(o.warmup_s) for _ in range(replicas)]
    try:
        engines = [
            TwinEngine(parsed, gpu, o.seed + i, c, cache_factory=o.cache_factory)
            for i, c in enumerate(collectors)
        ]
    except StartupOOM as exc:
        failed = failed_summary("oom_startup", str(exc), info, time.perf_counter() - t0)
        return ReplicaRun(failed, (failed,) * replicas, (0.0,) * replicas, routing)
    info.update(engine_setup(engines[0]))
    router = RouterModel(routing, replicas, o.seed)
    ordered = sorted(requests, key=attrgetter("arrival_s", "req_id"))
    horizon = math.inf if o.horizon_s is None else float(o.horizon_s)
    routed: list[list[Request]] = [[] for _ in range(replicas)]
    # the counters at the window's start: now without a warm-up, else when the clock reaches it
    c0 = None if o.warmup_s > 0 else [snapshot(e) for e in engines]
    routable = [r for r in ordered if r.arrival_s < horizon]  # later ones never arrive
    if routing.load_aware:
        for req in routable:
            t = req.arrival_s
            if c0 is None and t >= o.warmup_s:
                c0 = _advance_all(engines, o.warmup_s)
            for eng in engines:
                eng.advance(t)
            loads = [
                len(routed[i]) - eng.counters.finished - eng.counters.rejected
                for i, eng in enumerate(engines)
            ]
            i = router.route(req, loads, t).replica
            routed[i].append(req)
            engines[i].submit(req)
    else:
        zeros = [0] * replicas
        for req in routable:
            routed[router.route(req, zeros, req.arrival_s).replica].append(req)
        for eng, reqs in zip(engines, routed, strict=True):
            eng.submit_all(reqs)
    if c0 is None:
        c0 = _advance_all(engines, o.warmup_s)
    start = float(o.warmup_s) if o.warmup_s > 0 else 0.0
    for eng in engines:
        eng.advance(horizon)
    ends = [max(e.now, horizon) if (o.horizon_s is not None and e.status == "ok") else e.now for e in engines]
    end = max(ends)
    wall = time.perf_counter() - t0
    per: list[Summary] = []
    totals: list[EngineTotals] = []
    for i, eng in enumerate(engines):
        delta = totals_between(c0[i], snapshot(eng))
        totals.append(delta)
        window = _window(eng, routed[i], start, end)
        per.append(summarize(collectors[i], window, delta, o.slo, {"replica": i}, wall))
    total = summarize(
        _merged(collectors, o.warmup_s),
        _merged_window(engines, ordered, start, end),
        _merged_totals(totals),
        o.slo,
        info,
        time.perf_counter() - t0,
    )
    return ReplicaRun(
        total,
        tuple(per),
        tuple(router.share()),
        routing,
        {str(k): v for k, v in sorted(router.decisions.items())},
        router.evicted_tokens,
        tuple(tuple(r) for r in routed),
    )


def served(routing: RoutingConfig, parsed: ParsedCommand) -> RoutingConfig:
    """``routing`` as the engines behind it let it see: a router that matches token ids
    (``ROUTER_NEEDS``) gets none from engines whose command does not serve them (vLLM without
    ``--enable-scale-out``), and its cache_aware then routes by load alone."""
    needs_tokens = EngineNeed.TOKEN_IDS in ROUTER_NEEDS[routing.low_match]
    if needs_tokens and routing.tokens and not parsed.options.render_routes:
        return replace(routing, tokens=False)
    return routing


def _advance_all(engines: Sequence[TwinEngine], t: float) -> list[dict[str, float]]:
    for eng in engines:
        eng.advance(t)
    return [snapshot(e) for e in engines]


def _window(eng: TwinEngine, reqs: Sequence[Request], start: float, end: float) -> RunWindow:
    return RunWindow(
        status=eng.status,
        start_s=start,
        end_s=end,
        arrived=sum(1 for r in reqs if start <= r.arrival_s <= end),
        rejected=int(eng.counters.rejected),
        max_running=int(eng.counters.max_running),
        kv_pool_tokens=int(eng.memory.pool_tokens),
        error=eng.oom_reason,
    )


def _merged_window(
    engines: Sequence[TwinEngine], reqs: Sequence[Request], start: float, end: float
) -> RunWindow:
    dead = [e for e in engines if e.status != "ok"]
    return RunWindow(
        status=dead[0].status if dead else "ok",
        start_s=start,
        end_s=end,
        arrived=sum(1 for r in reqs if start <= r.arrival_s <= end),
        rejected=sum(int(e.counters.rejected) for e in engines),
        max_running=max(int(e.counters.max_running) for e in engines),
        kv_pool_tokens=sum(int(e.memory.pool_tokens) for e in engines),
        error=dead[0].oom_reason if dead else "",
    )


def _merged(collectors: Sequence[SummaryCollector], warmup_s: float) -> SummaryCollector:
    out = SummaryCollector(warmup_s)
    for c in collectors:
        out.done.extend(c.done)
        out.gaps.extend(c.gaps)
        out.ttfts.extend(c.ttfts)
        out.window_tokens += c.window_tokens
    return out


def _merged_totals(totals: Sequence[EngineTotals]) -> EngineTotals:
    n = len(totals)
    return EngineTotals(
        hit_tokens=sum(t.hit_tokens for t in totals),
        query_tokens=sum(t.query_tokens for t in totals),
        saved_prefill_tokens=sum(t.saved_prefill_tokens for t in totals),
        prompt_tokens=sum(t.prompt_tokens for t in totals),
        busy_s=sum(t.busy_s for t in totals) / n,  # mean over replicas: gpu_busy_fraction per replica
        running_integral=sum(t.running_integral for t in totals),
        kv_usage_integral=sum(t.kv_usage_integral for t in totals) / n,
        preemptions=sum(t.preemptions for t in totals),
        waiting_integral=sum(t.waiting_integral for t in totals),
    )


@gc_paused()
def single_cache_hit_rate(
    engine: str,
    argv: Sequence[str] | ParsedCommand,
    gpu: str,
    requests: Sequence[Request],
    pool_multiple: int,
    options: SimOptions | None = None,
) -> float:
    """The token hit rate of ONE cache ``pool_multiple`` times the engine's KV pool, fed the whole
    request stream: what a single replica holding the whole load's cache would hit.

    The engine's own cache model (block size, partial reuse, eviction as booted from ``argv``), with
    each request admitted, committed (its prompt and output, as a finished request leaves them) and
    released in arrival order: an idle server, so no request holds blocks while another looks up.
    That is the cache of one replica fast enough to serve the whole load with few requests in
    flight; N loaded replicas hit less on the same streams whatever the router does, because their
    running requests hold part of each pool (``split_cache_hit_rate`` is the like-for-like figure
    for a router's split). Only requests arriving at or after ``options.warmup_s`` count, as in the
    measured window. A single engine at the whole load is not what is compared: one GPU cannot
    serve four replicas' traffic, and its queue would decide its figures.
    """
    if pool_multiple < 1:
        raise ValueError(f"pool_multiple must be >= 1; got {pool_multiple}")
    return split_cache_hit_rate(engine, argv, gpu, [requests], options, pool_multiple)


def split_cache_hit_rate(
    engine: str,
    argv: Sequence[str] | ParsedCommand,
    gpu: str,
    parts: Sequence[Sequence[Request]],
    options: SimOptions | None = None,
    pool_multiple: int = 1,
) -> float:
    """The token hit rate of the request streams ``parts``, each through its own idle cache of
    ``pool_multiple`` times the engine's KV pool (as ``single_cache_hit_rate`` replays one stream):
    hit tokens over query tokens, summed over the parts.

    With a router's per-replica streams (``ReplicaRun.routed``) this is what its split of the load
    costs the cache, on the same footing as the single cache it is compared with: the same cache
    model, idle, so the load's own cost (running requests holding blocks) is in neither figure.
    """
    if pool_multiple < 1:
        raise ValueError(f"pool_multiple must be >= 1; got {pool_multiple}")
    o = options if options is not None else SimOptions()
    parsed = parse_command(engine, argv, model=o.model, tp=o.tp, files=o.files)
    from prefixtune.twin.cache import make_cache

    def bigger(name: str, num_blocks: int, block_size: int, prefix_caching: bool, **opts: Any) -> KVCache:
        return make_cache(name, num_blocks * pool_multiple, block_size, prefix_caching, **opts)

    hit = query = 0
    for part in parts:
        cache = TwinEngine(parsed, gpu, o.seed, cache_factory=bigger).cache
        h, q = _idle_replay(cache, part, o.warmup_s)
        hit, query = hit + h, query + q
    return float(hit / query) if query else 0.0


def _idle_replay(cache: KVCache, requests: Sequence[Request], warmup_s: float) -> tuple[int, int]:
    """(hit, query) tokens of ``requests`` arriving at or after ``warmup_s``, replayed through
    ``cache`` one at a time in arrival order (admitted, committed whole, released)."""
    base: tuple[int, int] | None = None
    for i, r in enumerate(sorted(requests, key=attrgetter("arrival_s", "req_id"))):
        if base is None and r.arrival_s >= warmup_s:
            base = (cache.stats.hit_tokens, cache.stats.query_tokens)
        tokens = r.prompt_len + r.output_len - 1  # the last output token's KV is never computed
        if cache.admit(i, r.seq, r.prompt_len, tokens, r.arrival_s) is None:
            continue  # larger than the whole pool
        cache.commit(i, tokens, r.arrival_s)
        cache.release(i, r.arrival_s)
    hit0, query0 = base if base is not None else (cache.stats.hit_tokens, cache.stats.query_tokens)
    return cache.stats.hit_tokens - hit0, cache.stats.query_tokens - query0
