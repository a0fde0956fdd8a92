"""``prefixtune bench day``'s harness on a fake twin: the day's traffic, the accounting of what each
config serves, and the real policy driven through the day (the full run's figures are in
docs/bench-results/day.json)."""

from __future__ import annotations

import functools
import math
from typing import Any

from bench import day as d
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.optimizer import Suggestion
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.twin.workloads import preset

CAPACITY = {d.WorkloadPhase.BEFORE: 10.0, d.WorkloadPhase.AFTER: 8.0}
TOKENS = 100.0  # output tokens per request


class FakeSamples:
    """A config's capacity is the phase's with caching on, a quarter of it off; what exceeds it is served
    outside the SLOs; a cold cache serves 80% of the warm capacity."""

    def __init__(self) -> None:
        self.calls: list[tuple[KnobConfig, float, d.WorkloadPhase, int]] = []

    def capacity(self, phase: d.WorkloadPhase) -> float:
        return CAPACITY[phase]

    def sample(self, config: KnobConfig, rate: float, phase: d.WorkloadPhase, seed: int) -> d.Sample:
        self.calls.append((config, rate, phase, seed))
        cap = CAPACITY[phase] * (1.0 if config.prefix_caching else 0.25)

        def part(seconds: float, capacity: float) -> d.Counts:
            served = min(rate, capacity)
            return d.Counts(
                seconds, round(rate * seconds), round(served * seconds), round(served * seconds * TOKENS)
            )

        served = min(rate, cap)
        over = rate > cap
        signals = Signals(
            window_s=120.0, requests=served * 120, hit_rate=0.6 if config.prefix_caching else 0.0,
            prefill_reduction=0.5 if config.prefix_caching else 0.0, running_mean=8.0, running_max=16.0,
            waiting_mean=5.0 if over else 0.0, kv_usage_mean=0.5, preemptions_per_s=0.0, gpu_util=0.5,
            ttft_p50_s=0.2, ttft_p90_s=0.4, ttft_p99_s=9.0 if over else 0.5, itl_p50_s=0.02, itl_p99_s=0.04,
            output_tokens_per_s=served * TOKENS, input_tokens_per_s=served * 1000, requests_per_s=served,
            goodput_tokens_per_s=served * TOKENS, slo_attainment=served / rate,
        )  # fmt: skip
        return d.Sample("ok", part(180.0, 0.8 * cap), part(120.0, cap), signals)


def _scenario() -> d.DayScenario:
    return d.day_scenarios()["vllm-chatbot"]


def _day(traffic: d.Traffic | None = None) -> tuple[d.Day, FakeSamples]:
    samples = FakeSamples()
    return d.Day(traffic or d.Traffic(), samples, cold_s=180.0), samples


def _caching(on: bool) -> KnobConfig:
    return _scenario().scenario.start_config().with_(prefix_caching=on)


def test_the_day_is_144_ten_minute_segments_with_the_change_at_hour_14() -> None:
    segs = d.Traffic().segments()
    assert len(segs) == 144 and segs[-1].end_s == d.DAY_S
    change = next(s for s in segs if s.phase == d.WorkloadPhase.AFTER)
    assert change.start_s == 14 * d.HOUR
    assert all(s.phase == d.WorkloadPhase.AFTER for s in segs[change.index :])


def test_the_load_is_diurnal_between_low_and_high_lowest_at_the_trough() -> None:
    traffic = d.Traffic()
    calm = [s for s in traffic.segments() if not s.burst]
    levels = [s.level for s in calm]
    assert min(levels) == traffic.low and max(levels) == traffic.high
    lowest = min(calm, key=lambda s: (s.level, abs(s.start_s / d.HOUR - traffic.trough_h)))
    highest = max(calm, key=lambda s: (s.level, -abs(s.start_s / d.HOUR - traffic.trough_h - 12)))
    assert abs(lowest.start_s / d.HOUR - traffic.trough_h) <= 1
    assert abs(highest.start_s / d.HOUR - (traffic.trough_h + 12)) <= 1
    assert all(abs(lv / traffic.level_step - round(lv / traffic.level_step)) < 1e-6 for lv in levels)


