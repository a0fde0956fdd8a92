"""PNG plots for the report and the what-if sweep (matplotlib, Agg backend: no display, no network).

Each function takes plain data, writes one PNG and returns its path. Figures are built with
``matplotlib.figure.Figure`` directly (no pyplot global state), so plotting is safe in any process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from prefixtune.report.scores import ScoreRow, number, score_label
from prefixtune.report.whatif import served

DPI = 100
SIZE = (8.0, 4.5)  # inches: 800 x 450 pixels at DPI
INFEASIBLE_OUTCOMES = ("infeasible",)
OUTCOME_STYLE: dict[str, tuple[str, str]] = {  # outcome -> (marker, colour)
    "ok": ("o", "tab:blue"),
    "infeasible": ("X", "tab:red"),
    "aborted": ("v", "tab:orange"),
    "invalidated": ("s", "tab:gray"),
    "not_applied": ("P", "tab:purple"),  # the engine ran other knob values: never scored
    "running": ("D", "tab:green"),
}


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=DPI, format="png")
    return path


BASIS_MARKER: dict[str, str] = {  # an ok trial's marker: how its score was made
    "measured": "o",
    "paired-with-baseline": "D",
    "load-normalized": "s",
}


def score_plot(
    rows: Sequence[ScoreRow], path: Path, *, objective: str, slo_score: float | None = None
) -> Path:
    """``score_figure`` as a PNG at ``path``."""
    return _save(score_figure(rows, objective=objective, slo_score=slo_score), path)


def score_figure(rows: Sequence[ScoreRow], *, objective: str, slo_score: float | None = None) -> Figure:
    """The score per trial as the report's table shows it (``scores.score_rows``: the same number,
    labelled ``score (objective)``), an ok trial's marker by its basis, others by outcome; the best
    so far as a step line, the SLO line when given."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot(1, 1, 1)
    best: float | None = None
    best_x: list[int] = []
    best_y: list[float] = []
    seen: set[str] = set()
    for row in rows:
        marker, colour = OUTCOME_STYLE.get(row.outcome, ("o", "black"))
        if row.score is None:
            label = row.outcome if row.outcome not in seen else None
            seen.add(row.outcome)
            # Not scored (infeasible, invalidated): marked on the axis so every trial shows.
            ax.scatter(
                [row.index], [0.0], marker=marker, color=colour, s=60, label=label, zorder=3, gid="unscored"
            )
            ax.annotate(row.outcome, (row.index, 0.0), textcoords="offset points", xytext=(0, 8), ha="center",
                        fontsize=7, color=colour)  # fmt: skip
        else:
            key = f"{row.outcome}, {row.basis}" if row.outcome == "ok" and row.basis else row.outcome
            if row.outcome == "ok" and row.basis:
                marker = BASIS_MARKER.get(str(row.basis), marker)
            ax.scatter([row.index], [row.score], marker=marker, color=colour, s=50,
                       label=key if key not in seen else None, zorder=3, gid="score")  # fmt: skip
            seen.add(key)
            if row.outcome == "ok":
                best = row.score if best is None else max(best, row.score)
        if best is not None:
            best_x.append(row.index)
            best_y.append(best)
    if best_x:
        ax.step(best_x, best_y, where="post", color="tab:green", label="best so far")
    if slo_score is not None:
        ax.axhline(slo_score, color="tab:red", linestyle="--", linewidth=1, label="SLO")
    ax.set_xlabel("trial")
    ax.set_ylabel(score_label(objective))
    ax.set_title("Score per trial (what the tuner compares; marker: how it was made)")
    ax.grid(alpha=0.3)
    if seen or best_x:
        ax.legend(loc="best", fontsize=8)
    return fig


