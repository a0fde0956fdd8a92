"""The enumerations of the ServingDeployment resource (their values are the YAML spellings)."""

from __future__ import annotations

from enum import StrEnum

# One Phase: the tuning policy's phase is status.phase; one Objective: the policy's.
from prefixtune.tuning.objective import HeadroomLimit as HeadroomLimit
from prefixtune.tuning.objective import ScoreBasis as ScoreBasis
from prefixtune.tuning.phases import Phase as Phase
from prefixtune.tuning.settings import Objective as Objective


class GpuType(StrEnum):
    """The GPU types the twin models (``twin.catalog.GPUS``); ``spec.gpu.type`` takes any other too."""

    H100_80GB = "H100-80GB"
    H200 = "H200"
    A100_80GB = "A100-80GB"


class TuningMode(StrEnum):
    OFF = "off"
    OBSERVE = "observe"
    AUTO = "auto"


class RolloutStrategy(StrEnum):
    CANARY = "canary"
    ROLLING = "rolling"


class MetricsSource(StrEnum):
    PROMETHEUS = "prometheus"
    SCRAPE = "scrape"


class ConditionType(StrEnum):
    READY = "Ready"
    TUNING = "Tuning"
    DEGRADED = "Degraded"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    SIGNALS_MISSING = "SignalsMissing"  # the engine release does not export series the tuner reads


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class TrialOutcome(StrEnum):
    OK = "ok"
    INFEASIBLE = "infeasible"
    ABORTED = "aborted"
    INVALIDATED = "invalidated"
    NOT_APPLIED = "not_applied"  # the engine ran other knob values than rendered: never scored
    RUNNING = "running"


class TrialRole(StrEnum):
    """What a trial measured: the running config (a tuning run's baseline) or a config tried."""

    BASELINE = "baseline"
    TRIAL = "trial"


class Bound(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    KV_CAPACITY = "kv-capacity"
    QUEUEING = "queueing"
    UNKNOWN = "unknown"
