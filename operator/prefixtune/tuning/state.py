"""The policy's state and observations: plain data that round-trips through JSON.

The controller stores ``PolicyState.to_json()`` in the resource's status (``status.policy``; the
trials also go to ``status.trials``) and feeds it back on the next event, so an operator restart
resumes mid-trial. Times are seconds on the caller's clock (wall time in the operator, virtual time
in the benchmark).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import Value, to_api
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import HeadroomLimit, ScoreBasis
from prefixtune.tuning.phases import Phase, Step, TuningReason
from prefixtune.tuning.settings import Strategy, TuningSettings

MAX_TEXT = 512  # characters of a free-text field kept in the state (a trial's reason): bounded status


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to at most ``limit`` characters, marked when cut (free text from pods, engines
    and metrics sources must not grow the status without bound)."""
    if len(text) <= limit:
        return text
    marker = " ... (truncated)"
    return text[: limit - len(marker)] + marker if limit > len(marker) else text[:limit]


Outcome = Literal["running", "ok", "infeasible", "aborted", "invalidated", "not_applied"]


def config_to_api(config: KnobConfig) -> dict[str, Any]:
    return to_api(config)


RECOMMENDATION_ID_CHARS = 12


def recommendation_id(config: KnobConfig) -> str:
    """The id of a recommendation of ``config`` (``status.recommendation.id``): a short hash of its
    knob values, so an approval (``prefixtune.io/approve``) names exactly the config it approves and
    one given for an earlier recommendation never matches a later, different one."""
    text = json.dumps(config_to_api(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:RECOMMENDATION_ID_CHARS]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)


class ValueTerms(_Model):
    """How a trial's ``value`` was made from its window, with every term needed to recompute it
    (``status.trials[].scoreBasis`` and ``scoreTerms`` show them):

    - ``measured``: value = the window's own score (``Trial.score``);
    - ``paired-with-baseline`` (a canary): value = ``anchor * ratio`` (``anchor / ratio`` for the
      ttft objective), ``anchor`` being the value of trial ``anchor_trial``, the config the stable
      pods ran; ``ratio`` = (score / canary_pods) / (baseline_window / baseline_pods) / split for
      rates (the ttft objective: baseline_window / score);
    - ``load-normalized`` (rolling): value = score * load_factor, load_factor = reference_rps /
      offered_rps within ``LOAD_FACTOR_BOUNDS``.

    Whatever the basis, a rate objective's window score is ``measured * headroom``
    (``objective.Headroom``: 1 at saturation, else how much more load the window's tail and KV pool
    leave room for), ``headroom_limit`` the budget that bounded it; the ttft objective has none.
    """

    basis: ScoreBasis
    anchor_trial: int | None = None
    anchor: float | None = None
    ratio: float | None = None
    baseline_window: float | None = None  # the stable pods' own score over the same window
    canary_pods: int | None = None
    baseline_pods: int | None = None
    split: float | None = None
    load_factor: float | None = None
    offered_rps: float | None = None
    reference_rps: float | None = None
    measured: float | None = None  # the window's objective as measured (score = measured * headroom)
    headroom: float | None = None
    headroom_limit: HeadroomLimit | None = None


