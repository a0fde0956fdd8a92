"""The policy's bounded history: what of the earlier epochs' trials the state keeps, and for how long.

A resource that runs for months re-tunes again and again (drift, spec changes), and each epoch keeps
the earlier trials as the optimizer's warm start. Kept whole, the history grows without bound: the
status (``status.policy.state``) passes the API server's request limit after ~1,500 trials and every
decision fits a Gaussian process over all of them. So:

- ``PolicyState.trials`` holds every trial of the current epoch, and earlier epochs' trials, the
  newest first, while that keeps the list at ``FULL_TRIALS`` (the current epoch is never cut,
  except trials it invalidated at no budget cost beyond the newest ``FREE_INVALIDATED_KEPT``: a
  window discarded by a spec change tells the optimizer nothing).
- Older trials are folded into ``PolicyState.prior``, a bounded summary: of each earlier epoch its
  best ``PRIOR_PER_EPOCH`` scored configs (the newest epochs first, ``PRIOR_SCORED`` in all), and up
  to ``PRIOR_FAILED`` failed configs (crash, OOM, not applied, aborted), the ones that bound an
  infeasible region first (per other-knob combination and failure, the lowest and highest memory
  fraction), then the newest. Invalidated trials are dropped (never scored, nothing to learn).

So the state holds at most ``max(FULL_TRIALS, current epoch) + PRIOR_SCORED + PRIOR_FAILED`` trial
records whatever the resource's age, and the optimizer is told no more than that. Trial ids are
assigned from ``next_trial_id`` and never reused. Pure and deterministic.
"""

from __future__ import annotations

from prefixtune.engines.knobs import categorical_key, memory_of
from prefixtune.tuning.optimizer import OOM_FAILURES
from prefixtune.tuning.policy._core import TOO_LITTLE_TRAFFIC
from prefixtune.tuning.state import PolicyState, PriorPoint, Trial

FULL_TRIALS = 50  # trial records kept in full (the current epoch's are, however many)
FREE_INVALIDATED_KEPT = 10  # current epoch: trials invalidated at no budget cost kept (the newest)
PRIOR_PER_EPOCH = 2  # best scored configs of each earlier epoch kept in the prior
PRIOR_SCORED = 16  # scored configs in the prior in all (the newest epochs first)
PRIOR_FAILED = 24  # failed configs in the prior (region bounds first, then the newest)


def bound(s: PolicyState) -> PolicyState:
    """``s`` with its history within the bounds above (``s`` itself when it already is)."""
    free = [
        t for t in s.trials
        if t.epoch == s.epoch and t.id != s.active and t.outcome == "invalidated"
        and t.failure != TOO_LITTLE_TRAFFIC
    ]  # fmt: skip
    dropped = {t.id for t in free[: max(0, len(free) - FREE_INVALIDATED_KEPT)]}
    current = [t for t in s.trials if t.epoch == s.epoch and t.id not in dropped]
    older = [t for t in s.trials if t.epoch != s.epoch and t.id != s.active]
    room = max(0, FULL_TRIALS - len(current))
    kept_older = older[len(older) - room :] if room < len(older) else older
    if not dropped and len(kept_older) == len(older):
        return s
    evicted = older[: len(older) - len(kept_older)]
    kept_ids = {t.id for t in current} | {t.id for t in kept_older}
    trials = [t for t in s.trials if t.id in kept_ids or t.id == s.active]
    prior = summarize([*s.prior, *(p for p in map(point, evicted) if p is not None)])
    return s.model_copy(update={"trials": trials, "prior": prior})


def point(t: Trial) -> PriorPoint | None:
    """What the prior keeps of a trial (None: nothing the optimizer reads)."""
    if t.outcome == "ok" and t.value is None:
        return None
    if t.outcome == "ok" or t.outcome == "infeasible" or t.outcome == "aborted" or t.outcome == "not_applied":
        return PriorPoint(
            id=t.id, epoch=t.epoch, config=t.config, outcome=t.outcome, value=t.value, failure=t.failure
        )
    return None


def summarize(points: list[PriorPoint]) -> list[PriorPoint]:
    """The bounded prior, oldest first (the optimizer is told it in that order)."""
    scored = [p for p in points if p.outcome == "ok"]
    by_epoch: dict[int, list[PriorPoint]] = {}
    for p in scored:
        by_epoch.setdefault(p.epoch, []).append(p)
    keep: list[PriorPoint] = []
    for epoch in sorted(by_epoch, reverse=True):
        best = sorted(by_epoch[epoch], key=lambda p: (-(p.value or 0.0), p.id))[:PRIOR_PER_EPOCH]
        keep.extend(best[: PRIOR_SCORED - len(keep)])
        if len(keep) >= PRIOR_SCORED:
            break
    failed: dict[tuple[object, ...], PriorPoint] = {}
    for p in sorted((p for p in points if p.outcome != "ok"), key=lambda p: p.id):
        failed[(p.config, p.outcome, p.failure)] = p  # the newest of each
    newest_first = sorted(failed.values(), key=lambda p: -p.id)
    bounds: dict[tuple[object, ...], list[PriorPoint]] = {}
    for p in newest_first:
        if p.failure in OOM_FAILURES:
            bounds.setdefault((categorical_key(p.config), p.failure), []).append(p)
    first = {
        q.id
        for group in bounds.values()
        for q in (
            min(group, key=lambda p: memory_of(p.config)),
            max(group, key=lambda p: memory_of(p.config)),
        )
    }
    ranked = [p for p in newest_first if p.id in first] + [p for p in newest_first if p.id not in first]
    keep.extend(ranked[:PRIOR_FAILED])
    return sorted(keep, key=lambda p: p.id)
