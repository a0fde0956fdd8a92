"""Build the ServingDeployment's status from the policy state: one patch per reconcile.

Pure. The policy state is the source of truth (stored whole, as JSON, under ``status.policy``); the
rest of the status is a readable projection of it: phase, conditions, current and best config, the
last trials, the diagnosis and the recommendation.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.api.models import ServingDeploymentStatus
from prefixtune.controller.render import ROLES, DeploymentRole, selector_labels, selector_string
from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import to_api
from prefixtune.metrics.diagnosis import Diagnosis
from prefixtune.tuning.actions import Action, Recommend, SetCondition
from prefixtune.tuning.phases import Phase, TuningReason
from prefixtune.tuning.policy._core import trials_spent
from prefixtune.tuning.policy.gate import judge
from prefixtune.tuning.policy.messages import tuning_condition
from prefixtune.tuning.state import PolicyState, Trial, ValueTerms, clip, recommendation_id

MAX_TRIALS_IN_STATUS = 50
# Every free-text and list field of the status is bounded, so that no message (a pod's, an engine's,
# a metrics source's) can push the status past the API server's request limit and freeze the
# resource: condition messages, trial reasons, diagnosis notes, the recommendation's reason.
MAX_CONDITION_MESSAGE = 2048  # characters (the API allows 32768: five such conditions are 160 KB)
MAX_CONDITIONS = 10  # own types first; others a user or tool added are kept up to this many
MAX_NOTES = 20
MAX_NOTE = 512
POLICY_KEY = "state"  # status.policy.state: PolicyState.to_json()
POLICY_SCHEMA = 1
# status.policy.spec: the last spec that validated and was rolled out (the raw mapping as JSON text:
# a merge patch would merge an object with the one before). An invalid edit mid-trial is answered
# by restoring it (``reconcile._invalid``).
POLICY_SPEC_KEY = "spec"
CONDITION_TYPES = ("Ready", "Tuning", "Degraded", "MetricsUnavailable", "SignalsMissing")
# Diagnosis bounds the API knows; the metrics layer may say more (e.g. "insufficient").
API_BOUNDS = ("prefill", "decode", "kv-capacity", "queueing", "unknown")


def iso(t: float | datetime.datetime) -> str:
    dt = t if isinstance(t, datetime.datetime) else datetime.datetime.fromtimestamp(t, tz=datetime.UTC)
    return dt.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def knob_values(config: KnobConfig) -> dict[str, Any]:
    """The config as the status records it (camelCase, from the knob registry)."""
    return to_api(config)


def policy_state_of(status: Mapping[str, Any] | None) -> PolicyState | None:
    """The policy state stored in a status, or None (new resource, or written by an older schema)."""
    policy = (status or {}).get("policy") or {}
    text = policy.get(POLICY_KEY) if isinstance(policy, Mapping) else None
    if not isinstance(text, str) or not text:
        return None
    try:
        return PolicyState.from_json(text)
    except ValueError:
        return None


def last_valid_spec(status: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The last valid spec the operator rolled out, as stored in the status (None if none)."""
    policy = (status or {}).get("policy") or {}
    text = policy.get(POLICY_SPEC_KEY) if isinstance(policy, Mapping) else None
    if not isinstance(text, str) or not text:
        return None
    try:
        spec = json.loads(text)
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    generation: int,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A condition; lastTransitionTime moves only when the status flips."""
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": condition_message(message),
        "lastTransitionTime": since or iso(now),
        "observedGeneration": int(generation),
    }


def condition_message(message: str) -> str:
    """A condition's message as the status stores it (bounded)."""
    return clip(message, MAX_CONDITION_MESSAGE)


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    updates: Sequence[tuple[str, str, str, str]],
    now: float,
    generation: int,
) -> list[dict[str, Any]]:
    """Apply (type, status, reason, message) updates to the previous conditions, in a fixed order;
    conditions not updated keep their values but get the current observedGeneration."""
    by_type: dict[str, dict[str, Any]] = {str(c.get("type")): dict(c) for c in previous if c.get("type")}
    for type_, status, reason, message in updates:
        by_type[type_] = condition(type_, status, reason, message, now, generation, previous)
    out = []
    for type_ in (*CONDITION_TYPES, *sorted(set(by_type) - set(CONDITION_TYPES))):
        if type_ in by_type:
            c = by_type[type_]
            c["observedGeneration"] = int(generation)
            if isinstance(c.get("message"), str):
                c["message"] = condition_message(c["message"])
            out.append(c)
    return out[:MAX_CONDITIONS]