def config_plot(trials: Sequence[Mapping[str, Any]], path: Path, *, label: str = "score") -> Path:
    """Configurations tried: memory fraction vs block size, coloured by score, infeasible marked."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot(1, 1, 1)
    blocks = sorted({int((t.get("config") or {}).get("blockSize", 0)) for t in trials})
    ypos = {b: i for i, b in enumerate(blocks)}
    scored = [t for t in trials if number(t.get("score")) is not None and t.get("outcome") == "ok"]
    failed = [t for t in trials if t not in scored]
    if scored:
        xs = [float(t["config"]["memoryFraction"]) for t in scored]
        ys = [ypos[int(t["config"]["blockSize"])] for t in scored]
        cs = [float(t["score"]) for t in scored]
        points = ax.scatter(xs, ys, c=cs, cmap="viridis", s=90, edgecolors="black", zorder=3)
        fig.colorbar(points, ax=ax, label=label)
        for t, x, y in zip(scored, xs, ys, strict=True):
            ax.annotate(_trial_label(t), (x, y), textcoords="offset points", xytext=(6, 6), fontsize=7)
    seen: set[str] = set()
    for t in failed:
        outcome = str(t.get("outcome", "?"))
        marker, colour = OUTCOME_STYLE.get(outcome, ("o", "black"))
        x = float((t.get("config") or {}).get("memoryFraction", 0.0))
        y = ypos[int((t.get("config") or {}).get("blockSize", 0))]
        ax.scatter([x], [y], marker=marker, color=colour, s=110, zorder=4,
                   label=outcome if outcome not in seen else None)  # fmt: skip
        seen.add(outcome)
        ax.annotate(_trial_label(t), (x, y), textcoords="offset points", xytext=(6, -10), fontsize=7)
    ax.set_yticks(range(len(blocks)), [str(b) for b in blocks])
    ax.set_xlabel("memory fraction")
    ax.set_ylabel("block size (tokens)")
    ax.set_title("Configurations tried (colour: score; label: trial, 'off': prefix caching off)")
    ax.grid(alpha=0.3)
    if seen:
        ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def _trial_label(trial: Mapping[str, Any]) -> str:
    off = (trial.get("config") or {}).get("prefixCaching") is False
    return f"{trial.get('index')}{' off' if off else ''}"


def signal_plot(
    trials: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    series: Sequence[tuple[str, str]],
    title: str,
    ylabel: str,
    scale: float = 1.0,
    hline: tuple[float, str] | None = None,
) -> Path:
    """One or more signals (key, label) per trial; trials without the signal are skipped."""
    fig = Figure(figsize=SIZE)
    ax = fig.add_subplot(1, 1, 1)
    for key, label in series:
        pts = [
            (int(t.get("index", 0)), v * scale)
            for t in trials
            if (v := number((t.get("signals") or {}).get(key))) is not None
        ]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    for t in trials:
        if str(t.get("outcome")) in INFEASIBLE_OUTCOMES:
            ax.axvline(int(t.get("index", 0)), color="tab:red", alpha=0.25, linewidth=6)
    if hline is not None:
        ax.axhline(hline[0], color="tab:red", linestyle="--", linewidth=1, label=hline[1])
    ax.set_xlabel("trial (red band: infeasible)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


WHATIF_METRICS: tuple[tuple[str, str, float], ...] = (  # (key, axis label, scale)
    ("hit_rate", "hit rate", 1.0),
    ("ttft_p99_s", "TTFT p99 (ms)", 1000.0),
    ("goodput_tokens_per_s", "goodput (tokens/s)", 1.0),
)
# The batch limits trade TTFT against ITL: their panels (``twin whatif --sweep max_batched_tokens=...``).
LATENCY_METRICS: tuple[tuple[str, str, float], ...] = (
    ("ttft_p50_s", "TTFT p50 (ms)", 1000.0),
    ("ttft_p99_s", "TTFT p99 (ms)", 1000.0),
    ("itl_p99_s", "ITL p99 (ms)", 1000.0),
    ("goodput_tokens_per_s", "goodput (tokens/s)", 1.0),
)
STATUS_COLOUR: dict[str, str] = {  # a what-if map cell's status -> colour
    "ok": "#cfe8cf",
    "oom_startup": "#f4a6a6",
    "oom_runtime": "#f6d08c",
}


def whatif_plot(
    results: Sequence[Mapping[str, Any]],
    knob: str,
    values: Sequence[Any],
    others: Sequence[str],
    path: Path,
    *,
    title: str,
    slo_ttft_s: float | None = None,
    metrics: Sequence[tuple[str, str, float]] = WHATIF_METRICS,
    log_x: bool = False,
) -> Path:
    """``whatif_figure`` as a PNG at ``path``."""
    fig = whatif_figure(
        results, knob, values, others, title=title, slo_ttft_s=slo_ttft_s, metrics=metrics, log_x=log_x
    )
    return _save(fig, path)


def whatif_figure(
    results: Sequence[Mapping[str, Any]],
    knob: str,
    values: Sequence[Any],
    others: Sequence[str],
    *,
    title: str,
    slo_ttft_s: float | None = None,
    metrics: Sequence[tuple[str, str, float]] = WHATIF_METRICS,
    log_x: bool = False,
) -> Figure:
    """``metrics`` (hit rate, TTFT p99 and goodput by default) against ``knob``: one line per
    combination of the ``others`` swept knobs; infeasible points (status other than ok) marked with
    a red X on the x axis; ``log_x`` for a knob swept over powers (the token budget).

    Every y axis starts at zero (all are shares, rates or durations), and the hit rate's ends
    at 1, so a 2% difference looks like 2%; ``slo_ttft_s`` draws the TTFT SLO on its panel."""
    fig = Figure(figsize=(4.0 * len(metrics), 4.5))
    categorical = any(isinstance(v, bool | str) for v in values)
    xpos = {_key(v): (float(i) if categorical else float(v)) for i, v in enumerate(values)}
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault(tuple(_key(r["config"][o]) for o in others), []).append(r)
    for col, (key, label, scale) in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), col + 1)
        bad_label = True
        for _, group_rows in sorted(groups.items(), key=lambda kv: kv[0]):
            rows = sorted(group_rows, key=lambda r: xpos[_key(r["config"][knob])])
            ok = [r for r in rows if served(r)]
            name = ", ".join(f"{o}={rows[0]['config'][o]}" for o in others) or None
            if ok:
                ax.plot([xpos[_key(r["config"][knob])] for r in ok], [float(r[key]) * scale for r in ok],
                        marker="o", label=name)  # fmt: skip
            bad = [r for r in rows if not served(r)]
            if bad:
                ax.scatter([xpos[_key(r["config"][knob])] for r in bad], [0.0] * len(bad), marker="X",
                           s=90, color="tab:red", zorder=4,
                           label="infeasible (OOM) or none served" if bad_label else None)  # fmt: skip
                bad_label = False
        if categorical:
            ax.set_xticks([xpos[_key(v)] for v in values], [str(v) for v in values])
        elif log_x:
            ax.set_xscale("log", base=2)
            ax.set_xticks([xpos[_key(v)] for v in values], [str(v) for v in values], rotation=45)
            ax.minorticks_off()
        if key == "ttft_p99_s" and slo_ttft_s is not None:
            ax.axhline(slo_ttft_s * scale, color="tab:gray", linestyle="--", label="TTFT SLO")
            ax.legend(loc="best", fontsize=7)
        ax.set_xlabel(knob)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if key == "hit_rate":
            ax.set_ylim(0.0, 1.0)
        else:
            shown = [float(r[key]) * scale for r in results if served(r)]
            if key == "ttft_p99_s" and slo_ttft_s is not None:
                shown.append(slo_ttft_s * scale)
            ax.set_ylim(0.0, 1.08 * max(shown) if shown and max(shown) > 0 else 1.0)
        handles, labels = ax.get_legend_handles_labels()
        if handles and col == 0 and len(labels) <= 12:
            ax.legend(loc="best", fontsize=7)
    fig.suptitle(title)
    return fig


def whatif_map(
    results: Sequence[Mapping[str, Any]],
    x: tuple[str, Sequence[Any]],
    y: tuple[str, Sequence[Any]],
    path: Path,
    *,
    title: str,
) -> Path:
    """The grid of two swept names as a map: each cell coloured by status (ok, out of memory at
    start, out of memory under load) and labelled with its goodput (tokens/s) and the requests the
    engine refused, so the feasibility boundary shows as the edge between colours."""
    (xname, xvalues), (yname, yvalues) = x, y
    fig = Figure(figsize=(max(6.0, 0.9 * len(xvalues) + 2.5), max(4.0, 0.45 * len(yvalues) + 2.0)))
    ax = fig.add_subplot(1, 1, 1)
    col = {_key(v): i for i, v in enumerate(xvalues)}
    row = {_key(v): j for j, v in enumerate(yvalues)}
    for r in results:
        i, j = col[_key(r["config"][xname])], row[_key(r["config"][yname])]
        status = str(r["status"])
        ax.add_patch(
            Rectangle((i - 0.5, j - 0.5), 1.0, 1.0, color=STATUS_COLOUR.get(status, "#dddddd"), ec="white")
        )
        if status != "ok":
            text = status.replace("oom_", "OOM ")
        elif not served(r):
            text = "none served"
        else:
            text = f"{float(r['goodput_tokens_per_s']):.0f}"
            if int(r.get("rejected", 0)):  # refused at the API: not in goodput, not served
                text += f"\n{int(r['rejected'])} refused"
        ax.text(i, j, text, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.5, len(xvalues) - 0.5)
    ax.set_ylim(-0.5, len(yvalues) - 0.5)
    ax.set_xticks(range(len(xvalues)), [str(v) for v in xvalues], rotation=45)
    ax.set_yticks(range(len(yvalues)), [str(v) for v in yvalues])
    ax.set_xlabel(xname)
    ax.set_ylabel(yname)
    handles = [Patch(color=c, label=s) for s, c in STATUS_COLOUR.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    ax.set_title(f"{title}\ncell: goodput (tokens/s), requests refused, or why it failed", fontsize=9)
    return _save(fig, path)


def _key(value: Any) -> Any:
    """Hashable key that keeps True and 1 apart."""
    return (type(value).__name__, value)


def scale_plot(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Reconcile, decision and watch-event latency (p50, p99) against the number of resources
    (``bench scale``): ``rows`` of ``n`` and the six figures in seconds (None: not measured)."""
    fig = Figure(figsize=SIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ns = [int(r["n"]) for r in rows]
    for key, label, style in (
        ("reconcile_p50_s", "reconcile p50", "o-"),
        ("reconcile_p99_s", "reconcile p99", "o--"),
        ("decision_p50_s", "decision p50", "s-"),
        ("decision_p99_s", "decision p99", "s--"),
        ("watch_lag_p50_s", "watch-event lag p50", "^-"),
        ("watch_lag_p99_s", "watch-event lag p99", "^--"),
    ):
        points = [
            (n, v) for n, v in zip(ns, (number(r.get(key)) for r in rows), strict=True) if v is not None
        ]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    ax.set_xlabel("ServingDeployments (N)")
    ax.set_ylabel("seconds")
    ax.set_title("prefixtune operator: latency against the number of resources")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    return _save(fig, path)


ROUTING_PANELS = (
    ("hit_rate", "hit rate"),
    ("ttft_p99_s", "TTFT p99 (s, log)"),
    ("goodput_tokens_per_s", "goodput (tokens/s)"),
)


TUNED = "cache_aware (tuned threshold)"


def routing_plot(scenarios: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``bench routing``: per scenario (groups) and routing policy (bars), the hit rate (with the
    single cache's as a line over each group), TTFT p99 and goodput. ``scenarios`` as the bench's
    JSON has them (``policies``: policy -> figures, ``single_cache_hit_rate``; ``cache_aware_tuned``,
    where present, is one more bar)."""
    fig = Figure(figsize=(12.0, 4.5), dpi=DPI)
    FigureCanvasAgg(fig)
    policies = list(scenarios[0]["policies"]) if scenarios else []
    # cache_aware at the threshold the objective keeps, where the bench swept it
    rows = [
        {**s["policies"], **({TUNED: s["cache_aware_tuned"]} if "cache_aware_tuned" in s else {})}
        for s in scenarios
    ]
    if scenarios and all(TUNED in r for r in rows):
        policies.append(TUNED)
    width = 0.8 / max(len(policies), 1)
    colours = [f"C{i}" for i in range(len(policies))]
    for k, (key, label) in enumerate(ROUTING_PANELS):
        ax = fig.add_subplot(1, len(ROUTING_PANELS), k + 1)
        for j, policy in enumerate(policies):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(scenarios))]
            ys = [float(r[policy][key]) for r in rows]
            ax.bar(xs, ys, width, color=colours[j], label=policy)
            if key == "hit_rate" and all("split_hit_rate" in r[policy] for r in rows):
                split = [float(r[policy]["split_hit_rate"]) for r in rows]
                ax.scatter(xs, split, marker="_", s=60, color="black", zorder=3)
        if key == "ttft_p99_s":
            ax.set_yscale("log")  # seconds of queueing beside tens of milliseconds
        if key == "hit_rate":
            for i, s in enumerate(scenarios):
                single = float(s["single_cache_hit_rate"])
                ax.hlines(single, i - 0.45, i + 0.45, colors="black", linestyles="--")
            ax.set_ylim(0, 1)
        ax.set_xticks(range(len(scenarios)))
        ax.set_xticklabels([f"{s['scenario']}\n{s['engine']}" for s in scenarios])
        ax.set_title(label)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    handles.append(Line2D([], [], color="black", linestyle="--"))
    labels.append("one cache, all pools together")
    if any("split_hit_rate" in p for r in rows for p in r.values()):
        handles.append(Line2D([], [], color="black", marker="_", linestyle="none", markersize=8))
        labels.append("its streams through idle pools (like for like)")
    fig.legend(handles, labels, loc="lower center", ncol=(len(labels) + 1) // 2, fontsize="small")
    fig.suptitle("4 replicas behind each routing policy (twin)")
    FigureCanvasAgg(fig)
    fig.tight_layout(rect=(0, 0.13, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=DPI, format="png")
    return path
