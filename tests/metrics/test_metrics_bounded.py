"""Bounded reads (issue #17, items 2 and 3): total deadline, byte cap, no redirects, verified TLS,
and errors without bodies; for the async scrape (``fetch``) and the Prometheus client
(``fetch_sync`` / ``BoundedPrometheus``), against real local HTTP servers."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.conftest import require_component

from prefixtune.metrics import bounded
from prefixtune.metrics.bounded import BoundedPrometheus, FetchError, fetch, fetch_sync
from prefixtune.metrics.prometheus_source import connect

SECRET = "root-password=hunter2"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/drip"):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                try:
                    self.wfile.write(b"#")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.5)
        elif self.path.startswith("/huge"):
            body = b"# x\n" * (1024 * 1024)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/secret")
            self.end_headers()
        else:
            body = f"<html>{SECRET}</html>".encode()
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_async_fetch_is_bounded_in_total_time_bytes_and_shows_no_body(server: str) -> None:
    async def run() -> None:
        began = time.monotonic()
        with pytest.raises(FetchError, match="no complete answer within 1s"):
            await fetch(f"{server}/drip", deadline_s=1.0)  # a byte every 0.5 s: never a read timeout
        assert time.monotonic() - began < 30  # generous: the point is it ends (the drip takes 500 s)
        with pytest.raises(FetchError, match="larger than 1000000 bytes"):
            await fetch(f"{server}/huge", deadline_s=30.0, max_bytes=1_000_000)
        with pytest.raises(FetchError) as err:
            await fetch(f"{server}/admin", deadline_s=30.0)
        assert "HTTP 403" in str(err.value) and SECRET not in str(err.value)
        with pytest.raises(FetchError, match="HTTP 302"):
            await fetch(f"{server}/redirect", deadline_s=30.0)  # not followed

    asyncio.run(run())


def test_sync_fetch_and_the_prometheus_client_are_bounded_and_show_no_body(server: str) -> None:
    with pytest.raises(FetchError, match="no complete answer within 1s"):
        fetch_sync(f"{server}/drip", deadline_s=1.0)
    with pytest.raises(FetchError, match="larger than"):
        fetch_sync(f"{server}/huge", deadline_s=30.0, max_bytes=1_000_000)
    with pytest.raises(FetchError) as err:
        BoundedPrometheus(server, deadline_s=30.0).custom_query("up", {"time": "1"})
    assert "HTTP 403" in str(err.value) and SECRET not in str(err.value)
    spent = BoundedPrometheus(f"{server}/drip", deadline_s=30.0, budget_s=0.0)
    with pytest.raises(FetchError, match="budget is spent"):
        spent.custom_query("up")


def test_tls_is_verified() -> None:
    ctx = bounded.ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    client = connect("https://prometheus.example:9090")  # prometheus-api-client, for the CLI tools
    assert vars(client)["_session"].verify is True


@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    require_component(shutil.which("openssl") is not None, "openssl (to make a test certificate)")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", cert
    httpd.shutdown()


def test_a_self_signed_prometheus_is_refused_unless_its_ca_is_configured(
    https_server: tuple[str, Path],
) -> None:
    url, cert = https_server
    with pytest.raises(FetchError) as err:
        BoundedPrometheus(url, deadline_s=30.0).custom_query("up")
    assert "SSL" in str(err.value) or "Certificate" in str(err.value)
    with pytest.raises(FetchError, match="HTTP 403"):  # the handshake passes with the CA bundle
        BoundedPrometheus(url, deadline_s=30.0, ca_file=str(cert)).custom_query("up")
