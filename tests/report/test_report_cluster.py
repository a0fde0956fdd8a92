"""``prefixtune status`` and ``prefixtune report`` against the project's emulated API server (kmock
with the ServingDeployment CRD installed), through the real kubernetes client and a kubeconfig."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kubernetes import client

from prefixtune.api.crd import build_crd
from prefixtune.report import report, status_view
from prefixtune.sandbox.emulator import serve_emulator, write_kubeconfig


def _install(url: str, resource: dict[str, Any], events: list[dict[str, Any]]) -> None:
    configuration = client.Configuration()
    configuration.host = url
    with client.ApiClient(configuration) as api_client:
        client.ApiextensionsV1Api(api_client).create_custom_resource_definition(build_crd())
        custom = client.CustomObjectsApi(api_client)
        core = client.CoreV1Api(api_client)
        core.create_namespace({"metadata": {"name": "demo"}})
        body = {k: v for k, v in resource.items() if k != "status"}
        body["metadata"] = {"name": "chat", "namespace": "demo"}
        custom.create_namespaced_custom_object(
            "prefixtune.io", "v1alpha1", "demo", "servingdeployments", body
        )
        custom.patch_namespaced_custom_object_status(
            "prefixtune.io", "v1alpha1", "demo", "servingdeployments", "chat", {"status": resource["status"]}
        )
        for e in events:
            core.create_namespaced_event(
                "demo", {**e, "metadata": {"generateName": "chat.", "namespace": "demo"}}
            )
        other = {**e, "involvedObject": {**e["involvedObject"], "name": "someone-else"}}
        core.create_namespaced_event("demo", {**other, "metadata": {"name": "x.1", "namespace": "demo"}})


async def test_status_and_report_read_the_cluster(
    tmp_path: Path, recorded: dict[str, Any], recorded_events: list[dict[str, Any]], capsys: Any
) -> None:
    async with serve_emulator() as (_, url):
        kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", url))
        await asyncio.to_thread(_install, url, recorded, recorded_events)

        assert (
            await asyncio.to_thread(status_view.main, ["-n", "demo", "chat", "--kubeconfig", kubeconfig]) == 0
        )
        detail = capsys.readouterr().out
        assert detail.startswith("demo/chat  vllm") and "7 of 11 spent; records: 2 infeasible, 6 ok" in detail

        assert (
            await asyncio.to_thread(status_view.main, ["-n", "demo", "--json", "--kubeconfig", kubeconfig])
            == 0
        )
        listed = json.loads(capsys.readouterr().out)
        assert [(f["name"], f["phase"], f["trials"]) for f in listed] == [("chat", "Converged", 7)]

        assert (
            await asyncio.to_thread(status_view.main, ["-n", "demo", "nope", "--kubeconfig", kubeconfig]) == 1
        )
        assert "ServingDeployment demo/nope not found" in capsys.readouterr().err

        out = tmp_path / "report"
        code = await asyncio.to_thread(
            report.main, ["demo/chat", "--out", str(out), "--kubeconfig", kubeconfig]
        )
        assert code == 0
        assert json.loads(capsys.readouterr().out)["events"] == len(recorded_events)  # not someone-else's
        text = (out / "index.html").read_text()
        assert text.count("TrialInfeasible") == 2 and "Converged" in text
