"""``prefixtune twin whatif``: sweep knobs through the digital twin before touching production.

    prefixtune twin whatif --engine vllm --model meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB \\
        --workload chatbot --rate 20 --duration 120 \\
        --sweep memory_fraction=0.5,0.7,0.9 --sweep block_size=16,64 --out whatif/

Runs the twin once per point of the cartesian product of the sweeps (other knobs at the engine's
defaults), in parallel processes, and writes ``results.json`` plus one PNG per swept knob (hit rate,
TTFT p99 and goodput against it; for the batch limits TTFT p50/p99, ITL p99 and goodput; infeasible
points, out of memory at start or under load, marked) and, when exactly two names are swept over
several values each, a map of the grid (each cell's status and goodput: the OOM boundary).
Values are checked against the engine adapter's knob specs before anything runs. The table judges
each row against the SLO, marks the best (``best_index``) and the overloaded (``overloaded``).

Besides the knobs (the batch limits among them: ``max_batched_tokens``, the step token budget, and
``max_running``, the running-request cap), ``chunked_prefill`` sweeps on every engine as an option
set on the parsed command (``OPTION_SPECS``), as the engine's own flag would set it
(``--enable-chunked-prefill``, ``--chunked-prefill-size -1``, ``enable_chunked_prefill``): it decides
what the token budget does to a long prompt.

``routing`` sweeps the router in front of ``--replicas N`` replicas (``twin/replicas.py``;
``--sweep routing=kube-proxy,random,cache_aware``; the thresholds from ``--cache-threshold`` etc.):
each row is then the replicas' total, with each replica's request share, hit rate, TTFT and goodput
under ``replicas`` in results.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from prefixtune.engines._common import CHUNKED_PREFILL
from prefixtune.engines.base import (
    KNOB_NAMES,
    ArgsError,
    EngineAdapter,
    EngineOptions,
    KnobConfig,
    KnobSpec,
)
from prefixtune.engines.knobs import MAX_BATCHED_TOKENS, MAX_RUNNING
from prefixtune.routing.policy import RoutingPolicy
from prefixtune.twin.cliargs import add_routing_args, add_target_args, add_workload_source, routing_config
from prefixtune.twin.request import Request

if TYPE_CHECKING:
    from prefixtune.twin.router import RoutingConfig

RESULTS_JSON = "results.json"
DEFAULT_SLO_TTFT_S = 2.0  # the API's default spec.tuning.slo
DEFAULT_SLO_ITL_S = 0.15
_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}
TABLE_KEYS = (
    "status",
    "hit_rate",
    "ttft_p50_s",
    "ttft_p99_s",
    "itl_p99_s",
    "goodput_tokens_per_s",
    "output_tokens_per_s",
)
# The tuner's default objective (tuning.objective, spec.tuning.objective: goodput): output tokens/s
# of requests that met both SLOs, which the twin measures per request (basis goodput_tokens_per_s).
BEST_OBJECTIVE = "goodput"
BEST_KEY = "goodput_tokens_per_s"
BEST_MARK = "<- best"
OVERLOADED_MARK = "OVERLOADED"


# Engine options sweepable beside the knobs, by their engine-neutral names (``EngineOptions``):
# chunked prefill, which decides what the token budget does to a long prompt.
OPTION_SPECS: Mapping[str, KnobSpec] = {
    CHUNKED_PREFILL: KnobSpec(
        name=CHUNKED_PREFILL,
        default=True,
        choices=(True, False),
        doc="split long prompts across steps (vLLM and SGLang on by default, TensorRT-LLM off)",
    ),
}
BATCH_LIMITS = frozenset({MAX_BATCHED_TOKENS, MAX_RUNNING})
OptionValue = int | bool
# The router in front of the replicas, sweepable on every engine (needs --replicas >= 2).
ROUTING = "routing"
ROUTING_SPEC = KnobSpec(
    name=ROUTING,
    default=str(RoutingPolicy.KUBE_PROXY),
    choices=tuple(str(p) for p in RoutingPolicy),
    doc="how requests are spread over --replicas replicas (twin/router.py)",
)
# Per-replica figures a routing row keeps (results.json ``replicas``).
REPLICA_KEYS = ("share", "hit_rate", "ttft_p50_s", "ttft_p99_s", "goodput_tokens_per_s", "requests")


class SweepError(ValueError):
    """A --sweep that names an unknown knob or a value the engine does not accept."""


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: the knob config and the engine options set beside it (by neutral name)."""

    config: KnobConfig
    options: Mapping[str, OptionValue] = field(default_factory=dict)
    routing: RoutingPolicy | None = None  # None: the run's --routing

    def values(self) -> dict[str, Any]:
        """The swept names' values as the results show them: the knobs, the options, the routing."""
        routing = {} if self.routing is None else {ROUTING: str(self.routing)}
        return {**self.config.to_dict(), **self.options, **routing}


