"""The sandbox's API client: the operator's ``KubeClient`` plus what the sandbox's loops need.

Nothing here touches the emulator's memory: what an operator sees is what was written. The
controllers (``controller_manager.py``), the kubelet and the load manager write through
``ApiClient.apply`` and ``ApiClient.patch`` and wake up on ``run_watches``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from prefixtune.controller.kube import Connection, KubeClient, KubeError
from prefixtune.sandbox import controllers as ctl
from prefixtune.sandbox.tasks import Wakeup

logger = logging.getLogger(__name__)

WATCHED = (
    "/apis/apps/v1/deployments",
    "/apis/apps/v1/replicasets",
    "/api/v1/pods",
    "/api/v1/services",
    "/api/v1/configmaps",
)


ApiStatusError = KubeError  # the API server answered with an error Status


class ApiClient(KubeClient):
    """``KubeClient`` on a given session, with 404-tolerant merge patches, controller writes and
    watches that only wake their listeners."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        super().__init__(Connection(server=base_url.rstrip("/")), session)

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge patch; None when the object is gone."""
        try:
            return await self.merge_patch(path, body)
        except ApiStatusError as err:
            if err.status == 404:
                return None
            raise

    async def apply(self, write: ctl.Write) -> None:
        if isinstance(write, ctl.Create):
            try:
                await self.create(write.path, write.body)
            except ApiStatusError as err:
                if err.status != 409:  # someone created it first: the next resync sees it
                    raise
        elif isinstance(write, ctl.Patch):
            await self.patch(write.path, write.body)
        else:
            await self.delete(write.path)

    async def watch_forever(self, path: str, on_event: Callable[[], None], timeout_s: int = 60) -> None:
        """Watch ``path`` (all namespaces), calling ``on_event`` for every event and on each (re)connect."""
        url = f"{self.connection.server}{path}?watch=true&timeoutSeconds={timeout_s}&allowWatchBookmarks=true"
        session = await self._ensure()
        while True:
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                    if resp.status >= 400:  # e.g. a custom resource not installed yet
                        await asyncio.sleep(1.0)
                        continue
                    on_event()
                    async for _line in resp.content:
                        on_event()
            except (TimeoutError, aiohttp.ClientError) as err:
                logger.debug("watch %s interrupted: %s", path, err)
                await asyncio.sleep(0.2)


async def run_watches(api: ApiClient, targets: Iterable[Wakeup], paths: Iterable[str] = WATCHED) -> None:
    """Watch every path and wake every target on each event, until cancelled."""
    wakeups = list(targets)

    def wake() -> None:
        for w in wakeups:
            w.set()

    tasks = [asyncio.ensure_future(api.watch_forever(p, wake)) for p in paths]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["WATCHED", "ApiClient", "ApiStatusError", "run_watches"]
