"""When the batch limits enter the search space, and with which few values. Pure functions.

The running-request cap and the step token budget are not searched by default (their adapters'
``KnobSpec.searched`` is False): on most workloads neither binds, and every knob that enters the
space multiplies what a handful of trials must cover. They matter where the baseline shows one
binding, and then only a few values near the deployed one are worth a trial. So once per epoch,
when the baseline window is scored, the policy asks ``widen()``; the answer is recorded in the
policy state (``PolicyState.widened``), the space is built with it for the rest of the epoch
(``build_space(widen=...)``), and a restarted operator resumes with the same space.

The evidence is the baseline's diagnosis with the config's batch limits (``metrics/diagnosis.py``,
the same findings ``status.diagnosis`` shows) against the SLO:

- running cap: ``running-cap-binds`` (the batch sits at the cap with KV memory free and a queue),
  or, below capacity, the cap bounds the window's headroom (``objective.headroom``: the batch's peak
  over the cap is the largest share of a budget, so the cap is what more load would reach first): the
  cap and the next ``STEPS`` allowed values above it (a larger cap admits the queue into the free KV
  memory; how much larger is what the trials find out).
- token budget, smaller: ``token-budget-itl-spikes`` (decode steps carry prefill chunks near the
  budget) with ITL p99 at or above ``TIGHT`` x the ITL SLO: the budget and the ``STEPS`` allowed
  values below it (smaller chunks, lower ITL spikes, at some TTFT).
- token budget, larger: ``token-budget-chunks-ttft`` (prefill spans many steps and TTFT is about
  that many steps) with TTFT p99 at or above ``TIGHT`` x the TTFT SLO, or TTFT bounding the window's
  headroom (below capacity: the TTFT share is the largest, and it is mostly chunked prefill): the
  budget and the ``STEPS`` allowed values above it.
- both: the budget and one allowed value on each side.
- the ITL rule applies only where a smaller budget can cut the decodes' ITL spikes (the adapter's
  ``budget_cuts_itl``): not where prefill batches run apart from decode (SGLang: a prompt's chunks
  run back to back whatever their size), nor where the engine does not chunk a prompt by default
  (TensorRT-LLM: trtllm-serve refuses a prompt over ``max_num_tokens``, so a smaller budget would
  refuse the long prompts a RAG workload is made of, on live traffic).

The headroom rules are what lets a light load find a limit that binds only at a heavier one: at 30%
of a scenario's load nothing queues and no latency is near its SLO, yet the headroom ranks the
configs by the budget the load would exhaust first, and a knob that moves that budget must be in the
space for the ranking to reach it (``docs/objective.md``). A share at or under ``1 / HEADROOM_BOUNDS``'
top bounds nothing (the factor sits at its bound whatever the knob), and widens nothing.

The values come from the adapter's ladder (``KnobSpec.choices``) around the deployed value, which
stays one of them (the baseline must be a point of the space). At most ``STEPS`` + 1 values per
knob: with both knobs the categorical part of the space grows nine times at most. A knob the
resource's ``tuning.space`` names is never widened (the spec pinned or narrowed it), nor one the
engine does not have, nor one whose deployed value is unknown (the engine's own default) or not
valid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product

from prefixtune.engines.base import KnobConfig, KnobSpec
from prefixtune.engines.knobs import MAX_BATCHED_TOKENS, MAX_RUNNING
from prefixtune.metrics.diagnosis import BatchLimits, diagnose
from prefixtune.metrics.histogram import Slo
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import HeadroomLimit, headroom
from prefixtune.tuning.settings import SpaceOverride

# Whether the engine refuses the deployed config with these batch-limit values (knob name -> value).
Refused = Callable[[Mapping[str, int]], bool]
STEPS = 2  # allowed values tried beyond the deployed one, per direction
TIGHT = 0.8  # a latency p99 at or above this share of its SLO: the SLO is at stake


@dataclass(frozen=True)
class Widening:
    """Knobs to add to the space with their values (deployed value included), and why."""

    values: Mapping[str, tuple[int, ...]]
    reasons: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.values


def running_cap(config: KnobConfig) -> int | None:
    """The running-request cap ``config`` sets (the headroom's ``running-cap`` share is measured
    against it); None where it is the engine's own default or the engine has no such knob."""
    return limits_of(config).max_running


