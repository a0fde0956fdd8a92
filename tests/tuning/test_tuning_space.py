from __future__ import annotations

import pytest

from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.settings import SpaceOverride
from prefixtune.tuning.space import Dimension, SearchSpace, SpaceError, build_space


def space_for(engine: str, override: SpaceOverride | None = None) -> SearchSpace:
    a = get_adapter(engine)
    return build_space(a.knobs(), a.default_config(), a.normalize, override)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_only_searched_knobs_with_choices_enter(engine: str) -> None:
    a = get_adapter(engine)
    sp = space_for(engine)
    for name, spec in a.knobs().items():
        multi = spec.continuous or len(spec.choices) > 1
        assert (name in sp.names) == (spec.searched and multi), name


def test_vllm_policy_is_not_searched_and_stays_at_default() -> None:
    sp = space_for("vllm")
    assert "schedule_policy" not in sp.names
    assert all(c.schedule_policy == "fcfs" for c in sp.grid(5))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_round_trip_is_plain_python(engine: str) -> None:
    sp = space_for(engine)
    for cfg in sp.grid(5):
        point = sp.to_point(cfg)
        back = sp.to_config(point)
        assert back == cfg
        d = back.to_dict()
        assert type(d["memory_fraction"]) is float and type(d["block_size"]) is int
        assert type(d["prefix_caching"]) is bool and type(d["schedule_policy"]) is str


def test_skopt_points_come_back_plain() -> None:
    from skopt.space import Space

    sp = space_for("sglang")
    for point in Space(sp.to_skopt()).rvs(n_samples=30, random_state=3):
        cfg = sp.to_config(point)
        assert type(cfg.memory_fraction) is float and type(cfg.block_size) is int
        assert type(cfg.prefix_caching) is bool and sp.contains(cfg)


def test_equivalent_configs_collapse() -> None:
    sp = space_for("sglang")
    grid = sp.grid(3)
    assert len(grid) == len(set(grid))
    # caching off: lpm, dfs-weight and hrrn run as fcfs, so they never appear
    off = {c.schedule_policy for c in grid if not c.prefix_caching}
    assert not off & {"lpm", "dfs-weight", "hrrn"} and "fcfs" in off
    pages = len(get_adapter("sglang").knobs()["block_size"].choices)
    policies = len(get_adapter("sglang").knobs()["schedule_policy"].choices)
    on_combos = pages * policies
    off_combos = pages * (policies - 3)
    assert len(sp.categorical_combos()) == on_combos + off_combos
    assert len(grid) == 3 * (on_combos + off_combos)
    # a point with a cache-aware policy and caching off maps to the fcfs config
    cfg = sp.to_config([*sp.to_point(KnobConfig(0.8, 16, False, "fcfs"))[:3], "lpm"])
    assert cfg.schedule_policy == "fcfs"


def test_override_narrows_and_fixes() -> None:
    sp = space_for(
        "sglang",
        SpaceOverride(memory_fraction=(0.7, 0.9), block_size=(16,), schedule_policy=("fcfs", "lpm")),
    )
    assert sp.names == ("memory_fraction", "prefix_caching", "schedule_policy")
    assert sp.base.block_size == 16
    assert sp.fraction_grid(3) == (0.7, 0.8, 0.9)
    fixed = space_for("vllm", SpaceOverride(memory_fraction=(0.85, 0.85)))
    assert "memory_fraction" not in fixed.names and fixed.base.memory_fraction == 0.85


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        (SpaceOverride(block_size=(17,)), "space.block_size: 17"),
        (SpaceOverride(schedule_policy=("priority",)), "space.schedule_policy"),
        (SpaceOverride(memory_fraction=(0.9, 0.8)), "must not exceed"),
        (SpaceOverride(memory_fraction=(0.5, 1.5)), "space.memory_fraction.max"),
    ],
)
def test_bad_override_names_field_and_allowed_values(override: SpaceOverride, needle: str) -> None:
    with pytest.raises(SpaceError) as err:
        space_for("sglang", override)
    assert needle in str(err.value)


def test_a_knob_kept_fixed_by_default_is_searched_when_the_override_lists_it() -> None:
    # spec.tuning.space's promise (api.rules.search_space): a listed knob is searched over exactly
    # its listed values, also one the adapter keeps fixed by default.
    sp = space_for("vllm", SpaceOverride(schedule_policy=("fcfs", "priority"), max_running=(64, 256)))
    assert sp.dimension("schedule_policy") == Dimension("schedule_policy", choices=("fcfs", "priority"))
    assert sp.dimension("max_running") == Dimension("max_running", choices=(64, 256))


def test_the_batch_limits_enter_the_space_only_when_widened() -> None:
    adapter = get_adapter("sglang")
    base = adapter.default_config()
    assert "max_batched_tokens" not in build_space(adapter.knobs(), base, adapter.normalize).names
    ladder = adapter.knobs()["max_batched_tokens"].choices
    sp = build_space(adapter.knobs(), base, adapter.normalize, widen={"max_batched_tokens": ladder})
    assert sp.dimension("max_batched_tokens") == Dimension("max_batched_tokens", choices=ladder)
    assert "max_running" not in sp.names


def test_fraction_grid_default_bounds() -> None:
    sp = space_for("vllm")
    grid = sp.fraction_grid(5)
    assert grid[0] == 0.6 and grid[-1] == 0.98 and len(grid) == 5
