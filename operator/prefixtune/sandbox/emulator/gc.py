"""Garbage collection: dependents of a really deleted owner are deleted or lose the reference.

The collector finds an owner's dependents, and tells whether an owner is alive, from two indexes
fed by every write the emulator announces (``_emit``) instead of scanning every stored object: with
a fleet of resources (``bench scale``: thousands of pods, ReplicaSets and Events, and the history of
every deleted one) that scan on each delete and each create with an owner took a third of the
sandbox's CPU. The indexes are supersets (an object keeps its entry after it drops a reference or
is deleted), so each hit is checked against the stored object before it counts.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import attrs
import kmock
from kmock._internal import k8s_dicts

from prefixtune.sandbox.emulator.core import EmulatorCore, _Key, _meta, _now
from prefixtune.sandbox.emulator.errors import ApiError

logger = logging.getLogger(__name__)


@attrs.define(kw_only=True, slots=False)
class GarbageCollection(EmulatorCore):
    """Background collection by ``ownerReferences[].uid``, transitive, finalizers respected."""

    _gc_tasks: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)
    # Owner uid -> the keys of objects written with a reference to it, in the order first seen.
    _dependents: dict[str, dict[_Key, None]] = attrs.field(factory=dict, init=False)
    # uid -> the key of the object written with it (whether it is still there: ``_is_live``).
    _uid_keys: dict[str, _Key] = attrs.field(factory=dict, init=False)

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

    async def _emit(
        self, res: kmock.resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        if kind != "DELETED":
            self._track(res, obj)
        await super()._emit(res, kind, obj, old)

    def _track(self, res: kmock.resource, obj: Mapping[str, Any]) -> None:
        """Index an object as written: its uid, and the owners it references."""
        meta = _meta(obj)
        namespace = meta.get("namespace")
        key: _Key = (res, None if namespace is None else str(namespace), str(meta.get("name")))
        if uid := meta.get("uid"):
            self._uid_keys[str(uid)] = key
        for ref in meta.get("ownerReferences") or []:
            if owner := ref.get("uid"):
                self._dependents.setdefault(str(owner), {})[key] = None

    def _is_live(self, uid: str) -> bool:
        """Whether an object with this uid exists (not deleted, not replaced by one of the same name)."""
        key = self._uid_keys.get(uid)
        if key is None:  # never written through a request (the pre-created namespaces): look
            return any(_meta(o.raw).get("uid") == uid for o in self._objects.values() if not o.deleted)
        live = self._live(key)
        return live is not None and _meta(live).get("uid") == uid

    def _owned(self, owner_uid: str) -> list[tuple[_Key, k8s_dicts.Object]]:
        """The live objects that reference ``owner_uid`` now."""
        found = []
        for key in list(self._dependents.get(owner_uid, ())):
            if key not in self._objects or (stored := self._objects[key]).deleted:
                continue
            refs = _meta(stored.raw).get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in refs):
                found.append((key, stored))
        return found

    def _collect_if_dangling(self, obj: Mapping[str, Any]) -> None:
        """A dependent created after all its owners are gone is collected, as kube's garbage
        collector does with dangling owner references: a controller acting on a stale list (a
        ReplicaSet replacing a crashed pod while its Deployment is being deleted) must not leave a
        pod behind that nothing will ever delete."""
        uids = [str(r["uid"]) for r in _meta(obj).get("ownerReferences") or [] if r.get("uid")]
        if not uids:
            return
        if any(self._is_live(uid) for uid in uids):
            return
        loop = asyncio.get_running_loop()
        for uid in uids:
            task = loop.create_task(self._collect_garbage(uid, False))
            self._gc_tasks.add(task)
            task.add_done_callback(self._gc_tasks.discard)

    async def _collect_garbage(self, owner_uid: str, orphan: bool) -> None:
        async with self._lock:
            for key, stored in self._owned(owner_uid):
                if stored.deleted:  # collected meanwhile (a dependent of two deleted owners)
                    continue
                try:
                    await self._collect_one(key, stored, owner_uid, orphan)
                except ApiError as exc:  # e.g. the dependent's resource was undeclared meanwhile
                    logger.warning("emulator: garbage collection of %s skipped: %s", key, exc.message)

    async def _collect_one(self, key: _Key, stored: k8s_dicts.Object, owner_uid: str, orphan: bool) -> None:
        """One dependent of a deleted owner: strip the reference, or delete it (finalizers respected)."""
        res, current = key[0], stored.raw
        others = [ref for ref in _meta(current).get("ownerReferences") or [] if ref.get("uid") != owner_uid]
        if orphan or any(self._is_live(str(ref.get("uid"))) for ref in others if ref.get("uid")):
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
                self._record(key, marked)
                await self._emit(res, "MODIFIED", marked, current)
        else:
            final = copy.deepcopy(current)
            final["metadata"]["resourceVersion"] = str(self._next_rv())
            await self._remove(res, key, final)
