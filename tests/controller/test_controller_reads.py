"""What a reconcile reads (issue #21, a fleet per replica): a tick takes the resource from kopf's
watched body when that body is the version this process last read or wrote, and its children from
kopf's indexes (a Deployment it wrote from the API server until the index caught up); without
indexes, two lists (Deployments, pods) by the resource label, whatever the number of roles. Through the
sandbox's emulated API server and the operator's own ``reconcile`` (``bench/_reliability_tenant.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import _reliability_tenant as tenant
from prefixtune.controller.children import Freshness, Indexes, index_entry, name_entry, pod_entry
from prefixtune.controller.execute import NotOurs, _apply, read_children
from prefixtune.controller.observe import pod_view
from prefixtune.controller.reconcile import current_body, reconcile
from prefixtune.controller.render import LABEL_MANAGED_BY, LABEL_RESOURCE, MANAGER, Owner

SDEP = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"


def _body(version: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "a", "namespace": "default"}
    if version is not None:
        meta["resourceVersion"] = version
    return {"metadata": meta, "spec": {"engine": "vllm"}, "status": {"trials": [{"index": 1}]}}


def test_the_watched_body_is_used_only_at_the_version_last_seen() -> None:
    live = _body("7")
    got = current_body(live, "7")
    assert got == live and got is not live
    assert got["status"]["trials"] is not live["status"]["trials"]  # a copy: the view is not edited
    assert current_body(live, "6") is None  # our own write is not in the watch yet, or another's is
    assert current_body(live, None) is None  # nothing read or written yet by this process
    assert current_body(_body(None), "7") is None
    assert current_body(None, "7") is None


class _Counting:
    """The operator's client with its reads counted by path."""

    def __init__(self, client: Any) -> None:
        self.gets: list[str] = []
        self.lists: list[str] = []
        self._get, self._list = client.get, client.list
        client.get, client.list = self.get, self.list

    async def get(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self.gets.append(path)
        return await self._get(path, *args, **kwargs)

    async def list(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self.lists.append(path)
        return await self._list(path, *args, **kwargs)

    def clear(self) -> None:
        self.gets.clear()
        self.lists.clear()


async def test_a_tick_with_a_current_watched_body_reads_only_the_children_lists() -> None:
    async with tenant.harness() as h:
        await h.apply(tenant.resource("fleet", {"engine": "vllm", "model": tenant.MODEL, "replicas": 2}))
        counted = _Counting(h.ctx.client)
        path = f"{SDEP}/fleet"
        first = await reconcile(h.ctx, "default", "fleet", live=None)
        assert first is not None and path in counted.gets  # nothing seen yet: the resource is read
        # The children: one list of Deployments and one of pods, by label; no GET per Deployment.
        assert any(p.endswith("/deployments") for p in counted.lists)
        assert any(p.endswith("/pods") for p in counted.lists)

        # The watch's view at the version this process wrote (or read) last: no GET of the resource.
        latest = await h.get(path)
        assert latest is not None
        for _ in range(3):
            counted.clear()
            outcome = await reconcile(h.ctx, "default", "fleet", live=latest)
            assert outcome is not None
            assert path not in counted.gets, counted.gets
            assert sorted(p.rsplit("/", 1)[1] for p in counted.lists) == ["deployments", "pods"]
            if outcome.status_patched:  # a write: the next view is the one it wrote
                latest = await h.get(path)
                assert latest is not None

        # A view older than what this process knows (its own write not yet delivered): read again.
        stale = dict(latest)
        stale["metadata"] = {**latest["metadata"], "resourceVersion": "1"}
        counted.clear()
        await reconcile(h.ctx, "default", "fleet", live=stale)
        assert path in counted.gets


def _dep(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "resourceVersion": version}}


def test_a_deployment_written_by_this_process_is_read_until_the_index_holds_that_version() -> None:
    fresh = Freshness()
    assert not fresh.stale("default", "a", _dep("a", "3"))  # never written: the index is used
    fresh.wrote("default", "a")
    assert fresh.stale("default", "a", _dep("a", "3"))  # written, not read since: read it
    fresh.read("default", "a", _dep("a", "5"))
    assert fresh.stale("default", "a", _dep("a", "3"))  # the index is behind the write
    assert not fresh.stale("default", "a", _dep("a", "5"))  # caught up: no longer pending
    assert not fresh.stale("default", "a", _dep("a", "6"))  # and later versions are the index's
    fresh.wrote("default", "a")  # deleted by this process
    fresh.read("default", "a", None)
    assert fresh.stale("default", "a", _dep("a", "6"))  # still indexed: the delete is not in yet
    assert not fresh.stale("default", "a", None)
    fresh.read("default", "b", _dep("b", "1"))  # a read of one never written changes nothing
    assert not fresh.stale("default", "b", _dep("b", "0"))
    fresh.forget("default", ["a"])  # its resource is gone: nothing is kept for it
    assert not fresh.pending


class _Index(dict[tuple[str, str], list[dict[str, Any]]]):
    """A stand-in for a kopf.Index: keys to stores (iterables) of values."""


def test_an_index_entry_is_a_copy_that_later_changes_to_the_watched_body_do_not_reach() -> None:
    owner_labels = {LABEL_RESOURCE: "fleet", LABEL_MANAGED_BY: MANAGER}
    body: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Ready"}]}}
    entry = index_entry("default", owner_labels, body)[("default", "fleet")]
    body["metadata"]["name"] = "changed"
    body["status"]["conditions"].append({"type": "PodScheduled"})
    assert entry == {"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Ready"}]}}


