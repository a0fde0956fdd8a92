"""A real Prometheus for the sandbox, discovering the pods through file-based service discovery.

When the ``prometheus`` binary is installed (Debian's ``prometheus`` package), ``PrometheusRunner``
starts it with a generated configuration: one ``file_sd_configs`` job for the engines' metrics and
one for the DCGM-like GPU exporters, each reading a targets JSON file that ``sync`` rewrites whenever
the pods change (Prometheus notices the rewrite by inotify). Each target carries the labels a
``kubernetes_sd`` relabelling usually produces: ``namespace``, ``pod``, ``container``, plus
``__metrics_path__`` (TensorRT-LLM serves ``/prometheus/metrics``). Without the binary the sandbox
says that the operator scrapes the pods directly (its ``metrics.source: scrape``).

Pure parts: ``scrape_targets(pods)`` and ``config_yaml(...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from prefixtune.engines import get_adapter
from prefixtune.sandbox import pods as podlib

ENGINE_JOB = "sandbox-engines"
DCGM_JOB = "sandbox-dcgm"


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def scrape_targets(
    pods: Sequence[Mapping[str, Any]], dcgm_port: int | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Target groups per job for every pod with an IP whose container runs an engine."""
    engines: list[dict[str, Any]] = []
    dcgm: list[dict[str, Any]] = []
    for pod in sorted(
        pods, key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"].get("name", ""))
    ):
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip or meta.get("deletionTimestamp") or status.get("phase") in {"Failed", "Succeeded"}:
            continue
        try:
            container = podlib.engine_container(pod)
        except podlib.LaunchError:
            continue
        engine = podlib.detect_engine(podlib.container_argv(container))
        if engine is None:
            continue
        adapter = get_adapter(engine)
        port = podlib.port_flag(podlib.container_argv(container)) or adapter.metrics_port
        labels = {
            "namespace": str(meta.get("namespace", "default")),
            "pod": str(meta.get("name")),
            "container": str(container.get("name", "engine")),
            "engine": engine.value,
            # the pod's labels, as the usual labelmap of __meta_kubernetes_pod_label_* copies them
            **{re.sub(r"[^a-zA-Z0-9_]", "_", k): str(v) for k, v in (meta.get("labels") or {}).items()},
        }
        engines.append(
            {"targets": [f"{ip}:{port}"], "labels": {**labels, "__metrics_path__": adapter.metrics_path}}
        )
        if dcgm_port is not None:
            dcgm.append({"targets": [f"{ip}:{dcgm_port}"], "labels": {"node": podlib.NODE_NAME}})
    return {ENGINE_JOB: engines, DCGM_JOB: dcgm}


def config_yaml(targets_dir: Path, scrape_interval_s: float, duplicate_jobs: int = 0) -> str:
    """``duplicate_jobs``: more jobs scraping the same engine targets (a ServiceMonitor beside an
    annotation-based job, as in many clusters: every series then exists once per job)."""
    interval = f"{max(round(scrape_interval_s * 1000), 100)}ms"
    jobs = []
    again = [(f"{ENGINE_JOB}-again-{k}", ENGINE_JOB, False) for k in range(duplicate_jobs)]
    for name, job, honor in [(ENGINE_JOB, ENGINE_JOB, False), *again, (DCGM_JOB, DCGM_JOB, True)]:
        jobs.append(
            {
                "job_name": name,
                "honor_labels": honor,  # the DCGM exporter labels its series with the pod it serves
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "file_sd_configs": [{"files": [str(targets_dir / f"{job}.json")], "refresh_interval": "5s"}],
            }
        )
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": jobs,
    }
    return yaml.safe_dump(config, sort_keys=False)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PrometheusRunner:
    """A Prometheus subprocess with file-based discovery of the sandbox's pods."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        scrape_interval_s: float = 1.0,
        workdir: str | Path | None = None,
        dcgm_port: int | None = None,
        binary: str | None = None,
        duplicate_jobs: int = 0,
    ) -> None:
        found = binary or prometheus_binary()
        if found is None:
            raise FileNotFoundError(
                "prometheus: the binary is not on PATH (Debian: apt-get install prometheus)"
            )
        self.binary = found
        self.host = host
        self.port = port or _free_port(host)
        self.scrape_interval_s = scrape_interval_s
        self.dcgm_port = dcgm_port
        self.duplicate_jobs = duplicate_jobs
        self._own_dir = workdir is None
        self.workdir = (
            Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="prefixtune-prom-"))
        )
        self.targets_dir = self.workdir / "targets"
        self.process: asyncio.subprocess.Process | None = None
        self._last: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, ready_timeout_s: float = 20.0) -> None:
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        for job in (ENGINE_JOB, DCGM_JOB):
            self._write(job, [])
        config = self.workdir / "prometheus.yml"
        config.write_text(config_yaml(self.targets_dir, self.scrape_interval_s, self.duplicate_jobs))
        self.process = await asyncio.create_subprocess_exec(
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=2h",
            "--log.level=warn",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        deadline = asyncio.get_running_loop().time() + ready_timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                if self.process.returncode is not None:
                    err = (await self.process.stderr.read()).decode() if self.process.stderr else ""
                    raise RuntimeError(f"prometheus exited with {self.process.returncode}: {err[-500:]}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{self.url}/-/ready") as resp:
                        if resp.status == 200:
                            return
                if asyncio.get_running_loop().time() > deadline:
                    await self.stop()
                    raise RuntimeError(f"prometheus did not become ready at {self.url} in {ready_timeout_s}s")
                await asyncio.sleep(0.1)

    def _write(self, job: str, groups: list[dict[str, Any]]) -> None:
        path = self.targets_dir / f"{job}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        os.replace(tmp, path)  # atomic: Prometheus never reads half a file

    def sync(self, pods: Sequence[Mapping[str, Any]]) -> bool:
        """Rewrite the targets files when the pods' targets changed; True when they did."""
        targets = scrape_targets(pods, self.dcgm_port)
        text = json.dumps(targets, sort_keys=True)
        if text == self._last:
            return False
        self._last = text
        for job, groups in targets.items():
            self._write(job, groups)
        return True

    async def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


__all__ = ["DCGM_JOB", "ENGINE_JOB", "PrometheusRunner", "config_yaml", "prometheus_binary", "scrape_targets"]
