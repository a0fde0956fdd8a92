"""Batch simulation: boot a twin engine, replay requests, return a ``Summary``.

``simulate(engine, argv_or_parsed, gpu, requests, SimOptions(seed=..., ...))`` is the pure core of
``twin run`` and of the benchmarks (deterministic for a seed: only ``wall_seconds`` varies).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from prefixtune.engines.base import ArgsError, ParsedCommand
from prefixtune.twin.engine import CacheFactory, TwinEngine, gc_paused
from prefixtune.twin.memory import StartupOOM
from prefixtune.twin.request import Request
from prefixtune.twin.summary import (
    EngineTotals,
    GoodputSlo,
    RunWindow,
    Summary,
    SummaryCollector,
    failed_summary,
    summarize,
)


def parse_command(
    engine: str,
    argv: Sequence[str] | ParsedCommand,
    *,
    model: str | None = None,
    tp: int | None = None,
    files: Mapping[str, str] | None = None,
) -> ParsedCommand:
    """A ParsedCommand from a full command line, from engine flags added to the default command for
    ``model`` (flags given later win), or as given. Raises ArgsError."""
    if isinstance(argv, ParsedCommand):
        return argv
    from prefixtune.engines import get_adapter

    adapter = get_adapter(engine)
    args = [str(a) for a in argv]
    default_cmd = None
    if model is not None:
        default_cmd = adapter.render(model, adapter.default_config(), tensor_parallel=tp or 1)
    if default_cmd is not None and args[: len(default_cmd.command)] == list(default_cmd.command):
        full = args  # a whole command line
    elif default_cmd is not None:
        full = list(default_cmd.argv) + args
        files = {**default_cmd.files, **(files or {})}
    else:
        full = args
    if not full:
        raise ArgsError("no engine command: give --model (and optional engine flags) or a full command")
    parsed = adapter.parse(full, files)
    if tp is not None and parsed.tensor_parallel != tp:
        raise ArgsError(
            f"--tp {tp} disagrees with the engine flags (tensor parallel {parsed.tensor_parallel}); give one"
        )
    return parsed


def setup_of(
    parsed: ParsedCommand, gpu: str, seed: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    setup: dict[str, Any] = {
        "engine": str(parsed.engine),
        "model": parsed.model,
        "gpu": gpu,
        "tp": int(parsed.tensor_parallel),
        "config": parsed.config.to_dict(),
        "options": {str(k): _plain(v) for k, v in parsed.options.items()},
        "seed": int(seed),
    }
    if extra:
        setup.update(extra)
    return setup


def _plain(v: object) -> object:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    return str(v)


@dataclass(frozen=True)
class SimOptions:
    """How one ``simulate`` run is set up, beyond the engine, its command, the GPU and the requests.

    ``model``, ``tp`` and ``files`` say how to read the command (``parse_command``); ``slo`` is what
    goodput counts against; ``warmup_s`` and ``horizon_s`` bound the measured window;
    ``cache_factory`` replaces the engine's cache model; ``setup`` is added to the summary's setup.
    """

    seed: int = 0
    slo: GoodputSlo = field(default_factory=GoodputSlo)
    warmup_s: float = 0.0
    horizon_s: float | None = None
    model: str | None = None
    tp: int | None = None
    files: Mapping[str, str] | None = None
    cache_factory: CacheFactory | None = None
    setup: Mapping[str, Any] | None = None


# The cyclic collector stays off for the whole run (see gc_paused) and comes back once simulate has
# returned, when the engine is gone: its objects die by reference counting instead of being scanned.
@gc_paused()
def simulate(
    engine: str,
    argv: Sequence[str] | ParsedCommand,
    gpu: str,
    requests: Sequence[Request],
    options: SimOptions | None = None,
) -> Summary:
    """Run ``requests`` through a twin of ``engine`` booted from ``argv`` on ``gpu``.

    Without ``horizon_s`` the run lasts until every request is done; with it, until ``horizon_s``
    (requests still running then are not counted as finished). Metrics cover ``[warmup_s, end]``.
    """
    t0 = time.perf_counter()
    o = options if options is not None else SimOptions()
    seed, warmup_s, horizon_s = o.seed, o.warmup_s, o.horizon_s
    parsed = parse_command(engine, argv, model=o.model, tp=o.tp, files=o.files)
    info = setup_of(parsed, gpu, seed, o.setup)
    info["warmup_s"] = float(warmup_s)
    info["horizon_s"] = None if horizon_s is None else float(horizon_s)
    if warmup_s < 0:
        raise ValueError(f"warmup_s must be >= 0; got {warmup_s}")
    if horizon_s is not None and horizon_s <= warmup_s:
        raise ValueError(f"horizon_s ({horizon_s}) must be after warmup_s ({warmup_s})")
    collector = SummaryCollector(warmup_s)
    try:
        eng = TwinEngine(parsed, gpu, seed, collector, cache_factory=o.cache_factory)
    except StartupOOM as exc:
        return failed_summary("oom_startup", str(exc), info, time.perf_counter() - t0)
    info.update(engine_setup(eng))
    eng.submit_all(sorted(requests, key=attrgetter("arrival_s", "req_id")))
    if warmup_s > 0:
        eng.advance(warmup_s)
    start = eng.now if warmup_s > 0 else 0.0
    c0 = snapshot(eng)
    end_target = math.inf if horizon_s is None else float(horizon_s)
    eng.advance(end_target)
    end = eng.now
    if horizon_s is not None and eng.status == "ok":
        end = max(end, float(horizon_s))
    c1 = snapshot(eng)
    arrived = sum(1 for r in requests if start <= r.arrival_s <= end)
    window = RunWindow(
        status=eng.status,
        start_s=start,
        end_s=end,
        arrived=arrived,
        rejected=int(eng.counters.rejected),
        max_running=int(eng.counters.max_running),
        kv_pool_tokens=int(eng.memory.pool_tokens),
        error=eng.oom_reason,
    )
    return summarize(collector, window, totals_between(c0, c1), o.slo, info, time.perf_counter() - t0)


def engine_setup(eng: TwinEngine) -> dict[str, Any]:
    """What a summary's setup says about a booted engine: memory plan, cost model, batch limits."""
    return {
        "memory": eng.memory.to_dict(),
        "cost_source": eng.cost.source.value,
        "cost_provenance": eng.cost.provenance,
        "limits": {
            "max_running": int(eng.max_running),
            "max_batched_tokens": int(eng.limits.max_batched_tokens),
            "chunked_prefill": bool(eng.limits.chunked_prefill),
            "schedule_policy": eng.policy,
        },
    }


