from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning import optimizer
from prefixtune.tuning.optimizer import Feasibility, TrialResult, seed_from, suggest
from prefixtune.tuning.space import SearchSpace, build_space, categorical_key


def space_for(engine: str) -> SearchSpace:
    a = get_adapter(engine)
    return build_space(a.knobs(), a.default_config(), a.normalize)


def value_of(c: KnobConfig) -> float:
    v = 1000.0 * (1.0 - 4.0 * (c.memory_fraction - 0.85) ** 2)
    return v * (1.3 if c.prefix_caching else 1.0) / (1.0 + c.block_size / 512.0)


def test_seed_is_stable_and_changes_with_generation() -> None:
    assert seed_from("ns/a", 1) == seed_from("ns/a", 1)
    assert seed_from("ns/a", 1) != seed_from("ns/a", 2)
    assert 0 <= seed_from("x") < 2**31


def test_identical_history_identical_suggestion() -> None:
    sp = space_for("sglang")
    hist = [TrialResult(c, value_of(c)) for c in sp.grid(3)[:7]]
    a = suggest(sp, hist, seed=11)
    b = suggest(sp, list(hist), seed=11)
    assert a == b and a.config is not None
    json.dumps(a.config.to_dict())  # plain Python values


def test_initial_design_is_space_filling_and_deterministic() -> None:
    sp = space_for("vllm")
    base = sp.base
    hist = [TrialResult(base, value_of(base))]
    seen = []
    for _ in range(3):
        s = suggest(sp, hist, seed=5, n_initial=5)
        assert s.config is not None and "initial design" in s.reason
        assert s.config not in seen and s.config != base
        seen.append(s.config)
        hist.append(TrialResult(s.config, value_of(s.config)))


def test_initial_design_probes_the_top_of_the_memory_range_first() -> None:
    sp = space_for("sglang")
    fdim = sp.dimension("memory_fraction")
    assert fdim is not None and fdim.low is not None and fdim.high is not None
    base = sp.normalize(sp.base.with_(prefix_caching=False))  # deployed with the cache off
    hist = [TrialResult(base, value_of(base))]
    top = suggest(sp, hist, seed=5, n_initial=5)
    base = sp.normalize(base.with_(prefix_caching=True))  # the probe turns it on
    assert top.config == sp.normalize(base.with_(memory_fraction=fdim.high)), top.reason
    # it does not start there: one level lower, same knobs
    hist.append(TrialResult(top.config, None, "oom_startup"))
    lower = suggest(sp, hist, seed=5, n_initial=5)
    assert lower.config is not None and categorical_key(lower.config) == categorical_key(base)
    assert lower.config.memory_fraction == fdim.high - (fdim.high - fdim.low) / 8
    # that one works: the space-filling design takes over (no third level, nothing repeated)
    hist.append(TrialResult(lower.config, value_of(lower.config)))
    nxt = suggest(sp, hist, seed=5, n_initial=5)
    assert nxt.config is not None and "near the top" not in nxt.reason
    assert nxt.config not in (h.config for h in hist)


def _widened(engine: str, base: KnobConfig, widen: dict[str, tuple[int, ...]]) -> SearchSpace:
    a = get_adapter(engine)
    return build_space(a.knobs(), base, a.normalize, widen=widen)


def test_the_top_probe_takes_a_widened_limit_to_the_far_end_of_its_values() -> None:
    deployed = get_adapter("vllm").default_config().with_(max_running=64, max_batched_tokens=2048)
    sp = _widened("vllm", deployed, {"max_running": (64, 128, 256)})
    assert sp.widened == ("max_running",)
    top = suggest(sp, [TrialResult(sp.base, value_of(sp.base))], seed=5, n_initial=5)
    assert top.config is not None and top.config.max_running == 256, top.reason
    assert "max_running 256" in top.reason


def test_the_top_probe_takes_a_smaller_budget_when_the_widening_went_down() -> None:
    deployed = get_adapter("vllm").default_config().with_(max_running=1024, max_batched_tokens=8192)
    sp = _widened("vllm", deployed, {"max_batched_tokens": (2048, 4096, 8192)})
    top = suggest(sp, [TrialResult(sp.base, value_of(sp.base))], seed=5, n_initial=5)
    assert top.config is not None and top.config.max_batched_tokens == 2048, top.reason


def test_the_top_probe_keeps_a_limit_widened_on_both_sides() -> None:
    deployed = get_adapter("vllm").default_config().with_(max_running=256, max_batched_tokens=2048)
    sp = _widened("vllm", deployed, {"max_batched_tokens": (1024, 2048, 4096)})
    top = suggest(sp, [TrialResult(sp.base, value_of(sp.base))], seed=5, n_initial=5)
    assert top.config is not None and top.config.max_batched_tokens == 2048, top.reason


