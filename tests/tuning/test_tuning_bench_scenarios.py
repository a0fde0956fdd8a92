"""The tuner benchmark's scenario suite parses and covers what it must (no twin runs here)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bench import tuner

ROOT = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    return tuner


def test_suite_covers_engines_workloads_and_bounds() -> None:
    suite = bench().suite()
    assert len(suite) >= 8
    assert {s.engine for s in suite.values()} == {"vllm", "sglang", "trtllm"}
    assert {s.workload_type for s in suite.values()} >= {"rag", "chatbot", "agent", "qa"}
    assert {s.bound for s in suite.values()} == {"prefill", "decode"}
    for s in suite.values():
        assert not s.search_space().empty
        assert s.description, f"{s.name}: say why the scenario is hard"


def test_inline_workload_type_is_its_name_up_to_the_first_dash() -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"rate": 1.0, "workload": {"name": "rag-corpus", "suffix": 100, "output": 50}})
    assert bench().parse_scenario(data, "x.yaml").workload_type == "rag"
    data["workload"] = "chatbot"
    assert bench().parse_scenario(data, "x.yaml").workload_type == "chatbot"


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"blocksize": 16}, "unknown field(s) blocksize"),
        ({"engine": "tgi"}, "known engines"),
        ({"space": {"block_size": [17]}}, "space.block_size: 17"),
        ({"objective": "latency"}, "allowed: goodput, throughput, ttft"),
        ({"workload": "chat"}, "workload: unknown workload 'chat'; presets: rag"),
        ({"workload": {"name": "w", "suffix": 10, "output": {"dist": "zipf"}}}, "output.dist"),
        ({"workload": 3}, "workload: a preset name or an inline workload mapping"),
    ],
)
def test_bad_scenario_names_the_field(patch: dict[str, object], needle: str) -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b"}
    data.update({"gpu": "H100-80GB", "workload": "qa", "rate": 1.0})
    data.update(patch)
    with pytest.raises(bench().ScenarioError) as err:
        bench().parse_scenario(data, "x.yaml")
    assert needle in str(err.value) and "x.yaml" in str(err.value)


def test_cli_rejects_unknown_scenario_and_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench().main(["--scenario", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert bench().main(["--suite", "--methods", "bo,annealing"]) == 2
    assert "annealing" in capsys.readouterr().err


def test_cli_rejects_zero_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench().main(["--suite", "--jobs", "0"]) == 2
    assert "--jobs >= 1" in capsys.readouterr().err


def _scenario(bo: tuple[float, int], random: tuple[float, int | None], default: float) -> dict[str, object]:
    def method(ratio: float, to95: int | None) -> dict[str, object]:
        return {"median_ratio": ratio, "median_trials_to_95": to95}

    return {"methods": {"bo": method(*bo), "random": method(*random), "default": method(default, None)}}


def test_checks_count_discriminating_scenarios_and_bo_against_random() -> None:
    result = {
        "scenarios": {
            "a": _scenario(bo=(0.97, 3), random=(0.9, 6), default=0.8),  # exactly at 0.97: passes
            "b": _scenario(bo=(0.93, 9), random=(0.96, 4), default=0.95),
            "c": _scenario(bo=(0.99, 5), random=(0.7, None), default=0.9),
        }
    }
    result["scenarios"]["b"]["deployed"] = {"ratio": 0.4}  # deployed far from the best: tuning matters
    result["scenarios"]["c"]["deployed"] = {"ratio": 0.99}
    c = bench().checks(result)
    assert c["default_ratio_le_0.90"] == {"a": True, "b": False, "c": True}
    assert c["default_ratio_le_0.90_count"] == 2
    assert c["deployed_ratio_le_0.90"] == {"b": True, "c": False}
    assert c["tuning_matters_count"] == 3
    assert c["bo_ratio_ge_0.95"] == {"a": True, "b": False, "c": True}
    assert c["bo_ratio_ge_0.95_all"] is False
    assert c["bo_ratio_ge_0.97"] == {"a": True, "b": False, "c": True}  # issue 20's target for the suite
    assert c["bo_trials_to_95_le_random"] == {"a": True, "b": False, "c": True}
    assert c["bo_not_worse_than_random_count"] == 2


class _SeededEnv:
    """A fake twin: the score depends on the seed; one seed can fail."""

    def __init__(self, fail_seed: int | None = None) -> None:
        self.calls: list[int] = []
        self.fail_seed = fail_seed

    def run(self, config: object, warmup_s: float, measure_s: float, seed: int) -> object:
        from prefixtune.metrics.signals import Signals
        from prefixtune.tuning.drive import TrialRun

        self.calls.append(seed)
        if seed == self.fail_seed:
            return TrialRun("oom_runtime")
        value = 100.0 * (1 + seed - bench().ORACLE_SEED)
        signals = Signals(
            window_s=measure_s, requests=500, ttft_p99_s=0.1, itl_p99_s=0.01, goodput_tokens_per_s=value
        )
        return TrialRun("ok", signals)


def _scenario_with(eval_seeds: int) -> Any:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"workload": "qa", "rate": 1.0, "eval_seeds": eval_seeds})
    return bench().parse_scenario(data, "x.yaml")


def test_true_score_averages_eval_seeds_and_caches_each_seed(tmp_path: Path) -> None:
    one, three = _scenario_with(1), _scenario_with(3)
    assert one.digest() == three.digest()  # the cache holds one value per seed: shared
    cfg = three.start_config()
    env = _SeededEnv()
    assert bench().TrueScores(one, env, tmp_path).get(cfg) == pytest.approx(100.0)
    assert bench().TrueScores(three, env, tmp_path).get(cfg) == pytest.approx(200.0)  # mean of 100, 200, 300
    seed = bench().ORACLE_SEED
    assert env.calls == [seed, seed + 1, seed + 2]  # the first seed came from the cache file
    failing = _SeededEnv(fail_seed=seed + 1)
    assert bench().TrueScores(three, failing, tmp_path / "other").get(cfg) is None


def test_eval_seeds_must_be_positive() -> None:
    with pytest.raises(bench().ScenarioError, match="eval_seeds: 0; must be >= 1"):
        _scenario_with(0)


def test_the_deployed_config_has_the_engines_batch_limits_for_the_scenarios_gpu() -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "A100-80GB"}
    data.update({"workload": "qa", "rate": 1.0, "config": {"max_running": 64}})
    scenario = bench().parse_scenario(data, "x.yaml")
    assert scenario.start_config().max_batched_tokens == 2048  # vLLM's default below 70 GiB
    assert scenario.start_config().max_running == 64  # the scenario's own value kept
    assert scenario.default_config().max_running == 256


def test_the_oracle_covers_every_batch_limit_the_widening_could_reach() -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "A100-80GB"}
    data.update({"workload": "qa", "rate": 1.0, "config": {"max_running": 64}})
    data.update({"space": {"memory_fraction": [0.9, 0.9]}, "oracle_widen": ["max_running"]})
    scenario = bench().parse_scenario(data, "x.yaml")
    assert scenario.search_space().dimension("max_running") is None  # not searched unless widened
    caps = {cfg.max_running for cfg in scenario.oracle_space().grid(scenario.oracle_fractions)}
    assert caps == {64, 128, 256}


def test_an_oracle_widen_knob_the_policy_cannot_widen_is_refused() -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"workload": "qa", "rate": 1.0, "oracle_widen": ["max_running"]})
    data["space"] = {"max_running": [256, 512]}  # the spec names it: the widening leaves it alone
    with pytest.raises(bench().ScenarioError, match="oracle_widen: 'max_running' is not a batch limit"):
        bench().parse_scenario(data, "x.yaml")


def test_a_config_the_engine_refuses_stops_the_bench_instead_of_teaching_an_oom() -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"workload": "qa", "rate": 1.0})
    scenario = bench().parse_scenario(data, "x.yaml")
    refused = scenario.start_config().with_(max_running=1024, max_batched_tokens=512)  # budget < cap
    with pytest.raises(RuntimeError, match="the policy proposed a config vllm refuses"):
        bench().TwinEnv(scenario).run(refused, 1.0, 1.0, seed=1)


def test_the_oracle_leaves_out_limits_the_engine_refuses_with_the_deployed_config() -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"workload": "qa", "rate": 1.0, "config": {"max_batched_tokens": 2048}})
    data["oracle_widen"] = ["max_batched_tokens"]  # 512 and 1024 below the default cap of 1024: 512 out
    scenario = bench().parse_scenario(data, "x.yaml")
    assert scenario.widening_reach()["max_batched_tokens"] == (1024, 2048, 4096, 8192)


def test_with_a_capacity_model_each_window_carries_the_twins_prediction_and_it_bounds_the_headroom() -> None:
    from prefixtune.tuning.objective import HeadroomLimit, headroom
    from prefixtune.twin.capacity import CapacityModel

    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b", "gpu": "H100-80GB"}
    data.update({"workload": "qa", "rate": 1.0})
    scenario = bench().parse_scenario(data, "x.yaml")
    quick = CapacityModel(seeds=(7,), warmup_s=20.0, window_s=60.0, refine=1)
    env = bench().TwinEnv(scenario, capacity=quick)
    first = env.run(scenario.start_config(), 20.0, 60.0, seed=1)
    second = env.run(scenario.start_config(), 20.0, 60.0, seed=2)
    assert first.signals is not None and second.signals is not None
    predicted = second.signals.capacity_multiple
    assert predicted is not None and 1.0 < predicted <= quick.top
    assert len(env.workload.counts) == 8  # both windows' scrape intervals: the workload's sample pools them
    room = headroom(second.signals, scenario.slo)
    assert (
        room is not None and room.limit == HeadroomLimit.MODEL and room.share == pytest.approx(1 / predicted)
    )
    plain = bench().TwinEnv(scenario).run(scenario.start_config(), 20.0, 60.0, seed=1)
    assert plain.signals is not None and plain.signals.capacity_multiple is None