def sweepable(knobs: Mapping[str, KnobSpec]) -> dict[str, KnobSpec]:
    """What ``--sweep`` accepts on an engine: its knobs, the options it has no knob for, the routing."""
    return {
        **knobs,
        **{name: spec for name, spec in OPTION_SPECS.items() if name not in knobs},
        ROUTING: ROUTING_SPEC,
    }


def _parse_value(spec: KnobSpec, text: str) -> float | int | bool | str:
    kind = type(spec.default)
    t = text.strip()
    if kind is bool:
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise SweepError(f"--sweep {spec.name}: {t!r} is not a boolean; use true/false (or on/off)")
    if kind is int:
        try:
            return int(t)
        except ValueError:
            raise SweepError(f"--sweep {spec.name}: {t!r} is not an integer") from None
    if kind is float:
        try:
            return float(t)
        except ValueError:
            raise SweepError(f"--sweep {spec.name}: {t!r} is not a number") from None
    return t


def parse_sweep(text: str, knobs: Mapping[str, KnobSpec]) -> tuple[str, list[float | int | bool | str]]:
    """``KNOB=V1,V2,...`` -> (knob, values), each value checked by the engine's knob spec."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name or not raw.strip():
        raise SweepError(f"--sweep must be KNOB=V1,V2,... (knobs: {', '.join(KNOB_NAMES)}); got {text!r}")
    if name not in knobs:
        raise SweepError(f"--sweep: unknown knob {name!r}; choose from {', '.join(knobs)}")
    spec = knobs[name]
    values: list[float | int | bool | str] = []
    for item in raw.split(","):
        if not item.strip():
            raise SweepError(f"--sweep {name}: empty value in {raw!r}")
        value = _parse_value(spec, item)
        problem = spec.validate(value)
        if problem is not None:
            raise SweepError(f"--sweep {name}: {problem}")
        if value in values and type(value) is type(values[values.index(value)]):
            raise SweepError(f"--sweep {name}: value {value!r} given twice")
        values.append(value)
    return name, values


def grid(
    adapter: EngineAdapter, sweeps: Sequence[tuple[str, Sequence[float | int | bool | str]]]
) -> list[SweepPoint]:
    """The cartesian product of the sweeps over the engine's default config, in sweep order; the
    names that are not the engine's knobs (``OPTION_SPECS``) become the points' options."""
    names = [n for n, _ in sweeps]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SweepError(f"--sweep given more than once for {', '.join(dupes)}; list all values in one")
    knobs = adapter.knobs()
    base = adapter.default_config()
    points = []
    for combo in itertools.product(*(values for _, values in sweeps)):
        chosen = dict(zip(names, combo, strict=True))
        config = base.with_(**{n: v for n, v in chosen.items() if n in knobs})
        problems = adapter.validate(config)
        if problems:
            text = "; ".join(f"{k}: {m}" for k, m in problems)
            raise SweepError(f"--sweep: the combination {config.to_dict()} is not valid: {text}")
        options = {n: v for n, v in chosen.items() if n not in knobs and isinstance(v, int)}
        routing = RoutingPolicy(str(chosen[ROUTING])) if ROUTING in chosen else None
        points.append(SweepPoint(config, options, routing))
    return points


# --- running points (in worker processes) ---------------------------------------------------------

_REQUESTS: list[Request] = []


def _init_worker(requests: list[Request]) -> None:
    global _REQUESTS
    _REQUESTS = requests


def run_point(
    engine: str,
    model: str,
    gpu: str,
    config: Mapping[str, Any],
    options: Mapping[str, Any],
    requests: Sequence[Request] | None = None,
    engine_options: Mapping[str, OptionValue] | None = None,
    routing: str | None = None,
) -> dict[str, Any]:
    """One twin run of ``config`` (a KnobConfig dict) with ``engine_options`` set on the parsed
    command (neutral option names, ``OPTION_SPECS``); the summary as plain values, the effective
    batch limits under ``limits``. With ``options["replicas"]`` >= 2, that many replicas behind the
    router ``routing`` (a policy name; None: ``options["routing"]``), its settings from
    ``options["router"]`` (``RoutingConfig.to_dict``): the total, and ``replicas`` (``REPLICA_KEYS``)."""
    from prefixtune.engines import get_adapter
    from prefixtune.twin.run import SimOptions, parse_command, simulate
    from prefixtune.twin.summary import GoodputSlo

    adapter = get_adapter(engine)
    knobs = KnobConfig.from_dict(config)
    rendered = adapter.render(model, knobs, tensor_parallel=int(options.get("tp") or 1))
    parsed = parse_command(engine, list(rendered.argv), files=rendered.files)
    if engine_options:
        parsed = replace(parsed, options=EngineOptions({**parsed.options, **engine_options}))
    sim = SimOptions(
        seed=int(options.get("seed", 0)),
        slo=GoodputSlo(ttft_s=options.get("slo_ttft_s"), itl_s=options.get("slo_itl_s")),
        warmup_s=float(options.get("warmup_s", 0.0)),
    )
    reqs = _REQUESTS if requests is None else requests
    replicas = int(options.get("replicas", 1))
    swept = {} if routing is None else {ROUTING: routing}
    per: list[dict[str, Any]] | None = None
    if replicas > 1:
        from prefixtune.twin.replicas import simulate_replicas

        settings = dict(options.get("router") or {})
        policy = RoutingPolicy(routing or settings.get("policy") or RoutingPolicy.KUBE_PROXY)
        run = simulate_replicas(engine, parsed, gpu, reqs, replicas, _router(engine, policy, settings), sim)
        summary = run.total
        per = [{k: r[k] for k in REPLICA_KEYS} for r in run.to_dict()["replicas"]]
    else:
        summary = simulate(engine, parsed, gpu, reqs, sim)
    data = summary.to_dict()
    setup = data.pop("setup", None) or {}
    limits = setup.get("limits")
    if limits is not None:
        data["limits"] = limits
    if per is not None:
        data["replicas"] = per
    return {"config": {**knobs.to_dict(), **(engine_options or {}), **swept}, **data}


def _router(engine: str, policy: RoutingPolicy, settings: Mapping[str, Any]) -> RoutingConfig:
    """The ``RoutingConfig`` of ``policy`` with the run's router settings (``RoutingConfig.to_dict``;
    the router: the one the operator renders for ``engine`` unless they name one)."""
    from prefixtune.engines.base import EngineName
    from prefixtune.routing.policy import CacheAwareThresholds, Router
    from prefixtune.routing.settings import ENGINE_ROUTER
    from prefixtune.twin.router import RoutingConfig

    d = CacheAwareThresholds()
    return RoutingConfig(
        policy=policy,
        thresholds=CacheAwareThresholds(
            cache_threshold=float(settings.get("cache_threshold", d.cache_threshold)),
            balance_abs_threshold=int(settings.get("balance_abs_threshold", d.balance_abs_threshold)),
            balance_rel_threshold=float(settings.get("balance_rel_threshold", d.balance_rel_threshold)),
        ),
        low_match=Router(settings.get("low_match", ENGINE_ROUTER[EngineName(engine)])),
        max_tree_size=settings.get("max_tree_size"),
        tokens=bool(settings.get("tokens", True)),
    )


def _name(point: SweepPoint) -> str | None:
    return None if point.routing is None else str(point.routing)


def progress_bar(done: int, total: int, width: int = 30) -> str:
    filled = round(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def run_sweep(
    engine: str,
    model: str,
    gpu: str,
    configs: Sequence[KnobConfig | SweepPoint],
    requests: list[Request],
    options: Mapping[str, Any],
    *,
    jobs: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every point through the twin (``jobs`` processes; 1: in this process); results in point order.
    A bare KnobConfig is a point without engine options."""
    points = [c if isinstance(c, SweepPoint) else SweepPoint(c) for c in configs]
    total = len(points)
    results: list[dict[str, Any] | None] = [None] * total
    if jobs <= 1 or total <= 1:
        for i, point in enumerate(points):
            results[i] = run_point(
                engine, model, gpu, point.config.to_dict(), options, requests, point.options, _name(point)
            )
            if on_progress:
                on_progress(i + 1, total)
    else:
        with ProcessPoolExecutor(
            max_workers=min(jobs, total), initializer=_init_worker, initargs=(requests,)
        ) as pool:
            futures = {
                pool.submit(
                    run_point, engine, model, gpu, p.config.to_dict(), options, None, p.options, _name(p)
                ): i
                for i, p in enumerate(points)
            }
            for done, future in enumerate(as_completed(futures), start=1):
                results[futures[future]] = future.result()
                if on_progress:
                    on_progress(done, total)
    return [r for r in results if r is not None]