def limits_of(config: KnobConfig) -> BatchLimits:
    """The batch limits ``config`` runs; None where the registry has no such knob yet, or where the
    value is a sentinel (the engine resolves its own default: the number is not known here)."""
    data = config.to_dict()

    def known(value: object) -> int | None:
        # <= 0: the engine's own default (flag not rendered) or no limit (SGLang's chunk -1).
        return int(value) if isinstance(value, int | float) and value > 0 else None

    return BatchLimits(
        max_running=known(data.get(MAX_RUNNING)), max_batched_tokens=known(data.get(MAX_BATCHED_TOKENS))
    )


def widen(
    signals: Signals,
    limits: BatchLimits,
    slo: Slo,
    knobs: Mapping[str, KnobSpec],
    override: SpaceOverride | None = None,
    *,
    smaller_budget: bool = True,
    refused: Refused | None = None,
) -> Widening:
    """The batch-limit knobs the baseline window (``signals``, measured under ``limits``: see
    ``limits_of``) says to search, given the engine's knob specs and the resource's space override.
    ``smaller_budget`` (the adapter's ``budget_cuts_itl``): a smaller budget can cut the decodes' ITL
    spikes; where it cannot (SGLang, TensorRT-LLM without chunked prefill) only larger ones are tried.
    ``refused(changes)``: the engine refuses the deployed config with ``changes`` (knob name to value;
    vLLM: a token budget below the running cap); a value refused in any combination the widened space
    holds is left out."""
    codes = set(diagnose(signals, limits=limits).codes)
    room = headroom(signals, slo, limits.max_running, engine_budgets_only=True)
    bounds = None if room is None or not room.bounded else room.limit
    values: dict[str, tuple[int, ...]] = {}
    reasons: dict[str, str] = {}

    cap = limits.max_running
    cap_choices = _allowed(knobs, MAX_RUNNING, cap, override)
    if cap_choices is not None and cap is not None:
        if "running-cap-binds" in codes:
            reasons[MAX_RUNNING] = f"the running cap {cap} binds with KV memory free and a queue"
        elif bounds == HeadroomLimit.RUNNING and room is not None:
            reasons[MAX_RUNNING] = (
                f"the running cap {cap} bounds the headroom (a batch peak of {room.share:.0%} of it, the"
                " largest share of a budget): more load reaches it first"
            )
        if MAX_RUNNING in reasons:
            values[MAX_RUNNING] = _near(cap_choices, cap, below=0, above=STEPS)

    budget = limits.max_batched_tokens
    budget_choices = _allowed(knobs, MAX_BATCHED_TOKENS, budget, override)
    if budget_choices is not None and budget is not None:
        itl, ttft = signals.itl_p99_s, signals.ttft_p99_s
        spikes = smaller_budget and "token-budget-itl-spikes" in codes
        smaller = spikes and itl is not None and itl >= TIGHT * slo.itl_p99_s
        near = ttft is not None and ttft >= TIGHT * slo.ttft_p99_s
        larger = "token-budget-chunks-ttft" in codes and (near or bounds == HeadroomLimit.TTFT)
        why: list[str] = []
        if smaller and itl is not None:
            why.append(
                f"ITL p99 {itl * 1000:.0f} ms near its SLO {slo.itl_p99_s * 1000:.0f} ms spikes with prefill"
                f" chunks of up to the token budget {budget}"
            )
        if larger and ttft is not None:
            where = (
                f"near its SLO {slo.ttft_p99_s:.2f} s"
                if near
                else f"(SLO {slo.ttft_p99_s:.2f} s), the share that bounds the headroom,"
            )
            chunked = f"mostly chunked prefill under the token budget {budget}"
            why.append(f"TTFT p99 {ttft:.2f} s {where} is {chunked}")
        if why:
            below, above = (1, 1) if smaller and larger else (STEPS, 0) if smaller else (0, STEPS)
            values[MAX_BATCHED_TOKENS] = _near(budget_choices, budget, below=below, above=above)
            reasons[MAX_BATCHED_TOKENS] = "; ".join(why)
    deployed = {MAX_RUNNING: cap, MAX_BATCHED_TOKENS: budget}
    values = _accepted(values, refused, {k: v for k, v in deployed.items() if v is not None})
    kept = {k: v for k, v in values.items() if len(v) > 1}  # nothing beyond the deployed value: no knob
    return Widening(kept, tuple(reasons[k] for k in kept))


