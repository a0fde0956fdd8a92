"""Bounded reads of endpoints a tenant controls (a pod's /metrics) or that answer for many tenants
(Prometheus): every read has a total deadline (not a per-read timeout, which a server dripping one
byte every few seconds never trips), a byte cap, no redirects, verified TLS, and errors that carry a
status code and a short reason only, never the body (a body ends up in a condition or an Event, so
echoing it would show a tenant whatever an internal address answers).

- ``fetch``: async (aiohttp, on the event loop: no thread is held while a server stalls);
- ``fetch_sync``: the same bounds for the Prometheus client, which runs in the worker threads of
  ``METRICS_POOL`` (its own pool: a slow query never takes a thread from the policy's decisions);
- ``PARSE_POOL``: exposition text is parsed there, off the event loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp

MAX_EXPOSITION_BYTES = 2 * 1024 * 1024  # a vLLM page is ~100 KB; parsing 2 MiB takes ~1-2 s
MAX_QUERY_BYTES = 8 * 1024 * 1024  # one Prometheus answer (raw samples of one window)
CHUNK = 64 * 1024
REASON_CHARS = 60

METRICS_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="prefixtune-prometheus")
PARSE_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prefixtune-parse")


class FetchError(OSError):
    """A bounded read failed; the message names the URL's host, a status code or a short reason."""


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _short(reason: object) -> str:
    text = "".join(c if c.isprintable() else "?" for c in str(reason or ""))
    return text[:REASON_CHARS]


def ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verified TLS (the system's CAs, or ``ca_file``)."""
    return ssl.create_default_context(cafile=ca_file)


async def fetch(
    url: str,
    *,
    deadline_s: float,
    max_bytes: int = MAX_EXPOSITION_BYTES,
    session: aiohttp.ClientSession | None = None,
    ca_file: str | None = None,
) -> str:
    """GET ``url``: the body as text, within ``deadline_s`` seconds in all and ``max_bytes`` bytes."""
    own = session is None
    http_session = session or aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context(ca_file) if url.startswith("https:") else False)
    )
    try:
        async with asyncio.timeout(deadline_s):
            async with http_session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise FetchError(f"{_where(url)}: HTTP {resp.status} {_short(resp.reason)}")
                body = bytearray()
                while chunk := await resp.content.read(CHUNK):
                    body += chunk
                    if len(body) > max_bytes:
                        raise FetchError(f"{_where(url)}: answer larger than {max_bytes} bytes")
                return body.decode("utf-8", errors="replace")
    except TimeoutError:
        raise FetchError(f"{_where(url)}: no complete answer within {deadline_s:g}s") from None
    except aiohttp.ClientError as err:
        raise FetchError(f"{_where(url)}: {type(err).__name__}") from None
    finally:
        if own:
            await http_session.close()


def fetch_sync(
    url: str,
    *,
    deadline_s: float,
    max_bytes: int = MAX_QUERY_BYTES,
    params: dict[str, str] | None = None,
    ca_file: str | None = None,
) -> bytes:
    """Blocking GET with the same bounds (for worker threads)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"{_where(url)}: not an http(s) URL")
    began = time.monotonic()

    def left() -> float:
        remaining = deadline_s - (time.monotonic() - began)
        if remaining <= 0:
            raise FetchError(f"{_where(url)}: no complete answer within {deadline_s:g}s")
        return remaining

    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=left(), context=ssl_context(ca_file)
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=left())
    path = (parts.path or "/") + ("?" + urlencode(params) if params else "")
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise FetchError(f"{_where(url)}: HTTP {resp.status} {_short(resp.reason)}")
        body = bytearray()
        while True:
            if conn.sock is not None:
                conn.sock.settimeout(left())
            chunk = resp.read1(CHUNK)
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > max_bytes:
                raise FetchError(f"{_where(url)}: answer larger than {max_bytes} bytes")
            left()
    except TimeoutError:
        raise FetchError(f"{_where(url)}: no complete answer within {deadline_s:g}s") from None
    except (OSError, http.client.HTTPException) as err:
        if isinstance(err, FetchError):
            raise
        raise FetchError(f"{_where(url)}: {type(err).__name__}") from None
    finally:
        conn.close()


class BoundedPrometheus:
    """``QueryClient`` for ``PrometheusSource``: instant queries with bounded reads, verified TLS,
    and errors without response bodies (in place of prometheus-api-client's ``PrometheusConnect``,
    whose errors quote the body and whose timeout is per read)."""

    def __init__(
        self,
        url: str,
        *,
        deadline_s: float = 10.0,
        max_bytes: int = MAX_QUERY_BYTES,
        ca_file: str | None = None,
        budget_s: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self.ca_file = ca_file
        # All queries of one measurement together (one resource's budget): monotonic end.
        self.until = None if budget_s is None else time.monotonic() + budget_s

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        args = {"query": query, **{k: str(v) for k, v in (params or {}).items()}}
        deadline = self.deadline_s
        if self.until is not None:
            deadline = min(deadline, self.until - time.monotonic())
            if deadline <= 0:
                raise FetchError(f"{_where(self.url)}: the measurement's time budget is spent")
        raw = fetch_sync(
            self.url + "/api/v1/query",
            deadline_s=deadline,
            max_bytes=self.max_bytes,
            params=args,
            ca_file=self.ca_file,
        )
        try:
            answer = json.loads(raw)
        except ValueError:
            raise FetchError(f"{_where(self.url)}: the answer is not JSON") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise FetchError(f"{_where(self.url)}: the query was not answered with status success")
        data = answer.get("data") or {}
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise FetchError(f"{_where(self.url)}: the answer has no result list")
        return [r for r in result if isinstance(r, dict)]
