"""``prefixtune report NS/NAME --out DIR``: a self-contained HTML report of one ServingDeployment.

The report (``index.html`` plus PNGs in the same folder; no scripts, no CDN, nothing fetched) shows
the score per trial with the best so far, the configurations tried, hit rate / TTFT / throughput per
trial, every trial with its config, outcome and reason, and the decisions: the resource's Events.

``write_report(resource, events, out_dir)`` is the Python API (the demo uses it); ``main`` reads the
resource and its Events from the cluster, or the resource from ``--from-file`` (``kubectl get sdep
NAME -o json`` output; events from ``--events-file``, ``kubectl get events -o json`` output).
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from prefixtune.report import plots
from prefixtune.report.cluster import event_time, sort_events
from prefixtune.report.scores import score_label, score_rows
from prefixtune.report.status_view import config_text, format_detail, summarize, trials_of
from prefixtune.tuning.objective import GOALS, goal

INDEX = "index.html"
SCORE_PNG = "score.png"
CONFIGS_PNG = "configs.png"
HIT_RATE_PNG = "hit_rate.png"
TTFT_PNG = "ttft.png"
THROUGHPUT_PNG = "throughput.png"

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; width: 100%; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } tr.infeasible td { background: #fde8e8; } tr.aborted td { background: #fff1e0; }
tr.Warning td { background: #fff6dc; } img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; }
"""


def _slo_seconds(spec: Mapping[str, Any], key: str, default: float) -> float:
    from prefixtune.api.durations import DurationError, parse_duration

    value = ((spec.get("tuning") or {}).get("slo") or {}).get(key)
    if value is None:
        return default
    try:
        return float(parse_duration(value))
    except (DurationError, ValueError):
        return default


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return html.escape(f"{value:.{digits}g}")
    return html.escape(str(value))


def _trial_rows(trials: Sequence[Mapping[str, Any]], objective: str) -> str:
    rows = []
    for t, row in zip(trials, score_rows(trials, objective), strict=True):
        s = t.get("signals") or {}
        ttft50, ttft99 = s.get("ttft_p50_s"), s.get("ttft_p99_s")
        rows.append(
            f'<tr class="{html.escape(row.outcome)}"><td>{_cell(row.index)}</td>'
            f"<td>{html.escape(config_text(t.get('config')))}</td><td>{html.escape(row.outcome)}</td>"
            f"<td>{_cell(t.get('role'))}</td>"
            f'<td class="score">{_cell(row.score)}</td><td>{_cell(row.basis and str(row.basis))}</td>'
            f"<td>{_cell(row.how or None)}</td>"
            f'<td class="window">{_cell(row.window_score)}</td><td>{_cell(s.get("hit_rate"), 3)}</td>'
            f"<td>{_cell(None if ttft50 is None else ttft50 * 1000)}</td>"
            f"<td>{_cell(None if ttft99 is None else ttft99 * 1000)}</td>"
            f"<td>{_cell(s.get('output_tokens_per_s'))}</td><td>{_cell(s.get('goodput_tokens_per_s'))}</td>"
            f"<td>{_cell(t.get('startedAt'))}</td><td>{_cell(t.get('reason') or '')}</td></tr>"
        )
    return "\n".join(rows)


