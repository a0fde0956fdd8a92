"""``prefixtune pause|resume|pin|rollback|approve NAME [-n NS] [--kubeconfig F]``: a person's control
of a tuning run.

Every command reads the resource, checks that the change makes sense (a clear error otherwise: no
such resource, no recommendation to approve, no such trial), and writes ONE JSON merge patch
guarded by the resourceVersion it read (a resource changed meanwhile is not overwritten):

- ``pause`` / ``resume``: ``spec.tuning.paused: true`` / the field removed (false, the default);
- ``pin --trial N | --best``: ``spec.config`` set to that trial's (or the best) config and
  ``spec.tuning.mode: "off"``: the spec says what runs, so a pin survives operator restarts,
  shows in ``kubectl get -o yaml`` and is undone by an edit of the spec, as anything else is;
- ``rollback``: ``spec.tuning.mode: "off"``: the spec's own config runs (what the user wrote);
- ``approve``: the annotation ``prefixtune.io/approve`` set to ``status.recommendation.id``; the
  operator rolls that recommendation out once, and ignores (with a Warning Event) an approval
  that no longer names the current recommendation.

The operator does the rest and says so in Events (Paused, Resumed, Pinned, TuningOff, Approved).
``*_change`` are pure (resource in, patch and message out); ``main_*`` read and write the cluster.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.api.models import APPROVE_ANNOTATION, RoutingSpec
from prefixtune.engines.knobs import ENGINE_KNOBS, ROUTER_KNOBS, api_text

OK_OUTCOME = "ok"


class ControlError(Exception):
    """The change cannot be made; the message says why and what to do."""


@dataclass(frozen=True)
class Change:
    """A merge patch to write (None: nothing to change) and what to tell the user."""

    patch: dict[str, Any] | None
    message: str


def _parts(resource: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
    meta = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    status = resource.get("status") or {}
    what = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    return what, dict(meta), dict(spec), dict(status)


def _guarded(meta: Mapping[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    version = meta.get("resourceVersion")
    guard = {"resourceVersion": version} if version else {}
    return {**patch, "metadata": {**guard, **(patch.get("metadata") or {})}}


def _tuning(spec: Mapping[str, Any]) -> dict[str, Any]:
    tuning = spec.get("tuning")
    return dict(tuning) if isinstance(tuning, Mapping) else {}


def pause_change(resource: Mapping[str, Any]) -> Change:
    what, meta, spec, _ = _parts(resource)
    if _tuning(spec).get("paused") is True:
        return Change(None, f"{what}: already paused (spec.tuning.paused is true)")
    patch = _guarded(meta, {"spec": {"tuning": {"paused": True}}})
    return Change(
        patch,
        f"{what}: paused (spec.tuning.paused: true): the operator stops the trial in flight, keeps "
        f"the stable config and starts nothing new; 'prefixtune resume {meta.get('name')}' resumes",
    )


def resume_change(resource: Mapping[str, Any]) -> Change:
    what, meta, spec, _ = _parts(resource)
    tuning = _tuning(spec)
    if tuning.get("paused") is not True:
        return Change(None, f"{what}: not paused (spec.tuning.paused is not true); nothing to resume")
    patch = _guarded(meta, {"spec": {"tuning": {"paused": None}}})
    off = " (tuning.mode is off: the spec's config keeps running)" if tuning.get("mode") == "off" else ""
    return Change(patch, f"{what}: resumed (spec.tuning.paused removed): tuning continues in its epoch{off}")


def _trial_config(status: Mapping[str, Any], index: int, what: str) -> dict[str, Any]:
    trials = [t for t in status.get("trials") or [] if isinstance(t, Mapping)]
    found = [t for t in trials if t.get("index") == index]
    if not found:
        known = ", ".join(str(t.get("index")) for t in trials) or "none yet"
        raise ControlError(
            f"{what}: no trial {index} in status.trials (trials there: {known}; "
            "'prefixtune status NAME' lists them, '--best' pins the best)"
        )
    trial = found[-1]
    if trial.get("outcome") != OK_OUTCOME or not isinstance(trial.get("config"), Mapping):
        reason = f": {trial.get('reason')}" if trial.get("reason") else ""
        raise ControlError(
            f"{what}: trial {index} was not measured ok (outcome {trial.get('outcome')}{reason}); "
            "pin a trial whose outcome is ok, or '--best'"
        )
    return dict(trial["config"])


def pin_change(resource: Mapping[str, Any], trial: int | None) -> Change:
    """``trial`` None: the best config (``status.bestConfig``)."""
    what, meta, spec, status = _parts(resource)
    if trial is None:
        best = status.get("bestConfig") or {}
        config = best.get("config") if isinstance(best, Mapping) else None
        if not isinstance(config, Mapping) or not config:
            raise ControlError(f"{what}: no best config yet (no trial measured ok); pin one with --trial N")
        label = "the best config"
    else:
        config = _trial_config(status, trial, what)
        label = f"trial {trial}'s config"
    # The engine knobs go to spec.config, the router's to their fields of spec.routing.
    engine = {k.camel: config[k.camel] for k in ENGINE_KNOBS if k.camel in config}
    routing = {RoutingSpec.field_of(k.name): config[k.camel] for k in ROUTER_KNOBS if k.camel in config}
    old = spec.get("config")
    cleared = {k: None for k in (old if isinstance(old, Mapping) else {}) if k not in engine}
    changes: dict[str, Any] = {"config": {**cleared, **engine}, "tuning": {"mode": "off"}}
    if routing:
        changes["routing"] = routing
    where = "spec.config, spec.routing" if routing else "spec.config"
    return Change(
        _guarded(meta, {"spec": changes}),
        f'{what}: pinned {label} [{api_text(config)}] ({where}, tuning.mode "off"): it runs '
        "until tuning is turned on again",
    )


def rollback_change(resource: Mapping[str, Any]) -> Change:
    what, meta, spec, status = _parts(resource)
    config = spec.get("config") if isinstance(spec.get("config"), Mapping) else None
    running = status.get("currentConfig")
    if _tuning(spec).get("mode") == "off":
        return Change(None, f'{what}: tuning is already off (tuning.mode "off"): the spec\'s config runs')
    patch = _guarded(meta, {"spec": {"tuning": {"mode": "off"}}})
    was = f" (running now: [{api_text(running)}])" if isinstance(running, Mapping) else ""
    spec_text = api_text(config) if config else "the engine's defaults"
    return Change(
        patch,
        f'{what}: rolled back to the spec\'s config [{spec_text}]{was}: tuning.mode "off"; set it to '
        "auto or observe to tune again",
    )


def approve_change(resource: Mapping[str, Any]) -> Change:
    what, meta, spec, status = _parts(resource)
    rec = status.get("recommendation")
    if not isinstance(rec, Mapping) or not rec.get("config"):
        mode = _tuning(spec).get("mode") or "auto"
        phase = status.get("phase") or "Pending"
        raise ControlError(
            f"{what}: no recommendation to approve (tuning.mode {mode}, phase {phase}); observe mode "
            "recommends a config once a window shows a better one ('prefixtune status NAME')"
        )
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        raise ControlError(f"{what}: the recommendation has no id (an older operator wrote it); wait a tick")
    annotations = meta.get("annotations") or {}
    if isinstance(annotations, Mapping) and annotations.get(APPROVE_ANNOTATION) == rid:
        raise ControlError(
            f"{what}: recommendation {rid} is already approved (annotation {APPROVE_ANNOTATION}); the "
            "operator acts on an approval once: if its Events say ApprovalIgnored (paused, a rollout in "
            f"flight), remove it (kubectl annotate sdep {meta.get('name')} {APPROVE_ANNOTATION}-), "
            "wait for a tick and approve again"
        )
    patch = _guarded(meta, {"metadata": {"annotations": {APPROVE_ANNOTATION: rid}}})
    return Change(
        patch,
        f"{what}: approved recommendation {rid} [{api_text(rec.get('config'))}]: the operator rolls it "
        "out to every pod on its next tick (an Approved Event; ApprovalIgnored if it changed meanwhile)",
    )


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"prefixtune {command}", description=description)
    p.add_argument("name", help="the ServingDeployment")
    p.add_argument("-n", "--namespace", default="default", help="namespace (default: 'default')")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    return p


def _run(command: str, ns: argparse.Namespace, make: Callable[[Mapping[str, Any]], Change]) -> int:
    from prefixtune.report.cluster import ClusterError, get_deployment, patch_deployment

    try:
        resource = get_deployment(ns.namespace, ns.name, ns.kubeconfig)
        change = make(resource)
        if change.patch is not None:
            patch_deployment(ns.namespace, ns.name, change.patch, ns.kubeconfig)
    except (ClusterError, ControlError) as exc:
        print(f"prefixtune {command}: {exc}", file=sys.stderr)
        return 1
    print(change.message)
    return 0


def pause(argv: Sequence[str]) -> int:
    ns = _parser("pause", "Pause tuning: spec.tuning.paused true.").parse_args(list(argv))
    return _run("pause", ns, pause_change)


def resume(argv: Sequence[str]) -> int:
    ns = _parser("resume", "Resume a paused tuning run in its epoch.").parse_args(list(argv))
    return _run("resume", ns, resume_change)


def pin(argv: Sequence[str]) -> int:
    p = _parser("pin", 'Run one measured config and stop tuning: spec.config and tuning.mode "off".')
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", type=int, metavar="N", help="the config of trial N (status.trials)")
    which.add_argument("--best", action="store_true", help="the best config measured")
    ns = p.parse_args(list(argv))
    return _run("pin", ns, lambda r: pin_change(r, None if ns.best else ns.trial))


def rollback(argv: Sequence[str]) -> int:
    ns = _parser("rollback", 'Run the spec\'s own config again: tuning.mode "off".').parse_args(list(argv))
    return _run("rollback", ns, rollback_change)


def approve(argv: Sequence[str]) -> int:
    p = _parser("approve", "Roll observe mode's recommendation out (prefixtune.io/approve).")
    ns = p.parse_args(list(argv))
    return _run("approve", ns, approve_change)