def test_repeated_point_is_replaced_by_an_unseen_candidate() -> None:
    sp = space_for("vllm")
    hist = [TrialResult(c, value_of(c)) for c in sp.grid(2)]
    s = suggest(sp, hist, seed=1, n_initial=2)
    assert s.config is not None
    assert all(
        categorical_key(s.config) != categorical_key(h.config)
        or abs(s.config.memory_fraction - h.config.memory_fraction) >= 0.005
        for h in hist
    )


def test_fifty_trial_decision() -> None:
    sp = space_for("sglang")
    hist: list[TrialResult] = []
    for i, c in enumerate(sp.grid(9)[::7][:50]):
        hist.append(
            TrialResult(c, None if c.memory_fraction > 0.95 else value_of(c) * (1 + 0.01 * (i % 3)), "oom")
        )
    assert len(hist) == 50
    s = suggest(sp, hist, seed=3)
    assert s.config is not None or s.converged


def test_monotone_oom_rule_and_classifier() -> None:
    sp = space_for("vllm")
    c = KnobConfig(0.9, 16, True, "fcfs")
    feas = Feasibility(
        sp,
        [
            TrialResult(c, None, "oom_runtime"),
            TrialResult(c.with_(memory_fraction=0.7), 500.0),
            TrialResult(c.with_(memory_fraction=0.6), 400.0),
        ],
    )
    assert feas.known_infeasible(c.with_(memory_fraction=0.95))
    assert not feas.known_infeasible(c.with_(memory_fraction=0.85))
    p_low, p_other_high = feas.p_feasible(
        [c.with_(memory_fraction=0.65), c.with_(memory_fraction=0.95, block_size=32)]
    )
    assert p_low == 1.0  # between feasible trials at 0.6 and 0.7 with the same knobs
    assert p_other_high < 0.5  # an OOM at 0.9 with other knobs keeps 0.95 out


@st.composite
def histories(draw: st.DrawFn) -> list[TrialResult]:
    sp = space_for("vllm")
    grid = sp.grid(9)
    picks = draw(st.lists(st.integers(0, len(grid) - 1), min_size=1, max_size=12, unique=True))
    out = []
    for i in picks:
        c = grid[i]
        kind = draw(st.sampled_from(["ok", "oom", "crash"]))
        out.append(TrialResult(c, value_of(c) if kind == "ok" else None, "" if kind == "ok" else kind))
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hist=histories(), seed=st.integers(0, 2**16))
def test_never_suggests_a_known_infeasible_config(hist: list[TrialResult], seed: int) -> None:
    sp = space_for("vllm")
    s = suggest(sp, hist, seed=seed, n_initial=3)
    if s.config is None:
        return
    cfg = sp.normalize(s.config)
    for t in hist:
        if t.value is not None:
            continue
        same = categorical_key(t.config) == categorical_key(cfg)
        assert not (same and abs(t.config.memory_fraction - cfg.memory_fraction) < 0.005), "exact repeat"
        if t.failure == "oom":
            assert not (same and cfg.memory_fraction >= t.config.memory_fraction), "above a known OOM"


def test_search_avoids_the_infeasible_region() -> None:
    sp = space_for("vllm")
    oom_at = 0.9
    hist = [TrialResult(sp.base, None, "oom_runtime")]  # the default (0.92) already OOMs
    for _ in range(12):
        s = suggest(sp, hist, seed=7, n_initial=4)
        if s.config is None or s.converged:
            break
        c = s.config
        hist.append(
            TrialResult(c, None, "oom_runtime")
            if c.memory_fraction >= oom_at
            else TrialResult(c, value_of(c))
        )
    infeasible = sum(1 for t in hist[1:] if t.value is None)
    assert infeasible <= 2, [(t.config.memory_fraction, t.value) for t in hist]


def test_converges_when_nothing_is_left() -> None:
    a = get_adapter("vllm")
    from prefixtune.tuning.settings import SpaceOverride

    sp = build_space(
        a.knobs(),
        a.default_config(),
        a.normalize,
        SpaceOverride(memory_fraction=(0.9, 0.9), block_size=(16,)),
    )
    assert sp.names == ("prefix_caching",)
    hist = [TrialResult(c, value_of(c)) for c in sp.grid()]
    s = suggest(sp, hist, seed=1, n_initial=1)
    assert s.converged and s.config is None


def test_converges_on_low_expected_improvement() -> None:
    a = get_adapter("vllm")
    from prefixtune.tuning.settings import SpaceOverride

    sp = build_space(
        a.knobs(), a.default_config(), a.normalize, SpaceOverride(block_size=(16,), prefix_caching=(True,))
    )
    assert sp.names == ("memory_fraction",)
    hist = [TrialResult(sp.base, value_of(sp.base))]
    converged = False
    for _ in range(14):
        s = suggest(sp, hist, seed=2, n_initial=3, convergence_ei=0.01)
        if s.converged:
            converged = True
            break
        assert s.config is not None
        hist.append(TrialResult(s.config, value_of(s.config)))
    assert converged
    best = max(t.value for t in hist if t.value is not None)
    optimum = value_of(sp.base.with_(memory_fraction=0.85))
    assert best >= 0.97 * optimum  # converging at EI < 1% of best leaves little on the table


