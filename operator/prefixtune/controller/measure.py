"""Measurement windows for the tuning loop: Signals for the pods under test over the policy's window.

Direct scrapes (``tuning.metrics.source: scrape``): the pods' metrics endpoints are scraped at the
window's start and end (and in between for the early-abort check). The start scrape is kept in
memory only; after an operator restart it is gone, and the trial is reported invalidated so the
policy re-measures it (a trial is neither lost nor counted twice). Prometheus
(``source: prometheus``): the window is a range query ending at the window's end, so nothing is
kept in memory at all.

Time scale: the sandbox's twins run ``time_scale`` x faster than the wall clock; rates are then per
twin second (the operator's own windows stay in wall seconds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.controller import applied
from prefixtune.controller.admin import AdminPolicy
from prefixtune.controller.observe import PodView, desired, pods_of
from prefixtune.controller.render import DeploymentRole, config_hash, prometheus_labels
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig, MetricNames
from prefixtune.metrics.bounded import METRICS_POOL, BoundedPrometheus
from prefixtune.metrics.exposition import Snapshot
from prefixtune.metrics.histogram import Slo
from prefixtune.metrics.prometheus_source import PrometheusSource
from prefixtune.metrics.promql import Selector
from prefixtune.metrics.scrape_source import ScrapeSource, Window, window_signals
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.phases import SEARCH_PHASES, WINDOW_STEPS, Step, back_to_back
from prefixtune.tuning.state import (
    ConfigChecked,
    MetricsUnavailable,
    Observation,
    PolicyState,
    TrialInvalidated,
    WindowMeasured,
)

PARTIAL_EVERY = 4  # early-abort checks per window


@dataclass(frozen=True)
class Measured:
    """The last full window of the stable pods (what the status diagnoses), and the config they ran:
    a diagnosis is checked against that config (no advice to turn off what is off). With a canary,
    the stable pods alone: the canary's own window is its trial's, and a mix of both configs is
    neither's."""

    signals: Signals
    config: KnobConfig


@dataclass
class _Start:
    key: tuple[object, ...]
    wall: float  # when the start scrape was taken (wall seconds)
    snaps: dict[str, Snapshot]
    last_partial: float = 0.0
    # The scrapes of the early-abort checks since (at most PARTIAL_EVERY per pod): the window's
    # counters are read over every sample, as Prometheus' increase() does, so that a counter reset
    # between two of them is seen even when the counter has climbed past its start value by the end.
    between: dict[str, list[Snapshot]] = field(default_factory=dict)


