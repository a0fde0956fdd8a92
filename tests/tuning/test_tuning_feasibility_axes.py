"""The feasibility model along two OOM-monotone axes (the memory fraction and a token budget).

The registry's token budget knob may not exist yet, so these tests pass the axes as data: the vLLM
space's block size (16..128, powers of two, like a token budget) stands in for the second axis.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import MEMORY_KNOB, OOM_AXES, knob
from prefixtune.tuning.optimizer import Feasibility, TrialResult
from prefixtune.tuning.settings import SpaceOverride
from prefixtune.tuning.space import SearchSpace, build_space

BUDGET = replace(knob("block_size"), oom_monotone=True, log_scale=True)  # the stand-in second axis
AXES = (MEMORY_KNOB, BUDGET)
C = KnobConfig(0.85, 64, True, "fcfs")


def vllm_space() -> SearchSpace:
    a = get_adapter("vllm")
    return build_space(a.knobs(), a.default_config(), a.normalize)


def at(f: float, b: int) -> KnobConfig:
    return C.with_(memory_fraction=f, block_size=b)


def test_the_registry_has_the_memory_fraction_as_an_oom_axis() -> None:
    assert MEMORY_KNOB in OOM_AXES and MEMORY_KNOB.continuous and not MEMORY_KNOB.log_scale


def test_an_oom_rules_out_every_config_at_or_above_it_on_both_axes() -> None:
    feas = Feasibility(vllm_space(), [TrialResult(at(0.85, 64), None, "oom_runtime")], AXES)
    assert feas.known_infeasible(at(0.9, 64))
    assert feas.known_infeasible(at(0.85, 128))
    assert feas.known_infeasible(at(0.95, 128))
    assert not feas.known_infeasible(at(0.95, 32))  # a smaller budget may leave room for more cache
    assert not feas.known_infeasible(at(0.8, 128))  # a smaller pool may leave room for the budget


def test_with_the_memory_axis_alone_other_block_sizes_are_other_keys() -> None:
    feas = Feasibility(vllm_space(), [TrialResult(at(0.85, 64), None, "oom_runtime")])
    assert feas.known_infeasible(at(0.9, 64))
    assert not feas.known_infeasible(at(0.9, 128))  # one axis: other block sizes are other keys


def test_feasible_configs_prove_the_region_between_them_feasible() -> None:
    ok_high = TrialResult(at(0.9, 64), 900.0)  # nothing below it on both axes is too large
    ok_low = TrialResult(at(0.7, 128), 700.0)  # nothing with a larger pool than it is too small
    feas = Feasibility(vllm_space(), [ok_high, ok_low, TrialResult(at(0.95, 128), None, "oom_runtime")], AXES)
    inside, outside = feas.p_feasible([at(0.8, 32), at(0.95, 64)])
    assert inside == 1.0
    assert outside < 1.0


def test_a_pool_too_small_rules_out_smaller_fractions_with_larger_budgets() -> None:
    low = at(0.62, 64)  # bottom quarter of the range, no evidence: too small
    feas = Feasibility(vllm_space(), [TrialResult(low, None, "oom_startup")], AXES)
    assert feas.known_infeasible(at(0.6, 64))
    assert feas.known_infeasible(at(0.6, 128))  # a larger budget takes more memory from the pool
    assert not feas.known_infeasible(at(0.6, 32))  # a smaller budget leaves the pool more room
    assert not feas.known_infeasible(at(0.7, 64))


def test_a_startup_oom_below_a_feasible_config_on_both_axes_means_too_small() -> None:
    failed = at(0.79, 64)  # mid-range: no position hint
    ok = TrialResult(at(0.9, 128), 900.0)  # more memory and more budget ran
    feas = Feasibility(vllm_space(), [TrialResult(failed, None, "oom_startup"), ok], AXES)
    assert feas.known_infeasible(at(0.7, 64))
    assert not feas.known_infeasible(at(0.85, 64))


def test_a_startup_oom_above_a_smaller_pool_that_ran_means_too_large() -> None:
    failed = at(0.79, 64)
    ok = TrialResult(at(0.75, 128), 900.0)  # a smaller pool (less memory, more budget) ran
    feas = Feasibility(vllm_space(), [TrialResult(failed, None, "oom_startup"), ok], AXES)
    assert feas.known_infeasible(at(0.85, 128))
    assert not feas.known_infeasible(at(0.7, 64))


def test_an_oom_with_other_knobs_caps_the_configs_above_it_on_both_axes() -> None:
    feas = Feasibility(vllm_space(), [TrialResult(at(0.85, 64), None, "oom_runtime")], AXES)
    other = C.with_(prefix_caching=False)
    above, beside = feas.p_feasible(
        [other.with_(memory_fraction=0.9, block_size=128), other.with_(memory_fraction=0.9, block_size=32)]
    )
    assert above < 0.5
    assert beside == 1.0  # no classifier without a feasible trial, and not above the OOM


def test_the_classifier_sees_the_budget_axis_on_a_log_scale() -> None:
    sp = vllm_space()
    feas = Feasibility(sp, [], AXES)
    i = sp.names.index("block_size")  # memory is feature 0, then the budget: one feature, not one-hot
    values = [feas._features(at(0.8, b))[i] for b in (16, 32, 64, 128)]
    steps = [b - a for a, b in itertools.pairwise(values)]
    assert all(math.isclose(s, steps[0]) for s in steps) and math.isclose(values[-1] - values[0], 4.0)


def test_axes_without_the_memory_fraction_are_refused() -> None:
    with pytest.raises(ValueError, match="must include memory_fraction"):
        Feasibility(vllm_space(), [], (BUDGET,))


def test_an_engine_default_budget_is_ordered_only_against_itself() -> None:
    default = 0  # a log-scale value <= 0: the engine resolves its own default, size unknown here
    feas = Feasibility(vllm_space(), [TrialResult(at(0.85, default), None, "oom_runtime")], AXES)
    assert feas.known_infeasible(at(0.9, default))  # same unknown budget: memory alone orders them
    assert not feas.known_infeasible(at(0.9, 16))
    other = Feasibility(vllm_space(), [TrialResult(at(0.85, 16), None, "oom_runtime")], AXES)
    assert not other.known_infeasible(at(0.9, default))


def test_sglang_chunk_sentinels_are_features_of_their_own_not_sizes() -> None:
    # spec.tuning.space.maxBatchedTokens may list SGLang's -1 (no chunking) and 0 (its default):
    # neither is a size on the log scale, and a list of only those has no scale at all
    a = get_adapter("sglang")
    base = a.default_config()
    budget = knob("max_batched_tokens")
    for listed, sizes in (((-1, 0), ()), ((-1, 1024, 4096), (1024, 4096))):
        override = SpaceOverride.from_mapping({"max_batched_tokens": list(listed)})
        sp = build_space(a.knobs(), base, a.normalize, override)
        feas = Feasibility(sp, [], (MEMORY_KNOB, budget))
        rows = {v: feas._features(base.with_(max_batched_tokens=v)) for v in listed}
        assert len({tuple(r) for r in rows.values()}) == len(listed)  # every listed value told apart
        assert all(len(r) == len(rows[listed[0]]) for r in rows.values())
        if sizes:  # the sizes on the log scale: one feature moves by its full span
            moved = [b - a for a, b in zip(rows[sizes[0]], rows[sizes[-1]], strict=True)]
            assert max(moved) == pytest.approx(4.0) and sorted(moved)[-2] == 0.0
