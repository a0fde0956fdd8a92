"""A scraped window's pod counts are the pods it measured: a pod that came up inside the window (one
an autoscaler added, still loading when the window began) must not divide a side's per-pod score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tests.metrics.conftest import SyntheticEngine

from prefixtune.api import parse_spec
from prefixtune.controller.measure import Meter
from prefixtune.controller.observe import PodView
from prefixtune.controller.render import config_hash
from prefixtune.controller.settings import tuning_settings
from prefixtune.engines.base import EngineName
from prefixtune.metrics.exposition import Snapshot, parse
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.state import Trial, WindowMeasured

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class _Meter(Meter):
    """Scrapes answered from the engines that serve at that moment (a loading pod does not answer)."""

    def __init__(self, born: float) -> None:
        super().__init__(born=born)
        self.serving: dict[str, Snapshot] = {}

    async def _scrape(
        self, spec: Any, pods: Sequence[PodView], only: frozenset[str] | None = None
    ) -> tuple[dict[str, Snapshot], list[str]]:
        return {p.name: self.serving[p.name] for p in pods if p.name in self.serving}, []


def _snaps(engines: Mapping[str, SyntheticEngine], now: float) -> dict[str, Snapshot]:
    for engine in engines.values():
        engine.tick(now)
    return {name: parse(e.exposition().decode(), target=name, t=now) for name, e in engines.items()}


async def test_a_pod_added_inside_a_canary_window_is_not_counted_as_measured() -> None:
    spec = parse_spec(
        {"engine": "vllm", "model": MODEL, "replicas": 3,
         "tuning": {"objective": "throughput", "rollout": {"strategy": "canary"}}}
    )  # fmt: skip
    stable = spec.knob_config()
    trial_config = stable.with_(block_size=32)
    t0 = 1000.0
    trial = Trial(id=1, epoch=0, role="trial", config=trial_config, started_at=t0)
    state = initial_state("vllm", tuning_settings(spec, "ns", "n"), stable).model_copy(
        update={"phase": Phase.EXPLORING, "step": Step.MEASURING, "trials": [trial], "active": 1,
                "measure_from": t0, "measure_until": t0 + 60.0}
    )  # fmt: skip

    def pod(name: str, role: str, config: Any) -> PodView:
        return PodView(
            name=name, ip="127.0.0.9", role=role, config_hash=config_hash(config), ready=True, restarts=0
        )

    pods = [pod("b1", "baseline", stable), pod("b2", "baseline", stable), pod("c1", "canary", trial_config)]
    engines = {
        name: SyntheticEngine(EngineName.VLLM, name, seed=i, rate=2.0, hit_share=0.5)
        for i, name in enumerate(("b1", "b2", "c1"))
    }
    meter = _Meter(born=t0 - 1)
    start = _snaps(engines, t0)
    meter.serving = {k: v for k, v in start.items() if k != "b2"}  # b2 still loads its model
    assert await meter.observe("uid", spec, state, pods, t0) is None  # the window's start scrape
    meter.serving = _snaps(engines, t0 + 60.0)  # b2 serves now: it got part of the traffic
    obs = await meter.observe("uid", spec, state, pods, t0 + 60.0)
    assert isinstance(obs, WindowMeasured) and not obs.partial
    assert (obs.canary_pods, obs.baseline_pods) == (1, 1)  # b1 and c1: the pods the window measured
    assert obs.baseline_signals is not None and obs.baseline_signals.requests > 0
