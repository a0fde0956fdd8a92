"""When the batch limits enter the search space (tuning/widening.py), and how the policy keeps it.

The rule is tested with knob specs written here (the engines' batch-limit specs are the adapters'),
the space and the policy with vLLM's ``schedule_policy``, a knob vLLM does not search by default.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobSpec
from prefixtune.engines.knobs import MAX_BATCHED_TOKENS, MAX_RUNNING
from prefixtune.metrics.diagnosis import BatchLimits
from prefixtune.metrics.signals import Signals
from prefixtune.tuning import widening
from prefixtune.tuning.actions import EmitEvent
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.policy import initial_state, space_of, step
from prefixtune.tuning.policy._core import Core
from prefixtune.tuning.policy.measurement import begin_baseline
from prefixtune.tuning.settings import Slo, SpaceOverride, TuningSettings
from prefixtune.tuning.space import SearchSpace, build_space
from prefixtune.tuning.state import PolicyState, RolloutReady, Tick, WindowMeasured
from prefixtune.tuning.widening import Widening, widen

KNOBS = {
    MAX_RUNNING: KnobSpec(MAX_RUNNING, 256, choices=(64, 128, 256, 512, 1024), searched=False),
    MAX_BATCHED_TOKENS: KnobSpec(
        MAX_BATCHED_TOKENS, 8192, choices=(512, 1024, 2048, 4096, 8192, 16384), searched=False
    ),
}
LIMITS = BatchLimits(max_running=256, max_batched_tokens=8192)
SLO = Slo(ttft_p99_s=2.0, itl_p99_s=0.15)
# Short chat at high concurrency, the batch at its cap of 256 with KV 40% used and 12 waiting.
CHAT = Signals(
    window_s=300.0, requests=3000.0, prefill_reduction=0.7, running_mean=250.0, running_max=256.0,
    waiting_mean=12.0, kv_usage_mean=0.4, ttft_p50_s=0.3, ttft_p99_s=0.9, itl_p50_s=0.03, itl_p99_s=0.05,
    output_tokens_per_s=2500.0, input_tokens_per_s=10000.0, requests_per_s=10.0,
)  # fmt: skip
# Long RAG prompts (9,000 tokens computed each), ITL p99 140 ms against a 150 ms SLO.
RAG = Signals(
    window_s=300.0, requests=600.0, prefill_reduction=0.25, running_mean=20.0, running_max=32.0,
    waiting_mean=0.0, kv_usage_mean=0.6, ttft_p50_s=0.9, ttft_p99_s=1.5, itl_p50_s=0.03, itl_p99_s=0.14,
    output_tokens_per_s=400.0, input_tokens_per_s=24000.0, requests_per_s=2.0,
)  # fmt: skip


def test_a_binding_running_cap_enters_with_the_next_two_larger_values() -> None:
    w = widen(CHAT, LIMITS, SLO, KNOBS)
    assert w.values == {MAX_RUNNING: (256, 512, 1024)}
    assert w.reasons == ("the running cap 256 binds with KV memory free and a queue",)


def test_nothing_enters_when_no_limit_binds() -> None:
    # no queue, the batch peaking at 100 of 256: the TTFT (0.9 s of 2 s) bounds the headroom
    calm = replace(CHAT, waiting_mean=0.0, running_mean=80.0, running_max=100.0)
    assert widen(calm, LIMITS, SLO, KNOBS).empty


def test_a_running_cap_that_bounds_the_headroom_enters_below_capacity() -> None:
    # the twin's vllm-chatbot-running-cap at 30% of its load: nothing queues, the batch peaks at 31
    # under a cap of 64, the largest share of a budget (TTFT 6%, ITL p50 9%, KV 3%)
    light = replace(
        CHAT, running_mean=11.5, running_max=31.0, waiting_mean=0.0, kv_usage_mean=0.031, ttft_p50_s=0.036,
        ttft_p99_s=0.125, itl_p50_s=0.0134, itl_p99_s=0.039,
    )  # fmt: skip
    w = widen(light, replace(LIMITS, max_running=64), SLO, KNOBS)
    assert w.values == {MAX_RUNNING: (64, 128, 256)}
    assert w.reasons == (
        "the running cap 64 bounds the headroom (a batch peak of 48% of it, the largest share of a budget):"
        " more load reaches it first",
    )


def test_a_running_cap_the_batch_peak_barely_uses_widens_nothing() -> None:
    # the cap is the largest share, at 3%: the headroom sits at its top bound whatever the cap
    idle = replace(
        CHAT, running_mean=2.0, running_max=30.0, waiting_mean=0.0, kv_usage_mean=0.01, ttft_p99_s=0.05,
        itl_p50_s=0.002, itl_p99_s=0.004,
    )  # fmt: skip
    assert widen(idle, replace(LIMITS, max_running=1024), SLO, KNOBS).empty


def test_itl_spikes_near_the_slo_bring_in_smaller_token_budgets() -> None:
    w = widen(RAG, LIMITS, SLO, KNOBS)
    assert w.values == {MAX_BATCHED_TOKENS: (2048, 4096, 8192)}
    assert "ITL p99 140 ms near its SLO 150 ms" in w.reasons[0]


def test_itl_spikes_well_within_the_slo_leave_the_budget_alone() -> None:
    assert widen(replace(RAG, itl_p99_s=0.09), LIMITS, SLO, KNOBS).empty  # 3x p50 but 60% of the SLO


def test_ttft_of_chunked_prefill_near_the_slo_brings_in_larger_token_budgets() -> None:
    chunked = replace(RAG, running_mean=256.0, ttft_p50_s=1.2, ttft_p99_s=1.8, itl_p99_s=0.04)
    w = widen(chunked, replace(LIMITS, max_batched_tokens=512), SLO, KNOBS)
    assert w.values == {MAX_BATCHED_TOKENS: (512, 1024, 2048)}
    assert "TTFT p99 1.80 s near its SLO 2.00 s" in w.reasons[0]


def test_chunked_prefill_ttft_that_bounds_the_headroom_brings_in_larger_token_budgets() -> None:
    # the twin's sglang-long-prompts-chunk at 30% of its load: ~6k computed tokens a request in 1024-
    # token chunks, TTFT p99 0.34 s of a 2 s SLO (far from it) but the largest share of a budget
    light = replace(
        RAG, running_mean=2.5, running_max=6.0, kv_usage_mean=0.033, ttft_p50_s=0.157, ttft_p99_s=0.337,
        itl_p50_s=0.0072, itl_p99_s=0.0084, input_tokens_per_s=7400.0, requests_per_s=1.23,
        prefill_reduction=0.0,
    )  # fmt: skip
    w = widen(light, BatchLimits(max_batched_tokens=1024), SLO, KNOBS, smaller_budget=False)
    assert w.values == {MAX_BATCHED_TOKENS: (1024, 2048, 4096)}
    reason = "TTFT p99 0.34 s (SLO 2.00 s), the share that bounds the headroom, is mostly chunked prefill"
    assert w.reasons[0].startswith(reason)
    # a capacity the twin predicted (tighter than every share: 1/2.9) is not a budget of the engine's;
    # the widening still asks which budget more load reaches first
    predicted = widen(replace(light, capacity_multiple=2.9), BatchLimits(max_batched_tokens=1024), SLO, KNOBS,
                      smaller_budget=False)  # fmt: skip
    assert predicted.values == w.values


def test_both_budget_signs_bring_in_one_value_on_each_side() -> None:
    both = replace(RAG, running_mean=256.0, ttft_p50_s=1.2, ttft_p99_s=1.8)  # ITL spikes and chunked TTFT
    w = widen(both, replace(LIMITS, max_batched_tokens=1024), SLO, KNOBS)
    assert w.values == {MAX_BATCHED_TOKENS: (512, 1024, 2048)} and len(w.reasons) == 1 and ";" in w.reasons[0]


def test_where_a_smaller_budget_cannot_cut_itl_spikes_they_bring_in_no_smaller_budget() -> None:
    assert widen(RAG, LIMITS, SLO, KNOBS, smaller_budget=False).empty


def test_where_a_smaller_budget_cannot_cut_itl_spikes_both_signs_bring_in_larger_budgets_only() -> None:
    both = replace(RAG, running_mean=256.0, ttft_p50_s=1.2, ttft_p99_s=1.8)
    w = widen(both, replace(LIMITS, max_batched_tokens=1024), SLO, KNOBS, smaller_budget=False)
    assert w.values == {MAX_BATCHED_TOKENS: (1024, 2048, 4096)}


def test_sglang_runs_prefill_apart_from_decode_and_vllm_does_not() -> None:
    assert not get_adapter("sglang").mixed_batches
    assert get_adapter("vllm").mixed_batches and get_adapter("trtllm").mixed_batches


def test_only_vllm_cuts_itl_spikes_with_a_smaller_budget() -> None:
    # SGLang: prefill apart from decode; TensorRT-LLM: no chunked prefill by default, so a smaller
    # max_num_tokens refuses every prompt over it (llmapi/llm.py _check_arguments) instead of chunking
    assert not get_adapter("trtllm").chunked_prefill_default
    assert get_adapter("vllm").chunked_prefill_default and get_adapter("sglang").chunked_prefill_default
    cuts = {name: get_adapter(name).budget_cuts_itl for name in ("vllm", "sglang", "trtllm")}
    assert cuts == {"vllm": True, "sglang": False, "trtllm": False}


def test_a_smaller_budget_is_a_size_never_the_no_limit_sentinel() -> None:
    knobs = {
        MAX_BATCHED_TOKENS: replace(KNOBS[MAX_BATCHED_TOKENS], choices=(-1, 512, 1024, 2048, 4096, 8192))
    }
    # the KV pool 80% used bounds the headroom: at 1024 the prompts' chunked TTFT (75% of its SLO)
    # does not, so only smaller budgets enter
    rag = replace(RAG, kv_usage_mean=0.8)
    assert widen(rag, replace(LIMITS, max_batched_tokens=1024), SLO, knobs).values == {
        MAX_BATCHED_TOKENS: (512, 1024)
    }


def test_a_cap_at_the_top_of_its_allowed_values_adds_nothing() -> None:
    assert widen(CHAT, replace(LIMITS, max_running=1024), SLO, KNOBS).empty


@pytest.mark.parametrize(
    "knobs",
    [
        {},  # the engine has no such knob
        {MAX_RUNNING: replace(KNOBS[MAX_RUNNING], searched=True)},  # already searched
        {MAX_RUNNING: replace(KNOBS[MAX_RUNNING], choices=(64, 128, 512))},  # deployed 256 not valid
    ],
)
def test_a_knob_that_cannot_be_widened_is_not(knobs: dict[str, KnobSpec]) -> None:
    assert widen(CHAT, LIMITS, SLO, knobs).empty


def test_the_reach_is_every_value_widen_could_add_from_the_deployed_limits() -> None:
    cfg = get_adapter("vllm").default_config().with_(max_running=256, max_batched_tokens=4096)
    assert widening.reach(KNOBS, cfg) == {
        MAX_RUNNING: (256, 512, 1024),  # a cap is only ever raised
        MAX_BATCHED_TOKENS: (1024, 2048, 4096, 8192, 16384),
    }


def test_every_widening_stays_within_the_reach() -> None:
    cfg = get_adapter("vllm").default_config().with_(max_running=256, max_batched_tokens=8192)
    reach = widening.reach(KNOBS, cfg)
    both = replace(RAG, ttft_p99_s=1.9, ttft_p50_s=0.9, itl_p50_s=0.001)
    for signals in (CHAT, RAG, both):
        for name, values in widen(signals, widening.limits_of(cfg), SLO, KNOBS).values.items():
            assert set(values) <= set(reach[name])


def test_where_a_smaller_budget_cannot_cut_itl_spikes_the_reach_has_no_smaller_budget() -> None:
    cfg = get_adapter("vllm").default_config().with_(max_running=256, max_batched_tokens=4096)
    reach = widening.reach(KNOBS, cfg, smaller_budget=False)
    assert reach[MAX_BATCHED_TOKENS] == (4096, 8192, 16384)


def test_the_reach_leaves_out_a_knob_the_spec_names_or_the_engine_default() -> None:
    cfg = get_adapter("vllm").default_config().with_(max_running=256)  # the token budget: engine default
    override = SpaceOverride.from_mapping({"max_running": [256]})
    assert widening.reach(KNOBS, cfg) == {MAX_RUNNING: (256, 512, 1024)}
    assert widening.reach(KNOBS, cfg, override) == {}


def test_a_value_the_engine_refuses_with_the_deployed_config_is_left_out() -> None:
    refused = lambda changes: changes.get(MAX_BATCHED_TOKENS, 8192) < 4096  # noqa: E731
    w = widen(RAG, LIMITS, SLO, KNOBS, refused=refused)
    assert w.values == {MAX_BATCHED_TOKENS: (4096, 8192)}
    cfg = get_adapter("vllm").default_config().with_(max_running=256, max_batched_tokens=8192)
    assert widening.reach(KNOBS, cfg, refused=refused)[MAX_BATCHED_TOKENS] == (4096, 8192, 16384)


def test_the_limits_of_a_config_without_batch_limit_knobs_are_unknown() -> None:
    assert widening.limits_of(get_adapter("vllm").default_config()) == BatchLimits()


class _Values:
    """A config's ``to_dict`` with batch-limit values (a stand-in until the registry has the knobs)."""

    def __init__(self, **values: int) -> None:
        self.values = values

    def to_dict(self) -> dict[str, int]:
        return self.values