def test_each_burst_doubles_the_load_of_exactly_its_own_ten_minutes() -> None:
    traffic = d.Traffic(bursts_h=(10.5, 20.0))
    segs = traffic.segments()
    bursts = [s for s in segs if s.burst]
    assert [s.start_s / d.HOUR for s in bursts] == [10.5, 20.0]
    for s in bursts:
        base = traffic.quantize(traffic.diurnal((s.start_s + d.SEGMENT_S / 2) / d.HOUR))
        assert s.level == traffic.quantize(2 * base)
        assert segs[s.index - 1].level <= base + traffic.level_step and not segs[s.index + 1].burst


def test_a_burst_off_a_ten_minute_boundary_is_refused() -> None:
    try:
        d.Traffic(bursts_h=(10.25,))
    except ValueError as exc:
        assert "10-minute boundary" in str(exc)
    else:
        raise AssertionError("a burst at 10:15 was accepted")


def test_the_workload_change_renames_the_prefixes_and_doubles_the_contexts_not_the_system_prompt() -> None:
    before = preset("agent")
    after = d.changed_workload(before)
    assert after.name != before.name  # new prefix keys: nothing cached before the change hits after
    pools = {p.name: p for p in after.prefixes}
    old = {p.name: p for p in before.prefixes}
    assert pools["system"].length == old["system"].length
    assert pools["tools"].length.mean == 2 * (old["tools"].length.mean or 0)
    assert after.session.context.median == 2 * (before.session.context.median or 0)


def test_the_workload_change_can_lengthen_outputs_and_suffixes() -> None:
    before = preset("chatbot")
    after = d.Change(context_scale=1.0, output_scale=2.0, suffix_scale=0.5).apply(before)
    assert after.output.median == 2 * (before.output.median or 0)
    assert after.suffix.median == 0.5 * (before.suffix.median or 0)
    assert after.session.context == before.session.context


def test_a_change_with_a_scale_that_is_not_positive_is_refused() -> None:
    for bad in ({"output_scale": 0.0}, {"context_scale": -1.0}, {"corpus_scale": 0}, {"corpus_scale": 1.5}):
        try:
            d.Change(**bad)  # type: ignore[arg-type]
        except ValueError as exc:
            assert next(iter(bad)) in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_a_change_that_does_not_scale_outputs_or_suffixes_keeps_its_cache_key() -> None:
    assert d.Change(context_scale=1.0, corpus_scale=2).key() == {"context_scale": 1.0, "corpus_scale": 2}
    assert d.Change(output_scale=2.0).key()["output_scale"] == 2.0


def test_a_config_that_never_changes_is_charged_its_warm_rates_all_day_with_no_restart() -> None:
    day, _ = _day()
    cfg = _caching(True)
    total, per = day.account([d.Serving(0.0, cfg, -math.inf)])
    expected = sum(min(day.rate(s), CAPACITY[s.phase]) * d.SEGMENT_S * TOKENS for s in day.segments)
    assert math.isclose(total.goodput_tokens, expected, rel_tol=0.01)
    assert math.isclose(sum(t.goodput_tokens for t in per), total.goodput_tokens)
    out, _ = d.summarize_method(day, [d.Serving(0.0, cfg, -math.inf)], 0, None, cfg)
    assert out["restarts"] == 0 and out["slo_violating_in_trial_windows"] == 0


def test_a_restart_charges_the_cold_rates_for_cold_s_after_the_config_is_ready() -> None:
    day, _ = _day()
    cfg = _caching(True)
    seg = day.segments[0]
    warm = day.charge(cfg, -math.inf, seg.start_s, seg.end_s)[0][1]
    cold = day.charge(cfg, seg.start_s, seg.start_s, seg.end_s)[0][1]
    sample = day.sample(cfg, seg)
    per_request = sample.warm.per_request()[1] - sample.cold.per_request()[1]
    lost = per_request * day.rate(seg) * day.cold_s
    assert math.isclose(warm.goodput_tokens - cold.goodput_tokens, lost)


