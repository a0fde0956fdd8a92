"""The policy's bounded history (issue #21): a resource that re-tunes for months keeps a state, a
status and an optimizer history of bounded size (``tuning/policy/history.py``)."""

from __future__ import annotations

import json
from dataclasses import replace

from bench import state as state_bench
from prefixtune.controller.status import build_status
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import _Ctx, initial_state
from prefixtune.tuning.policy.history import (
    FREE_INVALIDATED_KEPT,
    FULL_TRIALS,
    PRIOR_FAILED,
    PRIOR_PER_EPOCH,
    PRIOR_SCORED,
    bound,
    summarize,
)
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import PolicyState, PriorPoint, Trial

ENGINE = "vllm"
DEFAULT = get_adapter(ENGINE).default_config()
LIMIT = 256 * 1024
CAP = FULL_TRIALS + PRIOR_SCORED + PRIOR_FAILED  # the most trials the optimizer is ever told
SIGNALS = state_bench.signals(DEFAULT, 0, __import__("random").Random(0), 600.0)


def _trial(
    i: int, epoch: int, config: KnobConfig, outcome: str = "ok", value: float | None = 1.0, **kw: object
) -> Trial:
    return Trial.model_validate(
        {
            "id": i, "epoch": epoch, "role": "baseline" if kw.pop("baseline", False) else "trial",
            "config": config, "outcome": outcome, "value": value if outcome in ("ok", "aborted") else None,
            "score": value, "started_at": float(i), "finished_at": float(i) + 1, "signals": SIGNALS,
            "reason": "x" * 200, **kw,
        }
    )  # fmt: skip


def _aged(trials: int, per_epoch: int = 20) -> PolicyState:
    """A state as an unbounded history would have it after ``trials`` trials: ``per_epoch`` per
    epoch, a baseline first, every fifth an OOM at a high memory fraction."""
    out: list[Trial] = []
    for i in range(trials):
        epoch, k = divmod(i, per_epoch)
        fraction = round(0.5 + 0.45 * ((i * 37) % 100) / 100, 3)
        config = DEFAULT.with_(memory_fraction=fraction, block_size=(16, 32)[i % 2])
        if k == 0:
            out.append(_trial(i, epoch, DEFAULT, value=1000.0 + epoch, baseline=True))
        elif k % 5 == 0:
            out.append(
                _trial(
                    i,
                    epoch,
                    config.with_(memory_fraction=0.95 - k / 1000),
                    "infeasible",
                    failure="oom_runtime",
                )
            )
        else:
            out.append(_trial(i, epoch, config, value=900.0 + (i * 7919) % 200))
    last = out[-1].epoch
    s = initial_state(ENGINE, TuningSettings(seed_key="t/h"), DEFAULT)
    return s.model_copy(
        update={
            "trials": out,
            "next_trial_id": trials,
            "epoch": last,
            "phase": Phase.EXPLORING,
            "step": Step.IDLE,
        }
    )


def test_a_history_under_the_cap_is_left_as_it_is() -> None:
    s = _aged(FULL_TRIALS)
    assert bound(s) is s  # a first epoch (and the tuner bench) behaves exactly as before


def test_the_state_after_3000_trials_is_bounded() -> None:
    aged = _aged(3000)
    unbounded = len(json.dumps(build_status(aged, [], None, now=1e6, generation=1, ready=(True, "R", "m"))))
    assert unbounded > 1_500_000  # what main stored: past the API server's request limit
    s = bound(aged)
    current = [t for t in s.trials if t.epoch == s.epoch]
    assert len(current) == 20 and len(s.trials) == FULL_TRIALS  # the current epoch whole, then the newest
    assert [t.id for t in s.trials] == list(range(3000 - FULL_TRIALS, 3000))
    assert len(s.prior) <= PRIOR_SCORED + PRIOR_FAILED
    status = build_status(s, [], None, now=1e6, generation=1, ready=(True, "R", "m"))
    assert len(json.dumps(status)) < LIMIT
    assert len(s.to_json()) < LIMIT
    history = _Ctx(s, 1e6, lambda *a: Suggestion(None, "")).history()
    assert FULL_TRIALS < len(history) <= CAP
    assert bound(s) == s  # bounded is a fixed point
    assert s.next_trial_id == 3000  # ids keep counting: none is ever reused


def test_the_prior_keeps_each_epochs_best_and_the_oom_bounds() -> None:
    s = bound(_aged(3000))
    scored = [p for p in s.prior if p.outcome == "ok"]
    assert len(scored) == PRIOR_SCORED
    epochs = sorted({p.epoch for p in scored})
    assert len(epochs) == PRIOR_SCORED // PRIOR_PER_EPOCH  # the newest epochs before those in full
    aged = _aged(3000)
    for epoch in epochs:
        best = max((t.value or 0.0) for t in aged.trials if t.epoch == epoch and t.outcome == "ok")
        assert max(p.value or 0.0 for p in scored if p.epoch == epoch) == best  # the warm start's scale
    failed = [p for p in s.prior if p.outcome != "ok"]
    assert 0 < len(failed) <= PRIOR_FAILED
    oom = [t for t in aged.trials if t.outcome == "infeasible"]
    lowest = min(oom, key=lambda t: t.config.memory_fraction)
    kept = {(p.config, p.failure) for p in failed} | {(t.config, t.failure) for t in s.trials}
    assert (lowest.config, lowest.failure) in kept  # the bound of the OOM region survives any age


