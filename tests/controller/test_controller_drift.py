"""Drift in the live children: the owned-field comparison, the restore, and what is reported."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from prefixtune.api import parse_spec
from prefixtune.controller import execute
from prefixtune.controller import render as R
from prefixtune.controller.drift import (
    DRIFT_REASON,
    MAX_FIELDS,
    RESTORED_REASON,
    Drift,
    drift_actions,
    owned_drift,
    quantity,
)
from prefixtune.controller.observe import Desired, Scale
from prefixtune.tuning.actions import EmitEvent, SetCondition

OWNER = R.Owner(namespace="team", name="rag", uid="uid-1")
SPEC = parse_spec(
    {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
     "resources": {"cpu": "0.5", "memory": "1024Mi"}}
)  # fmt: skip
CONFIG = SPEC.knob_config()
ENGINE = "spec.template.spec.containers[engine]"


def _rendered(replicas: int = 2) -> dict[str, Any]:
    body, _ = execute.annotated(R.render_deployment(OWNER, SPEC, CONFIG, "baseline", replicas))
    return body


def _as_served(body: dict[str, Any]) -> dict[str, Any]:
    """What a real API server returns for ``body``: defaults filled in, quantities canonical."""
    live = copy.deepcopy(body)
    live["metadata"].update(uid="u", resourceVersion="7", generation=3)
    live["metadata"]["labels"]["team.example/owner"] = "someone"  # another tool's label
    spec = live["spec"]
    spec.update(revisionHistoryLimit=10, progressDeadlineSeconds=600)
    pod = spec["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler", terminationGracePeriodSeconds=30)
    (container,) = pod["containers"]
    container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
    requests = container["resources"]["requests"]
    requests["cpu"], requests["memory"] = "500m", "1Gi"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            container[probe].setdefault("timeoutSeconds", 1)
            container[probe].setdefault("successThreshold", 1)
    live["status"] = {"replicas": 2, "readyReplicas": 2}
    return live


def test_what_the_api_server_adds_is_not_drift() -> None:
    body = _rendered()
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "0.5"
    assert owned_drift(body, _as_served(body)) == ()


def test_quantities_compare_by_value() -> None:
    assert quantity("0.5") == quantity("500m") and quantity("1Gi") == quantity("1024Mi")
    assert quantity("2") == quantity(2) and quantity("1e3") == quantity("1k")
    assert quantity("12Gi") != quantity("12G") and quantity("fast") is None


def test_scale_and_set_image_and_set_env_are_drift() -> None:
    body = _rendered()
    live = _as_served(body)
    live["spec"]["replicas"] = 0
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil.example/other:latest"
    live["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "VLLM_X", "value": "1"}]
    live["spec"]["template"]["spec"]["containers"][0]["args"].append("--enforce-eager")
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    assert owned_drift(body, live) == (
        "spec.replicas",
        f"{ENGINE}.image",
        f"{ENGINE}.args",
        f"{ENGINE}.resources.limits.nvidia.com/gpu",
        f"{ENGINE}.env",
    )


def test_added_items_are_counted_never_quoted() -> None:
    body = _rendered()
    live = _as_served(body)
    pod = live["spec"]["template"]["spec"]
    pod["containers"].append({"name": "$(curl evil)", "image": "x"})
    pod["initContainers"] = [{"name": "init-\x1b[31m", "image": "y"}]
    fields = owned_drift(body, live)
    assert fields == ("spec.template.spec.containers (1 added)", "spec.template.spec.initContainers")
    message = Drift("Deployment", "rag", fields).message()
    assert "curl" not in message and "\x1b" not in message


def test_the_message_names_a_bounded_number_of_fields() -> None:
    fields = tuple(f"spec.f{i}" for i in range(MAX_FIELDS + 5))
    message = Drift("Deployment", "rag", fields).message()
    assert message.endswith("and 5 more") and "spec.f8" not in message


def test_an_update_of_our_own_in_flight_is_not_drift() -> None:
    body = _rendered()
    live = _as_served(body)
    live["spec"]["replicas"] = 0
    assert execute.live_drift(body, live) == ("spec.replicas",)
    live["metadata"]["annotations"][execute.RENDERED_HASH] = "another-rendering"
    assert execute.live_drift(body, live) == ()


def test_deployment_drift_names_the_deployment_of_each_role() -> None:
    canary = CONFIG.with_(block_size=32)
    want = Desired(baseline=CONFIG, canary=canary)
    base, _ = execute.annotated(R.render_deployment(OWNER, SPEC, CONFIG, "baseline", 1))  # 2 - the canary
    can, _ = execute.annotated(R.render_deployment(OWNER, SPEC, canary, "canary", 1))
    live = {"baseline": _as_served(base), "canary": _as_served(can)}
    scale = Scale(baseline=1, canary=1)  # the canary's pod ready: the stable gave it a replica
    assert execute.deployment_drift(OWNER, SPEC, want, scale, live) == []
    live["canary"]["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    assert execute.deployment_drift(OWNER, SPEC, want, scale, live) == [
        Drift("Deployment", "rag-canary", (f"{ENGINE}.image",))
    ]


def test_a_deployment_at_rest_is_judged_once_and_again_at_a_new_version(monkeypatch: Any) -> None:
    want, scale = Desired(baseline=CONFIG), Scale(baseline=2, canary=0)
    live = {"baseline": _as_served(_rendered())}
    memo = execute.DriftMemo()
    rendered: list[str] = []
    render = execute.render_engine_deployment

    def counting(*args: Any) -> dict[str, Any]:
        rendered.append(args[3])
        return render(*args)

    monkeypatch.setattr(execute, "render_engine_deployment", counting)
    assert execute.deployment_drift(OWNER, SPEC, want, scale, live, memo) == []
    assert execute.deployment_drift(OWNER, SPEC, want, scale, live, memo) == []
    assert rendered == ["baseline"]  # the same live version and rendering: the verdict reused
    live["baseline"]["spec"]["replicas"] = 0  # kubectl scale: a new version
    live["baseline"]["metadata"]["resourceVersion"] = "8"
    found = [Drift("Deployment", "rag", ("spec.replicas",))]
    assert execute.deployment_drift(OWNER, SPEC, want, scale, live, memo) == found
    assert execute.deployment_drift(OWNER, SPEC, want, scale, live, memo) == found  # still drift
    assert execute.deployment_drift(OWNER, SPEC, want, Scale(baseline=1, canary=0), live, memo) != found
    assert rendered == ["baseline"] * 3  # judged again for the new version and the new replicas
    memo.forget("team", ["rag"])
    assert memo.verdicts == {}


class _Client:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.patches: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.obj

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(body)
        return self.obj


def test_apply_restores_drift_and_removes_what_was_added_to_the_pod() -> None:
    plain = R.render_deployment(OWNER, SPEC, CONFIG, "baseline", 2)
    live = _as_served(_rendered())
    live["metadata"]["ownerReferences"] = [OWNER.reference()]
    client = _Client(live)
    path = "/apis/apps/v1/namespaces/team/deployments"
    change, drift = asyncio.run(execute._apply(client, path, plain, "apps", "deployments", OWNER))  # type: ignore[arg-type]
    assert change is None and drift is None and client.patches == []  # in sync: no write
    live["spec"]["replicas"] = 0
    live["spec"]["template"]["spec"]["initContainers"] = [{"name": "x", "image": "y"}]
    change, drift = asyncio.run(execute._apply(client, path, plain, "apps", "deployments", OWNER))  # type: ignore[arg-type]
    assert change == "restored Deployment rag"
    assert drift == Drift("Deployment", "rag", ("spec.replicas", "spec.template.spec.initContainers"))
    (patch,) = client.patches
    assert patch["spec"]["replicas"] == 2
    assert patch["spec"]["template"]["spec"]["initContainers"] is None  # a merge patch's delete
    assert patch["spec"]["template"]["spec"]["containers"] == plain["spec"]["template"]["spec"]["containers"]


def _degraded(status: str, reason: str, message: str = "") -> list[dict[str, Any]]:
    return [{"type": "Degraded", "status": status, "reason": reason, "message": message}]


def test_drift_is_a_condition_while_it_lasts_and_one_event_per_finding() -> None:
    drift = [Drift("Deployment", "rag", ("spec.replicas",))]
    first = drift_actions(drift, [], settled=False)
    (cond,) = [a for a in first if isinstance(a, SetCondition)]
    (event,) = [a for a in first if isinstance(a, EmitEvent)]
    assert (cond.type, cond.status, cond.reason) == ("Degraded", "True", DRIFT_REASON)
    assert event.type == "Warning" and event.reason == DRIFT_REASON and "spec.replicas" in event.message
    # The same finding again (another controller keeps scaling): the condition, no second Event.
    again = drift_actions(drift, _degraded("True", DRIFT_REASON, cond.message), settled=False)
    assert [type(a) for a in again] == [SetCondition]
    # Restored, but the pods are not back yet: the condition stays; then it clears.
    assert drift_actions([], _degraded("True", DRIFT_REASON, cond.message), settled=False) == []
    (done,) = drift_actions([], _degraded("True", DRIFT_REASON, cond.message), settled=True)
    assert isinstance(done, SetCondition) and (done.status, done.reason) == ("False", RESTORED_REASON)
    assert drift_actions([], _degraded("False", RESTORED_REASON), settled=True) == []


def test_a_degraded_condition_of_another_cause_is_left_alone() -> None:
    failed = _degraded("True", "RollbackFailed", "rollback failed")
    acts = drift_actions([Drift("Deployment", "rag", ("spec.replicas",))], failed, settled=False)
    assert [type(a) for a in acts] == [EmitEvent]
    assert drift_actions([], failed, settled=True) == []