def test_only_the_bursts_overload_the_best_config() -> None:
    day, _ = _day()
    _, per = day.account([d.Serving(0.0, _caching(True), -math.inf)])
    overloaded = {s.index for s, t in zip(day.segments, per, strict=True) if t.violating > 0}
    assert overloaded == {s.index for s in day.segments if s.burst and s.level > 1.0}


def _grid_suggester(configs: list[KnobConfig]) -> Any:
    """Suggests each config in turn (per epoch: by the history's length), then converges."""

    def suggest(space: SearchSpace, history: list[Any], seed: int, settings: TuningSettings) -> Suggestion:
        tried = {space.normalize(h.config) for h in history}
        for c in configs:
            if space.normalize(c) not in tried:
                return Suggestion(c, "next of the test's list")
        return Suggestion(None, "the test's list is done", converged=True)

    return suggest


@functools.cache
def _tuned() -> tuple[d.DayRun, d.Day]:
    day, _ = _day()
    sc = _scenario().scenario
    run = d.drive_day(
        sc.engine, d.production_settings(sc), _caching(False), day,
        suggester=_grid_suggester([_caching(True)]),
    )  # fmt: skip
    return run, day


def test_the_policy_is_driven_through_the_whole_day() -> None:
    run, _ = _tuned()
    assert run.settled and run.settled[-1][1] == d.DAY_S
    assert run.trials[0].role == "baseline" and run.trials[0].started_at == 0.0


def test_a_config_change_takes_effect_when_its_rollout_is_ready_with_a_cold_cache() -> None:
    run, _ = _tuned()
    first = run.rollouts[0]
    change = run.timeline[1]
    assert change.start_s == first[0] + 60.0 and change.ready_s == change.start_s
    assert change.config == first[1]


def test_every_rollout_is_a_restart_and_each_trial_window_is_counted() -> None:
    run, day = _tuned()
    deployed = _caching(False)
    out, _ = d.summarize_method(day, run.timeline, len(run.rollouts), run, deployed)
    assert out["restarts"] == len(run.rollouts) == len(run.timeline) - 1
    assert out["trials"] == sum(1 for t in run.trials if t.role == "trial") >= 1
    assert 0 <= out["slo_violating_in_trial_windows"] <= out["slo_violating_requests"]


def test_a_change_to_a_config_with_more_capacity_pays_off() -> None:
    run, day = _tuned()
    changes = d.changes_that_did_not_pay(day, run, _caching(False))
    assert changes and changes[0]["to"]["prefix_caching"] is True
    assert changes[0]["paid_off"] and changes[0]["gain"] > 0


def test_the_diurnal_load_and_its_bursts_alone_do_not_reopen_the_search() -> None:
    run, _ = _tuned()  # the fake twin's mix is the same all day: only the load moves (20%-90%, 2x bursts)
    assert [e for _, e in run.epochs] == [0]
    assert not [m for _, reason, m in run.events if reason == "DriftDetected"]


def test_a_change_that_serves_the_same_goodput_faster_is_told_apart_from_one_without_gain() -> None:
    assert d.faster_at_equal_goodput(1000.0, 1000.0, 0.09, 0.10)
    assert not d.faster_at_equal_goodput(1000.0, 1000.0, 0.099, 0.10)  # 1% faster: within the margin
    assert not d.faster_at_equal_goodput(990.0, 1000.0, 0.05, 0.10)  # served less
    assert not d.faster_at_equal_goodput(1000.0, 1000.0, None, 0.10)


