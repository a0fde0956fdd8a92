"""The Meter's read-back of the effective config after a rollout (issue 16, item 4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefixtune.api import parse_spec
from prefixtune.controller.measure import Meter
from prefixtune.controller.observe import PodView
from prefixtune.controller.render import config_hash
from prefixtune.controller.settings import tuning_settings
from prefixtune.engines import get_adapter
from prefixtune.metrics.exposition import Snapshot, labels_of
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.state import PolicyState, Trial

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class _Meter(Meter):
    def __init__(self, snaps: Mapping[str, Snapshot]) -> None:
        super().__init__()
        self.snaps = dict(snaps)

    async def _scrape(
        self, spec: Any, pods: Sequence[PodView], only: frozenset[str] | None = None
    ) -> tuple[dict[str, Snapshot], list[str]]:
        return {p.name: self.snaps[p.name] for p in pods if p.name in self.snaps}, []


def _setup(source: str = "scrape") -> tuple[Any, PolicyState, PodView]:
    metrics: dict[str, Any] = {"source": source}
    if source == "prometheus":
        metrics["url"] = "http://prometheus.monitoring:9090"
    spec = parse_spec({"engine": "vllm", "model": MODEL, "tuning": {"metrics": metrics}})
    config = spec.knob_config()
    state = initial_state("vllm", tuning_settings(spec, "ns", "n"), config)
    trial = Trial(id=0, epoch=0, role="baseline", config=config, started_at=0.0)
    state = state.model_copy(
        update={"phase": "Baseline", "step": "WarmingUp", "trials": [trial], "active": 0}
    )
    pod = PodView(
        name="p", ip="127.0.0.9", role="baseline", config_hash=config_hash(config), ready=True, restarts=0
    )
    return spec, state, pod


def _info(fraction: float, block: int) -> Snapshot:
    labels = labels_of({"block_size": str(block), "gpu_memory_utilization": str(fraction),
                        "enable_prefix_caching": "True", "num_gpu_blocks": "100"})  # fmt: skip
    return Snapshot("p", 0.0, {("vllm:cache_config_info", labels): 1.0})


async def test_verify_reports_what_the_pods_run_against_the_trial() -> None:
    spec, state, pod = _setup()
    default = get_adapter("vllm").default_config()
    same = await _Meter({"p": _info(default.memory_fraction, default.block_size)}).verify(spec, state, [pod])
    assert same is not None and same.kind == "config_checked" and same.mismatches == ()
    assert same.kv_tokens == 100 * default.block_size
    other = await _Meter({"p": _info(0.5, default.block_size)}).verify(spec, state, [pod])
    assert other is not None and other.mismatches == (
        f"memory_fraction: intended {default.memory_fraction}, running 0.5 (pod p)",
    )


async def test_verify_waits_for_a_scrape_and_says_when_prometheus_pods_are_unreachable() -> None:
    spec, state, pod = _setup()
    assert await _Meter({}).verify(spec, state, [pod]) is None  # scrape mode: try again next tick
    spec, state, pod = _setup("prometheus")
    obs = await _Meter({}).verify(spec, state, [pod])
    assert obs is not None and obs.mismatches == () and "could not scrape" in obs.reason
    verified = state.model_copy(update={"trials": [state.trials[0].model_copy(update={"verified": True})]})
    assert await _Meter({}).verify(spec, verified, [pod]) is None  # checked once per trial