def keep_deployed(
    widened: Mapping[str, tuple[int, ...]],
    deployed: KnobConfig,
    base: KnobConfig,
    knobs: Mapping[str, KnobSpec],
) -> dict[str, tuple[int, ...]]:
    """``widened``, plus each batch limit the deployed config holds away from the space's base
    (``spec.config``) as its single value: a limit an earlier epoch's trials moved (a cap raised from
    256 to 1024) stays where it is in this epoch's trials instead of reverting to the value that was
    shown to bind, and the baseline stays a point of the space."""
    kept = dict(widened)
    for name in (MAX_RUNNING, MAX_BATCHED_TOKENS):
        value, spec = deployed.get(name), knobs.get(name)
        if name in kept or value == base.get(name) or spec is None or spec.searched:
            continue
        if spec.validate(value) is None:  # a value the space may hold (the ladder's, as trials are)
            kept[name] = (int(value),)
    return kept


def reach(
    knobs: Mapping[str, KnobSpec],
    config: KnobConfig,
    override: SpaceOverride | None = None,
    *,
    smaller_budget: bool = True,
    refused: Refused | None = None,
) -> dict[str, tuple[int, ...]]:
    """Every value ``widen`` could add per batch-limit knob for a baseline at ``config``: the
    deployed value and ``STEPS`` allowed values on each side (an oracle over the policy's reach must
    cover these). Knobs ``widen`` never adds here (searched already, named by the override, engine
    default or invalid deployed value) are left out."""
    limits = limits_of(config)
    out: dict[str, tuple[int, ...]] = {}
    for name, current in ((MAX_RUNNING, limits.max_running), (MAX_BATCHED_TOKENS, limits.max_batched_tokens)):
        choices = _allowed(knobs, name, current, override)
        if choices is None or current is None:
            continue
        # the running cap is only ever raised; the budget only lowered where that cuts ITL spikes
        below = STEPS if name == MAX_BATCHED_TOKENS and smaller_budget else 0
        values = _near(choices, current, below=below, above=STEPS)
        if len(values) > 1:
            out[name] = values
    # each value against the deployed config only: the union of what any one widening can add (the
    # widening itself then drops values that clash with another widened knob's, per combination)
    return {k: v for k, v in _each_accepted(out, refused).items() if len(v) > 1}


def _accepted(
    values: Mapping[str, tuple[int, ...]], refused: Refused | None, deployed: Mapping[str, int]
) -> dict[str, tuple[int, ...]]:
    """``values`` without those the engine refuses in some config of the widened space.

    First each value against the rest of the deployed config. Then the space is every combination of
    the widened values, and two values that each pass with the deployed ones may not pass together
    (vLLM on an A100: a budget of 512 and a cap of 1024 against the deployed 2048 / 256). While a
    combination is refused, the value in it farthest from its deployed value (in steps along its
    list; the later knob on a tie) is dropped: the deployed values always stay, so this ends."""
    if refused is None:
        return dict(values)
    kept = _each_accepted(values, refused)
    while True:
        names = list(kept)
        combos = (dict(zip(names, combo, strict=True)) for combo in product(*(kept[n] for n in names)))
        bad = next((combo for combo in combos if refused(combo)), None)
        if bad is None:
            return kept
        steps = {n: abs(kept[n].index(bad[n]) - kept[n].index(deployed[n])) for n in names}
        far = max(names, key=lambda n: (steps[n], names.index(n)))
        kept[far] = tuple(v for v in kept[far] if v != bad[far])


def _each_accepted(
    values: Mapping[str, tuple[int, ...]], refused: Refused | None
) -> dict[str, tuple[int, ...]]:
    """``values`` without those the engine refuses with the rest of the deployed config."""
    if refused is None:
        return dict(values)
    return {name: tuple(v for v in vs if not refused({name: v})) for name, vs in values.items()}


def _allowed(
    knobs: Mapping[str, KnobSpec], name: str, current: int | None, override: SpaceOverride | None
) -> tuple[int, ...] | None:
    """The values ``name`` may be widened over, or None when it is never widened."""
    spec = knobs.get(name)
    if spec is None or spec.searched or current is None or (override and override.get(name) is not None):
        return None  # absent, already searched, or the spec decides
    if spec.validate(current) is not None:
        return None  # the deployed value is not one the space could hold
    return tuple(sorted(int(c) for c in spec.choices if int(c) > 0))  # not SGLang's -1: no chunking


def _near(choices: Sequence[int], current: int, *, below: int, above: int) -> tuple[int, ...]:
    """``current`` and up to ``below`` / ``above`` allowed values next to it (ascending)."""
    lower = [c for c in choices if c < current][-below:] if below else []
    upper = [c for c in choices if c > current][:above]
    return (*lower, current, *upper)