def test_grid_method_probes_down_then_sweeps() -> None:
    sp = space_for("vllm")
    hist: list[TrialResult] = []
    configs = []
    for _ in range(6):
        s = suggest(sp, hist, seed=0, method="grid")
        assert s.config is not None
        configs.append(s.config)
        ok = s.config.memory_fraction < 0.9
        hist.append(TrialResult(s.config, value_of(s.config) if ok else None, "" if ok else "oom"))
    fractions = [c.memory_fraction for c in configs]
    assert fractions[0] == 0.98 and fractions[1] < fractions[0]
    first_ok = next(f for f in fractions if f < 0.9)
    assert all(f == first_ok for f in fractions[fractions.index(first_ok) :])


def test_random_method_is_deterministic_and_unseen() -> None:
    sp = space_for("trtllm")
    hist = [TrialResult(sp.base, 1.0)]
    a = suggest(sp, hist, seed=4, method="random")
    assert a == suggest(sp, hist, seed=4, method="random")
    assert a.config is not None and a.config != sp.base


def test_startup_failure_low_in_the_range_rules_out_smaller_fractions() -> None:
    sp = space_for("vllm")
    c = KnobConfig(0.65, 128, False, "fcfs")
    feas = Feasibility(sp, [TrialResult(c, None, "oom_startup")])
    assert feas.known_infeasible(c.with_(memory_fraction=0.6))
    assert not feas.known_infeasible(c.with_(memory_fraction=0.9))
    s = suggest(sp, [TrialResult(c, None, "oom_startup")], seed=1)
    assert s.config is not None and s.config.memory_fraction > 0.65


def test_startup_failure_direction_follows_the_evidence() -> None:
    sp = space_for("vllm")
    c = KnobConfig(0.79, 16, True, "fcfs")  # mid-range: no position hint
    ok = TrialResult(c.with_(memory_fraction=0.9), 900.0)
    feas = Feasibility(sp, [TrialResult(c, None, "oom_startup"), ok])
    assert feas.known_infeasible(c.with_(memory_fraction=0.7))  # feasible above -> too small
    assert not feas.known_infeasible(c.with_(memory_fraction=0.85))
    alone = Feasibility(sp, [TrialResult(c, None, "oom_startup")])
    assert alone.known_infeasible(c) and not alone.known_infeasible(c.with_(memory_fraction=0.7))
    assert not alone.known_infeasible(c.with_(memory_fraction=0.9))


def _skopt_asks(sp: SearchSpace, hist: list[TrialResult], seed: int, n_initial: int) -> KnobConfig:
    """What skopt's own ``Optimizer(base_estimator="GP")`` asks after being told ``hist``."""
    from skopt import Optimizer
    from skopt.sampler import Lhs

    opt = Optimizer(
        sp.to_skopt(),
        base_estimator="GP",
        acq_func="EI",
        acq_optimizer="sampling",
        acq_optimizer_kwargs={"n_points": optimizer.SKOPT_SAMPLE_POINTS},
        n_initial_points=n_initial,
        initial_point_generator=Lhs(criterion="maximin", iterations=optimizer.LHS_ITERATIONS),
        random_state=seed,
    )
    if hist:
        opt.tell([sp.to_point(t.config) for t in hist], [-float(t.value or 0.0) for t in hist])
    return sp.to_config(opt.ask())


def test_the_initial_design_without_a_fit_is_what_skopt_would_ask() -> None:
    sp = space_for("vllm")
    hist: list[TrialResult] = []
    for i in range(5):
        assert optimizer._initial_design(sp, 17, 5)[i] == _skopt_asks(sp, hist, 17, 5)
        c = optimizer._initial_design(sp, 17, 5)[i]
        hist.append(TrialResult(c, value_of(c)))


def test_the_surrogate_is_skopts_default_gp_drawn_from_the_same_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimizer, "GP_RESTARTS", 2)  # skopt's own default: the same draws, the same fit
    sp = space_for("vllm")
    hist = [TrialResult(c, value_of(c)) for c in optimizer._initial_design(sp, 23, 5)]
    hist.append(TrialResult(sp.base, value_of(sp.base)))
    opt, _ = optimizer._fit(sp, hist, 23, 5)
    assert sp.to_config(opt.ask()) == _skopt_asks_scaled(sp, hist, 23, 5)


def _skopt_asks_scaled(sp: SearchSpace, hist: list[TrialResult], seed: int, n_initial: int) -> KnobConfig:
    scale = max(abs(float(t.value or 0.0)) for t in hist)
    scaled = [TrialResult(t.config, float(t.value or 0.0) / scale) for t in hist]
    return _skopt_asks(sp, scaled, seed, n_initial)