# --- output --------------------------------------------------------------------------------------


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, bool | str):
        return str(value)
    if key.endswith("_s") and not key.endswith("_per_s"):
        return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
    if key == "hit_rate":
        return f"{100 * value:.1f}%"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class TableSlo:
    """The SLO the table judges rows by (the run's --slo-ttft / --slo-itl, which goodput counts against)."""

    ttft_p99_s: float = DEFAULT_SLO_TTFT_S
    itl_p99_s: float = DEFAULT_SLO_ITL_S


def served(result: Mapping[str, Any]) -> bool:
    """The engine ran and finished requests: a row whose latencies mean something. An engine that
    refused every request (TensorRT-LLM without chunked prefill, every prompt over max_num_tokens)
    has status ok and no latencies at all."""
    return result["status"] == "ok" and int(result.get("finished", 1)) > 0


def slo_verdict(result: Mapping[str, Any], slo: TableSlo) -> str:
    """``met``, or which p99 limits the row breaks (``ttft``, ``itl``, ``ttft+itl``); ``-`` if infeasible
    or nothing was served."""
    if not served(result):
        return "-"
    broken = [
        name
        for name, observed, limit in (
            ("ttft", result["ttft_p99_s"], slo.ttft_p99_s),
            ("itl", result["itl_p99_s"], slo.itl_p99_s),
        )
        if float(observed) > limit
    ]
    return "+".join(broken) or "met"