def finite(value: float | None) -> float | None:
    """JSON has no inf/NaN (the API server refuses them): such a value is shown as not measured."""
    return None if value is None or not math.isfinite(value) else float(value)


def trial_record(trial: Trial) -> dict[str, Any]:
    """A trial as ``status.trials[]`` shows it (the API's TrialRecord)."""
    record: dict[str, Any] = {
        "index": int(trial.id),
        "role": trial.role,
        "config": knob_values(trial.config),
        "outcome": trial.outcome,
        "reason": clip(
            (f"[{trial.role}] " if trial.role == "baseline" else "")
            + (f"{trial.failure}: " if trial.failure and not trial.reason.startswith(trial.failure) else "")
            + trial.reason
        ),
        "startedAt": iso(trial.started_at),
        "signals": {}
        if trial.signals is None
        else {k: finite(v) for k, v in trial.signals.to_dict().items()},
    }
    if trial.finished_at is not None:
        record["finishedAt"] = iso(trial.finished_at)
    if finite(trial.value) is not None:
        record["score"] = finite(trial.value)
        if trial.terms is not None:
            record["scoreBasis"] = str(trial.terms.basis)
            terms = score_terms(trial.terms)
            if terms:
                record["scoreTerms"] = terms
    if finite(trial.score) is not None:
        record["windowScore"] = finite(trial.score)
    if trial.kv_tokens is not None:
        record["kvTokens"] = int(trial.kv_tokens)
    return record


def score_terms(terms: ValueTerms) -> dict[str, Any]:
    """A trial's ValueTerms as ``status.trials[].scoreTerms`` shows them (the API's ScoreTerms): the
    terms known and finite, nothing else."""
    out: dict[str, Any] = {}
    for key, value in (
        ("baselineTrial", terms.anchor_trial),
        ("canaryPods", terms.canary_pods),
        ("baselinePods", terms.baseline_pods),
    ):
        if value is not None:
            out[key] = int(value)
    for key, number in (
        ("baselineScore", terms.anchor),
        ("ratio", terms.ratio),
        ("baselineWindowScore", terms.baseline_window),
        ("requestSplit", terms.split),
        ("loadFactor", terms.load_factor),
        ("offeredRps", terms.offered_rps),
        ("referenceRps", terms.reference_rps),
        ("measuredScore", terms.measured),
        ("headroom", terms.headroom),
    ):
        if finite(number) is not None:
            out[key] = finite(number)
    if terms.headroom_limit is not None:
        out["headroomLimit"] = str(terms.headroom_limit)
    return out


def best_config(state: PolicyState) -> dict[str, Any] | None:
    if state.best is None:
        return None
    best = state.trial(state.best)
    out: dict[str, Any] = {"config": knob_values(best.config), "trial": int(best.id)}
    if finite(best.value) is not None:
        out["score"] = finite(best.value)
    out.update(gate_status(state))
    return out


def gate_status(state: PolicyState) -> dict[str, Any]:
    """The significance gate's terms (``tuning/policy/gate.py``) as ``status.bestConfig`` shows them:
    its decision at convergence, else the verdict so far on the best against the deployed config
    (nothing when they are the same config or either is not measured)."""
    record = state.gate if state.gate is not None and state.gate.epoch == state.epoch else None
    if record is not None:
        terms = {
            "gain": record.gain, "confidence": record.confidence, "minGain": record.min_gain,
            "requiredConfidence": record.required, "windowNoise": record.noise,
        }  # fmt: skip
        decided: dict[str, Any] = {"significant": record.significant}
        if not record.significant:
            candidate = next((t for t in state.trials if t.id == record.candidate), None)
            if candidate is not None:
                decided["candidate"] = knob_values(candidate.config)
    else:
        judged = judge(state)
        if judged is None:
            return {}
        v = judged[0]
        terms = {
            "gain": v.gain, "confidence": v.confidence, "minGain": v.margin,
            "requiredConfidence": v.required, "windowNoise": v.noise,
        }  # fmt: skip
        decided = {}
    out: dict[str, Any] = {}
    for key, number in terms.items():
        value = finite(number)
        if value is not None:
            out[key] = round(value, 4) if key != "confidence" else round(min(max(value, 0.0), 1.0), 3)
    return out | decided