def totals_between(c0: Mapping[str, float], c1: Mapping[str, float]) -> EngineTotals:
    """The engine's counter deltas between two ``snapshot``s."""
    d = {k: c1[k] - c0[k] for k in c0}
    return EngineTotals(
        hit_tokens=int(d["hit_tokens"]),
        query_tokens=int(d["query_tokens"]),
        saved_prefill_tokens=int(d["saved_prefill_tokens"]),
        prompt_tokens=int(d["prompt_tokens"]),
        busy_s=float(d["busy_s"]),
        running_integral=float(d["running_integral"]),
        kv_usage_integral=float(d["kv_usage_integral"]),
        waiting_integral=float(d["waiting_integral"]),
        preemptions=int(d["preemptions"]),
    )


def snapshot(eng: TwinEngine) -> dict[str, float]:
    """The engine's cumulative counters now (``totals_between`` takes the difference of two)."""
    c = eng.counters
    st = eng.cache.stats
    return {
        "hit_tokens": float(st.hit_tokens),
        "query_tokens": float(st.query_tokens),
        "saved_prefill_tokens": float(c.saved_prefill_tokens),
        "prompt_tokens": float(c.prompt_tokens),
        "busy_s": c.busy_s,
        "running_integral": c.running_integral,
        "kv_usage_integral": c.kv_usage_integral,
        "waiting_integral": c.waiting_integral,
        "preemptions": float(c.preemptions),
        "rejected": float(c.rejected),
    }
