"""The operator's own Prometheus metrics (served by ``prefixtune run --metrics-port``)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from prefixtune.tuning.actions import Action, RecordTrial, RollBack, RollOut

PHASES = ("Pending", "Baseline", "Exploring", "Converged", "Observing", "Paused", "Failed")


class SelfMetrics:
    """One registry per operator instance (tests run several in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ("namespace", "name")
        self.trials = Counter(
            "prefixtune_trials", "Finished trials by outcome.", (*labels, "outcome"), registry=self.registry
        )
        self.rollouts = Counter(
            "prefixtune_rollouts", "Rollouts started (trials and applies).", labels, registry=self.registry
        )
        self.rollbacks = Counter("prefixtune_rollbacks", "Rollbacks started.", labels, registry=self.registry)
        self.best_score = Gauge(
            "prefixtune_best_score",
            "Objective value of the best trial of the current tuning run.",
            labels,
            registry=self.registry,
        )
        self.phase = Gauge(
            "prefixtune_phase",
            "1 for the resource's current phase, 0 for the others.",
            (*labels, "phase"),
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "prefixtune_decision_seconds",
            "Time of one reconcile (observe, decide, persist, apply).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "prefixtune_reconcile_errors",
            "Reconciles that failed and will be retried.",
            labels,
            registry=self.registry,
        )

    def record(self, namespace: str, name: str, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, RecordTrial):
                self.trials.labels(namespace, name, action.trial.outcome).inc()
            elif isinstance(action, RollOut):
                self.rollouts.labels(namespace, name).inc()
            elif isinstance(action, RollBack):
                self.rollbacks.labels(namespace, name).inc()

    def set_state(self, namespace: str, name: str, phase: str, best: float | None) -> None:
        for p in PHASES:
            self.phase.labels(namespace, name, p).set(1.0 if p == phase else 0.0)
        if best is not None:
            self.best_score.labels(namespace, name).set(float(best))

    def forget(self, namespace: str, name: str) -> None:
        for p in PHASES:
            self.phase.remove(namespace, name, p) if (namespace, name, p) in self._phase_keys() else None
        if (namespace, name) in self._best_keys():
            self.best_score.remove(namespace, name)

    def _phase_keys(self) -> set[tuple[str, ...]]:
        return {
            tuple(s.labels[k] for k in ("namespace", "name", "phase"))
            for m in self.phase.collect()
            for s in m.samples
        }

    def _best_keys(self) -> set[tuple[str, ...]]:
        return {
            (s.labels["namespace"], s.labels["name"]) for m in self.best_score.collect() for s in m.samples
        }

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
