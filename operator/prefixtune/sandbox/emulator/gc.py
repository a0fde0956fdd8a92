"""Garbage collection: dependents of a really deleted owner are deleted or lose the reference."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import attrs
from kmock._internal import k8s_dicts

from prefixtune.sandbox.emulator.core import EmulatorCore, _Key, _meta, _now
from prefixtune.sandbox.emulator.errors import ApiError

logger = logging.getLogger(__name__)


@attrs.define(kw_only=True, slots=False)
class GarbageCollection(EmulatorCore):
    """Background collection by ``ownerReferences[].uid``, transitive, finalizers respected."""

    _gc_tasks: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for task in list(self._gc_tasks):
            task.cancel()
        await asyncio.gather(*self._gc_tasks, return_exceptions=True)
        await super().__aexit__(exc_type, exc_value, traceback)

    async def settle(self) -> None:
        """Wait until the background garbage collection has nothing left to do."""
        while self._gc_tasks:
            await asyncio.gather(*list(self._gc_tasks), return_exceptions=True)

    def _live_uids(self) -> set[Any]:
        return {_meta(o.raw).get("uid") for o in self._objects.values() if not o.deleted}

    def _collect_if_dangling(self, obj: Mapping[str, Any]) -> None:
        """A dependent created after all its owners are gone is collected, as kube's garbage
        collector does with dangling owner references: a controller acting on a stale list (a
        ReplicaSet replacing a crashed pod while its Deployment is being deleted) must not leave a
        pod behind that nothing will ever delete."""
        uids = [str(r["uid"]) for r in _meta(obj).get("ownerReferences") or [] if r.get("uid")]
        if not uids:
            return
        live = self._live_uids()
        if any(uid in live for uid in uids):
            return
        loop = asyncio.get_running_loop()
        for uid in uids:
            task = loop.create_task(self._collect_garbage(uid, False))
            self._gc_tasks.add(task)
            task.add_done_callback(self._gc_tasks.discard)

    async def _collect_garbage(self, owner_uid: str, orphan: bool) -> None:
        async with self._lock:
            live_uids = self._live_uids()
            for key, stored in list(self._objects.items()):
                if stored.deleted:
                    continue
                refs = _meta(stored.raw).get("ownerReferences") or []
                if not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                try:
                    await self._collect_one(key, stored, owner_uid, orphan, live_uids)
                except ApiError as exc:  # e.g. the dependent's resource was undeclared meanwhile
                    logger.warning("emulator: garbage collection of %s skipped: %s", key, exc.message)

    async def _collect_one(
        self, key: _Key, stored: k8s_dicts.Object, owner_uid: str, orphan: bool, live_uids: set[Any]
    ) -> None:
        """One dependent of a deleted owner: strip the reference, or delete it (finalizers respected)."""
        res, current = key[0], stored.raw
        others = [ref for ref in _meta(current).get("ownerReferences") or [] if ref.get("uid") != owner_uid]
        if orphan or any(ref.get("uid") in live_uids for ref in others):
            updated = copy.deepcopy(current)
            updated["metadata"]["ownerReferences"] = others
            if not others:
                del updated["metadata"]["ownerReferences"]
            await self._update(res, key, current, updated, None, dry=False)
        elif _meta(current).get("finalizers"):
            if "deletionTimestamp" not in _meta(current):
                marked = copy.deepcopy(current)
                marked["metadata"].update(
                    deletionTimestamp=_now(),
                    deletionGracePeriodSeconds=0,
                    resourceVersion=str(self._next_rv()),
                )
                stored.history.append(marked)
                await self._emit(res, "MODIFIED", marked, current)
        else:
            final = copy.deepcopy(current)
            final["metadata"]["resourceVersion"] = str(self._next_rv())
            await self._remove(res, key, final)