def overloaded(result: Mapping[str, Any], slo: TableSlo) -> bool:
    """The engine could not keep up: the MEDIAN TTFT is over the TTFT SLO.

    A p99 over the SLO is a tail (a burst); a median over it means at least half the requests
    waited in the queue longer than the whole budget. The twin's what-if runs drain the queue after
    the last arrival, so a queue that grows through the run shows up exactly there, in the median.
    """
    return result["status"] == "ok" and float(result["ttft_p50_s"]) > slo.ttft_p99_s


def best_index(results: Sequence[Mapping[str, Any]]) -> int | None:
    """The row the tuner's objective (``BEST_OBJECTIVE``) ranks first: the highest goodput among
    feasible rows (the first on a tie); None when no row served a token within the SLO."""
    best: int | None = None
    for i, r in enumerate(results):
        if r["status"] != "ok" or not float(r[BEST_KEY]) > 0:
            continue
        if best is None or float(r[BEST_KEY]) > float(results[best][BEST_KEY]):
            best = i
    return best


def format_table(
    results: Sequence[Mapping[str, Any]], swept: Sequence[str], slo: TableSlo | None = None
) -> str:
    """One row per point; an ``slo`` column (met, or the p99 limits broken), the best row and
    overloaded engines marked, and a legend under the table saying the SLO and both rules."""
    slo = slo or TableSlo()
    header = [*swept, *TABLE_KEYS, "slo", ""]
    rows = [header]
    best = best_index(results)
    for i, r in enumerate(results):
        infeasible = not served(r)
        cells = [_fmt(k, r["config"][k]) for k in swept]
        cells += [_fmt(k, r[k]) if (k == "status" or not infeasible) else "-" for k in TABLE_KEYS]
        marks = [BEST_MARK] if i == best else []
        if overloaded(r, slo):
            marks.append(OVERLOADED_MARK)
        cells += [slo_verdict(r, slo), " ".join(marks)]
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += [
        "",
        f"slo: TTFT p99 <= {_fmt('slo_s', slo.ttft_p99_s)} and ITL p99 <= {_fmt('slo_s', slo.itl_p99_s)}"
        " (met, or which limit a row breaks)",
        f"{BEST_MARK}: the highest goodput (tokens/s of requests within both SLOs), the tuner's"
        f" default objective ({BEST_OBJECTIVE})" + ("" if best is not None else "; no row has any"),
        f"{OVERLOADED_MARK}: median TTFT over the TTFT SLO: the engine falls behind and its queue grows",
    ]
    return "\n".join(lines)


