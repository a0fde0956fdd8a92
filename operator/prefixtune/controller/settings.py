"""spec -> TuningSettings: the thin, pure converter from the custom resource to the policy's settings."""

from __future__ import annotations

from collections.abc import Sequence

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.api.rules import narrowed_choices
from prefixtune.controller.podspec import startup_budget_s
from prefixtune.controller.render import rolling_subset
from prefixtune.engines import get_adapter
from prefixtune.engines.knobs import BY_NAME, KNOB_NAMES
from prefixtune.metrics.recipe import for_engine, missing_signals, objective_refusal
from prefixtune.routing.policy import Router
from prefixtune.routing.settings import ENGINE_ROUTER
from prefixtune.tuning.settings import Mode, Objective, Slo, SpaceOverride, Strategy, TuningSettings

# A rollout that is not ready after this long is an infeasible trial. It is sized from the pods that
# must load one after another: the stable Deployment rolls with maxSurge 1 / maxUnavailable 0, so a
# rollout (and a rollback, and applying the best) of R replicas loads R pods in sequence, and a canary
# trial waits for the stable pods the last trial had (at most R - 1, in sequence) before its own load
# at once (render.deployment_strategy): at most R loads in sequence either way, each within the
# startup budget (spec.startupTimeout, else overhead + weights per GPU at a conservative rate:
# podspec.startup_budget_s). Never shorter than 10 minutes or one trial window; no upper cap (8
# replicas of a 70B model need the time they need).
READY_TIMEOUT_WINDOWS = 1.0
READY_TIMEOUT_MIN_S = 600.0


def seed_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def space_override(spec: ServingDeploymentSpec) -> SpaceOverride:
    """spec.tuning.space as the policy's SpaceOverride (only the knobs the user listed), plus the
    values a knob's extra args narrow it to where the user listed none (the engine refuses the others)."""
    adapter = get_adapter(spec.engine)
    narrowed = narrowed_choices(adapter, spec.extra_args)
    listed: dict[str, Sequence[object]] = {
        name: (float(values.min), float(values.max)) if BY_NAME[name].continuous else values
        for name, values in spec.tuning.space.listed().items()
    }
    for name, spec_ in narrowed.items():
        if name not in listed and spec_.choices != adapter.knobs()[name].choices:
            listed[name] = spec_.choices
    return SpaceOverride.from_mapping({name: listed[name] for name in KNOB_NAMES if name in listed})


def ready_timeout_s(spec: ServingDeploymentSpec) -> float:
    """max(10 min, warmup + measure, replicas x startup budget per pod): see READY_TIMEOUT_MIN_S."""
    trial = spec.tuning.trial
    span = READY_TIMEOUT_WINDOWS * (float(trial.warmup) + float(trial.measure))
    sequential = spec.replicas * startup_budget_s(spec)
    return max(READY_TIMEOUT_MIN_S, span, sequential)


def engine_version(spec: ServingDeploymentSpec) -> str:
    """The engine release the pods run, read from the image tag."""
    adapter = get_adapter(spec.engine)
    return adapter.version_of(spec.image or adapter.default_image)


def release_gaps(spec: ServingDeploymentSpec) -> tuple[tuple[str, ...], str]:
    """(signals the pods' engine release lacks, why the objective cannot be scored there or "")."""
    running = for_engine(spec.engine, engine_version(spec))
    missing = tuple(missing_signals(for_engine(spec.engine), running))
    return missing, objective_refusal(running, spec.tuning.objective.value)


def tuning_settings(
    spec: ServingDeploymentSpec, namespace: str, name: str, *, ready_timeout: float | None = None
) -> TuningSettings:
    """The policy's settings for a validated spec (engine defaults already filled in)."""
    tuning = spec.tuning
    mode: Mode = tuning.mode.value
    objective: Objective = tuning.objective
    strategy: Strategy = spec.effective_rollout().value
    if strategy == "canary" and spec.replicas < 2:
        strategy = "rolling"  # a canary needs a baseline pod beside it
    if strategy == "rolling" and rolling_subset(spec) is not None:
        # maxTrialReplicas below replicas: the trial's pods run beside the stable ones, scored
        # against them in the same window, exactly as a canary of that many pods.
        strategy = "canary"
    missing, refusal = release_gaps(spec)
    return TuningSettings(
        mode=mode,
        paused=bool(tuning.paused),
        objective=objective,
        slo=Slo(ttft_p99_s=float(tuning.slo.ttft_p99), itl_p99_s=float(tuning.slo.itl_p99)),
        space=space_override(spec),
        warmup_s=float(tuning.trial.warmup),
        measure_s=float(tuning.trial.measure),
        min_requests=int(tuning.trial.min_requests),
        max_trials=int(tuning.budget.max_trials),
        strategy=strategy,
        min_interval_s=float(tuning.rollout.min_interval),
        drift_threshold=float(tuning.drift.threshold),
        min_gain=float(tuning.min_gain),
        confidence=float(tuning.confidence),
        ready_timeout_s=float(ready_timeout if ready_timeout is not None else ready_timeout_s(spec)),
        seed_key=seed_key(namespace, name),
        missing_signals=missing,
        refusal=refusal,
        verify_applied=True,
        router=router_of(spec),
    )


def router_of(spec: ServingDeploymentSpec) -> Router | None:
    """The router whose knobs the search may tune (with replicas >= 2): spec.routing.router, else the
    engine's; None for an adopting resource, which gets no router (its pods are its team's)."""
    if spec.adopt is not None:
        return None
    return spec.routing.router or ENGINE_ROUTER[spec.engine]
