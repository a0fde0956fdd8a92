"""Issue 16 in the policy: a trial is scored only once the engine's effective config was read back,
a trial whose engine runs other knob values ends not_applied (never scored), and an engine release
that lacks the signals an objective needs is observed, not tuned blind."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefixtune.api import parse_spec
from prefixtune.controller.applied import ReadBack, kv_tokens, mismatches
from prefixtune.controller.settings import release_gaps, tuning_settings
from prefixtune.engines import get_adapter
from prefixtune.metrics.exposition import Snapshot, labels_of
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import EmitEvent, RecordTrial, RollBack, SetCondition
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.policy import initial_state, step
from prefixtune.tuning.policy.messages import tuning_condition
from prefixtune.tuning.settings import Slo, TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import ConfigChecked, Observation, RolloutReady, Tick, WindowMeasured

ENGINE = "trtllm"
DEFAULT = get_adapter(ENGINE).default_config()
TRIAL = DEFAULT.with_(memory_fraction=0.6)
SETTINGS = TuningSettings(
    warmup_s=60, measure_s=300, min_requests=100, max_trials=3, min_interval_s=0, seed_key="ns/a",
    slo=Slo(2.0, 0.15), verify_applied=True,
)  # fmt: skip


def signals() -> Signals:
    return Signals(
        window_s=300.0, requests=500.0, hit_rate=0.6, ttft_p50_s=0.1, ttft_p99_s=0.5, itl_p50_s=0.02,
        itl_p99_s=0.05, output_tokens_per_s=1000.0, input_tokens_per_s=2000.0, requests_per_s=1.0,
        goodput_tokens_per_s=950.0, slo_attainment=0.95,
    )  # fmt: skip


def suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
    if len(history) < 2:
        return Suggestion(TRIAL, "scripted")
    return Suggestion(None, "done", converged=True)


class Run:
    def __init__(self, settings: TuningSettings = SETTINGS) -> None:
        self.state = initial_state(ENGINE, settings, DEFAULT)
        self.actions: list[Any] = []

    def __call__(self, obs: Observation, now: float) -> list[Any]:
        self.state, acts = step(self.state, obs, now, suggester)
        self.actions.extend(acts)
        return acts

    def window(self, now: float) -> list[Any]:
        return self(WindowMeasured(signals=signals(), offered_rps=1.0), now)

    def checked(self, config: Any, now: float, *found: str, kv: int | None = 4096) -> list[Any]:
        return self(ConfigChecked(config=config, mismatches=list(found), kv_tokens=kv), now)


def _baseline(r: Run) -> float:
    r(RolloutReady(config=DEFAULT), 0.0)
    r(Tick(), 60.0)
    assert r.state.step == "Measuring"
    r.window(360.0)  # not verified yet: measured again, not scored
    assert r.state.trial(0).outcome == "running" and r.state.step == "Measuring"
    r.checked(DEFAULT, 361.0)
    r.window(661.0)
    assert r.state.trial(0).outcome == "ok" and r.state.trial(0).kv_tokens == 4096
    return 661.0


def test_a_window_is_scored_only_after_the_effective_config_was_read_back() -> None:
    r = Run()
    _baseline(r)
    assert r.state.phase == "Exploring" and r.state.step == "RollingOut"


def test_an_overridden_knob_ends_the_trial_not_applied_and_never_scored() -> None:
    r = Run()
    now = _baseline(r)
    r(RolloutReady(config=TRIAL), now + 10)
    assert r.state.step == "WarmingUp"
    acts = r.checked(TRIAL, now + 20, "memory_fraction: intended 0.6, running 0.9 (pod p)")
    trial = r.state.trial(1)
    assert trial.outcome == "not_applied" and trial.value is None and trial.score is None
    assert trial.signals is None and "running 0.9" in trial.reason
    events = [a for a in acts if isinstance(a, EmitEvent) and a.reason == "KnobNotApplied"]
    assert events and "memory_fraction: intended 0.6, running 0.9" in events[0].message
    assert any(isinstance(a, RollBack) for a in acts)
    assert any(isinstance(a, RecordTrial) and a.trial.outcome == "not_applied" for a in acts)
    # A window arriving afterwards scores nothing: the trial is over.
    r.window(now + 400)
    assert r.state.trial(1).value is None
    # The optimizer learns it as a config that does not run (like an infeasible one).
    from prefixtune.tuning.policy import _Ctx

    history = _Ctx(r.state, now, suggester).history()
    assert any(h.config == TRIAL and h.value is None for h in history)


def test_an_engine_without_config_info_is_verified_with_nothing_to_compare() -> None:
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r(Tick(), 60.0)
    r.checked(DEFAULT, 61.0, kv=None)
    r.window(361.0)
    assert r.state.trial(0).outcome == "ok" and r.state.trial(0).kv_tokens is None


def test_mismatches_compare_what_each_pod_reports() -> None:
    reads = [
        ReadBack("a", {"memory_fraction": 0.6, "block_size": 32, "prefix_caching": True, "kv_tokens": 900}),
        ReadBack("b", {"memory_fraction": 0.9, "block_size": 64, "kv_tokens": 800}),
        ReadBack("c", {}),
    ]
    found = mismatches(TRIAL, reads)
    assert found == [
        "memory_fraction: intended 0.6, running 0.9 (pod b)",
        "block_size: intended 32, running 64 (pod b)",
    ]
    assert mismatches(TRIAL, reads[:1]) == [] and kv_tokens(reads) == 800


def test_read_back_uses_the_adapters_config_info() -> None:
    from prefixtune.controller.applied import read_back

    labels = labels_of({"block_size": "32", "gpu_memory_utilization": "0.9", "enable_prefix_caching": "True",
                        "num_gpu_blocks": "1000"})  # fmt: skip
    snap = Snapshot("p", 0.0, {("vllm:cache_config_info", labels): 1.0})
    read = read_back(get_adapter("vllm"), "p", snap)
    assert read.effective["memory_fraction"] == 0.9 and read.kv_tokens == 32000


# --- 1. an engine release without the signals -------------------------------------------------------


def test_a_trtllm_1_2_image_lacks_signals_and_cannot_score_goodput() -> None:
    old = parse_spec({"engine": "trtllm", "model": "m", "image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"})
    missing, refusal = release_gaps(old)
    assert "prefix-cache hit rate" in missing and "output tokens/s (throughput, goodput)" in missing
    assert "TTFT histogram" not in missing and "request count" not in missing
    assert refusal.startswith("objective goodput needs") and "objectives it can score: ttft" in refusal
    ttft = parse_spec({**old.model_dump(by_alias=True, exclude_none=True), "tuning": {"objective": "ttft"}})
    assert release_gaps(ttft)[1] == ""
    new = parse_spec({"engine": "trtllm", "model": "m"})
    assert release_gaps(new) == ((), "")
    assert tuning_settings(old, "ns", "n").verify_applied


def test_a_refused_objective_observes_and_names_the_missing_signals() -> None:
    settings = replace(
        SETTINGS, missing_signals=("prefix-cache hit rate",), refusal="objective goodput needs x"
    )
    r = Run(settings)
    acts = r(Tick(), 0.0)
    assert r.state.phase == "Observing"
    conditions = {a.type: a for a in acts if isinstance(a, SetCondition)}
    assert conditions["SignalsMissing"].status == "True"
    assert "prefix-cache hit rate" in conditions["SignalsMissing"].message
    assert tuning_condition(r.state) == (False, "SignalsMissing", "objective goodput needs x")
    assert any(isinstance(a, EmitEvent) and a.reason == "SignalsMissing" for a in acts)


def test_an_objective_it_can_score_still_tunes_with_the_gap_named() -> None:
    settings = replace(SETTINGS, objective="ttft", missing_signals=("prefix-cache hit rate",))
    r = Run(settings)
    acts = r(Tick(), 0.0)
    assert r.state.phase == "Baseline"
    assert any(
        isinstance(a, SetCondition) and a.type == "SignalsMissing" and a.status == "True" for a in acts
    )


def test_an_unverifiable_trial_is_scored_with_a_warning_naming_why() -> None:
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r(Tick(), 60.0)
    acts = r(ConfigChecked(config=DEFAULT, reason="the operator could not scrape"), 61.0)
    events = [a for a in acts if isinstance(a, EmitEvent) and a.reason == "KnobsUnverified"]
    assert events and "could not scrape" in events[0].message
    r.window(361.0)
    assert r.state.trial(0).outcome == "ok"