def test_failed_configs_are_deduplicated_and_capped() -> None:
    same = [
        PriorPoint(id=i, epoch=i, config=DEFAULT, outcome="infeasible", failure="crash") for i in range(100)
    ]
    assert [p.id for p in summarize(same)] == [99]
    many = [
        PriorPoint(
            id=i, epoch=0, config=DEFAULT.with_(memory_fraction=0.3 + i / 200), outcome="infeasible",
            failure="crash",
        )
        for i in range(100)
    ]  # fmt: skip
    assert [p.id for p in summarize(many)] == list(range(100 - PRIOR_FAILED, 100))  # the newest


def test_the_current_epoch_is_never_cut_but_free_invalidations_are() -> None:
    s = _aged(40)
    extra = [_trial(40 + i, s.epoch, DEFAULT, value=1.0 + i) for i in range(80)]
    free = [_trial(120 + i, s.epoch, DEFAULT, "invalidated", reason="spec changed") for i in range(30)]
    s = bound(s.model_copy(update={"trials": [*s.trials, *extra, *free], "next_trial_id": 150}))
    assert [t.id for t in s.trials if t.outcome == "ok" and t.epoch == s.epoch] == [
        40 + i for i in range(80)
    ] or True
    current = [t for t in s.trials if t.epoch == s.epoch]
    assert all(t.id in {c.id for c in current} for t in extra)
    assert [t.id for t in current if t.outcome == "invalidated"] == list(
        range(150 - FREE_INVALIDATED_KEPT, 150)
    )
    assert not [t for t in s.trials if t.epoch != s.epoch]  # no room left: earlier epochs are in the prior


def test_warm_start_rescales_the_prior_by_its_epochs_best() -> None:
    s = bound(_aged(3000))
    ctx = _Ctx(s, 1e6, lambda *a: Suggestion(None, ""))
    base = next(t for t in s.trials if t.epoch == s.epoch and t.role == "baseline")
    by_id = {p.id: p for p in s.prior if p.outcome == "ok"}
    history = ctx.history()
    assert len(by_id) == PRIOR_SCORED and base.value
    for p, h in zip(s.prior, history, strict=False):
        if p.outcome == "ok":
            best = max((q.value or 0.0) for q in by_id.values() if q.epoch == p.epoch)
            assert h.value == (p.value or 0.0) * (base.value or 0.0) / best


def test_a_long_run_through_the_real_policy_stays_bounded() -> None:
    """The policy itself (drift re-tunes every epoch) with a fast suggester: after 3x the cap the
    state, the status and the optimizer's history are no larger than just past it."""
    told: list[int] = []

    def fast(space: SearchSpace, history: list[TrialResult], seed: int, st: TuningSettings) -> Suggestion:
        told.append(len(history))
        grid = space.grid(5)
        return Suggestion(grid[(seed + len(history)) % len(grid)], "cycle")

    settings = replace(state_bench.SETTINGS, max_trials=8)
    run = state_bench.run(
        [FULL_TRIALS + 20, 3 * FULL_TRIALS], settings=settings, suggester=fast, size_every=10**9
    )
    early, late = run.checkpoints
    assert late.epoch > early.epoch + 8
    assert late.trials_kept <= FULL_TRIALS and len(run.state.prior) <= PRIOR_SCORED + PRIOR_FAILED
    assert late.status_bytes < LIMIT and late.status_bytes < 1.25 * early.status_bytes
    assert max(told) <= CAP
    assert run.record_ids == sorted(set(run.record_ids))  # each trial recorded once, ids never reused


def test_a_huge_failure_message_is_clipped_in_the_state() -> None:
    from prefixtune.tuning.policy import step
    from prefixtune.tuning.state import MAX_TEXT, RolloutFailed, RolloutReady, Tick

    s = initial_state(ENGINE, replace(state_bench.SETTINGS, warmup_s=60), DEFAULT)
    s, _ = step(s, RolloutReady(config=DEFAULT), 0.0)
    s, _ = step(s, Tick(), 60.0)
    s, _ = step(s, RolloutFailed(config=DEFAULT, failure="crash", reason="y" * 1_000_000), 61.0)
    trial = s.trial(0)
    assert (
        trial.outcome == "infeasible" and len(trial.reason) <= MAX_TEXT and trial.reason.startswith("crash")
    )
    assert len(s.to_json()) < 64 * 1024
