"""The sandbox's ApiClient: the operator's KubeClient plus the calls the sandbox's loops need."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from prefixtune.controller.kube import KubeClient
from prefixtune.sandbox import controllers as ctl
from prefixtune.sandbox.client import ApiClient, ApiStatusError
from prefixtune.sandbox.emulator import serve_emulator

CMS = "/api/v1/namespaces/default/configmaps"


async def test_writes_tolerate_what_the_next_resync_would_see() -> None:
    async with serve_emulator() as (_, url), aiohttp.ClientSession() as session:
        api = ApiClient(url + "/", session)
        assert isinstance(api, KubeClient)
        body = {"metadata": {"name": "cm"}, "data": {"a": "1"}}
        await api.apply(ctl.Create(CMS, body))
        await api.apply(ctl.Create(CMS, {**body, "data": {"a": "2"}}))  # 409: someone created it first
        assert (await api.get(f"{CMS}/cm") or {})["data"] == {"a": "1"}
        with pytest.raises(ApiStatusError) as err:
            await api.create(CMS, body)
        assert err.value.status == 409
        await api.apply(ctl.Patch(f"{CMS}/cm", {"data": {"a": "3"}}))
        assert [cm["data"] for cm in await api.list(CMS)] == [{"a": "3"}]
        assert await api.patch(f"{CMS}/gone", {"data": {}}) is None
        await api.apply(ctl.Delete(f"{CMS}/cm"))
        await api.apply(ctl.Delete(f"{CMS}/cm"))  # already gone: nothing to do
        assert await api.get(f"{CMS}/cm") is None


async def test_watch_forever_wakes_on_connect_and_on_each_event() -> None:
    async with serve_emulator() as (_, url), aiohttp.ClientSession() as session:
        api = ApiClient(url, session)
        woken = asyncio.Queue[None]()
        watch = asyncio.ensure_future(api.watch_forever("/api/v1/configmaps", lambda: woken.put_nowait(None)))
        try:
            await asyncio.wait_for(woken.get(), 30)  # connected
            await api.create(CMS, {"metadata": {"name": "cm"}})
            await asyncio.wait_for(woken.get(), 30)  # the ADDED event
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
