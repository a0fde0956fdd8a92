"""Watches: the bounded event log, resuming from a resourceVersion, initial events, selector exits."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import attrs
import kmock
from kmock._internal import rendering

from prefixtune.sandbox import _selectors
from prefixtune.sandbox.emulator.core import EmulatorCore, _meta, api_version
from prefixtune.sandbox.emulator.errors import api_error
from prefixtune.sandbox.faults import bearer


@dataclass(frozen=True)
class _Change:
    """One committed write, as kept in the watch log and put on the resource's bus."""

    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None
    rv: int


@attrs.define(kw_only=True, slots=False)
class Watches(EmulatorCore):
    """The watch log every committed write goes through (``_emit``), and the watch streams."""

    watch_log_size: int = 10_000  # events kept per resource for watches that resume from a resourceVersion
    _log: dict[kmock.resource, collections.deque[_Change]] = attrs.field(factory=dict, init=False)
    _log_floor: dict[kmock.resource, int] = attrs.field(factory=dict, init=False)

    async def _emit(
        self, res: kmock.resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        change = _Change(kind, obj, old, int(_meta(obj)["resourceVersion"]))
        log = self._log.setdefault(res, collections.deque(maxlen=self.watch_log_size))
        if len(log) == log.maxlen:
            self._log_floor[res] = log[0].rv
        log.append(change)
        await self._buses[res].put(change)

    def _serve_watch(self, request: rendering.Request) -> rendering.Payload:  # type: ignore[override]
        assert request.resource is not None
        self._info(request.resource)
        selector = self._selector(request)
        since_text = request.params.get("resourceVersion", "")
        initial = request.params.get("sendInitialEvents") == "true"
        try:
            since = int(since_text) if since_text not in ("", "0") and not initial else None
            timeout = float(request.params["timeoutSeconds"]) if "timeoutSeconds" in request.params else None
        except ValueError as exc:
            raise api_error(400, f"resourceVersion/timeoutSeconds: must be numbers: {exc}") from exc
        stream = self._watch_stream(request, selector, since, initial, timeout)
        return rendering.Response(headers={"Content-Type": "application/json"}, payload=stream)

    async def _watch_stream(
        self,
        request: rendering.Request,
        selector: _selectors.ObjectFilter,
        since: int | None,
        initial_events: bool,
        timeout: float | None,
    ) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now, even if nothing happens for a while
        res = request.resource
        assert res is not None
        bus = self._buses[res]
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        drop_after = None if self.faults is None else self.faults.watch_deadline(bearer(request.headers))
        if drop_after is not None:  # an injected dropped watch: the stream ends early
            drop_at = loop.time() + drop_after
            if deadline is None or drop_at < deadline:
                deadline = drop_at
            else:
                drop_after = None
        async with self._lock:  # the snapshot and the subscription are atomic: nothing falls in between
            mark = await bus.mark()
            first: list[dict[str, Any]] = []
            if since is None:
                first = [{"type": "ADDED", "object": obj} for _, obj in self._scan(request) if selector(obj)]
                if initial_events:
                    first.append(self._initial_events_end(res))
            elif since < self._log_floor.get(res, 0):
                first = [self._expired(since)]
            else:
                changes = [c for c in self._log.get(res, ()) if c.rv > since]
                first = [e for c in changes if (e := self._wire(c, request, selector)) is not None]
        try:
            for event in first:
                yield event
            if first and first[-1]["type"] == "ERROR":
                return
            changes_iter = aiter(bus.stream(since=mark))
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    if drop_after is not None and self.faults is not None:
                        self.faults.count_watch_drop()
                    return
                try:
                    change = await asyncio.wait_for(anext(changes_iter), remaining)
                except TimeoutError:
                    if drop_after is not None and self.faults is not None:
                        self.faults.count_watch_drop()
                    return
                wired = self._wire(change, request, selector)
                if wired is not None:
                    yield wired
        finally:
            with contextlib.suppress(ValueError):
                await bus.unmark(mark)

    @staticmethod
    def _wire(
        change: _Change, request: rendering.Request, selector: _selectors.ObjectFilter
    ) -> dict[str, Any] | None:
        """The watch event a client sees for one change, or None; selector exits become DELETED."""
        meta = _meta(change.obj)
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return None
        if request.name is not None and meta.get("name") != request.name:
            return None
        now_in = selector(change.obj)
        was_in = change.old is not None and selector(change.old)
        if change.type != "MODIFIED":
            return {"type": change.type, "object": change.obj} if now_in else None
        if now_in:
            return {"type": "MODIFIED" if was_in else "ADDED", "object": change.obj}
        return {"type": "DELETED", "object": change.obj} if was_in else None

    def _initial_events_end(self, res: kmock.resource) -> dict[str, Any]:
        return {
            "type": "BOOKMARK",
            "object": {
                "apiVersion": api_version(res),
                "kind": self._info(res).kind,
                "metadata": {
                    "resourceVersion": str(self._rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }

    def _expired(self, since: int) -> dict[str, Any]:
        return {
            "type": "ERROR",
            "object": {
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {since} ({self._rv})",
                "reason": "Expired",
                "code": 410,
            },
        }