class Trial(_Model):
    id: int  # monotonically assigned, never reused
    epoch: int  # the tuning generation it belongs to (drift and spec changes start a new one)
    role: Literal["baseline", "trial"]
    config: KnobConfig
    outcome: Outcome = "running"
    reason: str = ""
    # infeasible: oom | oom_startup | oom_runtime | crash | timeout; invalidated: too_little_traffic |
    # no_capacity (a pod Pending for lack of a GPU: the cluster's state, not the config's);
    # aborted: "" (an SLO breach) | spec_invalid (the spec turned invalid: not a result of the config)
    failure: str = ""
    started_at: float
    finished_at: float | None = None
    signals: Signals | None = None
    score: float | None = None  # the window's own score (objective units, SLO penalty applied)
    value: float | None = None  # what the optimizer is told: load-normalised / paired score
    basis: str = ""  # which signals ``score`` came from (Score.basis)
    terms: ValueTerms | None = None  # how ``value`` was made from the window (None: not scored)
    invalidations: int = 0  # pod restarts that forced a re-measurement
    # The effective config read back from the engine after the rollout (config_checked): a trial is
    # scored only once verified; one whose engine runs other knob values ends not_applied.
    verified: bool = False
    kv_tokens: int | None = None  # the KV pool the engine runs (tokens), where it exports it
    # How the trial rolled out (``tuning/routed.py``: a change of the router's knobs serves every pod,
    # so it rolls whatever the resource's strategy) and whether it restarted only the router (its
    # rollout waits for the router's start, not for the engines' load). None / False: the settings'
    # strategy, engines restarted (trials stored before routing was tuned).
    strategy: Strategy | None = None
    router_only: bool = False
    # A window the significance gate asked for (``policy/gate.py``): not counted in the budget.
    gate_window: bool = False

    def to_status(self) -> dict[str, Any]:
        """The trial as the resource's ``status.trials[]`` shows it (camelCase)."""
        return {
            "index": self.id,
            "epoch": self.epoch,
            "role": self.role,
            "config": config_to_api(self.config),
            "outcome": self.outcome,
            "reason": self.reason,
            "failure": self.failure or None,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "signals": None if self.signals is None else self.signals.to_dict(),
            "score": self.score,
            "value": self.value,
            "basis": self.basis or None,
            "terms": None if self.terms is None else self.terms.model_dump(mode="json", exclude_none=True),
            "kvTokens": self.kv_tokens,
        }


class GateRecord(_Model):
    """The significance gate's decision of an epoch (``policy/gate.py``, ``tuning/significance.py``):
    the candidate (the best by mean), the deployed config's trial, and the evidence."""

    epoch: int
    candidate: int  # the candidate's latest trial id
    deployed: int  # the deployed config's latest trial id
    # the candidate's mean over the deployed config's, minus 1; None: unbounded (the deployed scored 0)
    gain: float | None
    min_gain: float
    confidence: float  # P(true gain >= min_gain)
    required: float
    noise: float  # relative sd of a typical window under the noise model
    significant: bool  # False: no significant gain, the deployed config is kept


class PriorPoint(_Model):
    """An earlier epoch's trial folded out of ``PolicyState.trials`` (``tuning/history.py``): only
    what the optimizer's warm start and feasibility model read."""

    id: int
    epoch: int
    config: KnobConfig
    outcome: Literal["ok", "infeasible", "aborted", "not_applied"]
    value: float | None = None
    failure: str = ""


class WhatIf(_Model):
    """A what-if estimate (from the twin) of a config under the observed workload."""

    config: KnobConfig
    signals: Signals


class _Obs(BaseModel):
    """An observation: what the shell saw, handed to ``step``. Frozen; each kind carries only what it
    needs, and ``kind`` tells them apart in JSON (``parse_observation``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Tick(_Obs):
    """Time passed: timeouts, warm-ups ending, the next decision."""

    kind: Literal["tick"] = "tick"


class RolloutApplied(_Obs):
    """The Deployment's template carries the config rolled out (pods not ready yet)."""

    kind: Literal["rollout_applied"] = "rollout_applied"
    config: KnobConfig | None = None


class RolloutReady(_Obs):
    """Every pod of the rollout serves ``config`` (None: the caller does not say which)."""

    kind: Literal["rollout_ready"] = "rollout_ready"
    config: KnobConfig | None = None


class RolloutFailed(_Obs):
    kind: Literal["rollout_failed"] = "rollout_failed"
    config: KnobConfig | None = None
    failure: str = ""  # crash | oom | oom_startup | oom_runtime | timeout ("": crash)
    reason: str = ""


