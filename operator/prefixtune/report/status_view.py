"""``prefixtune status [-n NS] [NAME] [--kubeconfig F] [--json]``: ServingDeployments in the terminal.

``summarize(resource)`` turns one resource (a dict as the API server returns it) into plain facts;
``format_detail`` and ``format_table`` print them. All three are pure; ``main`` reads the cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from prefixtune.engines.knobs import api_text
from prefixtune.report.scores import basis_of, best_record, derivation, number
from prefixtune.tuning.phases import Phase

DEFAULT_BUDGET = 20  # spec.tuning.budget.maxTrials when the spec omits it (the API's default)


def config_text(config: Mapping[str, Any] | None) -> str:
    """``mem 0.90 · block 16 · cache on · fcfs`` for a camelCase knob config (``-`` when absent)."""
    return api_text(config)


def trials_of(resource: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = resource.get("status") or {}
    return [dict(t) for t in status.get("trials") or [] if isinstance(t, Mapping)]


def latest_signals(trials: Sequence[Mapping[str, Any]]) -> tuple[int | None, dict[str, Any]]:
    """(index, signals) of the latest trial that measured something; (None, {}) when none did."""
    for trial in reversed(trials):
        signals = trial.get("signals") or {}
        if any(v is not None for k, v in signals.items() if k != "window_s"):
            return int(trial.get("index", -1)), dict(signals)
    return None, {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def summarize(resource: Mapping[str, Any]) -> dict[str, Any]:
    """Plain facts of one ServingDeployment (JSON-ready; None where not known yet)."""
    meta = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    status = resource.get("status") or {}
    tuning = spec.get("tuning") or {}
    trials = trials_of(resource)
    best = status.get("bestConfig") or {}
    diagnosis = status.get("diagnosis") or {}
    latest_index, signals = latest_signals(trials)
    outcomes: dict[str, int] = {}
    for t in trials:
        outcomes[str(t.get("outcome", "?"))] = outcomes.get(str(t.get("outcome", "?")), 0) + 1
    spent = status.get("budget")
    budget: Mapping[str, Any] = spent if isinstance(spent, Mapping) else {}
    hit_rate = number(signals.get("hit_rate"))
    if hit_rate is None:
        hit_rate = number(diagnosis.get("hitRate"))
    objective = str(tuning.get("objective") or "goodput")
    best_trial = best_record(status)
    best_basis = None if best_trial is None else basis_of(best_trial)
    return {
        "namespace": str(meta.get("namespace") or "default"),
        "name": str(meta.get("name") or "?"),
        "engine": str(spec.get("engine") or "?"),
        "model": str(spec.get("model") or "?"),
        "mode": str(tuning.get("mode") or "auto"),
        "objective": objective,
        "phase": str(status.get("phase") or Phase.PENDING),
        # The budget as the operator counts it (status.budget); None before it has (an older release).
        "trials": _int(budget.get("used")),
        "budget": _int(budget.get("maxTrials"))
        or int((tuning.get("budget") or {}).get("maxTrials") or DEFAULT_BUDGET),
        "outcomes": outcomes,
        "currentConfig": status.get("currentConfig"),
        "bestConfig": best.get("config"),
        "bestScore": number(best.get("score")),
        # how the best's score was made (None: the best trial's record is not kept, or has no basis)
        "bestTrial": None if best_trial is None else _int(best_trial.get("index")),
        "bestBasis": None if best_basis is None else str(best_basis),
        "bestScoreHow": None if best_trial is None else derivation(best_trial, objective) or None,
        "confidence": number(best.get("confidence")),
        "latestTrial": latest_index,
        "hitRate": hit_rate,
        "ttftP50S": number(signals.get("ttft_p50_s")),
        "ttftP99S": number(signals.get("ttft_p99_s")),
        "goodputTokensPerS": number(signals.get("goodput_tokens_per_s")),
        "bound": str(diagnosis.get("bound") or "unknown"),
        "notes": [str(n) for n in diagnosis.get("notes") or []],
        "conditions": [
            {
                "type": str(c.get("type")),
                "status": str(c.get("status")),
                "reason": str(c.get("reason") or ""),
                "message": str(c.get("message") or ""),
            }
            for c in status.get("conditions") or []
            if isinstance(c, Mapping)
        ],
        "recommendation": status.get("recommendation"),
    }


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_detail(facts: Mapping[str, Any]) -> str:
    """A multi-line view of one deployment's facts (from ``summarize``)."""
    outcomes = ", ".join(f"{n} {k}" for k, n in sorted(facts["outcomes"].items())) or "none yet"
    latest = "no trial measured yet" if facts["latestTrial"] is None else f"trial {facts['latestTrial']}:"
    lines = [
        f"{facts['namespace']}/{facts['name']}  {facts['engine']}  {facts['model']}",
        f"  phase        {facts['phase']}  (mode {facts['mode']}, objective {facts['objective']})",
        f"  trials       {_count(facts['trials'])} of {facts['budget']} spent; records: {outcomes}",
        f"  current      {config_text(facts['currentConfig'])}",
        f"  best         {config_text(facts['bestConfig'])}",
        f"  score        {_num(facts['bestScore'])}  confidence {_pct(facts['confidence'])}",
    ]
    if facts["bestScore"] is not None:
        # the best's score with its basis and terms, so it can be recomputed (bestConfig.trial)
        how = facts.get("bestScoreHow") or "its record is not in status.trials"
        lines.append(f"               trial {_count(facts.get('bestTrial'))}: {how}")
    lines += [
        f"  latest       {latest} hit rate {_pct(facts['hitRate'])}  "
        f"TTFT p50 {_secs(facts['ttftP50S'])}  p99 {_secs(facts['ttftP99S'])}",
        f"  diagnosis    {facts['bound']}-bound" if facts["bound"] != "unknown" else "  diagnosis    unknown",
    ]
    lines.extend(f"    - {note}" for note in facts["notes"])
    rec = facts.get("recommendation")
    if isinstance(rec, Mapping) and rec.get("config"):
        rid = f" (id {rec['id']}: prefixtune approve NAME)" if rec.get("id") else ""
        lines.append(f"  recommends   {config_text(rec.get('config'))}{rid}: {rec.get('reason', '')}")
    for c in facts["conditions"]:
        healthy = c["status"] == "True" if c["type"] == "Ready" else c["status"] != "True"
        if healthy:
            continue  # show only conditions that need attention
        text = f"  {c['type']:<12} {c['status']} {c['reason']}"
        lines.append(text + (f": {c['message']}" if c["message"] else ""))
    return "\n".join(lines)


