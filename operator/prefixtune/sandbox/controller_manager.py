"""The sandbox's controller manager: the Deployment, ReplicaSet and Endpoints/EndpointSlice
controllers of ``controllers.py``, run level-triggered: every watch event (Deployments,
ReplicaSets, Pods, Services) wakes a full resync, and a periodic resync catches anything else.
``controllers.py`` computes the writes (a functional core); this module reads, applies and loops.

Each controller is handed only the objects that can concern it, grouped once per sync: a
Deployment its ReplicaSets, a ReplicaSet its pods (by owner uid), a Service the pods of its
namespace that carry its selector's rarest label.
Handing every controller every object made a sync O(N^2) (``bench scale`` at N = 500: a quarter of
the sandbox's CPU); the pure controllers filter the same way, so the writes are the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from prefixtune.sandbox import controllers as ctl
from prefixtune.sandbox.client import ApiClient, ApiStatusError
from prefixtune.sandbox.clock import SandboxClock
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.tasks import Wakeup

logger = logging.getLogger(__name__)


class ControllerManager:
    """Runs the Deployment, ReplicaSet and Endpoints controllers until cancelled."""

    def __init__(self, api: ApiClient, config: KubeletConfig, clock: SandboxClock | None = None) -> None:
        self.api = api
        self.config = config
        self.clock = clock or SandboxClock()  # progressDeadlineSeconds runs on sandbox time
        self.wakeup = Wakeup()
        self.syncs = 0

    async def run(self) -> None:
        while True:
            try:
                await self.sync()
            except (ApiStatusError, aiohttp.ClientError) as err:
                logger.warning("controller sync failed (retrying): %s", err)
            self.syncs += 1
            if self.config.min_sync_s > 0:
                await asyncio.sleep(self.config.min_sync_s)
            await self.wakeup.wait(self.config.resync_s)

    async def sync(self) -> None:
        """One pass of the three controllers. A collection is listed again only when the pass wrote
        what it holds (the ReplicaSets after the Deployment controller wrote, the pods after the
        ReplicaSet controller did): each list is the whole cluster's, encoded and decoded."""
        deployments = await self.api.list("/apis/apps/v1/deployments")
        replicasets = await self.api.list("/apis/apps/v1/replicasets")
        owned_sets = _by_owner(replicasets)
        wrote = False
        for deployment in deployments:
            try:
                now = self.clock.now()
                mine = owned_sets.get(_uid(deployment), [])
                writes = ctl.reconcile_deployment(deployment, mine, now, self.config.speedup)
            except ValueError as err:
                logger.warning("deployment %s: %s", deployment.get("metadata", {}).get("name"), err)
                continue
            wrote = await self._apply(writes) or wrote
        if wrote:
            replicasets = await self.api.list("/apis/apps/v1/replicasets")
        pods = await self.api.list("/api/v1/pods")
        owned_pods = _by_owner(pods)
        wrote = False
        for rs in replicasets:
            wrote = await self._apply(ctl.reconcile_replicaset(rs, owned_pods.get(_uid(rs), []))) or wrote
        await self._sync_endpoints(None if wrote else pods)

    async def _apply(self, writes: Iterable[ctl.Write]) -> bool:
        """Apply ``writes``; whether there was any."""
        wrote = False
        for write in writes:
            await self.api.apply(write)
            wrote = True
        return wrote

    async def _sync_endpoints(self, pods: Sequence[Mapping[str, Any]] | None = None) -> None:
        """``pods``: the pods as just listed (None: list them)."""
        services = await self.api.list("/api/v1/services")
        if pods is None:
            pods = await self.api.list("/api/v1/pods")
        existing = {_key(e): e for e in await self.api.list("/api/v1/endpoints")}
        slices = {_key(s): s for s in await self.api.list("/apis/discovery.k8s.io/v1/endpointslices")}
        wanted: set[tuple[str, str]] = set()
        by_label = _by_label(pods)
        for service in services:
            desired = ctl.endpoints_for(service, _candidates(service, by_label))
            if desired is None:
                continue
            endpoints, endpoint_slice = desired
            endpoints["metadata"]["labels"][MANAGED_LABEL] = "sandbox"
            ns = str(endpoints["metadata"]["namespace"])
            wanted.add(_key(endpoints))
            await self._upsert(
                f"/api/v1/namespaces/{ns}/endpoints", existing.get(_key(endpoints)), endpoints, ("subsets",)
            )
            await self._upsert(
                f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                slices.get(_key(endpoint_slice)),
                endpoint_slice,
                ("endpoints", "ports"),
            )
        for key, endpoints in existing.items():
            labels = endpoints.get("metadata", {}).get("labels") or {}
            if key not in wanted and labels.get(MANAGED_LABEL) == "sandbox":
                await self.api.delete(f"/api/v1/namespaces/{key[0]}/endpoints/{key[1]}")

    async def _upsert(
        self,
        collection: str,
        current: Mapping[str, Any] | None,
        desired: dict[str, Any],
        fields: tuple[str, ...],
    ) -> None:
        if current is None:
            await self.api.apply(ctl.Create(collection, desired))
            return
        if all(current.get(f) == desired.get(f) for f in fields):
            return
        await self.api.patch(f"{collection}/{desired['metadata']['name']}", {f: desired[f] for f in fields})


MANAGED_LABEL = "endpoints.kubernetes.io/managed-by"


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _by_owner(objs: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Objects by the uid of each owner they reference, in their listed order."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objs:
        refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
        for uid in dict.fromkeys(str(ref["uid"]) for ref in refs if ref.get("uid")):
            out.setdefault(uid, []).append(obj)
    return out


_LabelKey = tuple[str, str, str]  # (namespace, label, value)


def _by_label(pods: Iterable[Mapping[str, Any]]) -> dict[_LabelKey, list[Mapping[str, Any]]]:
    """Pods by each of their labels, per namespace, in their listed order."""
    out: dict[_LabelKey, list[Mapping[str, Any]]] = {}
    for pod in pods:
        ns = _key(pod)[0]
        for label, value in ((pod.get("metadata") or {}).get("labels") or {}).items():
            out.setdefault((ns, str(label), str(value)), []).append(pod)
    return out


def _candidates(
    service: Mapping[str, Any], by_label: Mapping[_LabelKey, list[Mapping[str, Any]]]
) -> list[Mapping[str, Any]]:
    """The pods that may match a Service's selector (a plain map): those of its namespace with the
    rarest of its labels (``endpoints_for`` checks the rest); none for a Service without one."""
    selector = (service.get("spec") or {}).get("selector") or {}
    ns = _key(service)[0]
    found = [by_label.get((ns, str(k), str(v)), []) for k, v in selector.items()]
    return min(found, key=len) if found else []


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


__all__ = ["MANAGED_LABEL", "ControllerManager"]