def test_the_limits_of_a_config_are_its_positive_batch_limit_values() -> None:
    cfg: Any = _Values(max_running=256, max_batched_tokens=8192)
    assert widening.limits_of(cfg) == BatchLimits(max_running=256, max_batched_tokens=8192)


def test_an_engine_default_or_no_limit_is_an_unknown_limit() -> None:
    cfg: Any = _Values(max_running=0, max_batched_tokens=-1)  # flag not rendered; SGLang chunking off
    assert widening.limits_of(cfg) == BatchLimits()


def test_the_space_takes_a_widened_knob_the_adapter_does_not_search() -> None:
    a = get_adapter("vllm")
    plain = build_space(a.knobs(), a.default_config(), a.normalize)
    wide = build_space(
        a.knobs(), a.default_config(), a.normalize, widen={"schedule_policy": ("fcfs", "priority")}
    )
    assert "schedule_policy" not in plain.names
    d = wide.dimension("schedule_policy")
    assert d is not None and d.choices == ("fcfs", "priority")


def test_the_space_refuses_a_widened_value_the_engine_does_not_allow() -> None:
    a = get_adapter("vllm")
    with pytest.raises(ValueError, match="schedule_policy: 'lpm' must be one of fcfs, priority"):
        build_space(a.knobs(), a.default_config(), a.normalize, widen={"schedule_policy": ("fcfs", "lpm")})