async def test_children_come_from_the_indexes_and_a_written_deployment_from_the_api_server() -> None:
    owner_labels = {LABEL_RESOURCE: "fleet", LABEL_MANAGED_BY: MANAGER}
    entry = index_entry("default", owner_labels, {"metadata": {"name": "fleet"}, "spec": {}, "x": 1})
    assert list(entry) == [("default", "fleet")] and "x" not in entry[("default", "fleet")]
    assert index_entry("default", {LABEL_MANAGED_BY: MANAGER}, {"metadata": {}}) == {}
    assert index_entry(None, owner_labels, {"metadata": {}}) == {}

    async with tenant.harness() as h:
        await h.apply(tenant.resource("fleet", {"engine": "vllm", "model": tenant.MODEL}))
        assert await reconcile(h.ctx, "default", "fleet") is not None  # creates the children
        apps = "/apis/apps/v1/namespaces/default/deployments"
        live = await h.get(f"{apps}/fleet")
        assert live is not None
        old = {**live, "metadata": {**live["metadata"], "resourceVersion": "1"}}
        deployments, pods = _Index({("default", "fleet"): [old]}), _Index()
        indexes = Indexes(deployments, pods)
        owner = Owner.of(await h.get(f"{SDEP}/fleet") or {})
        counted = _Counting(h.ctx.client)
        fresh = Freshness()
        children = await read_children(h.ctx.client, owner, indexes, fresh)
        assert counted.gets == [] and counted.lists == []  # nothing written: memory only
        assert children.deployments["baseline"] == old and children.pods == []
        fresh.wrote("default", "fleet")
        children = await read_children(h.ctx.client, owner, indexes, fresh)
        assert counted.gets == [f"{apps}/fleet"] and counted.lists == []
        got = children.deployments["baseline"]
        assert got is not None and got["metadata"]["resourceVersion"] != "1"  # the API server's
        assert fresh.stale("default", "fleet", old)
        deployments[("default", "fleet")] = [got]  # the watch delivered the version read
        counted.clear()
        children = await read_children(h.ctx.client, owner, indexes, fresh)
        assert counted.gets == [] and not fresh.pending


async def test_an_ensure_reads_indexed_deployments_and_gets_only_a_name_held_by_someone_else() -> None:
    assert name_entry("default", "x") == {("default", "x"): True}
    assert name_entry(None, "x") == {} and name_entry("default", None) == {}
    apps = "/apis/apps/v1/namespaces/default/deployments"
    async with tenant.harness() as h:
        path, name, extra = tenant.FOREIGN[1]  # a Deployment "web-canary" of another team
        await h.api.create(path, {"metadata": {"name": name, "labels": {"team": "other"}}, **extra})
        theirs = await h.get(f"{apps}/web-canary")
        spec = {"engine": "vllm", "model": tenant.MODEL, "replicas": 2}
        await h.apply(tenant.resource("web", spec))
        assert await reconcile(h.ctx, "default", "web") is not None  # creates the children
        everything = await h.api.list(apps)
        ours = [d for d in everything if d["metadata"].get("labels", {}).get(LABEL_RESOURCE) == "web"]
        assert sorted(d["metadata"]["name"] for d in ours) == ["web", "web-router"]  # 2 replicas: routed
        deployments = _Index({("default", "web"): ours})
        names = _Index({("default", d["metadata"]["name"]): [True] for d in everything})
        indexes = Indexes(deployments, _Index(), names)
        owner = Owner.of(await h.get(f"{SDEP}/web") or {})
        children = await read_children(h.ctx.client, owner, indexes, Freshness())
        # Ours as indexed; the canary's name is someone else's: left out, to be read by its name.
        assert children.known == {f"{apps}/{d['metadata']['name']}": d for d in ours}
        h.ctx.fresh.forget("default", ["web", "web-router"])  # the index holds what this process wrote

        counted = _Counting(h.ctx.client)
        h.ctx.ensured.clear()  # the next reconcile ensures every child, as it does periodically
        assert await reconcile(h.ctx, "default", "web", live=None, indexes=indexes) is not None
        assert [p for p in counted.gets if p.startswith(apps)] == [f"{apps}/web-canary"], counted.gets
        ready = await h.ready("web")
        assert (ready["status"], ready["reason"]) == ("False", "ResourceExists"), ready
        assert "Deployment default/web-canary" in ready["message"]
        assert tenant._content(await h.get(f"{apps}/web-canary")) == tenant._content(theirs)  # untouched


