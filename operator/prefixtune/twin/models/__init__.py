"""One twin model per engine, chosen through a registry (``base.py``; one module per engine)."""

from prefixtune.twin.models.base import (
    SchedulerDefaults,
    TwinModel,
    find_twin_model,
    known,
    register,
    twin_model,
    unregister,
)

__all__ = [
    "SchedulerDefaults",
    "TwinModel",
    "find_twin_model",
    "known",
    "register",
    "twin_model",
    "unregister",
]
