"""``prefixtune bench goodput``: how well the goodput the operator reads from an engine's histograms
matches the requests the twin served.

For each scenario of the named suite (or those given), load (a fraction of the scenario's rate) and
seed, the deployed config's twin runs the scenario's warm-up and window, and its exporter is scraped
at both ends as the operator scrapes a pod. Reported, per histogram the estimate reads (TTFT and the
per-request TPOT): the exact share of the window's observations within the SLO target, and the
share read from the buckets linearly (``share_at_most``, ``histogram_fraction``'s reading) and by the
monotone cubic in log(bound) the operator uses (``share_within``); and per window the operator's
whole estimate (``slo_attainment``; also as from per-token gaps, an engine's fallback) against the
twin's own count of the finished requests within both targets (which differs by more than the
buckets: the TTFT histogram counts the first tokens of the window, the twin the requests that
finished in it).

    prefixtune bench goodput --loads 1.0,0.3 --seeds 3 --output docs/bench-results/goodput.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bench.tuner import Scenario, suite
from prefixtune.engines import get_adapter
from prefixtune.metrics.exposition import parse
from prefixtune.metrics.histogram import Bucket, Slo, share_at_most, share_within
from prefixtune.metrics.recipe import for_engine
from prefixtune.metrics.scrape_source import window_buckets, window_signals
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.exporter import EngineExporter, tpot
from prefixtune.twin.observer import FanOut, NullObserver
from prefixtune.twin.request import Request
from prefixtune.twin.summary import SummaryCollector
from prefixtune.twin.workloads import generate, parse_workload

SHARES = ("ttft", "tpot")


class _Observed(NullObserver):
    """The values the exporter's TTFT and per-request TPOT histograms observe once switched on."""

    def __init__(self) -> None:
        self.on = False
        self.values: dict[str, list[float]] = {name: [] for name in SHARES}

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        if self.on:
            self.values["ttft"].append(ttft_s)

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        if self.on and req.output_len > 1:
            self.values["tpot"].append(tpot(decode_s, req.output_len))


def window(sc: Scenario, load: float, seed: int) -> dict[str, Any]:
    """One window of the deployed config at ``load`` x the scenario's rate: the shares and the
    attainment, exact and as read from the histograms."""
    adapter = get_adapter(sc.engine)
    slo = Slo(sc.slo.ttft_p99_s, sc.slo.itl_p99_s)
    rendered = adapter.render(sc.model, sc.start_config(), ttft_slo_s=slo.ttft_p99_s, itl_slo_s=slo.itl_p99_s)
    parsed = adapter.parse(rendered.argv, rendered.files)
    start, end = sc.warmup_s, sc.warmup_s + sc.measure_s
    exporter = EngineExporter(adapter.name, sc.model, parsed=parsed, start_time=0.0)
    observed, served = _Observed(), SummaryCollector(start)
    eng = TwinEngine(parsed, sc.gpu, seed, FanOut([exporter, observed, served]))
    exporter.bind(
        eng.gauges, lambda: eng.cache.stats, eng.model.kv_bytes_per_token(eng.limits.kv_cache_dtype)
    )
    workload = sc.workload if isinstance(sc.workload, str) else parse_workload(sc.workload)
    eng.submit_all(generate(workload, rate=sc.rate * load, duration_s=end + 60.0, seed=seed))
    eng.advance(start)
    first = parse(exporter.render().decode(), target="p", t=start)
    observed.on = True
    eng.advance(end)
    last = parse(exporter.render().decode(), target="p", t=end)
    recipe = for_engine(sc.engine)
    row: dict[str, Any] = {}
    for name, target in (("ttft", slo.ttft_p99_s), ("tpot", slo.itl_p99_s)):
        series = getattr(recipe, name)
        buckets: tuple[Bucket, ...] = window_buckets([first, last], series) if series else ()
        values = observed.values[name]
        row[name] = {
            "target_s": target,
            "observations": len(values),
            "exact": sum(v <= target for v in values) / len(values) if values else None,
            "linear": share_at_most(target, buckets),
            "cubic": share_within(target, buckets),
        }
    done = [d for d in served.done if start <= d.end_s <= end]
    within = [d for d in done if d.ttft_s <= slo.ttft_p99_s and d.tpot_s <= slo.itl_p99_s]
    chain = {"p": [first, last]}
    row["attainment"] = {
        "twin": len(within) / len(done) if done else None,
        "estimate": window_signals(recipe, chain, slo=slo).signals.slo_attainment,
        # what an engine without a per-request TPOT histogram gives: the ITL test per token
        "estimate_from_gaps": window_signals(
            replace(recipe, tpot=None), chain, slo=slo
        ).signals.slo_attainment,
        "finished": len(done),
    }
    return row


def _errors(rows: Sequence[dict[str, Any]], how: str) -> list[float]:
    return [
        abs(r[name][how] - r[name]["exact"])
        for r in rows
        for name in SHARES
        if r[name]["exact"] is not None and r[name][how] is not None
    ]


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="prefixtune bench goodput", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append", help="a scenario of the named suite (default: all)")
    p.add_argument("--loads", default="1.0,0.3", help="fractions of each scenario's rate, comma-separated")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--output", help="also write the JSON here")
    args = p.parse_args(list(argv))
    named = suite()
    unknown = [s for s in args.scenario or () if s not in named]
    if unknown:
        print(
            f"prefixtune bench goodput: unknown scenario(s) {unknown}; known: {sorted(named)}",
            file=sys.stderr,
        )
        return 2
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        print(f"prefixtune bench goodput: --loads {args.loads!r}: numbers, comma-separated", file=sys.stderr)
        return 2
    if args.seeds < 1 or any(not 0 < x <= 4 for x in loads):
        print("prefixtune bench goodput: --seeds >= 1 and every load in (0, 4]", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = []
    for name in args.scenario or sorted(named):
        for load in loads:
            for seed in range(args.seeds):
                rows.append({"scenario": name, "load": load, "seed": seed, **window(named[name], load, seed)})
    linear, cubic = _errors(rows, "linear"), _errors(rows, "cubic")
    attainment = [
        abs(r["attainment"]["estimate"] - r["attainment"]["twin"])
        for r in rows
        if r["attainment"]["estimate"] is not None and r["attainment"]["twin"] is not None
    ]
    result = {
        "setup": {
            "what": "the deployed config of each scenario, its warm-up and window, scraped at both ends",
            "loads": loads,
            "seeds": args.seeds,
            "scenarios": sorted({r["scenario"] for r in rows}),
            "wall_s": round(time.perf_counter() - t0, 1),
        },
        "summary": {
            "share_error_linear": {
                "max": max(linear, default=0.0),
                "mean": sum(linear) / max(1, len(linear)),
            },
            "share_error_cubic": {"max": max(cubic, default=0.0), "mean": sum(cubic) / max(1, len(cubic))},
            "attainment_error": {
                "max": max(attainment, default=0.0),
                "mean": sum(attainment) / max(1, len(attainment)),
            },
        },
        "windows": rows,
    }
    text = json.dumps(result, indent=1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0
