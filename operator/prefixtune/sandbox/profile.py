"""Demo timings: what the sandbox changes in a ServingDeployment so that it tunes in minutes on 2 cores.

The examples carry production timings (3-minute warm-ups, 10-minute windows of at least 300
requests, 15-20 trials, a rollout every 15-20 minutes) and read their metrics from the operator's
Prometheus; run as written, one trial takes 13 minutes of wall time and the sandbox has no
Prometheus at that address. ``prefixtune sandbox up --demo-timings`` (and ``make demo``) admits every
ServingDeployment through ``DemoTimings.admit``, as a mutating admission webhook would: the stored
object says what runs (``kubectl get sdep NAME -o yaml``), and the annotation
``prefixtune.io/sandbox-profile: demo-timings`` marks it changed. What it sets:

- ``tuning.trial``: warm-up 2 s, measurement 8 s (sandbox seconds; at a 10x speed-up a window is 80
  simulated seconds), at least 6 requests a window;
- ``tuning.budget.maxTrials`` 5, ``tuning.rollout.minInterval`` 0s;
- ``tuning.drift.threshold`` 1.0 (windows of a few dozen requests are too noisy to read as drift);
- ``tuning.metrics`` ``{source: scrape}``: the pods' own endpoints (the sandbox's Prometheus, when
  it runs one, is not the operator's);
- ``spec.replicas`` at most 2 (fewer twins; a canary still runs beside the baseline);
- the load annotation ``prefixtune.io/sandbox-rate`` 1 request per simulated second, unless the
  object sets its own: 30-90 requests a window, what 2 cores keep up with at 10x (at 2 they no
  longer do).

``tuning.mode`` is kept: an observe-mode example still only recommends.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixtune.api.models import API_GROUP, PLURAL
from prefixtune.sandbox.load import RATE_ANNOTATION

PROFILE_ANNOTATION = "prefixtune.io/sandbox-profile"
DEMO_TIMINGS = "demo-timings"
MAX_REPLICAS = 2


@dataclass(frozen=True)
class DemoTimings:
    """The demo timings (see the module docstring); ``make demo``'s options change them."""

    warmup: str = "2s"
    measure: str = "8s"
    max_trials: int = 5
    min_requests: int = 6
    rate: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_trials <= 200:
            raise ValueError(f"max_trials: must be in 1..200, got {self.max_trials}")
        if not self.rate > 0:
            raise ValueError(f"rate: must be > 0, got {self.rate}")
        if self.min_requests < 1:
            raise ValueError(f"min_requests: must be >= 1, got {self.min_requests}")

    def resource(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A ServingDeployment with the demo timings (a new object; ``doc`` is not changed)."""
        out = copy.deepcopy(dict(doc))
        meta = out.setdefault("metadata", {})
        notes = meta.setdefault("annotations", {})
        notes[PROFILE_ANNOTATION] = DEMO_TIMINGS
        notes.setdefault(RATE_ANNOTATION, f"{self.rate:g}")
        spec = out.setdefault("spec", {})
        replicas = spec.get("replicas", 1)
        if isinstance(replicas, int) and replicas > MAX_REPLICAS:
            spec["replicas"] = MAX_REPLICAS
        tuning = spec.setdefault("tuning", {})
        if not isinstance(tuning, dict):
            return out  # not an object: left for validation to refuse, unchanged
        tuning["trial"] = {"warmup": self.warmup, "measure": self.measure, "minRequests": self.min_requests}
        tuning["budget"] = {**_mapping(tuning.get("budget")), "maxTrials": self.max_trials}
        tuning["rollout"] = {**_mapping(tuning.get("rollout")), "minInterval": "0s"}
        tuning["drift"] = {**_mapping(tuning.get("drift")), "threshold": 1.0}
        tuning["metrics"] = {"source": "scrape"}
        return out

    def admit(self, res: Any, obj: dict[str, Any]) -> dict[str, Any]:
        """The emulator's admission step (``RealisticEmulator.admission``): ServingDeployments get
        the demo timings, every other object passes unchanged."""
        if getattr(res, "group", None) == API_GROUP and getattr(res, "plural", None) == PLURAL:
            return self.resource(obj)
        return obj


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


__all__ = ["DEMO_TIMINGS", "MAX_REPLICAS", "PROFILE_ANNOTATION", "DemoTimings"]