def diagnosis_status(diag: Diagnosis) -> dict[str, Any]:
    bound = diag.bound if diag.bound in API_BOUNDS else "unknown"
    out: dict[str, Any] = {
        "bound": bound,
        "notes": [clip(n, MAX_NOTE) for n in diag.notes() if n][:MAX_NOTES],
    }
    if diag.hit_rate is not None:
        out["hitRate"] = min(max(float(diag.hit_rate), 0.0), 1.0)
    if diag.prefill_reduction is not None:
        out["prefillReduction"] = min(max(float(diag.prefill_reduction), 0.0), 1.0)
    return out


def with_notes(diagnosis: Mapping[str, Any] | None, notes: Sequence[str]) -> dict[str, Any] | None:
    """``diagnosis`` with ``notes`` first (once each; an unknown bound when there is none yet)."""
    if not notes:
        return None if diagnosis is None else dict(diagnosis)
    out = dict(diagnosis or {"bound": "unknown"})
    first = [clip(n, MAX_NOTE) for n in notes]
    rest = [n for n in out.get("notes") or [] if n not in first]
    out["notes"] = [*first, *rest][:MAX_NOTES]
    return out


def recommendation_status(
    state: PolicyState, actions: Sequence[Action], previous: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Observe mode's recommendation with its id (what ``prefixtune.io/approve`` names); none once
    the policy has none (approved and rolled out, or another mode)."""
    rec = state.recommendation
    if rec is None:
        return None
    latest = [a for a in actions if isinstance(a, Recommend) and a.config == rec]
    if latest:
        out = {"config": knob_values(rec), "reason": clip(latest[-1].reason)}
    elif previous and previous.get("config") == knob_values(rec):
        out = dict(previous)
    else:
        out = {"config": knob_values(rec), "reason": ""}
    return {**out, "id": recommendation_id(rec)}


@dataclass(frozen=True)
class ScaleStatus:
    """What the scale subresource reads from the status (``status.replicas``, ``status.selector``)."""

    replicas: int
    selector: str


def scale_status(
    owner_name: str, deployments: Mapping[DeploymentRole, Mapping[str, Any] | None]
) -> ScaleStatus:
    """The engine pods that exist, ready or not: the sum of the engine Deployments' own
    ``status.replicas``, which is what a Deployment's scale reports (its non-terminated pods;
    readiness is the reader's business: an HPA takes the current count from the scale's spec and
    weighs unready pods itself). So it counts the pods the selector finds. During a canary trial it
    is spec.replicas, plus one while a canary loads before the stable pod goes. The selector picks
    every engine pod of the resource, both roles, as the Service does."""
    replicas = 0
    for role in ROLES:
        status = (deployments.get(role) or {}).get("status") or {}
        value = status.get("replicas") if isinstance(status, Mapping) else None
        replicas += value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
    return ScaleStatus(replicas=replicas, selector=selector_string(selector_labels(owner_name)))


def build_status(
    state: PolicyState,
    actions: Sequence[Action],
    previous: Mapping[str, Any] | None,
    *,
    now: float,
    generation: int,
    ready: tuple[bool, str, str],
    diagnosis: Diagnosis | None = None,
    valid_spec: Mapping[str, Any] | None = None,
    scale: ScaleStatus | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The whole status (for one merge patch). ``ready``: (ready?, reason, message) of the serving
    pods; ``valid_spec``: the spec rolled out (None keeps the one recorded before); ``scale``: the
    scale subresource's fields (None keeps the ones recorded before). The Tuning condition is the
    state's (``tuning_condition``), written every time: it follows the phase and step, and a fixed
    spec replaces an InvalidSpec one. The diagnosis describes ``currentConfig``: one made for
    another config is dropped until a window of this one replaces it. ``notes``: what is known of
    the spec before any window (``rules.gpu_notes``: a GPU the twin does not model), first among
    the diagnosis' notes."""
    prev = dict(previous or {})
    state = state.clipped()
    updates = [(a.type, a.status, a.reason, a.message) for a in actions if isinstance(a, SetCondition)]
    ok, reason, message = ready
    updates.append(("Ready", "True" if ok else "False", reason, message))
    tuning, tuning_reason, tuning_message = tuning_condition(state)
    updates.append(("Tuning", "True" if tuning else "False", str(tuning_reason), tuning_message))
    conditions = merge_conditions(prev.get("conditions") or [], updates, now, generation)
    trials = [trial_record(t) for t in state.trials if t.outcome != "running"][-MAX_TRIALS_IN_STATUS:]
    active = [trial_record(t) for t in state.trials if t.outcome == "running"]
    current = knob_values(state.current)
    kept = prev.get("diagnosis") if prev.get("currentConfig") == current else None
    status: dict[str, Any] = {
        "phase": str(state.phase),
        "observedGeneration": int(generation),
        "conditions": conditions,
        "currentConfig": current,
        "bestConfig": best_config(state),
        "budget": {"used": trials_spent(state), "maxTrials": int(state.settings.max_trials)},
        "trials": trials + active,
        "diagnosis": with_notes(diagnosis_status(diagnosis) if diagnosis is not None else kept, notes),
        "recommendation": recommendation_status(state, actions, prev.get("recommendation")),
        "policy": {"schema": POLICY_SCHEMA, POLICY_KEY: state.to_json()},
    }
    if scale is not None:
        status["replicas"], status["selector"] = scale.replicas, scale.selector
    else:
        status.update({k: prev[k] for k in ("replicas", "selector") if k in prev})
    if valid_spec is not None:
        status["policy"][POLICY_SPEC_KEY] = json.dumps(valid_spec, sort_keys=True)
    elif isinstance(prev.get("policy"), Mapping) and POLICY_SPEC_KEY in prev["policy"]:
        status["policy"][POLICY_SPEC_KEY] = prev["policy"][POLICY_SPEC_KEY]
    return status


