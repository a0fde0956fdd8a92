"""The light-load suite and its controls in ``prefixtune bench tuner``, on a fake environment."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from bench import tuner
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.drive import TrialRun
from prefixtune.tuning.settings import TuningSettings

FULL_RATE = 5.0
CAPACITY = {True: 10.0, False: 2.0}  # req/s each config sustains: prefix caching on carries 5x more


class FakeEnv:
    """Goodput is 100 tokens per request served, up to the config's capacity: below it every config
    scores the same, except that caching off is a token better (a window's luck the policy can see).
    Every run is recorded as (rate, measure_s, config)."""

    runs: ClassVar[list[tuple[float, float, KnobConfig]]] = []
    infeasible: ClassVar[set[bool]] = set()  # prefix_caching values that fail at runtime

    def __init__(self, scenario: tuner.Scenario, capacity: object = None) -> None:
        self.scenario = scenario
        self.sim_seconds = 0.0

    def run(self, config: KnobConfig, warmup_s: float, measure_s: float, seed: int) -> TrialRun:
        rate = self.scenario.rate
        FakeEnv.runs.append((rate, measure_s, config))
        if config.prefix_caching in FakeEnv.infeasible:
            return TrialRun("oom_runtime")
        value = 100.0 * min(rate, CAPACITY[bool(config.prefix_caching)]) + (
            0.0 if config.prefix_caching else 1.0
        )
        signals = Signals(
            window_s=measure_s, requests=500, ttft_p99_s=0.1, itl_p99_s=0.01, goodput_tokens_per_s=value
        )
        return TrialRun("ok", signals, offered_rps=rate)


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> type[FakeEnv]:
    FakeEnv.runs = []
    FakeEnv.infeasible = set()
    monkeypatch.setattr(tuner, "TwinEnv", FakeEnv)
    return FakeEnv


def _scenario(**extra: Any) -> tuner.Scenario:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"workload": "qa", "rate": FULL_RATE, "config": {"prefix_caching": False}})
    data.update(
        {"space": {"memory_fraction": [0.9, 0.9], "block_size": [16], "prefix_caching": [True, False]}}
    )
    data.update({"warmup_s": 10, "measure_s": 100, "eval_s": 400, "oracle_fractions": 1})
    data.update(extra)
    return tuner.parse_scenario(data, "x.yaml")


def test_at_load_scales_the_rate_and_nothing_else() -> None:
    scenario = _scenario()
    light = scenario.at_load(0.3)
    assert light.rate == pytest.approx(0.3 * FULL_RATE)
    assert replace(light, rate=FULL_RATE) == scenario
    assert scenario.at_load(1.0) is scenario  # full load shares the named suite's true-score cache


def _truth(scenario: tuner.Scenario, tmp_path: Path) -> tuple[tuner.TrueScores, KnobConfig, float]:
    """The fake's true scores and its oracle (config, score)."""
    truth = tuner.TrueScores(scenario, FakeEnv(scenario), tmp_path)
    cfg, oracle = truth.oracle(scenario.oracle_space())
    return truth, cfg, oracle


@pytest.mark.parametrize("fraction", [0.0, -0.3, 1.5])
def test_a_load_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(tuner.ScenarioError, match="must be in \\(0, 1\\]"):
        _scenario().at_load(fraction)


def test_the_policy_tunes_at_the_light_load_and_its_config_is_scored_at_full_load(
    fake_env: type[FakeEnv], tmp_path: Path
) -> None:
    scenario = _scenario()
    truth, oracle_cfg, oracle = _truth(scenario, tmp_path)
    assert oracle_cfg.prefix_caching and oracle == pytest.approx(500.0)
    fake_env.runs.clear()
    out = tuner.run_method(scenario, "bo", seed=0, budget=2, truth=truth, oracle=oracle, load_fraction=0.3)
    trials = [(rate, cfg) for rate, measure_s, cfg in fake_env.runs if measure_s == scenario.measure_s]
    assert trials and [rate for rate, _ in trials] == pytest.approx([0.3 * FULL_RATE] * len(trials))
    # at 1.5 req/s caching off looks a token better, so the policy keeps it; at full load it carries 2 req/s
    assert out["final_config"]["prefix_caching"] is False
    assert out["final_true_score"] == pytest.approx(201.0)
    assert out["ratio"] == pytest.approx(201.0 / 500.0, abs=1e-4)
    assert out["ends_on_deployed"] is True


def test_spread_is_best_over_worst_of_the_grid_at_the_scenarios_load(
    fake_env: type[FakeEnv], tmp_path: Path
) -> None:
    scenario = _scenario()
    space = scenario.oracle_space()
    full = tuner.TrueScores(scenario, FakeEnv(scenario), tmp_path).spread(space)
    assert full["configs"] == 2 and full["infeasible"] == 0
    assert full["spread"] == pytest.approx(500.0 / 201.0, abs=1e-4)
    light = scenario.at_load(0.2)
    assert tuner.TrueScores(light, FakeEnv(light), tmp_path).spread(space)["spread"] == pytest.approx(
        101 / 100
    )


def test_a_grid_with_an_infeasible_config_has_no_spread(fake_env: type[FakeEnv], tmp_path: Path) -> None:
    fake_env.infeasible = {True}
    scenario = _scenario()
    spread = tuner.TrueScores(scenario, FakeEnv(scenario), tmp_path).spread(scenario.oracle_space())
    assert spread["infeasible"] == 1 and spread["spread"] is None


def test_a_control_reports_its_spread_at_both_loads_and_how_often_it_kept_the_deployed_config(
    fake_env: type[FakeEnv], tmp_path: Path
) -> None:
    control = replace(_scenario(), control=True)
    out = tuner.run_scenario(control, ["bo"], 2, 2, tmp_path, io.StringIO(), load_fraction=0.2)
    assert out["control"] is True and out["tuned_rate"] == pytest.approx(1.0)
    assert out["spread"]["tuned_load"]["rate"] == pytest.approx(1.0)
    assert out["spread"]["tuned_load"]["spread"] == pytest.approx(1.01)
    assert out["spread"]["full_load"]["rate"] == FULL_RATE
    assert out["methods"]["bo"]["ends_on_deployed_fraction"] == 1.0
    assert [p["ends_on_deployed"] for p in out["methods"]["bo"]["per_seed"]] == [True, True]


def test_a_scenario_that_is_not_a_control_reports_no_spread(fake_env: type[FakeEnv], tmp_path: Path) -> None:
    out = tuner.run_scenario(_scenario(), ["bo"], 1, 2, tmp_path, io.StringIO(), load_fraction=0.5)
    assert out["control"] is False and "spread" not in out


def _result(
    name: str, ratio: float, control: bool = False, spread: float | None = 1.0, kept: float = 1.0
) -> Any:
    out: dict[str, Any] = {
        "control": control,
        "methods": {
            "bo": {"median_ratio": ratio, "median_trials_to_95": 2, "ends_on_deployed_fraction": kept}
        },
    }
    if control:
        out["spread"] = {"tuned_load": {"spread": spread}, "full_load": {"spread": spread}}
    return name, out


def test_checks_judge_controls_apart_from_the_named_scenarios() -> None:
    scen = dict(
        [
            _result("named", 0.96),
            _result("named-low", 0.90),
            _result("kept", 1.0, control=True, spread=1.004, kept=0.95),
            _result("moved", 1.0, control=True, spread=1.0, kept=0.9),
            _result("not-flat", 1.0, control=True, spread=1.02, kept=1.0),
            _result("infeasible", 1.0, control=True, spread=None, kept=1.0),
        ]
    )
    c = tuner.checks({"scenarios": scen})
    assert c["bo_ratio_ge_0.95"] == {"named": True, "named-low": False}
    assert {n: v["ok"] for n, v in c["controls"].items()} == {
        "kept": True,
        "moved": False,
        "not-flat": False,
        "infeasible": False,
    }
    assert c["controls"]["not-flat"]["flat"] is False and c["controls"]["moved"]["flat"] is True
    assert c["controls_all_ok"] is False


def test_the_controls_are_apart_from_the_named_suite_and_flat_by_design() -> None:
    named, controls = tuner.suite(), tuner.controls()
    assert len(controls) >= 3 and not set(named) & set(controls)
    assert {c.engine for c in controls.values()} == {"vllm", "sglang", "trtllm"}
    assert all(c.control for c in controls.values()) and not any(s.control for s in named.values())
    for c in controls.values():
        grid = c.oracle_space().grid(c.oracle_fractions)
        assert c.start_config() in grid, f"{c.name}: the deployed config is one of the grid's"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--suite", "--load-fraction", "0"], "--load-fraction: 0; must be in (0, 1]"),
        (["--suite", "--load-fraction", "1.2"], "--load-fraction: 1.2; must be in (0, 1]"),
        (["--seeds", "2"], "choose scenarios"),
        (["--controls", "--control-seeds", "0"], "--control-seeds must be >= 1"),
    ],
)
def test_cli_refuses_bad_light_load_arguments(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tuner.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_production_windows_time_the_trials_as_the_operators_spec_defaults(
    fake_env: type[FakeEnv], tmp_path: Path
) -> None:
    scenario = _scenario()
    truth, _, oracle = _truth(scenario, tmp_path)
    fake_env.runs.clear()
    windows = tuner.TrialWindows.production()
    spec_defaults = TuningSettings()
    assert (windows.warmup_s, windows.measure_s) == (spec_defaults.warmup_s, spec_defaults.measure_s)
    settings = tuner.settings_for(scenario, "bo", 2, 0, tuner.Trials(windows))
    assert (settings.warmup_s, settings.measure_s) == (spec_defaults.warmup_s, spec_defaults.measure_s)
    tuner.run_method(scenario, "bo", 0, 2, truth, oracle, load_fraction=0.3, trials=tuner.Trials(windows))
    trials = {measure_s for rate, measure_s, _ in fake_env.runs if rate < FULL_RATE}
    assert trials == {spec_defaults.measure_s}


def test_the_true_score_keeps_the_scenarios_timings_under_production_windows(
    fake_env: type[FakeEnv], tmp_path: Path
) -> None:
    scenario = _scenario()
    windows = tuner.TrialWindows.production()
    out = tuner.run_scenario(scenario, ["bo"], 1, 2, tmp_path, io.StringIO(), 0.3, tuner.Trials(windows))
    assert (out["trial_warmup_s"], out["trial_measure_s"]) == (windows.warmup_s, windows.measure_s)
    assert {measure_s for rate, measure_s, _ in fake_env.runs if rate == FULL_RATE} == {scenario.eval_s}


def test_the_cli_records_the_trials_timings_in_its_setup(fake_env: type[FakeEnv], tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    data = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB", "workload": "qa"}
    data |= {"rate": FULL_RATE, "eval_s": 400, "oracle_fractions": 1}
    data["space"] = {"memory_fraction": [0.9, 0.9], "block_size": [16]}
    path.write_text(yaml.safe_dump(data))
    common = ["--scenario-file", str(path), "--seeds", "1", "--budget", "2", "--methods", "bo"]
    common += ["--cache-dir", str(tmp_path / "cache")]
    assert tuner.main([*common, "--output", str(tmp_path / "a.json")]) == 0
    assert tuner.main([*common, "--production-windows", "--output", str(tmp_path / "b.json")]) == 0
    scenario_timed = json.loads((tmp_path / "a.json").read_text())["setup"]["trial_windows"]
    production = json.loads((tmp_path / "b.json").read_text())["setup"]["trial_windows"]
    assert "warmup_s" not in scenario_timed and "scenario" in scenario_timed["source"]
    assert (production["warmup_s"], production["measure_s"]) == (180.0, 600.0)


def test_a_trace_keeps_every_trial_with_its_score_terms_and_the_gates_record(
    fake_env: type[FakeEnv], tmp_path: Path
) -> None:
    scenario = _scenario()
    truth, _, oracle = _truth(scenario, tmp_path)
    traced = tuner.run_method(scenario, "bo", 0, 3, truth, oracle, 0.3, tuner.Trials(trace=True))
    plain = tuner.run_method(scenario, "bo", 0, 3, truth, oracle, 0.3)
    assert "trials_trace" not in plain and "gate" not in plain
    rows = traced["trials_trace"]
    assert [r["role"] for r in rows] == ["baseline"] + ["trial"] * (traced["trials"] - 1)
    baseline = rows[0]
    assert baseline["config"] == scenario.start_config().to_dict() and baseline["requests"] == 500
    # the fake's windows: every config serves the 1.5 req/s offered, caching off a token better
    assert baseline["measured"] == pytest.approx(151.0) and baseline["slo_met"] is True
    assert baseline["headroom"] is not None and baseline["headroom_limit"] == "ttft"
    assert baseline["true_ratio"] == pytest.approx(201.0 / 500.0, abs=1e-4)
    assert all(isinstance(r["reason"], str) and r["reason"] for r in rows)
    assert "gate" in traced
