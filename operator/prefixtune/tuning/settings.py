"""TuningSettings: the plain settings the policy runs under (no kopf, no Kubernetes types).

A thin converter in the controller maps ``spec.tuning`` of the ServingDeployment onto this; the
offline benchmark builds it directly. Durations are seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from prefixtune.engines.knobs import BY_NAME, KNOB_NAMES, KNOBS, KnobKind, Value, knob
from prefixtune.metrics.histogram import Slo as Slo  # the one Slo
from prefixtune.routing.policy import Router

Mode = Literal["off", "observe", "auto"]


class Objective(StrEnum):
    """What the tuner maximises (``spec.tuning.objective``; tuning/objective.py says how)."""

    GOODPUT = "goodput"
    THROUGHPUT = "throughput"
    TTFT = "ttft"


Strategy = Literal["canary", "rolling"]
Method = Literal["bo", "random", "grid"]

MODES: tuple[str, ...] = ("off", "observe", "auto")
OBJECTIVES: tuple[str, ...] = tuple(Objective)
STRATEGIES: tuple[str, ...] = ("canary", "rolling")
METHODS: tuple[str, ...] = ("bo", "random", "grid")


class _SpaceOverride:
    """The resource's optional ``tuning.space``: narrows the adapter's searched knobs.

    A frozen dataclass with one field per registry knob (``SpaceOverride(block_size=(16, 32))``): a
    ``(min, max)`` range for a fraction, the values to try for any other knob, ``None`` to keep the
    adapter's default. Values are validated against the adapter in ``space.build_space``.
    """

    if TYPE_CHECKING:  # the fields are the registry's knobs (read them with ``get``)

        def __init__(self, **knobs: Sequence[Value] | None) -> None: ...

        def __getattr__(self, name: str) -> tuple[Value, ...] | None: ...

    @classmethod
    def from_mapping(cls, data: Mapping[str, Sequence[object] | None]) -> SpaceOverride:
        """From plain data (a scenario file, the resource's spec): each value as its knob's type."""
        unknown = [name for name in data if name not in BY_NAME]
        if unknown:
            raise ValueError(f"space: unknown knob {unknown[0]!r}; known knobs: {', '.join(KNOB_NAMES)}")
        return SpaceOverride(
            **{
                name: None if values is None else tuple(knob(name).coerce(v) for v in values)
                for name, values in data.items()
            }
        )

    def get(self, name: str) -> tuple[Value, ...] | None:
        value: tuple[Value, ...] | None = getattr(self, knob(name).name)
        return value


# The field type of each knob's override, by its kind (what the policy state's JSON reads back as).
_OVERRIDE_TYPE: dict[KnobKind, Any] = {
    KnobKind.FRACTION: tuple[float, float],
    KnobKind.INTEGER: tuple[int, ...],
    KnobKind.SWITCH: tuple[bool, ...],
    KnobKind.NAME: tuple[str, ...],
    KnobKind.NUMBER: tuple[float, ...],
}

if TYPE_CHECKING:
    SpaceOverride = _SpaceOverride
else:
    SpaceOverride = make_dataclass(
        "SpaceOverride",
        [(k.name, _OVERRIDE_TYPE[k.kind] | None, field(default=None)) for k in KNOBS],
        bases=(_SpaceOverride,),
        frozen=True,
    )
    SpaceOverride.__module__ = __name__  # make_dataclass's module= is Python 3.12+
    SpaceOverride.__doc__ = _SpaceOverride.__doc__


@dataclass(frozen=True)
class TuningSettings:
    mode: Mode = "auto"
    paused: bool = False  # spec.tuning.paused: finish or stop the trial in flight, start nothing new
    objective: Objective = Objective.GOODPUT
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
    # The significance gate (``tuning/significance.py``): leave the deployed config only for a gain
    # of at least ``min_gain`` (a share: 0.02 is 2%) held with at least ``confidence`` (0..1).
    min_gain: float = 0.02
    confidence: float = 0.95
    # A trial's price: seconds of service a restart of its pods loses (weights loaded, engine up),
    # and how long a better config is expected to run (the gain that pays for the trials).
    restart_cost_s: float = 60.0
    payback_s: float = 86400.0
    seed_key: str = ""  # namespace/name of the resource; the optimizer seed derives from it
    # The engine release's gaps: signals the tuner reads that it does not export, and why the
    # objective cannot be scored there ("": it can). Set from the pod image by the controller.
    missing_signals: tuple[str, ...] = ()
    refusal: str = ""
    # Score a window only after the engine's effective config was read back (config_checked). The
    # operator always reads it back; the offline benchmark drives the twin with the config it set.
    verify_applied: bool = False
    # The router the resource runs in front of its engines (spec.routing's), whose knobs the search
    # may tune with two replicas or more (``tuning/routed.py``); None: no router is known (the offline
    # benchmark's single engine), the router's knobs are searched only where the space lists them.
    router: Router | None = None

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
        if not 0 <= self.min_gain <= 1:
            raise ValueError(f"tuning.min_gain must be in [0, 1], got {self.min_gain!r}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"tuning.confidence must be in [0.5, 1), got {self.confidence!r}")
        if self.restart_cost_s < 0 or self.payback_s <= 0:
            raise ValueError(
                f"tuning.restart_cost_s must be >= 0 and payback_s > 0, got {self.restart_cost_s!r}, "
                f"{self.payback_s!r}"
            )
