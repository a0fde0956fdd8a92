"""``prefixtune twin run | serve | cache``.

``twin run`` simulates one engine on one workload and prints a summary (JSON with ``--json``)::

    prefixtune twin run --engine vllm --model meta-llama/Llama-3.1-8B-Instruct --gpu H100 \\
        --workload chatbot --rate 20 --duration 120 --json -- --gpu-memory-utilization 0.95

Engine arguments after ``--`` are the engine's real flags, read by its adapter: either flags added to
the engine's default command for ``--model`` (later flags win), or a whole command line
(``-- vllm serve MODEL ...``). Without them, the adapter's default command. ``--replicas N --routing
POLICY`` runs N replicas behind a router (``twin/replicas.py``): the total, the router's decisions and
one row per replica (its request share, hit rate, TTFT, goodput). ``serve`` and ``cache``
live in ``twin/serve.py`` and ``twin/replay.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prefixtune.engines.base import ArgsError
from prefixtune.twin.cliargs import add_routing_args, add_target_args, add_workload_source, routing_config

SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("prefixtune.twin.cli", "run_main", "simulate an engine on a workload; print a summary"),
    "serve": ("prefixtune.twin.serve", "serve_main", "serve an engine's HTTP API and /metrics from the twin"),
    "cache": ("prefixtune.twin.replay", "cache_main", "replay a workload through a cache model only"),
    "whatif": ("prefixtune.report.whatif", "main", "sweep knobs through the twin; table, plots, JSON"),
}


# Labels and legends for summary keys a bare number would mislead on (the JSON keeps the key only).
PLAIN_LABELS: dict[str, tuple[str, str]] = {
    "gpu_busy_fraction": (
        "engine busy, not load",
        "gpu_busy_fraction: share of the window the engine spent in steps (any request running);"
        " one request keeps it near 1, so read load from mean_running and the TTFTs",
    ),
}
_FRACTION_KEYS = frozenset({"hit_rate", "kv_usage_mean", "share"})


def format_plain_value(key: str, value: object) -> str:
    """A summary value rounded for reading: shares to 3 decimals, other floats (seconds, rates,
    means) to 4 significant digits; ints, bools and strings as they are."""
    if not isinstance(value, float):
        return str(value)
    if key in _FRACTION_KEYS or key.endswith("_fraction"):
        return f"{value:.3f}"
    return significant(value, 4)


def significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits in fixed notation (12345.6 -> 12346, 0.013558 ->
    0.01356); never an exponent, never fewer digits before the point than the value has."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def format_plain(data: Mapping[str, Any]) -> str:
    """``twin run``'s plain output: one ``key value`` line per summary field (not the setup),
    rounded, a short label after the values that need one and their legends at the end."""
    lines, legends = [], []
    for key, value in data.items():
        if key == "setup":
            continue
        line = f"{key:32s} {format_plain_value(key, value)}"
        if key in PLAIN_LABELS:
            label, legend = PLAIN_LABELS[key]
            line += f"  ({label})"
            legends.append(legend)
        lines.append(line)
    return "\n".join([*lines, *(["", *legends] if legends else [])])


def _usage() -> str:
    lines = ["usage: prefixtune twin <command> [options]", "", "commands:"]
    for name, (_, _, text) in SUBCOMMANDS.items():
        lines.append(f"  {name.ljust(6)} {text}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    name = args[0]
    if name not in SUBCOMMANDS:
        print(
            f"prefixtune twin: unknown command {name!r}; choose from {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module, func, _ = SUBCOMMANDS[name]
    fn: Callable[[list[str]], int] = getattr(importlib.import_module(module), func)
    return int(fn(args[1:]) or 0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixtune twin run",
        description="Simulate one engine on one workload with the digital twin.",
        epilog="Engine flags go after '--' (e.g. -- --gpu-memory-utilization 0.95 --block-size 32).",
    )
    add_target_args(p, model_required=False, tp_default=None)
    add_workload_source(p)
    p.add_argument("--rate", type=float, help="mean request rate (req/s); for --trace a rate multiplier")
    p.add_argument("--duration", type=float, help="seconds of arrivals (for --trace: a cut-off)")
    p.add_argument("--session-sample", type=float, default=1.0, help="--trace: fraction of sessions kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, help="TTFT SLO in seconds (for goodput)")
    p.add_argument("--slo-itl", type=float, help="inter-token latency SLO in seconds (for goodput)")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds excluded from the metrics")
    p.add_argument("--horizon", type=float, help="stop the simulation at this time (default: all done)")
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH=LOCAL",
        help="a file the engine reads (PATH as in its flags), taken from LOCAL (TRT-LLM options YAML)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_routing_args(p)
    return p


REPLICA_COLUMNS = ("share", "hit_rate", "ttft_p50_s", "ttft_p99_s", "goodput_tokens_per_s", "requests")


def format_replicas(data: Mapping[str, Any]) -> str:
    """``twin run --replicas N``'s plain output: the total summary, the router, one row per replica."""
    routing = data["routing"]
    decisions = ", ".join(f"{k} {v}" for k, v in routing["decisions"].items()) or "none"
    rows = [["replica", *REPLICA_COLUMNS]]
    for r in data["replicas"]:
        rows.append([str(r["replica"]), *(format_plain_value(k, r[k]) for k in REPLICA_COLUMNS)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    head = f"{routing['replicas']} replicas, routing {routing['policy']} (decisions: {decisions})"
    return "\n".join([head, "", "total:", format_plain(data["total"]), "", *table])


def run_main(argv: Sequence[str]) -> int:
    args_list = list(argv)
    engine_args: list[str] = []
    if "--" in args_list:
        cut = args_list.index("--")
        args_list, engine_args = args_list[:cut], args_list[cut + 1 :]
    parser = _parser()
    ns = parser.parse_args(args_list)
    from prefixtune.twin.run import SimOptions, simulate
    from prefixtune.twin.summary import GoodputSlo
    from prefixtune.twin.workloads import WorkloadError, from_trace, generate

    try:
        files = {}
        for item in ns.file:
            path, sep, local = item.partition("=")
            if not sep or not path or not local:
                raise ValueError(f"--file must be PATH=LOCAL; got {item!r}")
            with open(local, encoding="utf-8") as fh:
                files[path] = fh.read()
        if ns.rate is not None and not ns.rate > 0:
            raise ValueError(f"--rate must be > 0; got {ns.rate}")
        if ns.duration is not None and not ns.duration > 0:
            raise ValueError(f"--duration must be > 0 seconds; got {ns.duration}")
        if ns.trace:
            requests = from_trace(
                ns.trace, time_scale=ns.rate or 1.0, session_sample=ns.session_sample, seed=ns.seed
            )
            if ns.duration is not None:
                requests = [r for r in requests if r.arrival_s < ns.duration]
            workload = {"trace": ns.trace, "time_scale": ns.rate or 1.0, "session_sample": ns.session_sample}
        else:
            source = ns.workload or ns.workload_file
            requests = generate(source, rate=ns.rate, duration_s=ns.duration, seed=ns.seed)
            workload = {"workload": source, "rate": ns.rate, "duration_s": ns.duration}
        routing = routing_config(ns)
        options = SimOptions(
            seed=ns.seed,
            slo=GoodputSlo(ttft_s=ns.slo_ttft, itl_s=ns.slo_itl),
            warmup_s=ns.warmup,
            horizon_s=ns.horizon,
            model=ns.model,
            tp=ns.tp,
            files=files,
            setup={"workload": workload},
        )
        if ns.replicas > 1:
            from prefixtune.twin.replicas import simulate_replicas

            run = simulate_replicas(ns.engine, engine_args, ns.gpu, requests, ns.replicas, routing, options)
            data = run.to_dict()
        else:
            data = simulate(ns.engine, engine_args, ns.gpu, requests, options).to_dict()
    except (ArgsError, WorkloadError, ValueError, OSError) as exc:
        print(f"prefixtune twin run: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(data, indent=2, sort_keys=False))  # full precision
    elif ns.replicas > 1:
        print(format_replicas(data))
    else:
        print(format_plain(data))
    return 0  # an OOM is a result (see "status"), not a usage error