def format_replicas(results: Sequence[Mapping[str, Any]], swept: Sequence[str]) -> str:
    """For runs over several replicas: each row's request share and hit rate per replica."""
    lines = []
    for r in results:
        if not r.get("replicas"):
            continue
        label = ", ".join(f"{k}={_fmt(k, r['config'][k])}" for k in swept)
        cells = "  ".join(f"{x['share']:.2f} {_fmt('hit_rate', x['hit_rate'])}" for x in r["replicas"])
        lines.append(f"  {label}: {cells}")
    return "\n".join(["per replica (request share, hit rate):", *lines]) if lines else ""


def write_outputs(
    results: Sequence[Mapping[str, Any]],
    sweeps: Sequence[tuple[str, Sequence[Any]]],
    setup: Mapping[str, Any],
    out_dir: Path,
) -> dict[str, Any]:
    """results.json and one PNG per swept knob (every knob when only one value is swept): hit rate,
    TTFT p99 and goodput, or for a batch limit (``BATCH_LIMITS``) TTFT p50/p99, ITL p99 and goodput
    (the token budget on a log axis); with exactly two names swept over several values each, also
    ``whatif_map_<x>_<y>.png``, the grid's status and goodput."""
    from prefixtune.report import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in sweeps]
    plotted = [(n, v) for n, v in sweeps if len(v) > 1] or list(sweeps[:1])
    title = f"{setup['engine']} · {setup['model']} · {setup['gpu']} · {setup['workload']}"
    images = []
    for knob, values in plotted:
        others = [n for n in names if n != knob and len(dict(sweeps)[n]) > 1]
        path = plots.whatif_plot(
            results,
            knob,
            values,
            others,
            out_dir / f"whatif_{knob}.png",
            title=title,
            slo_ttft_s=setup.get("slo_ttft_s"),
            metrics=plots.LATENCY_METRICS if knob in BATCH_LIMITS else plots.WHATIF_METRICS,
            log_x=knob == MAX_BATCHED_TOKENS,
        )
        images.append(path.name)
    if len(plotted) == 2 and len(sweeps) == 2:
        (xname, xvalues), (yname, yvalues) = plotted
        path = plots.whatif_map(
            results,
            (xname, xvalues),
            (yname, yvalues),
            out_dir / f"whatif_map_{xname}_{yname}.png",
            title=title,
        )
        images.append(path.name)
    doc = {
        "setup": dict(setup),
        "sweeps": {n: list(v) for n, v in sweeps},
        "plots": images,
        "results": [dict(r) for r in results],
    }
    (out_dir / RESULTS_JSON).write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return doc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixtune twin whatif",
        description="Sweep prefix-cache knobs through the digital twin and plot what would happen.",
    )
    add_target_args(p, model_required=True, tp_default=1)
    add_workload_source(p)
    p.add_argument("--rate", type=float, help="mean request rate (req/s); for --trace a rate multiplier")
    p.add_argument("--duration", type=float, help="seconds of arrivals (for --trace: a cut-off)")
    p.add_argument(
        "--sweep",
        action="append",
        required=True,
        metavar="KNOB=V1,V2,...",
        help=f"knob values to try (knobs: {', '.join(KNOB_NAMES)}; and {', '.join(OPTION_SPECS)} "
        f"and {ROUTING} (with --replicas >= 2) on every engine); repeat for a grid",
    )
    p.add_argument("--out", required=True, help="output folder (results.json and PNGs)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default: CPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=float, default=0.0, help="seconds excluded from the metrics")
    p.add_argument("--slo-ttft", type=float, default=DEFAULT_SLO_TTFT_S, help="TTFT SLO (s) for goodput")
    p.add_argument("--slo-itl", type=float, default=DEFAULT_SLO_ITL_S, help="inter-token SLO (s) for goodput")
    p.add_argument("--json", action="store_true", help="print results.json's content instead of a table")
    add_routing_args(p)
    return p


def _requests(ns: argparse.Namespace) -> tuple[list[Request], str]:
    from prefixtune.twin.workloads import from_trace, generate

    if ns.trace:
        requests = from_trace(ns.trace, time_scale=ns.rate or 1.0, seed=ns.seed)
        if ns.duration is not None:
            requests = [r for r in requests if r.arrival_s < ns.duration]
        return requests, f"trace {Path(ns.trace).name}"
    source = ns.workload or ns.workload_file
    return generate(source, rate=ns.rate, duration_s=ns.duration, seed=ns.seed), f"workload {source}"


def _check_numbers(ns: argparse.Namespace) -> None:
    for flag, value in (("--rate", ns.rate), ("--duration", ns.duration)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag} must be > 0; got {value}")
    for flag, value in (("--slo-ttft", ns.slo_ttft), ("--slo-itl", ns.slo_itl)):
        if not value > 0:
            raise ValueError(f"{flag} must be > 0 seconds; got {value}")
    if ns.jobs < 1:
        raise ValueError(f"--jobs must be >= 1; got {ns.jobs}")
    if ns.warmup < 0:
        raise ValueError(f"--warmup must be >= 0 seconds; got {ns.warmup}")


def main(argv: Sequence[str], stderr: TextIO | None = None) -> int:
    err = sys.stderr if stderr is None else stderr
    ns = _parser().parse_args(list(argv))
    from prefixtune.engines import get_adapter
    from prefixtune.twin.catalog import check_tp, find_gpu, get_model, no_twin_model
    from prefixtune.twin.run import parse_command
    from prefixtune.twin.workloads import WorkloadError

    try:
        _check_numbers(ns)
        adapter = get_adapter(ns.engine)
        knobs = sweepable(adapter.knobs())
        sweeps = [parse_sweep(s, knobs) for s in ns.sweep]
        configs = grid(adapter, sweeps)
        router = routing_config(ns)
        if ns.replicas < 2 and any(n == ROUTING for n, _ in sweeps):
            raise SweepError(f"--sweep {ROUTING} needs --replicas >= 2 (got {ns.replicas})")
        # Fail on a bad model / GPU / TP here, once, rather than in every worker.
        parse_command(ns.engine, [], model=ns.model, tp=ns.tp)
        get_model(ns.model)
        if find_gpu(ns.gpu) is None:
            raise ValueError(
                f"{no_twin_model(ns.gpu)}: a what-if needs one; on the cluster the operator deploys any "
                "GPU type and tunes it from measurements only"
            )
        check_tp(ns.tp)
        requests, workload = _requests(ns)
    except (SweepError, ArgsError, WorkloadError, ValueError, KeyError, OSError) as exc:
        print(f"prefixtune twin whatif: {exc}", file=err)
        return 2
    if not requests:
        print("prefixtune twin whatif: the workload has no requests (longer --duration?)", file=err)
        return 2
    options = {
        "seed": ns.seed,
        "tp": ns.tp,
        "slo_ttft_s": ns.slo_ttft,
        "slo_itl_s": ns.slo_itl,
        "warmup_s": ns.warmup,
    }
    if ns.replicas > 1:
        options.update({"replicas": ns.replicas, "router": router.to_dict()})

    def progress(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\rwhatif {progress_bar(done, total)}", end=end, file=err, flush=True)

    results = run_sweep(
        ns.engine, ns.model, ns.gpu, configs, requests, options, jobs=ns.jobs, on_progress=progress
    )
    setup = {
        "engine": ns.engine,
        "model": ns.model,
        "gpu": ns.gpu,
        "workload": workload,
        "rate": ns.rate,
        "duration_s": ns.duration,
        "requests": len(requests),
        **options,
    }
    try:
        doc = write_outputs(results, sweeps, setup, Path(ns.out))
    except OSError as exc:
        print(f"prefixtune twin whatif: cannot write --out {ns.out}: {exc}", file=err)
        return 1
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(results, [n for n, _ in sweeps], TableSlo(ns.slo_ttft, ns.slo_itl)))
        shares = format_replicas(results, [n for n, _ in sweeps])
        if shares:
            print(f"\n{shares}")
        print(f"\nwrote {Path(ns.out) / RESULTS_JSON} and {', '.join(doc['plots'])}")
    return 0
