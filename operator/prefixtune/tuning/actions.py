"""What the policy asks the shell to do: plain data, executed by the controller (or the bench).

Every action has ``kind`` and ``to_dict()`` (JSON-ready, camelCase keys where they reach the API).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.state import Trial


@dataclass(frozen=True)
class RollOut:
    config: KnobConfig
    strategy: str  # canary (trial on a canary pod beside the stable ones) | rolling (all pods)
    reason: str
    trial: int | None = None  # the trial this rollout starts; None for applying the best config
    kind: Literal["RollOut"] = "RollOut"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "config": self.config.to_dict(),
            "strategy": self.strategy,
            "reason": self.reason,
            "trial": self.trial,
        }


@dataclass(frozen=True)
class RollBack:
    to_config: KnobConfig
    reason: str
    kind: Literal["RollBack"] = "RollBack"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "toConfig": self.to_config.to_dict(), "reason": self.reason}


@dataclass(frozen=True)
class RecordTrial:
    trial: Trial  # a finished trial (outcome ok | infeasible | aborted | invalidated), recorded once
    kind: Literal["RecordTrial"] = "RecordTrial"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "trial": self.trial.to_status()}


@dataclass(frozen=True)
class EmitEvent:
    type: Literal["Normal", "Warning"]
    reason: str  # CamelCase, e.g. TrialStarted
    message: str  # what changed, why, on which evidence
    kind: Literal["EmitEvent"] = "EmitEvent"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "type": self.type, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class SetCondition:
    type: str  # Ready | Tuning | Degraded | MetricsUnavailable
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    kind: Literal["SetCondition"] = "SetCondition"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True)
class Recommend:
    config: KnobConfig
    reason: str
    kind: Literal["Recommend"] = "Recommend"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "config": self.config.to_dict(), "reason": self.reason}


Action = RollOut | RollBack | RecordTrial | EmitEvent | SetCondition | Recommend
