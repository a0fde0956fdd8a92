"""kopf handlers: thin. Each one calls ``reconcile`` (all logic lives in pure functions below it).

- create / update / resume of a ServingDeployment: reconcile at once (validate, render, status).
- a daemon per resource, ticking every ``tick_s``: the tuning loop's clock (observe, decide,
  persist, apply). It ends once the resource is gone.
- delete (optional, no finalizer): forget the in-memory window start.
- every event of a ServingDeployment: stamp when the operator's own status writes reach its view
  (``selfmetrics.WatchLag``, the watch-event lag).
- two indexes: the operator's own Deployments and pods, watched, so that a tick reads its children
  from memory (``children.py``).

No finalizer. The children carry ownerReferences to the resource, so the garbage collector deletes
them, and a deleted resource never waits for the operator (``kubectl delete`` completes with the
operator stopped or uninstalled). kopf adds its finalizer (``settings.persistence.finalizer``) to
every object with a timer or a daemon: ``kopf.timer`` and ``kopf.daemon`` register their handlers
with ``requires_finalizer=True`` (kopf/on.py), so that kopf can stop them before the object goes
(kopf/_core/reactor/processing.py). The tick is a daemon registered without that need
(``_no_finalizer``): the daemon stops itself when its reconcile finds the resource gone or being
deleted, and kopf still stops it when the operator exits or pauses for a peer. A resource that
carries kopf's finalizer from an earlier release is released by kopf on its first event (kopf
removes a finalizer no handler requires).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from prefixtune.api.models import API_GROUP, API_VERSION, PLURAL
from prefixtune.controller.children import (
    DEPLOYMENTS_INDEX,
    NAMES_INDEX,
    PODS_INDEX,
    WATCH_LABELS,
    index_entry,
    indexes_from,
    name_entry,
    pod_entry,
)
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

    async def on_change(memo: Any, namespace: str | None, name: str | None, **kwargs: Any) -> None:
        await reconcile(_ctx(memo), str(namespace or "default"), str(name), indexes=indexes_from(kwargs))

    async def tune(
        memo: Any,
        namespace: str | None,
        name: str | None,
        stopped: kopf.DaemonStopped,
        body: kopf.Body,
        **kwargs: Any,
    ) -> None:
        ctx = _ctx(memo)
        indexes = indexes_from(kwargs)  # kopf's live indexes of the children (``children.py``)
        clock = asyncio.get_running_loop().time
        while not stopped:
            began = clock()
            try:
                # ``body``: kopf's live view of the resource, kept current by its watch (the tick
                # reads the resource itself only when that view is not the version it knows).
                done = (
                    await reconcile(ctx, str(namespace or "default"), str(name), live=body, indexes=indexes)
                    is None
                )
            except Exception as err:  # the next tick retries; the loop must not die on one bad call
                logger.warning("reconcile of %s/%s failed (retrying next tick): %s", namespace, name, err)
                done = False
            if done:
                return  # the resource is gone or being deleted: its loop ends with it
            # On the tick grid (as a sharp kopf timer): a slow reconcile does not shift the next one.
            # A plain sleep: kopf cancels the daemon when it stops it (``cancellation_timeout``).
            await asyncio.sleep(tick_s - (clock() - began) % tick_s)

    async def on_delete(
        memo: Any, namespace: str | None, name: str | None, uid: str | None = None, **_: Any
    ) -> None:
        ctx = _ctx(memo)
        ctx.meter.forget(str(uid or ""))
        ctx.metrics.forget(str(namespace or "default"), str(name))

    async def on_event(memo: Any, namespace: str | None, name: str | None, body: kopf.Body, **_: Any) -> None:
        # Every event kopf hands over (after its batching): when the operator's writes reach its view.
        _ctx(memo).metrics.watch_lag.seen(f"{namespace or 'default'}/{name}", body)

    async def index_child(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
        # A coroutine: kopf runs a sync handler in its thread pool, a hop per watch event of every
        # pod and Deployment for a copy that takes microseconds (``bench scale``).
        return index_entry(namespace, labels, body)

    # The operator's own Deployments and pods, by their resource (``children.py``): a tick reads
    # these instead of listing them. kopf fills both before any handler runs.
    kopf.index("apps", "v1", "deployments", registry=registry, id=DEPLOYMENTS_INDEX, labels=WATCH_LABELS)(
        index_child
    )

    async def index_pod(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
        return pod_entry(namespace, labels, body)

    kopf.index("", "v1", "pods", registry=registry, id=PODS_INDEX, labels=WATCH_LABELS)(index_pod)

    async def index_name(namespace: str | None, name: str | None, **_: Any) -> Any:
        return name_entry(namespace, name)

    # Every Deployment's name (the same watch: kopf filters by label on its side): an ensure tells
    # "none of that name" from "someone else's" without a GET (``children.py``).
    kopf.index("apps", "v1", "deployments", registry=registry, id=NAMES_INDEX)(index_name)
    kopf.on.create(*resource, registry=registry, id="reconcile-create", backoff=2.0)(on_change)
    kopf.on.update(*resource, registry=registry, id="reconcile-update", backoff=2.0)(on_change)
    kopf.on.resume(*resource, registry=registry, id="reconcile-resume", backoff=2.0)(on_change)
    # Stopped (operator exit, peering pause): cancelled at once, abandoned after CANCEL_TIMEOUT_S.
    kopf.daemon(*resource, registry=registry, id=TUNE_ID, cancellation_timeout=CANCEL_TIMEOUT_S)(tune)
    _no_finalizer(registry, TUNE_ID)
    kopf.on.delete(*resource, registry=registry, id="forget", optional=True)(on_delete)
    kopf.on.event(*resource, registry=registry, id=WATCH_LAG_ID)(on_event)
    return registry


TUNE_ID = "tune"
WATCH_LAG_ID = "watch-lag"  # an event handler: measures the watch's lag (``selfmetrics.WatchLag``)
CANCEL_TIMEOUT_S = 10.0


def _no_finalizer(registry: kopf.OperatorRegistry, handler_id: str) -> None:
    """Register the daemon ``handler_id`` as one that needs no finalizer: kopf's decorator always
    says it does (kopf/on.py, ``requires_finalizer=True``), and kopf then adds its finalizer to every
    resource, so that a delete hangs while the operator is not running. kopf has no public switch
    for this; ``test_the_operator_registers_no_handler_that_needs_a_finalizer`` pins it."""
    spawning = registry._spawning
    found = [h for h in spawning.get_all_handlers() if h.id == handler_id]
    if len(found) != 1:
        raise RuntimeError(f"expected one kopf daemon {handler_id!r}, found {len(found)}")
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) if h.id == handler_id else h
        for h in spawning._handlers
    ]