SETTINGS = TuningSettings(
    warmup_s=60, measure_s=300, min_requests=100, max_trials=3, min_interval_s=0, seed_key="w"
)


def _baseline(monkeypatch: pytest.MonkeyPatch) -> tuple[PolicyState, list[Any], list[SearchSpace]]:
    """Through the baseline with the rule widening vLLM's space by its schedule policy."""
    monkeypatch.setattr(
        widening,
        "widen",
        lambda *_, **__: Widening({"schedule_policy": ("fcfs", "priority")}, ("the test says so",)),
    )
    spaces: list[SearchSpace] = []

    def suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        spaces.append(space)
        return Suggestion(None, "stop", converged=True)

    default = get_adapter("vllm").default_config()
    state = initial_state("vllm", SETTINGS, default)
    actions: list[Any] = []
    for obs, now in ((RolloutReady(config=default), 0.0), (Tick(), 60.0)):
        state, acts = step(state, obs, now, suggester)
        actions += acts
    window = replace(CHAT, goodput_tokens_per_s=2000.0, slo_attainment=0.95)
    state, acts = step(state, WindowMeasured(signals=window, offered_rps=10.0), 360.0, suggester)
    return state, actions + acts, spaces


def test_the_policy_widens_the_space_once_the_baseline_is_scored(monkeypatch: pytest.MonkeyPatch) -> None:
    state, actions, spaces = _baseline(monkeypatch)
    assert state.widened == {"schedule_policy": ["fcfs", "priority"]}
    assert spaces and all("schedule_policy" in s.names for s in spaces)  # the first decision searches it
    (event,) = (a for a in actions if isinstance(a, EmitEvent) and a.reason == "SpaceWidened")
    assert event.message == "searching schedule_policy fcfs/priority: the test says so"