@dataclass
class Meter:
    """Per-operator memory of window starts (by resource uid); everything else comes from the state."""

    time_scale: float = 1.0
    # The operator's clock (epoch seconds): the wall clock, or the sandbox's (``--clock-file``), which
    # stands still while the sandbox is too busy to keep up; ``to_wall`` maps it back for Prometheus.
    clock: Callable[[], float] = time.time
    to_wall: Callable[[float], float] = lambda t: t
    timeout_s: float = 5.0  # one scrape of one pod, in all (a dripping server is cut off here)
    budget_s: float = 20.0  # one resource's Prometheus queries of one window, in all
    born: float = field(default_factory=time.time)  # windows that began before this are not ours
    starts: dict[str, _Start] = field(default_factory=dict)
    watch_from: dict[str, tuple[tuple[object, ...], float]] = field(default_factory=dict)  # Prometheus
    last_window: dict[str, Measured] = field(default_factory=dict)

    def forget(self, uid: str) -> None:
        self.starts.pop(uid, None)
        self.last_window.pop(uid, None)
        self.watch_from.pop(uid, None)

    def _clock(self) -> float:
        return self.clock() * self.time_scale

    def _targets(self, spec: ServingDeploymentSpec, pods: Sequence[PodView]) -> dict[str, str]:
        adapter = get_adapter(spec.engine)
        return {
            p.name: f"http://{p.ip}:{adapter.metrics_port}{adapter.metrics_path}"
            for p in pods
            if p.ip and p.ready and not p.deleting
        }

    async def _scrape(
        self, spec: ServingDeploymentSpec, pods: Sequence[PodView], only: frozenset[str] | None = None
    ) -> tuple[dict[str, Snapshot], list[str]]:
        """The pods' snapshots and the short errors of the scrapes that failed (this resource's
        only: the Meter is shared by every resource, so nothing of one scrape is kept on it).
        ``only``: parse just these samples (a window's: ``_kept``)."""
        targets = self._targets(spec, pods)
        if not targets:
            return {}, []
        source = ScrapeSource(
            spec.engine, targets, timeout_s=self.timeout_s, clock=self._clock, names=_names(spec)
        )
        snaps = await source.snapshot(only)
        return snaps, list(source.errors)

    @staticmethod
    def _unanswered(what: str, errors: Sequence[str]) -> str:
        """A reason for metrics_unavailable: what is missing, and the scrapes' short errors."""
        shown = "; ".join(errors[:3])
        return f"{what} ({shown})" if shown else what

    async def verify(
        self, spec: ServingDeploymentSpec, state: PolicyState, pods: Sequence[PodView]
    ) -> Observation | None:
        """config_checked for the trial in flight, once its pods serve: what the engine reports
        running against the trial's knobs. None while no pod of it answers a scrape."""
        trial = None if state.active is None else state.trial(state.active)
        if trial is None or trial.verified or state.step not in WINDOW_STEPS:
            return None
        want = desired(state)
        role: DeploymentRole = want.subject
        mine = [p for p in pods_of(pods, role, config_hash(trial.config)) if p.ready]
        snaps, _ = await self._scrape(spec, mine) if mine else ({}, [])
        if not snaps:
            if mine and spec.tuning.metrics.source.value == "prometheus":
                # Windows come from Prometheus; the operator may not reach the pods itself. Say so
                # rather than hold the trial forever.
                return ConfigChecked(
                    config=trial.config,
                    reason="the operator could not scrape the pods to read back their effective config",
                )
            return None
        adapter = get_adapter(spec.engine)
        reads = [applied.read_back(adapter, pod, snap) for pod, snap in sorted(snaps.items())]
        return ConfigChecked(
            config=trial.config,
            mismatches=applied.mismatches(trial.config, reads),
            kv_tokens=applied.kv_tokens(reads),
        )

    async def observe(
        self,
        uid: str,
        spec: ServingDeploymentSpec,
        state: PolicyState,
        pods: Sequence[PodView],
        now: float,
        *,
        admin: AdminPolicy | None = None,
        namespace: str | None = None,
        name: str | None = None,
    ) -> Observation | None:
        """The window observation due now (or a partial one, or trial_invalidated); None if none.
        ``admin`` names the Prometheus to query; ``namespace`` is the resource's (series of a
        same-named pod elsewhere are not its), ``name`` the resource's (with the admin's
        ``prometheus_operator_labels``, only series carrying its pod labels count)."""
        if spec.tuning.metrics.source.value == "prometheus":
            policy = admin or AdminPolicy()
            wanted = policy.prometheus_operator_labels and name is not None
            labels = prometheus_labels(name) if wanted and name is not None else {}
            return await self._prometheus(uid, spec, state, pods, now, policy, namespace, labels)
        return await self._scraped(uid, spec, state, pods, now)

    def _window_key(self, state: PolicyState) -> tuple[tuple[object, ...], float] | None:
        """(key, start) of the window the policy is in, or None when it measures nothing now."""
        if state.step == Step.MEASURING and state.phase in SEARCH_PHASES and state.measure_from is not None:
            return ("trial", state.active, state.measure_from), state.measure_from
        if back_to_back(state.phase, state.step):
            return ("watch", state.phase, state.epoch), state.measure_from or 0.0
        return None

    def _groups(self, state: PolicyState, pods: Sequence[PodView]) -> dict[DeploymentRole, list[PodView]]:
        want = desired(state)
        groups: dict[DeploymentRole, list[PodView]] = {
            "baseline": pods_of(pods, "baseline", config_hash(want.baseline))
        }
        if want.canary is not None:
            groups["canary"] = pods_of(pods, "canary", config_hash(want.canary))
        return groups

    def _window(
        self, spec: ServingDeploymentSpec, start: _Start, end: Mapping[str, Snapshot], pods: Sequence[PodView]
    ) -> Window | None:
        kept = _kept(spec)
        chains = {
            name: [start.snaps[name], *start.between.get(name, ()), end[name].only(kept)]
            for name in (p.name for p in pods)
            if name in start.snaps and name in end
        }
        if not chains:
            return None
        slo = Slo(float(spec.tuning.slo.ttft_p99), float(spec.tuning.slo.itl_p99))
        from prefixtune.metrics.recipe import recipe

        return window_signals(recipe(spec.engine, _names(spec)), chains, slo=slo)

    def _signals(
        self, spec: ServingDeploymentSpec, start: _Start, end: Mapping[str, Snapshot], pods: Sequence[PodView]
    ) -> Signals | None:
        window = self._window(spec, start, end, pods)
        return None if window is None else window.signals

    async def _scraped(
        self, uid: str, spec: ServingDeploymentSpec, state: PolicyState, pods: Sequence[PodView], now: float
    ) -> Observation | None:
        found = self._window_key(state)
        if found is None:
            self.starts.pop(uid, None)
            return None
        key, began = found
        groups = self._groups(state, pods)
        everyone = [p for group in groups.values() for p in group]
        start = self.starts.get(uid)
        if start is None or start.key != key:
            if key[0] == "trial" and began < self.born:
                # The window began before this operator process: its start scrape is lost. Re-measure.
                # (A window that began under this process is scraped now, at most a tick late.)
                self.starts.pop(uid, None)
                return TrialInvalidated(
                    reason="the operator restarted during the measurement window (its start scrape is lost)",
                )
            snaps, errors = await self._scrape(spec, everyone, _kept(spec))
            if not snaps:
                return MetricsUnavailable(
                    reason=self._unanswered("no ready pod answered a metrics scrape", errors),
                )
            if empty := _empty(snaps):
                # A window must not start from nothing: it would read as zero traffic.
                return MetricsUnavailable(reason=f"metrics missing or NaN: {empty}")
            self.starts[uid] = _Start(key, now, _slim(spec, snaps), now)
            return None
        full = (
            state.measure_until is not None and now >= state.measure_until - 1e-6
            if key[0] == "trial"
            else (now - start.wall >= state.settings.measure_s)
        )
        partial_due = (
            key[0] == "trial"
            and not full
            and now - start.last_partial >= state.settings.measure_s / PARTIAL_EVERY
        )
        if not (full or partial_due):
            return None
        end, errors = await self._scrape(spec, everyone, _kept(spec))
        subject: DeploymentRole = "canary" if "canary" in groups else "baseline"
        gaps = _gaps(start.snaps, end, everyone) or ([_empty(end)] if _empty(end) else [])
        if gaps:
            # Series the window began with are missing now (an empty or NaN exposition): the data
            # is not there, so hold; the policy re-measures once the metrics are back.
            start.last_partial = now
            return MetricsUnavailable(reason=f"metrics missing or NaN: {'; '.join(gaps)}")
        reset = self._window(spec, start, end, everyone)
        if full and reset is not None and reset.resets:
            # Counters went backwards without a pod restart (an exporter restart, a scrape of another
            # process): what was counted before the reset is lost, so the window is not the trial's.
            self.starts.pop(uid, None)
            if key[0] == "trial":
                return TrialInvalidated(
                    reason=f"metrics counters reset inside the window ({', '.join(reset.resets)})",
                )
            return None  # a watching window: start a new one on the next tick
        signals = self._signals(spec, start, end, groups[subject])
        baseline = self._signals(spec, start, end, groups["baseline"]) if subject == "canary" else None
        total = None if reset is None else reset.signals  # the window over every pod, read above
        if full:
            if key[0] == "trial":
                self.starts.pop(uid, None)
            else:
                self.starts[uid] = _Start(key, now, _slim(spec, end), now)  # rolling windows while watching
        else:
            start.last_partial = now
            for name, snap in _slim(spec, end, like=start.snaps).items():
                start.between.setdefault(name, []).append(snap)
        if signals is None:
            return MetricsUnavailable(
                reason=self._unanswered(f"no {subject} pod answered a metrics scrape", errors),
            )
        stable = baseline if subject == "canary" else total or signals
        if full and stable is not None:
            self.last_window[uid] = Measured(stable, desired(state).baseline)
        return WindowMeasured(
            signals=signals,
            baseline_signals=baseline,
            canary_pods=_covered(start, end, groups.get("canary", [])) or 1,
            baseline_pods=_covered(start, end, groups["baseline"]) or 1,
            partial=not full,
            offered_rps=None if total is None else total.requests_per_s,
        )

    async def _prometheus(
        self,
        uid: str,
        spec: ServingDeploymentSpec,
        state: PolicyState,
        pods: Sequence[PodView],
        now: float,
        admin: AdminPolicy,
        namespace: str | None,
        labels: Mapping[str, str],
    ) -> Observation | None:
        found = self._window_key(state)
        url = admin.prometheus_for(spec)
        if found is None or url is None:
            return None
        key, began = found
        if key[0] == "trial":
            if state.measure_until is None or now < state.measure_until:
                return None
            window = int(max(state.measure_until - began, 1))
        else:
            last = self.watch_from.get(uid)
            if last is None or last[0] != key:
                self.watch_from[uid] = (key, max(began, now - state.settings.measure_s))
                return None
            if now - last[1] < state.settings.measure_s:
                return None
            window = int(max(now - last[1], 1))
            self.watch_from[uid] = (key, now)
        groups = self._groups(state, pods)
        subject: DeploymentRole = "canary" if "canary" in groups else "baseline"
        client = BoundedPrometheus(url, ca_file=admin.prometheus_ca_file, budget_s=self.budget_s)
        source = PrometheusSource(
            client,
            spec.engine,
            slo=Slo(float(spec.tuning.slo.ttft_p99), float(spec.tuning.slo.itl_p99)),
            names=_names(spec),
        )

        def measure(group: Sequence[PodView]) -> Signals | None:
            names = [p.name for p in group]
            if not names:
                return None
            return source.measure(
                Selector.pods(names, namespace=namespace, **labels), window, end=self.to_wall(now)
            ).signals

        loop = asyncio.get_running_loop()
        try:
            signals = await loop.run_in_executor(METRICS_POOL, measure, groups[subject])
            baseline = (
                await loop.run_in_executor(METRICS_POOL, measure, groups["baseline"])
                if subject == "canary"
                else None
            )
        except Exception as err:  # a short reason only: bounded.FetchError never quotes a body
            reason = str(err) if isinstance(err, OSError) else type(err).__name__
            return MetricsUnavailable(reason=f"Prometheus query failed: {reason[:200]}")
        if signals is None:
            return MetricsUnavailable(reason=f"no {subject} pods to query")
        stable = baseline if subject == "canary" else signals
        if stable is not None:
            self.last_window[uid] = Measured(stable, desired(state).baseline)
        return WindowMeasured(
            signals=signals,
            baseline_signals=baseline,
            canary_pods=len(groups.get("canary", [])) or 1,
            baseline_pods=len(groups["baseline"]) or 1,
            offered_rps=signals.requests_per_s,
        )