TABLE_COLUMNS = (
    "NAMESPACE",
    "NAME",
    "ENGINE",
    "PHASE",
    "TRIALS",
    "BEST",
    "SCORE",
    "BASIS",
    "HIT",
    "TTFT-P99",
)


def format_table(all_facts: Sequence[Mapping[str, Any]]) -> str:
    """One line per deployment, columns aligned."""
    if not all_facts:
        return "No ServingDeployments found."
    rows = [list(TABLE_COLUMNS)]
    for f in all_facts:
        rows.append(
            [
                f["namespace"],
                f["name"],
                f["engine"],
                f["phase"],
                f"{_count(f['trials'])}/{f['budget']}",
                config_text(f["bestConfig"]),
                _num(f["bestScore"]),
                f.get("bestBasis") or "-",
                _pct(f["hitRate"]),
                _secs(f["ttftP99S"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixtune status", description="Show ServingDeployments: phase, trials, configs, diagnosis."
    )
    p.add_argument("name", nargs="?", help="a ServingDeployment (all in the namespace when omitted)")
    p.add_argument("-n", "--namespace", help="namespace (default: 'default'; all namespaces with -A)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    return p


def main(argv: Sequence[str]) -> int:
    ns = _parser().parse_args(list(argv))
    from prefixtune.report.cluster import ClusterError, get_deployment, list_deployments

    if ns.all_namespaces and (ns.name or ns.namespace):
        print("prefixtune status: -A/--all-namespaces takes no NAME and no -n", file=sys.stderr)
        return 2
    namespace = ns.namespace or "default"
    try:
        if ns.name:
            resources = [get_deployment(namespace, ns.name, ns.kubeconfig)]
        else:
            resources = list_deployments(None if ns.all_namespaces else namespace, ns.kubeconfig)
    except ClusterError as exc:
        print(f"prefixtune status: {exc}", file=sys.stderr)
        return 1
    facts = [summarize(r) for r in resources]
    if ns.json:
        print(json.dumps(facts[0] if ns.name else facts, indent=2))
    elif ns.name:
        print(format_detail(facts[0]))
    else:
        print(format_table(facts))
    return 0