class RolloutNoCapacity(_Obs):
    """A pod of the rollout cannot be scheduled: no node has the GPUs (or other resources) free."""

    kind: Literal["rollout_no_capacity"] = "rollout_no_capacity"
    config: KnobConfig | None = None
    reason: str = ""  # the scheduler's message, with the pod's name


class WindowMeasured(_Obs):
    """A measurement window (or, ``partial``, part of one for the early-abort check)."""

    kind: Literal["window"] = "window"
    signals: Signals | None = None  # the pods under test (canary) or all pods (rolling)
    baseline_signals: Signals | None = None  # canary strategy: the stable pods, same window
    canary_pods: int = 1
    baseline_pods: int = 1
    partial: bool = False
    offered_rps: float | None = None  # ARRIVAL rate over the window (load-aware normalisation)
    what_if: tuple[WhatIf, ...] = ()  # observe mode: the twin's estimates for other configs


class SpecChanged(_Obs):
    kind: Literal["spec_changed"] = "spec_changed"
    settings: TuningSettings | None = None
    config: KnobConfig | None = None  # spec.config
    generation: int | None = None  # metadata.generation
    # a stable hash of what each pod is besides the knobs (engine, model, image, GPUs, extra args);
    # "" when the caller does not know it
    deployment_key: str = ""
    # a stable hash of the whole spec except the replicas (equal: only the replicas changed); ""
    # when the caller does not know it
    spec_key: str = ""
    replicas: int | None = None  # spec.replicas (None: not known)
    reason: str = ""  # what changed, for the DeploymentChanged Event


class MetricsUnavailable(_Obs):
    kind: Literal["metrics_unavailable"] = "metrics_unavailable"
    reason: str = ""


class TrialInvalidated(_Obs):
    """The window in flight is not the trial's (pods restarted, counters reset, operator restart)."""

    kind: Literal["trial_invalidated"] = "trial_invalidated"
    reason: str = ""


class SpecInvalid(_Obs):
    """The spec was edited to one that does not validate: the trial in flight is aborted (the state
    is kept; tuning resumes from it once the spec is fixed)."""

    kind: Literal["spec_invalid"] = "spec_invalid"
    reason: str = ""  # the validation errors (field names; never a secret's value)


class Approved(_Obs):
    """The resource carries an approval (annotation ``prefixtune.io/approve``) the policy has not
    handled yet: observe mode rolls its recommendation out once when ``id`` is its id ("": the
    annotation was removed, so that the same id set again approves again)."""

    kind: Literal["approved"] = "approved"
    id: str = Field(max_length=64)


class ConfigChecked(_Obs):
    """The effective config read back from the engine after a rollout."""

    kind: Literal["config_checked"] = "config_checked"
    config: KnobConfig | None = None  # the config the rollout intended
    # "knob: intended X, running Y (pod)" for every knob the engine does not run as asked (empty:
    # applied, or not verifiable on this engine)
    mismatches: tuple[str, ...] = ()
    kv_tokens: int | None = None  # the KV pool the engine reports (tokens)
    reason: str = ""  # why it could not be checked


Observation = Annotated[
    Tick
    | RolloutApplied
    | RolloutReady
    | RolloutFailed
    | RolloutNoCapacity
    | WindowMeasured
    | SpecChanged
    | MetricsUnavailable
    | TrialInvalidated
    | SpecInvalid
    | ConfigChecked
    | Approved,
    Field(discriminator="kind"),
]
_OBSERVATION: TypeAdapter[Observation] = TypeAdapter(Observation)


def parse_observation(text: str | bytes) -> Observation:
    """An observation from its JSON (``model_dump_json()``), by its ``kind``."""
    return _OBSERVATION.validate_json(text)


class CapacityWait(_Model):
    """A trial paused for lack of capacity: its config is tried again at ``retry_at`` (backoff)."""

    config: KnobConfig
    epoch: int  # a new epoch (drift, spec change) drops the wait: its search starts afresh
    attempts: int = 1  # trials of this config that found no capacity in a row
    retry_at: float
    reason: str = ""


