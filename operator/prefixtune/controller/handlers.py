"""kopf handlers: thin. Each one calls ``reconcile`` (all logic lives in pure functions below it).

- create / update / resume of a ServingDeployment: reconcile at once (validate, render, status).
- a timer every ``tick_s``: the tuning loop's clock (observe, decide, persist, apply).
- delete (optional, no finalizer): forget the in-memory window start. The children carry
  ownerReferences to the resource, so the garbage collector deletes them; no finalizer is added and
  a deleted resource never waits for the operator.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from prefixtune.api.models import API_GROUP, API_VERSION, PLURAL
from prefixtune.controller.reconcile import OperatorContext, reconcile

logger = logging.getLogger(__name__)


def _ctx(memo: Any) -> OperatorContext:
    ctx = getattr(memo, "ctx", None)
    if not isinstance(ctx, OperatorContext):
        raise kopf.PermanentError(
            "the operator context is missing from kopf's memo (start it with prefixtune run)"
        )
    return ctx


def build_registry(tick_s: float = 5.0) -> kopf.OperatorRegistry:
    """The operator's handlers on a fresh registry (the tick interval is a start-up setting)."""
    if not tick_s > 0:
        raise ValueError(f"--tick must be > 0 seconds, got {tick_s!r}")
    registry = kopf.OperatorRegistry()
    resource = (API_GROUP, API_VERSION, PLURAL)

    async def on_change(memo: Any, namespace: str | None, name: str | None, **_: Any) -> None:
        await reconcile(_ctx(memo), str(namespace or "default"), str(name))

    async def on_tick(memo: Any, namespace: str | None, name: str | None, **_: Any) -> None:
        try:
            await reconcile(_ctx(memo), str(namespace or "default"), str(name))
        except kopf.PermanentError:
            raise
        except Exception as err:  # the next tick retries; a timer must not die on one bad call
            logger.warning("reconcile of %s/%s failed (retrying next tick): %s", namespace, name, err)

    async def on_delete(
        memo: Any, namespace: str | None, name: str | None, uid: str | None = None, **_: Any
    ) -> None:
        ctx = _ctx(memo)
        ctx.meter.forget(str(uid or ""))
        ctx.metrics.forget(str(namespace or "default"), str(name))

    kopf.on.create(*resource, registry=registry, id="reconcile-create", backoff=2.0)(on_change)
    kopf.on.update(*resource, registry=registry, id="reconcile-update", backoff=2.0)(on_change)
    kopf.on.resume(*resource, registry=registry, id="reconcile-resume", backoff=2.0)(on_change)
    kopf.timer(*resource, registry=registry, id="tune", interval=tick_s, sharp=True)(on_tick)
    kopf.on.delete(*resource, registry=registry, id="forget", optional=True)(on_delete)
    return registry
