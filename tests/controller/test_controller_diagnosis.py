"""The status's diagnosis describes the config it names (issue 18, item 8: after a caching-off trial
the diagnosis advised turning caching off).

With a canary, the window the Meter keeps for the diagnosis is the stable pods' alone, with their
config; a mix of the stable and the canary pods is neither config's. The status drops a diagnosis
made for another config than ``currentConfig``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.metrics.conftest import SyntheticEngine

from prefixtune.api import parse_spec
from prefixtune.controller import status as S
from prefixtune.controller.measure import Meter
from prefixtune.controller.observe import PodView
from prefixtune.controller.render import config_hash
from prefixtune.controller.settings import tuning_settings
from prefixtune.engines.base import EngineName
from prefixtune.metrics.diagnosis import diagnose
from prefixtune.metrics.exposition import Snapshot, parse
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.state import PolicyState, Trial

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class _Meter(Meter):
    """Scrapes the synthetic engines at the time the test sets."""

    def __init__(self, engines: Sequence[SyntheticEngine]) -> None:
        super().__init__(born=0.0)
        self.engines = list(engines)
        self.t = 0.0

    async def _scrape(
        self, spec: Any, pods: Sequence[PodView], only: frozenset[str] | None = None
    ) -> tuple[dict[str, Snapshot], list[str]]:
        wanted = {p.name for p in pods}
        return {
            e.pod: parse(e.exposition().decode(), target=e.pod, t=self.t)
            for e in self.engines
            if e.pod in wanted
        }, []


def _drive(engines: Sequence[SyntheticEngine], t0: float, t1: float) -> None:
    steps = round((t1 - t0) / 0.05)
    for i in range(1, steps + 1):
        for e in engines:
            e.tick(t0 + i * 0.05)


def _canary_trial() -> tuple[Any, PolicyState]:
    spec = parse_spec({"engine": "vllm", "model": MODEL, "replicas": 3})
    stable = spec.knob_config()
    state = initial_state("vllm", tuning_settings(spec, "ns", "n"), stable)
    assert state.settings.strategy == "canary"
    trial = Trial(id=1, epoch=0, role="trial", config=stable.with_(prefix_caching=False), started_at=0.0)
    update = {
        "phase": Phase.EXPLORING, "step": Step.MEASURING, "trials": [trial], "active": 1,
        "measure_from": 10.0, "measure_until": 20.0,
    }  # fmt: skip
    return spec, state.model_copy(update=update)


async def test_a_canary_windows_diagnosis_is_the_stable_pods_with_their_config() -> None:
    spec, state = _canary_trial()
    trial = state.trial(1)
    engines = [
        SyntheticEngine(EngineName.VLLM, "stable-0", seed=1, rate=40.0, hit_share=0.8),
        SyntheticEngine(EngineName.VLLM, "stable-1", seed=2, rate=40.0, hit_share=0.8),
        SyntheticEngine(EngineName.VLLM, "canary-0", seed=3, rate=40.0, hit_share=0.0),  # caching off
    ]
    pods = [
        PodView(name=e.pod, ip=f"127.0.0.{i + 2}", role="canary" if "canary" in e.pod else "baseline",
                config_hash=config_hash(trial.config if "canary" in e.pod else state.current),
                ready=True, restarts=0)
        for i, e in enumerate(engines)
    ]  # fmt: skip
    for e in engines:
        e.tick(0.0)
    _drive(engines, 0.0, 10.0)
    meter = _Meter(engines)
    meter.t = 10.0
    assert await meter.observe("u", spec, state, pods, 10.0) is None  # the window's start
    _drive(engines, 10.0, 20.0)
    meter.t = 20.0
    obs = await meter.observe("u", spec, state, pods, 20.0)
    assert obs is not None and obs.kind == "window" and not obs.partial, obs
    assert obs.signals is not None and obs.baseline_signals is not None
    kept = meter.last_window["u"]
    assert kept.config == state.current and kept.config.prefix_caching
    assert kept.signals == obs.baseline_signals  # not the mix of both configs
    assert kept.signals.hit_rate is not None and kept.signals.hit_rate > 0.6
    advice = " ".join(diagnose(kept.signals, prefix_caching=kept.config.prefix_caching).notes())
    assert "turning prefix caching off" not in advice
    # The canary's own window (caching off, hit rate near 0) would have said so, had caching been on:
    assert obs.signals.hit_rate is not None and obs.signals.hit_rate < 0.1
    assert "turning prefix caching off" in " ".join(diagnose(obs.signals, prefix_caching=True).notes())
    assert "turning prefix caching off" not in " ".join(diagnose(obs.signals, prefix_caching=False).notes())


def test_a_diagnosis_of_another_config_is_dropped_from_the_status() -> None:
    """A rolling trial turned caching off: the diagnosis of the caching-on window before it (which
    advised turning it off) is not shown under the new currentConfig; it stays while the config does."""
    spec = parse_spec({"engine": "vllm", "model": MODEL})
    on = spec.knob_config()
    state = initial_state("vllm", tuning_settings(spec, "ns", "n"), on)
    low = diagnose(Signals(window_s=60, requests=200, hit_rate=0.1), prefix_caching=True)
    assert "turning prefix caching off" in " ".join(low.notes())
    ready = (True, "ReplicasReady", "1/1")
    first = S.build_status(state, [], None, now=1.0, generation=1, ready=ready, diagnosis=low)
    again = S.build_status(state, [], first, now=2.0, generation=1, ready=ready)
    assert again["diagnosis"] == first["diagnosis"]  # same config: kept until a new window
    off = state.model_copy(update={"current": on.with_(prefix_caching=False)})
    after = S.build_status(off, [], again, now=3.0, generation=1, ready=ready)
    assert after["currentConfig"]["prefixCaching"] is False
    assert after["diagnosis"] is None
