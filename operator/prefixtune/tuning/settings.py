"""TuningSettings: the plain settings the policy runs under (no kopf, no Kubernetes types).

A thin converter in the controller maps ``spec.tuning`` of the ServingDeployment onto this; the
offline benchmark builds it directly. Durations are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["off", "observe", "auto"]
Objective = Literal["goodput", "throughput", "ttft"]
Strategy = Literal["canary", "rolling"]
Method = Literal["bo", "random", "grid"]

MODES: tuple[str, ...] = ("off", "observe", "auto")
OBJECTIVES: tuple[str, ...] = ("goodput", "throughput", "ttft")
STRATEGIES: tuple[str, ...] = ("canary", "rolling")
METHODS: tuple[str, ...] = ("bo", "random", "grid")


@dataclass(frozen=True)
class Slo:
    ttft_p99_s: float = 2.0
    itl_p99_s: float = 0.150

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "itl_p99_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"slo.{name} must be > 0 seconds, got {value!r}")


@dataclass(frozen=True)
class SpaceOverride:
    """The resource's optional ``tuning.space``: narrows the adapter's searched knobs.

    ``None`` keeps the adapter's default for that knob. Values are validated against the adapter
    in ``space.build_space``.
    """

    memory_fraction: tuple[float, float] | None = None  # (min, max)
    block_size: tuple[int, ...] | None = None
    prefix_caching: tuple[bool, ...] | None = None
    schedule_policy: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TuningSettings:
    mode: Mode = "auto"
    objective: Objective = "goodput"
    slo: Slo = field(default_factory=Slo)
    space: SpaceOverride = field(default_factory=SpaceOverride)
    warmup_s: float = 180.0
    measure_s: float = 600.0
    min_requests: int = 300
    max_trials: int = 20
    strategy: Strategy = "rolling"
    min_interval_s: float = 900.0
    drift_threshold: float = 0.25
    ready_timeout_s: float = 600.0  # not ready by then -> the trial is infeasible (timeout)
    abort_factor: float = 3.0  # early abort when a partial window's p99 exceeds this x the SLO
    max_extensions: int = 2  # a window with too few requests is extended at most this many times
    method: Method = "bo"  # the benchmark compares methods; the operator always uses "bo"
    n_initial: int = 5  # space-filling trials (baseline included) before the surrogate leads
    convergence_ei: float = 0.01  # converged when max EI < this share of the best score
    seed_key: str = ""  # namespace/name of the resource; the optimizer seed derives from it
    # The engine release's gaps: signals the tuner reads that it does not export, and why the
    # objective cannot be scored there ("": it can). Set from the pod image by the controller.
    missing_signals: tuple[str, ...] = ()
    refusal: str = ""
    # Score a window only after the engine's effective config was read back (config_checked). The
    # operator always reads it back; the offline benchmark drives the twin with the config it set.
    verify_applied: bool = False

    def __post_init__(self) -> None:
        checks: list[tuple[str, Any, tuple[str, ...]]] = [
            ("mode", self.mode, MODES),
            ("objective", self.objective, OBJECTIVES),
            ("strategy", self.strategy, STRATEGIES),
            ("method", self.method, METHODS),
        ]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"tuning.{name}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
        positive = {
            "warmup_s": (self.warmup_s, True),
            "measure_s": (self.measure_s, False),
            "min_interval_s": (self.min_interval_s, True),
            "ready_timeout_s": (self.ready_timeout_s, False),
        }
        for name, (value, zero_ok) in positive.items():
            if value < 0 or (value == 0 and not zero_ok):
                raise ValueError(f"tuning.{name} must be {'>= 0' if zero_ok else '> 0'}, got {value!r}")
        if self.min_requests < 1:
            raise ValueError(f"tuning.min_requests must be >= 1, got {self.min_requests!r}")
        if not 1 <= self.max_trials <= 200:
            raise ValueError(f"tuning.max_trials must be in 1..200, got {self.max_trials!r}")
        if not 0 < self.drift_threshold <= 1:
            raise ValueError(f"tuning.drift_threshold must be in (0, 1], got {self.drift_threshold!r}")
        if self.abort_factor <= 1:
            raise ValueError(f"tuning.abort_factor must be > 1, got {self.abort_factor!r}")
        if self.n_initial < 1:
            raise ValueError(f"tuning.n_initial must be >= 1, got {self.n_initial!r}")