def test_a_restarted_operator_resumes_with_the_widened_space(monkeypatch: pytest.MonkeyPatch) -> None:
    state, _, _ = _baseline(monkeypatch)
    restored = PolicyState.from_json(state.to_json())
    assert restored.widened == state.widened and space_of(restored) == space_of(state)


def test_a_new_baseline_starts_from_the_default_space(monkeypatch: pytest.MonkeyPatch) -> None:
    state, _, _ = _baseline(monkeypatch)
    core = Core(state.model_copy(deep=True), 400.0, lambda *_: Suggestion(None, "", converged=True))
    begin_baseline(core, warm=False)
    assert core.s.widened == {} and "schedule_policy" not in space_of(core.s).names


@pytest.mark.parametrize(("engine", "smaller"), [("vllm", True), ("trtllm", False)])
def test_the_policy_offers_a_smaller_token_budget_only_where_it_cuts_itl_spikes(
    engine: str, smaller: bool
) -> None:
    # RAG's ITL spikes near the SLO at a deployed budget of 8192: vLLM chunks prompts into the decode
    # steps, so smaller budgets are worth a trial; trtllm-serve would refuse every prompt over a
    # smaller max_num_tokens (chunked prefill off), so the policy does not try one on live traffic.
    deployed = get_adapter(engine).default_config().with_(max_running=256, max_batched_tokens=8192)
    state = initial_state(engine, SETTINGS, deployed)
    for obs, now in ((RolloutReady(config=deployed), 0.0), (Tick(), 60.0)):
        state, _ = step(state, obs, now, lambda *_: Suggestion(None, "stop", converged=True))
    window = replace(RAG, goodput_tokens_per_s=400.0, slo_attainment=0.99)
    state, _ = step(
        state,
        WindowMeasured(signals=window, offered_rps=2.0),
        360.0,
        lambda *_: Suggestion(None, "stop", converged=True),
    )
    budgets = state.widened.get(MAX_BATCHED_TOKENS, [])
    assert (min(budgets, default=8192) < 8192) is smaller