def test_without_an_index_of_names_every_absent_name_is_read_from_the_api_server() -> None:
    indexes = Indexes(_Index(), _Index())
    assert indexes.exists("default", "web-canary") is None
    names = Indexes(_Index(), _Index(), _Index({("default", "a"): [True]}))
    assert names.exists("default", "a") is True and names.exists("default", "b") is False


async def test_a_create_over_a_name_the_index_has_not_seen_yet_reads_it_and_reports_it() -> None:
    apps = "/apis/apps/v1/namespaces/default/deployments"
    async with tenant.harness() as h:
        path, name, extra = tenant.FOREIGN[1]
        await h.api.create(path, {"metadata": {"name": name, "labels": {"team": "other"}}, **extra})
        await h.apply(tenant.resource("web", {"engine": "vllm", "model": tenant.MODEL}))
        owner = Owner.of(await h.get(f"{SDEP}/web") or {})
        body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {}}}
        # The tick's view says no Deployment of that name (the watch has not delivered it yet).
        with pytest.raises(NotOurs, match="Deployment default/web-canary"):
            await _apply(
                h.ctx.client, apps, body, "apps", "deployments", owner, None, {f"{apps}/{name}": None}
            )


def test_a_pods_index_entry_is_what_the_operator_reads_of_it_not_the_pod() -> None:
    labels = {LABEL_RESOURCE: "fleet", LABEL_MANAGED_BY: MANAGER}
    pod: dict[str, Any] = {
        "metadata": {"name": "fleet-abc", "labels": labels},
        "spec": {"containers": [{"name": "engine", "args": ["--x"] * 50}]},
        "status": {
            "podIP": "10.0.0.7",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    entry = pod_entry("default", labels, pod)[("default", "fleet")]
    assert entry == pod_view(pod) and entry.ready and entry.ip == "10.0.0.7"
    pod["status"]["conditions"][0]["status"] = "False"  # a later change of the body does not reach it
    assert entry.ready
    assert pod_entry("default", {LABEL_MANAGED_BY: MANAGER}, pod) == {}
    assert pod_entry(None, labels, pod) == {}


async def test_a_rollout_waiting_past_half_its_timeout_lists_its_pods_past_a_stale_index() -> None:
    """kopf lists again when a paused watch resumes (a peering handover) but sends no deletion for a
    pod deleted meanwhile: an index entry of a gone pod must not hold a rollout up to its timeout."""
    from prefixtune.controller.reconcile import POD_RELIST_SHARE, relist_pods
    from prefixtune.tuning.phases import Step
    from prefixtune.tuning.policy import initial_state
    from prefixtune.tuning.settings import TuningSettings

    async with tenant.harness() as h:
        await h.apply(tenant.resource("fleet", {"engine": "vllm", "model": tenant.MODEL}))
        assert await reconcile(h.ctx, "default", "fleet") is not None  # creates the children
        owner = Owner.of(await h.get(f"{SDEP}/fleet") or {})
        labels = {LABEL_RESOURCE: "fleet", LABEL_MANAGED_BY: MANAGER}
        gone = pod_view(
            {"metadata": {"name": "fleet-gone", "labels": labels}, "status": {"podIP": "10.9.9.9"}}
        )
        indexes = Indexes(_Index(), _Index({("default", "fleet"): [gone]}))  # type: ignore[dict-item]
        counted = _Counting(h.ctx.client)
        from_index = await read_children(h.ctx.client, owner, indexes, Freshness())
        assert [p.name for p in from_index.pods] == ["fleet-gone"] and counted.lists == []
        listed = await read_children(h.ctx.client, owner, indexes, Freshness(), list_pods=True)
        assert "fleet-gone" not in [p.name for p in listed.pods]
        assert counted.lists == ["/api/v1/namespaces/default/pods"]

    settings = TuningSettings()
    state = initial_state("vllm", settings, tenant_config())
    half = POD_RELIST_SHARE * settings.ready_timeout_s
    rolling = state.model_copy(update={"step": Step.ROLLING_OUT, "step_since": 100.0})
    assert not relist_pods(rolling, 100.0 + half) and relist_pods(rolling, 100.0 + half + 1)
    assert not relist_pods(rolling.model_copy(update={"step": Step.MEASURING}), 100.0 + 2 * half)


def tenant_config() -> Any:
    from prefixtune.engines import get_adapter

    return get_adapter("vllm").default_config()
