"""The tuning state machine's names: ``Phase`` and ``Step``, and the groups of steps the controller,
the bench driver and the tests ask about, declared once (as kopf declares ``HANDLER_REASONS`` beside
its ``Reason`` enum). Nothing else compares phase or step names as strings.

Phase: where the tuning run is (also ``status.phase``). Step: where the current trial (or the
converged apply) is. Idle: deciding, or waiting for the rollout rate limit. RollingBack: a rollback
is in flight. Watching: converged and measuring for drift. Paused: tuning.mode off (the spec's
config runs) or spec.tuning.paused (``PolicyState.paused_from`` says where it resumes).
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"
    BASELINE = "Baseline"
    EXPLORING = "Exploring"
    CONVERGED = "Converged"
    OBSERVING = "Observing"
    PAUSED = "Paused"
    FAILED = "Failed"


class Step(StrEnum):
    IDLE = "Idle"
    ROLLING_OUT = "RollingOut"
    WAITING_READY = "WaitingReady"
    WARMING_UP = "WarmingUp"
    MEASURING = "Measuring"
    SCORING = "Scoring"
    ROLLING_BACK = "RollingBack"
    WATCHING = "Watching"


class TuningReason(StrEnum):
    """The reasons of the Tuning condition (``policy/messages.tuning_condition``)."""

    PENDING = "Pending"
    BASELINE = "Baseline"
    EXPLORING = "Exploring"
    NO_CAPACITY = "NoCapacity"
    CONVERGED = "Converged"
    NO_SIGNIFICANT_GAIN = "NoSignificantGain"  # converged, keeping the deployed config
    INSUFFICIENT_TRAFFIC = "InsufficientTraffic"
    OBSERVING = "Observing"
    SIGNALS_MISSING = "SignalsMissing"
    TUNING_OFF = "TuningOff"
    PAUSED = "Paused"
    FAILED = "Failed"
    INVALID_SPEC = "InvalidSpec"


# A rollout (or rollback) is in flight: the pods are changing.
ROLLOUT_STEPS = frozenset({Step.ROLLING_OUT, Step.WAITING_READY, Step.ROLLING_BACK})
# A trial is in flight, from its rollout until it is scored.
TRIAL_STEPS = frozenset({Step.ROLLING_OUT, Step.WAITING_READY, Step.WARMING_UP, Step.MEASURING, Step.SCORING})
# The trial's pods run its config: warming the cache up or measured.
WINDOW_STEPS = frozenset({Step.WARMING_UP, Step.MEASURING})
# The search itself: the baseline and the trials after it.
SEARCH_PHASES = frozenset({Phase.BASELINE, Phase.EXPLORING})
# Nothing more happens without a spec change (or a restart of the tuning run).
HALTED_PHASES = frozenset({Phase.PAUSED, Phase.FAILED})


def watching(phase: Phase | str, step: Step | str) -> bool:
    """Converged, and measuring for drift."""
    return phase == Phase.CONVERGED and step == Step.WATCHING


def back_to_back(phase: Phase | str, step: Step | str) -> bool:
    """Measured in windows of ``measure_s`` back to back, no trial in flight: converged and watching
    for drift, or observing (observe mode, or auto mode refused: measuring and recommending)."""
    return watching(phase, step) or phase == Phase.OBSERVING


def settled(phase: Phase | str, step: Step | str) -> bool:
    """The tuning run is over for now: halted, or converged and watching for drift."""
    return phase in HALTED_PHASES or watching(phase, step)