def test_the_checks_compare_the_tuned_run_with_the_baselines() -> None:
    base: dict[str, Any] = {"goodput_tokens": 100, "requests": 1000, "slo_violating_requests": 10}
    reconverge = {"search_began_h": 14.5, "hours": 2.5}
    tuned = {**base, "goodput_tokens": 98, "goodput_vs_oracle": 0.98, "slo_violating_requests": 25,
             "config_changes_not_paid_off": 0, "config_changes_without_gain": 0,
             "reconverge": reconverge}  # fmt: skip
    methods = {
        d.Method.TUNED: tuned,
        d.Method.NEVER_TUNED: {**base, "goodput_tokens": 90},
        d.Method.ONE_SHOT: {**base, "goodput_tokens": 99},
        d.Method.ORACLE_STATIC: base,
    }
    c = d.checks(methods)
    assert c["tuned_vs_oracle_ge_0.97"] and c["tuned_beats_never_tuned"] and not c["tuned_beats_one_shot"]
    assert c["extra_violating_share"] == 0.015 and not c["extra_violating_le_1pct"]
    assert not c["reconverged_within_2h"] and not c["deployed_is_best"]


def test_the_one_shot_tuner_picks_the_best_at_capacity_at_the_highest_fraction_that_boots() -> None:
    day, _ = _day()
    pick, tried = d.one_shot_pick(_scenario(), day)
    fractions = {c.memory_fraction for c in d.grid_of(_scenario())}
    assert pick.memory_fraction == max(fractions) and pick.prefix_caching
    assert all("config" in t for t in tried)


def test_the_sglang_agent_scenario_is_valid_for_its_engine() -> None:
    sc = d.day_scenarios()["sglang-agent"].scenario
    assert sc.engine == "sglang" and not get_adapter(sc.engine).validate(sc.start_config())


def test_a_search_that_ends_on_the_settled_config_is_not_a_change() -> None:
    day, _ = _day()
    off, on = _caching(False), _caching(True)
    run = d.DayRun(timeline=[d.Serving(0.0, off, -math.inf)])
    run.settled = [(3600.0, 7200.0, off), (9000.0, 20000.0, on), (21000.0, 30000.0, on)]
    changes = d.changes_that_did_not_pay(day, run, deployed=off)
    assert [(c["at_h"], c["until_h"]) for c in changes] == [(2.5, 24.0)]


def test_screening_a_change_ranks_the_grid_after_it_and_places_the_one_shot_pick() -> None:
    samples = FakeSamples()
    out = d.screen_change(_scenario(), samples, [0.9, 1.4])
    assert out["grid"][0]["goodput_vs_best"] == 1.0 and out["best"]["prefix_caching"] is True
    assert out["one_shot_pick"]["prefix_caching"] is True and out["one_shot_vs_best"] == 1.0
    assert out["grid"][-1]["config"]["prefix_caching"] is False and out["grid"][-1]["goodput_vs_best"] < 1.0
    after = {(rate, seed) for _, rate, phase, seed in samples.calls if phase == d.WorkloadPhase.AFTER}
    assert after == {(7.2, 0), (7.2, 1), (11.2, 0), (11.2, 1)}  # 0.9 and 1.4 of capacity after, both seeds


def test_a_screen_can_widen_the_grid_with_a_knob_the_scenario_does_not_search() -> None:
    extra = d.SpaceOverride.from_mapping({"max_batched_tokens": [2048, 8192]})
    widened = d.widened(_scenario(), extra)
    assert {c.get("max_batched_tokens") for c in d.grid_of(widened)} == {2048, 8192}
    assert widened.scenario.space.get("memory_fraction") == _scenario().scenario.space.get("memory_fraction")
    out = d.screen_change(widened, FakeSamples(), [0.9])
    assert {r["config"]["max_batched_tokens"] for r in out["grid"]} == {2048, 8192}


def test_a_screen_refuses_a_widening_value_no_config_of_the_grid_accepts() -> None:
    assert d.main(["--screen-change", "{}", "--screen-space", '{"max_batched_tokens": [7]}']) == 2
    assert d.main(["--screen-change", "{}", "--screen-space", '{"no_such_knob": [1]}']) == 2