def test_every_config_of_the_widened_space_is_one_vllm_accepts() -> None:
    # An A100 deploys vLLM's 2048 / 256: with the cap binding and ITL spiking, a budget of 512 and a
    # cap of 1024 each pass with the other deployed value but not together (budget >= cap), and the
    # first probe would pair the far ends.
    adapter = get_adapter("vllm")
    deployed = adapter.default_config().with_(max_batched_tokens=2048, max_running=256)
    both = replace(RAG, running_mean=255.0, running_max=256.0, waiting_mean=12.0, kv_usage_mean=0.3)
    limits = BatchLimits(max_running=256, max_batched_tokens=2048)
    w = widen(
        both, limits, SLO, adapter.knobs(),
        refused=lambda changes: bool(adapter.cross_check(deployed.with_(**changes))),
    )  # fmt: skip
    assert set(w.values) == {MAX_BATCHED_TOKENS, MAX_RUNNING}
    for budget in w.values[MAX_BATCHED_TOKENS]:
        for cap in w.values[MAX_RUNNING]:
            assert adapter.cross_check(deployed.with_(max_batched_tokens=budget, max_running=cap)) == []
    assert 2048 in w.values[MAX_BATCHED_TOKENS] and 256 in w.values[MAX_RUNNING]  # the deployed values stay


def test_a_limit_an_earlier_epoch_moved_stays_where_it_is_in_the_next_epochs_space() -> None:
    # epoch 1 raised the cap from the spec's 256 to 1024; epoch 2's baseline (cap 1024) binds no more
    a = get_adapter("vllm")
    spec = a.default_config().with_(max_running=256, max_batched_tokens=8192)
    deployed = spec.with_(max_running=1024)
    kept = widening.keep_deployed({}, deployed, spec, a.knobs())
    assert kept == {MAX_RUNNING: (1024,)}
    space = build_space(a.knobs(), spec, a.normalize, widen=kept)
    assert space.base.max_running == 1024 and MAX_RUNNING not in space.names  # kept, not searched
    assert widening.keep_deployed({}, spec, spec, a.knobs()) == {}  # nothing moved: nothing kept
    widened = {MAX_RUNNING: (1024, 2048)}  # a widening that holds it already decides it
    assert widening.keep_deployed(widened, deployed, spec, a.knobs()) == widened


def test_the_policy_keeps_an_earlier_epochs_limit_in_the_space(monkeypatch: pytest.MonkeyPatch) -> None:
    spaces: list[SearchSpace] = []

    def suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        spaces.append(space)
        return Suggestion(None, "stop", converged=True)

    spec = get_adapter("vllm").default_config().with_(max_running=256, max_batched_tokens=8192)
    deployed = spec.with_(max_running=1024)
    state = initial_state("vllm", SETTINGS, spec).model_copy(update={"current": deployed})
    for obs, now in ((RolloutReady(config=deployed), 0.0), (Tick(), 60.0)):
        state, _ = step(state, obs, now, suggester)
    calm = replace(CHAT, waiting_mean=0.0, goodput_tokens_per_s=2000.0, slo_attainment=0.99)
    state, _ = step(state, WindowMeasured(signals=calm, offered_rps=10.0), 360.0, suggester)
    assert state.widened == {MAX_RUNNING: [1024]}
    assert spaces and all(s.base.max_running == 1024 and s.contains(deployed) for s in spaces)