def _event_rows(events: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for e in events:
        kind = str(e.get("type") or "Normal")
        count = int(e.get("count") or 1)
        rows.append(
            f'<tr class="{html.escape(kind)}"><td>{_cell(event_time(dict(e)))}</td>'
            f"<td>{html.escape(kind)}</td>"
            f"<td>{_cell(e.get('reason'))}</td><td>{_cell(count)}</td><td>{_cell(e.get('message'))}</td></tr>"
        )
    return "\n".join(rows)


def objective_of(resource: Mapping[str, Any]) -> str:
    """spec.tuning.objective (the API's default when the spec omits it)."""
    return str(((resource.get("spec") or {}).get("tuning") or {}).get("objective") or "goodput")


def render_plots(resource: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the report's PNGs into ``out_dir``; returns their paths."""
    spec = resource.get("spec") or {}
    trials = trials_of(resource)
    objective = objective_of(resource)
    ttft_slo = _slo_seconds(spec, "ttftP99", 2.0)
    return [
        plots.score_plot(
            score_rows(trials, objective),
            out_dir / SCORE_PNG,
            objective=objective,
            # For the ttft objective the score is -TTFT p99: the SLO is a line on the score axis.
            slo_score=goal(objective).slo_score(ttft_slo) if objective in GOALS else None,
        ),
        plots.config_plot(trials, out_dir / CONFIGS_PNG, label=score_label(objective)),
        plots.signal_plot(
            trials,
            out_dir / HIT_RATE_PNG,
            series=[("hit_rate", "hit rate"), ("prefill_reduction", "prefill reduction")],
            title="Prefix-cache hit rate per trial",
            ylabel="share of prompt tokens",
        ),
        plots.signal_plot(
            trials,
            out_dir / TTFT_PNG,
            series=[("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99")],
            title="Time to first token per trial",
            ylabel="ms",
            scale=1000.0,
            hline=(ttft_slo * 1000.0, "SLO p99"),
        ),
        plots.signal_plot(
            trials,
            out_dir / THROUGHPUT_PNG,
            series=[
                ("output_tokens_per_s", "output tokens/s (pods under test, raw)"),
                ("goodput_tokens_per_s", "goodput tokens/s (pods under test, raw)"),
            ],
            # A canary's window is its own pods': not the score, and not comparable across trials.
            title="Raw throughput of the pods under test per trial (not the score: see the score plot)",
            ylabel="tokens/s",
        ),
    ]


def render_html(
    resource: Mapping[str, Any], events: Sequence[Mapping[str, Any]], images: Sequence[str], generated: str
) -> str:
    facts = summarize(resource)
    trials = trials_of(resource)
    objective = objective_of(resource)
    title = f"prefixtune report: {facts['namespace']}/{facts['name']}"
    figures = "\n".join(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">' for name in images)
    event_section = (
        "<p>No Events recorded.</p>"
        if not events
        else "<table><tr><th>time</th><th>type</th><th>reason</th><th>count</th><th>message</th></tr>\n"
        f"{_event_rows(events)}</table>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>Generated {html.escape(generated)} · {len(trials)} trials · {len(events)} events</p>
<h2>Status</h2>
<pre>{html.escape(format_detail(facts))}</pre>
<h2>Plots</h2>
{figures}
<h2>Trials</h2>
<p>The score is what the tuner compares, made from the trial's window as its basis says (the terms
are printed, so each can be recomputed). The window columns are raw, as measured on the pods under
test: for a canary its own pods only, so they are not comparable across trials.</p>
<table><tr><th colspan="4"></th><th colspan="3">what the tuner compares</th>
<th colspan="6">window: the pods under test (raw)</th><th colspan="2"></th></tr>
<tr><th>#</th><th>config</th><th>outcome</th><th>role</th><th>{html.escape(score_label(objective))}</th>
<th>basis</th><th>how the score was made</th><th>window {html.escape(score_label(objective))}</th>
<th>hit rate</th><th>TTFT p50 ms</th><th>TTFT p99 ms</th><th>output tok/s</th><th>goodput tok/s</th>
<th>started</th><th>reason</th></tr>
{_trial_rows(trials, objective)}
</table>
<h2>Decisions (Events)</h2>
{event_section}
</body></html>
"""


def write_report(
    resource: Mapping[str, Any], events: Sequence[Mapping[str, Any]], out_dir: str | Path
) -> Path:
    """Write ``index.html`` and its PNGs into ``out_dir`` (created); returns the HTML's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = render_plots(resource, out)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    index = out / INDEX
    index.write_text(
        render_html(resource, sort_events([dict(e) for e in events]), [p.name for p in images], now),
        encoding="utf-8",
    )
    return index


class InputError(ValueError):
    pass


def _load(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    try:
        return yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise InputError(f"{path} is neither JSON nor YAML: {exc}") from exc


def resource_from_file(path: str, target: str | None = None) -> dict[str, Any]:
    """A ServingDeployment from a file: the resource, a List holding it (``target`` picks by name when
    it holds several), or a bare status (with ``trials``)."""
    data = _load(path)
    if isinstance(data, Mapping) and isinstance(data.get("items"), list):
        items = [i for i in data["items"] if isinstance(i, Mapping)]
        if target:
            name = target.split("/")[-1]
            items = [i for i in items if (i.get("metadata") or {}).get("name") == name]
        if len(items) != 1:
            raise InputError(f"{path}: holds {len(items)} matching resources; name one as NS/NAME")
        data = items[0]
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: expected a ServingDeployment object, got {type(data).__name__}")
    if "status" not in data and "trials" in data:
        ns, _, name = (target or "default/from-file").rpartition("/")
        data = {"metadata": {"namespace": ns or "default", "name": name}, "spec": {}, "status": data}
    if not isinstance(data.get("status"), Mapping):
        raise InputError(f"{path}: no status in the resource (has the operator reconciled it yet?)")
    return dict(data)


def events_from_file(path: str) -> list[dict[str, Any]]:
    data = _load(path)
    items = data.get("items") if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise InputError(f"{path}: expected an EventList (items) or a list of Events")
    return [dict(e) for e in items if isinstance(e, Mapping)]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixtune report",
        description="Write a self-contained HTML report (with PNG plots) of one ServingDeployment.",
    )
    p.add_argument(
        "target", nargs="?", metavar="NS/NAME", help="the ServingDeployment (NAME: namespace default)"
    )
    p.add_argument("--out", required=True, help="output folder (index.html and PNGs)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    p.add_argument("--from-file", help="read the resource from a JSON/YAML file instead of the cluster")
    p.add_argument("--events-file", help="with --from-file: Events (kubectl get events -o json)")
    return p


def main(argv: Sequence[str]) -> int:
    ns = _parser().parse_args(list(argv))
    from prefixtune.report.cluster import ClusterError, get_deployment, list_events

    try:
        if ns.from_file:
            resource = resource_from_file(ns.from_file, ns.target)
            events = events_from_file(ns.events_file) if ns.events_file else []
        else:
            if ns.events_file:
                raise InputError("--events-file goes with --from-file")
            if not ns.target:
                raise InputError("give NS/NAME (or --from-file FILE)")
            namespace, _, name = ns.target.rpartition("/")
            if not name:
                raise InputError(f"NS/NAME: expected namespace/name, got {ns.target!r}")
            resource = get_deployment(namespace or "default", name, ns.kubeconfig)
            events = list_events(namespace or "default", name, ns.kubeconfig)
        index = write_report(resource, events, ns.out)
    except InputError as exc:
        print(f"prefixtune report: {exc}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        print(f"prefixtune report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"prefixtune report: cannot write --out {ns.out}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"report": str(index), "trials": len(trials_of(resource)), "events": len(events)}))
    return 0
