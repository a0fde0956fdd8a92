"""A small async Kubernetes client for the operator's own calls (JSON over aiohttp).

kopf watches and posts Events; the operator's reads and writes of children and status go through
this client. Credentials come from the same places as kubectl's: in-cluster service account, else
the kubeconfig (``KUBECONFIG`` or ~/.kube/config), loaded by the ``kubernetes`` package.
Every call it makes is listed in ``api_calls.py`` (the Helm chart's RBAC is checked against it).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "prefixtune-operator"  # how the API server's audit log (and the sandbox) tells its calls


class KubeError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:400]}")
        self.status = status


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None = field(default=None, repr=False)  # never printed: reprs end up in logs
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    @classmethod
    def load(cls, kubeconfig: str | None = None, context: str | None = None) -> Connection:
        """In-cluster credentials when running in a pod, else the kubeconfig."""
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if kubeconfig is not None:
                raise config.ConfigException("kubeconfig given")
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
        token = None
        key = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if key:
            token = str(key).removeprefix("Bearer ").strip()
        return cls(
            server=str(cfg.host).rstrip("/"),
            token=token,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify=bool(cfg.verify_ssl),
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https://"):
            return False
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


class KubeClient:
    """JSON calls against the API server; paths are API paths (``/apis/apps/v1/namespaces/x/...``)."""

    def __init__(self, connection: Connection, session: aiohttp.ClientSession | None = None) -> None:
        self.connection = connection
        self._session = session

    async def _ensure(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
            if self.connection.token:
                headers["Authorization"] = f"Bearer {self.connection.token}"
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=30),
                connector=aiohttp.TCPConnector(ssl=self.connection.ssl_context()),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        session = await self._ensure()
        url = self.connection.server + path + (("?" + urlencode(params)) if params else "")
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with session.request(method, url, data=data, headers=headers) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise KubeError(resp.status, method, path, text)
            result: dict[str, Any] = json.loads(text) if text else {}
            return result

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.call("GET", path)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def list(self, path: str, label_selector: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector_text(label_selector)} if label_selector else None
        result = await self.call("GET", path, params=params)
        items = list(result.get("items") or [])
        if label_selector:  # keep the answer exact even where the server ignores selectors
            items = [i for i in items if _matches(i, label_selector)]
        return items

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call("POST", path, dict(body))

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call("PATCH", path, dict(body), content_type=MERGE_PATCH)

    async def delete(self, path: str, *, preconditions: Mapping[str, str] | None = None) -> bool:
        """DELETE; False when it was gone, or (409) when ``preconditions`` (uid) no longer hold."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if preconditions:
            body["preconditions"] = dict(preconditions)
        try:
            await self.call("DELETE", path, body)
        except KubeError as err:
            if err.status == 404 or (err.status == 409 and preconditions):
                return False
            raise
        return True


def selector_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _matches(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def ns_path(api: str, namespace: str, plural: str, name: str | None = None) -> str:
    """``api`` is ``/api/v1`` or ``/apis/<group>/<version>``."""
    path = f"{api}/namespaces/{quote(namespace)}/{plural}"
    return path if name is None else f"{path}/{quote(name)}"