class PolicyState(_Model):
    engine: str
    settings: TuningSettings
    phase: Phase = Phase.PENDING
    step: Step = Step.IDLE
    step_since: float = 0.0
    spec_generation: int = 0
    deployment_key: str = ""  # the spec's deployment hash the current epoch was tuned for ("": not seen)
    spec_key: str = ""  # SpecChanged.spec_key of the spec last seen ("": not seen)
    replicas: int = 0  # spec.replicas of the spec last seen (0: not seen)
    epoch: int = 0  # tuning generation: +1 on drift re-tune and on spec changes that re-open the search
    spec_config: KnobConfig  # what the resource's spec.config says
    current: KnobConfig  # what the stable pods run
    target: KnobConfig | None = None  # what a rollout in flight is bringing up
    # The current epoch's trials and the latest earlier ones in full; older trials are summarized
    # into ``prior`` (bounded: ``tuning/history.py``), so the state's size does not grow with age.
    trials: list[Trial] = Field(default_factory=list)
    prior: list[PriorPoint] = Field(default_factory=list)
    next_trial_id: int = 0
    active: int | None = None  # id of the trial in flight
    warm_until: float | None = None
    measure_from: float | None = None
    measure_until: float | None = None
    extensions: int = 0
    last_rollout_at: float | None = None
    metrics_held: bool = False
    best: int | None = None  # id of the best ok trial of the current epoch
    reference: Signals | None = None  # the signals the best was measured under (drift reference)
    reference_rps: float | None = None
    # Consecutive watch windows whose workload moved from ``reference`` (drift re-tunes at
    # ``policy/drift_watch.DRIFT_WINDOWS``; a window that did not move resets it)
    drift_windows: int = 0
    recommendation: KnobConfig | None = None  # last recommendation made (observe mode)
    capacity_wait: CapacityWait | None = None  # a trial that found no capacity, to retry
    # Paused by spec.tuning.paused: the phase it resumes in (None: not paused by it; mode off has its
    # own Paused), and whether the spec changed meanwhile so that resuming starts a fresh baseline.
    paused_from: Phase | None = None
    resume_fresh: bool = False
    approval: str = ""  # the last approval (annotation value) handled: each is acted on once
    note: str = ""  # why the phase is what it is (converged reason, failure)
    # The Tuning condition's reason for ``note`` (None: the phase's own, e.g. Converged)
    note_reason: TuningReason | None = None
    # Knobs not searched by default that this epoch's baseline put into the space, with their values
    # (``tuning/widening.py``; set once when the baseline is scored, empty until then).
    widened: dict[str, list[Value]] = Field(default_factory=dict)
    gate: GateRecord | None = None  # the significance gate's decision this epoch (None: not decided)

    def to_json(self) -> str:
        return self.model_dump_json()

    def clipped(self) -> PolicyState:
        """The state with every free-text field within ``MAX_TEXT`` (``self`` when it already is): the
        policy clips what it writes, this also bounds a state written by an older release."""
        if all(len(t.reason) <= MAX_TEXT for t in self.trials) and len(self.note) <= MAX_TEXT:
            return self
        trials = [
            t.model_copy(update={"reason": clip(t.reason)}) if len(t.reason) > MAX_TEXT else t
            for t in self.trials
        ]
        return self.model_copy(update={"trials": trials, "note": clip(self.note)})

    @classmethod
    def from_json(cls, text: str) -> PolicyState:
        return cls.model_validate_json(text)

    def strategy_of(self, trial: Trial) -> Strategy:
        """How ``trial`` rolled out: recorded at its start (a routing change rolls whatever the
        resource's strategy: ``tuning/routed.py``), else the settings' strategy."""
        return trial.strategy or self.settings.strategy

    def trial(self, trial_id: int) -> Trial:
        for t in self.trials:
            if t.id == trial_id:
                return t
        raise KeyError(f"no trial {trial_id}")
