"""The kubelet's light stand-in pods (``sandbox/standin.py``): recorded metrics whose counters advance."""

from __future__ import annotations

import time

import aiohttp

from prefixtune.controller import applied
from prefixtune.engines import get_adapter
from prefixtune.metrics.exposition import parse
from prefixtune.sandbox.kubelet import AddressPool
from prefixtune.sandbox.standin import Recording, StandInPod, StandInServer, split_families

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _parsed(engine: str, block_size: int):  # type: ignore[no-untyped-def]
    adapter = get_adapter(engine)
    rendered = adapter.render(MODEL, adapter.default_config().with_(block_size=block_size))
    return adapter.parse(rendered.argv, rendered.files)


def test_every_engine_has_a_recording_whose_counters_advance() -> None:
    for engine in ("vllm", "sglang", "trtllm"):
        families = Recording.load(engine).cumulative()
        rates = [s.per_s for f in families for s in f.samples]
        assert families and any(r > 0 for r in rates) and all(r >= 0 for r in rates)


def test_split_families_keeps_headers_with_their_samples() -> None:
    text = "# HELP a_total A.\n# TYPE a_total counter\na_total 1.0\n# HELP g G.\n# TYPE g gauge\ng 2.0\n"
    assert split_families(text) == [
        ("a_total", "counter", ["# HELP a_total A.", "# TYPE a_total counter"], ["a_total 1.0"]),
        ("g", "gauge", ["# HELP g G.", "# TYPE g gauge"], ["g 2.0"]),
    ]


def test_a_pods_gauges_are_rendered_once_per_command_and_differ_only_in_the_start_time() -> None:
    from prefixtune.sandbox import standin

    def created(text: str) -> list[float]:
        lines = [line for line in text.splitlines() if "_created" in line.split(" ")[0]]
        return [float(line.rsplit(" ", 1)[1]) for line in lines]

    def others(text: str) -> list[str]:
        return [line for line in text.splitlines() if "_created" not in line.split(" ")[0]]

    for engine in ("vllm", "sglang", "trtllm"):
        rec, parsed = Recording.load(engine), _parsed(engine, 32)
        for started in (0.0, 1764873600.25, 1e-3):
            before = time.time()
            cached = standin.gauge_text(rec, parsed, started)
            rendered = standin._render_gauges(rec, parsed, started)
            assert others(cached) == others(rendered)
            assert len(created(cached)) == len(created(rendered)) and min(created(cached)) >= before
        text = standin.gauge_text(rec, parsed, 1764873600.25)
        (start,) = [line for line in text.splitlines() if line.startswith("process_start_time_seconds ")]
        assert float(start.split(" ")[1]) == 1764873600.25
        assert (rec, repr(parsed)) in standin._AT_ZERO


async def test_one_server_answers_each_pod_on_its_address_with_its_own_config() -> None:
    now = [1000.0]
    server = StandInServer()
    pool = AddressPool.claim()
    pods = [
        StandInPod(server, pool.allocate(), 8000, _parsed("vllm", bs), speedup=1.0, clock=lambda: now[0],
                   exit_delay_s=0.0)
        for bs in (16, 32)
    ]  # fmt: skip
    try:
        for pod in pods:
            await pod.start()
        adapter = get_adapter("vllm")
        async with aiohttp.ClientSession() as session:
            texts = []
            for pod in pods:
                async with session.get(pod.url + "/health") as resp:
                    assert resp.status == 200
                async with session.get(pod.url + "/metrics") as resp:
                    texts.append(await resp.text())
            now[0] += 10.0
            async with session.get(pods[0].url + "/metrics") as resp:
                later = await resp.text()
            pods[0].on_oom("CUDA out of memory")
            async with session.get(pods[0].url + "/health") as resp:
                assert resp.status == 503
        snaps = [parse(t, target="pod", t=0.0) for t in texts]
        reads = [applied.read_back(adapter, f"p{i}", s) for i, s in enumerate(snaps)]
        assert [r.effective.get("block_size") for r in reads] == [16, 32]
        key = next(
            k for k in snaps[0].values if k[0] == "vllm:request_success_total" and snaps[0].values[k] > 0
        )
        assert parse(later, target="pod", t=10.0).values[key] > snaps[0].values[key]
    finally:
        await server.close()
        pool.close()


async def test_a_scrape_is_answered_while_the_sandboxs_loop_is_busy() -> None:
    # The stand-ins serve on their own loop and thread: a pod answers while the sandbox's loop
    # (API server, controllers, kubelet) is stuck in work of its own, as a real pod would.
    import asyncio
    import threading
    import urllib.request

    server = StandInServer()
    pool = AddressPool.claim()
    pod = StandInPod(server, pool.allocate(), 8000, _parsed("vllm", 16), speedup=1.0, clock=time.time,
                     exit_delay_s=0.0)  # fmt: skip
    answered: list[float] = []

    def scrape() -> None:
        with urllib.request.urlopen(pod.url + "/metrics", timeout=10) as resp:
            assert resp.status == 200 and b"vllm:" in resp.read()
        answered.append(time.monotonic())

    try:
        await pod.start()
        client = threading.Thread(target=scrape)
        began = time.monotonic()
        client.start()
        time.sleep(3.0)  # the sandbox's loop blocked: nothing of it runs meanwhile
        blocked_until = time.monotonic()
        await asyncio.to_thread(client.join, 10.0)
        assert answered and began < answered[0] < blocked_until  # answered during the block
    finally:
        await server.close()
        pool.close()
