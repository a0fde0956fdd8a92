"""Serving an emulator over HTTP, and kubeconfigs for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar, overload

import kmock
import yaml

from prefixtune.sandbox.emulator.store import RealisticEmulator

_E = TypeVar("_E", bound=RealisticEmulator)


@contextlib.asynccontextmanager
async def _serving(handler: _E, port: int, host: str) -> AsyncIterator[tuple[_E, str]]:
    async with handler, kmock.Server(handler, host=host, port=port or None) as server:
        yield handler, str(server.url).rstrip("/")


@overload
def serve_emulator(
    port: int = 0, host: str = "127.0.0.1", *, emulator: None = None
) -> contextlib.AbstractAsyncContextManager[tuple[RealisticEmulator, str]]: ...


@overload
def serve_emulator(
    port: int = 0, host: str = "127.0.0.1", *, emulator: _E
) -> contextlib.AbstractAsyncContextManager[tuple[_E, str]]: ...


def serve_emulator(
    port: int = 0, host: str = "127.0.0.1", *, emulator: RealisticEmulator | None = None
) -> contextlib.AbstractAsyncContextManager[tuple[RealisticEmulator, str]]:
    """Serve an emulator over HTTP: ``async with serve_emulator() as (emulator, url): ...``.

    ``port=0`` picks a free port. The emulator lives in the current event loop: sync clients must be
    called from another thread (``asyncio.to_thread``), kopf from its own thread (``KopfRunner``).
    Pass ``emulator=`` to serve a configured instance or a subclass (the same type is yielded back).
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port: must be 0..65535 (0 picks a free one), got {port}")
    return _serving(emulator if emulator is not None else RealisticEmulator(), port, host)


def kubeconfig(url: str, namespace: str = "default") -> dict[str, Any]:
    """A kubeconfig document for an emulator URL (no TLS, a dummy token: the emulator checks nothing)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url: must start with http:// or https://, got {url!r}")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, namespace: str = "default") -> Path:
    """Write a kubeconfig for ``url`` to ``path`` (kopf's default login, the kubernetes client, kubectl)."""
    target = Path(path)
    target.write_text(yaml.safe_dump(kubeconfig(url, namespace), sort_keys=False))
    return target
