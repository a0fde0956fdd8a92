"""A counter reset inside a scraped window is seen at any of the window's scrapes, not only between
its first and last: seen in `prefixtune bench reliability` on a loaded machine, a reset that came
while the counters were still low (a pod that had just started) climbed past the start values by the
window's end, and the baseline was scored on a window that had lost what it counted before the reset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.metrics.conftest import SyntheticEngine

from prefixtune.api import parse_spec
from prefixtune.controller.measure import Meter
from prefixtune.controller.observe import PodView
from prefixtune.controller.render import config_hash
from prefixtune.controller.settings import tuning_settings
from prefixtune.engines.base import EngineName
from prefixtune.metrics.exposition import Snapshot, parse
from prefixtune.sandbox.faults import MetricsFaults
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.state import Trial, TrialInvalidated, WindowMeasured

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class _Meter(Meter):
    """Scrapes answered by one synthetic engine behind the sandbox's metrics faults."""

    def __init__(self, born: float) -> None:
        super().__init__(born=born)
        self.engine = SyntheticEngine(EngineName.VLLM, "b1", seed=1, rate=2.0, hit_share=0.5)
        self.faults = MetricsFaults()
        self.now = 0.0

    async def _scrape(
        self, spec: Any, pods: Sequence[PodView], only: frozenset[str] | None = None
    ) -> tuple[dict[str, Snapshot], list[str]]:
        self.engine.tick(self.now)
        text = self.faults.transform("b1", self.engine.exposition().decode())
        assert text is not None
        return {"b1": parse(text, target="b1", t=self.now)}, []


async def _window(reset_at: float | None) -> object:
    spec = parse_spec(
        {"engine": "vllm", "model": MODEL, "replicas": 1, "tuning": {"trial": {"measure": "60s"}}}
    )  # early-abort checks every 15 s
    t0 = 1000.0
    baseline = Trial(id=0, epoch=0, role="baseline", config=spec.knob_config(), started_at=t0)
    state = initial_state("vllm", tuning_settings(spec, "ns", "n"), spec.knob_config()).model_copy(
        update={"phase": Phase.BASELINE, "step": Step.MEASURING, "trials": [baseline], "active": 0,
                "measure_from": t0, "measure_until": t0 + 60.0}
    )  # fmt: skip
    pods = [PodView(name="b1", ip="127.0.0.9", role="baseline", config_hash=config_hash(spec.knob_config()),
                    ready=True, restarts=0)]  # fmt: skip
    meter = _Meter(born=t0 - 60)
    meter.now = t0 - 5.0
    meter.engine.tick(meter.now)  # the pod has served for 5 s: its counters are low, not zero
    obs: object = None
    for now in (t0, t0 + 20.0, t0 + 40.0, t0 + 60.0):
        meter.now = now
        if reset_at is not None and now == reset_at:
            meter.faults.set("reset")  # counters restart from zero at this scrape ...
        obs = await meter.observe("uid", spec, state, pods, now)
        meter.faults.clear()  # ... and keep counting from there
        if now < t0 + 60.0:
            assert now == t0 or (isinstance(obs, WindowMeasured) and obs.partial), obs
    return obs


async def test_a_reset_at_an_early_abort_check_invalidates_the_window() -> None:
    assert isinstance(await _window(reset_at=None), WindowMeasured)  # the same window, no reset
    obs = await _window(reset_at=1020.0)
    assert isinstance(obs, TrialInvalidated), obs
    assert "counters reset" in obs.reason