def _kept(spec: ServingDeploymentSpec) -> frozenset[str]:
    """The sample names a window over this engine's pods reads (``Recipe.sample_names``)."""
    from prefixtune.metrics.recipe import recipe

    return recipe(spec.engine, _names(spec)).sample_names()


def _slim(
    spec: ServingDeploymentSpec, snaps: Mapping[str, Snapshot], like: Mapping[str, Snapshot] | None = None
) -> dict[str, Snapshot]:
    """Scrapes as a window keeps them until its end: only the series it reads (``Snapshot.only``),
    so that a fleet's open windows hold kilobytes per pod, not a whole exposition per scrape; with
    ``like`` (the window's start scrapes, by pod), reusing their series keys."""
    kept = _kept(spec)
    first = like or {}
    return {name: snap.only(kept, first.get(name)) for name, snap in snaps.items()}


def _names(spec: ServingDeploymentSpec) -> MetricNames:
    """The series the pods' engine release exports (a TensorRT-LLM 1.2 image lacks most)."""
    adapter = get_adapter(spec.engine)
    return adapter.metrics_for(adapter.version_of(spec.image or adapter.default_image))


def _covered(start: _Start, end: Mapping[str, Snapshot], pods: Sequence[PodView]) -> int:
    """How many of ``pods`` a scraped window's signals sum over: those scraped at its start and at
    its end. A pod that came up inside the window (one an autoscaler added, still loading when the
    window began) serves but is not measured, so it must not divide a side's per-pod score."""
    return sum(1 for p in pods if p.name in start.snaps and p.name in end)


def _gaps(start: Mapping[str, Snapshot], end: Mapping[str, Snapshot], pods: Sequence[PodView]) -> list[str]:
    """Pods whose end scrape lacks series their start scrape had, the pod not having restarted (a
    restarted pod is the rollout observation's business): "pod: N of M series missing"."""
    out = []
    for pod in pods:
        first, last = start.get(pod.name), end.get(pod.name)
        if first is None or last is None:
            continue
        if first.identity and last.identity and dict(first.identity) != dict(last.identity):
            continue  # a new process: its series come back as it serves
        missing = [key for key in first.values if key not in last.values]
        if missing:
            out.append(f"{pod.name}: {len(missing)} of {len(first.values)} series missing")
    return out


def _empty(snaps: Mapping[str, Snapshot]) -> str:
    """Targets whose scrape had no usable sample (an empty or all-NaN exposition; NaN samples are
    dropped at parse): an engine always exports its gauges, so this is missing data, not idleness."""
    empty = sorted(name for name, snap in snaps.items() if not snap.values)
    return "; ".join(f"{name}: no sample (empty or all NaN)" for name in empty)