def invalid_status(
    previous: Mapping[str, Any] | None, errors: Sequence[str], *, now: float, generation: int
) -> dict[str, Any]:
    """An invalid spec: Ready=False (InvalidSpec) naming the fields; the last good state is kept."""
    prev = dict(previous or {})
    message = "; ".join(errors)
    conditions = merge_conditions(
        prev.get("conditions") or [],
        [
            ("Ready", "False", "InvalidSpec", message),
            ("Tuning", "False", str(TuningReason.INVALID_SPEC), message),
        ],
        now,
        generation,
    )
    return {
        **prev,
        "phase": str(Phase.FAILED),
        "observedGeneration": int(generation),
        "conditions": conditions,
    }


def patch_changes(current: Any, patch: Any) -> bool:
    """Whether a JSON merge patch (RFC 7386: null deletes, objects merge, the rest replaces) of
    ``current`` would change it. The reconcile skips a status patch that would not: one write per
    tick of every resource, each a new resourceVersion and a watch event, for nothing."""
    if not isinstance(patch, Mapping):
        return bool(current != patch)
    if not isinstance(current, Mapping):
        return True
    for key, value in patch.items():
        if value is None:
            if key in current:
                return True
        elif key not in current or patch_changes(current[key], value):
            return True
    return False


def validate_status(status: Mapping[str, Any]) -> ServingDeploymentStatus:
    """Check a built status against the API model (tests, and a guard before patching)."""
    clean = {k: v for k, v in status.items() if v is not None}
    return ServingDeploymentStatus.model_validate(clean)
